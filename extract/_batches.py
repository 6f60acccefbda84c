"""One batch of images through a backbone: JPEGs decoded on the device, the compute
precision, the embeddings, and rows whose features are not finite refused."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from ._backbones import device_failed
from ._decoding import aspect_window, check_pixel_limit, failure_reason, jpeg_size
from ._specs import Backbone


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
    # (float32 whatever torch's default dtype, which a transform's ToTensor takes: under
    # float64 these rows failed to join the decoded JPEGs' float32 in one batch)
    ready = None if decoded is None else decoded.to(device, torch.float32, non_blocking=True)
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


def _refuse_non_finite(features: np.ndarray, reasons: list, dtype: np.dtype) -> np.ndarray:
    """The features in the store's ``dtype``, the rows not finite there marked as failed
    (in ``reasons``) and zeroed: from the backbone, or once stored (float16 ends at 65504).
    A NaN or an infinity stored as done would reach every probe trained on the store. The
    rows are written as returned, so that the test sees the stored values: HDF5's own
    conversion takes 65504 < |x| < 65520 to inf, where NumPy's rounds it to 65504."""
    finite = np.isfinite(features).all(1)
    with np.errstate(over="ignore", invalid="ignore"):
        stored = features.astype(dtype)
    fits = np.isfinite(stored).all(1)
    for k in np.flatnonzero(~fits):
        if reasons[k] is None:
            reasons[k] = (
                "the backbone gave non-finite features (NaN or inf)"
                if not finite[k]
                else f"features beyond the range of the store's {np.dtype(dtype).name} "
                "(--dtype float32 keeps them)"
            )
    stored[~fits] = 0
    return stored
