"""Grid search for a class-fair probe: GridSearchCV with class-wise scorers and refit.

Run ``python examples/grid_search.py`` (seconds on a CPU, no download). Searches c_bar × C
of MR2LinearClassifier on half of scikit-learn's digits with five scores per candidate
(accuracy, balanced accuracy, worst class, hard tercile, spread), refits the candidate
best on ``--refit``, and compares it with the ERM probe on the other half, class by class.
``--dask`` runs the search on a local Dask cluster through joblib's Dask backend, exactly as
it would on a multi-machine cluster given the scheduler's address.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings

import joblib
import numpy as np
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, StratifiedKFold, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mr2_probe import MR2LinearClassifier
from mr2_probe.metrics import classwise_scorers
from mr2_probe.report import classwise_report

SCORERS = classwise_scorers()


def dask_backend(n_workers: int) -> contextlib.ExitStack:
    """A local Dask cluster selected as joblib's backend until the stack closes."""
    from dask.distributed import Client, LocalCluster

    stack = contextlib.ExitStack()
    cluster = stack.enter_context(
        LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False)
    )
    stack.enter_context(Client(cluster))
    stack.enter_context(joblib.parallel_config(backend="dask"))
    return stack


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--refit",
        choices=list(SCORERS),
        default="worst_class",
        help="the score the best candidate is chosen and refitted by (default: worst_class)",
    )
    parser.add_argument(
        "--c-bar",
        type=float,
        nargs="+",
        default=[1.0, 2.0],
        help="c_bar values searched beside None, the ERM probe (default: 1 2)",
    )
    parser.add_argument(
        "--C",
        type=float,
        nargs="+",
        default=[0.02, 0.1],
        help="C values searched (default: 0.02 0.1)",
    )
    parser.add_argument("--cv", type=int, default=3, help="number of folds (default: 3)")
    parser.add_argument(
        "--max-iter", type=int, default=100, help="L-BFGS iterations (default: 100)"
    )
    parser.add_argument(
        "--dask",
        type=int,
        metavar="N_WORKERS",
        default=0,
        help="run the search on a local Dask cluster of this many workers (default: 0, no Dask)",
    )
    parser.add_argument("--seed", type=int, default=0, help="train/test split seed (default: 0)")
    args = parser.parse_args(argv)
    # One line before any fit: GridSearchCV scores a candidate that fails as NaN and goes
    # on (--c-bar 0 was left out of the search with a warning per fold), and max_iter=0
    # reports the untrained starting point.
    bad = [("--C", v, "positive numbers") for v in args.C if not v > 0]  # (inf: no penalty)
    finite = "positive finite numbers"
    bad += [("--c-bar", v, finite) for v in args.c_bar if not 0 < v < float("inf")]
    if bad:
        option, value, what = bad[0]
        parser.error(f"{option} takes {what}, got {value:g}")
    # (--dask -1 waited 10 s for a worker after the data was read, then ended in a traceback)
    for option, value, least in (
        ("--cv", args.cv, 2), ("--max-iter", args.max_iter, 1), ("--dask", args.dask, 0)
    ):  # fmt: skip
        if value < least:
            parser.error(f"{option} must be at least {least}, got {value}")
    if not 0 <= args.seed < 2**32:  # NumPy's seeds, as train_test_split takes them
        parser.error(f"--seed must be between 0 and 2**32 - 1, got {args.seed}")
    if args.dask:  # (without dask installed: a ModuleNotFoundError traceback)
        try:
            import dask.distributed  # noqa: F401
        except ImportError:
            parser.error('--dask needs the dask extra: pip install "mr2-probe[dask]"')

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=args.seed
    )
    # (StratifiedKFold's ValueError ended in a traceback)
    fewest = int(np.bincount(y_train).min())
    if args.cv > fewest:
        parser.error(
            f"--cv must be at most {fewest}, the fewest training images of a class, got {args.cv}"
        )
    pipe = make_pipeline(StandardScaler(), MR2LinearClassifier(max_iter=args.max_iter))
    # c_bar=None is the ERM probe: the search decides whether margins are worth it.
    grid = {
        "mr2linearclassifier__c_bar": [None, *args.c_bar],
        "mr2linearclassifier__C": args.C,
    }
    # The hard group here is ranked within each validation fold ("hard_tercile"), so no
    # class ranking computed on a fold leaks into the choice.
    search = GridSearchCV(
        pipe, grid, scoring=SCORERS, refit=args.refit, cv=StratifiedKFold(args.cv)
    )
    backend = dask_backend(args.dask) if args.dask else contextlib.nullcontext()
    with backend, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X_train, y_train)
        erm = clone(search.estimator).set_params(
            mr2linearclassifier__c_bar=None,
            mr2linearclassifier__C=search.best_params_["mr2linearclassifier__C"],
        )
        erm.fit(X_train, y_train)

    best = {key.split("__")[1]: value for key, value in search.best_params_.items()}
    print(f"best parameters for {args.refit}: {best}")
    if args.refit == "class_std":  # its scorer negates the spread, so that greater is better
        spread = -100 * search.best_score_
        print(f"best cross-validated class_std: {spread:.2f} pt (spread of per-class accuracy, "
              "lower is better)")  # fmt: skip
    else:
        print(f"best cross-validated {args.refit}: {100 * search.best_score_:.2f}%")
    report = classwise_report(
        {"ERM (same C)": erm, f"best for {args.refit}": search.best_estimator_},
        y_test,
        X_test,
    )
    print(report.to_text())
    return search, report


if __name__ == "__main__":
    main()
