"""The linear head's regularisation path: folds solved by a lock-step L-BFGS, batched.

A :class:`FoldBatch` is B folds over one X, each the same objective on its own rows: the
folds' weights are stacked, (B, K, d), and every evaluation multiplies X once by all of them
(an N × d by d × B·K product). With all the folds of a search in one batch, X is read once
per evaluation and a GPU gets one large product instead of B small ones; held-out rows take
part with weight zero, so the training rows are not copied (the held-out rows are, once,
for scoring). A batch of one fold holds that fold's training rows alone (a copy).

The solver is L-BFGS run in lock-step over the folds: the same two-loop recursion per fold
(batched over folds), a line search for the weak Wolfe conditions by bracketing with
quadratic and secant steps that re-evaluates only the folds still searching, and per-fold
stopping, with a fold leaving the batch as soon as it stops. Along a path its memory is
carried from one C to the next, corrected for the change of penalty (:class:`Memory`).
Its stopping tests are the full-batch solver's
(:func:`~mr2_probe._solvers.fit_lbfgs`): the largest gradient entry, in the coordinates with
the intercept re-parametrised around the fold's weighted feature mean, at most ``tol``;
max_iter; 4·max_iter evaluations; no further decrease. Its iterations differ from torch's
strong-Wolfe L-BFGS, so ``n_iter_`` does too, and solutions agree to the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ._classifier import _overflow_message
from ._data import block_rows
from ._path import Step

# scipy's ftol as scikit-learn sets it (float64's even for float32 data), as in fit_lbfgs.
_FTOL = 64 * float(np.finfo(np.float64).eps)
_MAX_LINE_SEARCH = 25
# A path's L-BFGS memory: up to 30 pairs (10 on torch's L-BFGS; 30 cut the iterations
# of bench_cv's path by a sixth), at most 2**26 elements of s and y per path (one path per
# batch of folds), and never fewer than 10 pairs.
_HISTORY = 30
_HISTORY_ELEMENTS = 2**26


@dataclass
class FoldBatch:
    """B folds of one data set: X (N, d) and y (N,) shared, per-fold weights and margins.

    ``weight`` (B, N) is each fold's sample weight (zero off its training rows),
    ``inv_gamma`` (B, K) each fold's inverse margins, ``center`` (B, d) each fold's weighted
    feature mean (the intercept's re-parametrisation), or None without an intercept.
    """

    X: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    inv_gamma: torch.Tensor
    center: torch.Tensor | None
    n_classes: int
    weight_sum: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        # S in float64, as fit_lbfgs takes it, then in the data's dtype.
        self.weight_sum = self.weight.sum(1, dtype=torch.float64).to(self.weight.dtype)

    @property
    def n_folds(self) -> int:
        return self.weight.shape[0]

    @property
    def fit_intercept(self) -> bool:
        return self.center is not None

    @property
    def n_params(self) -> int:
        return self.n_classes * (self.X.shape[1] + self.fit_intercept)

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, folds: torch.Tensor, C: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective and gradient of the folds ``folds`` (A,) at ``params`` (A, K·(d+1)).

        ``params`` holds each fold's W (K, d) flattened, then (with an intercept) its
        intercept b' (K,) in the centred coordinates: the logits are W·(x − m) + b'. The
        objective is fit_lbfgs's, (1/S) Σ_i w_i CE(z_i / γ_{y_i}, y_i) + ½‖W‖² / (C·S).
        Held-out rows (weight zero) are masked, not multiplied by zero, so that an overflow
        on them cannot turn the fold's sums into NaN.
        """
        n_folds, (n, d), k = len(folds), self.X.shape, self.n_classes
        weight = params[:, : k * d].view(n_folds, k, d)
        bias = None
        if self.fit_intercept:
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
            z = x @ stacked.T if bias is None else torch.addmm(bias.reshape(-1), x, stacked.T)
            z = z.view(b, n_folds, k)
            scale = inv_gamma[:, y].T  # (b, A): 1/γ_{y_i} in each fold
            z.mul_(scale[:, :, None])
            lse = torch.logsumexp(z, dim=2)  # (b, A)
            target = y[:, None, None].expand(b, n_folds, 1)
            sw = w[:, start : start + b].T  # (b, A)
            held_out = sw == 0
            loss += ((lse - z.gather(2, target).squeeze(2)) * sw).masked_fill_(held_out, 0).sum(0)
            z.sub_(lse[:, :, None]).exp_()
            z.scatter_add_(2, target, -torch.ones_like(z[:, :, :1]))  # p − onehot
            z.mul_((sw * scale)[:, :, None]).masked_fill_(held_out[:, :, None], 0)
            grad_w.addmm_(z.view(b, n_folds * k).T, x)
            grad_b += z.sum(0)
        grad_w = grad_w.view(n_folds, k, d)
        if self.fit_intercept:
            grad_w -= grad_b[:, :, None] * self.center[folds][:, None, :]
        total = self.weight_sum[folds]
        reg = 1.0 / (C * total)  # (A,)
        loss = loss / total + 0.5 * reg * weight.square().sum((1, 2))
        grad_w = grad_w / total[:, None, None] + reg[:, None, None] * weight
        grads = [grad_w.reshape(n_folds, -1)]
        if self.fit_intercept:
            grads.append(grad_b / total[:, None])
        return loss, torch.cat(grads, dim=1)

    def parameters(self, coef: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`coefficients`: params (B, P) from coef (B, K, d), with the
        intercept as a last column when there is one."""
        k, d = self.n_classes, self.X.shape[1]
        weight = coef[:, :, :d]
        parts = [weight.reshape(len(coef), k * d)]
        if self.fit_intercept:
            parts.append(coef[:, :, d] + torch.einsum("bkd,bd->bk", weight, self.center))
        return torch.cat(parts, dim=1)

    def coefficients(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """coef (B, K, d) and intercept (B, K) in the original coordinates (None without)."""
        k, d = self.n_classes, self.X.shape[1]
        weight = params[:, : k * d].view(-1, k, d)
        if not self.fit_intercept:
            return weight, None
        bias = params[:, k * d :] - torch.einsum("bkd,bd->bk", weight, self.center)
        return weight, bias


@dataclass
class BatchResult:
    n_iter: np.ndarray  # (B,)
    stop: list  # per fold: "tol", "max_iter", "max_eval" or "stalled", as fit_lbfgs
    largest_gradient: np.ndarray  # (B,)


@dataclass
class Memory:
    """The folds' L-BFGS pairs, kept from one value of C to the next.

    The penalty ½‖W‖²/(C·S) is quadratic, so a pair (s, y) recorded at C is exact at C'
    once y gains (1/C' − 1/C)/S · s on W's entries: the loss's curvature the pairs hold is
    the same function at every C. A path that carries its memory therefore starts each C
    with the curvature of the last instead of a gradient step.
    """

    s: torch.Tensor  # (B, history, P)
    y: torch.Tensor  # (B, history, P)
    rho: torch.Tensor  # (B, history): 1 / sᵀy, 0 marks an empty or rejected pair
    h0: torch.Tensor  # (B,): the initial inverse Hessian's scale, sᵀy / yᵀy
    reg: torch.Tensor | None = None  # (B,): 1/(C·S) the pairs were recorded at
    slot: int = 0  # the next slot of the ring
    # Where the last solve ended, with its objective and gradient there: a solve that
    # starts from the same point corrects them for its penalty instead of evaluating.
    point: torch.Tensor | None = None
    value: torch.Tensor | None = None
    grad: torch.Tensor | None = None

    @classmethod
    def empty(cls, params: torch.Tensor, history: int) -> Memory:
        n_folds, n_params = params.shape
        pairs = params.new_zeros(n_folds, history, n_params)
        rho, h0 = params.new_zeros(n_folds, history), params.new_ones(n_folds)
        return cls(pairs, pairs.clone(), rho, h0)

    def move_to(self, reg: torch.Tensor, n_penalised: int) -> None:
        """Correct the pairs, and the last objective and gradient, from the penalty they
        were recorded at to ``reg`` (B,)."""
        if self.reg is None:
            self.reg = reg
            return
        change = reg - self.reg
        self.reg = reg
        self.y[:, :, :n_penalised] += change[:, None, None] * self.s[:, :, :n_penalised]
        if self.point is not None:
            weight = self.point[:, :n_penalised]
            self.value += 0.5 * change * weight.square().sum(1)
            self.grad[:, :n_penalised] += change[:, None] * weight
        sy = (self.s * self.y).sum(2)
        keep = (self.rho != 0) & (sy > 0)
        self.rho = torch.where(keep, 1.0 / sy.where(keep, 1.0), 0)
        newest = (self.slot - 1) % self.s.shape[1]
        yy = self.y[:, newest].square().sum(1)
        fresh = keep[:, newest] & (yy > 0)
        self.h0 = torch.where(fresh, sy[:, newest] / yy.where(fresh, 1.0), self.h0)


@torch.no_grad()
def lbfgs_batched(
    batch: FoldBatch,
    params: torch.Tensor,
    C: float,
    *,
    max_iter: int,
    tol: float,
    history: int = 10,
    memory: Memory | None = None,
) -> BatchResult:
    """Minimise every fold's objective from ``params`` (B, P), updated in place.

    ``memory`` (a :class:`Memory`, updated in place) carries the pairs of a previous
    solve at another C, and its objective and gradient where it ended: a solve that starts
    there needs no first evaluation. Without it the memory starts empty, with ``history``
    slots (a memory keeps its own number).

    Stops a fold as fit_lbfgs does: ``"tol"`` (largest gradient entry at most tol),
    ``"max_iter"``, ``"max_eval"`` (4·max_iter evaluations of that fold), or ``"stalled"``
    (no decrease the line search can find, or a change of the objective below scipy's
    ftol). NaN counts as failing every test, so a fold that meets one never stops as
    converged. A pair whose curvature is lost in rounding (L-BFGS-B's test) is not
    skipped, as torch's L-BFGS skips one, but leaves its slot empty (the folds share one
    ring of slots).
    """
    n_folds, n_params = params.shape
    device = params.device
    if memory is None:
        memory = Memory.empty(params, history)
    memory.move_to(1.0 / (C * batch.weight_sum), batch.n_classes * batch.X.shape[1])
    s_hist, y_hist, rho, h0, slot = memory.s, memory.y, memory.rho, memory.h0, memory.slot
    history = s_hist.shape[1]
    n_iter = np.zeros(n_folds, dtype=int)
    evals = np.ones(n_folds, dtype=int)
    stop = ["tol"] * n_folds
    everyone = torch.arange(n_folds, device=device)
    if memory.point is not None and torch.equal(memory.point, params):
        value, grad = memory.value, memory.grad
        evals[:] = 0
    else:
        value, grad = batch.evaluate(params, everyone, C)
    largest = grad.abs().amax(1)
    active = [f for f, done in enumerate((largest <= tol).tolist()) if not done]
    a = torch.tensor(active, device=device)
    first = True
    while active:
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
        # A direction that is not downhill (a stale memory) restarts that fold from −g.
        uphill = ~((g * direction).sum(1) < 0)
        direction = torch.where(uphill[:, None], -g, direction)
        rho[a] = torch.where(uphill[:, None], 0, rho[a])
        slope = (g * direction).sum(1)
        # A fold without a pair takes its first step as torch's L-BFGS does: min(1, 1/‖g‖₁).
        step = torch.ones_like(slope)
        if first:
            unscaled = (rho[a] == 0).all(1)
            step = torch.where(unscaled, (1.0 / g.abs().sum(1)).clamp(max=1.0), step)
        first = False
        start = params[a]
        trial_value, trial_grad = batch.evaluate(start + step[:, None] * direction, a, C)
        evals[active] += 1
        # Weak Wolfe conditions by bracketing: a step that fails sufficient decrease is too
        # long, one whose slope is still steep (below c₂ = 0.9 of the start's, as in
        # torch's strong-Wolfe search) too short; only the folds still searching are
        # evaluated again. The last short step (``low``) meets sufficient decrease and is
        # kept for a fold whose search runs out.
        bound = value[a]
        low, high = torch.zeros_like(step), torch.full_like(step, float("inf"))
        low_value, low_grad = trial_value.clone(), trial_grad.clone()
        for _ in range(_MAX_LINE_SEARCH):
            long = ~(trial_value <= bound + 1e-4 * step * slope)  # NaN is too long
            trial_slope = (trial_grad * direction).sum(1)
            short = ~long & (trial_slope < 0.9 * slope)
            searching = long | short
            redo = searching.nonzero().squeeze(1)  # one synchronisation per evaluation
            if not len(redo):
                break
            high = torch.where(long, step, high)
            low = torch.where(short, step, low)
            low_value = torch.where(short, trial_value, low_value)
            low_grad = torch.where(short[:, None], trial_grad, low_grad)
            new = _next_step(step, slope, bound, trial_value, trial_slope, long, low, high)
            step = torch.where(searching, new, step)
            point = start[redo] + step[redo, None] * direction[redo]
            trial_value[redo], trial_grad[redo] = batch.evaluate(point, a[redo], C)
            evals[np.asarray(active)[redo.cpu().numpy()]] += 1
        failed = ~(trial_value <= bound + 1e-4 * step * slope)
        fallback = failed & (low > 0)
        step = torch.where(fallback, low, step)
        trial_value = torch.where(fallback, low_value, trial_value)
        trial_grad = torch.where(fallback[:, None], low_grad, trial_grad)
        accepted = ~failed | fallback
        s = step[:, None] * direction
        yv = trial_grad - g
        sy = (s * yv).sum(1)
        # L-BFGS-B's test: a pair is kept when its curvature sᵀy is not lost in rounding
        # next to the decrease along the step (a step meeting the Wolfe conditions always
        # has sᵀy ≥ 0.1·|gᵀs|), whatever the scale: near tol the steps are tiny.
        keep = accepted & (sy > torch.finfo(sy.dtype).eps * (g * s).sum(1).abs())
        s_hist[a, slot] = torch.where(keep[:, None], s, 0)
        y_hist[a, slot] = torch.where(keep[:, None], yv, 0)
        rho[a, slot] = torch.where(keep, 1.0 / sy.where(keep, 1.0), 0)
        h0[a] = torch.where(keep, sy / (yv * yv).sum(1).where(keep, 1.0), h0[a])
        slot = memory.slot = (slot + 1) % history
        params[a] = torch.where(accepted[:, None], start + s, start)
        value[a] = torch.where(accepted, trial_value, bound)
        grad[a] = torch.where(accepted[:, None], trial_grad, g)
        largest[a] = grad[a].abs().amax(1)
        change = (bound - value[a]).abs() <= _FTOL * torch.maximum(
            torch.maximum(bound.abs(), value[a].abs()), torch.ones_like(bound)
        )
        # One more synchronisation per iteration: which folds stop.
        met, stalled = torch.stack([largest[a] <= tol, ~accepted | change]).tolist()
        still = []
        for j, fold in enumerate(active):
            n_iter[fold] += 1
            if met[j]:
                stop[fold] = "tol"
            elif n_iter[fold] >= max_iter:
                stop[fold] = "max_iter"
            elif evals[fold] >= 4 * max_iter:
                stop[fold] = "max_eval"
            elif stalled[j]:
                stop[fold] = "stalled"
            else:
                still.append(fold)
        if still != active:
            active = still
            a = torch.tensor(active, device=device)
    memory.point, memory.value, memory.grad = params.clone(), value, grad
    return BatchResult(n_iter, stop, largest.cpu().numpy())


def _next_step(step, slope, value0, value, trial_slope, long, low, high) -> torch.Tensor:
    """The next trial step of the line search, per fold.

    A step too long is replaced by the minimum of the quadratic through φ(0), φ'(0) and
    φ(step); one too short by the zero of the secant of φ' through 0 and step (both exact
    for a quadratic φ). Inside a bracket [low, high] the guess is kept in its middle 80%;
    before one (high = ∞) it extrapolates 2 to 100 times the step. Where the guess is not
    finite (a NaN evaluation), the bracket is halved, or the step doubled.
    """
    quadratic = -slope * step**2 / (2 * (value - value0 - slope * step))
    secant = step * slope / (slope - trial_slope)
    guess = torch.where(long, quadratic, secant)
    bracketed = torch.isfinite(high)
    width = torch.where(bracketed, high - low, 0)
    inside = torch.minimum(torch.maximum(guess, low + 0.1 * width), high - 0.1 * width)
    beyond = torch.minimum(torch.maximum(guess, 2 * step), 100 * step)
    fallback = torch.where(bracketed, (low + high) / 2, 2 * step)
    new = torch.where(bracketed, inside, beyond)
    return torch.where(torch.isfinite(new) & torch.isfinite(guess), new, fallback)


@dataclass
class FoldSteps:
    """One fold's solutions along the path, as :class:`~mr2_probe._path.FoldPath` keeps them."""

    steps: dict = field(default_factory=dict)


@dataclass
class HeldOut:
    """A fold's held-out rows on the device, their label indices and scoring weights."""

    X: torch.Tensor
    y_index: np.ndarray
    weight: np.ndarray | None


@dataclass
class BatchedPath:
    """Some folds' paths solved together: one :class:`FoldBatch` and one parameter block.

    ``held_out`` has one :class:`HeldOut` per fold of the batch, and ``paths`` one
    :class:`FoldSteps`. The L-BFGS memory is carried from each value of C to the next
    (:class:`Memory`), so each starts from the last solution with the curvature measured
    so far: its first step is a quasi-Newton step for the change of penalty.

    ``rows``, when given, makes the batch's X and y on demand (a fold's own training
    rows, a copy): they are held only while :meth:`run` solves, so that folds solved one
    after another never hold more than one copy between them.
    """

    batch: FoldBatch
    held_out: list
    rows: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    paths: list = field(init=False)
    params: torch.Tensor = field(init=False)
    memory: Memory = field(init=False)
    _last: float | None = field(init=False, default=None)  # the value solved last

    def __post_init__(self) -> None:
        self.paths = [FoldSteps() for _ in self.held_out]
        self.params = self.batch.X.new_zeros(self.batch.n_folds, self.batch.n_params)
        pairs = _HISTORY_ELEMENTS // (2 * self.params.numel())
        self.memory = Memory.empty(self.params, int(min(_HISTORY, max(10, pairs))))
        if self.rows is not None:
            self._release()

    def _release(self) -> None:
        """Drop X and y, keeping their number of features, dtype and device."""
        self.batch.X = self.batch.X.new_empty((0, self.batch.X.shape[1]))
        self.batch.y = self.batch.y.new_empty((0,))

    def run(self, values, score, progress, *, max_iter, tol, report) -> None:
        """Solve at ``values`` in increasing order, each from the solution of the nearest
        value solved so far (in log C) and the memory, score every fold's held-out rows,
        and pass each fold's solver outcome to ``report(n_iter, stop, largest_gradient)``.
        Along a grid the nearest is the last; a bisection's midpoint starts from its
        neighbour, not from the far end of the grid where the path last was."""
        if self.rows is None:
            self._run(values, score, progress, max_iter, tol, report)
            return
        self.batch.X, self.batch.y = self.rows()
        try:
            self._run(values, score, progress, max_iter, tol, report)
        finally:
            self._release()

    def _run(self, values, score, progress, max_iter, tol, report) -> None:
        for value in sorted(values):
            self._start_nearest(float(value))
            result = lbfgs_batched(
                self.batch, self.params, float(value), max_iter=max_iter, tol=tol,
                memory=self.memory,
            )  # fmt: skip
            if not bool(torch.isfinite(self.params).all()):
                what = "the fit produced non-finite coefficients"
                raise ValueError(_overflow_message(what, self.params.dtype))
            coef, intercept = self.batch.coefficients(self.params)
            for f, held_out in enumerate(self.held_out):
                z = held_out.X @ coef[f].T
                bias = None
                if intercept is not None:
                    z += intercept[f]
                    bias = intercept[f].cpu().numpy()
                self.paths[f].steps[float(value)] = Step.scored(
                    z.cpu().numpy(), coef[f].cpu().numpy(), bias, result.n_iter[f],
                    held_out.y_index, held_out.weight, score,
                )  # fmt: skip
                report(int(result.n_iter[f]), result.stop[f], float(result.largest_gradient[f]))
                progress.update(1)
            self._last = float(value)

    @torch.no_grad()
    def _start_nearest(self, value: float) -> None:
        solved = list(self.paths[0].steps)
        if not solved:
            return
        nearest = min(solved, key=lambda v: (abs(np.log(v / value)), v != self._last))
        if nearest == self._last:
            return
        coef = np.stack([path.steps[nearest].coef for path in self.paths])  # (B, K, dof)
        coef = torch.as_tensor(coef, dtype=self.params.dtype, device=self.params.device)
        self.params.copy_(self.batch.parameters(coef))
