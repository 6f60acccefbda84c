"""Figures: written as valid PNGs, with the right bars, order, colours and labels."""

import warnings

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="plotting needs matplotlib (the 'plot' extra)")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.image import imread  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.exceptions import ConvergenceWarning, NotFittedError  # noqa: E402

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV  # noqa: E402
from mr2_probe.plotting import (  # noqa: E402
    GAIN,
    LEVER_COLOURS,
    LOSS,
    OTHER_COLOURS,
    REFERENCE,
    SAME,
    model_colours,
    plot_class_accuracy,
    plot_cv_curve,
    plot_group_accuracy,
    plot_margins,
)
from mr2_probe.report import classwise_report  # noqa: E402

Y = np.repeat([3, 1, 2, 0, 4, 5], 4)
# Reference accuracy per class 3, 1, 2, 0, 4, 5 (label order 0..5 is shuffled on purpose).
ERM = np.array([3, 3, 3, 3, 1, 1, 1, 0, 2, 2, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 5, 5, 5, 0])
MR2 = np.array([3, 3, 3, 0, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 4, 4, 0, 0, 5, 5, 5, 0])


@pytest.fixture
def report():
    return classwise_report({"ERM": ERM, "MR2": MR2}, Y)


def _assert_png(path, min_width=300):
    with open(path, "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[1] >= min_width and image.shape[2] in (3, 4)
    # Not a blank canvas.
    assert image[..., :3].std() > 0.05


def _bars(ax):
    """The bars drawn on ``ax``, in the order drawn, whether each is a patch (``ax.bar``'s)
    or a path of a collection: (centres, widths, heights, colours as hex), one per bar."""
    from matplotlib.patches import Rectangle

    boxes, colours = [], []
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            boxes.append(patch.get_bbox().get_points())
            colours.append(to_hex(patch.get_facecolor()))
    for collection in ax.collections:
        paths = collection.get_paths()
        faces = np.broadcast_to(collection.get_facecolor(), (len(paths), 4))
        boxes += [path.get_extents().get_points() for path in paths]
        colours += [to_hex(face, keep_alpha=False) for face in faces]
    boxes = np.reshape(boxes, (-1, 2, 2))  # ((x0, y0), (x1, y1)) of each bar
    return boxes[:, :, 0].mean(1), np.diff(boxes[:, :, 0])[:, 0], boxes[:, 1, 1], colours


def test_class_accuracy_plot(tmp_path, report):
    path = tmp_path / "classes.png"
    fig = plot_class_accuracy(report, path)
    _assert_png(path)
    ax = fig.axes[0]
    # Reference accuracies: 0 -> 1.0, 3 -> 1.0, 1 -> .75, 5 -> .75, 2 -> .5, 4 -> .25.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "3", "1", "5", "2", "4"]
    _, _, heights, colours = _bars(ax)
    np.testing.assert_allclose(heights[:6], [100, 100, 75, 75, 50, 25])
    np.testing.assert_allclose(heights[6:], [100, 75, 100, 75, 50, 50])
    assert colours[6:] == [SAME, LOSS, GAIN, SAME, SAME, GAIN]
    assert set(colours[:6]) == {REFERENCE}
    assert [t.get_text() for t in ax.texts] == ["-25.0", "+25.0", "+25.0"]
    assert ax.get_ylabel() == "per-class accuracy (%)"
    assert "sorted by ERM accuracy" in ax.get_xlabel()
    # Dotted lines between the groups: after 2 easy and after 2 medium classes.
    assert [line.get_xdata()[0] for line in ax.lines] == [1.5, 3.5]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["ERM", "MR2: gain", "MR2: loss", "MR2: same"]


FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot"]  # fmt: skip


@pytest.mark.parametrize(
    "names, rotation",
    [
        (FASHION, 45),  # ten Fashion-MNIST names overlap side by side
        ([f"cls {k:02d}" for k in range(10)], 45),  # ten names of six characters overlap too
        ([str(k) for k in range(10)], 0),  # digits fit
        ([f"class {k}" for k in range(50)], 90),  # many classes stand upright
    ],
)
@pytest.mark.slow
def test_long_class_names_are_rotated(tmp_path, names, rotation):
    y = np.repeat(np.array(names), 2)
    report = classwise_report({"ERM": y, "MR2": np.roll(y, 1)}, y)
    fig = plot_class_accuracy(report, tmp_path / "classes.png")
    labels = fig.axes[0].get_xticklabels()
    assert sorted(t.get_text() for t in labels) == sorted(names)
    assert {t.get_rotation() for t in labels} == {rotation}
    if rotation:  # anchored at the end of the name, under its bar
        assert {t.get_horizontalalignment() for t in labels} == {"right"}


@pytest.mark.slow
def test_imagenet_length_names_stay_inside_the_figure(tmp_path):
    # 50 names of ImageNet's length, turned upright in a figure of fixed height, squeezed
    # the axes to nothing ("constrained_layout not applied"): no name, not even the axis
    # label, was inside the figure.
    names = [f"{k} Staffordshire bullterrier, Staffordshire bull terrier" for k in range(50)]
    y = np.repeat(np.array(names), 2)
    report = classwise_report({"ERM": y, "MR2": np.roll(y, 1)}, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's warning of a collapsed layout
        fig = plot_class_accuracy(report, tmp_path / "classes.png")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    shown = [t for t in ax.get_xticklabels() if t.get_window_extent(renderer).y0 >= 0]
    assert len(shown) == 50 and ax.xaxis.label.get_window_extent(renderer).y0 >= 0
    assert ax.get_window_extent(renderer).height > 0.4 * fig.bbox.height  # the bars' room
    assert {len(t.get_text()) for t in shown} == {32} and shown[0].get_text().endswith("…")


@pytest.mark.slow
def test_names_with_dollar_signs_are_drawn_as_written(tmp_path):
    # Two $ in a class name started mathtext, which failed on "$_$" after every fit.
    names = ["$_$", "b$^$", "c"]
    y = np.repeat(np.array(names), 3)
    report = classwise_report({"ERM": y, "MR2 $x$": np.roll(y, 1)}, y)
    plot_group_accuracy(report, tmp_path / "groups.png")
    _assert_png(tmp_path / "groups.png")
    fig = plot_class_accuracy(report, tmp_path / "classes.png")
    _assert_png(tmp_path / "classes.png")
    escaped = {name.replace("$", r"\$") for name in names}  # drawn as a literal $
    assert {t.get_text() for t in fig.axes[0].get_xticklabels()} == escaped
    rng = np.random.default_rng(0)
    X = rng.normal(size=(9, 2)) + 3 * np.repeat([0, 1, 2], 3)[:, None]
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y)
    plot_margins(clf, tmp_path / "margins.png")
    _assert_png(tmp_path / "margins.png")
    # Names only: the log axis of the validation curves keeps its mathtext ticks (10⁻²).
    search = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu").fit(X, y)
    fig = plot_cv_curve({"MR2 $x$": search}, tmp_path / "cv.png")
    _assert_png(tmp_path / "cv.png")
    assert all(t.get_parse_math() for t in fig.axes[0].get_xticklabels())


def test_characters_the_font_lacks_are_one_warning_per_figure(tmp_path):
    # matplotlib warned "Glyph 29483 (...) missing from font(s) DejaVu Sans" for each
    # character of each text drawn.
    import matplotlib

    from mr2_probe.plotting import MissingGlyphWarning

    y = np.repeat(np.array(["\u732b", "\u732b\u72ac", "dog"]), 3)  # 猫, 猫犬, dog
    report = classwise_report({"ERM": y, "MR2": np.roll(y, 1)}, y)
    with warnings.catch_warnings(record=True) as caught, matplotlib.rc_context():
        warnings.simplefilter("always")
        matplotlib.rcParams["font.family"] = ["DejaVu Sans"]  # (bundled, no CJK glyphs)
        plot_class_accuracy(report, tmp_path / "classes.png")
    assert [(w.category, w.message.characters) for w in caught] == [
        (MissingGlyphWarning, ("\u732b", "\u72ac"))
    ]
    assert caught[0].filename == __file__  # the caller's line, not the library's
    assert str(caught[0].message).endswith(
        "they are drawn as boxes in " + str(tmp_path / "classes.png")
    )


@pytest.mark.parametrize(
    "wording", ["missing from font(s) DejaVu Sans.", "missing from current font."]
)
def test_both_wordings_of_matplotlib_s_glyph_warning_are_gathered(tmp_path, wording):
    # matplotlib 3.7 says "missing from current font.", later ones "missing from font(s)
    # ...": the older wording was not gathered into one MissingGlyphWarning.
    from mr2_probe.plotting import MissingGlyphWarning, _save

    class Figure:  # warns as matplotlib's savefig does, per character and text drawn
        def savefig(self, path, dpi):
            for code in (29483, 29483, 29356):
                warnings.warn(f"Glyph {code} ({chr(code)}) {wording}", UserWarning, stacklevel=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _save(Figure(), tmp_path / "f.png")
    assert [(w.category, w.message.characters) for w in caught] == [
        (MissingGlyphWarning, ("\u732b", "\u72ac"))
    ]


def test_names_that_are_not_utf8_are_drawn_as_their_escapes(tmp_path):
    # A lone surrogate (a file name that was not UTF-8, as os.listdir decodes it) is drawn
    # as its escape, as report.json writes it: not as "?", which another name can be.
    y = np.repeat(np.array(["caf\udce9", "caf?"]), 2)
    report = classwise_report({"ERM": y, "MR2 \udce9": np.roll(y, 1)}, y)
    fig = plot_class_accuracy(report, tmp_path / "classes.png")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["caf?", "caf\\udce9"]
    assert fig.axes[0].get_title() == "per-class accuracy: MR2 \\udce9 vs ERM"


def test_figures_are_written_at_120_dots_per_inch(tmp_path, report):
    fig = plot_group_accuracy(report, tmp_path / "groups.png")
    height, width = imread(tmp_path / "groups.png").shape[:2]
    assert (width, height) == (120 * fig.get_figwidth(), 120 * fig.get_figheight())


def test_class_std_curve_is_the_spread_itself(tmp_path):
    # It was its scorer's negation: a line near -5 on an axis of held-out percentages.
    from mr2_probe.plotting import cv_curves

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 40)
    X = rng.normal(size=(120, 4)) + 0.5 * y[:, None]
    search = MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring="class_std", device="cpu")
    search.fit(X, y)
    curve = cv_curves(search, "class_std")["class_std"]
    assert (curve > 0).all()
    spreads = np.nanstd(search.class_accuracy_path_, axis=2).mean(0)
    np.testing.assert_allclose(curve, spreads, rtol=1e-6)
    # The other curves are each fold's balanced and worst-class accuracy, averaged.
    curves, path = cv_curves(search, "class_std"), search.class_accuracy_path_
    np.testing.assert_allclose(curves["worst_class"], np.nanmin(path, axis=2).mean(0))
    np.testing.assert_allclose(curves["balanced_accuracy"], np.nanmean(path, axis=2).mean(0))
    assert not np.allclose(curves["worst_class"], np.nanmin(path, axis=2).min(0))
    fig = plot_cv_curve({"MR2": search}, tmp_path / "cv.png", "class_std")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "MR2 class_std (lower is better)" in labels


@pytest.mark.slow
def test_cv_curves_take_the_search_s_own_scoring_not_the_caller_s_label(tmp_path):
    # The spread was negated only where the caller named it "class_std" (the curve ran
    # below 0 by default), and a label "worst_class" on a search that chose by accuracy
    # named the accuracy curve so and dropped the real worst-class curve.
    from mr2_probe.metrics import class_std_scorer
    from mr2_probe.plotting import cv_curves

    X, y = load_iris(return_X_y=True)
    for scoring in ("class_std", class_std_scorer):
        search = MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring=scoring, device="cpu")
        curves = cv_curves(search.fit(X, y))
        assert list(curves) == ["class_std", "balanced_accuracy", "worst_class"]
        np.testing.assert_allclose(curves["class_std"], -search.scores_[1].mean(0))
        assert (curves["class_std"] > 0).all()
        fig = plot_cv_curve({"MR2": search}, tmp_path / "cv.png")
        assert "MR2 class_std (lower is better)" in fig.axes[0].get_legend_handles_labels()[1]
    by_accuracy = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu").fit(X, y)
    for label in ("worst_class", "balanced_accuracy", "class_std"):
        with pytest.raises(ValueError, match=rf"^scoring='{label}' would name the search's own "):
            cv_curves(by_accuracy, label)
        with pytest.raises(ValueError, match="but it chose by 'accuracy'"):
            plot_cv_curve({"MR2": by_accuracy}, tmp_path / "refused.png", label)
    assert not (tmp_path / "refused.png").exists()
    assert list(cv_curves(by_accuracy, "acc")) == ["acc", "balanced_accuracy", "worst_class"]
    by_callable = MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring=lambda e, X, y: 0.5)
    assert next(iter(cv_curves(by_callable.set_params(device="cpu").fit(X, y)))) == "score"
    with pytest.raises(ValueError, match="but it chose by a callable of its own"):
        cv_curves(by_callable, "worst_class")  # it took the real worst-class curve's place
    # A clone's scorer is a copy (GridSearchCV's best_estimator_ holds one): still known.
    copied = clone(MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring=class_std_scorer))
    assert copied.scoring is not class_std_scorer
    curves = cv_curves(copied.set_params(device="cpu").fit(X, y))
    assert list(curves) == ["class_std", "balanced_accuracy", "worst_class"]
    assert (curves["class_std"] > 0).all()


@pytest.mark.parametrize("scoring", ["neg_log_loss", "f1_macro"])
def test_cv_curve_keeps_scores_that_are_no_fractions_on_their_own_axis(tmp_path, scoring):
    # A log loss was drawn times 100 on the axis of held-out percentages (-109 "%").
    from mr2_probe.plotting import cv_curves

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring=scoring, device="cpu").fit(X, y)
    fig = plot_cv_curve({"MR2": search}, tmp_path / "cv.png", scoring)
    _assert_png(tmp_path / "cv.png")
    curves = cv_curves(search, scoring)
    percent = fig.axes[0]
    shown = [line.get_label() for line in percent.get_legend().get_lines()]
    assert shown == [f"MR2 {name}" for name in curves]  # one legend for both axes
    if scoring == "f1_macro":  # a fraction: in % with the class accuracies, one axis
        assert len(fig.axes) == 1
        np.testing.assert_allclose(percent.lines[0].get_ydata(), 100 * curves[scoring])
        return
    own = fig.axes[1]
    assert len(fig.axes) == 2 and own.get_ylabel() == "held-out neg_log_loss (mean over folds)"
    np.testing.assert_allclose(own.lines[0].get_ydata(), curves["neg_log_loss"])
    assert (curves["neg_log_loss"] < 0).all()
    drawn = [line.get_ydata() for line in percent.lines[:2]]
    np.testing.assert_allclose(drawn, [100 * curves["balanced_accuracy"],
                                       100 * curves["worst_class"]])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("largest", [1.0, 100.0])
def test_cv_curve_draws_c_inf_beyond_the_finite_values(tmp_path, largest):
    # C = inf (no penalty) vanished from the log axis, with the chosen value's line: it is
    # drawn a decade beyond the largest finite C.
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 40)
    X = rng.normal(size=(120, 4)) + 0.5 * y[:, None]
    search = MR2LinearClassifierCV([0.01, largest, np.inf], cv=3, c_bar=None, device="cpu")
    search.fit(X, y)
    fig = plot_cv_curve({"ERM": search}, tmp_path / "cv.png")
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [0.01, largest, 10 * largest])
    assert f"C = inf (no penalty) drawn at {10 * largest:g}" in ax.get_xlabel()
    chosen = ax.lines[-1].get_xdata()[0]
    assert chosen == (10 * largest if search.C_ == np.inf else search.C_)


def _contrast_on_white(colour) -> float:
    """WCAG contrast ratio of a colour against white (3 is the floor for graphics)."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return 1.05 / (linear @ [0.2126, 0.7152, 0.0722] + 0.05)


def _iris_searches(erm_name: str) -> dict:
    """Searches of ERM (named ``erm_name``) and MR² over two Cs on iris."""
    X, y = load_iris(return_X_y=True)
    return {
        name: MR2LinearClassifierCV([0.01, 1.0], cv=3, c_bar=c_bar, device="cpu").fit(X, y)
        for name, c_bar in ((erm_name, None), ("MR2", 1.0))
    }


def test_cv_curves_of_erm_and_mr2_stand_out_from_white(tmp_path):
    # ERM's curves and chosen-value line were the reference's light grey (contrast 1.7).
    fig = plot_cv_curve(_iris_searches("ERM"), tmp_path / "cv.png")
    lines = fig.axes[0].lines
    assert len({line.get_color() for line in lines}) == 2
    assert min(_contrast_on_white(line.get_color()) for line in lines) >= 3


def test_models_whose_names_start_with_an_underscore_are_in_the_legends(tmp_path):
    # matplotlib leaves a label that starts with "_" out of a legend it gathers itself:
    # the model's bars and curves were drawn, unnamed.
    fig = plot_cv_curve(_iris_searches("_baseline"), tmp_path / "cv.png")
    shown = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sum(t.startswith("_baseline ") for t in shown) == 3 == len(shown) - 3
    y = load_iris(return_X_y=True)[1]
    report = classwise_report({"ERM": y, "_tuned": (y + 1) % 3, "MR2": y}, y)
    fig = plot_group_accuracy(report, tmp_path / "groups.png")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ERM", "_tuned", "MR2"]


def test_class_accuracy_plot_rejects_unknown_model(tmp_path, report):
    with pytest.raises(ValueError, match="model must be one of"):
        plot_class_accuracy(report, tmp_path / "x.png", model="LR")
    assert not (tmp_path / "x.png").exists()


def test_group_accuracy_plot(tmp_path, report):
    path = tmp_path / "groups.png"
    fig = plot_group_accuracy(report, path)
    _assert_png(path)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["easy", "medium", "hard", "worst"]
    assert len(ax.containers) == 2
    for container, name in zip(ax.containers, ["ERM", "MR2"], strict=True):
        row = report.rows[name]
        expected = [100 * row[c] for c in ("easy", "medium", "hard", "worst")]
        np.testing.assert_allclose([b.get_height() for b in container], expected)
    assert ax.get_ylabel() == "accuracy (%)"
    assert ax.get_xlabel() == "class group (terciles of ERM)"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ERM", "MR2"]
    # The palette of every figure: the reference grey, MR² in its lever colour.
    colours = [{to_hex(b.get_facecolor()) for b in c} for c in ax.containers]
    assert colours == [{REFERENCE}, {LEVER_COLOURS["MR2"]}]


@pytest.mark.parametrize(
    "names, reference, expected",
    [
        (["ERM", "MR2"], "ERM", [REFERENCE, LEVER_COLOURS["MR2"]]),
        (
            ["ERM grid", "MR2 grid", "chosen: tilt=5"],
            "ERM grid",
            [REFERENCE, LEVER_COLOURS["MR2"], LEVER_COLOURS["tilt"]],
        ),
        (["erm", "mr2", "chosen: offsets≤1pt"], "erm", [REFERENCE, LEVER_COLOURS["MR2"],
                                                         LEVER_COLOURS["offsets"]]),
        # No two models share a colour: a second ERM-like name takes the next spare one.
        (["ERM", "chosen: ERM", "LR"], "ERM", [REFERENCE, *OTHER_COLOURS[:2]]),
        (["MR2", "MR2 grid"], None, [LEVER_COLOURS["MR2"], OTHER_COLOURS[0]]),
        # Only the reference is grey, whatever its name.
        (["ERM grid", "MR2"], "MR2", [OTHER_COLOURS[0], REFERENCE]),
        # A lever is a whole word of the name.
        (["amr2", "tilted", "offsets2", "0tilt"], None, list(OTHER_COLOURS[:4])),
        # A tilt or offsets point of the MR² model takes its lever's colour, not MR²'s.
        (["ERM", "MR2", "MR2 tilt=2", "MR2 offsets≤1pt"], "ERM",
         [REFERENCE, LEVER_COLOURS["MR2"], LEVER_COLOURS["tilt"], LEVER_COLOURS["offsets"]]),
    ],
)  # fmt: skip
def test_model_colours(names, reference, expected):
    assert list(model_colours(names, reference).values()) == expected


@pytest.mark.parametrize("reference", ["ERM", None])
def test_model_colours_of_one_name_as_text_is_one_model(reference):
    # It was a model per character: {"E": ..., "R": ..., "M": ...}.
    assert model_colours("ERM", reference) == model_colours(["ERM"], reference)
    assert list(model_colours("MR2 grid")) == ["MR2 grid"]


def test_model_colours_stay_distinct_and_keep_grey_for_the_reference():
    names = ["ERM", "MR2", *"abcdefghijkl"]
    colours = model_colours(names, reference="ERM")
    assert len(set(colours.values())) == len(names)
    assert [n for n, c in colours.items() if c in (REFERENCE, SAME)] == ["ERM"]
    # A lever is a word of the name: "thermal" holds "erm" but is not the ERM probe.
    colours = model_colours(["thermal", "baseline"], reference="baseline")
    assert colours == {"thermal": OTHER_COLOURS[0], "baseline": REFERENCE}


def test_group_accuracy_plot_leaves_a_group_without_classes_unlabelled(tmp_path):
    # Two classes: easy and hard, no medium class.
    report = classwise_report({"ERM": [0, 0, 1, 0], "MR2": [0, 0, 1, 1]}, [0, 0, 1, 1])
    assert np.isnan(report.rows["MR2"]["medium"])
    fig = plot_group_accuracy(report, tmp_path / "groups.png")
    ax = fig.axes[0]
    labels = [[t.get_text() for t in ax.texts[4 * i : 4 * i + 4]] for i in range(2)]
    assert labels == [["100.0", "", "50.0", "50.0"], ["100.0", "", "100.0", "100.0"]]
    # Its bars are empty (of height 0), not NaN.
    heights = [[b.get_height() for b in container] for container in ax.containers]
    assert heights == [[100, 0, 50, 50], [100, 0, 100, 100]]


@pytest.mark.parametrize("c_bar", [None, 2.0])
def test_margin_plot(tmp_path, c_bar):
    rng = np.random.default_rng(0)
    spreads = np.array([0.5, 1.0, 2.0])
    y = np.repeat(np.array(["a", "b", "c"]), 60)
    X = rng.normal(size=(180, 4)) * np.repeat(spreads, 60)[:, None] + np.repeat(
        rng.normal(size=(3, 4)), 60, axis=0
    )
    clf = MR2LinearClassifier(c_bar=c_bar, max_iter=50, device="cpu").fit(X, y)
    path = tmp_path / "margins.svg" if c_bar is None else tmp_path / "margins.png"
    fig = plot_margins(clf, path)
    assert path.stat().st_size > 1000
    ax = fig.axes[0]
    np.testing.assert_allclose(
        ax.collections[0].get_offsets(), np.c_[clf.class_stats_["msd"], clf.margins_]
    )
    assert [t.get_text() for t in ax.texts] == ["a", "b", "c"]
    assert ax.get_ylabel() == "margin γ_k"
    assert ax.get_xlabel().startswith("class spread msd_k")
    assert to_hex(ax.collections[0].get_facecolor()[0]) == LEVER_COLOURS["MR2"]
    if c_bar is None:
        # No margins: the title says so, and there is no mean-margin line to draw.
        assert ax.get_title() == "no MR² margins: γ_k = 1 for every class (as c_bar=None)"
        assert len(ax.lines) == 0
    else:
        assert ax.get_title() == "MR² margin per class (dashed: mean margin c̄ = 2)"
        assert ax.lines[0].get_ydata()[0] == pytest.approx(c_bar)
    # The figure shows the fitted model: set_params changes nothing until the next fit.
    before = ax.get_title()
    clf.set_params(c_bar=3.0 if c_bar is None else None)
    assert plot_margins(clf, path).axes[0].get_title() == before


@pytest.mark.parametrize("dtype", [np.int64, np.uint8])  # (MNIST's labels are uint8)
def test_margin_plot_names_integer_classes(tmp_path, dtype):
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 3)) + 3 * y[:, None]
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y.astype(dtype))
    assert clf.classes_.dtype == dtype
    fig = plot_margins(clf, tmp_path / "margins.png", class_names=["Bag", "Coat", "Shirt"])
    assert [t.get_text() for t in fig.axes[0].texts] == ["Bag", "Coat", "Shirt"]


def test_margin_plot_beyond_many_classes_names_the_extreme_margins(tmp_path):
    # 1,000 names covered one another (and took seconds to lay out): only the classes of
    # the five largest and five smallest margins are named.
    from mr2_probe.plotting import MANY_CLASSES

    rng = np.random.default_rng(0)
    k = MANY_CLASSES + 1
    y = np.repeat(np.arange(k), 3)
    X = rng.normal(size=(len(y), 4)) * rng.uniform(0.1, 3, size=k).repeat(3)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(max_iter=1, device="cpu").fit(X, y)
    names = [f"c{i}" for i in range(k)]
    fig = plot_margins(clf, tmp_path / "margins.png", class_names=names)
    ranked = np.argsort(clf.margins_, kind="stable")
    expected = [names[i] for i in np.r_[ranked[:5], ranked[-5:]]]
    assert [t.get_text() for t in fig.axes[0].texts] == expected
    assert (
        fig.axes[0].get_xlabel().endswith(f"{k} classes; named: the 5 largest and smallest margins")
    )
    # At the limit every class is named.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MR2LinearClassifier(max_iter=1, device="cpu").fit(X[:-3], y[:-3])
    fig = plot_margins(clf, tmp_path / "margins.png", class_names=names)
    assert len(fig.axes[0].texts) == MANY_CLASSES


def test_margin_plot_names_float_codes_of_classes(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 3)) + 3 * y[:, None]
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y.astype(float))
    fig = plot_margins(clf, tmp_path / "margins.png", class_names=["Bag", "Coat", "Shirt"])
    assert [t.get_text() for t in fig.axes[0].texts] == ["Bag", "Coat", "Shirt"]


@pytest.mark.parametrize("offset, kind", [(1, int), (0, str)])
def test_margin_plot_refuses_names_for_classes_that_are_not_their_indices(tmp_path, offset, kind):
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 3)) + 3 * y[:, None]
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, (y + offset).astype(kind))
    first = repr(kind(0 + offset))
    with pytest.raises(ValueError, match=rf"integer classes 0..2; .* run from {first} to"):
        plot_margins(clf, tmp_path / "margins.png", class_names=["Bag", "Coat", "Shirt"])
    assert not (tmp_path / "margins.png").exists()


def test_margin_plot_takes_a_classifier_inside_a_pipeline(tmp_path):
    # A fitted pipeline ending in the classifier was refused as "Pipeline ... not fitted".
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_iris(return_X_y=True)
    pipeline = make_pipeline(StandardScaler(), MR2LinearClassifier(max_iter=30, device="cpu"))
    clf = pipeline.fit(X, y)[-1]
    fig = plot_margins(pipeline, tmp_path / "margins.png")
    _assert_png(tmp_path / "margins.png")
    np.testing.assert_allclose(
        fig.axes[0].collections[0].get_offsets(), np.c_[clf.class_stats_["msd"], clf.margins_]
    )
    assert [t.get_text() for t in fig.axes[0].texts] == ["0", "1", "2"]


@pytest.mark.parametrize("wrapper", ["offsets", "search"])
def test_figures_of_a_fitted_wrapper_name_the_estimator_to_pass(tmp_path, wrapper):
    # A fitted TunedOffsetsClassifierCV or GridSearchCV around the probe was refused as
    # "not fitted yet" by plot_margins and cv_curves, and failed plot_cv_curve on "Cs_".
    from sklearn.model_selection import GridSearchCV

    from mr2_probe import TunedOffsetsClassifierCV
    from mr2_probe.plotting import cv_curves

    def wrap(estimator):
        if wrapper == "offsets":
            return TunedOffsetsClassifierCV(estimator, cv=2)
        return GridSearchCV(estimator, {"c_bar": [1.0]}, cv=2)

    X, y = load_iris(return_X_y=True)
    probe = wrap(MR2LinearClassifier(max_iter=30, device="cpu"))
    search = wrap(MR2LinearClassifierCV([0.01, 1.0], cv=2, max_iter=30, device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(X, y), search.fit(X, y)
    name = type(probe).__name__
    attribute = "estimator_" if wrapper == "offsets" else "best_estimator_"
    with pytest.raises(
        ValueError,
        match=rf"^plot_margins reads margins_ and class_stats_ of a "
        rf"fitted MR2LinearClassifier .*; {name} has no margins_. Pass the "
        rf"MR2LinearClassifier itself \(its {attribute}, if that is one\)\.$",
    ):
        plot_margins(probe, tmp_path / "margins.png")
    # A fitted estimator of another kind is told to pass one, with no attribute to take.
    from sklearn.linear_model import LogisticRegression

    with pytest.raises(
        ValueError, match=r"LogisticRegression has no margins_\. Pass the \w+ itself\.$"
    ):
        plot_margins(LogisticRegression(max_iter=500).fit(X, y), tmp_path / "margins.png")
    kind = "of a fitted MR2LinearClassifierCV"
    with pytest.raises(ValueError, match=rf"^cv_curves reads .* {kind} .*; {name} has no "):
        cv_curves(search)
    with pytest.raises(ValueError, match=rf"^plot_cv_curve reads .* {kind} .*; {name} has no "):
        plot_cv_curve({"MR2": search}, tmp_path / "cv.png")
    assert not list(tmp_path.iterdir())
    # The estimator it holds is drawn.
    inner = probe.estimator_ if wrapper == "offsets" else probe.best_estimator_
    plot_margins(inner, tmp_path / "margins.png")


def test_margin_plot_needs_a_fitted_classifier(tmp_path):
    with pytest.raises(NotFittedError):
        plot_margins(MR2LinearClassifier(), tmp_path / "margins.png")


def test_class_accuracy_plot_places_its_bars_labels_and_axes(tmp_path, report):
    fig = plot_class_accuracy(report, tmp_path / "classes.png")
    ax = fig.axes[0]
    centres, widths, heights, _ = _bars(ax)
    # Side by side, 0.4 wide each: the reference left of each tick, the model right of it.
    np.testing.assert_allclose(centres, np.r_[np.arange(6) - 0.2, np.arange(6) + 0.2])
    np.testing.assert_allclose(widths, 0.4)
    # Each change is printed above the taller of the two bars, centred on the model's.
    tops = np.maximum(heights[:6], heights[6:])
    changed = [1, 2, 5]  # the classes 3, 1 and 4 in the sorted order
    assert [t.xy for t in ax.texts] == [pytest.approx((i + 0.2, tops[i])) for i in changed]
    assert {(t.get_horizontalalignment(), t.get_verticalalignment()) for t in ax.texts} == {
        ("center", "bottom")
    }
    # The lowest bar is 25 %: the axis starts at the decade below it, and ends above 100.
    assert ax.get_ylim() == pytest.approx((10, 104))
    assert ax.get_title() == "per-class accuracy: MR2 vs ERM"
    assert fig.get_figheight() == pytest.approx(4.5)  # short names take no extra height
    # With several models, the first that is not the reference is the default.
    three = classwise_report({"ERM": ERM, "MR2": MR2, "X": Y}, Y)
    fig = plot_class_accuracy(three, tmp_path / "three.png")
    assert [t.get_text() for t in fig.legends[0].get_texts()][1] == "MR2: gain"


@pytest.mark.slow
@pytest.mark.parametrize(
    "names, rotation",
    [
        ([f"class {k:02d}" for k in range(40)], 45),  # up to 40 classes turn 45°
        ([f"class {k:02d}" for k in range(41)], 90),
    ],
)
def test_class_names_turn_upright_beyond_40_classes(tmp_path, names, rotation):
    y = np.repeat(np.array(names), 2)
    report = classwise_report({"ERM": y, "MR2": np.roll(y, 1)}, y)
    fig = plot_class_accuracy(report, tmp_path / "c.png")
    labels = fig.axes[0].get_xticklabels()
    assert {t.get_rotation() for t in labels} == {rotation}
    assert {t.get_rotation_mode() for t in labels} == {"anchor"}
    # The figure widens with the classes: 0.35 inch each, beyond its 6-inch minimum.
    assert fig.get_figwidth() == pytest.approx(0.35 * len(names) + 2)


def test_class_names_are_cut_beyond_32_characters(tmp_path):
    names = ["x" * 32, "y" * 33]
    y = np.repeat(np.array(names), 2)
    report = classwise_report({"ERM": y, "MR2": y}, y)
    labels = plot_class_accuracy(report, tmp_path / "c.png").axes[0].get_xticklabels()
    assert sorted(t.get_text() for t in labels) == ["x" * 32, "y" * 31 + "…"]


def test_group_bars_centre_on_their_group_and_leave_room_for_labels(tmp_path, report):
    fig = plot_group_accuracy(report, tmp_path / "groups.png")
    ax = fig.axes[0]
    centres = [[b.get_x() + b.get_width() / 2 for b in c] for c in ax.containers]
    np.testing.assert_allclose(np.mean(centres, axis=0), np.arange(4))
    assert ax.get_ylim() == pytest.approx((0, 108))
    # Side by side in the order of the report's rows, each 0.8 / 2 wide.
    np.testing.assert_allclose(centres, [np.arange(4) - 0.2, np.arange(4) + 0.2])
    np.testing.assert_allclose([b.get_width() for c in ax.containers for b in c], 0.4)


def test_margin_plot_refuses_names_for_classes_off_the_codes(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 3)) + 3 * y[:, None]
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y - 1)  # within range but -1
    with pytest.raises(ValueError, match=r"classes_ run from -1 to 1: leave class_names out"):
        plot_margins(clf, tmp_path / "margins.png", class_names=["Bag", "Coat", "Shirt"])
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y + 1)
    with pytest.raises(ValueError, match=r"classes_ run from 1 to 3: leave class_names out"):
        plot_margins(clf, tmp_path / "margins.png", class_names=["Bag", "Coat", "Shirt"])


def test_margin_plot_dashes_the_mean_margin(tmp_path):
    X, y = load_iris(return_X_y=True)
    clf = MR2LinearClassifier(max_iter=30, device="cpu").fit(X, y)
    line = plot_margins(clf, tmp_path / "margins.png").axes[0].lines[0]
    assert line.get_linestyle() == "--"


def _searches(head="linear"):
    X, y = load_iris(return_X_y=True)
    Cs = [4.0, 16.0] if head == "cosine" else [0.01, 1.0]
    return (
        X,
        y,
        {
            name: MR2LinearClassifierCV(Cs, cv=3, c_bar=c_bar, head=head, device="cpu").fit(X, y)
            for name, c_bar in (("ERM", None), ("MR2", 1.0))
        },
    )


@pytest.mark.slow
def test_cv_curve_lines_axes_and_choices(tmp_path):
    from mr2_probe.plotting import cv_curves

    _, _, searches = _searches()
    fig = plot_cv_curve(searches, tmp_path / "cv.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "C (inverse L2 strength)"
    curves = [
        line for line in ax.lines if len(line.get_xdata()) == 2 and line.get_label()[0] != "_"
    ]
    for name, search in searches.items():
        mine = [line for line in curves if line.get_label().startswith(f"{name} ")]
        expected = cv_curves(search)
        assert list(expected) == ["accuracy", "balanced_accuracy", "worst_class"]
        assert [line.get_label() for line in mine] == [f"{name} {k}" for k in expected]
        for line, curve in zip(mine, expected.values(), strict=True):
            np.testing.assert_allclose(line.get_ydata(), 100 * curve)
        assert mine[0].get_linestyle() == "-"  # the search's own scorer solid
        colour = mine[0].get_color()
        assert colour == (SAME if name == "ERM" else LEVER_COLOURS["MR2"])
        chosen = [  # unnamed: the curves are named, the chosen value's line is not
            line
            for line in ax.lines
            if line.get_linestyle() == ":"
            and line.get_color() == colour
            and line.get_label().startswith("_")
        ]
        assert len(chosen) == 1 and chosen[0].get_xdata()[0] == search.C_
    # Every curve is named in the legend, on the axis of held-out scores.
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [c.get_label() for c in curves]
    assert ax.get_ylabel() == "held-out score (%, mean over folds)"
    _, _, cosine = _searches("cosine")
    fig = plot_cv_curve(cosine, tmp_path / "cosine.png")
    assert fig.axes[0].get_xlabel() == "logit scale"


def test_cv_curve_takes_searches_inside_pipelines(tmp_path):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_iris(return_X_y=True)
    search = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu")
    fig = plot_cv_curve(
        {"MR2": make_pipeline(StandardScaler(), search).fit(X, y)}, tmp_path / "p.png"
    )
    assert fig.axes[0].lines[0].get_xdata().tolist() == [0.01, 1.0]
    # cv_curves refused the pipeline as "Pipeline ... not fitted".
    from mr2_probe.plotting import cv_curves

    pipeline = make_pipeline(StandardScaler(), search).fit(X, y)
    curves, own = cv_curves(pipeline), cv_curves(pipeline[-1])
    assert list(curves) == ["accuracy", "balanced_accuracy", "worst_class"]
    for name, curve in own.items():
        np.testing.assert_array_equal(curves[name], curve)


def test_curves_of_a_value_that_failed_are_nan_without_numpy_s_warnings(tmp_path):
    # A value whose fit diverged (NaN for every class of every fold) warned "Mean of empty
    # slice" and "All-NaN slice encountered", from plotting.py, at each curve and figure.
    from sklearn.exceptions import FitFailedWarning

    from mr2_probe.plotting import cv_curves

    X = np.random.default_rng(0).normal(size=(60, 300)).astype(np.float32)
    y = np.repeat(np.arange(3), 20)
    search = MR2LinearClassifierCV(
        [1e-6, 1.0], cv=3, lam=0.5, max_iter=5, random_state=0, device="cpu"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", FitFailedWarning)
        search.fit(X, y)
    assert np.isnan(search.class_accuracy_path_[:, 0]).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # (matplotlib 3.7 beside a newer pyparsing warns of the names it calls: not ours)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r".*\bmatplotlib\b")
        curves = cv_curves(search)
        plot_cv_curve({"MR2": search}, tmp_path / "cv.png")
    assert list(curves) == ["accuracy", "balanced_accuracy", "worst_class"]
    for curve in curves.values():
        assert np.isnan(curve[0]) and np.isfinite(curve[1])


def test_cv_curves_leave_out_a_class_a_fold_holds_out_no_sample_of(tmp_path):
    # A class of two samples is held out by two of three folds: the third fold's balanced
    # and worst-class accuracies are over the classes it holds out, not NaN.
    from mr2_probe.plotting import cv_curves

    rng = np.random.default_rng(0)
    y = np.r_[np.repeat([0, 1], 30), 2, 2]
    X = rng.normal(size=(len(y), 4)) + 2 * y[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (scikit-learn's: a class of 2 < 3)
        search = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu").fit(X, y)
    path = search.class_accuracy_path_
    assert np.isnan(path[..., 2]).any()
    curves = cv_curves(search)
    np.testing.assert_allclose(curves["balanced_accuracy"], np.nanmean(path, axis=2).mean(0))
    np.testing.assert_allclose(curves["worst_class"], np.nanmin(path, axis=2).mean(0))
    assert all(np.isfinite(curve).all() for curve in curves.values())


def test_cv_curve_marks_a_choice_of_c_inf_where_its_curves_draw_it(tmp_path):
    # The chosen value's line of a search that chose C = inf was drawn at inf: nowhere.
    # Where only a later search tries C = inf, the axis says where it is drawn too.
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 20)
    X = rng.normal(size=(60, 2)) + 6 * y[:, None]
    finite = MR2LinearClassifierCV([1e-4, 1e-2], cv=3, device="cpu").fit(X, y)
    search = MR2LinearClassifierCV([1e-4, np.inf], cv=3, c_bar=None, device="cpu").fit(X, y)
    assert search.C_ == np.inf
    ax = plot_cv_curve({"MR2": finite, "ERM": search}, tmp_path / "cv.png").axes[0]
    assert ax.get_xlabel().endswith("; C = inf (no penalty) drawn at 0.1")
    erm = [line for line in ax.lines if line.get_label().startswith("ERM ")]
    np.testing.assert_array_equal(erm[0].get_xdata(), [1e-4, 0.1])
    chosen = [line for line in ax.lines if line.get_label().startswith("_")]  # (unnamed)
    assert [line.get_xdata()[0] for line in chosen] == [finite.C_, 0.1]


def test_cv_curve_needs_at_least_one_search(tmp_path):
    # No search raised a bare StopIteration.
    with pytest.raises(ValueError, match=r"^searches must name at least one search, got an "):
        plot_cv_curve({}, tmp_path / "cv.png")
    assert not (tmp_path / "cv.png").exists()


@pytest.mark.parametrize("plot", [plot_class_accuracy, plot_group_accuracy])
def test_a_report_s_dictionary_is_refused_naming_from_dict(tmp_path, plot):
    # "'dict' object has no attribute 'rows'" before (report.json read back, say).
    report = classwise_report({"erm": [0, 1, 0], "mr2": [0, 1, 1]}, [0, 1, 1])
    with pytest.raises(ValueError, match=r"got a dict; read .* with ClasswiseReport\.from_dict\."):
        plot(report.to_dict(), tmp_path / "figure.png")
    with pytest.raises(ValueError, match=r"draws a ClasswiseReport .*, got a list\.$"):
        plot([report], tmp_path / "figure.png")
    assert not (tmp_path / "figure.png").exists()


@pytest.mark.parametrize("how", ["one search", "a list"])
def test_cv_curve_refuses_searches_that_are_no_mapping(tmp_path, how):
    # One search failed with "'MR2LinearClassifierCV' object is not iterable", a list with
    # "'list' object has no attribute 'items'".
    search = MR2LinearClassifierCV(device="cpu")
    searches = search if how == "one search" else [search]
    kind = type(searches).__name__
    with pytest.raises(ValueError, match=rf"^searches must map each model's name .*; got a {kind}"):
        plot_cv_curve(searches, tmp_path / "cv.png")
    assert not (tmp_path / "cv.png").exists()


def test_cv_curves_need_a_fitted_search():
    # An unfitted search is refused as not fitted, as the figures' other inputs are.
    from sklearn.exceptions import NotFittedError

    from mr2_probe.plotting import cv_curves

    with pytest.raises(NotFittedError):
        cv_curves(MR2LinearClassifierCV(device="cpu"))


@pytest.mark.slow
def test_many_classes_keep_the_figure_s_width_and_name_none(tmp_path):
    # At 0.35 inch a class, 1,000 classes drew a PNG 42,240 pixels wide in 18 s, a label
    # above every changed bar and a name under each.
    from mr2_probe.plotting import MANY_CLASSES

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(200), 5)
    erm, mr2 = (np.where(rng.random(len(y)) < 0.7, y, (y + 1) % 200) for _ in range(2))
    fig = plot_class_accuracy(classwise_report({"ERM": erm, "MR2": mr2}, y), tmp_path / "c.png")
    ax = fig.axes[0]
    assert fig.get_size_inches()[0] == pytest.approx(0.35 * MANY_CLASSES + 2)
    assert len(_bars(ax)[0]) == 400 and not ax.texts and not ax.get_xticklabels()
    assert "200 classes, named in the report" in ax.get_xlabel()
    assert ax.get_xlim() == pytest.approx((-0.7, 199.7))  # the bars edge to edge
    few = classwise_report({"ERM": erm[:300], "MR2": mr2[:300]}, y[:300])  # 60 classes
    assert len(plot_class_accuracy(few, tmp_path / "few.png").axes[0].get_xticklabels()) == 60


def test_the_bars_of_imagenet_s_1000_classes_are_two_artists(tmp_path):
    # ax.bar made an artist per bar: ImageNet's 1,000 classes drew 2,000 Rectangles, and
    # the figure took 3 to 6 s to lay out and write. Each model's bars are one artist now,
    # however many classes, with the same bars in them.
    rng = np.random.default_rng(0)
    k = 1000
    y = np.repeat(np.arange(k), 4)
    erm, mr2 = (np.where(rng.random(len(y)) < 0.7, y, (y + 1) % k) for _ in range(2))
    report = classwise_report({"ERM": erm, "MR2": mr2}, y)
    ax = plot_class_accuracy(report, tmp_path / "c.png").axes[0]
    assert len(ax.patches) + len(ax.collections) == 2
    centres, widths, heights, colours = _bars(ax)
    order = report.class_order()
    ref, other = (100 * np.asarray(report.per_class[name])[order] for name in ("ERM", "MR2"))
    np.testing.assert_allclose(heights, np.r_[ref, other])
    np.testing.assert_allclose(centres, np.r_[np.arange(k) - 0.2, np.arange(k) + 0.2])
    np.testing.assert_allclose(widths, 0.4)
    assert set(colours[:k]) == {REFERENCE}
    expected = np.where(other > ref, GAIN, np.where(other < ref, LOSS, SAME))
    assert colours[k:] == expected.tolist() and len(set(colours[k:])) == 3


@pytest.mark.parametrize("k", [1, 2, 6])
def test_the_x_axis_holds_every_bar_as_ax_bar_s_before_matplotlib_3_11(tmp_path, monkeypatch, k):
    # Before matplotlib 3.11 (the project takes 3.7 on) add_collection updated the data
    # limits and left the view's: one or two classes drew on an x axis of (0, 1), their
    # outer bars cut in half. Here add_collection does as it did then.
    from matplotlib.axes import Axes

    add_collection = Axes.add_collection

    def as_before_3_11(self, collection, autolim=True):
        add_collection(self, collection, autolim=False)
        if autolim:
            self.update_datalim(collection.get_datalim(self.transData).get_points())
        return collection

    monkeypatch.setattr(Axes, "add_collection", as_before_3_11)
    y = np.repeat(np.arange(k), 2)
    report = classwise_report({"ERM": y, "MR2": np.where(y == 0, y, 0)}, y)
    ax = plot_class_accuracy(report, tmp_path / "c.png").axes[0]
    # ax.bar's: the bars from -0.4 to k - 0.6, and 5% of that span on each side
    margin = 0.05 * (k - 0.2)
    assert ax.get_xlim() == pytest.approx((-0.4 - margin, k - 0.6 + margin))


@pytest.mark.parametrize(
    "erm, mr2, bottom",
    [
        ([0, 0, 1, 0], [0, 0, 1, 1], 40),  # the lowest bar is 50 %: from 40 %, not from 0
        ([0, 0, 1, 1], [0, 0, 1, 0], 40),  # the model's bar, not only the reference's
        ([0, 0, 0, 0], [0, 0, 1, 1], 0),  # a class at 0 %: from 0, not below it
    ],
)
def test_class_accuracy_axis_starts_a_decade_below_the_lowest_bar(tmp_path, erm, mr2, bottom):
    report = classwise_report({"ERM": erm, "MR2": mr2}, [0, 0, 1, 1])
    fig = plot_class_accuracy(report, tmp_path / "c.png")
    assert fig.axes[0].get_ylim() == pytest.approx((bottom, 104))


def test_a_gain_under_a_twentieth_of_a_point_is_not_labelled_zero(tmp_path):
    # 1 more hit of 3,000 samples, +0.033 point: labelled "+0.0" over a green bar.
    y = np.repeat([0, 1], 3000)
    erm = y.copy()
    erm[:600], erm[3000:3300] = 1, 0
    mr2 = erm.copy()
    mr2[0] = 0
    fig = plot_class_accuracy(classwise_report({"ERM": erm, "MR2": mr2}, y), tmp_path / "c.png")
    assert [t.get_text() for t in fig.axes[0].texts] == ["+0.03"]


@pytest.mark.slow
def test_cv_curve_axes_name_every_search_drawn_on_them(tmp_path):
    # The x axis took the first search's head, the right-hand axis the last raw score's.
    # (Scores of three classes that scikit-learn 1.6 has: its neg_brier_score is binary.)
    X, y = load_iris(return_X_y=True)
    searches = {
        "ERM": MR2LinearClassifierCV([4.0, 16.0], cv=3, head="cosine", scoring="neg_log_loss",
                                     device="cpu").fit(X, y),
        "MR2": MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring="matthews_corrcoef",
                                     device="cpu").fit(X, y),
        "tilt": MR2LinearClassifierCV([0.01, 1.0], cv=3, scoring="neg_log_loss",
                                      class_tilt=1.0, device="cpu").fit(X, y),
    }  # fmt: skip
    fig = plot_cv_curve(searches, tmp_path / "cv.png")
    assert fig.axes[0].get_xlabel() == (
        "C (inverse L2 strength) of linear heads, logit scale of cosine heads"
    )
    # Each score once, however many searches chose by it.
    assert fig.axes[1].get_ylabel() == "held-out neg_log_loss, matthews_corrcoef (mean over folds)"
