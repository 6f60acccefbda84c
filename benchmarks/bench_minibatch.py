"""The minibatch solver on the README's call, ``MR2LinearClassifier(c_bar=2, lam=0.5, p=3)``.

Two tables from one run:

1. Cost of one training step (forward, backward, update) at batch 256 with a full d × d
   projection: the previous step (``torch.optim.Adam``, ``backward``) against the current
   one (``autograd.grad`` and an in-place Adam), with torch's default intra-op threads and
   with one thread.
2. Whole fits on scikit-learn's digits, the demo's split (898 train / 899 test, raw pixel
   values 0 to 16, as the call is written), each in a fresh process so that every row pays
   its own first-call costs: LogisticRegression (the peer, same C; on one BLAS thread, as
   the current solver runs its small steps, and on its default threads), the previous minibatch
   settings (Adam at 1e-3, stop after 10 epochs without an absolute improvement of 1e-4,
   no schedule), the current defaults, and a sweep over the step size and the patience.
   Each row: fit seconds (median over seeds), its ratio to LogisticRegression's, epochs
   (iterations for LogisticRegression), seeds converged, test accuracy (mean over seeds),
   training loss of the last epoch, and whether the fit imported ``torch._dynamo``.

    python benchmarks/bench_minibatch.py                 # both tables, 5 seeds
    python benchmarks/bench_minibatch.py --sweep         # add the step-size / patience sweep
    python benchmarks/bench_minibatch.py --seeds 0 --no-steps   # quick look
    python benchmarks/bench_minibatch.py --standardize --C 0.05 # the demo's form
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch


# --------------------------------------------------------------------------- the previous
def previous_fit_minibatch(
    head,
    source,
    spec,
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
    tilt=0.0,
    objective="MR2",
):
    """The minibatch solver as it was: torch.optim, absolute tol, no schedule, and the
    statistics refreshed once more after the last epoch. It had no class tilt, and no
    progress bar to name ``objective`` on (taken as the current solver takes it)."""
    assert tilt == 0, "the previous minibatch solver had no class tilt"
    from mr2_probe._losses import compactness_loss, margin_cross_entropy
    from mr2_probe._solvers import ClassRisk, SolverResult, _with_class_losses, refresh_statistics

    stats, margins, s_bar, tau = initial
    params = list(head.parameters())
    optimizer = torch.optim.Adam(params, lr=learning_rate)
    reg = 1.0 / (C * weight_sum)
    best, stalled, curve, converged = float("inf"), 0, [], False
    for epoch in range(max_iter):
        if epoch > 0 and head.has_projection:
            stats, margins, s_bar, tau = refresh_statistics(head, source, spec)
        epoch_loss = params[0].new_zeros(())
        for x, y, w in source.batches(batch_size, generator):
            phi = head.features(x)
            ce = margin_cross_entropy(head.logits(phi), y, margins, w, reduction="sum")
            loss = ce * (source.n_samples / (weight_sum * len(y))) + reg * head.penalty()
            if lam > 0:
                loss = loss + lam * compactness_loss(phi, y, s_bar, tau)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach() * len(y)
        value = float(epoch_loss) / source.n_samples
        curve.append(value)
        stalled = stalled + 1 if value > best - tol else 0
        best = min(best, value)
        if stalled >= n_iter_no_change:
            converged = True
            break
    if head.has_projection:
        stats, margins, _, _ = refresh_statistics(head, source, spec)
    stop = "tol" if converged else "max_iter"
    result = SolverResult(len(curve), converged, curve, stats=stats, margins=margins, stop=stop)
    # What the estimator now reads of every result: the class losses at the solution.
    risk = ClassRisk.of_source(source, spec.n_classes, 0)
    return _with_class_losses(result, head, source, spec, risk)


PREVIOUS = {"learning_rate": 1e-3, "n_iter_no_change": 10}


# ------------------------------------------------------------------------------ one step
def _steps(d, n_classes, batch):
    """The previous and the current training step on one batch, as functions.

    The previous step held s̄ and τ constant in the compactness loss; the current one also
    differentiates through them (the batch's class statistics, ``compactness_term``)."""
    from mr2_probe._head import ProbeHead
    from mr2_probe._losses import compactness_loss, compactness_term, margin_cross_entropy
    from mr2_probe._solvers import _Adam

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d, generator=g)
    y = torch.randint(n_classes, (batch,), generator=g)
    margins = torch.ones(n_classes)
    s_bar = torch.tensor(float(d))
    head = ProbeHead(
        d,
        n_classes,
        head="linear",
        fit_intercept=True,
        scale=64.0,
        projection=True,
        projection_rank=None,
        dtype=torch.float32,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    params = list(head.parameters())

    def loss(current):
        phi = head.features(x)  # (B, d)
        ce = margin_cross_entropy(head.logits(phi), y, margins, reduction="mean")
        if current:
            compact = compactness_term(phi, y, None, s_bar, 2 * s_bar, n_classes)
        else:
            compact = compactness_loss(phi, y, s_bar, 2 * s_bar)
        return ce + 1e-3 * head.penalty() + 0.5 * compact

    torch_adam = torch.optim.Adam(params, lr=1e-6)
    ours = _Adam(params)

    def previous():
        torch_adam.zero_grad(set_to_none=True)
        loss(False).backward()
        torch_adam.step()

    def current():
        ours.step(torch.autograd.grad(loss(True), params), 1e-6)

    return previous, current


def _median_ms(step, n_threads, repeat):
    threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        for _ in range(3):
            step()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 1e3 * float(np.median(times))


def step_costs(dims, n_classes=10, batch=256, repeat=30):
    """Median ms of one step: previous and current with torch's threads, current on one."""
    rows = []
    threads = torch.get_num_threads()
    for d in dims:
        previous, current = _steps(d, n_classes, batch)
        rows.append(
            {
                "d": d,
                "work": batch * d * (d + n_classes + batch),
                "previous": _median_ms(previous, threads, repeat),
                "current": _median_ms(current, threads, repeat),
                "current, 1 thread": _median_ms(current, 1, repeat),
            }
        )
    return rows


# ---------------------------------------------------------------------------- whole fits
def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    return train_test_split(X, y, test_size=0.5, stratify=y, random_state=0)


def fit_row(kind, params, seed, C=1.0, standardize=False):
    """Fit once in this (fresh) process; return the row's measurements."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.preprocessing import StandardScaler

    X_train, X_test, y_train, y_test = digits_split()
    if standardize:  # the demo's form
        scaler = StandardScaler().fit(X_train)
        X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    threads = None
    if kind in ("logistic", "logistic-1"):
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=C, max_iter=1000)
        # The current minibatch solver runs its small steps on one thread; so does the
        # peer's first row (its BLAS limited to one thread), the second keeps its default.
        threads = 1 if kind == "logistic-1" else None
    else:
        from mr2_probe import MR2LinearClassifier, _classifier

        if kind == "previous":
            _classifier.fit_minibatch = previous_fit_minibatch
        if kind == "torch-threads":
            from mr2_probe import _solvers

            _solvers.SMALL_STEP = 0  # every step on torch's intra-op threads
        model = MR2LinearClassifier(c_bar=2, lam=0.5, p=3, C=C, random_state=seed, **params)
    from threadpoolctl import threadpool_limits

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, threadpool_limits(threads):
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(X_train, y_train)
    seconds = time.perf_counter() - start
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    n_iter = int(np.max(model.n_iter_))
    loss = float(model.loss_curve_[-1]) if hasattr(model, "loss_curve_") else float("nan")
    return {
        "seconds": seconds,
        "n_iter": n_iter,
        "converged": converged,
        "accuracy": float(model.score(X_test, y_test)),
        "loss": loss,
        "dynamo": "torch._dynamo" in sys.modules,
    }


def run_fresh(kind, params, seed, C, standardize):
    code = [sys.executable, __file__, "--row", json.dumps([kind, params, seed, C, standardize])]
    out = subprocess.run(code, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--sweep", action="store_true", help="step size × patience sweep")
    parser.add_argument("--no-steps", action="store_true", help="skip the per-step table")
    parser.add_argument(
        "--dims", type=int, nargs="+", help="d of the per-step table (default: 64 128 256 512 768)"
    )
    parser.add_argument("--C", type=float, default=1.0, help="C of every model (default 1)")
    parser.add_argument(
        "--standardize", action="store_true", help="StandardScaler first (the demo: --C 0.05)"
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        print(json.dumps(fit_row(*json.loads(args.row))))
        return
    if args.dims is not None and args.no_steps:  # (ignored without a word)
        parser.error("--dims sizes the per-step table, which --no-steps skips")
    # (each fresh process's traceback: scikit-learn's InvalidParameterError at --C 0, at a
    # --seeds -1 after the peer's rows; torch's RuntimeError at --dims -2, d = 0 timed)
    if not args.C > 0:
        parser.error(f"--C must be positive; got {args.C}")
    if not all(0 <= seed < 2**32 for seed in args.seeds):
        parser.error(f"--seeds must be between 0 and 2**32 - 1; got {args.seeds}")
    if args.dims is not None and min(args.dims) < 1:
        parser.error(f"--dims must be at least 1; got {args.dims}")
    # (a seed counted twice in the medians and means, a row of the table twice)
    for option, values in (("--seeds", args.seeds), ("--dims", args.dims)):
        if values is not None and len(set(values)) < len(values):
            parser.error(f"{option} takes each value once; got {values}")
    if args.dims is None:
        args.dims = [64, 128, 256, 512, 768]

    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    if not args.no_steps:
        print("\none step at batch 256, full d × d projection, 10 classes (median ms)")
        header = f"{'d':>5} {'multiply-adds':>14} {'previous':>9} {'current':>8} {'1 thread':>9}"
        print(header)
        print("-" * len(header))
        for r in step_costs(args.dims):
            print(
                f"{r['d']:>5} {r['work']:>14,} {r['previous']:>9.2f} {r['current']:>8.2f} "
                f"{r['current, 1 thread']:>9.2f}"
            )

    rows = [
        (f"LogisticRegression(C={args.C:g}), 1 thread (peer)", "logistic-1", {}),
        (f"LogisticRegression(C={args.C:g}), its threads", "logistic", {}),
        ("previous: Adam 1e-3, abs tol, 10 ep", "previous", PREVIOUS),
        ("current defaults", "current", {}),
        ("current defaults, torch's threads", "torch-threads", {}),
    ]
    if args.sweep:
        for lr in (1e-3, 3e-3, 1e-2, 3e-2):
            for patience in (2, 3, 5):
                name = f"lr={lr:g}, n_iter_no_change={patience}"
                params = {"learning_rate": lr, "n_iter_no_change": patience}
                rows.append((name, "current", params))
    features = "standardized" if args.standardize else "raw"
    print(
        f"\ndigits, demo split, {features} features, C={args.C:g}; {len(args.seeds)} seeds, "
        "each fit in a fresh process"
    )
    width = max(40, *(len(name) for name, _, _ in rows))
    header = (
        f"{'model':<{width}} {'fit s':>6} {'ratio':>6} {'epochs':>7} {'conv':>5} {'acc %':>6} "
        f"{'loss':>7} {'dynamo':>6}"
    )
    print(header)
    print("-" * len(header))
    peer = None
    for name, kind, params in rows:
        results = [run_fresh(kind, params, seed, args.C, args.standardize) for seed in args.seeds]
        seconds = float(np.median([r["seconds"] for r in results]))
        peer = seconds if peer is None else peer
        epochs = "/".join(str(r["n_iter"]) for r in results)
        if len(epochs) > 7:
            epochs = f"{np.mean([r['n_iter'] for r in results]):.0f}"
        converged = f"{sum(r['converged'] for r in results)}/{len(results)}"
        accuracy = 100 * np.mean([r["accuracy"] for r in results])
        # LogisticRegression keeps no loss curve: '-', where its NaN printed 'nan'
        loss = np.mean([r["loss"] for r in results])
        loss = f"{'-':>7}" if kind.startswith("logistic") else f"{loss:>7.4f}"
        dynamo = "yes" if any(r["dynamo"] for r in results) else "no"
        print(
            f"{name:<{width}} {seconds:>6.2f} {seconds / peer:>5.1f}× {epochs:>7} {converged:>5} "
            f"{accuracy:>6.2f} {loss} {dynamo:>6}"
        )


if __name__ == "__main__":
    main()
