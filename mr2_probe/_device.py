"""Device resolution and the single crossing point between NumPy and torch."""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return the torch device named by ``device``.

    ``"auto"`` means CUDA when present (under ``torchrun``, this rank's GPU, ``LOCAL_RANK``),
    else the CPU.
    """
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} was requested but CUDA is not available on this "
            "machine. Use device='auto' or device='cpu'."
        )
    return device


def torch_dtype(dtype) -> torch.dtype:
    """Map a NumPy floating dtype to the matching torch dtype (float32 otherwise)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return _TORCH_DTYPES.get(np.dtype(dtype), torch.float32)


def to_tensor(array, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Move a NumPy array or tensor to ``device`` (no copy when it already lives there)."""
    if isinstance(array, torch.Tensor):
        return array.to(device=device, dtype=dtype)
    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        # Read-only input (a memmap, say) is shared, not copied: nothing here writes to X.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype, non_blocking=True)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Detach ``tensor`` and return it as a NumPy array on the CPU."""
    return tensor.detach().cpu().numpy()
