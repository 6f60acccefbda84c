"""benchmarks/profile_fit.py finds the fit's matrix products in torch's profile."""

import re

import pytest
import torch

from mr2_probe import _device
from tests._scripts import load_benchmark


@pytest.mark.slow  # torch's profiler takes seconds to start
def test_the_products_share_of_a_fit_is_found_and_the_block_timed(capsys):
    module = load_benchmark("profile_fit")
    module.main(["--n-samples", "600", "--n-features", "32", "--n-classes", "4", "--repeat", "2"])
    out = capsys.readouterr().out
    share = float(re.search(r"products [\d.]+ s, (\d+)% of the fit", out).group(1))
    assert 0 < share <= 100
    calls = re.search(r"calls \{(.*?)\}", out).group(1)
    assert "aten::addmm" in calls and "aten::mm" in calls  # the two products per evaluation
    assert "row blocks per evaluation: 1" in out
    assert re.search(
        r"X·Wᵀ on a 600 × 32 block, 4 rows of W: torch [\d.]+ ms, library [\d.]+ ms, NumPy", out
    )


@pytest.mark.slow
def test_the_librarys_own_products_are_counted_as_products(capsys):
    # From 10 classes the logits take oneDNN's linear, and 2¹⁸ entries or more split the
    # gradient into a batched product (on more than one thread): both are the fit's products.
    module = load_benchmark("profile_fit")
    argv = ["--n-samples", "2000", "--n-features", "256", "--n-classes", "10", "--repeat", "1"]
    module.main(argv)
    calls = re.search(r"calls \{(.*?)\}", capsys.readouterr().out).group(1)
    assert ("aten::bmm" in calls) is (torch.get_num_threads() > 1)
    if _device._probe_onednn():
        assert "mkldnn::_linear_pointwise" in calls
