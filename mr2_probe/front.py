"""The accuracy–worst-class front: what each fairness lever costs, and a rule to choose.

Every lever is a point (ERM, the MR² margins) or a curve (a sweep of ``class_tilt``, a
sweep of the bound on the overall accuracy that tuned class offsets may spend) in the
plane of overall accuracy against worst-class accuracy. :func:`accuracy_front` fits them
all on a training split and scores them on a validation split (and on a test split when
given, for the report only); :func:`choose_point` applies a rule stated up front: the
largest validation worst-class accuracy whose validation overall accuracy is within
``bound`` of the ERM probe's.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from numbers import Real

import joblib
import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import Pipeline
from sklearn.utils._param_validation import StrOptions, validate_parameter_constraints
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _num_samples, column_or_1d

from ._data import (
    check_h5_open,
    check_no_missing_labels,
    labels_not_1d,
    numpy_if_tensor,
    plain,
    written,
)
from ._offset_search import tune_class_offsets
from ._offsets import TunedOffsetsClassifierCV, check_training_folds, offsets_splits
from .metrics import (
    _kind_names,
    _label_kinds,
    _text_and_numbers,
    classwise_summary,
    difficulty_groups,
    per_class_accuracy,
)

# The folds of the training data on which the front's offsets are tuned, by default.
OFFSETS_CV = 3

#: Default bound of the selection rule: 0.5 point of overall accuracy.
DEFAULT_BOUND = 0.005


@dataclass
class FrontPoint:
    """One fitted configuration of a lever and its class-wise scores.

    ``lever`` is ``"ERM"``, ``"MR2"``, ``"tilt"`` or ``"offsets"``; ``value`` the tilt t or
    the offsets' bound (a fraction of overall accuracy); ``name`` the lever's name and
    value, a tilt's written as it reads back (``"tilt=1.23456789"``), a bound's in points,
    in %g (``"offsets≤0.5pt"``); ``estimator`` the unfitted
    configuration, ready to refit; ``validation`` / ``test`` the summaries of
    :func:`mr2_probe.metrics.classwise_summary` (fractions; groups fixed by ERM on each
    split); ``model`` the fitted model they score, the one to report or keep. A tilt
    point's model was fitted from the previous point's solution: the same optimum to
    within ``tol``, so a cold refit of ``estimator`` on the same data can predict a
    sample near a class boundary otherwise (on half of digits, t = 20: 95.55% against
    the point's 95.44%).
    """

    name: str
    lever: str
    value: float | None
    estimator: object = field(repr=False)
    validation: dict = field(default_factory=dict)
    test: dict | None = None
    model: object = field(default=None, repr=False)


@dataclass
class Front:
    """The points of :func:`accuracy_front`, the rule's bound and its choice."""

    points: list[FrontPoint]
    bound: float = DEFAULT_BOUND
    chosen: str | None = None

    def point(self, name: str) -> FrontPoint:
        for p in self.points:
            if p.name == name:
                return p
        raise KeyError(f"No point named {name!r}; points: {[p.name for p in self.points]}.")

    def to_dict(self) -> dict:
        """JSON-ready, in percent like :meth:`ClasswiseReport.to_dict` and the tables.

        ``"units": "percent"``; the scores, the rule's ``bound`` and an offsets point's
        ``value`` (its bound) are in percent (points of accuracy); a tilt point's ``value``
        is its t, which has no unit.
        """
        return {
            "units": "percent",
            "bound": _percent(self.bound),
            "chosen": self.chosen,
            "rule": _rule(self.bound),
            "points": [
                {
                    "name": p.name,
                    "lever": p.lever,
                    "value": _percent(p.value) if p.lever == "offsets" else p.value,
                    "validation": _finite(p.validation),
                    "test": None if p.test is None else _finite(p.test),
                }
                for p in self.points
            ],
        }

    def to_text(self) -> str:
        return self._table(markdown=False)

    def to_markdown(self) -> str:
        return self._table(markdown=True)

    def _table(self, markdown: bool) -> str:
        columns = ["overall", "hard", "worst"]
        header = ["point"] + [f"val {c}" for c in columns]
        with_test = any(p.test is not None for p in self.points)
        if with_test:
            header += [f"test {c}" for c in columns]
        rows = []
        for p in self.points:
            row = [p.name + (" ← chosen" if p.name == self.chosen else "")]
            row += [_cell(p.validation.get(c)) for c in columns]
            if with_test:
                row += [_cell(None if p.test is None else p.test.get(c)) for c in columns]
            rows.append(row)
        splits = "validation and test" if with_test else "validation"
        title = f"accuracy front (%, {splits}); rule: {_rule(self.bound)}"
        if markdown:
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            return title + "\n\n" + "\n".join(lines)
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            row[0].ljust(widths[0])
            + "".join(v.rjust(w + 2) for v, w in zip(row[1:], widths[1:], strict=True))
            for row in [header, *rows]
        ]
        return "\n".join([title, lines[0], "-" * len(lines[0]), *lines[1:]])


def _rule(bound: float) -> str:
    return (
        "the largest validation worst-class accuracy whose validation overall "
        f"accuracy is within {100 * bound:g} pt of ERM's"
    )


def _cell(value) -> str:
    return "nan" if value is None or not np.isfinite(value) else f"{100 * value:.2f}"


def _percent(value: float | None) -> float | None:
    # Rounded at 1e-10 so that 0.57 is written 57.0, not 56.99999999999999.
    return None if value is None or not np.isfinite(value) else round(100 * float(value), 10)


def _finite(summary: dict) -> dict:
    """Scores in percent, NaN as None."""
    return {k: _percent(v) for k, v in summary.items()}


def _with_params(estimator, **params):
    """A clone of an MR2LinearClassifier, or of a Pipeline ending in one, with ``params``."""
    estimator = clone(estimator)
    if isinstance(estimator, Pipeline):
        last = estimator.steps[-1][0]
        params = {f"{last}__{key}": value for key, value in params.items()}
    return estimator.set_params(**params)


def _final(estimator):
    """The classifier itself: the last step of a pipeline."""
    return estimator[-1] if isinstance(estimator, Pipeline) else estimator


@contextmanager
def collecting_short() -> Iterator[list]:
    """Gather the ConvergenceWarnings raised inside into the list it gives (filled on
    exit), for its caller to report as one; other warnings pass on as they were, also
    where an error ends the block (they were lost: a search's warning of its failed fits
    before its error that no value could be chosen)."""
    short, caught, failed = [], [], True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            yield short
        failed = False
    finally:
        short.extend(w for w in caught if issubclass(w.category, ConvergenceWarning))
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                _pass_on(w, failed)


def _pass_on(held: warnings.WarningMessage, failed: bool, message=None) -> None:
    """Show the warning ``held`` (recorded by ``catch_warnings``) as it would have been
    shown, its ``message`` in place of its own where given. Where ``failed`` (an error
    ended the block that held it, a Ctrl-C too) never in the place of that error: one
    that the filters make an error (held under a filter inside) is left out."""
    with suppress(Warning if failed else ()):
        warnings.warn_explicit(
            held.message if message is None else message,
            held.category,
            held.filename,
            held.lineno,
            source=held.source,
        )


def fit_collecting_short(estimator, X, y, **fit_params) -> list:
    """Fit ``estimator``; return the ConvergenceWarnings of its fits (a search's can be
    many), which its caller reports as one. Other warnings pass on as they were."""
    with collecting_short() as short:
        estimator.fit(X, y, **fit_params)
    return short


def _fit(estimator, X, y, short: list, name: str, **fit_params):
    """``estimator`` fitted; ``(name, its ConvergenceWarnings)`` appended to ``short`` if a
    fit stopped short of tol (they are gathered into one by :func:`accuracy_front`)."""
    caught = fit_collecting_short(estimator, X, y, **fit_params)
    if caught:
        short.append((name, caught))
    return estimator


def _same_configuration(a, b) -> bool:
    """Whether two unfitted estimators (pipelines) have the same parameters, numbers
    compared as numbers (lam=0 is lam=0.0, and np.float64(0) too)."""

    def plain(params: dict) -> dict:
        def value(v):
            if isinstance(v, Real) and not isinstance(v, bool):
                return float(v)
            if isinstance(v, dict):  # class_weight={0: 1} is {0: 1.0}
                return {value(k): value(w) for k, w in v.items()}
            if isinstance(v, BaseEstimator):
                return type(v).__name__  # its parameters are among the deep ones
            if isinstance(v, list) and all(isinstance(step, tuple) for step in v):
                return [(name, type(step).__name__) for name, step in v]  # a pipeline's steps
            return v

        return {key: value(v) for key, v in params.items()}

    first, second = (joblib.hash(plain(m.get_params(deep=True))) for m in (a, b))
    return first == second


#: Parameters that only some models read, and whether a probe (MR2LinearClassifier) reads
#: each: a model that does not fits the same whatever its value. (Read before the fit
#: validates them: lam != 0, where lam="x" or None is left to its fit's error.)
_READ_BY_SOME = {
    "tau": lambda probe: probe.lam != 0,
    "projection_rank": lambda probe: probe.lam != 0,
    "fit_intercept": lambda probe: probe.head == "linear",
    "p": lambda probe: probe.c_bar is not None,
    "difficulty": lambda probe: probe.c_bar is not None,
    "scale": lambda probe: probe.head == "cosine",
    "C": lambda probe: probe.head == "linear" or probe.lam != 0,  # (the penalty's)
    # The minibatch solvers' (their order, a projection's start): L-BFGS at lam=0 reads none.
    **dict.fromkeys(
        ("batch_size", "learning_rate", "n_iter_no_change", "random_state"),
        lambda probe: probe.lam != 0 or probe.solver in ("adam", "sgd"),
    ),
    "verbose": lambda probe: False,  # (what a fit prints, not what it fits)
}


def _same_model(estimator, erm) -> bool:
    """Whether the unfitted ``estimator`` has ``erm``'s configuration but for parameters it
    does not read (p without margins, say): the same model fitted again."""
    reference = _final(erm).get_params()
    unread = {
        name: reference[name]
        for name, reads in _READ_BY_SOME.items()
        if not reads(_final(estimator))
    }
    # ("auto" is "lbfgs" at lam=0)
    if _final(estimator)._resolved_solver() == _final(erm)._resolved_solver():
        unread["solver"] = reference["solver"]
    return _same_configuration(_with_params(estimator, **unread), erm)


def _convex(probe) -> bool:
    """A fitted probe whose problem is convex: a linear head solved by L-BFGS."""
    return probe.head_ == "linear" and probe.solver_ == "lbfgs"


def _warm_fit(previous, tilt: float, X, y):
    """``previous`` refitted at ``tilt`` from its solution; None if it did not converge."""
    model = copy.deepcopy(previous)
    warm_start = _final(model).warm_start
    _final(model).set_params(warm_start=True, class_tilt=tilt)
    if fit_collecting_short(model, X, y):
        return None
    # The point's model has its estimator's parameters: a later fit of it starts cold.
    _final(model).set_params(warm_start=warm_start)
    return model


def accuracy_front(
    estimator,
    X,
    y,
    X_val,
    y_val,
    *,
    tilts: Sequence[float] = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0),
    offset_bounds: Sequence[float] = (),
    offsets_cv: int = OFFSETS_CV,
    X_test=None,
    y_test=None,
    bound: float = DEFAULT_BOUND,
    erm=None,
    groups=None,
    random_state=None,
) -> Front:
    """Fit ERM, MR² and the sweeps of each lever on (X, y); score them on the validation set.

    Parameters
    ----------
    estimator : MR2LinearClassifier or Pipeline ending in one
        The MR² configuration (unfitted). ERM is the same with ``c_bar=None`` and
        ``lam=0`` (no margins, no learned projection), unless ``erm`` is given; the tilt
        sweep sets ``class_tilt`` on the MR² configuration, and the MR² point is fitted
        at ``class_tilt=0`` whatever the estimator's (a tilt of its own is a ``tilts``
        value).
    X, y : training data of the front.
    X_val, y_val : validation data, the only data the rule reads; labels that are no
        class of ``y`` are refused (no point could predict them).
    tilts : sequence of float, default=(0, 0.5, 1, 2, 5, 10)
        ``class_tilt`` values (finite, ≥ 0) of the tilt curve (``0`` is the MR² point
        itself). Along the curve each fit starts from the previous point's solution
        (a linear head solved by L-BFGS: a convex problem, solved to ``tol`` from either
        start, so a cold refit agrees to within ``tol``; each point keeps the model it
        scored as ``model``), and cold where that fit stops short of ``tol``. A front
        that would hold ERM alone (an estimator of ERM's configuration, no tilt above 0
        and no ``offset_bounds``) is refused.
    offset_bounds : sequence of float, default=()
        Bounds (fractions of overall accuracy, 0.005 = 0.5 pt) for class offsets tuned on
        the ERM probe by :class:`TunedOffsetsClassifierCV` (worst-class objective,
        ``offsets_cv`` folds of the training data). The folds are fitted once; each bound
        re-tunes the offsets on the same out-of-fold logits. Their points follow the
        others, in increasing bound.
    offsets_cv : int, float or cross-validation generator, default=3
        The ``cv`` of :class:`TunedOffsetsClassifierCV` the offsets are tuned on (an int
        is a number of stratified folds, a float the validation share of one stratified
        shuffled split); each training part must hold every class, checked before any
        fit.
    X_test, y_test : optional test data, scored for the report, never for the choice;
        labelled with classes of ``y``, as ``y_val``.
    bound : float, default=0.005
        Bound of the selection rule (:func:`choose_point`).
    erm : MR2LinearClassifier or Pipeline ending in one, optional
        The ERM configuration (unfitted), when it was tuned on its own (its own C): the
        reference of the rule and the probe the offsets are tuned on. Its ``c_bar``,
        ``lam`` and ``class_tilt`` are set to None, 0 and 0. The tilt sweep starts from the
        MR² point (its first point is fitted cold without one), never from this ERM.
    groups : array-like of shape (n_samples,), optional
        Group labels of (X, y) for a group splitter as ``offsets_cv`` (GroupKFold and the
        like), given to its ``split``.
    random_state : int, RandomState instance or None, default=None
        Seed of the split of a float ``offsets_cv``, kept by the offsets'
        :class:`TunedOffsetsClassifierCV`. An int gives the check before the fits, the fit
        and a refit one split; a RandomState instance draws anew each time.

    Returns
    -------
    front : Front
        Points in the order ERM, MR² (left out where its configuration is ERM's, but
        for what it does not read: ``p`` without margins, say), tilts (increasing),
        offsets (by bound); ``front.chosen`` names the rule's choice. Points whose fit
        stopped short of tol are named in one ConvergenceWarning, with the first one's
        own warning (its advice).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.model_selection import train_test_split
    >>> from mr2_probe import MR2LinearClassifier
    >>> from mr2_probe.front import accuracy_front
    >>> X, y = load_digits(return_X_y=True)
    >>> X_fit, X_val, y_fit, y_val = train_test_split(
    ...     X / 16, y, test_size=0.3, stratify=y, random_state=0
    ... )
    >>> probe = MR2LinearClassifier(c_bar=2, C=0.1, random_state=0)
    >>> front = accuracy_front(
    ...     probe, X_fit, y_fit, X_val, y_val, tilts=[1.0], offset_bounds=[0.01]
    ... )
    >>> [p.name for p in front.points]
    ['ERM', 'MR2', 'tilt=1', 'offsets≤1pt']
    >>> front.chosen
    'offsets≤1pt'
    >>> chosen, erm = front.point(front.chosen), front.point("ERM")
    >>> bool(chosen.validation["worst"] > erm.validation["worst"])
    True
    >>> bool(erm.validation["overall"] - chosen.validation["overall"] <= front.bound)
    True
    >>> print(front.to_text())  # doctest: +SKIP
    accuracy front (%, validation); rule: the largest validation worst-class ...
    point                 val overall  val hard  val worst
    ------------------------------------------------------
    ERM                         95.00     89.99      84.62
    MR2                         93.89     89.31      80.77
    tilt=1                      92.96     87.54      84.62
    offsets≤1pt ← chosen        94.63     91.92      89.09
    """
    tilts, offset_bounds = _numbers("tilts", tilts), _numbers("offset_bounds", offset_bounds)
    if not isinstance(bound, Real):  # (its range is checked below)
        raise ValueError(f"bound must be a number, a fraction in [0, 1), got {plain(bound)!r}.")
    # (h5py's "Unable to synchronously get dataspace" from the checks below otherwise)
    check_h5_open(X=X, y=y, X_val=X_val, y_val=y_val, X_test=X_test, y_test=y_test, groups=groups)
    # Labels and groups that NumPy cannot read (tensors on a GPU, or requiring grad), as the
    # estimators take them: the checks below failed on them in torch's words ("can't
    # convert cuda:0 device type tensor to numpy").
    y, y_val, y_test, groups = (
        numpy_if_tensor(value, name)
        for value, name in ((y, "y"), (y_val, "y_val"), (y_test, "y_test"), (groups, "groups"))
    )
    _check_front_options(tilts, offset_bounds, bound, X_test, y_test, estimator, erm)
    # (counts first: an empty split is refused without a warning that it lacks every class)
    _check_scored_features(X, {"val": (X_val, y_val), "test": (X_test, y_test)})
    _check_known_labels(y, {"y_val": y_val, "y_test": y_test})
    splits = hasattr(offsets_cv, "__iter__") and not isinstance(offsets_cv, str)
    if offset_bounds and splits and not hasattr(offsets_cv, "split"):
        offsets_cv = list(offsets_cv)  # an iterable of splits: the check would exhaust it
    if offset_bounds:
        check_offsets_folds(y, offsets_cv, X=X, groups=groups, random_state=random_state)
    erm = _with_params(estimator if erm is None else erm, c_bar=None, lam=0.0, class_tilt=0.0)
    points = [FrontPoint("ERM", "ERM", None, erm)]
    mr2 = _with_params(estimator, class_tilt=0.0)
    # Its own point unless it is ERM's configuration (but for what it does not read, as p
    # without margins): with c_bar=None it may still be another model (lam > 0, or ERM
    # tuned on its own), the start of the tilt sweep.
    if not _same_model(mr2, erm):
        points.append(FrontPoint("MR2", "MR2", None, mr2))
    positive = sorted(float(t) for t in tilts if t > 0)  # a curve in t, drawn in its order
    points += [
        FrontPoint(name, "tilt", t, _with_params(estimator, class_tilt=t))
        for name, t in zip(_names("tilt={}", positive, given=True), positive, strict=True)
    ]
    if len(points) == 1 and not offset_bounds:
        # (it fitted ERM alone and "chose" it: a front of one point, without a word)
        raise ValueError(
            "The front would hold ERM alone: the estimator has ERM's configuration "
            "(c_bar=None, lam=0, or erm's own), and no tilt above 0 nor offset bound was "
            "given. Give tilts or offset_bounds, or an MR² estimator (c_bar set)."
        )
    fitted, previous, short = {}, None, []
    for p in points:
        model = None
        if p.lever == "tilt" and previous is not None and _convex(_final(previous)):
            # Along the sweep each fit starts from the previous solution (the untilted one
            # first). For a linear head solved by L-BFGS the problems are convex: a warm
            # start that converges is the cold fit's solution in fewer iterations. One that
            # stops short is not, and the point is fitted cold, as its refit will be.
            model = _warm_fit(previous, p.value, X, y)
        if model is None:
            model = _fit(clone(p.estimator), X, y, short, p.name)
        if p.name == "ERM":
            # The model's own checks of the scored features (finite values, the pipeline's
            # steps), here rather than after every other fit.
            for features in (X_val, X_test):
                if features is not None:
                    model.predict(features)
        fitted[p.name] = model
        # The sweep starts from the MR² point; without one (MR² is ERM's configuration)
        # the first tilt is fitted cold.
        previous = model if p.lever in ("MR2", "tilt") else None
    if offset_bounds:
        bounds = sorted(float(b) + 0.0 for b in offset_bounds)  # (−0 is 0, named so)
        wrapper = TunedOffsetsClassifierCV(
            points[0].estimator,
            scoring="worst_class",
            max_accuracy_drop=bounds[-1],
            cv=offsets_cv,
            random_state=random_state,
            store_cv_results=True,
        )
        base = _fit(wrapper, X, y, short, "offsets", groups=groups)
        for name, b in zip(_names("offsets≤{}pt", [100 * b for b in bounds]), bounds, strict=True):
            tuned = tune_class_offsets(
                base.cv_results_["decision_function"],
                base.cv_results_["y"],
                "worst_class",
                b,
                classes=base.classes_,  # a class it warns of by its label, not its column
            )
            fitted[name] = _offsets_model(base, tuned, b)
            unfitted = clone(wrapper).set_params(max_accuracy_drop=b, store_cv_results=False)
            points.append(FrontPoint(name, "offsets", b, unfitted))
    if short:
        # The first fit's own warning: its advice (an extreme class_tilt, say), which
        # "increase max_iter" would not replace.
        (first, caught), *_ = short
        warnings.warn(
            f"The front's fits of {', '.join(name for name, _ in short)} stopped short of "
            f"tol; their points are scored as fitted. {first}: "
            + " ".join(str(caught[0].message).split()),
            ConvergenceWarning,
            stacklevel=2,
        )
    for p in points:
        p.model = fitted[p.name]
    _score(points, X_val, y_val, "validation")
    if X_test is not None:
        _score(points, X_test, y_test, "test")
    front = Front(points, float(bound))  # (its repr said bound=np.float64(0.01))
    front.chosen = choose_point(front, bound).name
    return front


def _offsets_model(base, tuned, bound: float):
    """An offsets point's model: the base fit (tuned at the largest bound) with this bound's
    offsets and scores, as a fit of TunedOffsetsClassifierCV at this bound holds them."""
    model = copy.copy(base).set_params(max_accuracy_drop=bound, store_cv_results=False)
    model._take_tuning(tuned)
    del model.cv_results_  # the base's, kept for the bounds' tuning only
    return model


def _numbers(name: str, values) -> list:
    """``values``, a sequence of numbers (a list, a tuple, a 1-D array), as a list (an
    array has no truth value); a ValueError that names the option for anything else: a
    single number, text, or items that are no numbers failed in Python's words ("'float'
    object is not iterable", "could not convert string to float: ','")."""
    items = None if isinstance(values, str | bytes) or not np.iterable(values) else list(values)

    def number(v) -> bool:  # (a 0-d tensor or array too: a tensor's items are)
        return isinstance(v, Real) or (getattr(v, "ndim", None) == 0 and hasattr(v, "__float__"))

    if items is None or not all(number(v) for v in items):
        raise ValueError(
            f"{name} must be a sequence of numbers, e.g. {name}=[{_EXAMPLES[name]}], got "
            f"{plain(values)!r}."
        )
    return items


#: A value of each sequence option, for its error message.
_EXAMPLES = {"tilts": 1.0, "offset_bounds": 0.005}


def _names(template: str, values: list[float], given: bool = False) -> list[str]:
    """``template`` filled with each value in %g (a subnormal one as given,
    :func:`~mr2_probe._data.written`), or with as many digits as tell the values apart
    (tilts of 1 and 1.0000001 were two points named "tilt=1"). ``given``: values as they
    were given (a tilt), each in as many digits as read back as it (1.23456789, not
    1.23457, which typed back is another tilt); otherwise values computed from those given
    (100 × a bound, in which 0.007 is 0.7000000000000001), rounded to the digits that tell
    them apart."""
    for digits in range(6, 18):  # distinct floats differ in 17 digits
        names = [template.format(written(v, digits, given)) for v in values]
        if len(set(names)) == len(names):
            break
    return names


def _check_front_options(tilts, offset_bounds, bound, X_test, y_test, estimator, erm) -> None:
    """Refuse bad options before any fit."""
    from ._classifier import MR2LinearClassifier
    from ._cv import MR2LinearClassifierCV

    for name, model in (("estimator", estimator), ("erm", erm)):
        probe = None if model is None else _final(model)
        if model is not None and (
            not isinstance(probe, MR2LinearClassifier) or isinstance(probe, MR2LinearClassifierCV)
        ):
            raise ValueError(
                f"{name} must be an MR2LinearClassifier (or a Pipeline ending in one), the "
                f"configuration the front fits, got {type(probe).__name__}. For a search, "
                "pass the probe at the value it chose (MR2LinearClassifier with C=search.C_, "
                "or scale=search.C_ for a cosine head)."
            )
    bad = [plain(t) for t in tilts if not (math.isfinite(float(t)) and float(t) >= 0)]
    if bad:
        raise ValueError(f"tilts must be finite numbers >= 0, got {bad}.")
    for name, values in (("tilts", [t for t in tilts if t > 0]), ("offset_bounds", offset_bounds)):
        repeated = sorted(v for v, n in Counter(map(float, values)).items() if n > 1)
        if repeated:
            raise ValueError(f"{name} must be distinct, got {repeated} more than once.")
    for name, values in (("offset_bounds", offset_bounds), ("bound", [bound])):
        bad = [plain(b) for b in values if not 0 <= float(b) < 1]
        if bad:
            what, got = ("fractions", bad) if name == "offset_bounds" else ("a fraction", bound)
            raise ValueError(f"{name} must be {what} in [0, 1), got {got}.")
    if (X_test is None) != (y_test is None):
        raise ValueError("X_test and y_test go together: pass both or neither.")


def _check_known_labels(y, scored: dict) -> None:
    """Refuse, before any fit, labels of a scored split that are no class of ``y``: no
    point can predict them, so each would be a class at 0% for every point, and the rule's
    worst-class accuracy 0 throughout (shifted or re-encoded labels, most often)."""
    # Training labels that are no classes (continuous, or of mixed types) get scikit-learn's
    # error, as the fits would give it, before np.unique sorts them; its warning on many
    # classes is the fits' to give.
    # A missing label (None, pd.NA, NaN among objects: a pandas column's) is no class, as
    # the estimators refuse it: sorting NaN with the others raised "'<' not supported
    # between instances of 'float' and 'str'", and pd.NA failed a check of NaN ("boolean
    # value of NA is ambiguous"). Checked as given: NumPy reads a list's float("nan") among
    # text as the class 'nan'.
    for name, labels in {"y": y, **scored}.items():
        check_no_missing_labels(labels, name, "fit" if name == "y" else "score")
        if labels is not None:
            _label_column(labels, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_classification_targets(y)
    classes = np.unique(column_or_1d(y))
    for name, labels in scored.items():
        if labels is None:
            continue
        try:
            present = np.unique(column_or_1d(labels))
            unknown = (
                present if _text_and_numbers(present, classes) else np.setdiff1d(present, classes)
            )
        except TypeError as error:  # labels that cannot be sorted together ('<' of str, int)
            # (in scikit-learn's words, "string and number", not "int64, str")
            kinds = _kind_names(_label_kinds(column_or_1d(labels)))
            raise ValueError(
                f"{name} holds labels that cannot be compared with each other or with y's "
                f"(of types {kinds}); label {name} as y is labelled."
            ) from error
        if len(unknown):
            raise ValueError(
                f"{name} holds labels that are no class of y, the training labels: "
                f"{_shown(unknown)}. No point of the front can predict them, so each would "
                f"score 0% for every point; label {name} as y is labelled."
            )
        missing = np.setdiff1d(classes, present)
        if len(missing):
            warnings.warn(
                f"{name} holds no sample of the classes {_shown(missing)} of y: its "
                "per-class scores, and its worst class, are taken over the classes it holds"
                f"{' (the rule reads them)' if name == 'y_val' else ''}. Give {name} samples "
                "of every class.",
                UserWarning,
                stacklevel=3,
            )


def _shown(labels) -> str:
    """Up to five labels, repr'd."""
    return ", ".join(map(repr, labels[:5].tolist())) + (", ..." if len(labels) > 5 else "")


def _check_scored_features(X, scored: dict) -> None:
    """Refuse, before any fit, a scored split whose features and labels differ in number,
    or whose features are not as many as the training data's (where both have two
    dimensions: a pipeline may take other inputs)."""
    n_features = _n_features(X)
    for split, (features, labels) in scored.items():
        if features is None:
            continue
        n_samples, n_labels = _num_samples(features), len(_label_column(labels, f"y_{split}"))
        if n_samples != n_labels:
            raise ValueError(
                f"X_{split} has {n_samples} samples but y_{split} has {n_labels} labels; they "
                "must be as many."
            )
        if not n_samples:  # (it failed after the ERM fit, in predict's words)
            raise ValueError(f"X_{split} has no samples: nothing can be scored on it.")
        scored_features = _n_features(features)
        if None not in (n_features, scored_features) and n_features != scored_features:
            raise ValueError(
                f"X_{split} has {scored_features} features but X, the training data, has "
                f"{n_features}."
            )


def _n_features(X) -> int | None:
    """The number of columns of a 2-d array-like (arrays, sparse matrices, frames, tensors,
    HDF5 datasets, lists of rows), None for anything else (ragged lists among them)."""
    shape = _shape(X)
    return shape[1] if shape is not None and len(shape) == 2 else None


def _shape(a) -> tuple | None:
    """The shape of an array-like (sparse matrices, frames, tensors, HDF5 datasets and
    lists too), None where it has none (a ragged list)."""
    shape = getattr(a, "shape", None)
    if shape is None:
        try:
            shape = np.shape(a)
        except ValueError:  # rows of several lengths (NumPy >= 1.24 refuses them)
            return None
    return tuple(shape)


def _label_column(labels, name: str) -> np.ndarray:
    """``labels`` as a 1-D array, a column vector as the labels it holds; several columns
    (one-hot labels, predict_proba's scores), a single label or 3 dimensions refused
    naming ``name``: scikit-learn's column_or_1d says "y should be a 1d array" of y_val
    and y_test too (3 dimensions: "Found array with dim 3", naming none)."""
    shape = _shape(labels)
    if shape is not None and len(shape) != 1 and shape[1:] != (1,):
        raise labels_not_1d(
            name, shape, "one column per class (one-hot labels) holds no labels: pass the "
            "class of each sample"
        )  # fmt: skip
    return column_or_1d(labels)


def check_offsets_folds(
    y,
    offsets_cv,
    advice: str | None = None,
    *,
    X=None,
    groups=None,
    random_state=None,
    class_names=None,
) -> None:
    """Refuse, before any fit, an ``offsets_cv`` that :class:`TunedOffsetsClassifierCV`
    would refuse as its ``cv`` (or ``"prefit"``), or whose folds of ``y`` (split as the
    estimator splits them, with ``X``, ``groups`` and ``random_state``) leave a class out
    of a training part (then with ``advice``). A splitter that shuffles without a seed is
    checked on one draw of its folds. ``class_names[k]`` names the class of code k in the
    message where ``y`` holds integer codes 0..K-1 (a feature store's)."""
    constraints = [c for c in TunedOffsetsClassifierCV._parameter_constraints["cv"]
                   if not isinstance(c, StrOptions)]  # fmt: skip
    validate_parameter_constraints(
        {"offsets_cv": constraints}, {"offsets_cv": offsets_cv}, caller_name="accuracy_front"
    )
    if advice is None:
        advice = (
            "The offsets are tuned on folds whose training parts need every class: give "
            "each class at least 2 samples, use a stratified cv, or leave offset_bounds "
            "empty."
        )
    y = column_or_1d(y)
    classes, y_index = np.unique(y, return_inverse=True)
    X = np.zeros((len(y), 1)) if X is None else X  # only its length, unless the cv reads it
    with warnings.catch_warnings():  # scikit-learn's warning about small classes: refused below
        warnings.simplefilter("ignore", UserWarning)
        splits = offsets_splits(offsets_cv, X, y, groups, random_state)
    names = None if class_names is None else np.asarray(class_names, dtype=object)[classes]
    check_training_folds(y_index, classes, splits, advice, names)


def _score(points, X, y, split: str) -> None:
    predictions = {p.name: np.asarray(p.model.predict(X)) for p in points}
    labels = np.unique(y)
    groups = difficulty_groups(per_class_accuracy(y, predictions["ERM"], labels))
    for p in points:
        setattr(p, split, classwise_summary(y, predictions[p.name], groups, labels))


def choose_point(front: Front, bound: float | None = None) -> FrontPoint:
    """The rule: the largest validation worst-class accuracy among the points whose
    validation overall accuracy is at least ERM's minus ``bound``; ties go to the higher
    overall accuracy, then to the earlier point (ERM first, so ERM wins a full tie).

    Parameters
    ----------
    front : Front
    bound : float, default=None
        A fraction (0.005 = 0.5 pt); ``None`` uses ``front.bound``.
    """
    bound = front.bound if bound is None else bound
    # (text, "0.01", failed the comparison: "'<=' not supported between 'int' and 'str'")
    if not (isinstance(bound, Real) and 0 <= bound < 1):
        raise ValueError(f"bound must be a fraction in [0, 1), got {plain(bound)!r}.")
    # (in float64: a float32 bound made the floor float32, rounding ERM's accuracy with it)
    floor = front.point("ERM").validation["overall"] - float(bound)
    eligible = [p for p in front.points if p.validation["overall"] >= floor - 1e-12]
    # max() keeps the first of equal keys: the earlier point wins a full tie.
    return max(eligible, key=lambda p: (p.validation["worst"], p.validation["overall"]))
