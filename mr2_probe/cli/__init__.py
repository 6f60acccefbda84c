"""``mr2-probe``: fit ERM and MR² probes on stored features and report them class by class.

The command (:func:`main`) is split by responsibility: its options (``_options``), its
feature files read (``_feature_files``), its training and test data checked to be one task
(``_inputs``), the splits it makes of them checked before any fit (``_splits``), its probes
built from the options (``_models``), their fits and the front (``_fitting``), the
estimators' warnings and errors in the command's options (``_cli_terms``), the lines of a
run out of memory (``_memory``), its results printed (``_results``), its output folder
(``_outputs``) and the run itself (``_main``).
"""

import importlib
import sys

from ._usage import _interrupts_held

_MODULES = {"UsageError": "._usage", "load_xy": "._feature_files"}

__all__ = ["UsageError", "load_xy", "main"]


def main(argv=None) -> int:
    """Run ``mr2-probe`` (``_main.main``), once NumPy, scikit-learn and torch are imported:
    a Ctrl-C in those seconds printed a traceback of the import machinery, as the
    command's modules import them. It ends the run as elsewhere, in one line and status
    130 (a Ctrl-C during the imports held until they finish, ``_interrupts_held``)."""
    try:
        with _interrupts_held():
            from ._main import main as run
    except KeyboardInterrupt:
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise
        print("mr2-probe: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    return run(argv)


def __getattr__(name: str):
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
