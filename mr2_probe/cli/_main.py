"""``mr2-probe``'s run: its options and inputs checked, the probes fitted, compared class
by class, printed and written; the exit status."""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
from sklearn.model_selection import ParameterGrid

from ..front import _final
from ..report import classwise_report, flat_text
from ._cli_terms import _front_terms, _in_cli_terms
from ._feature_files import _streams_stores
from ._fitting import _fit, _front
from ._inputs import _inputs, _inputs_record
from ._memory import (
    _front_out_of_memory_words,
    _inputs_out_of_memory_line,
    _out_of_memory_line,
    _predict_out_of_memory_line,
)
from ._models import _chosen_configuration, _cv_probe, _estimators, _model, _without_unused
from ._options import (
    _MR2_ONLY,
    _check_grid,
    _check_on_data,
    _check_options,
    _given,
    _grid,
    _parser,
)
from ._outputs import _OUTPUTS, _claim_out, _once, _prepare_out, _write_models, _write_outputs
from ._results import _cv_lines, _grid_tie_note, _percent, _print_results, _tie_note
from ._splits import _check_scaled_test, _check_splits
from ._usage import (
    RunError,
    Terminated,
    _one_line,
    _out_of_memory,
    _terminated_as_interrupted,
    warnings_in_one_line,
)


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
        try:
            inputs = _inputs(args, stack if _streams_stores(args) else None)
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
            line = _out_of_memory_line(name, what, error, list(models), args, X, X_test)
            raise RunError(line) from error
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
                if _out_of_memory(error) is not None:  # (integers: their float64 copy)
                    if words := _front_out_of_memory_words(error, args, X, X_test):
                        why = f"{why.rstrip('.')}.{words}"
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
            line = _predict_out_of_memory_line(name, what, error, out, args, X_test, X)
            raise RunError(line) from error
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
