"""HDF5 feature store: schema, provenance checks, crash-safe resume, locking, loading, merging.

Crash safety rests on one property: after the file is created, a run writes raw data only.
Every dataset written during a run (``features``, ``status``, ``failure_reason``) has a fixed
shape and all its storage allocated at creation (``H5D_ALLOC_TIME_EARLY``), so a write
never changes HDF5 metadata and a process killed mid-write leaves a structurally intact
file. The file itself is built under a temporary name and renamed into place, so it either
exists complete or not at all. Rows are marked done in ``status`` only after their features
are written and flushed; rows not marked done are recomputed on resume.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

FORMAT_VERSION = 1
PENDING, DONE, FAILED = 0, 1, 2
REASON_DTYPE = "S200"
_MERGE_BLOCK = 8192  # shard rows copied at a time, bounding memory
# Attributes that must match for an existing file to be reused.
PROVENANCE_KEYS = (
    "format_version",
    "backbone",
    "weights",
    "preprocessing",
    "dtype",
    "normalize",
    "source_fingerprint",
    "n_rows",
    "n_total_rows",
    "shard_rank",
    "shard_world_size",
)


class ProvenanceError(ValueError):
    """An existing store was made from a different backbone, weights, preprocessing or data."""


class StoreLockedError(RuntimeError):
    """Another process is writing the store."""


class IncompleteStoreError(RuntimeError):
    """The store still has rows that were never extracted."""


def _truncate(reason: str) -> bytes:
    """UTF-8 bytes of ``reason`` cut to the field's size, never inside a character."""
    return reason.encode()[:200].decode("utf-8", "ignore").encode()


def _attr(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def read_attrs(f: h5py.File) -> dict[str, Any]:
    """The store's attributes as Python values (JSON attributes decoded)."""
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
    for key in ("preprocessing", "versions", "class_names"):
        if key in attrs:
            attrs[key] = json.loads(attrs[key])
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}


@contextmanager
def store_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` while writing ``path``.

    ``flock`` is released by the kernel when the holder dies, so a killed run never leaves
    a stale lock behind; the lock file records the holder's pid for the error message.
    """
    lock_path = f"{os.fspath(path)}.lock"
    fh = open(lock_path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise StoreLockedError(
                f"The feature store {os.fspath(path)!r} is being written by another process "
                f"(pid {holder}); wait for it to finish or write to another path."
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


def _early() -> h5py.h5p.PropDCID:
    # Storage allocated at creation: later writes touch raw data only, never metadata.
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    return dcpl


def create_store(
    path: str | os.PathLike,
    *,
    provenance: dict[str, Any],
    record: dict[str, Any],
    dim: int,
    dtype: str,
    labels: np.ndarray,
    indices: np.ndarray,
    ids: Sequence[str],
    class_names: Sequence[str],
) -> None:
    """Create an empty store atomically (written as ``<path>.tmp``, then renamed).

    Parameters
    ----------
    path : path-like
    provenance : dict
        Attributes checked on reuse (``PROVENANCE_KEYS``).
    record : dict
        Attributes only recorded (library versions, source description).
    dim : int
        Feature size d.
    dtype : {"float16", "float32"}
    labels, indices : ndarray of shape (n_rows,)
        Class label and source-item index of each row.
    ids : sequence of str
        Path or id of each row's image.
    class_names : sequence of str
    """
    n = len(labels)
    itemsize = np.dtype(dtype).itemsize
    # About 1 MiB per chunk: large enough for fast streaming, small enough for row reads.
    chunk_rows = int(max(1, min(n, (1 << 20) // (dim * itemsize))))
    tmp = f"{os.fspath(path)}.tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset(
            "features",
            (n, dim),
            dtype,
            chunks=(chunk_rows, dim) if n else None,
            dcpl=_early(),
            fillvalue=0,
        )
        f.create_dataset("status", (n,), np.uint8, dcpl=_early(), fillvalue=PENDING)
        f.create_dataset("failure_reason", (n,), REASON_DTYPE, dcpl=_early())
        f.create_dataset("labels", data=np.asarray(labels, dtype=np.int64))
        f.create_dataset("indices", data=np.asarray(indices, dtype=np.int64))
        f.create_dataset("paths", data=list(ids), dtype=h5py.string_dtype())
        f.create_dataset("class_names", data=list(class_names), dtype=h5py.string_dtype())
        for key, value in (provenance | record).items():
            f.attrs[key] = json.dumps(value) if isinstance(value, dict | list) else value
        f.attrs["class_names"] = json.dumps(list(class_names))
    os.replace(tmp, path)


def check_provenance(path: str | os.PathLike, existing: dict, requested: dict) -> None:
    """Refuse to reuse a store whose provenance differs from the request."""
    diffs = [
        f"  {key}: file has {existing.get(key)!r}, request has {requested.get(key)!r}"
        for key in PROVENANCE_KEYS
        if existing.get(key) != requested.get(key)
    ]
    if diffs:
        raise ProvenanceError(
            f"The feature store {os.fspath(path)!r} was made with a different provenance:\n"
            + "\n".join(diffs)
            + "\nWrite to a new output path, or delete the file to recompute it."
        )


def open_store(path: str | os.PathLike, mode: str = "r") -> h5py.File:
    """Open a store with a clear error when HDF5 refuses (locked or not a store)."""
    try:
        return h5py.File(path, mode)
    except OSError as err:
        if "lock" in str(err).lower():
            raise StoreLockedError(
                f"The feature store {os.fspath(path)!r} is open for writing in another process."
            ) from err
        raise OSError(f"Cannot open the feature store {os.fspath(path)!r}: {err}") from err


def write_rows(
    f: h5py.File, start: int, features: np.ndarray, status: np.ndarray, reasons: Sequence[str]
) -> None:
    """Write rows ``start:start+len(status)``; mark them done only after a flush."""
    stop = start + len(status)
    f["features"][start:stop] = features
    f["failure_reason"][start:stop] = np.array([_truncate(r) for r in reasons], REASON_DTYPE)
    f.flush()  # features reach the file before the rows are marked done
    f["status"][start:stop] = status
    f.flush()


class RowView:
    """Lazy view of selected rows of an HDF5 dataset (the completed rows of a store).

    Supports ``shape``, ``dtype``, ``chunks``, ``len``, integer and slice indexing (read as
    one contiguous HDF5 range) and ``numpy.asarray``; ``dataset`` is the underlying
    ``h5py.Dataset``.
    """

    def __init__(self, dataset: h5py.Dataset, rows: np.ndarray) -> None:
        self.dataset, self.rows = dataset, rows
        self.shape = (len(rows), *dataset.shape[1:])
        self.dtype, self.ndim, self.chunks = dataset.dtype, dataset.ndim, dataset.chunks

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: int | slice | np.ndarray) -> np.ndarray:
        selected = self.rows[key]
        if np.ndim(selected) == 0:
            return self.dataset[int(selected)]
        if len(selected) == 0:
            return np.empty((0, *self.shape[1:]), self.dtype)
        lo, hi = int(selected.min()), int(selected.max()) + 1
        return self.dataset[lo:hi][selected - lo]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


@dataclass
class FeatureStore:
    """What the classifier needs from a store; only completed rows are exposed.

    Attributes
    ----------
    features : h5py.Dataset, RowView or ndarray of shape (n_done, d)
        Lazy by default (an ``h5py.Dataset`` when every row succeeded, else a
        :class:`RowView` skipping failed rows); a NumPy array with ``in_memory=True``.
    labels : ndarray of shape (n_done,)
    class_names : list of str
    paths : list of str
        Image path or id of each returned row.
    indices : ndarray of shape (n_done,)
        Source-item index of each returned row.
    rows : ndarray of shape (n_done,)
        Store row of each returned row.
    failures : list of (str, str)
        ``(path, reason)`` of each image that could not be read.
    metadata : dict
        Provenance and recorded attributes.
    n_pending : int
        Rows never extracted (non-zero only with ``allow_incomplete=True``).
    """

    features: Any
    labels: np.ndarray
    class_names: list[str]
    paths: list[str]
    indices: np.ndarray
    rows: np.ndarray
    failures: list[tuple[str, str]]
    metadata: dict
    n_pending: int = 0
    file: h5py.File | None = field(default=None, repr=False)

    def close(self) -> None:
        """Close the HDF5 file behind a lazy ``features``."""
        if self.file is not None:
            self.file.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_features(
    path: str | os.PathLike, in_memory: bool = False, allow_incomplete: bool = False
) -> FeatureStore:
    """Open a feature store for a classifier.

    Parameters
    ----------
    path : path-like
        An HDF5 store written by :func:`extract_features` or :func:`merge_shards`.
    in_memory : bool, default=False
        Read all features into a NumPy array (and close the file) instead of returning a
        lazy dataset.
    allow_incomplete : bool, default=False
        Return the completed rows of an interrupted store with a warning instead of raising.

    Returns
    -------
    FeatureStore

    Raises
    ------
    IncompleteStoreError
        If rows are still pending and ``allow_incomplete`` is False.

    Examples
    --------
    >>> with load_features("features.h5") as store:  # doctest: +SKIP
    ...     clf.fit(store.features, store.labels)
    """
    f = open_store(path, "r")
    try:
        status = f["status"][:]
        n_pending = int((status == PENDING).sum())
        if n_pending and not allow_incomplete:
            raise IncompleteStoreError(
                f"The feature store {os.fspath(path)!r} has {n_pending} of {len(status)} rows "
                "not extracted yet; run the same extraction command again to finish it, or "
                "pass allow_incomplete=True to load the completed rows."
            )
        if n_pending:
            warnings.warn(
                f"Loading {int((status == DONE).sum())} completed rows of an incomplete store "
                f"({n_pending} rows pending).",
                UserWarning,
                stacklevel=2,
            )
        rows = np.flatnonzero(status == DONE)
        all_paths = f["paths"].asstr()[:]
        failed = np.flatnonzero(status == FAILED)
        reasons = f["failure_reason"][failed]
        store = FeatureStore(
            features=f["features"] if len(rows) == len(status) else RowView(f["features"], rows),
            labels=f["labels"][:][rows],
            class_names=list(f["class_names"].asstr()[:]),
            paths=[str(p) for p in all_paths[rows]],
            indices=f["indices"][:][rows],
            rows=rows,
            failures=[
                (str(all_paths[i]), r.decode(errors="replace"))
                for i, r in zip(failed, reasons, strict=True)
            ],
            metadata=read_attrs(f),
            n_pending=n_pending,
            file=f,
        )
    except BaseException:
        f.close()
        raise
    if in_memory:
        store.features = np.asarray(store.features)
        store.close()
        store.file = None
    return store


def shard_path(out: str | os.PathLike, rank: int, world_size: int) -> Path:
    """``features.h5`` -> ``features.shard-00001-of-00004.h5``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.shard-{rank:05d}-of-{world_size:05d}{out.suffix}")


def merge_shards(shards: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Merge per-rank shard stores into one store in source order.

    Rank ``r`` of ``W`` holds rows ``r, r + W, r + 2W, ...``; the merge checks that every
    rank is present once, that all shards share one provenance and are complete, and
    writes each row to its global position. An existing ``out`` is replaced only if its
    provenance matches.

    Parameters
    ----------
    shards : sequence of path-like
        Every shard of one run, any order.
    out : path-like
        The merged store (written atomically, under the store lock).

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If ranks are missing or repeated; ``ProvenanceError`` if the shards (or an existing
        ``out``) disagree; ``IncompleteStoreError`` if a shard has pending rows.
    """
    files = {}
    try:
        for path in shards:
            f = open_store(path, "r")
            rank = read_attrs(f)["shard_rank"]
            if rank in files:
                f.close()
                raise ValueError(f"Two shards given to merge_shards have rank {rank}.")
            files[rank] = f
            _check_shard(path, f, read_attrs(files[min(files)]), len(shards))
        if sorted(files) != list(range(len(shards))):
            raise ValueError(
                f"merge_shards needs every rank of one run exactly once; got ranks "
                f"{sorted(files)} from {len(shards)} shards."
            )
        with store_lock(out):
            _write_merged(files, out)
    finally:
        for f in files.values():
            f.close()
    return Path(out)


def _check_shard(path: str | os.PathLike, f: h5py.File, first: dict, world: int) -> None:
    attrs = read_attrs(f)
    if attrs["shard_world_size"] != world:
        raise ValueError(
            f"The shard {os.fspath(path)!r} is one of {attrs['shard_world_size']} shards, "
            f"but {world} were given to merge_shards."
        )
    check_provenance(path, attrs, first | {k: attrs[k] for k in ("shard_rank", "n_rows")})
    pending = int((f["status"][:] == PENDING).sum())
    if pending:
        raise IncompleteStoreError(
            f"The shard {os.fspath(path)!r} has {pending} rows not extracted; finish its run "
            "(the same command again) before merging."
        )


def _write_merged(files: dict[int, h5py.File], out: str | os.PathLike) -> None:
    world, first = len(files), read_attrs(files[0])
    n = first["n_total_rows"]

    def gather(name: str) -> np.ndarray:
        values = np.empty((n, *files[0][name].shape[1:]), files[0][name].dtype)
        for rank, f in files.items():
            values[rank::world] = f[name][:]  # rank r holds rows r, r + W, r + 2W, ...
        return values

    provenance = {k: first[k] for k in PROVENANCE_KEYS}
    provenance |= dict(n_rows=n, shard_rank=0, shard_world_size=1)
    record = {k: v for k, v in first.items() if k not in PROVENANCE_KEYS and k != "class_names"}
    if os.path.exists(out):  # replacing a store is fine only if it holds the same thing
        with open_store(out, "r") as f:
            check_provenance(out, read_attrs(f), provenance)
    tmp = f"{os.fspath(out)}.merging"
    create_store(
        tmp,
        provenance=provenance,
        record=record | {"merged_from": world},
        dim=files[0]["features"].shape[1],
        dtype=first["dtype"],
        labels=gather("labels"),
        indices=gather("indices"),
        ids=[p.decode() for p in gather("paths")],
        class_names=list(files[0]["class_names"].asstr()[:]),
    )
    with h5py.File(tmp, "r+") as merged:
        for rank, f in files.items():
            m = len(f["status"])
            for lo in range(0, m, _MERGE_BLOCK):
                hi = min(m, lo + _MERGE_BLOCK)
                # Shard rows lo:hi are global rows rank + W*lo, ..., rank + W*(hi - 1).
                where = slice(rank + world * lo, rank + world * (hi - 1) + 1, world)
                for name in ("features", "failure_reason", "status"):
                    merged[name][where] = f[name][lo:hi]
    os.replace(tmp, out)
