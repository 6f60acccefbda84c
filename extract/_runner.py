"""The extraction loop: source -> DataLoader -> backbone -> HDF5 store, resumable and sharded.

A batch's way through the backbone is in ``_batches``; the DataLoader and its workers in
``_loading``; an existing store compared with the request, and opened to resume or created
anew, in ``_resume``; whether a store is reused as it is, and a shard seeded from the merged
store, in ``_reuse``; torchrun's ranks' group, what they tell each other and the merge on
rank 0, in ``_ranks``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from numbers import Integral
from pathlib import Path

import numpy as np
import torch
from PIL import ImageFile
from tqdm.auto import tqdm

from mr2_probe._device import resolve_device
from mr2_probe._h5 import _NAMED_FAILURES, name_failures

from ._backbones import create_backbone
from ._batches import _assemble, _embed, _refuse_non_finite
from ._images import ImageSource
from ._launcher import stops_with_launcher
from ._loading import _check_worker_sockets, _loader, started
from ._locks import store_lock
from ._merge import (
    check_merging,
    mark_superseded,
    shard_path,
)
from ._paths import plural
from ._ranks import (
    _CHECKING_SHARDS,
    _all_ranks_failures,
    _check_same_listing,
    _complete_on_every_rank,
    _distributed_env,
    _merge_on_rank0,
    _ranks_group,
    _ShardStep,
)
from ._reading import failed_rows
from ._resume import (
    _adopt_repaired_failures,
    _check_other_shard,
    _identity,
    _open_or_create,
    _provenance,
    _rebuilding,
    _refuse_other_rebuild,
    _repaired_failures,
    _replaces,
    _shards_explained,
    _shards_vouch,
    _takes_retries,
)
from ._reuse import (
    _by_index,
    _is_complete,
    _log_other_ranks_shards,
    _log_reused,
    _merged_elsewhere,
    _say_reused,
    _seed_from_merged,
    _touched_alone,
)
from ._schema import DONE, FAILED, MERGED_INTO, PENDING, StoreError
from ._sources import open_source
from ._specs import BackboneSpec
from ._store import (
    _no_permission,
    check_output,
    make_output_folder,
    open_store,
    output_target,
    write_rows,
)
from ._touched import hashed_once, share_hashing

logger = logging.getLogger(__name__)
_DTYPES = ("float16", "float32")


_DECODES = ("auto", "pil", "tensor")


def rank_rows(src: ImageSource, rank: int, world_size: int) -> np.ndarray:
    """The source rows rank ``rank`` of ``world_size`` extracts, in source order.

    Rows ``rank::world_size`` of a folder, list or Fashion-MNIST source; for shards and
    Parquet / Arrow files, every row of units (tar shards, row groups) ``rank::world_size``
    (as WebDataset's ``split_by_node`` divides shards), so that each rank reads whole
    shards and row groups. Merging puts the rows back in source order (``indices``).
    """
    if src.archive is None:
        return np.arange(rank, len(src), world_size)
    return np.flatnonzero(src.archive.unit % world_size == rank)


def _whole(value: object) -> bool:
    """Whether ``value`` is an integer, not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def extract_features(
    source: str | os.PathLike | ImageSource,
    backbone: str | BackboneSpec,
    out: str | os.PathLike,
    *,
    batch_size: int = 64,
    num_workers: int | None = None,
    dtype: str = "float32",
    normalize: bool = False,
    image_size: int | None = None,
    device: str | torch.device = "auto",
    decode: str = "auto",
    n_per_class: int | None = None,
    max_items: int | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    retry_failed: bool = False,
) -> Path:
    """Extract embeddings of every image of ``source`` into an HDF5 store at ``out``.

    Re-running the same call resumes an interrupted run and ends with the same datasets and
    attributes as an uninterrupted one; a complete store is reused (and says so in a log
    message). A store made with another backbone, weights or preprocessing, or from other
    image files (other root folder, other sizes or modification times), is refused with a
    :class:`ProvenanceError` that names each differing setting (and the first differing
    image); ``overwrite=True`` rebuilds it. Unreadable images, and images whose features
    are not finite, are recorded in the store as failed and skipped (``retry_failed=True``
    extracts them again); a warning names the first of them. Under torchrun an existing
    complete ``out`` of the same request is reused at any number of ranks, and one made
    differently is refused before any image is extracted.

    Parameters
    ----------
    source : path-like, str or ImageSource
        A class-per-folder directory, a ``path,label`` list file,
        ``"fashion-mnist:train"`` / ``"fashion-mnist:test[@ROOT]"``, WebDataset tar shards
        ``"webdataset:shards/{00000..00127}.tar"`` (:func:`webdataset_shards`), or Parquet /
        Arrow files ``"parquet:data/train-*.parquet"`` or a Hugging Face dataset folder
        ``"parquet:DIR"`` (:func:`parquet_files`).
    backbone : str or BackboneSpec
        A spec such as ``"open_clip:ViT-B-32@/ckpt/clip.pt"``, ``"timm:NAME@/ckpt.pth"``,
        ``"moco:/ckpt/moco_v2_800ep.pth.tar"`` or ``"effnet-lite0"``
        (see :func:`parse_backbone_spec`).
    out : path-like
        The HDF5 store. Under ``torchrun`` each rank writes
        ``<stem>.shard-RRRRR-of-WWWWW.h5`` and rank 0 merges them into ``out``.
    batch_size : int, default=64
        Images per forward pass; also the unit of resumption (keep it when resuming so
        that the stored features are bit-identical to an uninterrupted run's).
    num_workers : int, optional
        DataLoader worker processes reading and decoding images while the model runs.
        Default: ``min(8, cpu_count - 1)``, of the CPUs this process may run on. At most
        one worker a batch to load starts (of a resumed run, a batch of the rows left).
    dtype : {"float32", "float16"}, default="float32"
        Storage type of ``features``.
    normalize : bool, default=False
        L2-normalise each embedding (usual for CLIP cosine heads).
    image_size : int, optional
        Input resolution override (smaller is faster).
    device : str or torch.device, default="auto"
        ``"auto"``: the rank's GPU if present (bf16 autocast where native), else the CPU.
    decode : {"auto", "pil", "tensor"}, default="auto"
        ``"tensor"`` decodes JPEG files with ``torchvision.io.decode_jpeg`` on ``device``
        (nvJPEG on a GPU); ``"pil"`` decodes everything with PIL in the workers;
        ``"auto"`` picks ``"tensor"`` on CUDA and ``"pil"`` otherwise. Recorded in the
        store's preprocessing, since the two resize slightly differently.
    n_per_class, max_items : int, optional
        Keep the first ``n_per_class`` images of each class, then the first ``max_items``.
    image_key, label_key : str, optional
        WebDataset and Parquet sources: the member (``"jpg;png"``; label ``"cls"``,
        ``"txt"`` or a JSON path ``"json.label"``) or column (``"image"``, ``"label"``)
        holding the image and the label. Recorded in the store (``source_options``).
    rank, world_size : int, optional
        Write only shard ``rank`` of ``world_size`` and return its path (rows
        ``rank::world_size``; for tar shards and Parquet files, the rows of tar shards or
        row groups ``rank::world_size``, so that each rank reads whole shards); merge with
        :func:`merge_shards`. Default: read ``RANK`` / ``WORLD_SIZE`` set by ``torchrun``
        and merge automatically on rank 0.
    progress : bool, default=True
        Show a tqdm progress bar.
    overwrite : bool, default=False
        Delete an existing store at ``out`` (and this run's shards) and recompute it, instead
        of resuming or reusing it. Only stores and empty files are ever replaced.
    retry_failed : bool, default=False
        Extract again the images recorded as failed (after a transient read error, or with
        the image since repaired or replaced: a failed image may have changed when nothing
        else has, under torchrun too); without it a resumed or reused store keeps its
        failures.

    Returns
    -------
    pathlib.Path
        The store (the shard when ``rank`` / ``world_size`` are given).

    Raises
    ------
    StoreError
        If ``out`` cannot hold a store (checked before any model is loaded);
        ``ProvenanceError`` if it holds a store made differently; ``StoreLockedError`` if
        another process is writing it.
    ValueError
        For invalid arguments or backbone specs (``BackboneError``), and while
        ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is True (truncated images would be stored
        half grey instead of recorded as failed).

    Examples
    --------
    A folder of three images, one sub-folder per class, through the built-in backbone
    (its pretrained weights ship with the package):

    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> from extract import extract_features, load_features
    >>> root = Path(tempfile.mkdtemp())
    >>> for name in ("cat/1.png", "cat/2.png", "dog/1.png"):
    ...     (root / name).parent.mkdir(exist_ok=True)
    ...     Image.new("RGB", (32, 32), "white").save(root / name)
    >>> out = Path(tempfile.mkdtemp()) / "features.h5"
    >>> path = extract_features(root, "effnet-lite0", out, image_size=64, progress=False)
    >>> with load_features(path) as store:
    ...     store.features.shape, store.class_names, store.labels[:].tolist()
    ((3, 1280), ['cat', 'dog'], [0, 0, 1])

    Fashion-MNIST's test split (``apt-get install dataset-fashion-mnist``), 20 images
    of each class:

    >>> path = extract_features(  # doctest: +SKIP
    ...     "fashion-mnist:test", "effnet-lite0", "fmnist_test.h5", n_per_class=20, image_size=96
    ... )
    >>> load_features(path).features.shape  # doctest: +SKIP
    (200, 1280)
    """
    if not isinstance(dtype, str) or dtype not in _DTYPES:  # (np.dtype("float16") == its name)
        raise ValueError(f"The 'dtype' parameter must be one of {_DTYPES}. Got {dtype!r} instead.")
    if decode not in _DECODES:
        raise ValueError(
            f"The 'decode' parameter must be one of {_DECODES}. Got {decode!r} instead."
        )
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # PIL then decodes a truncated file without an error, its missing part grey: its
        # features were stored as a whole image's (the tensor path fails the same file).
        raise ValueError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True (set by this program or a library "
            "it imports): PIL would decode a truncated image with its missing part grey, and "
            "its features would be stored as a whole image's. Set it to False before "
            "extracting; truncated images are then recorded as failed and skipped."
        )
    # (an int: 2.5 failed once the store was created, or overwritten; True passed as 1)
    if not (_whole(batch_size) and batch_size >= 1):
        raise ValueError(
            f"The 'batch_size' parameter must be an int >= 1. Got {batch_size!r} instead."
        )
    # Checked here, not by the DataLoader: that is built after the store is (re)created,
    # and a bad value then would have cost an overwritten store.
    if num_workers is not None and not (_whole(num_workers) and num_workers >= 0):
        raise ValueError(
            f"The 'num_workers' parameter must be an int >= 0 or None. Got {num_workers!r} instead."
        )
    for name, value in (
        ("image_size", image_size), ("n_per_class", n_per_class), ("max_items", max_items)
    ):  # fmt: skip
        # (an int: 32.5 failed deep inside torch, True passed as 1)
        if value is not None and not (_whole(value) and value >= 1):
            raise ValueError(f"The '{name}' parameter must be an int >= 1. Got {value!r} instead.")
    # NumPy's integers as Python's: timm asserts an int image size, and the store's
    # provenance, written as JSON, holds the rank and the number of ranks.
    batch_size, num_workers, image_size = (
        None if value is None else int(value) for value in (batch_size, num_workers, image_size)
    )
    for name, value in (
        ("normalize", normalize), ("overwrite", overwrite), ("retry_failed", retry_failed),
        ("progress", progress),
    ):  # fmt: skip
        # ('no' was taken as true: overwrite="no" deleted the store)
        if not isinstance(value, bool | np.bool_):
            raise ValueError(
                f"The '{name}' parameter must be True or False. Got {value!r} instead."
            )
    explicit = rank is not None or world_size is not None
    if explicit:
        # (not ``or``: world_size=0 was taken as 1, and rank=False as 0)
        rank = 0 if rank is None else rank
        world_size = 1 if world_size is None else world_size
        for name, value in (("rank", rank), ("world_size", world_size)):
            if not _whole(value):  # (0.5 failed naming the shard, after the model loaded)
                raise ValueError(f"The '{name}' parameter must be an int. Got {value!r} instead.")
        rank, world_size = int(rank), int(world_size)
        if world_size < 1:
            raise ValueError(
                f"The 'world_size' parameter must be an int >= 1. Got {world_size!r} instead."
            )
    else:
        rank, world_size = _distributed_env()
    if not 0 <= rank < world_size:
        raise ValueError(
            f"The 'rank' parameter must be an int in [0, world_size). Got rank={rank} with "
            f"world_size={world_size} instead."
            if explicit
            else f"The RANK environment variable must be an int in [0, WORLD_SIZE). Got "
            f"RANK={rank} with WORLD_SIZE={world_size} instead."
            if "WORLD_SIZE" in os.environ
            # (RANK exported alone, e.g. from SLURM_PROCID: "WORLD_SIZE=1" named a value
            # nobody had set)
            else f"The RANK environment variable must be an int in [0, WORLD_SIZE). Got "
            f"RANK={rank} with WORLD_SIZE unset (1 process) instead; set WORLD_SIZE to the "
            "number of processes too (torchrun sets both), or unset RANK."
        )
    out = output_target(out)
    target = out if world_size == 1 else shard_path(out, rank, world_size)
    merged = out if target != out and not explicit else None
    if explicit and target != out and not overwrite and _merged_elsewhere(target, out):
        # Its rows went into a version of ``out`` written over since (images changed in
        # place, say): resumed, merge_shards would refuse it.
        logger.info("%s went into another version of %s; it is made anew.", target, out)
        overwrite = True
    # Every output is checked before any image is listed or model loaded, except under
    # torchrun a rank's shard where a merged store exists: that is checked once the merged
    # store is found incomplete, after the model is loaded (complete, it is reused even
    # where no shard could be written, as in a read-only folder).
    # (os.path.exists: False, not Path.exists's PermissionError, in a folder that cannot be
    # searched, which check_output refuses by name)
    reuse = merged is not None and os.path.exists(merged) and not overwrite
    for path in ([] if reuse else [target]) + ([merged] if merged and rank == 0 else []):
        check_output(path, overwrite)
    # (A store that exists may be complete, reused without a worker process: checked before
    # its workers start.)
    if overwrite or not (reuse or os.path.exists(target)):
        _check_worker_sockets(num_workers)
    if merged is not None and rank == 0 and not reuse:  # the merge's own file, found now
        check_merging(os.fspath(merged))  # (where out exists: once found incomplete)
    group = _ranks_group() if merged is not None else contextlib.nullcontext()
    with (
        stops_with_launcher(),
        group as store,
        hashed_once(),
        # (left however the run ends on this rank, before its group: its heartbeat stops)
        _ShardStep(merged, world_size, rank, store)
        if merged is not None
        else contextlib.nullcontext() as step,
    ):
        try:
            if step is not None:  # (the run's key in the store, agreed before any work)
                step.meet_first()
            done = _extract_shard(
                source, backbone, target, batch_size, num_workers, dtype, normalize,
                image_size, device, decode, n_per_class, max_items, (image_key, label_key),
                rank, world_size, progress, overwrite, retry_failed, merged, step,
            )  # fmt: skip
        except Exception as error:
            if step is not None:  # the other ranks stop at their next batch or exchange
                step.fail(error, rank)
            raise
        except BaseException as error:  # (a Ctrl-C, or the launcher gone, on this rank)
            if step is not None:  # the others stop too, not waiting for it at an exchange
                step.interrupt(error)
            raise
        if step is None:
            shard, _, _, failed = done
            _warn_of_failures(shard, *failed)
            return shard
        try:
            # Each rank's failures are its shard's: the user hears of them once, as the
            # merged store's (the store asked for).
            failed = _all_ranks_failures(None if done is None else done[3], step)
            if done is None:  # every rank found ``out`` complete: nothing to extract or merge
                return out
            _, repair_merged, rebuild, _ = done
            merged = _merge_on_rank0(
                out, rank, world_size, overwrite or rebuild, repair_merged, step
            )
        except Exception:  # (told where the ranks met: every rank raises its own)
            raise
        except BaseException as error:  # (a Ctrl-C at the merge: the others stop too)
            step.interrupt(error)
            raise
        if rank == 0:  # another number of ranks' interrupted run's shards
            by = "a forced rebuild" if overwrite or rebuild else f"a run at {world_size} ranks"
            mark_superseded(merged, world_size, by=by)
            _warn_of_failures(out, *failed)
        return merged


def _warn_of_failures(store: Path, n_failed: int, first: list[tuple[int, str, str]]) -> None:
    """Warn that this run recorded ``n_failed`` images of ``store`` as failed, naming the
    first ones (``(index, path, reason)``) with their reasons."""
    if not n_failed:
        return
    logger.warning(
        "%d %s recorded in %s as failed (unreadable, or with non-finite features) and "
        "skipped %s; the store's failure_reason says why for each.",
        n_failed,
        "image was" if n_failed == 1 else "images were",
        store,
        name_failures(n_failed, first),
    )


_SOURCE_LOGGERS = (
    "extract._image_folder",
    "extract._image_list",
    "extract._list_lines",
    "extract._labels",
    "extract._tar_shards",
    "extract._tables",
)


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Only errors from the loggers ``names`` while the block runs."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _extract_shard(
    source, spec, out, batch_size, num_workers, dtype, normalize, image_size, device, decode,
    n_per_class, max_items, keys, rank, world_size, progress, overwrite, retry_failed,
    merged=None, step=None,
) -> tuple[Path, Callable[[], None] | None, bool, tuple[int, list]] | None:  # fmt: skip
    """Extract rank ``rank``'s rows into ``out``: that path; under torchrun with
    ``retry_failed`` what takes the repaired failures into the merged store before the
    merge (None otherwise); whether the run resumes an interrupted forced rebuild,
    whose merge replaces the merged store; and the images this run recorded as failed
    (their number, and the first ones as ``(index, path, reason)``). None when
    ``merged`` is complete already. ``step``: under torchrun, where the ranks meet."""
    device = resolve_device(device)
    if device.type == "cuda":
        # The rank's GPU becomes the current one, so that nothing (pinned-memory threads
        # included) opens a context on GPU 0 from every rank.
        torch.cuda.set_device(device)
    # Under torchrun every rank lists the source; what listing it says (files left out,
    # classes without images, links skipped) is said once, by rank 0.
    with _quiet(_SOURCE_LOGGERS) if merged is not None and rank != 0 else contextlib.nullcontext():
        src = open_source(source, *keys)
    if n_per_class is not None or max_items is not None:
        src = src.subset(n_per_class, max_items)
    if len(src) == 0:
        raise ValueError(f"The image source {src.description!r} holds no images.")
    # Every item's identity hashed (2 s for ImageNet's 1.28 M files): once per run.
    fingerprint = src.fingerprint()
    if merged is not None:
        _check_same_listing(src, fingerprint, step)
    backbone = create_backbone(spec, image_size=image_size, device=device)
    if decode == "auto":
        decode = "tensor" if device.type == "cuda" else "pil"
    if decode == "tensor" and backbone.preprocess.get("mode") != "center":
        decode = "pil"  # only resize + centre-crop has a tensor twin
    rows = rank_rows(src, rank, world_size)
    shard = dict(n_rows=len(rows), n_total_rows=len(src), shard_rank=rank)
    shard["shard_world_size"] = world_size
    provenance = _provenance(backbone, src, fingerprint, dtype, normalize, decode, shard, device)
    repair_merged, vouched, rebuild, complete = None, False, False, False
    read_merged = merged is not None and merged.exists() and not overwrite
    everything = np.arange(len(src))
    # A forced rebuild of the merged store stopped before its merge: its shards are checked,
    # not the store.
    rebuild = read_merged and _rebuilding(merged, world_size)
    if merged is not None:  # (what a failure from here on tells the other ranks)
        step.doing = (
            f"to check the feature store {os.fspath(merged)!r}"
            if read_merged and not rebuild
            else _CHECKING_SHARDS.format(os.fspath(merged))
        )
    if read_merged:
        whole = dict(n_rows=len(src), n_total_rows=len(src), shard_rank=0, shard_world_size=1)
        whole = _provenance(backbone, src, fingerprint, dtype, normalize, decode, whole, device)
    if merged is not None and torch.distributed.is_initialized():
        # Each rank hashes its share of the files touched since, and takes every rank's
        # verdicts (every rank meets there, whatever it reads): of the stores checked next,
        # their failed images changed since hashed too where those checks compare them (a
        # retry with other settings, refused, names the first difference among them).
        if read_merged and not rebuild:
            stores = [(merged, everything)]
        else:  # (the shards to resume: a rebuild's, or before any merge those there are;
            # none for a forced run)
            stores = [] if overwrite else [
                (shard_path(merged, r, world_size), rank_rows(src, r, world_size))
                for r in range(world_size)
            ]  # fmt: skip
            if rebuild:
                identity = _identity(merged)
                stores = [(path, rows) for path, rows in stores if _replaces(path) == identity]
        asked = whole if read_merged and not rebuild else provenance
        retrying = functools.partial(_takes_retries, asked, retry_failed)
        share_hashing(stores, src, retrying, rank, world_size, step.exchange)
    if read_merged:
        # The merged store holds every row: it tells what changed (repaired failures, with
        # --retry-failed; files touched since, whose bytes it holds). A rebuild's shards
        # tell it instead (below): its touched files are not read for it.
        with open_store(merged, "r") as f:
            vouched = not rebuild and (
                _repaired_failures(f, whole, src, everything, False, retry_failed) is not None
            )
        if rebuild:
            # A forced rebuild of this store was stopped before its merge: it resumes from
            # its shards (each is checked against this request), and its merge replaces
            # the store, as the forced run's would have; so too where the store was made
            # as this request asks (a rebuild for images replaced in place, say), which
            # would otherwise be reused as complete.
            if rank == 0:
                logger.info(
                    "Resuming the interrupted rebuild of %s from its shards; the merge "
                    "replaces the store.",
                    merged,
                )
        else:
            _refuse_other_rebuild(merged, world_size)
            # A complete store of touched files alone in a folder that cannot be written
            # (no shard could be written there) is reused as it is, as by a run in one
            # process, its new times not recorded.
            kept = (
                vouched
                and not os.access(merged.parent, os.W_OK)
                and _touched_alone(merged, whole, src, everything, retry_failed)
            )
            if vouched and not kept:
                # rank 0 takes the repairs into it before the merge (a rebuild's merge
                # replaces it, and its version is what the rebuild's shards name)
                repair_merged = functools.partial(
                    _adopt_repaired_failures, merged, whole, src, everything, False, retry_failed
                )
            else:  # (said once every rank has found it so)
                # Whether it differs by touched files alone is known: ``vouched`` (kept: so
                # found; otherwise not, as a store that passes that check without
                # --retry-failed passes it with). Found again, with --retry-failed, every
                # rank read the touched failed images that a retry does not compare.
                complete = _is_complete(
                    merged, whole, src, everything, retry_failed, log=False, touched=vouched
                )
    elif merged is None and world_size == 1 and out.exists() and not overwrite:
        _refuse_other_rebuild(out, world_size)
    if merged is not None and _complete_on_every_rank(complete, merged, step):
        if rank == 0:
            _say_reused(merged, src, everything)
        return None
    if read_merged:
        check_merging(os.fspath(merged))  # before any image is extracted, on every rank
        if not rebuild and os.access(merged.parent, os.W_OK) and not os.access(merged, os.W_OK):
            # Its own mode (chmod 444) forbids writing it, which a run in one process is
            # refused for: the merge replaced it, after every rank's work. (Not a complete
            # store of touched files alone, which rank 0 keeps as it is at the merge, as a
            # run in one process reuses it.)
            if repair_merged is None or not _touched_alone(
                merged, whole, src, everything, retry_failed
            ):
                raise _no_permission(merged, "w")
    if merged is not None:
        step.doing = _CHECKING_SHARDS.format(os.fspath(merged))
    identity = _identity(merged) if merged is not None and merged.exists() else None
    if merged is not None and identity is None and not overwrite:
        # The merged store is gone (deleted) while a forced rebuild's shards lie here: they
        # name the version they replace, and the rebuild is resumed as where it is there.
        shards = [shard_path(merged, r, world_size) for r in range(world_size)]
        unmerged = [path for path in shards if _replaces(path, MERGED_INTO) is None]
        # (a finished rebuild's shards keep their mark, beside the version they went into)
        marks = sorted({mark for path in unmerged if (mark := _replaces(path))})
        if marks:
            rebuild, identity = True, marks[0]
            if rank == 0:
                logger.info("Resuming the interrupted rebuild of %s from its shards.", merged)
    # A shard that the interrupted rebuild did not write (a finished run's, or none): its
    # rank extracts its rows anew, marked as the rebuild's. Resumed, it held the rows of the
    # store to be replaced (images changed in place since were merged in as they were).
    fresh = rebuild and _replaces(out) != identity
    if merged is not None and (rebuild or not merged.exists()):
        # Repaired failures (and files touched since) are the shards' own to vouch for: a
        # rebuild's (the store it replaces may have held those images as done, or failed
        # ones the rebuild had not reached), or, before any merge, the run's.
        shards = {r: shard_path(merged, r, world_size) for r in range(world_size)}
        shards = {
            r: path
            for r, path in shards.items()
            if (_replaces(path) == identity if rebuild else path.exists())
        }
        vouched = _shards_vouch(
            shards, provenance, src, lambda r: rank_rows(src, r, world_size), retry_failed
        )
    if merged is not None and not overwrite:
        # Every rank checks the shards to be resumed against its request, not its own alone:
        # otherwise a rank making its shard anew overwrote it while another's check refused
        # the request (a resume with another --dtype, say), and the next resume refused it.
        # (A rebuild's shards are those that name it; others', those of no other version.)
        # Where the images differ, each names the first that does, whichever shard holds it.
        resumed = {
            r: path
            for r in range(world_size)
            if (path := shard_path(merged, r, world_size)).exists()
            and (_replaces(path) == identity if rebuild else not _merged_elsewhere(path, merged))
        }
        explain = functools.partial(
            _shards_explained,
            resumed,
            provenance,
            src,
            lambda r: rank_rows(src, r, world_size),
            retry_failed,
        )
        for path in resumed.values():
            if path != out:
                _check_other_shard(path, provenance, vouched, explain)
    if merged is not None:
        step.doing = step.making_shard(rank)
    if fresh and out.exists():
        logger.info(
            "%s was not written by the interrupted rebuild; its rows are extracted anew.", out
        )
    # A shard that went into another version of the merged store (one rebuilt otherwise
    # since, images changed in place included) is not resumed: made anew, from the rows of
    # the store as it is (a retry's, or a store left incomplete: one complete is reused).
    stale = read_merged and not rebuild and _merged_elsewhere(out, merged)
    if stale:
        logger.info(
            "%s went into another version of %s; it is made anew from the store's rows.",
            out,
            merged,
        )
    marked = overwrite or fresh  # a forced run's shard, or the resumed rebuild's anew
    overwrite = overwrite or fresh or stale
    if not (overwrite or vouched) and out.exists() and not os.access(out.parent, os.W_OK):
        # A folder that cannot be written (a read-only file system): a complete store in
        # it is read as it is, without the lock that would be written beside it.
        if _is_complete(out, provenance, src, rows, retry_failed, log=True):
            return out, repair_merged, rebuild, (0, [])
        raise StoreError(
            f"Cannot complete the feature store {os.fspath(out)!r}: no permission to write in "
            f"the folder {os.fspath(out.parent)!r}; write the store to a folder you can write to."
        )
    if read_merged:
        check_output(out, overwrite)  # deferred until the merged store was read
    make_output_folder(out)
    # A forced run under torchrun marks its shards with the store they are to replace.
    replaces = identity if marked else None
    with store_lock(out):
        # A retry whose shards were deleted after their merge: the new shard takes its rows
        # from the merged store, so that only the failed ones are extracted again; so does
        # a run resuming a store of this request left incomplete (a run in one process
        # killed), so that only its pending rows are extracted. (Not in a rebuild, whose
        # rows are to be replaced; one at another number of ranks has been refused above.)
        seed = read_merged and not rebuild and (stale or not out.exists())
        if overwrite and world_size == 1:
            # In one process a forced run writes ``out`` itself: an interrupted run's shards
            # (of any number of ranks) hold rows of what it rebuilds. Marked before it writes,
            # as it may be stopped and finished by a plain resume, which cannot tell it
            # forced; not before its source and model are found (a run refused for a
            # misspelt backbone had the shards made anew).
            mark_superseded(out)
        _open_or_create(
            out, provenance, backbone, src, rows, overwrite, retry_failed, vouched, replaces
        )
        if seed:
            _seed_from_merged(out, merged, rows, retry_failed)
        with open_store(out, "r") as f:
            status = f["status"][:]
            first_failed = failed_rows(f)
        failed = status == FAILED
        if retry_failed and failed.any():
            # Pending here only: the store keeps them failed until each is written again,
            # so that a retry stopped before then leaves them as a failed row (which a
            # repair and the next --retry-failed take), not as a row never extracted.
            status[failed] = PENDING
            n_failed = int(failed.sum())
            logger.info(
                "Extracting again the %d %s recorded as failed.",
                n_failed,
                plural(n_failed, "image"),
            )
        # The pending rows, batch_size at a time: a run stopped between batches resumes on
        # whole batches, batched as the first run was, and a retry reads its failed rows
        # alone (a row done before is never read, nor written, again).
        pending = rows[status == PENDING]
        blocks = [pending[lo : lo + batch_size] for lo in range(0, len(pending), batch_size)]
        if not blocks:  # a finished store is not opened for writing at all
            if len(status):
                _log_reused(out, status, first_failed)
            else:  # a rank with no rows (fewer shards, or items, than ranks)
                logger.info("%s holds no rows of the request: nothing to extract.", out)
            # Under torchrun its failures count in the merged store's warning, with the
            # other ranks' (a resumed run's count is the store's, all told).
            failures = (int((status == FAILED).sum()), _by_index(first_failed, rows))
            return out, repair_merged, rebuild, failures if merged is not None else (0, [])
        # (not in a forced run, or a rebuild's: at their number of ranks it would not resume
        # them either, but make them anew)
        if rank == 0 and (merged is not None or world_size == 1) and not (marked or rebuild):
            _log_other_ranks_shards(out if merged is None else merged, world_size)
        kept = int((status == FAILED).sum())  # failures recorded before, not retried
        if (status != PENDING).any():
            logger.info(
                "Resuming %s: %d of %d rows were done before%s.",
                out,
                int((status != PENDING).sum()),
                len(rows),
                f" ({kept} of them recorded as failed)" if kept else "",
            )
        # The worker processes start here, before the store is opened for writing, so that
        # none of them inherits the HDF5 file (and its lock) from the writer.
        _check_worker_sockets(num_workers)
        # (its workers' base seed is drawn there, from a CPU generator: under
        # torch.set_default_device("cuda") a tensor on the GPU that generator cannot fill)
        with torch.device("cpu"):
            batches = started(_loader(src, backbone, blocks, num_workers, decode, device))
        with open_store(out, "r+") as f:
            told = None if step is None else step.stop_if_told
            failed = _run(f, backbone, batches, rows, status, normalize, device, progress, told)
        if world_size == 1:  # completed (not reused: none marked where nothing is written)
            mark_superseded(out, 1, by="a run in one process")  # an interrupted torchrun's
        if kept:  # the warning counts the store's failures, the earlier runs' too
            with open_store(out, "r") as f:
                failed = (int((f["status"][:] == FAILED).sum()), _by_index(failed_rows(f), rows))
    return out, repair_merged, rebuild, failed


def _run(
    f, backbone, batches, rows, status, normalize, device, progress, told=None
) -> tuple[int, list[tuple[int, str, str]]]:
    """Extract the pending rows into the open store ``f``; the number of images recorded
    as failed, and the first ones as ``(index, path, reason)`` in source order.
    ``told``: called after each batch is written; it raises to stop the run there (under
    torchrun, :meth:`_ShardStep.stop_if_told`)."""
    bar = tqdm(total=len(status), initial=int((status != PENDING).sum()), disable=not progress)
    n_failed, first = 0, []
    with bar:
        for items, decoded, raw, reasons, digests in batches:
            x, reasons = _assemble(decoded, raw, reasons, backbone.preprocess, device)
            features = np.zeros((len(items), backbone.dim), np.float32)
            ok = [k for k, r in enumerate(reasons) if r is None]
            if x is not None:
                features[ok] = _embed(backbone, x, normalize)
                features = _refuse_non_finite(features, reasons, f["features"].dtype)
            codes = np.array([DONE if r is None else FAILED for r in reasons], np.uint8)
            n_failed += int((codes == FAILED).sum())
            positions = np.searchsorted(rows, items)
            write_rows(f, positions, features, codes, [r or "" for r in reasons], digests)
            bar.update(len(items))
            if told is not None:  # (another rank failed: this one stops, its rows kept)
                told()
            # The first in source order: blocks of tar shards and row groups come in
            # another order (worker_order).
            new = [
                (int(items[k]), int(positions[k]), reasons[k])
                for k in np.flatnonzero(codes == FAILED)
            ]
            first = sorted(first + new)[:_NAMED_FAILURES]
    return n_failed, [(i, f["paths"].asstr()[position], reason) for i, position, reason in first]
