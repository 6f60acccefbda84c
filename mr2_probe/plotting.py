"""Figures of class-wise results, written to files with matplotlib's Agg backend.

matplotlib is imported inside the functions, so ``import mr2_probe`` works without it
(``pip install "mr2-probe[plot]"`` adds it). Figures are built with
``matplotlib.figure.Figure`` rather than pyplot: they never touch the global backend or
pyplot's figure registry, so the returned figure is freed with its last reference.
"""

from __future__ import annotations

import collections
import colorsys
import contextlib
import itertools
import math
import os
import re
import warnings
from collections.abc import Mapping

import numpy as np
from sklearn.utils.validation import check_is_fitted

from .front import Front, _final, _names
from .metrics import GROUP_NAMES, classwise_scorers
from .report import ClasswiseReport

# One palette for every figure. The reference (the ERM probe) is light grey wherever it
# appears; MR² and the front's levers keep one colour each across the class-accuracy,
# margins, groups and front plots; a change against the reference is green (gain), red
# (loss) or dark grey (same), and dark grey also draws the reference lines.
GAIN, LOSS, SAME, REFERENCE = "#2a9d3f", "#d1392b", "#8c8c8c", "#c8c8c8"
#: Colour of each lever of the front; the models of a report take the colour of the lever
#: their name contains ("MR2 grid", "chosen: tilt=5").
LEVER_COLOURS = {"ERM": REFERENCE, "MR2": "#1f5fa8", "tilt": "#e08a1e", "offsets": "#7b3fa0"}
#: Colours of further models, in order.
OTHER_COLOURS = ("#17a2b8", "#b5487a", "#8a7a1e", "#3b3b8f", "#5c3a1e")
_LEVER_ORDER = ("tilt", "offsets", "MR2", "ERM")


def _literal(name) -> str:
    """A class or model name as matplotlib draws it literally: two $ signs in a name
    started mathtext, which failed on it ("$_$") or typeset it. A lone surrogate (a file
    name that was not UTF-8, as os.listdir decodes it) is drawn as its escape, \\udce9:
    matplotlib refused the text with a TypeError."""
    text = str(name).encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("$", r"\$")


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "mr2_probe.plotting needs matplotlib; install it with "
            "pip install 'mr2-probe[plot]' (or pip install matplotlib)."
        ) from error
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _rgba(colours) -> np.ndarray:
    from matplotlib.colors import to_rgba_array

    return to_rgba_array(colours)


def _bars(ax, centres, heights, width: float, colours):
    """Bars from 0 to ``heights`` (NaN: none), ``width`` wide around ``centres``, as one
    PolyCollection, drawn as ``ax.bar`` draws them, pixel for pixel. ``ax.bar`` makes an
    artist per bar, each laid out and drawn on its own: the figure of ImageNet's 1,000
    classes took about 3 s, nine tenths of it in the bars (benchmarks/bench_plots.py).
    ``colours``: one, or one per bar."""
    from matplotlib.collections import PolyCollection

    left, right = centres - width / 2, centres + width / 2
    top, bottom = np.nan_to_num(heights), np.zeros(len(heights))
    corners = np.stack([left, bottom, left, top, right, top, right, bottom], axis=1)  # (K, 8)
    bars = PolyCollection(
        corners.reshape(-1, 4, 2), facecolors=colours, edgecolors="none", linewidths=0
    )
    ax.add_collection(bars)
    # (as ax.bar's: before matplotlib 3.11 a collection updated the data limits only, and
    # the x axis of one or two classes stayed at (0, 1), their outer bars cut in half)
    ax.autoscale_view()
    return bars


def _patch(colour: str):
    from matplotlib.patches import Patch

    return Patch(color=colour)


class MissingGlyphWarning(UserWarning):
    """Some text of a figure (a class name, most often) has characters that the plot font
    lacks: they are drawn as boxes. ``characters``: those characters, in order of first
    appearance."""

    def __init__(self, message: str, characters=()):
        super().__init__(message)
        self.characters = tuple(characters)


# matplotlib's warning for each character its font lacks, at every text drawn ("missing
# from font(s) DejaVu Sans."; matplotlib 3.7's says "missing from current font.").
_GLYPH = re.compile(r"Glyph (\d+) .*missing from (current )?font")


@contextlib.contextmanager
def _caught(category=Warning, pattern: str = ""):
    """Yields a list that collects the warnings of ``category`` whose message matches
    ``pattern`` raised inside; the others are warned again as they came, through the
    filters outside."""
    matched, caught = [], []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield matched
    finally:  # (a failed figure's warnings too)
        for w in caught:
            if issubclass(w.category, category) and re.match(pattern, str(w.message)):
                matched.append(w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _save(fig, path) -> None:
    # One warning for the characters the font lacks, not matplotlib's one per character
    # and text drawn.
    with _caught(UserWarning, _GLYPH.pattern) as glyphs:
        fig.savefig(os.fspath(path), dpi=120)
    missing = list(dict.fromkeys(chr(int(_GLYPH.match(str(w)).group(1))) for w in glyphs))
    if missing:
        shown = ", ".join(repr(c) for c in missing)
        warnings.warn(
            MissingGlyphWarning(
                f"the plot font lacks the characters {shown}: they are drawn as boxes in "
                f"{os.fspath(path)}",
                missing,
            ),
            stacklevel=3,
        )


def _legend(owner, handles, labels, **kwargs):
    """``owner.legend(handles, labels, **kwargs)``, each label shown as given: matplotlib
    3.7 leaves out an entry whose label starts with "_" (a model named "_baseline"), even
    one given explicitly, so such a label is given with a leading space and then set."""
    legend = owner.legend(handles, [" " + t if t.startswith("_") else t for t in labels], **kwargs)
    for text, label in zip(legend.get_texts(), labels, strict=True):
        text.set_text(label)
    return legend


def model_colours(names, reference: str | None = None) -> dict:
    """The palette's colour of each model name: grey for ``reference``, a lever's colour for
    a name that contains the lever (case-insensitive: "MR2 grid", "chosen: tilt=5"), then
    :data:`OTHER_COLOURS` and further hues; no two models share a colour, and only
    ``reference`` is grey. ``names`` is an iterable of names (a report's ``rows`` too); a
    single name as text is one model, not one per character.

    Examples
    --------
    >>> from mr2_probe.plotting import LEVER_COLOURS, model_colours
    >>> colours = model_colours(["ERM", "MR2 grid", "chosen: tilt=2"], reference="ERM")
    >>> colours["chosen: tilt=2"] == LEVER_COLOURS["tilt"]
    True
    """
    colours, used = {}, set()
    spare = _spare_colours()
    if isinstance(names, str):  # ("ERM": the models "E", "R" and "M")
        names = [names]
    for name in names:
        # tilt and offsets first: "chosen: tilt=5" is a point of the MR² model's tilt. A
        # lever counts as a word of the name ("thermal" is not "ERM"), and the reference's
        # grey is the reference's alone.
        levers = [lever for lever in _LEVER_ORDER if _names_lever(str(name), lever)]
        colour = REFERENCE if name == reference else LEVER_COLOURS.get(next(iter(levers), ""))
        if colour is None or colour in used or (colour == REFERENCE and name != reference):
            colour = next(c for c in spare if c not in used)
        colours[name] = colour
        used.add(colour)
    return colours


def _names_lever(name: str, lever: str) -> bool:
    """Whether ``lever`` is a word of ``name`` (case-insensitive; "tilt=5" holds "tilt")."""
    word = rf"(?<![a-z0-9]){re.escape(lever.lower())}(?![a-z0-9])"
    return re.search(word, name.lower()) is not None


def _spare_colours():
    """:data:`OTHER_COLOURS`, then as many more as asked: hues a golden angle apart, none
    of them a colour the palette gives a meaning to."""
    reserved = {GAIN, LOSS, SAME, REFERENCE, *LEVER_COLOURS.values()}
    yield from (c for c in OTHER_COLOURS if c not in reserved)
    for i in itertools.count():
        red, green, blue = colorsys.hsv_to_rgb((0.13 + 0.618034 * i) % 1.0, 0.55, 0.75)
        colour = f"#{round(255 * red):02x}{round(255 * green):02x}{round(255 * blue):02x}"
        if colour not in reserved:
            yield colour


def _fitted(estimator, caller: str, kind: str, *attributes: str):
    """The estimator itself (a pipeline's last step), fitted and holding ``attributes``:
    a fitted estimator of another kind (a TunedOffsetsClassifierCV, a GridSearchCV) was
    refused as not fitted, or failed on an attribute it lacks."""
    estimator = _final(estimator)
    check_is_fitted(estimator)
    lacks = [name for name in attributes if not hasattr(estimator, name)]
    if lacks:
        inner = next((a for a in ("estimator_", "best_estimator_") if hasattr(estimator, a)), None)
        raise ValueError(
            f"{caller} reads {' and '.join(attributes)} of a fitted {kind} (or of a Pipeline "
            f"ending in one); {type(estimator).__name__} has no {lacks[0]}. Pass the {kind} "
            + (f"itself (its {inner}, if that is one)." if inner else "itself.")
        )
    return estimator


# Longer class names are cut to this many characters under the bars (the report keeps them).
_TICK_CHARACTERS = 32


def _check_report(report, caller: str) -> None:
    """Refuse anything but a ClasswiseReport, naming the way from what it most likely is:
    a report's dictionary (``to_dict``, or report.json read back) failed with "'dict'
    object has no attribute 'rows'"."""
    if not isinstance(report, ClasswiseReport):
        advice = (
            "; read a report's dictionary (to_dict, or report.json loaded) back with "
            "ClasswiseReport.from_dict"
            if isinstance(report, Mapping)
            else ""
        )
        raise ValueError(
            f"{caller} draws a ClasswiseReport (mr2_probe.report.classwise_report's), got a "
            f"{type(report).__name__}{advice}."
        )


def _class_ticks(names: list[str], slot: float) -> tuple[list[str], float, float]:
    """Class names to draw under the bars, their rotation, and the height they take
    (inches).

    ``slot`` is the width of one class on the axis in inches; at 10 pt a character takes
    about 0.09 inch. Names that fit stay horizontal; longer ones turn 45° (anchored at their
    end, under their bar), and more than 40 classes turn 90°. Names longer than
    ``_TICK_CHARACTERS`` are cut with "…" (ImageNet's run to 50 or more).
    """
    names = [n if len(n) <= _TICK_CHARACTERS else n[: _TICK_CHARACTERS - 1] + "…" for n in names]
    longest = max((len(n) for n in names), default=0) * 0.09
    angle = 0 if longest <= 0.9 * slot else 45 if len(names) <= 40 else 90
    return [_literal(n) for n in names], angle, 0.2 + longest * math.sin(math.radians(angle))


def _change_label(delta: float) -> str:
    """A change in points to one decimal, or to one significant digit below 0.05: a class
    of more than 2,000 samples can gain less than that, which "+0.0" would hide."""
    return f"{delta:+.1f}" if abs(delta) >= 0.05 else f"{delta:+.1g}"


#: Classes beyond which the per-class figure names none, nor labels their changes.
MANY_CLASSES = 60
# Beyond MANY_CLASSES, margins.png names this many classes at each end of the margins.
_EXTREMES = 5


def plot_class_accuracy(report: ClasswiseReport, path, model: str | None = None):
    """Per-class accuracy of a model beside the reference, classes sorted by the reference.

    Grey bars are the reference; the model's bar beside each is green where it gains,
    red where it loses and grey where it ties, with the signed change in points printed
    above it. Dotted lines separate the easy / medium / hard groups. Class names too long
    to sit side by side (Fashion-MNIST's "T-shirt/top", "Ankle boot") are rotated, and
    names longer than 32 characters cut with "…" (the report keeps them whole). Beyond
    :data:`MANY_CLASSES` classes (ImageNet's 1,000) the figure keeps the width of that
    many, and neither names the classes nor labels the changes: the report lists them.

    Parameters
    ----------
    report : ClasswiseReport
        From :func:`mr2_probe.report.classwise_report`.
    path : str or path-like
        Where to write the figure (the extension picks the format, e.g. ``.png``).
    model : str, default=None
        The model to compare; defaults to the first one that is not the reference.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Axis 0 holds two collections of bars, one rectangle per class in the sorted
        order: the reference's (``collections[0]``), then the model's.

    Examples
    --------
    >>> import tempfile, os
    >>> from mr2_probe.report import classwise_report
    >>> from mr2_probe.plotting import plot_class_accuracy
    >>> y = [0, 0, 1, 1, 2, 2]
    >>> report = classwise_report({"erm": [0, 0, 1, 0, 2, 0], "mr2": [0, 0, 1, 1, 2, 0]}, y)
    >>> path = os.path.join(tempfile.mkdtemp(), "classes.png")
    >>> fig = plot_class_accuracy(report, path)
    >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
    ['0', '1', '2']
    """
    _check_report(report, "plot_class_accuracy")
    names = [name for name in report.rows if name != report.reference]
    model = (names[0] if names else report.reference) if model is None else str(model)
    if model not in report.rows:
        raise ValueError(f"model must be one of {list(report.rows)}, got {model!r}.")
    order = report.class_order()
    ref = 100 * np.asarray(report.per_class[report.reference], dtype=float)[order]
    other = 100 * np.asarray(report.per_class[model], dtype=float)[order]
    change = other - ref
    # 0 gain, 1 loss, 2 same (a class without a score, NaN, too)
    kind = np.where(change > 1e-9, 0, np.where(change < -1e-9, 1, 2))

    x = np.arange(len(order))
    # Beyond MANY_CLASSES the figure keeps its width and drops the names and the changes'
    # labels: at 0.35 inch a class, 1,000 classes drew a PNG 42,240 pixels wide in 18 s.
    many = len(order) > MANY_CLASSES
    width = 0.35 * MANY_CLASSES + 2 if many else max(6.0, 0.35 * len(order) + 2)
    # About 1.5 inch of the figure goes to the y axis and the margins; the height grows
    # with names that turn, so that the bars keep their room.
    ticks, angle, depth = _class_ticks(
        [str(report.labels[i]) for i in order[: 0 if many else None]],
        (width - 1.5) / max(1, len(x)),
    )
    fig = _figure(width, 4.3 + depth)
    ax = fig.add_subplot()
    _bars(ax, x - 0.2, ref, 0.4, REFERENCE)
    _bars(ax, x + 0.2, other, 0.4, _rgba([GAIN, LOSS, SAME])[kind])
    if not many:
        tops = np.fmax(ref, other)
        for i in np.flatnonzero(kind != 2):
            ax.annotate(_change_label(change[i]), (x[i] + 0.2, tops[i]), ha="center",
                        va="bottom", fontsize=7)  # fmt: skip
    groups = np.asarray(report.groups)[order]
    for boundary in np.flatnonzero(groups[1:] != groups[:-1]):
        ax.axvline(boundary + 0.5, color="black", linestyle=":", linewidth=0.8)
    if many:
        ax.set_xticks([])
        ax.set_xlim(-0.7, len(x) - 0.3)
    elif angle:
        ax.set_xticks(x, ticks, rotation=angle, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(x, ticks)
    reference, shown = _literal(report.reference), _literal(model)
    named = f"{len(x)} classes, named in the report" if many else "easy | medium | hard"
    ax.set_xlabel(f"class (sorted by {reference} accuracy; {named})")
    ax.set_ylabel("per-class accuracy (%)")
    # Differences of a few points vanish on a 0-100 axis: start just below the lowest bar.
    low = np.nanmin(np.concatenate([ref, other, [100.0]]))
    ax.set_ylim(max(0.0, 10 * np.floor(low / 10) - 10), 104)
    ax.set_title(f"per-class accuracy: {shown} vs {reference}")
    handles = [_patch(c) for c in (REFERENCE, GAIN, LOSS, SAME)]
    labels = [reference, f"{shown}: gain", f"{shown}: loss", f"{shown}: same"]
    _legend(fig, handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    _save(fig, path)
    return fig


def plot_margins(classifier, path, class_names=None):
    """Margin γ_k of each class against its spread msd_k, for a fitted MR² classifier.

    A classifier fitted with ``c_bar=None`` has no margins (γ_k = 1 for every class): the
    figure says so in its title and draws no mean-margin line (as for any fit whose
    margins are all 1).

    Parameters
    ----------
    classifier : MR2LinearClassifier
        Fitted (or a fitted pipeline ending in one); reads ``margins_``,
        ``class_stats_["msd"]``, ``classes_`` and ``c_bar``. The title's c̄ is the
        fitted margins' mean (a ``set_params`` after the fit changes nothing here).
    path : str or path-like
    class_names : sequence of str, default=None
        Names printed beside the points when ``classes_`` are integer codes 0..K-1 (a
        feature store's labels): class k is ``class_names[k]``. Beyond
        :data:`MANY_CLASSES` classes only the five of the largest and the five of the
        smallest margins are named.

    Returns
    -------
    fig : matplotlib.figure.Figure
        One scatter (axis 0, collection 0) with x = msd_k, y = γ_k.

    Examples
    --------
    >>> import tempfile, os
    >>> from sklearn.datasets import load_iris
    >>> from mr2_probe import MR2LinearClassifier
    >>> from mr2_probe.plotting import plot_margins
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = MR2LinearClassifier(c_bar=1.0, max_iter=300, device="cpu").fit(X, y)
    >>> fig = plot_margins(clf, os.path.join(tempfile.mkdtemp(), "margins.png"))
    >>> fig.axes[0].get_ylabel()
    'margin γ_k'
    """
    classifier = _fitted(
        classifier, "plot_margins", "MR2LinearClassifier", "margins_", "class_stats_"
    )
    msd = np.asarray(classifier.class_stats_["msd"], dtype=float)
    gamma = np.asarray(classifier.margins_, dtype=float)
    labels = [str(label) for label in classifier.classes_]
    if class_names is not None:
        classes = np.asarray(classifier.classes_)
        codes = classes.dtype.kind in "iu" or (
            classes.dtype.kind == "f" and bool(np.all(classes == np.round(classes)))
        )
        if not codes or classes.min() < 0 or classes.max() >= len(class_names):
            first, last = classes[[0, -1]].tolist()
            raise ValueError(
                f"class_names names the integer classes 0..{len(class_names) - 1}; the "
                f"classifier's classes_ run from {first!r} to {last!r}: leave class_names "
                "out to label the classes by classes_."
            )
        labels = [str(class_names[int(label)]) for label in classes.tolist()]
    fig = _figure(6.0, 4.5)
    ax = fig.add_subplot()
    ax.scatter(msd, gamma, color=LEVER_COLOURS["MR2"])
    # Beyond MANY_CLASSES the names would cover one another: only the classes of the
    # largest and the smallest margins are named.
    named = np.arange(len(labels))
    if len(labels) > MANY_CLASSES:
        ranked = np.argsort(gamma, kind="stable")
        named = np.r_[ranked[:_EXTREMES], ranked[-_EXTREMES:]]
    for k in named:
        ax.annotate(
            _literal(labels[k]), (msd[k], gamma[k]), textcoords="offset points", xytext=(4, 3),
            fontsize=8,
        )  # fmt: skip
    xlabel = "class spread msd_k (mean squared L_p distance to the class mean)"
    if len(named) < len(labels):
        xlabel += f"\n{len(labels)} classes; named: the {_EXTREMES} largest and smallest margins"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("margin γ_k")
    # The fitted margins, not the c_bar parameter, which set_params may have changed since
    # the fit: their mean is the fit's c̄, and a fit with c_bar=None left them all at 1.
    if np.all(gamma == 1):
        ax.set_title("no MR² margins: γ_k = 1 for every class (as c_bar=None)")
    else:
        ax.axhline(float(gamma.mean()), color=SAME, linestyle="--", linewidth=0.8)
        ax.set_title(f"MR² margin per class (dashed: mean margin c̄ = {gamma.mean():g})")
    _save(fig, path)
    return fig


def plot_group_accuracy(report: ClasswiseReport, path):
    """Bars of easy / medium / hard / worst-class accuracy, one colour per model.

    Colours come from :func:`model_colours`: the reference grey, MR² blue, as in the other
    figures.

    Parameters
    ----------
    report : ClasswiseReport
    path : str or path-like

    Returns
    -------
    fig : matplotlib.figure.Figure
        Axis 0 holds one bar container per model, in the order of ``report.rows``.

    Examples
    --------
    >>> from pathlib import Path
    >>> from tempfile import mkdtemp
    >>> from mr2_probe.report import classwise_report
    >>> from mr2_probe.plotting import plot_group_accuracy
    >>> models = {"a": list("xxyz"), "b": list("xyyz"), "c": list("xxyy")}
    >>> report = classwise_report(models, y=list("xxyz"))
    >>> fig = plot_group_accuracy(report, Path(mkdtemp()) / "groups.png")
    >>> len(fig.axes[0].containers)
    3
    """
    _check_report(report, "plot_group_accuracy")
    columns = (*GROUP_NAMES, "worst")
    x = np.arange(len(columns))
    width = 0.8 / len(report.rows)
    colours = model_colours(report.rows, report.reference)
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    # The legend is given its entries: matplotlib leaves out a label that starts with "_".
    handles, names = [], []
    for i, (name, row) in enumerate(report.rows.items()):
        # A group with no test sample (None after JSON, or NaN) is drawn as an empty bar,
        # without a label: no bar of 0 %.
        values = 100 * np.array([row[c] for c in columns], dtype=float)
        offset = (i - (len(report.rows) - 1) / 2) * width
        shown = _literal(name)
        bars = ax.bar(x + offset, np.nan_to_num(values), width, label=shown, color=colours[name])
        handles.append(bars)
        names.append(shown)
        labels = [f"{v:.1f}" if np.isfinite(v) else "" for v in values]
        ax.bar_label(bars, labels=labels, fontsize=7)
    ax.set_xticks(x, list(columns))
    ax.set_xlabel(f"class group (terciles of {_literal(report.reference)})")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 108)
    _legend(fig, handles, names, loc="outside lower center", ncols=min(4, len(names)), fontsize=8)
    _save(fig, path)
    return fig


def plot_front(front, path, split: str = "test"):
    """Overall accuracy against worst-class accuracy (left) and the hard tercile (right).

    Each lever is a point (ERM, MR²) or a curve (the ``class_tilt`` sweep, the sweep of
    the offsets' bound), labelled with its value (``t=5``, ``≤1pt``), a label that would
    touch another's, cover a marker or cross the ring a line above it; the rule's choice
    is ringed, and a dashed line marks ERM's overall accuracy minus the rule's bound, on
    the split drawn (the rule reads the validation split: on the test split its choice can
    fall left of it).

    Parameters
    ----------
    front : mr2_probe.front.Front
        From :func:`mr2_probe.front.accuracy_front`.
    path : str or path-like
    split : {"test", "validation"}, default="test"
        Which scores to draw; ``"test"`` falls back to validation when the front has none.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Two axes; in each, one labelled line per lever in the order ERM, MR², tilt,
        offsets (the legend's), among unlabelled ones: the tilt curve's segment from the
        untilted point, the ring on the chosen point and the dashed bound.

    Examples
    --------
    >>> import tempfile, os
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.model_selection import train_test_split
    >>> from mr2_probe import MR2LinearClassifier
    >>> from mr2_probe.front import accuracy_front
    >>> from mr2_probe.plotting import plot_front
    >>> X, y = load_iris(return_X_y=True)
    >>> X, X_val, y, y_val = train_test_split(X, y, test_size=0.3, random_state=0)
    >>> probe = MR2LinearClassifier(max_iter=200, device="cpu")
    >>> front = accuracy_front(probe, X, y, X_val, y_val, tilts=(1, 4))
    >>> fig = plot_front(front, os.path.join(tempfile.mkdtemp(), "front.png"))
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['worst-class accuracy (%)', 'hard-tercile accuracy (%)']
    """
    if not isinstance(front, Front):  # ("'ClasswiseReport' object has no attribute 'points'")
        raise ValueError(
            f"plot_front draws a Front (mr2_probe.front.accuracy_front's), got a "
            f"{type(front).__name__}."
        )
    if split not in ("test", "validation"):
        raise ValueError(f"split must be 'test' or 'validation', got {split!r}.")
    if split == "test" and any(p.test is None for p in front.points):
        split = "validation"
    fig = _figure(10.0, 4.5)
    chosen = front.chosen
    names = []  # (axes, name, x, y) of each point, written once the axes have their place
    for ax, column, label in zip(
        fig.subplots(1, 2),
        ("worst", "hard"),
        ("worst-class accuracy (%)", "hard-tercile accuracy (%)"),
        strict=True,
    ):
        for lever, colour in LEVER_COLOURS.items():
            points = [p for p in front.points if p.lever == lever]
            if not points:
                continue
            x = [100 * getattr(p, split)["overall"] for p in points]
            y = [100 * getattr(p, split)[column] for p in points]
            if lever == "tilt":  # the curve starts at t = 0, the untilted model's own point
                base = [p for p in front.points if p.lever in ("ERM", "MR2")][-1]
                start = getattr(base, split)
                ax.plot([100 * start["overall"], *x], [100 * start[column], *y], "-", color=colour)
            style = "o-" if len(points) > 1 or lever == "tilt" else "s"
            ax.plot(x, y, style, color=colour, label=lever, markersize=6)
            # In as many digits as tell the values apart, as the points' names are (tilts of
            # 1 and 1.0000001 were both labelled "1").
            values = [
                p.value * (1 if lever == "tilt" else 100) for p in points if p.value is not None
            ]
            # "t=5" and "≤5pt": a tilt and an offsets bound of one value were both "5".
            template, given = ("t={}", True) if lever == "tilt" else ("≤{}pt", False)
            shown = iter(_names(template, values, given=given))
            for p, xi, yi in zip(points, x, y, strict=True):
                names.append((ax, p.name if p.value is None else next(shown), xi, yi))
            for p, xi, yi in zip(points, x, y, strict=True):
                if p.name == chosen:
                    ax.plot(xi, yi, "o", markersize=14, markerfacecolor="none", color="black")
        erm = 100 * getattr(front.point("ERM"), split)["overall"]
        ax.axvline(erm - 100 * front.bound, color=SAME, linestyle="--", linewidth=0.8)
        ax.set_xlabel(f"overall accuracy (%), {split}")
        ax.set_ylabel(label)
    # The rule reads the validation split: on the test split a choice can fall left of
    # the line without breaking its bound.
    rule = (
        f"ringed: the rule's choice; dashed: ERM − {100 * front.bound:g} pt, its bound"
        if split == "validation"
        else f"ringed: the rule's choice on the validation split; dashed: ERM − "
        f"{100 * front.bound:g} pt here"
    )
    fig.suptitle(
        f"accuracy front on the {split} split ({rule}; tilt labelled by t, offsets by their "
        "bound in pt)",
        fontsize=9,
    )
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4)
    _name_points_apart(fig, names)
    _save(fig, path)
    return fig


#: A front point's name: its font size, and its place beside the point (in points).
_NAME_SIZE, _NAME_OFFSET = 7, (4, 3)


def _name_points_apart(fig, names) -> None:
    """Write each point's name up and to the right of it; a name that would touch one
    already written, or cover a marker of its axes or the ring on the rule's choice, goes
    up a line. Points at one spot, or closer than a name's width (ERM and MR² 0.1 point
    apart on an axis of 2.5 points), wrote "ERMMR2"; a point up and to the right of
    another had that one's name over its marker, and the ring crossed its choice's name."""
    texts = [
        ax.annotate(
            text, (x, y), textcoords="offset points", xytext=_NAME_OFFSET, fontsize=_NAME_SIZE
        )
        for ax, text, x, y in names
    ]
    with warnings.catch_warnings():
        # (a glyph the font lacks is warned of once, by _save's drawing)
        warnings.filterwarnings("ignore", _GLYPH.pattern, UserWarning)
        fig.draw_without_rendering()  # (the axes' final size, which a name's room depends on)
        renderer = fig.canvas.get_renderer()
        boxes = [text.get_window_extent(renderer).extents * 72 / fig.dpi for text in texts]
    marks = {ax: _marks(ax) for ax in dict.fromkeys(text.axes for text in texts)}
    line = _NAME_SIZE + 1
    written = collections.defaultdict(list)  # (left, baseline, right) of each name, in points
    for text, (left, bottom, right, top) in zip(texts, boxes, strict=True):
        ax = text.axes
        baseline = (ax.transData.transform(text.xy) * 72 / fig.dpi)[1] + _NAME_OFFSET[1]
        above = 0
        while _covers((left, bottom + above, right, top + above), *marks[ax]) or any(
            left < other_right + 2 and other_left < right + 2 and abs(baseline + above - b) < line
            for other_left, b, other_right in written[ax]
        ):
            above += line
        written[ax].append((left, baseline + above, right))
        text.xyann = (_NAME_OFFSET[0], _NAME_OFFSET[1] + above)


def _marks(ax) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres (M, 2) and radii (M,), in points, of the markers drawn in ``ax`` (the ring
    on the rule's choice one of them), and whether each is a square, whose radius is half
    its side."""
    lines = [line for line in ax.lines if line.get_marker() not in ("None", "", None)]
    points = [line.get_xydata() for line in lines]
    centres = ax.transData.transform(np.concatenate(points)) * 72 / ax.figure.dpi  # (M, 2)
    count = [len(xy) for xy in points]
    radii = np.repeat([(ln.get_markersize() + ln.get_markeredgewidth()) / 2 for ln in lines], count)
    square = np.repeat([line.get_marker() == "s" for line in lines], count)
    return centres, radii, square


def _covers(box, centres, radii, square) -> bool:
    """Whether the box (left, bottom, right, top) overlaps any of the markers."""
    left, bottom, right, top = box
    gap = centres - np.clip(centres, (left, bottom), (right, top))  # (M, 2)
    apart = np.where(square, np.abs(gap).max(axis=1), np.hypot(gap[:, 0], gap[:, 1]))
    return bool((apart < radii).any())


#: Line style of each validation curve: the search's own scorer solid.
_CURVE_STYLES = ("-", "--", ":", "-.")

#: Scorers whose values are fractions, drawn in % beside the class accuracies (the
#: class-wise ones of :func:`classwise_scorers` and scikit-learn's of that kind); any other
#: (``neg_log_loss``, a callable) keeps its own values, on an axis of its own.
_FRACTION_SCORERS = {*classwise_scorers(), "top_k_accuracy", "average_precision"}
_FRACTION_PREFIXES = ("f1", "precision", "recall", "jaccard", "roc_auc")


def _in_percent(scoring: str) -> bool:
    """Whether the scorer of that name gives fractions."""
    return scoring in _FRACTION_SCORERS or scoring.startswith(_FRACTION_PREFIXES)


#: The class-wise curves that :func:`cv_curves` draws beside a search's own score.
_CLASSWISE_CURVES = ("balanced_accuracy", "worst_class")


def _own_scorer_name(search) -> str | None:
    """The name of a search's ``scoring``: accuracy for None, a class-wise scorer's own
    name (itself, or a copy: ``clone`` copies a search's scorer, as GridSearchCV's
    best_estimator_ holds it), None for any other callable."""
    scoring = search.scoring
    if scoring is None or isinstance(scoring, str):
        return scoring or "accuracy"
    return next(
        (
            name
            for name, scorer in classwise_scorers().items()
            if scorer is scoring or repr(scorer) == repr(scoring)
        ),
        None,
    )


def cv_curves(search, scoring: str | None = None) -> dict:
    """Validation curves of a fitted :class:`~mr2_probe.MR2LinearClassifierCV` (or of a
    pipeline ending in one).

    Returns ``{name: (n_Cs,) array}``, each the mean over folds: first the search's own
    held-out score (``scores_``), named ``scoring`` or, by default, after the search's
    ``scoring`` ("accuracy" for None, "score" for a callable of its own); then
    ``balanced_accuracy`` and ``worst_class`` from ``class_accuracy_path_`` (classes absent
    from a fold's held-out rows left out), whatever the search chose by. A search that chose
    by ``class_std`` gives the spread itself (lower is better), not its scorer's negation.
    A ``scoring`` that names a class-wise curve other than the search's own (or any, for a
    callable of the user's) is refused.
    """
    search = _fitted(
        search, "cv_curves", "MR2LinearClassifierCV", "class_accuracy_path_", "scores_"
    )
    own_name = _own_scorer_name(search)
    name = scoring if scoring is not None else own_name or "score"
    if name != own_name and name in (*_CLASSWISE_CURVES, "class_std"):
        chose = repr(own_name) if own_name else "a callable of its own"
        raise ValueError(
            f"scoring={name!r} would name the search's own scores, but it chose by {chose}; "
            "leave scoring out to name them after the search's scoring, or name them otherwise."
        )
    per_class = search.class_accuracy_path_  # (folds, Cs, K)
    own = next(iter(search.scores_.values())).mean(0)
    curves = {name: 0.0 - own if own_name == "class_std" else own}  # (a spread of 0 is 0, not -0)
    with warnings.catch_warnings():
        # A value whose fit failed on a fold is NaN for every class there: NaN on its
        # curves, without NumPy's warnings of an empty slice.
        warnings.filterwarnings(
            "ignore", "Mean of empty slice|All-NaN slice encountered", RuntimeWarning
        )
        curves.setdefault("balanced_accuracy", np.nanmean(per_class, axis=2).mean(0))
        curves.setdefault("worst_class", np.nanmin(per_class, axis=2).mean(0))
    return curves


def plot_cv_curve(searches, path, scoring: str | None = None):
    """Held-out score against C (log axis) of each search, one line per scorer.

    Parameters
    ----------
    searches : dict
        Model name → fitted :class:`~mr2_probe.MR2LinearClassifierCV` (or a pipeline
        ending in one), coloured as in the other figures ("MR2" blue), the reference
        ("ERM") in the dark grey of the reference lines.
    path : str or path-like
    scoring : str, default=None
        Name of the scorer the searches chose by, for the legend (None: each search's
        ``scoring``, as :func:`cv_curves` names it).

    Returns
    -------
    fig : matplotlib.figure.Figure
        One axes in %; the curves of :func:`cv_curves`, the chosen value of each search
        marked. A search's own scorer that gives no fractions (``neg_log_loss``, a
        callable) is drawn in its own values on a second, right-hand axis.

    Examples
    --------
    >>> import tempfile, os
    >>> from sklearn.datasets import load_iris
    >>> from mr2_probe import MR2LinearClassifierCV
    >>> from mr2_probe.plotting import plot_cv_curve
    >>> X, y = load_iris(return_X_y=True)
    >>> search = MR2LinearClassifierCV([0.01, 1.0], cv=3, device="cpu").fit(X, y)
    >>> fig = plot_cv_curve({"MR2": search}, os.path.join(tempfile.mkdtemp(), "cv.png"))
    >>> fig.axes[0].get_xscale()
    'log'
    """
    if not isinstance(searches, Mapping):  # (one search: "object is not iterable")
        raise ValueError(
            "searches must map each model's name to a fitted MR2LinearClassifierCV, e.g. "
            f"{{'MR2': search}}; got a {type(searches).__name__}."
        )
    if not searches:
        raise ValueError("searches must name at least one search, got an empty mapping.")
    fig = _figure(7.0, 4.5)
    ax = fig.subplots()
    colours = model_colours(list(searches), reference="ERM" if "ERM" in searches else None)
    # The reference's light grey is for filled marks: a thin curve or dotted line of it is
    # barely seen on white, so its curves take the dark grey of the reference lines.
    colours = {name: SAME if c == REFERENCE else c for name, c in colours.items()}
    searches = {
        name: _fitted(s, "plot_cv_curve", "MR2LinearClassifierCV", "class_accuracy_path_", "Cs_")
        for name, s in searches.items()
    }
    # C = inf (no penalty) has no place on a log axis: it is drawn a decade beyond the
    # largest finite value, and the axis says so.
    finite = [c for s in searches.values() for c in s.Cs_ if np.isfinite(c)]
    no_penalty = 10 * max(finite, default=1.0)
    own_axis = None  # the right-hand axis of scores that are no fractions, made once
    # The legend's entries, the raw scores' first (matplotlib's own would leave out a
    # label that starts with "_").
    raw_entries, entries, raw_labels = [], [], []
    for name, search in searches.items():
        where = np.where(np.isfinite(search.Cs_), search.Cs_, no_penalty)
        curves = cv_curves(search, scoring)
        own_name = _own_scorer_name(search)  # None: a callable of the user's own
        raw = own_name is None or not _in_percent(own_name)
        for i, (style, (label, curve)) in enumerate(
            zip(_CURVE_STYLES, curves.items(), strict=False)
        ):
            lower = " (lower is better)" if label == "class_std" else ""
            shown = f"{_literal(name)} {label}{lower}"
            if i == 0 and raw:
                own_axis = own_axis or ax.twinx()
                (line,) = own_axis.plot(where, curve, style, color=colours[name], label=shown)
                raw_labels += [_literal(label)] if _literal(label) not in raw_labels else []
                # every score drawn on it, not only the last search's
                own_axis.set_ylabel(f"held-out {', '.join(raw_labels)} (mean over folds)")
                raw_entries.append((line, shown))
            else:
                (line,) = ax.plot(where, 100 * curve, style, color=colours[name], label=shown)
                entries.append((line, shown))
        chosen = search.C_ if np.isfinite(search.C_) else no_penalty
        ax.axvline(chosen, color=colours[name], linestyle=":", linewidth=0.8)
    heads = {s.head_ for s in searches.values()}
    ax.set_xscale("log")
    xlabel = {
        frozenset({"cosine"}): "logit scale",
        frozenset({"linear"}): "C (inverse L2 strength)",
    }.get(frozenset(heads), "C (inverse L2 strength) of linear heads, logit scale of cosine heads")
    if any(np.isinf(s.Cs_).any() for s in searches.values()):
        xlabel += f"; C = inf (no penalty) drawn at {no_penalty:g}"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out score (%, mean over folds)")
    ax.set_title("validation curves (dotted vertical: the chosen value)", fontsize=9)
    handles, labels = zip(*raw_entries, *entries, strict=True)
    _legend(ax, handles, labels, fontsize=7)  # one legend for the curves of both axes
    _save(fig, path)
    return fig
