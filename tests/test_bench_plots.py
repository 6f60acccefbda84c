"""benchmarks/bench_plots.py times the figure both ways, and restores its bars."""

import pytest

from mr2_probe import plotting
from tests._scripts import load_benchmark


@pytest.mark.slow  # (four figures, matplotlib's first-call costs)
def test_each_class_count_gets_both_timings_and_the_bars_are_restored(capsys, tmp_path):
    module = load_benchmark("bench_plots")
    bars = plotting._bars
    module.main(["--classes", "3", "--repeats", "1", "--keep", str(tmp_path / "plots")])
    assert plotting._bars is bars
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
    assert [row[0] for row in rows] == ["3"]
    collection, patches = map(float, rows[0][1:3])
    assert min(collection, patches) > 0
    # The ratio, from the unrounded times; the two ways draw the same picture.
    assert float(rows[0][3][:-1]) == pytest.approx(patches / collection, rel=0.05, abs=0.01)
    assert rows[0][4] == "yes"
    kept = sorted(path.name for path in (tmp_path / "plots").iterdir())
    assert kept == ["class_accuracy_3_ax_bar.png", "class_accuracy_3_collection.png"]
