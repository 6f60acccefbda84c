"""The DataLoader of an extraction and its worker processes: how many, the blocks each is
dealt, and the check that their batches can reach the run.
"""

from __future__ import annotations

import errno
import multiprocessing.util
import os
import sys
import tempfile
import traceback

import numpy as np
import torch

try:
    import resource
except ImportError:  # (Windows)
    resource = None

from ._decoding import MAX_ASPECT
from ._images import ItemDataset, collate_items


def worker_order(blocks: list[np.ndarray], units: np.ndarray, n_workers: int) -> list:
    """``blocks`` reordered so that, dealt round-robin to ``n_workers`` as a DataLoader
    deals its batches (block i to worker i mod n), each worker gets whole units (Parquet
    row groups, tar shards) where the balance allows.

    A worker streams a row group forward from its start: with blocks dealt in source order
    every worker streamed every row group past the others' blocks, reading the data up to
    n times. Units go, largest share first, to the worker with the fewest blocks; only the
    blocks that even the workers' counts out move, from the end of one list to another (a
    unit larger than a worker's share is split, each part read by one worker). Each
    worker's blocks stay in source order. Writes are addressed by row, so the order changes
    nothing in the store.
    """
    if n_workers < 2 or len(blocks) <= 1:
        return blocks
    groups: dict[int, list] = {}
    for block in blocks:  # a block spanning two units goes with its first row's
        groups.setdefault(int(units[block[0]]), []).append(block)
    lists: list[list] = [[] for _ in range(n_workers)]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(lists, key=len).extend(group)
    quota = [len(chunk) for chunk in np.array_split(np.arange(len(blocks)), n_workers)]
    lists.sort(key=len, reverse=True)
    spare = [block for lst, q in zip(lists, quota, strict=True) for block in lst[q:]]
    for lst, q in zip(lists, quota, strict=True):
        del lst[q:]
        while len(lst) < q:
            lst.append(spare.pop())
        # In source order within a worker: its cursor only goes forward, and a block
        # behind it re-streams the row group from its start.
        lst.sort(key=lambda block: int(block[0]))
    return [lists[i % n_workers][i // n_workers] for i in range(len(blocks))]


def _workers(num_workers: int | None) -> int:
    """The DataLoader's worker processes: ``num_workers``, or for None the CPUs but one (8 at
    most) of those this process may run on: os.cpu_count() counts the machine's, and a job
    given one core of 16 (Slurm, taskset) started 8 workers on it, which torch warned of
    (an error under ``-W error``)."""
    if num_workers is not None:
        return num_workers
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (macOS, Windows: no affinity)
        cpus = os.cpu_count() or 1
    return min(8, max(0, cpus - 1))


# The bytes of an AF_UNIX socket's path at most (sun_path, less its closing NUL).
_SOCKET_PATH_BYTES = 103 if sys.platform == "darwin" else 107


def _check_worker_sockets(num_workers: int | None) -> None:
    """Refuse DataLoader workers whose batches could not reach this process. With torch's
    file_descriptor sharing (Linux's default) a worker passes each batch's tensors through
    a socket in multiprocessing's temporary folder, ``<TMPDIR>/pymp-*/listener-*``: where
    TMPDIR was too long for that path (over 75 bytes), every worker failed ("AF_UNIX path
    too long") and the run waited for ever."""
    if (
        _workers(num_workers) == 0
        or torch.multiprocessing.get_sharing_strategy() != "file_descriptor"
        # (a multiprocessing that picks a shorter folder itself, CPython gh-132124)
        or hasattr(multiprocessing.util, "_get_base_temp_dir")
    ):
        return
    # (not made here, by multiprocessing.util.get_temp_dir: a TMPDIR this process cannot
    # write to, an output check's to name, would end in its PermissionError)
    folder = os.path.join(tempfile.gettempdir(), "pymp-12345678")
    if len(os.fsencode(os.path.join(folder, "listener-12345678"))) > _SOCKET_PATH_BYTES:
        raise ValueError(
            f"The temporary folder {os.path.dirname(folder)!r} (TMPDIR) is too long a path "
            "for the sockets that the DataLoader's worker processes make inside it (an "
            f"AF_UNIX socket's path holds {_SOCKET_PATH_BYTES} bytes: TMPDIR "
            f"{_SOCKET_PATH_BYTES - 32} at most); set TMPDIR to a shorter folder, such as "
            "/tmp, or pass num_workers=0 (--workers 0)."
        )


def _loader(src, backbone, blocks, num_workers, decode, device) -> torch.utils.data.DataLoader:
    # No more workers than batches: one without a batch has nothing to do, and torch starts
    # every worker asked for (it only warns above the CPUs): --workers 100000 on a folder of
    # 10 images forked until the machine ran out of memory. Not capped at the CPUs: reading
    # from a network file system, workers beyond them wait on the network, not on a core.
    num_workers = min(_workers(num_workers), len(blocks))
    if src.archive is not None:
        blocks = worker_order(blocks, src.archive.unit, num_workers)
    return torch.utils.data.DataLoader(
        ItemDataset(
            src,
            backbone.transform,
            jpeg_bytes=decode == "tensor",
            max_aspect=backbone.preprocess.get("max_aspect", MAX_ASPECT),
        ),
        batch_sampler=[b.tolist() for b in blocks],
        num_workers=num_workers,
        collate_fn=collate_items,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
        # Its workers' base seed drawn from a generator of its own: drawn from torch's
        # global one, a run left the caller's random stream elsewhere than a reuse did.
        generator=torch.Generator(),
    )


def started(loader: torch.utils.data.DataLoader):
    """``iter(loader)``: an iterator whose workers have started. Where the limit on open
    files stops them (each worker takes a few: its queue, its process), the workers started
    so far are stopped and an OSError says the cure in one line; torch's half-made iterator
    printed a traceback as it was collected ("Exception ignored in ... __del__")."""
    try:
        return iter(loader)
    except OSError as err:
        if err.errno != errno.EMFILE:
            raise
        _stop_half_made(err.__traceback__)
    # (raised here, not in the handler: the error would hold the half-made iterator, its
    # pipes open, as its context)
    raise OSError(
        errno.EMFILE,
        f"Too many open files to start {loader.num_workers} DataLoader worker processes; "
        + open_files_cure(),
    )


def open_files_cure() -> str:
    """What to do where the DataLoader's workers ran out of open files."""
    limit = "" if resource is None else f", now {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    return f"use fewer --workers (num_workers), or raise the limit on open files (ulimit -n{limit})"


def _stop_half_made(tb) -> None:
    """Stop the workers started by the DataLoader iterator whose ``__init__`` failed with
    the traceback ``tb``. Its ``__del__`` then does nothing: it failed, missing what
    ``__init__`` sets last."""
    making = torch.utils.data.dataloader._MultiProcessingDataLoaderIter.__init__.__code__
    frames = traceback.walk_tb(tb)
    for half_made in (frame.f_locals["self"] for frame, _ in frames if frame.f_code is making):
        workers = getattr(half_made, "_workers", [])
        for w in workers:
            w.terminate()
        for w in workers:
            w.join()
        half_made._shutdown = True
    # Its queues' pipes closed now, not once a garbage collection finds them.
    traceback.clear_frames(tb)
