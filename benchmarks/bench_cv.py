"""Search time of MR2LinearClassifierCV against LogisticRegressionCV and GridSearchCV.

The same synthetic features as bench_fit.py, the same Cs and the same folds for every
search; the table prints each search's fit time, its speed-up over LogisticRegressionCV,
the C it chose and the refitted model's test accuracy. MR² runs twice: as the estimator
chooses to solve the folds (one batched problem, or fold by fold), then the other way. With
CUDA present, MR² also runs on the GPU, both ways. ``--json PATH`` writes the rows.

    python benchmarks/bench_cv.py                                    # 50,000 × 768, 100 classes
    python benchmarks/bench_cv.py --n-samples 5000 --n-classes 20    # quick look
    python benchmarks/bench_cv.py --skip lrcv --skip grid            # MR² alone, both ways
    python benchmarks/bench_cv.py --skip lrcv --skip grid --skip cpu # the GPU rows alone
    python benchmarks/bench_cv.py --skip lrcv --skip grid --hdf5 runs/cv_X.h5  # and from HDF5

``--hdf5 PATH`` writes the training rows to a new HDF5 file at PATH (removed at the end) and
adds a row for the estimator's own search on that dataset, read from the file as the search
goes (from the page cache, once written): its peer is the row above it, the same numbers in
memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.model_selection import GridSearchCV, StratifiedKFold

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import (  # noqa: E402
    AT_LEAST_1,
    SEED,
    check_feature_arguments,
    check_output,
    check_two_classes,
    check_values,
    make_features,
    threads,
    timed_fit,
    untrained_test_rows,
    write_whole,
)

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV  # noqa: E402

# The row of the search on the training rows stored in HDF5 (``--hdf5``).
_FROM_HDF5 = "MR2LinearClassifierCV cpu, HDF5 store"


@contextlib.contextmanager
def _stored(path: Path | None, X: np.ndarray):
    """The rows ``X`` as a dataset of a new HDF5 file at ``path``, open for reading (None
    where ``path`` is None); the file removed at the end."""
    if path is None:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with h5py.File(path, "w-") as f:
            f.create_dataset("X", data=X, chunks=True)
        with h5py.File(path, "r") as f:
            yield f["X"]
    finally:
        path.unlink(missing_ok=True)


def _timed_row(name: str, model, X, y, X_test, y_test) -> dict:
    """A search's row: its fit time on ``X``, the C it chose, its test accuracy."""
    seconds = timed_fit(model, X, y)
    C = getattr(model, "best_params_", {}).get("C", getattr(model, "C_", None))
    return {
        "model": name,
        "seconds": seconds,
        "C": float(np.ravel(C)[0]),
        "test_accuracy": float(model.score(X_test, y_test)),
    }


class FoldByFold(MR2LinearClassifierCV):
    """The search with each fold's path solved on its own, never as one batched problem."""

    _batch_folds = False


class Batched(MR2LinearClassifierCV):
    """The search with the folds always solved as one batched problem."""

    _batch_folds = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=50_000)
    parser.add_argument("--n-features", type=int, default=768)
    parser.add_argument("--n-classes", type=int, default=100)
    parser.add_argument("--n-Cs", type=int, default=20, help="np.logspace(-4, 4, n) as sklearn")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("grid", "lrcv", "cpu"),
        help="leave a peer out (speed-ups are then against the first row)",
    )
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    parser.add_argument(
        "--hdf5",
        type=Path,
        help="also search the training rows as an HDF5 dataset, written to this new file "
        "(removed at the end)",
    )
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # (an OSError after the run)
    check_output(parser, "--hdf5", args.hdf5)
    if args.hdf5 is not None and args.hdf5.exists():  # (a scratch file: never overwritten)
        parser.error(f"--hdf5 takes a new file to write, got the existing {args.hdf5}")
    if args.hdf5 is not None and "cpu" in args.skip:
        parser.error("--hdf5 adds a row to the CPU rows, which --skip cpu leaves out")
    check_feature_arguments(parser, args)
    check_values(parser, args, SEED, "--seed")
    check_values(parser, args, AT_LEAST_1, "--max-iter")  # (0: searches of no iteration, timed)
    if args.folds < 2:
        parser.error(f"--folds must be at least 2; got {args.folds}")
    if args.n_Cs < 1:
        parser.error(f"--n-Cs must be at least 1; got {args.n_Cs}")
    if args.n_samples < args.folds:  # (scikit-learn's ValueError, after the data were made)
        parser.error(f"--n-samples must be at least --folds ({args.folds}); got {args.n_samples}")

    X, y = make_features(args.n_samples + 10_000, args.n_features, args.n_classes, args.seed)
    X, X_test, y, y_test = (
        X[: args.n_samples],
        X[args.n_samples :],
        y[: args.n_samples],
        y[args.n_samples :],
    )
    check_two_classes(parser, y)
    largest = np.bincount(y).max()
    if args.folds > largest:  # (StratifiedKFold's ValueError, the data made)
        parser.error(f"--folds must be at most the training rows of the largest class "
                     f"({largest} of --n-samples {args.n_samples}); got {args.folds}")  # fmt: skip
    Cs = np.logspace(-4, 4, args.n_Cs)
    folds = list(StratifiedKFold(args.folds, shuffle=True, random_state=0).split(X, y))
    common = dict(tol=1e-4, max_iter=args.max_iter)
    # scikit-learn ≥ 1.8 asks for its current attributes and an L2-only path (else a
    # FutureWarning at each fit, the warm-up's included).
    current = "use_legacy_attributes" in LogisticRegressionCV().get_params()
    new_api = dict(l1_ratios=(0,), use_legacy_attributes=False) if current else {}
    lrcv = dict(n_jobs=-1, scoring="accuracy", **new_api)  # the search's and its warm-up's
    models = {}
    if "lrcv" not in args.skip:
        models["LogisticRegressionCV(n_jobs=-1)"] = LogisticRegressionCV(
            Cs=Cs, cv=folds, **lrcv, **common
        )
    if "cpu" not in args.skip:
        # The estimator's own choice first, then the other way of solving the folds.
        batched = args.folds * args.n_classes <= MR2LinearClassifierCV._BATCH_MAX_COLUMNS_CPU
        ways = [("batched", Batched), ("fold by fold", FoldByFold)]
        for i, (way, cls) in enumerate(ways if batched else ways[::-1]):
            models[f"MR2LinearClassifierCV cpu, {way}"] = cls(
                Cs, cv=folds, c_bar=None, device="cpu", **common
            )
            if i == 0 and args.hdf5 is not None:  # the same choice, the rows in the file
                models[_FROM_HDF5] = MR2LinearClassifierCV(
                    Cs, cv=folds, c_bar=None, device="cpu", **common
                )
    if "grid" not in args.skip:
        models["GridSearchCV(LogisticRegression)"] = GridSearchCV(
            LogisticRegression(**common), {"C": Cs}, cv=folds, n_jobs=-1
        )
    if torch.cuda.is_available():
        for dtype in ("float32",):
            models[f"MR2LinearClassifierCV cuda {dtype}"] = MR2LinearClassifierCV(
                Cs, cv=folds, c_bar=None, device="cuda", **common
            )
            models[f"MR2LinearClassifierCV cuda {dtype}, fold by fold"] = FoldByFold(
                Cs, cv=folds, c_bar=None, device="cuda", **common
            )
    if not models:
        parser.error("every search was skipped (the GPU rows need CUDA)")
    # Warm up torch's lazy initialisation so that it is not billed to the first search, and
    # joblib's worker processes, which the n_jobs=-1 searches share: their start and their
    # imports of scikit-learn's fitting code (a worker that only ran abs() still made the
    # first LogisticRegressionCV pay 13 s of imports on a small problem).
    timed_fit(MR2LinearClassifier(max_iter=2, device="cpu"), X[:500], y[:500])
    if "lrcv" not in args.skip or "grid" not in args.skip:  # (no worker to start otherwise)
        timed_fit(LogisticRegressionCV(Cs=2, cv=2, max_iter=5, **lrcv), X[:500], y[:500])
    if torch.cuda.is_available():  # the CUDA context, cuBLAS handles and lazy kernels
        timed_fit(MR2LinearClassifierCV([1.0], cv=2, device="cuda"), X[:500], y[:500])
    rows = []
    with _stored(args.hdf5, X) as stored:
        for name, model in models.items():
            rows.append(_timed_row(name, model, stored if name == _FROM_HDF5 else X, y,
                                   X_test, y_test))  # fmt: skip
    base = rows[0]["seconds"]
    print(
        f"{args.n_samples} × {args.n_features}, {args.n_classes} classes, "
        f"{args.n_Cs} Cs × {args.folds} folds, {threads()}; LogisticRegressionCV computes "
        "in float64 (it converts X), the others in float32"
    )
    if untrained := untrained_test_rows(y, y_test):
        print(untrained)
    print(f"{'search':38s} {'fit s':>8s} {'speed-up':>9s} {'C':>10s} {'test acc':>9s}")
    for row in rows:
        row["speedup"] = base / row["seconds"]
        print(
            f"{row['model']:38s} {row['seconds']:8.2f} {row['speedup']:8.1f}× "
            f"{row['C']:10.4g} {100 * row['test_accuracy']:8.2f}%"
        )
    if args.json:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        write_whole(
            args.json,
            json.dumps({"args": config, "untrained_test_rows": untrained, "rows": rows}, indent=2)
            + "\n",
        )


if __name__ == "__main__":
    main()
