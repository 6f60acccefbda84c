"""Device resolution and the single crossing point between NumPy and torch."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np
import torch

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


_AUTOCAST_DEVICES = ("cpu", "cuda", "mps", "xpu")


@contextlib.contextmanager
def default_torch_modes(gradients: bool = True):
    """Torch's default modes inside, whatever the caller's: gradients recorded, no
    inference mode (with ``gradients``), no autocast.

    A fit computes its own gradients and its own precision: called inside the
    ``torch.no_grad()`` or ``torch.inference_mode()`` block that extracted the features, the
    penalty's gradient was left out (the coefficients were off by 0.7 on iris) and a
    minibatch fit failed; inside a training loop's ``torch.autocast`` the products ran in
    bfloat16. Predictions keep the model's precision likewise (``gradients=False`` keeps
    the caller's gradient modes). A context, not a decorator: warnings keep their stack
    levels.
    """
    with contextlib.ExitStack() as stack:
        if gradients:
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
        for device_type in _AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def available_devices() -> list[str]:
    """Names of the devices this machine can train on, as ``device`` accepts them."""
    names = ["cpu"]
    names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        names += [f"xpu:{i}" for i in range(xpu.device_count())]
    return names


def _is_available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        return mps is not None and mps.is_available()
    if device.type == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu is not None and xpu.is_available() and (device.index or 0) < xpu.device_count()
    return False  # meta, lazy, ...: nothing a probe can be trained on


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return the torch device named by ``device``.

    ``"auto"`` means CUDA when present (under ``torchrun``, this rank's GPU, ``LOCAL_RANK``),
    else the CPU. A device that is not a torch device name, or not available on this
    machine, raises a ValueError that lists the available ones.
    """
    if isinstance(device, str) and device == "auto":
        return _local_gpu() if torch.cuda.is_available() else torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or not _is_available(resolved):
        what = "is not a torch device" if resolved is None else "is not available on this machine"
        names = ", ".join(repr(name) for name in ["auto", *available_devices()])
        raise ValueError(f"device={str(device)!r} {what}. Available devices: {names}.")
    if resolved.type == "cuda" and resolved.index is None:
        return _local_gpu()  # torch.cuda.set_device, and per-rank placement, need an index
    return resolved


def _local_gpu() -> torch.device:
    """This process's GPU: under ``torchrun`` the rank's (``LOCAL_RANK``), else the current
    one. When each process sees only some of the GPUs (``CUDA_VISIBLE_DEVICES`` set per
    rank), ``LOCAL_RANK`` wraps around the visible ones."""
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", int(local) % torch.cuda.device_count())


def torch_dtype(dtype) -> torch.dtype:
    """Map a NumPy floating dtype to the matching torch dtype (float32 otherwise)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return _TORCH_DTYPES.get(np.dtype(dtype), torch.float32)


def to_tensor(array, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Move a NumPy array or tensor to ``device`` (no copy when it already lives there)."""
    if isinstance(array, torch.Tensor):
        return array.to(device=device, dtype=dtype)
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:  # long double: torch has none
        array = array.astype(np.float64)
    elif not array.dtype.isnative:  # big-endian data (an HDF5 store written so, say)
        array = array.astype(array.dtype.newbyteorder("="))
    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        # Read-only input (a memmap, say) is shared, not copied: nothing here writes to X.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype, non_blocking=True)


# The dtypes NumPy holds as they are; the others are widened (bfloat16, float8) or refused.
_NUMPY_HOLDS = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    *(getattr(torch, f"uint{bits}", None) for bits in (16, 32, 64)),
}  # fmt: skip


def to_numpy(tensor: torch.Tensor, name: str | None = None) -> np.ndarray:
    """Detach ``tensor`` and return it as a NumPy array on the CPU; ``name`` (say
    ``"sample_weight"``), if given, is what an error calls it.

    NumPy has no bfloat16 or float8 ("Got unsupported ScalarType Float8_e4m3fn"): those
    are read as float32, which holds their values. Complex32 and the packed dtypes (uint3,
    float4_e2m1fn_x2, bits8) are refused with a message that names ``name`` and its dtype.
    """
    if tensor.is_meta:  # (torch's "Cannot copy out of meta tensor; no data!")
        raise ValueError(
            f"A tensor was given on the 'meta' device{f' for {name}' if name else ''}, which "
            "holds no values: pass the values themselves (labels, sample weights, groups), on "
            "the CPU or a GPU."
        )
    subject = f"{name} is a tensor" if name else "A tensor was given"
    tensor, dtype = tensor.detach(), tensor.dtype
    if dtype not in _NUMPY_HOLDS:
        if dtype.is_complex:  # complex32: scikit-learn refuses complex values anyway
            raise ValueError(
                f"Complex data not supported: {subject} of dtype {dtype}. Pass real values, "
                "for example its real part (.real)."
            )
        try:  # bfloat16, float8: float32 holds their values
            tensor = tensor.float() if dtype.is_floating_point else None
        except (NotImplementedError, RuntimeError):  # a packed dtype (float4_e2m1fn_x2)
            tensor = None
        if tensor is None:
            raise TypeError(
                f"{subject} of dtype {dtype}, which NumPy cannot hold: pass it as booleans, "
                "integers or floats (for example of dtype torch.int64 or float32)."
            )
    return tensor.cpu().numpy()


def inverse_row_norms(x: torch.Tensor) -> torch.Tensor:
    """1/‖x_i‖ (N,), the cosine head's row scale, with F.normalize's floor on the norms."""
    return row_norms(x).clamp_min(1e-12).reciprocal()


# The rows :func:`row_norms` takes at a time: norms of runs of this many rows are those of
# the whole (the batched folds read an HDF5 store's in such runs).
NORM_ROWS = 8192


def row_norms(x: torch.Tensor, rows: int = NORM_ROWS) -> torch.Tensor:
    """‖x_i‖ (N,) for the rows of x (N, d), also where the squares overflow.

    Rows whose plain norm is infinite (float32 entries beyond ~1.8e19) are scaled by their
    largest entry first; the others keep the plain norm. No host synchronisation; the
    scaled copy is made ``rows`` rows at a time.
    """
    if len(x) > rows:
        return torch.cat([row_norms(x[i : i + rows], rows) for i in range(0, len(x), rows)])
    norm = torch.linalg.vector_norm(x, dim=1)
    largest = x.abs().amax(dim=1).clamp_min(torch.finfo(x.dtype).tiny)
    scaled = torch.linalg.vector_norm(x / largest[:, None], dim=1) * largest
    return torch.where(torch.isfinite(norm), norm, scaled)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """x with each row divided by its norm (:func:`row_norms`, safe from overflow); zero
    rows stay zero, as with ``F.normalize``. (In float16, where 1e-12 rounds to 0, the
    floor is its smallest normal number, 6.1e-5: zero rows became NaN, as F.normalize's
    do. Rows of a smaller norm are divided by the floor, as F.normalize's below 1e-12 are;
    a floor among the subnormals would give a zero row a gradient beyond float16's range.)
    Integer rows are divided in float32, as the class statistics take them (torch's
    vector_norm refused them: MR2Loss(normalize=True) failed on integer features)."""
    if not (x.is_floating_point() or x.is_complex()):
        x = x.float()
    floor = max(1e-12, torch.finfo(x.dtype).tiny) if x.is_floating_point() else 1e-12
    return x / row_norms(x).clamp_min(floor)[:, None]


def tangent_rows(unit: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """v's rows (along the last dimension) projected onto the tangent spaces of the unit
    rows ``unit``, v − (v·u)·u: what changes a direction, not a row's norm."""
    return v - (v * unit).sum(-1, keepdim=True) * unit


# x·vᵀ for a float32 block of rows x and few rows in v (the logits of K classes) runs at
# about 40 GFLOP/s in torch's default CPU matrix product (MKL): 20,000 × 1,280 by 10 rows,
# 12.5 ms on two threads. oneDNN's linear, the kernel torch's own compiler emits for a
# linear layer on the CPU, takes 5.7 ms (float32 arithmetic, the sums in another order).
# At the fits' block size (2²³ entries) with 10 to 200 rows it was 1.2 to 2.8 times as
# fast for 512, 768 and 2,048 features; with 1,024 it lost at 20 and 24 rows (0.84 and
# 0.78 times, 16 at 4,096 rows or fewer too: 0.69 to 0.79) and won elsewhere. With 6 or 8
# rows it lost at some sizes (0.78 to 0.94 times), with 2 to 4 MKL's was the faster.
# float64 stays with MKL (oneDNN has none), as does anything that records gradients: the
# op records none (docs/speed.md).
_ONEDNN_MIN_ROWS = 10
_onednn_linear = None  # the op once it has given the product on a small case, or False
_probe_lock = threading.Lock()


def _probe_onednn():
    """oneDNN's linear op if torch has it and it gives x·vᵀ + b on a small case (in float32
    on the CPU, whatever the caller's default dtype, device and autocast), else False."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    cpu = dict(dtype=torch.float32, device="cpu")
    a = torch.arange(24, **cpu).reshape(4, 6) / 7
    b = torch.arange(60, **cpu).reshape(10, 6).flip(0) / 5
    bias = torch.arange(10, **cpu) / 3
    try:
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            ok = torch.allclose(op(a, b, bias, "none", [], ""), torch.addmm(bias, a, b.T))
    except (RuntimeError, TypeError):  # (other arguments in another torch)
        return False
    return op if ok else False


def _onednn():
    global _onednn_linear
    if _onednn_linear is None:
        with _probe_lock:  # threads wait for the answer: every fit takes the same kernel
            if _onednn_linear is None:
                _onednn_linear = _probe_onednn()
    return _onednn_linear if torch.backends.mkldnn.enabled else False


def rows_product(x: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None):
    """x·vᵀ (+ bias) (n, K) for rows x (n, d) and v (K, d), ``bias`` (K,); oneDNN's kernel
    where it is the faster (above), torch's matrix product otherwise.

    For the fits' own products, which record no gradient: a tensor that requires one takes
    torch's product, but forward-mode dual tensors are not told apart (their tangents
    would be lost on oneDNN's path)."""
    records = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, v, bias)
    )
    if (
        x.device.type == "cpu"
        and x.dtype == torch.float32 == v.dtype
        and len(v) >= _ONEDNN_MIN_ROWS
        and v.shape[-1] > 0  # (oneDNN has no primitive for 0 features)
        and not records
        and (
            bias is None
            or (bias.dtype == torch.float32 and bias.shape == v.shape[:1] and bias.is_contiguous())
        )
    ):
        op = _onednn()
        if op:
            # A thread takes torch's thread count at its first parallel operation, which
            # oneDNN's op is not: as a thread's first, it ran on OpenMP's default (the
            # cores), and oneDNN 3.5 (torch 2.5) sums in another order on another count.
            # torch.get_num_threads sets it: every thread's product is the same.
            torch.get_num_threads()
            # (oneDNN refuses weights whose strides overlap; a copy is K × d.)
            return op(x, v.contiguous(), bias, "none", [], "")
    return x @ v.T if bias is None else torch.addmm(bias, x, v.T)


# gᵀ·x with few columns in g (a gradient in the weights, K × d, from the logits' gradient
# over a block of rows) runs on one thread in torch's CPU matrix product, whatever the
# thread count (the whole 20,000 × 1,280 by 10 columns: 13.3 ms on two threads, 14.7 on
# one; one block of 6,553 rows, 4.2 ms). The rows cut into a few parts, one batched
# product and a sum over the parts run on every thread (7.5 and 2.5 ms); with 30 columns
# 1.4 times as fast, with 100 no faster, on one thread no faster (docs/speed.md).
_SPLIT_MAX_COLUMNS = 64
_SPLIT_MIN_ENTRIES = 2**18  # below it (digits, 1,797 × 64) the split costs more than it saves
_SPLIT_MIN_ROWS = 128  # per part


def transposed_product(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """gᵀ·x (K, d) for g (n, K) and x (n, d), on a CPU split over row parts when that
    runs on more threads (the same sums in another order)."""
    n, k = g.shape
    threads = torch.get_num_threads()
    parts = min(4 * threads, n // _SPLIT_MIN_ROWS) if threads > 1 else 1
    if (
        x.device.type != "cpu"
        or k > _SPLIT_MAX_COLUMNS
        or parts < 2
        or n * x.shape[1] < _SPLIT_MIN_ENTRIES
    ):
        return g.T @ x
    rows = n // parts
    whole = rows * parts
    gp = g[:whole].reshape(parts, rows, k).transpose(1, 2)
    out = torch.bmm(gp, x[:whole].reshape(parts, rows, -1)).sum(0)
    if whole < n:
        out.addmm_(g[whole:].T, x[whole:])
    return out


def row_norms_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`row_norms` for a NumPy array."""
    with np.errstate(over="ignore"):
        norm = np.linalg.norm(x, axis=1)
    bad = ~np.isfinite(norm)
    if bad.any():
        rows = x[bad]
        largest = np.abs(rows).max(axis=1)
        norm[bad] = np.linalg.norm(rows / largest[:, None], axis=1) * largest
    return norm
