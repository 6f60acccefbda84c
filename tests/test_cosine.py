"""The cosine head's L-BFGS: closed-form gradients, unit-direction rounds, same solutions."""

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV
from mr2_probe import _batched as batched
from mr2_probe import _solvers as solvers
from mr2_probe._batched import FoldBatch, Memory
from mr2_probe._data import H5Source, TensorSource
from mr2_probe._device import tangent_rows
from mr2_probe._head import PAIR_OPENING, open_pair
from mr2_probe._losses import margin_cross_entropy, tilted_class_risk
from mr2_probe._path import FoldPath
from mr2_probe._solvers import ClassRisk, plain_data_term, tilted_data_term
from mr2_probe._sphere import _Line, _Memory
from tests.reference_mr2 import cosine_lbfgs_before

from .test_head import _head


@pytest.fixture(scope="module")
def digits_unit():
    X, y = load_digits(return_X_y=True)
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


def _normalised_blobs(n=600, d=20, k=6, seed=0):
    """Unit-norm features of overlapping classes, as embeddings are."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d))
    y = np.arange(n) % k
    X = centers[y] + rng.normal(scale=1.2, size=(n, d)) + 2.0  # a common offset
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


def _objective(X, y, coef, scale, margins):
    """(1/N) Σ CE(z / γ_y, y) of a fitted cosine model on unit-norm X (float64)."""
    z = torch.as_tensor(X @ coef.T)  # coef_ rows are scale × unit directions
    return float(margin_cross_entropy(z, torch.as_tensor(y), torch.as_tensor(margins)))


def _fit(X, y, **params):
    params = {"head": "cosine", "max_iter": 3000, "device": "cpu"} | params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MR2LinearClassifier(**params).fit(X, y)


def _source(kind, X, y, w, tmp_path):
    if kind == "tensor":
        return TensorSource(X, y, w, rows=32)
    h5py = pytest.importorskip("h5py")
    f = h5py.File(tmp_path / "X.h5", "w")
    f["X"] = X.numpy()
    return H5Source(f["X"], y, w, 32, torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("kind", ["tensor", "h5"])
@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_closed_form_cosine_gradient_matches_autograd(kind, tilt, tmp_path):
    """The closed form takes raw x with 1/‖x‖ kept per block (not a normalised copy)."""
    gen = torch.Generator().manual_seed(0)
    n, d, k = 70, 5, 3
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.arange(n) % k
    w = torch.rand(n, generator=gen, dtype=torch.float64)
    margins = torch.tensor([0.8, 1.3, 0.9], dtype=torch.float64)
    head = _head(d, k, fit_intercept=True, scale=7.0, generator=gen)
    with torch.no_grad():
        head.weight.normal_(generator=gen).mul_(3.0)  # rows far from unit norm
    source = _source(kind, X, y, w, tmp_path)
    risk = ClassRisk.of_source(source, k, tilt)
    for _ in range(2):  # the second evaluation reuses the kept 1/‖x‖
        head.weight.grad = torch.zeros_like(head.weight)
        if tilt:
            value = tilted_data_term(head, source, margins, risk, keep=kind == "tensor")
        else:
            value = plain_data_term(head, source, margins, float(w.sum()))
        got = head.weight.grad.clone()
        head.weight.grad = None
        z = head.logits(head.features(X))
        loss = margin_cross_entropy(z, y, margins, reduction="none")
        class_loss = risk.class_loss(torch.zeros(k, dtype=X.dtype).index_add_(0, y, loss * w))
        reference = tilted_class_risk(class_loss, risk.share, tilt)[0]
        reference.backward()
        torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, head.weight.grad, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("data", ["digits", "blobs"])
@pytest.mark.parametrize("scale", [16.0, 64.0])
def test_same_predictions_as_before_and_no_higher_loss(digits_unit, data, scale):
    X, y = digits_unit if data == "digits" else _normalised_blobs()
    ours = _fit(X, y, scale=scale, tol=1e-5)
    before, _ = cosine_lbfgs_before(X, y, scale, ours.margins_, tol=1e-5, max_iter=3000)
    agree = np.mean(ours.predict(X) == np.argmax(X @ before.T, axis=1))
    assert agree >= 0.995
    ours_loss = _objective(X, y, ours.coef_, scale, ours.margins_)
    before_loss = _objective(X, y, before, scale, ours.margins_)
    assert ours_loss <= before_loss * (1 + 1e-6)
    assert np.isfinite(ours.coef_).all()


def test_tol_is_met_in_the_unit_directions(digits_unit):
    """The test holds for W / ‖W‖, however far the rows' norms drifted."""
    X, y = digits_unit
    clf = _fit(X, y, scale=64.0, tol=1e-4)
    assert clf.n_iter_ < 3000
    head = _head(X.shape[1], 10, fit_intercept=True, scale=64.0)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(clf.coef_ / 64.0))  # unit rows
    head.weight.grad = torch.zeros_like(head.weight)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    margins = torch.as_tensor(clf.margins_)
    plain_data_term(
        head, TensorSource(Xt, yt, torch.ones(len(y), dtype=Xt.dtype), 512), margins, len(y)
    )
    assert float(head.weight.grad.abs().max()) <= 1e-4


def test_warm_start_across_scales_reaches_the_cold_solution():
    X, y = _normalised_blobs()
    cold = _fit(X, y, scale=32.0, tol=1e-7)
    warm = _fit(X, y, scale=4.0, tol=1e-7, warm_start=True)
    warm.set_params(scale=32.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm.fit(X, y)
    np.testing.assert_allclose(warm.coef_ / 32.0, cold.coef_ / 32.0, atol=1e-4)
    np.testing.assert_array_equal(warm.predict(X), cold.predict(X))


def test_opposite_rows_of_two_classes_are_opened_and_others_kept():
    rng = np.random.default_rng(0)
    u = torch.as_tensor(rng.normal(size=(3, 8)))
    rows = torch.stack([-u, u], 1)  # (3, 2, 8): three heads, each at the widest margin
    rows[2, 0] = torch.as_tensor(rng.normal(size=8))  # a third pair far from opposite
    opened, which = open_pair(rows)
    assert which.tolist() == [True, True, False]
    torch.testing.assert_close(opened[2], rows[2], rtol=0, atol=0)
    unit = opened[:2] / opened[:2].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(unit, opened[:2])
    cos = (unit[:, 0] * unit[:, 1]).sum(-1)  # cos(π − 2·opening)
    torch.testing.assert_close(cos, torch.full((2,), -np.cos(2 * PAIR_OPENING)).double())
    difference = unit[:, 1] - unit[:, 0]  # on the same axis as before
    torch.testing.assert_close(torch.nn.functional.normalize(difference, dim=-1),
                               torch.nn.functional.normalize(u[:2], dim=-1))  # fmt: skip
    # From a difference alone: rows whose difference is the given one.
    rows, _ = open_pair(torch.stack([-u, u], 1), cos=torch.full((3,), 0.3).double())
    torch.testing.assert_close(rows[:, 1] - rows[:, 0], 0.6 * u / u.norm(dim=-1, keepdim=True))


def _two_classes_of_iris(centre=False):
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return (X - X.mean(0) if centre else X), (y == 1).astype(int)


def test_the_search_of_two_classes_refits_the_plain_fit():
    # Its refit started from opposite rows, a stationary point it never left: a loss of
    # 0.663 against 0.492, 12 of 150 predictions apart, without a warning.
    X, y = _two_classes_of_iris()
    search = MR2LinearClassifierCV(Cs=[64.0], cv=3, head="cosine", device="cpu").fit(X, y)
    plain = MR2LinearClassifier(head="cosine", scale=64.0, device="cpu").fit(X, y)
    assert search.loss_curve_[-1] == pytest.approx(plain.loss_curve_[-1], rel=1e-4)
    np.testing.assert_array_equal(search.predict(X), plain.predict(X))


@pytest.mark.parametrize("search", [False, True])
def test_a_cosine_head_of_one_feature_is_refused(search):
    # Its rows could only be ±1: the fit stood still at coef_ = 0 and predicted one class.
    X, y = _two_classes_of_iris()
    X = X[:, :1] - 5.8
    model = (
        MR2LinearClassifierCV(Cs=[16.0], cv=3, head="cosine", device="cpu")
        if search
        else MR2LinearClassifier(head="cosine", device="cpu")
    )
    with pytest.raises(ValueError, match="needs at least 2 features, got 1 feature"):
        model.fit(X, y)


def test_a_search_of_n_scales_spans_1_to_1000():
    # n values meant 1e-4 to 1e4 for the scale too: at 1e-4 every fit stopped at its
    # start, the gradient below tol (iris: the default 10 values chose 1e-4).
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=4, cv=3, head="cosine", device="cpu").fit(X, y)
    np.testing.assert_allclose(search.Cs_, [1.0, 10.0, 100.0, 1000.0])
    linear = MR2LinearClassifierCV(Cs=3, cv=3, device="cpu").fit(X, y)
    np.testing.assert_allclose(linear.Cs_, [1e-4, 1.0, 1e4])


@pytest.mark.parametrize("scale", [1e-4, 16.0])
def test_the_search_of_many_classes_refits_the_plain_fit(scale):
    # The refit started from the folds' coef_, rows of norm s: at s = 10⁻⁴ its gradient was
    # 10⁴ times the unit rows' and it left the start that the folds and a plain fit keep
    # (iris: 0.667 of the training set right, against 0.973, without a warning).
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV(Cs=[scale], cv=3, head="cosine", device="cpu").fit(X, y)
    plain = MR2LinearClassifier(head="cosine", scale=scale, device="cpu").fit(X, y)
    assert search.loss_curve_[-1] == pytest.approx(plain.loss_curve_[-1], rel=1e-4)
    assert (search.predict(X) == plain.predict(X)).mean() >= 0.99


def test_a_warm_start_of_two_classes_leaves_the_widest_margin():
    # In float32 the warm start at 10 stayed at the opposite rows of 0.1 (‖coef‖ 20, 6.45).
    X, y = _two_classes_of_iris(centre=True)
    X = X.astype(np.float32)
    common = dict(head="cosine", device="cpu", tol=1e-6)
    with warnings.catch_warnings():  # float32 stops short of tol 1e-6, both fits alike
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm = MR2LinearClassifier(scale=0.1, warm_start=True, **common).fit(X, y)
        assert np.linalg.norm(warm.coef_) == pytest.approx(0.2, rel=1e-3)  # opposite rows
        warm.set_params(scale=10.0).fit(X, y)
        cold = MR2LinearClassifier(scale=10.0, **common).fit(X, y)
    np.testing.assert_allclose(warm.coef_, cold.coef_, atol=1e-2 * 10)


@pytest.mark.parametrize("batch", [True, False])
def test_a_path_of_two_classes_leaves_the_widest_margin(batch, monkeypatch):
    # At scales 0.1 and 1 the best rows are opposite; scale 10 started there and stayed
    # (objective 0.631 against the cold fit's 0.541).
    from sklearn.model_selection import KFold

    monkeypatch.setattr(MR2LinearClassifierCV, "_batches_folds", lambda self, d, s: batch)
    X, y = _two_classes_of_iris(centre=True)
    folds = list(KFold(3, shuffle=True, random_state=0).split(X, y))
    common = dict(head="cosine", device="cpu", tol=1e-6)
    search = MR2LinearClassifierCV(Cs=[0.1, 1.0, 10.0], cv=folds, **common).fit(X, y)
    train = folds[0][0]
    cold = MR2LinearClassifier(scale=10.0, **common).fit(X[train], y[train])
    np.testing.assert_allclose(search.coefs_paths_[1][0, 2], cold.coef_[0], atol=1e-3 * 10)


@pytest.mark.parametrize("scale", [256.0, 4096.0])
def test_large_scales_leave_finite_weights(digits_unit, scale):
    X, y = digits_unit
    clf = _fit(X.astype(np.float32), y, scale=scale, max_iter=200)
    assert np.isfinite(clf.coef_).all()
    np.testing.assert_allclose(np.linalg.norm(clf.coef_, axis=1), scale, rtol=1e-5)
    assert clf.score(X.astype(np.float32), y) > 0.9


def test_features_whose_squares_overflow_float32_are_normalised(digits_unit):
    # The cosine head does not depend on the features' scale. Rows of norm above ~1.8e19
    # have squares beyond float32's range: their norms were infinite, and φ zero.
    X, y = digits_unit
    X = X.astype(np.float32)
    big = X * np.float32(1e20)
    clf = _fit(X, y)
    for data in (big, torch.as_tensor(big)):
        np.testing.assert_array_equal(np.asarray(clf.predict(data)), clf.predict(X))
    scaled = _fit(big, y)
    assert np.isfinite(scaled.coef_).all()
    assert np.mean(scaled.predict(big) == clf.predict(X)) > 0.995


def test_sample_weights_beyond_float32_fit_a_cosine_head_and_are_named_for_a_linear_one():
    # In float32 weights summing to 6e38 overflowed the loss's and gradient's sums (times
    # the scale) before the division by their sum: the fit stayed at its start, and the
    # warning blamed the start or the features' values; then the sum was refused before
    # the fit. The cosine head, whose objective ignores the weights' scale, now takes them
    # relative to the largest: a fit like any. A linear head's are still refused.
    X, y = _normalised_blobs()
    X = X.astype(np.float32)
    clf = MR2LinearClassifier(head="cosine", tol=1e-3, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf.fit(X, y, sample_weight=np.full(len(y), 1e36))
        clf.fit(X, y, sample_weight=np.full(len(y), 1e34))  # Σw = 6e36
    with pytest.raises(ValueError, match=r"with sample weights summing to 6e\+38, beyond the"):
        clf.set_params(head="linear").fit(X, y, sample_weight=np.full(len(y), 1e36))
    # Short of tol for want of iterations, at weights that resolve: not blamed on them
    # (a linear head's resolve up to float32's largest).
    for head, weight in (("cosine", 1e34), ("linear", 1e35)):
        clf.set_params(max_iter=3, head=head)
        with pytest.warns(ConvergenceWarning, match=r"max_iter=3 iterations\. Increase max_iter"):
            clf.fit(X, y, sample_weight=np.full(len(y), weight))


def _cosine_batch(X, y, weight, margins):
    """A FoldBatch of a cosine head: one fold per row of ``weight``."""
    inv_gamma = torch.as_tensor(1 / np.asarray(margins), dtype=X.dtype).expand(len(weight), -1)
    return FoldBatch(X, y, weight, inv_gamma.contiguous(), None, len(margins), cosine=True)


def test_batched_cosine_gradient_matches_autograd():
    """The batched solver's cosine head: the data term of s·(x/‖x‖)·(W/‖W‖)ᵀ, its gradient
    in W, and the stopping measure in the unit directions, fold by fold."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(60, 7, generator=gen, dtype=torch.float64) * 3 + 1
    y = torch.arange(60) % 4
    weight = torch.rand(2, 60, generator=gen, dtype=torch.float64)
    weight[1, ::3] = 0  # a fold's held-out rows
    margins = [1.0, 0.5, 2.0, 1.5]
    batch = _cosine_batch(X, y, weight, margins)
    params = torch.randn(2, 4 * 7, generator=gen, dtype=torch.float64) * 2
    value, grad = batch.evaluate(params, torch.arange(2), 8.0)
    for f in range(2):
        W = params[f].view(4, 7).clone().requires_grad_()
        z = (
            8.0
            * torch.nn.functional.normalize(X, dim=1)
            @ torch.nn.functional.normalize(W, dim=1).T
        )
        loss = margin_cross_entropy(z, y, torch.as_tensor(margins), weight[f], reduction="sum")
        loss = loss / weight[f].sum()
        loss.backward()
        torch.testing.assert_close(value[f], loss.detach())
        torch.testing.assert_close(grad[f], W.grad.reshape(-1))
        unit = W.detach().norm(dim=1, keepdim=True) * W.grad  # the gradient at unit rows
        torch.testing.assert_close(
            batch.largest_gradient(params, grad)[f], unit.abs().max(), rtol=1e-12, atol=0
        )


def test_rescaled_memory_holds_the_pairs_of_the_unit_rows():
    """W = ρ·W' is an exact change of coordinates of the cosine objective: a pair formed at
    rows of any norms, rescaled, is the pair between the same rows at unit norm."""
    gen = torch.Generator().manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(40, 5, generator=gen, dtype=torch.float64))
    y = torch.arange(40) % 3
    batch = _cosine_batch(X, y, torch.ones(1, 40, dtype=X.dtype), [1.0, 1.0, 1.0])

    def grad(W):
        return batch.evaluate(W.reshape(1, -1), torch.arange(1), 8.0)[1].view(3, 5)

    norms = torch.tensor([[3.0], [0.5], [1.7]], dtype=X.dtype)
    U1, U2 = (torch.nn.functional.normalize(torch.randn(3, 5, generator=gen, dtype=X.dtype))
              for _ in range(2))  # fmt: skip
    W1 = U1 * norms * torch.tensor([[1.1], [0.9], [1.0]], dtype=X.dtype)
    W2 = U2 * norms
    memory = Memory.empty(W2.reshape(1, -1), 4)
    memory.s[0, 0], memory.y[0, 0] = (W2 - W1).reshape(-1), (grad(W2) - grad(W1)).reshape(-1)
    memory.rho[0, 0] = 1 / (memory.s[0, 0] @ memory.y[0, 0])
    memory.stamp[0, 0] = 0
    memory.slot = memory.used = 1
    memory.point, memory.grad, memory.value = W2.reshape(1, -1).clone(), grad(W2).reshape(1, -1), 0
    rho = memory.rho.clone()
    memory.rescale(norms[None])
    torch.testing.assert_close(memory.s[0, 0], (W2 / norms - W1 / norms).reshape(-1))
    torch.testing.assert_close(memory.y[0, 0], (grad(W2 / norms) - grad(W1 / norms)).reshape(-1))
    torch.testing.assert_close(memory.rho, rho)  # sᵀy is the same
    s, y_ = memory.s[0, 0], memory.y[0, 0]
    torch.testing.assert_close(memory.h0[0], (s @ y_) / (y_ @ y_))
    torch.testing.assert_close(memory.point[0], (W2 / norms).reshape(-1))
    torch.testing.assert_close(memory.grad[0], grad(W2 / norms).reshape(-1))


def _scale_path(X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        params = dict(cv=3, head="cosine", tol=1e-5, max_iter=3000, refit=False) | params
        clf = MR2LinearClassifierCV([4.0, 8.0, 16.0, 32.0, 64.0], device="cpu", **params).fit(X, y)
    coefs = np.stack([clf.coefs_paths_[c] for c in clf.classes_], axis=2)  # (folds, Cs, K, d)
    return clf, coefs.reshape(-1, *coefs.shape[2:])


@pytest.mark.slow
def test_scale_path_starts_each_scale_from_the_last_pairs(digits_unit, monkeypatch):
    """Each scale of a fold's path starts L-BFGS from the previous scale's pairs: fewer
    iterations than starting from none, the same solutions."""
    X, y = digits_unit
    carried, coefs = _scale_path(X, y)
    monkeypatch.setattr(batched, "_CARRY_SCALE_RATIO", 1.0)  # no scale near another
    fresh, fresh_coefs = _scale_path(X, y)
    assert carried.n_iter_[0, :, 0].sum() == fresh.n_iter_[0, :, 0].sum()  # cold starts
    assert carried.n_iter_.sum() < 0.85 * fresh.n_iter_.sum()
    assert np.isfinite(coefs).all()
    for ours, theirs in zip(coefs, fresh_coefs, strict=True):
        assert np.mean(np.argmax(X @ ours.T, 1) == np.argmax(X @ theirs.T, 1)) >= 0.995
    np.testing.assert_allclose(carried.scores_[0], fresh.scores_[0], atol=0.01)


@pytest.mark.slow
def test_scale_path_ends_where_cold_fits_of_its_scales_do(digits_unit):
    """Each point of the path meets tol in the unit directions, at the objective of a
    cold fit at that scale, and predicts as it does."""
    X, y = digits_unit
    clf, coefs = _scale_path(X, y, cv=[(np.arange(len(y)), np.arange(len(y)))])
    for scale, coef in zip(clf.Cs_, coefs, strict=True):
        cold = _fit(X, y, scale=scale, tol=1e-5)
        ones = np.ones(10)
        assert (
            _objective(X, y, coef, scale, ones) <= _objective(X, y, cold.coef_, scale, ones) + 1e-5
        )
        assert np.mean(np.argmax(X @ coef.T, 1) == cold.predict(X)) >= 0.995
        np.testing.assert_allclose(np.linalg.norm(coef, axis=1), scale, rtol=1e-5)


@pytest.mark.slow
def test_bisection_back_down_the_scales_is_not_misled_by_far_pairs(digits_unit, monkeypatch):
    """A bisection comes back from a large scale to a far smaller one: pairs formed there
    are not carried (they made L-BFGS stop at max_iter and the search choose elsewhere)."""
    X, y = digits_unit

    def search():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            clf = MR2LinearClassifierCV("bisect", cv=3, head="cosine", device="cpu").fit(X, y)
        return clf, [w for w in caught if issubclass(w.category, ConvergenceWarning)]

    carried, warned = search()
    monkeypatch.setattr(batched, "_CARRY_SCALE_RATIO", 1.0)
    fresh, _ = search()
    assert not warned
    best = [clf.scores_[0].mean(0).max() for clf in (carried, fresh)]
    assert best[0] == pytest.approx(best[1], abs=0.005)


def test_fits_on_carried_pairs_count_only_their_own_iterations(digits_unit):
    """A path cut short by max_iter reports max_iter at every scale."""
    X, y = digits_unit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifierCV(
            [4.0, 8.0, 16.0], cv=2, head="cosine", tol=1e-10, max_iter=7, refit=False,
            device="cpu",
        ).fit(X, y)  # fmt: skip
    np.testing.assert_array_equal(clf.n_iter_, 7)


@pytest.mark.parametrize(
    ("params", "batched_runs"),
    [(dict(), 1), (dict(class_tilt=0.5), 1), (dict(lam=0.5, max_iter=3), 0)],
)
def test_a_plain_cosine_search_runs_on_the_batched_solver(digits_unit, monkeypatch, params,
                                                          batched_runs):  # fmt: skip
    """The linear head's path solver serves the plain cosine head, tilted or not; a
    projection takes the folds' own paths, and a single fit neither."""
    X, y = digits_unit
    runs = {"batched": 0, "fold": 0}
    batched_run, fold_run = batched.BatchedPath.run, FoldPath.run

    def count(kind, run):
        def counted(self, *args, **kwargs):
            runs[kind] += 1
            return run(self, *args, **kwargs)

        return counted

    monkeypatch.setattr(batched.BatchedPath, "run", count("batched", batched_run))
    monkeypatch.setattr(FoldPath, "run", count("fold", fold_run))
    _fit(X, y, scale=16.0)
    assert runs == {"batched": 0, "fold": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        MR2LinearClassifierCV([4.0, 8.0], cv=2, head="cosine", device="cpu", **params).fit(X, y)
    assert runs == {"batched": batched_runs, "fold": 0 if batched_runs else 2}


@pytest.mark.parametrize("batch_folds", [None, pytest.param(False, marks=pytest.mark.slow)])
def test_a_two_class_cosine_path_keeps_both_rows_between_scales(batch_folds, monkeypatch):
    """Two classes are stored as one row (coef_1 − coef_0); a bisection's midpoint starts
    from its neighbour's two rows, and the folds solved together or one by one agree."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    starts, original = [], batched.lbfgs_batched

    def spy(batch, params, *args, **kwargs):
        starts.append(params.clone())
        return original(batch, params, *args, **kwargs)

    monkeypatch.setattr(batched, "lbfgs_batched", spy)
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    rows, nearest = [], batched.BatchedPath._start_nearest

    def start_nearest(self, value):
        before = self.params.clone()
        nearest(self, value)
        moved = not torch.equal(self.params, before)
        rows.append(moved and any(torch.equal(self.params, k) for k in self._rows.values()))

    monkeypatch.setattr(batched.BatchedPath, "_start_nearest", start_nearest)
    params = dict(cv=3, head="cosine", max_iter=1000, device="cpu")
    search = MR2LinearClassifierCV("bisect", **params).fit(X, y)
    assert search.coefs_paths_[1].shape == (3, len(search.Cs_), X.shape[1])
    assert all(start.shape[1] == 2 * X.shape[1] for start in starts)
    assert all(torch.isfinite(start).all() for start in starts)
    assert any(rows)  # some midpoint started from a neighbour's two rows
    assert search.score(X, y) > 0.95
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", not batch_folds)
    other = MR2LinearClassifierCV("bisect", **params).fit(X, y)
    np.testing.assert_array_equal(other.Cs_, search.Cs_)
    np.testing.assert_allclose(other.scores_[1], search.scores_[1], atol=0.01)


@pytest.mark.cuda
@pytest.mark.parametrize("tilt", [0.0, 1.0])
def test_a_cuda_cosine_fit_on_the_spheres_is_the_cpu_one(spheres, digits_unit, tilt):
    # (Forced: the estimator takes the spheres on a CPU only, until measured on a GPU.)
    X, y = digits_unit
    X = X.astype(np.float32)
    cpu = _fit(X, y, scale=64.0, class_tilt=tilt)
    gpu = _fit(X, y, scale=64.0, class_tilt=tilt, device="cuda")
    assert np.mean(gpu.predict(X) == cpu.predict(X)) > 0.99
    assert gpu.loss_curve_[-1] == pytest.approx(cpu.loss_curve_[-1], rel=1e-4)
    assert np.isfinite(gpu.coef_).all()


@pytest.mark.cuda
def test_cuda_cosine_search_chooses_as_the_cpu_one(digits_unit):
    X, y = digits_unit
    X = X.astype(np.float32)
    params = dict(Cs=[4.0, 16.0, 64.0, 256.0], cv=3, head="cosine", max_iter=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cpu = MR2LinearClassifierCV(device="cpu", **params).fit(X, y)
        gpu = MR2LinearClassifierCV(device="cuda", **params).fit(X, y)
    np.testing.assert_allclose(gpu.scores_[0], cpu.scores_[0], atol=0.01)
    # The same scale, or (16 and 64 score 2 samples apart on the CPU) one that the CPU
    # scores within the scores' tolerance of its best.
    cpu_mean = cpu.scores_[0].mean(0)
    chosen = cpu_mean[list(cpu.Cs_).index(gpu.C_)]
    assert gpu.C_ == cpu.C_ or chosen >= cpu_mean.max() - 0.01
    assert np.mean(gpu.predict(X) == cpu.predict(X)) > 0.99


@pytest.mark.parametrize("batch_folds", [None, False])
def test_a_path_fold_that_stalls_in_float32_restarts_as_a_fit_does(batch_folds, monkeypatch):
    """At scale 1000 in float32 L-BFGS stalled on rounding after 7 iterations (a warning, an
    objective 3× a cold fit's); restarted from unit rows without pairs, as a single fit's
    rounds restart, it reaches tol."""
    from sklearn.model_selection import StratifiedKFold

    X, y = load_digits(return_X_y=True)
    keep = np.isin(y, range(6))
    X, y = X[keep] / 16, y[keep]
    rows = np.random.default_rng(0).choice(len(X), 450, replace=False)
    X, y = X[rows].astype(np.float32), y[rows]
    cv = list(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y))
    monkeypatch.setattr(MR2LinearClassifierCV, "_batch_folds", batch_folds)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        search = MR2LinearClassifierCV([1000.0], cv=cv, head="cosine", refit=False, device="cpu")
        search.fit(X, y)
    for f, (train, _) in enumerate(cv):
        cold = _fit(X[train], y[train], scale=1000.0)
        coef = np.stack([search.coefs_paths_[c][f, 0] for c in search.classes_])
        Xn = X[train].astype(np.float64)
        Xn /= np.linalg.norm(Xn, axis=1, keepdims=True)
        ones = np.ones(6)
        ours, theirs = (_objective(Xn, y[train], c, 1000.0, ones) for c in (coef, cold.coef_))
        assert ours <= 1.5 * theirs


def _fold_zero_stopped_early():
    """Two folds of six classes at scale 8, memories of 3 pairs: fold 0 stopped after 2
    iterations, fold 1 after 10 (round the ring). The batch, the points, the memory and
    the solve's result."""
    X, y = _normalised_blobs()
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    batch = _cosine_batch(X, y, torch.ones(2, len(y), dtype=X.dtype), [1.0] * 6)
    means = torch.zeros(6, X.shape[1], dtype=X.dtype).index_add_(0, y, X)
    params = torch.nn.functional.normalize(means, dim=1).flatten().repeat(2, 1)
    memory = Memory.empty(params, 3)
    result = batched.lbfgs_batched(
        batch, params, 8.0, max_iter=np.array([2, 10]), tol=1e-12, memory=memory
    )
    return batch, params, memory, result


def test_a_fold_that_stopped_early_keeps_its_pairs_in_the_order_formed():
    """Fold 0 stops after 2 iterations while fold 1 goes round the ring of 3 slots: fold 0's
    pairs stay where they were, out of the ring's order. Its initial scale is taken from
    its own newest pair, and before the next solve its pairs are put back in order."""
    batch, params, memory, result = _fold_zero_stopped_early()
    assert result.n_iter.tolist() == [2, 10] and (memory.rho[0] != 0).sum() == 2

    def fold_zero_newest_first():
        ring = [(memory.slot - 1 - i) % 3 for i in range(memory.used)]
        return [int(memory.stamp[0, i]) for i in ring if memory.rho[0, i] != 0]

    assert fold_zero_newest_first() != [1, 0]  # the ring's order is not fold 0's
    newest = int(memory.stamp[0].argmax())
    memory.rescale(batch.direction_norms(params))
    s, y_ = memory.s[0, newest], memory.y[0, newest]
    torch.testing.assert_close(memory.h0[0], (s @ y_) / (y_ @ y_))
    pairs = memory.s.data_ptr(), memory.y.data_ptr()
    memory.compact()
    assert fold_zero_newest_first() == [1, 0]
    assert (memory.s.data_ptr(), memory.y.data_ptr()) == pairs  # in place, no second copy
    assert memory.stamp[1].tolist() == [9, 7, 8] and memory.slot == 1  # fold 1 unmoved


def test_batched_lbfgs_takes_each_folds_evaluation_budget():
    X, y = _normalised_blobs()
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    batch = _cosine_batch(X, y, torch.ones(2, len(y), dtype=X.dtype), [1.0] * 6)
    means = torch.zeros(6, X.shape[1], dtype=X.dtype).index_add_(0, y, X)
    params = torch.nn.functional.normalize(means, dim=1).flatten().repeat(2, 1)
    result = batched.lbfgs_batched(
        batch, params, 8.0, max_iter=100, tol=1e-12, max_eval=np.array([3, 400])
    )
    assert result.stop[0] == "max_eval" and 3 <= result.n_eval[0] < 10
    assert result.stop[1] != "max_eval" and result.n_eval[1] > 10


def test_a_cosine_head_with_a_projection_normalises_the_projected_features():
    # z = X·coef_ᵀ / ‖P·x‖ row by row (coef_ holds s·Ŵ·P), on NumPy and torch input alike.
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(head="cosine", lam=0.5, solver="adam", learning_rate=1e-2,
                              max_iter=5, random_state=0, device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    expected = X @ clf.coef_.T / np.linalg.norm(X @ clf.projection_.T, axis=1, keepdims=True)
    assert not np.allclose(expected, X @ clf.coef_.T / np.linalg.norm(X, axis=1, keepdims=True))
    np.testing.assert_allclose(clf.decision_function(X), expected, rtol=1e-5)
    from_torch = clf.decision_function(torch.as_tensor(X))
    np.testing.assert_allclose(np.asarray(from_torch), expected, rtol=1e-5)


@pytest.mark.parametrize("kind", ["tensor", "hdf5"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 100])
def test_every_row_is_in_one_chunk_and_one_minibatch_per_pass(tmp_path, kind, n):
    # The blocks of a full pass and the minibatches of an epoch each hold every row once.
    import h5py

    X = torch.arange(n, dtype=torch.float64)[:, None].repeat(1, 3)
    y, w = torch.arange(n) % 2, torch.ones(n, dtype=torch.float64)
    if kind == "tensor":
        source = TensorSource(X, y, w, rows=32)
    else:
        with h5py.File(tmp_path / "x.h5", "w") as f:
            f.create_dataset("X", data=X.numpy(), chunks=(min(n, 8), 3))
        f = h5py.File(tmp_path / "x.h5", "r")
        source = H5Source(f["X"], y, w, 32, torch.device("cpu"), torch.float64)
    seen = torch.cat([x[:, 0] for x, _, _ in source.chunks()])
    assert seen.tolist() == list(range(n))
    for batch_size in (1, 7, 64):
        generator = torch.Generator().manual_seed(0)
        rows = torch.cat([x[:, 0] for x, _, _ in source.batches(batch_size, generator)])
        assert sorted(rows.tolist()) == list(range(n))


def test_memory_moved_to_another_penalty_keeps_its_pairs_corrected():
    # Memory.move_to: y gains (reg' − reg)·s on the penalised entries only, and a pair that
    # keeps its curvature stays live with ρ = 1/sᵀy' (the path's memory carried to a next C).
    memory = Memory.empty(torch.zeros(1, 3, dtype=torch.float64), 3)
    memory.s[0, 0] = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    memory.y[0, 0] = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
    memory.rho[0, 0], memory.stamp[0, 0], memory.slot, memory.used = 1 / 3.0, 0, 1, 1
    memory.move_to(torch.tensor([0.1], dtype=torch.float64), n_penalised=2)  # recorded at
    memory.move_to(torch.tensor([0.3], dtype=torch.float64), n_penalised=2)
    torch.testing.assert_close(memory.y[0, 0], torch.tensor([2.2, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(memory.rho[0, 0], torch.tensor(1 / 3.2, dtype=torch.float64))
    torch.testing.assert_close(memory.h0[0], torch.tensor(3.2 / (2.2**2 + 1), dtype=torch.float64))


def test_compacted_memory_reads_every_live_pair_including_the_first_formed():
    # ``used`` is the most live pairs a fold holds (stamp ≥ 0: the first pair formed has
    # stamp 0), and the two-loop recursion reads that many slots before ``slot``.
    memory = Memory.empty(torch.zeros(2, 3, dtype=torch.float64), 4)
    memory.rho[:] = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    memory.stamp[:] = torch.tensor([[0, 1, -1, -1], [-1, 2, -1, -1]])
    memory.s[:, :, 0] = memory.stamp.double()
    memory.slot = 0
    memory.compact()
    assert memory.used == 2
    newest_first = [(memory.slot - 1 - i) % 4 for i in range(memory.used)]
    assert memory.stamp[:, newest_first].tolist() == [[1, 0], [2, -1]]
    assert memory.s[:, newest_first, 0].tolist() == [[1.0, 0.0], [2.0, -1.0]]


def test_a_restarted_fold_counts_and_reports_both_rounds(monkeypatch):
    """A fold that stalls after some iterations restarts without pairs, within what is
    left of ``max_iter`` and of the 4·max_iter evaluations, counted over both rounds. Its
    ``n_iter_`` is the sum of both rounds; its report (a ConvergenceWarning, or none) is
    the second round's stop and largest gradient."""
    from mr2_probe._batched import BatchResult

    X, y = _normalised_blobs()
    rounds, limits, budgets, reported = [], [], [], []
    original = batched.lbfgs_batched

    def stall_once(batch, params, value, *, max_iter, **kwargs):
        limits.append(np.broadcast_to(max_iter, (batch.n_folds,)).copy())
        budgets.append(kwargs.get("max_eval"))
        result = original(batch, params, value, max_iter=max_iter if rounds else 3, **kwargs)
        if not rounds:  # fold 0 "stalls" after three iterations, with a made-up gradient
            largest = result.largest_gradient.copy()
            largest[0] = 123.0
            stop = ["stalled"] + result.stop[1:]
            result = BatchResult(result.n_iter, stop, largest, result.n_eval)
        rounds.append(result)
        return result

    original_report = MR2LinearClassifierCV._report

    def spy_report(self, solver, dtype, value, weight_sum, n_iter, stop, largest):
        reported.append((stop, largest))
        return original_report(self, solver, dtype, value, weight_sum, n_iter, stop, largest)

    monkeypatch.setattr(batched, "lbfgs_batched", stall_once)
    monkeypatch.setattr(MR2LinearClassifierCV, "_report", spy_report)
    search = MR2LinearClassifierCV(
        [16.0], cv=2, head="cosine", refit=False, max_iter=200, device="cpu"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # fold 1, stopped at 3
        search.fit(X, y)
    first, second = rounds
    assert first.n_iter.tolist() == [3, 3] and second.n_iter[0] > 0 and second.n_iter[1] == 0
    assert limits[1].tolist() == [200 - 3, 0]  # fold 1 did not stall: no second round
    assert budgets[0] is None and budgets[1].tolist() == [4 * 200 - first.n_eval[0], 0]
    assert search.n_iter_[0, :, 0].tolist() == [3 + second.n_iter[0], 3]
    assert reported[0] == (second.stop[0], second.largest_gradient[0])
    assert reported[1] == (first.stop[1], first.largest_gradient[1])


def test_a_warm_start_from_rows_far_from_unit_norm_goes_on_to_the_solution():
    # Minibatch fits leave the rows at their norms (about 50 here). L-BFGS's first round
    # then met its test on the gradient in W at once, and the fit stopped after 0
    # iterations with a warning of no progress, 0.0036 from tol.
    X, y = load_digits(return_X_y=True)
    X, y = X[:400] / 16, y[:400]
    kwargs = dict(head="cosine", scale=8.0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(**kwargs, solver="sgd", learning_rate=30.0, max_iter=200,
                                  warm_start=True, random_state=0).fit(X, y)  # fmt: skip
    assert np.linalg.norm(clf._head_state["weight"], axis=1).min() > 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf.set_params(solver="lbfgs").fit(X, y)
    cold = MR2LinearClassifier(**kwargs).fit(X, y)
    assert clf.n_iter_ > 0
    assert clf.loss_curve_[-1] == pytest.approx(cold.loss_curve_[-1], abs=1e-6)


def test_a_short_cosine_fit_does_not_blame_c_or_the_weights_it_has_no_penalty_for():
    # The warning named "C=1e-09 and sample weights summing to 300 (the penalty is
    # ½‖W‖² / (C·Σw))" as the cause, for a head whose objective has no such penalty.
    X, y = load_digits(return_X_y=True)
    X, y = X[:300] / 16, y[:300]
    fits = [
        lambda: MR2LinearClassifier(head="cosine", C=1e-9, max_iter=3, device="cpu").fit(X, y),
        lambda: MR2LinearClassifier(head="cosine", max_iter=3, device="cpu").fit(
            X, y, sample_weight=np.full(len(y), 1e-9)
        ),
        lambda: MR2LinearClassifierCV(head="cosine", Cs=[8.0, 64.0], cv=2, max_iter=2,
                                      device="cpu").fit(X, y, sample_weight=np.full(300, 1e-9)),
    ]  # fmt: skip
    for fit in fits:
        with pytest.warns(ConvergenceWarning) as caught:
            fit()
        for w in caught:
            assert "C=" not in str(w.message) and "penalty" not in str(w.message), w.message


@pytest.mark.parametrize("rank", [None, 4])
def test_a_projection_fits_and_predicts_rows_near_float32s_largest_value(rank):
    # With lam > 0 (a projection P), decision values divided x·Wᵀ by ‖x·Pᵀ‖: x·Wᵀ overflowed
    # for rows of norm near float32's largest value (infinite decision values), where the
    # fit had worked on those rows.
    X, y = load_digits(return_X_y=True)
    X, y = (X[:300] / 16).astype(np.float32), y[:300]
    kwargs = dict(head="cosine", scale=16.0, lam=0.5, projection_rank=rank, max_iter=3,
                  batch_size=100, device="cpu", random_state=0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(**kwargs).fit(X, y)
        scaled = MR2LinearClassifier(**kwargs).fit(X * np.float32(1e37), y)
    assert clf.projection_ is not None
    huge = X * np.float32(1e37)
    for data in (huge, torch.as_tensor(huge)):
        got = np.asarray(clf.decision_function(data))
        np.testing.assert_allclose(got, clf.decision_function(X), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scaled.coef_, clf.coef_, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(scaled.predict(huge), clf.predict(X))


def test_predictions_of_rows_near_float32s_largest_value_are_those_of_the_unit_rows():
    # X·Wᵀ overflowed before the division by ‖x‖: NaN probabilities and chance-level
    # predictions from a model whose minibatch fit had worked on the same rows.
    X, y = load_digits(return_X_y=True)
    X, y = (X[:300] / 16).astype(np.float32), y[:300]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(head="cosine", scale=16.0, solver="adam", max_iter=5,
                                  device="cpu", random_state=0).fit(X, y)  # fmt: skip
    huge = X * np.float32(1e37)  # row norms up to 4.7e37, below float32's largest 3.4e38
    assert np.isfinite(huge).all()
    np.testing.assert_allclose(
        clf.decision_function(huge), clf.decision_function(X), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(clf.predict(huge), clf.predict(X))
    as_tensor = clf.decision_function(torch.as_tensor(huge))
    np.testing.assert_allclose(as_tensor.numpy(), clf.decision_function(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [None, 4 * 7 + 3])
@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_the_line_gives_the_objective_and_its_derivatives_along_the_retraction(
    monkeypatch, tilt, block
):
    """The objective at the rows U + t·D normalised, and its first two derivatives in t,
    from the kept products r·U·Xᵀ and r·D·Xᵀ alone, against autograd on the model; and the
    softmax kept for the gradient. Also taken in blocks of 7 of the 50 rows, the last one
    short (the fits' problems take one block)."""
    from mr2_probe import _sphere

    if block:
        monkeypatch.setattr(_sphere, "_LINE_BLOCK", block)
    gen = torch.Generator().manual_seed(0)
    n, d, k, scale = 50, 6, 4, 7.0
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y, w = torch.arange(n) % k, torch.rand(n, generator=gen, dtype=torch.float64)
    U = F.normalize(torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
    D = tangent_rows(U, torch.randn(k, d, generator=gen, dtype=torch.float64))
    margins = 1 + torch.rand(k, generator=gen, dtype=torch.float64)
    risk = ClassRisk(torch.zeros(k, dtype=X.dtype).index_add_(0, y, w), tilt)
    r = 1 / X.norm(dim=1)
    onehot = torch.zeros(n, k, dtype=X.dtype).scatter_(1, y[:, None], w[:, None])
    line = _Line(  # the products class-major (K × n), as the fit keeps them
        (U @ X.T) * r, (D @ X.T) * r, (D * D).sum(1), scale / margins[y], y, onehot, risk,
    )  # fmt: skip
    assert line.block == (7 if block else _sphere._LINE_BLOCK // k)
    for step in (0.0, 0.3, 2.0):
        t = torch.tensor(step, dtype=X.dtype, requires_grad=True)
        z = scale * F.normalize(X, dim=1) @ F.normalize(U + t * D, dim=1).T
        loss = margin_cross_entropy(z, y, margins, reduction="none")
        value = risk.risk(risk.class_loss(torch.zeros(k, dtype=X.dtype).index_add(0, y, loss * w)))
        (slope,) = torch.autograd.grad(value[0], t, create_graph=True)
        (curvature,) = torch.autograd.grad(slope, t)
        got = line(step)
        assert got[0] == pytest.approx(float(value[0].detach()), rel=1e-12)
        assert got[1] == pytest.approx(float(slope.detach()), rel=1e-10, abs=1e-14)
        assert got[2] == pytest.approx(float(curvature), rel=1e-10, abs=1e-14)
        softmax = torch.softmax(z.detach() / margins[y, None], dim=1)
        torch.testing.assert_close(line.p, softmax.T, rtol=1e-12, atol=1e-15)


class _GivenLine(_Line):
    """A line of given (value, slope, curvature) in t, its steps recorded."""

    def __init__(self, along):
        self.C, self.along, self.steps = torch.zeros(1, dtype=torch.float64), along, []

    def __call__(self, t):
        self.steps.append(t)
        return (*self.along(t), None)


@pytest.mark.parametrize(
    "along",
    [
        lambda t: ((t - 5) ** 2, 2 * (t - 5), math.inf),  # Newton's step 0
        lambda t: ((t - 5) ** 2, 2 * (t - 5), 1e30),  # below t's rounding
        lambda t: (-t, -math.inf, math.inf),  # NaN
    ],
)
def test_the_spheres_line_search_grows_its_step_where_newton_s_step_does_not(along):
    # The growing phase takes Newton's step where it is short of doubling: where that step
    # left t as it was, the same t was evaluated again up to 30 times (46 evaluations
    # instead of 16), and a NaN one (an infinite slope) made the step NaN. Each step now
    # grows (doubling), every t evaluated once.
    line = _GivenLine(along)
    t, _, _ = line.minimise(1e-3, -10.0, 25.0)
    assert math.isfinite(t) and t > 0
    assert all(math.isfinite(step) for step in line.steps)
    assert len(set(line.steps)) == len(line.steps) <= 70


def test_the_spheres_line_search_grows_its_step_by_newton_s_where_shorter():
    # On a parabola from its slope at 0: doubled to 4.096, then Newton's step lands on the
    # minimum at 5 (one evaluation; doubling to 8.192 and back took two).
    line = _GivenLine(lambda t: ((t - 5) ** 2, 2 * (t - 5), 2.0))
    t, value, _ = line.minimise(1e-3, -10.0, 25.0)
    assert (t, value) == (5.0, 0.0)
    assert line.steps == [1e-3 * 2**i for i in range(13)] + [5.0]


def test_the_compact_memory_is_the_two_loop_recursion_on_projected_pairs():
    """−H·g of the spheres' memory, in compact form with one initial scale per class and
    the pairs projected (once) onto the tangent space at U, is the two-loop recursion's."""
    gen = torch.Generator().manual_seed(0)
    k, d, history = 4, 7, 5
    memory = _Memory((k, d), history, torch.zeros(1, dtype=torch.float64))
    pairs = []
    for _ in range(8):  # more pairs than the memory keeps: the oldest are dropped
        at = F.normalize(torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
        s = tangent_rows(at, torch.randn(k, d, generator=gen, dtype=torch.float64))
        y = 2 * s + 0.1 * tangent_rows(at, torch.randn(k, d, generator=gen, dtype=torch.float64))
        assert memory.add(s, y)
        pairs = (pairs + [(s, y)])[-history:]
    U = F.normalize(torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
    g = tangent_rows(U, torch.randn(k, d, generator=gen, dtype=torch.float64))
    memory.project(U)
    s, y = pairs[-1]  # the initial scales: the latest pair's blocks, as it was added
    torch.testing.assert_close(memory.gamma, (s * y).sum(1) / (y * y).sum(1))
    pairs = [(tangent_rows(U, s), tangent_rows(U, y)) for s, y in pairs]
    q, alphas = g.clone(), []
    for s, y in reversed(pairs):
        alphas.append(float((s * q).sum() / (s * y).sum()))
        q = q - alphas[-1] * y
    q = q * memory.gamma[:, None]
    for (s, y), alpha in zip(pairs, reversed(alphas), strict=True):
        q = q + (alpha - float((y * q).sum() / (s * y).sum())) * s
    torch.testing.assert_close(memory.apply(U, g), -tangent_rows(U, q), rtol=1e-12, atol=1e-14)


@pytest.fixture
def spheres(monkeypatch):
    """Every plain cosine fit on the spheres, whatever runs_on_spheres would choose (the
    small problems of the tests are below its MIN_ENTRIES)."""
    monkeypatch.setattr(solvers, "runs_on_spheres", lambda *args: True)


@pytest.mark.parametrize(
    "data, params, fewer",
    [
        ("digits", {"scale": 16.0}, True),
        ("digits", {"scale": 64.0}, True),
        # (142 iterations against the rounds' 120, 202 before they kept the curvature of
        # small steps)
        ("blobs", {"scale": 64.0, "class_tilt": 2.0}, False),
        ("blobs", {"scale": 256.0, "class_weight": "balanced"}, True),
    ],
)
@pytest.mark.slow
def test_the_spheres_reach_the_solution_of_the_rounds(
    digits_unit, monkeypatch, data, params, fewer
):
    """The L-BFGS on the unit spheres and the previous solver (rounds of torch's L-BFGS)
    fit the same model: predictions alike and the objective no higher, tilted and
    weighted ones too; in fewer iterations where ``fewer`` (40, 109 and 268 against 57,
    154 and 299)."""
    X, y = digits_unit if data == "digits" else _normalised_blobs()
    X = X.astype(np.float64)
    monkeypatch.setattr(solvers, "runs_on_spheres", lambda *args: True)
    on_spheres = _fit(X, y, tol=1e-6, **params)
    monkeypatch.setattr(solvers, "runs_on_spheres", lambda *args: False)
    monkeypatch.setattr(solvers, "sphere_lbfgs", _not_called)
    rounds = _fit(X, y, tol=1e-6, **params)
    assert np.mean(on_spheres.predict(X) == rounds.predict(X)) >= 0.995
    assert on_spheres.loss_curve_[-1] <= rounds.loss_curve_[-1] * (1 + 1e-7)
    if fewer:
        assert on_spheres.n_iter_ < rounds.n_iter_
    assert np.isfinite(on_spheres.coef_).all()


def _not_called(*args, **kwargs):
    raise AssertionError("the spheres' solver ran where runs_on_spheres said not to")


def test_the_spheres_run_where_x_is_large_products_fit_and_logits_are_smooth(monkeypatch):
    from mr2_probe import _sphere

    source = TensorSource(torch.zeros(1000, 200), torch.zeros(1000), torch.ones(1000), 64)
    margins = torch.tensor([0.5, 1.0, 2.0])
    monkeypatch.setattr(_sphere, "MIN_ENTRIES", 195_000)
    assert _sphere.runs_on_spheres(source, 200, 3, 256.0, margins)
    assert not _sphere.runs_on_spheres(source, 194, 3, 256.0, margins)  # X too small
    monkeypatch.setattr(_sphere, "MIN_ENTRIES", 190_000)
    assert _sphere.runs_on_spheres(source, 192, 3, 256.0, margins)
    assert not _sphere.runs_on_spheres(source, 191, 3, 256.0, margins)  # d < 64 K
    assert not _sphere.runs_on_spheres(source, 200, 3, 257.0, margins)  # s / min γ > 512
    for device in ("cuda", "mps"):  # measured on a CPU only; MPS has no float64
        other = SimpleNamespace(n_samples=1000, y=SimpleNamespace(device=torch.device(device)))
        assert not _sphere.runs_on_spheres(other, 200, 3, 256.0, margins)
    monkeypatch.setattr(_sphere, "KEEP_PRODUCTS", 2999)
    assert not _sphere.runs_on_spheres(source, 200, 3, 256.0, margins)  # products too many


def test_a_huge_scale_runs_on_the_rounds_and_separates_the_classes():
    # On the spheres digits at scale 10¹² was still at a loss of 4e7 after 2,000
    # iterations; the rounds reach 0 in about 20.
    X, y = load_digits(return_X_y=True)
    clf = MR2LinearClassifier(head="cosine", scale=1e12, device="cpu").fit(X, y)
    assert clf.loss_curve_[-1] == 0 and clf.score(X, y) == 1.0


def test_the_spheres_line_search_does_not_take_the_far_plateau_of_a_huge_scale(spheres):
    # At scale 10¹² the slope along the retraction vanishes far out too (the rows turn to
    # D/‖D‖): a step of 1 along an unscaled −g was taken there, 260 times the start's loss,
    # then no backtracking recovered a decrease and the fit stalled after 1 iteration.
    X, y = load_digits(return_X_y=True)
    with pytest.warns(ConvergenceWarning, match="did not converge in max_iter=20"):
        clf = MR2LinearClassifier(head="cosine", scale=1e12, max_iter=20, device="cpu").fit(X, y)
    assert clf.n_iter_ == 20 and clf.loss_curve_[-1] < clf.loss_curve_[0] / 10
    assert (np.diff(clf.loss_curve_) < 0).all()


@pytest.mark.parametrize("on_spheres", [True, False])
@pytest.mark.parametrize(
    "weight, dtype", [(1e-42, np.float32), (1e-310, np.float64), (1e37, np.float32)]
)
def test_weights_of_any_scale_fit_a_cosine_head_as_unit_weights(
    monkeypatch, on_spheres, weight, dtype
):
    # The objective does not depend on the weights' scale: they are taken relative to the
    # largest before X's dtype. Taken as given, near the smallest normal number the fit
    # stopped at once, "converged", far from the optimum (in float32 1e-42 keeps 3 bits),
    # or the margins' class statistics were 1.4% off; on the rounds, and at 1e37 (their
    # sum beyond float32's range), the fit was refused.
    monkeypatch.setattr(solvers, "runs_on_spheres", lambda *args: on_spheres)
    X, y = np.random.RandomState(0).randn(60, 4).astype(dtype), np.arange(60) % 3
    weights = np.where(np.arange(60) % 4 == 0, 1.5, 1.0)
    fits = []
    for w in (weights, weights * weight):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            fits.append(MR2LinearClassifier(head="cosine", device="cpu").fit(X, y, w))
        fits[-1].said = [str(warning.message) for warning in record]
    unit, scaled = fits
    assert scaled.said == unit.said  # (float32 on the rounds stalls on rounding, both)
    # (Their ratios in float64 may differ in the last bit, and the fits' paths with them:
    # rows of norm up to 62 here, entries 3.6e-7 apart at 1e-310 in float64.)
    np.testing.assert_allclose(scaled.margins_, unit.margins_, rtol=1e-12)
    np.testing.assert_allclose(scaled.coef_, unit.coef_, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fit", ["fit", "search", "search without refit"])
@pytest.mark.parametrize("weight", [2.5, 1e-42])
def test_class_stats_count_each_class_s_weight_as_given(fit, weight):
    # The cosine head's weights are taken relative to the largest: its class_stats_
    # counted 20, 5 and 5 where the classes weigh 200, 50 and 50 (the linear head's
    # counts), class_weight {0: 4} and sample weights 2.5 dividing them by 10.
    X, y = np.random.RandomState(0).randn(60, 4).astype(np.float32), np.arange(60) % 3
    weights = np.full(60, weight)
    sizes = np.bincount(y, weights=weights * np.where(y == 0, 4.0, 1.0))
    # (The counts are the weights' sums, whatever the solver reaches: a few iterations.)
    params = dict(class_weight={0: 4.0}, max_iter=3, device="cpu")
    for head in ("linear", "cosine") if weight > 1 else ("cosine",):  # (a linear head
        # refuses weights near float32's smallest number: its penalty divides by them)
        if fit == "fit":
            clf = MR2LinearClassifier(head=head, **params)
        else:
            clf = MR2LinearClassifierCV(Cs=2, cv=3, head=head, refit=fit == "search", **params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(X, y, sample_weight=weights)
        np.testing.assert_allclose(clf.class_stats_["count"], sizes, rtol=1e-6)
        assert clf.class_stats_["count"].dtype == np.float64  # (whatever the weights)


def test_a_stall_on_float32_rounding_ends_the_fit_on_the_spheres(spheres):
    # A gradient of 1e-7 asked for, below float32's rounding of it: the fit ran on to
    # max_iter, its steps accepted on rounding alone. It stops, with the float64 advice.
    X, y = np.random.RandomState(0).randn(60, 4), np.arange(60) % 3
    with pytest.warns(ConvergenceWarning) as record:
        stalled = MR2LinearClassifier(head="cosine", tol=1e-7, device="cpu").fit(
            X.astype(np.float32), y
        )
    message = str(record[0].message)
    assert "Use float64 features for a tighter solution" in message and "scale" not in message
    assert stalled.n_iter_ < 100
    precise = MR2LinearClassifier(head="cosine", tol=1e-7, device="cpu").fit(X, y)
    assert precise.n_iter_ < 100
    assert precise.loss_curve_[-1] <= stalled.loss_curve_[-1] + 1e-6


@pytest.mark.slow
def test_a_small_float32_objective_still_falling_is_not_a_stall_on_the_spheres(spheres):
    # A decrease below float32's epsilon in absolute terms counted as rounding: at an
    # objective of 5e-8, still falling by far more than its rounding, the fit stopped
    # "stalled" at a gradient of 3.3e-6 > tol, advising float64. It now reaches tol.
    # (Not tol = 1e-6 on 4,000 rows: there the objective, 1.5e-8, fell by 1e-10 to 1e-9
    # an iteration, below its rounding, eps / √n = 1.9e-9, and whether the fit stalled
    # first, as it says, turned on the rounding of the products: on one thread under
    # torch 2.5 it did. At 3e-6 on 16,000 rows they stay about 3 times theirs or more.)
    rng = np.random.default_rng(1)
    n = 16000
    y = rng.integers(0, 16, n)
    scales = np.exp(rng.uniform(-3, 1, 128))
    X = ((rng.normal(size=(16, 128))[y] + rng.normal(size=(n, 128))) * scales).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = MR2LinearClassifier(head="cosine", scale=256.0, tol=3e-6, device="cpu").fit(X, y)
    precise = MR2LinearClassifier(head="cosine", scale=256.0, tol=3e-6, device="cpu")
    precise.fit(X.astype(np.float64), y)
    assert clf.loss_curve_[-1] <= precise.loss_curve_[-1] + 1e-8


@pytest.mark.parametrize("mean", [1e3, 1e4])
def test_a_fit_on_the_spheres_converges_only_where_the_gradient_from_x_meets_tol(spheres, mean):
    # The kept cosines, updated step by step, drift in float32 where the features share a
    # large common component: the fit stopped "converged", no warning, at a gradient of
    # 3.9e-4 and 3.3e-3 (recomputed in float64) against a reported 6.4e-5 and 2.8e-5.
    # (Under torch 2.5's float32 kernels the fit at 1e3 can stall just short of tol, at
    # 1.1e-4 to 2.4e-4: it says so, and the test from X agrees.)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 600)
    X = (rng.normal(size=(4, 20))[y] * 0.4 + rng.normal(size=(600, 20)) + mean).astype(np.float32)

    def short(fit):  # the ConvergenceWarning of a fit, or None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            fit()
        return next((w.message for w in caught if w.category is ConvergenceWarning), None)

    clf = MR2LinearClassifier(head="cosine", scale=64.0, device="cpu", warm_start=True)
    stalled = short(lambda: clf.fit(X, y))
    assert stalled is None or "float32 arithmetic cannot resolve" in str(stalled)
    # The test on tol at the same point, from X: converged where the fit said so.
    assert (short(lambda: clf.set_params(max_iter=0).fit(X, y)) is None) == (stalled is None)


def test_a_line_without_a_decrease_on_drifted_cosines_is_searched_again_from_x(
    spheres, monkeypatch
):
    # The second and third lines (with the pairs, then along −g) find no decrease: the
    # third's cosines are the kept ones, so the fit recomputes them from X and searches
    # again instead of stopping as stalled.
    from mr2_probe import _sphere

    lines = []
    line_init, call = _sphere._Line.__init__, _sphere._Line.__call__

    def init(self, *args):
        line_init(self, *args)
        lines.append(self)

    def no_decrease(self, t):
        value, slope, curvature, factor = call(self, t)
        failing = any(self is line for line in lines[2:4]) and t > 0
        return (value + 1.0 if failing else value), slope, curvature, factor

    monkeypatch.setattr(_sphere._Line, "__init__", init)
    monkeypatch.setattr(_sphere._Line, "__call__", no_decrease)
    X, y = _normalised_blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = MR2LinearClassifier(head="cosine", scale=16.0, device="cpu").fit(X, y)
    assert len(clf.loss_curve_) == clf.n_iter_ + 1 and clf.n_iter_ > 2
    # Lines: the start's (at t = 0 only), the first step's, the two failing ones, the
    # refresh's at the same point, then the search again along −g.
    assert [line.M is line.C for line in lines[:6]] == [True, False, False, False, True, False]
    assert max(clf.loss_curve_[2:]) < clf.loss_curve_[1]


@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_a_fit_on_the_spheres_read_in_small_blocks_is_the_fit_read_whole(
    spheres, monkeypatch, tilt
):
    # Blocks of 7 rows, the last one short: the products and the gradient take each
    # block's rows at their own place, so the fit is that of the rows read at once. (The
    # spheres run where X is large, read in many blocks; the tests' problems fit in one.)
    from mr2_probe import _fit_inputs

    X, y = _normalised_blobs(n=300)
    whole = _fit(X, y, scale=16.0, tol=1e-8, class_tilt=tilt)
    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 7)
    blocks = _fit(X, y, scale=16.0, tol=1e-8, class_tilt=tilt)
    np.testing.assert_allclose(blocks.loss_curve_[-1], whole.loss_curve_[-1], rtol=1e-6)
    np.testing.assert_allclose(blocks.coef_, whole.coef_, rtol=1e-6, atol=1e-8)


def test_an_hdf5_source_is_read_block_by_block_as_the_tensor_is(spheres, tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = _normalised_blobs()
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(64, X.shape[1]))
    tensor = _fit(X, y, scale=64.0, tol=1e-6)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        stored = _fit(f["X"], y, scale=64.0, tol=1e-6)
    assert stored.n_iter_ == tensor.n_iter_
    np.testing.assert_allclose(stored.coef_, tensor.coef_, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_integer_sample_weights_on_the_spheres_fit_as_repeated_rows(spheres, tilt):
    # The gradient on the spheres carries each row's weight, as its objective does: a row
    # of weight 3 is three copies of it. (Unit weights, or weights equal within each
    # class, hid a gradient without them.)
    X, y = _normalised_blobs(n=120)
    w = np.arange(120) % 3 + 1.0
    weighted = MR2LinearClassifier(head="cosine", scale=16.0, tol=1e-8, class_tilt=tilt,
                                   device="cpu").fit(X, y, sample_weight=w)  # fmt: skip
    rows = np.repeat(np.arange(120), w.astype(int))
    repeated = MR2LinearClassifier(head="cosine", scale=16.0, tol=1e-8, class_tilt=tilt,
                                   device="cpu").fit(X[rows], y[rows])  # fmt: skip
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weighted.loss_curve_[-1], repeated.loss_curve_[-1], rtol=1e-9)


@pytest.mark.parametrize("curvature", [-1.0, 0.0, 1e-12])
def test_the_spheres_memory_keeps_no_pair_without_positive_curvature(curvature):
    # sᵀy ≤ 10⁻¹⁰·yᵀy: stored, such a pair makes −H·g no descent direction (or divides
    # by its rounding); it is refused and the memory, its scales and −g stay as they were.
    gen = torch.Generator().manual_seed(0)
    k, d = 3, 5
    U = F.normalize(torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
    s = tangent_rows(U, torch.randn(k, d, generator=gen, dtype=torch.float64))
    memory = _Memory((k, d), 4, U)
    assert memory.add(s, 2 * s)
    gamma, before = memory.gamma.clone(), memory.apply(U, s)
    y = tangent_rows(U, torch.randn(k, d, generator=gen, dtype=torch.float64))
    y = y - (s * y).sum() / (s * s).sum() * s + curvature * s / (s * s).sum()  # sᵀy = curvature
    assert not memory.add(s, y)
    assert memory.order == [0]
    torch.testing.assert_close(memory.gamma, gamma)
    torch.testing.assert_close(memory.apply(U, s), before)


def test_a_solve_after_a_fold_stopped_early_reads_its_pairs_newest_first(monkeypatch):
    # Fold 0 stopped after 2 iterations while fold 1 went round the ring: the next solve
    # puts fold 0's pairs back in the order formed before its two-loop recursion reads
    # them (kills: lbfgs_batched without memory.compact(), which read them out of order).
    batch, params, memory, _ = _fold_zero_stopped_early()
    read, two_loop = [], batched._two_loop

    def spy(s, y, rho, h0, g, order):
        stamps = torch.where(memory.rho != 0, memory.stamp, -1)[0, order].tolist()
        read.append([stamp for stamp in stamps if stamp >= 0])
        return two_loop(s, y, rho, h0, g, order)

    monkeypatch.setattr(batched, "_two_loop", spy)
    batched.lbfgs_batched(batch, params, 8.0, max_iter=1, tol=1e-12, memory=memory)
    assert read[0] == [1, 0]  # fold 0's pairs, newest first
