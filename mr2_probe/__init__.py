"""Class-fair linear probes on frozen features: MR² margin regularization."""

from ._classifier import MR2LinearClassifier
from ._losses import compactness_loss, margin_cross_entropy, pairwise_sq_distances
from ._module import MR2Loss
from ._offsets import TunedOffsetsClassifierCV, tune_class_offsets
from ._stats import (
    ClassStats,
    class_difficulty,
    class_margins,
    class_statistics,
    class_statistics_chunked,
    ema_update,
    margins_from_difficulty,
)

__version__ = "0.1.0"

__all__ = [
    "ClassStats",
    "MR2LinearClassifier",
    "MR2Loss",
    "TunedOffsetsClassifierCV",
    "class_difficulty",
    "class_margins",
    "class_statistics",
    "class_statistics_chunked",
    "compactness_loss",
    "ema_update",
    "margin_cross_entropy",
    "margins_from_difficulty",
    "pairwise_sq_distances",
    "tune_class_offsets",
]
