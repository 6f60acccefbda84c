"""What a cosine head's scale search gains from carrying its L-BFGS pairs, on digits.

``MR2LinearClassifierCV(head="cosine", Cs=scales)`` carries each fold's L-BFGS pairs from
one scale to the next while it is within a factor of 4 of the scale they were formed at.
For several grids of scales and CLIP's bisection (3 folds, unit-norm digits), one run
prints the iterations summed over the folds and scales with that rule, with the pairs
carried to any scale, and with none carried, with the scale each chooses. Then, on the
first 600 digits, the path over ten scales from 1 to 10⁴ against GridSearchCV over
MR2LinearClassifier (every scale fitted cold), to show where a non-convex path may
choose differently.

    python benchmarks/bench_scale_path.py
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, StratifiedKFold

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import AT_LEAST_0_FINITE, check_values  # noqa: E402

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV  # noqa: E402
from mr2_probe import _batched as batched  # noqa: E402

GRIDS = {
    "4 to 64, steps of 2": [4.0, 8.0, 16.0, 32.0, 64.0],
    "12.5 to 100, steps of 2": [12.5, 25.0, 50.0, 100.0],
    "3 to 300, steps of 3.2": list(np.logspace(np.log10(3), np.log10(300), 5)),
    "2 to 128, steps of 4": [2.0, 8.0, 32.0, 128.0],
    "1 to 1000, steps of 10": [1.0, 10.0, 100.0, 1000.0],
    "bisect": "bisect",
}
RULES = {"within 4x (default)": batched._CARRY_SCALE_RATIO, "any scale": np.inf, "none": 1.0}
# A cell's width: "11996 it,   0.125 (16 warn)" at --tol 0 (27 characters) filled the 24 it
# had, and ran into the cell before it.
CELL = 28


def table_row(first: str, cells) -> str:
    """A row of the table: each cell right-aligned in its column, two spaces at least
    after the one before (a cell wider than its column moves those after it along)."""
    return f"{first:26s}" + "".join(f"  {cell:>{CELL}s}" for cell in cells)


def search(X, y, Cs, ratio, **params):
    """The search with pairs carried within ``ratio``; its warnings counted."""
    default = batched._CARRY_SCALE_RATIO
    batched._CARRY_SCALE_RATIO = ratio
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            clf = MR2LinearClassifierCV(Cs, head="cosine", device="cpu", **params).fit(X, y)
    finally:
        batched._CARRY_SCALE_RATIO = default
    return clf, sum(issubclass(w.category, ConvergenceWarning) for w in caught)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tol", type=float, default=1e-5)
    args = parser.parse_args(argv)
    check_values(parser, args, AT_LEAST_0_FINITE, "--tol")
    torch.manual_seed(0)
    X, y = load_digits(return_X_y=True)
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    print(f"digits {unit.shape[0]} × {unit.shape[1]}, unit rows, 3 folds, tol={args.tol}")
    header = table_row("scales", RULES)
    print(header)
    print("-" * len(header))
    for name, Cs in GRIDS.items():
        cells = []
        for ratio in RULES.values():
            params = dict(cv=3, tol=args.tol, max_iter=3000)
            clf, warned = search(unit, y, Cs, ratio, **params)
            mark = f" ({warned} warn)" if warned else ""
            cells.append(f"{int(clf.n_iter_.sum())} it, {clf.C_:7.3g}{mark}")
        print(table_row(name, cells))

    X, y = X[:600] / 16, y[:600]
    scales = np.logspace(0, 4, 10)
    cv = StratifiedKFold(3)
    path, _ = search(X, y, scales, batched._CARRY_SCALE_RATIO, cv=cv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator = MR2LinearClassifier(head="cosine", device="cpu")
        grid = GridSearchCV(estimator, {"scale": scales}, cv=cv).fit(X, y)
    mean = path.scores_[0].mean(0)
    print(f"\nfirst 600 digits, pixels / 16, 3 folds, scales {scales[0]:g} to {scales[-1]:g}")
    print(f"{'search':34s}{'scale':>10s}{'held-out':>10s}{'iters':>8s}")
    print(f"{'MR2LinearClassifierCV (path)':34s}{path.C_:10.4g}{mean.max():10.3f}"
          f"{int(path.n_iter_.sum()):8d}")  # fmt: skip
    best = grid.best_params_["scale"]
    print(f"{'GridSearchCV (cold fits)':34s}{best:10.4g}{grid.best_score_:10.3f}{'':>8s}")


if __name__ == "__main__":
    main()
