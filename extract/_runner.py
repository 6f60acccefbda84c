"""The extraction loop: source -> DataLoader -> backbone -> HDF5 store, resumable and sharded."""

from __future__ import annotations

import json
import logging
import os
import warnings
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF
from tqdm.auto import tqdm

from mr2_probe._device import resolve_device

from ._backbones import Backbone, BackboneSpec, create_backbone
from ._images import ImageSource, ItemDataset, collate_items, open_source
from ._store import (
    DONE,
    FAILED,
    FORMAT_VERSION,
    PENDING,
    check_provenance,
    create_store,
    merge_shards,
    open_store,
    read_attrs,
    shard_path,
    store_lock,
    write_rows,
)

logger = logging.getLogger(__name__)
_DTYPES = ("float16", "float32")
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
    out = [
        TF.center_crop(TF.resize(img, pre["resize"], interpolation, antialias=True), pre["crop"])
        for img in images
    ]
    x = torch.stack(out).to(device, torch.float32).div_(255)  # (B, 3, H, W)
    return TF.normalize(x, pre["mean"], pre["std"])


def _decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | str]:
    """Decode JPEG bytes on ``device``; a bad file yields its failure reason, not an error."""
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision >= 0.29 flags its decoders as deprecated in favour of torchcodec; they
        # remain the GPU (nvJPEG) JPEG path here.
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        try:  # one batched call: nvJPEG decodes the whole batch at once on the GPU
            return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            pass
        decoded: list[torch.Tensor | str] = []
        for item in data:  # isolate the unreadable files
            try:
                decoded.append(decode_jpeg(item, mode=ImageReadMode.RGB, device=device))
            except RuntimeError as err:
                decoded.append(f"RuntimeError: {err}"[:200])
    return decoded


def _assemble(
    tensors: list, reasons: list[str | None], pre: dict, device: torch.device
) -> tuple[torch.Tensor | None, list[str | None]]:
    """Stack a batch's ready tensors and decode its raw JPEGs; returns (x, reasons)."""
    raw = [
        k
        for k, (t, r) in enumerate(zip(tensors, reasons, strict=True))
        if r is None and t.ndim == 1
    ]
    reasons = list(reasons)
    images = {}
    if raw:
        for k, img in zip(raw, _decode_jpegs([tensors[k] for k in raw], device), strict=True):
            if isinstance(img, str):
                reasons[k] = img
            else:
                images[k] = img
    ok = [k for k, r in enumerate(reasons) if r is None]
    if not ok:
        return None, reasons
    if images:
        decoded = _tensor_batch([images[k] for k in ok if k in images], pre, device)
        slots = iter(decoded)
        x = torch.stack([next(slots) if k in images else tensors[k].to(device) for k in ok])
    else:
        x = torch.stack([tensors[k] for k in ok]).to(device, non_blocking=True)
    return x, reasons


def _embed(backbone: Backbone, x: torch.Tensor, normalize: bool) -> np.ndarray:
    device = x.device
    if backbone.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with (
        torch.inference_mode(),
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"),
    ):
        z = backbone.model(x).float()  # (B, d)
        if normalize:
            z = F.normalize(z, dim=-1)
    return z.cpu().numpy()


def _provenance(
    backbone: Backbone, source: ImageSource, dtype: str, normalize: bool, decode: str, shard: dict
) -> dict:
    provenance = dict(
        format_version=FORMAT_VERSION,
        backbone=f"{backbone.spec.family}:{backbone.spec.model}",
        weights=backbone.weights_id,
        preprocessing=backbone.preprocess | {"decode": decode},
        dtype=dtype,
        normalize=bool(normalize),
        source_fingerprint=source.fingerprint(),
        **shard,
    )
    return json.loads(json.dumps(provenance))  # the form it takes after a trip through the file


def _open_or_create(out: Path, provenance: dict, backbone: Backbone, source, rows) -> None:
    if out.exists():
        with open_store(out, "r") as f:
            existing = read_attrs(f)
        check_provenance(out, existing, provenance)
        if existing.get("versions") != library_versions():
            logger.warning(
                "%s was started with other library versions: %s; now %s",
                out,
                existing.get("versions"),
                library_versions(),
            )
        return
    create_store(
        out,
        provenance=provenance,
        record=dict(
            versions=library_versions(),
            backbone_spec=str(backbone.spec),
            source=source.description,
            source_root=source.root,
        ),
        dim=backbone.dim,
        dtype=provenance["dtype"],
        labels=source.labels[rows],
        indices=source.source_index[rows],
        ids=[source.ids[i] for i in rows],
        class_names=source.class_names,
    )


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
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
) -> Path:
    """Extract embeddings of every image of ``source`` into an HDF5 store at ``out``.

    Re-running the same call resumes an interrupted run and ends with the same file as an
    uninterrupted one; a store made with another backbone, weights, preprocessing or image
    list is refused. Unreadable images are recorded in the store and skipped.

    Parameters
    ----------
    source : path-like, str or ImageSource
        A class-per-folder directory, a ``path,label`` list file, or
        ``"fashion-mnist:train"`` / ``"fashion-mnist:test[@ROOT]"``.
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
        ``"auto"``: the rank's GPU if present (bf16 autocast), else the CPU.
    decode : {"auto", "pil", "tensor"}, default="auto"
        ``"tensor"`` decodes JPEG files with ``torchvision.io.decode_jpeg`` on ``device``
        (nvJPEG on a GPU); ``"pil"`` decodes everything with PIL in the workers;
        ``"auto"`` picks ``"tensor"`` on CUDA and ``"pil"`` otherwise. Recorded in the
        store's preprocessing, since the two resize slightly differently.
    n_per_class, max_items : int, optional
        Keep the first ``n_per_class`` images of each class, then the first ``max_items``.
    rank, world_size : int, optional
        Write only shard ``rank`` of ``world_size`` (rows ``rank::world_size``) and return
        its path; merge the shards with :func:`merge_shards`. Default: read ``RANK`` /
        ``WORLD_SIZE`` set by ``torchrun`` and merge automatically on rank 0.
    progress : bool, default=True
        Show a tqdm progress bar.

    Returns
    -------
    pathlib.Path
        The store (the shard when ``rank`` / ``world_size`` are given).

    Examples
    --------
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
    explicit = rank is not None or world_size is not None
    if explicit:
        rank, world_size = rank or 0, world_size or 1
    else:
        rank, world_size = _distributed_env()
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size). Got rank={rank}, world_size={world_size}."
        )
    out = Path(out)
    if world_size == 1:
        return _extract_shard(
            source, backbone, out, batch_size, num_workers, dtype, normalize, image_size,
            device, decode, n_per_class, max_items, 0, 1, progress,
        )  # fmt: skip
    shard = _extract_shard(
        source, backbone, shard_path(out, rank, world_size), batch_size, num_workers, dtype,
        normalize, image_size, device, decode, n_per_class, max_items, rank, world_size, progress,
    )  # fmt: skip
    if explicit:
        return shard
    return _merge_on_rank0(out, rank, world_size)


def _merge_on_rank0(out: Path, rank: int, world_size: int) -> Path:
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        # gloo: the barriers carry no tensors, so no GPU is needed; the long timeout lets
        # fast ranks wait for slow ones at the end of an hours-long run.
        dist.init_process_group("gloo", timeout=timedelta(hours=24))
    dist.barrier()  # every shard is complete before rank 0 reads them
    if rank == 0:
        merge_shards([shard_path(out, r, world_size) for r in range(world_size)], out)
    dist.barrier()
    if owned:
        dist.destroy_process_group()
    return out


def _extract_shard(
    source, spec, out, batch_size, num_workers, dtype, normalize, image_size, device, decode,
    n_per_class, max_items, rank, world_size, progress,
) -> Path:  # fmt: skip
    device = resolve_device(device)
    if device.type == "cuda":
        # The rank's GPU becomes the current one, so that nothing (pinned-memory threads
        # included) opens a context on GPU 0 from every rank.
        torch.cuda.set_device(device)
    src = open_source(source)
    if n_per_class is not None or max_items is not None:
        src = src.subset(n_per_class, max_items)
    if len(src) == 0:
        raise ValueError(f"The image source {src.description!r} holds no images.")
    backbone = create_backbone(spec, image_size=image_size, device=device)
    if decode == "auto":
        decode = "tensor" if device.type == "cuda" else "pil"
    if decode == "tensor" and backbone.preprocess.get("mode") != "center":
        decode = "pil"  # only resize + centre-crop has a tensor twin
    rows = np.arange(rank, len(src), world_size)  # shard rows are source rows rank::world
    shard = dict(n_rows=len(rows), n_total_rows=len(src), shard_rank=rank)
    shard["shard_world_size"] = world_size
    provenance = _provenance(backbone, src, dtype, normalize, decode, shard)
    out.parent.mkdir(parents=True, exist_ok=True)
    with store_lock(out):
        _open_or_create(out, provenance, backbone, src, rows)
        with open_store(out, "r") as f:
            status = f["status"][:]
        # Fixed row blocks: a resumed run recomputes whole blocks, batched as the first was.
        blocks = [
            rows[lo : lo + batch_size]
            for lo in range(0, len(rows), batch_size)
            if (status[lo : lo + batch_size] == PENDING).any()
        ]
        if blocks:  # a finished store is not opened for writing at all
            with open_store(out, "r+") as f:
                _run(
                    f,
                    backbone,
                    src,
                    blocks,
                    status,
                    num_workers,
                    normalize,
                    decode,
                    device,
                    progress,
                )
    return out


def _run(f, backbone, src, blocks, status, num_workers, normalize, decode, device, progress):
    if num_workers is None:
        num_workers = min(8, max(0, (os.cpu_count() or 1) - 1))
    loader = torch.utils.data.DataLoader(
        ItemDataset(src, backbone.transform, jpeg_bytes=decode == "tensor"),
        batch_sampler=[b.tolist() for b in blocks],
        num_workers=num_workers,
        collate_fn=collate_items,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )
    rank, world_size = int(f.attrs["shard_rank"]), int(f.attrs["shard_world_size"])
    bar = tqdm(total=len(status), initial=int((status != PENDING).sum()), disable=not progress)
    n_failed = 0
    with bar:
        for items, tensors, reasons in loader:
            x, reasons = _assemble(tensors, reasons, backbone.preprocess, device)
            features = np.zeros((len(items), backbone.dim), np.float32)
            ok = [k for k, r in enumerate(reasons) if r is None]
            if x is not None:
                features[ok] = _embed(backbone, x, normalize)
            codes = np.array([DONE if r is None else FAILED for r in reasons], np.uint8)
            n_failed += int((codes == FAILED).sum())
            write_rows(
                f, (items[0] - rank) // world_size, features, codes, [r or "" for r in reasons]
            )
            bar.update(len(items))
    if n_failed:
        logger.warning(
            "%d unreadable images were recorded in %s and skipped.", n_failed, f.filename
        )
