"""Class-fair linear probes on frozen features: MR² margin regularization."""

from ._classifier import MR2LinearClassifier
from ._cv import MR2LinearClassifierCV
from ._losses import compactness_loss, margin_cross_entropy, pairwise_sq_distances
from ._module import MR2Loss
from ._offset_search import tune_class_offsets
from ._offsets import TunedOffsetsClassifierCV
from ._stats import (
    ClassMoments,
    ClassStats,
    class_difficulty,
    class_margins,
    class_statistics,
    class_statistics_chunked,
    margins_from_difficulty,
    mean_spread,
    moments_difficulty,
    moments_statistics,
    update_moments,
)

__version__ = "0.1.0"

__all__ = [
    "ClassMoments",
    "ClassStats",
    "MR2LinearClassifier",
    "MR2LinearClassifierCV",
    "MR2Loss",
    "TunedOffsetsClassifierCV",
    "class_difficulty",
    "class_margins",
    "class_statistics",
    "class_statistics_chunked",
    "compactness_loss",
    "margin_cross_entropy",
    "margins_from_difficulty",
    "mean_spread",
    "moments_difficulty",
    "moments_statistics",
    "pairwise_sq_distances",
    "tune_class_offsets",
    "update_moments",
]
