"""Per-rank shard stores of one extraction, merged into one store in source order."""

from __future__ import annotations

import glob
import itertools
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import h5py
import numpy as np

from ._locks import store_lock
from ._paths import expand_home
from ._reading import _open_for_reading
from ._schema import (
    ADOPTING,
    MERGED_INTO,
    PENDING,
    PROVENANCE_KEYS,
    REPLACES,
    IncompleteStoreError,
    ProvenanceError,
    StoreError,
    read_attrs,
    shard_own,
)
from ._store import (
    DAMAGE_ERRORS,
    NO_ROOM,
    _check_companions,
    check_attrs_room,
    check_format,
    check_output,
    check_provenance,
    check_written,
    create_store,
    make_output_folder,
    open_store,
    output_target,
    provenance_differences,
)

logger = logging.getLogger(__name__)
_MERGE_BLOCK = 8192  # shard rows copied at a time, bounding memory


def shard_path(out: str | os.PathLike, rank: int, world_size: int) -> Path:
    """``features.h5`` -> ``features.shard-00001-of-00004.h5``.

    Examples
    --------
    >>> from extract import shard_path
    >>> shard_path("features.h5", rank=1, world_size=4).name
    'features.shard-00001-of-00004.h5'
    """
    out = Path(out)
    return out.with_name(f"{out.stem}.shard-{rank:05d}-of-{world_size:05d}{out.suffix}")


def shards_beside(out: str | os.PathLike) -> list[Path]:
    """The shards of ``out`` there are, of any number of ranks (:func:`shard_path`'s names).
    The glob's ``*`` alone took, for an ``out`` without a suffix (``feats``), the shards of
    ``feats.h5`` beside it (``feats.shard-00000-of-00002.h5``): each name must be one."""
    out = Path(out)
    name = re.compile(rf"{re.escape(out.stem)}\.shard-\d+-of-\d+{re.escape(out.suffix)}")
    found = out.parent.glob(f"{glob.escape(out.stem)}.shard-*-of-*{glob.escape(out.suffix)}")
    return sorted(path for path in found if name.fullmatch(path.name))


def merge_shards(
    shards: Iterable[str | os.PathLike], out: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Merge per-rank shard stores into one store in source order.

    Each shard holds some rows of the source (rank ``r`` of ``W``: rows ``r, r + W, ...``
    of a folder, the rows of every ``W``-th tar shard or row group of a WebDataset or
    Parquet source); the merge checks that every rank is present once, that all shards
    share one provenance and are complete and together hold every row once, and writes
    each row to its position in the source (by the shards' ``indices``). An existing
    ``out`` is replaced only if its provenance matches, or if ``overwrite`` is True. Each
    shard is then marked with the version of ``out`` it went into (where it can be
    written; a warning names one that cannot be), so that a later run does not resume a
    shard of a store rebuilt otherwise since.

    Parameters
    ----------
    shards : iterable of path-like
        Every shard of one run, any order (at least one).
    out : path-like
        The merged store (written atomically, under the store lock).
    overwrite : bool, default=False
        Replace an existing ``out`` whatever it was made from.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If no shards are given or ranks are missing or repeated; ``ProvenanceError`` if the
        shards (or an existing ``out``) disagree; ``IncompleteStoreError`` if a shard has
        pending rows; ``ProvenanceError`` too if a shard went into another version of an
        existing ``out`` than the one there (written since: ``extract_features`` makes such
        a shard anew, or ``overwrite=True`` replaces ``out`` with their rows).
    """
    if not isinstance(overwrite, bool | np.bool_):  # ("no" replaced any store at out)
        raise ValueError(
            "The 'overwrite' parameter of merge_shards must be True or False. Got "
            f"{overwrite!r} instead."
        )
    return _merge(shards, out, overwrite, versions_checked=False)


def _merge(shards, out, overwrite: bool, versions_checked: bool) -> Path:
    """:func:`merge_shards`; ``versions_checked``: the caller made anew every shard that went
    into another version of ``out`` (torchrun's merge, whose repair of ``out`` comes first)."""
    if isinstance(shards, str | bytes | os.PathLike):  # one path is no list of paths
        raise TypeError(
            f"The 'shards' parameter of merge_shards takes a list of shard paths, got one "
            f"path, {os.fsdecode(shards)!r}; pass [path] for a single shard."
        )
    shards = list(shards)  # counted and read once each: a generator is taken too
    if not shards:
        raise ValueError(
            "The 'shards' parameter of merge_shards holds no shards; pass every shard of "
            "one run: the paths extract_features(..., rank=r, world_size=W) returned for r "
            "in range(W)."
        )
    files = {}
    reference = None  # every shard is checked against the first one given
    try:
        for path in shards:
            path = expand_home(os.fspath(path))  # (~: as extract_features writes a shard)
            f = _open_for_reading(path)
            attrs = read_attrs(f)
            check_format(path, attrs, shard=True)
            rank = attrs["shard_rank"]
            if rank in files:
                f.close()
                raise ValueError(f"Two shards given to merge_shards have rank {rank}.")
            files[rank] = f
            if reference is None:
                reference, first = attrs, path
            _check_shard(path, f, reference, first, len(shards))
        if sorted(files) != list(range(len(shards))):
            raise ValueError(
                f"merge_shards needs every rank of one run exactly once; got ranks "
                f"{sorted(files)} from {len(shards)} shards."
            )
        _warn_of_versions(files)
        out = output_target(out)
        check_output(out, overwrite)
        check_merging(os.fspath(out))
        make_output_folder(out)
        with store_lock(out):
            _write_merged(files, out, overwrite, versions_checked)
        merged_shards = [f.filename for f in files.values()]
    finally:
        for f in files.values():
            f.close()
    _mark_merged(merged_shards, out)
    return Path(out)


def _identity(path: str | os.PathLike) -> str:
    """A file's size and modification time: which version of a store a shard names."""
    stat = os.stat(path)
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _refuse_other_versions(files: dict[int, h5py.File], out: Path) -> None:
    """Refuse shards marked as merged into another version of ``out`` than the one there:
    it was written since (rebuilt otherwise, say for images changed in place, which the
    provenance cannot see), and their rows may not be its."""
    identity = _identity(out)
    other = [f.filename for f in files.values() if f.attrs.get(MERGED_INTO) not in (None, identity)]
    if other:
        raise ProvenanceError(
            f"{len(other)} of the {len(files)} shards given to merge_shards (the first, "
            f"{other[0]!r}) went into another version of {os.fspath(out)!r} than the one "
            "there, which was written since: their rows may not be its (images changed in "
            "place, say). Extract them again (extract_features(..., rank=r, world_size=W) "
            "makes such a shard anew), or pass overwrite=True to replace the store with "
            "their rows as they are."
        )


def _mark_merged(shards: list[str], out: str | os.PathLike) -> None:
    """Mark each shard with the version of ``out`` it went into: a later run tells a shard
    of this store from one of a store since rebuilt otherwise, whose rows it may not hold
    (images changed in place). Best effort: a shard that cannot be written stays as it is."""
    identity = _identity(out)
    for path in shards:
        problem = _mark(path, identity)
        if problem:
            # (on a full disk a rerun reuses the merged store: it does not mark the shard)
            full = problem.startswith(NO_ROOM)
            logger.warning(
                "Could not mark the shard %s with the version of %s it went into: %s. A "
                "later run cannot tell whether it went into the store as it is then (it "
                "may extract it anew, or resume it as it is); %s it now that it is merged.",
                path,
                out,
                problem,
                "delete" if full else "make it writable, or delete",
            )


def _mark(path, value: str, over: bool = True) -> str | None:
    """Set the shard's MERGED_INTO mark to ``value`` (not over one it has, unless
    ``over``); best effort: the OSError that prevented it (or the lack of room for it),
    on one line without its final full stop (a sentence of the caller's), else None."""
    try:
        with h5py.File(path, "r+") as f:
            if over or MERGED_INTO not in f.attrs:
                # (on a full disk the write left it unreadable; the caller advises)
                check_attrs_room(path, "the shard is left as it was", advice=None)
                f.attrs[MERGED_INTO] = value
    except (OSError, StoreError) as err:
        return " ".join(str(err).split()).removesuffix(".")
    return None


def unmarked_shards(out: str | os.PathLike, world_size: int | None = None) -> list[Path]:
    """The shards beside ``out`` of another number of ranks than ``world_size`` (any, where
    None) that carry no mark of a merge or of being superseded: an interrupted run's. (One
    that cannot be read counts among them: whoever marks it names what is wrong with it.)"""
    own = re.compile(rf"\.shard-\d+-of-{world_size:05d}") if world_size is not None else None
    found = []
    for path in shards_beside(out):
        if own is not None and own.search(path.name):
            continue
        if not h5py.is_hdf5(path):  # a lock or a partial file, where out has no suffix
            continue
        try:  # (a merged shard, read-only say, is not opened for writing)
            with h5py.File(path, "r", locking=False) as f:
                if MERGED_INTO in f.attrs:
                    continue
        except OSError:
            pass
        found.append(path)
    return found


def mark_superseded(
    out: str | os.PathLike, world_size: int | None = None, by: str = "a forced rebuild"
) -> None:
    """Mark the shards beside ``out`` that no run has merged (an interrupted run's), of
    another number of ranks than ``world_size`` (any, where None), as gone into another
    version of ``out``: a forced rebuild writes it otherwise (has written it, under
    torchrun; is about to, in one process), or a run at ``world_size`` has completed it.
    Resumed at their number of ranks, their rows (of images replaced since, in place,
    which the provenance cannot see: what --force is for, or not) went into the newer
    store; marked, they are made anew from its rows."""
    # Any value but the store's identity: the store may not be written yet.
    superseded = f"superseded by {by}" + (f" ({_identity(out)})" if os.path.exists(out) else "")
    for path in unmarked_shards(out, world_size):
        problem = _mark(path, superseded, over=False)  # a merged shard keeps its mark
        if problem:
            logger.warning(
                "Could not mark the shard %s of an interrupted run as superseded by %s of "
                "%s: %s. A later run at its number of ranks may resume it, its rows those "
                "of the images as they were; delete it.",
                path,
                by,
                out,
                problem,
            )


def _warn_of_versions(files: dict[int, h5py.File]) -> None:
    """Say which shards were extracted with other library versions than rank 0's, which
    the merged store records (a resume with other versions says so too)."""
    versions = {rank: read_attrs(f).get("versions") for rank, f in files.items()}
    other = sorted(rank for rank, v in versions.items() if v != versions[0])
    if other:
        logger.warning(
            "%d of the %d shards were extracted with other library versions than rank 0's "
            "shard %s (%s), which the merged store records; the first, %s: %s",
            len(other),
            len(files),
            files[0].filename,
            versions[0],
            files[other[0]].filename,
            versions[other[0]],
        )


def check_merging(text: str) -> None:
    """Refuse to merge when ``<out>.merging`` (the merged store until its rename) or its
    ``.tmp`` is a file of another kind than a merge's leftover: it would be replaced."""
    merging = f"{text}.merging"
    _check_companions(merging)  # its .tmp, as create_store leaves it
    if os.path.islink(merging):
        problem = f"{merging!r} is a symbolic link (writing through it would change its target)"
    elif os.path.lexists(merging) and not _merge_leftover(merging):
        problem = f"{merging!r} exists and is not a merged store left by a killed merge"
    else:
        return
    raise StoreError(
        f"{problem}; mr2-extract writes that path beside the store {text!r}: move the file "
        "away or choose another output path."
    )


def _merge_leftover(path: str) -> bool:
    """Whether ``path`` is a store that a merge wrote (it records ``merged_from``)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return "features" in f and "merged_from" in f.attrs
    except DAMAGE_ERRORS:  # (not open, or its structures cannot be read: no merge's)
        return False


def _check_shard(path, f: h5py.File, reference: dict, first, world: int) -> None:
    """Refuse a shard of another run than the ``first`` shard given (its attributes
    ``reference``), or an incomplete one."""
    attrs = read_attrs(f)
    if attrs["shard_world_size"] != world:
        raise ValueError(
            f"The shard {os.fspath(path)!r} is one of {attrs['shard_world_size']} shards, "
            f"but {world} were given to merge_shards."
        )
    check_written(path, f, shard=True)  # (a dataset deleted by hand: h5py's KeyError)
    diffs = provenance_differences(attrs, reference | shard_own(attrs), names=("it", "the first"))
    if diffs:
        # Only the listing differs (not the source's root, backbone or settings): the
        # ranks listed one source at different times, or took other subsets of it (which
        # the listing alone records).
        keys = {d.split(":")[0].split(".")[0] for d in diffs}
        listed = keys <= {"source_fingerprint", "n_total_rows"}
        advice = (
            "The ranks listed different images: the source changed between their starts, "
            "or they were asked for different subsets (--per-class (n_per_class) or "
            "--max-items (max_items)). Extract every rank again with --force "
            "(overwrite=True) from the source as it is now, each with the same options."
            if listed
            else "Merge the shards of one run."
        )
        raise ProvenanceError(
            f"The shard {os.fspath(path)!r} was not made by the run of the first shard "
            f"given, {os.fspath(first)!r} ({'; '.join(diffs)}). {advice}"
        )
    pending = int((f["status"][:] == PENDING).sum())
    if pending:
        raise IncompleteStoreError(
            f"The shard {os.fspath(path)!r} has {pending} rows not extracted; finish its run "
            "(the same command again) before merging."
        )


def _merged_positions(files: dict[int, h5py.File], n: int) -> dict[int, np.ndarray]:
    """Where each shard's rows go in the merged store: source order, by ``indices``."""
    indices = {rank: f["indices"][:] for rank, f in files.items()}
    order = np.sort(np.concatenate(list(indices.values())))
    if len(order) != n or (np.diff(order) == 0).any():
        raise ValueError(
            f"The shards given to merge_shards hold {len(order)} rows for a source of {n}, "
            "or hold a row twice; merge the shards of one run."
        )
    return {rank: np.searchsorted(order, idx) for rank, idx in indices.items()}


def _runs(positions: np.ndarray) -> Iterator[tuple[slice, slice]]:
    """``(merged slice, shard slice)`` pairs covering increasing ``positions``.

    One strided slice when the positions are evenly spaced (rank r of W holding rows
    r, r + W, ... of a folder), else one slice per run of consecutive rows (whole shards).
    """
    steps = np.diff(positions)
    if len(positions) == 1 or (steps == steps[0]).all():
        step = int(steps[0]) if len(steps) else 1
        yield slice(int(positions[0]), int(positions[-1]) + 1, step), slice(None)
        return
    bounds = [0, *(np.flatnonzero(steps != 1) + 1).tolist(), len(positions)]
    for lo, hi in itertools.pairwise(bounds):
        yield slice(int(positions[lo]), int(positions[hi - 1]) + 1), slice(lo, hi)


def _write_merged(
    files: dict[int, h5py.File], out: Path, overwrite: bool, versions_checked: bool
) -> None:
    world, first = len(files), read_attrs(files[0])
    n = first["n_total_rows"]
    positions = _merged_positions(files, n)

    def gather(name: str) -> np.ndarray:
        values = np.empty((n, *files[0][name].shape[1:]), files[0][name].dtype)
        for rank, f in files.items():
            values[positions[rank]] = f[name][:]
        return values

    provenance = {k: first[k] for k in PROVENANCE_KEYS if k in first}
    provenance |= dict(n_rows=n, shard_rank=0, shard_world_size=1)
    record = {
        k: v
        for k, v in first.items()
        # (a shard's adopting mark: a complete shard's adoption is finished)
        if k not in PROVENANCE_KEYS and k not in ("class_names", REPLACES, MERGED_INTO, ADOPTING)
    }
    if os.path.exists(out) and not overwrite:  # replace only a store of the same thing
        with open_store(out, "r") as f:
            check_provenance(out, read_attrs(f), provenance)
        if not versions_checked:
            _refuse_other_versions(files, out)
    tmp = f"{os.fspath(out)}.merging"
    # A killed merge's leftover (checked to be one) goes first: its room is the new one's.
    Path(tmp).unlink(missing_ok=True)
    try:
        create_store(
            tmp,
            provenance=provenance,
            record=record | {"merged_from": world},
            dim=files[0]["features"].shape[1],
            dtype=first["dtype"],
            labels=gather("labels"),
            indices=gather("indices"),
            ids=[p.decode() for p in gather("paths")],
            class_names=list(files[0]["class_names"].asstr()[:]),
            file_size=gather("file_size"),
            file_mtime_ns=gather("file_mtime_ns"),
        )
        with h5py.File(tmp, "r+") as merged:
            for rank, f in files.items():
                m = len(f["status"])
                for lo in range(0, m, _MERGE_BLOCK):
                    hi = min(m, lo + _MERGE_BLOCK)
                    for name in ("features", "failure_reason", "content_sha256", "status"):
                        block = f[name][lo:hi]
                        for where, part in _runs(positions[rank][lo:hi]):
                            merged[name][where] = block[part]
        os.replace(tmp, out)
    except BaseException:  # a part of a merged store is no store (a full disk, Ctrl-C)
        Path(tmp).unlink(missing_ok=True)
        raise
