"""The trainable part of the probe: an optional projection P and a linear or cosine head.

    φ = P·x            (P = I + A·B with rank r, a full matrix, or absent)
    φ ← φ / ‖φ‖        (cosine head only)
    z = W·φ + b        (linear head)        z = s · φ·Ŵᵀ (cosine head, rows of W normalised)

With two classes and a linear head the first class's logit is pinned to zero, so that the
softmax is the binomial model of scikit-learn's LogisticRegression, penalty included.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ._device import (
    row_norms,
    row_norms_numpy,
    tangent_rows,
    to_numpy,
    to_tensor,
    torch_dtype,
    unit_rows,
)

# A two-class cosine head's rows start at least this angle (radians) away from opposite
# each other, each from the axis of their difference: cos 0.1 = 0.995 of the widest margin.
PAIR_OPENING = 0.1


@torch.no_grad()
def open_pair(rows: torch.Tensor, cos: torch.Tensor | None = None):
    """The rows ``(..., 2, d)`` of two-class cosine heads, opened where they lie within
    :data:`PAIR_OPENING` of opposite (at unit norm there, unchanged elsewhere); returns
    ``(rows, opened)``, ``opened`` (...,) bool.

    The loss of two classes depends on ŵ₁ − ŵ₀ alone, of norm 2·cos φ, φ each row's angle
    from the axis u of that difference. Opposite rows (φ = 0, the widest margin) are a
    stationary point: turning both rows towards a common direction changes the difference
    only to second order, so a gradient never leaves them, even where a narrower margin
    fits better (at large scales, a saddle). Opened rows are ±cos φ·u + sin φ·e, e the
    rows' common direction (or an axis orthogonal to u where they have none), so that
    ŵ₁ − ŵ₀ keeps its axis. ``cos`` (...,) sets cos φ instead of the rows' own, for every
    pair (a start from a difference alone); it too is at most cos :data:`PAIR_OPENING`.
    """
    unit = F.normalize(rows, dim=-1)
    diff, common = unit[..., 1, :] - unit[..., 0, :], unit[..., 1, :] + unit[..., 0, :]
    if cos is None:
        cos = diff.norm(dim=-1) / 2
        opened = cos > np.cos(PAIR_OPENING)
    else:
        cos, opened = cos.to(rows), torch.ones(cos.shape, dtype=torch.bool, device=rows.device)
    u = F.normalize(diff, dim=-1)
    axis = F.one_hot(u.abs().argmin(-1), u.shape[-1]).to(u)  # an axis far from u
    common = torch.where(common.norm(dim=-1, keepdim=True) > 1e-3, common, axis)
    e = F.normalize(common - (common * u).sum(-1, keepdim=True) * u, dim=-1)
    c = cos.clamp(0, np.cos(PAIR_OPENING))[..., None]
    side = (1 - c**2).sqrt() * e
    pair = torch.stack([side - c * u, side + c * u], dim=-2)
    return torch.where(opened[..., None, None], pair, rows), opened


class ProbeHead(nn.Module):
    """Parameters and forward pass of the probe; lives only for the duration of ``fit``."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        *,
        head: str,
        fit_intercept: bool,
        scale: float,
        projection: bool,
        projection_rank: int | None,
        dtype: torch.dtype,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.head, self.scale, self.n_classes = head, scale, n_classes
        self.pinned = head == "linear" and n_classes == 2
        rows = 1 if self.pinned else n_classes
        kw = {"dtype": dtype, "device": device}
        self.weight = nn.Parameter(torch.zeros(rows, n_features, **kw))
        has_bias = fit_intercept and head == "linear"
        self.bias = nn.Parameter(torch.zeros(rows, **kw)) if has_bias else None
        self.proj_full = self.proj_a = self.proj_b = None
        if projection and projection_rank is None:
            self.proj_full = nn.Parameter(torch.eye(n_features, **kw))
        elif projection:
            # P = I + A·B: A starts at zero so that P starts at the identity.
            self.proj_a = nn.Parameter(torch.zeros(n_features, projection_rank, **kw))
            # Drawn on the CPU (the generator's device, whatever torch's default device).
            b = torch.randn(
                projection_rank, n_features, generator=generator, dtype=dtype, device="cpu"
            )
            self.proj_b = nn.Parameter((b / n_features**0.5).to(device))

    @property
    def is_plain_linear(self) -> bool:
        """A linear head on the raw features (closed-form gradients): one row per class,
        or for two classes one row, the first class's logit pinned at zero."""
        return self.head == "linear" and not self.has_projection

    @property
    def is_plain_cosine(self) -> bool:
        """A cosine head on the raw features (closed-form gradients)."""
        return self.head == "cosine" and not self.has_projection

    @property
    def has_closed_form(self) -> bool:
        """Whether the full-batch solver takes the closed-form gradients (no autograd).

        Both heads are then a linear map V·φ (+ b) of a fixed φ: V = W for the linear head,
        V = s·W / ‖W‖ (row by row) for the cosine head, φ = x / ‖x‖.
        """
        return self.is_plain_linear or self.is_plain_cosine

    @torch.no_grad()
    def logit_weight(self) -> torch.Tensor:
        """V, the matrix that maps φ to the logits (K, d'; a pinned head's first row zero)."""
        if self.head == "cosine":
            return self.scale * F.normalize(self.weight, dim=1)
        return self._unpinned(self.weight)

    @torch.no_grad()
    def logit_bias(self) -> torch.Tensor | None:
        """The intercepts of the K logits (a pinned head's first zero), or None."""
        return None if self.bias is None else self._unpinned(self.bias)

    def _unpinned(self, param: torch.Tensor) -> torch.Tensor:
        """A pinned head's parameter with the first class's zero before it; else itself."""
        return torch.cat([torch.zeros_like(param[:1]), param]) if self.pinned else param

    @torch.no_grad()
    def add_logit_bias_grad(self, grad: torch.Tensor, alpha: float = 1.0) -> None:
        """Add α·∂f/∂b to ``bias.grad``, given the gradient in :meth:`logit_bias` (K,)."""
        self.bias.grad.add_(grad[1:] if self.pinned else grad, alpha=alpha)

    @torch.no_grad()
    def add_logit_weight_grad(self, grad: torch.Tensor, alpha: float = 1.0) -> None:
        """Add α·∂f/∂W to ``weight.grad``, given ∂f/∂V (K, d').

        For the cosine head, V = s·W/‖W‖ row by row: ∂f/∂w_k = s·(I − u_k u_kᵀ)·g_k / ‖w_k‖,
        u_k = w_k / ‖w_k‖; the radial part is zero, since f does not depend on ‖w_k‖.
        """
        if self.head != "cosine":
            self.weight.grad.add_(grad[1:] if self.pinned else grad, alpha=alpha)
            return
        # F.normalize's floor: a zero row (a class without weight) has the same gradient
        # as autograd gives through logits().
        norm = torch.linalg.vector_norm(self.weight, dim=1, keepdim=True).clamp_min(1e-12)
        tangent = tangent_rows(self.weight / norm, grad)  # (K, d')
        self.weight.grad.add_(tangent / norm, alpha=alpha * self.scale)

    @property
    def has_projection(self) -> bool:
        return self.proj_full is not None or self.proj_a is not None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ for a batch of inputs (B, d)."""
        if self.proj_full is not None:
            x = x @ self.proj_full.T
        elif self.proj_a is not None:
            x = x + (x @ self.proj_b.T) @ self.proj_a.T
        if self.head != "cosine":
            return x
        return unit_rows(x)  # F.normalize, safe from overflow

    def logits(self, phi: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) from φ."""
        if self.head == "cosine":
            return self.scale * phi @ F.normalize(self.weight, dim=1).T
        z = phi @ self.weight.T  # (B, rows)
        if self.bias is not None:
            z = z + self.bias
        return torch.cat([torch.zeros_like(z), z], dim=1) if self.pinned else z

    def penalty(self) -> torch.Tensor:
        """½‖W‖² (linear head) plus ½‖P − I‖² for a projection (½(‖A‖² + ‖B‖²) low rank).

        A cosine head is scale-invariant in W, so W carries no penalty there.
        """
        total = self.weight.new_zeros(())
        if self.head == "linear":
            total = total + 0.5 * self.weight.square().sum()
        if self.proj_full is not None:
            eye = torch.eye(self.proj_full.shape[0], dtype=total.dtype, device=total.device)
            total = total + 0.5 * (self.proj_full - eye).square().sum()
        elif self.proj_a is not None:
            total = total + 0.5 * (self.proj_a.square().sum() + self.proj_b.square().sum())
        return total

    @torch.no_grad()
    def load(self, state: dict) -> None:
        """Start from a previous fit's exported state (warm start)."""
        device, dtype = self.weight.device, self.weight.dtype
        for name in ("weight", "bias", "proj_full", "proj_a", "proj_b"):
            param = getattr(self, name)
            if param is not None and state.get(name) is not None:
                param.copy_(to_tensor(state[name], device, dtype))

    @torch.no_grad()
    def init_weight_from_means(self, class_means: torch.Tensor) -> None:
        """Cosine heads start at the class prototypes.

        A zero prototype (a class of no weight, or whose normalised features cancel) has
        no direction, and a zero row is where the head's gradient, ∝ 1/‖w_k‖, is undefined:
        such a row starts opposite the other prototypes' sum instead (or along the first
        axis when that is zero too).
        """
        rows = F.normalize(class_means, dim=1)
        empty = rows.abs().sum(1, keepdim=True) == 0  # (K, 1)
        away = F.normalize(-rows.sum(0), dim=0)  # (d,)
        first_axis = torch.zeros_like(away)
        first_axis[0] = 1
        away = torch.where(away.abs().sum() > 0, away, first_axis)
        self.weight.copy_(torch.where(empty, away, rows))

    @torch.no_grad()
    def open_pair(self) -> None:
        """A two-class cosine head's rows, opened where they are opposite (:func:`open_pair`);
        the rows of any other head are left as they are."""
        if self.head == "cosine" and self.n_classes == 2:
            self.weight.copy_(open_pair(self.weight)[0])  # the same rows where not opposite

    @torch.no_grad()
    def export(self) -> dict:
        """Fitted state as NumPy: the raw parameters and the scikit-learn view."""
        state = {
            name: None if getattr(self, name) is None else to_numpy(getattr(self, name))
            for name in ("weight", "bias", "proj_full", "proj_a", "proj_b")
        }
        proj = self._projection_matrix()
        if self.head == "cosine":
            weight = self.scale * F.normalize(self.weight, dim=1)  # (K, d')
        elif self.pinned:
            weight = torch.cat([torch.zeros_like(self.weight), self.weight])
        else:
            weight = self.weight
        coef = weight if proj is None else weight @ proj  # (K, d)
        if self.bias is None:
            intercept = coef.new_zeros(self.n_classes)
        elif self.pinned:
            intercept = torch.cat([torch.zeros_like(self.bias), self.bias])
        else:
            intercept = self.bias
        if self.n_classes == 2:
            # scikit-learn's binary convention: one row, decision = z_1 − z_0.
            coef, intercept = coef[1:] - coef[:1], intercept[1:] - intercept[:1]
        state["coef"] = to_numpy(coef)
        state["intercept"] = to_numpy(intercept)
        state["projection"] = None if proj is None else to_numpy(proj)
        return state

    def _projection_matrix(self) -> torch.Tensor | None:
        if self.proj_full is not None:
            return self.proj_full
        if self.proj_a is not None:
            a = self.proj_a
            return torch.eye(a.shape[0], dtype=a.dtype, device=a.device) + a @ self.proj_b
        return None


# Rows of a NumPy X promoted to the model's precision at a time, in decision_values.
_PREDICT_ROWS = 65536


def decision_values(X, coef, intercept, projection, head: str):
    """Logits from fitted NumPy state, in X's own library (NumPy array or torch tensor).

    Binary models give one column, squeezed to shape (n_samples,) by the caller.
    """
    if isinstance(X, torch.Tensor):
        # In the wider of X's and the model's precision, as NumPy rows below (MPS has no
        # float64: there, X's own).
        dtype = torch.promote_types(X.dtype, torch_dtype(coef.dtype))
        dtype = X.dtype if X.device.type == "mps" else dtype
        X = X.to(dtype)
        coef, intercept = (to_tensor(a, X.device, dtype) for a in (coef, intercept))
        if head == "cosine":
            # Rows at unit norm first: X·Wᵀ (and X·Pᵀ) overflowed for rows of norm near
            # float32's largest (NaN predictions where the fit had worked), which the head
            # ignores.
            X = unit_rows(X)
            if projection is None:
                return X @ coef.T + intercept
        z = X @ coef.T  # (N, K)
        if head == "cosine":
            phi = X @ to_tensor(projection, X.device, dtype).T
            z = z / row_norms(phi).clamp_min(1e-12)[:, None]
        return z + intercept
    X = np.asarray(X)
    # As scikit-learn's linear models: the products in the wider of X's and the model's
    # precision (float32 rows of a float64 model are promoted, block by block).
    dtype = np.promote_types(X.dtype, coef.dtype)
    coef, intercept = coef.astype(dtype, copy=False), intercept.astype(dtype, copy=False)
    projection = None if projection is None else projection.astype(dtype, copy=False)
    z = np.empty((len(X), len(coef)), dtype=dtype)
    for start in range(0, len(X), _PREDICT_ROWS):
        x = X[start : start + _PREDICT_ROWS].astype(dtype, copy=False)
        if head == "cosine":  # unit rows first, as above
            x = x / np.maximum(row_norms_numpy(x), 1e-12)[:, None]
        block = x @ coef.T
        if head == "cosine" and projection is not None:
            block /= np.maximum(row_norms_numpy(x @ projection.T), 1e-12)[:, None]
        z[start : start + len(x)] = block + intercept
    return z
