"""Items stored inside container files: shard patterns, the container list, reading by block.

A WebDataset tar shard or a Parquet / Arrow file holds many items. Opening such a source
lists its containers (``expand_pattern``) and indexes them once, so that every item becomes
a row of an ordinary :class:`~extract._images.ImageSource`, read by position: the runner's
fixed blocks, resumption, rank division and per-row hashes then work as for image folders.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import BinaryIO, ClassVar

import numpy as np

from ._decoding import check_listed
from ._images import ImageSource
from ._paths import expand_home

_GLOB_CHARS = frozenset("*?[")
_REMOTE = ("http://", "https://", "s3://", "gs://", "hf://", "pipe:", "gopen:")
_EXAMPLES = {
    "webdataset": "webdataset:shards/{00000..00127}.tar",
    "parquet": "parquet:data/train-*.parquet",
}


def expand_pattern(pattern: str, kind: str) -> list[str]:
    """The files a shard pattern names, in the pattern's order.

    Braces expand as WebDataset expands them (``shards/{00000..00127}.tar``, ``a::b`` for
    several patterns, ``${VAR}`` from ``WDS_VAR``), and every file named must exist; a part
    with ``*``, ``?`` or ``[`` is a local glob, expanded in sorted order.

    Raises
    ------
    ValueError
        If the pattern is empty, names a remote URL, matches nothing or names a file twice.
    FileNotFoundError
        If a file named by the braces does not exist.
    """
    from webdataset.shardlists import expand_urls

    if not pattern.strip():
        raise ValueError(f"The {kind} source has an empty pattern; give e.g. {_EXAMPLES[kind]}.")
    paths: list[str] = []
    for part in expand_urls(pattern):
        part = expand_home(part)
        if part.startswith(_REMOTE):
            raise ValueError(
                f"The {kind} source {part!r} is not a local file; download the shards "
                "first (e.g. with `hf download` or `aws s3 sync`) and give their local path."
            )
        if _GLOB_CHARS & set(part):
            matched = sorted(p for p in glob.glob(part) if os.path.isfile(p))
            if not matched:
                raise ValueError(f"The {kind} pattern {part!r} matches no file.")
            paths += matched
        elif os.path.isfile(part):
            paths.append(part)
        else:
            raise FileNotFoundError(
                f"The {kind} shard {part!r} (from the pattern {pattern!r}) does not exist."
            )
    resolved = [os.path.realpath(p) for p in paths]
    if len(set(resolved)) != len(resolved):
        twice = next(p for k, p in enumerate(resolved) if p in resolved[:k])
        raise ValueError(f"The {kind} pattern {pattern!r} names {twice!r} twice.")
    return [os.path.abspath(p) for p in paths]


def container_root(paths: list[str]) -> str:
    """The deepest folder holding every container file."""
    return os.path.commonpath([os.path.dirname(p) for p in paths])


def stat_containers(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Size and ``st_mtime_ns`` of each container file."""
    stats = [os.stat(p) for p in paths]
    sizes = np.array([st.st_size for st in stats], np.int64)
    return sizes, np.array([st.st_mtime_ns for st in stats], np.int64)


@contextmanager
def open_listed(path: str, listed: tuple[int, int]) -> Iterator[BinaryIO]:
    """Open a container file, refused unless it is the one listed as ``(size, mtime_ns)``,
    and once read unless it still is: rewritten in place as its items were read, they
    hold bytes of either version."""
    with open(path, "rb") as fh:
        check_listed(path, os.fstat(fh.fileno()), listed, container=True)
        yield fh
        check_listed(path, os.fstat(fh.fileno()), listed, container=True)


@dataclass(frozen=True)
class Archive:
    """Where each item of a source lies inside its container files.

    Attributes
    ----------
    paths : tuple of str
        The container files, relative to the source root, in source order.
    sizes, mtimes : ndarray of shape (n_files,), dtype int64
        Size and ``st_mtime_ns`` of each container when the source was opened.
    file : ndarray of shape (n_items,), dtype int64
        The container of each item.
    unit : ndarray of shape (n_items,), dtype int64
        The unit of work of each item (a tar shard, a Parquet row group): ranks divide
        the units between them, so that each reads whole containers or row groups.
    """

    paths: tuple[str, ...]
    sizes: np.ndarray
    mtimes: np.ndarray
    file: np.ndarray
    unit: np.ndarray

    per_item: ClassVar[tuple[str, ...]] = ("file", "unit")

    def take(self, keep: np.ndarray) -> Archive:
        """The archive of items ``keep`` (see ``ImageSource.subset``)."""
        return replace(self, **{name: getattr(self, name)[keep] for name in self.per_item})

    def local_id(self, i: int, item_id: str) -> str:
        """Item ``i`` within its container, for messages."""
        return item_id

    def read(self, root: str, indices: list[int], state: dict) -> list[bytearray | Exception]:
        """The bytes of items ``indices`` (or the error that prevented reading each).

        Each container is opened once and checked to be the file listed; ``state`` is a
        per-process cache the reader may keep between calls.
        """
        out: list[bytearray | Exception | None] = [None] * len(indices)
        files = self.file[np.asarray(indices, dtype=np.int64)]
        for f in dict.fromkeys(files.tolist()):  # containers in order of first use
            ks = np.flatnonzero(files == f)
            path = os.path.join(root, self.paths[f])
            try:
                items = [indices[k] for k in ks]
                for k, data in zip(ks, self.read_file(path, f, items, state), strict=True):
                    out[k] = data
            except Exception as err:  # the container is unreadable: each item records why
                for k in ks:
                    out[k] = err
        return out

    def read_file(
        self, path: str, f: int, items: list[int], state: dict
    ) -> list[bytearray | Exception]:
        """The bytes of ``items``, all in container ``f`` at ``path``."""
        raise NotImplementedError


def archive_source(
    archive: Archive,
    *,
    ids: list[str],
    labels: np.ndarray,
    class_names: list[str],
    root: str,
    description: str,
    identities: list[str],
    options: dict[str, str],
) -> ImageSource:
    """The image source of an indexed archive, one row per item in archive order.

    Each row's ``file_size`` / ``file_mtime_ns`` are its container's; ``identities`` (one
    ``sha256:<hex>`` per container) become the source's ``files``.
    """
    return ImageSource(
        ids=ids,
        labels=labels,
        class_names=class_names,
        root=root,
        description=description,
        source_index=np.arange(len(ids), dtype=np.int64),
        file_size=archive.sizes[archive.file],
        file_mtime_ns=archive.mtimes[archive.file],
        files=dict(zip(archive.paths, identities, strict=True)),
        archive=archive,
        options=options,
    )
