"""An existing store against a request: its provenance compared and each difference named,
failures repaired in place, and the store opened to resume or created anew."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np
import torch

from ._batches import compute_precision
from ._decoding import APPLY_EXIF_ORIENTATION, NOT_A_FILE, FileChangedError
from ._images import ImageSource
from ._merge import _identity, shard_path, shards_beside
from ._paths import plural
from ._schema import (
    ADOPTING,
    DONE,
    FAILED,
    FORMAT_VERSION,
    PENDING,
    PROVENANCE_KEYS,
    REPLACES,
    StoreError,
    read_attrs,
    shard_own,
    with_defaults,
)
from ._specs import Backbone
from ._store import (
    check_attrs_room,
    check_provenance,
    check_written,
    create_store,
    open_store,
)
from ._touched import compare_rows, first_other_bytes

logger = logging.getLogger(__name__)


# What a request sets beside its images (the images' own identities left out).
_SETTINGS = [k for k in PROVENANCE_KEYS if k != "source_fingerprint"]


_VERSIONED = ("torch", "torchvision", "timm", "open_clip_torch", "h5py", "numpy", "pillow")


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the features."""
    return dict(_library_versions())


@functools.cache
def _library_versions() -> tuple[tuple[str, str], ...]:
    # Read once a process: each read parses a package's metadata (some 5 ms for the seven
    # at every store opened), and a version installed later is not the one imported.
    versions = []
    for name in _VERSIONED:
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, "absent"))
    return tuple(versions)


def _provenance(
    backbone: Backbone,
    source: ImageSource,
    fingerprint: str,
    dtype: str,
    normalize: bool,
    decode: str,
    shard: dict,
    device: torch.device,
) -> dict:
    provenance = dict(
        format_version=FORMAT_VERSION,
        backbone=f"{backbone.spec.family}:{backbone.spec.model}",
        weights=backbone.weights_id,
        preprocessing=backbone.preprocess
        | {"decode": decode, "apply_exif_orientation": APPLY_EXIF_ORIENTATION},
        compute=compute_precision(device),
        dtype=dtype,
        normalize=bool(normalize),
        source_root=source.resolved_root(),
        source_fingerprint=fingerprint,  # source.fingerprint(), computed once per run
        **shard,
    )
    if source.options:  # what is read from the containers (absent for other sources)
        provenance["source_options"] = source.options
    return json.loads(json.dumps(provenance))  # the form it takes after a trip through the file


def _when(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9).isoformat(sep=" ", timespec="microseconds")


def _file_difference(path: str, old: tuple[int, int], new: tuple[int, int]) -> str:
    (old_size, old_mtime), (new_size, new_mtime) = old, new
    if old_size == NOT_A_FILE:
        change = "it was missing when the store was made"
    elif new_size == NOT_A_FILE:
        change = "it is missing now"
    elif old_size != new_size:
        change = f"{new_size} bytes now, {old_size} when the store was made"
    else:
        change = f"modified {_when(new_mtime)}, {_when(old_mtime)} when the store was made"
    return f"{path!r} is not the file the store was made from ({change})"


def _file_list_difference(stored: dict, src: ImageSource) -> str | None:
    """Name the first container (or IDX) file that differs between a store and the request."""
    old, new = list(stored), list(src.files)
    for k in range(max(len(old), len(new))):
        if k >= len(new):
            return (
                f"the store was made from {len(old)} {plural(len(old), 'file')}, the request "
                f"reads {len(new)}: {os.path.join(src.root, old[k])!r} is not in the request"
            )
        if k >= len(old):
            return (
                f"the store was made from {len(old)} {plural(len(old), 'file')}, the request "
                f"reads {len(new)}: {os.path.join(src.root, new[k])!r} is new"
            )
        if old[k] != new[k]:
            return (
                f"file {k + 1} of the source is {old[k]!r} in the store, {new[k]!r} in the request"
            )
    return None


def _source_difference(
    f, src: ImageSource, rows: np.ndarray, retry_failed: bool = False
) -> str | None:
    """Name the first file or image that differs between a store and the request.

    In order: the list of files holding many items (IDX files, shards), the class names,
    each row's id, label and file identity, then the content identity of those files.
    With ``retry_failed``, a failed row whose file alone has changed is no difference (the
    retry takes it): the one named is what stops the retry.
    """
    stored_files = read_attrs(f).get("source_files") or {}
    listed = _file_list_difference(stored_files, src)
    if listed:
        return listed
    stored_names = list(f["class_names"].asstr()[:])
    if stored_names != list(src.class_names):
        return f"the classes are {stored_names} in the store, {list(src.class_names)} now"
    row = _row_difference(f, src, rows, stored_names, retry_failed) if "file_size" in f else None
    if row:
        return row
    for name, identity in src.files.items():
        if stored_files[name] != identity:
            return f"{os.path.join(src.root, name)!r} is not the file the store was made from"
    return None


def _row_difference(
    f, src: ImageSource, rows: np.ndarray, stored_names: list[str], retry_failed: bool = False
) -> str | None:
    pairs, differs, touched, before, check = compare_rows(f, src, rows, retry_failed)
    stored_ids, ids = pairs["id"]
    n = len(ids)
    head = rows[:n]
    n_stored = len(f["paths"])
    other, unread = None, None  # a touched file whose bytes are not those of its row
    if n_stored == len(rows):
        # Files touched since, and not changed (by their bytes), are the store's: the
        # difference named is the first other one.
        found = first_other_bytes(f, src, rows, check)
        other, unread = (None, None) if found is None else found
        limit = before if other is None else other
        differs &= ~(touched & (np.arange(n) < limit))
    if not differs.any():
        if n_stored > len(rows):
            return (
                f"the store holds {n_stored} images, the request {len(rows)}: "
                f"{f['paths'].asstr()[n]!r} and those after it are no longer requested"
            )
        if n_stored < len(rows):
            return (
                f"the store holds {n_stored} images, the request {len(rows)}: "
                f"{src.ids[rows[n]]!r} and those after it are new"
            )
        return None  # rows outside this shard differ: the fingerprint says so
    k = int(np.argmax(differs))
    if stored_ids[k] != ids[k]:
        return f"image {k} is {stored_ids[k]!r} in the store but {ids[k]!r} in the request"
    old_label, new_label = (int(pairs["label"][j][k]) for j in (0, 1))
    if old_label != new_label:
        return (
            f"{src.item_name(int(head[k]))!r} is labelled {src.class_names[new_label]!r} in the "
            f"request but {stored_names[old_label]!r} in the store"
        )
    old = (int(pairs["size"][0][k]), int(pairs["mtime"][0][k]))
    new = (int(pairs["size"][1][k]), int(pairs["mtime"][1][k]))
    if old != new:
        bytes_differ = ""
        if k == other and isinstance(unread, FileChangedError) and unread.after is not None:
            # (since it was listed, or as it was read: its bytes read are of no one version)
            bytes_differ = (
                "; it changed while it was read to compare its bytes with those extracted "
                f"({_change_in_read(unread.before, unread.after)}): run again once it no "
                "longer changes"
            )
        elif k == other and unread is not None:  # (its bytes, unread, may be those extracted)
            bytes_differ = (
                "; it cannot be read now to compare its bytes with those extracted "
                f"({_os_error(unread)}): make it readable, or restore it, and run again"
            )
        elif k == other:  # (a failed row whose file could not be read holds no digest)
            recorded = bool(f["content_sha256"][k])
            bytes_differ = (
                "; its bytes are not those extracted"
                if recorded
                else "; the store holds no digest of its bytes (they could not be read then)"
            )
        return _file_difference(src.path(int(head[k])), old, new) + bytes_differ
    old_index, new_index = (int(pairs["index"][j][k]) for j in (0, 1))
    return (
        f"{src.item_name(int(head[k]))!r} is item {new_index} of the source now, item "
        f"{old_index} when the store was made: images were added or removed before it"
    )


def _change_in_read(before: tuple[int, int], after: tuple[int, int]) -> str:
    """How a file changed while it was read, ``(size, mtime_ns)`` before and after."""
    if before[0] != after[0]:
        return f"{before[0]} bytes before the read, {after[0]} after"
    return f"modified {_when(before[1])} before the read, {_when(after[1])} after"


def _os_error(error: Exception) -> str:
    """An error reading an image, on one line: its type and what the system said."""
    kind = getattr(error, "told_type", type(error).__name__)  # (another rank's: ToldError)
    return f"{kind}: {' '.join(str(error).split())}"


def _source_explained(
    f, provenance: dict, source, rows, retry_failed=False, others: bool = True
) -> str | None:
    """:func:`_source_difference`, and where the store differs only by failed images that
    have changed since, the option that takes them. A shard whose own rows are unchanged
    says so (other shards' images changed) unless ``others`` is False: None then."""
    existing = read_attrs(f)
    if existing.get(ADOPTING) == provenance["source_fingerprint"] and _same_settings(
        existing, provenance
    ):  # (a run with --retry-failed finishes it, unless something else differs)
        return (
            "a run with --retry-failed stopped while it took repaired failed images into the "
            "store: pass --retry-failed (retry_failed=True) again to finish it"
        )
    # A retry takes repaired failures only where nothing else differs (the settings).
    retrying = retry_failed and _same_settings(existing, provenance)
    difference = _source_difference(f, source, rows, retrying)
    if difference and _repaired_failures(f, provenance, source, rows) is not None:
        difference += (
            "; it failed in the store (or was not extracted yet) and has changed since: "
            "pass --retry-failed (retry_failed=True) to extract the changed failed images again"
        )
    if difference is None and others and existing.get("shard_world_size", 1) > 1:
        # Its fingerprint covers the whole source: what changed are other ranks' images.
        difference = (
            f"shard {existing.get('shard_rank')} of {existing['shard_world_size']} holds its "
            "images unchanged, and images of the source in other shards changed (a shard's "
            "fingerprint covers the whole source); only a run of every rank under torchrun "
            "takes them as repaired failed images"
        )
    return difference


def _takes_retries(provenance: dict, retry_failed: bool, attrs: dict) -> bool:
    """Whether the checks of a store (its ``attrs``) against the request ``provenance``
    take its failed images changed since as retried, not as differences (as
    :func:`_source_explained` does): with ``retry_failed``, where the two agree on all but
    the images (a shard's rank and rows its own)."""
    return retry_failed and _same_settings(attrs, provenance | shard_own(attrs))


def _same_settings(existing: dict, provenance: dict) -> bool:
    """Whether a store's attributes and a request agree on everything but the images: a
    request in another precision (bfloat16 against float32) is no repair of failures."""
    existing, provenance = with_defaults(existing), with_defaults(provenance)
    return all(existing.get(k) == provenance.get(k) for k in _SETTINGS)


def _repaired_failures(
    f, provenance: dict, source, rows, vouched: bool = False, retry_failed: bool = True
) -> tuple | None:
    """Whether the store ``f`` differs from the request only by images whose files changed
    in a way the store can take: with ``retry_failed``, failed images that have changed
    since (repaired, replaced; or images not extracted yet, which no row holds features of
    either); and, retried or not, files touched since (:func:`_touched`). Then the stored
    file identities with the request's in place of theirs and the rows to extract again,
    ``(file_size, file_mtime_ns, retried)``; otherwise None, and any other difference is
    left to the provenance check, which refuses it.

    A shard holds some rows of the source, and its fingerprint covers the whole source: a
    shard whose own rows are unchanged cannot tell what changed in the others. It takes the
    request's fingerprint only when ``vouched``: under torchrun, when the merged store of
    the earlier run differs from the request only by such files.
    """
    existing = read_attrs(f)
    if existing.get("source_fingerprint") == provenance["source_fingerprint"]:
        return None
    # An adoption of this very source, killed before it wrote the fingerprint: it had
    # found the store to differ by repaired failures alone; a retry finishes it now.
    adopting = existing.get(ADOPTING) == provenance["source_fingerprint"]
    if adopting and not retry_failed:
        return None  # (refused, saying to pass --retry-failed again)
    # A store of every row of the source whose rows agree with the request has its
    # fingerprint (an adoption of touched files killed before it wrote it).
    whole = existing.get("n_rows") == existing.get("n_total_rows")
    vouched = vouched or adopting or whole
    if not _same_settings(existing, provenance) or "file_size" not in f:
        return None
    if (existing.get("source_files") or {}) != source.files:
        return None
    if list(f["class_names"].asstr()[:]) != list(source.class_names):
        return None
    ids = f["paths"].asstr()[:]
    if len(ids) != len(rows) or list(ids) != [source.ids[i] for i in rows]:
        return None
    if not np.array_equal(f["labels"][:], source.labels[rows]):
        return None
    # A subset (--per-class) keeps its images while others are added before them: their
    # positions in the source, which the store records, are then another difference.
    if not np.array_equal(f["indices"][:], source.source_index[rows]):
        return None
    sizes, mtimes = source.file_stats()
    stored_sizes, stored_mtimes = f["file_size"][:], f["file_mtime_ns"][:]
    changed = (stored_sizes != sizes[rows]) | (stored_mtimes != mtimes[rows])
    status = f["status"][:]
    # failed, or pending (see above)
    retried = changed & (status != DONE) if retry_failed else np.zeros_like(changed)
    if not _touched(f, source, rows, changed & ~retried, status).all():
        return None
    if not changed.any() and not vouched:
        return None
    stored_sizes[changed], stored_mtimes[changed] = sizes[rows][changed], mtimes[rows][changed]
    return stored_sizes, stored_mtimes, retried


def _touched(f, source, rows, changed: np.ndarray, status: np.ndarray) -> np.ndarray:
    """Which of the store ``f``'s rows ``changed`` (a mask over ``rows``; their files
    differ from the store's) hold what the store would hold of their files as they are:
    files touched (their size kept, their modification time not) whose bytes the row
    records (``content_sha256``, read again: those files alone), and those of rows not
    extracted yet (pending), which hold nothing of them. Read in order up to the first
    that is not: the mask is False from there on."""
    sizes, _ = source.file_stats()
    same = changed & (f["file_size"][:] == sizes[rows]) & (sizes[rows] != NOT_A_FILE)
    if (changed & ~same).any():  # (not read: the store cannot take them)
        return same | ~changed
    kept = np.flatnonzero(same & (status != PENDING))  # done or failed: their bytes
    first = first_other_bytes(f, source, rows, kept)
    if first is not None:
        same[first[0] :] = False
    return same | ~changed


def _adopt_repaired_failures(
    out: Path, provenance: dict, source, rows, vouched: bool = False, retry_failed: bool = True
) -> bool:
    """Before a run: the images of ``out`` whose files changed in a way it can take
    (:func:`_repaired_failures`) are taken as the store's: with ``retry_failed`` the failed
    ones that have changed since have their rows marked pending, then the size and
    modification time of each, and the store's fingerprint, become the request's. Left
    failed, a retry stopped before it reached them (or, under torchrun, before the merge
    into the merged store) kept the old file's reason and digest under the new file's
    identity, and a plain rerun took the store as complete. A touched file whose bytes the
    store holds keeps its row as it is, under its new modification time: the store is then
    the one a run on the files as they are writes, and the next run reads no file again.

    A complete store that differs by touched files alone and cannot be opened for writing
    (open elsewhere, its mode read-only) is left as it is, with a warning: True then (the
    request is the store's, its fingerprint aside), as a store in a read-only folder is
    reused; it was refused for the lock or the permission that nothing else needed."""
    with open_store(out, "r") as f:
        repaired = _repaired_failures(f, provenance, source, rows, vouched, retry_failed)
        attrs = read_attrs(f)
        stored_mtimes = f["file_mtime_ns"][:] if repaired is not None else None
        status = f["status"][:] if repaired is not None else None
    if repaired is None:
        if retry_failed:  # (otherwise the caller's, which can leave it)
            _drop_finished_mark(out, attrs)
        return False
    sizes, mtimes, changed = repaired
    n_changed = int(changed.sum())
    n_touched = int(((stored_mtimes != mtimes) & ~changed).sum())
    read_only = not n_changed and _times_alone(attrs, status, retry_failed)
    try:
        check_attrs_room(out)  # (on a full disk the attributes' writes left it unreadable)
        f = open_store(out, "r+")
    except StoreError as error:
        if not read_only:
            raise
        if n_touched:  # (none: the rows agree, its fingerprint alone was not written)
            warn_unrecorded(out, n_touched, error)
        return True
    with f:
        # The files' identities, then the fingerprint that covers them; a retry killed
        # between the two leaves the marker, by which the next one finishes the adoption.
        # (Touched files alone: the rows, all the store's, tell the next run.)
        if retry_failed:
            f.attrs[ADOPTING] = provenance["source_fingerprint"]
            f.flush()
        if n_changed:  # none is done (see _repaired_failures): to extract again
            status = f["status"][:]
            status[changed] = PENDING
            f["status"][:] = status
            f.flush()
        f["file_size"][:], f["file_mtime_ns"][:] = sizes, mtimes
        f.flush()
        f.attrs["source_fingerprint"] = provenance["source_fingerprint"]
        f.flush()
        if retry_failed:
            del f.attrs[ADOPTING]
    if n_touched:
        were, its, its_new, time_is = _touched_words(n_touched)
        logger.info(
            "%d %s touched since %s was made, %s bytes unchanged (by their sha256): %s "
            "modification %s recorded.",
            *(n_touched, were, out, its, its_new, time_is),
        )
    if n_changed:
        logger.info(
            "%d failed %s changed since; %s extracted again.",
            n_changed,
            "image has" if n_changed == 1 else "images have",
            "it is" if n_changed == 1 else "they are",
        )
    return False


def _times_alone(attrs: dict, status: np.ndarray, retry_failed: bool) -> bool:
    """Whether a store (its ``attrs`` and ``status``) that differs from a request by files
    touched since alone has nothing to write but their new times: no row to extract
    (again), no mark of an adoption to finish. One that cannot be written is kept so."""
    return (
        not (status == PENDING).any()
        and not (retry_failed and (status == FAILED).any())
        and attrs.get(ADOPTING) in (None, attrs.get("source_fingerprint"))
    )


def _touched_words(n: int) -> tuple:
    """The words that agree with ``n`` files touched since a store was made."""
    one = n == 1
    return (
        "image file was" if one else "image files were",
        "its" if one else "their",
        "its new" if one else "their new",
        "time is" if one else "times are",
    )


def warn_unrecorded(out: Path, n_touched: int, error: StoreError) -> None:
    """Warn that the new modification times of ``n_touched`` files of ``out``, touched
    since and its bytes by their sha256, are not recorded as ``error`` says."""
    were, its, its_new, time_is = _touched_words(n_touched)
    logger.warning(
        "%d %s touched since %s was made, %s bytes unchanged (by their sha256), but %s "
        "modification %s not recorded, as the store cannot be opened for writing (%s): "
        "each run reads %s again until one can write it.",
        *(n_touched, were, out, its, its_new, time_is),
        " ".join(str(error).split()).removesuffix("."),
        "it" if n_touched == 1 else "them",
    )


def _drop_finished_mark(out: Path, attrs: dict, best_effort: bool = False) -> None:
    """Remove the mark of an adoption killed after it wrote the fingerprint, before it
    removed the mark (``attrs`` are ``out``'s): the adoption is finished, whichever run
    comes next (one without --retry-failed too, which otherwise left the mark in the
    metadata of the store it completed). With ``best_effort`` a store that cannot be
    opened for writing (open elsewhere, say) keeps it, as such a run found it: the run
    only reads a finished store."""
    if not attrs.get(ADOPTING) == attrs.get("source_fingerprint") is not None:
        return
    try:
        with open_store(out, "r+") as f:
            del f.attrs[ADOPTING]
    except (StoreError, OSError) as error:
        if not best_effort:
            raise
        logger.info(
            "%s keeps the mark of a --retry-failed run stopped before it removed it (%s), "
            "as it could not be opened for writing: %s. A later run removes it.",
            out,
            ADOPTING,
            " ".join(str(error).split()).removesuffix("."),
        )


def _rebuilding(merged: Path, world_size: int | None) -> bool:
    """Whether shards of ``world_size`` ranks (of any number, if None) beside ``merged``
    are those of a forced rebuild of this very version of it, stopped before its merge
    (they say so: finished runs leave their shards too, and a store written since is not
    the one they replace)."""
    return bool(_rebuild_shards(merged, world_size))


def _rebuild_shards(merged: Path, world_size: int | None) -> list[Path]:
    """The shards of :func:`_rebuilding`'s forced rebuild there are."""
    identity = _identity(merged)
    if world_size is None:
        paths = shards_beside(merged)
    else:
        paths = [shard_path(merged, r, world_size) for r in range(world_size)]
    return [path for path in paths if path.exists() and _replaces(path) == identity]


def _replaces(shard: Path, mark: str = REPLACES) -> str | None:
    """The version of the merged store that ``shard`` replaces (a forced run's mark), or
    with ``mark=MERGED_INTO`` the one it went into (merge_shards's), if any."""
    # Without HDF5's lock: another rank may be writing its shard already, and a reader's
    # lock would refuse that writer, or the writer's this reader.
    try:
        with h5py.File(shard, "r", locking=False) as f:
            return f.attrs.get(mark)
    except OSError:  # not a store (its own rank says so when it opens it), or none
        return None


def _shards_vouch(
    shards: dict[int, Path], provenance: dict, source, rows_of, retry_failed: bool = True
) -> bool:
    """Whether the shards a torchrun run resumes (rank -> path: a rebuild's, or with no
    merged store, those there are) differ from the request only by failed images changed
    since (repaired; with ``retry_failed``) and files touched since whose bytes they hold
    (:func:`_repaired_failures`): then every rank takes the request's listing, and each
    rank its own repairs. A rank's rows (``rows_of(rank)``) without such a shard are
    extracted anew whatever they hold. Read without HDF5's lock: another rank may be
    taking in its repairs (each state of which passes). Without ``retry_failed``, shards
    that all agree with the request vouch for nothing."""
    differ = False
    for rank, path in shards.items():
        try:
            with h5py.File(path, "r", locking=False) as f:
                attrs = read_attrs(f)
                if attrs.get("source_fingerprint") == provenance["source_fingerprint"]:
                    continue
                differ = True
                own = provenance | shard_own(attrs)
                rows = rows_of(rank)
                if _repaired_failures(f, own, source, rows, True, retry_failed) is None:
                    return False
        except OSError:
            return False
    return differ or retry_failed


def _shards_explained(
    shards: dict[int, Path], provenance: dict, source, rows_of, retry_failed: bool
) -> str | None:
    """The first image, in rank order, in which the shards a torchrun run resumes (rank ->
    path) differ from the request (their rows ``rows_of(rank)``), as
    :func:`_source_explained` names it: every rank names it, whichever shard holds it.
    Read without HDF5's lock, as other ranks may be writing their shards."""
    for rank, path in shards.items():
        try:
            with h5py.File(path, "r", locking=False) as f:
                own = provenance | shard_own(read_attrs(f))
                difference = _source_explained(
                    f, own, source, rows_of(rank), retry_failed, others=False
                )
        except OSError:  # not a store: its own rank says so
            continue
        if difference:
            return difference
    return None


def _check_other_shard(
    path: Path, provenance: dict, vouched: bool, explain_source: Callable[[], str | None]
) -> None:
    """Refuse a request that another rank's shard ``path`` was not made by (its rank and
    rows aside; and where the run ``vouched`` for repaired failures, the listing, which
    they changed), ``explain_source`` naming the image that differs; read without HDF5's
    lock, as that rank may be writing it."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            attrs = read_attrs(f)
    except OSError:  # not a store: its own rank says so
        return
    own = shard_own(attrs)
    if vouched:
        own["source_fingerprint"] = attrs.get("source_fingerprint")
    check_provenance(path, attrs, provenance | own, explain_source)


def _refuse_other_rebuild(merged: Path, world_size: int) -> None:
    """Refuse to reuse or resume ``merged`` while a forced rebuild of it by another number of
    ranks than ``world_size`` is unfinished beside it: its rows are to be replaced."""
    shards = _rebuild_shards(merged, None)
    sizes = set()  # the numbers of ranks that such rebuilds ran at
    for shard in shards:
        with h5py.File(shard, "r", locking=False) as f:
            sizes.add(int(f.attrs.get("shard_world_size", 0)))
    if not sizes or world_size in sizes:
        return
    ranks = " or ".join(map(str, sorted(sizes)))
    raise StoreError(
        f"A forced rebuild of {os.fspath(merged)!r} by {ranks} ranks was stopped before its "
        f"merge (its shards lie beside it, {shards[0].name} the first): finish it with "
        f"{ranks} ranks (torchrun --nproc_per_node {min(sizes)}), whose merge replaces the "
        "store, or rebuild the store anew with --force (overwrite=True)."
    )


def _open_or_create(
    out: Path, provenance: dict, backbone: Backbone, source, rows, overwrite: bool,
    retry_failed: bool = False, vouched: bool = False, replaces: str | None = None,
) -> None:  # fmt: skip
    if out.exists() and not overwrite:
        with open_store(out, "r") as f:
            check_written(out, f)  # (a dataset deleted by hand: h5py's KeyError below)
        # Failed images repaired (with --retry-failed) and files touched since, taken in.
        held = _adopt_repaired_failures(out, provenance, source, rows, vouched, retry_failed)
        with open_store(out, "r") as f:
            existing = read_attrs(f)
            check_provenance(
                out,
                existing,
                # (touched files alone, whose times it could not record: the store's)
                provenance
                | ({"source_fingerprint": existing.get("source_fingerprint")} if held else {}),
                lambda: _source_explained(f, provenance, source, rows, retry_failed),
            )
        _drop_finished_mark(out, existing, best_effort=True)  # (a retry removed it above)
        _warn_of_other_versions(out, existing.get("versions"))
        return
    sizes, mtimes = source.file_stats()
    create_store(  # replaces an existing store (overwrite) in one atomic rename
        out,
        provenance=provenance,
        record=dict(
            versions=library_versions(),
            backbone_spec=str(backbone.spec),
            source=source.description,
            source_files=source.files,
            **({REPLACES: replaces} if replaces else {}),
        ),
        dim=backbone.dim,
        dtype=provenance["dtype"],
        labels=source.labels[rows],
        indices=source.source_index[rows],
        ids=[source.ids[i] for i in rows],
        class_names=source.class_names,
        file_size=sizes[rows],
        file_mtime_ns=mtimes[rows],
    )


def _warn_of_other_versions(out: Path, versions) -> None:
    if versions != library_versions():
        logger.warning(
            "%s was started with other library versions: %s; now %s",
            out,
            versions,
            library_versions(),
        )
