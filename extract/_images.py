"""Image sources: :class:`ImageSource`, which every source opens as, Fashion-MNIST from its
IDX files, and per-item reading and decoding (the bytes and pixels of one image:
``_decoding``).

Folders and list files are opened by ``_image_folder`` and ``_image_list``, a source by its
name by ``_sources`` (:func:`~extract._sources.open_source`). Sources whose items live inside
container files (WebDataset tar shards, Parquet and Arrow files) are opened by
``_tar_shards`` and ``_tables``; they carry an ``archive`` that reads their items' bytes, and
share everything else here.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile

from ._backbones import float32_default
from ._decoding import (
    _JPEG_MAGIC,
    MAX_ASPECT,
    NOT_A_FILE,
    check_pixel_limit,
    decode_image,
    failure_reason,
    jpeg_size,
    read_file,
    sha256_hex,
)
from ._paths import expand_home

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


def stat_files(root: str, ids: list[str], inodes: np.ndarray | None = None) -> tuple:
    """Size in bytes and ``st_mtime_ns`` of every file (-1 for a missing one); with
    ``inodes`` (an int64 array of shape (n, 2)), each file's ``(st_dev, st_ino)`` too."""
    sizes = np.full(len(ids), NOT_A_FILE, np.int64)
    mtimes = np.full(len(ids), NOT_A_FILE, np.int64)
    for i, item in enumerate(ids):
        try:
            st = os.stat(os.path.join(root, item))
        except OSError:
            continue  # recorded as a failure when read
        sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
        if inodes is not None:
            inodes[i] = st.st_dev, st.st_ino
    return sizes, mtimes


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
        Folder the relative paths are resolved against (the IDX folder for Fashion-MNIST;
        '' for other in-memory sources).
    description : str
        Human-readable origin, recorded in the store.
    source_index : ndarray of shape (n_items,), dtype int64
        Position of each item in the full collection (differs after :meth:`subset`),
        increasing.
    pixels : ndarray of shape (n_items, H, W), dtype uint8, optional
        In-memory greyscale images (Fashion-MNIST); None for file sources.
    file_size, file_mtime_ns : ndarray of shape (n_items,), dtype int64, optional
        Size and modification time of each file when the collection was listed (-1 for
        in-memory items and missing files); None: taken when it is opened
        (:func:`open_source`, which ``extract_features`` calls).
    files : dict of str to str
        Identity (``sha256:<hex>``) of each file holding many items, in source order:
        Fashion-MNIST's IDX files (their content), tar shards (their headers and label
        members), Parquet / Arrow files (their footer or message headers).
    archive : Archive, optional
        Reader of items stored inside container files (tar shards, Parquet / Arrow files);
        None when each item is a file of its own or in memory. ``file_size`` and
        ``file_mtime_ns`` then describe each item's container file.
    options : dict, optional
        Settings that choose what is read from the containers (``image_key``,
        ``label_key``); recorded in the store's provenance.
    """

    ids: list[str]
    labels: np.ndarray
    class_names: list[str]
    root: str
    description: str
    source_index: np.ndarray
    pixels: np.ndarray | None = None
    file_size: np.ndarray | None = None
    file_mtime_ns: np.ndarray | None = None
    files: dict[str, str] = field(default_factory=dict)
    archive: Any = None
    options: dict[str, str] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def path(self, i: int) -> str:
        """The file holding item ``i`` (its container for archived items)."""
        if self.archive is not None:
            return os.path.join(self.root, self.archive.paths[self.archive.file[i]])
        return os.path.join(self.root, self.ids[i])

    def item_name(self, i: int) -> str:
        """Item ``i`` in messages: its path, or ``<container>:<key>`` for archived items."""
        if self.archive is not None:
            return f"{self.path(i)}:{self.archive.local_id(i, self.ids[i])}"
        return self.path(i)

    def resolved_root(self) -> str:
        """The root with symbolic links resolved ('' for sources without one)."""
        return os.path.realpath(self.root) if self.root else ""

    def file_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """``(file_size, file_mtime_ns)`` of every item (-1 for in-memory items)."""
        if self.pixels is not None:
            missing = np.full(len(self), NOT_A_FILE, np.int64)
            return missing, missing.copy()
        if self.file_size is not None and self.file_mtime_ns is not None:
            return self.file_size, self.file_mtime_ns
        return stat_files(self.root, self.ids)

    def fingerprint(self) -> str:
        """sha256 over every item's source index, id, label, file size and modification time.

        Also covers the class names and the files holding many items (``files``): a store
        is reused only for the same list of the same files.
        """
        digest = hashlib.sha256(json.dumps(list(self.class_names)).encode())
        for name, identity in sorted(self.files.items()):
            digest.update(f"{name}\t{identity}\n".encode())
        sizes, mtimes = self.file_stats()
        rows = zip(self.source_index, self.ids, self.labels, sizes, mtimes, strict=True)
        for index, item, label, size, mtime in rows:
            digest.update(f"{index}\t{item}\t{label}\t{size}\t{mtime}\n".encode())
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
        sizes, mtimes = self.file_stats()
        return replace(
            self,
            ids=[self.ids[i] for i in keep],
            labels=self.labels[keep],
            source_index=self.source_index[keep],
            pixels=None if self.pixels is None else self.pixels[keep],
            file_size=sizes[keep],
            file_mtime_ns=mtimes[keep],
            archive=None if self.archive is None else self.archive.take(keep),
        )


def _idx_array(path: Path, ndim: int) -> tuple[np.ndarray, str]:
    """The uint8 array of an IDX file of ``ndim`` dimensions, gzipped or not, and the
    file's ``sha256:<hex>``; a damaged file, or one of another kind, is refused by name."""
    raw = path.read_bytes()
    try:
        payload = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"{str(path)!r} is not a complete gzip file: {err}") from err
    # Magic number 0x0000_08_NN (unsigned bytes, NN dimensions), then one uint32 per one.
    header = 4 * (1 + ndim)
    fields = struct.unpack(f">{1 + ndim}I", payload[:header]) if len(payload) >= header else ()
    if not fields or fields[0] != 0x800 + ndim:
        raise ValueError(
            f"{str(path)!r} is not an IDX file of unsigned bytes in {ndim} dimensions."
        )
    shape = fields[1:]
    if len(payload) - header != math.prod(shape):
        raise ValueError(
            f"{str(path)!r} holds {len(payload) - header} bytes of data, not the "
            f"{math.prod(shape)} its header announces ({' x '.join(map(str, shape))})."
        )
    data = np.frombuffer(payload, dtype=np.uint8, offset=header).reshape(shape)
    return data, "sha256:" + hashlib.sha256(raw).hexdigest()


def _idx_file(folder: Path, name: str) -> Path | None:
    """``folder/name.gz``, else ``folder/name`` (an IDX file uncompressed), if a file."""
    return next((p for p in (folder / f"{name}.gz", folder / name) if p.is_file()), None)


def fashion_mnist(
    split: str = "train", root: str | os.PathLike = FASHION_MNIST_ROOT
) -> ImageSource:
    """Fashion-MNIST from its IDX files, gzipped (``apt-get install dataset-fashion-mnist``)
    or not.

    Parameters
    ----------
    split : {"train", "test"}, default="train"
    root : path-like, default="/usr/share/datasets/fashion-mnist"

    Returns
    -------
    ImageSource
        28x28 greyscale images held in memory; ids are ``split/NNNNN``.
    """
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(
            f"The Fashion-MNIST split must be 'train' or 'test'. Got {split!r} instead."
        )
    root = Path(expand_home(os.fspath(root)))
    # Gzipped or not: Kaggle's copy holds them uncompressed alone, and such a folder was
    # said to hold none.
    images, labels = (
        _idx_file(root, f"{prefix}-{kind}") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
    )
    if images is None or labels is None:
        # (torchvision's download keeps them in FashionMNIST/raw under its root)
        inner = next(
            (
                folder
                for folder in (root / "FashionMNIST" / "raw", root / "raw")
                if _idx_file(folder, f"{prefix}-images-idx3-ubyte")
            ),
            None,
        )
        where = f" They are in {str(inner)!r}: pass that folder." if inner else ""
        raise FileNotFoundError(
            f"Fashion-MNIST IDX files not found in {str(root)!r}; install them with "
            f"`apt-get install dataset-fashion-mnist` or pass the folder holding them.{where}"
        )
    pixels, images_id = _idx_array(images, 3)
    y, labels_id = _idx_array(labels, 1)
    n = len(y)
    if pixels.shape != (n, 28, 28) or (y >= len(FASHION_MNIST_CLASSES)).any():
        raise ValueError(
            f"The Fashion-MNIST files in {str(root)!r} do not belong together: "
            f"{images.name} holds {' x '.join(map(str, pixels.shape))} pixels and "
            f"{labels.name} {n} labels (expected n x 28 x 28 and n labels in 0..9)."
        )
    return ImageSource(
        ids=[f"{split}/{i:05d}" for i in range(n)],
        labels=y.astype(np.int64),
        class_names=list(FASHION_MNIST_CLASSES),
        root=str(root.resolve()),
        # (As a folder's: absolute, so that a store and report.json name the files read
        # wherever the command ran; "fashion-mnist:test@fm" named none.)
        description=f"fashion-mnist:{split}@{os.path.join(os.getcwd(), root)}",
        source_index=np.arange(n, dtype=np.int64),
        pixels=pixels,
        files={images.name: images_id, labels.name: labels_id},
    )


def check_keys(image_key: str | None, label_key: str | None) -> None:
    """Refuse a member or column name that is no text (5 failed on its missing ``split``)
    or is empty or blank (read as the default)."""
    for name, value in (("image_key", image_key), ("label_key", label_key)):
        if value is not None and not isinstance(value, str):
            raise ValueError(
                f"The '{name}' parameter must be a str or None. Got {value!r} instead."
            )
        if isinstance(value, str) and not value.strip():
            raise ValueError(
                f"The '{name}' parameter must name a member or column, or be None for the "
                f"default. Got {value!r} instead."
            )


def load_image(source: ImageSource, i: int) -> Image.Image:
    """Decode item ``i`` fully (so truncation surfaces here) and convert it to RGB."""
    if source.pixels is not None:
        return Image.fromarray(source.pixels[i], mode="L").convert("RGB")
    if source.archive is not None:
        (data,) = source.archive.read(source.root, [i], {})
        if isinstance(data, Exception):
            raise data
        return decode_image(data, source.item_name(i))
    return decode_image(read_file(source.path(i)), source.path(i))


def _in_float32(transform, image) -> torch.Tensor:
    """``transform(image)`` under torch's default dtype float32, the caller's put back after:
    a transform's ToTensor makes the pixels in the default dtype. Under
    ``torch.set_default_dtype(torch.float16)`` they were rounded to half precision (features
    3e-5 off, bfloat16's 6e-4), and a resumed store mixed rows of either session."""
    with float32_default():
        return transform(image)


class ItemDataset(torch.utils.data.Dataset):
    """Items as ``(index, tensor or None, failure reason or None, content sha256)``.

    Files are read once, checked against the size and modification time listed when the
    collection was opened, hashed (the hex sha256 of the bytes, stored per row) and decoded
    in the workers. With ``jpeg_bytes=True`` JPEG files are returned undecoded (``uint8``
    byte tensors, flagged by a ``None`` reason and a 1-D tensor) so that the consumer can
    decode them on the device; every other item goes through ``transform`` here. A file is
    JPEG by its content (the SOI marker), not its name: a PNG saved as ``.jpg`` is decoded
    by PIL. Every path refuses images over ``PIL.Image.MAX_IMAGE_PIXELS`` before decoding.

    Items inside container files (tar shards, Parquet / Arrow files) are read a loader
    block at a time (``__getitems__``): each container is opened once per block, and a
    worker keeps its place in a Parquet row group from one block to the next.
    """

    def __init__(
        self, source: ImageSource, transform, jpeg_bytes: bool = False, max_aspect=MAX_ASPECT
    ) -> None:
        self.source, self.transform, self.jpeg_bytes = source, transform, jpeg_bytes
        self.max_aspect = max_aspect  # where long strips are cut (decode_image)
        # PIL's limit as it is now, taken into the workers: those started by spawn or
        # forkserver import PIL afresh, with its default.
        self.max_pixels = Image.MAX_IMAGE_PIXELS
        self.sizes, self.mtimes = source.file_stats()
        self.reader_state: dict = {}  # per worker process: the archive's open cursor

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None, str]:
        if self.source.archive is not None:
            return self.__getitems__([i])[0]
        self._set_pil()  # (__getitems__ sets it for archives)
        if self.source.pixels is not None:
            digest = sha256_hex(np.ascontiguousarray(self.source.pixels[i]))
            try:
                return i, _in_float32(self.transform, load_image(self.source, i)), None, digest
            except Exception as err:  # an unreadable image is recorded, never fatal
                return i, None, failure_reason(err), digest
        path = self.source.path(i)
        try:
            data = read_file(path, (int(self.sizes[i]), int(self.mtimes[i])))
        except Exception as err:
            return i, None, failure_reason(err), ""
        return self._decoded(i, data, path)

    def __getitems__(self, indices: list[int]) -> list:
        if self.source.archive is None:
            return [self[i] for i in indices]
        self._set_pil()
        read = self.source.archive.read(self.source.root, indices, self.reader_state)
        return [
            (i, None, failure_reason(data), "")
            if isinstance(data, Exception)
            else self._decoded(i, data, self.source.item_name(i))
            for i, data in zip(indices, read, strict=True)
        ]

    def _set_pil(self) -> None:
        """PIL's settings for decoding, in a worker process as in this one: the pixel limit
        set when the dataset was made, and truncated files refused. A worker started by
        spawn or forkserver imports the main module afresh, and a script's top-level
        ``ImageFile.LOAD_TRUNCATED_IMAGES = True`` (which extract_features refuses in this
        process) came back there: truncated files were decoded with their missing part grey."""
        Image.MAX_IMAGE_PIXELS = self.max_pixels
        ImageFile.LOAD_TRUNCATED_IMAGES = False

    def _decoded(self, i: int, data: bytearray, name: str) -> tuple:
        digest = sha256_hex(data)
        try:
            if self.jpeg_bytes and data[:3] == _JPEG_MAGIC:
                check_pixel_limit(*jpeg_size(data))
                # A plain bytearray-backed tensor crosses the worker queue cheaply.
                return i, torch.frombuffer(data, dtype=torch.uint8), None, digest
            image = decode_image(data, name, self.max_aspect)
            return i, _in_float32(self.transform, image), None, digest
        except Exception as err:  # an unreadable image is recorded, never fatal
            return i, None, failure_reason(err), digest


def collate_items(
    items: list,
) -> tuple[list[int], torch.Tensor | None, list, list[str | None], list[str]]:
    """A block of items as ``(index, decoded, raw, reasons, digests)``.

    ``decoded`` stacks the block's decoded images (in their order, or ``None`` if it has
    none) here in the worker, so that the loader pins one tensor and its copy to the GPU
    runs asynchronously. ``raw`` keeps each item's undecoded JPEG bytes (a 1-D tensor) and
    ``None`` for every other item: decoded, or failed as ``reasons`` says.
    """
    index, tensors, reasons, digests = zip(*items, strict=True)
    ready = [t for t, r in zip(tensors, reasons, strict=True) if r is None and t.ndim > 1]
    raw = [t if r is None and t.ndim == 1 else None for t, r in zip(tensors, reasons, strict=True)]
    decoded = torch.stack(ready) if ready else None
    return list(index), decoded, raw, list(reasons), list(digests)
