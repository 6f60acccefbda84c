"""The ``stacklevel`` of a fit's warnings: that of the first caller outside this package,
scikit-learn, joblib and the standard library."""

from __future__ import annotations

import os
import sys
import sysconfig

import joblib
import sklearn

# Warnings point at the first caller outside this package, scikit-learn and joblib (which
# runs a search's folds): the user's fit, however deep the solver that warns.
_INSIDE = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, sklearn.__file__, joblib.__file__)
)


# The standard library's own modules, not the packages installed in it: a worker thread's
# frames start in them (threading, multiprocessing.pool, concurrent.futures).
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _passed_through(filename: str) -> bool:
    """Whether a frame of ``filename`` is skipped on the way to the caller's: this package,
    scikit-learn and joblib, and the standard library's modules between them (frozen ones
    too)."""
    if filename.startswith(_INSIDE + ("<frozen ",)):  # frozen: runpy in a loky worker
        return True
    return filename.startswith(_STDLIB) and not any(part in filename for part in _INSTALLED)


def _outside_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` in this function's caller: that of the first
    frame outside this package, scikit-learn, joblib and the standard library; in a worker
    thread (joblib's threading backend), whose stack holds no caller's frame, the
    ``warnings.warn`` call's own, not the thread pool's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _passed_through(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return 1 if frame is None else level
