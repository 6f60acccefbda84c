"""bench_cosine.py's equivalent linear problem: the multipliers it reads off a cosine fit."""

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning

from mr2_probe import MR2LinearClassifier
from mr2_probe._losses import margin_cross_entropy
from tests._scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_cosine")


@pytest.fixture(scope="module")
def digits_unit():
    X, y = load_digits(return_X_y=True)
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


def _fit(X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MR2LinearClassifier(max_iter=5000, device="cpu", **params).fit(X, y)


def test_multipliers_of_a_penalised_linear_head_are_its_penalty(bench, digits_unit):
    """∇_k L + v_k / (C·S) = 0 at the linear head's solution: μ_k = 1 / (C·S) for all k."""
    X, y = digits_unit
    linear = _fit(X, y, fit_intercept=False, C=10.0, tol=1e-9)
    mu = bench.multipliers(X, y, linear.coef_, linear.margins_)
    np.testing.assert_allclose(bench.equivalent_C(mu, len(y)), 10.0, rtol=1e-4)
    assert bench.equivalent_C(mu.mean(), len(y)) == pytest.approx(10.0, rel=1e-4)


def test_cosine_solution_is_stationary_for_its_equivalent_penalties(bench, digits_unit):
    """docs/speed.md's equivalence: at the cosine solution ∇_k L = −μ_k·v_k, with μ_k > 0 (the
    gradient in the logit weights is radial, what is left of it is the solver's tol)."""
    X, y = digits_unit
    cosine = _fit(X, y, head="cosine", scale=32.0, tol=1e-8)
    mu = bench.multipliers(X, y, cosine.coef_, cosine.margins_)
    assert (mu > 0).all()
    V = torch.as_tensor(cosine.coef_).requires_grad_()
    z = torch.as_tensor(X) @ V.T
    margin_cross_entropy(z, torch.as_tensor(y), torch.as_tensor(cosine.margins_)).backward()
    residual = V.grad.numpy() + mu[:, None] * cosine.coef_
    assert np.abs(residual).max() <= 1e-4 * np.abs(V.grad.numpy()).max()


def test_runs_every_section_and_writes_its_rows(bench, tmp_path, capsys):
    out = tmp_path / "rows.json"
    bench.main(["--n-samples", "400", "--n-test", "100", "--n-features", "16",
                "--n-classes", "3", "--scales", "8", "--c-bar", "none", "--sweep",
                "--sweep-scales", "4", "8", "--linear-history", "30", "--seed", "1",
                "--json", str(out)])  # fmt: skip

    def refuse(constant):  # strict JSON: a NaN ratio was written as NaN
        raise ValueError(f"{constant} is no JSON")

    rows = json.loads(out.read_text(), parse_constant=refuse)["rows"]
    printed = capsys.readouterr().out
    # scikit-learn's row too, timed before the linear head's: it was NaN (nan× printed)
    assert rows[0]["ratio_to_linear"] == pytest.approx(rows[0]["fit_s"] / rows[1]["fit_s"])
    assert rows[1]["ratio_to_linear"] == 1.0
    assert "nan×" not in printed.splitlines()[3]
    names = [row.get("model", row.get("search")) for row in rows]
    assert sum(name.startswith("  linear at mean μ") for name in names) == 2
    assert any(name.endswith(", 30 pairs") for name in names)
    assert sum(name.startswith("  rounds of torch's L-BFGS") for name in names) == 1
    assert any("LogisticRegression (sklearn)" in name and "same" in name for name in names)
    searches = [row for row in rows if "search" in row]
    assert len(searches) == 3
    # Both searches' scale by one rule, the best mean score over the folds: the path's was
    # its scale_, with refit=False the mean of the folds' best (6.67 here, where the
    # folds chose 4, 8 and 8, and the best mean score is 4's).
    assert [row["chosen_scale"] for row in searches[1:]] == [4.0, 4.0]
    assert "scale search over 4, 8" in printed


def test_two_classes_run_with_their_one_row(bench, capsys):
    # A two-class model keeps one row (v_1 − v_0): its objective indexed a second one.
    bench.main(["--n-samples", "300", "--n-test", "60", "--n-features", "8",
                "--n-classes", "2", "--scales", "8", "--no-before"])  # fmt: skip
    out = capsys.readouterr()
    assert "(no linear problem at mean μ: two classes, one row of coefficients)" in out.out
    assert "ConvergenceWarning" not in out.err  # the warm-up fit's is its own
    cosine = next(line for line in out.out.splitlines() if line.startswith("MR2 cosine"))
    assert float(cosine.split()[-2]) > 0  # the objective


def test_the_objective_of_two_classes_is_that_of_their_two_rows(bench, digits_unit):
    # Shifting both logits leaves the margin cross-entropy unchanged: (0, z) is (v_0, v_1).
    X, y = digits_unit
    keep = y < 2
    rows = np.random.default_rng(0).normal(size=(2, X.shape[1]))
    margins = np.array([0.8, 1.3])
    both = bench.objective(X[keep], y[keep], rows, margins)
    assert bench.objective(X[keep], y[keep], rows[1:] - rows[:1], margins) == pytest.approx(both)


def test_bench_fit_objective_of_two_classes_is_logistic_regression_s(digits_unit):
    # A binomial model has one row: bench_fit's objective indexed a second margin.
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    bench_fit = load_benchmark("bench_fit", "bench_fit_two")
    X, y = digits_unit
    X, y = X[y < 2], y[y < 2]
    model = LogisticRegression(C=0.5).fit(X, y)
    want = log_loss(y, model.predict_proba(X)) + 0.5 * (model.coef_**2).sum() / (0.5 * len(y))
    assert bench_fit.objective(model, X, y, 0.5) == pytest.approx(want, rel=1e-9)


# The stand-in for timed() below does not record the fits' ConvergenceWarnings as it does.
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_repeat_keeps_the_best_time_of_its_fits(bench, monkeypatch, capsys):
    clock = iter([0.0, 5.0, 10.0, 12.0, 20.0, 27.0])  # calls of 5, 2 and 7 s
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    calls = []
    seconds, out, short = bench.timed(lambda: calls.append(len(calls)) or len(calls), 3)
    assert (seconds, out, short, len(calls)) == (2.0, 3, False, 3)
    monkeypatch.undo()
    fits = []
    monkeypatch.setattr(bench, "timed", lambda fn, repeat=1: fits.append(repeat) or (1.0, fn(), 0))
    bench.main(["--n-samples", "300", "--n-test", "60", "--n-features", "8",
                "--n-classes", "3", "--scales", "8", "16", "--no-before", "--no-equivalent",
                "--repeat", "2"])  # fmt: skip
    # scikit-learn's, the linear head's, and both scales' cosine rows and their rounds'
    assert fits == [2] * 6
    assert "best of 2, " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0"])
    assert "--repeat: must be at least 1, got 0" in capsys.readouterr().err


def test_spheres_fit_the_cosine_rows_on_the_spheres_where_the_estimator_would_not(
    bench, monkeypatch, capsys
):
    calls = []
    real = bench.solvers.sphere_lbfgs
    monkeypatch.setattr(
        bench.solvers, "sphere_lbfgs", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    args = ["--n-samples", "300", "--n-test", "60", "--n-features", "8", "--n-classes", "3",
            "--scales", "8", "--no-before", "--no-equivalent"]  # fmt: skip
    bench.main(args)  # 300 × 8: below MIN_ENTRIES, the rounds
    assert not calls and "(spheres)" not in capsys.readouterr().out
    bench.main([*args, "--spheres"])
    assert len(calls) == 1  # the cosine row, not its rounds
    assert "MR2 cosine, scale=8 (spheres)" in capsys.readouterr().out


class _ClassOrderedStore:
    """A store written from a class-per-folder tree: its rows in class order, 600 a class."""

    labels = np.repeat(np.arange(3), 600)
    features = (np.random.default_rng(0).normal(size=(1800, 8)) + labels[:, None]).astype(
        np.float32
    )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# 900 rows (600 of class 0): under 1,000 rows the step was 1, the first 500 rows class 0
@pytest.mark.parametrize("n_samples, n_classes", [(1500, 3), (900, 2)])
def test_the_warm_up_takes_rows_of_every_class_of_a_class_ordered_store(
    bench, monkeypatch, capsys, n_samples, n_classes
):
    """Its first 500 rows are one class: the warm-up fit failed (needs 2 classes)."""
    monkeypatch.setattr("extract.load_features", lambda path: _ClassOrderedStore())
    bench.main(["--store", "ordered.h5", "--n-samples", str(n_samples), "--n-test", "300",
                "--scales", "16", "--no-rounds", "--no-before", "--no-equivalent"])  # fmt: skip
    out = capsys.readouterr().out
    assert f"{n_samples} × 8 L2-normalised float32 train, 300 test, {n_classes} classes" in out


# 1200 training rows: classes 0 and 1, the 300 test rows all of class 2 (0% accuracy);
# 1000: 100 of them
@pytest.mark.parametrize("n_samples, untrained", [(1200, 300), (1000, 100), (1500, 0)])
def test_test_rows_of_classes_the_training_rows_lack_are_said(
    bench, monkeypatch, tmp_path, capsys, n_samples, untrained
):
    """Every accuracy was 0.00 without a word: a store's rows in class order, its last
    class beyond --n-samples."""
    monkeypatch.setattr("extract.load_features", lambda path: _ClassOrderedStore())
    out = tmp_path / "rows.json"  # (which said nothing of them)
    bench.main(["--store", "ordered.h5", "--n-samples", str(n_samples), "--n-test", "300",
                "--scales", "16", "--no-rounds", "--no-before", "--no-equivalent",
                "--max-iter", "50", "--json", str(out)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if "classes that the training rows lack" in line]
    if untrained:
        assert said == [f"({untrained} of the 300 test rows are of classes that the "
                        "training rows lack (2): every model predicts them wrong)"]  # fmt: skip
    else:
        assert not said
    assert json.loads(out.read_text())["untrained_test_rows"] == (said[0] if said else None)


class _ClassOfNoRowStore(_ClassOrderedStore):
    """A store that lists a class of no row (code 1, a class that its list left out): its
    rows are of codes 0, 2 and 3, 400 each, in class order."""

    labels = np.repeat([0, 2, 3], 400)
    rng = np.random.default_rng(0)
    features = (4 * rng.normal(size=(4, 8))[labels] + rng.normal(size=(1200, 8))).astype(np.float32)


@pytest.mark.parametrize(
    "script, argv, row",
    [
        ("bench_cosine", ["--scales", "16", "--no-rounds", "--no-before", "--no-equivalent"],
         "MR2 cosine, scale=16"),
        ("cosine_tried", ["--scale", "16", "--only", "cold"], "cold fit at scale 16"),
    ],
)  # fmt: skip
# 900 training rows: codes 0, 2 and 3, the 300 test rows of 3; 800: codes 0 and 2, the test
# rows of 3, which no model can predict (0%)
@pytest.mark.parametrize("n_samples, trained", [(900, True), (800, False)])
def test_a_class_code_of_no_training_row_is_no_row_of_the_objective(
    script, argv, row, n_samples, trained, monkeypatch, capsys
):
    # The objectives took a label as its class's row of coef_ and margins_: codes 0, 2 and
    # 3 (three rows) failed them with "index 3 is out of bounds for dimension 0 with size 3".
    monkeypatch.setattr("extract.load_features", lambda path: _ClassOfNoRowStore())
    load_benchmark(script).main(
        ["--store", "gap.h5", "--n-samples", str(n_samples), "--n-test", "300", "--max-iter",
         "50", *argv]
    )  # fmt: skip
    (line,) = [line for line in capsys.readouterr().out.splitlines() if row in line]
    accuracy = float(line.split()[-2 if script == "cosine_tried" else -1])
    assert accuracy > 90 if trained else accuracy == 0


class _SmallClassStore(_ClassOrderedStore):
    """100 training rows of two classes and 2 of a third, then 30 test rows."""

    labels = np.r_[np.repeat([0, 1], 50), [2, 2], np.tile([0, 1, 2], 10)]
    features = (np.random.default_rng(0).normal(size=(132, 8)) + labels[:, None]).astype(np.float32)


def test_the_sweep_runs_with_a_class_of_fewer_rows_than_folds(bench, monkeypatch, capsys):
    """StratifiedKFold only warns of it; the sweep was refused above the smallest class."""
    monkeypatch.setattr("extract.load_features", lambda path: _SmallClassStore())
    with warnings.catch_warnings():  # "The least populated class in y has only 2 members"
        warnings.simplefilter("ignore", UserWarning)
        bench.main(["--store", "small.h5", "--n-samples", "102", "--n-test", "30",
                    "--scales", "8", "--no-rounds", "--no-before", "--no-equivalent",
                    "--sweep", "--sweep-scales", "4", "8", "--sweep-folds", "3",
                    "--max-iter", "50"])  # fmt: skip
    out = capsys.readouterr().out
    assert "102 × 8 L2-normalised float32 train, 30 test, 3 classes" in out
    assert "GridSearchCV(MR2LinearClassifier) (cold)" in out
