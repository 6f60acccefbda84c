"""The messages of a fit that stopped short of tol, saying why and what to change."""

from __future__ import annotations

import math

import numpy as np
import torch


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural but for one: "1 iteration", "23 iterations"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _ConvergenceMessageMixin:
    """_suspects_message and _convergence_message of
    :class:`~mr2_probe.MR2LinearClassifier`."""

    @staticmethod
    def _suspects_message(stopped: str, suspects: list) -> str:
        which = "an extreme parameter makes" if len(suspects) == 1 else "extreme parameters make"
        return (
            f"{stopped}: {which} the objective too steep to resolve: {'; '.join(suspects)}. "
            "Use values of a usual order of magnitude."
        )

    def _convergence_message(self, result, solver, dtype):
        if result.stop == "rose":
            curve = result.loss_curve
            best = int(np.argmin(curve))
            return (
                f"{solver} stopped with its epoch loss at {curve[-1]:.4g}, above its best "
                f"{curve[best]:.4g} (epoch {best + 1} of {len(curve)}): its steps took it away "
                f"from its best point. Use a smaller learning_rate than {self.learning_rate:g}."
            )
        if result.stop in ("above_start", "no_progress"):
            best = result.best_after_start
            log_k = f"log K = {math.log(len(self.classes_)):.4g}"
            start = f"its starting point's, {log_k} (zero weights)"
            if result.range_suspects:  # an extreme parameter pins it, not the step size
                stopped = f"{solver}'s best epoch loss stayed at or above its start's {log_k}"
                return self._suspects_message(stopped, result.range_suspects)
            if result.stop == "above_start":
                return (
                    f"{solver}'s best epoch loss, {best:.4g}, stayed above {start}: its steps "
                    f"are too large. Use a smaller learning_rate than {self.learning_rate:g}."
                )
            return (
                f"{solver} made no progress from its starting point: its best epoch loss, "
                f"{best:.4g}, is within 1e-6 of {start}. Either its steps are too small (use "
                f"a larger learning_rate than {self.learning_rate:g}), or the optimum is "
                "there: the penalty holds it at zero (a very small C), or the features do "
                "not tell the classes apart (constant ones)."
            )
        gradient = (  # (none for a minibatch solver)
            f"with a largest gradient entry of {result.largest_gradient:.2g} > tol={self.tol}"
            if result.largest_gradient is not None
            else ""
        )
        curve = result.loss_curve
        progress = not curve or curve[-1] < curve[0]
        if result.stop == "max_iter":
            unit = "iterations" if solver == "lbfgs" else "epochs"
            stopped = f"{solver} did not converge in max_iter={self.max_iter} {unit}"
        elif result.stop == "max_eval":
            stopped = (
                f"lbfgs used up its {4 * self.max_iter} function evaluations (4 × max_iter) "
                f"in {_count(result.n_iter, 'iteration')}, {gradient}"
            )
        elif progress:
            stopped = (
                f"lbfgs stopped after {_count(result.n_iter, 'iteration')}, no longer "
                f"improving, {gradient}"
            )
        else:
            stopped = f"lbfgs made no progress from its starting point, {gradient}"
        if result.range_suspects:  # neither the budget, tol nor the data is the cause
            return self._suspects_message(stopped, result.range_suspects)
        if result.stop == "max_iter":
            advice = f"{stopped}. Increase max_iter or scale the features (e.g. StandardScaler)."
            if solver == "lbfgs":
                return advice
            # A minibatch solver's other lever is its step: one too large oscillates.
            return (
                f"{advice} If loss_curve_ oscillates, use a smaller learning_rate than "
                f"{self.learning_rate:g}."
            )
        if result.stop == "max_eval":
            return (
                f"{stopped}: its line searches needed many evaluations. Increase max_iter or "
                "scale the features (e.g. StandardScaler)."
            )
        precise = "a larger tol" if dtype == torch.float64 else "float64 features or a larger tol"
        if not progress:
            return (
                f"lbfgs made no progress from its starting point, {gradient}: no step "
                "along its first directions lowered the objective. Either the start is "
                "already as near the optimum as the precision of the data allows (a warm "
                f"start from a converged fit; use {precise}), or the features have very "
                "large values, which make the gradient as large (scale them, e.g. "
                "StandardScaler)."
            )
        if dtype == torch.float64:
            return (
                f"{stopped}: its last step changed the objective or the weights by less than "
                "64 float64 epsilons (1.4e-14), where it stops, as scikit-learn's lbfgs does. "
                "Use a larger tol (and, for features of very different magnitudes, scale "
                "them, e.g. StandardScaler)."
            )
        # In float32 the objective's remaining decrease can be below its rounding while the
        # optimum is still far off (a cosine head's narrow valleys: 0.035 of loss on a
        # 60-row problem): float64 is the remedy, a larger tol only accepts the point.
        scale = "" if self.head == "cosine" else " (and scale them, e.g. StandardScaler)"
        return (
            f"{stopped}: float32 arithmetic cannot resolve the objective's decrease from "
            "here, and the optimum may still be some way off. Use float64 features"
            f"{scale} for a tighter solution, or a larger tol to accept this one."
        )
