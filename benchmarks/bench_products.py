"""The two matrix products of a closed-form evaluation, torch's own against the library's.

Every full-batch evaluation of the linear and cosine heads (the rounds of torch's L-BFGS,
the unit spheres, the batched search) computes the logits x·vᵀ of a block of rows and the
gradient gᵀ·x from the logits' gradient. ``_device.rows_product`` takes oneDNN's kernel
for the first and ``_device.transposed_product`` splits the second over row parts on a
CPU (why: their comments). For each size n x d x K, float32, this times torch's product
(``x @ v.T``, ``g.T @ x``) and the library's in one process, best of ``--repeats``, in
milliseconds, with their ratio and each one's largest error relative to the float64
product's largest entry.

    python benchmarks/bench_products.py
    python benchmarks/bench_products.py --threads 1 --sizes 6553x1280x10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_threads import parse_size  # noqa: E402

from mr2_probe._device import rows_product, transposed_product  # noqa: E402

# fmnist's 20,000 × 1,280 features (bench_cosine.py) whole and as one of its fit's blocks,
# the same block of a 3-fold batched search (30 columns), a block of bench_fit.py's
# default problem, digits, two classes.
SIZES = ["20000x1280x10", "6553x1280x10", "6553x1280x30", "10922x768x100", "1797x64x10",
         "20000x1280x2"]  # fmt: skip


def best_ms(fn, repeats: int) -> float:
    fn()  # the first call pays for allocations and kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    return float((out.double() - exact).abs().max() / exact.abs().max())


def measure(n: int, d: int, k: int, gen, repeats: int) -> dict:
    """Time and check both products at one size; print its row."""
    x = torch.randn(n, d, generator=gen)
    v = torch.randn(k, d, generator=gen)
    g = torch.randn(n, k, generator=gen)
    pairs = {
        "logits": (lambda: x @ v.T, lambda: rows_product(x, v)),
        "gradient": (lambda: g.T @ x, lambda: transposed_product(g, x)),
    }
    exact = {"logits": x.double() @ v.double().T, "gradient": g.double().T @ x.double()}
    row = dict(size=f"{n}x{d}x{k}")
    cells, errors = [], []
    for name, (theirs, ours) in pairs.items():
        ms = best_ms(theirs, repeats), best_ms(ours, repeats)
        row[f"{name}_ms"] = ms
        row[f"{name}_errors"] = [relative_error(f(), exact[name]) for f in (theirs, ours)]
        cells.append(f"{ms[0]:11.2f} {ms[1]:8.2f} {ms[0] / ms[1]:5.2f}×")
        errors.append("{:.1e} / {:.1e}".format(*row[f"{name}_errors"]))
    print(f"{row['size']:>15} {' '.join(cells)}   torch / library: {', '.join(errors)}")
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=SIZES, help="n x d x K, e.g. 1797x64x10")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, help="torch's threads (default: its own)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1; got {args.threads}")
    try:
        sizes = [parse_size(s) for s in args.sizes]
    except ValueError:
        parser.error(
            f"--sizes takes n x d x K of at least 1 each, e.g. 1797x64x10; got {args.sizes}"
        )
    if len(set(sizes)) < len(sizes):  # (a row twice)
        parser.error(f"--sizes takes each size once; got {args.sizes}")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    print(f"float32, torch {torch.__version__}, {threads} thread{'s' * (threads > 1)}, "
          f"best of {args.repeats}, ms")  # fmt: skip
    header = (f"{'n x d x K':>15} {'x·vᵀ torch':>11} {'library':>8} {'ratio':>6}"
              f" {'gᵀ·x torch':>11} {'library':>8} {'ratio':>6}   relative error")  # fmt: skip
    print(header)
    print("-" * len(header))
    gen = torch.Generator().manual_seed(0)
    rows = [measure(*size, gen, args.repeats) for size in sizes]
    return rows


if __name__ == "__main__":
    main()
