"""Cross-validation folds solved as one batched problem (the linear head's path).

The folds of a search share X; each is the same objective on its own training rows. Here
the B folds' weights are stacked, (B, K, d), and every evaluation multiplies X once by all
of them (an N × d by d × B·K product, instead of B products of about N·(B−1)/B rows by K
columns): the features are read once per evaluation, and a GPU gets one large product
instead of B small ones. Held-out rows take part with weight zero, so nothing is copied.

The solver is L-BFGS run in lock-step over the folds: the same two-loop recursion per fold
(batched over folds), a backtracking line search on the sufficient-decrease condition that
re-evaluates only the folds whose trial step failed, and per-fold stopping, with a fold
leaving the batch as soon as it stops. Its stopping rule is the full-batch solver's
(:func:`~mr2_probe._solvers.fit_lbfgs`): the largest gradient entry, in the coordinates with
the intercept re-parametrised around the fold's weighted feature mean, at most ``tol``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ._data import block_rows
from ._path import Step, class_accuracy, predictor_step

# scipy's ftol as scikit-learn sets it (float64's even for float32 data), as in fit_lbfgs.
_FTOL = 64 * float(np.finfo(np.float64).eps)
_MAX_LINE_SEARCH = 25


@dataclass
class FoldBatch:
    """B folds of one data set: X (N, d) and y (N,) shared, per-fold weights and margins.

    ``weight`` (B, N) is each fold's sample weight (zero off its training rows),
    ``inv_gamma`` (B, K) each fold's inverse margins, ``center`` (B, d) each fold's weighted
    feature mean (the intercept's re-parametrisation).
    """

    X: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    inv_gamma: torch.Tensor
    center: torch.Tensor
    n_classes: int
    weight_sum: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.weight_sum = self.weight.sum(1)  # (B,)

    @property
    def n_folds(self) -> int:
        return self.weight.shape[0]

    @property
    def n_params(self) -> int:
        return self.n_classes * (self.X.shape[1] + 1)

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, folds: torch.Tensor, C: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective and gradient of the folds ``folds`` (A,) at ``params`` (A, K·(d+1)).

        ``params`` holds each fold's W (K, d) flattened, then its intercept b' (K,) in the
        centred coordinates: the logits are W·(x − m) + b'. The objective is fit_lbfgs's,
        (1/S) Σ_i w_i CE(z_i / γ_{y_i}, y_i) + ½‖W‖² / (C·S).
        """
        n_folds, (n, d), k = len(folds), self.X.shape, self.n_classes
        weight = params[:, : k * d].view(n_folds, k, d)
        bias = params[:, k * d :] - torch.einsum("akd,ad->ak", weight, self.center[folds])
        w, inv_gamma = self.weight[folds], self.inv_gamma[folds]  # (A, N), (A, K)
        stacked = weight.reshape(n_folds * k, d)
        loss = params.new_zeros(n_folds)
        grad_w = torch.zeros_like(stacked)
        grad_b = params.new_zeros(n_folds, k)
        rows = block_rows(d, n_folds * k)
        for start in range(0, n, rows):
            x, y = self.X[start : start + rows], self.y[start : start + rows]
            b = len(y)
            z = torch.addmm(bias.reshape(-1), x, stacked.T).view(b, n_folds, k)
            scale = inv_gamma[:, y].T  # (b, A): 1/γ_{y_i} in each fold
            z.mul_(scale[:, :, None])
            lse = torch.logsumexp(z, dim=2)  # (b, A)
            target = y[:, None, None].expand(b, n_folds, 1)
            sw = w[:, start : start + b].T  # (b, A)
            loss += ((lse - z.gather(2, target).squeeze(2)) * sw).sum(0)
            z.sub_(lse[:, :, None]).exp_()
            z.scatter_add_(2, target, -torch.ones_like(z[:, :, :1]))  # p − onehot
            z.mul_((sw * scale)[:, :, None])
            grad_w.addmm_(z.view(b, n_folds * k).T, x)
            grad_b += z.sum(0)
        grad_w = grad_w.view(n_folds, k, d) - grad_b[:, :, None] * self.center[folds][:, None, :]
        total = self.weight_sum[folds]
        reg = 1.0 / (C * total)  # (A,)
        loss = loss / total + 0.5 * reg * weight.square().sum((1, 2))
        grad_w = grad_w / total[:, None, None] + reg[:, None, None] * weight
        return loss, torch.cat([grad_w.reshape(n_folds, -1), grad_b / total[:, None]], dim=1)

    def coefficients(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """coef (B, K, d) and intercept (B, K) in the original coordinates."""
        k, d = self.n_classes, self.X.shape[1]
        weight = params[:, : k * d].view(-1, k, d)
        bias = params[:, k * d :] - torch.einsum("bkd,bd->bk", weight, self.center)
        return weight, bias


@dataclass
class BatchResult:
    n_iter: np.ndarray  # (B,)
    stop: list  # per fold: "tol", "max_iter" or "stalled"
    largest_gradient: np.ndarray  # (B,)


@torch.no_grad()
def lbfgs_batched(
    batch: FoldBatch,
    params: torch.Tensor,
    C: float,
    *,
    max_iter: int,
    tol: float,
    history: int = 10,
) -> BatchResult:
    """Minimise every fold's objective from ``params`` (B, P), updated in place."""
    n_folds, n_params = params.shape
    device = params.device
    s_hist = params.new_zeros(n_folds, history, n_params)
    y_hist = params.new_zeros(n_folds, history, n_params)
    rho = params.new_zeros(n_folds, history)  # 0 marks an empty or rejected pair
    h0 = params.new_ones(n_folds)  # the initial inverse Hessian's scale, sᵀy / yᵀy
    n_iter = np.zeros(n_folds, dtype=int)
    stop = ["tol"] * n_folds
    everyone = torch.arange(n_folds, device=device)
    value, grad = batch.evaluate(params, everyone, C)
    largest = grad.abs().amax(1)
    active = [f for f, g in enumerate(largest.tolist()) if g > tol]
    slot = 0
    while active:
        a = torch.tensor(active, device=device)
        g = grad[a]
        # Two-loop recursion, newest pair first; empty pairs (ρ = 0) change nothing.
        q = -g
        order = [(slot - 1 - i) % history for i in range(history)]
        alphas = {}
        for i in order:
            alphas[i] = rho[a, i] * (s_hist[a, i] * q).sum(1)
            q -= alphas[i][:, None] * y_hist[a, i]
        direction = h0[a, None] * q
        for i in reversed(order):
            beta = rho[a, i] * (y_hist[a, i] * direction).sum(1)
            direction += (alphas[i] - beta)[:, None] * s_hist[a, i]
        slope = (g * direction).sum(1)
        uphill = slope >= 0  # a stale memory: restart that fold from the gradient
        if bool(uphill.any()):
            direction[uphill] = -g[uphill]
            slope = (g * direction).sum(1)
            rho[a[uphill]] = 0
        first = torch.as_tensor(n_iter[active] == 0, device=device)
        # The first step of a cold start as torch's L-BFGS takes it: min(1, 1/‖g‖₁).
        step = torch.where(first, (1.0 / g.abs().sum(1)).clamp(max=1.0), torch.ones_like(slope))
        start = params[a]
        trial_value, trial_grad = batch.evaluate(start + step[:, None] * direction, a, C)
        # Weak Wolfe conditions by bracketing: a step that fails sufficient decrease is too
        # long, one whose slope is still steep (below c₂ = 0.9 of the start's, as in
        # torch's strong-Wolfe search) too short; only the folds still searching are
        # evaluated again.
        low, high = torch.zeros_like(step), torch.full_like(step, float("inf"))
        for _ in range(_MAX_LINE_SEARCH):
            long = trial_value > value[a] + 1e-4 * step * slope
            short = ~long & ((trial_grad * direction).sum(1) < 0.9 * slope)
            searching = long | short
            if not bool(searching.any()):
                break
            high = torch.where(long, step, high)
            low = torch.where(short, step, low)
            new = torch.where(torch.isinf(high), 2 * step, (low + high) / 2)
            step = torch.where(searching, new, step)
            redo = searching.nonzero().squeeze(1)
            point = start[redo] + step[redo, None] * direction[redo]
            trial_value[redo], trial_grad[redo] = batch.evaluate(point, a[redo], C)
        # A fold whose search ran out keeps a step that decreases the objective, if any.
        failed = trial_value > value[a] + 1e-4 * step * slope
        accepted = ~failed
        s = step[:, None] * direction
        yv = trial_grad - g
        sy = (s * yv).sum(1)
        keep = accepted & (sy > 1e-10)
        s_hist[a, slot] = torch.where(keep[:, None], s, 0)
        y_hist[a, slot] = torch.where(keep[:, None], yv, 0)
        rho[a, slot] = torch.where(keep, 1.0 / sy.where(keep, 1.0), 0)
        h0[a] = torch.where(keep, sy / (yv * yv).sum(1).where(keep, 1.0), h0[a])
        slot = (slot + 1) % history
        previous = value[a]
        params[a] = torch.where(accepted[:, None], start + s, start)
        value[a] = torch.where(accepted, trial_value, previous)
        grad[a] = torch.where(accepted[:, None], trial_grad, g)
        largest[a] = grad[a].abs().amax(1)
        # One host synchronisation per iteration: which folds stop.
        change = (previous - value[a]).abs() <= _FTOL * torch.maximum(
            torch.maximum(previous.abs(), value[a].abs()), torch.ones_like(previous)
        )
        facts = torch.stack([largest[a] <= tol, ~accepted | change]).tolist()
        still = []
        for j, fold in enumerate(active):
            n_iter[fold] += 1
            if facts[0][j]:
                stop[fold] = "tol"
            elif facts[1][j]:
                stop[fold] = "stalled"
            elif n_iter[fold] >= max_iter:
                stop[fold] = "max_iter"
            else:
                still.append(fold)
        active = still
    return BatchResult(np.maximum(n_iter, 1), stop, largest.cpu().numpy())


@dataclass
class FoldSteps:
    """One fold's solutions along the path, as :class:`~mr2_probe._path.FoldPath` keeps them."""

    steps: dict = field(default_factory=dict)


@dataclass
class BatchedPath:
    """All folds' paths solved together: one :class:`FoldBatch` and one parameter block.

    ``tests`` holds each fold's held-out rows (indices into X), ``score_weight`` the
    sample weights for scoring (or None). ``paths`` has one :class:`FoldSteps` per fold.
    """

    batch: FoldBatch
    tests: list
    y_index: np.ndarray
    score_weight: np.ndarray | None
    paths: list = field(init=False)
    params: torch.Tensor = field(init=False)
    _previous: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = [FoldSteps() for _ in self.tests]
        X = self.batch.X
        self.params = X.new_zeros(self.batch.n_folds, self.batch.n_params)
        index = [torch.as_tensor(t, dtype=torch.long, device=X.device) for t in self.tests]
        self._X_tests = [X[i] for i in index]

    def run(self, values, score, progress, *, max_iter, tol, report) -> None:
        """Solve at ``values`` in increasing order, each from the previous solution (with
        :class:`~mr2_probe._path.FoldPath`'s predictor step), score every fold's held-out
        rows, and pass each fold's solver outcome to ``report(fold, n_iter, stop,
        largest_gradient)``."""
        for value in sorted(values):
            self._predict(float(value))
            result = lbfgs_batched(
                self.batch, self.params, float(value), max_iter=max_iter, tol=tol
            )
            coef, intercept = self.batch.coefficients(self.params)
            for f, (X_test, test) in enumerate(zip(self._X_tests, self.tests, strict=True)):
                z = (torch.addmm(intercept[f], X_test, coef[f].T)).cpu().numpy()
                y_test = self.y_index[test]
                weight = None if self.score_weight is None else self.score_weight[test]
                full = np.hstack([coef[f].cpu().numpy(), intercept[f].cpu().numpy()[:, None]])
                self.paths[f].steps[float(value)] = Step(
                    full,
                    score(z, y_test, weight),
                    int(result.n_iter[f]),
                    class_accuracy(z.argmax(1), y_test, z.shape[1]),
                )
                report(f, int(result.n_iter[f]), result.stop[f], float(result.largest_gradient[f]))
                progress.update(1)
            self._previous = [*self._previous, (float(value), self.params.clone())][-2:]

    @torch.no_grad()
    def _predict(self, value: float) -> None:
        t = predictor_step(self._previous, value)
        if t is not None:
            (_, p0), (_, p1) = self._previous
            self.params.copy_(p1 + (p1 - p0) * t)
