"""Class statistics and the closed-form MR² margins, as pure functions of tensors.

Every function here is vectorised over classes (scatter-adds, no Python loop over classes
or samples) and never synchronises with the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

Chunks = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]]


class ClassStats(NamedTuple):
    """Per-class statistics of a representation φ.

    ``mean`` is μ_k (K, d); ``msd`` the mean squared L_p distance to μ_k (K,);
    ``msd_l2`` the same in L2 (K,), which gives s̄; ``count`` the (weighted) class size (K,).
    """

    mean: torch.Tensor
    msd: torch.Tensor
    msd_l2: torch.Tensor
    count: torch.Tensor


def lp_norm_sq(v: torch.Tensor, p: float) -> torch.Tensor:
    """‖v‖_p² along the last dimension."""
    if p == 2:
        return (v * v).sum(-1)
    return torch.linalg.vector_norm(v, ord=p, dim=-1).square()


def class_statistics(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    p: float = 2.0,
    sample_weight: torch.Tensor | None = None,
) -> ClassStats:
    """Exact class statistics of ``features`` (N, d) with integer ``labels`` (N,).

    Parameters
    ----------
    features : torch.Tensor of shape (n_samples, n_features)
    labels : torch.Tensor of shape (n_samples,), integers in ``[0, n_classes)``
    n_classes : int
    p : float, default=2.0
        Order of the norm in which ``msd`` is measured.
    sample_weight : torch.Tensor of shape (n_samples,), default=None

    Returns
    -------
    ClassStats
        Classes absent from ``labels`` get a zero mean, zero spread and zero count.
    """
    return class_statistics_chunked(
        lambda: [(features, labels, sample_weight)], n_classes, features.shape[1], p
    )


def class_statistics_chunked(
    chunks: Chunks,
    n_classes: int,
    n_features: int,
    p: float = 2.0,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ClassStats:
    """Exact class statistics over data given as chunks (for data larger than memory).

    ``chunks()`` must return a fresh iterable of ``(X, y, sample_weight)`` each time it is
    called: means need one pass, and spreads measured in L_p a second one (the L_p spread
    does not decompose into first and second moments unless p = 2). ``transform`` maps a
    chunk of inputs to the representation φ.
    """
    transform = transform or (lambda x: x)
    sums = counts = None
    for x, y, w in chunks():
        phi = transform(x)  # (B, d)
        w = torch.ones_like(y, dtype=phi.dtype) if w is None else w.to(phi.dtype)
        if sums is None:
            sums = phi.new_zeros(n_classes, n_features)
            counts = phi.new_zeros(n_classes)
        sums.index_add_(0, y, phi * w[:, None])
        counts.index_add_(0, y, w)
    mean = sums / counts.clamp_min(torch.finfo(sums.dtype).tiny)[:, None]  # (K, d)

    spread_p = torch.zeros_like(counts)
    spread_2 = torch.zeros_like(counts)
    for x, y, w in chunks():
        diff = transform(x) - mean[y]  # (B, d)
        w = torch.ones_like(y, dtype=diff.dtype) if w is None else w.to(diff.dtype)
        sq2 = (diff * diff).sum(-1)
        spread_2.index_add_(0, y, sq2 * w)
        spread_p.index_add_(0, y, (sq2 if p == 2 else lp_norm_sq(diff, p)) * w)
    denom = counts.clamp_min(torch.finfo(counts.dtype).tiny)
    return ClassStats(mean, spread_p / denom, spread_2 / denom, counts)


DIFFICULTIES = ("moment", "spread")


def class_difficulty(stats: ClassStats, p: float = 2.0, difficulty: str = "moment") -> torch.Tensor:
    """The quantity a_k the margins grow with (K,).

    ``"moment"`` (the paper): a_k = ‖μ_k‖_p² + msd_k, the mean of ‖φ‖_p² over class k when
    p = 2, a second moment about the origin. ``"spread"``: a_k = msd_k, the spread around the
    class mean alone, which ignores where the class sits (invariant to a common shift of
    the features).
    """
    if difficulty == "spread":
        return stats.msd
    if difficulty != "moment":
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}.")
    return lp_norm_sq(stats.mean, p) + stats.msd


def margins_from_difficulty(
    a: torch.Tensor, c_bar: float, present: torch.Tensor | None = None
) -> torch.Tensor:
    """Closed-form margins γ_k = c̄·K·a_k^{1/3} / Σ_j a_j^{1/3} (Corollary 1); mean γ = c̄.

    Classes outside ``present`` (no weight in the data) get γ = c̄ and stay out of the
    normalisation; the mean is still c̄.
    """
    present = torch.ones_like(a, dtype=torch.bool) if present is None else present
    root = a.clamp_min(0).pow(1.0 / 3.0) * present  # (K,)
    # A class with a_k = 0 (all-zero features) would get γ = 0 and divide its logits by
    # zero: a floor far below every other margin keeps the loss finite.
    root = torch.where(present, root.clamp_min(1e-6 * root.max()), root)
    n_present = present.sum()
    total = root.sum()
    scaled = c_bar * n_present * root / total.clamp_min(1e-30)
    # A degenerate representation (all a_k = 0) carries no information: uniform margins.
    return torch.where(present & (total > 0), scaled, torch.full_like(root, c_bar))


def class_margins(
    stats: ClassStats, c_bar: float | None, p: float = 2.0, difficulty: str = "moment"
) -> torch.Tensor:
    """Margins γ (K,) from class statistics; ``c_bar=None`` gives γ ≡ 1 (plain CE)."""
    if c_bar is None:
        return torch.ones_like(stats.count)
    a = class_difficulty(stats, p, difficulty)
    return margins_from_difficulty(a, c_bar, stats.count > 0)


def ema_update(
    running: ClassStats,
    batch: ClassStats,
    rho: float = 0.9,
    initialised: torch.Tensor | None = None,
) -> tuple[ClassStats, torch.Tensor]:
    """Exponential moving average of class statistics, for streaming (fine-tuning) use.

    Classes absent from the batch keep their running value; classes seen for the first
    time take the batch value. Returns the new statistics and the new ``initialised`` mask.
    """
    present = batch.count > 0  # (K,)
    if initialised is None:
        initialised = torch.zeros_like(present)
    # Weight of the old value: rho for classes already seen, 0 for new ones, 1 if absent.
    keep = torch.where(initialised, rho, 0.0).to(batch.mean.dtype)
    keep = torch.where(present, keep, torch.ones_like(keep))  # (K,)
    mean = keep[:, None] * running.mean + (1 - keep[:, None]) * batch.mean  # (K, d)
    msd = keep * running.msd + (1 - keep) * batch.msd
    msd_l2 = keep * running.msd_l2 + (1 - keep) * batch.msd_l2
    stats = ClassStats(mean, msd, msd_l2, running.count + batch.count)
    return stats, initialised | present
