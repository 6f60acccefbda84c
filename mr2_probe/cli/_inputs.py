"""``mr2-probe``'s input files: features and labels read, and data that cannot be one task
refused."""

from __future__ import annotations

import difflib
import os
import sys
import unicodedata
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from sklearn.model_selection import StratifiedKFold, train_test_split

from .._data import block_rows, is_h5_dataset, read_h5
from .._h5 import file_named_as_folder, name_failures, why_missing
from .._offsets import offsets_splits
from ..front import OFFSETS_CV, check_offsets_folds
from ._usage import UsageError, _few, _one_line

_FORMATS = (".h5", ".hdf5", ".npz", ".npy")
_STORE = (".h5", ".hdf5")
_NPY, _NPZ = (b"\x93NUMPY",), (b"PK\x03\x04", b"PK\x05\x06")  # their first bytes (a zip)


def feature_format(path) -> str:
    """A feature file's format as a suffix of ``_FORMATS``: what its content is (a store
    that mr2-extract wrote under any name, ``feats.npz`` too, by h5py's own test; a NumPy
    file by its magic bytes), else its own suffix (whose reader then says what is wrong
    with the file); '' where neither tells."""
    suffix = Path(path).suffix.lower()
    known = suffix if suffix in _FORMATS else ""
    if not os.path.isfile(path):  # (a FIFO's open waits for a writer, for ever)
        return known
    try:
        with open(path, "rb") as file:
            magic = file.read(6)
    except OSError:  # missing, a folder: load_xy says which
        return known
    if magic.startswith(_NPY):
        return ".npy"
    if magic.startswith(_NPZ):
        return ".npz"
    try:
        import h5py
    except ImportError:  # no store can be read without it
        return known
    # (mr2-extract writes its store under the name given, features.npz as well: read by
    # the suffix, it was refused as "not a NumPy file".)
    return ".h5" if h5py.is_hdf5(path) else known


def _load_features(path, **kwargs):
    """``extract.load_features``, quiet about a shard of one rank: mr2-probe reads shards
    as stores knowingly (one rank's shard to train on, another's to test on; report.json
    records each store's shard_rank and shard_world_size)."""
    from extract import load_features
    from extract._reading import ONE_SHARD

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ONE_SHARD, UserWarning)
        return load_features(path, **kwargs)


# What report.json records of a store, so that a per-class result can be traced to the
# features it was measured on.
_RECORDED_PROVENANCE = (
    "backbone", "weights", "preprocessing", "compute", "dtype", "normalize", "source",
    "source_root", "source_fingerprint", "shard_rank", "shard_world_size",
)  # fmt: skip


def _sources(args) -> dict:
    """Each input file's absolute path and, for a store, its provenance and the failed
    images left out (the test set's, or None for one held out of the training data)."""

    def record(path, labels_path) -> dict:
        entry = {"path": os.path.abspath(path)}
        if labels_path is not None:
            entry["labels"] = os.path.abspath(labels_path)
        if feature_format(path) in _STORE:
            with _load_features(path) as store:
                metadata, failed = store.metadata, len(store.failures)
            entry["provenance"] = {k: metadata[k] for k in _RECORDED_PROVENANCE if k in metadata}
            entry["failed_images_left_out"] = failed
        return entry

    test = None if args.test is None else record(args.test, args.test_labels)
    return {"train": record(args.train, args.labels), "test": test}


def _inputs_record(sources: dict, args, y, y_test, names) -> dict:
    """What the report was measured on: the files (:func:`_sources`) and how many samples
    of each class it counted; for a held-out test set, the split that made it."""

    def counts(labels) -> dict:
        values, n = np.unique(labels, return_counts=True)
        shown = values if names is None else np.asarray(names, dtype=object)[values]
        return {str(v): int(k) for v, k in zip(shown, n, strict=True)}

    train = sources["train"] | {"samples": int(len(y)), "samples_per_class": counts(y)}
    test = sources["test"] or {
        "held_out_of": train["path"],
        "test_size": args.test_size,
        "seed": args.seed,
    }
    test = test | {"samples": int(len(y_test)), "samples_per_class": counts(y_test)}
    return {"train": train, "test": test}


def load_xy(path: str, labels: str | None = None, labels_option: str = "--labels"):
    """Features, labels and class names from an HDF5 store, a .npz or a .npy file.

    Returns ``(X, y, class_names)``: the labels as the file holds them (a store's integer
    codes 0..K-1; a .npz's integer labels as the names its ``class_names`` or
    ``target_names`` list, the k-th naming code k; text labels, which those names must
    list) and the store's class names (``None``
    for NumPy files). Every problem with
    the file raises a :class:`UsageError` or an ``extract.StoreError`` (both ValueErrors)
    with a one-line message.
    """
    return _load_xy(path, labels, labels_option)


def _load_xy(path: str, labels=None, labels_option: str = "--labels", stack=None):
    """:func:`load_xy`; with ``stack`` (a contextlib.ExitStack) a store's features larger
    than :func:`in_memory_limit` stay in the file, which ``stack`` closes: X is its
    ``h5py.Dataset`` (a row view of its completed rows where images failed), checked a
    block at a time, never read whole (floating-point features; integers are read,
    computed in float64 as arrays are). Smaller ones are read into memory."""
    suffix = feature_format(path)
    if suffix not in _STORE:  # (a store's reader says so itself)
        for named, option in ((path, None), (labels, labels_option)):
            if named is not None:
                _check_regular(named, option)
    if not suffix:
        if not os.path.exists(path):
            raise _not_there(path)
        if os.path.isdir(path):  # images, most likely
            raise UsageError(
                f"{path!r} is a folder; mr2-probe reads features: extract a folder of images "
                f"into a store first (mr2-extract {path} BACKBONE features.h5)"
            )
        raise UsageError(
            f"unknown feature file type {Path(path).suffix or '(none)'!r} ({path}): neither "
            "a store from mr2-extract (HDF5, .h5) nor .npz (X and y) or .npy (with --labels)"
        )
    names = store = None
    if suffix in _STORE:
        X, y, names, store = _load_store(path, stack)
        source = path
    elif suffix == ".npz":
        X, y = _read(path, _load_npz)
        source = path
    else:
        if not os.path.exists(path):  # (it was said to hold features only)
            raise _not_there(path)
        if labels is None:
            what = (  # (a .npy under a .npz name, read as the .npy it is)
                "holds one array, not a .npz archive of X and y"
                if Path(path).suffix.lower() == ".npz"
                else "holds features only"
            )
            raise UsageError(f"{path} {what}; pass {labels_option} FILE.npy")
        X, y = _read(path, _load_npy), _read(labels, _load_npy, labels_option)
        source = f"{path} with labels {labels}"
    X = X if _lazy(X) else np.asarray(X)
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:  # a column: one label per row, as scikit-learn reads it
        print(
            f"mr2-probe: warning: the labels of {source} are a column of shape {y.shape}, read "
            f"as one label per row; save them with shape ({len(y)},) (y.ravel())",
            file=sys.stderr,
        )
        y = y.ravel()
    if y.dtype.kind == "S":  # bytes, which scikit-learn refuses as labels: their text
        try:
            y = np.char.decode(y, "utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"the labels of {source} are bytes that are not UTF-8 text") from error
    _check_xy(X, y, source, store)
    if y.dtype.kind == "f":  # whole numbers below 2**53 now: class indices
        # One spelling per class: float labels 0.0 were keyed "0.0" in the report where
        # the other file's integer labels were "0".
        y = y.astype(np.int64)
    held = _held_dtype(X.dtype)
    if held != X.dtype and not _lazy(X):  # (a store's blocks are, as they are read)
        X = X.astype(held)
    return X, y, names


def _held_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype that features of ``dtype`` are held in once read into memory
    (:func:`_load_xy`): float16 as float32, as scikit-learn's StandardScaler scales in the
    features' dtype, where a float16 value overflows past 65504 (a row 1,000 away from a
    column's mean where its standard deviation is 0.01); any other as it is (integers too,
    which the estimators compute in float64)."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _streams(dtype: np.dtype) -> bool:
    """Whether a store's features of ``dtype`` stay in its file above the limit, where the
    run streams (:func:`_load_store`): floating-point ones; integers are read whole."""
    return dtype.kind == "f"


def _check_regular(path: str, labels_option: str | None) -> None:
    """Refuse a pipe, a device or a socket (``<(cat features.npz)``, a FIFO) as a NumPy
    file: its open waited for a writer for ever, or it was read in part and then called
    "not a NumPy file" (the file is opened twice)."""
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        what = f"{labels_option} {path!r}" if labels_option else repr(path)
        raise UsageError(
            f"{what} is not a regular file (a pipe, a FIFO, a device or a socket), which "
            "mr2-probe cannot read: save it to a file first"
        )


def _not_there(path: str) -> UsageError:
    """The error for a file to read that is not there: ``s1.npz/`` names the file s1.npz
    as a folder (said not to exist, beside it); a link, where its chain of links ends."""
    problem = file_named_as_folder(path) or f"{why_missing(path)}; check the path"
    return UsageError(f"{path!r} {problem}")


def _read(path: str, reader, labels_option: str | None = None):
    """``reader(path)``, its failures one line each; ``labels_option``: the option that
    named ``path`` as a labels file (--labels, --test-labels)."""
    if not os.path.exists(path):
        raise _not_there(path)
    try:
        with open(path, "rb") as file:
            magic = file.read(6)
        # np.load reads anything else as a pickle, whose error would talk of allow_pickle.
        if not magic.startswith(_NPZ + _NPY):
            raise UsageError(
                f"{labels_option} {path!r} is not a NumPy file; save the labels with "
                "numpy.save (.npy)"
                if labels_option
                else f"{path!r} is not a NumPy file; write features with numpy.save (.npy) or "
                "numpy.savez (.npz)"
            )
        return reader(path)
    except UsageError:
        raise
    except Exception as error:  # a foreign or damaged file fails in many ways (zip, pickle)
        if "allow_pickle" in str(error):  # an object array, which only a pickle holds
            raise _objects(path, labels=bool(labels_option)) from error
        raise UsageError(
            f"cannot read {path!r} as {Path(path).suffix or 'a NumPy file'}: "
            f"{type(error).__name__}: {_one_line(error)}"
        ) from error


def _objects(path: str, labels: bool, key: str | None = None) -> UsageError:
    """The error for an array of Python objects (which only a pickle holds) in ``path``:
    the labels' or the features' (its ``key`` in a .npz)."""
    where = f"{path!r} holds {'its ' + repr(key) + ' as ' if key else ''}an array of Python objects"
    save = f"numpy.savez(path, X=X, {key}=" if key else "numpy.save(path, "
    remedy = (
        "(as numpy.save writes a pandas column of text), which needs pickle to read and is "
        f"not read: save the labels as text or numbers, e.g. {save}labels.astype(str))"
        if labels
        else "(as numpy.save writes rows of unequal lengths), which needs pickle to read and "
        "is not read: save the features as one 2-D array of numbers"
    )
    return UsageError(f"{where} {remedy}")


def _load_npy(path: str):
    data = np.load(path, allow_pickle=False)
    if isinstance(data, np.lib.npyio.NpzFile):
        data.close()
        raise UsageError(f"{path} is a .npz archive, not a single array (.npy)")
    return data


def _load_npz(path: str):
    data = np.load(path, allow_pickle=False)
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise UsageError(f"{path} holds one array, not a .npz archive of X and y")
    with data:
        # Names, not ``key in data``: NumPy 1.24 reads the array to tell (an object
        # array's error then named neither the array nor whether it held the labels).
        for pair in (("X", "features"), ("y", "labels")):
            if set(pair) <= set(data.files) and _rival(data, *pair):
                raise UsageError(
                    f"{path} holds both {pair[0]!r} and {pair[1]!r}, other arrays of as many "
                    "rows; keep one pair, X and y or features and labels (found "
                    f"{sorted(data.files)})"
                )
        x_key = _npz_x_key(data.files)
        y_key = "y" if "y" in data.files else "labels"
        if {x_key, "y", "labels"} <= set(data.files):
            rows = {key: _row_count(data, key) for key in ("y", "labels", x_key)}
            if rows["labels"] == rows[x_key] != rows["y"]:  # y: class names, say
                y_key = "labels"
        if x_key not in data.files or y_key not in data.files:
            raise UsageError(
                f"{path} must hold arrays X and y (or features and labels); "
                f"found {sorted(data.files)}"
            )
        arrays = []
        for key in (x_key, y_key):
            try:
                arrays.append(data[key])
            except ValueError as error:
                if "allow_pickle" not in str(error):
                    raise
                raise _objects(path, labels=key == y_key, key=key) from error
        named = next((key for key in _NAME_KEYS if key in data.files), None)
        codes = _as_class_codes(arrays[1]) if named is not None else None
        if codes is not None:
            arrays[1] = _named(path, data, named, codes, y_key)
        elif named is not None:
            _check_text_named(path, data, named, arrays[1], y_key)
        return tuple(arrays)


# Names of the integer labels' classes in a .npz, the k-th naming code k, as a store's
# class_names (scikit-learn's datasets call them target_names).
_NAME_KEYS = ("class_names", "target_names")


def _as_class_codes(labels: np.ndarray):
    """Labels that a .npz's class names can name, as integer codes: integers, whole numbers
    (class indices, as :func:`_load_xy` reads them) and booleans (False and True: 0 and 1);
    None for text, or numbers that are no codes (refused as labels later)."""
    if labels.dtype.kind in "iu":
        return labels
    if labels.dtype.kind == "b":
        return labels.astype(np.int64)
    if labels.dtype.kind == "f" and np.isfinite(labels).all() and (labels % 1 == 0).all():
        return labels.astype(np.int64)
    return None


def _named(path: str, data, key: str, codes: np.ndarray, y_key: str) -> np.ndarray:
    """The labels ``codes`` as the class names that ``data[key]`` lists, one per code."""
    names = _class_names(path, data, key, y_key)
    if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
        what = (  # (an empty list said "codes outside 0..-1")
            f"{path}'s {y_key!r} holds codes outside 0..{len(names) - 1}, the classes that its "
            f"{key!r} names"
            if len(names)
            else f"{path}'s {key!r} is empty, naming none of the classes of {y_key!r}"
        )
        raise UsageError(f"{what}; save the names of every class, the k-th naming code k")
    return names[codes]


def _check_text_named(path: str, data, key: str, labels: np.ndarray, y_key: str) -> None:
    """Refuse text labels that the class names ``data[key]`` beside them do not all name
    (compared in NFC, as names are matched): they were read as they are, and the names
    left unread without a word. Labels of other kinds are refused as labels later."""
    if labels.dtype.kind not in "US":
        return
    names = _class_names(path, data, key, y_key)
    try:
        values = np.unique(np.char.decode(labels, "utf-8") if labels.dtype.kind == "S" else labels)
    except UnicodeDecodeError:  # (refused as labels, by _load_xy)
        return
    known = {_nfc(name) for name in names.tolist()}
    unnamed = [value for value in values.tolist() if _nfc(value) not in known]  # classes
    if unnamed:
        raise UsageError(
            f"{path}'s {y_key!r} holds {len(unnamed)} class name{'s' if len(unnamed) > 1 else ''} "
            f"that its {key!r} does not list ({_few(unnamed)}): text labels must be among "
            f"those names; save {key!r} with the name of every class, or leave it out"
        )


def _class_names(path: str, data, key: str, y_key: str) -> np.ndarray:
    """The class names that ``data[key]`` lists, as str, checked to be text and distinct."""
    try:
        names = data[key]
    except ValueError as error:
        raise _objects(path, labels=True, key=key) from error
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise UsageError(
            f"{path}'s {key!r} must list the classes' names as text, the k-th naming code k "
            f"of {y_key!r}; found an array of {names.dtype} of shape {names.shape}"
        )
    if names.dtype.kind == "S":
        try:
            names = np.char.decode(names, "utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"{path}'s {key!r} holds bytes that are not UTF-8 text") from error
    unique, counts = np.unique(names, return_counts=True)
    if (counts > 1).any():
        raise UsageError(
            f"{path}'s {key!r} names two classes {str(unique[counts > 1][0])!r}; give each "
            "class a name of its own"
        )
    return names


def _rival(data, key: str, other: str) -> bool:
    """Whether an archive's ``other`` could be meant instead of its ``key`` (X read, where
    features too could be the rows' features): another array of as many rows. (Class names
    saved as ``labels`` beside X and y are not: they have a row per class; nor is anything
    beside a scalar ``key``, refused by its shape.)"""
    try:
        first, second = data[key], data[other]
    except ValueError:  # an array of objects: not read as either (refused when it is key)
        return False
    if np.ndim(first) == 0 or np.ndim(second) == 0:
        return False
    # (NaN equal to NaN: a copy of X with a NaN row is the same array, refused for its NaN.)
    floats = first.dtype.kind in "fc" and second.dtype.kind in "fc"
    return len(first) == len(second) and not np.array_equal(first, second, equal_nan=floats)


def _row_count(data, key: str) -> int | None:
    """The rows of an archive's array ``key``; None for a scalar or an array of objects."""
    try:
        array = data[key]
    except ValueError:
        return None
    return len(array) if np.ndim(array) else None


def _lazy(X) -> bool:
    """Whether X is a store's features left in its file (:func:`_load_xy`'s ``stack``)."""
    return not isinstance(X, np.ndarray) and is_h5_dataset(X)


def _load_store(path: str, stack=None):
    try:  # (h5py with it)
        from extract import load_features  # noqa: F401
    except ImportError as error:  # the extract extra is optional
        raise UsageError(
            'reading HDF5 stores needs the extract extra: pip install "mr2-probe[extract]"'
        ) from error
    # StoreError: a one-line ValueError. Integer features are read into memory, as arrays:
    # a store's are computed in float32, an array of integers in float64. So are features
    # that fit in memory (a quarter of it, as a fit may hold a float32 copy beside them):
    # each pass over a streamed store reads the file again, about three times the fit's
    # time here. Those read are closed at once.
    store = _load_features(path)
    # (their bytes in memory, float16 read as float32: the limit on their bytes in the file
    # read a float16 store of up to half of memory whole; counted as the line of inputs out
    # of memory counts them)
    values, dtype = _store_values(store.file)
    streamed = stack is not None and _stays_in_file(
        dtype, _held_bytes(values, dtype), in_memory_limit()
    )
    if streamed:
        stack.enter_context(store)
    else:
        store.close()
        store = _load_features(path, in_memory=True)
    if store.failures:
        n = len(store.failures)
        images = (
            "1 image failed extraction and is"
            if n == 1
            else f"{n} images failed extraction and are"
        )
        print(
            f"mr2-probe: warning: {path}: {images} left out {name_failures(n, store.failures[:1])}",
            file=sys.stderr,
        )
    X = store.features if streamed else np.asarray(store.features)
    return X, np.asarray(store.labels), list(store.class_names), store


# Where the control groups are (a container's own at their root), and which the process is
# in: cgroup v2's "0::/PATH" and v1's "N:memory:/PATH" lines.
_CGROUP_ROOT, _PROC_CGROUP = "/sys/fs/cgroup", "/proc/self/cgroup"


def in_memory_limit() -> int:
    """The most bytes of a store's features that ``mr2-probe`` reads into memory: a quarter
    of the memory it may use, the machine's physical memory or its control group's cap
    where lower (1 GiB where the system says neither); larger ones are read a block at a
    time by every fit and prediction."""
    memory = []
    try:
        memory.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # no sysconf, or not these names
        pass
    memory += _cgroup_caps()
    return min(memory) // 4 if memory else 1 << 30


def _cgroup_caps() -> list[int]:
    """The memory caps of the process's control group and of each group above it (the
    lowest binds): cgroup v2's memory.max, v1's memory.limit_in_bytes. A batch job's group
    lies below the root (Slurm's /slurm/uid_1000/job_42, a systemd service's slice), whose
    file alone was read: its cap went unseen. "max", or v1's huge number, is no cap (the
    machine's memory is lower)."""
    try:
        with open(_PROC_CGROUP) as file:
            lines = file.read().splitlines()
    except OSError:
        lines = []
    v2, v1 = ["/"], ["/"]  # the root's too: a container's own groups, whatever it says
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if not controllers:
            v2.append(path)
        elif "memory" in controllers.split(","):
            v1.append(path)
    files = set()
    for folder, name, paths in (
        (_CGROUP_ROOT, "memory.max", v2),
        (os.path.join(_CGROUP_ROOT, "memory"), "memory.limit_in_bytes", v1),
    ):
        for path in paths:
            parts = [part for part in path.split("/") if part and part != ".."]
            files |= {os.path.join(folder, *parts[:k], name) for k in range(len(parts) + 1)}
    caps = []
    for path in sorted(files):  # (a few groups: the depth of the process's)
        try:
            with open(path) as file:
                caps.append(int(file.read().strip()))
        except (OSError, ValueError):  # not there, or "max"
            continue
    return caps


class _Features(NamedTuple):
    """An input file's features, for the line of inputs that ran out of memory."""

    path: str  # as given
    held: int | None  # their bytes once read into memory, which the limit is set on
    stored: int | None  # their bytes as the file holds them (None where it cannot tell)
    dtype: np.dtype | None  # as the file holds them
    store: bool  # an HDF5 store, else a .npz or .npy (always read whole)

    @property
    def as_float32(self) -> int | None:
        """Their bytes as float32 (a store of float32 in the file's place)."""
        if self.held is None:
            return None
        return self.held // _held_dtype(self.dtype).itemsize * 4


def _features_sizes(args) -> tuple[int, list[_Features]]:
    """:func:`in_memory_limit`, and each input file's features (--train's, then --test's),
    for the line of inputs that ran out of memory."""
    sizes = []
    for path in (args.train, args.test):
        if path is None:
            continue
        suffix, count, dtype = feature_format(path), None, None
        try:
            if suffix in _STORE:
                count, dtype = _store_features(path)
            elif suffix == ".npz":
                with zipfile.ZipFile(path) as archive, archive.open(_npz_x_member(archive)) as x:
                    count, dtype = _npy_features(x)
            elif suffix == ".npy":
                with open(path, "rb") as file:
                    count, dtype = _npy_features(file)
        except Exception:  # untold, memory that ran out again too: the line goes without it
            pass
        held = stored = None
        if dtype is not None:
            held, stored = _held_bytes(count, dtype), count * dtype.itemsize
        sizes.append(_Features(path, held, stored, dtype, suffix in _STORE))
    return in_memory_limit(), sizes


def _store_features(path: str) -> tuple[int, np.dtype]:
    """How many of a store's feature values a run reads (its completed rows', as
    :func:`_load_store` counts them) and their dtype in the file, from the file's shapes
    and status alone: load_features reads every row's path as well (seconds and hundreds
    of MiB for millions of rows, where memory has just run out)."""
    from extract._store import open_store

    with open_store(path, "r") as f:
        return _store_values(f)


def _store_values(f) -> tuple[int, np.dtype]:
    """How many feature values a run reads of an open store ``f`` (an h5py.File), its
    completed rows' (:func:`_completed_rows`), and their dtype in the file: one count for
    the run's choice to stream the store (:func:`_load_store`) and the line of inputs out
    of memory (:func:`_store_features`), so that the line says what the run did."""
    features = f["features"]
    row = int(np.prod(features.shape[1:], dtype=np.int64))
    return len(_completed_rows(f)) * row, features.dtype


def _held_bytes(values: int, dtype: np.dtype) -> int:
    """The bytes of ``values`` features of ``dtype`` once read into memory
    (:func:`_held_dtype`: float16 as float32), which the limit is set on."""
    return values * _held_dtype(dtype).itemsize


def _stays_in_file(dtype: np.dtype, held: int, limit: int) -> bool:
    """Whether a store's features of ``dtype``, ``held`` bytes in memory, stay in its file
    where the run streams: floating-point ones above ``limit``."""
    return _streams(dtype) and held > limit


def _completed_rows(f) -> np.ndarray:
    """The store rows that a run reads of an open store ``f`` (an h5py.File): its completed
    ones, as load_features keeps them (every row where it records no status)."""
    from extract._schema import DONE

    if "status" not in f:
        return np.arange(len(f["features"]))
    return np.flatnonzero(f["status"][()] == DONE)


def _in_bytes(size: int) -> str:
    """``size`` bytes in binary units, as an allocator says them: 960 B, 1.5 GiB."""
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    scaled = [size / 1024 ** (k + 1) for k in range(len(units))]
    shown = [(value, unit) for value, unit in zip(scaled, units, strict=True) if value >= 1]
    if not shown:
        return f"{size} B"
    value, unit = shown[-1]
    return f"{value:.1f} {unit}"


def _npz_x_key(files) -> str:
    """The name of a .npz's array that :func:`_load_npz` reads as X, among its ``files``
    (``NpzFile.files``: its members' names, less .npy): X, else features."""
    return "X" if "X" in files else "features"


def _npz_x_member(archive: zipfile.ZipFile) -> str:
    """The archive's member that :func:`_load_npz` reads as X, found as ``NpzFile`` finds
    it (a member named X, else X.npy; features' where there is no X), whose opening
    raises KeyError where the archive holds neither."""
    names = archive.namelist()
    key = _npz_x_key([name.removesuffix(".npy") for name in names])
    return key if key in names else f"{key}.npy"


def _npy_features(file) -> tuple[int, np.dtype]:
    """How many values the array of a .npy file holds, and their dtype, from its header
    (the array not read)."""
    version = np.lib.format.read_magic(file)
    read = np.lib.format.read_array_header_1_0
    if version != (1, 0):
        read = np.lib.format.read_array_header_2_0
    shape, _, dtype = read(file)
    return int(np.prod(shape, dtype=np.int64)), dtype


def _check_xy(X: np.ndarray, y: np.ndarray, source: str, store=None) -> None:
    """Refuse data that cannot be fitted; a store's (extract.FeatureStore) rows are named
    by store row and image."""
    if X.ndim != 2:
        raise UsageError(
            f"the features of {source} must be a 2-D array (samples × features); got shape "
            f"{X.shape}"
        )
    if y.ndim != 1:
        raise UsageError(f"the labels of {source} must be a 1-D array; got shape {y.shape}")
    if y.dtype.kind == "V":  # (fitted, then a TypeError's traceback in the report)
        raise UsageError(
            f"the labels of {source} are records of dtype {y.dtype}, not classes; give class "
            "labels (integers or text), such as one field of the records"
        )
    if len(X) != len(y):
        raise UsageError(
            f"{source}: {len(X)} rows of features but {len(y)} labels; each row needs one label"
        )
    if not len(y):
        raise UsageError(f"{source} holds no samples")
    if not X.shape[1]:
        raise UsageError(f"{source} holds no features (its rows have 0 columns)")
    # (Booleans are numbers to the estimators and scikit-learn; complex numbers are no
    # probe's, nor text or dates.)
    if X.dtype.kind not in "biuf":
        raise UsageError(f"the features of {source} must be real numbers; got dtype {X.dtype}")
    bad = _nonfinite_rows(X)
    if len(bad):
        first, rows, remedy = f"row {bad[0]}", "rows", ""
        if store is not None:
            first = f"store row {store.rows[bad[0]]}, {store.paths[bad[0]]!r}"
            rows, remedy = "completed rows", "extract them again, or "
        raise UsageError(
            f"{source}: {len(bad)} of {len(X)} {rows} hold NaN or infinite features (the "
            f"first is {first}); {remedy}drop or impute them first"
        )
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise UsageError(f"{source}: some labels are NaN or infinite; every row needs a class")
    fractions = np.flatnonzero(y != np.round(y)) if y.dtype.kind == "f" else []
    if y.dtype.kind == "c" or len(fractions):
        kind, example = ("complex", y[0]) if y.dtype.kind == "c" else ("real", y[fractions[0]])
        raise UsageError(
            f"{source}: the labels are {kind} numbers, such as {example.item()!r}, not "
            "classes; give class labels (integers or text)"
        )
    # (2**53 in float16 overflows, with NumPy's RuntimeWarning: compared as a Python float)
    if y.dtype.kind == "f" and float(np.abs(y).max()) >= 2**53:
        # Not read as integers (float64 no longer tells neighbouring ones apart there), they
        # failed after the first "fitting" line, in scikit-learn's words ("Unknown label
        # type: continuous").
        largest = y[np.argmax(np.abs(y))]
        raise UsageError(
            f"{source}: the labels are floats as large as {largest.item()!r}; float labels "
            "must be whole numbers below 2**53 in magnitude: give class labels as integers "
            "or text"
        )


def _nonfinite_rows(X) -> np.ndarray:
    """The rows of X that hold NaN or infinity; a store's features read a block at a time,
    the estimators' blocks (:func:`~mr2_probe._data.block_rows`)."""
    if not _lazy(X):
        return np.flatnonzero(~np.isfinite(X).all(axis=1))
    step = block_rows(X.shape[1], 1)
    bad = [
        start
        + np.flatnonzero(~np.isfinite(np.asarray(read_h5(X, slice(start, start + step)))).all(1))
        for start in range(0, X.shape[0], step)  # a loop over blocks, not rows
    ]
    return np.concatenate(bad)


def _rows(X, rows: np.ndarray):
    """X's rows ``rows`` (increasing): a copy of an array, a row view of a store's
    features (read as the fit reads them, a block at a time)."""
    if not _lazy(X):
        return X[rows]
    from extract._reading import RowView

    return RowView.of(X, rows)


def _inputs(args, stack=None):
    """Training and test data, checked to describe one task; the class names, if any; the
    files' records (:func:`_sources`, read now: a store replaced during the fit is not
    described). With ``stack`` a store's features above the memory limit stay in its
    file (:func:`_load_xy`), open until ``stack`` closes; the part held out by --test-size
    is then a row view of them, as the rest."""
    X, y, names = _load_xy(args.train, args.labels, stack=stack)
    repeated = _repeated(names)
    names = _distinct(names)
    classes = np.unique(y)
    if len(classes) < 2:  # refused here, before any fit (scikit-learn's own error came after)
        only = names[classes[0]] if names is not None else classes[0].item()
        raise UsageError(
            f"{args.train} holds samples of one class only ({only!r}); a classifier needs at "
            "least 2"
        )
    if args.test is None:
        try:
            # Each part in the file's order: a store's rows are read in it, a block at a
            # time (a shuffled order read the whole store for every block).
            parts = train_test_split(
                np.arange(len(y)), test_size=args.test_size, stratify=y, random_state=args.seed
            )
        except ValueError as error:
            why = _single_sample_classes(y, names) or (
                f"{_one_line(error).rstrip('.')}; choose a --test-size that leaves each class "
                "at least one sample in both parts (or pass --test)"
            )
            raise UsageError(
                f"cannot hold out --test-size {args.test_size:g} of {args.train} with every "
                f"class in both parts: {why}"
            ) from error
        train, test = (np.sort(part) for part in parts)
        X, X_test, y, y_test = _rows(X, train), _rows(X, test), y[train], y[test]
        # A stratified split can still leave a small class no sample to train on (all its
        # samples held out): the probe would never predict it, and be scored 0% on it.
        missing = np.setdiff1d(classes, y)
        if len(missing):
            first = names[missing[0]] if names is not None else missing[0].item()
            raise UsageError(
                f"cannot hold out --test-size {args.test_size:g} of {args.train} with every "
                f"class in both parts: it leaves {len(missing)} of the {len(classes)} classes "
                f"no sample to train on (the first: {first!r}); choose a smaller --test-size, "
                "give those classes more samples, or pass --test"
            )
        # (the file's rows of each part, which name a row of either: _check_scaled_test)
        return X, y, X_test, y_test, names, _sources(args) | {"held_out": (train, test)}
    _check_not_the_training_data(args.train, args.test)
    X_test, y_test, test_names = _load_xy(args.test, args.test_labels, "--test-labels", stack)
    # Stores of two backbones are named by them first, rather than by their widths.
    sources = _sources(args)
    _check_same_extraction(args.train, args.test, sources)
    if X_test.shape[1] != X.shape[1]:
        raise UsageError(
            f"the test features have {X_test.shape[1]} columns and the training features "
            f"{X.shape[1]}; use features of the same backbone and settings"
        )
    repeated += _repeated(test_names)
    test_names = _distinct(test_names)
    if names is None and test_names is None:  # a .npz's class names beside integer labels
        y, y_test = _codes_of_named(y, y_test, args)
        classes = np.unique(y)
    y_test, matched = _match_by_name(y, names, y_test, test_names, repeated, args)
    unseen = sorted(set(np.unique(y_test).tolist()) - set(classes.tolist()), key=str)
    if unseen:
        shown = unseen
        advice = "label train and test alike (both class names or both the same integer codes)"
        if matched and names is not None:  # codes of the training store's list
            shown = [names[k] for k in unseen]
            them = "them" if len(unseen) > 1 else "it"
            advice = f"{args.train} lists {them} among its classes but holds no sample of {them}"
        elif matched:  # text training labels: the test store's names
            advice = "a probe cannot predict classes it was not trained on"
        raise UsageError(
            f"the test labels hold {len(unseen)} class{'es' if len(unseen) > 1 else ''} absent "
            "from the training labels "
            f"({_few(shown)}); {advice}"
        )
    return X, y, X_test, y_test, names, sources


def _as_codes(numbers: str, store: str, names) -> None:
    """Say that the integer labels of ``numbers`` are taken as codes of ``store``'s
    class ``names``, not matched by name."""
    listed = _few(list(enumerate(names)), show=lambda code: f"{code[0]} {code[1]!r}")
    print(
        f"mr2-probe: warning: the integer labels of {numbers} are taken as codes of "
        f"{store}'s class names ({listed}), not matched by name: label {numbers} with "
        "class names to match them",
        file=sys.stderr,
    )


def _codes_of_named(y, y_test, args):
    """``y`` and ``y_test``, integer labels of a NumPy file beside a .npz whose class_names
    named its labels (:func:`_named`) taken as codes of those names, as integer labels beside
    a store are taken as its codes (with its warning line)."""
    for plain, labelled, numbers, named in (
        (y_test, y, args.test_labels or args.test, args.train),
        (y, y_test, args.labels or args.train, args.test),
    ):
        if plain.dtype.kind not in "iu" or labelled.dtype.kind != "U":
            continue
        listed = _npz_class_names(named)
        if listed is None:
            continue
        if plain.size and (plain.min() < 0 or plain.max() >= len(listed)):
            raise UsageError(
                f"the integer labels of {numbers} hold codes outside 0..{len(listed) - 1}, "
                f"the classes that {named}'s class names list; label {numbers} with class names"
            )
        _as_codes(numbers, named, listed.tolist())
        if plain is y:
            return listed[y], y_test
        return y, listed[y_test]
    return y, y_test


def _npz_class_names(path: str):
    """The class names that a .npz lists for its integer labels (:func:`_named`), or None
    (another kind of file, or none listed)."""
    if feature_format(path) != ".npz":
        return None
    with np.load(path, allow_pickle=False) as data:
        key = next((key for key in _NAME_KEYS if key in data.files), None)
        if key is None:
            return None
        names = data[key]  # (checked as the file was read)
    return np.char.decode(names, "utf-8") if names.dtype.kind == "S" else names


def _match_by_name(y, names, y_test, test_names, repeated: list[str], args):
    """The test labels in the training labels' terms, matched by class name where the two
    name their classes differently; and whether they were (or are codes of one list).

    A store's labels are codes into its own class names: test codes of a store that lists
    its classes in another order (or only those it holds, as a list source's does) are
    translated by name, and so are text labels of a NumPy file against a training store;
    a store's test codes against text training labels become their names.
    """

    def text(labels):
        return labels.dtype.kind in "USO"

    # Booleans are neither codes of a store's class names nor names (they were taken for
    # codes, then indexed the names as a mask, after every fit).
    for labels, source, store in (
        (y_test, args.test_labels or args.test, args.train if names is not None else None),
        (y, args.labels or args.train, args.test if test_names is not None else None),
    ):
        if store is not None and labels.dtype.kind == "b":
            raise UsageError(
                f"the labels of {source} are booleans (True/False), which name no class of "
                f"{store}: label them with its class names or their integer codes"
            )
    if names is not None:
        if test_names is not None and names != test_names:
            held = [test_names[k] for k in np.unique(y_test).tolist()]  # not failed classes
        elif test_names is None and text(y_test):
            held = [str(v) for v in np.unique(y_test)]
        else:  # two stores of one list of names (codes alike), or integer test labels
            if test_names is None:
                _as_codes(args.test_labels or args.test, args.train, names)
            return y_test, test_names is not None
    elif test_names is None or not text(y):
        if test_names is not None:
            _as_codes(args.labels or args.train, args.test, test_names)
        elif _strings(y) and _strings(y_test):  # text labels on both sides
            return _spelt_as_trained(y, y_test, args.train), False
        return y_test, False
    if repeated:  # two classes of one name: which is which cannot be read off names
        both = names is not None and test_names is not None
        remedy = (
            "extract both stores with one list of class names"
            if both
            else "label both files alike (both class names or both the same integer codes)"
        )
        raise UsageError(
            f"{args.train} and {args.test} name their classes differently, and the class "
            f"names {_few(sorted(set(repeated)))} name several classes: the test labels "
            f"cannot be matched to the training classes by name; {remedy}"
        )
    if names is None:  # text training labels: the test codes' names, checked as labels
        named = _as_trained(test_names, y, args.train)
        return np.asarray(named, dtype=object)[y_test].astype(str), True
    code = _codes_by_name(names, args.train)
    foreign = [name for name in held if _nfc(name) not in code]
    if foreign:
        raise UsageError(
            f"{args.test} has {len(foreign)} class{'es' if len(foreign) > 1 else ''} that "
            f"{args.train} does not "
            f"({_few(foreign)}); a probe cannot predict classes it was not trained on"
            + _near_names(foreign, names)
        )
    if test_names is None:  # text labels: codes of their distinct values
        values, inverse = np.unique(y_test, return_inverse=True)
        return np.array([code[_nfc(str(v))] for v in values], dtype=y.dtype)[inverse], True
    # -1 marks a class the test store lists but holds no label of (none is read).
    table = np.array([code.get(_nfc(name), -1) for name in test_names], dtype=np.int64)
    return table[y_test].astype(y.dtype), True


def _near_names(foreign: list[str], names: list[str]) -> str:
    """``" (did you mean 'bag' for 'Bag'?)"``: training class names that differ from the
    test's unknown ones in case, or in a letter or two, for the first three of them."""
    folded = {}  # (in NFC, as names are matched: 'CAFÉ' for a decomposed 'Café' too)
    for name in names:
        folded.setdefault(_nfc(name).casefold(), name)
    pairs = []
    for name in foreign[:3]:
        near = folded.get(_nfc(name).casefold()) or next(
            iter(difflib.get_close_matches(name, names, n=1, cutoff=0.8)), None
        )
        if near is not None:
            pairs.append(f"{near!r} for {name!r}")
    return f" (did you mean {', '.join(pairs)}?)" if pairs else ""


def _strings(labels: np.ndarray) -> bool:
    """Whether every label is a str (a str array, or an object array of str alone)."""
    if labels.dtype.kind != "O":
        return labels.dtype.kind == "U"
    try:
        values = np.unique(labels)
    except TypeError:  # labels of several types do not sort
        return False
    return all(isinstance(v, str) for v in values.tolist())


def _spelt_as_trained(y: np.ndarray, y_test: np.ndarray, train: str) -> np.ndarray:
    """Text test labels spelt as the training labels they equal in NFC (:func:`_nfc`), as
    a store's class names are matched: 'ñandú' in decomposed accents was a class absent
    from training, though it printed alike. Others are left as they are."""
    values, inverse = np.unique(y_test, return_inverse=True)
    spelt = np.asarray(_as_trained(values.tolist(), y, train), dtype=object)[inverse]
    return spelt.astype(str) if y_test.dtype.kind == "U" else spelt


def _as_trained(names: list[str], y: np.ndarray, train: str) -> list[str]:
    """Each name spelt as the text training label it equals in NFC (:func:`_nfc`), or as
    it is where none does; training labels that are one name in two Unicode forms are
    refused (:func:`_codes_by_name`), as a test name cannot be matched to either."""
    trained = [str(v) for v in np.unique(y)]
    code = _codes_by_name(trained, train)
    return [trained[code[_nfc(v)]] if _nfc(v) in code else v for v in names]


def _nfc(name: str) -> str:
    """A class name as names are matched: one Unicode form (a folder made on macOS spells
    'ñandú' with combining accents, NFD, where Linux and Windows keep what was typed)."""
    return unicodedata.normalize("NFC", name)


def _codes_by_name(names: list[str], path: str) -> dict[str, int]:
    """Each class name's code, keyed by :func:`_nfc`; two names spelt alike in NFC (one
    name in two Unicode forms) are refused, as no test label can be matched to either."""
    code = {}
    for k, name in enumerate(names):
        other = code.setdefault(_nfc(name), k)
        if other != k:
            raise UsageError(
                f"{path} lists the class names {names[other]!r} and {name!r}, which are "
                "one name in two Unicode forms (composed and decomposed accents): the test "
                "labels cannot be matched to the training classes by name; rename one of them"
            )
    return code


def _repeated(names: list[str] | None) -> list[str]:
    """The class names that name several classes (ImageNet's lists name two 'crane')."""
    if names is None:
        return []
    values, counts = np.unique(np.asarray(names, dtype=object), return_counts=True)
    return [str(v) for v in values[counts > 1]]


def _distinct(names: list[str] | None) -> list[str] | None:
    """Class names with a repeated one told apart by its code, 'crane (134)': mapped to
    names, the predictions of two classes of one name were scored as one class."""
    repeated = set(_repeated(names))
    if not repeated:
        return names
    # 'crane (1)' may be another class's own name already: then 'crane (code 1)'.
    for form in ("{} ({})", "{} (code {})"):
        told = [form.format(name, k) if name in repeated else name for k, name in enumerate(names)]
        if not _repeated(told):
            return told
    while repeated := set(_repeated(told)):  # names made to defeat both forms
        told = [f"{name} ({k})" if name in repeated else name for k, name in enumerate(told)]
    return told


def _check_not_the_training_data(train: str, test: str) -> None:
    """Refuse a --test that is the training file itself, or a store of the same images or
    of some of them: its accuracy would be training accuracy. Stores that record each
    image's sha256 (extract's) are compared by content: a test store of other images is
    taken even where the listings look alike, and one of training images is refused
    however it was listed; a few images shared by two sources are only said."""
    shared = "the training images" if _same_file(train, test) else None
    if not shared and {feature_format(train), feature_format(test)} <= set(_STORE):
        # The same image list, and the same shard of it (shards of one list are disjoint).
        keys = ("source_fingerprint", "shard_rank", "shard_world_size")
        # Or stores of one source (its root and container files; and its list file: two
        # lists in one folder are two sources) whose images overlap: subsets of it
        # (--per-class, --max-items) taken twice.
        origin = ("source_root", "source_files", "source")
        with _load_features(train) as a, _load_features(test) as b:
            mine, theirs = (
                [_compared(k, s.metadata.get(k)) for k in keys + origin] for s in (a, b)
            )
            same_list = mine[0] is not None and mine[:3] == theirs[:3]
            same_source = bool(mine[3]) and mine[3:] == theirs[3:]
            common = _common_images(a, b)
            if common is not None:  # by content
                n_common, n_test = common
                if n_common and (n_common == n_test or same_list or same_source):
                    shared = "the training images" if n_common == n_test else (
                        f"{n_common} of the training images"
                    )  # fmt: skip
                elif n_common:
                    are = (
                        "is a byte for byte image" if n_common == 1 else "are byte for byte images"
                    )
                    print(
                        f"mr2-probe: warning: {n_common} of the {n_test} images of --test "
                        f"{test} {are} of {train}",
                        file=sys.stderr,
                    )
            elif same_list:
                shared = "the training images"
            elif same_source:
                both = sorted(set(a.paths) & set(b.paths))
                shared = f"{len(both)} of the training images ({_few(both, 2)})" if both else None
    if shared:
        raise UsageError(
            f"--test {test} holds {shared} of {train}, so its accuracy would be "
            "training accuracy; pass a store of other images, or leave --test out to hold "
            "out --test-size of the training data"
        )


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: by its device and inode (a hard link, a link, a
    path spelt otherwise), else by name."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def _compared(key: str, value):
    """A store's attribute ``key`` as the sources are compared: its ``source`` description
    only for a list file (``list:<path>``); other sources are told apart by their root and
    files, where a folder's description may name it through another path."""
    if key != "source" or (isinstance(value, str) and value.startswith("list:")):
        return value
    return None


def _common_images(train, test) -> tuple[int, int] | None:
    """``(n, n_test)``: how many of the test store's usable images are, byte for byte,
    images of the training store (by the sha256 both record); None where either store
    records no digests (stores written by other tools)."""
    digests = []
    for store in (train, test):
        if store.file is None or "content_sha256" not in store.file:
            return None
        found = store.file["content_sha256"][:][store.rows]
        if not len(found) or (found == b"").any():
            return None
        digests.append(found)
    return int(np.isin(digests[1], digests[0]).sum()), len(digests[1])


def _single_sample_classes(y, names, after_test_split: bool = False) -> str:
    """Where a class has a single sample, which no split puts on both sides: what to do
    (naming the first such class as the report would; ``after_test_split``: ``y`` is what
    the --test-size split left for training); "" otherwise."""
    classes, counts = np.unique(y, return_counts=True)
    single = classes[counts < 2]
    if not len(single):
        return ""
    first = names[single[0]] if names is not None else single[0].item()
    left = " left by the --test-size split" if after_test_split else ""
    remedy = ", or pass --test FILE to train on all of them" if after_test_split else ""
    return (
        f"{len(single)} {'class has' if len(single) == 1 else 'classes have'} a single "
        f"sample{left} (the first: {first!r}), which no split puts on both sides: drop "
        f"those samples or add more of their classes{remedy}"
    )


def _check_splits(y, grid: dict, args, names=None) -> None:
    """The splits the run will make, made once on the labels before any fit: the folds of
    a search (--grid, --Cs) and the front's validation split (--tilt, --offsets); ``names``:
    the class names of a store's codes ``y``."""
    rows = np.zeros((len(y), 1))
    if grid or args.Cs is not None:
        try:
            next(_search_folds(args).split(rows, y))
        except ValueError as error:
            # StratifiedKFold refuses more folds than the largest class has samples.
            largest = int(np.unique(y, return_counts=True)[1].max())
            advice = (
                f"no class has more than {largest} samples: use at most {largest} folds"
                if largest >= 2
                else "no class has 2 samples, which cross-validation needs"
            )
            raise UsageError(f"--cv {args.cv}: {_one_line(error).rstrip('.')}; {advice}") from error
    if args.tilt or args.offsets:
        advice = "choose a --val-size that leaves each class at least one sample in both parts"
        try:
            fit_part, validation = (y[rows] for rows in _front_split(y, args))
        except ValueError as error:
            single = _single_sample_classes(y, names, after_test_split=args.test is None)
            why = single or f"{_one_line(error).rstrip('.')}; {advice}"
            raise UsageError(
                f"--val-size {args.val_size:g} cannot split the {len(y)} training samples "
                f"with every class on both sides: {why}"
            ) from error
        classes = np.unique(y)
        shown = None if names is None else _distinct(names)  # a store's names of its codes
        for part, name in ((fit_part, "fitting"), (validation, "validation")):
            missing = np.setdiff1d(classes, part)
            if len(missing):
                raise UsageError(
                    f"--val-size {args.val_size:g} leaves {len(missing)} of the {len(classes)} "
                    f"classes without a sample in the front's {name} part (the first: "
                    f"{missing[0].item() if shown is None else shown[missing[0]]!r}); {advice}"
                )
        if args.offsets:  # the offsets are tuned on folds of the front's fitting part
            try:
                check_offsets_folds(fit_part, OFFSETS_CV, advice="", class_names=shown)
            except ValueError as error:
                raise UsageError(
                    f"--offsets tunes offsets on {OFFSETS_CV} folds of the {len(fit_part)} "
                    f"samples the front fits on: {_one_line(error).rstrip('.')}; drop "
                    "--offsets, or give it more samples of every class (a smaller --val-size)"
                ) from error


def _search_folds(args) -> StratifiedKFold:
    """The folds that --grid and --Cs search on: one splitter for the searches, the check
    of their splits and the check of their scaled rows, so that all three split alike."""
    return StratifiedKFold(args.cv, shuffle=True, random_state=args.seed)


def _front_split(y, args) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the training data (labels ``y``) that the front (--tilt, --offsets)
    fits on and those it validates on, as it splits them."""
    rows = np.arange(len(y))
    fit, validation = train_test_split(
        rows, test_size=args.val_size, stratify=y, random_state=args.seed
    )
    return fit, validation


def _check_scaled_test(X, y, X_test, args, searched: bool = False, held_out=None) -> None:
    """Refuse rows that --feature-scaling standard makes non-finite where a model scores
    them: the test rows under the scaler fitted on the training features ``X``, as every
    model's scaler is, and where the run draws a front (--tilt, --offsets), its validation
    rows and the test rows under the scaler fitted on its fitting part of ``X`` (``y``:
    X's labels, which its splits stratify), as its models' scalers are, and with
    --offsets the rows of each fold of that part that the offsets are tuned on, under the
    scaler fitted on the rest of the part, as each fold's model's is, and the rows of each
    fold of ``X`` that an offsets point the front chooses is tuned on again when refitted
    on all of ``X``, under the scaler fitted on the rest of ``X``; where ``searched``
    (--grid), each of its folds of ``X`` under the scaler fitted on the rest. Finite rows far
    out of the range scaled on (1e38 in a column whose standard deviation there is 1e-6)
    overflow float32. Their predictions ended the run after its fits in scikit-learn's
    words ("Input X contains infinity"), naming neither the file nor a cure (the front's
    failed so, which the check on the whole of X passed: a row far out of its fitting
    part's range is within X's, which it widens); under SKLEARN_ASSUME_FINITE they were
    predicted unchecked. ``held_out``: the training file's rows that ``X`` and ``X_test``
    are where --test-size split it (:func:`_inputs`), which name a row of either."""
    if args.feature_scaling != "standard" or _lazy(X) or _lazy(X_test):
        return
    kept, tested = (None, None) if held_out is None else held_out  # (X's, X_test's file rows)
    if held_out is None:
        test = _Scored(f"--test {args.test}", X_test, lambda row: _row_named(args.test, row))
    else:
        test = _Scored(
            f"the rows of {args.train} held out by --test-size",
            X_test,
            lambda row: _row_named(args.train, int(tested[row])),
            f"the features of {args.train}",
        )
    # Every scaler the run fits is fitted on the rows of some cells of X, rows alike in
    # their --grid fold, their part of the front (its validation part, or the fold of its
    # fitting part that --offsets tunes on) and their fold of X that a chosen offsets
    # point is tuned on when refitted: each cell's moments, taken once, give every
    # scaler's, where a fit of each read X again (and a float64 copy of it) per part.
    grid, offsets, refits = [], [], []  # the rows of each fold
    if searched:  # --grid: each fold scored by a model (and scaler) fitted on the rest
        splits = _search_folds(args).split(X, y)
        grid = [held for _, held in splits]
    front = bool(args.tilt or args.offsets)
    if front:
        fit, rows = _front_split(y, args)
    if args.offsets:  # tuned on the out-of-fold logits of folds of the front's fitting part
        offsets = [fit[held] for _, held in offsets_splits(OFFSETS_CV, fit, y[fit])]
        # and, where the front chooses an offsets point, on folds of all of X: its refit
        # (TunedOffsetsClassifierCV's, which splits X as offsets_splits does)
        refits = [held for _, held in offsets_splits(OFFSETS_CV, X, y)]
    # Each row's cell, built in place in one index array (after the splits, which peak):
    # its --grid fold (0 without --grid), then its part of the front (0: the validation
    # part; 1 + k: --offsets fold k, 1 without), then its fold of X in an offsets refit.
    cells = np.zeros(len(y), np.intp)  # (n,)
    for k, held in enumerate(grid):  # (loops over the few folds)
        cells[held] = k
    cells *= OFFSETS_CV + 1
    cells += 1
    if front:
        cells[rows] -= 1
    for k, held in enumerate(offsets):
        cells[held] += k
    cells *= OFFSETS_CV
    for k, held in enumerate(refits):
        cells[held] += k
    moments = _cell_moments(X, cells)
    del cells
    cell_fold_part, cell_refit = np.divmod(np.arange(len(moments[0])), OFFSETS_CV)  # (C,)
    cell_fold, cell_part = np.divmod(cell_fold_part, OFFSETS_CV + 1)  # (C,)

    def training(what: str, rows: np.ndarray) -> _Scored:  # X's rows ``rows``
        in_file = rows if kept is None else kept[rows]  # (beside --test, X is the file's rows)
        return _Scored(
            what,
            X,
            lambda row: _row_named(args.train, int(in_file[row])),
            f"the features of {args.train}",
            rows,
        )

    whole = "the training features"
    _check_scaled(_scaler(moments, cell_fold >= 0), whole, f"{whole}'", [test])
    for k, held in enumerate(grid):
        scored = training(f"fold {k} of the {args.cv} that --grid searches {args.train} on", held)
        _check_scaled(
            _scaler(moments, cell_fold != k), f"the rest of {whole}", "the rest's", [scored]
        )
    if not front:
        return
    fitting = ("the front's fitting part of the training features", "that part's")
    validation = training(
        f"the front's validation part of {args.train} (--val-size {args.val_size:g})", rows
    )
    _check_scaled(_scaler(moments, cell_part != 0), *fitting, [validation, test])
    for k, held in enumerate(offsets):
        scored = training(
            f"fold {k} of the front's fitting part of {args.train} (one of the "
            f"{OFFSETS_CV} that --offsets tunes its offsets on)",
            held,
        )
        rest = (cell_part != 0) & (cell_part != 1 + k)
        _check_scaled(_scaler(moments, rest), "the rest of that part", "the rest's", [scored])
    for k, held in enumerate(refits):
        scored = training(
            f"fold {k} of the training features of {args.train} (one of the {OFFSETS_CV} "
            "that an --offsets point the front chooses tunes its offsets on, refitted on "
            "the whole training set)",
            held,
        )
        rest = cell_refit != k
        _check_scaled(_scaler(moments, rest), f"the rest of {whole}", "the rest's", [scored])


def _cell_moments(X, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The row count, column sums and sums of squared deviations from the column means of
    each cell of X's rows (``cells``: each row's), in float64, as StandardScaler takes
    them of the rows it is fitted on: two passes over each cell, a block of rows at a time."""
    counts = np.bincount(cells)  # (C,)
    sums = np.zeros((len(counts), X.shape[1]))  # (C, d)
    squares = np.zeros_like(sums)  # (C, d)
    step = block_rows(X.shape[1], 1)
    with np.errstate(all="ignore"):  # (overflow: the scaling's own NaN, left to the fits)
        for c in np.flatnonzero(counts):  # (a loop over the few cells, and their blocks)
            blocks = np.array_split(np.flatnonzero(cells == c), -(-counts[c] // step))
            for block in blocks:
                sums[c] += X[block].sum(axis=0, dtype=np.float64)
            correction = np.zeros(X.shape[1])
            for block in blocks:
                deviation = X[block] - sums[c] / counts[c]  # (b, d) float64
                correction += deviation.sum(axis=0)
                squares[c] += np.einsum("ij,ij->j", deviation, deviation)
            squares[c] -= correction**2 / counts[c]
    return counts, sums, squares


def _scaler(moments: tuple, cells: np.ndarray):
    """StandardScaler fitted on the rows of the cells ``cells`` (a mask) of
    :func:`_cell_moments`' ``moments``, their moments combined as its partial_fit
    combines batches' (Chan, Golub and LeVeque); None where they overflow."""
    from sklearn.preprocessing import StandardScaler

    cells = cells & (moments[0] > 0)  # (C,) an empty cell adds nothing
    counts, sums, squares = (moment[cells] for moment in moments)
    n = counts.sum()
    with np.errstate(all="ignore"):
        mean = sums.sum(axis=0) / n  # (d,)
        spread = np.square(sums / counts[:, None] - mean)  # (k, d)
        var = (squares.sum(axis=0) + counts @ spread) / n  # (d,)
    if not (np.isfinite(mean).all() and np.isfinite(var).all()):
        return None  # the scaling's own NaN: the fit's error says to divide X
    scaler = StandardScaler()
    scaler.n_features_in_, scaler.n_samples_seen_ = len(mean), n
    scaler.mean_, scaler.var_, scaler.scale_ = mean, var, np.sqrt(var)
    # (near-constant columns are scaled by 1, as StandardScaler's _is_constant_feature
    # finds them: within the float64 rounding of the two-pass variance)
    eps = np.finfo(np.float64).eps
    scaler.scale_[var <= n * eps * var + (n * mean * eps) ** 2] = 1.0
    return scaler


class _Scored(NamedTuple):
    """Rows that a model scores, for :func:`_check_scaled`: ``what`` they are, the rows
    ``rows`` of ``X`` (None: all of them, taken a block at a time, never copied whole),
    ``named`` the name of the part's row ``row`` in its file, ``features`` the features
    that float64 cures."""

    what: str
    X: np.ndarray
    named: Callable[[int], str]
    features: str = "the --test features"
    rows: np.ndarray | None = None

    def blocks(self):
        """The part's rows a block at a time: each block's first row in the part and its
        rows of ``X`` (a copy of those rows only; a view where ``rows`` is None)."""
        n = len(self.X) if self.rows is None else len(self.rows)
        step = block_rows(self.X.shape[1], 1)
        for start in range(0, n, step):  # (a loop over blocks of rows)
            block = slice(start, start + step)
            yield start, self.X[block] if self.rows is None else self.X[self.rows[block]]


def _check_scaled(scaler, fitted_on: str, its: str, parts: list[_Scored]) -> None:
    """Refuse the rows of the first of ``parts`` that has some that --feature-scaling
    standard, ``scaler`` (:func:`_scaler`, None: none checked), fitted on what is said
    ``fitted_on`` (``its``, its possessive), makes non-finite, the first named, with the
    cures that work: the cure of float64 features is given where their arithmetic holds
    the rows scaled (with room for the logits' products). Each part is scaled a block of
    rows at a time: a part may be most of X (a --grid fold's, an --offsets fold's)."""
    if scaler is None:
        return
    limit = np.sqrt(np.finfo(np.float64).max)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # (the overflow that is refused here)
        for scored in parts:  # (two at most: the front's validation rows, the test rows)
            bad, first, held = [], None, scored.X.dtype != np.float64
            for start, X_block in scored.blocks():
                scaled = scaler.transform(X_block)  # (b, d), as the models' scaler does
                found = np.flatnonzero(~np.isfinite(scaled).all(axis=1))  # (b',)
                if not len(found):
                    continue
                if first is None:  # (its value and first non-finite column)
                    column = int(np.flatnonzero(~np.isfinite(scaled[found[0]]))[0])
                    first = (column, X_block[found[0], column])
                bad.append(start + found)
                if held:
                    wide = scaler.transform(np.asarray(X_block[found], dtype=np.float64))
                    held = bool((np.abs(wide) < limit).all())
            if bad:
                break
        else:
            return
    bad = np.concatenate(bad)
    column, value = first
    n = len(bad)
    them = "that row and drop or correct it" if n == 1 else "those rows and drop or correct them"
    rows = len(scored.X) if scored.rows is None else len(scored.rows)
    raise UsageError(
        f"{scored.what}: {n} of its {rows} rows {'is' if n == 1 else 'are'} made "
        f"non-finite by --feature-scaling standard, fitted on {fitted_on} (the first is "
        f"{scored.named(int(bad[0]))}: "
        f"its column {column} holds {value:.3g}, where {its} "
        + (  # (a near-constant column is scaled by 1: its x - mean overflowed)
            f"values are all about {scaler.mean_[column]:.3g}, scaled by 1"
            if scaler.scale_[column] == 1 and scaler.var_[column] != 1
            else f"standard deviation is {scaler.scale_[column]:.3g}"
        )
        + f"); check {them}"
        + (
            f", or give {scored.features} as float64, whose arithmetic holds them scaled"
            if held
            else ""
        )
    )


def _row_named(path: str, row: int) -> str:
    """Row ``row`` of the features read from ``path`` as :func:`_check_xy` names it: a
    store's by its store row and image (its failed rows are not read), else ``row N``."""
    if feature_format(path) not in _STORE:
        return f"row {row}"
    from extract._store import open_store

    with open_store(path, "r") as f:
        stored = int(_completed_rows(f)[row])
        image = f["paths"].asstr(encoding="utf-8")[stored] if "paths" in f else None
    return f"store row {stored}" + (f", {image!r}" if image is not None else "")


# What a store's features depend on (extract's provenance): the decoding path ("decode")
# and the compute precision change them by rounding only, and may differ between stores.
_FEATURE_PROVENANCE = ("backbone", "weights", "normalize", "preprocessing")


def _feature_provenance(record: dict) -> dict | None:
    """The entries of a store's provenance (its :func:`_sources` record) that define its
    features; None for NumPy files."""
    metadata = record.get("provenance")
    if metadata is None:
        return None
    flat = {}
    for key in _FEATURE_PROVENANCE:
        value = metadata.get(key)
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items() if k not in ("decode", "transform")}
        elif value is not None:
            flat[key] = value
    return flat


def _check_same_extraction(train: str, test: str, sources: dict) -> None:
    """Refuse train and test stores whose features come from different backbones, weights
    or preprocessing (entries recorded in both are compared)."""
    old, new = (_feature_provenance(sources[key]) for key in ("train", "test"))
    if old is None or new is None:
        return
    for path, mine, other in ((train, old, new), (test, new, old)):
        unknown = [k for k in ("backbone", "weights") if k in other and k not in mine]
        if unknown:  # a store written by another tool: nothing to compare with
            print(
                f"mr2-probe: warning: {path} records no {' or '.join(unknown)}, so whether "
                "its features are comparable with the other store's cannot be checked",
                file=sys.stderr,
            )
        tag = mine.get("weights")
        if isinstance(tag, str) and str(other.get("weights")).startswith(f"{tag} params-sha256:"):
            # A hub tag (or random weights) recorded before the weights were hashed: the
            # same name, not necessarily the same weights (another revision of the tag,
            # another library's initialisation).
            print(
                f"mr2-probe: warning: {path} records its weights by name alone "
                f"({tag!r}), so whether both stores used the same weights cannot be "
                "checked; extract it again with --force to record their hash",
                file=sys.stderr,
            )
            mine["weights"] = other["weights"]
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    if differ:
        shown = "; ".join(f"{k}: {old[k]!r} and {new[k]!r}" for k in differ[:3])
        raise UsageError(
            f"{train} and {test} were extracted differently ({shown}), so their features "
            "are not comparable; extract both with the same backbone and settings"
        )
