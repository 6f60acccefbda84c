"""The fits of a ``mr2-probe`` run: a model fitted with its warnings said in one line each,
and the front (--tilt, --offsets) drawn on a validation split and its choice refitted."""

from __future__ import annotations

import re
import sys
import warnings

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, FitFailedWarning
from sklearn.model_selection import GridSearchCV

from ..front import _final, collecting_short, fit_collecting_short
from ._cli_terms import (
    _all_fits_failed,
    _front_terms,
    _in_cli_terms,
    _said_above,
    _said_failed_fits,
    _show,
    _show_in_cli_terms,
)
from ._results import _chosen
from ._splits import _front_split
from ._usage import _one_line


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
