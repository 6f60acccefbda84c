"""L-BFGS on the product of unit spheres: the plain cosine head's full-batch solver.

The cosine head's objective depends on each row of W only through its direction u_k, so the
solver works on the rows U at unit norm (one sphere per class): the tangent gradient,
steps retracted by normalising the rows, L-BFGS pairs projected onto the current point's
tangent space, and one initial inverse Hessian per class (each class's block of the latest
pair), which suits a problem whose classes are penalised by very different multipliers
(docs/speed.md).

Each step is searched along the retraction U + t·D without reading X again. With the kept
products C = r·U·Xᵀ and M = r·D·Xᵀ (r_i = 1/‖x_i‖; class-major, K × n, so that the
line's sums over the classes run along n), the cosines at step t are
(C + t·M) / √(1 + t²‖d_k‖²), D being tangent, so the objective and its first two
derivatives in t cost a few passes over K × n numbers: bracketed Newton steps on the slope
until it is a tenth of its value at 0, with a sufficient decrease. An iteration thus reads X
twice, as one evaluation of the gradient does: the product X·Dᵀ, then the gradient at the
new point (from the softmax of the step's evaluation). The two-loop recursion is the compact
form of Byrd, Nocedal and Schnabel (1994): a few products with the stored pairs and two
triangular solves, no loop over the pairs.

The fit stops on the test on ``tol`` (the largest entry of the gradient in U), at
``max_iter``, or stalled: no step decreases the objective even without the pairs, or
_FLAT iterations in a row lower it by less than the dtype's precision (rounding alone;
float64: 64 epsilons of max(1, |f|), scikit-learn's ftol; float32: an epsilon of |f|, or of
the rounding of a mean over the rows where that is larger). Each stop is decided on the
cosines, objective and gradient recomputed from X (the kept ones drift in rounding), two
reads of X each time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._device import rows_product, tangent_rows, transposed_product

# Products C and M kept (n_samples × n_classes elements each) when they fit in this many:
# with the line's and the gradient's arrays of that size, about nine (at 2**24 the peak
# memory grew by 620 MB in float32 and 1.1 GB in float64 over the rounds').
KEEP_PRODUCTS = 2**22
# An iteration here costs more than one of the rounds of torch's L-BFGS (a line search over
# the n × K products, a memory in compact form), so the spheres run where reading X
# dominates it, at least this many entries of X (fmnist features, 1,280 of them, scales 64
# and 256: 20,000 rows took 10% to 30% less time than the rounds, 5,000 rows 14% less to
# 13% more, 500 rows up to 1.7 times more; docs/speed.md)...
MIN_ENTRIES = 2**24
# ...with this many features per class at least: the line's cost grows with n × K, the
# reads with n × d (synthetic, scales 64 and 256: d = K = 128, 3.6 times the rounds'
# time; d / K = 8 and 10, 1.1 to 3.8 times; 32, 1.23 and 0.97 times; 64, 1.12 and 0.93
# times; fmnist's 128, 0.7 to 0.9 times)...
MIN_FEATURES_PER_CLASS = 64
# ...and where the logits stay smooth: with scale / min γ beyond this the loss is nearly
# piecewise linear, and a line search along the retraction makes little progress (digits
# at scale 10¹²: still 4e7 after 2,000 iterations, where the rounds reach 0 in 22; at 10⁵,
# 132 iterations against 24; at 512, s / min γ = 518, 46 against 40; features with a
# common mean component at 700 and 1,000: an objective 0.8 to 3.4e-3 (relative) above the
# rounds', 96% to 98% of the predictions alike, where at 256 and 512 the spheres' was lower).
MAX_SHARPNESS = 512.0
# Columns (rows of X) of C and M per block of a line evaluation (bounds its temporaries).
_LINE_BLOCK = 2**22
# The kept cosines C are recomputed from X every this many iterations (rounding drift).
_REFRESH = 50
# Newton steps on the slope along the line, at most; they stop once the slope is within
# this fraction of the slope at t = 0 (a strong Wolfe test with c₂ = 0.1), or once t
# changes by less than _LINE_RTOL of itself.
_LINE_STEPS = 30
_LINE_SLOPE = 0.1
_LINE_RTOL = 1e-6
# Halvings of a step without a sufficient decrease, at most (2⁻⁶⁰ of the first).
_BACKTRACKS = 60
# Iterations in a row that do not lower the best objective by more than the dtype's
# relative precision (float64: scipy's ftol as scikit-learn sets it, 64 epsilons, as
# fit_lbfgs), after which the fit has stalled on rounding.
_FLAT = 5
_TOLERANCE_CHANGE = 64 * torch.finfo(torch.float64).eps
# The sufficient decrease a step must give (Armijo's c₁, as torch's strong Wolfe search).
_ARMIJO = 1e-4


class _Line:
    """The objective along the retraction of U + t·D, from the kept products C and M
    (class-major, K × n: sums over the classes along columns, a few times faster on a CPU
    than over rows of K numbers).

    With a_i = s / γ_{y_i} and q_k = √(1 + t²‖d_k‖²), the logits are
    z = a·(C + t·M) / q; they and their first two derivatives in t are combinations of
    a·C and a·M with per-class coefficients. The softmax of the last evaluation is kept
    (``p``) for the gradient at the step chosen.
    """

    def __init__(self, C, M, direction_norms, factor_rows, y, weighted_onehot, risk):
        self.C, self.M, self.nd = C, M, direction_norms.double()
        self.y, self.risk = y[None, :], risk
        self.Yw = weighted_onehot  # w_i at (i, y_i), (n, K), float64
        self.Ca, self.Ma = C * factor_rows, M * factor_rows
        # Σ_{i∈k} w_i·a_i·C_ki and ·M_ki: the true class's terms of z' and z'', by class.
        self.w = weights = weighted_onehot.gather(1, y[:, None])[:, 0]  # w_i (n,), float64
        true = torch.cat([self.Ca.gather(0, self.y), self.Ma.gather(0, self.y)])
        self.true = self.Yw.new_zeros(2, C.shape[0]).index_add_(1, y, true.double() * weights)
        self.p = torch.empty_like(C)
        self.block = max(1, _LINE_BLOCK // C.shape[0])
        self.floor = math.log(torch.finfo(C.dtype).tiny) + 1  # exp(floor) is e·tiny

    def __call__(self, t: float):
        """(value, slope, curvature, class factor) of the objective at step t."""
        nd, q2 = self.nd, 1 + t * t * self.nd  # ‖u_k + t·d_k‖²
        inv_q = q2.rsqrt()
        inv_q3 = inv_q / q2
        e0, f0 = inv_q, t * inv_q  # z = e0·aC + f0·aM
        e1, f1 = -t * nd * inv_q3, inv_q3  # ∂z/∂t
        e2, f2 = -nd * (1 - 2 * t * t * nd) * inv_q3 / q2, -3 * t * nd * inv_q3 / q2  # ∂²z/∂t²
        # By class: Σ w·ℓ, and Σ w·(Σ_k p_k z_k'), Σ w·(Σ_k p_k z_k'² − (Σ_k p_k z_k')²
        # + Σ_k p_k z_k'') less the true class's z' and z'' (linear in the class sums).
        # Accumulated in float64; the loss is taken row by row, where it is small.
        sums = torch.zeros_like(self.true[:1]).expand(3, -1).clone()
        sums[1:] -= torch.stack([e1, e2]) * self.true[0] + torch.stack([f1, f2]) * self.true[1]
        dtype = self.C.dtype
        e0, f0, e1, f1, e2, f2 = (v.to(dtype)[:, None] for v in (e0, f0, e1, f1, e2, f2))
        for start in range(0, self.C.shape[1], self.block):
            rows = slice(start, start + self.block)
            Ca, Ma, p = self.Ca[:, rows], self.Ma[:, rows], self.p[:, rows]
            torch.mul(Ca, e0, out=p).add_(Ma * f0)  # z
            top = p.amax(0, keepdim=True)
            loss = top - p.gather(0, self.y[:, rows])  # z_max − z_y, then + log Σ exp(z − z_max)
            # exp of at least e·(the dtype's smallest normal number): subnormal results,
            # which the softmax of a large scale is full of, are many times slower on a CPU.
            p.sub_(top).clamp_min_(self.floor).exp_()
            total = p.sum(0, keepdim=True)
            p.div_(total)  # softmax
            loss += total.log()
            dz = torch.addcmul(Ca * e1, Ma, f1)  # ∂z/∂t
            pdz_k = p * dz
            pdz, pdz2 = pdz_k.sum(0), (pdz_k * dz).sum(0)  # Σ_k p_k z_k', Σ_k p_k z_k'²
            pd2z = (torch.addcmul(Ca * e2, Ma, f2).mul_(p)).sum(0)  # Σ_k p_k z_k''
            parts = torch.stack([loss[0], pdz, pdz2 - pdz * pdz + pd2z])
            parts = parts.double().mul_(self.w[rows])  # by class (faster than parts @ Yw)
            sums.scatter_add_(1, self.y[:, rows].expand(3, -1), parts)
        risk = self.risk
        value, factor = risk.risk(risk.class_loss(sums[0]))
        along = sums[1:] @ factor
        if risk.tilt > 0:  # R_t's own curvature in L: t·(Σ q_k·L_k'² − (Σ q_k·L_k')²)
            q, slopes = factor * risk.class_weight, risk.class_loss(sums[1])
            along[1] += risk.tilt * (q @ (slopes * slopes) - (q @ slopes) ** 2)
        slope, curvature = along.tolist()
        return float(value), slope, curvature, factor

    def minimise(self, first: float, slope0: float, value0: float):
        """A step that (nearly) minimises the objective along the line: from ``first``, while
        the slope stays negative and the decrease sufficient, Newton's step or twice the step,
        whichever is shorter, then Newton's steps within the bracket (else its midpoint),
        until the slope is within _LINE_SLOPE of ``slope0`` at a sufficient decrease from
        ``value0``. A step whose value is above that (the far plateau of a large scale, where
        the slope vanishes too) bounds the bracket from above. Returns (t, value, class
        factor at t); the last evaluation is at t."""
        # value0 is the previous line's: its rounding differs from this line's by a few
        # epsilons (the caller's test of the decrease takes this line's own value at 0).
        slack = 16 * torch.finfo(self.C.dtype).eps * max(1.0, abs(value0))

        def sufficient(t, value):
            return value <= value0 + _ARMIJO * t * slope0 + slack

        lo, t, grown = 0.0, first, 0
        value, slope, curvature, factor = self(t)
        while slope < 0 and t < 1e12 and abs(slope) > _LINE_SLOPE * abs(slope0):
            if not sufficient(t, value):
                break
            # Newton's step where it is short of doubling: one evaluation where doubling and
            # the Newton step back into the bracket took two (fmnist features, scale 256: 2.4
            # evaluations per line instead of 2.9). Doubling alone after _LINE_STEPS of them,
            # and where Newton's step does not move t (below its rounding, or an infinite
            # curvature: the same t evaluated again) or is NaN (an infinite slope).
            newton = t - slope / curvature if curvature > 0 and grown < _LINE_STEPS else math.nan
            lo, t, grown = t, newton if t < newton < 2 * t else 2 * t, grown + 1
            value, slope, curvature, factor = self(t)
        hi = t
        for _ in range(_LINE_STEPS):
            enough = sufficient(t, value)
            if enough and abs(slope) <= _LINE_SLOPE * abs(slope0):
                break
            newton = t - slope / curvature if enough and curvature > 0 else float("nan")
            trial = newton if lo < newton < hi else (lo + hi) / 2
            converged = abs(trial - t) <= _LINE_RTOL * trial
            t = trial
            value, slope, curvature, factor = self(t)
            lo, hi = (t, hi) if slope < 0 and sufficient(t, value) else (lo, t)
            if converged:
                break
        return t, value, factor


class _Memory:
    """L-BFGS pairs (s, y) on the spheres, projected onto the tangent space of each new
    point (the projections compose: a pair keeps no component along any row it passed),
    their Gram matrices updated with them; the inverse Hessian applied in compact form
    with one initial scale per class."""

    def __init__(self, shape, history, like):
        K, d = shape
        self.S = like.new_zeros(history, K, d)  # slot-major: a pair is one contiguous slot
        self.Y = like.new_zeros(history, K, d)
        self.SY = torch.zeros(history, history, dtype=torch.float64, device=like.device)
        self.YY = torch.zeros(K, history, history, dtype=torch.float64, device=like.device)
        self.history, self.order = history, []  # slots, oldest first
        self.gamma = None  # the initial inverse Hessian's scale, per class (K,)

    def clear(self):
        self.order = []
        self.gamma = None

    def _stored(self):
        m = len(self.order)
        return m, self.S[:m], self.Y[:m]

    def apply(self, U: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """−H·g at U (−g without pairs); g and the pairs tangent at U."""
        if not self.order:
            return -g
        m, S, Y = self._stored()
        Sf, Yf = S.reshape(m, -1), Y.reshape(m, -1)
        scale = self.gamma[:, None]
        a = (Sf @ g.reshape(-1)).double()  # Sᵀg (m,)
        b = (Yf @ (scale * g).reshape(-1)).double()  # Yᵀ·H0·g
        YHY = torch.einsum("k,kij->ij", self.gamma.double(), self.YY[:, :m, :m])
        idx = torch.as_tensor(self.order, device=U.device)
        SY, YHY, a, b = self.SY[:m, :m][idx][:, idx], YHY[idx][:, idx], a[idx], b[idx]
        R = SY.triu()
        v = torch.linalg.solve_triangular(R, a[:, None], upper=True)
        rhs = SY.diagonal()[:, None] * v + YHY @ v - b[:, None]
        p = torch.linalg.solve_triangular(R.T, rhs, upper=False)
        p_slot, v_slot = torch.zeros_like(a), torch.zeros_like(a)
        p_slot[idx], v_slot[idx] = p[:, 0], v[:, 0]
        Hg = scale * g + (p_slot.to(U.dtype) @ Sf).reshape(U.shape)
        Hg -= scale * (v_slot.to(U.dtype) @ Yf).reshape(U.shape)
        return -tangent_rows(U, Hg)

    def project(self, U: torch.Tensor) -> None:
        """Project the stored pairs onto the tangent space at U, and their Grams with them."""
        m, S, Y = self._stored()
        if not m:
            return
        A, B = (S * U).sum(-1), (Y * U).sum(-1)  # components along U (m, K)
        S.addcmul_(A[..., None], U, value=-1)
        Y.addcmul_(B[..., None], U, value=-1)
        A, B = A.double(), B.double()
        self.SY[:m, :m] -= A @ B.T
        self.YY[:, :m, :m] -= B.T[:, :, None] * B.T[:, None, :]

    def add(self, s: torch.Tensor, y: torch.Tensor) -> bool:
        """Store the pair if its curvature sᵀy is positive; the per-class scales become its
        blocks' sᵀy / yᵀy (the whole pair's where a block's is not positive)."""
        sy_k, yy_k = (s * y).sum(1), (y * y).sum(1)
        sy, yy = float(sy_k.sum()), float(yy_k.sum())
        if not sy > 1e-10 * yy:
            return False
        whole = sy / yy
        ok = (sy_k > 0) & (yy_k > 0)
        self.gamma = torch.where(ok, sy_k / yy_k.clamp_min(torch.finfo(y.dtype).tiny), whole)
        if len(self.order) < self.history:
            slot = len(self.order)
        else:
            slot = self.order.pop(0)
        self.order.append(slot)
        self.S[slot], self.Y[slot] = s, y
        m, S, Y = self._stored()
        Sy = (S * y).sum(-1).double()  # (m, K)
        Ys = (Y.reshape(m, -1) @ s.reshape(-1)).double()
        Yy = (Y * y).sum(-1).double()
        self.SY[:m, slot], self.SY[slot, :m] = Sy.sum(1), Ys
        self.YY[:, :m, slot], self.YY[:, slot, :m] = Yy.T, Yy.T
        return True


def runs_on_spheres(source, n_features: int, n_classes: int, scale: float, margins) -> bool:
    """Whether a plain cosine fit takes :func:`sphere_lbfgs` (else the rounds of torch's
    L-BFGS): products that fit, enough entries of X and features per class, logits smooth
    enough, on a CPU.

    Only the CPU has measured them: on a GPU, where reading X is cheap and each line
    evaluation waits on the host, the rounds run until ``benchmarks/gpu_check.sh``
    (bench_cosine.py --spheres) shows the spheres faster there (and MPS has no float64,
    which the line's sums and the memory's Grams take)."""
    if source.y.device.type != "cpu":
        return False
    n = source.n_samples
    if n * n_classes > KEEP_PRODUCTS or n * n_features < MIN_ENTRIES:
        return False
    if n_features < MIN_FEATURES_PER_CLASS * n_classes:
        return False
    return scale <= MAX_SHARPNESS * float(margins.min())


def sphere_lbfgs(head, source, margins, risk, *, blocks, history, max_iter, tol, bar):
    """Fit a plain cosine head's rows by L-BFGS on the unit spheres (see the module).

    ``risk`` is the fit's :class:`~mr2_probe._solvers.ClassRisk` (tilted or not);
    ``blocks()`` iterates over the source's blocks (x, y, w, r), r = 1/‖x‖ (those of
    :func:`~mr2_probe._solvers.closed_form_chunks`). Leaves
    ``head.weight`` at unit rows and returns (iterations, why it stopped, the largest
    entry of the last gradient, the objective at each iteration).
    """
    # The objective is invariant to the weights' scale: taken relative to the largest, so
    # that weights near the dtype's smallest normal number keep their precision.
    y, w = source.y, source.w / source.w.max()
    w64 = w.double()
    risk = type(risk)(w64.new_zeros(len(risk.class_weight)).index_add_(0, y, w64), risk.tilt)
    factor_rows = float(head.scale) / margins[y]  # z_ik = s·cos_ik / γ_{y_i}
    U = F.normalize(head.weight.detach(), dim=1)

    def products(V):  # r·V·Xᵀ over the chunks, class-major (rows of V, n)
        out = U.new_empty(len(V), len(y))
        start = 0
        for x, _, _, r in blocks():
            torch.mul(rows_product(x, V).T, r, out=out[:, start : start + len(x)])
            start += len(x)
        return out

    def gradient(line, factor):  # the tangent gradient in U at the line's last step (K, d)
        grad = torch.zeros_like(U)
        start = 0
        for x, yb, _, r in blocks():
            rows = slice(start, start + len(x))
            start += len(x)
            p = line.p[:, rows]  # softmax − onehot, times w·f_y·a·r (class-major)
            p.scatter_add_(0, yb[None, :], -torch.ones_like(p[:1]))
            p.mul_(w[rows] * factor.to(x.dtype)[yb] * factor_rows[rows] * r)
            grad += transposed_product(p.T, x)
        return tangent_rows(U, grad)

    onehot = torch.zeros(len(y), len(U), dtype=torch.float64, device=y.device)
    onehot.scatter_(1, y[:, None], w64[:, None])

    def exact():  # the cosines, objective and gradient at U, from X
        C = products(U)
        line = _Line(C, C, C.new_zeros(C.shape[0]), factor_rows, y, onehot, risk)
        value, _, _, factor = line(0.0)
        return C, value, gradient(line, factor)

    # (No row is 0: the start is the prototypes, where a zero one is replaced, or a fit's.)
    C, value, g = exact()
    # The Grams of the per-class scales hold K × history² numbers: no more than the pairs'
    # 2 × history × K × d (in float64, so up to twice their bytes in float32; 2,000
    # classes of 8 features took 610 MB at 200 pairs).
    memory = _Memory(U.shape, min(history, max(10, 2 * U.shape[1])), U)
    curve = [value]
    largest = float(g.abs().max())
    n_iter, stop = 0, "tol"
    best, flat = value, 0
    resolution = max(torch.finfo(C.dtype).eps, _TOLERANCE_CHANGE)
    # A decrease is flat below resolution · max(floor, |best|). float64: scipy's ftol, as
    # the rounds. float32: each row's loss rounds by about an epsilon (log Σ exp, absolute),
    # their weighted mean by about eps / √(effective rows), so the test is relative down to
    # that (an absolute epsilon stopped fits at an objective of 4e-5, "stalled", while it
    # still fell by 3e-4 of itself per iteration).
    floor = 1.0 if C.dtype == torch.float64 else float(w64.square().sum().sqrt() / w64.sum())
    # Whether C, the objective and g come from the kept products (the cosines updated step
    # by step drift in rounding: in float32, with features sharing a large common
    # component, far enough for a gradient hundreds of times tol to pass for one below it).
    # Every stop is decided on them recomputed from X: a test on tol that fails there, or a
    # line that finds a decrease there, and the fit goes on; a stall stands.
    drift, settle = False, None  # settle: a stop to decide from X ("line", "stalled")
    while True:
        if drift and (settle or largest <= tol or n_iter >= max_iter):
            C, value, g = exact()
            largest, drift = float(g.abs().max()), False
            curve[-1] = best = value  # (the same point, its objective from X)
            flat = 0
            if settle == "stalled":
                stop = "stalled" if largest > tol else "tol"
                break
            settle = None
            continue
        if largest <= tol:
            break
        if n_iter >= max_iter:
            stop = "max_iter"
            break
        D = memory.apply(U, g)
        slope = float((g * D).sum())
        if not slope < 0:  # not a descent direction: the memory is dropped
            memory.clear()
            D, slope = -g, -float((g * g).sum())
        refresh = n_iter % _REFRESH == _REFRESH - 1
        both = products(torch.cat([D, U]) if refresh else D)
        M = both[: len(D)]
        if refresh:
            C = both[len(D) :]
        # Without pairs (the first iteration, or the memory dropped or not yet formed) the
        # direction is −g, of any size: the first step moves the rows by at most 1 (ℓ1).
        first = 1.0 if memory.order else min(1.0, 1.0 / float(g.abs().sum()))
        line = _Line(C, M, (D * D).sum(1), factor_rows, y, onehot, risk)
        t, new_value, factor = line.minimise(first, slope, value)
        accepted = new_value <= value + _ARMIJO * t * slope
        if not accepted:  # against this line's own value at 0 (the rounding differs)
            base = line(0.0)[0]
            for _ in range(_BACKTRACKS):  # halving; the last evaluation at t
                new_value, _, _, factor = line(t)
                accepted = new_value <= base + _ARMIJO * t * slope
                if accepted:
                    break
                t /= 2
        if not accepted:
            if memory.order:  # no decrease: start again without the pairs
                memory.clear()
                continue
            if drift:  # ...and from cosines recomputed from X
                settle = "line"
                continue
            stop = "stalled"
            break
        C = (C + t * M) * (1 + t * t * line.nd).rsqrt().to(C.dtype)[:, None]
        drift = True
        U, previous = F.normalize(U + t * D, dim=1), g
        g = gradient(line, factor)
        memory.project(U)
        memory.add(tangent_rows(U, t * D), g - tangent_rows(U, previous))
        value = new_value
        curve.append(value)
        n_iter += 1
        bar.update(1)
        largest = float(g.abs().max())
        if value < best - resolution * max(floor, abs(best)):
            best, flat = value, 0
        else:  # below the objective's rounding: steps that rounding alone accepts
            flat += 1
            if flat >= _FLAT and largest > tol:
                settle = "stalled"  # it stands; whether at tol, from X
    with torch.no_grad():
        head.weight.copy_(U)
    return n_iter, stop, largest, curve
