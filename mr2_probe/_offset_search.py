"""The search of per-class logit offsets on held-out decision values:
:func:`tune_class_offsets`, a pure function of arrays."""

from __future__ import annotations

import inspect
import warnings
from decimal import Decimal
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, balanced_accuracy_score
from sklearn.utils._param_validation import Interval, StrOptions, validate_params
from sklearn.utils.validation import _check_sample_weight, check_array, column_or_1d

from ._data import numpy_if_tensor, summable
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
        "max_accuracy_drop": [Interval(Real, 0, 1, closed="left"), None],
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
        Decision values (logits), a torch tensor too (on any device, of any float dtype,
        read in float64); a 1-D array is a binary problem's z1 − z0 and is read as the two
        columns [0, z].
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
        Largest loss of overall accuracy on ``(decision, y)`` allowed, as a fraction in
        [0, 1) (0.005 is half a point), relative to no offsets. ``None``: no bound.
    classes : array-like of shape (n_classes,), default=None
        Distinct labels of the columns, passed to a scorer or callable (``classes[y]``);
        a scorer's ``labels``, if it has any, must name one of them at least. Default:
        ``0 … n_classes − 1``.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the samples in the objective and in the accuracy bound (a class's
        accuracy is its weighted fraction of correct predictions; a class of zero weight
        is left out, as an absent one). A scorer or callable is given every row with its
        weight, those of weight 0 too: scikit-learn's averages over labels (f1 "macro")
        count the labels of every row.
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
    # Tensors that NumPy cannot read (on a GPU, requiring grad, bfloat16 logits), as the
    # estimators read them: check_array failed on them in torch's words.
    decision, y, sample_weight = (
        numpy_if_tensor(value, name)
        for value, name in ((decision, "decision"), (y, "y"), (sample_weight, "sample_weight"))
    )
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
    if classes.ndim != 1 or len(classes) != n_classes:
        raise ValueError(
            f"classes must hold one label per column of decision ({n_classes}), got shape "
            f"{classes.shape}."
        )
    try:
        labels = classes.tolist()  # (of mixed types too; NaN is no label set() can tell)
        repeated = bool(len(set(labels)) != n_classes or sum(v != v for v in labels) > 1)
    except TypeError:  # unhashable labels, or pd.NA's ambiguous truth: left to the scorer
        repeated = False
    if repeated:
        raise ValueError(f"classes must be distinct labels, got {classes.tolist()}.")
    # Scaled down by a power of two where their sum would overflow (weights near the
    # largest float), which changes no ratio: summed to inf, every class's accuracy was
    # NaN, the score 0 and the accuracy bound unheld.
    weight = summable(_check_sample_weight(sample_weight, z, ensure_non_negative=True))
    if not weight.sum() > 0:
        raise ValueError("The sum of sample weights must be positive.")
    objective = _Objective(scoring, classes, y, weight, sample_weight is not None)
    if objective.metric is None and not (weight > 0).all():
        # For a counted objective rows of zero weight are no rows: their thresholds would
        # be candidates too, and move the search's path (a row dropped and a row of zero
        # weight tuned alike). A scorer keeps them: scikit-learn's averages over labels
        # (f1 "macro") count the labels of every row, whatever its weight.
        keep = weight > 0
        z, y, weight = z[keep], y[keep], weight[keep]
        objective = _Objective(scoring, classes, y, weight, sample_weight is not None)
    search = _Search(z, objective, max_accuracy_drop, n_candidates)
    # A class without samples (weight) here cannot show what its offset costs it: lowering
    # it only ever helps the others. Its offset is not searched.
    tuned = np.flatnonzero(objective.class_size > 0)
    if len(tuned) < 2:
        raise ValueError(
            "Tuning offsets needs samples (weight) of at least 2 classes in the data, but "
            f"only the class {classes[tuned].tolist()[0]!r} has any: raising its offset would cost "
            "nothing seen here."
        )
    if len(tuned) < n_classes:
        absent = classes[objective.class_size == 0].tolist()
        warnings.warn(
            f"Classes {absent} have no samples (weight) in the data the offsets are tuned "
            "on, so their offsets are not tuned, and the others' are tuned blind to them: "
            "an offset raised takes predictions from them at no cost seen here, so their "
            "accuracy can drop. Tune on data that holds every class.",
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


def scoring_function(scoring, weighted: bool, classes=None, labels=None, weight=None) -> tuple:
    """The function, sign and keyword arguments of a scoring that is no name, checked
    before any fit: it must score labels, take ``sample_weight`` when the samples are
    ``weighted``, and name among its ``labels`` (if it has any) one of ``classes`` at
    least; given ``labels`` (true labels, weighted by ``weight``), it scores them once
    as their own predictions, so that its own errors (a ``pos_label`` that is no class,
    ``average="binary"`` on more classes) come before the fits too."""
    func, sign, kwargs = scoring, 1, {}
    if hasattr(scoring, "_score_func"):  # a scorer from make_scorer
        if getattr(scoring, "_response_method", "predict") != "predict":
            raise ValueError(
                f"scoring={scoring!r} scores probabilities or decision values, but offsets "
                "change only the predicted labels. Use a scorer on labels, e.g. "
                "make_scorer(f1_score, average='macro')."
            )
        func, sign, kwargs = scoring._score_func, scoring._sign, scoring._kwargs
    if (required := _required_positional(func, kwargs)) > 2:
        # A scorer(estimator, X, y), as GridSearchCV and MR2LinearClassifierCV take it:
        # called as metric(y_true, y_pred) its trial failed with Python's "missing 1
        # required positional argument".
        raise ValueError(
            f"scoring={scoring!r} takes {required} positional arguments, "
            "as a scorer(estimator, X, y) does; the offsets are scored on predicted labels "
            "alone. Give a metric(y_true, y_pred), or a scorer made by make_scorer(metric)."
        )
    if weighted:
        parameters = inspect.signature(func).parameters.values()
        if not any(p.name == "sample_weight" or p.kind is p.VAR_KEYWORD for p in parameters):
            raise ValueError(
                f"The scoring function {getattr(func, '__name__', func)!r} takes no "
                "sample_weight, so the offsets cannot be tuned on weighted samples: fit "
                "without sample_weight, or score with a function that takes it."
            )
    named = {**getattr(func, "keywords", {}), **kwargs}.get("labels")  # functools.partial's
    # Compared as objects: NumPy's isin of strings against numbers matches '1' with 1 once
    # the classes are many (its sorting path makes both strings).
    if (
        classes is not None
        and named is not None
        and not np.isin(np.asarray(named, object), np.asarray(classes, object)).any()
    ):
        raise ValueError(
            f"The scorer's labels {np.asarray(named).tolist()!r} name none of the classes "
            f"{np.asarray(classes).tolist()!r}: every candidate would score alike. Give the "
            "scorer labels as the estimator's classes_ holds them."
        )
    if labels is not None:
        trial = {**kwargs, "sample_weight": np.array(weight)} if weighted else kwargs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (ill-defined scores of perfect predictions)
            _number(func(np.array(labels), np.array(labels), **trial), func)  # copies
    return func, sign, kwargs


def _required_positional(func, given=()) -> int:
    """How many positional arguments ``func`` requires besides ``sample_weight`` and those
    ``given`` by name (a make_scorer's keyword arguments, as make_group_scorer's
    ``groups_by_label``), 2 where it shows no signature."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # (some builtins: called as they are)
        return 2
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(
        p.kind in positional and p.default is p.empty and p.name not in {"sample_weight", *given}
        for p in parameters
    )


def _number(value, func) -> float:
    """A scoring function's ``value`` as a float, refused if it is no single number."""
    if isinstance(value, (Real, Decimal)):  # (a Fraction or a Decimal: an object array)
        return float(value)
    if np.ndim(value) or np.asarray(value).dtype.kind not in "biuf":
        shown = f"an array of shape {np.shape(value)}" if np.ndim(value) else repr(value)
        raise ValueError(  # e.g. average=None: one score per class
            f"The scoring function {getattr(func, '__name__', func)!r} returned {shown}, not "
            "a number: the offsets maximise one score (e.g. average='macro')."
        )
    return float(value)


class _Objective:
    """A class-wise objective scored for many candidate predictions at once."""

    def __init__(self, scoring, classes, y, weight, weighted: bool) -> None:
        self.y, self.weight, self.n_classes = y, weight, len(classes)
        self.class_size = np.bincount(y, weights=weight, minlength=len(classes))  # (K,)
        self.name, self.metric = scoring, None
        if isinstance(scoring, str):
            return
        func, sign, kwargs = scoring_function(scoring, weighted, classes)
        counted = [name for known, s, name in _COUNTED_METRICS if func is known and s == sign]
        if not kwargs and counted:
            self.name = counted[0]
            return
        self.name = None
        if weighted:
            kwargs = {**kwargs, "sample_weight": weight}

        def metric(pred: np.ndarray) -> float:
            return sign * _number(func(classes[y], classes[pred], **kwargs), func)

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
        """The objective of one prediction (columns); a scorer's NaN stays NaN (the search
        ranks it below every number)."""
        if self.metric is not None:
            return self.metric(pred)
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
