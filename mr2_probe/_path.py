"""The regularisation path of one fold, held-out scoring from logits, and the bisection.

A fold keeps one head on the device for its whole path: each value of the searched
parameter (C, or the cosine head's scale) starts from the previous solution, and the class
statistics, which do not depend on the parameters without a projection, are computed once
per fold. (The folds of a plain linear or cosine head take the batched solver of
_batched.py instead.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.special import log_softmax, softmax
from sklearn.base import BaseEstimator, ClassifierMixin

from ._device import to_numpy
from ._fit_errors import FitDivergedError


class HeldOutLogits(ClassifierMixin, BaseEstimator):
    """A fitted classifier whose input is its own logits (n_samples, n_classes).

    Scorers call ``predict``, ``predict_proba`` or ``decision_function`` on an estimator
    and X; given this one and the held-out logits, any scikit-learn scorer scores them as
    it would score the probe on the held-out rows, without a second pass over X.
    """

    def __init__(self, classes=None):
        self.classes = classes

    def __sklearn_is_fitted__(self):
        return True

    @property
    def classes_(self):
        return self.classes

    def decision_function(self, Z):
        return Z[:, 1] - Z[:, 0] if Z.shape[1] == 2 else Z

    def predict_proba(self, Z):
        return softmax(np.asarray(Z, dtype=np.float64), axis=1)

    def predict_log_proba(self, Z):
        return log_softmax(np.asarray(Z, dtype=np.float64), axis=1)

    def predict(self, Z):
        return self.classes[np.asarray(Z).argmax(1)]


@dataclass
class Step:
    """One point of a fold's path."""

    coef: np.ndarray  # (rows, n_dof): coef_ with the intercept as last column
    score: float
    n_iter: int
    class_accuracy: np.ndarray  # (K,), NaN for classes absent from the held-out rows

    @classmethod
    def scored(cls, z, coef, intercept, n_iter, y_test, params, score, accuracy_weight) -> Step:
        """The step of a solution (coef, intercept or None) whose held-out logits are z:
        scored with ``params`` (the scorer's metadata, its weights among them), its class
        accuracies with ``accuracy_weight`` (the sample weights, whatever the scorer takes)."""
        # A copy: without an intercept coef may share memory with the solver's parameters,
        # which the next value of the path overwrites in place.
        coef = np.hstack([coef, intercept[:, None]]) if intercept is not None else coef.copy()
        accuracy = class_accuracy(z.argmax(1), y_test, z.shape[1], accuracy_weight)
        return cls(coef, score(z, y_test, params), int(n_iter), accuracy)

    @classmethod
    def failed(cls, shape: tuple, dtype, n_classes: int) -> Step:
        """The step of a value whose fit failed: NaN everywhere (the coefficients in the
        ``dtype`` of the others), no iteration counted."""
        return cls(np.full(shape, np.nan, dtype), np.nan, 0, np.full(n_classes, np.nan))


@dataclass
class FoldPath:
    """One fold: its training data, its held-out rows, and its head.

    ``solve(head, data, value, cold, initial)`` trains the head in place and returns the
    solver's result and the exported state (the estimator's solve step).
    ``test_blocks()`` gives the held-out rows on the device as ``(where, x)`` pairs (x
    rows of the held-out set, ``where`` their positions in it): a block at a time from an
    HDF5 store, which is never held whole, and in one block from memory.

    A value whose fit diverges (:class:`~mr2_probe._fit_errors.FitDivergedError`) gets a
    failed step (NaN) and its error in ``failures``; the next value starts cold, as the
    first one did.
    """

    data: object  # FitData of the training rows
    test_blocks: Callable
    y_test: np.ndarray  # label indices
    score_params: dict  # the held-out rows' metadata for the scorer, weights among them
    accuracy_weight: np.ndarray | None  # the held-out rows' sample weights
    head: object
    initial: tuple | None
    steps: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)  # value → the error of its failed fit
    # (value, the head's parameters) of the last two solutions, for the predictor step.
    _previous: list = field(default_factory=list)
    _start: list | None = None  # the head's parameters before its first fit

    def run(self, values: Sequence[float], solve: Callable, score: Callable, progress) -> None:
        """Solve at ``values`` in increasing order, each from the previous solution.

        Along a path of increasing values the start is extrapolated, linearly in
        log(value), from the last two solutions (a predictor step): the solver then only
        corrects it. A cosine head or a learned projection starts from the previous
        solution itself.
        """
        if self._start is None:
            self._start = self._params()
        for value in sorted(values):
            cold = not self._previous  # the first value, or the first after a failed one
            self._predict(float(value))
            try:
                result, state = solve(self.head, self.data, value, cold, self.initial)
            except FitDivergedError as exc:
                self._fail(float(value), exc)
                progress.update(1)
                continue
            z = None  # (B, K)
            with torch.no_grad():
                for where, x in self.test_blocks():
                    block = to_numpy(self.head.logits(self.head.features(x)))
                    if z is None:
                        z = np.empty((len(self.y_test), block.shape[1]), block.dtype)
                    z[where] = block
            if z is None:  # no held-out row: the scorer names the empty input
                z = np.empty((0, self.head.n_classes), np.float32)
            intercept = state["intercept"] if self.head.bias is not None else None
            self.steps[float(value)] = Step.scored(
                z, state["coef"], intercept, result.n_iter, self.y_test, self.score_params,
                score, self.accuracy_weight,
            )  # fmt: skip
            self._previous = [*self._previous, (float(value), self._params())][-2:]
            progress.update(1)

    def _params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.head.parameters()]

    @torch.no_grad()
    def _fail(self, value: float, error: FitDivergedError) -> None:
        """Records ``value`` as failed and puts the head back at its start."""
        for param, start in zip(self.head.parameters(), self._start, strict=True):
            param.copy_(start)
        self._previous = []
        self.failures[value] = error
        coef = self.head.export()["coef"]
        dof = coef.shape[1] + (self.head.bias is not None)
        self.steps[value] = Step.failed((len(coef), dof), coef.dtype, self.head.n_classes)

    @torch.no_grad()
    def _predict(self, value: float) -> None:
        t = predictor_step(self._previous, value)
        # A cosine head starts from the previous solution itself: extrapolated, its flat,
        # non-convex path ended further from independent fits, at no gain in iterations
        # (Fashion-MNIST sweep 415 against 412 per fold; digits 293 against 190).
        if t is None or self.head.has_projection or self.head.head == "cosine":
            return
        (_, p0), (_, p1) = self._previous
        for param, a, b in zip(self.head.parameters(), p0, p1, strict=True):
            param.copy_(b + (b - a) * t)


def predictor_step(previous: list, value: float) -> float | None:
    """t such that the path's start at ``value`` is p₁ + t·(p₁ − p₀), linear in log(value)
    through the last two solutions ``previous`` = [(v₀, p₀), (v₁, p₁)]; None when there are
    fewer, or when ``value`` does not extend the path (a bisection's midpoint)."""
    if len(previous) < 2:
        return None
    (v0, _), (v1, _) = previous
    if not v0 < v1 < value < np.inf:  # C = inf (no penalty): no line to follow
        return None
    return float(np.log(value / v1) / np.log(v1 / v0))


def class_accuracy(pred: np.ndarray, y: np.ndarray, n_classes: int, weight=None) -> np.ndarray:
    """Each class's (weighted) accuracy; NaN for a class without weight in ``y``."""
    weight = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=float)
    size = np.bincount(y, weights=weight, minlength=n_classes)
    correct = np.bincount(y, weights=weight * (pred == y), minlength=n_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(size > 0, correct / size, np.nan)


# CLIP's coarse grid (10^-6 … 10^6 every two decades) for C, and one for a cosine logit
# scale, whose useful values lie between 1 and 1000.
BISECT_GRIDS = {"linear": np.arange(-6.0, 7.0, 2.0), "cosine": np.arange(0.0, 4.0, 1.0)}
BISECT_STEPS_PER_DECADE = 8


def bisect_search(
    evaluate: Callable[[np.ndarray], np.ndarray],
    log10_grid: np.ndarray,
    steps_per_decade: int = BISECT_STEPS_PER_DECADE,
) -> tuple[np.ndarray, np.ndarray]:
    """Parametric binary search for the value with the best score (CLIP's protocol).

    Evaluates the coarse grid ``10**log10_grid``, then halves the spacing around the best
    value so far, evaluating the midpoints on either side of it (inside the grid's range),
    until the spacing is ``1 / steps_per_decade`` decades. ``evaluate(values)`` returns
    the scores of an increasing array of new values, greater is better; ties go to the
    smaller value, as ``argmax`` does along a grid, and NaN scores are never the best.

    Returns the values evaluated and their scores, in increasing order of value.
    """
    grid = np.sort(np.asarray(log10_grid, dtype=float))
    scores = dict(zip(grid, evaluate(10.0**grid), strict=True))
    step = float(np.min(np.diff(grid))) if len(grid) > 1 else 1.0 / steps_per_decade
    while step > 1.0 / steps_per_decade + 1e-12:
        step /= 2
        # NaN (a fold's scorer undefined there) ranks last: it compares greater than nothing
        # and would keep the first value as the best.
        best = max(scores, key=lambda v: (-np.inf if np.isnan(scores[v]) else scores[v], -v))
        new = [v for v in (best - step, best + step) if grid[0] <= v <= grid[-1]]
        new = np.array([v for v in new if not any(np.isclose(v, u) for u in scores)])
        if len(new):
            scores.update(zip(new, evaluate(10.0**new), strict=True))
    log10 = np.array(sorted(scores))
    return 10.0**log10, np.array([scores[v] for v in log10])
