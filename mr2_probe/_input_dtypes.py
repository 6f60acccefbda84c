"""The dtype in which a fit or a prediction computes X (check_array's, with half precision
as float32), and an HDF5 dataset's blocks as NumPy, checked as NumPy rows are."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils import assert_all_finite

from ._data import is_torch_tensor, reject_complex


def _floating(X):
    """X as computed on: half-precision (or integer) tensors and float16 arrays (and
    DataFrames of float16 columns) as float32, arrays of the other byte order in their own
    precision.

    Tensors are detached: features straight from a backbone may carry autograd history.
    Complex tensors are refused: a cast would drop their imaginary part silently.
    """
    if is_torch_tensor(X):
        reject_complex(X)
        X = X.detach()
        return X if X.dtype in (torch.float32, torch.float64) else X.float()
    dtype = getattr(X, "dtype", None)
    dtypes = getattr(X, "dtypes", None)  # a DataFrame's, one per column
    if dtype is None and dtypes is not None and not len(dtypes) and hasattr(X, "shape"):
        # A DataFrame without columns: check_array's np.result_type of no dtypes failed
        # ("at least one array or dtype is required"), where an array of that shape is
        # refused for its 0 features.
        return np.empty(X.shape)
    if dtype is None and dtypes is not None and len(dtypes):
        # check_array made float16 columns float64 (float16 is neither of its dtypes),
        # where the same rows as an array, a tensor or a store train in float32
        if all(isinstance(d, np.dtype) and d == np.float16 for d in dtypes):
            return X.astype(np.float32)
        return X
    if isinstance(X, np.ndarray) and dtype.kind == "f" and not dtype.isnative:
        # check_array's dtype=[float64, float32] takes big-endian float32 for neither, and
        # made it float64, where the same rows as an HDF5 dataset or a tensor are float32
        dtype = dtype.newbyteorder("=")
        X = np.asarray(X, dtype=dtype)
    if dtype == np.float16:  # stores often hold float16
        return X.astype(np.float32)
    return X


def _check_dtypes(X):
    """check_array's ``dtype`` for X: float32 for a DataFrame whose columns are all float16
    or float32 of a type other than NumPy's (polars, a pyarrow Table, pandas' nullable
    "Float32" or pyarrow-backed "float[pyarrow]"), else float64 or float32 (X's own where it
    is one of them).

    check_array reads no dtype from such columns and made them float64 (polars' Float16
    and Float32 alike), where a pandas DataFrame of the same NumPy columns trains in
    float32. The columns are read through narwhals, scikit-learn's own from its version
    1.8; without it (scikit-learn 1.6 or 1.7 alone) from the frame's ``schema`` or
    ``dtypes`` (:func:`_schema_floats`).
    """
    either = [np.float64, np.float32]
    if getattr(X, "dtype", None) is not None:
        return either
    dtypes = getattr(X, "dtypes", None)  # a pandas DataFrame's (polars': its own types)
    if dtypes is not None and all(isinstance(d, np.dtype) for d in dtypes):
        return either  # check_array reads NumPy dtypes
    try:
        import narwhals.stable.v2 as nw  # scikit-learn's own, from its version 1.8
    except ImportError:
        return np.float32 if _schema_floats(X) else either
    frame = nw.from_native(X, eager_only=True, pass_through=True)
    if frame is X or not len(frame.schema):
        return either
    # (narwhals 2.0.1, scikit-learn 1.8's floor, has no Float16: every such frame failed
    # there with an AttributeError)
    floats = (nw.Float32, getattr(nw, "Float16", nw.Float32))
    if all(d in floats for d in frame.schema.values()):
        return np.float32
    return either


# The names of float16 and float32 types in a polars DataFrame's schema (Float16, Float32),
# a pyarrow Table's (halffloat, float) and pandas' dtypes (Float32, float[pyarrow]),
# lower-cased, without the "[pyarrow]".
_HALF_OR_SINGLE = frozenset({"float16", "float32", "halffloat", "float"})


def _schema_floats(X) -> bool:
    """Whether X has a ``schema`` (a polars DataFrame's, name → dtype, or a pyarrow Table's,
    with ``types``), or pandas ``dtypes``, of columns that are all float16 or float32:
    where narwhals is missing (scikit-learn 1.6 and 1.7 come without it) such frames
    trained in float64."""
    schema = getattr(X, "schema", None)
    types = getattr(schema, "types", None)  # pyarrow's
    if types is None and callable(getattr(schema, "values", None)):  # polars'
        types = list(schema.values())
    if types is None and getattr(X, "dtypes", None) is not None:  # pandas'
        types = list(X.dtypes)
    names = [str(t).lower().removesuffix("[pyarrow]") for t in types or ()]
    return bool(names) and all(name in _HALF_OR_SINGLE for name in names)


def _finite_block(block, dtype, estimator_name):
    """One block of an HDF5 dataset as NumPy, refused as the NumPy path would refuse it."""
    block = np.asarray(block, dtype=dtype)
    assert_all_finite(block, estimator_name=estimator_name, input_name="X")
    return block
