"""Reading a feature store: its rows as arrays, held to its schema, without torch."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from mr2_probe._h5 import (
    _NAMED_FAILURES,
    EXTERNAL_ADVICE,
    file_named_as_folder,
    missing_external_file,
    missing_virtual_source,
    short_external_file,
    why_missing,
)

from ._locks import _lock_holder
from ._paths import expand_home, plural
from ._schema import (
    _REBUILD,
    _REQUIRED,
    DONE,
    FAILED,
    PENDING,
    IncompleteStoreError,
    NotAStoreError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    read_attrs,
)
from ._store import (
    DAMAGE_ERRORS,
    _not_hdf5,
    check_not_newer,
    damaged,
    open_store,
    read_structure,
)


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

    @classmethod
    def of(cls, X, rows: np.ndarray) -> RowView:
        """The rows ``rows`` (increasing) of ``X``, an ``h5py.Dataset`` or a row view of
        one, as one view of the dataset."""
        rows = np.asarray(rows, dtype=np.int64)
        return cls(X.dataset, X.rows[rows]) if isinstance(X, RowView) else cls(X, rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, tuple) and key and key[0] is not Ellipsis:
            rows = self[key[0]]
            if np.ndim(rows) < self.ndim:
                return rows[key[1:]]
            # Arrays of rows and of columns are paired, as NumPy pairs them (X[[9, 1],
            # [0, 5]] is X[9, 0] and X[1, 5]), not crossed.
            paired = np.ndim(key[0]) > 0 and any(np.ndim(k) > 0 for k in key[1:])
            first = np.arange(len(rows)) if paired else slice(None)
            return rows[(first, *key[1:])]
        if isinstance(key, tuple) or key is Ellipsis:
            return self[:][key]
        selected = self.rows[key]
        if np.ndim(selected) == 0:
            return self._read(int(selected))
        out = np.empty((len(selected), *self.shape[1:]), self.dtype)
        order = np.argsort(selected, kind="stable")
        ordered = selected[order]
        row_bytes = max(1, self.dtype.itemsize * int(np.prod(self.shape[1:])))
        block = max(1, self.BLOCK_BYTES // row_bytes)
        start = 0
        while start < len(ordered):  # a loop over blocks of the store, not over rows
            lo = int(ordered[start])
            stop = int(np.searchsorted(ordered, lo + block))
            part = self._read(slice(lo, int(ordered[stop - 1]) + 1))
            out[order[start:stop]] = part[ordered[start:stop] - lo]
            start = stop
        return out

    def _read(self, key):
        """``dataset[key]``; h5py's error reading a damaged file (a chunk index or a
        compressed chunk that cannot be read) a NotAStoreError naming the file."""
        try:
            return self.dataset[key]
        except (OSError, RuntimeError) as error:
            if not self.dataset.id.valid:  # a closed file, not a damaged one
                raise
            raise damaged(self.dataset.file.filename, error, self.dataset) from error

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
        problem = file_named_as_folder(text)
        if problem:  # ('s1.h5/': "does not exist", beside the store s1.h5)
            raise NotAStoreError(f"The feature store path {text!r} {problem}.")
        # (a link to a store moved away was said not to exist)
        raise StoreNotFoundError(
            f"The feature store {text!r} {why_missing(text)}; check the path, or write it "
            "with mr2-extract."
        )
    problem = _not_hdf5(text)
    if problem:
        raise NotAStoreError(
            f"{text!r} {problem}; pass an HDF5 feature store written by mr2-extract."
        )
    f = open_store(text, "r")
    try:
        found = read_structure(text, f)
    except BaseException:
        f.close()
        raise
    missing = [name for name in _REQUIRED if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        f.close()
        raise NotAStoreError(
            f"The HDF5 file {text!r} is not a feature store: it has no "
            f"{' / '.join(repr(m) for m in missing)} dataset (it holds {found}); pass a store "
            "written by mr2-extract, or write the missing datasets into it: any HDF5 file "
            "with 'features' (n, d), integer 'labels' (n,), codes 0..K-1, and 'class_names' "
            "(K,) text is read as one."
        )
    return f


_TEXT = ("paths", "failure_reason", "content_sha256")  # a store's string datasets


def _check_types(path: str | os.PathLike, f: h5py.File) -> None:
    """Refuse a dataset that load_features reads in a type NumPy has no equivalent of (as
    HDF5's H5T_TIME): reading it raised h5py's TypeError; or a link to nothing in its place
    (h5py's KeyError, which called the file damaged)."""
    for name in ("features", "labels", "class_names", "status", "indices", *_TEXT):
        if name not in f:
            continue
        link = f.get(name, getlink=True)
        if isinstance(link, h5py.SoftLink | h5py.ExternalLink) and f.get(name) is None:
            target = (
                f"{link.path!r} in {link.filename!r}"
                if isinstance(link, h5py.ExternalLink)
                else repr(link.path)
            )
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} is a link "
                f"to {target}, which cannot be opened (the file itself is not damaged); "
                "restore its target or rebuild the store."
            )
        if not isinstance(f[name], h5py.Dataset):  # (h5py's AttributeError or TypeError)
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} is a "
                f"{type(f[name]).__name__.lower()}, not a dataset; rebuild it."
            )
        missing = missing_virtual_source(path, f[name])
        if missing:
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} is a "
                f"virtual dataset whose source {missing}; restore the source file beside the "
                "store, or merge the shards into one store (merge_shards)."
            )
        missing = missing_external_file(f[name])
        if missing:
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} keeps its "
                f"rows in the external file {missing} ({EXTERNAL_ADVICE}); "
                "restore that file, or rebuild the store."
            )
        short = short_external_file(f[name])
        if short:
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} keeps its "
                f"rows in the external file {short}, which is cut short, and HDF5 reads the "
                "missing bytes as zeros without an error; restore the whole file, or rebuild "
                "the store."
            )
        try:
            f[name].dtype  # noqa: B018
        except TypeError:
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} has an HDF5 "
                f"type that NumPy has no equivalent of ({type(f[name].id.get_type()).__name__})"
                "; rebuild it."
            ) from None


def _check_shapes(
    path: str | os.PathLike, f: h5py.File, labels: np.ndarray, status: np.ndarray
) -> None:
    names = f["class_names"]
    n_classes = len(names) if names.ndim == 1 else 0
    problem = None
    if names.shape is None:  # (its ndim 0: "has shape None")
        problem = "'class_names' is an empty dataspace (h5py.Empty: no entries), not (n_classes,)"
    elif names.ndim != 1:
        problem = f"'class_names' has shape {names.shape}, not (n_classes,)"
    elif f["labels"].shape is None:  # (read as an object array: "has dtype object")
        problem = "'labels' is an empty dataspace (h5py.Empty: no rows), not (n_rows,) integers"
    elif labels.dtype.kind not in "iu":
        problem = f"'labels' has dtype {labels.dtype}, not integers (codes into class_names)"
    elif f["features"].shape is None:
        problem = "'features' is an empty dataspace (h5py.Empty: no rows), not (n_rows, n_features)"
    elif f["features"].ndim != 2:
        problem = f"'features' has shape {f['features'].shape}, not (n_rows, n_features)"
    elif f["features"].dtype.kind not in "bfiu":  # (booleans are 0 and 1, as in an array)
        problem = f"'features' has dtype {f['features'].dtype}, not numbers"
    elif labels.shape != (len(f["features"]),):
        problem = f"'labels' has shape {labels.shape} for {len(f['features'])} feature rows"
    elif len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        problem = f"'labels' holds values outside 0..{n_classes - 1} ({n_classes} class names)"
    elif h5py.check_string_dtype(names.dtype) is None:  # (an object dtype: vlen ints too)
        problem = f"'class_names' has dtype {names.dtype}, not strings"
    else:  # the optional datasets, one entry per row (a short 'status' dropped rows; one
        # of (N, 2) raised IndexError, and 'indices' or 'paths' of it loaded as such)
        for name in (name for name in ("status", "indices", *_TEXT) if name in f):
            if (f[name].shape or ()) != labels.shape:  # None: an empty dataspace
                problem = f"'{name}' has shape {f[name].shape} for {len(labels)} rows"
                break
            if name in _TEXT and h5py.check_string_dtype(f[name].dtype) is None:
                problem = f"'{name}' has dtype {f[name].dtype}, not strings"
                break
        unknown = np.setdiff1d(status, [PENDING, DONE, FAILED])
        if problem is None and len(unknown):
            problem = f"'status' holds codes {unknown.tolist()}, not {PENDING}, {DONE}, {FAILED}"
    if problem:
        raise NotAStoreError(
            f"The feature store {os.fspath(path)!r} is inconsistent: {problem}; rebuild it."
        )


def _text(path, f: h5py.File, name: str) -> np.ndarray:
    """A string dataset as str: UTF-8, as h5py writes str (its fixed-length byte strings,
    NumPy's ``S`` arrays that other tools write, read as ASCII by default)."""
    try:
        return f[name].asstr(encoding="utf-8")[()]
    except UnicodeDecodeError as error:
        raise NotAStoreError(
            f"The feature store {os.fspath(path)!r} is inconsistent: {name!r} holds text that "
            f"is not UTF-8 ({error.reason} at byte {error.start} of an entry); write it as "
            "UTF-8 (h5py writes Python str so)."
        ) from None


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
        If it is a folder, names a file as a folder (``s1.h5/``), empty, not HDF5,
        damaged (h5py cannot read its structures), lacks ``features`` / ``labels`` /
        ``class_names`` (or, written by mr2-extract, ``status`` / ``failure_reason`` /
        ``indices`` / ``paths``), their shapes disagree, or its labels are not integers
        (floats, booleans) or not codes into ``class_names`` (a value below 0 or from K on).
    StoreLockedError
        If a run is writing it (an incomplete store whose run holds its lock, too).
    IncompleteStoreError
        If rows are still pending and ``allow_incomplete`` is False.
    ProvenanceError
        If it was written in a newer store format than this version reads.

    All five derive from :class:`StoreError` (a ``ValueError``). A flag that is not True or
    False is a ``ValueError`` too.

    Examples
    --------
    >>> with load_features("features.h5") as store:  # doctest: +SKIP
    ...     clf.fit(store.features, store.labels)
    """
    for name, value in (("in_memory", in_memory), ("allow_incomplete", allow_incomplete)):
        # ('no' was taken as true: allow_incomplete="no" loaded an incomplete store)
        if not isinstance(value, bool | np.bool_):
            raise ValueError(
                f"The '{name}' parameter must be True or False. Got {value!r} instead."
            )
    path = expand_home(os.fspath(path))  # (as extract_features writes it)
    f = _open_for_reading(path)
    try:
        attrs = read_attrs(f)
        check_not_newer(path, attrs)  # older formats are read
        _check_types(path, f)
        # A store that mr2-extract wrote (every format) has these: one without 'status'
        # loaded its pending and failed rows as extracted (zeros), 'indices' or 'paths'
        # were made up as its row numbers.
        missing = [n for n in ("status", "failure_reason", "indices", "paths") if n not in f]
        if "format_version" in attrs and missing:
            raise NotAStoreError(
                f"The feature store {os.fspath(path)!r} is inconsistent: it was written by "
                f"mr2-extract (format {attrs['format_version']}) and has no "
                f"{' / '.join(repr(m) for m in missing)} dataset; {_REBUILD}."
            )
        # [()] reads a scalar dataset too, which _check_shapes refuses by its shape.
        labels = np.asarray(f["labels"][()])
        n = labels.size
        status = np.asarray(f["status"][()]) if "status" in f else np.full(n, DONE, np.uint8)
        _check_shapes(path, f, labels, status)
        n_pending = int((status == PENDING).sum())
        # (HDF5's own lock off, as on NFS: the run's lock, beside a link's target, tells)
        holder = (
            _lock_holder(os.path.realpath(path)) if n_pending and not allow_incomplete else None
        )
        if holder:
            raise StoreLockedError(
                f"The feature store {os.fspath(path)!r} is being written by another process "
                f"(pid {holder}): {n_pending} of {len(status)} rows are not extracted yet; "
                "wait for it to finish (from Python, load_features(..., "
                "allow_incomplete=True) loads the completed rows)."
            )
        if n_pending and not allow_incomplete:
            raise IncompleteStoreError(
                f"The feature store {os.fspath(path)!r} has {n_pending} of {len(status)} rows "
                "not extracted yet; run the same extraction command again to finish it (from "
                "Python, load_features(..., allow_incomplete=True) loads the completed rows)."
            )
        if n_pending:
            n_done = int((status == DONE).sum())
            warnings.warn(
                f"Loading {n_done} completed {plural(n_done, 'row')} of an incomplete store "
                f"({n_pending} {plural(n_pending, 'row')} pending).",
                UserWarning,
                stacklevel=2,
            )
        rows = np.flatnonzero(status == DONE)
        if "paths" in f:
            all_paths = _text(path, f, "paths")
        else:
            all_paths = np.array([str(i) for i in range(n)], dtype=object)
        failed = np.flatnonzero(status == FAILED)
        reasons = f["failure_reason"][failed] if "failure_reason" in f else [b""] * len(failed)
        indices = f["indices"][:] if "indices" in f else np.arange(n, dtype=np.int64)
        store = FeatureStore(
            features=f["features"] if len(rows) == len(status) else RowView(f["features"], rows),
            labels=labels[rows],
            class_names=list(_text(path, f, "class_names")),
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
        if (partial := _one_shard_of_several(path, attrs)) is not None:
            warnings.warn(partial, UserWarning, stacklevel=2)
    except StoreError:
        f.close()
        raise
    except DAMAGE_ERRORS as error:  # h5py's, reading a damaged file's structures or data
        problem = damaged(path, error, f)
        f.close()
        raise problem from error
    except BaseException:
        f.close()
        raise
    if in_memory:
        try:  # closed whatever happens, a MemoryError included
            store.features = np.asarray(store.features)
        except DAMAGE_ERRORS as error:
            # (the features' filters: another dataset's, never read, is no reason)
            dataset = getattr(store.features, "dataset", store.features)
            raise damaged(path, error, dataset) from error
        finally:
            store.close()
        store.file = None
    return store


# shard_path's names: <stem>.shard-RRRRR-of-WWWWW<suffix> beside <stem><suffix>.
_SHARD_NAME = re.compile(r"(?P<stem>.+)\.shard-\d+-of-\d+(?P<suffix>(\.[^.]*)?)")
#: What load_features' warning for one rank's shard starts with, as a filter's message:
#: ``warnings.filterwarnings("ignore", ONE_SHARD)`` (mr2-probe reads shards knowingly).
ONE_SHARD = r"The feature store .* is shard \d+ of \d+ of one extraction"


def _one_shard_of_several(path: str, attrs: dict) -> str | None:
    """A warning for a shard of a run at several ranks whose merged store, or another
    shard, lies beside it: loaded, it gave that rank's rows alone, without a word. None
    for a store of every row, or a shard alone (moved, or copied apart knowingly)."""
    path = os.fsdecode(path)  # (a path given as bytes too)
    rank, world = attrs.get("shard_rank"), attrs.get("shard_world_size")
    name = _SHARD_NAME.fullmatch(os.path.basename(path))
    if not isinstance(world, int) or world < 2 or name is None:
        return None
    from ._merge import shards_beside  # (it reads shards with this module's reader)

    merged = os.path.join(os.path.dirname(path), name["stem"] + name["suffix"])
    others = [
        other
        for other in shards_beside(merged)
        if f"-of-{world:05d}" in other.name and other.name != os.path.basename(path)
    ]
    if not os.path.isfile(merged) and not others:
        return None
    n, total = attrs.get("n_rows"), attrs.get("n_total_rows")
    rows = f"{n} of the {total} rows" if isinstance(n, int) and isinstance(total, int) else "rows"
    said = (
        f"The feature store {path!r} is shard {rank} of {world} of one extraction: it holds "
        f"that rank's {rows} only"
    )
    if os.path.isfile(merged):
        return f"{said}. Load the merged store {merged!r} for every row."
    return (
        f"{said}. Merge the shards into one store for every row: extract.merge_shards("
        f"[extract.shard_path({merged!r}, r, {world}) for r in range({world})], {merged!r})."
    )


def failed_rows(f: h5py.File) -> list[tuple[int, str, str]]:
    """``(row, path, reason)`` of the first failed rows of the open store ``f``, in row
    order, at most as many as a message names."""
    failed = np.flatnonzero(f["status"][:] == FAILED)[:_NAMED_FAILURES]
    paths = f["paths"].asstr(encoding="utf-8", errors="replace") if "paths" in f else None
    return [
        (
            int(i),
            paths[i] if paths is not None else str(i),
            f["failure_reason"][i].decode(errors="replace") if "failure_reason" in f else "",
        )
        for i in failed
    ]
