"""The mr2-probe command line: inputs, grid search, outputs, label convention and errors."""

import ast
import errno
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from argparse import Namespace
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning, FitFailedWarning
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import mr2_probe.cli._fitting as cli_fitting
import mr2_probe.cli._main as cli_main
from mr2_probe import MR2LinearClassifier
from mr2_probe._data import is_h5_dataset
from mr2_probe.cli import UsageError, load_xy, main
from mr2_probe.cli._cli_terms import _in_cli_terms
from mr2_probe.cli._models import _cv_probe, _estimators, _model, _without_unused
from mr2_probe.cli._options import _grid, _parser
from mr2_probe.cli._outputs import _OUTPUTS
from tests._alarm import fails_after_waiting

FASHION = ["T-shirt/top", "Trouser", "Ankle boot"]
OUTPUTS = {
    "report.txt", "report.md", "report.json", "class_accuracy.png", "margins.png",
    "groups.png", "models.joblib", "command.json",
}  # fmt: skip


def test_the_out_guard_names_every_file_a_run_writes():
    # --out refuses a folder holding files of these names that no run wrote (_OUTPUTS);
    # the runs below list what they write: OUTPUTS, class names, the CV curve, the front
    # (test_front.py's CLI run).
    assert set(_OUTPUTS) == OUTPUTS | {"class_names.json", "cv_curve.png", "front.png"}


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    folder = tmp_path_factory.mktemp("digits")
    np.savez(folder / "train.npz", X=X[::2], y=y[::2])
    np.savez(folder / "test.npz", features=X[1::2], labels=y[1::2])
    np.save(folder / "X.npy", X)
    np.save(folder / "y.npy", y)
    return folder


def _blobs(n_per_class: int, seed: int, d: int = 6):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=3.0, size=(3, d))
    y = np.repeat(np.arange(3), n_per_class)
    return (centres[y] + rng.normal(size=(len(y), d))).astype(np.float32), y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small inputs, good and broken, for the options and the errors."""
    folder = tmp_path_factory.mktemp("inputs")
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    np.savez(folder / "train.npz", X=X, y=y)
    np.savez(folder / "test.npz", X=X_test, y=y_test)
    np.savez(folder / "names.npz", X=X_test, y=np.array(FASHION)[y_test])
    np.savez(folder / "bool.npz", X=X_test, y=y_test > 0)
    np.savez(folder / "one_class.npz", X=X[y == 2], y=np.array(FASHION)[y[y == 2]])
    np.savez(folder / "wide.npz", X=np.c_[X_test, X_test], y=y_test)
    np.savez(folder / "other.npz", a=X, b=y)
    np.savez(folder / "cube.npz", X=X[:, :, None], y=y)
    np.savez(folder / "complex.npz", X=X + 1j, y=y)
    shutil.copy(folder / "train.npz", folder / "archive.npy")  # a .npz under a .npy name
    with_nan = X.copy()
    with_nan[5, 2] = np.nan
    np.savez(folder / "nan.npz", X=with_nan, y=y)
    np.save(folder / "X.npy", X)
    np.save(folder / "y.npy", y)
    np.save(folder / "y_short.npy", y[:-1])
    np.save(folder / "y_half.npy", y + 0.5)
    np.savez(folder / "complex_y.npz", X=X, y=y + 0j)
    np.savez(folder / "huge_y.npz", X=X, y=y + 2.0**53)  # whole, but not read as integers
    np.savez(folder / "record_y.npz", X=X, y=np.array([(k,) for k in y], dtype=[("k", "i4")]))
    # Class 7 has one sample, which no stratified split puts on both sides.
    np.savez(folder / "single.npz", X=np.r_[X, X[:1]], y=np.r_[y, 7])
    np.savez(folder / "pair.npz", X=np.r_[X, X[:2]], y=np.r_[y, 7, 7])  # one, once held out
    # One large class and three of two samples each: a split can leave those out of a side.
    uneven = np.r_[np.zeros(60, int), np.repeat([1, 2, 3], 2)]
    for name, seed in (("uneven", 0), ("uneven_test", 1)):
        X_uneven = np.random.default_rng(seed).normal(size=(66, 4))
        np.savez(folder / f"{name}.npz", X=X_uneven, y=uneven)
    (folder / "garbage.npz").write_bytes(b"not numpy at all")
    (folder / "labels.txt").write_text("cat\ndog\n")
    np.save(folder / "y_object.npy", np.array(FASHION)[y].astype(object), allow_pickle=True)
    np.save(folder / "X_object.npy", X.astype(object), allow_pickle=True)
    np.savez(folder / "y_object.npz", X=X, y=np.array(FASHION)[y].astype(object))
    np.savez(folder / "X_object.npz", features=X.astype(object), labels=y)
    (folder / "images").mkdir()
    (folder / "X.csv").write_text("0.5,1.5,0\n")  # features as text: no format read here
    (folder / "notes.txt").write_text("a regular file\n")
    return folder


def _error(argv, capsys):
    """Exit status and stderr lines of a run that must fail."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err.strip().splitlines()


def _refused(argv, capsys):
    """The one error line of a run that must stop before any fit (exit status 2)."""
    code, lines = _error([*argv, "--no-progress"], capsys)
    assert code == 2
    # One line: no traceback, and no "fitting ..." line either (nothing was fitted).
    assert len(lines) == 1 and lines[0].startswith("mr2-probe: error: "), lines
    return lines[0]


def test_train_and_test_files_print_the_classwise_table(digits_files, capsys):
    argv = [str(digits_files / "train.npz"), "--test", str(digits_files / "test.npz")]
    assert main([*argv, "--c-bar", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    header, _, erm, mr2 = out.splitlines()[:4]
    assert header.split()[1:] == ["overall", "easy", "medium", "hard", "worst", "std"]
    assert erm.split()[0] == "ERM" and mr2.split()[0] == "MR2"
    assert float(erm.split()[1]) > 90


def test_a_model_short_of_tol_is_said_in_one_line(digits_files, capsys):
    argv = [str(digits_files / "train.npz"), "--test", str(digits_files / "test.npz")]
    assert main([*argv, "--max-iter", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("mr2-probe: warning:")]
    assert [line.split(":")[2].strip() for line in said] == ["ERM", "MR2"]
    assert all("its fit stopped short of tol (lbfgs did not converge" in line for line in said)
    # The advice in the options of mr2-probe, not in the estimator's parameters.
    assert all(
        line.endswith("in 2 iterations (--max-iter 2). Raise --max-iter, or scale the features "
                      "(--feature-scaling standard).)")
        for line in said
    )  # fmt: skip
    assert main([*argv, "--max-iter", "2", "--feature-scaling", "standard", "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(said) == 2 and all(line.endswith("Raise --max-iter.)") for line in said)


@pytest.mark.parametrize(
    "message, scaling, expected",
    [
        (
            "lbfgs did not converge in max_iter=5 iterations. Increase max_iter or scale the "
            "features (e.g. StandardScaler).",
            "l2",
            "lbfgs did not converge in 5 iterations (--max-iter 5). Raise --max-iter, or scale the "
            "features (--feature-scaling standard).",
        ),
        (
            "The front's fits of tilt=1 stopped short. Increase max_iter, or scale the features.",
            "standard",
            "The front's fits of tilt=1 stopped short. Raise --max-iter.",
        ),
        (
            "x: the optimum may still be some way off. Use float64 features (and scale them, "
            "e.g. StandardScaler) for a tighter solution, or a larger tol to accept this one.",
            None,
            "x: the optimum may still be some way off. Use float64 features (X saved as "
            "float64 in a .npy or .npz file) (and scale them, --feature-scaling standard) for a "
            "tighter solution; mr2-probe keeps this one.",
        ),
        (
            "x: where it stops, as scikit-learn's lbfgs does. Use a larger tol (and, for "
            "features of very different magnitudes, scale them, e.g. StandardScaler).",
            "standard",
            "x: where it stops, as scikit-learn's lbfgs does. mr2-probe keeps the fit as it "
            "stopped.",
        ),
        (
            # (a diverged fit's, at a --grid learning_rate too large for scaled features)
            "is too large a step for these features. Use a smaller learning_rate (or scale the "
            "features, e.g. StandardScaler) and fit again.",
            "standard",
            "is too large a step for these features. Use a smaller --grid learning_rate and fit "
            "again.",
        ),
        (
            "(a warm start from a converged fit; use float64 features or a larger tol), or",
            None,
            "(a warm start from a converged fit; use float64 features (X saved as float64 in a "
            ".npy or .npz file); mr2-probe keeps the fit as it stopped), or",
        ),
    ],
)
def test_warnings_give_their_advice_in_the_options_of_the_command(message, scaling, expected):
    assert _in_cli_terms(message, Namespace(feature_scaling=scaling, grid=[], Cs=None)) == expected


_BY_A_CONSTANT = (
    "a constant (values this large overflow the arithmetic of --feature-scaling standard itself)"
)


# Under SKLEARN_ASSUME_FINITE (scikit-learn's assume_finite=True): X was checked by mr2-probe.
_UNCHECKED_X = (
    "the features are too large (mr2-probe finds X finite whether SKLEARN_ASSUME_FINITE is set "
    "or not). Scale them (--feature-scaling standard, or divide X by a constant) and fit again."
)
_UNCHECKED_SCALED = (
    "the features scaled by --feature-scaling standard hold NaN or infinity, which "
    "SKLEARN_ASSUME_FINITE left unchecked, where X held none: values this large overflow the "
    "scaling's own arithmetic. Divide X by a constant and fit again (unset "
    "SKLEARN_ASSUME_FINITE, which any value but an empty one sets, 0 too, to have them checked)."
)


@pytest.mark.parametrize(
    ("assume_finite", "scaling", "expected"),
    [
        (True, "none", _UNCHECKED_X),
        (True, "standard", _UNCHECKED_SCALED),
        (
            False,
            "none",
            "Scale them (--feature-scaling standard, or divide X by a constant) and fit again.",
        ),
        (False, "standard", f"Divide X by {_BY_A_CONSTANT} and fit again."),
    ],
)
def test_overflow_errors_give_their_advice_in_the_options_of_the_command(
    assume_finite, scaling, expected
):
    # Under --feature-scaling standard, the errors of features too large (or, unchecked,
    # not finite) still said to scale them with StandardScaler, which the run did: values
    # that overflow the fit once scaled overflowed the scaler's own arithmetic (its NaN),
    # and dividing X is what is left.
    import sklearn
    import torch

    from mr2_probe._classifier import _overflow_message

    with sklearn.config_context(assume_finite=assume_finite):
        message = _overflow_message("the class statistics (‖x‖²) overflow", torch.float32)
    said = _in_cli_terms(message, Namespace(feature_scaling=scaling, grid=[], Cs=None))
    assert said.endswith(expected) and "StandardScaler" not in said
    # (scikit-learn's assume_finite, set by SKLEARN_ASSUME_FINITE, is no option of the command)
    assert "assume_finite" not in said


@pytest.mark.parametrize("scaling", ["none", "standard"])
def test_overflow_errors_under_sklearn_assume_finite_name_the_variable(tmp_path, capsys, scaling):
    # SKLEARN_ASSUME_FINITE=1 (scikit-learn reads it once, into assume_finite) skips the
    # check of the features: the overflow error said "Check X with assume_finite=False",
    # which names no option of the command (and X, which mr2-probe checks, held no NaN).
    import sklearn

    X, y = _blobs(20, seed=1)
    np.savez(tmp_path / "huge.npz", X=X.astype(np.float64) * 1e200, y=y)
    argv = [str(tmp_path / "huge.npz"), "--feature-scaling", scaling, "--no-progress"]
    with sklearn.config_context(assume_finite=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the scaler's overflow)
        code, lines = _error(argv, capsys)
    said = _UNCHECKED_X if scaling == "none" else _UNCHECKED_SCALED
    assert code == 2 and lines[-1] == (
        "mr2-probe: error: Cannot fit: the class statistics (‖x‖²) overflow in float64 "
        f"arithmetic: {said}"
    )


@pytest.mark.parametrize(
    ("options", "prefix"),
    [([], ""), (["--grid", "C=0.1,1", "--cv", "2"], "ERM grid: every fit of its search failed")],
    ids=["fit", "grid"],
)
def test_features_the_scaling_makes_nan_of_are_told_to_be_divided(
    tmp_path, options, prefix, capsys
):
    # Finite features too large for StandardScaler's arithmetic (its variance overflows
    # float64) were told scikit-learn's "Input X contains NaN ... consider
    # HistGradientBoostingClassifier" of X, which mr2-probe had found finite.
    X, y = _blobs(20, seed=1)
    np.savez(tmp_path / "huge.npz", X=X.astype(np.float64) * 1e200, y=y)
    argv = [str(tmp_path / "huge.npz"), "--feature-scaling", "standard", *options]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the scaler's overflow)
        code, lines = _error([*argv, "--no-progress"], capsys)
    assert code == 2 and lines[-1].startswith(f"mr2-probe: error: {prefix}")
    assert lines[-1].endswith(
        "Cannot fit: the features scaled by --feature-scaling standard hold NaN, where X held "
        "none: values this large overflow the scaling's own arithmetic. Divide X by a constant "
        "and fit again."
    )
    # (divided, they fit)
    np.savez(tmp_path / "divided.npz", X=X.astype(np.float64), y=y)
    argv[0] = str(tmp_path / "divided.npz")
    assert main([*argv, "--no-progress"]) == 0


def _far_out(tmp_path, dtype, value):
    """A training file whose column 2 barely varies and a --test file (of ``dtype``) whose
    row 4 holds ``value`` there: finite, but far out of the range the scaler is fitted on."""
    X, y = _blobs(20, seed=1)
    X[:, 2] = 1 + np.random.default_rng(0).normal(size=len(X)).astype(np.float32) * 1e-6
    X_test, y_test = _blobs(10, seed=2)
    X_test = X_test.astype(dtype)
    X_test[4, 2] = value
    np.savez(tmp_path / "train.npz", X=X, y=y)
    np.savez(tmp_path / "test.npz", X=X_test, y=y_test)
    return tmp_path / "train.npz", tmp_path / "test.npz"


@pytest.mark.parametrize("options", [[], ["--tilt", "0.5"]], ids=["main", "front"])
def test_test_features_the_scaling_makes_infinite_are_refused_before_any_fit(
    tmp_path, capsys, options
):
    # A --test row far out of the range the scaler is fitted on is infinite once scaled:
    # the run ended after its fits in scikit-learn's "Input X contains infinity or a value
    # too large for dtype('float32')", which named neither --test nor a cure (the front's
    # error said it too). It is refused before any fit, with the row and the cures that work.
    train, test = _far_out(tmp_path, np.float32, 1e38)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard", *options]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (none said by the check)
        line = _refused(argv, capsys)
    std = np.load(train)["X"][:, 2].astype(np.float64).std()
    assert line == (
        f"mr2-probe: error: --test {test}: 1 of its 30 rows is made non-finite by "
        "--feature-scaling standard, fitted on the training features (the first is row 4: "
        f"its column 2 holds 1e+38, where the training features' standard deviation is "
        f"{std:.3g}); check that row and drop or correct it, or give the --test features as "
        "float64, whose arithmetic holds them scaled"
    )
    with np.load(test) as data:
        X_test, y_test = data["X"], data["y"]
    for X_cured, y_cured in ((np.delete(X_test, 4, 0), np.delete(y_test, 4)), (X_test, y_test)):
        np.savez(test, X=X_cured.astype(np.float64), y=y_cured)  # (each cure, followed)
        assert main([*argv, "--no-progress"]) == 0


def test_float64_test_features_the_scaling_makes_infinite_are_told_to_drop_the_row(
    tmp_path, capsys
):
    # float64 cannot hold them scaled either: the line gives that cure alone.
    train, test = _far_out(tmp_path, np.float64, 1e308)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard"]
    line = _refused(argv, capsys)
    assert line.endswith("; check that row and drop or correct it"), line
    assert "row 4: its column 2 holds 1e+308" in line


def test_test_rows_far_from_a_constant_column_are_not_said_to_be_a_standard_deviation_away(
    tmp_path, capsys
):
    # A column constant in the training features is scaled by 1, where a --test row's
    # x - mean overflows float32 all the same: the line said their standard deviation
    # was 1.
    train, test = _far_out(tmp_path, np.float32, 2e38)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    X[:, 2] = -2e38
    np.savez(train, X=X, y=y)
    line = _refused([str(train), "--test", str(test), "--feature-scaling", "standard"], capsys)
    assert "(the first is row 4: its column 2 holds 2e+38, where the training features' " in line
    assert "values are all about -2e+38, scaled by 1); check that row" in line, line


def test_held_out_rows_the_scaling_makes_infinite_are_named_by_their_file(tmp_path, capsys):
    # Without --test, the rows held out of the training file by --test-size, the first
    # named by its row in that file (it was not named: the user could not find it).
    from sklearn.model_selection import train_test_split

    train, test = _far_out(tmp_path, np.float32, 1)
    with np.load(test) as data:  # (its row 4 appended to the training file, far out)
        X, y = data["X"], data["y"]
    with np.load(train) as data:
        X, y = np.r_[data["X"], X[4:5]], np.r_[data["y"], y[4]]
    X[-1, 2] = 1e38
    np.savez(train, X=X, y=y)
    rows = np.arange(len(y))
    seed = next(  # (one whose split holds it out, as mr2-probe splits)
        s
        for s in range(100)
        if rows[-1] in train_test_split(rows, test_size=0.5, stratify=y, random_state=s)[1]
    )
    argv = [str(train), "--feature-scaling", "standard", "--test-size", "0.5"]
    line = _refused([*argv, "--seed", str(seed)], capsys)
    assert line.startswith(
        f"mr2-probe: error: the rows of {train} held out by --test-size: 1 of its 31 rows is "
        "made non-finite by --feature-scaling standard, fitted on the training features (the "
        f"first is row {len(y) - 1}: its column 2 holds 1e+38, "
    ), line
    assert line.endswith(
        f"or give the features of {train} as float64, whose arithmetic holds them scaled"
    )


def _front_parts(y):
    """The rows of the front's fitting and validation parts, as mr2-probe splits them at
    the default seed and --val-size."""
    from sklearn.model_selection import train_test_split

    return train_test_split(np.arange(len(y)), test_size=0.1, stratify=y, random_state=0)


def _far_in_the_front(tmp_path, value, test_value=1.0):
    """:func:`_far_out`'s files, ``value`` in column 2 of the training row that the front
    validates on first (:func:`_front_parts`), and ``test_value`` in --test's row 4; the
    training file and that row."""
    train, test = _far_out(tmp_path, np.float32, test_value)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    row = _front_parts(y)[1][0]
    X[row, 2] = value
    np.savez(train, X=X, y=y)
    return train, test, int(row)


def test_front_rows_the_scaling_of_its_fitting_part_makes_infinite_are_refused(tmp_path, capsys):
    # The front fits its scaler on its fitting part: a validation row far out of that part's
    # range is infinite once scaled, though within the training features' (it widens
    # them), which the check of the test rows passed. The front failed in scikit-learn's
    # "Input X contains infinity", naming neither the row nor a cure; it is refused before
    # any fit, with the part, the row and the cures that work.
    train, test, row = _far_in_the_front(tmp_path, 1e38)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard", "--tilt", "0.5"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (none said by the check)
        line = _refused(argv, capsys)
    assert line.startswith(
        f"mr2-probe: error: the front's validation part of {train} (--val-size 0.1): 1 of its "
        "6 rows is made non-finite by --feature-scaling standard, fitted on the front's "
        f"fitting part of the training features (the first is row {row}: its column 2 holds "
        "1e+38, where that part's standard deviation is "
    ), line
    assert line.endswith(
        f"); check that row and drop or correct it, or give the features of {train} as "
        "float64, whose arithmetic holds them scaled"
    )
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    for X_cured, y_cured in ((np.delete(X, row, 0), np.delete(y, row)), (X, y)):
        np.savez(train, X=X_cured.astype(np.float64), y=y_cured)  # (each cure, followed)
        assert main([*argv, "--no-progress"]) == 0


def test_test_rows_the_scaling_of_the_front_s_fitting_part_makes_infinite_are_refused(
    tmp_path, capsys
):
    # A --test row that the training features' scaler holds (1e33, where a training row of
    # 1e30 widens their range) is infinite under the front's, fitted on a part without it.
    train, test, _ = _far_in_the_front(tmp_path, 1e30, 1e33)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard"]
    line = _refused([*argv, "--offsets", "1"], capsys)
    assert line.startswith(
        f"mr2-probe: error: --test {test}: 1 of its 30 rows is made non-finite by "
        "--feature-scaling standard, fitted on the front's fitting part of the training "
        "features (the first is row 4: its column 2 holds 1e+33, where that part's standard "
        "deviation is "
    ), line
    assert main([*argv, "--no-progress"]) == 0  # (no front: the main models hold it)


def test_offsets_fold_rows_the_scaling_of_the_rest_makes_infinite_are_refused(tmp_path, capsys):
    # --offsets tunes on the logits of folds of the front's fitting part, each predicted by
    # a model (and scaler) fitted on the rest: a row of that part far out of the rest's
    # range, which the checks of the front's parts passed, failed the front in
    # scikit-learn's "Input X contains infinity".
    from sklearn.model_selection import StratifiedKFold

    train, test, _ = _far_in_the_front(tmp_path, 1)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    fit = _front_parts(y)[0]
    X[fit[0], 2] = 1e38  # (in fold 0 of the fitting part, as the offsets split it)
    assert 0 in next(StratifiedKFold(3).split(fit, y[fit]))[1]
    np.savez(train, X=X, y=y)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard"]
    line = _refused([*argv, "--offsets", "1"], capsys)
    assert line.startswith(
        f"mr2-probe: error: fold 0 of the front's fitting part of {train} (one of the 3 that "
        "--offsets tunes its offsets on): 1 of its 18 rows is made non-finite by "
        "--feature-scaling standard, fitted on the rest of that part (the first is row "
        f"{fit[0]}: its column 2 holds 1e+38, where the rest's standard deviation is "
    ), line
    assert main([*argv, "--tilt", "0.5", "--no-progress"]) == 0  # (no offsets: no folds)


def test_refit_offsets_fold_rows_the_scaling_of_the_rest_makes_infinite_are_refused(
    tmp_path, capsys
):
    # An offsets point the front chooses is refitted on the whole training set, its offsets
    # tuned again on 3 folds of it, each predicted by a model (and scaler) fitted on the
    # rest. Two rows far out in one column, in one of those folds but in two of the front's
    # (each widening the other's rest), passed every check; the refit failed after all the
    # fits in scikit-learn's "Input X contains infinity".
    from sklearn.model_selection import StratifiedKFold

    train, test, _ = _far_in_the_front(tmp_path, 1)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    fit = _front_parts(y)[0]
    tuned = [fit[held] for _, held in StratifiedKFold(3).split(fit, y[fit])]
    refitted = next(StratifiedKFold(3).split(X, y))[1]  # (fold 0 of the refit's)
    far = [np.intersect1d(tuned[k], refitted)[0] for k in (0, 1)]
    X[far, 2] = 1e38
    np.savez(train, X=X, y=y)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard"]
    line = _refused([*argv, "--offsets", "1"], capsys)
    assert line.startswith(
        f"mr2-probe: error: fold 0 of the training features of {train} (one of the 3 that an "
        "--offsets point the front chooses tunes its offsets on, refitted on the whole "
        f"training set): 2 of its {len(refitted)} rows are made non-finite by "
        "--feature-scaling standard, fitted on the rest of the training features (the first "
        f"is row {min(far)}: its column 2 holds 1e+38, where the rest's standard deviation is "
    ), line
    assert main([*argv, "--tilt", "0.5", "--no-progress"]) == 0  # (no offsets: no refit folds)


def test_grid_fold_rows_the_scaling_of_the_rest_makes_infinite_are_refused(tmp_path, capsys):
    # --grid fits its scaler within each fold: a row far out of the rest's range failed
    # each setting's scoring there (a warning holding scikit-learn's traceback), every
    # setting scored NaN, and the search chose the first without a word of why.
    train, test, _ = _far_in_the_front(tmp_path, 1)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    X[7, 2] = 1e38
    np.savez(train, X=X, y=y)
    argv = [str(train), "--test", str(test), "--feature-scaling", "standard", "--grid", "C=0.1,1"]
    line = _refused(argv, capsys)
    assert re.match(
        rf"mr2-probe: error: fold \d of the 3 that --grid searches {re.escape(str(train))} on: 1 "
        "of its 20 rows is made non-finite by --feature-scaling standard, fitted on the rest of "
        r"the training features \(the first is row 7: its column 2 holds 1e\+38, where the "
        r"rest's standard deviation is [^)]*\); check that row and drop or correct it, or give "
        f"the features of {re.escape(str(train))} as float64, whose arithmetic holds them scaled$",
        line,
    ), line
    np.savez(train, X=X.astype(np.float64), y=y)  # (the cure, followed)
    assert main([*argv, "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_the_scalers_of_the_scaling_check_are_those_fitted_on_their_rows(dtype):
    # The check combines the moments of cells of X's rows (one pass over X) into each
    # scaler the run fits: each is StandardScaler's fitted on its rows, a near-constant
    # column's scale 1 as there, and it makes the same rows non-finite.
    from mr2_probe.cli._splits import _cell_moments, _scaler

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 5)) * [1e-6, 1, 1e3, 1, 0] + [1, 0, -5e3, 1e6, 7]
    X[:, 1] *= 1e-6 * (X[:, 1] > 0)  # (rows far out of some cells' range)
    X = (X * 100 if dtype == np.int64 else X).astype(dtype)
    cells = rng.integers(0, 7, len(X))  # (cell 6 left empty below)
    cells[cells == 6] = 0
    moments = _cell_moments(X, cells)
    large = {np.float32: 1e38, np.float64: 1e307, np.int64: 2**62}[dtype]
    far = np.r_[X[:20], np.full((1, 5), large, dtype)]
    for chosen in ([0, 1, 2, 3, 4, 5], [1, 2], [0, 5, 6], [3]):
        mask = np.isin(np.arange(len(moments[0])), chosen)
        scaler = _scaler(moments, mask)
        fitted = StandardScaler().fit(X[np.isin(cells, chosen)])
        np.testing.assert_allclose(scaler.mean_, fitted.mean_, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(scaler.scale_, fitted.scale_, rtol=1e-9)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(
                np.isfinite(scaler.transform(far)), np.isfinite(fitted.transform(far))
            )


def test_the_scaling_check_holds_less_than_the_features_in_memory(monkeypatch):
    # It fitted a StandardScaler on each part the run fits one on (X, each --grid fold's
    # rest, the front's fitting part, each --offsets fold's rest), each taking a float64
    # copy of its rows: over three times X's size at its peak, and X read ten times over.
    # The cells' moments are taken a block of rows at a time (256 here).
    import tracemalloc

    from mr2_probe.cli import _splits

    monkeypatch.setattr(_splits, "block_rows", lambda n_features, n_classes: 256)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20000, 64), dtype=np.float32), rng.integers(0, 5, 20000)
    argv = ["x.npz", "--test", "t.npz", "--feature-scaling", "standard", "--grid", "C=1,2"]
    args = _checked([*argv, "--cv", "5", "--tilt", "0.5", "--offsets", "1"])
    tracemalloc.start()
    try:
        _splits._check_scaled_test(X, y, X[:100], args, searched=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * X.nbytes, peak / X.nbytes


@pytest.mark.parametrize(
    "options",
    [["--offsets", "1"], ["--grid", "C=1,2", "--cv", "2", "--tilt", "0.5"]],
    ids=["offsets", "grid"],
)
def test_the_scaling_check_scales_each_part_a_block_of_rows_at_a_time(monkeypatch, options):
    # Each part that a model scores was copied out of X and scaled whole: an --offsets
    # fold (0.3 of X) twice, a --grid fold of 2 (half of X) twice, the test rows (as many
    # as X's here) once; the peak was 1.5 and 2 times X's size. A block of rows at a time
    # (256 here), the check holds X's moments, its splits' indices and a block or two.
    import tracemalloc

    from mr2_probe.cli import _splits

    monkeypatch.setattr(_splits, "block_rows", lambda n_features, n_classes: 256)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20000, 64), dtype=np.float32), rng.integers(0, 5, 20000)
    args = _checked(["x.npz", "--test", "t.npz", "--feature-scaling", "standard", *options])
    tracemalloc.start()
    try:
        _splits._check_scaled_test(X, y, X, args, searched="--grid" in options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * X.nbytes, peak / X.nbytes


def test_the_scaling_check_counts_and_names_the_rows_of_all_its_blocks(monkeypatch):
    # Scaled a block of rows at a time (4 here), a part's rows made non-finite are counted
    # over its blocks, the first of the part named (its rows of X in their order there).
    from sklearn.preprocessing import StandardScaler

    from mr2_probe.cli import _splits

    monkeypatch.setattr(_splits, "block_rows", lambda n_features, n_classes: 4)
    rng = np.random.default_rng(0)
    X = (1 + rng.normal(size=(30, 3)) * 1e-6).astype(np.float32)
    scaler = StandardScaler().fit(X[:20])
    X[[21, 25, 28], 1] = [2e38, 1e38, 3e38]
    rows = np.arange(20, 30)[::-1]  # (row 28 the part's second, in its first block)
    part = _splits._Scored("a part", X, lambda row: f"row {rows[row]}", "its features", rows)
    with pytest.raises(UsageError) as info:
        _splits._check_scaled(scaler, "that part", "that part's", [part])
    assert str(info.value).startswith(
        "a part: 3 of its 10 rows are made non-finite by --feature-scaling standard, fitted "
        "on that part (the first is row 28: its column 1 holds 3e+38, where that part's "
        "standard deviation is "
    ), info.value
    assert str(info.value).endswith(
        "check those rows and drop or correct them, or give its features as float64, whose "
        "arithmetic holds them scaled"
    )


def test_front_rows_of_a_held_out_run_the_scaling_makes_infinite_are_refused(tmp_path, capsys):
    # Without --test, the front splits the rows not held out by --test-size: its part is
    # named, as the rows held out are, by the training file, and its row by its row there.
    from sklearn.model_selection import train_test_split

    train, _, _ = _far_in_the_front(tmp_path, 1)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    rows = np.sort(
        train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)[0]
    )
    validated = train_test_split(rows, test_size=0.1, stratify=y[rows], random_state=0)[1][0]
    X[validated, 2] = 1e38
    np.savez(train, X=X, y=y)
    argv = [str(train), "--feature-scaling", "standard", "--tilt", "0.5"]
    line = _refused(argv, capsys)
    assert line.startswith(
        f"mr2-probe: error: the front's validation part of {train} (--val-size 0.1): 1 of its "
        "5 rows is made non-finite by --feature-scaling standard, fitted on the front's "
        f"fitting part of the training features (the first is row {validated}: its column 2 "
        "holds 1e+38, "
    ), line


@pytest.mark.parametrize("grid", [[], ["learning_rate=0.003,0.01"]])
def test_warnings_name_the_grid_for_the_learning_rate(grid):
    # mr2-probe has no --learning-rate (refused as unrecognized): --grid sets it.
    message = (
        "adam did not converge in max_iter=5 epochs. Increase max_iter or scale the features "
        "(e.g. StandardScaler). If loss_curve_ oscillates, use a smaller learning_rate than 0.003."
    )
    said = _in_cli_terms(message, Namespace(feature_scaling="standard", grid=grid, Cs=None))
    assert said.endswith("use a smaller --grid learning_rate than 0.003.")
    assert "learning_rate" not in said.replace("--grid learning_rate", "")


def test_a_search_whose_every_fit_fails_says_why_in_one_line(tmp_path, capsys):
    # SGD diverges on features of this size in every fold: scikit-learn's "All the 2 fits
    # failed" was printed with its tracebacks on one line, cut before the estimator's error.
    X, y = _blobs(30, seed=1)
    np.savez(tmp_path / "large.npz", X=X * 1e5, y=y)
    argv = [str(tmp_path / "large.npz"), "--grid", "solver=sgd", "--cv", "2", "--max-iter", "2"]
    code, lines = _error([*argv, "--no-progress", "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and lines[-1].startswith("mr2-probe: error: ERM grid: every fit of its")
    assert "Traceback" not in lines[-1] and "File " not in lines[-1]
    assert "Cannot fit: the sgd solver diverged" in lines[-1]
    assert "Use a smaller --grid learning_rate" in lines[-1]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_cs_search_s_advice_on_the_learning_rate_can_be_followed(tmp_path, capsys):
    # Under --Cs a diverged fit said "Use a smaller --grid learning_rate", and --grid beside
    # --Cs is refused ("use one of them"): the advice is a --grid search of C in its place.
    X, y = _blobs(20, seed=1, d=4)
    np.savez(tmp_path / "huge.npz", X=X * 1e7, y=y)
    argv = [str(tmp_path / "huge.npz"), "--lam", "0.5", "--cv", "2", "--max-iter", "5"]
    code, lines = _error([*argv, "--Cs", "3", "--no-progress"], capsys)
    assert code == 2 and "the adam solver diverged" in lines[-1]
    advice = re.search(r"search C with --grid C=V1,V2,\.\.\. --grid learning_rate=V ", lines[-1])
    assert advice is not None, lines[-1]
    followed = ["--grid", "C=0.0001,1,10000", "--grid", "learning_rate=3e-5"]
    assert main([*argv, *followed, "--no-progress"]) == 0
    assert "MR2 grid: best parameters by worst_class" in capsys.readouterr().out


@pytest.mark.parametrize(("head", "value"), [("linear", "C"), ("cosine", "scale")])
def test_warnings_under_cs_name_a_grid_search_in_its_place_for_the_learning_rate(head, value):
    message = (
        "adam did not converge in max_iter=5 epochs. Increase max_iter or scale the features "
        "(e.g. StandardScaler). If loss_curve_ oscillates, use a smaller learning_rate than 0.003."
    )
    args = Namespace(feature_scaling="standard", grid=[], Cs=3, head=head)
    assert _in_cli_terms(message, args).endswith(
        "use a smaller learning_rate than 0.003 (only --grid sets it, and --grid excludes "
        f"--Cs: search {value} with --grid {value}=V1,V2,... --grid learning_rate=V instead)."
    )


def test_warnings_name_the_grid_where_it_sets_max_iter():
    message = (
        "lbfgs did not converge in max_iter=2 iterations. Increase max_iter or scale the "
        "features (e.g. StandardScaler)."
    )
    args = Namespace(feature_scaling="none", grid=["C=1", " max_iter =1,2"], Cs=None)
    assert _in_cli_terms(message, args) == (
        "lbfgs did not converge in 2 iterations (--grid max_iter=2). Raise --grid max_iter, "
        "or scale the features (--feature-scaling standard)."
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    ("rank", "Cs", "expected"),
    [
        (None, None, "at C=1: a larger C, or a --grid projection_rank, also helps). Use"),
        (2, None, "at C=1: a larger C, or a smaller --grid projection_rank, also helps). Use"),
        (
            None,
            3,
            "at C=0.0001: a projection_rank (only --grid sets it, and --grid excludes --Cs: "
            "search C with --grid C=V1,V2,... --grid projection_rank=R instead) also helps). Use",
        ),
    ],
    ids=["full", "low-rank", "Cs"],
)
def test_a_diverged_projection_s_advice_names_what_sets_its_rank(rank, Cs, expected):
    # A diverged fit with lam > 0 said "a projection_rank also helps", which no option of
    # the command sets: --grid does (refused beside --Cs).
    from mr2_probe import MR2LinearClassifierCV
    from mr2_probe._classifier import FitDivergedError

    X, y = _blobs(10, seed=1, d=4)
    common = dict(lam=0.5, max_iter=5, device="cpu")
    if Cs is None:
        probe = MR2LinearClassifier(projection_rank=rank, **common)
    else:
        probe = MR2LinearClassifierCV(Cs, cv=2, **common)
    with pytest.raises(FitDivergedError) as info:
        probe.fit(X * 1e7, y)
    grid = [] if rank is None else [f"projection_rank={rank},3"]
    args = Namespace(feature_scaling="none", grid=grid, Cs=Cs, head="linear")
    said = _in_cli_terms(info.value, args)
    assert expected in said
    # (under --Cs the one named as no option, in its advice)
    bare = said.replace("--grid projection_rank", "").count("projection_rank")
    assert bare == (Cs is not None)


def _failing_at_large_c(monkeypatch, solving: dict | None = None):
    """MR2LinearClassifierCV's fits with a projection (lam > 0, MR2's here, not ERM's) fail
    at C > 100, as a diverged minibatch fit fails, its advice in the estimator's terms;
    ``solving`` holds the value and lam of the last fit started."""
    from mr2_probe import MR2LinearClassifierCV
    from mr2_probe._classifier import FitDivergedError

    real = MR2LinearClassifierCV._path_solver
    solving = {} if solving is None else solving

    def path_solver(self, solver):
        solve = real(self, solver)

        def failing(head, data, value, cold, initial):
            solving.update(value=value, lam=self.lam)
            if self.lam > 0 and value > 100:
                raise FitDivergedError(
                    "Cannot fit: the adam solver diverged. Use a smaller learning_rate (or "
                    "scale the features, e.g. StandardScaler) and fit again."
                )
            return solve(head, data, value, cold, initial)

        return failing

    monkeypatch.setattr(MR2LinearClassifierCV, "_path_solver", path_solver)


def _cs_argv(tmp_path) -> list:
    """The command line of a --Cs search of MR2 (lam > 0) on blobs in ``tmp_path``, whose
    fits :func:`_failing_at_large_c` fails at C > 100."""
    X, y = _blobs(8, seed=1, d=4)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    path = str(tmp_path / "train.npz")
    return [path, "--Cs", "3", "--lam", "0.5", "--cv", "2", "--max-iter", "2", "--no-progress"]


def test_a_cs_search_s_failed_fits_give_their_advice_in_the_options_of_the_command(
    tmp_path, monkeypatch
):
    # Some values of --Cs failing (not all), MR2LinearClassifierCV's FitFailedWarning came
    # out as the library says it: "Use a smaller learning_rate (or scale the features, e.g.
    # StandardScaler)", options the command does not have (--grid, which sets learning_rate,
    # is refused beside --Cs).
    _failing_at_large_c(monkeypatch)
    argv = _cs_argv(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    (failed,) = [str(w.message) for w in caught if w.category is FitFailedWarning]
    assert failed.startswith("2 of 6 fits failed, their scores set to NaN and never chosen: C")
    assert failed.endswith(
        "Use a smaller learning_rate (only --grid sets it, and --grid excludes --Cs: search C "
        "with --grid C=V1,V2,... --grid learning_rate=V instead) (or scale the features, "
        "--feature-scaling standard) and fit again."
    )


def _undefined_below(monkeypatch, bound: float) -> None:
    """MR2LinearClassifierCV's fits with a projection fail at C > 100 and score NaN (a
    scorer undefined there) at C < ``bound``."""
    import mr2_probe._cv

    solving = {}
    _failing_at_large_c(monkeypatch, solving)
    real = mr2_probe._cv.check_classwise_scoring

    def undefined_below(estimator, scoring):
        scorer = real(estimator, scoring)

        def score(estimator, X, y, **params):
            if solving.get("lam") and solving["value"] < bound:
                return np.nan
            return scorer(estimator, X, y, **params)

        return score

    monkeypatch.setattr(mr2_probe._cv, "check_classwise_scoring", undefined_below)


def test_a_cs_search_s_failed_fits_error_is_said_once(tmp_path, monkeypatch):
    # Some values of --Cs failing and others scoring NaN, the first failure's error (up to
    # 1,000 characters) was said twice: in the warning of the failed fits, and again at the
    # end of the one of the non-finite scores that followed it.
    _undefined_below(monkeypatch, 1e-2)  # (at C = 1e-4)
    argv = _cs_argv(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    said = [str(w.message) for w in caught if "fits failed" in str(w.message)]
    said += [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert len(said) == 2 and said[1].startswith("One or more of the test scores are non-")
    assert sum("Cannot fit: the adam solver diverged" in text for text in said) == 1
    assert said[1].endswith(
        "non-finite score at C=0.0001 (folds 0, 1), and the fits at C=10000 (folds 0, 1) "
        "failed (the first error as the warning above says)."
    )
    # Without the warning of the failed fits (python -W ignore::...FitFailedWarning), the
    # other says the error, in the command's options.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", FitFailedWarning)
        assert main(argv) == 0
    (said,) = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert said.endswith(
        "failed (the first error, at C=10000 on fold 0: Cannot fit: the adam solver diverged. "
        "Use a smaller learning_rate (only --grid sets it, and --grid excludes --Cs: search C "
        "with --grid C=V1,V2,... --grid learning_rate=V instead) (or scale the features, "
        "--feature-scaling standard) and fit again.)."
    )


def test_a_cs_search_without_a_defined_score_says_its_failed_fits_error_once(
    tmp_path, monkeypatch, capsys
):
    # No value of --Cs with a defined score, some failing: the error line ended in the
    # failed fits' first error, which the warning of the failed fits had said before it.
    _undefined_below(monkeypatch, 100)
    argv = _cs_argv(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, lines = _error(argv, capsys)
    assert code == 2 and lines[-1].startswith("mr2-probe: error: No value of Cs has a defined")
    assert lines[-1].endswith(
        "; besides, the fits at C=10000 (folds 0, 1) failed (the first error as the warning "
        "above says)."
    )
    (failed,) = [str(w.message) for w in caught if w.category is FitFailedWarning]
    assert "Cannot fit: the adam solver diverged" in failed


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([], "the fit's own error"),
        (
            ["--grid", "C=0.1,1", "--cv", "2"],
            "ERM grid: every fit of its search failed (4 fits), the first as: the fit's own error",
        ),
    ],
    ids=["fit", "grid"],
)
def test_a_failed_fit_s_held_warnings_never_replace_its_error(
    files, options, expected, monkeypatch, capsys
):
    # Held while a fit that failed ran, and shown after it, a warning that the filters make
    # an error (simplefilter("error"), held under a filter inside) was raised in place of
    # the fit's error: a UserWarning's traceback where the run ends in the fit's error line.
    def failing(self, X, y, **params):
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # (as a library's own filter may)
            warnings.warn("held before the error", UserWarning, stacklevel=2)
        raise ValueError("the fit's own error")

    monkeypatch.setattr(MR2LinearClassifier, "fit", failing)
    # (fit_collecting_short passes on what it held so already: the command holds them too)
    monkeypatch.setattr(cli_fitting, "fit_collecting_short", lambda model, X, y: model.fit(X, y))
    argv = [str(files / "train.npz"), *options, "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, lines = _error(argv, capsys)
    assert code == 2 and lines[-1] == f"mr2-probe: error: {expected}"
    # (without the filter, shown before the error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _error(argv, capsys)
    assert "held before the error" in [str(w.message) for w in caught]


@pytest.mark.slow
def test_a_cosine_erm_searches_no_c(files, capsys):
    # ERM has no projection, and the cosine head no penalty: its "grid" of C fitted one
    # model twice and reported a best C.
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--head", "cosine"]
    assert main([*argv, "--grid", "lam=0,0.5", "--grid", "C=0.001,1000", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "ERM grid" not in printed and "MR2 grid: best parameters by worst_class" in printed


def test_a_grid_of_both_heads_searches_c_where_it_penalises():
    # With head=cosine,linear the cosine ERM (and MR² without a projection) still searched
    # C, and could report a C that changed nothing.
    args = Namespace(feature_scaling="none", cv=2, seed=0, n_jobs=None, scoring="worst_class")
    grid = {"head": ["cosine", "linear"], "C": [0.001, 1000], "lam": [0, 0.5]}
    search = _model(MR2LinearClassifier(c_bar=1.0, solver="adam"), grid, args)
    searched = sorted(str(dict(sorted((k, v[0]) for k, v in g.items()))) for g in search.param_grid)
    assert searched == sorted(
        str(c)
        for c in [
            {"head": "cosine", "lam": 0},
            *({"C": C, "head": "cosine", "lam": 0.5} for C in (0.001, 1000)),
            *({"C": C, "head": "linear", "lam": lam} for C in (0.001, 1000) for lam in (0, 0.5)),
        ]
    )


def test_a_grid_searches_the_minibatch_parameters_where_a_minibatch_solver_reads_them():
    # With lam=0,0.5 the L-BFGS models (lam = 0, and ERM) searched learning_rate too, and
    # reported a best value among identical fits.
    args = Namespace(feature_scaling="none", cv=2, seed=0, n_jobs=None, scoring="worst_class")
    grid = {"lam": [0, 0.5], "learning_rate": [0.1, 0.01]}
    search = _model(MR2LinearClassifier(c_bar=1.0), grid, args)
    searched = sorted(str(dict(sorted((k, v[0]) for k, v in g.items()))) for g in search.param_grid)
    expected = [{"lam": 0}, *({"lam": 0.5, "learning_rate": r} for r in (0.1, 0.01))]
    assert searched == sorted(str(c) for c in expected)
    # ERM (lam = 0) searches none of it, so it is fitted alone; solver="adam" reads it.
    assert not any(_without_unused(MR2LinearClassifier(), {"learning_rate": 0.1}).values())
    adam = MR2LinearClassifier(solver="adam")
    assert _without_unused(adam, {"learning_rate": 0.1}) == {"learning_rate": 0.1}


def test_the_options_a_run_does_not_read_are_known():
    from mr2_probe.cli._options import _unread_options

    plain = Namespace(tilt=[], offsets=[], grid=[], Cs=None, test="test.npz", lam=0.0)
    assert _unread_options(plain) == {
        "cv",
        "scoring",
        "n_jobs",
        "val_size",
        "front_bound",
        "test_size",
        "seed",
    }
    searched = Namespace(tilt=[], offsets=[1.0], grid=[], Cs=3, test=None, lam=0.0)
    assert _unread_options(searched) == set()


def test_a_seed_that_nothing_reads_is_refused(files, capsys):
    # With a --test file, no search, no front and L-BFGS fits, nothing is split or drawn
    # at random: --seed 5 fitted the models of --seed 0 (and command.json said 5).
    test = [str(files / "train.npz"), "--test", str(files / "test.npz")]
    line = _refused([*test, "--seed", "5"], capsys)
    assert "--seed seeds the --test-size split, a search's folds" in line and "drop it" in line
    for read in (["--lam", "0.5"], ["--grid", "C=1,2"], ["--tilt", "1"]):
        assert _checked([*test, "--seed", "5", *read]).seed == 5
    assert _checked([test[0], "--seed", "5"]).seed == 5  # the --test-size split
    assert _checked(test).seed == 0


@pytest.mark.parametrize("ranks, refused", [("100", 100), ("7,2", 7), ("none,2,7", 7)])
def test_a_grid_of_projection_ranks_above_the_features_is_refused_before_any_fit(
    files, ranks, refused, capsys
):
    # Six features: a rank of 7 failed every fit of it, after ERM's fit and the others:
    # left out of the search under scikit-learn's FitFailedWarning, or the run ended in
    # its "All the 3 fits failed".
    argv = [str(files / "train.npz"), "--lam", "0.5", "--grid", f"projection_rank={ranks}"]
    line = _refused([*argv, "--max-iter", "2"], capsys)
    assert f"--grid projection_rank={refused}: the features have 6 columns" in line
    # A rank of every column is a projection, and is taken.
    from mr2_probe.cli._options import _check_on_data

    args = _checked(argv[:1])
    _check_on_data({"projection_rank": [None, 6]}, args, n_features=6)


@pytest.mark.parametrize(
    "options, given",
    [(["--head", "cosine"], "--head cosine"), (["--grid", "head=linear,cosine"], "--grid head")],
)
def test_a_cosine_head_of_one_feature_is_refused_before_any_fit(
    files, tmp_path, options, given, capsys
):
    # Its fits failed after ERM's (the estimator's error in its own terms, head='cosine'),
    # or left the cosine head out of the search under scikit-learn's FitFailedWarning.
    with np.load(files / "train.npz") as data:
        np.savez(tmp_path / "one_feature.npz", X=data["X"][:, :1], y=data["y"])
    line = _refused([str(tmp_path / "one_feature.npz"), *options, "--max-iter", "2"], capsys)
    assert line.startswith(f"mr2-probe: error: {given}")
    assert "needs at least 2 features, and the features have 1" in line


def test_a_grid_searches_what_only_some_models_read_where_they_read_it():
    # head=linear,cosine with scale=8,16 searched the linear head's unread scale, and
    # c_bar=none,1 with p=2,3 the margin-free model's unread p: choices among identical fits.
    args = Namespace(feature_scaling="none", cv=2, seed=0, n_jobs=None, scoring="worst_class")
    grid = {"head": ["linear", "cosine"], "scale": [8.0, 16.0], "c_bar": [None, 1.0], "p": [2, 3]}
    search = _model(MR2LinearClassifier(), grid, args)
    searched = sorted(str(dict(sorted((k, v[0]) for k, v in g.items()))) for g in search.param_grid)
    expected = [
        {"c_bar": c_bar, "head": head} | scale | p
        for head, scales in (("linear", [{}]), ("cosine", [{"scale": 8.0}, {"scale": 16.0}]))
        for scale in scales
        for c_bar, ps in ((None, [{}]), (1.0, [{"p": 2}, {"p": 3}]))
        for p in ps
    ]
    assert searched == sorted(str(dict(sorted(c.items()))) for c in expected)


@pytest.mark.parametrize(
    "offsets, val_size, message",
    [
        ([], 0.1, "without a sample in the front's validation part (the first: 'b')"),
        ([1.0], 0.5, "holds no sample of the classes ['d'] (1 of 4)"),
    ],
)
def test_a_store_s_classes_are_named_in_the_front_s_split_errors(offsets, val_size, message):
    # A store's classes were named by their integer codes here (the first: 1; classes
    # [3]), and by their names everywhere else.
    from mr2_probe.cli._splits import _check_splits

    y = np.r_[np.zeros(60, int), np.repeat([1, 2, 3], 2)]
    args = Namespace(tilt=[1.0], offsets=offsets, val_size=val_size, seed=0, test="t.h5", Cs=None)
    with pytest.raises(UsageError, match=re.escape(message)):
        _check_splits(y, {}, args, names=["a", "b", "c", "d"])


def _no_progress(estimator):
    return all(v == 0 for k, v in estimator.get_params().items() if k.endswith("verbose"))


def test_a_grid_search_is_seeded_refits_by_its_scoring_and_fits_without_progress_bars():
    # The folds are shuffled with --seed, the refit is the model best by --scoring, and
    # the search's many fits show no progress bar each (the probe given is left as it is).
    args = Namespace(feature_scaling="standard", cv=4, seed=7, n_jobs=2, scoring="worst_class")
    probe = MR2LinearClassifier(verbose=1)
    search = _model(probe, {"C": [0.1, 1.0]}, args)
    assert (search.cv.n_splits, search.cv.shuffle, search.cv.random_state) == (4, True, 7)
    assert search.refit == "worst_class" and search.n_jobs == 2
    assert _no_progress(search.estimator) and probe.verbose == 1


def test_a_cv_path_is_seeded_and_scored_by_the_options():
    args = Namespace(Cs=5, cv=4, seed=7, n_jobs=2, scoring="balanced_accuracy")
    search = _cv_probe(MR2LinearClassifier(c_bar=2.0, verbose=1), args)
    assert (search.cv.n_splits, search.cv.shuffle, search.cv.random_state) == (4, True, 7)
    assert (search.Cs, search.scoring, search.n_jobs) == (5, "balanced_accuracy", 2)
    assert search.c_bar == 2.0 and search.verbose == 1


@pytest.mark.parametrize("flag, verbose", [([], 1), (["--no-progress"], 0)])
def test_the_probes_show_progress_bars_unless_no_progress_and_take_c_or_1(flag, verbose):
    erm, mr2 = _estimators(_parser().parse_args(["train.npz", *flag]))
    assert erm.verbose == mr2.verbose == verbose
    assert erm.C == mr2.C == 1.0
    # --C is both probes' C, --device their device; --p is MR²'s.
    options = ["--C", "0.25", "--device", "cpu", "--p", "3"]
    erm, mr2 = _estimators(_parser().parse_args(["train.npz", *flag, *options]))
    assert erm.C == mr2.C == 0.25 and erm.device == mr2.device == "cpu" and mr2.p == 3


def test_ctrl_c_ends_the_run_with_status_130_and_one_line(monkeypatch, capsys):
    import mr2_probe.cli._main as cli_main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "_run", interrupted)
    with pytest.raises(SystemExit) as exit_:
        cli_main.main(["train.npz"])
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "mr2-probe: interrupted\n"


class _ImportedSlowly(types.ModuleType):
    """mr2_probe.cli._main as it imports NumPy, scikit-learn and torch: ``during(name)``
    runs while ``from ._main import name`` reads it (a Ctrl-C there, say)."""

    def __init__(self, during):
        super().__init__("mr2_probe.cli._main")
        self.during, self.read = during, []

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's and inspect's questions
            raise AttributeError(name)
        self.during(name)
        self.read.append(name)
        return getattr(cli_main, name)


def test_ctrl_c_while_the_command_imports_its_libraries_is_one_line_and_130(
    files, tmp_path, capsys, monkeypatch
):
    # mr2_probe and its command imported NumPy, scikit-learn and torch (seconds) before
    # main() ran: a Ctrl-C then printed a 40-line traceback of the import machinery.
    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "mr2_probe.cli._main", _ImportedSlowly(interrupted))
    argv = [str(files / "train.npz"), "--out", str(tmp_path / "run"), "--no-progress"]
    try:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
    except KeyboardInterrupt:  # not pytest's own: fail this test, not the session
        pytest.fail("the KeyboardInterrupt escaped main()")
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "mr2-probe: interrupted\n"
    assert not (tmp_path / "run").exists()
    with pytest.raises(KeyboardInterrupt):  # --debug: the traceback
        main([*argv, "--debug"])


@pytest.mark.usefixtures("python_sigint")
def test_a_real_ctrl_c_while_the_command_imports_waits_for_the_imports(files, capsys, monkeypatch):
    # A SIGINT inside NumPy's or torch's import leaves them half imported (a RecursionError's
    # traceback, an abort in torch's C++): held back, it ends the run once they are in.
    def interrupted(name):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # where an unheld interrupt is raised

    module = _ImportedSlowly(interrupted)
    monkeypatch.setitem(sys.modules, "mr2_probe.cli._main", module)
    try:
        with pytest.raises(SystemExit) as exit_:
            main([str(files / "train.npz"), "--no-progress"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped main()")
    assert module.read == ["main"] and exit_.value.code == 130  # the import finished
    assert capsys.readouterr() == ("", "mr2-probe: interrupted\n")


@pytest.mark.slow
def test_json_outputs_are_strict_json(files, tmp_path):
    # C = inf was written as Infinity, which strict JSON parsers refuse.
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--no-progress"]
    assert main([*argv, "--grid", "C=inf,1e-9", "--cv", "2", "--out", str(out)]) == 0

    def refuse(constant):
        raise ValueError(f"{constant} is no JSON")

    report = json.loads((out / "report.json").read_text(), parse_constant=refuse)
    assert report["search"]["best_params"]["MR2 grid"]["C"] == "inf"
    assert main([*argv, "--C", "inf", "--max-iter", "5", "--out", str(out)]) == 0
    assert json.loads((out / "command.json").read_text(), parse_constant=refuse)["C"] == "inf"


@pytest.mark.slow
def test_grid_search_tunes_erm_and_mr2_alike(files, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [str(files / "X.npy"), "--labels", str(files / "y.npy"), "--test-size", "0.3"]
    argv += ["--grid", "c_bar=none,1", "--grid", "C=0.1,1", "--cv", "2"]
    main([*argv, "--scoring", "balanced_accuracy", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert "ERM grid: best parameters by balanced_accuracy (2-fold CV): {'C': " in printed
    assert "MR2 grid: best parameters by balanced_accuracy (2-fold CV): {'C': " in printed
    report = json.loads((out / "report.json").read_text())
    assert report["reference"] == "ERM grid" and set(report["rows"]) == {"ERM grid", "MR2 grid"}
    assert report["labels"] == [0, 1, 2]
    # ERM searched the parameter it shares (C), not the margins.
    best = report["search"]["best_params"]
    assert set(best["ERM grid"]) == {"C"} and set(best["MR2 grid"]) == {"C", "c_bar"}
    assert report["search"]["scoring"] == "balanced_accuracy" and report["search"]["cv"] == 2
    assert set(os.listdir(out)) == OUTPUTS  # an .npy input has no class names
    for name in ("class_accuracy.png", "groups.png", "margins.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    models = joblib.load(out / "models.joblib")
    assert models["ERM grid"].c_bar is None and models["ERM grid"].C == best["ERM grid"]["C"]
    assert models["MR2 grid"].c_bar == best["MR2 grid"]["c_bar"]
    assert "| ERM grid |" in (out / "report.md").read_text().replace("  ", " ")


@pytest.mark.slow
def test_command_json_reruns_from_another_folder(files, tmp_path, monkeypatch):
    # It kept the paths as typed, relative to a folder it did not record (report.json's were
    # absolute): from another folder its train, test and out named nothing, or other files.
    (tmp_path / "data").mkdir()
    for name in ("train.npz", "test.npz"):
        shutil.copy(files / name, tmp_path / "data" / name)
    monkeypatch.chdir(tmp_path)
    typed = ["data/train.npz", "--test", "./data/test.npz", "--max-iter", "5"]
    typed += ["--out", "runs/../run", "--no-progress"]
    assert main(typed) == 0
    options = json.loads((tmp_path / "run" / "command.json").read_text())
    inputs = json.loads((tmp_path / "run" / "report.json").read_text())["inputs"]
    assert options["train"] == inputs["train"]["path"] == str(tmp_path / "data" / "train.npz")
    assert options["test"] == inputs["test"]["path"] == str(tmp_path / "data" / "test.npz")
    assert options["out"] == str(tmp_path / "run") and options["labels"] is None
    # The command as typed stays, with the folder it was typed in.
    assert options["argv"] == typed and options["cwd"] == str(tmp_path)
    # From elsewhere, its options run the same command into the same folder.
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rerun = [options["train"], "--test", options["test"], "--max-iter", "5"]
    assert main([*rerun, "--out", options["out"], "--no-progress"]) == 0
    assert json.loads((tmp_path / "run" / "report.json").read_text())["inputs"] == inputs
    assert os.listdir(tmp_path / "elsewhere") == []


@pytest.mark.slow
def test_command_json_writes_null_for_an_option_the_grid_searched(files, tmp_path):
    # It wrote --c-bar's default, 1.0, which no model took, beside the grid that searched it.
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--max-iter", "3"]
    argv += ["--grid", "c_bar=none,2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        main([*argv, "--out", str(tmp_path / "run"), "--no-progress"])
    options = json.loads((tmp_path / "run" / "command.json").read_text())
    assert options["grid"] == ["c_bar=none,2"] and options["c_bar"] is None
    assert options["lam"] == 0.0 and options["max_iter"] == 3  # not searched: as read
    # A searched random_state is --seed's parameter, but --seed still seeds the folds.
    argv[-1] = "random_state=1,2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        main([*argv, "--lam", "0.5", "--out", str(tmp_path / "seeded"), "--no-progress"])
    options = json.loads((tmp_path / "seeded" / "command.json").read_text())
    assert options["grid"] == ["random_state=1,2"] and options["seed"] == 0


@pytest.mark.parametrize("cs", ["4", pytest.param("bisect", marks=pytest.mark.slow)])
def test_cv_path_chooses_c_prints_the_curve_and_plots_it(files, tmp_path, capsys, cs):
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--cv", "3"]
    main([*argv, "--Cs", cs, "--scoring", "worst_class", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    models = joblib.load(out / "models.joblib")
    report = json.loads((out / "report.json").read_text())
    for name in ("ERM", "MR2"):
        search = models[name]
        assert f"{name}: chose C={search.C_:.4g} by worst_class (3-fold CV)" in printed
        curves = report["cv"][name]["curves"]
        assert set(curves) == {"worst_class", "balanced_accuracy"}
        assert report["cv"][name]["Cs"] == search.Cs_.tolist()
        assert np.argmax(curves["worst_class"]) == list(search.Cs_).index(search.C_)
        # In percent, as the rest of the file says (they were fractions).
        held_out = np.nanmin(search.class_accuracy_path_, 2).mean(0)
        np.testing.assert_allclose(curves["worst_class"], 100 * held_out)
        assert report["cv"][name]["C"] == search.C_
        # The printed curve is the recorded one, in percent, its chosen row marked.
        j = list(search.Cs_).index(search.C_)
        row = "  ".join(f"{curve[j]:17.2f}" for curve in curves.values())
        assert f" *{search.C_:10.4g}  {row}" in printed.splitlines()
    markdown = (out / "report.md").read_text()  # the curve's columns in a fenced block
    assert "```text\nERM: chose C=" in markdown and "\n- " not in markdown
    # Both written reports hold the per-class table, whatever --per-class printed.
    assert "\n| class | group | ERM | MR2 |\n" in markdown
    text = (out / "report.txt").read_text().splitlines()
    table = text.index(next(line for line in text if line.startswith("class ")))
    assert sorted(line.split()[0] for line in text[table + 2 : table + 5]) == ["0", "1", "2"]
    assert models["ERM"].c_bar is None and models["MR2"].c_bar == 1.0
    n_values = len(models["MR2"].Cs_)
    assert n_values == 4 if cs == "4" else 7 < n_values <= 15
    assert printed.count(" *") >= 2  # the chosen row of each curve is marked
    assert set(os.listdir(out)) == OUTPUTS | {"cv_curve.png"}
    assert (out / "cv_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_cv_search_by_class_std_reports_a_spread_of_0_as_0(files, tmp_path, capsys):
    # A fold set whose classes all scored alike (spread 0) was reported -0.00 (and -0.0 in
    # report.json): the negation of its scorer's 0.
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--Cs", "2"]
    main([*argv, "--scoring", "class_std", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    curves = [
        cv["curves"]["class_std"]
        for cv in json.loads((out / "report.json").read_text())["cv"].values()
    ]
    assert 0 in np.concatenate(curves)  # a fold set of spread 0 is in the run
    assert not np.signbit(np.concatenate(curves)).any()
    assert "-0.00" not in printed and "-0.00" not in (out / "report.txt").read_text()


@pytest.mark.parametrize(
    "grid, mr2_best",
    [
        (["--grid", "lam=0,0.5", "--grid", "solver=lbfgs"], {"lam": 0, "solver": "lbfgs"}),
        (["--lam", "0.5", "--grid", "solver=lbfgs,adam"], {"solver": "adam"}),
    ],
)
def test_grid_combinations_that_are_no_model_are_left_out_and_said(files, grid, mr2_best, capsys):
    # They failed fold by fold in GridSearchCV, its FitFailedWarnings the only word.
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--cv", "2", *grid]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitFailedWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main([*argv, "--max-iter", "3", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "1 of the 2 --grid combinations are no MR² model and are left out" in err
    best = ast.literal_eval(out.split("MR2 grid: best")[1].split(": ", 1)[1].split("\n")[0])
    assert best == mr2_best


@pytest.mark.slow
def test_search_that_drops_the_margins_says_so(files, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--grid", "c_bar=none"]
    assert main([*argv, "--grid", "lam=0", "--cv", "2", "--out", str(out), "--no-progress"]) == 0
    # lam only shapes MR²: ERM has nothing to search and stays a plain fit.
    assert "ERM grid" not in capsys.readouterr().out
    note = "MR2 grid has no margins: the search chose c_bar=None"
    assert note in (out / "report.txt").read_text()
    assert note in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["notes"] == [
        f"{note}, plain cross-entropy (γ_k = 1)"
    ]
    # With a class tilt, margins or none, the loss is no plain cross-entropy.
    argv = [str(files / "train.npz"), "--c-bar", "none", "--grid", "class_tilt=1", "--cv", "2"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert notes == ["MR2 grid has no margins: c_bar=None, γ_k = 1"]


@pytest.mark.slow
def test_a_model_without_margins_but_with_a_compactness_loss_is_not_called_plain(files, tmp_path):
    # c_bar=None with lam > 0 was noted as "plain cross-entropy", and left out of the
    # front as if it were ERM.
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--c-bar", "none"]
    argv += ["--lam", "0.5", "--max-iter", "2", "--tilt", "1", "--out", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main([*argv, "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert "MR2 has no margins: c_bar=None, γ_k = 1" in report["notes"]
    assert [p["name"] for p in report["front"]["points"]] == ["ERM", "MR2", "tilt=1"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        (["c_bar=none,1,2.5"], {"c_bar": [None, 1, 2.5]}),
        (["lam=0,0.5", "head=linear,cosine"], {"lam": [0, 0.5], "head": ["linear", "cosine"]}),
        # No spelling gave a boolean: "True" stayed a string, "1" an integer, both refused.
        (["fit_intercept=True,false", "class_weight=none"],
         {"fit_intercept": [True, False], "class_weight": [None]}),
    ],
)  # fmt: skip
def test_grid_specs(spec, expected):
    assert _grid(spec) == expected


NEEDS_H5 = pytest.mark.skipif(
    importlib.util.find_spec("h5py") is None, reason="HDF5 stores need the extract extra"
)


@NEEDS_H5
@pytest.mark.parametrize("streamed", [False, True])
def test_a_store_whose_rows_cannot_be_read_is_named_as_damaged(
    tmp_path, capsys, monkeypatch, streamed
):
    # A compressed chunk that does not decompress, in a store whose every row succeeded (its
    # features an h5py.Dataset): its reading into memory, or the scan for NaN of a store
    # streamed, said h5py's "filter returned failure during read" alone, naming no file.
    import h5py

    if streamed:
        monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 0)

    path = tmp_path / "gz.h5"
    X, y = _blobs(20, 0, d=8)
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X.astype(np.float32), chunks=(10, 8), compression="gzip")
        f.create_dataset("labels", data=y)
        f.create_dataset("class_names", data=["a", "b", "c"], dtype=h5py.string_dtype())
        chunk = f["features"].id.get_chunk_info(2)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset : chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
    path.write_bytes(bytes(data))
    _, lines = _error([str(path), "--no-progress", "--max-iter", "2"], capsys)
    assert len(lines) == 1, lines
    # HDF5's own cause follows: "filter returned failure" (HDF5 ≥ 1.14), "inflate() failed" (1.12).
    cause = r"(filter returned failure|inflate\(\) failed)"
    assert re.search(rf"'{re.escape(str(path))}'.* \(the file is damaged\): .*{cause}", lines[0])


@pytest.mark.parametrize(
    "argv, message",
    [
        # Inputs that are missing, unreadable or not what they claim.
        (["{d}/missing.npz"], "'{d}/missing.npz' does not exist; check the path"),
        (["{d}/X.npy", "--labels", "{d}/missing.npy"], "'{d}/missing.npy' does not exist"),
        (["{d}/garbage.npz"], "'{d}/garbage.npz' is not a NumPy file"),
        # A labels file was told to hold features; pandas' text labels (an object array,
        # which numpy.save pickles) were refused for allow_pickle, which no option sets.
        (
            ["{d}/X.npy", "--labels", "{d}/labels.txt"],
            "--labels '{d}/labels.txt' is not a NumPy file; save the labels with numpy.save",
        ),
        (
            ["{d}/train.npz", "--test", "{d}/X.npy", "--test-labels", "{d}/labels.txt"],
            "--test-labels '{d}/labels.txt' is not a NumPy file; save the labels with",
        ),
        (
            ["{d}/X.npy", "--labels", "{d}/y_object.npy"],
            "'{d}/y_object.npy' holds an array of Python objects (as numpy.save writes a pandas "
            "column of text), which needs pickle to read and is not read: save the labels as "
            "text or numbers, e.g. numpy.save(path, labels.astype(str))",
        ),
        (
            ["{d}/X_object.npy", "--labels", "{d}/y.npy"],
            "'{d}/X_object.npy' holds an array of Python objects (as numpy.save writes rows of "
            "unequal lengths), which needs pickle to read and is not read: save the features "
            "as one 2-D array of numbers",
        ),
        # In a .npz the labels' objects were said to be the features'.
        (
            ["{d}/y_object.npz"],
            "'{d}/y_object.npz' holds its 'y' as an array of Python objects (as numpy.save "
            "writes a pandas column of text), which needs pickle to read and is not read: save "
            "the labels as text or numbers, e.g. numpy.savez(path, X=X, y=labels.astype(str))",
        ),
        (
            ["{d}/X_object.npz"],
            "'{d}/X_object.npz' holds its 'features' as an array of Python objects (as "
            "numpy.save writes rows of unequal lengths), which needs pickle to read and is not "
            "read: save the features as one 2-D array of numbers",
        ),
        (["{d}/images"], "'{d}/images' is a folder; mr2-probe reads features: extract a"),
        (["{d}/other.npz"], "must hold arrays X and y (or features and labels); found ['a', "),
        (["{d}/X.npy"], "holds features only; pass --labels FILE.npy"),
        (["{d}/X.csv"], "unknown feature file type '.csv'"),
        (["{d}/missing"], "'{d}/missing' does not exist; check the path"),
        (["{d}/train.npz", "--labels", "{d}/y.npy"], "--labels is for .npy features only"),
        # A missing file, or one of no known format, was said to hold its own labels.
        (["{d}/missing", "--labels", "{d}/y.npy"], "'{d}/missing' does not exist; check the"),
        (["{d}/X.csv", "--labels", "{d}/y.npy"], "unknown feature file type '.csv'"),
        (
            ["{d}/train.npz", "--test", "{d}/missing", "--test-labels", "{d}/y.npy"],
            "'{d}/missing' does not exist; check the path",
        ),
        # A missing .npy without --labels was said to hold features only.
        (["{d}/missing.npy"], "'{d}/missing.npy' does not exist; check the path"),
        (["{d}/train.npz", "--test", "{d}/missing.npy"], "'{d}/missing.npy' does not exist"),
        # A file named as a folder (a '/' after its name) was said not to exist.
        (["{d}/train.npz/"], "'{d}/train.npz/' names the file '{d}/train.npz' as a folder: pass"),
        (["{d}/X.npy", "--labels", "{d}/y.npy/"], "names the file '{d}/y.npy' as a folder"),
        (["{d}/train.npz/X.npz"], "names the file '{d}/train.npz' as a folder; check the path"),
        pytest.param(
            ["{d}/store.h5/"],
            "'{d}/store.h5/' names the file '{d}/store.h5' as a folder: pass it without the",
            marks=NEEDS_H5,
        ),
        pytest.param(["{d}/missing.h5"], "'{d}/missing.h5' does not exist", marks=NEEDS_H5),
        pytest.param(["{d}/garbage.h5"], "is not an HDF5 file", marks=NEEDS_H5),
        pytest.param(["{d}/no_labels.h5"], "it has no 'labels' dataset", marks=NEEDS_H5),
        pytest.param(["{d}/no_names.h5"], "it has no 'class_names' dataset", marks=NEEDS_H5),
        pytest.param(["{d}/partial.h5"], "has 30 of 90 rows not extracted yet", marks=NEEDS_H5),
        # Data that cannot be fitted.
        (["{d}/X.npy", "--labels", "{d}/y_short.npy"], "90 rows of features but 89 labels"),
        (["{d}/nan.npz"], "1 of 90 rows hold NaN or infinite features (the first is row 5)"),
        (["{d}/cube.npz"], "must be a 2-D array (samples × features); got shape (90, 6, 1)"),
        # Complex features were fitted, and refused with the whole array on one line.
        (["{d}/complex.npz"], "features of {d}/complex.npz must be real numbers; got dtype"),
        # An archive read as one array: its key names taken for 2 labels, or for features.
        (["{d}/X.npy", "--labels", "{d}/train.npz"], "train.npz is a .npz archive, not a"),
        # A .npz under a .npy name is read as the archive it is, which holds its labels.
        (["{d}/archive.npy", "--labels", "{d}/y.npy"], "archive.npy' holds its own labels"),
        (["{d}/train.npz", "--test", "{d}/wide.npz"], "test features have 12 columns"),
        (["{d}/train.npz", "--test", "{d}/names.npz"], "3 classes absent from the training"),
        # One class: scikit-learn's error, after "fitting ERM" had been printed.
        (["{d}/one_class.npz"], "holds samples of one class only ('Ankle boot'); a classifier"),
        pytest.param(  # the class named, not its code; the advice for two stores
            ["{d}/no_trouser.h5", "--test", "{d}/store_test.h5"],
            "1 class absent from the training labels ('Trouser'); {d}/no_trouser.h5 lists "
            "it among its classes but holds no sample of it",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/store.h5", "--test", "{d}/renamed.h5"],
            "renamed.h5 has 3 classes that {d}/store.h5 does not ('Sandal', 'Shirt', 'Bag')",
            marks=NEEDS_H5,
        ),
        pytest.param(  # names in another case, or a letter off: the likely ones named
            ["{d}/store.h5", "--test", "{d}/near.h5"],
            "not trained on (did you mean 'T-shirt/top' for 't-shirt/top', 'Trouser' for "
            "'Trousers'?)",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/store.h5", "--test", "{d}/store.h5"],
            "holds the training images of {d}/store.h5, so its accuracy would be training",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/store.h5", "--test", "{d}/store_copy.h5"],
            "holds the training images of {d}/store.h5",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/most.h5", "--test", "{d}/few.h5"],
            "holds 9 of the training images ('item/00000', 'item/00001', ... (9 in all)) of",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/store_nan.h5"],
            "1 of 90 completed rows hold NaN or infinite features (the first is store row 7, "
            "'item/00007')",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/float_labels.h5"], "'labels' has dtype float32, not integers", marks=NEEDS_H5
        ),
        pytest.param(
            ["{d}/r18.h5", "--test", "{d}/r34.h5"],
            "were extracted differently (backbone: 'timm:resnet18' and 'timm:resnet34'; "
            "weights: 'sha256:aa' and 'sha256:bb'), so their features are not comparable",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/r18.h5", "--test", "{d}/r18_64.h5"],
            "(preprocessing.crop: [32, 32] and [64, 64])",
            marks=NEEDS_H5,
        ),
        # Options out of range, found before anything is read.
        (["{d}/train.npz", "--test-size", "1.5"], "--test-size must be a fraction between 0"),
        (["{d}/train.npz", "--test-size", "0"], "--test-size must be a fraction between 0"),
        (["{d}/train.npz", "--test-size", "-0.2"], "--test-size must be a fraction between 0"),
        (["{d}/train.npz", "--tilt", "1", "--val-size", "1.5"], "--val-size must be a fraction"),
        (["{d}/train.npz", "--tilt", "1", "--val-size", "0"], "--val-size must be a fraction"),
        (["{d}/train.npz", "--tilt", "1", "--val-size", "-0.1"], "--val-size must be a fraction"),
        (["{d}/train.npz", "--lam", "-1"], "--lam: The 'lam' parameter of MR2LinearClassifier"),
        (["{d}/train.npz", "--cv", "1", "--grid", "C=1"], "--cv must be at least 2 folds"),
        (["{d}/train.npz", "--tilt", "1", "--front-bound", "100"], "--front-bound is in points"),
        # User's values as given, not in %g's 6 digits: 100.0000001 read "got 100".
        (
            ["{d}/train.npz", "--tilt", "1", "--front-bound", "100.0000001"],
            "between 0 and 100, e.g. 0.5; got 100.0000001",
        ),
        (["{d}/train.npz", "--test-size", "1.0000001"], "e.g. 0.2; got 1.0000001"),
        (["{d}/train.npz", "--tilt", "1", "--val-size", "1.0000001"], "e.g. 0.2; got 1.0000001"),
        # NaN, which no number of digits reads back as, ended in a StopIteration traceback.
        (["{d}/train.npz", "--test-size", "nan"], "e.g. 0.2; got nan"),
        (["{d}/train.npz", "--tilt", "1", "--val-size", "nan"], "e.g. 0.2; got nan"),
        (["{d}/train.npz", "--tilt", "1", "--front-bound", "nan"], "e.g. 0.5; got nan"),
        (
            ["{d}/train.npz", "--tilt", "1", "--val-size", "0.0200000001"],
            "--val-size 0.0200000001 cannot split the 72 training samples",
        ),
        (
            ["{d}/train.npz", "--test-size", "0.0100000001"],
            "cannot hold out --test-size 0.0100000001 of {d}/train.npz with every class",
        ),
        (
            [
                "{d}/uneven.npz",
                "--test",
                "{d}/uneven_test.npz",
                "--tilt",
                "1",
                "--val-size",
                "0.1000000001",
            ],
            "--val-size 0.1000000001 leaves 3 of the 4 classes without a sample",
        ),
        # Options of a lever or a search the run does not have: accepted and ignored.
        (["{d}/train.npz", "--val-size", "0.2"], "--val-size applies to the front (--tilt"),
        (["{d}/train.npz", "--front-bound", "1"], "--front-bound applies to the front"),
        (["{d}/train.npz", "--cv", "7"], "--cv applies to a search (--grid, --Cs), which this"),
        (["{d}/train.npz", "--scoring", "accuracy"], "--scoring applies to a search"),
        (["{d}/train.npz", "--n-jobs", "4"], "--n-jobs applies to a search"),
        # Refused by the front itself, after the ERM and MR² fits.
        (["{d}/train.npz", "--tilt", "0,1,2,1"], "--tilt gives 1 more than once; each value"),
        (["{d}/train.npz", "--offsets", "0.5,0.5"], "--offsets gives 0.5 more than once"),
        # Values as given, not in %g's 6 digits (9.99989e-321, 1.23457).
        (["{d}/train.npz", "--tilt", "1e-320,1,1e-320"], "--tilt gives 1e-320 more than once"),
        (
            ["{d}/train.npz", "--tilt", "1.23456789,1.23456789"],
            "--tilt gives 1.23456789 more than once",
        ),
        # A front of ERM alone: it failed after the other fits, in the library's terms.
        (
            ["{d}/train.npz", "--c-bar", "none", "--tilt", "0"],
            "--tilt 0 with --c-bar none is a front of ERM alone",
        ),
        # ... and so with a grid none of whose models has margins or a compactness loss.
        (
            ["{d}/train.npz", "--grid", "c_bar=none", "--tilt", "0"],
            "--tilt 0 with --grid c_bar=none is a front of ERM alone",
        ),
        (
            ["{d}/train.npz", "--c-bar", "none", "--grid", "C=0.1,1", "--tilt", "0"],
            "--tilt 0 with --c-bar none is a front of ERM alone",
        ),
        (["{d}/train.npz", "--n-jobs", "0", "--grid", "C=1,2"], "--n-jobs 0 runs nothing"),
        (["{d}/train.npz", "--max-iter", "0"], "--max-iter must be at least 1; got 0"),
        (["{d}/train.npz", "--grid", "max_iter=0,5"], "--grid max_iter=0: max_iter must be at"),
        (["{d}/train.npz", "--seed", "-1"], "--seed: The 'random_state' parameter"),
        # Splits the data cannot make, found before any fit.
        (
            ["{d}/train.npz", "--tilt", "1", "--val-size", "0.02"],
            "--val-size 0.02 cannot split the 72 training samples with every class on both",
        ),
        (
            ["{d}/train.npz", "--offsets", "1", "--val-size", "0.02"],
            "--val-size 0.02 cannot split the 72 training samples",
        ),
        (["{d}/train.npz", "--cv", "40", "--grid", "c_bar=1,2"], "--cv 40: n_splits=40 cannot"),
        (
            ["{d}/train.npz", "--cv", "40", "--Cs", "3"],
            "members in each class; no class has more than 24 samples: use at most 24 folds",
        ),
        (
            ["{d}/train.npz", "--test-size", "0.01"],
            "number of classes = 3; choose a --test-size that leaves each class at least one",
        ),
        (["{d}/train.npz", "--logit-scale", "16"], "add --head cosine, or drop --logit-scale"),
        # --Cs replaced the value given without a word.
        (["{d}/train.npz", "--Cs", "3", "--C", "2"], "--Cs chooses the value that --C sets"),
        (
            ["{d}/train.npz", "--head", "cosine", "--Cs", "3", "--logit-scale", "16"],
            "--Cs chooses the value that --logit-scale sets (the cosine head's logit scale)",
        ),
        # A split that leaves classes out of a side was taken: the rule's worst class was
        # that of the classes it held, or the front fitted without some.
        (
            ["{d}/uneven.npz", "--test", "{d}/uneven_test.npz", "--tilt", "1"],
            "--val-size 0.1 leaves 3 of the 4 classes without a sample in the front's "
            "validation part (the first: 1); choose a --val-size",
        ),
        (
            ["{d}/uneven.npz", "--test", "{d}/uneven_test.npz", "--tilt", "1", "--val-size", "0.9"],
            "--val-size 0.9 leaves 3 of the 4 classes without a sample in the front's fitting",
        ),
        # The offsets' folds of the front's fitting part. A class of one sample there, among
        # larger ones, was refused only after every fit.
        (
            ["{d}/train.npz", "--offsets", "1", "--val-size", "0.95"],
            "--offsets tunes offsets on 3 folds of the 3 samples the front fits on: n_splits=3",
        ),
        (
            [
                "{d}/uneven.npz",
                "--test",
                "{d}/uneven_test.npz",
                "--offsets",
                "1",
                "--val-size",
                "0.5",
            ],
            "--offsets tunes offsets on 3 folds of the 33 samples the front fits on: The "
            "training part of fold 0 of the cv holds no sample of the classes [3] (1 of 4); "
            "drop --offsets",
        ),
        (["{d}/train.npz", "--offsets", "0.5,100"], "--offsets bounds are in points of overall"),
        (["{d}/train.npz", "--offsets", "100.0000001"], "e.g. 0,0.25,0.5,1; got 100.0000001"),
        (
            ["{d}/train.npz", "--scale", "l2", "--feature-scaling", "standard"],
            "--scale l2 and --feature-scaling standard disagree",
        ),
        # Grids, checked against the estimator before any fit.
        (["{d}/train.npz", "--grid", "c_bar"], "--grid expects NAME=V1,V2"),
        (["{d}/train.npz", "--grid", "C=1", "--grid", "C=2"], "--grid names 'C' twice"),
        # A value twice (1 and 1.0 too) fitted one model twice, in every fold.
        (["{d}/train.npz", "--grid", "C=1,2,1.0"], "--grid C gives 1 more than once; each"),
        (["{d}/train.npz", "--grid", "c_bar=none,1,None"], "--grid c_bar gives none more than"),
        # Two empty values were "given more than once" (said as ''), one the estimator's error.
        (["{d}/train.npz", "--grid", "C=1,,"], "--grid C has an empty value in 'C=1,,'; separ"),
        (["{d}/train.npz", "--grid", "C=1,2,"], "--grid C has an empty value in 'C=1,2,'"),
        (["{d}/train.npz", "--grid", "C=1, ,2"], "--grid C has an empty value in 'C=1, ,2'"),
        (["{d}/train.npz", "--grid", "Cc=1,2"], "no parameter 'Cc'; did you mean 'C'?"),
        (["{d}/train.npz", "--grid", "c=1,2"], "no parameter 'c'; did you mean 'C'?"),
        (["{d}/train.npz", "--grid", "C=1,-1"], "--grid C=-1: The 'C' parameter"),
        (["{d}/train.npz", "--grid", "C=1,2", "--Cs", "4"], "use one of them"),
        # A device is where the fits run: a search of it fitted every model once per device
        # and reported one as the best parameter.
        (
            ["{d}/train.npz", "--grid", "device=cpu,auto"],
            "--grid device: device sets where the fits run, not the model (--device chooses",
        ),
        (["{d}/train.npz", "--grid", "scale=8,16"], "--grid scale searches the cosine head"),
        # Options that no model reads, accepted (and written to command.json) without a word.
        (
            ["{d}/train.npz", "--c-bar", "none", "--p", "3"],
            "--p sets the norm of the class statistics behind the margins, which no model of "
            "this run reads: drop it, or use it with margins (--c-bar other than none)",
        ),
        (
            ["{d}/train.npz", "--logit-scale", "3", "--grid", "head=linear"],
            "--logit-scale sets the cosine head's logit scale; add --head cosine",
        ),
        # A grid of no MR2 model: every MR2 fit failed, after ERM's search.
        (
            ["{d}/train.npz", "--lam", "0.5", "--grid", "solver=lbfgs"],
            "--grid solver=lbfgs: solver='lbfgs' requires lam=0",
        ),
        # Options the run would have ignored: the grid's values, the search's tilt, and a
        # penalty that the cosine head does not have.
        (
            ["{d}/train.npz", "--grid", "C=0.1,1", "--C", "5"],
            "--grid C searches the value that --C",
        ),
        (["{d}/train.npz", "--grid", "p=2,3", "--p", "4"], "--grid p searches the value that --p"),
        (
            ["{d}/train.npz", "--head", "cosine", "--grid", "scale=8,16", "--logit-scale", "4"],
            "--grid scale searches the value that --logit-scale sets",
        ),
        # Options with a default of their own were replaced by the grid without a word.
        (
            ["{d}/train.npz", "--c-bar", "2", "--grid", "c_bar=none,1"],
            "--grid c_bar searches the value that --c-bar sets",
        ),
        (
            ["{d}/train.npz", "--lam", "0.5", "--grid", "lam=0,0.1"],
            "--grid lam searches the value that --lam sets",
        ),
        (
            ["{d}/train.npz", "--head", "cosine", "--grid", "head=linear"],
            "--grid head searches the value that --head sets",
        ),
        (
            ["{d}/train.npz", "--max-iter", "7", "--grid", "max_iter=5,10"],
            "--grid max_iter searches the value that --max-iter sets",
        ),
        (
            ["{d}/train.npz", "--seed", "3", "--grid", "random_state=1"],
            "--grid random_state searches the value that --seed sets",
        ),
        # The scale search penalises a projection at C = 1: --C was read by nothing.
        (
            ["{d}/train.npz", "--head", "cosine", "--lam", "0.5", "--C", "0.01", "--Cs", "3"],
            "--Cs with --head cosine searches the logit scale and penalises a projection",
        ),
        (
            ["{d}/train.npz", "--grid", "class_tilt=0,5", "--tilt", "1"],
            "--tilt sweeps class_tilt on the MR² model for the front, and --grid class_tilt",
        ),
        # The front's MR² point is untilted: the tilt the grid chose was dropped from it.
        (
            ["{d}/train.npz", "--grid", "class_tilt=0,5", "--offsets", "1"],
            "--offsets draws the front, whose MR² point is untilted",
        ),
        (["{d}/train.npz", "--head", "cosine", "--C", "100"], "--C sets the L2 penalty of the"),
        (
            ["{d}/train.npz", "--head", "cosine", "--grid", "C=0.1,1"],
            "--grid C sets the L2 penalty of the linear head",
        ),
        # L-BFGS (lam = 0) reads no minibatch parameter: the search chose among fits of
        # one model and reported the first value as best.
        (
            ["{d}/train.npz", "--grid", "learning_rate=10,0.01"],
            "--grid learning_rate sets the minibatch solvers' learning rate, and every model "
            "of this search is fitted by L-BFGS (--lam 0), which does not read it",
        ),
        (["{d}/train.npz", "--grid", "batch_size=8,256"], "--grid batch_size sets the mini"),
        # Nor does L-BFGS read random_state, nor a model without margins p or difficulty.
        (
            ["{d}/train.npz", "--grid", "random_state=0,1"],
            "--grid random_state sets the minibatch solvers' random state, and every model",
        ),
        (
            ["{d}/train.npz", "--c-bar", "none", "--grid", "p=2,3"],
            "--grid p sets the norm of the class statistics behind the margins, which no model",
        ),
        (
            ["{d}/train.npz", "--c-bar", "none", "--grid", "difficulty=moment,spread"],
            "--grid difficulty sets what the margins measure a class's difficulty by, which no",
        ),
        # Nor does a model without a projection (lam = 0) read its temperature or rank, nor
        # the cosine head a bias.
        (
            ["{d}/train.npz", "--grid", "tau=1,2"],
            "--grid tau sets the compactness loss's temperature, which no model of this "
            "search reads: drop it, or search it with --lam > 0",
        ),
        (
            ["{d}/train.npz", "--grid", "lam=0", "--grid", "projection_rank=2,4"],
            "--grid projection_rank sets the rank of the projection",
        ),
        (
            ["{d}/train.npz", "--head", "cosine", "--grid", "fit_intercept=true,false"],
            "--grid fit_intercept sets the linear head's bias, which no model",
        ),
        # Parameters that change no model: a "best" value among identical fits (and
        # progress bars despite --no-progress).
        (["{d}/train.npz", "--grid", "verbose=0,1"], "--grid verbose: verbose sets the prog"),
        (["{d}/train.npz", "--grid", "warm_start=true,false"], "warm_start changes no model"),
        # True passed scikit-learn's numeric constraints as 1: C=true fitted C=1 again.
        (["{d}/train.npz", "--grid", "C=true,1"], "--grid C=true: C is no true/false"),
        (["{d}/train.npz", "--grid", "c_bar=False"], "--grid c_bar=false: c_bar is no true/"),
        (
            ["{d}/train.npz", "--tilt", "1", "--val-size", "0.98"],
            "--val-size 0.98 cannot split the 72 training samples",
        ),
        # scikit-learn's sentence kept its full stop before the advice: "parameters.; choose"
        (
            ["{d}/train.npz", "--tilt", "1", "--val-size", "0.999"],
            "Adjust any of the aforementioned parameters; choose a --val-size that leaves",
        ),
        # Labels that are no classes: refused after the fit had started, in scikit-learn's
        # words ("Unknown label type: continuous"), naming no file.
        (["{d}/X.npy", "--labels", "{d}/y_half.npy"], "the labels are real numbers, such as 0."),
        (["{d}/complex_y.npz"], "complex_y.npz: the labels are complex numbers, such as 0j, not"),
        # Fitted, then a TypeError's traceback while reporting (status 1).
        (
            ["{d}/record_y.npz"],
            "the labels of {d}/record_y.npz are records of dtype [('k', '<i4')]",
        ),
        (
            ["{d}/huge_y.npz"],
            "huge_y.npz: the labels are floats as large as 9007199254740994.0; float labels "
            "must be whole numbers below 2**53 in magnitude: give class labels as integers",
        ),
        # A class of one sample: the advice was another --val-size (or --test-size), and the
        # class was named by its code.
        (["{d}/single.npz"], "with every class in both parts: 1 class has a single sample (the"),
        (
            ["{d}/pair.npz", "--tilt", "1"],
            "1 class has a single sample left by the --test-size split (the first: 7), which no "
            "split puts on both sides: drop those samples or add more of their classes, or "
            "pass --test FILE to train on all of them",
        ),
        (
            ["{d}/single.npz", "--test", "{d}/test.npz", "--offsets", "1"],
            "both sides: 1 class has a single sample (the first: 7), which no split puts on",
        ),
        pytest.param(
            ["{d}/single.h5", "--test", "{d}/store_test.h5", "--tilt", "1"],
            "1 class has a single sample (the first: 'Trouser'), which",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/single.h5"], "(the first: 'Trouser'), which no split puts", marks=NEEDS_H5
        ),
        # A stratified --test-size split that held out every sample of small classes: they
        # were scored 0% without a note (or, with one class left, refused after a fit).
        (
            ["{d}/uneven.npz", "--test-size", "0.7"],
            "cannot hold out --test-size 0.7 of {d}/uneven.npz with every class in both parts: "
            "it leaves 1 of the 4 classes no sample to train on (the first: 1); choose a",
        ),
        (["{d}/uneven.npz", "--test-size", "0.9"], "it leaves 3 of the 4 classes no sample"),
        # Booleans beside a store were taken for codes, then indexed its names as a mask
        # (an IndexError after every fit).
        pytest.param(
            ["{d}/store.h5", "--test", "{d}/bool.npz"],
            "the labels of {d}/bool.npz are booleans (True/False), which name no class of "
            "{d}/store.h5: label them",
            marks=NEEDS_H5,
        ),
        pytest.param(
            ["{d}/bool.npz", "--test", "{d}/store_test.h5"],
            "the labels of {d}/bool.npz are booleans (True/False), which name no class of "
            "{d}/store_test.h5",
            marks=NEEDS_H5,
        ),
        # Outputs that cannot be written, found before any work.
        (["{d}/train.npz", "--out", ""], "--out needs a folder; got an empty name"),
        (["{d}/train.npz", "--out", "{d}/notes.txt"], "'{d}/notes.txt' is a file"),
        (["{d}/train.npz", "--out", "{d}/notes.txt/run"], "'{d}/notes.txt' is a file"),
    ],
)
def test_mistakes_end_in_one_line_and_status_2(files, stores, argv, message, capsys):
    line = _refused([arg.format(d=files) for arg in argv], capsys)
    assert message.format(d=files) in line


def test_tilt_0_with_a_grid_whose_only_models_are_erm_is_refused_before_any_fit(files, capsys):
    # lam=0.5 with solver=lbfgs is no model, left out of the search: counted as a choice of
    # it, every model was fitted, then the front failed in the library's terms.
    argv = [str(files / "train.npz"), "--c-bar", "none", "--grid", "lam=0,0.5", "--grid",
            "solver=lbfgs", "--tilt", "0", "--no-progress"]  # fmt: skip
    status, err = _error(argv, capsys)
    assert status == 2 and not any(line.startswith("fitting") for line in err)
    assert err[-1].startswith("mr2-probe: error: --tilt 0 with --c-bar none is a front of ERM")


# (--p 3, which c_bar=None does not read: the front was drawn, its MR2 point ERM's model
# fitted again, status 0, where the warning said the front would be left out)
@pytest.mark.parametrize("options", [[], ["--p", "3"]])
def test_tilt_0_with_a_grid_that_chose_erm_says_so_early_and_in_its_options(
    files, tmp_path, capsys, options
):
    # --grid c_bar=none,1 --tilt 0 (taken: it may choose c_bar=1) fitted every model without
    # a word, then failed the front in the library's terms ("Give tilts or offset_bounds")
    # where the search chose c_bar=None (here the first of two settings scored the same).
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--grid", "c_bar=none,1", "--tilt", "0", "--out",
            str(out), "--no-progress", *options]  # fmt: skip
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "best parameters by worst_class (3-fold CV): {'c_bar': None}" in captured.out
    err = captured.err.splitlines()
    assert err[0].startswith(
        "mr2-probe: warning: --tilt 0 with a --grid that may choose ERM's configuration"
    )
    assert (
        "mr2-probe: error: the front failed and is left out: MR2 grid's search chose "
        "c_bar=None, ERM's configuration (no margins, no projection), so --tilt 0 is a front "
        "of ERM alone; give --tilt values above 0 or --offsets to draw a front whatever the "
        "search chooses"
    ) in err
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2 grid"}


@pytest.mark.parametrize(
    "options, points",
    [
        # --p 3, which c_bar=None does not read: a search that chose c_bar=None gave the
        # front an MR2 point of its own, ERM's model fitted again, where without --p it had
        # none.
        (["--tilt", "0,1", "--p", "3"], ["ERM", "tilt=1"]),
        # With offsets the front is more than ERM whatever the search chooses: drawn.
        (["--tilt", "0", "--offsets", "1"], ["ERM", "offsets≤1pt"]),
    ],
)
@pytest.mark.slow
def test_a_grid_s_choice_of_no_margins_is_no_front_point_of_its_own(
    files, tmp_path, options, points
):
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--grid", "c_bar=none,1", *options, "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    front = json.loads((out / "report.json").read_text())["front"]
    assert [point["name"] for point in front["points"]] == points


@pytest.mark.parametrize("name", ["train.npz", pytest.param("store.h5", marks=NEEDS_H5), "y.npy"])
def test_a_link_to_a_file_moved_away_is_said_to_be_one(files, stores, tmp_path, name, capsys):
    # A symbolic link whose file was moved away was said not to exist, beside it.
    link = tmp_path / f"link{Path(name).suffix}"
    link.symlink_to(tmp_path / "moved" / name)
    argv = [str(files / "X.npy"), "--labels", str(link)] if name == "y.npy" else [str(link)]
    line = _refused(argv, capsys)
    assert (
        f"'{link}' is a symbolic link to '{tmp_path}/moved/{name}', which does not exist; check "
        "the path"
    ) in line


def test_cs_needs_two_values_to_choose_from(files, capsys):
    # --Cs 1 "chose" its one value, C = 1e-4, and MR² predicted a single class.
    code, lines = _error([str(files / "train.npz"), "--Cs", "1"], capsys)
    assert code == 2 and lines[-1] == (
        "mr2-probe: error: argument --Cs: expected a number of values >= 2 to choose from, "
        "e.g. 20, or 'bisect'; got '1'"
    )


@pytest.mark.parametrize(
    "given, every",
    [
        (["--tilt", "0", "--tilt", "1,2"], "--tilt 0,1,2"),
        (["--offsets=0.5", "--off", "1"], "--offsets 0.5,1"),  # (an abbreviation as well)
        # Each value once and in full: the cure said --tilt 1,1,2 (refused, 1 given twice)
        # and --tilt 0.123457,1 (another front than the one given).
        (["--tilt", "1", "--tilt", "1,2"], "--tilt 1,2"),
        (["--tilt", "0.1234567", "--tilt", "1"], "--tilt 0.1234567,1"),
    ],
)
def test_a_list_of_values_given_twice_is_refused(files, capsys, given, every):
    # --tilt 0 --tilt 1 drew the front of --tilt 1 alone (argparse keeps the last), where
    # --grid, once per name, adds up.
    code, lines = _error([str(files / "train.npz"), *given], capsys)
    option = every.split()[0]
    assert code == 2 and lines[-1] == (
        f"mr2-probe: error: argument {option}: given twice; give all its values at once, "
        f"e.g. {every}"
    )
    _checked([str(files / "train.npz"), *every.split()])  # the cure, followed, is taken


@pytest.mark.slow
def test_out_replaces_an_earlier_runs_files_and_no_one_elses(files, tmp_path, capsys):
    out = tmp_path / "project"
    out.mkdir()
    (out / "report.md").write_text("my own notes\n")
    (out / "front.png").write_text("keep\n")
    code, lines = _error([str(files / "train.npz"), "--out", str(out), "--no-progress"], capsys)
    assert code == 2 and "holds report.md, front.png, which this run would replace" in lines[0]
    assert "there is no command.json of one" in lines[0]
    for other in ('{"name": "another tool"}', '{"train": "x.npz"}', '["train", "out"]'):
        (out / "command.json").write_text(other + "\n")
        code, lines = _error([str(files / "train.npz"), "--out", str(out), "--no-progress"], capsys)
        assert code == 2 and "its command.json holds no run's options" in lines[0], other
    assert (out / "report.md").read_text() == "my own notes\n"
    assert (out / "front.png").read_text() == "keep\n"
    # An earlier run's folder is replaced, as documented.
    run = tmp_path / "run"
    argv = [str(files / "train.npz"), "--out", str(run), "--no-progress", "--max-iter", "5"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--c-bar", "2"]) == 0
    assert json.loads((run / "command.json").read_text())["c_bar"] == 2
    # Said at the start, not silently (the files listed are those the folder held).
    assert capsys.readouterr().err.startswith(
        f"mr2-probe: --out {str(run)!r} holds an earlier run's models.joblib, command.json, "
        "report.txt, report.md, report.json, class_accuracy.png, groups.png, margins.png; "
        "this run replaces them when it ends (choose another --out to keep them)\n"
    )
    # One file is "it"; a run refused for its inputs promised a replacement that never came.
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(run / "command.json", lone / "command.json")
    missing = ["--test", str(files / "missing.npz"), "--out", str(lone)]
    code, lines = _error([str(files / "train.npz"), *missing], capsys)
    assert code == 2 and len(lines) == 1 and "does not exist" in lines[0]
    assert main([*argv[:1], "--out", str(lone), *argv[3:]]) == 0
    assert f"{str(lone)!r} holds an earlier run's command.json; this run replaces it when" in (
        capsys.readouterr().err
    )
    # What this run does not write, an earlier run's CV curve and class names (an .npz
    # has none), is removed with the rest, not left to describe other models.
    for name in ("cv_curve.png", "class_names.json"):
        (run / name).write_text("an earlier run's\n")
    assert main(argv) == 0
    assert not (run / "cv_curve.png").exists() and not (run / "class_names.json").exists()
    # Any one of the output names, alone in a folder no run wrote, is refused.
    capsys.readouterr()
    for name in _OUTPUTS:
        alone = tmp_path / f"alone-{name}"
        alone.mkdir()
        (alone / name).write_text("someone else's\n")
        code, lines = _error([str(files / "train.npz"), "--out", str(alone)], capsys)
        assert code == 2 and f"holds {name}, which this run would replace" in lines[0], name


def test_a_reader_that_closes_stdout_early_still_gets_out_written(files, tmp_path, monkeypatch):
    # `mr2-probe ... --out run | head -1`: the BrokenPipeError (an OSError) ended the run
    # as a mistake in the inputs, status 2, after its fits and before --out was written.
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the report is printed
    closed = open(write, "w")
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        code = main([str(files / "train.npz"), "--out", str(tmp_path / "run"), "--no-progress"])
        print("more", flush=True)  # later output goes nowhere, without an error
    finally:
        monkeypatch.undo()
        closed.close()
    assert code == 0
    assert {"report.json", "report.txt", "models.joblib"} <= set(os.listdir(tmp_path / "run"))


@pytest.mark.slow
def test_a_locale_that_cannot_encode_the_report_still_gets_it_printed_and_written(files, tmp_path):
    # Under LC_ALL=C (ASCII) the finished run's γ (c_bar=None) failed on stdout and in the
    # report files: "'ascii' codec can't encode", status 2, and --out left empty.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8")}
    command = [sys.executable, "-m", "mr2_probe", str(files / "train.npz"), "--c-bar", "none"]
    command += ["--out", str(tmp_path / "run"), "--no-progress"]
    run = subprocess.run(
        command, capture_output=True, env=env | {"LC_ALL": "C", "PYTHONUTF8": "0"}, timeout=300
    )
    assert run.returncode == 0, run.stderr.decode()
    assert b"?" in run.stdout and b"accuracy" in run.stdout  # γ shown as ?
    for name in ("report.txt", "report.md"):
        assert "γ" in (tmp_path / "run" / name).read_text(encoding="utf-8")


def test_a_path_that_is_not_utf8_is_written_escaped_and_loses_no_model(files, tmp_path):
    # A folder named in Latin-1 (os.fsdecode: a lone surrogate) failed report.json's UTF-8
    # after every fit: status 2, and --out left without even the models.
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    shutil.copy(files / "train.npz", folder / "train.npz")
    out = tmp_path / "run"
    argv = [str(folder / "train.npz"), "--max-iter", "20", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["inputs"]["train"]["path"] == str(folder / "train.npz")
    assert "\\udce9" in (out / "report.json").read_text(encoding="utf-8")


def test_a_hard_link_to_the_training_file_is_refused_as_test_set(files, tmp_path, capsys):
    # Names were compared: a hard link (another name, one file) was taken as a test set.
    os.link(files / "train.npz", tmp_path / "test.npz")
    code, lines = _error([str(files / "train.npz"), "--test", str(tmp_path / "test.npz")], capsys)
    assert code == 2 and "holds the training images of" in lines[-1]


def test_debug_shows_the_traceback(files):
    with pytest.raises(UsageError, match="does not exist"):
        main([str(files / "missing.npz"), "--debug"])


def _capabilities_without_override():
    """A command prefix under which this process's user is refused an unwritable folder."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's permission override")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


@pytest.mark.slow
def test_python_m_mr2_probe_refuses_an_unwritable_out_before_any_work(files, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    # python -m mr2_probe, the command (it had no __main__ once), in a fresh interpreter.
    command = [*_capabilities_without_override(), sys.executable, "-m", "mr2_probe"]
    command += [str(files / "train.npz"), "--out", str(locked), "--no-progress"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"mr2-probe: error: cannot write to --out {str(locked)!r} (Permission denied); "
        "choose a folder you can write to"
    ]
    assert os.listdir(locked) == []


@pytest.mark.slow
def test_feature_scaling_logit_scale_and_the_deprecated_scale(files, tmp_path, capsys):
    data = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--no-progress"]
    assert main([*data, "--feature-scaling", "standard", "--out", str(tmp_path / "a")]) == 0
    models = joblib.load(tmp_path / "a" / "models.joblib")
    for model in models.values():
        assert isinstance(model, Pipeline) and isinstance(model[0], StandardScaler)
    assert "deprecated" not in capsys.readouterr().err

    assert main([*data, "--scale", "standard", "--out", str(tmp_path / "b")]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert warning == [
        "mr2-probe: warning: --scale is deprecated and will be removed in the next release; "
        "use --feature-scaling standard (the cosine head's logit scale is --logit-scale)"
    ]
    models = joblib.load(tmp_path / "b" / "models.joblib")
    assert all(isinstance(model[0], StandardScaler) for model in models.values())
    # command.json records the option by its name, not the deprecated one.
    options = json.loads((tmp_path / "b" / "command.json").read_text())
    assert options["feature_scaling"] == "standard" and "scale" not in options
    # Only the options the run read: it recorded a search's cv and scoring, the front's
    # val_size, and test_size beside --test, which no run can be given back, nor a seed
    # where nothing is split or drawn at random.
    unread = ("cv", "scoring", "n_jobs", "val_size", "front_bound", "test_size", "seed")
    assert [options[name] for name in unread] == [None] * len(unread)

    cosine = ["--head", "cosine", "--logit-scale", "16", "--out", str(tmp_path / "c")]
    assert main([*data, *cosine]) == 0
    models = joblib.load(tmp_path / "c" / "models.joblib")
    # Both probes get the head and its logit scale: ERM is MR² without margins.
    assert [(m.head, m.scale, m.c_bar) for m in models.values()] == [
        ("cosine", 16.0, None), ("cosine", 16.0, 1.0),
    ]  # fmt: skip


def _store(path, X, y, class_names, done=True, failed=(), digests=None, **provenance):
    """A feature store written with extract's own writer (the rows ``failed`` failed;
    ``digests``, the images' sha256, empty by default)."""
    import h5py

    from extract._schema import DONE, FAILED
    from extract._store import create_store, write_rows

    n = len(y)
    provenance = {"format_version": 2} | provenance
    create_store(
        path, provenance=provenance, record={}, dim=X.shape[1], dtype="float32",
        labels=y, indices=np.arange(n), ids=[f"item/{i:05d}" for i in range(n)],
        class_names=class_names, file_size=np.full(n, -1), file_mtime_ns=np.full(n, -1),
    )  # fmt: skip
    rows = n if done else 2 * n // 3
    with h5py.File(path, "r+") as f:
        status = np.full(rows, DONE, np.uint8)
        status[list(failed)] = FAILED
        digests = [""] * rows if digests is None else list(digests)[:rows]
        write_rows(f, np.arange(rows), X[:rows], status, [""] * rows, digests)
    return path


@NEEDS_H5
def test_a_store_s_test_row_the_scaling_makes_infinite_is_named_by_its_image(tmp_path, capsys):
    # (its failed rows are not read: the row read 4 is store row 5)
    train, test = _far_out(tmp_path, np.float32, 1e38)
    with np.load(test) as data:
        X_test, y_test = np.insert(data["X"], 1, 0, axis=0), np.insert(data["y"], 1, 0)
    store = _store(tmp_path / "test.h5", X_test, y_test, FASHION, failed=[1])
    argv = [str(train), "--test", str(store), "--feature-scaling", "standard", "--no-progress"]
    code, lines = _error(argv, capsys)  # (after the warnings: its failed image, its codes)
    assert code == 2 and not any(line.startswith("fitting") for line in lines)
    assert "(the first is store row 5, 'item/00005': its column 2 holds 1e+38" in lines[-1]


@NEEDS_H5
def test_a_store_s_held_out_row_the_scaling_makes_infinite_is_named_by_its_image(tmp_path, capsys):
    # Held out of a store by --test-size: the held-out row is named by its store row and
    # image (the rows read skip its failed row 0: read row r is store row r + 1).
    from sklearn.model_selection import train_test_split

    train, _ = _far_out(tmp_path, np.float32, 1)
    with np.load(train) as data:
        X, y = data["X"], data["y"]
    rows = np.arange(len(y))
    held = train_test_split(rows, test_size=0.2, stratify=y, random_state=0)[1][0]
    X[held, 2] = 1e38
    store = _store(
        tmp_path / "train.h5", np.insert(X, 0, 0, 0), np.insert(y, 0, 0), FASHION, failed=[0]
    )
    argv = [str(store), "--feature-scaling", "standard", "--no-progress"]
    code, lines = _error(argv, capsys)  # (after its failed image's line)
    assert code == 2 and not any(line.startswith("fitting") for line in lines)
    assert lines[-1].startswith(f"mr2-probe: error: the rows of {store} held out by --test-size")
    assert f"(the first is store row {held + 1}, 'item/{held + 1:05d}': its column 2" in lines[-1]


@NEEDS_H5
def test_a_training_store_s_validation_row_the_scaling_makes_infinite_is_named_by_its_image(
    tmp_path, capsys
):
    # The front's validation row r of the training features read is the store's row r + 1
    # where its row 0 failed (a failed row is not read).
    train, test, row = _far_in_the_front(tmp_path, 1e38)
    with np.load(train) as data:
        X, y = np.insert(data["X"], 0, 0, axis=0), np.insert(data["y"], 0, 0)
    store = _store(tmp_path / "train.h5", X, y, FASHION, failed=[0])
    with np.load(test) as data:
        test = _store(tmp_path / "test.h5", data["X"], data["y"], FASHION)
    argv = [str(store), "--test", str(test), "--feature-scaling", "standard", "--tilt", "0.5"]
    code, lines = _error([*argv, "--no-progress"], capsys)  # (after its failed image's line)
    assert code == 2 and not any(line.startswith("fitting") for line in lines)
    assert lines[-1].startswith(f"mr2-probe: error: the front's validation part of {store} ")
    assert f"(the first is store row {row + 1}, 'item/{row + 1:05d}': its column 2" in lines[-1]


def _features_file(path, X, y):
    """X and y as a .npz (X, y), or for another suffix as a store of the datasets h5py
    writes (features, labels, class_names)."""
    if str(path).endswith(".npz"):
        np.savez(path, X=X, y=y)
    else:
        import h5py

        with h5py.File(path, "w") as f:
            f["features"], f["labels"], f["class_names"] = X, y, FASHION
    return path


@pytest.fixture(scope="module")
def stores(files):
    """Stores (and broken HDF5 files) beside the NumPy inputs, where h5py is installed."""
    try:
        import h5py
    except ImportError:
        return None
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    _store(files / "store.h5", X, y, FASHION, source_fingerprint="sha256:train")
    _store(files / "store_test.h5", X_test, y_test, FASHION, source_fingerprint="sha256:test")
    _store(files / "renamed.h5", X_test, y_test, ["Sandal", "Shirt", "Bag"])
    _store(files / "near.h5", X_test, y_test, ["t-shirt/top", "Trousers", "Ankle boot"])
    shutil.copy(files / "store.h5", files / "store_copy.h5")
    # Two subsets of one source (--per-class 30, then 3): the second's images are the first's.
    _store(files / "most.h5", X, y, FASHION, source_fingerprint="sha256:a", source_root="/fm")
    _store(
        files / "few.h5", X[:9], y[:9], FASHION, source_fingerprint="sha256:b", source_root="/fm"
    )
    # Trouser (code 1) has a single sample.
    _store(files / "single.h5", X[y != 1][:41], np.r_[y[y != 1][:40], 1], FASHION)
    # A subset without any Trouser, whose store still lists the class.
    _store(files / "no_trouser.h5", X[y != 1], y[y != 1], FASHION, source_fingerprint="sha256:c")
    # Two shards of one image list: the same fingerprint, disjoint images.
    shard = dict(source_fingerprint="sha256:list", shard_world_size=2)
    _store(files / "shard0.h5", X, y, FASHION, shard_rank=0, **shard)
    _store(files / "shard1.h5", X_test, y_test, FASHION, shard_rank=1, **shard)
    # The test classes in another order, or one of them missing: a list source's store.
    _store(files / "reversed.h5", X_test, 2 - y_test, FASHION[::-1])
    keep = y_test != 1
    _store(files / "two.h5", X_test[keep], (2 - y_test[keep]) // 2, [FASHION[2], FASHION[0]])
    with_nan = X.copy()
    with_nan[7, 1] = np.nan
    _store(files / "store_nan.h5", with_nan, y, FASHION, source_fingerprint="sha256:nan")
    with h5py.File(files / "float_labels.h5", "w") as f:
        f["features"], f["labels"], f["class_names"] = X, y.astype(np.float32), FASHION
    _store(files / "partial.h5", X, y, FASHION, done=False)
    pre = {"resize": 36, "crop": [32, 32], "decode": "pil", "transform": "Compose(...)"}
    made = dict(backbone="timm:resnet18", weights="sha256:aa", normalize=False)
    _store(files / "r18.h5", X, y, FASHION, preprocessing=pre, **made)
    tensor = pre | {"decode": "tensor", "transform": "Compose(other)"}  # rounding only
    _store(files / "r18_tensor.h5", X_test, y_test, FASHION, preprocessing=tensor, **made)
    _store(  # one more column: named by its backbone, not by its width
        files / "r34.h5", np.hstack([X_test, X_test[:, :1]]), y_test, FASHION, preprocessing=pre,
        **made | {"backbone": "timm:resnet34", "weights": "sha256:bb"},
    )  # fmt: skip
    crop = pre | {"crop": [64, 64]}
    _store(files / "r18_64.h5", X_test, y_test, FASHION, preprocessing=crop, **made)
    (files / "garbage.h5").write_bytes(b"not hdf5")
    for name, keep in (("no_labels.h5", "class_names"), ("no_names.h5", "labels")):
        with h5py.File(files / name, "w") as f:
            f["features"] = X
            f[keep] = y if keep == "labels" else FASHION
    return files


@NEEDS_H5
def test_test_store_labels_are_matched_to_the_training_classes_by_name(stores, capsys):
    # A store's labels are codes into its own class names: the same test images with the
    # classes listed in reverse order score the same, and a test store lacking a class is
    # scored on the others (both used to be refused).
    def run(test):
        assert main([str(stores / "store.h5"), "--test", str(stores / test), "--no-progress"]) == 0
        return capsys.readouterr().out.replace(test, "TEST")

    same = run("store_test.h5")
    assert run("reversed.h5") == same
    assert "MR2" in run("two.h5")


@NEEDS_H5
def test_text_labels_are_matched_to_a_store_s_classes_by_name(stores, tmp_path, capsys):
    # A store's labels are codes into its class names; text labels of a NumPy file on the
    # other side were refused as "3 classes absent from the training labels".
    def run(train, test):
        assert main([str(stores / train), "--test", str(stores / test), "--no-progress"]) == 0
        return capsys.readouterr().out.replace(test, "TEST").replace(train, "TRAIN")

    assert run("store.h5", "names.npz") == run("store.h5", "store_test.h5")
    X, y = _blobs(30, seed=1)
    np.savez(tmp_path / "train_names.npz", X=X, y=np.array(FASHION)[y])
    train = str(tmp_path / "train_names.npz")
    assert run(train, "store_test.h5") == run(train, "names.npz")
    X_test, y_test = _blobs(10, seed=2)
    np.savez(tmp_path / "bags.npz", X=X_test, y=np.where(y_test == 1, "Bag", "Trouser"))
    status, err = _error([str(stores / "store.h5"), "--test", str(tmp_path / "bags.npz")], capsys)
    assert status == 2 and "has 1 class that" in err[-1] and "('Bag')" in err[-1]
    # A class the training store lists without a sample is named, as for two stores.
    no_trouser = [str(stores / "no_trouser.h5"), "--test", str(stores / "names.npz")]
    status, err = _error(no_trouser, capsys)
    assert status == 2 and "('Trouser'); " in err[-1] and "holds no sample of it" in err[-1]
    np.savez(tmp_path / "no_trouser.npz", X=X[y != 1], y=np.array(FASHION)[y[y != 1]])
    status, err = _error(
        [str(tmp_path / "no_trouser.npz"), "--test", str(stores / "store_test.h5")], capsys
    )
    assert status == 2 and "('Trouser'); a probe cannot predict classes it was not" in err[-1]


@NEEDS_H5
def test_integer_labels_beside_a_store_are_taken_as_its_codes_with_a_warning(stores, capsys):
    # They were scored as the store's codes without a word, even where the store lists
    # its classes in another order (every score 0%).
    for train, test in (("store.h5", "test.npz"), ("train.npz", "reversed.h5")):
        args = [str(stores / train), "--test", str(stores / test), "--no-progress"]
        assert main(args) == 0
        numbers, store = (test, train) if train.endswith(".h5") else (train, test)
        names = FASHION if store == "store.h5" else FASHION[::-1]
        warning = [line for line in capsys.readouterr().err.splitlines() if "integer" in line]
        assert warning == [
            f"mr2-probe: warning: the integer labels of {stores / numbers} are taken as codes "
            f"of {stores / store}'s class names (0 {names[0]!r}, 1 {names[1]!r}, "
            f"2 {names[2]!r}), not matched by name: label {stores / numbers} with class names "
            "to match them"
        ]
    # Labels of their own file: named as the file to relabel.
    args = [str(stores / "X.npy"), "--labels", str(stores / "y.npy")]
    assert main([*args, "--test", str(stores / "store_test.h5"), "--no-progress"]) == 0
    assert f"the integer labels of {stores / 'y.npy'} are taken" in capsys.readouterr().err
    for same in (
        ["store.h5", "store_test.h5"],
        ["train.npz", "test.npz"],
        ["store.h5", "names.npz"],
    ):
        assert main([str(stores / same[0]), "--test", str(stores / same[1]), "--no-progress"]) == 0
        assert "integer labels" not in capsys.readouterr().err


@NEEDS_H5
def test_unsigned_store_labels_are_matched_by_name(tmp_path, capsys):
    # uint8 labels, and a test store that lists a class it holds no label of: the name
    # table's -1 for that class overflowed uint8 (a traceback).
    import h5py

    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    keep = y_test < 2
    for name, feats, labels, names in (
        ("train.h5", X, y, ["a", "b", "c"]),
        ("test.h5", X_test[keep], 1 - y_test[keep], ["b", "a", "z"]),
    ):
        with h5py.File(tmp_path / name, "w") as f:
            f["features"], f["labels"] = feats, labels.astype(np.uint8)
            f["class_names"] = names
    out = tmp_path / "run"
    argv = [str(tmp_path / "train.h5"), "--test", str(tmp_path / "test.h5"), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    per_class = json.loads((out / "report.json").read_text())["inputs"]["test"]
    assert per_class["samples_per_class"] == {
        "a": int((y_test == 0).sum()),
        "b": int((y_test == 1).sum()),
    }


@NEEDS_H5
@pytest.mark.slow
def test_class_names_in_two_unicode_forms_are_matched_as_one(tmp_path, capsys):
    # A test store extracted from a folder copied off macOS spells "ñandú" decomposed
    # (NFD): refused as "test.h5 has 1 class that train.h5 does not ('ñandú')".
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    composed = ["cat", "\u00f1and\u00fa", "dog"]
    decomposed = ["cat", "n\u0303andu\u0301", "dog"]
    _store(tmp_path / "train.h5", X, y, composed, source_fingerprint="sha256:train")
    _store(tmp_path / "test.h5", X_test, y_test, decomposed, source_fingerprint="sha256:test")
    np.savez(tmp_path / "test.npz", X=X_test, y=np.array(decomposed)[y_test])
    np.savez(tmp_path / "train.npz", X=X, y=np.array(composed)[y])
    out = tmp_path / "run"
    for train, test in (
        ("train.h5", "test.h5"),
        ("train.h5", "test.npz"),
        ("train.npz", "test.h5"),
        ("train.npz", "test.npz"),  # (refused as two classes absent from training)
    ):
        argv = [str(tmp_path / train), "--test", str(tmp_path / test), "--no-progress"]
        assert main([*argv, "--out", str(out)]) == 0
        report = json.loads((out / "report.json").read_text())
        assert sorted(report["labels"]) == sorted(composed)  # the training spelling
        assert report["inputs"]["test"]["samples_per_class"] == {
            name: int((y_test == k).sum()) for k, name in enumerate(composed)
        }
    # Both forms as two training classes: which one a test "ñandú" is cannot be told.
    _store(tmp_path / "both.h5", X, y, [*composed[:2], decomposed[1]], source_fingerprint="a")
    status, err = _error([str(tmp_path / "both.h5"), "--test", str(tmp_path / "test.h5")], capsys)
    assert status == 2 and "one name in two Unicode forms" in err[-1]
    np.savez(tmp_path / "both.npz", X=X, y=np.array([*composed[:2], decomposed[1]])[y])
    status, err = _error([str(tmp_path / "both.npz"), "--test", str(tmp_path / "test.npz")], capsys)
    assert status == 2 and "one name in two Unicode forms" in err[-1]
    # Text training labels in both forms against a store's names: both were read as one.
    status, err = _error([str(tmp_path / "both.npz"), "--test", str(tmp_path / "test.h5")], capsys)
    assert status == 2 and "one name in two Unicode forms" in err[-1]


@pytest.mark.slow
def test_the_report_records_paths_absolute_and_each_class_s_count(files, tmp_path, monkeypatch):
    # Relative paths, a labels file for each side, classes of uneven sizes.
    for name in ("uneven", "uneven_test"):
        data = np.load(files / f"{name}.npz")
        np.save(tmp_path / f"{name}_X.npy", data["X"])
        np.save(tmp_path / f"{name}_y.npy", data["y"])
    monkeypatch.chdir(tmp_path)
    argv = ["uneven_X.npy", "--labels", "uneven_y.npy", "--test", "uneven_test_X.npy"]
    argv += ["--test-labels", "uneven_test_y.npy", "--out", "run", "--no-progress"]
    assert main(argv) == 0
    inputs = json.loads(Path("run/report.json").read_text())["inputs"]
    here = os.getcwd()
    for side, name in (("train", "uneven"), ("test", "uneven_test")):
        assert inputs[side]["path"] == os.path.join(here, f"{name}_X.npy")
        assert inputs[side]["labels"] == os.path.join(here, f"{name}_y.npy")
        assert inputs[side]["samples_per_class"] == {"0": 60, "1": 2, "2": 2, "3": 2}
    # A test set held out of the training data: the split that made it.
    argv = ["uneven_X.npy", "--labels", "uneven_y.npy", "--test-size", "0.5", "--seed", "7"]
    assert main([*argv, "--out", "held", "--no-progress"]) == 0
    test = json.loads(Path("held/report.json").read_text())["inputs"]["test"]
    assert test["held_out_of"] == os.path.join(here, "uneven_X.npy")
    assert (test["test_size"], test["seed"], test["samples"]) == (0.5, 7, 33)


def test_a_cosine_search_of_the_scale_says_scale(files, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--head", "cosine", "--Cs", "3", "--cv", "3"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    models = joblib.load(out / "models.joblib")
    for name in ("ERM", "MR2"):
        assert f"{name}: chose scale={models[name].C_:.4g} by " in printed
    assert " C=" not in printed and "       scale  " in printed
    # report.json recorded the scale searched as "C", beside the model's own C of 1.
    for name, cv in json.loads((out / "report.json").read_text())["cv"].items():
        assert cv.keys() == {"scale", "scales", "curves"}
        assert cv["scale"] == models[name].C_ and cv["scales"] == models[name].Cs_.tolist()


@NEEDS_H5
def test_classes_of_one_name_are_scored_apart(tmp_path, capsys):
    # Two classes named "crane": predictions mapped to names scored a crane of one class
    # predicted as the other as correct (100% where the probe had 67%), and the test
    # labels translated by name all went to the last "crane".
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(20, seed=2)
    X[y == 1], X_test[y_test == 1] = X[y == 0], X_test[y_test == 0]  # 0 and 1 alike
    cranes = ["crane", "crane", "dog"]
    _store(tmp_path / "train.h5", X, y, cranes, source_fingerprint="sha256:train")
    _store(tmp_path / "test.h5", X_test, y_test, cranes, source_fingerprint="sha256:test")
    out = tmp_path / "run"
    argv = [str(tmp_path / "train.h5"), "--test", str(tmp_path / "test.h5")]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["labels"] == ["crane (0)", "crane (1)", "dog"]
    crane_0, crane_1, dog = report["per_class"]["ERM"]
    assert crane_0 + crane_1 == pytest.approx(100) and dog == 100
    assert report["rows"]["ERM"]["overall"] == pytest.approx(200 / 3)
    # In another order, the test classes cannot be matched to the training ones by name.
    _store(tmp_path / "other.h5", X_test, 2 - y_test, cranes[::-1], source_fingerprint="sha256:o")
    argv[-1] = str(tmp_path / "other.h5")
    status, err = _error([*argv, "--no-progress"], capsys)
    assert status == 2 and "the class names 'crane' name several classes" in err[-1]
    # Nor can text labels be matched to either crane.
    np.savez(tmp_path / "text.npz", X=X_test, y=np.array(cranes)[y_test])
    argv[-1] = str(tmp_path / "text.npz")
    status, err = _error([*argv, "--no-progress"], capsys)
    assert status == 2 and "the class names 'crane' name several classes" in err[-1]


@NEEDS_H5
def test_a_name_told_apart_is_not_taken_from_another_class(tmp_path):
    # A third class named "crane (1)", the name the second crane was told apart by: two
    # classes shown alike, and the run stopped after its fits.
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    names = ["crane", "crane", "crane (1)"]
    _store(tmp_path / "train.h5", X, y, names, source_fingerprint="sha256:train")
    _store(tmp_path / "test.h5", X_test, y_test, names, source_fingerprint="sha256:test")
    out = tmp_path / "run"
    argv = [str(tmp_path / "train.h5"), "--test", str(tmp_path / "test.h5"), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    labels = json.loads((out / "report.json").read_text())["labels"]
    assert labels == ["crane (code 0)", "crane (code 1)", "crane (1)"]
    from mr2_probe.cli._inputs import _distinct

    defeating = ["a", "a", "a (1)", "a (code 1)"]
    assert len(set(_distinct(defeating))) == 4


@NEEDS_H5
def test_a_test_class_whose_every_image_failed_is_not_a_foreign_class(stores, tmp_path):
    # Refused as "1 classes that store.h5 does not ('Bag')", although no Bag was left.
    X_test, y_test = _blobs(10, seed=2)
    X_test, y_test = np.r_[X_test, X_test[:2]], np.r_[y_test, 3, 3]
    names = [*FASHION, "Bag"]
    _store(tmp_path / "bag.h5", X_test, y_test, names, failed=[30, 31])
    argv = [str(stores / "store.h5"), "--test", str(tmp_path / "bag.h5"), "--no-progress"]
    assert main(argv) == 0


@NEEDS_H5
def test_training_images_in_a_test_store_are_found_by_their_content(tmp_path, capsys):
    # Two folders of other images with the same file names, sizes and times (an archive
    # unpacked twice) made one fingerprint: refused as "the training images". A list file
    # naming training images from elsewhere (another source root) was taken.
    X, y = _blobs(10, seed=1)
    X_test, y_test = _blobs(4, seed=2)
    train = [f"{k:064x}" for k in range(30)]
    other = [f"{k + 100:064x}" for k in range(12)]
    same = dict(source_fingerprint="sha256:listing")
    _store(tmp_path / "train.h5", X, y, FASHION, digests=train, source_root="/a", **same)
    _store(tmp_path / "alike.h5", X_test, y_test, FASHION, digests=other, source_root="/b", **same)
    run = [str(tmp_path / "train.h5"), "--no-progress", "--test"]
    assert main([*run, str(tmp_path / "alike.h5")]) == 0
    picked = [0, 1, 10, 11, 20, 21]  # two training images of each class, listed elsewhere
    listed = dict(source_fingerprint="sha256:list", source_root="/lists")
    digests = [train[k] for k in picked]
    _store(tmp_path / "picked.h5", X[picked], y[picked], FASHION, digests=digests, **listed)
    status, err = _error([*run, str(tmp_path / "picked.h5")], capsys)
    assert status == 2 and "holds the training images of" in err[-1]
    # A few images that two sources share are said, not refused.
    mixed = other[:10] + train[:2]
    _store(tmp_path / "mixed.h5", X_test, y_test, FASHION, digests=mixed,
           source_fingerprint="sha256:mixed", source_root="/c")  # fmt: skip
    capsys.readouterr()
    assert main([*run, str(tmp_path / "mixed.h5")]) == 0
    assert "warning: 2 of the 12 images of --test" in capsys.readouterr().err
    # One image: "1 of the 12 images ... are byte for byte images" read wrong.
    _store(tmp_path / "one.h5", X_test, y_test, FASHION, digests=other[:11] + train[:1],
           source_fingerprint="sha256:one", source_root="/d")  # fmt: skip
    assert main([*run, str(tmp_path / "one.h5")]) == 0
    one = f"{tmp_path / 'one.h5'} is a byte for byte image of {tmp_path / 'train.h5'}"
    assert one in capsys.readouterr().err
    # So too for two list files in one folder (one source root): they were taken as one
    # source, so that an image both list refused the run.
    lists = dict(source_root="/lists", source="list:/lists/train.csv")
    _store(tmp_path / "list_train.h5", X, y, FASHION, digests=train,
           source_fingerprint="sha256:train.csv", **lists)  # fmt: skip
    lists["source"] = "list:/lists/test.csv"
    _store(tmp_path / "list_test.h5", X_test, y_test, FASHION, digests=mixed,
           source_fingerprint="sha256:test.csv", **lists)  # fmt: skip
    argv = [
        str(tmp_path / "list_train.h5"),
        "--no-progress",
        "--test",
        str(tmp_path / "list_test.h5"),
    ]
    assert main(argv) == 0
    assert "warning: 2 of the 12 images of --test" in capsys.readouterr().err
    # But two subsets of one source (its root) that share images are one set taken twice.
    _store(tmp_path / "subset.h5", X_test, y_test, FASHION, digests=mixed,
           source_fingerprint="sha256:subset", source_root="/a")  # fmt: skip
    status, err = _error([*run, str(tmp_path / "subset.h5")], capsys)
    assert status == 2 and "holds 2 of the training images of" in err[-1]


@NEEDS_H5
def test_another_shard_of_the_training_list_is_a_test_set(stores, capsys):
    argv = [str(stores / "shard0.h5"), "--test", str(stores / "shard1.h5"), "--no-progress"]
    assert main(argv) == 0


@NEEDS_H5
def test_shards_named_as_extract_names_them_are_read_without_load_features_warning(
    stores, tmp_path, capsys
):
    # load_features warns of a shard beside its run's other shards; mr2-probe reads shards
    # knowingly (one rank's to train on, another's to test on) and says nothing of it.
    train, test = (
        shutil.copy(stores / f"shard{r}.h5", tmp_path / f"f.shard-{r:05d}-of-00002.h5")
        for r in (0, 1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert main([str(train), "--test", str(test), "--no-progress"]) == 0
    assert "Warning" not in capsys.readouterr().err


@NEEDS_H5
def test_stores_with_array_attributes_are_compared_and_reported(stores, tmp_path):
    # Another tool's store, its attributes arrays: numpy's "truth value of an array is
    # ambiguous" when compared, and a TypeError after every fit when reported.
    import h5py

    paths = [shutil.copy(stores / name, tmp_path / name) for name in ("store.h5", "store_test.h5")]
    for path in paths:
        with h5py.File(path, "r+") as f:
            f.attrs["backbone"] = "vit-b"
            f.attrs["normalize"] = np.array([0.485, 0.456, 0.406])
            f.attrs["source"] = [["train-2019", "a"], ["train-2020", "b"]]
    out = tmp_path / "run"
    assert main([str(paths[0]), "--test", str(paths[1]), "--out", str(out), "--no-progress"]) == 0
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    assert inputs["train"]["provenance"]["normalize"] == [0.485, 0.456, 0.406]
    assert inputs["train"]["provenance"]["source"] == [["train-2019", "a"], ["train-2020", "b"]]


@NEEDS_H5
@pytest.mark.parametrize(
    "reason, said",
    [
        ("cannot identify image file", "cannot identify image file"),
        # A reason of several lines (another tool's store) split the warning's one line.
        ("cannot\nidentify\timage file", "cannot identify image file"),
        # No reason recorded: "(the first, 'item/00003': )".
        ("", "no reason recorded"),
        (" \n", "no reason recorded"),
    ],
)
def test_failed_images_of_a_store_are_named_when_left_out(stores, tmp_path, capsys, reason, said):
    import h5py

    from extract._schema import FAILED

    path = shutil.copy(stores / "store.h5", tmp_path / "failed.h5")
    with h5py.File(path, "r+") as f:
        f["status"][3] = FAILED
        f["failure_reason"][3] = reason.encode()
    X, y, _ = load_xy(str(path))
    assert len(X) == len(y) == 89
    (err,) = capsys.readouterr().err.splitlines()
    assert err.endswith(f"1 image failed extraction and is left out ('item/00003': {said})")


@pytest.fixture
def streaming(monkeypatch):
    """Every store streamed, however small: a store that fits in memory is read into it."""
    import mr2_probe.cli._feature_files as feature_files

    monkeypatch.setattr(feature_files, "in_memory_limit", lambda: 0)


@NEEDS_H5
@pytest.mark.parametrize(
    "options, streamed",
    [
        ([], True),
        (["--test", "store_test.h5"], True),
        (["--Cs", "3", "--cv", "2"], True),
        (["--feature-scaling", "standard"], False),
        (["--grid", "C=0.1,1"], False),
        (["--tilt", "0,1"], False),
    ],
)
def test_a_store_stays_in_its_file_for_the_models_that_stream_it(
    stores, monkeypatch, streaming, options, streamed
):
    # A store larger than memory is read a block at a time by the probes and their --Cs
    # search; a scaler, a --grid search and the front take arrays. The file is closed after.
    seen = _models_inputs(monkeypatch)
    options = [str(stores / o) if o.endswith(".h5") else o for o in options]
    assert main([str(stores / "store.h5"), *options, "--no-progress"]) == 0
    assert len(seen) >= 2 and {is_h5_dataset(X) for X in seen} == {streamed}
    assert not any(getattr(X, "dataset", X).id.valid for X in seen if streamed)


def _models_inputs(monkeypatch) -> list:
    """The X of every fit of the run, as the models get them: the main fits (_main's _fit)
    and the refit of the front's choice (_fitting's)."""
    seen, fit = [], cli_fitting._fit

    def recording(model, X, *args, **kwargs):
        seen.append(X)
        return fit(model, X, *args, **kwargs)

    for module in (cli_main, cli_fitting):
        monkeypatch.setattr(module, "_fit", recording)
    return seen


@NEEDS_H5
@pytest.mark.parametrize("dtype", ["float32", "float16", "int16", "uint8", "bool"])
def test_a_store_that_fits_in_memory_is_read_into_it(dtype, stores, tmp_path, monkeypatch):
    # Streamed, each pass of a fit reads the file again (about three times the fit's time
    # on a 617 MB store): only a store whose features are above the limit in memory is.
    # float16 ones are read as float32: the limit was set on their bytes in the file, half
    # those in memory, so that a float16 store of up to half of memory was read whole.
    # Integers and booleans are counted in float64, as each fit in memory computes them:
    # counted as the file holds them, uint8 ones of up to a quarter of memory were read
    # whole, and each fit's float64 copy took twice memory, where streamed they fit.
    import h5py

    import mr2_probe.cli._feature_files as feature_files

    path = stores / "store.h5"
    if dtype != "float32":
        X, y = _blobs(30, seed=1)  # (store.h5's)
        X = X > 0 if dtype == "bool" else np.round(X * 10).astype(dtype)
        path = _features_file(tmp_path / f"{dtype}.h5", X, y)
    with h5py.File(path, "r") as f:
        # (float16 read as float32, integers computed in float64)
        size = f["features"].size * (4 if np.dtype(dtype).kind == "f" else 8)
    seen = _models_inputs(monkeypatch)
    for limit, streamed in ((None, False), (size, False), (size - 1, True)):
        if limit is not None:
            monkeypatch.setattr(feature_files, "in_memory_limit", lambda limit=limit: limit)
        seen.clear()
        assert main([str(path), "--no-progress"]) == 0
        assert seen and {is_h5_dataset(X) for X in seen} == {streamed}


@NEEDS_H5
@pytest.mark.parametrize("dtype", ["int16", "uint8", "bool", "float32"])
def test_a_streamed_store_is_read_for_non_finite_values_only_where_it_can_hold_them(
    dtype, tmp_path, monkeypatch
):
    # Integers and booleans are finite: the check for NaN and infinity read a streamed
    # store of them whole, a block at a time, before any fit (a store above a quarter of
    # memory in float64). Floating-point ones are still checked.
    import contextlib

    import mr2_probe.cli._feature_files as feature_files

    X, y = _blobs(30, seed=1)
    X = X > 0 if dtype == "bool" else np.round(X * 10).astype(dtype)
    path = _features_file(tmp_path / f"{dtype}.h5", X, y)
    monkeypatch.setattr(feature_files, "in_memory_limit", lambda: 0)
    read, read_h5 = [], feature_files.read_h5

    def counted(*args):
        read.append(args[1])
        return read_h5(*args)

    monkeypatch.setattr(feature_files, "read_h5", counted)
    with contextlib.ExitStack() as stack:
        features = feature_files._load_xy(str(path), stack=stack)[0]
        assert is_h5_dataset(features)
    assert bool(read) == (dtype == "float32")


@NEEDS_H5
def test_a_store_read_into_memory_is_closed_at_once(stores):
    # (It stayed open until the run ended.) One streamed stays open until then.
    import contextlib

    import h5py

    from mr2_probe.cli._feature_files import _load_xy

    def open_files():
        ids = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
        return [os.fsdecode(h5py.h5f.FileID(i).name) for i in ids]

    path = str(stores / "store.h5")
    with contextlib.ExitStack() as stack:
        assert isinstance(_load_xy(path, stack=stack)[0], np.ndarray)
        assert path not in open_files()


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="the machine's memory from sysconf")
@pytest.mark.parametrize(
    "cap, share",
    [("1073741824\n", 1 << 28), ("max\n", None), ("", None), ("9223372036854771712", None)],
)
@pytest.mark.parametrize(
    "version, group",
    [(2, "/"), (1, "/"), (2, "/system.slice/job.service"), (1, "/slurm/uid_1000/job_42")],
)
def test_the_memory_limit_is_a_quarter_of_a_control_group_s_cap(
    tmp_path, monkeypatch, cap, share, version, group
):
    # A batch job or a container capped at 1 GiB on a large machine read up to a quarter of
    # the machine's memory: killed for it. Without a cap, a quarter of the machine's. A
    # group below the root (a batch job's, a systemd service's): the root's file alone was
    # read, and the job's cap went unseen. Its parent's cap binds too.
    import mr2_probe.cli._feature_files as feature_files

    root = tmp_path / "cgroup"
    folder, name = (root, "memory.max") if version == 2 else (root / "memory", "limit_in_bytes")
    name = name if version == 2 else f"memory.{name}"
    mine = folder / group.strip("/")
    mine.mkdir(parents=True)
    (folder / name).write_text("max\n" if version == 2 else "9223372036854771712\n")
    (mine / name).write_text(cap)  # (the root's own, where the group is the root)
    line = f"0::{group}" if version == 2 else f"4:memory:{group}\n0::/"
    (tmp_path / "cgroup.txt").write_text(f"9:name=systemd:/\n{line}\n")
    monkeypatch.setattr(feature_files, "_CGROUP_ROOT", str(root))
    monkeypatch.setattr(feature_files, "_PROC_CGROUP", str(tmp_path / "cgroup.txt"))
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert feature_files.in_memory_limit() == min(share or machine // 4, machine // 4)
    if group != "/":  # a cap above the group's, lower, binds
        (mine.parent / name).write_text(str(1 << 26))
        assert feature_files.in_memory_limit() == 1 << 24


@NEEDS_H5
@pytest.mark.parametrize("held_out", [True, False])
@pytest.mark.slow
def test_a_streamed_store_gives_the_models_and_report_of_its_arrays(
    stores, files, tmp_path, streaming, held_out
):
    # Its failed image left out in both, the held-out part split alike.
    import h5py

    from extract._schema import FAILED

    X, y = _blobs(30, seed=1)
    path = shutil.copy(stores / "store.h5", tmp_path / "failed.h5")
    with h5py.File(path, "r+") as f:
        f["status"][3] = FAILED
    np.savez(tmp_path / "same.npz", X=np.delete(X, 3, axis=0), y=np.delete(y, 3))
    runs = {}
    for name, train, test in (("store", path, "store_test.h5"), ("arrays", "same.npz", "test.npz")):
        test = [] if held_out else ["--test", str(stores / test)]
        out = tmp_path / name
        assert main([str(tmp_path / train), *test, "--out", str(out), "--no-progress"]) == 0
        runs[name] = (
            joblib.load(out / "models.joblib"),
            json.loads((out / "report.json").read_text())["rows"],
        )
    (store_models, store_rows), (models, rows) = runs["store"], runs["arrays"]
    assert store_rows == rows
    for name, model in models.items():
        np.testing.assert_array_equal(store_models[name].coef_, model.coef_)


@NEEDS_H5
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int16", "bool"])
@pytest.mark.parametrize("streamed", [False, True], ids=["read", "streamed"])
def test_a_store_of_integer_features_is_computed_in_float64_as_their_array(
    files, tmp_path, monkeypatch, dtype, streamed
):
    # (A store's features stream in float32; integers were computed so, not as arrays are.)
    # Streamed, a block at a time in float64: the same models and report as the array's.
    import h5py

    import mr2_probe.cli._feature_files as feature_files

    X, y = _blobs(30, seed=1)
    X = X > 0 if dtype == "bool" else np.round(X * 10).astype(dtype)
    with h5py.File(tmp_path / "int.h5", "w") as f:
        f["features"], f["labels"], f["class_names"] = X, y, FASHION
    np.savez(tmp_path / "int.npz", X=X, y=y)
    if streamed:
        monkeypatch.setattr(feature_files, "in_memory_limit", lambda: 0)
    seen = _models_inputs(monkeypatch)
    runs = []
    for name in ("int.h5", "int.npz"):
        out = tmp_path / name.replace(".", "_")
        assert main([str(tmp_path / name), "--out", str(out), "--no-progress"]) == 0
        runs.append(
            (
                {k: m.coef_ for k, m in joblib.load(out / "models.joblib").items()},
                json.loads((out / "report.json").read_text())["rows"],
            )
        )
        if name == "int.h5":
            assert seen and {is_h5_dataset(X) for X in seen} == {streamed}
    (store_coefs, store_rows), (coefs, rows) = runs
    assert store_rows == rows
    for name, coef in coefs.items():
        assert store_coefs[name].dtype == np.float64
        np.testing.assert_array_equal(store_coefs[name], coef)


@NEEDS_H5
@pytest.mark.parametrize("streamed", [False, True])
def test_a_store_whose_features_do_not_decompress_is_named_as_damaged(
    tmp_path, monkeypatch, capsys, streamed
):
    # Read into memory or checked a block at a time, h5py's "Can't synchronously read data
    # (filter returned failure during read)" named no file (as --feature-scaling's did).
    import h5py

    import mr2_probe.cli._feature_files as feature_files

    if streamed:
        monkeypatch.setattr(feature_files, "in_memory_limit", lambda: 0)
    path = tmp_path / "gz.h5"
    X, y = _blobs(30, seed=1)
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X, chunks=(10, 6), compression="gzip")
        f["labels"], f["class_names"] = y, FASHION
        chunk = f["features"].id.get_chunk_info(2)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset : chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
    path.write_bytes(bytes(data))
    line = _refused([str(path)], capsys)
    cause = r"(filter returned failure|inflate\(\) failed)"  # HDF5 ≥ 1.14, HDF5 1.12
    named = rf"{re.escape(repr(str(path)))} .*\(the file is damaged\): .*{cause}"
    assert re.search(named, line), line


@NEEDS_H5
def test_stores_that_differ_in_decoding_only_are_compared(stores, capsys):
    # GPU (tensor) and CPU (PIL) decoding resize slightly differently: the same features.
    argv = [str(stores / "r18.h5"), "--test", str(stores / "r18_tensor.h5"), "--no-progress"]
    assert main(argv) == 0
    assert "MR2" in capsys.readouterr().out


@pytest.mark.slow
@NEEDS_H5
def test_the_report_records_the_inputs_it_was_measured_on(stores, files, tmp_path):
    # report.json held no input path, backbone, weights or per-class sample counts: a
    # per-class result could not be traced to the features it was measured on.
    out = tmp_path / "run"
    argv = [str(stores / "r18.h5"), "--test", str(stores / "r18_tensor.h5"), "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    train, test = inputs["train"], inputs["test"]
    assert train["path"] == str((stores / "r18.h5").resolve())
    assert train["provenance"]["backbone"] == "timm:resnet18"
    assert train["provenance"]["weights"] == "sha256:aa"
    assert test["provenance"]["preprocessing"]["decode"] == "tensor"
    assert train["failed_images_left_out"] == 0
    assert train["samples_per_class"] == dict.fromkeys(FASHION, 30) and train["samples"] == 90
    assert test["samples_per_class"] == dict.fromkeys(FASHION, 10)
    # In class order (Fashion-MNIST's, not alphabetical), as every per-class table lists them.
    assert list(train["samples_per_class"]) == list(test["samples_per_class"]) == list(FASHION)
    # So are the report's classes: they were sorted by name, while class_names.json and the
    # models' predictions (codes) are in code order.
    # Every class is predicted perfectly: the tie is broken in class order, as the front's.
    report = json.loads((out / "report.json").read_text())
    assert report["labels"] == FASHION and report["groups"] == ["easy", "medium", "hard"]
    table = (out / "report.txt").read_text()
    at = [table.index(f"\n{name} ") for name in FASHION]
    assert at == sorted(at)
    main([str(files / "train.npz"), "--out", str(out), "--no-progress"])
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    assert inputs["test"]["held_out_of"] == inputs["train"]["path"]
    assert inputs["test"]["test_size"] == 0.2 and "provenance" not in inputs["train"]
    assert inputs["train"]["samples"] + inputs["test"]["samples"] == len(
        np.load(files / "train.npz")["y"]
    )


@pytest.mark.slow
@NEEDS_H5
def test_feature_files_are_read_by_their_content_whatever_their_names(stores, tmp_path, capsys):
    # mr2-extract writes a store under any name; mr2-probe refused one without .h5 as an
    # "unknown feature file type". Read by content, it is also compared and recorded as one.
    names = {"r18.h5": "r18", "r18_tensor.h5": "r18.test", "store.h5": "s", "train.npz": "t"}
    for source, copy in names.items():
        shutil.copy(stores / source, tmp_path / copy)
    out, run = tmp_path / "run", ["--no-progress", "--out", str(tmp_path / "run")]
    assert main([str(tmp_path / "r18"), "--test", str(tmp_path / "r18.test"), *run]) == 0
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    assert inputs["train"]["provenance"]["backbone"] == "timm:resnet18"
    assert inputs["test"]["provenance"]["preprocessing"]["decode"] == "tensor"
    status, err = _error([str(stores / "store.h5"), "--test", str(tmp_path / "s"), *run], capsys)
    assert status == 2 and "the training images" in err[-1]
    assert main([str(tmp_path / "t"), *run]) == 0  # a .npz by its zip signature


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("--tets", "--test"),
        ("--feature-scale=standard", "--feature-scaling"),
        # argparse: "ambiguous option: --c could match --c-bar, --cv", not naming --C.
        ("--c=0.1", "--C"),
        # An option with its value glued on, no close spelling of it without the dashes.
        ("--C0.1", "--C"),
        # ... whatever its value, a choice or a number, and with a single dash.
        ("--headcosine", "--head"),
        ("--scoringworst_class", "--scoring"),
        ("-C0.1", "--C"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_closest_one(files, capsys, typo, meant):
    # argparse said "unrecognized arguments: --tets ..." and no more.
    status, err = _error([str(files / "train.npz"), typo, str(files / "test.npz")], capsys)
    name = typo.partition("=")[0]
    assert status == 2 and err[-1].endswith(f"; {name}: did you mean {meant}?")


@pytest.mark.parametrize("typo", ["--bogus", "--quiet", "--verbose", "--tol", "headcosine"])
def test_an_unknown_option_like_none_of_ours_is_refused_without_a_suggestion(files, capsys, typo):
    # With the dashes compared too, --bogus and --quiet came within difflib's cutoff of
    # --out ("did you mean --out?"), --verbose of --version, --tol of --tilt. A word
    # without dashes is no option, whatever it starts with (--head takes cosine).
    status, err = _error([str(files / "train.npz"), typo], capsys)
    assert status == 2 and err[-1].endswith(f"unrecognized arguments: {typo}")


@NEEDS_H5
@pytest.mark.parametrize(
    "source, name, labels",
    [
        ("store.h5", "feats.npz", None),  # mr2-extract photos/ BACKBONE feats.npz
        ("store.h5", "feats.npy", None),
        ("train.npz", "train.h5", None),
        ("X.npy", "X.h5", "y.npy"),
    ],
)
def test_a_feature_file_under_another_format_s_suffix_is_read_by_its_content(
    stores, tmp_path, capsys, source, name, labels
):
    # mr2-extract writes its store under the name given; feats.npz was refused as "not a
    # NumPy file", and a .npz named train.h5 as "not an HDF5 file".
    with np.load(stores / "train.npz") as data:
        np.save(tmp_path / "X.npy", data["X"])
        np.save(tmp_path / "y.npy", data["y"])
    shutil.copy(stores / source if source != "X.npy" else tmp_path / source, tmp_path / name)
    given = [] if labels is None else ["--labels", str(tmp_path / labels)]
    assert main([str(tmp_path / name), *given, "--no-progress"]) == 0
    assert "error" not in capsys.readouterr().err


@NEEDS_H5
def test_a_store_with_weights_recorded_by_tag_alone_is_compared_by_tag(tmp_path, capsys):
    # A store extracted before hub weights were hashed was refused beside a newer one as
    # "extracted differently", with the advice to use the same backbone, which it was.
    X, y = _blobs(10, seed=1)
    X_test, y_test = _blobs(4, seed=2)
    made = dict(backbone="timm:resnet50.a1_in1k", normalize=False)
    tag = "tag:resnet50.a1_in1k"
    _store(tmp_path / "old.h5", X, y, FASHION, weights=tag, source_fingerprint="a", **made)
    new = f"{tag} params-sha256:{'0' * 64}"
    _store(
        tmp_path / "new.h5", X_test, y_test, FASHION, weights=new, source_fingerprint="b", **made
    )
    argv = [str(tmp_path / "old.h5"), "--test", str(tmp_path / "new.h5"), "--no-progress"]
    assert main(argv) == 0
    assert "old.h5 records its weights by name alone" in capsys.readouterr().err
    other = f"tag:resnet50.tv_in1k params-sha256:{'0' * 64}"  # another tag: refused
    _store(
        tmp_path / "tv.h5", X_test, y_test, FASHION, weights=other, source_fingerprint="c", **made
    )
    status, err = _error([*argv[:2], str(tmp_path / "tv.h5")], capsys)
    assert status == 2 and "were extracted differently (weights:" in err[-1]


@NEEDS_H5
def test_a_store_that_records_no_backbone_is_said(stores, capsys):
    # A store from another tool (features, labels, class names alone) was compared with
    # an extracted one without a word.
    argv = [str(stores / "r18.h5"), "--test", str(stores / "store_test.h5"), "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "store_test.h5 records no backbone or weights, so whether its features" in err


@NEEDS_H5
def test_saved_models_score_a_store_as_extract_loads_it(stores, tmp_path, capsys):
    from extract import load_features

    out = tmp_path / "run"
    argv = [str(stores / "store.h5"), "--test", str(stores / "store_test.h5"), "--out", str(out)]
    assert main([*argv, "--per-class", "--no-progress"]) == 0
    assert set(os.listdir(out)) == OUTPUTS | {"class_names.json"}
    models = joblib.load(out / "models.joblib")
    report = json.loads((out / "report.json").read_text())
    with load_features(stores / "store_test.h5") as store:  # features stay on disk
        for name, model in models.items():
            # The convention: models learn and predict the store's integer labels.
            accuracy = model.score(store.features, store.labels)
            assert 100 * accuracy == pytest.approx(report["rows"][name]["overall"])
            assert set(model.predict(store.features)) <= {0, 1, 2}
    names = json.loads((out / "class_names.json").read_text(encoding="utf-8"))
    assert names == FASHION
    # The report speaks of the class names, in the order of their codes.
    assert report["labels"] == FASHION and "Ankle boot" in capsys.readouterr().out
    # docs/cli.md's snippet for a store whose classes are coded otherwise (reversed order).
    with load_features(stores / "reversed.h5") as store:
        code = {name: k for k, name in enumerate(names)}
        y = np.array([code[name] for name in store.class_names])[store.labels]
        assert models["ERM"].score(store.features, y) == pytest.approx(
            report["rows"]["ERM"]["overall"] / 100
        )


def test_a_failed_plot_loses_no_fit(files, tmp_path, monkeypatch, capsys):
    """The models are written before the figures; a figure that fails is said in one
    line, and the others are still drawn (a traceback, and every later figure lost)."""
    import mr2_probe.plotting

    def broken(report, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half a figure")
        raise RuntimeError("no figures\ntoday")

    monkeypatch.setattr(mr2_probe.plotting, "plot_class_accuracy", broken)
    out = tmp_path / "run"
    assert main([str(files / "train.npz"), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "mr2-probe: error: class_accuracy.png is left out: no figures today" in err
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
    # A figure is whole or absent: no half-written file, under its name or another.
    assert not [name for name in os.listdir(out) if "class_accuracy" in name]
    assert (out / "groups.png").exists() and (out / "margins.png").exists()
    argv = [str(files / "train.npz"), "--out", str(out), "--no-progress", "--debug"]
    with pytest.raises(RuntimeError, match="no figures"):  # --debug: the traceback
        main(argv)


def test_a_figure_failing_without_a_message_names_its_error(files, tmp_path, monkeypatch, capsys):
    # "groups.png is left out: " said nothing of why.
    import mr2_probe.plotting

    def broken(*args, **kwargs):
        raise AssertionError()

    monkeypatch.setattr(mr2_probe.plotting, "plot_group_accuracy", broken)
    argv = [str(files / "train.npz"), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert "mr2-probe: error: groups.png is left out: AssertionError" in err


def test_a_run_removes_the_files_that_a_killed_run_left_half_written(files, tmp_path):
    # A run killed while writing (SIGKILL, a power cut) leaves its files half written
    # beside their places; those of files that the next run does not write (the front's
    # figure, the CV curve, a store's class names) were left in the folder for good.
    out = tmp_path / "run"
    out.mkdir()
    left = [".front.partial.png", ".class_names.partial.json"]
    left += [".models.partial.joblib", ".report.partial.md"]
    for name in [*left, ".notes.partial.txt", "front.partial.png"]:  # the last two: not its
        (out / name).write_bytes(b"half")
    (out / ".cv_curve.partial.png").mkdir()  # a folder, no run's: its removal failed the run
    assert main([str(files / "train.npz"), "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        OUTPUTS | {".notes.partial.txt", "front.partial.png", ".cv_curve.partial.png"}
    )


@pytest.mark.slow
def test_a_run_that_fails_writing_leaves_the_earlier_outputs_whole(
    files, tmp_path, monkeypatch, capsys
):
    # The outputs were written in place: a full disk truncated models.joblib (the earlier
    # run's models lost) and left reports of the earlier run beside it, or new reports
    # beside the earlier run's figures; the error did not name the file.
    import mr2_probe.plotting

    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_text = Path.write_text

    def full(path, *args, **kwargs):
        if path.name.startswith(".report.partial"):
            raise OSError(errno.EFBIG, "File too large")
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    status, err = _error([*argv, "--C", "0.01"], capsys)
    assert status == 2 and re.search(r"cannot write .*/report\.txt: File too large", err[-1])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no partial files
    monkeypatch.setattr(Path, "write_text", write_text)

    def broken(*args, **kwargs):
        raise RuntimeError("no figures today")

    monkeypatch.setattr(mr2_probe.plotting, "plot_group_accuracy", broken)
    margins = (out / "margins.png").stat().st_mtime_ns
    assert main([*argv, "--C", "0.01"]) == 1
    assert json.loads((out / "command.json").read_text())["C"] == 0.01
    assert (out / "class_accuracy.png").exists()  # written before the broken figure
    assert not (out / "groups.png").exists()  # none of the earlier run's figures is left
    assert (out / "margins.png").stat().st_mtime_ns != margins  # drawn anew after it


@pytest.mark.usefixtures("python_sigint")
@pytest.mark.parametrize(
    "signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_stop_between_two_renames_waits_for_the_last(
    signum, status, files, tmp_path, monkeypatch, capsys
):
    # The files were renamed into place one after another: a Ctrl-C or SIGTERM between
    # two renames left the new command.json beside the earlier run's models and reports.
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--max-iter", "20", "--out", str(out), "--no-progress"]
    out.mkdir()  # an earlier run's files
    (out / "command.json").write_text(json.dumps({"train": argv[0], "out": str(out)}))
    for name in ("models.joblib", "report.txt", "report.md", "report.json", "groups.png"):
        (out / name).write_text("an earlier run's\n")
    earlier = {path.name: path.stat().st_ino for path in out.iterdir()}
    replace, stopped = os.replace, []

    def stopping_after_the_first(source, target):
        replace(source, target)
        if not stopped and Path(target).parent == out:
            # (the command's own SIGTERM handler, not the default that ends pytest)
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            stopped.append(Path(target).name)
            os.kill(os.getpid(), signum)

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (as the command finds it)
    try:
        monkeypatch.setattr(os, "replace", stopping_after_the_first)
        # (run as the command, its arguments from sys.argv: it handles SIGTERM then)
        monkeypatch.setattr(sys, "argv", ["mr2-probe", *argv, "--C", "0.01"])
        with pytest.raises(SystemExit) as stop:
            main()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stop.value.code == status and stopped == ["command.json"]
    assert json.loads((out / "command.json").read_text())["C"] == 0.01
    replaced = ["command.json", "models.joblib", "report.txt", "report.md", "report.json"]
    now = {path.name: path.stat().st_ino for path in out.iterdir()}
    assert set(now) == set(replaced)  # no figure of the earlier run, no partial file
    assert all(now[name] != earlier[name] for name in replaced)  # every one this run's
    assert joblib.load(out / "models.joblib")["ERM"].C == 0.01


@pytest.mark.usefixtures("python_sigint")
def test_held_interrupts_leave_sigterm_s_default_and_others_handlers_alone():
    # SIGTERM is held only where the command raises Terminated on it: its default (a
    # program calling main(argv)) ends the program, and an application's handler is its own.
    from mr2_probe.cli._usage import _interrupts_held

    def own(signum, frame):
        pass

    for handler in (signal.SIG_DFL, own):
        before = signal.signal(signal.SIGTERM, handler)
        try:
            with _interrupts_held():
                inside = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGTERM, before)
        assert inside[0] is handler and inside[1] is not signal.default_int_handler


def test_names_that_are_not_plain_text_are_drawn_and_noted_on_one_line(tmp_path, capsys):
    # A lone surrogate (a file name that was not UTF-8, as os.listdir decodes it) passed
    # every fit, then failed the first figure with matplotlib's TypeError: a traceback and
    # no figure at all. A line break in a class the test set lacks split its note.
    names = np.array(["caf\udce9", "new\nline", "b"])
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    np.savez(tmp_path / "train.npz", X=X, y=names[y])
    np.savez(tmp_path / "test.npz", X=X_test[y_test != 1], y=names[y_test[y_test != 1]])
    out = tmp_path / "run"
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz"), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert {"class_accuracy.png", "groups.png", "margins.png"} <= set(os.listdir(out))
    note = "note: the test set holds no sample of 1 of the 3 training classes (new line)"
    assert any(line.startswith(note) for line in capsys.readouterr().out.splitlines())
    for report in ("report.txt", "report.md"):
        lines = (out / report).read_text(encoding="utf-8").splitlines()
        assert any(line.startswith(note) for line in lines), report


@pytest.mark.parametrize("tested", ["every class", "not 猫犬"])
@pytest.mark.slow
def test_class_names_the_plot_font_lacks_are_said_in_one_line(tmp_path, capsys, tested):
    # matplotlib warned once per character and text drawn, with its source lines:
    # "UserWarning: Glyph 29483 (\\N{CJK UNIFIED IDEOGRAPH-732B}) missing from font(s)".
    # A class that the test set lacks is drawn too (margins.png): it went unnamed.
    matplotlib = pytest.importorskip("matplotlib")
    names = np.array(["\u732b", "dog", "\u732b\u72ac"])  # 猫, dog, 猫犬
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    if tested != "every class":
        X_test, y_test = X_test[y_test != 2], y_test[y_test != 2]
    np.savez(tmp_path / "train.npz", X=X, y=names[y])
    np.savez(tmp_path / "test.npz", X=X_test, y=names[y_test])
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz")]
    with warnings.catch_warnings(record=True) as caught, matplotlib.rc_context():
        warnings.simplefilter("always")
        matplotlib.rcParams["font.family"] = ["DejaVu Sans"]  # (bundled, no CJK glyphs)
        assert main([*argv, "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert not [w for w in caught if "missing from font" in str(w.message)]
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert said == [
        "mr2-probe: warning: the plot font has no glyph for '\u732b', '\u72ac', which show "
        "as boxes in the figures (in 2 class names: '\u732b', '\u732b\u72ac')"
    ]


@NEEDS_H5
def test_a_store_s_class_name_of_no_row_is_not_said_to_be_drawn(tmp_path, capsys):
    # A store's class name that no row has (its images all failed, say) is drawn in no
    # figure: the missing-glyph warning named it among those drawn as boxes.
    import h5py

    matplotlib = pytest.importorskip("matplotlib")
    X, y = _blobs(30, seed=1)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["features"], f["labels"] = X.astype(np.float32), y
        names = ["\u732b", "dog", "cat", "\u732b\u72ac"]  # 猫, ..., 猫犬 of no row
        f["class_names"] = np.array(names, dtype=h5py.string_dtype())
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore")
        matplotlib.rcParams["font.family"] = ["DejaVu Sans"]  # (bundled, no CJK glyphs)
        argv = [str(tmp_path / "train.h5"), "--out", str(tmp_path / "run"), "--no-progress"]
        assert main(argv) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "glyph" in line]
    assert said == [
        "mr2-probe: warning: the plot font has no glyph for '\u732b', which shows as a box "
        "in the figures (in 1 class name: '\u732b')"
    ]


def test_help_explains_options_outputs_and_labels(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for option in ("--test", "--grid", "--scoring", "--c-bar", "--out", "--feature-scaling"):
        assert option in text
    for words in ("--logit-scale", "--debug", "examples:", 'models["ERM"].score(store'):
        assert words in text
    for name in (*OUTPUTS, "front.png", "class_names.json"):
        assert name in text


def test_a_library_s_warning_comes_out_in_one_line_once(tmp_path, capsys, monkeypatch):
    # scikit-learn's "least populated class" warning came out as Python shows warnings (its
    # file and line, then the source line), once for each model's search.
    def show(msg):  # Python's own display of a warning, which pytest records instead
        text = warnings.formatwarning(msg.message, msg.category, msg.filename, msg.lineno)
        sys.stderr.write(text)

    monkeypatch.setattr(warnings, "_showwarnmsg_impl", show)
    X, y = _blobs(20, seed=3)
    keep = (y != 2) | (np.cumsum(y == 2) <= 4)  # a class of 4 samples, 3 for training
    np.savez(tmp_path / "few.npz", X=X[keep], y=y[keep])
    argv = [str(tmp_path / "few.npz"), "--Cs", "3", "--cv", "5", "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "least populated" in line] == [
        "mr2-probe: warning: The least populated class in y has only 3 members, which is less "
        "than n_splits=5."
    ]
    assert not [line for line in err if "warnings.warn(" in line or ".py:" in line]
    # --debug: Python's own form
    main([*argv, "--debug"])
    assert "UserWarning: The least populated class" in capsys.readouterr().err


# The class of five samples, four for training, is fewer than --cv 5's folds on purpose.
@pytest.mark.filterwarnings("ignore:The least populated class in y:UserWarning")
def test_a_search_that_scored_every_value_the_same_says_so_in_a_note(tmp_path, capsys):
    # A class of five samples, drawn as another class: worst-class accuracy 20% at every C,
    # and the search chose the strongest penalty, C = 1e-4, without a word.
    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(0, 1, (30, 4)), rng.normal(3, 1, (30, 4)), rng.normal(0, 1, (5, 4))]
    np.savez(tmp_path / "tie.npz", X=X, y=np.repeat([0, 1, 2], [30, 30, 5]))
    argv = [str(tmp_path / "tie.npz"), "--Cs", "3", "--cv", "5", "--scoring", "worst_class"]
    assert main([*argv, "--test-size", "0.2", "--no-progress"]) == 0
    note = (
        "ERM's search scored every C the same by worst_class (20.00%): it chose the first, "
        "C=0.0001, as LogisticRegressionCV breaks ties; another --scoring may tell them apart"
    )
    assert f"note: {note}" in capsys.readouterr().out.splitlines()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The least populated class in y:UserWarning")
def test_a_grid_that_scored_every_setting_the_same_says_so_in_a_note(tmp_path, capsys):
    # As --Cs's search: ERM's worst-class accuracy 20% at every C, and the grid chose the
    # first setting, the strongest penalty, without a word (MR² scored them apart).
    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(0, 1, (30, 4)), rng.normal(3, 1, (30, 4)), rng.normal(0, 1, (5, 4))]
    np.savez(tmp_path / "tie.npz", X=X, y=np.repeat([0, 1, 2], [30, 30, 5]))
    argv = [str(tmp_path / "tie.npz"), "--cv", "5", "--grid", "C=0.0001,1,100"]
    assert main([*argv, "--test-size", "0.2", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    note = (
        "ERM grid's search scored every setting the same by worst_class (20.00%): it chose "
        "the first, C=0.0001, as GridSearchCV breaks ties; another --scoring may tell them apart"
    )
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {note}"]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["notes"] == [note]


def test_a_name_in_another_case_and_another_unicode_form_is_suggested():
    # Names are matched in NFC: a training class 'Café' of decomposed é (macOS folder
    # names) and a test one 'CAFÉ' of composed É differ in case alone, and were not named.
    from mr2_probe.cli._inputs import _near_names

    decomposed = "Cafe\u0301"
    assert _near_names(["CAF\u00c9"], [decomposed, "Bag"]) == (
        f" (did you mean {decomposed!r} for 'CAF\u00c9'?)"
    )


def test_a_search_with_one_value_scored_notes_no_tie():
    # A value whose fit failed is NaN on the curve: with one other value alone scored, the
    # note said the search "scored every C the same" and "chose the first" (it had failed).
    from mr2_probe import MR2LinearClassifierCV
    from mr2_probe.cli._results import _tie_note

    X, y = load_digits(n_class=3, return_X_y=True)
    search = MR2LinearClassifierCV([1e-320, 1.0], cv=3, device="cpu")
    with pytest.warns(FitFailedWarning):
        search.fit(X.astype(np.float32), y)
    assert _tie_note("MR2", search, Namespace(scoring="accuracy")) == []


def test_overlapping_runs_put_python_s_warning_form_back():
    # Runs in two threads: the first to end put back the form it had found, and the other
    # then the first's one-line form, for good (every later warning of the process in one
    # line, each message once).
    from mr2_probe.cli._usage import warnings_in_one_line

    original = warnings.formatwarning
    first, second = warnings_in_one_line("mr2-probe"), warnings_in_one_line("mr2-extract")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert warnings.formatwarning("x", UserWarning, "a.py", 1) == "mr2-extract: warning: x\n"
    second.__exit__(None, None, None)
    assert warnings.formatwarning is original
    # A form another library sets during a run stays after it; the run's, restored by
    # another after the run, gives the form it replaced (it deadlocked on its lock).
    try:
        with warnings_in_one_line("mr2-probe"):
            ours = warnings.formatwarning
            warnings.formatwarning = str
        assert warnings.formatwarning is str
        warnings.formatwarning = ours
        with warnings_in_one_line("mr2-probe"):
            pass
        shown = []  # (in a thread of its own: a deadlock fails the test, not hangs it)
        thread = threading.Thread(
            target=lambda: shown.append(warnings.formatwarning("x", UserWarning, "a.py", 1)),
            daemon=True,
        )
        thread.start()
        thread.join(10)
        assert shown == [original("x", UserWarning, "a.py", 1)]
    finally:
        warnings.formatwarning = original


def test_the_installed_version_is_the_one_mr2_probe_says():
    # pyproject.toml takes its version from mr2_probe.__version__, which --version prints:
    # two copies of the number could part at a release.
    import importlib.metadata

    import mr2_probe

    try:
        installed = importlib.metadata.version("mr2-probe")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH alone
        pytest.skip("mr2-probe is not installed (pip install -e .)")
    assert installed == mr2_probe.__version__


def test_version_names_the_program_and_its_libraries(capsys):
    # A bug report wants the versions: there was no --version ("the following arguments
    # are required: train").
    import importlib.metadata

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"mr2-probe {importlib.metadata.version('mr2-probe')} (Python ")
    assert f"torch {importlib.metadata.version('torch')}" in line and "scikit-learn" in line


def test_version_of_a_checkout_not_installed_is_its_own(capsys, monkeypatch):
    # Run from a source checkout (PYTHONPATH), not installed: "mr2-probe not installed",
    # or an installed release's version where another is installed beside the checkout.
    import importlib.metadata

    import mr2_probe

    def version(name):
        if name == "mr2-probe":
            raise importlib.metadata.PackageNotFoundError(name)
        return "1.0"

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith(f"mr2-probe {mr2_probe.__version__} (Python ")


@pytest.mark.parametrize("scaling", ["l2", "standard"])
def test_float16_features_are_scaled_in_float32(tmp_path, capsys, scaling):
    # Normalizer computed float16 row norms, which overflow past 256: every such row was
    # zeroed, and the probes scored 28.75% where float32 features scored 93.75%.
    # StandardScaler scales in the features' dtype: a test row 1e5 standard deviations
    # out of a column's range overflows float16 (65504), where float32 holds it.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 500)
    X = rng.normal(size=(500, 64)) * 40 + np.eye(4, 64)[y] * 120
    X[:, 5] = 1 + rng.normal(size=500) * 0.01
    X[450, 5] = 1000  # (a --test row)
    train, test = tmp_path / "train.npz", tmp_path / "test.npz"
    tables = []
    for dtype in (np.float16, np.float32):
        np.savez(train, X=X[:400].astype(dtype), y=y[:400])
        np.savez(test, X=X[400:].astype(dtype), y=y[400:])
        argv = [str(train), "--test", str(test), "--feature-scaling", scaling]
        assert main([*argv, "--no-progress"]) == 0
        tables.append(capsys.readouterr().out.splitlines()[2:4])
    assert tables[0] == tables[1] and float(tables[0][0].split()[1]) > 90


@pytest.mark.parametrize("options", [[], ["--tilt", "0.5"]], ids=["main", "front"])
@pytest.mark.parametrize("scaled", ["train", "test"])
def test_l2_scales_float32_rows_whose_norm_overflows_float32(tmp_path, capsys, scaled, options):
    # Normalizer computed float32 row norms, which overflow past about 1e19: every such
    # row was zeroed, and the probes fitted on zeros (training rows) or predicted them
    # (test rows), without a word. Times 2**70 (1e21, exact), the rows scale to the same
    # bits as before: the runs print the same tables, the front's too.
    X, y = _blobs(20, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz")]
    argv += ["--feature-scaling", "l2", *options, "--no-progress"]
    tables = []
    for factor in (1, 2**70):
        large = {"train": X, "test": X_test}[scaled] * np.float32(factor)
        np.savez(tmp_path / "train.npz", X=large if scaled == "train" else X, y=y)
        np.savez(tmp_path / "test.npz", X=large if scaled == "test" else X_test, y=y_test)
        assert main(argv) == 0
        tables.append(capsys.readouterr().out)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.square(large).sum(axis=1)).any()  # (every row's norm)
    assert tables[0] == tables[1]
    assert float(tables[0].splitlines()[2].split()[1]) > 90


def test_l2_scaling_leaves_no_row_unscaled():
    # The rows Normalizer scaled wrong: zeroed (an overflowing norm), or left as they were
    # (a norm below ten times float32's epsilon, taken for zero); a row Normalizer scales
    # right is scaled to the same bits.
    from sklearn.preprocessing import Normalizer

    from mr2_probe.cli._options import _SCALERS

    X = np.array([[1e20, -1e20, 0], [3e-7, 4e-7, 0], [1, 2, 3], [0, 0, 0]], np.float32)
    scaled = _SCALERS["l2"]().fit_transform(X)
    assert scaled.dtype == np.float32
    norms = np.linalg.norm(X.astype(np.float64), axis=1)  # (4,)
    np.testing.assert_allclose(scaled[:3], X[:3] / norms[:3, None], rtol=1e-6)
    np.testing.assert_array_equal(scaled[2:], Normalizer().fit_transform(X[2:]))
    np.testing.assert_array_equal(_SCALERS["l2"]().fit_transform([[3, 4]]), [[0.6, 0.8]])


def test_boolean_features_are_fitted_as_the_estimator_fits_them(tmp_path, capsys):
    # Binary attributes saved as booleans were refused as not "real numbers", where
    # MR2LinearClassifier (and scikit-learn) fit them as 0 and 1.
    X, y = _blobs(20, seed=1)
    tables = []
    for features in (X > 0, (X > 0).astype(np.float32)):
        np.savez(tmp_path / "f.npz", X=features, y=y)
        assert main([str(tmp_path / "f.npz"), "--no-progress"]) == 0
        tables.append(capsys.readouterr().out.splitlines()[2:4])
    assert tables[0] == tables[1]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_float_labels_of_any_precision_are_read_as_integers_without_a_warning(tmp_path, dtype):
    # float16 labels printed NumPy's "RuntimeWarning: overflow encountered in cast" with
    # its source line, from the check against 2**53.
    X, y = _blobs(10, seed=1)
    np.savez(tmp_path / "f.npz", X=X, y=y.astype(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, labels, _ = load_xy(str(tmp_path / "f.npz"))
    assert labels.dtype == np.int64 and (labels == y).all()


def test_bytes_labels_are_read_as_text(files, tmp_path, capsys):
    # scikit-learn refuses bytes labels: a traceback, exit status 1, after "fitting ERM".
    data = np.load(files / "names.npz")
    np.savez(tmp_path / "bytes.npz", X=data["X"], y=data["y"].astype("S"))
    out = tmp_path / "run"
    assert main([str(tmp_path / "bytes.npz"), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["labels"]) == sorted(FASHION)


@pytest.mark.slow
# loky's note where its reused workers (of an earlier test's pool) time out as this one
# starts: a third party's, about its pool, not about the run (it comes and goes).
@pytest.mark.filterwarnings("ignore:A worker stopped while some jobs were given:UserWarning")
def test_a_grid_search_in_worker_processes_counts_its_short_fits(files, capsys):
    # With --n-jobs the fits ran in worker processes, which printed every warning raw; the
    # summary counted the refit alone.
    argv = [str(files / "train.npz"), "--grid", "C=0.1,1", "--cv", "2", "--max-iter", "1"]
    main([*argv, "--n-jobs", "2", "--no-progress"])
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if "ConvergenceWarning" in line]
    said = [line for line in err if line.startswith("mr2-probe: warning:")]
    assert len(said) == 2 and all("5 of its 5 fits stopped short of tol" in s for s in said)
    # and the solver's own reason, the refit's, which ran in this process
    assert all(
        "(the refit's: lbfgs did not converge in 1 iterations (--max-iter 1)" in s for s in said
    )


def test_the_front_s_short_fits_are_one_warning_line(files, capsys):
    # The front's gathered warning went out as a raw ConvergenceWarning and source line.
    main([str(files / "train.npz"), "--tilt", "1", "--max-iter", "1", "--no-progress"])
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if "ConvergenceWarning" in line or "accuracy_front" in line]
    assert any(line.startswith("mr2-probe: warning: front: The front's fits") for line in err)


def test_the_front_s_warning_gives_the_estimator_s_advice_in_the_cli_s_terms(files, capsys):
    # A tilt too steep to resolve: the front's line said "Raise --max-iter, or scale the
    # features", which does not help; the estimator's own advice names the tilt.
    main([str(files / "train.npz"), "--tilt", "1e30", "--no-progress"])
    err = capsys.readouterr().err.splitlines()
    (line,) = [line for line in err if line.startswith("mr2-probe: warning: front:")]
    assert "tilt=1e+30: lbfgs" in line and "--tilt 1e+30 (the tilt multiplies" in line
    assert "class_tilt" not in line and "Raise --max-iter" not in line


@pytest.mark.slow
def test_the_chosen_tilt_s_refit_warns_in_the_cli_s_terms_too(tmp_path, capsys):
    # The rule chose a steep tilt; its refit's warning named class_tilt where the front's
    # own line named --tilt. (Its refit converges in float32 too: 30 iterations leave it short.)
    rng = np.random.RandomState(0)
    X = np.concatenate([rng.randn(k, 5) + 0.6 * c for c, k in enumerate([200, 60, 20])])
    np.savez(tmp_path / "train.npz", X=X.astype(np.float32), y=np.repeat([0, 1, 2], [200, 60, 20]))
    argv = ["--tilt", "200", "--front-bound", "99", "--val-size", "0.3", "--no-progress"]
    argv += ["--max-iter", "30"]
    main([str(tmp_path / "train.npz"), *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()
    (line,) = [line for line in err if line.startswith("mr2-probe: warning: chosen: tilt=200")]
    assert "--tilt 200 makes the objective" in line and "class_tilt" not in line


@pytest.mark.parametrize("debug", [False, True])
def test_a_grid_search_with_a_failed_fit_still_reports(files, capsys, debug):
    # A failed fit scores NaN in every column, the count of short fits too: the run ended
    # in "cannot convert float NaN to integer". Each failed setting is one line with its
    # error: scikit-learn's FitFailedWarning held every failure's traceback, on one line
    # cut at 1,000 characters before any error was named, then a line per scorer of its
    # NaN scores; --debug shows them still.
    argv = [str(files / "train.npz"), "--grid", "solver=sgd", "--grid", "learning_rate=0.003,1000"]
    argv += ["--lam", "0.5", "--feature-scaling", "standard", "--cv", "2", "--max-iter", "5"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--no-progress", *(["--debug"] if debug else [])]) == 0
    out, err = capsys.readouterr()
    assert "best parameters by worst_class (2-fold CV): {'learning_rate': 0.003" in out
    failed = [line for line in err.splitlines() if "failed in" in line]
    assert [line.split(":")[2] for line in failed] == [" ERM grid", " MR2 grid"]
    for line in failed:
        assert "learning_rate=1000, solver=sgd failed in 2 of its 2 folds, left out of the " in line
        assert "(scored NaN there): Cannot fit: the sgd solver diverged" in line
        assert line.endswith("errors; --debug shows the tracebacks)")  # (each fold's own)
    nan = "test scores are non-finite"
    sklearn_s = [w for w in caught if w.category is FitFailedWarning or nan in str(w.message)]
    assert bool(sklearn_s) == debug
    assert sum(w.category is FitFailedWarning for w in sklearn_s) == (2 if debug else 0)


def test_debug_shows_the_failed_fits_tracebacks_under_python_w_ignore(files, capsys):
    # Each failed setting's line says "--debug shows the tracebacks": under python -W ignore
    # the filters hid scikit-learn's FitFailedWarning, --debug or not.
    argv = [str(files / "train.npz"), "--grid", "solver=sgd", "--grid", "learning_rate=0.003,1000"]
    argv += ["--lam", "0.5", "--feature-scaling", "standard", "--cv", "2", "--max-iter", "5"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        assert main([*argv, "--no-progress", "--debug"]) == 0
    failed = [line for line in capsys.readouterr().err.splitlines() if "failed in" in line]
    assert len(failed) == 2 and all("--debug shows the tracebacks" in line for line in failed)
    shown = [str(w.message) for w in caught if w.category is FitFailedWarning]
    assert len(shown) == 2 and all("Traceback" in text for text in shown)
    assert not [w for w in caught if w.category is not FitFailedWarning]  # (the rest ignored)


def test_a_search_whose_every_fit_failed_ends_though_a_warning_was_held(tmp_path, capsys):
    # A warning held while the search ran (a class of fewer rows than folds), every fit
    # failing: its warnings were shown inside the block that held them, each held again
    # as it was shown, and the run never ended, its memory growing.
    y = np.repeat([0, 1, 2], [40, 40, 5])
    X = np.random.default_rng(0).normal(size=(len(y), 4)) + y[:, None]
    np.savez(tmp_path / "few.npz", X=X, y=y)
    argv = [str(tmp_path / "few.npz"), "--grid", "solver=sgd", "--grid", "learning_rate=1000"]
    argv += ["--lam", "0.5", "--feature-scaling", "standard", "--cv", "5", "--max-iter", "5"]
    with fails_after_waiting(10, "the search's held warnings were shown for ever"):
        with pytest.warns(UserWarning, match="least populated class in y has only 4 members"):
            code, lines = _error([*argv, "--no-progress"], capsys)
    assert code == 2
    assert "every fit of its search failed (5 fits), the first as: Cannot fit:" in lines[-1]


def test_a_search_ending_in_another_error_shows_the_warnings_it_held(files, monkeypatch):
    # A refit's RuntimeError (out of memory on all the rows), a Ctrl-C: the warnings held
    # while the search ran were dropped.
    from sklearn.model_selection import GridSearchCV

    def fit(self, X, y=None, **params):
        warnings.warn("held while the search ran", UserWarning, stacklevel=2)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(GridSearchCV, "fit", fit)
    argv = [str(files / "train.npz"), "--grid", "C=0.5,1", "--cv", "2", "--no-progress"]
    with pytest.warns(UserWarning, match="held while the search ran"):
        with pytest.raises(SystemExit) as stop:  # (out of memory: one line, status 1)
            main(argv)
    assert stop.value.code == 1


def test_a_failed_setting_s_line_names_the_error_a_chained_traceback_ends_in(files, capsys):
    # A traceback can name torch's error first and the fit's last (L-BFGS's overflow,
    # torch's RuntimeError raised again as the estimator's): the line names the fit's.
    argv = [str(files / "train.npz"), "--grid", "class_tilt=0,1e300", "--cv", "2"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main([*argv, "--max-iter", "20", "--no-progress"]) == 0
    failed = [line for line in capsys.readouterr().err.splitlines() if "failed in" in line]
    assert len(failed) == 1 and "MR2 grid: class_tilt=1e+300 failed in 2 of its 2" in failed[0]
    assert "(scored NaN there): Cannot fit: " in failed[0]
    assert "with --tilt 1e+300" in failed[0] or "with class_tilt=1e+300" in failed[0]
    assert "cannot be converted" not in failed[0]


def test_a_front_names_each_tilt_as_given(files, tmp_path, capsys):
    # --tilt 1.23456789 drew a point named "tilt=1.23457" (its 6 digits in %g), which
    # typed back is another tilt; 1e-320 is a subnormal float, held to a few bits.
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--tilt", "1e-320,1.23456789,5", "--offsets", "0.7"]
    assert main([*argv, "--max-iter", "20", "--out", str(out), "--no-progress"]) in (0, 1)
    names = ["tilt=1e-320", "tilt=1.23456789", "tilt=5", "offsets≤0.7pt"]
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert all(name in rows for name in names)
    points = json.loads((out / "report.json").read_text())["front"]["points"]
    assert [p["name"] for p in points][-4:] == names


def test_a_front_that_failed_names_its_tilt_as_the_option(files, capsys):
    # The front's error named the estimator's class_tilt=1e+300, which mr2-probe has no
    # option of, where its warnings say --tilt.
    argv = [str(files / "train.npz"), "--tilt", "1e300", "--max-iter", "20", "--no-progress"]
    assert main(argv) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "front failed" in line]
    assert "with --tilt 1e+300 (" in line and "class_tilt" not in line


@pytest.mark.parametrize("action", ["always", "ignore"])
def test_a_failed_setting_s_line_names_no_other_setting_s_error(files, capsys, action):
    # Two settings diverging, each fold of its own error: scikit-learn's warning does not
    # say which error is whose, and each line named the first one, so learning_rate=1000's
    # line advised on "times learning_rate=500". Warnings ignored (python -W ignore), the
    # lines named no error: the errors are read from scikit-learn's warning.
    grid = ["--grid", "solver=sgd", "--grid", "learning_rate=0.003,500,1000"]
    argv = [str(files / "train.npz"), *grid, "--lam", "0.5", "--feature-scaling", "standard"]
    argv += ["--cv", "2", "--max-iter", "5"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        assert main([*argv, "--no-progress"]) == 0
    assert not [w for w in caught if w.category is FitFailedWarning]  # (said in its lines)
    err = capsys.readouterr().err.splitlines()
    failed = [line for line in err if "failed in" in line]
    assert len(failed) == 4  # (ERM's and MR2's)
    # Of the fits that ran (learning_rate=0.003's 2 folds and the refit), every one stopped
    # at --max-iter 5: "3 of its 7" counted the 4 failed ones among them.
    short = [line for line in err if "stopped short of tol" in line]
    assert len(short) == 2 and all("3 of its 3 fits stopped short" in line for line in short)
    for line in failed:
        own = line.split("failed in")[0].split(": ")[-1]
        assert own in ("learning_rate=500, solver=sgd ", "learning_rate=1000, solver=sgd ")
        if own.startswith("learning_rate=500"):
            assert "diverged" in line and "times learning_rate=500," in line
        else:
            assert "diverged" not in line and "learning_rate=500" not in line
            assert "(which of the search's 4 errors are its, scikit-learn does not say;" in line


def test_ctrl_c_while_the_figures_are_drawn_keeps_the_models_and_reports(
    files, tmp_path, monkeypatch, capsys
):
    # --help said that Ctrl-C outside the front wrote nothing: the models and reports are
    # written before the figures, which are drawn one by one.
    import mr2_probe.plotting

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mr2_probe.plotting, "plot_group_accuracy", interrupted)
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--max-iter", "20", "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 130
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
    assert (out / "report.json").exists() and (out / "class_accuracy.png").exists()
    assert not (out / "groups.png").exists() and not (out / "margins.png").exists()
    assert "before\n  the models and reports are written, nothing is; while the figures" in (
        _parser().format_help()
    )


@pytest.mark.parametrize("options", [[], ["--Cs", "3"]])
def test_a_fit_that_cannot_run_gives_its_advice_in_the_command_s_options(
    files, tmp_path, capsys, options
):
    # Features too large for float32's class statistics: the error advised StandardScaler,
    # no option of the command, where a grid search's failed fits said --feature-scaling.
    X, y = load_xy(str(files / "train.npz"))[:2]
    np.savez(tmp_path / "large.npz", X=X * 1e30, y=y)
    code, lines = _error([str(tmp_path / "large.npz"), *options, "--no-progress"], capsys)
    assert code == 2 and lines[0].startswith("fitting ERM on ")
    assert lines[-1].startswith("mr2-probe: error: Cannot fit: the class statistics") and (
        "Scale them (--feature-scaling standard, or divide X by a constant)" in lines[-1]
    )


def test_a_failed_front_gives_its_advice_in_the_command_s_options(files, monkeypatch, capsys):
    # The front's error was said in the estimator's words: class_tilt, max_iter and
    # StandardScaler where the command has --tilt, --max-iter and --feature-scaling.
    import mr2_probe.front

    def failing(*args, **kwargs):
        raise ValueError(
            "Cannot fit at class_tilt=50. Increase max_iter or scale the features (e.g. "
            "StandardScaler)."
        )

    monkeypatch.setattr(mr2_probe.front, "accuracy_front", failing)
    argv = [str(files / "train.npz"), "--tilt", "0,50", "--max-iter", "20", "--no-progress"]
    assert main(argv) == 1
    assert (
        "mr2-probe: error: the front failed and is left out: Cannot fit at --tilt 50. Raise "
        "--max-iter, or scale the features (--feature-scaling standard)."
    ) in capsys.readouterr().err.splitlines()


def test_a_failed_refit_of_the_front_s_choice_says_its_advice_once(files, monkeypatch, capsys):
    # The refit's error, put in the command's options where it was fitted, was put so again
    # by the front's error line: "Use a smaller --grid --grid learning_rate".
    import mr2_probe.front

    front, fit = mr2_probe.front.accuracy_front, cli_fitting.fit_collecting_short

    def choosing_a_tilt(*args, **kwargs):
        drawn = front(*args, **kwargs)
        drawn.chosen = next(p.name for p in drawn.points if p.lever == "tilt")
        return drawn

    def diverging_third(model, X, y):  # ERM, MR2, then the choice's refit
        fits.append(model)
        if len(fits) == 3:
            raise ValueError("Cannot fit: the sgd solver diverged. Use a smaller learning_rate.")
        return fit(model, X, y)

    fits = []
    monkeypatch.setattr(mr2_probe.front, "accuracy_front", choosing_a_tilt)
    monkeypatch.setattr(cli_fitting, "fit_collecting_short", diverging_third)
    argv = [str(files / "train.npz"), "--tilt", "0,1", "--max-iter", "20", "--no-progress"]
    assert main(argv) == 1 and len(fits) == 3
    assert (
        "mr2-probe: error: the front failed and is left out: Cannot fit: the sgd solver "
        "diverged. Use a smaller --grid learning_rate."
    ) in capsys.readouterr().err.splitlines()


_FRONT_STOPS = {
    # A front fit that failed (L-BFGS's step overflowing at --tilt 1e300) ended the run
    # with status 2 and nothing written: the main models' fits were lost.
    "failed": (
        ValueError("Cannot fit: L-BFGS's step overflows in float32 arithmetic"),
        1,
        "the front failed and is left out: Cannot fit",
    ),
    # Ctrl-C during the front (its tilt sweep can take many fits) ended the run with
    # "interrupted" and nothing written.
    "interrupted": (KeyboardInterrupt(), 130, "the front was interrupted and is left out"),
    # A front that ran out of memory (torch's RuntimeError, or MemoryError) ended the run
    # with a traceback and nothing written.
    "out of memory": (
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        1,
        "the front failed and is left out: RuntimeError: CUDA out of memory. Tried to",
    ),
    "no memory": (MemoryError(), 1, "the front failed and is left out: MemoryError"),
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", _FRONT_STOPS)
def test_a_stopped_front_loses_no_fitted_model(stop, files, tmp_path, monkeypatch, capsys):
    import mr2_probe.front

    error, status, message = _FRONT_STOPS[stop]

    def stopping(*args, **kwargs):
        raise error

    monkeypatch.setattr(mr2_probe.front, "accuracy_front", stopping)
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--tilt", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == status
    captured = capsys.readouterr()
    assert f"mr2-probe: error: {message}" in captured.err
    assert "overall" in captured.out and "front" not in captured.out.split("note:")[0]
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
    report = json.loads((out / "report.json").read_text())
    assert "front" not in report and any(message in n for n in report["notes"])
    assert not (out / "front.png").exists()
    with pytest.raises(type(error)):
        main([*argv, "--debug"])


_MAIN_FIT_OOM = {
    # Out of memory in MR²'s fit, after ERM's: a traceback, status 1, and ERM lost unsaid.
    "device": (
        RuntimeError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 1.2 GiB is free. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ),
        "MR2 ran out of the device memory in its fit (CUDA out of memory. Tried to allocate "
        "2.00 GiB); nothing is written (ERM, fitted before it, neither). Try --device cpu "
        "(the machine's memory; slower)",
    ),
    "machine": (
        MemoryError("Unable to allocate 3.00 GiB for an array"),
        "MR2 ran out of memory in its fit (Unable to allocate 3.00 GiB for an array); nothing "
        "is written (ERM, fitted before it, neither). Try freeing memory, or a machine with "
        "more",
    ),
}


@pytest.mark.parametrize("kind", _MAIN_FIT_OOM)
def test_a_main_fit_out_of_memory_ends_in_one_line_with_advice(
    kind, files, tmp_path, monkeypatch, capsys
):
    import mr2_probe._device

    error, message = _MAIN_FIT_OOM[kind]
    fit, fits = cli_fitting.fit_collecting_short, []

    def failing_second(model, X, y):  # ERM fits, MR2 runs out of memory
        fits.append(model)
        if len(fits) == 2:
            raise error
        return fit(model, X, y)

    monkeypatch.setattr(cli_fitting, "fit_collecting_short", failing_second)
    # (a GPU where the error is the device's: --device cpu is the advice)
    monkeypatch.setattr(
        mr2_probe._device, "resolve_device", lambda device: types.SimpleNamespace(type="cuda")
    )
    out = tmp_path / "runs" / "probe"
    argv = [str(files / "train.npz"), "--max-iter", "20", "--out", str(out), "--no-progress"]
    code, lines = _error(argv, capsys)
    assert code == 1 and lines[-1] == f"mr2-probe: error: {message}"
    assert not (tmp_path / "runs").exists()  # nothing written, no folder left
    fits.clear()
    with pytest.raises(type(error)):
        main([*argv, "--debug"])


_WHOLE = ["--feature-scaling", "standard", "--tilt", "1"]  # (the run then reads stores whole)
_STREAMS = (
    "(a store's features above a quarter of memory then stay in its file, read a block at a time)"
)
# (integers whose float64 size puts them above it)
_INTEGERS_STREAM = _STREAMS.replace("memory then", "memory, integers in float64, then")
# (mr2-extract makes stores of images: the cure for arrays names what makes one of them)
_ANY_STORE = (
    "(a store's features above a quarter of memory then stay in its file, read a block at a "
    "time; h5py writes one: datasets 'features' (n, d), 'labels' (n,) of codes 0..K-1 and "
    "'class_names' (K,))"
)
_NO_LESS = (
    "; no option of the command reads them in less. Try freeing memory, or a machine with more"
)
_SMALL = "{train}: 2.1 KiB (a quarter of memory: 1.0 GiB)" + _NO_LESS


@pytest.mark.parametrize(
    "name, options, limit, said",
    [
        # Inputs within a quarter of memory are read whole whatever the options: leaving
        # --feature-scaling and --tilt out was the advice, which read them whole all the same.
        ("train.npz", [], 1 << 30, _SMALL),
        ("train.npz", _WHOLE, 1 << 30, _SMALL),
        pytest.param(
            "store.h5", _WHOLE, 1 << 30, _SMALL,
            marks=NEEDS_H5,
        ),
        # Large ones: a store stays in its file without the options that read it whole...
        pytest.param(
            "store.h5", _WHOLE, 1000, "{train}: 2.1 KiB (a quarter of memory: 1000 B). Try "
            f"without --feature-scaling standard, --tilt {_STREAMS}, or freeing memory, or a "
            "machine with more",
            marks=NEEDS_H5,
        ),
        # ...and is not read without them (what was read was not its features)...
        pytest.param("store.h5", [], 1000, None, marks=NEEDS_H5),
        # ...where a .npz is read whole, and a store in its place would not be.
        (
            "train.npz", [], 1000, "{train}: 2.1 KiB (a quarter of memory: 1000 B). Try an "
            f"HDF5 store in place of {{train}} {_ANY_STORE}, or freeing memory, or a machine "
            "with more",
        ),
        (
            "train.npz", _WHOLE, 1000, "{train}: 2.1 KiB (a quarter of memory: 1000 B). Try an "
            "HDF5 store in place of {train}, without --feature-scaling standard, --tilt "
            f"{_ANY_STORE}, or freeing memory, or a machine with more",
        ),
    ],
    ids=[
        "small-npz", "small-npz-whole", "small-store-whole", "large-store-whole",
        "large-store-streamed", "large-npz", "large-npz-whole",
    ],
)  # fmt: skip
def test_inputs_out_of_memory_end_in_one_line(
    name, options, limit, said, files, stores, tmp_path, monkeypatch, capsys
):
    # Memory that ran out reading the inputs ended in a traceback, where a fit's ends in one
    # line. The line says what the features read take, and advises what reads them in less
    # where something does: store.h5's and train.npz's 90 × 6 float32 (2,160 bytes).
    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    monkeypatch.setattr(cli_main, "_inputs", failing)
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: limit)
    out = tmp_path / "runs" / "probe"
    train = str(files / name)
    argv = [train, *options, "--out", str(out), "--no-progress"]
    code, lines = _error(argv, capsys)
    read = "Try freeing memory, or a machine with more"
    if said is not None:
        read = f"The features read into memory: {said.format(train=train)}"
    assert code == 1 and lines == [
        "mr2-probe: error: reading the inputs ran out of memory (Unable to allocate 30.0 GiB "
        f"for an array); nothing is written. {read}"
    ]
    assert not (tmp_path / "runs").exists()
    with pytest.raises(MemoryError):
        main([*argv, "--debug"])


@NEEDS_H5
def test_the_cure_for_arrays_out_of_memory_can_be_followed(files, tmp_path, monkeypatch, capsys):
    # The line advised "an HDF5 store from mr2-extract in place of" a .npz, which
    # mr2-extract (a reader of images) cannot make of arrays. It names the datasets that
    # make one; written with h5py, the run streams them.
    import h5py

    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 1000)
    with monkeypatch.context() as patched:
        patched.setattr(cli_main, "_inputs", failing)
        (line,) = _error([str(files / "train.npz"), "--no-progress"], capsys)[1]
    named = re.search(r"h5py writes one: datasets (.*)\)", line)
    assert named, line
    with np.load(files / "train.npz") as data:
        X, y = data["X"], data["y"]
    arrays = {"features": X, "labels": y, "class_names": np.unique(y).astype(str).astype(object)}
    store = tmp_path / "train.h5"
    with h5py.File(store, "w") as f:
        for name in re.findall(r"'(\w+)'", named[1]):
            f.create_dataset(name, data=arrays[name])
    seen = _models_inputs(monkeypatch)
    assert main([str(store), "--no-progress"]) == 0
    assert seen and all(is_h5_dataset(X) for X in seen)


@NEEDS_H5
@pytest.mark.parametrize("name", ["int.h5", "int.npz"], ids=["store", "npz"])
@pytest.mark.parametrize("options", [[], ["--grid", "C=1,2"]], ids=["plain", "grid"])
@pytest.mark.parametrize(
    "dtype, limit, said",
    [
        # 1,080 bytes, above a limit of 1,000, and 4,320 in float64.
        (np.int16, 1000, "1.1 KiB (4.2 KiB in float64)"),
        # 540 bytes, within it, and 4,320 in float64, above it: a store of them was read
        # whole, each fit's float64 copy eight times its size; a .npz of them was told
        # float32 features in a store, not a store of the integers, which streams too.
        (np.uint8, 1000, "540 B (4.2 KiB in float64)"),
        # 4,320 bytes, above a limit of 3,000, and 2,160 as float32, within it: float32
        # features are read whole, in half the memory, from any file. The line said that
        # a store's float32 features above a quarter of memory "then stay in its file".
        (np.int64, 3000, "4.2 KiB (2.1 KiB as float32)"),
    ],
    ids=["int16", "uint8", "int64"],
)
def test_the_cure_for_integers_out_of_memory_can_be_followed(
    name, options, dtype, limit, said, tmp_path, monkeypatch, capsys
):
    # Integer features are counted in float64, as each fit in memory computes them: a
    # store of them above the limit so stays in its file where the run streams (then none
    # are read, and the line has no cure to give), and the line of those read says their
    # float64 size and cures them as floats: a store in place of a .npz, the run without
    # the options that read a store whole.
    from mr2_probe.cli._feature_files import _features_sizes

    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    X, y = _blobs(30, seed=1)  # 90 × 6
    X = np.round(np.abs(X) * 10).astype(dtype)
    train = _features_file(tmp_path / name, X, y)
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: limit)
    with monkeypatch.context() as patched:
        patched.setattr(cli_main, "_inputs", failing)
        (line,) = _error([str(train), *options, "--no-progress"], capsys)[1]
    seen = _models_inputs(monkeypatch)
    assert main([str(train), *options, "--no-progress"]) == 0
    streamed = name == "int.h5" and not options
    assert seen and {is_h5_dataset(X) for X in seen} == {streamed}  # (as said)
    if streamed:  # (none read)
        assert line.endswith("nothing is written. Try freeing memory, or a machine with more")
        return
    cures = ([f"an HDF5 store in place of {train}"] if name == "int.npz" else []) + (
        ["without --grid"] if options else []
    )
    made = _ANY_STORE[_ANY_STORE.index(";") : -1] if name == "int.npz" else ""
    halved = dtype == np.int64
    quarter = "2.9 KiB" if halved else "1000 B"
    streams = _STREAMS if halved else _INTEGERS_STREAM  # (64-bit: held in float64 size)
    halves = (
        f", or float32 features in place of {train} (in any file: read whole, in half the "
        "memory of 64-bit integers, within a quarter of memory)"
    )
    assert line.endswith(
        f"The features read into memory: {train}: {said} (a quarter of memory: {quarter}). "
        f"Try {', '.join(cures)} {streams[:-1]}{made}){halves if halved else ''}, or freeing "
        "memory, or a machine with more"
    ), line
    seen.clear()
    store = _features_file(tmp_path / "cured.h5", X, y)  # (followed: the same integers)
    assert main([str(store), "--no-progress"]) == 0
    assert seen and all(is_h5_dataset(X) for X in seen)
    if halved:  # (followed: float32 features, read whole in half the memory)
        floats = _features_file(tmp_path / "floats.npz", X.astype(np.float32), y)
        argv = [str(floats), "--no-progress"]
        assert _features_sizes(_parser().parse_args(argv))[1][0].held == X.nbytes // 2
        seen.clear()
        assert main(argv) == 0
        assert seen and not any(is_h5_dataset(X) for X in seen)  # (read whole, as said)


@NEEDS_H5
@pytest.mark.parametrize("limit, streamed", [(1500, False), (1199, True)])
def test_inputs_out_of_memory_say_what_the_run_did_with_a_store_of_failed_rows(
    tmp_path, monkeypatch, capsys, limit, streamed
):
    # A store of 90 rows, 40 failed: 50 × 6 float32 read (1,200 bytes), 2,160 in all. The
    # run's choice to stream it and the line count the same rows, its completed ones (one
    # helper): the line says it read where the run read it, and leaves it out where the
    # run streamed it.
    X, y = _blobs(30, seed=1)
    path = str(_store(tmp_path / "failed.h5", X, y, FASHION, failed=range(40)))
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: limit)
    seen = _models_inputs(monkeypatch)
    assert main([path, "--no-progress"]) == 0
    assert seen and {is_h5_dataset(X) for X in seen} == {streamed}

    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    monkeypatch.setattr(cli_main, "_inputs", failing)
    capsys.readouterr()
    (line,) = _error([path, "--no-progress"], capsys)[1]
    read = f"The features read into memory: {path}: 1.2 KiB (a quarter of memory: 1.5 KiB)"
    assert line.endswith(
        "nothing is written. Try freeing memory, or a machine with more"
        if streamed
        else f"nothing is written. {read}{_NO_LESS}"
    )


@NEEDS_H5
def test_inputs_out_of_memory_end_in_one_line_where_their_sizes_cannot_be_told(
    files, stores, tmp_path, monkeypatch, capsys
):
    # The line's sizes opened each store again with load_features, which reads every row's
    # path (hundreds of MiB for millions of rows): memory that ran out there, where it had
    # just run out, ended in a traceback. A size untold is left out of the line, and so is
    # the claim that no option reads the features in less.
    import h5py

    def failing(*args, **kwargs):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    monkeypatch.setattr(cli_main, "_inputs", failing)
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 1 << 30)
    monkeypatch.setattr(h5py, "File", failing)
    train = str(files / "store.h5")
    code, lines = _error([train, *_WHOLE, "--no-progress"], capsys)
    assert code == 1 and lines == [
        "mr2-probe: error: reading the inputs ran out of memory (Unable to allocate 30.0 GiB "
        f"for an array); nothing is written. The features read into memory: {train} (a "
        "quarter of memory: 1.0 GiB). Try freeing memory, or a machine with more"
    ]


@pytest.mark.parametrize(
    "name", ["train.npz", pytest.param("train.h5", marks=NEEDS_H5)], ids=["npz", "store"]
)
@pytest.mark.parametrize(
    "dtype, said",
    [
        # Read as float32: the file's 1,080 bytes take 2,160 in memory, which the line
        # gave as 1.1 KiB...
        (np.float16, "2.1 KiB (1.1 KiB of float16 in the file)"),
        # ...where integers are held as the file holds them (the fits compute in float64).
        (np.int16, "1.1 KiB"),
    ],
    ids=["float16", "int16"],
)
def test_inputs_out_of_memory_say_the_size_of_the_features_in_memory(
    name, dtype, said, tmp_path, monkeypatch, capsys
):
    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    X, y = _blobs(30, seed=1)  # 90 × 6
    train = _features_file(tmp_path / name, np.round(X * 10).astype(dtype), y)
    monkeypatch.setattr(cli_main, "_inputs", failing)
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 1 << 30)
    code, lines = _error([str(train), "--no-progress"], capsys)
    assert code == 1 and lines == [
        "mr2-probe: error: reading the inputs ran out of memory (Unable to allocate 30.0 GiB "
        f"for an array); nothing is written. The features read into memory: {train}: {said} "
        f"(a quarter of memory: 1.0 GiB){_NO_LESS}"
    ]


def test_float16_inputs_out_of_memory_are_set_against_the_limit_as_float32(
    tmp_path, monkeypatch, capsys
):
    # float16 features of 1,080 bytes take 2,160 in memory, above a limit of 1,500: the
    # line set the limit on the file's bytes and said "2.1 KiB (...) (a quarter of memory:
    # 1.5 KiB); no option of the command reads them in less", where a store streams them.
    def failing(args, stack=None):
        raise MemoryError("Unable to allocate 30.0 GiB for an array")

    X, y = _blobs(30, seed=1)  # 90 × 6
    train = tmp_path / "train.npz"
    np.savez(train, X=X.astype(np.float16), y=y)
    monkeypatch.setattr(cli_main, "_inputs", failing)
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 1500)
    code, lines = _error([str(train), "--no-progress"], capsys)
    assert code == 1 and lines == [
        "mr2-probe: error: reading the inputs ran out of memory (Unable to allocate 30.0 GiB "
        f"for an array); nothing is written. The features read into memory: {train}: 2.1 KiB "
        "(1.1 KiB of float16 in the file) (a quarter of memory: 1.5 KiB). Try an HDF5 store "
        f"in place of {train} {_ANY_STORE}, or freeing memory, or a machine with more"
    ]


@pytest.mark.parametrize("kind", _MAIN_FIT_OOM)
@pytest.mark.parametrize("given_out", [True, False], ids=["out", "no_out"])
def test_predictions_out_of_memory_end_in_one_line_and_keep_the_models(
    kind, given_out, files, tmp_path, monkeypatch, capsys
):
    # Out of memory predicting the test set, after the fits, ended in a traceback and
    # lost the fitted models, where a main fit's ends in one line.
    import mr2_probe._device

    error = _MAIN_FIT_OOM[kind][0]
    said = "the device memory" if kind == "device" else "memory"

    def failing(self, X):
        raise error

    monkeypatch.setattr(MR2LinearClassifier, "predict", failing)
    monkeypatch.setattr(
        mr2_probe._device, "resolve_device", lambda device: types.SimpleNamespace(type="cuda")
    )
    out = tmp_path / "run"
    out.mkdir()
    # An earlier run's files, of other models (its command.json marks them as a run's)
    (out / "command.json").write_text(json.dumps({"train": "old.npz", "out": str(out)}))
    for name in ("report.json", "groups.png"):
        (out / name).write_text("{}")
    argv = [str(files / "train.npz"), "--max-iter", "20", "--no-progress"]
    argv += ["--out", str(out)] if given_out else []
    code, lines = _error(argv, capsys)
    what = {
        "device": "CUDA out of memory. Tried to allocate 2.00 GiB",
        "machine": "Unable to allocate 3.00 GiB for an array",
    }[kind]
    kept = (
        f"the fitted models are written to {out / 'models.joblib'}, the reports are not"
        if given_out
        else "nothing is written (no --out)"
    )
    advice = "--device cpu (the machine's memory; slower)" if kind == "device" else "freeing memory"
    assert code == 1 and lines[-1] == (
        f"mr2-probe: error: ERM ran out of {said} in its predictions after the fits ({what}); "
        f"{kept}. Try {advice}, or a machine with more"
    )
    assert not any(line.startswith("Traceback") for line in lines)
    if given_out:
        assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
        assert json.loads((out / "command.json").read_text())["train"] != "old.npz"
        assert not (out / "report.json").exists() and not (out / "groups.png").exists()
    with pytest.raises(type(error)):
        main([*argv, "--debug"])


@pytest.mark.parametrize(
    "name, dtype, limit",
    [
        ("int.npz", np.uint8, 1000),
        # (4,320 bytes in float64: within the limit, read whole)
        pytest.param("int.h5", np.int16, 4320, marks=NEEDS_H5),
    ],
    ids=["uint8-npz", "int16-store"],
)
def test_a_main_fit_of_integers_out_of_memory_says_their_float64_copy_and_its_cure(
    name, dtype, limit, tmp_path, monkeypatch, capsys
):
    # Integer features are held as the file holds them and computed in float64 by each
    # fit (eight times uint8's bytes): a fit out of memory on them said "Try freeing
    # memory", naming neither the copy nor float32 features, which are computed as they
    # are. A store of the integers above a quarter of memory in float64 stays in its file,
    # no copy of them all: the line named a store of float32 features in place of a .npz,
    # above the limit as float32 (where the integers' store streams as well), and said it
    # of a store read whole, within the limit in float64 (as float32 too).
    X, y = _blobs(30, seed=1)  # 90 × 6, 72 rows fitted (--test-size 0.2)
    train = str(_features_file(tmp_path / name, np.round(np.abs(X) * 10).astype(dtype), y))
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: limit)

    def failing(model, X, y):
        raise MemoryError("Unable to allocate 3.38 KiB for an array")

    with monkeypatch.context() as patched:
        patched.setattr(cli_fitting, "fit_collecting_short", failing)
        code, lines = _error([train, "--no-progress"], capsys)
    held = {np.uint8: "432 B", np.int16: "864 B"}[dtype]
    store = ""
    if name == "int.npz":  # (all 90 rows: 4,320 bytes in float64)
        store = (
            f", or an HDF5 store in place of {train} (its integers, 4.2 KiB in float64, above a "
            "quarter of memory (1000 B), then stay in its file, read a block at a time: no "
            f"float64 copy of them all{_ANY_STORE[_ANY_STORE.index(';') : -1]})"
        )
    assert code == 1 and lines[-1] == (
        "mr2-probe: error: ERM ran out of memory in its fit (Unable to allocate 3.38 KiB for an "
        f"array); nothing is written. Each fit computes the {np.dtype(dtype)} features of "
        f"{train} in float64, a copy of 3.4 KiB ({held} as read). Try float32 features in "
        f"place of {train} (computed as they are, in 1.7 KiB){store}, or freeing memory, or a "
        "machine with more"
    )
    # As said: the integers fitted in float64, float32 features in float32, and a store of
    # the integers in place of the .npz streamed.
    seen = _models_inputs(monkeypatch)
    assert main([train, "--out", str(tmp_path / "int"), "--no-progress"]) == 0
    assert seen and not any(is_h5_dataset(X) for X in seen)
    assert joblib.load(tmp_path / "int" / "models.joblib")["ERM"].coef_.dtype == np.float64
    floats = _features_file(tmp_path / "floats.npz", X, y)
    assert main([str(floats), "--out", str(tmp_path / "floats"), "--no-progress"]) == 0
    assert joblib.load(tmp_path / "floats" / "models.joblib")["ERM"].coef_.dtype == np.float32
    if store and importlib.util.find_spec("h5py") is not None:  # (stores need it)
        seen.clear()
        integers = np.round(np.abs(X) * 10).astype(dtype)
        assert main([str(_features_file(tmp_path / "int.h5", integers, y)), "--no-progress"]) == 0
        assert seen and all(is_h5_dataset(X) for X in seen)


@NEEDS_H5
@pytest.mark.parametrize("dtype", [np.int16, np.bool_])
def test_a_main_fit_of_a_streamed_store_of_integers_out_of_memory_says_no_float64_copy(
    dtype, tmp_path, monkeypatch, capsys
):
    # A store of integers above a quarter of memory stays in its file, as floats do, each
    # block computed in float64: no fit holds a float64 copy of them all, and the line
    # says none, nor float32 features in their place.
    X, y = _blobs(30, seed=1)  # 90 × 6
    train = str(_features_file(tmp_path / "int.h5", (np.abs(X) * 10).astype(dtype), y))
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 0)
    seen = []

    def failing(model, X, y):
        seen.append(X)
        raise MemoryError("Unable to allocate 3.38 KiB for an array")

    monkeypatch.setattr(cli_fitting, "fit_collecting_short", failing)
    code, lines = _error([train, "--no-progress"], capsys)
    assert seen and all(is_h5_dataset(X) for X in seen)
    assert code == 1 and lines[-1] == (
        "mr2-probe: error: ERM ran out of memory in its fit (Unable to allocate 3.38 KiB for an "
        "array); nothing is written. Try freeing memory, or a machine with more"
    )


@pytest.mark.parametrize("kind", _MAIN_FIT_OOM)
def test_a_front_of_integers_out_of_memory_says_their_float64_copy_and_its_cure(
    kind, tmp_path, monkeypatch, capsys
):
    # A front (--tilt) whose fits ran out of memory on integer features said "the front
    # failed and is left out: MemoryError: ..." alone, where a main fit's line says the
    # float64 copy each fit computes and float32 features, which are computed as they are.
    import mr2_probe._device
    import mr2_probe.front

    error = _MAIN_FIT_OOM[kind][0]
    X, y = _blobs(30, seed=1)  # 90 × 6, 72 rows fitted (--test-size 0.2)
    train = str(_features_file(tmp_path / "int.npz", np.round(np.abs(X) * 10).astype(np.uint8), y))

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(mr2_probe.front, "accuracy_front", failing)
    if kind == "device":
        monkeypatch.setattr(
            mr2_probe._device, "resolve_device", lambda device: types.SimpleNamespace(type="cuda")
        )
    assert main([train, "--tilt", "1", "--no-progress"]) == 1
    why, advice = {
        "device": (
            f"RuntimeError: {error}",
            "--device cpu (the machine's memory; slower), or float32 features in place of "
            f"{train} (computed as they are, in 1.7 KiB)",
        ),
        "machine": (
            f"MemoryError: {error}",
            f"float32 features in place of {train} (computed as they are, in 1.7 KiB), or "
            "freeing memory, or a machine with more",
        ),
    }[kind]
    assert (
        f"mr2-probe: error: the front failed and is left out: {why}. Each fit computes the "
        f"uint8 features of {train} in float64, a copy of 3.4 KiB (432 B as read). Try {advice}"
    ) in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("held_out", [False, True], ids=["test", "held_out"])
def test_predictions_of_integers_out_of_memory_say_their_float64_copy(
    held_out, files, tmp_path, monkeypatch, capsys
):
    # The predictions compute integer rows in float64 too (a copy of 1.4 KiB for 30 × 6
    # int16 rows of 360 B): the line said "Try freeing memory" alone.
    X, y = _blobs(10, seed=2)  # 30 × 6
    path = _features_file(tmp_path / "int.npz", np.round(np.abs(X) * 10).astype(np.int16), y)
    argv = [str(path)] if held_out else [str(files / "train.npz"), "--test", str(path)]
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 1 << 30)
    computed = []

    def failing(self, X):  # (after the check that makes the copy, as predict's)
        computed.append(self._validate_predict_data(X).dtype)
        raise MemoryError("Unable to allocate 1.41 KiB for an array")

    monkeypatch.setattr(MR2LinearClassifier, "predict", failing)
    code, lines = _error([*argv, "--no-progress"], capsys)
    rows, copy, read, as_float32 = ("held-out ", "288 B", "72 B", "144 B") if held_out else (
        "", "1.4 KiB", "360 B", "720 B"
    )  # fmt: skip
    assert computed == [np.float64]
    assert code == 1 and lines[-1] == (
        "mr2-probe: error: ERM ran out of memory in its predictions after the fits (Unable to "
        "allocate 1.41 KiB for an array); nothing is written (no --out). The predictions "
        f"compute the {rows}int16 features of {path} in float64, a copy of {copy} ({read} as "
        f"read). Try float32 features in place of {path} (computed as they are, in "
        f"{as_float32}), or freeing memory, or a machine with more"
    )


@NEEDS_H5
@pytest.mark.parametrize("where", ["fit", "predictions"])
def test_integers_held_out_of_a_file_above_the_limit_are_told_a_store_streams(
    where, tmp_path, monkeypatch, capsys
):
    # A store streams by the size of all its rows, not of the part that --test-size gives
    # the fits (72 of 90 rows) or the predictions (18): 4320 B in float64, above a limit
    # of 4000 B, where the parts (3456 B, 864 B) are within it. The line left out that a
    # store in the file's place stays in its file.
    X, y = _blobs(30, seed=1)  # 90 × 6
    X = np.round(np.abs(X) * 10).astype(np.uint8)
    train = str(_features_file(tmp_path / "int.npz", X, y))
    monkeypatch.setattr("mr2_probe.cli._feature_files.in_memory_limit", lambda: 4000)

    def failing(*args):
        raise MemoryError("Unable to allocate 3.38 KiB for an array")

    with monkeypatch.context() as patched:
        if where == "fit":
            patched.setattr(cli_fitting, "fit_collecting_short", failing)
        else:
            patched.setattr(MR2LinearClassifier, "predict", failing)
        code, lines = _error([train, "--no-progress"], capsys)
    stays = (
        f"an HDF5 store in place of {train} (its integers, 4.2 KiB in float64, above a quarter "
        "of memory (3.9 KiB), then stay in its file"
    )
    assert code == 1 and stays in lines[-1]
    # As said: a store of the same rows streams at that limit.
    seen = _models_inputs(monkeypatch)
    store = _features_file(tmp_path / "int.h5", X, y)
    assert main([str(store), "--out", str(tmp_path / "int"), "--no-progress"]) == 0
    assert seen and all(is_h5_dataset(X) for X in seen)


def test_a_main_fit_out_of_memory_names_the_options_of_its_search(files, monkeypatch, capsys):
    import mr2_probe._device

    def failing(model, X, y):
        raise RuntimeError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(cli_fitting, "fit_collecting_short", failing)
    monkeypatch.setattr(
        mr2_probe._device, "resolve_device", lambda device: types.SimpleNamespace(type="cuda")
    )
    argv = [str(files / "train.npz"), "--Cs", "3", "--n-jobs", "2", "--no-progress"]
    code, lines = _error(argv, capsys)
    assert code == 1 and lines[-1].startswith("mr2-probe: error: ERM ran out of the device")
    assert lines[-1].endswith(
        "nothing is written. Try --device cpu (the machine's memory; slower), or fewer --cv "
        "folds (--Cs solves them together on a GPU), or fewer --n-jobs (each parallel fit "
        "holds its own memory)"
    )


@pytest.mark.parametrize(
    "error, said",
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB"), "the device memory"),
        (MemoryError("Unable to allocate 3.00 GiB for an array"), "memory"),
    ],
)
def test_a_grid_search_out_of_memory_in_every_fold_is_said_as_memory(
    error, said, files, monkeypatch, capsys
):
    # Every fold of a --grid search out of memory: "every fit of its search failed", status
    # 2, a mistake in the options, where a fit out of memory says which options take less.
    import mr2_probe._device

    def failing(self, X, y, **params):
        raise error

    monkeypatch.setattr(MR2LinearClassifier, "fit", failing)
    monkeypatch.setattr(
        mr2_probe._device, "resolve_device", lambda device: types.SimpleNamespace(type="cuda")
    )
    argv = [str(files / "train.npz"), "--grid", "C=0.5,1", "--cv", "2", "--no-progress"]
    code, lines = _error(argv, capsys)
    assert code == 1 and lines[-1] == (
        f"mr2-probe: error: ERM grid ran out of {said} in its fit ({error}); nothing is "
        "written. Try "
        + ("--device cpu (the machine's memory; slower)" if "device" in said else "freeing "
           "memory, or a machine with more")
    )  # fmt: skip


def test_a_main_fit_s_other_runtime_error_is_not_said_as_memory(files, monkeypatch):
    def failing(model, X, y):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_fitting, "fit_collecting_short", failing)
    with pytest.raises(RuntimeError, match="a bug"):
        main([str(files / "train.npz"), "--no-progress"])


_TERMINATED = """
import os, signal, sys, time
import mr2_probe.cli._fitting as cli_fitting
import mr2_probe.front
from mr2_probe.cli import main

# SIGTERM's own disposition, whatever the test run inherited (a run under `trap '' TERM`
# ignores it, and its child ran its fit for 30 s, unstopped, and failed)
signal.signal(signal.SIGTERM, signal.SIG_DFL)

def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # (the signal's handler raises here)
    raise AssertionError("not stopped")

if sys.argv[1] == "front":
    mr2_probe.front.accuracy_front = terminated
else:  # the first fit, once --out is created
    cli_fitting.fit_collecting_short = terminated
sys.argv[1:] = sys.argv[2:]  # (run as the command: main() reads sys.argv)
sys.exit(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["front", "fit"])
def test_sigterm_stops_a_run_as_ctrl_c_does(files, tmp_path, when):
    # SIGTERM (kill, timeout, a batch job's time limit) ended the process at once: a front
    # stopped so lost the models fitted before it, and a run stopped before it wrote left
    # the --out folder it had created.
    out = tmp_path / "runs" / "probe"
    argv = [str(files / "train.npz"), "--tilt", "1", "--max-iter", "20", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-c", _TERMINATED, when, *argv, "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 143, run.stderr
    if when == "fit":
        assert run.stderr.splitlines()[-1] == "mr2-probe: terminated"
        assert not (tmp_path / "runs").exists()
        return
    message = "the front was terminated and is left out"
    assert f"mr2-probe: error: {message}" in run.stderr.splitlines()
    assert set(joblib.load(out / "models.joblib")) == {"ERM", "MR2"}
    assert message in json.loads((out / "report.json").read_text())["notes"]


def test_main_called_with_argv_leaves_sigterm_to_end_its_program(files, monkeypatch):
    # A program that calls main(argv) (a sweep over options, say) survived a SIGTERM: main
    # returned 143, or raised SystemExit(143), which such a sweep may catch, and it went on.
    before, seen, fit = signal.getsignal(signal.SIGTERM), [], cli_fitting.fit_collecting_short

    def recording(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        return fit(*args, **kwargs)

    monkeypatch.setattr(cli_fitting, "fit_collecting_short", recording)
    main([str(files / "train.npz"), "--max-iter", "20", "--no-progress"])
    assert seen and all(handler is before for handler in seen)


def test_a_figure_failing_after_an_interrupted_front_keeps_status_130(files, tmp_path, monkeypatch):
    # Ctrl-C's status outranks a missing figure's 1.
    import mr2_probe.front
    import mr2_probe.plotting

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def broken(*args, **kwargs):
        raise RuntimeError("no figures today")

    monkeypatch.setattr(mr2_probe.front, "accuracy_front", interrupted)
    monkeypatch.setattr(mr2_probe.plotting, "plot_group_accuracy", broken)
    argv = [str(files / "train.npz"), "--tilt", "1", "--out", str(tmp_path / "run")]
    assert main([*argv, "--no-progress"]) == 130


def test_a_bound_that_reads_as_a_fraction_is_warned_of(files, capsys):
    # --front-bound 0.005 (the Python API's bound=0.005) ran silently at 0.005 points.
    argv = [str(files / "train.npz"), "--tilt", "1", "--offsets", "0,0.01,1"]
    assert main([*argv, "--front-bound", "0.005", "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "is in points" in line]
    assert said == [
        "mr2-probe: warning: --front-bound is in points of overall accuracy: 0.005 is 0.005 pt; "
        "the fraction 0.005, as the Python API takes it, is --front-bound 0.5",
        "mr2-probe: warning: --offsets is in points of overall accuracy: 0.01 is 0.01 pt; "
        "the fraction 0.01, as the Python API takes it, is --offsets 1",
    ]


def test_a_bound_that_reads_as_a_fraction_is_warned_of_as_given(capsys):
    # In %g's 6 digits it read "0.0123457 is 0.0123457 pt", another bound typed back.
    _checked(["train.npz", "--tilt", "1", "--front-bound", "0.0123456789"])
    said = [line for line in capsys.readouterr().err.splitlines() if "is in points" in line]
    assert said == [
        "mr2-probe: warning: --front-bound is in points of overall accuracy: 0.0123456789 is "
        "0.0123456789 pt; the fraction 0.0123456789, as the Python API takes it, is "
        "--front-bound 1.23457"
    ]


@pytest.mark.slow
def test_saved_models_refit_without_progress_bars(files, tmp_path, capsys):
    # The run's progress bars (no --no-progress) were saved with the models: verbose=1.
    out = tmp_path / "run"
    assert main([str(files / "train.npz"), "--offsets", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    models = joblib.load(out / "models.joblib")
    assert {"ERM", "MR2"} < set(models)  # and the front's choice
    X, y = np.load(files / "train.npz")["X"], np.load(files / "train.npz")["y"]
    for model in models.values():
        assert all(v == 0 for k, v in model.get_params().items() if k.endswith("verbose"))
        clone(model).fit(X, y)
    assert capsys.readouterr().err == ""


@NEEDS_H5
@pytest.mark.slow
def test_written_reports_keep_their_sections_text_and_figures(tmp_path, monkeypatch):
    import mr2_probe.plotting as plotting

    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    names = ["café", "Trouser", "Ankle boot ≤ 1"]  # names beyond ASCII
    _store(tmp_path / "train.h5", X, y, names)
    _store(tmp_path / "test.h5", X_test, y_test, names)
    seen = {}
    for name in ("plot_margins", "plot_cv_curve"):
        real = getattr(plotting, name)

        def spy(*args, real=real, name=name, **kwargs):
            seen[name] = (args, kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(plotting, name, spy)
    out = tmp_path / "run"
    argv = [str(tmp_path / "train.h5"), "--test", str(tmp_path / "test.h5"), "--out", str(out)]
    options = ["--Cs", "3", "--cv", "2", "--feature-scaling", "standard", "--tilt", "1"]
    assert main([*argv, *options, "--no-progress"]) == 0
    # cv_curve.png of a search inside a Pipeline (the features scaled), by the run's scorer.
    assert {"cv_curve.png", "front.png"} <= set(os.listdir(out))
    assert seen["plot_cv_curve"][1]["scoring"] == "worst_class"
    # margins.png: the MR² model's margins, its classes by name.
    (classifier, _), kwargs = seen["plot_margins"]
    assert classifier.c_bar == 1.0 and kwargs["class_names"] == names
    text, markdown = (out / "report.txt").read_text(), (out / "report.md").read_text()
    # Sections apart: the tables, the search's curve (fenced in Markdown), the front.
    assert "\n\nERM: chose C=" in text and "|\n\n```text\nERM: chose C=" in markdown
    front = [line for line in markdown.split("\n\n") if "| tilt=1 |" in line]
    assert front and front[0].startswith("| ")
    # Text as it is written, not escaped, and every text file ends its last line.
    assert "café" in (out / "report.json").read_text(encoding="utf-8")
    assert "café" in (out / "class_names.json").read_text(encoding="utf-8")
    for name in ("report.txt", "report.md", "report.json", "class_names.json", "command.json"):
        assert (out / name).read_text(encoding="utf-8").endswith("\n"), name
    # A run without the front into the same folder takes the earlier front's figure away.
    assert main([*argv, "--no-progress"]) == 0
    assert not {"cv_curve.png", "front.png"} & set(os.listdir(out))


def test_a_grid_search_s_short_fits_are_one_line_not_warnings(files, capsys):
    argv = [str(files / "train.npz"), "--grid", "C=0.1,1", "--cv", "2", "--max-iter", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--no-progress"]) == 0
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(said) == 2 and all("5 of its 5 fits stopped short of tol" in s for s in said)


def test_one_line_messages_are_cut_at_their_limit():
    from mr2_probe.cli._usage import _one_line

    assert _one_line("a\n  b\tc") == "a b c"
    cut = _one_line("x" * 2000)
    assert len(cut) == 1000 and cut.endswith("x…")
    assert _one_line("x" * 1000) == "x" * 1000


@pytest.mark.parametrize(
    "y, cv, advice",
    [
        # Small classes only warn (some folds lack them): the largest class bounds --cv.
        ([0, 1, 1, 1, 2, 2, 2], 4, "no class has more than 3 samples: use at most 3 folds"),
        ([0, 1, 2], 2, "no class has 2 samples, which cross-validation needs"),
    ],
)
def test_too_many_folds_say_how_many_the_classes_allow(tmp_path, capsys, y, cv, advice):
    X = np.random.default_rng(0).normal(size=(len(y), 3))
    for name in ("d.npz", "t.npz"):
        np.savez(tmp_path / name, X=X, y=np.array(y))
    argv = [str(tmp_path / "d.npz"), "--test", str(tmp_path / "t.npz"), "--grid", "C=0.1,1"]
    code, lines = _error([*argv, "--cv", str(cv), "--no-progress"], capsys)
    assert code == 2 and lines[0].endswith(advice), lines


def test_a_test_set_without_a_training_class_is_said_in_a_note(tmp_path, capsys):
    # Every score was over the classes the test set holds, without a word; with --tilt the
    # front's own warning about it came out as a raw Python warning.
    X, y = _blobs(30, seed=1)
    X_test, y_test = _blobs(10, seed=2)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    np.savez(tmp_path / "test.npz", X=X_test[y_test != 2], y=y_test[y_test != 2])
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz"), "--tilt", "1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    note = "the test set holds no sample of 1 of the 3 training classes (2): every score is over"
    assert f"note: {note}" in out and "Warning" not in err
    assert json.loads((tmp_path / "run" / "report.json").read_text())["notes"][0].startswith(note)


@pytest.mark.parametrize(
    "held, shown",
    [(3, "(3, 4, 5, 6, 7)"), (2, "(2, 3, 4, 5, 6, ...)")],
)
def test_a_note_of_untested_classes_names_five_and_marks_more(tmp_path, capsys, held, shown):
    # The note names up to five of the classes the test set lacks; "..." only where
    # there are more.
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(8), 6)
    X = np.eye(8)[y] * 4 + rng.normal(size=(len(y), 8))
    np.savez(tmp_path / "train.npz", X=X, y=y)
    np.savez(tmp_path / "test.npz", X=X[y < held], y=y[y < held])
    main([str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz"), "--no-progress"])
    training_classes = f"of {8 - held} of the 8 training classes {shown}:"
    assert training_classes in capsys.readouterr().out


def test_a_parameter_that_some_models_of_the_grid_read_is_searched(files, capsys):
    # tau is the compactness loss's: read where lam > 0, so searched beside lam=0,0.5.
    argv = [str(files / "train.npz"), "--grid", "lam=0,0.5", "--grid", "tau=1,2", "--cv", "2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main([*argv, "--max-iter", "2", "--no-progress"]) == 0
    assert "MR2 grid: best parameters" in capsys.readouterr().out


@pytest.mark.parametrize("shape", [(1, 90), (90, 2), (90, 1, 1)])
def test_labels_of_two_dimensions_are_refused(files, tmp_path, capsys, shape):
    # Labels of more than one per row, or of another layout, are no 1-D class vector:
    # they must be refused by name, not fitted as whatever scikit-learn makes of them.
    y = np.load(files / "y.npy")
    np.save(tmp_path / "y_2d.npy", np.repeat(y, np.prod(shape) // len(y)).reshape(shape))
    line = _refused([str(files / "X.npy"), "--labels", str(tmp_path / "y_2d.npy")], capsys)
    assert f"must be a 1-D array; got shape {shape}" in line


@pytest.mark.slow
def test_labels_saved_as_a_column_are_read_with_a_warning(files, tmp_path, capsys):
    # A column (n, 1), as a DataFrame's y[["label"]] gives: one label per row, which
    # scikit-learn's estimators (MR2LinearClassifier's too) read with a warning
    # (DataConversionWarning); mr2-probe refused it as labels of two dimensions.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    np.save(tmp_path / "y_column.npy", y[:, None])
    np.savez(tmp_path / "test.npz", X=X[::3], y=np.array(FASHION)[y[::3, None]])
    np.savez(tmp_path / "train.npz", X=X, y=np.array(FASHION)[y])
    out = tmp_path / "out"
    argv = [str(files / "X.npy"), "--labels", str(tmp_path / "y_column.npy")]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "y_column.npy are a column of shape (90, 1), read as one label per row; " in err
    assert json.loads((out / "report.json").read_text())["inputs"]["train"]["samples"] == 72
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz")]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    assert "the labels of " + str(tmp_path / "test.npz") in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["labels"] == sorted(FASHION)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX's")
@pytest.mark.parametrize(
    "argv, named",
    [
        (["{t}/fifo.npz"], "'{t}/fifo.npz'"),
        (["{t}/fifo"], "'{t}/fifo'"),
        (["{d}/X.npy", "--labels", "{t}/fifo.npy"], "--labels '{t}/fifo.npy'"),
        (["{d}/train.npz", "--test", "{t}/fifo.npz"], "'{t}/fifo.npz'"),
    ],
)
def test_a_pipe_is_refused_rather_than_waited_on(files, tmp_path, capsys, argv, named):
    # A FIFO (or a pipe, <(cat features.npz)) named as an input: its open waited for a
    # writer for ever; a pipe with one was read in part, then called "not a NumPy file".
    for name in ("fifo.npz", "fifo", "fifo.npy"):
        os.mkfifo(tmp_path / name)

    with fails_after_waiting(10, "mr2-probe waited for a writer to the FIFO"):
        line = _refused([a.format(t=tmp_path, d=files) for a in argv], capsys)
    assert line.endswith(
        f"{named.format(t=tmp_path)} is not a regular file (a pipe, a FIFO, a device or a "
        "socket), which mr2-probe cannot read: save it to a file first"
    )


def test_a_file_of_no_samples_is_refused(tmp_path, capsys):
    # An empty file (no rows) must be said to hold no samples, in one line, rather than
    # fail further on with an index error and a traceback.
    np.savez(tmp_path / "empty.npz", X=np.zeros((0, 4), np.float32), y=np.zeros(0, int))
    line = _refused([str(tmp_path / "empty.npz")], capsys)
    assert line.endswith("empty.npz holds no samples")
    # Rows of no columns failed inside the first fit, after "fitting ERM on 60 × 0 features".
    np.savez(tmp_path / "narrow.npz", X=np.zeros((60, 0), np.float32), y=np.arange(60) % 3)
    line = _refused([str(tmp_path / "narrow.npz")], capsys)
    assert line.endswith("narrow.npz holds no features (its rows have 0 columns)")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_labels_that_are_nan_or_infinite_are_refused(files, tmp_path, capsys, bad):
    # A NaN or infinite label is no class: every row needs one. An infinite label equals
    # its own rounding, so only this check stops it from being fitted as a class of its own.
    y = np.load(files / "y.npy").astype(float)
    y[3] = bad
    np.save(tmp_path / "y_bad.npy", y)
    line = _refused([str(files / "X.npy"), "--labels", str(tmp_path / "y_bad.npy")], capsys)
    assert "some labels are NaN or infinite; every row needs a class" in line


def test_whole_float_labels_are_class_indices(files, tmp_path):
    # Float labels kept their float spelling: the report keyed the training classes "0.0"
    # where the test file's integer labels were "0", and printed classes as 1.0, 4.0.
    np.save(tmp_path / "y_float.npy", np.load(files / "y.npy").astype(float))
    X, y, names = load_xy(str(files / "X.npy"), str(tmp_path / "y_float.npy"))
    assert y.dtype == np.int64 and names is None
    np.testing.assert_array_equal(y, np.load(files / "y.npy"))


def test_bytes_labels_that_are_not_utf8_are_refused(files, tmp_path, capsys):
    # Bytes labels are decoded as UTF-8 text; bytes that are not text must be refused with
    # that reason, not passed on as bytes (which scikit-learn refuses after the fit began).
    X = np.load(files / "X.npy")
    y = np.array([b"\xff\xfe", b"ok", b"\xc3"])[np.arange(len(X)) % 3]
    np.savez(tmp_path / "latin.npz", X=X, y=y)
    line = _refused([str(tmp_path / "latin.npz")], capsys)
    assert "latin.npz are bytes that are not UTF-8 text" in line


def test_a_single_array_named_npz_is_refused_as_such(files, tmp_path, capsys):
    # A .npy array saved under a .npz name holds no X and y: the error must say so
    # plainly rather than report a failure to read the file.
    np.save(tmp_path / "X.npy", np.load(files / "X.npy"))
    (tmp_path / "X.npy").rename(tmp_path / "single.npz")
    line = _refused([str(tmp_path / "single.npz")], capsys)
    assert "single.npz holds one array, not a .npz archive of X and y" in line


def test_test_labels_without_a_test_file_are_refused(files, capsys):
    # --test-labels only describes a --test file: given alone it would be ignored (or fail
    # on the missing test path); the run must stop and say so in one line.
    line = _refused(
        [str(files / "X.npy"), "--labels", str(files / "y.npy"), "--test-labels",
         str(files / "y.npy")],
        capsys,
    )  # fmt: skip
    assert "--test-labels goes with --test FILE.npy; pass --test or drop it" in line


def test_an_unknown_device_is_refused_before_anything_is_read(files, capsys):
    # A device name that torch does not know is an option mistake: it must be refused
    # with the option named before any file is read or any model fitted.
    line = _refused([str(files / "missing.npz"), "--device", "no-such-device"], capsys)
    assert line.startswith("mr2-probe: error: --device 'no-such-device': device=")
    assert "is not a torch device" in line


def test_a_class_of_two_samples_is_not_called_a_single_sample(files, capsys):
    # When a --test-size split cannot be made, a class of two samples is not the problem
    # of a class with one: the advice must be another --test-size, not to drop samples.
    line = _refused([str(files / "uneven.npz"), "--test-size", "0.01"], capsys)
    assert "choose a --test-size that leaves each class at least one sample" in line
    assert "single sample" not in line


def test_an_archive_with_features_but_no_labels_is_refused_by_name(files, tmp_path, capsys):
    # An archive that holds X but neither y nor labels must be refused by saying which
    # arrays it needs and which it holds, not with a bare KeyError from the archive.
    np.savez(tmp_path / "no_y.npz", X=np.load(files / "X.npy"))
    line = _refused([str(tmp_path / "no_y.npz")], capsys)
    assert "must hold arrays X and y (or features and labels); found ['X']" in line


@pytest.mark.parametrize("extra", [{"features": 0}, {"labels": 0}])
def test_an_archive_with_both_spellings_of_an_array_is_refused(files, tmp_path, capsys, extra):
    # An archive holding X and y and also features or labels was read as X and y without a
    # word, whichever pair was meant.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    arrays = {
        "X": X,
        "y": y,
        **{key: {"features": X[:, ::-1], "labels": y[::-1]}[key] for key in extra},
    }
    np.savez(tmp_path / "both.npz", **arrays)
    line = _refused([str(tmp_path / "both.npz")], capsys)
    pair = ("X", "features") if "features" in extra else ("y", "labels")
    assert f"holds both {pair[0]!r} and {pair[1]!r}, other arrays of as many rows" in line


def test_an_archive_with_a_copy_of_x_holding_nan_is_refused_for_its_nan(files, tmp_path, capsys):
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    X[5] = np.nan
    np.savez(tmp_path / "copy.npz", X=X, y=y, features=X.copy())
    line = _refused([str(tmp_path / "copy.npz")], capsys)
    assert "1 of 90 rows hold NaN or infinite features (the first is row 5)" in line


def test_an_archive_with_class_names_as_y_beside_features_and_labels_is_read(files, tmp_path):
    # The mirror of the next test: y read as the labels, 3 class names against 90 rows
    # ("90 rows of features but 3 labels").
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    np.savez(tmp_path / "named.npz", features=X, labels=y, y=np.unique(y).astype(str))
    assert main([str(tmp_path / "named.npz"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0


def test_an_archive_with_class_names_as_labels_beside_x_and_y_is_read(files, tmp_path):
    # Class names saved as 'labels' beside X and y (a row per class, not per sample) name
    # no rival to y: the archive is read as X and y.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    names = np.unique(y).astype(str)
    np.savez(tmp_path / "named.npz", X=X, y=y, labels=names, features=X)
    assert main([str(tmp_path / "named.npz"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0


@pytest.mark.parametrize("key", ["class_names", "target_names"])
@pytest.mark.slow
def test_an_archive_s_class_names_name_its_integer_labels(files, tmp_path, key):
    # Names saved beside integer codes, as a store keeps them (scikit-learn's datasets:
    # target_names), were dropped without a word: the reports named the classes 0, 1, 2.
    # The test archive codes its classes in the reverse order, and is matched by name.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    data = np.load(files / "test.npz")
    names = np.array(FASHION)
    np.savez(tmp_path / "train.npz", X=X, y=y, **{key: names})
    np.savez(tmp_path / "test.npz", X=data["X"], y=2 - data["y"], **{key: names[::-1]})
    np.savez(tmp_path / "train_text.npz", X=X, y=names[y])
    np.savez(tmp_path / "test_text.npz", X=data["X"], y=names[data["y"]])
    reports = {}
    for run in ("", "_text"):
        out = tmp_path / f"out{run}"
        argv = [str(tmp_path / f"train{run}.npz"), "--test", str(tmp_path / f"test{run}.npz")]
        assert main([*argv, "--out", str(out), "--no-progress"]) == 0
        reports[run] = json.loads((out / "report.json").read_text())
    assert reports[""]["labels"] == sorted(FASHION)
    for part in ("labels", "per_class", "rows"):
        assert reports[""][part] == reports["_text"][part]


@pytest.mark.parametrize("named", ["train", "test"])
def test_integer_labels_beside_an_archive_s_class_names_are_taken_as_its_codes(
    files, tmp_path, capsys, named
):
    # As a store's: an archive naming its integer labels beside one of the same codes
    # without names was refused ("the test labels hold 3 classes absent from the training
    # labels (0, 1, 2)"), though it had run before the names were read.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    data = np.load(files / "test.npz")
    names = {"class_names": np.array(FASHION)}
    np.savez(tmp_path / "train.npz", X=X, y=y, **(names if named == "train" else {}))
    np.savez(tmp_path / "test.npz", X=data["X"], y=data["y"], **(names if named == "test" else {}))
    out = tmp_path / "out"
    argv = [str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz")]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    plain = tmp_path / ("test.npz" if named == "train" else "train.npz")
    assert f"the integer labels of {plain} are taken as codes of" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["labels"] == sorted(FASHION)
    arrays = dict(np.load(plain))
    np.savez(plain, X=arrays["X"], y=arrays["y"] + 1)  # codes 1..3 of three names
    assert "hold codes outside 0..2, the classes that" in _refused(argv, capsys)


@pytest.mark.parametrize("kind", ["float", "bool"])
def test_an_archive_s_class_names_name_its_whole_number_or_boolean_labels(files, tmp_path, kind):
    # Class indices saved as floats (read as integers) and booleans (False and True: codes
    # 0 and 1) kept their names dropped without a word: the report named 0, 1, 2 or False.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    labels, names = (y.astype(float), FASHION) if kind == "float" else (y > 0, FASHION[:2])
    np.savez(tmp_path / "named.npz", X=X, y=labels, class_names=np.array(names))
    out = tmp_path / "out"
    assert main([str(tmp_path / "named.npz"), "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "report.json").read_text())["labels"] == sorted(names)


@pytest.mark.parametrize(
    "names, message",
    [
        (FASHION[:2], "'y' holds codes outside 0..1, the classes that its 'class_names' names"),
        # (no names at all: it said "codes outside 0..-1")
        (np.array([], "U1"), "'class_names' is empty, naming none of the classes of 'y'; save"),
        (["a", "b", "a"], "'class_names' names two classes 'a'; give each class a name"),
        ([[0, 1, 2]], "'class_names' must list the classes' names as text, the k-th naming"),
    ],
)
def test_an_archive_s_class_names_that_cannot_name_its_labels_are_refused(
    files, tmp_path, capsys, names, message
):
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    np.savez(tmp_path / "named.npz", X=X, y=y, class_names=np.array(names))
    assert message in _refused([str(tmp_path / "named.npz")], capsys)


@pytest.mark.parametrize("key, kind", [("class_names", "bytes"), ("target_names", "str")])
def test_an_archive_s_class_names_beside_text_labels_must_list_them(
    files, tmp_path, capsys, key, kind
):
    # Text labels beside class names were read as they are, and the names left unread
    # without a word: names that list other classes than the labels now stop the run, as
    # they do beside integer labels; names that list them (in another order, with a class
    # more, a label in decomposed accents) are no mistake.
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    labels = np.array(["café", "Trouser", "Ankle boot"])[y]
    labels = np.char.encode(labels, "utf-8") if kind == "bytes" else labels
    listed = np.array(["Trouser", "Ankle boot", "cafe\u0301", "Bag"])
    np.savez(tmp_path / "named.npz", X=X, y=labels, **{key: listed})
    out = tmp_path / "out"
    assert main([str(tmp_path / "named.npz"), "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "report.json").read_text())["labels"] == sorted(
        ["Ankle boot", "Trouser", "café"]
    )
    capsys.readouterr()
    np.savez(tmp_path / "named.npz", X=X, y=labels, **{key: np.array(FASHION)})
    line = _refused([str(tmp_path / "named.npz")], capsys)
    assert line.endswith(
        f"named.npz's 'y' holds 1 class name that its {key!r} does not list ('café'): text "
        f"labels must be among those names; save {key!r} with the name of every class, or "
        "leave it out"
    )


def test_an_archive_with_a_scalar_beside_its_other_spelling_is_refused_by_its_shape(
    files, tmp_path, capsys
):
    # A scalar X beside per-row features stopped in the rows' count as "cannot read ... as
    # .npz: TypeError: len() of unsized object". (A scalar y beside per-row labels: the
    # labels are read, as beside class names.)
    X, y = np.load(files / "X.npy"), np.load(files / "y.npy")
    np.savez(tmp_path / "scalar.npz", X=np.array(1), y=y, features=X)
    line = _refused([str(tmp_path / "scalar.npz")], capsys)
    assert "2-D" in line and "TypeError" not in line, line
    np.savez(tmp_path / "scalar_y.npz", X=X, y=np.array(1), labels=y)
    assert (
        main([str(tmp_path / "scalar_y.npz"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    )


@pytest.mark.parametrize(
    "options", [["--test-size", "1"], ["--tilt", "1", "--val-size", "1"]]
)  # fmt: skip
def test_a_fraction_of_one_is_refused_as_out_of_range(files, capsys, options):
    # A fraction of 1 would hold out every sample: it is out of range like 0, and must be
    # refused as such, before any file is read.
    line = _refused([str(files / "missing.npz"), *options], capsys)
    assert f"{options[-2]} must be a fraction between 0 and 1 (both excluded)" in line


def test_a_c_bar_that_is_no_number_is_refused_in_the_user_s_words(files, capsys):
    # argparse named the parsing function: "invalid _optional_float value: 'abc'".
    status, err = _error([str(files / "train.npz"), "--c-bar", "abc"], capsys)
    assert status == 2
    assert err[-1].endswith("argument --c-bar: expected a number or 'none', got 'abc'")


def _checked(argv):
    """The options of ``argv`` parsed and checked as mr2-probe does before reading files."""
    from mr2_probe.cli._options import _check_options

    args = _parser().parse_args(argv)
    _check_options(args)
    return args


def test_the_front_and_search_options_default_as_the_help_says(files):
    # --val-size 0.1, --front-bound 0.5, --cv 3, --scoring worst_class and --seed 0 (the
    # help's defaults), where the run has a front and a search to read them.
    args = _checked([str(files / "train.npz"), "--tilt", "1", "--Cs", "3"])
    assert (args.val_size, args.front_bound, args.cv) == (0.1, 0.5, 3)
    assert (args.scoring, args.seed) == ("worst_class", 0)


def test_a_logit_scale_is_taken_where_the_grid_searches_the_cosine_head(files):
    # --logit-scale sets the scale of the grid's cosine models (refused only where no
    # model of the run has the cosine head).
    from mr2_probe.cli._options import _check_grid, _given

    argv = [str(files / "train.npz"), "--logit-scale", "16", "--grid", "head=linear,cosine"]
    args = _checked(argv)
    _check_grid(_grid(args.grid), _estimators(args)[1], args, _given(argv))


def test_minibatch_parameters_are_taken_where_some_model_of_the_grid_reads_them(files):
    # lam=0,0.5: the lam = 0.5 models are fitted by a minibatch solver, which reads
    # learning_rate (refused only where every model is fitted by L-BFGS).
    from mr2_probe.cli._options import _check_grid, _given

    argv = [str(files / "train.npz"), "--grid", "lam=0,0.5", "--grid", "learning_rate=0.1,0.01"]
    args = _checked(argv)
    _check_grid(_grid(args.grid), _estimators(args)[1], args, _given(argv))


@pytest.mark.parametrize("options", [["--grid", "lam=0,0.5"], ["--lam", "0.5"], ["--offsets", "1"]])
def test_a_tilt_0_front_without_margins_is_taken_where_it_is_more_than_erm(files, options):
    # --c-bar none --tilt 0 is a front of ERM alone, and refused, but not where MR² has a
    # compactness loss (or a grid that may choose one) or the front has offsets too.
    args = _checked([str(files / "train.npz"), "--c-bar", "none", "--tilt", "0", *options])
    assert args.tilt == (0.0,)


@pytest.mark.parametrize(
    "grid, options",
    [
        ("c_bar=none,1", ["--tilt", "0", "--offsets", "1"]),
        ("c_bar=none", ["--tilt", "0", "--offsets", "1"]),
        ("c_bar=none,1", ["--tilt", "0,1"]),
        ("c_bar=none,1", ["--offsets", "1"]),
        ("c_bar=none,1", []),
    ],
)
def test_a_grid_that_may_choose_erm_is_taken_without_a_word_where_the_front_is_more(
    files, capsys, grid, options
):
    # Only --tilt 0 alone makes a search's choice of ERM's configuration a front of ERM
    # alone: with offsets, a tilt above 0 or no front at all, the grid is taken as it is.
    from mr2_probe.cli._options import _check_grid, _given

    argv = [str(files / "train.npz"), "--grid", grid, *options]
    args = _checked(argv)
    _check_grid(_grid(args.grid), _estimators(args)[1], args, _given(argv))
    assert "ERM" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "grid, options, theirs",
    [
        (["c_bar=none,1"], [], ""),
        (["c_bar=none,1", "C=0.1,1"], [], ", and the C that ERM's own search chooses; "
         "another C is a point of its own"),
        (["c_bar=none,1", "p=2,3", "max_iter=5,10"], [], ", and the max_iter that ERM's own "
         "search chooses; another max_iter is a point of its own"),
        # (C: no penalty of a cosine head without a projection, which ERM's model is)
        (["c_bar=none,1", "C=0.1,1", "lam=0,0.5"], ["--head", "cosine"], ""),
    ],
    ids=["c_bar", "C", "max_iter", "cosine"],
)  # fmt: skip
def test_tilt_0_beside_a_grid_says_when_its_front_is_left_out(files, capsys, grid, options, theirs):
    # It said that a choice of c_bar=None, lam=0 left the front out; where ERM searches C too,
    # its own choice of C can differ, and the front of the two is drawn.
    from mr2_probe.cli._options import _check_grid, _given

    argv = [str(files / "train.npz"), *(f"--grid={g}" for g in grid), "--tilt", "0", *options]
    args = _checked(argv)
    _check_grid(_grid(args.grid), _estimators(args)[1], args, _given(argv))
    assert capsys.readouterr().err.splitlines() == [
        "mr2-probe: warning: --tilt 0 with a --grid that may choose ERM's configuration "
        f"(c_bar=None, lam=0{theirs}): where it does, the front is one of ERM alone and is "
        "left out (exit status 1); give --tilt values above 0 or --offsets to draw it "
        "whatever the search chooses"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("erm_chooses, status", [("C=0.1", 1), ("C=1", 0)])
def test_tilt_0_beside_a_grid_of_c_leaves_the_front_out_only_at_erm_s_own_choice(
    files, tmp_path, capsys, monkeypatch, erm_chooses, status
):
    # MR² chooses c_bar=None at C=0.1 (the first of settings all scored the same). Where ERM's
    # search chooses C=0.1 too, the front is ERM's alone; where it chooses C=1 (here made to,
    # its values listed the other way round), the front of the two is drawn, as the warning
    # says.
    model = cli_main._model

    def erm_first_at(probe, grid, args):
        if "c_bar" not in grid and "C" in grid:  # ERM's search
            grid = {**grid, "C": sorted(grid["C"], reverse=erm_chooses == "C=1")}
        return model(probe, grid, args)

    monkeypatch.setattr(cli_main, "_model", erm_first_at)
    out = tmp_path / "run"
    argv = [str(files / "train.npz"), "--test", str(files / "test.npz"), "--grid", "c_bar=none,1"]
    argv += ["--grid", "C=0.1,1", "--cv", "2", "--tilt", "0", "--max-iter", "20", "--out", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main([*argv, "--no-progress"]) == status
    captured = capsys.readouterr()
    assert "MR2 grid: best parameters by worst_class (2-fold CV): {'C': 0.1, 'c_bar': None}" in (
        captured.out
    )
    assert f"ERM grid: best parameters by worst_class (2-fold CV): {{'C': {erm_chooses[2:]}}}" in (
        captured.out
    )
    assert "and the C that ERM's own search chooses" in captured.err.splitlines()[0]
    assert ("the front failed and is left out" in captured.err) == (status == 1)
    assert (out / "front.png").exists() == (status == 0)


def test_the_test_size_split_is_seeded_by_seed(files):
    # The held-out test set is the stratified split of --seed (report.json records it),
    # each part in the file's order (the order a store is read in).
    from sklearn.model_selection import train_test_split

    from mr2_probe.cli._inputs import _inputs

    X, y, _ = load_xy(str(files / "train.npz"))
    for seed in ("3", "7"):
        args = _checked([str(files / "train.npz"), "--test-size", "0.5", "--seed", seed])
        _, y_fit, X_test, y_test, *_ = _inputs(args)
        split = train_test_split(
            np.arange(len(y)), test_size=0.5, stratify=y, random_state=int(seed)
        )
        train, test = (np.sort(part) for part in split)
        np.testing.assert_array_equal(X_test, X[test])
        np.testing.assert_array_equal(y_fit, y[train])


def test_models_are_saved_without_progress_bars_behind_a_scaler():
    # A Pipeline's probe kept the run's verbose=1 (probe__verbose), unlike a bare probe.
    from mr2_probe.cli._outputs import _quiet

    model = _quiet(
        Pipeline([("scale", StandardScaler()), ("probe", MR2LinearClassifier(verbose=1))])
    )
    assert model[-1].verbose == 0


def test_a_front_bound_of_zero_is_taken(files):
    # The front's bound is in points "from 0": a bound of 0 (no overall accuracy given up
    # against ERM) is the strictest rule, and must be accepted, not refused as out of range.
    args = _checked([str(files / "train.npz"), "--tilt", "1", "--front-bound", "0"])
    assert args.front_bound == 0


def test_cs_of_two_values_is_the_smallest_choice(files):
    # --Cs N needs N >= 2 values to choose from; 2 is the least that is a choice, and must
    # be accepted (1 is refused elsewhere).
    args = _checked([str(files / "train.npz"), "--Cs", "2"])
    assert args.Cs == 2


def test_a_grid_of_one_iteration_is_taken(files):
    # --grid max_iter refuses values below 1 (0 reports the untrained starting point);
    # a single iteration is a model, and a grid holding it must be accepted.
    from mr2_probe.cli._options import _check_grid

    args = _checked([str(files / "train.npz"), "--grid", "max_iter=1,5"])
    _check_grid(_grid(args.grid), MR2LinearClassifier(), args, frozenset({"grid"}))


def test_strict_json_writes_non_finite_numbers_inside_lists_and_tuples():
    # Infinities and NaN nested in a list or a tuple are written as in a mapping's values:
    # "inf" / "-inf" and null, never the Infinity / NaN that strict parsers refuse.
    from mr2_probe.cli._outputs import _strict_json

    text = _strict_json({"Cs": [0.01, float("inf")], "worst": (float("nan"), -float("inf"))})
    assert json.loads(text) == {"Cs": [0.01, "inf"], "worst": [None, "-inf"]}


def test_a_command_json_holding_just_train_and_out_marks_an_earlier_run(tmp_path):
    # The options of a run are any mapping with "train" and "out": a folder holding one
    # (and a report) is an earlier run's, to be replaced, not refused.
    from mr2_probe.cli._outputs import _prepare_out

    (tmp_path / "report.md").write_text("an earlier run's\n")
    (tmp_path / "command.json").write_text('{"train": "x.npz", "out": "run"}\n')
    assert _prepare_out(str(tmp_path)) == tmp_path


def test_out_may_name_a_folder_inside_folders_that_do_not_exist_yet(tmp_path):
    from mr2_probe.cli._outputs import _claim_out, _prepare_out

    out = _prepare_out(str(tmp_path / "runs" / "cv" / "first"))
    assert out == tmp_path / "runs" / "cv" / "first" and not (tmp_path / "runs").exists()
    with _claim_out(out):  # once the inputs are checked
        assert out.is_dir()


@pytest.mark.parametrize("error, status", [(KeyboardInterrupt, 130), (ValueError("failed"), 2)])
def test_a_run_failing_before_it_writes_leaves_no_new_out(
    files, tmp_path, monkeypatch, capsys, error, status
):
    def fit(*args, **kwargs):  # as every fit of a search failing, or Ctrl-C during a fit
        raise error

    monkeypatch.setattr(cli_main, "_fit", fit)
    new, existing = tmp_path / "runs" / "first", tmp_path / "earlier"
    existing.mkdir()
    for out in (new, existing):
        code, _ = _error([str(files / "train.npz"), "--out", str(out), "--no-progress"], capsys)
        assert code == status
    assert not (tmp_path / "runs").exists() and existing.is_dir()


def test_a_run_failing_before_it_writes_leaves_no_new_out_named_through_dotdot(
    files, tmp_path, monkeypatch, capsys
):
    # runs/../other/first: "runs" was created, then left behind ("runs/.." is no folder
    # of this run's to remove, and the removal stopped there).
    def fit(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "_fit", fit)
    out = tmp_path / "runs" / ".." / "other" / "first"
    code, _ = _error([str(files / "train.npz"), "--out", str(out), "--no-progress"], capsys)
    assert code == 130 and os.listdir(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="--out is locked on POSIX systems")
def test_a_second_run_into_an_out_in_use_is_refused_and_mixes_nothing(files, tmp_path, capsys):
    import fcntl

    out = tmp_path / "run"
    out.mkdir()
    held = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a run writing there holds it
        line = _refused([str(files / "train.npz"), "--out", str(out)], capsys)
    finally:
        os.close(held)
    assert line == (
        f"mr2-probe: error: --out {str(out)!r} is being written by another mr2-probe run, "
        "whose files this run's would mix with; wait for it to end, or choose another --out"
    )
    assert os.listdir(out) == []


@pytest.mark.parametrize(
    "argv", [["nan.npz"], ["train.npz", "--Cs", "3", "--cv", "40"], ["train.npz", "--C", "-1"]]
)
def test_a_refused_run_leaves_no_new_out_and_an_existing_one_as_it_was(
    files, tmp_path, capsys, argv
):
    new, existing = tmp_path / "runs" / "first", tmp_path / "earlier"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine\n")
    for out in (new, existing):
        _refused([str(files / argv[0]), *argv[1:], "--out", str(out)], capsys)
    assert not (tmp_path / "runs").exists()
    assert os.listdir(existing) == ["notes.txt"]


def test_out_without_matplotlib_is_refused_before_any_work(tmp_path, monkeypatch):
    # --out draws the figures: without matplotlib the run stops at once, in one line.
    from mr2_probe.cli._outputs import _prepare_out

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(UsageError, match=r"^--out draws plots, which need matplotlib: pip inst"):
        _prepare_out(str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # it made the folder first, then refused


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
@pytest.mark.parametrize("inside", ["", "run"])
def test_out_through_a_link_to_nothing_is_refused_before_any_file_is_read(tmp_path, capsys, inside):
    # (It was found once the inputs were read, as "cannot write ... (File exists)".)
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    out = tmp_path / "link" / inside
    line = _refused([str(tmp_path / "missing.npz"), "--out", str(out)], capsys)
    assert line == (
        f"mr2-probe: error: --out {str(out)!r} cannot be a folder: "
        f"{str(tmp_path / 'link')!r} is a link to {str(tmp_path / 'gone')!r}, which does not "
        "exist; create that folder, or choose another --out"
    )
    assert not (tmp_path / "gone").exists()


@NEEDS_H5
def test_a_store_s_boolean_features_are_read_as_a_npz_s_are(tmp_path, capsys):
    # A store of boolean features was refused ("not numbers"), the same features in a .npz
    # taken as 0/1, as scikit-learn takes a boolean X.
    import h5py

    X, y = _blobs(30, seed=1)
    np.savez(tmp_path / "b.npz", X=X > 0, y=y)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["features"], f["labels"], f["class_names"] = X > 0, y, FASHION
    tables = []
    for name in ("b.npz", "b.h5"):
        assert main([str(tmp_path / name), "--max-iter", "20", "--no-progress"]) == 0
        out = capsys.readouterr().out.splitlines()
        tables.append([line for line in out if line.startswith(("ERM ", "MR2 "))])
    assert tables[0] == tables[1] and len(tables[0]) == 2
