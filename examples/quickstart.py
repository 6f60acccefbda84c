"""Quickstart: ERM versus MR² linear probes on scikit-learn's digits, compared class by class.

Run ``python examples/quickstart.py`` (seconds on a CPU, no download). Prints the overall,
easy / medium / hard, worst-class and spread of per-class test accuracy, the groups being
the terciles of the ERM probe's classes; ``--per-class`` adds one row per class and
``--json`` writes the report as JSON and ``--plots DIR`` draws the figures (matplotlib).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mr2_probe import MR2LinearClassifier
from mr2_probe.report import classwise_report


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--C", type=float, default=0.05, help="inverse L2 strength (default: 0.05)")
    parser.add_argument("--c-bar", type=float, default=1.0, help="mean MR² margin (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="train/test split seed (default: 0)")
    parser.add_argument("--per-class", action="store_true", help="add the per-class table")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--plots", metavar="DIR", help="also write PNG figures into DIR")
    args = parser.parse_args(argv)
    # One line, as argparse's own refusals, rather than an estimator's traceback.
    if not args.C > 0:  # (inf: no penalty)
        parser.error(f"--C must be a positive number, got {args.C:g}")
    if not 0 < args.c_bar < float("inf"):
        parser.error(f"--c-bar must be a positive finite number, got {args.c_bar:g}")
    if not 0 <= args.seed < 2**32:  # NumPy's seeds, as train_test_split takes them
        parser.error(f"--seed must be between 0 and 2**32 - 1, got {args.seed}")
    # (after the fits, a folder as --json or a file as --plots ended in an OSError traceback)
    if args.json and Path(args.json).is_dir():
        parser.error(f"--json takes a file to write, got the folder {args.json}")
    if args.plots and Path(args.plots).exists() and not Path(args.plots).is_dir():
        parser.error(f"--plots takes a folder, got the file {args.plots}")
    # (a file among the folders above, as --json notes.txt/r.json: its folders not made)
    for option, value in (("--json", args.json), ("--plots", args.plots)):
        blocking = value and _file_above(Path(value))
        if blocking:
            parser.error(f"{option} {value} is inside {blocking}, which is a file, not a folder")
    # (without matplotlib, --plots ended in mr2_probe.plotting's ImportError traceback)
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error(
                '--plots draws figures, which need matplotlib: pip install "mr2-probe[plot]"'
            )

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=args.seed
    )
    probes = {
        "ERM": MR2LinearClassifier(c_bar=None, C=args.C),
        f"MR2 (c_bar={args.c_bar:g})": MR2LinearClassifier(c_bar=args.c_bar, C=args.C),
    }
    fitted = {}
    for name, probe in probes.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted[name] = make_pipeline(StandardScaler(), probe).fit(X_train, y_train)

    report = classwise_report(fitted, y_test, X_test, reference="ERM")
    print(f"digits: {len(y_train)} train / {len(y_test)} test images, 10 classes")
    print(report.to_text(per_class=args.per_class))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)  # as --plots makes its folder
        path.write_text(report.to_json(indent=2))
    if args.plots:
        write_plots(report, fitted[list(fitted)[1]][-1], Path(args.plots))
    return report


def _file_above(path: Path) -> Path | None:
    """The nearest existing folder above ``path``, where that is a file (no folder can be
    made in it)."""
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    return parent if parent is not None and not parent.is_dir() else None


def write_plots(report, classifier, directory: Path) -> None:
    from mr2_probe.plotting import plot_class_accuracy, plot_group_accuracy, plot_margins

    directory.mkdir(parents=True, exist_ok=True)
    plot_class_accuracy(report, directory / "per_class.png")
    plot_group_accuracy(report, directory / "groups.png")
    plot_margins(classifier, directory / "margins.png")
    print(f"figures written to {directory}/")


if __name__ == "__main__":
    main()
