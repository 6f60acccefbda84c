"""Solvers: full-batch L-BFGS (the convex margin-only problem) and minibatch Adam / SGD.

Both minimise the same per-sample objective

    (1/S) Σ_i w_i CE(z_i / γ_{y_i}, y_i) + λ·mean(ℓ_s̄) + penalty / (C·S),    S = Σ_i w_i,

so that ``c_bar=None, lam=0`` is exactly scikit-learn's multinomial LogisticRegression(C).
With a class tilt t > 0 the data term becomes the tilted class risk
(1/t)·log Σ_k π_k·exp(t·L_k), L_k = Σ_{i∈k} w_i ℓ_i / S_k, π_k = S_k / S (t = 0 gives the
mean above); its gradient is the plain one with sample i weighted by q_{y_i} / S_{y_i},
q = softmax(t·L + log π), instead of 1 / S.
Nothing synchronises with the host inside a minibatch epoch; L-BFGS synchronises once per
function evaluation, which its line search needs anyway.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from dataclasses import dataclass, field

import torch
from torch.optim.lbfgs import _strong_wolfe
from tqdm.auto import tqdm

from ._losses import (
    compactness_term,
    linear_grad_from_logits,
    linear_margin_ce_grad,
    linear_margin_ce_parts,
    margin_cross_entropy,
    tilted_class_risk,
)
from ._sphere import _FLAT, runs_on_spheres, sphere_lbfgs
from ._stats import (
    ClassStats,
    class_margins,
    class_statistics_chunked,
    compactness_tau,
    mean_spread,
    overall_mean,
    penalised_intercept_scale,
    penalty_stiffness,
    weight_divisor,
)


@dataclass
class SolverResult:
    n_iter: int
    converged: bool
    loss_curve: list = field(default_factory=list)
    largest_gradient: float | None = None
    stats: ClassStats | None = None
    margins: torch.Tensor | None = None
    class_loss: torch.Tensor | None = None  # L_k at the solution (K,)
    tilt_weights: torch.Tensor | None = None  # q = softmax(t·L + log π) at the solution (K,)
    # Why the solver stopped: "tol", "max_iter", "max_eval" (L-BFGS's function
    # evaluations), "stalled" (L-BFGS no longer improving), "rose" (a minibatch fit that
    # ended well above its best epoch loss), "above_start" or "no_progress" (a minibatch
    # fit from zero whose best epoch loss stayed above, or within 10⁻⁶ of, the start's).
    stop: str = "tol"
    # A minibatch fit's best epoch loss after its start, where "above_start" or
    # "no_progress" says it (with one batch an epoch, the first epoch's is the start's).
    best_after_start: float | None = None
    # The estimator's parameters extreme enough to make the objective too steep to resolve
    # (its messages name them): set by the estimator, not by the solvers.
    range_suspects: list = field(default_factory=list)


# Gradients in the logits are kept between the two passes of a tilted
# evaluation when they fit in this many elements; beyond it, pass 2 recomputes them.
_KEEP_LOGIT_GRADS = 2**26
# L-BFGS pairs of every head but the plain cosine one: scikit-learn's (scipy's m = 10).
_LINEAR_HISTORY = 10
# L-BFGS for a plain cosine head: its memory, at most 200 pairs of K × d updates and 2**26
# elements in all (float64 ones, _LBFGS's: 512 MiB at most, twice float32's); and where the
# rounds of torch's L-BFGS fit it (see fit_lbfgs), the most restarts from unit-norm rows.
_COSINE_ROUNDS = 20
_COSINE_HISTORY = 200
_COSINE_HISTORY_ELEMENTS = 2**26


class ClassRisk:
    """Per-class weighted mean losses L_k and the tilted class risk over them.

    ``S_k`` (class weight sums, (..., K): leading dimensions are independent problems, as
    the folds of a search) and ``π_k = S_k / S`` are fixed by the data; ``tilt`` = 0 is the
    plain weighted mean.
    """

    def __init__(self, class_weight: torch.Tensor, tilt: float) -> None:
        self.class_weight = class_weight  # S_k (..., K)
        self.share = class_weight / class_weight.sum(-1, keepdim=True)  # π_k (..., K)
        self.tilt = tilt

    @classmethod
    def of_source(cls, source, n_classes: int, tilt: float) -> ClassRisk:
        """The class risk of a source's labels and sample weights."""
        w = source.w
        return cls(w.new_zeros(n_classes).index_add_(0, source.y, w), tilt)

    def class_loss(self, loss_sums: torch.Tensor) -> torch.Tensor:
        """L_k from Σ_{i∈k} w_i ℓ_i (0 for classes without weight)."""
        return loss_sums / weight_divisor(self.class_weight)

    def risk(self, class_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """R_t and the per-sample factor f_k = q_k / S_k that weights w_i·ℓ_i in ∇R_t."""
        risk, q = tilted_class_risk(class_loss, self.share, self.tilt)
        factor = q / weight_divisor(self.class_weight)
        return risk, factor

    def weights(self, class_loss: torch.Tensor) -> torch.Tensor:
        return tilted_class_risk(class_loss, self.share, self.tilt)[1]


@torch.no_grad()
def class_losses(head, source, margins: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Σ_{i∈k} w_i ℓ_γ(i) over the whole training set at the current parameters (K,)."""
    sums = None
    for x, y, w in source.chunks():
        loss = margin_cross_entropy(head.logits(head.features(x)), y, margins, reduction="none")
        if sums is None:
            sums = loss.new_zeros(n_classes)
        sums.index_add_(0, y, loss * w)
    return sums


@dataclass
class MarginSpec:
    """How class statistics become margins and the compactness scale."""

    n_classes: int
    p: float
    c_bar: float | None
    tau: float | None
    difficulty: str = "moment"


@torch.no_grad()
def refresh_statistics(head, source, spec: MarginSpec):
    """Exact statistics of φ over the whole training set, the margins, s̄ and τ."""
    n_features = head.weight.shape[1]
    stats = class_statistics_chunked(
        source.chunks, spec.n_classes, n_features, spec.p, transform=head.features
    )
    margins = class_margins(stats, spec.c_bar, spec.p, spec.difficulty)
    s_bar = mean_spread(stats)
    # τ = 2 s̄ by default: the exponent then compares a pair's distance with the mean
    # same-class distance in units of itself, whatever the scale of the features.
    tau = compactness_tau(stats) if spec.tau is None else spec.tau
    return stats, margins, s_bar, tau


def _progress(total: int, verbose: int, desc: str):
    return tqdm(total=total, disable=not verbose, desc=desc, leave=False)


# Steps with at most this many multiply-adds in their matrix products run on one CPU
# thread: while other processes share the cores, torch's intra-op threads wait on each
# other. SMALL_STEP for a minibatch step; SMALL_EVALUATION for an evaluation of a
# full-batch objective, below which one thread was as fast as two on an idle 2-core
# machine (python benchmarks/bench_threads.py; 1.1-1.2x slower at 5e6 to 8e6, 1.1-1.5x at
# 1.3e7).
SMALL_STEP = 2**24
SMALL_EVALUATION = 2**22


@contextlib.contextmanager
def one_thread_if_small(device, work: int, small: int):
    """One intra-op thread for a CPU step of at most ``small`` multiply-adds, the calling
    thread's own count restored after it; no change otherwise.

    ``torch.set_num_threads`` also sets the count that threads which have not used torch
    yet take at their first parallel operation: another thread's fit starting within this
    section (joblib's threading backend, Dask's workers) kept its 1 for life. That count is
    put back to this thread's own from a thread of its own (:class:`_CountSetter`), as
    soon as that thread runs, without waiting for it: a thread whose first operation falls
    in between still takes the 1 (fewer of them, not none; ``torch.set_num_threads(n)`` at
    the start of a task sets its count for sure). torch fixes a thread's count at its first
    parallel operation: one that called ``torch.set_num_threads`` but has run none yet
    takes the count set last anywhere, as it did when any section ended.
    """
    if device.type != "cpu" or work > small:
        yield
        return
    previous = torch.get_num_threads()
    if previous == 1:  # a thread's own 1 (set there, or taken): nothing to change
        yield
        return
    request = None
    try:
        torch.set_num_threads(1)
        request = _COUNT_SETTER.set(previous)
        yield
    finally:
        torch.set_num_threads(previous)  # first: an interrupt in what follows keeps it
        # A request not yet served is dropped: served later, it would undo a count that
        # the program sets after the section (served before, it set this same count).
        _COUNT_SETTER.cancel(request)


class _CountSetter:
    """A thread of its own that calls ``torch.set_num_threads``: it sets the count of the
    threads that have not used torch yet, and its own, which serves nothing else. Only the
    latest request is pending: each sets the same process-wide value, the last one wins."""

    def __init__(self):
        self.changed = threading.Condition()
        self.pending = None  # the latest request not yet served: [count], or [None]
        self.asked = self.served = 0
        self.thread = None
        self.serving = False  # while the thread serves (False once an error ended it)

    def set(self, count: int) -> list | None:
        """Have that count set unless :meth:`cancel` drops it first, or a later request
        replaces it; return at once (waiting for that thread would cost up to Python's
        switch interval, 5 ms, while other threads run Python). The request, for
        ``cancel``."""
        with self.changed:
            if self.thread is None or not self.thread.is_alive():  # first use, or a fork
                thread = threading.Thread(
                    target=self._serve, daemon=True, name="mr2-probe-thread-count"
                )
                try:
                    thread.start()
                except RuntimeError:  # at interpreter shutdown (Python 3.12): not set
                    return None
                self.thread, self.serving = thread, True
            request = [count]
            self.pending, self.asked = request, self.asked + 1
            self.changed.notify_all()
        return request

    def cancel(self, request: list | None) -> None:
        """Drop ``request`` if it is not served yet (once this returns, it never is)."""
        if request is not None:
            with self.changed:
                request[0] = None

    def drain(self) -> None:
        """Return once every request made so far is served, replaced or dropped."""
        with self.changed:
            asked = self.asked
            self.changed.wait_for(lambda: self.served >= asked or not self.serving)

    def _serve(self) -> None:
        try:
            while True:
                with self.changed:
                    self.changed.wait_for(lambda: self.pending is not None)
                    request, self.pending = self.pending, None
                    if request[0] is not None:  # under the lock: not while cancel drops it
                        torch.set_num_threads(request[0])
                    self.served = self.asked
                    self.changed.notify_all()
        finally:  # ended by an error: a drain waiting on it returns
            with self.changed:
                self.serving = False
                self.changed.notify_all()


_COUNT_SETTER = _CountSetter()
if hasattr(os, "register_at_fork"):  # a child starts its own thread (and lock)
    os.register_at_fork(after_in_child=_COUNT_SETTER.__init__)


def _on_one_thread_if_small(work, small):
    """Run a solver ``fit(head, source, spec, **kwargs)`` on one thread where
    ``work(head, source, spec, kwargs)``, the multiply-adds of one of its steps, is at most
    ``small()`` (the module's constant, read at each call)."""

    def decorate(fit):
        @functools.wraps(fit)
        def wrapper(head, source, spec, **kwargs):
            work_done = work(head, source, spec, kwargs)
            with one_thread_if_small(head.weight.device, work_done, small()):
                return fit(head, source, spec, **kwargs)

        return wrapper

    return decorate


def _evaluation_work(head, source, spec, kwargs) -> int:
    """A full-batch evaluation: two products of n·d·K (logits, gradient)."""
    return 2 * source.n_samples * head.weight.shape[1] * spec.n_classes


def _minibatch_step_work(head, source, spec, kwargs) -> int:
    """A minibatch step: B·d·(d + K + B) (projection, logits, distances), B at most the
    number of samples (a batch_size beyond it, 4,096 on 1,000 rows, put small steps on
    every thread)."""
    d, batch_size = head.weight.shape[1], min(kwargs["batch_size"], source.n_samples)
    return batch_size * d * (d + spec.n_classes + batch_size)


def _penalty_factor(C, weight_sum) -> float:
    """1/(C·Σw), the penalty's factor: inf where it overflows (C·Σw of 0 included, as of
    C=1e-320 and weights of 1e-150), refused after the fit with the estimator's own error."""
    product = float(C) * float(weight_sum)
    return 1.0 / product if product > 0 else math.inf


@_on_one_thread_if_small(_evaluation_work, lambda: SMALL_EVALUATION)
def fit_lbfgs(
    head,
    source,
    spec: MarginSpec,
    *,
    initial,
    weight_sum,
    C,
    max_iter,
    tol,
    verbose,
    tilt: float = 0.0,
    objective: str = "MR2",
):
    """Full-batch L-BFGS (strong Wolfe line search) on the margin objective (λ = 0); for a
    plain cosine head where :func:`~mr2_probe._sphere.runs_on_spheres` takes it, L-BFGS on
    the unit spheres (:func:`~mr2_probe._sphere.sphere_lbfgs`).

    ``initial`` is :func:`refresh_statistics` of the starting point; without a projection
    the representation is fixed, and so are the statistics and margins. With ``tilt`` > 0
    each evaluation makes two passes: the class losses L_k first, then the gradient with
    every sample reweighted by q_{y_i} / S_{y_i} (the logits' gradients of the first pass
    are reused when they fit in memory, so a tilted evaluation costs the same two matrix
    products per sample as a plain one).
    ``objective`` names what is minimised on the progress bar (``verbose``): "ERM" for
    plain cross-entropy, "MR2" otherwise.

    ``tol`` bounds the largest gradient entry in the coordinates L-BFGS works in: for a
    linear head with an intercept, (W, b') with b' = b + W·m, m the weighted feature mean.
    There the gradient in b' is the original one in b, and the gradient in W is the
    original one minus (∂f/∂b)·mᵀ: in the original coordinates the largest entry is at
    most tol·(1 + max_j |m_j|). For features of a large scale (σ_b > 1, see
    :func:`~mr2_probe._stats.intercept_scale`) the intercept is b' / σ_b, whose gradient
    is σ_b times that in b': the test on it is stricter. With a small C·Σw the intercept's
    scale grows further (:func:`~mr2_probe._stats.penalised_intercept_scale`), a growth
    that the test divides out again. For a linear head with margins
    the gradient is multiplied by c̄ before the test (:func:`gradient_unit`), and so is
    the largest entry returned.
    """
    if not head.has_closed_form:  # the estimator fits a projection (lam > 0) by minibatches
        raise ValueError("L-BFGS fits a head without a projection (lam = 0).")
    stats, margins, _, _ = initial
    # The test is on c̄ times the gradient (see gradient_unit); reported in those units.
    unit = gradient_unit(spec.c_bar, head.is_plain_linear)
    gtol = tol / unit
    # With an unpenalised intercept, W·x + b = W·(x − m) + (b + W·m): the same objective,
    # but centred features condition it far better (embeddings have large common means).
    # Features of a large scale (σ_b ≥ 16) also get the intercept scaled, β = b' / σ_b:
    # its curvature then matches the weights' (see intercept_scale).
    center, bias_scale, extra = None, 1.0, 1.0
    reg = _penalty_factor(C, weight_sum)  # once per fit (a host sync for a device's Σw)
    if head.is_plain_linear and head.bias is not None:
        center = overall_mean(stats)  # (d,)
        # ...and with a small C·Σw, larger still (penalised_intercept_scale), by `extra`
        # that the test on tol leaves out: the penalty's curvature, not the features',
        # makes that part of the scale.
        stiffness = penalty_stiffness(spec.n_classes, spec.c_bar, reg)
        bias_scale, extra = penalised_intercept_scale(stats, stiffness)  # once per fit
        with torch.no_grad():
            head.bias += head.weight @ center
            head.bias /= bias_scale
    risk = ClassRisk.of_source(source, spec.n_classes, tilt)
    bar = _progress(max_iter, verbose, f"{objective} lbfgs")
    # A cosine head's objective does not depend on the norms of W's rows, and it is badly
    # conditioned at large scales: more pairs than the linear head's 10 cut the iterations
    # (docs/speed.md). Its solver is an L-BFGS on the unit spheres (mr2_probe/_sphere.py)
    # where that pays (runs_on_spheres: on a CPU, X large enough, 64 features per class at
    # least, the products X·Wᵀ of two directions kept, logits smooth enough); elsewhere,
    # rounds of torch's L-BFGS below.
    rounds, history = 1, _LINEAR_HISTORY
    if head.is_plain_cosine:
        pairs = _COSINE_HISTORY_ELEMENTS // (2 * head.weight.numel())
        rounds, history = _COSINE_ROUNDS, int(min(_COSINE_HISTORY, max(10, pairs)))
    if head.is_plain_cosine and runs_on_spheres(
        source, head.weight.shape[1], spec.n_classes, float(head.scale), margins
    ):
        blocks = functools.partial(closed_form_chunks, head, source)
        n_iter, stop, largest, values = sphere_lbfgs(
            head, source, margins, risk, blocks=blocks, history=history, max_iter=max_iter,
            tol=tol, bar=bar,
        )  # fmt: skip
        bar.close()
        result = SolverResult(n_iter, stop == "tol", values, largest, stats, margins, stop=stop)
        return _with_class_losses(result, head, source, spec, risk)
    params = [p for p in head.parameters()]
    factors = [1 / extra if p is head.bias else 1.0 for p in params]  # the test's
    for param in params:  # the closed-form path writes gradients in place
        param.grad = torch.zeros_like(param)
    keep = source.n_samples * spec.n_classes <= _KEEP_LOGIT_GRADS
    curve: dict[int, torch.Tensor] = {}
    done = evals = 0  # iterations and evaluations of the finished rounds
    # What the current optimizer's n_iter counts beyond this fit's new iterations: none
    # while its round runs, all of them once it is over (and added to done).
    offset = 0
    optimizer = None

    def closure():
        for param in params:
            param.grad.zero_()
        if tilt > 0:
            total = tilted_data_term(head, source, margins, risk, center, keep, bias_scale)
        else:
            total = plain_data_term(head, source, margins, weight_sum, center, bias_scale)
        penalty = reg * head.penalty()
        if penalty.requires_grad:
            penalty.backward()
        total += penalty.detach()
        n_iter = done + optimizer.state[params[0]].get("n_iter", 0) - offset
        if n_iter not in curve and n_iter > 0:  # (0 is the starting point, no iteration)
            bar.update(1)
        curve[n_iter] = total
        return total

    # A cosine head's gradient in W shrinks as 1 / ‖w_k‖ while L-BFGS lets the norms grow,
    # so each round ends with the rows rescaled to unit norm, which leaves the objective
    # where it is, and the test on tol is then the gradient in the unit directions, whatever
    # the norms had become.
    for _ in range(rounds):
        optimizer = _LBFGS(
            params,
            lr=1,
            max_iter=max_iter - done,
            max_eval=4 * max_iter - evals,
            tolerance_grad=gtol,
            # scipy's ftol as scikit-learn sets it, float64's even for float32 data: the
            # gradient test, not float32 rounding of the loss, decides when to stop.
            tolerance_change=64 * torch.finfo(torch.float64).eps,
            history_size=history,
            line_search_fn="strong_wolfe",
        )
        optimizer.test_factors = factors
        offset = 0
        if max_iter > 0:  # max_iter = 0: the starting point, evaluated once below
            optimizer.step(closure)
        state = optimizer.state[params[0]]
        n_round = offset = state.get("n_iter", 0)  # the evaluation after it is keyed at done
        done, evals = done + n_round, evals + state.get("func_evals", 0)
        rescaled = False
        if head.is_plain_cosine:
            with torch.no_grad():
                # Once a round (a host sync per round, not per step). Rows far from unit
                # norm (a warm start from a minibatch fit, norms near 50) made the first
                # round's test on the gradient in W pass at once: the fit stopped there.
                norms = head.weight.norm(dim=1)
                rescaled = bool(((norms - 1).abs() > 1e-3).any())
                head.weight.div_(norms.clamp_min(1e-12)[:, None])  # F.normalize's rule
        # The line search may leave in .grad a point it tried and rejected: one more
        # evaluation gives the gradient (and the loss) where L-BFGS stopped.
        closure()
        largest = float(_largest_entry([p.grad for p in params], factors))
        if largest <= gtol or done >= max_iter or evals >= 4 * max_iter:
            break
        if n_round <= 1 and not rescaled:
            break  # no progress in this round: a new one would start from the same point
        if state.get("rounding"):
            break  # a round stopped on rounding: the next would too
    bar.close()
    n_iter = done
    # Converged means the gradient test was met, whatever made L-BFGS stop. The test is
    # L-BFGS's own, in its coordinates: with the intercept re-parametrised around m.
    if largest <= gtol:
        stop = "tol"
    elif n_iter >= max_iter:
        stop = "max_iter"
    elif evals >= 4 * max_iter:
        stop = "max_eval"
    else:
        stop = "stalled"
    if center is not None:
        with torch.no_grad():
            head.bias *= bias_scale
            head.bias -= head.weight @ center
    loss_curve = [float(v) for _, v in sorted(curve.items())]
    largest *= unit
    result = SolverResult(n_iter, stop == "tol", loss_curve, largest, stats, margins, stop=stop)
    return _with_class_losses(result, head, source, spec, risk)


def gradient_unit(c_bar, linear: bool) -> float:
    """What L-BFGS multiplies the gradient by before its test on ``tol``: c̄ for a linear
    head with margins, else 1.

    The margins γ = c̄·g (g of mean 1) make the linear head's logits W·x / γ: W = c̄·W' fits
    as W' does at c̄ = 1 and C / c̄², with a gradient in W c̄ times smaller than in W'. The
    test is on the gradient in W', so that the fit stops where that of the same problem
    at c̄ = 1 does: on the gradient in W, c_bar=1e4 met tol at its start (zeros) and
    c_bar=50 stopped short of the fit at c̄ = 1, on a test 50 times looser. (A cosine
    head's objective and gradient depend on scale / c̄ alone.)
    """
    return float(c_bar) if linear and c_bar is not None else 1.0


def _largest_entry(grads, factors) -> torch.Tensor:
    """max_i (factor_i · max |grad_i|), the test on tol's reading of a gradient in pieces:
    NaN where any entry is NaN (Python's max kept or dropped a NaN by its place in the
    list, and a fit whose intercept's gradient went NaN met tol)."""
    pieces = [g.abs().max() * f for g, f in zip(grads, factors, strict=True) if g.numel()]
    return torch.stack(pieces).max()


class _LBFGS(torch.optim.LBFGS):
    """torch's L-BFGS without the first call's import of ``torch._dynamo`` (2.5 s here), and
    with L-BFGS-B's test of which curvature pairs to keep (:meth:`step`).

    ``Optimizer.add_param_group`` (and ``zero_grad``, which the closure replaces by zeroing
    the gradients itself) are wrapped to disable dynamo, which imports it on first use;
    nothing here is compiled, so the wrapped function is called instead (the wrapper where
    a torch release has no ``__wrapped__``).
    """

    add_param_group = getattr(
        torch.optim.Optimizer.add_param_group, "__wrapped__", torch.optim.Optimizer.add_param_group
    )

    def _gather_flat_grad(self):
        # The search direction, its memory and the line search's products in float64, as
        # scipy's L-BFGS-B for scikit-learn's float32 fits: in float32 the square of a
        # directional derivative overflowed (iris weighted 1e-20 warm-started from 1e-13,
        # features scaled by 1e10) where the fit in float64 resolved. The steps are added
        # to the parameters in their own dtype. (MPS has no float64: float32 there.)
        flat = super()._gather_flat_grad()
        return flat if flat.device.type == "mps" else flat.double()

    # What the test on tolerance_grad multiplies each parameter's gradient by (None: 1).
    test_factors = None

    def _largest(self, flat_grad):
        """The largest entry of the gradient as the test on tolerance_grad reads it (NaN
        where an entry is NaN)."""
        if self.test_factors is None:
            return flat_grad.abs().max()
        parts = flat_grad.split([param.numel() for param in self._params])
        return _largest_entry(parts, self.test_factors)

    @torch.no_grad()
    def step(self, closure):
        """torch's ``LBFGS.step`` with the strong Wolfe line search (the only one used
        here) and one change: a pair (s, y) is kept where its curvature sᵀy is not lost in
        rounding next to the decrease along the step, sᵀy > ε·|gᵀs| (L-BFGS-B's test, as
        :func:`~mr2_probe._batched.lbfgs_batched` takes it), not where sᵀy > 10⁻¹⁰. That
        absolute test drops every pair of small steps: raw digits pixels (0 to 16) at
        tol=1e-9 dropped 2,514 of 2,999 and ran all 3,000 iterations; kept, they reach
        float64's limit in 843 (a largest gradient entry of 1.2e-8), and tol=1e-8 in 837.
        The state (``n_iter``, ``func_evals``, the pairs) is kept as torch keeps it, and
        each line search is bounded by what is left of ``max_eval`` (2.5's took up to 25
        evaluations each, past it; 2.14's one more than is left, its first trial step not
        counted in ``max_ls``); no ``maximize``, which nothing here sets.

        Where the first line search (from the start) finds no decrease and even its
        shortest step rose measurably above the start, :func:`_shorter_search` searches
        again from a shorter step, and the tests on a change of the weights are then taken
        in units of the step it found. Where the line search finds no decrease,
        :func:`_slope_search` looks for one from
        the slopes along the line (below the objective's rounding, float32's above all);
        a step it accepts is progress where its slopes say so (the value may not show
        it), until _FLAT of them in a row leave the lowest value where it was. The test on
        ``tolerance_grad`` weights each parameter's gradient by ``test_factors``.
        """
        closure = torch.enable_grad()(closure)
        group = self.param_groups[0]
        lr, max_iter, max_eval = float(group["lr"]), group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if self._largest(flat_grad) <= tolerance_grad:
            return orig_loss
        d, t, h_diag = state.get("d"), state.get("t"), state.get("H_diag")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter = 0
        # The objective's rounding (relative); the last measurably lower value, and
        # _slope_search's steps since it; the lowest value of all, which no step of
        # _slope_search's may exceed by more than the rounding.
        rounding = _ROUNDING * torch.finfo(self._params[0].dtype).eps
        lowest, flat, least = loss, 0, loss
        # The unit of the tests on a change of the weights (torch's, absolute): 1, or
        # for a fit whose first step _shorter_search found, the change that step made.
        unit = state.get("unit", 1.0)
        shortest = [math.inf, math.nan]
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, h_diag = flat_grad.neg(), [], [], [], 1
            else:
                y, s = flat_grad.sub(prev_flat_grad), d.mul(t)
                ys = y.dot(s)
                if ys > torch.finfo(ys.dtype).eps * prev_flat_grad.dot(s).abs():
                    if len(old_dirs) == group["history_size"]:
                        del old_dirs[0], old_stps[0], ro[0]
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)
                # The two-loop recursion: d = −H·g.
                al = [None] * len(old_dirs)
                q = flat_grad.neg()
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q.add_(old_dirs[i], alpha=-al[i])
                d = r = torch.mul(q, h_diag)
                for i in range(len(old_dirs)):
                    be_i = old_dirs[i].dot(r) * ro[i]
                    r.add_(old_stps[i], alpha=al[i] - be_i)
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)  # the directional derivative
            if gtd > -tolerance_change:
                break
            x_init = self._clone_param()

            shortest[:] = math.inf, math.nan  # the line's shortest trial step and its value

            def obj_func(x, t, d):
                value, grad = self._directional_evaluate(closure, x, t, d)
                if t < shortest[0]:
                    shortest[:] = t, value
                return value, grad

            # max_ls bounds the evaluations after the first trial step's.
            left = max(max_eval - current_evals - 1, 0)
            first = t
            loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                obj_func, x_init, t, d, loss, flat_grad, gtd, max_ls=left,
                tolerance_change=_BRACKET * unit,
            )  # fmt: skip
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            if (
                state["n_iter"] == 1
                and not loss < prev_loss
                and shortest[1] > prev_loss + rounding * abs(prev_loss)
                and current_evals < max_eval
            ):
                # From the start, every step tried, the shortest too, measurably above
                # it: the line's minimum lies below them, where the search's bracket fell
                # below its tolerance on the weights (_shorter_search).
                loss, flat_grad, t, evals = _shorter_search(
                    obj_func, x_init, d, prev_loss, prev_flat_grad, gtd, *shortest,
                    max_eval - current_evals,
                )  # fmt: skip
                current_evals += evals
                state["func_evals"] += evals
                if loss < prev_loss:
                    # The weights' unit from now on: this step's largest change of one.
                    unit = state["unit"] = min(1.0, float(d.mul(t).abs().max()))
            sloped = False  # whether the step is _slope_search's
            if not loss < prev_loss and current_evals < max_eval:
                # No decrease found: where it is below the objective's rounding, the
                # slopes still tell where the line's minimum is (_slope_search).
                found, evals = _slope_search(
                    obj_func, x_init, d, prev_loss, float(gtd), first,
                    min(max_eval - current_evals, _SLOPE_SEARCH), rounding * abs(prev_loss),
                    least,
                )  # fmt: skip
                current_evals += evals
                state["func_evals"] += evals
                if found is not None:
                    loss, flat_grad, t = found
                    # The decrease, where the values cannot show it: from the slopes.
                    sloped = -t * float(gtd + flat_grad.dot(d)) / 2 >= tolerance_change
            self._add_grad(t, d)
            least = min(least, loss)
            if n_iter == max_iter or current_evals >= max_eval:
                break
            if self._largest(flat_grad) <= tolerance_grad:
                break
            if d.mul(t).abs().max() <= tolerance_change * unit:
                break  # no progress
            # (steps the slopes alone accept, none of them measurably lower: noise)
            if loss < lowest - rounding * abs(lowest):
                lowest, flat = loss, 0
            elif sloped:
                flat += 1
            if flat >= _FLAT:
                state["rounding"] = True  # stopped on the objective's rounding
                break
            if abs(loss - prev_loss) < tolerance_change and not sloped:
                break
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag)
        state.update(prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss


def _shorter_search(obj_func, x, d, f, g, gtd, shortest, value, max_evals):
    """The strong Wolfe search again, from a step ``shortest`` / (``value`` − ``f``) (at
    most ``shortest``), for a fit's first line where every step tried rose measurably
    above the start ``f``: (value, gradient, step, evaluations).

    torch's search stops its zoom once the bracket, times the direction's largest entry,
    is below 10⁻⁹: a change of a weight, whatever the features' scale. On features of
    scale s such a change moves the logits by about 10⁻⁹·s: from the first step of a
    fit, 1/‖g‖₁, digits scaled by 10¹¹ rose to 8.8·10⁷ (from log 10) and the zoom
    stopped, 15 evaluations later, at a step still ten times too long (its value 9.2):
    no progress, the gradient at 6·10⁹. Once the logits are large the loss grows with
    them almost linearly, by about as many nats as they change: the retry's first step
    is the one whose rise, at the shortest step's rate, is 1 nat, and its zoom stops at a
    bracket _BRACKET of that step's largest change of a weight.
    """
    t = shortest * min(1.0, 1.0 / (value - f))
    tolerance = _BRACKET * t * float(d.abs().max())
    return _strong_wolfe(
        obj_func, x, t, d, f, g, gtd, tolerance_change=tolerance, max_ls=max(max_evals - 1, 0)
    )


# torch's strong Wolfe search stops its zoom at a bracket whose largest change of a weight
# is this, in the weights' unit (1, or that of _shorter_search's step).
_BRACKET = 1e-9

# _slope_search: values within this many epsilons of the objective's dtype (relative) of
# the line's start are not measurably above it; at most this many evaluations. L-BFGS
# stops after _FLAT of its steps in a row without a lower value (the sphere solver's rule
# and number).
_ROUNDING = 4
_SLOPE_SEARCH = 20


def _slope_search(obj_func, x, d, f, slope, t, max_evals, noise, least, c2=0.9):
    """A step along ``d`` found from the directional derivatives alone, for where the
    strong Wolfe search found no decrease: ((value, gradient, step), evaluations), or
    (None, evaluations).

    Near the optimum, or along a direction whose decrease is below the objective's
    rounding (float32's 2.4·10⁻⁷ at a loss of 2.3), the values at every trial step round
    to the start's or one unit above it, and Armijo's test rejects each: L-BFGS stopped
    there, the gradient still far above tol. The derivatives keep their precision: steps
    grow tenfold while the slope stays steep and below 0, then the slope's secant zero is
    bracketed, until |slope| <= c2·|slope at 0| (the curvature condition) at a value
    within ``noise`` of ``f`` (on a convex line such a step lowers the objective, by
    about t·(slope at 0 + slope at t) / 2). A value above ``f + noise`` where the slope is
    still negative (a line that is not convex) ends the search without a step, and so does
    one that meets the curvature condition more than ``noise`` above ``least``, the lowest
    value L-BFGS has seen: steps each within ``noise`` of the last could otherwise climb,
    where within ``noise`` of the lowest they cannot (a bound on ``least`` itself refused
    the steps whose values round one unit above it, those this search is for).
    """
    low, slope_low, high, slope_high = 0.0, slope, None, None
    for evals in range(1, max_evals + 1):
        value, grad = obj_func(x, t, d)
        slope_t = float(grad.dot(d))
        above = value > f + noise
        if not math.isfinite(value + slope_t):  # beyond the dtype's range: too far
            slope_t = math.inf
        elif above and slope_t < 0:
            return None, evals
        elif not above and abs(slope_t) <= -c2 * slope:
            return ((value, grad, t) if value <= least + noise else None), evals
        if slope_t < 0:
            low, slope_low = t, slope_t
        else:
            high, slope_high = t, slope_t
        if high is None:
            t *= 10
        else:  # the secant's zero, a tenth of the bracket at least from either end
            share = slope_low / (slope_low - slope_high)
            t = low + (high - low) * min(max(share, 0.1), 0.9)
    return None, max_evals


def closed_form_chunks(head, source):
    """Blocks (x, y, w, r) for a closed-form head: raw x, and for the cosine head the row
    scale r = 1/‖x‖ (computed once per source), so that φ = x/‖x‖ is never formed."""
    if not head.is_plain_cosine:
        for x, y, w in source.chunks():
            yield x, y, w, None
        return
    for (x, y, w), r in zip(source.chunks(), source.inverse_norms(), strict=True):
        yield x, y, w, r


def plain_data_term(head, source, margins, weight_sum, center=None, bias_scale=1.0) -> torch.Tensor:
    """(1/S) Σ_i w_i ℓ_γ(i); its gradients are added to the parameters' ``.grad``.

    In closed form (a head without a projection, :meth:`ProbeHead.has_closed_form`, the
    only one L-BFGS fits); chunks bound the memory of the logits, and gradients accumulate
    across them. The head's intercept parameter is β = b / ``bias_scale`` (the gradient
    added to it is in β).
    """
    total = head.weight.new_zeros(())
    weight, bias = head.logit_weight(), _scaled(head.logit_bias(), bias_scale)
    for x, y, w, r in closed_form_chunks(head, source):
        loss, grad_w, grad_b = linear_margin_ce_grad(x, weight, bias, y, margins, w, center, r)
        head.add_logit_weight_grad(grad_w, alpha=1 / weight_sum)
        if grad_b is not None:
            head.add_logit_bias_grad(grad_b, alpha=bias_scale / weight_sum)
        total += loss / weight_sum
    return total


def tilted_data_term(
    head, source, margins, risk, center=None, keep=True, bias_scale=1.0
) -> torch.Tensor:
    """R_t(L) of :class:`ClassRisk`; its gradients are added to the parameters' ``.grad``.

    Pass 1 measures the class losses L_k, pass 2 accumulates Σ_i w_i·f_{y_i}·∇ℓ_i with
    f = q / S_k, in closed form as :func:`plain_data_term` (``bias_scale`` as there). With
    ``keep`` the logit gradients of pass 1 are kept (N × K elements) instead of being
    recomputed.
    """
    sums = head.weight.new_zeros(len(risk.share))
    weight, bias = head.logit_weight(), _scaled(head.logit_bias(), bias_scale)
    kept = []
    for x, y, w, r in closed_form_chunks(head, source):
        loss, grad_logits = linear_margin_ce_parts(x, weight, bias, y, margins, w, center, r)
        if keep:
            kept.append(grad_logits)
        sums.index_add_(0, y, loss * w)
    value, factor = risk.risk(risk.class_loss(sums))
    for i, (x, y, w, r) in enumerate(closed_form_chunks(head, source)):
        if keep:
            grad_logits = kept[i]
        else:
            grad_logits = linear_margin_ce_parts(x, weight, bias, y, margins, w, center, r)[1]
        grad_logits.mul_(factor[y][:, None])  # (B, K)
        grad_w, grad_b = linear_grad_from_logits(x, grad_logits, center, bias is not None)
        head.add_logit_weight_grad(grad_w)
        if grad_b is not None:
            head.add_logit_bias_grad(grad_b, alpha=bias_scale)
    return value


def _scaled(bias, scale):
    """The intercept b = scale·β of the parameter β, or None."""
    return bias if bias is None or scale == 1.0 else bias * scale


def _with_class_losses(result: SolverResult, head, source, spec, risk: ClassRisk):
    """Fill in L_k and the tilt's class weights q at the solution (one no-grad pass)."""
    loss = risk.class_loss(class_losses(head, source, result.margins, spec.n_classes))
    # A class without weight has no mean loss: NaN, not a 0 that reads as a perfect fit.
    reported = torch.where(risk.class_weight > 0, loss, torch.full_like(loss, float("nan")))
    result.class_loss, result.tilt_weights = reported, risk.weights(loss)
    return result


class _Adam:
    """Adam (Kingma & Ba, 2015) on a few tensors, in place on their device.

    The same arithmetic as ``torch.optim.Adam`` without weight decay, but without its first
    call's import of ``torch._dynamo`` (1 to 3 s on a CPU-only machine).
    """

    def __init__(self, params, betas=(0.9, 0.999), eps=1e-8) -> None:
        self.params, self.betas, self.eps, self.t = params, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, grads, lr: float) -> None:
        self.t += 1
        beta1, beta2 = self.betas
        step = lr / (1 - beta1**self.t)
        correction2 = 1 - beta2**self.t
        for param, grad, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            # (a step beyond the dtype's range, float32's learning_rate=1e300, failed in
            # torch, "value cannot be converted to type float without overflow": at its
            # largest number it diverges, and the fit says so, as in float64)
            largest = torch.finfo(param.dtype).max
            param.addcdiv_(m, (v / correction2).sqrt_().add_(self.eps), value=-min(step, largest))


# The sgd solver's momentum. On a quadratic of curvature λ its steps converge only while
# learning_rate·λ is below 2(1 + μ) / (1 + 2μ), 1.357 at μ = 0.9: the penalty (½‖W‖², a
# projection's) / (C·Σw) alone beyond it (a small C·Σw) diverges the fit, whatever X is.
SGD_MOMENTUM = 0.9
SGD_STABLE = 2 * (1 + SGD_MOMENTUM) / (1 + 2 * SGD_MOMENTUM)


class _NesterovSGD:
    """SGD with Nesterov momentum, as ``torch.optim.SGD(momentum=0.9, nesterov=True)``."""

    def __init__(self, params, momentum=SGD_MOMENTUM) -> None:
        self.params, self.momentum = params, momentum
        self.buffers = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, grads, lr: float) -> None:
        for param, grad, buf in zip(self.params, grads, self.buffers, strict=True):
            buf.mul_(self.momentum).add_(grad)
            largest = torch.finfo(param.dtype).max  # (as _Adam's step)
            param.add_(grad.add(buf, alpha=self.momentum), alpha=-min(lr, largest))


# The step size is divided by LR_DECAY when the epoch loss reaches a plateau, and the fit
# has converged at the plateau that follows the last of LR_DECAYS divisions.
LR_DECAY = 0.1
LR_DECAYS = 2
# A rise of the epoch loss by this factor is a diverged fit (see _diverged).
DIVERGED = 1e3
# The minibatch solvers' running class losses, from which each step's tilt weights q come,
# average about the last this many samples of each class (by weight), or the whole class
# where it has fewer: a few batches when a batch holds many samples of a class, many when
# it holds few.
TILT_WINDOW = 32
# A minibatch fit that ends with its epoch loss this far above its best (relative) is not
# called converged: its steps took it away from its best point (a step too large for SGD).
ROSE = 0.05
# A minibatch fit from zero whose best epoch loss is within this fraction of the start's
# log K made no progress (its steps too small): uninformative features on fewer than about
# d / (2·10⁻⁶·log K) rows have their optimum further below it.
NO_PROGRESS = 1e-6


def _diverged(value: float, first: float) -> bool:
    """Whether an epoch loss ``value`` shows a diverged fit: not finite, or DIVERGED times
    the first epoch's loss, or than 1 if that was smaller (a warm start near a zero loss).
    The objective is bounded below by 0; a plateau of a diverged loss was reported as
    converged."""
    return not math.isfinite(value) or value > DIVERGED * max(first, 1.0)


@_on_one_thread_if_small(_minibatch_step_work, lambda: SMALL_STEP)
def fit_minibatch(
    head,
    source,
    spec: MarginSpec,
    *,
    initial,
    weight_sum,
    C,
    lam,
    solver,
    learning_rate,
    batch_size,
    max_iter,
    tol,
    n_iter_no_change,
    generator,
    verbose,
    tilt: float = 0.0,
    objective: str = "MR2",
):
    """Minibatch Adam or SGD; statistics refreshed exactly once per epoch when φ learns.
    ``objective`` names what is minimised on the progress bar, as in :func:`fit_lbfgs`.

    A plateau is ``n_iter_no_change`` epochs whose mean loss is not below the best so far
    by ``tol`` relative to it. At a plateau the step size is divided by 10; the third
    plateau (at ``learning_rate / 100``) ends the fit as converged. The statistics and
    margins returned are those the last epoch trained with.

    With ``tilt`` > 0 each minibatch takes the class weights q from a running estimate of
    every class's loss L_k (at the start, one exact pass), which each minibatch moves
    towards the class's mean loss in it by the class's weight there over that of
    ``TILT_WINDOW`` samples, or of the whole class where it weighs less (at most all the
    way): an average over about the last 32 samples of the class, or its last pass. A
    batch that holds a whole class thus sets its loss to the exact one, as repeated rows
    do for integer sample weights (a window counted in samples alone did not: 60 rows
    weighted 1 to 3 in one batch, t = 2, gave probabilities 0.002 away from the rows
    repeated). The minibatch then carries Σ_i w_i·q_{y_i}/S_{y_i}·ℓ_i scaled by
    N/B, whose gradient is that of the tilted risk at those weights. Weights held for a
    whole epoch, from the previous epoch's losses, made large tilts swing from one class to
    another epoch after epoch (digits, c̄ = 2, λ = 0.5, t = 20: 0% of the worst class's
    training rows right; 91% now, 88% untilted); each batch's own class means alone were
    too noisy with many classes (100 classes of 60 samples, t = 2: worst class 62%, 75%
    untilted, 75% now).
    """
    stats, margins, s_bar, tau = initial
    risk = ClassRisk.of_source(source, spec.n_classes, tilt)
    if tilt > 0:
        class_loss = risk.class_loss(class_losses(head, source, margins, spec.n_classes))
    params = [p for p in head.parameters()]
    # From zero (a linear head, no projection: a cold start) every logit is 0 and the
    # objective log K, tilted or not, whatever the margins: the yardstick of progress.
    start = None
    if lam == 0 and head.is_plain_linear and not any(bool(p.any()) for p in params):
        start = math.log(spec.n_classes)
    optimizer = _Adam(params) if solver == "adam" else _NesterovSGD(params)
    reg = _penalty_factor(C, weight_sum)
    lr, decays = learning_rate, 0
    best, stalled, curve, converged, stop = float("inf"), 0, [], False, "max_iter"
    n_batches = 0  # in the first epoch
    bar = _progress(max_iter, verbose, f"{objective} {solver}")
    for epoch in range(max_iter):
        if epoch > 0 and head.has_projection:
            stats, margins, s_bar, tau = refresh_statistics(head, source, spec)
        epoch_loss = params[0].new_zeros(())
        if tilt > 0:
            sums = epoch_loss.new_zeros(spec.n_classes)
        for x, y, w in source.batches(batch_size, generator):
            phi = head.features(x)  # (B, d')
            if tilt > 0:
                each = margin_cross_entropy(head.logits(phi), y, margins, reduction="none")
                batch = torch.zeros_like(sums).index_add_(0, y, each.detach() * w)
                sums += batch
                seen = torch.zeros_like(sums).index_add_(0, y, w)
                fresh = batch / weight_divisor(seen)
                # The window: TILT_WINDOW samples of the mean weight, at most the class.
                window = risk.class_weight.clamp(max=TILT_WINDOW * weight_sum / source.n_samples)
                rate = (seen / weight_divisor(window)).clamp(max=1.0)
                class_loss = torch.where(seen > 0, class_loss.lerp(fresh, rate), class_loss)
                factor = risk.risk(class_loss)[1]  # q_k / S_k (K,)
                data = (each * (w * factor[y])).sum() * (source.n_samples / len(y))
            else:
                # Σ w ℓ over the batch divided by its expected weight (S·B/N): unbiased for
                # the objective, and finite for a batch whose weights are all zero.
                ce = margin_cross_entropy(head.logits(phi), y, margins, w, reduction="sum")
                data = ce * (source.n_samples / (weight_sum * len(y)))
            loss = data + reg * head.penalty()
            if lam > 0:
                compact = compactness_term(
                    phi, y, w, s_bar, tau, spec.n_classes, tau_follows=spec.tau is None
                )
                loss = loss + lam * compact
            optimizer.step(torch.autograd.grad(loss, params), lr)
            n_batches += epoch == 0
            # Tilted: the epoch's value is R_t of its class losses plus the other terms.
            epoch_loss += (loss if tilt == 0 else loss - data).detach() * len(y)
        if tilt > 0:
            epoch_loss += risk.risk(risk.class_loss(sums))[0] * source.n_samples
        value = float(epoch_loss) / source.n_samples  # the one host sync of the epoch
        curve.append(value)
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4g}", lr=f"{lr:.2g}")
        if _diverged(value, curve[0]):
            stop = "diverged"
            break
        stalled = 0 if epoch == 0 or value < best - tol * abs(best) else stalled + 1
        best = min(best, value)
        if stalled >= n_iter_no_change:
            if decays == LR_DECAYS:
                converged, stop = True, "tol"
                break
            lr, decays, stalled = lr * LR_DECAY, decays + 1, 0
    bar.close()
    if converged and curve[-1] > best + ROSE * abs(best):
        converged, stop = False, "rose"
    # An epoch's value is the mean of its batches' losses before their steps: with one
    # batch an epoch, the first is the start itself, so the test reads the epochs after
    # it (none after a single epoch: max_iter stands). Read with it, every such fit "made
    # no progress", its steps "too small", however far a step too large took it above.
    after = curve[1:] if n_batches == 1 else curve
    lowest = min(after, default=None)
    pinned = start is not None and lowest is not None and lowest >= start * (1 - NO_PROGRESS)
    if pinned and stop != "diverged":
        # Three plateaus read as convergence where the fit never came back below its start
        # (a step too large, at a plateau of its noise) or never left it (one too small).
        # (Not within tol: features that carry nothing have their optimum that near.) Above
        # it by its rounding alone (log K of logits that stayed equal: features that carry
        # nothing, whatever the step) is no progress, not a step too large.
        above = lowest > start * (1 + NO_PROGRESS)
        converged, stop = False, "above_start" if above else "no_progress"
    result = SolverResult(len(curve), converged, curve, stats=stats, margins=margins, stop=stop)
    if stop in ("above_start", "no_progress"):
        result.best_after_start = lowest
    return _with_class_losses(result, head, source, spec, risk)
