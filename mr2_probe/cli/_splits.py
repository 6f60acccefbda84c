"""The splits that ``mr2-probe`` makes of its training data (a search's folds, the front's
parts), checked before any fit: on the labels, and the rows that --feature-scaling standard,
fitted as each model's scaler is, makes non-finite."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from sklearn.model_selection import StratifiedKFold, train_test_split

from .._data import as_given, block_rows
from .._offsets import offsets_splits
from ..front import OFFSETS_CV, check_offsets_folds
from ._feature_files import _STORE, _completed_rows, _lazy, feature_format
from ._inputs import _distinct, _single_sample_classes
from ._usage import UsageError, _one_line


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
                f"--val-size {as_given(args.val_size)} cannot split the {len(y)} training samples "
                f"with every class on both sides: {why}"
            ) from error
        classes = np.unique(y)
        shown = None if names is None else _distinct(names)  # a store's names of its codes
        for part, name in ((fit_part, "fitting"), (validation, "validation")):
            missing = np.setdiff1d(classes, part)
            if len(missing):
                raise UsageError(
                    f"--val-size {as_given(args.val_size)} leaves {len(missing)} of the "
                    f"{len(classes)} classes without a sample in the front's {name} part (the "
                    f"first: {missing[0].item() if shown is None else shown[missing[0]]!r}); "
                    f"{advice}"
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
        f"the front's validation part of {args.train} (--val-size {as_given(args.val_size)})", rows
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
