"""Every rank's picklable object, gathered over the run's gloo group, its tensors let go by
gloo before the gather returns."""

from __future__ import annotations

import pickle
import time

import torch

# How long a gloo worker may keep a gathered tensor after the gather has returned (it
# lets go at once: this bounds a wait that should never be long).
_LET_GO_S = 60.0


def all_gather_object(into: list, obj: object) -> None:
    """Every rank's ``obj`` into ``into`` (one item a rank) in rank order, as
    ``torch.distributed.all_gather_object`` puts them, except that no tensor of the
    gather is left to a gloo worker thread once it returns. The worker lets go of a
    collective's tensors after the collective has returned; where their Python objects
    were freed first (torch's all_gather_object frees them as it returns), it needs the
    GIL to free them. Older torch (2.5) holds the GIL while it destroys a gloo group,
    joining those threads: a group destroyed just after an exchange (a rank's error
    raised at once, its group left) hung in ``destroy_process_group`` for ever."""
    import torch.distributed as dist

    if "gloo" not in str(dist.get_backend()):  # (a caller's NCCL group: torch's own gather,
        dist.all_gather_object(into, obj)  # on its device; the hang is gloo's)
        return
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.long)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in into]
    dist.all_gather(sizes, size)
    longest = max(int(each) for each in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    gathered = [torch.empty(longest, dtype=torch.uint8) for _ in into]
    dist.all_gather(gathered, padded)
    _let_go([size, *sizes, padded, *gathered])
    into[:] = [
        pickle.loads(each[: int(n)].numpy().tobytes())
        for each, n in zip(gathered, sizes, strict=True)
    ]


def _let_go(tensors: list[torch.Tensor]) -> None:
    """Wait, these tensors' Python objects kept (so that gloo's worker needs no GIL to
    let go of them), until nothing else holds them: the worker has let go."""
    deadline = time.monotonic() + _LET_GO_S
    while any(t._use_count() > 1 for t in tensors) and time.monotonic() < deadline:
        time.sleep(0.001)  # (the GIL released meanwhile)
