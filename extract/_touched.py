"""Files touched since a store was made: their modification time changed, their size not.
Such a file is the store's where its bytes still hash as the row recorded them
(``content_sha256``), as ``rsync --checksum`` or ``git update-index --refresh`` decide; only
those files are read, never the whole collection."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import pickle
from collections.abc import Callable, Iterator

import h5py
import numpy as np

from ._decoding import NOT_A_FILE, read_file, sha256_hex
from ._images import ImageSource
from ._schema import DONE, PENDING, read_attrs

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


def compare_rows(f, source: ImageSource, rows: np.ndarray, retry_failed: bool) -> tuple:
    """The store ``f``'s first ``n`` rows against the source's ``rows`` (``n`` the fewer of
    the two): ``pairs``, each of the rows' ``"id"``, ``"label"``, ``"size"``, ``"mtime"``
    and ``"index"`` as ``(stored, now)``; ``differs``, (n,) bool, the rows of any
    difference (with ``retry_failed``, not a failed row whose file alone changed: the
    retry extracts it again); ``touched``, those that differ by their file's modification
    time alone (touched since, its size and row kept); ``before``, the first row of any
    other difference (``n`` where none); and ``check``, the touched rows before it that were
    extracted, whose files a check reads again (:func:`first_other_bytes`). The rows of a
    store of other rows than ``rows`` are checked only up to their difference in number."""
    stored_ids = f["paths"].asstr()[:]
    n = min(len(stored_ids), len(rows))
    head = rows[:n]
    sizes, mtimes = source.file_stats()
    ids = np.array([source.ids[i] for i in head], dtype=object)
    pairs = {
        "id": (stored_ids[:n], ids),
        "label": (f["labels"][:n], source.labels[head]),
        "size": (f["file_size"][:n], sizes[head]),
        "mtime": (f["file_mtime_ns"][:n], mtimes[head]),
        "index": (f["indices"][:n], source.source_index[head]),
    }
    each = {key: np.asarray(old != new, dtype=bool) for key, (old, new) in pairs.items()}
    file_only = (each["size"] | each["mtime"]) & ~(each["id"] | each["label"] | each["index"])
    differs = np.logical_or.reduce(list(each.values()))
    status = f["status"][:n]
    if retry_failed:  # a failed image replaced since: the retry extracts it again
        # (So is one not extracted yet: a retry killed while writing a batch leaves it
        # pending. No row of either holds features of the file as it was.)
        differs &= ~(file_only & (status != DONE))
    same_size = ~each["size"] & (sizes[head] != NOT_A_FILE)
    touched = differs & file_only & same_size
    other = differs & ~touched
    before = int(np.argmax(other)) if other.any() else n
    check = np.flatnonzero(touched[:before] & (status[:before] != PENDING))
    return pairs, differs, touched, before, check


def touched_rows(f, source: ImageSource, rows: np.ndarray, retry_failed: bool) -> np.ndarray:
    """The positions in ``rows`` of the store ``f``'s rows whose files a check of the store
    against the source reads again (``check`` of :func:`compare_rows`, as the check finds
    them), up to the first without a digest of its bytes; none (an empty array) where the
    store's rows are not the source's ``rows``, or none was touched."""
    return _touched_and_digests(f, source, rows, retry_failed)[0]


def _touched_and_digests(
    f, source: ImageSource, rows: np.ndarray, retry_failed: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`touched_rows`, and the store's ``content_sha256`` column (empty where no row
    is to be read): read once for all the hashing of the store under torchrun needs
    (:func:`share_hashing`), as it is large (82 MB at 1.28 M rows)."""
    none = np.zeros(0, np.int64), np.zeros(0, "S64")
    if "file_size" not in f or len(f["paths"]) != len(rows):
        return none
    sizes, mtimes = source.file_stats()
    same_size = f["file_size"][:] == sizes[rows]
    if not (same_size & (f["file_mtime_ns"][:] != mtimes[rows])).any():
        return none  # (the rows' names not read: nothing touched)
    check = compare_rows(f, source, rows, retry_failed)[-1]
    if not len(check):
        return none
    digests = f["content_sha256"][:]  # (n_rows,) S64
    # A row without one (its file unreadable then) is a difference, found unread.
    without = digests[check] == b""
    return (check[: int(np.argmax(without))] if without.any() else check), digests


def hash_share(
    digests: np.ndarray, source: ImageSource, rows: np.ndarray, check: np.ndarray, rank: int,
    world_size: int,
) -> tuple[int, str, tuple | None]:  # fmt: skip
    """Rank ``rank``'s share of a store's rows ``check`` (:func:`touched_rows`; ``digests``
    its ``content_sha256`` column) read and hashed, as :func:`first_other_bytes` does: every
    ``world_size``-th row, or of tar shards and Parquet files the rows of every
    ``world_size``-th touched container (each read by one rank; :func:`_shares`). How many
    of them, in order, were found to hold their bytes, the sha256 of their keys
    (:func:`_checksum`), and the first found not to as ``(key, error)`` (None where none):
    what every rank takes (:func:`take_verdicts`), of a size that does not grow with the
    number of files."""
    mine = check[_shares(source, rows, check, world_size) == rank]
    columns = _key_columns(digests, source, rows, mine)
    found = _first_other_of(source, rows, mine, columns)
    if found is None:
        return len(mine), _checksum(*columns), None
    n = int(np.searchsorted(mine, found[0]))
    told = _keys_of(*(c[n : n + 1] for c in columns))[0], _as_told(found[1])
    return n, _checksum(*(c[:n] for c in columns)), told


def _shares(
    source: ImageSource, rows: np.ndarray, check: np.ndarray, world_size: int
) -> np.ndarray:
    """The rank that reads each of the rows ``check`` (:func:`hash_share`)."""
    if source.archive is None:
        units = np.arange(len(check))
    else:  # (each touched container by its number among the touched ones)
        units = np.unique(source.archive.file[rows[check]], return_inverse=True)[1]
    return units.reshape(-1) % world_size


def _checksum(items, sizes, mtimes, digests) -> str:
    """The sha256 of rows' keys (:func:`_key_columns`), in order: equal on two ranks where
    they read the same rows of the store and list their files alike."""
    h = hashlib.sha256()
    for column in (items, sizes, mtimes):
        h.update(np.ascontiguousarray(column, "<i8").tobytes())
    h.update(np.ascontiguousarray(digests, "S64").tobytes())
    return h.hexdigest()


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
    stores: list[tuple[str, np.ndarray]], source: ImageSource,
    retrying: Callable[[dict], bool], rank: int, world_size: int,
    exchange: Callable[[object], list | None],
) -> None:  # fmt: skip
    """Under torchrun, the files touched since the stores of the run were made (the merged
    store, or the shards to resume: ``(path, rows)``) read and hashed once in all: each rank
    its share (:func:`hash_share`), told to every rank through ``exchange`` (every rank's
    value, in rank order), which each then takes (:func:`take_verdicts`), where each rank
    read every one of them. ``retrying(attrs)``: whether the checks of a store (its
    attributes) take its failed images changed since as retried (``retry_failed`` of
    :func:`touched_rows`), not to be read. A store that cannot be read is left to the
    checks that follow."""
    said, checks = [], []
    for path, rows in stores:
        try:
            # (without HDF5's lock, as the checks that follow read the shards)
            with h5py.File(path, "r", locking=False) as f:
                retry_failed = retrying(read_attrs(f))
                check, digests = _touched_and_digests(f, source, rows, retry_failed)
            said.append(hash_share(digests, source, rows, check, rank, world_size))
            # every rank's share, rebuilt here to take its verdicts
            checks.append((check, _key_columns(digests, source, rows, check)))
        except Exception:  # (not a store, or none: those checks say so)
            said.append(None)
            checks.append(None)
    told = exchange(said)
    if told is None:  # (ranks run one by one: each read what it checks)
        return
    for (_, rows), mine, theirs in zip(stores, checks, zip(*told, strict=True), strict=True):
        if mine is not None:
            take_verdicts(source, rows, *mine, world_size, list(theirs))


def take_verdicts(
    source: ImageSource, rows: np.ndarray, check: np.ndarray, columns: tuple, world_size: int,
    said: list[tuple[int, str, tuple | None] | None],
) -> None:  # fmt: skip
    """Take every rank's :func:`hash_share` (``said``, in rank order; None for a rank that
    could not read the store) of a store's rows ``check`` (:func:`touched_rows` here, their
    keys' ``columns`` as :func:`_key_columns` gives them): each rank's share is rebuilt
    from them, and its rows found to hold their bytes are not read again in this run where
    the checksum of their keys is the one it told (otherwise, the store or its files read
    otherwise there, they are read here); nor is its row found not to, which is named with
    its error."""
    verified, other = _verified.get(), _other.get()
    if verified is None or other is None:  # (outside a run: nothing is kept)
        return
    shares = _shares(source, rows, check, world_size)
    for rank, told in enumerate(said):
        if told is None:
            continue
        n, checksum, found = told
        theirs = [column[shares == rank][:n] for column in columns]
        if len(theirs[0]) == n and _checksum(*theirs) == checksum:
            verified.update(_keys_of(*theirs))
        if found is not None:
            other[found[0]] = found[1]


def _key_columns(
    digests: np.ndarray, source: ImageSource, rows: np.ndarray, check: np.ndarray
) -> tuple:
    """The keys of :data:`_verified` of a store's rows ``check`` (``digests`` its
    ``content_sha256`` column) as columns: items, their files' sizes and modification
    times as listed now (int64), and the digests the rows record (S64)."""
    sizes, mtimes = source.file_stats()
    items = rows[check]
    return items, sizes[items], mtimes[items], digests[check]  # (n_check,) each


def _keys_of(items, sizes, mtimes, digests) -> list[tuple]:
    """The keys of :data:`_verified` of :func:`_key_columns`'s columns."""
    return list(
        zip(items.tolist(), sizes.tolist(), mtimes.tolist(), map(bytes, digests), strict=True)
    )


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
    columns = _key_columns(f["content_sha256"][:], source, rows, check)
    return _first_other_of(source, rows, check, columns)


def _first_other_of(
    source: ImageSource, rows: np.ndarray, check: np.ndarray, columns: tuple
) -> tuple[int, Exception | None] | None:
    """:func:`first_other_bytes` of the rows ``check``, their keys' ``columns``
    (:func:`_key_columns`) given: ``(item, size, mtime_ns, digest)`` of each, the file's as
    listed now and the digest the row records."""
    if not len(check):
        return None
    keys, digests = _keys_of(*columns), columns[3]
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
