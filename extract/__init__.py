"""Feature extraction: images + a frozen backbone -> an HDF5 store of embeddings.

The stage behind ``mr2-extract`` (``python -m extract``). Install with the ``extract``
extra (h5py, timm, open_clip_torch, torchvision, pillow, webdataset, pyarrow).

>>> from extract import extract_features, load_features  # doctest: +SKIP
>>> path = extract_features("photos/", "open_clip:ViT-B-32@/ckpt/clip.pt", "photos.h5")
>>> store = load_features(path)
"""

from ._backbones import (
    Backbone,
    BackboneError,
    BackboneSpec,
    WeightsUnavailableError,
    create_backbone,
    file_sha256,
    parse_backbone_spec,
)
from ._images import (
    FileChangedError,
    ImageSource,
    fashion_mnist,
    image_folder,
    image_list,
    open_source,
)
from ._runner import extract_features
from ._store import (
    FeatureStore,
    IncompleteStoreError,
    NotAStoreError,
    ProvenanceError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    load_features,
    merge_shards,
    shard_path,
)
from ._tables import TableError, parquet_files
from ._tar_shards import ShardError, webdataset_shards

__all__ = [
    "Backbone",
    "BackboneError",
    "BackboneSpec",
    "FeatureStore",
    "FileChangedError",
    "ImageSource",
    "IncompleteStoreError",
    "NotAStoreError",
    "ProvenanceError",
    "StoreError",
    "StoreLockedError",
    "ShardError",
    "StoreNotFoundError",
    "TableError",
    "WeightsUnavailableError",
    "create_backbone",
    "extract_features",
    "fashion_mnist",
    "file_sha256",
    "image_folder",
    "image_list",
    "load_features",
    "merge_shards",
    "open_source",
    "parquet_files",
    "parse_backbone_spec",
    "shard_path",
    "webdataset_shards",
]
