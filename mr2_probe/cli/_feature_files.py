"""``mr2-probe``'s feature files read: a store from mr2-extract, a .npz or a .npy (with its
labels), their features and labels checked to be data that can be fitted, and how much of
a store is read into memory."""

from __future__ import annotations

import os
import sys
import unicodedata
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .._data import block_rows, is_h5_dataset, read_h5
from .._h5 import file_named_as_folder, name_failures, why_missing
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
    than :func:`in_memory_limit` (integers and booleans in float64, :func:`_computed_bytes`)
    stay in the file, which ``stack`` closes: X is its
    ``h5py.Dataset`` (a row view of its completed rows where images failed), checked a
    block at a time, never read whole (integers and booleans too, each block computed in
    float64 as their array is). Smaller ones are read into memory."""
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


def _streams_stores(args) -> bool:
    """Whether the run streams a store's features larger than a quarter of memory, which
    then stay in the file, read a block at a time by each fit and prediction: where every
    model of the run takes them so, a probe or its --Cs search. A scaler
    (--feature-scaling), a --grid search (its folds are copies) and the front (--tilt,
    --offsets) take arrays, and read the stores whole."""
    return args.feature_scaling == "none" and not args.grid and not (args.tilt or args.offsets)


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
    # StoreError: a one-line ValueError. Features that fit in memory (a quarter of it, as a
    # fit may hold a float32 copy beside them) are read into it: each pass over a streamed
    # store reads the file again, about three times the fit's time here. Those read are
    # closed at once. (Integers stream as floats do: the estimators compute a store of them
    # in float64 blocks, the same model as their array.)
    store = _load_features(path)
    # (their bytes as the fits compute them: float16 read as float32, where the limit on
    # their bytes in the file read a float16 store of up to half of memory whole; integers
    # in float64, where a uint8 store of up to a quarter of memory was read whole and each
    # fit's float64 copy took twice memory; counted as the line of inputs out of memory
    # counts them)
    values, dtype = _store_values(store.file)
    streamed = stack is not None and _computed_bytes(values, dtype) > in_memory_limit()
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
    where lower (1 GiB where the system says neither), integers and booleans counted in
    float64 (:func:`_computed_bytes`); larger ones are read a block at a time by every fit
    and prediction."""
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
    held: int | None  # their bytes once read into memory (the limit is set on computed)
    stored: int | None  # their bytes as the file holds them (None where it cannot tell)
    dtype: np.dtype | None  # as the file holds them
    store: bool  # an HDF5 store, else a .npz or .npy (always read whole)

    @property
    def as_float32(self) -> int | None:
        """Their bytes as float32 (a store of float32 in the file's place)."""
        if self.held is None:
            return None
        return self.held // _held_dtype(self.dtype).itemsize * 4

    @property
    def computed(self) -> int | None:
        """Their bytes as the fits compute them, which the limit is set on where the run
        streams (:func:`_computed_bytes`: integers and booleans in float64)."""
        if self.held is None:
            return None
        return _computed_bytes(self.held // _held_dtype(self.dtype).itemsize, self.dtype)


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
    (:func:`_held_dtype`: float16 as float32)."""
    return values * _held_dtype(dtype).itemsize


def _computed_bytes(values: int, dtype: np.dtype) -> int:
    """The bytes of ``values`` features of ``dtype`` as the fits compute them, which the
    limit is set on where the run streams (:func:`_load_store`): integers and booleans in
    float64 (each fit of them in memory holds a float64 copy, eight times uint8's bytes),
    floating-point ones as held (:func:`_held_bytes`)."""
    return values * 8 if dtype.kind in "biu" else _held_bytes(values, dtype)


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
    the estimators' blocks (:func:`~mr2_probe._data.block_rows`), where they can hold them:
    integers and booleans are finite, and a store of them is not read for it (a pass over
    a file above a quarter of memory in float64, before any fit)."""
    if X.dtype.kind in "biu":
        return np.empty(0, dtype=np.intp)
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


def _nfc(name: str) -> str:
    """A class name as names are matched: one Unicode form (a folder made on macOS spells
    'ñandú' with combining accents, NFD, where Linux and Windows keep what was typed)."""
    return unicodedata.normalize("NFC", name)
