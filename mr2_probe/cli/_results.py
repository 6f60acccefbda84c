"""``mr2-probe``'s results as printed: the tables on stdout, the validation curves of a
--Cs search and the notes of a search whose every value scored the same."""

from __future__ import annotations

import os
import sys

import numpy as np

from ..report import in_percent


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
