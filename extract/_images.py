"""Image sources (folder, list file, Fashion-MNIST IDX) and per-item reading and decoding
(the bytes and pixels of one image: ``_decoding``).

Sources whose items live inside container files (WebDataset tar shards, Parquet and Arrow
files) are opened by ``_tar_shards`` and ``_tables``; they carry an ``archive`` that reads
their items' bytes, and share everything else here.
"""

from __future__ import annotations

import collections
import csv
import gzip
import hashlib
import json
import logging
import math
import os
import re
import shlex
import struct
import unicodedata
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from operator import methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension

from mr2_probe._h5 import why_missing

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
from ._paths import expand_home, plural

logger = logging.getLogger(__name__)

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


def image_folder(root: str | os.PathLike) -> ImageSource:
    """Images in ``root/<class name>/...`` (the ImageFolder convention), in sorted order.

    Parameters
    ----------
    root : path-like
        Folder with one sub-folder per class.

    Returns
    -------
    ImageSource
        Ids are paths relative to ``root``; classes are the sorted sub-folder names. Hidden
        folders and files (``.ipynb_checkpoints``, macOS's ``._x.jpg``), the
        ``__MACOSX`` folders of an unzipped Finder archive, a file system's own folders
        (``lost+found``, ``System Volume Information``, ``$RECYCLE.BIN``,
        ``$Recycle.Bin``), a Synology NAS's ``@eaDir`` thumbnails and a NAS share's
        recycle bin (``#recycle``, ``@Recycle``) are left out, at every level.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> from extract import image_folder
    >>> root = Path(tempfile.mkdtemp())
    >>> for name in ("cat/1.png", "cat/2.png", "dog/1.png"):
    ...     (root / name).parent.mkdir(exist_ok=True)
    ...     Image.new("RGB", (8, 8)).save(root / name)
    >>> source = image_folder(root)
    >>> source.ids, source.labels.tolist(), source.class_names
    (['cat/1.png', 'cat/2.png', 'dog/1.png'], [0, 0, 1], ['cat', 'dog'])
    """
    root = expand_home(os.fspath(root))
    _check_dangling_links(root)
    # A hidden folder (.ipynb_checkpoints, a file manager's .thumbs, .git, an unzipped
    # __MACOSX) is no class: taken as one, it shifted every class index after it.
    try:
        classes = [name for name in find_classes(root)[0] if not _hidden(name)]
    except FileNotFoundError:  # no folder in root at all: said below, as hidden ones alone
        classes = []
    _check_one_form(classes, root)
    if not classes:
        images = [
            entry.name
            for entry in os.scandir(root)
            if entry.is_file() and not _hidden(entry.name)
            and has_file_allowed_extension(entry.name, IMG_EXTENSIONS)
        ]  # fmt: skip
        # (A class's own folder given as the source, most likely.)
        held = (
            f"; it holds {len(images)} {plural(len(images), 'image')} itself "
            f"(such as {min(images)!r}), but images are read from its class sub-folders only "
            f"({os.path.join(root, 'CLASS', min(images))}): give the folder that holds the "
            "class folders, or a 'path,label' list file"
            if images
            else ""
        )
        raise FileNotFoundError(f"Couldn't find any class folder in {root}{held}.")
    # Listed by extension only: a corrupt file is kept so that it is recorded as a failure.
    items = _folder_items(root, classes)
    ids = [os.path.relpath(p, root) for p, _ in items]
    if all(name.lower() in _SPLIT_NAMES for name in classes):
        # (A dataset's folder given instead of a split's: the classes were the splits.)
        logger.warning(
            "The class folders of %r are %s, names of splits: each is read as one class of "
            "every image under it. To extract a split, give its folder (e.g. %r).",
            root,
            ", ".join(map(repr, classes)),
            os.path.join(root, classes[0]),
        )
    elif len(classes) == 1 and _in_sub_folders_alone(ids):
        # (A folder given one level above the class folders, as an archive unpacked into a
        # folder of its own name leaves them: one class of every image, without a word.)
        inner = sorted({i.split(os.sep)[1] for i in ids})
        logger.warning(
            "%r holds one class folder, %r, and it holds no image itself but sub-folders "
            "(%s): every image is read as of one class. To read them as the classes, give "
            "its folder, %r.",
            root,
            classes[0],
            ", ".join(map(repr, inner[:3])) + (", ..." if len(inner) > 3 else ""),
            os.path.join(root, classes[0]),
        )
    _warn_of_numbers_sorted_as_text(classes, root)
    _check_utf8([*classes, *ids], root)
    labels = np.array([y for _, y in items], dtype=np.int64)
    inodes = np.full((len(ids), 2), -1, np.int64)
    sizes, mtimes = stat_files(root, ids, inodes)
    _refuse_links_across_classes(root, ids, labels, classes, inodes)
    return ImageSource(
        ids=ids,
        labels=labels,
        class_names=list(classes),
        root=root,
        description=f"folder:{os.path.abspath(root)}",
        source_index=np.arange(len(items), dtype=np.int64),
        file_size=sizes,
        file_mtime_ns=mtimes,
    )


def _warn_of_numbers_sorted_as_text(classes: list[str], root: str) -> None:
    """Say where class folders named by numbers ('0' ... '11') are, sorted as text as
    torchvision sorts them, out of their numbers' order: '10' is class 2, which a list
    file or a model's own labels number 10. ('1' ... '9', classes 0 ... 8, keep it.) The
    advice names the width that sorts them (3 digits for '1' ... '100', which '02' padded
    to 2), and where the numbers do not start at 0, that class 0 is the first: '01' ...
    '10' sort in their numbers' order, but are classes 0 ... 9, not their numbers, as the
    advice said. Folders that spell one number ('1' and '01') are named, two classes of
    one number, which leading zeros made one name (two folders of one name, where the
    advice was followed): the images of one are to move into the other, or one to be
    renamed, first; every such number is named, as padding renamed one left onto its
    twin."""
    moved = numbers_sorted_as_text(classes)
    spelt_twice = _numbers_spelt_twice(classes)
    twins = spelt_twice[0] if spelt_twice else None
    if moved is None and twins is None:
        return
    numbers = sorted(int(name) for name in classes)
    said, args = "The class folders of %r are numbers", [root]
    if moved is not None:
        said += (
            ", sorted as text as torchvision's ImageFolder sorts them ('10' before '2'): "
            "class %d is the folder %r. The store names each class by its folder"
        )
        args += [moved[1], moved[2]]
    if twins is not None:
        others = _and(twins[:-1])
        said += (
            "; the folders %s spell one number, %d: %d classes, which leading zeros would "
            "make one name. Where they are one class, move the images of %s into %r and "
            "remove %s; else rename %s to a number no other folder spells"
        )
        args += [
            _and(twins), int(twins[0]), len(twins), others, twins[-1], others,
            "one" if len(twins) == 2 else "all but one",
        ]  # fmt: skip
        if len(spelt_twice) > 1:  # (each named: padded, '2' was renamed onto its '02')
            said += "; likewise for the folders %s"
            args.append("; ".join(map(_and, spelt_twice[1:])))
    if moved is not None:
        width = max(len(str(numbers[-1])), *(len(name) for name in classes))
        low, high = f"{numbers[0]:0{width}d}", f"{numbers[-1]:0{width}d}"
        said += (
            "; %sto sort the classes in their numbers' order, give every name leading zeros "
            "to %d digits (%r ... %r)%s"
        )
        offset = "" if numbers[0] == 0 else f"; class 0 is then the folder {low!r}"
        args += ["then, " if twins else "", width, low, high, offset]
    logger.warning(said + ".", *args)


def _and(names: list[str]) -> str:
    """``'a'``, ``'a' and 'b'``, ``'a', 'b' and 'c'``."""
    quoted = list(map(repr, names))
    return " and ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


def _numbers_spelt_twice(names: list[str]) -> list[list[str]]:
    """The spellings, shortest first, of each number that two or more of ``names`` (all of
    them numbers) spell ('1' and '01'), in the numbers' order; [] where there is none."""
    if not names or not all(map(is_index, names)):
        return []
    spellings: dict[int, list[str]] = {}
    for name in sorted(names, key=lambda name: (len(name), name)):
        spellings.setdefault(int(name), []).append(name)
    return [texts for _, texts in sorted(spellings.items()) if len(texts) > 1]


def _in_sub_folders_alone(ids: list[str]) -> bool:
    """Whether the images of one class lie in two or more of its sub-folders, none in
    the class folder itself (``class/sub/x.jpg``, not ``class/x.jpg``)."""
    parts = [i.split(os.sep) for i in ids]
    return all(len(p) > 2 for p in parts) and len({p[1] for p in parts}) > 1


# Folder names of a dataset's splits (compared in lower case), which no class is named.
_SPLIT_NAMES = frozenset({"train", "training", "test", "testing", "val", "valid", "validation"})


_SYSTEM_FOLDERS = frozenset(
    {"__MACOSX", "lost+found", "System Volume Information", "$RECYCLE.BIN", "@eaDir"}
    | {"$Recycle.Bin"}  # (the recycle bin's spelling on an NTFS drive)
    | {"#recycle", "@Recycle"}  # a NAS share's recycle bin (Synology, QNAP)
)


def _hidden(name: str) -> bool:
    """Whether a file or folder of an image folder is left out as no image or class: a
    hidden one (its name starts with a dot), the ``__MACOSX`` folder of resource forks
    that unzipping an archive made by macOS's Finder leaves beside its folders, the
    folders of a file system's own at its root (``lost+found`` of ext2/3/4, ``System
    Volume Information`` and ``$RECYCLE.BIN`` (``$Recycle.Bin`` on NTFS) of a drive
    Windows wrote to: class folders on a mounted disk), the ``@eaDir`` folders of
    thumbnails that a Synology NAS writes in every folder of images, or a NAS share's
    recycle bin of deleted files (``#recycle``, ``@Recycle``)."""
    return name.startswith(".") or name in _SYSTEM_FOLDERS


def _check_one_form(classes: list[str], root: str) -> None:
    """Refuse two class folders whose names are one name in two Unicode forms (an
    accent composed, 'caf\\xe9', and decomposed, 'cafe\\u0301', as a copy from macOS
    spells it): two classes that print alike, and that mr2-probe matches by name in NFC
    as one, so that it refused the store's class names."""
    twins = nfc_twins(classes)
    if twins:
        raise ValueError(
            f"Under {root!r}, the class folders {_two_forms(*twins)}: they would be two "
            "classes that print alike. Move the images of one into the other, or rename one "
            "of them."
        )


def nfc_twins(names) -> tuple[str, str] | None:
    """The first two names that are one name in two Unicode forms (equal in NFC), or None."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(unicodedata.normalize("NFC", name), name)
        if other != name:
            return other, name
    return None


def _two_forms(one: str, other: str) -> str:
    return (
        f"{one!r} and {other!r} are one name in two Unicode forms, {ascii(one)} and "
        f"{ascii(other)} (an accent composed in one and decomposed in the other, as a copy "
        "made on macOS spells it)"
    )


def _check_dangling_links(root: str) -> None:
    """Refuse a symbolic link beside the class folders whose target does not exist (a
    share not mounted, a folder moved): ``find_classes`` left it out without a word, and
    its class with it, every class index after it shifted. One to a git-annex or DVC
    object (:func:`_a_file_s`), a file not fetched such as a dataset's README.md, is no
    class: left out, with the other files beside the class folders."""
    for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
        if (
            entry.is_symlink()
            and not _hidden(entry.name)
            and not os.path.exists(entry.path)
            and not _a_file_s(entry.path, by_name=False)
        ):
            raise FileNotFoundError(
                f"{entry.path!r} under {root!r} {why_missing(entry.path)}: it may be a "
                "class folder, which would be left out with its class (a link that reaches "
                "nothing cannot tell a folder from a file). Restore its target, or remove "
                "the link"
            )


def _folder_items(root: str, classes: list[str]) -> list[tuple[str, int]]:
    """(path, class index) of the images under ``root/<class>``, in torchvision's
    ``make_dataset`` order, each once: a folder reached again through a symbolic link (a
    link to a folder above it, a loop) is not walked again (of two names of one folder,
    the first in sorted order is kept), nor the root or a folder above
    it from inside a class. Hidden files and folders (their names start with a dot),
    ``__MACOSX`` folders and the other system folders of :func:`_hidden` are left out.

    Raises FileNotFoundError, as ``make_dataset`` does, for a class without images (and
    for a link in a class whose target does not exist, unless it is a file's
    (:func:`_a_file_s`): one named as an image is listed, and recorded as a failed image,
    another is left out as any file without an image extension), OSError for a folder
    that cannot be listed, and ValueError for a folder of images reached from two classes
    (a class folder linked to another's, or a link inside one class to a folder of
    another): torchvision lists its images under both, each image with two labels.
    """

    def inode(path: str | Path) -> tuple[int, int | str]:
        st = os.stat(path)
        # (a file system without inode numbers, st_ino = 0 on some FUSE mounts: every folder
        # was one, walked once and said to be reached from two classes; its path resolved)
        return st.st_dev, st.st_ino or os.path.realpath(path)

    # Never walked from inside a class: the root and the folders above it (every class
    # again, under this class's label).
    starts = {Path(os.path.abspath(root)), Path(os.path.realpath(root))}
    above = {inode(folder) for start in starts for folder in (start, *start.parents)}

    def unreadable(error: OSError):
        # os.walk leaves out a folder it cannot list, and its images with it, without a word.
        raise OSError(
            error.errno,
            f"Cannot list the folder {error.filename!r} under {root!r} ({error.strerror}): its "
            "images would be left out. Make it readable, or move it out of the class folders",
        ) from error

    items, empty, other = [], [], []
    owner: dict[tuple[int, int | str], tuple[str, str]] = {}  # folder of images: (class, path)
    for index, name in enumerate(classes):
        seen, walked = set(above), []
        walk = os.walk(os.path.join(root, name), onerror=unreadable, followlinks=True)
        for top, dirs, files in walk:
            key = inode(top)
            if key in seen:
                dirs[:] = []  # walked already: neither its files nor its folders again
                continue
            seen.add(key)
            # Hidden files and folders (macOS's ._x.jpg, .ipynb_checkpoints) are no images
            # of the class, as a glob's * does not match them either. Walked in sorted
            # order, not the file system's (ext4 lists by hash): of two names of one folder
            # (a link to it beside it), the one kept is the first sorted, on any copy.
            dirs[:] = sorted(d for d in dirs if not _hidden(d))
            files = [f for f in files if not _hidden(f)]
            if any(has_file_allowed_extension(f, IMG_EXTENSIONS) for f in files):
                _refuse_two_classes(root, owner.setdefault(key, (name, top)), (name, top))
            walked.append((top, files))
        listed = [os.path.join(top, f) for top, files in sorted(walked) for f in sorted(files)]
        found = [(p, index) for p in listed if has_file_allowed_extension(p, IMG_EXTENSIONS)]
        if not found:
            empty.append(name)
        items += found
        others = [p for p in listed if not has_file_allowed_extension(p, IMG_EXTENSIONS)]
        for path in others:
            if os.path.islink(path) and not os.path.exists(path) and not _a_file_s(path):
                # (os.walk lists a link it cannot follow as a file: said as no image. One
                # to a file, an annotation of git-annex or DVC not fetched, is one.)
                raise FileNotFoundError(
                    f"{path!r} under {root!r} {why_missing(path)}: it may be a folder of "
                    f"the class {name!r}, whose images would be left out (a link that "
                    "reaches nothing cannot tell a folder from a file, and its name has no "
                    "extension). Restore its target, or remove the link"
                )
        other += others
    if empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(sorted(empty))}. "
            f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}. Each folder under "
            f"{root!r} is a class: put its images in it, or move it out of the source"
        )
    _warn_of_left_out(root, other)
    return items


def _refuse_links_across_classes(
    root: str, ids: list[str], labels: np.ndarray, classes: list[str], inodes: np.ndarray
) -> None:
    """Refuse an image of one class that a symbolic link in another class names
    (``dog/1.png`` to ``../cat/1.png``): one image with two labels. Two links to one file
    (git-annex or DVC objects of two images with the same bytes) and hard links (a
    deduplicated copy) are two images, as in a list file."""
    order = np.lexsort((inodes[:, 1], inodes[:, 0]))  # (N,) by (st_dev, st_ino)
    ranked = inodes[order]
    same = (ranked[1:] == ranked[:-1]).all(axis=1) & (ranked[1:, 1] >= 0)  # (N - 1,)
    twice = np.zeros(len(order), bool)
    twice[1:] |= same
    twice[:-1] |= same
    shared = order[twice]  # (B,) files listed under several names
    if not len(shared):
        return
    by_file: dict[tuple[int, int], list[int]] = {}
    for i in shared.tolist():
        by_file.setdefault(tuple(inodes[i]), []).append(i)
    for names in by_file.values():
        # Each name with its folders resolved and itself not (a link stays a link): a link,
        # and each link it leads to in turn (dog/1.png -> ../cat/1.png, itself a git-annex
        # link), is looked up among the names listed, not only the file it ends at.
        links = [i for i in names if os.path.islink(os.path.join(root, ids[i]))]
        if not links:  # (hard links alone: no path resolved)
            continue
        place = {_unlinked_folders(os.path.join(root, ids[i])): i for i in names}
        other, first = next(
            ((i, j) for i in links for j in _links_named(os.path.join(root, ids[i]), place)
             if labels[i] != labels[j]),
            (None, None),
        )  # fmt: skip
        if other is not None:
            raise ValueError(
                f"Under {root!r}, {ids[other]!r} is a link to {ids[first]!r}: one image in "
                f"the classes {classes[labels[first]]!r} and {classes[labels[other]]!r}, with "
                "two labels. Give each class its own images: remove the link, or copy the "
                "image."
            )


def _unlinked_folders(path: str) -> str:
    """``path`` with its folders' symbolic links resolved, its last name kept as it is."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _links_named(path: str, place: dict[str, int]):
    """The items of ``place`` (a name with :func:`_unlinked_folders`: item) that the
    symbolic link ``path`` names, directly or through the links it leads to in turn."""
    for _ in range(40):  # (the kernel follows at most 40 links)
        if not os.path.islink(path):
            return
        path = _unlinked_folders(os.path.join(os.path.dirname(path), os.readlink(path)))
        if path in place:
            yield place[path]


def _refuse_two_classes(root: str, first: tuple[str, str], then: tuple[str, str]) -> None:
    """Refuse one folder of images walked under two classes (``(class, path)`` each):
    every image in it would be listed twice, with two labels, which no single-label
    training set can hold (torchvision's ImageFolder lists it so, without a word)."""
    (one, one_path), (other, other_path) = first, then
    if one == other:
        return
    one_path, other_path = (os.path.relpath(p, root) for p in (one_path, other_path))
    raise ValueError(
        f"Under {root!r}, the class folders {one!r} and {other!r} reach one folder of images "
        f"({one_path!r} and {other_path!r} are one folder, {os.path.realpath(first[1])!r}): "
        "each of its images would be listed in both classes, with two labels. Give each "
        "class its own images: remove the link, or copy the folder."
    )


# Where git-annex and DVC keep the objects their links name: files, never folders. (A DVC
# cache outside the project, as one shared on a server is, by its objects' names: an md5
# in hex, its first 2 digits a folder, ``files/md5/ab/cdef...`` in DVC 3.)
_OBJECT_STORES = re.compile(
    r"(^|/)(\.git/annex/objects|annex/objects|\.dvc/cache)/|/[0-9a-f]{2}/[0-9a-f]{30}$"
)


def _a_file_s(link: str, by_name: bool = True) -> bool:
    """Whether a symbolic link whose target does not exist is a file's, rather than a
    folder's (``more``): its target is a git-annex or DVC object (``LICENSE`` to
    ``.git/annex/objects/.../SHA256E-s12--ab``), a file not fetched, or, ``by_name``, its
    name has an extension (``gone.jpg``, ``000.json``). (A target's name is no sign: folders
    are named with dots, ``2019.06.01``, as classes are beside the class folders, CUB-200's
    ``001.Black_footed_Albatross``.)"""
    if _OBJECT_STORES.search(os.readlink(link)):
        return True
    return by_name and bool(os.path.splitext(os.path.basename(link))[1])


def _warn_of_left_out(root: str, other: list[str]) -> None:
    """Say which files the ImageFolder convention leaves out: those in the class folders
    whose extension is not an image's, and those in the root itself, outside every class
    (hidden files, such as .DS_Store, and those in hidden folders, such as
    .ipynb_checkpoints, are left out without a word)."""
    # (with links to files that are not there: those to folders were refused)
    in_root = sorted(
        e.path for e in os.scandir(root) if e.is_file() or e.is_symlink() and not e.is_dir()
    )
    for files, where, why in (
        (
            other,
            "in the class folders",
            "only files with an image extension are read (" + ", ".join(IMG_EXTENSIONS) + ")",
        ),
        (in_root, f"in {root!r} itself", "images are read from its class folders only"),
    ):
        files = [
            f
            for f in files
            if not any(_hidden(part) for part in Path(os.path.relpath(f, root)).parts)
        ]
        if files:
            logger.warning(
                "%d %s %s %s left out (%s%s): %s.",
                len(files),
                "file" if len(files) == 1 else "files",
                where,
                "is" if len(files) == 1 else "are",
                ", ".join(repr(os.path.relpath(f, root)) for f in files[:3]),
                ", ..." if len(files) > 3 else "",
                why,
            )


def _not_utf8(names) -> list[str]:
    """The names that are not valid UTF-8 (file names of other encodings, which Python
    holds as surrogates), each shown with its bytes escaped."""
    bad = []
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(os.fsencode(name).decode("utf-8", "backslashreplace"))
    return bad


def _check_utf8(names: list[str], root: str) -> None:
    """Refuse file and folder names that are not UTF-8: the store keeps paths and class
    names as UTF-8 strings."""
    bad = _not_utf8(names)
    if bad:
        shown = ", ".join(repr(b) for b in bad[:5]) + (
            f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        )
        raise ValueError(
            f"{len(bad)} file or folder names under {root!r} are not valid UTF-8: {shown}. "
            "The store records every path as UTF-8 text; rename them (e.g. with convmv)."
        )


#: Class indices from this one up are refused: the store would name every class below.
MAX_CLASS_INDEX = 1 << 20


def is_index(label: str) -> bool:
    """Whether a textual label is a class index: ASCII digits ("٣" is a digit to
    ``str.isdigit``, not a class index here)."""
    return label.isascii() and label.isdigit()


def _is_unlabelled(label: str) -> bool:
    """Whether a textual label is a negative integer, as -1 marks an unlabelled sample."""
    return re.fullmatch(r"-\d+", label) is not None


def text_problem(text: str) -> str | None:
    """Why ``text`` can be no class name in a store, or None: HDF5's strings are UTF-8
    without NUL characters (a JSON label may spell either, "\\u0000" or "\\ud800")."""
    if "\0" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (it holds a lone surrogate)"
    return None


def _check_index_names(names: list[str]) -> None:
    """Class names given for class indices (a class-names file, a ClassLabel feature) name
    each class once, in text a store can hold."""
    # (a blank line of classnames.txt named the class of its line '' and shifted the names
    # it was meant to give onto the next classes)
    empty = next((k for k, name in enumerate(names) if not name.strip()), None)
    if empty is not None:
        raise ValueError(
            f"The class names leave class {empty} without a name; each class needs one (a "
            "blank line of a class names file is a class: remove it, or name the class)."
        )
    for name in names:
        problem = text_problem(name)
        if problem:
            raise ValueError(f"The class name {name!r} {problem}, which a store cannot hold.")
    name, count = collections.Counter(names).most_common(1)[0] if names else ("", 1)
    if count > 1:
        raise ValueError(
            f"The class names give {name!r} {count} times: each class needs a name of its "
            "own, or its per-class results could not be told apart."
        )
    twins = nfc_twins(names)
    if twins:
        raise ValueError(
            f"The class names {_two_forms(*twins)}: each class needs a name of its own, or "
            "its per-class results could not be told apart."
        )


def encode_labels(
    names: list[str], index_names: list[str] | None = None, *, as_names: bool = False
) -> tuple[np.ndarray, list[str]]:
    """Class indices and class names of textual labels.

    Non-negative integers are class indices (class ``k`` is named ``index_names[k]``, or
    ``"k"``), unless ``as_names`` (labels that were strings, not text of numbers); anything
    else (-1 included) is a class name, and the sorted names are the classes.

    Raises
    ------
    ValueError
        If ``index_names`` is given and an index is out of its range, or they name the
        indices' classes but a class twice or in text a store cannot hold
        (:func:`text_problem`); without them, if an index is :data:`MAX_CLASS_INDEX` or
        more (ids, not class indices).
    """
    if not as_names and all(map(is_index, names)):
        indices = [int(name) for name in names]
        largest = max(indices, default=-1)
        if index_names is not None and largest >= len(index_names):
            raise ValueError(
                f"A label is {largest}, but only {len(index_names)} class names are given."
            )
        if index_names is None and largest >= MAX_CLASS_INDEX:
            raise ValueError(
                f"The labels are read as class indices 0..K-1, and the largest, {largest}, "
                f"would make {largest + 1} classes (at most {MAX_CLASS_INDEX} are taken). If "
                "they are codes (ids) rather than indices, label the images by name (e.g. "
                f"'id{largest}'), or number their classes from 0."
            )
        labels = np.array(indices, dtype=np.int64)
        n_classes = largest + 1
        if index_names is None:
            _warn_of_unused_indices(names, labels, n_classes)
            return labels, [str(k) for k in range(n_classes)]
        _check_index_names(index_names)  # (names of labels that are no indices go unread)
        return labels, list(index_names)
    class_names = sorted(set(names))
    twins = nfc_twins(class_names)
    if twins:  # (two classes that print alike, which mr2-probe matches by name as one)
        raise ValueError(
            f"The labels {_two_forms(*twins)}: they would be two classes that print alike. "
            "Spell them alike."
        )
    return np.searchsorted(class_names, names).astype(np.int64), class_names


def _warn_of_unused_indices(names: list[str], labels: np.ndarray, n_classes: int) -> None:
    """Say where class indices leave classes without images (indices counted from 1, say)
    or two spellings of one index are one class ("01" and "1")."""
    empty = np.flatnonzero(np.bincount(labels, minlength=n_classes) == 0)
    if len(empty):
        shown = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
        logger.warning(
            "The labels are class indices 0..%d, and %d of these classes %s no image (%s): "
            "they stay among the store's class names%s.",
            n_classes - 1,
            len(empty),
            "has" if len(empty) == 1 else "have",
            shown,
            " (labels counted from 1 leave class 0 empty)" if empty.tolist() == [0] else "",
        )
    spellings: dict[int, list[str]] = {}
    for name in sorted(set(names)):  # each distinct label once
        spellings.setdefault(int(name), []).append(name)
    merged = next((texts for texts in spellings.values() if len(texts) > 1), None)
    if merged:
        logger.warning(
            "The labels %s are one class index, %d: they are the same class.",
            " and ".join(repr(t) for t in merged[:3]),
            int(merged[0]),
        )


_DECIMAL = (
    "is a whole number written as a decimal (as pandas writes integers in a column that held "
    "a missing value)"
)
_AS_TEXT = (
    "the classes sorted as text (class %d is %r); write the labels as integers ('2') to read "
    "them as class indices."
)


def renumbered_decimal(texts: list[str]) -> tuple[int, int, str] | None:
    """``(i, k, name)`` where every label is a whole number written as a decimal ("2.0", as
    pandas writes integers in a column that held a missing value), read as class names
    sorted as text, and label i's class ``k`` is not the number it spells (class 4 was
    "2.0" of 12 classes, without a word); None otherwise. A negative one (-1.0, as pandas
    writes the -1 of unlabelled samples) is no class index, but sorts first and moves the
    others ("0.0" was class 1, without a word)."""
    if not all(re.fullmatch(r"-?\d+\.0+", text) for text in texts):
        return None
    order = {text: k for k, text in enumerate(sorted(set(texts)))}
    moved = next(
        (i for i, text in enumerate(texts) if order[text] != float(text) and text[0] != "-"),
        None,
    )
    return None if moved is None else (moved, order[texts[moved]], texts[moved])


def numbers_sorted_as_text(texts: list[str]) -> tuple[int, int, str] | None:
    """``(i, k, name)`` where every label is ASCII digits, read as a class name, and the
    classes sorted as text are not in the order of their numbers ("10" before "2"): label
    i is the first whose class ``k`` is not where its number puts it; None otherwise."""
    if not texts or not all(map(is_index, texts)):
        return None
    names = sorted(set(texts))
    numeric = sorted(names, key=lambda name: (int(name), name))
    k = next((k for k, (a, b) in enumerate(zip(names, numeric, strict=True)) if a != b), None)
    return None if k is None else (texts.index(names[k]), k, names[k])


def label_kind_problem(labels: list[str], as_names: bool = False) -> tuple[int, str] | None:
    """``(i, why)`` when label i cannot be a class: an empty (or blank) label, a negative
    integer among class indices or where every label is one (an unlabelled sample; among
    names such as "+1" it is a name), or a class name where
    other labels are class indices (ASCII digits): one such label would make every label a
    class name, sorted as text ("10" before "2"), and renumber the classes. None otherwise.
    (List files keep reading such a mix as names, with a warning.) With ``as_names``
    (labels that were strings) digits are names too."""
    if "" in labels:
        return labels.index(""), "which is empty: every sample needs a label"
    digits = [is_index(label) for label in labels]
    indices = [d and not as_names for d in digits]
    if all(indices):
        return None
    unlabelled = [_is_unlabelled(label) for label in labels]
    if all(unlabelled) or (any(digits) and any(unlabelled)):  # names may be "-1" and "+1"
        i = unlabelled.index(True)
        return i, (
            f"which is no class index ({labels[i]} marks an unlabelled sample, as in test splits)"
        )
    if not any(indices):
        return None
    example = labels[indices.index(True)]
    return indices.index(False), (
        f"a class name, where other samples have class indices (e.g. {example!r})"
    )


def _source_hint(path: Path) -> str:
    """What a file that is not a list file may have been meant as, by its extension."""
    suffix = "".join(path.suffixes[-2:]).lower()
    if suffix.endswith(".tar"):
        return (
            f" For WebDataset shards, write 'webdataset:{path}'; extract an archive of class "
            "folders, and give its folder."
        )
    if suffix.endswith((".tar.gz", ".tgz", ".zip")):  # (webdataset: takes no compressed tar)
        hint = " An archive is no source: extract it, and give its folder of class folders"
        if suffix.endswith(".zip"):  # (WebDataset shards are tar files, never zips)
            return hint + "."
        return hint + " (or decompress WebDataset shards, and write 'webdataset:PATTERN')."
    if suffix.endswith((".parquet", ".arrow")):
        return f" For a Parquet or Arrow file, write 'parquet:{path}'."
    if suffix.endswith(IMG_EXTENSIONS):
        return " A single image is no source: give its folder, or a list file naming it."
    return ""


def _tabs_in_its_paths(folder: Path, text: list[str]) -> bool:
    """Whether a list whose every line holds a tab is ``path label`` lines with the tabs in
    their paths: split at its tabs a line names no file, at its last blank one that exists
    (a blank-separated list of files whose names hold tabs, read as the file 'a' of a class
    'b/1.png cat'; two tabs in a name split it into three fields). The first line whose
    splits differ and that names a file one way alone decides: one list, one format, and a
    look-up or two, not two for each line of a tab-separated list of labels with blanks."""

    def readings(line: str):
        at_tab = re.split(r"\t+", line.strip())
        at_blank = line.rsplit(None, 1)
        if len(at_blank) != 2 or len(at_tab) == 2 and at_tab[0].strip() == at_blank[0].strip():
            return None
        return at_tab, at_blank

    return _first_deciding_line(folder, text, readings)


def _quoted_as_csv_quotes(folder: Path, text: list[str]) -> bool:
    """Whether a tab-separated list quotes its fields as the csv module does
    (``csv.writer(f, delimiter="\\t", quoting=csv.QUOTE_ALL)``: ``"cat/000.png"<TAB>"cat"``):
    split at its tabs, such a line named the file ``"cat/000.png"``, quotes included, of a
    class ``"cat"``. The first line whose two readings differ and that names a file one way
    alone decides (a name that holds a quote character is read as it stands where it
    exists)."""

    def readings(line: str):
        if '"' not in line:
            return None
        try:
            quoted = next(csv.reader([line.strip()], delimiter="\t"))
        except csv.Error:
            return None
        plain = re.split(r"\t+", line.strip())
        if len(quoted) != 2 or len(plain) == 2 and plain[0].strip() == quoted[0].strip():
            return None
        return plain, quoted

    return _first_deciding_line(folder, text, readings, _quoted_whole(_CSV_QUOTED))


# A field quoted whole as the csv module quotes it (a quote in it doubled: '"a""b"'), and as
# a shell quotes it (shlex.quote: "'a b'", or in double quotes).
_CSV_QUOTED = r'"(?:[^"]|"")+"'
_SHELL_QUOTED = r"'[^']+'|\"[^\"]+\""


def _quoted_whole(quoted: str) -> Callable[[str], bool | None]:
    """An ``undecided`` of :func:`_first_deciding_line` that gives True where the first line
    of a list whose two readings differ begins with a path quoted whole
    (``"c/img9"<TAB>"cat"``, ``'c/img9' cat``, as the csv module and ``shlex.quote`` write them,
    matched by the pattern ``quoted``): where no file tells the readings apart, its images
    missing, that is quoting, not a name (no extension told, and ``'c/img9'`` was recorded with
    its quotes, where the image found was 'c/img9'; '"a""b"' with them, where found it was
    'a"b'). None: as :func:`_first_deciding_line` decides."""
    whole = re.compile(rf"\s*(?:{quoted})\s")
    return lambda first: True if whole.match(first) else None


def _unquoted_label(label: str, shell: bool) -> str:
    """A label of a tab- or blank-separated list read as its format reads a quoted field
    (``a/1.png<TAB>"cat"``, ``a/1.png 'cat'``, as csv.writer and ``shlex.quote`` quote labels:
    its quotes were kept, a class '"cat"'): a label that starts with a quote is read as the
    csv module reads a field (tab-separated) or as a shell reads a word (blank-separated),
    where that reads it as one field; else, and for a quote within it (``it's``), as written."""
    if label[:1] not in ("'\"" if shell else '"'):
        return label
    try:
        if shell:
            fields = _shell_split(label)
        else:
            fields = next(csv.reader([label], delimiter="\t", strict=True))
    except (ValueError, csv.Error):  # (a quote left open, or text after the closing one)
        return label
    return fields[0] if len(fields) == 1 else label


def _csv_quoting(text: str) -> bool:
    """Whether csv may split ``text`` otherwise than at its delimiters: it holds a quote, a
    line break or a NUL (lines joined, whether any of them does)."""
    return '"' in text or "\r" in text or "\n" in text or "\0" in text


def _csv_fields(line: str, delimiter: str = ",") -> list[str]:
    """``next(csv.reader([line], delimiter=delimiter))``; a line without a quote, a line
    break or a NUL, shorter than csv's field limit, is split at its delimiters without it,
    as csv splits it (a reader a line took about 5 µs: 2.7 s of CPU to tell how to read a
    list of 200,000 lines separated by semicolons). (An empty line is no field: [].)"""
    if _csv_quoting(line) or not line or len(line) >= csv.field_size_limit():
        return next(csv.reader([line], delimiter=delimiter))
    return line.split(delimiter)


# An image's extension, in any case, before a separator (a blank, a comma or a semicolon): a
# list without a quote and without one has no line whose path, split at that separator, is
# an image's (:func:`_an_image_read_otherwise_alone`). (It matches more: a prefilter.)
_EXTENSIONS = "|".join(map(re.escape, IMG_EXTENSIONS))
_AN_IMAGE_BEFORE_A_COMMA = re.compile(rf"(?:{_EXTENSIONS})[\s,]", re.IGNORECASE)
_AN_IMAGE_BEFORE_A_SEMICOLON = re.compile(rf"(?:{_EXTENSIONS})[\s;]", re.IGNORECASE)
_AN_IMAGE_BEFORE_A_SEPARATOR = (_AN_IMAGE_BEFORE_A_SEMICOLON, _AN_IMAGE_BEFORE_A_COMMA)


def _separated_by_semicolons(folder: Path, text: list[str], commas: bool) -> bool:
    """Whether a list is CSV separated by semicolons (``cat/000.png;cat``, as spreadsheet
    programs write CSV where a comma is the decimal separator): every line splits into two
    fields at a semicolon (quoted as the csv module quotes), and the first line whose two
    readings differ names a file that way alone (a file name with a semicolon, in a list
    separated otherwise, is read as it stands), or, where it names none (its images not
    found, or not yet there), a line read otherwise is no ``path label`` line and none
    names an image read otherwise alone, unless its first line is a ``path;label`` header
    or a line names an image read at its semicolons alone, or, where every line reads
    otherwise too, a line names an image read at its semicolons alone and none otherwise.
    ``commas``: the list is read as comma CSV (a comma in it), else at its last blank or
    its tab."""
    lines = [line for line in text if line.strip()]
    if not lines or not all(";" in line for line in lines):
        return False
    # (Split as csv splits them, a line without a quote, a line break or a NUL at each
    # semicolon, shorter than csv's field limit: where every line is one, one semicolon a
    # line is two fields a line.)
    flat = "".join(lines)
    plain = not _csv_quoting(flat)
    if plain and max(map(len, lines)) < csv.field_size_limit():
        if flat.count(";") != len(lines):
            return False
    else:
        try:
            if any(len(_csv_fields(line, ";")) != 2 for line in lines):
                return False
        except csv.Error:
            return False

    def readings(line: str):
        if commas:
            try:
                usual = _csv_fields(line)
            except csv.Error:
                usual = []
        elif "\t" in line.strip():
            usual = re.split(r"\t+", line.strip())
        else:
            usual = line.rsplit(None, 1)
        return usual, _csv_fields(line, ";")

    def refused(line: str) -> bool:  # read otherwise: no comma field, or blank, splits it
        if not commas:
            return len(line.rsplit(None, 1)) != 2  # (a tab in it: at a tab, or in its path)
        try:
            return len(_csv_fields(line)) != 2
        except csv.Error:
            return True

    # (read otherwise, a list of missing images was refused: "expected 'path,label', got
    # 'cat/000.png;cat'", where a comma-separated one records them as failed; a line that
    # names a file whole, 'a;b.png', is a file without a label, refused still)
    # Nor where a line's path read otherwise is an image's and read at its semicolons is
    # none ('x;1.png 3' read as 'x' of a class '1.png 3'): its lines are read otherwise, and
    # the line refused is named ("x;1.png 3\ny;2.png" was refused at line 1 as a header).
    # (Unless its first line is a 'path;label' header, or a line's path read at its
    # semicolons is an image's alone: 'path;label\nx;1.png 3' was refused at its header.)
    # (And where every line reads otherwise too, its labels with blanks, its images are
    # read at its semicolons where a line names an image so alone and none otherwise alone:
    # 'a/1.png;golden retriever' was the image 'a/1.png;golden' of a class 'retriever'.)
    # (Worked out where no file decides alone, both ways in one scan of the lines, each
    # line's two readings worked out once, up to the line that decides (``stop``: the way
    # whose image alone decides; the other way's is the one needed), where each way read
    # every line's readings again; not kept, a list of 200,000 lines' readings. Where no
    # line has an image's extension before a separator, as 'a.png;b c' has none before a
    # blank, no line names an image so, and that way needs no line read.)
    def alone(stop: int) -> list[bool]:  # lines name images read alone: at ';', otherwise
        joined = "\0".join(lines) if plain else ""
        maybe = [not plain or bool(b.search(joined)) for b in _AN_IMAGE_BEFORE_A_SEPARATOR]
        found = [False, False]
        for usual, other in map(readings, lines) if maybe[1 - stop] else ():
            found[0] = found[0] or maybe[0] and _an_image_read_otherwise_alone(other, usual)
            found[1] = found[1] or maybe[1] and _an_image_read_otherwise_alone(usual, other)
            if found[stop] or found[1 - stop] and not maybe[stop]:
                break
        return found

    def undecided(_: str) -> bool:
        first = next(filter(refused, lines), None)
        if first is None:
            semicolons, otherwise = alone(stop=1)
            return semicolons and not otherwise
        if os.path.lexists(folder / first.strip()):
            return False
        if [f.strip().lower() for f in readings(lines[0])[1]] == ["path", "label"]:
            return True
        semicolons, otherwise = alone(stop=0)
        return not otherwise or semicolons

    return _first_deciding_line(folder, lines, readings, undecided=undecided)


def _an_image_read_otherwise_alone(usual: list[str], other: list[str]) -> bool:
    """Whether a line's path names an image (by its extension) read the usual way alone,
    not read the other way (``readings`` of :func:`_first_deciding_line`)."""
    return (
        len(usual) == 2
        and has_file_allowed_extension(usual[0].strip(), IMG_EXTENSIONS)
        and not (other and has_file_allowed_extension(other[0].strip(), IMG_EXTENSIONS))
    )


_BLOCK = 64  # lines of a list read at once by :func:`_first_deciding_line`


def _first_deciding_line(
    folder: Path,
    text: list[str],
    readings,
    undecided: Callable[[str], bool | None] | None = None,
) -> bool:
    """Whether a list's lines are read the other way: ``readings(line)`` gives a line's two
    readings as ``path label`` fields, the usual one and the other (None where they do not
    differ), and the first line whose readings differ decides: the reading that alone
    names a file in ``folder`` (the other: True); where neither does (its images missing)
    and one reading's path alone is an image's by its extension, ``undecided(first)``, given
    the first line whose readings differ (worked out there alone), or where that is None,
    that reading (neither: the next such line, as for a header, '"path"<TAB>"label"', or a
    first image missing of a list whose later ones are there, 'img1;golden retriever'
    before 'img2;dog x'); a list without such a line is read as usual (``undecided(first)``:
    True, the other way). Two look-ups a list, not two a line (every line of a tab- or
    semicolon-separated list of labels with blanks differs: its images missing, 200,000
    lines took 400,000), and for lines that no extension tells apart, a listing of each of
    their folders (:class:`_Lexists`). ``readings`` is asked of a block of lines at a time,
    lines after the one that decides too: it raises nothing."""
    lexists, first = _Lexists(folder), None
    # (Read a block of lines at a time, a block that no line of can decide passed over at
    # once (:func:`_may_decide`). A block of 64: a block's readings alive when the garbage
    # collector runs are moved to its older generations, which it then scans whole; blocks
    # of 4,096 lines made a list of 200,000 slower than one read line by line.)
    for start in range(0, len(text), _BLOCK):
        block = text[start : start + _BLOCK]
        pairs = list(map(readings, block))
        if first is None:
            read = zip(block, pairs, strict=True)
            first = next((line for line, pair in read if pair is not None), None)
        if not _may_decide(pairs, lexists):
            continue
        for pair in pairs:
            if pair is None:
                continue
            named = [len(f) == 2 and lexists(f[0].strip()) for f in pair]
            if named[0] != named[1]:
                return named[1]
            # (where no extension tells them apart, a later line's file does: 'img1;golden
            # retriever' missing, 'img2;dog x' present, read at its blanks at the first line)
            other_alone = _an_image_read_otherwise_alone(*pair[::-1])
            if other_alone or _an_image_read_otherwise_alone(*pair):
                decided = None if undecided is None else undecided(first)
                return other_alone if decided is None else decided
    return first is not None and undecided is not None and bool(undecided(first))


# An image's extension ending a name of names joined by NULs (:func:`_may_decide`).
_AN_IMAGES_NAME = re.compile(rf"(?:{_EXTENSIONS})(?:\0|\Z)", re.IGNORECASE)


def _may_decide(pairs: list, lexists: _Lexists) -> bool:
    """Whether a line of ``readings`` ``pairs`` (:func:`_first_deciding_line`) may decide: a
    reading's path is an image's by its extension, or it may name a file (:meth:`_Lexists.
    none_of`). Asked of a block of lines at once: a list of 200,000 lines of missing images
    without extensions, every line's two readings differing, had each line's paths looked
    up and asked for an extension one by one (1 s of CPU)."""
    paths = [f[0].strip() for pair in pairs if pair is not None for f in pair if len(f) == 2]
    if not paths:
        return False
    return bool(_AN_IMAGES_NAME.search("\0".join(paths))) or not lexists.none_of(paths)


class _Lexists:
    """``os.path.lexists(os.path.join(folder, name))``, the first 64 names of a folder looked
    up one by one (a short list in a folder of a million files lists none, nor a list of one
    image a folder any), later ones in a listing of their folder, one listing a folder (a
    name found there, in any case or Unicode form, as a file system may match it, looked up
    still): a list of 200,000 lines whose images were missing, no extension telling their
    two readings apart ('scans/0001;golden retriever'), took 400,000 look-ups to tell how to
    read it."""

    def __init__(self, folder: str | os.PathLike, one_by_one: int = 64) -> None:
        self.folder, self.one_by_one = os.fspath(folder), one_by_one
        self.listed: dict[str, tuple[set[str], set[str]] | None] = {}
        self.asked: collections.Counter[str] = collections.Counter()

    def none_of(self, names: list[str]) -> bool:
        """Whether no name of ``names`` exists, told without a look-up: each one's folder
        listed (as a call would list it: a folder asked about 64 times), none of them found
        there, in any spelling. False where that cannot be told so (a name looked up one by
        one, or found in its folder's listing)."""
        if os.name == "nt" and ":" in "".join(names):  # (looked up one by one, as below)
            return False
        if os.altsep is not None:
            names = [name.replace(os.sep, os.altsep) for name in names]
        bases_in = collections.defaultdict(list)
        for where, slash, base in map(methodcaller("rpartition", "/"), names):
            bases_in[where + slash].append(base)
        for where, bases in bases_in.items():
            if self.asked[where] < self.one_by_one or {"", ".", ".."}.intersection(bases):
                return False
            if where not in self.listed:
                self.listed[where] = _spellings_listed(os.path.join(self.folder, where))
            listed = self.listed[where]
            if listed is None:
                return False
            if not listed[0]:
                continue
            if "".join(bases).isascii():
                spelt = set(map(str.lower, bases)), set(map(str.upper, bases))
            else:
                spellings = list(map(_spellings, bases))
                spelt = {f for f, _ in spellings}, {c for _, c in spellings}
            if not (spelt[0].isdisjoint(listed[0]) and spelt[1].isdisjoint(listed[1])):
                return False
        return True

    def __call__(self, name: str) -> bool:
        spelt = name if os.altsep is None else name.replace(os.sep, os.altsep)
        where, slash, base = spelt.rpartition("/")  # (its folder as it spells it: 'a/')
        where += slash
        self.asked[where] += 1
        # (one by one too: '.', '..', a folder, or on Windows a name that a drive's working
        # folder may hold, 'C:a.png')
        one_by_one = self.asked[where] <= self.one_by_one
        if one_by_one or base in ("", ".", "..") or os.name == "nt" and ":" in name:
            return os.path.lexists(os.path.join(self.folder, name))
        if where not in self.listed:
            self.listed[where] = _spellings_listed(os.path.join(self.folder, where))
        listed = self.listed[where]
        if listed is not None and not (
            listed[0] and any(map(set.__contains__, listed, _spellings(base)))
        ):
            return False
        return os.path.lexists(os.path.join(self.folder, name))


def _spellings(name: str) -> tuple[str, str]:
    """Two spellings alike for names that a file system which ignores case or Unicode forms
    takes for one: case folded, and in capitals (as NTFS compares them: 'ı' is 'I'), each
    decomposed (NFD)."""
    if name.isascii():
        return name.lower(), name.upper()
    name = unicodedata.normalize("NFD", name)
    return tuple(unicodedata.normalize("NFD", f(name)) for f in (str.casefold, str.upper))


def _spellings_listed(folder: str) -> tuple[set[str], set[str]] | None:
    """The :func:`_spellings` of the names in a folder (none where there is no such folder);
    None where it cannot be listed (its names looked up one by one)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return set(), set()
    except (OSError, ValueError):
        return None
    if all(map(str.isascii, names)):
        return set(map(str.lower, names)), set(map(str.upper, names))
    spellings = list(map(_spellings, names))
    return {folded for folded, _ in spellings}, {capitals for _, capitals in spellings}


def _quoted_as_a_shell_does(folder: Path, text: list[str]) -> bool:
    """Whether a blank-separated list quotes its fields as a shell does (``'my dir/1.jpg' 3``,
    ``"a.jpg" "golden retriever"``, as ``shlex.quote`` writes them, or ``my\\ dir/1.jpg 3``,
    as ``printf %q`` and a shell's completion write them): read at the last blank, such a
    line named the file ``'my dir/1.jpg'``, quotes included, recorded as failed. The first
    line whose two readings differ and that names a file one way alone decides (a name
    that holds a quote character, ``"it's".jpg``, is read as it stands where it exists)."""

    def readings(line: str):
        if "'" not in line and '"' not in line and "\\" not in line:
            return None
        try:
            quoted = _shell_split(line)
        except ValueError:  # (no closing quotation: an apostrophe in a name)
            return None
        plain = line.rsplit(None, 1)
        if len(quoted) != 2 or len(plain) == 2 and plain[0].strip() == quoted[0]:
            return None
        return plain, quoted

    return _first_deciding_line(folder, text, readings, _quoted_whole(_SHELL_QUOTED))


def _shell_split(line: str) -> list[str]:
    """``shlex.split(line)``; a line without a quote or a backslash is split at its blanks
    without it (shlex took about 10 µs a line, most of the time a list of 100,000 lines
    took to read where only some of its lines are quoted)."""
    if "'" not in line and '"' not in line and "\\" not in line:
        return re.findall(r"[^ \t\r\n]+", line)  # (shlex's blanks, not str.split's)
    return shlex.split(line)


_AS_A_SHELL = (
    " The list's lines are read as a shell reads them (other lines quote their paths so), "
    "and this one names no file as it stands: quote a path or a label that holds a blank "
    "or a quote ('my dir/1.jpg' 'golden retriever', as shlex.quote writes them)."
)


def _shell_fields(folder: Path, line: str) -> list[str]:
    """The fields of a line of a list quoted as a shell quotes them (``shlex.split``); its
    fields split at its last blank where that names a file and the shell's name differs,
    as for a name written as it stands in such a list, with an apostrophe, a backslash or
    blanks (``it's.png 1``, ``Tom's and Ann's.png``: unquoted, that one named the file
    ``Toms and Anns.png``, recorded as failed). A look-up for a line whose two names differ
    alone.

    Raises
    ------
    ValueError
        From ``shlex.split`` (a quote left open), where the line names no file as it stands.
    """
    plain = line.rsplit(None, 1)
    try:
        quoted, error = _shell_split(line), None
    except ValueError as err:
        quoted, error = None, err
    # (Its name alone: a line whose readings differ in its label alone, 'a.jpg "cat"',
    # is read as a shell reads it, its label unquoted.)
    if len(plain) == 2 and (quoted is None or quoted[:1] != [plain[0].strip()]):
        if os.path.lexists(os.path.join(folder, plain[0].strip())):
            # its label as a shell reads it ("it's.png 'cat'" made a class "'cat'")
            try:
                label = _shell_split(plain[1])
            except ValueError:  # (an apostrophe in a label: read as it stands)
                label = None
            return [plain[0], label[0]] if label and len(label) == 1 else plain
    if error is not None:
        raise error
    return quoted


# A line of a blank-separated list whose path or label, quoted as a shell quotes it, holds
# a comma ('"a,b.png" cat', "\"it's,a.png\" cat", 'a.png "x, y"'): no CSV line ('"a,b.png",cat'
# has its comma after the quote, 'a.png,"x, y"' before it).
_QUOTED_COMMA = re.compile(
    r"""\s*("[^"]*,[^"]*"|'[^']*,[^']*')\s+[^\s,]|.*[^\s,]\s+("[^"]*,[^"]*"|'[^']*,[^']*')\s*$"""
)


def _commas_in_its_names(folder: Path, text: list[str]) -> str | None:
    """Whether a list with a comma is ``path label`` lines separated by blanks, the commas
    in their file names (read as CSV, 'a,b.png cat' was the image 'a' of a class 'b.png
    cat', and a line without a comma refused): every line splits in two at its blanks, and
    the first line with a comma whose two readings differ decides, where its path or its
    label is quoted as a shell quotes it ('"a,b.png" cat', 'a.png "x, y"': "shell", where
    read as CSV the image 'a.png "x' of a class 'y"' failed) or where read at its blanks
    alone it names a file, or, named neither way (its images missing), its path read so
    alone is an image's by its extension ("blank"); None: the list is CSV (where no
    extension tells either, said by :func:`_warn_of_commas_read_as_csv`)."""
    lines = [line for line in text if line.strip()]
    if not all(len(line.split(None, 1)) == 2 for line in lines):
        return None
    for line in lines:
        if "," not in line:
            continue
        if _QUOTED_COMMA.match(line):
            return "shell"
        try:
            usual = next(csv.reader([line]))
        except csv.Error:
            usual = []
        path = line.rsplit(None, 1)[0].strip()
        if len(usual) == 2 and usual[0].strip() == path:
            continue
        # (os.path's isfile: a name too long for the file system is no file, not an error;
        # named neither way, it decides all the same: a CSV list of labels with blanks, its
        # images missing, was looked up twice a line)
        if len(usual) == 2 and os.path.isfile(folder / usual[0].strip()):
            return None
        if os.path.isfile(folder / path):
            return "blank"
        # (its images missing, 'a,b.png cat' was read as CSV, the image 'a' of a class
        # 'b.png cat', where found it was read at its blanks)
        return "blank" if _an_image_read_otherwise_alone(line.rsplit(None, 1), usual) else None
    return None


def _warn_of_commas_read_as_csv(
    list_file: Path, text: list[str], sizes: np.ndarray, delimiter: str | None
) -> None:
    """Say where a list read as CSV may be 'path label' lines with commas in their file
    names (:func:`_commas_in_its_names`): every line splits in two at its blanks, no image
    is found, and at its first line with a comma whose two readings differ no image's
    extension tells them apart ('scan1,x golden' was the image 'scan1' of a class 'x
    golden', unsaid, where 'scan1,x' of a class 'golden' was meant). Not where the path
    read at its blanks holds no comma ('my scans/0001,cat' is no 'my' of a class
    'scans/0001,cat'), or one only at its end ('img1, cat'), or the line quotes its path as
    CSV does ('"my scans/0001",cat'), or a blank follows its comma, as CSV is written by
    hand ('n01, golden retriever': a file 'n01, golden' would have been found, and the list
    read at its blanks; a folder so named is no image)."""
    if delimiter != "," or (sizes != NOT_A_FILE).any():
        return
    if not all(len(line.split(None, 1)) == 2 for line in text if line.strip()):
        return
    for number, line in enumerate(text, 1):
        if "," not in line:
            continue
        usual, blank = next(csv.reader([line])), line.rsplit(None, 1)
        if len(usual) == 2 and usual[0].strip() == blank[0].strip():
            continue
        header = [f.strip().lower() for f in usual] == ["path", "label"]  # ('path, label')
        # (or CSV by its extension or its quotes, or no comma in the name read otherwise but
        # the one that ends it: 'img1, cat', as CSV is written with a blank after its commas)
        csv_alone = _an_image_read_otherwise_alone(usual, blank) or line[:1] == '"'
        if header or csv_alone or "," not in blank[0].strip().rstrip(","):
            return
        # ('n01, golden retriever': every CSV list so written of labels with a blank was said
        # to be the file 'n01, golden' of a class 'retriever')
        if len(usual) > 1 and usual[1][:1].isspace():
            return
        logger.warning(
            "%s:%d: %r is read as CSV, the image %r of a class %r, where at its last blank it "
            "reads as %r of a class %r: no image of the list is found, and no extension tells "
            "the two apart. If its lines are 'path label' lines with a comma in a file name, "
            "quote that name as a shell quotes it (%s); if the list is CSV, put the header "
            "'path,label' before its first line.",
            list_file, number, line.strip(), usual[0].strip(), usual[1].strip(),
            blank[0].strip(), blank[1].strip(), _its_name_quoted(line),
        )  # fmt: skip
        return


def _its_name_quoted(line: str) -> str:
    """A 'path label' line with its path quoted as a shell quotes it, in the quote that its
    path holds none of, and its label as written, quoted where it holds a blank
    ('"x,y.png" "golden retriever"'; '"a,b.jpg" cat' where the line splits no such way)."""
    fields = re.fullmatch(r"""(.+?)\s+("[^"]*"|'[^']*'|\S+)""", line.strip())
    path, label = fields.groups() if fields else ("a,b.jpg", "cat")
    quote = "'" if '"' in path else '"'
    return f"{quote}{path}{quote} {label}"


def _commas_advice(text: list[str]) -> str:
    """What to do where a line of a list read as CSV (a comma in it) is no 'path,label'
    line but a 'path label' one: write it as CSV; or, for 'path label' lines with a comma
    in a file name (the first line with a comma named), quote that name as a shell quotes
    it, which reads the list as blank-separated (:func:`_commas_in_its_names`). The first
    cure alone where another line is a CSV line and no 'path label' one (no blank splits
    it, 'a.png,cat', or its path read as CSV alone is an image's, 'a.png,golden
    retriever'): that cure, quoting 'a.png,golden' as a name, applied to no line of it."""
    csv_line = next(((n, line) for n, line in enumerate(text, 1) if _a_csv_line_alone(line)), None)
    if csv_line is not None:
        number, line = csv_line
        return (
            f"(the list is read as CSV, as line {number}, {line.strip()!r}, is: write each "
            "line 'path,label', a file name with a comma quoted, \"a,b.jpg\",cat)."
        )
    number, line = next((n, line) for n, line in enumerate(text, 1) if "," in line)
    return (
        f"(the list is read as CSV, as line {number}, {line.strip()!r}, holds a comma: write "
        "each line 'path,label', a file name with a comma quoted, \"a,b.jpg\",cat; or, for "
        "'path label' lines with a comma in a file name, quote that name as a shell quotes "
        f"it, {_its_name_quoted(line)})."
    )


def _a_csv_line_alone(line: str) -> bool:
    """Whether a line is a 'path,label' line of CSV and no 'path label' one with a comma in
    its path: no blank splits it in two, or its path read as CSV alone is an image's (by its
    extension: 'a.png,golden retriever', not 'a,b.png cat')."""
    if "," not in line:
        return False
    try:
        fields = next(csv.reader([line]))
    except csv.Error:
        return False
    if len(fields) != 2:
        return False
    return len(line.split(None, 1)) != 2 or _an_image_read_otherwise_alone(
        fields, line.rsplit(None, 1)
    )


def _list_format(folder: Path, text: list[str]) -> str | None:
    """How the lines of a list file's ``text`` split into fields, its paths relative to
    ``folder`` where a file's existence tells two readings apart: ",", "csv-semicolon",
    "\t", "csv-tab", "shell" or None (at the last blank)."""
    # A comma anywhere makes the list CSV (a file name with a comma is then quoted), but in
    # the file names of 'path label' lines (:func:`_commas_in_its_names`); a tab on every
    # line, a list of tab-separated fields, whose labels may hold blanks ("golden
    # retriever" was split at its blank, its path taking "golden" after the tab). A tab
    # that begins or ends a line (an indented list, a trailing tab) separates no fields,
    # nor one in a file name of a blank-separated list (:func:`_tabs_in_its_paths`). A
    # semicolon on every line may separate its fields, as spreadsheet programs write CSV
    # where a comma is the decimal separator (:func:`_separated_by_semicolons`).
    commas = any("," in line for line in text)
    if _separated_by_semicolons(folder, text, commas):
        return "csv-semicolon"
    if commas:
        blank = _commas_in_its_names(folder, text)
        if blank is None:
            return ","
        if blank == "shell":
            return "shell"
    if all("\t" in line.strip() for line in text if line.strip()) and not _tabs_in_its_paths(
        folder, text
    ):
        return "csv-tab" if _quoted_as_csv_quotes(folder, text) else "\t"
    return "shell" if _quoted_as_a_shell_does(folder, text) else None


def _list_rows(
    list_file: Path, folder: Path, text: list[str], delimiter: str | None
) -> Iterator[list]:
    """``[path, label, line number]`` of each line of a list file's ``text``, split as
    ``delimiter`` says (:func:`_list_format`), one line at a time; in a list quoted as a
    shell quotes, a line's path relative to ``folder`` where a file's existence tells two
    readings of it apart (:func:`_shell_fields`)."""
    for number, line in enumerate(text, 1):
        if not line.strip():
            continue
        if "\0" in line:  # no file name holds one (os.stat: "embedded null byte"), nor text
            raise ValueError(f"{list_file}:{number}: the line {line!r} holds a NUL byte.")
        try:
            if delimiter == ",":
                fields = next(csv.reader([line]))
            elif delimiter == "\t":  # (a label quoted as the csv module quotes, unquoted)
                fields = re.split(r"\t+", line.strip())
                fields[1:] = [_unquoted_label(f, shell=False) for f in fields[1:]]
            elif delimiter == "csv-tab":  # (the csv module's quotes, on every field)
                fields = next(csv.reader([line.strip()], delimiter="\t"))
            elif delimiter == "csv-semicolon":
                fields = next(csv.reader([line], delimiter=";"))
            elif delimiter == "shell":
                fields = _shell_fields(folder, line)
            else:  # (a label quoted as a shell quotes, unquoted)
                fields = line.rsplit(None, 1)
                fields[1:] = [_unquoted_label(f, shell=True) for f in fields[1:]]
        except (csv.Error, ValueError) as err:  # e.g. a field over csv's limit: a JSON file
            # given by mistake; a quote left open in a list quoted as a shell does
            raise ValueError(
                f"{list_file}:{number}: not a 'path,label' line ({err})."
                + (_AS_A_SHELL if delimiter == "shell" else _source_hint(list_file))
            ) from None
        if len(fields) > 2 and delimiter == "shell":  # (one field: no label, quoted or not)
            raise ValueError(
                f"{list_file}:{number}: expected 'path,label', got {line!r}." + _AS_A_SHELL
            )
        if len(fields) != 2:
            raise ValueError(
                f"{list_file}:{number}: expected 'path,label', got {line!r} "
                + (
                    "(a list file has no comment syntax: remove the line)."
                    if line.lstrip().startswith("#")  # ('# made by ...', said as CSV's)
                    else _commas_advice(text)
                    if delimiter == "," and len(line.split(None, 1)) == 2
                    else "(a list with a comma is read as CSV: quote a file name that holds "
                    'one, "a,b.jpg",cat).'
                )
                + _source_hint(list_file)
            )
        yield [f.strip() for f in fields] + [number]


def _list_folder_and_rows(list_file: Path, text: list[str]) -> tuple[Path, list[list], str | None]:
    """The folder a list's relative paths are resolved against, its rows
    (:func:`_list_rows`, split where a file's existence decides, in that folder) and how
    they were split there (:func:`_list_format`): the list
    file's, as named; for a list that is a symbolic link to a list elsewhere (a dataset's
    list linked into a project), its target's where the first line whose path names a file
    in one of the two alone names it there, and where its lines are 'path,label' lines
    read there. (A list kept by git-annex or DVC, a link to an object in their store, keeps
    its own folder: no image lies beside the object.) Each line is read once, and read
    both ways as far as that first line alone, where the two folders read it otherwise."""
    named, target = list_file.parent, Path(os.path.realpath(list_file)).parent
    delimiter = _list_format(named, text)
    here = _list_rows(list_file, named, text, delimiter)
    if target == Path(os.path.realpath(named)):
        return named, list(here), delimiter
    other_delimiter = _list_format(target, text)
    # (split alike, with no look-up, the lines are the same rows in either folder)
    there = None
    if other_delimiter != delimiter or delimiter == "shell":
        there = _list_rows(list_file, target, text, other_delimiter)
    rows, other_rows = [], []
    for row in here:
        rows.append(row)
        try:
            other = row if there is None else next(there)
        except ValueError:  # (read beside the target, a line is no 'path,label' line)
            return named, rows + list(here), delimiter
        other_rows.append(other)
        path, other_path = row[0], other[0]
        if os.path.isabs(path) and os.path.isabs(other_path):
            continue
        if os.path.lexists(named / path) == os.path.lexists(target / other_path):
            continue
        if not os.path.lexists(target / other_path):
            return named, rows + list(here), delimiter
        if there is None:
            return target, rows + list(here), delimiter
        try:
            return target, other_rows + list(there), other_delimiter
        except ValueError:  # (as above, on a later line)
            return named, rows + list(here), delimiter
    return named, rows, delimiter


_WORKING_FOLDER_ADVICE = (
    "write its paths relative to the list's folder (or absolute), or move the list into the "
    "working folder"
)


def _working_folder_path(
    folder: str | os.PathLike, ids: list[str], sizes: np.ndarray | None = None
) -> str:
    """The first relative path of a list's ``ids`` where none names a file in the list's
    ``folder`` (``sizes`` there, as :func:`stat_files` gives them; None: looked up) but it
    names one in the working folder (``find data -name '*.png' > lists/train.txt``): its
    paths are read relative to the list's folder all the same. '' where it is not so."""
    relative = [i for i, path in enumerate(ids) if not os.path.isabs(path)]
    # (the sizes given first, then the first path's look-ups: each file's last, if need be)
    if not relative or sizes is not None and (sizes[relative] != NOT_A_FILE).any():
        return ""
    first = ids[relative[0]]
    if not os.path.lexists(first) or not os.path.isdir(folder):
        return ""
    if os.path.samefile(folder, os.curdir):
        return ""
    if sizes is None:
        sizes = stat_files(os.fspath(folder), ids)[0]
    return "" if (sizes[relative] != NOT_A_FILE).any() else first


def _warn_of_working_folder_paths(
    list_file: Path, folder: Path, ids: list[str], sizes: np.ndarray
) -> None:
    """Say why every image of a list will fail (:func:`_working_folder_path`)."""
    first = _working_folder_path(folder, ids, sizes)
    if first:
        logger.warning(
            "%s: no image it lists is found in its folder %s, against which its relative "
            "paths are read, but %r is found in the working folder: %s; its images will be "
            "recorded as failed.",
            list_file, folder, first, _WORKING_FOLDER_ADVICE,
        )  # fmt: skip


def _check_path_first(
    list_file: Path, folder: Path, rows: list, text: list[str], delimiter: str | None
) -> None:
    """Refuse a list whose columns are 'label,path' (a 'label,path' header, or lines
    whose labels name files and whose paths name none, most of the list's): it was refused
    as a header, or read as images named by the labels, every one failed, in classes named
    by the paths. A list whose first image is missing and labelled with the name of a file
    beside it (a class 'notes' beside notes) is no such list: it was refused as one. The
    line refused is shown as written in ``text``, and the columns named in the list's own
    separator (``delimiter``: 'label;path' was shown 'label,path', and the cure 'path,label'
    in a list separated by semicolons)."""
    if rows and [f.lower() for f in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]  # (the header, its first line after it)
    if not rows:
        return
    path, label, number = rows[0]
    swapped = [path.lower(), label.lower()] == ["label", "path"]
    # (a first path that names a file: the list is the right way round, nothing else read)
    first = 0 if swapped else None if os.path.isfile(folder / path) else _swapped(folder, rows)
    if first is not None:
        number = rows[first][2]
        raise ValueError(
            f"{list_file}:{number}: {text[number - 1].strip()!r} reads as "
            f"{_columns(delimiter, 'label', 'path')}: a list's lines are "
            f"{_columns(delimiter, 'path', 'label')}, the image first; swap the two columns."
        )


def _swapped(folder: Path, rows: list) -> int | None:
    """The first of ``rows`` that reads as 'label,path' (its path names no file, its label
    one) where more than half of them do; None otherwise. Read up to where the count
    decides it, each name looked up once, the label first: a list the right way round,
    its images missing, has its few classes looked up, not its paths (nor a swapped list
    its paths, which are its few classes)."""
    n, explained, first, found = len(rows), 0, None, {}

    def isfile(name: str) -> bool:
        if name not in found:  # (os.path's: a name too long for the file system is none)
            found[name] = os.path.isfile(folder / name)
        return found[name]

    for i, (path, label, _) in enumerate(rows):
        if isfile(label) and not isfile(path):
            explained += 1
            first = i if first is None else first
            if 2 * explained > n:
                return first
        elif 2 * (n - (i + 1 - explained)) <= n:  # the rest cannot make a majority
            return None
    return None


def _warn_of_windows_separators(
    list_file: Path, folder: Path, rows: list, sizes: np.ndarray
) -> None:
    """Say where a list's paths are written with Windows' '\\' between folders (a list
    made by os.path.join on Windows): here '\\' is a character of a file name, and each
    such image failed as a missing file, the cause unsaid. The first missing path with a
    '\\' is looked up with '/' instead."""
    missing = np.flatnonzero(sizes == NOT_A_FILE)
    i = next((i for i in missing.tolist() if "\\" in rows[i][0]), None)
    if i is None:
        return
    path, _, number = rows[i]
    if os.path.isfile(folder / path.replace("\\", "/")):
        logger.warning(
            "%s:%d: %r names no file, but %r does: the list's paths are written with "
            "Windows' '\\' between folders, which is a character of a file name here, and "
            "such images will be recorded as failed. Write the paths with '/' (e.g. `sed -i "
            "'s|\\\\|/|g' %s`).",
            list_file, number, path, path.replace("\\", "/"), shlex.quote(str(list_file)),
        )  # fmt: skip


def _warn_of_comment_lines(list_file: Path, rows: list, sizes: np.ndarray) -> None:
    """Say which lines look like comments ('#' first) and name no file: a list file has
    no comment syntax, and a line commented out is an image all the same, recorded as
    failed under its label (a class of its own where no other line has it)."""
    lines = [row[2] for row, size in zip(rows, sizes, strict=True) if row[0][:1] == "#"
             and size == NOT_A_FILE]  # fmt: skip
    if lines:
        shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
        logger.warning(
            "%s: %s %s (%r) %s with '#' and %s no file: each line is an image and its "
            "label, and a list file has no comment syntax, so %s recorded as failed. "
            "Remove such lines.",
            list_file,
            plural(len(lines), "line"),
            shown,
            next(path for path, _, number in rows if number == lines[0]),
            "starts" if len(lines) == 1 else "start",
            "names" if len(lines) == 1 else "name",
            "its image is" if len(lines) == 1 else "their images are",
        )


def working_folder_hint(folder: str, failed: list[str]) -> str:
    """Why every image of a list failed, its paths of ``failed``, where :func:`image_list`
    warned so (:func:`_working_folder_path`): what to do, or '' where it is not so."""
    first = _working_folder_path(folder, failed)
    if not first:
        return ""
    return (
        f"{first!r} is found in the working folder, not in the list's folder {folder}, "
        f"against which its relative paths are read: {_WORKING_FOLDER_ADVICE}"
    )


def _missing_without_digits(folder: Path, rows: list[list]) -> bool:
    """Whether every path of ``rows`` is named without a digit or an extension ('d', 'katze'),
    as a header's column is and images seldom are (a digit looked for in all at once), and
    names no file in ``folder``: a first line missing above images found is a header
    ('Datei Klasse' above 'katze tier' found). (A look-up a line, up to the first found, for
    such lists alone.)"""
    paths = [path for path, _, _ in rows]
    if re.search(r"\d", "\0".join(paths)) or any(os.path.splitext(p)[1] for p in paths):
        return False
    return not any(os.path.isfile(folder / path) for path in paths)


# Words of a list's column names ('filename', 'image_path', 'ClassName', 'label'), which
# no missing image and its class are named by both (a content-addressed 'scan0001' is).
_COLUMN_WORDS = frozenset(
    {"path", "file", "filename", "filepath", "fname", "name", "image", "img", "picture"}
    | {"photo", "url", "uri", "id", "key", "relpath", "label", "class", "category", "target"}
    | {"tag", "annotation", "y", "idx", "index", "sample", "item", "cls", "classname"}
)


def _column_name(field: str) -> bool:
    """Whether a field reads as a column's name: words of letters (``image_path``,
    ``ClassName``, ``file name``), one of them a column's word, singular or plural."""
    if not re.fullmatch(r"[A-Za-z]+(?:[ _.-][A-Za-z]+)*", field):
        return False
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", field)
    return any(w.lower() in _COLUMN_WORDS or w.lower()[:-1] in _COLUMN_WORDS for w in words)


# The separator of a list's columns as its lines are split (:func:`_list_format`), in the
# header and the columns that errors name: in a list separated by semicolons, 'path,label'
# holds no semicolon, and its lines were read otherwise. (None, "shell": at a blank.)
_SEPARATORS = {",": ",", "csv-semicolon": ";", "\t": "<TAB>", "csv-tab": "<TAB>"}


def _columns(delimiter: str | None, *names: str) -> str:
    """Columns ``names`` as a list split at ``delimiter`` writes them: 'path;label'."""
    return repr(_SEPARATORS.get(delimiter, " ").join(names))


def _check_first_line(
    list_file: Path,
    folder: Path,
    line: str,
    path: str,
    label: str,
    number: int,
    delimiter: str | None,
    rest: list[list],
) -> None:
    """Refuse a list's first ``line`` that names no image (no such file, no extension) with
    a label of its own and reads as a header (column names, 'filename,class', a path without
    a digit above ``rest``, the rows after it, named otherwise, found in ``folder`` or in
    folders, 'sku,breed' or 'Datei,Klasse' above 'cat/000.png,cat', or above 'katze,tier'
    found or 'katzen/minka,katze', or a comment, '# my images'): it became an image of a
    class of its own. Said, and read as an image (recorded as failed as other missing
    images are), where it reads as none: a first image 'scan0001' of a class 'bird' was
    refused as a header. (Column names are words of any language; an image's name without
    an extension, a scan's number or a hash, holds a digit, but in a list whose every
    image is named without either and missing: 'c cat' above 'd dog' reads as its rows do,
    where it was refused as a header, quoted or not, and 'd dog' read as an image.) The
    header either names is written with the list's own separator (``delimiter``)."""
    header = _columns(delimiter, "path", "label")
    comment = path[:1] == "#"
    # (named unlike later images: in no folder where each is in one, 'Datei Klasse' above
    # 'katzen/minka katze', or they have a digit or an extension, or are found)
    digitless = not re.search(r"\d", path) and (
        not os.path.dirname(path)
        and all(os.path.dirname(p) for p, _, _ in rest)
        or not _missing_without_digits(folder, rest)
    )
    if comment or digitless or _column_name(path) or _column_name(label):
        raise ValueError(
            f"{list_file}:{number}: {line.strip()!r} looks like a header (no such image, and "
            f"no other line has its label); a header must be {header}."
            + (
                " A list file has no comment syntax: remove it."
                if comment
                else f" If it is an image, put the header {header} before it."
            )
        )
    logger.warning(
        "%s:%d: %r names no file and no other line has its label %r: it is read as an image "
        "of a class of its own (recorded as failed if it is still missing); if the line is a "
        "header, write it %s.",
        list_file, number, path, label, header,
    )  # fmt: skip


def image_list(list_file: str | os.PathLike) -> ImageSource:
    """Images listed as ``path,label`` lines (CSV, separated by commas or semicolons, or
    tab- or whitespace-separated text).

    Parameters
    ----------
    list_file : path-like
        One ``path,label`` per line. Fields of a blank-separated list may be quoted as a
        shell quotes them (``'my dir/1.jpg' 3``, a name with a comma ``"a,b.jpg" 3``).
        Relative paths are resolved against the list file's folder (a linked list's own
        folder, or its target's where the first relative path that names a file in one of
        the two alone names it there). Labels are class names (sorted into indices), or
        integers (then class ``k`` is named ``"k"``). A first line ``path,label`` (in any
        case) is a header.

    Raises
    ------
    ValueError
        For a line that is not ``path,label``, an empty path or label, an image listed
        twice, a header after the first line, or a first line that looks like another
        header (no such file, no file extension, a label that is not an index and that
        no other line has, and column names, ``filename,class``, a path without a digit
        where a later path has a digit or an extension or names a file, or where it lies
        in no folder and every later one in one, ``sku,breed``, or a ``#`` first): it
        would otherwise become an image of a class of its own. Such a line of no column
        names and a digit in its path (``scan0001,bird``), or above paths all without a
        digit or an extension and missing (``c cat`` above ``d dog``), is an image, said
        in a warning.

    Returns
    -------
    ImageSource
    """
    list_file = Path(expand_home(os.fspath(list_file)))
    # utf-8-sig: a byte-order mark, as spreadsheet programs write one, is not text; nor is
    # one that begins a later line (lists joined: cat a.csv b.csv).
    try:
        with open(list_file, newline="", encoding="utf-8-sig") as fh:
            text = [line.removeprefix("\ufeff") for line in fh.read().splitlines()]
    except UnicodeDecodeError as err:
        raise ValueError(
            f"The image source {os.fspath(list_file)!r} was read as a list file (path,label "
            f"lines) but is not UTF-8 text (byte {err.start}: {err.reason})."
            + (_source_hint(list_file) or " Save the list as UTF-8.")
        ) from None
    folder, rows, delimiter = _list_folder_and_rows(list_file, text)
    _check_path_first(list_file, folder, rows, text, delimiter)
    if rows and [f.lower() for f in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]
    elif len(rows) > 1 and rows[0][1] not in {label for _, label, _ in rows[1:]}:
        # A header names no file: no such image, no extension, a label that is no index
        # and that no other line has. (A folder is no image: "image,class" beside an
        # image/ folder was an image of a class "class".)
        path, label, number = rows[0]
        # (os.path's isfile: a name too long for the file system is no file, not an error)
        named = os.path.isfile(folder / path) or os.path.splitext(path)[1]
        if not named and not label.isdigit():
            line = text[number - 1]
            _check_first_line(list_file, folder, line, path, label, number, delimiter, rows[1:])
    first_line, resolved = {}, {}
    for path, label, number in rows:
        if [path.lower(), label.lower()] == ["path", "label"]:
            raise ValueError(
                f"{list_file}:{number}: a second header {text[number - 1].strip()!r} (lists "
                "joined with their headers?); a header is the first line only: remove it."
            )
        if not path:  # (it named the list's own folder: a failed image, recorded as '')
            raise ValueError(
                f"{list_file}:{number}: the image labelled {label!r} has an empty path."
            )
        if not label:
            raise ValueError(f"{list_file}:{number}: {path!r} has an empty label.")
        # The entry, however it is spelt (relative or absolute, through linked folders);
        # the file's own link is not followed: two entries that link to one cached object
        # (DVC, git-annex) are two images with the same bytes.
        full = os.path.join(folder, path)  # ".." after a link is the link's
        parent = os.path.dirname(full)  # (resolved once a folder: a look-up per component)
        if parent not in resolved:
            resolved[parent] = os.path.realpath(parent)
        entry = os.path.join(resolved[parent], os.path.basename(full))
        earlier = first_line.setdefault(entry, number)
        if earlier != number:
            raise ValueError(
                f"{list_file}:{number}: {path!r} is listed again (first on line {earlier}, "
                "perhaps spelt otherwise); list each image once (to weight it, use "
                "sample_weight when fitting)."
            )
    texts = [label for _, label, _ in rows]
    problem = label_kind_problem(texts)
    digits = set(filter(is_index, texts))
    # Read as names, as list files always have: said where that renumbers a class, one
    # whose place among the sorted names is not the number it spells.
    order = {text: k for k, text in enumerate(sorted(set(texts)))}
    renumbered = any(order[text] != int(text) for text in digits)
    # A -1 among class indices may mark unlabelled rows, except in a ±1 labelling.
    unlabelled = digits != {"1"} and any(map(_is_unlabelled, texts))
    if problem and (renumbered or unlabelled):
        i, why = problem
        logger.warning(
            "%s:%d: the label %r, %s: a list file then reads every label as a class name, "
            "the classes sorted as text ('10' before '2'), and %r is a class of its own.",
            list_file, rows[i][2], texts[i], why, texts[i],
        )  # fmt: skip
    elif (moved := renumbered_decimal(texts)) is not None:
        logger.warning(
            "%s:%d: the label %r %s: a list file then reads every label as a class name, %s",
            list_file, rows[moved[0]][2], texts[moved[0]], _DECIMAL, _AS_TEXT % moved[1:],
        )  # fmt: skip
    labels, class_names = encode_labels(texts)
    ids = [path for path, _, _ in rows]
    sizes, mtimes = stat_files(str(folder), ids)
    _warn_of_working_folder_paths(list_file, folder, ids, sizes)
    _warn_of_windows_separators(list_file, folder, rows, sizes)
    _warn_of_comment_lines(list_file, rows, sizes)
    _warn_of_commas_read_as_csv(list_file, text, sizes, delimiter)
    return ImageSource(
        ids=ids,
        labels=labels,
        class_names=class_names,
        root=str(folder),
        description=f"list:{list_file.resolve()}",
        source_index=np.arange(len(rows), dtype=np.int64),
        file_size=sizes,
        file_mtime_ns=mtimes,
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


def open_source(
    source: str | os.PathLike | ImageSource,
    image_key: str | None = None,
    label_key: str | None = None,
) -> ImageSource:
    """Open an image source.

    Parameters
    ----------
    source : str, path-like or ImageSource
        A class-per-folder directory, a ``path,label`` list file,
        ``"fashion-mnist:train"`` / ``"fashion-mnist:test[@ROOT]"``,
        ``"webdataset:PATTERN"`` (tar shards, see :func:`webdataset_shards`),
        ``"parquet:PATTERN"`` (Parquet / Arrow files or a Hugging Face dataset folder, see
        :func:`parquet_files`), or an ``ImageSource`` (returned as is, its labels as int64;
        one whose counts, labels, names or source indices a store cannot hold is refused).
    image_key, label_key : str, optional
        Which member (WebDataset) or column (Parquet) holds the image and the label.

    Returns
    -------
    ImageSource
    """
    text = source.description if isinstance(source, ImageSource) else os.fspath(source)
    if not isinstance(source, ImageSource):
        text = expand_home(text)  # (a spec's own ~, after its colon, where it is read)
    check_keys(image_key, label_key)
    kind, colon, pattern = text.partition(":")
    if isinstance(source, ImageSource):
        kind = "opened"  # the keys applied when it was opened
    elif not colon and os.path.exists(text):
        kind = "path"  # a folder or file named as a spec's word ('parquet') is that path
    if kind == "webdataset":
        from ._tar_shards import webdataset_shards

        return _utf8_paths(webdataset_shards(pattern, image_key, label_key))
    if kind == "parquet":
        from ._tables import parquet_files

        return _utf8_paths(parquet_files(pattern, image_key, label_key))
    for name, value in (("image_key", image_key), ("label_key", label_key)):
        if value is not None:
            raise ValueError(
                f"The '{name}' parameter applies when opening webdataset: and parquet: "
                f"sources; {text!r} is not one, and it must be None. Got {value!r} instead; "
                "name shards as 'webdataset:PATTERN' and Parquet files as 'parquet:PATTERN'."
            )
    if isinstance(source, ImageSource):
        return _checked(source)
    # The spec is its own word before a colon (a folder named fashion-mnist-photos is a
    # folder), and a path that exists under the spec's name is that path.
    if kind == "fashion-mnist" and not os.path.exists(text):
        split, _, root = pattern.partition("@")
        if not split:  # (read as train: a test set asked as 'fashion-mnist' was the train set)
            raise ValueError(
                f"The image source {text!r} names no Fashion-MNIST split; use "
                "'fashion-mnist:train' or 'fashion-mnist:test' (with '@ROOT' for another folder)."
            )
        return _utf8_paths(fashion_mnist(split, root or FASHION_MNIST_ROOT))
    if os.path.isdir(text):
        return _utf8_paths(image_folder(text))
    if os.path.isfile(text):
        return _utf8_paths(image_list(text))
    what = "is neither a folder nor a file" if os.path.exists(text) else why_missing(text)
    raise FileNotFoundError(
        f"The image source {text!r} {what}; a source is a folder, a list file, "
        "'fashion-mnist:train|test[@ROOT]', 'webdataset:PATTERN' or 'parquet:PATTERN'."
    )


def _checked(src: ImageSource) -> ImageSource:
    """An ImageSource given as it is (built by the caller), refused where its store could
    not be written or read back: ids, labels and source indices of other counts, labels
    that are no class indices into its class names (load_features refused the store once
    every image was extracted), a class named twice, by no text or by none, or text that
    is not UTF-8, or source indices that are not increasing integers >= 0 (shards are
    merged in the order of their indices: a decreasing one failed in h5py, and items in
    another order came out of torchrun in an order of their own). Labels and source indices
    are returned as int64 (a list, or whole numbers in floats, are taken)."""
    labels = np.asarray(src.labels)
    n_ids, n_labels, n_index = len(src.ids), labels.size, len(src.source_index)
    if labels.ndim != 1 or not n_ids == n_labels == n_index:
        raise ValueError(
            f"The ImageSource {src.description!r} has {n_ids} ids, {n_labels} labels and "
            f"{n_index} source indices; it needs one of each per item."
        )
    k = len(src.class_names)
    if labels.dtype.kind in "iuf":
        with np.errstate(invalid="ignore"):  # (NaN is no index)
            bad = labels[~((labels >= 0) & (labels < k) & (labels % 1 == 0))]
    else:  # text, booleans, objects (Python's and numpy's ints in range taken)
        bad = [
            v
            for v in labels.tolist()
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < k)
        ]
    if len(bad):
        got = bad[0].item() if isinstance(bad[0], np.generic) else bad[0]
        raise ValueError(
            f"The labels of the ImageSource {src.description!r} must be class indices, "
            f"integers in 0..{k - 1} (its {k} class names). Got {got!r} instead."
        )
    # (one that is no text failed on its .strip(): class_names=list(range(10)))
    name = next((name for name in src.class_names if not isinstance(name, str)), "")
    if not isinstance(name, str):
        raise ValueError(
            f"The class names of the ImageSource {src.description!r} must be str. Got "
            f"{name!r} ({type(name).__name__}) instead; name the classes as text "
            "([str(k) for k in ...])."
        )
    index = np.asarray(src.source_index)
    bad = _first_unordered(index)
    if bad is not None:
        raise ValueError(
            f"The source indices of the ImageSource {src.description!r} must be increasing "
            "integers >= 0 (each item's position in the full collection, in order, as "
            "subset() keeps them). Got "
            + (
                f"{index[bad].item()!r} at item {bad}"
                if index.ndim == 1
                else f"an array of shape {index.shape}"  # ('0 at item 0' said of a column)
            )
            + " instead; "
            "number the items in order, e.g. np.arange(len(ids))."
        )
    _check_index_names(list(src.class_names))
    _check_utf8(list(src.ids), src.root)
    # Its files listed now, as a folder's are when it is opened: taken each time they were
    # needed, a file replaced while the model loaded was extracted as the new file under
    # the fingerprint of the old one, and the complete store was refused by the next run.
    sizes, mtimes = src.file_stats()
    return _utf8_paths(
        replace(
            src,
            labels=labels.astype(np.int64),
            source_index=index.astype(np.int64),
            file_size=sizes,
            file_mtime_ns=mtimes,
        )
    )


def _first_unordered(index: np.ndarray) -> int | None:
    """The first item of ``index`` that is no integer >= 0 above the one before it."""
    if index.ndim != 1:
        return 0 if index.size else None
    if index.dtype.kind not in "iuf":
        return 0 if len(index) else None
    with np.errstate(invalid="ignore"):  # (NaN is no index)
        whole = index % 1 == 0 if index.dtype.kind == "f" else np.ones(len(index), bool)
        rising = np.concatenate([index[:1] >= 0, index[1:] > index[:-1]])
        # (as int64: 2**63 of a uint64 or a float became -2**63 without a word)
        fits = index < 2**63 if index.dtype.kind in "uf" else True
    bad = np.flatnonzero(~(whole & rising & fits))
    return int(bad[0]) if len(bad) else None


def _utf8_paths(src: ImageSource) -> ImageSource:
    """``src``, whose root, description and container files must have UTF-8 names: the
    store records them as UTF-8 text (its items' names are checked when listed)."""
    bad = _not_utf8([src.resolved_root(), src.description, *src.files])
    if bad:
        raise ValueError(
            f"The path {bad[0]!r} of the image source is not valid UTF-8. The store records "
            "it as UTF-8 text; rename the folder or file (e.g. with convmv)."
        )
    return src


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
