"""Fit time and accuracy of MR2LinearClassifier against scikit-learn's LogisticRegression.

Same synthetic features (Gaussian classes with unequal spread), same CPU, same run; the
table prints each model's fit time, its ratio to LogisticRegression, and test accuracy,
then the fit time of the class-tilted models relative to the untilted one (class_tilt=0).
With CUDA present, the MR² models are also timed on the GPU.

    python benchmarks/bench_fit.py                      # 50,000 × 768, 100 classes
    python benchmarks/bench_fit.py --offset 0           # centred features
    python benchmarks/bench_fit.py --n-samples 5000 --repeat 1    # quick look
    python benchmarks/bench_fit.py --json runs/bench_fit.json     # the table as JSON too
    python benchmarks/bench_fit.py --threads 1         # one thread for each side

The objective column is each model's own training objective at its solution, computed in
float64 from its coefficients: LogisticRegression's and the ERM row's are the same problem,
so the lower of the two went further towards the optimum.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from mr2_probe import MR2LinearClassifier
from mr2_probe._losses import tilted_class_risk
from mr2_probe._prediction import both_class_logits
from mr2_probe.metrics import classwise_summary, difficulty_groups, per_class_accuracy


def threads() -> str:
    """Each side's threads, for the header: torch's (the estimator) and the BLAS's that
    NumPy and SciPy use (scikit-learn's solvers), each at the process's settings."""
    from threadpoolctl import threadpool_info

    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    return f"torch threads={torch.get_num_threads()}, BLAS threads={max(blas, default=1)}"


def add_feature_arguments(parser) -> None:
    """The synthetic features' options (make_features'), shared with profile_fit.py."""
    parser.add_argument("--n-samples", type=int, default=50_000)
    parser.add_argument("--n-features", type=int, default=768)
    parser.add_argument("--n-classes", type=int, default=100)


def check_feature_arguments(parser, args) -> None:
    """Refuse make_features' options that leave nothing to classify (no feature, fewer than
    two classes): a traceback from the data or the first fit, after the warm-up."""
    if args.n_features < 1:
        parser.error(f"--n-features must be at least 1; got {args.n_features}")
    if args.n_classes < 2:
        parser.error(f"--n-classes must be at least 2; got {args.n_classes}")


# What an option's values must be (check_values' ``must``): its words and its test. NaN
# fails every test (its comparisons are False).
POSITIVE = "positive", lambda v: v > 0
POSITIVE_FINITE = "positive and finite", lambda v: 0 < v < math.inf
AT_LEAST_1 = "at least 1", lambda v: v >= 1
AT_LEAST_0_FINITE = "at least 0 and finite", lambda v: 0 <= v < math.inf
FINITE = "finite", math.isfinite
SEED = "between 0 and 2**32 - 1", lambda v: 0 <= v < 2**32  # NumPy's and random_state's


def check_values(parser, args, must, *options: str) -> None:
    """Refuse in one line each of ``options`` (flags, e.g. ``"--C"``) whose value, or one of
    whose values for a list, fails ``must`` (e.g. :data:`POSITIVE`): such values ended in
    scikit-learn's InvalidParameterError or NumPy's error once the data were made, or after
    minutes of fits. An option left at None is not checked."""
    words, test = must
    for option in options:
        value = getattr(args, option[2:].replace("-", "_"))
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(test(v) for v in values):
            parser.error(f"{option} must be {words}; got {value}")


def check_output(parser, option: str, path: Path | None) -> None:
    """Refuse in one line a file to write that the run could not write at its end: a
    folder, or a file under a file or in a folder this process cannot write to (an OSError
    after the run, which was lost). None is not checked."""
    if path is None:
        return
    if path.is_dir():
        parser.error(f"{option} takes a file to write, got the folder {path}")
    folder = Path(os.path.realpath(path)).parent  # (a link's target's: written through)
    while not folder.exists():  # the folders still to make: made in the first one there is
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        parser.error(f"{option} {path} cannot be written: {folder} is not a folder this "
                     "process can write in")  # fmt: skip


def check_two_classes(parser, y) -> None:
    """Refuse in one line training rows ``y`` of fewer than two classes (a row or two, a
    store's first rows of one class): the estimator's ValueError at the warm-up fit."""
    n_classes = len(np.unique(np.asarray(y)))
    if n_classes < 2:
        parser.error(f"--n-samples {len(y)} takes rows of {n_classes} class(es); two or more "
                     "are needed")  # fmt: skip


def untrained_test_rows(y, yt) -> str | None:
    """The line that says so where test rows ``yt`` hold classes that the training rows
    ``y`` lack (a store's rows in class order, its last classes beyond ``--n-samples``;
    synthetic labels of more classes than a few rows draw): every accuracy counts them
    wrong, 0% where all are, which was printed without a word."""
    untrained = ~np.isin(yt, y)
    if not untrained.any():
        return None
    classes = np.unique(yt[untrained])
    named = ", ".join(map(str, classes[:4])) + (", ..." if len(classes) > 4 else "")
    return (f"({untrained.sum()} of the {len(yt)} test rows are of classes that the "
            f"training rows lack ({named}): every model predicts them wrong)")  # fmt: skip


def check_distinct(parser, args, *options: str) -> None:
    """Refuse in one line a list option (flags, e.g. ``"--tilts"``) that repeats a value: its
    row was made and printed twice, a repeated seed counted twice in a mean, and the tables
    keyed by the value kept one of the two. An option left at None is not checked."""
    for option in options:
        values = getattr(args, option[2:].replace("-", "_"))
        if values is not None and len(set(values)) < len(values):
            parser.error(f"{option} takes each value once; got {values}")


def limit_threads(n: int | None):
    """Give torch and the BLAS (and OpenMP) n threads each; the limits to hold on to."""
    if n is None:
        return None
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    return threadpool_limits(n)


def make_features(n_samples, n_features, n_classes, seed, offset=1.0):
    """Class means on a sphere, per-class spread from 0.5× to 2×, a common offset.

    Pooled embeddings are not centred (EfficientNet-Lite0 on Fashion-MNIST: mean 0.8, std
    1.6 per feature): ``offset`` scales a shared non-negative mean vector; 0 centres them.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, n_features)).astype(np.float32)
    means *= 3.0 / np.linalg.norm(means, axis=1, keepdims=True)
    spread = np.linspace(0.5, 2.0, n_classes, dtype=np.float32)  # per dimension
    y = rng.integers(n_classes, size=n_samples)
    X = means[y] + rng.normal(size=(n_samples, n_features)).astype(np.float32) * spread[y, None]
    X += offset * np.abs(rng.normal(size=n_features)).astype(np.float32)
    return X.astype(np.float32), y


def objective(model, X, y, C) -> float:
    """The model's training objective at its coefficients, in float64: the (tilted) class
    risk of the margin cross-entropy plus ½‖W‖² / (C·n), as MR2LinearClassifier defines it
    (LogisticRegression's is the case of unit margins and no tilt, its objective divided by
    C·n)."""
    W = torch.as_tensor(model.coef_, dtype=torch.float64)
    # Two classes: one row, the binomial model's logits (0, z).
    z = torch.as_tensor(X, dtype=torch.float64) @ W.T + torch.as_tensor(model.intercept_)
    z = both_class_logits(z)
    margins = torch.as_tensor(getattr(model, "margins_", np.ones(z.shape[1])))
    target = torch.as_tensor(np.searchsorted(model.classes_, y))
    loss = torch.nn.functional.cross_entropy(z / margins[target, None], target, reduction="none")
    counts = torch.bincount(target, minlength=z.shape[1]).double()
    class_loss = torch.zeros_like(counts).index_add_(0, target, loss) / counts.clamp(min=1)
    risk, _ = tilted_class_risk(class_loss, counts / len(y), getattr(model, "class_tilt", 0.0))
    return float(risk + 0.5 * (W * W).sum() / (C * len(y)))


def timed_fit(model, X, y, repeat=1):
    """Best wall time of ``repeat`` fits (the machine's noise only ever adds time)."""
    times = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X, y)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_feature_arguments(parser)
    parser.add_argument("--C", type=float, default=1.0)
    # High enough for every model to reach tol: the comparison is time to the optimum.
    parser.add_argument("--max-iter", type=int, default=1000)
    parser.add_argument("--offset", type=float, default=1.0, help="common feature mean; 0 centres")
    parser.add_argument("--repeat", type=int, default=3, help="fits per model, best time kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tilts", type=float, nargs="*", default=[1.0, 5.0], help="class_tilt rows"
    )
    parser.add_argument(
        "--devices",
        default="cpu,cuda",
        help="devices of the MR2 rows, cuda where available (the peer always runs on the CPU)",
    )
    parser.add_argument(
        "--json", type=Path, help="also write the results to this JSON file (after each row)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="threads of each side: torch's, and the BLAS's and OpenMP's that scikit-learn "
        "uses (default: each library's own)",
    )
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # (an OSError after the first row)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1; got {args.repeat}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1; got {args.threads}")
    check_feature_arguments(parser, args)
    check_values(parser, args, POSITIVE, "--C")
    check_values(parser, args, AT_LEAST_1, "--max-iter")  # (0: fits of no iteration, timed)
    check_values(parser, args, AT_LEAST_0_FINITE, "--tilts")
    check_distinct(parser, args, "--tilts")  # (two rows, and one ratio: keyed by the name)
    check_values(parser, args, FINITE, "--offset")
    check_values(parser, args, SEED, "--seed")
    if args.n_samples < 5:  # a test row per five training rows
        parser.error(f"--n-samples must be at least 5 (else no test rows); got {args.n_samples}")
    devices = set(args.devices.split(","))
    if not devices <= {"cpu", "cuda"}:
        parser.error(f"--devices takes cpu, cuda or both; got {args.devices!r}")
    if not torch.cuda.is_available():
        devices.discard("cuda")
        if not devices:
            parser.error(f"--devices {args.devices}: no CUDA device here")
    _limits = limit_threads(args.threads)  # noqa: F841  (held for the whole run)

    X, y = make_features(
        args.n_samples * 6 // 5, args.n_features, args.n_classes, args.seed, args.offset
    )
    n_train = args.n_samples
    X_train, y_train, X_test, y_test = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    check_two_classes(parser, y_train)
    # Warm up torch's lazy initialisation so that it is not billed to the first model.
    timed_fit(MR2LinearClassifier(max_iter=2, device="cpu"), X_train[:500], y_train[:500])

    common = dict(C=args.C, max_iter=args.max_iter)
    models = [("LogisticRegression (sklearn)", "cpu", LogisticRegression(**common))]
    if "cuda" in devices:
        timed_fit(MR2LinearClassifier(max_iter=2, device="cuda"), X_train[:500], y_train[:500])
    for device in [d for d in ("cpu", "cuda") if d in devices]:
        models += [
            (
                "MR2 c_bar=None (ERM)",
                device,
                MR2LinearClassifier(c_bar=None, device=device, **common),
            ),
            ("MR2 c_bar=1", device, MR2LinearClassifier(c_bar=1.0, device=device, **common)),
        ]
        models += [
            (
                f"MR2 c_bar=1, class_tilt={t:g}",
                device,
                MR2LinearClassifier(class_tilt=t, device=device, **common),
            )
            for t in args.tilts
        ]

    print(
        f"{n_train} × {args.n_features} float32 train, {len(y_test)} test, "
        f"{args.n_classes} classes, offset={args.offset}, C={args.C}, tol=1e-4, "
        f"max_iter={args.max_iter}, best of {args.repeat}, "
        f"{threads()}"
    )
    if untrained := untrained_test_rows(y_train, y_test):
        print(untrained)
    header = (
        f"{'model':<30}{'device':>7}{'fit s':>9}{'speed-up':>10}{'iters':>7}"
        f"{'objective':>11}{'acc %':>8}{'hard %':>8}{'worst %':>9}"
    )
    print(header)
    print("-" * len(header))
    base_time, groups, times, rows = None, None, {}, []
    for name, device, model in models:
        seconds = timed_fit(model, X_train, y_train, args.repeat)
        times[name, device] = seconds
        pred = model.predict(X_test)
        if groups is None:
            base_time = seconds
            groups = difficulty_groups(per_class_accuracy(y_test, pred))
        s = classwise_summary(y_test, pred, groups)
        n_iter = int(np.max(model.n_iter_))
        value = objective(model, X_train, y_train, args.C)
        print(
            f"{name:<30}{device:>7}{seconds:9.2f}{base_time / seconds:9.1f}×{n_iter:7d}"
            f"{value:11.6f}{100 * s['overall']:8.2f}{100 * s['hard']:8.2f}{100 * s['worst']:9.2f}"
        )
        rows.append(
            {
                "model": name,
                "device": device,
                "fit_s": seconds,
                "speed_up": base_time / seconds,
                "n_iter": n_iter,
                "objective": value,
                **{f"{k}_accuracy": float(s[k]) for k in ("overall", "hard", "worst")},
            }
        )
        _write_json(args, len(y_test), rows, [], untrained)  # a run stopped early keeps its rows
    tilt_ratios = []
    for (name, device), seconds in times.items():
        if "class_tilt" in name:
            ratio = seconds / times["MR2 c_bar=1", device]
            print(f"{name} on {device}: {ratio:.2f}× the fit time of class_tilt=0")
            tilt_ratios.append({"model": name, "device": device, "fit_time_ratio": ratio})
    _write_json(args, len(y_test), rows, tilt_ratios, untrained)


def _write_json(args, n_test: int, rows: list, tilt_ratios: list, untrained: str | None) -> None:
    """The run's rows to --json; ``untrained``: its line on test rows of classes the
    training rows lack, printed above the table (None where there are none)."""
    if args.json is None:
        return
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "config": config,
        "n_test": n_test,
        "untrained_test_rows": untrained,
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
        "tilt_fit_time_ratios": tilt_ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_whole(args.json, json.dumps(result, indent=2) + "\n")


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: beside it first, then renamed into its place, so
    that a run stopped while writing keeps the last. A symbolic link is written through, to
    its target, as ``open(path, "w")`` writes it: the rename replaced the link itself with
    a file, and its target kept the old results. The target's folders are made where
    missing, as check_output takes them (a FileNotFoundError after the whole run)."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".tmp")
    partial.write_text(text)
    partial.replace(target)


if __name__ == "__main__":
    main()
