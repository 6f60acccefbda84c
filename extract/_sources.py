"""Opening an image source: by its name (a folder, a list file, ``fashion-mnist:``,
``webdataset:`` or ``parquet:``), or an :class:`~extract._images.ImageSource` given as it is,
checked."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from mr2_probe._h5 import why_missing

from ._image_folder import _check_utf8, _not_utf8, image_folder
from ._image_list import image_list
from ._images import FASHION_MNIST_ROOT, ImageSource, check_keys, fashion_mnist
from ._labels import _check_index_names
from ._paths import expand_home


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
