"""Fit time of the cosine head against the linear head and scikit-learn, same features.

L2-normalised features (synthetic by default, or the ``features`` of a feature store with
``--store``), one run: scikit-learn's LogisticRegression and the linear head at ``--C``,
then the cosine head at each ``--scales`` value, solved as the estimator does and as it
was solved before (autograd gradients, 10 L-BFGS pairs, the test on tol in W), with the
same tol. Each cosine row prints its time relative to the linear head, its iterations,
its training objective and its test accuracy.

    python benchmarks/bench_cosine.py                                 # 20,000 × 512, 10 classes
    python benchmarks/bench_cosine.py --store runs/cache/fmnist_train_lite0_64.h5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # the previous solver, kept in tests/
from bench_fit import make_features  # noqa: E402

from mr2_probe import MR2LinearClassifier  # noqa: E402
from mr2_probe._losses import margin_cross_entropy  # noqa: E402
from tests.reference_mr2 import cosine_lbfgs_before  # noqa: E402


def load(args):
    """Unit-norm train and test features: the store's first rows, or synthetic ones."""
    if args.store:
        import h5py

        with h5py.File(args.store, "r") as f:
            n = min(len(f["labels"]), args.n_samples + args.n_test)
            X, y = f["features"][:n].astype(np.float32), f["labels"][:n].astype(np.int64)
    else:
        n = args.n_samples + args.n_test
        X, y = make_features(n, args.n_features, args.n_classes, args.seed)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X[: args.n_samples], y[: args.n_samples], X[args.n_samples :], y[args.n_samples :]


def objective(X, y, coef, margins):
    z = torch.as_tensor(X @ coef.T, dtype=torch.float64)
    return float(margin_cross_entropy(z, torch.as_tensor(y), torch.as_tensor(margins)))


def timed(fn):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        out = fn()
    return time.perf_counter() - start, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="a feature store (.h5) instead of synthetic")
    parser.add_argument("--n-samples", type=int, default=20_000)
    parser.add_argument("--n-test", type=int, default=5_000)
    parser.add_argument("--n-features", type=int, default=512)
    parser.add_argument("--n-classes", type=int, default=10)
    parser.add_argument("--C", type=float, default=1.0, help="the linear heads' C")
    parser.add_argument("--scales", type=float, nargs="*", default=[16.0, 64.0, 256.0])
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=3000)
    parser.add_argument("--no-before", action="store_true", help="skip the previous solver")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    X, y, Xt, yt = load(args)
    common = dict(tol=args.tol, max_iter=args.max_iter, device="cpu")
    MR2LinearClassifier(max_iter=2, device="cpu").fit(X[:500], y[:500])  # torch's warm-up
    print(
        f"{len(y)} × {X.shape[1]} L2-normalised float32 train, {len(yt)} test, "
        f"{len(np.unique(y))} classes, tol={args.tol}, torch threads={torch.get_num_threads()}"
        + (f", from {args.store}" if args.store else ", synthetic")
    )
    header = f"{'model':<38}{'fit s':>8}{'× linear':>10}{'iters':>7}{'objective':>11}{'acc %':>8}"
    print(header)
    print("-" * len(header))
    rows, base = [], None

    def report(name, seconds, n_iter, loss, acc):
        ratio = seconds / base if base else float("nan")
        loss_text = f"{loss:11.6f}" if loss is not None else f"{'':>11}"
        print(f"{name:<38}{seconds:8.2f}{ratio:9.2f}×{n_iter:7d}{loss_text}{100 * acc:8.2f}")
        rows.append(dict(model=name, fit_s=seconds, ratio_to_linear=ratio, n_iter=n_iter,
                         objective=loss, accuracy=100 * acc))  # fmt: skip

    sk = LogisticRegression(C=args.C, tol=args.tol, max_iter=args.max_iter)
    seconds, _ = timed(lambda: sk.fit(X, y))
    report(f"LogisticRegression (sklearn) C={args.C:g}", seconds, int(sk.n_iter_[0]), None,
           sk.score(Xt, yt))  # fmt: skip
    linear = MR2LinearClassifier(c_bar=None, C=args.C, **common)
    seconds, _ = timed(lambda: linear.fit(X, y))
    base = seconds
    report(f"MR2 linear, c_bar=None, C={args.C:g}", seconds, linear.n_iter_, None,
           linear.score(Xt, yt))  # fmt: skip
    for scale in args.scales:
        cosine = MR2LinearClassifier(head="cosine", scale=scale, **common)
        seconds, _ = timed(lambda cosine=cosine: cosine.fit(X, y))
        margins = cosine.margins_
        report(f"MR2 cosine, scale={scale:g}", seconds, cosine.n_iter_,
               objective(X, y, cosine.coef_, margins), cosine.score(Xt, yt))  # fmt: skip
        if not args.no_before:
            seconds, (coef, n_iter) = timed(
                lambda s=scale, m=margins: cosine_lbfgs_before(X, y, s, m, args.tol, args.max_iter)
            )
            acc = np.mean(np.argmax(Xt @ coef.T, axis=1) == yt)
            report("  before (autograd, 10 pairs, tol in W)", seconds, n_iter,
                   objective(X, y, coef, margins), acc)  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
