"""benchmarks/bench_labels.py times each score on text as objects and as NumPy's."""

import pytest

from tests._scripts import load_benchmark


def test_each_score_gets_both_timings_and_the_same_result(capsys):
    module = load_benchmark("bench_labels")
    module.main(["--samples", "300", "--classes", "7", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("300 labels, 7 classes; NumPy's <U9 against a ")
    rows = [line.split() for line in lines[3:]]
    assert [row[0] for row in rows] == list(module.SCORES)
    for row in rows:
        unicode, objects = map(float, row[1:3])
        assert min(unicode, objects) >= 0
        assert row[4] == "yes"  # the same scores either way


@pytest.mark.parametrize("option", ["--repeats", "--samples", "--classes"])
def test_counts_below_one_are_refused(option, capsys):
    with pytest.raises(SystemExit) as stop:
        load_benchmark("bench_labels").main([option, "0"])
    assert stop.value.code == 2
    assert f"{option} must be at least 1; got 0" in capsys.readouterr().err
