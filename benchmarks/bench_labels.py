"""The class-wise scores on text labels held as objects against the same as NumPy's text.

Labels read from a CSV are a pandas column of Python strings (dtype object); the same labels
as a NumPy unicode array are the peer. For each score this times both in one process, the
best of ``--repeats`` calls each, the two taking turns, and prints the ratio
object / unicode; the last column says whether the two gave the same result.

    python benchmarks/bench_labels.py                     # ImageNet's size: 1.28 M, 1000 classes
    python benchmarks/bench_labels.py --samples 100000 --classes 100 --repeats 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mr2_probe.metrics import (
    class_groups,
    classwise_summary,
    per_class_accuracy,
    worst_class_accuracy,
)
from mr2_probe.report import classwise_report

SCORES = {
    "per_class_accuracy": per_class_accuracy,
    "worst_class_accuracy": worst_class_accuracy,
    "class_groups": class_groups,
    "classwise_summary": classwise_summary,
    "classwise_report": lambda y, pred: classwise_report({"erm": pred, "mr2": y[::-1]}, y),
}


def make_labels(samples: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """True and predicted class names (NumPy's text), ImageNet's synset ids in form."""
    rng = np.random.default_rng(seed)
    names = np.array([f"n{k:08d}" for k in range(classes)])
    return names[rng.integers(0, classes, samples)], names[rng.integers(0, classes, samples)]


def as_objects(labels: np.ndarray):
    """``labels`` as a pandas column of Python strings, as read from a CSV (without pandas:
    a NumPy array of objects)."""
    try:
        import pandas as pd
    except ImportError:
        return labels.astype(object)
    return pd.Series(labels, dtype=object)


def best_times(score, ways: dict, repeats: int) -> tuple[dict, dict]:
    """The best of ``repeats`` calls of ``score`` on each way's labels, in seconds, the
    ways taking turns (a machine's load then weighs on both alike); and their results."""
    times, results = dict.fromkeys(ways, float("inf")), {}
    for _ in range(repeats):
        for name, labels in ways.items():
            start = time.perf_counter()
            results[name] = score(*labels)
            times[name] = min(times[name], time.perf_counter() - start)
    return times, results


def same(a, b) -> bool:
    """Whether two scores' results are equal (NaN equal to NaN)."""
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b, equal_nan=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            x == y or (x != x and y != y) for x, y in zip(a.values(), b.values(), strict=True)
        )
    return a == b or (a != a and b != b)  # (a report compares as a dataclass)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_280_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scores", nargs="+", choices=list(SCORES), default=list(SCORES))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    for option in ("samples", "classes"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1; got {getattr(args, option)}")
    y, pred = make_labels(args.samples, args.classes)
    ways = {"unicode": (y, pred), "object": (as_objects(y), as_objects(pred))}
    kind = type(ways["object"][0]).__name__
    print(
        f"{args.samples:,} labels, {args.classes} classes; NumPy's {y.dtype} against a "
        f"{kind} of Python strings; best of {args.repeats}; seconds"
    )
    header = f"{'score':<22} {'unicode':>8} {'object':>8} {'object/unicode':>15} {'same':>5}"
    print(header)
    print("-" * len(header))
    for name in args.scores:
        times, results = best_times(SCORES[name], ways, args.repeats)
        ratio = times["object"] / times["unicode"]
        equal = "yes" if same(results["unicode"], results["object"]) else "no"
        print(
            f"{name:<22} {times['unicode']:>8.3f} {times['object']:>8.3f} {ratio:>14.2f}×"
            f" {equal:>5}"
        )


if __name__ == "__main__":
    main()
