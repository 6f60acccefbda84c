"""FitDivergedError, and the errors of a fit that leaves floating-point range: which
parameters are extreme enough to be to blame, else the features."""

from __future__ import annotations

import math

import numpy as np
import sklearn
import torch

from ._data import as_given

# Parameters this far out put the objective itself out of floating-point range.
_EXTREME = 1e-6


def _dtype_name(dtype) -> str:
    """``float32`` for torch.float32 (and for NumPy's, as it is)."""
    return str(dtype).replace("torch.", "")


class FitDivergedError(ValueError):
    """A fit that diverged, or left floating-point range through an extreme parameter: a
    search records that value as failed, where an error in the data fails the search."""


def _overflow_message(what, dtype, suspects=()):
    """The error of a fit that left floating-point range: the ``suspects`` (parameters
    found extreme) when there are any, else the features' scale (or, where scikit-learn's
    ``assume_finite`` skipped their check, their NaN or infinity)."""
    name = _dtype_name(dtype)
    if suspects:
        return (
            f"Cannot fit: {what} in {name} arithmetic, with {' and '.join(suspects)}. Use "
            "values of a usual order of magnitude and fit again."
        )
    if sklearn.get_config()["assume_finite"]:
        # X was not checked: NaN in it was told to scale the features.
        return (
            f"Cannot fit: {what} in {name} arithmetic: the features hold NaN or infinity, "
            "which assume_finite=True did not check for, or are too large. Check X with "
            "assume_finite=False, and scale it (e.g. StandardScaler) if it is finite."
        )
    return (
        f"Cannot fit: {what} in {name} arithmetic, the features are too large. Scale "
        "them (e.g. StandardScaler, or divide X by a constant) and fit again."
    )


def _overflow_error(what, dtype, suspects=()) -> ValueError:
    """The error of :func:`_overflow_message`: a FitDivergedError where ``suspects``
    (parameters) are to blame, a plain ValueError where the features are."""
    return (FitDivergedError if suspects else ValueError)(_overflow_message(what, dtype, suspects))


def _scale_underflow(scale, dtype) -> FitDivergedError:
    """The error of a cosine head's ``scale`` below ``dtype``'s normal numbers: float32's
    scale=1e-300 is 0, the coefficients s·W were 0 and every prediction the first class."""
    suspects = [f"scale={scale:g} (the cosine head's logits are cosines times it)"]
    return FitDivergedError(_overflow_message("the logits underflow", dtype, suspects))


def _range_suspects(
    C,
    c_bar,
    weight_sum,
    class_tilt=0.0,
    scale=None,
    dtype=None,
    stalled=False,
    tau=None,
    overflowed=False,
) -> list:
    """The parameters that are extreme enough to overflow a fit on their own (``scale``:
    a cosine head's; ``dtype``: the data's, for sample weights near its largest number;
    ``stalled``: whether the fit stopped on its precision, short of tol; ``tau``: the
    compactness loss's, where it takes part; ``overflowed``: whether the fit's
    coefficients are non-finite)."""
    suspects = []
    # The loss's and the gradient's sums (Σ w_i·ℓ_i, and times a cosine head's scale) are
    # taken before the division by Σw: a cosine fit at Σw = 1.2e38 in float32 stalled at
    # its start, one at 6e36 converged; a linear head's resolve up to float32's largest,
    # but its gradient sums w_i·x_i·(p − y) can overflow below it: on standardised
    # float32 iris Σw = 1.5e38 did, and the features were blamed. So where the
    # coefficients overflowed, weights within 2²⁰ of the largest number are named.
    margin = 16 if scale is not None else 2**20 if overflowed else 2
    near = torch.finfo(dtype).max / margin if dtype else np.inf
    if weight_sum > near:
        suspects.append(
            f"sample weights summing to {weight_sum:g} (the loss and its gradient sum them "
            "before dividing by their sum)"
        )
    # Weights near the dtype's smallest normal number (subnormal ones lose their precision,
    # the smallest become 0): a cosine fit's failure at such weights blamed the features.
    elif dtype is not None and weight_sum < 1024 * torch.finfo(dtype).tiny:
        suspects.append(
            f"sample weights summing to {weight_sum:g} (near the smallest normal number of "
            f"{_dtype_name(dtype)}, in which X is computed)"
        )
    if scale is not None and scale > 1 / _EXTREME:
        suspects.append(f"scale={scale:g} (the cosine head's logits are cosines times it)")
    if class_tilt > 1 / _EXTREME:
        tilt = as_given(class_tilt)
        suspects.append(f"class_tilt={tilt} (the tilt multiplies every class's loss)")
    if c_bar is not None and c_bar < _EXTREME:
        suspects.append(f"c_bar={as_given(c_bar)} (the margins divide the logits by it)")
    # (float32's τ = 1e-38 made the compactness loss NaN, and the learning rate was blamed)
    if tau is not None and tau < _EXTREME:
        suspects.append(f"tau={as_given(tau)} (the compactness loss divides the distances by it)")
    if C * weight_sum < _EXTREME:
        suspects.append(
            f"C={C:g} and sample weights summing to {weight_sum:g} (the penalty is ½‖W‖² / (C·Σw))"
        )
    # A large c̄ is a small C: W / c̄ solves the problem of C / c̄² at c̄ = 1 (iris at
    # c̄ = 1e8 stalled at its start, and the warning told to scale the features). A c̄ of
    # a usual order is none of a fit ``stalled`` on its precision (1e3 at most,
    # 1/√_EXTREME): iris at c̄ = 10 with C·Σw = 1.5e-5 (C=1e-7, or weights of 1e-7)
    # stopped so, and a larger tol resolved it; one that ran out of max_iter is its own
    # (iris at c̄ = 500, C = 1e-5 still did at max_iter=5000 or tol=1e-3).
    # (A linear head's: a cosine head's margins divide its scaled cosines, and no C.)
    elif (
        scale is None
        and c_bar is not None
        and c_bar > (_EXTREME**-0.5 if stalled else 1)
        and C * weight_sum / c_bar / c_bar < _EXTREME
    ):
        suspects.append(
            f"c_bar={as_given(c_bar)} with C={C:g} (the margins divide the logits by about c̄: the "
            f"problem of C / c̄² = {C / c_bar / c_bar:g} at c̄ = 1)"
        )
    return suspects


def _weight_suspects(weight_sum, dtype) -> list:
    """Sample weights large enough to take the class statistics' sums Σw·‖x‖² out of
    ``dtype``'s range on their own (past the square root of its largest number)."""
    if weight_sum > math.sqrt(torch.finfo(dtype).max):
        return [f"sample weights summing to {weight_sum:g} (the class statistics sum them)"]
    return []
