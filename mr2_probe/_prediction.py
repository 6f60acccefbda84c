"""Predictions of a fitted probe: decision_function, predict_proba, predict_log_proba,
predict and score, as scikit-learn's LinearClassifierMixin gives its linear models."""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import log_softmax, softmax
from sklearn.utils.validation import check_is_fitted, validate_data

from ._data import (
    block_rows,
    check_2d,
    check_dense_tensor,
    check_finite_tensor,
    check_h5_open,
    check_no_missing_labels,
    h5_dtype,
    is_h5_dataset,
    is_torch_tensor,
    numpy_if_tensor,
    read_h5,
    reject_complex,
    summable_weights,
)
from ._device import default_torch_modes, to_numpy
from ._head import decision_values
from ._input_dtypes import _check_dtypes, _finite_block, _floating


def both_class_logits(z):
    """Logits with a column per class: a two-class head's one column z becomes (0, z), the
    binomial model's pinned first class (a tensor stays a tensor)."""
    if z.shape[1] != 1:
        return z
    if is_torch_tensor(z):
        return torch.cat([torch.zeros_like(z), z], dim=1)
    return np.hstack([np.zeros_like(z), z])


class _PredictMixin:
    """decision_function, predict_proba, predict_log_proba, predict and score of
    :class:`~mr2_probe.MR2LinearClassifier`, from its fitted attributes."""

    def _validate_predict_data(self, X):
        check_is_fitted(self)
        check_h5_open(X=X)
        if is_torch_tensor(X):
            check_dense_tensor(X, type(self).__name__)
        if is_torch_tensor(X) or is_h5_dataset(X):
            check_2d(X)  # before the check of the features (shape[1])
            if X.shape[0] == 0:  # as check_array says it of NumPy rows
                raise ValueError(
                    f"Found array with 0 sample(s) (shape={tuple(X.shape)}) while a minimum of "
                    f"1 is required by {type(self).__name__}."
                )
            validate_data(self, X, reset=False, skip_check_array=True)
            if is_h5_dataset(X):
                reject_complex(X)  # blocks are checked for NaN and infinity as they are read
                return X
            X = _floating(X)  # as in fit: half precision is computed in float32
            check_finite_tensor(X, type(self).__name__)
            return X
        dtype = _check_dtypes(X)
        return validate_data(self, _floating(X), reset=False, dtype=dtype, order="C")

    def _logits(self, X):
        if is_h5_dataset(X):
            rows = block_rows(X.shape[1], len(self.classes_))
            parts = [
                self._logits(
                    _finite_block(read_h5(X, slice(i, i + rows)), h5_dtype(X), type(self).__name__)
                )
                for i in range(0, X.shape[0], rows)
            ]
            return np.concatenate(parts) if parts else np.empty((0, self.coef_.shape[0]))
        # The fitted head, not the parameter: set_params(head=...) after fit changes nothing
        # until the next fit (models pickled before head_ existed keep it in _head_state).
        head = getattr(self, "head_", None) or getattr(self, "_head_state", {}).get("head")
        head = head or self.head  # a refit=False search pickled before head_ existed
        # No projection where coef_, intercept_ and classes_ were assigned to an estimator
        # never fitted (another model's), which predicts with them as LogisticRegression does.
        projection = getattr(self, "projection_", None)
        with default_torch_modes(gradients=False):  # the model's precision, not autocast's
            return decision_values(X, self.coef_, self.intercept_, projection, head)

    def decision_function(self, X):
        """Logits (margins are training-only). Shape (n_samples,) for two classes.

        A torch tensor gives a tensor on its device; anything else gives NumPy. Either is
        computed in the wider of X's and the model's precision, as scikit-learn's linear
        models compute NumPy rows (float32 rows of a float64 model give float64 logits).
        """
        z = self._logits(self._validate_predict_data(X))
        return z[:, 0] if z.shape[1] == 1 else z

    def predict_proba(self, X):
        """Class probabilities, softmax of the logits, shape (n_samples, n_classes).

        float64 whatever the model's and X's dtype (a float32 softmax underflows to 0 at
        logit gaps past about 100, which a cosine head's scale reaches, and its rows sum to
        one only to float32's rounding, which scikit-learn's metrics, checking in float64,
        warn of); a torch tensor in gives a float64 tensor on its device (float32 on MPS,
        which has no float64)."""
        return self._probabilities(X, log=False)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        return self._probabilities(X, log=True)

    def _probabilities(self, X, log):
        z = both_class_logits(self._logits(self._validate_predict_data(X)))
        # Probabilities in float64: a float32 softmax underflows to 0 for logit gaps past
        # ~100 (a cosine head's scale reaches that), and then log(predict_proba) and
        # predict_log_proba disagree; and its rows miss one by up to 2.4e-7, past the 1.5e-8
        # of log_loss's check (a tensor is read as float64 there: "do not sum to one").
        if is_torch_tensor(z):
            z = z if z.device.type == "mps" else z.double()
            return torch.log_softmax(z, dim=1) if log else torch.softmax(z, dim=1)
        z = z.astype(np.float64)
        return log_softmax(z, axis=1) if log else softmax(z, axis=1)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` on ``(X, y)``; y may be a torch tensor."""
        check_h5_open(X=X, y=y, sample_weight=sample_weight)
        check_no_missing_labels(y, "y", "score")  # (a list's NaN among text: the class 'nan')
        y = numpy_if_tensor(y, "y")
        sample_weight = summable_weights(numpy_if_tensor(sample_weight, "sample_weight"))
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """Predicted labels (NumPy, of the type of ``classes_``): argmax of the logits."""
        z = self._logits(self._validate_predict_data(X))
        if is_torch_tensor(z):
            index = to_numpy((z[:, 0] > 0).long() if z.shape[1] == 1 else z.argmax(1))
        else:
            index = (z[:, 0] > 0).astype(int) if z.shape[1] == 1 else z.argmax(1)
        return self.classes_[index]
