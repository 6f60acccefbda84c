"""An ImageNet-size linear probe on the GPU: fit time, iterations, accuracy, peak memory.

ImageNet-1k's training set as 1,024-dimensional float16 embeddings: 1,281,167 × 1,024
synthetic features (Gaussian classes around means on a sphere, per-class spread from 0.5×
to 2×), 1,000 classes. The features and labels are generated on the device in chunks, so
the host never holds them; then ``MR2LinearClassifier`` (c̄ = 1) is fitted on the device
tensor twice, with ``solver="lbfgs"`` and with ``solver="adam"``. Each fit reports its
wall time, iterations (epochs for Adam), training accuracy (predicted in chunks) and the
peak GPU memory of the fit (``torch.cuda.max_memory_allocated``, reset before each fit).

Memory: the float16 features take 2.6 GB on the device. The estimator computes half
precision in float32, so a fit makes a float32 copy (5.2 GB) beside them, and L-BFGS
works on blocks of rows of that copy: plan on at least 8 GB of GPU memory at the full size;
the reported peak is the measured figure. Without CUDA it runs on the CPU, which is only
sensible at a small size::

    python benchmarks/bench_probe_imagenet.py                       # full size, CUDA
    python benchmarks/bench_probe_imagenet.py --json runs/probe_imagenet.json
    python benchmarks/bench_probe_imagenet.py --n-samples 2000 --n-features 64 --n-classes 10

Then, as a peer, scikit-learn's LogisticRegression on the CPU against the estimator with
``c_bar=None`` (the same objective) on the device, both on the first ``--peer-rows`` rows
(5,000 by default: scikit-learn cannot fit the full size in a benchmark's time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import (  # noqa: E402
    AT_LEAST_1,
    POSITIVE,
    SEED,
    check_output,
    check_two_classes,
    check_values,
    write_whole,
)

from mr2_probe import MR2LinearClassifier  # noqa: E402

CHUNK = 1 << 17  # rows generated or predicted at a time


def make_features(n_samples, n_features, n_classes, seed, device):
    """float16 features and int64 labels, generated on ``device`` chunk by chunk."""
    gen = torch.Generator(device=device).manual_seed(seed)
    means = torch.randn(n_classes, n_features, generator=gen, device=device)
    means *= 3.0 / means.norm(dim=1, keepdim=True)
    spread = torch.linspace(0.5, 2.0, n_classes, device=device)  # per dimension
    y = torch.randint(n_classes, (n_samples,), generator=gen, device=device)
    X = torch.empty(n_samples, n_features, dtype=torch.float16, device=device)
    for start in range(0, n_samples, CHUNK):
        labels = y[start : start + CHUNK]
        noise = torch.randn(len(labels), n_features, generator=gen, device=device)
        X[start : start + len(labels)] = means[labels] + noise * spread[labels, None]
    return X, y


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_accuracy(model, X, y):
    """Accuracy on (X, y), predicted in chunks so the logits never exist for all rows."""
    correct = 0
    for start in range(0, len(y), CHUNK):
        pred = model.predict(X[start : start + CHUNK])
        correct += int(np.sum(pred == y[start : start + CHUNK].cpu().numpy()))
    return correct / len(y)


def fit_one(model, X, y):
    """Fit once; wall time, iterations, training accuracy, peak memory and any warning."""
    device = X.device
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device)
    _sync(device)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    _sync(device)
    seconds = time.perf_counter() - start
    row = {
        "solver": model.solver_,
        "device": model.device_,
        "fit_s": seconds,
        "n_iter": int(model.n_iter_),
        "final_loss": float(model.loss_curve_[-1]) if model.loss_curve_ else None,
        "warnings": [str(w.message) for w in caught],
    }
    if device.type == "cuda":
        row["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated(device))
        row["resident_gpu_bytes_before_fit"] = int(resident)
    start = time.perf_counter()
    row["train_accuracy"] = train_accuracy(model, X, y)
    row["predict_s"] = time.perf_counter() - start
    return row


def peer(X, y, args) -> dict:
    """scikit-learn's LogisticRegression (CPU, float32 host copy) against MR2 with
    c_bar=None (its objective, on the device), on the first ``--peer-rows`` rows: the full
    size is beyond scikit-learn's reach, so the comparison is made where both can run."""
    from sklearn.linear_model import LogisticRegression

    n = min(args.peer_rows, len(y))
    X_host, y_host = X[:n].float().cpu().numpy(), y[:n].cpu().numpy()
    sk = LogisticRegression(C=args.C, max_iter=args.lbfgs_iter)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X_host, y_host)
    sk_s = time.perf_counter() - start
    ours = MR2LinearClassifier(
        c_bar=None, C=args.C, max_iter=args.lbfgs_iter, device=str(X.device), random_state=0
    )
    row = fit_one(ours, X[:n], y[:n])
    print(
        f"peer, first {n:,} rows: LogisticRegression (sklearn, CPU) {sk_s:.2f} s, "
        f"{int(sk.n_iter_[0])} iters; MR2 c_bar=None on {X.device} {row['fit_s']:.2f} s, "
        f"{row['n_iter']} iters: a speed-up of {sk_s / row['fit_s']:.1f}×"
    )
    return {"rows": n, "sklearn_fit_s": sk_s, "sklearn_n_iter": int(sk.n_iter_[0]), "mr2": row}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=1_281_167)
    parser.add_argument("--n-features", type=int, default=1024)
    parser.add_argument("--n-classes", type=int, default=1000)
    parser.add_argument("--C", type=float, default=1.0)
    parser.add_argument("--lbfgs-iter", type=int, default=100, help="max_iter of L-BFGS")
    parser.add_argument("--adam-epochs", type=int, default=10, help="max_iter of Adam")
    parser.add_argument("--batch-size", type=int, default=4096, help="Adam's minibatch")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peer-rows",
        type=int,
        default=5000,
        help="rows of the peer comparison (scikit-learn on the CPU against MR2 c_bar=None on "
        "the device, same rows; 0 skips it)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # (an OSError after the run)
    # (a traceback from the data's generation or a fit, the features made: --batch-size at
    # Adam's fit, after L-BFGS's)
    for option, value in (("--n-samples", args.n_samples), ("--batch-size", args.batch_size)):
        if value < 1:
            parser.error(f"{option} must be at least 1; got {value}")
    if args.peer_rows < 0:  # (skipped as 0 would, without a word)
        parser.error(
            f"--peer-rows must be at least 0 (0 skips the comparison); got {args.peer_rows}"
        )
    if args.n_features < 1:
        parser.error(f"--n-features must be at least 1; got {args.n_features}")
    if args.n_classes < 2:
        parser.error(f"--n-classes must be at least 2; got {args.n_classes}")
    check_values(parser, args, POSITIVE, "--C")
    check_values(parser, args, SEED, "--seed")
    # (0: a fit of no iteration timed, its accuracy the start's; -1: scikit-learn's error)
    check_values(parser, args, AT_LEAST_1, "--lbfgs-iter", "--adam-epochs")
    if args.device not in ("auto", "cpu", "cuda"):
        parser.error(f"--device takes auto, cpu or cuda; got {args.device!r}")
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    device = torch.device(name)

    start = time.perf_counter()
    X, y = make_features(args.n_samples, args.n_features, args.n_classes, args.seed, device)
    _sync(device)
    generate_s = time.perf_counter() - start
    check_two_classes(parser, y.cpu())
    peer_classes = len(torch.unique(y[: args.peer_rows])) if args.peer_rows else 2
    if peer_classes < 2:  # (scikit-learn's ValueError after the main fits)
        parser.error(f"--peer-rows {args.peer_rows} takes rows of {peer_classes} class; two or "
                     "more are needed (0 skips the comparison)")  # fmt: skip
    # Warm up (CUDA context, cuBLAS handles, kernels) so that it is not billed to a fit.
    warm = min(len(y), 4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MR2LinearClassifier(max_iter=2, device=str(device)).fit(X[:warm], y[:warm])

    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "features_dtype": str(X.dtype).replace("torch.", ""),
        "features_bytes": X.numel() * X.element_size(),
        "generate_s": generate_s,
        "fits": {},
    }
    common = dict(c_bar=1.0, C=args.C, device=str(device), random_state=args.seed)
    models = {
        "lbfgs": MR2LinearClassifier(solver="lbfgs", max_iter=args.lbfgs_iter, **common),
        "adam": MR2LinearClassifier(
            solver="adam", max_iter=args.adam_epochs, batch_size=args.batch_size, **common
        ),
    }
    print(
        f"{args.n_samples:,} × {args.n_features} {result['features_dtype']} features "
        f"({result['features_bytes'] / 1e9:.2f} GB), {args.n_classes} classes, on {device}"
        + (f" ({result['gpu']})" if result["gpu"] else "")
        + f"; generated in {generate_s:.2f} s"
    )
    header = f"{'solver':<8}{'fit s':>9}{'iters':>7}{'train acc %':>13}{'peak GPU GB':>13}"
    print(header)
    print("-" * len(header))
    for key, model in models.items():
        row = fit_one(model, X, y)
        result["fits"][key] = row
        peak = row.get("peak_gpu_bytes")
        peak = f"{peak / 1e9:13.2f}" if peak is not None else f"{'-':>13}"
        print(
            f"{key:<8}{row['fit_s']:9.2f}{row['n_iter']:7d}{100 * row['train_accuracy']:13.2f}"
            + peak
        )
        for message in row["warnings"]:
            print(f"  {key}: {message}")
    if args.peer_rows > 0:
        result["peer"] = peer(X, y, args)
    if args.json is not None:
        write_whole(args.json, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
