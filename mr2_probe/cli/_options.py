"""``mr2-probe``'s command line: its options, their parsing and the checks that need no file."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections import Counter
from numbers import Real

import numpy as np
from sklearn.base import clone
from sklearn.model_selection import ParameterGrid
from sklearn.preprocessing import StandardScaler

from .._classifier import MR2LinearClassifier
from .._data import as_given
from .._device import resolve_device
from ..front import _READ_BY_SOME as _READS
from ._feature_files import feature_format
from ._scaling import RowNormalizer
from ._usage import SuggestingParser, UsageError, _one_line, add_version

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
  report.txt, report.md  the class-wise tables (one row per class too), the search's
                         choices (--Cs: with its validation curves) and the front,
                         accuracies in percent
  report.json            the same in percent ("units": "percent")
  class_accuracy.png     per-class accuracy of the MR² model against ERM
  margins.png            the MR² model's margin per class (or that it has none)
  groups.png             easy / medium / hard / worst-class accuracy of every model
  front.png              the accuracy front (with --tilt or --offsets)
  cv_curve.png           held-out scores against C (the logit scale for a cosine head),
                         one line per scorer (with --Cs)
  models.joblib          the fitted models, a dict keyed by the report's model names
  class_names.json       the class names of an HDF5 store: class k is entry k
  command.json           the command as typed (argv, cwd) and the options of the run,
                         their paths absolute
  A run replaces an earlier run's files there, and says so when it starts; a folder
  holding files of these names that no earlier run wrote (no command.json) is refused,
  and so is a folder that another run is writing to.

labels:
  The models learn the labels exactly as the training file holds them and predict the
  same kind, but for float labels (whole numbers) below 2**53, read as integers (10.0
  as 10). A store's labels are integer codes 0..K-1 into its own class names; the
  models predict the training store's codes (class_names.json). A test store's classes
  are matched to the training store's by name (it may lack some or order them
  differently), and so are text labels of a NumPy file against a store's names; a class
  the training data lacks is refused. To score a store yourself,
  translate its labels by name first:
    models = joblib.load("runs/fmnist/models.joblib")  # "ERM grid", ... after --grid
    trained = json.load(open("runs/fmnist/class_names.json", encoding="utf-8"))
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
  so is a front interrupted by Ctrl-C, with status 130 (Ctrl-C elsewhere: 130; before
  the models and reports are written, nothing is; while the figures are drawn, those
  not yet drawn are missing); SIGTERM stops a run as Ctrl-C does, with status 143. A
  figure that cannot be drawn or written is missing too: the error is said, the other
  figures are drawn, and the status is 1. A fit of ERM or MR² that runs out of memory
  is said in one line with the options that take less (--device cpu, ...), status 1;
  nothing is written, not even a model fitted before it.
"""

# l2: Normalizer, its row norms computed without overflow (see RowNormalizer)
_SCALERS = {"none": None, "standard": StandardScaler, "l2": RowNormalizer}
_SCORINGS = ("accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "class_std")


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


def _dest(option: str) -> str:
    """The name in ``args`` of a command-line option (``--logit-scale``: logit_scale)."""
    return option[2:].replace("-", "_")


def _parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
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
        "(or features and labels; class_names, if given, name integer labels), or a .npy "
        "with --labels, e.g. train.h5; each file is read "
        "as what its content is, whatever its name",
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
    parser.add_argument(
        "--max-iter", type=int, default=100, help="iterations / epochs (default: 100)"
    )
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
        help="metric the grid search or --Cs chooses by (default: worst_class)",
    )
    parser.add_argument(
        "--n-jobs",
        type=int,
        default=None,
        help="fits run in parallel: the grid search's, or the folds of --Cs (which solves "
        "them as one batched problem where it can, on torch's threads)",
    )
    parser.add_argument(
        "--tilt",
        type=_floats,
        action=_Once,
        default=(),
        metavar="T1,T2",
        help="class_tilt values of the front's tilt sweep on the MR² model, e.g. "
        "0,0.5,1,2,5,10 (0 is the MR² model itself)",
    )
    parser.add_argument(
        "--offsets",
        type=_floats,
        action=_Once,
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
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the --test-size split, a search's folds, the front's split and the "
        "minibatch solvers (--lam > 0) (default: 0)",
    )
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
    add_version(parser, ("numpy", "scikit-learn", "torch"))
    return parser


class _Once(argparse.Action):
    """Store an option's list of values, given once: --tilt 0 --tilt 1 kept 1 alone
    (argparse's last one wins), where --grid, given once per name, adds up."""

    def __call__(self, parser, namespace, values, option_string=None):
        earlier = getattr(namespace, self.dest, None)
        if earlier not in (None, self.default):
            # Each value once, in full (not :g's six digits): the cure is refused
            # otherwise, --tilt 1,1 as a value given twice, or is another front.
            every = ",".join(str(v).removesuffix(".0") for v in dict.fromkeys((*earlier, *values)))
            raise argparse.ArgumentError(
                self, f"given twice; give all its values at once, e.g. {option_string} {every}"
            )
        setattr(namespace, self.dest, values)


def _optional_float(text: str):
    try:
        return None if text.lower() in ("none", "null") else float(text)
    except ValueError:  # argparse named the function: "invalid _optional_float value"
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) + 0.0 for v in text.split(","))  # (−0 is 0, named so)
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
        if any(not v.strip() for v in values.split(",")):  # (two commas, or one at an end)
            raise UsageError(
                f"--grid {name} has an empty value in {spec!r}; separate its values by single "
                f"commas, e.g. --grid {name}=V1,V2"
            )
        grid[name] = [_grid_value(v) for v in values.split(",")]
        # (1 and 1.0 are one value, true and 1 two: a search fitted the same model twice)
        counts = Counter((isinstance(v, bool), v) for v in grid[name])
        repeated = [v for (_, v), n in counts.items() if n > 1]
        if repeated:
            shown = ", ".join(
                str(v).lower() if v is None or isinstance(v, bool) else str(v) for v in repeated
            )
            raise UsageError(
                f"--grid {name} gives {shown} more than once; each value is one model of the search"
            )
    return grid


def _grid_value(text: str):
    text = text.strip()
    if text.lower() in ("none", "null"):
        return None
    if text.lower() in ("true", "false"):  # fit_intercept
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _given(argv) -> frozenset:
    """The options given on the command line (their ``dest``), whatever their values:
    parsed again without defaults, so that argparse sets only what the command line names."""
    parser = _parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv)))


# The options of the front and of a search: what each applies to.
_FRONT, _SEARCH = "the front (--tilt, --offsets)", "a search (--grid, --Cs)"
_LEVER_OPTIONS = dict.fromkeys(("val_size", "front_bound"), _FRONT)
_LEVER_OPTIONS |= dict.fromkeys(("cv", "scoring", "n_jobs"), _SEARCH)


def _unread_options(args) -> set[str]:
    """The options (by their names in ``args``) that this run does not read: the front's
    without a front, a search's without a search, --test-size beside --test, and --seed
    where nothing is split or drawn at random."""
    has = {_FRONT: bool(args.tilt or args.offsets), _SEARCH: bool(args.grid) or args.Cs is not None}
    unread = {name for name, lever in _LEVER_OPTIONS.items() if not has[lever]}
    if args.test is not None:
        unread.add("test_size")
        # L-BFGS (lam = 0) draws nothing: the seed splits and orders minibatches only.
        if not any(has.values()) and args.lam == 0:
            unread.add("seed")
    return unread


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
    unread = _unread_options(args)
    for name, what in _LEVER_OPTIONS.items():
        if getattr(args, name) is not None and name in unread:
            option = f"--{name.replace('_', '-')}"
            raise UsageError(f"{option} applies to {what}, which this run has not; drop it")
    if args.seed is not None and "seed" in unread:
        raise UsageError(
            "--seed seeds the --test-size split, a search's folds (--grid, --Cs), the front's "
            "split (--tilt, --offsets) and the minibatch solvers (--lam > 0), none of which "
            "this run has; drop it"
        )
    args.seed = 0 if args.seed is None else args.seed
    for name, default in _LEVER_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for option, value in (("--test-size", args.test_size), ("--val-size", args.val_size)):
        if not 0 < value < 1:
            raise UsageError(
                f"{option} must be a fraction between 0 and 1 (both excluded), e.g. 0.2; "
                f"got {as_given(value)}"
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
            f"got {as_given(args.front_bound)}"
        )
    bad = [b for b in args.offsets if not 0 <= b < 100]
    if bad:
        raise UsageError(
            "--offsets bounds are in points of overall accuracy, between 0 and 100, e.g. "
            f"0,0.25,0.5,1; got {as_given(bad[0])}"
        )
    for option, values in (("--tilt", args.tilt), ("--offsets", args.offsets)):
        repeated = sorted(v for v, n in Counter(values).items() if n > 1)
        if repeated:
            raise UsageError(
                f"{option} gives {', '.join(map(as_given, repeated))} more than once; each "
                "value is one point of the front"
            )
    mr2_is_erm = args.c_bar is None and args.lam == 0 and not args.grid
    if args.tilt and not args.offsets and mr2_is_erm and not any(t > 0 for t in args.tilt):
        # (the front failed after every other fit, in the library's terms)
        raise UsageError(
            "--tilt 0 with --c-bar none is a front of ERM alone (MR² is then ERM's "
            "configuration); give --tilt values above 0, --offsets, or a --c-bar"
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
        # (A file that is missing or of no known format is load_xy's to say so.)
        if labels is not None and feature_format(features) not in (".npy", ""):
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
            given = as_given(value)
            print(
                f"mr2-probe: warning: {option} is in points of overall accuracy: {given} is "
                f"{given} pt; the fraction {given}, as the Python API takes it, is "
                f"{option} {100 * value:g}",
                file=sys.stderr,
            )


#: Parameters that change no model of a search: why, for --grid's refusal.
_NOT_SEARCHED = {
    "verbose": "verbose sets the progress output, not the model (--no-progress hides it)",
    "warm_start": "each fit of a search starts from a fresh copy of the probe, so "
    "warm_start changes no model",
    "device": "device sets where the fits run, not the model (--device chooses it)",
}


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
            # (c for C, a case apart, which difflib misses; c-bar for c_bar)
            spelt = {key.lower(): key for key in params}
            key = name.lower().replace("-", "_")
            close = [spelt[key]] if key in spelt else difflib.get_close_matches(name, params, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"--grid {name}: MR2LinearClassifier has no parameter {name!r}; {hint}"
                f"its parameters are {', '.join(sorted(params))}"
            )
        if name in _NOT_SEARCHED:  # no value changes the model a search fits
            raise UsageError(f"--grid {name}: {_NOT_SEARCHED[name]}; drop it")
        for value in values:
            if isinstance(value, bool) and not isinstance(params[name], bool):
                # scikit-learn's numeric constraints take True as 1
                raise UsageError(f"--grid {name}={str(value).lower()}: {name} is no true/false")
            if name == "max_iter" and isinstance(value, Real) and value < 1:
                raise UsageError(f"--grid max_iter={value}: max_iter must be at least 1")
            try:
                clone(mr2).set_params(**{name: value})._validate_params()
            except ValueError as error:
                raise UsageError(f"--grid {name}={value}: {_one_line(error)}") from error
    for name, option in _OPTIONS.items():
        if name in grid and _dest(option) in given:
            raise UsageError(
                f"--grid {name} searches the value that {option} sets; pass one of them"
            )
    if "class_tilt" in grid and (args.tilt or args.offsets):
        # The front fits its MR² point untilted: a tilt the grid chose would be dropped.
        raise UsageError(
            "--tilt sweeps class_tilt on the MR² model for the front, and --grid class_tilt "
            "searches it; pass one of them"
            if args.tilt
            else "--offsets draws the front, whose MR² point is untilted (--tilt sweeps "
            "class_tilt), and --grid class_tilt searches it; pass one of them"
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
    # (a combination left out of the search is no choice of it)
    erm_like = [
        c.get("c_bar", args.c_bar) is None and not c.get("lam", args.lam)
        for c, reason in reasons
        if not reason
    ]
    untilted = args.tilt and not args.offsets and not any(t > 0 for t in args.tilt)
    if grid and untilted and all(erm_like):
        # (as without --grid: the front failed after every other fit, in the library's terms)
        given = "--grid c_bar=none" if "c_bar" in grid else "--c-bar none"
        raise UsageError(
            f"--tilt 0 with {given} is a front of ERM alone (MR² is then ERM's configuration, "
            "whatever the grid chooses); give --tilt values above 0, --offsets, or a c_bar"
        )
    if grid and untilted and any(erm_like):  # known only once the search has chosen
        # ERM's configuration is also what ERM's own search chooses of the parameters the
        # two share: a choice of c_bar=None, lam=0 at another C is a front of two points.
        # (It said that any choice of c_bar=None, lam=0 left the front out.)
        shared = _shared_with_erm(grid, mr2, [c for c, reason in reasons if not reason])
        theirs = (
            f", and the {' and '.join(shared)} that ERM's own search chooses; another "
            f"{' or '.join(shared)} is a point of its own"
            if shared
            else ""
        )
        print(
            "mr2-probe: warning: --tilt 0 with a --grid that may choose ERM's configuration "
            f"(c_bar=None, lam=0{theirs}): where it does, the front is one of ERM alone and "
            "is left out (exit status 1); give --tilt values above 0 or --offsets to draw it "
            "whatever the search chooses",
            file=sys.stderr,
        )
    models = [clone(mr2).set_params(**c) for c, reason in reasons if not reason]
    for name, (reads, what, advice) in _READ_BY_SOME.items():
        option = _OPTIONS.get(name)
        if name in grid:  # searched, it would choose among fits of one model
            given_as, whose = f"--grid {name}", "search"
        elif option is not None and _dest(option) in given:  # accepted, and read by none
            given_as, whose, advice = option, "run", advice.replace("search it", "use it")
        else:
            continue
        if not any(reads(model) for model in models):
            raise UsageError(
                f"{given_as} sets {what}, which no model of this {whose} reads: drop it, or "
                f"{advice}"
            )
    minibatch_only = sorted(MINIBATCH_ONLY & set(grid))
    if minibatch_only and all(_solver(mr2, c) in (None, "lbfgs") for c in combinations):
        name = minibatch_only[0]  # searched, it chose among fits of one model
        raise UsageError(
            f"--grid {name} sets the minibatch solvers' {name.replace('_', ' ')}, and every "
            "model of this search is fitted by L-BFGS (--lam 0), which does not read it: "
            "drop it, or search it with --lam > 0"
        )
    if "scale" in grid and "cosine" not in grid.get("head", [args.head]):
        raise UsageError(
            "--grid scale searches the cosine head's logit scale, which no model of this "
            "search has; add --head cosine (or head=cosine to the grid), or search C"
        )
    if args.logit_scale is not None and "cosine" not in grid.get("head", [args.head]):
        raise UsageError(
            "--logit-scale sets the cosine head's logit scale; add --head cosine, or drop "
            "--logit-scale (to scale the features, use --feature-scaling)"
        )


def _shared_with_erm(grid: dict, mr2: MR2LinearClassifier, combinations: list) -> list[str]:
    """The --grid names that ERM searches too (all but _MR2_ONLY) and that an MR² model
    of ERM's configuration among ``combinations`` (c_bar=None, lam=0) reads: where ERM's
    search chooses another value of one, the two are two models."""
    read = set()
    for combination in combinations:
        model = clone(mr2).set_params(**combination)
        if model.c_bar is None and not model.lam:
            read |= {k for k in combination if k not in _READS or _READS[k](model)}
    return [name for name in grid if name in read and name not in _MR2_ONLY]


def _check_on_data(grid: dict, args, n_features: int) -> None:
    """The head and what --grid searches, checked against the training features once they
    are read: a projection_rank above their count, or a cosine head of one feature,
    fails every fit of it, after the other fits (a search then left it out, or ended in
    scikit-learn's "All the fits failed")."""
    too_large = [r for r in grid.get("projection_rank", []) if r is not None and r > n_features]
    if too_large:
        raise UsageError(
            f"--grid projection_rank={too_large[0]}: the features have {n_features} "
            f"columns, and a projection's rank is at most that; search ranks up to "
            f"{n_features} (none is the full projection)"
        )
    if n_features < 2 and "cosine" in grid.get("head", [args.head]):
        given = "--grid head=cosine" if "head" in grid else "--head cosine"
        raise UsageError(
            f"{given} needs at least 2 features, and the features have 1: the cosine of a "
            "single feature with any direction is ±1; use the linear head"
        )


#: The parameters that only the minibatch solvers read (L-BFGS does not; random_state
#: seeds their order, and a projection's start, which only they fit).
MINIBATCH_ONLY = frozenset({"batch_size", "learning_rate", "n_iter_no_change", "random_state"})

#: Parameters that only some models read: whether a model reads it (the front's rule, which
#: tells ERM's model fitted again from an MR² point), what it sets, advice.
_READ_BY_SOME = {
    name: (_READS[name], what, advice)
    for name, what, advice in [
        ("tau", "the compactness loss's temperature", "search it with --lam > 0"),
        (
            "projection_rank",
            "the rank of the projection that --lam > 0 adds",
            "search it with --lam > 0",
        ),
        ("fit_intercept", "the linear head's bias", "search it with the linear head"),
        (
            "p",
            "the norm of the class statistics behind the margins",
            "search it with margins (--c-bar other than none)",
        ),
        (
            "difficulty",
            "what the margins measure a class's difficulty by",
            "search it with margins (--c-bar other than none)",
        ),
    ]
}


def _solver(probe: MR2LinearClassifier, combination: dict) -> str | None:
    """The solver that fits ``probe`` with ``combination``; None where that is no model
    (see _no_model)."""
    try:
        return clone(probe).set_params(**combination)._check_solver()
    except ValueError:
        return None


def _no_model(probe: MR2LinearClassifier, combination: dict) -> str | None:
    """Why a grid combination is no model of ``probe`` (None where it is one)."""
    try:
        clone(probe).set_params(**combination)._check_solver()
    except ValueError as error:
        return _one_line(error)
    return None
