"""Class-fair linear probes on frozen features: MR² margin regularization."""

import importlib
import importlib.util

# Each name from the module that defines it, imported on first use, as extract's are: the
# command line (mr2-probe) imports NumPy, scikit-learn and torch (seconds) where a Ctrl-C
# ends it in one line, not while Python imports this package, before it runs.
_MODULES = {
    "MR2LinearClassifier": "._classifier",
    "MR2LinearClassifierCV": "._cv",
    "compactness_loss": "._losses",
    "margin_cross_entropy": "._losses",
    "pairwise_sq_distances": "._losses",
    "MR2Loss": "._module",
    "tune_class_offsets": "._offset_search",
    "TunedOffsetsClassifierCV": "._offsets",
    "ClassMoments": "._stats",
    "ClassStats": "._stats",
    "class_difficulty": "._stats",
    "class_margins": "._stats",
    "class_statistics": "._stats",
    "class_statistics_chunked": "._stats",
    "margins_from_difficulty": "._stats",
    "mean_spread": "._stats",
    "moments_difficulty": "._stats",
    "moments_statistics": "._stats",
    "update_moments": "._stats",
}


def __getattr__(name: str):
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    if (
        name.isidentifier()
        and not name.startswith("__")
        and importlib.util.find_spec(f"{__name__}.{name}")
    ):
        return importlib.import_module(f".{name}", __name__)  # a submodule, as before
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_MODULES})


__version__ = "0.1.0"

__all__ = sorted(_MODULES)
