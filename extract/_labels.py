"""Labels: textual labels read as class indices or as class names, and the checks on them
(of list files, tar shards and Parquet / Arrow files), class names a store can hold."""

from __future__ import annotations

import collections
import logging
import re
import unicodedata

import numpy as np

logger = logging.getLogger(__name__)


def nfc_twins(names) -> tuple[str, str] | None:
    """The first two names that are one name in two Unicode forms (equal in NFC), or None."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(unicodedata.normalize("NFC", name), name)
        if other != name:
            return other, name
    return None


def _two_forms(one: str, other: str) -> str:
    return (
        f"{one!r} and {other!r} are one name in two Unicode forms, {ascii(one)} and "
        f"{ascii(other)} (an accent composed in one and decomposed in the other, as a copy "
        "made on macOS spells it)"
    )


#: Class indices from this one up are refused: the store would name every class below.
MAX_CLASS_INDEX = 1 << 20


def is_index(label: str) -> bool:
    """Whether a textual label is a class index: ASCII digits ("٣" is a digit to
    ``str.isdigit``, not a class index here)."""
    return label.isascii() and label.isdigit()


def _is_unlabelled(label: str) -> bool:
    """Whether a textual label is a negative integer, as -1 marks an unlabelled sample."""
    return re.fullmatch(r"-\d+", label) is not None


def text_problem(text: str) -> str | None:
    """Why ``text`` can be no class name in a store, or None: HDF5's strings are UTF-8
    without NUL characters (a JSON label may spell either, "\\u0000" or "\\ud800")."""
    if "\0" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (it holds a lone surrogate)"
    return None


def _check_index_names(names: list[str]) -> None:
    """Class names given for class indices (a class-names file, a ClassLabel feature) name
    each class once, in text a store can hold."""
    # (a blank line of classnames.txt named the class of its line '' and shifted the names
    # it was meant to give onto the next classes)
    empty = next((k for k, name in enumerate(names) if not name.strip()), None)
    if empty is not None:
        raise ValueError(
            f"The class names leave class {empty} without a name; each class needs one (a "
            "blank line of a class names file is a class: remove it, or name the class)."
        )
    for name in names:
        problem = text_problem(name)
        if problem:
            raise ValueError(f"The class name {name!r} {problem}, which a store cannot hold.")
    name, count = collections.Counter(names).most_common(1)[0] if names else ("", 1)
    if count > 1:
        raise ValueError(
            f"The class names give {name!r} {count} times: each class needs a name of its "
            "own, or its per-class results could not be told apart."
        )
    twins = nfc_twins(names)
    if twins:
        raise ValueError(
            f"The class names {_two_forms(*twins)}: each class needs a name of its own, or "
            "its per-class results could not be told apart."
        )


def encode_labels(
    names: list[str], index_names: list[str] | None = None, *, as_names: bool = False
) -> tuple[np.ndarray, list[str]]:
    """Class indices and class names of textual labels.

    Non-negative integers are class indices (class ``k`` is named ``index_names[k]``, or
    ``"k"``), unless ``as_names`` (labels that were strings, not text of numbers); anything
    else (-1 included) is a class name, and the sorted names are the classes.

    Raises
    ------
    ValueError
        If ``index_names`` is given and an index is out of its range, or they name the
        indices' classes but a class twice or in text a store cannot hold
        (:func:`text_problem`); without them, if an index is :data:`MAX_CLASS_INDEX` or
        more (ids, not class indices).
    """
    if not as_names and all(map(is_index, names)):
        indices = [int(name) for name in names]
        largest = max(indices, default=-1)
        if index_names is not None and largest >= len(index_names):
            raise ValueError(
                f"A label is {largest}, but only {len(index_names)} class names are given."
            )
        if index_names is None and largest >= MAX_CLASS_INDEX:
            raise ValueError(
                f"The labels are read as class indices 0..K-1, and the largest, {largest}, "
                f"would make {largest + 1} classes (at most {MAX_CLASS_INDEX} are taken). If "
                "they are codes (ids) rather than indices, label the images by name (e.g. "
                f"'id{largest}'), or number their classes from 0."
            )
        labels = np.array(indices, dtype=np.int64)
        n_classes = largest + 1
        if index_names is None:
            _warn_of_unused_indices(names, labels, n_classes)
            return labels, [str(k) for k in range(n_classes)]
        _check_index_names(index_names)  # (names of labels that are no indices go unread)
        return labels, list(index_names)
    class_names = sorted(set(names))
    twins = nfc_twins(class_names)
    if twins:  # (two classes that print alike, which mr2-probe matches by name as one)
        raise ValueError(
            f"The labels {_two_forms(*twins)}: they would be two classes that print alike. "
            "Spell them alike."
        )
    return np.searchsorted(class_names, names).astype(np.int64), class_names


def _warn_of_unused_indices(names: list[str], labels: np.ndarray, n_classes: int) -> None:
    """Say where class indices leave classes without images (indices counted from 1, say)
    or two spellings of one index are one class ("01" and "1")."""
    empty = np.flatnonzero(np.bincount(labels, minlength=n_classes) == 0)
    if len(empty):
        shown = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
        logger.warning(
            "The labels are class indices 0..%d, and %d of these classes %s no image (%s): "
            "they stay among the store's class names%s.",
            n_classes - 1,
            len(empty),
            "has" if len(empty) == 1 else "have",
            shown,
            " (labels counted from 1 leave class 0 empty)" if empty.tolist() == [0] else "",
        )
    spellings: dict[int, list[str]] = {}
    for name in sorted(set(names)):  # each distinct label once
        spellings.setdefault(int(name), []).append(name)
    merged = next((texts for texts in spellings.values() if len(texts) > 1), None)
    if merged:
        logger.warning(
            "The labels %s are one class index, %d: they are the same class.",
            " and ".join(repr(t) for t in merged[:3]),
            int(merged[0]),
        )


_DECIMAL = (
    "is a whole number written as a decimal (as pandas writes integers in a column that held "
    "a missing value)"
)
_AS_TEXT = (
    "the classes sorted as text (class %d is %r); write the labels as integers ('2') to read "
    "them as class indices."
)


def renumbered_decimal(texts: list[str]) -> tuple[int, int, str] | None:
    """``(i, k, name)`` where every label is a whole number written as a decimal ("2.0", as
    pandas writes integers in a column that held a missing value), read as class names
    sorted as text, and label i's class ``k`` is not the number it spells (class 4 was
    "2.0" of 12 classes, without a word); None otherwise. A negative one (-1.0, as pandas
    writes the -1 of unlabelled samples) is no class index, but sorts first and moves the
    others ("0.0" was class 1, without a word)."""
    if not all(re.fullmatch(r"-?\d+\.0+", text) for text in texts):
        return None
    order = {text: k for k, text in enumerate(sorted(set(texts)))}
    moved = next(
        (i for i, text in enumerate(texts) if order[text] != float(text) and text[0] != "-"),
        None,
    )
    return None if moved is None else (moved, order[texts[moved]], texts[moved])


def numbers_sorted_as_text(texts: list[str]) -> tuple[int, int, str] | None:
    """``(i, k, name)`` where every label is ASCII digits, read as a class name, and the
    classes sorted as text are not in the order of their numbers ("10" before "2"): label
    i is the first whose class ``k`` is not where its number puts it; None otherwise."""
    if not texts or not all(map(is_index, texts)):
        return None
    names = sorted(set(texts))
    numeric = sorted(names, key=lambda name: (int(name), name))
    k = next((k for k, (a, b) in enumerate(zip(names, numeric, strict=True)) if a != b), None)
    return None if k is None else (texts.index(names[k]), k, names[k])


def label_kind_problem(labels: list[str], as_names: bool = False) -> tuple[int, str] | None:
    """``(i, why)`` when label i cannot be a class: an empty (or blank) label, a negative
    integer among class indices or where every label is one (an unlabelled sample; among
    names such as "+1" it is a name), or a class name where
    other labels are class indices (ASCII digits): one such label would make every label a
    class name, sorted as text ("10" before "2"), and renumber the classes. None otherwise.
    (List files keep reading such a mix as names, with a warning.) With ``as_names``
    (labels that were strings) digits are names too."""
    if "" in labels:
        return labels.index(""), "which is empty: every sample needs a label"
    digits = [is_index(label) for label in labels]
    indices = [d and not as_names for d in digits]
    if all(indices):
        return None
    unlabelled = [_is_unlabelled(label) for label in labels]
    if all(unlabelled) or (any(digits) and any(unlabelled)):  # names may be "-1" and "+1"
        i = unlabelled.index(True)
        return i, (
            f"which is no class index ({labels[i]} marks an unlabelled sample, as in test splits)"
        )
    if not any(indices):
        return None
    example = labels[indices.index(True)]
    return indices.index(False), (
        f"a class name, where other samples have class indices (e.g. {example!r})"
    )
