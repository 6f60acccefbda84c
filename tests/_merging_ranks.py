"""A torchrun rank at a merge that fails at rank 0, for a test run in two processes."""

import errno
import os
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from extract import _ranks


def rank_at_a_failing_merge(rank: int, init_file: Path, out: Path, said: Path) -> None:
    """One of two gloo processes at the merge of ``out``, whose group is the caller's (kept
    after the run, as extract_features leaves it), with a timeout of 20 s: rank 0's merge
    fails, and rank 0 goes on after it. Each writes what the run ended with into ``said``,
    and rank 0 leaves once rank 1 has."""

    def fails(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", os.fspath(out))

    _ranks._merge = fails  # (rank 1 never merges)
    timeout = timedelta(seconds=20)  # without its failure told, rank 1 waited this long
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timeout
    )
    try:
        try:
            _ranks._merge_on_rank0(out, rank, 2, False)
            ended = "returned"
        except Exception as error:
            ended = f"{type(error).__name__}: {error}"
        (said / f"rank{rank}.txt").write_text(ended)
        # Rank 0 goes on (its group alive) until rank 1 is done (or the guard's minute).
        deadline = time.monotonic() + 60
        while rank == 0 and not (said / "rank1.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        dist.destroy_process_group()
