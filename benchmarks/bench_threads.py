"""Where one CPU thread beats torch's intra-op threads for the full-batch L-BFGS fit.

The estimator runs an L-BFGS evaluation of at most ``SMALL_EVALUATION`` multiply-adds (two
products of n·d·K) on one thread, as it runs small minibatch steps. For each problem size
this times the same fit (``c_bar=1``, a fixed number of iterations, ``tol=0``) three ways in
one process: every evaluation on torch's threads, every one on one thread, and the rule;
and, as the peer, scikit-learn's LogisticRegression at its default threads, for the same
number of iterations. Each time is the best of ``--repeats`` fits, per iteration.

    python benchmarks/bench_threads.py
    python benchmarks/bench_threads.py --sizes 750x8x5 1797x64x10 --iters 30
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from mr2_probe import MR2LinearClassifier, _solvers

SIZES = ["750x8x5", "1797x64x10", "5000x128x10", "5000x256x20", "20000x256x10", "20000x512x20"]
ALWAYS, NEVER = 0, 2**62  # SMALL_EVALUATION: every evaluation on torch's threads, or on one


def parse_size(text: str) -> tuple[int, int, int]:
    n, d, k = (int(v) for v in text.lower().split("x"))
    if min(n, d, k) < 1:
        raise ValueError(f"a size of 0 or less in {text!r}")
    return n, d, k


def make_problem(n: int, d: int, k: int, seed: int = 0):
    """Gaussian classes around random means, float32."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    X = rng.normal(size=(k, d))[y] * 0.5 + rng.normal(size=(n, d))
    return X.astype(np.float32), y


@contextlib.contextmanager
def small_evaluation(value: int | None):
    """The estimator's SMALL_EVALUATION set to ``value`` (None: as it is)."""
    previous = _solvers.SMALL_EVALUATION
    if value is not None:
        _solvers.SMALL_EVALUATION = value
    try:
        yield
    finally:
        _solvers.SMALL_EVALUATION = previous


def time_per_iteration(model, X, y, repeats: int) -> tuple[float, int]:
    """The best of ``repeats`` fits, in ms per iteration, and the iterations of the last."""
    best = float("inf")
    for _ in range(repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            start = time.perf_counter()
            model.fit(X, y)
            seconds = time.perf_counter() - start
        n_iter = int(np.max(model.n_iter_))
        best = min(best, seconds / max(n_iter, 1))
    return 1000 * best, n_iter


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=SIZES, help="n x d x K, e.g. 1797x64x10")
    parser.add_argument("--iters", type=int, default=20, help="L-BFGS iterations of each fit")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for option, value in (("--iters", args.iters), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{option} must be at least 1; got {value}")
    for text in args.sizes:
        try:
            parse_size(text)
        except ValueError:
            parser.error(
                f"--sizes takes n x d x K of at least 1 each, e.g. 1797x64x10; got {text!r}"
            )
    for text in args.sizes:  # (the estimator's ValueError on one class, after the rows before)
        n, _, k = parse_size(text)
        if min(n, k) < 2:
            parser.error(f"--sizes fits classifiers: n and K must be at least 2; got {text!r}")
    if len({parse_size(text) for text in args.sizes}) < len(args.sizes):  # (a row twice)
        parser.error(f"--sizes takes each size once; got {args.sizes}")
    print(
        f"torch threads={torch.get_num_threads()}, SMALL_EVALUATION={_solvers.SMALL_EVALUATION:,} "
        f"multiply-adds, {args.iters} iterations, best of {args.repeats}; ms per iteration"
    )
    header = (
        f"{'n x d x K':>16} {'work':>12} {'torch thr':>10} {'1 thread':>9} {'rule':>8}"
        f" {'sklearn':>8} {'1 thr/torch':>12} {'rule/sklearn':>13}"
    )
    print(header)
    print("-" * len(header))
    for text in args.sizes:
        n, d, k = parse_size(text)
        X, y = make_problem(n, d, k)
        model = MR2LinearClassifier(c_bar=1, max_iter=args.iters, tol=0, device="cpu")
        time_per_iteration(model, X[: 2 * k], y[: 2 * k], 1)  # first-call costs, untimed
        times = {}
        for name, value in (("torch", ALWAYS), ("one", NEVER), ("rule", None)):
            with small_evaluation(value):
                times[name], _ = time_per_iteration(model, X, y, args.repeats)
        peer = LogisticRegression(max_iter=args.iters, tol=0)
        times["sklearn"], _ = time_per_iteration(peer, X, y, args.repeats)
        print(
            f"{text:>16} {2 * n * d * k:>12,} {times['torch']:>10.3f} {times['one']:>9.3f}"
            f" {times['rule']:>8.3f} {times['sklearn']:>8.3f}"
            f" {times['one'] / times['torch']:>11.2f}× {times['rule'] / times['sklearn']:>12.2f}×"
        )


if __name__ == "__main__":
    main()
