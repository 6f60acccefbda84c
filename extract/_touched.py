"""Files touched since a store was made: their modification time changed, their size not.
Such a file is the store's where its bytes still hash as the row recorded them
(``content_sha256``), as ``rsync --checksum`` or ``git update-index --refresh`` decide; only
those files are read, never the whole collection."""

from __future__ import annotations

import contextlib
import contextvars
import pickle
from collections.abc import Callable, Iterator

import h5py
import numpy as np

from ._decoding import NOT_A_FILE, read_file, sha256_hex
from ._images import ImageSource
from ._schema import DONE, PENDING

# Items read at a time from a container (a tar shard, a Parquet row group's rows): its
# touched rows are hashed with bounded memory.
_BLOCK = 64

# Rows found in this run to hold their files' bytes, as (item, size, mtime_ns, digest) of
# the run's listing: a run checks the store, or under torchrun the merged store, the shards
# and at the merge the merged store again, and an explained refusal checks once more; each
# file is read once. (What is recorded is the listing's identity: a file changed since is
# read again by the next run.)
_verified: contextvars.ContextVar[set | None] = contextvars.ContextVar("verified", default=None)
# Under torchrun, rows found by another rank not to hold their files' bytes, by the same
# keys: ``{key: the error that stopped its read, or None}`` (not read again here, so that
# every rank names the same file, and for the same reason).
_other: contextvars.ContextVar[dict | None] = contextvars.ContextVar("other", default=None)


@contextlib.contextmanager
def hashed_once() -> Iterator[None]:
    """Within it (one run), a row's file found to hold its bytes is not read again."""
    token, other = _verified.set(set()), _other.set({})
    try:
        yield
    finally:
        _verified.reset(token)
        _other.reset(other)


def touched_rows(f, source: ImageSource, rows: np.ndarray, retry_failed: bool) -> np.ndarray:
    """The positions in ``rows`` of the store ``f``'s rows whose files a check of the store
    against the source reads again: touched since (their modification time changed, their
    size and row not), extracted and with a digest of their bytes, before the row of any
    other difference (as the check reads them; with ``retry_failed`` the failed ones are
    extracted again instead). None where the store's rows are not the source's ``rows``."""
    none = np.zeros(0, np.int64)
    if "file_size" not in f or len(f["paths"]) != len(rows):
        return none
    sizes, mtimes = source.file_stats()
    same_size = f["file_size"][:] == sizes[rows]
    moved = ~same_size | (f["file_mtime_ns"][:] != mtimes[rows])
    if not (moved & same_size).any():  # (the rows' names not read: nothing touched)
        return none
    ids = np.array([source.ids[i] for i in rows], dtype=object)
    same_row = (
        (f["paths"].asstr()[:] == ids)
        & (f["labels"][:] == source.labels[rows])
        & (f["indices"][:] == source.source_index[rows])
    )
    status = f["status"][:]
    differs = ~same_row | moved
    if retry_failed:  # (a failed file changed since is no difference: it is retried)
        differs &= ~(moved & same_row & (status != DONE))
    touched = differs & moved & same_row & same_size & (sizes[rows] != NOT_A_FILE)
    other = differs & ~touched
    before = int(np.argmax(other)) if other.any() else len(rows)
    check = np.flatnonzero(touched[:before] & (status[:before] != PENDING))
    if not len(check):
        return none
    # A row without one (its file unreadable then) is a difference, found unread.
    without = f["content_sha256"][:][check] == b""
    return check[: int(np.argmax(without))] if without.any() else check


def hash_share(
    f, source: ImageSource, rows: np.ndarray, check: np.ndarray, rank: int, world_size: int
) -> tuple[list, tuple | None]:
    """Rank ``rank``'s share of the store ``f``'s rows ``check`` (:func:`touched_rows`)
    read and hashed, as :func:`first_other_bytes` does: every ``world_size``-th row, or of
    tar shards and Parquet files the rows of every ``world_size``-th touched container
    (each read by one rank). The keys of those found to hold their bytes, and the first
    found not to as ``(key, error)`` (None where none), for :func:`take_verdicts` on every
    rank."""
    if source.archive is None:
        units = np.arange(len(check))
    else:  # (each touched container by its number among the touched ones)
        units = np.unique(source.archive.file[rows[check]], return_inverse=True)[1]
    mine = check[units % world_size == rank]
    if not len(mine):
        return [], None
    keys = _keys(f, source, rows, mine)
    found = first_other_bytes(f, source, rows, mine)
    if found is None:
        return keys, None
    k, error = found
    at = int(np.searchsorted(mine, k))
    return keys[:at], (keys[at], _as_told(error))


class ToldError(OSError):
    """An error another rank met reading a file, which does not cross to this one as it
    is: its message, and its type's name as ``told_type``."""


def _as_told(error: Exception | None) -> Exception | None:
    """``error`` as every rank can take it: itself, its type too, where it comes back from
    a pickle (one whose ``__init__`` takes other arguments pickles, but fails to unpickle
    on every rank); otherwise a :class:`ToldError` of its type's name and message."""
    with contextlib.suppress(Exception):
        pickle.loads(pickle.dumps(error))
        return error
    told = ToldError(str(error))
    told.told_type = type(error).__name__
    return told


def share_hashing(
    stores: list[tuple[str, np.ndarray]], source: ImageSource, retry_failed: bool, rank: int,
    world_size: int, exchange: Callable[[object], list | None],
) -> None:  # fmt: skip
    """Under torchrun, the files touched since the stores of the run were made (the merged
    store, or the shards to resume: ``(path, rows)``) read and hashed once in all: each rank
    its share (:func:`hash_share`), told to every rank through ``exchange`` (every rank's
    value, in rank order), which each then takes (:func:`take_verdicts`), where each rank
    read every one of them. A store that cannot be read is left to the checks that follow."""
    said = []
    for path, rows in stores:
        try:
            # (without HDF5's lock, as the checks that follow read the shards)
            with h5py.File(path, "r", locking=False) as f:
                check = touched_rows(f, source, rows, retry_failed)
                said.append(hash_share(f, source, rows, check, rank, world_size))
        except Exception:  # (not a store, or none: those checks say so)
            continue
    told = exchange(said)
    if told is not None:  # (ranks run one by one: each read what it checks)
        take_verdicts([each for theirs in told for each in theirs])


def take_verdicts(said: list[tuple[list, tuple | None]]) -> None:
    """Take every rank's :func:`hash_share`: its rows found to hold their bytes are not read
    again in this run, nor is its row found not to, which is named with its error."""
    verified, other = _verified.get(), _other.get()
    if verified is None or other is None:  # (outside a run: nothing is kept)
        return
    for keys, found in said:
        verified.update(keys)
        if found is not None:
            other[found[0]] = found[1]


def _keys(f, source: ImageSource, rows: np.ndarray, check: np.ndarray) -> list[tuple]:
    """The keys of :data:`_verified` of the store ``f``'s rows ``check``: ``(item, size,
    mtime_ns, digest)``, the file's as listed now and the digest the row records."""
    digests = f["content_sha256"][:][check]  # (n_check,) S64
    sizes, mtimes = source.file_stats()
    return [
        (int(item), int(sizes[item]), int(mtimes[item]), bytes(digest))
        for item, digest in zip(rows[check], digests, strict=True)
    ]


def first_other_bytes(
    f, source: ImageSource, rows: np.ndarray, check: np.ndarray
) -> tuple[int, Exception | None] | None:
    """The first of the store ``f``'s rows ``check`` (positions in ``rows``, the source's
    items of the store, increasing) whose image bytes, read now, are not those its
    ``content_sha256`` records (one that recorded none, or cannot be read now, is not):
    its position in ``rows``, and the error that stopped its read (None where its bytes
    were read, or where it recorded none: not read, nothing to compare them with); None
    where every one is the same.

    Rows of one container are read together, a block at a time; a row's file or container
    is checked to be the one listed now (``source.file_stats()``).
    """
    if not len(check):
        return None
    keys = _keys(f, source, rows, check)
    digests = np.array([key[3] for key in keys], dtype="S64")
    verified = _verified.get()
    if verified:
        todo = [j for j, key in enumerate(keys) if key not in verified]
        check, digests, keys = check[todo], digests[todo], [keys[j] for j in todo]
    # Rows read up to the first that another rank found not to hold its bytes: that one is
    # named as it found it, unread here.
    other = _other.get() or {}
    known = next((j for j, key in enumerate(keys) if key in other), None)
    if known is not None:
        told = int(check[known]), other[keys[known]]
        check, digests, keys = check[:known], digests[:known], keys[:known]
    found = _first_other_read(source, rows, check, digests, keys, verified)
    return told if found is None and known is not None else found


def _first_other_read(source, rows, check, digests, keys, verified) -> tuple | None:
    """:func:`first_other_bytes` of the rows ``check`` read now (``digests`` and ``keys``
    theirs); each found to hold its bytes is added to ``verified`` (where not None)."""
    items = rows[check]
    verified = set() if verified is None else verified
    if source.archive is None:
        for k, item, digest, key in zip(check, items, digests, keys, strict=True):
            if not digest:  # (nothing to compare its bytes with: not read)
                return int(k), None
            try:
                data = read_file(source.path(int(item)), key[1:3])
            except OSError as error:  # (FileChangedError too: it changed since it was
                # listed, or as it was hashed: refused as a file of other bytes is)
                return int(k), error
            if not _holds(data, digest):
                return int(k), None
            verified.add(key)
        return None
    state: dict = {}  # the reader's cursor, kept from one block to the next
    for lo in range(0, len(check), _BLOCK):
        block = items[lo : lo + _BLOCK]
        read = source.archive.read(source.root, block.tolist(), state)
        for j, data in enumerate(read):
            digest = digests[lo + j]
            if isinstance(data, Exception) and digest:
                return int(check[lo + j]), data
            if not _holds(data, digest):
                return int(check[lo + j]), None
            verified.add(keys[lo + j])
    return None


def _holds(data: bytes, digest: bytes) -> bool:
    """Whether ``data`` are the bytes whose hex sha256 a row recorded (``digest``, S64;
    empty where it recorded none)."""
    return bool(digest) and sha256_hex(data).encode() == digest
