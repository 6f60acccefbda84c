"""The estimators' warnings and errors in ``mr2-probe``'s options: their advice (max_iter,
learning_rate, StandardScaler, a larger tol) said as the command's, and the failed fits
of a search said once, in one line each."""

from __future__ import annotations

import re
import sys
import warnings

import numpy as np
from sklearn.exceptions import FitFailedWarning
from sklearn.model_selection import GridSearchCV

from ..front import _pass_on
from ._usage import _one_line, _out_of_memory


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
