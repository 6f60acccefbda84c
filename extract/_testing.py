"""Small offline fixtures for tests, examples and benchmarks: generated images, tiny models."""

from __future__ import annotations

import gzip
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

TINY_OPEN_CLIP = "tiny-clip-test"
_TINY_OPEN_CLIP_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
}


def register_tiny_open_clip(folder: str | os.PathLike) -> str:
    """Register a 2-layer, 32 px open_clip model config (random weights) and return its name."""
    import open_clip

    path = Path(folder) / f"{TINY_OPEN_CLIP}.json"
    path.write_text(json.dumps(_TINY_OPEN_CLIP_CFG))
    open_clip.add_model_config(path)
    return TINY_OPEN_CLIP


def make_image_folder(
    root: str | os.PathLike,
    classes: tuple[str, ...] = ("cat", "dog"),
    n_per_class: int = 6,
    size: int = 36,
    seed: int = 0,
    special: bool = True,
) -> Path:
    """Write a class-per-folder tree of random JPEG and PNG images.

    Each class has its own mean colour, so features separate the classes. With
    ``special=True`` the first class also gets ``alpha.png`` (RGBA), ``grey.jpg``
    (greyscale), ``corrupt.jpg`` (not an image) and ``truncated.jpg`` (a JPEG cut halfway
    through its image data).
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    for k, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        base = np.array([60 + 120 * (k % 2), 200 - 40 * (k % 4), 90 + 50 * k]) % 256
        for i in range(n_per_class):
            noise = rng.integers(-50, 50, (size, size + 4, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.{'png' if i % 3 == 0 else 'jpg'}")
    if special:
        folder = root / classes[0]
        rgba = rng.integers(0, 255, (size, size, 4), dtype=np.uint8)
        Image.fromarray(rgba, "RGBA").save(folder / "alpha.png")
        grey = rng.integers(0, 255, (size, size), dtype=np.uint8)
        Image.fromarray(grey, "L").save(folder / "grey.jpg")
        (folder / "corrupt.jpg").write_bytes(b"this is not an image")
        whole = (folder / "001.jpg").read_bytes()
        # Cut halfway through its image data (half the file ended inside its headers,
        # which no decoder reads past): a decoder that reads on regardless fills the rest.
        scan = whole.index(b"\xff\xda")  # start of scan
        (folder / "truncated.jpg").write_bytes(whole[: (scan + len(whole)) // 2])
    return root


def _samples(folder: str | os.PathLike) -> Iterator[tuple[str, str, bytes, int, str]]:
    """``(key, extension, bytes, class index, class name)`` of each image of a class folder."""
    from ._image_folder import image_folder

    src = image_folder(folder)
    for item, label in zip(src.ids, src.labels.tolist(), strict=True):
        stem, ext = os.path.splitext(item)
        data = (Path(folder) / item).read_bytes()
        yield stem, ext[1:].lower(), data, label, src.class_names[label]


def write_webdataset(
    folder: str | os.PathLike, pattern: str | os.PathLike, maxcount: int = 5
) -> list[Path]:
    """Write the images of a class folder as WebDataset shards, in the folder's order.

    Each sample holds the file's bytes under its extension (``cat/001.jpg`` becomes the key
    ``cat/001`` with a ``jpg`` member), ``cls`` (the class index) and ``json``
    (``{"label": class name}``). ``pattern`` names the shards, e.g. ``"out/%05d.tar"``.
    """
    import webdataset as wds

    Path(pattern).parent.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(os.fspath(pattern), maxcount=maxcount, verbose=0) as sink:
        for key, ext, data, label, name in _samples(folder):
            sink.write({"__key__": key, ext: data, "cls": label, "json": {"label": name}})
    return sorted(Path(pattern).parent.glob("*.tar"))


def hf_image_schema(class_names: list[str]):
    """The Arrow schema Hugging Face ``datasets`` writes for ``Image`` and ``ClassLabel``."""
    import pyarrow as pa

    features = {"image": {"_type": "Image"}, "label": {"names": class_names, "_type": "ClassLabel"}}
    schema = pa.schema(
        [
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("label", pa.int64()),
        ]
    )
    return schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def write_parquet(
    folder: str | os.PathLike, path: str | os.PathLike, row_group_size: int = 5
) -> Path:
    """Write the images of a class folder as a Parquet file laid out as Hugging Face does.

    An ``image`` struct column (``bytes``, ``path``) and a ``label`` column, the class names
    in the schema's ``huggingface`` metadata, rows in the folder's order.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ._image_folder import image_folder

    samples = list(_samples(folder))
    table = pa.table(
        {
            "image": [{"bytes": data, "path": None} for _, _, data, _, _ in samples],
            "label": [label for _, _, _, label, _ in samples],
        },
        schema=hf_image_schema(image_folder(folder).class_names),
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return Path(path)


def write_idx(folder: str | os.PathLike, prefix: str, images: np.ndarray, labels: np.ndarray):
    """Write gzipped IDX files in Fashion-MNIST's layout (``<prefix>-images-idx3-ubyte.gz``)."""
    folder = Path(folder)
    n, rows, cols = images.shape
    with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">IIII", 2051, n, rows, cols) + images.astype(np.uint8).tobytes())
    with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">II", 2049, n) + labels.astype(np.uint8).tobytes())


@contextmanager
def no_weights_hub(cache: str | os.PathLike) -> Iterator[None]:
    """Make pretrained weights unreachable: no hub, empty caches under ``cache``.

    Tests never download: the hub counts as unreachable and the Hugging Face and torch
    caches point into ``cache``, so a pretrained spec fails as it does without a network.
    """
    from huggingface_hub import constants

    from . import _weights

    saved = (_weights._hub_reachable, constants.HF_HUB_CACHE)
    saved_env = {k: os.environ.get(k) for k in ("TORCH_HOME", "HF_HUB_OFFLINE")}
    _weights._hub_reachable = lambda: False
    constants.HF_HUB_CACHE = os.path.join(cache, "huggingface")
    os.environ["TORCH_HOME"] = os.path.join(cache, "torch")
    os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        yield
    finally:
        _weights._hub_reachable, constants.HF_HUB_CACHE = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
