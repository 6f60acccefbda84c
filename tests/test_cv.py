"""MR2LinearClassifierCV: the path, its choices, LogisticRegressionCV, inputs and errors."""

import functools
import re
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import sklearn
import torch
from sklearn.datasets import load_digits, load_iris, make_blobs, make_classification
from sklearn.exceptions import (
    ConvergenceWarning,
    FitFailedWarning,
    NotFittedError,
    UnsetMetadataPassedError,
)
from sklearn.linear_model import LogisticRegressionCV
from sklearn.metrics import accuracy_score, average_precision_score, make_scorer
from sklearn.model_selection import GridSearchCV, GroupKFold, StratifiedKFold
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV
from mr2_probe._classifier import FitDivergedError
from mr2_probe._h5 import one_line
from mr2_probe._losses import margin_cross_entropy
from mr2_probe._path import bisect_search
from mr2_probe.metrics import classwise_scorers, group_accuracy, worst_class_accuracy
from tests._scripts import load_benchmark

SKLEARN = tuple(int(part) for part in sklearn.__version__.split(".")[:2])


def _blobs(n_classes=4, n=240, seed=0, std=3.0):
    X, y = make_blobs(
        n_samples=n, centers=n_classes, n_features=6, cluster_std=std, random_state=seed
    )
    return X, y


@pytest.mark.parametrize("batch_folds", [True, False])
def test_the_path_on_features_of_a_large_scale_scores_as_on_unit_ones(batch_folds, monkeypatch):
    # Scaled by 10⁶ at C·10⁻¹², the same problem: the batched path stalled at C = 0.01
    # (0.6675 against 0.735 held out), its intercept all but fixed.
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    Z, y = load_benchmark("bench_feature_scale").data()  # as bench_feature_scale.py's
    Cs, folds = np.array([0.01, 1.0, 100.0]), _folds(y)
    common = dict(cv=folds, c_bar=None, max_iter=1000, device="cpu")
    unit = MR2LinearClassifierCV(Cs=Cs, **common).fit(Z, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        large = MR2LinearClassifierCV(Cs=Cs / 1e12, **common).fit(Z * 1e6 + 5e6, y)
    np.testing.assert_allclose(large.scores_[0], unit.scores_[0], atol=1e-12)
    np.testing.assert_allclose(large.coef_ * 1e6, unit.coef_, rtol=0, atol=1e-2)


@pytest.mark.parametrize("batch_folds", [True, False])
def test_the_path_on_features_of_a_very_large_scale_fits(batch_folds, monkeypatch):
    # At 10¹⁵ the batched folds' first line search, whose trial steps shorten by about a
    # half each, ran out 25 steps later, 10⁴ times too long: every fold stopped at its
    # start (chance accuracy; LogisticRegression scores 1.0 on these rows).
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = load_digits(return_X_y=True)
    X, y = X[:200] / 16 * 1e15, y[:200]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = MR2LinearClassifierCV(Cs=[1.0], cv=2, device="cpu").fit(X, y)
    assert search.score(X, y) >= 0.99
    assert (search.n_iter_ > 10).all()


def _folds(y, k=3):
    return list(StratifiedKFold(k, shuffle=True, random_state=0).split(np.empty((len(y), 0)), y))


@pytest.mark.parametrize(
    "head, values, params",
    [
        ("linear", [0.01, 0.1, 1.0], dict(c_bar=1.0)),
        pytest.param(
            "linear", [0.01, 1.0], dict(c_bar=None, class_weight="balanced"), marks=pytest.mark.slow
        ),
        ("cosine", [2.0, 8.0, 32.0], dict(c_bar=1.0)),
    ],
)
def test_warm_started_path_matches_cold_fits(head, values, params):
    X, y = _blobs()
    folds = _folds(y)
    cv = MR2LinearClassifierCV(
        values, cv=folds, head=head, tol=1e-8, max_iter=500, device="cpu", **params
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cv.fit(X, y)
        weight = np.ones(len(y))
        if params.get("class_weight") == "balanced":  # computed on all the data, as sklearn
            weight = len(y) / (4 * np.bincount(y)[y])
        for f, (train, _) in enumerate(folds[:1]):
            for j, value in enumerate(values):
                searched = {"scale": value} if head == "cosine" else {"C": value}
                cold = MR2LinearClassifier(
                    head=head,
                    tol=1e-9,
                    max_iter=500,
                    device="cpu",
                    **searched,
                    **{k: v for k, v in params.items() if k != "class_weight"},
                ).fit(X[train], y[train], sample_weight=weight[train])
                path = np.stack([cv.coefs_paths_[k][f, j] for k in cv.classes_])
                # A cosine head's directions (coef_ / scale) are what its objective fixes.
                ours = path[:, :6] / value if head == "cosine" else path
                ref = (
                    cold.coef_ / value
                    if head == "cosine"
                    else np.hstack([cold.coef_, cold.intercept_[:, None]])
                )
                # Intercepts of blobs far from the origin are the least determined.
                np.testing.assert_allclose(ours, ref, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_max_iter_zero_scores_the_starting_points(head):
    X, y = _blobs()
    with pytest.warns(ConvergenceWarning, match="max_iter=0"):
        cv = MR2LinearClassifierCV([1.0, 10.0], cv=3, head=head, max_iter=0, device="cpu")
        cv.fit(X, y)
    assert not cv.n_iter_.any() and np.isfinite(cv.scores_[0]).all()


@pytest.mark.parametrize(
    "c_bar, class_tilt, objective",
    [(None, 0.0, "ERM"), (1.0, 0.0, "MR2"), (None, 1.0, "tilted ERM"), (1.0, 1.0, "tilted MR2")],
)
def test_the_search_s_progress_bars_name_the_objective_fitted(c_bar, class_tilt, objective, capsys):
    # A search of plain cross-entropy (ERM, as mr2-probe's --Cs fits it) showed bars
    # described "MR2 CV path" and "MR2 lbfgs", which read as the MR² model being fitted; so
    # did a search of tilted cross-entropy, which has no margins either.
    X, y = _blobs()
    cv = MR2LinearClassifierCV(
        [1.0, 10.0], cv=3, c_bar=c_bar, class_tilt=class_tilt, verbose=1, device="cpu"
    )
    cv.fit(X, y)
    err = capsys.readouterr().err
    assert f"{objective} CV path" in err and f"{objective} lbfgs" in err
    assert ("MR2" in err) == objective.endswith("MR2")
    assert ("tilted" in err) == objective.startswith("tilted")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # tol = 1e-8
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("batched", [True, False])
def test_c_inf_is_a_path_value_without_penalty(n_classes, batched):
    # C = np.inf is scikit-learn's unpenalised fit (penalty=None is deprecated); Cs holding
    # it were refused. A problem with noisy labels, so that the unpenalised optimum is finite.
    X, y = make_classification(
        450, 10, n_informative=6, n_classes=n_classes, flip_y=0.3, random_state=0
    )  # fmt: skip
    Cs, folds = [0.01, 1.0, np.inf], _folds(y)
    cv = MR2LinearClassifierCV(Cs, cv=folds, c_bar=None, tol=1e-8, max_iter=1000, device="cpu")
    cv._batch_folds = batched
    cv.fit(X, y)
    assert cv.Cs_[-1] == np.inf and np.isfinite(cv.coef_).all()
    train = folds[0][0]
    cold = MR2LinearClassifier(c_bar=None, C=np.inf, tol=1e-8, max_iter=1000, device="cpu")
    cold.fit(X[train], y[train])
    keys = cv.classes_[1:] if n_classes == 2 else cv.classes_
    path = np.stack([cv.coefs_paths_[k][0, -1] for k in keys])
    np.testing.assert_allclose(path[:, :-1], cold.coef_, atol=1e-4)
    np.testing.assert_allclose(path[:, -1], cold.intercept_, atol=1e-4)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_fitted_attributes_have_logistic_regression_cv_shapes(n_classes):
    X, y = _blobs(n_classes)
    labels = np.array(["a", "b", "c"])[y]
    clf = MR2LinearClassifierCV([0.1, 1.0, 10.0, 0.01], cv=4, device="cpu").fit(X, labels)
    keys = ["b"] if n_classes == 2 else ["a", "b", "c"]
    assert list(clf.scores_) == keys and list(clf.coefs_paths_) == keys
    np.testing.assert_array_equal(clf.Cs_, [0.01, 0.1, 1.0, 10.0])
    for key in keys:
        assert clf.scores_[key].shape == (4, 4)
        assert clf.coefs_paths_[key].shape == (4, 4, 7)
    assert clf.n_iter_.shape == (1, 4, 4)
    assert clf.class_accuracy_path_.shape == (4, 4, n_classes)
    assert clf.C_ == clf.scale_ and clf.C_ in clf.Cs_
    assert clf.coef_.shape == ((1, 6) if n_classes == 2 else (3, 6))
    assert clf.margins_.shape == (n_classes,) and set(clf.predict(X)) <= set(labels)


def test_a_value_listed_twice_is_solved_once():
    # Solved a second time from its own solution, its n_iter_ read 0.
    X, y = _blobs()
    once = MR2LinearClassifierCV([0.1, 1.0, 10.0], cv=3, device="cpu").fit(X, y)
    twice = MR2LinearClassifierCV([1.0, 0.1, 1.0, 10.0], cv=3, device="cpu").fit(X, y)
    np.testing.assert_array_equal(twice.Cs_, once.Cs_)
    np.testing.assert_array_equal(twice.n_iter_, once.n_iter_)
    np.testing.assert_array_equal(twice.coef_, once.coef_)


def test_refit_false_averages_each_folds_best():
    X, y = _blobs()
    Cs = [1e-3, 1e-2, 1e-1, 1.0]
    clf = MR2LinearClassifierCV(Cs, cv=3, refit=False, device="cpu").fit(X, y)
    scores = clf.scores_[0]
    best = scores.argmax(1)
    assert clf.C_ == pytest.approx(np.mean(np.array(Cs)[best]))
    mean = np.stack([clf.coefs_paths_[k][np.arange(3), best].mean(0) for k in clf.classes_])
    np.testing.assert_allclose(clf.coef_, mean[:, :6])
    np.testing.assert_allclose(clf.intercept_, mean[:, 6])
    np.testing.assert_allclose(clf.decision_function(X), X @ clf.coef_.T + clf.intercept_)
    assert clf.margins_.shape == (4,)


@pytest.mark.parametrize("params", [dict(fit_intercept=False), dict(head="cosine", Cs=[2.0, 8.0])])
def test_refit_false_without_intercept_keeps_the_coefficients_dtype(params):
    # Its zero intercept was float64 beside float32 coefficients (refit=True: float32).
    X, y = _blobs()
    X = X.astype(np.float32)
    clf = MR2LinearClassifierCV(**{"Cs": 3, **params}, cv=3, refit=False, tol=1e-3, device="cpu")
    clf.fit(X, y)
    assert clf.coef_.dtype == clf.intercept_.dtype == np.float32
    assert not clf.intercept_.any()


# tol=1e-8 for a close comparison: lbfgs stops short of it at float64 round-off.
@pytest.mark.filterwarnings("ignore:lbfgs stopped after:sklearn.exceptions.ConvergenceWarning")
def test_refit_chooses_the_best_sum_over_folds_and_refits_there():
    X, y = _blobs()
    clf = MR2LinearClassifierCV([1e-3, 1e-2, 1.0], cv=3, tol=1e-8, device="cpu").fit(X, y)
    assert clf.C_ == clf.Cs_[np.argmax(clf.scores_[0].sum(0))]
    ref = MR2LinearClassifier(C=clf.C_, tol=1e-8, device="cpu").fit(X, y)
    np.testing.assert_allclose(clf.coef_, ref.coef_, atol=1e-4)
    np.testing.assert_allclose(clf.margins_, ref.margins_)


@pytest.mark.slow
def test_classwise_scorer_picks_the_value_that_maximises_it():
    # Imbalanced classes: weak penalties favour the large classes' accuracy.
    X, y = _blobs(n=400, std=4.0)
    keep = (y != 3) | (np.arange(len(y)) % 5 == 0)
    X, y = X[keep], y[keep]
    Cs = np.logspace(-4, 1, 6)
    clf = MR2LinearClassifierCV(Cs, cv=3, scoring="worst_class", device="cpu").fit(X, y)
    worst = np.nanmin(clf.class_accuracy_path_, axis=2)  # (folds, Cs)
    np.testing.assert_allclose(clf.scores_[0], worst)
    assert clf.C_ == Cs[np.argmax(worst.sum(0))]
    # The scorer saw the model's own held-out predictions.
    train, test = _folds(y)[0]
    cold = MR2LinearClassifier(C=Cs[2], device="cpu").fit(X[train], y[train])
    folds = MR2LinearClassifierCV(Cs, cv=_folds(y), scoring="worst_class", device="cpu")
    folds.fit(X, y)
    assert folds.scores_[0][0, 2] == pytest.approx(
        worst_class_accuracy(y[test], cold.predict(X[test])), abs=1e-9
    )


@pytest.mark.parametrize("peak", [1.3, -5.9, 5.96, 0.0])
def test_bisection_finds_the_peak_of_a_unimodal_curve(peak):
    calls = []

    def evaluate(values):
        assert np.all(np.diff(values) > 0)
        calls.append(len(values))
        return -((np.log10(values) - peak) ** 2)

    values, scores = bisect_search(evaluate, np.arange(-6.0, 7.0, 2.0))
    assert np.all(np.diff(values) > 0) and len(values) == sum(calls) <= 15
    best = np.log10(values[np.argmax(scores)])
    assert abs(best - peak) <= 1 / 16 + 1e-9
    assert np.allclose(np.diff(np.log10(values)).min(), 1 / 8)


def test_bisection_refines_around_the_best_score_not_a_nan():
    # A NaN score (a scorer undefined where the model predicts one class) compared greater
    # than nothing, so the first value stayed the best and every halving was spent there.
    def evaluate(values):
        log10 = np.log10(values)
        return np.where(log10 < -5, np.nan, -((log10 - 0.3) ** 2))

    values, scores = bisect_search(evaluate, np.arange(-6.0, 7.0, 2.0))
    assert abs(np.log10(values[np.nanargmax(scores)]) - 0.3) <= 1 / 16 + 1e-9
    assert np.log10(values).tolist()[:2] == [-6.0, -4.0]  # nothing refined near the NaN


def test_bisection_refines_around_the_smallest_of_tied_best_values():
    # A plateau of equal scores (accuracy ties often): the halvings go to its smallest
    # value, as argmax along a grid does, not to its largest.
    def evaluate(values):
        return np.where(np.abs(np.log10(values)) <= 2.5, 1.0, 0.0)

    grid = np.arange(-6.0, 7.0, 2.0)
    values, _ = bisect_search(evaluate, grid)
    refined = np.setdiff1d(np.round(np.log10(values), 9), grid)
    assert len(refined) and (refined < 0).all()


@pytest.mark.slow
def test_bisect_searches_c_and_stores_what_it_evaluated(monkeypatch):
    import mr2_probe._cv as cv_module

    seen, real = [], cv_module.bisect_search

    def recording_search(evaluate, grid):
        def recording(new):
            scores = evaluate(new)
            seen.append((np.asarray(new, dtype=float), np.asarray(scores)))
            return scores

        return real(recording, grid)

    monkeypatch.setattr(cv_module, "bisect_search", recording_search)
    X, y = _blobs()
    clf = MR2LinearClassifierCV("bisect", cv=3, device="cpu").fit(X, y)
    assert 7 < len(clf.Cs_) <= 15 and np.all(np.diff(clf.Cs_) > 0)
    assert clf.Cs_[0] == pytest.approx(1e-6) and clf.Cs_[-1] == pytest.approx(1e6)
    assert clf.scores_[0].shape == (3, len(clf.Cs_))
    # It refines where the score averaged over the folds is best, the score it chooses by.
    assert sum(len(new) for new, _ in seen) == len(clf.Cs_)
    for new, scores in seen:
        np.testing.assert_allclose(scores, clf.scores_[0][:, np.searchsorted(clf.Cs_, new)].mean(0))


def test_cosine_head_searches_the_logit_scale():
    X, y = _blobs()
    clf = MR2LinearClassifierCV([1.0, 16.0], cv=3, head="cosine", device="cpu").fit(X, y)
    assert clf.scale_ == clf.C_
    norms = np.linalg.norm(clf.coef_, axis=1)
    np.testing.assert_allclose(norms, clf.C_)  # coef_ rows are scale × unit directions


@pytest.mark.parametrize("n_classes", [2, 4])
def test_a_cosine_refit_starts_on_its_device_under_another_default_device(n_classes):
    # torch.set_default_device("cuda") in a user's session ("meta" stands for it): the
    # refit's start from the folds' mean was made on that device, and failed on meta.
    X, y = _blobs(n_classes)
    expected = MR2LinearClassifierCV([1.0, 16.0], cv=3, head="cosine", device="cpu").fit(X, y)
    torch.set_default_device("meta")
    try:
        clf = MR2LinearClassifierCV([1.0, 16.0], cv=3, head="cosine", device="cpu").fit(X, y)
    finally:
        torch.set_default_device(None)
    np.testing.assert_array_equal(clf.coef_, expected.coef_)


def test_a_cosine_search_penalises_its_projection_with_c_one(monkeypatch):
    # The values searched are logit scales; the projection (lam > 0) has C = 1 along the
    # folds' paths and in the refit, as documented, not C = the scale.
    seen, real = [], MR2LinearClassifierCV._solve

    def recording_solve(self, head, data, solver, C, *args, **kwargs):
        seen.append((float(head.scale), float(C)))
        return real(self, head, data, solver, C, *args, **kwargs)

    monkeypatch.setattr(MR2LinearClassifierCV, "_solve", recording_solve)
    X, y = _blobs(n=120)
    search = MR2LinearClassifierCV([4.0, 16.0], cv=2, head="cosine", lam=0.5, max_iter=3,
                                   random_state=0, device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X, y)
    assert len(seen) == 2 * 2 + 1  # two folds' paths of two scales, then the refit
    assert {C for _, C in seen} == {1.0} and {scale for scale, _ in seen} == {4.0, 16.0}


def _current_attributes() -> dict:
    """LogisticRegressionCV's options for its current attributes and an L2-only path,
    where it has them (scikit-learn ≥ 1.8); none before."""
    if "use_legacy_attributes" not in LogisticRegressionCV().get_params():
        return {}
    return {"use_legacy_attributes": False, "l1_ratios": (0,)}


@pytest.mark.slow
@pytest.mark.parametrize("data", ["iris", "digits"])
def test_chooses_as_logistic_regression_cv(data):
    X, y = (load_iris if data == "iris" else load_digits)(return_X_y=True)
    if data == "digits":
        # Pixels in [0, 1]: scikit-learn's reference then reaches tol=1e-8 in about a
        # minute; on the raw 0..16 pixels with C up to 100 it takes many.
        X = X / 16
    Cs, cv = np.logspace(-3, 1, 5), StratifiedKFold(5, shuffle=True, random_state=0)
    ours = MR2LinearClassifierCV(Cs, cv=cv, c_bar=None, tol=1e-8, max_iter=3000, device="cpu")
    ref = LogisticRegressionCV(  # its folds in parallel: a minute on digits alone
        Cs=Cs, cv=cv, tol=1e-8, max_iter=20000, scoring="accuracy", n_jobs=-1,
        **_current_attributes(),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X, y)
        ref.fit(X, y)
    # scikit-learn's legacy attributes (before 1.8, or by default until 1.10) hold the same
    # values per class: C_ (n_classes,), scores_ {class: (n_folds, n_Cs)}.
    ref_C = float(np.ravel(ref.C_)[0])
    ref_scores = ref.scores_
    if isinstance(ref_scores, dict):
        ref_scores = next(iter(ref_scores.values()))
    ref_scores = np.asarray(ref_scores).reshape(cv.get_n_splits(), len(Cs))
    assert ours.C_ == ref_C
    # Equal but for a held-out sample whose prediction is a near-tie at some C.
    assert np.mean(ours.scores_[0] != ref_scores) <= 0.1
    np.testing.assert_allclose(ours.scores_[0], ref_scores, atol=1 / 350)
    # The tolerances of the LogisticRegression equivalence test.
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=5e-4)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=2e-3)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-4)


@pytest.mark.parametrize("refit", [True, False])
def test_tied_scores_choose_the_c_listed_first_as_logistic_regression_cv(refit):
    # Cs_ is sorted, and ties went to its smallest C: with Cs listed from weak to strong
    # (three of four tied on iris) it chose C = 1 where LogisticRegressionCV takes the
    # first listed, 10⁴ (refit=False: 34 against 6667, the mean of each fold's choice).
    X, y = load_iris(return_X_y=True)
    Cs = [1e4, 1e2, 1.0, 1e-2]
    ours = MR2LinearClassifierCV(Cs, cv=3, c_bar=None, refit=refit, device="cpu")
    ref = LogisticRegressionCV(
        Cs=Cs, cv=3, refit=refit, scoring="accuracy", **_current_attributes()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X, y)
        ref.fit(X, y)
    scores = np.asarray(
        next(iter(ref.scores_.values())) if isinstance(ref.scores_, dict) else ref.scores_
    )

    def first_listed(row):  # row: scores in Cs_'s order (increasing)
        return next(C for C in Cs if row[list(ours.Cs_).index(C)] == row.max())

    summed = ours.scores_[0].sum(0)  # over the folds
    folds = [first_listed(row) for row in ours.scores_[0]]
    assert ours.C_ == pytest.approx(first_listed(summed) if refit else np.mean(folds))
    # LogisticRegressionCV ties alike with scikit-learn ≥ 1.7; 1.6.1's (with scipy 1.11)
    # gets one more held-out sample right at C = 100, a sample on the boundary, and no tie.
    if np.all(summed == scores.reshape(3, -1).sum(0)[::-1]):
        assert ours.C_ == float(np.ravel(ref.C_)[0])


@pytest.mark.parametrize("block", [None, 64])
@pytest.mark.slow
def test_hdf5_folds_with_unsorted_held_out_rows_score_like_memory(tmp_path, monkeypatch, block):
    # ShuffleSplit's held-out indices are not sorted: the rows were read sorted while the
    # labels kept the split's order, and the scores fell to chance. With blocks of 64 rows
    # the held-out rows are read from several blocks of the store.
    h5py = pytest.importorskip("h5py")
    from sklearn.model_selection import ShuffleSplit

    from mr2_probe import _fit_inputs

    if block is not None:
        monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: block)

    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16, y[:600]
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X
    cv = ShuffleSplit(3, test_size=0.3, random_state=0)
    common = dict(Cs=[0.01, 1.0, 100.0], cv=cv, device="cpu")
    memory = MR2LinearClassifierCV(**common).fit(X, y)
    with h5py.File(tmp_path / "x.h5", "r") as f:
        stored = MR2LinearClassifierCV(**common).fit(f["X"], y)
    np.testing.assert_allclose(stored.scores_[0], memory.scores_[0], atol=0.01)
    assert stored.scores_[0].mean() > 0.8


@pytest.mark.slow
def test_hdf5_held_out_rows_are_never_held_whole(tmp_path, monkeypatch):
    # Every fold kept its held-out rows on the device for the whole search: together, the
    # whole store, however large.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _data, _fit_inputs

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 64)
    shapes = []
    original = _data.to_tensor

    def spy(a, *args, **kwargs):
        tensor = original(a, *args, **kwargs)
        if tensor.ndim == 2:
            shapes.append(tuple(tensor.shape))
        return tensor

    monkeypatch.setattr(_data, "to_tensor", spy)
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16, y[:600]
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X
    common = dict(Cs=[0.01, 1.0], cv=3, device="cpu")
    with h5py.File(tmp_path / "x.h5", "r") as f:
        stored = MR2LinearClassifierCV(**common).fit(f["X"], y)
    assert shapes and max(rows for rows, _ in shapes) <= 64
    memory = MR2LinearClassifierCV(**common).fit(X, y)
    np.testing.assert_allclose(stored.scores_[0], memory.scores_[0], atol=0.01)


@pytest.mark.parametrize("one_batch", [True, False])
def test_a_large_c_bar_is_searched_as_the_same_problem_at_c_bar_one(one_batch):
    # The batched L-BFGS tested the gradient in W, c̄ times smaller than at c̄ = 1 with
    # C / c̄²: at c̄ = 1e4 every fold stopped at its start (zeros, n_iter_ 0, no warning).
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16, y[:600]
    searches = []
    for c_bar, Cs in [(1e4, [1.0, 100.0]), (1.0, [1e-8, 1e-6])]:
        search = MR2LinearClassifierCV(c_bar=c_bar, Cs=Cs, cv=3, device="cpu")
        search._batch_folds = one_batch
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            searches.append(search.fit(X, y))
    large, one = searches
    assert (large.n_iter_ > 0).all()
    paths, expected = large.coefs_paths_[0] / 1e4, one.coefs_paths_[0]
    # Weights near 1e-7 at C = 1e-8, intercepts (the last column) near 0.05.
    weights = np.abs(expected[..., :-1]).max()
    np.testing.assert_allclose(paths, expected, rtol=1e-2, atol=1e-2 * weights)
    np.testing.assert_array_equal(large.scores_[0], one.scores_[0])


@pytest.mark.parametrize("one_batch", [True, False])
def test_a_large_c_bar_folds_warnings_give_the_gradient_tested_against_tol(one_batch):
    # A batched fold's largest gradient is reported in fit_lbfgs's units, c̄ times the
    # gradient in W, the one tested against tol: in W's it read "8e-08 > tol=1e-07".
    import re

    X, y = load_digits(return_X_y=True)
    X, y = (X[:600] / 16).astype(np.float32), y[:600]  # float32 stalls short of tol
    search = MR2LinearClassifierCV(c_bar=1e3, Cs=[10.0], cv=2, tol=1e-7, device="cpu")
    search._batch_folds = one_batch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        search.fit(X, y)
    pattern = r"largest gradient entry of (\S+) > tol=1e-07"
    reported = [float(g) for w in caught for g in re.findall(pattern, str(w.message))]
    assert len(reported) >= 2 and min(reported) > 1e-7, reported


def test_an_hdf5_fold_without_held_out_rows_is_named_as_in_memory(tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = load_digits(return_X_y=True)
    X, y = X[:200] / 16, y[:200]
    index = np.arange(len(y))
    params = dict(Cs=[0.1, 1.0], cv=[(index[::2], index[1::2]), (index, index[:0])])
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X
    with pytest.raises(ValueError) as memory:
        MR2LinearClassifierCV(**params, device="cpu").fit(X, y)
    with h5py.File(tmp_path / "x.h5", "r") as f, pytest.raises(ValueError) as stored:
        MR2LinearClassifierCV(**params, device="cpu").fit(f["X"], y)
    assert str(stored.value) == str(memory.value)


def test_groups_of_a_closed_hdf5_file_are_named(tmp_path):
    # sample_weight was named; groups reached the splitter, and h5py's "Unable to
    # synchronously get dataspace (identifier is not of specified type)", a RuntimeError.
    h5py = pytest.importorskip("h5py")
    X, y = load_iris(return_X_y=True)
    with h5py.File(tmp_path / "g.h5", "w") as f:
        groups = f.create_dataset("groups", data=np.arange(len(y)) % 5)
    search = MR2LinearClassifierCV([1.0], cv=GroupKFold(5), device="cpu")
    with pytest.raises(ValueError, match="^groups is a dataset of an HDF5 file that is closed"):
        search.fit(X, y, groups=groups)


def test_a_store_closed_during_the_search_is_named(tmp_path):
    # A scorer that closes the store (a callback, another thread) left the next value's
    # read with h5py's "Can't synchronously read data (identifier is not of specified
    # type)", an OSError naming neither the store nor the cure.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=120)
    f = h5py.File(tmp_path / "x.h5", "w")
    dataset = f.create_dataset("X", data=X.astype(np.float32))

    def closing(estimator, X_held, y_held):
        f.close()
        return 0.5

    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, scoring=closing, device="cpu")
    with pytest.raises(ValueError, match="HDF5 dataset was closed while it was read"):
        search.fit(dataset, y)


def test_group_splitters_get_their_groups():
    from sklearn.model_selection import GroupKFold

    X, y = load_iris(return_X_y=True)
    groups = np.arange(len(y)) % 5
    common = dict(Cs=[0.1, 10.0], device="cpu")
    search = MR2LinearClassifierCV(cv=GroupKFold(5), **common).fit(X, y, groups=groups)
    folds = list(GroupKFold(5).split(X, y, groups))
    same = MR2LinearClassifierCV(cv=folds, **common).fit(X, y)
    np.testing.assert_array_equal(search.scores_[0], same.scores_[0])
    with pytest.raises(ValueError, match="'groups' parameter should not be None"):
        MR2LinearClassifierCV(cv=GroupKFold(5), **common).fit(X, y)


def test_a_splitter_that_reads_x_gets_it():
    # It was given a placeholder without columns (IndexError); scikit-learn's searches
    # give a splitter the X they were given.
    from sklearn.model_selection import BaseCrossValidator

    class ByFeature(BaseCrossValidator):
        def get_n_splits(self, X=None, y=None, groups=None):
            return 2

        def _iter_test_masks(self, X, y=None, groups=None):
            long = np.asarray(X)[:, 0] > 5.8
            yield from (long, ~long)

    X, y = load_iris(return_X_y=True)
    common = dict(Cs=[0.1, 10.0], device="cpu")
    search = MR2LinearClassifierCV(cv=ByFeature(), **common).fit(X, y)
    same = MR2LinearClassifierCV(cv=list(ByFeature().split(X, y)), **common).fit(X, y)
    np.testing.assert_array_equal(search.scores_[0], same.scores_[0])


@pytest.mark.parametrize("batch", [True, False])
def test_paths_without_an_intercept_keep_each_value_s_solution(batch, monkeypatch):
    # Without an intercept the stored coefficients were views of the solver's parameters:
    # every value of the path held the last one's solution.
    X, y = load_iris(return_X_y=True)
    if not batch:
        monkeypatch.setattr(MR2LinearClassifierCV, "_batches_folds", lambda *a: False)
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    search = MR2LinearClassifierCV(Cs=[0.01, 100.0], cv=cv, fit_intercept=False, device="cpu")
    search.fit(X, y)
    train = next(cv.split(X, y))[0]
    small = MR2LinearClassifier(C=0.01, fit_intercept=False, device="cpu").fit(X[train], y[train])
    path = search.coefs_paths_[0][0]  # class 0, fold 0: (Cs, n_features)
    assert not np.allclose(path[0], path[1])
    np.testing.assert_allclose(path[0], small.coef_[0], atol=1e-3)


@pytest.mark.parametrize("batch_folds", [True, False])
@pytest.mark.parametrize("head, Cs", [("linear", [0.1, 1.0]), ("cosine", [8.0, 32.0])])
@pytest.mark.slow
def test_an_hdf5_search_computes_what_the_array_s_does(
    tmp_path, monkeypatch, head, Cs, batch_folds
):
    # The store's folds were fitted one by one on all its rows (held-out ones weighted
    # zero), the array's by the batched L-BFGS on their own: solutions within tol of each
    # other, coef_ 5e-3 apart on digits / 16 and, with Cs="bisect", another C chosen. The
    # store is read in blocks of whole chunks, fewer rows than the batched folds' blocks.
    h5py = pytest.importorskip("h5py")
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = load_digits(return_X_y=True)
    X, y = (X[:400] / 16).astype(np.float32), y[:400]
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(50, 64))
    params = dict(Cs=Cs, cv=3, head=head, c_bar=None, device="cpu")
    memory = MR2LinearClassifierCV(**params).fit(X, y)
    with h5py.File(tmp_path / "x.h5", "r") as f:
        stored = MR2LinearClassifierCV(**params).fit(f["X"], y)
    assert stored.C_ == memory.C_
    np.testing.assert_array_equal(stored.scores_[0], memory.scores_[0])
    np.testing.assert_array_equal(stored.coefs_paths_[0], memory.coefs_paths_[0])
    np.testing.assert_allclose(stored.coef_, memory.coef_, rtol=1e-6, atol=1e-7)


def test_an_hdf5_search_of_integers_computes_in_float64_as_the_array_s(tmp_path):
    # check_array computes an array of integers in float64; the same rows as an HDF5
    # dataset were searched in float32: a float32 model, other paths and coef_.
    h5py = pytest.importorskip("h5py")
    X, y = load_digits(return_X_y=True)
    X, y = X[:300].astype(np.uint8), y[:300]  # (int16 and others: test_classifier.py)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(50, 64))
    params = dict(Cs=[0.001, 0.01], cv=3, device="cpu")
    memory = MR2LinearClassifierCV(**params).fit(X, y)
    with h5py.File(tmp_path / "x.h5", "r") as f:
        stored = MR2LinearClassifierCV(**params).fit(f["X"], y)
        np.testing.assert_array_equal(stored.predict_proba(f["X"]), memory.predict_proba(X))
    assert stored.coef_.dtype == memory.coef_.dtype == np.float64
    assert stored.C_ == memory.C_
    np.testing.assert_array_equal(stored.scores_[0], memory.scores_[0])
    np.testing.assert_array_equal(stored.coefs_paths_[0], memory.coefs_paths_[0])
    np.testing.assert_array_equal(stored.coef_, memory.coef_)


@pytest.mark.parametrize("head, Cs", [("linear", [0.1, 10.0]), ("cosine", [4.0, 16.0])])
@pytest.mark.parametrize("lam, solver", [(0.1, "auto"), (0.0, "adam")])
@pytest.mark.slow
def test_an_hdf5_search_by_minibatches_computes_what_the_array_s_does(
    tmp_path, head, Cs, lam, solver
):
    # A projection (lam > 0) or a minibatch solver fits each fold on its own rows: a store's
    # folds were fitted on all its rows, the held-out ones weighted zero, in other batches
    # and sums (coef_ 0.49 apart on digits / 16 at lam=0.1, max_iter=50). A fold's rows are
    # read from the file in the order and blocks of the same rows in memory, and one buffer
    # holds them here: the same batches too.
    h5py = pytest.importorskip("h5py")
    X, y = load_digits(return_X_y=True)
    X, y = (X[:300] / 16).astype(np.float32), y[:300]
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(50, 64))
    params = dict(Cs=Cs, cv=3, head=head, lam=lam, solver=solver, max_iter=4, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        memory = MR2LinearClassifierCV(**params, device="cpu").fit(X, y)
        with h5py.File(tmp_path / "x.h5", "r") as f:
            stored = MR2LinearClassifierCV(**params, device="cpu").fit(f["X"], y)
    assert stored.C_ == memory.C_
    np.testing.assert_array_equal(stored.scores_[0], memory.scores_[0])
    np.testing.assert_array_equal(stored.coefs_paths_[0], memory.coefs_paths_[0])
    np.testing.assert_array_equal(stored.coef_, memory.coef_)


def test_a_nan_that_no_fold_trains_on_fails_a_store_s_minibatch_search_at_once(tmp_path):
    # A minibatch search's folds read their own training rows alone: a NaN in a row that
    # none trains on was found at the refit, after every fold's path was fitted and scored.
    h5py = pytest.importorskip("h5py")
    X, y = load_iris(return_X_y=True)
    X[0, 1] = np.nan
    cv = [(np.arange(50, 150), np.arange(0, 50)), (np.arange(25, 150), np.arange(0, 25))]
    scored = []

    def scoring(estimator, X_held, y_held):
        scored.append(len(y_held))
        return 0.5

    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X)
    search = MR2LinearClassifierCV([1.0], cv=cv, solver="adam", max_iter=2, scoring=scoring)
    with h5py.File(tmp_path / "x.h5", "r") as f, pytest.raises(ValueError, match="contains NaN"):
        search.set_params(device="cpu").fit(f["X"], y)
    assert not scored


@pytest.mark.slow
def test_an_hdf5_cosine_search_measures_held_out_norms_once(tmp_path, monkeypatch):
    # The batched folds' held-out rows of a store had their norms measured again at each
    # scale, those in memory once: once per fold now, the same numbers.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _batched

    measured = []
    original = _batched.inverse_row_norms

    def spy(x):
        measured.append(len(x))
        return original(x)

    monkeypatch.setattr(_batched, "inverse_row_norms", spy)
    X, y = load_digits(return_X_y=True)
    X, y = (X[:300] / 16).astype(np.float32), y[:300]
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X)
    counts = []
    for Cs in ([8.0], [8.0, 16.0, 32.0]):
        params = dict(Cs=Cs, cv=3, head="cosine", c_bar=None, max_iter=5, device="cpu")
        measured.clear()
        with warnings.catch_warnings(), h5py.File(tmp_path / "x.h5", "r") as f:
            warnings.simplefilter("ignore", ConvergenceWarning)
            stored = MR2LinearClassifierCV(**params).fit(f["X"], y)
            counts.append(sum(measured))
            memory = MR2LinearClassifierCV(**params).fit(X, y)
        np.testing.assert_array_equal(stored.scores_[0], memory.scores_[0])
        np.testing.assert_array_equal(stored.coefs_paths_[0], memory.coefs_paths_[0])
    assert counts[0] == counts[1]


@pytest.mark.slow
def test_hdf5_input_is_read_in_blocks_and_matches_memory(tmp_path, monkeypatch):
    h5py = pytest.importorskip("h5py")
    X, y = _blobs()
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(16, 6))
    reads = []
    original = h5py.Dataset.__getitem__

    def spy(self, key):
        block = original(self, key)
        reads.append(np.shape(block)[0])
        return block

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    monkeypatch.setattr("mr2_probe._fit_inputs.block_rows", lambda d, k: 64)
    params = dict(Cs=[0.1, 1.0], cv=3, tol=1e-6, max_iter=1000, device="cpu")
    with h5py.File(tmp_path / "x.h5", "r") as f:
        stored = MR2LinearClassifierCV(**params).fit(f["X"], y)
    memory = MR2LinearClassifierCV(**params).fit(X, y)
    assert max(reads) < len(X)
    np.testing.assert_allclose(stored.scores_[0], memory.scores_[0])
    np.testing.assert_allclose(stored.coef_, memory.coef_, atol=1e-4)  # both within tol


@pytest.mark.parametrize(
    "params, error, match",
    [
        (
            dict(Cs=[0.1, -1.0]),
            ValueError,
            r"non-empty 1-D array of positive C values \(np.inf: no penalty\)",
        ),
        (dict(Cs=[]), ValueError, "'Cs' parameter"),
        (dict(Cs=[1.0, np.nan]), ValueError, "positive C values"),
        # Strings were read as numbers ("a" failed in NumPy's words), booleans as 0 and 1.
        (dict(Cs=["0.1", "1"]), ValueError, r"positive C values .* Got \['0.1', '1'\]"),
        (dict(Cs=["a"]), ValueError, "positive C values"),
        (dict(Cs=[True, True]), ValueError, "positive C values"),
        (dict(Cs=[1.0, np.inf], head="cosine"), ValueError, "positive, finite logit scales"),
        (dict(Cs=[1.0], head="cosine"), None, None),
        (dict(Cs="grid"), InvalidParameterError, "'Cs' parameter of MR2LinearClassifierCV"),
        (dict(Cs=0), InvalidParameterError, "'Cs' parameter"),
        (dict(cv="five"), InvalidParameterError, "'cv' parameter"),
        (dict(scoring="worst"), InvalidParameterError, "'scoring' parameter"),
        (dict(refit=False, head="cosine", lam=0.5), ValueError, "refit=False"),
    ],
)
def test_bad_parameters_are_named(params, error, match):
    X, y = _blobs()
    clf = MR2LinearClassifierCV(**{"cv": 3, "device": "cpu", "max_iter": 20, **params})
    if error is None:
        clf.fit(X, y)
        return
    with pytest.raises(error, match=match):
        clf.fit(X, y)


def test_a_scale_or_a_weight_sum_beyond_the_features_dtype_is_refused():
    # A logit scale beyond float32's range was searched: NaN and inf coefficients in
    # coefs_paths_, scored at chance (and scikit-learn's bare NaN error for log loss).
    # Weights whose sum overflows float32 are named (before any fit, as in a single fit)
    # for a linear head; a cosine head's objective ignores their scale, and takes them.
    X, y = _blobs()
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    search = MR2LinearClassifierCV(Cs=[8.0, 1e39], cv=3, head="cosine", device="cpu")
    with pytest.raises(ValueError, match=r"logit scale 1e\+39, beyond the range of float32"):
        search.fit(X, y)
    huge = np.full(len(y), 1e37)
    search.set_params(Cs=[8.0], head="linear")
    with pytest.raises(ValueError, match="with sample weights summing to"):
        search.fit(X, y, sample_weight=huge)
    search.set_params(head="cosine")
    unit = search.fit(X, y).coef_
    np.testing.assert_allclose(search.fit(X, y, sample_weight=huge).coef_, unit, rtol=1e-6)
    with warnings.catch_warnings():  # in float64, 1e39 is a scale like another
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.set_params(Cs=[8.0, 1e39]).fit(X.astype(np.float64), y)
    assert np.isfinite(search.coef_).all()


def _spy_batched(monkeypatch):
    import mr2_probe._batched as batched

    calls = []
    original = batched.lbfgs_batched

    def spy(batch, *args, **kwargs):
        calls.append(batch.n_folds)
        return original(batch, *args, **kwargs)

    monkeypatch.setattr(batched, "lbfgs_batched", spy)
    return calls


@pytest.mark.parametrize(
    "params",
    [
        dict(c_bar=None),
        pytest.param(dict(c_bar=2.0, class_weight="balanced"), marks=pytest.mark.slow),
    ],
)
def test_folds_solved_as_one_batched_problem_give_the_per_fold_path(params, monkeypatch):
    X, y = _blobs(n_classes=5, n=300)
    X = StandardScaler().fit_transform(X)
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    common = dict(Cs=[0.01, 0.3, 10.0], cv=4, tol=1e-8, max_iter=1000, device="cpu", **params)
    calls = _spy_batched(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        batched = MR2LinearClassifierCV(**common).fit(X, y, sample_weight=weight)
        assert calls == [4, 4, 4]  # one batched solve of the 4 folds per C
        monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", False)
        per_fold = MR2LinearClassifierCV(**common).fit(X, y, sample_weight=weight)
    assert calls == [4, 4, 4] + [1] * 12  # then each fold alone, on its training rows
    assert batched.C_ == per_fold.C_
    np.testing.assert_allclose(batched.scores_[0], per_fold.scores_[0], atol=1e-6)
    np.testing.assert_allclose(batched.coefs_paths_[0], per_fold.coefs_paths_[0], atol=1e-4)
    np.testing.assert_allclose(
        batched.class_accuracy_path_, per_fold.class_accuracy_path_, atol=1e-12
    )
    np.testing.assert_allclose(batched.coef_, per_fold.coef_, atol=1e-4)


@pytest.mark.parametrize(
    "params",
    [dict(head="cosine", Cs=[2.0, 8.0]), dict(Cs=[0.1, 1.0]), dict(Cs=[0.1, 1.0], class_tilt=1.0)],
)
def test_the_batched_path_in_blocks_of_rows_is_the_path_in_one(params, monkeypatch):
    # Each block takes its own rows' norms, margins and weights, wherever it starts.
    import mr2_probe._batched as batched

    X, y = _blobs(n=200)
    X = X + 3.0  # rows of different norms
    # (The same steps either way, whether or not they reach tol: 30 of them.)
    common = dict(cv=3, refit=False, tol=1e-6, max_iter=30, device="cpu", **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        whole = MR2LinearClassifierCV(**common).fit(X, y)
        monkeypatch.setattr(batched, "block_rows", lambda n_features, n_classes: 64)
        blocks = MR2LinearClassifierCV(**common).fit(X, y)
    np.testing.assert_allclose(blocks.scores_[0], whole.scores_[0])
    np.testing.assert_allclose(blocks.coefs_paths_[0], whole.coefs_paths_[0], atol=1e-6)


@pytest.mark.slow
def test_folds_solved_one_by_one_hold_one_copy_of_training_rows_at_a_time(monkeypatch):
    import mr2_probe._batched as batched

    X, y = _blobs(n_classes=5, n=300)
    X = StandardScaler().fit_transform(X)
    folds = _folds(y)
    seen, holding = [], []
    original = batched.lbfgs_batched

    def spy(batch, *args, **kwargs):
        if all(batch is not other for other in seen):
            seen.append(batch)
        holding.append([len(other.X) for other in seen])
        return original(batch, *args, **kwargs)

    monkeypatch.setattr(batched, "lbfgs_batched", spy)
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", False)
    clf = MR2LinearClassifierCV("bisect", cv=folds, device="cpu").fit(X, y)
    assert len(seen) == 3
    for sizes in holding:  # the fold solving holds its training rows, the others none
        assert sorted(sizes)[:-1] == [0] * (len(sizes) - 1)
        assert max(sizes) in {len(train) for train, _ in folds}
    assert all(len(batch.X) == 0 for batch in seen)
    assert len(clf.Cs_) > 7  # the bisection ran each fold's path more than once


def test_a_batched_fold_short_of_tol_warns_as_a_fit_does(monkeypatch):
    X, y = _blobs(n_classes=5, n=300)
    calls = _spy_batched(monkeypatch)
    with pytest.warns(ConvergenceWarning, match="did not converge in max_iter=3 iterations"):
        cv = MR2LinearClassifierCV(Cs=[1.0], cv=3, tol=1e-10, max_iter=3, device="cpu").fit(X, y)
    assert calls == [3]
    assert (cv.n_iter_ == 3).all()


@pytest.mark.cuda
@pytest.mark.parametrize("batch_folds", [True, False])
def test_cuda_search_chooses_as_the_cpu_one(batch_folds, monkeypatch):
    """On a GPU the folds are batched by default; either way the choice is the CPU's."""
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    params = dict(Cs=[0.01, 0.1, 1.0, 10.0], cv=3, tol=1e-5, max_iter=500, c_bar=None)
    calls = _spy_batched(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cpu = MR2LinearClassifierCV(device="cpu", **params).fit(X, y)
        monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
        calls.clear()
        gpu = MR2LinearClassifierCV(device="cuda", **params).fit(X, y)
    assert calls == ([3] * 4 if batch_folds else [1] * 12)
    assert gpu.C_ == cpu.C_
    np.testing.assert_allclose(gpu.scores_[0], cpu.scores_[0], atol=0.01)
    assert np.mean(gpu.predict(X) == cpu.predict(X)) > 0.99


def test_batched_folds_without_intercept_give_the_per_fold_path(monkeypatch):
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    common = dict(Cs=[0.1, 1.0, 10.0], cv=3, fit_intercept=False, tol=1e-8, max_iter=1000)
    calls = _spy_batched(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        batched = MR2LinearClassifierCV(device="cpu", **common).fit(X, y)
        monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", False)
        per_fold = MR2LinearClassifierCV(device="cpu", **common).fit(X, y)
    assert calls == [3, 3, 3] + [1] * 9
    assert batched.coefs_paths_[0].shape == per_fold.coefs_paths_[0].shape == (3, 3, 4)
    assert batched.C_ == per_fold.C_
    np.testing.assert_allclose(batched.scores_[0], per_fold.scores_[0])
    np.testing.assert_allclose(batched.coefs_paths_[0], per_fold.coefs_paths_[0], atol=1e-4)
    assert (batched.intercept_ == 0).all()


def test_a_fold_without_training_weight_is_refused():
    X, y = _blobs()
    weight = np.ones(len(y))
    folds = _folds(y)
    weight[folds[1][0]] = 0
    with pytest.raises(ValueError, match="training rows of fold 1 have no sample weight"):
        MR2LinearClassifierCV(Cs=[1.0], cv=folds, device="cpu").fit(X, y, sample_weight=weight)
    # Held out, such rows failed after every path was fitted, in scikit-learn's words
    # ("Sample weights must contain at least one non-zero number"), naming no fold.
    weight = np.ones(len(y))
    weight[folds[2][1]] = 0
    with pytest.raises(
        ValueError, match="held-out rows of fold 2 have no sample weight: no candidate can be sc"
    ):
        MR2LinearClassifierCV(Cs=[1.0], cv=folds, device="cpu").fit(X, y, sample_weight=weight)

    # A scorer that takes no sample_weight counts every held-out row: it can score them (it
    # was refused with the message above).
    def accuracy(y_true, y_pred):
        return np.mean(y_true == y_pred)

    search = MR2LinearClassifierCV(Cs=[1.0], cv=folds, scoring=make_scorer(accuracy), device="cpu")
    unweighted = search.fit(X, y, sample_weight=weight).scores_[1][2, 0]
    # Fold 2's fits are those of weights 1 on its held-out rows (they are not trained on).
    assert unweighted == search.fit(X, y, sample_weight=np.ones(len(y))).scores_[1][2, 0]
    # A class weighted zero weighs nothing in the fits, but the scorers count its samples.
    only_0 = [(np.flatnonzero(y != 0), np.flatnonzero(y == 0)), *folds[1:]]
    search = MR2LinearClassifierCV(Cs=[1.0], cv=only_0, class_weight={0: 0.0}, device="cpu")
    assert search.fit(X, y).scores_[1][0, 0] == 0.0  # every held-out sample of class 0 missed
    # An empty part (an empty list became a float index, and crashed the check).
    for empty in ([(folds[0][0], [])], [([], folds[0][1])]):
        with pytest.raises(ValueError, match="^Fold 0 of the cv has no (held-out|training) rows"):
            MR2LinearClassifierCV(Cs=[1.0], cv=empty, device="cpu").fit(X, y)


@pytest.mark.parametrize("batch_folds", [True, False])
def test_a_fold_stalled_by_an_extreme_parameter_names_it(batch_folds):
    # The batched folds' warnings read "Use a larger tol" where the refit's named c_bar.
    # (c_bar=1e-30, which stalled too, is fitted since: as features of scale 10³⁰.)
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=[1.0], c_bar=1e-300, cv=3, device="cpu")
    search._batch_folds = batch_folds
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        search.fit(X, y)
    messages = [str(w.message) for w in caught if w.category is ConvergenceWarning]
    assert len(messages) >= 2  # folds and the refit
    assert all("too steep to resolve: c_bar=1e-300 (the margins" in m for m in messages)


@pytest.mark.parametrize(
    "first, then, dtype, intercept",
    [
        (0.1, 3.0, "float64", True),
        (3.0, 0.01, "float64", True),
        (3.0, 0.01, "float64", False),
        (0.01, 3.0, "float32", True),
    ],
)
def test_batched_lbfgs_memory_carried_to_another_c_gives_its_solution(
    first, then, dtype, intercept
):
    """The pairs of one C, corrected for the change of penalty, serve the next, up or
    down the path (as a bisection moves), and the objective and gradient where the last
    solve ended replace the first evaluation: the solution of a cold start."""

    from mr2_probe._batched import FoldBatch, Memory, lbfgs_batched

    X, y = _blobs(n_classes=5, n=300, std=5.0)
    X = torch.as_tensor(StandardScaler().fit_transform(X), dtype=getattr(torch, dtype))
    y = torch.as_tensor(y)
    weight = torch.ones(2, len(y), dtype=X.dtype)
    weight[0, :100] = weight[1, 100:200] = 0
    weight[1, 200:] = 2.0
    center = torch.stack([X[w > 0].mean(0) for w in weight]) if intercept else None
    batch = FoldBatch(X, y, weight, torch.ones(2, 5, dtype=X.dtype), center, 5)
    tol = 1e-7 if dtype == "float64" else 1e-4
    params = X.new_zeros(2, batch.n_params)
    memory = Memory.empty(params, 10)
    lbfgs_batched(batch, params, first, max_iter=500, tol=tol, memory=memory)
    assert (memory.rho != 0).any()
    calls = []
    original = batch.evaluate
    batch.evaluate = lambda *args: calls.append(args[0].clone()) or original(*args)
    start = params.clone()
    carried = lbfgs_batched(batch, params, then, max_iter=500, tol=tol, memory=memory)
    assert calls and not any(torch.equal(point, start) for point in calls)
    batch.evaluate = original
    cold_params = X.new_zeros(2, batch.n_params)
    cold = lbfgs_batched(batch, cold_params, then, max_iter=1000, tol=tol)
    assert carried.stop == cold.stop == ["tol", "tol"]
    everyone = torch.arange(2)
    value, grad = batch.evaluate(params, everyone, then)
    cold_value, _ = batch.evaluate(cold_params, everyone, then)
    assert grad.abs().max() <= tol
    # The memory's objective and gradient are those of an evaluation at its point.
    torch.testing.assert_close(
        memory.value, value, atol=0, rtol=1e-5 if dtype == "float32" else 1e-12
    )
    torch.testing.assert_close(
        memory.grad, grad, atol=10 * tol if dtype == "float32" else 1e-12, rtol=0
    )
    torch.testing.assert_close(
        value, cold_value, atol=0, rtol=1e-10 if dtype == "float64" else 1e-5
    )
    # float32: coefficients within 2e-2 where the objectives agree to 1e-5 (flat directions).
    torch.testing.assert_close(
        params, cold_params, atol=1e-4 if dtype == "float64" else 2e-2, rtol=0
    )


def test_line_search_steps_are_exact_on_a_quadratic():
    """φ(t) = (t − 3)² − 9 (φ(0) = 0, φ'(0) = −6): a step too long (t = 8) and one too
    short (t = 1) both lead to t = 3, inside the bracket or beyond it; a NaN evaluation
    halves the bracket or doubles the step."""

    from mr2_probe._batched import _next_step

    def phi(t):
        return (t - 3) ** 2 - 9

    def slope(t):
        return 2 * (t - 3)

    t = torch.tensor([8.0, 1.0, 1.0])
    long = torch.tensor([True, False, False])
    low = torch.tensor([0.0, 1.0, 1.0])
    high = torch.tensor([8.0, 8.0, float("inf")])
    new = _next_step(t, torch.tensor(-6.0), torch.tensor(0.0), phi(t), slope(t), long, low, high)
    torch.testing.assert_close(new, torch.tensor([3.0, 3.0, 3.0]))
    nan = torch.tensor([float("nan")] * 3)
    fallback = _next_step(t, torch.tensor(-6.0), torch.tensor(0.0), nan, nan, long, low, high)
    torch.testing.assert_close(fallback, torch.tensor([4.0, 4.5, 2.0]))


@pytest.mark.slow
def test_a_bisection_starts_each_value_from_the_nearest_solution(monkeypatch):
    import mr2_probe._batched as batched

    X, y = _blobs(n_classes=4)
    X = StandardScaler().fit_transform(X)
    starts = []
    original = batched.lbfgs_batched

    def spy(batch, params, C, **kwargs):
        starts.append((C, batch.coefficients(params.clone())))
        return original(batch, params, C, **kwargs)

    monkeypatch.setattr(batched, "lbfgs_batched", spy)
    # (max_iter: at C = 1e4 these blobs are nearly separable, and a fold took 100
    # iterations to tol = 1e-6 after the path's small C took their intercept's scale)
    clf = MR2LinearClassifierCV("bisect", cv=3, tol=1e-6, max_iter=300, device="cpu").fit(X, y)
    Cs = [C for C, _ in starts]
    assert sorted(Cs[:7]) == Cs[:7] and len(Cs) > 7  # the grid, then the midpoints
    paths = np.stack([clf.coefs_paths_[c] for c in clf.classes_], axis=2)  # (f, Cs, K, dof)
    for j, (C, (coef, intercept)) in enumerate(starts[1:], start=1):
        distance = np.abs(np.log(np.array(Cs[:j]) / C))
        nearest = np.array(Cs[:j])[np.isclose(distance, distance.min())]  # ties: either
        start = np.concatenate([coef.numpy(), intercept.numpy()[:, :, None]], axis=2)
        assert any(
            np.allclose(start, paths[:, np.argmin(np.abs(clf.Cs_ - v))], atol=1e-6) for v in nearest
        ), (C, nearest)


def _largest_gradient_entry(X, y, coef, C):
    """The stopping test's measure of multinomial logistic regression at C (c̄ = None,
    features of unit scale) at ``coef`` (K, d + 1), its intercept last: the largest entry
    of the gradient, computed in the original coordinates (W, b) by autograd, taken in
    those of the intercept re-parametrised around the feature mean, b' = b + W·m."""
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    W, b = (torch.tensor(part, requires_grad=True) for part in (coef[:, :-1], coef[:, -1]))
    loss = torch.nn.functional.cross_entropy(X @ W.T + b, y)
    loss = loss + 0.5 * W.square().sum() / (C * len(y))
    grad_w, grad_b = torch.autograd.grad(loss, (W, b))
    # ∂f/∂W at fixed b' is ∂f/∂W − (∂f/∂b)·mᵀ; ∂f/∂b' is ∂f/∂b.
    centred = grad_w - grad_b[:, None] * X.mean(0)
    return float(max(centred.abs().max(), grad_b.abs().max())), float(grad_b.abs().max())


@pytest.mark.parametrize("batch_folds", [True, False])
@pytest.mark.parametrize("times", [1.5, 0.5])  # tol, times the gradient at the start
def test_a_path_at_a_small_c_stops_as_the_gradient_in_the_original_coordinates_says(
    times, batch_folds, monkeypatch
):
    # At a small C·Σw the path takes its intercept in a larger scale (here 32 times that
    # of the features, the penalty's curvature dwarfing the intercept's), whose gradient
    # is as many times the intercept's own: the test on tol divides that growth out, as a
    # single fit's does. Nothing pinned it: tested on the scaled gradient, a fold whose
    # start met tol in the original coordinates iterated (n_iter_ 3 where it is 0), and
    # one that had met tol after 2 iterations made a third.
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [60, 30, 10])  # unequal classes: the intercept's gradient
    X = rng.normal(size=(100, 4)) + 0.1 * y[:, None]  # of unit scale (σ_b = 1)
    train = [np.arange(0, 100, 2), np.arange(1, 100, 2)]
    folds = [(rows, np.setdiff1d(np.arange(100), rows)) for rows in train]
    C = 1e-4  # C·Σw = 0.005
    start = [_largest_gradient_entry(X[rows], y[rows], np.zeros((3, 5)), C) for rows in train]
    assert all(largest == intercept for largest, intercept in start)  # the intercept's
    tol = times * start[0][0]

    def search(max_iter):
        return MR2LinearClassifierCV(
            [C], cv=folds, c_bar=None, refit=False, tol=tol, max_iter=max_iter, device="cpu"
        ).fit(X, y)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        n_iter = search(100).n_iter_[0, :, 0]  # (n_folds,)
    # Each fold stops at the first iteration where the gradient meets tol: the searches
    # cut short at max_iter=k (the same iterations, up to k) meet it from n_iter_ on.
    for k in range(n_iter.max() + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # (k < n_iter_)
            short = search(k)
        for f, rows in enumerate(train):
            coef = np.stack([short.coefs_paths_[c][f, 0] for c in short.classes_])  # (K, d + 1)
            largest, _ = _largest_gradient_entry(X[rows], y[rows], coef, C)
            assert (largest <= tol) == (k >= n_iter[f]), (k, f, largest, tol)


def test_batched_lbfgs_treats_a_nan_evaluation_as_a_step_too_long():

    from mr2_probe._batched import lbfgs_batched

    batch = _batched_two_folds(intercept=False)
    clean = batch.X.new_zeros(2, batch.n_params)
    expected = lbfgs_batched(batch, clean, 1.0, max_iter=200, tol=1e-6)
    _spoil_evaluations(batch, lambda n: n == 3, rows=0)  # fold 0's third one overflows
    params = batch.X.new_zeros(2, batch.n_params)
    result = lbfgs_batched(batch, params, 1.0, max_iter=200, tol=1e-6)
    assert result.stop == expected.stop == ["tol", "tol"]
    assert torch.isfinite(params).all()
    torch.testing.assert_close(params, clean, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "where, head, batch_folds",
    [
        ("memory", "linear", None),  # the folds' batched L-BFGS, one batch
        ("memory", "linear", False),  # the batched L-BFGS, a fold at a time
        ("hdf5", "linear", None),
        ("memory", "cosine", None),
        ("memory", "cosine", False),
        ("hdf5", "cosine", None),
    ],
)
def test_a_training_row_drawn_twice_counts_twice_as_in_a_fit(
    where, head, batch_folds, tmp_path, monkeypatch
):
    # Bootstrap-style folds repeat training rows: a fold is the fit on X[train], repeats
    # included, whatever the path solves it with.
    X, y = _blobs(n=120)
    X = StandardScaler().fit_transform(X)
    rng = np.random.default_rng(0)
    folds = []
    for _ in range(2):
        train = rng.choice(len(y), len(y), replace=True)
        folds.append((train, np.setdiff1d(np.arange(len(y)), train)))
    assert len(np.unique(folds[0][0])) < len(folds[0][0])
    value = 8.0 if head == "cosine" else 0.5
    common = dict(head=head, tol=1e-7, max_iter=1000, device="cpu")
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    search = MR2LinearClassifierCV([value], cv=folds, refit=False, **common)
    if where == "hdf5":
        h5py = pytest.importorskip("h5py")
        with h5py.File(tmp_path / "x.h5", "w") as f:
            f.create_dataset("X", data=X)
        with h5py.File(tmp_path / "x.h5", "r") as f:
            search.fit(f["X"], y)
    else:
        search.fit(X, y)
    searched = {"scale": value} if head == "cosine" else {"C": value}
    for f, (train, _) in enumerate(folds):
        cold = MR2LinearClassifier(**common, **searched).fit(X[train], y[train])
        path = np.stack([search.coefs_paths_[k][f, 0] for k in search.classes_])
        if head == "linear":
            np.testing.assert_allclose(path[:, :6], cold.coef_, atol=1e-4, rtol=1e-4)
            continue
        # The cosine head's minimisers need not be unique (here two at the same objective
        # to 1e-14, 0.11 apart): the path's is a minimiser of the fit's objective.
        Xn = X[train] / np.linalg.norm(X[train], axis=1, keepdims=True)
        labels, margins = torch.as_tensor(y[train]), torch.as_tensor(cold.margins_)
        ours, theirs = (
            float(margin_cross_entropy(torch.as_tensor(Xn @ coef.T), labels, margins))
            for coef in (path, cold.coef_)
        )
        assert ours == pytest.approx(theirs, rel=1e-7)


@pytest.mark.parametrize(
    "scoring",
    [
        "neg_log_loss",
        pytest.param(
            "neg_brier_score",
            marks=pytest.mark.skipif(
                SKLEARN < (1, 7),
                reason="scikit-learn scores the Brier loss of several classes from 1.7 on",
            ),
        ),
    ],
)
def test_probability_scorers_know_every_class_when_a_fold_lacks_one(scoring):
    # A class of 3 samples and 5 folds: some held-out folds do not hold it.
    X, y = make_blobs(n_samples=[40, 40, 3], random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scikit-learn's: a class under 5
        search = MR2LinearClassifierCV([0.1, 1.0], scoring=scoring, device="cpu").fit(X, y)
    assert np.isfinite(search.scores_[0]).all()


@pytest.mark.parametrize("scoring", [None, "neg_log_loss", "worst_class"])
def test_score_reads_the_metric_the_search_was_tuned_for(scoring):
    from sklearn.metrics import get_scorer

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, scoring=scoring, device="cpu").fit(X, y)
    expected = {
        None: np.mean(search.predict(X) == y),
        "neg_log_loss": get_scorer("neg_log_loss")(search, X, y),
        "worst_class": worst_class_accuracy(y, search.predict(X)),
    }[scoring]
    assert search.score(X, y) == pytest.approx(expected)


def test_score_without_a_scoring_is_the_accuracy_under_the_weights():
    X, y = _blobs()
    clf = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu").fit(X, y)
    # Weights that lean on the misclassified rows, so that they change the accuracy.
    weight = np.random.default_rng(0).uniform(0, 2, len(y)) * (clf.predict(X) != y) + 0.1
    expected = accuracy_score(y, clf.predict(X), sample_weight=weight)
    assert expected != pytest.approx(accuracy_score(y, clf.predict(X)))
    assert clf.score(X, y, sample_weight=weight) == pytest.approx(expected)


@pytest.mark.parametrize("labels", [[1, 2], ["b", "c"]])
def test_score_of_two_classes_takes_the_positive_class_the_folds_took(labels):
    # The folds scored F1 of the last class, score() scikit-learn's pos_label=1: F1 of
    # class 1 of {1, 2}, and for string labels an error.
    from sklearn.metrics import f1_score

    X, y = load_iris(return_X_y=True)
    X, y = X[y > 0], np.asarray(labels)[y[y > 0] - 1]
    search = MR2LinearClassifierCV(Cs=3, cv=3, scoring="f1", device="cpu").fit(X, y)
    expected = f1_score(y, search.predict(X), pos_label=labels[1])
    assert expected != f1_score(y, search.predict(X), pos_label=labels[0])
    assert search.score(X, y) == pytest.approx(expected)
    # A scorer made with its own pos_label keeps it, in the folds and in score(): the
    # first class's F1 here, as GridSearchCV scores the same folds.
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import GridSearchCV

    first = make_scorer(f1_score, pos_label=labels[0])
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, scoring=first, device="cpu").fit(X, y)
    grid = GridSearchCV(MR2LinearClassifier(device="cpu"), {"C": [0.1, 1.0]}, cv=3, scoring=first)
    grid.fit(X, y)
    scores = next(iter(search.scores_.values()))
    np.testing.assert_allclose(scores.mean(0), grid.cv_results_["mean_test_score"], atol=1e-9)
    assert search.score(X, y) == pytest.approx(f1_score(y, search.predict(X), pos_label=labels[0]))


@pytest.mark.parametrize("labels", [[1, 2], ["b", "c"]])
@pytest.mark.parametrize(
    "scoring, metric, response",
    [
        ("average_precision", "average_precision_score", ("decision_function", "predict_proba")),
        ("neg_brier_score", "brier_score_loss", "predict_proba"),
    ],
)
def test_a_positive_class_metric_without_labels_scores_the_last_class(
    labels, scoring, metric, response
):
    # average_precision_score (and before scikit-learn 1.7 brier_score_loss) takes a
    # pos_label but no labels: its default pos_label=1 scored the first class of {1, 2},
    # and failed on string labels, where the folds of "f1" score the last class.
    import sklearn.metrics

    X, y = load_iris(return_X_y=True)
    X, y = X[y > 0], np.asarray(labels)[y[y > 0] - 1]
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, scoring=scoring, device="cpu").fit(X, y)
    last, first = (
        make_scorer(
            getattr(sklearn.metrics, metric),
            greater_is_better=not scoring.startswith("neg_"),
            response_method=response,
            pos_label=label,
        )
        for label in labels[::-1]
    )
    grid = GridSearchCV(MR2LinearClassifier(device="cpu"), {"C": [0.1, 1.0]}, cv=3, scoring=last)
    grid.fit(X, y)
    scores = next(iter(search.scores_.values()))
    # (the path's solutions and the grid's fits agree to their tol)
    np.testing.assert_allclose(scores.mean(0), grid.cv_results_["mean_test_score"], atol=1e-4)
    assert search.score(X, y) == pytest.approx(last(search, X, y))
    if scoring == "average_precision":  # (the Brier score of either class is one)
        assert last(search, X, y) != pytest.approx(first(search, X, y))


@pytest.mark.parametrize("bound", [False, True], ids=["kwargs", "partial"])
@pytest.mark.parametrize("labels", [[1, 2], ["b", "c"]])
@pytest.mark.parametrize("metric, average", [("f1_score", "macro"), ("jaccard_score", "weighted")])
def test_an_averaged_metric_is_not_told_a_positive_class_it_ignores(labels, metric, average, bound):
    # make_scorer(f1_score, average="macro") was given the last class as pos_label, which
    # an averaged metric ignores with a warning in every fold and in score() ("pos_label
    # (set to 2) is ignored when average != 'binary'"): none, as scikit-learn's "f1_macro".
    # The average bound by functools.partial likewise (its default in the signature).
    import sklearn.metrics

    X, y = load_iris(return_X_y=True)
    X, y = X[y > 0], np.asarray(labels)[y[y > 0] - 1]
    if bound:
        scorer = make_scorer(functools.partial(getattr(sklearn.metrics, metric), average=average))
    else:
        scorer = make_scorer(getattr(sklearn.metrics, metric), average=average)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Note that pos_label")
        search = MR2LinearClassifierCV([1.0], cv=3, scoring=scorer, device="cpu").fit(X, y)
        score = search.score(X, y)
    named = make_scorer(getattr(sklearn.metrics, metric), average=average, pos_label=None)
    assert score == pytest.approx(named(search, X, y))


@pytest.mark.parametrize(
    "n_classes, bound",
    [(2, {"pos_label": 1}), (2, {"pos_label": "b"}), (3, {"labels": [1, 2], "average": "macro"})],
    ids=["pos_label", "string pos_label", "labels"],
)
def test_what_a_partial_binds_is_kept_in_the_folds_and_in_score(n_classes, bound):
    # make_scorer(functools.partial(f1_score, pos_label="b")) was scored with the last
    # class, and partial(f1_score, labels=[1, 2], average="macro") over every class: what
    # the partial binds is the scorer's own, as make_scorer's keywords are.
    from sklearn.metrics import f1_score

    X, y = load_iris(return_X_y=True)
    X, y = X[y >= 3 - n_classes], y[y >= 3 - n_classes]
    if bound.get("pos_label") == "b":
        y = np.array(["a", "b", "c"])[y]
    scorer = make_scorer(functools.partial(f1_score, **bound))
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, scoring=scorer, device="cpu").fit(X, y)
    grid = GridSearchCV(MR2LinearClassifier(device="cpu"), {"C": [0.1, 1.0]}, cv=3, scoring=scorer)
    grid.fit(X, y)
    scores = next(iter(search.scores_.values()))
    np.testing.assert_allclose(scores.mean(0), grid.cv_results_["mean_test_score"], atol=1e-4)
    assert search.score(X, y) == pytest.approx(scorer(search, X, y))


@pytest.mark.parametrize("labels", [[1, 2], ["b", "c"]])
def test_a_ranking_metric_averaged_by_its_default_still_scores_the_last_class(labels):
    # average_precision_score averages by default ("macro") and reads pos_label on two
    # classes: told none (as an averaged set-wise metric is), it fails ("pos_label=None
    # is not a valid label"); the last class, as "average_precision" scores it.
    X, y = load_iris(return_X_y=True)
    X, y = X[y > 0], np.asarray(labels)[y[y > 0] - 1]
    response = ("decision_function", "predict_proba")
    scorer = make_scorer(average_precision_score, response_method=response, average="macro")
    search = MR2LinearClassifierCV([1.0], cv=3, scoring=scorer, device="cpu").fit(X, y)
    last = make_scorer(average_precision_score, response_method=response, pos_label=labels[1])
    assert search.score(X, y) == pytest.approx(last(search, X, y))


def test_score_of_probabilities_knows_every_class_on_data_lacking_one():
    # The columns of predict_proba are every class's: log loss needs all of them even where
    # the data lack some (a first version of the macro fix below dropped them: ValueError).
    from sklearn.metrics import log_loss

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=2, cv=3, scoring="neg_log_loss", device="cpu").fit(X, y)
    keep = y != 2
    expected = -log_loss(y[keep], search.predict_proba(X[keep]), labels=[0, 1, 2])
    assert search.score(X[keep], y[keep]) == pytest.approx(expected)


@pytest.mark.parametrize(
    "scoring, keep",
    [
        ("roc_auc_ovr", [0, 1]),
        ("roc_auc_ovr_weighted", [0]),
        ("roc_auc_ovr_weighted", [0, 1]),
        ("roc_auc_ovo", [0]),
    ],
)
def test_score_undefined_on_data_lacking_a_class_raises(scoring, keep):
    # Told every class, one-vs-rest AUC of rows lacking one was NaN (scikit-learn's "Only
    # one class is present" warning), where LogisticRegressionCV's score raises. Weighted,
    # with the warning, it was the mean of the classes present (1.0 here).
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([1.0], cv=3, scoring=scoring, device="cpu").fit(X, y)
    rows = np.isin(y, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's: the metric is undefined
        missing = str([c for c in range(3) if c not in keep])
        with pytest.raises(
            ValueError, match=rf"not defined on y lacking .*\({re.escape(missing)}\)"
        ):
            search.score(X[rows], y[rows])


@pytest.mark.parametrize("scoring", [None, "accuracy", "balanced_accuracy"])
def test_score_with_weights_near_the_largest_float_is_their_ratio(scoring):
    # scikit-learn's metrics summed them to inf: a score of NaN, with NumPy's warning.
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([1.0], cv=2, scoring=scoring, device="cpu").fit(X, y)
    weight = np.linspace(1.0, 2.0, len(y))
    expected = search.score(X, y, sample_weight=weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no overflow)
        assert search.score(X, y, sample_weight=weight * (1e308 / 2)) == pytest.approx(expected)


def test_score_of_two_classes_on_data_of_one_is_nan_as_scikit_learns():
    # With two classes, LogisticRegressionCV's score too is NaN (with the warning).
    from sklearn.exceptions import UndefinedMetricWarning

    X, y = load_iris(return_X_y=True)
    X, y = X[y > 0], y[y > 0]
    search = MR2LinearClassifierCV([1.0], cv=3, scoring="roc_auc", device="cpu").fit(X, y)
    with pytest.warns(UndefinedMetricWarning, match="Only one class"):
        assert np.isnan(search.score(X[y == 1], y[y == 1]))


def test_score_of_many_classes_counts_the_classes_of_its_data():
    # score() told the metric every class of the fit: a macro F1 on rows of one class was
    # 1/3, where LogisticRegressionCV's score and f1_score say 1.
    from sklearn.metrics import f1_score

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=2, cv=3, scoring="f1_macro", device="cpu").fit(X, y)
    X0, y0 = X[y == 0], y[y == 0]
    expected = f1_score(y0, search.predict(X0), average="macro")
    assert search.score(X0, y0) == pytest.approx(expected)


@pytest.mark.parametrize("scoring", [None, "worst_class", "neg_log_loss"])
def test_score_before_fit_is_not_fitted_whatever_the_scoring(scoring):
    # With a scoring, score read classes_ first: "AttributeError: ... has no attribute
    # 'classes_'" instead of scikit-learn's NotFittedError.
    X, y = load_iris(return_X_y=True)
    with pytest.raises(NotFittedError, match="is not fitted yet"):
        MR2LinearClassifierCV(scoring=scoring, device="cpu").score(X, y)


def test_refit_false_after_a_refit_leaves_no_refit_attributes():
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, device="cpu").fit(X, y)
    assert hasattr(search, "loss_curve_")
    search.set_params(refit=False).fit(X, y)
    for name in ("loss_curve_", "class_losses_", "tilt_weights_"):
        assert not hasattr(search, name)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # C·Σw = 1.5e-18
def test_a_refit_at_a_tiny_penalty_scale_does_not_fail_where_its_folds_did_not():
    # Float32 iris weighted 1e-20: the refit started from the folds' mean coefficients
    # (1e-13) and overflowed float32 in L-BFGS's line search (FitDivergedError), where a
    # cold fit stops at its start.
    X, y = load_iris(return_X_y=True)
    X, w = X.astype(np.float32), np.full(len(y), 1e-20)
    search = MR2LinearClassifierCV([1.0], cv=3, device="cpu").fit(X, y, sample_weight=w)
    cold = MR2LinearClassifier(device="cpu").fit(X, y, sample_weight=w)
    assert np.isfinite(search.coef_).all()
    assert search.score(X, y) >= cold.score(X, y)


def test_a_refit_false_search_predicts_with_its_head_even_pickled_without_head_():
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([0.1, 1.0], cv=3, refit=False, device="cpu").fit(X, y)
    assert search.head_ == "linear"
    before = search.predict(X)
    del search.head_  # as a search pickled before head_ existed
    np.testing.assert_array_equal(search.predict(X), before)


def test_a_two_class_cosine_refit_starts_from_the_folds_mean_rows(monkeypatch):
    # Two classes are kept as one row (coef_1 − coef_0); loaded into the cosine head's two
    # rows it gave both the same row, a start where every sample scores the classes alike.
    from sklearn.datasets import load_breast_cancer

    from mr2_probe import _head

    loaded, load = [], _head.ProbeHead.load

    def spy(self, state):
        load(self, state)
        loaded.append(self.weight.detach().numpy().copy())

    monkeypatch.setattr(_head.ProbeHead, "load", spy)
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    search = MR2LinearClassifierCV(Cs=[16.0], cv=3, head="cosine", device="cpu").fit(X, y)
    start = loaded[-1]
    mean = search.coefs_paths_[search.classes_[1]][:, 0].mean(0)
    # Unit rows whose difference, at the scale, is that mean (at ∓ it/2 they were opposite).
    np.testing.assert_allclose(np.linalg.norm(start, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(16.0 * (start[1] - start[0]), mean, rtol=1e-5, atol=1e-6)


def test_a_cv_without_splits_is_named():
    # An empty list, or a generator that an earlier fit used up, failed deep in the
    # batched solver with "not enough values to unpack (expected 3, got 0)".
    X, y = _blobs()
    with pytest.raises(ValueError, match="^cv yielded no split: an empty list"):
        MR2LinearClassifierCV(Cs=[1.0], cv=[], device="cpu").fit(X, y)
    used = StratifiedKFold(3).split(X, y)
    search = MR2LinearClassifierCV(Cs=[1.0], cv=used, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="an iterator that an earlier fit used up"):
        search.fit(X, y)


def test_folds_given_as_boolean_masks_are_their_rows():
    # np.asarray(mask, int64) turned them into rows 0 and 1, and the fit crashed.
    X, y = load_iris(return_X_y=True)
    held = np.zeros(len(y), bool)
    held[::3] = True
    masks = MR2LinearClassifierCV([0.1, 10.0], cv=[(~held, held), (held, ~held)], device="cpu")
    rows = [
        (np.flatnonzero(~held), np.flatnonzero(held)),
        (np.flatnonzero(held), np.flatnonzero(~held)),
    ]
    indices = MR2LinearClassifierCV([0.1, 10.0], cv=rows, device="cpu")
    np.testing.assert_array_equal(masks.fit(X, y).scores_[0], indices.fit(X, y).scores_[0])


def test_negative_fold_indices_count_from_the_end_as_numpy_reads_them():
    # np.bincount refused them ("'list' argument must have no negative elements"), where
    # LogisticRegressionCV and GridSearchCV read -1 as the last row.
    X, y = load_iris(return_X_y=True)
    n = len(y)
    rows = np.arange(n)
    negative = [(rows[1::2] - n, rows[::2]), (rows[::2], rows[1::2] - n)]
    positive = [(rows[1::2], rows[::2]), (rows[::2], rows[1::2])]
    scores = [
        MR2LinearClassifierCV([0.1, 10.0], cv=cv, device="cpu").fit(X, y).scores_[0]
        for cv in (negative, positive)
    ]
    np.testing.assert_array_equal(*scores)
    with pytest.raises(IndexError, match=f"cv gave the index {-n - 1}, outside the {n} samples"):
        MR2LinearClassifierCV([1.0], cv=[(np.r_[rows[1:], -n - 1], rows[:1])], device="cpu").fit(
            X, y
        )


@pytest.mark.parametrize(
    "part, match",
    [
        (np.arange(100) % 3 == 0, r"cv gave a boolean mask of shape \(100,\) for the 150 samples"),
        (np.arange(1, 150, 2) + 0.5, "cv gave indices of dtype float64"),
    ],
)
def test_folds_that_numpy_cannot_index_x_with_are_refused(part, match):
    # A mask of 100 entries left rows 100 to 149 out of every part, and float indices were
    # truncated to rows, without a word, where LogisticRegressionCV and GridSearchCV
    # refuse both (NumPy's IndexError).
    X, y = load_iris(return_X_y=True)
    rows = np.arange(len(y))
    train = ~part if part.dtype == bool else rows[::2]
    with pytest.raises(IndexError, match=match):
        MR2LinearClassifierCV([1.0], cv=[(train, part)], device="cpu").fit(X, y)


def test_a_cosine_path_starts_each_scale_from_the_last_solution(monkeypatch):
    # Extrapolated in log(scale), the flat non-convex path ended further from independent
    # fits (digits: it chose 21.5, cold fits 1292) at no gain in iterations.

    from mr2_probe import _path

    moved, predict = [], _path.FoldPath._predict

    def spy(self, value):
        before = [p.detach().clone() for p in self.head.parameters()]
        predict(self, value)
        after = list(self.head.parameters())
        moved.append(any(not torch.equal(a, p) for a, p in zip(before, after, strict=True)))

    monkeypatch.setattr(_path.FoldPath, "_predict", spy)
    X, y = load_iris(return_X_y=True)
    # The folds' own paths (an HDF5 input or a projection takes them), not the batched ones.
    monkeypatch.setattr(MR2LinearClassifierCV, "_batches_folds", lambda *args: False)
    MR2LinearClassifierCV([1.0, 4.0, 16.0, 64.0], cv=2, head="cosine", device="cpu").fit(X, y)
    assert len(moved) >= 4 and not any(moved)


def test_a_batched_cosine_path_starts_each_scale_from_the_last_solution(monkeypatch):

    import mr2_probe._batched as batched

    starts, ends, original = [], [], batched.lbfgs_batched

    def spy(batch, params, *args, **kwargs):
        starts.append(params.clone())
        result = original(batch, params, *args, **kwargs)
        ends.append(torch.nn.functional.normalize(params.view(2, 3, -1), dim=2).flatten(1))
        return result

    monkeypatch.setattr(batched, "lbfgs_batched", spy)
    X, y = load_iris(return_X_y=True)
    MR2LinearClassifierCV([1.0, 4.0, 16.0, 64.0], cv=2, head="cosine", device="cpu").fit(X, y)
    assert len(starts) == 4
    for start, end in zip(starts[1:], ends[:-1], strict=True):
        torch.testing.assert_close(start, end)


def test_a_line_search_stops_when_its_step_no_longer_moves_the_point():
    """Every step up a flat float32 objective is too long: the search shortens it until
    the point no longer changes in float32, then the fold stalls, instead of spending all
    25 trials of the line search."""
    from mr2_probe._batched import lbfgs_batched

    class Rising:
        n_penalised, n_classes = 0, 1
        weight_sum = torch.ones(1)
        X = torch.zeros(0, 4)
        evaluations = 0

        def penalty(self, value, folds=slice(None), dtype=None):
            return 1.0 / (value * self.weight_sum[folds])

        def evaluate(self, params, folds, value):
            self.evaluations += 1
            moved = (params != 1).any(1).float()  # 0 at the start, 1 anywhere else
            return moved, torch.ones_like(params)

        def largest_gradient(self, params, grad, folds=slice(None)):
            return grad.abs().amax(1)

    batch, params = Rising(), torch.ones(1, 4)
    result = lbfgs_batched(batch, params, 1.0, max_iter=10, tol=1e-6)
    assert result.stop == ["stalled"] and torch.equal(params, torch.ones(1, 4))
    assert batch.evaluations <= 12  # 27 without the test


@pytest.mark.parametrize("batch_folds", [None, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("tilt", [0.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_a_two_class_linear_search_runs_on_the_batched_solver(batch_folds, tilt, monkeypatch):
    """Two classes: one row of parameters (the first class's logit pinned at zero, the
    binomial model), its path the fits of its Cs, and without margins or tilt the choice
    of LogisticRegressionCV."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    folds, Cs = _folds(y), [0.01, 0.1, 1.0, 10.0]
    calls = _spy_batched(monkeypatch)
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    common = dict(c_bar=None, class_tilt=tilt, tol=1e-8, max_iter=2000, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = MR2LinearClassifierCV(Cs, cv=folds, **common).fit(X, y)
        assert calls == ([3] * 4 if batch_folds is None else [1] * 12)
        assert search.coefs_paths_[1].shape == (3, 4, X.shape[1] + 1)
        for f, (train, _) in enumerate(folds):
            for j, C in enumerate(Cs):
                cold = MR2LinearClassifier(C=C, **common).fit(X[train], y[train])
                expected = np.append(cold.coef_[0], cold.intercept_[0])
                path = search.coefs_paths_[1][f, j]
                np.testing.assert_allclose(path, expected, atol=2e-4 * max(1, C), rtol=1e-4)
        if tilt == 0:
            lrcv = LogisticRegressionCV(
                Cs=Cs, cv=folds, tol=1e-8, max_iter=2000, scoring="accuracy",
                **_current_attributes(),
            ).fit(X, y)  # fmt: skip
            assert search.C_ == float(np.ravel(lrcv.C_)[0])
    assert search.score(X, y) > 0.95


@pytest.mark.parametrize("batch_folds", [True, False])
def test_class_accuracy_path_is_weighted_as_the_scores_are(batch_folds, monkeypatch):
    # Rows of weight 0 counted in the class-wise curves; scoring="worst_class" weighs them
    # 0, so its scores_ and the curves' minimum disagreed (0.711 against 0.788).
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = make_classification(300, 5, n_informative=3, n_classes=3, random_state=0)
    weight = np.random.default_rng(0).integers(0, 4, len(y)).astype(float)
    clf = MR2LinearClassifierCV(Cs=[0.1, 1, 10], cv=3, scoring="worst_class", device="cpu")
    clf.fit(X, y, sample_weight=weight)
    np.testing.assert_allclose(np.nanmin(clf.class_accuracy_path_, 2), clf.scores_[0])


def test_a_process_backend_of_joblib_still_solves_the_folds_in_threads():
    # Under joblib.parallel_config(backend="loky") (or dask) the folds ran in worker
    # processes, which filled copies of the paths: KeyError on the parent's empty path.
    import joblib

    X, y = _blobs()
    common = dict(Cs=[0.1, 1.0], cv=3, device="cpu", n_jobs=2)
    expected = MR2LinearClassifierCV(**common).fit(X, y)
    for params in (dict(), dict(lam=0.5, max_iter=5)):  # batched, then fold by fold
        with joblib.parallel_config(backend="loky", n_jobs=2), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf = MR2LinearClassifierCV(**common | params).fit(X, y)
        if not params:
            np.testing.assert_array_equal(clf.scores_[0], expected.scores_[0])


def test_a_plain_callable_scorer_gets_the_weights_when_it_takes_them():
    # A callable without sample_weight was always passed it: TypeError.
    X, y = _blobs()
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    seen = []

    def unweighted(estimator, X, y):
        return float(np.mean(estimator.predict(X) == y))

    def weighted(estimator, X, y, sample_weight=None):
        seen.append(sample_weight is not None)
        return float(np.average(estimator.predict(X) == y, weights=sample_weight))

    def by_keywords(estimator, X, y, **kwargs):
        seen.append(kwargs.get("sample_weight") is not None)
        return float(np.average(estimator.predict(X) == y, weights=kwargs.get("sample_weight")))

    for scoring in (unweighted, weighted, by_keywords):
        clf = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, scoring=scoring, device="cpu")
        clf.fit(X, y, sample_weight=weight).score(X, y, sample_weight=weight)
    assert seen and all(seen)


@pytest.mark.parametrize(
    "returned, shown",
    [(None, "None"), (np.ones(2), r"array\(\[1., 1.\]\)"), ("high", "'high'"),
     (np.array([0.5]), None), (np.float32(0.5), None),
     # numbers GridSearchCV takes (a Decimal was refused: it is no numbers.Real)
     (Decimal("0.5"), None), (Fraction(1, 2), None), (np.bool_(True), None),
     (torch.tensor(0.5), None)],
)  # fmt: skip
def test_a_scorer_that_returns_no_number_is_named_as_grid_search_names_it(returned, shown):
    # float() of its value raised Python's TypeError or ValueError ("only 0-dimensional
    # arrays can be converted to Python scalars", "float() argument must be a string or a
    # real number, not 'NoneType'"); one value, an array of one too, is taken as
    # GridSearchCV takes it.
    X, y = _blobs(n_classes=3)
    clf = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, scoring=lambda e, X, y: returned)
    if shown is None:
        assert clf.set_params(device="cpu").fit(X, y).C_ == 0.1  # a tie: the first
        return
    with pytest.raises(ValueError, match=f"scoring must return a number, got {shown} "):
        clf.set_params(device="cpu").fit(X, y)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_a_tensor_is_scored_by_the_search_s_metric_as_an_array_is(device, n_classes):
    # predict_proba of a CUDA tensor is a CUDA tensor, which scikit-learn's metrics cannot
    # read: score(X_cuda, y) with scoring="neg_log_loss" failed.
    X, y = _blobs(n_classes=n_classes)
    X = X.astype(np.float32)
    clf = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, scoring="neg_log_loss", device=device)
    clf.fit(X, y)
    tensor = torch.as_tensor(X, device=device)
    assert clf.score(tensor, torch.as_tensor(y)) == pytest.approx(clf.score(X, y), rel=1e-6)


def test_an_int_grid_s_ties_go_to_the_smallest_c_and_nan_scores_are_never_chosen():
    non_finite = "One or more of the test scores are non-finite"
    # Separable blobs: every C of an int grid scores 1.0, and LogisticRegressionCV takes
    # the first of its increasing Cs. A scorer undefined (NaN) at some C never wins there.
    X, y = make_blobs(n_samples=90, centers=[[-9, 0], [9, 0], [0, 9]], random_state=0)
    tied = MR2LinearClassifierCV(3, cv=3, c_bar=None, device="cpu").fit(X, y)
    # (np.logspace(-4, 4, 3)[0] is 1e-4 to the last bit from NumPy 2 on, not before.)
    assert np.all(tied.scores_[0] == 1.0) and tied.C_ == tied.Cs_[0] == pytest.approx(1e-4)

    def nan_at_weak(estimator, X, y):  # NaN where the logits are large (weak penalty)
        size = np.abs(estimator.decision_function(X)).max()
        return np.nan if size > 8 else size / 100

    def nan_at_strong(estimator, X, y):  # NaN where the logits are small (strong penalty)
        size = np.abs(estimator.decision_function(X)).max()
        return np.nan if size < 0.5 else -abs(size - 3)

    # At the last C or at the first, with refit (the best mean over the folds) or without
    # (each fold's best, averaged).
    for scoring, at in ((nan_at_weak, 2), (nan_at_strong, 0)):
        for refit in (True, False):
            search = MR2LinearClassifierCV([1e-5, 1e-1, 1e3], cv=3, c_bar=None, scoring=scoring,
                                           refit=refit, device="cpu")  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                # GridSearchCV's warning for them, which the search did not give
                with pytest.warns(
                    UserWarning, match=non_finite + r".*C=" + ("1000", "1e-05")[at == 0]
                ):
                    search.fit(X, y)
            scores = search.scores_[0]
            assert np.isnan(scores[:, at]).all()
            best = np.nanargmax(scores.sum(0)) if refit else np.nanargmax(scores, axis=1)
            assert np.all(best != at) and search.C_ == pytest.approx(np.mean(search.Cs_[best]))


@pytest.mark.parametrize("refit", [True, False])
def test_a_fold_that_scores_nan_at_every_value_refuses_the_search(refit):
    # Fold 0 holds out no sample of class 2: one-vs-rest AUC is NaN there at every C, every
    # C's sum over the folds was NaN, and the first C was chosen without a word.
    X, y = load_iris(return_X_y=True)
    X, y = X[:102], y[:102]
    search = MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring="roc_auc_ovr", refit=refit,
                                   device="cpu")  # fmt: skip
    where = "summed over the folds" if refit else "on fold 0"
    match = rf"No value of Cs has a defined held-out score {where}.*C=0.01 \(fold 0\), 1 \(fold 0\)"
    with pytest.raises(ValueError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (too few of class 2 for 3 folds; AUC undefined)
        search.fit(X, y)
    # A fold that holds every class (here, two folds) scores every value.
    assert np.isfinite(search.set_params(cv=2).fit(X, y).scores_[0]).all()


def _inf_below_half(estimator, X, y):
    """Accuracy, but +inf (a ratio divided by zero, say) where it is below one half."""
    accuracy = accuracy_score(y, estimator.predict(X))
    return np.inf if accuracy < 0.5 else accuracy


@pytest.mark.parametrize("refit", [True, False])
def test_an_infinite_score_ranks_last_as_the_warning_says(refit):
    # At C = 1e-6 every fold predicts at chance on iris and this scorer gives +inf there:
    # the warning said that value ranks last, and the search chose it.
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([1e-6, 1.0], cv=3, scoring=_inf_below_half, refit=refit,
                                   device="cpu")  # fmt: skip
    with pytest.warns(UserWarning, match=r"non-finite.*rank last.*C=1e-06 \(folds 0, 1, 2\)"):
        search.fit(X, y)
    assert np.isposinf(search.scores_[0][:, 0]).all() and search.C_ == 1.0
    # A fold with no finite score at any value has none to choose: the search refuses.
    with pytest.raises(ValueError, match="No value of Cs has a defined held-out score"):
        search.set_params(Cs=[1e-7, 1e-6]).fit(X, y)


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_probability_and_ranking_scorers_see_the_held_out_model_s_values(head):
    # A two-class "roc_auc" read the decision values of the held-out logits, and a cosine
    # head's "neg_log_loss" its probabilities: no test compared them with cold fits' own.
    from sklearn.metrics import get_scorer

    X, y = _blobs(n_classes=2, std=6.0)
    folds = _folds(y)
    values = [0.1, 1.0] if head == "linear" else [4.0, 16.0]
    key = "C" if head == "linear" else "scale"
    for scoring in ("roc_auc", "neg_log_loss"):
        search = MR2LinearClassifierCV(values, cv=folds, head=head, c_bar=None, scoring=scoring,
                                       tol=1e-8, max_iter=3000, device="cpu")  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            search.fit(X, y)
            for j, value in enumerate(values):
                for i, (train, test) in enumerate(folds):
                    cold = MR2LinearClassifier(head=head, c_bar=None, tol=1e-8, max_iter=3000,
                                               device="cpu", **{key: value})  # fmt: skip
                    cold.fit(X[train], y[train])
                    expected = get_scorer(scoring)(cold, X[test], y[test])
                    assert search.scores_[1][i, j] == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize("lam", [0.0, 0.1])  # the batched path, and a fold's own path
def test_each_fold_is_scored_with_its_held_out_rows_weights(lam):
    X, y = _blobs()
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    folds, seen = _folds(y), []

    def weighted(estimator, X, y, sample_weight=None):
        seen.append(np.asarray(sample_weight))
        return float(np.average(estimator.predict(X) == y, weights=sample_weight))

    clf = MR2LinearClassifierCV([0.1, 1.0], cv=folds, lam=lam, scoring=weighted, max_iter=5,
                                refit=False, device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, sample_weight=weight)
    expected = [weight[test] for _, test in folds]
    assert len(seen) == 6
    for got in seen:
        assert any(len(got) == len(w) and np.allclose(got, w) for w in expected)


@pytest.mark.parametrize("head, expected", [("linear", np.logspace(-4, 4, 4)),
                                            ("cosine", [1.0, 10.0, 100.0, 1000.0])])  # fmt: skip
def test_an_int_grid_is_the_documented_one(head, expected):
    X, y = _blobs()
    clf = MR2LinearClassifierCV(4, cv=2, head=head, max_iter=20, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    np.testing.assert_allclose(clf.Cs_, expected)


@pytest.mark.parametrize("limit, expected", [(9, [3, 3]), (8, [1] * 6)])
def test_cpu_folds_form_one_batch_while_their_logits_stay_narrow(limit, expected, monkeypatch):
    # 3 folds × 3 classes = 9 columns: one batch up to the limit, a fold at a time above it.
    X, y = _blobs(n_classes=3, n=90)
    calls = _spy_batched(monkeypatch)
    monkeypatch.setattr(MR2LinearClassifierCV, "_BATCH_MAX_COLUMNS_CPU", limit)
    MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, device="cpu").fit(X, y)
    assert calls == expected


def test_a_batched_fold_short_of_tol_names_an_extreme_c():
    # A batched fold's warning names C (and its own weight sum, 100 of iris' 150 rows) as
    # the fold's own fit would, not a logit scale.
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=[1e-9], cv=3, max_iter=1, tol=1e-12, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        search.fit(X, y)
    messages = [str(w.message) for w in caught if w.category is ConvergenceWarning]
    assert any("C=1e-09 and sample weights summing to 100 " in m for m in messages)


def test_score_hands_the_scorer_numpy_labels_and_weights_given_tensors():
    # scikit-learn's metrics cannot read a CUDA tensor: score() converts y and sample_weight
    # whatever their device. On the CPU a tensor happens to pass through the metrics, so
    # the conversion is pinned by what a callable scorer receives.
    X, y = _blobs(n_classes=3)
    weight = np.linspace(0.5, 2.0, len(y))
    seen = []

    def scorer(estimator, X, y, sample_weight=None):
        seen.append((type(y), type(sample_weight)))
        return float(np.average(estimator.predict(X) == y, weights=sample_weight))

    clf = MR2LinearClassifierCV(Cs=[1.0], cv=3, scoring=scorer, device="cpu").fit(X, y)
    seen.clear()
    score = clf.score(X, torch.as_tensor(y), sample_weight=torch.as_tensor(weight))
    assert seen == [(np.ndarray, np.ndarray)]
    assert score == pytest.approx(clf.score(X, y, sample_weight=weight))


def test_sample_weights_of_a_tensor_numpy_cannot_read_weight_the_search():
    # Weights that NumPy cannot read (a tensor on a GPU, or one that requires grad) failed
    # where the held-out scores take them ("Can't call numpy() on Tensor that requires
    # grad"), though MR2LinearClassifier's fit and this score() convert them.
    X, y = _blobs(n_classes=3)
    weight = np.linspace(0.5, 2.0, len(y))
    expected = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, device="cpu").fit(X, y, weight)
    tensor = torch.tensor(weight, requires_grad=True)
    search = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, device="cpu").fit(X, y, tensor)
    np.testing.assert_array_equal(search.scores_[0], expected.scores_[0])
    np.testing.assert_array_equal(search.coef_, expected.coef_)


def test_a_linear_refit_starts_from_the_folds_mean_solution(monkeypatch):
    # "Refit on all the data at the best value, starting from the folds' mean solution":
    # the intercept as well as the weights.
    from mr2_probe import _head

    loaded, load = [], _head.ProbeHead.load

    def spy(self, state):
        load(self, state)
        loaded.append((self.weight.detach().numpy().copy(), self.bias.detach().numpy().copy()))

    monkeypatch.setattr(_head.ProbeHead, "load", spy)
    X, y = _blobs(n_classes=3)
    search = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=3, device="cpu").fit(X, y)
    best = list(search.Cs_).index(search.C_)
    mean = np.stack([search.coefs_paths_[k][:, best].mean(0) for k in search.classes_])
    weight, bias = loaded[-1]
    np.testing.assert_allclose(weight, mean[:, :-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, mean[:, -1], rtol=1e-5, atol=1e-6)
    assert np.abs(bias).max() > 1e-3  # a start that differs from the head's zero intercept


def test_held_out_logits_answer_as_a_fitted_classifier_of_those_logits():
    # A callable scorer is handed this stand-in: every response method answers.
    from mr2_probe._path import HeldOutLogits

    classes = np.array(["a", "b", "c"])
    Z = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 1.0]])
    estimator = HeldOutLogits(classes)
    proba = np.exp(Z) / np.exp(Z).sum(1, keepdims=True)
    np.testing.assert_allclose(estimator.predict_proba(Z), proba)
    np.testing.assert_allclose(estimator.predict_log_proba(Z), np.log(proba))
    np.testing.assert_array_equal(estimator.predict(Z), ["a", "b"])
    np.testing.assert_array_equal(estimator.decision_function(Z), Z)
    np.testing.assert_array_equal(HeldOutLogits(classes[:2]).decision_function(Z[:, :2]), [-2, 3])


def test_a_scorer_whose_signature_cannot_be_read_is_given_the_weights():
    # _takes_sample_weight: "True when its signature cannot be read".
    seen = []

    class Opaque:
        __signature__ = "unreadable"  # inspect.signature raises TypeError

        def __call__(self, estimator, X, y, sample_weight=None):
            seen.append(sample_weight is not None)
            return float(np.average(estimator.predict(X) == y, weights=sample_weight))

    X, y = _blobs(n_classes=3)
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    MR2LinearClassifierCV(Cs=[1.0], cv=3, scoring=Opaque(), device="cpu").fit(X, y, weight)
    assert seen and all(seen)


def test_a_fold_path_starts_each_value_on_the_line_through_its_last_two_solutions():
    # FoldPath's predictor step, which the convex fits' solutions cannot show: from the
    # third value on the start is extrapolated linearly in log(value) from the last two
    # solutions; a value inside the path (a bisection's midpoint) starts from the last.
    from types import SimpleNamespace

    from mr2_probe._path import FoldPath

    weight = torch.nn.Parameter(torch.zeros(2))
    head = SimpleNamespace(
        parameters=lambda: [weight], has_projection=False, head="linear", bias=None, n_classes=2
    )
    solutions = {2.0: [0.0, 0.0], 20.0: [1.0, 2.0], 2000.0: [4.0, 4.0], 200.0: [3.0, 3.0]}
    starts = []

    def solve(head, data, value, cold, initial):
        starts.append(weight.detach().tolist())
        with torch.no_grad():
            weight.copy_(torch.tensor(solutions[value]))
        return SimpleNamespace(n_iter=1), {"coef": np.zeros((1, 2)), "intercept": None}

    path = FoldPath(None, lambda: [], np.array([], dtype=int), None, None, head, None)
    progress = SimpleNamespace(update=lambda n: None)
    path.run([2000.0, 2.0, 20.0], solve, lambda z, y, w: 0.0, progress)
    # At 2000, t = log(2000/20) / log(20/2) = 2: [1, 2] + 2·([1, 2] − [0, 0]).
    assert starts == [[0.0, 0.0], [0.0, 0.0], [3.0, 6.0]]
    path.run([200.0], solve, lambda z, y, w: 0.0, progress)
    assert starts[-1] == [4.0, 4.0]
    assert sorted(path.steps) == [2.0, 20.0, 200.0, 2000.0]


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_a_zero_c_or_scale_is_refused(head):
    # C = 0 (infinite penalty) or a logit scale of 0 is no value to search: "positive".
    X, y = _blobs(n_classes=3, n=60)
    with pytest.raises(ValueError, match="The 'Cs' parameter of MR2LinearClassifierCV must be"):
        MR2LinearClassifierCV(Cs=[0.0, 1.0], cv=3, head=head, device="cpu").fit(X, y)


def test_the_search_s_defaults_are_logistic_regression_cv_s():
    # "Cs : int ... default=10", refit=True, cv=None (5-fold): LogisticRegressionCV's own
    # defaults (scikit-learn 1.6), written out so that a change to ours is seen.
    params = MR2LinearClassifierCV().get_params()
    expected = {"Cs": 10, "cv": None, "refit": True, "n_jobs": None, "max_iter": 100, "tol": 1e-4}
    assert {name: params[name] for name in expected} == expected


def _recording_scorer(seen, request):
    """An accuracy scorer that records the weights it is given, with its request set."""

    def accuracy(y_true, y_pred, sample_weight=None):
        seen.append(None if sample_weight is None else np.asarray(sample_weight))
        return float(np.average(y_true == y_pred, weights=sample_weight))

    return make_scorer(accuracy).set_score_request(sample_weight=request)


@pytest.mark.parametrize("request_weights", [True, False])
def test_under_routing_the_scores_get_the_weights_the_scorer_requests(request_weights):
    # Under metadata routing the held-out scores were weighted whatever the scorer's request
    # said (LogisticRegressionCV weights them only where it asks); the fits are weighted
    # either way.
    X, y = _blobs()
    weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    folds, seen = _folds(y), []
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = _recording_scorer(seen, request_weights)
        clf = MR2LinearClassifierCV([0.1, 1.0], cv=folds, scoring=scorer, refit=False,
                                    device="cpu")  # fmt: skip
        clf.fit(X, y, sample_weight=weight)
    plain = MR2LinearClassifierCV([0.1, 1.0], cv=folds, refit=False, device="cpu")
    plain.fit(X, y, sample_weight=weight)
    np.testing.assert_allclose(clf.coef_, plain.coef_, rtol=1e-6)  # weighted fits
    assert len(seen) == 2 * len(folds)
    if request_weights:
        expected = [weight[test] for _, test in folds]
        assert all(any(np.allclose(got, w) for w in expected if len(w) == len(got)) for got in seen)
    else:
        assert all(got is None for got in seen)
    # The class accuracies are weighted by sample_weight whatever the scorer takes, as
    # without routing (they followed the scorer's request: unweighted for False).
    np.testing.assert_array_equal(clf.class_accuracy_path_, plain.class_accuracy_path_)


def test_under_routing_weights_the_scorer_leaves_unrequested_are_refused():
    # As LogisticRegressionCV: the default scorer (accuracy) has no request for them. (Before
    # scikit-learn 1.9 neither refuses them: the same answer is what is asked.)
    X, y = _blobs()
    weight = np.ones(len(y))

    def refused(search):
        try:
            search.fit(X, y, sample_weight=weight)
        except UnsetMetadataPassedError as err:
            return "set_score_request" in str(err)
        return False

    with sklearn.config_context(enable_metadata_routing=True):
        theirs = refused(
            LogisticRegressionCV(Cs=[1.0], cv=3, scoring="accuracy", **_current_attributes())
        )
        assert refused(MR2LinearClassifierCV([1.0], cv=3, device="cpu")) == theirs
    assert theirs or SKLEARN < (1, 9)


def test_a_request_set_on_a_classwise_scorer_stays_on_that_scorer():
    # A request set on classwise_scorers()'s worst-class scorer (a multi-metric search's)
    # was set on the scorer scoring="worst_class" names, in every search of the program:
    # weights it refused under routing were taken. scikit-learn's names give copies.
    from sklearn.utils.metadata_routing import process_routing

    X, y = _blobs()
    weight = np.ones(len(y))

    def scored_weights(search):  # what fit gives its scorer: refused, or the weights taken
        try:
            routed = process_routing(search, "fit", sample_weight=weight).scorer.score
        except UnsetMetadataPassedError as err:
            assert "set_score_request" in str(err)
            with pytest.raises(UnsetMetadataPassedError, match="set_score_request"):
                search.fit(X, y, sample_weight=weight)
            return "refused"
        return "sample_weight" in routed

    with sklearn.config_context(enable_metadata_routing=True):
        unrequested = make_scorer(worst_class_accuracy)
        requested = classwise_scorers()["worst_class"].set_score_request(sample_weight=True)
        try:
            search = MR2LinearClassifierCV([1.0], cv=3, scoring="worst_class", device="cpu")
            # As LogisticRegressionCV with a scorer whose request is unset: refused from
            # scikit-learn 1.9 on, before it not taken (such a scorer asks for none).
            lrcv = LogisticRegressionCV(
                Cs=[1.0], cv=3, scoring=unrequested, **_current_attributes()
            )
            theirs = scored_weights(lrcv)
            assert scored_weights(search) == theirs
            assert theirs == ("refused" if SKLEARN >= (1, 9) else False)
            assert (
                classwise_scorers()["worst_class"].get_metadata_routing().score.requests
                == unrequested.get_metadata_routing().score.requests
            )
        finally:  # (the module's own scorer, where the dictionary held it)
            requested.set_score_request(sample_weight=None)


@pytest.mark.slow
def test_under_routing_groups_go_to_a_splitter_that_asks_for_them():
    # An outer search's groups raised UnsetMetadataPassedError for MR2LinearClassifierCV.fit
    # (its fit names groups); they go to a group splitter, inner or outer, and only there.
    X, y = _blobs(n=120)
    groups = np.arange(len(y)) % 6
    split_groups = []

    class Recording(GroupKFold):
        def split(self, X, y=None, groups=None):
            split_groups.append(groups)
            return super().split(X, y, groups)

    with sklearn.config_context(enable_metadata_routing=True):
        outer = GridSearchCV(MR2LinearClassifierCV([1.0], cv=3, device="cpu"), {"tol": [1e-4]},
                             cv=GroupKFold(3))  # fmt: skip
        outer.fit(X, y, groups=groups)
        inner = MR2LinearClassifierCV([0.1, 1.0], cv=Recording(3), refit=False, device="cpu")
        inner.fit(X, y, groups=groups)
    assert len(split_groups) == 1 and np.array_equal(split_groups[0], groups)
    assert inner.class_accuracy_path_.shape[0] == 3


# scikit-learn's reference, at its default max_iter=100 on the blobs
@pytest.mark.filterwarnings("ignore:lbfgs failed to converge:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("request_weights", [True, False])
def test_under_routing_score_gives_the_scorer_the_weights_it_requests(request_weights):
    X, y = _blobs()
    weight = np.random.default_rng(1).uniform(0.1, 3.0, len(y))
    seen = []
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = _recording_scorer(seen, request_weights)
        clf = MR2LinearClassifierCV([1.0], cv=3, scoring=scorer, device="cpu").fit(X, y)
        seen.clear()
        if not request_weights:  # as LogisticRegressionCV's: the weights go nowhere

            def scored_weights(search):  # None where refused
                seen.clear()
                try:
                    search.score(X, y, sample_weight=weight)
                except TypeError as err:
                    assert "not routed to any" in str(err)
                    return None
                return seen[0] is not None

            theirs = LogisticRegressionCV(Cs=[1.0], cv=3, scoring=scorer, **_current_attributes())
            theirs.fit(X, y)
            assert scored_weights(clf) == scored_weights(theirs)
            # Refused from scikit-learn 1.9 on; before it taken by the estimator's own
            # (unset) request, and left out of the score by the scorer's.
            assert scored_weights(clf) is (None if SKLEARN >= (1, 9) else False)
            return
        score = clf.score(X, y, sample_weight=weight)
    hits = clf.predict(X) == y
    assert np.allclose(seen[0], weight)
    assert score == pytest.approx(np.average(hits, weights=weight))


# scikit-learn's reference, at its default max_iter=100 on the blobs
@pytest.mark.filterwarnings("ignore:lbfgs failed to converge:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.slow
def test_under_routing_the_scorer_s_request_alone_routes_score_weights():
    # As for LogisticRegressionCV, the scorer's request is the whole recipe: an outer search
    # raised UnsetMetadataPassedError for MR2LinearClassifierCV.score, asking for a request
    # of the estimator's own, which then changed nothing (False weighted the scores too).
    # Before scikit-learn 1.9 LogisticRegressionCV's own request is what the outer search
    # reads, and so is this one's: marked unused there, the weights were dropped whatever
    # the scorer asked. (There it is set, as that version's error asks.)
    from sklearn.model_selection import cross_validate

    X, y = _blobs()
    weight = np.random.default_rng(2).uniform(0.1, 3.0, len(y))

    def outer(search, seen):  # per outer fold, whether its score had the weights
        search.set_fit_request(sample_weight=True)
        if SKLEARN < (1, 9):
            search.set_score_request(sample_weight=True)
        result = cross_validate(search, X, y, cv=2, params={"sample_weight": weight})
        # After each outer fold's inner search, its score.
        return [got is not None for got in seen[-2:]], result["test_score"]

    scores = {}
    with sklearn.config_context(enable_metadata_routing=True):
        for request in (True, False):
            seen, theirs_seen = [], []
            scorer = _recording_scorer(seen, request)
            search = MR2LinearClassifierCV([1.0], cv=3, scoring=scorer, device="cpu")
            weighted, scores[request] = outer(search, seen)
            assert weighted == [request, request]
            their_scorer = _recording_scorer(theirs_seen, request)
            theirs = LogisticRegressionCV(
                Cs=[1.0], cv=3, scoring=their_scorer, **_current_attributes()
            )
            assert outer(theirs, theirs_seen)[0] == weighted
    assert not np.allclose(scores[True], scores[False])


@pytest.mark.parametrize("batch", [True, False])
def test_under_routing_any_metadata_the_scorer_requests_reaches_it_per_fold(batch):
    # Only sample_weight reached the scorer: groups it requested were dropped without a
    # word, and an alias of its weights was refused (TypeError) by fit and score, where
    # LogisticRegressionCV passes both.
    from sklearn.metrics import accuracy_score, make_scorer
    from sklearn.model_selection import StratifiedKFold

    X, y = _blobs()
    tags = np.arange(len(y)) * 10.0  # a row's own tag: which rows each call scored
    weight = np.random.default_rng(3).uniform(0.1, 3.0, len(y))
    cv = StratifiedKFold(3)
    seen = []

    def metric(y_true, y_pred, groups=None, sample_weight=None):
        seen.append((groups, sample_weight))
        return accuracy_score(y_true, y_pred, sample_weight=sample_weight)

    with sklearn.config_context(enable_metadata_routing=True):
        scorer = make_scorer(metric).set_score_request(groups=True, sample_weight="w_score")
        search = MR2LinearClassifierCV([0.1, 10.0], cv=cv, scoring=scorer, device="cpu")
        search._batch_folds = batch
        search.fit(X, y, groups=tags, w_score=weight)
        tested = [test for _, test in cv.split(X, y)]
        # The fold each call scored, told by its rows' tags (the calls' order is the path's).
        folds = [
            next(f for f, test in enumerate(tested) if np.array_equal(tags[test], groups))
            for groups, _ in seen
        ]
        assert sorted(folds) == [0, 0, 1, 1, 2, 2]  # each fold at both values
        for (_, got), fold in zip(seen, folds, strict=True):
            np.testing.assert_allclose(got, weight[tested[fold]])
        seen.clear()
        score = search.score(X, y, groups=tags, w_score=weight)
        np.testing.assert_array_equal(seen[0][0], tags)
        assert score == pytest.approx(np.average(search.predict(X) == y, weights=weight))
    with pytest.raises(ValueError, match="w_score"):  # without routing: refused
        search.fit(X, y, w_score=weight)
    with pytest.raises(ValueError, match="w_score"):
        search.score(X, y, w_score=weight)


# Found by mutation testing of _batched.py.
def test_a_held_out_row_that_overflows_leaves_the_fold_objective_finite():
    """A held-out row (weight zero) whose logits overflow to inf must not turn the fold's
    objective into NaN: the batch's objective and gradient are those of the fold without
    that row (kills: dropping the loss's masked_fill_(held_out, 0) in _blocks)."""
    from mr2_probe._batched import FoldBatch

    X, y = _blobs(n_classes=3, n=60)
    X = torch.as_tensor(StandardScaler().fit_transform(X))
    y = torch.as_tensor(y)
    huge = torch.full((1, X.shape[1]), 1e308, dtype=X.dtype)
    X_all, y_all = torch.cat([X, huge]), torch.cat([y, y[:1]])
    weight = torch.ones(1, len(y_all), dtype=X.dtype)
    weight[0, -1] = 0  # held out
    params = torch.linspace(-1, 1, 3 * 7, dtype=X.dtype)[None]
    everyone = torch.arange(1)
    inv_gamma = torch.ones(1, 3, dtype=X.dtype)
    center = X.mean(0)[None]
    with_row = FoldBatch(X_all, y_all, weight, inv_gamma, center, 3)
    without = FoldBatch(X, y, weight[:, :-1], inv_gamma, center, 3)
    value, grad = with_row.evaluate(params, everyone, 0.5)
    ref_value, ref_grad = without.evaluate(params, everyone, 0.5)
    assert torch.isfinite(value).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad)


def _batched_two_folds(n_classes=3, n=90, dtype=torch.float64, scale=1.0, intercept=True):
    from mr2_probe._batched import FoldBatch

    X, y = _blobs(n_classes=n_classes, n=n)
    X = torch.as_tensor(scale * StandardScaler().fit_transform(X), dtype=dtype)
    y = torch.as_tensor(y)
    weight = torch.ones(2, len(y), dtype=X.dtype)
    weight[0, : n // 3] = weight[1, n // 3 : 2 * n // 3] = 0
    center = torch.stack([X[w > 0].mean(0) for w in weight]) if intercept else None
    inv_gamma = torch.ones(2, n_classes, dtype=X.dtype)
    return FoldBatch(X, y, weight, inv_gamma, center, n_classes)


def _spoil_evaluations(batch, spoilt, rows=slice(None)):
    """Make ``batch.evaluate`` give NaN objectives and gradients (in ``rows`` of the folds
    evaluated) on the n-th evaluation, counted from 1, wherever ``spoilt(n)``. Returns the
    unspoilt evaluate and the list whose length counts the evaluations."""
    original, calls = batch.evaluate, []

    def evaluate(params, folds, C):
        value, grad = original(params, folds, C)
        calls.append(1)
        if spoilt(len(calls)):
            value[rows], grad[rows] = float("nan"), float("nan")
        return value, grad

    batch.evaluate = evaluate
    return original, calls


@pytest.mark.parametrize("short", [1, 2])
def test_a_line_search_that_runs_out_keeps_its_last_step_of_sufficient_decrease(short, monkeypatch):
    """A search that found steps too short (sufficient decrease, slope still steep; one, or
    two each doubling the last) and then ran out on a step too long (here a NaN evaluation,
    with its re-evaluations spent) takes the last short step: the fold moves and its
    objective decreases, instead of rejecting the iteration and stalling (kills: fallback =
    failed & (low < 0)), and the memory carries that step's own objective and gradient
    (kills: the first short trial's kept)."""
    import mr2_probe._batched as batched

    batch = _batched_two_folds(scale=0.01, intercept=False)  # steps 1 and 2 are too short
    monkeypatch.setattr(batched, "_MAX_LINE_SEARCH", short)
    monkeypatch.setattr(batched, "_next_step", lambda step, *args: 2 * step)
    # The start, the short trials, then a NaN one.
    original, calls = _spoil_evaluations(batch, lambda n: n == short + 2)
    params = batch.X.new_zeros(2, batch.n_params)
    everyone = torch.arange(2)
    start_value, _ = original(params.clone(), everyone, 1.0)
    memory = batched.Memory.empty(params, 10)
    result = batched.lbfgs_batched(batch, params, 1.0, max_iter=1, tol=1e-8, memory=memory)
    assert len(calls) == short + 2
    assert result.stop == ["max_iter", "max_iter"]
    assert (params != 0).any(1).all()
    value, grad = original(params, everyone, 1.0)
    assert (value < start_value).all()
    # What the memory carries to the next value is the objective and gradient there.
    torch.testing.assert_close(memory.value, value)
    torch.testing.assert_close(memory.grad, grad)


def test_forgotten_folds_take_a_gradient_step():
    """Memory.forget: a forgotten fold's next direction is −g (its pairs no longer count),
    the others' is unchanged (kills: forget leaving rho as it was)."""
    from mr2_probe._batched import Memory, _two_loop, lbfgs_batched

    batch = _batched_two_folds()
    params = batch.X.new_zeros(2, batch.n_params)
    memory = Memory.empty(params, 10)
    lbfgs_batched(batch, params, 1.0, max_iter=5, tol=1e-12, memory=memory)
    memory.compact()
    order = [(memory.slot - 1 - i) % 10 for i in range(memory.used)]
    g = torch.linspace(-1, 1, batch.n_params, dtype=params.dtype).repeat(2, 1)
    before = _two_loop(memory.s, memory.y, memory.rho, memory.h0, g.clone(), order)
    memory.forget(torch.tensor([True, False]))
    after = _two_loop(memory.s, memory.y, memory.rho, memory.h0, g.clone(), order)
    torch.testing.assert_close(after[0], -g[0])
    torch.testing.assert_close(after[1], before[1])


def test_max_iter_zero_leaves_every_fold_where_it_started():
    """lbfgs_batched with max_iter=0: no iteration, the start kept, stop "max_iter"
    (kills: `limit[f] < 0` for `limit[f] <= 0`)."""
    from mr2_probe._batched import lbfgs_batched

    batch = _batched_two_folds()
    params = batch.X.new_zeros(2, batch.n_params)
    result = lbfgs_batched(batch, params, 1.0, max_iter=0, tol=1e-8)
    assert (params == 0).all()
    assert list(result.n_iter) == [0, 0]
    assert result.stop == ["max_iter", "max_iter"]


def test_a_solve_from_another_point_than_the_memory_s_evaluates_there():
    """The memory's objective and gradient replace the first evaluation only where the
    solve starts at the memory's point: a start moved elsewhere (a bisection's nearest
    solution, an opened pair) is evaluated, not taken as converged from the stale gradient
    (kills: dropping `torch.equal(memory.point, params)`)."""
    from mr2_probe._batched import Memory, lbfgs_batched

    batch = _batched_two_folds()
    params = batch.X.new_zeros(2, batch.n_params)
    memory = Memory.empty(params, 10)
    lbfgs_batched(batch, params, 1.0, max_iter=500, tol=1e-8, memory=memory)
    solution = params.clone()
    params.zero_()  # start the same C again from elsewhere
    result = lbfgs_batched(batch, params, 1.0, max_iter=500, tol=1e-8, memory=memory)
    assert result.stop == ["tol", "tol"]
    assert (result.n_iter > 0).all()
    torch.testing.assert_close(params, solution, atol=1e-6, rtol=0)


@pytest.mark.parametrize("max_iter, stop", [(100, "stalled"), (2, "max_eval")])
def test_a_fold_whose_line_search_finds_no_decrease_stops_at_its_start(max_iter, stop):
    """Every trial step evaluates to NaN: the line search runs out without a decrease, and
    the fold stops after that one iteration where it started, "stalled", or "max_eval" when
    the search used up its 4·max_iter evaluations. The memory carries the start's
    objective and gradient to the next value."""
    from mr2_probe._batched import Memory, lbfgs_batched

    batch = _batched_two_folds()
    original, _ = _spoil_evaluations(batch, lambda n: n > 1)
    params = batch.X.new_zeros(2, batch.n_params)
    memory = Memory.empty(params, 10)
    result = lbfgs_batched(batch, params, 1.0, max_iter=max_iter, tol=1e-8, memory=memory)
    assert result.stop == [stop, stop]
    assert list(result.n_iter) == [1, 1]
    assert (params == 0).all()
    value, grad = original(params, torch.arange(2), 1.0)
    torch.testing.assert_close(memory.value, value)
    torch.testing.assert_close(memory.grad, grad)


def test_a_fold_stops_once_it_has_used_its_evaluations():
    """max_eval: a fold that has used exactly its evaluations after an iteration stops
    there, "max_eval"; the start's evaluation counts, as scipy's does."""
    from mr2_probe._batched import lbfgs_batched

    batch = _batched_two_folds()
    start = batch.X.new_zeros(2, batch.n_params)
    none = lbfgs_batched(batch, start.clone(), 1.0, max_iter=0, tol=1e-12)
    assert list(none.n_eval) == [1, 1]
    one = lbfgs_batched(batch, start.clone(), 1.0, max_iter=1, tol=1e-12)
    params = start.clone()
    result = lbfgs_batched(batch, params, 1.0, max_iter=100, tol=1e-12, max_eval=one.n_eval)
    assert result.stop == ["max_eval", "max_eval"]
    assert list(result.n_iter) == [1, 1]
    assert list(result.n_eval) == list(one.n_eval)


def test_a_tilted_search_s_batched_path_is_the_fits_of_its_cs(monkeypatch):
    """class_tilt > 0: the folds' batched path solves the tilted class risk (each sample's
    gradient weighted by its class's q_k / S_k), so each C's solution is a fit's on that
    fold's training rows."""
    X, y = _blobs(n_classes=3, n=120)
    X = StandardScaler().fit_transform(X)
    folds, Cs = _folds(y), [0.1, 1.0]
    common = dict(c_bar=None, class_tilt=1.0, tol=1e-6, max_iter=500, device="cpu")
    calls = _spy_batched(monkeypatch)
    search = MR2LinearClassifierCV(Cs, cv=folds, refit=False, **common).fit(X, y)
    assert calls == [3, 3]  # one batched solve of the 3 folds per C
    paths = np.stack([search.coefs_paths_[c] for c in search.classes_], axis=2)
    for f, (train, _) in enumerate(folds):
        for j, C in enumerate(Cs):
            cold = MR2LinearClassifier(C=C, **common).fit(X[train], y[train])
            expected = np.hstack([cold.coef_, cold.intercept_[:, None]])
            np.testing.assert_allclose(paths[f, j], expected, atol=1e-4)


def _diverging_search(Cs, cv=3, **params):
    """A search whose minibatch fits with a projection diverge at C = 10⁻⁶ and fit at
    C ≥ 10⁻⁵ (300 features, 60 rows: the penalty of P's 90,000 entries over C·Σw)."""
    X = np.random.default_rng(0).normal(size=(60, 300)).astype(np.float32)
    y = np.repeat(np.arange(3), 20)
    search = MR2LinearClassifierCV(
        Cs, cv=cv, lam=0.5, max_iter=5, random_state=0, device="cpu", **params
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return search.fit(X, y)


@pytest.mark.parametrize("refit", [True, False])
def test_a_value_whose_fit_diverges_scores_nan_and_the_search_goes_on(refit):
    # It stopped the whole search with the diverged fit's error; GridSearchCV records such
    # a candidate as failed and goes on. The values after it start cold, as without it.
    with pytest.warns(FitFailedWarning, match=r"3 of 12 fits failed.*C=1e-06 \(folds 0, 1, 2\)"):
        search = _diverging_search([1e-6, 1e-5, 1.0, 10.0], refit=refit)
    scores = search.scores_[0]
    assert np.isnan(scores[:, 0]).all() and np.isfinite(scores[:, 1:]).all()
    assert np.isnan(search.coefs_paths_[0][:, 0]).all()
    assert np.isnan(search.class_accuracy_path_[:, 0]).all()
    assert (search.n_iter_[0, :, 0] == 0).all() and (search.n_iter_[0, :, 1:] > 0).all()
    without = _diverging_search([1e-5, 1.0, 10.0], refit=refit)
    np.testing.assert_array_equal(scores[:, 1:], without.scores_[0])
    np.testing.assert_array_equal(search.coefs_paths_[0][:, 1:], without.coefs_paths_[0])
    assert search.C_ == without.C_ and search.C_ != 1e-6
    # The failed steps' NaN in the coefficients' dtype: float64 ones made the folds' mean,
    # refit=False's coef_ and a refit's start, float64 and other.
    assert search.coefs_paths_[0].dtype == np.float32
    np.testing.assert_array_equal(search.coef_, without.coef_)


def _failing_at(monkeypatch, fails, error="diverged", solving=None):
    """Fold paths whose fit at a value diverges, with ``error``, where ``fails(value, the
    fold's training weight)``; ``solving`` (a dict), when given, holds the value and weight
    of the fit solved last (the one scored next, the folds run one after another)."""
    real = MR2LinearClassifierCV._path_solver

    def path_solver(self, solver):
        solve = real(self, solver)

        def failing(head, data, value, cold, initial):
            if solving is not None:
                solving.update(value=value, weight_sum=float(data.weight_sum))
            if fails(value, data.weight_sum):
                raise FitDivergedError(error)
            return solve(head, data, value, cold, initial)

        return failing

    monkeypatch.setattr(MR2LinearClassifierCV, "_path_solver", path_solver)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=5
@pytest.mark.parametrize("refit", [True, False])
def test_values_failed_on_different_folds_block_a_refit_only(refit, monkeypatch):
    # Every value failed on some fold, no fold at every value: no value can be refitted,
    # but each fold has a best value of its own to average (refit=False).
    X, y = _blobs(n=60)
    rows = np.arange(60)
    folds = [(rows[:40], rows[40:]), (rows[15:], rows[:15])]
    _failing_at(
        monkeypatch, lambda value, weight_sum: (value, weight_sum) in {(0.1, 40), (1.0, 45)}
    )
    search = MR2LinearClassifierCV(
        [0.1, 1.0], cv=folds, solver="adam", max_iter=5, random_state=0, refit=refit, device="cpu"
    )
    if refit:
        with pytest.raises(FitDivergedError, match="Every value of Cs failed on some fold"):
            search.fit(X, y)
        return
    with pytest.warns(FitFailedWarning, match="2 of 4 fits failed"):
        search.fit(X, y)
    assert search.C_ == pytest.approx(0.55) and np.isfinite(search.coef_).all()


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=5
@pytest.mark.parametrize(
    "Cs, refit, nan_weight, raises",
    [
        ([1e-4, 100.0], True, 45, True),  # each value NaN on a fold: no finite sum
        ([1e-4, 100.0], False, 40, True),  # fold 0 NaN at every value
        ([1e-4, 1.0, 100.0], True, 45, False),  # C = 1 is left: a warning
    ],
)
def test_nan_scores_beside_failed_fits_name_the_failures_and_their_error(
    Cs, refit, nan_weight, raises, monkeypatch
):
    # The fit at C = 100 failed on fold 0 and the scorer was undefined at C = 10⁻⁴ on a
    # fold: the error (or warning) named the NaN scores alone, blaming the scorer for the
    # NaN that the failed fit left too. It names the failed fits and their error, in one
    # line (the FitFailedWarning too), as GridSearchCV's FitFailedWarning names them.
    X, y = _blobs(n=60)
    rows = np.arange(60)
    folds = [(rows[:40], rows[40:]), (rows[15:], rows[:15])]  # training weights 40, 45
    solving = {}
    _failing_at(
        monkeypatch,
        lambda value, weight_sum: (value, weight_sum) == (100.0, 40),
        error="Cannot fit: diverged\nat C=100",
        solving=solving,
    )

    def undefined_at_weak_c(estimator, X, y):
        return np.nan if solving == {"value": 1e-4, "weight_sum": nan_weight} else 0.5

    common = dict(solver="adam", max_iter=5, random_state=0, device="cpu")
    search = MR2LinearClassifierCV(Cs, cv=folds, refit=refit, scoring=undefined_at_weak_c, **common)
    nan_fold = 0 if nan_weight == 40 else 1
    fits = (
        r"the fits at C=100 \(fold 0\) failed \(the first error, at C=100 on fold 0: Cannot "
        r"fit: diverged at C=100\)\.$"
    )
    failed = r"1 of \d fits failed.*The first error, at C=100 on fold 0: .*diverged at C=100$"
    # (the error's after its cure: see test_the_cure_for_undefined_scores_outlasts_a_cut_line)
    said = rf"no finite score at C=0.0001 \(fold {nan_fold}\); besides, {fits}"
    expected = pytest.raises(ValueError, match=said)
    if not raises:
        said = rf"non-finite score at C=0.0001 \(fold {nan_fold}\), and {fits}"
        expected = pytest.warns(UserWarning, match=r"^One or more of the test scores.*" + said)
    with expected, pytest.warns(FitFailedWarning, match=failed):
        search.fit(X, y)
    if not raises:
        assert search.C_ == 1.0


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=2
@pytest.mark.parametrize("n_values, solver", [(2, "adam"), (40, "lbfgs")])
def test_the_cure_for_undefined_scores_outlasts_a_cut_line(n_values, solver, monkeypatch):
    # The failed fits' first error (2 values), or the values of undefined scores (40), came
    # before the scorer's cure, which mr2-probe's error line, cut at 1,000 characters, cut.
    X, y = _blobs(n=60)
    rows = np.arange(60)
    folds = [(rows[:40], rows[40:]), (rows[15:], rows[:15])]  # training weights 40, 45
    Cs = np.logspace(-4, 2, n_values)
    if solver == "adam":  # (the folds' paths that fail, solved one by one)
        long_error = "Cannot fit: " + "x" * 2000
        _failing_at(monkeypatch, lambda v, w: (v, w) == (100.0, 40), long_error)

    def undefined_on_fold_1(estimator, X, y):  # (its 15 held-out rows)
        return np.nan if len(y) == 15 else 0.5

    common = dict(solver=solver, max_iter=2, random_state=0, device="cpu")
    search = MR2LinearClassifierCV(Cs, cv=folds, scoring=undefined_on_fold_1, **common)
    with (
        pytest.raises(ValueError, match="No value of Cs has a defined held-out score") as info,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always", FitFailedWarning)
        search.fit(X, y)
    if solver == "adam":
        assert [w.category for w in caught] == [FitFailedWarning]
        assert "the fits at C=100 (fold 0) failed (the first error" in str(info.value)
    cut = one_line(info.value)  # (as the command says an error)
    assert len(cut) == 1000 and cut.endswith("…")
    assert "or a scoring defined without them (such as 'neg_log_loss')" in cut


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=5
def test_the_value_after_a_failed_one_starts_cold_as_the_first_did(monkeypatch):
    # Not on the line through the solutions before the failure: adam's result depends on
    # its start, so the value after the failed one is fitted as if it were the first.
    _failing_at(monkeypatch, lambda value, weight_sum: value == 1.0)
    X, y = _blobs()
    common = dict(cv=3, solver="adam", max_iter=5, random_state=0, refit=False, device="cpu")
    with pytest.warns(FitFailedWarning, match="C=1 "):
        path = MR2LinearClassifierCV([0.01, 0.1, 1.0, 10.0], **common).fit(X, y)
    alone = MR2LinearClassifierCV([10.0], **common).fit(X, y)
    np.testing.assert_array_equal(path.coefs_paths_[0][:, -1], alone.coefs_paths_[0][:, 0])


@pytest.mark.parametrize("refit", [True, False])
def test_a_search_whose_every_value_fails_names_the_error(refit):
    with pytest.raises(FitDivergedError, match=r"Every value of Cs failed.*at C=1e-07 on fold 0"):
        _diverging_search([1e-7, 1e-6], refit=refit)
    assert issubclass(FitDivergedError, ValueError)


def test_refit_false_names_the_fold_where_every_value_failed():
    # It named the first failure, on fold 0, where the second value had fitted.
    train = [np.r_[0:15, 20:35, 40:55], np.r_[0:7, 20:27, 40:47]]  # fewer rows: C too small
    folds = [(rows, np.setdiff1d(np.arange(60), rows)) for rows in train]
    with pytest.raises(FitDivergedError, match=r"failed on one fold.*at C=3.16e-06 on fold 1"):
        _diverging_search([3.16e-6, 5.62e-6], refit=False, cv=folds)


@pytest.mark.parametrize("refit", [True, False])
def test_a_failed_value_and_a_fold_scoring_nan_everywhere_refuse_the_search(refit):
    # A fold that holds out no sample of the "hard" group scores NaN at every value: the
    # failed value tied with the others there and, listed first, was chosen (refit=False:
    # NaN coefficients that predicted one class; refit=True: the refit failed); then the
    # next value was, without a word. No value has a score there: the search refuses.
    scoring = make_scorer(group_accuracy, groups_by_label={0: "e", 1: "e", 2: "h"}, group="h")
    held_out = [np.r_[0:10, 20:30], np.r_[10:20, 40:50], np.r_[30:40, 50:60]]
    folds = [(np.setdiff1d(np.arange(60), rows), rows) for rows in held_out]
    where = "summed over the folds" if refit else "on fold 0"
    with (
        pytest.raises(ValueError, match=rf"No value of Cs has a defined held-out score {where}"),
        pytest.warns(FitFailedWarning, match="C=1e-06"),
    ):
        _diverging_search([1e-6, 1e-5, 1.0], refit=refit, cv=folds, scoring=scoring)


def test_a_value_failed_on_one_fold_is_never_refitted_where_every_sum_is_nan():
    # Every value's sum over the folds is NaN (fold 2 holds out no sample of the group):
    # the value that failed on fold 1 alone was never the one refitted, but the other
    # was, without a word. The search now refuses, naming the fold of NaN scores.
    scoring = make_scorer(group_accuracy, groups_by_label={0: "e", 1: "e", 2: "h"}, group="h")
    train = [np.r_[0:15, 20:35, 40:55], np.r_[0:7, 20:27, 40:47], np.r_[5:20, 25:60]]
    folds = [(rows, np.setdiff1d(np.arange(60), rows)) for rows in train]
    with (
        pytest.raises(ValueError, match=r"defined held-out score.*1e-05 \(fold 2\)"),
        pytest.warns(FitFailedWarning, match=r"1 of 6 fits failed.*C=4.2e-06 \(fold 1\)"),
    ):
        _diverging_search([4.2e-6, 1e-5], cv=folds, scoring=scoring)


def test_a_refit_that_diverges_names_the_refit_and_the_chosen_value():
    # Every fold fits at scale 1000, the refit on all rows does not: its error named
    # neither the refit nor the scale, only the projection's C = 1.
    match = r"^The refit on all the data at the chosen scale=1000 failed.*adam solver diverged"
    with pytest.raises(FitDivergedError, match=match):
        _diverging_search([1000.0], head="cosine", learning_rate=1.0)


def test_features_too_large_fail_a_search_at_once(tmp_path):
    # An error in the data is no value's failure: it was recorded as one, at C = 1e30, and
    # the search went on.
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    X = rng.normal(size=(60, 5))
    X[:20] += 1
    X[20:40, 0] -= 1
    # (4e9 fits since the intercept takes their scale, float32's 4e15 since L-BFGS computes
    # in float64, as float64's does)
    X = X * 1e100
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X
    search = MR2LinearClassifierCV([1e-4, 1.0, 1e30], cv=3, max_iter=50, device="cpu")
    with h5py.File(tmp_path / "x.h5", "r") as f, warnings.catch_warnings():
        warnings.simplefilter("error", FitFailedWarning)
        # (the folds' fits at C = 1e-4 stall at their start, as the same array's do)
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.raises(ValueError, match="the features are too large") as info:
            search.fit(f["X"], y)
    assert not isinstance(info.value, FitDivergedError)


# lam > 0: adam's default 100 epochs on the C = 1 fits, short of convergence on raw iris.
@pytest.mark.filterwarnings("ignore:adam did not converge:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("lam", [0.0, 0.1])  # the batched path, and the folds' own fits
@pytest.mark.parametrize("n_classes", [3, 2])
@pytest.mark.slow
def test_a_c_whose_penalty_overflows_fails_on_every_path(lam, n_classes):
    # The batched path scored C = 1e-320 (1/(C·Σw) = inf in float32) at chance, with
    # ConvergenceWarnings, where the folds' own fits (and a single fit) failed there.
    # With two classes (one pinned row) its record held three class accuracies, and the
    # search failed ("inhomogeneous shape" of class_accuracy_path_).
    X, y = load_iris(return_X_y=True)
    X, y = X[y < n_classes].astype(np.float32), y[y < n_classes]
    search = MR2LinearClassifierCV([1e-320, 1.0], cv=3, device="cpu", lam=lam)
    with pytest.warns(FitFailedWarning, match=r"3 of 6 fits failed.*\(folds 0, 1, 2\)"):
        search.fit(X, y)
    scores, coefs = (next(iter(d.values())) for d in (search.scores_, search.coefs_paths_))
    assert np.isnan(scores[:, 0]).all() and not np.isnan(scores[:, 1]).any()
    assert np.isnan(coefs[:, 0]).all() and search.C_ == 1.0
    assert search.class_accuracy_path_.shape == (3, 2, n_classes)


@pytest.mark.parametrize("dtype, C", [(np.float64, 1e-300), (np.float32, 1e-44)])
def test_a_c_whose_penalty_squared_overflows_fails_as_a_single_fit_does(dtype, C):
    # 1/(C·Σw) finite but its square not (6.7e297 in float64): a single fit failed there
    # (FitDivergedError, its line search NaN), and the batched path scored it at chance.
    # (A float32 single fit, whose L-BFGS computes in float64, fails where the penalty
    # itself overflows float32: at C = 1e-30 it stops at its start, as in float64.)
    X, y = load_iris(return_X_y=True)
    X = X.astype(dtype)
    with pytest.raises(FitDivergedError):
        MR2LinearClassifier(C=C, device="cpu").fit(X, y)
    search = MR2LinearClassifierCV([C, 1.0], cv=3, device="cpu")
    with pytest.warns(FitFailedWarning, match=r"3 of 6 fits failed.*\(folds 0, 1, 2\)"):
        search.fit(X, y)
    assert np.isnan(search.scores_[0][:, 0]).all() and search.C_ == 1.0


@pytest.mark.parametrize("lam", [0.0, 0.5])  # the batched path, and the folds' own fits
def test_a_cosine_scale_that_rounds_to_zero_fails_as_a_single_fit_does(lam):
    # float32's scale = 1e-300 is 0: the coefficients s·W were 0, every prediction the
    # first class, without a word (n_iter_ = 0); the search scored it at chance.
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    with pytest.raises(FitDivergedError, match="with scale=1e-300"):
        MR2LinearClassifier(head="cosine", scale=1e-300, lam=lam, device="cpu").fit(X, y)
    search = MR2LinearClassifierCV([1e-300, 1.0], head="cosine", lam=lam, max_iter=5, cv=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.warns(FitFailedWarning, match=r"3 of 6 fits failed.*scale=1e-300"):
            search.set_params(device="cpu").fit(X, y)
    assert np.isnan(search.scores_[0][:, 0]).all() and search.C_ == 1.0


def test_a_failed_c_of_the_batched_path_is_recorded_under_another_default_device():
    # torch.set_default_device("cuda") in a user's session ("meta" stands for it): the
    # batched path's record of a failed C took its dtype from a tensor made there, and
    # the search failed ("can't convert cuda:0 device type tensor to numpy").
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    expected = MR2LinearClassifierCV([1e-320, 1.0], cv=3, device="cpu")
    with pytest.warns(FitFailedWarning):
        expected.fit(X, y)
    search = MR2LinearClassifierCV([1e-320, 1.0], cv=3, device="cpu")
    torch.set_default_device("meta")
    try:
        with pytest.warns(FitFailedWarning, match=r"3 of 6 fits failed"):
            search.fit(X, y)
    finally:
        torch.set_default_device(None)
    np.testing.assert_array_equal(search.coef_, expected.coef_)


def test_a_minibatch_c_whose_penalty_overflows_fails_without_numpy_s_warning():
    # The search's C is a NumPy float: 1/(C·Σw) let "overflow encountered in scalar
    # divide" out of the minibatch solver before its own error said the same.
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([1e-320, 1.0], cv=3, device="cpu", solver="sgd", max_iter=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search.fit(X, y)
    assert np.isnan(search.scores_[0][:, 0]).all() and search.C_ == 1.0
    assert not [w for w in caught if "encountered" in str(w.message)]


@pytest.mark.parametrize("first", [1e-320, 1e-30, 1e-18, 1e-12])
def test_a_path_after_an_extreme_c_gives_the_next_c_s_cold_solution(first):
    # The batched memory carried from C = 1e-30 to C = 1: its correction cancelled all
    # but the rounding of the old penalty's curvature, and its step scale (1/reg, 1e-28)
    # was kept; C = 1 stopped after one iteration at the start, scored 0.707 against a
    # cold fit's 0.973, and tied with 1e-30, which was chosen. From a C whose penalty
    # 1/(C·S) overflows (1e-320), the correction made every pair and the carried
    # objective NaN: C = 1 stopped at its start and scored chance, 0.333.
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    params = dict(cv=3, max_iter=50, refit=False, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", FitFailedWarning)  # 1e-320 (the test below)
        path = MR2LinearClassifierCV([first, 1.0], **params).fit(X, y)
        cold = MR2LinearClassifierCV([1.0], **params).fit(X, y)
    np.testing.assert_array_equal(path.scores_[0][:, 1], cold.scores_[0][:, 0])
    # Both within tol of the minimiser from other starts: the path's C = 1 starts from the
    # intercept that the tiny C reached (8e-3 apart at intercepts of 9; 1e-3 when that C
    # left the intercept at 0, where the cold fit starts).
    np.testing.assert_allclose(path.coefs_paths_[0][:, 1], cold.coefs_paths_[0][:, 0], atol=1e-2)
    assert path.C_ == 1.0


def test_a_fold_whose_objective_nears_zero_stalls_on_an_absolute_change_below_ftol():
    """scipy's ftol, as fit_lbfgs takes it: a change of the objective by at most 64 ε of
    max(|f|, |f'|, 1), absolute below 1. Separable folds without a penalty and tol = 0
    stall at an objective of about 1e-14 (kills: a test relative to |f| alone, which
    iterated on until the objective was exactly 0)."""
    from mr2_probe._batched import lbfgs_batched

    batch = _batched_two_folds(n_classes=2, n=60, scale=3.0)
    params = batch.X.new_zeros(2, batch.n_params)
    result = lbfgs_batched(batch, params, float("inf"), max_iter=300, tol=0.0)
    assert result.stop == ["stalled", "stalled"]
    value, _ = batch.evaluate(params, torch.arange(2), float("inf"))
    assert ((value > 0) & (value < 1e-12)).all()


def test_a_memory_that_points_uphill_is_dropped_for_a_gradient_step():
    """A stored pair of negative curvature (s = g, y = −g) makes −H·g no descent direction:
    the fold steps along −g and drops that pair, which its later iterations would read
    again (kills: the step along −g with the pair kept)."""
    from mr2_probe._batched import Memory, lbfgs_batched

    batch = _batched_two_folds()
    params = batch.X.new_zeros(2, batch.n_params)
    _, g = batch.evaluate(params, torch.arange(2), 1.0)
    memory = Memory.empty(params, 5)
    memory.s[:, 0], memory.y[:, 0] = g, -g
    memory.rho[:, 0] = -1 / g.square().sum(1)
    memory.stamp[:, 0], memory.slot, memory.used, memory.clock = 0, 1, 1, 1
    result = lbfgs_batched(batch, params, 1.0, max_iter=1, tol=1e-12, memory=memory)
    assert result.n_iter.tolist() == [1, 1]
    assert (memory.rho[:, 0] == 0).all() and (memory.rho[:, 1] > 0).all()
    value, _ = batch.evaluate(params, torch.arange(2), 1.0)
    assert (value < np.log(3)).all()  # (from zero: log K)


@pytest.mark.parametrize("batch_folds", [True, False])
def test_a_float32_c_whose_penalty_squared_overflows_float32_alone_is_fitted(
    batch_folds, monkeypatch
):
    # float32's C = 1e-30 on iris: 1/(C·Σw) = 1e28, whose square overflows float32 but
    # not float64, in which a float32 fit's L-BFGS computes. The single fit converges, as
    # in float64 (it stopped after its first step with a ConvergenceWarning until its first
    # line search was retried from a shorter step); the batched path failed the value on
    # every fold (FitFailedWarning, NaN scores) where float64's search fitted it.
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = load_iris(return_X_y=True)
    scores = {}
    for dtype in (np.float64, np.float32):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FitFailedWarning)
            with warnings.catch_warnings():
                warnings.simplefilter("error", ConvergenceWarning)
                MR2LinearClassifier(C=1e-30, device="cpu").fit(X.astype(dtype), y)
            with pytest.warns(ConvergenceWarning, match="C=1e-30"):
                search = MR2LinearClassifierCV([1e-30, 1.0], cv=3, device="cpu")
                search.fit(X.astype(dtype), y)
        scores[dtype] = search.scores_[0]
        assert np.isfinite(search.coefs_paths_[0]).all() and search.C_ == 1.0
    np.testing.assert_allclose(scores[np.float32], scores[np.float64], atol=0.02)  # a row


@pytest.mark.parametrize("Cs", [[1.0], [1.0, 10.0]])
@pytest.mark.parametrize("batch_folds", [True, False])
def test_float32_weights_scaled_down_with_c_scaled_up_search_the_same_problem(
    batch_folds, Cs, monkeypatch
):
    # Weights of 1e-39 at C = 1e39 are the problem of weights of 1 at C = 1 (C·Σw the
    # same); the batched path formed C·Σw in float32, in which C = 1e39 is inf: the
    # penalty was 0, and the folds scored 1.0, 0.96, 0.96 (C = inf) for 0.98, 0.96, 0.98.
    # Along a path (C = 1 then 10, as 1e39 then 1e40) the memory carried to the next C is
    # corrected by the change of 1/(C·Σw), which formed in float32 (C = inf, no change)
    # left the last solve's gradient, below tol, as the next C's start: every fold
    # stopped there at 0 iterations.
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    searches = [
        MR2LinearClassifierCV([C / w for C in Cs], cv=3, device="cpu").fit(X, y, np.full(len(y), w))
        for w in (1.0, 1e-39)
    ]
    assert (searches[1].n_iter_ > 0).all()
    np.testing.assert_array_equal(searches[1].scores_[0], searches[0].scores_[0])
    np.testing.assert_array_equal(searches[1].n_iter_[..., :1], searches[0].n_iter_[..., :1])
    np.testing.assert_allclose(searches[1].coefs_paths_[0], searches[0].coefs_paths_[0], atol=0.1)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # W: C·Σw
@pytest.mark.parametrize(
    "name, Cs, checked, batch_folds",
    [
        ("iris", [1e-15, 1e-14, 1e-12, 1e-8, 1e-4, 1.0], [1e-14, 1.0], True),
        ("iris", [1e-14, 1.0], [1e-14, 1.0], False),
        pytest.param("digits", [1e-8, 1e-6, 1e-4], [1e-6], True, marks=pytest.mark.slow),
    ],
)
def test_the_path_at_a_tiny_c_reaches_a_single_fit_s_intercept(name, Cs, checked, batch_folds,
                                                               monkeypatch):  # fmt: skip
    # Float32, c_bar=1: the batched folds stopped after 1 or 2 iterations with the
    # intercept near 0 (0.13 from the single fit's on iris at C = 1e-14, held out 0.74
    # against its 0.34; digits / 16 at 1e-6, 0.85 against 0.10), one step size serving the
    # weights, stiffened by the penalty, and the unpenalised intercept. They take it in
    # the single fit's scale at each C now; from C = 1e-15 to 1 on iris the intercepts
    # must also not drift by a shift of every class's (7.7 at C = 1, had the L-BFGS pairs
    # been carried across the scales).
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    X, y = load_iris(return_X_y=True) if name == "iris" else load_digits(return_X_y=True)
    X = (X if name == "iris" else X / 16).astype(np.float32)
    folds = _folds(y)
    search = MR2LinearClassifierCV(Cs, cv=folds, refit=False, device="cpu").fit(X, y)
    for C in checked:
        j = list(search.Cs_).index(C)
        for f, (train, test) in enumerate(folds):
            single = MR2LinearClassifier(C=C, device="cpu").fit(X[train], y[train])
            intercept = np.array([search.coefs_paths_[k][f, j, -1] for k in search.classes_])
            # (both within tol of the minimiser: a few thousandths at intercepts of 10)
            atol = 2e-3 * max(1.0, np.abs(single.intercept_).max())
            np.testing.assert_allclose(intercept, single.intercept_, rtol=0, atol=atol)
            assert search.scores_[0][f, j] == single.score(X[test], y[test])
