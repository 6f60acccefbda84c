"""Class-wise scores: per-class accuracy, easy / medium / hard groups, worst class, spread.

Groups are defined once from a reference model (by default the ERM probe) and kept fixed
when every other model is scored, so that "hard" names the same classes in every row of a
comparison. The scorers at the end plug these scores into ``GridSearchCV(scoring=...)``.
"""

from __future__ import annotations

import copy
import datetime
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Number

import numpy as np
import scipy.sparse as sp
from sklearn.metrics import get_scorer, make_scorer
from sklearn.utils import column_or_1d

from ._data import (
    check_no_missing_labels,
    is_na,
    is_torch_tensor,
    labels_not_1d,
    numpy_if_tensor,
    plain,
    summable,
)

GROUP_NAMES = ("easy", "medium", "hard")


def per_class_accuracy(y_true, y_pred, labels=None, sample_weight=None) -> np.ndarray:
    """Accuracy (recall) of each class, in the order of ``labels`` (default: sorted y_true).

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
        True and predicted labels of any type (integers, strings, floats, ...); values
        with a fractional part predicted for integer labels are scores, not labels, and
        are refused, as scikit-learn refuses continuous predictions (unless ``labels``
        lists them as classes).
    labels : array-like of shape (n_classes,), default=None
        Classes to score, each once (NaN is no class); samples of other classes are
        ignored.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the samples: a class's accuracy is the weight of its correct samples
        over its total weight.

    Returns
    -------
    accuracy : ndarray of shape (n_classes,)
        Fraction of the samples (of the weight) of each class predicted correctly; NaN for
        a class absent from ``y_true`` or without weight.

    Notes
    -----
    This is scikit-learn's ``recall_score(y_true, y_pred, labels=labels, average=None,
    zero_division=np.nan)``, whose mean over the classes with samples is
    ``balanced_accuracy_score``. It differs on purpose from ``recall_score``'s defaults
    in two ways. Without ``labels`` the classes are those of ``y_true`` only, not those
    of ``y_true`` and ``y_pred``: a class that is predicted but never true has no
    accuracy, and is left out, as ``balanced_accuracy_score`` leaves it out. A class
    without samples (weight) is NaN, not 0 with an ``UndefinedMetricWarning``, so that
    the worst class and the means pass over it instead of counting it as a class never
    predicted right.

    Examples
    --------
    >>> from mr2_probe.metrics import per_class_accuracy
    >>> per_class_accuracy(["a", "a", "b", "b"], ["a", "b", "b", "b"])
    array([0.5, 1. ])
    >>> per_class_accuracy(["a", "a", "b", "b"], ["a", "c", "b", "b"], labels=["a", "b", "c"])
    array([0.5, 1. , nan])
    """
    return _per_class(*_labels_1d(y_true, y_pred), labels, sample_weight)


def _per_class(
    y_true: np.ndarray, y_pred: np.ndarray, labels, sample_weight, truth: _Checked | None = None
) -> np.ndarray:
    """:func:`per_class_accuracy` of labels read as arrays (:func:`_labels_1d`); ``truth``
    is ``y_true`` as a caller has already checked it (:func:`_checked`), which is then not
    checked again (classwise_report scores one y against each model)."""
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true and y_pred must have the same shape, got {y_true.shape} and {y_pred.shape}."
        )
    if truth is None or truth.labels is not y_true:
        truth = _checked(y_true, "y_true", read=True)
    predicted = _checked(y_pred, "y_pred", codes=False, read=True)
    kinds = _merged(truth.kinds | predicted.kinds)
    if len(kinds) > 1:
        raise ValueError(
            f"{_mix(kinds)}: y_true holds {y_true.dtype} labels and y_pred {y_pred.dtype} labels."
        )
    codes = truth.codes
    given = labels is not None  # (np.unique's own classes are each there once)
    # (NumPy's dates held as objects against y's datetime's: "'<' not supported")
    labels = (
        _as_dates(_numpy_held(_label_array(labels, "labels", classes=True)), y_true)
        if given
        else truth.classes()
    )
    if labels.ndim != 1 or (len(labels) == 0 and len(y_true)):
        raise ValueError(f"labels must be a 1-D list of at least one class, got {labels!r}.")
    if given:  # (before the kinds: a NaN among text labels was "string and number")
        _check_no_nan("labels", labels)  # (a class of no sample, scored NaN without a word)
    _check_kinds(labels, y_true, y_kinds=truth.kinds)  # every class would be scored NaN
    if given:
        _check_distinct(labels)
        # (dates held as objects against labels of NumPy's at another unit than days: its
        # integers of nanoseconds failed to sort among them)
        y_true, y_pred = _as_dates(y_true, labels), _as_dates(y_pred, labels)
    _check_not_scores(y_true, y_pred, labels if given else None)
    weight = _sample_weight(sample_weight, len(y_true))
    if not len(y_true):  # NumPy < 1.25 warns comparing empty arrays of other dtypes
        return np.full(len(labels), np.nan)
    if codes is None:
        index, known = _class_index(labels, y_true)
    else:  # each distinct label looked up once
        index, known = (found[codes[0]] for found in _class_index(labels, codes[1]))
    hits = (y_true == y_pred) * weight
    correct = np.bincount(index[known], weights=hits[known], minlength=len(labels))
    total = np.bincount(index[known], weights=weight[known], minlength=len(labels))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, correct / total, np.nan)


def _class_index(labels: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The position in ``labels`` of each label of ``y``, and whether it is there (where
    not, the position is any)."""
    sorter = np.argsort(labels)
    position = np.searchsorted(labels, y, sorter=sorter)
    index = sorter[np.clip(position, 0, len(labels) - 1)]
    return index, labels[index] == y


def _text_codes(
    y: np.ndarray, kinds: set, values: list | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(codes, uniques)`` of labels ``y`` of ``kinds`` (:func:`_kinds_of`'s) that are
    text held as objects (a pandas column of dtype object), ``y == uniques[codes]``, from
    pandas' hash table where pandas is imported: NumPy sorts Python's strings one
    comparison at a time, and np.unique and searchsorted of ImageNet's 1.28 million labels
    took seconds, five to ten times as long as of the same labels as NumPy's text. None
    for other labels, which NumPy's sort reads fast or pandas might read otherwise, and
    for text that pandas' table may not tell apart (:func:`_hashed_alike`). ``values``
    is ``y.tolist()`` where the caller has it."""
    pandas = sys.modules.get("pandas")
    if pandas is None or y.dtype != object or y.ndim != 1 or kinds != {str}:
        return None
    if not _hashed_alike("".join(y.tolist() if values is None else values)):
        return None
    return pandas.factorize(y)


def _hashed_alike(text: str) -> bool:
    """Whether pandas' table of text tells labels apart as Python does, given their text
    joined: pandas 2.0 (and which others) hashes a label's UTF-8 up to its first NUL, and
    labels that UTF-8 cannot hold (lone surrogates) as one, so 'x\x00y' and 'x\x00z', or
    '\ud800' and '\udc00', were one class. (A pass over the text: a few hundredths of a
    second for ImageNet's 1.28 million labels.)"""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


#: Name of each kind of label, in the order a message lists them (an aware datetime's kind
#: is tzinfo).
_KIND_NAMES = {
    bytes: "bytes",
    str: "string",
    float: "number",
    datetime.date: "date",
    datetime.datetime: "datetime",
    datetime.tzinfo: "datetime with a time zone",
    np.datetime64: "datetime64",
    datetime.timedelta: "duration",
    datetime.time: "time",
    type(None): "None",
}
#: The kinds of dates held as objects, which never compare equal to one another (a date to
#: the datetime of its midnight, a naive datetime to an aware one).
_DATE_KINDS = {datetime.date, datetime.datetime, datetime.tzinfo}


# scikit-learn's check (float labels stay allowed): strings against numbers would
# otherwise score every class 0.
def _kinds_of(a: np.ndarray, values: list | None = None) -> set:
    """The kinds of label ``a`` holds: by dtype, or by value where it holds objects
    (``values``, its tolist(), where the caller has it); none when empty."""
    if a.size == 0:
        return set()
    if a.dtype != object:
        kinds = {"U": str, "S": bytes, "M": np.datetime64, "m": datetime.timedelta}
        return {kinds.get(a.dtype.kind, float)}
    # None (a missing label) is a kind of its own: counted as a number, the message
    # sent a user looking for numbers that were not there.
    # pandas' missing value, pd.NA, counts as None does.
    values = a.tolist() if values is None else values
    distinct = set(values)
    if set(map(type, values)) != set(map(type, distinct)):
        # Values equal across types, of which the set kept one (NumPy < 1.25's
        # timedelta64(1, 'D') == 1): each value once by its type and value.
        distinct = [v for _, v in set(zip(map(type, values), values, strict=True))]
    return {_kind(v) for v in distinct}


def _kind(label) -> type:
    """The kind of one label held as an object (see :data:`_KIND_NAMES`)."""
    if isinstance(label, str | bytes):  # (NumPy's np.str_ and np.bytes_ too: "( and str)")
        return str if isinstance(label, str) else bytes
    if label is None or is_na(label):
        return type(None)
    if isinstance(label, datetime.datetime):  # pandas' Timestamp too
        return datetime.tzinfo if label.tzinfo is not None else datetime.datetime
    if isinstance(label, np.datetime64):
        return np.datetime64
    if isinstance(label, datetime.date):
        return datetime.date
    # (pandas' Timedelta is a datetime.timedelta)
    if isinstance(label, datetime.timedelta | np.timedelta64):
        return datetime.timedelta
    # Other objects (a time of day, pandas' Interval or Period) are kinds of their own: as
    # numbers, against integer codes every class scored 0%.
    return float if isinstance(label, Number | np.bool_) else type(label)


def _label_kinds(*arrays: np.ndarray) -> set:
    """The kinds of label ``arrays`` hold together. Dates and durations are kinds of their
    own, not numbers: against numbers every class scored 0% (NaN as ``labels``), and a
    date among numbers in y failed in np.unique ("'<' not supported"). Dates held as
    objects count as NumPy's datetime64 (they are scored as such), but where dates of two
    kinds are mixed: a date never equals a datetime, and datetime labels scored 0% against
    date predictions (mixed in y, np.unique failed: "can't compare datetime.datetime to
    datetime.date"), where scikit-learn refuses them."""
    return _merged(set().union(*map(_kinds_of, arrays)))


def _merged(kinds: set) -> set:
    """The kinds of label ``kinds`` (of :func:`_kinds_of`) as :func:`_label_kinds` counts
    them together."""
    if np.datetime64 in kinds and datetime.tzinfo in kinds:
        # NumPy's datetime64 are naive datetimes (a column with a time zone's .values, in
        # UTC): against aware ones every class scored 0%.
        kinds = kinds - {np.datetime64} | {datetime.datetime}
    return kinds - {np.datetime64} if kinds & _DATE_KINDS else kinds


def _mix(kinds: set) -> str:
    """The start of the message on a mix, "Mix of label input types (bytes and string)": the
    kinds found, not always strings against numbers."""
    return f"Mix of label input types ({_kind_names(kinds)})"


def _kind_names(kinds: set) -> str:
    """The kinds of label ``kinds`` in scikit-learn's words, "bytes, string and number"."""
    names = [name for kind, name in _KIND_NAMES.items() if kind in kinds]
    names += sorted(kind.__name__ for kind in kinds - set(_KIND_NAMES))  # (pandas' Interval)
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]


def _classes(y, name: str = "y_true") -> np.ndarray:
    """The sorted classes of the labels ``y``, once they are checked to hold no NaN and one
    kind of label: np.unique of a mix failed with "'<' not supported between instances of
    'int' and 'str'". NumPy's dates held as objects as NumPy's, as they are scored."""
    return _checked(y, name).classes()


@dataclass(frozen=True)
class _Checked:
    """Labels read as a 1-D array (:func:`_labels`) and checked to hold no NaN and one kind
    of label, with their kinds (:func:`_kinds_of`) and, for text held as objects, their
    codes (:func:`_text_codes`)."""

    labels: np.ndarray
    kinds: set
    codes: tuple | None

    def classes(self) -> np.ndarray:
        """The sorted classes of the labels; text held as objects as Python's text: NumPy's
        np.str_ and Python's str of one text are one class, which pandas' table keyed by
        the first it met and NumPy's sort (not stable) by either."""
        classes = np.unique(self.labels if self.codes is None else self.codes[1])
        if classes.dtype == object and self.kinds <= {str, bytes}:  # (one per class)
            classes = np.array([plain(v) for v in classes.tolist()], dtype=object)
        return classes


def _checked(y, name: str, codes: bool = True, read: bool = False) -> _Checked:
    """The labels ``y`` read (:func:`_labels`; ``read``: an array read so already) and
    checked, an error calling them ``name``; with their codes where ``codes``."""
    if not read:
        y = _labels(y, name)
    _check_no_nan(name, y)
    values = y.tolist() if y.dtype == object and y.size else None  # (once, for both)
    held = _kinds_of(y, values)
    if len(_merged(held)) > 1:  # (not "y_true holds object labels and y_pred ...")
        raise ValueError(f"{_mix(_merged(held))} in {name}.")
    return _Checked(y, held, _text_codes(y, held, values) if codes else None)


def _scored_against(truth: _Checked, y_pred, labels) -> tuple[np.ndarray, np.ndarray]:
    """The per-class accuracy of predictions ``y_pred`` against labels checked already
    (``truth``), over the classes ``labels``, and whether each sample is predicted right."""
    y_pred = _labels(y_pred, "y_pred")
    # (dates held as objects against NumPy's, as _labels_1d reads them)
    y_true, y_pred = _as_dates(truth.labels, y_pred), _as_dates(y_pred, truth.labels)
    return _per_class(y_true, y_pred, labels, None, truth), y_true == y_pred


def _check_kinds(
    labels: np.ndarray,
    y: np.ndarray,
    name: str = "labels",
    y_name: str = "y_true",
    y_kinds: set | None = None,
) -> None:
    """Refuse ``labels`` of another kind than ``y``'s (see :func:`_label_kinds`; ``y_kinds``
    are y's :func:`_kinds_of` where the caller has them); dates as text, as a report's
    JSON writes them, with how to read them as dates."""
    kinds = _label_kinds(y, labels) if y_kinds is None else _merged(y_kinds | _kinds_of(labels))
    if len(kinds) > 1:
        cure = ""
        naive = {np.datetime64, datetime.date, datetime.datetime}  # (dates of NumPy's units)
        text = _label_kinds(labels) == {str} and len(kinds) == 2
        if text and kinds & naive:  # (y's dates)
            dtype = y.dtype if y.dtype.kind == "M" else "datetime64"  # (objects: their units)
            as_dates = (
                "{np.datetime64(label): group for label, group in groups.items()}"
                if name == "groups"
                else f"np.asarray({name}, dtype='{dtype}')"
            )
            cure = f"; dates written as text (a report's labels) are read as dates by {as_dates}"
        elif text and datetime.timedelta in kinds and _timedelta_text_reads(y):
            # NumPy reads no duration from text; pandas reads those a report writes, NumPy's
            # ("86400000000000 nanoseconds", "1 days") and datetime's ("1 day, 0:00:00").
            as_durations = (
                "{pd.Timedelta(label): group for label, group in groups.items()}"
                if name == "groups"
                else f"np.asarray(pd.to_timedelta({name}))"
            )
            cure = (
                "; durations written as text (a report's labels) are read as durations by "
                f"pandas: {as_durations}"
            )
        raise ValueError(
            f"{_mix(kinds)}: {name} holds {labels.dtype} labels and {y_name} {y.dtype} "
            f"labels{cure}."
        )


def _timedelta_text_reads(y: np.ndarray) -> bool:
    """Whether pandas reads back the text a report writes for the durations ``y``: not
    those of NumPy's weeks, months or years ("1 weeks"), which it has no unit for."""
    return y.dtype.kind != "m" or np.datetime_data(y.dtype)[0] not in ("W", "M", "Y")


def _check_distinct(labels: np.ndarray) -> None:
    """Refuse a class named twice in ``labels``: the searchsorted lookup scores only one
    of its copies and leaves the other NaN, and class_groups ranks the two apart."""
    values, counts = np.unique(labels, return_counts=True)
    twice = counts > 1
    if twice.any():
        repeated = ", ".join(
            f"{value!r} is there {'twice' if n == 2 else f'{n} times'}"
            for value, n in zip(_listed(values[twice]), counts[twice].tolist(), strict=True)
        )
        raise ValueError(f"labels must hold each class once, got {_listed(labels)} ({repeated}).")


def _listed(a: np.ndarray) -> list:
    """The labels ``a`` as a list to show in a message: dates and durations as their text
    (their tolist() at nanoseconds gives integers, 1704067200000000000)."""
    return [str(v) for v in a] if a.dtype.kind in "mM" else a.tolist()


def _check_not_scores(y_true: np.ndarray, y_pred: np.ndarray, labels=None) -> None:
    """Refuse predictions with a fractional part against integer labels: scores
    (predict_proba's column of the positive class, decision_function's), which no class
    equals, so that every class scored 0% without a word where scikit-learn refuses them
    as continuous. Labels that are floats themselves (0.25) are taken as they are, and so
    are predictions among the classes ``labels`` given (a class of no sample in y_true)."""
    y_true, y_pred = _held_numbers(y_true), _held_numbers(y_pred)
    if y_pred.dtype.kind != "f" or y_true.dtype.kind not in "biuf":
        return
    with np.errstate(invalid="ignore"):  # (infinities)
        integral = y_true.dtype.kind != "f" or bool(np.all(y_true == np.round(y_true)))
        fractional = y_pred != np.round(y_pred)
    if labels is not None:
        fractional &= ~np.isin(y_pred, labels)
    if integral and fractional.any():
        values = np.unique(y_pred[fractional])
        shown = ", ".join(f"{v:g}" for v in values[:3]) + (", ..." if len(values) > 3 else "")
        raise ValueError(
            f"y_pred holds values with a fractional part ({shown}) against the integer "
            "labels of y_true: scores (predict_proba's or decision_function's), which no "
            "class equals, rather than labels. Pass the predicted labels, estimator.predict(X) "
            "or estimator.classes_[scores.argmax(axis=1)]; scikit-learn refuses such "
            "continuous predictions too."
        )


def _held_numbers(a: np.ndarray) -> np.ndarray:
    """Numbers held as objects (a pandas column of dtype object) as floats, so that scores
    among them are found as among NumPy's; any other array as it is."""
    if a.dtype != object or not all(isinstance(v, Number) for v in a.tolist()):
        return a
    try:
        return a.astype(float)
    except (TypeError, ValueError, OverflowError):  # (complex numbers, say)
        return a


def _check_no_nan(name: str, a: np.ndarray) -> None:
    """Refuse NaN labels: a NaN is no class (it would be scored as one, NaN, as NaN != NaN,
    and its samples lost). Among objects (a NaN, a NaT, None, pd.NA) they were refused as
    missing labels as given (:func:`_label_array`): scored as a class that sorted nowhere,
    a NaN left the next class NaN."""
    if a.dtype.kind in "fc":
        nan = np.isnan(a).any()
    elif a.dtype.kind in "mM":  # NaT, the dates' NaN
        nan = np.isnat(a).any()
    else:
        return
    if nan:
        raise ValueError(f"Input {name} contains {'NaT' if a.dtype.kind in 'mM' else 'NaN'}.")


def _labels_1d(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    """The labels as arrays; a column vector counts as the labels it holds, as in
    scikit-learn's metrics. Dates (durations) held as objects against NumPy's are NumPy's."""
    y_true, y_pred = _labels(y_true, "y_true"), _labels(y_pred, "y_pred")
    return _as_dates(y_true, y_pred), _as_dates(y_pred, y_true)


def _labels(y, name: str) -> np.ndarray:
    """The labels ``y`` as a 1-D array (a column vector as the labels it holds; NumPy's
    dates held as objects as NumPy's); a single label, an array of 3 dimensions or more
    (which failed with "len() of unsized object", an IndexError), or one of several
    columns, refused as scikit-learn words it, naming ``y``'s argument."""
    y = _label_array(y, name)
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y)
    elif y.ndim != 1:
        # (a table of scores, predict_proba's, was "y should be a 1d array" in
        # scikit-learn's words, which named neither argument: a report's "cannot be
        # scored against y: y should be ..." sent its user to the true labels)
        raise labels_not_1d(
            name,
            y.shape,
            "one column per class (predict_proba's scores, or one-hot labels) holds no "
            "labels: pass them, e.g. estimator.classes_[scores.argmax(axis=1)]",
        )
    return _numpy_held(y)


def _array(a, dtype=None, name: str | None = None) -> np.ndarray:
    """``a`` (labels, weights, accuracies, group indices) as a NumPy array; a tensor read
    as the estimators read it (:func:`~mr2_probe._data.numpy_if_tensor`): NumPy failed on
    one on a GPU, requiring grad or of bfloat16 ("Got unsupported ScalarType BFloat16").
    ``name`` is what an error calls it (a complex32 or packed tensor: "y_true is a tensor
    of dtype torch.complex32"). A SciPy sparse matrix is refused in scikit-learn's words:
    NumPy made it an array of one object ("got an array of shape ()", "setting an array
    element with a sequence")."""
    if sp.issparse(a):
        raise TypeError(
            f"Sparse data was passed for {name or 'an argument'}, but dense data is required. "
            "Use '.toarray()' to convert to a dense numpy array."
        )
    return np.asarray(numpy_if_tensor(a, name), dtype=dtype)


def _label_array(a, name: str, classes: bool = False) -> np.ndarray:
    """The labels ``a`` (a list of ``classes``: labels=, a groups mapping's keys) as a NumPy
    array (:func:`_array`), refused first where they hold a missing label (None, pd.NA, NaN
    or NaT among objects), named as ``name`` with its position: NumPy reads a list of
    text and NaN as the text 'nan', a class of its own, without a word."""
    if sp.issparse(a) or is_torch_tensor(a):  # (a tensor holds numbers: _check_no_nan)
        return _array(a, name=name)
    cure = f"name only classes in {name}" if classes else None
    read = check_no_missing_labels(a, name, "score", cure, classes)  # (read once, not again)
    return _array(a, name=name) if read is None else read


def _numpy_held(a: np.ndarray) -> np.ndarray:
    """NumPy's dates (durations) held as objects, ``list(a_datetime64_array)``, as NumPy's
    array: against dates held as objects (datetime's) each compared through its item(), an
    integer at nanoseconds, and every class scored 0%. Among datetime's dates (durations)
    without a time zone in one array too, all as NumPy's at the finest unit among them, as
    they are scored against NumPy's array (a pandas column's .values beside its .dt.date):
    sorting them failed, "'>' not supported between instances of 'int' and
    'datetime.date'". Dates among datetimes, which never equal one another, are left to be
    refused as a mix of the two. Other arrays as they are."""
    if a.dtype != object or not a.size:
        return a
    values = a.ravel().tolist()
    types = set(map(type, values))
    for numpy, python, kind in (
        (np.datetime64, datetime.date, "M"),
        (np.timedelta64, datetime.timedelta, "m"),
    ):
        if numpy not in types:
            continue
        held = types - {numpy}
        dates = {issubclass(t, datetime.datetime) for t in held}
        if (
            not all(issubclass(t, python) for t in held)
            or dates == {True, False}  # (dates and datetimes: a mix)
            or (True in dates and any(getattr(v, "tzinfo", None) is not None for v in values))
        ):
            return a
        if any(hasattr(t, "to_datetime64") or hasattr(t, "to_timedelta64") for t in held):
            values = _numpy_times(values)  # (pandas' among them)
        return _in_finest_unit(values, kind).reshape(a.shape)
    return a


def _in_finest_unit(values: list, kind: str) -> np.ndarray:
    """Dates (``kind`` "M") or durations ("m"), NumPy's and datetime's, as one NumPy array
    at the finest unit among them; a ValueError where one is outside that unit's range,
    which NumPy wraps without a word (the year 3000 beside nanoseconds became 1830)."""
    converted = np.asarray(values, dtype=f"{kind}8")
    # A label that wrapped is off by 2**64 of the finest unit, hundreds of years or more:
    # each label and its converted copy compared at the coarsest unit, which none of them
    # overflows (a loop over a million labels, each at its own unit, took seconds).
    coarsest = "Y" if kind == "M" else "W"  # (durations of months or years: no weeks)
    if np.datetime_data(converted.dtype)[0] not in ("Y", "M"):
        coarse = np.asarray(values, dtype=f"{kind}8[{coarsest}]")
        wrapped = np.flatnonzero(converted.astype(coarse.dtype).view("i8") != coarse.view("i8"))
        if len(wrapped):
            what = "dates" if kind == "M" else "durations"
            raise ValueError(
                f"Labels of {what} at several units, {values[wrapped[0]]} among them, do not "
                f"all fit in {converted.dtype}, the finest of their units, which they are "
                f"compared at: pass them as one array of a unit that holds them all, e.g. "
                f"np.asarray(y, dtype='{converted.dtype.name[:-4]}[us]')."
            )
    return converted


def _as_dates(a: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``a`` as NumPy's datetime64, each at its own unit, where it holds dates as objects
    (datetime's, pandas' Timestamps, without a time zone) and ``other`` datetime64: NumPy
    compares such objects with a datetime64 array through its item(), an integer at
    nanoseconds (a pandas column's unit) and a date at days, so that Timestamps against a
    column's dates scored every class 0%. Durations as objects (datetime's timedelta,
    pandas' Timedelta) against timedelta64 likewise as NumPy's. Other arrays as they are."""
    if other.dtype.kind not in "mM" or a.dtype != object or not a.size:
        return a
    if other.dtype.kind == "M":
        times = datetime.date | np.datetime64
    else:
        times = datetime.timedelta | np.timedelta64
    if not all(isinstance(v, times) and getattr(v, "tzinfo", None) is None for v in a.flat):
        return a
    return np.asarray(_numpy_times(a.tolist()), dtype=f"{other.dtype.kind}8")


def _numpy_times(values: list) -> list:
    """pandas' Timestamps (without a time zone) and Timedeltas among ``values`` as NumPy's
    datetime64 and timedelta64 at their own unit: taken as datetime's, their nanoseconds
    were cut off (two classes 1 ns apart scored as one). Other values as they are."""
    return [
        v.to_datetime64() if hasattr(v, "to_datetime64") and v.tzinfo is None
        else v.to_timedelta64() if hasattr(v, "to_timedelta64")
        else v
        for v in values
    ]  # fmt: skip


def difficulty_groups(reference_accuracy, n_groups: int = 3) -> np.ndarray:
    """Group index of each class (0 = easy … n_groups-1 = hard) from a reference model.

    Classes are ranked by the reference's per-class accuracy (highest first, ties broken by
    class order) and split into ``n_groups`` near-equal parts; keep the result fixed when
    scoring other models.

    Parameters
    ----------
    reference_accuracy : array-like of shape (n_classes,)
        Per-class accuracy of the reference model, e.g. from :func:`per_class_accuracy`.
    n_groups : int, default=3
        Number of groups (3: terciles).

    Returns
    -------
    groups : ndarray of int of shape (n_classes,)

    Examples
    --------
    >>> from mr2_probe.metrics import difficulty_groups
    >>> difficulty_groups([0.9, 0.5, 1.0, 0.7, 0.8, 0.6])
    array([0, 2, 0, 1, 1, 2])
    >>> difficulty_groups([0.9, 0.5])
    array([0, 2])
    >>> difficulty_groups([0.5])
    array([2])
    """
    if isinstance(n_groups, bool) or not isinstance(n_groups, Integral) or n_groups < 1:
        raise ValueError(f"n_groups must be an integer >= 1, got {n_groups!r}.")
    acc = _array(reference_accuracy, dtype=float, name="reference_accuracy")
    if acc.ndim != 1:
        raise ValueError(
            "reference_accuracy must hold one accuracy per class, shape (n_classes,); got "
            f"shape {acc.shape}."
        )
    order = np.argsort(-acc, kind="stable")
    groups = np.empty(len(acc), dtype=int)
    rank = np.arange(len(acc))
    if len(acc) >= n_groups:
        groups[order] = rank * n_groups // len(acc)
    else:
        # Fewer classes than groups: spread them from easy to hard, so that the worst class
        # is always "hard" (two classes: easy and hard, no medium).
        # A single class is the worst one: hard.
        spread = rank * (n_groups - 1) / (len(acc) - 1) if len(acc) > 1 else n_groups - 1
        groups[order] = np.round(spread).astype(int)
    return groups


def class_groups(y_true, y_pred, labels=None) -> dict:
    """Map each class to its difficulty group ("easy", "medium" or "hard") under a reference.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
    y_pred : array-like of shape (n_samples,)
        Predictions of the reference model (by convention the ERM probe).
    labels : array-like, default=None
        Classes to group, each once (default: sorted ``y_true``). A class absent from
        ``y_true`` has no accuracy and ranks last.

    Returns
    -------
    groups_by_label : dict
        Class label → group name; pass it to :func:`classwise_summary`,
        :func:`group_accuracy` or :func:`make_group_scorer` to score other models.

    Examples
    --------
    >>> from mr2_probe.metrics import class_groups
    >>> class_groups([0, 0, 1, 1, 2, 2], [0, 0, 1, 0, 0, 0])
    {0: 'easy', 1: 'medium', 2: 'hard'}
    """
    if labels is None:  # (y_true checked once, for its classes and its scores)
        truth = _checked(y_true, "y_true")
        labels = truth.classes()
        accuracy = _scored_against(truth, y_pred, labels)[0]
    else:
        labels = _numpy_held(_label_array(labels, "labels", classes=True))
        accuracy = per_class_accuracy(y_true, y_pred, labels)
    names = _group_names(accuracy)
    # tolist() turns NumPy scalars into plain Python labels (JSON- and pickle-friendly);
    # not dates and durations, which it makes integers at some units (datetime64[ns]).
    keys = list(labels) if labels.dtype.kind in "mM" else labels.tolist()
    return dict(zip(keys, names.tolist(), strict=True))


def _group_names(accuracy: np.ndarray) -> np.ndarray:
    """The group name of each class of a reference's per-class ``accuracy``."""
    # NaN (no samples) is taken as the worst accuracy: ranked hardest by its value, not by
    # where argsort happens to place NaN (last, under argsort(-acc)).
    acc = np.nan_to_num(accuracy, nan=-1.0)
    return np.asarray(GROUP_NAMES)[difficulty_groups(acc, len(GROUP_NAMES))]


def _sample_weight(sample_weight, n_samples: int) -> np.ndarray:
    """Sample weights as a float array (ones by default), checked for shape and sign."""
    if sample_weight is None:
        return np.ones(n_samples)
    weight = _array(sample_weight, name="sample_weight")
    if weight.dtype.kind == "c":  # (a cast dropped the imaginary part, with NumPy's warning)
        raise ValueError(
            f"Complex data not supported: sample_weight has dtype {weight.dtype}. Pass real "
            "weights, for example its real part (.real)."
        )
    weight = weight.astype(float, copy=False)
    if weight.shape != (n_samples,):
        raise ValueError(
            f"sample_weight must have shape ({n_samples},) like y_true, got {weight.shape}."
        )
    if not (np.isfinite(weight).all() and (weight >= 0).all()):
        raise ValueError("sample_weight must be finite and non-negative.")
    if n_samples and not weight.max() > 0:
        raise ValueError("sample_weight sums to zero: there is no sample to score.")
    # Weights near the largest float overflowed in a class's sum (scored 0% or NaN, the
    # overall NaN). (Scaled further, tiny weights beside them were lost to underflow: a
    # class of them scored NaN.)
    return summable(weight)


def _present(accuracy: np.ndarray) -> np.ndarray:
    """The accuracies of the classes that have samples (weight) to score; at least one."""
    present = accuracy[np.isfinite(accuracy)]
    if not len(present):
        raise ValueError("No class of y_true has samples (with weight) to score.")
    return present


def worst_class_accuracy(y_true, y_pred, sample_weight=None) -> float:
    """Lowest per-class accuracy over the classes of ``y_true`` (those with weight).

    Examples
    --------
    >>> from mr2_probe.metrics import worst_class_accuracy
    >>> worst_class_accuracy([0, 0, 1, 1], [0, 0, 1, 0])
    0.5
    """
    return float(np.min(_present(per_class_accuracy(y_true, y_pred, None, sample_weight))))


def class_accuracy_std(y_true, y_pred, sample_weight=None) -> float:
    """Spread (population standard deviation) of the per-class accuracies; lower is fairer.

    Examples
    --------
    >>> from mr2_probe.metrics import class_accuracy_std
    >>> class_accuracy_std([0, 0, 1, 1], [0, 0, 1, 0])
    0.25
    """
    return float(np.std(_present(per_class_accuracy(y_true, y_pred, None, sample_weight))))


def group_accuracy(
    y_true, y_pred, groups_by_label: Mapping, group: str = "hard", sample_weight=None
) -> float:
    """Mean per-class accuracy over the classes of one fixed group.

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
    groups_by_label : mapping
        Class label → group name, from :func:`class_groups` on a reference model. Every
        class of ``y_true`` must have a group (a ValueError names those that do not).
    group : str, default="hard"
        The group to score.
    sample_weight : array-like of shape (n_samples,), default=None

    Returns
    -------
    accuracy : float
        NaN when no class of the group has samples in ``y_true``.

    Examples
    --------
    >>> from mr2_probe.metrics import group_accuracy
    >>> groups = {0: "easy", 1: "medium", 2: "hard"}
    >>> group_accuracy([0, 1, 2, 2], [0, 1, 2, 0], groups)
    0.5
    """
    labels, names = _split_groups(groups_by_label)
    _check_group(names, group)
    _check_known(y_true, labels)
    acc = per_class_accuracy(y_true, y_pred, labels, sample_weight)[names == group]
    # A fold may hold no sample of a small group: report NaN rather than warn.
    return float(np.nanmean(acc)) if np.isfinite(acc).any() else float("nan")


def _check_group(names: np.ndarray, group: str) -> None:
    """Refuse a ``group`` that none of the classes' group ``names`` is."""
    known = sorted(set(np.asarray(names).tolist()))  # (as str, not NumPy's np.str_('hard'))
    if group not in known:
        raise ValueError(f"group must be one of {known}, got {plain(group)!r}.")


def hard_tercile_accuracy(y_true, y_pred, sample_weight=None) -> float:
    """Mean accuracy of the model's own hardest third of classes on this data.

    Classes are ranked by this model's per-class accuracy on ``y_true`` itself, so it needs
    no reference and, as a scorer, uses nothing but the fold it scores: no class ranking
    computed elsewhere leaks into model selection. It lies between the worst-class accuracy
    and balanced accuracy; unlike a fixed hard group, the classes may differ between models.

    Examples
    --------
    >>> from mr2_probe.metrics import hard_tercile_accuracy
    >>> hard_tercile_accuracy([0, 1, 2, 2], [0, 1, 2, 0])
    0.5
    """
    acc = _present(per_class_accuracy(y_true, y_pred, None, sample_weight))
    return float(np.mean(acc[difficulty_groups(acc) == len(GROUP_NAMES) - 1]))


def classwise_summary(y_true, y_pred, groups=None, labels=None, sample_weight=None) -> dict:
    """Overall, per-group (easy / medium / hard), worst-class and std of per-class accuracy.

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n_samples,)
    groups : mapping or array-like, default=None
        Either class label → group name (from :func:`class_groups`; a pandas Series is
        read so, by its index, unless that is the integers 0, 1, ... in order: a table's
        positions, which both readings agree on when ``y_true`` holds the classes 0, 1, ...;
        where it holds fewer classes, all in that index, and no ``labels`` are given, the
        readings differ and the Series is refused), or one group per class
        aligned with ``labels``: an index 0 (easy), 1 (medium) or 2 (hard), as
        :func:`difficulty_groups` gives with its three groups, or the group's name (as
        :attr:`~mr2_probe.report.ClasswiseReport.groups` holds). ``None`` uses the groups
        of this very model.
    labels : array-like, default=None
        Class order of an index array ``groups``, each class once, every class of
        ``y_true`` among them (default: sorted ``y_true``); beside groups by label,
        their classes (in any order) or None.
    sample_weight : array-like of shape (n_samples,), default=None
        Weights of the samples, in the overall and in every class's accuracy.

    Returns
    -------
    summary : dict
        Keys ``overall``, the group names, ``worst`` and ``std``; values are fractions.

    Examples
    --------
    >>> from mr2_probe.metrics import classwise_summary
    >>> groups = {0: "easy", 1: "medium", 2: "hard"}
    >>> summary = classwise_summary([0, 1, 2, 2], [0, 1, 2, 0], groups)
    >>> {key: round(value, 3) for key, value in summary.items()}
    {'overall': 0.75, 'easy': 1.0, 'medium': 1.0, 'hard': 0.5, 'worst': 0.5, 'std': 0.236}
    """
    # A class of y_true outside the groups would count in "overall" alone.
    if _is_series(groups):  # by label, as a dict; a table's column (positions) by position
        # (of integers: booleans False, True and floats 0.0, 1.0, ... are labels, class_groups'
        # keys, which were refused as two readings where y_true held some of them)
        index = np.asarray(groups.index)
        if index.dtype == object:  # (integers held as objects: integers)
            index = np.asarray(index.tolist())
        positions = index.dtype.kind in "iu" and np.array_equal(index, np.arange(len(groups)))
        if positions and labels is None:
            classes = _classes(_labels_1d(y_true, y_pred)[0])
            # Read by position, the groups outnumber the classes; by label, they are groups
            # of classes 0, 1, ... that y_true lacks some of, or of classes labelled
            # otherwise that lack the last ones: which, only its maker knows.
            if len(classes) != len(groups) and np.isin(classes, groups.index).all():
                raise ValueError(
                    f"groups is a pandas Series indexed 0..{len(groups) - 1}, which reads as "
                    "one group per class in order or as class label → group, and y_true "
                    f"holds {len(classes)} classes, not {len(groups)}, all among its index: "
                    "the two readings differ. Pass a dict (class label → group) or labels."
                )
        groups = groups.to_numpy() if positions else _by_label(groups)
    by_label = isinstance(groups, Mapping)
    if by_label:
        given = labels
        labels, groups = _split_groups(groups, "groups")
        if given is not None:  # (left unread, whatever they held)
            _check_same_classes(_label_array(given, "labels", classes=True), labels)
        _check_known(y_true, labels)
    acc = per_class_accuracy(y_true, y_pred, labels, sample_weight)
    if not by_label and labels is not None:  # (kinds checked)
        _check_known(y_true, _label_array(labels, "labels", classes=True), "labels")
    _present(acc)  # a clear error where no class has samples (weight) to score
    if groups is None:
        # This model's own terciles, over the classes it has samples (weight) of.
        present = np.isfinite(acc)
        groups = np.full(len(acc), -1)
        groups[present] = difficulty_groups(acc[present])
    else:
        groups = _group_indices(groups)
    if groups.shape != acc.shape:
        raise ValueError(
            f"groups must give one group index per class ({len(acc)}, in the order of "
            f"labels), got shape {groups.shape}."
        )
    y_true, y_pred = _labels_1d(y_true, y_pred)
    return _summary(acc, groups, y_true == y_pred, _sample_weight(sample_weight, len(y_true)))


def _summary(acc: np.ndarray, groups: np.ndarray, correct: np.ndarray, weight: np.ndarray) -> dict:
    """:func:`classwise_summary` of the per-class accuracies ``acc``, their group indices
    ``groups``, and whether each sample of ``weight`` was predicted right."""
    summary = {"overall": float(np.average(correct, weights=weight))}
    # Every group gets a key, NaN when it has no class (fewer than three classes).
    for g, name in enumerate(GROUP_NAMES):
        in_group = acc[groups == g]
        summary[name] = float(np.nanmean(in_group)) if np.isfinite(in_group).any() else np.nan
    summary["worst"] = float(np.nanmin(acc))
    summary["std"] = float(np.nanstd(acc))
    return summary


def _check_same_classes(given: np.ndarray, keys: np.ndarray) -> None:
    """Refuse ``labels`` given beside groups by label that are not the groups' classes
    (in any order): a class missing from them, or one of no group, went without a word."""
    given, keys = _numpy_held(given), _numpy_held(keys)
    given, keys = _as_dates(given, keys), _as_dates(keys, given)
    same = (
        given.ndim == 1
        and not _text_and_numbers(given, keys)
        and not len(_label_kinds(given, keys)) > 1
        and len(np.unique(given)) == len(given) == len(keys)
        and not len(np.setdiff1d(keys, given))
    )
    if not same:
        raise ValueError(
            "labels must be the classes of groups given by label (class label → group), in "
            f"any order, or be left out; groups name {_listed(keys)}, labels are "
            f"{_listed(given) if given.ndim else given.tolist()}."
        )


def _group_indices(groups) -> np.ndarray:
    """Group indices 0 (easy), 1 (medium), 2 (hard) from indices or group names."""
    groups = _array(groups, name="groups")
    if groups.dtype == object and not any(isinstance(g, str) for g in groups.ravel().tolist()):
        groups = np.asarray(groups.tolist())  # indices held as objects (a pandas column)
    if groups.dtype.kind in "USO":  # names
        index = {name: g for g, name in enumerate(GROUP_NAMES)}
        unknown = sorted({str(name) for name in groups.ravel().tolist()} - set(index))
        if unknown:
            raise ValueError(f"groups must be named {list(GROUP_NAMES)}, got {unknown}.")
        return np.array([index[str(name)] for name in groups.ravel().tolist()]).reshape(
            groups.shape
        )
    valid = np.arange(len(GROUP_NAMES))
    if groups.dtype.kind == "b" or not np.isin(groups, valid).all():
        got = (
            "booleans"
            if groups.dtype.kind == "b"
            else sorted(set(np.unique(groups).tolist()) - set(valid.tolist()))
        )
        raise ValueError(
            f"groups must be group indices 0 (easy), 1 (medium) or 2 (hard), got {got}; "
            "difficulty_groups gives them with its default n_groups=3."
        )
    return groups.astype(np.intp)


def _is_series(groups) -> bool:
    """Whether ``groups`` is a pandas Series (duck-typed: pandas is not a dependency)."""
    return hasattr(groups, "index") and hasattr(groups, "items") and hasattr(groups, "to_numpy")


def _by_label(groups):
    """A label → group mapping, a pandas Series read so (by its index, each label once);
    anything else as it is."""
    if not _is_series(groups):
        return groups
    if not groups.index.is_unique:
        repeated = groups.index[groups.index.duplicated()].unique().tolist()
        raise ValueError(
            f"A Series of groups maps each label (its index) to a group; it names {repeated} "
            "more than once."
        )
    return dict(groups.items())


def _split_groups(
    groups_by_label: Mapping, name: str = "groups_by_label"
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and group names of a label → group mapping (the argument ``name``), as
    aligned arrays."""
    groups_by_label = _mapping(groups_by_label)
    labels = _label_array(list(groups_by_label), name, classes=True)  # (its keys)
    return labels, np.asarray(list(groups_by_label.values()))


def _mapping(groups_by_label) -> Mapping:
    """A label → group mapping (a pandas Series read by its index), or a ValueError for
    anything else: difficulty_groups' array of one group per class, which
    classwise_summary takes, failed with "'numpy.ndarray' object has no attribute
    'values'"."""
    groups_by_label = _by_label(groups_by_label)
    if not isinstance(groups_by_label, Mapping):
        raise ValueError(
            "groups_by_label must map each class label to its group name, as class_groups "
            "gives it (e.g. {'cat': 'easy', 'dog': 'hard'}); got a "
            f"{type(groups_by_label).__name__}. One group per class (difficulty_groups') "
            "goes to classwise_summary with its labels."
        )
    return groups_by_label


def _text_and_numbers(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether one array holds text and the other numbers, so that no label of one is a
    label of the other: NumPy's setdiff1d and isin take '1' for 1 once the labels are
    many (their sorting path makes both text)."""
    kinds = {a.dtype.kind, b.dtype.kind}
    return bool(kinds & set("US")) and bool(kinds & set("biuf"))


def _check_known(y_true, labels: np.ndarray, where: str = "groups") -> None:
    present = _classes(y_true)
    # (dates as objects, datetime's or NumPy's: NumPy's, as scored)
    labels = _as_dates(_numpy_held(_label_array(labels, where, classes=True)), present)
    present = _as_dates(present, labels)
    if _text_and_numbers(present, labels):  # (JSON's keys: none is a class of y_true)
        unknown = present
    else:  # aware Timestamps for datetime64 were said not to be in the groups
        _check_kinds(labels, present, where)
        unknown = np.setdiff1d(present, labels)
    if len(unknown):
        advice = (
            "build the groups with class_groups(..., labels=all_classes)"
            if where == "groups"
            else "give every class of y_true in labels (the worst class would leave them out)"
        )
        read = _classes_as_text(labels, present) if where == "groups" else None
        if read:  # (class_groups' keys were right, but for JSON: no need to build them again)
            advice = (
                "its keys are the classes as text, as JSON writes a dict's keys: read them "
                f"back, {{{read}: group for label, group in groups.items()}}"
            )
        raise ValueError(
            f"y_true has classes {_listed(unknown)} that are not in {where}; {advice}."
        )


def _classes_as_text(labels: np.ndarray, classes: np.ndarray) -> str | None:
    """The expression that reads each of the text ``labels`` (JSON's keys) as a class of
    the kind of ``classes``: ``int(label)``, ``float(label)``, or ``label == "true"`` for
    booleans (JSON's true and false); None where they are not such text."""
    kind = classes.dtype.kind
    if labels.dtype.kind != "U" or kind not in "iufb":
        return None
    if kind == "b":
        return 'label == "true"' if set(labels.tolist()) <= {"true", "false"} else None
    number = int if kind in "iu" else float
    try:
        [number(v) for v in labels.tolist()]
    except ValueError:
        return None
    return f"{number.__name__}(label)"


# ---------------------------------------------------------------------------- scorers
# Ready-made scorers, ``scorer(estimator, X, y)``, for ``GridSearchCV(scoring=...)``.
# class_std_scorer is negated (greater is better), as scikit-learn's "neg_*" scorers are.
worst_class_scorer = make_scorer(worst_class_accuracy)
hard_tercile_scorer = make_scorer(hard_tercile_accuracy)
class_std_scorer = make_scorer(class_accuracy_std, greater_is_better=False)


def make_group_scorer(groups_by_label: Mapping, group: str = "hard"):
    """Scorer of the accuracy of one group fixed in advance, for ``GridSearchCV``.

    The groups must come from data that the search never scores, otherwise the validation
    folds leak into the selection: ranking classes by a reference's accuracy on a fold
    picks the classes where the reference was unlucky on that very fold, which favours
    candidates that differ from the reference. Build them from a held-out split, or from a
    reference evaluated on a previous data set. When no such split exists, use
    :data:`hard_tercile_scorer`, which ranks classes within the fold being scored.

    Parameters
    ----------
    groups_by_label : mapping
        Class label → group name, from :func:`class_groups`.
    group : str, default="hard"

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y)``, greater is better.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.linear_model import LogisticRegression
    >>> from mr2_probe.metrics import make_group_scorer
    >>> X, y = load_iris(return_X_y=True)
    >>> scorer = make_group_scorer({0: "easy", 1: "hard", 2: "medium"})
    >>> 0 <= scorer(LogisticRegression(max_iter=500).fit(X, y), X, y) <= 1
    True
    """
    _, names = _split_groups(groups_by_label)
    _check_group(names, group)  # (said only when a search first scored, after its fits)
    return make_scorer(group_accuracy, groups_by_label=dict(groups_by_label), group=group)


def classwise_scorers(groups_by_label: Mapping | None = None) -> dict:
    """Scorers for a multi-metric ``GridSearchCV``; refit on any key, e.g. "worst_class".

    Parameters
    ----------
    groups_by_label : mapping, default=None
        Fixed groups (see :func:`make_group_scorer`); when given, adds one scorer per group
        named ``"easy"``, ``"medium"`` and ``"hard"``.

    Returns
    -------
    scorers : dict
        ``accuracy``, ``balanced_accuracy``, ``worst_class``, ``hard_tercile`` and
        ``class_std`` (negated, greater is better), plus the fixed groups; scorer objects
        all, the first two scikit-learn's own. New scorers at each call, as scikit-learn's
        ``get_scorer`` gives: a metadata request set on one (``set_score_request``) changes
        no other.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.model_selection import GridSearchCV
    >>> from mr2_probe.metrics import classwise_scorers
    >>> X, y = load_iris(return_X_y=True)
    >>> search = GridSearchCV(
    ...     LogisticRegression(max_iter=500), {"C": [0.01, 1.0]},
    ...     scoring=classwise_scorers(), refit="worst_class",
    ... ).fit(X, y)
    >>> search.best_params_
    {'C': 1.0}
    """
    scorers = {
        # Scorers, not names: under metadata routing each takes set_score_request.
        "accuracy": get_scorer("accuracy"),
        "balanced_accuracy": get_scorer("balanced_accuracy"),
        "worst_class": copy.deepcopy(worst_class_scorer),
        "hard_tercile": copy.deepcopy(hard_tercile_scorer),
        "class_std": copy.deepcopy(class_std_scorer),
    }
    if groups_by_label is not None:
        groups_by_label = _mapping(groups_by_label)
        present = set(groups_by_label.values())
        scorers |= {
            name: make_group_scorer(groups_by_label, name)
            for name in GROUP_NAMES
            if name in present
        }
    return scorers
