"""``mr2-probe``'s run: the probes built, fitted, compared class by class and written."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, FitFailedWarning
from sklearn.model_selection import GridSearchCV, ParameterGrid
from sklearn.pipeline import Pipeline

from .._classifier import MR2LinearClassifier
from .._cv import MR2LinearClassifierCV
from ..front import _final, _pass_on, collecting_short, fit_collecting_short
from ..metrics import classwise_scorers
from ..report import classwise_report, flat_text, in_percent
from ._feature_files import _features_sizes, _in_bytes, _stays_in_file, _streams
from ._inputs import _inputs, _inputs_record
from ._options import (
    _MR2_ONLY,
    _OPTIONS,
    _READ_BY_SOME,
    _SCALERS,
    MINIBATCH_ONLY,
    _check_grid,
    _check_on_data,
    _check_options,
    _given,
    _grid,
    _no_model,
    _parser,
    _solver,
)
from ._outputs import _OUTPUTS, _claim_out, _once, _prepare_out, _write_models, _write_outputs
from ._splits import _check_scaled_test, _check_splits, _front_split, _search_folds
from ._usage import (
    RunError,
    Terminated,
    UsageError,
    _one_line,
    _out_of_memory,
    _terminated_as_interrupted,
    warnings_in_one_line,
)


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


def main(argv=None) -> int:
    """Run ``mr2-probe``; returns 0 (1 where the front or a figure failed and was left
    out, 130 where the front was interrupted, 143 where it was terminated (SIGTERM): the
    main models are reported and written either way), or exits with status 2 and one line
    on a mistake, 130 on Ctrl-C elsewhere (143 on SIGTERM, where run as the command:
    ``main(argv)`` leaves SIGTERM to end its program)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with (
            warnings_in_one_line("mr2-probe", raw=args.debug),
            _terminated_as_interrupted(command=argv is None),
        ):
            return _run(args, _given(argv), _launched(argv))
    except KeyboardInterrupt as stop:
        if args.debug:
            raise
        if isinstance(stop, Terminated):
            parser.exit(143, "mr2-probe: terminated\n")
        parser.exit(130, "mr2-probe: interrupted\n")
    except RunError as error:  # (--debug raised the error it stands for where it was)
        parser.exit(1, f"mr2-probe: error: {error}\n")
    except (ValueError, OSError, ImportError) as error:
        # The checks' UsageError, the stores' StoreError (a ValueError), scikit-learn's
        # InvalidParameterError and ValueErrors about the data, files that fail to open.
        if args.debug:
            raise
        parser.exit(2, f"mr2-probe: error: {_one_line(error)}\n")


def _launched(argv) -> dict:
    """The command line as typed and the folder it was typed in, for command.json: its
    options' paths are made absolute there, and these keep the command visible as given."""
    try:
        cwd = os.getcwd()
    except OSError:  # (a folder removed under the shell: the typed paths are all there is)
        cwd = None
    return {"argv": list(sys.argv[1:] if argv is None else argv), "cwd": cwd}


def _run(args, given: frozenset = frozenset(), launched: dict | None = None) -> int:
    # Everything that can be wrong with the options and the output folder is found before
    # any file is read; everything wrong with the inputs, before any fit.
    _check_options(args)
    erm, mr2 = _estimators(args)
    grid = _grid(args.grid)
    _check_grid(grid, mr2, args, given)
    out = _prepare_out(args.out) if args.out is not None else None
    with contextlib.ExitStack() as stack:  # the stores read, and --out, until the run ends
        # A store's features larger than a quarter of memory stay in the file, read a block
        # at a time by each fit and prediction, where every model of the run streams them:
        # a probe, or its --Cs search. A scaler (--feature-scaling), a --grid search (its
        # folds are copies) and the front (--tilt, --offsets) take arrays, and read the
        # stores whole.
        streamed = args.feature_scaling == "none" and not grid and not (args.tilt or args.offsets)
        try:
            inputs = _inputs(args, stack if streamed else None)
        except (RuntimeError, MemoryError) as error:
            # (a traceback, where a fit out of memory ends in one line)
            what = _out_of_memory(error)
            if what is None or args.debug:
                raise
            raise RunError(_inputs_out_of_memory_line(what, args, grid)) from error
        _check_splits(inputs[1], grid, args, inputs[4])
        _check_on_data(grid, args, inputs[0].shape[1])
        held_out = inputs[5].get("held_out")
        _check_scaled_test(*inputs[:3], args, searched=bool(grid), held_out=held_out)
        if out is not None:  # created once the inputs are checked: a refused run leaves none
            stack.enter_context(_claim_out(out))
        return _fit_and_report(args, erm, mr2, grid, out, *inputs, launched=launched)


def _fit_and_report(
    args, erm, mr2, grid, out, X, y, X_test, y_test, names, sources, launched=None
) -> int:
    """The models fitted, compared, printed and written to ``out``; the exit status."""
    replaced = [name for name in _OUTPUTS if out is not None and (out / name).exists()]
    if replaced:  # said once the run is known to start
        print(
            f"mr2-probe: --out {args.out!r} holds an earlier run's {', '.join(replaced)}; "
            f"this run replaces {'it' if len(replaced) == 1 else 'them'} when it ends "
            "(choose another --out to keep them)",
            file=sys.stderr,
        )

    erm_grid = {key: values for key, values in grid.items() if key not in _MR2_ONLY}
    if not any(_without_unused(erm, c) for c in ParameterGrid(erm_grid)):
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
        try:
            _fit(model, X, y, name, args)
        except (RuntimeError, MemoryError) as error:
            # Out of memory (torch's RuntimeError, MemoryError): a traceback, status 1.
            # Nothing is written, as for any main fit that fails: a run writes ERM and MR²
            # together (the reports compare them), and an earlier run's files in --out
            # stay whole. (The front differs: it fails after both are fitted.)
            what = _out_of_memory(error)
            if what is None or args.debug:
                raise
            raise RunError(_out_of_memory_line(name, what, error, list(models), args)) from error
    front = front_error = None
    status = 0
    if args.tilt or args.offsets:
        # Each model as its search chose it: the front's ERM is the reported ERM.
        base, erm_base = (_chosen_configuration(models[n]) for n in (mr2_name, erm_name))
        for configuration in (base, erm_base):
            _final(configuration).set_params(verbose=0)
        try:
            fitted_as = {"ERM": erm_name, "MR2": mr2_name}
            front = _front(models, base, erm_base, X, y, X_test, y_test, args, fitted_as)
        except (Exception, KeyboardInterrupt) as error:
            # The models already fitted are reported and written without the front; the
            # run still ends in an error (status 1, or 130 for Ctrl-C as elsewhere, 143 for
            # SIGTERM). Whatever the error: a front that ran out of memory (torch's
            # RuntimeError, MemoryError) lost every model fitted before it.
            if args.debug:
                raise
            if isinstance(error, Terminated):
                front_error, status = "the front was terminated and is left out", 143
            elif isinstance(error, KeyboardInterrupt):
                front_error, status = "the front was interrupted and is left out", 130
            else:
                # (its tilt as --tilt's, as the front's warnings say it)
                why = _in_cli_terms(_front_terms(_one_line(error)), args, fit=False)
                if not isinstance(error, ValueError):  # (a ValueError's says what was wrong)
                    why = f"{type(error).__name__}: {why}" if why else type(error).__name__
                front_error, status = f"the front failed and is left out: {why}", 1
            print(f"mr2-probe: error: {front_error}", file=sys.stderr)
    fitted = {name: getattr(m, "best_estimator_", m) for name, m in models.items()}

    def named(labels):  # a store's integer codes -> its class names, for the report only
        return np.asarray(labels) if names is None else np.asarray(names)[labels]

    predictions = {}
    for name, model in fitted.items():
        try:
            predictions[name] = named(model.predict(X_test))
        except (RuntimeError, MemoryError) as error:
            # Out of memory after the fits (torch's RuntimeError, MemoryError) ended in a
            # traceback, where a main fit's ends in one line: the same line, and the
            # fitted models are written (the reports, which need the predictions, not).
            what = _out_of_memory(error)
            if what is None or args.debug:
                raise
            if out is not None:
                _write_models(out, fitted, args, names, launched)
            raise RunError(_predict_out_of_memory_line(name, what, error, out, args)) from error
    # The classes in the order of their codes (class_names.json), not sorted by name.
    order = named(np.unique(y_test))
    report = classwise_report(predictions, named(y_test), reference=erm_name, labels=order)
    search = {
        name: {key.removeprefix("probe__"): v for key, v in model.best_params_.items()}
        for name, model in _once(models).items()
        if hasattr(model, "best_params_")
    }
    notes = []
    if _final(fitted[mr2_name]).c_bar is None:
        how = "the search chose c_bar=None" if "c_bar" in grid else "c_bar=None"
        plain = _final(fitted[mr2_name]).lam == 0 and _final(fitted[mr2_name]).class_tilt == 0
        what = "plain cross-entropy (γ_k = 1)" if plain else "γ_k = 1"
        notes.append(f"{mr2_name} has no margins: {how}, {what}")
    untested = np.setdiff1d(np.unique(y), np.unique(y_test))
    if len(untested):  # scored over the classes the test set holds, as the table is
        shown = ", ".join(map(flat_text, named(untested)[:5]))
        shown += ", ..." if len(untested) > 5 else ""
        notes.append(
            f"the test set holds no sample of {len(untested)} of the {len(np.unique(y))} "
            f"training classes ({shown}): every score is over the classes it holds"
        )
    if front_error is not None:
        notes.append(front_error)
    lines = [
        f"{name}: best parameters by {args.scoring} ({args.cv}-fold CV): {best}"
        for name, best in search.items()
    ]
    searches = {name: _final(m) for name, m in _once(fitted).items() if hasattr(_final(m), "Cs_")}
    lines += [line for name, cv in searches.items() for line in _cv_lines(name, cv, args)]
    notes += [note for name, cv in searches.items() for note in _tie_note(name, cv, args)]
    notes += [
        note for name, grid in _once(models).items() for note in _grid_tie_note(name, grid, args)
    ]
    lines += [f"note: {note}" for note in notes]

    _print_results(
        [report.to_text(per_class=args.per_class), *(["\n".join(lines)] if lines else [])]
        + ([front.to_text()] if front is not None else [])
    )
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
        written = (out, report, lines, data, front, fitted, args, mr2_name, names, launched)
        if _write_outputs(*written):
            status = status or 1  # a figure failed and is missing
    return status


def _memory_ran_out(error, args) -> tuple[bool, bool]:
    """Whether ``error`` (out of memory) is the host's, and whether it is a GPU's, where
    --device cpu would use the machine's memory instead."""
    from .._device import resolve_device

    host = isinstance(error, MemoryError) or "can't allocate memory" in str(error)
    return host, not host and resolve_device(args.device).type != "cpu"


# What makes a store of a .npz's or .npy's arrays (extract.load_features reads it as one).
_ANY_STORE = (
    "; h5py writes one: datasets 'features' (n, d), 'labels' (n,) of codes 0..K-1 and "
    "'class_names' (K,)"
)


def _inputs_out_of_memory_line(what: str, args, grid: dict) -> str:
    """The one line of inputs that ran out of memory as they were read (``what``: its
    error, short): the features read into memory, and what reads them in less. A store's
    above the limit (a quarter of memory) stays in its file without the options under
    which the run reads it whole; a .npz or .npy file is read whole, which a store in its
    place above the limit is not; integer features are read whole from any file, which a
    store of float32 features in their place is not where those are above the limit (uint8
    features within it, too), and 64-bit ones within it as float32 are read whole from
    any file of float32 features, in half the memory; features within the limit are read
    whole whatever the options (the advice to leave those options out was given for them
    too)."""
    whole = [
        option
        for option, given in (
            (f"--feature-scaling {args.feature_scaling}", args.feature_scaling != "none"),
            ("--grid", bool(grid)),
            ("--tilt", bool(args.tilt)),
            ("--offsets", bool(args.offsets)),
        )
        if given
    ]
    limit, sizes = _features_sizes(args)
    # (a store above the limit that the run streamed is not among those read; the limit
    # is set on the features' bytes in memory, as the run sets it)
    read = [
        features
        for features in sizes
        if whole
        or not features.store
        or features.held is None
        or not _stays_in_file(features.dtype, features.held, limit)
    ]
    # Integers are read whole from any file, a store's too, so only floats cure them: a
    # store of float32 features streams them where those are above the limit, however
    # small the integers themselves (uint8's are a quarter of it).
    integers = [f for f in read if _float32_cures(f, limit)]
    large = [f for f in read if f.held is not None and f.held > limit or f in integers]
    # Every one large has a cure: a store's floats are among them only under the options
    # that read them whole.
    arrays = [f.path for f in large if not f.store and _streams(f.dtype)]
    # (64-bit integers within the limit as float32: float32 features, in any file, are
    # read whole in half their memory; a store of them does not stream them)
    halved = [f.path for f in integers if f.as_float32 <= limit]
    integers = [f.path for f in integers if f.as_float32 > limit]
    advice = []
    if large:
        cures = [f"an HDF5 store in place of {', '.join(arrays)}"] if arrays else []
        if integers:
            cures.append(f"an HDF5 store of float32 features in place of {', '.join(integers)}")
        streamed = [f for f in large if f.path not in halved]  # (without the options)
        if whole and streamed:
            cures.append(f"without {', '.join(whole)}")
        # (mr2-extract makes a store of images, not of the arrays: h5py makes one of them)
        made = any(not f.store for f in streamed)
        kind, not_integers = (
            ("floating-point features", "; integer ones are read whole")
            if integers or halved
            else ("features", "")
        )
        if cures:
            advice.append(
                f"{', '.join(cures)} (a store's {kind} above a quarter of memory then stay in "
                f"its file, read a block at a time{not_integers}{_ANY_STORE if made else ''})"
            )
        if halved:
            advice.append(
                f"float32 features in place of {', '.join(halved)} (in any file: read whole, "
                "in half the memory of 64-bit integers, within a quarter of memory)"
            )
    advice.append("freeing memory, or a machine with more")
    shown = ", ".join(_held(features, limit) for features in read)
    held = f"The features read into memory: {shown} (a quarter of memory: {_in_bytes(limit)})"
    if not large and all(features.held is not None for features in read):
        held += "; no option of the command reads them in less"
    return (
        f"reading the inputs ran out of memory ({what}); nothing is written. "
        f"{held + '. ' if read else ''}Try {', or '.join(advice)}"
    )


def _float32_cures(features, limit: int) -> bool:
    """Whether a store of float32 features in place of an input file's integer features
    (a ``_feature_files._Features``), which are read whole from any file, reads them in less:
    above the limit as float32 it streams them (uint8's a quarter of that size are read
    whole), and int64's it holds in half where not."""
    if features.held is None or _streams(features.dtype):
        return False
    return max(features.held, features.as_float32) > limit


def _held(features, limit: int) -> str:
    """An input file's features as the line of inputs out of memory says them (a
    ``_feature_files._Features``): their size in memory, and in the file where it differs (float16
    features are read as float32); integers that float32 features cure, their size as those
    (``limit``: a quarter of memory)."""
    if features.held is None:
        return features.path
    said = f"{features.path}: {_in_bytes(features.held)}"
    if features.held != features.stored:
        said += f" ({_in_bytes(features.stored)} of {features.dtype} in the file)"
    if _float32_cures(features, limit):
        said += f" ({_in_bytes(features.as_float32)} as float32)"
    return said


def _predict_out_of_memory_line(name: str, what: str, error, out, args) -> str:
    """The one line of ``name``'s predictions that ran out of memory after the fits, the
    models written to ``out`` (None: no --out, nothing written)."""
    host, on_gpu = _memory_ran_out(error, args)
    kept = (
        f"the fitted models are written to {out / 'models.joblib'}, the reports are not"
        if out is not None
        else "nothing is written (no --out)"
    )
    advice = "--device cpu (the machine's memory; slower)" if on_gpu else "freeing memory"
    return (
        f"{name} ran out of {'memory' if host else 'the device memory'} in its predictions "
        f"after the fits ({what}); {kept}. Try {advice}, or a machine with more"
    )


def _out_of_memory_line(name: str, what: str, error, names: list, args) -> str:
    """The one line of a main fit (``name``'s, of the models ``names``) that ran out of
    memory (``what``: its error, short), with the command's options that take less."""
    host, on_gpu = _memory_ran_out(error, args)
    fitted = names[: names.index(name)]
    lost = f" ({', '.join(fitted)}, fitted before it, neither)" if fitted else ""
    advice = ["--device cpu (the machine's memory; slower)"] if on_gpu else []
    if on_gpu and args.Cs is not None:  # (MR2LinearClassifierCV's one batch of all folds)
        advice.append("fewer --cv folds (--Cs solves them together on a GPU)")
    if args.n_jobs not in (None, 1) and (args.grid or args.Cs is not None):
        advice.append("fewer --n-jobs (each parallel fit holds its own memory)")
    if not advice:  # (no option of the command takes less)
        advice.append("freeing memory, or a machine with more")
    return (
        f"{name} ran out of {'memory' if host else 'the device memory'} in its fit ({what}); "
        f"nothing is written{lost}. Try {', or '.join(advice)}"
    )


def _print_results(parts: list[str]) -> None:
    """The run's tables on stdout. A reader that closes it early (``| head``, a pager left)
    does not stop the run, whose models are fitted: the rest of stdout goes to the null
    device, and --out is written as without it. (A BrokenPipeError, an OSError, ended the
    run as a mistake in the inputs, status 2, before --out was written.) A stdout that
    cannot encode a character (γ, ≤, a class name; cp1252, ASCII) shows it as ``?``, as
    stderr shows it escaped, instead of ending the run as a mistake."""
    text = "\n".join(parts)
    try:
        try:
            print(text, flush=True)
        except UnicodeEncodeError:  # raised before any of the text is written
            encoding = sys.stdout.encoding or "utf-8"
            print(text.encode(encoding, errors="replace").decode(encoding), flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit would fail again
        os.close(devnull)


def _curves(search, args) -> dict:
    from ..plotting import cv_curves

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


def _tie_note(name: str, search, args) -> list[str]:
    """A note where a search's every value scored the same: it chose the first, as
    LogisticRegressionCV breaks ties, which tells nothing (worst-class accuracy 0 at every
    C where a class has a few samples chose the strongest penalty, a near-constant model,
    without a word)."""
    own = np.asarray(next(iter(_curves(search, args).values())), dtype=float)
    what = "scale" if search.head_ == "cosine" else "C"
    return _tied(name, own, args, what, f"{what}={search.C_:.4g}", "LogisticRegressionCV")


def _grid_tie_note(name: str, search, args) -> list[str]:
    """:func:`_tie_note` for a --grid search (GridSearchCV, which chooses the first of
    settings scored the same too): its choice of C=0.0001 among C=0.0001,1,100, all of
    worst-class accuracy 0, was said nowhere. Nothing for a model that searched nothing."""
    if not hasattr(search, "cv_results_"):
        return []
    means = np.asarray(search.cv_results_[f"mean_test_{args.scoring}"], dtype=float)
    # (its scorer's sign: class_std is scored negated)
    flip = args.scoring == "class_std"
    return _tied(name, means, args, "setting", _chosen(search), "GridSearchCV", flip)


def _chosen(search) -> str:
    """A --grid search's choice as its settings: "c_bar=1, C=0.1" (none before a fit)."""
    return ", ".join(
        f"{k.removeprefix('probe__')}={v}" for k, v in getattr(search, "best_params_", {}).items()
    )


def _tied(
    name: str, scores: np.ndarray, args, what: str, chose: str, peer: str, flip: bool = False
) -> list[str]:
    """The tie note of a search whose ``scores`` (one per value or setting ``what``; NaN
    where its fit failed: no tie of one) are all the same: it chose the first, ``chose``,
    as ``peer`` breaks ties. ``flip``: the scores are the scorer's, negated."""
    scored = scores[~np.isnan(scores)]
    if len(scored) < 2 or scored.max() != scored.min():
        return []
    value = 0.0 - scored.max() if flip else scored.max()
    every = f"every {what}" + (" that did not fail" if len(scored) < len(scores) else "")
    return [
        f"{name}'s search scored {every} the same by {args.scoring} ({100 * value:.2f}%): it "
        f"chose the first, {chose}, as {peer} breaks ties; another --scoring may tell them "
        "apart"
    ]


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
        cv=_search_folds(args),
        scoring=args.scoring,
        n_jobs=args.n_jobs,
        **params,
    )


def _model(probe: MR2LinearClassifier, grid: dict, args):
    """The probe behind the feature scaling, in a grid search when ``grid`` is not empty
    (of the grid's combinations that are models of it)."""
    if not grid:
        return _scaled(probe, args.feature_scaling)
    prefix = "" if args.feature_scaling == "none" else "probe__"
    searched = {prefix + key: values for key, values in grid.items()}
    combinations = list(ParameterGrid(grid))
    valid = [_without_unused(probe, c) for c in combinations if _no_model(probe, c) is None]
    valid = list({tuple(sorted(c.items())): c for c in valid}.values())  # each model once
    if len(valid) < len(combinations):
        searched = [{prefix + key: [value] for key, value in c.items()} for c in valid]
    return GridSearchCV(
        _scaled(clone(probe).set_params(verbose=0), args.feature_scaling),
        searched,
        scoring=classwise_scorers() | {"stopped_short": _stopped_short},
        refit=args.scoring,
        cv=_search_folds(args),
        n_jobs=args.n_jobs,
    )


def _without_unused(probe: MR2LinearClassifier, combination: dict) -> dict:
    """``combination`` without what its fit does not read: C where it penalises nothing (a
    cosine head has no penalty of its own, only a projection, lam > 0, has one), a logit
    scale where the head is linear, what only some models read (_READ_BY_SOME: p without
    margins, say) where this one does not, and the minibatch solvers' parameters where
    L-BFGS fits it. (Searched, such a parameter fits one model again and reports a choice
    that means nothing.)"""
    model = clone(probe).set_params(**combination)
    unused = {name for name, (reads, *_) in _READ_BY_SOME.items() if not reads(model)}
    if model.head != "cosine":
        unused.add("scale")
    if model.head == "cosine" and not model.lam:
        unused.add("C")
    if MINIBATCH_ONLY & set(combination) and _solver(probe, combination) == "lbfgs":
        unused |= MINIBATCH_ONLY
    return {key: value for key, value in combination.items() if key not in unused}


def _stopped_short(estimator, X, y) -> float:
    """A grid search's scorer: 1 for a fit that stopped short of tol. With --n-jobs its
    fits run in worker processes, whose warnings never reach this one."""
    return float(getattr(_final(estimator), "_stop_reason", None) is not None)


def _in_cli_terms(message, args, fit: bool = True) -> str:
    """An estimator's warning on one line, its advice in mr2-probe's options: --max-iter
    for max_iter (--grid max_iter where the grid sets it), --grid learning_rate for
    learning_rate and projection_rank (there is no option of them; under --Cs, which
    excludes --grid, a --grid search of C with it in place of --Cs), --feature-scaling
    standard for a scaler (no advice to scale where the features are scaled so already); a
    larger tol, which is no option, becomes the fit kept as it is; scikit-learn's
    assume_finite, SKLEARN_ASSUME_FINITE (the features that it left unchecked are the
    scaled ones: mr2-probe checks X). Not ``fit`` (a front's
    error, which may be of its predictions): NaN or infinity in scaled features is left in
    scikit-learn's words, since features far out of the range scaled on (a --test row) are
    no fault of X that dividing it cures."""
    scaled = args.feature_scaling == "standard"
    grid = any(spec.partition("=")[0].strip() == "max_iter" for spec in args.grid)
    option, sep = ("--grid max_iter", "=") if grid else ("--max-iter", " ")
    scale = "--feature-scaling standard"
    by = f"a constant (values this large overflow the arithmetic of {scale} itself)"
    learning_rate, projection_rank = r"--grid learning_rate\1", "--grid projection_rank"
    if args.Cs is not None:  # (said after its value, "than 0.003", which it is about)
        value = "scale" if args.head == "cosine" else "C"
        instead = (
            f"only --grid sets it, and --grid excludes --Cs: search {value} with --grid "
            f"{value}=V1,V2,..."
        )
        learning_rate = rf"learning_rate\1 ({instead} --grid learning_rate=V instead)"
        projection_rank = f"projection_rank ({instead} --grid projection_rank=R instead)"
    # scikit-learn's assume_finite=True, which SKLEARN_ASSUME_FINITE sets (any non-empty value, 0
    # too), skipped the estimator's check of the features: mr2-probe checked X itself, so
    # NaN or infinity can only be --feature-scaling standard's (its overflow).
    unchecked = (
        (
            f"the features scaled by {scale} hold NaN or infinity, which SKLEARN_ASSUME_FINITE "
            "left unchecked, where X held none: values this large overflow the scaling's own "
            "arithmetic. Divide X by a constant and fit again (unset SKLEARN_ASSUME_FINITE, "
            "which any value but an empty one sets, 0 too, to have them checked)."
        )
        if scaled
        else (
            "the features are too large (mr2-probe finds X finite whether SKLEARN_ASSUME_FINITE "
            f"is set or not). Scale them ({scale}, or divide X by a constant) and fit again."
        )
    )
    rules = (
        (
            r"the features hold NaN or infinity, which assume_finite=True did not check for, or "
            r"are too large\. Check X with assume_finite=False, and scale it \(e\.g\. "
            r"StandardScaler\) if it is finite\.",
            unchecked,
        ),
        # (any other words of it: the variable that sets it)
        (r"\bassume_finite=True\b", "SKLEARN_ASSUME_FINITE"),
        (r"\bassume_finite=False\b", "SKLEARN_ASSUME_FINITE unset"),
        (
            r"Increase max_iter,? or scale the features(?: \(e\.g\. StandardScaler\))?",
            f"Raise {option}" + ("" if scaled else f", or scale the features ({scale})"),
        ),
        (r"in max_iter=(\d+) (\w+)", rf"in \1 \2 ({option}{sep}\1)"),
        (r"(?<!--grid )\bmax_iter\b", option),  # not the option just written
        # No --learning-rate: the minibatch solvers' step is set by --grid alone.
        # (not learning_rate=V, its value)
        (r"\blearning_rate\b(?!=)((?: than| below) [0-9.e+-]*[0-9])?", learning_rate),
        # Nor a --projection-rank: "a projection_rank also helps" a diverged projection.
        (r"(?<!--grid )\bprojection_rank\b(?!=)", projection_rank),
        *(
            (
                # Features too large for the fit even scaled were too large for the scaler's
                # own arithmetic (its NaN): dividing X is the cure, scaling it is no more.
                (
                    r"and scale it \(e\.g\. StandardScaler\) if it is finite",
                    f"and, if it is finite, divide it by {by}",
                ),
                (
                    r"Scale them \(e\.g\. StandardScaler, or divide X by a constant\)",
                    f"Divide X by {by}",
                ),
                # (mr2-probe refused X with NaN or infinity before: the scaler made them)
                *(
                    (
                        (
                            r"\AInput X contains (NaN|infinity)\b.*",
                            rf"Cannot fit: the features scaled by {scale} hold \1, where X "
                            "held none: values this large overflow the scaling's own "
                            "arithmetic. Divide X by a constant and fit again.",
                        ),
                    )
                    if fit
                    else ()
                ),
                # "(and scale them, e.g. StandardScaler)", "(or scale the features, ...)" and
                # the like: no advice where they are.
                (
                    r" ?\((?:and,? |or )?(?:for features [^()]*, )?scale (?:them|the features), "
                    r"e\.g\. StandardScaler\)",
                    "",
                ),
            )
            if scaled
            else ((r"e\.g\. StandardScaler", scale),)
        ),
        # (mr2-probe keeps an array's dtype: a float32 .npz is no remedy, its X must be.)
        (r"(?i)float64 features", r"\g<0> (X saved as float64 in a .npy or .npz file)"),
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


def _all_fits_failed(error: ValueError, name: str, args) -> Exception:
    """GridSearchCV's "All the N fits failed" as the first failed fit's own error, in
    mr2-probe's options; its message held every failure's traceback, which one line cut
    before any error was named. Any other error is returned as it is."""
    text = str(error)
    failed = re.match(r"\s*All the (\d+) fits failed", text)
    # Each traceback ends in its error's line, the only line that starts with a name and
    # ': ' (the frames' lines are indented).
    cause = re.search(r"^(?:[\w.]+\.)?(\w+): (.+)$", text, re.MULTILINE)
    if failed is None or cause is None:
        return error
    # Out of memory in every fold: said as a main fit's (status 1, with the options that
    # take less), not as a mistake in the options (status 2).
    if cause[1].endswith("MemoryError") and not cause[1].endswith("OutOfMemoryError"):
        return MemoryError(cause[2])
    if _out_of_memory(RuntimeError(cause[2])) is not None:
        return RuntimeError(cause[2])
    return ValueError(
        f"{name}: every fit of its search failed ({failed[1]} fits), the first as: "
        f"{_in_cli_terms(cause[2], args)}"
    )


def _said_failed_fits(search: GridSearchCV, caught: list, name: str, args) -> bool:
    """Say in one line each setting of ``search`` whose fit failed in some folds (it scores
    NaN there, which leaves it out of the choice), with the error (in mr2-probe's options)
    that scikit-learn's FitFailedWarning names, held in ``caught``: that warning held every
    failure's traceback, on one line cut at 1,000 characters, before any error was named,
    and was followed by a line per scorer of the NaN scores (which :func:`_show` then
    leaves out, but under --debug). Returns whether any setting failed."""
    results = search.cv_results_
    failed = np.zeros(len(results["params"]), dtype=int)  # each setting's failed folds
    for fold in range(search.n_splits_):
        # A failed fit scores NaN in every column (error_score), its folds' count too.
        scores = [results[k] for k in results if re.fullmatch(rf"split{fold}_test_.+", k)]
        failed += np.isnan(np.asarray(scores, dtype=float)).all(axis=0)
    errors = []
    for warning in caught:
        if not issubclass(warning.category, FitFailedWarning):
            continue
        # Its failures grouped by error, each group's traceback ending in its error's line,
        # the only line that starts with a name and ': ' (the frames' lines are indented).
        groups = re.split(r"\n\d+ fits? failed with the following error:", str(warning.message))
        for group in groups[1:]:
            lines = re.findall(r"^(?:[\w.]+\.)?\w+: (.+)$", group, re.MULTILINE)
            errors += [_in_cli_terms(lines[-1], args)] if lines else []
    errors = list(dict.fromkeys(errors))
    # Which setting failed of which error, the warning does not say where errors differ:
    # the first error is the first failed setting's (the fits are listed setting by setting,
    # each error where it first failed). A later setting's line named it too, with the
    # first's numbers (its learning_rate, its C) in place of its own.
    first = int(np.argmax(failed > 0))
    for index, (params, count) in enumerate(zip(results["params"], failed, strict=True)):
        if count:
            own = bool(errors) and (len(errors) == 1 or index == first)
            why, more = (f": {errors[0]}" if own else ""), ""
            if len(errors) > 1:
                more = (
                    f"the first of the search's {len(errors)} errors; "
                    if own
                    else f"which of the search's {len(errors)} errors are its, scikit-learn "
                    "does not say; "
                )
            setting = ", ".join(f"{k.removeprefix('probe__')}={v}" for k, v in params.items())
            print(
                f"mr2-probe: warning: {name}: {setting} failed in {count} of its "
                f"{search.n_splits_} folds, left out of the choice (scored NaN there){why} "
                f"({more}--debug shows the tracebacks)",
                file=sys.stderr,
            )
    return bool(np.any(failed))


def _show(
    caught: list, hide_failed_fits: bool = False, debug: bool = False, failed: bool = False
) -> None:
    """Show the warnings ``caught`` while a search ran, as they would have been shown;
    with ``hide_failed_fits`` (said by :func:`_said_failed_fits`) without scikit-learn's
    own of its failed fits: their FitFailedWarning and the NaN test scores' UserWarning.
    ``debug`` (--debug, whose tracebacks the failed settings' lines promise) shows the
    FitFailedWarning whatever the filters say (python -W ignore hid it). ``failed`` (the
    search ended in an error): none in the place of its error (see :func:`_pass_on`)."""
    for warning in caught:
        text = str(warning.message)
        failed_fits = issubclass(warning.category, FitFailedWarning)
        if hide_failed_fits and (
            failed_fits or text.startswith("One or more of the test scores are non-finite")
        ):
            continue
        with warnings.catch_warnings():
            if debug and failed_fits:
                warnings.simplefilter("always", FitFailedWarning)
            _pass_on(warning, failed)


def _show_in_cli_terms(caught: list, args, failed: bool = False) -> bool:
    """Show the warnings ``caught`` while a model (not a grid search) was fitted, as they
    would have been shown, but for MR2LinearClassifierCV's of its failed fits (some values
    of --Cs failed on some folds) and of non-finite scores, which name the failed fits'
    first error: its advice is given in mr2-probe's options (:func:`_in_cli_terms`), where
    it named the estimator's learning_rate and StandardScaler. The one of non-finite scores,
    which follows the other, leaves the error (up to 1,000 characters) to it where it was
    shown (held: the filters passed it), so that it is said once. ``failed`` (the fit
    ended in an error): none in the place of its error (see :func:`_pass_on`). Returns
    whether the warning of failed fits was among them."""
    failed_fits = any(issubclass(w.category, FitFailedWarning) for w in caught)
    for warning in caught:
        message, text = None, str(warning.message)
        if issubclass(warning.category, FitFailedWarning):
            message = warning.category(_in_cli_terms(text, args))
        elif text.startswith("One or more of the test scores are non-finite"):
            message = warning.category(_in_cli_terms(_said_above(text, failed_fits), args))
        _pass_on(warning, failed, message)
    return failed_fits


def _said_above(text: str, failed_fits: bool) -> str:
    """MR2LinearClassifierCV's warning or error of undefined scores, ``text``, without the
    failed fits' first error that ends it where ``failed_fits`` (their warning, shown just
    before, says it)."""
    if not failed_fits:
        return text
    said = " (the first error as the warning above says)."
    return re.sub(r" \(the first error, at .*\)\.\Z", said, text, flags=re.DOTALL)


def _front_terms(message) -> str:
    """A front fit's warning with its tilt as --tilt's (the estimator names class_tilt)."""
    return re.sub(r"\bclass_tilt=", "--tilt ", str(message))


def _fit(model, X, y, name: str, args, front: bool = False):
    """``model`` fitted, its ConvergenceWarnings (a search's can be many) said in one line
    on stderr, their advice in mr2-probe's options (``front``: a point of the front's, its
    tilt --tilt's); its other warnings shown after the fit (after a search, or its error)."""
    if isinstance(model, GridSearchCV):
        # (the filter reaches the workers too; the search's own warnings are held, and
        # shown after it, but for its failed fits': see _said_failed_fits)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", ConvergenceWarning)
            # (its errors held whatever the filters say, python -W ignore too: shown after
            # it as they say, by _show)
            warnings.simplefilter("always", FitFailedWarning)
            try:
                model.fit(X, y)
                failure = None
            except BaseException as error:  # (a refit's RuntimeError, a Ctrl-C too)
                failure = error
        if failure is not None:
            # Shown out of the block: in it, each warning shown was held again, behind the
            # one shown, for ever (a search whose every fit failed, a warning held).
            _show(caught, debug=args.debug, failed=True)
            if isinstance(failure, ValueError):
                raise _all_fits_failed(failure, name, args) from failure
            raise failure
        said = _said_failed_fits(model, caught, name, args)
        _show(caught, hide_failed_fits=said and not args.debug, debug=args.debug)
        results = model.cv_results_
        folds = [results[k] for k in results if re.fullmatch(r"split\d+_test_stopped_short", k)]
        # The solver's own reason, where this process has it: the refit's.
        reason = getattr(_final(model.best_estimator_), "_stop_reason", None)
        # A failed fit scores NaN in every column (said in its own line): not counted among
        # the fits that ran ("3 of its 5" where 2 of the 5 had failed).
        n_short = int(np.nansum(folds)) + (reason is not None)
        n_fits = int(np.isfinite(np.asarray(folds, dtype=float)).sum()) + 1
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
    # (held, and shown after the fit: MR2LinearClassifierCV's of its failed fits in
    # mr2-probe's options; see _show_in_cli_terms)
    with warnings.catch_warnings(record=True) as caught:
        try:
            short = fit_collecting_short(model, X, y)
            failure = None
        except BaseException as error:  # (shown before any error, a Ctrl-C too)
            failure = error
    # Shown out of the block, as a grid search's are (each warning shown is held in it).
    failed_fits = _show_in_cli_terms(caught, args, failed=failure is not None)
    if isinstance(failure, ValueError):
        # Its advice in mr2-probe's options, as a search's failed fits say it: "Scale them
        # (e.g. StandardScaler ...)" named no option of the command. (A front's refit fails
        # the front, whose error line says it so: said so twice, "--grid --grid learning_rate".)
        # No value of --Cs with a defined score: the failed fits' error said once too.
        text = _in_cli_terms(_said_above(str(failure), failed_fits), args)
        if front or text == _one_line(failure):
            raise failure
        raise ValueError(text) from failure
    if failure is not None:
        raise failure
    if short:
        fits = f"{len(short)} of its fits" if len(short) > 1 else "its fit"
        message = _front_terms(short[0].message) if front else short[0].message
        first = _in_cli_terms(message, args)
        print(f"mr2-probe: warning: {name}: {fits} stopped short of tol ({first})", file=sys.stderr)
    return model


def _front(models: dict, base, erm, X, y, X_test, y_test, args, fitted_as: dict):
    """Fit the front of ``base`` (the MR² configuration, tuned when searched) with ``erm``
    (ERM's, tuned on its own) on a validation split, choose by the rule, refit the choice
    on all of the training data and add it to ``models``: ERM or MR², the models fitted
    there already (``fitted_as``: their names in ``models``), are not fitted again."""
    from ..front import _same_model, _with_params, accuracy_front

    # (ERM's configuration but for what it does not read, --p 3 beside c_bar=None, is ERM's
    # model: the front leaves out its MR2 point, and a front of ERM alone is refused)
    if (
        not args.offsets
        and not any(t > 0 for t in args.tilt)
        and _same_model(
            _with_params(base, class_tilt=0.0),
            _with_params(erm, c_bar=None, lam=0.0, class_tilt=0.0),
        )
    ):  # (a --grid's choice: ERM's configuration otherwise is refused before any fit)
        raise ValueError(
            f"{fitted_as['MR2']}'s search chose {_chosen(models[fitted_as['MR2']])}, ERM's "
            "configuration (no margins, no projection), so --tilt 0 is a front of ERM alone; "
            "give --tilt values above 0 or --offsets to draw a front whatever the search "
            "chooses"
        )
    fit, validation = _front_split(y, args)  # (as _check_splits checked it)
    X_fit, X_val, y_fit, y_val = X[fit], X[validation], y[fit], y[validation]
    print(f"fitting the front on {len(y_fit)} samples, choosing on {len(y_val)}", file=sys.stderr)
    with collecting_short() as short, warnings.catch_warnings():
        # The front gathers its fits' warnings into one (short). A test set without some
        # classes is this run's to report, as it does (in a note).
        warnings.filterwarnings("ignore", "y_test holds no sample", UserWarning)
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
        text = _in_cli_terms(_front_terms(warning.message), args)
        print(f"mr2-probe: warning: front: {text}", file=sys.stderr)
    chosen = front.point(front.chosen)
    name = f"chosen: {chosen.name}"
    if chosen.lever in fitted_as:
        # Fitted again, a search's refit (warm from its folds' mean) and a cold fit of
        # its choice stop at two points within tol: one configuration, two rows apart.
        print(
            f"front: the rule chose {chosen.name}, the model {fitted_as[chosen.lever]!r} "
            "fitted on all training data above",
            file=sys.stderr,
        )
        models[name] = models[fitted_as[chosen.lever]]
        return front
    print(
        f"front: the rule chose {chosen.name}; refitting it on all training data", file=sys.stderr
    )
    models[name] = _fit(clone(chosen.estimator), X, y, name, args, front=True)
    return front
