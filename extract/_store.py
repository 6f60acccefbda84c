"""HDF5 feature store: the output checked, the store created crash-safe, its provenance
checked, opened and written row by row. Its schema and errors are in ``_schema``, its lock
in ``_locks``, reading it in ``_reading``, merging shards in ``_merge``.

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
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mr2_probe._h5 import EXTERNAL_ADVICE, PLUGIN_ADVICE, missing_external_file, missing_filters

from ._locks import _lock_holder
from ._paths import expand_home
from ._schema import (
    _REBUILD,
    DIGEST_DTYPE,
    DONE,
    FAILED,
    FORMAT_VERSION,
    PENDING,
    PROVENANCE_KEYS,
    REASON_DTYPE,
    STORE_DATASETS,
    NotAStoreError,
    ProvenanceError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    _truncate,
    read_attrs,
    with_defaults,
)


def _not_hdf5(path: str | os.PathLike) -> str | None:
    """Why an existing path is not an HDF5 file, or None if it is one."""
    if os.path.isdir(path):
        return "is a folder"
    if not stat.S_ISREG(os.stat(path).st_mode):  # a device or a FIFO has size 0 too
        return "is not a regular file (a device, a FIFO or a socket)"
    if os.path.getsize(path) == 0:
        return "is empty"
    try:
        if not h5py.is_hdf5(path):
            return "is not an HDF5 file"
    except PermissionError as err:  # the file's own mode: a store, for all one knows
        raise _no_permission(path, "r") from err
    return None


def _no_permission(path: str | os.PathLike, mode: str) -> StoreError:
    """The error for a store file whose own mode forbids opening it in ``mode``."""
    what, able, flag = ("read", "readable", "r") if mode == "r" else ("write", "writable", "w")
    return StoreError(
        f"No permission to {what} the feature store {os.fspath(path)!r} (the file's mode): "
        f"make it {able} (chmod u+{flag}), or write to another path."
    )


def no_folder_permission(path: str | os.PathLike) -> StoreError:
    """Why a store in a folder that cannot be written (its mode, a read-only file system)
    cannot be written, in the words of :func:`_no_permission`."""
    folder = os.path.dirname(os.path.abspath(path))
    return StoreError(
        f"No permission to write in the folder {folder!r} (its mode, or a read-only file "
        "system): make it writable, or write the store to a folder you can write to."
    )


# What h5py raises reading the structures of a damaged HDF5 file (a bad signature, a
# message not aligned, an address past its end), after it opened: RuntimeError, KeyError
# and OSError; and a JSON attribute cut or overwritten.
DAMAGE_ERRORS = (OSError, RuntimeError, KeyError, json.JSONDecodeError)


def damaged(
    path: str | os.PathLike,
    error: BaseException,
    source: h5py.File | h5py.Dataset | None = None,
) -> StoreError:
    """The error for a store that opened and then could not be read (a damaged file); one
    that names the filters ``source`` is compressed with that this HDF5 cannot load, where
    that is why (the file may well be intact)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else error
    try:  # (read from the datasets' headers, which the damage may have reached too)
        missing = missing_filters(source) if source is not None and source.id.valid else []
    except DAMAGE_ERRORS:
        missing = []
    try:
        external = (
            missing_external_file(source)
            if isinstance(source, h5py.Dataset) and source.id.valid
            else None
        )
    except DAMAGE_ERRORS:
        external = None
    if external:  # deleted or moved after the store was opened
        return NotAStoreError(
            f"Cannot read the feature store {os.fspath(path)!r}: its dataset "
            f"{source.name!r} keeps its rows in the external file {external} "
            f"({EXTERNAL_ADVICE}): {' '.join(str(text).split())}. Restore that file; "
            "the store itself is not known to be damaged."
        )
    if missing:
        return StoreError(
            f"Cannot read the feature store {os.fspath(path)!r}: it is compressed with HDF5 "
            f"filters that this HDF5 cannot load ({', '.join(missing)}): "
            f"{' '.join(str(text).split())}. {PLUGIN_ADVICE}; the file itself is not known "
            "to be damaged."
        )
    return NotAStoreError(
        f"Cannot read {os.fspath(path)!r} as an HDF5 feature store (the file is damaged): "
        f"{' '.join(str(text).split())}. A file that cannot be read as a store is never "
        "replaced, not even with --force (overwrite=True): delete it yourself to extract "
        "it again, or write to another path."
    )


def read_structure(path: str | os.PathLike, f: h5py.File) -> list[str]:
    """The names in the open store ``f``, each object's header, each chunked dataset's
    chunk index and the attributes read (cheap: no data), or a NotAStoreError where the
    file is damaged."""
    try:
        names = sorted(f.keys())
        for name in names:
            # A link to another file, or a soft link to nothing (valid in a store that
            # another tool wrote, or that a user added to): not this file's structure, and
            # opening it is no read of this file (it opened another file, or failed).
            link = f.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                continue
            obj = f.get(name) if isinstance(link, h5py.SoftLink) else f[name]
            if isinstance(obj, h5py.Dataset):
                # (its type as HDF5 has it: one that NumPy has no equivalent of, as
                # H5T_TIME, is no damage, and load_features does not read it)
                obj.shape, obj.id.get_type()  # noqa: B018 (read from the object's header)
                # Counting the chunks walks every node of the index, no data: a damaged
                # node, which only a read of the rows met (a store reused as complete), is
                # found here; 0.3 ms for 1,563 chunks (100,000 rows). (h5py built against
                # HDF5 before 1.10.5 has no such count.)
                count = getattr(obj.id, "get_num_chunks", None)
                if obj.chunks is not None and count is not None:
                    count()
        read_attrs(f)
    except StoreError:
        raise
    except DAMAGE_ERRORS as error:
        raise damaged(path, error) from error
    return names


def _file_problem(path: str | os.PathLike) -> str | None:
    """Why an existing path is not a store written by mr2-extract, or None if it is one."""
    problem = _not_hdf5(path)
    if problem:
        return problem
    with open_store(path, "r") as f:
        names = read_structure(path, f)
        if "features" not in names or "format_version" not in f.attrs:
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
    except DAMAGE_ERRORS:  # (or opens, and its structures cannot be read)
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
    elif os.path.lexists(lock) and not stat.S_ISREG(os.stat(lock).st_mode):
        # (reading a FIFO would wait for a writer)
        problem = f"{lock!r} is not a regular file, where mr2-extract keeps its lock file"
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
    _check_output_text(text)
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


def _check_output_text(text: str) -> None:
    """Refuse an output path that is empty or names a folder by its form, before ``Path``
    reads "" as "." and drops a trailing separator (a store was written as the file
    ``feats`` for ``feats/``)."""
    if not text:
        raise StoreError("The output path is empty; give a file path such as 'features.h5'.")
    if text.endswith(tuple(filter(None, (os.sep, os.altsep)))):  # as cp reads a folder
        raise StoreError(
            f"The output {text!r} ends in {text[-1]!r}, as a folder's name does; give a file "
            f"path such as {os.path.join(text, 'features.h5')!r}."
        )


def output_target(path: str | os.PathLike) -> Path:
    """The file a store at ``path`` is written to: a symbolic link's target (written
    through, as the shell's ``>`` does), so that the store's temporary file, lock and
    atomic rename act on the target and not on the link; otherwise ``path`` itself (also
    where it cannot be looked at: in a folder that cannot be searched, which
    :func:`check_output` refuses by name, and not ``Path.is_symlink``'s PermissionError).
    A leading ``~`` is the home folder, as in the source's path (:func:`expand_home`)."""
    _check_output_text(os.fspath(path))
    path = Path(expand_home(os.fspath(path)))
    return Path(os.path.realpath(path)) if os.path.islink(path) else path


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


# Room that HDF5 takes at the end of a store to change its attributes: each attribute set,
# a new one or one written again, takes a block of a few KiB there.
ATTRS_ROOM = 1 << 16
NO_ROOM = "No space left to update the feature store"  # check_attrs_room's refusal begins so


def check_attrs_room(
    path: str | os.PathLike,
    left: str = "the store is left as it was",
    advice: str | None = "free some space, then run again",
) -> None:
    """Refuse to change the attributes of the existing store ``path`` where its folder has
    no room left for them: a write there that a full disk refused left the store unreadable
    (a --retry-failed on a full disk made a complete store "damaged"). ``left`` says what
    becomes of the store (one the caller removes is not left as it was); ``advice``, what
    to do (None where the caller gives its own: a rerun does not redo every write)."""
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if free < ATTRS_ROOM:
        raise StoreError(
            f"{NO_ROOM} {os.fspath(path)!r}: HDF5 needs about "
            f"{ATTRS_ROOM >> 10} KiB at the end of the file to change its attributes and its "
            f"folder has {free >> 10} KiB free" + (f"; {advice}" if advice else "") + f" ({left})."
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


# The cure for a shard given to merge_shards that cannot be merged: its overwrite is the
# merged store's, and it is the shard's rank that is extracted again.
_SHARD_CURE = "extract its rank again with --force (overwrite=True) before merging"


def check_format(path: str | os.PathLike, attrs: dict, shard: bool = False) -> None:
    """Refuse a store written in another format than this version's. ``shard``: one given
    to merge_shards, whose overwrite is the merged store's (it is its rank that is extracted
    again)."""
    version = attrs.get("format_version")
    if version == FORMAT_VERSION:
        return
    check_not_newer(path, attrs, shard)
    what, cure = (
        ("shard", _SHARD_CURE[0].upper() + _SHARD_CURE[1:])
        if shard
        else ("feature store", "Rebuild it with --force (overwrite=True)")
    )
    raise ProvenanceError(
        f"The {what} {os.fspath(path)!r} was written in store format {version} by an older "
        f"mr2-extract; this version writes format {FORMAT_VERSION}, which also records the "
        f"identity of every image. {cure}."
    )


def check_written(path: str | os.PathLike, f: h5py.File, shard: bool = False) -> None:
    """Refuse a store of this format that lacks a dataset every run writes, whose datasets
    disagree in length, or whose 'status' holds codes that are no row state (a dataset
    deleted or replaced by hand): a run resuming it raised h5py's KeyError, or read the
    rows wrongly. ``shard``: one given to merge_shards, whose overwrite is the merged
    store's (it is its rank that is extracted again)."""
    check_format(path, read_attrs(f), shard)
    problem = None
    missing = [name for name in STORE_DATASETS if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        problem = f"it has no {' / '.join(repr(m) for m in missing)} dataset"
    elif f["features"].ndim != 2 or f["class_names"].ndim != 1:
        name = "features" if f["features"].ndim != 2 else "class_names"
        problem = f"{name!r} {_has_shape(f[name])}"
    else:
        n = len(f["features"])
        for name in STORE_DATASETS:
            if name not in ("features", "class_names") and f[name].shape != (n,):
                problem = f"{name!r} {_has_shape(f[name])} for {n} feature rows"
                break
        else:
            unknown = np.setdiff1d(f["status"][()], [PENDING, DONE, FAILED])
            if len(unknown):
                problem = (
                    f"'status' holds codes {unknown.tolist()}, not {PENDING}, {DONE}, {FAILED}"
                )
    if problem:
        what, cure = ("shard", _SHARD_CURE) if shard else ("feature store", _REBUILD)
        raise NotAStoreError(f"The {what} {os.fspath(path)!r} is inconsistent: {problem}; {cure}.")


def _has_shape(dataset: h5py.Dataset) -> str:
    """ "has shape (…)", or of an empty dataspace (h5py.Empty), whose shape None said little."""
    if dataset.shape is None:
        return "is an empty dataspace (h5py.Empty: no rows)"
    return f"has shape {dataset.shape}"


def check_not_newer(path: str | os.PathLike, attrs: dict, shard: bool = False) -> None:
    """Refuse a store written by a newer mr2-extract, whose rows may mean other things.
    ``shard``: one given to merge_shards, whose output path is the merged store's (it is
    its rank that is extracted again)."""
    version = attrs.get("format_version")
    what, elsewhere = (
        ("shard", _SHARD_CURE) if shard else ("feature store", "write to another output path")
    )
    number = isinstance(version, int | float) and not isinstance(version, bool)
    # Not one number (an array of one, or text of one, is its number: read_attrs): a list,
    # text ("three"), a boolean, NaN. Called older, it was to be deleted with --force.
    if version is not None and not (number and version == version):
        raise ProvenanceError(
            f"The {what} {os.fspath(path)!r} records its format_version as {version!r}, "
            "not one number, so which store format it was written in is unknown; write it "
            f"as one number (this version writes format {FORMAT_VERSION}), or {elsewhere}."
        )
    # (a number of any kind: a tool that writes numbers as doubles, as MATLAB does, wrote 3.0)
    if number and version > FORMAT_VERSION:
        raise ProvenanceError(
            f"The {what} {os.fspath(path)!r} was written in store format {version} by "
            f"a newer mr2-extract (this one writes format {FORMAT_VERSION}); upgrade "
            f"mr2-probe, or {elsewhere}."
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
    existing, requested = with_defaults(existing), with_defaults(requested)
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
        if isinstance(err, PermissionError):  # the file's own mode (the folder's is checked)
            raise _no_permission(path, mode) from err
        if err.errno == errno.EROFS:  # (opened for writing: it was "not a store, delete it")
            raise StoreError(
                f"Cannot write the feature store {os.fspath(path)!r}: its file system is "
                "read-only; write the store to a folder you can write to."
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
    if (data[3][rows] != PENDING).any():
        # A retry's failed rows stay failed in the store until this write: pending first,
        # so that a run killed before their status is written leaves them to be
        # recomputed, not failed with another image's digest and reason.
        data[3][rows] = PENDING
        f.flush()
    data[0][rows] = features
    data[1][rows] = np.array([_truncate(r) for r in reasons], REASON_DTYPE)
    data[2][rows] = np.array([d.encode() for d in digests], DIGEST_DTYPE)
    f.flush()  # features reach the file before the rows are marked done
    data[3][rows] = status
    f.flush()
