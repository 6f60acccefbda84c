"""plot_class_accuracy against its previous bars, one matplotlib Rectangle per bar.

The figure draws each model's bars as one PolyCollection. For each class count this times
the whole call (drawing and writing the PNG with the Agg backend) two ways in one
process: as it is, and with the bars drawn by ``ax.bar`` (the implementation before, kept
here as ``bars_as_patches``), everything else alike. Each time is the best of
``--repeats`` calls, the two ways taking turns; the last column says whether the two PNGs
have the same pixels.

    python benchmarks/bench_plots.py
    python benchmarks/bench_plots.py --classes 10 1000 --repeats 5 --keep runs/plots
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np

from mr2_probe import plotting
from mr2_probe.report import classwise_report

CLASSES = [10, 100, 1000]


def make_report(k: int, per_class: int = 20, seed: int = 0):
    """Two models' predictions of ``k`` classes, each class right at a rate of its own."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), per_class)
    rate = np.repeat(rng.uniform(0.3, 0.98, size=k), per_class)
    erm, mr2 = (np.where(rng.random(len(y)) < rate, y, (y + 1) % k) for _ in range(2))
    return classwise_report({"ERM": erm, "MR2": mr2}, y)


def bars_as_patches(ax, centres, heights, width, colours):
    """The bars as ``ax.bar`` draws them: one Rectangle each."""
    return ax.bar(centres, heights, width=width, color=colours)


@contextlib.contextmanager
def bars(draw):
    """plot_class_accuracy with its bars drawn by ``draw`` (None: as it is)."""
    previous = plotting._bars
    plotting._bars = draw or previous
    try:
        yield
    finally:
        plotting._bars = previous


WAYS = {"collection": None, "ax.bar": bars_as_patches}


def best_times(report, folder: Path, repeats: int) -> tuple[dict, dict]:
    """The best of ``repeats`` calls of plot_class_accuracy each way, in seconds, the
    ways taking turns (a machine's load then weighs on both alike); and the PNGs."""
    times = dict.fromkeys(WAYS, float("inf"))
    paths = {
        name: folder / f"class_accuracy_{len(report.labels)}_{name.replace('.', '_')}.png"
        for name in WAYS
    }
    for name, draw in WAYS.items():  # first-call costs, untimed
        with bars(draw):
            plotting.plot_class_accuracy(report, paths[name])
    for _ in range(repeats):
        for name, draw in WAYS.items():
            with bars(draw):
                start = time.perf_counter()
                plotting.plot_class_accuracy(report, paths[name])
                times[name] = min(times[name], time.perf_counter() - start)
    return times, paths


def same_pixels(first: Path, second: Path) -> bool:
    from matplotlib.image import imread

    a, b = imread(first), imread(second)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", nargs="+", type=int, default=CLASSES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="a folder to keep the PNGs in")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    if min(args.classes) < 1:
        parser.error(f"--classes must be at least 1 each; got {args.classes}")
    if len(set(args.classes)) < len(args.classes):
        parser.error(f"--classes takes each count once; got {args.classes}")
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        parser.error(f"--keep takes a folder, got the file {args.keep}")
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        print(f"plot_class_accuracy, Agg, PNG at 120 dpi; best of {args.repeats}; seconds")
        header = (
            f"{'classes':>8} {'collection':>11} {'ax.bar':>8} {'ax.bar/collection':>18}"
            f" {'same pixels':>12}"
        )
        print(header)
        print("-" * len(header))
        for k in args.classes:
            times, paths = best_times(make_report(k), folder, args.repeats)
            same = "yes" if same_pixels(*paths.values()) else "no"
            print(
                f"{k:>8} {times['collection']:>11.3f} {times['ax.bar']:>8.3f}"
                f" {times['ax.bar'] / times['collection']:>17.2f}× {same:>12}"
            )


if __name__ == "__main__":
    main()
