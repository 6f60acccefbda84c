"""The data of a fit: X and y validated, classes_ set, the sample and class weights
checked, and all of it put on the device once."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils import check_random_state, compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, _check_y, validate_data

from ._data import (
    FitData,
    H5Source,
    TensorSource,
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
    plain,
    reject_complex,
)
from ._device import resolve_device, to_tensor, torch_dtype
from ._fit_errors import _dtype_name
from ._input_dtypes import _check_dtypes, _floating


class _FitInputsMixin:
    """_prepare and _validate_fit_data of :class:`~mr2_probe.MR2LinearClassifier`."""

    def _prepare(self, X, y, sample_weight):
        """Validate the data, set ``classes_``, and put X, y and the weights on the device.

        The one upload of a fit: a search solves many problems on the :class:`FitData`
        this returns (see :meth:`FitData.subset`).
        """
        X, y, device, dtype = self._validate_fit_data(X, y)
        check_classification_targets(y)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        n_classes = len(self.classes_)
        if n_classes < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {plain(self.classes_[0])!r}."
            )
        check_h5_open(sample_weight=sample_weight)
        sample_weight = numpy_if_tensor(sample_weight, "sample_weight")
        sample_weight = _check_sample_weight(
            sample_weight, np.empty((len(y_index), 0)), dtype=np.float64, ensure_non_negative=True
        )
        if self.class_weight is not None:
            if self.class_weight == "balanced":  # (validated: a dict, "balanced" or None)
                # scikit-learn's rule, sum(w) / (K · w_k) with w_k each class's weight, by
                # hand: its compute_class_weight takes sample_weight from 1.7 on only.
                counts = np.bincount(y_index, weights=sample_weight, minlength=n_classes)
                with np.errstate(divide="ignore", invalid="ignore"):
                    weights = counts.sum() / (n_classes * counts)
            else:
                weights = compute_class_weight(self.class_weight, classes=self.classes_, y=y)
            if isinstance(self.class_weight, dict):
                given = np.array(list(self.class_weight.values()), dtype=float)
                if not (np.isfinite(given).all() and (given >= 0).all()):
                    # (a dict of np.unique's classes and computed weights shown as Python's
                    # numbers and text: {0: -1.0}, not {np.int64(0): np.float64(-1.0)})
                    shown = {plain(k): plain(v) for k, v in self.class_weight.items()}
                    raise ValueError(
                        f"class_weight={shown!r}: every class weight must be a finite number >= 0."
                    )
            bad = ~np.isfinite(weights)
            if bad.any():
                raise ValueError(
                    f"class_weight={self.class_weight!r} gives the classes "
                    f"{self.classes_[bad].tolist()} a weight that is not finite: their "
                    "samples' sample_weight sums to zero. Drop those samples, or give them "
                    "a positive weight."
                )
            sample_weight = sample_weight * weights[y_index]
        weight_scale = 1.0
        if self.head == "cosine" and self.lam == 0 and sample_weight.max() > 0:
            # Its objective (no penalty, no compactness term) does not depend on the
            # weights' scale: taken relative to the largest here, in float64, so that
            # weights near the smallest normal number of X's dtype, or beyond its largest,
            # keep their ratios in it (1e-42 in float32 kept 3 bits, and the class
            # statistics of the margins were 1.4% off). class_stats_ counts them as given.
            weight_scale = float(sample_weight.max())
            sample_weight = sample_weight / weight_scale
        weight_sum = float(sample_weight.sum())
        if weight_sum <= 0:
            raise ValueError("The sum of sample weights must be positive.")
        largest, top = float(sample_weight.max()), torch.finfo(dtype).max
        # (class_weight multiplies them: it may be the one to blame)
        named = "sample_weight" if self.class_weight is None else "sample_weight × class_weight"
        if largest > top or weight_sum > top:  # (the sum: Σ w_i·ℓ_i overflows from the start)
            what = (
                f"{named} holds values up to {largest:g}"
                if largest > top
                else f"The loss is summed with sample weights summing to {weight_sum:g}"
            )
            same = (
                "multiply the weights by a small factor and C by its inverse (the same "
                "problem), and fit again."
                if self.lam == 0
                else "with lam > 0 the compactness loss counts a sample as w copies of "
                "itself, so no smaller weights make the same problem; use smaller weights."
            )
            raise ValueError(
                f"{what}, beyond the range of {_dtype_name(dtype)}, in which X is computed: " + same
            )
        if not torch.tensor(largest, dtype=dtype, device="cpu"):  # (whatever the default)
            # Every weight rounds to 0 in X's dtype (float32's 1e-300): the fit failed on an
            # overflow of L-BFGS's step, and a search's on "sample weights summing to 0".
            same = (
                "multiply them by a large factor and C by its inverse (the same "
                "problem), and fit again."
                if self.lam == 0
                else "with lam > 0 the compactness loss counts a sample as w copies of "
                "itself, so no larger weights make the same problem; use larger weights."
            )
            raise ValueError(
                f"{named} holds values up to {largest:g}, which underflow to 0 in "
                f"{_dtype_name(dtype)}, in which X is computed: every sample would weigh "
                "nothing. Rescale the weights: " + same
            )

        y_t = to_tensor(y_index.astype(np.int64), device)
        w_t = to_tensor(sample_weight, device, dtype)
        rows = block_rows(self.n_features_in_, n_classes)
        if is_h5_dataset(X):
            source = H5Source(X, y_t, w_t, rows, device, dtype)
        else:
            source = TensorSource(X, y_t, w_t, rows)
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        return FitData(
            source, y_index, sample_weight, weight_sum, n_classes, device, dtype, seed, weight_scale
        )

    def _validate_fit_data(self, X, y):
        """Validate X and y; return X ready for the device, y as NumPy, device and dtype."""
        check_h5_open(X=X, y=y)
        if is_torch_tensor(X):
            check_dense_tensor(X, type(self).__name__)
        if is_torch_tensor(X) or is_h5_dataset(X):
            validate_data(self, X, y, skip_check_array=True)
            check_2d(X)
            if X.shape[0] < 1 or X.shape[1] < 1:
                raise ValueError(
                    f"Found array with shape {tuple(X.shape)} while a minimum "
                    "of 1 sample and 1 feature is required."
                )
            y = y[...] if is_h5_dataset(y) else y
            check_no_missing_labels(numpy_if_tensor(y, "y"))
            # As validate_data checks y beside a NumPy X: NaN among object labels (a pandas
            # column's missing value) is named, not a TypeError from sorting the classes,
            # and a pandas column of a nullable dtype ("Int64", "boolean") is converted as
            # scikit-learn converts it (classes_ of float64 beside a NumPy X, of int64 or
            # bool beside a tensor, before).
            y = _check_y(numpy_if_tensor(y, "y"), estimator=self)
            if len(y) != X.shape[0]:
                raise ValueError(f"X has {X.shape[0]} samples but y has {len(y)}.")
        else:
            dtype = _check_dtypes(X)
            y = numpy_if_tensor(y, "y")  # (on a GPU, or requiring grad)
            # (as given, before NumPy reads a list's NaN among text as the class 'nan';
            # scikit-learn's check failed on pd.NA: "boolean value of NA is ambiguous")
            check_no_missing_labels(y)
            X, y = validate_data(self, _floating(X), y, dtype=dtype, order="C")
        if self.head == "cosine" and X.shape[1] == 1:
            # Every direction of one feature is ±1: the cosine is the sample's sign, and
            # the fit stood still (no gradient) and predicted one class, without a word.
            raise ValueError(
                "head='cosine' needs at least 2 features, got 1 feature(s): the cosine of a "
                "single feature with any direction is ±1. Use head='linear'."
            )
        if is_torch_tensor(X):
            device = X.device if self.device == "auto" else resolve_device(self.device)
            X = _floating(X).to(device)
            dtype = X.dtype
            check_finite_tensor(X, type(self).__name__)
        elif is_h5_dataset(X):
            reject_complex(X)
            device, dtype = resolve_device(self.device), torch_dtype(h5_dtype(X))
        else:
            device, dtype = resolve_device(self.device), torch_dtype(X.dtype)
            X = to_tensor(X, device, dtype)
        return X, y, device, dtype
