"""The extraction loop: source -> DataLoader -> backbone -> HDF5 store, resumable and sharded."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF
from tqdm.auto import tqdm

from mr2_probe._device import resolve_device

from ._backbones import create_backbone, device_failed
from ._images import (
    MAX_ASPECT,
    NOT_A_FILE,
    ImageSource,
    ItemDataset,
    aspect_window,
    check_pixel_limit,
    collate_items,
    failure_reason,
    jpeg_size,
    open_source,
)
from ._locks import store_lock
from ._merge import check_merging, merge_shards, shard_path, shards_beside
from ._schema import (
    DONE,
    FAILED,
    FORMAT_VERSION,
    PENDING,
    PROVENANCE_DEFAULTS,
    PROVENANCE_KEYS,
    REPLACES,
    StoreError,
    read_attrs,
)
from ._specs import Backbone, BackboneSpec
from ._store import (
    check_output,
    check_provenance,
    create_store,
    make_output_folder,
    open_store,
    output_target,
    write_rows,
)

logger = logging.getLogger(__name__)
_DTYPES = ("float16", "float32")
# Set while --retry-failed takes repaired failures into a store (_adopt_repaired_failures).
_ADOPTING = "adopting_source_fingerprint"
# What a request sets beside its images (the images' own identities left out).
_SETTINGS = [k for k in PROVENANCE_KEYS if k != "source_fingerprint"]
_DECODES = ("auto", "pil", "tensor")
_VERSIONED = ("torch", "torchvision", "timm", "open_clip_torch", "h5py", "numpy", "pillow")


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the features."""
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def _tensor_batch(images: list[torch.Tensor], pre: dict, device: torch.device) -> torch.Tensor:
    """The backbone's resize / centre-crop / normalise applied to decoded uint8 tensors."""
    interpolation = TF.InterpolationMode(pre["interpolation"])
    out = []
    for img in images:
        window = aspect_window(img.shape[2], img.shape[1])  # (width, height)
        if window != (img.shape[2], img.shape[1]):
            img = TF.center_crop(img, [window[1], window[0]])
        resized = TF.resize(img, pre["resize"], interpolation, antialias=True)
        out.append(TF.center_crop(resized, pre["crop"]))
    x = torch.stack(out).to(device, torch.float32).div_(255)  # (B, 3, H, W)
    return TF.normalize(x, pre["mean"], pre["std"])


def _decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | str]:
    """Decode JPEG bytes on ``device``; a bad file yields its failure reason, not an error.

    Each file's frame header is checked against ``PIL.Image.MAX_IMAGE_PIXELS`` first: a
    header claiming a huge image would otherwise make the decoder allocate it.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    decoded: list[torch.Tensor | str | None] = [None] * len(data)
    for k, item in enumerate(data):
        try:
            check_pixel_limit(*jpeg_size(item.numpy()))
        except Exception as err:
            decoded[k] = failure_reason(err)
    todo = [k for k, d in enumerate(decoded) if d is None]
    if not todo:
        return decoded
    with warnings.catch_warnings():
        # torchvision >= 0.29 flags its decoders as deprecated in favour of torchcodec; they
        # remain the GPU (nvJPEG) JPEG path here.
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        try:  # one batched call: nvJPEG decodes the whole batch at once on the GPU
            images = decode_jpeg([data[k] for k in todo], mode=ImageReadMode.RGB, device=device)
            for k, image in zip(todo, images, strict=True):
                decoded[k] = image
            return decoded
        except RuntimeError as err:
            if device_failed(err) and "out of memory" not in str(err):  # one at a time then
                raise
        for k in todo:  # isolate the unreadable files
            try:
                decoded[k] = decode_jpeg(data[k], mode=ImageReadMode.RGB, device=device)
            except RuntimeError as err:
                if "out of memory" in str(err):  # the device's, not the file's: fail loudly
                    raise torch.OutOfMemoryError(str(err)) from err
                if device_failed(err):
                    raise
                # nvJPEG refuses valid files that libjpeg-turbo reads (CMYK, arithmetic
                # coding, some chroma subsamplings): a failure only if the CPU fails too.
                on_cpu = device.type == "cpu"
                decoded[k] = failure_reason(err) if on_cpu else _decode_on_cpu(data[k], device)
    return decoded


def _decode_on_cpu(data: torch.Tensor, device: torch.device) -> torch.Tensor | str:
    """A JPEG decoded on the CPU and moved to ``device``, or its failure reason."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        image = decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError as err:
        return failure_reason(err)
    return image.to(device)  # a failure here is the device's: raised, not recorded


def _assemble(
    decoded: torch.Tensor | None, raw: list, reasons: list[str | None], pre: dict, device
) -> tuple[torch.Tensor | None, list[str | None]]:
    """A batch's images on ``device``: those decoded by the loader (already stacked, and
    pinned for a GPU) and its raw JPEGs decoded here, in the batch's order; returns
    ``(x, reasons)``, a JPEG that fails to decode marked in ``reasons``."""
    reasons = list(reasons)
    ready = None if decoded is None else decoded.to(device, non_blocking=True)
    todo = [k for k, t in enumerate(raw) if t is not None]
    images = {}
    for k, img in zip(
        todo, _decode_jpegs([raw[k] for k in todo], device) if todo else [], strict=True
    ):
        if isinstance(img, str):
            reasons[k] = img
        else:
            images[k] = img
    if not images:
        return ready, reasons
    jpegs = _tensor_batch(list(images.values()), pre, device)
    if ready is None:
        return jpegs, reasons
    is_jpeg = [k in images for k, r in enumerate(reasons) if r is None]
    x = torch.empty((len(is_jpeg), *jpegs.shape[1:]), dtype=jpegs.dtype, device=device)
    x[[i for i, j in enumerate(is_jpeg) if not j]] = ready
    x[[i for i, j in enumerate(is_jpeg) if j]] = jpegs
    return x, reasons


@functools.cache  # asked once per batch; the answer is the device's
def compute_precision(device: torch.device) -> str:
    """How the backbone computes on ``device`` (recorded in the store's provenance, so that
    a run is never resumed in another precision): bfloat16 autocast on a GPU that computes
    in bfloat16 natively (Ampere and later; older ones only emulate it, slower than
    float32), else float32."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bfloat16 autocast"
    return "float32"


def _embed(backbone: Backbone, x: torch.Tensor, normalize: bool) -> np.ndarray:
    device = x.device
    if backbone.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    autocast = compute_precision(device) != "float32"
    with (
        torch.inference_mode(),
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast),
    ):
        z = backbone.model(x).float()  # (B, d)
        if normalize:
            z = F.normalize(z, dim=-1)
    return z.cpu().numpy()


def _refuse_non_finite(features: np.ndarray, reasons: list, dtype: np.dtype) -> None:
    """Mark as failed (in ``reasons``, and zeroed) the rows whose features are not finite,
    from the backbone or once stored in ``dtype`` (float16 ends at 65504): a NaN or an
    infinity stored as done would reach every probe trained on the store."""
    finite = np.isfinite(features).all(1)
    with np.errstate(over="ignore", invalid="ignore"):
        fits = np.isfinite(features.astype(dtype)).all(1)
    for k in np.flatnonzero(~fits):
        if reasons[k] is None:
            reasons[k] = (
                "the backbone gave non-finite features (NaN or inf)"
                if not finite[k]
                else f"features beyond the range of the store's {np.dtype(dtype).name} "
                "(--dtype float32 keeps them)"
            )
    features[~fits] = 0


def _provenance(
    backbone: Backbone,
    source: ImageSource,
    fingerprint: str,
    dtype: str,
    normalize: bool,
    decode: str,
    shard: dict,
    device: torch.device,
) -> dict:
    provenance = dict(
        format_version=FORMAT_VERSION,
        backbone=f"{backbone.spec.family}:{backbone.spec.model}",
        weights=backbone.weights_id,
        preprocessing=backbone.preprocess | {"decode": decode},
        compute=compute_precision(device),
        dtype=dtype,
        normalize=bool(normalize),
        source_root=source.resolved_root(),
        source_fingerprint=fingerprint,  # source.fingerprint(), computed once per run
        **shard,
    )
    if source.options:  # what is read from the containers (absent for other sources)
        provenance["source_options"] = source.options
    return json.loads(json.dumps(provenance))  # the form it takes after a trip through the file


def _when(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9).isoformat(sep=" ", timespec="microseconds")


def _file_difference(path: str, old: tuple[int, int], new: tuple[int, int]) -> str:
    (old_size, old_mtime), (new_size, new_mtime) = old, new
    if old_size == NOT_A_FILE:
        change = "it was missing when the store was made"
    elif new_size == NOT_A_FILE:
        change = "it is missing now"
    elif old_size != new_size:
        change = f"{new_size} bytes now, {old_size} when the store was made"
    else:
        change = f"modified {_when(new_mtime)}, {_when(old_mtime)} when the store was made"
    return f"{path!r} is not the file the store was made from ({change})"


def _file_list_difference(stored: dict, src: ImageSource) -> str | None:
    """Name the first container (or IDX) file that differs between a store and the request."""
    old, new = list(stored), list(src.files)
    for k in range(max(len(old), len(new))):
        if k >= len(new):
            return (
                f"the store was made from {len(old)} files, the request reads {len(new)}: "
                f"{os.path.join(src.root, old[k])!r} is not in the request"
            )
        if k >= len(old):
            return (
                f"the store was made from {len(old)} files, the request reads {len(new)}: "
                f"{os.path.join(src.root, new[k])!r} is new"
            )
        if old[k] != new[k]:
            return (
                f"file {k + 1} of the source is {old[k]!r} in the store, {new[k]!r} in the request"
            )
    return None


def _source_difference(
    f, src: ImageSource, rows: np.ndarray, retry_failed: bool = False
) -> str | None:
    """Name the first file or image that differs between a store and the request.

    In order: the list of files holding many items (IDX files, shards), the class names,
    each row's id, label and file identity, then the content identity of those files.
    With ``retry_failed``, a failed row whose file alone has changed is no difference (the
    retry takes it): the one named is what stops the retry.
    """
    stored_files = read_attrs(f).get("source_files") or {}
    listed = _file_list_difference(stored_files, src)
    if listed:
        return listed
    stored_names = list(f["class_names"].asstr()[:])
    if stored_names != list(src.class_names):
        return f"the classes are {stored_names} in the store, {list(src.class_names)} now"
    row = _row_difference(f, src, rows, stored_names, retry_failed) if "file_size" in f else None
    if row:
        return row
    for name, identity in src.files.items():
        if stored_files[name] != identity:
            return f"{os.path.join(src.root, name)!r} is not the file the store was made from"
    return None


def _row_difference(
    f, src: ImageSource, rows: np.ndarray, stored_names: list[str], retry_failed: bool = False
) -> str | None:
    stored_ids = f["paths"].asstr()[:]
    n = min(len(stored_ids), len(rows))
    head = rows[:n]
    sizes, mtimes = src.file_stats()
    ids = np.array([src.ids[i] for i in head], dtype=object)
    pairs = {
        "id": (stored_ids[:n], ids),
        "label": (f["labels"][:n], src.labels[head]),
        "size": (f["file_size"][:n], sizes[head]),
        "mtime": (f["file_mtime_ns"][:n], mtimes[head]),
        "index": (f["indices"][:n], src.source_index[head]),
    }
    differs = {key: np.asarray(old != new, dtype=bool) for key, (old, new) in pairs.items()}
    file_only = (differs["size"] | differs["mtime"]) & ~(
        differs["id"] | differs["label"] | differs["index"]
    )
    differs = np.logical_or.reduce(list(differs.values()))
    if retry_failed:  # a failed image replaced since: the retry extracts it again
        differs &= ~(file_only & (f["status"][:n] == FAILED))
    if not differs.any():
        if len(stored_ids) > len(rows):
            return (
                f"the store holds {len(stored_ids)} images, the request {len(rows)}: "
                f"{stored_ids[n]!r} and those after it are no longer requested"
            )
        if len(stored_ids) < len(rows):
            return (
                f"the store holds {len(stored_ids)} images, the request {len(rows)}: "
                f"{src.ids[rows[n]]!r} and those after it are new"
            )
        return None  # rows outside this shard differ: the fingerprint says so
    k = int(np.argmax(differs))
    if stored_ids[k] != ids[k]:
        return f"image {k} is {stored_ids[k]!r} in the store but {ids[k]!r} in the request"
    old_label, new_label = (int(pairs["label"][j][k]) for j in (0, 1))
    if old_label != new_label:
        return (
            f"{src.item_name(int(head[k]))!r} is labelled {src.class_names[new_label]!r} in the "
            f"request but {stored_names[old_label]!r} in the store"
        )
    old = (int(pairs["size"][0][k]), int(pairs["mtime"][0][k]))
    new = (int(sizes[head[k]]), int(mtimes[head[k]]))
    if old != new:
        return _file_difference(src.path(int(head[k])), old, new)
    old_index, new_index = (int(pairs["index"][j][k]) for j in (0, 1))
    return (
        f"{src.item_name(int(head[k]))!r} is item {new_index} of the source now, item "
        f"{old_index} when the store was made: images were added or removed before it"
    )


def _source_explained(f, provenance: dict, source, rows, retry_failed=False) -> str | None:
    """:func:`_source_difference`, and where the store differs only by failed images that
    have changed since, the option that takes them."""
    existing = read_attrs(f)
    if existing.get(_ADOPTING) == provenance["source_fingerprint"] and _same_settings(
        existing, provenance
    ):  # (a run with --retry-failed finishes it, unless something else differs)
        return (
            "a run with --retry-failed stopped while it took repaired failed images into the "
            "store: pass --retry-failed (retry_failed=True) again to finish it"
        )
    # A retry takes repaired failures only where nothing else differs (the settings).
    retrying = retry_failed and _same_settings(existing, provenance)
    difference = _source_difference(f, source, rows, retrying)
    if difference and _repaired_failures(f, provenance, source, rows) is not None:
        difference += (
            "; it failed in the store and has changed since: pass --retry-failed "
            "(retry_failed=True) to extract the changed failed images again"
        )
    return difference


def _same_settings(existing: dict, provenance: dict) -> bool:
    """Whether a store's attributes and a request agree on everything but the images: a
    request in another precision (bfloat16 against float32) is no repair of failures."""
    existing, provenance = PROVENANCE_DEFAULTS | existing, PROVENANCE_DEFAULTS | provenance
    return all(existing.get(k) == provenance.get(k) for k in _SETTINGS)


def _repaired_failures(f, provenance: dict, source, rows, vouched: bool = False) -> tuple | None:
    """Whether the store ``f`` differs from the request only by failed images that have
    changed since (repaired, replaced): then the stored file identities with the request's
    in place of theirs, ``(file_size, file_mtime_ns, n_changed)``; otherwise None, and any
    other difference is left to the provenance check, which refuses it.

    A shard holds some rows of the source, and its fingerprint covers the whole source: a
    shard whose own rows are unchanged cannot tell what changed in the others. It takes the
    request's fingerprint only when ``vouched``: under torchrun, when the merged store of
    the earlier run differs from the request only by repaired failures.
    """
    existing = read_attrs(f)
    if existing.get("source_fingerprint") == provenance["source_fingerprint"]:
        return None
    # An adoption of this very source, killed before it wrote the fingerprint: it had
    # found the store to differ by repaired failures alone; it is finished now.
    vouched = vouched or existing.get(_ADOPTING) == provenance["source_fingerprint"]
    if not _same_settings(existing, provenance) or "file_size" not in f:
        return None
    if (existing.get("source_files") or {}) != source.files:
        return None
    if list(f["class_names"].asstr()[:]) != list(source.class_names):
        return None
    ids = f["paths"].asstr()[:]
    if len(ids) != len(rows) or list(ids) != [source.ids[i] for i in rows]:
        return None
    if not np.array_equal(f["labels"][:], source.labels[rows]):
        return None
    # A subset (--per-class) keeps its images while others are added before them: their
    # positions in the source, which the store records, are then another difference.
    if not np.array_equal(f["indices"][:], source.source_index[rows]):
        return None
    sizes, mtimes = source.file_stats()
    stored_sizes, stored_mtimes = f["file_size"][:], f["file_mtime_ns"][:]
    changed = (stored_sizes != sizes[rows]) | (stored_mtimes != mtimes[rows])
    if not (f["status"][:][changed] == FAILED).all():
        return None
    if not changed.any() and not vouched:
        return None
    stored_sizes[changed], stored_mtimes[changed] = sizes[rows][changed], mtimes[rows][changed]
    return stored_sizes, stored_mtimes, int(changed.sum())


def _adopt_repaired_failures(
    out: Path, provenance: dict, source, rows, vouched: bool = False
) -> None:
    """Before a --retry-failed run: the failed images of ``out`` that have changed since
    (:func:`_repaired_failures`) are taken as the store's: their size and modification
    time, and the store's fingerprint, become the request's; their rows stay failed until
    they are extracted again."""
    with open_store(out, "r") as f:
        repaired = _repaired_failures(f, provenance, source, rows, vouched)
        attrs = read_attrs(f)
    if repaired is None:
        if attrs.get(_ADOPTING) == attrs.get("source_fingerprint") is not None:
            with open_store(out, "r+") as f:  # killed after the fingerprint, before this
                del f.attrs[_ADOPTING]
        return
    sizes, mtimes, n_changed = repaired
    with open_store(out, "r+") as f:
        # The files' identities, then the fingerprint that covers them; a run killed
        # between the two leaves the marker, by which the next one finishes the adoption.
        f.attrs[_ADOPTING] = provenance["source_fingerprint"]
        f.flush()
        f["file_size"][:], f["file_mtime_ns"][:] = sizes, mtimes
        f.flush()
        f.attrs["source_fingerprint"] = provenance["source_fingerprint"]
        f.flush()
        del f.attrs[_ADOPTING]
    if n_changed:
        logger.info("%d failed images have changed since; they are extracted again.", n_changed)


def _identity(path: Path) -> str:
    """A file's size and modification time: which version of a store a shard replaces."""
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _rebuilding(merged: Path, world_size: int | None) -> bool:
    """Whether shards of ``world_size`` ranks (of any number, if None) beside ``merged``
    are those of a forced rebuild of this very version of it, stopped before its merge
    (they say so: finished runs leave their shards too, and a store written since is not
    the one they replace)."""
    identity = _identity(merged)
    if world_size is None:
        paths = shards_beside(merged)
    else:
        paths = [shard_path(merged, r, world_size) for r in range(world_size)]
    for path in paths:
        if path.exists():
            # Without HDF5's lock: another rank may be writing its shard already, and a
            # reader's lock would refuse that writer, or the writer's this reader.
            try:
                with h5py.File(path, "r", locking=False) as f:
                    if f.attrs.get(REPLACES) == identity:
                        return True
            except OSError:  # not a store (its own rank says so when it opens it)
                continue
    return False


def _open_or_create(
    out: Path, provenance: dict, backbone: Backbone, source, rows, overwrite: bool,
    retry_failed: bool = False, vouched: bool = False, replaces: str | None = None,
) -> None:  # fmt: skip
    if out.exists() and not overwrite:
        if retry_failed:
            _adopt_repaired_failures(out, provenance, source, rows, vouched)
        with open_store(out, "r") as f:
            existing = read_attrs(f)
            check_provenance(
                out,
                existing,
                provenance,
                lambda: _source_explained(f, provenance, source, rows, retry_failed),
            )
        _warn_of_other_versions(out, existing.get("versions"))
        return
    sizes, mtimes = source.file_stats()
    create_store(  # replaces an existing store (overwrite) in one atomic rename
        out,
        provenance=provenance,
        record=dict(
            versions=library_versions(),
            backbone_spec=str(backbone.spec),
            source=source.description,
            source_files=source.files,
            **({REPLACES: replaces} if replaces else {}),
        ),
        dim=backbone.dim,
        dtype=provenance["dtype"],
        labels=source.labels[rows],
        indices=source.source_index[rows],
        ids=[source.ids[i] for i in rows],
        class_names=source.class_names,
        file_size=sizes[rows],
        file_mtime_ns=mtimes[rows],
    )


def _warn_of_other_versions(out: Path, versions) -> None:
    if versions != library_versions():
        logger.warning(
            "%s was started with other library versions: %s; now %s",
            out,
            versions,
            library_versions(),
        )


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


def _distributed_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


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

    Re-running the same call resumes an interrupted run and ends with the same file as an
    uninterrupted one; a complete store is reused (and says so in a log message). A store
    made with another backbone, weights or preprocessing, or from other image files (other
    root folder, other sizes or modification times), is refused with a
    :class:`ProvenanceError` that names each differing setting (and the first differing
    image); ``overwrite=True`` rebuilds it. Unreadable images, and images whose features
    are not finite, are recorded in the store as failed and skipped (``retry_failed=True``
    extracts them again). Under torchrun an existing complete ``out`` of the same request
    is reused at any number of ranks, and one made differently is refused before any image
    is extracted.

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
        that the file is bit-identical to an uninterrupted run).
    num_workers : int, optional
        DataLoader worker processes reading and decoding images while the model runs.
        Default: ``min(8, cpu_count - 1)``.
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
        For invalid arguments or backbone specs (``BackboneError``).

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
    if dtype not in _DTYPES:
        raise ValueError(f"The 'dtype' parameter must be one of {_DTYPES}. Got {dtype!r} instead.")
    if decode not in _DECODES:
        raise ValueError(f"The 'decode' parameter must be one of {_DECODES}. Got {decode!r}.")
    if batch_size < 1:
        raise ValueError(f"The 'batch_size' parameter must be >= 1. Got {batch_size!r} instead.")
    # Checked here, not by the DataLoader: that is built after the store is (re)created,
    # and a bad value then would have cost an overwritten store.
    if num_workers is not None and not (isinstance(num_workers, int) and num_workers >= 0):
        raise ValueError(
            f"The 'num_workers' parameter must be an int >= 0 or None. Got {num_workers!r} instead."
        )
    for name, value in (
        ("image_size", image_size), ("n_per_class", n_per_class), ("max_items", max_items)
    ):  # fmt: skip
        if value is not None and not value >= 1:
            raise ValueError(f"The '{name}' parameter must be >= 1. Got {value!r} instead.")
    explicit = rank is not None or world_size is not None
    if explicit:
        rank, world_size = rank or 0, world_size or 1
    else:
        rank, world_size = _distributed_env()
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size). Got rank={rank}, world_size={world_size}."
        )
    out = output_target(out)
    target = out if world_size == 1 else shard_path(out, rank, world_size)
    merged = out if target != out and not explicit else None
    # Every output is checked before any image is listed or model loaded, except under
    # torchrun a rank's shard where a merged store exists: that is checked once the merged
    # store is found incomplete, after the model is loaded (complete, it is reused even
    # where no shard could be written, as in a read-only folder).
    reuse = merged is not None and merged.exists() and not overwrite
    for path in ([] if reuse else [target]) + ([merged] if merged and rank == 0 else []):
        check_output(path, overwrite)
    if merged is not None and rank == 0 and not reuse:  # the merge's own file, found now
        check_merging(os.fspath(merged))
    with _ranks_group() if merged is not None else contextlib.nullcontext():
        done = _extract_shard(
            source, backbone, target, batch_size, num_workers, dtype, normalize, image_size,
            device, decode, n_per_class, max_items, (image_key, label_key), rank, world_size,
            progress, overwrite, retry_failed, merged,
        )  # fmt: skip
        if done is None:  # every rank found ``out`` complete: nothing to extract or merge
            return out
        shard, repair_merged, rebuild = done
        if world_size == 1 or explicit:
            return shard
        return _merge_on_rank0(out, rank, world_size, overwrite or rebuild, repair_merged)


# This process's runs under torchrun, each group's keys in torchrun's store its own: a
# group made again on the keys of one that was left read its addresses and failed (a
# script extracting two splits failed at the second).
_RUNS = itertools.count()


@contextlib.contextmanager
def _ranks_group() -> Iterator[None]:
    """torchrun's ranks in one process group for the run, left after it (unless the
    caller has joined one already, which is used as it is)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    # gloo: what is exchanged is small and on the host, so no GPU is needed; the long
    # timeout lets fast ranks wait for slow ones at the end of an hours-long run.
    timeout = timedelta(hours=24)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"mr2-extract/{next(_RUNS)}", store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _check_same_listing(src: ImageSource, fingerprint: str, world_size: int) -> None:
    """Refuse to start when the ranks of a torchrun group listed the source differently
    (files added, removed or changed while they started): their shards would not merge,
    which the merge finds only after every rank's extraction."""
    import torch.distributed as dist

    if not dist.is_initialized():  # ranks run one by one (rank= and world_size= given)
        return
    listings: list = [None] * world_size
    dist.all_gather_object(listings, (len(src), fingerprint))
    other = next((r for r, listing in enumerate(listings) if listing != listings[0]), None)
    if other is not None:
        (first, _), (theirs, _) = listings[0], listings[other]
        what = (
            f"rank 0 found {first} images, rank {other} {theirs}"
            if first != theirs
            else f"ranks 0 and {other} found other files"
        )
        raise StoreError(
            f"The ranks listed the image source {src.description!r} differently ({what}): "
            "it changed while they started. Run again once it no longer changes."
        )


def _merge_on_rank0(
    out: Path, rank: int, world_size: int, overwrite: bool, repair_merged=None
) -> Path:
    import torch.distributed as dist

    dist.barrier()  # every shard is complete before rank 0 reads them
    if rank == 0:
        if repair_merged is not None:  # no rank reads ``out`` any more
            repair_merged()
        merge_shards([shard_path(out, r, world_size) for r in range(world_size)], out, overwrite)
    dist.barrier()
    return out


def _extract_shard(
    source, spec, out, batch_size, num_workers, dtype, normalize, image_size, device, decode,
    n_per_class, max_items, keys, rank, world_size, progress, overwrite, retry_failed,
    merged=None,
) -> tuple[Path, Callable[[], None] | None, bool] | None:  # fmt: skip
    """Extract rank ``rank``'s rows into ``out``: that path; under torchrun with
    ``retry_failed`` what takes the repaired failures into the merged store before the
    merge (None otherwise); and whether the run resumes an interrupted forced rebuild,
    whose merge replaces the merged store. None when ``merged`` is complete already."""
    device = resolve_device(device)
    if device.type == "cuda":
        # The rank's GPU becomes the current one, so that nothing (pinned-memory threads
        # included) opens a context on GPU 0 from every rank.
        torch.cuda.set_device(device)
    src = open_source(source, *keys)
    if n_per_class is not None or max_items is not None:
        src = src.subset(n_per_class, max_items)
    if len(src) == 0:
        raise ValueError(f"The image source {src.description!r} holds no images.")
    # Every item's identity hashed (2 s for ImageNet's 1.28 M files): once per run.
    fingerprint = src.fingerprint()
    if merged is not None:
        _check_same_listing(src, fingerprint, world_size)
    backbone = create_backbone(spec, image_size=image_size, device=device)
    if decode == "auto":
        decode = "tensor" if device.type == "cuda" else "pil"
    if decode == "tensor" and backbone.preprocess.get("mode") != "center":
        decode = "pil"  # only resize + centre-crop has a tensor twin
    rows = rank_rows(src, rank, world_size)
    shard = dict(n_rows=len(rows), n_total_rows=len(src), shard_rank=rank)
    shard["shard_world_size"] = world_size
    provenance = _provenance(backbone, src, fingerprint, dtype, normalize, decode, shard, device)
    repair_merged, vouched, rebuild = None, False, False
    read_merged = merged is not None and merged.exists() and not overwrite
    if read_merged:
        whole = dict(n_rows=len(src), n_total_rows=len(src), shard_rank=0, shard_world_size=1)
        whole = _provenance(backbone, src, fingerprint, dtype, normalize, decode, whole, device)
        everything = np.arange(len(src))
        if retry_failed:  # the merged store holds every row: it tells what changed
            with open_store(merged, "r") as f:
                vouched = _repaired_failures(f, whole, src, everything) is not None
        if vouched:  # rank 0 takes the repairs into it before the merge
            repair_merged = functools.partial(
                _adopt_repaired_failures, merged, whole, src, everything
            )
        elif _rebuilding(merged, world_size):
            # A forced rebuild of this store was stopped before its merge: it resumes from
            # its shards (each is checked against this request), and its merge replaces
            # the store, as the forced run's would have; so too where the store was made
            # as this request asks (a rebuild for images replaced in place, say), which
            # would otherwise be reused as complete.
            rebuild = True
            if rank == 0:
                logger.info(
                    "Resuming the interrupted rebuild of %s from its shards; the merge "
                    "replaces the store.",
                    merged,
                )
        elif _is_complete(merged, whole, src, everything, retry_failed, log=rank == 0):
            return None
    if not (overwrite or vouched) and out.exists() and not os.access(out.parent, os.W_OK):
        # A folder that cannot be written (a read-only file system): a complete store in
        # it is read as it is, without the lock that would be written beside it.
        if _is_complete(out, provenance, src, rows, retry_failed, log=True):
            return out, repair_merged, rebuild
        raise StoreError(
            f"Cannot complete the feature store {os.fspath(out)!r}: no permission to write in "
            f"the folder {os.fspath(out.parent)!r}; write the store to a folder you can write to."
        )
    if read_merged:
        check_output(out, overwrite)  # deferred until the merged store was read
    make_output_folder(out)
    # A forced run under torchrun marks its shards with the store they are to replace.
    replaces = _identity(merged) if merged is not None and overwrite and merged.exists() else None
    with store_lock(out):
        # A retry whose shards were deleted after their merge: the new shard takes its rows
        # from the merged store, so that only the failed ones are extracted again.
        # Not while a forced rebuild of it at another number of ranks is unfinished: its
        # rows are to be replaced.
        seed = read_merged and retry_failed and not rebuild and not out.exists()
        seed = seed and not _rebuilding(merged, None)
        _open_or_create(
            out, provenance, backbone, src, rows, overwrite, retry_failed, vouched, replaces
        )
        if seed:
            _seed_from_merged(out, merged, rows)
        with open_store(out, "r") as f:
            status = f["status"][:]
        failed = status == FAILED
        if retry_failed and failed.any():
            status[failed] = PENDING
            with open_store(out, "r+") as f:
                f["status"][:] = status
            logger.info("Extracting again the %d images recorded as failed.", int(failed.sum()))
        # The pending rows, batch_size at a time: a run stopped between batches resumes on
        # whole batches, batched as the first run was, and a retry reads its failed rows
        # alone (a row done before is never read, nor written, again).
        pending = rows[status == PENDING]
        blocks = [pending[lo : lo + batch_size] for lo in range(0, len(pending), batch_size)]
        if not blocks:  # a finished store is not opened for writing at all
            if len(status):
                _log_reused(out, status)
            else:  # a rank with no rows (fewer shards, or items, than ranks)
                logger.info("%s holds no rows of the request: nothing to extract.", out)
            return out, repair_merged, rebuild
        if (status != PENDING).any():
            logger.info(
                "Resuming %s: %d of %d rows were extracted before.",
                out,
                int((status != PENDING).sum()),
                len(rows),
            )
        # The worker processes start here, before the store is opened for writing, so that
        # none of them inherits the HDF5 file (and its lock) from the writer.
        batches = iter(_loader(src, backbone, blocks, num_workers, decode, device))
        with open_store(out, "r+") as f:
            _run(f, backbone, batches, rows, status, normalize, device, progress)
    return out, repair_merged, rebuild


# Rows of a shard seeded from the merged store at a time (with W ranks a block spans about
# W times as many rows of the merged store, read whole and picked from).
_SEED_BLOCK = 4096


def _seed_from_merged(shard: Path, merged: Path, rows: np.ndarray) -> None:
    """Copy the merged store's rows ``rows`` (their features, status, failure reasons and
    digests) into the shard just created for them. The merged store matched the request
    (its failed images aside, which the retry extracts again), so its done rows are this
    shard's; a copy stopped part way leaves the rest pending, extracted by the next run."""
    names = ("features", "failure_reason", "content_sha256", "status")
    with open_store(merged, "r") as src, open_store(shard, "r+") as dst:
        # Its rows were computed with the merged store's libraries, which it records.
        versions = read_attrs(src).get("versions")
        if "versions" in src.attrs:
            dst.attrs["versions"] = src.attrs["versions"]
        _warn_of_other_versions(shard, versions)
        for lo in range(0, len(rows), _SEED_BLOCK):
            block = rows[lo : lo + _SEED_BLOCK]
            span = slice(int(block[0]), int(block[-1]) + 1)  # rows increase in a shard
            for name in names:  # status last: a row counts as done once all is there
                dst[name][lo : lo + len(block)] = src[name][span][block - span.start]
    logger.info("%s takes %d rows from %s; its failed images are extracted again.",
                shard, len(rows), merged)  # fmt: skip


def _is_complete(
    store: Path, provenance: dict, src, rows: np.ndarray, retry_failed: bool, log: bool
) -> bool:
    """Whether ``store`` already holds the whole request (then it is reused as it is);
    a store made differently is refused here, before any GPU work. Under torchrun every
    rank reads the merged store before any writes it, so they all decide alike."""
    with open_store(store, "r") as f:
        check_provenance(
            store,
            read_attrs(f),
            provenance,
            lambda: _source_explained(f, provenance, src, rows, retry_failed),
        )
        status = f["status"][:]
    if (status == PENDING).any() or retry_failed and (status == FAILED).any():
        return False
    if log:
        _log_reused(store, status)
    return True


def _log_reused(path: Path, status: np.ndarray) -> None:
    n_failed = int((status == FAILED).sum())
    logger.info(
        "Reused the complete feature store %s (%d rows, nothing to compute%s); pass --force "
        "(overwrite=True) to recompute it.",
        path,
        len(status),
        f"; {n_failed} recorded as failed, which --retry-failed (retry_failed=True) extracts again"
        if n_failed
        else "",
    )


def worker_order(blocks: list[np.ndarray], units: np.ndarray, n_workers: int) -> list:
    """``blocks`` reordered so that, dealt round-robin to ``n_workers`` as a DataLoader
    deals its batches (block i to worker i mod n), each worker gets whole units (Parquet
    row groups, tar shards) where the balance allows.

    A worker streams a row group forward from its start: with blocks dealt in source order
    every worker streamed every row group past the others' blocks, reading the data up to
    n times. Units go, largest share first, to the worker with the fewest blocks; only the
    blocks that even the workers' counts out move, from the end of one list to another (a
    unit larger than a worker's share is split, each part read by one worker). Each
    worker's blocks stay in source order. Writes are addressed by row, so the order changes
    nothing in the store.
    """
    if n_workers < 2 or len(blocks) <= 1:
        return blocks
    groups: dict[int, list] = {}
    for block in blocks:  # a block spanning two units goes with its first row's
        groups.setdefault(int(units[block[0]]), []).append(block)
    lists: list[list] = [[] for _ in range(n_workers)]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(lists, key=len).extend(group)
    quota = [len(chunk) for chunk in np.array_split(np.arange(len(blocks)), n_workers)]
    lists.sort(key=len, reverse=True)
    spare = [block for lst, q in zip(lists, quota, strict=True) for block in lst[q:]]
    for lst, q in zip(lists, quota, strict=True):
        del lst[q:]
        while len(lst) < q:
            lst.append(spare.pop())
        # In source order within a worker: its cursor only goes forward, and a block
        # behind it re-streams the row group from its start.
        lst.sort(key=lambda block: int(block[0]))
    return [lists[i % n_workers][i // n_workers] for i in range(len(blocks))]


def _loader(src, backbone, blocks, num_workers, decode, device) -> torch.utils.data.DataLoader:
    if num_workers is None:
        num_workers = min(8, max(0, (os.cpu_count() or 1) - 1))
    if src.archive is not None:
        blocks = worker_order(blocks, src.archive.unit, num_workers)
    return torch.utils.data.DataLoader(
        ItemDataset(
            src,
            backbone.transform,
            jpeg_bytes=decode == "tensor",
            max_aspect=backbone.preprocess.get("max_aspect", MAX_ASPECT),
        ),
        batch_sampler=[b.tolist() for b in blocks],
        num_workers=num_workers,
        collate_fn=collate_items,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )


def _run(f, backbone, batches, rows, status, normalize, device, progress) -> None:
    bar = tqdm(total=len(status), initial=int((status != PENDING).sum()), disable=not progress)
    n_failed = 0
    with bar:
        for items, decoded, raw, reasons, digests in batches:
            x, reasons = _assemble(decoded, raw, reasons, backbone.preprocess, device)
            features = np.zeros((len(items), backbone.dim), np.float32)
            ok = [k for k, r in enumerate(reasons) if r is None]
            if x is not None:
                features[ok] = _embed(backbone, x, normalize)
                _refuse_non_finite(features, reasons, f["features"].dtype)
            codes = np.array([DONE if r is None else FAILED for r in reasons], np.uint8)
            n_failed += int((codes == FAILED).sum())
            positions = np.searchsorted(rows, items)
            write_rows(f, positions, features, codes, [r or "" for r in reasons], digests)
            bar.update(len(items))
    if n_failed:
        logger.warning(
            "%d %s recorded in %s as failed (unreadable, or with non-finite "
            "features) and skipped; the store's failure_reason says why for each.",
            n_failed,
            "image was" if n_failed == 1 else "images were",
            f.filename,
        )
