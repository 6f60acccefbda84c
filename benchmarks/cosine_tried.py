"""Directions tried to speed up the cosine head at a large scale, counted in iterations.

The "Tried, and slower" list of docs/speed.md for the cosine head: each experiment here
fits the cosine head at ``--scale`` (256 by default) on the same L2-normalised features as
``bench_cosine.py`` (its ``--store`` and row counts), and prints L-BFGS iterations, the
training objective, and how many test predictions agree with the cold fit's. Iterations and
objectives do not depend on the machine's load (the bf16 experiment's times do; its ratio
is taken within the run).

- ``cold``: the previous solver, rounds of torch's L-BFGS (the estimator's where
  ``runs_on_spheres`` does not take the spheres), from the class prototypes:
  the reference every experiment below is measured against and varies; then the
  estimator's own solver, the L-BFGS on the unit spheres (``mr2_probe/_sphere.py``).
- ``chain``: warm starts up a ladder of scales (``warm_start=True``), 16 → 32 → … → scale.
- ``once``: one warm start at the scale from a converged fit at scale / 4, / 2 and · 3/4.
- ``ramp``: a few iterations at smaller scales, not converged (e.g. at most 15 at scale / 4,
  then at most 15 at scale / 2), each warm-starting the next, then the fit at the scale;
  its rows print the iterations each step ran, of its cap.
- ``memory``: 50, 400 and 800 L-BFGS pairs instead of 200.
- ``one-round``: a single L-BFGS round, the rows never rescaled to unit norm, which runs
  until L-BFGS's other tests stop it (not the gradient in W): iterations until the
  objective is within 10⁻⁷ of the cold fit's.
- ``sooner``: the test on tol taken at tol · scale and at tol · √scale.
- ``subsample``: a warm start from the same scale fitted on a random quarter and eighth of
  the rows (the memory starts empty on all the rows).
- ``linear``: a warm start from the linear head's directions at C = 1.
- ``path``: the solver of MR2LinearClassifierCV's path (relative curvature test, quadratic
  and secant line-search steps, 200 pairs) as a single fit: one "fold" of all the rows.
- ``active``: the share of rows whose loss at the cold solution is still above 10⁻⁷.
- ``bf16``: X·Wᵀ in bfloat16 against float32 (best of 20) and the largest logit error
  of the bfloat16 product at the scale, against float64.
- ``precondition``: preconditioners for one standalone L-BFGS (torch's, 200 pairs, strong
  Wolfe, a single round) on the same objective from the same start, printed as the
  evaluations until the objective is within 10⁻⁷ of the cold fit's (">N": not within it
  after the N evaluations made, about 800) and the lowest objective reached. Without one
  (the rows at unit norm); with the rows at norms ρ_k = √(μ_k / mean μ), μ_k the
  solution's multipliers (docs/speed.md's equivalent penalties), which scale each class's
  curvature by 1/ρ_k²; with each class's direction whitened, W_k = A_k·u_k,
  A_k = (M_k / (tr M_k / d) + δ·I)^(−1/2), M_k = Σ_i p_ik(1 − p_ik)/γ_{y_i}²·x_i x_iᵀ (the
  curvature of each row's loss in its k-th logit), p the probabilities of the solution
  (an oracle: no solver has it in advance), the same within the features' top d/20 and
  d/5 principal directions only (uncentred; beyond them the mean of the remaining
  eigenvalues), its diagonal alone, one moment of the curvature summed over the classes
  for every class, of the solution on 2,000 random rows (or all, if fewer), or of the
  start; with the features' own second moment for every class; with every direction's
  component along the features' unit mean m̂ shrunk tenfold, A = I − 0.9·m̂m̂ᵀ (the
  linear head's centring, in these coordinates); and, not an oracle, the run without a
  preconditioner stopped after 40 or 120 evaluations and restarted from its best point
  with the per-class moments there (its evaluations counted in).
- ``moments``: the time to form the per-class curvature moments of the solution (their
  products alone), against the cold fit's time per iteration in the same run.
- ``riemannian``: an L-BFGS on the product of the K unit spheres (the rows kept at unit
  norm: tangent gradients, steps retracted by normalising the rows, the stored pairs
  projected onto each new point's tangent space), 200 pairs, Armijo backtracking from a
  step of 1 (at the first iteration min(1, 1/‖g‖₁), as torch's L-BFGS), with the usual
  scalar initial inverse Hessian sᵀy / yᵀy or one per class (its rows' block of the latest
  pair), from the estimator's start, counted in evaluations until the objective is within
  10⁻⁷ of the cold fit's, as ``precondition`` counts them; and the per-class one with each
  step minimising the objective along the retraction, found from the products X·Uᵀ and
  X·Dᵀ alone (the logits along U + t·D, rows normalised, are those products' combination
  divided by the rows' norms), so that each iteration reads X twice as one evaluation
  does (the product X·Dᵀ, the gradient): counted in iterations.

    python benchmarks/cosine_tried.py --store runs/cache/fmnist_train_lite0_64.h5
    python benchmarks/cosine_tried.py --store runs/cache/fmnist_train_lite0_64.h5 --only chain once
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.exceptions import ConvergenceWarning

sys.path.insert(0, str(Path(__file__).parent))
from bench_cosine import (  # noqa: E402
    add_data_arguments,
    check_data_arguments,
    class_indices,
    load,
    multipliers,
    objective,
)
from bench_fit import (  # noqa: E402
    AT_LEAST_0_FINITE,
    AT_LEAST_1,
    POSITIVE_FINITE,
    SEED,
    check_distinct,
    check_two_classes,
    check_values,
    threads,
    untrained_test_rows,
)

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV  # noqa: E402
from mr2_probe import _solvers as solvers  # noqa: E402
from mr2_probe._losses import margin_cross_entropy  # noqa: E402
from mr2_probe._prediction import both_class_logits  # noqa: E402

EXPERIMENTS = ["cold", "chain", "once", "ramp", "memory", "one-round", "sooner", "subsample",
               "linear", "path", "active", "bf16", "precondition", "moments",
               "riemannian"]  # fmt: skip


class Bench:
    """The data, the cold reference fit, and one printed row per fit."""

    def __init__(self, args):
        self.args = args
        self.X, self.y, self.Xt, self.yt = load(args)
        self.kw = dict(head="cosine", scale=args.scale, tol=args.tol, max_iter=args.max_iter,
                       device="cpu")  # fmt: skip
        self.cold, self.any_short = None, False

    def fit(self, X=None, y=None, start=None, round_test=True, spheres=False, **params):
        """A cosine fit (warm from ``start``'s solution if given) by the previous solver,
        rounds of torch's L-BFGS (which the estimator keeps where ``runs_on_spheres``
        does not take the spheres), or with ``spheres`` by the estimator's L-BFGS on the unit
        spheres; also sets ``short_`` (a ConvergenceWarning) and ``rounds_`` (the
        iterations of each L-BFGS round). ``round_test=False`` ends a round on L-BFGS's
        other tests only, not on the gradient in W (which shrinks as the rows' norms grow);
        the fit's final test is unchanged."""
        clf = MR2LinearClassifier(**{**self.kw, **params})
        if start is not None:
            clf.set_params(warm_start=True)
            clf._head_state, clf.n_features_in_ = start._head_state, start.n_features_in_
        rounds = []

        class Counted(solvers._LBFGS):
            def __init__(self, params, **kwargs):
                super().__init__(
                    params, **{**kwargs, **({} if round_test else {"tolerance_grad": 0.0})}
                )

            def step(self, closure):
                out = super().step(closure)
                rounds.append(self.state[self.param_groups[0]["params"][0]].get("n_iter", 0))
                return out

        with (
            patch.object(solvers, "_LBFGS", Counted),
            patch.object(solvers, "runs_on_spheres", lambda *args: spheres),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always", ConvergenceWarning)
            clf.fit(self.X if X is None else X, self.y if y is None else y)
        clf.short_ = any(issubclass(w.category, ConvergenceWarning) for w in caught)
        clf.rounds_ = rounds
        return clf

    def row(self, name, clf, iters=None):
        """Print a fit: its iterations, objective, test accuracy, agreement with the cold fit."""
        loss = objective(self.X, self.y, clf.coef_, clf.margins_)
        pred = clf.predict(self.Xt)
        agree = np.mean(pred == self.cold.predict(self.Xt)) if self.cold is not None else 1.0
        iters = clf.n_iter_ if iters is None else iters
        mark = "*" if getattr(clf, "short_", False) else " "
        self.any_short |= mark == "*"
        print(f"  {name:<60}{iters:7d}{mark}{loss:12.7f}{100 * np.mean(pred == self.yt):8.2f}"
              f"{100 * agree:9.2f}")  # fmt: skip


def cold(b):
    began = time.perf_counter()
    b.cold = b.fit()
    b.cold_seconds = time.perf_counter() - began
    b.row(f"cold fit at scale {b.args.scale:g}", b.cold)
    print(f"  (its L-BFGS rounds: {', '.join(map(str, b.cold.rounds_))} iterations)")
    b.row("the estimator's solver: L-BFGS on the unit spheres", b.fit(spheres=True))


def chain(b):
    ladder = [s for s in (16.0, 32.0, 64.0, 128.0) if s < b.args.scale] + [b.args.scale]
    clf, total = None, 0
    for scale in ladder:
        clf = b.fit(start=clf, scale=scale)
        total += clf.n_iter_
        b.row(f"ladder, scale {scale:g}", clf)
    b.row(f"ladder {' → '.join(f'{s:g}' for s in ladder)}, in all", clf, total)


def once(b):
    for first in (b.args.scale / 4, b.args.scale / 2, 3 * b.args.scale / 4):
        start = b.fit(scale=first)
        clf = b.fit(start=start)
        b.row(f"from a converged fit at {first:g}: at {b.args.scale:g}", clf)
        b.row(f"from a converged fit at {first:g}: in all", clf, start.n_iter_ + clf.n_iter_)


def ramp(b):
    s = b.args.scale
    plans = ([(s / 4, 15), (s / 2, 15)], [(s / 4, 30), (s / 2, 30)],
             [(s / 8, 10), (s / 4, 10), (s / 2, 10)], [(s / 2, 30)])  # fmt: skip
    for plan in plans:
        clf, total, steps = None, 0, []
        for scale, iters in plan:
            clf = b.fit(start=clf, scale=scale, max_iter=iters)
            total += clf.n_iter_
            steps.append(f"{clf.n_iter_} of {iters} at {scale:g}")  # run, of at most
        clf = b.fit(start=clf)
        steps = ", ".join(steps)
        b.row(f"ramp: {steps}, then {clf.n_iter_} at {s:g}; in all", clf, total + clf.n_iter_)


def memory(b):
    for pairs in (50, 400, 800):
        with patch.object(solvers, "_COSINE_HISTORY", pairs):
            clf = b.fit()
        b.row(f"{pairs} L-BFGS pairs: rounds of {', '.join(map(str, clf.rounds_))}", clf)


def one_round(b):
    with patch.object(solvers, "_COSINE_ROUNDS", 1):
        clf = b.fit(round_test=False, max_iter=2 * b.args.max_iter)
    target = objective(b.X, b.y, b.cold.coef_, b.cold.margins_) + 1e-7
    within = np.flatnonzero(np.asarray(clf.loss_curve_) <= target)
    first = int(within[0]) if len(within) else -1
    b.row("one round, rows never rescaled, no test on the gradient in W", clf)
    print(f"  (within 1e-7 of the cold fit's objective after {first} iterations; -1: never)")


def sooner(b):
    for name, factor in (("scale", b.args.scale), ("√scale", np.sqrt(b.args.scale))):
        b.row(f"tol · {name} = {b.args.tol * factor:.3g}", b.fit(tol=b.args.tol * factor))


def subsample(b):
    rng = np.random.default_rng(b.args.seed)
    for part in (4, 8):
        rows = rng.permutation(len(b.y))[: len(b.y) // part]
        if len(np.unique(b.y[rows])) < len(np.unique(b.y)):  # (a warm start's ValueError)
            print(f"  (no start from 1/{part} of the rows: they lack a class of the training rows)")
            continue
        start = b.fit(X=b.X[rows], y=b.y[rows])
        clf = b.fit(start=start)
        b.row(f"from a fit on 1/{part} of the rows ({start.n_iter_} iterations): all rows", clf)


def prototypes(b):
    """The cosine head at its starting point (max_iter=0): the class prototypes."""
    clf = MR2LinearClassifier(**{**b.kw, "max_iter": 0})
    with warnings.catch_warnings():  # evaluated once, short of tol
        warnings.simplefilter("ignore", ConvergenceWarning)
        return clf.fit(b.X, b.y)


def linear(b):
    lin = MR2LinearClassifier(c_bar=None, C=1.0, tol=b.args.tol, device="cpu").fit(b.X, b.y)
    start = prototypes(b)
    start._head_state = {**start._head_state, "weight": torch.as_tensor(lin.coef_)}
    b.row("from the linear head's directions at C = 1", b.fit(start=start))


def path(b):
    rows = np.arange(len(b.y))
    kw = {k: v for k, v in b.kw.items() if k != "scale"}
    search = MR2LinearClassifierCV(Cs=[b.args.scale], cv=[(rows, rows)], refit=False, **kw)
    search.fit(b.X, b.y)
    clf = prototypes(b)  # the fitted attributes of these data; its weights are replaced
    # (two classes: one row of coefficients, the second class's: a KeyError at the first)
    labels = [label for label in search.classes_ if label in search.coefs_paths_]
    clf.coef_ = np.stack([search.coefs_paths_[label][0, 0] for label in labels])
    b.row("the CV path's solver, one fold of all the rows", clf, int(search.n_iter_.sum()))


def active(b):
    # (two classes: one row of coefficients, the logits (0, z))
    logits = both_class_logits(torch.as_tensor(b.X @ b.cold.coef_.T, dtype=torch.float64))
    margins = torch.as_tensor(b.cold.margins_)
    losses = margin_cross_entropy(logits, torch.as_tensor(b.y), margins, reduction="none")
    share = 100 * np.mean(losses.numpy() > 1e-7)
    print(f"  rows with a loss above 1e-7 at the cold solution: {share:.1f}%")


def bf16(b):
    X = torch.as_tensor(b.X)
    W = b.args.scale * F.normalize(torch.as_tensor(b.cold.coef_, dtype=torch.float32), dim=1)

    def best(a, w):
        times = []
        for _ in range(20):
            start = time.perf_counter()
            a @ w.T
            times.append(time.perf_counter() - start)
        return min(times)

    f32, half = best(X, W), best(X.bfloat16(), W.bfloat16())
    exact = X.double() @ W.double().T
    error = float((X.bfloat16() @ W.bfloat16().T).double().sub(exact).abs().max())
    print(
        f"  X·Wᵀ: float32 {1e3 * f32:.1f} ms, bfloat16 {1e3 * half:.1f} ms (float32's "
        f"time / bfloat16's: {f32 / half:.1f}); largest bfloat16 logit error {error:.3f}"
    )


def _whitening(moment, delta):
    """(M / (tr M / d) + δ·I)^(−1/2): M scaled to eigenvalues of mean 1, regularised by δ."""
    moment = moment.double() * (len(moment) / moment.trace())
    values, vectors = torch.linalg.eigh(moment)
    return (vectors * (values + delta).rsqrt()) @ vectors.T


def _low_rank_whitening(moment, basis, delta):
    """:func:`_whitening` within the span of ``basis`` (d × r, orthonormal columns) alone:
    there M's own (M / (tr M / d))_r + δ·I, beyond it the mean eigenvalue left outside the
    span, ((d − tr M_r) / (d − r) + δ)·I, so that r = d is :func:`_whitening` itself."""
    moment, basis = moment.double(), basis.double()
    d, r = basis.shape
    inner = basis.T @ moment @ basis * (d / moment.trace())
    rest = (d - inner.trace()) / max(d - r, 1) + delta
    values, vectors = torch.linalg.eigh(inner)
    eye = torch.eye(r, dtype=torch.float64)
    within = (vectors * (values + delta).rsqrt()) @ vectors.T - rest.rsqrt() * eye
    return basis @ within @ basis.T + rest.rsqrt() * torch.eye(d, dtype=torch.float64)


def precondition(b, max_evals=800, within=1e-7, after=(40, 120)):
    if len(b.cold.coef_) == 1:  # two classes: the model keeps its rows as one difference
        print("  (no preconditioners: two classes, one row of coefficients)")
        return {}
    X, y = torch.as_tensor(b.X), torch.as_tensor(b.y)
    margins = torch.as_tensor(b.cold.margins_, dtype=torch.float32)
    scale, (n, d), n_classes = b.args.scale, X.shape, len(b.cold.margins_)

    def logits(W):  # the cosine head's logits with rows W (K, d), (n, K)
        return scale * X @ F.normalize(W, dim=1).T

    def loss(W):  # their mean margin cross-entropy
        return margin_cross_entropy(logits(W), y, margins)

    def curvature(W):  # p_ik(1 − p_ik) / γ_{y_i}², (n, K)
        return _curvature(logits(W), y, margins)

    def per_class(weights, rows=slice(None), delta=0.1, diagonal=False, rank=None):
        Xr = X[rows]  # not a hot path
        moments = (  # ten d × d moments, or their diagonals alone
            [torch.diag(weights[rows, k] @ Xr**2) for k in range(n_classes)]
            if diagonal
            else [(Xr * weights[rows, k, None]).T @ Xr for k in range(n_classes)]
        )
        if rank is not None:  # the features' top principal directions (uncentred)
            basis = torch.linalg.eigh((X.T @ X).double())[1][:, -rank:]
            return torch.stack([_low_rank_whitening(m, basis, delta) for m in moments])
        return torch.stack([_whitening(moment, delta) for moment in moments])

    cold = torch.as_tensor(b.cold.coef_, dtype=torch.float32)
    target = float(loss(cold)) + within
    start = F.normalize(torch.as_tensor(prototypes(b).coef_, dtype=torch.float32), dim=1)
    mu = torch.as_tensor(multipliers(b.X, b.y, b.cold.coef_, b.cold.margins_), dtype=torch.float32)
    # Row norms from the multipliers need them all positive (the loss pulling every row
    # outward, as on the 20,000 Fashion-MNIST rows); otherwise that variant is left out.
    rho = (mu / mu.mean()).sqrt() if bool((mu > 0).all()) else None
    solved, started = curvature(cold), curvature(start)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(b.args.seed))[:2000]
    mean = F.normalize(X.mean(0), dim=0).double()
    shrink = torch.eye(d, dtype=torch.float64) - 0.9 * torch.outer(mean, mean)
    every = lambda A: A.expand(n_classes, d, d)  # noqa: E731  (one A for every class)
    spread = (
        f"multipliers μ_k / mean μ from {float(mu.min() / mu.mean()):.3g} to "
        f"{float(mu.max() / mu.mean()):.3g}"
        if rho is not None
        else f"multipliers μ_k from {float(mu.min()):.3g}, not all positive: no row-norm oracle"
    )
    print(f"  ({spread}; the features' mean has norm {float(X.mean(0).norm()):.2f}; "
          "evaluations of a standalone L-BFGS)")  # fmt: skip
    variants = [("none: rows at unit norm", None, start)]
    if rho is not None:
        variants.append(("rows at norms √(μ_k / mean μ) (oracle)", None, start * rho[:, None]))
    variants += [
        ("per class, the solution's curvature, δ = 0.1 (oracle)", per_class(solved), start),
        ("per class, the solution's curvature, δ = 0.01 (oracle)",
         per_class(solved, delta=0.01), start),
        ("per class, the solution's curvature, δ = 0.001 (oracle)",
         per_class(solved, delta=0.001), start),
        *[(f"per class, δ = 0.1, top {r} of {d} principal axes (oracle)",
           per_class(solved, rank=r), start)
          for r in sorted({max(1, d // 20), max(1, d // 5)})],
        ("per class, its diagonal alone, δ = 0.1 (oracle)",
         per_class(solved, diagonal=True), start),
        ("shared, the solution's curvature summed, δ = 0.1 (oracle)",
         every(_whitening((X * solved.sum(1, keepdim=True)).T @ X, 0.1)), start),
        (f"per class, the solution's curvature on {len(rows):,} rows, δ = 0.1",
         per_class(solved, rows), start),
        ("per class, the start's curvature, δ = 0.1", per_class(started), start),
        ("shared, the features' second moment XᵀX, δ = 1", every(_whitening(X.T @ X, 1.0)),
         start),
        ("the mean direction shrunk tenfold", every(shrink), start),
    ]  # fmt: skip

    def minimise(A, W0, keep=()):
        """One L-BFGS from ``W0`` in the coordinates u of W_k = A_k·u_k: the objective at
        each evaluation, and the best W evaluated by the evaluations counted in ``keep``."""
        if A is None:
            u = W0.clone().requires_grad_()
            weights = lambda u: u  # noqa: E731
        else:
            A = A.float()
            # The start's directions in u, each row at unit norm (any norm: a cosine row's
            # norm does not change the objective, and A_k's scale cancels against it).
            u0 = torch.linalg.solve(A, W0[:, :, None])[:, :, 0]
            u = F.normalize(u0, dim=1).requires_grad_()
            weights = lambda u, A=A: (A @ u[:, :, None])[:, :, 0]  # noqa: E731
        curve, kept, best = [], {}, {}

        def closure():
            u.grad = None
            W = weights(u)
            value = loss(W)
            value.backward()
            curve.append(float(value.detach()))
            if curve[-1] <= min(curve):  # a line search's trials can be worse: not kept
                best["W"] = W.detach().clone()
            if len(curve) in keep:
                kept[len(curve)] = best["W"]
            return value

        optimizer = torch.optim.LBFGS([u], lr=1, max_iter=max_evals, max_eval=max_evals,
                                      tolerance_grad=0.0, tolerance_change=0.0,
                                      history_size=200, line_search_fn="strong_wolfe")  # fmt: skip
        optimizer.step(closure)
        return curve, kept

    def report(name, curve):
        reached = np.flatnonzero(np.asarray(curve) <= target)
        evals = f"{reached[0] + 1:7d} " if len(reached) else f"{'>' + str(len(curve)):>7} "
        print(f"  {name:<60}{evals}{min(curve):12.7f}")
        curves[name] = curve

    curves = {}  # each variant's objective at each evaluation, returned for the tests
    for name, A, W0 in variants:
        curve, kept = minimise(A, W0, keep=after if A is None and W0 is start else ())
        report(name, curve)
        if A is None and W0 is start:  # the plain run: its iterates
            plain, reached = curve, kept
    # A practical form of the oracle: the plain run's best point after `count` evaluations,
    # its own per-class curvature, and a new L-BFGS from there (its first pairs would not
    # carry over the change of coordinates); counted from the start, the plain run's too.
    for count in after:
        if count in reached:  # the plain run had not stopped before
            curve, _ = minimise(per_class(curvature(reached[count])), reached[count])
            report(
                f"per class, the curvature after {count} evaluations, δ = 0.1",
                plain[:count] + curve,
            )
    return curves


def _curvature(logits, y, margins):
    """p_ik(1 − p_ik) / γ_{y_i}² of the cosine head's ``logits`` (n, K): the curvature of
    each row's loss in its k-th logit."""
    with torch.no_grad():
        inv_gamma = margins.reciprocal()[y][:, None]
        p = torch.softmax(logits * inv_gamma, dim=1)
        return p * (1 - p) * inv_gamma**2


def moments(b):
    """The time to form the per-class curvature moments that ``precondition`` whitens by,
    against the time of one iteration of the cold fit (its own run just before)."""
    X, y = torch.as_tensor(b.X), torch.as_tensor(b.y)
    margins = torch.as_tensor(b.cold.margins_, dtype=torch.float32)
    weights = _curvature(X @ torch.as_tensor(b.cold.coef_, dtype=torch.float32).T, y, margins)
    began = time.perf_counter()
    for k in range(weights.shape[1]):  # the products alone, as precondition forms them
        (X * weights[:, k, None]).T @ X
    formed, iteration = time.perf_counter() - began, b.cold_seconds / b.cold.n_iter_
    print(f"  forming the {weights.shape[1]} per-class moments of the solution's curvature: "
          f"{formed:.2f} s, the time of {formed / iteration:.0f} iterations of the cold fit "
          f"({1e3 * iteration:.1f} ms each)")  # fmt: skip


def exact_step(X, y, margins, scale, U, direction, first):
    """The step t that minimises the cosine head's objective along the retraction
    U + t·D (rows normalised), D a descent direction tangent at U, from the products X·Uᵀ
    and X·Dᵀ alone: the step doubled from ``first`` until the slope turns, then Newton's
    steps kept within the bracket [lo, hi] of slopes below and above 0 (else its midpoint)."""
    cosines, moved = (X @ U.float().T).double(), (X @ direction.float().T).double()
    norms = (direction * direction).sum(1)  # D is tangent: ‖U + t·D‖² = 1 + t²‖d_k‖²

    def along(t):  # the slope and curvature of the objective at step t
        t = torch.tensor(t, dtype=torch.float64, requires_grad=True)
        rows = (cosines + t * moved) / (1 + t * t * norms).sqrt()
        value = margin_cross_entropy(scale * rows, y, margins.double())
        (slope,) = torch.autograd.grad(value, t, create_graph=True)
        (curvature,) = torch.autograd.grad(slope, t)
        return float(slope.detach()), float(curvature)

    lo, t = 0.0, float(first)
    slope, curvature = along(t)
    while slope < 0 and t < 1e12:
        lo, t = t, 2 * t
        slope, curvature = along(t)
    hi = t
    for _ in range(100):
        newton = t - slope / curvature if curvature > 0 else float("nan")
        trial = newton if lo < newton < hi else (lo + hi) / 2
        converged = abs(trial - t) <= 1e-12 * trial
        t = trial
        slope, curvature = along(t)
        lo, hi = (t, hi) if slope < 0 else (lo, t)
        if converged:
            break
    return t


def riemannian(b, max_evals=800, within=1e-7, history=200):
    X, y = torch.as_tensor(b.X), torch.as_tensor(b.y)
    margins = torch.as_tensor(b.cold.margins_, dtype=torch.float32)
    scale = b.args.scale

    def value_and_gradient(U):  # the objective at unit rows U and its tangent gradient
        U = U.float().requires_grad_()
        value = margin_cross_entropy(scale * X @ U.T, y, margins)
        (grad,) = torch.autograd.grad(value, U)
        U, grad = U.detach().double(), grad.double()
        return float(value.detach()), grad - (grad * U).sum(1, keepdim=True) * U

    def tangent(U, V):  # V's row-wise projection onto the tangent space at U
        return V - (V * U).sum(1, keepdim=True) * U

    start = F.normalize(torch.as_tensor(prototypes(b).coef_, dtype=torch.float64), dim=1)
    if len(start) == 1:  # two classes: one row of coefficients, no class blocks
        print("  (no Riemannian L-BFGS: two classes, one row of coefficients)")
        return {}
    target = float(margin_cross_entropy(
        X @ torch.as_tensor(b.cold.coef_, dtype=torch.float32).T, y, margins)) + within  # fmt: skip
    curves = {}
    variants = [  # (name, label, one initial inverse Hessian per class, exact steps)
        ("scalar", "scalar sᵀy/yᵀy", False, False),
        ("per class", "per class sᵀy/yᵀy", True, False),
        ("exact steps", "per class, steps from X·Dᵀ (1 per iter.)", True, True),
    ]
    for name, label, per_class, exact in variants:
        U = start
        value, grad = value_and_gradient(U)
        curve, pairs = [value], []
        while len(curve) < max_evals and min(curve) > target:
            direction = -grad  # the two-loop recursion over the pairs (s, y)
            alphas = []
            for s, yv in reversed(pairs):
                alphas.append(float((s * direction).sum()) / float((s * yv).sum()))
                direction = direction - alphas[-1] * yv
            if pairs:
                s, yv = pairs[-1]
                sy, yy = (s * yv).sum(1), (yv * yv).sum(1)
                h0 = float(sy.sum() / yy.sum())
                if per_class:  # each class's rows' block of the latest pair
                    h0 = torch.where((sy > 0) & (yy > 0), sy / yy.clamp_min(1e-300), h0)[:, None]
                direction = direction * h0
            for (s, yv), alpha in zip(pairs, reversed(alphas), strict=True):
                direction = direction + (alpha - float((yv * direction).sum()) / float(
                    (s * yv).sum())) * s  # fmt: skip
            direction = tangent(U, direction)
            slope = float((grad * direction).sum())
            if slope >= 0:  # not a descent direction: the memory is dropped
                pairs, direction, slope = [], -grad, -float((grad * grad).sum())
            step = 1.0 if len(curve) > 1 else min(1.0, 1.0 / float(grad.abs().sum()))
            if exact:  # one evaluation per iteration: the product X·Dᵀ, then the gradient
                step = exact_step(X, y, margins, scale, U, direction, step)
            accepted = False
            while len(curve) < max_evals:  # Armijo backtracking along the retraction
                moved = F.normalize(U + step * direction, dim=1)
                new_value, new_grad = value_and_gradient(moved)
                curve.append(new_value)
                accepted = exact or new_value <= value + 1e-4 * step * slope
                if accepted:
                    break
                step /= 2
            if not accepted:
                break
            s_new = tangent(moved, step * direction)
            y_new = new_grad - tangent(moved, grad)
            pairs = [(tangent(moved, s), tangent(moved, yv)) for s, yv in pairs]
            if float((s_new * y_new).sum()) > 1e-10 * float((y_new * y_new).sum()):
                pairs = (pairs + [(s_new, y_new)])[-history:]
            U, value, grad = moved, new_value, new_grad
        reached = np.flatnonzero(np.asarray(curve) <= target)
        evals = f"{reached[0] + 1:7d} " if len(reached) else f"{'>' + str(len(curve)):>7} "
        label = f"on the unit spheres (Riemannian), {history} pairs, {label}"
        print(f"  {label:<60}{evals}{min(curve):12.7f}")
        curves[name] = curve
    return curves


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--scale", type=float, default=256.0)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, help="these experiments")
    args = parser.parse_args(argv)
    check_data_arguments(parser, args)
    check_values(parser, args, POSITIVE_FINITE, "--scale")
    check_values(parser, args, AT_LEAST_0_FINITE, "--tol")
    check_values(parser, args, AT_LEAST_1, "--max-iter")  # (0: fits of no iteration)
    check_values(parser, args, SEED, "--seed")
    check_distinct(parser, args, "--only")  # (an experiment run and printed twice)
    bench = Bench(args)
    check_two_classes(parser, bench.y)
    print(f"{len(bench.y)} × {bench.X.shape[1]} L2-normalised float32 train, {len(bench.yt)} "
          f"test, scale={args.scale:g}, tol={args.tol}, c_bar=1, {threads()}")  # fmt: skip
    if note := untrained_test_rows(bench.y, bench.yt):
        print(note)
    bench.y, bench.yt = class_indices(bench.y, bench.yt)  # (once said, in the store's codes)
    print(f"  {'experiment':<60}{'iters':>8}{'objective':>12}{'acc %':>8}{'agree %':>9}")
    cold(bench)  # every other experiment compares with it
    for name in args.only or EXPERIMENTS[1:]:
        if name != "cold":
            globals()[name.replace("-", "_")](bench)
    if bench.any_short:
        print("* stopped short of tol (ConvergenceWarning)")


if __name__ == "__main__":
    main()
