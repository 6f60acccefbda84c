"""Per-class logit offsets tuned on held-out data: a multiclass TunedThresholdClassifierCV.

:func:`tune_class_offsets` is the pure search on held-out decision values;
:class:`TunedOffsetsClassifierCV` produces those values by cross-validation, tunes the
offsets on them and refits the inner classifier on all the data.
"""

from __future__ import annotations

import inspect
import warnings
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
from scipy.special import log_softmax, softmax
from sklearn import get_config
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, _fit_context, clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.metrics import accuracy_score, balanced_accuracy_score
from sklearn.model_selection import StratifiedShuffleSplit, check_cv
from sklearn.pipeline import Pipeline
from sklearn.utils import _safe_indexing, get_tags, metadata_routing
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    RealNotInt,
    StrOptions,
    validate_params,
)
from sklearn.utils.metadata_routing import MetadataRouter, MethodMapping, process_routing
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import (
    _check_method_params,
    _check_sample_weight,
    check_array,
    check_is_fitted,
    column_or_1d,
    has_fit_parameter,
    indexable,
)

from ._data import cv_folds, is_torch_tensor
from ._device import to_numpy
from .metrics import (
    GROUP_NAMES,
    class_accuracy_std,
    difficulty_groups,
    hard_tercile_accuracy,
    worst_class_accuracy,
)

OBJECTIVES = ("worst_class", "balanced_accuracy", "hard_tercile", "accuracy")

# Metrics that the search scores from per-class (weighted) counts, without building
# predictions: (function, the scorer's sign, name). class_std_scorer is negated.
_COUNTED_METRICS = (
    (worst_class_accuracy, 1, "worst_class"),
    (balanced_accuracy_score, 1, "balanced_accuracy"),
    (hard_tercile_accuracy, 1, "hard_tercile"),
    (accuracy_score, 1, "accuracy"),
    (class_accuracy_std, -1, "neg_class_std"),
)


class OffsetTuning(NamedTuple):
    """Result of :func:`tune_class_offsets`.

    Attributes
    ----------
    offsets : ndarray of shape (n_classes,)
        The tuned offsets, centred (mean 0), unless centring would move a sample that lies
        on an exact tie between two classes across it by rounding (decision values with
        few distinct values): then as the search found them, whose predictions the scores
        describe.
    score : float
        The objective on the tuning data with the offsets (greater is better).
    base_score : float
        The objective on the tuning data without offsets.
    accuracy_drop : float
        Overall accuracy without offsets minus overall accuracy with them.
    n_sweeps : int
        Sweeps over the classes that the coordinate ascent ran.
    """

    offsets: np.ndarray
    score: float
    base_score: float
    accuracy_drop: float
    n_sweeps: int


@validate_params(
    {
        "decision": ["array-like"],
        "y": ["array-like"],
        "scoring": [StrOptions(set(OBJECTIVES)), callable],
        "max_accuracy_drop": [Interval(Real, 0, None, closed="left"), None],
        "classes": ["array-like", None],
        "sample_weight": ["array-like", None],
        "max_sweeps": [Interval(Integral, 1, None, closed="left")],
        "n_candidates": [Interval(Integral, 2, None, closed="left")],
    },
    prefer_skip_nested_validation=True,
)
def tune_class_offsets(
    decision,
    y,
    scoring="worst_class",
    max_accuracy_drop=None,
    *,
    classes=None,
    sample_weight=None,
    max_sweeps=50,
    n_candidates=128,
) -> OffsetTuning:
    """Per-class offsets b that maximise a class-wise objective of argmax(decision + b).

    Deterministic coordinate ascent from b = 0, so that the result is never worse than no
    offsets on ``(decision, y)`` and the accuracy bound holds on that data. Pass held-out
    decision values (out-of-fold, or a validation set): on the data a model was fitted on,
    its decision values are optimistic and the offsets learn nothing useful.

    Parameters
    ----------
    decision : array-like of shape (n_samples, n_classes) or (n_samples,)
        Decision values (logits); a 1-D array is a binary problem's z1 − z0 and is read as
        the two columns [0, z].
    y : array-like of int of shape (n_samples,)
        Column of each sample's true class, in [0, n_classes).
    scoring : str or callable, default="worst_class"
        The objective, greater is better: ``"worst_class"``, ``"balanced_accuracy"`` (mean
        per-class accuracy), ``"hard_tercile"`` or ``"accuracy"`` as defined in
        :mod:`mr2_probe.metrics`; a scorer made by :func:`~sklearn.metrics.make_scorer`
        on predicted labels (its sign and keyword arguments are applied); or a callable
        ``metric(y_true, y_pred) -> float``, called with labels from ``classes`` (and
        ``sample_weight=`` when weights are given). A scorer or callable of one of the
        four named metrics (unsigned, without keyword arguments) is searched as the name
        is, from per-class counts and with its tie rules; any other is called once per
        candidate offset, which is slower.
    max_accuracy_drop : float or None, default=None
        Largest loss of overall accuracy on ``(decision, y)`` allowed, as a fraction (0.005
        is half a point), relative to no offsets. ``None``: no bound.
    classes : array-like of shape (n_classes,), default=None
        Labels of the columns, passed to a scorer or callable (``classes[y]``). Default:
        ``0 … n_classes − 1``.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the samples in the objective and in the accuracy bound (a class's
        accuracy is its weighted fraction of correct predictions; a class of zero weight
        is left out, as an absent one).
    max_sweeps : int, default=50
        Most sweeps over the classes; a :class:`~sklearn.exceptions.ConvergenceWarning`
        says when the last one still improved.
    n_candidates : int, default=128
        Offsets tried per class and sweep when there are more distinct thresholds than
        this: evenly spaced ranks of the thresholds, plus those nearest the current value.

    Returns
    -------
    result : OffsetTuning
        Named tuple ``(offsets, score, base_score, accuracy_drop, n_sweeps)``.

    Notes
    -----
    With the other offsets fixed, sample i is predicted class k exactly when b_k exceeds
    t_i = max_{j≠k}(z_ij + b_j) − z_ik, so the objective is a step function of b_k that
    changes only at the t_i. The candidates for b_k are the midpoints between consecutive
    distinct t_i (a fixed subset when there are many), the two ends, and the current
    value. All candidates of a class are scored at once from per-class counts of correct
    predictions; the best one under the accuracy bound is kept. Ties: for
    ``"worst_class"`` the per-class accuracies are compared sorted, lexicographically
    (leximin: raising one of several tied worst classes is progress); then higher overall
    accuracy wins; then the candidate nearest the current value. Sweeps over the classes
    in the order of the columns stop when one changes nothing. The point reached can
    depend on that order, as a coordinate ascent's does: the same decision values with
    the columns permuted can end at other offsets. On digits (3 folds, LogisticRegression
    with C=0.05), the labels 0, 5, ..., 45 as numbers and as text, which sort otherwise,
    reached the same held-out worst-class accuracy, and 0.56% of the images' predictions
    differ between the two. Each
    sweep costs O(K·N·(log N + log M)) time for N samples, K classes and M candidates,
    and O(N·K) memory.

    Examples
    --------
    >>> import numpy as np
    >>> from mr2_probe import tune_class_offsets
    >>> decision = np.array([[2.0, 1.0], [1.5, 1.0], [0.2, 1.0], [1.2, 1.0]])
    >>> y = np.array([0, 0, 1, 1])
    >>> result = tune_class_offsets(decision, y)
    >>> result.base_score, result.score
    (0.5, 1.0)
    >>> (decision + result.offsets).argmax(1)
    array([0, 0, 1, 1])
    """
    z = check_array(decision, ensure_2d=False, dtype=np.float64)
    if z.ndim == 1:
        z = np.column_stack([np.zeros_like(z), z])
    n_samples, n_classes = z.shape
    if n_classes < 2:
        raise ValueError(
            f"decision must have one column per class and at least 2 classes, got shape "
            f"{z.shape}. Pass a binary problem's 1-D decision values as they are."
        )
    y = column_or_1d(y)
    if len(y) != n_samples:
        raise ValueError(f"decision has {n_samples} samples but y has {len(y)}.")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_classes:
        got = f" in [{y.min()}, {y.max()}]" if np.issubdtype(y.dtype, np.number) else ""
        raise ValueError(
            f"y must hold each sample's column in [0, {n_classes}), got values of dtype "
            f"{y.dtype}{got}. Encode labels with np.unique(labels, return_inverse=True)."
        )
    classes = np.arange(n_classes) if classes is None else np.asarray(classes)
    if len(classes) != n_classes:
        raise ValueError(f"classes has {len(classes)} labels but decision has {n_classes} columns.")
    weight = _check_sample_weight(sample_weight, z, ensure_non_negative=True)
    if not weight.sum() > 0:
        raise ValueError("The sum of sample weights must be positive.")
    if sample_weight is not None and not (weight > 0).all():
        # Rows of zero weight are no rows: their thresholds would be candidates too, and
        # move the search's path (a row dropped and a row of zero weight tuned alike).
        keep = weight > 0
        z, y, weight = z[keep], y[keep], weight[keep]
    objective = _Objective(scoring, classes, y, weight, sample_weight is not None)
    search = _Search(z, objective, max_accuracy_drop, n_candidates)
    # A class without samples (weight) here cannot show what its offset costs it: lowering
    # it only ever helps the others. Its offset is not searched.
    tuned = np.flatnonzero(objective.class_size > 0)
    if len(tuned) < n_classes:
        absent = classes[objective.class_size == 0].tolist()
        warnings.warn(
            f"Classes {absent} have no samples (weight) in the data the offsets are tuned "
            "on, so their offsets are not tuned; tune on data that holds every class.",
            UserWarning,
            stacklevel=3,  # the caller of validate_params' wrapper
        )

    n_sweeps = 0
    while n_sweeps < max_sweeps:
        n_sweeps += 1
        if not any([search.step(k) for k in tuned]):
            break
    else:
        warnings.warn(
            f"tune_class_offsets stopped after max_sweeps={max_sweeps} sweeps while the "
            "objective was still improving. Increase max_sweeps.",
            ConvergenceWarning,
            stacklevel=3,  # the caller of validate_params' wrapper
        )

    offsets = search.offsets - search.offsets.mean()
    pred = (z + offsets).argmax(1)
    if not np.array_equal(pred, search.top.first):
        # Centring moved a sample across a tie by rounding: keep what was searched.
        offsets, pred = search.offsets.copy(), search.top.first
    base_pred = z.argmax(1)
    accuracy_drop = weight @ (base_pred == y) - weight @ (pred == y)
    return OffsetTuning(
        offsets=offsets,
        score=objective.score(pred),
        base_score=objective.score(base_pred),
        accuracy_drop=float(accuracy_drop / weight.sum()),
        n_sweeps=n_sweeps,
    )


class _Objective:
    """A class-wise objective scored for many candidate predictions at once."""

    def __init__(self, scoring, classes, y, weight, weighted: bool) -> None:
        self.y, self.weight, self.n_classes = y, weight, len(classes)
        self.class_size = np.bincount(y, weights=weight, minlength=len(classes))  # (K,)
        self.name, self.metric = scoring, None
        if isinstance(scoring, str):
            return
        func, sign, kwargs = scoring, 1, {}
        if hasattr(scoring, "_score_func"):  # a scorer from make_scorer
            if getattr(scoring, "_response_method", "predict") != "predict":
                raise ValueError(
                    f"scoring={scoring!r} scores probabilities or decision values, but offsets "
                    "change only the predicted labels. Use a scorer on labels, e.g. "
                    "make_scorer(f1_score, average='macro')."
                )
            func, sign, kwargs = scoring._score_func, scoring._sign, scoring._kwargs
        counted = [name for known, s, name in _COUNTED_METRICS if func is known and s == sign]
        if not kwargs and counted:
            self.name = counted[0]
            return
        self.name = None
        if weighted:
            parameters = inspect.signature(func).parameters.values()
            if not any(p.name == "sample_weight" or p.kind is p.VAR_KEYWORD for p in parameters):
                raise ValueError(
                    f"The scoring function {getattr(func, '__name__', func)!r} takes no "
                    "sample_weight, so the offsets cannot be tuned on weighted samples: fit "
                    "without sample_weight, or score with a function that takes it."
                )
            kwargs = {**kwargs, "sample_weight": weight}
        name = getattr(func, "__name__", func)

        def metric(pred: np.ndarray) -> float:
            value = func(classes[y], classes[pred], **kwargs)
            if np.ndim(value) or np.asarray(value).dtype.kind not in "biuf":
                shown = f"an array of shape {np.shape(value)}" if np.ndim(value) else repr(value)
                raise ValueError(  # e.g. average=None: one score per class
                    f"The scoring function {name!r} returned {shown}, not a number: the "
                    "offsets maximise one score (e.g. average='macro')."
                )
            return sign * float(value)

        self.metric = metric

    def keys(self, counts: np.ndarray, predict) -> list[np.ndarray]:
        """Sort keys of each candidate, most significant first, greater is better.

        ``counts`` (M, K) holds the weight of the correct predictions per class of each
        candidate;
        ``predict(m)`` gives candidate m's predicted columns, for metrics that need them.
        """
        if self.metric is not None:
            scores = np.array([self.metric(predict(m)) for m in range(len(counts))])
            return [np.nan_to_num(scores, nan=-np.inf)]
        if self.name == "accuracy":
            return [counts.sum(1) / self.class_size.sum()]
        present = self.class_size > 0
        accuracy = counts[:, present] / self.class_size[present]  # (M, K')
        if self.name == "balanced_accuracy":
            return [accuracy.mean(1)]
        if self.name == "neg_class_std":
            return [-accuracy.std(1)]
        ranked = np.sort(accuracy, axis=1)  # (M, K'), worst class first
        if self.name == "worst_class":
            return list(ranked.T)  # leximin
        hard = difficulty_groups(np.zeros(ranked.shape[1])) == len(GROUP_NAMES) - 1
        return [ranked[:, : int(hard.sum())].mean(1)]  # the hard third are the lowest

    def score(self, pred: np.ndarray) -> float:
        """The objective of one prediction (columns)."""
        correct = pred == self.y
        counts = np.bincount(self.y[correct], self.weight[correct], self.n_classes)[None]
        return float(self.keys(counts, lambda m: pred)[0][0])


class _TopTwo:
    """Largest and second-largest entry of each row of z + b, with argmax's tie rule."""

    def __init__(self, zb: np.ndarray) -> None:
        self.first, self.first_value, self.second, self.second_value = self._of(zb)

    @staticmethod
    def _of(zb: np.ndarray):
        rows = np.arange(len(zb))
        first = zb.argmax(1)
        rest = zb.copy()
        rest[rows, first] = -np.inf
        second = rest.argmax(1)
        return first, zb[rows, first], second, rest[rows, second]

    def update(self, zb: np.ndarray, k: int) -> None:
        """Refresh the rows that column k (just changed) enters, leaves or moves within."""
        new = zb[:, k]
        rows = (
            (self.first == k)
            | (self.second == k)
            | (new > self.second_value)
            | ((new == self.second_value) & (k < self.second))
        )
        first, first_value, second, second_value = self._of(zb[rows])
        self.first[rows], self.first_value[rows] = first, first_value
        self.second[rows], self.second_value[rows] = second, second_value


class _Search:
    """State of the coordinate ascent: offsets, z + b, and its top two per row."""

    def __init__(self, z, objective: _Objective, max_accuracy_drop, n_candidates) -> None:
        self.z, self.objective, self.n_candidates = z, objective, n_candidates
        self.y, self.weight = objective.y, objective.weight
        self.offsets = np.zeros(z.shape[1])
        self.zb = z.copy()  # (N, K), z + offsets, column by column as predict computes it
        self.top = _TopTwo(self.zb)
        self.min_correct = -np.inf
        if max_accuracy_drop is not None:
            total = self.weight.sum()
            # The slack absorbs rounding (0.29 * 100 < 29): exact for unit weights.
            allowed = max_accuracy_drop * total + 1e-9 * total
            self.min_correct = self.weight @ (self.top.first == self.y) - allowed

    def step(self, k: int) -> bool:
        """Best offset of class k with the others fixed; True when it changed."""
        own = self.top.first == k
        rival = np.where(own, self.top.second, self.top.first)  # (N,) best other class
        rival_value = np.where(own, self.top.second_value, self.top.first_value)
        zk, y, weight = self.z[:, k], self.y, self.weight
        if self.objective.metric is None:
            # Per-class counts change only through samples of class k or of their rival.
            rows = np.flatnonzero((y == k) | (y == rival))
            if not len(rows):
                return False
            rival, rival_value, zk = rival[rows], rival_value[rows], zk[rows]
            y, weight = y[rows], weight[rows]
        thresholds = rival_value - zk  # predicted k when b_k > threshold (up to rounding)
        order = np.argsort(thresholds)
        current = self.offsets[k]
        candidates = _candidates(thresholds[order], current, self.n_candidates)  # (M,)
        first = _first_win(zk, rival_value, k < rival, candidates, thresholds, order)
        counts = _class_counts(first, y, weight, rival, k, len(candidates), len(self.offsets))
        keys = self.objective.keys(counts, lambda m: np.where(first <= m, k, rival))
        total = counts.sum(1)
        # np.lexsort: last key most significant, ascending. Feasible first, then the
        # objective, overall accuracy, nearness to the current value, smaller value.
        order = [candidates, np.abs(candidates - current), -total]
        order += [-key for key in reversed(keys)] + [total < self.min_correct]
        best = candidates[np.lexsort(order)[0]]
        if best == current:
            return False
        self.offsets[k] = best
        self.zb[:, k] = self.z[:, k] + best
        self.top.update(self.zb, k)
        return True


def _candidates(edges: np.ndarray, current: float, n_candidates: int) -> np.ndarray:
    """Sorted offsets to try for one class: midpoints between its sorted thresholds."""
    edges = edges[np.concatenate([[True], edges[1:] != edges[:-1]])]  # (U,) distinct
    pad = (edges[-1] - edges[0]) / len(edges) if len(edges) > 1 else 1.0
    mids = (edges[:-1] + edges[1:]) / 2
    if len(mids) > n_candidates:
        spread = mids[np.linspace(0, len(mids) - 1, n_candidates).round().astype(int)]
        near = int(np.searchsorted(mids, current))
        width = max(n_candidates // 8, 1)
        mids = np.concatenate([spread, mids[max(near - width, 0) : near + width]])
    return np.unique(np.concatenate([mids, [edges[0] - pad, edges[-1] + pad, current]]))


def _first_win(own, rival, own_first, candidates, thresholds, order) -> np.ndarray:
    """Index of the first candidate at which each sample is predicted its own column.

    The test is argmax's own (own + b > rival, ties to the lower index) and is monotone
    in b. ``searchsorted`` of the thresholds rival − own (sorted by ``order``, which makes
    it fast) finds the index up to rounding; the rows where the exact test disagrees are
    settled by a binary search on it. len(candidates) means never.
    """
    n_candidates = len(candidates)

    def wins(index, rows):
        value = own[rows] + candidates[np.clip(index, 0, n_candidates - 1)]
        return (value > rival[rows]) | ((value == rival[rows]) & own_first[rows])

    every = np.arange(len(own))
    first = np.empty(len(own), dtype=np.intp)
    first[order] = np.searchsorted(candidates, thresholds[order], side="right")
    wrong = ((first < n_candidates) & ~wins(first, every)) | ((first > 0) & wins(first - 1, every))
    rows = np.flatnonzero(wrong)
    low = np.zeros(len(rows), dtype=np.intp)
    high = np.full(len(rows), n_candidates, dtype=np.intp)
    for _ in range(n_candidates.bit_length() if len(rows) else 0):
        middle = (low + high) // 2
        hit = wins(middle, rows)
        active = low < high
        high = np.where(active & hit, middle, high)
        low = np.where(active & ~hit, middle + 1, low)
    first[rows] = low
    return first


def _class_counts(first, y, weight, rival, k, n_candidates, n_classes) -> np.ndarray:
    """Weight of the correct predictions per class (columns) at each candidate (rows).

    A sample of class k is right from its ``first`` candidate on; a sample of its rival
    class is right until then; any other sample is wrong whatever b_k. With unit weights
    the sums are integers, exact in float64.
    """
    gain, keep = y == k, y == rival
    bins = (n_candidates + 1) * n_classes
    lost = _weighted_bincount(first[keep] * n_classes + y[keep], weight[keep], bins)
    lost = np.cumsum(lost.reshape(n_candidates + 1, n_classes), axis=0)[:n_candidates]
    counts = _weighted_bincount(y[keep], weight[keep], n_classes) - lost  # (M, K)
    counts[:, k] += np.cumsum(_weighted_bincount(first[gain], weight[gain], n_candidates + 1))[:-1]
    return counts


def _weighted_bincount(x, weight, length) -> np.ndarray:
    """np.bincount with weights, float64 even when x is empty (NumPy then gives int64)."""
    return np.bincount(x, weight, length).astype(np.float64, copy=False)


# ---------------------------------------------------------------------------- estimator
def _inner_has(attr: str):
    """available_if check: the (fitted) inner estimator has ``attr``."""
    return lambda self: hasattr(getattr(self, "estimator_", self.estimator), attr)


def _decision(estimator, X, classes: np.ndarray) -> np.ndarray:
    """The inner estimator's decision values as a float64 (n_samples, n_classes) array."""
    seen = np.asarray(getattr(estimator, "classes_", classes))
    if not np.array_equal(seen, classes):
        raise ValueError(
            f"The estimator was fitted on classes {seen.tolist()}, not on all of "
            f"{classes.tolist()}. Every class needs samples in every training fold: use "
            "a stratified cv, fewer folds, or more samples of the rare classes."
        )
    decision = estimator.decision_function(X)
    decision = np.asarray(to_numpy(decision) if is_torch_tensor(decision) else decision)
    decision = decision.astype(np.float64)
    if decision.ndim == 1 and len(classes) == 2:
        decision = np.column_stack([np.zeros_like(decision), decision])
    if decision.shape[1:] != (len(classes),):
        raise ValueError(
            f"The estimator's decision_function returned shape {decision.shape}, expected "
            f"(n_samples, {len(classes)}): one column per class (e.g. not SVC's 'ovo')."
        )
    return decision


FOLDS_ADVICE = (
    "Every class needs samples in every training fold: use a stratified cv, fewer folds, or "
    "more samples of the rare classes."
)


def offsets_splits(cv, X, y, groups=None, random_state=None, split_params=None) -> list:
    """The (train, test) index pairs of :class:`TunedOffsetsClassifierCV`'s ``cv``: a
    fraction is one stratified shuffled split of that validation share (``random_state``),
    anything else goes through :func:`~sklearn.model_selection.check_cv`. Each part in
    increasing order, as an HDF5 dataset is indexed (a shuffled split's is not). The
    splitter's ``split`` gets ``groups``, or under metadata routing the ``split_params``
    routed to it."""
    if isinstance(cv, Real) and 0 < cv < 1:
        cv = StratifiedShuffleSplit(n_splits=1, test_size=cv, random_state=random_state)
    else:
        cv = check_cv(cv, y, classifier=True)
    params = {"groups": groups} if split_params is None else split_params
    return [tuple(map(np.sort, fold)) for fold in cv_folds(cv, X, y, **params)]


def check_training_folds(
    y_index: np.ndarray, classes: np.ndarray, splits, advice: str = FOLDS_ADVICE
) -> None:
    """Refuse, before any fit, ``splits`` whose training part lacks a class (the offsets
    need every class's decision value from every fold's estimator), with ``advice``.
    ``y_index`` holds each sample's index into ``classes``."""
    for n, (train, _) in enumerate(splits):
        missing = np.flatnonzero(np.bincount(y_index[train], minlength=len(classes)) == 0)
        if len(missing):
            raise ValueError(
                f"The training part of fold {n} of the cv holds no sample of the classes "
                f"{classes[missing][:5].tolist()}{' ...' if len(missing) > 5 else ''} "
                f"({len(missing)} of {len(classes)}). {advice}".rstrip()
            )


def _fold_decision(estimator, X, y, train, test, fit_params, classes, keep):
    """Fit on the training part of a fold; decision values on its held-out part."""
    fit_params = _check_method_params(X, fit_params, indices=train)
    estimator.fit(_safe_indexing(X, train), _safe_indexing(y, train), **fit_params)
    return _decision(estimator, _safe_indexing(X, test), classes), (estimator if keep else None)


def _fitted_inside(estimator):
    """What ``estimator`` fits: itself, or the estimator a search (GridSearchCV, ...) fits,
    to which it passes the ``**params`` of its ``fit``."""
    from sklearn.model_selection._search import BaseSearchCV

    while isinstance(estimator, BaseSearchCV):
        estimator = estimator.estimator
    return estimator


def _routing() -> bool:
    return bool(get_config().get("enable_metadata_routing", False))


def _check_per_class_decision(estimator, n_classes: int) -> None:
    """Refuse one-vs-one decision values of 3 classes or more: K(K−1)/2 pairwise columns,
    read as one per class (with 3 classes, as many columns as classes). With two classes
    both shapes are the one decision value."""
    final = _fitted_inside(estimator)
    if isinstance(final, Pipeline):
        final = _fitted_inside(final.steps[-1][1])
    if n_classes > 2 and getattr(final, "decision_function_shape", None) == "ovo":
        raise ValueError(
            f"{type(final).__name__}(decision_function_shape='ovo') gives one decision value "
            "per pair of classes; the offsets need one per class: use "
            "decision_function_shape='ovr'."
        )


def _fit_takes_sample_weight(estimator) -> bool:
    """Whether ``estimator.fit`` takes ``sample_weight``: it names it, or it is a search
    over an estimator that does. Other ``**params`` (a Pipeline's, OneVsRestClassifier's)
    refuse it."""
    return has_fit_parameter(_fitted_inside(estimator), "sample_weight")


class TunedOffsetsClassifierCV(ClassifierMixin, MetaEstimatorMixin, BaseEstimator):
    """Classifier whose per-class logit offsets are tuned on held-out folds.

    Wraps a classifier with ``decision_function``, learns one additive offset per class
    on cross-validated (out-of-fold) decision values to maximise a class-wise objective,
    optionally within a bound on the loss of overall accuracy, and refits the classifier
    on all the data. It predicts ``classes_[argmax(decision_function(X) + offsets_)]``:
    a multiclass counterpart of
    :class:`~sklearn.model_selection.TunedThresholdClassifierCV`.

    Parameters
    ----------
    estimator : estimator instance
        The classifier, fitted or not (cloned unless ``cv="prefit"``). It must implement
        ``fit`` and ``decision_function`` with one column per class (a binary problem's
        1-D decision values are read as the columns [0, z]).
    scoring : str or callable, default="worst_class"
        The objective, greater is better: ``"worst_class"``, ``"balanced_accuracy"``
        (mean per-class accuracy), ``"hard_tercile"`` or ``"accuracy"`` as defined in
        :mod:`mr2_probe.metrics`; a scorer made by :func:`~sklearn.metrics.make_scorer`
        on predicted labels, such as :data:`mr2_probe.metrics.worst_class_scorer` or the
        negated :data:`mr2_probe.metrics.class_std_scorer`; or a callable
        ``metric(y_true, y_pred) -> float``.
    max_accuracy_drop : float or None, default=None
        Largest loss of overall accuracy on the held-out data that the offsets may cause,
        as a fraction (0.005 is half a point), relative to no offsets. ``None``: no bound.
    cv : int, float, cross-validation generator, iterable or "prefit", default=5
        Where the held-out decision values come from:

        - an int: that many folds of :class:`~sklearn.model_selection.StratifiedKFold`;
        - a float in (0, 1): one stratified train / validation split with that
          validation fraction, shuffled with ``random_state``;
        - a splitter or an iterable of (train, validation) index arrays; a sample held
          out in several splits counts once per split;
        - ``"prefit"``: ``estimator`` is already fitted and ``fit(X_val, y_val)`` tunes
          the offsets on the validation set it is given; nothing is fitted.
    refit : bool, default=True
        Refit the estimator on all of X after tuning. ``False`` keeps the estimator fitted
        on the training part and requires a single split (a float ``cv``, or one split).
        Not used with ``cv="prefit"``.
    n_jobs : int, default=None
        Folds fitted in parallel (joblib); ``None`` means 1.
    random_state : int, RandomState instance or None, default=None
        Shuffles the split of a float ``cv``; unused otherwise.
    store_cv_results : bool, default=False
        Keep the held-out decision values in ``cv_results_``, to tune other objectives or
        bounds with :func:`tune_class_offsets` without refitting.
    max_sweeps : int, default=50
        Most sweeps of the coordinate ascent over the classes.
    n_candidates : int, default=128
        Offsets tried per class and sweep when there are more distinct thresholds (see
        :func:`tune_class_offsets`).

    Attributes
    ----------
    estimator_ : estimator instance
        The classifier used to predict: refitted on all of X, fitted on the training part
        (``refit=False``), or ``estimator`` itself (``cv="prefit"``).
    offsets_ : ndarray of shape (n_classes,)
        Offsets added to the estimator's decision values, centred (mean 0) unless
        centring would move a sample on an exact tie (see :class:`OffsetTuning`).
    classes_ : ndarray of shape (n_classes,)
    best_score_ : float
        The objective on the held-out decision values with the offsets.
    base_score_ : float
        The objective on the held-out decision values without offsets.
    accuracy_drop_ : float
        Overall accuracy lost on the held-out data by the offsets (negative: gained).
    n_sweeps_ : int
        Sweeps of the coordinate ascent.
    cv_results_ : dict of ndarray
        Only with ``store_cv_results=True``: ``"decision_function"`` (n_rows, n_classes)
        held-out decision values, ``"y"`` (n_rows,) each row's class as a column of
        ``classes_``, ``"index"`` (n_rows,) each row's sample in X (to pick its
        ``sample_weight``). With K-fold cv the rows are the samples in order.
    n_features_in_ : int
        Defined when the estimator defines it.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined when the estimator defines it.

    See Also
    --------
    tune_class_offsets : The search, on decision values computed elsewhere.
    sklearn.model_selection.TunedThresholdClassifierCV : Tuned decision threshold of a
        binary classifier.

    Notes
    -----
    With decision values z_i ∈ R^K held out from the model that produced them, the
    offsets solve::

        max_b  score(y, argmax_k (z_ik + b_k))
        s.t.   acc(argmax z) − acc(argmax (z + b)) ≤ max_accuracy_drop

    approximately: deterministic coordinate ascent from b = 0, over the classes in the
    order of ``classes_``, reaches a point that no single offset can improve (see
    :func:`tune_class_offsets`; another order of the classes, such as the same labels as
    text, can reach another such point), and on the held-out data
    the objective is never lower than without offsets and the bound holds. The offsets
    only see held-out predictions of the training data; the data passed to ``predict``
    or ``score`` later play no part in them. ``sample_weight`` goes to the estimator's
    ``fit`` (indexed per fold) and weights the held-out samples in the objective and the
    bound; other fit parameters go to ``fit`` only.

    Adding b_k to the logit of class k multiplies the odds of class k by exp(b_k): the
    offsets act as a tuned class prior, and :meth:`predict_proba` is
    softmax(log p + b). They leave the learned features and weights untouched, so they
    correct where the decision boundaries sit between classes, not how well the classes
    are separated. With a softmax model (LogisticRegression, MR2LinearClassifier)
    ``predict`` and the argmax of ``predict_proba`` agree.

    Cost: ``n_folds + 1`` fits of the estimator (none with ``cv="prefit"``, one with
    ``refit=False``), plus the search: 0.1 to 0.3 s per sweep for 50,000 held-out samples
    and 100 classes, 10 to 20 sweeps on strongly biased logits.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.model_selection import train_test_split
    >>> from mr2_probe import TunedOffsetsClassifierCV
    >>> from mr2_probe.metrics import worst_class_accuracy
    >>> X, y = load_digits(return_X_y=True)
    >>> X_train, X_test, y_train, y_test = train_test_split(
    ...     X / 16, y, stratify=y, random_state=0
    ... )
    >>> probe = LogisticRegression(C=0.01, max_iter=1000)
    >>> tuned = TunedOffsetsClassifierCV(probe, max_accuracy_drop=0.005)
    >>> tuned = tuned.fit(X_train, y_train)
    >>> tuned.offsets_.shape
    (10,)
    >>> bool(tuned.best_score_ > tuned.base_score_ and tuned.accuracy_drop_ <= 0.005)
    True
    >>> plain = probe.fit(X_train, y_train)
    >>> round(worst_class_accuracy(y_test, plain.predict(X_test)), 3)
    0.674
    >>> round(worst_class_accuracy(y_test, tuned.predict(X_test)), 3)
    0.837
    """

    # Under metadata routing ``groups`` is not this estimator's own: it goes where the
    # splitter and the estimator ask for it (an outer router needs no request for it here).
    __metadata_request__fit = {"groups": metadata_routing.UNUSED}

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit", "decision_function"])],
        "scoring": [StrOptions(set(OBJECTIVES)), callable],
        "max_accuracy_drop": [Interval(Real, 0, None, closed="left"), None],
        "cv": [
            "cv_object",
            StrOptions({"prefit"}),
            Interval(RealNotInt, 0.0, 1.0, closed="neither"),
        ],
        "refit": ["boolean"],
        "n_jobs": [Integral, None],
        "random_state": ["random_state"],
        "store_cv_results": ["boolean"],
        "max_sweeps": [Interval(Integral, 1, None, closed="left")],
        "n_candidates": [Interval(Integral, 2, None, closed="left")],
    }

    def __init__(
        self,
        estimator,
        *,
        scoring="worst_class",
        max_accuracy_drop=None,
        cv=5,
        refit=True,
        n_jobs=None,
        random_state=None,
        store_cv_results=False,
        max_sweeps=50,
        n_candidates=128,
    ):
        self.estimator = estimator
        self.scoring = scoring
        self.max_accuracy_drop = max_accuracy_drop
        self.cv = cv
        self.refit = refit
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.store_cv_results = store_cv_results
        self.max_sweeps = max_sweeps
        self.n_candidates = n_candidates

    # The inner estimator's parameters are validated by its own fit.
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, sample_weight=None, groups=None, **fit_params):
        """Fit the estimator on each fold, tune the offsets, refit on all of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data, or with ``cv="prefit"`` the validation data; anything the
            estimator accepts.
        y : array-like of shape (n_samples,)
            Labels of any type.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the held-out samples in the objective and the accuracy bound, and
            passed to the estimator's ``fit``, indexed per fold, where it takes them (it
            names ``sample_weight``, or is a search over an estimator that does). A
            Pipeline takes them as ``<step>__sample_weight`` in ``fit_params``; without
            it, or for an estimator without them, a warning says the fit is unweighted.
            Under scikit-learn's metadata routing
            (``sklearn.set_config(enable_metadata_routing=True)``) they weight the
            objective and the bound all the same, and go to the estimator's ``fit`` (or a
            Pipeline step's) as its ``set_fit_request`` says.
        groups : array-like of shape (n_samples,), default=None
            Group labels for a group splitter as ``cv`` (GroupKFold and the like), given
            to its ``split``, and, indexed per fold, to the estimator's ``fit`` where it
            names a ``groups`` parameter (MR2LinearClassifierCV; not GridSearchCV or a
            Pipeline, whose ``fit`` takes ``**params``). Under metadata routing they go
            where the splitter's and the estimator's requests say.
        **fit_params : dict
            Passed to the estimator's ``fit``, indexed per fold; under metadata routing,
            where the requests say.

        Returns
        -------
        self : TunedOffsetsClassifierCV
        """
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None."
            )
        X, y = indexable(X, to_numpy(y) if is_torch_tensor(y) else y)
        y = column_or_1d(y, warn=True)
        if not len(y):
            raise ValueError(
                "Found array with 0 sample(s) (shape=(0,)) while a minimum of 1 is required."
            )
        check_classification_targets(y)
        _check_per_class_decision(self.estimator, len(np.unique(y)))
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, y, ensure_non_negative=True)
        if self.cv == "prefit":
            decision, y_index, index = self._prefit_decision(X, y, fit_params)
        else:
            fit_params, split_params = self._route(sample_weight, groups, fit_params)
            decision, y_index, index = self._cv_decision(X, y, fit_params, split_params)
        result = tune_class_offsets(
            decision,
            y_index,
            self.scoring,
            self.max_accuracy_drop,
            classes=self.classes_,
            sample_weight=None if sample_weight is None else sample_weight[index],
            max_sweeps=self.max_sweeps,
            n_candidates=self.n_candidates,
        )
        self.offsets_ = result.offsets
        self.best_score_ = result.score
        self.base_score_ = result.base_score
        self.accuracy_drop_ = result.accuracy_drop
        self.n_sweeps_ = result.n_sweeps
        if self.store_cv_results:
            self.cv_results_ = {"decision_function": decision, "y": y_index, "index": index}
        elif hasattr(self, "cv_results_"):
            del self.cv_results_  # a previous fit's, not this one's
        for name in ("n_features_in_", "feature_names_in_"):
            if hasattr(self.estimator_, name):
                setattr(self, name, getattr(self.estimator_, name))
            elif hasattr(self, name):
                delattr(self, name)
        return self

    def _route(self, sample_weight, groups, fit_params) -> tuple[dict, dict]:
        """The parameters of the estimator's ``fit`` and of the splitter's ``split``.

        Under scikit-learn's metadata routing, as the requests say (``sample_weight``
        weights the objective either way). Otherwise ``sample_weight`` goes where ``fit``
        names it, ``groups`` to the splitter and to a ``fit`` that names them."""
        if _routing():
            given = {"sample_weight": sample_weight, "groups": groups} | fit_params
            routed = process_routing(
                self, "fit", **{key: value for key, value in given.items() if value is not None}
            )
            return routed.estimator.fit, routed.splitter.split
        if sample_weight is not None and _fit_takes_sample_weight(self.estimator):
            fit_params = {**fit_params, "sample_weight": sample_weight}
        elif sample_weight is not None and not any(
            key.endswith("__sample_weight") for key in fit_params
        ):
            warnings.warn(
                f"{type(_fitted_inside(self.estimator)).__name__}.fit does not take "
                "sample_weight: the weights weight the offsets' objective and the "
                "accuracy bound, not the estimator's fit (a Pipeline takes them as "
                "<step>__sample_weight).",
                UserWarning,
                stacklevel=4,  # _route, fit, scikit-learn's _fit_context, the caller
            )
        if groups is not None and has_fit_parameter(self.estimator, "groups"):
            # A search inside that names them (MR2LinearClassifierCV) splits by them
            # too. Not a fit of **params (a Pipeline refuses an unrouted groups).
            fit_params = {**fit_params, "groups": groups}
        return fit_params, {"groups": groups}

    def get_metadata_routing(self):
        """Get metadata routing of this object.

        Please check :ref:`User Guide <metadata_routing>` on how the routing mechanism
        works. ``sample_weight`` is also this estimator's own: the weights weight the
        held-out samples in the objective and the accuracy bound.

        Returns
        -------
        routing : MetadataRouter
            The routes of ``fit``'s metadata to the estimator's ``fit`` and the
            splitter's ``split``.
        """
        return (
            MetadataRouter(owner=self)
            .add_self_request(self)
            .add(
                estimator=self.estimator,
                method_mapping=MethodMapping().add(caller="fit", callee="fit"),
            )
            .add(
                splitter=self.cv,
                method_mapping=MethodMapping().add(caller="fit", callee="split"),
            )
        )

    def _prefit_decision(self, X, y, fit_params):
        """Decision values of the fitted estimator on the validation set (X, y)."""
        if fit_params:
            raise ValueError(
                f"cv='prefit' fits nothing, so the fit parameters {sorted(fit_params)} "
                "would be ignored. Fit the estimator with them first, or use another cv "
                "(sample_weight is accepted: it weights the validation samples)."
            )
        try:
            check_is_fitted(self.estimator)
        except NotFittedError as exc:
            raise NotFittedError(
                "When cv='prefit', the estimator must already be fitted. Fit it on "
                "training data first, or let this estimator fit it with cv=5."
            ) from exc
        self.estimator_ = self.estimator
        self.classes_ = np.asarray(self.estimator_.classes_)
        sorter = np.argsort(self.classes_)
        try:
            position = np.searchsorted(self.classes_, y, sorter=sorter)
        except TypeError:  # labels of another kind than classes_ (strings against numbers)
            known = set(self.classes_.tolist())
            unknown = list(dict.fromkeys(label for label in y.tolist() if label not in known))
        else:
            y_index = sorter[np.clip(position, 0, len(self.classes_) - 1)]
            unknown = np.unique(y[self.classes_[y_index] != y]).tolist()
        if unknown:
            raise ValueError(
                f"y has classes {unknown[:10]}{' ...' if len(unknown) > 10 else ''} that the "
                f"prefitted estimator does not know (its classes_ are {self.classes_.tolist()})."
            )
        decision = _decision(self.estimator_, X, self.classes_)
        return decision, y_index, np.arange(len(y))

    def _cv_decision(self, X, y, fit_params, split_params):
        """Out-of-fold decision values; fits estimator_ as refit asks."""
        self.classes_, y_index = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                "Tuning offsets needs samples of at least 2 classes in the data, but the "
                f"data contains only one class: {self.classes_[0]!r}."
            )
        splits = offsets_splits(
            self.cv, X, y, random_state=self.random_state, split_params=split_params
        )
        check_training_folds(y_index, self.classes_, splits)
        if not self.refit and len(splits) > 1:
            raise ValueError(
                f"refit=False keeps the estimator of a single split, but cv has "
                f"{len(splits)} splits. Use refit=True, a float cv such as 0.2, or one split."
            )
        folds = Parallel(n_jobs=self.n_jobs)(
            delayed(_fold_decision)(
                clone(self.estimator), X, y, train, test, fit_params, self.classes_, not self.refit
            )
            for train, test in splits
        )
        index = np.concatenate([test for _, test in splits])
        order = np.argsort(index, kind="stable")  # K-fold: back to the order of X
        decision = np.concatenate([fold for fold, _ in folds])[order]
        index = index[order]
        if self.refit:
            self.estimator_ = clone(self.estimator).fit(X, y, **fit_params)
        else:
            self.estimator_ = folds[0][1]
        return decision, y_index[index], index

    def _offset_decision(self, X) -> np.ndarray:
        """Decision values with the offsets, shape (n_samples, n_classes)."""
        check_is_fitted(self, "offsets_")
        return _decision(self.estimator_, X, self.classes_) + self.offsets_

    def decision_function(self, X):
        """Decision values of the estimator plus the offsets.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        decision : ndarray of shape (n_samples, n_classes), or (n_samples,) for two
            classes (z1 − z0, positive for ``classes_[1]``).
        """
        decision = self._offset_decision(X)
        return decision[:, 1] - decision[:, 0] if decision.shape[1] == 2 else decision

    def predict(self, X):
        """Class of the largest decision value plus offset.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
        """
        decision = self._offset_decision(X)
        return self.classes_[decision.argmax(1)]

    @available_if(_inner_has("predict_proba"))
    def predict_proba(self, X):
        """Probabilities with the offsets as a class prior: softmax(log p + offsets_).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
        """
        return softmax(self._log_proba(X), axis=1)

    @available_if(_inner_has("predict_proba"))
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        log_proba : ndarray of shape (n_samples, n_classes)
        """
        return log_softmax(self._log_proba(X), axis=1)

    def _log_proba(self, X) -> np.ndarray:
        """The estimator's log-probabilities plus the offsets (unnormalised)."""
        check_is_fitted(self, "offsets_")
        if hasattr(self.estimator_, "predict_log_proba"):
            log_proba = self.estimator_.predict_log_proba(X)
        else:
            with np.errstate(divide="ignore"):
                log_proba = np.log(self.estimator_.predict_proba(X))
        log_proba = to_numpy(log_proba) if is_torch_tensor(log_proba) else log_proba
        return np.asarray(log_proba, dtype=np.float64) + self.offsets_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = get_tags(self.estimator).input_tags.sparse
        return tags
