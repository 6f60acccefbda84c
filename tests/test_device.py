"""Devices and the tensors on them: which devices this machine has, the one a name or
torchrun's rank resolves to, arrays as tensors, and row norms that neither overflow nor
divide by zero."""

import warnings

import numpy as np
import pytest
import torch

from mr2_probe._device import (
    available_devices,
    inverse_row_norms,
    resolve_device,
    row_norms,
    row_norms_numpy,
    to_tensor,
    torch_dtype,
    unit_rows,
)


def _accelerators(monkeypatch, cuda=0, mps=False, xpu=0, xpu_available=None, current=0):
    """Pretend this machine has ``cuda`` GPUs (the ``current`` one in use), an MPS device
    and ``xpu`` XPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    available = xpu > 0 if xpu_available is None else xpu_available
    monkeypatch.setattr(torch.xpu, "is_available", lambda: available)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: xpu)


@pytest.mark.parametrize(
    "name, local_rank, expected",
    [
        ("auto", None, "cuda:1"),  # the current GPU
        ("auto", "0", "cuda:0"),  # torchrun: the rank's
        ("auto", "3", "cuda:1"),  # each rank sees two GPUs: wraps around them
        ("auto", "2", "cuda:0"),  # the third rank on two GPUs: the first
        ("cuda", None, "cuda:1"),  # an index, as torch.cuda.set_device needs
        ("cuda", "0", "cuda:0"),
        ("cuda:0", "1", "cuda:0"),  # named: kept
    ],
)
def test_cuda_devices_resolve_to_an_index(monkeypatch, name, local_rank, expected):
    _accelerators(monkeypatch, cuda=2, current=1)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert resolve_device(name) == torch.device(expected)


def test_available_devices_list_each_gpu_and_accelerator(monkeypatch):
    _accelerators(monkeypatch, cuda=2, mps=True, xpu=1)
    assert available_devices() == ["cpu", "cuda:0", "cuda:1", "mps", "xpu:0"]
    # An accelerator that is not available is left out, whatever its device count.
    _accelerators(monkeypatch, cuda=0, mps=False, xpu=2, xpu_available=False)
    assert available_devices() == ["cpu"]


@pytest.mark.parametrize("name, xpus", [("mps", 0), ("xpu", 1), ("xpu:1", 2)])
def test_an_available_mps_or_xpu_device_is_accepted(monkeypatch, name, xpus):
    _accelerators(monkeypatch, mps=True, xpu=xpus)
    assert resolve_device(name) == torch.device(name)


@pytest.mark.parametrize(
    "name, cuda, xpu",
    [
        ("cuda:2", 2, 0),  # beyond the GPUs there are
        ("xpu:2", 0, 2),
        ("xpu", 0, 0),
    ],
)
def test_a_device_beyond_those_available_is_refused_listing_them(monkeypatch, name, cuda, xpu):
    _accelerators(monkeypatch, cuda=cuda, xpu=xpu)
    with pytest.raises(ValueError, match="is not available on this machine") as error:
        resolve_device(name)
    listed = ", ".join(repr(n) for n in ["auto", *available_devices()])
    assert str(error.value).endswith(f"Available devices: {listed}.")


def test_cuda_without_an_index_is_the_only_gpu_of_a_one_gpu_machine(monkeypatch):
    _accelerators(monkeypatch, cuda=1)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("cuda") == torch.device("cuda:0")


def test_a_device_that_is_no_name_at_all_is_a_value_error():
    with pytest.raises(ValueError, match="device='None' is not a torch device"):
        resolve_device(None)


def test_torch_dtypes_are_kept_and_numpy_ones_mapped():
    assert torch_dtype(torch.float64) is torch.float64
    assert torch_dtype(np.float64) is torch.float64
    assert torch_dtype(np.float32) is torch.float32
    assert torch_dtype(np.int64) is torch.float32  # not a float: the float32 default


def test_long_double_arrays_become_float64_tensors():
    x = np.array([[1.0, 2.0]], dtype=np.longdouble) + np.longdouble(1e-12)
    tensor = to_tensor(x, torch.device("cpu"))
    assert tensor.dtype == torch.float64
    np.testing.assert_array_equal(tensor.numpy(), x.astype(np.float64))


def test_read_only_arrays_are_shared_without_a_warning():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    x.flags.writeable = False  # as a memmap opened read-only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_tensor(x, torch.device("cpu"))
    assert tensor.data_ptr() == x.ctypes.data  # no copy


def test_reversed_rows_are_read_as_given():
    x = np.arange(6, dtype=np.float64).reshape(3, 2)[::-1]
    np.testing.assert_array_equal(to_tensor(x, torch.device("cpu")).numpy(), x)


def test_a_tensor_already_on_the_device_is_returned_as_it_is():
    x = torch.ones(3, 2, requires_grad=True)
    assert to_tensor(x, torch.device("cpu")) is x
    assert to_tensor(x, torch.device("cpu"), torch.float64).dtype == torch.float64


def test_row_norms_of_many_rows_are_those_of_each_row():
    # Taken a block of rows at a time: every row is measured once, in order.
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(row_norms(x, rows=4), x.norm(dim=1))


def test_row_norms_whose_squares_overflow_are_exact_in_numpy():
    x = np.array([[3e20, 4e20], [3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(row_norms_numpy(x), [5e20, 5.0], rtol=1e-6)


def test_zero_rows_have_a_finite_row_scale_and_stay_zero_as_unit_rows():
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [3e-4, 4e-4]], dtype=torch.float64)
    torch.testing.assert_close(
        inverse_row_norms(x), torch.tensor([1e12, 0.2, 2e3], dtype=torch.float64)
    )
    torch.testing.assert_close(
        unit_rows(x), torch.tensor([[0.0, 0.0], [0.6, 0.8], [0.6, 0.8]], dtype=torch.float64)
    )


def test_zero_rows_have_finite_gradients_through_their_norms():
    # As through F.normalize: a zero row (a zero class direction, say) takes a step.
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    unit_rows(x).sum().backward()
    assert torch.isfinite(x.grad).all()
