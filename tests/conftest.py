"""Fixtures shared by several test modules, and the ``cuda`` marker's skip."""

import os
import signal

import pytest
import threadpoolctl
import torch


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its share of the cores, and so do the
    interpreters its tests start: torch's, OpenMP's and the BLAS's threads of several
    processes on the same cores otherwise wait on each other (docs/testing.md)."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not workers:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // workers)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    threadpoolctl.threadpool_limits(threads)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module's tests, the count restored after them.

    Their tensors are tiny (batches of 4 images of 32 pixels): a second thread has no work
    to share, and while other processes share the cores each waits on the other: the
    quick extraction tests took 802 s on two threads there, 388 s on one (docs/testing.md).
    Not for the modules of ``mr2_probe``'s tests, whose solvers choose their thread count
    by the size of the work, and are tested on more than one.
    """
    yield from _one_torch_thread()


@pytest.fixture
def one_torch_thread_per_test():
    """One intra-op torch thread for one test, the count restored after it: for the tests
    of ``MR2Loss`` that take many steps (or a gradcheck) on a few dozen rows, and a search's
    tiny fits, far below the sizes at which ``mr2_probe`` chooses a thread count, where a
    second thread only waits."""
    yield from _one_torch_thread()


@pytest.fixture
def no_model(monkeypatch):
    """Fail if a backbone is loaded: output checks must come before any work."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr("extract._runner.create_backbone", forbidden)


@pytest.fixture
def label_checks(monkeypatch) -> list:
    """The names of the labels that the metrics check for missing labels, one entry per
    check (``check_no_missing_labels``, the pass over the labels that each read makes)."""
    from mr2_probe import metrics

    checked, check = [], metrics.check_no_missing_labels

    def counted(a, name="y", *args):
        checked.append(name)
        return check(a, name, *args)

    monkeypatch.setattr(metrics, "check_no_missing_labels", counted)
    return checked


@pytest.fixture
def reversed_listing(monkeypatch):
    """Every folder listed by ``os.scandir`` in reverse order of names, as a file system
    may list them (ext4 by hash, not by name): an order taken from the listing shows."""
    scandir = os.scandir

    class Reversed:
        def __init__(self, path="."):
            with scandir(path) as entries:
                self.entries = iter(sorted(entries, key=lambda e: e.name, reverse=True))

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.entries)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(os, "scandir", Reversed)


# Torch modes a caller may hold around a fit or a prediction (features extracted under
# no_grad or inference_mode, a training loop's autocast).
_CALLER_MODES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


@pytest.fixture(params=list(_CALLER_MODES))
def caller_mode(request):
    """``(name, mode)``: each torch mode a caller may hold, ``mode()`` its context."""
    return request.param, _CALLER_MODES[request.param]


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, whatever the test run inherited (a job started in the
    background ignores SIGINT, and the held imports then leave it so)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
