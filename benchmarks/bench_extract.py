"""Images per second of ``extract_features`` (images -> HDF5 store) against two peers.

The same generated JPEG files are read from three sources: a class-per-folder tree,
WebDataset tar shards (written with ``webdataset.ShardWriter``, 8 shards) and a Parquet
file laid out as Hugging Face ``datasets`` writes it (an ``image`` struct column, row groups
of 100 rows). Peers, in the same run:

* bare forward: the backbone on ready tensors in memory (the ceiling: no I/O, no decoding);
* PIL + DataLoader: ``torchvision.datasets.ImageFolder`` with the backbone's transform,
  a ``DataLoader`` and the forward pass, features kept in a list (the usual hand-written loop).

Runs on the CPU with a small random-weight backbone by default, on the GPU when present::

    python benchmarks/bench_extract.py
    python benchmarks/bench_extract.py --backbone effnet-lite0 --image-size 224 --n-images 2048
    python benchmarks/bench_extract.py --sources folder,parquet     # some of the sources
    python benchmarks/bench_extract.py --json runs/bench_extract.json   # the table as JSON too
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchvision.datasets import ImageFolder

sys.path.insert(0, str(Path(__file__).parent))
from bench_fit import check_output, write_whole  # noqa: E402

from extract import BackboneError, create_backbone, extract_features  # noqa: E402
from extract._batches import compute_precision  # noqa: E402
from extract._testing import make_image_folder, write_parquet, write_webdataset  # noqa: E402
from mr2_probe._device import resolve_device  # noqa: E402

SOURCES = ("folder", "webdataset", "parquet")


def _forward(backbone, x: torch.Tensor) -> torch.Tensor:
    """The forward pass in extract's own precision (bfloat16 autocast only where the GPU
    computes in it natively)."""
    if backbone.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    bf16 = compute_precision(x.device) == "bfloat16 autocast"
    with torch.inference_mode(), torch.autocast(x.device.type, torch.bfloat16, enabled=bf16):
        return backbone.model(x).float().cpu()


def bare_forward(args, device: torch.device) -> float:
    """Images per second of the forward pass alone on in-memory tensors. Like the other
    pipelines, it pays in its time for building the backbone and for its first batch."""
    start = time.perf_counter()
    backbone = create_backbone(args.backbone, image_size=args.image_size, device=device)
    x = torch.randn(args.batch_size, 3, *backbone.preprocess["crop"], device=device)
    for lo in range(0, args.n_images, args.batch_size):  # the last batch as short as theirs
        _forward(backbone, x[: min(args.batch_size, args.n_images - lo)])
    return args.n_images / (time.perf_counter() - start)


def pil_dataloader(args, device: torch.device, root: Path) -> float:
    """Images per second of ImageFolder + DataLoader + forward, features kept in memory."""
    start = time.perf_counter()
    backbone = create_backbone(args.backbone, image_size=args.image_size, device=device)
    loader = torch.utils.data.DataLoader(
        ImageFolder(root, transform=backbone.transform),
        batch_size=args.batch_size,
        num_workers=args.workers,
    )
    features = [_forward(backbone, x.to(device)) for x, _ in loader]
    assert sum(len(f) for f in features) == args.n_images
    return args.n_images / (time.perf_counter() - start)


def write_sources(root: Path, n_images: int, sources: list[str]) -> dict[str, str]:
    """The images of the folder ``root`` as each of ``sources`` that ``extract_features``
    reads (only those: writing shards takes the ``webdataset`` package)."""
    shards, parquet = root.parent / "shards", root.parent / "parquet"
    if "webdataset" in sources:
        write_webdataset(root, shards / "%05d.tar", maxcount=max(1, -(-n_images // 8)))
    if "parquet" in sources:
        write_parquet(root, parquet / "train-00000-of-00001.parquet", 100)
    paths = {
        "folder": str(root),
        "webdataset": f"webdataset:{shards}/*.tar",
        "parquet": f"parquet:{parquet}",
    }
    return {name: paths[name] for name in sources}


def extract_store(args, device: torch.device, source: str, out: Path) -> float:
    """Images per second of extract_features, source to a finished HDF5 store."""
    start = time.perf_counter()
    extract_features(
        source,
        args.backbone,
        out,
        batch_size=args.batch_size,
        num_workers=args.workers,
        image_size=args.image_size,
        device=device,
        progress=False,
    )
    return args.n_images / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backbone",
        default="timm:resnet18@random",
        help="backbone spec (random weights: no download)",
    )
    parser.add_argument("--image-size", type=int, default=96, help="model input resolution")
    parser.add_argument("--source-size", type=int, default=160, help="generated JPEG size")
    parser.add_argument(
        "--n-images",
        type=int,
        default=256,
        help="images in 4 classes (rounded down to a multiple of 4)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--sources",
        default=",".join(SOURCES),
        help=f"comma-separated sources extract_features reads (default: {','.join(SOURCES)})",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # (an OSError after the run)
    if args.n_images < 4:
        parser.error(f"--n-images must be at least 4 (one image per class); got {args.n_images}")
    # (--image-size 0: create_backbone's ValueError, --source-size 0: PIL's, once written)
    for option in ("--repeats", "--batch-size", "--image-size", "--source-size"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value < 1:
            parser.error(f"{option} must be at least 1; got {value}")
    if args.workers < 0:
        parser.error(f"--workers must be at least 0; got {args.workers}")
    try:
        resolve_device(args.device)
    except (ValueError, RuntimeError) as error:
        parser.error(f"--device: {error}")
    sources = args.sources.split(",")
    if not sources or set(sources) - set(SOURCES):
        parser.error(f"--sources takes some of {','.join(SOURCES)}; got {args.sources!r}")
    if len(set(sources)) < len(sources):  # (run once, listed twice in --json)
        parser.error(f"--sources takes each source once; got {args.sources!r}")
    if "webdataset" in sources and importlib.util.find_spec("webdataset") is None:
        print("bench_extract: the webdataset package (which writes the shards) is not "
              "installed: the webdataset source is skipped")  # fmt: skip
        sources.remove("webdataset")
    device = resolve_device(args.device)
    # One untimed batch first: the process's one-time costs (a CUDA context, lazy
    # initialisation) were billed to the first pipeline, the baseline. Before the images are
    # written: a --backbone that names no model ended in a BackboneError once they were.
    try:
        bare_forward(argparse.Namespace(**{**vars(args), "n_images": args.batch_size}), device)
    except BackboneError as error:
        parser.error(f"--backbone: {error}")
    with tempfile.TemporaryDirectory() as tmp:
        per_class = args.n_images // 4
        args.n_images = 4 * per_class
        root = make_image_folder(
            Path(tmp) / "images",
            classes=("a", "b", "c", "d"),
            n_per_class=per_class,
            size=args.source_size,
            special=False,
        )
        paths = write_sources(root, args.n_images, sources)
        runs = {
            "bare forward (tensors in memory)": lambda k: bare_forward(args, device),
            "PIL + DataLoader + forward": lambda k: pil_dataloader(args, device, root),
        }
        for name in sources:
            runs[f"extract_features ({name} -> HDF5)"] = lambda k, name=name: extract_store(
                args, device, paths[name], Path(tmp) / f"{name}{k}.h5"
            )
        # Interleaved repeats, best kept: shared machines make single timings noisy.
        rates = dict.fromkeys(runs, 0.0)
        for k in range(args.repeats):
            for name, run in runs.items():
                rates[name] = max(rates[name], run(k))
    base, peer = rates["bare forward (tensors in memory)"], rates["PIL + DataLoader + forward"]
    print(
        f"\n{args.backbone} @ {args.image_size}px, {args.n_images} JPEGs of {args.source_size}px, "
        f"batch {args.batch_size}, {args.workers} workers, device {device}"
    )
    print(f"{'pipeline':<38} {'images/s':>10} {'vs forward':>11} {'vs PIL loop':>12}")
    for name, rate in rates.items():
        print(f"{name:<38} {rate:>10.1f} {rate / base:>11.2f} {rate / peer:>12.2f}")
    if args.json is not None:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        rows = [
            {
                "pipeline": name,
                "images_per_s": rate,
                "vs_forward": rate / base,
                "vs_pil_loop": rate / peer,
            }
            for name, rate in rates.items()
        ]
        result = {"config": config, "device": str(device), "sources": sources, "rows": rows}
        write_whole(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
