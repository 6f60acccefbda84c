"""Does MR² help a linear probe? Every method tuned on a validation split, refitted, and
scored class by class on the test set, mean ± std over seeds.

    python benchmarks/quality.py --data fmnist --image-sizes 64 96      # real features
    python benchmarks/quality.py --data synthetic --classes 10 100 1000 # Gaussian classes

Real data: Fashion-MNIST (60k / 10k) through EfficientNet-Lite0 (``extract``; the stores
are cached in ``--cache``). Synthetic data: Gaussian classes whose difficulty comes either
from their spread (γ follows difficulty) or whose mean norms differ at equal spread (γ
follows the norm, not difficulty). Every method gets the same budget: four configurations,
chosen by validation worst-class accuracy (ties: overall), refitted on the whole training
set. Groups (easy / medium / hard) are the terciles of the tuned ERM probe's per-class
test accuracy, per seed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

from mr2_probe import MR2LinearClassifier
from mr2_probe.metrics import classwise_summary, difficulty_groups, per_class_accuracy

COLUMNS = ("overall", "easy", "medium", "hard", "worst")


def _grid(**axes):
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


def _mr2(scaler, **params):
    probe = MR2LinearClassifier(**params)
    return probe if scaler is None else make_pipeline(scaler, probe)


# name → (four configurations, factory(config, seed) → unfitted estimator)
METHODS = {
    "ERM (LogisticRegression, std)": (
        _grid(C=[0.01, 0.1, 1.0, 10.0]),
        lambda c, seed: make_pipeline(
            StandardScaler(), LogisticRegression(C=c["C"], max_iter=2000)
        ),
    ),
    "MR2 margins p=2, raw": (
        _grid(c_bar=[1.0, 2.0], C=[0.1, 1.0]),
        lambda c, seed: _mr2(None, max_iter=1000, **c),
    ),
    "MR2 margins p=2, std": (
        _grid(c_bar=[1.0, 2.0], C=[0.1, 1.0]),
        lambda c, seed: _mr2(StandardScaler(), max_iter=1000, **c),
    ),
    "MR2 margins p=3, cosine, L2-norm": (
        _grid(c_bar=[1.0, 2.0], scale=[16.0, 32.0]),
        lambda c, seed: _mr2(Normalizer(), head="cosine", p=3, max_iter=300, **c),
    ),
    "MR2 + compactness (P rank 64), std": (
        _grid(lam=[0.1, 0.5], c_bar=[1.0, 2.0]),
        lambda c, seed: _mr2(
            StandardScaler(), projection_rank=64, max_iter=15, random_state=seed, **c
        ),
    ),
    "MR2 Adam 10 epochs (paper regime), std": (
        _grid(c_bar=[1.0, 2.0], C=[0.1, 1.0]),
        lambda c, seed: _mr2(
            StandardScaler(),
            solver="adam",
            max_iter=10,
            n_iter_no_change=10,
            random_state=seed,
            **c,
        ),
    ),
}
SYNTHETIC_METHODS = (
    "ERM (LogisticRegression, std)",
    "MR2 margins p=2, raw",
    "MR2 margins p=2, std",
)


def fashion_mnist_features(image_size: int, cache: Path):
    from extract import extract_features, load_features

    arrays = []
    for split in ("train", "test"):
        path = cache / f"fmnist_{split}_lite0_{image_size}.h5"
        extract_features(
            f"fashion-mnist:{split}", "effnet-lite0", path, image_size=image_size, progress=False
        )
        store = load_features(path, in_memory=True)
        arrays += [np.asarray(store.features, dtype=np.float32), store.labels]
    return tuple(arrays)


def synthetic_features(n_classes: int, kind: str, seed: int = 0, n_features: int = 64):
    """Gaussian classes: ``spread`` — equal mean norms, spreads 0.5×…2× (γ follows
    difficulty); ``norm`` — equal spreads, mean norms 1×…4× (γ follows the norm)."""
    rng = np.random.default_rng(seed)
    per_class = max(50, 20_000 // n_classes)
    directions = rng.normal(size=(n_classes, n_features))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    ranks = rng.permutation(n_classes) / max(n_classes - 1, 1)  # a class-wise factor in [0, 1]
    norms = 2.0 * (1 + 3 * ranks) if kind == "norm" else np.full(n_classes, 4.0)
    spread = 0.5 + 1.5 * ranks if kind == "spread" else np.full(n_classes, 1.0)
    y = np.repeat(np.arange(n_classes), per_class + per_class // 2)
    noise = rng.normal(size=(len(y), n_features)) * spread[y, None] * 2 / np.sqrt(n_features) * 4
    X = (directions[y] * norms[y, None] + noise).astype(np.float32)
    return train_test_split(X, y, test_size=1 / 3, stratify=y, random_state=seed)


def _fit(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)


def run_seed(X, y, X_test, y_test, methods, seed):
    """Tune, refit and score every method for one seed; returns name → summary."""
    X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.1, stratify=y, random_state=seed)
    predictions, chosen = {}, {}
    for name in methods:
        start = time.perf_counter()
        configs, make = METHODS[name]
        scores = []
        for config in configs:
            pred = _fit(make(config, seed), X_tr, y_tr).predict(X_val)
            s = classwise_summary(y_val, pred)
            scores.append((s["worst"], s["overall"]))
        best = configs[max(range(len(configs)), key=scores.__getitem__)]
        predictions[name] = _fit(make(best, seed), X, y).predict(X_test)
        chosen[name] = best
        print(
            f"  seed {seed}: {name}: {best} ({time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    reference = next(iter(methods))
    groups = difficulty_groups(per_class_accuracy(y_test, predictions[reference]))
    return {
        name: {**classwise_summary(y_test, pred, groups), "config": chosen[name]}
        for name, pred in predictions.items()
    }


def table(dataset: str, results: list[dict]) -> str:
    lines = []
    for name in results[0]:
        cells = []
        for column in COLUMNS:
            values = 100 * np.array([r[name][column] for r in results])
            cells.append(f"{values.mean():.2f} ± {values.std():.2f}")
        lines.append(f"| {dataset} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("fmnist", "synthetic"), default="fmnist")
    parser.add_argument("--image-sizes", type=int, nargs="+", default=[64, 96])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", type=Path, default=Path("runs/cache"))
    parser.add_argument("--out", type=Path, help="write all results as JSON")
    args = parser.parse_args(argv)

    datasets = []
    if args.data == "fmnist":
        args.cache.mkdir(parents=True, exist_ok=True)
        for size in args.image_sizes:
            datasets.append(
                (
                    f"Fashion-MNIST, Lite0 {size}px",
                    lambda size=size: fashion_mnist_features(size, args.cache),
                    tuple(METHODS),
                )
            )
    else:
        for kind, k in itertools.product(("spread", "norm"), args.classes):
            X_tr, X_te, y_tr, y_te = synthetic_features(k, kind)
            datasets.append(
                (
                    f"synthetic K={k}, {kind}",
                    lambda a=(X_tr, y_tr, X_te, y_te): a,
                    SYNTHETIC_METHODS,
                )
            )

    print("| data | method | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    everything = {}
    for dataset, load, methods in datasets:
        X, y, X_test, y_test = load()
        start = time.perf_counter()
        results = [run_seed(X, y, X_test, y_test, methods, seed) for seed in args.seeds]
        print(table(dataset, results), flush=True)
        everything[dataset] = {"seconds": time.perf_counter() - start, "seeds": results}
    if args.out:
        args.out.write_text(json.dumps(everything, indent=2, default=str))


if __name__ == "__main__":
    main()
