"""Files touched since a store was made: their modification time changed, their size not.
Such a file is the store's where its bytes still hash as the row recorded them
(``content_sha256``), as ``rsync --checksum`` or ``git update-index --refresh`` decide; only
those files are read, never the whole collection."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np

from ._decoding import read_file, sha256_hex
from ._images import ImageSource

# Items read at a time from a container (a tar shard, a Parquet row group's rows): its
# touched rows are hashed with bounded memory.
_BLOCK = 64

# Rows found in this run to hold their files' bytes, as (item, size, mtime_ns, digest) of
# the run's listing: a run checks the store, or under torchrun the merged store, the shards
# and at the merge the merged store again, and an explained refusal checks once more; each
# file is read once. (What is recorded is the listing's identity: a file changed since is
# read again by the next run.)
_verified: contextvars.ContextVar[set | None] = contextvars.ContextVar("verified", default=None)


@contextlib.contextmanager
def hashed_once() -> Iterator[None]:
    """Within it (one run), a row's file found to hold its bytes is not read again."""
    token = _verified.set(set())
    try:
        yield
    finally:
        _verified.reset(token)


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
    digests = f["content_sha256"][:][check]  # (n_check,) S64
    sizes, mtimes = source.file_stats()
    verified = _verified.get()
    keys = [
        (int(item), int(sizes[item]), int(mtimes[item]), bytes(digest))
        for item, digest in zip(rows[check], digests, strict=True)
    ]
    if verified:
        todo = [j for j, key in enumerate(keys) if key not in verified]
        check, digests, keys = check[todo], digests[todo], [keys[j] for j in todo]
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
