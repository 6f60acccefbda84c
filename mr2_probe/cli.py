"""``mr2-probe``: fit ERM and MR² probes on stored features and report them class by class."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import joblib
import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, StratifiedKFold, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

from ._classifier import MR2LinearClassifier
from .metrics import classwise_scorers
from .report import classwise_report

EXAMPLES = """\
examples:
  # train and test stores written by mr2-extract; ERM vs MR² with c_bar=1
  mr2-probe train.h5 --test test.h5 --c-bar 1 --out runs/fmnist

  # one store, 20% held out; the paper's setting with the compactness loss
  mr2-probe feats.h5 --test-size 0.2 --c-bar 2 --lam 0.5 --p 3 --out runs/paper

  # grid over c_bar x lam x C, 3-fold CV, refit on worst-class accuracy
  mr2-probe train.npz --test test.npz --grid c_bar=none,1,2 --grid lam=0,0.5 \\
      --grid C=0.1,1 --scoring worst_class --out runs/grid

  # plain NumPy features: X in feats.npy, labels in labels.npy
  mr2-probe feats.npy --labels labels.npy --test-size 0.25

  # the accuracy–worst-class front: a class_tilt sweep and tuned class offsets, chosen
  # on a 10% validation split by the rule (best worst class within 0.5 pt of ERM overall)
  mr2-probe train.h5 --test test.h5 --tilt 0,0.5,1,2,5,10 --offsets 0,0.25,0.5,1 \
      --front-bound 0.5 --out runs/front
"""

_SCALERS = {"none": None, "standard": StandardScaler, "l2": Normalizer}
_SCORINGS = ("accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "class_std")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mr2-probe",
        description=(
            "Fit an ERM probe and an MR² probe (MR2LinearClassifier) on frozen features, "
            "print overall / easy / medium / hard / worst-class accuracy, and write the "
            "report, plots and fitted models."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "train",
        help="training features: an HDF5 store from mr2-extract (.h5), a .npz with X and y "
        "(or features and labels), or a .npy with --labels, e.g. train.h5",
    )
    held_out = parser.add_mutually_exclusive_group()
    held_out.add_argument("--test", help="test features in the same formats, e.g. test.h5")
    held_out.add_argument(
        "--test-size",
        type=float,
        default=0.2,
        help="fraction of the training file held out (stratified) when --test is absent "
        "(default: 0.2)",
    )
    parser.add_argument("--labels", help="labels (.npy) for .npy features, e.g. labels.npy")
    parser.add_argument("--test-labels", help="labels (.npy) for .npy test features")
    parser.add_argument(
        "--c-bar",
        type=_optional_float,
        default=1.0,
        help="mean margin of the MR² model; 'none' for plain cross-entropy (default: 1)",
    )
    parser.add_argument(
        "--lam", type=float, default=0.0, help="compactness weight, e.g. 0.5 (default: 0)"
    )
    parser.add_argument(
        "--p",
        type=float,
        default=None,
        help="norm of the class statistics (default: 2, 3 for the cosine head)",
    )
    parser.add_argument("--head", choices=("linear", "cosine"), default="linear", help="probe head")
    parser.add_argument(
        "--C", type=float, default=1.0, help="inverse L2 strength, as in LogisticRegression"
    )
    parser.add_argument("--max-iter", type=int, default=100, help="iterations / epochs")
    parser.add_argument(
        "--scale",
        choices=tuple(_SCALERS),
        default="none",
        help="feature scaling fitted on the training data: standard (zero mean, unit "
        "variance), l2 (unit-norm rows) or none (default: none)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="search NAME over values with cross-validation; repeat per parameter, e.g. "
        "--grid c_bar=none,1,2 --grid C=0.1,1",
    )
    parser.add_argument("--cv", type=int, default=3, help="folds of the grid search")
    parser.add_argument(
        "--scoring",
        choices=_SCORINGS,
        default="worst_class",
        help="metric the grid search refits on (default: worst_class)",
    )
    parser.add_argument("--n-jobs", type=int, default=None, help="parallel grid fits")
    parser.add_argument(
        "--tilt",
        type=_floats,
        default=(),
        metavar="T1,T2",
        help="class_tilt values of the front's tilt sweep on the MR² model, e.g. "
        "0,0.5,1,2,5,10 (0 is the MR² model itself)",
    )
    parser.add_argument(
        "--offsets",
        type=_floats,
        default=(),
        metavar="B1,B2",
        help="bounds, in points of overall accuracy, on what class offsets tuned on the ERM "
        "probe (3-fold, worst-class objective) may spend, e.g. 0,0.25,0.5,1",
    )
    parser.add_argument(
        "--val-size",
        type=float,
        default=0.1,
        help="fraction of the training data held out (stratified) to choose on the front "
        "(default: 0.1)",
    )
    parser.add_argument(
        "--front-bound",
        type=float,
        default=0.5,
        help="the rule: the best validation worst-class accuracy whose validation overall "
        "accuracy is within this many points of ERM's (default: 0.5)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:1")
    parser.add_argument("--seed", type=int, default=0, help="split and minibatch seed")
    parser.add_argument("--per-class", action="store_true", help="also print one row per class")
    parser.add_argument("--out", help="folder for report.{txt,md,json}, plots, models.joblib")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def _scaled(probe: MR2LinearClassifier, scale: str):
    scaler = _SCALERS[scale]
    return probe if scaler is None else Pipeline([("scale", scaler()), ("probe", probe)])


def _optional_float(text: str):
    return None if text.lower() in ("none", "null") else float(text)


def _grid(specs: list[str]) -> dict:
    grid = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not values:
            raise SystemExit(f"mr2-probe: --grid expects NAME=V1,V2,..., got {spec!r}")
        grid[name.strip()] = [_grid_value(v) for v in values.split(",")]
    return grid


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, e.g. 0,0.5,1, got {text!r}"
        ) from None
    if not all(np.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers >= 0, got {text!r}")
    return values


def _grid_value(text: str):
    text = text.strip()
    if text.lower() in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_xy(path: str, labels: str | None = None):
    """Features, labels and class names from an HDF5 store, a .npz or a .npy file."""
    suffix = Path(path).suffix.lower()
    if suffix in (".h5", ".hdf5"):
        try:
            from extract import load_features
        except ImportError as exc:  # the extract extra is optional
            raise SystemExit(
                "mr2-probe: reading HDF5 stores needs the extract extra: "
                'pip install "mr2-probe[extract]"'
            ) from exc
        store = load_features(path, in_memory=True)
        names = np.asarray(store.class_names) if store.class_names else None
        y = names[store.labels] if names is not None else store.labels
        return np.asarray(store.features), y
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            x_key = "X" if "X" in data else "features"
            y_key = "y" if "y" in data else "labels"
            if x_key not in data or y_key not in data:
                raise SystemExit(
                    f"mr2-probe: {path} must hold arrays X and y (or features and labels); "
                    f"found {sorted(data.files)}"
                )
            return data[x_key], data[y_key]
    if suffix == ".npy":
        if labels is None:
            raise SystemExit(f"mr2-probe: {path} holds features only; pass --labels FILE.npy")
        return np.load(path), np.load(labels)
    raise SystemExit(
        f"mr2-probe: unknown feature file type {suffix!r} ({path}); use .h5, .npz or .npy"
    )


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    grid = _grid(args.grid)
    X, y = load_xy(args.train, args.labels)
    if args.test:
        X_test, y_test = load_xy(args.test, args.test_labels)
    else:
        X, X_test, y, y_test = train_test_split(
            X, y, test_size=args.test_size, stratify=y, random_state=args.seed
        )
    verbose = 0 if args.no_progress else 1
    common = dict(
        C=args.C,
        max_iter=args.max_iter,
        device=args.device,
        verbose=verbose,
        random_state=args.seed,
    )
    models = {"ERM": _scaled(MR2LinearClassifier(c_bar=None, **common), args.scale)}
    mr2 = MR2LinearClassifier(c_bar=args.c_bar, lam=args.lam, p=args.p, head=args.head, **common)
    if grid:
        mr2.set_params(verbose=0)
        prefix = "" if args.scale == "none" else "probe__"
        name = "MR2 grid"
        models[name] = GridSearchCV(
            _scaled(mr2, args.scale),
            {prefix + key: values for key, values in grid.items()},
            scoring=classwise_scorers(),
            refit=args.scoring,
            cv=StratifiedKFold(args.cv, shuffle=True, random_state=args.seed),
            n_jobs=args.n_jobs,
        )
    else:
        models["MR2"] = _scaled(mr2, args.scale)

    mr2_name = list(models)[-1]
    for name, model in models.items():
        print(f"fitting {name} on {X.shape[0]} × {X.shape[1]} features", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X, y)
    front = None
    if args.tilt or args.offsets:
        front = _front(models, mr2, X, y, X_test, y_test, args)
    report = classwise_report(models, y_test, X_test, reference="ERM")
    print(report.to_text(per_class=args.per_class))
    if grid:
        best = {k.removeprefix("probe__"): v for k, v in models[mr2_name].best_params_.items()}
        print(f"MR2 grid: best parameters by {args.scoring}: {best}")
    if front is not None:
        print(front.to_text())
    if args.out:
        _write_outputs(Path(args.out), report, models, args, mr2_name, front)
    return 0


def _front(models: dict, mr2, X, y, X_test, y_test, args):
    """Fit the front on a validation split, choose by the rule, refit the choice on all of
    the training data and add it to ``models``."""
    from .front import accuracy_front

    X_fit, X_val, y_fit, y_val = train_test_split(
        X, y, test_size=args.val_size, stratify=y, random_state=args.seed
    )
    base = _scaled(clone(mr2).set_params(verbose=0), args.scale)
    print(f"fitting the front on {len(y_fit)} samples, choosing on {len(y_val)}", file=sys.stderr)
    front = accuracy_front(
        base,
        X_fit,
        y_fit,
        X_val,
        y_val,
        tilts=args.tilt,
        offset_bounds=[b / 100 for b in args.offsets],
        X_test=X_test,
        y_test=y_test,
        bound=args.front_bound / 100,
    )
    chosen = front.point(front.chosen)
    print(
        f"front: the rule chose {chosen.name}; refitting it on all training data", file=sys.stderr
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        models[f"chosen: {chosen.name}"] = clone(chosen.estimator).fit(X, y)
    return front


def _write_outputs(out: Path, report, models: dict, args, mr2_name: str, front=None) -> None:
    from .plotting import plot_class_accuracy, plot_front, plot_group_accuracy, plot_margins

    out.mkdir(parents=True, exist_ok=True)
    text, markdown, data = (
        report.to_text(per_class=True),
        report.to_markdown(per_class=True),
        report.to_dict(),
    )
    if front is not None:
        text += "\n\n" + front.to_text()
        markdown += "\n\n" + front.to_markdown()
        data["front"] = front.to_dict()
        plot_front(front, out / "front.png")
    (out / "report.txt").write_text(text + "\n")
    (out / "report.md").write_text(markdown + "\n")
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    fitted = {name: getattr(m, "best_estimator_", m) for name, m in models.items()}
    plot_class_accuracy(report, out / "class_accuracy.png", model=mr2_name)
    plot_group_accuracy(report, out / "groups.png")
    probe = fitted[mr2_name]
    plot_margins(probe[-1] if isinstance(probe, Pipeline) else probe, out / "margins.png")
    joblib.dump(fitted, out / "models.joblib")
    (out / "command.json").write_text(json.dumps(vars(args), indent=2) + "\n")
    print(f"wrote report, plots and models to {out}/", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
