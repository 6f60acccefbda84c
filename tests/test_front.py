"""The accuracy–worst-class front: its points, the selection rule, the plot and the CLI."""

import ast
import json
import os
import re
import warnings

import joblib
import numpy as np
import pytest
import torch
from matplotlib.colors import to_hex
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold, PredefinedSplit, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV, TunedOffsetsClassifierCV
from mr2_probe.cli import main
from mr2_probe.cli._outputs import _OUTPUTS
from mr2_probe.front import Front, FrontPoint, accuracy_front, check_offsets_folds, choose_point
from mr2_probe.metrics import classwise_summary, difficulty_groups, per_class_accuracy
from mr2_probe.plotting import LEVER_COLOURS, plot_front


def _point(name, overall, worst, lever="tilt"):
    # The hard tercile ranks the points the other way: the rule must read the worst class.
    summary = {"overall": overall, "worst": worst, "hard": 1 - worst}
    return FrontPoint(name, lever if name != "ERM" else "ERM", 1.0, None, summary)


@pytest.mark.parametrize(
    "points, bound, expected",
    [
        # The best worst class within the bound wins, whatever lies beyond it.
        ([("ERM", 0.90, 0.60), ("a", 0.897, 0.66), ("b", 0.80, 0.90)], 0.005, "a"),
        # The bound is counted from ERM's overall accuracy, not from the best point's.
        ([("ERM", 0.90, 0.60), ("a", 0.92, 0.62), ("b", 0.896, 0.70)], 0.005, "b"),
        # A point just outside the bound is not eligible.
        ([("ERM", 0.90, 0.60), ("a", 0.894, 0.66)], 0.005, "ERM"),
        # Equal worst class: the higher overall accuracy.
        ([("ERM", 0.90, 0.60), ("a", 0.899, 0.66), ("b", 0.901, 0.66)], 0.005, "b"),
        # A full tie: the earlier point (ERM first).
        ([("ERM", 0.90, 0.66), ("a", 0.90, 0.66)], 0.005, "ERM"),
        # bound = 0: nothing may cost overall accuracy.
        ([("ERM", 0.90, 0.60), ("a", 0.8999, 0.70), ("b", 0.91, 0.61)], 0.0, "b"),
        # Exactly at the bound is within it, and with bound = 0 ERM itself always is.
        ([("ERM", 0.90, 0.60), ("a", 0.895, 0.66)], 0.005, "a"),
        ([("ERM", 0.90, 0.60), ("a", 0.8999, 0.70)], 0.0, "ERM"),
        # Within 1e-12 of the floor is on it (the rounding of accuracies, not a cost).
        ([("ERM", 0.5, 0.4), ("a", 0.5 - 1e-12, 0.45)], 0.0, "a"),
    ],
)
def test_selection_rule(points, bound, expected):
    front = Front([_point(*p) for p in points], bound)
    assert choose_point(front).name == expected


def test_a_float32_bound_is_the_float64_it_holds_in_the_rule_as_in_the_front():
    # np.float32(0.005) holds 0.0049999998882: the floor was computed in float32, ERM's
    # accuracy rounded with it, and a point 0.5 pt below ERM (179/200 against 180/200) was
    # chosen, where accuracy_front's offsets take the bound as float(bound), below 0.005.
    front = Front([_point("ERM", 180 / 200, 0.5), _point("a", 179 / 200, 0.7)])
    assert choose_point(front, np.float32(0.005)).name == "ERM"
    assert choose_point(front, float(np.float32(0.005))).name == "ERM"
    assert choose_point(front, 0.005).name == "a"


@pytest.mark.parametrize("bound", [-0.1, 1.0, "0.01", np.float64(1.5)])
def test_selection_rule_rejects_a_bad_bound(bound):
    # A bound of 1 (100 points) was taken: every point within it, the rule no rule at all.
    # Text failed its comparison with a TypeError.
    front = Front([_point("ERM", 0.9, 0.6)])
    shown = re.escape(repr(bound if isinstance(bound, str) else float(bound)))
    with pytest.raises(ValueError, match=rf"bound must be a fraction in \[0, 1\), got {shown}\.$"):
        choose_point(front, bound=bound)


@pytest.fixture(scope="module")
def splits(request):
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=2.0, size=(5, 8))
    y = np.arange(1500) % 5
    X = centers[y] + rng.normal(size=(1500, 8)) * np.linspace(0.7, 2.2, 5)[y, None]
    X_fit, X_rest, y_fit, y_rest = train_test_split(X, y, test_size=0.5, random_state=0)
    X_val, X_test, y_val, y_test = train_test_split(X_rest, y_rest, test_size=0.5, random_state=0)
    return X_fit, y_fit, X_val, y_val, X_test, y_test


@pytest.fixture(scope="module")
def front(splits):
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    probe = make_pipeline(StandardScaler(), MR2LinearClassifier(C=0.1, device="cpu"))
    return accuracy_front(
        probe, X_fit, y_fit, X_val, y_val, tilts=(0, 1, 5),
        offset_bounds=(0.0, 0.01), X_test=X_test, y_test=y_test,
    )  # fmt: skip


def test_front_points(front, splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    names = [p.name for p in front.points]
    assert names == ["ERM", "MR2", "tilt=1", "tilt=5", "offsets≤0pt", "offsets≤1pt"]
    assert [p.lever for p in front.points] == ["ERM", "MR2", "tilt", "tilt", "offsets", "offsets"]
    # Each tilt point is the estimator with that class_tilt, scored on the validation set.
    direct = make_pipeline(
        StandardScaler(), MR2LinearClassifier(C=0.1, class_tilt=5.0, device="cpu")
    ).fit(X_fit, y_fit)
    assert front.point("tilt=5").validation["overall"] == pytest.approx(direct.score(X_val, y_val))
    # Its groups (easy, medium, hard) are ERM's terciles on that split, for every point.
    erm = make_pipeline(StandardScaler(), MR2LinearClassifier(C=0.1, c_bar=None, device="cpu"))
    labels = np.unique(y_val)
    groups = difficulty_groups(per_class_accuracy(y_val, erm.fit(X_fit, y_fit).predict(X_val)))
    expected = classwise_summary(y_val, direct.predict(X_val), groups, labels)
    for group in ("easy", "medium", "hard"):
        assert front.point("tilt=5").validation[group] == pytest.approx(expected[group])
    # The points keep unfitted configurations, ready to refit.
    assert front.point("tilt=5").estimator[-1].class_tilt == 5.0
    assert front.point("offsets≤1pt").estimator.max_accuracy_drop == 0.01
    # The rule, read from the scores: the best worst class within 0.5 pt of ERM's overall.
    erm = front.point("ERM").validation["overall"]
    eligible = [p for p in front.points if p.validation["overall"] >= erm - 0.005 - 1e-12]
    best = max(p.validation["worst"] for p in eligible)
    chosen = front.point(front.chosen)
    assert chosen in eligible and chosen.validation["worst"] == best


def test_close_tilts_and_bounds_are_points_of_their_own(splits):
    # Tilts of 1 and 1.0000001 were both named "tilt=1": the second fit replaced the first,
    # which was scored with the other's model, and front.point found only the first.
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val,
        tilts=(1, 1.0000001, 5), offset_bounds=(0.01, 0.0100000001),
    )  # fmt: skip
    names = [p.name for p in front.points]
    assert names[2:] == [
        "tilt=1", "tilt=1.0000001", "tilt=5", "offsets≤1pt", "offsets≤1.00000001pt"
    ]  # fmt: skip
    assert [front.point(n).value for n in names[2:4]] == [1.0, 1.0000001]


@pytest.mark.parametrize(
    "params",
    [
        dict(C=0.05, c_bar=1.0, max_iter=5),  # L-BFGS stopped short: not the cold solution
        dict(solver="adam", max_iter=15, random_state=0),  # minibatch: another path
    ],
)
def test_tilt_points_score_the_model_their_refit_gives(params):
    """The rule reads each point's scores; its configuration is what gets refitted, cold.
    Warm starts along the sweep are kept only where they give the cold solution."""
    from sklearn.base import clone
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X_fit, X_val, y_fit, y_val = train_test_split(
        X / 16, y, test_size=0.3, stratify=y, random_state=0
    )
    probe = MR2LinearClassifier(device="cpu", **params)
    with pytest.warns(ConvergenceWarning, match="The front's fits of ERM, MR2, tilt=1, tilt=5"):
        front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1, 5))
    for name in ("tilt=1", "tilt=5"):
        point = front.point(name)
        with pytest.warns(ConvergenceWarning):
            cold = clone(point.estimator).fit(X_fit, y_fit)
        assert point.validation["overall"] == pytest.approx(cold.score(X_val, y_val))


def test_a_minibatch_sweep_fits_each_tilt_cold(splits):
    # Warm starts are for a convex problem (a linear head solved by L-BFGS) alone. Adam
    # started from the previous point's solution ends elsewhere than from its own start
    # even when it converges, and the points scored models that their refits do not give.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(
        solver="adam", tol=0.5, n_iter_no_change=1, random_state=0, device="cpu"
    )  # converges in 4 epochs: a warm start, where allowed, would be kept
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1, 5))
        for name in ("tilt=1", "tilt=5"):
            cold = clone(front.point(name).estimator).fit(X_fit, y_fit)
            expected = cold.score(X_val, y_val)
            assert front.point(name).validation["overall"] == pytest.approx(expected)


def test_without_an_mr2_point_the_first_tilt_is_fitted_cold(splits):
    # MR² left out (its configuration is ERM's): the sweep has no MR² point to start from,
    # and the first tilt is fitted cold, not from ERM's solution. From ERM, a loose tol
    # stopped it elsewhere, and the point scored a model that its refit does not give.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(c_bar=None, tol=0.05, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1,))
    assert [p.name for p in front.points] == ["ERM", "tilt=1"]
    cold = clone(front.point("tilt=1").estimator).fit(X_fit, y_fit)
    assert front.point("tilt=1").validation["overall"] == pytest.approx(cold.score(X_val, y_val))


def test_front_erm_is_the_probe_without_margins_or_projection(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(lam=0.5, max_iter=3, device="cpu", random_state=0)
    with pytest.warns(ConvergenceWarning):
        front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=())
    erm = front.point("ERM").estimator
    assert (erm.c_bar, erm.lam, erm.class_tilt) == (None, 0.0, 0.0)
    assert front.point("MR2").estimator.lam == 0.5


def test_an_erm_given_alike_but_for_number_types_is_no_second_point(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    common = dict(c_bar=None, max_iter=20, device="cpu")
    probe = MR2LinearClassifier(class_weight={0: 1, 1: 2}, **common)
    erm = MR2LinearClassifier(class_weight={0: 1.0, 1: 2.0}, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1,), erm=erm)
    assert [p.name for p in front.points] == ["ERM", "tilt=1"]
    # lam=0 is ERM's lam=0.0 inside a pipeline too: no MR² point of its own, so without
    # tilts the front would hold ERM alone.
    probe = make_pipeline(StandardScaler(), MR2LinearClassifier(c_bar=None, lam=0, device="cpu"))
    with pytest.raises(ValueError, match="The front would hold ERM alone"):
        accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=())


@pytest.mark.parametrize(
    "params, erm_params",
    [
        (dict(p=3), {}),  # without margins: neither p nor difficulty is read
        (dict(difficulty="spread"), {}),
        (dict(tau=0.5, projection_rank=2), {}),  # without a projection (lam=0)
        (dict(scale=5.0), {}),  # the linear head has no logit scale
        (dict(head="cosine", fit_intercept=False), dict(head="cosine")),  # nor a bias
        (dict(head="cosine", C=0.5), dict(head="cosine")),  # nor a penalty without lam
        # L-BFGS (lam=0) reads none of the minibatch solvers' parameters
        (dict(random_state=1, batch_size=8, learning_rate=0.1, n_iter_no_change=2), {}),
        (dict(verbose=1), {}),  # what a fit prints
        (dict(solver="lbfgs"), {}),  # what solver="auto" stands for at lam=0
    ],
)
def test_an_estimator_of_erm_s_configuration_but_for_what_it_does_not_read_is_erm(
    splits, params, erm_params, monkeypatch
):
    # MR2LinearClassifier(c_bar=None, p=3) with erm=MR2LinearClassifier(c_bar=None): its MR2
    # point was ERM's model fitted again, and without tilts a front of ERM alone drawn.
    X_fit, y_fit, X_val, y_val, *_ = splits

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking the options")

    monkeypatch.setattr(MR2LinearClassifier, "fit", no_fit)
    probe = MR2LinearClassifier(c_bar=None, device="cpu", **params)
    erm = MR2LinearClassifier(c_bar=None, device="cpu", **erm_params)
    with pytest.raises(ValueError, match="The front would hold ERM alone"):
        accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(0,), erm=erm)


@pytest.mark.parametrize(
    "params, erm_params",
    [
        (dict(C=0.1), {}),  # ERM tuned on its own: the linear head's penalty is read
        (dict(head="cosine", scale=5.0), dict(head="cosine")),  # the cosine head's scale
        (dict(fit_intercept=False), {}),  # the linear head's bias
        (dict(solver="adam", random_state=1), dict(solver="adam")),  # its minibatches' order
        (dict(solver="adam"), {}),  # not what solver="auto" stands for at lam=0
    ],
)
def test_an_estimator_without_margins_that_differs_from_erm_in_what_it_reads_is_a_point(
    splits, params, erm_params
):
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(c_bar=None, device="cpu", **params)
    erm = MR2LinearClassifier(c_bar=None, device="cpu", **erm_params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(), erm=erm)
    assert [p.name for p in front.points] == ["ERM", "MR2"]


@pytest.mark.parametrize("lam", ["0.5", None])
def test_an_invalid_lam_is_refused_in_scikit_learn_s_words(splits, lam):
    # (read before the fit, by what a model does not read, it failed in a TypeError: "'>'
    # not supported between instances of 'str' and 'int'")
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(lam=lam, device="cpu")
    with pytest.raises(ValueError, match="The 'lam' parameter of MR2LinearClassifier must be"):
        accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1,))


def test_front_takes_arrays_of_tilts_and_bounds(splits):
    # offset_bounds=np.array([...]): "The truth value of an array ... is ambiguous".
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    front = accuracy_front(
        probe, X_fit, y_fit, X_val, y_val, tilts=np.array([0.0, 1.0]),
        offset_bounds=np.array([0.0, 0.01]),
    )  # fmt: skip
    assert [p.name for p in front.points] == ["ERM", "MR2", "tilt=1", "offsets≤0pt", "offsets≤1pt"]


def test_tilts_and_bounds_of_a_tensor_pass_the_options_check(splits, monkeypatch):
    # Its items are 0-d tensors, numbers to float() and '>' alike: not refused as text is.
    X_fit, y_fit, X_val, y_val, *_ = splits

    def fitted(*args, **kwargs):
        raise AssertionError("fitted")

    monkeypatch.setattr(MR2LinearClassifier, "fit", fitted)
    with pytest.raises(AssertionError, match="fitted"):
        accuracy_front(
            MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val,
            tilts=torch.tensor([0.0, 1.0]), offset_bounds=torch.tensor([0.01]),
        )  # fmt: skip


def test_labels_and_groups_of_tensors_numpy_cannot_read_are_taken_as_the_estimators_take_them(
    splits,
):
    # Tensors on a GPU, or requiring grad, failed in the checks before any fit ("Can't call
    # numpy() on Tensor that requires grad"), where the estimators and the metrics take them.
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    groups = np.arange(len(y_fit)) % 6
    options = {"tilts": (), "offset_bounds": (0.01,), "offsets_cv": GroupKFold(2)}

    def held(values):
        return torch.tensor(values, dtype=torch.float64, requires_grad=True)

    expected = accuracy_front(
        probe, X_fit, y_fit.astype(float), X_val, y_val.astype(float), X_test=X_test,
        y_test=y_test.astype(float), groups=groups, **options,
    )  # fmt: skip
    front = accuracy_front(
        probe, X_fit, held(y_fit), X_val, held(y_val), X_test=X_test, y_test=held(y_test),
        groups=held(groups), **options,
    )  # fmt: skip
    assert front.chosen == expected.chosen
    for point, same in zip(front.points, expected.points, strict=True):
        assert (point.name, point.validation, point.test) == (same.name, same.validation, same.test)


def test_a_bound_of_minus_zero_is_zero_and_an_empty_split_is_refused_before_any_fit(splits):
    # -0.0 was named "offsets≤-0pt" (and stored as -0.0); an empty validation split failed
    # after the ERM fit, in predict's words ("Found array with 0 sample(s)").
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(), offset_bounds=[-0.0])
    assert front.points[-1].name == "offsets≤0pt"
    assert str(front.points[-1].value) == "0.0"
    # Refused without the warning that y_val holds no sample of its classes first.
    with warnings.catch_warnings(), pytest.raises(ValueError, match="X_val has no samples"):
        warnings.simplefilter("error")
        accuracy_front(probe, X_fit, y_fit, X_val[:0], y_val[:0], tilts=())
    from mr2_probe.cli._options import _floats  # --tilt=-0 and --offsets=-0 likewise

    assert [str(v) for v in _floats("-0,0.5")] == ["0.0", "0.5"]


def test_front_offsets_take_a_group_splitter(splits):
    from sklearn.model_selection import GroupKFold

    X_fit, y_fit, X_val, y_val, *_ = splits
    groups = np.arange(len(y_fit)) % 9
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    common = dict(tilts=(0,), offset_bounds=(0.01,))
    front = accuracy_front(
        probe, X_fit, y_fit, X_val, y_val, offsets_cv=GroupKFold(3), groups=groups, **common
    )
    wrapper = TunedOffsetsClassifierCV(
        front.point("ERM").estimator, scoring="worst_class", max_accuracy_drop=0.01,
        cv=GroupKFold(3),
    ).fit(X_fit, y_fit, groups=groups)  # fmt: skip
    expected = wrapper.score(X_val, y_val)
    assert front.point("offsets≤1pt").validation["overall"] == pytest.approx(expected)


def test_offsets_points_go_by_bound_and_each_scores_its_own(splits):
    # Each bound re-tunes the offsets on the same out-of-fold logits: every point was
    # scored with the largest bound's offsets, or with those of the fit they were tuned
    # from, and bounds given unsorted made points out of order.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(c_bar=None, C=0.1, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(), offset_bounds=(0.02, 0))
    assert [p.name for p in front.points] == ["ERM", "offsets≤0pt", "offsets≤2pt"]
    assert [p.value for p in front.points[1:]] == [0.0, 0.02]
    for point in front.points[1:]:
        refit = clone(point.estimator).fit(X_fit, y_fit)
        assert point.validation["overall"] == pytest.approx(refit.score(X_val, y_val))
    # Two bounds, two models (the test would not see one scored as the other).
    assert front.point("offsets≤0pt").validation != front.point("offsets≤2pt").validation


@pytest.mark.parametrize("closed", ["X", "y", "X_val", "y_val", "X_test", "groups"])
def test_a_dataset_of_a_closed_hdf5_file_is_named(splits, tmp_path, closed):
    # h5py's "Unable to synchronously get dataspace (identifier is not of specified type)"
    # (a RuntimeError), or "Invalid dataset identifier" of a closed y, from the checks.
    h5py = pytest.importorskip("h5py")
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    data = dict(X=X_fit, y=y_fit, X_val=X_val, y_val=y_val, X_test=X_test, y_test=y_test)
    data["groups"] = np.arange(len(y_fit)) % 3
    with h5py.File(tmp_path / "x.h5", "w") as f:
        data[closed] = f.create_dataset(closed, data=data[closed])
    probe = MR2LinearClassifier(device="cpu")
    with pytest.raises(ValueError, match=f"^{closed} is a dataset of an HDF5 file that is closed"):
        accuracy_front(probe, **data, tilts=(1,), offset_bounds=(0.01,))


@pytest.mark.parametrize("text", ["y", "y_val", "y_test"])
def test_labels_of_an_hdf5_dataset_of_text_are_refused_by_name(splits, tmp_path, text):
    # h5py reads text as bytes, which scikit-learn refuses as labels naming neither the
    # split nor the cure: each split's own name and cure are said.
    h5py = pytest.importorskip("h5py")
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    names = np.array(["ant", "bee", "cat", "dog", "émeu"])
    data = dict(y=names[y_fit], y_val=names[y_val], y_test=names[y_test])
    with h5py.File(tmp_path / "y.h5", "w") as f:
        data[text] = f.create_dataset(
            text, data=data[text].astype(object), dtype=h5py.string_dtype()
        )
        cure = re.escape(f'Pass its text, {text}.asstr("utf-8")[()].')
        with pytest.raises(TypeError, match=rf"^{text} is the HDF5 dataset '/{text}' .*{cure}$"):
            accuracy_front(
                MR2LinearClassifier(device="cpu"), X_fit, X_val=X_val, X_test=X_test, **data
            )


def test_front_erm_may_be_tuned_on_its_own(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    mr2 = MR2LinearClassifier(c_bar=2.0, C=0.003, device="cpu")
    erm = MR2LinearClassifier(c_bar=None, C=0.3, device="cpu")
    front = accuracy_front(mr2, X_fit, y_fit, X_val, y_val, tilts=(), erm=erm)
    assert front.point("ERM").estimator.C == 0.3 and front.point("MR2").estimator.C == 0.003
    own = erm.fit(X_fit, y_fit).score(X_val, y_val)
    assert front.point("ERM").validation["overall"] == pytest.approx(own)


# tol=1e-8 for a close comparison: lbfgs stops short of it at float64 round-off.
@pytest.mark.filterwarnings("ignore:lbfgs stopped after:sklearn.exceptions.ConvergenceWarning")
@pytest.mark.filterwarnings(
    "ignore:The front's fits of MR2, tilt=0.5 stopped short:sklearn.exceptions.ConvergenceWarning"
)
def test_tilt_sweep_without_margins_does_not_start_from_another_erm(splits):
    # Without margins the first tilt warm-started from the fitted ERM, which erm= may give
    # another C, and scored a model at ERM's C under its own. The MR2 point, which was
    # left out without margins, is that other model: it is a point of its own.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(c_bar=None, C=0.001, tol=1e-8, device="cpu")
    erm = MR2LinearClassifier(c_bar=None, C=1.0, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(0.5,), erm=erm)
    assert [p.name for p in front.points] == ["ERM", "MR2", "tilt=0.5"]
    assert front.point("MR2").estimator.C == 0.001
    cold = clone(front.point("tilt=0.5").estimator).fit(X_fit, y_fit)
    assert front.point("tilt=0.5").validation["overall"] == pytest.approx(cold.score(X_val, y_val))


@pytest.mark.parametrize(
    "lam, names",
    [
        (0.0, ["ERM", "tilt=1"]),
        (0, ["ERM", "tilt=1"]),  # an int, or a NumPy number, is the same configuration
        (np.float64(0), ["ERM", "tilt=1"]),
        (0.5, ["ERM", "MR2", "tilt=1"]),
    ],
)
def test_the_mr2_point_is_left_out_only_where_it_is_erm(splits, lam, names):
    # With c_bar=None and a compactness loss (lam > 0) the MR2 model is no ERM: it was left
    # out, and the tilt curve drawn from ERM's point, not from the model it was swept from.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(c_bar=None, lam=lam, max_iter=3, device="cpu", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        front = accuracy_front(probe, X_fit[:300], y_fit[:300], X_val, y_val, tilts=(1,))
    assert [p.name for p in front.points] == names


def _spied_front(monkeypatch):
    """What the command line passes accuracy_front, once it has run: the ``estimator``,
    ``y_val`` and its keyword options."""
    from mr2_probe import front as front_module

    seen = {}
    real = front_module.accuracy_front

    def spy(estimator, X_fit, y_fit, X_val, y_val, **kwargs):
        seen.update(kwargs, estimator=estimator, y_val=y_val)
        return real(estimator, X_fit, y_fit, X_val, y_val, **kwargs)

    monkeypatch.setattr(front_module, "accuracy_front", spy)
    return seen


def test_cli_front_erm_is_the_reported_erm(features, monkeypatch, capsys):
    # The front took ERM as MR2's configuration without margins: with a search, at MR2's
    # C, not ERM's own, so the report showed two different "ERM"s and the rule's floor was
    # an untuned ERM's.
    seen = _spied_front(monkeypatch)
    argv = [str(features / "train.npz"), "--test", str(features / "test.npz"), "--cv", "2"]
    argv += ["--grid", "c_bar=4", "--grid", "C=0.0001,1", "--tilt", "1", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    best = {
        name: ast.literal_eval(
            printed.split(f"{name} grid: best")[1].split(": ", 1)[1].split("\n")[0]
        )
        for name in ("ERM", "MR2")
    }
    assert seen["erm"].C == best["ERM"]["C"] and seen["estimator"].C == best["MR2"]["C"]
    assert seen["erm"].c_bar is None and seen["estimator"].c_bar == 4


def test_cli_front_splits_and_bounds_as_its_options_say(features, monkeypatch):
    # --val-size holds out that fraction of the training data, stratified and seeded by
    # --seed; --offsets and --front-bound are in percent; the front's fits show no
    # progress bars, even where the run's own fits do.
    seen = _spied_front(monkeypatch)
    argv = [str(features / "train.npz"), "--test", str(features / "test.npz"), "--seed", "3"]
    argv += ["--offsets", "2", "--val-size", "0.2", "--front-bound", "1.5", "--max-iter", "50"]
    assert main(argv) == 0
    y = np.load(features / "train.npz")["y"]
    _, y_val = train_test_split(y, test_size=0.2, stratify=y, random_state=3)
    np.testing.assert_array_equal(seen["y_val"], y_val)
    assert seen["offset_bounds"] == [pytest.approx(0.02)]
    assert seen["bound"] == pytest.approx(0.015)
    for estimator in (seen["estimator"], seen["erm"]):
        assert all(v == 0 for k, v in estimator.get_params().items() if k.endswith("verbose"))


def test_front_names_the_points_that_stopped_short(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(C=10.0, max_iter=2, device="cpu")
    # The first short fit's own warning is the one quoted, ERM's, not the last one's.
    match = "front's fits of ERM, MR2, tilt=5 stopped short of tol; .* fitted. ERM: "
    with pytest.warns(ConvergenceWarning, match=match):
        accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(5,))


def test_front_passes_on_the_first_short_fits_own_advice(splits):
    # A tilt too steep to resolve: the estimator names it, and the front's one warning
    # said "Increase max_iter, or scale the features" instead, which does not help.
    X_fit, y_fit, X_val, y_val, *_ = splits
    with pytest.warns(ConvergenceWarning) as record:
        accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(1e30,))
    (message,) = [str(w.message) for w in record if "front's fits" in str(w.message)]
    assert message.startswith("The front's fits of tilt=1e+30 stopped short of tol")
    # (its first line search, retried from a shorter step, leaves the start: it stops
    # later, no longer improving)
    assert "tilt=1e+30: lbfgs stopped after" in message
    assert "class_tilt=1e+30" in message and "Increase max_iter" not in message


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tilts=(-1, 2)), r"tilts must be finite numbers >= 0, got \[-1\]"),
        (dict(tilts=(float("nan"),)), "tilts must be finite"),
        (dict(tilts=(1, float("inf"))), r"tilts must be finite numbers >= 0, got \[inf\]"),
        # An array's values as Python's numbers, not NumPy 2's [np.int64(-1)].
        (dict(tilts=np.array([-1, 2])), r"tilts must be finite numbers >= 0, got \[-1\]\."),
        (dict(tilts=np.array([1.0, np.inf])), r"tilts must be finite numbers .*, got \[inf\]\."),
        (dict(offset_bounds=np.array([0.01, 1.5])), r"fractions in \[0, 1\), got \[1.5\]\."),
        (dict(bound=5), r"bound must be a fraction in \[0, 1\), got 5\."),
        (dict(offset_bounds=(0.01, 1.5)), "offset_bounds must be fractions"),
        # 1 is all of the accuracy: no bound, and no fraction in [0, 1) either.
        (dict(offset_bounds=(0.01, 1.0)), r"offset_bounds must be fractions .*, got \[1.0\]"),
        (dict(bound=1.0), r"bound must be a fraction in \[0, 1\), got 1.0\."),
        (dict(X_test=np.zeros((3, 8))), "X_test and y_test go together"),
        (dict(X_val="one short"), r"X_val has 374 samples but y_val has 375 labels"),
        (dict(X_test="7 features"), r"X_test has 7 features but X, the training data, has 8"),
        # Labels no point can predict: each a class at 0% everywhere, the worst class 0.
        (dict(y_val="shifted"), r"y_val holds labels that are no class of y, .*labels: 5\. "),
        # One-hot labels were "y should be a 1d array", the training labels' name.
        (dict(y_val="one-hot"), r"^y_val should be a 1d array, .*\(375, 10\).*one-hot"),
        (dict(y_test="one-hot"), r"^y_test should be a 1d array, .*\(375, 10\).*one-hot"),
        # A single label, and 3 dimensions ("Found array with dim 3"), named neither.
        (dict(y_val="one label"), r"^y_val should be a 1d array, .* of shape \(\) instead\.$"),
        (dict(y_test="3-d"), r"^y_test should be a 1d array, .* \(375, 1, 1\) instead\.$"),
        (dict(y_test="text"), r"y_test holds labels .*: '0', '1', '10', '100', '101', \.\.\.\. No"),
        # Training labels of a regression target: scikit-learn's error, as the fits give
        # it (y_val's values were named "no class of y"). Mixed labels failed np.unique
        # with a TypeError.
        (dict(y="continuous"), "Unknown label type: continuous"),
        (
            dict(y_val="mixed"),
            r"y_val holds labels that cannot be compared .*\(of types string and number\)",
        ),
        (dict(tilts=(0, 1, 2, 1.0)), r"tilts must be distinct, got \[1.0\] more than once"),
        # A single value, text or items that are no numbers: Python's "'float' object is
        # not iterable", "could not convert string to float: ','" or a '>' of str and int.
        (dict(tilts=2.0), r"tilts must be a sequence of numbers, e.g. tilts=\[1.0\], got 2.0\."),
        (dict(tilts=np.float64(2)), r"tilts must be a sequence of numbers, .*, got 2.0\."),
        (dict(tilts="1,2"), r"tilts must be a sequence of numbers, .*, got '1,2'\."),
        (dict(tilts=["1"]), r"tilts must be a sequence of numbers, .*, got \['1'\]\."),
        (dict(tilts=[1.0, None]), r"tilts must be a sequence of numbers, .*, got \[1.0, None\]"),
        (dict(tilts=None), r"tilts must be a sequence of numbers, .*, got None\."),
        (dict(offset_bounds=0.01), r"offset_bounds must be a sequence of numbers, .*, got 0.01\."),
        (dict(offset_bounds=[[0.01]]), r"offset_bounds must be a sequence of numbers"),
        (dict(bound="0.01"), r"bound must be a number, a fraction in \[0, 1\), got '0.01'\."),
        (dict(bound=None), r"bound must be a number, a fraction in \[0, 1\), got None\."),
        (dict(offset_bounds=(0.01, 0.01)), r"offset_bounds must be distinct, got \[0.01\]"),
        (dict(erm=LogisticRegression()), "erm must be an MR2LinearClassifier .* got Logistic"),
        # Refused by the offsets' own estimator, after the ERM, MR² and tilt fits.
        (dict(offset_bounds=(0.01,), offsets_cv=1), "'offsets_cv' parameter of accuracy_front"),
        (dict(offset_bounds=(0.01,), offsets_cv=2.5), "'offsets_cv' parameter of accuracy_fr"),
        (dict(offset_bounds=(0.01,), offsets_cv="3"), "'offsets_cv' parameter of accuracy_fr"),
        (dict(offset_bounds=(0.01,), offsets_cv="prefit"), "'offsets_cv' parameter of accu"),
        # A class of one sample among larger ones: scikit-learn's folds only warn.
        (
            dict(offset_bounds=(0.01,), one_of_class=7),
            r"fold \d of the cv holds no sample of the classes \[7\] .*at least 2 samples",
        ),
        # A splitter's folds too (checked by the offsets' estimator after the other fits).
        (
            dict(offset_bounds=(0.01,), offsets_cv="without 4"),
            r"fold 0 of the cv holds no sample of the classes \[4\] .*use a stratified cv",
        ),
        # A fold of no held-out rows: the offsets' fit refused it, after the ERM and MR² fits.
        (
            dict(offset_bounds=(0.01,), offsets_cv="no held-out rows"),
            r"Fold 1 of the cv has no held-out rows; pass folds whose two parts each hold",
        ),
    ],
)
def test_front_refuses_bad_options_before_any_fit(splits, kwargs, match, monkeypatch):
    X_fit, y_fit, X_val, y_val, *_ = splits
    if "one_of_class" in kwargs:
        y_fit = y_fit.copy()
        y_fit[0] = kwargs.pop("one_of_class")
    if kwargs.get("offsets_cv") == "without 4":  # fold 0 holds out every sample of class 4
        kwargs["offsets_cv"] = PredefinedSplit(np.where(y_fit == 4, 0, np.arange(len(y_fit)) % 2))
    if kwargs.get("offsets_cv") == "no held-out rows":
        rows = np.arange(len(y_fit))
        kwargs["offsets_cv"] = [(rows[::2], rows[1::2]), (rows, rows[:0])]
    if kwargs.pop("y", None) == "continuous":
        y_fit = y_fit + np.linspace(0, 0.5, len(y_fit))
    y_val = {
        "shifted": y_val + 1,
        "mixed": np.array([str(v) if i % 2 else v for i, v in enumerate(y_val)], object),
        "one-hot": np.eye(10)[y_val],
        "one label": y_val[0],
        None: y_val,
    }[kwargs.pop("y_val", None)]
    if isinstance(kwargs.pop("X_val", None), str):
        X_val = X_val[:-1]
    y_test = kwargs.pop("y_test", None)
    if y_test == "text":
        kwargs.update(X_test=X_val, y_test=np.arange(len(y_val)).astype(str))
    if y_test == "one-hot":
        kwargs.update(X_test=X_val, y_test=np.eye(10)[y_val])
    if y_test == "3-d":
        kwargs.update(X_test=X_val, y_test=y_val[:, None, None])
    if isinstance(kwargs.get("X_test"), str):
        kwargs.update(X_test=X_val[:, :7], y_test=y_val)

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking the options")

    monkeypatch.setattr(MR2LinearClassifier, "fit", no_fit)
    with pytest.raises(ValueError, match=match), warnings.catch_warnings():
        # y_val holds no sample of a class of one training sample: a warning, then this.
        warnings.simplefilter("ignore" if y_fit[0] == 7 else "error", UserWarning)
        accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val, **kwargs)


@pytest.mark.parametrize("as_text", ["y_test", "y"])
def test_labels_that_are_the_classes_numbers_as_text_are_refused_among_many_classes(
    as_text, monkeypatch
):
    # Among 20 classes, y_test's '0', '1', ... were taken for the classes 0, 1, ... (NumPy's
    # setdiff1d, sorting, compares them as text): the fits ran, then the first score failed
    # on a "Mix of label input types".
    rng = np.random.default_rng(0)
    y = np.arange(400) % 20
    X = rng.normal(size=(400, 4)) + y[:, None]
    labels = {"y": y, "y_test": y}
    labels[as_text] = y.astype(str)

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking the labels")

    monkeypatch.setattr(MR2LinearClassifier, "fit", no_fit)
    with pytest.raises(ValueError, match="y_test holds labels that are no class of y"):
        clf = MR2LinearClassifier(device="cpu")
        accuracy_front(clf, X, labels["y"], X, labels["y"], X_test=X, y_test=labels["y_test"])


@pytest.mark.parametrize("tilts", [(), (0.0,)])
def test_a_front_of_erm_alone_is_refused_before_any_fit(splits, tilts, monkeypatch):
    # An ERM estimator, no tilt above 0 and no offsets: it fitted ERM and "chose" it.
    X_fit, y_fit, X_val, y_val, *_ = splits

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking the options")

    monkeypatch.setattr(MR2LinearClassifier, "fit", no_fit)
    erm = MR2LinearClassifier(c_bar=None, device="cpu")
    with pytest.raises(ValueError, match="The front would hold ERM alone"):
        accuracy_front(erm, X_fit, y_fit, X_val, y_val, tilts=tilts)


@pytest.mark.parametrize("offsets_cv", [0.3, "splitter"])
def test_offsets_take_the_cv_their_estimator_takes(splits, offsets_cv):
    # A fraction or a splitter, as TunedOffsetsClassifierCV takes them (they were refused
    # for a moment as not a number of folds).
    from sklearn.model_selection import StratifiedKFold

    X_fit, y_fit, X_val, y_val, *_ = splits
    if offsets_cv == "splitter":
        offsets_cv = StratifiedKFold(3, shuffle=True, random_state=0)
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0,),
        offset_bounds=(0.01,), offsets_cv=offsets_cv,
    )  # fmt: skip
    assert repr(front.point("offsets≤1pt").estimator.cv) == repr(offsets_cv)  # cloned


def test_offsets_take_an_iterable_of_splits(splits):
    # The check before the fits exhausted a generator of splits, and the offsets' fit then
    # failed with "need at least one array to concatenate".
    from sklearn.model_selection import StratifiedKFold

    X_fit, y_fit, X_val, y_val, *_ = splits
    folds = StratifiedKFold(3).split(X_fit, y_fit)
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0,),
        offset_bounds=(0.01,), offsets_cv=folds,
    )  # fmt: skip
    assert len(front.point("offsets≤1pt").estimator.cv) == 3
    # None is scikit-learn's default cv (5 stratified folds), unused without offsets.
    for bounds in ((), (0.01,)):
        front = accuracy_front(
            MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0,),
            offset_bounds=bounds, offsets_cv=None,
        )  # fmt: skip
        assert len(front.points) == 2 + len(bounds)


def test_the_offsets_points_name_a_class_absent_from_the_held_out_data_by_its_label(splits):
    # Each bound's tuning named it by its column ("Classes [2]"), beside the fit's "['c']".
    X_fit, y_fit, X_val, y_val, *_ = splits
    names = np.array(list("abcde"), dtype=object)
    y_fit, y_val = names[y_fit], names[y_val]
    held_out = np.flatnonzero(y_fit != "c")[:100]
    folds = [(np.setdiff1d(np.arange(len(y_fit)), held_out), held_out)]
    with pytest.warns(UserWarning, match="have no samples") as caught:
        accuracy_front(
            MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0,),
            offset_bounds=(0.01, 0.02), offsets_cv=folds,
        )  # fmt: skip
    absent = [str(w.message) for w in caught if "have no samples" in str(w.message)]
    assert len(absent) == 3  # the fit's, then each bound's
    assert all(message.startswith("Classes ['c'] ") for message in absent)


def test_offsets_take_folds_given_as_boolean_masks(splits):
    # Sorted as masks, they named the last rows, and the check before the fits refused them.
    from sklearn.model_selection import StratifiedKFold

    X_fit, y_fit, X_val, y_val, *_ = splits
    rows = list(StratifiedKFold(3).split(X_fit, y_fit))
    masks = [tuple(np.isin(np.arange(len(y_fit)), part) for part in fold) for fold in rows]
    scores = [
        accuracy_front(
            MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0,),
            offset_bounds=(0.01,), offsets_cv=folds,
        ).point("offsets≤1pt").validation
        for folds in (rows, masks)
    ]  # fmt: skip
    assert scores[0] == scores[1]


def test_a_fraction_of_offsets_cv_is_split_by_random_state(splits):
    # The front had no random_state: a float offsets_cv drew another split on every call
    # (and for the refit of the chosen point), so its offsets points moved from run to run.
    X_fit, y_fit, X_val, y_val, *_ = splits
    kwargs = dict(tilts=(0,), offset_bounds=(0.01,), offsets_cv=0.3, random_state=3)

    def offsets(**kwargs):
        front = accuracy_front(
            MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, **kwargs
        )
        point = front.point("offsets≤1pt")
        assert point.estimator.random_state == kwargs.get("random_state")
        return point.validation

    assert offsets(**kwargs) == offsets(**kwargs)


def test_front_never_chooses_on_test_data(splits, front):
    """The same front with scrambled test labels makes the same choice."""
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    probe = make_pipeline(StandardScaler(), MR2LinearClassifier(C=0.1, device="cpu"))
    scrambled = accuracy_front(
        probe, X_fit, y_fit, X_val, y_val, tilts=(0, 1, 5), offset_bounds=(0.0, 0.01),
        X_test=X_test, y_test=np.roll(y_test, 7),
    )  # fmt: skip
    assert scrambled.chosen == front.chosen
    assert [p.validation for p in scrambled.points] == [p.validation for p in front.points]
    assert [p.test for p in scrambled.points] != [p.test for p in front.points]


def test_front_tables_and_json(front):
    text, markdown, data = front.to_text(), front.to_markdown(), front.to_dict()
    assert "← chosen" in text and "within 0.5 pt of ERM's" in text
    assert markdown.count("\n|") == len(front.points) + 2  # header, rule, rows
    # The text table: a column per score of each split, a row per point in percent, and
    # the chosen point marked, alone.
    lines = text.splitlines()
    columns = ("overall", "hard", "worst")
    words = [word for split in ("val", "test") for c in columns for word in (split, c)]
    assert lines[1].split() == ["point", *words]
    erm = front.points[0]
    scores = [f"{100 * s[c]:.2f}" for s in (erm.validation, erm.test) for c in columns]
    assert lines[3].split()[-6:] == scores
    assert [row.split()[0] for row in lines[3:] if "← chosen" in row] == [front.chosen]
    # Columns right-aligned, two spaces apart: every line of the table as wide as its rule.
    assert "val overall  val hard  val worst" in lines[1]
    assert {len(line) for line in lines[1:]} == {len(lines[2])}
    # The markdown table's rule has a cell per column of its header.
    header, rule = markdown.split("\n")[2:4]
    assert rule.count("|") == header.count("|")
    assert json.loads(json.dumps(data))["chosen"] == front.chosen
    # The rule under its key, without the word that names it again (as "rule: rule: ...").
    assert data["rule"].startswith("the largest validation worst-class accuracy")
    # Percent, like the tables and ClasswiseReport.to_dict.
    assert data["units"] == "percent" and data["bound"] == 0.5
    erm = data["points"][0]
    assert erm["name"] == "ERM"
    for split in ("validation", "test"):
        in_percent = {k: 100 * v for k, v in getattr(front.points[0], split).items()}
        assert erm[split] == pytest.approx(in_percent)
    # An offsets point's value is its bound in points; a tilt point's is its t.
    values = {p["name"]: p["value"] for p in data["points"]}
    assert values["offsets≤1pt"] == 1.0 and values["tilt=5"] == 5.0


def test_plot_front(front, tmp_path):
    fig = plot_front(front, tmp_path / "front.png")
    assert (tmp_path / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left = fig.axes[0]
    assert [line.get_label() for line in left.lines if not line.get_label().startswith("_")][
        :4
    ] == ["ERM", "MR2", "tilt", "offsets"]
    # The palette shared by every figure.
    for line in left.lines:
        if line.get_label() in LEVER_COLOURS:
            assert to_hex(line.get_color()) == LEVER_COLOURS[line.get_label()]
    # The tilt curve starts at the untilted MR² point (1 + two tilts), drawn as a line
    # from MR2's own marker, which it used to cover in the tilt colour.
    mr2 = front.point("MR2").test
    tilt = next(line for line in left.lines if line.get_label() == "tilt")
    assert len(tilt.get_xdata()) == 2
    start = next(line for line in left.lines if len(line.get_xdata()) == 3)
    assert start.get_marker() in ("None", "", None) and start.get_label().startswith("_")
    x, y = start.get_xdata()[0], start.get_ydata()[0]
    assert (x, y) == pytest.approx((100 * mr2["overall"], 100 * mr2["worst"]))
    marked = [line for line in left.lines if line.get_marker() not in ("None", "", None)]
    at_mr2 = [
        line.get_label()
        for line in marked
        if any(np.isclose(line.get_xdata(), x) & np.isclose(line.get_ydata(), y))
        and line.get_markersize() < 10  # not the ring of the rule's choice
    ]
    assert at_mr2 == ["MR2"]
    # Tilt points labelled by t, offsets points by their bound in points: a tilt of 5 and
    # a bound of 5 points were both labelled "5".
    assert [t.get_text() for t in left.texts] == ["ERM", "MR2", "t=1", "t=5", "≤0pt", "≤1pt"]
    # Each beside its point, up and to the right, not over its marker; the rule's choice
    # (ERM) a line up, clear of its ring, which crossed its name.
    drawn = [next(line for line in left.lines if line.get_label() == p.lever) for p in front.points]
    points = [xy for line in dict.fromkeys(drawn) for xy in line.get_xydata().tolist()]
    assert [tuple(t.xy) for t in left.texts] == [tuple(xy) for xy in points]
    assert front.chosen == "ERM" and {t.anncoords for t in left.texts} == {"offset points"}
    offsets = {t.get_text(): t.xyann for t in left.texts}
    assert offsets == {**dict.fromkeys(offsets, (4, 3)), "ERM": (4, 11)}
    # One ring, on the rule's choice; the dashed line at ERM's overall accuracy − bound.
    chosen = front.point(front.chosen).test
    rings = [line for line in left.lines if line.get_markersize() == 14]
    assert len(rings) == 1
    assert (rings[0].get_xdata()[0], rings[0].get_ydata()[0]) == pytest.approx(
        (100 * chosen["overall"], 100 * chosen["worst"])
    )
    dashed = [line for line in left.lines if line.get_linestyle() == "--"]
    erm = front.point("ERM").test["overall"]
    assert len(dashed) == 1 and dashed[0].get_xdata()[0] == pytest.approx(100 * (erm - 0.005))
    # The rule reads the validation split, where the line is its bound: on the test split
    # the title said so of a line its own choice could fall left of.
    assert "the rule's choice on the validation split; dashed: ERM − 0.5 pt here" in (
        fig._suptitle.get_text()
    )
    on_val = plot_front(front, tmp_path / "val.png", split="validation")
    # No name over a marker or the ring (ERM's name was crossed by its ring).
    assert _names_over_marks(fig) == [] and _names_over_marks(on_val) == []
    assert "the rule's choice; dashed: ERM − 0.5 pt, its bound" in on_val._suptitle.get_text()
    assert left.get_xlabel() == "overall accuracy (%), test"
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "worst-class accuracy (%)",
        "hard-tercile accuracy (%)",
    ]
    # One legend for both axes, naming each lever once.
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["ERM", "MR2", "tilt", "offsets"]
    with pytest.raises(ValueError, match="split must be"):
        plot_front(front, tmp_path / "x.png", split="train")
    # Its dictionary, or a report: "'dict' object has no attribute 'points'" before.
    for other in (front.to_dict(), front.points):
        with pytest.raises(ValueError, match=r"plot_front draws a Front .*, got a (dict|list)\.$"):
            plot_front(other, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_tilt_points_run_in_increasing_tilt_whatever_the_order_given(splits):
    # In the order given, plot_front's tilt curve went from t = 10 back to t = 0.5.
    X_fit, y_fit, X_val, y_val, _, _ = splits
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    shuffled = accuracy_front(
        probe, X_fit, y_fit, X_val, y_val, tilts=(5, 0.5, 2, 0), offset_bounds=()
    )
    tilt = [p for p in shuffled.points if p.lever == "tilt"]
    assert [p.value for p in tilt] == [0.5, 2.0, 5.0]
    assert [p.name for p in tilt] == ["tilt=0.5", "tilt=2", "tilt=5"]


@pytest.fixture
def features(tmp_path, splits):
    X_fit, y_fit, _, _, X_test, y_test = splits
    np.savez(tmp_path / "train.npz", X=X_fit, y=y_fit)
    np.savez(tmp_path / "test.npz", X=X_test, y=y_test)
    return tmp_path


@pytest.mark.slow
def test_cli_front(features, capsys):
    out = features / "run"
    argv = [str(features / "train.npz"), "--test", str(features / "test.npz"), "--C", "0.1"]
    argv += ["--tilt", "0,1,5", "--offsets", "0,1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "accuracy front" in printed and "← chosen" in printed
    report = json.loads((out / "report.json").read_text())
    chosen = report["front"]["chosen"]
    assert report["units"] == report["front"]["units"] == "percent"
    # The front's ERM (fitted without the validation split) scores near the report's ERM.
    erm = report["front"]["points"][0]["test"]["overall"]
    assert erm == pytest.approx(report["rows"]["ERM"]["overall"], abs=5)
    assert f"chosen: {chosen}" in report["rows"]
    assert (out / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(os.listdir(out)) <= set(_OUTPUTS)  # the names the --out guard protects
    assert "accuracy front" in (out / "report.txt").read_text()
    models = joblib.load(out / "models.joblib")
    assert f"chosen: {chosen}" in models


@pytest.mark.slow
@pytest.mark.parametrize("scaling", ["none", "standard"])
def test_cli_front_of_a_cv_search_starts_from_its_choice(features, capsys, scaling):
    # MR2LinearClassifierCV has no warm_start: the front is that of the probe at its C.
    argv = [str(features / "train.npz"), "--test", str(features / "test.npz"), "--Cs", "3"]
    argv += ["--cv", "2", "--tilt", "0,1", "--feature-scaling", scaling, "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    chose = float(printed.split("MR2: chose C=")[1].split()[0])
    assert "tilt=1" in printed and chose in (1e-4, 1.0, 1e4)


@pytest.mark.parametrize(
    "lever, search, name",
    [
        ("ERM", ["--Cs", "2"], "ERM"),
        ("MR2", ["--Cs", "2"], "MR2"),
        ("MR2", ["--grid", "lam=0"], "MR2 grid"),
    ],
)
@pytest.mark.slow
def test_cli_front_s_choice_of_a_model_fitted_already_is_that_model(
    features, capsys, monkeypatch, lever, search, name
):
    # With --Cs, "chosen: ERM" was a cold fit at the search's C, and the search's own refit
    # (warm from its folds' mean) stopped elsewhere within tol: one configuration reported
    # twice, 5 of 250 test predictions apart.
    from mr2_probe import front as front_module

    def choose(front, bound=None):
        return front.point(lever)

    monkeypatch.setattr(front_module, "choose_point", choose)
    out = features / "run"
    argv = [str(features / "train.npz"), "--test", str(features / "test.npz"), *search]
    argv += ["--cv", "2", "--c-bar", "2", "--tilt", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert f"the rule chose {lever}, the model '{name}' fitted" in printed.err
    report = json.loads((out / "report.json").read_text())
    assert report["rows"][f"chosen: {lever}"] == report["rows"][name]
    models = joblib.load(out / "models.joblib")
    assert models[f"chosen: {lever}"] is models[name]  # (one object, pickled once)
    # Its search is said once, under the model's own name.
    assert f"chosen: {lever}:" not in printed.out
    assert not any(key.startswith("chosen") for key in report.get("cv", {}))
    assert not any(
        key.startswith("chosen") for key in report.get("search", {}).get("best_params", {})
    )


@pytest.mark.parametrize("value", ["-1", "a,b", "nan"])
def test_cli_front_bad_values(features, value, capsys):
    with pytest.raises(SystemExit):
        main([str(features / "train.npz"), "--tilt", value])
    assert "--tilt" in capsys.readouterr().err


def test_front_of_a_search_is_refused_before_any_fit(splits, monkeypatch):
    # It failed after fitting ERM and MR2, on an unexplained "Invalid parameter 'warm_start'".
    X_fit, y_fit, X_val, y_val, *_ = splits

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking the options")

    monkeypatch.setattr(MR2LinearClassifierCV, "fit", no_fit)
    search = make_pipeline(StandardScaler(), MR2LinearClassifierCV(device="cpu"))
    with pytest.raises(ValueError, match="got MR2LinearClassifierCV. For a search, pass the"):
        accuracy_front(search, X_fit, y_fit, X_val, y_val)


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_the_front_s_probe_is_the_one_the_search_chose(splits, head):
    # The CLI's front starts from the probe at the search's choice: a cosine search's
    # value is its logit scale, not C.
    from mr2_probe.cli._models import _chosen_configuration

    X_fit, y_fit, *_ = splits
    search = MR2LinearClassifierCV([2.0, 8.0], cv=2, head=head, max_iter=50, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe = _chosen_configuration(make_pipeline(StandardScaler(), search).fit(X_fit, y_fit))
    params = probe[-1].get_params()
    chosen, default = MR2LinearClassifier().get_params(), ("scale" if head == "cosine" else "C")
    other = "C" if head == "cosine" else "scale"
    assert params[default] == search.C_ and params[other] == chosen[other]
    assert params["head"] == head and isinstance(probe[0], StandardScaler)


def test_plot_front_labels_close_values_apart_as_their_names_are(splits, tmp_path):
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val,
        tilts=(1.0, 1.0000001), offset_bounds=(0.01, 0.0100000001),
    )  # fmt: skip
    assert [p.name for p in front.points][-4:] == [
        "tilt=1", "tilt=1.0000001", "offsets≤1pt", "offsets≤1.00000001pt"
    ]  # fmt: skip
    fig = plot_front(front, tmp_path / "front.png")
    # Each was labelled "1".
    labels = ["t=1", "t=1.0000001", "≤1pt", "≤1.00000001pt"]
    assert [t.get_text() for t in fig.axes[0].texts][-4:] == labels


@pytest.mark.parametrize("with_mr2", [pytest.param(True, marks=pytest.mark.slow), False])
def test_plot_front_tilt_curve_starts_at_the_untilted_point_in_both_axes(tmp_path, with_mr2):
    # The tilt sweep starts from the MR² model, or from ERM when there is no MR² point:
    # its line is drawn from that point in each axis (worst class, hard tercile).
    def point(name, lever, value, overall, worst, hard):
        scores = {"overall": overall, "worst": worst, "hard": hard}
        return FrontPoint(name, lever, value, None, scores, None)

    points = [point("ERM", "ERM", None, 0.90, 0.50, 0.70)]
    if with_mr2:
        points.append(point("MR2", "MR2", None, 0.89, 0.55, 0.72))
    points += [
        point("tilt=1", "tilt", 1.0, 0.88, 0.60, 0.74),
        point("tilt=5", "tilt", 5.0, 0.85, 0.65, 0.77),
    ]
    fig = plot_front(Front(points, bound=0.05, chosen="tilt=1"), tmp_path / "f.png")
    start = points[1] if with_mr2 else points[0]
    for ax, column in zip(fig.axes[:2], ("worst", "hard"), strict=True):
        curve = next(line for line in ax.lines if len(line.get_xdata()) == 3)
        assert list(curve.get_xdata()) == pytest.approx(
            [100 * p.validation["overall"] for p in [start, *points[-2:]]]
        )
        assert list(curve.get_ydata()) == pytest.approx(
            [100 * p.validation[column] for p in [start, *points[-2:]]]
        )
        # Without test scores, the validation split's, its bound line at ERM's there.
        assert ax.get_xlabel() == "overall accuracy (%), validation"
        dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
        assert dashed[0].get_xdata()[0] == pytest.approx(85.0)
        # One ring, on the rule's choice (tilt=1), not on ERM.
        (ring,) = [line for line in ax.lines if line.get_markersize() == 14]
        assert (ring.get_xdata()[0], ring.get_ydata()[0]) == pytest.approx(
            (88.0, 100 * points[-2].validation[column])
        )
    # One tilt point is still a point of the curve: a round marker, not ERM's square.
    fig = plot_front(Front(points[:1] + points[-1:], bound=0.05), tmp_path / "one.png")
    tilt = next(line for line in fig.axes[0].lines if line.get_label() == "tilt")
    assert tilt.get_marker() == "o"
    erm = next(line for line in fig.axes[0].lines if line.get_label() == "ERM")
    assert erm.get_marker() == "s"
    # Only the levers the front holds are drawn and named: no empty MR² or offsets line.
    named = [line.get_label() for line in fig.axes[0].lines if line.get_label()[0] != "_"]
    assert named == ["ERM", "tilt"]


@pytest.mark.slow
def test_plot_front_stacks_the_names_of_points_at_one_spot(tmp_path):
    # ERM and MR² at one spot (margins that change no prediction) wrote "MR2" over "ERM".
    same = {"overall": 0.9, "worst": 0.5, "hard": 0.7}
    points = [
        FrontPoint("ERM", "ERM", None, None, same, None),
        FrontPoint("MR2", "MR2", None, None, same, None),
        FrontPoint("tilt=1", "tilt", 1.0, None, {**same, "worst": 0.6, "hard": 0.8}, None),
    ]
    fig = plot_front(Front(points, bound=0.05), tmp_path / "f.png")
    for ax in fig.axes[:2]:
        names = {t.get_text(): t.xyann for t in ax.texts}
        assert names == {"ERM": (4, 3), "MR2": (4, 11), "t=1": (4, 3)}


@pytest.mark.parametrize("apart", [0.0005, 0.001])
def test_plot_front_stacks_the_names_of_points_closer_than_a_name(tmp_path, apart):
    # ERM and MR² 0.05 to 0.1 point apart on an axis of 2.5 points (Fashion-MNIST, margins
    # that change a few predictions) wrote "ERMMR2"; a point far off keeps its place.
    # ERM's name, over MR²'s marker in its own place, goes up a line and MR²'s keeps its.
    scores = {"overall": 0.84, "worst": 0.6, "hard": 0.7}
    points = [
        FrontPoint("ERM", "ERM", None, None, scores, None),
        FrontPoint("MR2", "MR2", None, None, {**scores, "overall": 0.84 + apart}, None),
        FrontPoint("tilt=1", "tilt", 1.0, None, {**scores, "overall": 0.815, "worst": 0.7}, None),
    ]
    fig = plot_front(Front(points, bound=0.005), tmp_path / "f.png")
    for ax in fig.axes[:2]:
        names = {t.get_text(): t.xyann for t in ax.texts}
        assert names == {"ERM": (4, 11), "MR2": (4, 3), "t=1": (4, 3)}


def _names_over_marks(fig):
    """(name, mark) of each name whose drawn text covers a marker of its axes or the ring:
    the text's window extent against each marker's display position and radius (its half
    side for a square)."""
    fig.draw_without_rendering()
    renderer, over = fig.canvas.get_renderer(), []
    for ax in fig.axes:
        marked = [line for line in ax.lines if line.get_marker() not in ("None", "", None)]
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            for line in marked:
                centres = ax.transData.transform(line.get_xydata())  # (n, 2)
                radius = (line.get_markersize() + line.get_markeredgewidth()) / 2 * fig.dpi / 72
                gap = centres - np.clip(centres, box.min, box.max)  # (n, 2)
                apart = np.abs(gap).max(1) if line.get_marker() == "s" else np.hypot(*gap.T)
                mark = "ring" if line.get_markersize() == 14 else line.get_label()
                over += [(text.get_text(), mark)] * int((apart < radius).sum())
    return over


def _scored(name, lever, value, overall, worst):
    return FrontPoint(name, lever, value, None, {"overall": overall, "worst": worst, "hard": worst})


@pytest.mark.parametrize(
    "points, chosen",
    [
        # tilt=5 a little up and to the right of tilt=1: "t=1" was written over its marker.
        (
            [("ERM", "ERM", None, 0.90, 0.5), ("tilt=1", "tilt", 1.0, 0.86, 0.6),
             ("tilt=5", "tilt", 5.0, 0.8615, 0.602)],
            None,
        ),
        # The ring of the rule's choice crossed the choice's own name.
        ([("ERM", "ERM", None, 0.90, 0.5), ("tilt=1", "tilt", 1.0, 0.85, 0.6)], "ERM"),
        ([("ERM", "ERM", None, 0.90, 0.5), ("tilt=1", "tilt", 1.0, 0.85, 0.6)], "tilt=1"),
        # ERM and MR² closer than a name: "ERM" was written over MR²'s marker and its ring.
        ([("ERM", "ERM", None, 0.84, 0.6), ("MR2", "MR2", None, 0.8405, 0.6),
          ("tilt=1", "tilt", 1.0, 0.815, 0.7)], "MR2"),
    ],
)  # fmt: skip
def test_plot_front_writes_no_name_over_a_marker_or_the_ring(tmp_path, points, chosen):
    front = Front([_scored(*p) for p in points], bound=0.05, chosen=chosen)
    fig = plot_front(front, tmp_path / "f.png")
    assert _names_over_marks(fig) == []
    # Each name is still up and to the right of its own point.
    assert all(t.xyann[0] == 4 and t.xyann[1] >= 3 for ax in fig.axes for t in ax.texts)


def test_plot_front_warns_once_of_a_glyph_its_font_lacks_when_it_places_names(tmp_path):
    # Placing the names draws the figure before it is saved: matplotlib's warnings per
    # glyph and text came from that drawing beside the one MissingGlyphWarning of saving.
    from matplotlib import rc_context

    from mr2_probe.plotting import MissingGlyphWarning

    scores = {"overall": 0.9, "worst": 0.5, "hard": 0.7}
    points = [
        FrontPoint("ERM", "ERM", None, None, scores, None),
        FrontPoint("offsets≤1pt", "offsets", 0.01, None, {**scores, "worst": 0.6}, None),
    ]
    with rc_context({"font.family": ["cmr10"]}), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (cmr10 lacks "≤" and "−"; matplotlib ships it)
        plot_front(Front(points, bound=0.05), tmp_path / "f.png")
    glyphs = [w for w in caught if "≤" in str(w.message) or "LESS-THAN" in str(w.message)]
    assert [w.category for w in glyphs] == [MissingGlyphWarning]


def test_plot_front_draws_the_validation_split_where_a_point_lacks_test_scores(tmp_path):
    # Test scores of some points only (a front put together by hand): every point is drawn
    # on the split they all have, not the others' test scores beside its validation ones.
    scores = {"overall": 0.9, "worst": 0.5, "hard": 0.7}
    test = {"overall": 0.8, "worst": 0.4, "hard": 0.6}
    points = [
        FrontPoint("ERM", "ERM", None, None, scores, test),
        FrontPoint("tilt=1", "tilt", 1.0, None, {**scores, "worst": 0.6}, None),
    ]
    fig = plot_front(Front(points, bound=0.05), tmp_path / "f.png")
    assert fig.axes[0].get_xlabel() == "overall accuracy (%), validation"
    erm = next(line for line in fig.axes[0].lines if line.get_label() == "ERM")
    assert (erm.get_xdata()[0], erm.get_ydata()[0]) == pytest.approx((90, 50))


def test_a_front_has_no_point_of_an_unknown_name():
    front = Front([_point("ERM", 0.9, 0.6), _point("tilt=1", 0.9, 0.7)])
    with pytest.raises(KeyError, match="No point named 'tilt=2'"):
        front.point("tilt=2")


@pytest.mark.parametrize(
    "head, tilts, expected",
    [
        # A linear head solved by L-BFGS is a convex problem: each tilt is fitted from the
        # previous point's solution (the MR² point's first), ERM and MR² cold.
        ("linear", (1, 5), [(0.0, False), (0.0, False), (1.0, True), (5.0, True)]),
        # L-BFGS solves the cosine head too, but its problem is not convex (the weights are
        # normalised): a warm start can end at another solution than the point's refit.
        ("cosine", (1,), [(0.0, False), (0.0, False), (1.0, False)]),
    ],
)
def test_an_lbfgs_sweep_warm_starts_each_tilt_where_the_problem_is_convex(
    splits, monkeypatch, head, tilts, expected
):
    X_fit, y_fit, X_val, y_val, *_ = splits
    starts, fit = [], MR2LinearClassifier.fit

    def recording_fit(self, X, y, **kwargs):
        starts.append((self.class_tilt, self.warm_start))
        return fit(self, X, y, **kwargs)

    monkeypatch.setattr(MR2LinearClassifier, "fit", recording_fit)
    probe = MR2LinearClassifier(C=0.1, head=head, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=tilts)
    assert front.point("tilt=1").model.solver_ == "lbfgs"
    assert starts == expected


def test_point_names_write_each_value_in_full(splits):
    # A tilt of 10 is "tilt=10" and one of 2.5 "tilt=2.5", a bound of 2.5 pt
    # "offsets≤2.5pt": the values as %g writes them, never cut to fewer digits.
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val,
        tilts=(2.5, 10), offset_bounds=(0.025,),
    )  # fmt: skip
    names = [p.name for p in front.points]
    assert names == ["ERM", "MR2", "tilt=2.5", "tilt=10", "offsets≤2.5pt"]


def test_tilts_are_named_as_given(splits):
    # A tilt of 1e-320 (a subnormal float, held to 11 bits) was named "tilt=9.99989e-321",
    # its 6 digits in %g, not the value given, and one of 1.23456789 "tilt=1.23457", which
    # typed back is another tilt; the others keep their names, a bound's in %g (0.007 is
    # 0.7000000000000001 pt in float arithmetic).
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val,
        tilts=(1e-320, 0.5, 1.23456789, 10), offset_bounds=(0.007,),
    )  # fmt: skip
    names = [p.name for p in front.points]
    assert names == [
        "ERM", "MR2", "tilt=1e-320", "tilt=0.5", "tilt=1.23456789", "tilt=10", "offsets≤0.7pt"
    ]  # fmt: skip
    assert front.point("tilt=1e-320").value == 1e-320
    assert front.point("tilt=1.23456789").value == 1.23456789


def test_a_tilt_of_zero_given_twice_is_the_mr2_point_once(splits):
    # A tilt of 0 is the MR² point itself: 0 and 0.0 are no repeat to refuse, and no
    # point of their own.
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(
        MR2LinearClassifier(C=0.1, device="cpu"), X_fit, y_fit, X_val, y_val, tilts=(0, 0.0, 1)
    )
    assert [p.name for p in front.points] == ["ERM", "MR2", "tilt=1"]


def test_tables_and_json_write_missing_and_nan_scores_as_nan_and_null():
    # A NaN score (a class absent from a split) is null in the JSON; a point without test
    # scores, in a front whose other points have them, shows "nan" in those columns.
    erm, tilt = _point("ERM", 0.9, float("nan")), _point("tilt=1", 0.9, 0.7)
    erm.test = {"overall": 0.8, "hard": 0.5, "worst": 0.4}
    front = Front([erm, tilt])
    assert front.to_text().splitlines()[4].split()[-3:] == ["nan", "nan", "nan"]
    assert front.to_dict()["points"][0]["validation"]["worst"] is None


def test_fits_gather_convergence_warnings_and_pass_other_warnings_on():
    from sklearn.base import BaseEstimator

    from mr2_probe.front import fit_collecting_short

    class Warns(BaseEstimator):
        def fit(self, X, y):
            warnings.warn("stopped short", ConvergenceWarning, stacklevel=2)
            warnings.warn("something else", UserWarning, stacklevel=2)
            return self

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short = fit_collecting_short(Warns(), None, None)
    assert [str(w.message) for w in short] == ["stopped short"]
    assert [(w.category, str(w.message)) for w in caught] == [(UserWarning, "something else")]


@pytest.mark.parametrize("error", [ValueError("its own error"), KeyboardInterrupt()])
def test_a_failed_fit_s_warnings_pass_on_and_never_replace_its_error(error):
    # The warnings held while a fit that failed ran are passed on (they were lost), but
    # never in the place of its error: one that a filter inside let through, which the
    # filters outside make an error, was raised on the way out in place of the fit's error
    # (a UserWarning in place of a Ctrl-C).
    from sklearn.base import BaseEstimator

    from mr2_probe.front import fit_collecting_short

    class Fails(BaseEstimator):
        def fit(self, X, y):
            with warnings.catch_warnings():
                warnings.simplefilter("always")  # (as a library's own filter may)
                warnings.warn("before the error", UserWarning, stacklevel=2)
            raise error

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(type(error)):
            fit_collecting_short(Fails(), None, None)
    assert [str(w.message) for w in caught] == ["before the error"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(type(error)) as raised:
            fit_collecting_short(Fails(), None, None)
    assert raised.value is error


def test_each_point_keeps_the_model_it_scored(front, splits):
    # The scored models were dropped: a warm-started tilt point could not be reproduced
    # exactly (a cold refit agrees only to within tol).
    X_fit, y_fit, X_val, y_val, X_test, y_test = splits
    labels = np.unique(y_val)
    erm_groups = {}
    for split, X_, y_ in (("validation", X_val, y_val), ("test", X_test, y_test)):
        erm = front.point("ERM").model.predict(X_)
        erm_groups[split] = difficulty_groups(per_class_accuracy(y_, erm, labels))
    for p in front.points:
        for split, X_, y_ in (("validation", X_val, y_val), ("test", X_test, y_test)):
            got = classwise_summary(y_, p.model.predict(X_), erm_groups[split], labels)
            assert got == getattr(p, split), (p.name, split)
    assert front.point("offsets≤1pt").model.offsets_ is not None


def test_a_front_without_test_data_says_so_in_its_title(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val,
                           tilts=(1,))  # fmt: skip
    for table in (front.to_text(), front.to_markdown()):
        assert table.splitlines()[0].startswith("accuracy front (%, validation); rule:")


def test_the_front_chooses_with_its_own_bound(splits):
    # accuracy_front handed choose_point a bound that no test told apart from the default.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = make_pipeline(StandardScaler(), MR2LinearClassifier(C=0.1, device="cpu"))
    wide = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(0, 1, 5), bound=0.5)
    assert wide.bound == 0.5 and wide.chosen == choose_point(wide, 0.5).name
    worst = max(p.validation["worst"] for p in wide.points)
    assert wide.point(wide.chosen).validation["worst"] == worst
    assert choose_point(wide, 0.0).name != wide.chosen  # the bound made the choice


@pytest.mark.parametrize(
    "labels, class_names, shown",
    [
        (np.array([0, 0, 0, 0, 1, 1, 1, 1, 2]), None, "[2]"),
        (np.array(list("aaaabbbbc")), None, "['c']"),
        # A list of NumPy's strings (list(names_array)) stayed NumPy's: [np.str_('emu')].
        (np.array([0, 0, 0, 0, 1, 1, 1, 1, 2]), list(np.array(["cat", "dog", "emu"])), "['emu']"),
    ],
)
def test_a_class_missing_from_an_offsets_fold_is_named_as_python_text(labels, class_names, shown):
    with pytest.raises(ValueError, match=rf"holds no sample of the classes {re.escape(shown)} "):
        check_offsets_folds(labels, 3, class_names=class_names)


def test_a_front_of_numpy_options_is_shown_with_python_numbers(splits):
    # Its repr said bound=np.float64(0.01) under NumPy 2.
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val,
                           tilts=np.array([1.0]), bound=np.float64(0.01))  # fmt: skip
    assert "bound=0.01," in repr(front) and "np." not in repr(front)


def test_erm_and_mr2_are_untilted_whatever_the_probe_and_erm_given(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    tilted = MR2LinearClassifier(class_tilt=2.0, device="cpu")
    front = accuracy_front(tilted, X_fit, y_fit, X_val, y_val, tilts=(1,))
    # ERM and MR² are untilted; the tilt points are MR² with their tilt.
    for name in ("ERM", "MR2"):
        assert front.point(name).estimator.class_tilt == 0.0
        assert front.point(name).model.class_tilt == 0.0
    mr2 = front.point("MR2").estimator.get_params()
    assert front.point("tilt=1").estimator.get_params() == {**mr2, "class_tilt": 1.0}
    front = accuracy_front(tilted, X_fit, y_fit, X_val, y_val, tilts=(),
                           erm=MR2LinearClassifier(class_tilt=3.0, device="cpu"))  # fmt: skip
    assert front.point("ERM").estimator.class_tilt == 0.0


def test_a_class_no_model_predicts_counts_at_zero():
    # The summaries' labels are y's: a class ERM never predicts stays a class, at 0%.
    from mr2_probe.front import _score

    class Constant:
        def __init__(self, labels):
            self.labels = labels

        def predict(self, X):
            return self.labels

    y = np.array([0, 0, 1, 1, 2, 2])
    points = [
        FrontPoint("ERM", "ERM", None, None, model=Constant(np.array([0, 0, 1, 1, 1, 1]))),
        FrontPoint("MR2", "MR2", None, None, model=Constant(y)),
    ]
    _score(points, np.zeros((6, 1)), y, "validation")
    assert points[0].validation["worst"] == 0.0
    assert points[1].validation["worst"] == 1.0


def test_the_json_holds_plain_rounded_numbers(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    front = accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val,
                           tilts=np.array([1, 2]))  # fmt: skip
    assert [type(p.value) for p in front.points if p.lever == "tilt"] == [float, float]
    json.dumps(front.to_dict())
    point = FrontPoint("ERM", "ERM", None, None, {"overall": 0.57, "hard": 0.5, "worst": 0.5})
    assert Front([point]).to_dict()["points"][0]["validation"]["overall"] == 57.0


def test_point_names_are_short_unless_values_need_more_digits():
    from mr2_probe.front import _names

    assert _names("tilt={}", [1.0, 1.0000001]) == ["tilt=1", "tilt=1.0000001"]
    # A bound's name is of 100 × the bound, whose float arithmetic adds digits that no
    # one gave (0.007 is 0.7000000000000001 pt): %g's 6 digits.
    assert _names("offsets≤{}pt", [100 * 0.007, 100 * 0.0123456789]) == [
        "offsets≤0.7pt", "offsets≤1.23457pt"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "tilt, name",
    [
        (1.23456789, "tilt=1.23456789"),
        (1 / 3, "tilt=0.3333333333333333"),
        (1e-320, "tilt=1e-320"),
        (5.0, "tilt=5"),
        (0.5, "tilt=0.5"),
        (20.0, "tilt=20"),
        (100000.0, "tilt=100000"),
        (1e30, "tilt=1e+30"),
    ],
)
def test_a_tilt_s_name_writes_the_value_given_in_full(tilt, name):
    # A tilt of 1.23456789 was named "tilt=1.23457", its 6 digits in %g: typed back, that
    # is another tilt. A tilt's name reads back as its value, in %g where 6 digits do.
    from mr2_probe.front import _names

    assert _names("tilt={}", [tilt], given=True) == [name]
    assert float(name.removeprefix("tilt=")) == tilt


def test_scored_features_of_other_kinds_are_counted_or_left_to_the_pipeline():
    # Sparse matrices (a TruncatedSVD pipeline's input) have no len(); ragged lists of
    # tokens (a FunctionTransformer's) no shape: both went to the pipeline before the check.
    import scipy.sparse as sp

    from mr2_probe.front import _check_scored_features

    X = sp.random(20, 6, density=0.5, format="csr", random_state=0)
    _check_scored_features(X, {"val": (X[:5], np.arange(5))})
    with pytest.raises(ValueError, match="X_val has 5 samples but y_val has 4 labels"):
        _check_scored_features(X, {"val": (X[:5], np.arange(4))})
    with pytest.raises(ValueError, match="X_val has 4 features but X, the training data, has 6"):
        _check_scored_features(X, {"val": (X[:5, :4], np.arange(5))})
    ragged = [[1, 2], [3], [4, 5, 6]]
    _check_scored_features(ragged, {"val": (ragged, [0, 1, 0])})


def test_non_finite_scored_features_are_refused_after_the_erm_fit_alone(splits, monkeypatch):
    # The model's own check, after its first fit rather than after every point's.
    X_fit, y_fit, X_val, y_val, *_ = splits
    fits, fit = [], MR2LinearClassifier.fit

    def counted(self, *args, **kwargs):
        fits.append(self.c_bar)
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(MR2LinearClassifier, "fit", counted)
    X_test = X_val.copy()
    X_test[3, 2] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val,
                       tilts=(1, 5), X_test=X_test, y_test=y_val)  # fmt: skip
    assert fits == [None]  # ERM's fit, no other


def test_a_class_absent_from_y_val_is_named_in_a_warning(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    held = y_val != 3
    with pytest.warns(UserWarning, match=r"y_val holds no sample of the classes 3 of y: .*rule"):
        front = accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val[held],
                               y_val[held], tilts=())  # fmt: skip
    assert front.point("ERM").validation["overall"] > 0


def test_the_tilt_points_models_start_cold_when_refitted(splits):
    # Fitted from the previous point's solution, each keeps its estimator's warm_start.
    X_fit, y_fit, X_val, y_val, *_ = splits
    probe = MR2LinearClassifier(C=0.1, device="cpu")
    front = accuracy_front(probe, X_fit, y_fit, X_val, y_val, tilts=(1, 5))
    for p in front.points:
        assert p.model.get_params() == p.estimator.get_params(), p.name
    refit = front.point("tilt=5").model.fit(X_fit[y_fit < 3], y_fit[y_fit < 3])
    assert refit.classes_.tolist() == [0, 1, 2]


def test_five_unknown_labels_are_all_named(splits):
    X_fit, y_fit, X_val, y_val, *_ = splits
    with pytest.raises(ValueError, match=r"labels: 5, 6, 7, 8, 9\. No point"):
        accuracy_front(MR2LinearClassifier(device="cpu"), X_fit, y_fit, X_val, y_val + 5)


@pytest.mark.parametrize("split", ["y", "y_val", "y_test"])
def test_a_missing_label_of_a_pandas_string_column_is_named_before_any_fit(splits, split):
    # pd.NA (a pandas column of dtype "string") failed the check of NaN: "boolean value of
    # NA is ambiguous".
    pd = pytest.importorskip("pandas")
    X_fit, y_fit, X_val, y_val, *_ = splits
    names = np.array([f"class {k}" for k in range(10)])
    labels = {
        "y": pd.array(names[y_fit], dtype="string"),
        "y_val": pd.array(names[y_val], dtype="string"),
        "y_test": pd.array(names[y_val], dtype="string"),
    }
    labels[split][3] = pd.NA
    with pytest.raises(ValueError, match=rf"^Input {split} holds 1 missing label \(pd.NA\)"):
        accuracy_front(
            MR2LinearClassifier(device="cpu"), X_fit, labels["y"], X_val, labels["y_val"],
            X_test=X_val, y_test=labels["y_test"],
        )  # fmt: skip


@pytest.mark.parametrize("split, purpose", [("y", "fit"), ("y_val", "score"), ("y_test", "score")])
def test_only_missing_labels_are_named_for_what_the_split_is_for(splits, split, purpose):
    # y_val and y_test are scored, not fitted: "there is no class to fit" misled.
    X_fit, y_fit, X_val, y_val, *_ = splits
    labels = {"y": y_fit, "y_val": y_val, "y_test": y_val}
    labels[split] = np.full(len(labels[split]), None, dtype=object)
    with pytest.raises(ValueError, match=rf"^Input {split} holds only .* no class to {purpose}\."):
        accuracy_front(
            MR2LinearClassifier(device="cpu"), X_fit, labels["y"], X_val, labels["y_val"],
            X_test=X_val, y_test=labels["y_test"],
        )  # fmt: skip


@pytest.mark.parametrize("split", ["y", "y_val", "y_test"])
def test_a_missing_label_is_named_before_any_fit(splits, split):
    # NaN among object labels (a pandas column's missing value): the sort of y's classes
    # raised "'<' not supported between instances of 'float' and 'str'"; y_val's was told
    # it held labels of types that cannot be compared.
    X_fit, y_fit, X_val, y_val, *_ = splits
    names = np.array([f"class {k}" for k in range(10)], dtype=object)
    labels = {"y": names[y_fit], "y_val": names[y_val], "y_test": names[y_val]}
    labels[split][3] = np.nan
    with pytest.raises(ValueError, match=rf"^Input {split} holds 1 missing label \(NaN\) .* 3,"):
        accuracy_front(
            MR2LinearClassifier(device="cpu"), X_fit, labels["y"], X_val, labels["y_val"],
            X_test=X_val, y_test=labels["y_test"],
        )  # fmt: skip


def test_the_markdown_table_rule_and_the_offsets_points_models(front, splits):
    assert front.to_markdown().splitlines()[3] == "|" + "---|" * 7
    X_fit, y_fit, X_val, y_val, *_ = splits
    for p in front.points:
        if p.lever != "offsets":
            continue
        assert p.estimator.store_cv_results is False
        # The model is a fit at this point's bound: its parameters and scores are this
        # bound's, not the largest bound's that the base fit was tuned at.
        assert p.model.max_accuracy_drop == p.value and not hasattr(p.model, "cv_results_")
        assert p.model.accuracy_drop_ <= p.value + 1e-12
        np.testing.assert_array_equal(
            p.model.predict(X_val), p.model.classes_[np.argmax(p.model.decision_function(X_val), 1)]
        )


def test_labels_of_object_dtype_are_classes_as_the_training_labels_are(splits):
    # The check of a regression target, run on y_val too, refused object-dtype labels (a
    # pandas column of ints) that the front scored before.
    from mr2_probe.front import _check_known_labels

    _, y_fit, _, y_val, *_ = splits
    _check_known_labels(y_fit, {"y_val": y_val.astype(object), "y_test": list(y_val)})
