"""warm_start: the state a fit starts from, the previous fit's or that of coef_ and
intercept_ assigned since."""

from __future__ import annotations

import hashlib

import numpy as np


def _fingerprint(*arrays) -> str:
    """A digest of the arrays' shapes and values (None counts as an empty array)."""
    digest = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray([] if a is None else a, dtype=np.float64)
        digest.update(f"{a.shape}".encode())
        digest.update(a.view(np.uint8))
    return digest.hexdigest()


class _WarmStartMixin:
    """_warm_state and _assigned_state of :class:`~mr2_probe.MR2LinearClassifier`."""

    def _warm_state(self, n_classes):
        """The previous fit's parameters, if warm_start applies to this fit (or those of
        the coef_ and intercept_ assigned since: :meth:`_assigned_state`)."""
        if not self.warm_start:
            return None
        state = self._assigned_state(getattr(self, "_head_state", None))
        if state is None:
            return None
        n_features = state["weight"].shape[-1]
        if (n_features, state["n_classes"]) != (self.n_features_in_, n_classes):
            start = state.get("start", "the previous fit's solution")
            raise ValueError(
                f"warm_start=True starts from {start}, for {n_features} "
                f"features and {state['n_classes']} classes; this fit has "
                f"{self.n_features_in_} features and {n_classes} classes. Fit with "
                "warm_start=False for other data."
            )
        rank = None if state["proj_a"] is None else state["proj_a"].shape[1]
        projected = state["proj_full"] is not None or state["proj_a"] is not None
        # Without a projection, the rows and intercept start any fit of the same head: one
        # with a projection at P = I, which is where the two agree (head.load keeps it).
        same = state["head"] == self.head and (
            not projected or (self.lam > 0 and rank == self.projection_rank)
        )
        return state if same else None

    def _assigned_state(self, state):
        """``state``, or where ``coef_`` or ``intercept_`` differ from the fit's own (assigned,
        or assigned to an estimator never fitted) a state of theirs, as LogisticRegression's
        warm start reads them: this head's rows and intercept, a projection at P = I."""
        coef, intercept = getattr(self, "coef_", None), getattr(self, "intercept_", None)
        if coef is None:
            return state
        # (the fit's own, or a state pickled before their fingerprint was kept)
        if state is not None and state.get("fingerprint") in (None, _fingerprint(coef, intercept)):
            return state
        coef = np.asarray(coef, dtype=np.float64)
        rows = len(coef) if coef.ndim == 2 else 0
        bias = np.zeros(rows) if intercept is None else np.asarray(intercept, dtype=np.float64)
        if rows in (0, 2) or bias.shape != (rows,):
            raise ValueError(
                f"warm_start=True starts from the assigned coef_ and intercept_, of shapes "
                f"{coef.shape} and {bias.shape}; they must be (n_classes, n_features) and "
                "(n_classes,), or (1, n_features) and (1,) for two classes."
            )
        if not (np.isfinite(coef).all() and np.isfinite(bias).all()):
            # (the fit started there and failed, blaming the features' scale)
            raise ValueError(
                "warm_start=True starts from the assigned coef_ and intercept_, which hold NaN "
                "or infinity. Assign finite values, or fit with warm_start=False."
            )
        # A two-class cosine head has both rows: its coef_ is their difference.
        weight = np.vstack([-coef, coef]) if self.head == "cosine" and rows == 1 else coef
        return {
            "weight": weight,
            "bias": bias,
            **dict.fromkeys(("proj_full", "proj_a", "proj_b")),
            "n_classes": max(rows, 2),  # (one row: two classes)
            "head": self.head,
            "start": "the assigned coef_ and intercept_",
        }
