"""The probes of a ``mr2-probe`` run, built from its options: ERM and MR², behind the
feature scaling, in a --grid or --Cs search, and the configuration a search chose."""

from __future__ import annotations

from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, ParameterGrid
from sklearn.pipeline import Pipeline

from .._classifier import MR2LinearClassifier
from .._cv import MR2LinearClassifierCV
from ..front import _final
from ..metrics import classwise_scorers
from ._options import (
    _OPTIONS,
    _READ_BY_SOME,
    _SCALERS,
    MINIBATCH_ONLY,
    _no_model,
    _solver,
)
from ._splits import _search_folds
from ._usage import UsageError, _one_line


def _scaled(probe: MR2LinearClassifier, scaling: str):
    scaler = _SCALERS[scaling]
    return probe if scaler is None else Pipeline([("scale", scaler()), ("probe", probe)])


def _chosen_configuration(model):
    """The unfitted probe (in its Pipeline) that a fitted search chose: GridSearchCV's
    best estimator, or an MR2LinearClassifier at the C (or scale) MR2LinearClassifierCV
    chose; the model itself, unfitted, when nothing was searched."""
    base = clone(getattr(model, "best_estimator_", model))
    search = _final(model)
    if not isinstance(search, MR2LinearClassifierCV):
        return base
    names = MR2LinearClassifier().get_params()
    params = {k: v for k, v in search.get_params(deep=False).items() if k in names}
    params |= {"scale": search.C_} if search.head_ == "cosine" else {"C": search.C_}
    probe = MR2LinearClassifier(**params)
    if isinstance(base, Pipeline):
        return Pipeline([*base.steps[:-1], (base.steps[-1][0], probe)])
    return probe


def _estimators(args) -> tuple[MR2LinearClassifier, MR2LinearClassifier]:
    """ERM and MR², unfitted, their parameters checked."""
    common = dict(
        head=args.head,
        C=1.0 if args.C is None else args.C,
        max_iter=args.max_iter,
        device=args.device,
        verbose=0 if args.no_progress else 1,
        random_state=args.seed,
    )
    if args.logit_scale is not None:
        common["scale"] = args.logit_scale
    erm = MR2LinearClassifier(c_bar=None, **common)
    mr2 = MR2LinearClassifier(c_bar=args.c_bar, lam=args.lam, p=args.p, **common)
    for probe in (erm, mr2):
        try:
            probe._validate_params()  # scikit-learn's own messages, before any work
        except ValueError as error:
            options = [o for key, o in _OPTIONS.items() if f"'{key}' parameter" in str(error)]
            raise UsageError(f"{options[0]}: {_one_line(error)}" if options else error) from error
    return erm, mr2


def _cv_probe(probe: MR2LinearClassifier, args) -> MR2LinearClassifierCV:
    """``probe`` with C (or the cosine head's scale) chosen along a path by --cv folds."""
    params = probe.get_params()
    del params["C"], params["warm_start"]
    return MR2LinearClassifierCV(
        args.Cs,
        cv=_search_folds(args),
        scoring=args.scoring,
        n_jobs=args.n_jobs,
        **params,
    )


def _model(probe: MR2LinearClassifier, grid: dict, args):
    """The probe behind the feature scaling, in a grid search when ``grid`` is not empty
    (of the grid's combinations that are models of it)."""
    if not grid:
        return _scaled(probe, args.feature_scaling)
    prefix = "" if args.feature_scaling == "none" else "probe__"
    searched = {prefix + key: values for key, values in grid.items()}
    combinations = list(ParameterGrid(grid))
    valid = [_without_unused(probe, c) for c in combinations if _no_model(probe, c) is None]
    valid = list({tuple(sorted(c.items())): c for c in valid}.values())  # each model once
    if len(valid) < len(combinations):
        searched = [{prefix + key: [value] for key, value in c.items()} for c in valid]
    return GridSearchCV(
        _scaled(clone(probe).set_params(verbose=0), args.feature_scaling),
        searched,
        scoring=classwise_scorers() | {"stopped_short": _stopped_short},
        refit=args.scoring,
        cv=_search_folds(args),
        n_jobs=args.n_jobs,
    )


def _without_unused(probe: MR2LinearClassifier, combination: dict) -> dict:
    """``combination`` without what its fit does not read: C where it penalises nothing (a
    cosine head has no penalty of its own, only a projection, lam > 0, has one), a logit
    scale where the head is linear, what only some models read (_READ_BY_SOME: p without
    margins, say) where this one does not, and the minibatch solvers' parameters where
    L-BFGS fits it. (Searched, such a parameter fits one model again and reports a choice
    that means nothing.)"""
    model = clone(probe).set_params(**combination)
    unused = {name for name, (reads, *_) in _READ_BY_SOME.items() if not reads(model)}
    if model.head != "cosine":
        unused.add("scale")
    if model.head == "cosine" and not model.lam:
        unused.add("C")
    if MINIBATCH_ONLY & set(combination) and _solver(probe, combination) == "lbfgs":
        unused |= MINIBATCH_ONLY
    return {key: value for key, value in combination.items() if key not in unused}


def _stopped_short(estimator, X, y) -> float:
    """A grid search's scorer: 1 for a fit that stopped short of tol. With --n-jobs its
    fits run in worker processes, whose warnings never reach this one."""
    return float(getattr(_final(estimator), "_stop_reason", None) is not None)
