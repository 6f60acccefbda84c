"""The class statistics and margins of mr2_probe/_stats.py against independent references.

Found by mutation testing: each test kills a mutant that the rest of the suite let live.

Each test checks against an independent reference (float64 torch.linalg / NumPy / a
literal loop), not a restatement of the implementation.
"""

import numpy as np
import pytest
import torch

import mr2_probe
from mr2_probe import _stats
from tests.reference_mr2 import class_statistics_loop


def _lp_sq_ref(v, p):
    """‖v‖_p² of each row in float64 NumPy."""
    v = np.asarray(v, dtype=np.float64)
    return np.sum(np.abs(v) ** p, axis=-1) ** (2.0 / p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [3.0, 7.0, 20.0])
def test_lp_norm_sq_of_half_precision_rows_is_rounded_once(dtype, p):
    # Kills: no float32 detour for half-precision rows in lp_norm_sq (the powers of
    # rounded ratios lose several ulps: 1.8e-2 relative in bfloat16 at p = 3).
    gen = torch.Generator().manual_seed(0)
    v = (torch.rand(64, 300, generator=gen, dtype=torch.float64) * 3 - 1.5).to(dtype)
    got = _stats.lp_norm_sq(v, p)
    assert got.dtype == dtype
    ref = _lp_sq_ref(v.double().numpy(), p)
    rel = np.abs(got.double().numpy() - ref) / ref
    assert rel.max() < torch.finfo(dtype).eps


def test_lp_norm_sq_of_one_dominant_entry_at_large_p_is_finite():
    # Kills: rows scaled by their mean instead of their largest entry (the ratio
    # max/mean = d = 100 to the 20th power overflows float32).
    v = torch.zeros(3, 100)
    v[0, 0] = 1.0
    v[1, 5] = -2.0
    v[2, :2] = torch.tensor([3.0, 1.0])
    got = _stats.lp_norm_sq(v, 20.0)
    np.testing.assert_allclose(got.numpy(), _lp_sq_ref(v.numpy(), 20.0), rtol=1e-5)


@pytest.mark.parametrize("p", [2.0, 3.0])
def test_chunked_statistics_apply_the_transform_in_both_passes(p):
    # Kills: the spread pass measuring the raw inputs instead of transform(x).
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(60, 4, generator=gen, dtype=torch.float64)
    y = torch.arange(60) % 3
    P = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    chunks = lambda: [(X[:25], y[:25], None), (X[25:], y[25:], None)]  # noqa: E731
    stats = mr2_probe.class_statistics_chunked(chunks, 3, 5, p, transform=lambda x: x @ P)
    mean, msd, msd2, count = (t.numpy() for t in class_statistics_loop(X @ P, y, 3, p))
    np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-10)
    np.testing.assert_allclose(stats.msd.numpy(), msd, rtol=1e-10)
    np.testing.assert_allclose(stats.msd_l2.numpy(), msd2, rtol=1e-10)
    np.testing.assert_allclose(stats.count.numpy(), count)


@pytest.mark.parametrize("weight", [1e-40, 1e-44])
def test_statistics_of_subnormal_weights_are_those_of_the_weights_scaled_up(weight):
    # Weight sums below float32's smallest normal number were clamped up to it: weights
    # of 1e-40 (at C = 1e40, an ordinary fit) made the class means 0.43 times their value.
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=gen) + 5, torch.arange(40) % 2
    tiny = _stats.class_statistics(x, y, 2, 2.0, torch.full((40,), weight))
    ones = _stats.class_statistics(x, y, 2, 2.0, torch.ones(40))
    # (subnormal weights keep 3 to 17 bits: the products w·x round in their last)
    rtol = 1e-5 if weight == 1e-40 else 1e-2
    torch.testing.assert_close(tiny.mean, ones.mean, rtol=rtol, atol=0)
    torch.testing.assert_close(tiny.msd, ones.msd, rtol=20 * rtol, atol=0)


def test_intercept_scale_of_subnormal_weights_is_that_of_the_weights_scaled_up():
    # intercept_scale divided by the weights' sum clamped up to float32's smallest normal
    # number, as the class statistics did: weights of 1e-40 on 60 rows of scale 100 took
    # the intercept in 64 where the same weights scaled up (and float64's) take it in 128.
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 5, generator=gen) * 100, torch.arange(60) % 3
    tiny = _stats.class_statistics(x, y, 3, 2.0, torch.full((60,), 1e-40))
    ones = _stats.class_statistics(x, y, 3, 2.0, torch.ones(60))
    assert float(tiny.count.sum()) < torch.finfo(torch.float32).tiny  # (subnormal)
    assert float(_stats.intercept_scale(tiny)) == float(_stats.intercept_scale(ones)) == 128.0


def test_mean_spread_without_any_present_class_is_zero():
    # Kills: dropping clamp_min(1) in mean_spread's denominator (0 / 0 = NaN, and a NaN
    # compactness temperature) when every sample has zero weight.
    X = torch.randn(6, 3)
    stats = mr2_probe.class_statistics(
        X, torch.tensor([0, 0, 1, 1, 2, 2]), 3, sample_weight=torch.zeros(6)
    )
    assert stats.count.tolist() == [0.0, 0.0, 0.0]
    assert mr2_probe.mean_spread(stats).item() == 0.0
    tau = _stats.compactness_tau(stats)
    assert torch.isfinite(tau) and tau > 0


def test_compactness_tau_of_all_zero_features_is_positive():
    # Kills: dropping the clamp to the dtype's tiny in compactness_tau (τ = 0 divides the
    # compactness loss's exponents by zero).
    stats = mr2_probe.class_statistics(torch.zeros(4, 3), torch.tensor([0, 0, 1, 1]), 2)
    tau = _stats.compactness_tau(stats)
    assert torch.isfinite(tau) and tau > 0


@pytest.mark.parametrize("p", [1.0, 3.0])
def test_spread_difficulty_and_margins_use_the_lp_spread(p):
    # Kills: difficulty="spread" returning the L2 spread msd_l2 instead of the L_p msd.
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(90, 6, generator=gen, dtype=torch.float64) * torch.tensor(
        [1.0, 2.0, 3.0, 1.0, 1.0, 1.0], dtype=torch.float64
    )
    y = torch.arange(90) % 3
    X[y == 1] *= 2.5
    stats = mr2_probe.class_statistics(X, y, 3, p=p)
    msd = class_statistics_loop(X, y, 3, p)[1].numpy()
    a = mr2_probe.class_difficulty(stats, p, "spread")
    np.testing.assert_allclose(a.numpy(), msd, rtol=1e-10)
    root = msd ** (1 / 3)
    expected = 1.5 * 3 * root / root.sum()
    got = mr2_probe.class_margins(stats, 1.5, p, "spread")
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)


def test_margins_leave_classes_outside_present_out_of_the_normalisation():
    # Kills: `measured` ignoring `present`, and the largest root taken over every class
    # (an absent class's a_k then sets the yardstick and unmeasures the present ones).
    # Documented: classes outside ``present`` get c̄ and stay out of the normalisation.
    a = torch.tensor([1.0, 8.0, 1e21], dtype=torch.float64)
    present = torch.tensor([True, True, False])
    got = mr2_probe.margins_from_difficulty(a, 1.5, present)
    root = np.array([1.0, 2.0])
    expected = np.append(1.5 * 2 * root / root.sum(), 1.5)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_a_nan_difficulty_leaves_the_other_margins_measured():
    # Kills: dropping nan_to_num before the largest root (amax of a NaN is NaN, and every
    # class falls back to c̄). A class whose a_k is NaN (non-finite features) gets c̄.
    a = torch.tensor([1.0, 8.0, float("nan")], dtype=torch.float64)
    got = mr2_probe.margins_from_difficulty(a, 1.5)
    root = np.array([1.0, 2.0])
    expected = np.append(1.5 * 2 * root / root.sum(), 1.5)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("p", [2.0, 3.0])
def test_spread_margins_of_classes_of_copies_are_all_c_bar(p):
    # Kills: class_margins not passing the classes' second moments to
    # margins_from_difficulty for difficulty="spread": every class is copies of one row,
    # its spread is float32 rounding (1e-16 to 1e-14) and must not set the margins.
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(3, 5, generator=gen).repeat_interleave(7, 0)
    y = torch.arange(3).repeat_interleave(7)
    stats = mr2_probe.class_statistics(X, y, 3, p=p)
    assert stats.msd.max() < 1e-10  # rounding, not a spread
    margins = mr2_probe.class_margins(stats, 1.5, p, "spread")
    np.testing.assert_array_equal(margins.numpy(), np.full(3, 1.5, dtype=np.float32))


def test_spread_margins_take_the_rounding_threshold_in_the_lp_norm():
    # A class's spread counts as rounding when it is at most ε times its second moment
    # ‖μ_k‖_p² + msd_k, in the norm of the spreads, as the streamed margins take it. Here
    # class 1 (rows 1 ± 0.01 in one of 100 entries) has an L1 spread of 1e-4 against an L1
    # moment of 1e4: unmeasured, c̄, and class 0 alone is measured, c̄ too. Measured against
    # the L2 moment (100) instead, class 1 got a margin of 0.03 and class 0 one of 2.97.
    gen = torch.Generator().manual_seed(8)
    X = torch.cat([0.1 * torch.randn(20, 100, generator=gen), torch.ones(2, 100)])
    X[20:, 0] += torch.tensor([0.01, -0.01])
    y = torch.tensor([0] * 20 + [1] * 2)
    stats = mr2_probe.class_statistics(X, y, 2, p=1.0)
    assert 1e-5 < stats.msd[1].item() < 1e-3  # below ε·1e4, above ε·100
    exact = mr2_probe.class_margins(stats, 1.5, 1.0, "spread")
    np.testing.assert_array_equal(exact.numpy(), np.full(2, 1.5, dtype=np.float32))
    m = mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(2, 100), X, y, p=1.0)
    streamed = _stats.moments_margins(m, 1.5, 1.0, "spread", m.count > 0)
    np.testing.assert_array_equal(streamed.numpy(), exact.numpy())


@pytest.mark.parametrize("scale, expected", [(40.0, 32.0), (48.0, 64.0), (12.0, 16.0), (11.0, 1.0)])
def test_intercept_scale_is_the_nearest_power_of_two(scale, expected):
    # σ = 40 lies nearer 32 than 64 on a log scale (2^5.5 ≈ 45.3), σ = 48 nearer 64: the
    # exponent is rounded, neither floored nor ceiled. The nearest power 16 is taken (σ = 12),
    # 8 is not (σ = 11: the intercept as it is). Two classes at ±σ in one feature:
    # the centred features' RMS entry is σ.
    stats = mr2_probe.class_statistics(torch.tensor([[-scale], [scale]]), torch.tensor([0, 1]), 2)
    assert _stats.intercept_scale(stats).item() == expected


def test_update_moments_in_l2_keeps_dev_p_equal_to_dev_2():
    # Kills: dev_p left at zero for p = 2 (ClassMoments documents dev_p as Σw·‖φ − c‖_p²,
    # which in L2 is dev_2), checked against a NumPy loop about the batch means.
    gen = torch.Generator().manual_seed(4)
    X = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 1, 2] * 4)
    m = mr2_probe.update_moments(
        mr2_probe.ClassMoments.zeros(3, 3, dtype=torch.float64), X, y, p=2.0
    )
    ref = np.array([((X[y == k] - X[y == k].mean(0)) ** 2).sum().item() for k in range(3)])
    np.testing.assert_allclose(m.dev_2.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(m.dev_p.numpy(), ref, rtol=1e-12)


@pytest.mark.parametrize("c_bar", [0, 0.0, -1.0, float("nan"), np.float32(0)])
def test_class_margins_refuse_a_c_bar_that_is_not_positive(c_bar):
    # c̄ = 0 (read as "no margins", which is None) gave margins of 0 and a margin
    # cross-entropy of NaN; -1 negative margins.
    X = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 9.0]])
    stats = mr2_probe.class_statistics(X, torch.tensor([0, 0, 1, 1]), 2)
    with pytest.raises(ValueError, match="c_bar must be a number > 0, got .*None"):
        mr2_probe.class_margins(stats, c_bar)
    with pytest.raises(ValueError, match="c_bar must be a number > 0"):
        mr2_probe.margins_from_difficulty(torch.tensor([1.0, 2.0]), c_bar)


@pytest.mark.parametrize(
    "rows, label_shape, weight_shape, match",
    [(slice(None), (4,), (4, 1), r"sample_weight.shape == \(4, 1\), expected \(4,\)!"),
     (slice(None), (4,), (3,), r"sample_weight.shape == \(3,\), expected \(4,\)!"),
     (slice(None), (4, 1), None, r"labels \(n_samples,\); got shapes \(4, 3\) and \(4, 1\)"),
     (0, (1,), None, r"features \(n_samples, 3\) .* got shapes \(3,\)")],
)  # fmt: skip
def test_class_statistics_refuse_inconsistent_shapes(rows, label_shape, weight_shape, match):
    # Weights (B, 1) failed inside index_add_ ("source tensor shape must match self tensor
    # shape"), one row of features with an IndexError of a tuple index.
    X = torch.randn(4, 3, generator=torch.Generator().manual_seed(7))[rows]
    y = torch.tensor([0, 1, 1, 1])[: 1 if rows == 0 else 4].reshape(label_shape)
    weight = None if weight_shape is None else torch.ones(weight_shape)
    with pytest.raises(ValueError, match=match):
        mr2_probe.class_statistics(X, y, 2, 3.0, weight)
    if weight_shape is None:  # the running sums' too
        with pytest.raises(ValueError, match=match):
            mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(2, 3), X, y)


@pytest.mark.parametrize("p", [0.5, 0.0, -1.0, float("nan")])
def test_an_order_p_below_1_is_refused(p):
    # p = 0.5 gave spreads of no norm, margins from them, NaN spreads of NaN (or margins
    # of c̄ each), without a word: MR2Loss and the estimator refuse them.
    X = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    match = "p must be a number >= 1"
    with pytest.raises(ValueError, match=match):
        mr2_probe.class_statistics(X, y, 2, p)
    with pytest.raises(ValueError, match=match):
        mr2_probe.class_margins(mr2_probe.class_statistics(X, y, 2), 1.0, p)
    with pytest.raises(ValueError, match=match):
        mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(2, 3), X, y, p=p)


@pytest.mark.parametrize("rho", [-0.5, 1.5, float("nan")])
def test_update_moments_refuses_a_decay_outside_0_1(rho):
    # ρ = 1.5 made the sums grow with every batch, ρ < 0 made them negative, unsaid.
    X, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"rho must be in \[0, 1\]"):
        mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(2, 3), X, y, rho=rho)
    sums = mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(2, 3), X, y, rho=1.0)
    assert sums.count.tolist() == [2.0, 2.0]  # ρ = 1: sums that do not decay


def test_update_moments_carries_no_gradient_from_the_features():
    # A backbone's features passed as they are: the sums carried their graph, margins
    # from them a gradient, and the second batch's backward went through the first
    # batch's freed graph ("Trying to backward through the graph a second time").
    gen = torch.Generator().manual_seed(6)
    net = torch.nn.Linear(3, 4)
    m = mr2_probe.ClassMoments.zeros(2, 4)
    for _ in range(2):
        phi = net(torch.randn(6, 3, generator=gen))
        y = torch.tensor([0, 1] * 3)
        m = mr2_probe.update_moments(m, phi, y, p=3.0)
        assert not any(t.requires_grad for t in m)
        margins = mr2_probe.margins_from_difficulty(mr2_probe.moments_difficulty(m, 3.0), 2.0)
        mr2_probe.margin_cross_entropy(phi[:, :2], y, margins).backward()


@pytest.mark.parametrize(
    "sums, features",
    [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
     (torch.float64, torch.float32), (torch.float32, torch.float64)],
)  # fmt: skip
def test_update_moments_takes_features_in_the_sums_dtype(sums, features):
    # Half-precision activations into float32 sums (or float32 ones into float64 sums)
    # raised in index_add_; float64 ones turned float32 sums into float64, unsaid.
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(12, 4, generator=gen).to(features)
    y = torch.tensor([0, 1, 2] * 4)
    start = mr2_probe.ClassMoments.zeros(3, 4, dtype=sums)
    m = mr2_probe.update_moments(mr2_probe.update_moments(start, X, y, p=3.0), X[:6], y[:6], p=3.0)
    cast = X.to(sums)
    ref = mr2_probe.update_moments(mr2_probe.update_moments(start, cast, y, p=3.0), cast[:6],
                                   y[:6], p=3.0)  # fmt: skip
    for got, want in zip(m, ref, strict=True):
        assert got.dtype == sums
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_chunked_statistics_of_no_chunk_are_those_of_no_rows():
    # It raised AttributeError ("'NoneType' object has no attribute 'clamp_min'").
    none = mr2_probe.class_statistics_chunked(lambda: [], 3, 2)
    empty = mr2_probe.class_statistics_chunked(
        lambda: [(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), None)], 3, 2
    )
    for got, want in zip(none, empty, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert none.count.tolist() == [0, 0, 0]


def _stream(batches, K, d, rho, p=2.0):
    m = mr2_probe.ClassMoments.zeros(K, d, dtype=torch.float64)
    for X, y in batches:
        m = mr2_probe.update_moments(m, X, y, rho=rho, p=p)
    return m


def test_streamed_spread_of_samples_seen_one_batch_at_a_time_is_unbiased():
    # Kills: the mean's noise Σŵ² clamped below 1 (to 0.5): a class seen one sample per
    # batch has Σŵ² > 1/2, and its Bessel correction 1 − Σŵ² was overstated.
    # Reference: weighted unbiased variance, weights ρ^j, NumPy.
    rho = 0.2  # Σŵ² = 0.68
    rows = np.array([[1.0, 2.0], [4.0, -1.0], [0.5, 3.0]])
    batches = [(torch.tensor(r[None]), torch.tensor([0])) for r in rows]
    m = _stream(batches, 2, 2, rho)
    w = rho ** np.arange(len(rows))[::-1]
    mu = (w[:, None] * rows).sum(0) / w.sum()
    biased = (w * ((rows - mu) ** 2).sum(1)).sum() / w.sum()
    unbiased = biased / (1 - (w**2).sum() / w.sum() ** 2)
    stats = mr2_probe.moments_statistics(m)
    np.testing.assert_allclose(stats.mean[0].numpy(), mu, rtol=1e-12)
    np.testing.assert_allclose(stats.msd_l2[0].item(), unbiased, rtol=1e-12)


def test_streamed_statistics_count_an_unseen_class_as_absent():
    # Kills: moments_statistics returning the clamped count (tiny, not 0) for a class never
    # seen: it then counts as present and s̄ becomes 2/3 of its value here.
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 1] * 5)
    stats = mr2_probe.moments_statistics(_stream([(X, y)], 3, 3, 0.9))
    assert stats.count[2].item() == 0.0
    ref = np.mean([((X[y == k] - X[y == k].mean(0)) ** 2).sum(1).sum().item() / 4 for k in (0, 1)])
    np.testing.assert_allclose(mr2_probe.mean_spread(stats).item(), ref, rtol=1e-12)


def test_streamed_spread_margins_of_classes_of_copies_are_all_c_bar():
    # Kills: moments_margins not passing the second moments for difficulty="spread" (as
    # MR2Loss(difficulty="spread").margins() calls it): classes of copies of one row have
    # spreads of float32 rounding (1e-16 to 1e-14), which then set the margins.
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(3, 5, generator=gen).repeat_interleave(7, 0)
    y = torch.arange(3).repeat_interleave(7)
    m = mr2_probe.ClassMoments.zeros(3, 5)
    for _ in range(2):
        m = mr2_probe.update_moments(m, X, y)
    assert mr2_probe.moments_difficulty(m, difficulty="spread").max() < 1e-10
    margins = _stats.moments_margins(m, 1.5, 2.0, "spread", m.count > 0)
    np.testing.assert_array_equal(margins.numpy(), np.full(3, 1.5, dtype=np.float32))
    # the same through the public module
    loss = mr2_probe.MR2Loss(3, 5, c_bar=1.5, difficulty="spread")
    for _ in range(2):
        loss.update(X, y)
    np.testing.assert_array_equal(loss.margins().numpy(), np.full(3, 1.5, dtype=np.float32))


def test_moments_difficulty_of_an_unseen_class_is_zero_as_class_difficulty():
    # It was NaN (``_mean_noise`` took 0 / tiny², and tiny² is 0, for a count of 0, although
    # its docstring says 0), while class_difficulty gives an absent class 0.
    X = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    y = torch.tensor([0, 0, 1, 1])
    m = mr2_probe.update_moments(mr2_probe.ClassMoments.zeros(3, 2), X, y)
    a = mr2_probe.moments_difficulty(m)
    assert torch.isfinite(a).all() and a[2].item() == 0.0
    assert mr2_probe.class_difficulty(mr2_probe.class_statistics(X, y, 3), 2.0)[2].item() == 0.0


def test_compactness_tau_in_float64_is_twice_the_mean_spread():
    # Kills: the rounding floor of τ taken with float32's epsilon for float64 statistics
    # (a far common mean and a tiny spread then gave τ the float32 floor, not 2·s̄).
    gen = torch.Generator().manual_seed(6)
    X = 1000.0 + 1e-4 * torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.arange(40) % 2
    stats = mr2_probe.class_statistics(X, y, 2)
    Xn, yn = X.numpy(), y.numpy()
    s_bar = np.mean([((Xn[yn == k] - Xn[yn == k].mean(0)) ** 2).sum(1).mean() for k in (0, 1)])
    np.testing.assert_allclose(_stats.compactness_tau(stats).item(), 2 * s_bar, rtol=1e-6)


def test_running_statistics_with_an_unseen_class_keep_s_bar_finite():
    # Kills: dropping the `keep > 0` guard in moments_statistics (1 − Σŵ² is NaN for a class
    # never seen, so its msd_l2 and MR2Loss.s_bar() became NaN while a class was unseen).
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(8, 2, generator=gen)
    y = torch.tensor([0, 1] * 4)
    loss = mr2_probe.MR2Loss(3, 2)
    loss.update(X, y)
    stats = mr2_probe.moments_statistics(loss.moments())
    assert stats.msd_l2[2].item() == 0.0 and stats.msd[2].item() == 0.0
    Xn, yn = X.double().numpy(), y.numpy()
    ref = np.mean([((Xn[yn == k] - Xn[yn == k].mean(0)) ** 2).sum(1).sum() / 3 for k in (0, 1)])
    np.testing.assert_allclose(loss.s_bar().item(), ref, rtol=1e-5)


def test_margins_of_tiny_float64_difficulties_are_those_of_their_scale():
    # Σ_j a_j^{1/3} had a floor of 1e-30: float64 features of norm 1e-50 (a ~ 1e-100)
    # got margins of about 0.002 where c̄ = 1.
    from mr2_probe._stats import margins_from_difficulty

    a = torch.tensor([1.0, 2.0, 8.0], dtype=torch.float64)
    torch.testing.assert_close(
        margins_from_difficulty(a * 1e-100, 1.0), margins_from_difficulty(a, 1.0)
    )


def test_class_statistics_of_boolean_features_are_those_of_their_float32_values():
    # The second pass subtracted the rows from their class means: torch refuses a bool
    # operand ("Subtraction, the `-` operator, with a bool tensor is not supported").
    gen = torch.Generator().manual_seed(0)
    features, labels = torch.rand(12, 4, generator=gen) > 0.5, torch.arange(12) % 3
    given = mr2_probe.class_statistics(features, labels, 3, p=3.0)
    expected = mr2_probe.class_statistics(features.float(), labels, 3, p=3.0)
    for name, value in given._asdict().items():
        torch.testing.assert_close(value, getattr(expected, name), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_margins_of_integer_difficulties_are_those_of_their_float32_values(dtype):
    # torch.finfo refused the integer dtype (TypeError), and the margins would have been
    # cast back to it (rounded to integers).
    difficulty = torch.tensor([1, 8, 27])
    margins = mr2_probe.margins_from_difficulty(difficulty.to(dtype), 2.0)
    expected = mr2_probe.margins_from_difficulty(difficulty.float(), 2.0)
    torch.testing.assert_close(margins, expected, rtol=0, atol=0)
    torch.testing.assert_close(margins, torch.tensor([1.0, 2.0, 3.0]))
