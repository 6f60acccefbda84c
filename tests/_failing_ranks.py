"""torchrun ranks of runs in which the ranks fail, or find things otherwise, for tests run
in two processes."""

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from extract import _runner, extract_features


def in_env(rank: int, env: dict[str, str], target, *args) -> None:
    """``target(rank, *args)`` on one torch thread, under ``env``: the variables of the test
    that started this rank, which a process forked by a forkserver does not inherit (it
    has the forkserver's)."""
    import torch

    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(1)
    target(rank, *args)


FAST = dict(batch_size=4, num_workers=0, image_size=32, progress=False, device="cpu")
BACKBONE = "timm:test_resnet@random"
# Where rank 1 fails: listing the images, before the ranks first meet; building the model,
# after.
FAILING = {"source": "open_source", "backbone": "create_backbone"}


def rank_beside_a_failing_rank(
    rank: int, folder: Path, said: Path, ports: list[int] | None
) -> None:
    """One of two ranks extracting ``folder`` under torchrun's variables, once into
    ``said/<where>.h5`` for each place of :data:`FAILING`, where rank 1 fails. Without
    ``ports`` the group is the caller's, with a timeout of 60 s, and each rank keeps it
    (alive, as a program that goes on after the error) until the other has ended; with
    them, each run makes its own, its store at 127.0.0.1 on a port of its own (one port for
    both runs raced: a rank on to its second run could join rank 0's first store, closing).
    Each writes what each run ended with into ``said/<where>-rank<rank>.txt``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    own_group = ports is not None
    if own_group:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
    else:
        timeout = timedelta(seconds=60)  # without its failure told, rank 0 waited this long
        init = f"file://{said / 'init'}"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timeout)
    try:
        for k, (where, name) in enumerate(FAILING.items()):
            if own_group:
                os.environ["MASTER_PORT"] = str(ports[k])
            real = getattr(_runner, name)

            def fails(*args, where=where, **kwargs):
                raise RuntimeError(f"rank 1 cannot {where}\nsecond line")

            if rank == 1:
                setattr(_runner, name, fails)
            try:
                extract_features(folder, BACKBONE, said / f"{where}.h5", **FAST)
                ended = "returned"
            except Exception as error:
                ended = f"{type(error).__name__}: {error}"
            finally:
                setattr(_runner, name, real)
            (said / f"{where}-rank{rank}.txt").write_text(ended)
        # Each goes on (its group alive) until the other is done (or the guard's minute).
        deadline = time.monotonic() + 60
        other = said / f"backbone-rank{1 - rank}.txt"
        while not own_group and not other.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _caller_s_group(rank: int, said: Path, timeout_s: float = 60) -> None:
    """Join the two ranks' group as a caller would (torchrun's variables set), with a
    timeout of ``timeout_s``: where a rank waits that long for the other, the run waited
    for it."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    init = f"file://{said / 'init'}"
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timeout)


def _ended(said: Path, rank: int, run) -> None:
    """``run()``'s outcome on this rank, written into ``said/rank<rank>.txt``: "returned",
    or its error (a KeyboardInterrupt too); the group is kept (alive, as a program that goes
    on after the error) until the other rank has ended, or for the guard's minute."""
    try:
        try:
            run()
            ended = "returned"
        except BaseException as error:  # (a KeyboardInterrupt too)
            kind = type(error).__name__
            ended = f"{kind}: {error}" if str(error) else kind
        (said / f"rank{rank}.txt").write_text(ended)
        deadline = time.monotonic() + 60
        while not (said / f"rank{1 - rank}.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_finding_the_store_complete_or_not(rank: int, folder: Path, said: Path) -> None:
    """One of two ranks extracting ``folder`` into the complete store ``said/f.h5``, in the
    caller's group: rank 0 finds it complete, rank 1 not (it changed between their reads)."""
    _caller_s_group(rank, said)
    _runner._is_complete = lambda *args, **kwargs: rank == 0
    _ended(said, rank, lambda: extract_features(folder, BACKBONE, said / "f.h5", **FAST))


def _files_hashed(folder: Path) -> list[str]:
    """The files of ``folder`` that this rank reads to hash from now on, as it reads them
    (relative to ``folder``; the list grows as they are read)."""
    from extract import _touched

    real, hashed = _touched.read_file, []

    def spied(path, listed=None):
        hashed.append(os.path.relpath(path, folder))
        return real(path, listed)

    _touched.read_file = spied
    return hashed


def rank_hashing_its_share(rank: int, folder: Path, said: Path, changed: str) -> None:
    """One of two ranks extracting ``folder`` into the complete store ``said/f.h5``, whose
    images were touched since, in the caller's group; then again once rank 0 has given
    ``changed`` other bytes of its size and touched every image again. Each run's outcome
    and the files this rank read to hash go into ``said/rank<rank>.json``, as
    ``{"touched": [outcome, files], "changed": [...]}``."""
    _caller_s_group(rank, said)
    hashed = _files_hashed(folder)

    def runs() -> None:
        outcomes = {}
        for run in ("touched", "changed"):
            if run == "changed":
                dist.barrier()  # (both done with the first run)
                if rank == 0:  # every image touched again, one of them changed
                    data = bytearray((folder / changed).read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    (folder / changed).write_bytes(data)
                    for path in folder.rglob("*.*"):
                        st = path.stat()
                        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
                dist.barrier()
            hashed.clear()
            try:
                extract_features(folder, BACKBONE, said / "f.h5", **FAST)
                ended = "returned"
            except Exception as error:
                ended = f"{type(error).__name__}: {error}"
            outcomes[run] = [ended, sorted(hashed)]
        (said / f"rank{rank}.json").write_text(json.dumps(outcomes))

    _ended(said, rank, runs)


def rank_retrying_otherwise(rank: int, folder: Path, said: Path) -> None:
    """One of two ranks retrying the failed images of the store ``said/f.h5`` of ``folder``
    (``retry_failed``) in another dtype (float16), in the caller's group. Its outcome and
    the files this rank read to hash go into ``said/rank<rank>.json``, as ``[outcome,
    files]``."""
    _caller_s_group(rank, said)
    hashed = _files_hashed(folder)

    def run() -> None:
        try:
            extract_features(
                folder, BACKBONE, said / "f.h5", retry_failed=True, dtype="float16", **FAST
            )
            ended = "returned"
        except Exception as error:
            ended = f"{type(error).__name__}: {error}"
        (said / f"rank{rank}.json").write_text(json.dumps([ended, sorted(hashed)]))

    _ended(said, rank, run)


def rank_beside_a_rank_stopping_mid_shard(rank: int, folder: Path, said: Path, how: str) -> None:
    """One of two ranks extracting ``folder`` into ``said/f.h5`` one image a batch, in the
    caller's group (a timeout of 5 s), where rank 1 stops at its first batch, once rank 0
    is at its third: with an error (``how="error"``) or a KeyboardInterrupt
    (``"interrupt"``). Rank 0 holds its third batch until rank 1 has stopped (its error
    logged, or its interrupt raised). Then both run again. Into ``said/rank<rank>.json``
    go each run's outcome and the rows of its shard done after the first, as
    ``{"stopped": ..., "done": ..., "resumed": ...}``."""
    import logging

    import h5py

    from extract import shard_path
    from extract._schema import DONE

    _caller_s_group(rank, said, timeout_s=5)
    out, stopped, third = said / "f.h5", said / "rank1-stopped", said / "rank0-at-3"
    real, batches = _runner._embed, []

    def wait_for(flag: Path) -> None:
        deadline = time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def embed(*args, **kwargs):
        batches.append(1)
        if rank == 1:
            wait_for(third)
            if how == "error":
                raise RuntimeError("rank 1's device failed")
            raise KeyboardInterrupt
        if len(batches) == 3:  # (rank 0) held until rank 1 has stopped
            third.touch()
            wait_for(stopped)
        return real(*args, **kwargs)

    class Stopped(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Rank 1 failed"):
                stopped.touch()

    logging.getLogger("extract").addHandler(Stopped(logging.ERROR))
    outcomes = {}
    fast = dict(FAST, batch_size=1)

    def run(name: str) -> None:
        try:
            extract_features(folder, BACKBONE, out, **fast)
            outcomes[name] = "returned"
        except BaseException as error:  # (a KeyboardInterrupt too)
            kind = type(error).__name__
            outcomes[name] = f"{kind}: {error}" if str(error) else kind
            if rank == 1:
                stopped.touch()

    try:
        _runner._embed = embed
        run("stopped")
        _runner._embed = real
        with h5py.File(shard_path(out, rank, 2), "r") as f:
            outcomes["done"] = int((f["status"][:] == DONE).sum())
        dist.barrier()  # (both done with the first run)
        run("resumed")
        (said / f"rank{rank}.json").write_text(json.dumps(outcomes))
    finally:
        dist.destroy_process_group()


def rank_interrupted_beside_a_failed_rank_s_exchange(
    rank: int, folder: Path, said: Path, where: str
) -> None:
    """One of two ranks extracting ``folder`` into ``said/f.h5`` one image a batch, in the
    caller's group (a timeout of 60 s): rank 1 fails ``where`` (``"listing"`` the images,
    before the ranks first meet at the listings' check; ``"batch"``: at its first batch)
    and goes to the exchange of its failure; rank 0, there too, is interrupted
    (KeyboardInterrupt) once rank 1 has logged its failure (just before that exchange),
    before it looks at the store. Each run's outcome goes into ``said/rank<rank>.txt``; the
    group is kept until the other rank has ended (:func:`_ended`)."""
    import logging

    _caller_s_group(rank, said, timeout_s=60)
    failed = said / "rank1-failed"
    name = {"listing": "open_source", "batch": "_embed"}[where]

    def stops(*args, **kwargs):
        if rank == 1:
            raise RuntimeError(f"rank 1 failed at its {where}")
        deadline = time.monotonic() + 20
        while not failed.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise KeyboardInterrupt

    class Failed(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Rank 1 failed"):
                failed.touch()

    logging.getLogger("extract").addHandler(Failed(logging.ERROR))
    setattr(_runner, name, stops)
    fast = dict(FAST, batch_size=1)
    _ended(said, rank, lambda: extract_features(folder, BACKBONE, said / "f.h5", **fast))


def rank_interrupted_at_the_merge(rank: int, folder: Path, said: Path, where: str) -> None:
    """One of two ranks extracting ``folder`` into ``said/f.h5``, in the caller's group (a
    timeout of 60 s), where rank 0 is interrupted (KeyboardInterrupt) at the merge: once
    every rank has said its failures at their count, before the shards' barrier
    (``where="count"``), or while it merges them (``"merge"``); it touches
    ``said/rank0-interrupted`` first. Each run's outcome goes into ``said/rank<rank>.txt``;
    the group is kept until the other rank has ended (:func:`_ended`)."""
    from extract import _ranks

    _caller_s_group(rank, said, timeout_s=60)
    real = _runner._all_ranks_failures

    def interrupted(*args, **kwargs):
        (said / "rank0-interrupted").touch()
        raise KeyboardInterrupt

    if rank == 0 and where == "count":
        _runner._all_ranks_failures = lambda *args: (real(*args), interrupted())
    elif rank == 0:
        _ranks._merge_shards_of = interrupted
    _ended(said, rank, lambda: extract_features(folder, BACKBONE, said / "f.h5", **FAST))


def rank_beside_a_rank_killed_outright(rank: int, folder: Path, said: Path) -> None:
    """One of two ranks extracting ``folder`` into ``said/f.h5``, in the caller's group (a
    timeout of 10 minutes), their heartbeats every 0.1 s and a rank named after 10 minutes
    of silence (as the group's timeout: neither ends the wait where the test looks): rank 1
    is killed outright (SIGKILL) at its first batch, and rank 0 goes on to the end of its
    shard, where it waits for it. Rank 0's outcome goes into ``said/rank0.txt``
    (:func:`_ended`)."""
    import signal

    from extract import _gathered

    _gathered.BEAT_S, _gathered.SILENCE_S = 0.1, 600.0
    _caller_s_group(rank, said, timeout_s=600)

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == 1:
        _runner._embed = killed
    _ended(said, rank, lambda: extract_features(folder, BACKBONE, said / "f.h5", **FAST))


def rank_beside_a_rank_killed_after_its_failure(rank: int, folder: Path, said: Path) -> None:
    """One of two ranks extracting ``folder`` into ``said/f.h5``, in the caller's group (a
    timeout of 10 minutes), their heartbeats every 0.1 s and a rank named after 10 minutes
    of silence: rank 1 fails at its first batch, says so in the store, and is killed
    outright (SIGKILL) as it logs its failure, before the exchange where it would meet rank
    0. Rank 0's outcome goes into ``said/rank0.txt`` (:func:`_ended`)."""
    import logging
    import signal

    from extract import _gathered

    _gathered.BEAT_S, _gathered.SILENCE_S = 0.1, 600.0
    _caller_s_group(rank, said, timeout_s=600)

    def fails(*args, **kwargs):
        raise RuntimeError("rank 1's device failed")

    class Killed(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Rank 1 failed"):
                os.kill(os.getpid(), signal.SIGKILL)

    if rank == 1:
        _runner._embed = fails
        logging.getLogger("extract").addHandler(Killed(logging.ERROR))
    _ended(said, rank, lambda: extract_features(folder, BACKBONE, said / "f.h5", **FAST))
