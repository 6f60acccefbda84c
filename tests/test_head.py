"""The probe head: its closed-form gradients, projections, penalty, starting rows and the
NumPy / torch decision values of a fitted model."""

import math
import warnings

import numpy as np
import pytest
import torch

from mr2_probe._head import PAIR_OPENING, ProbeHead, decision_values, open_pair


def test_opposite_rows_along_a_coordinate_axis_are_opened():
    # Rows ±e_0 have no common direction: the opening takes an axis orthogonal to their
    # difference, not the difference's own axis (which left them opposite, of norm 0.995).
    rows = torch.tensor([[-1.0, 0, 0, 0], [1.0, 0, 0, 0]], dtype=torch.float64)
    opened, which = open_pair(rows)
    assert bool(which)
    torch.testing.assert_close(opened.norm(dim=-1), torch.ones(2, dtype=torch.float64))
    cos = (opened[0] * opened[1]).sum()
    torch.testing.assert_close(cos, torch.tensor(-math.cos(2 * PAIR_OPENING), dtype=torch.float64))
    torch.testing.assert_close(
        opened[1, 0] - opened[0, 0], torch.tensor(2 * math.cos(PAIR_OPENING), dtype=torch.float64)
    )


def _head(n_features=5, n_classes=3, **kw):
    args = {
        "head": "cosine",
        "fit_intercept": False,
        "scale": 2.0,
        "projection": False,
        "projection_rank": None,
        "dtype": torch.float64,
        "device": torch.device("cpu"),
        "generator": torch.Generator().manual_seed(0),
    }
    args.update(kw)
    return ProbeHead(n_features, n_classes, **args)


def test_closed_form_cosine_gradient_of_a_zero_row_is_autograd_s():
    # A zero row (a class without weight): unfloored, ‖w_k‖ = 0 made the gradient NaN.
    g = torch.Generator().manual_seed(0)
    head = _head()
    with torch.no_grad():
        head.weight.copy_(torch.randn(3, 5, generator=g, dtype=torch.float64))
        head.weight[2] = 0
    phi = torch.nn.functional.normalize(torch.randn(8, 5, generator=g, dtype=torch.float64), dim=1)
    y = torch.arange(8) % 3
    torch.nn.functional.cross_entropy(head.logits(phi), y).backward()
    want = head.weight.grad.clone()
    V = head.logit_weight().requires_grad_()
    torch.nn.functional.cross_entropy(phi @ V.T, y).backward()
    head.weight.grad = torch.zeros_like(head.weight)
    head.add_logit_weight_grad(V.grad)
    assert torch.isfinite(head.weight.grad).all()
    torch.testing.assert_close(head.weight.grad, want)


def test_low_rank_features_are_those_of_the_exported_projection():
    g = torch.Generator().manual_seed(0)
    head = _head(head="linear", projection=True, projection_rank=2)
    x = torch.randn(8, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(head.features(x), x)  # P = I + A·B starts at I
    with torch.no_grad():
        head.proj_a.copy_(torch.randn(5, 2, generator=g, dtype=torch.float64))
    torch.testing.assert_close(head.features(x), x @ head._projection_matrix().T)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_a_head_with_a_projection_has_no_closed_form(kind):
    # The closed-form gradients are those of W on the raw features: P would get none.
    for rank in (None, 2):
        head = _head(head=kind, projection=True, projection_rank=rank)
        assert not head.has_closed_form
    assert _head(head=kind).has_closed_form


def test_the_penalty_is_half_the_squared_distance_from_the_identity():
    g = torch.Generator().manual_seed(0)
    full = _head(head="linear", projection=True)
    assert float(full.penalty().detach()) == 0.0  # W = 0, P = I
    e = torch.randn(5, 5, generator=g, dtype=torch.float64)
    with torch.no_grad():
        full.weight.fill_(1.0)
        full.proj_full.add_(e)
    torch.testing.assert_close(full.penalty().detach(), 0.5 * 15 + 0.5 * e.square().sum())
    low = _head(head="linear", projection=True, projection_rank=2)  # A = 0, B random
    assert float(low.proj_b.detach().square().sum()) > 0
    with torch.no_grad():
        low.proj_a.copy_(torch.randn(5, 2, generator=g, dtype=torch.float64))
    want = 0.5 * (low.proj_a.square().sum() + low.proj_b.square().sum())
    torch.testing.assert_close(low.penalty().detach(), want.detach())


def test_a_zero_prototype_starts_on_the_first_axis_when_the_others_cancel():
    # The other prototypes sum to zero: "opposite their sum" has no direction, and the
    # row stayed at zero, where the cosine head's gradient (∝ 1/‖w_k‖) is undefined.
    head = _head(n_features=3)
    means = torch.tensor([[1.0, 0, 0], [-1.0, 0, 0], [0, 0, 0]], dtype=torch.float64)
    head.init_weight_from_means(means)
    torch.testing.assert_close(
        head.weight.detach()[2], torch.tensor([1.0, 0, 0], dtype=torch.float64)
    )
    torch.testing.assert_close(head.weight.detach()[:2], means[:2])


def test_a_zero_prototype_starts_opposite_the_sum_of_the_others():
    # A class without a direction starts away from the classes that have one, as
    # init_weight_from_means documents (kills: a start along their sum, among them).
    head = _head(n_features=3)
    means = torch.tensor([[2.0, 0, 0], [0, 3.0, 0], [0, 0, 0]], dtype=torch.float64)
    head.init_weight_from_means(means)
    away = -torch.tensor([1.0, 1.0, 0], dtype=torch.float64) / 2**0.5
    torch.testing.assert_close(head.weight.detach()[2], away)


def test_numpy_decision_values_are_computed_in_the_wider_precision():
    # float64 rows of a float32 model: scikit-learn promotes to float64 (as for float32
    # rows of a float64 model); in the model's float32 they lost ~7 digits.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 6)) * 1e3
    coef = rng.normal(size=(3, 6)).astype(np.float32)
    intercept = rng.normal(size=3).astype(np.float32)
    for head in ("linear", "cosine"):
        z = decision_values(X, coef, intercept, None, head)
        assert z.dtype == np.float64
        want = X @ coef.astype(np.float64).T
        if head == "cosine":
            want /= np.linalg.norm(X, axis=1, keepdims=True)
        np.testing.assert_allclose(z, want + intercept.astype(np.float64), rtol=1e-12)


@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_zero_row_s_cosine_decision_values_are_the_intercept(as_tensor, projected):
    # A zero row has no direction: its logits are 0 (plus the intercept), not 0/0 = NaN,
    # with a learned projection too (P = 2·I halves the other row's logits: ‖P·x̂‖ = 2).
    X = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
    coef, intercept = np.eye(2, 3), np.array([0.5, -0.5])
    projection = 2 * np.eye(3) if projected else None
    if as_tensor:
        X = torch.as_tensor(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no invalid-value warning either
        z = decision_values(X, coef, intercept, projection, "cosine")
    z = np.asarray(z)
    half = 0.5 if projected else 1.0
    np.testing.assert_allclose(z, [[0.5, -0.5], [0.6 * half + 0.5, 0.8 * half - 0.5]])
