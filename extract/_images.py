"""Image sources (folder, list file, Fashion-MNIST IDX) and per-item reading and decoding."""

from __future__ import annotations

import csv
import gzip
import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_JPEG_SUFFIXES = (".jpg", ".jpeg")
_JPEG_MAGIC = b"\xff\xd8\xff"  # start-of-image marker and the next marker's prefix


@dataclass(frozen=True)
class ImageSource:
    """An ordered, labelled image collection; item ``i`` is always the same image.

    Attributes
    ----------
    ids : list of str
        One id per item: a path relative to ``root`` (or absolute), or ``split/number``.
    labels : ndarray of shape (n_items,), dtype int64
    class_names : list of str
    root : str
        Folder the relative paths are resolved against ('' for in-memory sources).
    description : str
        Human-readable origin, recorded in the store.
    source_index : ndarray of shape (n_items,), dtype int64
        Position of each item in the full collection (differs after :meth:`subset`).
    pixels : ndarray of shape (n_items, H, W), dtype uint8, optional
        In-memory greyscale images (Fashion-MNIST); None for file sources.
    """

    ids: list[str]
    labels: np.ndarray
    class_names: list[str]
    root: str
    description: str
    source_index: np.ndarray
    pixels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.ids[i])

    def fingerprint(self) -> str:
        """sha256 over (source index, id, label) of every item: resuming needs the same list."""
        digest = hashlib.sha256()
        for index, item, label in zip(self.source_index, self.ids, self.labels, strict=True):
            digest.update(f"{index}\t{item}\t{label}\n".encode())
        return "sha256:" + digest.hexdigest()

    def subset(self, n_per_class: int | None = None, n: int | None = None) -> ImageSource:
        """Keep the first ``n_per_class`` items of each class, then the first ``n`` items.

        Order is preserved, so a subset is reproducible and resumable.
        """
        keep = np.arange(len(self))
        if n_per_class is not None:
            # Rank of each item within its class, in collection order.
            order = np.argsort(self.labels, kind="stable")
            starts = np.searchsorted(self.labels[order], self.labels[order])
            rank = np.empty_like(keep)
            rank[order] = np.arange(len(self)) - starts
            keep = keep[rank < n_per_class]
        if n is not None:
            keep = keep[:n]
        return replace(
            self,
            ids=[self.ids[i] for i in keep],
            labels=self.labels[keep],
            source_index=self.source_index[keep],
            pixels=None if self.pixels is None else self.pixels[keep],
        )


def _idx_array(path: Path, header: int) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        return np.frombuffer(fh.read(), dtype=np.uint8, offset=header)


def fashion_mnist(
    split: str = "train", root: str | os.PathLike = FASHION_MNIST_ROOT
) -> ImageSource:
    """Fashion-MNIST from its gzipped IDX files (``apt-get install dataset-fashion-mnist``).

    Parameters
    ----------
    split : {"train", "test"}
    root : path-like, default="/usr/share/datasets/fashion-mnist"

    Returns
    -------
    ImageSource
        28x28 greyscale images held in memory; ids are ``split/NNNNN``.
    """
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"The Fashion-MNIST split must be 'train' or 'test'. Got {split!r}.")
    root = Path(root)
    images = root / f"{prefix}-images-idx3-ubyte.gz"
    labels = root / f"{prefix}-labels-idx1-ubyte.gz"
    if not images.is_file() or not labels.is_file():
        raise FileNotFoundError(
            f"Fashion-MNIST IDX files not found in {str(root)!r}; install them with "
            "`apt-get install dataset-fashion-mnist` or pass the folder holding them."
        )
    # IDX: images have a 16-byte header (magic, count, rows, cols), labels an 8-byte one.
    pixels = _idx_array(images, 16).reshape(-1, 28, 28)
    y = _idx_array(labels, 8).astype(np.int64)
    n = len(y)
    return ImageSource(
        ids=[f"{split}/{i:05d}" for i in range(n)],
        labels=y,
        class_names=list(FASHION_MNIST_CLASSES),
        root="",
        description=f"fashion-mnist:{split}@{root}",
        source_index=np.arange(n, dtype=np.int64),
        pixels=pixels,
    )


def image_folder(root: str | os.PathLike) -> ImageSource:
    """Images in ``root/<class name>/...`` (the ImageFolder convention), in sorted order.

    Parameters
    ----------
    root : path-like
        Folder with one sub-folder per class.

    Returns
    -------
    ImageSource
        Ids are paths relative to ``root``; classes are the sorted sub-folder names.
    """
    root = os.fspath(root)
    classes, class_to_idx = find_classes(root)
    # Listed by extension only: a corrupt file is kept so that it is recorded as a failure.
    items = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    return ImageSource(
        ids=[os.path.relpath(p, root) for p, _ in items],
        labels=np.array([y for _, y in items], dtype=np.int64),
        class_names=list(classes),
        root=root,
        description=f"folder:{os.path.abspath(root)}",
        source_index=np.arange(len(items), dtype=np.int64),
    )


def image_list(list_file: str | os.PathLike) -> ImageSource:
    """Images listed as ``path,label`` lines (CSV, or whitespace-separated text).

    Parameters
    ----------
    list_file : path-like
        One ``path,label`` per line. Relative paths are resolved against the list file's
        folder. Labels are class names (sorted into indices), or integers (then class ``k``
        is named ``"k"``). A first line ``path,label`` is a header.

    Returns
    -------
    ImageSource
    """
    list_file = Path(list_file)
    with open(list_file, newline="") as fh:
        text = fh.read().splitlines()
    delimiter = "," if any("," in line for line in text) else None
    rows = []
    for number, line in enumerate(text, 1):
        if not line.strip():
            continue
        fields = next(csv.reader([line])) if delimiter else line.rsplit(None, 1)
        if len(fields) != 2:
            raise ValueError(f"{list_file}:{number}: expected 'path,label', got {line!r}.")
        rows.append([f.strip() for f in fields])
    if rows and rows[0] == ["path", "label"]:
        rows = rows[1:]
    names = [label for _, label in rows]
    # Non-negative integers are class indices; anything else (-1 included) is a class name.
    if all(name.isdigit() for name in names):
        labels = np.array([int(name) for name in names], dtype=np.int64)
        class_names = [str(k) for k in range(labels.max(initial=-1) + 1)]
    else:
        class_names = sorted(set(names))
        labels = np.searchsorted(class_names, names).astype(np.int64)
    return ImageSource(
        ids=[path for path, _ in rows],
        labels=labels,
        class_names=class_names,
        root=str(list_file.parent),
        description=f"list:{list_file.resolve()}",
        source_index=np.arange(len(rows), dtype=np.int64),
    )


def open_source(source: str | os.PathLike | ImageSource) -> ImageSource:
    """Open an image source.

    Parameters
    ----------
    source : str, path-like or ImageSource
        A class-per-folder directory, a ``path,label`` list file,
        ``"fashion-mnist:train"`` / ``"fashion-mnist:test[@ROOT]"``, or an ``ImageSource``
        (returned as is).

    Returns
    -------
    ImageSource
    """
    if isinstance(source, ImageSource):
        return source
    text = os.fspath(source)
    if text.startswith("fashion-mnist"):
        split, _, root = text.partition(":")[2].partition("@")
        return fashion_mnist(split or "train", root or FASHION_MNIST_ROOT)
    if os.path.isdir(text):
        return image_folder(text)
    if os.path.isfile(text):
        return image_list(text)
    raise FileNotFoundError(
        f"The image source {text!r} is neither a folder, a list file nor "
        "'fashion-mnist:train|test[@ROOT]'."
    )


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB copy of a PIL image; transparent pixels are composited on white."""
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if has_alpha:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


def load_image(source: ImageSource, i: int) -> Image.Image:
    """Decode item ``i`` fully (so truncation surfaces here) and convert it to RGB."""
    if source.pixels is not None:
        return Image.fromarray(source.pixels[i], mode="L").convert("RGB")
    with Image.open(source.path(i)) as image:
        image.load()
        return to_rgb(image)


class ItemDataset(torch.utils.data.Dataset):
    """Items as ``(index, tensor or None, failure reason or None)``, decoded in workers.

    With ``jpeg_bytes=True`` JPEG files are returned undecoded (``uint8`` byte tensors,
    flagged by a ``None`` reason and a 1-D tensor) so that the consumer can decode them
    on the GPU; every other item goes through ``transform`` here. A file is JPEG by its
    content (the SOI marker), not its name: a PNG saved as ``.jpg`` is decoded by PIL.
    """

    def __init__(self, source: ImageSource, transform, jpeg_bytes: bool = False) -> None:
        self.source, self.transform, self.jpeg_bytes = source, transform, jpeg_bytes

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            is_file = self.source.pixels is None
            if self.jpeg_bytes and is_file and self.source.ids[i].lower().endswith(_JPEG_SUFFIXES):
                with open(self.source.path(i), "rb") as fh:
                    data = bytearray(fh.read())
                if data[:3] == _JPEG_MAGIC:
                    # A plain bytearray-backed tensor crosses the worker queue cheaply.
                    return i, torch.frombuffer(data, dtype=torch.uint8), None
            return i, self.transform(load_image(self.source, i)), None
        except Exception as err:  # an unreadable image is recorded, never fatal
            return i, None, f"{type(err).__name__}: {err}"[:200]


def collate_items(items: list) -> tuple[list[int], list, list[str | None]]:
    """Keep items as lists: batches mix decoded tensors, raw JPEG bytes and failures."""
    index, tensors, reasons = zip(*items, strict=True)
    return list(index), list(tensors), list(reasons)
