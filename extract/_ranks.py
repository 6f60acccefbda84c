"""torchrun's ranks in one run: their group, what they tell each other where they meet
(failures, the listing's check, the merged store's verdict), and the merge on rank 0.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from mr2_probe._h5 import one_line

from . import _gathered
from ._gathered import all_gather_object, beating, gather_in_store
from ._images import ImageSource
from ._launcher import connecting, launcher_gone
from ._merge import _mark, _merge, shard_path
from ._paths import plural
from ._resume import _identity
from ._schema import StoreError

# The run's logger (extract._runner), which users' log filters name: a rank's failure is
# the run's message, wherever it is told from.
logger = logging.getLogger("extract._runner")


def _distributed_env() -> tuple[int, int]:
    """``RANK`` and ``WORLD_SIZE`` as torchrun sets them (0 and 1 where unset); a value
    that is no whole number is refused by name (``export RANK=$SLURM_PROCID`` with the
    latter unset failed as "invalid literal for int() with base 10: ''")."""
    values = []
    for name, default, least in (("RANK", "0", 0), ("WORLD_SIZE", "1", 1)):
        text = os.environ.get(name, default)
        if not (text.strip().isascii() and text.strip().isdigit() and int(text) >= least):
            raise ValueError(
                f"The {name} environment variable must be an int >= {least} (torchrun sets "
                f"it). Got {name}={text!r} instead; unset it to run in one process."
            )
        values.append(int(text))
    return values[0], values[1]


# This process's runs under torchrun, each group's keys in torchrun's store its own: a
# group made again on the keys of one that was left read its addresses and failed (a
# script extracting two splits failed at the second).
_RUNS = itertools.count()


@contextlib.contextmanager
def _ranks_group() -> Iterator[object]:
    """torchrun's ranks in one process group for the run, left after it (unless the
    caller has joined one already, which is used as it is); inside, the group's key-value
    store (None where torch does not give a caller's group's store)."""
    import torch.distributed as dist

    if dist.is_initialized():
        # (ProcessGroup.get_group_store is missing from older torch: there a failure is
        # told where the ranks next meet alone)
        try:
            store = dist.group.WORLD.get_group_store()
        except Exception:
            store = None
        yield store
        return
    # gloo: what is exchanged is small and on the host, so no GPU is needed; the long
    # timeout lets fast ranks wait for slow ones at the end of an hours-long run.
    timeout = timedelta(hours=24)
    with connecting():  # (a launcher killed meanwhile took its store: killed at once)
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"mr2-extract/{next(_RUNS)}", store)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    try:
        yield store
    finally:
        dist.destroy_process_group()


def _said(error: BaseException) -> str:
    """``error`` as a rank tells it to the others: ``"Type: message"`` on one line (its
    type alone where it has no message, as a KeyboardInterrupt)."""
    text = one_line(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _every_rank_said(
    value: object, failure: Exception | None, world_size: int, gather=None
) -> tuple:
    """Every rank's ``value`` in rank order, and the ranks that failed, as ``(rank, "Type:
    message")`` (this one's ``failure``, or None): the outcome each rank tells the others at
    a collective point of the run, so that no rank waits there for one that failed (until
    the group's timeout, where the group outlives the error: the caller's own, or a rank
    that goes on after it; or to meet gloo's "connection closed", which names nothing).
    ``gather(obj)``: every rank's ``obj`` (None: gathered over the gloo group)."""
    said = None if failure is None else _said(failure)
    if gather is None:
        gathered: list = [None] * world_size
        all_gather_object(gathered, (said, value))
    else:
        gathered = gather((said, value))
    failed = [(rank, told) for rank, (told, _) in enumerate(gathered) if told is not None]
    return [each for _, each in gathered], failed


class _ShardStep:
    """The collective points of a torchrun run's shard step, where its ranks meet (the
    listing's check, the failures' count at its end): at each, every rank says whether it
    failed. A rank that fails says so at once in the group's store too (under its own key
    of the run's, agreed as the run begins, and counted under the run's), where the
    others look between their batches (:meth:`stop_if_told`): they stop there and go to
    the next one, where every rank stops, the others with an error naming it. A rank
    interrupted (Ctrl-C) says so in the store alone and goes nowhere: the others stop with
    that error at their next batch, or next meeting point, not waiting there for it (nor
    for one that failed beside it: where any rank that said so was interrupted, none goes
    to the exchange). Once the key is agreed the ranks meet in the store too
    (:meth:`_meet`), so that one waiting there, a failed rank at the exchange of its
    failure say, leaves as soon as another says it was interrupted; and each rank beats
    there (:func:`beating`) until the step is left (a context manager: ``with``), so that
    one killed outright is named by the others waiting for it."""

    def __init__(self, merged: Path, world_size: int, rank: int = 0, store=None) -> None:
        self.merged, self.world_size, self.rank = merged, world_size, rank
        self.ended = False  # an exchange told of a failure, or failed itself: no more
        # What this rank is doing, which a failure tells the others (it may be in another
        # part of the step than its shard: the merged store's check, say).
        self.doing = self.making_shard(rank)
        # The group's key-value store (None: failures are told where the ranks meet alone),
        # and the run's key in it: this rank's proposal until the run's first exchange, where
        # every rank takes rank 0's (:meth:`meet_first`).
        self.store, self.key, self.agreed = store, f"mr2-extract/failed/{uuid.uuid4().hex}", False
        # Where the ranks meet once the key is agreed (the store kept even where a look at
        # it failed: every rank meets where the others do), and the exchanges so far there.
        self.meets_in, self.exchanges = store, 0
        # This rank's heartbeat there once the key is agreed, and the run's key of the
        # ranks' heartbeats (None: they do not beat, the others are not listened for).
        self._beats, self.alive = contextlib.ExitStack(), None

    def __enter__(self) -> _ShardStep:
        return self

    def __exit__(self, *exc_info) -> None:
        self._beats.close()  # (the run ended on this rank: its heartbeat stops)

    def making_shard(self, rank: int) -> str:
        """What rank ``rank`` is doing while it makes its shard (:attr:`doing`)."""
        return f"to extract its shard {os.fspath(shard_path(self.merged, rank, self.world_size))!r}"

    def meet_first(self) -> None:
        """Where the ranks have a store, agree at once on the run's key in it (one exchange
        over gloo, before any work), so that every exchange of the run is made there and
        every failure or interrupt is told there: agreed at the listings' check, a rank
        that failed while listing waited for the others in gloo's gather, where a rank
        interrupted meanwhile told it nothing, until the group's timeout."""
        import torch.distributed as dist

        if self.store is None or self.agreed or not dist.is_initialized():
            return
        keys, _ = self._meet(self.key)
        self.agree_on_key(keys[0])
        self.alive = f"{self.key}/alive"  # (each rank beats from now until the step is left)
        self._beats.enter_context(beating(self.meets_in, self.alive, self.rank))

    def agree_on_key(self, key: str) -> None:
        """Take ``key`` (rank 0's, told at the run's first exchange: :meth:`meet_first`) as
        the run's key in the store: every rank's, and no other run's (a group the caller
        keeps serves many)."""
        self.key, self.agreed = key, True

    def exchange(self, value: object) -> list | None:
        """Every rank's ``value`` in rank order (None where the ranks run one by one);
        a :class:`StoreError` naming the first rank that failed instead."""
        import torch.distributed as dist

        if not dist.is_initialized():  # (ranks run one by one: each knows its own only)
            return None
        self.ended = True
        self._stop_if_interrupted()  # (one that will not come here: not waited for)
        values, failed = self._meet(value)
        if failed:
            (rank, said), others = failed[0], len(failed) - 1
            # (a failing rank's value is what it was doing: :meth:`fail`)
            doing = values[rank] if isinstance(values[rank], str) else self.making_shard(rank)
            raise self._failed(rank, doing, said, others=others)
        self.ended = False
        return values

    def stop_if_told(self) -> None:
        """Where another rank has said in the store that it failed (a look there, no
        collective: between batches), stop: meet it at the exchange it waits at, and raise
        the error naming it; where one said it was interrupted, raise that one's at once."""
        told = self._told()
        if told is None:
            return
        if told["meets"]:
            self.exchange(None)  # (raises: that rank says there that it failed)
        self.ended = True
        raise self._failed(told["rank"], told["doing"], told["said"], interrupted=not told["meets"])

    def fail(self, error: Exception, rank: int) -> None:
        """Say at once in the store, and at the next exchange, that this rank failed with
        ``error`` (which its caller raises then); nothing after an exchange that ended the
        step."""
        import torch.distributed as dist

        if self.ended or not dist.is_initialized():
            return
        self.ended = True
        # (before the log line: once it is said, the others may stop at any batch)
        told = self._tell(error, meets=True)
        # Where another rank said it was interrupted, the others go to no exchange: nor
        # does this one, which waited there for them (a group the caller keeps: its whole
        # timeout).
        other = self._told() if told else None
        alone = other is not None and not other["meets"]
        # Said at once: without the store, the others may meet it only at the end of
        # their shards, hours on.
        logger.error(
            "Rank %d failed %s (%s: %s); %s, then raises it. Ctrl-C stops every rank now; the "
            "rows written so far are kept for the resume.",
            rank,
            self.doing,
            type(error).__name__,
            one_line(error),
            f"rank {other['rank']} was interrupted: it stops at once, as the others do"
            if alone
            else "the other ranks stop after the batch they are at (or where they next meet), "
            "and it stops with them"
            if told
            else "it stops where the other ranks next meet (the listings' check, or the end "
            "of their shards)",
        )
        if alone:
            return
        try:
            # (an error of the exchange itself, the others gone, leaves this rank's own raised)
            with contextlib.suppress(Exception):
                self._meet(self.doing, error)
        except BaseException as interrupted:  # (a Ctrl-C there: it leaves the exchange)
            # Its word that it meets the others there is taken back, or they wait for it.
            self._tell(interrupted, meets=False)
            raise

    def interrupt(self, error: BaseException) -> None:
        """Say in the store (as best it can) that this rank stops with ``error``, which
        its caller raises at once: it goes to no exchange, and the others stop at their
        next batch or exchange instead of waiting there for it (a group the caller keeps
        waits for its timeout). (Said even within an exchange, which it leaves.)"""
        self.ended = True
        self._tell(error, meets=False)

    @property
    def in_store(self) -> bool:
        """Whether the ranks meet in the group's store: there is one, and the run's key in
        it is agreed (:meth:`meet_first`); else over the gloo group."""
        return self.meets_in is not None and self.agreed

    def _meet(self, value: object, failure: Exception | None = None) -> tuple:
        """:func:`_every_rank_said` at this run's next exchange: in the group's store once
        the run's key is agreed, each exchange under a key of its own, where this rank
        leaves (with :meth:`_stop_if_interrupted`'s error) once another says that it was
        interrupted; before that, or without a store, over the gloo group, which cannot
        be left."""
        if not self.in_store:
            return _every_rank_said(value, failure, self.world_size)
        self.exchanges += 1
        key = f"{self.key}/said/{self.exchanges}"

        def gather(obj: object) -> list:
            return gather_in_store(
                self.meets_in, key, self.rank, self.world_size, obj, self._stop_if_interrupted,
                self.alive, self._stop_if_failed_and_ended,
            )  # fmt: skip

        return _every_rank_said(value, failure, self.world_size, gather)

    def _stop_if_interrupted(self) -> None:
        """Where another rank said in the store that it was interrupted (it comes to no
        exchange), raise the error naming it; where torchrun's launcher is gone (the store
        with it), stop as at a Ctrl-C, as its watch does (:mod:`._launcher`)."""
        if self.in_store and launcher_gone():
            raise KeyboardInterrupt
        told = self._told()
        if told is not None and not told["meets"]:
            raise self._failed(told["rank"], told["doing"], told["said"], interrupted=True)

    def _stop_if_failed_and_ended(self, rank: int, pid: int | None) -> None:
        """Where rank ``rank``, whose process (``pid``, on this host) has ended before it
        met this one, or which stopped answering (``pid`` None: its heartbeat stood still),
        had said in the store that it failed (it was killed after, before its exchange),
        raise the error naming its failure, as the exchange would have."""
        told = self._told(rank)
        if told is None:
            return
        then = (
            f"its process (pid {pid}, on this host) ended"
            if pid is not None
            else "it stopped answering (its heartbeat in the group's store stood still for "
            f"{_gathered.SILENCE_S:g} s)"
        )
        raise self._failed(told["rank"], told["doing"], told["said"], then=then)

    def _tell(self, error: BaseException, meets: bool) -> bool:
        """Say in the store under this rank's key that it stops with ``error``, and
        whether it ``meets`` the others at the next exchange, then count it under the
        run's key; whether that was said."""
        if self.store is None or not self.agreed or launcher_gone():
            return False  # (no store to say it: said where the ranks meet)
        said = dict(rank=self.rank, doing=self.doing, said=_said(error), meets=meets)
        # A key of its own: under one key for every rank, a rank failing beside one
        # interrupted could write last, and the others waited at the exchange for the
        # interrupted one, which never came. (Counted once said: a rank that finds the
        # count finds the word.)
        try:  # (a store's set and add have no timeout to wait out: they need no other rank)
            self.store.set(f"{self.key}/{self.rank}", json.dumps(said))
            self.store.add(f"{self.key}/n", 1)
        except Exception:  # (the store gone with its host: told where the ranks meet)
            return False
        return True

    def _told(self, rank: int | None = None) -> dict | None:
        """What another rank (``rank`` alone, where given) said in the store of its failure
        (:meth:`_tell`), or None: the first that was interrupted (it meets no one), else
        the first that failed."""
        # (a store that went with torchrun's launcher: torch logs each failed look there,
        # a stack trace on stderr)
        if self.store is None or not self.agreed or launcher_gone():
            return None
        try:
            # One look after each batch, at the count (check, not get: get waits for a
            # key that is not there); the ranks' words only once one has spoken.
            if not self.store.check([f"{self.key}/n"]):
                return None
            ranks = range(self.world_size) if rank is None else [rank]
            keys = [f"{self.key}/{r}" for r in ranks if r != self.rank]
            said = [json.loads(self.store.get(key)) for key in keys if self.store.check([key])]
        except Exception:  # (its host gone: failures are told where the ranks meet alone)
            self.store = None
            return None
        interrupted = [each for each in said if not each["meets"]]
        return (interrupted or said or [None])[0]

    def _failed(
        self,
        rank: int,
        doing: str,
        said: str,
        others: int = 0,
        interrupted: bool = False,
        then: str = "",
    ) -> StoreError:
        """The error of every other rank where rank ``rank`` failed ``doing`` (with
        ``said``; ``interrupted``: a Ctrl-C, say), and ``others`` more with it; ``then``:
        what became of it after it told its failure, before the ranks met (it was killed)."""
        also = f" (and {others} other {plural(others, 'rank')})" if others else ""
        then = f", then {then} before the ranks met" if then else ""
        why, cure = (
            ("it was interrupted", "")
            if interrupted
            else ("its error says why", "once that is cured, ")
        )
        return StoreError(
            f"Rank {rank}{also} failed {doing} ({said}){then}: {why}. Every rank stops, the rows "
            f"written so far kept: {cure}the same command resumes."
        )


# What a rank does while it checks the shards to be resumed (:attr:`_ShardStep.doing`).
_CHECKING_SHARDS = "to check the shards of {!r} to be resumed"


def _all_ranks_failures(failed: tuple[int, list] | None, step: _ShardStep) -> tuple[int, list]:
    """The failures of every rank of a torchrun group (``failed``: this rank's, None where
    it found the merged store complete): their number, and the first ones
    (``(index, path, reason)``) in source order."""
    gathered = step.exchange(failed)
    if gathered is None:  # ranks run one by one: each knows its own only
        gathered = [failed]
    told = [each for each in gathered if each is not None]
    return sum(n for n, _ in told), sorted(item for _, first in told for item in first)


def _check_same_listing(src: ImageSource, fingerprint: str, step: _ShardStep) -> None:
    """Refuse to start when the ranks of a torchrun group listed the source differently
    (files added, removed or changed while they started): their shards would not merge,
    which the merge finds only after every rank's extraction."""
    listings = step.exchange((len(src), fingerprint))
    if listings is None:  # ranks run one by one (rank= and world_size= given)
        return
    other = next((r for r, listing in enumerate(listings) if listing != listings[0]), None)
    if other is not None:
        (first, _), (theirs, _) = listings[0], listings[other]
        what = (
            f"rank 0 found {first} images, rank {other} {theirs}"
            if first != theirs
            else f"ranks 0 and {other} found other files"
        )
        raise StoreError(
            f"The ranks listed the image source {src.description!r} differently ({what}): "
            "it changed while they started. Run again once it no longer changes."
        )


def _complete_on_every_rank(complete: bool, merged: Path, step: _ShardStep) -> bool:
    """Whether every rank of a torchrun group found the merged store complete (this one:
    ``complete``), so that all reuse it or all extract; a :class:`StoreError` on every rank
    where they found it otherwise. Each rank decided alone: one that found it complete
    returned while the others waited for it at the merge until the group's timeout."""
    found = step.exchange(complete)
    if found is None:  # ranks run one by one: each decides for itself
        return complete
    if all(found) or not any(found):
        return bool(found[0])
    # A store or images read otherwise by one rank than by another changed between their
    # reads (or the ranks see its folder otherwise): neither verdict holds for every rank.
    yes, no = found.index(True), found.index(False)
    raise StoreError(
        f"The ranks read the feature store {os.fspath(merged)!r} differently: rank {yes} "
        f"found it complete, rank {no} not. It, or its images, changed while they read it. "
        "Every rank stops before any work; run again once it no longer changes."
    )


def _merge_on_rank0(
    out: Path, rank: int, world_size: int, overwrite: bool, repair_merged=None, step=None
) -> Path:
    """Rank 0 merges the shards of ``out`` once every rank's is complete, and tells every
    rank its outcome; where ``step`` (:class:`_ShardStep`) meets in the group's store, the
    ranks meet there, and leave once one says it was interrupted (in gloo's barrier and
    gather they waited for it until the group's timeout)."""
    import torch.distributed as dist

    in_store = step is not None and step.in_store
    if step is not None:  # (what an interrupt of this rank tells the others)
        at = "to merge" if rank == 0 else "at the merge of"
        step.doing = f"{at} the shards into {os.fspath(out)!r}"
    if in_store:
        step.exchange(None)  # every shard is complete before rank 0 reads them
    else:
        dist.barrier()
    failure = None
    if rank == 0:
        try:
            _merge_shards_of(out, world_size, overwrite, repair_merged)
        except Exception as error:  # (said to the other ranks, then raised here)
            failure = error
    # Rank 0's outcome, to every rank: a failure there ends the others too, naming it.
    failed = []
    if in_store:
        _, failed = step._meet(None, failure)
    elif dist.is_initialized():  # (ranks run one by one: each knows its own only)
        _, failed = _every_rank_said(None, failure, world_size)
    if failure is not None:
        raise failure
    if failed:
        raise StoreError(
            f"Rank 0 failed to merge the shards into {os.fspath(out)!r} ({failed[0][1]}): its "
            "error says why. Every rank's shard is kept: once that is cured, the same "
            "command merges them."
        )
    return out


def _merge_shards_of(out: Path, world_size: int, overwrite: bool, repair_merged=None) -> None:
    """Rank 0's part of the merge: the shards of ``out`` into it (or its repairs alone)."""
    shards = [shard_path(out, r, world_size) for r in range(world_size)]
    # No rank reads ``out`` any more. A complete store that differs by touched files
    # alone and cannot be written (open elsewhere) is kept as it is, not merged: the
    # merge would replace it with the very rows it holds.
    if repair_merged is not None and repair_merged():
        return
    if repair_merged is not None:
        # The shards hold what the store, its repairs pending, awaits: marked with its
        # new version, a run killed before the merge resumes them and merges them (they
        # went into another version, it made every one anew, every row extracted again).
        # (best effort, unsaid: the merge's own mark says where a shard cannot be marked)
        for shard in shards:
            _mark(shard, _identity(out))
    _merge(shards, out, overwrite, versions_checked=True)  # each rank's, checked
