"""Fits on features of a large common scale, against LogisticRegression, in one run.

Three overlapping classes of 10 standard normal features (400 rows, NumPy's default_rng
seed 2) are multiplied by a scale s. With ``c_bar=None`` the estimator minimises
LogisticRegression's objective; both run at C = 1 (at s = 1; at C / s², which keeps the
same solution, with ``--same-problem``). For each scale the script prints each solver's
iterations, training accuracy and mean cross-entropy at its solution, and the ratio of
iterations. The intercept's scale (``intercept_scale``) is what the large scales test.

    python benchmarks/bench_feature_scale.py
    python benchmarks/bench_feature_scale.py --same-problem
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import POSITIVE_FINITE, check_distinct, check_values  # noqa: E402

from mr2_probe import MR2LinearClassifier  # noqa: E402


def data(n=400, seed=2):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 10))
    y = (Z[:, 0] + Z[:, 1] + 0.5 * rng.normal(size=n) > 0).astype(int) + (Z[:, 2] > 1)
    return Z, y


def cross_entropy(model, X, y) -> float:
    z = model.decision_function(X)
    return float(np.mean(logsumexp(z, axis=1) - z[np.arange(len(y)), y]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 1e3, 1e6])
    parser.add_argument("--same-problem", action="store_true", help="C / s² at scale s")
    parser.add_argument("--max-iter", type=int, default=1000)
    args = parser.parse_args(argv)
    check_values(parser, args, POSITIVE_FINITE, "--scales")  # (inf: a ValueError at the fit)
    check_distinct(parser, args, "--scales")
    if args.max_iter < 1:
        parser.error(f"--max-iter must be at least 1; got {args.max_iter}")
    Z, y = data()
    print(f"{'scale':>8}  {'solver':<28}{'iters':>6}{'train acc':>11}{'mean CE':>10}{'ratio':>8}")
    for s in args.scales:
        X, C = Z * s, (1.0 / s**2 if args.same_problem else 1.0)
        models = {
            "LogisticRegression (sklearn)": LogisticRegression(C=C, max_iter=args.max_iter),
            "MR2 c_bar=None (ERM)": MR2LinearClassifier(
                c_bar=None, C=C, max_iter=args.max_iter, device="cpu"
            ),
        }
        iters = {}
        for name, model in models.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConvergenceWarning)
                model.fit(X, y)
            n_iter = int(np.max(model.n_iter_))
            iters[name] = n_iter
            mark = "*" if any(issubclass(w.category, ConvergenceWarning) for w in caught) else " "
            ratio = n_iter / iters["LogisticRegression (sklearn)"]
            print(f"{s:8.0e}  {name:<28}{n_iter:6d}{mark}{model.score(X, y):10.3f}"
                  f"{cross_entropy(model, X, y):10.4f}{ratio:7.2f}×")  # fmt: skip
    print("(* a ConvergenceWarning; ratio: iterations against LogisticRegression's)")


if __name__ == "__main__":
    main()
