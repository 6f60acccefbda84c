"""ClasswiseReport: groups fixed by the reference, tables, JSON round trip."""

import json
import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import numpy as np
import pytest
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from mr2_probe.metrics import classwise_summary, per_class_accuracy
from mr2_probe.report import COLUMNS, ClasswiseReport, classwise_report, in_percent

Y = np.array(["cat", "cat", "dog", "dog", "eel", "eel"])
MODELS = {
    "erm": np.array(["cat", "cat", "dog", "cat", "eel", "cat"]),  # cat 1, dog .5, eel .5
    "mr2": np.array(["cat", "dog", "dog", "dog", "eel", "eel"]),  # cat .5, dog 1, eel 1
}


@pytest.fixture
def report():
    return classwise_report(MODELS, Y)


def test_groups_come_from_the_reference_and_stay_fixed(report):
    assert report.reference == "erm"
    assert report.labels == ["cat", "dog", "eel"]
    assert report.groups == ["easy", "medium", "hard"]
    # mr2's cat (its worst class) is still scored as the easy group.
    assert report.rows["mr2"]["easy"] == pytest.approx(0.5)
    assert report.rows["mr2"]["hard"] == pytest.approx(1.0)
    assert report.per_class["mr2"] == pytest.approx([0.5, 1.0, 1.0])


def test_a_named_reference_changes_the_groups():
    swapped = classwise_report(MODELS, Y, reference="mr2")
    assert swapped.groups == ["hard", "easy", "medium"]
    assert swapped.rows["erm"]["hard"] == pytest.approx(1.0)


def test_estimators_and_predictions_mix():
    X, y = load_iris(return_X_y=True)
    clf = LogisticRegression(max_iter=500).fit(X, y)
    report = classwise_report({"fitted": clf, "predictions": clf.predict(X)}, y, X)
    assert report.rows["fitted"] == report.rows["predictions"]
    assert report.rows["fitted"] == classwise_summary(y, clf.predict(X))


@pytest.mark.parametrize(
    "models, kwargs, message",
    [
        ({}, {}, "at least one model"),
        (MODELS, {"reference": "lr"}, "reference must be one of"),
        ({"lr": LogisticRegression()}, {}, "pass X"),
    ],
)
def test_errors(models, kwargs, message):
    with pytest.raises(ValueError, match=message):
        classwise_report(models, Y, **kwargs)


@pytest.mark.parametrize("predictions, match", [
    (Y[:5], r"must have the same shape, got \(6,\) and \(5,\)"),
    (np.arange(6), r"Mix of label input types \(string and number\)"),
    (np.array([Y, Y]), r"y_pred should be a 1d array, got an array of shape \(2, 6\)"),
    (np.array([*Y[:5], None], dtype=object), r"Input y_pred holds 1 missing label \(None\)"),
])  # fmt: skip
def test_predictions_that_cannot_be_scored_name_their_model(predictions, match):
    # Among several models, the errors said "y_pred" without naming whose predictions.
    models = {**MODELS, "tilt": predictions}
    with pytest.raises(ValueError, match=f"The predictions of model 'tilt' cannot be .*{match}"):
        classwise_report(models, Y)


def test_scores_given_as_a_model_s_predictions_are_refused_by_its_name():
    # predict_proba's column of the positive class was a model at 0% in every class.
    models = {"erm": [0, 0, 1, 1], "proba": np.array([0.1, 0.4, 0.8, 0.7])}
    match = "The predictions of model 'proba' cannot be .*: y_pred holds values with a fraction"
    with pytest.raises(ValueError, match=match):
        classwise_report(models, [0, 0, 1, 1])


def test_text_table_rows(report):
    lines = report.to_text().splitlines()
    assert lines[0].split() == ["model", *COLUMNS]
    assert lines[2].split() == ["erm", "66.67", "100.00", "50.00", "50.00", "50.00", "23.57"]
    assert lines[3].split() == ["mr2", "83.33", "50.00", "100.00", "100.00", "50.00", "23.57"]
    assert "terciles of erm" in lines[4]
    assert str(report) == report.to_text()


def test_per_class_table_is_sorted_by_the_reference(report):
    text = report.to_text(per_class=True)
    per_class = text.split("spread of per-class accuracy\n")[1].splitlines()
    assert per_class[0].split() == ["class", "group", "erm", "mr2"]
    assert [line.split()[:2] for line in per_class[2:]] == [
        ["cat", "easy"], ["dog", "medium"], ["eel", "hard"]
    ]  # fmt: skip
    assert len(report.to_text().splitlines()) == 5  # header, rule, two models, note


def test_markdown_table(report):
    lines = report.to_markdown(per_class=True).splitlines()
    assert lines[0] == "| model | overall | easy | medium | hard | worst | std |"
    assert lines[1] == "|---|--:|--:|--:|--:|--:|--:|"
    assert lines[2] == "| erm | 66.67 | 100.00 | 50.00 | 50.00 | 50.00 | 23.57 |"
    assert "| eel | hard | 50.00 | 100.00 |" in lines


def test_markdown_escapes_a_pipe_in_a_name():
    y = np.array(["a|b", "a|b", "c", "c"])
    report = classwise_report({"m|1": np.array(["a|b", "c", "c", "c"])}, y)
    text = report.to_markdown(per_class=True)
    assert "| m\\|1 |" in text and "| a\\|b |" in text
    # Every row of each table has as many cells as its header (a '\|' is not a border).
    for table in text.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        cells = {len(line.replace("\\|", "").split("|")) for line in rows}
        assert len(cells) <= 1  # (0: the caption between the tables)


def test_names_keep_their_cells_and_show_as_they_are():
    # Only '|' was escaped: a line break split a row in two (in the text table too), and
    # GitHub drops "<unk>" as raw HTML.
    y = np.array(["cat\ndog", "cat\ndog", "<unk>", "<unk>", "a_b_c*", "a_b_c*"])
    report = classwise_report({"m\r\n1": y[::-1], "ERM_2": y}, y, reference="ERM_2")
    markdown = report.to_markdown(per_class=True)
    assert "| cat<br>dog |" in markdown and "| \\<unk\\> |" in markdown
    assert "| a\\_b\\_c\\* |" in markdown and "| m<br>1 |" in markdown
    assert "class terciles of ERM\\_2;" in markdown
    for table in markdown.split("\n\n")[::2]:  # the two tables: a border per cell, each row
        assert len({line.count(" | ") for line in table.splitlines()[2:]}) == 1
    text = report.to_text(per_class=True)
    assert len(text.splitlines()) == 2 + 2 + 1 + 2 + 3  # no row split
    assert "cat dog" in text and "m 1" in text
    # Every other break that str.splitlines knows split a row as the newline did.
    for brk in "\v\f\x1c\x1d\x1e\x85\u2028\u2029":
        odd = np.array([f"cat{brk}dog"] * 2 + ["ant"] * 2)
        report = classwise_report({"m": odd[::-1], "ERM": odd}, odd, reference="ERM")
        assert len(report.to_text(per_class=True).splitlines()) == 2 + 2 + 1 + 2 + 2, repr(brk)
        assert f"cat{brk}dog" not in report.to_markdown(per_class=True), repr(brk)


def _assert_same(read, report):
    assert (read.reference, read.labels, read.groups) == (
        report.reference, report.labels, report.groups,
    )  # fmt: skip
    for name, row in report.rows.items():
        assert read.rows[name] == pytest.approx(row, nan_ok=True)
        assert read.per_class[name] == pytest.approx(report.per_class[name], nan_ok=True)


@pytest.mark.parametrize("labels", [Y, np.array([3, 3, 1, 1, 2, 2])])
def test_json_round_trips(labels):
    models = {name: labels[np.searchsorted(Y, pred)] for name, pred in MODELS.items()}
    report = classwise_report(models, labels)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    _assert_same(ClasswiseReport.from_dict(data), report)
    assert data["labels"] == sorted(np.unique(labels).tolist())
    # Read and written again, and again: not a digit lost (accuracies such as 5/6).
    again = ClasswiseReport.from_dict(data).to_dict()
    assert again == data and ClasswiseReport.from_dict(again).to_dict() == data


def test_json_is_in_percent_like_the_tables(report):
    data = report.to_dict()
    assert data["units"] == "percent"
    # The same numbers as the text table's row "erm 66.67 100.00 50.00 50.00 50.00 23.57".
    assert data["rows"]["erm"] == pytest.approx(
        {"overall": 66.6667, "easy": 100, "medium": 50, "hard": 50, "worst": 50, "std": 23.5702},
        abs=1e-4,
    )
    assert data["per_class"]["mr2"] == [50.0, 100.0, 100.0]
    # Rounded where a product is not exact: 0.57 is written 57.0.
    report.rows["erm"]["overall"] = 0.57
    assert report.to_dict()["rows"]["erm"]["overall"] == 57.0


def test_from_dict_refuses_what_is_no_report_s_dictionary(report):
    # The JSON text itself failed with "'str' object has no attribute 'get'", a dictionary
    # of something else with a KeyError.
    with pytest.raises(TypeError, match="^from_dict takes the dictionary .*; got a str"):
        ClasswiseReport.from_dict(report.to_json())
    data = report.to_dict()
    del data["groups"], data["per_class"]
    with pytest.raises(ValueError, match=r"; got one without \['groups', 'per_class'\]\.$"):
        ClasswiseReport.from_dict(data)


def test_from_dict_reads_fractions_without_units_and_refuses_unknown_units(report):
    data = report.to_dict()
    old = {key: value for key, value in data.items() if key != "units"}
    old["rows"] = report.rows
    old["per_class"] = report.per_class
    assert ClasswiseReport.from_dict(old) == report
    with pytest.raises(ValueError, match="units must be one of"):
        ClasswiseReport.from_dict({**data, "units": "permille"})


def test_json_writes_missing_groups_as_null():
    # Two classes are easy and hard: "medium" has no class and no score.
    report = classwise_report({"a": [0, 1, 1]}, [0, 1, 1])
    assert np.isnan(report.rows["a"]["medium"])
    text = report.to_json()
    assert "NaN" not in text
    assert json.loads(text)["rows"]["a"]["medium"] is None
    assert report.to_text().splitlines()[2].split()[3] == "nan"
    # Read back, the missing score is NaN again.
    assert np.isnan(ClasswiseReport.from_dict(json.loads(text)).rows["a"]["medium"])


@pytest.mark.parametrize(
    "y, shown",
    [
        (np.array(["2024-01-01", "2024-01-02"], "datetime64[D]"), ["2024-01-01", "2024-01-02"]),
        (np.array([1, 2], dtype="timedelta64[s]"), ["1 seconds", "2 seconds"]),
        # (a pandas column of durations is timedelta64[us]: astype(str) cut them to 21
        # characters, "86400000000 microseco")
        (
            np.array([1, 2], dtype="timedelta64[D]").astype("timedelta64[us]"),
            ["86400000000 microseconds", "172800000000 microseconds"],
        ),
        # tolist() made these integers, which matched no class of y in the groups.
        (
            np.array(["2024-01-01", "2024-01-02"], "datetime64[ns]"),
            ["2024-01-01T00:00:00.000000000", "2024-01-02T00:00:00.000000000"],
        ),
        # Held as objects (a pandas column's .dt.date, or its Timestamps with a time zone):
        # to_json failed as it did for datetime64 before.
        (np.array([date(2024, 1, 1), date(2024, 1, 2)]), ["2024-01-01", "2024-01-02"]),
        (
            np.array([datetime(2024, 1, day, tzinfo=timezone.utc) for day in (1, 2)]),
            ["2024-01-01T00:00:00+00:00", "2024-01-02T00:00:00+00:00"],
        ),
        (np.array([timedelta(seconds=1), timedelta(days=1)]), ["0:00:01", "1 day, 0:00:00"]),
    ],
)
def test_date_labels_are_written_as_their_iso_text(y, shown):
    # The report took them, and to_json failed: "Object of type date is not JSON
    # serializable" (datetime64[ns] became integers of nanoseconds).
    y = np.repeat(y, 3)
    report = classwise_report({"ERM": y, "MR2": y[::-1]}, y)
    assert report.labels == shown
    assert ClasswiseReport.from_dict(json.loads(report.to_json())).labels == shown


@pytest.mark.parametrize(
    "y, shown",
    [
        # pd.cut's bins, a pandas column of periods and NumPy's scalars held as objects:
        # to_json failed with "Object of type Interval (Period, int64) is not JSON
        # serializable".
        (lambda pd: pd.cut(pd.Series([1, 5]), [0, 2, 6]), ["(0, 2]", "(2, 6]"]),
        (
            lambda pd: pd.Series(pd.period_range("2024-01", periods=2, freq="M")),
            ["2024-01", "2024-02"],
        ),
        (lambda pd: np.array([np.int64(1), np.int64(2)], dtype=object), [1, 2]),
        (lambda pd: np.array([Decimal("1.5"), Decimal("2.5")]), ["1.5", "2.5"]),
        # NumPy's text among Python's: refused as "Mix of label input types ( and str)".
        (lambda pd: np.array([np.str_("a"), "b"], dtype=object), ["a", "b"]),
        (lambda pd: np.array([np.bytes_(b"a"), b"b"], dtype=object), ["a", "b"]),
        # NumPy's durations held as objects, as a timedelta64 array's (not 1 and 2: the
        # nanoseconds' item() is a bare int)
        (
            lambda pd: np.array([np.timedelta64(1, "ns"), np.timedelta64(2, "ns")], dtype=object),
            ["1 nanoseconds", "2 nanoseconds"],
        ),
        (
            lambda pd: np.array([np.timedelta64(1, "ns"), np.timedelta64(2, "ns")]),
            ["1 nanoseconds", "2 nanoseconds"],
        ),
    ],
)
def test_labels_held_as_other_objects_are_written_as_their_text(y, shown):
    pd = pytest.importorskip("pandas")
    y = np.repeat(np.asarray(y(pd)), 3)
    report = classwise_report({"ERM": y, "MR2": y[::-1]}, y)
    assert report.labels == shown
    assert [type(v) for v in report.labels] == [type(v) for v in shown]  # (plain Python)
    assert ClasswiseReport.from_dict(json.loads(report.to_json())).labels == shown


def test_json_of_infinite_labels_is_strict():
    report = classwise_report({"a": [np.inf, 1.0, 1.0]}, [np.inf, 1.0, 2.0])

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    assert json.loads(report.to_json(), parse_constant=refuse)["labels"] == [1.0, 2.0, "inf"]
    assert json.loads(report.to_json(allow_nan=True, indent=1))["labels"][-1] == "inf"


@pytest.mark.parametrize("names", [[0.01, 1.0], [0, 1], ["0.01", 1]])
def test_models_named_by_numbers_print_and_round_trip_by_their_names(names):
    y = [0, 0, 1, 1, 2, 2]
    report = classwise_report(dict(zip(names, [[0, 0, 1, 0, 2, 1], y], strict=True)), y)
    assert list(report.rows) == [str(n) for n in names] and report.reference == str(names[0])
    rows = report.to_text().splitlines()[2:4]
    assert [row.split()[0] for row in rows] == [str(n) for n in names]
    read = ClasswiseReport.from_dict(json.loads(report.to_json()))
    _assert_same(read, report)
    assert read.to_text(per_class=True) == report.to_text(per_class=True)


def test_a_reference_is_named_as_text_like_the_models():
    y = [0, 0, 1, 1, 2, 2]
    models = {0.01: [0, 0, 1, 0, 2, 0], 1.0: y}
    by_text = classwise_report(models, y, reference="1.0")
    assert by_text.reference == "1.0"
    assert by_text.groups == classwise_report(models, y, reference=1.0).groups
    with pytest.raises(ValueError, match=r"reference must be one of \['0.01', '1.0'\]"):
        classwise_report(models, y, reference="2")


def test_bytes_labels_are_written_as_text():
    # h5py reads fixed-length strings as bytes.
    y = np.array([b"cat", b"cat", b"dog", b"dog"])
    report = classwise_report({"ERM": np.array([b"cat", b"dog", b"dog", b"dog"])}, y)
    assert report.labels == ["cat", "dog"]
    assert "b'cat'" not in report.to_text(per_class=True)
    read = ClasswiseReport.from_dict(json.loads(report.to_json()))
    _assert_same(read, report)


def test_bytes_labels_that_would_read_alike_stay_distinct():
    # Decoded with backslash escapes, the byte 0xFF and the text "\\xff" both read \xff.
    y = np.array([b"\xff", b"\\xff", b"caf\xe9", b"caf\xe9"])
    report = classwise_report({"ERM": y}, y)
    assert len(set(report.labels)) == 3
    assert report.labels == [repr(v) for v in np.unique(y).tolist()]
    # Not UTF-8 but unambiguous: escapes, as before.
    latin = np.array([b"caf\xe9", b"th\xe9"])
    assert classwise_report({"ERM": latin}, latin).labels == ["caf\\xe9", "th\\xe9"]


def test_an_empty_test_set_is_named():
    with pytest.raises(ValueError, match="No class of y_true has samples"):
        classwise_report({"ERM": []}, [])


def test_models_as_a_dataframe_of_predictions_one_column_each():
    # "The truth value of a DataFrame is ambiguous" before; its columns are the models.
    pd = pytest.importorskip("pandas")
    report = classwise_report(pd.DataFrame(MODELS), Y)
    assert report.rows == classwise_report(MODELS, Y).rows
    with pytest.raises(ValueError, match="distinct names as text"):
        classwise_report(pd.DataFrame([[0, 1], [1, 1]], columns=["erm", "erm"]), [0, 1])


@pytest.mark.parametrize("models", [[[0, 1]], np.array([[0, 1]]), LogisticRegression()])
def test_models_that_are_no_mapping_are_refused(models):
    # A list of models failed with "'list' object has no attribute 'items'".
    with pytest.raises(ValueError, match=r"models must map each model's name .*; got a \w+\."):
        classwise_report(models, [0, 1])


def test_one_models_predictions_in_place_of_the_mapping_are_refused():
    # A Series is a mapping of its index to single predictions: "y_true and y_pred must have
    # the same shape, got (6,) and ()".
    pd = pytest.importorskip("pandas")
    with pytest.raises(ValueError, match=r"models must map .*; got a Series, one model's pred"):
        classwise_report(pd.Series(MODELS["erm"]), Y)
    with pytest.raises(ValueError, match=r"Model 'ERM' is a single value, 'cat': models must map"):
        classwise_report({"ERM": "cat"}, Y)


def test_models_whose_names_read_alike_are_refused():
    with pytest.raises(ValueError, match="distinct names as text"):
        classwise_report({1: [0, 1], "1": [0, 1]}, [0, 1])
    # Named as Python's values, not NumPy 2's [np.float64(0.1), '0.1'] of an array's.
    with pytest.raises(ValueError, match=r"as text, got \[0\.1, '0\.1'\]\.$"):
        classwise_report({np.float64(0.1): [0, 1], "0.1": [0, 1]}, [0, 1])


def test_labels_order_the_classes_and_break_ties_in_that_order():
    y = ["b", "a", "c", "a"]
    models = {"erm": ["b", "a", "c", "c"], "mr2": ["b", "b", "c", "a"]}
    report = classwise_report(models, y, labels=["c", "b", "a"])
    assert report.labels == ["c", "b", "a"]
    assert report.per_class == {"erm": [1.0, 1.0, 0.5], "mr2": [1.0, 1.0, 0.5]}
    # c and b tie at 100%: the first in the given order is the easy one.
    assert report.groups == ["easy", "medium", "hard"]
    assert classwise_report(models, y).groups == ["hard", "easy", "medium"]  # a, b, c
    for labels in (["c", "b"], ["c", "b", "a", "a"], ["c", "b", "d"], [["a", "b", "c"]]):
        with pytest.raises(ValueError, match="labels must hold each class of y once"):
            classwise_report(models, y, labels=labels)
    # Codes as text (a report's JSON) for a y of codes: y's classes listed beside them.
    with pytest.raises(ValueError, match=r"y has the classes \[0, 1\], labels are \['1', '0'\]\.$"):
        classwise_report({"erm": [0, 1]}, [0, 1], labels=["1", "0"])


def test_text_and_markdown_tables_exactly():
    # Names left-aligned and numbers right-aligned, each column as wide as its longest cell
    # (at least 9) with a gap of two; classes from the reference's best to its worst.
    models = {"erm": list("aabccc"), "a_very_long_name": list("abbcca")}
    report = classwise_report(models, list("abbccc"))
    assert report.to_text(per_class=True) == "\n".join(
        [
            "model             overall     easy   medium     hard    worst      std",
            "----------------------------------------------------------------------",
            "erm                 83.33   100.00   100.00    50.00    50.00    23.57",
            "a_very_long_name    83.33   100.00    66.67   100.00    66.67    15.71",
            "test accuracy in %; easy / medium / hard: class terciles of erm; std: spread of "
            "per-class accuracy",
            "class    group      erm  a_very_long_name",
            "-----------------------------------------",
            "a         easy   100.00            100.00",
            "c       medium   100.00             66.67",
            "b         hard    50.00            100.00",
        ]
    )
    markdown = report.to_markdown(per_class=True).split("\n\n")
    assert markdown[0].splitlines()[3] == (
        "| a\\_very\\_long\\_name | 83.33 | 100.00 | 66.67 | 100.00 | 66.67 | 15.71 |"
    )
    assert markdown[2].splitlines()[2:] == [
        "| a | easy | 100.00 | 100.00 |",
        "| c | medium | 100.00 | 66.67 |",
        "| b | hard | 50.00 | 100.00 |",
    ]


def test_text_table_columns_line_up_with_wide_and_combining_characters():
    # Widths were counted with len(): a CJK name (two columns a character) pushed its row's
    # numbers a column right, a decomposed accent (no column of its own) pulled them left,
    # and a tab moved them to the terminal's next tab stop.
    names = ["猫", "cafe\u0301", "🐕", "pl\tain"]  # a tab: to the next tab stop
    text = classwise_report({"erm": names * 2}, names * 2).to_text(per_class=True)
    assert text.splitlines()[-6:] == [
        "class     group      erm",
        "------------------------",
        "cafe\u0301       easy   100.00",
        "pl ain     easy   100.00",
        "猫       medium   100.00",
        "🐕         hard   100.00",
    ]


def test_markdown_shows_entities_as_written():
    # "&lt;" would show as "<" on GitHub.
    report = classwise_report({"erm": ["a&lt;b", "c"]}, ["a&lt;b", "c"])
    assert "| a\\&lt;b | easy |" in report.to_markdown(per_class=True)


def test_percent_values_read_back_as_the_fractions_they_were_written_from():
    data = classwise_report({"erm": [0, 1]}, [0, 1]).to_dict()
    data["rows"]["erm"]["overall"] = 57.0  # written from 0.57
    data["per_class"]["erm"] = [57.0, 14.000000000000002]
    read = ClasswiseReport.from_dict(data)
    assert read.rows["erm"]["overall"] == 0.57  # exactly: 57.0 / 100, not 57.0 * 0.01
    assert read.per_class["erm"] == [0.57, 0.14]
    assert in_percent({"a": [float("nan"), 0.57]}) == {"a": [None, 57.0]}
    # per_class_accuracy's arrays, and tuples: a TypeError ("only 0-dimensional arrays").
    assert in_percent({"a": np.array([np.nan, 0.57])}) == {"a": [None, 57.0]}
    assert in_percent((0.5, 1.0)) == [50.0, 100.0]


def test_an_empty_group_is_explained_under_the_table():
    # Two classes: easy and hard, no medium class; its "nan" cells were left unexplained.
    report = classwise_report({"ERM": [0, 0, 1, 0], "MR2": [0, 0, 1, 1]}, [0, 0, 1, 1])
    for text in (report.to_text(), report.to_markdown()):
        assert text.count("nan") == 3 and text.endswith("; nan: no class in the medium group")
    full = classwise_report({"ERM": [0, 1, 2]}, [0, 1, 2])
    assert "nan" not in full.to_text() + full.to_markdown()


def test_labels_that_only_compare_equal_report_y_s_own_classes():
    report = classwise_report({"erm": [0, 1, 2]}, [0, 1, 2], labels=[2.0, 0.0, 1.0])
    assert report.labels == [2, 0, 1] and all(type(v) is int for v in report.labels)


@pytest.mark.parametrize(
    "labels",
    [
        np.array(["2024-01-02", "2024-01-01"], "datetime64[D]"),
        [np.datetime64("2024-01-02"), np.datetime64("2024-01-01")],
        [date(2024, 1, 2), datetime(2024, 1, 1)],
    ],
)
def test_dates_as_labels_at_another_unit_order_y_s_classes(labels):
    # Days for a pandas column's nanoseconds were refused: y's classes were compared as
    # integers of nanoseconds (tolist()), and listed so in the message.
    y = np.repeat(np.array(["2024-01-01", "2024-01-02"], "datetime64[ns]"), 3)
    report = classwise_report({"erm": y}, y, labels=labels)
    assert report.labels == ["2024-01-02T00:00:00.000000000", "2024-01-01T00:00:00.000000000"]
    # Not a class of y (5 o'clock): refused, y's classes named as dates.
    with pytest.raises(ValueError, match=r"classes \['2024-01-01T00:00:00.000000000', .*05:00"):
        classwise_report({"erm": y}, y, labels=[datetime(2024, 1, 2, 5), date(2024, 1, 1)])
    # Nanoseconds for days (their tolist() integers were read as days): taken too.
    days = y.astype("datetime64[D]")
    report = classwise_report({"erm": days}, days, labels=np.asarray(labels, "datetime64[ns]"))
    assert report.labels == ["2024-01-02", "2024-01-01"]
    # But 5 o'clock is no day: not cut to its day's class.
    at_five = np.asarray([datetime(2024, 1, 2, 5), date(2024, 1, 1)], "datetime64[ns]")
    with pytest.raises(ValueError, match=r"labels are \['2024-01-02T05:00:00.000000000', "):
        classwise_report({"erm": days}, days, labels=at_five)


@pytest.mark.parametrize("held", ["date", "Timestamp", "timedelta"])
def test_dates_held_as_objects_in_y_are_ordered_by_labels_of_datetime64_in_ns(held):
    # (a pandas column's .dt.date, its Timestamps, and the classes of its .values or
    # class_groups' keys as labels) Each date was compared with the integer of nanoseconds
    # of a label's tolist(): refused, "labels must hold each class of y once".
    days = np.array([1, 2, 2], "timedelta64[D]")
    y = {
        "date": lambda: (np.datetime64("2024-01-01") + days).astype(object),
        "Timestamp": lambda: np.array(
            list(pytest.importorskip("pandas").to_datetime(np.datetime64("2024-01-01") + days)),
            dtype=object,
        ),
        "timedelta": lambda: days.astype(object),
    }[held]()
    labels = np.asarray(y[[2, 0]].tolist()).astype("m8[ns]" if held == "timedelta" else "M8[ns]")
    report = classwise_report({"erm": y}, y, labels=labels)
    assert report.labels == [str(v) if held == "timedelta" else v.isoformat() for v in y[[2, 0]]]
    assert report.per_class["erm"] == [1.0, 1.0]


@pytest.mark.parametrize("held", [np.asarray, lambda a: list(a.astype(object))])
def test_a_date_out_of_the_range_of_nanoseconds_is_named_as_given(held):
    # Cast to y's nanoseconds, 3000-01-01 wrapped to 1830-11-23T00:50:52.580896768, which
    # the refusal named as the label given.
    y = np.repeat(np.array(["2024-01-01", "2024-01-02"], "datetime64[ns]"), 2)
    labels = held(np.array(["3000-01-01", "2024-01-01"], "datetime64[D]"))
    with pytest.raises(ValueError, match=r"labels are \[\S*3000"):  # ('3000-01-01', date(3000
        classwise_report({"erm": y}, y, labels=labels)


@pytest.mark.parametrize("kind", ["datetime64", "timedelta64"])
def test_numpy_s_times_held_as_objects_in_y_are_ordered_by_datetime_s_labels(kind):
    # y list() of a pandas column's .values, labels its .dt.date: refused, each date
    # compared with an integer of nanoseconds.
    days = np.array([1, 2, 2], "timedelta64[D]")
    if kind == "datetime64":
        days = np.datetime64("2024-01-01") + days
    y = np.array(list(days.astype(f"{kind}[ns]")), dtype=object)
    report = classwise_report({"erm": y}, y, labels=days[[2, 0]].astype(object))
    assert report.labels == [str(v) for v in y[[2, 0]]]


@pytest.mark.parametrize("kind", ["datetime64", "timedelta64"])
def test_numpy_s_times_held_as_objects_in_labels_order_datetime_s_y(kind):
    # y a pandas column's .dt.date, labels list() of its .values held as objects: refused,
    # each date compared with an integer of nanoseconds.
    days = np.array([1, 2, 2], "timedelta64[D]")
    if kind == "datetime64":
        days = np.datetime64("2024-01-01") + days
    y = days.astype(object)  # datetime.date (timedelta)
    labels = np.array(list(days[[2, 0]].astype(f"{kind}[ns]")), dtype=object)
    report = classwise_report({"erm": y}, y, labels=labels)
    assert report.labels == [str(v) for v in y[[2, 0]]]


def test_durations_in_nanoseconds_as_labels_order_y_s_classes_in_days():
    # Their tolist() integers of nanoseconds were read as days: 86400000000000 days.
    y = np.array([1, 2, 2], "timedelta64[D]")
    report = classwise_report(
        {"erm": y}, y, labels=np.array([2, 1], "timedelta64[D]").astype("m8[ns]")
    )
    assert report.labels == ["2 days", "1 days"]


@pytest.mark.parametrize("held", [np.asarray, lambda a: np.array(list(a), dtype=object)])
@pytest.mark.parametrize("kind", ["dates", "durations"])
def test_durations_as_labels_of_dates_are_refused_and_dates_of_durations(kind, held):
    # Cast to y's kind (NumPy's, or its scalars held as objects), a duration of 1 day was
    # taken as the date 1970-01-02, a date as its days since 1970: reported as y's classes.
    days = np.array([1, 2, 2], "timedelta64[D]")
    dates = np.datetime64("1970-01-01") + days
    y, labels = (dates, days) if kind == "dates" else (days, dates)
    mix = r"^Mix of label input types \(datetime64 and duration\): labels holds .* and y "
    with pytest.raises(ValueError, match=mix):
        classwise_report({"erm": y}, y, labels=held(labels[[2, 0]]))


@pytest.mark.parametrize(
    "held, kind, dtype",
    [
        ("D", "datetime64", "datetime64[D]"),
        ("ns", "datetime64", "datetime64[ns]"),
        # (a pandas column's .dt.date, its Timestamps: their own units)
        ("date", "date", "datetime64"),
        ("Timestamp", "datetime", "datetime64"),
    ],
)
def test_a_report_s_dates_read_back_from_json_as_labels_are_told_how_to_read_them(
    held, kind, dtype
):
    # Its own ISO text (report.json's labels) was refused as "labels must hold each class
    # of y once", y's classes and the labels listed alike.
    y = np.repeat(np.array(["2024-01-01", "2024-01-02"], "datetime64[D]"), 2)
    if held == "date":
        y = y.astype(object)
    elif held == "Timestamp":
        y = np.array(list(pytest.importorskip("pandas").to_datetime(y)), dtype=object)
    else:
        y = y.astype(f"datetime64[{held}]")
    text = json.loads(classwise_report({"erm": y}, y).to_json())["labels"][::-1]
    cure = re.escape(f"are read as dates by np.asarray(labels, dtype='{dtype}').")
    mix = rf"^Mix of label input types \(string and {kind}\).*{cure}$"
    with pytest.raises(ValueError, match=mix):
        classwise_report({"erm": y}, y, labels=text)
    report = classwise_report({"erm": y}, y, labels=np.asarray(text, dtype=dtype))
    assert report.labels == text


@pytest.mark.parametrize("held", ["D", "ns", "timedelta", "Timedelta"])
def test_a_report_s_durations_read_back_from_json_as_labels_are_told_how_to_read_them(held):
    # Refused as a mix with no cure, where dates are told how to read them (NumPy reads no
    # duration from text; pandas reads NumPy's "86400000000000 nanoseconds" and datetime's
    # "1 day, 0:00:00").
    pd = pytest.importorskip("pandas")
    y = np.repeat(np.array([1, 2], "timedelta64[D]"), 2)
    if held == "timedelta":
        y = y.astype(object)
    elif held == "Timedelta":
        y = np.array(list(pd.to_timedelta(y)), dtype=object)
    else:
        y = y.astype(f"timedelta64[{held}]")
    text = json.loads(classwise_report({"erm": y}, y).to_json())["labels"][::-1]
    cure = re.escape("are read as durations by pandas: np.asarray(pd.to_timedelta(labels)).")
    mix = rf"^Mix of label input types \(string and duration\).*{cure}$"
    with pytest.raises(ValueError, match=mix):
        classwise_report({"erm": y}, y, labels=text)
    report = classwise_report({"erm": y}, y, labels=np.asarray(pd.to_timedelta(text)))
    assert report.labels == text


@pytest.mark.parametrize("held", ["datetime", "Timestamp"])
def test_dates_with_a_time_zone_as_labels_of_datetime64_are_refused_as_the_metrics_do(held):
    # NumPy took them in UTC (with its warning "no explicit representation of timezones"),
    # where per_class_accuracy refuses them: a report of a column with a time zone
    # ordered by the naive dates of its .values.
    days = [datetime(2024, 1, day, tzinfo=timezone.utc) for day in (2, 1)]
    if held == "Timestamp":
        days = list(pytest.importorskip("pandas").to_datetime(days))
    y = np.repeat(np.array(["2024-01-01", "2024-01-02"], "datetime64[ns]"), 2)
    mix = r"^Mix of label input types \(datetime and datetime with a time zone\): labels holds"
    with pytest.raises(ValueError, match=mix):
        classwise_report({"erm": y}, y, labels=days)
    with pytest.raises(ValueError, match=mix):
        per_class_accuracy(y, y, labels=days)


@pytest.mark.parametrize("kind", ["datetime", "timedelta"])
def test_pandas_times_as_labels_keep_their_nanoseconds(kind):
    # Timestamps (Timedeltas) 1 ns apart were taken as datetime's, cut to microseconds:
    # refused as labels, each listed as the same time.
    pd = pytest.importorskip("pandas")
    times = (
        pd.to_datetime(["2024-01-01 00:00:00.000000001", "2024-01-01 00:00:00.000000002"])
        if kind == "datetime"
        else pd.to_timedelta([1, 2])
    )
    y = np.asarray(times)[[0, 1, 1]]
    report = classwise_report({"erm": y}, y, labels=list(times)[::-1])
    assert report.labels == [str(v) for v in np.asarray(times)[::-1]]


@pytest.mark.parametrize("labels", [None, [0, 1, float("nan")], [0, 1]])
def test_a_nan_label_in_y_is_named_whatever_the_labels(labels):
    # With labels given it read "labels must hold each class of y once", listing NaN in both.
    # (Among numbers NaN is scikit-learn's "contains NaN"; among objects a missing label.
    # A NaN among the labels is a missing class, refused first, as labels are.)
    nan_in_labels = labels is not None and len(labels) == 3
    for y, match in (
        ([0, 1, float("nan")], "^Input y contains NaN"),
        (np.array([0, 1, float("nan")], dtype=object), r"^Input y holds 1 missing label \(NaN\)"),
    ):
        if nan_in_labels:
            match = r"^Input labels holds 1 missing label \(NaN\) among its 3, at position 2"
        with pytest.raises(ValueError, match=match):
            classwise_report({"erm": [0, 1, 1]}, y, labels=labels)


@pytest.mark.parametrize("missing", ["None", "pd.NA"])
def test_a_missing_label_in_y_is_named_whatever_the_labels(missing):
    # pd.NA (a pandas column of dtype "string") among the classes was "Mix of label input
    # types (str and None)"; given labels= it is named the same.
    pd = pytest.importorskip("pandas")
    y = np.array(["a", "b", None if missing == "None" else pd.NA, "b"], dtype=object)
    for labels in (None, ["a", "b"]):
        with pytest.raises(ValueError, match=rf"^Input y holds 1 missing label \({missing}\)"):
            classwise_report({"erm": ["a", "b", "b", "b"]}, y, labels=labels)


@pytest.mark.parametrize("labels", [None, "y's classes"])
@pytest.mark.parametrize(
    "classes, kinds", [(["a", 1], "string and number"), ([date(2024, 1, 1), 1], "number and date")]
)
def test_labels_of_two_kinds_in_y_are_refused_by_name(labels, classes, kinds):
    # np.unique(y) failed with "'<' not supported between instances of 'int' and 'str'"
    # (and 'datetime.date').
    y = np.array(classes * 2, dtype=object)
    labels = None if labels is None else classes
    with pytest.raises(ValueError, match=rf"^Mix of label input types \({kinds}\) in y\."):
        classwise_report({"erm": y}, y, labels=labels)


def test_dates_and_datetimes_in_y_are_refused_by_name():
    # np.unique(y) failed with "can't compare datetime.datetime to datetime.date"; date
    # labels against datetime predictions scored every class 0%.
    y = np.array([date(2024, 1, 1), datetime(2024, 1, 2)] * 2)
    with pytest.raises(ValueError, match=r"^Mix of label input types \(date and datetime\) in y\."):
        classwise_report({"erm": y}, y)
    days = np.array([date(2024, 1, 1), date(2024, 1, 2)] * 2)
    times = np.array([datetime(2024, 1, 1), datetime(2024, 1, 2)] * 2)
    with pytest.raises(ValueError, match=r"'erm' cannot be .*\(date and datetime\)"):
        classwise_report({"erm": times}, days)


def test_per_class_table_lists_tied_classes_in_label_order():
    # Reference accuracies 25, 50, 75, 75, 0, 0 %: classes 2 and 3 tie, as do 4 and 5.
    y = np.repeat(np.arange(6), 4)
    pred = np.array([0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 5, 5, 5, 5, 0, 0, 0, 0])
    report = classwise_report({"erm": pred}, y)
    assert report.per_class["erm"] == [0.25, 0.5, 0.75, 0.75, 0.0, 0.0]
    table = report.to_text(per_class=True).split("spread of per-class accuracy\n")[1]
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["2", "3", "1", "0", "4", "5"]


def test_a_single_label_is_refused_by_name():
    # A scalar has no length: it raised a bare TypeError "len() of unsized object".
    with pytest.raises(ValueError, match="labels must hold each class of y once"):
        classwise_report({"erm": [0, 0]}, [0, 0], labels=0)


def test_every_empty_group_is_explained_under_the_table():
    # One class is the worst one, hard: neither easy nor medium has a class.
    report = classwise_report({"ERM": [0, 0]}, [0, 0])
    for text in (report.to_text(), report.to_markdown()):
        assert text.endswith("; nan: no class in the easy or medium group")


def test_missing_scores_given_as_none_print_as_nan():
    # None is how to_dict and in_percent write a missing score.
    report = classwise_report({"a": [0, 1, 1]}, [0, 1, 1])
    report.rows["a"]["medium"] = None
    assert report.to_text().splitlines()[2].split()[3] == "nan"
    assert "| nan |" in report.to_markdown()


@pytest.mark.parametrize(
    "name, shown",
    [
        # A backslash escapes what follows it: "a\|b" unescaped ends the cell at '|'.
        ("a\\|b", "a\\\\\\|b"),
        # Brackets make a link: "[x](y)" would show as a link to y.
        ("[x](y)", "\\[x\\](y)"),
        # Dollars open math where Markdown renders it (GitHub): "$5-$10" showed as math.
        ("$5-$10", "\\$5-\\$10"),
    ],
)
def test_markdown_escapes_backslashes_and_brackets(name, shown):
    report = classwise_report({name: [name, "c"]}, [name, "c"])
    markdown = report.to_markdown(per_class=True)
    assert f"| {shown} | " in markdown  # the model's row and the class's row
    assert f"| class | group | {shown} |" in markdown


def test_a_line_break_in_the_reference_name_keeps_the_note_on_one_line():
    text = classwise_report({"erm\nv2": [0, 1, 1]}, [0, 1, 1]).to_text()
    assert text.splitlines()[3].startswith("test accuracy in %; easy / medium / hard: class "
                                           "terciles of erm v2; std: spread")  # fmt: skip


class _CountedReads:
    """Labels that count how often they are read as an array."""

    def __init__(self, labels):
        self.labels, self.reads = np.asarray(labels), 0

    def __array__(self, dtype=None, copy=None):
        self.reads += 1
        return self.labels if dtype is None else self.labels.astype(dtype)

    def __len__(self):
        return len(self.labels)


@pytest.mark.parametrize("labels", [None, ["c", "b", "a"]])
def test_y_is_read_once(labels):
    # y was read (and checked: a pandas column of text, a second each for ImageNet's
    # labels) by every score the report made of it, twice per model and once more.
    y = _CountedReads(["a", "b", "c", "a", "b", "c"])
    report = classwise_report(
        {"erm": ["a", "b", "c", "a", "a", "a"], "mr2": ["a", "b", "c", "b", "b", "c"]},
        y,
        labels=labels,
    )
    assert y.reads == 1
    expected = classwise_report(
        {"erm": ["a", "b", "c", "a", "a", "a"], "mr2": ["a", "b", "c", "b", "b", "c"]},
        y.labels,
        labels=labels,
    )
    assert report == expected


def test_the_labels_given_are_read_once():
    # labels= was read and checked twice: refused before y, then read again for the order.
    labels = _CountedReads(["c", "b", "a"])
    report = classwise_report({"erm": ["a", "b", "c", "a"]}, ["a", "b", "c", "b"], labels=labels)
    assert labels.reads == 1
    assert report.labels == ["c", "b", "a"]


@pytest.mark.parametrize("labels", [None, ["c", "b", "a"]])
def test_y_is_checked_once(labels, label_checks):
    # Each model's scores checked y again, as y_true (its missing labels, NaN, kinds): half
    # a second each for a pandas column of ImageNet's labels as text.
    y = np.array(["a", "b", "c", "a", "b", "c"], dtype=object)
    models = {"erm": y[[0, 1, 2, 0, 0, 0]], "mr2": y[[0, 1, 2, 1, 1, 2]], "x": y}
    classwise_report(models, y, labels=labels)
    assert label_checks.count("y") == 1
    assert "y_true" not in label_checks


@pytest.mark.parametrize("kind", ["objects", "pandas", "string"])
def test_text_held_as_objects_reports_as_numpy_s(kind):
    # Text held as objects is looked up by a hash table, NumPy's text by a sort: the same
    # report, classes in the same order.
    rng = np.random.default_rng(0)
    names = np.array(["b", "a", "é", "B", "ab", "😀"])
    y, erm, mr2 = (names[rng.integers(0, 6, 200)] for _ in range(3))
    if kind == "objects":
        held = y.astype(object), erm.astype(object)
    else:
        pd = pytest.importorskip("pandas")
        dtype = "string" if kind == "string" else object
        held = pd.Series(y, dtype=dtype), pd.Series(erm, dtype=dtype)
    report = classwise_report({"erm": held[1], "mr2": mr2}, held[0])
    assert report == classwise_report({"erm": erm, "mr2": mr2}, y)
    order = ["😀", "a", "ab", "b", "B", "é"]
    assert classwise_report({"erm": held[1]}, held[0], labels=order).labels == order


def test_text_ending_in_a_nul_is_a_class_of_its_own():
    # NumPy's text drops trailing NULs ('a\x00' reads 'a'): the report's groups, once
    # passed on as a dict of the labels, lost the class 'a\x00' ("y_true has classes
    # ['a\x00'] that are not in groups").
    y = np.array(["a\x00", "a", "b", "a"], dtype=object)
    report = classwise_report({"erm": np.array(["a", "a", "b", "a\x00"], dtype=object)}, y)
    assert report.labels == ["a", "a\x00", "b"]
    assert report.per_class["erm"] == [0.5, 0.0, 1.0]
