"""``mr2-probe``: fit ERM and MR² probes on stored features and report them class by class."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from numbers import Real
from pathlib import Path

import joblib
import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import (
    GridSearchCV,
    ParameterGrid,
    StratifiedKFold,
    train_test_split,
)
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

from ._classifier import MR2LinearClassifier
from ._cv import MR2LinearClassifierCV
from ._device import resolve_device
from .front import (
    OFFSETS_CV,
    _final,
    check_offsets_folds,
    collecting_short,
    fit_collecting_short,
)
from .metrics import classwise_scorers
from .report import classwise_report, in_percent

EXAMPLES = """\
examples:
  # train and test stores written by mr2-extract; ERM vs MR² with c_bar=1
  mr2-probe train.h5 --test test.h5 --c-bar 1 --feature-scaling standard --out runs/fmnist

  # one store, 20% held out; the paper's setting: cosine head, p=3, compactness loss
  mr2-probe feats.h5 --test-size 0.2 --head cosine --logit-scale 32 --c-bar 2 --lam 0.5 \\
      --p 3 --out runs/paper

  # grid over C (ERM and MR² both) x c_bar x lam (MR² only), 3-fold CV, refit on the
  # worst-class accuracy
  mr2-probe train.npz --test test.npz --grid c_bar=none,1,2 --grid lam=0,0.5 \\
      --grid C=0.1,1 --scoring worst_class --out runs/grid

  # C chosen by 5-fold CV along a warm-started path of 20 values (MR2LinearClassifierCV),
  # for ERM and MR² each; --Cs bisect runs CLIP's parametric binary search instead
  mr2-probe train.h5 --test test.h5 --cv 5 --Cs 20 --scoring worst_class --out runs/cv

  # plain NumPy features: X in feats.npy, labels in labels.npy
  mr2-probe feats.npy --labels labels.npy --test-size 0.25

  # the accuracy–worst-class front: a class_tilt sweep and tuned class offsets, chosen
  # on a 10% validation split by the rule (best worst class within 0.5 pt of ERM overall)
  mr2-probe train.h5 --test test.h5 --tilt 0,0.5,1,2,5,10 --offsets 0,0.25,0.5,1 \\
      --front-bound 0.5 --out runs/front

files written to --out:
  report.txt, report.md  the class-wise tables (one row per class too), the grid
                         search's choices and the front, accuracies in percent
  report.json            the same in percent ("units": "percent")
  class_accuracy.png     per-class accuracy of the MR² model against ERM
  margins.png            the MR² model's margin per class (or that it has none)
  groups.png             easy / medium / hard / worst-class accuracy of every model
  front.png              the accuracy front (with --tilt or --offsets)
  cv_curve.png           held-out scores against C (the logit scale for a cosine head),
                         one line per scorer (with --Cs)
  models.joblib          the fitted models, a dict keyed by the report's model names
  class_names.json       the class names of an HDF5 store: class k is entry k
  command.json           the options of the run
  A run replaces an earlier run's files there, and says so when it starts; a folder
  holding files of these names that no earlier run wrote (no command.json) is refused.

labels:
  The models learn the labels exactly as the training file holds them and predict the
  same kind. A store's labels are integer codes 0..K-1 into its own class names; the
  models predict the training store's codes (class_names.json). A test store's classes
  are matched to the training store's by name (it may lack some or order them
  differently), and so are text labels of a NumPy file against a store's names; a class
  the training data lacks is refused. To score a store yourself,
  translate its labels by name first:
    models = joblib.load("runs/fmnist/models.joblib")  # "ERM grid", ... after --grid
    trained = json.load(open("runs/fmnist/class_names.json"))
    store = extract.load_features("test.h5")
    code = {name: k for k, name in enumerate(trained)}
    y = np.array([code[name] for name in store.class_names])[store.labels]
    models["ERM"].score(store.features, y)
  and np.asarray(trained)[models["ERM"].predict(store.features)] names the predictions.
  A name several classes share is told apart by its code ("crane (134)"); stores with
  such names must list their classes alike, and their labels are then used as they are.

errors:
  A mistake in the options or the input files stops the run before any fit, with one
  line "mr2-probe: error: ..." and exit status 2; --debug shows the traceback instead.
  A front whose fits fail (e.g. a --tilt too large for float32) is left out: the models
  fitted before it are reported and written, the error is said, and the status is 1;
  so is a front interrupted by Ctrl-C, with status 130 (Ctrl-C elsewhere: 130, nothing
  written).
"""

_SCALERS = {"none": None, "standard": StandardScaler, "l2": Normalizer}
_SCORINGS = ("accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "class_std")
_FORMATS = (".h5", ".hdf5", ".npz", ".npy")
# Defaults of the options that only the front or a search reads (None until checked).
_LEVER_DEFAULTS = {"val_size": 0.1, "front_bound": 0.5, "cv": 3, "scoring": "worst_class"}
# Parameters that shape only the MR² objective: ERM (c_bar=None, lam=0) does not search them.
_MR2_ONLY = frozenset({"c_bar", "lam", "p", "difficulty", "tau", "projection_rank", "class_tilt"})
# The options that set the estimator's parameters, named in its errors; --grid may not
# search one that an option sets (it would silently replace the option's value).
_OPTIONS = {
    "c_bar": "--c-bar",
    "lam": "--lam",
    "p": "--p",
    "C": "--C",
    "head": "--head",
    "max_iter": "--max-iter",
    "scale": "--logit-scale",
    "random_state": "--seed",
    "device": "--device",
}
# Every run removes those of an earlier run in the same folder before writing its own.
_FIGURES = ("class_accuracy.png", "groups.png", "margins.png", "front.png", "cv_curve.png")
# Every file a run writes to --out (or removes there, as an earlier run's).
_OUTPUTS = (
    "models.joblib",
    "command.json",
    "report.txt",
    "report.md",
    "report.json",
    "class_names.json",
    *_FIGURES,
)


class UsageError(ValueError):
    """A mistake in the options or the input files of ``mr2-probe``, told in one line."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mr2-probe",
        description=(
            "Fit an ERM probe and an MR² probe (MR2LinearClassifier) on frozen features, "
            "print overall / easy / medium / hard / worst-class accuracy, and write the "
            "report, plots and fitted models. ERM is the same probe (head, C, logit scale, "
            "feature scaling) without margins: c_bar=None, lam=0."
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
    parser.add_argument(
        "--head",
        choices=("linear", "cosine"),
        default="linear",
        help="probe head of both models (default: linear)",
    )
    parser.add_argument(
        "--logit-scale",
        type=float,
        default=None,
        help="logit scale (inverse temperature) of the cosine head, the estimator's 'scale' "
        "(default: 64); only with --head cosine",
    )
    parser.add_argument(
        "--C",
        type=float,
        default=None,
        help="inverse L2 strength, as in LogisticRegression (default: 1); the cosine head "
        "has no penalty of its own: with it, C penalises only MR²'s projection (--lam > 0)",
    )
    parser.add_argument("--max-iter", type=int, default=100, help="iterations / epochs")
    parser.add_argument(
        "--feature-scaling",
        choices=tuple(_SCALERS),
        default=None,
        help="feature scaling fitted on the training data, before both probes: standard "
        "(zero mean, unit variance), l2 (unit-norm rows) or none (default: none)",
    )
    parser.add_argument(
        "--scale",
        choices=tuple(_SCALERS),
        default=None,
        help="deprecated, removed in the next release: the old name of --feature-scaling "
        "(it never set the cosine head's logit scale, which is --logit-scale)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="search NAME over values with cross-validation; repeat per parameter, e.g. "
        "--grid c_bar=none,1,2 --grid C=0.1,1. ERM gets the same search over the "
        "parameters it shares with MR² (C, head, scale, ...; not c_bar, lam, p, "
        "difficulty, tau, projection_rank, class_tilt)",
    )
    parser.add_argument(
        "--Cs",
        type=_cs,
        default=None,
        metavar="N|bisect",
        help="choose C (the logit scale for --head cosine) by --cv-fold CV along a "
        "warm-started path with MR2LinearClassifierCV, for both models: N >= 2 values from "
        "1e-4 to 1e4 (scales 1 to 1000), or 'bisect' for CLIP's parametric binary search "
        "(instead of --C, or --logit-scale); prints the validation curve and writes "
        "cv_curve.png",
    )
    parser.add_argument(
        "--cv", type=int, default=None, help="folds of the grid search or of --Cs (default: 3)"
    )
    parser.add_argument(
        "--scoring",
        choices=_SCORINGS,
        default=None,
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
        help="bounds, in points of overall accuracy (from 0, below 100), on what class offsets "
        "tuned on the ERM probe (3-fold, worst-class objective) may spend, e.g. 0,0.25,0.5,1",
    )
    parser.add_argument(
        "--val-size",
        type=float,
        default=None,
        help="fraction of the training data held out (stratified) to choose on the front "
        "(default: 0.1)",
    )
    parser.add_argument(
        "--front-bound",
        type=float,
        default=None,
        help="the rule: the best validation worst-class accuracy whose validation overall "
        "accuracy is within this many points of ERM's (default: 0.5)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:1")
    parser.add_argument("--seed", type=int, default=0, help="split and minibatch seed")
    parser.add_argument("--per-class", action="store_true", help="also print one row per class")
    parser.add_argument(
        "--out",
        help="folder for the report, plots and models (created, and checked to be writable, "
        "before any fit; the files are listed below)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    return parser


def _scaled(probe: MR2LinearClassifier, scaling: str):
    scaler = _SCALERS[scaling]
    return probe if scaler is None else Pipeline([("scale", scaler()), ("probe", probe)])


def _chosen_configuration(model):
    """The unfitted probe (in its Pipeline) that a fitted search chose: GridSearchCV's
    best estimator, or an MR2LinearClassifier at the C (or scale) MR2LinearClassifierCV
    chose; the model itself, unfitted, when nothing was searched."""
    base = clone(getattr(model, "best_estimator_", model))
    search = _final(model)
    if not isinstance(search, MR2LinearClassifierCV):
        return base
    names = MR2LinearClassifier().get_params()
    params = {k: v for k, v in search.get_params(deep=False).items() if k in names}
    params |= {"scale": search.C_} if search.head_ == "cosine" else {"C": search.C_}
    probe = MR2LinearClassifier(**params)
    if isinstance(base, Pipeline):
        return Pipeline([*base.steps[:-1], (base.steps[-1][0], probe)])
    return probe


def _optional_float(text: str):
    return None if text.lower() in ("none", "null") else float(text)


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


def _cs(text: str):
    if text == "bisect":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:  # (one value, 1e-4, is no choice)
        raise argparse.ArgumentTypeError(
            f"expected a number of values >= 2 to choose from, e.g. 20, or 'bisect'; got {text!r}"
        )
    return value


def _grid(specs: list[str]) -> dict:
    grid = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not name or not values:
            raise UsageError(f"--grid expects NAME=V1,V2,..., e.g. --grid C=0.1,1; got {spec!r}")
        if name in grid:
            raise UsageError(
                f"--grid names {name!r} twice; give all its values at once, e.g. "
                f"--grid {name}=V1,V2,V3"
            )
        grid[name] = [_grid_value(v) for v in values.split(",")]
    return grid


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


def _one_line(error, limit: int = 1000) -> str:
    """An error's (or warning's) message on one line, cut at ``limit`` characters (some
    messages print a whole array)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main(argv=None) -> int:
    """Run ``mr2-probe``; returns 0 (1 where the front failed and was left out, 130 where it
    was interrupted: the main models are reported and written either way), or exits with
    status 2 and one line on a mistake, 130 on Ctrl-C elsewhere."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, _given(argv))
    except KeyboardInterrupt:
        if args.debug:
            raise
        parser.exit(130, "mr2-probe: interrupted\n")
    except (ValueError, OSError, ImportError) as error:
        # The checks' UsageError, the stores' StoreError (a ValueError), scikit-learn's
        # InvalidParameterError and ValueErrors about the data, files that fail to open.
        if args.debug:
            raise
        parser.exit(2, f"mr2-probe: error: {_one_line(error)}\n")


def _given(argv) -> frozenset:
    """The options given on the command line (their ``dest``), whatever their values:
    parsed again without defaults, so that argparse sets only what the command line names."""
    parser = _parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv)))


def _run(args, given: frozenset = frozenset()) -> int:
    # Everything that can be wrong with the options and the output folder is found before
    # any file is read; everything wrong with the inputs, before any fit.
    _check_options(args)
    erm, mr2 = _estimators(args)
    grid = _grid(args.grid)
    _check_grid(grid, mr2, args, given)
    out = _prepare_out(args.out) if args.out is not None else None
    X, y, X_test, y_test, names, sources = _inputs(args)
    _check_splits(y, grid, args, names)
    replaced = [name for name in _OUTPUTS if out is not None and (out / name).exists()]
    if replaced:  # said once the run is known to start
        print(
            f"mr2-probe: --out {args.out!r} holds an earlier run's {', '.join(replaced)}; "
            f"this run replaces {'it' if len(replaced) == 1 else 'them'} when it ends "
            "(choose another --out to keep them)",
            file=sys.stderr,
        )

    erm_grid = {key: values for key, values in grid.items() if key not in _MR2_ONLY}
    if not any(_without_unused_c(erm, c) for c in ParameterGrid(erm_grid)):
        # Nothing it searches changes ERM (C alone, where the cosine head has no penalty):
        # a search would choose among fits of one model.
        erm_grid = {}
    if args.Cs is not None:
        erm, mr2 = _cv_probe(erm, args), _cv_probe(mr2, args)
    models = {
        "ERM grid" if erm_grid else "ERM": _model(erm, erm_grid, args),
        "MR2 grid" if grid else "MR2": _model(mr2, grid, args),
    }
    erm_name, mr2_name = models
    for name, model in models.items():
        print(f"fitting {name} on {X.shape[0]} × {X.shape[1]} features", file=sys.stderr)
        _fit(model, X, y, name, args)
    front = front_error = None
    status = 0
    if args.tilt or args.offsets:
        # Each model as its search chose it: the front's ERM is the reported ERM.
        base, erm_base = (_chosen_configuration(models[n]) for n in (mr2_name, erm_name))
        for configuration in (base, erm_base):
            _final(configuration).set_params(verbose=0)
        try:
            front = _front(models, base, erm_base, X, y, X_test, y_test, args)
        except (ValueError, KeyboardInterrupt) as error:
            # The models already fitted are reported and written without the front; the
            # run still ends in an error (status 1, or 130 for Ctrl-C as elsewhere).
            if args.debug:
                raise
            if isinstance(error, KeyboardInterrupt):
                front_error, status = "the front was interrupted and is left out", 130
            else:
                front_error, status = f"the front failed and is left out: {_one_line(error)}", 1
            print(f"mr2-probe: error: {front_error}", file=sys.stderr)
    fitted = {name: getattr(m, "best_estimator_", m) for name, m in models.items()}

    def named(labels):  # a store's integer codes -> its class names, for the report only
        return np.asarray(labels) if names is None else np.asarray(names)[labels]

    predictions = {name: named(model.predict(X_test)) for name, model in fitted.items()}
    # The classes in the order of their codes (class_names.json), not sorted by name.
    order = named(np.unique(y_test))
    report = classwise_report(predictions, named(y_test), reference=erm_name, labels=order)
    search = {
        name: {key.removeprefix("probe__"): v for key, v in model.best_params_.items()}
        for name, model in models.items()
        if hasattr(model, "best_params_")
    }
    notes = []
    if _final(fitted[mr2_name]).c_bar is None:
        how = "the search chose c_bar=None" if "c_bar" in grid else "c_bar=None"
        plain = _final(fitted[mr2_name]).lam == 0 and _final(fitted[mr2_name]).class_tilt == 0
        what = "plain cross-entropy (γ_k = 1)" if plain else "γ_k = 1"
        notes.append(f"{mr2_name} has no margins: {how}, {what}")
    if front_error is not None:
        notes.append(front_error)
    lines = [
        f"{name}: best parameters by {args.scoring} ({args.cv}-fold CV): {best}"
        for name, best in search.items()
    ]
    searches = {name: _final(m) for name, m in fitted.items() if hasattr(_final(m), "Cs_")}
    lines += [line for name, cv in searches.items() for line in _cv_lines(name, cv, args)]
    lines += [f"note: {note}" for note in notes]

    print(report.to_text(per_class=args.per_class))
    if lines:
        print("\n".join(lines))
    if front is not None:
        print(front.to_text())
    if out is not None:
        data = report.to_dict()
        data["inputs"] = _inputs_record(sources, args, y, y_test, names)
        if search:
            data["search"] = {"scoring": args.scoring, "cv": args.cv, "best_params": search}
        data["notes"] = notes
        if searches:
            data["cv"] = {  # the values searched: C, or a cosine head's scale
                name: {
                    what: cv.C_,
                    f"{what}s": cv.Cs_.tolist(),
                    "curves": _percent(cv, args),
                }
                for name, cv in searches.items()
                for what in ["scale" if cv.head_ == "cosine" else "C"]
            }
        _write_outputs(out, report, lines, data, front, fitted, args, mr2_name, names)
    return status


# What report.json records of a store, so that a per-class result can be traced to the
# features it was measured on.
_RECORDED_PROVENANCE = (
    "backbone", "weights", "preprocessing", "compute", "dtype", "normalize", "source",
    "source_root", "source_fingerprint", "shard_rank", "shard_world_size",
)  # fmt: skip


def _sources(args) -> dict:
    """Each input file's absolute path and, for a store, its provenance and the failed
    images left out (the test set's, or None for one held out of the training data)."""

    def record(path, labels_path) -> dict:
        entry = {"path": os.path.abspath(path)}
        if labels_path is not None:
            entry["labels"] = os.path.abspath(labels_path)
        if Path(path).suffix.lower() in (".h5", ".hdf5"):
            from extract import load_features

            with load_features(path) as store:
                metadata, failed = store.metadata, len(store.failures)
            entry["provenance"] = {k: metadata[k] for k in _RECORDED_PROVENANCE if k in metadata}
            entry["failed_images_left_out"] = failed
        return entry

    test = None if args.test is None else record(args.test, args.test_labels)
    return {"train": record(args.train, args.labels), "test": test}


def _inputs_record(sources: dict, args, y, y_test, names) -> dict:
    """What the report was measured on: the files (:func:`_sources`) and how many samples
    of each class it counted; for a held-out test set, the split that made it."""

    def counts(labels) -> dict:
        values, n = np.unique(labels, return_counts=True)
        shown = values if names is None else np.asarray(names, dtype=object)[values]
        return {str(v): int(k) for v, k in zip(shown, n, strict=True)}

    train = sources["train"] | {"samples": int(len(y)), "samples_per_class": counts(y)}
    test = sources["test"] or {
        "held_out_of": train["path"],
        "test_size": args.test_size,
        "seed": args.seed,
    }
    test = test | {"samples": int(len(y_test)), "samples_per_class": counts(y_test)}
    return {"train": train, "test": test}


def _curves(search, args) -> dict:
    from .plotting import cv_curves

    return {key: v.tolist() for key, v in cv_curves(search, args.scoring).items()}


def _percent(search, args) -> dict:
    """Validation curves in percent, as the rest of report.json (NaN as null)."""
    return in_percent(_curves(search, args))


def _cv_lines(name: str, search, args) -> list[str]:
    """The chosen value and the validation curve (mean over folds, in percent)."""
    what = "scale" if search.head_ == "cosine" else "C"
    curves = _curves(search, args)
    lines = [f"{name}: chose {what}={search.C_:.4g} by {args.scoring} ({args.cv}-fold CV)"]
    lines.append(f"  {what:>10s}  " + "  ".join(f"{key:>17s}" for key in curves))
    for j, value in enumerate(search.Cs_):
        mark = " *" if value == search.C_ else "  "
        row = "  ".join(f"{100 * curve[j]:17.2f}" for curve in curves.values())
        lines.append(f"{mark}{value:10.4g}  {row}")
    return lines


def _check_options(args) -> None:
    """Check the options that need no file; resolve the deprecated --scale."""
    if args.scale is not None:
        if args.feature_scaling not in (None, args.scale):
            raise UsageError(
                f"--scale {args.scale} and --feature-scaling {args.feature_scaling} disagree; "
                "--scale is the deprecated name of --feature-scaling: pass only "
                "--feature-scaling"
            )
        print(
            "mr2-probe: warning: --scale is deprecated and will be removed in the next "
            f"release; use --feature-scaling {args.scale} (the cosine head's logit scale is "
            "--logit-scale)",
            file=sys.stderr,
        )
        args.feature_scaling = args.scale
    args.feature_scaling = args.feature_scaling or "none"
    # Options of the front or of a search, given to a run that has none: they were
    # accepted and ignored (their defaults are set here, so that a given value is seen).
    front, search = bool(args.tilt or args.offsets), bool(args.grid) or args.Cs is not None
    for option, value, used, what in (
        ("--val-size", args.val_size, front, "the front (--tilt, --offsets)"),
        ("--front-bound", args.front_bound, front, "the front (--tilt, --offsets)"),
        ("--cv", args.cv, search, "a search (--grid, --Cs)"),
        ("--scoring", args.scoring, search, "a search (--grid, --Cs)"),
        ("--n-jobs", args.n_jobs, search, "a search (--grid, --Cs)"),
    ):
        if value is not None and not used:
            raise UsageError(f"{option} applies to {what}, which this run has not; drop it")
    for name, default in _LEVER_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for option, value in (("--test-size", args.test_size), ("--val-size", args.val_size)):
        if not 0 < value < 1:
            raise UsageError(
                f"{option} must be a fraction between 0 and 1 (both excluded), e.g. 0.2; "
                f"got {value:g}"
            )
    if args.cv < 2:
        raise UsageError(f"--cv must be at least 2 folds, e.g. --cv 3; got {args.cv}")
    if args.max_iter < 1:  # 0 reports the untrained starting point as a model
        raise UsageError(f"--max-iter must be at least 1; got {args.max_iter}")
    if args.n_jobs == 0:
        raise UsageError("--n-jobs 0 runs nothing; give a number of jobs, or -1 for all CPUs")
    if not 0 <= args.front_bound < 100:
        raise UsageError(
            "--front-bound is in points of overall accuracy, between 0 and 100, e.g. 0.5; "
            f"got {args.front_bound:g}"
        )
    bad = [b for b in args.offsets if not 0 <= b < 100]
    if bad:
        raise UsageError(
            "--offsets bounds are in points of overall accuracy, between 0 and 100, e.g. "
            f"0,0.25,0.5,1; got {bad[0]:g}"
        )
    for option, values in (("--tilt", args.tilt), ("--offsets", args.offsets)):
        repeated = sorted(v for v, n in Counter(values).items() if n > 1)
        if repeated:
            raise UsageError(
                f"{option} gives {', '.join(f'{v:g}' for v in repeated)} more than once; each "
                "value is one point of the front"
            )
    searched = {
        "linear": ("--C", args.C, "C"),
        "cosine": ("--logit-scale", args.logit_scale, "logit scale"),
    }
    option, value, what = searched[args.head]
    if args.Cs is not None and value is not None:
        raise UsageError(
            f"--Cs chooses the value that {option} sets (the {args.head} head's {what}); "
            "pass one of them"
        )
    if args.Cs is not None and args.head == "cosine" and args.C is not None:
        raise UsageError(
            "--Cs with --head cosine searches the logit scale and penalises a projection "
            "(--lam > 0) at C = 1, so --C would go unused; drop --C, or drop --Cs and "
            "search both with --grid C=... --grid scale=..."
        )
    if args.test is None and args.test_labels is not None:
        raise UsageError("--test-labels goes with --test FILE.npy; pass --test or drop it")
    for option, labels, features in (
        ("--labels", args.labels, args.train),
        ("--test-labels", args.test_labels, args.test),
    ):
        if labels is not None and Path(features).suffix.lower() != ".npy":
            raise UsageError(
                f"{option} is for .npy features only; {features!r} holds its own labels: "
                f"drop {option}"
            )
    try:
        resolve_device(args.device)
    except (ValueError, RuntimeError) as error:
        raise UsageError(f"--device {args.device!r}: {_one_line(error)}") from error
    # Said once every option is known good.
    for option, value in (
        ("--front-bound", args.front_bound),
        *(("--offsets", b) for b in args.offsets),
    ):
        if 0 < value < 0.05:  # a fraction, as the Python API takes it?
            print(
                f"mr2-probe: warning: {option} is in points of overall accuracy: {value:g} "
                f"is {value:g} pt; the fraction {value:g}, as the Python API takes it, is "
                f"{option} {100 * value:g}",
                file=sys.stderr,
            )


def _estimators(args) -> tuple[MR2LinearClassifier, MR2LinearClassifier]:
    """ERM and MR², unfitted, their parameters checked."""
    common = dict(
        head=args.head,
        C=1.0 if args.C is None else args.C,
        max_iter=args.max_iter,
        device=args.device,
        verbose=0 if args.no_progress else 1,
        random_state=args.seed,
    )
    if args.logit_scale is not None:
        common["scale"] = args.logit_scale
    erm = MR2LinearClassifier(c_bar=None, **common)
    mr2 = MR2LinearClassifier(c_bar=args.c_bar, lam=args.lam, p=args.p, **common)
    for probe in (erm, mr2):
        try:
            probe._validate_params()  # scikit-learn's own messages, before any work
        except ValueError as error:
            options = [o for key, o in _OPTIONS.items() if f"'{key}' parameter" in str(error)]
            raise UsageError(f"{options[0]}: {_one_line(error)}" if options else error) from error
    return erm, mr2


def _cv_probe(probe: MR2LinearClassifier, args) -> MR2LinearClassifierCV:
    """``probe`` with C (or the cosine head's scale) chosen along a path by --cv folds."""
    params = probe.get_params()
    del params["C"], params["warm_start"]
    return MR2LinearClassifierCV(
        args.Cs,
        cv=StratifiedKFold(args.cv, shuffle=True, random_state=args.seed),
        scoring=args.scoring,
        n_jobs=args.n_jobs,
        **params,
    )


def _check_grid(grid: dict, mr2: MR2LinearClassifier, args, given: frozenset) -> None:
    """Every --grid name is a parameter of the estimator, every value a valid one, and
    none of them set by an option too (``given``: the options on the command line)."""
    if grid and args.Cs is not None:
        raise UsageError(
            "--Cs searches C with MR2LinearClassifierCV and --grid with GridSearchCV; "
            "use one of them"
        )
    params = mr2.get_params(deep=False)
    for name, values in grid.items():
        if name not in params:
            close = difflib.get_close_matches(name, params, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"--grid {name}: MR2LinearClassifier has no parameter {name!r}; {hint}"
                f"its parameters are {', '.join(sorted(params))}"
            )
        for value in values:
            if name == "max_iter" and isinstance(value, Real) and value < 1:
                raise UsageError(f"--grid max_iter={value}: max_iter must be at least 1")
            try:
                clone(mr2).set_params(**{name: value})._validate_params()
                if name == "device":
                    resolve_device(value)  # as --device is: every fit would fail on it
            except ValueError as error:
                raise UsageError(f"--grid {name}={value}: {_one_line(error)}") from error
    for name, option in _OPTIONS.items():
        if name in grid and option[2:].replace("-", "_") in given:
            raise UsageError(
                f"--grid {name} searches the value that {option} sets; pass one of them"
            )
    if "class_tilt" in grid and args.tilt:
        raise UsageError(
            "--tilt sweeps class_tilt on the MR² model for the front, and --grid class_tilt "
            "searches it; pass one of them"
        )
    heads = grid.get("head", [args.head])
    lams = grid.get("lam", [args.lam])
    if set(heads) == {"cosine"} and not any(lams) and ("C" in grid or args.C is not None):
        raise UsageError(
            f"{'--grid C' if 'C' in grid else '--C'} sets the L2 penalty of the linear head "
            "(and of a projection, with --lam > 0); the cosine head without a projection "
            "has none: drop it, and tune --logit-scale (or --Cs, which searches the scale)"
        )
    # Each value was checked alone; a combination can still be no model (solver=lbfgs
    # with lam > 0), which GridSearchCV would find fold by fold, after other fits: such
    # combinations are left out of the search (_model), and a grid of nothing else refused.
    combinations = list(ParameterGrid(grid))
    reasons = [(c, _no_model(mr2, c)) for c in combinations]
    invalid = [(c, reason) for c, reason in reasons if reason]
    if invalid:
        shown = ", ".join(f"{key}={value}" for key, value in invalid[0][0].items())
        if len(invalid) == len(combinations):
            raise UsageError(f"--grid {shown}: {invalid[0][1]}")
        print(
            f"mr2-probe: warning: {len(invalid)} of the {len(combinations)} --grid "
            f"combinations are no MR² model and are left out of its search (the first, "
            f"{shown}: {invalid[0][1]})",
            file=sys.stderr,
        )
    if "scale" in grid and "cosine" not in grid.get("head", [args.head]):
        raise UsageError(
            "--grid scale searches the cosine head's logit scale, which no model of this "
            "search has; add --head cosine (or head=cosine to the grid), or search C"
        )
    if args.logit_scale is not None and args.head != "cosine" and "head" not in grid:
        raise UsageError(
            "--logit-scale sets the cosine head's logit scale; add --head cosine, or drop "
            "--logit-scale (to scale the features, use --feature-scaling)"
        )


def _prepare_out(path: str) -> Path:
    """Create the output folder and make sure this run can write there, before any work."""
    if not path:
        raise UsageError("--out needs a folder; got an empty name")
    out = Path(path)
    for folder in (out, *out.parents):
        if folder.exists() and not folder.is_dir():
            raise UsageError(
                f"--out {path!r} cannot be a folder: {str(folder)!r} is a file; choose "
                "another --out"
            )
    taken = [name for name in _OUTPUTS if (out / name).exists()]
    if taken and not _earlier_run(out):
        why = (
            "its command.json holds no run's options"
            if (out / "command.json").exists()
            else "there is no command.json of one"
        )
        raise UsageError(
            f"--out {path!r} holds {', '.join(taken)}, which this run would replace, and "
            f"no earlier mr2-probe run wrote them ({why}); choose another --out, or move "
            "them away"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        raise UsageError(
            f"cannot write to --out {path!r} ({error.strerror or error}); choose a folder "
            "you can write to"
        ) from error
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise UsageError(
            '--out draws plots, which need matplotlib: pip install "mr2-probe[plot]"'
        ) from error
    return out


def _earlier_run(out: Path) -> bool:
    """Whether ``out`` holds an earlier run's files: its command.json, the options of a run."""
    try:
        options = json.loads((out / "command.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(options, dict) and {"train", "out"} <= options.keys()


def load_xy(path: str, labels: str | None = None, labels_option: str = "--labels"):
    """Features, labels and class names from an HDF5 store, a .npz or a .npy file.

    Returns ``(X, y, class_names)``: the labels as the file holds them (a store's integer
    codes 0..K-1) and the store's class names (``None`` for NumPy files). Every problem with
    the file raises a :class:`UsageError` or an ``extract.StoreError`` (both ValueErrors)
    with a one-line message.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise UsageError(
            f"unknown feature file type {suffix or '(none)'!r} ({path}); use .h5 (a store "
            "from mr2-extract), .npz (X and y) or .npy (with --labels)"
        )
    names = store = None
    if suffix in (".h5", ".hdf5"):
        X, y, names, store = _load_store(path)
        source = path
    elif suffix == ".npz":
        X, y = _read(path, _load_npz)
        source = path
    else:
        if labels is None:
            raise UsageError(f"{path} holds features only; pass {labels_option} FILE.npy")
        X, y = _read(path, _load_npy), _read(labels, _load_npy)
        source = f"{path} with labels {labels}"
    X, y = np.asarray(X), np.asarray(y)
    if y.dtype.kind == "S":  # bytes, which scikit-learn refuses as labels: their text
        try:
            y = np.char.decode(y, "utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"the labels of {source} are bytes that are not UTF-8 text") from error
    _check_xy(X, y, source, store)
    if X.dtype == np.float16:
        # Scaled in float32: scikit-learn's scalers compute in the features' dtype, and a
        # float16 row norm overflows past 256 (Normalizer then zeroes the row).
        X = X.astype(np.float32)
    return X, y, names


def _read(path: str, reader):
    if not os.path.exists(path):
        raise UsageError(f"{path!r} does not exist; check the path")
    try:
        with open(path, "rb") as file:
            magic = file.read(6)
        # np.load reads anything else as a pickle, whose error would talk of allow_pickle.
        if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
            raise UsageError(
                f"{path!r} is not a NumPy file; write features with numpy.save (.npy) or "
                "numpy.savez (.npz)"
            )
        return reader(path)
    except UsageError:
        raise
    except Exception as error:  # a foreign or damaged file fails in many ways (zip, pickle)
        raise UsageError(
            f"cannot read {path!r} as {Path(path).suffix or 'a NumPy file'}: "
            f"{type(error).__name__}: {_one_line(error)}"
        ) from error


def _load_npy(path: str):
    data = np.load(path, allow_pickle=False)
    if isinstance(data, np.lib.npyio.NpzFile):
        data.close()
        raise UsageError(f"{path} is a .npz archive, not a single array (.npy)")
    return data


def _load_npz(path: str):
    data = np.load(path, allow_pickle=False)
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise UsageError(f"{path} holds one array, not a .npz archive of X and y")
    with data:
        x_key = "X" if "X" in data else "features"
        y_key = "y" if "y" in data else "labels"
        if x_key not in data or y_key not in data:
            raise UsageError(
                f"{path} must hold arrays X and y (or features and labels); "
                f"found {sorted(data.files)}"
            )
        return data[x_key], data[y_key]


def _load_store(path: str):
    try:
        from extract import load_features
    except ImportError as error:  # the extract extra is optional
        raise UsageError(
            'reading HDF5 stores needs the extract extra: pip install "mr2-probe[extract]"'
        ) from error
    store = load_features(path, in_memory=True)  # StoreError: a one-line ValueError
    if store.failures:
        first, reason = store.failures[0]
        n = len(store.failures)
        images = (
            "1 image failed extraction and is"
            if n == 1
            else f"{n} images failed extraction and are"
        )
        print(
            f"mr2-probe: warning: {path}: {images} left out (the first, {first!r}: {reason})",
            file=sys.stderr,
        )
    return np.asarray(store.features), np.asarray(store.labels), list(store.class_names), store


def _check_xy(X: np.ndarray, y: np.ndarray, source: str, store=None) -> None:
    """Refuse data that cannot be fitted; a store's (extract.FeatureStore) rows are named
    by store row and image."""
    if X.ndim != 2:
        raise UsageError(
            f"the features of {source} must be a 2-D array (samples × features); got shape "
            f"{X.shape}"
        )
    if y.ndim != 1:
        raise UsageError(f"the labels of {source} must be a 1-D array; got shape {y.shape}")
    if len(X) != len(y):
        raise UsageError(
            f"{source}: {len(X)} rows of features but {len(y)} labels; each row needs one label"
        )
    if not len(y):
        raise UsageError(f"{source} holds no samples")
    if X.dtype.kind not in "iuf":  # complex numbers too, which no probe fits
        raise UsageError(f"the features of {source} must be real numbers; got dtype {X.dtype}")
    bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
    if len(bad):
        first, rows, remedy = f"row {bad[0]}", "rows", ""
        if store is not None:
            first = f"store row {store.rows[bad[0]]}, {store.paths[bad[0]]!r}"
            rows, remedy = "completed rows", "extract them again, or "
        raise UsageError(
            f"{source}: {len(bad)} of {len(X)} {rows} hold NaN or infinite features (the "
            f"first is {first}); {remedy}drop or impute them first"
        )
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise UsageError(f"{source}: some labels are NaN or infinite; every row needs a class")
    fractions = np.flatnonzero(y != np.round(y)) if y.dtype.kind == "f" else []
    if y.dtype.kind == "c" or len(fractions):
        kind, example = ("complex", y[0]) if y.dtype.kind == "c" else ("real", y[fractions[0]])
        raise UsageError(
            f"{source}: the labels are {kind} numbers, such as {example.item()!r}, not "
            "classes; give class labels (integers or text)"
        )


def _inputs(args):
    """Training and test data, checked to describe one task; the class names, if any; the
    files' records (:func:`_sources`, read now: a store replaced during the fit is not
    described)."""
    X, y, names = load_xy(args.train, args.labels)
    repeated = _repeated(names)
    names = _distinct(names)
    classes = np.unique(y)
    if len(classes) < 2:  # refused here, before any fit (scikit-learn's own error came after)
        only = names[classes[0]] if names is not None else classes[0].item()
        raise UsageError(
            f"{args.train} holds samples of one class only ({only!r}); a classifier needs at "
            "least 2"
        )
    if args.test is None:
        try:
            X, X_test, y, y_test = train_test_split(
                X, y, test_size=args.test_size, stratify=y, random_state=args.seed
            )
        except ValueError as error:
            why = _single_sample_classes(y, names) or (
                f"{_one_line(error).rstrip('.')}; choose a --test-size that leaves each class "
                "at least one sample in both parts (or pass --test)"
            )
            raise UsageError(
                f"cannot hold out --test-size {args.test_size:g} of {args.train} with every "
                f"class in both parts: {why}"
            ) from error
        return X, y, X_test, y_test, names, _sources(args)
    _check_not_the_training_data(args.train, args.test)
    X_test, y_test, test_names = load_xy(args.test, args.test_labels, "--test-labels")
    if X_test.shape[1] != X.shape[1]:
        raise UsageError(
            f"the test features have {X_test.shape[1]} columns and the training features "
            f"{X.shape[1]}; use features of the same backbone and settings"
        )
    sources = _sources(args)
    _check_same_extraction(args.train, args.test, sources)
    repeated += _repeated(test_names)
    test_names = _distinct(test_names)
    y_test, matched = _match_by_name(y, names, y_test, test_names, repeated, args)
    unseen = sorted(set(np.unique(y_test).tolist()) - set(classes.tolist()), key=str)
    if unseen:
        shown = unseen
        advice = "label train and test alike (both class names or both the same integer codes)"
        if matched and names is not None:  # codes of the training store's list
            shown = [names[k] for k in unseen]
            them = "them" if len(unseen) > 1 else "it"
            advice = f"{args.train} lists {them} among its classes but holds no sample of {them}"
        elif matched:  # text training labels: the test store's names
            advice = "a probe cannot predict classes it was not trained on"
        raise UsageError(
            f"the test labels hold {len(unseen)} class{'es' if len(unseen) > 1 else ''} absent "
            "from the training labels "
            f"({_few(shown)}); {advice}"
        )
    return X, y, X_test, y_test, names, sources


def _match_by_name(y, names, y_test, test_names, repeated: list[str], args):
    """The test labels in the training labels' terms, matched by class name where the two
    name their classes differently; and whether they were (or are codes of one list).

    A store's labels are codes into its own class names: test codes of a store that lists
    its classes in another order (or only those it holds, as a list source's does) are
    translated by name, and so are text labels of a NumPy file against a training store;
    a store's test codes against text training labels become their names.
    """

    def text(labels):
        return labels.dtype.kind in "USO"

    if names is not None:
        if test_names is not None and names != test_names:
            held = [test_names[k] for k in np.unique(y_test).tolist()]  # not failed classes
        elif test_names is None and text(y_test):
            held = [str(v) for v in np.unique(y_test)]
        else:  # two stores of one list of names (codes alike), or integer test labels
            return y_test, test_names is not None
    elif test_names is None or not text(y):
        return y_test, False
    if repeated:  # two classes of one name: which is which cannot be read off names
        both = names is not None and test_names is not None
        remedy = (
            "extract both stores with one list of class names"
            if both
            else "label both files alike (both class names or both the same integer codes)"
        )
        raise UsageError(
            f"{args.train} and {args.test} name their classes differently, and the class "
            f"names {_few(sorted(set(repeated)))} name several classes: the test labels "
            f"cannot be matched to the training classes by name; {remedy}"
        )
    if names is None:  # text training labels: the test codes' names, checked as labels
        return np.asarray(test_names, dtype=object)[y_test].astype(str), True
    foreign = [name for name in held if name not in names]
    if foreign:
        raise UsageError(
            f"{args.test} has {len(foreign)} class{'es' if len(foreign) > 1 else ''} that "
            f"{args.train} does not "
            f"({_few(foreign)}); a probe cannot predict classes it was not trained on"
        )
    code = {name: k for k, name in enumerate(names)}
    if test_names is None:  # text labels: codes of their distinct values
        values, inverse = np.unique(y_test, return_inverse=True)
        return np.array([code[str(v)] for v in values], dtype=y.dtype)[inverse], True
    # -1 marks a class the test store lists but holds no label of (none is read).
    table = np.array([code.get(name, -1) for name in test_names], dtype=np.int64)
    return table[y_test].astype(y.dtype), True


def _repeated(names: list[str] | None) -> list[str]:
    """The class names that name several classes (ImageNet's lists name two 'crane')."""
    if names is None:
        return []
    values, counts = np.unique(np.asarray(names, dtype=object), return_counts=True)
    return [str(v) for v in values[counts > 1]]


def _distinct(names: list[str] | None) -> list[str] | None:
    """Class names with a repeated one told apart by its code, 'crane (134)': mapped to
    names, the predictions of two classes of one name were scored as one class."""
    repeated = set(_repeated(names))
    if not repeated:
        return names
    return [f"{name} ({k})" if name in repeated else name for k, name in enumerate(names)]


def _check_not_the_training_data(train: str, test: str) -> None:
    """Refuse a --test that is the training file itself, or a store of the same images or
    of some of them: its accuracy would be training accuracy. Stores that record each
    image's sha256 (extract's) are compared by content: a test store of other images is
    taken even where the listings look alike, and one of training images is refused
    however it was listed; a few images shared by two sources are only said."""
    shared = "the training images" if Path(train).resolve() == Path(test).resolve() else None
    if not shared and {Path(train).suffix.lower(), Path(test).suffix.lower()} <= {".h5", ".hdf5"}:
        from extract import load_features

        # The same image list, and the same shard of it (shards of one list are disjoint).
        keys = ("source_fingerprint", "shard_rank", "shard_world_size")
        # Or stores of one source (its root and container files) whose images overlap:
        # subsets of it (--per-class, --max-items) taken twice.
        origin = ("source_root", "source_files")
        with load_features(train) as a, load_features(test) as b:
            mine, theirs = ([s.metadata.get(k) for k in keys + origin] for s in (a, b))
            same_list = mine[0] is not None and mine[:3] == theirs[:3]
            same_source = bool(mine[3]) and mine[3:] == theirs[3:]
            common = _common_images(a, b)
            if common is not None:  # by content
                n_common, n_test = common
                if n_common and (n_common == n_test or same_list or same_source):
                    shared = "the training images" if n_common == n_test else (
                        f"{n_common} of the training images"
                    )  # fmt: skip
                elif n_common:
                    print(
                        f"mr2-probe: warning: {n_common} of the {n_test} images of --test "
                        f"{test} are byte for byte images of {train}",
                        file=sys.stderr,
                    )
            elif same_list:
                shared = "the training images"
            elif same_source:
                both = sorted(set(a.paths) & set(b.paths))
                shared = f"{len(both)} of the training images ({_few(both, 2)})" if both else None
    if shared:
        raise UsageError(
            f"--test {test} holds {shared} of {train}, so its accuracy would be "
            "training accuracy; pass a store of other images, or leave --test out to hold "
            "out --test-size of the training data"
        )


def _common_images(train, test) -> tuple[int, int] | None:
    """``(n, n_test)``: how many of the test store's usable images are, byte for byte,
    images of the training store (by the sha256 both record); None where either store
    records no digests (stores written by other tools)."""
    digests = []
    for store in (train, test):
        if store.file is None or "content_sha256" not in store.file:
            return None
        found = store.file["content_sha256"][:][store.rows]
        if not len(found) or (found == b"").any():
            return None
        digests.append(found)
    return int(np.isin(digests[1], digests[0]).sum()), len(digests[1])


def _single_sample_classes(y, names, after_test_split: bool = False) -> str:
    """Where a class has a single sample, which no split puts on both sides: what to do
    (naming the first such class as the report would; ``after_test_split``: ``y`` is what
    the --test-size split left for training); "" otherwise."""
    classes, counts = np.unique(y, return_counts=True)
    single = classes[counts < 2]
    if not len(single):
        return ""
    first = names[single[0]] if names is not None else single[0].item()
    left = " left by the --test-size split" if after_test_split else ""
    remedy = ", or pass --test FILE to train on all of them" if after_test_split else ""
    return (
        f"{len(single)} {'class has' if len(single) == 1 else 'classes have'} a single "
        f"sample{left} (the first: {first!r}), which no split puts on both sides: drop "
        f"those samples or add more of their classes{remedy}"
    )


def _check_splits(y, grid: dict, args, names=None) -> None:
    """The splits the run will make, made once on the labels before any fit: the folds of
    a search (--grid, --Cs) and the front's validation split (--tilt, --offsets); ``names``:
    the class names of a store's codes ``y``."""
    rows = np.zeros((len(y), 1))
    if grid or args.Cs is not None:
        try:
            next(StratifiedKFold(args.cv, shuffle=True, random_state=args.seed).split(rows, y))
        except ValueError as error:
            # StratifiedKFold refuses more folds than the largest class has samples.
            largest = int(np.unique(y, return_counts=True)[1].max())
            advice = (
                f"no class has more than {largest} samples: use at most {largest} folds"
                if largest >= 2
                else "no class has 2 samples, which cross-validation needs"
            )
            raise UsageError(f"--cv {args.cv}: {_one_line(error).rstrip('.')}; {advice}") from error
    if args.tilt or args.offsets:
        advice = "choose a --val-size that leaves each class at least one sample in both parts"
        try:
            fit_part, validation = train_test_split(
                y, test_size=args.val_size, stratify=y, random_state=args.seed
            )
        except ValueError as error:
            single = _single_sample_classes(y, names, after_test_split=args.test is None)
            why = single or f"{_one_line(error)}; {advice}"
            raise UsageError(
                f"--val-size {args.val_size:g} cannot split the {len(y)} training samples "
                f"with every class on both sides: {why}"
            ) from error
        classes = np.unique(y)
        for part, name in ((fit_part, "fitting"), (validation, "validation")):
            missing = np.setdiff1d(classes, part)
            if len(missing):
                raise UsageError(
                    f"--val-size {args.val_size:g} leaves {len(missing)} of the {len(classes)} "
                    f"classes without a sample in the front's {name} part (the first: "
                    f"{missing.tolist()[0]!r}); {advice}"
                )
        if args.offsets:  # the offsets are tuned on folds of the front's fitting part
            try:
                check_offsets_folds(fit_part, OFFSETS_CV, advice="")
            except ValueError as error:
                raise UsageError(
                    f"--offsets tunes offsets on {OFFSETS_CV} folds of the {len(fit_part)} "
                    f"samples the front fits on: {_one_line(error).rstrip('.')}; drop "
                    "--offsets, or give it more samples of every class (a smaller --val-size)"
                ) from error


# What a store's features depend on (extract's provenance): the decoding path ("decode")
# and the compute precision change them by rounding only, and may differ between stores.
_FEATURE_PROVENANCE = ("backbone", "weights", "normalize", "preprocessing")


def _feature_provenance(record: dict) -> dict | None:
    """The entries of a store's provenance (its :func:`_sources` record) that define its
    features; None for NumPy files."""
    metadata = record.get("provenance")
    if metadata is None:
        return None
    flat = {}
    for key in _FEATURE_PROVENANCE:
        value = metadata.get(key)
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items() if k not in ("decode", "transform")}
        elif value is not None:
            flat[key] = value
    return flat


def _check_same_extraction(train: str, test: str, sources: dict) -> None:
    """Refuse train and test stores whose features come from different backbones, weights
    or preprocessing (entries recorded in both are compared)."""
    old, new = (_feature_provenance(sources[key]) for key in ("train", "test"))
    if old is None or new is None:
        return
    for path, mine, other in ((train, old, new), (test, new, old)):
        unknown = [k for k in ("backbone", "weights") if k in other and k not in mine]
        if unknown:  # a store written by another tool: nothing to compare with
            print(
                f"mr2-probe: warning: {path} records no {' or '.join(unknown)}, so whether "
                "its features are comparable with the other store's cannot be checked",
                file=sys.stderr,
            )
        tag = mine.get("weights")
        if isinstance(tag, str) and str(other.get("weights")).startswith(f"{tag} params-sha256:"):
            # A hub tag (or random weights) recorded before the weights were hashed: the
            # same name, not necessarily the same weights (another revision of the tag,
            # another library's initialisation).
            print(
                f"mr2-probe: warning: {path} records its weights by name alone "
                f"({tag!r}), so whether both stores used the same weights cannot be "
                "checked; extract it again with --force to record their hash",
                file=sys.stderr,
            )
            mine["weights"] = other["weights"]
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    if differ:
        shown = "; ".join(f"{k}: {old[k]!r} and {new[k]!r}" for k in differ[:3])
        raise UsageError(
            f"{train} and {test} were extracted differently ({shown}), so their features "
            "are not comparable; extract both with the same backbone and settings"
        )


def _few(values, n: int = 4) -> str:
    shown = ", ".join(repr(v) for v in list(values)[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "")


def _no_model(probe: MR2LinearClassifier, combination: dict) -> str | None:
    """Why a grid combination is no model of ``probe`` (None where it is one)."""
    try:
        clone(probe).set_params(**combination)._check_solver()
    except ValueError as error:
        return _one_line(error)
    return None


def _model(probe: MR2LinearClassifier, grid: dict, args):
    """The probe behind the feature scaling, in a grid search when ``grid`` is not empty
    (of the grid's combinations that are models of it)."""
    if not grid:
        return _scaled(probe, args.feature_scaling)
    prefix = "" if args.feature_scaling == "none" else "probe__"
    searched = {prefix + key: values for key, values in grid.items()}
    combinations = list(ParameterGrid(grid))
    valid = [_without_unused_c(probe, c) for c in combinations if _no_model(probe, c) is None]
    valid = list({tuple(sorted(c.items())): c for c in valid}.values())  # each model once
    if len(valid) < len(combinations):
        searched = [{prefix + key: [value] for key, value in c.items()} for c in valid]
    return GridSearchCV(
        _scaled(clone(probe).set_params(verbose=0), args.feature_scaling),
        searched,
        scoring=classwise_scorers() | {"stopped_short": _stopped_short},
        refit=args.scoring,
        cv=StratifiedKFold(args.cv, shuffle=True, random_state=args.seed),
        n_jobs=args.n_jobs,
    )


def _without_unused_c(probe: MR2LinearClassifier, combination: dict) -> dict:
    """``combination`` without C where C penalises nothing: a cosine head has no penalty of
    its own, only a projection (lam > 0) has one. (Searched, such a C fits one model again
    and reports a choice that means nothing.)"""
    params = probe.get_params() | combination
    if "C" in combination and params["head"] == "cosine" and not params["lam"]:
        return {key: value for key, value in combination.items() if key != "C"}
    return combination


def _quiet(model):
    """``model`` with verbose=0 in every parameter that sets it (a Pipeline's steps, a
    wrapper's estimator), as it is saved: the progress bars were the command's
    (--no-progress), and a refit from Python prints none. (The searches and the front fit
    their estimators with verbose=0 already.)"""
    keys = [k for k in model.get_params() if k == "verbose" or k.endswith("__verbose")]
    return model.set_params(**dict.fromkeys(keys, 0))


def _stopped_short(estimator, X, y) -> float:
    """A grid search's scorer: 1 for a fit that stopped short of tol. With --n-jobs its
    fits run in worker processes, whose warnings never reach this one."""
    return float(getattr(_final(estimator), "_stop_reason", None) is not None)


def _in_cli_terms(message, args) -> str:
    """An estimator's warning on one line, its advice in mr2-probe's options: --max-iter
    for max_iter (--grid max_iter where the grid sets it), --feature-scaling standard for a
    scaler (no advice to scale where the features are scaled so already); a larger tol,
    which is no option, becomes the fit kept as it is."""
    scaled = args.feature_scaling == "standard"
    grid = any(spec.partition("=")[0].strip() == "max_iter" for spec in args.grid)
    option, sep = ("--grid max_iter", "=") if grid else ("--max-iter", " ")
    scale = "--feature-scaling standard"
    rules = (
        (
            r"Increase max_iter,? or scale the features(?: \(e\.g\. StandardScaler\))?",
            f"Raise {option}" + ("" if scaled else f", or scale the features ({scale})"),
        ),
        (r"in max_iter=(\d+) (\w+)", rf"in \1 \2 ({option}{sep}\1)"),
        (r"(?<!--grid )\bmax_iter\b", option),  # not the option just written
        # "(and scale them, e.g. StandardScaler)" and the like: no advice where they are.
        (r" ?\((?:and,? )?(?:for features [^()]*, )?scale them, e\.g\. StandardScaler\)", "")
        if scaled
        else (r"e\.g\. StandardScaler", scale),
        (r"(?i)float64 features", r"\g<0> from a .npy or .npz file"),
        (r", or a larger tol to accept this one", "; mr2-probe keeps this one"),
        (r"Use a larger tol \(and, ", "mr2-probe keeps the fit as it stopped ("),
        (r"Use a larger tol\b", "mr2-probe keeps the fit as it stopped"),
        (r" or a larger tol\b", "; mr2-probe keeps the fit as it stopped"),
        (r"use a larger tol\b", "mr2-probe keeps the fit as it stopped"),
    )
    text = _one_line(message)
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def _fit(model, X, y, name: str, args):
    """``model`` fitted, its ConvergenceWarnings (a search's can be many) said in one line
    on stderr, their advice in mr2-probe's options."""
    if isinstance(model, GridSearchCV):
        with warnings.catch_warnings():  # (the filter reaches the workers too)
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X, y)
        results = model.cv_results_
        folds = [results[k] for k in results if re.fullmatch(r"split\d+_test_stopped_short", k)]
        # The solver's own reason, where this process has it: the refit's.
        reason = getattr(_final(model.best_estimator_), "_stop_reason", None)
        # A failed fit scores NaN in every column (GridSearchCV warns of it on its own).
        n_short, n_fits = int(np.nansum(folds)) + (reason is not None), np.size(folds) + 1
        if n_short:
            why = (
                f"the refit's: {_in_cli_terms(reason, args)}"
                if reason
                else _in_cli_terms("Increase max_iter or scale the features.", args)
            )
            print(
                f"mr2-probe: warning: {name}: {n_short} of its {n_fits} fits stopped short of "
                f"tol ({why})",
                file=sys.stderr,
            )
        return model
    short = fit_collecting_short(model, X, y)
    if short:
        fits = f"{len(short)} of its fits" if len(short) > 1 else "its fit"
        first = _in_cli_terms(short[0].message, args)
        print(f"mr2-probe: warning: {name}: {fits} stopped short of tol ({first})", file=sys.stderr)
    return model


def _front(models: dict, base, erm, X, y, X_test, y_test, args):
    """Fit the front of ``base`` (the MR² configuration, tuned when searched) with ``erm``
    (ERM's, tuned on its own) on a validation split, choose by the rule, refit the choice
    on all of the training data and add it to ``models``."""
    from .front import accuracy_front

    X_fit, X_val, y_fit, y_val = train_test_split(
        X, y, test_size=args.val_size, stratify=y, random_state=args.seed
    )
    print(f"fitting the front on {len(y_fit)} samples, choosing on {len(y_val)}", file=sys.stderr)
    with collecting_short() as short:  # the front gathers its fits' into one warning
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
            erm=erm,
        )
    for warning in short:
        text = _in_cli_terms(warning.message, args)
        print(f"mr2-probe: warning: front: {text}", file=sys.stderr)
    chosen = front.point(front.chosen)
    print(
        f"front: the rule chose {chosen.name}; refitting it on all training data", file=sys.stderr
    )
    name = f"chosen: {chosen.name}"
    models[name] = _fit(clone(chosen.estimator), X, y, name, args)
    return front


def _write_outputs(
    out: Path, report, lines: list, data: dict, front, fitted: dict, args, mr2_name, names
) -> None:
    """Models, class names, options, the three reports (each with the search's choices,
    the notes and the front), then the figures."""
    from .plotting import (
        plot_class_accuracy,
        plot_cv_curve,
        plot_front,
        plot_group_accuracy,
        plot_margins,
    )

    options = {key: value for key, value in vars(args).items() if key != "scale"}
    text, markdown = [report.to_text(per_class=True)], [report.to_markdown(per_class=True)]
    if lines:
        text.append("\n".join(lines))
        markdown.append("```text\n" + "\n".join(lines) + "\n```")  # the curves' columns
    if front is not None:
        text.append(front.to_text())
        markdown.append(front.to_markdown())
        data["front"] = front.to_dict()
    # The models and the reports are written whole beside their places, then moved into
    # them together: a run that fails or is killed leaves the earlier run's set, never a
    # truncated model or reports that describe other models.
    files = {  # command.json first: it marks the folder as a run's (_earlier_run)
        "command.json": _text(_strict_json(options, indent=2)),
        "models.joblib": lambda path: joblib.dump({k: _quiet(m) for k, m in fitted.items()}, path),
        "report.txt": _text("\n\n".join(text)),
        "report.md": _text("\n\n".join(markdown)),
        "report.json": _text(_strict_json(data, indent=2, ensure_ascii=False)),
    }
    if names is not None:
        files["class_names.json"] = _text(json.dumps(names, ensure_ascii=False))
    _replace_together(out, files)
    if names is None:  # an earlier run's class names would describe other data
        (out / "class_names.json").unlink(missing_ok=True)
    # Then the figures, each whole or not at all: none is left from the earlier run.
    for name in _FIGURES:
        (out / name).unlink(missing_ok=True)
    figures = {
        "class_accuracy.png": lambda path: plot_class_accuracy(report, path, model=mr2_name),
        "groups.png": lambda path: plot_group_accuracy(report, path),
        "margins.png": lambda path: plot_margins(_final(fitted[mr2_name]), path, class_names=names),
    }
    if front is not None:
        figures["front.png"] = lambda path: plot_front(front, path)
    searches = {name: m for name, m in fitted.items() if hasattr(_final(m), "Cs_")}
    if searches:
        figures["cv_curve.png"] = lambda path: plot_cv_curve(searches, path, scoring=args.scoring)
    for name, write in figures.items():
        _replace_together(out, {name: write})
    print(f"wrote report, plots and models to {out}/", file=sys.stderr)


def _strict_json(value, **kwargs) -> str:
    """JSON that strict parsers read: no Infinity or NaN, which ``json.dumps`` writes (as
    C=inf); infinities as the strings "inf" and "-inf", as the options take them, and NaN
    as null, as the reports write it."""

    def strict(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, dict):
            return {key: strict(item) for key, item in v.items()}
        if isinstance(v, list | tuple):
            return [strict(item) for item in v]
        return v

    return json.dumps(strict(value), allow_nan=False, **kwargs)


def _text(content: str):
    return lambda path: path.write_text(content + "\n")


def _replace_together(folder: Path, files: dict) -> None:
    """Write each file (name -> function writing a path) beside its place, then move them
    all into place; if a write fails, nothing is moved and the error names the file."""
    partial = {name: folder / f".{Path(name).stem}.partial{Path(name).suffix}" for name in files}
    try:
        for name, write in files.items():
            try:
                write(partial[name])
            except OSError as err:
                message = f"cannot write {folder / name}: {err.strerror or err}"
                raise OSError(err.errno, message) from err
        for name in files:
            os.replace(partial[name], folder / name)
    finally:
        for path in partial.values():
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
