"""HDF5 feature store: schema, provenance checks, crash-safe resume, locking, loading, merging.

Crash safety rests on one property: after the file is created, a run writes raw data only.
Every dataset written during a run (``features``, ``status``, ``failure_reason``,
``content_sha256``) has a fixed shape and all its storage allocated at creation
(``H5D_ALLOC_TIME_EARLY``), so a write never changes HDF5 metadata and a process killed
mid-write leaves a structurally intact file. The file itself is built under a temporary name
and renamed into place, so it either exists complete or not at all. Rows are marked done in
``status`` only after their features are written and flushed; rows not marked done are
recomputed on resume.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import itertools
import json
import logging
import os
import re
import shutil
import socket
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

logger = logging.getLogger(__name__)
# 2: per-row file identity (file_size, file_mtime_ns, content_sha256) and source_root.
FORMAT_VERSION = 2
PENDING, DONE, FAILED = 0, 1, 2
REASON_DTYPE = "S200"
DIGEST_DTYPE = "S64"  # hexadecimal sha256
_MERGE_BLOCK = 8192  # shard rows copied at a time, bounding memory
_REQUIRED = ("features", "labels", "class_names")  # what a classifier needs from a store
# Every dataset create_store writes.
STORE_DATASETS = (
    "features", "status", "failure_reason", "content_sha256", "labels", "indices", "paths",
    "class_names", "file_size", "file_mtime_ns",
)  # fmt: skip
# Attributes that must match for an existing file to be reused.
PROVENANCE_KEYS = (
    "format_version",
    "backbone",
    "weights",
    "preprocessing",
    "compute",  # the backbone's precision: "float32", or "bfloat16 autocast" on a GPU
    "dtype",
    "normalize",
    "source_root",
    "source_fingerprint",
    "n_rows",
    "n_total_rows",
    "shard_rank",
    "shard_world_size",
    "source_options",  # WebDataset / Parquet sources only: the image and label keys
)
# Stores written before the precision was recorded computed in float32 (no CUDA run had
# written one); so did shards compared with each other.
PROVENANCE_DEFAULTS = {"compute": "float32"}
_REBUILD = "pass --force (overwrite=True) to delete it and recompute it"


# On the shards of a forced run under torchrun: the size and modification time of the
# merged store they are to replace (a rerun without --force resumes them by it).
REPLACES = "replaces_store"


class StoreError(ValueError):
    """A feature store cannot be read, written or reused as requested.

    The base class of every error of the store: catch it to report any of them.
    """


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The feature store file does not exist."""


class NotAStoreError(StoreError):
    """The file is empty, not HDF5, or an HDF5 file without a store's datasets."""


class ProvenanceError(StoreError):
    """An existing store was made from other images, backbone, weights or settings."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process is writing the store."""


class IncompleteStoreError(StoreError, RuntimeError):
    """The store still has rows that were never extracted."""


def _truncate(reason: str) -> bytes:
    """UTF-8 bytes of ``reason`` cut to the field's size, never inside a character."""
    return reason.encode()[:200].decode("utf-8", "ignore").encode()


def read_attrs(f: h5py.File) -> dict[str, Any]:
    """The store's attributes as Python values (JSON attributes decoded)."""
    # Plain Python values: an attribute that another tool wrote as an array is a list
    # (it compares, and goes into JSON reports, as one).
    attrs = {k: _plain(v) for k, v in f.attrs.items()}
    for key in ("preprocessing", "versions", "class_names", "source_files", "source_options"):
        if key in attrs:
            attrs[key] = json.loads(attrs[key])
    return attrs


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):  # np.bytes_ too, before it is taken for a NumPy scalar
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, list):  # nested lists of any depth, their bytes decoded
        return [_plain(v) for v in value]
    return value


# Descriptors of the lock files this process holds (see _release_locks_in_child).
_HELD_LOCKS: set[int] = set()


def _release_locks_in_child() -> None:
    # A flock lock belongs to the open file description, which a forked child (a DataLoader
    # worker) shares: the lock would outlive a killed writer for as long as the child lives.
    # Pointing the child's copy of the descriptor at /dev/null keeps the lock the writer's own.
    if not _HELD_LOCKS:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for fd in _HELD_LOCKS:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_release_locks_in_child)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def _lock_record() -> str:
    """What a writer records in its lock file: its pid and host."""
    return f"{os.getpid()} {socket.gethostname()}"


def _holder(record: str) -> tuple[str, str | None]:
    """The pid and the host (None where another host is not named: a record of this host,
    or a pid alone, from an earlier writer) of a lock file's record."""
    pid, _, host = record.strip().partition(" ")
    host = host.strip()
    return pid, host if host and host != socket.gethostname() else None


def _locked_message(path: str, lock_path: str, record: str) -> str:
    pid, host = _holder(record)
    if host is None and pid.isdigit() and not _pid_running(int(pid)):
        return (
            f"The feature store {path!r} is locked, but its writer (pid {pid}) is no "
            f"longer running: a process it started still holds {lock_path!r}; end that "
            f"process (`fuser -v {lock_path}` shows it) or wait for it to exit."
        )
    where = f" on host {host}" if host else ""
    return (
        f"The feature store {path!r} is being written by another process (pid {pid}{where}); "
        "wait for it to finish or write to another path."
    )


def _lock_holder(path: str | os.PathLike) -> str | None:
    """The writer that ``<path>.lock`` records while another process holds that lock, as
    "pid" or "pid on host H"; None otherwise (the file keeps the last writer's record after
    it is released)."""
    try:
        with open(f"{os.fspath(path)}.lock", "rb") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its record is the writer's
                record = fh.read(300).decode("utf-8", "replace")
            else:
                return None
    except OSError:
        return None
    pid, host = _holder(record)
    if host is not None:  # its processes cannot be seen from here
        return f"{pid} on host {host}"
    mine = pid == str(os.getpid())  # this process writes it (not a reader's concern)
    return pid if pid.isdigit() and not mine and _pid_running(int(pid)) else None


# HDF5_USE_FILE_LOCKING values by which a user lets HDF5 open files without its lock.
_NO_HDF5_LOCKING = ("FALSE", "0", "BEST_EFFORT")


def _without_locks(path: str, lock_path: str, err: OSError) -> None:
    """A file system without locks (ENOSYS, ENOLCK, EOPNOTSUPP: Lustre or NFS mounted
    without them) refuses ``flock``: refused with a remedy, unless HDF5's locking is off
    (HDF5_USE_FILE_LOCKING), which HDF5 needs there too; then the store is written without
    the lock, and said so."""
    if err.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
        raise StoreError(
            f"Cannot lock {lock_path!r} beside the feature store {path!r}: {err.strerror or err}."
        ) from err
    # Compared as HDF5 compares it: "false" leaves HDF5's lock on.
    if os.environ.get("HDF5_USE_FILE_LOCKING", "") not in _NO_HDF5_LOCKING:
        raise StoreError(
            f"Cannot lock {lock_path!r} beside the feature store {path!r}: this file system "
            f"does not support file locks ({err.strerror or err}). Write the store to a "
            "local disk, or set HDF5_USE_FILE_LOCKING=FALSE in the environment (HDF5 needs "
            "it there too) to write it without locks; then no second run may write it at "
            "the same time."
        ) from err
    logger.warning(
        "This file system does not support file locks (%s): the feature store %r is "
        "written without its lock, as HDF5_USE_FILE_LOCKING asks. No second run may write "
        "it at the same time.",
        err.strerror or err,
        path,
    )


@contextmanager
def store_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` while writing ``path``.

    ``flock`` is released by the kernel when the holder dies, so a killed run never leaves
    a stale lock behind. Processes forked while the lock is held (DataLoader workers) do
    not keep it: the lock is the writer's alone. The lock file records the holder's pid and host for
    the error message.
    """
    path = os.fspath(path)
    lock_path = f"{path}.lock"
    try:
        fh = open(lock_path, "a+")
    except OSError as err:
        raise StoreError(
            f"Cannot create the lock file {lock_path!r} beside the feature store: "
            f"{err.strerror}; write the store to a folder you can write to."
        ) from err
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise StoreLockedError(_locked_message(path, lock_path, holder)) from None
        except OSError as err:
            _without_locks(path, lock_path, err)
        _HELD_LOCKS.add(fh.fileno())
        fh.seek(0)
        fh.truncate()
        fh.write(_lock_record())
        fh.flush()
        yield
    finally:
        _HELD_LOCKS.discard(fh.fileno())
        fh.close()


def _not_hdf5(path: str | os.PathLike) -> str | None:
    """Why an existing path is not an HDF5 file, or None if it is one."""
    if os.path.isdir(path):
        return "is a folder"
    if os.path.getsize(path) == 0:
        return "is empty"
    if not h5py.is_hdf5(path):
        return "is not an HDF5 file"
    return None


def _file_problem(path: str | os.PathLike) -> str | None:
    """Why an existing path is not a store written by mr2-extract, or None if it is one."""
    problem = _not_hdf5(path)
    if problem:
        return problem
    with open_store(path, "r") as f:
        if "features" not in f or "format_version" not in f.attrs:
            return "is an HDF5 file but not a feature store written by mr2-extract"
    return None


def _creation_leftover(tmp: str) -> bool:
    """Whether ``tmp`` can be what a killed :func:`create_store` left: an empty file, or an
    HDF5 file holding nothing but a store's datasets (h5py writes the HDF5 signature when
    it opens the file; one killed mid-write may not open at all)."""
    problem = _not_hdf5(tmp)
    if problem is not None:
        return problem == "is empty"
    try:
        with h5py.File(tmp, "r", locking=False) as f:
            return set(f.keys()) <= set(STORE_DATASETS)
    except OSError:
        return True


def _check_companions(text: str) -> None:
    """Refuse to run when the files written beside a store, ``<path>.tmp`` (a store being
    created) and ``<path>.lock`` (a pid), are files of another kind: they would be
    replaced or truncated."""
    tmp, lock = f"{text}.tmp", f"{text}.lock"
    problem = None
    if os.path.islink(tmp) or os.path.islink(lock):
        link = tmp if os.path.islink(tmp) else lock
        problem = f"{link!r} is a symbolic link (writing through it would change its target)"
    elif os.path.lexists(tmp) and not _creation_leftover(tmp):
        problem = f"{tmp!r} exists and is not a store left by a killed run"
    elif os.path.isdir(lock):
        problem = f"{lock!r} is a folder, where mr2-extract keeps its lock file"
    elif os.path.lexists(lock):
        try:
            with open(lock, "rb") as fh:
                content = fh.read(300).strip()
        except OSError:
            content = b""  # unreadable: store_lock says why when it opens it
        # One line, a pid and at most a host name's 255 bytes (which may hold spaces)
        if content and not re.fullmatch(rb"\d{1,10}( [^\n]{1,255})?", content):
            problem = f"{lock!r} exists and is not a lock file of mr2-extract (a pid and host)"
    if problem:
        raise StoreError(
            f"{problem}; mr2-extract writes that path beside the store {text!r}: move the "
            "file away or choose another output path."
        )


def check_output(path: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse an output path that cannot receive a store, before any work is done.

    Parameters
    ----------
    path : path-like
        The store to write.
    overwrite : bool, default=False
        Whether an existing store (or an empty file) may be replaced.

    Raises
    ------
    StoreError
        If the output is a folder, a file that is not a store, or lies in a folder that
        cannot be created or written; ``ProvenanceError`` if it is a store of another
        format and ``overwrite`` is False.
    """
    text = os.fspath(path)
    if os.path.exists(text):
        problem = _file_problem(text)
        if problem == "is a folder":
            raise StoreError(
                f"The output {text!r} is a folder; give a file path such as "
                f"{os.path.join(text, 'features.h5')!r}."
            )
        if problem == "is empty" and overwrite:
            pass  # nothing to lose
        elif problem == "is empty":
            raise StoreError(
                f"The output {text!r} exists and is empty; pass --force (overwrite=True) to "
                "write the store over it, or choose another output path."
            )
        elif problem:
            raise StoreError(
                f"The output {text!r} exists and {problem}; it is never replaced (not even "
                "with --force): choose another output path or delete the file yourself."
            )
        elif not overwrite:
            with open_store(text, "r") as f:
                check_format(text, read_attrs(f))
    _check_companions(text)
    folder = os.path.dirname(os.path.abspath(text))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise StoreError(
            f"Cannot create the output {text!r}: {existing!r} is a file, not a folder; "
            "choose an output path inside a folder."
        )
    reusable = existing == folder and os.path.exists(text) and not overwrite
    if not os.access(existing, os.W_OK | os.X_OK) and not reusable:  # reuse writes nothing
        raise StoreError(
            f"Cannot write the output {text!r}: no permission to write in the folder "
            f"{existing!r}; choose an output path in a folder you can write to."
        )


def output_target(path: str | os.PathLike) -> Path:
    """The file a store at ``path`` is written to: a symbolic link's target (written
    through, as the shell's ``>`` does), so that the store's temporary file, lock and
    atomic rename act on the target and not on the link; otherwise ``path`` itself."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def make_output_folder(path: str | os.PathLike) -> None:
    """Create the folder of ``path``; failures become a :class:`StoreError`."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise StoreError(
            f"Cannot create the output folder {folder!r}: {err.strerror}; choose an output "
            "path in a folder you can write to."
        ) from err


# Per row, beside its features: status, reason, digest, and four int64 columns.
ROW_BYTES = 1 + np.dtype(REASON_DTYPE).itemsize + np.dtype(DIGEST_DTYPE).itemsize + 4 * 8


# Per path, beside its UTF-8 bytes: HDF5's variable-length string (heap entry and pointer).
PATH_OVERHEAD = 48


def _check_space(path: str, size: int) -> None:
    """Refuse a store that its folder has no room for, before any of it is written (a
    leftover ``path`` of an earlier creation is replaced, so its room counts as free)."""
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if os.path.isfile(path):
        free += os.path.getsize(path)
    if size > free:
        store = path.removesuffix(".tmp").removesuffix(".merging")
        raise StoreError(
            f"No space left for the feature store {store!r}: it needs "
            f"about {size / 2**20:.1f} MiB and its folder has {free / 2**20:.1f} MiB free; "
            "free some space, or write it elsewhere."
        )


def _early() -> h5py.h5p.PropDCID:
    # Storage allocated at creation: later writes touch raw data only, never metadata.
    # Filled there too, so that the file holds every byte of it, not a sparse hole that a
    # full disk refuses to fill in the middle of a run.
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_ALLOC)
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
    file_size: np.ndarray,
    file_mtime_ns: np.ndarray,
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
    file_size, file_mtime_ns : ndarray of shape (n_rows,)
        Size in bytes and modification time of each row's file when the image list was
        made (-1 for items that are not files, or were missing).
    """
    n = len(labels)
    itemsize = np.dtype(dtype).itemsize
    # About 1 MiB per chunk: large enough for fast streaming, small enough for row reads.
    chunk_rows = int(max(1, min(n, (1 << 20) // (dim * itemsize))))
    tmp = f"{os.fspath(path)}.tmp"
    chunks = -(-n // chunk_rows) if n else 0  # features take whole chunks
    size = chunks * chunk_rows * dim * itemsize + n * ROW_BYTES + (1 << 16)
    size += sum(len(i.encode()) + PATH_OVERHEAD for i in ids)  # variable-length strings
    _check_space(tmp, size)
    try:
        _write_new_store(tmp, n, dim, dtype, chunk_rows, provenance, record, labels, indices,
                         ids, class_names, file_size, file_mtime_ns)  # fmt: skip
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a part of a store is no store (a full disk)
        raise
    os.replace(tmp, path)


def _write_new_store(tmp, n, dim, dtype, chunk_rows, provenance, record, labels, indices,
                     ids, class_names, file_size, file_mtime_ns) -> None:  # fmt: skip
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
        f.create_dataset("content_sha256", (n,), DIGEST_DTYPE, dcpl=_early())
        f.create_dataset("labels", data=np.asarray(labels, dtype=np.int64))
        f.create_dataset("indices", data=np.asarray(indices, dtype=np.int64))
        f.create_dataset("paths", data=list(ids), dtype=h5py.string_dtype())
        f.create_dataset("class_names", data=list(class_names), dtype=h5py.string_dtype())
        f.create_dataset("file_size", data=np.asarray(file_size, dtype=np.int64))
        f.create_dataset("file_mtime_ns", data=np.asarray(file_mtime_ns, dtype=np.int64))
        for key, value in (provenance | record).items():
            f.attrs[key] = json.dumps(value) if isinstance(value, dict | list) else value
        f.attrs["class_names"] = json.dumps(list(class_names))


def check_format(path: str | os.PathLike, attrs: dict) -> None:
    """Refuse a store written in another format than this version's."""
    version = attrs.get("format_version")
    if version == FORMAT_VERSION:
        return
    check_not_newer(path, attrs)
    raise ProvenanceError(
        f"The feature store {os.fspath(path)!r} was written in store format {version} by an "
        f"older mr2-extract; this version writes format {FORMAT_VERSION}, which also records "
        f"the identity of every image. Rebuild it with --force (overwrite=True)."
    )


def check_not_newer(path: str | os.PathLike, attrs: dict) -> None:
    """Refuse a store written by a newer mr2-extract, whose rows may mean other things."""
    version = attrs.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ProvenanceError(
            f"The feature store {os.fspath(path)!r} was written in store format {version} by "
            f"a newer mr2-extract (this one writes format {FORMAT_VERSION}); upgrade "
            "mr2-probe, or write to another output path."
        )


def _differences(
    key: str, existing: Any, requested: Any, names: tuple[str, str] = ("file", "request")
) -> list[str]:
    """``key: file has ..., request has ...`` lines (``names`` the two sides); a dict lists
    its differing entries."""
    if isinstance(existing, dict) and isinstance(requested, dict):
        keys = [
            k
            for k in sorted(existing.keys() | requested.keys())
            if existing.get(k) != requested.get(k)
        ]
        if len(keys) > 1 and "transform" in keys:
            keys.remove("transform")  # the transform's repr restates the other entries
        return [
            line
            for k in keys
            for line in _differences(f"{key}.{k}", existing.get(k), requested.get(k), names)
        ]
    old, new = (" ".join(repr(v).split()) for v in (existing, requested))
    return [f"{key}: {names[0]} has {old}, {names[1]} has {new}"]


def check_provenance(
    path: str | os.PathLike,
    existing: dict,
    requested: dict,
    explain_source: Callable[[], str | None] | None = None,
) -> None:
    """Refuse to reuse a store whose provenance differs from the request.

    Parameters
    ----------
    path : path-like
    existing, requested : dict
        The store's attributes and the request's provenance.
    explain_source : callable, optional
        Called when the source fingerprints differ; returns a sentence naming the first
        differing image (or None), which replaces the bare fingerprint difference.

    Raises
    ------
    ProvenanceError
        With one line listing every difference.
    """
    check_format(path, existing)
    diffs = provenance_differences(existing, requested, explain_source)
    if diffs:
        raise ProvenanceError(
            f"The feature store {os.fspath(path)!r} was made with a different provenance "
            f"({'; '.join(diffs)}). Write to another output path, or {_REBUILD}."
        )


def provenance_differences(
    existing: dict,
    requested: dict,
    explain_source: Callable[[], str | None] | None = None,
    names: tuple[str, str] = ("file", "request"),
) -> list[str]:
    """The differences that :func:`check_provenance` lists, ``names`` the two sides."""
    existing = PROVENANCE_DEFAULTS | dict(existing)
    requested = PROVENANCE_DEFAULTS | dict(requested)
    diffs = []
    for key in PROVENANCE_KEYS:
        if existing.get(key) == requested.get(key):
            continue
        if key == "source_fingerprint" and existing.get("source_options") != requested.get(
            "source_options"
        ):
            # Another label or image key, said on its own: reading other members changes
            # the containers' identities, not the images.
            continue
        detail = explain_source() if key == "source_fingerprint" and explain_source else None
        diffs += (
            [f"the images differ: {detail}"]
            if detail
            else _differences(key, existing.get(key), requested.get(key), names)
        )
    return diffs


def _open_in_this_process(path: str | os.PathLike) -> bool:
    """Whether this process holds ``path`` open through h5py (HDF5 then refuses to open it
    in another mode)."""
    real = os.path.realpath(path)
    return any(
        os.path.realpath(os.fsdecode(fid.name)) == real
        for fid in h5py.h5f.get_obj_ids(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)
    )


def open_store(path: str | os.PathLike, mode: str = "r") -> h5py.File:
    """Open a store with a clear error when HDF5 refuses (locked or not a store)."""
    try:
        return h5py.File(path, mode)
    except OSError as err:
        # HDF5's "unable to lock file", not the "sblock" (superblock) of a damaged file.
        if re.search(r"\block", str(err), re.IGNORECASE):
            code = re.search(r"errno = (\d+)", str(err))
            if code and int(code[1]) not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                # ENOSYS, ENOLCK, EOPNOTSUPP: a file system without locks (Lustre or NFS
                # mounted without them), not another process.
                raise StoreError(
                    f"HDF5 cannot lock the feature store {os.fspath(path)!r}: this file "
                    f"system does not support file locks ({' '.join(str(err).split())}). "
                    "Set HDF5_USE_FILE_LOCKING=FALSE in the environment to open it without "
                    "HDF5's lock, or write to a local disk."
                ) from err
            if mode == "r":  # HDF5 refuses readers only while a writer has the file open
                holder = _lock_holder(path)
                raise StoreLockedError(
                    f"The feature store {os.fspath(path)!r} is open for writing in another "
                    f"process{f' (pid {holder})' if holder else ''}; wait for it to finish."
                ) from err
            raise StoreLockedError(
                f"The feature store {os.fspath(path)!r} is open in another process, and HDF5 "
                "lets no one write a file that another process has open, even for reading: "
                "close it there (e.g. the session that called load_features) and run again."
            ) from err
        if _open_in_this_process(path):  # HDF5's "file is already open for read-only"
            raise StoreLockedError(
                f"The feature store {os.fspath(path)!r} is open in this process (a store of "
                "load_features not yet closed, say), and HDF5 will not open it again for "
                "writing: close it (store.close(), or leave its with block) and run again."
            ) from err
        if isinstance(err, FileNotFoundError):
            raise StoreNotFoundError(
                f"The feature store {os.fspath(path)!r} does not exist; check the path."
            ) from err
        cut = " (the file was cut short)" if "truncated file" in str(err) else ""
        raise NotAStoreError(
            f"Cannot read {os.fspath(path)!r} as an HDF5 feature store{cut}: "
            f"{' '.join(str(err).split())}. A file that cannot be read as a store is never "
            "replaced, not even with --force (overwrite=True): delete it yourself to extract "
            "it again, or write to another path."
        ) from err


def write_rows(
    f: h5py.File,
    positions: np.ndarray,
    features: np.ndarray,
    status: np.ndarray,
    reasons: Sequence[str],
    digests: Sequence[str],
) -> None:
    """Write the rows at the increasing ``positions``; mark them done only after a flush."""
    positions = np.asarray(positions, dtype=np.int64)
    first, last = int(positions[0]), int(positions[-1])
    # consecutive rows (a first run, a resumed one) as a slice, others (a retry) by index
    rows = slice(first, last + 1) if last - first + 1 == len(positions) else positions
    # The datasets stay open until the flush, which then raises a failed write: HDF5
    # buffers small writes in each open dataset, and h5py only prints the errors of a
    # dataset closed when it is freed.
    data = f["features"], f["failure_reason"], f["content_sha256"], f["status"]
    data[0][rows] = features
    data[1][rows] = np.array([_truncate(r) for r in reasons], REASON_DTYPE)
    data[2][rows] = np.array([d.encode() for d in digests], DIGEST_DTYPE)
    f.flush()  # features reach the file before the rows are marked done
    data[3][rows] = status
    f.flush()


class RowView:
    """Lazy view of selected rows of an HDF5 dataset (the completed rows of a store).

    Indexes as the ``h5py.Dataset`` it stands for does: an integer, a slice, an array of
    rows or a boolean mask, then optionally the columns (``view[rows, :4]``), and
    ``numpy.asarray``; ``dataset`` is the underlying ``h5py.Dataset``. Rows are read in
    contiguous blocks of at most ``BLOCK_BYTES``, so reading scattered rows (a
    cross-validation fold) costs their own memory and one block, not the span they cover.
    """

    BLOCK_BYTES = 64 << 20

    def __init__(self, dataset: h5py.Dataset, rows: np.ndarray) -> None:
        self.dataset, self.rows = dataset, rows
        self.shape = (len(rows), *dataset.shape[1:])
        self.dtype, self.ndim, self.chunks = dataset.dtype, dataset.ndim, dataset.chunks

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, tuple) and key and key[0] is not Ellipsis:
            rows = self[key[0]]
            rest = key[1:] if np.ndim(rows) < self.ndim else (slice(None), *key[1:])
            return rows[rest]
        if isinstance(key, tuple) or key is Ellipsis:
            return self[:][key]
        selected = self.rows[key]
        if np.ndim(selected) == 0:
            return self.dataset[int(selected)]
        out = np.empty((len(selected), *self.shape[1:]), self.dtype)
        order = np.argsort(selected, kind="stable")
        ordered = selected[order]
        row_bytes = max(1, self.dtype.itemsize * int(np.prod(self.shape[1:])))
        block = max(1, self.BLOCK_BYTES // row_bytes)
        start = 0
        while start < len(ordered):  # a loop over blocks of the store, not over rows
            lo = int(ordered[start])
            stop = int(np.searchsorted(ordered, lo + block))
            part = self.dataset[lo : int(ordered[stop - 1]) + 1]
            out[order[start:stop]] = part[ordered[start:stop] - lo]
            start = stop
        return out

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


def _open_for_reading(path: str | os.PathLike) -> h5py.File:
    """Open a store to read it; every way in which ``path`` is not one is a StoreError."""
    text = os.fspath(path)
    if not os.path.exists(text):
        raise StoreNotFoundError(
            f"The feature store {text!r} does not exist; check the path, or write it with "
            "mr2-extract."
        )
    problem = _not_hdf5(text)
    if problem:
        raise NotAStoreError(
            f"{text!r} {problem}; pass an HDF5 feature store written by mr2-extract."
        )
    f = open_store(text, "r")
    missing = [name for name in _REQUIRED if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        found = sorted(f.keys())
        f.close()
        raise NotAStoreError(
            f"The HDF5 file {text!r} is not a feature store: it has no "
            f"{' / '.join(repr(m) for m in missing)} dataset (it holds {found}); pass a store "
            "written by mr2-extract."
        )
    return f


_TEXT = ("paths", "failure_reason", "content_sha256")  # a store's string datasets


def _check_shapes(
    path: str | os.PathLike, f: h5py.File, labels: np.ndarray, status: np.ndarray
) -> None:
    n_classes = len(f["class_names"])
    problem = None
    if labels.dtype.kind not in "iu":
        problem = f"'labels' has dtype {labels.dtype}, not integers (codes into class_names)"
    elif f["features"].ndim != 2:
        problem = f"'features' has shape {f['features'].shape}, not (n_rows, n_features)"
    elif f["features"].dtype.kind not in "fiu":
        problem = f"'features' has dtype {f['features'].dtype}, not numbers"
    elif labels.shape != (len(f["features"]),):
        problem = f"'labels' has shape {labels.shape} for {len(f['features'])} feature rows"
    elif len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        problem = f"'labels' holds values outside 0..{n_classes - 1} ({n_classes} class names)"
    elif f["class_names"].dtype.kind not in "SOU":
        problem = f"'class_names' has dtype {f['class_names'].dtype}, not strings"
    else:  # the optional datasets, one entry per row (a short 'status' dropped rows)
        for name in (name for name in ("status", "indices", *_TEXT) if name in f):
            if f[name].shape[:1] != labels.shape:
                problem = f"'{name}' has shape {f[name].shape} for {len(labels)} rows"
                break
            if name in _TEXT and f[name].dtype.kind not in "SOU":
                problem = f"'{name}' has dtype {f[name].dtype}, not strings"
                break
        unknown = np.setdiff1d(status, [PENDING, DONE, FAILED])
        if problem is None and len(unknown):
            problem = f"'status' holds codes {unknown.tolist()}, not {PENDING}, {DONE}, {FAILED}"
    if problem:
        raise NotAStoreError(
            f"The feature store {os.fspath(path)!r} is inconsistent: {problem}; rebuild it."
        )


def load_features(
    path: str | os.PathLike, in_memory: bool = False, allow_incomplete: bool = False
) -> FeatureStore:
    """Open a feature store for a classifier.

    Parameters
    ----------
    path : path-like
        An HDF5 store written by :func:`extract_features` or :func:`merge_shards` (or any
        HDF5 file with ``features`` (N, d), ``labels`` (N,) and ``class_names`` (K,)
        datasets: the other datasets are optional).
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
    StoreNotFoundError
        If ``path`` does not exist.
    NotAStoreError
        If it is a folder, empty, not HDF5, lacks ``features`` / ``labels`` /
        ``class_names``, or their shapes disagree.
    StoreLockedError
        If a run is writing it.
    IncompleteStoreError
        If rows are still pending and ``allow_incomplete`` is False.

    All four derive from :class:`StoreError` (a ``ValueError``).

    Examples
    --------
    >>> with load_features("features.h5") as store:  # doctest: +SKIP
    ...     clf.fit(store.features, store.labels)
    """
    f = _open_for_reading(path)
    try:
        attrs = read_attrs(f)
        check_not_newer(path, attrs)  # older formats are read
        labels = f["labels"][:]
        n = len(labels)
        status = f["status"][:] if "status" in f else np.full(n, DONE, np.uint8)
        _check_shapes(path, f, labels, status)
        n_pending = int((status == PENDING).sum())
        if n_pending and not allow_incomplete:
            raise IncompleteStoreError(
                f"The feature store {os.fspath(path)!r} has {n_pending} of {len(status)} rows "
                "not extracted yet; run the same extraction command again to finish it (from "
                "Python, load_features(..., allow_incomplete=True) loads the completed rows)."
            )
        if n_pending:
            warnings.warn(
                f"Loading {int((status == DONE).sum())} completed rows of an incomplete store "
                f"({n_pending} rows pending).",
                UserWarning,
                stacklevel=2,
            )
        rows = np.flatnonzero(status == DONE)
        if "paths" in f:
            all_paths = f["paths"].asstr()[:]
        else:
            all_paths = np.array([str(i) for i in range(n)], dtype=object)
        failed = np.flatnonzero(status == FAILED)
        reasons = f["failure_reason"][failed] if "failure_reason" in f else [b""] * len(failed)
        indices = f["indices"][:] if "indices" in f else np.arange(n, dtype=np.int64)
        store = FeatureStore(
            features=f["features"] if len(rows) == len(status) else RowView(f["features"], rows),
            labels=labels[rows],
            class_names=list(f["class_names"].asstr()[:]),
            paths=[str(p) for p in all_paths[rows]],
            indices=indices[rows],
            rows=rows,
            failures=[
                (str(all_paths[i]), r.decode(errors="replace"))
                for i, r in zip(failed, reasons, strict=True)
            ],
            metadata=attrs,
            n_pending=n_pending,
            file=f,
        )
    except BaseException:
        f.close()
        raise
    if in_memory:
        try:  # closed whatever happens, a MemoryError included
            store.features = np.asarray(store.features)
        finally:
            store.close()
        store.file = None
    return store


def shard_path(out: str | os.PathLike, rank: int, world_size: int) -> Path:
    """``features.h5`` -> ``features.shard-00001-of-00004.h5``.

    Examples
    --------
    >>> from extract import shard_path
    >>> shard_path("features.h5", rank=1, world_size=4).name
    'features.shard-00001-of-00004.h5'
    """
    out = Path(out)
    return out.with_name(f"{out.stem}.shard-{rank:05d}-of-{world_size:05d}{out.suffix}")


def shards_beside(out: str | os.PathLike) -> list[Path]:
    """The shards of ``out`` there are, of any number of ranks (:func:`shard_path`'s names)."""
    out = Path(out)
    return sorted(out.parent.glob(f"{glob.escape(out.stem)}.shard-*-of-*{glob.escape(out.suffix)}"))


def merge_shards(
    shards: Iterable[str | os.PathLike], out: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Merge per-rank shard stores into one store in source order.

    Each shard holds some rows of the source (rank ``r`` of ``W``: rows ``r, r + W, ...``
    of a folder, the rows of every ``W``-th tar shard or row group of a WebDataset or
    Parquet source); the merge checks that every rank is present once, that all shards
    share one provenance and are complete and together hold every row once, and writes
    each row to its position in the source (by the shards' ``indices``). An existing
    ``out`` is replaced only if its provenance matches, or if ``overwrite`` is True.

    Parameters
    ----------
    shards : iterable of path-like
        Every shard of one run, any order (at least one).
    out : path-like
        The merged store (written atomically, under the store lock).
    overwrite : bool, default=False
        Replace an existing ``out`` whatever it was made from.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If no shards are given or ranks are missing or repeated; ``ProvenanceError`` if the
        shards (or an existing ``out``) disagree; ``IncompleteStoreError`` if a shard has
        pending rows.
    """
    if isinstance(shards, str | bytes | os.PathLike):  # one path is no list of paths
        raise TypeError(
            f"The 'shards' parameter of merge_shards takes a list of shard paths, got one "
            f"path, {os.fsdecode(shards)!r}; pass [path] for a single shard."
        )
    shards = list(shards)  # counted and read once each: a generator is taken too
    if not shards:
        raise ValueError(
            "The 'shards' parameter of merge_shards holds no shards; pass every shard of "
            "one run: the paths extract_features(..., rank=r, world_size=W) returned for r "
            "in range(W)."
        )
    files = {}
    reference = None  # every shard is checked against the first one given
    try:
        for path in shards:
            f = _open_for_reading(path)
            attrs = read_attrs(f)
            check_format(path, attrs)
            rank = attrs["shard_rank"]
            if rank in files:
                f.close()
                raise ValueError(f"Two shards given to merge_shards have rank {rank}.")
            files[rank] = f
            if reference is None:
                reference, first = attrs, path
            _check_shard(path, f, reference, first, len(shards))
        if sorted(files) != list(range(len(shards))):
            raise ValueError(
                f"merge_shards needs every rank of one run exactly once; got ranks "
                f"{sorted(files)} from {len(shards)} shards."
            )
        _warn_of_versions(files)
        out = output_target(out)
        check_output(out, overwrite)
        check_merging(os.fspath(out))
        make_output_folder(out)
        with store_lock(out):
            _write_merged(files, out, overwrite)
    finally:
        for f in files.values():
            f.close()
    return Path(out)


def _warn_of_versions(files: dict[int, h5py.File]) -> None:
    """Say which shards were extracted with other library versions than rank 0's, which
    the merged store records (a resume with other versions says so too)."""
    versions = {rank: read_attrs(f).get("versions") for rank, f in files.items()}
    other = sorted(rank for rank, v in versions.items() if v != versions[0])
    if other:
        logger.warning(
            "%d of the %d shards were extracted with other library versions than rank 0's "
            "shard %s (%s), which the merged store records; the first, %s: %s",
            len(other),
            len(files),
            files[0].filename,
            versions[0],
            files[other[0]].filename,
            versions[other[0]],
        )


def check_merging(text: str) -> None:
    """Refuse to merge when ``<out>.merging`` (the merged store until its rename) or its
    ``.tmp`` is a file of another kind than a merge's leftover: it would be replaced."""
    merging = f"{text}.merging"
    _check_companions(merging)  # its .tmp, as create_store leaves it
    if os.path.islink(merging):
        problem = f"{merging!r} is a symbolic link (writing through it would change its target)"
    elif os.path.lexists(merging) and not _merge_leftover(merging):
        problem = f"{merging!r} exists and is not a merged store left by a killed merge"
    else:
        return
    raise StoreError(
        f"{problem}; mr2-extract writes that path beside the store {text!r}: move the file "
        "away or choose another output path."
    )


def _merge_leftover(path: str) -> bool:
    """Whether ``path`` is a store that a merge wrote (it records ``merged_from``)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return "features" in f and "merged_from" in f.attrs
    except OSError:
        return False


def _check_shard(path, f: h5py.File, reference: dict, first, world: int) -> None:
    """Refuse a shard of another run than the ``first`` shard given (its attributes
    ``reference``), or an incomplete one."""
    attrs = read_attrs(f)
    if attrs["shard_world_size"] != world:
        raise ValueError(
            f"The shard {os.fspath(path)!r} is one of {attrs['shard_world_size']} shards, "
            f"but {world} were given to merge_shards."
        )
    check_format(path, attrs)
    own = {k: attrs[k] for k in ("shard_rank", "n_rows")}
    diffs = provenance_differences(attrs, reference | own, names=("it", "the first"))
    if diffs:
        # Only the listing differs (not the source's root, backbone or settings): the
        # ranks listed one source at different times.
        keys = {d.split(":")[0].split(".")[0] for d in diffs}
        listed = keys <= {"source_fingerprint", "n_total_rows"}
        advice = (
            "The ranks listed different images: the source changed between their starts. "
            "Extract every rank again with --force (overwrite=True) from the source as it is "
            "now."
            if listed
            else "Merge the shards of one run."
        )
        raise ProvenanceError(
            f"The shard {os.fspath(path)!r} was not made by the run of the first shard "
            f"given, {os.fspath(first)!r} ({'; '.join(diffs)}). {advice}"
        )
    pending = int((f["status"][:] == PENDING).sum())
    if pending:
        raise IncompleteStoreError(
            f"The shard {os.fspath(path)!r} has {pending} rows not extracted; finish its run "
            "(the same command again) before merging."
        )


def _merged_positions(files: dict[int, h5py.File], n: int) -> dict[int, np.ndarray]:
    """Where each shard's rows go in the merged store: source order, by ``indices``."""
    indices = {rank: f["indices"][:] for rank, f in files.items()}
    order = np.sort(np.concatenate(list(indices.values())))
    if len(order) != n or (np.diff(order) == 0).any():
        raise ValueError(
            f"The shards given to merge_shards hold {len(order)} rows for a source of {n}, "
            "or hold a row twice; merge the shards of one run."
        )
    return {rank: np.searchsorted(order, idx) for rank, idx in indices.items()}


def _runs(positions: np.ndarray) -> Iterator[tuple[slice, slice]]:
    """``(merged slice, shard slice)`` pairs covering increasing ``positions``.

    One strided slice when the positions are evenly spaced (rank r of W holding rows
    r, r + W, ... of a folder), else one slice per run of consecutive rows (whole shards).
    """
    steps = np.diff(positions)
    if len(positions) == 1 or (steps == steps[0]).all():
        step = int(steps[0]) if len(steps) else 1
        yield slice(int(positions[0]), int(positions[-1]) + 1, step), slice(None)
        return
    bounds = [0, *(np.flatnonzero(steps != 1) + 1).tolist(), len(positions)]
    for lo, hi in itertools.pairwise(bounds):
        yield slice(int(positions[lo]), int(positions[hi - 1]) + 1), slice(lo, hi)


def _write_merged(files: dict[int, h5py.File], out: str | os.PathLike, overwrite: bool) -> None:
    world, first = len(files), read_attrs(files[0])
    n = first["n_total_rows"]
    positions = _merged_positions(files, n)

    def gather(name: str) -> np.ndarray:
        values = np.empty((n, *files[0][name].shape[1:]), files[0][name].dtype)
        for rank, f in files.items():
            values[positions[rank]] = f[name][:]
        return values

    provenance = {k: first[k] for k in PROVENANCE_KEYS if k in first}
    provenance |= dict(n_rows=n, shard_rank=0, shard_world_size=1)
    record = {
        k: v
        for k, v in first.items()
        if k not in PROVENANCE_KEYS and k not in ("class_names", REPLACES)
    }
    if os.path.exists(out) and not overwrite:  # replace only a store of the same thing
        with open_store(out, "r") as f:
            check_provenance(out, read_attrs(f), provenance)
    tmp = f"{os.fspath(out)}.merging"
    # A killed merge's leftover (checked to be one) goes first: its room is the new one's.
    Path(tmp).unlink(missing_ok=True)
    try:
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
            file_size=gather("file_size"),
            file_mtime_ns=gather("file_mtime_ns"),
        )
        with h5py.File(tmp, "r+") as merged:
            for rank, f in files.items():
                m = len(f["status"])
                for lo in range(0, m, _MERGE_BLOCK):
                    hi = min(m, lo + _MERGE_BLOCK)
                    for name in ("features", "failure_reason", "content_sha256", "status"):
                        block = f[name][lo:hi]
                        for where, part in _runs(positions[rank][lo:hi]):
                            merged[name][where] = block[part]
        os.replace(tmp, out)
    except BaseException:  # a part of a merged store is no store (a full disk, Ctrl-C)
        Path(tmp).unlink(missing_ok=True)
        raise
