"""The cosine head's L-BFGS: closed-form gradients, unit-direction rounds, same solutions."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV
from mr2_probe._data import H5Source, TensorSource
from mr2_probe._head import ProbeHead
from mr2_probe._losses import margin_cross_entropy, tilted_class_risk
from mr2_probe._path import FoldPath
from mr2_probe._solvers import ClassRisk, CurvaturePairs, plain_data_term, tilted_data_term
from tests.reference_mr2 import cosine_lbfgs_before


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
    head = ProbeHead(
        d, k, head="cosine", fit_intercept=True, scale=7.0, projection=False,
        projection_rank=None, dtype=torch.float64, device=torch.device("cpu"), generator=gen,
    )  # fmt: skip
    with torch.no_grad():
        head.weight.normal_(generator=gen).mul_(3.0)  # rows far from unit norm
    source = _source(kind, X, y, w, tmp_path)
    risk = ClassRisk(source, k, tilt)
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
    head = ProbeHead(
        X.shape[1], 10, head="cosine", fit_intercept=True, scale=64.0, projection=False,
        projection_rank=None, dtype=torch.float64, device=torch.device("cpu"),
        generator=torch.Generator(),
    )  # fmt: skip
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


def test_carried_pairs_are_the_pairs_of_the_rescaled_rows():
    """W = ρ·W' is an exact change of coordinates of the cosine objective: a pair formed at
    rows of any norms, rescaled, is the pair between the same rows at unit norm."""
    gen = torch.Generator().manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(40, 5, generator=gen, dtype=torch.float64))
    y = torch.arange(40) % 3

    def grad(W):
        W = W.clone().requires_grad_()
        z = 8.0 * X @ torch.nn.functional.normalize(W, dim=1).T
        margin_cross_entropy(z, y, torch.ones(3, dtype=X.dtype)).backward()
        return W.grad

    norms = torch.tensor([[3.0], [0.5], [1.7]], dtype=X.dtype)
    U1, U2 = (torch.nn.functional.normalize(torch.randn(3, 5, generator=gen, dtype=X.dtype))
              for _ in range(2))  # fmt: skip
    W1 = U1 * norms * torch.tensor([[1.1], [0.9], [1.0]], dtype=X.dtype)
    W2 = U2 * norms
    state = {"old_stps": [(W2 - W1).reshape(-1)], "old_dirs": [(grad(W2) - grad(W1)).reshape(-1)]}
    pairs = CurvaturePairs.take(state, norms, 8.0)
    torch.testing.assert_close(pairs.steps[0], (W2 / norms - W1 / norms).reshape(-1))
    torch.testing.assert_close(pairs.grads[0], (grad(W2 / norms) - grad(W1 / norms)).reshape(-1))
    assert CurvaturePairs.take({}, norms, 8.0) is None  # no pairs formed


def _scale_path(X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifierCV(
            [4.0, 8.0, 16.0, 32.0, 64.0], cv=3, head="cosine", tol=1e-5, max_iter=3000,
            refit=False, device="cpu",
        ).fit(X, y)  # fmt: skip
    coefs = np.stack([clf.coefs_paths_[c] for c in clf.classes_], axis=2)  # (folds, Cs, K, d)
    return clf, coefs.reshape(-1, *coefs.shape[2:])


def test_scale_path_starts_each_scale_from_the_last_pairs(digits_unit, monkeypatch):
    """Each scale of a fold's path starts L-BFGS from the previous scale's pairs: fewer
    iterations than starting from none, the same solutions."""
    X, y = digits_unit
    carried, coefs = _scale_path(X, y)
    monkeypatch.setattr(CurvaturePairs, "take", classmethod(lambda cls, state, norms, scale: None))
    fresh, fresh_coefs = _scale_path(X, y)
    assert carried.n_iter_[0, :, 0].sum() == fresh.n_iter_[0, :, 0].sum()  # cold starts
    assert carried.n_iter_.sum() < 0.85 * fresh.n_iter_.sum()
    assert np.isfinite(coefs).all()
    for ours, theirs in zip(coefs, fresh_coefs, strict=True):
        assert np.mean(np.argmax(X @ ours.T, 1) == np.argmax(X @ theirs.T, 1)) >= 0.995
    np.testing.assert_allclose(carried.scores_[0], fresh.scores_[0], atol=0.01)


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
    monkeypatch.setattr(CurvaturePairs, "take", classmethod(lambda cls, state, norms, scale: None))
    fresh, _ = search()
    assert not warned
    best = [clf.scores_[0].mean(0).max() for clf in (carried, fresh)]
    assert best[0] == pytest.approx(best[1], abs=0.005)


def test_seeded_fits_count_only_their_own_iterations(digits_unit):
    """The seeded state counts as one of torch's iterations, not as one of the fit's: a
    path cut short by max_iter reports max_iter at every scale."""
    X, y = digits_unit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifierCV(
            [4.0, 8.0, 16.0], cv=2, head="cosine", tol=1e-10, max_iter=7, refit=False,
            device="cpu",
        ).fit(X, y)  # fmt: skip
    np.testing.assert_array_equal(clf.n_iter_, 7)


def test_pairs_are_kept_only_while_a_path_runs(digits_unit, monkeypatch):
    X, y = digits_unit
    taken, heads = [], []
    take, run = CurvaturePairs.take.__func__, FoldPath.run

    def counted(cls, *args):
        taken.append(args[-1])
        return take(cls, *args)

    def kept(self, *args, **kwargs):
        run(self, *args, **kwargs)
        heads.append(self.head)

    monkeypatch.setattr(CurvaturePairs, "take", classmethod(counted))
    monkeypatch.setattr(FoldPath, "run", kept)
    _fit(X, y, scale=16.0)
    assert not taken  # a single fit keeps no pairs
    MR2LinearClassifierCV([4.0, 8.0], cv=2, head="cosine", device="cpu").fit(X, y)
    assert sorted(taken) == [4.0, 4.0, 8.0, 8.0]  # each fold's path, not the refit
    assert len(heads) == 2 and all(head.curvature is None for head in heads)
