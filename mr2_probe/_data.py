"""Training data on the device: in-memory tensors, or HDF5 datasets streamed in blocks."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import torch

from ._device import to_tensor


def is_torch_tensor(X) -> bool:
    return isinstance(X, torch.Tensor)


def is_h5_dataset(X) -> bool:
    """True for an ``h5py.Dataset`` or a lazy row view over one (``X.dataset``).

    h5py is only consulted if it is already imported: it is not a dependency.
    """
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return False
    return isinstance(X, h5py.Dataset) or isinstance(getattr(X, "dataset", None), h5py.Dataset)


def block_rows(n_features: int, n_classes: int) -> int:
    """Rows per block so that a block and its logits stay around 8 M elements."""
    return max(256, 2**23 // max(n_features, n_classes, 1))


class TensorSource:
    """Training data that lives on the device as a whole (uploaded once per fit)."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, rows: int) -> None:
        self.X, self.y, self.w, self.rows = X, y, w, rows
        self.n_samples = X.shape[0]

    def chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Contiguous blocks in order (views, no copy)."""
        for start in range(0, self.n_samples, self.rows):
            stop = start + self.rows
            yield self.X[start:stop], self.y[start:stop], self.w[start:stop]

    def batches(
        self, batch_size: int, generator: torch.Generator
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Shuffled minibatches, indexed on the device."""
        perm = torch.randperm(self.n_samples, generator=generator, device=self.X.device)
        for start in range(0, self.n_samples, batch_size):
            idx = perm[start : start + batch_size]
            yield self.X[idx], self.y[idx], self.w[idx]


class H5Source(TensorSource):
    """An HDF5 dataset read block by block; never loaded whole.

    Minibatches shuffle the order of blocks and the rows within each block, the usual
    compromise between random access and contiguous reads on disk.
    """

    def __init__(self, dataset, y, w, rows, device, dtype) -> None:
        self.dataset, self.y, self.w, self.device, self.dtype = dataset, y, w, device, dtype
        chunks = getattr(dataset, "chunks", None)
        chunk = chunks[0] if chunks else 1
        self.rows = max(chunk, rows // chunk * chunk)  # whole HDF5 chunks per read
        self.n_samples = dataset.shape[0]
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)

    def _read(self, start: int, stop: int) -> torch.Tensor:
        block = to_tensor(np.asarray(self.dataset[start:stop]), self.device, self.dtype)
        # Accumulated on the device and checked once after a full pass.
        self.nonfinite |= ~torch.isfinite(block).all()
        return block

    def chunks(self):
        for start in range(0, self.n_samples, self.rows):
            stop = min(start + self.rows, self.n_samples)
            yield self._read(start, stop), self.y[start:stop], self.w[start:stop]

    def batches(self, batch_size, generator):
        n_blocks = -(-self.n_samples // self.rows)
        # Block order crosses to the host once per epoch: it drives the reads.
        order = torch.randperm(n_blocks, generator=generator, device=self.device)
        for b in order.tolist():
            start, stop = b * self.rows, min((b + 1) * self.rows, self.n_samples)
            X, y, w = self._read(start, stop), self.y[start:stop], self.w[start:stop]
            perm = torch.randperm(stop - start, generator=generator, device=self.device)
            for i in range(0, stop - start, batch_size):
                idx = perm[i : i + batch_size]
                yield X[idx], y[idx], w[idx]


def h5_dtype(dataset) -> np.dtype:
    """Compute dtype for a stored dataset: float64 stays, everything else is float32."""
    return np.dtype(np.float64 if np.dtype(dataset.dtype) == np.float64 else np.float32)
