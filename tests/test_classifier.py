"""Behaviour of MR2LinearClassifier: equivalences, inputs, fitted state, errors."""

import contextlib
import os
import pickle
import re
import subprocess
import sys
import time
import warnings

import joblib
import numpy as np
import pytest
import sklearn
import torch
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_digits, load_iris, make_blobs, make_classification
from sklearn.ensemble import StackingClassifier
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning, NotFittedError
from sklearn.frozen import FrozenEstimator
from sklearn.inspection import permutation_importance
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import (
    GridSearchCV,
    GroupKFold,
    KFold,
    StratifiedKFold,
    StratifiedShuffleSplit,
    cross_val_predict,
    cross_val_score,
)
from sklearn.multiclass import OneVsOneClassifier
from sklearn.multioutput import MultiOutputClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mr2_probe import (
    MR2LinearClassifier,
    MR2LinearClassifierCV,
    MR2Loss,
    TunedOffsetsClassifierCV,
    compactness_loss,
)
from mr2_probe._classifier import FitDivergedError
from tests._scripts import load_benchmark

cuda = pytest.mark.cuda  # skipped without CUDA (tests/conftest.py)


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def _blobs(n_classes=4, n=240, seed=0):
    X, y = make_blobs(n_samples=n, centers=n_classes, n_features=6, random_state=seed)
    return X, y


@pytest.mark.parametrize("n_classes", [3, 2])
def test_features_of_a_large_scale_reach_the_optimum_with_an_intercept(n_classes):
    # Scaled by 10⁶ (an exact change of coordinates, at C·10⁻¹²), the fit stalled at 74.5%
    # against the optimum's 83%: the intercept's curvature (1) against the weights' (10¹²)
    # left it a step of 10⁻¹², and torch's L-BFGS stopped on its absolute tests.
    # Three overlapping classes of 10 standard normal features (LogisticRegression's
    # optimum predicts 83% of them), as bench_feature_scale.py measures them.
    Z, y = load_benchmark("bench_feature_scale").data()
    y = np.minimum(y, n_classes - 1)
    common = dict(c_bar=None, max_iter=1000, device="cpu")
    reference = MR2LinearClassifier(C=1.0, **common).fit(Z, y)
    for s in (1e3, 1e6):
        X = Z * s + 5 * s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # gradients of 10⁶ features
            clf = MR2LinearClassifier(C=1.0 / s**2, **common).fit(X, y)
        np.testing.assert_array_equal(clf.predict(X), reference.predict(Z))
        np.testing.assert_allclose(clf.coef_ * s, reference.coef_, rtol=0, atol=1e-2)
        assert clf.n_iter_ < 100


def test_lbfgs_keeps_the_curvature_of_small_steps():
    # Features times 1000 at C·10⁻⁶ (the same problem): near tol the steps' curvature
    # sᵀy is below 10⁻¹⁰, and torch's L-BFGS dropped every such pair; it stalled after 31
    # iterations, short of tol. Kept where sᵀy > ε·|gᵀs| (L-BFGS-B's test), it reaches tol.
    X, y = make_blobs(n_samples=120, centers=3, n_features=4, cluster_std=3, random_state=0)
    common = dict(c_bar=None, fit_intercept=False, device="cpu")
    reference = MR2LinearClassifier(**common).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = MR2LinearClassifier(C=1e-6, **common).fit(X * 1e3, y)
    np.testing.assert_allclose(clf.coef_ * 1e3, reference.coef_, rtol=0, atol=1e-3)


def test_the_intercept_is_scaled_only_for_features_of_a_large_scale(digits):
    from mr2_probe._stats import class_statistics, intercept_scale

    X, y = digits  # pixels / 16: raw (0 to 16), an RMS of 4.3 about the mean, left as it is
    for scale, expected in ((16.0, 1.0), (1.0, 1.0), (128.0, 32.0), (2.0**24, 2.0**22)):
        stats = class_statistics(torch.as_tensor(X * scale), torch.as_tensor(y), 10)
        assert float(intercept_scale(stats)) == expected
    constant = class_statistics(torch.ones(6, 3), torch.tensor([0, 1] * 3), 2)
    assert float(intercept_scale(constant)) == 1.0


@pytest.mark.parametrize("n_classes", [3, 2])
def test_a_warm_start_on_features_of_a_large_scale_starts_at_the_previous_intercept(n_classes):
    # While L-BFGS runs, the intercept is (b + W·m) / σ_b (σ_b = 4096 and 2048 here): a
    # warm start's enters it so, and leaves it so. max_iter=0 keeps the start, the
    # previous fit.
    X, y = _blobs(n_classes=n_classes)
    X = X * 1000 + 5000
    clf = MR2LinearClassifier(C=1e-6, warm_start=True, device="cpu").fit(X, y)
    coef, intercept = clf.coef_.copy(), clf.intercept_.copy()
    clf.set_params(max_iter=0).fit(X, y)
    np.testing.assert_allclose(clf.intercept_, intercept, rtol=1e-12)
    np.testing.assert_allclose(clf.coef_, coef, rtol=1e-12)


@pytest.mark.parametrize(
    "n_classes, C", [(2, 1.0), (3, 0.1), pytest.param(10, 1.0, marks=pytest.mark.slow)]
)
def test_no_margin_no_compactness_is_logistic_regression(digits, n_classes, C):
    X, y = digits
    keep = y < n_classes
    X, y = X[keep], y[keep]
    ours = MR2LinearClassifier(c_bar=None, lam=0, C=C, tol=1e-7, max_iter=3000, device="cpu")
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=20000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X, y)
        ref.fit(X, y)
    assert ours.coef_.shape == ref.coef_.shape
    # Same objective, both solved to a small gradient: digits is ill-conditioned along the
    # intercepts, which therefore agree a little less closely than the coefficients.
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=5e-4)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=2e-3)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-4)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


def test_c_inf_is_logistic_regression_without_penalty():
    # scikit-learn deprecates penalty=None for C=np.inf, which was refused here.
    X, y = make_classification(
        600, 20, n_informative=8, n_classes=3, flip_y=0.2, random_state=0
    )  # fmt: skip
    ours = MR2LinearClassifier(c_bar=None, C=np.inf, tol=1e-7, max_iter=1000, device="cpu")
    ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=5000).fit(X, y)
    np.testing.assert_allclose(ours.fit(X, y).coef_, ref.coef_, atol=1e-5)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-5)


@pytest.mark.parametrize("params", [{}, dict(head="cosine"), dict(lam=0.5), dict(class_tilt=1.0)])
def test_max_iter_zero_keeps_the_starting_point(digits, params):
    # scikit-learn accepts max_iter=0; it was refused here.
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="max_iter=0"):
        clf = MR2LinearClassifier(max_iter=0, device="cpu", **params).fit(X, y)
    assert clf.n_iter_ == 0
    if params.get("head") == "cosine":  # the class means' directions: nearest class mean
        unit = X / np.linalg.norm(X, axis=1, keepdims=True)
        means = np.stack([unit[y == k].mean(0) for k in clf.classes_])
        means /= np.linalg.norm(means, axis=1, keepdims=True)
        np.testing.assert_allclose(clf.coef_ / clf.scale, means, atol=1e-6)
    elif not params:
        assert not clf.coef_.any() and not clf.intercept_.any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm = MR2LinearClassifier(max_iter=5, warm_start=True, device="cpu").fit(X, y)
    before = warm.coef_.copy()
    with pytest.warns(ConvergenceWarning, match="max_iter=0"):
        warm.set_params(max_iter=0).fit(X, y)
    np.testing.assert_array_equal(warm.coef_, before)


def test_margins_are_training_only(digits):
    X, y = digits
    clf = MR2LinearClassifier(c_bar=2.0, device="cpu", max_iter=300).fit(X, y)
    z = X @ clf.coef_.T + clf.intercept_
    # (a logit near 0 is held to the logits' scale: its rounding depends on the blocking)
    np.testing.assert_allclose(clf.decision_function(X), z, rtol=1e-10, atol=1e-10 * abs(z).max())
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[z.argmax(1)])
    np.testing.assert_allclose(clf.predict_proba(X).sum(1), 1.0)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), clf.predict_proba(X))
    assert clf.margins_.mean() == pytest.approx(2.0)
    assert not np.allclose(clf.margins_, 2.0)


def test_margins_change_the_solution_and_follow_spread():
    rng = np.random.default_rng(0)
    spreads = np.array([0.3, 0.6, 1.2, 2.4])
    y = np.repeat(np.arange(4), 100)
    X = rng.normal(size=(400, 5)) * spreads[y, None] + rng.normal(size=(4, 5))[y] * 0.5
    plain = MR2LinearClassifier(c_bar=None, device="cpu").fit(X, y)
    mr2 = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(X, y)
    assert np.all(np.diff(mr2.margins_[np.argsort(spreads)]) > 0) or np.all(
        np.diff(np.argsort(mr2.class_stats_["difficulty"])) != 0
    )
    assert np.corrcoef(mr2.margins_, mr2.class_stats_["msd"])[0, 1] > 0.9
    np.testing.assert_allclose(plain.margins_, 1.0)
    assert np.abs(plain.coef_ - mr2.coef_).max() > 1e-2


def test_c_bar_is_a_rescaling_of_C_for_the_linear_head(digits):
    # W·x/(c̄·γ̃) with penalty ‖W‖²/C is, for W = c̄·V, V·x/γ̃ with penalty ‖V‖²/(C/c̄²).
    X, y = digits
    X = X / 16.0
    one = MR2LinearClassifier(c_bar=1.0, C=0.1, tol=1e-7, max_iter=1000, device="cpu").fit(X, y)
    two = MR2LinearClassifier(c_bar=2.0, C=0.4, tol=1e-7, max_iter=1000, device="cpu").fit(X, y)
    np.testing.assert_allclose(two.coef_, 2 * one.coef_, atol=2e-3 * np.abs(one.coef_).max())
    np.testing.assert_array_equal(two.predict(X), one.predict(X))


@pytest.mark.parametrize("c_bar", [50.0, 1e4])
def test_a_large_c_bar_stops_where_the_same_problem_at_c_bar_one_does(digits, c_bar):
    # c̄ divides the gradient in W by c̄: tested on it, tol was met 50 times sooner at
    # c̄ = 50 (9% of the predictions changed), and at c̄ = 1e4 at the start: zeros,
    # n_iter_ = 0 and no warning. (W, b) / c̄ is a point of the problem at c̄ = 1 and
    # C / c̄²: started there, that fit meets tol at once. (The two fits take other paths to
    # tol, 26 iterations and 4 at c̄ = 1e4, and end 8e-4·scale apart, both within it.)
    X, y = digits
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        large = MR2LinearClassifier(c_bar=c_bar, device="cpu").fit(X, y)
        one = MR2LinearClassifier(
            c_bar=1.0, C=1 / c_bar**2, warm_start=True, max_iter=0, device="cpu"
        )
        one.coef_, one.intercept_ = large.coef_ / c_bar, large.intercept_ / c_bar
        one.fit(X, y)  # (max_iter=0: its starting point's gradient tested on tol, or a warning)
    assert large.n_iter_ > 0
    reference = MR2LinearClassifier(c_bar=1.0, C=1 / c_bar**2, device="cpu").fit(X, y)
    np.testing.assert_array_equal(large.predict(X), reference.predict(X))


@pytest.mark.parametrize("c_bar", [0.01, 0.1])
def test_a_small_c_bar_fit_that_met_its_test_does_not_warn(c_bar):
    # L-BFGS stops on c̄ times the gradient in W (the problem at c_bar=1 and C / c̄²):
    # the same test decides whether it converged, or every such fit warned.
    X, y = load_digits(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = MR2LinearClassifier(c_bar=c_bar, C=c_bar**2, device="cpu").fit(
            X[:600] / 16, y[:600]
        )
    assert 0 < model.n_iter_ < model.max_iter


def test_a_cosine_heads_c_bar_is_no_unit_of_its_gradient_test():
    # Its objective depends on scale / c̄ alone: (c̄ = 50, scale 500) is the fit of (1, 10),
    # stopped by the same test (tested on 50 times the gradient, it ran 15 steps more).
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16, y[:600]
    fits = [
        MR2LinearClassifier(head="cosine", c_bar=c_bar, scale=10 * c_bar, device="cpu").fit(X, y)
        for c_bar in (1.0, 50.0)
    ]
    assert fits[0].n_iter_ == fits[1].n_iter_
    np.testing.assert_array_equal(fits[0].predict(X), fits[1].predict(X))


def test_spread_difficulty_uses_the_spread_around_the_class_mean(digits):
    X, y = digits
    moment = MR2LinearClassifier(c_bar=1.0, C=0.1, device="cpu").fit(X, y)
    spread = MR2LinearClassifier(c_bar=1.0, C=0.1, difficulty="spread", device="cpu").fit(X, y)
    stats = spread.class_stats_
    np.testing.assert_allclose(stats["difficulty"], stats["msd"])
    np.testing.assert_allclose(
        moment.class_stats_["difficulty"], (stats["mean"] ** 2).sum(1) + stats["msd"], rtol=1e-6
    )
    root = np.cbrt(stats["msd"])
    np.testing.assert_allclose(spread.margins_, len(root) * root / root.sum(), rtol=1e-5)
    assert not np.allclose(spread.margins_, moment.margins_, atol=1e-3)


def test_a_class_without_measurable_spread_gets_the_mean_margin():
    # One sample (or copies of one embedding) has spread 0: its margin was floored at 1e-6
    # of the largest, which multiplied its logits by about 10⁶.
    X = np.random.RandomState(0).randn(68, 4)
    y = np.r_[[0, 1] * 30, 2, 3, 3, 3, 3, 4, 4, 4]
    X[-7:-3] = X[-4]  # class 3: four copies of one row (spread exactly 0)
    X[-3:] = [0.1, 0.7, 0.3, 1 / 3]  # class 4: three copies, whose spread rounds to ~1e-33
    model = MR2LinearClassifier(c_bar=2.0, difficulty="spread", device="cpu")
    model = _short_fit(model, X, y)
    assert 0 < model.class_stats_["msd"][4] < 1e-20
    np.testing.assert_array_equal(model.margins_[2:], 2.0)
    root = np.cbrt(model.class_stats_["msd"][:2])
    np.testing.assert_allclose(model.margins_[:2], 2.0 * 2 * root / root.sum(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_classes_that_are_all_copies_of_one_row_get_uniform_margins(dtype):
    # Every class's spread was rounding (1e-32 to 1e-12): the largest of them was the
    # yardstick, and margins from 0.73 to 1.34 were set by floating-point noise.
    rng = np.random.RandomState(0)
    X = np.repeat(rng.normal(size=(6, 5)) * 3 + 5, 7, axis=0).astype(dtype)
    y = np.repeat(np.arange(6), 7)
    weight = rng.uniform(0.1, 3, len(y))
    model = MR2LinearClassifier(difficulty="spread", head="cosine", device="cpu")
    model = _short_fit(model, X, y, sample_weight=weight)
    assert model.class_stats_["msd"].max() > 0  # rounding, not an exact 0
    np.testing.assert_array_equal(model.margins_, 1.0)
    criterion = MR2Loss(6, 5, difficulty="spread").to(torch.from_numpy(X).dtype)
    criterion.update(torch.from_numpy(X), torch.from_numpy(y))
    assert criterion.stats().msd.max() > 0
    assert (criterion.margins() == 1.0).all()


def test_compactness_of_classes_that_are_all_copies_of_one_row_is_finite(digits):
    # τ = 2 s̄ was 1e-33 (s̄ rounding): a distance's rounding error made an exponent of
    # 1e16, and the fit was refused as diverging, blaming learning_rate at any value.
    X, y = digits
    X, y = np.repeat(X[:10], 5, axis=0), np.repeat(y[:10], 5)
    model = MR2LinearClassifier(lam=0.5, learning_rate=1e-6, max_iter=5, random_state=0)
    model = _short_fit(model.set_params(device="cpu"), X, y)
    assert np.isfinite(model.loss_curve_).all() and model.loss_curve_[-1] < 10
    criterion = MR2Loss(10, X.shape[1], lam=0.5, tau=None).double()
    phi, target = torch.from_numpy(X), torch.from_numpy(y)
    criterion.update(phi, target)
    assert torch.isfinite(
        criterion(phi @ torch.zeros(X.shape[1], 10, dtype=phi.dtype), phi, target)
    )


@pytest.mark.slow
def test_paper_call_works_and_learns_a_projection(digits):
    X, y = digits
    clf = MR2LinearClassifier(c_bar=2, lam=0.5, p=3, max_iter=15, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    assert clf.solver_ == "adam" and clf.p_ == 3.0
    assert clf.projection_.shape == (64, 64)
    assert not np.allclose(clf.projection_, np.eye(64))
    assert clf.score(X, y) > 0.9
    assert clf.margins_.mean() == pytest.approx(2.0)
    assert len(clf.loss_curve_) == clf.n_iter_ == 15


def test_lbfgs_loss_curve_holds_the_start_then_each_iteration(digits):
    X, y = digits
    clf = MR2LinearClassifier(c_bar=2, device="cpu").fit(X, y)
    assert len(clf.loss_curve_) == clf.n_iter_ + 1
    assert clf.loss_curve_[0] == pytest.approx(np.log(10))  # zero weights: uniform
    assert clf.loss_curve_[-1] < clf.loss_curve_[1] < clf.loss_curve_[0]


def test_low_rank_projection_under_another_default_device(digits):
    # torch.set_default_device("cuda") in a user's session: the projection's random start,
    # drawn with a CPU generator, must still be drawn on the CPU ("meta" stands for CUDA).
    X, y = digits
    torch.set_default_device("meta")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf = MR2LinearClassifier(
                lam=0.5, projection_rank=8, max_iter=2, random_state=0, device="cpu"
            ).fit(X, y)
    finally:
        torch.set_default_device(None)
    assert clf.projection_.shape == (64, 64) and np.isfinite(clf.projection_).all()


def test_low_rank_projection(digits):
    X, y = digits
    clf = MR2LinearClassifier(lam=0.5, projection_rank=4, max_iter=5, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    assert np.linalg.matrix_rank(clf.projection_ - np.eye(64), tol=1e-6) <= 4
    # The linear head folds P into coef_.
    np.testing.assert_allclose(
        clf.decision_function(X), X @ clf.coef_.T + clf.intercept_, rtol=1e-5, atol=1e-8
    )


@pytest.mark.slow
def test_compactness_weight_lowers_the_compactness_loss(digits):
    X, y = digits
    kwargs = dict(c_bar=1.0, max_iter=20, random_state=0, device="cpu", learning_rate=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        loose = MR2LinearClassifier(lam=1e-8, **kwargs).fit(X, y)
        tight = MR2LinearClassifier(lam=2.0, **kwargs).fit(X, y)

    def compactness(clf):
        phi = torch.as_tensor(X @ clf.projection_.T)
        s_bar = float(clf.class_stats_["msd_l2"].mean())
        return float(compactness_loss(phi, torch.as_tensor(y), s_bar, 2 * s_bar))

    assert compactness(tight) < compactness(loose) - 0.1


def test_cosine_head_defaults_to_p3_and_ignores_feature_scale(digits):
    X, y = digits
    clf = MR2LinearClassifier(head="cosine", device="cpu").fit(X, y)
    assert clf.p_ == 3.0
    np.testing.assert_allclose(clf.intercept_, 0.0)
    np.testing.assert_allclose(clf.decision_function(5 * X), clf.decision_function(X))
    assert clf.score(X, y) > 0.9


@pytest.mark.parametrize("labels", [["cat", "dog", "eel"], [-3, 7, 100], [True, False]])
def test_any_label_type(labels):
    X, y = _blobs(len(labels))
    y = np.asarray(labels)[y]
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    assert set(clf.classes_) == set(labels)
    assert clf.score(X, y) > 0.9
    assert clf.predict(X).dtype == clf.classes_.dtype


def test_dataframe_keeps_feature_names():
    pd = pytest.importorskip("pandas")
    X, y = _blobs()
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    clf = MR2LinearClassifier(device="cpu").fit(frame, y)
    np.testing.assert_array_equal(clf.feature_names_in_, frame.columns)
    # An array without the names is taken with scikit-learn's warning.
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        np.testing.assert_array_equal(clf.predict(frame), clf.predict(X.copy()))


def _with_an_absent_class(X, y):
    """X, y with class 3 cut to 3 samples, placed first: unshuffled KFold(5) trains its
    first fold without them."""
    keep = (y != 3) | (np.cumsum(y == 3) <= 3)
    X, y = X[keep], y[keep]
    order = np.argsort(y != 3, kind="stable")
    return X[order], y[order]


def _routed_pipeline(estimator, X, y, weights):
    with sklearn.config_context(enable_metadata_routing=True):
        estimator.set_fit_request(sample_weight=True)
        scaler = StandardScaler().set_fit_request(sample_weight=False)
        return make_pipeline(scaler, estimator).fit(X, y, sample_weight=weights).predict(X)


# Calls scikit-learn users make around any classifier: each returns, around the probe, what
# it returns around LogisticRegression (shape, dtype, warnings), predict_proba aside, whose
# float64 is the probe's (see its docstring).
ECOSYSTEM_CALLS = {
    "calibrated": lambda est, X, y: (
        CalibratedClassifierCV(est, cv=3, method="isotonic").fit(X, y).predict(X)
    ),
    "calibrated_frozen": lambda est, X, y: (
        CalibratedClassifierCV(FrozenEstimator(clone(est).fit(X, y)), method="sigmoid")
        .fit(X, y)
        .predict(X)
    ),
    "cross_val_predict_absent_class": lambda est, X, y: cross_val_predict(
        est, *_with_an_absent_class(X, y), cv=KFold(5), method="decision_function"
    ),
    "multioutput": lambda est, X, y: MultiOutputClassifier(est).fit(X, np.c_[y, y % 2]).predict(X),
    "one_vs_one": lambda est, X, y: OneVsOneClassifier(est).fit(X, y).decision_function(X),
    "stacking": lambda est, X, y: (
        StackingClassifier([("probe", est)], cv=3, stack_method="decision_function")
        .fit(X, y)
        .transform(X)
    ),
    "pipeline_weights": lambda est, X, y: (
        make_pipeline(StandardScaler(), est)
        .fit(X, y, **{f"{type(est).__name__.lower()}__sample_weight": np.linspace(0.5, 2, len(y))})
        .predict(X)
    ),
    "routed_weights": lambda est, X, y: _routed_pipeline(est, X, y, np.linspace(0.5, 2, len(y))),
    "permutation_importance": lambda est, X, y: (
        permutation_importance(clone(est).fit(X, y), X, y, n_repeats=2, random_state=0).importances
    ),
}


# 18 cases of several fits each (about 10 s): the full run's.
@pytest.mark.slow
@pytest.mark.parametrize("call", ECOSYSTEM_CALLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scikit_learn_tools_return_what_they_return_around_logistic_regression(call, dtype):
    X, y = _blobs(n=120)
    X = X.astype(dtype)
    outputs = {}
    for name, est in (("LR", LogisticRegression()), ("MR2", MR2LinearClassifier(device="cpu"))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = np.asarray(ECOSYSTEM_CALLS[call](est, X, y))
        said = {(w.category, str(w.message).replace(type(est).__name__, "EST")) for w in caught}
        outputs[name] = (out.shape, out.dtype, said)
    if LogisticRegression().fit(X, y).coef_.dtype != dtype:
        # (scikit-learn 1.6 fits LogisticRegression in float64 on float32 X, 1.9 in float32: its
        # decision values are float64 there, the probe's keep X's float32)
        outputs = {name: (shape, said) for name, (shape, _, said) in outputs.items()}
    assert outputs["MR2"] == outputs["LR"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_tensor_input_matches_numpy(digits, dtype):
    X, y = digits
    tensor = torch.as_tensor(X, dtype=dtype)
    from_tensor = MR2LinearClassifier(device="auto").fit(tensor, torch.as_tensor(y))
    from_numpy = MR2LinearClassifier(device="cpu").fit(tensor.numpy(), y)
    assert from_tensor.device_ == "cpu"
    np.testing.assert_allclose(from_tensor.coef_, from_numpy.coef_, rtol=1e-5, atol=1e-6)
    proba = from_tensor.predict_proba(tensor)
    assert isinstance(proba, torch.Tensor) and proba.dtype == torch.float64
    np.testing.assert_allclose(proba.numpy(), from_numpy.predict_proba(tensor.numpy()), atol=1e-5)
    np.testing.assert_array_equal(from_tensor.predict(tensor), from_numpy.predict(X))


@pytest.mark.slow
def test_h5py_dataset_is_streamed_not_loaded(tmp_path, digits, monkeypatch):
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _data

    X, y = digits
    path = tmp_path / "features.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X.astype(np.float32), chunks=(64, X.shape[1]))
    reads = []
    original = _data.H5Source._read

    def recording_read(self, start, stop):
        reads.append(stop - start)
        return original(self, start, stop)

    monkeypatch.setattr(_data, "block_rows", lambda n_features, n_classes: 256)
    monkeypatch.setattr(_data.H5Source, "_read", recording_read)
    from mr2_probe import _fit_inputs, _prediction

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 256)
    monkeypatch.setattr(_prediction, "block_rows", lambda n_features, n_classes: 256)
    with h5py.File(path, "r") as f:
        streamed = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(f["features"], y)
        assert max(reads) <= 256 < len(y)
        in_memory = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(X.astype(np.float32), y)
        np.testing.assert_allclose(streamed.coef_, in_memory.coef_, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(streamed.predict(f["features"]), in_memory.predict(X))


@pytest.mark.parametrize(
    "cv, works",
    [
        (StratifiedKFold(3, shuffle=True, random_state=0), True),
        (StratifiedShuffleSplit(2, test_size=0.3, random_state=0), False),
    ],
)
def test_an_outer_split_of_a_dataset_works_where_its_parts_are_in_increasing_order(
    tmp_path, cv, works
):
    # docs/estimator.md: scikit-learn indexes X with each part as the splitter gives it, and h5py
    # reads rows only at increasing indices; K-fold parts are (shuffled too), a shuffled
    # split's are not, and h5py refuses them before any fit.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n_classes=3, n=90)
    X = X.astype(np.float32)
    probe = MR2LinearClassifier(device="cpu")
    with h5py.File(tmp_path / "features.h5", "w") as f:
        f["features"] = X
        if works:
            scores = cross_val_score(probe, f["features"], y, cv=cv)
            np.testing.assert_allclose(scores, cross_val_score(probe, X, y, cv=cv))
        else:
            with pytest.raises(TypeError, match="increasing order"):
                cross_val_score(probe, f["features"], y, cv=cv)


def test_h5py_dataset_with_nan_is_rejected(tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = _blobs()
    X[7, 2] = np.nan
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f["features"] = X
        with pytest.raises(ValueError, match="NaN"):
            MR2LinearClassifier(device="cpu").fit(f["features"], y)


def test_a_dataset_of_a_closed_file_is_named(tmp_path):
    # X taken inside a store's with block and fitted after it: h5py's "Unable to
    # synchronously get dataspace (identifier is not of specified type)".
    h5py = pytest.importorskip("h5py")
    X, y = _blobs()
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["features"], f["labels"] = X, y
        clf = MR2LinearClassifier(device="cpu").fit(f["features"], y)
        features, labels = f["features"], f["labels"]
    with pytest.raises(ValueError, match="HDF5 file that is closed"):
        MR2LinearClassifier(device="cpu").fit(features, y)
    with pytest.raises(ValueError, match="HDF5 file that is closed"):
        MR2LinearClassifier(device="cpu").fit(X, labels)
    with pytest.raises(ValueError, match="HDF5 file that is closed"):
        clf.predict(features)
    # The weights too, in fit and score (h5py's words, "Invalid dataset identifier").
    search = MR2LinearClassifierCV([1.0], cv=2, scoring="balanced_accuracy").fit(X, y)
    for fit in (MR2LinearClassifier(device="cpu").fit, MR2LinearClassifierCV([1.0], cv=2).fit,
                clf.score, search.score):  # fmt: skip
        with pytest.raises(ValueError, match="sample_weight is a dataset of an HDF5 file that"):
            fit(X, y, sample_weight=labels)
    with pytest.raises(ValueError, match="y is a dataset of an HDF5 file that is closed"):
        search.score(X, labels)


@pytest.mark.parametrize("stored", [">f4", ">f8", "longdouble"])
def test_h5py_datasets_of_other_byte_orders_and_widths_fit(tmp_path, stored):
    # A big-endian store (written by other tools) failed in torch.from_numpy ("byte order
    # different from the native byte order"), a long-double one in "can't convert", in fit
    # and in the search; predictions on them worked.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs()
    expected = np.float32 if stored == ">f4" else np.float64  # the dtype computed in
    with h5py.File(tmp_path / "features.h5", "w") as f:
        f["features"] = X.astype(stored)
        clf = MR2LinearClassifier(device="cpu").fit(f["features"], y)
        in_memory = MR2LinearClassifier(device="cpu").fit(X.astype(expected), y)
        np.testing.assert_allclose(clf.coef_, in_memory.coef_, rtol=1e-5, atol=1e-6)
        search = MR2LinearClassifierCV([1.0], cv=2, device="cpu").fit(f["features"], y)
        assert search.coef_.dtype == expected


@pytest.mark.parametrize("stored", ["int16", "uint8", ">i2", "bool"])
def test_an_hdf5_dataset_of_integers_fits_and_predicts_as_the_same_array(tmp_path, stored):
    # check_array computes integers (and booleans) in float64; the same rows as an HDF5
    # dataset were computed in float32: a float32 model, coef_ 0.015 from the array's on
    # digits. The rows fit one read: the same sums, the same model.
    h5py = pytest.importorskip("h5py")
    X, y = load_digits(return_X_y=True)
    X, y = X[:300].astype(stored), y[:300]
    array = MR2LinearClassifier(device="cpu").fit(X, y)
    with h5py.File(tmp_path / "features.h5", "w") as f:
        f["features"] = X
        clf = MR2LinearClassifier(device="cpu").fit(f["features"], y)
        assert clf.coef_.dtype == array.coef_.dtype == np.float64
        np.testing.assert_array_equal(clf.coef_, array.coef_)
        np.testing.assert_array_equal(clf.intercept_, array.intercept_)
        for method in ("decision_function", "predict_proba", "predict"):
            got = getattr(array, method)(f["features"])
            assert got.dtype == getattr(array, method)(X).dtype
            np.testing.assert_array_equal(got, getattr(array, method)(X))
        assert array.score(f["features"], y) == array.score(X, y)


def test_an_hdf5_dataset_of_integers_beyond_float32_predicts_as_the_same_array(tmp_path):
    # Integers above 2**24 that float32 does not hold: its blocks were read in float32,
    # each rounded, where the array's are float64, exact.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs()
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    big = np.round(X).astype(np.int32) + (2**25 + 1)  # odd: float32's step there is 4
    with h5py.File(tmp_path / "features.h5", "w") as f:
        f["features"] = big
        scores = clf.decision_function(f["features"])
    np.testing.assert_array_equal(scores, clf.decision_function(big))


@pytest.mark.parametrize("order", [">f4", ">f2"])
def test_big_endian_arrays_fit_in_their_own_precision(order):
    # Big-endian float32 rows were fitted in float64 (check_array's dtype list takes them
    # for no float32), where the same rows as an HDF5 dataset or a tensor are float32.
    X, y = _blobs()
    X = X.astype(order)
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    native = MR2LinearClassifier(device="cpu").fit(X.astype(np.float32), y)
    assert clf.coef_.dtype == np.float32
    np.testing.assert_array_equal(clf.coef_, native.coef_)
    np.testing.assert_array_equal(clf.decision_function(X), native.decision_function(X))
    # A sparse matrix of them is refused in scikit-learn's words, as a native one is
    # (a conversion of any big-endian input ended in "setting an array element with a
    # sequence").
    from scipy import sparse

    matrix = sparse.csr_matrix(X.astype(np.float32))
    matrix.data = matrix.data.astype(order)
    with pytest.raises(TypeError, match="Sparse data was passed for X, but dense data"):
        MR2LinearClassifier(device="cpu").fit(matrix, y)


def test_pipeline_and_grid_search(digits):
    X, y = digits
    pipe = make_pipeline(StandardScaler(), MR2LinearClassifier(device="cpu"))
    grid = GridSearchCV(
        pipe, {"mr2linearclassifier__c_bar": [None, 1.0], "mr2linearclassifier__C": [0.1]}, cv=3
    )
    grid.fit(X, y)
    assert grid.best_score_ > 0.9
    assert grid.predict(X).shape == y.shape


def assert_predicts_in_a_process_without_gpu(models, tmp_path):
    """Dump each ``(model, X)`` of ``models`` with pickle and with joblib, load them all in
    one process where CUDA is hidden, and compare their probabilities on their X."""
    for i, (model, X) in enumerate(models):
        (tmp_path / f"{i}.pkl").write_bytes(pickle.dumps(model))
        joblib.dump(model, tmp_path / f"{i}.joblib")
        np.save(tmp_path / f"{i}.npy", X)
    code = (
        "import sys, pickle, joblib, numpy as np, torch\n"
        "assert not torch.cuda.is_available()\n"
        "folder = sys.argv[1]\n"
        "for i in range(int(sys.argv[2])):\n"
        "    X = np.load(f'{folder}/{i}.npy')\n"
        "    for clf, name in ((pickle.loads(open(f'{folder}/{i}.pkl', 'rb').read()), 'pickle'),\n"
        "                      (joblib.load(f'{folder}/{i}.joblib'), 'joblib')):\n"
        "        np.save(f'{folder}/{i}-{name}.npy', clf.predict_proba(X))\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # carried wheels on PYTHONPATH too
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(len(models))], check=True, env=env
    )
    for i, (model, X) in enumerate(models):
        for name in ("pickle", "joblib"):
            expected = model.predict_proba(X)
            np.testing.assert_allclose(np.load(tmp_path / f"{i}-{name}.npy"), expected)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_pickled_models_predict_in_a_process_without_gpu(tmp_path, digits, device):
    # The estimator, and the CV search in a pipeline, in one process (its start is most of
    # the time).
    X, y = digits
    clf = MR2LinearClassifier(c_bar=1.0, device=device).fit(X, y)
    assert all(not isinstance(v, torch.Tensor) for v in vars(clf).values())
    blobs, labels = make_blobs(
        n_samples=240, centers=4, n_features=6, cluster_std=3.0, random_state=0
    )
    pipe = make_pipeline(StandardScaler(), MR2LinearClassifierCV([0.1, 1.0], cv=3, device=device))
    pipe.fit(blobs, labels)
    assert_predicts_in_a_process_without_gpu([(clf, X), (pipe, blobs)], tmp_path)


@cuda
def test_cuda_fit_matches_cpu_and_keeps_tensors_on_device(digits):
    X, y = digits
    X32 = X.astype(np.float32)
    gpu = MR2LinearClassifier(c_bar=1.0, device="cuda").fit(X32, y)
    cpu = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(X32, y)
    assert gpu.device_.startswith("cuda")
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, rtol=1e-2, atol=1e-3)
    tensor = torch.as_tensor(X32, device="cuda")
    from_tensor = MR2LinearClassifier(c_bar=1.0).fit(tensor, torch.as_tensor(y, device="cuda"))
    assert from_tensor.device_.startswith("cuda")
    assert from_tensor.decision_function(tensor).device.type == "cuda"
    assert isinstance(from_tensor.coef_, np.ndarray)


@cuda
@pytest.mark.parametrize("params", [
    dict(c_bar=2.0, class_tilt=2.0),  # the tilted risk under L-BFGS
    dict(head="cosine", scale=16.0),
    dict(c_bar=2.0, lam=0.5, p=3, max_iter=30, random_state=0),  # Adam, a projection
])  # fmt: skip
def test_cuda_fits_of_every_kind_agree_with_the_cpu(digits, params):
    # Only the plain L-BFGS fit had a CUDA test. The minibatch order comes from a generator
    # on the device, so Adam's fits agree in their predictions, not their coefficients.
    X, y = digits
    X32 = X.astype(np.float32)
    weight = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    gpu = _short_fit(MR2LinearClassifier(device="cuda", **params), X32, y, sample_weight=weight)
    cpu = _short_fit(MR2LinearClassifier(device="cpu", **params), X32, y, sample_weight=weight)
    assert gpu.device_.startswith("cuda") and np.isfinite(gpu.coef_).all()
    assert np.mean(gpu.predict(X32) == cpu.predict(X32)) > 0.97
    # (with a projection, the margins are measured on the features it learned)
    np.testing.assert_allclose(
        gpu.margins_, cpu.margins_, rtol=1e-3 if "lam" not in params else 0.05
    )


@cuda
def test_cuda_fit_of_an_hdf5_dataset_matches_cpu(digits, tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = digits
    X32 = X.astype(np.float32)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X32
    with h5py.File(tmp_path / "x.h5", "r") as f:
        gpu = MR2LinearClassifier(c_bar=1.0, device="cuda").fit(f["X"], y)
    cpu = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(X32, y)
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, rtol=1e-2, atol=1e-3)


def _short_fit(model, X, y, **fit_params):
    """``model`` fitted, its ConvergenceWarning (a short max_iter's) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y, **fit_params)


def test_predictions_use_the_fitted_head_not_the_parameter(digits):
    X, y = digits
    model = _short_fit(MR2LinearClassifier(max_iter=50, device="cpu"), X, y)
    before = model.decision_function(X)
    model.set_params(head="cosine")  # not refitted: coef_ is still a linear head's
    np.testing.assert_array_equal(model.decision_function(X), before)
    assert model.head_ == "linear"


def test_a_start_that_meets_tol_counts_no_iteration(digits):
    # As LogisticRegression's n_iter_: it used to say 1 (with one loss_curve_ value).
    X, y = digits
    model = MR2LinearClassifier(tol=1e3, device="cpu").fit(X, y)
    assert model.n_iter_ == 0 and len(model.loss_curve_) == 1
    search = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=2, tol=1e3, device="cpu").fit(X, y)
    assert (search.n_iter_ == 0).all()


def test_empty_tensor_rows_are_refused_as_numpy_rows_are(digits):
    X, y = digits
    model = _short_fit(MR2LinearClassifier(max_iter=5, device="cpu"), X, y)
    for rows in (np.zeros((0, 64)), torch.zeros(0, 64)):
        with pytest.raises(ValueError, match="Found array with 0 sample"):
            model.predict(rows)


def test_a_class_of_no_weight_has_no_mean_loss(digits):
    X, y = digits
    weight = (y != 1).astype(float)
    model = _short_fit(MR2LinearClassifier(max_iter=5, device="cpu"), X, y, sample_weight=weight)
    assert np.isnan(model.class_losses_[1])
    assert np.isfinite(np.delete(model.class_losses_, 1)).all()
    np.testing.assert_allclose(model.tilt_weights_.sum(), 1.0)


def test_warm_start_continues_from_previous_solution(digits):
    X, y = digits
    clf = MR2LinearClassifier(c_bar=1.0, warm_start=True, device="cpu").fit(X, y)
    first = clf.n_iter_
    clf.fit(X, y)
    assert clf.n_iter_ < first
    cold = MR2LinearClassifier(c_bar=1.0, device="cpu").fit(X, y)
    np.testing.assert_allclose(clf.coef_, cold.coef_, atol=1e-2)


def test_class_weight_balanced_raises_minority_recall():
    X, y = make_blobs(n_samples=[400, 40], centers=[[0, 0], [1.5, 0]], random_state=0)
    plain = MR2LinearClassifier(device="cpu").fit(X, y)
    balanced = MR2LinearClassifier(class_weight="balanced", device="cpu").fit(X, y)
    recall = lambda clf: np.mean(clf.predict(X[y == 1]) == 1)  # noqa: E731
    assert recall(balanced) > recall(plain)


def test_convergence_warning_and_progress_bar(digits, capsys):
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        MR2LinearClassifier(max_iter=2, verbose=1, device="cpu").fit(X, y)
    assert "MR2 lbfgs" in capsys.readouterr().err


def test_a_minibatch_plateau_is_relative_to_the_epoch_loss():
    # tol is relative: epochs that lower a loss of 0.03 by 1% of itself (3e-4, below
    # tol=1e-3 in absolute terms) still improve it, and the fit goes on to max_iter.
    X, y = make_blobs(n_samples=200, centers=[[-3, 0], [3, 0]], random_state=0)
    clf = MR2LinearClassifier(
        C=np.inf, solver="adam", learning_rate=0.05, max_iter=80, tol=1e-3, device="cpu",
        random_state=0,
    )  # fmt: skip
    with pytest.warns(ConvergenceWarning, match="did not converge in max_iter=80"):
        clf.fit(X, y)
    curve = np.array(clf.loss_curve_)
    assert curve[-1] < 0.05 and (-np.diff(curve[-10:]) > 1e-3 * curve[-10:-1]).all()


def test_minibatch_is_reproducible_with_random_state(digits):
    X, y = digits
    kwargs = dict(solver="adam", max_iter=3, random_state=3, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = MR2LinearClassifier(**kwargs).fit(X, y)
        b = MR2LinearClassifier(**kwargs).fit(X, y)
        c = MR2LinearClassifier(**{**kwargs, "random_state": 4}).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert not np.array_equal(a.coef_, c.coef_)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"c_bar": 0.0}, "'c_bar' parameter of MR2LinearClassifier must be"),
        ({"c_bar": -1.0}, "'c_bar' parameter"),
        ({"p": 0.5}, "'p' parameter of MR2LinearClassifier must be"),
        ({"head": "mlp"}, "'head' parameter of MR2LinearClassifier must be"),
        ({"difficulty": "norm"}, "'difficulty' parameter of MR2LinearClassifier must be"),
        ({"lam": -0.1}, "'lam' parameter"),
        ({"C": 0}, "'C' parameter"),
        ({"solver": "lbfgs", "lam": 0.5}, "solver='lbfgs' requires lam=0"),
        # A batch of one holds no same-class pair: any lam was fitted as lam=0, unsaid.
        ({"lam": 0.5, "batch_size": 1}, r"lam=0.5 needs batch_size >= 2, got batch_size=1"),
        ({"scale": 0.0}, "'scale' parameter of MR2LinearClassifier must be"),
        ({"scale": -64.0}, "'scale' parameter"),
        ({"tau": 0.0}, "'tau' parameter"),
        ({"projection_rank": 0}, "'projection_rank' parameter"),
        ({"max_iter": -1}, "'max_iter' parameter"),
        ({"tol": -1e-4}, "'tol' parameter"),
        ({"batch_size": 0}, "'batch_size' parameter"),
        ({"learning_rate": 0.0}, "'learning_rate' parameter"),
        ({"n_iter_no_change": 0}, "'n_iter_no_change' parameter"),
        ({"class_weight": "balance"}, "'class_weight' parameter"),
        ({"fit_intercept": 1}, "'fit_intercept' parameter"),
    ],
)
def test_invalid_parameters(params, message):
    X, y = _blobs()
    with pytest.raises(ValueError, match=message):
        MR2LinearClassifier(**params).fit(X, y)


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_p_may_be_infinite_the_maximum_norm(digits, head):
    # DESIGN.md lets p be any order >= 1, and the class statistics take p = inf.
    from mr2_probe import class_margins, class_statistics

    X, y = digits
    clf = MR2LinearClassifier(c_bar=2.0, p=np.inf, head=head, max_iter=5, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    features = torch.as_tensor(X)
    if head == "cosine":
        features = torch.nn.functional.normalize(features, dim=1)
    stats = class_statistics(features, torch.as_tensor(y), 10, np.inf)
    expected = class_margins(stats, 2.0, np.inf).numpy()
    np.testing.assert_allclose(clf.margins_, expected, rtol=1e-10)
    assert np.ptp(clf.margins_) > 0.05


def _unavailable_devices():
    names = ["foo", "meta", f"cuda:{torch.cuda.device_count()}"]
    if not torch.cuda.is_available():
        names.append("cuda")
    if not torch.backends.mps.is_available():
        names.append("mps")
    return names


@pytest.mark.parametrize("device", _unavailable_devices())
@pytest.mark.parametrize("as_tensor", [False, True])
def test_unavailable_device_is_a_clear_value_error(device, as_tensor):
    X, y = _blobs()
    X = torch.as_tensor(X) if as_tensor else X
    with pytest.raises(ValueError, match=r"device='.*' is not .*Available devices: 'auto', 'cpu'"):
        MR2LinearClassifier(device=device).fit(X, y)


def test_a_meta_tensor_is_a_clear_value_error():
    # A tensor on the meta device (a shape without values) gave torch's "Tensor.item()
    # cannot be called on meta tensors", in fit, the search and predict.
    X, y = _blobs()
    meta = torch.empty(X.shape, device="meta")
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    for call in (
        lambda: MR2LinearClassifier().fit(meta, y),
        lambda: MR2LinearClassifierCV([1.0], cv=2).fit(meta, y),
        lambda: fitted.predict(meta),
        # With a device of its own, X was copied there first: torch's "Cannot copy out of
        # meta tensor; no data!".
        lambda: MR2LinearClassifier(device="cpu").fit(meta, y),
        lambda: MR2LinearClassifierCV([1.0], cv=2, device=torch.device("cpu")).fit(meta, y),
    ):
        with pytest.raises(ValueError, match="X is a tensor on the 'meta' device"):
            call()


# torch's own note on building the CSR tensor the test passes, not the library's.
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_tensor_is_refused_as_scikit_learn_refuses_sparse_data(layout):
    # torch's "Could not run 'aten::ne.Scalar' with arguments from the 'SparseCPU'
    # backend" (several kilobytes) or "unsupported tensor layout: SparseCsr".
    X, y = _blobs()
    sparse = torch.as_tensor(X)
    sparse = sparse.to_sparse() if layout == "coo" else sparse.to_sparse_csr()
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    message = "Sparse data was passed for X .*, but dense data is required. Use X.to_dense()"
    for call in (
        lambda: MR2LinearClassifier(device="cpu").fit(sparse, y),
        lambda: MR2LinearClassifier(lam=0.5, device="cpu").fit(sparse, y),
        lambda: MR2LinearClassifierCV([1.0], cv=2, device="cpu").fit(sparse, y),
        lambda: fitted.predict(sparse),
        lambda: fitted.predict_proba(sparse),
        # its folds indexed X before the probe saw it
        lambda: TunedOffsetsClassifierCV(MR2LinearClassifier(device="cpu"), cv=2).fit(sparse, y),
    ):
        with pytest.raises(TypeError, match=message):
            call()


def test_a_nested_tensor_is_refused_as_no_plain_dense_tensor():
    # It passed as strided, then torch's "NestedTensorImpl doesn't support sizes".
    X, y = _blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        nested = torch.nested.nested_tensor(list(torch.as_tensor(X)))
    with pytest.raises(TypeError, match="X is a nested tensor, not a plain dense tensor"):
        MR2LinearClassifier(device="cpu").fit(nested, y)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y), "NaN"),
        (
            lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.inf, X), y),
            "infinity",
        ),
        (lambda X, y: (X, np.zeros_like(y)), "only one class"),
        (lambda X, y: (X[:0], y[:0]), "0 sample"),
        (lambda X, y: (X, y[:-1]), "inconsistent numbers of samples"),
        (lambda X, y: (torch.as_tensor(X).clone().fill_(float("nan")), y), "NaN"),
    ],
)
def test_bad_training_input(make, message):
    X, y = make(*_blobs())
    with pytest.raises(ValueError, match=message):
        MR2LinearClassifier(device="cpu").fit(X, y)


@pytest.mark.parametrize(
    "label, shown",
    [(np.str_("cat"), "'cat'"), (np.int64(3), "3"), (np.float64(2.0), "2.0"), (np.True_, "True")],
)
def test_one_class_is_named_as_text_not_as_numpy(label, shown):
    # NumPy 2 repr'd the class as np.str_('cat'), np.int64(3), np.True_.
    X, _ = _blobs()
    with pytest.raises(ValueError, match=rf"contains only one class: {re.escape(shown)}\.$"):
        MR2LinearClassifier(device="cpu").fit(X, np.full(len(X), label))


@contextlib.contextmanager
def _as_kind(X, kind, tmp_path):
    """``X`` as a tensor, or as an HDF5 dataset of an open file (closed after the block)."""
    if kind == "tensor":
        yield torch.as_tensor(X)
        return
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "X.h5", "w") as f:
        yield f.create_dataset("X", data=X)


@pytest.fixture(scope="module")
def fitted_blobs():
    """``(X, y, clf)``: the blobs and a probe fitted on them, for tests that only predict
    (one fit for the module's many cases, not one each)."""
    X, y = _blobs()
    return X, y, MR2LinearClassifier(device="cpu").fit(X, y)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["tensor", "h5"])
@pytest.mark.parametrize(
    "method", ["fit", "predict", "predict_proba", "predict_log_proba", "decision_function"]
)
def test_nonfinite_input_gets_numpys_error_on_every_path(
    tmp_path, monkeypatch, fitted_blobs, value, dtype, kind, method
):
    from mr2_probe import _fit_inputs, _prediction

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 64)
    monkeypatch.setattr(_prediction, "block_rows", lambda n_features, n_classes: 64)
    X, y, clf = fitted_blobs
    bad = X.astype(dtype)
    bad[200, 3] = value  # in the fourth block of 64 rows

    def call(data):
        if method == "fit":
            return MR2LinearClassifier(device="cpu").fit(data, y)
        return getattr(clf, method)(data)

    with pytest.raises(ValueError) as numpy_error:
        call(bad)
    with _as_kind(bad, kind, tmp_path) as data, pytest.raises(ValueError) as error:
        call(data)
    assert str(error.value) == str(numpy_error.value)
    assert str(error.value).startswith(
        "Input X contains NaN" if np.isnan(value) else "Input X contains infinity"
    )


@pytest.mark.parametrize("as_tensor", [False, True])
def test_score_with_weights_near_the_largest_float_is_their_ratio(as_tensor):
    # scikit-learn's accuracy summed them to inf: a score of NaN, with NumPy's overflow
    # warning, where the fit takes such weights (as C times them).
    X, y = _blobs(n=60)
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    y[::3] = (y[::3] + 1) % 4  # some wrong
    weight = np.linspace(1.0, 2.0, len(y))
    expected = clf.score(X, y, sample_weight=weight)
    huge = weight * (1e308 / 2)
    huge = torch.as_tensor(huge) if as_tensor else huge
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no overflow)
        assert clf.score(X, y, sample_weight=huge) == pytest.approx(expected)
    assert 0 < expected < 1


@pytest.fixture
def torch_warns_always():
    """torch's warnings every time, not once per process (TORCH_WARN_ONCE): a test that a
    warning does not come sees it in each of its cases, whatever ran before."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


@pytest.mark.parametrize("kind", ["tensor", "hdf5"])
@pytest.mark.parametrize("method", ["fit", "predict", "decision_function", "predict_proba"])
@pytest.mark.filterwarnings("error:Casting complex values to real")  # (no cast to try)
@pytest.mark.usefixtures("torch_warns_always")
def test_complex_input_is_refused(method, kind, tmp_path, fitted_blobs):
    # A cast would drop the imaginary part silently. torch warns of a cast once per
    # process: a cast tried before the refusal failed only the first case to run.
    X, y, clf = fitted_blobs
    with contextlib.ExitStack() as stack:
        if kind == "tensor":
            complex_X = torch.as_tensor(X) * (1 + 1j)
        else:
            h5py = pytest.importorskip("h5py")
            with h5py.File(tmp_path / "x.h5", "w") as f:
                f["X"] = X * (1 + 1j)
            complex_X = stack.enter_context(h5py.File(tmp_path / "x.h5", "r"))["X"]
        with pytest.raises(ValueError, match="Complex data not supported"):
            if method == "fit":
                MR2LinearClassifier(device="cpu").fit(complex_X, y)
            else:
                getattr(clf, method)(complex_X)


@pytest.mark.parametrize("method", ["fit", "predict"])
def test_an_hdf5_dataset_of_an_empty_dataspace_is_refused_as_no_2d_x(method, tmp_path):
    # h5py.Empty: shape None, a TypeError ("object of type 'NoneType' has no len()").
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = h5py.Empty("f4")
        with pytest.raises(ValueError, match=r"Expected a 2D X .*, got shape \(\)\."):
            if method == "fit":
                MR2LinearClassifier(device="cpu").fit(f["X"], y)
            else:
                clf.predict(f["X"])


@pytest.mark.parametrize("cv", [False, True])
@pytest.mark.parametrize(
    "name, match",
    [
        ("y", r"y should be a 1d array, got an array of shape \(\) instead: an HDF5 dataset"),
        ("sample_weight", r"Sample weights must be 1D array or scalar, got 0D array: an HDF5"),
    ],
)
def test_an_hdf5_y_or_weight_of_an_empty_dataspace_is_refused_in_scikit_learn_s_words(
    tmp_path, name, match, cv
):
    # h5py.Empty as y or sample_weight gave h5py's "TypeError: Use () not None as shape
    # arguments".
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    clf = (
        MR2LinearClassifierCV(Cs=[1.0], cv=2, device="cpu")
        if cv
        else MR2LinearClassifier(device="cpu")
    )
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f["e"] = h5py.Empty("i8" if name == "y" else "f8")
        with pytest.raises(ValueError, match=match):
            if name == "y":
                clf.fit(X, f["e"])
            else:
                clf.fit(X, y, sample_weight=f["e"])


@pytest.mark.parametrize("dtype", ["variable", "fixed"])
def test_hdf5_labels_of_text_are_refused_naming_the_cure(tmp_path, dtype):
    # h5py reads text as bytes: every entry point gave scikit-learn's "Support for labels
    # represented as bytes is not supported", naming neither the dataset nor the cure.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    names = np.array(["cat", "dog", "émeu", "gnu"])[y]
    probe = MR2LinearClassifier(device="cpu").fit(X, names)
    with h5py.File(tmp_path / "y.h5", "w") as f:
        if dtype == "variable":
            f.create_dataset("y", data=names.astype(object), dtype=h5py.string_dtype())
        else:  # bytes of 8 at most (NumPy's "S8", as h5py writes them)
            f.create_dataset("y", data=np.char.encode(names, "utf-8").astype("S8"))
        calls = [
            lambda: MR2LinearClassifier(device="cpu").fit(X, f["y"]),
            lambda: MR2LinearClassifierCV(Cs=[1.0], cv=2, device="cpu").fit(X, f["y"]),
            lambda: TunedOffsetsClassifierCV(MR2LinearClassifier(device="cpu")).fit(X, f["y"]),
            lambda: probe.score(X, f["y"]),
        ]
        for call in calls:
            cure = re.escape('Pass its text, y.asstr("utf-8")[()].')
            # A TypeError, as scikit-learn's (and NumPy's bytes labels'): it was a ValueError.
            with pytest.raises(TypeError, match=rf"y is the HDF5 dataset '/y' .* text.*{cure}$"):
                call()
        # The cure it names: the same model as from the text itself.
        refit = MR2LinearClassifier(device="cpu").fit(X, f["y"].asstr("utf-8")[()])
        # Groups of text are no labels: taken as h5py reads them, as the text's groups.
        search = MR2LinearClassifierCV(Cs=[1.0], cv=GroupKFold(2), device="cpu")
        grouped = search.fit(X, names, groups=f["y"]).class_accuracy_path_
        np.testing.assert_array_equal(
            grouped, search.fit(X, names, groups=names).class_accuracy_path_
        )
    np.testing.assert_array_equal(refit.classes_, probe.classes_)
    np.testing.assert_array_equal(refit.coef_, probe.coef_)


@pytest.mark.parametrize("method", ["fit", "predict"])
def test_an_hdf5_dataset_of_booleans_is_taken_as_0_and_1(method, tmp_path):
    # As a boolean array is (and as load_features reads a store of them): the refusal of
    # stores of no numbers must leave booleans out.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    B = X > 0
    clf = MR2LinearClassifier(device="cpu").fit(B, y)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = B
        fitted = MR2LinearClassifier(device="cpu").fit(f["X"], y) if method == "fit" else clf
        scores = fitted.decision_function(f["X"])
    np.testing.assert_allclose(scores, clf.decision_function(B), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["S1", "f4,f4"])
@pytest.mark.parametrize("method", ["fit", "predict"])
def test_an_hdf5_dataset_of_no_numbers_is_refused(method, dtype, tmp_path):
    # Text, or records: torch's TypeError ("can't convert np.ndarray of type numpy.bytes_")
    # a block into the fit, where an array's is scikit-learn's ValueError.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    clf = MR2LinearClassifier(device="cpu").fit(X[:, :2], y)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        stored = f.create_dataset("X", (40, 2), dtype=dtype)
        message = f"X is an HDF5 dataset of dtype {re.escape(str(stored.dtype))}, not numbers"
        with pytest.raises(ValueError, match=message):
            if method == "fit":
                MR2LinearClassifier(device="cpu").fit(stored, y)
            else:
                clf.predict(stored)


@pytest.mark.parametrize(
    "dtype, scale, params",
    [
        (np.float64, 1e100, {}),  # L-BFGS's line search overflowed: NaN coefficients
        (np.float64, 1e150, {"c_bar": None}),
        (np.float64, 1e200, {}),  # ‖x‖² overflows: NaN margins
        (np.float64, 1e200, {"lam": 0.5, "max_iter": 3}),
        (np.float32, 1e18, {}),  # a RuntimeError escaped from L-BFGS
        (np.float32, 1e18, {"lam": 0.5, "max_iter": 3}),
        (np.float32, 1e30, {}),
    ],
)
def test_features_too_large_raise_instead_of_leaving_nan(dtype, scale, params):
    X, y = _blobs()
    clf = MR2LinearClassifier(random_state=0, device="cpu", **params)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # an error, not only a warning
        with pytest.raises(ValueError, match="features are too large. Scale them"):
            clf.fit((X * scale).astype(dtype), y)
    assert not hasattr(clf, "coef_")


@pytest.mark.parametrize("scale, params", [(1e10, {}), (1e14, {"c_bar": None})])
def test_float32_features_of_a_large_scale_fit_as_float64(scale, params):
    # L-BFGS's line search took the products of float32 gradients in float32 and overflowed:
    # "the features are too large", where the same rows in float64 fit. Its arithmetic is
    # float64's, as scipy's L-BFGS-B is for scikit-learn's float32 fits.
    X, y = _blobs()
    fits = []
    for dtype in (np.float32, np.float64):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # (as float64's, at 1e14)
            clf = MR2LinearClassifier(random_state=0, device="cpu", **params)
            fits.append(clf.fit((X * scale).astype(dtype), y))
    assert fits[0].coef_.dtype == np.float32
    largest = np.abs(fits[1].coef_).max()
    np.testing.assert_allclose(fits[0].coef_, fits[1].coef_, rtol=0, atol=0.05 * largest)
    np.testing.assert_array_equal(fits[0].predict(X * scale), fits[1].predict(X * scale))


@pytest.mark.parametrize(
    "scale, dtype, params",
    [
        (1e11, np.float64, {}),
        (1e15, np.float64, {}),
        (1e11, np.float32, {}),
        (1e11, np.float64, {"c_bar": None}),
        # The margins divide the logits by about c̄: the same steep start.
        (1.0, np.float64, {"c_bar": 1e-11}),
    ],
)
def test_features_of_a_very_large_scale_fit_as_logistic_regression_does(
    digits, scale, dtype, params
):
    # From 10¹¹ the first line search made no progress (torch's zoom stops at an absolute
    # change of a weight, 10⁻⁹, which moves such logits by 100 or more): chance accuracy,
    # where LogisticRegression(max_iter=1000) scores 1.0 on each of these.
    X, y = digits
    X, y = (X[:600] * scale).astype(dtype), y[:600]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", ConvergenceWarning)
        clf = MR2LinearClassifier(device="cpu", **params).fit(X, y)
    assert not any("no progress" in str(w.message) for w in record)
    assert clf.score(X, y) >= 0.99
    assert clf.n_iter_ > 10 and clf.loss_curve_[-1] < 0.01 * clf.loss_curve_[0]


def test_a_warm_start_at_a_tiny_penalty_scale_does_no_worse_than_a_cold_fit():
    # Float32 iris weighted 1e-20 (C·Σw = 1.5e-18): from coefficients of 1e-13 (a search's
    # folds' mean, where its refit starts) the penalty's gradient, 1e4, times the step's
    # overflowed float32 in the line search: FitDivergedError, where a cold fit stops at
    # its start with a ConvergenceWarning.
    X, y = load_iris(return_X_y=True)
    X, w = X.astype(np.float32), np.full(len(y), 1e-20)
    start = np.random.default_rng(0).normal(size=(3, 4)) * 1e-13
    clf = MR2LinearClassifier(warm_start=True, device="cpu")
    clf.coef_, clf.intercept_ = start, np.zeros(3)
    with pytest.warns(ConvergenceWarning, match="C=1 and sample weights summing to 1.5e-18"):
        clf.fit(X, y, sample_weight=w)
    assert np.isfinite(clf.coef_).all() and np.abs(clf.coef_).max() < 1e-6


@pytest.mark.parametrize("params", [{}, {"lam": 0.5, "max_iter": 3}, {"head": "cosine"}])
@pytest.mark.parametrize("kind", ["array", "tensor"])
def test_nan_features_under_assume_finite_are_not_blamed_on_their_scale(params, kind):
    # scikit-learn's assume_finite=True skips the check of X: a NaN in it was told that the
    # features were too large, to be scaled.
    X, y = _blobs()
    X[5, 2] = np.nan
    X = torch.as_tensor(X) if kind == "tensor" else X
    clf = MR2LinearClassifier(random_state=0, device="cpu", **params)
    with sklearn.config_context(assume_finite=True):
        with pytest.raises(ValueError, match="hold NaN or infinity, which assume_finite=True"):
            clf.fit(X, y)
    assert not hasattr(clf, "coef_")


@pytest.mark.parametrize(
    "params, weight, dtype, named",
    [
        ({"C": 1e-300}, 1.0, np.float64, "with C=1e-300 and sample weights summing to 60"),
        ({}, 1e-300, np.float64, "with C=1 and sample weights summing to 6e-299"),
        # These three blamed the features (iris-sized ones) too.
        ({}, 1e37, np.float32, "with sample weights summing to 6e[+]38"),
        # Below float32's largest number, but the gradient's sums Σ w_i·x_i·(p − y) of
        # standardised features overflowed, and the features were told to be scaled.
        ({}, 2.5e36, np.float32, "with sample weights summing to 1.5e[+]38"),
        # (The cosine head, whose objective ignores the weights' scale, fits at such
        # weights: tests/test_cosine.py.)
        ({}, 1e39, np.float32, "1e[+]39, beyond the range of float32.*C by its inverse"),
        # With a compactness loss no rescaling of C makes the same problem: it was advised.
        ({"lam": 0.5}, 1e39, np.float32, "1e[+]39, beyond.*no smaller weights make the same"),
        # class_weight multiplies the weights: said, not sample_weight alone.
        (
            {"class_weight": {0: 1e39, 1: 1, 2: 1}},
            1.0,
            np.float32,
            "sample_weight × class_weight holds values up to 1e[+]39",
        ),
        # τ rounds to 0 in float32: the learning rate was blamed (loss not finite).
        ({"lam": 0.5, "tau": 1e-38, "max_iter": 5}, 1.0, np.float32, "with tau=1e-38"),
        # (as given, not in %g's 6 digits: 1.23457e-39)
        (
            {"lam": 0.5, "tau": 1.23456789e-39, "max_iter": 5},
            1.0,
            np.float32,
            "with tau=1.23456789e-39",
        ),
        # The margins (c̄ times K·a_k^{1/3} / Σ_j a_j^{1/3}, 1.05 for the hardest class here)
        # overflow: the statistics were blamed.
        ({"c_bar": 3.4e38}, 1.0, np.float32, "margins overflow in float32 arithmetic, with c_bar="),
        # Beyond float32's range itself: torch's "cannot be converted to type float".
        ({"c_bar": 1e39}, 1.0, np.float32, "margins overflow in float32 arithmetic, with c_bar="),
        ({"c_bar": 3.456789e38}, 1.0, np.float32, "with c_bar=3.456789e[+]38 [(]the margins"),
        (
            {"c_bar": 1.75e308},
            1.0,
            np.float64,
            "margins overflow in float64 arithmetic, with c_bar=",
        ),
    ],
)
def test_an_extreme_parameter_is_named_not_blamed_on_the_features(params, weight, dtype, named):
    X, y = np.random.RandomState(0).randn(60, 4).astype(dtype), np.arange(60) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.raises(ValueError, match=named) as info:
            MR2LinearClassifier(device="cpu", **params).fit(X, y, np.full(60, weight))
    assert "features" not in str(info.value)


@pytest.mark.parametrize("params, named", [({"head": "cosine", "scale": 1e30}, "scale=1e[+]30")])
def test_an_extreme_parameter_in_float32_warns_as_in_float64(params, named):
    # The float32 fits overflowed in L-BFGS's line search, which computed in float32 (an
    # error naming the parameter); in float64 they stop short of tol, and warn naming it.
    X, y = np.random.RandomState(0).randn(60, 4), np.arange(60) % 3
    for dtype in (np.float32, np.float64):
        clf = MR2LinearClassifier(device="cpu", **params)
        with pytest.warns(ConvergenceWarning, match=f"too steep to resolve: {named}"):
            clf.fit(X.astype(dtype), y)
        assert np.isfinite(clf.coef_).all()


@pytest.mark.parametrize("c_bar", [1e-300])
def test_a_stall_from_a_tiny_c_bar_names_it(digits, c_bar):
    # c_bar = 1e-300 divides the logits by ~1e-300: no step resolves, and the advice was to
    # scale the features (or that the start was already optimal). (The margins were 0,
    # c̄·K having been computed in float32: an overflow error, naming c_bar.)
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="made no progress") as record:
        MR2LinearClassifier(c_bar=c_bar, device="cpu").fit(X, y)
    message = str(record[0].message)
    assert f"too steep to resolve: c_bar={c_bar:g} (the margins divide" in message
    assert "features" not in message


@pytest.mark.parametrize(
    "params, named",
    [
        ({"c_bar": 1e-9}, "an extreme parameter makes the objective too steep to resolve: "
         "c_bar=1e-09 (the margins divide the logits by it)."),
        ({"C": 1e-12}, "an extreme parameter makes the objective too steep to resolve: "
         "C=1e-12 and sample weights summing to 150 (the penalty is"),
        ({"c_bar": 1e-9, "C": 1e-12}, "extreme parameters make the objective too steep to "
         "resolve: c_bar=1e-09 (the margins divide the logits by it); C=1e-12 and"),
        # A large c̄ is a small C (C / c̄²): the advice was to scale the features, or a
        # larger tol.
        ({"c_bar": 1e8}, "an extreme parameter makes the objective too steep to resolve: "
         "c_bar=1e+08 with C=1 (the margins divide the logits by about c̄: the problem of "
         "C / c̄² = 1e-16 at c̄ = 1)."),
        # Named once (the note on steep tilts also named it, with other advice).
        ({"class_tilt": 2e6}, "an extreme parameter makes the objective too steep to resolve: "
         "class_tilt=2e+06 (the tilt multiplies every class's loss). Use values of a usual "
         "order of magnitude."),
        # The user's values as given, not in %g's 6 digits (1.23457e-09, 2.34568e+06).
        ({"c_bar": 1.23456789e-9}, "c_bar=1.23456789e-09 (the margins divide the logits"),
        ({"class_tilt": 2345678.9}, "class_tilt=2345678.9 (the tilt multiplies every class's"),
    ],
)  # fmt: skip
def test_a_fit_short_of_tol_names_an_extreme_parameter(params, named):
    # Past its first steps the same stall read "Use a larger tol", by a factor of 10⁹, and
    # a fit out of iterations "Increase max_iter".
    X, y = load_iris(return_X_y=True)
    with pytest.warns(ConvergenceWarning, match="^lbfgs ") as record:
        MR2LinearClassifier(device="cpu", max_iter=10, **params).fit(X, y)
    message = str(record[0].message)
    assert named in message and "larger tol" not in message
    assert message.endswith("Use values of a usual order of magnitude.")


@pytest.mark.parametrize(
    "params, weight", [({"c_bar": 10.0, "C": 1e-7}, 1.0), ({"c_bar": 10.0}, 1e-7)]
)  # fmt: skip
def test_a_usual_c_bar_with_a_small_c_is_not_named(params, weight):
    # C·Σw / c̄² = 1.5e-7 named c_bar=10 as extreme ("the problem of C / c̄² = 0.01", or
    # 1e-9), where the fit stopped on its precision (at tol=1e-4 until L-BFGS kept the
    # curvature of small steps; at tol=1e-8 still, after 21 iterations): the larger tol
    # advised resolves it (the default converges in 20).
    X, y = load_iris(return_X_y=True)
    sample_weight = np.full(len(y), weight)
    with pytest.warns(ConvergenceWarning, match="no longer improving") as record:
        MR2LinearClassifier(device="cpu", tol=1e-8, **params).fit(X, y, sample_weight=sample_weight)
    message = str(record[0].message)
    assert "Use a larger tol" in message and "c_bar" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        MR2LinearClassifier(device="cpu", **params).fit(X, y, sample_weight=sample_weight)


def test_a_large_c_bar_is_no_small_c_for_a_cosine_head():
    # W / c̄ solves the problem of C / c̄² for the linear head only: a cosine head's margins
    # divide its scaled cosines, and its C (a projection's penalty) is another matter.
    from mr2_probe._classifier import _range_suspects

    assert _range_suspects(1.0, 1e8, 150.0)[0].startswith("c_bar=1e+08 with C=1 (")
    assert _range_suspects(1.0, 1e8, 150.0, scale=16.0) == []


def test_a_cosine_prototype_of_no_direction_still_fits():
    # Class 1's rows are opposite in turn: their normalised rows cancel, so its prototype is
    # 0, where the cosine head's gradient (∝ 1/‖w_k‖) is undefined; the fit used to end in
    # NaN.
    rng = np.random.RandomState(0)
    y = np.arange(90) % 3
    x = rng.randn(90, 2) + np.array([[3.0, 0.0], [0.0, 0.0], [0.0, 3.0]])[y]
    x[y == 1] = np.resize([[2.0, 0.0], [-0.5, 0.0]], (30, 2))  # normalised: ±(1, 0), exactly
    with pytest.warns(ConvergenceWarning):
        start = MR2LinearClassifier(head="cosine", max_iter=0, device="cpu").fit(x, y)
    # It starts opposite the other prototypes' sum, at the head's scale, not at 0.
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    away = -(unit[y == 0].mean(0) / np.linalg.norm(unit[y == 0].mean(0)))
    away -= unit[y == 2].mean(0) / np.linalg.norm(unit[y == 2].mean(0))
    np.testing.assert_allclose(start.coef_[1], start.scale * away / np.linalg.norm(away), rtol=1e-6)
    model = MR2LinearClassifier(head="cosine", device="cpu").fit(x, y)
    assert np.isfinite(model.coef_).all()
    assert model.score(x, y) > 0.5


def test_stalled_lbfgs_advice_depends_on_the_dtype(digits):
    X, y = _blobs()
    # A float64 warm start at its optimum (features of scale 10³⁰ leave their start since).
    clf = MR2LinearClassifier(tol=1e-10, warm_start=True, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    with pytest.warns(ConvergenceWarning, match="made no progress") as record:
        clf.fit(X, y)
    message = str(record[0].message)
    assert "scale them" in message and "float64" not in message
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="Use float64 features .and scale them"):
        MR2LinearClassifier(c_bar=None, C=10.0, tol=1e-8, max_iter=2000, device="cpu").fit(
            X.astype(np.float32), y
        )
    # In float64, a stop on the change of the objective: said as such, not blamed on the
    # precision of the data (float64 L-BFGS elsewhere gets further on the same problem).
    X_iris, y_iris = load_iris(return_X_y=True)
    with pytest.warns(ConvergenceWarning) as record:
        MR2LinearClassifier(c_bar=None, tol=1e-8, max_iter=2000, device="cpu").fit(X_iris, y_iris)
    message = str(record[0].message)
    assert "no longer improving" in message and "64 float64 epsilons (1.4e-14)" in message
    assert "precision of the data" not in message and "Use a larger tol" in message
    # A cosine head stalled in float32 (at tol=1e-4 until its line searches read the slopes
    # below the objective's rounding; now at 1e-6): the advice is float64 (its features are
    # normalised: nothing to scale).
    X, y = np.random.RandomState(0).randn(60, 4), np.arange(60) % 3
    with pytest.warns(ConvergenceWarning) as record:
        stalled = MR2LinearClassifier(head="cosine", tol=1e-6, device="cpu").fit(
            X.astype(np.float32), y
        )
    message = str(record[0].message)
    assert "Use float64 features for a tighter solution" in message and "scale" not in message
    precise = MR2LinearClassifier(head="cosine", device="cpu").fit(X, y)
    assert precise.loss_curve_[-1] <= stalled.loss_curve_[-1] + 1e-6


def test_a_warm_start_at_its_optimum_is_not_blamed_on_the_features(digits):
    X, y = digits
    X = (X / 16).astype(np.float32)  # features in [0, 1]: nothing to scale
    # (tol=1e-7, beyond float32's reach until the line searches read the slopes, converges;
    # at 1e-9 the first warm start still gets the gradient from 7e-6 down to 5e-7)
    clf = MR2LinearClassifier(device="cpu", tol=1e-9, max_iter=1000, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
        clf.fit(X, y)
    with pytest.warns(ConvergenceWarning, match="made no progress") as record:
        clf.fit(X, y)
    message = str(record[0].message)
    assert "a warm start from a converged fit; use float64 features or a larger tol" in message


def test_lbfgs_out_of_function_evaluations_says_so():
    X, y = _blobs()
    with pytest.warns(ConvergenceWarning, match=r"used up its 8 function evaluations") as record:
        MR2LinearClassifier(max_iter=2, device="cpu").fit(X * 1e6, y)
    assert "no longer improving" not in str(record[0].message)


def test_lbfgs_line_searches_keep_to_the_evaluation_budget(monkeypatch):
    # Under torch 2.5 each line search took up to 25 evaluations, past 4 × max_iter: at
    # max_iter=1, 7 before the final one, against a budget of 4; with torch 2.14's bound (its
    # first trial step not counted in max_ls), 5.
    from mr2_probe import _solvers

    X, y = _blobs()
    calls = []
    evaluate = _solvers.plain_data_term
    monkeypatch.setattr(
        _solvers, "plain_data_term", lambda *a, **k: calls.append(1) or evaluate(*a, **k)
    )
    with pytest.warns(ConvergenceWarning, match="in max_iter=1 iterations"):
        MR2LinearClassifier(max_iter=1, device="cpu").fit(X * 1e6, y)
    assert len(calls) <= 4 + 1  # the budget, then where it stopped


def test_tol_bounds_the_gradient_as_documented():
    from mr2_probe import margin_cross_entropy

    X, y = load_digits(return_X_y=True)  # uncentred: feature means up to 15
    tol, C = 1e-4, 1.0
    clf = MR2LinearClassifier(c_bar=1.0, C=C, tol=tol, max_iter=1000, device="cpu").fit(X, y)
    X_t, y_t = torch.as_tensor(X), torch.as_tensor(y)
    W = torch.tensor(clf.coef_, requires_grad=True)
    b = torch.tensor(clf.intercept_, requires_grad=True)
    margins = torch.as_tensor(clf.margins_)
    n = len(y)
    loss = margin_cross_entropy(X_t @ W.T + b, y_t, margins, reduction="sum") / n
    loss = loss + 0.5 * W.square().sum() / (C * n)
    grad_w, grad_b = torch.autograd.grad(loss, [W, b])
    m = X_t.mean(0)
    # Tested: the gradient with the intercept re-parametrised around the feature mean.
    assert max(float((grad_w - grad_b[:, None] * m).abs().max()), float(grad_b.abs().max())) < (
        1.01 * tol
    )
    # In the original coordinates, bounded by tol·(1 + max|m|) and above tol here.
    assert tol < float(grad_w.abs().max()) <= tol * (1 + float(m.abs().max()))


def test_wrong_feature_count_at_predict(fitted_blobs):
    X, y, clf = fitted_blobs
    with pytest.raises(ValueError, match="expecting 6 features"):
        clf.predict(X[:, :4])
    with pytest.raises(ValueError, match="expecting 6 features"):
        clf.predict(torch.as_tensor(X[:, :4]))
    # One sample as a 1-D tensor: its shape, not its "features", is what is wrong.
    with pytest.raises(ValueError, match=r"Expected a 2D X .* got shape \(6,\)"):
        clf.predict(torch.as_tensor(X[0]))


@pytest.mark.parametrize("solver", ["lbfgs", "adam"])
def test_a_class_with_zero_weight_keeps_the_model_finite(solver):
    X, y = _blobs(3)
    sample_weight = np.where(y == 2, 0.0, 1.0)
    clf = MR2LinearClassifier(solver=solver, batch_size=4, max_iter=5, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, sample_weight=sample_weight)
    assert np.isfinite(clf.coef_).all() and np.isfinite(clf.loss_curve_).all()
    assert clf.margins_[2] == pytest.approx(1.0)  # absent class: the mean margin
    assert clf.margins_.mean() == pytest.approx(1.0)


@pytest.mark.parametrize("weight", [-0.1, np.nan, np.inf])
def test_a_class_weight_that_is_not_a_finite_non_negative_number_is_named(weight):
    X, y = _blobs()
    clf = MR2LinearClassifier(class_weight={0: weight}, device="cpu")
    with pytest.raises(ValueError, match="every class weight must be a finite number >= 0"):
        clf.fit(X, y)


def test_a_bad_class_weight_of_numpy_keys_and_values_is_shown_as_python_values():
    # A dict built from np.unique's classes and computed weights: the message showed
    # {np.int64(0): np.float64(-1.0), ...} under NumPy 2.
    X, y = _blobs(2)
    weights = dict(zip(np.unique(y), -np.ones(2), strict=True))
    clf = MR2LinearClassifier(class_weight=weights, device="cpu")
    with pytest.raises(ValueError, match=r"^class_weight=\{0: -1.0, 1: -1.0\}: every class"):
        clf.fit(X, y)


def test_balanced_class_weight_of_a_class_without_weight_is_named():
    # "balanced" divides by the class's total weight: zero gives it an infinite weight,
    # and its rows (weight 0 · ∞) NaN sample weights.
    X, y = _blobs(3)
    sample_weight = np.where(y == 2, 0.0, 1.0)
    clf = MR2LinearClassifier(class_weight="balanced", device="cpu")
    with pytest.raises(ValueError, match=r"classes \[2\] a weight that is not finite"):
        clf.fit(X, y, sample_weight=sample_weight)


@pytest.mark.parametrize(
    "params", [{"head": "cosine"}, {"c_bar": 1.0}, {"lam": 0.5, "max_iter": 2}]
)
def test_tensor_with_autograd_history(params):
    X, y = _blobs(2)
    leaf = torch.as_tensor(X, dtype=torch.float32).requires_grad_()
    features = leaf * 2 + 1  # as if straight out of a backbone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(random_state=0, **params).fit(features, y)
    assert clf.score(features, torch.as_tensor(y)) > 0.8
    assert not clf.decision_function(features).requires_grad


@pytest.mark.parametrize("kind", ["numpy", "DataFrame"])
def test_labels_of_a_tensor_numpy_cannot_read_beside_an_array_x(kind):
    # y a tensor that NumPy cannot read (on a GPU, or requiring grad) beside an array or
    # DataFrame X failed in validate_data ("Can't call numpy() on Tensor that requires
    # grad"), where a tensor X and score() take it.
    pd = pytest.importorskip("pandas")
    X, y = _blobs(3)
    X = pd.DataFrame(X) if kind == "DataFrame" else X
    labels = torch.tensor(y, dtype=torch.float64, requires_grad=True)
    expected = MR2LinearClassifier(device="cpu").fit(X, y.astype(np.float64))
    clf = MR2LinearClassifier(device="cpu").fit(X, labels)
    np.testing.assert_array_equal(clf.classes_, expected.classes_)
    np.testing.assert_array_equal(clf.coef_, expected.coef_)


@pytest.mark.parametrize("given", ["sample_weight", "y", "groups"])
def test_meta_tensors_of_weights_labels_or_groups_are_a_clear_value_error(given):
    # X on the meta device is named; labels, weights or groups there gave torch's
    # NotImplementedError "Cannot copy out of meta tensor; no data!" in fit and score.
    X, y = _blobs(3)
    meta = torch.empty(len(y), device="meta")
    kwargs = {"y": y, "sample_weight": None, "groups": None} | {given: meta}
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    calls = [lambda: MR2LinearClassifierCV([1.0], cv=2, device="cpu").fit(X, **kwargs)]
    if given != "groups":
        calls.append(lambda: fitted.score(X, kwargs["y"], sample_weight=kwargs["sample_weight"]))
    for call in calls:
        with pytest.raises(ValueError, match="tensor was given on the 'meta' device"):
            call()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("given", ["sample_weight", "y"])
def test_bfloat16_tensors_of_weights_and_labels_are_read_as_float32(given, dtype):
    # NumPy has no bfloat16 or float8: weights or labels of such a tensor (as a model run in
    # that precision gives them) failed in fit and score with "Got unsupported ScalarType
    # BFloat16" (Float8_e4m3fn), where float16 ones were read, and X of float8 is read.
    X, y = _blobs(3)
    weight = np.array([0.5, 1.0, 2.0])[y]  # (bfloat16 and float8 hold them exactly)
    labels = y.astype(np.float32)
    expected = MR2LinearClassifier(device="cpu").fit(X, labels, sample_weight=weight)
    if given == "y":
        labels = torch.as_tensor(labels).to(dtype)
    else:
        weight = torch.as_tensor(weight).to(dtype)
    clf = MR2LinearClassifier(device="cpu").fit(X, labels, sample_weight=weight)
    np.testing.assert_array_equal(clf.classes_, expected.classes_)
    np.testing.assert_array_equal(clf.coef_, expected.coef_)
    assert clf.score(X, labels, sample_weight=weight) == expected.score(X, y, weight)


@pytest.mark.parametrize(
    ("dtype", "error", "words"),
    [
        (torch.complex32, ValueError, "Complex data not supported: {} is a tensor of dtype"),
        (torch.uint3, TypeError, "{} is a tensor of dtype torch.uint3, which NumPy cannot"),
        (torch.bits8, TypeError, "{} is a tensor of dtype torch.bits8, which NumPy cannot"),
        pytest.param(
            getattr(torch, "float4_e2m1fn_x2", None),
            TypeError,
            "{} is a tensor of dtype torch.float4_e2m1fn_x2, which NumPy cannot",
            marks=pytest.mark.skipif(
                not hasattr(torch, "float4_e2m1fn_x2"), reason="no float4 in torch"
            ),
        ),
    ],
)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("given", ["sample_weight", "y", "groups"])
def test_tensors_of_a_dtype_numpy_lacks_are_named_with_their_dtype(given, dtype, error, words):
    # Labels, weights or groups of complex32 or a packed dtype reached torch's TypeError
    # "Got unsupported ScalarType ComplexHalf" (NotImplementedError '"copy_" not
    # implemented for 'UInt3''), naming neither the argument nor the cure, in the three
    # estimators' fit and in score; X of a packed dtype too.
    X, y = _blobs(3, n=60)
    odd = torch.zeros(len(y), dtype=dtype)  # (a packed dtype holds no other values)
    kwargs = {"y": y, "sample_weight": None, "groups": None} | {given: odd}
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    calls = [
        lambda: MR2LinearClassifierCV([1.0], cv=2, device="cpu").fit(X, **kwargs),
        lambda: TunedOffsetsClassifierCV(MR2LinearClassifier(device="cpu"), cv=2).fit(X, **kwargs),
    ]
    if given != "groups":
        calls.append(lambda: fitted.score(X, kwargs["y"], sample_weight=kwargs["sample_weight"]))
        del kwargs["groups"]
        calls.append(lambda: MR2LinearClassifier(device="cpu").fit(X, **kwargs))
    for call in calls:
        with pytest.raises(error, match=re.escape(words.format(given))):
            call()
    if dtype != torch.complex32:  # (complex X is refused by name already)
        with pytest.raises(TypeError, match=f"X is a tensor of dtype {dtype}, which torch"):
            MR2LinearClassifier(device="cpu").fit(torch.zeros(X.shape, dtype=dtype), y)
        with pytest.raises(TypeError, match=f"X is a tensor of dtype {dtype}, which torch"):
            fitted.predict(torch.zeros(X.shape, dtype=dtype))


@pytest.mark.slow
@pytest.mark.parametrize("class_weight", ["balanced", {0: 2.0, 1: 1.0, 2: 1.0}])
def test_class_weights_need_no_sample_weight_of_scikit_learn(class_weight, monkeypatch):
    # compute_class_weight takes sample_weight from scikit-learn 1.7 on: under 1.6, which
    # the package supports, every fit with a class_weight was a TypeError.
    from sklearn.utils import compute_class_weight

    def as_in_1_6(class_weight, *, classes, y):
        return compute_class_weight(class_weight, classes=classes, y=y)

    monkeypatch.setattr("mr2_probe._fit_inputs.compute_class_weight", as_in_1_6)
    X, y = load_iris(return_X_y=True)
    weight = np.where(y == 0, 3.0, 1.0)
    model = MR2LinearClassifier(c_bar=None, class_weight=class_weight, device="cpu")
    model.fit(X, y, sample_weight=weight)
    # The weighted rule, sum(w) / (K · w_k): the classes weigh 150, 50 and 50 of 250, so
    # every sample's weight becomes 5/3 (counting samples, class 0's would be 3 · 5/3).
    per_class = [5 / 9, 5 / 3, 5 / 3] if class_weight == "balanced" else [2.0, 1.0, 1.0]
    expected = MR2LinearClassifier(c_bar=None, device="cpu")
    expected.fit(X, y, sample_weight=weight * np.array(per_class)[y])
    np.testing.assert_allclose(model.coef_, expected.coef_, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_balanced_class_weight_with_sample_weight_matches_logistic_regression(digits):
    X, y = digits
    sample_weight = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    ours = MR2LinearClassifier(
        c_bar=None, class_weight="balanced", tol=1e-7, max_iter=3000, device="cpu"
    )
    # scikit-learn's "balanced" rule with the sample weights counted (its own from 1.7 on;
    # 1.6 counts samples, not weights), given as a dict so that every version agrees.
    counts = np.bincount(y, weights=sample_weight)  # digits' classes are 0, ..., 9
    balanced = {k: counts.sum() / (len(counts) * c) for k, c in enumerate(counts)}
    ref = LogisticRegression(class_weight=balanced, tol=1e-10, max_iter=20000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X, y, sample_weight=sample_weight)
        ref.fit(X, y, sample_weight=sample_weight)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=5e-4)


@pytest.mark.slow
def test_float32_lbfgs_reaches_the_tolerance(digits):
    X, y = digits
    ref = LogisticRegression(C=10.0, tol=1e-10, max_iter=20000).fit(X, y)
    ours = MR2LinearClassifier(c_bar=None, C=10.0, tol=1e-7, max_iter=2000, device="cpu")
    with pytest.warns(ConvergenceWarning, match="float32 arithmetic cannot resolve.*float64 feat"):
        ours.fit(X.astype(np.float32), y)  # 1e-7 is below float32's reach on digits
    assert ours.n_iter_ < 2000
    error = np.abs(ours.coef_ - ref.coef_).max() / np.abs(ref.coef_).max()
    assert error < 2e-3


def test_lbfgs_largest_gradient_is_the_largest_absolute_entry():
    """The test on tol (and the largest gradient a ConvergenceWarning names) takes |∇|: a
    signed maximum misses large negative entries and calls an unconverged fit converged."""
    from mr2_probe._data import TensorSource
    from mr2_probe._solvers import MarginSpec, fit_lbfgs, refresh_statistics

    from .test_head import _head

    gen = torch.Generator().manual_seed(0)
    n, d, k = 60, 4, 3
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.arange(n) % k
    X[y == 2] += 3.0
    head = _head(d, k, head="linear", fit_intercept=True, scale=5.0, generator=gen)
    source = TensorSource(X, y, torch.ones(n, dtype=torch.float64), rows=n)
    spec = MarginSpec(k, 2.0, None, None)
    result = fit_lbfgs(
        head, source, spec, initial=refresh_statistics(head, source, spec), weight_sum=float(n),
        C=1.0, max_iter=1, tol=1e-12, verbose=0,
    )  # fmt: skip
    grads = torch.cat([p.grad.flatten() for p in head.parameters()])
    assert grads.min().abs() > grads.max()  # the case where |∇| and a signed max differ
    assert result.largest_gradient == pytest.approx(float(grads.abs().max()), rel=1e-12)
    assert not result.converged and result.stop == "max_iter"


def test_lam_scales_the_compactness_term_of_the_minibatch_objective():
    """The epoch loss is data + penalty + λ·compactness: with steps too small to move the
    parameters, the first epoch's loss grows linearly in λ."""
    X, y = make_blobs(n_samples=60, centers=3, n_features=4, random_state=0)
    first = {}
    for lam in (0.5, 1.0, 2.0):
        clf = MR2LinearClassifier(
            lam=lam, solver="adam", learning_rate=1e-12, max_iter=1, batch_size=60,
            random_state=0, device="cpu",
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(X, y)
        first[lam] = clf.loss_curve_[0]
    step = first[1.0] - first[0.5]  # 0.5 × the compactness loss
    assert step > 1e-3
    assert first[2.0] - first[1.0] == pytest.approx(2 * step, rel=1e-4)


def _frame(kind, X):
    """X as a DataFrame of ``kind`` ("pandas", "polars", "pyarrow"), or as given (None)."""
    names = [f"f{j}" for j in range(X.shape[1])]
    if kind == "pandas":
        return pytest.importorskip("pandas").DataFrame(X, columns=names)
    if kind == "polars":
        return pytest.importorskip("polars").DataFrame(X, schema=names)
    if kind == "pyarrow":
        return pytest.importorskip("pyarrow").table(dict(zip(names, X.T, strict=True)))
    return X


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("frame", [None, "pandas", "polars", "pyarrow"])
def test_float16_features_train_in_float32(frame, dtype):
    # A DataFrame of float16 columns trained in float64 (check_array's choice for float16),
    # where the same rows as an array trained in float32. A polars DataFrame or a pyarrow
    # Table of float16 or float32 columns did still (check_array reads no dtype from them).
    # (Read through narwhals: scikit-learn 1.6 and 1.7 come without it.)
    if frame in ("polars", "pyarrow"):
        pytest.importorskip("narwhals.stable.v2")
    X, y = _blobs()
    X = _frame(frame, X.astype(dtype))
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    assert clf.coef_.dtype == np.float32
    assert clf.score(X, y) > 0.9


def _without_narwhals(monkeypatch):
    """mr2_probe's modules import no narwhals, as under scikit-learn 1.6 and 1.7 (which
    come without it); scikit-learn's own imports go on."""
    import builtins

    real_import = builtins.__import__

    def without_narwhals(name, globals=None, *args, **kwargs):  # in mr2_probe's modules only
        if name.startswith("narwhals") and (globals or {}).get("__name__", "").startswith(
            "mr2_probe"
        ):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, globals, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_narwhals)


@pytest.mark.parametrize("narwhals", [True, False])
@pytest.mark.parametrize(
    "dtype, beside, expected",
    [("Float32", None, np.float32), ("float32[pyarrow]", None, np.float32),
     ("float16[pyarrow]", None, np.float32), ("Float64", None, np.float64),
     ("float64[pyarrow]", None, np.float64),
     # a column of another dtype beside them: the widest precision among them
     ("Float32", "float32", np.float32), ("Float32", "float16[pyarrow]", np.float32),
     ("Float32", "float64", np.float64), ("Float32", "Float64", np.float64),
     ("Float32", "Int64", np.float64), ("Float32", "int8", np.float64)],
)  # fmt: skip
def test_pandas_extension_float32_columns_train_in_float32_but_beside_wider_ones(
    monkeypatch, dtype, beside, expected, narwhals
):
    # pandas' nullable "Float32" columns, and pyarrow-backed ones (read_parquet's
    # dtype_backend="pyarrow"), trained in float64 (check_array reads no dtype from them),
    # where the same NumPy float32 columns, or a polars Float32 frame, train in float32.
    pd = pytest.importorskip("pandas")
    if "pyarrow" in f"{dtype} {beside}":
        pytest.importorskip("pyarrow")
    if not narwhals:
        _without_narwhals(monkeypatch)
    X, y = _blobs()
    frame = pd.DataFrame(X.astype(np.float32), columns=[f"f{j}" for j in range(X.shape[1])])
    frame = frame.astype(dtype)
    if beside is not None:  # (rounded: an integer column holds it exactly)
        frame["f5"] = pd.Series(np.round(X[:, 5])).astype(beside)
    clf = MR2LinearClassifier(device="cpu").fit(frame, y)
    assert clf.coef_.dtype == expected
    assert clf.decision_function(frame).dtype == expected
    assert clf.score(frame, y) > 0.9


@pytest.mark.parametrize("dtype, expected", [(np.float32, np.float32), (np.float64, np.float64)])
def test_a_pyarrow_table_trains_under_a_narwhals_without_float16(monkeypatch, dtype, expected):
    # narwhals 2.0.1 (scikit-learn 1.8's floor) has no Float16: fitting any pyarrow Table
    # or polars DataFrame failed with an AttributeError reading its columns' dtypes.
    nw = pytest.importorskip("narwhals.stable.v2")
    monkeypatch.delattr(nw, "Float16", raising=False)
    X, y = _blobs()
    clf = MR2LinearClassifier(device="cpu").fit(_frame("pyarrow", X.astype(dtype)), y)
    assert clf.coef_.dtype == expected
    assert clf.predict(_frame("pyarrow", X.astype(dtype))).shape == y.shape


@pytest.mark.parametrize("dtype, expected", [(np.float16, np.float32), (np.float32, np.float32),
                                             (np.float64, np.float64)])  # fmt: skip
@pytest.mark.parametrize("frame", ["polars", "pyarrow"])
def test_a_frame_trains_in_float32_without_narwhals(monkeypatch, frame, dtype, expected):
    # scikit-learn 1.6 and 1.7 come without narwhals: polars and pyarrow frames of float16
    # or float32 columns trained in float64 there (their schema is read instead).
    _without_narwhals(monkeypatch)
    X, y = _blobs()
    clf = MR2LinearClassifier(device="cpu").fit(_frame(frame, X.astype(dtype)), y)
    assert clf.coef_.dtype == expected
    assert clf.score(_frame(frame, X.astype(dtype)), y) > 0.9


def test_warm_start_with_a_new_projection_rank_starts_afresh(digits):
    X, y = digits
    clf = MR2LinearClassifier(
        lam=0.5, projection_rank=2, max_iter=1, warm_start=True, random_state=0, device="cpu"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
        clf.set_params(projection_rank=3).fit(X, y)
    assert np.linalg.matrix_rank(clf.projection_ - np.eye(64), tol=1e-6) <= 3


def test_warm_start_refuses_other_data_and_takes_the_rows_into_a_projection():
    # Other features or classes started afresh without a word (LogisticRegression and
    # MLPClassifier refuse them), and a lam=0 fit's rows were dropped by a fit with lam > 0,
    # whose projection starts at P = I, where the two fits agree.
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(warm_start=True, random_state=0, device="cpu").fit(X, y)
    for X_other, y_other in ((X[:, :3], y), (X[y > 0], y[y > 0])):
        fitted = clone(clf).set_params(warm_start=True).fit(X, y)
        before = fitted.predict_proba(X)
        with pytest.raises(ValueError, match="warm_start=True starts from the previous fit"):
            fitted.fit(X_other, y_other)
        # Refused, the previous fit is whole (classes_ and n_features_in_ were the new
        # data's, its coefficients the old: predict raised an IndexError).
        np.testing.assert_array_equal(fitted.predict_proba(X), before)
        assert fitted.n_features_in_ == 4 and fitted.classes_.tolist() == [0, 1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm = clf.set_params(lam=0.5, max_iter=1).fit(X, y)
        cold = MR2LinearClassifier(lam=0.5, max_iter=1, random_state=0, device="cpu").fit(X, y)
    assert cold.score(X, y) < 0.5 < 0.9 < warm.score(X, y)


def test_convergence_warnings_point_at_the_callers_fit():
    # They pointed at scikit-learn's fit wrapper (and a search's at joblib).
    X, y = load_iris(return_X_y=True)
    for model in (
        MR2LinearClassifier(max_iter=2, device="cpu"),
        MR2LinearClassifierCV(Cs=[1.0, 10.0], max_iter=2, device="cpu"),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(X, y)
        short = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
        assert short and {w.filename for w in short} == {__file__}


def test_convergence_warnings_of_worker_threads_name_the_library():
    # A fit in one of joblib's worker threads has no caller's frame on its stack: its
    # warning pointed at the thread pool (multiprocessing/pool.py), now at the warning's
    # own line in this package.
    X, y = load_iris(return_X_y=True)
    inside = {__file__, os.path.abspath(sys.modules[MR2LinearClassifier.__module__].__file__)}
    for search in (
        MR2LinearClassifierCV(Cs=[1.0, 10.0], lam=0.5, max_iter=2, device="cpu", n_jobs=2),
        GridSearchCV(MR2LinearClassifier(max_iter=2, device="cpu"), {"C": [1, 10]}, n_jobs=2),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with joblib.parallel_config(backend="threading"):
                search.fit(X, y)
        short = {w.filename for w in caught if issubclass(w.category, ConvergenceWarning)}
        assert short == inside  # the refit's in the caller's thread


def _demo_split():
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    return train_test_split(X, y, test_size=0.5, stratify=y, random_state=0)


@pytest.mark.slow
def test_readme_call_converges_on_digits_with_its_defaults():
    # docs/estimator.md's call on the demo's split, raw pixel values. With the settings before
    # this solver's (Adam 1e-3, absolute tol): 75 to 100 epochs (some seeds warned at
    # max_iter=100), 95.86% test accuracy over seeds 0 to 7. With s̄ and τ held within an
    # epoch: 32 to 49 epochs, 95.90%; differentiated through them: 63 to 77, 96.55%.
    X_train, X_test, y_train, y_test = _demo_split()
    clf = MR2LinearClassifier(c_bar=2, lam=0.5, p=3, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf.fit(X_train, y_train)
    assert clf.n_iter_ <= 90
    assert clf.score(X_test, y_test) >= 0.96


@pytest.mark.slow
def test_a_fresh_interpreter_imports_lazily_and_its_worker_warnings_name_the_library():
    # One interpreter for three checks (most of its time is its imports):
    # - Importing the package, its plotting and report modules included, imports no
    #   matplotlib.
    # - torch.optim imports torch._dynamo on first use (2.5 s here): the minibatch updates
    #   are written out, and L-BFGS, torch's, is built without it.
    # - In loky's worker processes the walk to the caller's frame ended at a frozen module
    #   ("<frozen runpy>:88"): their ConvergenceWarnings must name the library.
    code = (
        "import sys, mr2_probe, mr2_probe.plotting, mr2_probe.report, mr2_probe.metrics\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported eagerly'\n"
        "from sklearn.datasets import load_digits, load_iris\n"
        "from sklearn.model_selection import GridSearchCV\n"
        "from mr2_probe import MR2LinearClassifier\n"
        "X, y = load_digits(return_X_y=True)\n"
        "MR2LinearClassifier(max_iter=5, device='cpu').fit(X, y)\n"
        "MR2LinearClassifier(head='cosine', class_tilt=1, max_iter=5, device='cpu').fit(X, y)\n"
        "MR2LinearClassifier(lam=0.5, max_iter=2, device='cpu').fit(X, y)\n"
        "MR2LinearClassifier(lam=0.5, solver='sgd', max_iter=2, device='cpu').fit(X, y)\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n"
        "X, y = load_iris(return_X_y=True)\n"
        "model = MR2LinearClassifier(max_iter=1, device='cpu')\n"
        "GridSearchCV(model, {'C': [1.0, 2.0]}, cv=2, n_jobs=2).fit(X, y)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    places = {line.split(": ConvergenceWarning")[0] for line in run.stderr.splitlines()
              if ": ConvergenceWarning" in line}  # fmt: skip
    library = os.path.abspath(sys.modules[MR2LinearClassifier.__module__].__file__)
    # This process's fits name the script ("<string>"), the workers' the library.
    assert all(p.startswith((library, "<string>")) for p in places), places
    assert any(p.startswith(library) for p in places), places


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_minibatch_updates_are_torch_optims(solver):
    from mr2_probe._solvers import _Adam, _NesterovSGD

    g = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, generator=g)]
    target = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, generator=g)]
    ours = [p.clone().requires_grad_() for p in start]
    theirs = [p.clone().requires_grad_() for p in start]
    if solver == "adam":
        update, reference = _Adam(ours), torch.optim.Adam(theirs, lr=0.05)
    else:
        update = _NesterovSGD(ours)
        reference = torch.optim.SGD(theirs, lr=0.05, momentum=0.9, nesterov=True)
    for _ in range(5):
        loss = sum(((p - t) ** 4).sum() for p, t in zip(ours, target, strict=True))
        update.step(torch.autograd.grad(loss, ours), 0.05)
        reference.zero_grad()
        sum(((p - t) ** 4).sum() for p, t in zip(theirs, target, strict=True)).backward()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


@pytest.fixture
def recorded_step_sizes(monkeypatch):
    """``record(name)``: the list that the step size of each step of the minibatch
    optimizer ``_solvers.<name>`` is appended to, in order, as a fit takes them."""
    from mr2_probe import _solvers

    def record(name="_Adam"):
        step_sizes, original = [], getattr(_solvers, name).step

        def recording_step(self, grads, lr):
            step_sizes.append(lr)
            return original(self, grads, lr)

        monkeypatch.setattr(getattr(_solvers, name), "step", recording_step)
        return step_sizes

    return record


@pytest.mark.slow
@pytest.mark.parametrize(
    "solver, step, match",
    [
        ("adam", 1e-12, r"adam made no progress from its starting point: its best epoch loss, "
                        r"1.099, is within 1e-6 of its starting point's, log K = 1.099"),
        ("sgd", 1e-12, "sgd made no progress from its starting point"),
        ("adam", 1e3, r"adam's best epoch loss, \d+\.?\d*, stayed above its starting point's, "
                      r"log K = 1.099 \(zero weights\): its steps are too large"),
    ],
)  # fmt: skip
def test_a_minibatch_fit_that_never_got_below_its_start_is_not_converged(solver, step, match):
    # Three plateaus read as convergence, without a word: from zero, at log 3 throughout
    # (a step too small), or at a plateau of noise 130 times above it (one too large).
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 300)
    X = rng.normal(size=(300, 8)) + rng.normal(size=(3, 8))[y]
    common = dict(c_bar=None, solver=solver, random_state=0, device="cpu")
    with pytest.warns(ConvergenceWarning, match=match):
        MR2LinearClassifier(learning_rate=step, **common).fit(X, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        fitted = MR2LinearClassifier(**common).fit(X, y)  # the default step
    assert min(fitted.loss_curve_) < 0.5 * np.log(3)
    assert not any("starting point" in str(w.message) for w in caught)


@pytest.mark.parametrize("solver", ["adam", "sgd"])
@pytest.mark.parametrize("n_classes, value", [(2, 1.0), (4, 0.0), (5, 1.0)])
def test_features_that_carry_nothing_made_no_progress_not_steps_too_large(solver, n_classes, value):
    # Constant features: the logits stay equal, the epoch loss log K up to its rounding.
    # One ulp above it (adam: 2 classes of ones, 4 of zeros) read as "stayed above its
    # starting point: its steps are too large. Use a smaller learning_rate", and no step
    # size changes it.
    y = np.arange(6 * n_classes) % n_classes
    X = np.full((len(y), 3), value)
    clf = MR2LinearClassifier(solver=solver, random_state=0, device="cpu")
    with pytest.warns(ConvergenceWarning, match="made no progress") as record:
        clf.fit(X, y)
    assert min(clf.loss_curve_) == pytest.approx(np.log(n_classes), rel=1e-12)
    message = str(record[0].message)
    assert "too large" not in message and "do not tell the classes apart" in message


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_one_batch_an_epoch_reads_the_start_test_after_the_first_epoch(solver):
    # An epoch's loss is its batches' before their steps: with one batch an epoch the
    # first is log K itself, so every fit "made no progress, steps too small" (iris at
    # learning_rate=10, its loss 170 times log K; max_iter=1 too).
    X, y = load_iris(return_X_y=True)  # 150 rows: one batch of the default 256
    common = dict(solver=solver, random_state=0, device="cpu")
    with pytest.warns(ConvergenceWarning, match="its steps are too large") as record:
        clf = MR2LinearClassifier(learning_rate=10, **common).fit(X, y)
    best = float(re.search(r"best epoch loss, ([\d.e+]+),", str(record[0].message)).group(1))
    assert best == pytest.approx(min(clf.loss_curve_[1:]), rel=1e-3) and best > np.log(3)
    with pytest.warns(ConvergenceWarning, match="did not converge in max_iter=1 epochs"):
        MR2LinearClassifier(max_iter=1, **common).fit(X, y)


# max_iter=1: fits that show the rank is accepted, not fits to convergence.
@pytest.mark.filterwarnings("ignore:adam did not converge:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.filterwarnings("ignore:lbfgs did not converge:sklearn.exceptions.ConvergenceWarning")
def test_a_projection_rank_above_the_features_is_refused():
    # Accepted, rank 100 on iris's 4 features fitted worse than the full projection (0.907
    # against 0.96 training accuracy) at a greater cost.
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(lam=0.5, projection_rank=5, max_iter=1, device="cpu")
    with pytest.raises(ValueError, match="projection_rank=5 is more than the 4 features"):
        clf.fit(X, y)
    clf.set_params(projection_rank=4).fit(X, y)  # as many as the features: a fit
    clf.set_params(projection_rank=5, lam=0.0).fit(X, y)  # (unused without a projection)


def test_a_minibatch_fit_pinned_at_its_start_by_an_extreme_tilt_names_the_tilt():
    # The step size was blamed ("use a larger learning_rate"), not class_tilt=1e7.
    X, y = load_iris(return_X_y=True)
    with pytest.warns(ConvergenceWarning) as record:
        MR2LinearClassifier(solver="sgd", class_tilt=1e7, random_state=0, device="cpu").fit(X, y)
    message = str(record[0].message)
    assert "stayed at or above its start's log K = 1.099: an extreme parameter" in message
    assert "class_tilt=1e+07" in message and "learning_rate" not in message


@pytest.mark.slow
def test_a_minibatch_fit_on_features_that_carry_nothing_is_no_failure_to_progress():
    # Its optimum lies within tol (1e-4) of log 2: the first form of the test above said
    # "made no progress" of a fit that had converged as far as L-BFGS's (0.693126 against
    # 0.693122).
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20_000, 2)), np.arange(20_000) % 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        MR2LinearClassifier(c_bar=None, solver="adam", random_state=0, device="cpu").fit(X, y)
    assert not any("starting point" in str(w.message) for w in caught)


@pytest.mark.slow
def test_minibatch_step_size_falls_tenfold_at_each_plateau(digits, recorded_step_sizes):
    step_sizes = recorded_step_sizes()
    X, y = digits
    clf = MR2LinearClassifier(lam=0.5, learning_rate=1e-2, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        # It stops at its third plateau, 6% above its best epoch (P shrinks at this step).
        warnings.filterwarnings("ignore", "adam stopped with its epoch loss at .* above its")
        clf.fit(X, y)
    assert sorted(set(step_sizes), reverse=True) == pytest.approx([1e-2, 1e-3, 1e-4])
    assert step_sizes == sorted(step_sizes, reverse=True)


def test_each_step_size_gets_its_own_plateau(recorded_step_sizes):
    # A step too small to change the loss: every epoch after the first is one without
    # improvement, so each step size runs n_iter_no_change of them before it falls (the
    # first also runs the first epoch); the fit stops at the end of the third plateau.
    step_sizes = recorded_step_sizes()
    X, y = make_blobs(n_samples=60, centers=3, n_features=4, random_state=0)
    clf = MR2LinearClassifier(
        lam=0.5, solver="adam", learning_rate=1e-12, n_iter_no_change=2, batch_size=60,
        random_state=0, device="cpu",
    )  # fmt: skip
    clf.fit(X, y)
    assert clf.n_iter_ == 7
    assert step_sizes == pytest.approx([1e-12] * 3 + [1e-13] * 2 + [1e-14] * 2, rel=1e-9)


@pytest.mark.parametrize(
    "dtype, weight", [(np.float64, 1.0), (np.float32, 1.0), (np.float64, 1e17)]
)
def test_a_diverging_minibatch_fit_is_refused_naming_the_learning_rate(digits, dtype, weight):
    # The epoch loss rose from 8.6 to 7.6e27 and never beat its first epoch: three
    # plateaus later the fit was reported as converged (float64), or its overflow blamed
    # the features (float32). Large weights, which the objective divides by their sum,
    # were blamed instead for a while.
    X, y = digits
    X = StandardScaler().fit_transform(X).astype(dtype)
    clf = MR2LinearClassifier(lam=0.5, solver="sgd", learning_rate=2.0, device="cpu")
    with pytest.raises(ValueError, match=r"sgd solver diverged.*learning_rate=2 is too large"):
        clf.fit(X, y, sample_weight=np.full(len(y), weight))


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_a_learning_rate_beyond_float32_diverges_as_in_float64(solver):
    # In float32 the step failed in torch ("value cannot be converted to type float
    # without overflow"), where float64 features said the fit diverged.
    X, y = _blobs()
    clf = MR2LinearClassifier(solver=solver, learning_rate=1e300, max_iter=3, device="cpu")
    for dtype in (np.float64, np.float32):
        with pytest.raises(FitDivergedError, match=rf"{solver} solver diverged.*1e\+300"):
            clf.fit(X.astype(dtype), y)


def test_an_sgd_fit_diverged_by_a_small_c_names_c_not_the_features(digits):
    # C = 1e-6 on 1,797 rows: the penalty's curvature 1/(C·Σw) = 556 times the default
    # learning_rate 0.003 is 1.67, beyond Nesterov momentum's limit of 1.36: the loss went
    # from 2.35 to 3.6e5 in 3 epochs, and the message said to scale the (already scaled)
    # features.
    X, y = digits
    clf = MR2LinearClassifier(solver="sgd", C=1e-6, c_bar=None, random_state=0, device="cpu")
    expected = (
        r"at C=1e-06 and Σw=1797, alone .* is 1\.67, beyond the 1\.36 .* For the penalty "
        r"alone, use a learning_rate below 0\.00244, or a C above 1\.23e-06, and fit again"
    )
    with pytest.raises(ValueError, match=expected) as info:
        clf.fit(X / 16, y)
    assert "features" not in str(info.value)
    with warnings.catch_warnings():  # as the message says
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.set_params(C=1.3e-6).fit(X / 16, y)
        clf.set_params(C=1e-6, learning_rate=0.0024).fit(X / 16, y)
    # A cosine head's projection (lam > 0) has the same penalty's curvature.
    with pytest.raises(ValueError, match=r"is 1\.67, beyond the 1\.36") as info:
        clf.set_params(head="cosine", lam=0.5, learning_rate=0.003).fit(X / 16, y)
    assert "features" not in str(info.value)


@pytest.mark.parametrize("solver", ["lbfgs", "sgd"])
def test_a_numpy_c_whose_penalty_overflows_is_refused_without_numpy_s_warning(solver):
    # 1/(C·Σw) of a NumPy float C let "overflow encountered in scalar divide" out before
    # the estimator's own error said the same.
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(C=np.float64(1e-320), solver=solver, max_iter=3, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FitDivergedError, match="C=9.99989e-321"):
            clf.fit(X, y)
    assert not [w for w in caught if "encountered" in str(w.message)]


@pytest.mark.parametrize("C", [1e-200, np.float64(1e-200)])
@pytest.mark.parametrize("solver", ["lbfgs", "sgd"])
def test_a_penalty_whose_c_times_the_weights_underflows_to_0_is_refused_by_name(C, solver):
    # C·Σw of 1e-200 · 1.5e-148 is 0: 1/(C·Σw) raised ZeroDivisionError from the solver
    # where the estimator's own error names C and the weights.
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(C=C, solver=solver, max_iter=3, device="cpu")
    with pytest.raises(FitDivergedError, match="C=1e-200 and sample weights summing to 1.5e-148"):
        clf.fit(X, y, sample_weight=np.full(len(y), 1e-150))


@pytest.mark.parametrize("weight", [1e-300, 1e-46])
@pytest.mark.parametrize(
    "estimator", [MR2LinearClassifier(), MR2LinearClassifierCV([1.0], cv=3)], ids=type
)
def test_weights_that_underflow_in_float32_are_refused_by_name(estimator, weight):
    # Every weight is 0 in float32: the fit blamed an overflow of L-BFGS's step, and the
    # search "sample weights summing to 0" (which they do not, as given).
    X, y = load_iris(return_X_y=True)
    named = f"up to {weight:g}, which underflow to 0 in float32.*Rescale the weights: multiply"
    with pytest.raises(ValueError, match=named + " them by a large factor and C by its inverse"):
        clone(estimator).set_params(device="cpu").fit(
            X.astype(np.float32), y, sample_weight=np.full(len(y), weight)
        )


def test_class_stats_of_subnormal_float32_weights_are_float64_s():
    # Weights of 1e-40 with C = 1e40 (C·Σw = 150, an ordinary problem): the float32 fit's
    # class means were 0.43 times float64's (weight sums clamped up to float32's tiny).
    X, y = load_iris(return_X_y=True)
    fits = [
        MR2LinearClassifier(C=1e40, device="cpu").fit(X.astype(dtype), y, np.full(len(y), 1e-40))
        for dtype in (np.float32, np.float64)
    ]
    for name in ("mean", "msd"):
        np.testing.assert_allclose(
            fits[0].class_stats_[name], fits[1].class_stats_[name], rtol=1e-4
        )
    np.testing.assert_allclose(fits[0].margins_, fits[1].margins_, rtol=1e-4)


def test_a_projection_s_penalty_that_diverges_is_named_beside_the_learning_rate():
    # 1,000 standardised features, 50 samples, C = 1e-6: Adam moves each of the 10⁶
    # entries of P by about its step, and ½‖P − I‖²/(C·Σw) took the loss from 2.3 to
    # 8.6·10⁴. The message blamed only the features, which were already standardised.
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 25)
    X = rng.normal(size=(50, 1000))
    clf = MR2LinearClassifier(lam=0.5, C=1e-6, max_iter=5, random_state=0, device="cpu")
    with pytest.raises(ValueError, match=r"projection's 1000000 entries, whose penalty is .*"
                       r"at C=1e-06: a larger C, or a projection_rank, also helps"):  # fmt: skip
        clf.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.set_params(projection_rank=8).fit(X, y)  # as the message says


@pytest.mark.parametrize(
    "make, expected",
    [
        (
            lambda: MR2LinearClassifier(lam=0.5, projection_rank=4, device="cpu"),
            "projection's 80 entries, whose penalty is ½(‖A‖² + ‖B‖²), P = I + A·B, / (C·Σw) "
            "at C=1: a larger C, or a smaller projection_rank, also helps",
        ),
        # The search has no C of its own where it searches the cosine head's scale.
        (
            lambda: MR2LinearClassifierCV([8.0], head="cosine", lam=0.5, cv=2, device="cpu"),
            "projection's 100 entries, whose penalty is ½‖P − I‖² / (C·Σw) at C=1: a "
            "projection_rank also helps",
        ),
    ],
)
def test_a_diverged_projection_s_message_fits_its_penalty_and_estimator(
    make, expected, monkeypatch
):
    # A low-rank projection's penalty was written as ½‖P − I‖², with "a projection_rank"
    # as advice where one was set; the search was told of a C it does not have.
    from mr2_probe import _classifier
    from mr2_probe._solvers import SolverResult

    def diverged(head, source, spec, **kwargs):
        return SolverResult(2, False, loss_curve=[2.0, 3e4], stop="diverged")

    monkeypatch.setattr(_classifier, "fit_minibatch", diverged)
    X, y = _blobs()
    X = np.c_[X, X, X, X, X][:, :10]
    with pytest.raises(ValueError, match=re.escape(expected)):
        make().fit(X, y)


@pytest.fixture
def threads():
    """This thread's torch thread count, put back as it was after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _threads_of_each_step(monkeypatch) -> list:
    """A list that gets torch's thread count at each minibatch step's compactness loss."""
    from mr2_probe import _losses

    threads_seen, original = [], _losses.compactness_loss

    def recording_loss(*args, **kwargs):
        threads_seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(_losses, "compactness_loss", recording_loss)
    return threads_seen


def test_small_minibatch_steps_run_on_one_thread(digits, monkeypatch, threads):

    threads_seen = _threads_of_each_step(monkeypatch)
    torch.set_num_threads(2)
    X, y = digits  # 256 × 64 × (64 + 10 + 256) multiply-adds a step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        MR2LinearClassifier(lam=0.5, max_iter=2, device="cpu").fit(X, y)
    assert set(threads_seen) == {1}
    assert torch.get_num_threads() == 2  # restored


@pytest.mark.parametrize("batch_size", [256, 2**20])
def test_a_batch_size_beyond_the_samples_counts_their_steps_as_the_samples(
    monkeypatch, threads, batch_size
):
    # A step's multiply-adds were counted at batch_size, not at the rows a batch holds:
    # batch_size=4096 on 1,000 rows of 16 features (a step of 1.6e7 < 2²⁴) ran on every
    # thread, 1.4 to 4.5 times as slow on a loaded 2-core machine.
    from mr2_probe import _solvers

    threads_seen = _threads_of_each_step(monkeypatch)
    monkeypatch.setattr(_solvers, "SMALL_STEP", 60 * 6 * (6 + 3 + 60))  # 60 rows' step
    torch.set_num_threads(2)
    X, y = _blobs(n_classes=3, n=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(lam=0.5, max_iter=2, batch_size=batch_size, device="cpu")
        clf.fit(X, y)
    assert set(threads_seen) == {1}


def test_threads_using_torch_within_another_threads_one_thread_section_keep_their_count(threads):
    # A new thread (joblib's or Dask's, running another fit) whose first torch operation
    # falls within another thread's section took its transient 1 (torch.set_num_threads
    # sets the count of threads that have not used torch yet), and kept it for its life.
    # The count is put back from a thread of its own, without waiting: drained here, so
    # that the new threads start after it, as all but those in a short gap do.
    import threading

    from mr2_probe._solvers import _COUNT_SETTER, one_thread_if_small

    cpu = torch.device("cpu")
    seen = {}

    def new_thread(name, work):
        torch.ones(3).sum()  # its first operation: the count it takes
        with one_thread_if_small(cpu, work, 10):
            seen[f"{name} inside"] = torch.get_num_threads()
        seen[f"{name} after"] = torch.get_num_threads()

    torch.set_num_threads(2)
    torch.ones(3).sum()
    with one_thread_if_small(cpu, 1, 10):
        _COUNT_SETTER.drain()
        for name, work in (("small", 1), ("large", 100)):
            thread = threading.Thread(target=new_thread, args=(name, work))
            thread.start(), thread.join(30)
        assert torch.get_num_threads() == 1
        # nested: the inner section restores the outer one's 1
        with one_thread_if_small(cpu, 1, 10):
            pass
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    assert seen == {"small inside": 1, "small after": 2, "large inside": 2,
                    "large after": 2}  # fmt: skip

    # A thread that set its own count to 1 keeps it, within another's section too.
    def own_one():
        torch.set_num_threads(1)
        with one_thread_if_small(cpu, 1, 10):
            pass
        seen["own one"] = torch.get_num_threads()

    with one_thread_if_small(cpu, 1, 10):
        thread = threading.Thread(target=own_one)
        thread.start(), thread.join(30)
    assert seen["own one"] == 1


def test_a_count_reset_not_served_by_the_section_s_end_is_dropped(threads):
    # Served after the section, the reset undid the count the program set next: new
    # threads took the section's thread's old count instead of the one set since.
    import threading

    from mr2_probe._solvers import _COUNT_SETTER, one_thread_if_small

    cpu = torch.device("cpu")
    taken = []
    torch.set_num_threads(2)
    with _COUNT_SETTER.changed:  # the setter cannot serve until released
        with one_thread_if_small(cpu, 1, 10):
            pass
        torch.set_num_threads(3)
    _COUNT_SETTER.drain()
    thread = threading.Thread(target=lambda: taken.append(torch.get_num_threads()))
    thread.start(), thread.join(30)
    assert taken == [3]


def test_a_drain_returns_when_the_count_setter_s_thread_ends_on_an_error(monkeypatch):
    # Its thread died without a word to those waiting: drain() waited for ever.
    import threading

    from mr2_probe._solvers import _CountSetter

    real, release = torch.set_num_threads, threading.Event()

    def failing(count):
        if threading.current_thread().name == "mr2-probe-thread-count":
            release.wait(10)  # until drain() waits on it
            raise RuntimeError("no")
        real(count)

    monkeypatch.setattr(torch, "set_num_threads", failing)
    # Its traceback, which keeps the thread alive a while after the error.
    monkeypatch.setattr(threading, "excepthook", lambda args: time.sleep(0.5))
    setter = _CountSetter()
    setter.set(2)
    waiter = threading.Thread(target=setter.drain, daemon=True)
    waiter.start(), waiter.join(0.3)
    release.set(), waiter.join(5)
    assert not waiter.is_alive()


def test_an_interrupt_while_a_one_thread_section_starts_restores_the_count(monkeypatch, threads):
    # Asking for the count's reset came before the section's try: an interrupt there left
    # the thread on one thread for good.
    from mr2_probe import _solvers

    def interrupted(count):
        raise KeyboardInterrupt

    cpu = torch.device("cpu")
    monkeypatch.setattr(_solvers._COUNT_SETTER, "set", interrupted)
    torch.set_num_threads(2)
    with pytest.raises(KeyboardInterrupt), _solvers.one_thread_if_small(cpu, 1, 10):
        pass
    assert torch.get_num_threads() == 2


def test_overlapping_one_thread_sections_in_two_threads_each_restore_their_own(threads):
    # torch's (OpenMP) thread count is each OS thread's once the thread has read it (a
    # thread that has not takes the count last set anywhere): a count shared by the
    # sections left the first thread at 1 thread for good, and the second's section ran on
    # 2.
    import threading

    from mr2_probe._solvers import one_thread_if_small

    cpu = torch.device("cpu")
    torch.set_num_threads(2)
    torch.ones(3).sum()
    b_ready, a_in, b_in, a_out = (threading.Event() for _ in range(4))
    seen, failed = {}, []

    def second():  # a joblib thread after an earlier fit
        try:
            torch.set_num_threads(2)
            assert torch.get_num_threads() == 2  # read: this thread's own from now on
            b_ready.set()
            assert a_in.wait(30)
            with one_thread_if_small(cpu, 1, 10):
                seen["second inside"] = torch.get_num_threads()
                b_in.set()
                assert a_out.wait(30)
            seen["second after"] = torch.get_num_threads()
        except BaseException as error:  # re-raised by the test, which then waits no more
            failed.append(error)
            b_ready.set(), b_in.set()

    thread = threading.Thread(target=second)
    try:
        thread.start()
        assert b_ready.wait(30)
        with one_thread_if_small(cpu, 1, 10):
            seen["first inside"] = torch.get_num_threads()
            a_in.set()
            assert b_in.wait(30)
        a_out.set()
        thread.join(30)
        if failed:
            raise failed[0]
        seen["first after"] = torch.get_num_threads()
        assert seen == {"first inside": 1, "second inside": 1, "second after": 2,
                        "first after": 2}  # fmt: skip
    finally:
        a_in.set(), b_in.set(), a_out.set()
        thread.join(30)


def test_minibatch_statistics_are_the_ones_training_used(digits):
    from mr2_probe import class_margins, class_statistics

    X, y = digits
    clf = MR2LinearClassifier(c_bar=2.0, lam=0.5, p=3, max_iter=1, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    assert not np.allclose(clf.projection_, np.eye(64))
    # One epoch trains with the statistics of P = I, those of X itself.
    stats = class_statistics(torch.as_tensor(X), torch.as_tensor(y), 10, 3.0)
    np.testing.assert_allclose(clf.class_stats_["mean"], stats.mean.numpy(), rtol=1e-10)
    np.testing.assert_allclose(clf.class_stats_["msd"], stats.msd.numpy(), rtol=1e-10)
    np.testing.assert_allclose(clf.margins_, class_margins(stats, 2.0, 3.0).numpy(), rtol=1e-10)


def test_rows_of_weight_zero_take_no_part_in_the_compactness_loss():
    # scikit-learn's convention: a weight of 0 drops the row. The compactness term used to
    # pair every row of a minibatch, weighted or not.
    rng = np.random.RandomState(0)
    X, y = rng.randn(200, 4), rng.randint(0, 2, 200)
    X[:, 0] += y
    sample_weight = np.ones(200)
    sample_weight[:40] = 0
    moved = X.copy()
    moved[:40] = 20 * rng.randn(40, 4)  # only the rows of weight 0 change
    kw = dict(lam=0.5, max_iter=30, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = MR2LinearClassifier(**kw).fit(X, y, sample_weight=sample_weight)
        b = MR2LinearClassifier(**kw).fit(moved, y, sample_weight=sample_weight)
    np.testing.assert_array_equal(a.projection_, b.projection_)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_compactness_term_has_no_gradient_along_a_common_scale_of_the_features():
    # s̄ and τ held constant within an epoch gave every step a gradient that shrinks φ as a
    # whole (the projection collapsed towards zero); differentiated through them, the loss
    # depends on the distances relative to the spread.
    from mr2_probe._losses import compactness_term

    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(60, 5, generator=gen, dtype=torch.float64).requires_grad_()
    y = torch.arange(60) % 3
    w = torch.rand(60, generator=gen, dtype=torch.float64) + 0.5
    s_bar, tau = 2.0, 4.0  # the epoch's, from the full data: the batch's spread differs
    (grad,) = torch.autograd.grad(compactness_term(phi, y, w, s_bar, tau, 3), phi)
    point = phi.detach()  # (products with phi itself would be part of the graph)
    radial = float((grad * point).sum())  # d/da of the loss at a·φ, a = 1
    assert abs(radial) < 1e-10 * float(grad.norm() * point.norm())
    (held,) = torch.autograd.grad(compactness_loss(phi, y, s_bar, tau, sample_weight=w), phi)
    assert float((held * point).sum()) > 0.1 * float(held.norm() * point.norm())
    # Its value is the loss at the epoch's s̄ and τ; a batch with no spread keeps them.
    value = compactness_term(phi, y, w, s_bar, tau, 3)
    torch.testing.assert_close(value, compactness_loss(phi, y, s_bar, tau, sample_weight=w))
    # A spread below float32's smallest normal number keeps its value too (it was divided
    # by that number instead: 0.224 against 0.046 with a constant τ).
    tiny = torch.tensor([[0.0], [1e-19], [1.0], [3.0]])
    labels, s_tiny = torch.tensor([0, 0, 1, 2]), torch.tensor(1e-37)
    torch.testing.assert_close(
        compactness_term(tiny, labels, None, s_tiny, s_tiny, 3, tau_follows=False),
        compactness_loss(tiny, labels, s_tiny, s_tiny),
    )
    alone = phi[:3]  # one sample per class
    torch.testing.assert_close(
        compactness_term(alone, y[:3], None, s_bar, tau, 3),
        compactness_loss(alone, y[:3], s_bar, tau),
    )


def test_a_large_step_does_not_collapse_the_projection():
    # Before, at the epoch's s̄ and τ held constant: training accuracy 1/3 (every sample in
    # one class) and ‖P‖ 0.03 after 100 epochs (2 at the identity); 0.96 and 3.2 now.
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(lam=0.5, learning_rate=1e-2, n_iter_no_change=50, max_iter=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.set_params(random_state=0, device="cpu").fit(X, y)
    assert clf.score(X, y) > 0.9
    assert np.linalg.norm(clf.projection_) > 2.0


def test_a_fit_that_ends_far_above_its_best_loss_is_not_called_converged():
    # A step too large for SGD: the epoch loss ends at 4.05 against a best of 2.45 (training
    # accuracy 0.65). Such a fit (once, a projection that shrank towards zero: training
    # accuracy 1/3) was reported converged, without a warning.
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(lam=0.5, solver="sgd", learning_rate=0.1, max_iter=200)
    with pytest.warns(ConvergenceWarning, match=r"above its best .*smaller learning_rate"):
        clf.set_params(random_state=0, device="cpu").fit(X, y)
    assert clf.loss_curve_[-1] > 1.05 * min(clf.loss_curve_)


def test_compactness_scale_averages_present_classes_only(monkeypatch):
    from mr2_probe import _losses

    seen = []
    original = _losses.compactness_loss

    def recording_loss(phi, y, s_bar, tau, *args, **kwargs):
        seen.append(float(torch.as_tensor(s_bar).detach()))  # (a part of the loss's graph)
        return original(phi, y, s_bar, tau, *args, **kwargs)

    monkeypatch.setattr(_losses, "compactness_loss", recording_loss)
    X, y = _blobs(3)
    sample_weight = np.where(y == 2, 0.0, 1.0)  # class 2 has no weight: msd 0
    clf = MR2LinearClassifier(lam=0.5, max_iter=1, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, sample_weight=sample_weight)
    expected = clf.class_stats_["msd_l2"][:2].mean()  # not the mean over all 3 classes
    assert seen
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


@pytest.mark.parametrize("tau", [None, 1.0])
def test_only_the_default_tau_follows_the_spread_in_the_gradient(monkeypatch, tau):
    # τ = 2 s̄ is a function of φ, and moves with s̄; a τ given by the user is a constant.
    from mr2_probe import _losses

    seen = []
    original = _losses.compactness_loss

    def recording_loss(phi, y, s_bar, tau, *args, **kwargs):
        seen.append((s_bar.requires_grad, torch.is_tensor(tau) and tau.requires_grad, tau))
        return original(phi, y, s_bar, tau, *args, **kwargs)

    monkeypatch.setattr(_losses, "compactness_loss", recording_loss)
    X, y = _blobs(3)
    clf = MR2LinearClassifier(lam=0.5, tau=tau, max_iter=1, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    assert seen and all(s_follows for s_follows, _, _ in seen)
    assert all(t_follows == (tau is None) for _, t_follows, _ in seen)
    if tau is not None:
        assert all(value == tau for _, _, value in seen)


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_float32_rows_are_scored_in_a_float64_model_s_precision(head):
    # As scikit-learn's linear models: float32 rows promoted, not the model rounded down.
    rng = np.random.RandomState(0)
    X = 1000.0 + 0.01 * rng.randn(600, 20)
    y = (X[:, 0] - X[:, 1] > 0).astype(int)
    model = MR2LinearClassifier(head=head, c_bar=None, C=1e4, max_iter=300, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    X32 = X.astype(np.float32)
    z = model.decision_function(X32)
    assert z.dtype == np.float64
    np.testing.assert_array_equal(z, model.decision_function(X32.astype(np.float64)))
    # A tensor of the same rows too (it was scored in float32: one prediction differed).
    tensor = model.decision_function(torch.from_numpy(X32))
    assert tensor.dtype == torch.float64
    np.testing.assert_allclose(tensor.numpy(), z, rtol=0, atol=1e-8)  # was off by 0.056
    assert model.score(torch.from_numpy(X32), y) == model.score(X32, y)


def test_divergence_is_a_thousandfold_rise_over_the_first_epoch_or_over_one():
    from mr2_probe._solvers import _diverged

    assert _diverged(9.05e4, 8.64) and _diverged(float("nan"), 8.64)
    assert _diverged(float("inf"), 1e-5) and _diverged(1.5e3, 1e-5)
    assert not _diverged(8e3, 8.64)
    assert not _diverged(0.05, 1e-5)  # a warm start near a zero loss, then some noise


def test_fits_and_predictions_ignore_the_caller_s_torch_modes(caller_mode):
    # Fitted in the no_grad / inference_mode block that extracted the features, L-BFGS
    # left the penalty's gradient out (coef_ off by 0.7 on iris) and a minibatch fit
    # failed; inside autocast the products ran in bfloat16 (off by 0.16) and lam > 0 failed.
    _, enter = caller_mode
    X, y = make_blobs(120, n_features=4, centers=3, random_state=0)
    X = (X / 4).astype(np.float32)
    kinds = {
        "lbfgs": dict(c_bar=None, tol=1e-6),
        "adam": dict(lam=0.5, max_iter=5, random_state=0),
    }
    # Two classes, tilted or not (one row, its L-BFGS fit on autograd): "Inference tensors
    # cannot be saved for backward".
    kinds["binary"] = dict(c_bar=None, tol=1e-6)
    kinds["binary tilted"] = dict(c_bar=None, tol=1e-6, class_tilt=1.0)
    labels = {k: (y == 0) if k.startswith("binary") else y for k in kinds}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = {
            k: MR2LinearClassifier(**kw, device="cpu").fit(X, labels[k]) for k, kw in kinds.items()
        }
        search = MR2LinearClassifierCV([0.1, 1.0], cv=3, device="cpu").fit(X, y)
        with enter():
            X_t = torch.as_tensor(X)  # an inference tensor under inference_mode
            fitted = {
                k: MR2LinearClassifier(**kw, device="cpu").fit(X_t, labels[k])
                for k, kw in kinds.items()
            }
            searched = MR2LinearClassifierCV([0.1, 1.0], cv=3, device="cpu").fit(X_t, y)
            z = fitted["lbfgs"].decision_function(X_t)
    for kind, model in fitted.items():
        np.testing.assert_allclose(model.coef_, plain[kind].coef_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(searched.coef_, search.coef_, rtol=1e-5, atol=1e-5)
    assert z.dtype == torch.float32
    np.testing.assert_allclose(z.numpy(), plain["lbfgs"].decision_function(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tilt", [0.0, 1.0])
def test_two_classes_on_uncentred_features_converge_as_scikit_learn_s(tilt):
    # The two-class head (one row) skipped the intercept's re-parametrisation around the
    # feature mean that the other linear heads take: on features of a large common mean
    # (embeddings') the default fit stopped at max_iter, 2.4e-5 above the optimum.
    X, y = make_classification(2000, 50, n_informative=20, random_state=0)
    X = X + 20.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = MR2LinearClassifier(c_bar=None, class_tilt=tilt, device="cpu").fit(X, y)
        centred = MR2LinearClassifier(c_bar=None, class_tilt=tilt, device="cpu")
        centred.fit(X - X.mean(0), y)
    np.testing.assert_allclose(model.coef_, centred.coef_, rtol=1e-3, atol=1e-3)
    if tilt == 0:
        reference = LogisticRegression(tol=1e-10, max_iter=10_000).fit(X, y)
        np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(model.intercept_, reference.intercept_, rtol=1e-3, atol=2e-2)


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_minibatch_weights_scale_the_data_term_as_lbfgs_s_do(solver):
    # Weights of 5 on every row weigh the data term as five copies would: against the
    # penalty 1/(C·S), as C·5 does unweighted. The minibatch term once ignored Σw.
    X, y = load_iris(return_X_y=True)
    common = dict(solver=solver, max_iter=5, random_state=0, device="cpu", c_bar=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted = MR2LinearClassifier(C=0.01, **common).fit(X, y, sample_weight=np.full(150, 5.0))
        plain = MR2LinearClassifier(C=0.05, **common).fit(X, y)
    np.testing.assert_allclose(weighted.coef_, plain.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weighted.intercept_, plain.intercept_, rtol=1e-4, atol=1e-6)


def test_two_classes_give_one_decision_value_per_row():
    X, y = load_iris(return_X_y=True)
    for solver in ("lbfgs", "adam"):
        clf = MR2LinearClassifier(solver=solver, max_iter=3, device="cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(X[y > 0], y[y > 0])
        assert clf.decision_function(X[:3]).shape == (3,)
        assert clf.decision_function(torch.as_tensor(X[:3])).shape == (3,)


def test_a_learned_projection_s_statistics_are_those_of_the_representation():
    # With lam > 0 the margins follow φ = P·x, recomputed every epoch: the statistics of
    # the last epoch are those of a learned P, near the final one, not of the raw features.
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(c_bar=1, lam=0.5, solver="adam", learning_rate=1e-2, max_iter=20,
                              random_state=0, device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    means = clf.class_stats_["mean"]
    raw = np.stack([X[y == k].mean(0) for k in range(3)])
    final = np.stack([(X @ clf.projection_.T)[y == k].mean(0) for k in range(3)])
    assert np.abs(means - final).max() < 0.2 * np.abs(means - raw).max()


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("method", ["predict_proba", "predict_log_proba"])
def test_probabilities_of_a_tensor_are_a_tensor_equal_to_numpys(method, n_classes):
    # Probabilities of a tensor come back as a tensor (two-class ones too) equal to NumPy's,
    # the softmax taken over each row's classes, not over the rows.
    X, y = _blobs(n_classes=n_classes, n=60)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    out = getattr(model, method)(torch.as_tensor(X))
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (60, n_classes)
    np.testing.assert_allclose(out.numpy(), getattr(model, method)(X), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", ["tensor", "h5"])
@pytest.mark.parametrize("shape", [(0, 3), (6, 0), (1, 3)])
def test_training_data_without_rows_or_features_is_refused(tmp_path, kind, shape):
    # A tensor or HDF5 X without rows or without features is refused by fit, as NumPy's is.
    X = np.zeros(shape)
    y = np.arange(shape[0]) % 2
    # One row is a valid X: it is refused for its single class, not its shape.
    message = (
        "only one class" if shape[0] == 1 else r"Found array with shape .* minimum of 1 sample"
    )
    with _as_kind(X, kind, tmp_path) as data, pytest.raises(ValueError, match=message):
        MR2LinearClassifier(device="cpu").fit(data, y)


@pytest.mark.parametrize("method", ["fit", "predict", "predict_proba", "decision_function"])
def test_a_dataframe_without_columns_is_refused_for_its_0_features(method):
    # check_array failed on its dtypes, "at least one array or dtype is required", where
    # an array of that shape is refused for its 0 features.
    pd = pytest.importorskip("pandas")
    X, y = _blobs(n=12)
    empty = pd.DataFrame(index=range(12))
    message = r"Found array with 0 feature\(s\) \(shape=\(12, 0\)\) while a minimum of 1"
    clf = MR2LinearClassifier(device="cpu")
    with pytest.raises(ValueError, match=message):
        if method == "fit":
            clf.fit(empty, y)
        else:
            getattr(clf.fit(X, y), method)(empty)


@pytest.mark.parametrize("shape", [(6,), (6, 2, 2)])
def test_training_tensors_that_are_not_2d_are_refused(shape):
    # A tensor X that is not 2-D is refused with the documented ValueError, not an IndexError
    # or a fit on the wrong shape.
    X = torch.ones(shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Expected a 2D X"):
        MR2LinearClassifier(device="cpu").fit(X, np.arange(6) % 2)


@pytest.mark.parametrize("y_kind", ["numpy", "tensor"])
def test_a_column_y_with_a_tensor_x_warns_as_with_numpy(y_kind):
    # A column y with a tensor X is raveled with a DataConversionWarning, as with a NumPy X.
    X, y = _blobs(n_classes=2, n=40)
    y = y.reshape(-1, 1)
    y = torch.as_tensor(y) if y_kind == "tensor" else y
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        model = MR2LinearClassifier(device="cpu").fit(torch.as_tensor(X), y)
    assert model.classes_.tolist() == [0, 1]


@pytest.mark.parametrize("projection_rank", [None, 2])
def test_warm_start_keeps_a_learned_projection(projection_rank):
    # A warm start from a learned projection (0 < lam ≤ 1 too, and a low-rank one) continues
    # from it, instead of silently starting afresh at P = I.
    X, y = _blobs(n_classes=3, n=90)
    model = MR2LinearClassifier(
        lam=0.5,
        max_iter=3,
        learning_rate=1e-2,
        projection_rank=projection_rank,
        warm_start=True,
        random_state=0,
        device="cpu",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        projection, coef = model.projection_.copy(), model.coef_.copy()
        model.set_params(max_iter=0).fit(X, y)  # max_iter=0 keeps the starting point
    assert not np.allclose(projection, np.eye(6))
    np.testing.assert_allclose(model.projection_, projection, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.coef_, coef, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_negative_sample_weights_are_refused(kind):
    # Negative sample weights are refused: they would reward misclassifying their rows.
    X, y = _blobs(n_classes=2, n=40)
    weight = np.ones(40)
    weight[3] = -0.5
    with pytest.raises(ValueError, match="Negative values in data passed to `sample_weight`"):
        MR2LinearClassifier(device="cpu").fit(
            torch.as_tensor(X) if kind == "tensor" else X, y, sample_weight=weight
        )


@pytest.mark.parametrize("kind", ["tensor", "h5"])
@pytest.mark.parametrize("n_labels", [39, 41])
def test_labels_of_another_length_than_a_tensor_x_are_refused(tmp_path, kind, n_labels):
    # Labels of another length than a tensor or HDF5 X are refused, as with a NumPy X
    # (test_bad_training_input).
    X, y = _blobs(n_classes=2, n=41)
    X, y = X[:40], y[:n_labels]
    message = f"X has 40 samples but y has {n_labels}"
    with _as_kind(X, kind, tmp_path) as data, pytest.raises(ValueError, match=message):
        MR2LinearClassifier(device="cpu").fit(data, y)


@pytest.mark.parametrize("dtype", ["Int64", "boolean"])
@pytest.mark.parametrize("kind", ["tensor", "h5"])
def test_nullable_pandas_labels_give_the_classes_a_numpy_x_gives(tmp_path, kind, dtype):
    # scikit-learn converts a pandas column of a nullable dtype to float64 beside a NumPy
    # X; beside a tensor or HDF5 X the classes came out int64 or bool, so one model's
    # predictions differed in dtype with the container of its features.
    pd = pytest.importorskip("pandas")
    X, y = _blobs(n_classes=2, n=40)
    labels = pd.Series(y.astype(bool) if dtype == "boolean" else y, dtype=dtype)
    expected = MR2LinearClassifier(device="cpu").fit(X, labels).classes_
    with _as_kind(X, kind, tmp_path) as data:
        classes = MR2LinearClassifier(device="cpu").fit(data, labels).classes_
    assert classes.dtype == expected.dtype == np.float64
    np.testing.assert_array_equal(classes, expected)


@pytest.mark.parametrize("kind", ["array", "tensor", "h5"])
def test_a_missing_label_beside_a_tensor_x_is_named_as_beside_an_array(tmp_path, kind):
    # NaN among object labels (a pandas column's missing value): validate_data said "Input
    # contains NaN" beside a NumPy X (no argument, no position); beside a tensor or HDF5 X
    # the classes' sort raised "'<' not supported between instances of 'float' and 'str'".
    X, y = _blobs(n_classes=3, n=30)
    labels = np.array(["a", "b", "c"], dtype=object)[y]
    labels[4] = np.nan
    data = contextlib.nullcontext(X) if kind == "array" else _as_kind(X, kind, tmp_path)
    match = r"^Input y holds 1 missing label \(NaN\) among its 30, at position 4, which is"
    with data as X, pytest.raises(ValueError, match=match):
        MR2LinearClassifier(device="cpu").fit(X, labels)


@pytest.mark.parametrize("kind", ["array", "tensor", "h5"])
@pytest.mark.parametrize(
    "estimator",
    [
        MR2LinearClassifier(device="cpu"),
        MR2LinearClassifierCV(Cs=[1.0], cv=2, device="cpu"),
        TunedOffsetsClassifierCV(MR2LinearClassifier(device="cpu"), cv=2),
    ],
    ids=["MR2LinearClassifier", "MR2LinearClassifierCV", "TunedOffsetsClassifierCV"],
)
def test_missing_labels_of_a_pandas_column_are_refused_as_missing(tmp_path, kind, estimator):
    # pd.NA among the labels (a pandas column of dtype "string") failed in scikit-learn's
    # check: "boolean value of NA is ambiguous"; None with "'<' not supported between
    # instances of 'NoneType' and 'str'"; a y of pd.NA alone gave "ambiguous" too.
    pd = pytest.importorskip("pandas")
    X, y = _blobs(n_classes=3, n=30)
    labels = pd.Series(pd.array(np.array(["a", "b", "c"])[y], dtype="string"))
    labels[[4, 7]] = pd.NA
    with_none = np.array(["a", "b", "c"], dtype=object)[y]
    with_none[4] = None
    data = contextlib.nullcontext(X) if kind == "array" else _as_kind(X, kind, tmp_path)
    with data as X:
        with pytest.raises(ValueError, match=r"^Input y holds 2 missing labels \(pd.NA\)"):
            clone(estimator).fit(X, labels)
        with pytest.raises(ValueError, match=r"^Input y holds 1 missing label \(None\)"):
            clone(estimator).fit(X, with_none)
        none = pd.Series(pd.array([pd.NA] * len(y), dtype="string"))
        with pytest.raises(ValueError, match=r"^Input y holds only missing labels \(pd.NA\)"):
            clone(estimator).fit(X, none)
        # No y at all is scikit-learn's case, not a y of missing labels.
        with pytest.raises(ValueError, match="requires y to be passed, but the target y is None"):
            clone(estimator).fit(X, None)


def test_probabilities_of_a_float32_model_are_computed_in_float64():
    # A float32 model's probabilities are computed in float64: with large logit gaps (a cosine
    # head's scale) a float32 softmax underflows to 0, and log(predict_proba) would be -inf
    # where predict_log_proba is finite.
    X, y = _blobs(n_classes=3, n=90)
    model = MR2LinearClassifier(head="cosine", scale=200.0, max_iter=20, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X.astype(np.float32), y)
    proba = model.predict_proba(X.astype(np.float32))
    assert proba.dtype == np.float64 and proba.min() > 0
    log_proba = model.predict_log_proba(X.astype(np.float32))
    assert log_proba.min() < -104  # past float32's smallest positive exp
    np.testing.assert_allclose(np.log(proba), log_proba, rtol=1e-6)


@pytest.mark.parametrize("head", ["linear", "cosine"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_probabilities_of_a_float32_tensor_sum_to_one_as_scikit_learn_checks(head, dtype):
    # A float32 softmax's rows miss one by up to 2.4e-7; log_loss reads a tensor as float64
    # and warns past 1.5e-8 ("The y_prob values do not sum to one"), and a cosine head's
    # logit gaps underflow it to 0, where predict_log_proba is finite. A tensor's
    # probabilities are float64 on its device, as an array's are.
    X, y = _blobs(n_classes=3, n=90)
    X = torch.as_tensor(X, dtype=dtype)
    model = MR2LinearClassifier(head=head, scale=200.0, max_iter=20, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    proba, log_proba = model.predict_proba(X), model.predict_log_proba(X)
    assert proba.dtype == log_proba.dtype == torch.float64 and proba.device == X.device
    np.testing.assert_allclose(torch.log(proba).numpy(), log_proba.numpy(), rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_loss(y, proba)


def test_predictions_on_an_hdf5_dataset_are_computed_block_by_block(tmp_path, monkeypatch):
    # Predictions on an HDF5 dataset are computed block by block, each block handed to
    # decision_values as NumPy: the dataset is read once, and never whole.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _prediction

    X, y = _blobs(n=200)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    expected = model.decision_function(X)
    seen = []
    original = _prediction.decision_values

    def recording(X, *args, **kwargs):
        seen.append((type(X), X.shape[0]))
        return original(X, *args, **kwargs)

    monkeypatch.setattr(_prediction, "block_rows", lambda n_features, n_classes: 64)
    monkeypatch.setattr(_prediction, "decision_values", recording)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        dataset = f.create_dataset("X", data=X, chunks=(64, 6))
        np.testing.assert_allclose(model.decision_function(dataset), expected, rtol=1e-12)
    assert [n for _, n in seen] == [64, 64, 64, 8]
    assert all(t is np.ndarray for t, _ in seen)


@pytest.mark.parametrize("kind", ["tensor", "h5"])
def test_one_feature_tensors_and_datasets_fit_as_numpy_does(tmp_path, kind):
    # A tensor or HDF5 X of a single feature is valid: it fits as the NumPy array does.
    rng = np.random.default_rng(0)
    X = np.r_[rng.normal(-2, 1, (20, 1)), rng.normal(2, 1, (20, 1))]
    y = np.repeat([0, 1], 20)
    expected = MR2LinearClassifier(device="cpu").fit(X, y)
    with _as_kind(X, kind, tmp_path) as data:
        model = MR2LinearClassifier(device="cpu").fit(data, y)
    assert model.n_features_in_ == 1
    np.testing.assert_allclose(model.coef_, expected.coef_, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_two_class_predict_is_the_sign_of_the_decision_function(kind):
    # Two-class predictions are decision_function > 0, a tie at 0 going to classes_[0], on the
    # NumPy and the tensor path alike.
    X, y = _blobs(n_classes=2, n=60)
    model = MR2LinearClassifier(C=1e-3, fit_intercept=False, device="cpu").fit(X, y)
    X = np.r_[X, np.zeros((1, 6))]  # decision value exactly 0: a tie
    data = torch.as_tensor(X) if kind == "tensor" else X
    z = model.decision_function(X)
    assert z[-1] == 0 and ((z > 0) & (z <= 1)).any()
    np.testing.assert_array_equal(model.predict(data), model.classes_[(z > 0).astype(int)])


def test_a_model_without_head_attr_predicts_with_the_head_it_was_trained_with():
    # A model pickled before head_ existed predicts with the head it was trained with, not the
    # head parameter as set_params changed it after the fit.
    X, y = _blobs(n_classes=3, n=60)
    model = MR2LinearClassifier(head="cosine", device="cpu").fit(X, y)
    expected = model.decision_function(X)
    del model.head_  # as in a model pickled before head_ existed
    model.set_params(head="linear")
    np.testing.assert_allclose(model.decision_function(X), expected, rtol=1e-12)


def test_warm_start_from_a_projection_back_to_lam_zero_starts_afresh():
    # A warm start from a fit with a projection back to lam=0 starts afresh, as documented: no
    # projection, and zero weights and intercept.
    X, y = _blobs(n_classes=3, n=90)
    model = MR2LinearClassifier(
        lam=0.5, max_iter=3, learning_rate=1e-2, warm_start=True, random_state=0, device="cpu"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        assert np.abs(model.coef_).max() > 0
        model.set_params(lam=0.0, max_iter=0).fit(X, y)  # max_iter=0 keeps the start
    assert model.projection_ is None
    np.testing.assert_array_equal(model.coef_, 0.0)
    np.testing.assert_array_equal(model.intercept_, 0.0)


def test_predictions_on_a_long_double_hdf5_store_are_float64(tmp_path):
    # Predictions on a long-double HDF5 store are float64, as on NumPy and in the fit, not
    # float128.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n_classes=3, n=60)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        dataset = f.create_dataset("X", data=X.astype(np.longdouble))
        z = model.decision_function(dataset)
        assert z.dtype == np.float64 and model.predict_proba(dataset).dtype == np.float64
        np.testing.assert_array_equal(z, model.decision_function(X))


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_class_weights_that_zero_every_sample_are_refused(kind):
    # Class weights that zero every sample are refused (an all-zero sample_weight is refused
    # already by scikit-learn's check).
    X, y = _blobs(n_classes=2, n=40)
    X = torch.as_tensor(X) if kind == "tensor" else X
    with pytest.raises(ValueError, match="sum of sample weights must be positive"):
        MR2LinearClassifier(class_weight={0: 0.0, 1: 0.0}, device="cpu").fit(X, y)


def test_default_parameters_are_the_documented_ones():
    # The defaults are the documented ones (the class docstring); the README's numbers rest on
    # them, so a changed default is seen here.
    assert MR2LinearClassifier().get_params() == dict(
        c_bar=1.0,
        lam=0.0,
        p=None,
        head="linear",
        C=1.0,
        fit_intercept=True,
        difficulty="moment",
        scale=64.0,
        tau=None,
        projection_rank=None,
        solver="auto",
        max_iter=100,
        tol=1e-4,
        batch_size=256,
        learning_rate=3e-3,
        n_iter_no_change=5,
        class_weight=None,
        class_tilt=0.0,
        warm_start=False,
        random_state=None,
        verbose=0,
        device="auto",
    )


@pytest.mark.parametrize("solver, optimizer", [("adam", "_Adam"), ("sgd", "_NesterovSGD")])
def test_a_minibatch_fit_with_a_loose_tol_converges_at_its_third_plateau(
    solver, optimizer, recorded_step_sizes
):
    # An epoch counts as progress only when it beats the best loss by tol relative to it.
    # With tol = 0.5 the loss cannot keep halving, so plateaus come quickly: the step size
    # falls tenfold at the first two, and the third ends the fit as converged, well before
    # max_iter and without a ConvergenceWarning. (A fast companion of the slow digits test
    # of the step-size schedule.)
    step_sizes = recorded_step_sizes(optimizer)
    X, y = make_blobs(n_samples=120, centers=3, n_features=4, random_state=0)
    clf = MR2LinearClassifier(
        solver=solver, tol=0.5, max_iter=200, n_iter_no_change=2, lam=0.5,
        learning_rate=1e-2, random_state=0, device="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf.fit(X, y)
    assert clf.n_iter_ < 200
    assert sorted(set(step_sizes), reverse=True) == pytest.approx([1e-2, 1e-3, 1e-4])
    assert step_sizes == sorted(step_sizes, reverse=True)


def test_a_fit_that_raises_leaves_the_estimator_as_it_was(digits):
    # A diverged fit kept the classes_ and n_features_in_ that validation had set: the
    # estimator passed check_is_fitted, and predict failed on a missing coef_.
    X, y = digits
    X = StandardScaler().fit_transform(X)
    diverging = dict(lam=0.5, solver="sgd", learning_rate=2.0, device="cpu")
    fresh = MR2LinearClassifier(**diverging)
    with pytest.raises(ValueError, match="diverged"):
        fresh.fit(X, y)
    assert not [k for k in vars(fresh) if k.endswith("_")]
    with pytest.raises(NotFittedError):
        fresh.predict(X[:2])
    # A fitted one keeps its previous fit whole.
    fitted = MR2LinearClassifier(device="cpu").fit(X[:, :20], y)
    before = {k: v for k, v in vars(fitted).items() if k.endswith("_")}
    with pytest.raises(ValueError, match="diverged"):
        fitted.set_params(**diverging).fit(X, y)
    assert {k for k in vars(fitted) if k.endswith("_")} == set(before)
    assert fitted.n_features_in_ == 20 and fitted.coef_ is before["coef_"]
    assert fitted.predict(X[:5, :20]).shape == (5,)


def test_a_search_that_raises_leaves_the_estimator_unfitted():
    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=[1.0], cv=[(np.arange(150), np.arange(0))], device="cpu")
    with pytest.raises(ValueError, match="no held-out rows"):
        search.fit(X, y)
    with pytest.raises(NotFittedError):
        search.predict(X[:2])


def test_a_minibatch_fit_out_of_epochs_names_the_learning_rate_too(digits):
    # The advice was L-BFGS's alone (max_iter, scaling): a minibatch fit's other lever is
    # its step, which oscillates when too large.
    X, y = digits
    clf = MR2LinearClassifier(lam=0.5, max_iter=2, learning_rate=0.5, device="cpu")
    with pytest.warns(ConvergenceWarning) as caught:
        clf.fit(StandardScaler().fit_transform(X), y)
    message = str(caught[0].message)
    assert "did not converge in max_iter=2 epochs. Increase max_iter" in message
    assert message.endswith("If loss_curve_ oscillates, use a smaller learning_rate than 0.5.")


# max_iter=3: enough evaluations to see their threads, short of convergence.
@pytest.mark.filterwarnings("ignore:lbfgs did not converge:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("small, expected", [(None, 1), (0, 2)])
def test_small_full_batch_evaluations_run_on_one_thread(
    digits, monkeypatch, small, expected, threads
):
    # 2 × 1797 × 64 × 10 multiply-adds an evaluation, at most SMALL_EVALUATION: one thread;
    # above it, torch's threads.
    from mr2_probe import _batched, _solvers

    if small is not None:
        monkeypatch.setattr(_solvers, "SMALL_EVALUATION", small)
    seen = {"fit": set(), "search": set()}
    closed_form, batched = _solvers.linear_margin_ce_grad, _batched.FoldBatch.evaluate

    def fit_recording(*args, **kwargs):
        seen["fit"].add(torch.get_num_threads())
        return closed_form(*args, **kwargs)

    def search_recording(*args, **kwargs):
        seen["search"].add(torch.get_num_threads())
        return batched(*args, **kwargs)

    monkeypatch.setattr(_solvers, "linear_margin_ce_grad", fit_recording)
    monkeypatch.setattr(_batched.FoldBatch, "evaluate", search_recording)
    torch.set_num_threads(2)
    X, y = digits
    MR2LinearClassifier(max_iter=3, device="cpu").fit(X, y)
    # Two folds of 600 rows in one batched problem: 2 × 600 × 64 × 2 × 10.
    search = MR2LinearClassifierCV(Cs=[0.1, 1.0], cv=2, max_iter=3, device="cpu")
    search.fit(X[:600], y[:600])
    assert seen == {"fit": {expected}, "search": {expected}}
    assert torch.get_num_threads() == 2  # restored


def test_a_cosine_warm_start_continues_from_the_previous_rows():
    # The cosine head's cold start is the class means' directions; a warm start must keep
    # the previous solution instead (max_iter=0 keeps the starting point).
    X, y = _blobs(n_classes=3, n=90)
    model = _short_fit(
        MR2LinearClassifier(head="cosine", max_iter=5, warm_start=True, device="cpu"), X, y
    )
    before = model.coef_.copy()
    _short_fit(model.set_params(max_iter=0), X, y)
    np.testing.assert_array_equal(model.coef_, before)


def test_tensor_sample_weights_are_those_of_numpy():
    X, y = _blobs(n_classes=3, n=60)
    weight = np.random.RandomState(0).uniform(0.1, 3.0, len(y))
    numpy = MR2LinearClassifier(device="cpu").fit(X, y, sample_weight=weight)
    tensor = MR2LinearClassifier(device="cpu").fit(X, y, sample_weight=torch.from_numpy(weight))
    np.testing.assert_allclose(tensor.coef_, numpy.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tensor.class_stats_["count"], numpy.class_stats_["count"])


@pytest.mark.parametrize("params", [dict(p=3.0), dict(head="cosine")])
def test_reported_difficulty_is_the_one_that_gave_the_margins(params):
    # margins_ = c̄·K·a^{1/3} / Σ a^{1/3}, a = class_stats_["difficulty"] under p_ (3 here).
    X, y = _blobs(n=80)
    model = _short_fit(MR2LinearClassifier(c_bar=2.0, max_iter=2, device="cpu", **params), X, y)
    root = np.cbrt(model.class_stats_["difficulty"])
    np.testing.assert_allclose(model.margins_, 2.0 * len(root) * root / root.sum(), rtol=1e-6)
    stats = model.class_stats_
    moment = (np.abs(stats["mean"]) ** 3).sum(1) ** (2 / 3) + stats["msd"]
    np.testing.assert_allclose(stats["difficulty"], moment, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_half_and_integer_tensors_train_in_float32(dtype):
    X, y = _blobs(n=80)
    reference = MR2LinearClassifier(device="cpu").fit(torch.from_numpy(X).to(dtype).float(), y)
    model = MR2LinearClassifier(device="cpu").fit(torch.from_numpy(X).to(dtype), y)
    assert model.coef_.dtype == np.float32
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-5, atol=1e-6)


def test_statistics_overflowing_by_the_weights_name_the_weights():
    # float32: weights summing to 6e37 (below float32's largest, past its square root)
    # take Σw·‖x‖² out of range; the features (norms about 10) are not the cause.
    X, y = np.random.RandomState(0).randn(60, 4).astype(np.float32) * 5, np.arange(60) % 3
    with pytest.raises(ValueError, match="with sample weights summing to 6e[+]37") as info:
        MR2LinearClassifier(device="cpu").fit(X, y, np.full(60, 1e36))
    assert "features are too large" not in str(info.value)


@pytest.mark.parametrize("head", ["linear", "cosine"])
@pytest.mark.parametrize("n_classes", [3, 2])
@pytest.mark.parametrize("fitted", [True, False])
def test_a_warm_start_starts_from_an_assigned_coef_and_intercept_(head, n_classes, fitted):
    # As LogisticRegression's warm start reads them (another model's, say): they were
    # ignored, the fit starting from the previous solution, or cold on an estimator never
    # fitted (max_iter=0 keeps the starting point).
    X, y = _blobs(n_classes=n_classes, n=90)
    source = LogisticRegression(C=0.1).fit(X, y)
    model = MR2LinearClassifier(head=head, max_iter=5, warm_start=True, device="cpu")
    if fitted:
        _short_fit(model, X, y)
    model.coef_, model.intercept_ = source.coef_.copy(), source.intercept_.copy()
    _short_fit(model.set_params(max_iter=0), X, y)
    if head == "linear":
        np.testing.assert_allclose(model.coef_, source.coef_, rtol=1e-10)
        np.testing.assert_allclose(model.intercept_, source.intercept_, rtol=1e-10)
    else:  # the rows' directions, at the head's scale (a cosine head has no intercept)
        unit = lambda coef: coef / np.linalg.norm(coef, axis=1, keepdims=True)  # noqa: E731
        np.testing.assert_allclose(unit(model.coef_), unit(source.coef_), rtol=1e-6)
    before = model.coef_.copy()
    _short_fit(model, X, y)  # its own coef_ again: the previous solution, as before
    np.testing.assert_allclose(model.coef_, before, rtol=1e-12)
    model.coef_ = source.coef_[:, :3]
    with pytest.raises(ValueError, match="starts from the assigned coef_ and intercept_, for 3"):
        model.fit(X, y)
    model.coef_ = np.full_like(source.coef_, np.nan)
    with pytest.raises(ValueError, match="assigned coef_ and intercept_, which hold NaN"):
        model.fit(X, y)
    # Two rows are no start (LogisticRegression's binary coef_ has one row; torch's error
    # from copying two into the head's one, or the wrong number of classes for three).
    model.coef_, model.intercept_ = np.vstack([source.coef_[:1]] * 2), np.zeros(2)
    with pytest.raises(ValueError, match=r"must be \(n_classes, n_features\)"):
        model.fit(X, y)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
@pytest.mark.parametrize("n_classes", [3, 2])
def test_assigned_coef_intercept_and_classes_predict_as_logistic_regression(n_classes, kind):
    # An estimator never fitted, given another model's coef_, intercept_ and classes_,
    # predicts with them as LogisticRegression does; it raised an AttributeError on
    # projection_, which only a fit sets.
    X, y = _blobs(n_classes=n_classes, n=90)
    source = LogisticRegression(C=0.1).fit(X, y)
    model = MR2LinearClassifier(device="cpu")
    model.coef_, model.intercept_, model.classes_ = source.coef_, source.intercept_, source.classes_
    rows = X if kind == "numpy" else torch.from_numpy(X)
    np.testing.assert_array_equal(model.predict(rows), source.predict(X))
    for method in ("decision_function", "predict_proba"):
        out = getattr(model, method)(rows)
        out = out.numpy() if kind == "tensor" else out
        np.testing.assert_allclose(out, getattr(source, method)(X), rtol=1e-10, atol=1e-12)
    assert model.score(rows, y) == source.score(X, y)


def test_a_warm_start_across_a_change_of_head_starts_afresh():
    # A linear head's rows are no cosine head's start: the cosine fit starts at the class
    # means' directions, as a cold one does (max_iter=0 keeps the starting point).
    X, y = _blobs(n_classes=3, n=90)
    model = _short_fit(MR2LinearClassifier(max_iter=5, warm_start=True, device="cpu"), X, y)
    _short_fit(model.set_params(head="cosine", max_iter=0), X, y)
    cold = _short_fit(MR2LinearClassifier(head="cosine", max_iter=0, device="cpu"), X, y)
    np.testing.assert_allclose(model.coef_, cold.coef_, rtol=1e-12)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_a_cosine_head_of_one_feature_is_refused(kind):
    X, y = _blobs(n_classes=2, n=40)
    X = X[:, :1] if kind == "numpy" else torch.from_numpy(X[:, :1].copy())
    with pytest.raises(ValueError, match="head='cosine' needs at least 2 features"):
        MR2LinearClassifier(head="cosine", device="cpu").fit(X, y)


@pytest.mark.parametrize("n_rows", [1, 3])
def test_predictions_on_an_hdf5_dataset_cover_every_row(tmp_path, monkeypatch, n_rows):
    # Blocks of 2 rows: the last block of 3 rows, and the only block of 1, hold one row.
    h5py = pytest.importorskip("h5py")
    import mr2_probe._prediction as module

    X, y = _blobs(n_classes=3, n=60)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    monkeypatch.setattr(module, "block_rows", lambda n_features, n_classes: 2)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"] = X[:n_rows]
    with h5py.File(tmp_path / "x.h5", "r") as f:
        np.testing.assert_array_equal(model.predict(f["X"]), model.predict(X[:n_rows]))
        np.testing.assert_allclose(
            model.decision_function(f["X"]), model.decision_function(X[:n_rows])
        )


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_cosine_logits_of_a_learned_projection_divide_by_the_projected_norm(kind):
    # The documented decision function: X @ coef_.T / ‖P·x‖, P = projection_ (not ‖x‖).
    X, y = _blobs(n_classes=3, n=60)
    model = _short_fit(
        MR2LinearClassifier(
            head="cosine", lam=0.5, max_iter=3, learning_rate=3e-2, random_state=0, device="cpu"
        ),
        X,
        y,
    )
    assert not np.allclose(model.projection_, np.eye(6), atol=1e-3)
    expected = X @ model.coef_.T / np.linalg.norm(X @ model.projection_.T, axis=1)[:, None]
    z = model.decision_function(X if kind == "numpy" else torch.from_numpy(X))
    np.testing.assert_allclose(np.asarray(z), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_log_probabilities_of_far_rows_stay_finite(kind):
    # Logit gaps past ~750 underflow softmax to 0 in float64: predict_log_proba must be
    # the log-softmax, finite, not log(predict_proba) = -inf.
    X, y = _blobs(n_classes=3, n=60)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    far = X[:5] * 1e4
    far = far if kind == "numpy" else torch.from_numpy(far)
    log_proba = np.asarray(model.predict_log_proba(far))
    z = np.asarray(model.decision_function(far))
    assert (z.max(1) - z.min(1)).min() > 1e3  # the test's premise
    assert np.isfinite(log_proba).all()
    np.testing.assert_allclose(log_proba.max(1), 0.0, atol=1e-12)


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_score_is_the_weighted_accuracy(kind):
    X, y = _blobs(n_classes=3, n=60)
    model = MR2LinearClassifier(device="cpu").fit(X, y)
    y_eval = y.copy()
    y_eval[:10] = (y_eval[:10] + 1) % 3  # rows the model gets wrong
    weight = np.where(np.arange(60) < 10, 5.0, 1.0)
    expected = np.average(model.predict(X) == y_eval, weights=weight)
    assert expected < np.mean(model.predict(X) == y_eval)  # the weights matter
    as_kind = (lambda a: a) if kind == "numpy" else torch.from_numpy
    assert model.score(X, as_kind(y_eval), as_kind(weight)) == pytest.approx(expected)


def test_a_steep_tilt_short_of_tol_is_told_the_tilt_is_why():
    X, y = _blobs(n_classes=3, n=60)
    with pytest.warns(ConvergenceWarning, match="class_tilt=20 makes the objective nearly"):
        MR2LinearClassifier(class_tilt=20.0, max_iter=2, device="cpu").fit(X, y)
    with pytest.warns(ConvergenceWarning) as record:
        MR2LinearClassifier(class_tilt=5.0, max_iter=2, device="cpu").fit(X, y)
    assert "nearly the largest" not in str(record[0].message)


@pytest.mark.parametrize(
    "params",
    [
        dict(max_iter=2),  # stops at max_iter
        dict(max_iter=100),  # converges
        dict(max_iter=0),  # the starting point alone
        dict(head="cosine", max_iter=5),
        dict(solver="adam", max_iter=3),
    ],
)
def test_the_progress_bar_counts_iterations_not_the_start(params, monkeypatch):
    # The bar's count is n_iter_ of a total of max_iter: L-BFGS's evaluation of its
    # starting point is no iteration (it showed 3/2 for max_iter=2).
    from mr2_probe import _solvers

    bars = []

    class Recorded(_solvers.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(_solvers, "tqdm", Recorded)
    X, y = _blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(verbose=1, device="cpu", random_state=0, **params).fit(X, y)
    (bar,) = bars
    assert (bar.n, bar.total) == (clf.n_iter_, params["max_iter"])


@pytest.mark.parametrize(
    "params, desc",
    [
        (dict(c_bar=None), "ERM lbfgs"),
        (dict(c_bar=None, head="cosine"), "ERM lbfgs"),
        (dict(c_bar=None, solver="sgd", learning_rate=0.01), "ERM sgd"),
        (dict(c_bar=1.0), "MR2 lbfgs"),
        (dict(c_bar=None, class_tilt=1.0), "tilted ERM lbfgs"),
        (dict(c_bar=1.0, class_tilt=1.0), "tilted MR2 lbfgs"),
        (dict(c_bar=None, lam=0.5, solver="adam"), "MR2 adam"),
        (dict(c_bar=None, lam=0.5, class_tilt=1.0, solver="adam"), "tilted MR2 adam"),
    ],
)
def test_the_progress_bar_names_the_objective_fitted(params, desc, monkeypatch):
    # A fit of plain cross-entropy (no margins, no projection, no tilt: ERM) showed a bar
    # described "MR2 lbfgs", which reads as the MR² model being fitted; so did one of tilted
    # cross-entropy, which has no margins either.
    from mr2_probe import _solvers

    bars = []

    class Recorded(_solvers.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(kwargs["desc"])

    monkeypatch.setattr(_solvers, "tqdm", Recorded)
    X, y = _blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        MR2LinearClassifier(max_iter=3, verbose=1, device="cpu", random_state=0, **params).fit(X, y)
    assert bars == [desc]


@pytest.mark.parametrize("C", [1e-8, 1e-7, 1e-6, 1e-5])
def test_a_float32_fit_goes_on_where_its_decrease_is_below_the_objectives_rounding(digits, C):
    # At C = 1e-6 the second direction's decrease (4e-8) was below float32's rounding of
    # the objective (2.4e-7 at log 10): every trial step's value rounded to the start's,
    # Armijo's test rejected each, and the fit stopped after 2 iterations with the float32
    # warning, its intercept 0.03 from float64's (of order 0.01 itself). The slopes along
    # the line keep their precision, and the fit goes on to tol.
    X, y = digits
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        single = MR2LinearClassifier(C=C, c_bar=None, device="cpu").fit(X.astype(np.float32), y)
    double = MR2LinearClassifier(C=C, c_bar=None, tol=1e-7, device="cpu").fit(X, y)
    np.testing.assert_allclose(single.intercept_, double.intercept_, atol=2e-4)
    np.testing.assert_allclose(single.coef_, double.coef_, atol=1e-3 * np.abs(double.coef_).max())


@pytest.mark.parametrize("C", [1e-14, 1e-15])
def test_a_tiny_C_fits_the_unpenalised_intercept_to_its_optimum(C):
    # At C·Σw = 1.5e-12 the penalty's curvature dwarfed the intercept's by 10¹³: L-BFGS's
    # one step size fitted W alone, and the fit stopped after 2 iterations with an
    # intercept near 0 (0.71 of iris right, from W·x of order 1e-12). The optimum's W is
    # -C·Σw times the data term's gradient at its intercept, the minimiser of the
    # intercept-only objective, which with c̄ = 1's unequal margins predicts one class.
    from scipy.optimize import minimize
    from scipy.special import logsumexp, softmax

    X, y = load_iris(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (W's gradient: too steep)
        clf = MR2LinearClassifier(C=C, c_bar=1.0, device="cpu").fit(X, y)
    rows = np.arange(len(y))
    scale = clf.margins_[y][:, None]  # γ_{y_i} (n, 1)

    def objective(b):
        z = b / scale
        return np.mean(logsumexp(z, axis=1) - z[rows, y])

    b = minimize(objective, np.zeros(3), method="BFGS", options=dict(gtol=1e-12)).x
    grad_logits = softmax(b / scale, axis=1)
    grad_logits[rows, y] -= 1
    coef = -C * len(y) * (grad_logits / scale).T @ X / len(y)
    np.testing.assert_allclose(clf.intercept_ - clf.intercept_.mean(), b - b.mean(), atol=1e-6)
    np.testing.assert_allclose(clf.coef_, coef, rtol=1e-3)
    assert clf.score(X, y) == pytest.approx(1 / 3)


@pytest.mark.parametrize("c_bar, C", [(1e6, 1.0), (500.0, 1e-5)])
def test_a_large_c_bar_fits_as_the_problem_of_C_over_c_bar_squared(c_bar, C):
    # W = c̄·W' fits as W' at c̄ = 1 and C / c̄² (1e-12, 4e-11 here), whose penalty dwarfed
    # the intercept: these stopped short, the warning naming c_bar as extreme.
    X, y = load_iris(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        large = MR2LinearClassifier(c_bar=c_bar, C=C, device="cpu").fit(X, y)
    unit = MR2LinearClassifier(c_bar=1.0, C=C / c_bar**2, tol=1e-6, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (W's gradient: too steep)
        unit.fit(X, y)
    np.testing.assert_allclose(large.intercept_ / c_bar, unit.intercept_, atol=1e-6)
    np.testing.assert_allclose(large.coef_ / c_bar, unit.coef_, rtol=2e-3)


@pytest.mark.parametrize("part", ["weight", "bias"])
def test_a_fit_whose_gradient_goes_nan_does_not_meet_tol(part, monkeypatch):
    # The test on tol read the gradient's pieces with Python's max, which keeps or drops a
    # NaN by its place: a NaN gradient beside a zero one met tol at the start, and the fit
    # returned its zeros as converged without a word.
    from mr2_probe import _solvers

    X, y = load_iris(return_X_y=True)
    evaluate = _solvers.plain_data_term

    def nan_gradient(head, *args, **kwargs):
        total = evaluate(head, *args, **kwargs)
        for name, param in head.named_parameters():
            param.grad.fill_(float("nan") if name == part else 0.0)
        return total

    monkeypatch.setattr(_solvers, "plain_data_term", nan_gradient)
    with pytest.raises(ValueError, match="non-finite coefficients"):
        MR2LinearClassifier(device="cpu").fit(X, y)


def test_the_slope_search_takes_no_step_beyond_the_rounding_of_the_lowest_value():
    # Values within the objective's rounding of the line's start are not measurably above
    # it, and a step each within it of the last could climb: a step meeting the curvature
    # condition more than the rounding above the lowest value L-BFGS has seen is refused.
    # One within it is taken: the values of the steps this search is for round to the
    # start's or one unit above (a bound on the lowest value itself refused those, and
    # float32 fits of iris and digits at a small C stopped short of tol, warning).
    from mr2_probe._solvers import _slope_search

    direction = torch.ones(1, dtype=torch.float64)

    def along(x, t, d):  # a line of slope t - 1 whose values round to 1.0005
        return 1.0005, torch.tensor([t - 1.0], dtype=torch.float64)

    args = (along, None, direction, 1.0, -1.0, 0.5, 20, 1e-3)  # f = 1, noise 1e-3
    for lowest in (1.0, 1.001):  # the start's value, or one above it
        (value, _, step), _ = _slope_search(*args, lowest)
        assert (value, step) == (1.0005, 0.5)  # within the rounding of the lowest
    assert _slope_search(*args, 0.999)[0] is None  # 1.5 roundings above the lowest


@pytest.mark.parametrize("C", [1e-7, 1e-6, 1e-4])
def test_a_float32_fit_of_iris_at_c_bar_1_goes_on_below_the_objectives_rounding(C):
    # Its slope searches' steps round one unit above the lowest value seen: refused, the
    # fit stopped after 4 to 6 iterations with the float32 warning, above float64's optimum.
    X, y = load_iris(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        single = MR2LinearClassifier(C=C, device="cpu").fit(X.astype(np.float32), y)
    double = MR2LinearClassifier(C=C, tol=1e-6, device="cpu").fit(X, y)
    np.testing.assert_allclose(single.intercept_, double.intercept_, atol=1e-4)
    np.testing.assert_allclose(single.coef_, double.coef_, atol=2e-3 * np.abs(double.coef_).max())


def test_the_penalty_factor_is_taken_once_per_fit(monkeypatch):
    # 1/(C·Σw) is a host sync where Σw lives on a device: the intercept's scale and the
    # closure took it each.
    from mr2_probe import _solvers

    X, y = load_iris(return_X_y=True)
    calls, factor = [], _solvers._penalty_factor
    monkeypatch.setattr(
        _solvers, "_penalty_factor", lambda *a, **k: calls.append(1) or factor(*a, **k)
    )
    clf = MR2LinearClassifier(device="cpu").fit(X, y)
    assert len(calls) == 1 and clf.n_iter_ > 1
