"""Whether an existing store is reused as it is, and a shard resumed or seeded from the
merged store: the checks, what they say, and the seed.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from mr2_probe._h5 import name_failures

from ._merge import unmarked_shards
from ._paths import plural
from ._reading import failed_rows
from ._resume import (
    _identity,
    _repaired_failures,
    _replaces,
    _source_explained,
    _times_alone,
    _warn_of_other_versions,
    warn_unrecorded,
)
from ._schema import FAILED, MERGED_INTO, PENDING, StoreError, read_attrs
from ._store import (
    check_attrs_room,
    check_provenance,
    check_written,
    no_folder_permission,
    open_store,
)

# The run's logger (extract._runner), which users' log filters name: a store reused, or a
# shard seeded, is the run's message.
logger = logging.getLogger("extract._runner")


def _merged_elsewhere(shard: Path, merged: Path) -> bool:
    """Whether ``shard`` went into another version of the store ``merged`` than the one
    there (merge_shards's mark); not where the store is gone."""
    return merged.exists() and _replaces(shard, MERGED_INTO) not in (None, _identity(merged))


def _log_other_ranks_shards(store: Path, world_size: int) -> None:
    """Say, in one line, which interrupted runs' shards of another number of ranks than
    ``world_size`` (none merged) lie beside ``store``: this run extracts their rows again,
    where a run at their number of ranks would resume them."""
    counts = {}
    for path in unmarked_shards(store, world_size):
        n = int(re.search(r"\.shard-\d+-of-(\d+)", path.name).group(1))
        counts[n] = counts.get(n, 0) + 1
    if counts:
        n = max(counts, key=counts.get)
        logger.info(
            "The shards of an interrupted run at %s beside %s are not used by this run %s: "
            "it extracts their rows again; to resume them instead, stop it and run the "
            "command again under torchrun with %d processes.",
            " and at ".join(f"{k} ranks ({counts[k]} of {k})" for k in sorted(counts)),
            store,
            "in one process" if world_size == 1 else f"at {world_size} ranks",
            n,
        )


def _by_index(first: list[tuple[int, str, str]], rows: np.ndarray) -> list[tuple[int, str, str]]:
    """:func:`failed_rows`'s ``(row, path, reason)`` of a store of the source's ``rows`` as
    ``(source index, path, reason)``, as :func:`_run` gives them (ranks' sorted together)."""
    return [(int(rows[row]), path, reason) for row, path, reason in first]


# Rows of a shard seeded from the merged store at a time (with W ranks a block spans about
# W times as many rows of the merged store, read whole and picked from).
_SEED_BLOCK = 4096


def _seed_from_merged(shard: Path, merged: Path, rows: np.ndarray, retry_failed: bool) -> None:
    """Copy the merged store's rows ``rows`` (their features, status, failure reasons and
    digests) into the shard just created for them. The merged store matched the request
    (its failed images aside, which the retry extracts again), so its done rows are this
    shard's, and its pending rows (a store left incomplete) pending here; a copy stopped
    part way leaves the rest pending, extracted by the next run."""
    names = ("features", "failure_reason", "content_sha256", "status")
    try:
        # (on a full disk the versions' write left it unreadable)
        check_attrs_room(shard, "the shard, made for it, is removed: the next run makes it again")
    except StoreError:
        shard.unlink()  # made for the seed, holding nothing: the next run seeds it again
        raise
    with open_store(merged, "r") as src, open_store(shard, "r+") as dst:
        # Its rows were computed with the merged store's libraries, which it records.
        versions = read_attrs(src).get("versions")
        if "versions" in src.attrs:
            dst.attrs["versions"] = src.attrs["versions"]
        _warn_of_other_versions(shard, versions)
        for lo in range(0, len(rows), _SEED_BLOCK):
            block = rows[lo : lo + _SEED_BLOCK]
            span = slice(int(block[0]), int(block[-1]) + 1)  # rows increase in a shard
            for name in names:  # status last: a row counts as done once all is there
                dst[name][lo : lo + len(block)] = src[name][span][block - span.start]
        taken = int((dst["status"][:] != PENDING).sum())
    if taken:  # (none where the rank has no rows, or the store none done)
        logger.info("%s takes %d %s from %s%s.", shard, taken, plural(taken, "row"), merged,
                    "; its failed images are extracted again" if retry_failed else "")  # fmt: skip


def _is_complete(
    store: Path, provenance: dict, src, rows: np.ndarray, retry_failed: bool, log: bool,
    touched: bool | None = None,
) -> bool:  # fmt: skip
    """Whether ``store`` already holds the whole request (then it is reused as it is);
    a store made differently is refused here, before any GPU work. Under torchrun every
    rank reads the merged store before any writes it, and the ranks compare their
    verdicts (:func:`_complete_on_every_rank`). ``touched``: whether it differs from the
    request by files touched since alone, where the caller found it (None: found here)."""
    with open_store(store, "r") as f:
        check_written(store, f)
        attrs = read_attrs(f)
        # Files touched since whose bytes it holds (where it cannot be written, as in a
        # read-only folder: a store that can, records their times before this check).
        if touched is None:
            touched = _repaired_failures(f, provenance, src, rows, False, False) is not None
        asked = provenance | (
            {"source_fingerprint": attrs.get("source_fingerprint")} if touched else {}
        )
        check_provenance(
            store,
            attrs,
            asked,
            lambda: _source_explained(f, provenance, src, rows, retry_failed),
        )
        status = f["status"][:]
    if (status == PENDING).any() or retry_failed and (status == FAILED).any():
        return False
    if log:
        _say_reused(store, src, rows)
    return True


def _say_reused(store: Path, src, rows: np.ndarray) -> None:
    """Say that ``store``, found complete for the source's ``rows``, is reused: its
    failures, and files touched since whose new times it does not record."""
    _, mtimes = src.file_stats()
    with open_store(store, "r") as f:
        status = f["status"][:]
        first_failed = failed_rows(f)
        # (a store found complete differs from the files by touched ones alone)
        n_touched = int((f["file_mtime_ns"][:] != mtimes[rows]).sum())
    if n_touched:  # warned of as where the store's own mode forbids writing it
        warn_unrecorded(store, n_touched, no_folder_permission(store))
    _log_reused(store, status, first_failed)


def _touched_alone(
    store: Path, provenance: dict, src, rows: np.ndarray, retry_failed: bool
) -> bool:
    """Whether ``store`` is complete for the request and differs from it by files touched
    since, whose bytes it holds, alone (what a store that cannot be written keeps)."""
    with open_store(store, "r") as f:
        # (first what reads no image: with --retry-failed a store with failed rows has
        # more to write, and its touched failed images are not read)
        if not _times_alone(read_attrs(f), f["status"][:], retry_failed):
            return False
        return _repaired_failures(f, provenance, src, rows, False, False) is not None


def _log_reused(path: Path, status: np.ndarray, first_failed: list[tuple[int, str, str]]) -> None:
    n_failed = int((status == FAILED).sum())
    if not n_failed:
        logger.info(
            "Reused the complete feature store %s (%d rows, nothing to compute); pass --force "
            "(overwrite=True) to recompute it.",
            path,
            len(status),
        )
        return
    # The rows counted as the command line's summary counts them: usable ones of all.
    logger.info(
        "Reused the complete feature store %s (%d usable rows of %d, nothing to compute); "
        "%d recorded as failed %s, which --retry-failed (retry_failed=True) extracts again; "
        "pass --force (overwrite=True) to recompute it.",
        path,
        len(status) - n_failed,
        len(status),
        n_failed,
        name_failures(n_failed, first_failed),
    )
