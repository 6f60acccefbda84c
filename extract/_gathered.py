"""Every rank's picklable object, gathered over the run's gloo group (its tensors let go by
gloo before the gather returns), or through the group's key-value store, where the wait can
be left, and each rank's heartbeat there, by which a rank killed outright is named (at once
where its process is seen to have ended, on the same host)."""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch

from mr2_probe._h5 import one_line

from ._launcher import launcher_gone
from ._paths import plural
from ._processes import ended, process_identity
from ._schema import StoreError

# The first wait between two looks at the store for the other ranks' words, doubled at each
# look up to the last: a rank that comes at once is seen within milliseconds, and one that
# comes hours later is looked for five times a second (one look: tens of microseconds).
_FIRST_LOOK_S, _LAST_LOOK_S = 0.001, 0.2

# How long a gloo worker may keep a gathered tensor after the gather has returned (it
# lets go at once: this bounds a wait that should never be long).
_LET_GO_S = 60.0

# Each rank's heartbeat in the store (:func:`beating`): its counter bumped every BEAT_S
# seconds, and a rank waited for at an exchange whose counter has stood still for SILENCE_S
# is named as gone (killed outright, by the out-of-memory killer say: it says nothing, and
# the others waited for it until the group's timeout, 24 h). The counter is bumped by a
# thread of its own, so a rank at work beats too: its main thread lets the GIL go at least
# every few milliseconds (Python's switch interval) except within one call into C that
# holds it, and the longest of those in a run (an h5py read or write of a chunk, decoding an
# image, a backbone's batch on the CPU, which torch runs without the GIL anyway) take
# seconds at most: 120 s is far above them, and still names a dead rank within minutes.
# Before its first beat each rank writes what identifies its process (``{alive}/{rank}/
# process``: :mod:`._processes`), so that a rank on the same host (most runs put several on
# one) names one whose process has ended at its first look, not after that silence; the
# silence is kept for ranks on other hosts or in other PID namespaces (containers), or where
# ``/proc`` says nothing (macOS).
BEAT_S = 2.0
SILENCE_S = 120.0
# How long a run's end waits for its heartbeat thread to stop: it stops within one bump of
# the store, which does not wait on any other rank (a store that answers nothing keeps it
# until the store's timeout: a daemon thread, it ends with the process).
_STOP_BEATING_S = 10.0


@contextlib.contextmanager
def beating(store, alive: str, rank: int) -> Iterator[None]:
    """Inside, a daemon thread bumps this rank's counter ``{alive}/{rank}`` in the group's
    key-value ``store`` at once and every :data:`BEAT_S` seconds, by which the others
    waiting for it at an exchange (:func:`gather_in_store`) know it alive, having first
    set what identifies its process under ``{alive}/{rank}/process`` (where ``/proc``
    tells it: :func:`~._processes.process_identity`), by which those on its host see it
    end; stopped, and joined, on the way out (the run ended on this rank, however).
    (torch's stores are safe to share between threads: a TCPStore client serialises its
    operations, and no rank waits on a key while it holds the client:
    :func:`gather_in_store` looks, with check.)"""
    stopped = threading.Event()
    identity = process_identity()

    def beat() -> None:
        try:  # (before the first beat: a rank heard beating has told it, if it ever does)
            if identity is not None:
                store.set(f"{alive}/{rank}/process", identity)
        except Exception:
            return
        while not stopped.is_set() and not launcher_gone():
            try:
                store.add(f"{alive}/{rank}", 1)
            except Exception:  # (the store gone: the waits of this rank say so)
                return
            stopped.wait(BEAT_S)

    thread = threading.Thread(target=beat, name="mr2-extract heartbeat", daemon=True)
    try:  # (started inside: a Ctrl-C right after the start left it behind)
        thread.start()
        yield
    finally:
        stopped.set()
        if thread.is_alive():
            thread.join(_STOP_BEATING_S)


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
    store,
    key: str,
    rank: int,
    world_size: int,
    obj: object,
    stop: Callable[[], None],
    alive: str | None = None,
    gone: Callable[[int, int | None], None] | None = None,
) -> list:
    """Every rank's ``obj`` in rank order, gathered through the group's key-value ``store``:
    each rank sets its own (pickled) under ``{key}/{rank}`` (``key`` this gather's own: no
    other gather's), then looks for the others' until all are there, calling ``stop``
    before it sets its own and between looks, which raises to leave the gather (a rank said
    it will not come). A gloo
    collective cannot be left once entered: a rank waited there for one that had said so,
    until the group's timeout, and no Ctrl-C reached it. A rank that never comes and says
    nothing (killed outright) is a :class:`StoreError` naming it once its process, on this
    host, is seen to have ended (:func:`beating` tells it), or once its heartbeat (its
    counter ``{alive}/{rank}``) has stood still for :data:`SILENCE_S` (``alive`` None: no
    heartbeat), or else at the store's timeout (the group's); before that error, ``gone``
    (where given) is called with the rank and its pid (None where it stopped answering),
    and raises where that rank said why before it ended (its failure, told before it was
    killed). A
    store gone with the process that held it is a :class:`StoreError` naming that."""
    stop()
    try:
        return _gathered_in(store, key, rank, world_size, obj, stop, alive, gone)
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
    store,
    key: str,
    rank: int,
    world_size: int,
    obj: object,
    stop: Callable[[], None],
    alive: str | None,
    gone: Callable[[int, int | None], None] | None,
) -> list:
    """:func:`gather_in_store`'s exchange itself, which the store's errors leave."""
    store.set(f"{key}/{rank}", pickle.dumps(obj))
    others = {r: f"{key}/{r}" for r in range(world_size) if r != rank}
    timeout = getattr(store, "timeout", None) or timedelta(hours=24)
    deadline, wait = time.monotonic() + timeout.total_seconds(), _FIRST_LOOK_S
    heard: dict[int, tuple[int, float]] = {}  # rank: its heartbeat's count, when it moved
    identities: dict[int, bytes | None] = {}  # rank: its process's (:func:`beating`), once read
    listen = time.monotonic() + BEAT_S
    # (check, not wait: a store's wait past its timeout raises, and logs where it is torch's;
    # and a TCPStore client waiting on a key holds back this rank's heartbeat meanwhile)
    while not store.check(list(others.values())):
        time.sleep(wait)
        wait = min(2 * wait, _LAST_LOOK_S)
        stop()
        if alive is not None and time.monotonic() >= listen:
            listen = time.monotonic() + BEAT_S
            missing = [r for r, k in others.items() if not store.check([k])]
            silent = _silent(store, alive, missing, heard, identities)
            if silent is not None:
                other, pid = silent
                if pid is not None:
                    stop()  # (where it said why before it ended, that is the error)
                if gone is not None:  # (where it told its failure before it was killed)
                    gone(other, pid)
                how = (
                    f"whose process (pid {pid}, on this host) has ended without a word"
                    if pid is not None
                    else "which stopped answering: its heartbeat in the group's store stood "
                    f"still for {SILENCE_S:g} s"
                )
                raise StoreError(
                    f"Rank {rank} waited for rank {other} to meet it, {how} (killed, say, "
                    "with kill -9 or by the out-of-memory killer). Every rank stops, the rows "
                    "written so far kept: the same command resumes."
                )
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


def _silent(
    store, alive: str, ranks: list[int], heard: dict, identities: dict
) -> tuple[int, int | None] | None:
    """The first of ``ranks`` whose process is seen to have ended, with its pid, or whose
    heartbeat (its counter ``{alive}/{rank}`` in ``store``: :func:`beating`) has not moved
    for :data:`SILENCE_S` since first heard, with None; or None. ``heard`` keeps, rank by
    rank, its count and when it last moved; ``identities``, its process's identity (None:
    it told none), read once it has beaten."""
    now = time.monotonic()
    for r in ranks:  # (ranks not yet come: a look each, every BEAT_S)
        count = store.add(f"{alive}/{r}", 0)  # (0 where it never beat)
        if count and r not in identities:  # (set before its first beat, where it is set)
            key = f"{alive}/{r}/process"
            identities[r] = store.get(key) if store.check([key]) else None
        pid = ended(identities.get(r))  # (this host's /proc: no look at the store)
        if pid is not None:
            return r, pid
        if heard.get(r, (None,))[0] != count:
            heard[r] = (count, now)
        elif now - heard[r][1] >= SILENCE_S:
            return r, None
    return None
