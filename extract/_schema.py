"""The schema of a feature store: its format version, row states, datasets, provenance keys,
attributes and errors."""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

# 2: per-row file identity (file_size, file_mtime_ns, content_sha256) and source_root.
FORMAT_VERSION = 2
PENDING, DONE, FAILED = 0, 1, 2
REASON_DTYPE = "S200"
DIGEST_DTYPE = "S64"  # hexadecimal sha256
_REQUIRED = ("features", "labels", "class_names")  # what a classifier needs from a store
# Every dataset create_store writes.
STORE_DATASETS = (
    "features", "status", "failure_reason", "content_sha256", "labels", "indices", "paths",
    "class_names", "file_size", "file_mtime_ns",
)  # fmt: skip
# Attributes that must match for an existing file to be reused.
PROVENANCE_KEYS = (
    "format_version",
    "backbone",
    "weights",
    "preprocessing",
    "compute",  # the backbone's precision: "float32", or "bfloat16 autocast" on a GPU
    "dtype",
    "normalize",
    "source_root",
    "source_fingerprint",
    "n_rows",
    "n_total_rows",
    "shard_rank",
    "shard_world_size",
    "source_options",  # WebDataset / Parquet sources only: the image and label keys
)
# Stores written before the precision was recorded computed in float32 (no CUDA run had
# written one); so did shards compared with each other.
PROVENANCE_DEFAULTS = {"compute": "float32"}
# Entries of ``preprocessing`` recorded since: what the stores written before did. No path
# has applied the EXIF orientation tag (see extract._decoding.APPLY_EXIF_ORIENTATION).
PREPROCESSING_DEFAULTS = {"apply_exif_orientation": False}
_REBUILD = "pass --force (overwrite=True) to delete it and recompute it"


# On the shards of a forced run under torchrun: the size and modification time of the
# merged store they are to replace (a rerun without --force resumes them by it).
REPLACES = "replaces_store"
#: A shard's mark, set by merge_shards: the version of the merged store it went into.
MERGED_INTO = "merged_into_store"
#: Set while --retry-failed takes repaired failures into a store: the source fingerprint
#: it adopts (extract._resume._adopt_repaired_failures), removed once it has.
ADOPTING = "adopting_source_fingerprint"


class StoreError(ValueError):
    """A feature store cannot be read, written or reused as requested.

    The base class of every error of the store: catch it to report any of them.
    """


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The feature store file does not exist."""


class NotAStoreError(StoreError):
    """The file is empty, not HDF5, or an HDF5 file without a store's datasets."""


class ProvenanceError(StoreError):
    """An existing store was made from other images, backbone, weights or settings."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process is writing the store."""


class IncompleteStoreError(StoreError, RuntimeError):
    """The store still has rows that were never extracted."""


def shorten(reason: str, size: int = 200) -> str:
    """``reason`` in at most ``size`` UTF-8 bytes, its middle left out ("...") where it is
    longer, never inside a character: its start names the error, its end the cause and
    the remedy, and the path between them can be long (cut at its end, a reason under a
    long folder lost "it is empty (0 bytes)")."""
    # (A lone surrogate, a file name's undecodable byte, written as its escape: no
    # UnicodeEncodeError at the row's write.)
    data = reason.encode("utf-8", "backslashreplace")
    if len(data) <= size:
        return data.decode()
    head = (size - 3) // 2
    return (
        data[:head].decode("utf-8", "ignore")
        + "..."
        + data[len(data) - (size - 3 - head) :].decode("utf-8", "ignore")
    )


def _truncate(reason: str) -> bytes:
    """UTF-8 bytes of ``reason`` in the field's size (:func:`shorten`)."""
    return shorten(reason).encode()


def read_attrs(f: h5py.File) -> dict[str, Any]:
    """The store's attributes as Python values (JSON attributes decoded)."""
    # Plain Python values: an attribute that another tool wrote as an array is a list
    # (it compares, and goes into JSON reports, as one).
    attrs = {k: _plain(v) for k, v in f.attrs.items()}
    version = f.attrs.get("format_version")
    if isinstance(version, np.ndarray) and version.size == 1:
        # One number written as an array of one ([3.0], as MATLAB and some h5py code write
        # scalars): the number. As a list it passed the newer-format check that 3.0 fails.
        attrs["format_version"] = _plain(version.reshape(())[()])
    text = attrs.get("format_version")
    for number in (int, float) if isinstance(text, str) else ():
        # Written as text ("3", as some tools write every attribute): its number. As text
        # it passed the newer-format check, and was called an older format to rebuild.
        try:
            attrs["format_version"] = number(text)
            break
        except ValueError:
            continue
    for key in ("preprocessing", "versions", "class_names", "source_files", "source_options"):
        if isinstance(attrs.get(key), str):
            try:
                attrs[key] = json.loads(attrs[key])
            except json.JSONDecodeError:
                # Another tool's attribute of that name ('cat,dog'): kept as it is, as one
                # of a list or a number is. It called the file damaged (a list: TypeError).
                pass
    return attrs


def with_defaults(provenance: dict) -> dict:
    """``provenance`` with what a store written before an entry was recorded lacks filled
    in (:data:`PROVENANCE_DEFAULTS`, and :data:`PREPROCESSING_DEFAULTS` in its
    ``preprocessing``), so that it compares equal to a request of the same settings."""
    filled = PROVENANCE_DEFAULTS | dict(provenance)
    if isinstance(filled.get("preprocessing"), dict):
        filled["preprocessing"] = PREPROCESSING_DEFAULTS | filled["preprocessing"]
    return filled


def shard_own(attrs: dict) -> dict[str, Any]:
    """The provenance in which one rank's shard differs from another's of the same run:
    its rank and its rows."""
    return {k: attrs[k] for k in ("shard_rank", "n_rows") if k in attrs}


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):  # np.bytes_ too, before it is taken for a NumPy scalar
        # (another tool's text in Latin-1, b"caf\xe9": its bytes escaped, not a traceback)
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, list):  # nested lists of any depth, their bytes decoded
        return [_plain(v) for v in value]
    return value
