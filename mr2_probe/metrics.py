"""Class-wise scores: per-class accuracy, easy / medium / hard groups, worst class, spread."""

from __future__ import annotations

import numpy as np

GROUP_NAMES = ("easy", "medium", "hard")


def per_class_accuracy(y_true, y_pred, labels=None) -> np.ndarray:
    """Accuracy (recall) of each class, in the order of ``labels`` (default: sorted y_true).

    Works with any label type. A class absent from ``y_true`` gets NaN.
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true and y_pred must have the same shape, got {y_true.shape} and {y_pred.shape}."
        )
    labels = np.unique(y_true) if labels is None else np.asarray(labels)
    sorter = np.argsort(labels)
    position = np.searchsorted(labels, y_true, sorter=sorter)
    position = np.clip(position, 0, len(labels) - 1)
    index = sorter[position]
    known = labels[index] == y_true
    correct = np.bincount(index[known], weights=(y_true == y_pred)[known], minlength=len(labels))
    total = np.bincount(index[known], minlength=len(labels)).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, correct / total, np.nan)


def difficulty_groups(reference_accuracy, n_groups: int = 3) -> np.ndarray:
    """Group index of each class (0 = easy … n_groups-1 = hard) from a reference model.

    Classes are ranked by the reference's per-class accuracy (highest first, ties broken by
    class order) and split into ``n_groups`` near-equal parts; keep the result fixed when
    scoring other models.
    """
    acc = np.asarray(reference_accuracy, dtype=float)
    order = np.argsort(-acc, kind="stable")
    groups = np.empty(len(acc), dtype=int)
    groups[order] = np.arange(len(acc)) * n_groups // len(acc)
    return groups


def classwise_summary(y_true, y_pred, groups=None, labels=None) -> dict:
    """Overall, per-group (easy / medium / hard), worst-class and std of per-class accuracy.

    ``groups`` (from :func:`difficulty_groups`) defaults to the groups of this very model.
    """
    acc = per_class_accuracy(y_true, y_pred, labels)
    groups = difficulty_groups(acc) if groups is None else np.asarray(groups)
    summary = {"overall": float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))}
    for g, name in enumerate(GROUP_NAMES[: groups.max() + 1]):
        summary[name] = float(np.nanmean(acc[groups == g]))
    summary["worst"] = float(np.nanmin(acc))
    summary["std"] = float(np.nanstd(acc))
    return summary
