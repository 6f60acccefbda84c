"""The paths of the plain linear and cosine heads: folds solved by a lock-step L-BFGS.

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
carried from one C to the next, corrected for the change of penalty (:class:`Memory`), and
from one scale of a cosine head to the next nearby one.
Its stopping tests are the full-batch solver's
(:func:`~mr2_probe._solvers.fit_lbfgs`): the largest gradient entry, in the coordinates with
the intercept re-parametrised around the fold's weighted feature mean (for a cosine head,
in its unit class directions), at most ``tol``; max_iter; 4·max_iter evaluations; no
further decrease. Its iterations differ from torch's strong-Wolfe L-BFGS, so ``n_iter_``
does too, and solutions agree to the tolerance (a cosine head's up to its non-convexity:
it can end at another minimiser of the same objective).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from . import _solvers
from ._data import block_rows
from ._device import NORM_ROWS, inverse_row_norms, rows_product, tangent_rows, transposed_product
from ._fit_errors import FitDivergedError, _overflow_message, _range_suspects, _scale_underflow
from ._head import open_pair
from ._path import Step
from ._solvers import _COSINE_HISTORY, _KEEP_LOGIT_GRADS, ClassRisk, one_thread_if_small
from ._stats import penalised_scale, penalty_stiffness

# scipy's ftol as scikit-learn sets it (float64's even for float32 data), as in fit_lbfgs.
_FTOL = 64 * float(np.finfo(np.float64).eps)
_MAX_LINE_SEARCH = 25
# A path's L-BFGS memory: up to 30 pairs (10 on torch's L-BFGS; 30 cut the iterations
# of bench_cv's path by a sixth), at most 2**26 elements of s and y per path (one path per
# batch of folds), and never fewer than 10 pairs.
_HISTORY = 30
_HISTORY_ELEMENTS = 2**26
# A cosine head's path keeps as many pairs as its single fit does (_COSINE_HISTORY: its
# problem is badly conditioned at large scales), and carries them to a next scale within
# this factor of the last scale that formed pairs: further away they cost more iterations
# than none on a tenfold grid (benchmarks/bench_scale_path.py, docs/speed.md).
_CARRY_SCALE_RATIO = 4.0
# The restarts of a cosine fold that stalls at one scale (fit_lbfgs restarts up to 19
# times). One took the float32 fold that had stalled on rounding to tol; where float32
# cannot resolve the objective at all, further ones stalled again within 1 to 3
# iterations and cost up to 25 evaluations each, a fifth of a tilted search's time.
_COSINE_RESTARTS = 1


@dataclass
class FoldBatch:
    """B folds of one data set: X (N, d) and y (N,) shared, per-fold weights and margins.

    ``weight`` (B, N) is each fold's sample weight (zero off its training rows),
    ``inv_gamma`` (B, K) each fold's inverse margins, ``center`` (B, d) each fold's weighted
    feature mean (the intercept's re-parametrisation), or None without an intercept, and
    ``bias_scale`` (B,) the scale each fold's intercept is taken in (fit_lbfgs's σ_b, see
    :func:`~mr2_probe._stats.intercept_scale`), or None for 1; with ``bias_variance`` (B,)
    each fold's :func:`~mr2_probe._stats.entry_variance`, :meth:`take_intercept_scale`
    grows it at a small C·S as fit_lbfgs does (``c_bar`` the margins' mean, None for 1).

    With ``cosine`` the head is the cosine head: the logits are s·(x/‖x‖)·(W/‖W‖)ᵀ row by
    row, s the value solved at, with no intercept and no penalty. The normalised features
    are never formed: the products are scaled by ``row_scale`` = 1/‖x‖ (N,), kept with X.
    """

    X: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    inv_gamma: torch.Tensor
    center: torch.Tensor | None
    n_classes: int
    cosine: bool = False
    tilt: float = 0.0
    # A linear head of two classes with the first class's logit pinned at zero (one row
    # of parameters, scikit-learn's binomial model), as ProbeHead pins it.
    pinned: bool = False
    bias_scale: torch.Tensor | None = None
    bias_variance: torch.Tensor | None = None
    c_bar: float | None = None
    # σ_b / the features' own σ_b of each fold (B,) at the value solved (None: 1), which
    # the stopping test divides the intercept's gradient by, as fit_lbfgs's.
    bias_extra: torch.Tensor | None = field(init=False, default=None)
    weight_sum: torch.Tensor = field(init=False)
    _weight_sum64: torch.Tensor = field(init=False)  # S in float64, for 1/(C·S)
    row_scale: torch.Tensor | None = field(init=False, default=None)
    class_weight: torch.Tensor | None = field(init=False, default=None)  # S_k (B, K)

    def __post_init__(self) -> None:
        # S in float64, as fit_lbfgs takes it, then in the data's dtype.
        self._weight_sum64 = self.weight.sum(1, dtype=torch.float64)
        self.weight_sum = self._weight_sum64.to(self.weight.dtype)
        self._data_scale = self.bias_scale
        self.set_rows(self.X, self.y)

    def set_rows(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Take X and y (and, for a cosine head, their rows' 1/‖x‖, as the full-batch
        solver's sources compute them)."""
        self.X, self.y = X, y
        if self.cosine:
            self.row_scale = _inverse_norms(X) if len(X) else None
        if self.tilt > 0 and len(y):
            shape = (self.weight.shape[0], self.n_classes)
            self.class_weight = self.weight.new_zeros(shape).index_add_(1, y, self.weight)

    @property
    def n_folds(self) -> int:
        return self.weight.shape[0]

    @property
    def fit_intercept(self) -> bool:
        return self.center is not None

    @property
    def rows(self) -> int:
        """Rows of W: one per class, one in all for a pinned head."""
        return 1 if self.pinned else self.n_classes

    @property
    def n_params(self) -> int:
        return self.rows * (self.X.shape[1] + self.fit_intercept)

    @property
    def evaluation_work(self) -> int:
        """Multiply-adds of one evaluation of every fold: two products of N·d·B·rows."""
        return 2 * self.X.shape[0] * self.X.shape[1] * self.n_folds * self.rows

    @property
    def n_penalised(self) -> int:
        """How many leading parameters the penalty ½‖W‖²/(C·S) takes (none for cosine)."""
        return 0 if self.cosine else self.rows * self.X.shape[1]

    def penalty(self, value: float, folds=slice(None), dtype=None) -> torch.Tensor:
        """1/(C·S) of the folds ``folds`` (A,) at C = ``value``, in X's dtype (or ``dtype``):
        C·S is formed in float64, as fit_lbfgs forms it (_penalty_factor). In float32 a C
        beyond its range is inf: weights of 1e-39 with C = 1e39 (the problem of weights of 1
        at C = 1) made the penalty 0, and every fold solved C = inf instead."""
        return (1.0 / (value * self._weight_sum64[folds])).to(dtype or self.weight.dtype)

    def take_intercept_scale(self, value: float) -> torch.Tensor | None:
        """Take each fold's intercept in fit_lbfgs's scale at C = ``value``
        (:func:`~mr2_probe._stats.penalised_intercept_scale`: larger where C·S is small, the
        penalty's curvature dwarfing the intercept's). Returns the factor (B,), a power of
        two, by which the intercept's parameters β = b' / σ_b change, or None where none
        does."""
        if self.bias_variance is None or self.bias_scale is None:
            return None
        reg = self.penalty(value, dtype=torch.float64).tolist()
        variance, data = self.bias_variance.tolist(), self._data_scale.tolist()
        scales, extras = zip(
            *(
                penalised_scale(v, d, penalty_stiffness(self.n_classes, self.c_bar, r))
                for v, d, r in zip(variance, data, reg, strict=True)
            ),
            strict=True,
        )
        scale = torch.tensor(scales, dtype=self.bias_scale.dtype, device=self.bias_scale.device)
        self.bias_extra = None
        if any(extra != 1 for extra in extras):
            self.bias_extra = torch.tensor(extras, dtype=scale.dtype, device=scale.device)
        if torch.equal(scale, self.bias_scale):
            return None
        factor, self.bias_scale = self.bias_scale / scale, scale
        return factor

    def direction_norms(self, params: torch.Tensor) -> torch.Tensor:
        """‖w_k‖ (A, K, 1) of each fold's rows of W (the cosine head's)."""
        k = self.n_classes
        weight = params[:, : k * self.X.shape[1]].view(len(params), k, -1)
        return torch.linalg.vector_norm(weight, dim=2, keepdim=True).clamp_min(1e-12)

    def largest_gradient(
        self, params: torch.Tensor, grad: torch.Tensor, folds=slice(None)
    ) -> torch.Tensor:
        """Each fold's largest gradient entry (A,) of the folds ``folds``, the stopping
        test's measure: the intercept's divided by ``bias_extra`` where it has one (the
        part of its scale that the penalty made); for a cosine head in its unit class
        directions, ‖w_k‖·∂f/∂w_k, as fit_lbfgs takes it after rescaling the rows to unit
        norm (f does not depend on their norms)."""
        if not self.cosine and self.bias_extra is None:
            return grad.abs().amax(1)
        if not self.cosine:  # (NaN propagates through maximum, as through amax)
            n = self.n_penalised
            intercept = grad[:, n:].abs().amax(1) / self.bias_extra[folds]
            return torch.maximum(grad[:, :n].abs().amax(1), intercept)
        norms = self.direction_norms(params)  # (A, K, 1)
        return (grad.view(norms.shape[0], self.n_classes, -1) * norms).abs().amax((1, 2))

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, folds: torch.Tensor, value: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective and gradient of the folds ``folds`` (A,) at ``params`` (A, K·(d+1)).

        ``params`` holds each fold's W (K, d) flattened, then (with an intercept) its
        intercept β = b' / σ_b (K,) in the centred coordinates: the logits are
        W·(x − m) + σ_b·β. The
        objective is fit_lbfgs's, (1/S) Σ_i w_i CE(z_i / γ_{y_i}, y_i) + ½‖W‖² / (C·S) at
        C = ``value`` (with ``tilt`` > 0 the data term is the tilted class risk); for a
        cosine head, the same data term of the logits s·(x/‖x‖)·(W/‖W‖)ᵀ at s = ``value``,
        without a penalty.
        """
        n_folds, d, k = len(folds), self.X.shape[1], self.rows
        weight = params[:, : k * d].view(n_folds, k, d)
        bias = None
        if self.fit_intercept:
            bias = params[:, k * d :] * self._scale(folds)
            bias = bias - torch.einsum("akd,ad->ak", weight, self.center[folds])
        if self.cosine:
            norms = self.direction_norms(params)  # (A, K, 1)
            unit = weight / norms
            stacked = (value * unit).reshape(n_folds * k, d)  # V = s·W/‖W‖
        elif self.pinned:  # the first class's row and intercept are zero
            stacked = torch.cat([torch.zeros_like(weight), weight], 1).reshape(2 * n_folds, d)
            bias = None if bias is None else torch.cat([torch.zeros_like(bias), bias], 1)
        else:
            stacked = weight.reshape(n_folds * k, d)
        term = self._tilted_term if self.tilt > 0 else self._mean_term
        loss, grad_w, grad_b = term(stacked, bias, folds)
        if self.pinned:  # the gradients of the second class's logit
            grad_w, grad_b = grad_w.view(n_folds, 2, d)[:, 1:], grad_b[:, 1:]
        grad_w = grad_w.reshape(n_folds, k, d)
        if self.cosine:
            # ∂f/∂w_k = s·(I − u_k u_kᵀ)·∂f/∂v_k / ‖w_k‖: no radial part, f ignores the norms.
            grad_w = tangent_rows(unit, grad_w) * (value / norms)
            return loss, grad_w.reshape(n_folds, -1)
        if self.fit_intercept:
            grad_w -= grad_b[:, :, None] * self.center[folds][:, None, :]
        reg = self.penalty(value, folds)  # (A,)
        loss = loss + 0.5 * reg * weight.square().sum((1, 2))
        grad_w = grad_w + reg[:, None, None] * weight
        grads = [grad_w.reshape(n_folds, -1)]
        if self.fit_intercept:
            grads.append(grad_b * self._scale(folds))
        return loss, torch.cat(grads, dim=1)

    def _scale(self, folds=slice(None)):
        """σ_b of the folds ``folds`` as a column (A, 1), or 1."""
        return 1.0 if self.bias_scale is None else self.bias_scale[folds][:, None]

    def _blocks(self, stacked, bias, folds, factor=None):
        """Per block of rows: its start, x, y, sample weights (b, A), the losses
        ℓ_i = CE(z_i / γ_{y_i}, y_i) (b, A) and ∂(w_i·ℓ_i)/∂(x_i·Vᵀ) (b, A, K), times
        ``factor`` (A, K) of y_i when given. Held-out rows (weight zero) are masked, not
        multiplied by zero, so that an overflow on them cannot turn a fold's sums into NaN.
        """
        n_folds, k = len(folds), self.n_classes
        w, inv_gamma = self.weight[folds], self.inv_gamma[folds]  # (A, N), (A, K)
        for start, x, y in self._row_blocks(n_folds):
            b = len(y)
            z = rows_product(x, stacked, None if bias is None else bias.reshape(-1))
            z = z.view(b, n_folds, k)
            scale = inv_gamma[:, y].T  # (b, A): 1/γ_{y_i} in each fold
            if self.cosine:
                scale = scale * self.row_scale[start : start + b, None]
            z.mul_(scale[:, :, None])
            lse = torch.logsumexp(z, dim=2)  # (b, A)
            target = y[:, None, None].expand(b, n_folds, 1)
            sw = w[:, start : start + b].T  # (b, A)
            held_out = sw == 0
            loss = (lse - z.gather(2, target).squeeze(2)).masked_fill_(held_out, 0)
            z.sub_(lse[:, :, None]).exp_()
            z.scatter_add_(2, target, -torch.ones_like(z[:, :, :1]))  # p − onehot
            times = sw * scale if factor is None else sw * scale * factor[:, y].T
            z.mul_(times[:, :, None]).masked_fill_(held_out[:, :, None], 0)
            yield start, x, y, sw, loss, z

    def _mean_term(self, stacked, bias, folds):
        """(1/S) Σ_i w_i ℓ_i per fold (A,), and its gradients in V (A·K, d) and b (A, K)."""
        n_folds, k = len(folds), self.n_classes
        loss = stacked.new_zeros(n_folds)
        grad_v = torch.zeros_like(stacked)
        grad_b = stacked.new_zeros(n_folds, k)
        for _, x, _, sw, ell, z in self._blocks(stacked, bias, folds):
            loss += (ell * sw).sum(0)
            grad_v += transposed_product(z.view(len(x), n_folds * k), x)
            grad_b += z.sum(0)
        total = self.weight_sum[folds]
        return loss / total, grad_v / total.repeat_interleave(k)[:, None], grad_b / total[:, None]

    def _tilted_term(self, stacked, bias, folds):
        """The tilted class risk R_t of fit_lbfgs per fold (A,), and its gradients in V and b:
        the class losses L_k first, then every sample's gradient weighted by q_{y_i} / S_{y_i}
        (q = softmax(t·L + log π)). The logits' gradients of the first pass are kept for the
        second when they fit in memory, as the full-batch solver keeps them."""
        n_folds, k = len(folds), self.n_classes
        keep = len(self.X) * n_folds * k <= _KEEP_LOGIT_GRADS
        sums, kept = stacked.new_zeros(n_folds, k), []
        for _, _, y, sw, ell, z in self._blocks(stacked, bias, folds):
            sums.index_add_(1, y, (ell * sw).T)
            if keep:
                kept.append(z)
        class_risk = ClassRisk(self.class_weight[folds], self.tilt)  # S_k (A, K)
        risk, factor = class_risk.risk(class_risk.class_loss(sums))  # factor q_k / S_k
        grad_v = torch.zeros_like(stacked)
        grad_b = stacked.new_zeros(n_folds, k)
        if keep:
            blocks = (
                (x, z.mul_(factor[:, y].T[:, :, None]))
                for (_, x, y), z in zip(self._row_blocks(n_folds), kept, strict=True)
            )
        else:
            blocks = ((x, z) for _, x, _, _, _, z in self._blocks(stacked, bias, folds, factor))
        for x, z in blocks:
            grad_v += transposed_product(z.view(len(x), n_folds * k), x)
            grad_b += z.sum(0)
        return risk, grad_v, grad_b

    def _row_blocks(self, n_folds):
        """The blocks (start, x, y) of rows that :meth:`_blocks` computes on."""
        rows = block_rows(self.X.shape[1], n_folds * self.n_classes)
        for start in range(0, len(self.X), rows):
            yield start, self.X[start : start + rows], self.y[start : start + rows]

    def parameters(self, coef: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`coefficients`: params (B, P) from coef (B, K, d), with the
        intercept as a last column when there is one (K rows, one if pinned)."""
        k, d = self.rows, self.X.shape[1]
        weight = coef[:, :, :d]
        parts = [weight.reshape(len(coef), k * d)]
        if self.fit_intercept:
            bias = coef[:, :, d] + torch.einsum("bkd,bd->bk", weight, self.center)
            parts.append(bias / self._scale())
        return torch.cat(parts, dim=1)

    def coefficients(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """coef (B, K, d) and intercept (B, K) in the original coordinates (None without);
        one row for a pinned head, scikit-learn's binary coef_ and intercept_."""
        k, d = self.rows, self.X.shape[1]
        weight = params[:, : k * d].view(-1, k, d)
        if not self.fit_intercept:
            return weight, None
        bias = params[:, k * d :] * self._scale()
        return weight, bias - torch.einsum("bkd,bd->bk", weight, self.center)


@dataclass
class BatchResult:
    n_iter: np.ndarray  # (B,)
    stop: list  # per fold: "tol", "max_iter", "max_eval" or "stalled", as fit_lbfgs
    largest_gradient: np.ndarray  # (B,)
    n_eval: np.ndarray | None = None  # (B,): evaluations


@dataclass
class Memory:
    """The folds' L-BFGS pairs, kept from one value of C to the next.

    The penalty ½‖W‖²/(C·S) is quadratic, so a pair (s, y) recorded at C is exact at C'
    once y gains (1/C' − 1/C)/S · s on W's entries: the loss's curvature the pairs hold is
    the same function at every C. A path that carries its memory therefore starts each C
    with the curvature of the last instead of a gradient step. A cosine head has no
    penalty; its pairs, kept in the coordinates of its rows at unit norm (:meth:`rescale`),
    only approximate the curvature at another scale.
    """

    s: torch.Tensor  # (B, history, P)
    y: torch.Tensor  # (B, history, P)
    rho: torch.Tensor  # (B, history): 1 / sᵀy, 0 marks an empty or rejected pair
    h0: torch.Tensor  # (B,): the initial inverse Hessian's scale, sᵀy / yᵀy
    # (B, history): when each pair was formed (the solver's iteration count), −1 if none.
    # Folds that stop early leave their slots as they were while the others write theirs:
    # :meth:`compact` puts each fold's pairs back in the order they were formed.
    stamp: torch.Tensor
    reg: torch.Tensor | None = None  # (B,): 1/(C·S) the pairs were recorded at
    slot: int = 0  # the next slot of the ring
    used: int = 0  # how many of the slots before it can hold a pair (newest first)
    clock: int = 0  # iterations run, the next pair's stamp
    # Where the last solve ended, with its objective and gradient there: a solve that
    # starts from the same point corrects them for its penalty instead of evaluating.
    point: torch.Tensor | None = None
    value: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    solved_at: float | None = None  # the value (C or scale) of that objective

    @classmethod
    def empty(cls, params: torch.Tensor, history: int) -> Memory:
        n_folds, n_params = params.shape
        pairs = params.new_zeros(n_folds, history, n_params)
        rho, h0 = params.new_zeros(n_folds, history), params.new_ones(n_folds)
        stamp = torch.full((n_folds, history), -1, dtype=torch.long, device=params.device)
        return cls(pairs, pairs.clone(), rho, h0, stamp)

    def scale_tail(self, start: int, factor: torch.Tensor) -> None:
        """Take the parameters from ``start`` on to ``factor`` (B,) times themselves (an
        intercept to another scale): the last point gains the factor there and its
        gradient loses it, and the folds whose factor is not 1 forget their pairs. Exact
        in those coordinates, the pairs carried the rounding of the intercept's steps in
        the direction that softmax ignores (the same shift of every class's intercept),
        which the corrections for each next C multiplied: on iris in float32, from
        C = 10⁻¹⁵ to 1, a shift of 7.7, where a fit of its own ends with none."""
        if self.point is not None:
            self.point[:, start:] *= factor[:, None]
            self.grad[:, start:] /= factor[:, None]
        self.forget(factor != 1)

    def rescale(self, norms: torch.Tensor) -> None:
        """Take a cosine head's rows W = ρ·W' to W' (``norms`` ρ, (B, K, 1)): an exact
        change of coordinates of the same objective, which ignores the rows' norms, so the
        pairs become s' = s / ρ and y' = ρ·y row by row (sᵀy is unchanged), and the last
        point and gradient likewise."""
        k = norms.shape[1]

        def rows(t):  # (B, ..., K·d) as (B, ..., K, d)
            return t.view(*t.shape[:-1], k, -1)

        rows(self.s).div_(norms[:, None])
        rows(self.y).mul_(norms[:, None])
        if self.point is not None:
            rows(self.point).div_(norms)
            rows(self.grad).mul_(norms)
        self.h0 = self._newest_live_h0(self.h0)

    def _newest_live_h0(self, otherwise: torch.Tensor | float) -> torch.Tensor:
        """h0 = sᵀy / yᵀy of each fold's newest pair in use (a fold that stopped early or
        rejected its last pairs has an older one than the ring's newest slot); ``otherwise``
        for a fold without one."""
        stamp = self._live_stamps()
        newest = stamp.argmax(1)  # (B,)
        folds = torch.arange(len(stamp), device=newest.device)
        s, y = self.s[folds, newest], self.y[folds, newest]  # (B, P)
        sy, yy = (s * y).sum(1), y.square().sum(1)
        fresh = (stamp.amax(1) >= 0) & (yy > 0)
        return torch.where(fresh, sy / yy.where(fresh, 1.0), otherwise)

    def _live_stamps(self) -> torch.Tensor:
        """The stamps of the pairs still in use, −1 where a pair was rejected or dropped
        (ρ = 0: a restart from −g, or a pair that lost its curvature in :meth:`move_to`)."""
        return torch.where(self.rho != 0, self.stamp, -1)

    def forget(self, folds: torch.Tensor) -> None:
        """Drop the pairs of ``folds`` (a boolean mask (B,)): their next iteration is a
        gradient step, as a restarted L-BFGS's."""
        self.rho[folds] = 0
        self.stamp[folds] = -1
        self.h0[folds] = 1

    def compact(self) -> None:
        """Put each fold's pairs in the ring in the order they were formed, its newest in
        the slot before ``slot``, as the two-loop recursion reads them. A fold that stopped
        before the others kept its pairs where they were while theirs went on round the
        ring, out of order for it when it runs again (at the next value of a path)."""
        ring = self.s.shape[1]
        stamp = self._live_stamps()
        oldest_first = stamp.argsort(dim=1, stable=True)  # empty slots (−1) first
        positions = (self.slot - ring + torch.arange(ring, device=stamp.device)) % ring
        source = torch.empty_like(oldest_first)
        source[:, positions] = oldest_first  # the slot each position takes its pair from
        moved = (source != torch.arange(ring, device=source.device)).any(1)
        counts, moved = torch.stack([(stamp >= 0).sum(1), moved]).tolist()  # one sync
        self.used = max(counts)
        self.stamp = stamp
        # Fold by fold, in place: one (history, P) copy at a time, not a second memory.
        for fold in (f for f, out_of_order in enumerate(moved) if out_of_order):
            order = source[fold]
            self.s[fold] = self.s[fold, order]
            self.y[fold] = self.y[fold, order]
            self.rho[fold] = self.rho[fold, order]
            self.stamp[fold] = self.stamp[fold, order]

    def move_to(self, reg: torch.Tensor, n_penalised: int) -> None:
        """Correct the pairs, and the last objective and gradient, from the penalty they
        were recorded at to ``reg`` (B,)."""
        if self.reg is None:
            self.reg = reg
            return
        change = reg - self.reg
        self.reg = reg
        # From or to a penalty beyond the dtype's range (C·S subnormal: 1/(C·S) = inf) the
        # correction is inf − inf or 0·inf: NaN in every pair, which those folds forget.
        lost = ~torch.isfinite(change)  # (B,)
        if bool(lost.any()):
            self.s[lost] = 0
            self.y[lost] = 0
            self.forget(lost)
            change = torch.where(lost, 0.0, change)
        # From a penalty far stronger than the new one (C = 1e-30, then 1) the correction
        # cancels nearly all of y, the gradient and the objective, leaving rounding: a pair
        # or point so cancelled is dropped (its relative error above 1e-3), not trusted.
        exact = 1e3 * torch.finfo(self.y.dtype).eps
        correction = change[:, None, None] * self.s[:, :, :n_penalised]
        self.y[:, :, :n_penalised] += correction
        sound = self.y.norm(dim=2) >= exact * correction.norm(dim=2)  # (B, history)
        if self.point is not None:
            weight = self.point[:, :n_penalised]
            value = 0.5 * change * weight.square().sum(1)
            self.value += value
            self.grad[:, :n_penalised] += change[:, None] * weight
            # (NaN, where the last solve's penalty was out of range, counts as cancelled.)
            cancelled = (
                lost
                | ~(self.value.abs() >= exact * value.abs())
                | ~(self.grad.norm(dim=1) >= exact * (change.abs() * weight.norm(dim=1)))
            )
            if bool(cancelled.any()):  # the next solve evaluates its start afresh
                self.point = self.value = self.grad = None
        sy = (self.s * self.y).sum(2)
        keep = (self.rho != 0) & (sy > 0) & sound
        dropped = ((self.rho != 0) & ~keep).any(1)  # (B,): a fold that lost pairs here
        self.rho = torch.where(keep, 1.0 / sy.where(keep, 1.0), 0)
        newest = (self.slot - 1) % self.s.shape[1]
        yy = self.y[:, newest].square().sum(1)
        fresh = keep[:, newest] & (yy > 0)
        h0 = torch.where(fresh, sy[:, newest] / yy.where(fresh, 1.0), self.h0)
        # A fold that lost pairs takes h0 from its newest pair kept, or 1 as after forget:
        # the old penalty's scale (1/reg at C = 1e-30), kept, made its steps vanish.
        self.h0 = torch.where(dropped, self._newest_live_h0(1.0), h0)


@torch.no_grad()
def lbfgs_batched(
    batch: FoldBatch,
    params: torch.Tensor,
    value: float,
    *,
    max_iter: int | np.ndarray,
    tol: float,
    history: int = 10,
    memory: Memory | None = None,
    max_eval: int | np.ndarray | None = None,
) -> BatchResult:
    """Minimise every fold's objective at ``value`` (C, or a cosine head's scale) from
    ``params`` (B, P), updated in place.

    ``memory`` (a :class:`Memory`, updated in place) carries the pairs of a previous
    solve at another value, and its objective and gradient where it ended: a solve that
    starts there at the same objective (any C: they are corrected for the penalty) needs no
    first evaluation. Without it the memory starts empty, with ``history`` slots (a memory
    keeps its own number).

    Stops a fold as fit_lbfgs does: ``"tol"`` (largest gradient entry at most tol),
    ``"max_iter"`` (``max_iter`` is one number for all folds or one per fold; a fold of
    none does not move), ``"max_eval"`` (``max_eval`` evaluations of that fold, by default
    4·max_iter), or ``"stalled"``
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
    memory.compact()
    memory.move_to(batch.penalty(value), batch.n_penalised)
    s_hist, y_hist, rho, h0, slot = memory.s, memory.y, memory.rho, memory.h0, memory.slot
    history = s_hist.shape[1]
    n_iter = np.zeros(n_folds, dtype=int)
    evals = np.ones(n_folds, dtype=int)
    stop = ["tol"] * n_folds
    everyone = torch.arange(n_folds, device=device)
    same = batch.n_penalised or memory.solved_at == value  # the objective, up to the penalty
    if memory.point is not None and same and torch.equal(memory.point, params):
        objective, grad = memory.value, memory.grad
        evals[:] = 0
    else:
        objective, grad = batch.evaluate(params, everyone, value)
    largest = batch.largest_gradient(params, grad)
    limit = np.broadcast_to(np.asarray(max_iter), (n_folds,))  # each fold's iterations
    budget = np.broadcast_to(np.asarray(4 * limit if max_eval is None else max_eval), (n_folds,))
    active = []
    for f, done in enumerate((largest <= tol).tolist()):
        if not done and limit[f] <= 0:
            stop[f] = "max_iter"
        elif not done:
            active.append(f)
    a = torch.tensor(active, device=device)
    first = True
    while active:
        g = grad[a]
        order = [(slot - 1 - i) % history for i in range(memory.used)]
        if len(active) == n_folds:  # views, not copies of the memory
            direction = _two_loop(s_hist, y_hist, rho, h0, g, order)
        else:
            direction = _two_loop(s_hist[a], y_hist[a], rho[a], h0[a], g, order)
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
        start = params[a]
        folds = np.asarray(active)
        bound = objective[a]
        step, trial_value, trial_grad, accepted = _bracket_search(
            batch, a, folds, value, start, direction, step, slope, bound, evals,
            shorten=unscaled if first else None,
        )  # fmt: skip
        first = False
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
        memory.stamp[a, slot] = torch.where(keep, memory.clock, -1)
        h0[a] = torch.where(keep, sy / (yv * yv).sum(1).where(keep, 1.0), h0[a])
        slot = memory.slot = (slot + 1) % history
        memory.used = min(memory.used + 1, history)
        memory.clock += 1
        params[a] = torch.where(accepted[:, None], start + s, start)
        objective[a] = torch.where(accepted, trial_value, bound)
        grad[a] = torch.where(accepted[:, None], trial_grad, g)
        largest[a] = batch.largest_gradient(params[a], grad[a], a)
        change = (bound - objective[a]).abs() <= _FTOL * torch.maximum(
            torch.maximum(bound.abs(), objective[a].abs()), torch.ones_like(bound)
        )
        # One more synchronisation per iteration: which folds stop.
        met, stalled = torch.stack([largest[a] <= tol, ~accepted | change]).tolist()
        still = []
        for j, fold in enumerate(active):
            n_iter[fold] += 1
            if met[j]:
                stop[fold] = "tol"
            elif n_iter[fold] >= limit[fold]:
                stop[fold] = "max_iter"
            elif evals[fold] >= budget[fold]:
                stop[fold] = "max_eval"
            elif stalled[j]:
                stop[fold] = "stalled"
            else:
                still.append(fold)
        if still != active:
            active = still
            a = torch.tensor(active, device=device)
    memory.point, memory.value, memory.grad = params.clone(), objective, grad
    memory.solved_at = value
    return BatchResult(n_iter, stop, largest.cpu().numpy(), evals)


def _bracket_search(
    batch, a, folds, value, start, direction, step, slope, bound, evals, shorten=None
):
    """The weak Wolfe search of the folds ``a`` (their numbers ``folds``) along
    ``direction`` (A, P) from ``start``, with trial steps ``step`` (A,) first:
    (step, value, gradient, accepted) of each fold, ``evals`` counting the evaluations.

    By bracketing: a step that fails sufficient decrease is too long, one whose slope is
    still steep (below c₂ = 0.9 of the start's, as in torch's strong-Wolfe search) too
    short; only the folds still searching are evaluated again. The last short step
    (``low``) meets sufficient decrease and is kept for a fold whose search runs out; a
    fold without one is not accepted.

    A fold flagged in ``shorten`` (A,) whose search found no step, and whose last trial
    step, the shortest, rose measurably above the start, searches again from that step
    divided by its rise in nats where that is more than 1, as
    :func:`~mr2_probe._solvers._shorter_search` does (one more synchronisation). Along a
    line whose loss rises almost linearly, each trial step halves the last (the
    quadratic's minimum): 25 of them shortened it by 3·10⁷, and digits scaled by 10¹⁵
    needed 10¹² (every fold stalled at its start, the gradient at 6·10¹³).
    """
    trial_value, trial_grad = batch.evaluate(start + step[:, None] * direction, a, value)
    evals[folds] += 1
    low, high = torch.zeros_like(step), torch.full_like(step, float("inf"))
    low_value, low_grad = trial_value.clone(), trial_grad.clone()
    for _ in range(_MAX_LINE_SEARCH):
        long = ~(trial_value <= bound + 1e-4 * step * slope)  # NaN is too long
        trial_slope = (trial_grad * direction).sum(1)
        short = ~long & (trial_slope < 0.9 * slope)
        # A step too long that no longer moves the point in its precision cannot be
        # shortened into a decrease: that fold stops searching (and stalls).
        moved = (start + step[:, None] * direction != start).any(1)
        searching = (long & moved) | short
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
        trial_value[redo], trial_grad[redo] = batch.evaluate(point, a[redo], value)
        evals[folds[redo.cpu().numpy()]] += 1
    failed = ~(trial_value <= bound + 1e-4 * step * slope)
    fallback = failed & (low > 0)
    step = torch.where(fallback, low, step)
    trial_value = torch.where(fallback, low_value, trial_value)
    trial_grad = torch.where(fallback[:, None], low_grad, trial_grad)
    accepted = ~failed | fallback
    if shorten is None:
        return step, trial_value, trial_grad, accepted
    rose = trial_value - bound
    noise = _solvers._ROUNDING * torch.finfo(rose.dtype).eps * bound.abs()
    again = (shorten & ~accepted & (rose > noise)).nonzero().squeeze(1)
    if len(again):
        shorter = step[again] * (1 / rose[again]).clamp(max=1.0)
        step[again], trial_value[again], trial_grad[again], accepted[again] = _bracket_search(
            batch, a[again], folds[again.cpu().numpy()], value, start[again],
            direction[again], shorter, slope[again], bound[again], evals,
        )  # fmt: skip
    return step, trial_value, trial_grad, accepted


def _two_loop(s, y, rho, h0, g, order) -> torch.Tensor:
    """−H·g by L-BFGS's two-loop recursion over the slots ``order`` (newest first) of the
    pairs s, y (A, history, P) with ρ = 1/sᵀy (A, history) and initial scale h0 (A,);
    empty pairs (ρ = 0) change nothing."""
    q = -g
    alphas = {}
    for i in order:
        alphas[i] = rho[:, i] * torch.linalg.vecdot(s[:, i], q)
        q.addcmul_(alphas[i][:, None], y[:, i], value=-1)
    direction = q.mul_(h0[:, None])
    for i in reversed(order):
        beta = rho[:, i] * torch.linalg.vecdot(y[:, i], direction)
        direction.addcmul_((alphas[i] - beta)[:, None], s[:, i])
    return direction


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
    """One fold's solutions along the path, as :class:`~mr2_probe._path.FoldPath` keeps them
    (a value fails here where its penalty overflows, :meth:`BatchedPath._fail`; an overflow
    of the fit itself raises for all folds)."""

    steps: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)


@dataclass
class HeldOut:
    """A fold's held-out rows on the device, their label indices, their scorer's metadata
    (its weights among them) and their sample weights (for the class accuracies).

    ``X`` is either the rows (a copy of in-memory data) or, for an HDF5 store, a callable
    that reads them a block at a time, ``(where, x)`` pairs as
    :meth:`~mr2_probe._data.FitData.row_blocks` yields them: read again at each value,
    never held whole (their norms, n values, are kept as in memory)."""

    X: torch.Tensor | Callable
    y_index: np.ndarray
    score_params: dict
    accuracy_weight: np.ndarray | None
    row_scale: torch.Tensor | None = None  # 1/‖x‖ of X's rows (n,), once a cosine head needs it

    def logits(self, coef: torch.Tensor, intercept: torch.Tensor | None, cosine: bool):
        """The held-out logits of a fold's solution (coef_ rows, V for a cosine head)."""
        if callable(self.X):
            z = coef.new_empty((len(self.y_index), coef.shape[0]))  # (n, K)
            # The norms are measured at the first value and kept for the others.
            measure, scales = cosine and self.row_scale is None, self.row_scale
            for where, x in self.X():
                where = torch.as_tensor(where, device=z.device)
                scale = None
                if measure:
                    scale = inverse_row_norms(x)
                    if scales is None:
                        scales = scale.new_empty(len(self.y_index))
                    scales[where] = scale
                elif cosine:
                    scale = scales[where]
                z[where] = _logits(x, coef, intercept, scale)
            if measure:
                self.row_scale = scales
            return z
        if cosine and self.row_scale is None:
            self.row_scale = inverse_row_norms(self.X)
        return _logits(self.X, coef, intercept, self.row_scale if cosine else None)


def _logits(x, coef, intercept, row_scale):
    """The logits x·coefᵀ (n, K), scaled by ``row_scale`` (n,) and shifted by
    ``intercept`` (K,) where given."""
    z = x @ coef.T
    if row_scale is not None:
        z *= row_scale[:, None]
    if intercept is not None:
        z += intercept
    return z


def _inverse_norms(X) -> torch.Tensor:
    """1/‖x‖ (N,) of X's rows: a tensor's, or those of the rows of an HDF5 store
    (:class:`~mr2_probe._data.StoredRows`), read in runs, never held whole."""
    if isinstance(X, torch.Tensor):
        return inverse_row_norms(X)
    return torch.cat([inverse_row_norms(X[i : i + NORM_ROWS]) for i in range(0, len(X), NORM_ROWS)])


@dataclass
class BatchedPath:
    """Some folds' paths solved together: one :class:`FoldBatch` and one parameter block.

    ``held_out`` has one :class:`HeldOut` per fold of the batch, and ``paths`` one
    :class:`FoldSteps`. The L-BFGS memory is carried from each value to the next
    (:class:`Memory`), so each starts from the last solution with the curvature measured
    so far: for C, its first step is a quasi-Newton step for the change of penalty. A
    cosine head's scales carry it while the next is within ``_CARRY_SCALE_RATIO`` of the
    last scale that formed pairs (they approximate the curvature at another scale, and
    less well the further it is; older pairs from further scales can remain among them),
    and its rows are rescaled to unit norm after each scale, the pairs with them.

    ``start`` (B, P) is where the first value starts (zeros when None: a cosine head starts
    at its class prototypes). ``rows``, when given, makes the batch's X and y on demand (a
    fold's own training rows, a copy): they are held only while :meth:`run` solves, so that
    folds solved one after another never hold more than one copy between them.
    """

    batch: FoldBatch
    held_out: list
    rows: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    start: torch.Tensor | None = None
    paths: list = field(init=False)
    params: torch.Tensor = field(init=False)
    memory: Memory = field(init=False)
    _last: float | None = field(init=False, default=None)  # the value solved last
    _formed_at: float | None = field(init=False, default=None)  # a cosine memory's scale
    # A two-class cosine head's solutions as its two rows (its steps keep their difference).
    _rows: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.paths = [FoldSteps() for _ in self.held_out]
        X = self.batch.X
        shape = (self.batch.n_folds, self.batch.n_params)
        self.params = torch.zeros(shape, dtype=X.dtype, device=X.device)
        if self.start is not None:
            self.params.copy_(self.start)
            self.start = None
        most = _COSINE_HISTORY if self.batch.cosine else _HISTORY
        pairs = _HISTORY_ELEMENTS // (2 * self.params.numel())
        self.memory = Memory.empty(self.params, int(min(most, max(10, pairs))))
        if self.rows is not None:
            self._release()

    def _release(self) -> None:
        """Drop X and y, keeping their number of features, dtype and device."""
        X = self.batch.X
        empty = torch.empty((0, X.shape[1]), dtype=X.dtype, device=X.device)
        self.batch.set_rows(empty, self.batch.y.new_empty((0,)))

    def run(self, values, score, progress, *, max_iter, tol, report) -> None:
        """Solve at ``values`` in increasing order, each from the solution of the nearest
        value solved so far (in log value) and the memory, score every fold's held-out
        rows, and pass each fold's solver outcome to ``report(value, weight_sum, n_iter,
        stop, largest_gradient)``. Along a grid the nearest is the last; a bisection's midpoint
        starts from its neighbour, not from the far end of the grid where the path last
        was."""
        if self.rows is not None:
            self.batch.set_rows(*self.rows())
        try:
            work, small = self.batch.evaluation_work, _solvers.SMALL_EVALUATION
            with one_thread_if_small(self.params.device, work, small):
                self._run(values, score, progress, max_iter, tol, report)
        finally:
            if self.rows is not None:
                self._release()

    def _run(self, values, score, progress, max_iter, tol, report) -> None:
        cosine = self.batch.cosine
        for value in sorted(values):
            value = float(value)
            self._start_nearest(value)
            failed = self._out_of_range(value)
            if failed.all():
                self._fail(value, failed, progress)
                continue
            if cosine:
                self._carry_or_forget(value)
            factor = self.batch.take_intercept_scale(value)
            if factor is not None:  # the same point, the intercept in another scale
                self.params[:, self.batch.n_penalised :] *= factor[:, None]
                self.memory.scale_tail(self.batch.n_penalised, factor)
            if cosine and self.batch.n_classes == 2:
                # At small scales the best rows are opposite, a point that larger scales
                # never left from there (open_pair): those folds start opened, afresh.
                rows = self.params.view(self.batch.n_folds, 2, -1)
                opened_rows, opened = open_pair(rows)
                rows.copy_(opened_rows)
                self.memory.forget(opened)
            result = self._solve(value, max_iter, tol)
            if not bool(torch.isfinite(self.params).all()):
                what = "the fit produced non-finite coefficients"
                raise ValueError(_overflow_message(what, self.params.dtype))
            if cosine:
                self._unit_rows()
                if self._formed_at is None or result.n_iter.any():
                    # A scale that made no iteration leaves its pairs' scale as it was, so
                    # that a chain of such starts cannot move them.
                    self._formed_at = value
            coef, intercept = self._coefficients(value)
            for f, held_out in enumerate(self.held_out):
                if failed[f]:
                    continue
                z = held_out.logits(coef[f], None if intercept is None else intercept[f], cosine)
                if self.batch.pinned:  # the first class's logit, pinned at zero
                    z = torch.cat([torch.zeros_like(z), z], 1)
                bias = None if intercept is None else intercept[f].cpu().numpy()
                exported = coef[f]
                if cosine and self.batch.n_classes == 2:
                    # scikit-learn's binary convention, as the head exports it: one row.
                    exported = coef[f, 1:] - coef[f, :1]
                self.paths[f].steps[value] = Step.scored(
                    z.cpu().numpy(), exported.cpu().numpy(), bias, result.n_iter[f],
                    held_out.y_index, held_out.score_params, score, held_out.accuracy_weight,
                )  # fmt: skip
                report(
                    value,
                    float(self.batch.weight_sum[f]),
                    int(result.n_iter[f]),
                    result.stop[f],
                    float(result.largest_gradient[f]),
                )
                progress.update(1)
            self._fail(value, failed, progress)
            if cosine and self.batch.n_classes == 2:
                self._rows[value] = self.params.clone()
            self._last = value

    def _out_of_range(self, value: float) -> np.ndarray:
        """(B,) the folds whose penalty 1/(C·Σw) overflows X's dtype at C = ``value`` (C·Σw
        subnormal, C = 1e-320 say): their objective is NaN from the start, and they fail
        there as a fold's own fit does (FitDivergedError), instead of scoring a fit that
        could not move (chance). So do those where its square overflows float64 (C = 1e-300
        on iris): a fold's own fit fails there too, its line search's interpolation squaring
        slopes of that size (NaN coefficients). That square is taken in float64 for float32
        data too, as a float32 fit's L-BFGS computes in float64: float32's C = 1e-30 on iris,
        whose square overflowed float32, failed every fold where its own fit stops at its
        start, as in float64 (a ConvergenceWarning). Where a fold's own fit starts to fail
        depends on its data's gradient: just below that square's overflow (float64's
        C = 6e-157 on iris's folds of 100 rows) the search fails a C that its own fit stops
        at chance, which no search would choose anyway."""
        if self.batch.cosine:  # no penalty; a scale the dtype rounds to 0 (_scale_underflow)
            tiny = torch.finfo(self.batch.X.dtype).tiny
            return np.full(self.batch.n_folds, value < tiny)
        penalty = self.batch.penalty(value, dtype=torch.float64).cpu()  # (B,)
        in_range = torch.isfinite(penalty.to(self.batch.X.dtype)) & torch.isfinite(penalty**2)
        return (~in_range).numpy()

    def _fail(self, value: float, failed: np.ndarray, progress) -> None:
        """Record ``value`` as failed on the folds ``failed`` (B,), as
        :meth:`~mr2_probe._path.FoldPath._fail` records a fold's failed fit."""
        if not failed.any():
            return
        coef, intercept = self._coefficients(value)  # (for the shapes alone)
        shape = (coef.shape[1], coef.shape[2] + (intercept is not None))
        dtype = torch.empty(0, dtype=coef.dtype, device="cpu").numpy().dtype
        # (n_classes counts both classes of a pinned head: one row, two class accuracies)
        n_classes, what = self.batch.n_classes, "the penalty 1/(C·Σw) or its square overflows"
        for f in np.flatnonzero(failed):
            suspects = _range_suspects(value, None, float(self.batch.weight_sum[f]))
            error = FitDivergedError(_overflow_message(what, self.params.dtype, suspects))
            if self.batch.cosine:
                error = _scale_underflow(value, self.params.dtype)
            self.paths[f].failures[value] = error
            self.paths[f].steps[value] = Step.failed(shape, dtype, n_classes)
            progress.update(1)

    def _coefficients(self, value: float):
        """Every fold's coef (B, K, d) and intercept (B, K) or None at the solution of
        ``value``: for a cosine head, V = s·W (its rows are at unit norm then)."""
        if self.batch.cosine:
            return value * self.params.view(self.batch.n_folds, self.batch.n_classes, -1), None
        return self.batch.coefficients(self.params)

    def _solve(self, value: float, max_iter: int, tol: float) -> BatchResult:
        """Solve every fold at ``value``. A cosine fold that stalls after some progress
        restarts once, its rows rescaled to unit norm and without pairs, as the rounds of
        a single fit do (fit_lbfgs), within its remaining iterations and evaluations (4 per
        iteration of ``max_iter``, counted over the rounds): in float32 at large
        scales L-BFGS can stall on rounding where a fresh start goes on to ``tol``."""
        result = lbfgs_batched(
            self.batch, self.params, value, max_iter=max_iter, tol=tol, memory=self.memory
        )
        n_iter, n_eval, last = result.n_iter.copy(), result.n_eval.copy(), result.n_iter
        for _ in range(_COSINE_RESTARTS if self.batch.cosine else 0):
            stalled = np.array([stop == "stalled" for stop in result.stop])
            again = stalled & (last > 1) & (n_iter < max_iter) & (n_eval < 4 * max_iter)
            if not again.any():
                break
            self._unit_rows()
            self.memory.forget(torch.as_tensor(again, device=self.params.device))
            round_ = lbfgs_batched(
                self.batch, self.params, value, tol=tol, memory=self.memory,
                max_iter=np.where(again, max_iter - n_iter, 0),
                max_eval=np.where(again, 4 * max_iter - n_eval, 0),
            )  # fmt: skip
            last = np.where(again, round_.n_iter, 0)
            n_iter = n_iter + last
            n_eval = n_eval + np.where(again, round_.n_eval, 0)
            stop = [
                new if a else old
                for a, new, old in zip(again, round_.stop, result.stop, strict=True)
            ]
            largest = np.where(again, round_.largest_gradient, result.largest_gradient)
            result = BatchResult(n_iter, stop, largest, n_eval)
        return result

    @torch.no_grad()
    def _unit_rows(self) -> None:
        """Rescale a cosine head's rows to unit norm, the memory with them."""
        norms = self.batch.direction_norms(self.params)  # (B, K, 1)
        self.params.view(norms.shape[0], self.batch.n_classes, -1).div_(norms)
        self.memory.rescale(norms)

    def _carry_or_forget(self, value: float) -> None:
        """A cosine head keeps its memory for a scale within ``_CARRY_SCALE_RATIO`` of the
        last scale that formed pairs, and starts with none further away."""
        near = self._formed_at is not None and (
            1 / _CARRY_SCALE_RATIO <= value / self._formed_at <= _CARRY_SCALE_RATIO
        )
        if not near:
            self.memory = Memory.empty(self.params, self.memory.s.shape[1])
            self._formed_at = None

    @torch.no_grad()
    def _start_nearest(self, value: float) -> None:
        solved = [v for v in self.paths[0].steps if not any(v in p.failures for p in self.paths)]
        if not solved:
            return

        def distance(v):  # in log value; C = inf (no penalty) is far from every finite C
            return abs(np.log(v / value)) if np.isfinite(v) and np.isfinite(value) else np.inf

        nearest = min(solved, key=lambda v: (distance(v), v != self._last))
        if nearest == self._last:
            return
        if nearest in self._rows:
            self.params.copy_(self._rows[nearest])
            return
        coef = np.stack([path.steps[nearest].coef for path in self.paths])  # (B, K, dof)
        coef = torch.as_tensor(coef, dtype=self.params.dtype, device=self.params.device)
        if self.batch.cosine:  # V = s·W: its directions are the rows'
            self.params.copy_(torch.nn.functional.normalize(coef, dim=2).flatten(1))
            return
        self.params.copy_(self.batch.parameters(coef))
