"""Class statistics and the closed-form MR² margins, as pure functions of tensors.

Every function here is vectorised over classes (scatter-adds, no Python loop over classes
or samples) and never synchronises with the host.
"""

from __future__ import annotations

import math
import numbers
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


def overall_mean(stats: ClassStats) -> torch.Tensor:
    """The weighted mean of φ over all classes, Σ_k n_k μ_k / Σ_k n_k (d,)."""
    return (stats.count[:, None] * stats.mean).sum(0) / stats.count.sum()


# Below it, the intercept is taken as it is (see intercept_scale).
_INTERCEPT_SCALE_FROM = 16.0


def entry_variance(stats: ClassStats) -> torch.Tensor:
    """σ², the mean variance of the features' entries (a scalar tensor)."""
    count = stats.count
    total = weight_divisor(count.sum())  # (a subnormal sum as it is: see weight_divisor)
    between = (stats.mean - overall_mean(stats)).square().sum(1)  # (K,)
    second = (count * (stats.msd_l2 + between)).sum() / total  # Σ_j of the entries' variance
    return second / stats.mean.shape[1]


def intercept_scale(stats: ClassStats) -> torch.Tensor:
    """σ_b, the scale in which the L-BFGS solvers take a linear head's intercept (a
    scalar tensor): the power of two nearest the RMS entry σ of the centred features,
    where that power is 16 or more (σ above about 11.3), else 1.

    The intercept's curvature is about 1, the weights' about σ²: with features of a
    large scale one scalar step size fits only the weights, and the intercept crept
    (features of scale 10⁶ stalled far from the optimum). Taken as β = b / σ_b, its
    curvature is about σ² too. A power of two keeps the change exact.
    """
    exponent = torch.log2(entry_variance(stats)).mul(0.5).round()
    exponent = exponent.nan_to_num(0.0, 0.0, 0.0).clamp(0, 126)  # NaN, no spread, overflow
    one = torch.ones_like(exponent)
    return torch.where(exponent.exp2() >= _INTERCEPT_SCALE_FROM, exponent.exp2(), one)


# The largest power of two that penalised_intercept_scale takes: an intercept of 10⁻³ as
# β = b / 2⁶³ is still a normal float32 number.
_PENALISED_SCALE_MAX = 63


def penalty_stiffness(n_classes: int, c_bar: float | None, reg: float) -> float:
    """K·c̄²·reg, the stiffness that :func:`penalised_intercept_scale` takes for a linear
    head of ``n_classes`` at the penalty factor ``reg`` = 1/(C·Σw) (c̄ = None counts as
    1); 0 without a penalty (C = inf)."""
    c_bar = 1.0 if c_bar is None else float(c_bar)
    return n_classes * c_bar * c_bar * reg if reg > 0 else 0.0


def penalised_intercept_scale(stats: ClassStats, stiffness: float) -> tuple[float, float]:
    """(σ_b, σ_b / :func:`intercept_scale`): σ_b the power of two nearest √(σ² + stiffness)
    where that is larger than :func:`intercept_scale`'s σ_b (and 16 or more), at most 2⁶³.

    ``stiffness`` is the penalty's curvature in units of the intercept's, K·c̄²/(C·Σw) for
    a linear head (the softmax's curvature in a logit is about 1/K at the start, over
    c̄² with margins; the weights' is that times σ², plus the penalty's 1/(C·Σw)). With a
    small C·Σw the penalty dwarfs the rest: one scalar step size fits only the weights,
    and the unpenalised intercept crept (digits / 16 at C = 10⁻⁶ in float32 stalled after
    2 iterations, iris at c̄ = 1 and C = 10⁻¹⁴ in float64 with an intercept near 0).
    """
    return penalised_scale(float(entry_variance(stats)), float(intercept_scale(stats)), stiffness)


def penalised_scale(variance: float, data: float, stiffness: float) -> tuple[float, float]:
    """:func:`penalised_intercept_scale` of features whose entries' variance is
    ``variance`` (:func:`entry_variance`) and whose :func:`intercept_scale` is ``data``:
    for solvers that take the statistics once and the penalty at each C (the path's)."""
    variance = variance + stiffness
    if not variance >= _INTERCEPT_SCALE_FROM**2 / 2:  # (NaN too)
        return data, 1.0
    exponent = _PENALISED_SCALE_MAX  # (an infinite variance, or penalty, too)
    if variance < math.inf:
        exponent = min(round(0.5 * math.log2(variance)), exponent)
    scale = max(2.0**exponent, data)
    return scale, scale / data


def lp_norm_sq(v: torch.Tensor, p: float, *, overwrite: bool = False) -> torch.Tensor:
    """‖v‖_p² along the last dimension, for p ≥ 1 (p = inf: the largest |v_j|²).

    For p ≠ 2 each row is divided by its largest entry before the p-th powers are summed,
    and multiplied back after: unscaled, |v_j|^p leaves the dtype's range when the largest
    entry's p-th power nears its limits (float32 features of 10⁻³ at p = 20 gave spreads of
    0). One pass of elementwise powers, in place unless autograd tracks ``v``: on a copy
    of ``v``, or on ``v`` itself with ``overwrite=True`` (a temporary of the caller's).
    """
    if p == 2:
        return (v * v).sum(-1)
    if not p >= 1:  # (NaN too) p = 0.5 gave spreads of no norm, NaN spreads of NaN
        raise ValueError(f"p must be a number >= 1 (inf included), got {p!r}.")
    if p == math.inf:  # (the powers below: inf · 0 = NaN in the gradient of x^inf)
        return v.abs().amax(-1).square()
    if v.dtype in (torch.float16, torch.bfloat16):  # sums of powers leave float16's range
        return lp_norm_sq(v.float(), p, overwrite=True).to(v.dtype)
    a = v.abs_() if overwrite and not v.requires_grad else v.abs()
    peak = a.amax(-1, keepdim=True)
    # an infinite entry: the norm is inf, not inf / inf = NaN
    unit = torch.where(peak.isfinite(), peak.clamp_min(torch.finfo(v.dtype).tiny), 1.0)
    powers = (a / unit).pow(p) if a.requires_grad else a.div_(unit).pow_(p)
    # a row's sum is at least 1 (its largest entry), or 0: kept off 0 for a finite gradient
    norm_sq = powers.sum(-1).clamp_min(1).pow(2 / p) * unit.squeeze(-1).square()
    return torch.where(peak.squeeze(-1) == 0, 0.0, norm_sq)


def float32_at_least(features: torch.Tensor) -> torch.Tensor:
    """``features`` in float32 where they are in half precision (or not floating point)."""
    if not features.is_floating_point() or features.dtype in (torch.float16, torch.bfloat16):
        return features.float()
    return features


def weight_divisor(weight: torch.Tensor) -> torch.Tensor:
    """Weight sums to divide by: themselves where positive, subnormal ones included, and 1
    where 0 (whatever is divided is 0 there). Clamped up to the dtype's smallest normal
    number instead, float32's weights of 1e-40 gave quotients 0.4 times their value."""
    return torch.where(weight > 0, weight, torch.ones_like(weight))


def class_indices(labels: torch.Tensor) -> torch.Tensor:
    """Integer class indices as int64, which torch's indexing reads as indices: a uint8
    tensor would index as a boolean mask (torch.from_numpy of uint8 labels), and index_add_
    refuses the narrow types. Other dtypes are returned as they are, for torch to refuse."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        return labels
    return labels.long()


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
        Classes absent from ``labels`` get a zero mean, zero spread and zero count. In
        float32 at least: half-precision features are summed, and their statistics kept,
        in float32 (a float16 count stops at 2048, a bfloat16 one at 256).

    Examples
    --------
    >>> import torch
    >>> from mr2_probe import class_statistics
    >>> X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 9.0]])
    >>> stats = class_statistics(X, torch.tensor([0, 0, 1, 1]), n_classes=2)
    >>> stats.mean
    tensor([[2., 0.],
            [0., 5.]])
    >>> stats.msd, stats.count
    (tensor([ 1., 16.]), tensor([2., 2.]))
    """
    check_tensors("class_statistics", features=features, labels=labels, sample_weight=sample_weight)
    return class_statistics_chunked(
        lambda: [(features, labels, sample_weight)], n_classes, features.shape[-1], p
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
    called, for two passes: the means, then the spreads around them (measured about the
    mean, with no cancellation of first and second moments; an L_p spread with p ≠ 2 does
    not decompose into them at all). ``transform`` maps a chunk of inputs to the
    representation φ. Sums are taken in float32 at least (:func:`class_statistics`).

    Parameters
    ----------
    chunks : callable
        Returns a fresh iterable of ``(X, y, sample_weight)`` tensors, ``y`` integers in
        ``[0, n_classes)``, ``sample_weight`` None or of shape (len(y),).
    n_classes : int
    n_features : int
        The width of φ (of ``transform``'s output where one is given).
    p : float, default=2.0
        Order p >= 1 of the norm in which the spreads msd_k are measured (``inf``: the
        largest absolute entry).
    transform : callable, default=None
        Maps a chunk's X to φ; None: φ = X.

    Returns
    -------
    ClassStats
        As :func:`class_statistics` gives it; zero statistics where no chunk holds a row.
    """
    transform = transform or (lambda x: x)
    sums = counts = None
    for x, y, w in chunks():
        _check_class_indices(y, n_classes)  # (index_add_'s errors named no labels)
        y = class_indices(y)
        phi = float32_at_least(transform(x))  # (B, d)
        _check_chunk(phi, y, w, n_features)
        if sums is None:
            sums = phi.new_zeros(n_classes, n_features)
            counts = phi.new_zeros(n_classes)
        if w is None:
            sums.index_add_(0, y, phi)
            counts.index_add_(0, y, torch.ones_like(y, dtype=phi.dtype))
        else:
            w = w.to(phi.dtype)
            sums.index_add_(0, y, phi * w[:, None])
            counts.index_add_(0, y, w)
    if sums is None:  # no chunk at all: no class present, as for a chunk of no rows
        sums, counts = torch.zeros(n_classes, n_features), torch.zeros(n_classes)
    # (float32's weights of 1e-40, at C = 1e40 an ordinary problem, made the class means
    # 0.43 times their value)
    denom = weight_divisor(counts)
    mean = sums / denom[:, None]  # (K, d)

    spread_p = torch.zeros_like(counts)
    spread_2 = torch.zeros_like(counts)
    for x, y, w in chunks():
        y = class_indices(y)
        phi = transform(x)
        phi = phi.float() if phi.dtype == torch.bool else phi  # (sub_ refuses a bool one)
        diff = mean[y].sub_(phi)  # (B, d), μ − φ: the spreads are even in it
        # (sub_ into mean's float32 rows: half-precision φ is promoted, not rounded to)
        w = torch.ones_like(y, dtype=diff.dtype) if w is None else w.to(diff.dtype)
        sq2 = torch.linalg.vector_norm(diff, dim=-1).square()
        spread_2.index_add_(0, y, sq2 * w)
        spread_p.index_add_(0, y, (sq2 if p == 2 else lp_norm_sq(diff, p, overwrite=True)) * w)
    return ClassStats(mean, spread_p / denom, spread_2 / denom, counts)


def _check_chunk(phi, y, w, n_features: int) -> None:
    """Refuse a chunk whose shapes do not match, before torch's index_add_ (weights of
    shape (B, 1) failed there as "source tensor shape must match self tensor shape")."""
    if phi.ndim != 2 or phi.shape[1] != n_features or y.shape != phi.shape[:1]:
        raise ValueError(
            f"class statistics take features (n_samples, {n_features}) and labels "
            f"(n_samples,); got shapes {tuple(phi.shape)} and {tuple(y.shape)}."
        )
    check_weight_shape(w, y.shape)


def check_tensors(caller: str, **values) -> None:
    """Refuse arguments that are no torch tensors (None is left to the caller), as torch's
    functions refuse them, naming the argument: NumPy labels failed with "'numpy.ndarray'
    object has no attribute 'is_floating_point'", a list with "... has no attribute
    'ndim'"."""
    for name, value in values.items():
        if value is not None and not isinstance(value, torch.Tensor):
            module, kind = type(value).__module__.partition(".")[0], type(value).__qualname__
            kind = kind if module == "builtins" else f"{module}.{kind}"  # numpy.ndarray
            # One number is no weight per sample (scikit-learn's estimators broadcast it;
            # torch.as_tensor made a 0-d tensor, refused next for its shape), nor is a 0-d
            # array of one (np.array(2.0), which got that remedy).
            number = isinstance(value, numbers.Real) or (
                getattr(value, "ndim", None) == 0
                and getattr(getattr(value, "dtype", None), "kind", "") in "biuf"
            )
            array = number and not isinstance(value, numbers.Real)
            kind = f"0-d {kind}" if array else kind
            article = "an" if kind[0] in "aeiou" else "a"
            # (torch.full refuses a 0-d array: "must be Number, not numpy.ndarray")
            fill = f"float({name})" if array else name
            remedy = (
                f"it holds one weight per sample: torch.full((n_samples,), {fill}) makes them"
                if number and name == "sample_weight"
                else f"torch.as_tensor({name}) makes one"
            )
            raise TypeError(f"{caller} takes torch tensors: {name} is {article} {kind}; {remedy}.")


def check_weight_shape(sample_weight, shape) -> None:
    """Refuse sample weights (or None) of another shape than ``shape``, the samples', in
    scikit-learn's words (weights of shape (B, 1) broadcast, or failed inside torch); and
    complex ones (a loss of them was complex, the imaginary part of the weights cast away
    with torch's warning once per process, or "gt_cpu" not implemented for 'ComplexFloat')."""
    if sample_weight is not None and sample_weight.is_complex():
        raise TypeError(
            f"sample_weight must be real numbers, got a tensor of dtype {sample_weight.dtype}: "
            "pass its real part (sample_weight.real) or its magnitude (sample_weight.abs())."
        )
    if sample_weight is not None and sample_weight.shape != shape:
        # (a 0-d tensor, one number, was told its shape alone, where a float is told more)
        cure = (
            f" It holds one weight per sample: sample_weight.expand({tuple(shape)}) makes them."
            if sample_weight.ndim == 0
            else ""
        )
        raise ValueError(
            f"sample_weight.shape == {tuple(sample_weight.shape)}, expected {tuple(shape)}!{cure}"
        )


def mean_spread(stats: ClassStats) -> torch.Tensor:
    """s̄: the mean L2 spread msd_l2 over the classes present (count > 0), a scalar.

    Classes with no weight have no spread to average; 0 when no class is present.
    """
    present = (stats.count > 0).to(stats.msd_l2.dtype)  # (K,)
    return (stats.msd_l2 * present).sum() / present.sum().clamp_min(1)


def compactness_tau(stats: ClassStats) -> torch.Tensor:
    """τ = 2 s̄, the compactness loss's temperature by default, a scalar.

    s̄ is floored at the rounding of the squared distances that the loss compares with 2 s̄:
    when every class is copies of one row, s̄ is rounding too (1e-33), and a τ of that size
    turned a distance's rounding error into an exponent of 10¹⁶. The loss takes each row
    relative to a row of its class before its Gram product, which leaves rows of a class
    exact to ε·‖μ_k‖ (ε the dtype's epsilon): the floor is ε·mean_k (msd_k + ε·‖μ_k‖²)
    over the classes present. (It was ε·mean_k ‖φ‖², the rounding of uncentred rows: under a large
    common mean, 12 times 2 s̄ in float32.)
    """
    present = (stats.count > 0).to(stats.msd_l2.dtype)  # (K,)
    eps = torch.finfo(stats.msd_l2.dtype).eps
    moment = (stats.msd_l2 + eps * (stats.mean * stats.mean).sum(-1)).nan_to_num() * present
    floor = eps * moment.sum() / present.sum().clamp_min(1)
    return 2 * torch.maximum(mean_spread(stats), floor).clamp_min(torch.finfo(floor.dtype).tiny)


DIFFICULTIES = ("moment", "spread")


def class_difficulty(stats: ClassStats, p: float = 2.0, difficulty: str = "moment") -> torch.Tensor:
    """The quantity a_k the margins grow with (K,).

    ``"moment"`` (the paper): a_k = ‖μ_k‖_p² + msd_k, the mean of ‖φ‖_p² over class k when
    p = 2, a second moment about the origin. ``"spread"``: a_k = msd_k, the spread around the
    class mean alone, which ignores where the class sits (invariant to a common shift of
    the features).

    Parameters
    ----------
    stats : ClassStats
    p : float, default=2.0
        Order p >= 1 of the norm in which the spreads msd_k are measured (``inf``: the
        largest absolute entry).
    difficulty : {"moment", "spread"}, default="moment"
    """
    if difficulty == "spread":
        return stats.msd
    if difficulty != "moment":
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}.")
    return lp_norm_sq(stats.mean, p) + stats.msd


# A class whose a_k^{1/3} is at most this fraction of the largest class's has no measured
# difficulty (see margins_from_difficulty).
_UNMEASURED = 1e-6


def margins_from_difficulty(
    a: torch.Tensor,
    c_bar: float,
    present: torch.Tensor | None = None,
    moment: torch.Tensor | None = None,
) -> torch.Tensor:
    """Closed-form margins γ_k = c̄·K·a_k^{1/3} / Σ_j a_j^{1/3} (Corollary 1); mean γ = c̄.

    Classes outside ``present`` (no weight in the data) get γ = c̄ and stay out of the
    normalisation; the mean is still c̄. So does a class with a_k = 0 to rounding, whose
    difficulty cannot be measured: with ``"spread"``, a class of one sample or of copies of
    one embedding; with ``"moment"``, all-zero features. The formula would give it γ ≈ 0
    and divide its logits by about zero; a floor far below the other margins, as before,
    multiplied them by about 10⁶ and let one sample dominate the fit. a_k is rounding when
    a_k^{1/3} is at most 10⁻⁶ of the largest class's, or, given each class's second moment
    ``moment`` (K,) (a spread's scale: ‖μ_k‖_p² + msd_k), when a_k is at most the dtype's
    epsilon times it, which holds for every class when each is copies of one row.
    """
    # c̄ = 0 (read as "no margins", which is None) gave margins of 0, and a loss of NaN;
    # a negative c̄ negative margins. (A tensor is not compared: that would synchronise.)
    if isinstance(c_bar, numbers.Real) and not c_bar > 0:
        raise ValueError(
            f"c_bar must be a number > 0, got {c_bar}; None (in class_margins) means no margins."
        )
    a = a if a.is_floating_point() else a.float()  # integers: float32 margins, not rounded
    dtype, eps = a.dtype, torch.finfo(a.dtype).eps  # rounding is the given dtype's
    a = float32_at_least(a)  # c̄·K·a^{1/3} and Σ_j a_j^{1/3} leave float16's range
    present = torch.ones_like(a, dtype=torch.bool) if present is None else present
    root = a.clamp_min(0).pow(1.0 / 3.0)  # (K,)
    # Copies of one row leave a spread of rounding error (a_k ~ 1e-32, not 0): a margin
    # below 1e-6 of the largest is taken as unmeasured, as an exact 0 is.
    largest = torch.where(present, root, torch.zeros_like(root)).nan_to_num().amax()
    measured = present & (root > _UNMEASURED * largest)
    if moment is not None:  # all of them rounding: the largest is no yardstick
        measured &= a > eps * moment
    root = torch.where(measured, root, torch.zeros_like(root))  # NaN a_k of unseen classes too
    # c̄·K in the margins' dtype: a Python float times an integer tensor is float32.
    # (The floor only keeps 0/0 away when no class is measured: the dtype's smallest
    # normal number, not a fixed 1e-30, which float64 features of norm 1e-50 fell under.)
    total = root.sum().clamp_min(torch.finfo(root.dtype).tiny)
    # c̄ last: K·a_k^{1/3} / Σ_j a_j^{1/3} is at most K, and a margin at most c̄·K (c̄·K·a_k^{1/3}
    # overflowed first: float32's c̄ = 1e38 gave inf margins).
    scaled = c_bar * (measured.sum().to(root.dtype) * root / total)
    # Without a measured class (all a_k = 0) there is no information: uniform margins.
    # (c̄ beyond the dtype's range is inf, which the estimator names: torch refuses to fill
    # with it. Filled, not copied from the host: no synchronisation, no float64 on MPS.)
    fill = c_bar if abs(c_bar) <= torch.finfo(root.dtype).max else math.copysign(math.inf, c_bar)
    return torch.where(measured, scaled, torch.full_like(root, fill)).to(dtype)


def class_margins(
    stats: ClassStats, c_bar: float | None, p: float = 2.0, difficulty: str = "moment"
) -> torch.Tensor:
    """Margins γ (K,) from class statistics; ``c_bar=None`` gives γ ≡ 1 (plain CE).

    Parameters
    ----------
    stats : ClassStats
    c_bar : float or None
        The mean margin c̄ > 0 (over the classes present); None: no margins.
    p : float, default=2.0
        Order p >= 1 of the norm in which the spreads msd_k are measured (``inf``: the
        largest absolute entry).
    difficulty : {"moment", "spread"}, default="moment"
        The a_k the margins grow with (:func:`class_difficulty`), as
        :func:`margins_from_difficulty` turns it into margins.

    Examples
    --------
    >>> import torch
    >>> from mr2_probe import class_margins, class_statistics
    >>> X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 9.0]])
    >>> stats = class_statistics(X, torch.tensor([0, 0, 1, 1]), n_classes=2)
    >>> margins = class_margins(stats, c_bar=2.0)  # the wider class gets the larger margin
    >>> margins
    tensor([1.3260, 2.6740])
    >>> margins.mean()
    tensor(2.)
    """
    if c_bar is None:
        return torch.ones_like(stats.count)
    a = class_difficulty(stats, p, difficulty)
    moment = class_difficulty(stats, p) if difficulty == "spread" else None
    return margins_from_difficulty(a, c_bar, stats.count > 0, moment)


class ClassMoments(NamedTuple):
    """Running, count-weighted sums per class, for statistics of a stream of batches.

    When a class appears in a batch its sums decay by ρ and take in the batch's; a class
    absent from the batch keeps them. A sample's weight is thus ρ^j, j the number of later
    batches that held its class, and the statistics are weighted averages over samples,
    not averages of per-batch statistics: a batch that holds one sample of a class
    contributes that sample, at its weight, to the class's mean and second moment.

    ``count`` Σw (K,); ``count_sq`` Σw² (K,), which gives the effective count
    count²/count_sq; ``sum`` Σw·φ (K, d); ``sum_sq`` Σw·‖φ‖₂² (K,); ``dev_p`` and
    ``dev_2`` Σw·‖φ − c‖² in L_p and L2 (K,), c the class's running mean before the batch
    (the batch's own mean when the class is new), used only for p ≠ 2; ``m2``
    Σw·‖φ − μ̂‖₂² (K,), about the current weighted mean μ̂, merged batch by batch (Chan's
    rule) so that the spread keeps its own precision: as Σw·‖φ‖² / Σw − ‖μ̂‖² it lost
    it to cancellation (float32, features of norm 4000 with a spread of 0.16: 1.5).
    ``m2`` may be None (sums made before it was kept): it is then derived from the sums.
    """

    count: torch.Tensor
    count_sq: torch.Tensor
    sum: torch.Tensor
    sum_sq: torch.Tensor
    dev_p: torch.Tensor
    dev_2: torch.Tensor
    m2: torch.Tensor | None = None

    @classmethod
    def zeros(cls, n_classes: int, n_features: int, **kwargs) -> ClassMoments:
        """Empty sums (no class seen); ``kwargs`` are ``dtype`` and ``device``."""
        count, count_sq, sum_sq, dev_p, dev_2, m2 = (
            torch.zeros(n_classes, **kwargs) for _ in range(6)
        )
        sums = torch.zeros(n_classes, n_features, **kwargs)
        return cls(count, count_sq, sums, sum_sq, dev_p, dev_2, m2)


@torch.no_grad()
def update_moments(
    moments: ClassMoments,
    features: torch.Tensor,
    labels: torch.Tensor,
    rho: float = 0.9,
    p: float = 2.0,
    all_reduce: Callable[[torch.Tensor], None] | None = None,
) -> ClassMoments:
    """Fold one batch (features (B, d), labels (B,)) into the running sums (no host sync).

    ``all_reduce`` sums a tensor in place across processes (for example
    ``torch.distributed.all_reduce``): the batch is then the union of every process's
    batch, and every process folds in the same sums. It is called twice, on the batch's
    counts and sums and then on its deviations, which need the union's class means.
    The features are taken in the running sums' dtype (half-precision activations into
    float32 sums, say), and the sums keep it. The sums carry no gradient, as BatchNorm's
    running statistics do not: a backbone's features may be passed as they are.

    Parameters
    ----------
    moments : ClassMoments
        The sums so far (``ClassMoments.zeros(n_classes, n_features)`` at the start).
    features : torch.Tensor of shape (batch_size, n_features)
    labels : torch.Tensor of shape (batch_size,), integers in ``[0, n_classes)``
    rho : float, default=0.9
        The decay ρ of a class's sums each time a batch holds the class.
    p : float, default=2.0
        Order p >= 1 of the norm of ``dev_p`` (its deviations are kept only for p != 2).
    all_reduce : callable, default=None
        Sums a tensor in place across processes (see above); None: this process alone.

    Returns
    -------
    ClassMoments
        The new sums; ``moments`` is left as it was.
    """
    check_tensors("update_moments", features=features, labels=labels)
    if not 0 <= rho <= 1:  # (NaN too) ρ = 2 let the sums grow, ρ < 0 made them negative
        raise ValueError(f"rho must be in [0, 1], got {rho!r}: it is the decay of the sums.")
    n_classes, n_features = moments.sum.shape
    _check_chunk(features, labels, None, n_features)  # (index_add_'s errors said little)
    _check_class_indices(labels, n_classes)
    return _update_moments(moments, features, class_indices(labels), rho, p, all_reduce)


def _update_moments(moments, features, labels, rho, p, all_reduce) -> ClassMoments:
    """:func:`update_moments` of a batch already checked (int64 labels in range): MR2Loss
    checks its batches once, its targets' range read once."""
    n_classes, n_features = moments.sum.shape
    features = features.to(moments.sum.dtype)
    new = features.new_zeros
    batch = new(n_classes, n_features + 2)  # counts, Σ‖φ‖², Σφ: one tensor to reduce
    batch[:, 0].index_add_(0, labels, features.new_ones(len(labels)))
    batch[:, 1].index_add_(0, labels, (features * features).sum(1))
    batch[:, 2:].index_add_(0, labels, features)
    if all_reduce is not None:
        all_reduce(batch)
    count, sum_sq, sums = batch[:, 0], batch[:, 1], batch[:, 2:]
    # Deviations from the running mean before this batch (independent of the batch's
    # samples), or from the batch's own mean for a class seen for the first time.
    seen = (moments.count > 0)[:, None]  # (K, 1)
    prior = moments.sum / moments.count.clamp_min(torch.finfo(features.dtype).tiny)[:, None]
    batch_mean = sums / count.clamp_min(1)[:, None]  # (K, d)
    center = torch.where(seen, prior, batch_mean)  # (K, d)
    diff = features - center[labels]  # (B, d)
    within = features - batch_mean[labels]  # (B, d)
    dev = new(n_classes, 3)  # about the centre (L2, L_p), and about the batch's mean
    dev[:, 0].index_add_(0, labels, (diff * diff).sum(1))
    if p != 2:
        dev[:, 1].index_add_(0, labels, lp_norm_sq(diff, p, overwrite=True))
    dev[:, 2].index_add_(0, labels, (within * within).sum(1))
    if all_reduce is not None:
        all_reduce(dev)
    dev_2, dev_p = dev[:, 0], (dev[:, 0] if p == 2 else dev[:, 1])
    decay = torch.where(count > 0, count.new_tensor(rho), 1.0)  # (K,), rho in the dtype
    kept = decay * moments.count  # the earlier samples' weight after the decay
    # Chan's merge, every term non-negative: the kept sum, the batch's own, and the
    # distance between the two means weighted n_kept·n_b / (n_kept + n_b).
    shift = batch_mean - center  # (K, d); 0 for a class seen for the first time
    between = kept * count * (shift * shift).sum(1) / (kept + count).clamp_min(1)
    return ClassMoments(
        kept + count,
        decay * decay * moments.count_sq + count,  # unit sample weights: Σw² gains count
        decay[:, None] * moments.sum + sums,
        decay * moments.sum_sq + sum_sq,
        decay * moments.dev_p + dev_p,
        decay * moments.dev_2 + dev_2,
        decay * centred_sum(moments) + dev[:, 2] + between,
    )


def _check_class_indices(labels: torch.Tensor, n_classes: int, name: str = "label") -> None:
    """Refuse labels that are no class indices in ``[0, n_classes)`` before index_add_ takes
    them (its "index out of range in self" and "Expected dtype int32/int64 for index" named
    neither the labels nor the classes); their range on the CPU alone, where reading it
    costs no synchronisation. ``name``: what the errors call a label (MR2Loss's
    "target")."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name}s must be class indices (integers), got {labels.dtype}.")
    if labels.device.type == "cpu" and labels.numel():  # (any shape: checked after)
        # torch has no min or max of uint16, uint32 or uint64: NumPy's, on the values as
        # given (as int64, the largest uint64 wrap to negative numbers).
        wide = labels.dtype in (torch.uint16, torch.uint32, torch.uint64)
        values = labels.numpy() if wide else labels
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= n_classes:
            raise ValueError(
                f"{name.capitalize()} {low if low < 0 else high} is out of bounds: the classes "
                f"are 0..{n_classes - 1} ({name}s to ignore are not supported)."
            )


def centred_sum(moments: ClassMoments) -> torch.Tensor:
    """Σw·‖φ − μ̂‖₂² of each class (K,): ``m2``, or for sums made before it was kept, as
    they gave it (Σw·‖φ‖² − ‖Σw·φ‖² / Σw)."""
    if moments.m2 is not None:
        return moments.m2
    count = moments.count.clamp_min(torch.finfo(moments.count.dtype).tiny)
    squares = (moments.sum * moments.sum).sum(1) / count
    return (moments.sum_sq - squares).clamp_min(0)


def _mean_noise(moments: ClassMoments) -> torch.Tensor:
    """Σŵ² = count_sq / count², the variance of the weighted mean in units of one sample's
    (1 / effective count); 1 for a class seen once, 0 for an absent class (K,)."""
    count = moments.count.clamp_min(torch.finfo(moments.count.dtype).tiny)
    # Divided twice: count² underflows to 0 (and 0 / 0 is NaN) for counts below √tiny.
    return (moments.count_sq / count / count).clamp(0, 1)


def moments_statistics(moments: ClassMoments, p: float = 2.0) -> ClassStats:
    """Class statistics from running sums.

    In L2 every estimate is unbiased whatever the batches held: the mean is a weighted
    average of samples, and the spread is the weighted variance about that mean divided
    by 1 − Σŵ² (Bessel's correction for weighted samples; 0 for a class seen once). In L_p,
    p ≠ 2, the spread does not follow from moments: it is the L2 spread times the ratio of
    the L_p to the L2 deviations from the running mean, exact when that ratio is the same
    about the running and the true mean, approximate otherwise. ``count`` is Σw, the
    decayed weight of each class.

    Parameters
    ----------
    moments : ClassMoments
    p : float, default=2.0
        The order of the norm of ``msd``: that of the sums' ``dev_p``
        (:func:`update_moments`'s ``p``).
    """
    tiny = torch.finfo(moments.count.dtype).tiny
    count = moments.count.clamp_min(tiny)
    mean = moments.sum / count[:, None]  # (K, d)
    biased = centred_sum(moments) / count  # (K,)
    keep = 1 - _mean_noise(moments)
    msd_l2 = torch.where(keep > 0, biased / keep.clamp_min(tiny), torch.zeros_like(keep))
    if p == 2:
        msd = msd_l2
    else:
        ratio = moments.dev_p / moments.dev_2.clamp_min(tiny)
        msd = torch.where(moments.dev_2 > 0, msd_l2 * ratio, torch.zeros_like(ratio))
    return ClassStats(mean, msd, msd_l2, moments.count)


def moments_difficulty(
    moments: ClassMoments, p: float = 2.0, difficulty: str = "moment"
) -> torch.Tensor:
    """a_k (K,) from running sums, as :func:`class_difficulty` gives it from exact ones.

    ``"moment"``: ‖μ̂_k‖_p² overstates ‖μ_k‖_p² by the noise of the running mean, Σŵ²·msd_k
    in L2, so a_k = ‖μ̂_k‖_p² + (1 − Σŵ²)·msd_k: in L2 that is exactly Σw‖φ‖² / Σw, the
    weighted mean of ‖φ‖², unbiased; in L_p the same correction is an approximation.

    Parameters
    ----------
    moments : ClassMoments
    p : float, default=2.0
        As in :func:`moments_statistics`.
    difficulty : {"moment", "spread"}, default="moment"
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}.")
    moment, spread = _moment_and_spread(moments, p)
    return spread if difficulty == "spread" else moment


def moments_margins(
    moments: ClassMoments, c_bar: float, p: float, difficulty: str, present: torch.Tensor
) -> torch.Tensor:
    """Margins γ (K,) from running sums, as :func:`class_margins` gives them from exact
    statistics (both difficulties from one pass over the sums)."""
    moment, spread = _moment_and_spread(moments, p)
    if difficulty == "spread":
        return margins_from_difficulty(spread, c_bar, present, moment)
    return margins_from_difficulty(moment, c_bar, present)


def _moment_and_spread(moments: ClassMoments, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Both difficulties of :func:`moments_difficulty`, ``"moment"`` and ``"spread"``."""
    stats = moments_statistics(moments, p)
    return lp_norm_sq(stats.mean, p) + (1 - _mean_noise(moments)) * stats.msd, stats.msd
