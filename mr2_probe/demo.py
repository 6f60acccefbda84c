"""Built-in demonstration: ERM versus MR² probes on scikit-learn's digits, class by class.

Run ``python -m mr2_probe.demo``; no download, no GPU needed.
"""

from __future__ import annotations

import argparse
import warnings

from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ._classifier import MR2LinearClassifier
from .report import classwise_report


def main(argv=None):
    # Named as it is run: argparse's default, the file's name, gave "usage: demo.py".
    parser = argparse.ArgumentParser(
        prog="python -m mr2_probe.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--C", type=float, default=0.05, help="inverse L2 strength")
    parser.add_argument("--seed", type=int, default=0, help="split and minibatch seed")
    args = parser.parse_args(argv)
    # One line, as argparse's own refusals, rather than an estimator's traceback.
    if not args.C > 0:
        parser.error(f"--C must be a positive number, got {args.C:g}")
    if not 0 <= args.seed < 2**32:  # NumPy's seeds, as train_test_split takes them
        parser.error(f"--seed must be between 0 and 2**32 - 1, got {args.seed}")

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=args.seed
    )
    probes = {
        "ERM (LogisticRegression)": LogisticRegression(C=args.C, max_iter=1000),
        "ERM (MR2, c_bar=None)": MR2LinearClassifier(c_bar=None, C=args.C),
        "MR2 margins (c_bar=1)": MR2LinearClassifier(c_bar=1.0, C=args.C),
        # The paper's c̄, λ and p; the compactness loss acts on a learned projection P of
        # the frozen features with τ = 2 s̄, which is this library's extension.
        "MR2 + compactness on P (c_bar=2, lam=0.5, p=3)": MR2LinearClassifier(
            c_bar=2.0, lam=0.5, p=3, C=args.C, random_state=args.seed
        ),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        models = {
            name: make_pipeline(StandardScaler(), probe).fit(X_train, y_train)
            for name, probe in probes.items()
        }
    print(f"digits: {len(y_train)} train / {len(y_test)} test images, 10 classes")
    report = classwise_report(models, y_test, X_test)
    print(report.to_text())
    return report


if __name__ == "__main__":
    main()
