"""The MR² losses as pure functions of tensors (vectorised, no host synchronisation)."""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from ._device import rows_product, transposed_product
from ._stats import (
    check_tensors,
    check_weight_shape,
    class_indices,
    class_statistics,
    float32_at_least,
    mean_spread,
    weight_divisor,
)


def margin_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    margins: torch.Tensor,
    sample_weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Margin cross-entropy ℓ_γ = CE(z / γ_y, y).

    Every logit of a sample is divided by the margin of its *true* class, a class-dependent
    temperature: a large γ_y asks for a larger logit gap before the loss saturates.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_samples, n_classes)
    target : torch.Tensor of shape (n_samples,), class indices
        Integers in ``[0, n_classes)``. Targets to ignore (cross_entropy's
        ``ignore_index=-100``) are not supported: give those samples any class and a
        ``sample_weight`` of 0.
    margins : torch.Tensor of shape (n_classes,)
    sample_weight : torch.Tensor of shape (n_samples,), default=None
    reduction : {"mean", "sum", "none"}, default="mean"
        ``"mean"`` is the weighted mean Σ w ℓ / Σ w.

    Examples
    --------
    >>> import torch
    >>> from mr2_probe import margin_cross_entropy
    >>> logits, target = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    >>> margin_cross_entropy(logits, target, torch.ones(2))  # γ ≡ 1: cross-entropy
    tensor(0.2201)
    >>> torch.nn.functional.cross_entropy(logits, target)
    tensor(0.2201)
    >>> # γ_0 = 2 halves the logits of class 0's sample: both samples now lose log(1 + 1/e).
    >>> margin_cross_entropy(logits, target, torch.tensor([2.0, 1.0]))
    tensor(0.3133)
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
    check_tensors(
        "margin_cross_entropy",
        logits=logits,
        target=target,
        margins=margins,
        sample_weight=sample_weight,
    )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        # (torch's "gather(): Expected dtype int32/int64 for index" said nothing of this)
        raise TypeError(
            f"targets must be class indices (integers), got {target.dtype}: class "
            "probabilities (cross_entropy's soft targets) are not supported."
        )
    # Shapes that broadcast were taken silently: logits of one row scored every target,
    # and weights of shape (B, 1) made a (B, B) loss (of shape (1,): the sum for a mean);
    # one-hot targets (B, K) of integers a loss of shape (B, K) (cross_entropy read the
    # (B, B, K) quotients as B classes of K positions).
    if (
        logits.ndim != 2
        or target.ndim != 1
        or logits.shape[:1] != target.shape
        or margins.shape != logits.shape[1:2]
    ):
        raise ValueError(
            "margin_cross_entropy takes logits (n_samples, n_classes), targets (n_samples,) "
            "of class indices (not one-hot) and margins (n_classes,); got shapes "
            f"{tuple(logits.shape)}, {tuple(target.shape)} and {tuple(margins.shape)}."
        )
    check_weight_shape(sample_weight, target.shape)
    target = class_indices(target)
    # gather, not margins[target]: indexing wraps negative targets, and cross_entropy
    # then took -100 (its ignore_index, with 100 classes or more) as a sample of loss 0
    # that "mean" still counted.
    gamma = margins.gather(0, target.reshape(-1)).view(target.shape)
    scaled = logits / gamma[:, None]  # (B, K)
    loss = F.cross_entropy(scaled, target, reduction="none")  # (B,)
    if sample_weight is not None and reduction != "mean":
        loss = loss * sample_weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if sample_weight is None:
        return loss.mean()
    # Summed in float32 at least: in float16 both sums pass 65504 beyond about 30,000
    # samples, and the mean was inf / inf (or inf). The weights are taken relative to
    # the largest, which leaves the mean as it is: float32 weights of 3e38 summed to inf
    # (a mean of NaN), and subnormal ones (1e-45) kept a bit or two of each w·ℓ.
    weight = float32_at_least(sample_weight)
    if weight.numel():  # (amax refuses an empty tensor)
        weight = relative_weights(weight, weight.abs().amax())
    mean = (float32_at_least(loss) * weight).sum() / weight.sum()
    return mean.to(torch.promote_types(loss.dtype, sample_weight.dtype))


def relative_weights(weight: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """``weight`` divided by the power of two at or below ``top`` (their largest magnitude;
    unchanged where it is 0 or not finite): a weighted mean's weights, whose sums then
    neither overflow nor lose subnormal ones. A power of two divides exactly, so that
    weights of ordinary size give the mean's bits as they were (divided by the largest,
    the mean moved by an ulp, and every fit of sample weights with it)."""
    top = top.detach()  # (a scale that cancels; frexp has no gradient)
    mantissa = torch.frexp(top).mantissa  # top = mantissa·2^e, mantissa in [0.5, 1)
    return weight / weight_divisor(top / (2 * mantissa))  # (2^(e − 1), exact)


def pairwise_sq_distances(features: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances between all rows, from one Gram matrix (B, B).

    ‖a‖² + ‖b‖² − 2a·b cancels: the rows are centred on their mean first (distances do
    not change), and computed in float32 at least, autocast or not. Features of norm 4000
    with a spread of 0.16 left errors of about 2 in float32 distances of 0.3, and a
    bfloat16 Gram matrix would leave errors as large as the distances (float16 overflows
    beyond norms of 256).
    """
    check_tensors("pairwise_sq_distances", features=features)
    features = float32_at_least(features)
    with torch.autocast(features.device.type, enabled=False):
        return _gram_sq_distances(features - features.mean(0, keepdim=True))


def _within_class_sq_distances(features, same, sample_weight=None) -> torch.Tensor:
    """:func:`pairwise_sq_distances` exact between rows of one class (``same``, (B, B)),
    whatever lies between the classes: each row is taken relative to the first row of its
    class in the batch (of positive weight, so that rows of weight 0 change nothing), a
    shift that leaves a class's distances as they are, so it carries no gradient. Entries
    across classes are not the rows' distances. Centred on the batch's mean, one far row of
    another class shifted every row by far/B, and every pair's cancellation came back."""
    features = float32_at_least(features)
    with torch.autocast(features.device.type, enabled=False):
        member = same if sample_weight is None else same & (sample_weight > 0)[None, :]
        # (B,): argmax takes the first maximum (it refuses an empty batch's rows).
        first = (
            member.to(features.dtype).argmax(1)
            if len(member)
            else member.new_zeros(0, dtype=torch.long)
        )
        return _gram_sq_distances(features - features.detach()[first])


def _gram_sq_distances(features: torch.Tensor) -> torch.Tensor:
    sq = (features * features).sum(-1)  # (B,)
    gram = features @ features.T  # (B, B)
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0)


def compactness_loss(
    features: torch.Tensor,
    target: torch.Tensor,
    s_bar: torch.Tensor | float,
    tau: torch.Tensor | float = 1.0,
    reduction: str = "mean",
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Representation-margin (compactness) loss over same-class pairs of a batch.

    ℓ_s̄(i) = log(1 + Σ_{j: y_j = y_i, j ≠ i} exp((‖φ_i − φ_j‖² − 2 s̄) / τ)); the
    ``"mean"`` reduction averages within each class present in the batch, then over
    those classes.

    With ``sample_weight`` w a sample counts as w copies of itself, as in scikit-learn: its
    partners' terms are multiplied by their weights (and a sample of weight w > 1 also
    pairs with its own w − 1 other copies, at distance 0), and the class averages are
    weighted. A sample of weight 0 takes no part at all, and integer weights give the loss
    of the batch with repeated rows.

    Parameters
    ----------
    features : torch.Tensor of shape (n_samples, n_features)
    target : torch.Tensor of shape (n_samples,)
    s_bar : float or scalar tensor
        Mean within-class spread s̄ (L2); pairs further apart than 2 s̄ are pulled in.
    tau : float or scalar tensor, default=1.0
        Temperature of the exponent, > 0.
    reduction : {"mean", "none"}, default="mean"
        ``"none"``: each sample's loss, times its weight when ``sample_weight`` is given.
    sample_weight : torch.Tensor of shape (n_samples,), default=None
        Non-negative weights (None: every sample weighs 1).

    Examples
    --------
    >>> import torch
    >>> from mr2_probe import compactness_loss
    >>> X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 9.0]])
    >>> y = torch.tensor([0, 0, 1, 1])
    >>> # Class 0's pair (‖φ_i − φ_j‖² = 4) lies within 2 s̄ = 17, class 1's (64) does not.
    >>> compactness_loss(X, y, s_bar=8.5, reduction="none").round(decimals=3)
    tensor([ 0.,  0., 47., 47.])
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}.")
    check_tensors("compactness_loss", features=features, target=target, sample_weight=sample_weight)
    # A vector s̄ (the classes' spreads, say) broadcast along the columns when it had
    # B entries; other shapes failed inside torch's products.
    shapes = [tuple(getattr(v, "shape", ())) for v in (s_bar, tau)]  # () for a float
    n_samples = features.shape[:1]
    several = any(math.prod(shape) > 1 for shape in shapes)
    if features.ndim != 2 or target.shape != n_samples or several:
        raise ValueError(
            f"compactness_loss takes features (n_samples, n_features), targets (n_samples,) "
            f"and a scalar s_bar and tau; got shapes {tuple(features.shape)}, "
            f"{tuple(target.shape)}, {shapes[0]} and {shapes[1]}."
        )
    check_weight_shape(sample_weight, n_samples)
    # τ = 0 made the loss inf; τ < 0 pushed each class apart, silently. (A tensor is not
    # compared: that would synchronise.)
    if isinstance(tau, numbers.Real) and not tau > 0:
        raise ValueError(f"tau must be a number > 0, got {tau}.")
    same = target[:, None] == target[None, :]  # (B, B)
    distances = _within_class_sq_distances(features, same, sample_weight)  # (B, B)
    exponent = (distances - 2 * s_bar) / tau
    eye = torch.eye(len(target), dtype=torch.bool, device=target.device)
    if sample_weight is None:
        exponent = exponent.masked_fill(~(same & ~eye), float("-inf"))
        weight = None
    else:
        weight = sample_weight.to(exponent.dtype)
        # log w_j on partner j; on the diagonal log(w_i − 1): the sample's other copies.
        log_partner = torch.where(eye, (weight - 1).clamp_min(0)[:, None], weight[None, :])
        exponent = torch.where(same, exponent + log_partner.log(), float("-inf"))
    # A zero column carries the "1 +": every row keeps a finite entry, so the logsumexp is
    # overflow-safe and its gradient is defined even for a sample alone in its class.
    padded = torch.cat([exponent.new_zeros(len(target), 1), exponent], dim=1)
    loss = torch.logsumexp(padded, dim=1)  # (B,)
    if reduction == "none":  # w_i·ℓ_i with weights, as margin_cross_entropy's
        return loss if weight is None else loss * weight
    # Per-class average, then mean over present classes, without knowing K: sample i
    # weighs w_i / W_{y_i} (W_k the class's weight in the batch), and those weights sum to
    # the number of classes present (of positive weight).
    if weight is None:
        share = 1.0 / same.sum(1).to(loss.dtype)  # (B,)
    else:
        # Relative to the largest weight of each one's class: the classes' sums of 3e38
        # were inf, shares 0. (Relative to the batch's largest, a class of 1e-30 beside
        # one of 1e20 underflowed to weights of 0 and dropped out of the mean.)
        # (B,): amax refuses an empty batch's rows
        top = torch.where(same, weight.abs()[None, :], 0).amax(1) if len(weight) else weight
        weight = relative_weights(weight, top)
        class_weight = same.to(loss.dtype) @ weight  # W_{y_i} (B,), scaled as w_i is
        share = weight / weight_divisor(class_weight)
    return (loss * share).sum() / share.sum().clamp_min(1.0)


def compactness_term(phi, y, w, s_bar, tau, n_classes: int, tau_follows: bool = True):
    """The compactness loss of a minibatch, differentiated through s̄ (and τ = 2 s̄) too.

    s̄ and the default τ = 2 s̄ (a fit's, from the whole training set once per epoch;
    ``MR2Loss``'s, from its running moments) are functions of φ: mean within-class
    spreads. Held constant within an epoch, they gave every step a gradient that shrinks φ
    as a whole, the loss falling with the scale of P and rising again at the next epoch's
    statistics; with a large step the projection collapsed towards zero (iris, λ = 0.5,
    step 1e-2: every sample in one class). Here s̄, and τ when ``tau_follows`` (a τ given
    by the user is a constant of the objective), move in the gradient only with the
    batch's own mean within-class spread m: s̄·m/m₀, m₀ = m's value, so the value is
    unchanged. With τ = 2 s̄ the loss then depends on the distances relative to the
    spread, invariant to a common scale of φ. A batch with no spread (one sample per
    class) keeps both fixed. ``MR2Loss(tau=None)`` takes the same term.
    """
    # (class_statistics sums in float32 at least: a half-precision spread overflows)
    spread = mean_spread(class_statistics(phi, y, n_classes, 2.0, w))
    held = spread.detach()
    positive = held > 0
    factor = torch.where(positive, spread / torch.where(positive, held, 1.0), 1.0)
    tau = tau * factor if tau_follows else tau
    return compactness_loss(phi, y, s_bar * factor, tau, sample_weight=w)


@torch.no_grad()
def linear_margin_ce_parts(
    X: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    margins: torch.Tensor,
    sample_weight: torch.Tensor,
    center: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample losses ℓ_i = CE((W·(x_i − m) + b) / γ_{y_i}, y_i) (B,) and their gradients
    in the logits, w_i·(softmax − onehot) / γ_{y_i} (B, K), w_i the sample weights.

    One matrix product and a few in-place passes over the (B, K) logits; ``center`` m
    (default 0) re-parametrises the intercept without copying X. ``row_scale`` r (B,)
    scales the products, z_i = r_i·W·x_i (the cosine head's r_i = 1/‖x_i‖, without a
    normalised copy of X; no intercept then); the gradients returned are then in W·x_i, so
    that :func:`linear_grad_from_logits` on the raw X gives the gradient in W.
    """
    if center is not None:
        offset = weight @ center  # (K,)
        bias = bias - offset if bias is not None else -offset
    z = rows_product(X, weight, bias)  # (B, K)
    inv_gamma = margins.reciprocal()[target]  # (B,)
    z.mul_((inv_gamma if row_scale is None else inv_gamma * row_scale)[:, None])
    lse = torch.logsumexp(z, dim=1)  # (B,)
    loss = lse - z.gather(1, target[:, None]).squeeze(1)  # (B,)
    z.sub_(lse[:, None]).exp_()  # softmax
    z.scatter_add_(1, target[:, None], -torch.ones_like(z[:, :1]))  # p − onehot
    scale = sample_weight * inv_gamma
    if row_scale is not None:
        scale = scale * row_scale
    z.mul_(scale[:, None])  # ∂(w_i ℓ_i)/∂z_i (B, K)
    return loss, z


@torch.no_grad()
def linear_grad_from_logits(
    X: torch.Tensor,
    grad_logits: torch.Tensor,
    center: torch.Tensor | None = None,
    has_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients in W and b of a loss whose gradient in the logits W·(x − m) + b is given."""
    grad_weight = transposed_product(grad_logits, X)  # (K, d)
    grad_bias = grad_logits.sum(0)  # (K,)
    if center is not None:
        grad_weight -= grad_bias[:, None] * center
    return grad_weight, grad_bias if has_bias else None


@torch.no_grad()
def linear_margin_ce_grad(
    X: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    margins: torch.Tensor,
    sample_weight: torch.Tensor,
    center: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Σ_i w_i CE((W·(x_i − m) + b) / γ_{y_i}, y_i) and its gradients in W and b.

    The full-batch solver's hot path for a plain linear head: two matrix products and a
    few in-place passes over the (B, K) logits, instead of autograd's extra copies.
    ``center`` m (default 0) re-parametrises the intercept without copying X; ``row_scale``
    as in :func:`linear_margin_ce_parts`.
    """
    loss, grad_logits = linear_margin_ce_parts(
        X, weight, bias, target, margins, sample_weight, center, row_scale
    )
    grad_weight, grad_bias = linear_grad_from_logits(X, grad_logits, center, bias is not None)
    return (loss * sample_weight).sum(), grad_weight, grad_bias


def tilted_class_risk(
    class_loss: torch.Tensor, class_share: torch.Tensor, tilt: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tilted class risk R_t = (1/t)·log Σ_k π_k·exp(t·L_k) and its class weights.

    Parameters
    ----------
    class_loss : torch.Tensor of shape (..., n_classes)
        L_k, each class's weighted mean loss (leading dimensions: independent problems,
        e.g. the folds of a search).
    class_share : torch.Tensor of shape (..., n_classes)
        π_k ≥ 0, summing to 1: each class's share of the total sample weight. Classes with
        π_k = 0 (absent) get no weight.
    tilt : float
        t ≥ 0. ``t = 0`` is the plain mean Σ_k π_k·L_k; t → ∞ approaches max_k L_k over the
        present classes (class-level group DRO).

    Returns
    -------
    risk : torch.Tensor of shape (...)
    weights : torch.Tensor of shape (..., n_classes)
        q = softmax(t·L + log π), the gradient of R_t in L: ∇R_t = Σ_k q_k ∇L_k.
    """
    # Absent classes have no part in R_t, whatever their loss: an infinite or NaN one is
    # taken as 0 (π·L and t·L + log π would be NaN).
    present = class_share > 0
    class_loss = torch.where(present, class_loss, 0)
    if abs(tilt) < torch.finfo(class_loss.dtype).tiny:
        # t = 0, or a t that the dtype rounds to 0 or to a subnormal (float32: below
        # 1.2e-38), whose tilt no loss of the dtype can show: 0/0 below, t = 1e-50.
        return (class_share * class_loss).sum(-1), class_share
    # log π = −inf for absent classes: they drop out of the softmax exactly.
    exponent = tilt * class_loss + class_share.log()  # (..., K)
    weights = torch.softmax(exponent, -1)
    # Around the mean L̄: R_t = L̄ + log1p(Σ π_k·expm1(t·(L_k − L̄))) / t. For small t the
    # log-sum-exp is near 0 and its rounding, divided by t, swamped R_t (float32, t = 1e-6:
    # L-BFGS saw noise and returned an untrained model); this form keeps full precision.
    mean = (class_share * class_loss).sum(-1, keepdim=True)
    delta = torch.where(present, tilt * (class_loss - mean), 0)  # (..., K)
    expm1 = torch.expm1(delta.clamp(max=1.0))
    near = torch.log1p((class_share * expm1).sum(-1)) / tilt + mean.squeeze(-1)
    far = torch.logsumexp(exponent, -1) / tilt  # overflow-safe for large t·(L_k − L̄)
    return torch.where(delta.abs().amax(-1) < 1.0, near, far), weights
