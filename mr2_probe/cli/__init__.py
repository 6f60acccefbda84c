"""``mr2-probe``: fit ERM and MR² probes on stored features and report them class by class.

The command (:func:`main`) is split by responsibility: its options (``_options``), its
input files (``_inputs``), its output folder (``_outputs``) and the run itself
(``_main``).
"""

from ._inputs import load_xy
from ._main import main
from ._usage import UsageError

__all__ = ["UsageError", "load_xy", "main"]
