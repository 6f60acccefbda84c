"""Class-wise comparison of several models on one test set: text, Markdown and JSON tables."""

from __future__ import annotations

import datetime
import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from ._data import check_no_missing_labels, plain
from .metrics import (
    GROUP_NAMES,
    _array,
    _as_dates,
    _check_kinds,
    _Checked,
    _checked,
    _group_indices,
    _group_names,
    _label_array,
    _listed,
    _numpy_held,
    _numpy_times,
    _present,
    _scored_against,
    _summary,
    _text_and_numbers,
)

COLUMNS = ("overall", *GROUP_NAMES, "worst", "std")
_UNITS = {"percent": 100.0, "fraction": 1.0}


@dataclass
class ClasswiseReport:
    """Class-wise scores of several models, with groups fixed by a reference model.

    Build it with :func:`classwise_report`. Accuracies are fractions in memory; the text and
    Markdown tables print them in percent, and :meth:`to_dict` / :meth:`to_json` write them
    in percent too (with ``"units": "percent"``), so every file of a report reads alike.

    Attributes
    ----------
    reference : str
        Name of the model whose per-class accuracy fixed the groups.
    labels : list
        The classes, sorted, or in the order of ``labels=`` where it was given.
    groups : list of str
        Group of each class ("easy", "medium", "hard"), aligned with ``labels``.
    rows : dict
        Model name → {"overall", "easy", "medium", "hard", "worst", "std"}.
    per_class : dict
        Model name → list of per-class accuracies aligned with ``labels``.
    """

    reference: str
    labels: list
    groups: list
    rows: dict
    per_class: dict

    def class_order(self) -> np.ndarray:
        """Indices of ``labels`` from the reference's best class to its worst."""
        return np.argsort(-np.asarray(self.per_class[self.reference]), kind="stable")

    def to_text(self, per_class: bool = False) -> str:
        """A fixed-width table; with ``per_class`` a second table, one row per class."""
        return _render(self, per_class, _text_table)

    def to_markdown(self, per_class: bool = False) -> str:
        """A GitHub-flavoured Markdown table (and the per-class table on request)."""
        return _render(self, per_class, _markdown_table)

    def to_dict(self) -> dict:
        """Plain Python types only, accuracies in percent, NaN as None, for ``json.dumps``.

        The dictionary says its units: ``{"units": "percent", "reference": ..., "labels":
        ..., "groups": ..., "rows": ..., "per_class": ...}``, with ``rows`` and
        ``per_class`` (the spread ``std`` included) in percent, as the tables print them.
        """
        data = asdict(self)
        data["rows"] = {name: _scaled(row, 100.0) for name, row in self.rows.items()}
        data["per_class"] = {name: _scaled(v, 100.0) for name, v in self.per_class.items()}
        return {"units": "percent", **_finite(data)}

    def to_json(self, **kwargs) -> str:
        """JSON text of :meth:`to_dict` that strict parsers read (a label of ±inf written
        "inf" or "-inf", and read back by :meth:`from_dict` as that string); keyword
        arguments go to ``json.dumps`` (``allow_nan=True`` has nothing left to allow)."""
        return _strict_json(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping) -> ClasswiseReport:
        """Inverse of :meth:`to_dict` (and, through ``json.loads``, of :meth:`to_json`, but
        for labels of ±inf, which it writes as strings), up to the rounding of the
        percentages it writes (at 10⁻¹⁰ of a point: 83.3333333333
        reads back as 0.833333333333, not 5/6), which makes a report read back compare
        unequal to the one written; read back and written again, it is unchanged.

        Percentages (``"units": "percent"``) become fractions again and ``None`` becomes
        NaN. A dictionary without ``"units"`` holds fractions (reports written before the
        key existed).
        """
        takes = (
            "from_dict takes the dictionary of ClasswiseReport.to_dict (json.loads of "
            "to_json's text, or of the command line's report.json)"
        )
        if not isinstance(data, Mapping):  # ("'str' object has no attribute 'get'")
            raise TypeError(f"{takes}; got a {type(data).__name__}.")
        missing = [key for key in cls.__dataclass_fields__ if key not in data]
        if missing:  # (a KeyError naming the first)
            raise ValueError(f"{takes}; got one without {missing}.")
        units = data.get("units", "fraction")
        if units not in _UNITS:
            raise ValueError(
                f"units must be one of {sorted(_UNITS)}, got {units!r}; a report written by "
                "ClasswiseReport.to_dict says 'percent'."
            )
        fields = {key: data[key] for key in cls.__dataclass_fields__}
        scale = 1 / _UNITS[units]
        fields["rows"] = {name: _scaled(row, scale) for name, row in fields["rows"].items()}
        fields["per_class"] = {
            name: _scaled(values, scale) for name, values in fields["per_class"].items()
        }
        return cls(**fields)

    def __str__(self) -> str:
        return self.to_text()


def classwise_report(
    models: Mapping, y, X=None, *, reference: str | None = None, labels=None
) -> ClasswiseReport:
    """Compare fitted models (or their predictions) class by class on one test set.

    Parameters
    ----------
    models : mapping
        Model name → a fitted estimator with ``predict`` or an array of predictions (a
        pandas DataFrame of predictions, one column per model, too). The report names
        each model by ``str(name)`` (a name such as the C of a fit prints as given, and
        reads back from JSON as it was written).
    y : array-like of shape (n_samples,)
        True test labels, of any type.
    X : array-like of shape (n_samples, n_features), default=None
        Test inputs; needed only for models given as estimators.
    reference : str, default=None
        Name of the model that fixes the easy / medium / hard groups (by convention the
        ERM probe); defaults to the first model.
    labels : array-like, default=None
        The classes of ``y``, each once, in the order of the report's ``labels`` and
        ``per_class`` lists (its JSON), in which it also breaks ties of the reference's
        accuracy when it groups them (default: sorted). Names of integer codes, for
        instance, in the codes' order. The per-class tables list the classes from the
        reference's best to its worst.

    Returns
    -------
    report : ClasswiseReport

    Examples
    --------
    >>> from mr2_probe.report import classwise_report
    >>> y = [0, 0, 1, 1, 2, 2]
    >>> report = classwise_report({"erm": [0, 0, 1, 0, 2, 0], "mr2": [0, 0, 1, 1, 2, 0]}, y)
    >>> dict(zip(report.labels, report.groups))  # the group of each class
    {0: 'easy', 1: 'medium', 2: 'hard'}
    >>> round(report.rows["mr2"]["hard"], 2)
    0.5
    """
    if not hasattr(models, "items"):  # (a list of models: "no attribute 'items'")
        raise ValueError(
            "models must map each model's name to a fitted estimator or its predictions, "
            f"e.g. {{'ERM': erm, 'MR2': mr2}}; got a {type(models).__name__}."
        )
    if getattr(models, "ndim", None) == 1:  # a pandas Series: its items are single values
        raise ValueError(
            "models must map each model's name to a fitted estimator or its predictions, "
            "e.g. {'ERM': erm, 'MR2': mr2}; got a Series, one model's predictions: pass "
            "{'name': predictions} (or a DataFrame, one column per model)."
        )
    # Items, not the truth value or length: a pandas DataFrame of predictions, one column
    # per model, has neither ("The truth value of a DataFrame is ambiguous").
    items = list(models.items())
    if not items:
        raise ValueError("models must name at least one model, got an empty mapping.")
    named = {str(name): model for name, model in items}
    if len(named) < len(items):
        # (keys of an array's values as Python's: [1, '1'], not NumPy 2's [np.int64(1), '1'])
        given = [plain(name) for name, _ in items]
        raise ValueError(f"models must have distinct names as text, got {given}.")
    # The reference by its name as text too (the key 0.01 is the model "0.01").
    reference = next(iter(named)) if reference is None else str(reference)
    if reference not in named:
        raise ValueError(f"reference must be one of {list(named)}, got {reference!r}.")
    models = named
    predictions = {name: _predictions(name, model, X) for name, model in models.items()}
    if labels is not None:  # (refused before y, as ever; read once)
        labels = _numpy_held(_label_array(labels, "labels", classes=True))
    # y read once (a pandas column's text, checked for missing labels, took a second at
    # each read of ImageNet's labels), checked (no NaN, one kind of label) and named as
    # the caller knows it
    truth = _checked(y, "y")
    y = truth.labels
    labels = truth.classes() if labels is None else _class_order(labels, truth)
    per_class, correct = {}, {}
    for name, pred in predictions.items():
        try:
            per_class[name], correct[name] = _scored_against(truth, pred, labels)
        except ValueError as error:  # it says y_pred, not which model's predictions
            raise _unscorable(name, error) from None
    # Each model scored once: the groups from the reference's accuracies (class_groups'),
    # the rows from each model's (classwise_summary's with those groups).
    names = _group_names(per_class[reference])
    groups, weight = _group_indices(names), np.ones(len(y))
    rows = {}
    for name, accuracy in per_class.items():
        _present(accuracy)  # (a clear error where y holds no sample)
        rows[name] = _summary(accuracy, groups, correct[name], weight)
    return ClasswiseReport(
        reference=reference,
        # (each as its str: astype(str) cut them to 21 characters, "86400000000 microseco")
        labels=_as_text([str(v) for v in labels] if labels.dtype.kind in "mM" else labels.tolist()),
        groups=names.tolist(),
        rows=rows,
        per_class={name: accuracy.tolist() for name, accuracy in per_class.items()},
    )


def _class_order(labels: np.ndarray, truth: _Checked) -> np.ndarray:
    """The classes of y (``truth``) in the order of ``labels`` (read and checked for
    missing labels already), checked to hold each once (as y's own values: a label 2.0 for
    the class 2 is reported as 2)."""
    classes = truth.classes()
    # y's dates held as objects compared as NumPy's where the labels are NumPy's: a date
    # against the integer of nanoseconds of a label's tolist() was refused.
    keys = _as_dates(classes, labels)
    if keys.dtype.kind in "mM":
        labels = _in_unit(labels, keys.dtype)
    if not _text_and_numbers(classes, labels):  # (as scored: aware dates were taken in UTC)
        _check_kinds(labels, classes, "labels", "y")
    if (
        labels.ndim != 1
        or len(labels) != len(classes)
        or set(labels.tolist()) != set(keys.tolist())
    ):
        raise ValueError(
            f"labels must hold each class of y once, in the order to report them; y has the "
            f"classes {_listed(classes)}, labels are {_listed(labels)}."
        )
    position = {v: i for i, v in enumerate(keys.tolist())}
    return classes[[position[v] for v in labels.tolist()]]


def _in_unit(labels: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Dates or durations ``labels`` (NumPy's at any unit, or datetime's) in the unit of
    ``dtype`` (y's classes') where they are exactly so, as NumPy compares them: days for a
    pandas column's nanoseconds were refused, their tolist() dates against y's integers.
    Other labels (text among them, durations for dates and dates for durations: cast, a
    duration of 1 day was the date 1970-01-02) as they are."""
    kinds = (
        datetime.date | np.datetime64 if dtype.kind == "M" else datetime.timedelta | np.timedelta64
    )
    if not (
        labels.dtype.kind == dtype.kind
        or all(isinstance(v, kinds) and getattr(v, "tzinfo", None) is None for v in labels.flat)
    ):  # (dates with a time zone are none of NumPy's naive ones: NumPy cast them to UTC)
        return labels
    try:
        # (NumPy's as they are: tolist() gives nanoseconds as integers, read as days)
        own = labels if labels.dtype != object else np.asarray(_numpy_times(labels.tolist()))
        own = np.asarray(own, dtype=f"{dtype.kind}8")  # at their own unit
        converted = own.astype(dtype)
    except (TypeError, ValueError, OverflowError):
        return labels
    # (back at their own unit: a date out of the range of nanoseconds wraps, 3000-01-01 to
    # 1830-11-23, and compares equal to itself at nanoseconds)
    exact = own.shape == labels.shape and (converted.astype(own.dtype) == own).all()
    return converted if exact else labels


def _as_text(labels: list) -> list:
    """Bytes labels (h5py's fixed-length strings) as text, which JSON can hold (dates and
    durations are given as their ISO text, "2024-01-01", by the caller): decoded,
    with backslash escapes where they are not UTF-8, unless two then read alike (the byte
    0xFF and the four characters backslash, x, f, f); then as their ``repr``, which never
    makes two alike. Dates, times and durations held as objects (datetime's, or pandas'
    Timestamp of a column with a time zone) are written as those of datetime64 are: their
    ISO text (a duration as its ``str``). Other objects JSON cannot hold (pandas' Interval
    and Period, a Decimal) are written as their ``str`` (their ``repr`` where two read
    alike), NumPy's scalars as Python's."""
    if labels and all(isinstance(v, datetime.date | datetime.time) for v in labels):
        return [v.isoformat() for v in labels]
    if labels and all(isinstance(v, datetime.timedelta) for v in labels):
        return [str(v) for v in labels]
    # NumPy's numbers and text held as objects (np.int64(3), np.str_('a')); its datetime64
    # and timedelta64 (an integer to NumPy, whose item() in nanoseconds is a bare int)
    # become text below
    numpy = np.number | np.bool_ | np.str_ | np.bytes_
    labels = [
        v.item() if isinstance(v, numpy) and not isinstance(v, np.timedelta64) else v
        for v in labels
    ]
    if not all(isinstance(v, str | bytes | int | float) or v is None for v in labels):
        # Other objects (pandas' Interval of pd.cut, its Period, a Decimal): as their str,
        # or where two read alike their repr; to_json failed ("Object of type Interval is
        # not JSON serializable"), as it did for np.int64 held as objects.
        text = [str(v) for v in labels]
        return text if len(set(text)) == len(text) else [repr(v) for v in labels]
    if not labels or not isinstance(labels[0], bytes):
        return labels
    text = [v.decode("utf-8", "backslashreplace") for v in labels]
    return text if len(set(text)) == len(text) else [repr(v) for v in labels]


def _predictions(name: str, model, X) -> np.ndarray:
    if hasattr(model, "predict"):
        if X is None:
            raise ValueError(f"Model {name!r} is an estimator: pass X to predict with it.")
        return _array(model.predict(X), name=f"models[{name!r}].predict(X)")
    try:  # (as given: NumPy reads a list's NaN among text as the class 'nan')
        read = check_no_missing_labels(model, "y_pred", "score")
    except ValueError as error:
        raise _unscorable(name, error) from None
    predictions = _array(model, name=f"models[{name!r}]") if read is None else read
    if predictions.ndim == 0:  # ("y_true and y_pred must have the same shape, got (6,) and ()")
        raise ValueError(
            f"Model {name!r} is a single value, {plain(predictions.item())!r}: models must map "
            "each model's name to a fitted estimator or its predictions (one per sample of y)."
        )
    return predictions


def _unscorable(name: str, error: ValueError) -> ValueError:
    """``error`` of predictions, which calls them y_pred, naming the model they are of."""
    return ValueError(f"The predictions of model {name!r} cannot be scored against y: {error}")


def _render(report: ClasswiseReport, per_class: bool, table) -> str:
    names = list(report.rows)
    summary = table(
        ["model", *COLUMNS], [[name, *(report.rows[name][c] for c in COLUMNS)] for name in names]
    )
    markdown = table is _markdown_table
    reference = _markdown_text(report.reference) if markdown else _one_line(report.reference)
    note = (
        f"test accuracy in %; easy / medium / hard: class terciles of {reference}; "
        "std: spread of per-class accuracy"
    )
    empty = [g for g in GROUP_NAMES if all(_missing(report.rows[n][g]) for n in names)]
    if empty:  # fewer classes than groups
        note += f"; nan: no class in the {' or '.join(empty)} group"
    parts = [summary, note]
    if per_class:
        rows = [
            [str(report.labels[i]), report.groups[i], *(report.per_class[n][i] for n in names)]
            for i in report.class_order()
        ]
        parts.append(table(["class", "group", *names], rows))
    return "\n\n".join(parts) if markdown else "\n".join(parts)


def _missing(value) -> bool:
    return value is None or math.isnan(value)


def _cell(value) -> str:
    if isinstance(value, str):
        return value
    return "nan" if _missing(value) else f"{100 * value:.2f}"


# Characters that Markdown gives a meaning to in a table cell, escaped with a backslash
# (CommonMark escapes any ASCII punctuation so): '|' ends a cell, '<' opens raw HTML (GitHub
# drops "<unk>"), '*', '_', '`', '[', '~' format, '&' starts an entity, '\\' escapes, '$'
# opens math where it is rendered (GitHub).
_MARKDOWN_SPECIAL = re.compile(r"([\\|<>*_`\[\]~&$])")
# Every break str.splitlines knows (a vertical tab, a form feed, U+2028, ... split a row
# in two as a newline did).
_LINE_BREAK = re.compile(r"\r\n|[\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029]")


def flat_text(text) -> str:
    """``text`` as plain text in one line of a table or a note: a line break would split
    its line, a tab move what follows to the terminal's next tab stop; each shown as a
    space."""
    return _one_line(text).replace("\t", " ")


def _text_table(header: list, rows: list) -> str:
    flat = flat_text
    header = [flat(h) for h in header]
    cells = [[flat(_cell(v)) for v in row] for row in rows]
    # Left-aligned names, right-aligned numbers, each column as wide as its longest cell
    # in a terminal's columns (a CJK character takes two, a combining accent none).
    widths = [max(_columns(h), *(_columns(row[j]) for row in cells)) for j, h in enumerate(header)]
    widths[1:] = [max(9, w + 2) for w in widths[1:]]

    def line(row: list) -> str:
        padded = [row[0] + " " * (widths[0] - _columns(row[0]))]
        padded += [" " * (w - _columns(v)) + v for v, w in zip(row[1:], widths[1:], strict=True)]
        return "".join(padded)

    head = line(header)
    return "\n".join([head, "-" * _columns(head), *(line(row) for row in cells)])


def _columns(text: str) -> int:
    """How many columns of a monospaced terminal ``text`` takes: two for each wide or
    full-width character (CJK, most emoji), none for a combining mark or a zero-width
    format character, one for the rest (the ambiguous ones as in Western locales)."""
    return sum(
        0
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in ("W", "F")
        else 1
        for c in text
    )


def _one_line(text) -> str:
    """``text`` on one line of plain text: its line breaks shown as spaces."""
    return _LINE_BREAK.sub(" ", str(text))


def _markdown_text(text) -> str:
    """``text`` shown as it is in Markdown, in one table cell or line."""
    return _LINE_BREAK.sub("<br>", _MARKDOWN_SPECIAL.sub(r"\\\1", str(text)))


def _markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(map(_markdown_text, header)) + " |"]
    lines.append("|---" + "|--:" * (len(header) - 1) + "|")
    lines += ["| " + " | ".join(_markdown_text(_cell(v)) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _scaled(value, factor: float):
    """Accuracies times ``factor`` (a dict's values, a list's, tuple's or array's items, as
    a list); None reads as NaN."""
    if isinstance(value, dict):
        return {key: _scaled(v, factor) for key, v in value.items()}
    if isinstance(value, np.ndarray) and value.ndim:  # per_class_accuracy's
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [_scaled(v, factor) for v in value]
    value = math.nan if value is None else float(value)
    if factor > 1:
        # Rounded at 1e-10 so that 0.57 is written 57.0, not 56.99999999999999.
        return round(value * factor, 10)
    # Back to fractions by a division (57.0 / 100 is 0.57 exactly), not rounded again: a
    # report read and written again keeps every digit it was written with.
    return value / round(1 / factor) if factor < 1 else value


def in_percent(value):
    """Accuracies (a dict's values, a list's, tuple's or NumPy array's items, given back
    as lists) in percent with NaN as None, as :meth:`ClasswiseReport.to_dict` writes them."""
    return _finite(_scaled(value, 100.0))


def _finite(value, infinities: bool = False):
    """NaN → None throughout, since strict JSON has no NaN; with ``infinities`` also ±inf →
    "inf" / "-inf" (as the options take them), tuples walked as the lists JSON makes them."""
    if isinstance(value, dict):
        return {key: _finite(v, infinities) for key, v in value.items()}
    if isinstance(value, list) or (infinities and isinstance(value, tuple)):
        return [_finite(v, infinities) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if infinities and isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _strict_json(value, **kwargs) -> str:
    """JSON that strict parsers read: no Infinity or NaN, which ``json.dumps`` writes (as
    C=inf); infinities as the strings "inf" and "-inf", and NaN as null, as the reports
    write it."""
    return json.dumps(_finite(value, infinities=True), **{"allow_nan": False, **kwargs})
