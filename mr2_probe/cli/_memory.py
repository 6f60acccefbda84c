"""The one line of a ``mr2-probe`` run that ran out of memory, reading its inputs, in a
main fit or in the predictions after the fits, with what takes less (and what the front's
error line adds where its fits did, on integer features)."""

from __future__ import annotations

import numpy as np

from . import _feature_files
from ._feature_files import (
    _STORE,
    _features_sizes,
    _in_bytes,
    _streams_stores,
    feature_format,
)


def _memory_ran_out(error, args) -> tuple[bool, bool]:
    """Whether ``error`` (out of memory) is the host's, and whether it is a GPU's, where
    --device cpu would use the machine's memory instead."""
    from .._device import resolve_device

    host = isinstance(error, MemoryError) or "can't allocate memory" in str(error)
    return host, not host and resolve_device(args.device).type != "cpu"


# What makes a store of a .npz's or .npy's arrays (extract.load_features reads it as one).
_ANY_STORE = (
    "; h5py writes one: datasets 'features' (n, d), 'labels' (n,) of codes 0..K-1 and "
    "'class_names' (K,)"
)


def _inputs_out_of_memory_line(what: str, args, grid: dict) -> str:
    """The one line of inputs that ran out of memory as they were read (``what``: its
    error, short): the features read into memory, and what reads them in less. A store's
    above the limit (a quarter of memory; integers and booleans counted in float64, as the
    fits compute them) stays in its file without the options under which the run reads it
    whole; a .npz or .npy file is read whole, which a store in its place above the limit
    is not; 64-bit integers above it but within it as float32 are read whole from any file
    of float32 features, in half the memory; features within the limit are read whole
    whatever the options (the advice to leave those options out was given for them too),
    and float32 features in place of integers within it are too."""
    whole = [
        option
        for option, given in (
            (f"--feature-scaling {args.feature_scaling}", args.feature_scaling != "none"),
            ("--grid", bool(grid)),
            ("--tilt", bool(args.tilt)),
            ("--offsets", bool(args.offsets)),
        )
        if given
    ]
    limit, sizes = _features_sizes(args)
    # (a store above the limit that the run streamed is not among those read; the limit
    # is set on the features' bytes as the fits compute them, integers in float64, as the
    # run sets it: the line says what the run did, and a cure that the run follows)
    read = [
        features
        for features in sizes
        if whole or not features.store or features.held is None or features.computed <= limit
    ]
    large = [f for f in read if f.held is not None and f.computed > limit]
    # Every one large has a cure: a store's are among them only under the options that
    # read them whole; a .npz's or .npy's, integers too, a store in its place streams.
    arrays = [f.path for f in large if not f.store]
    # (64-bit integers above the limit, within it as float32: float32 features, in any
    # file, are read whole in half their memory, whatever the options)
    halved = [f.path for f in large if _float32_halves(f, limit)]
    advice = []
    if large:
        cures = [f"an HDF5 store in place of {', '.join(arrays)}"] if arrays else []
        if whole:
            cures.append(f"without {', '.join(whole)}")
        # (integers whose float64 size, which the line gives, puts them above the limit)
        integers = ", integers in float64," if any(_in_float64(f, limit) for f in large) else ""
        # (mr2-extract makes a store of images, not of the arrays: h5py makes one of them)
        made = any(not f.store for f in large)
        advice.append(
            f"{', '.join(cures)} (a store's features above a quarter of memory{integers} then "
            f"stay in its file, read a block at a time{_ANY_STORE if made else ''})"
        )
        if halved:
            advice.append(
                f"float32 features in place of {', '.join(halved)} (in any file: read whole, "
                "in half the memory of 64-bit integers, within a quarter of memory)"
            )
    advice.append("freeing memory, or a machine with more")
    shown = ", ".join(_held(features, limit) for features in read)
    held = f"The features read into memory: {shown} (a quarter of memory: {_in_bytes(limit)})"
    if not large and all(features.held is not None for features in read):
        held += "; no option of the command reads them in less"
    return (
        f"reading the inputs ran out of memory ({what}); nothing is written. "
        f"{held + '. ' if read else ''}Try {', or '.join(advice)}"
    )


def _in_float64(features, limit: int) -> bool:
    """Whether the line gives the float64 size of an input file's integer (or boolean)
    features (a ``_feature_files._Features``) beside their size in memory: where it puts
    them above the limit, as the run counts them where it streams, and differs from that
    size (not 64-bit ones')."""
    if features.held is None or features.dtype.kind not in "biu":
        return False
    return features.computed != features.held and features.computed > limit


def _float32_halves(features, limit: int) -> bool:
    """Whether float32 features in place of an input file's 64-bit integer features (a
    ``_feature_files._Features``) above the limit are within it (read whole from any
    file, in half the memory). In place of other integers they read no less: above the
    limit as float32, the integers are too in float64, and a store of them streams; within
    it, a store of float32 features is read whole."""
    if features.held is None or features.dtype.kind not in "biu":
        return False
    return features.as_float32 <= limit < features.held


def _held(features, limit: int) -> str:
    """An input file's features as the line of inputs out of memory says them (a
    ``_feature_files._Features``): their size in memory, and in the file where it differs
    (float16 features are read as float32); integers above the limit in float64, that
    size; 64-bit ones that float32 features halve, their size as those (``limit``: a
    quarter of memory)."""
    if features.held is None:
        return features.path
    said = f"{features.path}: {_in_bytes(features.held)}"
    if features.held != features.stored:
        said += f" ({_in_bytes(features.stored)} of {features.dtype} in the file)"
    if _in_float64(features, limit):
        said += f" ({_in_bytes(features.computed)} in float64)"
    if _float32_halves(features, limit):
        said += f" ({_in_bytes(features.as_float32)} as float32)"
    return said


def _predict_out_of_memory_line(
    name: str, what: str, error, out, args, X=None, X_train=None
) -> str:
    """The one line of ``name``'s predictions that ran out of memory after the fits, the
    models written to ``out`` (None: no --out, nothing written); ``X``: the rows predicted
    (integer ones are computed in float64, see :func:`_integer_copy`), ``X_train``: the
    fits' (the rest of the file of rows held out by --test-size)."""
    host, on_gpu = _memory_ran_out(error, args)
    kept = (
        f"the fitted models are written to {out / 'models.joblib'}, the reports are not"
        if out is not None
        else "nothing is written (no --out)"
    )
    advice = ["--device cpu (the machine's memory; slower)"] if on_gpu else []
    copy, cures = _integer_copy(X, "The predictions compute", args, held_out=True, other=X_train)
    advice += cures
    advice += [] if on_gpu else ["freeing memory"]
    return (
        f"{name} ran out of {'memory' if host else 'the device memory'} in its predictions "
        f"after the fits ({what}); {kept}.{copy} Try {', or '.join(advice)}, or a machine with "
        "more"
    )


def _out_of_memory_line(name: str, what: str, error, names: list, args, X=None, X_test=None) -> str:
    """The one line of a main fit (``name``'s, of the models ``names``) that ran out of
    memory (``what``: its error, short), with the command's options that take less, and
    for integer features ``X`` in memory the float64 copy that each fit computes them in
    (:func:`_integer_copy`; ``X_test``: the test rows, the rest of the file where
    --test-size held them out)."""
    host, _ = _memory_ran_out(error, args)
    fitted = names[: names.index(name)]
    lost = f" ({', '.join(fitted)}, fitted before it, neither)" if fitted else ""
    copy, advice = _fits_advice(error, args, X, X_test)
    return (
        f"{name} ran out of {'memory' if host else 'the device memory'} in its fit ({what}); "
        f"nothing is written{lost}.{copy} Try {', or '.join(advice)}"
    )


def _front_out_of_memory_words(error, args, X, X_test) -> str:
    """What the front's error line adds where its fits ran out of memory (``error``) on
    integer features ``X``: the float64 copy that each fit computes them in and what takes
    less, as a main fit's line says them (:func:`_fits_advice`; the front fits one
    configuration, no search, and reads a store whole); "" for floating-point ``X``, where
    the error is all."""
    copy, advice = _fits_advice(error, args, X, X_test, searched=False)
    return f"{copy} Try {', or '.join(advice)}" if copy else ""


def _fits_advice(error, args, X, X_test, searched: bool = True) -> tuple[str, list[str]]:
    """The sentence of the float64 copy of integer features ``X`` that each fit computes
    (:func:`_integer_copy`; ``X_test``: the test rows, the rest of the file where
    --test-size held them out), and the options that take less where fits ran out of
    memory (``error``), a search's among them where ``searched``, then what else does."""
    _, on_gpu = _memory_ran_out(error, args)
    advice = ["--device cpu (the machine's memory; slower)"] if on_gpu else []
    if searched and on_gpu and args.Cs is not None:  # (MR2LinearClassifierCV's one batch)
        advice.append("fewer --cv folds (--Cs solves them together on a GPU)")
    if searched and args.n_jobs not in (None, 1) and (args.grid or args.Cs is not None):
        advice.append("fewer --n-jobs (each parallel fit holds its own memory)")
    copy, cures = _integer_copy(X, "Each fit computes", args, other=X_test)
    advice += cures
    if advice == cures:  # (no option of the command takes less)
        advice.append("freeing memory, or a machine with more")
    return copy, advice


def _integer_copy(X, who: str, args, held_out: bool = False, other=None) -> tuple[str, list]:
    """What the out-of-memory lines of the fits and predictions say of integer (or boolean)
    features ``X``, read from their file (--train's, or --test's): they are held as the file
    holds them and computed in float64 (scikit-learn's check_array makes that copy, four
    times int16's bytes, eight times uint8's), where float32 features are computed as they
    are; and a store of the integers above a quarter of memory in float64 stays in its
    file where the run streams, its blocks computed in float64 one at a time. Returns the
    sentence of the copy's size and the cures: float32 features, and a store in place of
    a .npz or .npy above the limit in float64 (a store's own are within it, read whole);
    ("", []) for floating-point ``X``, and for a store's left in its file (``X`` an
    h5py.Dataset or a row view of one), no copy of them all. ``who``: what computes the
    copy, with its verb; ``held_out``: whether ``X`` are the --test rows (those of --test,
    or those --test-size held out of the training file); ``other``: the run's other part,
    which is the rest of the file where --test-size split it: a store streams by the size
    of all its rows (the cure was left out where a part alone was within the limit, the
    file above it)."""
    if not isinstance(X, np.ndarray) or X.dtype.kind not in "biu":
        return "", []
    path = args.test if held_out and args.test is not None else args.train
    rows = "held-out " if held_out and args.test is None else ""
    copy = (
        f" {who} the {rows}{X.dtype} features of {path} in "
        f"float64, a copy of {_in_bytes(X.size * 8)} ({_in_bytes(X.nbytes)} as read)."
    )
    cures = [
        f"float32 features in place of {path} (computed as they are, in {_in_bytes(X.size * 4)})"
    ]
    limit = _feature_files.in_memory_limit()  # (as the run set it)
    # (all the file's rows in float64, as a store counts them: the other part too where
    # --test-size split it)
    rest = other.size if args.test is None and other is not None else 0
    computed = (X.size + rest) * 8
    if _streams_stores(args) and feature_format(path) not in _STORE and computed > limit:
        cures.append(
            f"an HDF5 store in place of {path} (its integers, {_in_bytes(computed)} in "
            f"float64, above a quarter of memory ({_in_bytes(limit)}), then stay in its file, "
            f"read a block at a time: no float64 copy of them all{_ANY_STORE})"
        )
    return copy, cures
