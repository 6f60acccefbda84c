"""Every rank's picklable object, gathered over the run's gloo group (its tensors let go by
gloo before the gather returns), or through the group's key-value store, where the wait can
be left."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from datetime import timedelta

import torch

from mr2_probe._h5 import one_line

from ._paths import plural
from ._schema import StoreError

# The first wait between two looks at the store for the other ranks' words, doubled at each
# look up to the last: a rank that comes at once is seen within milliseconds, and one that
# comes hours later is looked for five times a second (one look: tens of microseconds).
_FIRST_LOOK_S, _LAST_LOOK_S = 0.001, 0.2

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


def gather_in_store(
    store, key: str, rank: int, world_size: int, obj: object, stop: Callable[[], None]
) -> list:
    """Every rank's ``obj`` in rank order, gathered through the group's key-value ``store``:
    each rank sets its own (pickled) under ``{key}/{rank}`` (``key`` this gather's own: no
    other gather's), then looks for the others' until all are there, calling ``stop``
    before it sets its own and between looks, which raises to leave the gather (a rank said
    it will not come). A gloo
    collective cannot be left once entered: a rank waited there for one that had said so,
    until the group's timeout, and no Ctrl-C reached it. A rank that never comes and says
    nothing (killed outright) is waited for until the store's timeout (the group's). A
    store gone with the process that held it is a :class:`StoreError` naming that."""
    stop()
    try:
        return _gathered_in(store, key, rank, world_size, obj, stop)
    except StoreError:
        raise
    except Exception as error:  # (gloo's gather named the lost peer; the store's says
        # "Broken pipe", a traceback under the command line)
        stop()  # (torchrun's launcher gone, the store with it: stopped as at a Ctrl-C)
        raise StoreError(
            f"Rank {rank} lost the group's store while it met the other ranks "
            f"({type(error).__name__}: {one_line(error, 200)}): the process that held it "
            "(rank 0, or torchrun's launcher) stopped, killed say. Every rank stops, the rows "
            "written so far kept: the same command resumes."
        ) from error


def _gathered_in(
    store, key: str, rank: int, world_size: int, obj: object, stop: Callable[[], None]
) -> list:
    """:func:`gather_in_store`'s exchange itself, which the store's errors leave."""
    store.set(f"{key}/{rank}", pickle.dumps(obj))
    others = {r: f"{key}/{r}" for r in range(world_size) if r != rank}
    timeout = getattr(store, "timeout", None) or timedelta(hours=24)
    deadline, wait = time.monotonic() + timeout.total_seconds(), _FIRST_LOOK_S
    # (check, not wait: a store's wait past its timeout raises, and logs where it is torch's)
    while not store.check(list(others.values())):
        time.sleep(wait)
        wait = min(2 * wait, _LAST_LOOK_S)
        stop()
        if time.monotonic() >= deadline:
            missing = [r for r, k in others.items() if not store.check([k])]
            # (a rank with more rows left than this one, a resumed shard's say, may still be
            # at work: the group's timeout, not the rank, is then what to cure)
            raise StoreError(
                f"Rank {rank} waited the group's timeout ({timeout}) for "
                f"{plural(len(missing), 'rank')} {', '.join(map(str, missing))} to meet it, "
                "which neither came nor said why: killed, say, or still at work with more "
                "rows left than this rank. Every rank stops, the rows written so far kept: "
                "the same command resumes (a group of your own: give init_process_group a "
                "longer timeout)."
            )
    return [obj if r == rank else pickle.loads(store.get(others[r])) for r in range(world_size)]
