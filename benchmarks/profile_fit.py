"""Where an L-BFGS fit of the linear head spends its time, and torch's product against NumPy's.

Fits ``MR2LinearClassifier(c_bar=None)`` on bench_fit.py's features (centred by default,
where the estimator and LogisticRegression take the same iterations) under torch's
profiler, and prints the share of the fit's time spent in matrix products (aten::mm,
aten::addmm, and those of ``_device.rows_product`` and ``transposed_product``: oneDNN's
linear, aten::bmm), the L-BFGS iterations and how many times each product ran (with one
row block, once per evaluation of the objective). Then times, side by side in this
process, X·Wᵀ on one chunk of the rows (the estimator's chunk size) by torch's product,
the library's and NumPy's (its BLAS), best of ``--repeat``.

    python benchmarks/profile_fit.py --threads 1      # docs/speed.md's one-thread profile
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's own warnings, not ours
import torch  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import (  # noqa: E402
    FINITE,
    SEED,
    add_feature_arguments,
    check_feature_arguments,
    check_two_classes,
    check_values,
    limit_threads,
    make_features,
    threads,
)

from mr2_probe import MR2LinearClassifier  # noqa: E402
from mr2_probe._data import block_rows  # noqa: E402
from mr2_probe._device import rows_product  # noqa: E402

PRODUCTS = ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::bmm")


def best_time(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_feature_arguments(parser)
    parser.add_argument("--offset", type=float, default=0.0, help="common feature mean")
    parser.add_argument("--threads", type=int, help="torch's and the BLAS's threads")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_feature_arguments(parser, args)
    check_values(parser, args, FINITE, "--offset")
    check_values(parser, args, SEED, "--seed")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1; got {args.repeat}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1; got {args.threads}")
    _limits = limit_threads(args.threads)  # noqa: F841  (held for the whole run)
    # bench_fit.py's training rows: the first n of the n · 6/5 it draws (the rest is its test)
    X, y = make_features(
        args.n_samples * 6 // 5, args.n_features, args.n_classes, args.seed, args.offset
    )
    X, y = X[: args.n_samples], y[: args.n_samples]
    check_two_classes(parser, y)
    clf = MR2LinearClassifier(c_bar=None, max_iter=1000, device="cpu")
    with warnings.catch_warnings():  # the first fit's one-time costs, outside the profile
        warnings.simplefilter("ignore", ConvergenceWarning)
        MR2LinearClassifier(c_bar=None, max_iter=2, device="cpu").fit(X[:500], y[:500])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        clf.fit(X, y)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    products = sum(e.self_cpu_time_total for e in events if e.key in PRODUCTS) / 1e6
    calls = {e.key: e.count for e in events if e.key in PRODUCTS}
    print(f"{args.n_samples} × {args.n_features} float32, {args.n_classes} classes, "
          f"offset={args.offset:g}, {threads()}")  # fmt: skip
    rows = block_rows(args.n_features, args.n_classes)
    blocks = -(-args.n_samples // rows)
    print(f"fit: {wall:.2f} s under the profiler, {clf.n_iter_} iterations; matrix products "
          f"{products:.2f} s, {100 * products / wall:.0f}% of the fit (calls {calls}, "
          f"row blocks per evaluation: {blocks})")  # fmt: skip

    block = X[:rows]
    W = clf.coef_.astype(np.float32)
    Xt, Wt = torch.from_numpy(block), torch.from_numpy(W)
    t_torch = best_time(lambda: Xt @ Wt.T, args.repeat)
    t_library = best_time(lambda: rows_product(Xt, Wt), args.repeat)
    t_numpy = best_time(lambda: block @ W.T, args.repeat)
    print(f"X·Wᵀ on a {len(block)} × {args.n_features} block, {args.n_classes} rows of W: torch "
          f"{1e3 * t_torch:.1f} ms, library {1e3 * t_library:.1f} ms, NumPy "
          f"{1e3 * t_numpy:.1f} ms (torch / NumPy: {t_torch / t_numpy:.2f}, library / NumPy: "
          f"{t_library / t_numpy:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
