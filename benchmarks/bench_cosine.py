"""Fit time of the cosine head against the linear head and scikit-learn, same features.

L2-normalised features (synthetic by default, or the ``features`` of a feature store with
``--store``), one run: scikit-learn's LogisticRegression and the linear head at ``--C``,
then the cosine head at each ``--scales`` value, solved as the estimator does (L-BFGS on
the unit spheres where ``runs_on_spheres`` takes it, as on a store's 20,000 × 1,280
features; the default synthetic 20,000 × 512 is below its ``MIN_ENTRIES``, so both rows
run the rounds there), by its
previous solver (rounds of torch's L-BFGS, which the estimator keeps elsewhere;
``--no-rounds`` skips it) and as
it was solved before that (autograd gradients, 10 L-BFGS pairs, the test on tol in W;
``--no-before`` skips it), with the same tol. Each cosine row prints its time relative to
the linear head, its iterations, its training objective and its test accuracy.

Each scale also gets a linear problem of comparable penalty ("linear at mean μ"). At its
solution the cosine head meets ∇_k L + μ_k·v_k = 0 (v_k the k-th row of coef_, L the mean
margin cross-entropy; μ_k > 0 where the loss pulls the rows outward): the stationarity of the
linear head without intercept, same margins, penalised class by class by ½ Σ_k μ_k ‖v_k‖².
The per-class C_k = 1 / (S·μ_k) are printed, and the linear head, which has one C, is fitted
at C = 1 / (S·mean μ) with tol / scale, the cosine head's own test on tol in its unit
directions re-expressed in the logit weights. With ``--c-bar none`` (no margins) that linear
problem is scikit-learn's, which then solves it too, in the same run. ``--linear-history N``
also fits it with N L-BFGS pairs instead of the linear head's 10 (the cosine head keeps up
to 200). An asterisk after the iterations marks a fit that stopped short of tol.

``--sweep`` adds a search of the scale over ``--sweep-scales`` by ``--sweep-folds``-fold
cross-validation: MR2LinearClassifierCV, whose folds each solve the scales in increasing
order from the previous solution, against GridSearchCV over MR2LinearClassifier, which
fits every scale of every fold cold, and one cold fit at the largest scale on a fold's
training rows (what the sweep costs per fold, in fits).

``--device cuda`` fits the MR2 rows there, and ``--spheres`` fits the cosine rows on the
unit spheres even where the estimator keeps the rounds (``benchmarks/gpu_check.sh`` runs
both, on 20,000 × 1,024 synthetic features: the estimator takes the spheres on a CPU
only, until they are measured on a GPU). ``--repeat N`` keeps the best of N fit
times for every row of the table (not the ``--sweep``'s): on a shared machine one fit's
time can be a fifth off.

    python benchmarks/bench_cosine.py                                 # 20,000 × 512, 10 classes
    python benchmarks/bench_cosine.py --store runs/cache/fmnist_train_lite0_64.h5
    python benchmarks/bench_cosine.py --store runs/cache/fmnist_train_lite0_64.h5 \
        --c-bar none --no-before
    python benchmarks/bench_cosine.py --store runs/cache/fmnist_train_lite0_64.h5 \
        --scales --sweep
    python benchmarks/bench_cosine.py --store runs/cache/fmnist_train_lite0_64.h5 \
        --no-before --no-equivalent --repeat 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # the previous solver, kept in tests/
from bench_fit import (  # noqa: E402
    AT_LEAST_0_FINITE,
    AT_LEAST_1,
    POSITIVE,
    POSITIVE_FINITE,
    SEED,
    check_distinct,
    check_feature_arguments,
    check_output,
    check_two_classes,
    check_values,
    make_features,
    threads,
    untrained_test_rows,
    write_whole,
)

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV, _sphere  # noqa: E402
from mr2_probe import _solvers as solvers  # noqa: E402
from mr2_probe._device import resolve_device  # noqa: E402
from mr2_probe._losses import margin_cross_entropy  # noqa: E402
from mr2_probe._prediction import both_class_logits  # noqa: E402
from tests.reference_mr2 import cosine_lbfgs_before  # noqa: E402


def load(args):
    """Unit-norm train and test features: the store's first rows, or synthetic ones."""
    if args.store:
        from extract import load_features

        # The completed rows only: a failed image's row holds zeros (NaN once normalised).
        with load_features(args.store) as store:
            n = min(len(store.labels), args.n_samples + args.n_test)
            X = np.asarray(store.features[:n], dtype=np.float32)
            y = store.labels[:n].astype(np.int64)
    else:
        n = args.n_samples + args.n_test
        X, y = make_features(n, args.n_features, args.n_classes, args.seed)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X[: args.n_samples], y[: args.n_samples], X[args.n_samples :], y[args.n_samples :]


def class_indices(y, yt):
    """Labels as their class's row of a model's ``coef_`` and ``margins_``, its position
    among the training classes, as the objectives here index them (a code was taken as
    the row: a class that the training rows lack below the largest code, as a store's
    listed class of no row or synthetic classes that a few rows miss, failed them with
    "index 9 is out of bounds", or read another class's row). Test rows of a class the
    training rows lack are -1, which no model predicts."""
    classes = np.unique(y)
    position = np.searchsorted(classes, yt).clip(max=len(classes) - 1)
    return np.searchsorted(classes, y), np.where(classes[position] == yt, position, -1)


def add_data_arguments(parser) -> None:
    """The options of :func:`load`, shared with cosine_tried.py."""
    parser.add_argument("--store", type=Path, help="a feature store (.h5) instead of synthetic")
    parser.add_argument("--n-samples", type=int, default=20_000)
    parser.add_argument("--n-test", type=int, default=5_000)
    parser.add_argument("--n-features", type=int, help="synthetic features' (default: 512)")
    parser.add_argument("--n-classes", type=int, help="synthetic features' (default: 10)")


def check_data_arguments(parser, args) -> None:
    """Refuse the options of :func:`load` that leave no training or no test row."""
    for option, value in (("--n-samples", args.n_samples), ("--n-test", args.n_test)):
        if value < 1:
            parser.error(f"{option} must be at least 1; got {value}")
    if args.store:  # a store's features and classes are its own: they were ignored
        for option in ("--n-features", "--n-classes"):
            if getattr(args, option[2:].replace("-", "_")) is not None:
                parser.error(f"{option} applies to synthetic features, not to --store")
    else:
        args.n_features = 512 if args.n_features is None else args.n_features
        args.n_classes = 10 if args.n_classes is None else args.n_classes
        check_feature_arguments(parser, args)
    if args.store:
        from extract import StoreError, load_features

        try:  # (a traceback: no such file, not a store, one being written)
            with load_features(args.store) as store:
                n = len(store.labels)
        except StoreError as error:
            parser.error(f"--store: {error}")
        if n <= args.n_samples:
            parser.error(f"--store {args.store} has {n} rows: not one test row after "
                         f"--n-samples {args.n_samples}")  # fmt: skip


def objective(X, y, coef, margins):
    # Two classes: one row, v_1 − v_0; the margin cross-entropy of (0, z) is that of the
    # two rows' logits (a shift of both logits leaves it unchanged).
    z = both_class_logits(torch.as_tensor(X @ coef.T, dtype=torch.float64))
    return float(margin_cross_entropy(z, torch.as_tensor(y), torch.as_tensor(margins)))


def multipliers(X, y, coef, margins):
    """μ_k = −(∇_k L·v_k) / ‖v_k‖², the penalty that makes the cosine solution stationary."""
    V = torch.as_tensor(coef, dtype=torch.float64).requires_grad_()
    z = torch.as_tensor(X, dtype=torch.float64) @ V.T
    margin_cross_entropy(z, torch.as_tensor(y), torch.as_tensor(margins)).backward()
    return (-(V.grad * V).sum(1) / (V * V).sum(1)).detach().numpy()


def equivalent_C(mu, weight_sum):
    """C of the linear head whose penalty ½‖V‖² / (C·S) is ½ μ‖V‖² (per class, or mean μ)."""
    return 1 / (weight_sum * np.asarray(mu))


def timed(fn, repeat=1):
    """(seconds, fn's result, whether it stopped short of tol: a ConvergenceWarning), the
    best time of ``repeat`` calls (the machine's noise only ever adds time); the result
    and the warning are the last call's (the same fit each time)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            out = fn()
        best = min(best, time.perf_counter() - start)
    short = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return best, out, short


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--C", type=float, default=1.0, help="the linear heads' C")
    parser.add_argument("--scales", type=float, nargs="*", default=[16.0, 64.0, 256.0])
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=3000)
    parser.add_argument(
        "--c-bar",
        type=lambda v: None if v == "none" else float(v),
        default=1.0,
        help="the cosine heads' mean margin c̄, or 'none' (default: 1, the estimator's)",
    )
    parser.add_argument(
        "--no-rounds", action="store_true", help="skip the rounds of torch's L-BFGS"
    )
    parser.add_argument("--no-before", action="store_true", help="skip the autograd solver")
    parser.add_argument(
        "--linear-history",
        type=_at_least_one,
        help="also fit the mean-μ linear problems with N pairs",
    )
    parser.add_argument(
        "--no-equivalent", action="store_true", help="skip the equivalent linear problems"
    )
    parser.add_argument("--sweep", action="store_true", help="also time a search of the scale")
    parser.add_argument(
        "--sweep-scales", type=float, nargs="+",
        help="the scales --sweep searches (default: 8 16 32 64 128 256)",
    )  # fmt: skip
    parser.add_argument("--sweep-folds", type=int, help="--sweep's folds (default: 3)")
    parser.add_argument(
        "--repeat", type=_at_least_one, default=1,
        help="fits per row of the table, best time kept (default: 1)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, help="synthetic features' (default: 0)")
    parser.add_argument(
        "--device", default="cpu", help="the MR2 rows' device (scikit-learn's: the CPU)"
    )
    parser.add_argument(
        "--spheres", action="store_true",
        help="the cosine rows on the unit spheres on any device but MPS, any X and scale",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # (an OSError after the run)
    if args.sweep_folds is not None and args.sweep_folds < 2:
        parser.error(f"--sweep-folds must be at least 2; got {args.sweep_folds}")
    # Options of rows that no option asked for: they changed nothing, without a word.
    for option, value in (
        ("--sweep-scales", args.sweep_scales),
        ("--sweep-folds", args.sweep_folds),
    ):
        if value is not None and not args.sweep:
            parser.error(f"{option} applies to --sweep, which was not given")
    if args.linear_history is not None and args.no_equivalent:
        parser.error("--linear-history fits the linear problems at mean μ, which --no-equivalent "
                     "skips: give one or the other")  # fmt: skip
    check_values(parser, args, POSITIVE, "--C")
    check_values(parser, args, POSITIVE_FINITE, "--scales", "--c-bar", "--sweep-scales")
    check_values(parser, args, AT_LEAST_0_FINITE, "--tol")
    # (the same rows twice; --sweep-scales 8 8: a ValueError after the search's fits)
    check_distinct(parser, args, "--scales", "--sweep-scales")
    check_values(parser, args, AT_LEAST_1, "--max-iter")  # (0: fits of no iteration, timed)
    check_values(parser, args, SEED, "--seed")
    if args.store and args.seed is not None:  # (it drew the synthetic features alone: ignored)
        parser.error("--seed applies to synthetic features, not to --store")
    args.seed = 0 if args.seed is None else args.seed
    if not args.scales:  # (no cosine row: they changed nothing, without a word)
        for option in ("--spheres", "--linear-history"):
            if getattr(args, option[2:].replace("-", "_")):
                parser.error(f"{option} applies to the cosine rows, which --scales with no "
                             "value skips")  # fmt: skip
    if args.sweep_scales is None:
        args.sweep_scales = [8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
    if args.sweep_folds is None:
        args.sweep_folds = 3
    try:
        resolve_device(args.device)
    except (ValueError, RuntimeError) as error:
        parser.error(f"--device: {error}")
    check_data_arguments(parser, args)

    X, y, Xt, yt = load(args)
    check_two_classes(parser, y)
    # (StratifiedKFold's ValueError, after the table; it refuses more folds than the rows of
    # every class, and only warns of a class with fewer rows than folds, which the sweep runs)
    largest = np.unique(y, return_counts=True)[1].max()
    if args.sweep and args.sweep_folds > largest:
        parser.error(f"--sweep-folds must be at most the training rows of the largest class "
                     f"({largest}); got {args.sweep_folds}")  # fmt: skip
    common = dict(tol=args.tol, max_iter=args.max_iter, device=args.device)
    with warnings.catch_warnings():  # torch's warm-up, two iterations: short of tol
        warnings.simplefilter("ignore", ConvergenceWarning)
        # At most 500 rows spread over all the training rows: a store's first 500 may be one
        # class (a class-per-folder tree's rows are in class order), which the fit refused;
        # the step rounds up, else under 1,000 rows it was 1 and took the first 500
        warm = slice(None, None, -(-len(y) // 500))
        MR2LinearClassifier(max_iter=2, device=args.device).fit(X[warm], y[warm])
    print(
        f"{len(y)} × {X.shape[1]} L2-normalised float32 train, {len(yt)} test, "
        f"{len(np.unique(y))} classes, tol={args.tol}, "
        + (f"best of {args.repeat}, " if args.repeat > 1 else "")
        + threads()
        + (f", from {args.store}" if args.store else ", synthetic")
    )
    if untrained := untrained_test_rows(y, yt):
        print(untrained)
    y, yt = class_indices(y, yt)  # (once said, in the store's codes)
    header = f"{'model':<46}{'fit s':>8}{'× linear':>10}{'iters':>8}{'objective':>11}{'acc %':>8}"
    print(header)
    print("-" * len(header))
    rows, base = [], None

    def report(name, seconds, n_iter, loss, acc, short=False):
        ratio = seconds / base
        loss_text = f"{loss:11.6f}" if loss is not None else f"{'':>11}"
        iters = f"{n_iter:7d}{'*' if short else ' '}"
        print(f"{name:<46}{seconds:8.2f}{ratio:9.2f}×{iters}{loss_text}{100 * acc:8.2f}")
        rows.append(dict(model=name, fit_s=seconds, ratio_to_linear=ratio, n_iter=n_iter,
                         stopped_short=short, objective=loss, accuracy=100 * acc))  # fmt: skip

    sk = LogisticRegression(C=args.C, tol=args.tol, max_iter=args.max_iter)
    sk_seconds, _, sk_short = timed(lambda: sk.fit(X, y), args.repeat)
    linear = MR2LinearClassifier(c_bar=None, C=args.C, **common)
    seconds, _, short = timed(lambda: linear.fit(X, y), args.repeat)
    base = seconds
    # scikit-learn's row printed once the linear head's time, its ratio's base, is known (it
    # printed nan×, and null in --json)
    report(f"LogisticRegression (sklearn) C={args.C:g}", sk_seconds, int(sk.n_iter_[0]), None,
           sk.score(Xt, yt), sk_short)  # fmt: skip
    report(f"MR2 linear, c_bar=None, C={args.C:g}", seconds, linear.n_iter_, None,
           linear.score(Xt, yt), short)  # fmt: skip
    for scale in args.scales:
        cosine = MR2LinearClassifier(head="cosine", scale=scale, c_bar=args.c_bar, **common)
        chosen = _spheres_wherever_they_can if args.spheres else solvers.runs_on_spheres
        with patch.object(solvers, "runs_on_spheres", chosen):
            seconds, _, short = timed(lambda cosine=cosine: cosine.fit(X, y), args.repeat)
        margins = cosine.margins_
        forced = " (spheres)" if args.spheres else ""
        report(f"MR2 cosine, scale={scale:g}{forced}", seconds, cosine.n_iter_,
               objective(X, y, cosine.coef_, margins), cosine.score(Xt, yt), short)  # fmt: skip
        if not args.no_rounds:  # the previous solver, kept where the spheres do not pay
            rounds = MR2LinearClassifier(head="cosine", scale=scale, c_bar=args.c_bar, **common)
            with patch.object(solvers, "runs_on_spheres", lambda *args: False):
                seconds, _, short = timed(lambda rounds=rounds: rounds.fit(X, y), args.repeat)
            report("  rounds of torch's L-BFGS (previous)", seconds, rounds.n_iter_,
                   objective(X, y, rounds.coef_, margins), rounds.score(Xt, yt), short)  # fmt: skip
        if not args.no_before:
            seconds, (coef, n_iter), _ = timed(
                lambda s=scale, m=margins: cosine_lbfgs_before(X, y, s, m, args.tol, args.max_iter),
                args.repeat,
            )
            acc = np.mean(np.argmax(Xt @ coef.T, axis=1) == yt)
            # torch's L-BFGS warns of nothing: it stopped short when it ran out of iterations.
            report("  before (autograd, 10 pairs, tol in W)", seconds, n_iter,
                   objective(X, y, coef, margins), acc, n_iter >= args.max_iter)  # fmt: skip
        if not args.no_equivalent:
            equivalent(X, y, Xt, yt, cosine, args, report)
    if any(row["stopped_short"] for row in rows):
        print("* stopped short of tol (ConvergenceWarning)")
    if args.sweep:
        rows.extend(sweep(X, y, args, common))
    if args.json:
        write_whole(
            args.json,
            json.dumps(
                {"args": vars(args), "untrained_test_rows": untrained, "rows": rows},
                indent=1,
                default=str,
            ),
        )


def _spheres_wherever_they_can(source, n_features, n_classes, scale, margins):
    """``--spheres``: the spheres whatever the device (but MPS, without float64), the size
    of X or the scale, where their products fit."""
    fits = source.n_samples * n_classes <= _sphere.KEEP_PRODUCTS
    return source.y.device.type != "mps" and fits


def equivalent(X, y, Xt, yt, cosine, args, report):
    """The linear head at the cosine solution's mean multiplier, at the same precision."""
    if len(cosine.coef_) == 1:  # two classes: the model keeps its rows as one difference
        print("  (no linear problem at mean μ: two classes, one row of coefficients)")
        return
    mu = multipliers(X, y, cosine.coef_, cosine.margins_)
    if not (mu > 0).all():
        print(f"  (no linear problem at mean μ: μ from {mu.min():.3g})")
        return
    c_mean, c_range = equivalent_C(mu.mean(), len(y)), equivalent_C(mu, len(y))
    tol = args.tol / cosine.scale
    kw = dict(fit_intercept=False, c_bar=cosine.c_bar, p=cosine.p_, C=c_mean, tol=tol,
              max_iter=args.max_iter, device=args.device)  # fmt: skip
    histories = [None] + ([args.linear_history] if args.linear_history else [])
    for history in histories:
        linear = MR2LinearClassifier(**kw)
        default = solvers._LINEAR_HISTORY
        solvers._LINEAR_HISTORY = history or default
        try:
            seconds, _, short = timed(lambda linear=linear: linear.fit(X, y), args.repeat)
        finally:
            solvers._LINEAR_HISTORY = default
        assert np.allclose(linear.margins_, cosine.margins_), "not the cosine head's margins"
        if history is None:
            norms = np.linalg.norm(linear.coef_, axis=1)
            print(f"  (per-class C from {c_range.min():.3g} to {c_range.max():.3g}; the linear "
                  f"rows' norms {norms.min():.0f} to {norms.max():.0f})")  # fmt: skip
        pairs = f", {history} pairs" if history else ""
        report(f"  linear at mean μ, C={c_mean:.3g}, tol/{cosine.scale:g}{pairs}", seconds,
               linear.n_iter_, None, linear.score(Xt, yt), short)  # fmt: skip
    if cosine.c_bar is None:  # no margins: scikit-learn's own problem
        sk = LogisticRegression(C=c_mean, fit_intercept=False, tol=tol, max_iter=args.max_iter)
        seconds, _, short = timed(lambda: sk.fit(X, y), args.repeat)
        report("  same, LogisticRegression (sklearn)", seconds, int(sk.n_iter_[0]), None,
               sk.score(Xt, yt), short)  # fmt: skip


def sweep(X, y, args, common):
    """Time a cross-validated search of the scale: the warm-started path against cold fits."""
    folds = list(StratifiedKFold(args.sweep_folds).split(X, y))
    scales, kw = sorted(args.sweep_scales), dict(head="cosine", c_bar=args.c_bar, **common)
    train = folds[0][0]
    one_s, one, _ = timed(
        lambda: MR2LinearClassifier(scale=scales[-1], **kw).fit(X[train], y[train])
    )
    path = MR2LinearClassifierCV(Cs=scales, cv=folds, refit=False, n_jobs=1, **kw)
    path_s, _, _ = timed(lambda: path.fit(X, y))
    grid = GridSearchCV(MR2LinearClassifier(**kw), {"scale": scales}, cv=folds, refit=False)
    grid_s, _, _ = timed(lambda: grid.fit(X, y))
    path_iter = np.asarray(path.n_iter_).reshape(len(folds), len(scales)).sum(1)
    # Both columns by GridSearchCV's rule, the best mean score over the folds (first of
    # ties): path.scale_, with refit=False, is the mean of the folds' best scales.
    path_best = path.Cs_[np.argmax(next(iter(path.scores_.values())).mean(0))]
    print(
        f"\nscale search over {', '.join(f'{v:g}' for v in scales)}, {len(folds)} folds, "
        f"{len(train)} training rows per fold"
    )
    # scale: the one of the best mean score over the folds.
    header = f"{'search':<44}{'time s':>8}{'fits/fold':>11}{'iters/fold':>12}{'scale':>7}"
    print(header)
    print("-" * len(header))
    out = []
    for name, seconds, n_iter, chosen in [
        (f"one cold fit at scale {scales[-1]:g}", one_s, one.n_iter_, None),
        ("MR2LinearClassifierCV (warm-started path)", path_s, path_iter.mean(), path_best),
        ("GridSearchCV(MR2LinearClassifier) (cold)", grid_s, None, grid.best_params_["scale"]),
    ]:
        fits = seconds / one_s if chosen is None else seconds / (one_s * len(folds))
        iters = f"{n_iter:12.0f}" if n_iter is not None else f"{'':>12}"
        scale = f"{chosen:7g}" if chosen is not None else f"{'':>7}"
        print(f"{name:<44}{seconds:8.2f}{fits:11.2f}{iters}{scale}")
        out.append(dict(search=name, seconds=seconds, fits_per_fold=fits, chosen_scale=chosen))
    return out


if __name__ == "__main__":
    main()
