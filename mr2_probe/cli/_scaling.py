"""The row scaling of ``--feature-scaling l2``."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.preprocessing import Normalizer, normalize
from sklearn.utils.validation import FLOAT_DTYPES, validate_data


class RowNormalizer(Normalizer):
    """scikit-learn's :class:`~sklearn.preprocessing.Normalizer`, its row norms computed
    without overflow or underflow.

    Normalizer computes a row's norm in the features' dtype: a float32 row with values
    above about 1e19 has an infinite norm, and is divided into zeros (finite, so nothing
    refused them, and the models fitted and predicted on zeros); one whose norm is below
    ten times the dtype's epsilon (1.2e-6 in float32) is taken for a row of zeros, and
    left as it is. Each dense row is first multiplied by the power of 2 that puts its
    largest magnitude between 1 and 2, its l2 norm then between 1 and twice the root of
    its number of features. The product is exact: a row that Normalizer scales right is
    scaled to the same bits.
    """

    def transform(self, X, copy=None):
        copy = copy if copy is not None else self.copy
        # (integer features in float64, as normalize computes them)
        X = validate_data(
            self,
            X,
            accept_sparse="csr",
            dtype=FLOAT_DTYPES,
            force_writeable=True,
            copy=copy,
            reset=False,
        )
        if not sparse.issparse(X):
            # (a row of zeros: frexp(0) is 0 * 2**0, and the row stays zeros)
            _, exponent = np.frexp(np.maximum(X.max(axis=1), -X.min(axis=1)))  # (n,)
            np.ldexp(X, 1 - exponent[:, None], out=X)  # (n, d)
        return normalize(X, norm=self.norm, axis=1, copy=False)
