"""The fit data's blocks and sources (mr2_probe._data): block sizes, HDF5 rows and minibatches."""

import numpy as np
import pytest
import torch

from mr2_probe import MR2LinearClassifier

from .test_classifier import _blobs


# Mutant: _data.py:104 block_rows `2**23` -> `3**23` (blocks of ~9e10 elements: an HDF5
# store would be read whole, and logits allocated for all its rows at once).
@pytest.mark.parametrize(
    "n_features, n_classes, expected",
    [(64, 10, 2**17), (1, 2, 2**22), (2**13, 3, 1024), (2**20, 3, 256)],
)
def test_block_rows_keeps_a_block_near_8m_elements(n_features, n_classes, expected):
    from mr2_probe._data import block_rows

    assert block_rows(n_features, n_classes) == expected


# Mutant: _data.py:250 FitData.rows' `raise TypeError` -> `pass` (an AttributeError from
# deep inside instead of the guard that says to use row_blocks()).
def test_fit_data_rows_refuses_an_hdf5_store(tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        data = MR2LinearClassifier(device="cpu")._prepare(f.create_dataset("X", data=X), y, None)
        with pytest.raises(TypeError, match="row_blocks"):
            data.rows(np.arange(3))
        ((where, block),) = [(w, b) for w, b in data.row_blocks(np.array([5, 1, 30]))]
        np.testing.assert_array_equal(where, [1, 0, 2])
        np.testing.assert_allclose(block.numpy(), X[[1, 5, 30]].astype(np.float64))


# Mutant: _data.py:186 H5Source.batches `range(0, stop - start, ...)` -> `stop + start`:
# every block after the first yielded empty minibatches (steps on no rows).
@pytest.mark.parametrize("batch_size", [7, 64])
def test_hdf5_minibatches_are_non_empty_and_hold_every_row_once(tmp_path, batch_size):
    h5py = pytest.importorskip("h5py")
    from mr2_probe._data import H5Source

    X = np.arange(200 * 3, dtype=np.float64).reshape(200, 3)
    y = torch.arange(200) % 2
    w = torch.ones(200, dtype=torch.float64)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        source = H5Source(
            f.create_dataset("X", data=X, chunks=(16, 3)), y, w, 48, "cpu", torch.float64
        )
        assert source.rows == 48
        batches = list(source.batches(batch_size, torch.Generator().manual_seed(0)))
    sizes = [len(b[0]) for b in batches]
    assert 0 < min(sizes) and max(sizes) <= batch_size
    rows = torch.cat([b[0][:, 0] for b in batches]).numpy() / 3
    np.testing.assert_array_equal(np.sort(rows), np.arange(200))
