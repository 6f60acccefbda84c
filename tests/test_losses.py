"""The vectorised MR² functions against literal per-class loops, values and gradients."""

import math
import pickle
import re
from functools import partial

import numpy as np
import pytest
import torch

from mr2_probe import (
    ClassMoments,
    MR2Loss,
    class_difficulty,
    class_margins,
    class_statistics,
    compactness_loss,
    margin_cross_entropy,
    mean_spread,
    moments_difficulty,
    moments_statistics,
    pairwise_sq_distances,
    update_moments,
)
from mr2_probe._stats import compactness_tau, lp_norm_sq, margins_from_difficulty
from tests.reference_mr2 import (
    class_statistics_loop,
    compactness_loop,
    margin_ce_loop,
    margins_loop,
)


def _data(seed, n=60, d=5, k=4):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % k
    scales = torch.linspace(0.5, 3.0, k, dtype=torch.float64)
    features = torch.randn(n, d, generator=g, dtype=torch.float64) * scales[labels, None]
    features = features + torch.randn(k, d, generator=g, dtype=torch.float64)[labels]
    return features, labels[torch.randperm(n, generator=g)], k


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 5.0])
def test_class_statistics_match_loop(p):
    features, labels, k = _data(0)
    stats = class_statistics(features, labels, k, p)
    for got, want in zip(stats, class_statistics_loop(features, labels, k, p), strict=True):
        torch.testing.assert_close(got, want.to(got.dtype))


@pytest.mark.parametrize("p, dtype, scale", [
    (20.0, torch.float32, 1e-3),  # |x|^p underflowed: spreads of 0
    (20.0, torch.float32, 1e3),  # and overflowed
    (60.0, torch.float32, 1.0),
    (400.0, torch.float64, 1.0),
])  # fmt: skip
def test_lp_statistics_and_margins_keep_their_range_at_large_p(p, dtype, scale):
    features, labels, k = _data(1)
    exact = class_statistics(features, labels, k, p)  # float64, unit scale: in range
    stats = class_statistics((features * scale).to(dtype), labels, k, p)
    torch.testing.assert_close(stats.msd.double(), exact.msd * scale**2, rtol=1e-4, atol=0)
    margins = class_margins(stats, 1.0, p)
    torch.testing.assert_close(margins.double(), class_margins(exact, 1.0, p), rtol=1e-4, atol=0)
    row = torch.tensor([[1.0, float("inf"), 0.0]], dtype=dtype)  # inf, not inf / inf = NaN
    assert lp_norm_sq(row, p).item() == float("inf")


@pytest.mark.parametrize("p", [1.0, 3.0, 2.5, float("inf")])
def test_lp_norm_sq_matches_the_norm_and_keeps_its_gradient(p):
    v = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v[2] = 0.0
    v.requires_grad_(True)
    got = lp_norm_sq(v, p)  # autograd tracks v: no in-place powers
    want = torch.linalg.vector_norm(v, ord=p, dim=-1).square()
    torch.testing.assert_close(got, want)
    (g,) = torch.autograd.grad(got[[0, 1, 3]].sum(), v)
    (g_want,) = torch.autograd.grad(want[[0, 1, 3]].sum(), v)
    torch.testing.assert_close(g, g_want)
    with torch.no_grad():
        before = v.clone()
        torch.testing.assert_close(lp_norm_sq(v, p), want.detach())
        torch.testing.assert_close(v, before)  # in place on a copy, never on v
        nan_row = torch.tensor([[1.0, float("nan"), 0.0]], dtype=torch.float64)
        assert lp_norm_sq(nan_row, p).isnan().all()


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_lp_statistics_of_half_precision_features_are_summed_in_float32(half):
    # The sum of |x|^p / peak^p over 1280 entries, squared for p = 1, passed float16's
    # 65504: L1 spreads of inf (and bfloat16 sums lost bits).
    g = torch.Generator().manual_seed(0)
    features, labels = torch.randn(100, 1280, generator=g) * 1e-2, torch.arange(100) % 2
    exact = class_statistics(features.to(half).double(), labels, 2, 1.0).msd
    stats = class_statistics(features.to(half), labels, 2, 1.0)
    assert stats.msd.dtype == torch.float32
    torch.testing.assert_close(stats.msd.double(), exact, rtol=1e-5, atol=0)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_class_statistics_of_many_half_precision_rows_are_exact(half):
    # Counts summed in half precision stopped at 2048 (float16) and 256 (bfloat16), and
    # the sums lost bits: bfloat16 gave a class mean of 11.4 for 2.9 and a spread of 1024.
    g = torch.Generator().manual_seed(0)
    features = (torch.randn(5000, 8, generator=g) + 3).to(half)
    labels = (torch.arange(5000) >= 2500).long()
    exact = class_statistics(features.double(), labels, 2, 3.0)
    stats = class_statistics(features, labels, 2, 3.0)
    assert stats.count.tolist() == [2500, 2500]
    for got, want in zip(stats, exact, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_a_half_precision_spread_of_rounding_is_unmeasured_in_its_own_precision():
    # Taken to float32, a_k = 1e-4 against a moment of 1 was measured (float32's epsilon)
    # and given a margin of 0.09; float16's epsilon is 1e-3: rounding, γ = c̄.
    a, moment = torch.tensor([1.0, 1e-4], dtype=torch.float16), torch.ones(2, dtype=torch.float16)
    margins = margins_from_difficulty(a, 1.0, None, moment)
    torch.testing.assert_close(margins, torch.ones(2, dtype=torch.float16))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_margins_of_many_classes_in_half_precision_keep_their_mean(half):
    # c̄·K·a^{1/3} and Σ_j a_j^{1/3} passed float16's 65504: every margin inf / inf = NaN.
    a = torch.full((10_000,), 1000.0, dtype=half)
    margins = margins_from_difficulty(a, 2.0)
    assert margins.dtype == half
    torch.testing.assert_close(margins.float(), torch.full((10_000,), 2.0))


@pytest.mark.parametrize("c_bar, p", [(1.0, 2.0), (2.0, 3.0), (0.5, 5.0)])
def test_margins_match_loop_and_average_c_bar(c_bar, p):
    features, labels, k = _data(1)
    stats = class_statistics(features, labels, k, p)
    margins = class_margins(stats, c_bar, p)
    torch.testing.assert_close(margins, margins_loop(stats.mean, stats.msd, c_bar, p))
    torch.testing.assert_close(margins.mean(), torch.tensor(c_bar, dtype=margins.dtype))


def test_margins_grow_with_class_spread():
    g = torch.Generator().manual_seed(2)
    labels = torch.arange(400) % 4
    scales = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
    # Classes share one mean (the origin), so a_k is the spread alone.
    features = torch.randn(400, 5, generator=g, dtype=torch.float64) * scales[labels, None]
    margins = class_margins(class_statistics(features, labels, 4, 2.0), 1.0, 2.0)
    assert torch.all(margins[1:] > margins[:-1])  # classes scaled 0.5 … 3.0


def test_spread_margins_ignore_where_the_classes_sit():
    g = torch.Generator().manual_seed(3)
    labels = torch.arange(300) % 3
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    features = torch.randn(300, 4, generator=g, dtype=torch.float64) * scales[labels, None]
    shifted = features + torch.tensor([5.0, -3.0, 0.0, 1.0], dtype=torch.float64)
    for kind in ("moment", "spread"):
        before = class_margins(class_statistics(features, labels, 3), 1.0, 2.0, kind)
        after = class_margins(class_statistics(shifted, labels, 3), 1.0, 2.0, kind)
        if kind == "spread":  # msd_k alone: a common shift changes nothing
            torch.testing.assert_close(before, after)
            assert torch.all(after[1:] > after[:-1])
        else:  # ‖μ_k‖² + msd_k: the shift's norm swamps the spreads
            assert (after.max() - after.min()) < 0.5 * (before.max() - before.min())
    with pytest.raises(ValueError, match="difficulty must be one of"):
        class_margins(class_statistics(features, labels, 3), 1.0, 2.0, "norm")


def test_no_margins_means_plain_cross_entropy():
    features, labels, k = _data(3)
    margins = class_margins(class_statistics(features, labels, k), None)
    logits = features[:, :k]
    torch.testing.assert_close(
        margin_cross_entropy(logits, labels, margins),
        torch.nn.functional.cross_entropy(logits, labels),
    )


def test_margin_cross_entropy_matches_loop_with_gradients():
    features, labels, k = _data(4)
    margins = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)
    logits = (features @ torch.randn(features.shape[1], k, dtype=torch.float64)).requires_grad_()
    got = margin_cross_entropy(logits, labels, margins)
    (grad_got,) = torch.autograd.grad(got, logits)
    want = margin_ce_loop(logits, labels, margins)
    (grad_want,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad_got, grad_want)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_narrow_integer_labels_are_class_indices_not_a_mask(dtype):
    """torch.from_numpy of uint8 labels: indexing with a uint8 tensor reads it as a boolean
    mask, which divided sample i's logits by γ_i (batch size K) or raised IndexError."""
    labels = torch.tensor([2, 1, 2])  # no class 0, as many samples as classes
    margins = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    logits = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    narrow = labels.to(dtype)
    torch.testing.assert_close(
        margin_cross_entropy(logits, narrow, margins), margin_cross_entropy(logits, labels, margins)
    )
    X, y, _ = _data(4, n=20)
    torch.testing.assert_close(
        tuple(class_statistics(X, y.to(dtype), 4, p=3.0)), tuple(class_statistics(X, y, 4, p=3.0))
    )
    moments = ClassMoments.zeros(4, X.shape[1], dtype=X.dtype)
    torch.testing.assert_close(
        tuple(moments_statistics(update_moments(moments, X, y.to(dtype), p=3.0))),
        tuple(moments_statistics(update_moments(moments, X, y, p=3.0))),
    )


@pytest.mark.parametrize("s_bar, tau", [(1.0, 1.0), (4.0, 8.0), (0.1, 0.5)])
def test_compactness_matches_loop_with_gradients(s_bar, tau):
    features, labels, _ = _data(5, n=30)
    features = features.clone().requires_grad_()
    got = compactness_loss(features, labels, s_bar, tau)
    (grad_got,) = torch.autograd.grad(got, features)
    want = compactness_loop(features, labels, s_bar, tau)
    (grad_want,) = torch.autograd.grad(want, features)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad_got, grad_want)


def test_compactness_integer_weights_are_repeated_rows_and_zero_weights_absent():
    features, labels, _ = _data(5, n=30)
    weight = torch.tensor([0, 1, 2, 3] * 7 + [1, 0], dtype=features.dtype)
    features = features.clone().requires_grad_()
    got = compactness_loss(features, labels, 1.0, 2.0, sample_weight=weight)
    (grad_got,) = torch.autograd.grad(got, features)
    index = torch.repeat_interleave(torch.arange(30), weight.long())
    want = compactness_loss(features[index], labels[index], 1.0, 2.0)
    (grad_want,) = torch.autograd.grad(want, features)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad_got, grad_want)
    # Per sample: w_i times each copy's loss (zero-weight rows give 0).
    each = compactness_loss(features, labels, 1.0, 2.0, "none", sample_weight=weight)
    copies = compactness_loss(features[index], labels[index], 1.0, 2.0, "none")
    first = torch.cumsum(weight.long(), 0)[weight > 0] - 1
    torch.testing.assert_close(each[weight > 0], weight[weight > 0] * copies[first])
    assert not each[weight == 0].any()
    # Unit weights change nothing; a batch of zero weights is 0, not NaN.
    plain = compactness_loss(features, labels, 1.0, 2.0)
    ones = compactness_loss(features, labels, 1.0, 2.0, sample_weight=torch.ones(30))
    torch.testing.assert_close(ones, plain)
    zero = compactness_loss(features, labels, 1.0, 2.0, sample_weight=torch.zeros(30))
    assert float(zero.detach()) == 0.0


def test_pairwise_distances_under_bfloat16_autocast_are_float32s():
    # Features of norm ~20 as a backbone gives them: in bfloat16, ‖a‖² + ‖b‖² − 2a·b
    # cancels to errors of several units.

    features = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * 3.5
    exact = torch.cdist(features.double(), features.double()).square()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d = pairwise_sq_distances(features)
        from_half = pairwise_sq_distances(features.bfloat16())
    assert d.dtype == torch.float32
    torch.testing.assert_close(d.double(), exact, atol=1e-3, rtol=1e-5)
    # Half-precision input (rounded features) is computed in float32 too.
    rounded = torch.cdist(features.bfloat16().double(), features.bfloat16().double()).square()
    torch.testing.assert_close(from_half.double(), rounded, atol=1e-3, rtol=1e-5)


def test_compactness_is_overflow_safe_and_handles_singletons():
    features = torch.tensor([[0.0, 0.0], [1e3, 0.0], [5.0, 5.0]], requires_grad=True)
    labels = torch.tensor([0, 0, 1])  # class 1 has no pair
    loss = compactness_loss(features, labels, s_bar=0.1, tau=0.01)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(features.grad).all()
    # The singleton contributes log(1 + 0) = 0 and no gradient.
    assert torch.equal(features.grad[2], torch.zeros(2))
    # Each huge exponent contributes ≈ the exponent itself (log1p(exp(x)) ≈ x).
    expected = (1e6 - 0.2) / 0.01 / 2  # mean over class 0's two samples, over 2 classes
    torch.testing.assert_close(loss.detach(), torch.tensor(expected), rtol=1e-4, atol=0)


def test_moments_keep_a_class_seen_one_sample_at_a_time():
    # Every batch holds a single sample of class 0: its mean of ‖φ‖² is still all there.
    features, labels, k = _data(6, n=12)
    moments = ClassMoments.zeros(k, features.shape[1], dtype=features.dtype)
    for i in range(len(labels)):
        moments = update_moments(moments, features[i : i + 1], labels[i : i + 1], rho=0.5)
    for c in range(k):
        members = features[labels == c]
        # The last sample of a class weighs 1, the one before 0.5, and so on.
        w = 0.5 ** torch.arange(len(members) - 1, -1, -1, dtype=features.dtype)
        mean = (w[:, None] * members).sum(0) / w.sum()
        second = (w * (members * members).sum(1)).sum() / w.sum()
        n_eff = w.sum() ** 2 / (w * w).sum()
        spread = (second - mean @ mean) * n_eff / (n_eff - 1)
        stats = moments_statistics(moments)
        torch.testing.assert_close(stats.mean[c], mean)
        torch.testing.assert_close(stats.msd_l2[c], spread)
        torch.testing.assert_close(moments_difficulty(moments)[c], second)


def _classes(n_classes, n_per_class=30, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n_classes, d, generator=g, dtype=torch.float64) * 1.5
    spread = torch.empty(n_classes, dtype=torch.float64).uniform_(0.5, 2.0, generator=g)
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    noise = torch.randn(len(labels), d, generator=g, dtype=torch.float64)
    return means[labels] + noise * spread[labels, None], labels


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
@pytest.mark.parametrize(
    "n_classes, p",
    [(100, 2.0), (100, 3.0), (100, float("inf")),  # inf: refused by MR2Loss until now
     pytest.param(1000, 2.0, marks=pytest.mark.slow),
     pytest.param(1000, 3.0, marks=pytest.mark.slow)],
)  # fmt: skip
def test_streamed_statistics_match_the_exact_ones(n_classes, p):
    # Batches of 64 hold about one sample of a class (at K = 1000, most hold none).
    features, labels = _classes(n_classes)
    exact = class_statistics(features, labels, n_classes, p)
    criterion = MR2Loss(n_classes, features.shape[1], c_bar=1.0, lam=0.0, p=p).double()
    order = torch.Generator().manual_seed(1)
    for _ in range(2):
        for batch in torch.randperm(len(labels), generator=order).split(64):
            criterion(torch.zeros(len(batch), n_classes), features[batch], labels[batch])
    a = moments_difficulty(criterion.moments(), p)
    a_exact = class_difficulty(exact, p)
    # Unbiased estimates of the class's spread, so ≈ N_k / (N_k − 1) = 1.03 times the
    # spread about the exact mean of its 30 samples; a_k has no such factor.
    torch.testing.assert_close(a.mean(), a_exact.mean(), rtol=0.02, atol=0)
    torch.testing.assert_close(criterion.s_bar(), mean_spread(exact), rtol=0.06, atol=0)
    torch.testing.assert_close(criterion.stats().msd.mean(), exact.msd.mean(), rtol=0.06, atol=0)
    assert torch.corrcoef(torch.stack([a, a_exact]))[0, 1] > 0.98
    # The margins a training step uses: off by 1% on average (6 to 8% before the
    # statistics were tracked as weighted moments).
    exact_margins = class_margins(exact, 1.0, p)
    assert (criterion.margins() / exact_margins - 1).abs().mean() < 0.02


def test_mean_spread_averages_present_classes_only():
    features, labels, k = _data(9)
    weights = (labels != 2).to(features.dtype)  # class 2 has no weight
    stats = class_statistics(features, labels, k, sample_weight=weights)
    torch.testing.assert_close(mean_spread(stats), stats.msd_l2[[0, 1, 3]].mean())


def test_normalized_mr2_loss_defaults_to_p3_and_unequal_margins():
    features, labels, k = _data(10)
    criterion = MR2Loss(n_classes=k, n_features=features.shape[1], normalize=True)
    assert criterion.p == 3.0
    assert MR2Loss(n_classes=k, n_features=features.shape[1]).p == 2.0
    criterion(torch.zeros(len(labels), k), features, labels)
    margins = criterion.margins()
    assert margins.max() - margins.min() > 1e-3  # p = 2 would give every class γ = c̄


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
def test_mr2_loss_module_trains_and_tracks_statistics():
    torch.manual_seed(0)
    features, labels, k = _data(7, n=200, d=6)
    features = features.float()
    backbone = torch.nn.Linear(6, 6)
    head = torch.nn.Linear(6, k)
    criterion = MR2Loss(n_classes=k, n_features=6, c_bar=1.0, lam=0.5, rho=0.5)
    optimizer = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=1e-2)
    losses = []
    for step in range(60):
        idx = torch.arange(step * 20, step * 20 + 40) % len(labels)
        phi = backbone(features[idx])
        loss = criterion(head(phi), phi, labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-10:]) < sum(losses[:10])
    assert criterion.initialised.all()
    torch.testing.assert_close(criterion.margins().mean(), torch.tensor(1.0))
    criterion.eval()
    before = criterion.stats().mean.clone()
    criterion(head(phi), phi, labels[idx])
    assert torch.equal(before, criterion.stats().mean)  # eval mode does not update


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"c_bar": 0.0}, "c_bar"),
        ({"p": 0.5}, "p must"),
        ({"rho": 1.0}, "rho"),
        ({"difficulty": "norm"}, "difficulty must be one of"),
    ],
)
def test_mr2_loss_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MR2Loss(n_classes=3, n_features=2, **kwargs)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("centered", [True, False])
def test_closed_form_linear_gradient_matches_autograd(with_bias, centered):
    from mr2_probe._losses import linear_margin_ce_grad

    features, labels, k = _data(8)
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(k, features.shape[1], generator=g, dtype=torch.float64)
    bias = torch.randn(k, generator=g, dtype=torch.float64) if with_bias else None
    margins = torch.tensor([0.6, 0.9, 1.1, 1.4], dtype=torch.float64)
    sample_weight = torch.rand(len(labels), generator=g, dtype=torch.float64)
    center = features.mean(0) if centered else None
    loss, grad_w, grad_b = linear_margin_ce_grad(
        features, weight, bias, labels, margins, sample_weight, center
    )
    weight.requires_grad_()
    logits = (features - center if centered else features) @ weight.T
    if with_bias:
        bias.requires_grad_()
        logits = logits + bias
    want = margin_cross_entropy(logits, labels, margins, sample_weight, reduction="sum")
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad_w, weight.grad)
    if with_bias:
        torch.testing.assert_close(grad_b, bias.grad)
    else:
        assert grad_b is None


@pytest.mark.slow
def test_mr2_loss_defaults_do_not_collapse_a_trained_backbone():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X, y = torch.as_tensor(X / 16, dtype=torch.float32), torch.as_tensor(y)
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU()
    )
    head = torch.nn.Linear(32, 10)
    criterion = MR2Loss(n_classes=10, n_features=32, c_bar=2.0, lam=0.5)  # paper settings
    optimizer = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=3e-3)
    order = torch.Generator().manual_seed(0)
    for _ in range(10):
        for batch in torch.randperm(len(y), generator=order).split(64):
            phi = backbone(X[batch])
            loss = criterion(head(phi), phi, y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (head(backbone(X)).argmax(1) == y).float().mean()
    assert float(criterion.s_bar()) > 1e-3  # the features keep a spread
    assert accuracy > 0.9


def test_mr2_loss_gives_unseen_classes_the_mean_margin():
    criterion = MR2Loss(n_classes=4, n_features=3, c_bar=2.0, lam=0.0)
    features = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    criterion(torch.zeros(6, 4), features, torch.tensor([0, 0, 1, 1, 1, 0]))  # classes 2, 3 unseen
    margins = criterion.margins()
    torch.testing.assert_close(margins[2:], torch.full((2,), 2.0))
    torch.testing.assert_close(margins[:2].mean(), torch.tensor(2.0))


@pytest.mark.parametrize("tau", [1.0, None])
def test_mr2_loss_on_half_precision_features_of_large_norm(tau):
    # s̄ of about 5·10⁴: in float16, 2·s̄ would overflow to inf (a zero or NaN gradient).
    gen = torch.Generator().manual_seed(0)
    target = torch.arange(16) % 4
    phi, logits = torch.randn(16, 64, generator=gen) * 26, torch.randn(16, 4, generator=gen)
    grads, values = [], []
    for dtype in (torch.float32, torch.float16):
        features = phi.to(dtype).detach().requires_grad_()
        criterion = MR2Loss(4, 64, c_bar=None, lam=1.0, tau=tau)
        value = criterion(logits.to(dtype), features, target)
        value.backward()
        values.append(value.float())
        grads.append(features.grad.float())
    assert torch.isfinite(grads[1]).all() and grads[0].abs().sum() > 0
    torch.testing.assert_close(values[1], values[0], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(grads[1], grads[0], rtol=2e-2, atol=2e-2 * grads[0].abs().max())


@pytest.mark.parametrize("tau", [None, 1.0])
def test_mr2_loss_with_tau_none_does_not_pull_features_towards_zero(tau):
    # τ = 2 s̄ follows the spread in the gradient (through the batch's own), so that a
    # backbone is not pushed to shrink its features: their gradient has no component along
    # a common scale. Before, it had, and a small network's features shrank (digits, Adam:
    # mean norm 0.52 to 0.33 in 40 epochs, training accuracy 0.73). The paper's constant τ
    # keeps its gradient.
    gen = torch.Generator().manual_seed(0)
    target = torch.arange(60) % 3
    phi = torch.randn(60, 8, generator=gen, dtype=torch.float64)
    criterion = MR2Loss(3, 8, c_bar=None, lam=1.0, tau=tau).double()
    criterion.update(phi * 1.5, target)  # running statistics unlike this batch's
    features = phi.clone().requires_grad_()
    (grad,) = torch.autograd.grad(
        criterion(torch.zeros(60, 3).double(), features, target), features
    )
    radial = float((grad * phi).sum())  # d/da at a·φ, a = 1 (the logits held)
    if tau is None:
        assert abs(radial) < 1e-10 * float(grad.norm() * phi.norm())
    else:
        assert radial > 0.1 * float(grad.norm() * phi.norm())


def test_normalized_mr2_loss_is_safe_from_overflow_in_the_norms():
    # Rows of norm ~1e20 (their squares overflow float32) are still unit vectors.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(8, 4, generator=gen), torch.arange(8) % 2
    small, large = (MR2Loss(2, 4, normalize=True, lam=0.5) for _ in range(2))
    small(torch.zeros(8, 2), features, target)
    large(torch.zeros(8, 2), features * 1e20, target)
    torch.testing.assert_close(large.moment_sum, small.moment_sum)
    assert small.moment_sum.abs().sum() > 0


@pytest.mark.parametrize("tau", [1.0, None])
def test_normalized_mr2_loss_takes_a_zero_row_of_float16_features(tau):
    # A zero row (a dead ReLU's features) was NaN once normalised in float16 (1e-12 rounds
    # to 0): the batch was left out of the statistics and every gradient was NaN.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(12, 4, generator=gen).relu(), torch.arange(12) % 3
    features[[0, 3]] = 0
    logits = torch.randn(12, 3, generator=gen)
    grads, losses = [], []
    for dtype in (torch.float32, torch.float16):
        criterion = MR2Loss(3, 4, normalize=True, tau=tau)
        phi = features.to(dtype, copy=True).requires_grad_()
        loss = criterion(logits, phi, target)
        loss.backward()
        losses.append((criterion, loss))
        grads.append(phi.grad.float())
    assert torch.isfinite(grads[1]).all() and (losses[1][0].moment_count > 0).all()
    # (the zero rows' gradients are 1/floor times their share, as with F.normalize)
    rows = features.any(1)
    torch.testing.assert_close(grads[1][rows], grads[0][rows], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(losses[1][0].margins(), losses[0][0].margins(), atol=1e-2, rtol=0)
    torch.testing.assert_close(losses[1][1], losses[0][1], atol=1e-2, rtol=0)


def test_mr2_loss_leaves_a_non_finite_batch_out_of_its_statistics():
    # One overflowed batch (an AMP step GradScaler skips) made every later loss NaN.
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(4, 8, c_bar=1.0, lam=0.5, class_tilt=1.0)
    target = torch.arange(16) % 4
    for step in range(4):
        features = torch.randn(16, 8, generator=gen)
        logits = torch.randn(16, 4, generator=gen)
        if step == 2:
            features[0, 0], logits[1, 1] = float("inf"), float("nan")
            state = {k: v.clone() for k, v in criterion.state_dict().items()}
        value = criterion(logits, features, target)
        if step == 2:  # the features left out; class 1's loss (sample 1's NaN) too
            for name, buffer in criterion.state_dict().items():
                if name.startswith("moment_"):
                    torch.testing.assert_close(buffer, state[name])
            losses = criterion.running_class_loss
            assert losses[1] == state["running_class_loss"][1] and torch.isfinite(losses).all()
    assert torch.isfinite(value) and torch.isfinite(criterion.margins()).all()


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
def test_mr2_loss_keeps_float32_statistics_when_cast_to_half():
    # A float16 sum of ‖φ‖² passed 65504 within a few batches: every margin NaN.
    criterion = MR2Loss(4, 64, c_bar=1.0, lam=0.5).half()
    assert criterion.moment_sum.dtype == torch.float32
    assert criterion.class_samples.dtype == torch.long
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        features = (torch.randn(64, 64, generator=gen) + 3.5).half()
        value = criterion(torch.randn(64, 4, generator=gen).half(), features, torch.arange(64) % 4)
    assert torch.isfinite(value) and torch.isfinite(criterion.margins()).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tau=0.0), "tau must be a finite number > 0"),
        (dict(tau=-1.0), "tau must be"),
        (dict(lam=-1.0), "lam must be a finite number >= 0"),
        (dict(c_bar=float("nan")), "c_bar must be a finite number > 0"),
        (dict(c_bar=float("inf")), "c_bar must be"),
        (dict(p=float("nan")), r"p must be a number >= 1 \(inf included\), got nan"),
        (dict(p=0.5), "p must be a number >= 1"),
        (dict(n_classes=0), "n_classes must be an int >= 1"),
    ],
)
def test_mr2_loss_refuses_invalid_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MR2Loss(**({"n_classes": 3, "n_features": 4} | kwargs))


@pytest.mark.parametrize(
    "c_bar, dtype, logits_dtype",
    [
        (1e-300, torch.float32, torch.float32),  # margins 0: the loss was NaN
        (1e39, torch.float32, torch.float32),  # margins inf: the cross-entropy was log K
        (1e-300, torch.float64, torch.float32),  # margins cast to the logits' dtype
    ],
)
def test_mr2_loss_refuses_a_c_bar_beyond_the_range_of_its_margins(c_bar, dtype, logits_dtype):
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(12, 4, generator=gen), torch.arange(12) % 3
    criterion = MR2Loss(3, 4, c_bar=c_bar).to(dtype)
    before = {name: value.clone() for name, value in criterion.state_dict().items()}
    logits = torch.randn(12, 3, generator=gen).to(logits_dtype)
    with pytest.raises(ValueError, match=re.escape(f"c_bar={c_bar:g} is out of the range of")):
        criterion(logits, features.to(dtype), target)
    for name, value in criterion.state_dict().items():  # the batch was not folded in
        assert torch.equal(value, before[name]), name
    if dtype == logits_dtype:  # the margins asked for alone are refused too
        with pytest.raises(ValueError, match=re.escape(f"c_bar={c_bar:g} is out of the range")):
            criterion.margins()


@pytest.mark.parametrize("c_bar", [1e-4, 8e-5, 1e-5])
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_mr2_loss_of_half_precision_logits_is_computed_in_float32(c_bar, half):
    # z / γ of float16 logits passed 65504 at c̄ = 1e-4 (logits of about 9): the loss was
    # NaN; below float16's smallest normal number (1e-5) c̄ was refused. As autocast runs
    # cross_entropy, in float32: the loss of the same logits in float32.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(16, 5, generator=gen), torch.arange(16) % 4
    logits = (torch.randn(16, 4, generator=gen) * 3).to(half)
    value = MR2Loss(4, 5, c_bar=c_bar)(logits, features, target)
    expected = MR2Loss(4, 5, c_bar=c_bar)(logits.float(), features, target)
    assert value.dtype == torch.float32 and torch.isfinite(value)
    torch.testing.assert_close(value, expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
def test_mr2_loss_refuses_logits_that_are_not_floating_point(dtype):
    # torch.finfo's TypeError ("requires a floating point input type") named no argument.
    criterion = MR2Loss(3, 4)
    with pytest.raises(TypeError, match=f"logits must be floating point, got {dtype}"):
        criterion(torch.ones(6, 3, dtype=dtype), torch.randn(6, 4), torch.arange(6) % 3)
    assert not criterion.initialised.any()  # the batch was not folded in


def test_mr2_loss_takes_an_extreme_tau_without_a_compactness_term():
    # With lam=0 τ takes no part in the loss: float32's τ = 1e-300 is no reason to refuse it.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(12, 4, generator=gen), torch.arange(12) % 3
    logits = torch.randn(12, 3, generator=gen)
    value = MR2Loss(3, 4, lam=0.0, tau=1e-300)(logits, features, target)
    torch.testing.assert_close(value, MR2Loss(3, 4, lam=0.0)(logits, features, target))


@pytest.mark.parametrize(
    "kwargs, features_dtype",
    [(dict(tau=1e-300), torch.float32), (dict(lam=1e300), torch.float32),
     (dict(tau=1e-300), torch.float16), (dict(tau=1e-6), torch.float16)],
)  # fmt: skip
def test_mr2_loss_refuses_a_tau_or_lam_beyond_the_range_of_its_distances(kwargs, features_dtype):
    # The distances are in float32 at least: τ = 1e-300 divided them by 0, λ = 1e300 made
    # the term inf; the loss was inf. (float32 for float16 features: τ = 1e-6 is taken.)
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(12, 4, generator=gen), torch.arange(12) % 3
    criterion = MR2Loss(3, 4, **kwargs)
    logits = torch.randn(12, 3, generator=gen)
    if kwargs.get("tau") == 1e-6:
        assert torch.isfinite(criterion(logits, features.to(features_dtype), target))
        return
    ((name, value),) = kwargs.items()
    with pytest.raises(ValueError, match=re.escape(f"{name}={value:g} is out of the range of")):
        criterion(logits, features.to(features_dtype), target)
    assert not criterion.initialised.any()  # the batch was not folded in


@pytest.mark.parametrize("how", ["update", "forward"])
@pytest.mark.parametrize("rho", [0.99999999, 1 - 2**-25])
def test_mr2_loss_refuses_a_rho_its_statistics_round_to_1(rho, how):
    # In float32, ρ = 0.99999999 was 1.0: nothing decayed (the counts grew as sums), unsaid.
    gen = torch.Generator().manual_seed(0)
    features, target = torch.randn(12, 4, generator=gen), torch.arange(12) % 3
    criterion = MR2Loss(3, 4, rho=rho, class_tilt=1.0)
    fold = (lambda: criterion.update(features, target)) if how == "update" else (
        lambda: criterion(torch.randn(12, 3, generator=gen), features, target))  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(f"rho={rho!r} rounds to 1 in float32")):
        fold()
    assert not criterion.initialised.any()  # the batch was not folded in
    criterion.double()  # float64 statistics keep the decay
    fold()
    fold()
    assert (criterion.moment_count < 8).all() and (criterion.moment_count > 7.99).all()


@pytest.mark.parametrize("c_bar, dtype", [(1e-300, torch.float64), (1e38, torch.float32)])
def test_mr2_loss_keeps_margins_of_an_extreme_c_bar_its_dtype_holds(c_bar, dtype):
    # float32's c̄ = 1e38: c̄·K·a_k^{1/3} overflowed before the division, every margin inf.
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(12, 4, generator=gen, dtype=dtype, requires_grad=True)
    criterion = MR2Loss(3, 4, c_bar=c_bar, lam=0.0).to(dtype)
    loss = criterion(features @ torch.randn(4, 3, generator=gen, dtype=dtype), features,
                     torch.arange(12) % 3)  # fmt: skip
    margins = criterion.margins()
    assert torch.isfinite(margins).all() and (margins > 0).all()
    torch.testing.assert_close(margins.mean(), torch.tensor(c_bar, dtype=dtype))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8])
def test_mr2_loss_normalizes_integer_features_as_float_ones(dtype):
    # torch's vector_norm refused integer features ("Expected a floating point or complex
    # tensor as input. Got Long"), where normalize=False took them.
    gen = torch.Generator().manual_seed(0)
    features = torch.randint(0, 6, (12, 4), generator=gen)
    logits, target = torch.randn(12, 3, generator=gen), torch.arange(12) % 3
    given, floats = (MR2Loss(3, 4, normalize=True) for _ in range(2))
    value = given(logits, features.to(dtype), target)
    torch.testing.assert_close(value, floats(logits, features.float(), target), rtol=0, atol=0)
    torch.testing.assert_close(given.margins(), floats.margins(), rtol=0, atol=0)


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_trained_mr2_loss_cast_to_half_keeps_its_statistics(half):
    # The buffers were rounded to half precision before being made float32 again: sums past
    # 65504 became inf (s̄ inf, margins NaN, every later batch skipped), and in bfloat16
    # a rounded mean read as a shift made a spread of 0.16 into 37.
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(2, 16, class_tilt=1.0)
    target = torch.arange(64) % 2
    for _ in range(5):
        features = torch.randn(64, 16, generator=gen) * 0.1 + 1000
        criterion(torch.randn(64, 2, generator=gen), features, target)
    before = {name: value.clone() for name, value in criterion.state_dict().items()}
    criterion.to(half)
    for name, value in criterion.state_dict().items():
        assert torch.equal(value, before[name]), name  # float32 values, unrounded
    criterion.update(torch.randn(64, 16, generator=gen) * 0.1 + 1000, target)
    torch.testing.assert_close(criterion.stats().msd, torch.full((2,), 0.16), rtol=0.1, atol=0)
    assert torch.isfinite(criterion.margins()).all()


def test_mr2_loss_refuses_logits_or_features_of_another_size():
    criterion = MR2Loss(3, 4)
    with pytest.raises(ValueError, match=r"made for 3 classes and 4 features: it takes logits"):
        criterion(torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([0, 1]))


@pytest.mark.parametrize("logits, features, target, error, match", [
    # Each gave a torch error of index_add_ ("Number of indices (8) should be equal to
    # source.size(dim): (5)", "index out of range in self") after counting the batch.
    ((8, 3), (5, 4), torch.arange(8) % 3, ValueError, r"got shapes \(8, 3\), \(5, 4\)"),
    ((8, 3), (8, 4), torch.arange(8) % 3 + 3, ValueError, "Target 5 is out of bounds"),
    ((8, 3), (8, 4), -torch.ones(8, dtype=torch.long), ValueError, "Target -1 is out of"),
    # K itself, the off-by-one of 1-based labels.
    ((8, 3), (8, 4), torch.arange(8) % 3 + 1, ValueError, "Target 3 is out of bounds"),
    ((8, 3), (8, 4), torch.zeros(8), TypeError, "class indices .*, got torch.float32"),
    ((3,), (4,), torch.tensor(0), ValueError, r"got shapes \(3,\), \(4,\) and \(\)"),
])  # fmt: skip
def test_a_refused_batch_leaves_the_statistics_as_they_were(logits, features, target, error, match):
    criterion = MR2Loss(3, 4, class_tilt=1.0)
    criterion(torch.randn(6, 3), torch.randn(6, 4), torch.arange(6) % 3)
    before = {name: value.clone() for name, value in criterion.state_dict().items()}
    with pytest.raises(error, match=match):
        criterion(torch.randn(logits), torch.randn(features), target)
    for name, value in criterion.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize(
    "target", [torch.tensor([0.9, 1.7, 2.2]), torch.tensor([True, False, True])]
)
def test_update_refuses_targets_that_are_no_class_indices(target):
    # update() truncated floats (0.9, 1.7, 2.2 counted as classes 0, 1, 2), as forward refuses.
    criterion = MR2Loss(3, 4)
    before = {name: value.clone() for name, value in criterion.state_dict().items()}
    with pytest.raises(TypeError, match="targets must be class indices"):
        criterion.update(torch.randn(3, 4), target)
    for name, value in criterion.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("features, target, match", [
    # index_add_'s "source tensor shape must match self tensor shape", "Index is supposed
    # to be a vector" and "index out of range in self", as forward refuses them.
    ((3, 5), torch.tensor([0, 1, 2]), r"update takes features \(B, 4\) .* \(3, 5\) and \(3,\)"),
    ((3, 4), torch.tensor([[0], [1], [2]]), r"got shapes \(3, 4\) and \(3, 1\)"),
    ((3, 4), torch.tensor([0, 1, 3]), "Target 3 is out of bounds: the classes are 0..2"),
])  # fmt: skip
def test_update_refuses_a_batch_that_forward_refuses(features, target, match):
    criterion = MR2Loss(3, 4)
    before = {name: value.clone() for name, value in criterion.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        criterion.update(torch.randn(features), target)
    for name, value in criterion.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("how", ["update", "forward"])
def test_mr2_loss_reads_its_targets_range_once_a_batch(how, monkeypatch):
    # _check_batch and update_moments each read the range (two min/max reads a batch),
    # one worded "Target …", the other "Label …": one check now serves both.
    criterion = MR2Loss(3, 4)
    reads = []
    for name in ("min", "max"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _r=read, _n=name, **k: (
            reads.append(_n), _r(t, *a, **k))[1])  # fmt: skip
    fold = criterion.update if how == "update" else partial(criterion, torch.randn(6, 3))
    fold(torch.randn(6, 4), torch.arange(6) % 3)
    assert sorted(reads) == ["max", "min"]
    monkeypatch.undo()
    with pytest.raises(ValueError, match=re.escape(
        "Target 3 is out of bounds: the classes are 0..2 (targets to ignore are not")):  # fmt: skip
        fold(torch.randn(6, 4), torch.arange(6) % 3 + 1)
    with pytest.raises(ValueError, match=re.escape(
        "Label 3 is out of bounds: the classes are 0..2 (labels to ignore are not")):  # fmt: skip
        update_moments(ClassMoments.zeros(3, 4), torch.randn(6, 4), torch.arange(6) % 3 + 1)


@pytest.mark.parametrize("argument", ["logits", "features", "target"])
@pytest.mark.parametrize("convert", [np.asarray, torch.Tensor.tolist])
def test_arrays_that_are_no_tensors_are_refused_by_name(argument, convert):
    # NumPy labels (scikit-learn's) failed with "'numpy.ndarray' object has no attribute
    # 'is_floating_point'", a list with "'list' object has no attribute 'ndim'".
    batch = {
        "logits": torch.randn(6, 3),
        "features": torch.randn(6, 4),
        "target": torch.arange(6) % 3,
    }
    batch[argument] = convert(batch[argument])
    kind = "numpy.ndarray" if convert is np.asarray else "list"
    match = f"takes torch tensors: {argument} is a {kind}; torch.as_tensor\\({argument}\\)"
    criterion = MR2Loss(3, 4)
    with pytest.raises(TypeError, match=f"^MR2Loss {match}"):
        criterion(**batch)
    if argument != "logits":
        with pytest.raises(TypeError, match=f"^MR2Loss {match}"):
            criterion.update(batch["features"], batch["target"])
    if argument != "features":
        with pytest.raises(TypeError, match=f"^margin_cross_entropy {match}"):
            margin_cross_entropy(batch["logits"], batch["target"], torch.ones(3))
    assert float(criterion.moment_count.sum()) == 0  # nothing folded in


@pytest.mark.parametrize("function, arguments", [
    (lambda features, labels: class_statistics(features, labels, 3), ("features", "labels")),
    (lambda features, labels: update_moments(ClassMoments.zeros(3, 4), features, labels),
     ("features", "labels")),
    (lambda features, target: compactness_loss(features, target, 1.0), ("features", "target")),
    (lambda features, target: pairwise_sq_distances(features), ("features",)),
])  # fmt: skip
def test_the_pure_functions_refuse_arrays_that_are_no_tensors_by_name(function, arguments):
    # "'numpy.ndarray' object has no attribute 'is_floating_point'" (or 'to').
    tensors = (torch.randn(6, 4), torch.arange(6) % 3)
    for i, name in enumerate(arguments):
        given = [t.numpy() if j == i else t for j, t in enumerate(tensors)]
        with pytest.raises(TypeError, match=f"takes torch tensors: {name} is a numpy.ndarray"):
            function(*given)


# The functions of tensors that take sample weights, as (features, target, weights).
_WEIGHTED = [
    lambda features, target, w: margin_cross_entropy(
        features[:, :3], target, torch.ones(3), sample_weight=w
    ),
    lambda features, target, w: class_statistics(features, target, 3, sample_weight=w),
    lambda features, target, w: compactness_loss(features, target, 1.0, sample_weight=w),
]


@pytest.mark.parametrize("function", _WEIGHTED)
def test_sample_weights_that_are_no_tensors_are_refused_by_name(function):
    # margin_cross_entropy's NumPy weights failed with "'numpy.ndarray' object has no
    # attribute 'is_floating_point'", where its other arguments were named.
    features, target = torch.randn(6, 4), torch.arange(6) % 3
    with pytest.raises(TypeError, match="takes torch tensors: sample_weight is a numpy.ndarray"):
        function(features, target, np.ones(6, dtype=np.float32))


@pytest.mark.parametrize("value", [3e38, 1e-45])
def test_weighted_mean_of_huge_or_subnormal_float32_weights_is_the_mean(value):
    # The mean is the same for any common weight: weights of 3e38 summed to inf (a loss of
    # NaN), and of 1e-45 (subnormal) each w·ℓ kept a bit or two (0.83 for 1.02).
    logits, target = (
        torch.randn(6, 3, generator=torch.Generator().manual_seed(0)),
        torch.arange(6) % 3,
    )
    weight = torch.full((6,), value)
    expected = margin_cross_entropy(logits, target, torch.ones(3))
    got = margin_cross_entropy(logits, target, torch.ones(3), sample_weight=weight)
    torch.testing.assert_close(got, expected)


def test_compactness_mean_of_huge_float32_weights_is_float64s():
    # The class averages' weights (two samples of 2e38 a class) summed to inf: every share
    # 0, a loss of 0 (as a sample counts as w copies, it is log w ≈ 88 and more).
    features, target = (
        torch.randn(6, 4, generator=torch.Generator().manual_seed(0)),
        torch.arange(6) % 3,
    )
    weight = torch.full((6,), 2e38)
    got = compactness_loss(features, target, 1.0, sample_weight=weight)
    expected = compactness_loss(features.double(), target, 1.0, sample_weight=weight.double())
    assert got > 80
    torch.testing.assert_close(got.double(), expected)


@pytest.mark.parametrize("function", _WEIGHTED)
def test_a_0d_tensor_as_sample_weight_is_told_how_to_make_one_per_sample(function):
    # It was told its shape alone ("sample_weight.shape == (), expected (6,)!"), where a
    # float is told how to make one weight per sample.
    features, target = torch.randn(6, 4), torch.arange(6) % 3
    with pytest.raises(ValueError, match=re.escape(
        "sample_weight.shape == (), expected (6,)! It holds one weight per sample: "
        "sample_weight.expand((6,)) makes them.")):  # fmt: skip
        function(features, target, torch.tensor(2.0))
    cured = torch.tensor(2.0).expand((6,))  # (the cure, which the functions take)
    function(features, target, cured)


def test_compactness_mean_of_classes_weighted_far_apart_is_float64s():
    # Weights taken relative to the batch's largest (1e20) took a class of weights 1e-30
    # to 0 in float32: it dropped out of the mean of the classes (55.6 for 27.8).
    features, target = (
        torch.randn(8, 3, generator=torch.Generator().manual_seed(0)),
        torch.arange(8) // 4,
    )
    weight = torch.tensor([1e20] * 4 + [1e-30] * 4)
    got = compactness_loss(features, target, 0.5, sample_weight=weight)
    expected = compactness_loss(features.double(), target, 0.5, sample_weight=weight.double())
    torch.testing.assert_close(got.double(), expected)


def test_weighted_mean_of_ordinary_weights_is_their_sums_quotient_exactly():
    # Divided by the largest weight (3 parts in 2^24 of rounding each), the mean moved by an
    # ulp from Σ w·ℓ / Σ w, and every fit of sample weights and λ > 0 with it.
    generator = torch.Generator().manual_seed(0)
    margins = torch.full((4,), 1.5)
    for _ in range(4):  # (a draw may round alike either way)
        logits = torch.randn(50, 4, generator=generator)
        target = torch.randint(0, 4, (50,), generator=generator)
        weight = torch.rand(50, generator=generator) * 3
        each = margin_cross_entropy(logits, target, margins, reduction="none")
        got = margin_cross_entropy(logits, target, margins, sample_weight=weight)
        assert torch.equal(got, (each * weight).sum() / weight.sum())


@pytest.mark.parametrize("function", _WEIGHTED)
def test_complex_sample_weights_are_refused(function):
    # margin_cross_entropy returned a complex loss (the weights' imaginary part cast away
    # with torch's warning, once per process); compactness_loss failed with "gt_cpu" not
    # implemented for 'ComplexFloat'.
    features, target = torch.randn(6, 4), torch.arange(6) % 3
    weight = torch.ones(6, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"^sample_weight must be real numbers, got a tensor of"):
        function(features, target, weight)


@pytest.mark.parametrize(
    "weight", [2.0, 2, np.float32(2.0), np.float64(2.0), np.array(2.0), np.array(2)]
)
@pytest.mark.parametrize("function", _WEIGHTED)
def test_one_number_as_sample_weight_is_refused_saying_one_weight_per_sample(function, weight):
    # The remedy said, torch.as_tensor(sample_weight), made a 0-d tensor, refused next for
    # its shape ("sample_weight.shape == (), expected (6,)!"); and "is a int". A 0-d array
    # (np.array(2.0)) still got that remedy, then one that torch.full refused ("must be
    # Number, not numpy.ndarray"): the remedy said is followed here.
    features, target = torch.randn(6, 4), torch.arange(6) % 3
    kind = {
        float: "a float",
        int: "an int",
        np.float32: "a numpy.float32",
        np.float64: "a numpy.float64",
        np.ndarray: "a 0-d numpy.ndarray",
    }[type(weight)]
    number = "float(sample_weight)" if isinstance(weight, np.ndarray) else "sample_weight"
    remedy = f"torch.full((n_samples,), {number})"
    said = f"sample_weight is {kind}; it holds one weight per sample: {remedy} makes them."
    with pytest.raises(TypeError, match=re.escape(said)):
        function(features, target, weight)
    followed = eval(remedy, {"torch": torch, "n_samples": 6, "sample_weight": weight})
    function(features, target, followed)  # (taken)


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64]
)
def test_mr2_loss_takes_targets_of_any_integer_dtype(dtype):
    # int32 was counted in the statistics, then refused by cross_entropy; uint8 (which
    # cross_entropy takes) was refused by index_add_; uint16 to uint64 (torch.from_numpy
    # of such labels) by their range check: torch has no min or max of them.
    features, target = torch.randn(9, 4), torch.arange(9) % 3
    logits = torch.randn(9, 3)
    want, got = MR2Loss(3, 4, lam=0.5), MR2Loss(3, 4, lam=0.5)
    torch.testing.assert_close(
        got(logits, features, target.to(dtype)), want(logits, features, target)
    )
    torch.testing.assert_close(got.moment_count, want.moment_count)
    if dtype == torch.uint64:  # named as given, not wrapped to a negative int64
        with pytest.raises(ValueError, match=f"Target {2**63 + 5} is out of bounds"):
            got(logits[:1], features[:1], torch.tensor([2**63 + 5], dtype=dtype))


@pytest.mark.usefixtures("one_torch_thread_per_test")  # (tiny tensors: conftest.py)
@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_a_tilted_mr2_loss_of_float64_inputs_is_float64(lam):
    # The per-sample losses were cast to the statistics' float32 (meant to lift float16):
    # a float64 loss lost its precision, and gradcheck failed, only where tilted.
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    features = torch.randn(12, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.arange(12) % 3
    criterion = MR2Loss(3, 4, lam=lam, class_tilt=2.0)
    criterion(logits.detach(), features.detach(), target)  # statistics and class losses
    criterion.eval()
    assert criterion(logits, features, target).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda z, f: criterion(z, f, target), (logits, features))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_classes=np.int64(3), n_features=np.int32(4)), None, None),  # y.max() + 1
    (dict(n_classes=3, n_features=4, normalize=np.bool_(True), lam=torch.tensor(0.5)),
     None, None),  # as they were taken before the types were checked
    (dict(n_classes=True), ValueError, "n_classes must be an int >= 1, got True"),
    (dict(lam="0.5"), TypeError, "lam must be a number, got '0.5'"),
    (dict(class_tilt=None), TypeError, "class_tilt must be a number, got None"),
    (dict(tau="1"), TypeError, "tau must be a number or None, got '1'"),
    (dict(normalize="no"), TypeError, "normalize must be True or False, got 'no'"),
])  # fmt: skip
def test_mr2_loss_names_the_parameter_of_a_wrong_type(kwargs, error, match):
    if error is None:
        assert MR2Loss(**kwargs).n_classes == 3
        return
    with pytest.raises(error, match=match):
        MR2Loss(**({"n_classes": 3, "n_features": 4} | kwargs))


@pytest.mark.parametrize("loss", ["margin", "compactness"])
def test_an_unknown_reduction_is_refused(loss):
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="reduction must be"):
        if loss == "margin":
            margin_cross_entropy(x, y, torch.ones(3), reduction="bogus")
        else:
            compactness_loss(x, y, 1.0, reduction="sum")


def _two_ranks(rank, init_file, out_dir, batches):
    """One of two gloo processes: train MR2Loss on its half of every batch."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        criterion = MR2Loss(4, 5, c_bar=1.0, lam=0.5, p=3.0, class_tilt=2.0, sync_stats=True)
        for logits, features, labels in batches:
            half = slice(rank, None, 2)  # rank 0 the even rows, rank 1 the odd ones
            criterion(logits[half], features[half], labels[half]).backward()
        torch.save(criterion.state_dict(), f"{out_dir}/rank{rank}.pt")
        # Neither rank leaves before both are done: under torch 2.5's gloo a rank that left
        # straight after the last all_reduce left the other waiting in it for ever (3 of 20
        # runs on a loaded machine; 0 of 20 with this barrier, 0 of 16 under torch 2.14).
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_synchronised_statistics_are_those_of_the_global_batch(tmp_path):
    # Two processes, each with half of every batch: with sync_stats both hold what one
    # process holds after the whole batches (class 3 appears on rank 0 alone).
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        labels = torch.randint(0, 4, (10,), generator=g)
        labels[1::2] = torch.where(labels[1::2] == 3, 2, labels[1::2])  # class 3: rank 0 only
        features = torch.randn(10, 5, generator=g) + labels[:, None]
        logits = torch.randn(10, 4, generator=g, requires_grad=True)
        batches.append((logits, features.requires_grad_(), labels))
    torch.multiprocessing.spawn(_two_ranks, args=(tmp_path / "init", tmp_path, batches), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    alone = MR2Loss(4, 5, c_bar=1.0, lam=0.5, p=3.0, class_tilt=2.0, sync_stats=True)
    for logits, features, labels in batches:
        alone(logits, features, labels)  # no process group: sync_stats changes nothing
    for name, value in alone.state_dict().items():
        for state in ranks:
            torch.testing.assert_close(state[name], value, msg=name)


def test_running_spread_keeps_its_precision_under_a_large_common_offset():
    # Σw‖φ‖²/Σw − ‖μ̂‖² cancelled in float32: features of norm 4000 with a spread of 0.16
    # gave spreads of 1 and 2 (s̄ = 1.5) where float64 gave 0.16.
    g = torch.Generator().manual_seed(0)
    single, double = MR2Loss(2, 16), MR2Loss(2, 16).double()
    for _ in range(50):
        features = torch.randn(64, 16, generator=g, dtype=torch.float64) * 0.1 + 1000
        labels = torch.arange(64) % 2
        single.update(features.float(), labels)
        double.update(features, labels)
    torch.testing.assert_close(single.stats().msd.double(), double.stats().msd, rtol=1e-3, atol=0)
    expected = torch.full((2,), 0.16, dtype=torch.float64)  # 16 entries of variance 0.01
    torch.testing.assert_close(double.stats().msd, expected, rtol=0.05, atol=0)


def test_a_state_saved_before_the_running_spread_sum_loads():
    features, labels, k = _data(3, n=40)
    criterion = MR2Loss(k, features.shape[1]).double()
    criterion.update(features, labels)
    criterion.update(features * 2, labels)
    state = criterion.state_dict()
    del state["moment_m2"]  # as saved before it was kept
    loaded = MR2Loss(k, features.shape[1]).double()
    loaded.load_state_dict(state)
    torch.testing.assert_close(loaded.stats().msd, criterion.stats().msd)
    torch.testing.assert_close(loaded.margins(), criterion.margins())


def test_margins_average_c_bar_in_float64():
    # c̄·K was computed in float32: the mean margin was 1.3 − 4.8e-8.
    features = torch.randn(90, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    margins = class_margins(class_statistics(features + 1, torch.arange(90) % 3, 3), c_bar=1.3)
    assert abs(float(margins.mean()) - 1.3) < 1e-15


def test_mr2loss_decays_by_rho_in_float64():
    # rho went through float32 (torch.where of two Python numbers): 0.9 decayed by
    # 0.899999976, so counts, means and the tilt's class losses were off by 3e-8.
    criterion = MR2Loss(2, 1, c_bar=None, lam=0.0, class_tilt=1.0).double()
    losses = []
    for v in (0.0, 1.0):
        logits = torch.tensor([[v, 0.0]], dtype=torch.float64)
        criterion(logits, torch.full((1, 1), v, dtype=torch.float64), torch.tensor([0]))
        losses.append(-torch.log_softmax(logits[0], 0)[0].item())
    assert criterion.moment_count[0].item() == 0.9 + 1
    running = criterion.running_class_loss[0].item()
    assert running == pytest.approx(0.9 * losses[0] + 0.1 * losses[1], rel=1e-14, abs=0)


def test_mr2loss_tilt_in_float16_is_finite():
    # A rare class's weight q/π (7e4) was cast to float16: inf, and every step overflowed.
    criterion = MR2Loss(3, 4, lam=0.0, class_tilt=2.0)
    criterion.class_samples.copy_(torch.tensor([70000, 70000, 1]))
    criterion.running_class_loss.copy_(torch.tensor([0.1, 0.1, 6.0]))
    logits = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [1.0, 0, -2.0]])
    features, target = torch.randn(3, 4), torch.tensor([0, 1, 2])
    criterion.eval()
    full = criterion(logits, features, target)
    half = criterion(logits.half(), features.half(), target)
    assert torch.isfinite(half) and float(half) == pytest.approx(float(full), rel=1e-2)


def test_a_class_loss_left_out_of_the_ema_is_left_out_of_the_shares():
    criterion = MR2Loss(3, 4, lam=0.0, class_tilt=1.0)
    features, target = torch.randn(6, 4), torch.arange(6) % 3
    criterion(torch.randn(6, 3), features, target)
    before = criterion.class_samples.clone()
    logits = torch.randn(6, 3)
    logits[1, 0] = float("inf")  # class 1's loss is not finite in this batch
    criterion(logits, features, target)
    assert criterion.class_samples.tolist() == (before + torch.tensor([2, 0, 2])).tolist()


def test_the_running_spread_keeps_its_precision_when_the_mean_moves_far():
    # With rho = 0 each batch replaces the earlier ones, and the mean jumps by 2000: the
    # first merge subtracted the jump from deviations about the old mean, and cancelled
    # (float32: 4.13 where float64 gave 0.18).
    g = torch.Generator().manual_seed(0)
    single, double = MR2Loss(2, 16, rho=0.0), MR2Loss(2, 16, rho=0.0).double()
    for step in range(20):
        features = torch.randn(64, 16, generator=g, dtype=torch.float64) * 0.1
        features += 1000 * (-1) ** step
        labels = torch.arange(64) % 2
        single.update(features.float(), labels)
        double.update(features, labels)
    torch.testing.assert_close(single.stats().msd.double(), double.stats().msd, rtol=1e-3, atol=0)


def test_moments_made_before_the_centred_sum_still_give_statistics():
    # ClassMoments gained m2; six-field sums (and modules pickled whole before it) work.
    features, labels, k = _data(4, n=40)
    moments = update_moments(
        ClassMoments.zeros(k, features.shape[1], dtype=features.dtype), features, labels
    )
    old = moments._replace(m2=None)
    torch.testing.assert_close(moments_statistics(old).msd, moments_statistics(moments).msd)
    torch.testing.assert_close(
        update_moments(old, features * 2, labels).m2,
        update_moments(moments, features * 2, labels).m2,
    )
    criterion = MR2Loss(k, features.shape[1]).double()
    criterion.update(features, labels)
    state = criterion.__dict__.copy()  # as a module pickled before m2 and sync_stats
    kept = {n: b for n, b in criterion._buffers.items() if n not in ("moment_m2", "stats_p")}
    state["_buffers"] = {n: b for n, b in kept.items() if n != "stats_normalize"}
    del state["sync_stats"], state["process_group"]
    restored = MR2Loss.__new__(MR2Loss)
    restored.__setstate__(state)
    torch.testing.assert_close(restored.stats().msd, criterion.stats().msd)
    # it saves and loads its state like a module made now
    assert {"stats_p", "stats_normalize"} <= set(restored.state_dict())
    restored.load_state_dict(criterion.state_dict())
    restored(torch.zeros(len(labels), k, dtype=torch.float64), features, labels)


@pytest.mark.parametrize("other", [{"p": 2.0}, {"normalize": True}])
def test_a_state_measured_with_another_p_or_normalize_is_refused(other):
    # The running sums of p = 3 (dev_p in L3) loaded into a p = 2 module, or sums of raw φ
    # into a normalising one, gave other statistics and margins without a word.
    features, labels, k = _data(3, n=40)
    criterion = MR2Loss(k, features.shape[1], p=3.0).double()
    criterion.update(features, labels)
    state = criterion.state_dict()
    loaded = MR2Loss(k, features.shape[1], **{"p": 3.0, **other}).double()
    saved = {"p": "p=3.0", "normalize": "normalize=False"}[next(iter(other))]  # a flag as one
    with pytest.raises(RuntimeError, match=f"measured with {saved}, and this module"):
        loaded.load_state_dict(state)
    assert not loaded.moment_count.any()  # nothing loaded
    with pytest.raises(RuntimeError, match="measured with"):
        loaded.load_state_dict(state, strict=False)
    same = MR2Loss(k, features.shape[1], p=3.0).float()  # the saved p compared as saved
    same.load_state_dict(state)
    torch.testing.assert_close(same.margins().double(), criterion.margins(), rtol=1e-6, atol=0)
    del state["stats_p"], state["stats_normalize"]  # as saved before they were recorded
    loaded.load_state_dict(state)
    assert loaded.moment_count.any()
    with torch.device("meta"):  # assign=True into a module built on meta: nothing to compare
        on_meta = MR2Loss(k, features.shape[1], p=3.0)
    on_meta.load_state_dict(state, assign=True)
    assert on_meta.moment_count.any()


def test_a_nested_loss_is_named_and_its_p_compared_as_stored():
    # The refusal named no submodule; p is compared as it was saved, through .double() too.
    nested = torch.nn.ModuleDict({"crit": MR2Loss(3, 4, p=1.7)}).double()
    state = nested.state_dict()
    torch.nn.ModuleDict({"crit": MR2Loss(3, 4, p=1.7)}).load_state_dict(state)
    with pytest.raises(RuntimeError, match="class statistics of crit were measured with p=1.7"):
        torch.nn.ModuleDict({"crit": MR2Loss(3, 4, p=2.0)}).load_state_dict(state)


@pytest.mark.parametrize("saved, loaded", [(1e39, math.inf), (math.inf, 1e39), (1e10 + 1, 1e10)])
@pytest.mark.parametrize("cast", ["float", "half", "double"])
def test_p_is_kept_exactly_in_the_state(saved, loaded, cast):
    # stats_p was a float32 buffer: p = 1e39 was saved as inf, and loaded into a module of
    # p = inf (and back) without a word, as 1e10 + 1 into 1e10.
    state = getattr(MR2Loss(3, 4, p=saved), cast)().state_dict()
    assert state["stats_p"].dtype == torch.float64 and state["stats_p"].item() == saved
    MR2Loss(3, 4, p=saved).load_state_dict(state)
    with pytest.raises(RuntimeError, match=re.escape(f"measured with p={saved!r}, and")):
        MR2Loss(3, 4, p=loaded).load_state_dict(state)
    # A state saved with p in float32 (before it was kept exactly) is compared as saved.
    old = state | {"stats_p": state["stats_p"].float()}
    for p in (saved, float(old["stats_p"])):
        module = MR2Loss(3, 4, p=p)
        module.load_state_dict(old)
        assert module.stats_p.item() == p and module.stats_p.dtype == torch.float64


@pytest.mark.parametrize("whole", [False, True])
def test_a_state_of_p_rounded_to_float32_then_cast_to_float64_loads(whole):
    # Before p was kept exactly, .double() cast its float32 rounding (1.7000000476837158):
    # such a state (version 1) was refused by a module of p = 1.7, its state then compared
    # in float64, as a whole module pickled so kept it rounded.
    module = MR2Loss(3, 4, p=1.7).double()
    module.stats_p = module.stats_p.float().double()  # as the module of version 1 held it
    if whole:  # torch.save(module) then torch.load
        module = pickle.loads(pickle.dumps(module))
        assert module.stats_p.item() == 1.7
        return
    state = module.state_dict()
    state._metadata[""]["version"] = 1
    MR2Loss(3, 4, p=1.7).load_state_dict(state)
    # Without its version (a dict copy, as one stripping DDP's "module.", or safetensors),
    # read as torch reads it (the first): it was refused so still.
    MR2Loss(3, 4, p=1.7).load_state_dict(dict(state))
    state._metadata[""]["version"] = 2
    with pytest.raises(RuntimeError, match="measured with p=1.7000000476837158, and"):
        MR2Loss(3, 4, p=1.7).load_state_dict(state)


@pytest.mark.parametrize("version", [None, 2])
@pytest.mark.parametrize(
    "saved, loaded", [(1.7, 1.7000000476837158), (1e39, math.inf), (math.inf, 1e39)]
)
def test_a_state_of_p_not_a_float32_is_compared_exactly_whatever_its_version(
    version, saved, loaded
):
    # A p that float32 cannot hold was kept exactly (version 2), its _metadata lost or not.
    state = MR2Loss(3, 4, p=saved).state_dict()
    state = dict(state) if version is None else state
    with pytest.raises(RuntimeError, match=re.escape(f"measured with p={saved!r}, and")):
        MR2Loss(3, 4, p=loaded).load_state_dict(state)


def test_compactness_is_exact_in_float32_under_a_large_common_mean():
    # ‖a‖² + ‖b‖² − 2a·b of features of norm 4000 (spread 0.16) left float32 errors of about
    # 2 in distances of 0.3: the loss was 10.0 against 2.86 in float64, its gradient off,
    # and τ = 2 s̄ floored at 3.8 instead of 0.32.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(16, generator=g, dtype=torch.float64)
    x64 = base / base.norm() * 4000 + 0.1 * torch.randn(64, 16, generator=g, dtype=torch.float64)
    x32, y = x64.float(), torch.arange(64) % 4
    s_bar = float(((x64 - x64.mean(0)) ** 2).sum(1).mean())
    losses = []
    for x in (x32.clone().requires_grad_(), x64.clone().requires_grad_()):
        loss = compactness_loss(x, y, s_bar, 2 * s_bar)
        loss.backward()
        losses.append((loss.item(), x.grad.double()))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-4)
    torch.testing.assert_close(
        losses[0][1], losses[1][1], rtol=1e-2, atol=1e-3 * losses[1][1].abs().max().item()
    )
    tau = compactness_tau(class_statistics(x32, y, 4))
    assert float(tau) == pytest.approx(
        2 * float(mean_spread(class_statistics(x64, y, 4))), rel=1e-3
    )


def test_an_older_state_loads_into_modules_built_on_meta_and_averages():
    # An older state (no stats_p) was compared with the module's own buffer: after
    # to_empty, uninitialised memory (refused as "p=1.39e-09"); with assign=True the
    # buffers stayed on meta. A bool buffer broke AveragedModel's average of buffers.
    source = MR2Loss(3, 4, p=2.5)
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    source(x @ torch.ones(4, 3), x, torch.arange(12) % 3)
    old = {k: v for k, v in source.state_dict().items() if not k.startswith("stats_")}
    with torch.device("meta"):
        empty, assigned = MR2Loss(3, 4, p=2.5), MR2Loss(3, 4, p=2.5)
    empty.to_empty(device="cpu").load_state_dict(old)
    assigned.load_state_dict(old, assign=True)
    for module in (empty, assigned):
        assert float(module.stats_p) == 2.5 and not module.stats_p.is_meta
        torch.testing.assert_close(module.margins(), source.margins())
    averaged = torch.optim.swa_utils.AveragedModel(source, use_buffers=True)
    for _ in range(2):
        averaged.update_parameters(source)
    assert float(averaged.module.stats_p) == 2.5
    # A bool stats_normalize (as saved for a while) is loaded as float32, assign=True too.
    with_bool = source.state_dict() | {"stats_normalize": torch.tensor(False)}
    assigned.load_state_dict(with_bool, assign=True)
    assert assigned.stats_normalize.dtype == torch.float32


def test_an_averaged_state_of_p_inf_loads():
    # AveragedModel averages stats_p too: inf + w·(inf − inf) is NaN, and the averaged
    # state was refused by every module, p = inf too ("measured with p=nan").
    source = MR2Loss(3, 4, p=math.inf)
    averaged = torch.optim.swa_utils.AveragedModel(source, use_buffers=True)
    for _ in range(2):
        averaged.update_parameters(source)
    state = averaged.module.state_dict()
    MR2Loss(3, 4, p=math.inf).load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"measured with p=inf, and"):
        MR2Loss(3, 4, p=2.0).load_state_dict(state)


def test_compactness_is_exact_in_float32_beside_a_far_row_of_another_class():
    # Centred on the batch's mean, one row of norm 1e5 in a class of its own moved every
    # row by 1e5 / B: the float32 loss was 4.86 against 1.07, its gradient all wrong.
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(16, 256, generator=g, dtype=torch.float64) * 0.05
    y = torch.arange(16) % 4
    y[0], x64[0] = 4, 1e5 / 16
    grads = []
    for x in (x64.float().requires_grad_(), x64.clone().requires_grad_()):
        loss = compactness_loss(x, y, 0.64, 1.28)
        grads.append((loss.item(), torch.autograd.grad(loss, x)[0].double()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    error = (grads[0][1] - grads[1][1]).norm() / grads[1][1].norm()
    assert error < 1e-5
    # Integer features are distances too (the mean of an integer tensor failed).
    distances = pairwise_sq_distances(torch.tensor([[0, 1], [3, 5], [1, 1]]))
    torch.testing.assert_close(distances, torch.tensor([[0.0, 25, 1], [25, 0, 20], [1, 20, 0]]))


def test_compactness_mean_of_subnormal_float32_weights_is_float64_s():
    # The mean weighs sample i by w_i / W_{y_i}: class sums W below float32's smallest
    # normal number were clamped up to it, and the shares of weights of 1e-40 summed to
    # less than 1: half of float64's loss. (τ small enough that the loss, whose partners
    # count as w copies, shows above float32's rounding.)
    features, labels, _ = _data(5, n=30)
    weight = torch.tensor([1, 2, 3] * 10, dtype=torch.float64) * 1e-40
    losses = [
        compactness_loss(features.to(dtype), labels, 0.0, 0.05, sample_weight=weight.to(dtype))
        for dtype in (torch.float32, torch.float64)
    ]
    torch.testing.assert_close(losses[0].double(), losses[1], rtol=1e-4, atol=0)


def test_compactness_is_exact_in_float32_beside_a_far_row_of_weight_zero_in_the_class():
    # A row of weight 0 takes no part, its distance from its class's rows included: each
    # row is taken relative to the first row of its class of positive weight. Relative to
    # the far row of weight 0 first in the class, the float32 distances of 0.05-spread rows
    # lost their precision (kills: the first row of the class whatever its weight).
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(16, 256, generator=g, dtype=torch.float64) * 0.05
    y, w = torch.arange(16) % 4, torch.ones(16, dtype=torch.float64)
    x64[0], w[0] = 1e5 / 16, 0.0
    got = compactness_loss(x64.float(), y, 0.64, 1.28, sample_weight=w.float())
    want = compactness_loss(x64, y, 0.64, 1.28, sample_weight=w)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


@pytest.mark.parametrize("target", [-100, -1, 100])
def test_margin_cross_entropy_refuses_targets_out_of_range(target):
    """-100, cross_entropy's ignore_index, with 100 classes: margins[-100] wrapped to class
    0's margin, cross_entropy then gave the sample a loss of 0, and "mean" counted it (4.77
    where cross_entropy, ignoring it, gives 6.37). Refused, as -1 and 100 are."""
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, target, 3])
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        margin_cross_entropy(logits, labels, torch.ones(100))


@pytest.mark.parametrize(
    "n_logits, n_margins, weight_shape, match",
    [(1, 3, None, r"logits \(n_samples, n_classes\)"),
     (4, 4, None, r"margins \(n_classes,\)"),
     (4, 3, (4, 1), r"sample_weight.shape == \(4, 1\), expected \(4,\)"),
     (4, 3, (1,), r"sample_weight.shape == \(1,\), expected \(4,\)")],
)  # fmt: skip
def test_margin_cross_entropy_refuses_shapes_that_broadcast(
    n_logits, n_margins, weight_shape, match
):
    """They were taken silently: one row of logits scored all 4 targets (cross_entropy
    refuses it), weights (B, 1) made the loss (B, B), and weights (1,) gave the sum for
    "mean"."""
    logits = torch.randn(n_logits, 3, generator=torch.Generator().manual_seed(0))
    weight = None if weight_shape is None else torch.ones(weight_shape)
    with pytest.raises(ValueError, match=match):
        margin_cross_entropy(logits, torch.tensor([0, 1, 2, 1]), torch.ones(n_margins), weight)


@pytest.mark.parametrize("target_shape", [(4, 3), (4, 1)])
def test_margin_cross_entropy_refuses_targets_that_are_no_vector(target_shape):
    """One-hot targets of integers, F.one_hot(y) (4, 3), were taken silently: a loss of
    shape (4, 3) for "none" and its mean for "mean" (cross_entropy read the (4, 4, 3)
    quotients as 4 classes at 3 positions); (4, 1) ended in torch's "Expected target size"."""
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, 2, 1])
    target = torch.nn.functional.one_hot(target, 3) if target_shape == (4, 3) else target[:, None]
    with pytest.raises(ValueError, match=r"targets \(n_samples,\) of class indices \(not one-hot"):
        margin_cross_entropy(logits, target, torch.ones(3), reduction="none")


@pytest.mark.parametrize(
    "n_features, target_shape, s_bar, weight_shape, match",
    [(1, (4,), 1.0, None, r"features \(n_samples, n_features\)"),
     (3, (4, 1), 1.0, None, r"targets \(n_samples,\)"),
     (3, (4,), torch.ones(4), None, r"scalar s_bar and tau; got .* \(4,\) and \(\)"),
     (3, (4,), 1.0, (4, 1), r"sample_weight.shape == \(4, 1\), expected \(4,\)")],
)  # fmt: skip
def test_compactness_loss_refuses_inconsistent_shapes(
    n_features, target_shape, s_bar, weight_shape, match
):
    """A vector s̄ of B entries (the classes' spreads, say) broadcast along the columns,
    silently; the other shapes failed inside torch's products (IndexError, "Expected size
    for first two dimensions of batch2 tensor")."""
    features = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    features = features[0] if n_features == 1 else features
    target = torch.tensor([0, 1, 1, 1]).reshape(target_shape)
    weight = None if weight_shape is None else torch.ones(weight_shape)
    with pytest.raises(ValueError, match=match):
        compactness_loss(features, target, s_bar, sample_weight=weight)
    one = compactness_loss(torch.randn(4, 3), torch.tensor([0, 1, 1, 1]), torch.tensor([0.5]))
    assert one.shape == ()  # a one-element s̄ is a scalar still


@pytest.mark.parametrize("tau", [0, 0.0, -1.0, float("nan")])
def test_compactness_loss_refuses_a_tau_that_is_not_positive(tau):
    # τ = 0 gave a loss of inf; τ = -1 a finite loss that pushes each class apart.
    features = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="tau must be a number > 0"):
        compactness_loss(features, torch.tensor([0, 0, 0, 1, 1, 1]), 1.0, tau)


@pytest.mark.parametrize(
    "target",
    [
        torch.tensor([0.0, 1.0, 2.0, 1.0]),
        torch.full((4, 3), 1 / 3),
        torch.tensor([1, 0, 1, 1]).bool(),
    ],
)
def test_margin_cross_entropy_refuses_targets_that_are_not_class_indices(target):
    # Float class indices and cross_entropy's soft targets (B, K) ended in torch's
    # "gather(): Expected dtype int32/int64 for index".
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="targets must be class indices .* not supported"):
        margin_cross_entropy(logits, target, torch.ones(3))


def test_weighted_margin_cross_entropy_of_many_float16_rows_is_their_mean():
    # Σw·ℓ (about 10⁵) of 40,000 float16 rows passed 65504: the weighted mean was inf.
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(40_000, 3, generator=gen)).half()
    target, weight = torch.arange(40_000) % 3, torch.ones(40_000, dtype=torch.float16)
    value = margin_cross_entropy(logits, target, torch.ones(3, dtype=torch.float16), weight)
    expected = margin_cross_entropy(logits.float(), target, torch.ones(3))
    assert value.dtype == torch.float16
    torch.testing.assert_close(value.float(), expected, rtol=1e-2, atol=0)


def test_weighted_margin_cross_entropy_is_the_mean_of_repeated_rows():
    torch.manual_seed(0)
    logits, target = torch.randn(12, 4, dtype=torch.float64), torch.arange(12) % 4
    margins = torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=torch.float64)
    counts = torch.tensor([0, 1, 3, 2] * 3)
    weighted = margin_cross_entropy(logits, target, margins, sample_weight=counts.double())
    repeated = margin_cross_entropy(
        logits.repeat_interleave(counts, 0), target.repeat_interleave(counts), margins
    )
    torch.testing.assert_close(weighted, repeated)
    total = margin_cross_entropy(logits, target, margins, counts.double(), reduction="sum")
    torch.testing.assert_close(weighted, total / counts.sum())


def test_margin_cross_entropy_without_reduction_weighs_each_sample():
    # reduction="none" gives w_i·ℓ_i, as compactness_loss does; "sum" is their sum.
    # Reference: the log-softmax of z / γ_y in NumPy.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    target = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    margins = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    weight = torch.tensor([0.0, 1.0, 2.5, 0.5, 3.0, 1.0, 0.25, 2.0], dtype=torch.float64)
    z = logits.numpy() / margins.numpy()[target.numpy()][:, None]
    top = z.max(1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(1))
    ref = weight.numpy() * (lse - z[np.arange(8), target.numpy()])
    got = margin_cross_entropy(logits, target, margins, weight, reduction="none")
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)
    total = margin_cross_entropy(logits, target, margins, weight, reduction="sum")
    np.testing.assert_allclose(total.item(), ref.sum(), rtol=1e-12)


# Class statistics on hand-made inputs, each value worked out by hand.


def test_all_zero_features_leave_every_margin_at_c_bar():
    # a_k = 0 for every class: nothing is measured, and the margins are uniform at c̄ (an
    # "a_k >= 0 is measured" reading gave every class a margin of 0).
    from mr2_probe._stats import class_margins, class_statistics

    np.testing.assert_array_equal(margins_from_difficulty(torch.zeros(3), 1.0), [1.0, 1.0, 1.0])
    stats = class_statistics(torch.zeros(4, 2), torch.tensor([0, 0, 1, 1]), 2)
    np.testing.assert_array_equal(class_margins(stats, 1.0), [1.0, 1.0])
    # A class whose a_k is rounding next to a measured one is unmeasured too (γ = c̄), not
    # given a margin of 2e-10 that divides its logits by about zero.
    margins = margins_from_difficulty(torch.tensor([1.0, 1e-30]), 1.0)
    np.testing.assert_array_equal(margins, [1.0, 1.0])


def test_class_statistics_of_weights_below_one():
    # A class of total weight 0.2: its mean and spread divide by 0.2, not by a count
    # floored at 1.
    from mr2_probe._stats import class_statistics

    X, y = torch.tensor([[0.0], [2.0], [10.0]]), torch.tensor([0, 0, 1])
    stats = class_statistics(X, y, 2, sample_weight=torch.full((3,), 0.1))
    torch.testing.assert_close(stats.mean, torch.tensor([[1.0], [10.0]]))
    torch.testing.assert_close(stats.msd, torch.tensor([1.0, 0.0]))


def test_mean_spread_and_tau_take_the_l2_spread_and_its_floor():
    from mr2_probe._stats import class_statistics, mean_spread

    # s̄ is the L2 spread whatever p the margins take: rows (0, 0) and (2, 2) are √8 apart,
    # each √2 from the mean, msd_l2 = 2 (the L3 spread, 2^{4/3} = 1.587..., is the margins').
    stats = class_statistics(torch.tensor([[0.0, 0.0], [2.0, 2.0]]), torch.tensor([0, 0]), 1, p=3.0)
    assert float(mean_spread(stats)) == pytest.approx(2.0)
    # Copies of one row far from the origin: s̄ is rounding, and τ is floored at the
    # rounding of rows of norm 1414 (2·ε·ε·‖μ‖² = 5.68e-8 in float32), not at float32's tiny.
    copies = class_statistics(torch.full((3, 2), 1000.0), torch.zeros(3, dtype=torch.long), 1)
    eps = torch.finfo(torch.float32).eps
    assert float(compactness_tau(copies)) == pytest.approx(2 * eps * eps * 2e6, rel=1e-3)
    # A class with no sample stays out of the floor's average, as it does of s̄.
    absent = class_statistics(torch.full((3, 2), 1000.0), torch.zeros(3, dtype=torch.long), 2)
    assert float(compactness_tau(absent)) == pytest.approx(2 * eps * eps * 2e6, rel=1e-3)


def test_lp_norms_of_half_precision_rows_stay_half_precision():
    # Returned as float32, they made the streamed moments of float16 features fail
    # ("index_add_(): self (Half) and source (Float) must have the same scalar type").
    from mr2_probe._stats import ClassMoments, update_moments

    assert lp_norm_sq(torch.ones(1, 3, dtype=torch.float16), 3.0).dtype == torch.float16
    moments = ClassMoments.zeros(2, 3, dtype=torch.float16)
    X = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=torch.float16)
    update_moments(moments, X, torch.tensor([0, 0, 1, 1]), p=3.0)


def test_a_class_seen_first_is_centred_on_its_batch_mean():
    # Rows (10, 0), (12, 1), (11, 3), mean (11, 4/3): deviations from it, not from 0.
    from mr2_probe._stats import ClassMoments, moments_statistics, update_moments

    X = torch.tensor([[10.0, 0.0], [12.0, 1.0], [11.0, 3.0]], dtype=torch.float64)
    moments = update_moments(
        ClassMoments.zeros(1, 2, dtype=torch.float64), X, torch.zeros(3, dtype=torch.long), p=3.0
    )
    deviation = X - X.mean(0)
    expected_p = (deviation.abs().pow(3).sum(1).pow(2 / 3)).sum()  # Σ ‖x − μ‖₃²
    torch.testing.assert_close(moments.dev_p.squeeze(), expected_p)
    torch.testing.assert_close(moments.dev_2.squeeze(), deviation.square().sum())
    # (streamed, the spread is the unbiased one: over n − 1 = 2)
    torch.testing.assert_close(moments_statistics(moments, 3.0).msd, expected_p[None] / 2)


def test_an_older_state_s_spread_is_never_negative():
    # Sums of squares minus squares of sums cancel to rounding below zero for copies of
    # one value; the spread of a state without m2 is clamped at 0.
    from mr2_probe._stats import ClassMoments, centred_sum, moments_statistics, update_moments

    moments = update_moments(
        ClassMoments.zeros(1, 1), torch.full((5, 1), 0.7), torch.zeros(5, dtype=torch.long)
    )._replace(m2=None)
    assert float(centred_sum(moments).min()) == 0.0
    assert float(moments_statistics(moments).msd.min()) == 0.0


@pytest.mark.parametrize("labels, error, match", [
    # index_add_'s "index out of range in self" and "Expected dtype int32/int64 for index"
    (torch.tensor([0, 1, 3]), ValueError, "Label 3 is out of bounds: the classes are 0..2"),
    (torch.tensor([0, -1, 2]), ValueError, "Label -1 is out of bounds: the classes are 0..2"),
    (torch.tensor([0, 2**63 + 5], dtype=torch.uint64), ValueError, f"Label {2**63 + 5} is out"),
    (torch.tensor([0, 2], dtype=torch.uint16), None, None),
    (torch.tensor([0.0, 1.0, 2.0]), TypeError, "class indices .*, got torch.float32"),
    (torch.tensor([True, False, True]), TypeError, "class indices .*, got torch.bool"),
])  # fmt: skip
def test_update_moments_refuses_labels_that_are_no_class_indices(labels, error, match):
    features = torch.randn(len(labels), 2)
    if error is None:  # (wide unsigned labels in range are taken)
        moments = update_moments(ClassMoments.zeros(3, 2), features, labels)
        assert moments.count.tolist() == [1.0, 0.0, 1.0]
        assert class_statistics(features, labels, 3).count.tolist() == [1.0, 0.0, 1.0]
        return
    with pytest.raises(error, match=match):
        update_moments(ClassMoments.zeros(3, 2), features, labels)
    # class_statistics (and its chunked form) failed in index_add_'s words, as update did
    with pytest.raises(error, match=match):
        class_statistics(features, labels, 3)


def test_overall_mean_weighs_each_class_by_its_samples():
    from mr2_probe._stats import class_statistics, overall_mean

    stats = class_statistics(
        torch.tensor([[0.0], [0.0], [0.0], [3.0]]), torch.tensor([0, 0, 0, 1]), 2
    )
    torch.testing.assert_close(overall_mean(stats), torch.tensor([0.75]))


def test_pairwise_distances_are_exact_in_float32_under_a_large_common_mean():
    # Rows of norm 4000 with a spread of 0.1: uncentred, ‖a‖² + ‖b‖² − 2a·b left float32
    # errors of about 6 in distances below 1.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(16, generator=g, dtype=torch.float64)
    x64 = base / base.norm() * 4000 + 0.1 * torch.randn(32, 16, generator=g, dtype=torch.float64)
    exact = torch.cdist(x64, x64).square()
    d = pairwise_sq_distances(x64.float())
    assert d.dtype == torch.float32
    torch.testing.assert_close(d.double(), exact, atol=1e-2, rtol=0)


def test_pairwise_distances_are_never_negative():
    # Repeated rows are at distance 0; the Gram form's rounding falls either side of it.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g) * 10
    d = pairwise_sq_distances(torch.cat([x, x]))
    assert (d >= 0).all()


def test_compactness_weight_counts_a_sample_s_own_copies():
    # Sample 0 of weight 3 is three copies: each pairs with its 2 other copies (distance 0)
    # and with sample 1 (distance 1). s̄ = 0.25, τ = 1: exponents −0.5 and 0.5.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 0])
    w = torch.tensor([3.0, 1.0], dtype=torch.float64)
    l0 = math.log(1 + 2 * math.exp(-0.5) + math.exp(0.5))
    l1 = math.log(1 + 3 * math.exp(0.5))
    got = compactness_loss(x, y, 0.25, 1.0, sample_weight=w)
    assert float(got) == pytest.approx((3 * l0 + l1) / 4, rel=1e-12)
    repeated = compactness_loss(x[[0, 0, 0, 1]], y[[0, 0, 0, 1]], 0.25, 1.0)
    torch.testing.assert_close(got, repeated)


@pytest.mark.parametrize("kwargs", [dict(p=1.0), dict(p=1.0, normalize=True)])
def test_mr2_loss_accepts_p_of_one(kwargs):
    # p = 1 is the smallest norm the docstring allows (p >= 1): the L1 statistics must be
    # buildable and give a finite, trainable loss, not be refused as out of range.
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(3, 4, lam=0.5, **kwargs)
    features = torch.randn(12, 4, generator=gen, requires_grad=True)
    logits = features @ torch.randn(4, 3, generator=gen)
    loss = criterion(logits, features, torch.arange(12) % 3)
    loss.backward()
    assert criterion.p == 1.0 and float(criterion.stats_p) == 1.0
    assert torch.isfinite(loss) and torch.isfinite(features.grad).all()


def test_a_module_pickled_before_sync_stats_existed_does_not_synchronise():
    # A module saved whole before the option existed never synchronised its statistics:
    # restored, it must keep doing so (sync_stats False, default group), or a multi-process
    # job would start issuing collectives that the other processes do not expect.
    criterion = MR2Loss(3, 4)
    state = criterion.__dict__.copy()
    del state["sync_stats"], state["process_group"]
    restored = MR2Loss.__new__(MR2Loss)
    restored.__setstate__(state)
    assert restored.sync_stats is False and restored.process_group is None


def test_mr2_loss_default_tau_keeps_tiny_features_gradients_tame():
    # The scale-free τ = 2 s̄ is floored (at 2e-12): features that a backbone has shrunk to
    # about 1e-10 have a spread near 1e-20, and a temperature that small turned the
    # compactness term's gradient into about 1e8, a step that throws the features far away.
    gen = torch.Generator().manual_seed(0)
    criterion = MR2Loss(3, 4, lam=0.5, tau=None)
    target = torch.arange(12) % 3
    features = (torch.randn(12, 4, generator=gen) * 1e-10).requires_grad_()
    logits = torch.randn(12, 3, generator=gen)
    criterion(logits, features.detach(), target)  # statistics from a first batch
    criterion(logits, features, target).backward()
    assert torch.isfinite(features.grad).all()
    assert float(features.grad.abs().max()) < 1.0


def test_a_small_but_measured_class_keeps_its_small_margin():
    # a_k^{1/3} at 1e-4 of the largest class's is above the 1e-6 of rounding: the class is
    # measured, and its margin is the formula's c̄·K·a_k^{1/3} / Σ_j a_j^{1/3}, not c̄.
    margins = margins_from_difficulty(torch.tensor([1.0, 1e-12]), 1.0)
    torch.testing.assert_close(margins, torch.tensor([2.0, 2e-4]) / (1 + 1e-4))


def test_moments_difficulty_refuses_an_unknown_difficulty():
    with pytest.raises(ValueError, match="difficulty must be one of"):
        moments_difficulty(ClassMoments.zeros(2, 3), difficulty="median")


@pytest.mark.parametrize("params", [{}, {"tau": None}, {"class_tilt": 1.0}, {"lam": 0.0}])
def test_an_empty_batch_is_a_nan_loss_and_leaves_the_statistics(params):
    # With lam > 0 (the default) the compactness loss's argmax refused the empty rows, an
    # IndexError (under sync_stats, after that rank's collectives: the others then hung).
    crit = MR2Loss(n_classes=3, n_features=4, **params)
    crit(torch.randn(6, 3), torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2]))
    before = {k: v.clone() for k, v in crit.state_dict().items()}
    features = torch.zeros(0, 4, requires_grad=True)
    loss = crit(features @ torch.randn(4, 3), features, torch.zeros(0, dtype=torch.long))
    assert torch.isnan(loss)  # as F.cross_entropy's of an empty batch
    loss.backward()
    assert features.grad.shape == (0, 4)
    for key, value in crit.state_dict().items():
        torch.testing.assert_close(value, before[key], equal_nan=True, msg=key)
    empty = compactness_loss(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0)
    assert float(empty) == 0.0
    weighted = compactness_loss(
        torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0, sample_weight=torch.zeros(0)
    )
    assert float(weighted) == 0.0


@pytest.mark.parametrize("p", [2.0, 3.0])
def test_one_batch_margins_are_the_classifiers_for_the_moment_difficulty(p):
    # docs/estimator.md: MR2Loss's spreads are unbiased, the classifier's plain means; the paper's
    # a_k = ‖μ_k‖_p² + msd_k agrees, the spread alone is n_k / (n_k − 1) times larger.
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([0] * 2 + [1] * 8 + [2] * 4)
    features = torch.randn(len(y), 4, generator=gen, dtype=torch.float64) + y[:, None]
    stats = class_statistics(features, y, 3, p=p)
    moment = MR2Loss(3, 4, p=p, difficulty="moment").double()
    moment.update(features, y)
    torch.testing.assert_close(moment.margins(), class_margins(stats, 1.0, p, "moment"))
    spread = MR2Loss(3, 4, p=p, difficulty="spread").double()
    spread.update(features, y)
    n = torch.tensor([2.0, 8.0, 4.0], dtype=torch.float64)
    unbiased = stats._replace(msd=stats.msd * n / (n - 1))
    torch.testing.assert_close(spread.margins(), class_margins(unbiased, 1.0, p, "spread"))


def test_repr_shows_the_sizes_and_the_arguments_not_at_their_defaults():
    assert repr(MR2Loss(10, 512)) == "MR2Loss(n_classes=10, n_features=512)"
    assert repr(MR2Loss(3, 4, c_bar=None, normalize=True, p=3, class_tilt=2)) == (
        "MR2Loss(n_classes=3, n_features=4, c_bar=None, normalize=True, class_tilt=2.0)"
    )


def test_a_loss_is_built_after_torch_s_default_device_was_set_back_to_none():
    # torch < 2.6 (2.5, the oldest supported): torch.get_default_device() failed after
    # torch.set_default_device(None) ("'NoneType' object has no attribute 'device'"), and
    # so did every MR2Loss built after it.
    torch.set_default_device("meta")
    try:
        assert MR2Loss(3, 4).stats_p.device.type == "meta"  # torch's default, as before
    finally:
        torch.set_default_device(None)
    loss = MR2Loss(3, 4)
    assert loss.stats_p.device.type == "cpu" and loss.stats_p.dtype == torch.float64
