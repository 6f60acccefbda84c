"""Devices and the tensors on them: which devices this machine has, the one a name or
torchrun's rank resolves to, arrays as tensors, row norms that neither overflow nor
divide by zero, and the products of the closed-form fits."""

import concurrent.futures
import contextlib
import threading
import time
import warnings

import numpy as np
import pytest
import threadpoolctl
import torch

from mr2_probe import _device
from mr2_probe._device import (
    available_devices,
    default_torch_modes,
    inverse_row_norms,
    resolve_device,
    row_norms,
    row_norms_numpy,
    rows_product,
    to_tensor,
    torch_dtype,
    transposed_product,
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
        ("mps", 0, 0),  # none on this machine
        ("meta", 0, 0),  # a torch device, but none to train on
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


def test_default_torch_modes_set_aside_the_caller_s(caller_mode):
    # A fit inside the caller's no_grad / inference_mode block left its penalty's gradient
    # out, and inside autocast ran its products in bfloat16.
    mode, enter = caller_mode
    x = torch.ones(2, 3)
    with enter():
        with default_torch_modes():
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            assert not torch.is_autocast_enabled("cpu")
            w = torch.ones(3, 3, requires_grad=True)
            assert (x @ w).dtype == torch.float32 and (x @ w).requires_grad
        # Predictions keep the caller's gradient modes, in the model's precision.
        with default_torch_modes(gradients=False):
            assert torch.is_grad_enabled() == (mode == "autocast")
            assert torch.is_inference_mode_enabled() == (mode == "inference_mode")
            assert not torch.is_autocast_enabled("cpu") and (x @ x.T).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu") == (mode == "autocast")  # restored


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


@pytest.mark.parametrize("dtype", [">f4", ">f8"])
def test_big_endian_arrays_are_read_in_their_precision(dtype):
    # (an HDF5 store written so, say: torch.from_numpy refuses another byte order)
    x = np.arange(6).reshape(3, 2).astype(dtype)
    tensor = to_tensor(x, torch.device("cpu"))
    assert tensor.dtype == torch_dtype(x.dtype.newbyteorder("="))
    np.testing.assert_array_equal(tensor.numpy(), x)


def test_tensors_that_record_gradients_come_back_as_arrays():
    x = torch.arange(3.0, requires_grad=True) * 2
    np.testing.assert_array_equal(_device.to_numpy(x), [0.0, 2.0, 4.0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensors_of_half_precision_come_back_as_arrays_of_their_values(dtype):
    # NumPy has no bfloat16: "Got unsupported ScalarType BFloat16" (float32 holds its values).
    x = torch.tensor([0.5, 1.0, 3.0], dtype=dtype, requires_grad=True)
    np.testing.assert_array_equal(_device.to_numpy(x), [0.5, 1.0, 3.0])


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_norms_whose_squares_overflow_are_exact(dtype):
    big = torch.finfo(dtype).max / 4
    x = torch.tensor([[3 * big / 5, 4 * big / 5], [3.0, 4.0]], dtype=dtype)
    torch.testing.assert_close(row_norms(x), torch.tensor([big, 5.0], dtype=dtype))
    torch.testing.assert_close(unit_rows(x), torch.tensor([[0.6, 0.8]] * 2, dtype=dtype))


def test_tangent_rows_keep_what_changes_a_direction():
    unit = unit_rows(torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]))
    v = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]])
    tangent = _device.tangent_rows(unit, v)
    torch.testing.assert_close(tangent, torch.tensor([[0.16, -0.12, 1.0], [1.0, 2.0, 0.0]]))
    torch.testing.assert_close((tangent * unit).sum(1), torch.zeros(2))


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


def _exact(a, b):
    return a.double() @ b.double().T


@pytest.fixture
def threads():
    """Set torch's thread count for a test; the count before it is put back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("k", [1, 5, 6, 10, 30])
@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_product_is_x_times_v_transposed(k, with_bias):
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(700, 96, generator=gen)[:, :80]  # a column slice: strided rows
    v = torch.randn(k, 80, generator=gen)
    bias = torch.randn(k, generator=gen) if with_bias else None
    expected = _exact(x, v) + (0 if bias is None else bias.double())
    torch.testing.assert_close(rows_product(x, v, bias).double(), expected, rtol=0, atol=1e-4)
    assert rows_product(x, v, bias).dtype == torch.float32


@pytest.mark.parametrize("case", ["no features", "overlapping weights"])
def test_rows_product_takes_what_torchs_product_takes(case):
    # oneDNN's kernel raised on both ("could not create a primitive descriptor", "could
    # not construct a memory descriptor using strides") where torch's product works.
    gen = torch.Generator().manual_seed(0)
    if case == "no features":
        x, v = torch.randn(5, 0), torch.randn(12, 0)
    else:
        x, v = torch.randn(40, 70, generator=gen), torch.randn(200, generator=gen)
        v = v.as_strided((12, 70), (5, 1))  # rows sharing entries
    bias = torch.randn(12, generator=gen)
    expected = _exact(x, v) + bias.double()
    torch.testing.assert_close(rows_product(x, v, bias).double(), expected, rtol=0, atol=1e-4)


def test_rows_product_takes_onednn_for_float32_rows_of_ten_classes_or_more(monkeypatch):
    # The rule of _device's comment: oneDNN's kernel from 10 rows of v on, float32 on the
    # CPU, a plain (K,) bias, nothing recording gradients, oneDNN enabled; torch's
    # product otherwise.
    calls = []

    def spy(x, v, bias, *rest):
        calls.append(len(v))
        return x @ v.T if bias is None else torch.addmm(bias, x, v.T)

    monkeypatch.setattr(_device, "_onednn_linear", spy)
    x = torch.randn(50, 8)
    for k in (2, 6, 9, 10, 16):
        rows_product(x, torch.randn(k, 8))
    rows_product(x.to("meta"), torch.randn(16, 8, device="meta"))  # not on the CPU
    assert calls == [10, 16]
    v = torch.randn(16, 8)
    rows_product(x.double(), v.double())
    rows_product(x, v, torch.randn(32)[::2])  # a strided bias
    rows_product(x, v, torch.randn(1, 16))  # a bias that broadcasts
    bias = torch.randn(16, requires_grad=True)
    assert rows_product(x, v, bias).grad_fn is not None  # torch's product records it
    grad_v = v.clone().requires_grad_()
    assert rows_product(x, grad_v).grad_fn is not None
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    rows_product(x, v)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    assert calls == [10, 16]
    with torch.no_grad():
        rows_product(x, grad_v, bias)
    assert calls == [10, 16, 16]


def test_the_probe_finds_onednns_linear_where_torch_has_it():
    # Else the logits would quietly stay with torch's product (a renamed op, new arguments).
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN linear op")
    assert _device._probe_onednn() is not False


@pytest.mark.parametrize("setting", ["float64", "meta", "autocast"])
def test_the_onednn_probe_does_not_depend_on_the_callers_defaults(setting):
    # A first fit under another default dtype or device, or in autocast, once left oneDNN
    # off for the rest of the process.
    expected = bool(_device._probe_onednn())
    if setting == "float64":
        context = _default_dtype(torch.float64)
    elif setting == "meta":
        context = torch.device("meta")
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)
    with context:
        assert bool(_device._probe_onednn()) is expected


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_threads_that_call_during_the_probe_wait_for_its_answer(monkeypatch, threads):
    # Every thread's logits from the same kernel: before, the others took torch's product
    # while the first probed, and parallel fits differed from run to run. On one torch
    # thread, below OpenMP's default on several cores: the product was the threads' first
    # parallel operation, and ran on that default (under torch 2.5, other sums).
    threads(1)
    probe = _device._probe_onednn

    def slow_probe():
        time.sleep(0.2)
        return probe()

    monkeypatch.setattr(_device, "_onednn_linear", None)
    monkeypatch.setattr(_device, "_probe_onednn", slow_probe)
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(300, 64, generator=gen), torch.randn(10, 64, generator=gen)
    barrier = threading.Barrier(4)

    def product(_):
        barrier.wait()
        return rows_product(x, v)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(product, range(4)))
    for out in results:
        assert torch.equal(out, rows_product(x, v))


def _torch_openmp_threads():
    """The calling thread's OpenMP thread count in torch's OpenMP runtime, or None."""
    for info in threadpoolctl.threadpool_info():
        if info["user_api"] == "openmp" and "torch" in info["filepath"]:
            return info["num_threads"]
    return None


def _in_a_new_thread(function):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(function).result()


def test_rows_product_in_a_new_thread_runs_on_torchs_thread_count(threads):
    # oneDNN's op read OpenMP's count, which a thread has from torch only after its first
    # parallel operation: as a new thread's first, the product ran on the default.
    if not _device._onednn():
        pytest.skip("needs oneDNN's linear op")
    threads(1)
    default = _in_a_new_thread(_torch_openmp_threads)
    if default in (None, 1):
        pytest.skip("needs torch's OpenMP runtime, by default on more than one thread")
    x, v = torch.randn(300, 64), torch.randn(10, 64)

    def product_then_count():
        rows_product(x, v)  # the thread's first torch operation
        return _torch_openmp_threads()

    assert _in_a_new_thread(product_then_count) == 1


@pytest.mark.parametrize("broken", ["raises", "wrong"])
def test_rows_product_without_a_working_onednn_kernel_is_torchs_product(monkeypatch, broken):
    def op(x, v, *rest):
        if broken == "raises":
            raise RuntimeError("no oneDNN here")
        return (x @ v.T) + 1

    monkeypatch.setattr(_device, "_onednn_linear", None)  # probed again, at the next call
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", op, raising=False)
    x, v = torch.randn(40, 8), torch.randn(10, 8)
    torch.testing.assert_close(rows_product(x, v), x @ v.T)
    assert _device._onednn_linear is False


def test_transposed_product_splits_the_rows_only_where_more_threads_can_run(threads, monkeypatch):
    calls = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: calls.append(len(a)) or bmm(a, b))
    g, x = torch.randn(4096, 10), torch.randn(4096, 128)  # 2¹⁹ entries of x
    threads(2)
    transposed_product(g, x)
    transposed_product(torch.randn(4096, 64), x)  # as many columns as the split takes
    transposed_product(torch.randn(4096, 65), x)  # more columns than the split takes
    transposed_product(g[:1000], x[:1000, :64])  # fewer entries
    transposed_product(g.to("meta"), x.to("meta"))  # not on the CPU
    threads(1)
    transposed_product(g, x)
    assert calls == [8, 8]  # 4 parts per thread


@pytest.mark.parametrize("n", [128, 1000, 4099])
@pytest.mark.parametrize("k", [1, 10, 64, 65])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_transposed_product_is_g_transposed_times_x(threads, n, k, count):
    # Split over row parts on more than one thread (4099 rows: parts and a remainder),
    # whole otherwise; the same sums either way.
    threads(count)
    gen = torch.Generator().manual_seed(n + k)
    g = torch.randn(k, n, generator=gen).T  # a transposed view, as the solvers pass
    x = torch.randn(n, 300, generator=gen)
    out = transposed_product(g, x)
    assert out.shape == (k, 300) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _exact(g.T, x.T), rtol=1e-4, atol=1e-3)
    x64 = x.double()
    torch.testing.assert_close(transposed_product(g.double(), x64), g.double().T @ x64)
