"""The estimators nested around a classifier (a Pipeline, a search, a StackingClassifier,
...): the walk to the one inside each, and the checks :class:`TunedOffsetsClassifierCV` makes
on them before any fit (whether what it fits has ``decision_function``, one column per
class, and what its ensembles read of their estimators)."""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from sklearn.pipeline import Pipeline
from sklearn.utils._param_validation import HasMethods


def _kind(estimator) -> str | None:
    """How ``estimator`` hands on what an estimator inside it decides (see ``_INSIDE``):
    ``"pipeline"``, ``"search"`` (unfitted), ``"fitted search"``, ``"stack"``,
    ``"frozen"``, ``"one-vs-rest"`` or ``"wrapper"`` (BaggingClassifier, RFE,
    SelfTrainingClassifier); None for any other estimator, and for a search of
    ``refit=False``, which keeps no best estimator and hands none on."""
    from sklearn.ensemble import BaggingClassifier, StackingClassifier
    from sklearn.feature_selection import RFE
    from sklearn.model_selection._search import BaseSearchCV
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.semi_supervised import SelfTrainingClassifier

    if isinstance(estimator, BaseSearchCV):
        if not estimator.refit:
            return None
        return "fitted search" if hasattr(estimator, "best_estimator_") else "search"
    kinds = {
        Pipeline: "pipeline",
        StackingClassifier: "stack",
        FrozenEstimator: "frozen",
        OneVsRestClassifier: "one-vs-rest",
        BaggingClassifier: "wrapper",
        RFE: "wrapper",
        SelfTrainingClassifier: "wrapper",
    }
    return next((kind for cls, kind in kinds.items() if isinstance(estimator, cls)), None)


# The estimator inside a wrapper of each kind: a search's best estimator (its template
# before it is fitted), a StackingClassifier's final estimator (None before a stack of the
# default is fitted), a Pipeline's last step, the others' ``estimator``.
_INSIDE = {
    "pipeline": lambda pipeline: pipeline.steps[-1][1],
    "search": lambda search: search.estimator,
    "fitted search": lambda search: search.best_estimator_,
    "stack": lambda stack: getattr(stack, "final_estimator_", stack.final_estimator),
    "frozen": lambda frozen: frozen.estimator,
    "one-vs-rest": lambda ovr: ovr.estimator,
    "wrapper": lambda wrapper: wrapper.estimator,
}


def _nested(estimator, through=frozenset(_INSIDE)):
    """``estimator``, then the estimator inside it, and so on, as long as each is a
    wrapper of a kind in ``through`` (see ``_INSIDE``); the last one yielded is the first
    that is not (None where a wrapper holds none)."""
    while True:
        yield estimator
        kind = _kind(estimator)
        if kind not in through:
            return
        estimator = _INSIDE[kind](estimator)


def _last(estimators):
    """The last of an iterable of estimators."""
    *_, last = estimators
    return last


def _kept(estimator, through=frozenset(_INSIDE)):
    """``_nested``, up to an unfitted search whose parameter space sets more than numbers
    (C, cv, ...: lists of them or distributions): its candidates may replace what its
    template holds (a step, a stack's estimator) or set it otherwise (a stack_method), so
    what is inside its template is no sure sign of what it fits."""
    for inner in _nested(estimator, through):
        yield inner
        if _kind(inner) == "search" and not _sets_numbers_only(inner):
            return


def _sets_numbers_only(search) -> bool:
    """Whether an unfitted search's parameter space sets only numbers (not booleans)."""
    return all(
        hasattr(values, "rvs")
        or (
            np.iterable(values)
            and all(isinstance(v, Real) and not isinstance(v, bool) for v in values)
        )
        for space in _spaces(search)
        for values in space.values()
    )


def _stacks_onto_logistic_regression(estimator) -> bool:
    """Whether ``estimator`` is an unfitted StackingClassifier whose ``final_estimator`` is
    None (scikit-learn's LogisticRegression once fitted), or ends in one: a Pipeline, an
    unfitted search (not of ``refit=False``), a StackingClassifier (its final estimator),
    or a wrapper with a ``decision_function`` where its estimator has one
    (BaggingClassifier, FrozenEstimator, OneVsRestClassifier, RFE,
    SelfTrainingClassifier).
    scikit-learn reports no ``decision_function`` for it before ``fit``, though its fitted
    one has it."""
    from sklearn.ensemble import StackingClassifier

    # (inside one of these the stack was refused, where the bare stack was taken; the
    # walk ends just after such a stack, at the None it holds for its final estimator)
    through = {"pipeline", "search", "frozen", "one-vs-rest", "wrapper", "stack"}
    return any(
        isinstance(stack, StackingClassifier)
        and stack.final_estimator is None
        and not hasattr(stack, "final_estimator_")
        for stack in _nested(estimator, through)
    )


def _decides(estimator) -> bool:
    """Whether ``estimator`` implements ``fit`` and ``decision_function``, or is an unfitted
    StackingClassifier of the default ``final_estimator=None``, bare or wrapped, which has
    one once fitted."""
    return HasMethods(["fit", "decision_function"]).is_satisfied_by(estimator) or (
        callable(getattr(estimator, "fit", None)) and _stacks_onto_logistic_regression(estimator)
    )


def _decides_by_a_candidate(estimator) -> bool:
    """Whether ``estimator`` decides through (see :func:`_kept`) an unfitted search whose
    parameter space may replace what its template holds, and one of whose candidates has
    a ``decision_function`` (see :func:`_lacking_candidates`): scikit-learn fits it, and
    the fitted search has one, whatever its template holds (a search of ``refit=False``,
    a classifier without one)."""
    search = _last(_kept(estimator))
    return _kind(search) == "search" and _lacking_candidates(search) is None


def _lacks_by_its_search(estimator) -> bool:
    """Whether ``estimator`` is, or ends in (a FrozenEstimator's, a Pipeline's last step), a
    fitted search around a template that decides, or decides through a search of
    ``refit=False`` around one (at any depth, see :func:`_search_keeping_none`): it has no
    ``decision_function`` because of what its fit chose or kept, which ``_check_decides``
    names (scikit-learn's parameter check printed the template, not the choice)."""
    from sklearn.model_selection._search import BaseSearchCV

    search = _search_keeping_none(estimator)
    if search is None:
        search = _last(_nested(estimator, {"frozen", "pipeline"}))
        if not isinstance(search, BaseSearchCV) or not hasattr(search, "best_estimator_"):
            return False
    return _DecidesOnceFitted().is_satisfied_by(search.estimator)


def _search_keeping_none(estimator, walk=_nested):
    """The search of ``refit=False`` that ``estimator`` is or decides through at any depth
    (see ``_INSIDE``: a search's template, a StackingClassifier's final estimator, a
    Pipeline's last step, ...), which keeps no best estimator and so decides nothing;
    None where there is none. ``walk=_kept`` does not look past a search that may
    replace it."""
    from sklearn.model_selection._search import BaseSearchCV

    last = _last(walk(estimator))
    return last if isinstance(last, BaseSearchCV) and not last.refit else None


def _check_baggable(estimator) -> None:
    """Refuse, before any fit, a BaggingClassifier that ``estimator`` is or decides through
    (see :func:`_kept`) whose estimator ends in an unfitted StackingClassifier of
    ``final_estimator=None``: that stack reports no ``predict`` before it is fitted (its
    final estimator is made then), and scikit-learn's BaggingClassifier refuses an
    estimator without one (its parameter check printed the stack, in every fold)."""
    from sklearn.ensemble import BaggingClassifier

    for inner in _kept(estimator):
        if (
            isinstance(inner, BaggingClassifier)
            and not hasattr(inner.estimator, "predict")
            and _stacks_onto_logistic_regression(inner.estimator)
        ):
            raise ValueError(
                "A BaggingClassifier cannot bag a StackingClassifier of final_estimator=None "
                "before it is fitted (its estimator, or the end of it): that stack makes its "
                "final estimator in fit, so it has no predict until then, and "
                "BaggingClassifier requires one. Give the StackingClassifier "
                "final_estimator=LogisticRegression(), which None stands for."
            )


def _members(estimator):
    """(ensemble, name, member, methods, as_given): each estimator of a StackingClassifier
    or VotingClassifier that ``estimator`` is or decides through (see :func:`_kept`), and of
    those among their estimators, at any depth, with the methods the ensemble reads of it
    (one of them), and whether it asks for them on the estimator as given, before fitting
    it (a StackingClassifier does; a VotingClassifier reads its fitted clones)."""
    from sklearn.ensemble import StackingClassifier, VotingClassifier

    for inner in _kept(estimator):
        if isinstance(inner, StackingClassifier):
            auto = inner.stack_method == "auto"
            methods = ["predict_proba", "decision_function", "predict"]
            methods = methods if auto else [inner.stack_method]
        elif isinstance(inner, VotingClassifier):
            methods = ["predict_proba" if inner.voting == "soft" else "predict"]
        else:
            continue
        for name, member in inner.estimators:
            if isinstance(member, str):  # "drop"
                continue
            yield inner, name, member, methods, isinstance(inner, StackingClassifier)
            yield from _members(member)


# Through these a method of an estimator is the one inside it, as its fitted clone has
# it: a Pipeline's last step's, a search's choice's, a StackingClassifier's final
# estimator's, OneVsRestClassifier's estimator's (not BaggingClassifier's predict_proba).
_HANDS_ON = frozenset({"pipeline", "search", "frozen", "stack", "one-vs-rest"})


def _has_once_fitted(estimator, method: str) -> bool:
    """Whether a fitted clone of ``estimator`` may have ``method``: its class has it, and
    the estimator it hands on (see :func:`_kept` through ``_HANDS_ON``) is not one that
    holds no estimator and lacks it (SVC's predict_proba where probability=False: such a
    scikit-learn ``available_if`` reads the instance's parameters, which fitting keeps,
    where a meta-estimator's reads what it holds, such as a default stack's final
    estimator, made in fit, or a search's choice)."""
    end = _last(_kept(estimator, _HANDS_ON))
    params = end.get_params(deep=False) if hasattr(end, "get_params") else None
    plain = (
        _kind(end) is None
        and params is not None
        and "estimators" not in params
        and not any(hasattr(value, "fit") for value in params.values())
    )
    return hasattr(type(estimator), method) and not (plain and not hasattr(end, method))


def _check_members_predict(estimator) -> None:
    """Refuse, before any fit, an estimator of a StackingClassifier (or a VotingClassifier
    among its estimators) that ``estimator`` is or decides through, at any depth, that
    cannot give what the ensemble reads of it (:func:`_members`): a search of
    ``refit=False`` (it keeps no best estimator, so it has no predict, predict_proba or
    decision_function), one without any of the methods (a StackingClassifier asks the
    estimator as given, before fitting it: an unfitted default stack has none), a
    BaggingClassifier of an unfitted default stack (:func:`_check_baggable`).
    scikit-learn's errors ("Underlying estimator ... does not implement the method")
    came after its estimators were fitted, in every fold."""
    for ensemble, name, member, methods, as_given in _members(estimator):
        where = f"the {type(ensemble).__name__}'s estimator {name!r}"
        # (a StackingClassifier asks a search's template, as given, what its best estimator
        # will have: past a search that may replace it too)
        search = _search_keeping_none(member, _nested if as_given else _kept)
        if search is not None:
            raise ValueError(
                f"The {type(search).__name__} in {where} has refit=False: it keeps no best "
                "estimator, so it has no predict, predict_proba or decision_function, and "
                f"the {type(ensemble).__name__} reads one of them from each of its "
                "estimators. Use refit=True (the default), or pass its best estimator (its "
                "estimator with its best_params_) instead."
            )
        # (read of fitted clones, a method of the class may be one that the instance
        # has only once fitted, as the default stack's; a FrozenEstimator's instance has
        # its estimator's, which its class has not: refused where it has it neither way,
        # or where what it hands on holds no estimator and lacks it, see _has_once_fitted)
        if not any(
            hasattr(member, m) or (not as_given and _has_once_fitted(member, m)) for m in methods
        ):
            key = "stack_method" if as_given else "voting"
            setting = f"{key}={getattr(ensemble, key)!r}"
            cure = (
                "give that StackingClassifier final_estimator=LogisticRegression(), which "
                "None stands for (it has them only once fitted)"
                if _stacks_onto_logistic_regression(member)
                else f"give it an estimator that has one, or choose another {key}"
            )
            raise ValueError(
                f"{where[0].upper()}{where[1:]}, {type(member).__name__}, has no "
                f"{' or '.join(methods)}, which the {type(ensemble).__name__} of {setting} "
                f"reads of each of its estimators{' as given' if as_given else ''}: {cure}."
            )
        _check_baggable(member)


class _DecidesOnceFitted(HasMethods):
    """HasMethods(["fit", "decision_function"]) that also takes an unfitted
    StackingClassifier of the default ``final_estimator=None`` (which it refused), bare or
    wrapped, an unfitted search whose parameter space may replace what its template holds
    where a candidate decides, and a search of a template that decides whose fit chose a
    classifier without ``decision_function`` or kept none (``refit=False``, at any depth):
    ``fit`` refuses it by name."""

    def __init__(self):
        super().__init__(["fit", "decision_function"])

    def is_satisfied_by(self, val):
        return _decides(val) or (
            callable(getattr(val, "fit", None))
            and (_lacks_by_its_search(val) or _decides_by_a_candidate(val))
        )


def _deciding(estimator):
    """The estimator whose decision values ``estimator`` hands on: itself, or the one
    inside a FrozenEstimator, a Pipeline's last step, a search's best estimator (its
    template before it is fitted), a StackingClassifier's final estimator, or a
    BaggingClassifier's, RFE's or SelfTrainingClassifier's estimator. None for an
    unfitted search whose parameter space may give its best estimator another one; a
    search of ``refit=False`` itself, which keeps no best estimator and hands none on."""
    # (a FrozenEstimator, as a search over cv="prefit" takes it, of a Pipeline or a search
    # hid their SVC: its pairwise columns were tuned as one per class)
    # A StackingClassifier's decision values are its final estimator's, a BaggingClassifier's
    # the mean of its estimator's: both passed an SVC's pairwise columns without a word.
    # RFE's (RFECV's) and SelfTrainingClassifier's are their estimator's likewise.
    # (OneVsRestClassifier's estimators each see two classes: its values are its own.)
    through = {"pipeline", "search", "fitted search", "stack", "frozen", "wrapper"}
    for final in _nested(estimator, through):
        # (a fitted search's decision values are its best_estimator_'s, whose shape its
        # parameter grid may have set: read from the unfitted template, 'ovo' passed)
        if _kind(final) == "search" and _may_set_shape(final):
            return None  # (its template's 'ovo' refused a grid of 'ovr': the fitted one's)
    return final


def _check_per_class_decision(estimator, n_classes: int) -> None:
    """Refuse one-vs-one decision values of 3 classes or more: K(K−1)/2 pairwise columns,
    read as one per class (with 3 classes, as many columns as classes). With two classes
    both shapes are the one decision value."""
    final = _deciding(estimator)
    if n_classes > 2 and getattr(final, "decision_function_shape", None) == "ovo":
        raise ValueError(
            f"{type(final).__name__}(decision_function_shape='ovo') gives one decision value "
            "per pair of classes; the offsets need one per class: use "
            "decision_function_shape='ovr'."
        )


def _check_decides(estimator) -> None:
    """Refuse a fitted ``estimator`` without ``decision_function``, as the ``estimator``
    parameter's check refuses an unfitted one: a search whose parameter space puts in a
    classifier without one (a Pipeline's last step, say) passes that check with its
    template, and then has none once its best estimator is that classifier. An unfitted
    search that may replace what its template holds is taken where a candidate decides
    (:func:`_decides_by_a_candidate`): its fitted one is checked in each fold."""
    if _decides(estimator) or _decides_by_a_candidate(estimator):
        return
    search = _search_keeping_none(estimator)
    if search is not None:
        inside = "" if search is estimator else f" inside the {type(estimator).__name__}"
        raise ValueError(
            f"The {type(search).__name__}{inside} has refit=False: it keeps no best "
            "estimator, so it has no decision_function, and the offsets are tuned on "
            "decision values, one per class. Use refit=True (the default), or pass its "
            "best estimator (its estimator with its best_params_, fitted) instead."
        )
    final = _deciding(estimator)
    hands_on = final is not None and final is not estimator
    because = f" (its decision values would be {_named(final)}'s, which has none)"
    raise ValueError(
        f"The fitted {type(estimator).__name__} has no decision_function"
        f"{because if hands_on else ''}: the offsets are tuned on decision values, one per "
        "class. Use only classifiers implementing 'decision_function' (LogisticRegression, "
        "LinearSVC, MR2LinearClassifier, ...), in a search's parameter space too."
    )


def _may_set_shape(search) -> bool:
    """Whether an unfitted search's parameter space may give its best estimator another
    decision shape than its template's: it sets a ``decision_function_shape`` or puts an
    estimator in (a Pipeline's step, a StackingClassifier's final_estimator)."""
    return any(
        name.endswith("decision_function_shape") or _puts_in(values)
        for space in _spaces(search)
        for name, values in space.items()
    )


def _spaces(search) -> list:
    """A search's parameter space as a list of dicts (a grid or distributions)."""
    space = getattr(search, "param_grid", None) or getattr(search, "param_distributions", None)
    return space if isinstance(space, list) else [space or {}]  # (a dict or a list of them)


def _puts_in(values) -> bool:
    """Whether a parameter space's values (a list, or a distribution) hold an estimator, or
    "passthrough" (a Pipeline's step left out)."""
    return np.iterable(values) and any(
        hasattr(value, "fit") or (isinstance(value, str) and value == "passthrough")
        for value in values
    )


def _named(estimator) -> str:
    """An estimator's class name, or a string put in its place ('passthrough') quoted."""
    return repr(estimator) if isinstance(estimator, str) else type(estimator).__name__


# More combinations of the estimators a search puts in are not tried before its fit.
_MAX_CANDIDATES = 256


def _lacking_candidates(search) -> set | None:
    """The names of what an unfitted search's parameter space puts in (see
    :func:`_puts_in`) where none of its candidates has a ``decision_function``; None where
    one may have it (or there are too many to try)."""
    from sklearn.model_selection import ParameterGrid

    spaces = _spaces(search)
    grid = ParameterGrid([{k: list(v) for k, v in s.items() if _puts_in(v)} for s in spaces])
    if len(grid) > _MAX_CANDIDATES:  # (a list of dicts counts them all)
        return None
    lacking = set()
    for params in grid:
        try:
            candidate = clone(search.estimator).set_params(**params)
        except (ValueError, TypeError, AttributeError):  # (its own fit names it)
            return None
        if _decides(candidate):
            return None
        lacking.add(_named(_deciding(candidate) or candidate))
    return lacking


def _check_candidates_decide(estimator) -> None:
    """Refuse, before any fit, an unfitted search that ``estimator`` is or decides through
    (see :func:`_kept`, at any depth) whose parameter space puts in estimators (a
    Pipeline's last step, a StackingClassifier's final estimator) such that no candidate
    has a ``decision_function``: its template passed the ``estimator`` parameter's check,
    and the first fold's search was refused once fitted (:func:`_check_decides`)."""
    for search in _kept(estimator):
        lacking = _lacking_candidates(search) if _kind(search) == "search" else None
        if lacking is None:
            continue
        inside = "" if search is estimator else f" inside the {type(estimator).__name__}"
        raise ValueError(
            f"No candidate of the {type(search).__name__}{inside} has a decision_function: "
            f"its parameter space puts in {', '.join(sorted(lacking))}, which "
            f"{'has' if len(lacking) == 1 else 'have'} none. The offsets are tuned on "
            "decision values, one per class. Use only classifiers implementing "
            "'decision_function' (LogisticRegression, LinearSVC, MR2LinearClassifier, ...), "
            "in a search's parameter space too."
        )
