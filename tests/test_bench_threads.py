"""benchmarks/bench_threads.py times each way of threading the fit, and restores the rule."""

import pytest

from mr2_probe import _solvers
from tests._scripts import load_benchmark


def test_each_size_gets_its_four_timings_and_the_rule_is_restored(capsys):
    module = load_benchmark("bench_threads")
    rule = _solvers.SMALL_EVALUATION
    module.main(["--sizes", "60x4x3", "80x6x2", "--iters", "3", "--repeats", "1"])
    assert _solvers.SMALL_EVALUATION == rule
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
    assert [row[:2] for row in rows] == [["60x4x3", "1,440"], ["80x6x2", "1,920"]]
    for row in rows:
        torch_ms, one_ms, rule_ms, peer_ms = map(float, row[2:6])
        assert min(torch_ms, one_ms, rule_ms, peer_ms) > 0
        # The ratios, from the unrounded times.
        assert float(row[6][:-1]) == pytest.approx(one_ms / torch_ms, rel=0.05, abs=0.01)
        assert float(row[7][:-1]) == pytest.approx(rule_ms / peer_ms, rel=0.05, abs=0.01)
