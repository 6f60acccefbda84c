"""The class-tilted risk: its value and gradients, its solutions, and its bad input."""

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs
from sklearn.exceptions import ConvergenceWarning

from mr2_probe import MR2LinearClassifier, MR2Loss
from mr2_probe._data import TensorSource
from mr2_probe._losses import margin_cross_entropy, tilted_class_risk
from mr2_probe._solvers import ClassRisk, tilted_data_term

from .test_head import _head


def _uneven(n_classes=4, n=400, seed=0):
    """Blobs whose classes differ in spread, so that their losses differ."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(n_classes, 5))
    y = np.arange(n) % n_classes
    spread = np.linspace(0.6, 2.5, n_classes)
    X = centers[y] + rng.normal(size=(n, 5)) * spread[y, None]
    return X, y


def _fit(**params):
    """An estimator to fit to tol 1e-8 (float32 fits may stop short of it: not warned)."""
    params = {"C": 0.1, "max_iter": 1000, "tol": 1e-8, "device": "cpu"} | params
    estimator = MR2LinearClassifier(**params)
    fit = estimator.fit

    def quiet_fit(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return fit(*args, **kwargs)

    estimator.fit = quiet_fit
    return estimator


# ----------------------------------------------------------------- the risk itself


@pytest.mark.parametrize("solver", ["lbfgs", "adam"])
def test_a_tilt_of_subnormal_float32_weights_is_float64_s(solver):
    # Weights of 1e-40 with C = 1e39 (C·Σw = 10, the problem of C = 0.1 at weights 1):
    # their class sums S_k, below float32's smallest normal number, were clamped up to it,
    # and the class losses L_k = Σ w·ℓ / S_k taken 0.4 times their value.
    X, y = _uneven(n=100)
    fits = [
        _fit(C=1e39, class_tilt=2.0, solver=solver, max_iter=50).fit(
            X.astype(dtype), y, np.full(len(y), 1e-40)
        )
        for dtype in (np.float32, np.float64)
    ]
    np.testing.assert_allclose(fits[0].class_losses_, fits[1].class_losses_, rtol=1e-3)
    np.testing.assert_allclose(fits[0].tilt_weights_, fits[1].tilt_weights_, rtol=1e-3)


def test_tilted_risk_limits():
    loss = torch.tensor([0.2, 1.5, 0.7], dtype=torch.float64)
    share = torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)
    mean = (share * loss).sum()
    risk, q = tilted_class_risk(loss, share, 0.0)
    assert risk == mean and torch.equal(q, share)
    # Continuous at t = 0, increasing in t, and below the worst loss.
    assert torch.isclose(tilted_class_risk(loss, share, 1e-6)[0], mean, atol=1e-6)
    values = [float(tilted_class_risk(loss, share, t)[0]) for t in (0.5, 2.0, 10.0, 1e4)]
    assert values == sorted(values) and values[-1] <= 1.5
    assert values[-1] == pytest.approx(1.5, abs=2e-3)
    # The weights are the gradient of the risk in L.
    L = loss.clone().requires_grad_(True)
    tilted_class_risk(L, share, 3.0)[0].backward()
    torch.testing.assert_close(L.grad, tilted_class_risk(loss, share, 3.0)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_small_tilt_keeps_the_risk_s_precision(dtype):
    # (1/t)·logsumexp(t·L + log π) divides the log-sum-exp's rounding by t: in float32 at
    # t = 1e-6 the risk was noise (an untrained model), in float64 at t = 1e-14 too.
    loss = torch.tensor([0.2, 1.5, 0.7], dtype=dtype)
    share = torch.tensor([0.5, 0.2, 0.3], dtype=dtype)
    mean = (share * loss).sum()
    variance = (share * (loss - mean) ** 2).sum()
    # Below the dtype's smallest normal number (float32: 1.2e-38) t rounded to 0 or to a
    # subnormal, and log1p(0) / 0 made the risk NaN at t = 1e-50.
    for t in (1e-320, 1e-50, 1e-14, 1e-6, 1e-3):
        risk = tilted_class_risk(loss, share, t)[0]
        # R_t = mean + t·variance/2 + O(t²)
        torch.testing.assert_close(risk, mean + t * variance / 2, rtol=2e-7, atol=0)
        L = loss.clone().requires_grad_(True)
        tilted_class_risk(L, share, t)[0].backward()
        assert torch.isfinite(L.grad).all()
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # tol 1e-8 in float32
        plain = _fit().fit(X, y)
        tilted = _fit(class_tilt=1e-6).fit(X, y)
        tiny = _fit(class_tilt=1e-50).fit(X, y)  # IndexError inside torch's L-BFGS
    for fit in (tilted, tiny):
        np.testing.assert_allclose(fit.coef_, plain.coef_, atol=1e-3 * np.abs(plain.coef_).max())


def test_the_risk_s_gradient_is_q_where_the_two_forms_meet():
    # At t·(L_k − L̄) = 1 exactly, the near form's clamp had a zero gradient.
    loss = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    share = torch.tensor([0.5, 0.5], dtype=torch.float64)
    risk, q = tilted_class_risk(loss, share, 2.0)
    risk.backward()
    torch.testing.assert_close(loss.grad, q.detach())


@pytest.mark.parametrize("absent", [9.0, math.inf, math.nan])
@pytest.mark.parametrize("tilt", [0.0, 5.0])
def test_absent_class_gets_no_weight(absent, tilt):
    # Whatever its loss: an infinite or NaN one made R_t NaN (0·inf, t·inf + log 0).
    loss = torch.tensor([0.2, absent, 0.7], dtype=torch.float64)
    share = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    risk, q = tilted_class_risk(loss, share, tilt)
    assert q[1] == 0 and torch.isclose(q.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert 0.449 < risk < 1.0  # (the mean of the present classes: 0.45)


# keep (the logits' gradients kept between the two passes) applies to the closed forms
# only: a two-class linear head takes the autograd passes, once.
@pytest.mark.parametrize(
    "head_kind, keep, k",
    [("linear", True, 4), ("linear", False, 4), ("linear", True, 2)]
    + [("cosine", keep, k) for keep in (True, False) for k in (4, 2)],
)
@pytest.mark.parametrize("tilt", [0.5, 4.0])
def test_closed_form_gradient_matches_autograd(head_kind, keep, tilt, k):
    """With margins, class and sample weights, split into several chunks. Two classes pin
    a linear head's first logit (one row, its gradients the second logit's)."""
    gen = torch.Generator().manual_seed(0)
    n, d = 90, 6
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.arange(n) % k
    w = torch.rand(n, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 3.0, 0.5, 2.0])[y]
    margins = torch.tensor([0.7, 1.4, 1.0, 0.9], dtype=torch.float64)[:k]
    head = _head(d, k, head=head_kind, fit_intercept=True, scale=5.0, generator=gen)
    assert head.has_closed_form
    with torch.no_grad():
        head.weight.normal_(generator=gen)
        if head.bias is not None:
            head.bias.normal_(generator=gen)
    center = X.mean(0) if head.is_plain_linear else None  # as fit_lbfgs centres
    source = TensorSource(X, y, w, rows=32)  # three chunks
    risk = ClassRisk.of_source(source, k, tilt)
    for param in head.parameters():
        param.grad = torch.zeros_like(param)
    value = tilted_data_term(head, source, margins, risk, center, keep)
    got = [param.grad.clone() for param in head.parameters()]

    # Reference: the definition, differentiated by autograd.
    for param in head.parameters():
        param.grad = None
    Xc = X - center if center is not None else X
    z = head.logits(head.features(Xc))
    each = margin_cross_entropy(z, y, margins, reduction="none")
    S_k = torch.zeros(k, dtype=torch.float64).index_add_(0, y, w)
    L = torch.zeros(k, dtype=torch.float64).index_add(0, y, each * w) / S_k
    reference = torch.logsumexp(tilt * L + (S_k / S_k.sum()).log(), 0) / tilt
    reference.backward()
    torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=1e-12)
    for g, param in zip(got, head.parameters(), strict=True):
        torch.testing.assert_close(g, param.grad, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ the estimator
def test_tilt_zero_is_todays_objective():
    X, y = _uneven()
    base = _fit().fit(X, y)
    # The tilted path is continuous at t = 0.
    tiny = _fit(class_tilt=1e-7).fit(X, y)
    np.testing.assert_allclose(tiny.coef_, base.coef_, atol=1e-4)
    # At t = 0 the weights are the class shares.
    np.testing.assert_allclose(base.tilt_weights_, np.bincount(y) / len(y))


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_worst_class_loss_falls_as_tilt_grows(head):
    X, y = _uneven()
    worst, mean = [], []
    for tilt in (0.0, 1.0, 4.0, 16.0):
        # The cosine head converges slowly to a tight tolerance; 1e-6 is plenty here.
        clf = _fit(class_tilt=tilt, head=head, scale=8.0, tol=1e-6).fit(X, y)
        worst.append(clf.class_losses_.max())
        mean.append(clf.class_losses_ @ (np.bincount(y) / len(y)))
        assert clf.tilt_weights_.sum() == pytest.approx(1.0)
        # The objective leans on the classes whose loss is high.
        if tilt > 0:
            assert np.argmax(clf.tilt_weights_) == np.argmax(clf.class_losses_)
    assert np.all(np.diff(worst) < 0), worst
    assert mean[-1] > mean[0], mean  # the price: the mean loss rises


@pytest.mark.slow
def test_huge_tilt_on_two_classes_is_minimax():
    """max(L_0, L_1) + penalty at t = 300 matches the minimax value found by its dual."""
    X, y = make_blobs(n_samples=[60, 140], centers=[[0, 0], [2.0, 1.0]], random_state=0)
    X[y == 1] *= 1.8
    C, n = 0.5, len(y)
    counts = np.bincount(y)

    def dual(alpha):
        # min_W α·L_0 + (1 − α)·L_1 + penalty, with the weights summing to n as in the fit.
        w = np.where(y == 0, alpha * n / counts[0], (1 - alpha) * n / counts[1])
        clf = _fit(C=C, c_bar=None).fit(X, y, sample_weight=w)
        return clf.loss_curve_[-1]

    # Golden-section search of the concave dual, one new evaluation per step: after 20
    # steps the interval is 1e-4 wide.
    ratio = (5**0.5 - 1) / 2
    lo, hi = 0.0, 1.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = dual(a), dual(b)
    for _ in range(20):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = dual(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = dual(a)
    minimax = max(fa, fb)

    clf = _fit(C=C, c_bar=None, class_tilt=300.0, max_iter=3000).fit(X, y)
    penalty = 0.5 * np.sum(clf.coef_**2) / (C * n)
    primal = clf.class_losses_.max() + penalty
    assert primal == pytest.approx(minimax, abs=5e-3)
    plain = _fit(C=C, c_bar=None).fit(X, y)
    assert clf.class_losses_.max() < plain.class_losses_.max() - 0.05
    # At the minimax point neither class's loss can fall without the other's rising.
    assert abs(clf.class_losses_[0] - clf.class_losses_[1]) < 0.02


def test_tilt_composes_with_margins_and_weights():
    """class_weight enters the shares: with 'balanced' they are uniform, whatever the sizes."""
    X, y = _uneven()
    keep = (y != 0) | (np.arange(len(y)) < 40)  # class 0 made rare
    X, y = X[keep], y[keep]
    clf = _fit(class_tilt=2.0, c_bar=1.0, class_weight="balanced").fit(X, y)
    L = clf.class_losses_
    share = np.full(4, 0.25)
    expected = np.exp(2.0 * L) * share / np.sum(np.exp(2.0 * L) * share)
    np.testing.assert_allclose(clf.tilt_weights_, expected, rtol=1e-6)
    # R_t does not change when every weight doubles, the penalty ½‖W‖² / (C·S) halves: as
    # in LogisticRegression, doubling the weights is doubling C.
    again = _fit(class_tilt=2.0, c_bar=1.0, class_weight="balanced")
    again.fit(X, y, sample_weight=np.full(len(y), 2.0))
    double_c = _fit(class_tilt=2.0, c_bar=1.0, class_weight="balanced", C=0.2).fit(X, y)
    np.testing.assert_allclose(again.coef_, double_c.coef_, atol=1e-5)


def test_a_tilted_fit_of_features_of_a_large_scale_is_that_of_the_features_scaled_down():
    # Features 32 times larger (σ_b = 128: L-BFGS takes the intercept as b / σ_b) at C / 32²
    # are the same problem, with coef_ / 32. The tilted term's intercept gradient is in
    # b / σ_b too: taken in b, the fit stalled far from the optimum (coef_ 0.75 off).
    X, y = _uneven()
    small = _fit(c_bar=None, class_tilt=2.0, C=1e-3 * 32**2).fit(X, y)
    large = _fit(c_bar=None, class_tilt=2.0, C=1e-3).fit(32 * X, y)
    np.testing.assert_allclose(32 * large.coef_, small.coef_, atol=1e-4)
    np.testing.assert_allclose(large.intercept_, small.intercept_, atol=1e-3)


@pytest.mark.parametrize("lam", [0.0, pytest.param(0.5, marks=pytest.mark.slow)])
def test_minibatch_tilt_lowers_worst_class_loss(lam):
    X, y = _uneven(n=600)
    common = dict(solver="adam", lam=lam, max_iter=40, learning_rate=0.005, random_state=0)
    plain = _fit(**common).fit(X, y)
    tilted = _fit(class_tilt=8.0, **common).fit(X, y)
    assert tilted.class_losses_.max() < plain.class_losses_.max()
    assert tilted.tilt_weights_.sum() == pytest.approx(1.0)
    assert np.all(np.isfinite(tilted.loss_curve_))
    # Deterministic under a fixed random_state.
    np.testing.assert_array_equal(_fit(class_tilt=8.0, **common).fit(X, y).coef_, tilted.coef_)


@pytest.mark.slow
def test_minibatch_large_tilt_does_not_swing_between_classes():
    """A large tilt with the compactness loss (Adam): the worst class is helped, not lost.

    With q held for an epoch the fit swung between classes and ended on a model that got
    none of the worst class's training rows right (max class loss 2.26 against 1.04
    untilted). Since the compactness loss is differentiated through s̄ and τ, the untilted
    fit's largest class loss is 0.22 (seeds 0 to 2: 0.22 to 0.26), and the tilt moves it
    by less than the minibatch noise: 0.24 (seed 0), 0.20, 0.21; its worst class gains."""

    X, y = load_digits(return_X_y=True)
    X = X / 16
    common = dict(c_bar=2.0, lam=0.5, p=3, random_state=0, device="cpu")
    plain = MR2LinearClassifier(**common).fit(X, y)
    tilted = MR2LinearClassifier(class_tilt=20.0, **common).fit(X, y)

    def worst(model):
        right = model.predict(X) == y
        return min(right[y == k].mean() for k in np.unique(y))

    assert tilted.class_losses_.max() < 1.2 * plain.class_losses_.max()
    assert worst(tilted) >= worst(plain)


@pytest.mark.slow
def test_minibatch_tilt_with_many_classes_of_few_samples():
    """100 classes, about 2.6 samples of each per batch of 256: class weights from each
    batch's own class means were noise (max class loss 1.21 against 1.17 untilted, worst
    class 62% of training rows against 75%)."""
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=6000, n_features=40, n_informative=30, n_classes=100,
        n_clusters_per_class=1, class_sep=2.0, random_state=0,
    )  # fmt: skip
    common = dict(solver="adam", max_iter=60, random_state=0, device="cpu")
    plain = _fit(**common).fit(X, y)
    tilted = _fit(class_tilt=2.0, **common).fit(X, y)

    def worst(model):
        right = model.predict(X) == y
        return min(right[y == k].mean() for k in range(100))

    assert tilted.class_losses_.max() < plain.class_losses_.max() - 0.1
    assert worst(tilted) >= worst(plain) - 0.02


def test_a_negative_tilt_is_still_the_soft_minimum():
    # The shortcut for a t that the dtype cannot show took every negative t for 0.
    loss = torch.tensor([0.2, 1.5, 0.7], dtype=torch.float64)
    share = torch.full((3,), 1 / 3, dtype=torch.float64)
    expected = torch.logsumexp(-2.0 * loss + share.log(), 0) / -2.0
    torch.testing.assert_close(tilted_class_risk(loss, share, -2.0)[0], expected)


def test_a_tilt_too_large_to_fit_is_named():
    # At t = 1e4 L-BFGS ran out of iterations and at 1e39 (float32) its step overflowed;
    # both messages blamed the scale of the features alone.
    X, y = _uneven()
    with pytest.warns(ConvergenceWarning, match=r"class_tilt=10000 makes the objective"):
        MR2LinearClassifier(class_tilt=1e4, max_iter=20, device="cpu").fit(X, y)
    # (as given, not in %g's 6 digits: 12345.7)
    with pytest.warns(ConvergenceWarning, match=r"class_tilt=12345.678 makes the objective"):
        MR2LinearClassifier(class_tilt=12345.678, max_iter=20, device="cpu").fit(X, y)
    for solver in ("lbfgs", "adam"):  # adam's diverged loss blamed its learning rate
        with pytest.raises(ValueError, match=r"with class_tilt=1e\+39 \(the tilt multiplies"):
            MR2LinearClassifier(class_tilt=1e39, solver=solver, device="cpu").fit(
                X.astype(np.float32), y
            )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # t = 10 converges, unnamed
        MR2LinearClassifier(class_tilt=10.0, max_iter=1000, device="cpu").fit(X, y)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), "2"])
def test_bad_tilt_is_refused(bad):
    X, y = _uneven()
    with pytest.raises(ValueError, match="'class_tilt' parameter of MR2LinearClassifier"):
        MR2LinearClassifier(class_tilt=bad, device="cpu").fit(X, y)


# ------------------------------------------------------------------------- MR2Loss
def test_mr2loss_tilt():
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(40, 5, generator=gen)
    target = torch.arange(40) % 4
    logits = torch.randn(40, 4, generator=gen)
    logits[target == 2] = -logits[target == 2]  # class 2 has a high loss
    plain = MR2Loss(4, 5, c_bar=1.0, lam=0.0)
    zero = MR2Loss(4, 5, c_bar=1.0, lam=0.0, class_tilt=0.0)
    assert torch.equal(plain(logits, features, target), zero(logits, features, target))

    tilted = MR2Loss(4, 5, c_bar=1.0, lam=0.0, class_tilt=2.0)
    value = tilted(logits, features, target)
    q = tilted.class_weights()
    assert torch.isclose(q.sum(), torch.tensor(1.0)) and int(q.argmax()) == 2
    # One batch: the running class losses are the batch's, and the loss weights sample i
    # by q_{y_i} / π_{y_i}, so the value is Σ_k q_k·L_k.
    each = margin_cross_entropy(logits, target, tilted.margins(), reduction="none")
    L = torch.zeros(4).index_add(0, target, each) / 10
    torch.testing.assert_close(tilted.running_class_loss, L)
    torch.testing.assert_close(value, (q * L).sum())
    with pytest.raises(ValueError, match="class_tilt"):
        MR2Loss(4, 5, class_tilt=-1.0)


def test_mr2loss_tilted_batch_loss_is_the_mean_of_its_weighted_losses():
    # After a first batch, a second of other class proportions: π counts every sample seen,
    # L_k is the EMA of the batch means, and the loss is mean_i(ℓ_i·q_{y_i} / π_{y_i}) over
    # the batch, the docstring's estimate of Σ_k q_k·L_k (not normalised by Σ_i q / π).
    gen = torch.Generator().manual_seed(1)
    criterion = MR2Loss(3, 4, c_bar=None, lam=0.0, class_tilt=2.0, rho=0.9).double()
    first, second = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 1, 1, 2, 2])
    batches = [(torch.randn(len(t), 3, generator=gen, dtype=torch.float64), t)
               for t in (first, second)]  # fmt: skip
    L, counts = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for n, (logits, target) in enumerate(batches):
        value = criterion(logits, torch.zeros(len(target), 4, dtype=torch.float64), target)
        each = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        seen = torch.bincount(target, minlength=3).double()
        mean = torch.zeros(3, dtype=torch.float64).index_add(0, target, each) / seen
        L = mean if n == 0 else 0.9 * L + 0.1 * mean
        counts += seen
        share = counts / counts.sum()
        q = torch.softmax(2.0 * L + share.log(), 0)
        torch.testing.assert_close(value, (each * (q / share)[target]).mean())


@pytest.mark.parametrize("tilt", [1e38, 1e300])
def test_mr2loss_with_a_tilt_beyond_float32_s_range_leans_on_the_worst_class(tilt):
    # t·L_k overflowed to inf in float32 (t = 1e300 is inf there): every class weight and
    # the loss were NaN. t → ∞ is the worst class's loss, as at t = 1e30.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(40, 5, generator=gen), torch.arange(40) % 4
    logits = 4 * torch.randn(40, 4, generator=gen, requires_grad=True)
    values, weights = [], []
    for t in (1e30, tilt):
        criterion = MR2Loss(4, 5, c_bar=1.0, lam=0.0, class_tilt=t)
        for _ in range(2):
            values.append(criterion(logits, features, target))
        weights.append(criterion.class_weights())
    assert torch.isfinite(torch.stack(values)).all()
    torch.testing.assert_close(weights[1], weights[0])
    assert torch.equal(weights[0], torch.eye(4)[int(weights[0].argmax())])
    torch.testing.assert_close(values[2:], values[:2])
    (grad,) = torch.autograd.grad(values[-1], logits)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mr2loss_class_weights_are_the_tilted_risk_s_to_the_bit(dtype):
    # The weights of a tilt within the dtype's range are softmax(t·L + log π) as
    # tilted_class_risk gives them: taken relative to the largest loss (for the overflow
    # of t·L at t = 1e300), they differed in their last bits at t = 8.
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(4, 3, c_bar=1.0, lam=0.0, class_tilt=8.0).to(dtype)
    criterion.class_samples.copy_(torch.tensor([5, 7, 3, 9]))
    for _ in range(20):
        loss = 3 * torch.rand(4, generator=gen, dtype=dtype)
        criterion.running_class_loss.copy_(loss)
        expected = tilted_class_risk(loss, criterion._class_share(), 8.0)[1]
        assert torch.equal(criterion.class_weights(), expected)


def test_mr2loss_evaluated_before_training_is_the_plain_loss():
    # A validation pass before the first training step (a sanity check): no statistics yet,
    # so no tilt and no compactness term, and every class weight 0, not NaN.
    gen = torch.Generator().manual_seed(0)
    features, logits = torch.randn(6, 4, generator=gen), torch.randn(6, 3, generator=gen)
    target = torch.arange(6) % 3
    plain = margin_cross_entropy(logits, target, torch.ones(3))
    for params in (dict(class_tilt=1.0), dict(tau=None, lam=0.5), dict(lam=0.5)):
        criterion = MR2Loss(3, 4, c_bar=1.0, **params).eval()
        torch.testing.assert_close(criterion(logits, features, target), plain)
    assert torch.equal(MR2Loss(3, 4, class_tilt=1.0).class_weights(), torch.zeros(3))
    # After training on classes 0 and 1 only, an evaluation counts class 2 as the plain
    # mean does rather than dropping it.
    criterion = MR2Loss(3, 4, c_bar=None, lam=0.0, class_tilt=1.0)
    seen = target < 2
    criterion(logits[seen], features[seen], target[seen])
    q, share = criterion.class_weights(), criterion._class_share()
    each = margin_cross_entropy(logits, target, torch.ones(3), reduction="none")
    ratio = torch.cat([q[:2] / share[:2], torch.ones(1)])
    value = criterion.eval()(logits, features, target)
    torch.testing.assert_close(value, (each * ratio[target]).mean())


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
def test_mr2loss_in_bfloat16_keeps_counting_samples():
    criterion = MR2Loss(2, 4, class_tilt=1.0).to(torch.bfloat16)
    target = torch.tensor([0] * 60 + [1] * 4)
    logits, features = torch.zeros(64, 2, dtype=torch.bfloat16), torch.ones(64, 4)
    for _ in range(300):
        criterion(logits, features.to(torch.bfloat16), target)
    assert criterion.class_samples.tolist() == [18000, 1200]


def test_tilted_class_risk_of_many_problems_at_once_is_each_ones():
    gen = torch.Generator().manual_seed(0)
    loss = torch.rand(3, 5, generator=gen, dtype=torch.float64) * 4
    share = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    share[1, 2] = 0  # a class absent from one problem
    share /= share.sum(1, keepdim=True)
    for tilt in (1e-6, 0.5, 50.0):  # around the mean, and the log-sum-exp
        risk, weights = tilted_class_risk(loss, share, tilt)
        for i in range(3):
            one, its = tilted_class_risk(loss[i], share[i], tilt)
            torch.testing.assert_close(risk[i], one)
            torch.testing.assert_close(weights[i], its)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_batched_tilted_objective_matches_autograd(head, keep, monkeypatch):
    """The search's batched solver: fold by fold, R_t of the class losses (plus the linear
    head's penalty) and its gradient, with the first pass's logit gradients kept or not."""
    from mr2_probe import _batched as batched

    if not keep:
        monkeypatch.setattr(batched, "_KEEP_LOGIT_GRADS", 0)
    gen = torch.Generator().manual_seed(0)
    n, d, k, t, value = 90, 6, 4, 1.5, 3.0
    X = torch.randn(n, d, generator=gen, dtype=torch.float64) + 2
    y = torch.arange(n) % k
    weight = torch.rand(2, n, generator=gen, dtype=torch.float64) + 0.5
    weight[1, ::3] = 0  # a fold's held-out rows
    weight[1, y == 3] = 0  # and a class it does not train on
    margins = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64)
    inv_gamma = margins.reciprocal().expand(2, -1).contiguous()
    cosine = head == "cosine"
    center = None if cosine else torch.randn(2, d, generator=gen, dtype=torch.float64)
    batch = batched.FoldBatch(X, y, weight, inv_gamma, center, k, cosine, t)
    params = torch.randn(2, k * d + (0 if cosine else k), generator=gen, dtype=torch.float64)
    value_, grad = batch.evaluate(params, torch.arange(2), value)
    for f in range(2):
        p = params[f].clone().requires_grad_()
        W = p[: k * d].view(k, d)
        if cosine:
            unit = torch.nn.functional.normalize
            z = value * unit(X, dim=1) @ unit(W, dim=1).T
        else:
            z = (X - center[f]) @ W.T + p[k * d :]
        ell = margin_cross_entropy(z, y, margins, reduction="none")
        S_k = torch.zeros(k, dtype=X.dtype).index_add_(0, y, weight[f])
        sums = torch.zeros(k, dtype=X.dtype).index_add(0, y, ell * weight[f])
        L = sums / S_k.clamp_min(torch.finfo(X.dtype).tiny)
        objective = tilted_class_risk(L, S_k / S_k.sum(), t)[0]
        if not cosine:
            objective = objective + 0.5 * W.square().sum() / (value * weight[f].sum())
        objective.backward()
        torch.testing.assert_close(value_[f], objective.detach())
        torch.testing.assert_close(grad[f], p.grad)


@pytest.mark.slow
@pytest.mark.parametrize("batch_folds", [None, False])
def test_a_tilted_search_solves_the_fits_of_its_values(batch_folds, monkeypatch):
    """A tilted search's path (the batched solver, its memory carried along the path) ends
    at each C where a fit of MR2LinearClassifier(C, class_tilt) on the fold ends."""
    from sklearn.preprocessing import StandardScaler

    from mr2_probe import MR2LinearClassifierCV

    X, y = make_blobs(n_samples=240, centers=4, n_features=5, cluster_std=3.0, random_state=0)
    X = StandardScaler().fit_transform(X)
    rows = np.arange(240)
    folds = [(np.setdiff1d(rows, rows[i::3]), rows[i::3]) for i in range(2)]
    common = dict(class_tilt=2.0, c_bar=1.0, tol=1e-8, max_iter=2000, device="cpu")
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = MR2LinearClassifierCV([0.01, 1.0, 100.0], cv=folds, refit=False, **common)
        search.fit(X, y)
        for f, (train, _) in enumerate(folds):
            for j, C in enumerate(search.Cs_):
                cold = MR2LinearClassifier(C=C, **common).fit(X[train], y[train])
                path = np.stack([search.coefs_paths_[c][f, j] for c in search.classes_])
                np.testing.assert_allclose(path[:, :5], cold.coef_, atol=1e-4)
                np.testing.assert_allclose(path[:, 5], cold.intercept_, atol=1e-4)


@pytest.mark.parametrize("solver", ["lbfgs", "adam"])
def test_class_losses_are_weighted_means_of_the_fitted_model_s_losses(solver):
    # L_k = Σ_{i∈k} w_i ℓ_i / Σ_{i∈k} w_i at the solution, with the weights (the minibatch
    # solvers' pass over the data dropped them without a test noticing).
    X, y = _uneven()
    w = np.random.default_rng(1).uniform(0.2, 3.0, len(y))
    clf = MR2LinearClassifier(c_bar=1, class_tilt=1, solver=solver, max_iter=5, random_state=0,
                              device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, sample_weight=w)
    z = torch.as_tensor(clf.decision_function(X), dtype=torch.float64)
    target = torch.as_tensor(np.searchsorted(clf.classes_, y))
    margins = torch.as_tensor(clf.margins_, dtype=torch.float64)
    loss = margin_cross_entropy(z, target, margins, reduction="none").numpy()
    expected = np.bincount(target, loss * w) / np.bincount(target, w)
    np.testing.assert_allclose(clf.class_losses_, expected, rtol=1e-4)


def test_a_small_tilt_keeps_its_precision_beside_an_absent_class_far_from_the_mean():
    # An absent class (π = 0) has no part in R_t, whatever its L: its distance from the
    # mean must not send a small t to the log-sum-exp form (float32: 0.477 for 0.45).
    loss = torch.tensor([0.2, 1e7, 0.7])
    share = torch.tensor([0.5, 0.0, 0.5])
    for t in (1e-6, 1e-4):
        risk, q = tilted_class_risk(loss, share, t)
        torch.testing.assert_close(risk, torch.tensor(0.45 + t * 0.0625 / 2), rtol=1e-6, atol=0)
        assert q[1] == 0


def test_a_large_tilt_has_a_finite_gradient_equal_to_its_weights():
    # t·(L_k − L̄) = 5000: the unused near form's expm1 overflowed, and 0·inf made the
    # gradient NaN through torch.where.
    loss = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    share = torch.tensor([0.5, 0.5], dtype=torch.float64)
    risk, q = tilted_class_risk(loss, share, 1e4)
    risk.backward()
    assert torch.isfinite(loss.grad).all()
    torch.testing.assert_close(loss.grad, q.detach())


def test_the_tilted_risk_keeps_float32_precision_up_to_deviations_of_one():
    # t·(L_k − L̄) ≤ 0.5 with a rare class: the log-sum-exp form, divided by t = 1e-4, was
    # off by 6e-4 relative in float32; the form around the mean is exact.
    share = torch.tensor([1 - 1e-4, 1e-4])
    loss = torch.tensor([0.0, 5000.0])
    t = 1e-4
    want = math.log((1 - 1e-4) + 1e-4 * math.exp(0.5)) / t
    risk, _ = tilted_class_risk(loss, share, t)
    assert float(risk) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("tilt", [0.0, 1e-6, 2.0, 1e4])
def test_an_absent_class_with_a_non_finite_loss_has_no_part_in_the_risk(tilt):
    # Its t·L + log π was inf − inf = NaN, and every class weight NaN with it.
    share = torch.tensor([0.5, 0.0, 0.5])
    want = tilted_class_risk(torch.tensor([0.2, 0.0, 0.7]), share, tilt)
    for absent in (float("inf"), float("nan")):
        risk, q = tilted_class_risk(torch.tensor([0.2, absent, 0.7]), share, tilt)
        torch.testing.assert_close((risk, q), want)
        assert q[1] == 0


def test_mr2loss_after_a_single_training_sample_weighs_it_as_the_plain_mean():
    # After one training sample the only class seen has all of the share (π = 1) and all
    # of the tilt's weight (q = 1): its samples then weigh q/π = 1, so an evaluation of
    # that sample is the plain loss, not a multiple of it.
    gen = torch.Generator().manual_seed(0)
    logits, features = torch.randn(1, 3, generator=gen), torch.randn(1, 4, generator=gen)
    target = torch.tensor([0])
    criterion = MR2Loss(3, 4, c_bar=None, lam=0.0, class_tilt=2.0)
    criterion(logits, features, target)
    torch.testing.assert_close(criterion._class_share(), torch.tensor([1.0, 0.0, 0.0]))
    plain = margin_cross_entropy(logits, target, torch.ones(3))
    torch.testing.assert_close(criterion.eval()(logits, features, target), plain)


def test_mr2loss_leaves_the_running_loss_of_a_class_absent_from_a_batch():
    # Each class's running loss is an average of the batches that hold it: a batch without
    # a class says nothing about its loss, and must neither pull it towards 0 nor count
    # samples for it (or a rare class would look easy and lose its tilt weight).
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(3, 4, c_bar=None, lam=0.0, class_tilt=1.0)
    target = torch.arange(9) % 3
    criterion(torch.randn(9, 3, generator=gen), torch.randn(9, 4, generator=gen), target)
    before = criterion.running_class_loss.clone()
    samples = criterion.class_samples.clone()
    assert before[2] > 0
    target = torch.arange(8) % 2  # classes 0 and 1 only
    criterion(torch.randn(8, 3, generator=gen), torch.randn(8, 4, generator=gen), target)
    assert criterion.running_class_loss[2] == before[2]
    assert criterion.class_samples.tolist() == [samples[0] + 4, samples[1] + 4, samples[2]]


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_a_vanishing_tilt_gives_the_plain_minibatch_epoch_losses(solver):
    # The tilted risk tends to the plain mean loss as the tilt goes to 0: a minibatch
    # fit's epoch losses (its loss curve, on which its plateaus and stop are judged) must
    # then be the untilted fit's, the data term counted once.
    X, y = make_blobs(n_samples=90, centers=3, n_features=4, random_state=0)
    curves = []
    for tilt in (0.0, 1e-6):
        clf = MR2LinearClassifier(
            solver=solver, class_tilt=tilt, max_iter=3, lam=0.5, batch_size=32,
            random_state=0, device="cpu",
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(X, y)
        curves.append(clf.loss_curve_)
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-3)


def test_a_batch_of_many_samples_of_a_class_sets_its_running_loss_to_the_batch_mean(
    monkeypatch,
):
    # The running class losses move towards a batch's class means by at most all the way:
    # a batch holding more of a class than the averaging window (here the whole training
    # set, 60 samples a class) replaces its running loss by the batch's mean. Moving past
    # it would extrapolate, and under- or over-weight the class in the tilt.
    from mr2_probe import _solvers

    seen = []
    original = _solvers.ClassRisk.risk

    def recording_risk(self, class_loss):
        seen.append(class_loss.detach().clone())
        return original(self, class_loss)

    monkeypatch.setattr(_solvers.ClassRisk, "risk", recording_risk)
    X, y = make_blobs(n_samples=180, centers=3, n_features=4, random_state=0)
    clf = MR2LinearClassifier(
        solver="adam", class_tilt=1.0, batch_size=180, max_iter=4, learning_rate=0.1,
        random_state=0, device="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    # One batch an epoch: each step's class losses, then the epoch's own (the same batch).
    steps, epochs = seen[0::2], seen[1::2]
    assert len(steps) == len(epochs) == 4
    for step, epoch in zip(steps, epochs, strict=True):
        torch.testing.assert_close(step, epoch)


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_a_tilted_minibatch_fit_with_integer_weights_is_that_of_the_rows_repeated(solver):
    # One batch an epoch holds every class whole: its running class losses are then the
    # exact ones, with the rows weighted or repeated alike. Classes lighter than the
    # averaging window (20 rows weighted 1 to 3) were moved only part of the way, by a
    # rate counted in rows: 0.002 apart in probability.
    rng = np.random.default_rng(0)
    X, y, sw = rng.random((60, 10)), rng.integers(0, 3, 60), rng.integers(1, 4, 60)
    params = {"solver": solver, "class_tilt": 2.0, "max_iter": 20, "random_state": 0}
    weighted = _fit(**params).fit(X, y, sample_weight=sw)
    repeated = _fit(**params).fit(X.repeat(sw, axis=0), y.repeat(sw))
    np.testing.assert_allclose(weighted.predict_proba(X), repeated.predict_proba(X), atol=1e-9)
