"""Class-wise metrics and the scikit-learn scorers built on them."""

import json
import re
import sys
import warnings
from datetime import date, datetime, time, timedelta, timezone
from types import MappingProxyType

import numpy as np
import pytest
import sklearn
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import ConvergenceWarning, UndefinedMetricWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, check_scoring, recall_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold

from mr2_probe import MR2LinearClassifier
from mr2_probe.metrics import (
    class_accuracy_std,
    class_groups,
    class_std_scorer,
    classwise_scorers,
    classwise_summary,
    difficulty_groups,
    group_accuracy,
    hard_tercile_accuracy,
    hard_tercile_scorer,
    make_group_scorer,
    per_class_accuracy,
    worst_class_accuracy,
    worst_class_scorer,
)
from mr2_probe.report import classwise_report


def _loop_per_class(y_true, y_pred, labels):
    """Reference: one boolean mask per class."""
    return np.array([np.mean(y_pred[y_true == c] == c) for c in labels])


@pytest.mark.parametrize(
    "classes",
    [np.arange(7), np.array(["cat", "dog", "eel", "fox"]), np.array([-1.5, 0.25, 3.0])],
)
def test_per_class_accuracy_matches_a_loop_for_any_label_type(classes):
    rng = np.random.default_rng(0)
    y_true = rng.choice(classes, size=500)
    y_pred = np.where(rng.random(500) < 0.7, y_true, rng.choice(classes, size=500))
    labels = rng.permutation(classes)
    np.testing.assert_allclose(
        per_class_accuracy(y_true, y_pred, labels), _loop_per_class(y_true, y_pred, labels)
    )
    # Mean recall is balanced accuracy (which scikit-learn refuses for float labels).
    if classes.dtype.kind != "f":
        assert np.mean(per_class_accuracy(y_true, y_pred)) == pytest.approx(
            balanced_accuracy_score(y_true, y_pred)
        )


def test_per_class_accuracy_is_recall_with_the_conventions_its_docstring_gives():
    # recall_score(average=None) at zero_division=NaN, over y_true's classes by default:
    # its own defaults (y_pred's classes too, 0 for a class without samples) differ.
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 4, 60), rng.integers(0, 5, 60)  # (4: predicted only)
    weight = rng.random(60) * (y_true != 2)  # class 2 without weight
    labels = [0, 1, 2, 3, 4, 9]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        want = recall_score(y_true, y_pred, labels=labels, average=None, sample_weight=weight,
                            zero_division=np.nan)  # fmt: skip
        own = recall_score(y_true, y_pred, average=None, sample_weight=weight)
    acc = per_class_accuracy(y_true, y_pred, labels, weight)
    np.testing.assert_allclose(acc, want)
    np.testing.assert_allclose(per_class_accuracy(y_true, y_pred, sample_weight=weight), want[:4])
    assert len(own) == 5 and own[2] == own[4] == 0


@pytest.mark.parametrize(
    "y, labels",
    [
        ([0, 1], [0.0, 1.0, np.nan]),
        ([0, 1], np.array([0, 1, np.nan], dtype=object)),
        # (a pandas column of text with a missing value: "Mix of label input types
        # (string and number)", where the user had passed no number)
        (["a", "b"], np.array(["a", "b", np.nan], dtype=object)),
    ],
)
def test_nan_among_the_labels_is_refused(y, labels):
    # A NaN is no class: it was scored NaN, and class_groups made it a key, "hard". It is
    # a missing label, named as the estimators name it, among numbers too (a list's NaN
    # was "Input labels contains NaN", without its position).
    match = (
        r"^Input labels holds 1 missing label \(NaN\) among its 3, at position 2, which "
        r"is no class: name only classes in labels\.$"
    )
    for score in (per_class_accuracy, class_groups):
        with pytest.raises(ValueError, match=match):
            score(y, y, labels=labels)


def test_per_class_accuracy_absent_class_is_nan_and_unknown_samples_ignored():
    acc = per_class_accuracy([0, 0, 1, 5], [0, 1, 1, 5], labels=[1, 0, 2])
    np.testing.assert_array_equal(acc, [1.0, 0.5, np.nan])


def test_per_class_accuracy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        per_class_accuracy([0, 1], [0, 1, 1])


def test_a_column_of_labels_scores_as_its_labels(digits_subset):
    # A column vector y_true was refused (worst_class_accuracy) or raised an IndexError
    # (per_class_accuracy), and inside GridSearchCV every fold's score became NaN;
    # scikit-learn's metrics take it as the labels it holds.
    X, y = digits_subset
    column = y.reshape(-1, 1)
    assert worst_class_accuracy(column, y) == worst_class_accuracy(column, column) == 1.0
    clf = LogisticRegression(C=0.01, max_iter=200).fit(X[:150], y[:150])
    want = worst_class_scorer(clf, X[150:], y[150:])
    assert worst_class_scorer(clf, X[150:], column[150:]) == want
    with pytest.raises(ValueError, match="1d array"):
        per_class_accuracy(np.zeros((4, 2)), np.zeros((4, 2)))
    # classwise_summary (and so classwise_report) compared the column with the predictions
    # as an (n, n) matrix: "Axis must be specified when shapes of a and weights differ".
    assert classwise_summary(column, y) == classwise_summary(y, y)


@pytest.mark.parametrize(
    "n_classes, sizes", [(3, [1, 1, 1]), (6, [2, 2, 2]), (10, [4, 3, 3]), (100, [34, 33, 33])]
)
def test_difficulty_groups_are_terciles_ranked_by_accuracy(n_classes, sizes):
    acc = np.random.default_rng(n_classes).random(n_classes)
    groups = difficulty_groups(acc)
    np.testing.assert_array_equal(np.bincount(groups), sizes)
    # Every easy class beats every medium class, which beats every hard class.
    assert acc[groups == 0].min() > acc[groups == 1].max()
    assert acc[groups == 1].min() > acc[groups == 2].max()


@pytest.mark.parametrize(
    "acc, expected", [([0.5], [2]), ([0.9, 0.5], [0, 2]), ([0.2, 0.9, 0.5, 0.7], [2, 0, 1, 0])]
)
def test_the_worst_class_is_always_hard(acc, expected):
    np.testing.assert_array_equal(difficulty_groups(acc), expected)


def test_hard_tercile_of_a_single_class_is_its_accuracy():
    # It was NaN: the one class counted as easy, the hard group was empty.
    assert hard_tercile_accuracy([0, 0], [0, 1]) == 0.5
    assert classwise_summary([0, 0], [0, 1])["hard"] == 0.5


@pytest.mark.parametrize("shape", [(2, 2), (3, 3), (6, 1)])
def test_difficulty_groups_refuse_anything_but_one_accuracy_per_class(shape):
    # A 2 × 2 array gave two groups for four accuracies, a 6 × 1 column NumPy's broadcast
    # error.
    with pytest.raises(ValueError, match=re.escape(f"shape (n_classes,); got shape {shape}.")):
        difficulty_groups(np.ones(shape))


def test_difficulty_groups_break_ties_by_class_order():
    np.testing.assert_array_equal(difficulty_groups(np.ones(6)), [0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize(
    "y_true, y_ref, expected",
    [
        ([0, 0, 1, 1, 2, 2], [0, 0, 1, 0, 0, 0], {0: "easy", 1: "medium", 2: "hard"}),
        (["b", "b", "a", "a", "c"], ["b", "b", "b", "a", "c"],
         {"a": "hard", "b": "easy", "c": "medium"}),
    ],
)  # fmt: skip
def test_class_groups_maps_plain_labels_to_names(y_true, y_ref, expected):
    groups = class_groups(y_true, y_ref)
    assert groups == expected
    assert all(type(label) in (int, str) for label in groups)


def test_class_groups_rank_a_class_without_samples_hardest():
    groups = class_groups([0, 0, 1, 1], [0, 1, 1, 1], labels=[0, 1, 2])
    assert groups == {0: "medium", 1: "easy", 2: "hard"}


def test_class_groups_with_labels_out_of_order_map_each_label_to_its_own_group():
    # Per class: 1, 0.5, 0; labels given in another order than the sorted one must not
    # move a group onto another class (the accuracies or the keys taken in sorted order).
    y_true, y_ref = [0, 0, 1, 1, 2, 2], [0, 0, 1, 0, 0, 0]
    groups = class_groups(y_true, y_ref, labels=[2, 0, 1])
    assert groups == {0: "easy", 1: "medium", 2: "hard"}
    assert list(groups) == [2, 0, 1]


GROUPS = {0: "easy", 1: "easy", 2: "medium", 3: "medium", 4: "hard", 5: "hard"}
Y_TRUE = np.repeat(np.arange(6), 4)
Y_PRED = np.array([0, 0, 0, 0, 1, 1, 1, 0, 2, 2, 0, 0, 3, 3, 3, 3, 4, 0, 0, 0, 5, 5, 0, 0])
# per class: 1, .75, .5, 1, .25, .5
DAYS_NS = np.array(["2024-01-01", "2024-01-02"], "datetime64[ns]")


@pytest.mark.parametrize(
    "score, expected",
    [
        (lambda t, p: worst_class_accuracy(t, p), 0.25),
        (lambda t, p: class_accuracy_std(t, p), np.std([1, 0.75, 0.5, 1, 0.25, 0.5])),
        (lambda t, p: group_accuracy(t, p, GROUPS, "easy"), 0.875),
        (lambda t, p: group_accuracy(t, p, GROUPS, "medium"), 0.75),
        (lambda t, p: group_accuracy(t, p, GROUPS), 0.375),
        # The model's own hardest two classes: 0.25 and one of the 0.5s.
        (lambda t, p: hard_tercile_accuracy(t, p), 0.375),
    ],
)
def test_scalar_scores(score, expected):
    assert score(Y_TRUE, Y_PRED) == pytest.approx(expected)


def test_group_accuracy_rejects_unknown_group():
    with pytest.raises(ValueError, match="group must be one of"):
        group_accuracy(Y_TRUE, Y_PRED, GROUPS, "hardest")
    # Its scorer refuses it when made, not when a search first scores, after its fits.
    with pytest.raises(ValueError, match=r"one of \['easy', 'hard', 'medium'\], got 'hardest'"):
        make_group_scorer(GROUPS, "hardest")
    # A group taken from an array is named as text, not as NumPy 2's np.str_('hardest').
    for refuse in (group_accuracy, make_group_scorer):
        args = (Y_TRUE, Y_PRED) if refuse is group_accuracy else ()
        with pytest.raises(ValueError, match=r"'medium'\], got 'hardest'\.$"):
            refuse(*args, GROUPS, np.array(["hardest"])[0])


@pytest.mark.parametrize(
    "groups, kind",
    [
        (np.array([0, 0, 1, 1, 2, 2]), "ndarray"),  # difficulty_groups', as classwise_summary
        (["easy", "easy", "medium", "medium", "hard", "hard"], "list"),
    ],
)
def test_groups_that_are_no_mapping_are_refused_by_the_group_scores(groups, kind):
    # "'numpy.ndarray' object has no attribute 'values'" before.
    match = rf"groups_by_label must map each class label .*; got a {kind}\. One group per"
    for call in (
        lambda: group_accuracy(Y_TRUE, Y_PRED, groups),
        lambda: make_group_scorer(groups),
        lambda: classwise_scorers(groups),
    ):
        with pytest.raises(ValueError, match=match):
            call()
    # (None is classwise_scorers' default, no fixed groups; to make_group_scorer, "'NoneType'
    # object is not iterable".)
    with pytest.raises(ValueError, match="groups_by_label must map .*; got a NoneType"):
        make_group_scorer(None)


def test_group_accuracy_is_nan_when_the_group_has_no_samples():
    keep = Y_TRUE < 4
    assert np.isnan(group_accuracy(Y_TRUE[keep], Y_PRED[keep], GROUPS, "hard"))


def test_a_group_without_samples_is_nan_in_the_summary_without_a_warning():
    # The mean of a group whose classes are all absent is NaN, not NumPy's "Mean of empty
    # slice" RuntimeWarning beside it.
    keep = Y_TRUE < 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = classwise_summary(Y_TRUE[keep], Y_PRED[keep], GROUPS)
    assert np.isnan(summary["hard"])
    assert summary["easy"] == 0.875 and summary["medium"] == 0.75


def test_classwise_summary_accepts_a_mapping_or_an_index_array():
    from_mapping = classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    from_index = classwise_summary(Y_TRUE, Y_PRED, [0, 0, 1, 1, 2, 2])
    assert from_mapping == pytest.approx(from_index)
    assert from_mapping == pytest.approx(
        {"overall": 4 / 6, "easy": 0.875, "medium": 0.75, "hard": 0.375, "worst": 0.25,
         "std": np.std([1, 0.75, 0.5, 1, 0.25, 0.5])}
    )  # fmt: skip


@pytest.mark.parametrize("groups", [None, [0, 2]])
def test_classwise_summary_refuses_labels_without_a_class_of_y_true(groups):
    # Without groups, class 2 (always wrong) was left out: worst 100%, overall 50%.
    with pytest.raises(ValueError, match=r"classes \[2\] that are not in labels; give every"):
        classwise_summary([0, 1, 2, 2], [0, 1, 1, 1], groups, labels=[0, 1])


def test_classwise_summary_takes_the_group_names_of_a_report():
    # ClasswiseReport.groups: one name per class, aligned with its labels.
    names = [GROUPS[label] for label in sorted(GROUPS)]
    assert classwise_summary(Y_TRUE, Y_PRED, names) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )


@pytest.mark.parametrize(
    "groups, match",
    [
        # difficulty_groups(..., n_groups=5): groups 3 and 4 were left out of every group.
        ([0, 0, 1, 2, 3, 4], r"group indices 0 \(easy\).*got \[3, 4\]"),
        ([0, 0, 1, 1, 2, 2.5], r"got \[2.5\]"),
        (["easy", "easy", "medium", "medium", "hard", "worst"], r"named.*got \['worst'\]"),
        ({0: "easy", 1: "easy", 2: "medium", 3: "medium", 4: "hard", 5: "worst"}, "named"),
        ([True, True, False, False, True, True], "got booleans"),
    ],
)
def test_groups_other_than_easy_medium_hard_are_refused(groups, match):
    with pytest.raises(ValueError, match=match):
        classwise_summary(Y_TRUE, Y_PRED, groups)


def test_group_indices_held_as_objects_are_indices():
    # A pandas column of ints is an object array: it was read as names and refused.
    groups = np.array([0, 0, 1, 1, 2, 2], dtype=object)
    assert classwise_summary(Y_TRUE, Y_PRED, groups) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )


def test_an_empty_test_set_is_named():
    with pytest.raises(ValueError, match="No class of y_true has samples"):
        classwise_summary([], [])


@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_classes_missing_from_the_groups_are_refused(score):
    with pytest.raises(ValueError, match=r"classes \[5\] that are not in groups"):
        score(Y_TRUE, Y_PRED, {k: v for k, v in GROUPS.items() if k != 5})
    # Groups read back from JSON have string keys: no class of y_true is in them.
    with pytest.raises(ValueError, match="that are not in groups"):
        score(Y_TRUE, Y_PRED, {str(k): v for k, v in GROUPS.items()})


@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_groups_keyed_by_dates_score_a_datetime64_y(score):
    # Keys of datetime.date against a pandas column's datetime64[ns] were refused, its
    # classes named as integers of nanoseconds ([1704067200000000000, ...]).
    y = np.array(["2024-01-01", "2024-01-02", "2024-01-02"], "datetime64[ns]")
    groups = {date(2024, 1, 1): "easy", date(2024, 1, 2): "hard"}
    as_numpy = {np.datetime64(k, "ns"): v for k, v in groups.items()}  # (class_groups')
    expected = score(y, y[[0, 0, 2]], as_numpy)
    assert score(y, y[[0, 0, 2]], groups) == pytest.approx(expected, nan_ok=True)
    with pytest.raises(ValueError, match=r"classes \['2024-01-02T00:00:00.000000000'\] that"):
        score(y, y, {date(2024, 1, 1): "hard"})


@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
@pytest.mark.parametrize(
    "keys, kinds",
    [
        (
            [datetime(2024, 1, day, tzinfo=timezone.utc) for day in (1, 2)],
            "datetime and datetime with a time zone",
        ),
        (np.array([1, 2], "timedelta64[D]"), "datetime64 and duration"),
        ([1, 2], "number and datetime64"),
    ],
)
def test_groups_keyed_by_another_kind_than_datetime64_y_are_refused_as_a_mix(score, keys, kinds):
    # Keys with a time zone (pandas' Timestamps of a column with one), durations or numbers
    # were said not to be in the groups, as if the classes were missing from them.
    y = np.array(["2024-01-01", "2024-01-02", "2024-01-02"], "datetime64[ns]")
    groups = dict(zip(list(keys), ["easy", "hard"], strict=True))
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\): groups holds"):
        score(y, y, groups)


_DURATIONS = ("duration", "read as durations by pandas:", "pd.Timedelta")
_TEXT_KEYS = {
    # A report's labels and groups (its JSON's ISO text) were said not to be in the groups.
    "dates": (
        np.array(["2024-01-01", "2024-01-02", "2024-01-02"], "datetime64[ns]"),
        *("datetime64", "are read as dates by", "np.datetime64"),
    ),
    # A report's groups of durations (its JSON's text) were refused as a mix with no cure,
    # where those of dates are told how to read them.
    "days": (np.array([1, 2, 2], "timedelta64[D]"), *_DURATIONS),
    "nanoseconds": (np.array([1, 2, 2], "timedelta64[ns]"), *_DURATIONS),
}


@pytest.mark.parametrize("case", _TEXT_KEYS)
@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_groups_keyed_by_dates_or_durations_as_text_are_told_how_to_read_them(score, case):
    y, kind, said, reader = _TEXT_KEYS[case]
    key = np.datetime64 if reader == "np.datetime64" else pytest.importorskip("pandas").Timedelta
    groups = {str(label): group for label, group in class_groups(y, y).items()}
    cure = f"{{{reader}(label): group for label, group in groups.items()}}"
    with pytest.raises(ValueError, match=rf"^Mix of label input types \(string and {kind}\)"):
        score(y, y, groups)
    with pytest.raises(ValueError, match=re.escape(f"{said} {cure}.")):
        score(y, y, groups)
    read = {key(label): group for label, group in groups.items()}  # (the cure)
    expected = score(y, y[[0, 0, 2]], class_groups(y, y))
    assert score(y, y[[0, 0, 2]], read) == pytest.approx(expected, nan_ok=True)


@pytest.mark.parametrize("labels", [DAYS_NS, DAYS_NS.astype("datetime64[D]").astype(object)])
def test_dates_for_a_y_of_text_are_refused_without_the_cure_of_text_for_dates(labels):
    # The cure of a report's dates read back as text (np.asarray(labels, dtype=...)) was
    # given where y held the text and labels the dates.
    y = np.array([str(v) for v in labels])
    with pytest.raises(ValueError, match=r"^Mix of label input types .* y_true <U\d+ labels\.$"):
        per_class_accuracy(y, y, labels=labels)
    with pytest.raises(ValueError, match=r"^Mix of label input types .* y_true <U\d+ labels\.$"):
        classwise_summary(y, y, dict(zip(list(labels), ["easy", "hard"], strict=True)))


@pytest.mark.parametrize(
    "y",
    [
        np.array([1, 2], "timedelta64[W]"),
        np.array([datetime(2024, 1, day, tzinfo=timezone.utc) for day in (1, 2)]),
    ],
)
def test_text_for_durations_or_aware_dates_is_refused_without_the_cure_of_naive_dates(y):
    # np.asarray(labels, dtype='datetime64') reads no duration, and aware dates in UTC;
    # pandas reads no duration of weeks ("1 weeks").
    text = [str(v) for v in y]
    with pytest.raises(ValueError, match=r"^Mix of label input types .* labels\.$"):
        per_class_accuracy(y, y, labels=text)
    with pytest.raises(ValueError, match=r"^Mix of label input types .* labels\.$"):
        classwise_summary(y, y, dict(zip(text, ["easy", "hard"], strict=True)))


@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_groups_keyed_by_the_classes_numbers_as_text_are_refused_among_many_classes(score):
    # Among 20 classes, JSON's keys '0', '1', ... were taken for the classes 0, 1, ...
    # (NumPy's setdiff1d, sorting, compares them as text): a "Mix of label input types"
    # followed, where 5 classes are told that they are not in the groups.
    y = np.arange(40) % 20
    groups = json.loads(json.dumps(class_groups(y, y)))  # keys '0', '1', ...
    with pytest.raises(ValueError, match=r"classes \[0, 1, 2, .*\] that are not in groups"):
        score(y, y, groups)
    text = y.astype(str).astype(object)  # the same text, in an object array: classes
    score(text, text, groups)


@pytest.mark.parametrize("held", [dict, "Series"])
@pytest.mark.parametrize("labels", [[0, 1], [0, 1, 2, 3], [0, 1, 1, 2], ["0", "1", "2"]])
def test_labels_beside_groups_by_label_other_than_their_classes_are_refused(held, labels):
    # The labels were left unread: a class missing from them, one of no group, a class
    # twice, went without a word.
    groups = {0: "easy", 1: "medium", 2: "hard"}
    if held == "Series":
        groups = pytest.importorskip("pandas").Series(groups).iloc[::-1]  # (by its index)
    with pytest.raises(ValueError, match=r"^labels must be the classes of groups given by"):
        classwise_summary([0, 1, 2], [0, 1, 1], groups, labels=labels)
    # Their classes, in any order, are read as the groups are.
    same = classwise_summary([0, 1, 2], [0, 1, 1], groups, labels=[2, 0, 1])
    assert same == classwise_summary([0, 1, 2], [0, 1, 1], groups)
    # One group per class with its labels, as documented: the same groups.
    by_index = classwise_summary([0, 1, 2], [0, 1, 1], [2, 1, 0], labels=[2, 1, 0])
    assert by_index == classwise_summary([0, 1, 2], [0, 1, 1], groups)


@pytest.mark.parametrize("number", [int, float])
@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_groups_keyed_by_the_classes_numbers_as_text_are_told_how_to_read_them(score, number):
    # JSON's keys '0', '1', ... for the classes 0, 1, ...: told to build the groups again
    # with all the classes, which they had, where dates as text are told how to read them.
    y = (np.arange(6) % 3).astype(number)
    groups = json.loads(json.dumps(class_groups(y, y[[0, 1, 2, 0, 0, 2]])))
    cure = f"{{{number.__name__}(label): group for label, group in groups.items()}}"
    with pytest.raises(ValueError, match=re.escape(f"read them back, {cure}.")):
        score(y, y, groups)
    read = {number(label): group for label, group in groups.items()}  # (the cure)
    assert score(y, y, read) == score(y, y, class_groups(y, y[[0, 1, 2, 0, 0, 2]]))
    # Keys of other text are not numbers to read.
    with pytest.raises(ValueError, match=r"that are not in groups; build the groups with"):
        score(y, y, {"cat": "easy", "dog": "hard", "0": "easy"})


@pytest.mark.parametrize("score", [classwise_summary, group_accuracy])
def test_groups_keyed_by_boolean_classes_as_json_s_text_are_told_how_to_read_them(score):
    # JSON's keys "true" and "false": told to build the groups again, which had them.
    y = np.array([True, False, False])
    groups = json.loads(json.dumps(class_groups(y, ~y)))
    cure = '{label == "true": group for label, group in groups.items()}'
    with pytest.raises(ValueError, match=re.escape(f"read them back, {cure}.")):
        score(y, y, groups)
    read = {label == "true": group for label, group in groups.items()}  # (the cure)
    assert score(y, y, read) == pytest.approx(score(y, y, class_groups(y, ~y)), nan_ok=True)


@pytest.mark.parametrize("given", ["y_true", "y_pred", "sample_weight", "groups"])
def test_a_tensor_of_a_dtype_numpy_lacks_is_named_as_the_estimators_name_it(given):
    # Labels, weights or groups of a packed dtype were "A tensor was given of dtype
    # torch.uint3", naming no argument, where the estimators name theirs.
    y = np.array([0, 0, 1, 1, 2, 2])
    kwargs = {"y_true": y, "y_pred": y, "sample_weight": None, "groups": [0, 0, 1]}
    kwargs[given] = torch.zeros(len(kwargs[given] if given == "groups" else y), dtype=torch.uint3)
    with pytest.raises(TypeError, match=f"^{given} is a tensor of dtype torch.uint3, which"):
        classwise_summary(**kwargs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_tensors_are_read_as_the_estimators_read_them(device):
    # Weights of bfloat16 or requiring grad failed in NumPy ("Got unsupported ScalarType
    # BFloat16", "Can't call numpy() on Tensor that requires grad"), as did every tensor
    # on a GPU, where the estimators take them.
    y_true, y_pred = np.array([0, 0, 1, 1, 2, 2, 2]), np.array([0, 1, 1, 1, 2, 0, 2])
    weight, labels = np.array([1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0]), np.array([2, 0, 1])

    def tensor(a):
        return torch.as_tensor(a, device=device)

    for held in (tensor(weight).bfloat16(), tensor(weight).requires_grad_()):
        expected = per_class_accuracy(y_true, y_pred, labels, weight)
        np.testing.assert_array_equal(
            per_class_accuracy(tensor(y_true), tensor(y_pred), tensor(labels), held), expected
        )
        assert classwise_summary(
            tensor(y_true), tensor(y_pred), tensor([0, 1, 2]), tensor(labels), held
        ) == classwise_summary(y_true, y_pred, [0, 1, 2], labels, weight)
        assert worst_class_accuracy(tensor(y_true), tensor(y_pred), held) == 1 / 3
    accuracy = tensor(per_class_accuracy(y_true, y_pred)).requires_grad_()
    np.testing.assert_array_equal(difficulty_groups(accuracy), [2, 0, 1])
    report = classwise_report({"m": tensor(y_pred)}, tensor(y_true), labels=tensor(labels))
    assert report.labels == [2, 0, 1] and report.rows["m"]["worst"] == 0.5


@pytest.mark.parametrize(
    ("dtype", "error", "words"),
    [
        (torch.complex32, ValueError, "Complex data not supported: {} is a tensor of dtype"),
        (torch.uint3, TypeError, "{} is a tensor of dtype torch.uint3, which NumPy cannot"),
    ],
)
@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("y_true", lambda y, odd: per_class_accuracy(odd, y)),
        ("y_pred", lambda y, odd: per_class_accuracy(y, odd)),
        ("labels", lambda y, odd: per_class_accuracy(y, y, odd[:3])),
        ("sample_weight", lambda y, odd: per_class_accuracy(y, y, sample_weight=odd)),
        ("sample_weight", lambda y, odd: worst_class_accuracy(y, y, sample_weight=odd)),
        ("labels", lambda y, odd: class_groups(y, y, odd[:3])),
        ("groups", lambda y, odd: classwise_summary(y, y, odd[:3])),
        ("labels", lambda y, odd: classwise_summary(y, y, [0, 1, 2], odd[:3])),
        ("reference_accuracy", lambda y, odd: difficulty_groups(odd[:3])),
        ("y", lambda y, odd: classwise_report({"m": y}, odd)),
        ("models['m']", lambda y, odd: classwise_report({"m": odd}, y)),
        ("labels", lambda y, odd: classwise_report({"m": y}, y, labels=odd[:3])),
    ],
)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_tensors_of_a_dtype_numpy_lacks_are_named_by_their_argument(
    name, call, dtype, error, words
):
    # The error said "A tensor was given of dtype ...", naming no argument.
    y = np.array([0, 0, 1, 1, 2, 2])
    odd = torch.zeros(len(y), dtype=dtype)  # (a packed dtype holds no other values)
    with pytest.raises(error, match=re.escape(words.format(name))):
        call(y, odd)


def test_integer_sample_weights_score_as_repeated_samples():
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 6, 200), rng.integers(0, 6, 200)
    weight = rng.integers(0, 4, 200)
    weight[y_true == 2] = 0  # class 2 has no weight: it is not scored
    repeated = np.repeat(y_true, weight), np.repeat(y_pred, weight)
    weighted = dict(sample_weight=weight)
    np.testing.assert_allclose(
        per_class_accuracy(y_true, y_pred, np.arange(6), **weighted),
        per_class_accuracy(*repeated, np.arange(6)),
    )
    assert np.isnan(per_class_accuracy(y_true, y_pred, **weighted)[2])
    for score in (worst_class_accuracy, class_accuracy_std, hard_tercile_accuracy):
        assert score(y_true, y_pred, **weighted) == pytest.approx(score(*repeated))
    assert group_accuracy(y_true, y_pred, GROUPS, "hard", **weighted) == pytest.approx(
        group_accuracy(*repeated, GROUPS, "hard")
    )
    assert classwise_summary(y_true, y_pred, GROUPS, **weighted) == pytest.approx(
        classwise_summary(*repeated, GROUPS)
    )
    # The scorers pass the weights on, as scikit-learn's own do.
    fitted = LogisticRegression().fit(y_pred[:, None].astype(float), y_pred)
    assert worst_class_scorer(fitted, y_pred[:, None], y_true, **weighted) == pytest.approx(
        worst_class_accuracy(*repeated)
    )
    # A model's own terciles rank the classes that have weight, and only those.
    y_true, y_pred = np.repeat(np.arange(4), 4), np.array([0, 0, 0, 0, 1, 1, 1, 0, 2, 2, 0, 0,
                                                          3, 0, 0, 0])  # fmt: skip
    weight = np.where(y_true == 3, 0, 1)
    assert classwise_summary(y_true, y_pred, sample_weight=weight) == pytest.approx(
        classwise_summary(y_true[weight > 0], y_pred[weight > 0])
    )


@pytest.mark.parametrize("scale", [2.0**1022, 2.0**-1070])
def test_sample_weights_near_the_ends_of_the_floats_score_as_their_ratios(scale):
    # Weights near the largest float overflowed in a class's sum: its accuracy 0% or NaN,
    # the overall NaN. (Subnormal ones, exact multiples of the smallest, sum exactly.)
    y_true, y_pred = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 2, 0])
    weight = np.array([1.0, 2.0, 1.0, 1.0, 3.0, 1.0])
    expected = per_class_accuracy(y_true, y_pred, sample_weight=weight)
    np.testing.assert_array_equal(expected, [1 / 3, 1.0, 0.75])
    scaled = dict(sample_weight=weight * scale)
    np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred, **scaled), expected)
    for score in (worst_class_accuracy, class_accuracy_std, hard_tercile_accuracy):
        assert score(y_true, y_pred, **scaled) == score(y_true, y_pred, sample_weight=weight)
    assert classwise_summary(y_true, y_pred, **scaled) == classwise_summary(
        y_true, y_pred, sample_weight=weight
    )


def test_tiny_sample_weights_beside_large_ones_keep_their_class():
    # Weights scaled down by more than their sum needed: a class of tiny weights beside
    # one of huge weights underflowed to no weight and was scored NaN.
    weight = [1e308, 1e-300, 3e-300]
    np.testing.assert_array_equal(
        per_class_accuracy([0, 1, 1], [0, 1, 0], sample_weight=weight), [1.0, 0.25]
    )


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("y_true", lambda y, s: per_class_accuracy(s.T, y)),
        ("y_pred", lambda y, s: per_class_accuracy(y, s.T)),
        ("sample_weight", lambda y, s: per_class_accuracy(y, y, sample_weight=s)),
        ("labels", lambda y, s: per_class_accuracy(y, y, labels=s[:, :3])),
        ("reference_accuracy", lambda y, s: difficulty_groups(s[:, :3])),
    ],
)
def test_sparse_matrices_are_refused_by_name_as_scikit_learn_refuses_them(name, call):
    # NumPy made one an array of one object: "y_true should be a 1d array, got an array
    # of shape ()", or "setting an array element with a sequence".
    scipy_sparse = pytest.importorskip("scipy.sparse")
    y = np.array([0, 0, 1, 1, 2, 2])
    with pytest.raises(TypeError, match=f"^Sparse data was passed for {re.escape(name)}, but"):
        call(y, scipy_sparse.csr_matrix(y + 1.0))


@pytest.mark.parametrize(
    "weight, match",
    [
        (np.ones(3), r"shape \(200,\)"),
        (-np.ones(200), "non-negative"),
        (np.zeros(200), "sums to zero"),
        (np.ones(200) + 1j, r"^Complex data not supported: sample_weight has"),
        (torch.ones(200, dtype=torch.complex64), "sample_weight has dtype complex64"),
    ],
)
def test_bad_sample_weights_are_named(weight, match):
    # Complex weights were cast to their real part, with NumPy's warning alone.
    # (NumPy's ComplexWarning, as an error: no cast to try. It is in numpy.exceptions from
    # NumPy 1.25, in numpy alone before: the mark "error::numpy.exceptions.ComplexWarning"
    # stopped the whole run on NumPy 1.24, the floor, with an INTERNALERROR.)
    with warnings.catch_warnings(), pytest.raises(ValueError, match=match):
        warnings.simplefilter("error", getattr(np, "exceptions", np).ComplexWarning)
        per_class_accuracy(np.zeros(200), np.zeros(200), sample_weight=weight)


@pytest.fixture(scope="module")
def digits_subset():
    X, y = load_digits(return_X_y=True)
    return X[:300] / 16.0, y[:300]


@pytest.mark.parametrize(
    "scorer, function, sign",
    [
        (worst_class_scorer, worst_class_accuracy, 1),
        (hard_tercile_scorer, hard_tercile_accuracy, 1),
        (class_std_scorer, class_accuracy_std, -1),
        (make_group_scorer(GROUPS | {6: "hard", 7: "hard", 8: "easy", 9: "medium"}),
         lambda t, p: group_accuracy(t, p, GROUPS | {6: "hard", 7: "hard", 8: "easy", 9: "medium"}),
         1),
    ],
)  # fmt: skip
def test_scorers_score_the_predictions(digits_subset, scorer, function, sign):
    X, y = digits_subset
    clf = LogisticRegression(C=0.01, max_iter=200).fit(X[:150], y[:150])
    assert scorer(clf, X[150:], y[150:]) == pytest.approx(
        sign * function(y[150:], clf.predict(X[150:]))
    )


def test_classwise_scorers_add_fixed_groups_only_when_given():
    assert set(classwise_scorers()) == {
        "accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "class_std"
    }  # fmt: skip
    assert {"easy", "medium", "hard"} <= set(classwise_scorers(GROUPS))


@pytest.mark.parametrize("refit", ["worst_class", "hard", "balanced_accuracy"])
def test_grid_search_multi_metric_refits_on_the_chosen_scorer(
    digits_subset, refit, one_torch_thread_per_test
):
    X, y = digits_subset
    # Groups from a reference fitted and scored on data the search never sees.
    X_ref, y_ref = load_digits(return_X_y=True)
    reference = LogisticRegression(C=0.05, max_iter=300).fit(X_ref[300:900] / 16, y_ref[300:900])
    groups = class_groups(y_ref[900:], reference.predict(X_ref[900:] / 16))
    search = GridSearchCV(
        MR2LinearClassifier(max_iter=30, device="cpu"),
        {"c_bar": [None, 1.0], "C": [0.01, 1.0]},
        scoring=classwise_scorers(groups),
        refit=refit,
        cv=StratifiedKFold(3),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X, y)
    results = search.cv_results_
    assert search.best_index_ == np.argmax(results[f"mean_test_{refit}"])
    assert search.best_score_ == pytest.approx(results[f"mean_test_{refit}"].max())
    assert search.best_estimator_.get_params()["C"] == search.best_params_["C"]
    for name in ("accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "easy"):
        assert np.all((results[f"mean_test_{name}"] >= 0) & (results[f"mean_test_{name}"] <= 1))
    # Per fold, worst class <= hard tercile <= balanced accuracy.
    for split in range(3):
        worst, tercile, balanced = (
            results[f"split{split}_test_{name}"]
            for name in ("worst_class", "hard_tercile", "balanced_accuracy")
        )
        assert np.all(worst <= tercile + 1e-12) and np.all(tercile <= balanced + 1e-12)


def test_two_classes_are_easy_and_hard():
    from mr2_probe.metrics import classwise_summary, hard_tercile_accuracy

    y_true, y_pred = [0, 0, 1, 1], [0, 1, 1, 1]
    assert hard_tercile_accuracy(y_true, y_pred) == 0.5
    summary = classwise_summary(y_true, y_pred)
    assert summary["easy"] == 1.0 and summary["hard"] == 0.5 == summary["worst"]


@pytest.mark.parametrize("score", [
    lambda y: class_groups(y, y),
    lambda y: group_accuracy(y, y, {"a": "easy", 1: "hard"}),
    lambda y: classwise_summary(y, y, {"a": "easy", 1: "hard"}),
])  # fmt: skip
def test_labels_of_two_kinds_in_y_true_alone_are_refused_by_name(score):
    # np.unique of y_true, before per_class_accuracy's check, failed with "'<' not supported
    # between instances of 'int' and 'str'" (a pandas column of objects, say).
    y = np.array(["a", 1, "a", 1], dtype=object)
    mix = r"^Mix of label input types \(string and number\) in y_true"
    with pytest.raises(ValueError, match=mix):
        score(y)


def test_labels_of_two_kinds_are_refused_as_scikit_learn_refuses_them():
    # Strings against numbers matched nothing: every class scored 0% (and a front built on
    # such test labels "chose" ERM), where accuracy_score raises.
    with pytest.raises(ValueError, match="Mix of label input types"):
        per_class_accuracy(["a", "b", "c"], [0, 1, 2])
    with pytest.raises(ValueError, match="Mix of label input types"):
        per_class_accuracy(np.array([b"a", b"b"], dtype=object), [0, 1])
    with pytest.raises(ValueError, match="Mix of label input types"):
        per_class_accuracy(["a", "b"], np.array([b"a", b"b"], dtype=object))
    # Labels of one kind, whatever their arrays' dtypes; no labels are of no kind.
    labels = np.array(["a", "b"], dtype=object)
    np.testing.assert_array_equal(per_class_accuracy(labels, ["a", "a"]), [1.0, 0.0])
    assert per_class_accuracy(np.array(["a"])[:0], np.array([])).shape == (0,)
    # labels of another kind than y_true scored every class NaN without a word; an empty
    # labels gave a bare IndexError.
    with pytest.raises(ValueError, match="labels holds <U1 labels and y_true"):
        per_class_accuracy([0, 1, 1], [0, 1, 0], labels=["0", "1"])
    with pytest.raises(ValueError, match="labels must be a 1-D list of at least one class"):
        per_class_accuracy(["a", "b"], ["a", "b"], labels=[])


def test_labels_that_are_no_classes_and_groups_of_another_length_are_refused():
    # NaN labels were scored as a class of accuracy NaN, their samples lost; no samples gave
    # NumPy's "zero-size array to reduction operation minimum"; too few group indices a
    # bare IndexError.
    with pytest.raises(ValueError, match="Input y_true contains NaN"):
        per_class_accuracy([0.0, np.nan, 1.0], [0.0, np.nan, 1.0])
    with pytest.raises(ValueError, match="Input y_pred contains NaN"):
        per_class_accuracy([0.0, 1.0], [0.0, np.nan])
    with pytest.raises(ValueError, match=r"Input y_true holds 1 missing label \(NaN\)"):
        per_class_accuracy(np.array([0.0, np.nan, 1.0], dtype=object), [0.0, 0.0, 1.0])
    # NaT, the NaN of dates: its samples were dropped without a word.
    dates = np.array(["2020-01-01", "NaT", "NaT", "2020-01-02"], dtype="datetime64[D]")
    with pytest.raises(ValueError, match="Input y_true contains NaT"):
        worst_class_accuracy(dates, dates)
    for score in (worst_class_accuracy, class_accuracy_std, hard_tercile_accuracy):
        with pytest.raises(ValueError, match="No class of y_true has samples"):
            score([], [])
    with pytest.raises(ValueError, match=r"one group index per class \(3, .* shape \(2,\)"):
        classwise_summary([0, 1, 2], [0, 1, 1], groups=[0, 1])


@pytest.mark.parametrize("nat", ["numpy", "pandas"])
def test_a_nat_held_as_an_object_is_refused(nat):
    # A NaT among the Timestamps of a column with a time zone (np.asarray gives objects)
    # was scored as a class that sorted nowhere: the class after it scored NaN.
    if nat == "pandas":
        pd = pytest.importorskip("pandas")
        days = pd.Series(pd.to_datetime(["2024-01-01", None, "2024-01-02"]).tz_localize("UTC"))
    else:
        days = np.array(["2024-01-01", "NaT", "2024-01-02"], "datetime64[D]").astype("O")
        days[1] = np.datetime64("NaT")  # (astype makes it None)
    y = np.asarray(days)[[0, 1, 2, 2]]
    assert y.dtype == object
    as_missing = r"^Input y_(true|pred) holds 1 missing label \(NaT\) among its 4, at position 1"
    with pytest.raises(ValueError, match=as_missing.replace("(true|pred)", "true")):
        per_class_accuracy(y, y)
    with pytest.raises(ValueError, match=as_missing.replace("(true|pred)", "pred")):
        per_class_accuracy(y[[0, 0, 2, 2]], y)


@pytest.mark.parametrize("shape", [(), (2, 2, 2), (4, 2)])
@pytest.mark.parametrize(
    "score",
    [
        per_class_accuracy,
        worst_class_accuracy,
        class_accuracy_std,
        hard_tercile_accuracy,
        class_groups,
        classwise_summary,
        lambda y_true, y_pred: group_accuracy(y_true, y_pred, {0: "hard"}),
    ],
)
def test_labels_of_no_dimension_of_three_or_of_columns_are_refused_by_name(score, shape):
    # A single label failed with "len() of unsized object", labels of 3 dimensions with
    # an IndexError; labels of several columns were "y should be ...", neither argument.
    labels = np.zeros(shape, dtype=int)
    one_d = np.zeros(labels.size, dtype=int)
    for y_true, y_pred, name in ((labels, one_d, "y_true"), (one_d, labels, "y_pred")):
        message = rf"^{name} should be a 1d array, got an array of shape {re.escape(str(shape))}"
        with pytest.raises(ValueError, match=message):
            score(y_true, y_pred)


def test_scores_given_for_labels_are_refused_by_name_with_the_cure():
    # predict_proba's table for y_pred was "y should be a 1d array", which named neither
    # argument and left the user to guess which.
    y = np.array([0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match=r"^y_pred should be .* shape \(6, 3\).*argmax"):
        per_class_accuracy(y, np.eye(3)[y])


@pytest.mark.parametrize(
    "score",
    [per_class_accuracy, worst_class_accuracy, hard_tercile_accuracy, class_groups,
     classwise_summary],
)  # fmt: skip
@pytest.mark.parametrize("y_true", [np.array([0, 0, 1, 1]), np.array([0.0, 0.0, 1.0, 1.0]),
                                    np.array([False, False, True, True]),
                                    np.array([0, 0, 1, 1], dtype=object)])  # fmt: skip
def test_scores_of_one_column_against_integer_labels_are_refused(score, y_true):
    # predict_proba's column of the positive class scored every class 0% without a word,
    # where scikit-learn refuses such continuous predictions (numbers held as objects, a
    # pandas column of dtype object's, too: either side).
    proba = np.array([0.1, 0.4, 0.8, 0.7])
    refused = r"^y_pred holds values with a fractional part \(0.1, "
    for y_pred in (proba, proba.astype(object)):
        with pytest.raises(ValueError, match=refused):
            score(y_true, y_pred)
    # Integers as floats, and labels that are floats themselves, stay labels.
    assert worst_class_accuracy(y_true, (proba > 0.5).astype(float)) == 1.0
    assert worst_class_accuracy([0.5, 1.5], [0.5, 1.5]) == 1.0


@pytest.mark.parametrize("score", [per_class_accuracy, class_groups, classwise_summary])
def test_a_class_with_a_fraction_listed_in_labels_is_no_score(score):
    # Classes 0, 0.5 and 1, the test split without a sample of 0.5: a prediction of 0.5,
    # a class that labels= lists, was refused as a score against integer labels.
    y_true, y_pred = [0.0, 0.0, 1.0, 1.0], np.array([0.0, 0.5, 1.0, 1.0])
    score(y_true, y_pred, labels=[0.0, 0.5, 1.0])
    np.testing.assert_array_equal(
        per_class_accuracy(y_true, y_pred, labels=[0.0, 0.5, 1.0]), [0.5, np.nan, 1.0]
    )
    # A score that is no class listed stays refused.
    with pytest.raises(ValueError, match=r"^y_pred holds values with a fractional part \(0.5\)"):
        score(y_true, y_pred, labels=[0.0, 1.0])


def test_label_kinds_and_shapes_are_checked_before_scoring():
    # Bytes labels (h5py's strings) against text ones scored every class 0.
    with pytest.raises(ValueError, match="Mix of label input types"):
        per_class_accuracy([b"a", b"b"], ["a", "b"])
    # The message names the two inputs that differ.
    with pytest.raises(ValueError, match="y_true holds .* and y_pred"):
        per_class_accuracy([0, 1], ["0", "1"])
    with pytest.raises(ValueError, match="labels must be a 1-D list"):
        per_class_accuracy([0, 1, 1], [0, 1, 0], labels=[[0, 1]])
    for weight in ([np.inf, 1.0], [np.nan, 1.0]):
        with pytest.raises(ValueError, match="finite"):
            worst_class_accuracy([0, 1], [0, 1], sample_weight=weight)


@pytest.mark.parametrize("text", [np.str_, np.bytes_])
def test_numpy_s_text_held_as_objects_is_text(text):
    # np.str_ among str (np.bytes_ among bytes) was a kind of its own, without a name:
    # "Mix of label input types ( and str)" for labels all text.
    y_true = np.array([text("a"), "b", "b"], dtype=object)
    if text is np.bytes_:
        y_true = np.array([text(b"a"), b"b", b"b"], dtype=object)
    y_pred = y_true[[0, 1, 0]].astype(y_true[1:].astype(text).dtype)  # (NumPy's own array)
    np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), [1.0, 0.5])
    np.testing.assert_array_equal(per_class_accuracy(y_pred, y_true), [0.5, 1.0])


@pytest.mark.parametrize(
    "y_true, y_pred, kinds",
    [
        # Bytes against text was called "string and number", though neither is a number.
        (np.array([b"a"]), np.array(["a"]), "bytes and string"),
        (np.array([b"a", b"b"], dtype=object), [0, 1], "bytes and number"),
        (["a", "b"], [0, 1], "string and number"),
        # A date never equals a datetime (nor a naive datetime an aware one): every class
        # scored 0%, where scikit-learn refuses them.
        (np.array([date(2024, 1, 1)]), np.array([datetime(2024, 1, 1)]), "date and datetime"),
        (
            np.array([datetime(2024, 1, 1, tzinfo=timezone.utc)]),
            np.array([datetime(2024, 1, 1)]),
            "datetime and datetime with a time zone",
        ),
        # NumPy's datetime64 (a tz-aware pandas column's .values) are naive: scored 0%.
        (
            np.array([datetime(2024, 1, 1, tzinfo=timezone.utc)]),
            np.array(["2024-01-01"], "datetime64[ns]"),
            "datetime and datetime with a time zone",
        ),
        # Dates and durations counted as numbers: a date among numbers failed in np.unique
        # ("'<' not supported between instances of 'int' and 'datetime.date'"), datetime64
        # against integers (or durations) scored every class 0% and NaN as labels, NumPy's
        # durations as labels of dates failed with its casting error.
        (np.array(["2024-01-01"], "datetime64[ns]"), [0], "number and datetime64"),
        (np.array([1], "timedelta64[D]"), [1], "number and duration"),
        (
            np.array([1], "timedelta64[D]"),
            np.array(["2024-01-01"], "datetime64[ns]"),
            "datetime64 and duration",
        ),
        (np.array([timedelta(days=1)]), np.array([date(2024, 1, 1)]), "date and duration"),
        # A time of day counted as a number too: against integer codes, scored 0%.
        (np.array([time(5)]), [5], "number and time"),
    ],
)
def test_a_mix_of_label_types_names_the_kinds_it_found(y_true, y_pred, kinds):
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\): y_true holds"):
        per_class_accuracy(y_true, y_pred)
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\): labels holds"):
        per_class_accuracy(y_pred, y_pred, labels=y_true)


@pytest.mark.parametrize(
    "y, kinds",
    [
        # Kinds mixed in one array of objects: np.unique's sort raised a TypeError first.
        (np.array([b"a", "a", 1], dtype=object), "bytes, string and number"),
        (np.array([date(2024, 1, 1), 1], dtype=object), "number and date"),
        # NumPy's durations held as objects (an integer to NumPy) among numbers
        (np.array([np.timedelta64(1, "D"), 1], dtype=object), "number and duration"),
    ],
)
def test_a_mix_within_one_array_is_named_by_that_array(y, kinds):
    # Named by both arrays' dtypes, "y_true holds object labels and y_pred int64 labels",
    # where y_true alone held the mix.
    numbers = np.ones(len(y))
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\) in y_true\.$"):
        per_class_accuracy(y, numbers)
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\) in y_pred\.$"):
        per_class_accuracy(numbers, y)
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\): labels holds"):
        per_class_accuracy(numbers, numbers, labels=y)


def test_numpy_s_booleans_held_as_objects_are_numbers_as_python_s():
    # (np.bool_ is no numbers.Number: a kind of its own, it was a mix with Python's bools)
    y_true = np.array([np.True_, np.False_, np.True_], dtype=object)
    np.testing.assert_array_equal(per_class_accuracy(y_true, [True, False, False]), [1.0, 0.5])


@pytest.mark.parametrize(
    "classes, kind",
    [
        (lambda pd: pd.cut(pd.Series([1, 5]), [0, 2, 6]), "Interval"),
        (lambda pd: pd.Series(pd.period_range("2024-01", periods=2, freq="M")), "Period"),
    ],
)
def test_other_objects_against_their_codes_are_a_mix_named_by_type(classes, kind):
    # pd.cut's bins (a column of periods) against the integer codes a model was fitted on
    # counted as numbers: every class scored 0%.
    y = np.asarray(classes(pytest.importorskip("pandas")))[[0, 1, 1]]
    with pytest.raises(ValueError, match=rf"^Mix of label input types \(number and {kind}\)"):
        per_class_accuracy(y, [0, 1, 1])
    np.testing.assert_array_equal(per_class_accuracy(y, y[[0, 0, 1]]), [1.0, 0.5])


@pytest.mark.parametrize("unit", ["D", "s", "us", "ns"])
@pytest.mark.parametrize("held", ["date", "datetime", "Timestamp", "datetime64"])
def test_dates_held_as_objects_are_scored_against_datetime64_of_any_unit(unit, held):
    # NumPy compared them through the datetime64's item(): an integer at nanoseconds (a
    # pandas column's unit), a date at days; every class scored 0%.
    days = np.array(["2024-01-01", "2024-01-02", "2024-01-02"], "datetime64[D]")
    y = days.astype(f"datetime64[{unit}]")
    objects = days.astype(object)  # datetime.date
    if held == "datetime":
        objects = days.astype("datetime64[us]").astype(object)
    elif held == "Timestamp":
        objects = np.array(list(pytest.importorskip("pandas").to_datetime(days)), dtype=object)
    elif held == "datetime64":  # NumPy's own, at days, held as objects
        objects = np.array(list(days), dtype=object)
    for y_true, y_pred in ((y, objects), (objects, y)):
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), [1.0, 1.0])
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred, labels=days[:2]), [1, 1])
        assert classwise_summary(y_true, y_pred)["overall"] == 1.0
    at_five = np.array([datetime(2024, 1, 1, 5), datetime(2024, 1, 2, 5)] * 2, dtype=object)
    np.testing.assert_array_equal(per_class_accuracy(days[[0, 1, 0, 1]], at_five), [0.0, 0.0])


@pytest.mark.parametrize("unit", ["s", "ns"])
@pytest.mark.parametrize("held", ["date", "datetime", "Timestamp"])
def test_dates_held_as_objects_are_scored_with_labels_and_groups_of_datetime64(unit, held):
    # labels (class_groups' keys of a pandas column) of datetime64 at another unit than
    # days against y and predictions both held as objects: "'<' not supported between
    # instances of 'int' and 'datetime.date'", and the groups said to miss every class.
    days = np.array(["2024-01-01", "2024-01-02", "2024-01-02", "2024-01-03"], "datetime64[D]")
    y, pred = days.astype(f"datetime64[{unit}]"), days[[0, 0, 2, 3]].astype(f"datetime64[{unit}]")
    objects = {
        "date": lambda a: a.astype("datetime64[D]").astype(object),
        "datetime": lambda a: a.astype("datetime64[us]").astype(object),
        "Timestamp": lambda a: np.array(list(pytest.importorskip("pandas").to_datetime(a)), object),
    }[held]
    labels = y[[3, 0, 1]]
    expected = per_class_accuracy(y, pred, labels=labels)
    np.testing.assert_array_equal(per_class_accuracy(objects(y), objects(pred), labels), expected)
    groups = class_groups(y, pred)
    assert classwise_summary(objects(y), objects(pred), groups) == pytest.approx(
        classwise_summary(y, pred, groups), nan_ok=True
    )
    assert group_accuracy(objects(y), objects(pred), groups) == 0.5


@pytest.mark.parametrize("unit", ["D", "us", "ns"])
@pytest.mark.parametrize("held", ["timedelta", "Timedelta", "timedelta64"])
def test_durations_held_as_objects_are_scored_against_timedelta64_of_any_unit(unit, held):
    # As dates: NumPy compared them through the timedelta64's item(), an integer at
    # nanoseconds (a pandas column's unit); every class scored 0%.
    days = np.array([1, 2, 2], "timedelta64[D]")
    y = days.astype(f"timedelta64[{unit}]")
    objects = days.astype(object)  # datetime.timedelta
    if held == "Timedelta":
        objects = np.array(list(pytest.importorskip("pandas").to_timedelta(days)), dtype=object)
    elif held == "timedelta64":  # NumPy's own, at days, held as objects
        objects = np.array(list(days), dtype=object)
    for y_true, y_pred in ((y, objects), (objects, y)):
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), [1.0, 1.0])
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred, labels=days[:2]), [1, 1])
        assert classwise_summary(y_true, y_pred)["overall"] == 1.0
    np.testing.assert_array_equal(per_class_accuracy(y, y, labels=objects[:2]), [1.0, 1.0])
    # An hour more is another class.
    later = (days + np.timedelta64(1, "h")).astype(object)
    np.testing.assert_array_equal(per_class_accuracy(y, later), [0.0, 0.0])


@pytest.mark.parametrize("kind", ["datetime64", "timedelta64"])
def test_numpy_s_times_held_as_objects_are_scored_against_datetime_s(kind):
    # Both arrays of objects (list() of a pandas column's .values against its .dt.date):
    # NumPy's at nanoseconds compared through their item(), an integer; every class 0%.
    days = np.array([1, 2, 2], "timedelta64[D]")
    if kind == "datetime64":
        days = np.datetime64("2024-01-01") + days
    numpy = np.array(list(days.astype(f"{kind}[ns]")), dtype=object)
    python = days.astype(object)  # datetime.date (timedelta)
    for y_true, y_pred in ((numpy, python), (python, numpy)):
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred[[0, 0, 2]]), [1.0, 0.5])
        assert classwise_summary(y_true, y_pred)["overall"] == 1.0
        # Groups keyed by the other's dates: said to miss every class.
        groups = class_groups(y_pred, y_pred[[0, 0, 2]])
        assert classwise_summary(y_true, y_true, groups)["hard"] == 1.0


@pytest.mark.parametrize("kind", ["datetime64", "timedelta64"])
def test_numpy_s_times_held_as_objects_in_labels_score_datetime_s(kind):
    # labels= (or group keys) of NumPy's held as objects for a y of datetime's: each
    # compared through its item(), an integer of nanoseconds ("'<' not supported").
    days = np.array([1, 2, 2], "timedelta64[D]")
    if kind == "datetime64":
        days = np.datetime64("2024-01-01") + days
    python = days.astype(object)  # datetime.date (timedelta)
    labels = np.array(list(days[[2, 0]].astype(f"{kind}[ns]")), dtype=object)
    np.testing.assert_array_equal(per_class_accuracy(python, python[[0, 0, 2]], labels), [0.5, 1])
    assert list(class_groups(python, python[[0, 0, 2]], labels).values()) == ["hard", "easy"]
    summary = classwise_summary(python, python, groups=[0, 2], labels=labels)
    assert summary["hard"] == 1.0


@pytest.mark.parametrize(
    "unit, held",
    [
        ("D", "date"),
        ("ns", "date"),  # "'>' not supported between instances of 'int' and 'datetime.date'"
        ("D", "datetime"),  # "can't compare datetime.datetime to datetime.date"
        ("ns", "datetime"),
        ("ns", "Timestamp"),
        ("ns", "timedelta"),
        ("ns", "Timedelta"),
    ],
)
def test_numpy_s_times_among_datetime_s_in_one_array_are_scored_as_numpy_s(unit, held):
    # NumPy's datetime64 (timedelta64) scalars and datetime's dates (durations) in one
    # array of objects (a column's .values concatenated with another's .dt.date): sorting
    # them failed with Python's TypeError. Scored as they are against NumPy's array.
    days = np.array([1, 2, 2, 3], "timedelta64[D]")
    if held not in ("timedelta", "Timedelta"):
        days = np.datetime64("2024-01-01") + days
    numpy = days.astype(f"{days.dtype.name[:-3]}[{unit}]")
    python = days.astype(object)  # datetime.date (timedelta)
    if held == "datetime":
        python = days.astype("datetime64[us]").astype(object)
    elif held in ("Timestamp", "Timedelta"):
        pd = pytest.importorskip("pandas")
        read = pd.to_datetime if held == "Timestamp" else pd.to_timedelta
        python = np.array(list(read(days)), dtype=object)
    mixed = np.array([*list(numpy[:2]), *python[2:]], dtype=object)  # (two of each)
    pred = numpy[[0, 0, 2, 3]]
    expected = per_class_accuracy(numpy, pred)
    np.testing.assert_array_equal(expected, [1.0, 0.5, 1.0])
    np.testing.assert_array_equal(per_class_accuracy(mixed, pred), expected)
    np.testing.assert_array_equal(per_class_accuracy(numpy, mixed[[0, 0, 2, 3]]), expected)
    np.testing.assert_array_equal(
        per_class_accuracy(numpy, pred, labels=mixed[[3, 0, 1]]), [1, 1, 0.5]
    )
    assert classwise_summary(mixed, pred) == classwise_summary(numpy, pred)
    assert list(class_groups(mixed, pred).values()) == ["easy", "hard", "medium"]


def test_dates_and_datetimes_beside_numpy_s_in_one_array_are_refused_as_a_mix():
    # (NumPy's datetime64 scalars alone are either; datetime's date and datetime never
    # equal one another)
    y = np.array([np.datetime64("2024-01-01"), date(2024, 1, 2), datetime(2024, 1, 3)] * 2)
    with pytest.raises(ValueError, match=r"^Mix of label input types \(date and datetime\)"):
        per_class_accuracy(y, y)


@pytest.mark.parametrize("kind", ["datetime64", "timedelta64"])
def test_times_beyond_the_finest_unit_among_them_are_refused_not_wrapped(kind):
    # NumPy casts the year 3000 beside nanoseconds to 1830 without a word: two classes
    # would be scored as others.
    if kind == "datetime64":
        y = np.array([np.datetime64("2024-01-01T00:00:00.000000001"), date(3000, 1, 2)] * 2)
    else:
        y = np.array([np.timedelta64(1, "ns"), timedelta(days=200_000)] * 2)
    cure = re.escape(f"np.asarray(y, dtype='{kind}[us]')")
    with pytest.raises(ValueError, match=rf"^Labels of .* do not all fit in {kind}\[ns\].*{cure}"):
        per_class_accuracy(y, y)
    read = np.asarray(y, f"{kind}[us]")  # (the cure)
    np.testing.assert_array_equal(per_class_accuracy(read, read[[0, 0, 2, 3]]), [1, 0.5])


def test_timestamps_held_as_objects_keep_their_nanoseconds():
    # Taken as datetime's, cut to microseconds: two classes 1 ns apart were scored as one
    # (y held as Timestamps) or each 0% (predictions held so).
    pd = pytest.importorskip("pandas")
    times = pd.to_datetime(["2024-01-01 00:00:00.000000001", "2024-01-01 00:00:00.000000002"])
    y, objects = np.asarray(times)[[0, 1, 1]], np.array(list(times), dtype=object)[[0, 1, 1]]
    for y_true, y_pred in ((y, objects), (objects, y)):
        np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), [1.0, 1.0])
    np.testing.assert_array_equal(per_class_accuracy(y, y, labels=objects[:2]), [1.0, 1.0])


def test_pandas_missing_labels_are_named_as_missing():
    # pd.NA was counted as a number: "str and number", where no number was given.
    pd = pytest.importorskip("pandas")
    with pytest.raises(ValueError, match=r"^Input y_true holds 1 missing label \(pd.NA\) "):
        worst_class_accuracy(pd.array(["a", "b", None], dtype="string"), np.array(["a", "b", "b"]))
    # Only missing labels (a column lost in a merge) failed in np.unique: "'<' not
    # supported between instances of 'NoneType' and 'NoneType'" (pd.NA: "ambiguous").
    for missing in (None, pd.NA):
        y = np.array([missing, missing], dtype=object)
        for score in (per_class_accuracy, class_groups, classwise_summary):
            with pytest.raises(ValueError, match=r"^Input y_true holds only missing labels"):
                score(y, y)


@pytest.mark.parametrize("missing", ["None", "pd.NA"])
@pytest.mark.parametrize("classes", [["a", "b"], [1, 2]])
def test_missing_labels_among_classes_are_refused_as_missing(classes, missing):
    # Among real labels a missing one was a kind of its own: "Mix of label input types
    # (str and None): y_true holds object labels and y_pred object labels", for both
    # arrays alike, where the estimators refuse it as a missing label (and a y of pandas'
    # "string" dtype failed in scikit-learn's checks: "boolean value of NA is ambiguous").
    pd = pytest.importorskip("pandas")
    value = None if missing == "None" else pd.NA
    y = np.array([*classes, value, *classes, value], dtype=object)
    full = np.array(classes * 3, dtype=object)
    as_missing = rf"^Input y_(true|pred) holds 2 missing labels \({missing}\) among its 6, "
    for score in (per_class_accuracy, worst_class_accuracy, class_groups, classwise_summary):
        with pytest.raises(ValueError, match=as_missing.replace("(true|pred)", "true")):
            score(y, full)
        with pytest.raises(ValueError, match=as_missing.replace("(true|pred)", "pred")):
            score(full, y)
    if classes[0] == "a":  # (a pandas column of dtype "string")
        column = pd.Series(pd.array(["a", "b", None, "a"], dtype="string"))
        with pytest.raises(ValueError, match=r"^Input y_true holds 1 missing label \(pd.NA\) "):
            per_class_accuracy(column, column)
    # labels= naming a missing label was a list of classes of two kinds ("Mix of label
    # input types (string and None)"): it is named as missing, at its position.
    as_missing = rf"^Input labels holds 1 missing label \({missing}\) among its 3, at position 2"
    with pytest.raises(ValueError, match=as_missing):
        per_class_accuracy(full, full, labels=[*classes, value])


@pytest.mark.parametrize(
    "score, message",
    [
        # The second 1 was scored NaN (recall_score gives [1, 0.5, 1]).
        (
            lambda: per_class_accuracy([0, 0, 1, 1, 2], [0, 1, 1, 1, 2], labels=[1, 0, 1]),
            "labels must hold each class once, got [1, 0, 1] (1 is there twice).",
        ),
        # Class 1, the best, was put in "hard" (its second copy scored NaN, ranked last).
        (
            lambda: class_groups([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0], labels=[2, 1, 1, 0]),
            "labels must hold each class once, got [2, 1, 1, 0] (1 is there twice).",
        ),
        (
            lambda: classwise_summary([0, 1, 2], [0, 1, 2], groups=[0, 1, 2], labels=[0, 1, 1]),
            "labels must hold each class once, got [0, 1, 1] (1 is there twice).",
        ),
        (
            lambda: per_class_accuracy(["a", "b"], ["a", "b"], labels=["b", "a", "b", "a", "b"]),
            "labels must hold each class once, got ['b', 'a', 'b', 'a', 'b'] ('a' is there "
            "twice, 'b' is there 3 times).",
        ),
        # Dates (durations) at nanoseconds were named as integers: 1704067200000000000.
        (
            lambda: per_class_accuracy(DAYS_NS, DAYS_NS, labels=DAYS_NS[[0, 1, 0]]),
            "labels must hold each class once, got ['2024-01-01T00:00:00.000000000', "
            "'2024-01-02T00:00:00.000000000', '2024-01-01T00:00:00.000000000'] "
            "('2024-01-01T00:00:00.000000000' is there twice).",
        ),
        (
            lambda: class_groups(
                DAYS_NS - DAYS_NS[0], DAYS_NS - DAYS_NS[0], labels=np.zeros(2, "m8[ns]")
            ),
            "labels must hold each class once, got ['0 nanoseconds', '0 nanoseconds'] "
            "('0 nanoseconds' is there twice).",
        ),
    ],
)
def test_labels_holding_a_class_twice_are_refused(score, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        score()


def test_fewer_classes_than_groups_spread_from_easy_to_hard():
    # Rounded positions on the scale of groups: the middle of three classes in four groups
    # is group 2 (1.5 rounds to 2), not 1.
    np.testing.assert_array_equal(difficulty_groups([0.9, 0.5, 0.1], n_groups=4), [0, 2, 3])


def test_a_group_scores_the_mean_of_its_classes():
    # Three hard classes at 1, 1 and 0: their mean (2/3), not their median.
    y = np.repeat(np.arange(9), 2)
    pred = y.copy()
    pred[y == 8] = 0
    groups = {k: ("easy", "medium", "hard")[k // 3] for k in range(9)}
    summary = classwise_summary(y, pred, groups)
    assert summary["hard"] == pytest.approx(2 / 3)
    assert group_accuracy(y, pred, groups, "hard") == pytest.approx(2 / 3)


def test_a_group_without_samples_is_nan_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(group_accuracy([0, 0], [0, 0], {0: "easy", 1: "hard"}, "hard"))


def test_group_scorers_score_their_own_group():
    X, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=1000).fit(X[:, :1], y)  # weak: groups differ
    pred = model.predict(X[:, :1])
    groups = class_groups(y, pred)
    scores = {g: group_accuracy(y, pred, groups, g) for g in ("easy", "medium", "hard")}
    assert len(set(scores.values())) == 3
    for g, score in scores.items():
        assert make_group_scorer(groups, g)(model, X[:, :1], y) == pytest.approx(score)
    scorers = classwise_scorers(groups)
    for g, score in scores.items():
        assert scorers[g](model, X[:, :1], y) == pytest.approx(score)
    # A group that holds no class gets no scorer (it would raise inside a search).
    assert set(classwise_scorers({0: "easy", 1: "hard"})) == {
        "accuracy", "balanced_accuracy", "worst_class", "hard_tercile", "class_std", "easy",
        "hard",
    }  # fmt: skip


def test_every_classwise_scorer_takes_a_metadata_request():
    # "accuracy" and "balanced_accuracy" were names: under metadata routing a weighted
    # search asked for set_score_request on each scorer, which a name has not
    # (AttributeError), and the dictionary's entries could not be called either.
    X, y = load_iris(return_X_y=True)
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    with sklearn.config_context(enable_metadata_routing=True):
        scorers = {
            name: scorer.set_score_request(sample_weight=True)
            for name, scorer in classwise_scorers({0: "easy", 1: "medium", 2: "hard"}).items()
        }
        model = LogisticRegression(max_iter=500).set_fit_request(sample_weight=True)
        search = GridSearchCV(model, {"C": [1.0]}, scoring=scorers, refit="accuracy", cv=3)
        search.fit(X, y, sample_weight=weight)
    fitted = search.best_estimator_
    assert scorers["accuracy"](fitted, X, y, sample_weight=weight) == pytest.approx(
        fitted.score(X, y, sample_weight=weight)
    )
    assert scorers["balanced_accuracy"](fitted, X, y) == pytest.approx(
        balanced_accuracy_score(y, fitted.predict(X))
    )


def test_classwise_scorers_are_new_at_each_call():
    # A request set on one call's scorers (a weighted search's) is not another call's, nor
    # the module's ready-made scorers' (shared, a later unweighted search was sent weights).
    with sklearn.config_context(enable_metadata_routing=True):
        for scorer in classwise_scorers({0: "easy", 1: "hard"}).values():
            scorer.set_score_request(sample_weight=True)
        again = classwise_scorers({0: "easy", 1: "hard"})
        for scorer in [*again.values(), worst_class_scorer, hard_tercile_scorer, class_std_scorer]:
            # (scikit-learn 1.6 lists no request not set; later ones list it as None)
            assert scorer.get_metadata_routing().score.requests.get("sample_weight") is None


def test_the_balanced_accuracy_scorer_is_balanced():
    X, y = load_iris(return_X_y=True)
    keep = np.r_[0:50, 50:60, 100:150]  # 50, 10 and 50 samples
    X, y = X[keep][:, :1], y[keep]
    model = LogisticRegression(max_iter=1000).fit(X, y)
    scorer = check_scoring(model, classwise_scorers()["balanced_accuracy"])
    assert scorer(model, X, y) == pytest.approx(balanced_accuracy_score(y, model.predict(X)))
    assert scorer(model, X, y) != pytest.approx(model.score(X, y))


def test_a_single_label_is_refused_by_name():
    # A scalar labels has no length: a bare TypeError "len() of unsized object".
    with pytest.raises(ValueError, match="labels must be a 1-D list"):
        per_class_accuracy([0, 1], [0, 1], labels=1)


def test_a_complex_nan_label_is_refused():
    y = np.array([1 + 0j, np.nan, 2 + 0j])
    with pytest.raises(ValueError, match="Input y_true contains NaN"):
        per_class_accuracy(y, np.array([1 + 0j, 1 + 0j, 2 + 0j]))


def test_difficulty_groups_break_many_ties_by_class_order():
    # Thirty classes at four accuracies: ties straddle the group boundaries.
    acc = np.random.default_rng(0).integers(0, 4, 30) / 4
    groups = difficulty_groups(acc)
    np.testing.assert_array_equal(np.bincount(groups), [10, 10, 10])
    for i in range(30):
        for j in range(i + 1, 30):
            if acc[i] == acc[j]:  # the earlier class of a tie is never in a harder group
                assert groups[i] <= groups[j], (i, j)


def test_an_empty_weighted_test_set_scores_no_class():
    # As without weights: no class, no score (not "sample_weight sums to zero").
    assert per_class_accuracy(np.array([]), np.array([]), sample_weight=[]).shape == (0,)


@pytest.mark.parametrize(
    "y_true, y_pred, labels, expected",
    [
        (np.array([], dtype=str), np.array([]), None, []),
        (np.array([]), np.array([]), ["a", "b"], [np.nan, np.nan]),
        (np.array([], dtype=str), np.array([], dtype=int), ["a"], [np.nan]),
    ],
)
def test_an_empty_test_set_of_other_dtypes_scores_no_class_without_a_warning(
    y_true, y_pred, labels, expected
):
    # NumPy 1.24 (the floor) warned "FutureWarning: elementwise comparison failed" where
    # empty labels of two dtypes (no kind: not a mix) were compared.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = per_class_accuracy(y_true, y_pred, labels)
    np.testing.assert_array_equal(acc, expected)


def test_a_group_scores_the_classes_it_has_samples_of():
    # The fold holds class 4 (25%) but no sample of class 5, the other hard class.
    keep = Y_TRUE != 5
    assert group_accuracy(Y_TRUE[keep], Y_PRED[keep], GROUPS, "hard") == pytest.approx(0.25)
    assert classwise_summary(Y_TRUE[keep], Y_PRED[keep], GROUPS)["hard"] == pytest.approx(0.25)


def test_groups_of_any_mapping_type():
    frozen = MappingProxyType(GROUPS)
    assert classwise_summary(Y_TRUE, Y_PRED, frozen) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )


def test_groups_in_a_pandas_series_are_read_by_label():
    # A Series keyed by label was read by position (easy and hard swapped, silently) by
    # classwise_summary, and failed in group_accuracy and classwise_scorers.
    pd = pytest.importorskip("pandas")
    series = pd.Series(GROUPS).iloc[::-1]
    assert classwise_summary(Y_TRUE, Y_PRED, series) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )
    assert group_accuracy(Y_TRUE, Y_PRED, series, "hard") == group_accuracy(
        Y_TRUE, Y_PRED, GROUPS, "hard"
    )
    assert classwise_scorers(series).keys() == classwise_scorers(GROUPS).keys()
    # A column of a table (positions, a RangeIndex) stays aligned with the labels given.
    order = [5, 4, 3, 2, 1, 0]
    column = pd.Series([GROUPS[label] for label in order])
    assert classwise_summary(Y_TRUE, Y_PRED, column, labels=order) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )
    names = np.array(["a", "b", "c", "d", "e", "f"])[Y_TRUE]  # classes its index is not
    assert classwise_summary(names, names, pd.Series(["easy", "easy", "medium"] * 2))["easy"] == 1
    # Keyed by label, in another order than labels, or missing a class: read by label.
    ordered = pd.Series(GROUPS).sort_values()
    assert classwise_summary(Y_TRUE, Y_PRED, ordered, labels=sorted(GROUPS)) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )
    with pytest.raises(ValueError, match="that are not in groups"):
        classwise_summary(Y_TRUE, Y_PRED, pd.Series({k + 1: v for k, v in GROUPS.items()}))
    with pytest.raises(ValueError, match=r"names \[0\] more than once"):
        group_accuracy(Y_TRUE, Y_PRED, pd.Series(["easy", "hard"], index=[0, 0]))


@pytest.mark.parametrize("n_groups", [0, -1, 2.5, True])
def test_difficulty_groups_refuse_a_number_of_groups_that_is_none(n_groups):
    with pytest.raises(ValueError, match="n_groups must be an integer >= 1"):
        difficulty_groups([0.9, 0.5, 0.7, 0.2], n_groups=n_groups)


def test_group_names_held_as_objects_are_names():
    # A pandas column of group names is an object array.
    names = np.array([GROUPS[label] for label in sorted(GROUPS)], dtype=object)
    assert classwise_summary(Y_TRUE, Y_PRED, names) == pytest.approx(
        classwise_summary(Y_TRUE, Y_PRED, GROUPS)
    )


class _Echo(ClassifierMixin, BaseEstimator):
    """A "model" whose predictions are its input's first column."""

    def fit(self, X, y):
        self.classes_ = np.unique(y)
        return self

    def predict(self, X):
        return np.asarray(X)[:, 0]


def test_a_group_scorer_keeps_the_groups_it_was_made_with():
    groups = dict(GROUPS)
    scorer = make_group_scorer(groups, "hard")
    groups.update({0: "hard", 1: "hard"})  # changed after the scorer was made
    echo = _Echo().fit(Y_PRED[:, None], Y_TRUE)
    assert scorer(echo, Y_PRED[:, None], Y_TRUE) == pytest.approx(0.375)  # classes 4 and 5


def test_each_classwise_scorer_scores_its_own_metric():
    echo = _Echo().fit(Y_PRED[:, None], Y_TRUE)
    scores = {
        name: check_scoring(echo, scorer)(echo, Y_PRED[:, None], Y_TRUE)
        for name, scorer in classwise_scorers().items()
    }
    assert scores == pytest.approx(
        {"accuracy": 4 / 6, "balanced_accuracy": 4 / 6, "worst_class": 0.25,
         "hard_tercile": 0.375, "class_std": -np.std([1, 0.75, 0.5, 1, 0.25, 0.5])}
    )  # fmt: skip


def test_groups_by_index_refuse_a_class_their_labels_leave_out():
    # Class 3 counted in "overall" alone, and "worst" (1.0) came out above it (0.75).
    y_true, y_pred = [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 2, 0, 0]
    with pytest.raises(ValueError, match=r"y_true has classes \[3\] that are not in labels"):
        classwise_summary(y_true, y_pred, groups=[0, 1, 2], labels=[0, 1, 2])
    with pytest.raises(ValueError, match=r"y_true has classes \[3\] that are not in groups"):
        classwise_summary(y_true, y_pred, groups={0: "easy", 1: "medium", 2: "hard"})


@pytest.mark.parametrize("nan", [np.float32("nan"), np.float16("nan"), complex("nan")])
def test_a_nan_of_any_number_type_among_object_labels_is_refused(nan):
    # An np.float32 NaN is no Python float: it passed as a class, and class 1.0 (2 of 2
    # right) was scored NaN.
    y_true = np.array([0.0, nan, 1.0, 1.0], dtype=object)
    y_pred = np.array([0.0, 0.0, 1.0, 1.0], dtype=object)
    with pytest.raises(ValueError, match=r"^Input y_true holds 1 missing label \(NaN\)"):
        per_class_accuracy(y_true, y_pred)


def test_a_series_of_groups_by_index_on_a_test_set_lacking_a_class_is_named():
    # Its index 0, 1, 2 was read as positions: with class 1 absent from y_true, three
    # groups for two classes, "must give one group index per class". Read by label it
    # fits classes 0, 1, 2 but gave classes labelled 1, 2, 3 the wrong groups (easy
    # lost): the two readings differ, and the error says so.
    pd = pytest.importorskip("pandas")
    series = pd.Series(["easy", "medium", "hard"])
    with pytest.raises(ValueError, match=r"indexed 0..2, .* holds 2 classes, not 3, .* differ"):
        classwise_summary([1, 1, 2, 2], [1, 1, 2, 1], series)
    summary = classwise_summary([1, 2, 3], [1, 2, 3], series)  # a table's positions
    assert summary["easy"] == summary["hard"] == 1
    groups = {0: "easy", 1: "medium", 2: "hard"}  # as a dict, by label
    assert np.isnan(classwise_summary([0, 2], [0, 2], groups)["medium"])


@pytest.mark.parametrize("classes", [[False, True], [0.0, 1.0, 2.0]])
def test_a_series_of_groups_by_boolean_or_float_classes_is_read_by_label(classes):
    # pd.Series(class_groups(...)) of classes False, True (0.0, 1.0, ...) equals 0, 1, ...
    # by value: read as a table's positions, it was refused as two readings on a test set
    # lacking a class, where group_accuracy and the dict itself score it.
    pd = pytest.importorskip("pandas")
    y = np.array(classes)
    groups = class_groups(y, y[[0] * len(y)])
    y_true = y[1:]
    expected = classwise_summary(y_true, y_true, groups)
    assert classwise_summary(y_true, y_true, pd.Series(groups)) == pytest.approx(
        expected, nan_ok=True
    )


@pytest.mark.parametrize("dtype", ["int64", "uint8", "Int64", "object"])
def test_a_series_of_groups_indexed_by_integers_of_any_dtype_is_read_by_position(dtype):
    # An index 0, 1, 2 of integers held as objects was read by label: the groups of a
    # table's column, aligned with labels, were said to miss every class.
    pd = pytest.importorskip("pandas")
    column = pd.Series(["hard", "easy", "medium"], index=pd.Index([0, 1, 2], dtype=dtype))
    y = np.array(["a", "b", "c"])
    summary = classwise_summary(y, y[[0, 0, 0]], column, labels=["c", "a", "b"])
    assert summary["hard"] == 0.0 and summary["easy"] == 1.0


class _Counted(str):
    """Text that counts the comparisons made of it (a sort's, a searchsorted's)."""

    compared = 0

    def __lt__(self, other):
        type(self).compared += 1
        return str.__lt__(self, other)


def test_text_held_as_objects_is_not_sorted_sample_by_sample():
    # A pandas column of text (dtype object) was sorted as Python's strings, one comparison
    # at a time (np.unique, searchsorted): ImageNet's 1.28 million labels took 3 to 12 s,
    # against 0.6 s as NumPy's text. Its distinct labels are compared, not its samples.
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    names = [_Counted(f"n{k}") for k in range(5)]
    y_true = pd.Series([names[k] for k in rng.integers(0, 5, 2000)], dtype=object)
    y_pred = pd.Series([names[k] for k in rng.integers(0, 5, 2000)], dtype=object)
    _Counted.compared = 0
    accuracy = per_class_accuracy(y_true, y_pred)
    classes = class_groups(y_true, y_pred)
    assert _Counted.compared < 200
    text = np.array([str(v) for v in y_true]), np.array([str(v) for v in y_pred])
    np.testing.assert_array_equal(accuracy, per_class_accuracy(*text))
    assert classes == class_groups(*text)


def test_class_groups_checks_y_true_once(label_checks):
    # y_true was read and checked for its classes, then again for its scores: a pass over
    # a pandas column of ImageNet's labels as text each.
    y = np.array(["a", "b", "c", "a", "b", "c"], dtype=object)
    assert class_groups(y, y[[0, 1, 2, 0, 0, 0]]) == {"a": "easy", "b": "medium", "c": "hard"}
    assert label_checks.count("y_true") == 1


def _as(kind: str, labels: np.ndarray):
    """The text ``labels`` as NumPy's, as objects, or as a pandas column of them."""
    if kind == "numpy":
        return labels
    if kind == "objects":
        return labels.astype(object)
    pd = pytest.importorskip("pandas")
    return pd.Series(labels, dtype="string" if kind == "string" else object)


@pytest.mark.parametrize("true_kind", ["numpy", "objects", "pandas", "string"])
@pytest.mark.parametrize("pred_kind", ["numpy", "objects", "pandas"])
def test_text_scores_alike_as_numpy_s_or_as_objects(true_kind, pred_kind):
    # Text held as objects is looked up by a hash table: the same scores, classes and
    # class order as NumPy's text, with classes of no sample and predictions of no class.
    rng = np.random.default_rng(1)
    names = np.array(["b", "a", "é", "B", "ab", "a b", "😀", "z"])
    y_true, y_pred = names[rng.integers(0, 7, 300)], names[rng.integers(0, 8, 300)]
    weight = rng.uniform(0.1, 2.0, 300)
    given = ["z", "a", "b", "B", "é", "ab", "a b", "😀", "q"]
    true, pred = _as(true_kind, y_true), _as(pred_kind, y_pred)
    for labels in (None, given, np.array(given, dtype=object)):
        np.testing.assert_array_equal(
            per_class_accuracy(true, pred, labels, weight),
            per_class_accuracy(y_true, y_pred, labels, weight),
        )
    assert class_groups(true, pred) == class_groups(y_true, y_pred)
    assert list(class_groups(true, pred, given)) == given
    groups = class_groups(y_true, y_true[::-1])
    assert classwise_summary(true, pred, groups) == classwise_summary(y_true, y_pred, groups)
    assert classwise_summary(true, pred) == classwise_summary(y_true, y_pred)
    assert worst_class_accuracy(true, pred) == worst_class_accuracy(y_true, y_pred)
    assert group_accuracy(true, pred, groups) == group_accuracy(y_true, y_pred, groups)


def test_text_held_as_objects_without_pandas_is_sorted_as_before(monkeypatch):
    # pandas is not a dependency: without it imported, text held as objects is sorted by
    # NumPy, as before, to the same scores and class order.
    pytest.importorskip("pandas")  # (imported: the hash table's scores first)
    rng = np.random.default_rng(2)
    names = np.array(["b", "a", "é", "B", "ab", "😀"], dtype=object)
    y_true, y_pred = names[rng.integers(0, 6, 100)], names[rng.integers(0, 6, 100)]
    given = ["😀", "a", "b", "q"]
    hashed = per_class_accuracy(y_true, y_pred), per_class_accuracy(y_true, y_pred, given)
    groups = class_groups(y_true, y_pred)
    monkeypatch.setitem(sys.modules, "pandas", None)  # (as if never imported)
    np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), hashed[0])
    np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred, given), hashed[1])
    assert list(class_groups(y_true, y_pred).items()) == list(groups.items())


@pytest.mark.parametrize("pandas", ["imported", "not imported"])
def test_numpy_s_text_among_python_s_gives_python_s_text_as_classes(monkeypatch, pandas):
    # np.str_ and str of the same text are one class, whose key was whichever of the two
    # pandas' table met first or NumPy's (unstable) sort kept: np.str_('a') by NumPy, 'a'
    # by pandas here. Either way it is Python's text, as the other classes are.
    pytest.importorskip("pandas")
    if pandas == "not imported":
        monkeypatch.setitem(sys.modules, "pandas", None)
    names, held = "babababbbabbbabbaaba", "ssnsnnsssnsnssnsssns"  # (n: NumPy's np.str_)
    labels = [np.str_(v) if h == "n" else v for v, h in zip(names, held, strict=True)]
    y = np.array(labels, dtype=object)
    groups = class_groups(y, y)
    assert list(groups) == ["a", "b"]
    assert [type(label) for label in groups] == [str, str]


@pytest.mark.parametrize(
    "names",
    [["x\x00y", "x\x00z", "x"], ["a\x00", "a", "b"], ["\ud800", "\udc00", "a"]],
    ids=["nul", "trailing nul", "surrogates"],
)
def test_text_that_pandas_tables_may_merge_is_told_apart(monkeypatch, names):
    # pandas 2.0's table of text hashes a label's UTF-8 up to its first NUL, and lone
    # surrogates as one: 'x\x00y' and 'x\x00z' were scored as one class (with the
    # installed pandas, a table that keys text so, as 2.0's did).
    pd = pytest.importorskip("pandas")
    real = pd.factorize

    def old_factorize(values, *args, **kwargs):
        keys = [v.encode(errors="replace").split(b"\x00")[0] for v in values]
        codes, uniques = real(np.array(keys, dtype=object))
        first = {key: value for key, value in zip(keys[::-1], values[::-1], strict=True)}
        return codes, np.array([first[u] for u in uniques], dtype=object)

    monkeypatch.setattr(pd, "factorize", old_factorize)
    y_true = np.array(names * 2, dtype=object)
    y_pred = np.array(names[::-1] * 2, dtype=object)
    assert list(class_groups(y_true, y_pred)) == sorted(names)
    pairs = list(zip(y_true, y_pred, strict=True))  # (NumPy's == of 'a\x00' reads 'a')
    right = [np.mean([p == c for t, p in pairs if t == c]) for c in sorted(names)]
    np.testing.assert_array_equal(per_class_accuracy(y_true, y_pred), right)


@pytest.mark.parametrize("kind", ["objects", "pandas"])
def test_text_held_as_objects_keeps_its_refusals(kind):
    # The fast path for text is taken only once the labels are known to be text alone.
    y = _as(kind, np.array(["a", "b", "a"]))
    with pytest.raises(ValueError, match=r"Mix of label input types \(string and number\)"):
        per_class_accuracy(y, [0, 1, 0])
    mixed = np.array(["a", 1, "a"], dtype=object)
    with pytest.raises(ValueError, match=r"Mix of label input types .* in y_true"):
        per_class_accuracy(mixed if kind == "objects" else _as(kind, mixed), y)
    with pytest.raises(ValueError, match="missing label"):
        per_class_accuracy(np.array(["a", None, "a"], dtype=object), y)
