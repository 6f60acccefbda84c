"""Extraction into the HDF5 store: schema, failures, provenance, locking, loading, shards."""

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("timm")

from extract import (  # noqa: E402
    IncompleteStoreError,
    NotAStoreError,
    ProvenanceError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    extract_features,
    fashion_mnist,
    image_folder,
    load_features,
    merge_shards,
    open_source,
    shard_path,
)
from extract._images import load_image  # noqa: E402
from extract._locks import store_lock  # noqa: E402
from extract._reading import ONE_SHARD  # noqa: E402
from extract._schema import DONE, FAILED, PENDING  # noqa: E402
from extract._store import check_output, open_store  # noqa: E402
from extract._testing import make_image_folder, write_idx  # noqa: E402
from tests._alarm import fails_after_waiting  # noqa: E402

# Tiny backbones on tiny images: a second torch thread only waits (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

BACKBONE = "timm:test_resnet@random"
# On the CPU wherever a test is about something else than the device: with a GPU present
# the default device computes in bfloat16 and decodes JPEGs there, and rows from batches
# of other sizes then differ by more than these tests' float32 tolerances.
FAST = dict(batch_size=4, num_workers=0, image_size=32, progress=False, device="cpu")
# HDF5's words for a gzip chunk that no longer decompresses: "filter returned failure"
# (HDF5 1.14 on), "inflate() failed" (HDF5 1.12, under h5py 3.8, the floor).
DAMAGED_CHUNK = r"(filter returned failure|inflate\(\) failed)"


def _not_writable(monkeypatch, path: Path) -> None:
    """Make ``os.access`` say that ``path`` (a folder, or a store file) cannot be written,
    as on a read-only file system or under chmod 444 (the tests run as root, whom the
    mode does not stop)."""
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: access(p, mode) and not (
            mode & os.W_OK and os.path.exists(p) and os.path.samefile(p, path)
        )
    )  # fmt: skip


def _h5_refuses_writes(monkeypatch, path: Path) -> None:
    """Make h5py refuse to open ``path`` (a store file) for writing, as under chmod 444
    (the tests run as root, whom the mode does not stop)."""
    h5py_file = h5py.File

    def read_only(name, mode="r", **kwargs):
        if mode != "r" and os.path.exists(name) and os.path.samefile(name, path):
            raise PermissionError(errno.EACCES, f"Permission denied: {name}")
        return h5py_file(name, mode, **kwargs)

    monkeypatch.setattr(h5py, "File", read_only)


# Tests that read one rank's shard on purpose, beside the others (load_features warns).
_SHARDS_READ_KNOWINGLY = pytest.mark.filterwarnings(f"ignore:{ONE_SHARD}:UserWarning")


def _two_shards(source, out, **kwargs) -> list:
    """The shards of ``out`` of a run at 2 ranks, run one by one in this process (``FAST``,
    updated with ``kwargs``)."""
    return [
        extract_features(source, BACKBONE, out, rank=r, world_size=2, **(FAST | kwargs))
        for r in (0, 1)
    ]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("images") / "data", n_per_class=5)


@pytest.fixture(scope="module")
def store(folder, tmp_path_factory):
    return extract_features(folder, BACKBONE, tmp_path_factory.mktemp("out") / "f.h5", **FAST)


def test_non_finite_features_are_recorded_as_failures_not_stored(folder, tmp_path, monkeypatch):
    # A NaN from the backbone, or a feature beyond float16's range, used to be stored as a
    # completed row; every probe trained on the store then met it.
    from extract import _runner

    embed = _runner._embed

    def broken(backbone, x, normalize):
        z = embed(backbone, x, normalize)
        z[0, 3], z[1, 5] = np.nan, 1e6
        return z

    monkeypatch.setattr(_runner, "_embed", broken)
    path = extract_features(folder, BACKBONE, tmp_path / "f.h5", dtype="float16", **FAST)
    with load_features(path, in_memory=True) as s:
        assert np.isfinite(s.features).all()
        reasons = dict(s.failures)
    with h5py.File(path, "r") as f:
        status, names, stored = f["status"][:], f["paths"].asstr()[:], f["features"][:]
    # Their features are stored as zeros, as an unreadable image's are.
    assert (stored[status == FAILED] == 0).all()
    assert (stored[status != FAILED] != 0).any(axis=1).all()
    n_blocks = -(-len(status) // FAST["batch_size"])
    non_finite = [r for r in reasons.values() if "non-finite" in r]
    beyond = [r for r in reasons.values() if "beyond the range of the store's float16" in r]
    # Each block's first two readable images (unreadable ones are failures of their own).
    assert len(non_finite) == len(beyond) > 0 and len(non_finite) <= n_blocks
    assert (status == FAILED).sum() == len(reasons) and set(reasons) <= set(names)


def test_features_just_beyond_float16_are_stored_as_tested(folder, tmp_path, monkeypatch):
    # 65504 < x < 65520 passed the test in NumPy's float16 (rounded to 65504) but was
    # written as float32 and converted by HDF5, to inf, in rows marked done.
    from extract import _runner

    embed = _runner._embed

    def large(backbone, x, normalize):
        z = embed(backbone, x, normalize)
        z[:, -1] = 65510.0  # finite in float32
        return z

    monkeypatch.setattr(_runner, "_embed", large)
    path = extract_features(folder, BACKBONE, tmp_path / "f.h5", dtype="float16", **FAST)
    with h5py.File(path, "r") as f:
        status, stored = f["status"][:], f["features"][:]
    assert (status == DONE).any()
    assert np.isfinite(stored).all()
    assert (stored[status == DONE, -1] == 65504).all()


def test_schema_and_provenance(store):
    with h5py.File(store, "r") as f:
        n = 14  # 2 classes x 5 images + 4 special files
        assert f["features"].shape == (n, 96) and f["features"].dtype == np.float32
        assert f["features"].chunks is not None
        assert f["labels"].dtype == np.int64 and f["indices"][:].tolist() == list(range(n))
        assert list(f["class_names"].asstr()[:]) == ["cat", "dog"]
        assert set(f["status"][:]) == {DONE, FAILED}
        assert f.attrs["backbone"] == "timm:test_resnet"
        assert f.attrs["weights"].startswith("random-init:seed0 params-sha256:")
        assert f.attrs["dtype"] == "float32" and not f.attrs["normalize"]
        pre = json.loads(f.attrs["preprocessing"])
        assert pre["crop"] == [32, 32] and pre["mean"] == [0.5, 0.5, 0.5]
        assert pre["decode"] == "pil"
        assert f.attrs["compute"] == "float32"  # a CUDA run: "bfloat16 autocast"
        versions = json.loads(f.attrs["versions"])
        assert {"torch", "timm", "open_clip_torch", "h5py"} <= set(versions)
        assert json.loads(f.attrs["class_names"]) == ["cat", "dog"]


def test_every_byte_of_a_store_is_on_disk_from_its_creation(store):
    # failure_reason and content_sha256 were sparse holes: a disk that filled up during
    # the run refused them, and rows were marked done with empty digests.
    size = os.stat(store).st_size
    assert os.stat(store).st_blocks * 512 >= size
    with h5py.File(store, "r") as f:
        for name in ("features", "status", "failure_reason", "content_sha256"):
            assert f[name].id.get_create_plist().get_fill_time() == h5py.h5d.FILL_TIME_ALLOC


def test_a_store_without_room_is_refused_before_anything_is_written(folder, tmp_path, monkeypatch):
    from extract import _store

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(_store.shutil, "disk_usage", lambda _: usage._replace(free=4096))
    out = tmp_path / "f.h5"
    with pytest.raises(StoreError, match=r"No space left for the feature store .* MiB free"):
        extract_features(folder, BACKBONE, out, **FAST)
    assert not out.exists() and not out.with_name("f.h5.tmp").exists()
    # A leftover part of an earlier creation is replaced: its room counts as free.
    with h5py.File(out.with_name("f.h5.tmp"), "w") as f:  # a killed creation's
        f["features"] = np.zeros((1 << 18,), np.float32)  # 1 MiB
    extract_features(folder, BACKBONE, out, **FAST)
    assert out.exists() and not out.with_name("f.h5.tmp").exists()


def test_a_store_whose_creation_fails_leaves_no_part(tmp_path, monkeypatch):
    # A disk that filled up during the creation left a full-size <out>.tmp behind.
    from extract import _store

    def full(tmp, *args):
        Path(tmp).write_bytes(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_store, "_write_new_store", full)
    with pytest.raises(OSError, match="No space left"):
        _store.create_store(
            tmp_path / "f.h5", provenance={}, record={}, dim=4, dtype="float32",
            labels=np.zeros(3, int), indices=np.arange(3), ids=["a", "b", "c"],
            class_names=["x"], file_size=np.full(3, -1), file_mtime_ns=np.full(3, -1),
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_failures_are_recorded_and_skipped(store):
    with load_features(store) as loaded:
        assert sorted(p for p, _ in loaded.failures) == ["cat/corrupt.jpg", "cat/truncated.jpg"]
        assert all(reason for _, reason in loaded.failures)
        assert loaded.features.shape == (12, 96) and len(loaded.labels) == 12
        assert not set(loaded.paths) & {"cat/corrupt.jpg", "cat/truncated.jpg"}
        assert {"cat/alpha.png", "cat/grey.jpg"} <= set(loaded.paths)
        lazy = np.asarray(loaded.features)
        assert np.all(np.isfinite(lazy)) and np.all(np.abs(lazy).sum(axis=1) > 0)
        np.testing.assert_array_equal(loaded.features[2:5], lazy[2:5])
        np.testing.assert_array_equal(loaded.features[3], lazy[3])
    in_memory = load_features(store, in_memory=True)
    assert isinstance(in_memory.features, np.ndarray) and in_memory.file is None
    np.testing.assert_array_equal(in_memory.features, lazy)
    assert in_memory.metadata["backbone_spec"] == BACKBONE


def test_a_store_with_failures_indexes_as_one_without(store, monkeypatch):
    # With one failed image the features are a RowView: X[:, :4] raised IndexError where a
    # store without failures (an h5py.Dataset) took it.
    from extract._reading import RowView

    monkeypatch.setattr(RowView, "BLOCK_BYTES", 3 * 96 * 4)  # three rows a block
    with load_features(store) as loaded:
        view, whole = loaded.features, np.asarray(loaded.features)
        assert isinstance(view, RowView)
        keys = [
            3, -1, slice(None), slice(2, 9, 3), slice(None, None, -1), [7, 0, 7, 11],
            np.array([10, 2, 5]), whole[:, 0] > 0, (slice(1, 6), slice(None, 4)), (4, 5),
            ([9, 1], 0), (Ellipsis, 2), np.array([], int),
            # arrays of rows and columns are paired, not crossed (a (2, 2) block)
            ([9, 1], [0, 5]), (np.array([2, 3]), np.array([4])), (whole[:, 0] > 0, 1),
            (whole[:, 0] > 0, np.arange((whole[:, 0] > 0).sum()) % 96), ([4], whole[0] > 0),
            (slice(0, 4), [1, 5]), (slice(None, 3), whole[0] > 0),
        ]  # fmt: skip
        for key in keys:
            np.testing.assert_array_equal(view[key], whole[key], err_msg=repr(key))


def test_scattered_rows_are_read_without_the_span_they_cover(tmp_path, monkeypatch):
    # A cross-validation fold of a store with a failed image read every row between its
    # first and its last: 49 MB for 8 MB of rows on 20,000 × 512.
    import tracemalloc

    from extract._reading import RowView

    monkeypatch.setattr(RowView, "BLOCK_BYTES", 64 << 10)  # the store is 4 MB
    with h5py.File(tmp_path / "x.h5", "w") as f:
        data = np.arange(4000 * 256, dtype=np.float32).reshape(4000, 256)
        f["x"] = data
        view = RowView(f["x"], np.delete(np.arange(4000), 7))
        fold = np.arange(0, len(view), 5)
        tracemalloc.start()
        try:
            rows = view[fold]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    np.testing.assert_array_equal(rows, np.delete(data, 7, axis=0)[fold])
    assert peak < rows.nbytes + 4 * RowView.BLOCK_BYTES  # about 1 MB, not the 4 MB span


def test_a_store_is_written_through_a_symbolic_link(folder, tmp_path):
    # With --force the link became a plain file beside it and the target kept the old
    # store; a dangling link was replaced by a file; the lock, named after the spelling
    # used, did not keep out a run through the other spelling.
    real = tmp_path / "disk" / "real.h5"
    extract_features(folder, BACKBONE, real, max_items=4, **FAST)
    link = tmp_path / "link.h5"
    link.symlink_to(real)
    extract_features(folder, BACKBONE, link, max_items=3, overwrite=True, **FAST)
    assert link.is_symlink() and len(load_features(real).labels) == 3
    assert not list(tmp_path.glob("link.h5.*"))  # no lock or temporary file beside the link
    with store_lock(real), pytest.raises(StoreLockedError):
        extract_features(folder, BACKBONE, link, max_items=3, **FAST)
    dangling = tmp_path / "dangling.h5"
    dangling.symlink_to(tmp_path / "new" / "target.h5")
    extract_features(folder, BACKBONE, dangling, max_items=2, **FAST)
    assert dangling.is_symlink() and len(load_features(dangling).labels) == 2


def test_shards_merge_into_a_folder_that_does_not_exist_yet(store, folder, tmp_path):
    # extract_features creates its output's folder; merge_shards failed on the lock file.
    shards = _two_shards(folder, tmp_path / "f.h5")
    merged = merge_shards(shards, tmp_path / "new" / "deeper" / "merged.h5")
    assert load_features(merged).paths == load_features(store).paths


def test_shards_written_to_the_home_folder_with_a_tilde_merge_under_that_name(
    store, folder, tmp_path, monkeypatch
):
    # extract_features wrote '~/f.h5''s shards in the home folder; merge_shards read the
    # output's ~ as the home folder, and refused the shards' as "'~/f.shard-00000-of-
    # 00002.h5' does not exist".
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    _two_shards(folder, "~/f.h5")
    merged = merge_shards([shard_path("~/f.h5", r, 2) for r in range(2)], "~/f.h5")
    assert merged == tmp_path / "f.h5" and not os.path.lexists("~")
    assert load_features("~/f.h5").paths == load_features(store).paths


def test_a_merge_leaves_out_a_shard_s_finished_adopting_mark(folder, tmp_path):
    # Shard 0's attributes made the merged store's: the mark of a --retry-failed run
    # killed before it removed it (the adoption finished) went into the merged store.
    shards = _two_shards(folder, tmp_path / "f.h5")
    with h5py.File(shards[0], "r+") as f:
        f.attrs["adopting_source_fingerprint"] = f.attrs["source_fingerprint"]
    merged = merge_shards(shards, tmp_path / "merged.h5")
    assert "adopting_source_fingerprint" not in load_features(merged).metadata


def test_merge_shards_refuses_no_shards_and_takes_any_iterable(store, folder, tmp_path):
    # No shards failed with a bare "KeyError: 0", after the lock file was written; shards
    # from a generator failed with a TypeError (len() of a generator).
    out = tmp_path / "out" / "merged.h5"
    message = (
        "The 'shards' parameter of merge_shards holds no shards; pass every shard of one run: "
        "the paths extract_features(..., rank=r, world_size=W) returned for r in range(W)."
    )
    for empty in ([], (), iter([])):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            merge_shards(empty, out)
    assert not out.parent.exists()  # nothing written: no folder, no lock file
    # One path was read as its characters ("'/' is a folder") or refused by len().
    for one in ("shard.h5", tmp_path / "shard.h5"):
        with pytest.raises(TypeError, match=r"got one path, '.*shard.h5'; pass \[path\]"):
            merge_shards(one, out)
    shards = _two_shards(folder, tmp_path / "f.h5")
    assert merge_shards((path for path in shards), out) == out
    assert load_features(out).paths == load_features(store).paths


def test_merge_shards_refuses_an_overwrite_that_is_not_a_bool(folder, tmp_path):
    # overwrite="no" was taken as true: a store made otherwise was replaced by the shards'.
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **(FAST | dict(dtype="float16")))
    shards = _two_shards(folder, out)
    message = "The 'overwrite' parameter of merge_shards must be .* Got 'no' instead.$"
    with pytest.raises(ValueError, match=message):
        merge_shards(shards, out, overwrite="no")
    assert load_features(out).metadata["dtype"] == "float16"


def test_classes_are_separable(store):
    from sklearn.linear_model import LogisticRegression

    loaded = load_features(store, in_memory=True)
    # Generated classes differ in mean colour; even a random network separates them.
    clean = ~np.isin(loaded.paths, ["cat/alpha.png", "cat/grey.jpg"])
    X, y = loaded.features[clean], loaded.labels[clean]
    assert LogisticRegression(max_iter=1000).fit(X, y).score(X, y) == 1.0


def test_rerun_is_a_noop_and_same_content(store, folder):
    before = store.read_bytes()
    extract_features(folder, BACKBONE, store, **FAST)
    assert store.read_bytes() == before


@pytest.mark.parametrize(
    "change, difference",
    [
        (dict(backbone="timm:test_vit@random"), "backbone: file has 'timm:test_resnet'"),
        (dict(dtype="float16"), "dtype: file has 'float32', request has 'float16'"),
        (dict(normalize=True), "normalize: file has False, request has True"),
        (dict(image_size=48), "preprocessing.crop: file has [32, 32], request has [48, 48]"),
        (
            dict(max_items=6),
            "the images differ: the store holds 14 images, the request 6: 'cat/corrupt.jpg' and "
            "those after it are no longer requested",
        ),
    ],
)
def test_different_provenance_is_refused_in_one_line(store, folder, change, difference):
    kwargs = FAST | {"backbone": BACKBONE} | change
    with pytest.raises(ProvenanceError, match="different provenance") as info:
        extract_features(folder, out=store, **kwargs)
    message = str(info.value)
    assert difference in message and "\n" not in message and "--force" in message
    assert "transform" not in message  # restates the entries that differ


def _copy_with(store, path, **attrs):
    """A copy of ``store`` at ``path`` with other provenance ``attrs``."""
    path.write_bytes(store.read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs.update(attrs)
    return path


def test_a_store_is_resumed_only_in_its_own_precision(store, folder, tmp_path):
    # A run started on a GPU (bfloat16 autocast) and resumed on the CPU (float32) would mix
    # rows of both precisions in one file.
    copy = _copy_with(store, tmp_path / "gpu.h5", compute="bfloat16 autocast")
    with pytest.raises(ProvenanceError, match="compute: file has 'bfloat16 autocast', request"):
        extract_features(folder, BACKBONE, copy, **FAST)
    with h5py.File(copy, "a") as f:  # written before the precision was recorded: float32
        del f.attrs["compute"]
    before = copy.read_bytes()
    extract_features(folder, BACKBONE, copy, **FAST)
    assert copy.read_bytes() == before


def test_a_store_written_before_the_exif_choice_was_recorded_is_reused(store, folder, tmp_path):
    # Every store records that the EXIF orientation tag was not applied; one written before
    # that was recorded was made so too, and is reused. One that says otherwise is refused.
    with h5py.File(store, "r") as f:
        pre = json.loads(f.attrs["preprocessing"])
    assert pre["apply_exif_orientation"] is False
    rotated = _copy_with(store, tmp_path / "r.h5", preprocessing=json.dumps(
        pre | {"apply_exif_orientation": True}
    ))  # fmt: skip
    with pytest.raises(ProvenanceError, match="apply_exif_orientation: file has True, request"):
        extract_features(folder, BACKBONE, rotated, **FAST)
    del pre["apply_exif_orientation"]
    old = _copy_with(store, tmp_path / "old.h5", preprocessing=json.dumps(pre))
    before = old.read_bytes()
    extract_features(folder, BACKBONE, old, **FAST)
    assert old.read_bytes() == before


@pytest.mark.parametrize("old_rank", [0, 1])
def test_shards_written_before_and_after_the_exif_choice_was_recorded_merge(
    folder, tmp_path, old_rank
):
    # An interrupted run's shard made before apply_exif_orientation was recorded, finished
    # beside a shard made since: both are of one run, and their merged store is reused.
    out = tmp_path / "m.h5"
    shards = [extract_features(folder, BACKBONE, out, rank=r, world_size=2, **FAST) for r in (0, 1)]
    with h5py.File(shards[old_rank], "a") as f:
        pre = json.loads(f.attrs["preprocessing"])
        del pre["apply_exif_orientation"]
        f.attrs["preprocessing"] = json.dumps(pre)
    merge_shards(shards, out)
    before = out.read_bytes()
    extract_features(folder, BACKBONE, out, **FAST)
    assert out.read_bytes() == before


def test_pil_s_switch_for_truncated_images_is_refused(tmp_path, monkeypatch):
    # With it on, PIL decoded half a JPEG without an error, its lower half grey, and the
    # store held its features as a whole image's.
    from PIL import ImageFile

    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    half = folder / "cat" / "half.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(half)
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])  # cut in its image data
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ValueError, match=r"LOAD_TRUNCATED_IMAGES is True .* Set it to False"):
        extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    assert not (tmp_path / "f.h5").exists()
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    [(path, reason)] = load_features(out).failures
    assert path == "cat/half.jpg" and reason.startswith("OSError: image file is truncated")


def test_second_writer_gets_a_clear_error(folder, tmp_path):
    out = tmp_path / "f.h5"
    with store_lock(out), pytest.raises(StoreLockedError, match="another process"):
        extract_features(folder, BACKBONE, out, **FAST)
    assert not out.exists()


def test_a_reader_looking_for_the_writer_does_not_refuse_a_writer(tmp_path):
    # load_features looks for the run of an incomplete store by taking its lock, shared,
    # for a moment: a run starting then was refused as "being written by another process"
    # (the last writer's pid, even its own), 4 starts in 10 beside a reader polling.
    import threading

    from extract._locks import _lock_holder

    out = tmp_path / "f.h5"
    with store_lock(out):
        pass  # the lock file, as a finished run leaves it
    reader = open(f"{out}.lock", "rb")  # as _lock_holder holds it, a moment longer
    fcntl.flock(reader, fcntl.LOCK_SH)
    threading.Timer(0.02, reader.close).start()
    with store_lock(out):
        assert _lock_holder(out) is None  # this process's own
    assert reader.closed


def test_a_complete_store_in_a_read_only_folder_is_reused(store, folder, monkeypatch, caplog):
    # Reuse writes nothing, but the lock beside the store was created first: "no
    # permission to write in the folder" on a read-only file system. The reuse is said, as
    # in a writable folder.
    from extract import _runner

    _not_writable(monkeypatch, store.parent)
    monkeypatch.setattr(_runner, "store_lock", None)  # would fail, called
    caplog.set_level(logging.INFO, logger="extract")
    assert extract_features(folder, BACKBONE, store, **FAST) == store
    assert "Reused the complete feature store" in caplog.text
    with pytest.raises(StoreError, match="Cannot complete the feature store .* no permission"):
        extract_features(folder, BACKBONE, store, retry_failed=True, **FAST)
    with pytest.raises(StoreError, match="Cannot write the output .* no permission"):
        extract_features(folder, BACKBONE, store, overwrite=True, **FAST)


def test_images_added_at_the_end_are_named(folder, tmp_path):
    path = extract_features(folder, BACKBONE, tmp_path / "f.h5", max_items=6, **FAST)
    with pytest.raises(ProvenanceError, match="the request 14: 'cat/corrupt.jpg' and those after"):
        extract_features(folder, BACKBONE, path, **FAST)


def test_incomplete_store_is_refused_or_loaded_with_a_warning(store, tmp_path):
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][:3] = PENDING
    with pytest.raises(IncompleteStoreError, match="3 of 14 rows not extracted"):
        load_features(partial)
    with pytest.warns(UserWarning, match="3 rows pending"):
        loaded = load_features(partial, allow_incomplete=True, in_memory=True)
    assert loaded.n_pending == 3 and loaded.rows.min() == 3 and len(loaded.rows) == 9


@pytest.mark.parametrize("flag", ["in_memory", "allow_incomplete"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_load_features_flags_must_be_true_or_false(store, tmp_path, flag, value):
    # allow_incomplete="no" was taken as true: an incomplete store loaded with a warning.
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][:3] = PENDING
    message = f"The '{flag}' parameter must be True or False. Got {value!r} instead.$"
    with pytest.raises(ValueError, match=message):
        load_features(partial, **{flag: value})
    assert load_features(store, **{flag: np.True_}).n_pending == 0


def test_one_rank_s_shard_beside_its_run_is_loaded_with_a_warning(folder, tmp_path):
    # A shard loaded that rank's rows alone without a word, where the merged store or the
    # other shards lay beside it.
    out = tmp_path / "m.h5"
    shards = _two_shards(folder, out)
    merge = re.escape(f"extract.merge_shards([extract.shard_path({str(out)!r}, r, 2) for r in")
    with pytest.warns(UserWarning, match=f"is shard 0 of 2 of one extraction: .*{merge}"):
        with load_features(shards[0]) as shard:
            assert set(shard.indices.tolist()) <= set(range(0, 14, 2))
    merge_shards(shards, out)
    loaded = f"holds that rank's 7 of the 14 rows only. Load the merged store {str(out)!r}"
    with pytest.warns(UserWarning, match=re.escape(loaded)):
        load_features(shards[1]).close()
    (tmp_path / "apart").mkdir()
    alone = shutil.copy(shards[1], tmp_path / "apart" / shards[1].name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_features(out).close()  # every row
        load_features(alone).close()  # a shard copied apart, knowingly
        warnings.filterwarnings("ignore", ONE_SHARD, UserWarning)  # the documented filter
        load_features(shards[0]).close()


def test_shards_merge_into_the_single_run(store, folder, tmp_path):
    out = tmp_path / "merged.h5"
    shards = [
        extract_features(folder, BACKBONE, out, rank=r, world_size=3, **FAST) for r in range(3)
    ]
    assert shards == [shard_path(out, r, 3) for r in range(3)]
    with h5py.File(shards[1], "r") as f:
        assert f["indices"][:].tolist() == list(range(1, 14, 3))
    with h5py.File(shards[2], "r+") as f:
        f["status"][0] = PENDING
    with pytest.raises(IncompleteStoreError, match="1 rows not extracted"):
        merge_shards(shards, out)
    with h5py.File(shards[2], "r+") as f:
        f["status"][0] = DONE
    with pytest.raises(ValueError, match="one of 3 shards, but 2 were given"):
        merge_shards(shards[:2], out)
    with pytest.raises(ValueError, match="Two shards .* have rank 1"):
        merge_shards([shards[1], shards[1], shards[0]], out)
    with h5py.File(shards[1], "r+") as f:  # a damaged shard: a row of rank 0's as well
        f["indices"][0] = 0
    with pytest.raises(ValueError, match="or hold a row twice"):
        merge_shards(shards, out)
    with h5py.File(shards[1], "r+") as f:
        f["indices"][0] = 1
    assert not out.exists()
    merge_shards(shards[::-1], out)
    single, merged = load_features(store, in_memory=True), load_features(out, in_memory=True)
    assert merged.paths == single.paths and merged.failures == single.failures
    np.testing.assert_array_equal(merged.labels, single.labels)
    np.testing.assert_allclose(merged.features, single.features, rtol=1e-5, atol=1e-6)
    assert merged.metadata["shard_world_size"] == 1 and merged.metadata["merged_from"] == 3
    other = tmp_path / "other.h5"
    extract_features(folder, BACKBONE, other, max_items=3, **FAST)
    with pytest.raises(ProvenanceError, match="source_fingerprint"):
        merge_shards(shards, other)  # never silently replaces a different store


def test_a_merge_keeps_files_of_its_own_name_and_replaces_its_leftover(
    folder, tmp_path, monkeypatch
):
    # A user's <out>.merging was silently replaced and deleted (the .tmp beside a store is
    # protected); a killed merge's leftover, a full-size store, was not counted as room for
    # the new one (a rerun refused for want of space); a merge that failed left it behind.
    from extract import _merge, _store

    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, max_items=6)
    merging = tmp_path / "merged.h5.merging"
    merging.write_text("my notes\n")
    with pytest.raises(StoreError, match="merged.h5.merging' exists and is not a merged store"):
        merge_shards(shards, out)
    assert merging.read_text() == "my notes\n" and not out.exists()
    # Under torchrun rank 0, which merges, finds it before any image is extracted (it was
    # found at the merge, after every rank's extraction).
    made = shards[0].stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLD_SIZE", "2")
        patch.setenv("RANK", "0")
        with pytest.raises(StoreError, match="merged.h5.merging' exists and is not a merged"):
            extract_features(folder, BACKBONE, out, overwrite=True, max_items=6, **FAST)
    assert shards[0].stat().st_mtime_ns == made
    # So too where the store exists, to be completed (a retry, a resumed rebuild): it was
    # found only at the merge, after every rank's extraction.
    merging.unlink()
    merge_shards(shards, out)
    merging.write_text("my notes\n")
    with h5py.File(shards[0], "r+") as f:
        f["status"][0] = 0  # a row of rank 0 left pending: the store is not complete
    with h5py.File(out, "r+") as f:
        f["status"][0] = 0
    made = shards[0].stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLD_SIZE", "2")
        patch.setenv("RANK", "0")
        _ranks_one_by_one(patch)
        with pytest.raises(StoreError, match="merged.h5.merging' exists and is not a merged"):
            extract_features(folder, BACKBONE, out, max_items=6, **FAST)
    assert shards[0].stat().st_mtime_ns == made
    for path in (shards[0], out):
        with h5py.File(path, "r+") as f:
            f["status"][0] = DONE
    # A complete store is reused as it is: nothing would be merged.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLD_SIZE", "2")
        patch.setenv("RANK", "0")
        _ranks_one_by_one(patch)
        assert extract_features(folder, BACKBONE, out, max_items=6, **FAST) == out
    out.unlink()
    merging.unlink()
    merge_shards(shards, tmp_path / "first.h5")
    shutil.copy(tmp_path / "first.h5", merging)  # what a merge killed before its rename left
    checked = []
    real_check_space = _store._check_space

    def check_space(path, size):
        checked.append(merging.exists())
        real_check_space(path, size)

    monkeypatch.setattr(_store, "_check_space", check_space)
    merge_shards(shards, out)
    assert checked == [False] and not merging.exists()
    assert load_features(out).paths == load_features(tmp_path / "first.h5").paths

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_merge, "_runs", full)
    with pytest.raises(OSError, match="No space left"):
        merge_shards(shards, out, overwrite=True)
    assert not merging.exists() and load_features(out).paths  # the earlier store is kept


def test_shards_of_other_library_versions_are_said_at_merge(folder, tmp_path, caplog):
    # A node with another torch or timm made its shard silently part of the merged store,
    # which records rank 0's versions alone (a resume with other versions says so).
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, max_items=4)
    caplog.set_level(logging.WARNING, logger="extract")
    for shard in shards:  # shards written before the precision was recorded: float32
        with h5py.File(shard, "r+") as f:
            del f.attrs["compute"]
    merge_shards(shards, out)
    assert "library versions" not in caplog.text
    with h5py.File(shards[1], "r+") as f:
        f.attrs["versions"] = json.dumps({"torch": "2.1.0", "timm": "0.9.2"})
    merge_shards(shards, out, overwrite=True)
    assert "1 of the 2 shards were extracted with other library versions" in caplog.text
    assert "'torch': '2.1.0'" in caplog.text and str(shards[1]) in caplog.text


def test_shards_merged_a_block_at_a_time_put_every_row_in_its_place(
    store, folder, tmp_path, monkeypatch
):
    # A shard longer than the merge's block (8192 rows) is copied in several blocks: each
    # block's rows go to their own places, not to those of the shard's first block.
    from extract import _merge

    monkeypatch.setattr(_merge, "_MERGE_BLOCK", 3)  # rows 0-2, 3-5 and 6 of each shard
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out)
    merge_shards(shards, out)
    with h5py.File(store, "r") as single, h5py.File(out, "r") as merged:
        for name in ("status", "failure_reason", "content_sha256", "paths", "labels"):
            assert merged[name][:].tolist() == single[name][:].tolist(), name
        np.testing.assert_allclose(
            merged["features"][:], single["features"][:], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("row", [0, -1])
def test_a_shard_with_a_row_pending_anywhere_is_not_merged(folder, tmp_path, row):
    # Its first row or its last: a merged store never holds a row that no rank extracted.
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, max_items=6)
    with h5py.File(shards[1], "r+") as f:
        f["status"][row] = PENDING
    with pytest.raises(IncompleteStoreError, match="1 rows not extracted"):
        merge_shards(shards, out)
    assert not out.exists()


def test_shards_of_a_subset_merge_into_the_subset_s_single_run(folder, tmp_path):
    # The rows of a subset (--per-class) are items 0, 1, 5, 6, ... of the source: the merge
    # places them by their order among the shards' indices, not at those indices.
    single = extract_features(folder, BACKBONE, tmp_path / "single.h5", n_per_class=2, **FAST)
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, n_per_class=2)
    merge_shards(shards, out)
    with h5py.File(single, "r") as one, h5py.File(out, "r") as merged:
        assert merged["indices"][:].tolist() == one["indices"][:].tolist() != [0, 1, 2, 3]
        for name in ("status", "paths", "labels", "content_sha256"):
            assert merged[name][:].tolist() == one[name][:].tolist(), name
        np.testing.assert_allclose(merged["features"][:], one["features"][:], rtol=1e-5, atol=1e-6)


def test_shards_of_a_source_listed_at_different_times_are_refused_as_such(tmp_path):
    # An image added between two ranks' starts: the merge said "request has" for the
    # first shard's values, and advised --force alone.
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out = tmp_path / "f.h5"
    first = extract_features(folder, BACKBONE, out, rank=0, world_size=2, **FAST)
    shutil.copy(folder / "cat" / "001.jpg", folder / "cat" / "001a.jpg")
    second = extract_features(folder, BACKBONE, out, rank=1, world_size=2, **FAST)
    with pytest.raises(ProvenanceError) as info:
        merge_shards([first, second], out)
    message = str(info.value)
    assert (
        f"shard '{second}' was not made by the run of the first shard given, '{first}'" in message
    )
    assert "n_total_rows: it has 9, the first has 8" in message
    assert "the source changed between their starts" in message and "--force" in message
    # A shard of another source is no such case: --force would throw valid shards away.
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    foreign = extract_features(
        other, BACKBONE, tmp_path / "o" / "f.h5", rank=1, world_size=2, **FAST
    )
    with pytest.raises(ProvenanceError, match="source_root: it has .*Merge the shards of one run"):
        merge_shards([first, foreign], out)


@pytest.mark.parametrize("subset", ["n_per_class", "max_items"])
def test_shards_of_other_subsets_are_refused_naming_the_subsets(folder, tmp_path, subset):
    # Ranks run by hand with another --per-class or --max-items each: the merge blamed a
    # source that changed between their starts, which it had not.
    out = tmp_path / "f.h5"
    first = extract_features(folder, BACKBONE, out, rank=0, world_size=2, **{subset: 3}, **FAST)
    second = extract_features(folder, BACKBONE, out, rank=1, world_size=2, **{subset: 2}, **FAST)
    asked = r"or they were asked for different subsets \(--per-class \(n_per_class\) or "
    with pytest.raises(ProvenanceError, match=asked + r"--max-items \(max_items\)\)"):
        merge_shards([first, second], out)


@_SHARDS_READ_KNOWINGLY
def test_a_shard_of_another_rank_is_never_resumed_as_this_rank_s(tmp_path):
    # Rank 0's shard copied to rank 1's name holds as many rows of the same source: only
    # its rank tells that its rows are not rank 1's, which the request would get.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    first = extract_features(folder, BACKBONE, out, rank=0, world_size=2, **FAST)
    second = shard_path(out, rank=1, world_size=2)
    shutil.copy(first, second)
    with pytest.raises(ProvenanceError, match="shard_rank: file has 0, request has 1"):
        extract_features(folder, BACKBONE, out, rank=1, world_size=2, **FAST)
    assert load_features(second).paths == load_features(first).paths  # left as it was


def _ranks_one_by_one(monkeypatch):
    """Run torchrun's ranks in this process one after another: no process group."""
    from extract import _runner

    monkeypatch.setattr(_runner, "_ranks_group", contextlib.nullcontext)


def _ranks_without_merge(monkeypatch, world_size: int = 2) -> list:
    """torchrun's ranks of ``world_size`` run one by one in this process (each test sets
    RANK), none merging: the list returned gets each would-be merge's
    ``(rank, overwrite, repair)``."""
    from extract import _runner

    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    _ranks_one_by_one(monkeypatch)
    merges = []
    monkeypatch.setattr(_runner, "_merge_on_rank0", lambda out, rank, n, overwrite, repair, step: (
        merges.append((rank, overwrite, repair)) or out))  # fmt: skip
    return merges


def test_under_torchrun_what_the_listing_says_is_said_by_rank_0_alone(
    tmp_path, monkeypatch, caplog
):
    # Files left out of a folder were named once per rank: eight times on eight GPUs.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    (folder / "cat" / "notes.txt").write_text("not an image")
    _ranks_without_merge(monkeypatch)
    said = {}
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="extract"):
            extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
        said[rank] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said[1] == [] and len(said[0]) == 1 and "'cat/notes.txt'" in said[0][0]
    assert logging.getLogger("extract._image_folder").level == logging.NOTSET  # restored


@pytest.mark.parametrize("change", ["added", "replaced"])
def test_ranks_that_listed_the_source_differently_stop_before_any_work(
    tmp_path, monkeypatch, change
):
    # Each rank listed the source on its own: an image added or replaced while they started
    # was found by the merge, after every rank's extraction (the test above).
    import torch.distributed as dist

    from extract import _ranks, _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out = tmp_path / "f.h5"
    source = open_source(folder)
    theirs = [(len(source), source.fingerprint())]  # rank 1's listing, before the change
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr("extract._ranks.all_gather_object", lambda got, mine: got.__setitem__(
        slice(None), [mine, (None, theirs[0])]))  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    _ranks_one_by_one(monkeypatch)
    built = []
    real_create = _runner.create_backbone
    monkeypatch.setattr(_runner, "create_backbone", lambda *a, **k: built.append(1) or real_create(
        *a, **k))  # fmt: skip
    if change == "added":
        shutil.copy(folder / "cat" / "001.jpg", folder / "cat" / "001a.jpg")
        match = r"\(rank 0 found 9 images, rank 1 8\): it changed while they started"
    else:
        os.utime(folder / "cat" / "001.jpg", ns=(0, 0))
        match = r"\(ranks 0 and 1 found other files\)"
    with pytest.raises(StoreError, match=match):
        extract_features(folder, BACKBONE, out, **FAST)
    assert not built and not list(tmp_path.glob("f.h5*"))  # no model built, no shard made
    source = open_source(folder)
    theirs[0] = (len(source), source.fingerprint())
    # the same listing: no error
    _ranks._check_same_listing(source, theirs[0][1], _ranks._ShardStep(out, 2))


@pytest.mark.parametrize("kind", ["folder", "built by hand"])
def test_an_image_replaced_while_the_model_loads_is_a_failed_row(tmp_path, monkeypatch, kind):
    # An ImageSource built by hand had its files' sizes and times taken each time they
    # were needed: an image replaced while the model loaded was extracted as the new file
    # under the fingerprint of the old one, and the next run refused the complete store by
    # its fingerprint alone. As a folder's, its files are listed once, when it is opened.
    from extract import ImageSource, _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    source = folder
    if kind == "built by hand":
        ids = image_folder(folder).ids
        labels = np.array([int(i.startswith("dog")) for i in ids])
        source = ImageSource(ids, labels, ["cat", "dog"], str(folder), "mine", np.arange(4))
    image = folder / "cat" / "001.jpg"
    real_create = _runner.create_backbone

    def replacing(*args, **kwargs):
        Image.new("RGB", (50, 50), "red").save(image)
        return real_create(*args, **kwargs)

    monkeypatch.setattr(_runner, "create_backbone", replacing)
    out = extract_features(source, BACKBONE, tmp_path / "f.h5", **FAST)
    assert [(path, reason.split(":")[0]) for path, reason in load_features(out).failures] == [
        ("cat/001.jpg", "FileChangedError")
    ]
    monkeypatch.setattr(_runner, "create_backbone", real_create)
    with pytest.raises(ProvenanceError, match=r"001.jpg' is not the file the store was made"):
        extract_features(source, BACKBONE, out, **FAST)
    extract_features(source, BACKBONE, out, retry_failed=True, **FAST)
    assert not load_features(out).failures


def test_reading_a_store_imports_neither_torch_nor_the_backbones(store):
    # `from extract import load_features` imported torch, torchvision and the extraction
    # (10 s here) to read an HDF5 file.
    code = (
        "import sys\n"
        "from extract import load_features\n"
        "store = load_features(sys.argv[1], in_memory=True)\n"
        "assert len(store.paths) + len(store.failures) == 14, store.paths\n"
        "heavy = sorted({'torch', 'torchvision', 'timm', 'sklearn'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
        "import extract\n"
        "assert extract._reading.load_features is load_features\n"
        "extract._reading.load_features = print\n"  # a patch, seen through the package
        "assert extract.load_features is print\n"
        "extract._reading.load_features = load_features\n"  # and undone
        "assert extract.load_features is load_features\n"
        "assert getattr(extract, '_x.y', None) is None and not hasattr(extract, '__main__')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(store)], check=True, timeout=120)


def test_a_subset_whose_images_moved_in_the_source_is_refused_by_name(tmp_path):
    # --per-class keeps the first images of each class: an image added to "cat" beyond
    # them moves every "dog" image one place on in the source, which the store records.
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    bad = folder / "cat" / "001.jpg"
    good = bad.read_bytes()
    bad.write_bytes(b"not an image")
    subset = dict(FAST, n_per_class=2)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **subset)
    before = load_features(out, in_memory=True).indices
    shutil.copy(folder / "cat" / "003.png", folder / "cat" / "004.png")
    moved = r"dog/000.png' is item 5 of the source now, item 4 when the store was made"
    with pytest.raises(ProvenanceError, match=moved):
        extract_features(folder, BACKBONE, out, **subset)
    # A repaired failure, which --retry-failed alone would take: not with the move, which
    # the retry names (the repair is what it takes).
    bad.write_bytes(good)
    for retry, named in ((False, "cat/001.jpg' is not the file"), (True, moved)):
        with pytest.raises(ProvenanceError, match=named) as error:
            extract_features(folder, BACKBONE, out, retry_failed=retry, **subset)
        assert "--retry-failed" not in str(error.value)
    np.testing.assert_array_equal(load_features(out, in_memory=True).indices, before)


def test_a_retry_records_each_repaired_image_s_identity_and_takes_the_next_repair(tmp_path):
    # A retry takes the repaired image's size and modification time into the store, as its
    # fingerprint: left as they were, the image, done since, counted as changed, and a
    # later retry of another repaired failure was refused.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    images = [folder / "cat" / "001.jpg", folder / "dog" / "001.jpg"]
    good = [image.read_bytes() for image in images]
    for image in images:
        image.write_bytes(b"not an image, but as long as it is".ljust(len(good[0]), b"."))
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    for image, content in zip(images, good, strict=True):
        image.write_bytes(content)
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
        with h5py.File(out, "r") as f:
            row = f["paths"].asstr()[:].tolist().index(image.relative_to(folder).as_posix())
            stat = image.stat()
            assert f["status"][row] == DONE
            assert (f["file_size"][row], f["file_mtime_ns"][row]) == (
                stat.st_size,
                stat.st_mtime_ns,
            )
    assert not load_features(out).failures


def _touch(*paths: Path) -> None:
    """Move each file's modification time on by a second, its bytes left as they are."""
    for path in paths:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _other_bytes_same_size(path: Path) -> None:
    """Rewrite ``path`` with one byte changed: its size kept, its modification time not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    _touch(path)  # (a file system of coarse times may have kept it)


def _spy_hashed(monkeypatch) -> list:
    """The files read again to compare their bytes with the store's, as the runs go."""
    from extract import _touched

    hashed = []

    def spied(path, listed=None):
        hashed.append(os.path.relpath(path))
        return _store_read_file(path, listed)

    _store_read_file = _touched.read_file
    monkeypatch.setattr(_touched, "read_file", spied)
    return hashed


def test_touched_images_are_the_store_s_by_their_bytes_and_alone_read_again(
    tmp_path, monkeypatch, caplog
):
    # Touching the images (their modification times changed, their bytes not) made the
    # store unusable: refused, to be rebuilt with --force. Each touched file is read again,
    # once, and is the store's where its bytes hash as its row recorded; its new time is
    # recorded, so that the store is the one a run on the files as they are writes.
    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=2)  # failed rows among them
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    before = load_features(out, in_memory=True)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    _touch(*files)
    hashed, written = _spy_hashed(monkeypatch), _spy_writes(monkeypatch)
    monkeypatch.chdir(folder)
    assert extract_features(folder, BACKBONE, out, **FAST) == out
    assert written == [] and sorted(hashed) == [str(p.relative_to(folder)) for p in files]
    assert f"{len(files)} image files were touched since {out} was made" in caplog.text
    after = load_features(out, in_memory=True)
    np.testing.assert_array_equal(after.features, before.features)
    assert after.failures == before.failures
    with h5py.File(out, "r") as f:
        mtimes = [os.stat(folder / p).st_mtime_ns for p in f["paths"].asstr()[:]]
        np.testing.assert_array_equal(f["file_mtime_ns"][:], mtimes)
        assert f.attrs["source_fingerprint"] == open_source(folder).fingerprint()
    hashed.clear()
    extract_features(folder, BACKBONE, out, **FAST)  # recorded: nothing is read again
    _touch(folder / "dog" / "001.jpg")
    extract_features(folder, BACKBONE, out, **FAST)
    assert hashed == ["dog/001.jpg"] and written == []


def test_a_touched_image_whose_bytes_changed_is_refused_naming_it(tmp_path):
    # Its size and modification time alone cannot tell: its bytes, hashed, do. The images
    # before it, touched alone, are not named.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    _other_bytes_same_size(folder / "dog" / "001.jpg")  # the last row
    for retry in (False, True):
        with pytest.raises(ProvenanceError) as error:
            extract_features(folder, BACKBONE, out, retry_failed=retry, **FAST)
        assert re.search(
            r"the images differ: '.*dog/001\.jpg' is not the file the store was made from "
            r"\(modified .*\); its bytes are not those extracted",
            str(error.value),
        )
        assert "cat/" not in str(error.value)
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(errno.EACCES, "Permission denied"),
        FileNotFoundError(errno.ENOENT, "No such file or directory"),  # gone since listed
        IsADirectoryError(errno.EISDIR, "Is a directory"),
    ],
)
def test_a_touched_image_that_cannot_be_read_is_said_so_with_the_os_error(
    tmp_path, monkeypatch, error
):
    # Its bytes could not be compared: the refusal said they were "not those extracted".
    from extract import _touched

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    _touch(*folder.rglob("*.*"))
    read_file = _touched.read_file

    def unreadable(path, listed=None):  # (the tests run as root, whom chmod 000 lets read)
        if path.endswith("001.jpg"):
            raise type(error)(error.errno, error.strerror, path)
        return read_file(path, listed)

    monkeypatch.setattr(_touched, "read_file", unreadable)
    with pytest.raises(ProvenanceError) as raised:
        extract_features(folder, BACKBONE, out, **FAST)
    said = str(raised.value)
    assert re.search(
        r"'.*cat/001\.jpg' is not the file the store was made from \(modified .*\); it cannot "
        rf"be read now to compare its bytes with those extracted \({type(error).__name__}: "
        rf"\[Errno {error.errno}\] {error.strerror}: '.*cat/001\.jpg'\): make it readable",
        said,
    )
    assert "not those extracted" not in said


@pytest.mark.parametrize("when", ["before its read", "as it is read"])
def test_a_touched_image_that_changes_as_it_is_hashed_is_said_to_have_changed(
    tmp_path, monkeypatch, when
):
    # Rewritten after the run listed it, or while it was read to compare its bytes with
    # the store's, it was said to be one that "cannot be read now" (make it readable), or
    # its bytes, read part before and part after, to be other than those extracted. It is
    # refused as a file whose bytes changed is, saying that it changed while it was read.
    from extract import _touched

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    changing, read_file, reads = folder / "cat" / "001.jpg", _touched.read_file, []

    def rewritten(path, listed=None):  # its first read (a refusal's explanation reads again)
        if Path(path) != changing or reads.append(path) or len(reads) > 1:
            return read_file(path, listed)
        if when == "before its read":
            _other_bytes_same_size(changing)
            return read_file(path, listed)
        fdopen = os.fdopen

        def opened(fd, *args, **kwargs):  # opened, its size and time taken: then it changes
            fh = fdopen(fd, *args, **kwargs)
            _other_bytes_same_size(changing)
            return fh

        with monkeypatch.context() as patch:
            patch.setattr(os, "fdopen", opened)
            return read_file(path, listed)

    with monkeypatch.context() as patch:
        patch.setattr(_touched, "read_file", rewritten)
        with pytest.raises(ProvenanceError) as raised:
            extract_features(folder, BACKBONE, out, **FAST)
    said = str(raised.value)
    assert re.search(
        r"'.*cat/001\.jpg' is not the file the store was made from \(modified .*\); it "
        r"changed while it was read to compare its bytes with those extracted \(modified "
        r"\S+ \S+ before the read, \S+ \S+ after\): run again once it no longer changes",
        said,
    )
    assert "cannot be read now" not in said and "not those extracted" not in said
    assert out.read_bytes() == before  # not reused, nothing written: as a changed file
    with pytest.raises(ProvenanceError, match=r"cat/001\.jpg' is not the file .* not those"):
        extract_features(folder, BACKBONE, out, **FAST)


@pytest.mark.parametrize("readable", [True, False])
def test_a_touched_failed_image_the_store_holds_no_digest_of_is_named_so(
    tmp_path, monkeypatch, readable
):
    # Its row failed without its bytes read (no content_sha256): the refusal said "its
    # bytes are not those extracted", where none were; --retry-failed takes it. Unreadable
    # still, it was said to be unreadable "to compare its bytes with those extracted", and
    # made readable, refused again: the store has no bytes of it to compare.
    from extract import _touched

    folder = make_image_folder(tmp_path / "data", n_per_class=2)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    with h5py.File(out, "r+") as f:  # as a file that could not be read leaves it
        row = list(f["paths"].asstr()[:]).index("cat/corrupt.jpg")
        assert f["status"][row] == FAILED
        f["content_sha256"][row] = b""
    _touch(*folder.rglob("*.*"))
    if not readable:  # (the tests run as root, whom chmod 000 lets read)
        read_file = _touched.read_file

        def unreadable(path, listed=None):
            if path.endswith("corrupt.jpg"):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return read_file(path, listed)

        monkeypatch.setattr(_touched, "read_file", unreadable)
    with pytest.raises(ProvenanceError) as error:
        extract_features(folder, BACKBONE, out, **FAST)
    assert "corrupt.jpg' is not the file" in str(error.value)
    assert "the store holds no digest of its bytes" in str(error.value)
    assert "not those extracted" not in str(error.value)
    assert "cannot be read now" not in str(error.value)
    assert "pass --retry-failed" in str(error.value)
    extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)  # the cure works
    assert [p for p, _ in load_features(out).failures] == ["cat/corrupt.jpg", "cat/truncated.jpg"]


def test_a_killed_run_resumes_after_its_images_were_touched(tmp_path, monkeypatch):
    # Its done rows are the touched files' by their bytes, and its pending rows hold
    # nothing of theirs: it ends as a run on the touched files would, by any check.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)  # rows 0 and 1 done
    _touch(*folder.rglob("*.*"))
    written = _spy_writes(monkeypatch)
    extract_features(folder, BACKBONE, out, **fast)
    assert written == [2, 2]
    uninterrupted = extract_features(folder, BACKBONE, tmp_path / "one.h5", **fast)
    with h5py.File(out, "r") as f, h5py.File(uninterrupted, "r") as g:
        assert dict(f.attrs) == dict(g.attrs)
        for name in ("features", "status", "content_sha256", "file_size", "file_mtime_ns"):
            np.testing.assert_array_equal(f[name][:], g[name][:])


def _touched_store_in_a_read_only_folder(tmp_path, monkeypatch, where="folder"):
    """A complete store of a folder's images, every image touched since, that cannot be
    written: its folder (``where="folder"``, the store's lock unneeded) or its own file
    (``"file"``). Returns the image folder, the store and its bytes."""
    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "out" / "f.h5", **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    if where == "folder":
        _not_writable(monkeypatch, out.parent)
        monkeypatch.setattr(_runner, "store_lock", None)  # would fail, called
    else:
        _not_writable(monkeypatch, out)
        _h5_refuses_writes(monkeypatch, out)
    return folder, out, before


def test_a_store_of_touched_images_in_a_read_only_folder_is_reused_as_it_is(
    tmp_path, monkeypatch, caplog
):
    # It cannot record the new times: it was refused, naming two fingerprints.
    folder, out, before = _touched_store_in_a_read_only_folder(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="extract")
    assert extract_features(folder, BACKBONE, out, **FAST) == out
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"4 image files were touched since {out} was made")
    assert f"(No permission to write in the folder {str(out.parent)!r}" in warning
    assert "Reused the complete feature store" in caplog.text and out.read_bytes() == before
    _other_bytes_same_size(folder / "dog" / "001.jpg")
    with pytest.raises(ProvenanceError, match=r"dog/001\.jpg' is not the file .* its bytes"):
        extract_features(folder, BACKBONE, out, **FAST)


@pytest.mark.parametrize("why", ["open", "mode", "full disk"])
def test_a_complete_store_of_touched_images_that_cannot_be_written_is_reused_with_a_warning(
    tmp_path, monkeypatch, caplog, why
):
    # Open elsewhere (a load_features handle), its mode read-only (chmod 444) or on a full
    # disk, it was refused for the new modification times it could not record, where the
    # same store of untouched images was reused, as one in a read-only folder is.
    from extract import _store

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    caplog.set_level(logging.INFO, logger="extract")
    hashed, written = _spy_hashed(monkeypatch), _spy_writes(monkeypatch)
    with contextlib.ExitStack() as stack:
        if why == "open":
            stack.enter_context(load_features(out))
        elif why == "mode":
            _h5_refuses_writes(stack.enter_context(monkeypatch.context()), out)
        else:
            monkeypatch.setattr(_store, "ATTRS_ROOM", 1 << 62)
        assert extract_features(folder, BACKBONE, out, **FAST) == out
    assert out.read_bytes() == before and written == [] and len(hashed) == 4
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(
        f"4 image files were touched since {out} was made, their bytes unchanged (by their "
        "sha256), but their new modification times are not recorded, as the store cannot be "
        "opened for writing ("
    )
    assert warning.endswith("): each run reads them again until one can write it.")
    assert "Reused the complete feature store" in caplog.text
    monkeypatch.undo()  # written at last: recorded, and read no more
    extract_features(folder, BACKBONE, out, **FAST)
    hashed = _spy_hashed(monkeypatch)
    extract_features(folder, BACKBONE, out, **FAST)
    assert hashed == []
    with h5py.File(out, "r") as f:
        assert f.attrs["source_fingerprint"] == open_source(folder).fingerprint()


@pytest.mark.parametrize("where", ["folder", "file"])
def test_a_reused_store_of_touched_images_that_cannot_be_written_warns_alike(
    tmp_path, monkeypatch, caplog, where
):
    # In a read-only folder the new modification times it could not record were said at
    # INFO ("Files of ... were touched"), where a store whose own mode forbids writing it
    # (chmod 444), reused as well, said so in a warning: the user is told alike of both.
    folder, out, _ = _touched_store_in_a_read_only_folder(tmp_path, monkeypatch, where)
    if where == "folder":
        why = f"No permission to write in the folder {str(out.parent)!r}"
    else:
        why = f"No permission to write the feature store {str(out)!r}"
    caplog.set_level(logging.INFO, logger="extract")
    assert extract_features(folder, BACKBONE, out, **FAST) == out
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(
        f"4 image files were touched since {out} was made, their bytes unchanged (by their "
        f"sha256), but their new modification times are not recorded, as the store cannot be "
        f"opened for writing ({why}"
    )
    assert warning.endswith("): each run reads them again until one can write it.")
    assert "Reused the complete feature store" in caplog.text


def test_under_torchrun_a_store_of_touched_images_in_a_read_only_folder_is_reused(
    tmp_path, monkeypatch, caplog
):
    # Reused with a warning by a run in one process, it was refused under torchrun: every
    # rank went on to write its shard beside it ("Cannot write the output ... shard").
    folder, out, before = _touched_store_in_a_read_only_folder(tmp_path, monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    _ranks_one_by_one(monkeypatch)
    caplog.set_level(logging.INFO, logger="extract")
    for rank in (1, 0):  # rank 0 alone says so
        monkeypatch.setenv("RANK", str(rank))
        caplog.clear()
        assert extract_features(folder, BACKBONE, out, **FAST) == out
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == (rank == 0)
    assert warnings[0].startswith(f"4 image files were touched since {out} was made")
    assert "Reused the complete feature store" in caplog.text
    assert out.read_bytes() == before and not list(out.parent.glob("*.shard-*"))


def test_a_complete_store_whose_fingerprint_alone_is_stale_is_reused_open_elsewhere(
    tmp_path, caplog
):
    # An adoption of touched files killed before it wrote the fingerprint: its rows agree
    # with the files. Held open, it is reused without a word of "0 image files touched".
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    with h5py.File(out, "r+") as f:
        f.attrs["source_fingerprint"] = "sha256:" + "0" * 64
    caplog.set_level(logging.INFO, logger="extract")
    with load_features(out):
        assert extract_features(folder, BACKBONE, out, **FAST) == out
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Reused the complete feature store" in caplog.text


def test_an_incomplete_store_of_touched_images_open_elsewhere_is_still_refused(
    tmp_path, monkeypatch
):
    # Its pending rows are to be written: nothing is reused, and the lock is the error.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)
    _touch(*folder.rglob("*.*"))
    with pytest.warns(UserWarning, match="incomplete store"):
        held = load_features(out, allow_incomplete=True)
    with held, pytest.raises(StoreLockedError, match="is open in this process"):
        extract_features(folder, BACKBONE, out, **fast)


def _at_2_ranks(monkeypatch, folder, out, **kwargs) -> None:
    """A torchrun run at 2 ranks, run one by one in this process, rank 0 last, merging
    (torchrun's barriers passed at once)."""
    import torch.distributed as dist

    with monkeypatch.context() as patch:
        patch.setattr(dist, "barrier", lambda *args, **kw: None)
        patch.setenv("WORLD_SIZE", "2")
        _ranks_one_by_one(patch)
        for rank in (1, 0):
            patch.setenv("RANK", str(rank))
            extract_features(folder, BACKBONE, out, **kwargs)


@pytest.mark.parametrize("shards", ["kept", "deleted"])
def test_under_torchrun_a_store_of_touched_images_is_reused_by_their_bytes(
    tmp_path, monkeypatch, shards
):
    # Each rank refused the merged store of touched images, as one process did.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    before = load_features(out, in_memory=True)
    if shards == "deleted":
        for rank in (0, 1):
            shard_path(out, rank, 2).unlink()
    _touch(*folder.rglob("*.*"))
    written = _spy_writes(monkeypatch)
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert written == []
    after = load_features(out, in_memory=True)
    np.testing.assert_array_equal(after.features, before.features)
    with h5py.File(out, "r") as f:
        mtimes = [os.stat(folder / p).st_mtime_ns for p in f["paths"].asstr()[:]]
        np.testing.assert_array_equal(f["file_mtime_ns"][:], mtimes)
        assert f.attrs["source_fingerprint"] == open_source(folder).fingerprint()
    changed = folder / "cat" / "001.jpg"  # row 1: rank 1's
    _other_bytes_same_size(changed)
    stored = out.read_bytes()
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        _ranks_one_by_one(monkeypatch)
        with pytest.raises(ProvenanceError, match=rf"'{changed}' is not the file .* its bytes"):
            extract_features(folder, BACKBONE, out, **FAST)
    assert written == [] and out.read_bytes() == stored


def test_under_torchrun_a_merged_store_of_touched_images_open_elsewhere_is_reused(
    tmp_path, monkeypatch, caplog
):
    # Every rank went on to the merge, where rank 0 could not record the new times: a
    # StoreLockedError after every rank's work, where one process reuses the store. It is
    # kept as it is (the shards, rows of its own, record the times).
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    caplog.set_level(logging.INFO, logger="extract")
    written = _spy_writes(monkeypatch)
    with load_features(out):
        _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert written == [] and out.read_bytes() == before
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"6 image files were touched since {out} was made")
    assert "their new modification times are not recorded" in warning
    _at_2_ranks(monkeypatch, folder, out, **FAST)  # once closed: recorded, as the request's
    with h5py.File(out, "r") as f:
        assert f.attrs["source_fingerprint"] == open_source(folder).fingerprint()
    assert written == []


def test_under_torchrun_a_merged_store_of_touched_images_whose_mode_is_read_only_is_kept(
    tmp_path, monkeypatch, caplog
):
    # chmod 444: every rank refused it before any work ("the merge would replace it"),
    # where a run in one process reuses it; rank 0 keeps it at the merge.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    before = out.read_bytes()
    _touch(*folder.rglob("*.*"))
    _not_writable(monkeypatch, out)
    _h5_refuses_writes(monkeypatch, out)
    caplog.set_level(logging.WARNING, logger="extract")
    written = _spy_writes(monkeypatch)
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert written == [] and out.read_bytes() == before
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"6 image files were touched since {out} was made")
    assert "(No permission to write the feature store" in warning
    # Any other change is refused before any work, as it was.
    _other_bytes_same_size(folder / "dog" / "002.jpg")
    with pytest.raises(ProvenanceError, match=r"dog/002\.jpg' is not the file .* its bytes"):
        _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert written == [] and out.read_bytes() == before


@pytest.mark.parametrize("refused", ["other bytes", "read-only store"])
def test_under_torchrun_a_refused_retry_reads_no_touched_failed_image(
    tmp_path, monkeypatch, refused
):
    # A retry extracts its touched failed images again; it does not read them to compare
    # their bytes, nor do the ranks share that reading. Yet where it was refused (another
    # image's bytes changed; a merged store that cannot be written) every rank read each of
    # them, in its checks of the merged store (complete? touched files alone?), whose
    # outcome they could not change. (Ranks run one by one: each reads alone.)
    folder = make_image_folder(tmp_path / "data", n_per_class=3)  # 2 of them fail
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    failed = sorted(path for path, _ in load_features(out).failures)
    assert failed == ["cat/corrupt.jpg", "cat/truncated.jpg"]
    _touch(*folder.rglob("*.*"))
    if refused == "other bytes":
        _other_bytes_same_size(folder / "dog" / "002.jpg")  # the last row
        error, words = ProvenanceError, r"dog/002\.jpg' is not the file .* its bytes are not"
    else:
        _not_writable(monkeypatch, out)
        _h5_refuses_writes(monkeypatch, out)
        error, words = StoreError, "No permission to write the feature store .* file's mode"
    hashed = _spy_hashed(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    _ranks_one_by_one(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(error, match=words):
            extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert len(hashed) >= 16  # (each rank its 8 done touched images)
    assert not [path for path in hashed if Path(path).name in ("corrupt.jpg", "truncated.jpg")]


def test_under_torchrun_a_read_only_merged_store_with_an_adoption_mark_is_refused_at_once(
    tmp_path, monkeypatch
):
    # The mark of another adoption (a --retry-failed run killed as it began) keeps a store
    # that cannot be written from being reused: the ranks took it as one rank 0 keeps, and
    # rank 0 refused it at the merge, after every rank had made its shard.
    from extract._schema import ADOPTING

    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    for rank in (0, 1):
        shard_path(out, rank, 2).unlink()
    with h5py.File(out, "r+") as f:
        f.attrs[ADOPTING] = "sha256:" + "1" * 64
    _touch(*folder.rglob("*.*"))
    _not_writable(monkeypatch, out)
    _h5_refuses_writes(monkeypatch, out)
    with pytest.raises(StoreError, match="No permission to write the feature store"):
        _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert not shard_path(out, 1, 2).exists()  # rank 1, run first, refused it at once


def test_a_run_reads_each_touched_file_once(tmp_path, monkeypatch):
    # A refusal read the touched files before the changed one three times (the check, the
    # explanation, its hint); under torchrun each rank read every one of them twice more
    # (the merged store, its shard), and rank 0 again at the merge.
    from collections import Counter

    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    _touch(*folder.rglob("*.*"))
    hashed = _spy_hashed(monkeypatch)
    _at_2_ranks(monkeypatch, folder, out, **FAST)
    assert Counter(Counter(hashed).values()) == {2: 6}  # one read per rank
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    single = extract_features(folder, BACKBONE, tmp_path / "one.h5", **FAST)
    _touch(*folder.rglob("*.*"))
    changed = folder / "dog" / "002.jpg"  # the last row
    _other_bytes_same_size(changed)
    hashed.clear()
    with pytest.raises(ProvenanceError, match="its bytes are not those extracted"):
        extract_features(folder, BACKBONE, single, **FAST)
    same = Counter(path for path in hashed if not path.endswith("dog/002.jpg"))
    assert len(same) == 5 and set(same.values()) == {1}


class _Refused(OSError):
    """An error whose ``__init__`` takes other arguments than its message (as a reader's
    may): it pickles, but does not unpickle."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")


def test_a_rank_s_error_reading_a_touched_file_reaches_the_others_with_its_type(
    tmp_path, monkeypatch
):
    # A rank's verdicts cross to the others pickled (all_gather_object): an error whose
    # __init__ takes other arguments pickled, then failed to unpickle on every rank, each
    # raising "__init__() missing 1 required positional argument" in place of the refusal.
    import pickle

    from extract import _touched
    from extract._resume import _os_error

    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    _touch(*folder.rglob("*.*"))

    def refused(path, listed=None):
        raise _Refused(path, "refused")

    monkeypatch.setattr(_touched, "read_file", refused)
    with pytest.raises(ProvenanceError) as one:  # in one process
        extract_features(folder, BACKBONE, out, **FAST)
    src = open_source(folder)
    rows = np.arange(len(src))
    with h5py.File(out, "r") as f:
        check, digests = _touched.touched_rows(f, src, rows, False), f["content_sha256"][:]
        with _touched.hashed_once():
            said = [_touched.hash_share(digests, src, rows, check, 0, 1)]
        told = pickle.loads(pickle.dumps(said))  # as the other ranks take it
        monkeypatch.setattr(_touched, "read_file", None)  # (not read again)
        with _touched.hashed_once():
            columns = _touched._key_columns(digests, src, rows, check)
            _touched.take_verdicts(src, rows, check, columns, 1, told)
            found = _touched.first_other_bytes(f, src, rows, check)
    assert found[0] == 0 and f"({_os_error(found[1])})" in str(one.value)
    assert _os_error(found[1]) == f"_Refused: {src.path(0)}: refused"


def _touched_store(tmp_path, n_files: int):
    """A folder of ``n_files`` files (bytes, not images) and a store of them made before
    every file was touched (``file_mtime_ns`` a second behind): its path and the source."""
    folder = tmp_path / f"data{n_files}"
    (folder / "cat").mkdir(parents=True)
    for i in range(n_files):
        (folder / "cat" / f"{i:05d}.png").write_bytes(b"image %d" % i)
    src = open_source(folder)
    sizes, mtimes = src.file_stats()
    out = tmp_path / f"f{n_files}.h5"
    with h5py.File(out, "w") as f:
        f["paths"] = np.array(src.ids, dtype=object).astype("S")
        f["labels"], f["indices"] = src.labels, src.source_index
        f["file_size"], f["file_mtime_ns"] = sizes, mtimes
        f["status"] = np.full(n_files, DONE, np.uint8)
        digests = [
            hashlib.sha256(Path(src.path(i)).read_bytes()).hexdigest() for i in range(n_files)
        ]
        f["content_sha256"] = np.array(digests, dtype="S64")
    _touch(*folder.rglob("*.png"))
    return out, open_source(folder)


def _no_retry(attrs: dict) -> bool:
    """``retrying`` of share_hashing for a run without --retry-failed."""
    return False


def test_under_torchrun_what_a_rank_tells_of_its_hashing_does_not_grow_with_the_files(
    tmp_path, monkeypatch
):
    # Each rank sent every key of its share it found to hold its bytes, (item, size,
    # mtime_ns, 64-byte digest): about 90 MB pickled per million touched files, received
    # by every rank. It sends how many, their keys' checksum, and the differing one.
    import pickle

    from extract import _touched

    sent = []
    for n_files in (10, 1000):
        out, src = _touched_store(tmp_path, n_files)
        with _touched.hashed_once():
            _touched.share_hashing([(out, np.arange(n_files))], src, _no_retry, 0, 2, sent.append)
    small, large = (len(pickle.dumps(said)) for said in sent)
    assert large - small <= 2  # (500 pickles in 2 bytes more than 5)
    # every other file, each found to be the store's
    assert [[(n, found) for n, _, found in said] for said in sent] == [[(5, None)], [(500, None)]]


def test_under_torchrun_a_store_s_digests_are_read_once_to_share_its_hashing(tmp_path, monkeypatch):
    # The hashing shared by the ranks read a store's content_sha256 column whole up to
    # four times (the touched rows, the keys of those hashed, of those told, of every
    # rank's share): 82 MB a read at 1.28 M rows; twice where no file was touched. It is
    # read once per store now, and not at all where nothing was touched.
    from extract import _touched

    out, src = _touched_store(tmp_path, 6)
    again, untouched = tmp_path / "again.h5", tmp_path / "untouched.h5"
    shutil.copy(out, again)
    shutil.copy(out, untouched)
    with h5py.File(untouched, "r+") as f:  # (its rows made after the touch)
        f["file_mtime_ns"][:] = src.file_stats()[1]
    read = []
    real = h5py.Dataset.__getitem__
    monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda self, *args, **kwargs: (
        read.append(self.name), real(self, *args, **kwargs))[1])  # fmt: skip
    rows, sent = np.arange(6), []
    with _touched.hashed_once():
        _touched.share_hashing(
            [(out, rows), (again, rows), (untouched, rows)], src, _no_retry, 0, 2,
            lambda said: sent.append(said) or [said, [None] * len(said)],
        )  # fmt: skip
        assert read.count("/content_sha256") == 2  # one per touched store
        # rank 0's share of each (every other file), found to be the store's
        assert [(n, found) for n, _, found in sent[0]] == [(3, None), (3, None), (0, None)]


@pytest.mark.parametrize("alike", [True, False])
def test_a_rank_takes_another_s_hashing_where_it_reads_the_store_alike(
    tmp_path, monkeypatch, alike
):
    # Rank 0 of 2 (its group faked) takes rank 1's hashing of the odd rows, rebuilt from its
    # own read of the store: where the checksum rank 1 told is not that of the rows rank 0
    # finds (the two read the store, or list the files, otherwise), it reads them itself.
    from extract import _touched

    out, src = _touched_store(tmp_path, 6)
    rows = np.arange(6)
    with h5py.File(out, "r") as f:
        check, digests = _touched.touched_rows(f, src, rows, False), f["content_sha256"][:]
        with _touched.hashed_once():
            theirs = _touched.hash_share(digests, src, rows, check, 1, 2)
    assert theirs[0] == 3 and theirs[2] is None  # the odd rows, each the store's
    if not alike:  # (its keys' checksum other than rank 0's of the same rows)
        theirs = (3, hashlib.sha256(b"other").hexdigest(), None)
    read = []
    real = _touched.read_file
    monkeypatch.setattr(_touched, "read_file", lambda path, listed=None: (
        read.append(os.path.basename(path)), real(path, listed))[1])  # fmt: skip
    with _touched.hashed_once():
        _touched.share_hashing([(out, rows)], src, _no_retry, 0, 2, lambda said: [said, [theirs]])
        assert read == ["00000.png", "00002.png", "00004.png"]  # its share
        read.clear()
        with h5py.File(out, "r") as f:
            assert _touched.first_other_bytes(f, src, rows, check) is None
    assert read == ([] if alike else ["00001.png", "00003.png", "00005.png"])


@pytest.mark.slow
@pytest.mark.parametrize("made", ["merged", "killed", "rebuilding"])
def test_under_torchrun_each_rank_hashes_its_share_of_the_touched_files(
    tmp_path, monkeypatch, made
):
    # Every rank read and hashed every touched file (of the merged store, or before any
    # merge of every shard): the collection's touched files were read once per rank. Each
    # reads its share now, and every rank takes every verdict: the new times recorded, or
    # the same refusal, naming a file that another rank read. (A forced rebuild's resume
    # shared the hashing of the merged store's rows, then checked its shards' rows.)
    from tests._failing_ranks import rank_hashing_its_share

    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    if made != "killed":
        extract_features(folder, BACKBONE, out, **FAST)
    if made != "merged":  # each shard: 2 rows done, 1 not (a forced rebuild's, or the run's)
        with monkeypatch.context() as patch:
            _killed_at_2_ranks(
                patch, folder, out, **dict(FAST, batch_size=2, overwrite=made == "rebuilding")
            )
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.*"))
    _touch(*folder.rglob("*.*"))
    changed = "cat/001.jpg"  # the second touched row: rank 1's share
    _two_ranks(rank_hashing_its_share, folder, tmp_path, changed)
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    (ended, first), (also, second) = (run["touched"] for run in said)
    assert ended == also == "returned"
    if made == "merged":
        assert first == files[0::2] and second == files[1::2]  # 3 each, 6 in all
    else:  # the shards' done rows (0 and 2, 1 and 3): each rank one of each shard's two
        assert first == files[:2] and second == files[2:4]
    with pytest.raises(ProvenanceError, match=f"{changed}' is not the file .* its bytes") as one:
        extract_features(folder, BACKBONE, out, **FAST)  # refused in one process, as before
    (ended, first), (also, second) = (run["changed"] for run in said)
    assert ended == also == f"ProvenanceError: {one.value}"
    assert changed not in first and second == [changed]  # found by rank 1, told rank 0


@pytest.mark.slow
def test_under_torchrun_a_retry_in_other_settings_reads_each_touched_failed_image_once(
    tmp_path, monkeypatch
):
    # A retry in another dtype takes no failed image as retried: refused, it names the
    # first image that differs, failed ones among them. The ranks shared the hashing of
    # the touched images without the failed ones, which every rank then read itself.
    from collections import Counter

    from tests._failing_ranks import rank_retrying_otherwise

    folder = make_image_folder(tmp_path / "data", n_per_class=3)  # 2 of them fail
    out = tmp_path / "f.h5"
    _at_2_ranks(monkeypatch, folder, out, **FAST)  # (float32)
    assert len(load_features(out).failures) == 2
    _touch(*folder.rglob("*.*"))
    _two_ranks(rank_retrying_otherwise, folder, tmp_path)
    (ended, first), (also, second) = (
        json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
    )
    assert ended == also and ended.startswith("ProvenanceError: ")
    assert "dtype: file has 'float32', request has 'float16'" in ended
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.*"))
    assert Counter(first + second) == Counter(files)  # each read once, by one rank


def test_a_torchrun_run_killed_then_its_images_touched_resumes(tmp_path, monkeypatch):
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _killed_at_2_ranks(monkeypatch, folder, out, **fast)  # each rank: 2 rows done, 1 not
    _touch(*folder.rglob("*.*"))
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [1, 1]
    merge_shards([shard_path(out, r, 2) for r in (0, 1)], out)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    expected = extract_features(folder, BACKBONE, tmp_path / "one.h5", **fast)
    with h5py.File(out, "r") as f, h5py.File(expected, "r") as g:
        assert f.attrs["source_fingerprint"] == g.attrs["source_fingerprint"]
        np.testing.assert_allclose(f["features"][:], g["features"][:], atol=1e-5)
        for name in ("status", "content_sha256", "file_size", "file_mtime_ns"):
            np.testing.assert_array_equal(f[name][:], g[name][:])


@pytest.mark.parametrize("shard", [False, True])
def test_a_retry_on_a_full_disk_is_refused_before_it_touches_the_store(
    tmp_path, monkeypatch, shard
):
    # A retry writes a repaired image's identity into the store's attributes, which HDF5
    # puts at the end of the file: on a full disk that write failed (a RuntimeError of
    # HDF5's cache, a traceback) and left the complete store unreadable, as "damaged".
    from extract import _store

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    image = folder / "cat" / "001.jpg"  # row 1: rank 1's of 2
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    retry = dict(retry_failed=True, **(dict(rank=1, world_size=2) if shard else {}), **FAST)
    asked = tmp_path / "f.h5"
    out = extract_features(folder, BACKBONE, asked, **dict(retry, retry_failed=False))
    before = out.read_bytes()
    image.write_bytes(good)
    usage = shutil.disk_usage(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(_store.shutil, "disk_usage", lambda _: usage._replace(free=4096))
        with pytest.raises(StoreError, match=r"No space left to update .* folder has 4 KiB free"):
            extract_features(folder, BACKBONE, asked, **retry)
    assert out.read_bytes() == before  # left as it was, for the retry once there is room
    extract_features(folder, BACKBONE, asked, **retry)
    assert not load_features(out).failures


@_SHARDS_READ_KNOWINGLY
def test_retry_failed_takes_a_repaired_image_into_its_own_shard_only(tmp_path):
    # A repaired image changes the source's fingerprint, which every shard records. The
    # shard holding it takes the repair; another shard, its own rows unchanged, cannot tell
    # a repair from any other change elsewhere: it is refused unless a merged store vouches
    # (under torchrun; test_extract_cli), and it took a change that its owner refused.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    image = folder / "dog" / "001.jpg"  # row 4: rank 0 of 2
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out = tmp_path / "f.h5"

    def shard(rank, **kwargs):
        return extract_features(folder, BACKBONE, out, rank=rank, world_size=2, **FAST, **kwargs)

    first = merge_shards([shard(0), shard(1)], tmp_path / "first.h5")
    assert [path for path, _ in load_features(first).failures] == ["dog/001.jpg"]
    image.write_bytes(good)
    with pytest.raises(ProvenanceError, match="dog/001.jpg' is not the file"):
        shard(0)  # without retry_failed the change is refused
    repaired = load_features(shard(0, retry_failed=True), in_memory=True)
    single = load_features(extract_features(folder, BACKBONE, tmp_path / "single.h5", **FAST))
    assert not repaired.failures and repaired.paths == single.paths[0::2]
    np.testing.assert_allclose(repaired.features, single.features[0::2], rtol=1e-5, atol=1e-6)
    # It said only that the fingerprints differ, naming no file and no remedy.
    for retry in (True, False):
        with pytest.raises(ProvenanceError, match=re.escape(
            "(the images differ: shard 1 of 2 holds its images unchanged, and images of the "
            "source in other shards changed (a shard's fingerprint covers the whole source); "
            "only a run of every rank under torchrun takes them as repaired failed images). "
            "Write to another output path, or pass --force (overwrite=True)"
        )):  # fmt: skip
            shard(1, retry_failed=retry)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_retry_killed_while_taking_a_repair_is_finished_by_the_next(
    tmp_path, monkeypatch, shards
):
    # Killed after the files' new sizes were written and before the fingerprint that
    # covers them: every later run was refused, --retry-failed too (nothing looked changed
    # any more), and only --force, which recomputes every row, got past it.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    image = folder / "dog" / "001.jpg"  # row 4: rank 0 of 2
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    kwargs = dict(rank=0, world_size=2) if shards == 2 else {}

    def run(**more):
        return extract_features(folder, BACKBONE, out, **FAST, **kwargs, **more)

    target = run()
    image.write_bytes(good)
    written = h5py.AttributeManager.__setitem__

    def killed(attrs, name, value):
        if name == "source_fingerprint":
            raise KeyboardInterrupt  # the kill: nothing more is written
        written(attrs, name, value)

    monkeypatch.setattr(h5py.AttributeManager, "__setitem__", killed)
    with pytest.raises(KeyboardInterrupt):
        run(retry_failed=True)
    monkeypatch.undo()
    with h5py.File(target, "r") as f:  # the sizes were written, the fingerprint was not
        row = 4 // shards  # (and the repaired row is to be extracted again)
        assert f["file_size"][row] == len(good) and f["status"][row] == PENDING
    # A run without --retry-failed is refused, naming it (it named two fingerprints); not
    # where another setting differs, which --retry-failed cannot mend.
    with pytest.raises(ProvenanceError, match=r"the images differ: a run with --retry-failed"):
        run()
    with pytest.raises(ProvenanceError, match="normalize: file has False") as info:
        run(retry_failed=True, normalize=True)
    assert "--retry-failed" not in str(info.value)
    again = load_features(run(retry_failed=True), in_memory=True)
    assert not again.failures and "adopting_source_fingerprint" not in again.metadata
    single = load_features(extract_features(folder, BACKBONE, tmp_path / "one.h5", **FAST))
    np.testing.assert_allclose(again.features, single.features[::shards], rtol=1e-5, atol=1e-6)


def _store_with_a_repaired_failure(tmp_path, n_per_class):
    """A store of a new folder whose image dog/001.jpg failed, repaired since."""
    folder = make_image_folder(tmp_path / "data", n_per_class=n_per_class, special=False)
    image = folder / "dog" / "001.jpg"
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    extract_features(folder, BACKBONE, out, **FAST)
    image.write_bytes(good)
    return folder, out


def test_a_retry_takes_a_repair_into_a_store_written_before_the_precision_was_recorded(
    tmp_path,
):
    # Such a store computed in float32, as this request does: the same settings.
    folder, out = _store_with_a_repaired_failure(tmp_path, n_per_class=2)
    with h5py.File(out, "r+") as f:
        del f.attrs["compute"]
    extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert not load_features(out).failures


def test_a_retry_in_another_precision_is_refused_before_it_touches_the_store(tmp_path):
    # The precision ("compute") was left out of what a repair must keep: a retry computed
    # in float32 took the repaired images into a store made in bfloat16 autocast, rewrote
    # its fingerprint and was refused only after (under torchrun: after every shard).
    folder, out = _store_with_a_repaired_failure(tmp_path, n_per_class=2)
    with h5py.File(out, "r+") as f:
        f.attrs["compute"] = "bfloat16 autocast"  # as a GPU that computes in it made it
        fingerprint = f.attrs["source_fingerprint"]
    # The repaired image is named, as without --retry-failed: no retry can take it here.
    with pytest.raises(ProvenanceError, match=r"compute: file has 'bfloat16 autocast'.*dog/001"):
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    with h5py.File(out, "r") as f:
        assert f.attrs["source_fingerprint"] == fingerprint


@pytest.mark.parametrize(
    "cat_lines, match",
    [
        (["cat/000.png,cat", "cat/001.jpg,dog"], r"cat/001\.jpg' is labelled 'dog' in the request"),
        (["cat/000.png,cats", "cat/001.jpg,cats"], r"the classes are \['cat', 'dog'\] in"),
    ],
    ids=["a label", "a class name"],
)
def test_a_retry_refuses_a_list_relabelled_beside_a_repaired_failure(tmp_path, cat_lines, match):
    # A repaired failed image is taken only where nothing else changed: a list whose labels
    # or class names changed too (the list file is no image: only they tell) leaves the
    # store as it was, its labels, class names and fingerprint those it was made with.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    dog_lines = ["dog/000.png,dog", "dog/001.jpg,dog"]
    listed = folder / "list.csv"
    listed.write_text("\n".join(["cat/000.png,cat", "cat/001.jpg,cat", *dog_lines]) + "\n")
    image = folder / "dog" / "001.jpg"
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out = extract_features(listed, BACKBONE, tmp_path / "f.h5", **FAST)
    with h5py.File(out, "r") as f:
        fingerprint = f.attrs["source_fingerprint"]
    image.write_bytes(good)
    listed.write_text("\n".join([*cat_lines, *dog_lines]) + "\n")
    with pytest.raises(ProvenanceError, match=match):
        extract_features(listed, BACKBONE, out, retry_failed=True, **FAST)
    with h5py.File(out, "r") as f:
        assert f.attrs["source_fingerprint"] == fingerprint
        assert f["labels"][:].tolist() == [0, 0, 1, 1]
        assert f["class_names"].asstr()[:].tolist() == ["cat", "dog"]
        assert f["status"][:].tolist() == [DONE, DONE, DONE, FAILED]


def test_a_rank_without_rows_says_so_rather_than_reused(folder, tmp_path, caplog):
    # Rank 2 of 3 over two images: its new, empty shard was "Reused the complete feature
    # store (0 rows, nothing to compute)".
    caplog.set_level(logging.INFO, logger="extract")
    out = tmp_path / "f.h5"
    shard = extract_features(folder, BACKBONE, out, max_items=2, rank=2, world_size=3, **FAST)
    assert len(load_features(shard, in_memory=True).paths) == 0
    assert "holds no rows of the request: nothing to extract" in caplog.text
    assert "Reused" not in caplog.text


def _spy_writes(monkeypatch, written: list | None = None) -> list:
    """Count the rows of each write of the extraction's rows into ``written`` (a new list by
    default), as the runs go."""
    from extract import _runner, _store

    written = [] if written is None else written

    def counted(f, positions, *args, **kwargs):
        written.append(len(positions))
        _store.write_rows(f, positions, *args, **kwargs)

    monkeypatch.setattr(_runner, "write_rows", counted)
    return written


def _killed_run(monkeypatch, *args, **kwargs) -> None:
    """``extract_features(*args, **kwargs)`` killed after its first write of rows."""
    with monkeypatch.context() as patch:
        _kill_after_a_write(patch)
        with pytest.raises(KeyboardInterrupt):
            extract_features(*args, **kwargs)


def _rank_1_done_rank_0_killed(monkeypatch, folder, out, fast) -> None:
    """Two torchrun ranks run one after the other without a merge: rank 1's shard
    finished, rank 0's killed after its first batch; RANK and WORLD_SIZE left set."""
    _ranks_without_merge(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    extract_features(folder, BACKBONE, out, **fast)
    monkeypatch.setenv("RANK", "0")
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)


def _kill_after_a_write(monkeypatch) -> None:
    """Make the extraction's next write of rows its last: written, then the run killed
    (a KeyboardInterrupt)."""
    from extract import _runner, _store

    def killed(*args, **kwargs):
        _store.write_rows(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(_runner, "write_rows", killed)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.slow
def test_an_interrupted_forced_rebuild_under_torchrun_resumes_from_its_shards(
    tmp_path, monkeypatch, dtype
):
    # docs/extract.md: rerun an interrupted forced rebuild without --force. Under torchrun
    # every rank read the old merged store first and refused it (another dtype), and with
    # --force again every shard was made anew, its finished rows computed again. A rebuild
    # made as the old store was (float32: images replaced in place, which the provenance
    # cannot see) kept the old store, reused as complete.
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=2)
    shards = _two_shards(folder, out, **fast)
    merge_shards(shards, out)
    merges, written = _ranks_without_merge(monkeypatch), []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        _kill_after_a_write(monkeypatch)  # the run is killed after its first batch
        with pytest.raises(KeyboardInterrupt):
            extract_features(folder, BACKBONE, out, dtype=dtype, overwrite=True, **fast)
        _spy_writes(monkeypatch, written)
        extract_features(folder, BACKBONE, out, dtype=dtype, **fast)  # without --force
    assert written == [2, 2]  # the rows left,
    assert [overwrite for _, overwrite, _ in merges] == [True, True]  # then a replacement
    merge_shards(shards, out, overwrite=True)
    rebuilt = load_features(out, in_memory=True)
    assert rebuilt.features.dtype == np.dtype(dtype) and len(rebuilt.paths) == 8
    assert "replaces_store" not in rebuilt.metadata
    # The shards stay, as every finished run's do: beside the store that replaced the one
    # they were made to replace, they are no rebuild, and a request made otherwise (their
    # own float32 included) is refused by the store, not resumed over it.
    for made in ("float32", "float16"):
        alone = dict(rank=0, world_size=1, overwrite=True)
        extract_features(folder, BACKBONE, out, dtype=made, **alone, **fast)
        other = "float16" if made == "float32" else "float32"
        with pytest.raises(ProvenanceError, match=rf"'{out}' was made .* request has '{other}'"):
            extract_features(folder, BACKBONE, out, dtype=other, **fast)


def _two_rank_store(tmp_path, broken: bool):
    """A store merged from two ranks' shards, of batches of 2, row 1 (rank 1's image
    ``cat/001.jpg``) failed in it where ``broken``: ``(folder, image, its good bytes,
    out, the extraction's options, the shards)``."""
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    image = folder / "cat" / "001.jpg"  # row 1, rank 1's
    good = image.read_bytes()
    if broken:
        image.write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=2)
    shards = _two_shards(folder, out, **fast)
    merge_shards(shards, out)
    return folder, image, good, out, fast, shards


@pytest.mark.parametrize("kept", [True, False])  # the finished run's shard of rank 1
@pytest.mark.parametrize("retry", [False, True])
@pytest.mark.slow
def test_a_resumed_rebuild_extracts_anew_a_rank_whose_shard_it_had_not_made(
    tmp_path, monkeypatch, retry, kept
):
    # A forced rebuild killed before rank 1 made its shard: resumed without --force, rank 1
    # resumed the finished run's shard, and the "rebuilt" store held its old rows (images
    # changed in place since included). At another number of ranks, or in one process, the
    # old store was reused as complete, the rebuild dropped without a word. Where that
    # shard is gone, rank 1 takes no rows from the store it replaces (a resume of a store
    # left incomplete takes them; a rebuild is to extract them anew).
    from extract._resume import _identity
    from extract._schema import REPLACES

    # With --retry-failed, a failed image repaired since: the same, not a retry.
    folder, image, good, out, fast, shards = _two_rank_store(tmp_path, broken=retry)
    image.write_bytes(good)
    identity = _identity(out)
    merges = _ranks_without_merge(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    _kill_after_a_write(monkeypatch)  # rank 0's forced run is killed after its first batch
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, BACKBONE, out, overwrite=True, **fast)
    written = _spy_writes(monkeypatch)  # (the refusals below write nothing)
    # Rank 1 never ran: its shard is the finished run's. Elsewhere the rebuild is refused.
    for world_size in ("1", "3"):
        monkeypatch.setenv("WORLD_SIZE", world_size)
        with pytest.raises(
            StoreError,
            match=r"by 2 ranks was stopped before its merge .*"
            r"f\.shard-00000-of-00002\.h5 the first\): finish it with 2 ranks",
        ):
            extract_features(folder, BACKBONE, out, retry_failed=retry, **fast)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    with pytest.raises(StoreError, match="by 2 ranks was stopped"):
        extract_features(folder, BACKBONE, out, retry_failed=retry, **fast)  # one process
    monkeypatch.setenv("WORLD_SIZE", "2")
    if not kept:
        shards[1].unlink()
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=retry, **fast)  # without --force
    assert written == [2, 2, 2]  # rank 1's four rows anew, then rank 0's two left
    assert [merge[1:] for merge in merges] == [(True, None)] * 2  # replaced, not repaired
    for shard in shards:
        with h5py.File(shard, "r") as f:
            assert f.attrs[REPLACES] == identity


def test_a_resumed_rebuild_asked_otherwise_is_refused_by_every_rank_before_any_write(
    tmp_path, monkeypatch
):
    # Resumed with another dtype: rank 0 refused it against its shard, while rank 1, whose
    # shard the rebuild had not made, overwrote it; the resume as first asked then failed
    # on rank 1's shard.
    folder, out, shards, fast = _two_rank_store_with_stale_shard(tmp_path)
    _ranks_without_merge(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    _kill_after_a_write(monkeypatch)  # rank 0's forced run is killed after its first batch
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, BACKBONE, out, overwrite=True, **fast)
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(ProvenanceError, match="shard-00000-of-00002.h5' was made with a"):
            extract_features(folder, BACKBONE, out, dtype="float16", **fast)
    assert written == []
    for rank in (1, 0):  # as first asked: resumed
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [2, 2, 2]  # rank 1's four rows anew, then rank 0's two left


def test_a_rank_making_its_shard_anew_refuses_another_rank_s_shard_of_other_images(
    tmp_path, monkeypatch
):
    # Rank 0's shard deleted, an image of rank 1's changed since: rank 0's new shard would
    # be of the images as they are, rank 1's of those as they were. Rank 0 refuses before
    # it writes, as rank 1 does.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    _ranks_without_merge(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **FAST)
    shard_path(out, 0, 2).unlink()
    changed = folder / "cat" / "001.jpg"  # row 1: rank 1's
    _other_bytes_same_size(changed)
    written = _spy_writes(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ProvenanceError, match="shard-00001-of-00002.h5' was made with a"):
        extract_features(folder, BACKBONE, out, **FAST)
    assert written == [] and not shard_path(out, 0, 2).exists()


@pytest.mark.parametrize("changed", ["cat/000.png", "cat/001.jpg", "cat/002.jpg"])
@pytest.mark.slow
def test_a_resumed_rebuild_of_a_changed_image_is_refused_naming_it_by_every_rank(
    tmp_path, monkeypatch, changed
):
    # A forced rebuild at 3 ranks killed, then an image changed: each rank refused the
    # resume naming another rank's shard and two fingerprints, where one process names the
    # image. Rows 0, 1, 2 are ranks 0, 1, 2's.
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=1)
    extract_features(folder, BACKBONE, out, **fast)
    _ranks_without_merge(monkeypatch, world_size=3)
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        _killed_run(monkeypatch, folder, BACKBONE, out, overwrite=True, **fast)
    image = folder / changed
    image.write_bytes(image.read_bytes() + b"\0")
    written = _spy_writes(monkeypatch)
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(ProvenanceError, match=rf"the images differ: '{image}' is not the"):
            extract_features(folder, BACKBONE, out, **fast)
    assert written == []


def test_a_run_in_one_process_resumed_under_torchrun_extracts_only_its_pending_rows(
    tmp_path, monkeypatch
):
    # Each rank made its shard anew and extracted every row, the killed run's done rows
    # thrown away (the merge replaced the store with the same features).
    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    expected = load_features(extract_features(folder, BACKBONE, tmp_path / "one.h5", **fast))
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)  # rows 0 and 1 done
    _ranks_without_merge(monkeypatch)

    def merge(out, rank, n, overwrite, repair, step):
        return merge_shards([shard_path(out, r, n) for r in range(n)], out) if rank == 0 else out

    monkeypatch.setattr(_runner, "_merge_on_rank0", merge)
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [2, 1, 2, 1]  # rows 3, 5, 7, then 2, 4, 6
    merged = load_features(out, in_memory=True)
    assert merged.paths == expected.paths  # (load_features refuses an incomplete store)
    np.testing.assert_allclose(merged.features, expected.features[:], atol=1e-5)


@pytest.mark.parametrize("retry", [False, True])
def test_shards_of_another_version_resumed_under_torchrun_are_said_made_from_the_store(
    tmp_path, monkeypatch, caplog, retry
):
    # A store rebuilt in one process (--force) and killed, resumed under torchrun: the
    # shards merged into its old version are made anew from its rows, only the pending
    # ones extracted; without --retry-failed the log said "made anew" (as of every row)
    # and "takes 1 rows".
    folder, _, _, out, fast, _ = _two_rank_store(tmp_path, broken=False)
    _killed_run(monkeypatch, folder, BACKBONE, out, overwrite=True, **fast)  # rows 0, 1 done
    _ranks_without_merge(monkeypatch)
    written = _spy_writes(monkeypatch)
    caplog.set_level(logging.INFO, logger="extract")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=retry, **fast)
    assert written == [2, 1, 2, 1]  # rows 3, 5, 7, then 2, 4, 6
    said = [r.getMessage() for r in caplog.records if "f.shard-" in r.getMessage()]
    for rank in (1, 0):
        shard = shard_path(out, rank, 2)
        assert (
            f"{shard} went into another version of {out}; it is made anew from the store's rows."
            in said
        )
        assert any(line.startswith(f"{shard} takes 1 row from {out}") for line in said)


def test_a_resumed_run_warns_of_the_failures_recorded_before_it_too(tmp_path, monkeypatch, caplog):
    # The warning counted only the resumed run's failures (here 1 of 2), and the resume
    # said that the failed rows were "extracted before".
    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    (folder / "cat" / "001.jpg").write_text("not an image")  # row 1, in the first batch
    (folder / "dog" / "002.jpg").write_text("not an image")  # row 5, in the resumed run's
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=2)
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)
    caplog.clear()
    extract_features(folder, BACKBONE, out, **fast)
    assert f"Resuming {out}: 2 of 6 rows were done before (1 of them recorded as failed)." in (
        caplog.text
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"2 images were recorded in {out} as")
    assert re.search("'cat/001.jpg': UnidentifiedImageError.*; 'dog/002.jpg'", warnings[0])


def test_a_resumed_torchrun_run_asked_otherwise_is_refused_by_every_rank_before_any_write(
    tmp_path, monkeypatch
):
    # Not a rebuild: the first run killed after rank 0's first batch, before rank 1 began
    # (no merged store yet). Resumed with another dtype, rank 1 made and filled a float16
    # shard while rank 0 refused its own; resumed as first asked, rank 1's was refused.
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _ranks_without_merge(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)
    written = _spy_writes(monkeypatch)
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(ProvenanceError, match="shard-00000-of-00002.h5' was made with a"):
            extract_features(folder, BACKBONE, out, dtype="float16", **fast)
    assert written == [] and not shard_path(out, 1, 2).exists()
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [2, 2, 2]  # rank 1's four rows, then rank 0's two left


def test_a_first_torchrun_run_resumed_retries_a_failure_repaired_in_another_rank_s_shard(
    tmp_path, monkeypatch
):
    # No merged store yet: rank 1 finished with row 1 failed, rank 0 was killed; the image
    # repaired, a --retry-failed resume was refused by rank 0 (nothing vouched for the
    # listing that the repair changed) while rank 1 took the repair.

    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    image = folder / "cat" / "001.jpg"  # row 1, rank 1's
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _rank_1_done_rank_0_killed(monkeypatch, folder, out, fast)
    image.write_bytes(good)
    written = _spy_writes(monkeypatch)
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    assert written == [1, 2]  # rank 1's repaired row, then rank 0's two left
    merge_shards([shard_path(out, r, 2) for r in (0, 1)], out)
    assert not load_features(out, in_memory=True).failures


@pytest.mark.parametrize("failed_in_the_store", [True, False])
@pytest.mark.slow
def test_a_resumed_rebuild_retries_a_failure_repaired_in_another_rank_s_shard(
    tmp_path, monkeypatch, failed_in_the_store
):
    # A forced rebuild's two shards, each cut after a batch, row 1 failed in rank 1's
    # shard, then repaired: resumed with --retry-failed, rank 0 refused rank 1's shard for
    # the listing that the repair changed (as every rank did under torchrun); and where
    # the store being replaced held row 1 as done (the image broken after it was made),
    # rank 1 took the repair while rank 0 refused its own shard.
    folder, image, good, out, fast, shards = _two_rank_store(tmp_path, failed_in_the_store)
    image.write_bytes(b"not an image!")  # broken (again) before the rebuild
    _ranks_without_merge(monkeypatch)
    for rank in (0, 1):  # the forced rebuild, each rank killed after its first batch
        monkeypatch.setenv("RANK", str(rank))
        _killed_run(monkeypatch, folder, BACKBONE, out, overwrite=True, **fast)
    image.write_bytes(good)
    written = _spy_writes(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    assert written == [2, 2, 1]  # rank 0's two left, rank 1's two left and its repaired row
    merge_shards(shards, out, overwrite=True)
    assert not load_features(out, in_memory=True).failures


def _bitmaps(folder: Path, seed: int) -> None:
    """Two classes of four 36 × 36 BMPs (one size whatever the pixels), their modification
    times fixed: written again with other pixels, no listing can tell them apart."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(("cat", "dog")):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            path = folder / name / f"{i}.bmp"
            Image.fromarray(rng.integers(0, 255, (36, 36, 3), dtype=np.uint8)).save(path)
            os.utime(path, ns=(10**18, 10**18 + k * 4 + i))


def test_marking_shards_superseded_passes_over_files_that_are_no_shards(tmp_path, caplog):
    # An output named without a suffix: its shards' lock files match the shards' names,
    # and each was named in a warning that it could not be marked.
    from extract._merge import mark_superseded

    out = tmp_path / "features"
    with h5py.File(tmp_path / "features.shard-00000-of-00002", "w"):
        pass
    (tmp_path / "features.shard-00001-of-00002.lock").write_text("123 host")
    with caplog.at_level(logging.WARNING, logger="extract"):
        mark_superseded(out)
    assert not caplog.records
    with h5py.File(tmp_path / "features.shard-00000-of-00002", "r") as f:
        assert f.attrs["merged_into_store"] == "superseded by a forced rebuild"


@pytest.mark.parametrize("by", ["a forced rebuild", "a run in one process", "a run at 3 ranks"])
def test_a_shard_that_cannot_be_marked_superseded_is_named_in_sentences(
    tmp_path, monkeypatch, caplog, by
):
    # The reason, a sentence of its own, was nested in parentheses: "(... as it was).):".
    # A run that completed the store, no rebuild, was said to have "rebuilt" it.
    from extract import _store
    from extract._merge import mark_superseded

    shard = tmp_path / "f.shard-00000-of-00002.h5"
    with h5py.File(shard, "w"):
        pass
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(_store.shutil, "disk_usage", lambda _: usage._replace(free=4096))
    with caplog.at_level(logging.WARNING, logger="extract"):
        mark_superseded(tmp_path / "f.h5", by=by)
    [warned] = [r.getMessage() for r in caplog.records]
    assert warned.startswith(f"Could not mark the shard {shard} of an interrupted run as ")
    assert f"superseded by {by} of {tmp_path / 'f.h5'}: No space left to update" in warned
    assert "(the shard is left as it was). A later run at its number of ranks" in warned
    assert warned.endswith("as they were; delete it.")


@pytest.mark.parametrize("rebuilt_at", [1, "1, stopped and resumed", 3])
@pytest.mark.slow
def test_a_forced_rebuild_at_other_ranks_supersedes_an_interrupted_run_s_shards(
    tmp_path, monkeypatch, rebuilt_at
):
    # A torchrun run killed at 2 ranks, the images replaced in place (the same sizes and
    # times: what --force is for), the store rebuilt with --force at 3 ranks or in one
    # process, then --retry-failed at 2 ranks: the old shards, never merged, were resumed
    # and merged over the rebuilt store, their rows those of the images replaced.
    from extract import _runner

    folder, out = tmp_path / "data", tmp_path / "f.h5"
    _bitmaps(folder, seed=0)
    (folder / "dog" / "9.bmp").write_bytes(b"not an image")  # a failure to retry
    fast = dict(FAST, batch_size=2)
    _killed_at_2_ranks(monkeypatch, folder, out, **fast)
    _bitmaps(folder, seed=1)  # replaced in place
    if rebuilt_at != 3:
        monkeypatch.delenv("WORLD_SIZE")
        monkeypatch.delenv("RANK")
        if rebuilt_at != 1:  # finished by a plain resume, which cannot tell it was forced
            _killed_run(monkeypatch, folder, BACKBONE, out, overwrite=True, **fast)
        extract_features(folder, BACKBONE, out, overwrite=rebuilt_at == 1, **fast)
    else:  # rank 0 last, which merges the three shards
        three = [shard_path(out, r, 3) for r in range(3)]

        def merge(out, rank, *args):
            return merge_shards(three, out, overwrite=True) if rank == 0 else out

        monkeypatch.setattr(_runner, "_merge_on_rank0", merge)
        monkeypatch.setenv("WORLD_SIZE", "3")
        for rank in (1, 2, 0):
            monkeypatch.setenv("RANK", str(rank))
            extract_features(folder, BACKBONE, out, overwrite=True, **fast)
        monkeypatch.setattr(_runner, "_merge_on_rank0", lambda out, *a: out)
    rebuilt = load_features(out, in_memory=True).features
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    merge_shards([shard_path(out, r, 2) for r in (0, 1)], out, overwrite=True)
    np.testing.assert_allclose(load_features(out, in_memory=True).features, rebuilt, atol=1e-5)


def _killed_at_2_ranks(monkeypatch, folder, out, **kwargs) -> None:
    """A torchrun run at 2 ranks, run one by one in this process, each rank killed after
    its first batch, before any merge; RANK and WORLD_SIZE left set."""
    _ranks_without_merge(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        _killed_run(monkeypatch, folder, BACKBONE, out, **kwargs)


def _killed_at_2_ranks_then_alone(monkeypatch, folder, out, **kwargs) -> None:
    """:func:`_killed_at_2_ranks`, then RANK and WORLD_SIZE unset: a later run in one process
    (or, set again, at another number of ranks)."""
    _killed_at_2_ranks(monkeypatch, folder, out, **kwargs)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")


def _at_3_ranks(monkeypatch, folder, out, **kwargs) -> None:
    """A torchrun run at 3 ranks, run one by one in this process, rank 0 last merging."""
    from extract import _runner

    three = [shard_path(out, r, 3) for r in range(3)]
    overwrite = kwargs.get("overwrite", False)
    with monkeypatch.context() as patch:
        patch.setattr(_runner, "_merge_on_rank0", lambda out, rank, *a: (
            merge_shards(three, out, overwrite=overwrite) if rank == 0 else out))  # fmt: skip
        patch.setenv("WORLD_SIZE", "3")
        for rank in (1, 2, 0):
            patch.setenv("RANK", str(rank))
            extract_features(folder, BACKBONE, out, **kwargs)


@pytest.mark.parametrize("later", ["in one process", "at 3 ranks"])
def test_a_run_at_other_ranks_says_the_interrupted_run_s_shards_are_not_used(
    tmp_path, monkeypatch, caplog, later
):
    # A torchrun run killed at 2 ranks, then run in one process (or at 3 ranks): every row
    # was extracted again, the 2-rank shards left unsaid, the way to resume them untold.
    folder, out = tmp_path / "data", tmp_path / "f.h5"
    _bitmaps(folder, seed=0)
    fast = dict(FAST, batch_size=2)
    _killed_at_2_ranks_then_alone(monkeypatch, folder, out, **fast)
    caplog.set_level(logging.INFO, logger="extract")
    if later == "in one process":
        extract_features(folder, BACKBONE, out, **fast)
    else:
        _at_3_ranks(monkeypatch, folder, out, **fast)
    said = [m for r in caplog.records if "interrupted run at 2" in (m := r.getMessage())]
    assert len(said) == 1
    assert f"not used by this run {later}" in said[0]
    assert said[0].endswith("run the command again under torchrun with 2 processes.")


def test_a_forced_run_at_other_ranks_does_not_say_to_resume_an_interrupted_run_s_shards(
    tmp_path, monkeypatch, caplog
):
    # A torchrun run killed at 2 ranks, then rebuilt with --force at 3: it said to stop
    # and run the command again at 2 ranks to resume their shards, which --force makes anew.
    folder, out = tmp_path / "data", tmp_path / "f.h5"
    _bitmaps(folder, seed=0)
    fast = dict(FAST, batch_size=2)
    _killed_at_2_ranks_then_alone(monkeypatch, folder, out, **fast)
    caplog.set_level(logging.INFO, logger="extract")
    _at_3_ranks(monkeypatch, folder, out, overwrite=True, **fast)
    assert "interrupted run at 2" not in caplog.text
    assert len(load_features(out, in_memory=True).paths) == 8


@pytest.mark.parametrize("later", ["in one process", "at 3 ranks"])
@pytest.mark.slow
def test_a_run_at_other_ranks_supersedes_an_interrupted_run_s_shards(tmp_path, monkeypatch, later):
    # A torchrun run killed at 2 ranks, an image replaced (another size), the store made
    # in one process (or at 3 ranks), a failure repaired, then --retry-failed at 2 ranks:
    # it resumed the old shards, never merged, and refused the one holding the replaced
    # image's old row (to be rebuilt with --force, every row); they are superseded.
    import torch.distributed as dist

    from extract import _runner

    merge = _runner._merge_on_rank0
    folder, out = tmp_path / "data", tmp_path / "f.h5"
    _bitmaps(folder, seed=0)
    (folder / "dog" / "3.bmp").write_bytes(b"not an image")  # a failure to retry
    fast = dict(FAST, batch_size=2)
    _killed_at_2_ranks_then_alone(monkeypatch, folder, out, **fast)
    Image.fromarray(np.full((40, 40, 3), 7, np.uint8)).save(folder / "cat" / "0.bmp")
    if later == "in one process":
        extract_features(folder, BACKBONE, out, **fast)
    else:
        _at_3_ranks(monkeypatch, folder, out, **fast)
    newest = load_features(out, in_memory=True)
    Image.fromarray(np.full((36, 36, 3), 9, np.uint8)).save(folder / "dog" / "3.bmp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "barrier", lambda: None)
    monkeypatch.setattr(_runner, "_merge_on_rank0", merge)
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):  # rank 0 last, which merges
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    assert written == [1]  # the repaired image alone, the others' rows the store's
    retried = load_features(out, in_memory=True)
    assert retried.paths == newest.paths + ["dog/3.bmp"] and not retried.failures
    np.testing.assert_allclose(retried.features[:7], newest.features, atol=1e-5)


def test_a_store_reused_in_one_process_marks_no_shards(tmp_path, monkeypatch, caplog):
    # A complete store beside an interrupted torchrun run's shards (unmarked: completed by
    # an earlier version), reused on a read-only file system: every reuse warned that
    # each shard could not be marked, as superseded by "the rebuilt" store.
    from extract import _runner

    folder, out = tmp_path / "data", tmp_path / "f.h5"
    _bitmaps(folder, seed=0)
    fast = dict(FAST, batch_size=2)
    _killed_at_2_ranks_then_alone(monkeypatch, folder, out, **fast)
    with monkeypatch.context() as patch:
        patch.setattr(_runner, "mark_superseded", lambda *args, **kwargs: None)
        extract_features(folder, BACKBONE, out, **fast)
    real = h5py.File
    _not_writable(monkeypatch, tmp_path)

    def read_only(path, mode="r", **kwargs):
        if mode != "r":
            raise PermissionError(30, "Unable to synchronously open file (Read-only file system)")
        return real(path, mode, **kwargs)

    monkeypatch.setattr(h5py, "File", read_only)
    with caplog.at_level(logging.WARNING, logger="extract"):
        assert extract_features(folder, BACKBONE, out, **fast) == out
    assert not caplog.records


def test_a_forced_run_refused_before_it_writes_supersedes_no_shards(folder, tmp_path, monkeypatch):
    # A --force run stopped by a misspelt backbone had marked the shards beside the store
    # as superseded: their rows, though nothing was rebuilt, were extracted anew.
    out = tmp_path / "f.h5"
    extract_features(folder, BACKBONE, out, **FAST)
    extract_features(folder, BACKBONE, out, rank=0, world_size=2, **FAST)
    with pytest.raises(ValueError, match="timm has no model"):
        extract_features(folder, "timm:test_resnett@random", out, overwrite=True, **FAST)
    written = _spy_writes(monkeypatch)
    extract_features(folder, BACKBONE, out, rank=0, world_size=2, **FAST)
    assert written == []  # the shard is reused, not made anew


def test_under_torchrun_a_rank_with_nothing_left_counts_its_failures_in_the_warning(
    tmp_path, monkeypatch
):
    # Rank 1 finished (one failure), rank 0 resumed: the merged store's warning counted
    # rank 0's failures alone, and left out the finished rank's.
    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    for name in ("cat/000.png", "cat/001.jpg", "dog/002.jpg"):  # rows 0 and 6 rank 0's, 1 rank 1's
        (folder / name).write_text("not an image")
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=2)
    _rank_1_done_rank_0_killed(monkeypatch, folder, out, fast)
    told = {}
    monkeypatch.setattr(
        _runner,
        "_all_ranks_failures",
        lambda failed, n: told.setdefault(os.environ["RANK"], failed),
    )
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        extract_features(folder, BACKBONE, out, **fast)
    assert {
        rank: (n, [(i, path) for i, path, _ in first]) for rank, (n, first) in told.items()
    } == {
        "1": (1, [(1, "cat/001.jpg")]),
        "0": (2, [(0, "cat/000.png"), (6, "dog/002.jpg")]),
    }


def test_a_refused_rebuild_names_every_number_of_ranks_it_was_stopped_at(store, tmp_path):
    # Forced rebuilds stopped at 2 and then at 3 ranks: the refusal named 2 alone.
    from extract._resume import _identity, _refuse_other_rebuild
    from extract._schema import REPLACES

    out = tmp_path / "f.h5"
    shutil.copy(store, out)
    for world_size in (2, 3):
        shard = shard_path(out, 0, world_size)
        shutil.copy(store, shard)
        with h5py.File(shard, "r+") as f:
            f.attrs["shard_world_size"], f.attrs[REPLACES] = world_size, _identity(out)
    with pytest.raises(StoreError, match="by 2 or 3 ranks .* finish it with 2 or 3 ranks"):
        _refuse_other_rebuild(out, 1)
    _refuse_other_rebuild(out, 3)  # the rebuild at 3 ranks is resumed


def _two_rank_store_with_stale_shard(tmp_path):
    """A folder, a store merged from two ranks' shards, and the shards, rank 1's features
    then set to 7: rows that no later version of the store holds (images changed in place
    since, which the provenance cannot see, would leave such a shard)."""
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    out = tmp_path / "f.h5"
    fast = dict(FAST, batch_size=2)
    shards = _two_shards(folder, out, **fast)
    merge_shards(shards, out)
    with h5py.File(shards[1], "r+") as f:
        f["features"][:] = 7.0
    return folder, out, shards, fast


def test_a_retry_takes_no_rows_of_shards_that_went_into_another_version_of_the_store(
    tmp_path, monkeypatch
):
    # The store rebuilt in one process (--force), then a --retry-failed under torchrun at
    # the shards' number of ranks: it resumed rank 1's shard, merged into the old version,
    # and merged its rows back into the rebuilt store.
    folder, out, shards, fast = _two_rank_store_with_stale_shard(tmp_path)
    image = folder / "cat" / "001.jpg"  # row 1, rank 1's
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    extract_features(folder, BACKBONE, out, overwrite=True, **fast)  # row 1 failed
    rebuilt = load_features(out, in_memory=True).features
    image.write_bytes(good)
    _ranks_without_merge(monkeypatch)
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    assert written == [1]  # the repaired image alone: the others from the rebuilt store
    merge_shards(shards, out, overwrite=True)
    again = load_features(out, in_memory=True)
    assert not again.failures and not (again.features == 7.0).any()
    rows = np.arange(len(again.features)) != 1  # the rebuilt store's rows (row 1 failed)
    np.testing.assert_array_equal(again.features[rows], rebuilt)


def test_shards_that_went_into_another_version_of_the_store_are_not_merged_back(
    tmp_path, monkeypatch
):
    # Without torchrun (rank and world_size given): the store rebuilt in one process since
    # its shards were merged, the same calls resumed the shards as complete and
    # merge_shards put their rows back into the rebuilt store.
    folder, out, shards, fast = _two_rank_store_with_stale_shard(tmp_path)
    extract_features(folder, BACKBONE, out, overwrite=True, **fast)
    rebuilt = load_features(out, in_memory=True).features
    with pytest.raises(ProvenanceError, match="2 of the 2 shards .* another version of"):
        merge_shards(shards, out)  # shards merged elsewhere are refused
    np.testing.assert_array_equal(load_features(out, in_memory=True).features, rebuilt)
    written = _spy_writes(monkeypatch)
    for rank in (0, 1):  # rank 0's shard as the rebuilt store; both went into the old one
        extract_features(folder, BACKBONE, out, rank=rank, world_size=2, **fast)
    assert written == [2, 2, 2, 2]  # every row anew
    merge_shards(shards, out)
    np.testing.assert_allclose(load_features(out, in_memory=True).features, rebuilt, rtol=1e-5)
    for rank in (0, 1):  # merged into this version now: resumed as complete
        extract_features(folder, BACKBONE, out, rank=rank, world_size=2, **fast)
    assert written == [2, 2, 2, 2]
    merge_shards(shards, out)


def test_a_shard_that_cannot_be_marked_at_its_merge_is_named(tmp_path, monkeypatch, caplog):
    # Marks are best effort: a shard that cannot be written (read-only, open elsewhere)
    # kept its mark of an earlier version, and the next run remade it without a word why.
    folder, out, shards, fast = _two_rank_store_with_stale_shard(tmp_path)
    real = h5py.File

    def read_only(path, mode="r", **kwargs):
        if mode == "r+" and Path(path) == shards[1]:
            raise PermissionError(13, "Unable to synchronously open file (Permission denied)")
        return real(path, mode, **kwargs)

    monkeypatch.setattr(h5py, "File", read_only)
    merge_shards(shards, out, overwrite=True)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"Could not mark the shard {shards[1]}")
    assert "make it writable, or delete it now that it is merged" in warned[0]


def test_shards_are_not_marked_where_the_merged_store_took_the_last_room(
    tmp_path, monkeypatch, caplog
):
    # Each shard's mark is an attribute, which HDF5 writes at the end of the file: on a
    # disk that the merged store had filled, the write failed and left the shards
    # unreadable, refused by every later run at their number of ranks, --force included.
    from extract import _merge, _store

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    shards = _two_shards(folder, out)
    before = [shard.read_bytes() for shard in shards]
    usage, write_merged = shutil.disk_usage(tmp_path), _merge._write_merged

    def filling(*args):
        write_merged(*args)
        monkeypatch.setattr(_store.shutil, "disk_usage", lambda _: usage._replace(free=4096))

    monkeypatch.setattr(_merge, "_write_merged", filling)
    merge_shards(shards, out)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all("No space left to update" in w for w in warned)
    # A rerun reuses the merged store and marks no shard: "free some space, then run
    # again" was no help; deleting the merged shard is.
    assert all("free some space" not in w and "run again" not in w for w in warned)
    # (the error's own sentence: "... as it was).): a later run" nested it in parentheses)
    assert all("(the shard is left as it was). A later run cannot tell" in w for w in warned)
    assert all(w.endswith("as it is); delete it now that it is merged.") for w in warned)
    assert [shard.read_bytes() for shard in shards] == before  # left as they were
    assert len(load_features(out).paths) == 4


@pytest.mark.parametrize("earlier", [False, True])
def test_a_rebuild_resumed_after_its_store_was_deleted_extracts_anew_a_rank_it_had_not_made(
    tmp_path, monkeypatch, earlier
):
    # Rank 0's forced shard, rank 1's of the finished run, the store deleted: rank 1's old
    # rows were resumed and merged as the rebuild's.
    from extract._resume import _identity
    from extract._schema import REPLACES

    folder, out, shards, fast = _two_rank_store_with_stale_shard(tmp_path)
    _ranks_without_merge(monkeypatch)
    if earlier:  # a finished forced rebuild before: its shards keep their mark
        for rank in (0, 1):
            monkeypatch.setenv("RANK", str(rank))
            extract_features(folder, BACKBONE, out, overwrite=True, **fast)
        merge_shards(shards, out, overwrite=True)
        with h5py.File(shards[1], "r+") as f:
            f["features"][:] = 7.0
    identity = _identity(out)
    monkeypatch.setenv("RANK", "0")
    _kill_after_a_write(monkeypatch)  # rank 0's forced run is killed after its first batch
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, BACKBONE, out, overwrite=True, **fast)
    out.unlink()
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [2, 2, 2]  # rank 1's four rows anew, then rank 0's two left
    for shard in shards:
        with h5py.File(shard, "r") as f:
            assert f.attrs[REPLACES] == identity
    merge_shards(shards, out)
    assert not (load_features(out, in_memory=True).features == 7.0).any()


def test_the_rebuild_check_reads_shards_that_another_rank_writes(folder, tmp_path):
    # Every rank read every shard with HDF5's lock, while a faster rank wrote its own: the
    # lock refused the reader (StoreLockedError), or the writer.
    from extract._resume import _rebuilding

    out = tmp_path / "f.h5"
    shards = _two_shards(folder, out, max_items=4)
    merge_shards(shards, out)
    with _held_open(shards[0], "r+"):
        assert _rebuilding(out, 2) is False


def test_a_rebuild_at_another_number_of_ranks_is_found(folder, tmp_path):
    # A retry whose shards were deleted takes its rows from the merged store, unless a
    # forced rebuild of that store, at any number of ranks, is unfinished beside it.
    from extract._resume import _identity, _rebuilding
    from extract._schema import REPLACES

    out = tmp_path / "f[1].h5"  # a glob's special characters in the name
    shards = _two_shards(folder, out, max_items=4)
    merge_shards(shards, out)
    for shard in shards:
        shard.unlink()
    assert _rebuilding(out, None) is False
    other = shard_path(out, 0, 4)
    shutil.copy(extract_features(folder, BACKBONE, tmp_path / "g.h5", max_items=4, **FAST), other)
    with h5py.File(other, "r+") as f:
        f.attrs[REPLACES] = "another version"
    assert _rebuilding(out, None) is False  # a rebuild of another version of it: done
    with h5py.File(other, "r+") as f:
        f.attrs[REPLACES] = _identity(out)
    assert _rebuilding(out, None) is True and _rebuilding(out, 2) is False


@pytest.mark.slow
def test_under_torchrun_a_failure_of_rank_0_at_the_merge_ends_every_rank(tmp_path):
    # Rank 0 raised at the merge while the other ranks waited for it at a barrier: until
    # the group's timeout where the group outlives the error (the caller's own), and with
    # gloo's "connection closed by peer" otherwise, never naming rank 0's failure.
    out = tmp_path / "f.h5"
    from tests._merging_ranks import rank_at_a_failing_merge

    _two_ranks(rank_at_a_failing_merge, tmp_path / "init", out, tmp_path)
    ranks = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert ranks[0] == f"OSError: [Errno 5] Input/output error: '{out}'"
    assert ranks[1] == (
        f"StoreError: Rank 0 failed to merge the shards into '{out}' (OSError: [Errno 5] "
        f"Input/output error: '{out}'): its error says why. Every rank's shard is kept: once "
        "that is cured, the same command merges them."
    )


def test_a_rank_that_fails_in_its_shard_tells_the_ranks_then_raises_its_own_error(
    tmp_path, monkeypatch, caplog
):
    # Rank 0 of 2 (its group faked): past the listing's exchange its model fails. It said
    # nothing to the other ranks, which waited for it at the next exchange; it says so there
    # now, and raises its own error even where that exchange fails (the others gone). It
    # logs it at once, not silent until the others' next exchange (the end of their shards).
    import torch.distributed as dist

    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    sent, logged = [], []

    def gathered(into, mine):
        sent.append(mine)
        logged.append([r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR])
        if len(sent) > 1:
            raise RuntimeError("Connection closed by peer")
        into[:] = [mine, mine]

    error = RuntimeError("out of memory\nmore")

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(_runner, "create_backbone", fails)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr("extract._ranks.all_gather_object", gathered)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    _ranks_one_by_one(monkeypatch)
    caplog.set_level(logging.ERROR, logger="extract")
    with pytest.raises(RuntimeError) as raised:
        extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    assert raised.value is error
    assert [said for said, _ in sent] == [None, "RuntimeError: out of memory more"]
    assert logged[0] == [] and len(logged[1]) == 1  # (before the second exchange)
    assert re.match(
        r"Rank 0 failed to extract its shard '.*f\.shard-00000-of-00002\.h5' "
        r"\(RuntimeError: out of memory more\); ",
        logged[1][0],
    )


def test_a_rank_beside_ranks_that_failed_names_the_first_of_them(tmp_path, monkeypatch):
    import torch.distributed as dist

    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    theirs = [("OSError: [Errno 28] No space left on device", None), ("ValueError: x", None)]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr("extract._ranks.all_gather_object", lambda into, mine: into.__setitem__(
        slice(None), [mine, *theirs]))  # fmt: skip
    built = []
    monkeypatch.setattr(_runner, "create_backbone", lambda *a, **k: built.append(1))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    _ranks_one_by_one(monkeypatch)
    out = tmp_path / "f.h5"
    with pytest.raises(StoreError) as raised:
        extract_features(folder, BACKBONE, out, **FAST)
    assert str(raised.value) == (
        f"Rank 1 (and 1 other rank) failed to extract its shard "
        f"{str(shard_path(out, 1, 3))!r} (OSError: [Errno 28] No space left on device): its "
        "error says why. Every rank stops, the rows written so far kept: once that is cured, "
        "the same command resumes."
    )
    assert not built  # stopped at the listing's exchange, before any model


@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_a_rank_told_through_the_store_stops_after_its_batch(monkeypatch, how):
    # Ranks 0 and 1 of 2 (threads, their group faked, its store a HashStore). A rank that
    # failed while the others extracted told them only where they next met, after their
    # shards; one interrupted told them nothing, and they waited for it there. It says so
    # in the store now, which the others look at after each batch: there they meet the
    # failed rank at its exchange (in the store), or stop at once where it was interrupted
    # (and goes nowhere).
    import threading

    import torch.distributed as dist

    from extract import _ranks

    store, real, went = dist.HashStore(), _ranks._every_rank_said, []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(_ranks, "_every_rank_said", lambda value, failure, *args: (
        went.append(failure is not None), real(value, failure, *args))[1])  # fmt: skip
    ranks = [_ranks._ShardStep(Path("f.h5"), 2, rank, store) for rank in (0, 1)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    ranks[0].stop_if_told()  # nothing said: it goes on
    if how == "error":  # (said there, then at its exchange, where it waits for rank 0)
        stops = threading.Thread(target=ranks[1].fail, args=(RuntimeError("out of memory"), 1))
        said, why = "RuntimeError: out of memory", "its error says why"
        cure = "once that is cured, the same command resumes."
    else:
        stops = threading.Thread(target=ranks[1].interrupt, args=(KeyboardInterrupt(),))
        said, why, cure = "KeyboardInterrupt", "it was interrupted", "the same command resumes."
    stops.start()
    while stops.is_alive() and not store.check([f"{ranks[0].key}/n"]):  # (until it has said)
        stops.join(0.001)
    with pytest.raises(StoreError) as raised:
        ranks[0].stop_if_told()
    stops.join()
    assert str(raised.value) == (
        f"Rank 1 failed to extract its shard 'f.shard-00001-of-00002.h5' ({said}): {why}. "
        f"Every rank stops, the rows written so far kept: {cure}"
    )
    # Met at the failed rank's exchange; not waited for where it was interrupted.
    assert sorted(went) == ([False, True] if how == "error" else [])
    assert ranks[0].ended


def test_ranks_meet_in_the_store_each_exchange_under_its_own_key(monkeypatch):
    # Ranks 0 and 1 of 2 (threads, their group faked, its store a HashStore), their key
    # agreed: every exchange after is made in the store, each rank's values in rank order,
    # and a second exchange never takes the first's values (gloo is never used).
    import threading

    import torch.distributed as dist

    from extract import _ranks

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(_ranks, "all_gather_object", lambda *args: pytest.fail("over gloo"))
    store = dist.HashStore()
    ranks = [_ranks._ShardStep(Path("f.h5"), 2, rank, store) for rank in (0, 1)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    theirs = []
    other = threading.Thread(
        target=lambda: theirs.extend(ranks[1].exchange(f"b{k}") for k in range(3))
    )
    other.start()
    mine = [ranks[0].exchange({"a": k}) for k in range(3)]
    other.join()
    assert mine == theirs == [[{"a": k}, f"b{k}"] for k in range(3)]
    assert not any(step.ended for step in ranks)


@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_ranks_meet_at_the_merge_in_the_store(tmp_path, monkeypatch, how):
    # Ranks 0 and 1 of 2 (threads, their group faked, its store a HashStore), their key
    # agreed, at the merge, where rank 0's merge fails, or is interrupted: rank 1 waited
    # for it at gloo's barrier and gather. It meets rank 0 in the store now, and stops
    # naming its error there, or once rank 0 says it was interrupted (as the run does).
    import threading

    import torch.distributed as dist

    from extract import _ranks

    out = tmp_path / "f.h5"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: pytest.fail("over gloo"))
    monkeypatch.setattr(_ranks, "all_gather_object", lambda *args: pytest.fail("over gloo"))
    stop = OSError(5, "Input/output error") if how == "error" else KeyboardInterrupt()
    monkeypatch.setattr(_ranks, "_merge_shards_of", lambda *args: (_ for _ in ()).throw(stop))
    store = dist.HashStore()
    ranks = [_ranks._ShardStep(out, 2, rank, store) for rank in (0, 1)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    ended = {}

    def merge(rank: int) -> None:
        try:
            _ranks._merge_on_rank0(out, rank, 2, False, None, ranks[rank])
        except BaseException as error:  # (a KeyboardInterrupt too)
            if not isinstance(error, Exception):
                ranks[rank].interrupt(error)  # (as the run does)
            ended[rank] = error

    threads = [threading.Thread(target=merge, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)  # (a bound, not a timing: rank 1 leaves at its next look)
    assert not any(thread.is_alive() for thread in threads)
    assert ended[0] is stop
    said, why = (
        ("OSError: [Errno 5] Input/output error", "its error says why")
        if how == "error"
        else ("KeyboardInterrupt", "it was interrupted")
    )
    assert str(ended[1]).startswith(
        f"Rank 0 failed to merge the shards into '{out}' ({said}): {why}."
    )


def test_a_failed_rank_at_its_exchange_leaves_it_once_another_is_interrupted(monkeypatch):
    # Rank 1 of 2 (a thread) fails and goes to the exchange of its failure; rank 0 is
    # interrupted before it looks at the store. Rank 1 waited in gloo's gather (here: a
    # wait that nothing ends), which cannot be left, until the group's timeout. It meets
    # the others in the store now, and leaves once rank 0 says it was interrupted.
    import threading

    import torch.distributed as dist

    from extract import _ranks

    gloo, there, real = threading.Event(), threading.Event(), _ranks._every_rank_said
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(_ranks, "all_gather_object", lambda *args: gloo.wait(30))
    monkeypatch.setattr(_ranks, "_every_rank_said", lambda *args: (there.set(), real(*args))[1])
    store = dist.HashStore()
    ranks = [_ranks._ShardStep(Path("f.h5"), 2, rank, store) for rank in (0, 1)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    failing = threading.Thread(target=ranks[1].fail, args=(RuntimeError("out of memory"), 1))
    failing.start()
    assert there.wait(10)  # rank 1 at its exchange
    ranks[0].interrupt(KeyboardInterrupt())
    failing.join(10)  # (a bound, not a timing: it leaves at its next look)
    gloo.set()
    assert not failing.is_alive()


def test_a_rank_that_never_comes_to_an_exchange_in_the_store_is_named_at_the_timeout():
    # A rank killed outright says nothing: the others wait for it until the group's timeout
    # (the store's), and then name it, as killed or as still at work past that timeout (a
    # rank with more rows left: there the cure is a longer timeout, not the rank).
    from datetime import timedelta

    import torch.distributed as dist

    from extract._gathered import gather_in_store

    store = dist.HashStore()
    store.set_timeout(timedelta(milliseconds=50))
    looked = []
    with pytest.raises(StoreError) as raised:
        gather_in_store(store, "x/1", 0, 3, "mine", lambda: looked.append(1))
    assert str(raised.value) == (
        "Rank 0 waited the group's timeout (0:00:00.050000) for ranks 1, 2 to meet it, which "
        "neither came nor said why: killed, say, or still at work with more rows left than "
        "this rank. Every rank stops, the rows written so far kept: the same command resumes "
        "(a group of your own: give init_process_group a longer timeout)."
    )
    assert looked  # (between its looks: where one said it was interrupted, it left)


def test_a_rank_whose_store_is_gone_at_an_exchange_names_that():
    # The store went with the process that held it (rank 0 killed, outside torchrun) while
    # rank 1 waited for it there: torch's "Broken pipe" came out, which the command line
    # printed as a traceback (gloo's gather had named the lost peer). It is a StoreError
    # now, which says so and how to go on.
    import torch.distributed as dist

    from extract._gathered import gather_in_store

    class Gone(dist.HashStore):
        def check(self, keys):
            raise dist.DistNetworkError("Broken pipe")

    with pytest.raises(StoreError) as raised:
        gather_in_store(Gone(), "x/1", 1, 2, "mine", lambda: None)
    assert str(raised.value) == (
        "Rank 1 lost the group's store while it met the other ranks (DistNetworkError: Broken "
        "pipe): the process that held it (rank 0, or torchrun's launcher) stopped, killed "
        "say. Every rank stops, the rows written so far kept: the same command resumes."
    )

    # Where torchrun's launcher is gone (the store with it), it stops as at a Ctrl-C.
    looks = []

    def stop():  # (the launcher there at the first look, gone at the next)
        looks.append(1)
        if len(looks) > 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gather_in_store(Gone(), "x/2", 1, 2, "mine", stop)
    assert len(looks) == 2


_KILLED = (
    "Rank 0 waited for rank 1 to meet it, which stopped answering: its heartbeat in the "
    "group's store stood still for {} s (killed, say, with kill -9 or by the out-of-memory "
    "killer). Every rank stops, the rows written so far kept: the same command resumes."
)


def _heartbeats() -> list:
    """The heartbeat threads of this process (:func:`extract._gathered.beating`)."""
    import threading

    return [each for each in threading.enumerate() if each.name == "mr2-extract heartbeat"]


def test_a_rank_whose_heartbeat_stops_is_named_at_an_exchange(monkeypatch):
    # Ranks 0, 1 and 2 of 3 (rank 1 a thread), the heartbeat's constants small. Rank 1 beats
    # for a while, then is killed outright (SIGKILL, the out-of-memory killer), saying
    # nothing: rank 0 waited for it at the exchange until the group's timeout (extract's
    # own group: 24 h), gloo's gather having named it at once. Now its heartbeat stands
    # still and rank 0 names it; rank 2, there already, is not listened for.
    import pickle
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from extract import _gathered

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 0.5)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=30))  # (where it is waited out, the test fails)
    store.set("x/1/2", pickle.dumps("rank 2's"))  # (rank 2 came, and never beats)
    killed = threading.Event()

    def rank_1() -> None:
        with _gathered.beating(store, "x/alive", 1):
            killed.wait(0.3)

    thread = threading.Thread(target=rank_1)
    thread.start()
    with _gathered.beating(store, "x/alive", 0), pytest.raises(StoreError) as raised:
        _gathered.gather_in_store(store, "x/1", 0, 3, "mine", lambda: None, "x/alive")
    killed.set()
    thread.join()
    assert str(raised.value) == _KILLED.format(0.5)
    assert not _heartbeats()


class _ReadsStore(torch.distributed.HashStore):
    """A HashStore counting the reads (get) of each key."""

    def __init__(self):
        super().__init__()
        self.reads = {}

    def get(self, key):
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key)


def _ended_identity(**changed) -> tuple[bytes, int]:
    """The identity (:func:`extract._processes.process_identity`) of a process of this
    host that has ended, with ``changed`` fields, and its pid."""
    from extract._processes import _stat, process_identity

    child = subprocess.Popen(["sleep", "0"])
    start = _stat(child.pid)[1]  # (there until it is reaped)
    child.wait()
    identity = dict(json.loads(process_identity()), pid=child.pid, start=start)
    return json.dumps({**identity, **changed}).encode(), child.pid


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_a_rank_tells_its_process_before_its_first_beat():
    # (so that a rank heard beating has told it: the others look for it once)
    import threading
    from datetime import timedelta

    from extract import _gathered
    from extract._processes import process_identity

    class Told(torch.distributed.HashStore):  # (what the heartbeat's thread told, in order)
        def __init__(self):
            super().__init__()
            self.told, self.beat = [], threading.Event()

        def set(self, key, value):
            self.told.append(key)
            return super().set(key, value)

        def add(self, key, value):
            self.told.append(key)
            self.beat.set()
            return super().add(key, value)

    store = Told()
    store.set_timeout(timedelta(seconds=30))
    with _gathered.beating(store, "x/alive", 1):
        assert store.beat.wait(30)
    assert store.told[:2] == ["x/alive/1/process", "x/alive/1"]
    assert store.get("x/alive/1/process") == process_identity()


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_a_rank_whose_process_ended_on_this_host_is_named_at_once(monkeypatch):
    # Rank 1 of 2 beat, then its process (on this host) was killed outright. Rank 0 waited
    # for it until its heartbeat had stood still for 2 minutes (here the silence bound is
    # far longer than the store's timeout, where it fails). Rank 0 sees that its process
    # has ended now, and names it at its first look.
    from datetime import timedelta

    from extract import _gathered

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 600.0)
    store = _ReadsStore()
    store.set_timeout(timedelta(seconds=5))
    identity, pid = _ended_identity()
    store.set("x/alive/1/process", identity)
    store.add("x/alive/1", 3)  # (it beat three times)
    with pytest.raises(StoreError) as raised:
        _gathered.gather_in_store(store, "x/1", 0, 2, "mine", lambda: None, "x/alive")
    assert str(raised.value) == (
        f"Rank 0 waited for rank 1 to meet it, whose process (pid {pid}, on this host) has "
        "ended without a word (killed, say, with kill -9 or by the out-of-memory killer). "
        "Every rank stops, the rows written so far kept: the same command resumes."
    )


@pytest.mark.parametrize("told", ["another host", "no identity"])
def test_a_rank_of_another_host_is_named_once_silent(monkeypatch, told):
    # Rank 1 beat, from another host (its pid, ended here, says nothing of it) or without
    # telling its process (/proc absent, macOS): it is named once its heartbeat stands
    # still for the silence bound, its identity read once however many looks.
    from datetime import timedelta

    from extract import _gathered

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 0.5)
    store = _ReadsStore()
    store.set_timeout(timedelta(seconds=30))
    if told == "another host":
        store.set("x/alive/1/process", _ended_identity(boot="another host's")[0])
    store.add("x/alive/1", 3)
    with pytest.raises(StoreError) as raised:
        _gathered.gather_in_store(store, "x/1", 0, 2, "mine", lambda: None, "x/alive")
    assert str(raised.value) == _KILLED.format(0.5)
    assert store.reads == ({"x/alive/1/process": 1} if told == "another host" else {})


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_a_rank_that_said_why_as_its_process_ended_is_named_for_what_it_said(monkeypatch):
    # Rank 1 said it was interrupted (it comes to no exchange) and its process ended,
    # between rank 0's look for its word and rank 0's look at its process: rank 0 names it
    # for what it said, not as a process that ended without a word.
    from datetime import timedelta

    from extract import _gathered

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 600.0)
    store = torch.distributed.HashStore()
    store.set_timeout(timedelta(seconds=5))
    identity, _ = _ended_identity()
    store.set("x/alive/1/process", identity)
    store.add("x/alive/1", 3)
    looked, ended = [], _gathered.ended

    def looking(identity):  # (its word said as rank 0 looks at its process)
        looked.append(identity)
        return ended(identity)

    def stop():
        if looked:
            raise StoreError("Rank 1 was interrupted.")

    monkeypatch.setattr(_gathered, "ended", looking)
    with pytest.raises(StoreError, match=r"^Rank 1 was interrupted\.$"):
        _gathered.gather_in_store(store, "x/1", 0, 2, "mine", stop, "x/alive")


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
@pytest.mark.parametrize("then", ["ended", "went silent"])
def test_a_rank_that_told_its_failure_then_ended_is_named_for_its_failure(monkeypatch, then):
    # Rank 1 of 2 said in the store that it failed (and would meet rank 0 at the exchange
    # of its failure), then its process was killed (by the out-of-memory killer as it
    # logged, say) before it came there: rank 0, waiting for it there, said that it had
    # ended without a word, or, on another host (its process cannot be looked at from
    # here), that it stopped answering once its heartbeat stood still. It names its
    # failure, and what became of it.
    from datetime import timedelta

    import torch.distributed as dist

    from extract import _gathered, _ranks

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 600.0 if then == "ended" else 0.5)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    ranks = [_ranks._ShardStep(Path("f.h5"), 2, rank, store) for rank in (0, 1)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    ranks[0].alive = f"{ranks[0].key}/alive"
    assert ranks[1]._tell(RuntimeError("out of memory"), meets=True)
    identity, pid = _ended_identity(**({} if then == "ended" else {"boot": "another host's"}))
    store.set(f"{ranks[0].alive}/1/process", identity)
    store.add(f"{ranks[0].alive}/1", 3)  # (it beat three times)
    with pytest.raises(StoreError) as raised:
        ranks[0].stop_if_told()
    became = (
        f"its process (pid {pid}, on this host) ended"
        if then == "ended"
        else "it stopped answering (its heartbeat in the group's store stood still for 0.5 s)"
    )
    assert str(raised.value) == (
        "Rank 1 failed to extract its shard 'f.shard-00001-of-00002.h5' (RuntimeError: out "
        f"of memory), then {became} before the ranks met: its error says why. Every rank "
        "stops, the rows written so far kept: once that is cured, the same command resumes."
    )


def test_a_rank_slow_to_come_but_beating_is_waited_for(monkeypatch):
    # Rank 1 (a thread) comes to the exchange twice the silence bound late, beating all
    # along (a rank with more rows left, say): rank 0 waits for it, as for any rank that
    # answers, and takes its value.
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from extract import _gathered

    monkeypatch.setattr(_gathered, "BEAT_S", 0.02)
    # (50 beats a bound: a thread starved that long by a loaded machine would be named)
    monkeypatch.setattr(_gathered, "SILENCE_S", 1.0)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    theirs = []

    def rank_1() -> None:
        with _gathered.beating(store, "x/alive", 1):
            time.sleep(2 * _gathered.SILENCE_S)  # (at work, its heartbeat's thread beating)
            theirs.extend(
                _gathered.gather_in_store(store, "x/1", 1, 2, "theirs", lambda: None, "x/alive")
            )

    thread = threading.Thread(target=rank_1)
    thread.start()
    with _gathered.beating(store, "x/alive", 0):
        mine = _gathered.gather_in_store(store, "x/1", 0, 2, "mine", lambda: None, "x/alive")
    thread.join()
    assert mine == theirs == ["mine", "theirs"]
    assert int(store.add("x/alive/1", 0)) > 2  # (it beat while rank 0 waited)


@pytest.mark.parametrize("how", ["returns", "error", "interrupt"])
def test_a_rank_beats_in_the_store_from_the_run_s_key_to_its_end(tmp_path, monkeypatch, how):
    # Rank 0 of 2, its group faked (rank 1 at the gloo exchange that agrees on the run's
    # key, absent after), its store a HashStore. Once the key is agreed the rank beats in
    # the store, from a thread that ends with the run however it ends: returning (every
    # rank found the store complete), with an error (said to the others at an exchange,
    # where rank 1, never beating, is named), or interrupted.
    from datetime import timedelta

    import torch.distributed as dist

    from extract import _gathered, _ranks, _runner

    monkeypatch.setattr(_gathered, "BEAT_S", 0.05)
    monkeypatch.setattr(_gathered, "SILENCE_S", 0.5)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    monkeypatch.setattr(_runner, "_ranks_group", lambda: contextlib.nullcontext(store))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(_ranks, "all_gather_object", lambda into, mine: into.__setitem__(
        slice(None), [mine, mine]))  # fmt: skip
    monkeypatch.setattr(_runner, "_all_ranks_failures", lambda failed, step: (0, []))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    stop = {
        "returns": None,
        "error": RuntimeError("out of memory"),
        "interrupt": KeyboardInterrupt(),
    }[how]
    beating = []

    def shard(*args):
        beating.append(len(_heartbeats()))
        if stop is not None:
            raise stop
        return None  # (every rank found the merged store complete)

    monkeypatch.setattr(_runner, "_extract_shard", shard)
    out = tmp_path / "f.h5"
    if stop is None:
        assert extract_features(tmp_path / "data", BACKBONE, out, **FAST) == out
    else:
        with pytest.raises(type(stop)) as raised:
            extract_features(tmp_path / "data", BACKBONE, out, **FAST)
        assert raised.value is stop
    assert beating == [1]
    assert not _heartbeats()


class _DictStore:
    """A group's key-value store in a dict, recording its look-ups."""

    def __init__(self):
        self.keys, self.looks = {}, []

    def set(self, key, value):
        self.keys[key] = value.encode()

    def get(self, key):
        self.looks.append("get")
        return self.keys[key]

    def check(self, keys):
        self.looks.append("check")
        return all(key in self.keys for key in keys)

    def add(self, key, n):
        self.keys[key] = str(int(self.keys.get(key, b"0")) + n).encode()
        return int(self.keys[key])


def _three_ranks(monkeypatch, interrupted_in_exchange=False):
    """Ranks 0 to 2 of 3 sharing a :class:`_DictStore`, their key agreed, their group
    faked: the exchange stands in for each one's collective, and records the ranks that
    go there (a failing rank's raises a KeyboardInterrupt where
    ``interrupted_in_exchange``); every rank but 1 comes there without a failure."""
    import torch.distributed as dist

    from extract import _ranks

    store, went = _DictStore(), []

    def exchange(value, failure, world_size, gather=None):
        went.append(failure is not None)
        if failure is not None and interrupted_in_exchange:
            raise KeyboardInterrupt
        return [value] * world_size, [(1, "RuntimeError: out of memory")]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(_ranks, "_every_rank_said", exchange)
    ranks = [_ranks._ShardStep(Path("f.h5"), 3, rank, store) for rank in range(3)]
    for step in ranks:
        step.agree_on_key(ranks[0].key)
    return ranks, store, went


@pytest.mark.parametrize("first", ["fails", "interrupted"])
def test_a_rank_interrupted_beside_one_failing_is_not_waited_for(monkeypatch, first):
    # Ranks 0 to 2 of 3: rank 1 fails (it meets the others at its exchange) while rank 2 is
    # interrupted (it goes nowhere). Both wrote the run's one key in the store, the last
    # word kept: where rank 1's was, rank 0 went to the exchange and waited there for rank
    # 2, which never came (a group the caller keeps: its whole timeout). Each rank says so
    # under its own key now, and rank 0, finding one interrupted, goes to no exchange.
    ranks, store, went = _three_ranks(monkeypatch)
    stop = [
        lambda: ranks[1].fail(RuntimeError("out of memory"), 1),
        lambda: ranks[2].interrupt(KeyboardInterrupt()),
    ]
    for each in stop if first == "fails" else stop[::-1]:
        each()
    assert went == [True] * (first == "fails")  # (rank 1 at its exchange, where it went)
    went.clear()
    store.looks.clear()
    with pytest.raises(StoreError) as raised:
        ranks[0].stop_if_told()
    assert str(raised.value) == (
        "Rank 2 failed to extract its shard 'f.shard-00002-of-00003.h5' (KeyboardInterrupt): "
        "it was interrupted. Every rank stops, the rows written so far kept: the same command "
        "resumes."
    )
    assert went == []  # rank 0 went to no exchange
    assert ranks[0].ended
    # (the exchange looks first too, and goes nowhere)
    with pytest.raises(StoreError, match="Rank 2 failed .* it was interrupted"):
        ranks[0].exchange(None)
    assert went == []


def test_a_rank_told_of_a_failure_alone_meets_it_at_the_exchange(monkeypatch):
    # Rank 1 of 3 fails: rank 0 looks once per batch (one check of the store) until then,
    # then meets it at the exchange, where it is told rank 1's error.
    ranks, store, went = _three_ranks(monkeypatch)
    ranks[0].stop_if_told()
    assert store.looks == ["check"]  # nothing said: one look, nothing read
    ranks[1].fail(RuntimeError("out of memory"), 1)
    with pytest.raises(StoreError) as raised:
        ranks[0].stop_if_told()
    assert str(raised.value) == (
        "Rank 1 failed to extract its shard 'f.shard-00001-of-00003.h5' (RuntimeError: out of "
        "memory): its error says why. Every rank stops, the rows written so far kept: once "
        "that is cured, the same command resumes."
    )
    assert went == [True, False]  # rank 1's exchange, then rank 0's


def test_a_rank_interrupted_in_its_failure_s_exchange_is_not_waited_for(monkeypatch):
    # Rank 1 of 3 fails and, at its exchange, is interrupted (Ctrl-C): the KeyboardInterrupt
    # left it with its word that it meets the others there, where they waited for it. It
    # takes that back now: the others stop, naming its interrupt, going nowhere.
    ranks, store, went = _three_ranks(monkeypatch, interrupted_in_exchange=True)
    with pytest.raises(KeyboardInterrupt):
        ranks[1].fail(RuntimeError("out of memory"), 1)
    with pytest.raises(StoreError) as raised:
        ranks[0].stop_if_told()
    assert str(raised.value) == (
        "Rank 1 failed to extract its shard 'f.shard-00001-of-00003.h5' (KeyboardInterrupt): "
        "it was interrupted. Every rank stops, the rows written so far kept: the same command "
        "resumes."
    )
    assert went == [True]  # rank 1's exchange alone


def test_a_rank_failing_after_one_interrupted_goes_to_no_exchange(monkeypatch, caplog):
    # Rank 2 of 3 is interrupted, then rank 1 fails: rank 1 went to its exchange, where
    # neither rank 2 (gone) nor rank 0 (stopped, naming rank 2) came, and waited there (a
    # group the caller keeps: its whole timeout). It looks first now, and goes nowhere,
    # and its log line says so (it said it would stop with the others after their batch).
    ranks, store, went = _three_ranks(monkeypatch)
    ranks[2].interrupt(KeyboardInterrupt())
    with caplog.at_level(logging.ERROR, logger="extract._runner"):
        ranks[1].fail(RuntimeError("out of memory"), 1)  # (its caller raises the error)
    assert went == []
    assert "rank 2 was interrupted: it stops at once" in caplog.text
    assert "stop after the batch" not in caplog.text
    with pytest.raises(StoreError, match="Rank 2 failed .* it was interrupted"):
        ranks[0].stop_if_told()
    assert went == []


def test_a_rank_whose_launcher_is_gone_leaves_its_store_alone(monkeypatch):
    # torchrun's launcher killed outright takes its store with it: a rank that looked there
    # after each batch, or told it of its interrupt, had torch log a stack trace for it.
    import torch.distributed as dist

    from extract import _launcher
    from extract._ranks import _ShardStep

    looked = []

    class Store:
        def check(self, keys):
            looked.append("check")
            return False

        def set(self, key, value):
            looked.append("set")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setattr(_launcher, "_first_seen", (os.getpid(), os.getppid()))
    step = _ShardStep(Path("f.h5"), 2, 1, Store())
    step.agree_on_key(step.key)
    step.stop_if_told()
    assert looked == ["check"]  # (the launcher there: it looks)
    monkeypatch.setattr(_launcher, "_first_seen", (os.getpid(), os.getppid() + 1))  # gone
    step.stop_if_told()
    step.interrupt(KeyboardInterrupt())
    assert looked == ["check"]
    # Its exchanges are in that store: it stops there as at a Ctrl-C (as its watch of the
    # launcher stops it), looking nowhere.
    step.ended = False
    with pytest.raises(KeyboardInterrupt):
        step.exchange(None)
    assert looked == ["check"]


@pytest.mark.parametrize("where", ["store", "shards"])
def test_a_rank_that_fails_checking_the_stores_is_named_as_such(tmp_path, monkeypatch, where):
    # Rank 1 of 2 (its group faked) fails in the check of the merged store (a ProvenanceError
    # of its read alone), or of the shards to be resumed; rank 0 takes what rank 1 said at
    # each exchange. It named rank 1 as failing "to extract its shard".
    import torch.distributed as dist

    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    if where == "store":
        extract_features(folder, BACKBONE, out, **FAST)
        checked, doing = "_is_complete", f"to check the feature store {str(out)!r}"
    else:  # a killed run's shards
        _killed_at_2_ranks(monkeypatch, folder, out, **dict(FAST, batch_size=2))
        checked, doing = "_check_other_shard", f"to check the shards of {str(out)!r} to be resumed"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    _ranks_one_by_one(monkeypatch)
    sent = []
    monkeypatch.setattr("extract._ranks.all_gather_object", lambda into, mine: (
        sent.append(mine), into.__setitem__(slice(None), [mine, mine])))  # fmt: skip
    real = getattr(_runner, checked)

    def refused(*args, **kwargs):
        raise ProvenanceError("rank 1 read it otherwise")

    with monkeypatch.context() as patch:
        patch.setenv("RANK", "1")
        patch.setattr(_runner, checked, refused)
        with pytest.raises(ProvenanceError, match="rank 1 read it otherwise"):
            extract_features(folder, BACKBONE, out, **FAST)
    assert getattr(_runner, checked) is real
    theirs = iter(sent)
    monkeypatch.setattr("extract._ranks.all_gather_object", lambda into, mine: into.__setitem__(
        slice(None), [mine, next(theirs)]))  # fmt: skip
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(StoreError) as raised:
        extract_features(folder, BACKBONE, out, **FAST)
    assert str(raised.value) == (
        f"Rank 1 failed {doing} (ProvenanceError: rank 1 read it otherwise): its error says "
        "why. Every rank stops, the rows written so far kept: once that is cured, the same "
        "command resumes."
    )


@pytest.mark.slow
@pytest.mark.parametrize("group", ["caller's", "own"])
def test_under_torchrun_a_rank_that_fails_in_its_shard_ends_every_rank(tmp_path, group):
    # Rank 1 raised while extracting its shard, its process alive: rank 0 waited for it at
    # the ranks' next exchange until the group's timeout where the group outlives the
    # error (the caller's own), and met gloo's "connection closed by peer" otherwise,
    # never naming rank 1's failure.
    import socket

    from tests._failing_ranks import FAILING, rank_beside_a_failing_rank

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    ports = None
    if group == "own":  # torchrun's store, which each run's own group joins: one a run
        with socket.socket() as one, socket.socket() as other:
            one.bind(("127.0.0.1", 0))
            other.bind(("127.0.0.1", 0))
            ports = [one.getsockname()[1], other.getsockname()[1]]
    _two_ranks(rank_beside_a_failing_rank, folder, tmp_path, ports)
    for where in FAILING:
        said = [(tmp_path / f"{where}-rank{r}.txt").read_text() for r in range(2)]
        assert said[1] == f"RuntimeError: rank 1 cannot {where}\nsecond line"  # its own error
        shard = shard_path(tmp_path / f"{where}.h5", 1, 2)
        assert said[0] == (
            f"StoreError: Rank 1 failed to extract its shard {str(shard)!r} (RuntimeError: "
            f"rank 1 cannot {where} second line): its error says why. Every rank stops, the "
            "rows written so far kept: once that is cured, the same command resumes."
        )


def test_an_exchange_returns_once_gloo_has_let_go_of_its_tensors(monkeypatch):
    # A gloo worker let go of an exchange's tensors after it had returned, their Python
    # objects freed already: it needed the GIL to free them, which older torch (2.5) holds
    # while it destroys the group, joining that worker. A rank that raised at once and
    # left its group (extract's own, or a caller's) hung in destroy_process_group. Here
    # the worker is late on purpose: it holds a view of each tensor a little longer.
    import threading
    import time

    import torch.distributed as dist

    from extract._ranks import _every_rank_said

    real, late = dist.all_gather, []

    def all_gather(outputs, tensor, *args, **kwargs):
        work = real(outputs, tensor, *args, **kwargs)
        views = [each.view(-1) for each in (*outputs, tensor)]  # (held as gloo would)

        def let_go():
            time.sleep(0.2)
            late.append("let go")  # (before the views go: the exchange may return then)
            views.clear()

        threading.Thread(target=let_go).start()
        late.append("held")
        return work

    monkeypatch.setattr(dist, "all_gather", all_gather)
    # (torch's all_gather_object calls it here)
    monkeypatch.setattr(dist.distributed_c10d, "all_gather", all_gather)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        values, failed = _every_rank_said({"n": 3}, RuntimeError("no memory"), 1)
        assert late.count("held") == late.count("let go") > 0  # (every view let go)
    finally:
        dist.destroy_process_group()
    assert values == [{"n": 3}]
    assert failed == [(0, "RuntimeError: no memory")]


def test_an_exchange_in_a_group_without_gloo_is_torch_s_own(monkeypatch):
    # A caller's NCCL group takes no CPU tensors: there the exchange is torch's
    # all_gather_object (on the group's device), as it was; the wait for gloo's worker is
    # gloo's alone.
    import torch.distributed as dist

    from extract._gathered import all_gather_object

    gathered = []
    monkeypatch.setattr(dist, "get_backend", lambda *args: "nccl")
    monkeypatch.setattr(dist, "all_gather", lambda *args: pytest.fail("gathered on the CPU"))
    monkeypatch.setattr(dist, "all_gather_object", lambda into, obj: (
        gathered.append(obj), into.__setitem__(slice(None), [obj])))  # fmt: skip
    into = [None]
    all_gather_object(into, ("said", 3))
    assert gathered == [("said", 3)] and into == [("said", 3)]


# (a group the caller keeps has a store where torch gives one; elsewhere the ranks meet in
# gloo alone)
_with_group_store = pytest.mark.skipif(
    not hasattr(torch.distributed.ProcessGroup, "get_group_store"),
    reason="torch gives no ProcessGroup.get_group_store",
)


@pytest.mark.slow
# (a group the caller keeps is told through its store where torch gives it; elsewhere
# the ranks meet at the end of their shards)
@_with_group_store
@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_under_torchrun_a_rank_that_stops_mid_shard_stops_the_others_at_their_next_batch(
    tmp_path, how
):
    # Rank 1 failed at its first batch, in a group the caller keeps: rank 0 heard of it only
    # at the end of its shard, having extracted every row (or waited for rank 1 there until
    # the group's timeout, when its shard took longer); a KeyboardInterrupt of rank 1 alone
    # was not told at all, and rank 0 waited for it until the timeout. Now rank 0 stops
    # after the batch it is at, naming rank 1, its rows kept, and the same run resumes.
    from tests._failing_ranks import rank_beside_a_rank_stopping_mid_shard

    folder = make_image_folder(tmp_path / "data", n_per_class=12, special=False)
    _two_ranks(rank_beside_a_rank_stopping_mid_shard, folder, tmp_path, how)
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    own = "RuntimeError: rank 1's device failed" if how == "error" else "KeyboardInterrupt"
    why = (
        "its error says why. Every rank stops, the rows written so far kept: once that is "
        "cured, the same command resumes."
        if how == "error"
        else "it was interrupted. Every rank stops, the rows written so far kept: the same "
        "command resumes."
    )
    shard = shard_path(tmp_path / "f.h5", 1, 2)
    assert said[1]["stopped"] == own
    assert said[0]["stopped"] == (
        f"StoreError: Rank 1 failed to extract its shard {str(shard)!r} ({own}): {why}"
    )
    # Rank 0 stopped after its third batch (held until rank 1 had stopped), not its 12th.
    assert [each["done"] for each in said] == [3, 0]
    assert [each["resumed"] for each in said] == ["returned", "returned"]
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert (f["status"][:] == DONE).all() and len(f["status"]) == 24


@pytest.mark.slow
@_with_group_store
@pytest.mark.parametrize("where", ["listing", "batch"])
def test_under_torchrun_a_failed_rank_at_its_exchange_leaves_it_once_another_is_interrupted(
    tmp_path, where
):
    # Rank 1 failed (at its first batch; or listing the images, before the ranks had agreed
    # on the run's key in the store) and went to the exchange of its failure; rank 0 was
    # interrupted then, before it looked at the store (or with nothing to tell it in). Rank
    # 1 waited in gloo's gather, which nothing can wake, until the group's timeout (here 60
    # s; extract's own group: 24 h). The ranks agree on the key as the run begins and meet
    # in the store now, and rank 1 leaves once rank 0 says so.
    from tests._failing_ranks import rank_interrupted_beside_a_failed_rank_s_exchange

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    # (from rank 1's failure on, a third of the group's timeout: where rank 1 waits that
    # out, the test fails)
    since = tmp_path / "rank1-failed"
    target = rank_interrupted_beside_a_failed_rank_s_exchange
    _two_ranks(target, folder, tmp_path, where, guard=20, since=since)
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert said == ["KeyboardInterrupt", f"RuntimeError: rank 1 failed at its {where}"]


@pytest.mark.slow
@_with_group_store
@pytest.mark.parametrize("where", ["count", "merge"])
def test_under_torchrun_a_rank_interrupted_at_the_merge_stops_the_others_there(tmp_path, where):
    # Rank 0 was interrupted at the merge: once the ranks had told their failures' count
    # (then rank 1 waited at the shards' gloo barrier), or while it merged (rank 1 waited
    # for its outcome in gloo's gather); either until the group's timeout (here 60 s;
    # extract's own group: 24 h). The ranks meet in the store there too now, where rank 0
    # says it was interrupted, and rank 1 stops naming it.
    from tests._failing_ranks import rank_interrupted_at_the_merge

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    since = tmp_path / "rank0-interrupted"  # (where rank 1 waits a third of the timeout)
    target = rank_interrupted_at_the_merge
    _two_ranks(target, folder, tmp_path, where, guard=20, since=since)
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    doing = {
        "count": f"to extract its shard {os.fspath(shard_path(tmp_path / 'f.h5', 0, 2))!r}",
        "merge": f"to merge the shards into {os.fspath(tmp_path / 'f.h5')!r}",
    }[where]
    assert said == [
        "KeyboardInterrupt",
        f"StoreError: Rank 0 failed {doing} (KeyboardInterrupt): it was interrupted. Every "
        "rank stops, the rows written so far kept: the same command resumes.",
    ]


@pytest.mark.slow
@_with_group_store
def test_under_torchrun_a_rank_killed_outright_is_named_by_the_rank_waiting_for_it(tmp_path):
    # Rank 1 was killed outright (SIGKILL, the out-of-memory killer) at its first batch,
    # saying nothing, in a group the caller keeps (outside torchrun, whose launcher ends
    # the others): rank 0 waited for it at the end of its shard until the group's timeout
    # (here 10 minutes; extract's own group: 24 h), then until its heartbeat in the store
    # had stood still for 2 minutes (here 10 as well). On the same host, rank 0 sees that
    # its process has ended, and names it at once.
    from tests._failing_ranks import rank_beside_a_rank_killed_outright

    said, pid = _beside_rank_1_killed(rank_beside_a_rank_killed_outright, tmp_path)
    assert said == (
        f"StoreError: Rank 0 waited for rank 1 to meet it, whose process (pid {pid}, on this "
        "host) has ended without a word (killed, say, with kill -9 or by the out-of-memory "
        "killer). Every rank stops, the rows written so far kept: the same command resumes."
    )


@pytest.mark.slow
@_with_group_store
def test_under_torchrun_a_rank_killed_after_telling_its_failure_is_named_for_it(tmp_path):
    # Rank 1 failed at its first batch, said so in the store, and was killed outright
    # (SIGKILL, the out-of-memory killer) as it logged its failure, before the exchange
    # where it meets the others: rank 0, waiting for it there, said that its process had
    # ended without a word. It names rank 1's failure, and that its process then ended.
    from tests._failing_ranks import rank_beside_a_rank_killed_after_its_failure

    said, pid = _beside_rank_1_killed(rank_beside_a_rank_killed_after_its_failure, tmp_path)
    shard = os.fspath(shard_path(tmp_path / "f.h5", 1, 2))
    assert said == (
        f"StoreError: Rank 1 failed to extract its shard {shard!r} (RuntimeError: rank 1's "
        f"device failed), then its process (pid {pid}, on this host) ended before the ranks "
        "met: its error says why. Every rank stops, the rows written so far kept: once that "
        "is cured, the same command resumes."
    )


def _beside_rank_1_killed(target, tmp_path: Path) -> tuple[str, int]:
    """Run ``target(rank, folder, tmp_path)`` as ranks 0 and 1 extracting an image folder,
    where rank 1 is killed outright (SIGKILL) at its first batch: what rank 0 ended with
    (``rank0.txt``), and rank 1's pid. Fails the test where rank 0 still waits 90 s on."""
    import time

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    ranks = _start_ranks(target, folder, tmp_path)
    said = tmp_path / "rank0.txt"
    try:
        ranks.processes[1].join(120)  # (killed at its first batch)
        assert ranks.processes[1].exitcode == -signal.SIGKILL
        # (a bound far below the group's timeout and the silence, above rank 0's shard on a
        # loaded machine)
        deadline = time.monotonic() + 90
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.kill()
    assert said.exists(), "rank 0 still waited for rank 1, killed 90 s before"
    return said.read_text(), ranks.processes[1].pid


def _start_ranks(target, *args) -> torch.multiprocessing.ProcessContext:
    """Start ``target(rank, *args)`` as ranks 0 and 1 of two processes, each on one torch
    thread, under this process's variables. A forkserver that has imported this package's
    rank functions (torch, timm and extract with them) forks them: started afresh, each
    took about 5 s to import those, half of such a test's time."""
    import multiprocessing

    from tests._failing_ranks import in_env

    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["tests._failing_ranks", "tests._merging_ranks"]
    )
    args = (dict(os.environ), target, *args)
    return torch.multiprocessing.start_processes(
        in_env, args=args, nprocs=2, join=False, start_method="forkserver"
    )


def _two_ranks(target, *args, guard: int = 120, since: Path | None = None) -> None:
    """Run ``target(rank, *args)`` as ranks 0 and 1 of two processes; fail the test where
    they still run after ``guard`` seconds (one waits for the other), counted from when the
    file ``since`` exists where it is given (the ranks at the point the test is about, their
    start however slow; counted anyway from 120 s on)."""
    ranks = _start_ranks(target, *args)
    try:
        left, waited = guard, 0
        while left > 0:
            if ranks.join(timeout=1):
                return
            waited += 1
            left -= since is None or since.exists() or waited > 120
        pytest.fail(f"the ranks still ran after {guard} s: one waited for the other")
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.kill()


@pytest.mark.slow
def test_ranks_that_find_the_merged_store_complete_and_not_stop_alike(tmp_path):
    # Each rank decided alone: rank 0, finding it complete, returned; rank 1 went on and
    # waited for it at the merge until the group's timeout (a group the caller keeps).
    from tests._failing_ranks import rank_finding_the_store_complete_or_not

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    before = out.read_bytes()
    _two_ranks(rank_finding_the_store_complete_or_not, folder, tmp_path)
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert said == 2 * [
        f"StoreError: The ranks read the feature store {str(out)!r} differently: rank 0 "
        "found it complete, rank 1 not. It, or its images, changed while they read it. "
        "Every rank stops before any work; run again once it no longer changes."
    ]
    assert out.read_bytes() == before and not list(tmp_path.glob("f.shard-*"))


def test_under_torchrun_a_complete_store_is_reused_or_refused_before_any_work(
    store, folder, tmp_path, monkeypatch, caplog
):
    # Each rank extracted its shard and only the merge met `out`: with the shards gone, or
    # at another number of ranks, the whole source was extracted again; a store made
    # differently was refused only at the merge, after all the work.
    caplog.set_level(logging.INFO, logger="extract")
    out = tmp_path / "f.h5"
    shutil.copy(store, out)
    monkeypatch.setenv("WORLD_SIZE", "3")
    _ranks_one_by_one(monkeypatch)
    for rank in (1, 0):  # rank 0 alone says so
        monkeypatch.setenv("RANK", str(rank))
        caplog.clear()
        assert extract_features(folder, BACKBONE, out, **FAST) == out
        assert caplog.text.count("Reused the complete feature store") == (rank == 0)
    assert re.search(r"\d+ recorded as failed \(.+\), which --retry-failed", caplog.text)
    assert not list(tmp_path.glob("*.shard-*"))  # nothing extracted, nothing to merge
    with pytest.raises(ProvenanceError, match="normalize: file has False, request has True"):
        extract_features(folder, BACKBONE, out, normalize=True, **FAST)
    assert not list(tmp_path.glob("*.shard-*"))
    # In a read-only folder every rank reads it too (its shard's path was refused first).
    _not_writable(monkeypatch, tmp_path)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert extract_features(folder, BACKBONE, out, **FAST) == out
    with pytest.raises(StoreError, match="Cannot write the output .*shard.* no permission"):
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
def test_shards_made_differently_are_refused_in_any_order(folder, tmp_path, order):
    # Each shard was compared with the lowest rank opened so far: given in descending
    # order, no shard was compared with another, and features of two settings merged.
    out = tmp_path / "merged.h5"
    shards = [
        extract_features(folder, BACKBONE, out, rank=r, world_size=2, normalize=r == 1, **FAST)
        for r in range(2)
    ]
    with pytest.raises(ProvenanceError, match="normalize"):
        merge_shards([shards[r] for r in order], out)
    assert not out.exists()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_tensor_decoding_matches_pil(store, folder, tmp_path, device):
    # A worker process ships the undecoded JPEG bytes to the main process. On CUDA they are
    # decoded by nvJPEG, which must fail the corrupt and truncated files PIL fails (and
    # decode on the CPU those it refuses but PIL reads), with features in bfloat16.
    tensor_fast = FAST | dict(num_workers=1, device=device)
    out = extract_features(folder, BACKBONE, tmp_path / "t.h5", decode="tensor", **tensor_fast)
    pil, tensor = load_features(store, in_memory=True), load_features(out, in_memory=True)
    assert tensor.metadata["preprocessing"]["decode"] == "tensor"
    assert [p for p, _ in tensor.failures] == [p for p, _ in pil.failures]
    # Same images and network; only the resize implementation differs.
    np.testing.assert_allclose(
        tensor.features, pil.features, atol=0.05 * np.abs(pil.features).max()
    )


def test_float16_and_normalize(folder, tmp_path):
    out = extract_features(
        folder, BACKBONE, tmp_path / "h.h5", dtype="float16", normalize=True, **FAST
    )
    loaded = load_features(out, in_memory=True)
    assert loaded.features.dtype == np.float16
    np.testing.assert_allclose(np.linalg.norm(loaded.features.astype(float), axis=1), 1, atol=2e-3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtype="float64"), "'dtype' parameter"),
        (dict(decode="gpu"), "'decode' parameter must be one of .* Got 'gpu' instead.$"),
        (dict(batch_size=0), "'batch_size' parameter"),
        # 2.5 failed once the store was created; True passed as 1.
        (dict(batch_size=2.5), "'batch_size' parameter must be an int >= 1"),
        (dict(batch_size=True), "'batch_size' parameter must be an int >= 1"),
        (
            dict(rank=2, world_size=2),
            r"'rank' parameter must be an int in \[0, world_size\). Got rank=2 with "
            "world_size=2 instead.$",
        ),
        (dict(max_items=0), "'max_items' parameter must be an int >= 1"),
        # 32.5 failed deep inside torch; "no" was taken as true.
        (dict(image_size=32.5), "'image_size' parameter must be an int >= 1"),
        (dict(normalize="no"), "'normalize' parameter must be True or False. Got 'no' instead.$"),
        # These failed once the model was built: naming the shard, writing the provenance.
        (dict(rank=0.5, world_size=2), "'rank' parameter must be an int"),
        (dict(rank=0, world_size=2.0), "'world_size' parameter must be an int"),
        # These were taken as one rank (a whole store written) and as rank 0.
        (dict(rank=0, world_size=0), "'world_size' parameter must be an int >= 1"),
        (dict(world_size=0), "'world_size' parameter must be an int >= 1"),
        (dict(rank=False, world_size=2), "'rank' parameter must be an int"),
        (dict(dtype=np.dtype("float16")), "'dtype' parameter"),
    ],
)
def test_invalid_arguments(folder, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        extract_features(folder, BACKBONE, tmp_path / "x.h5", **(FAST | kwargs))
    assert not (tmp_path / "x.h5").exists()
    assert not list(tmp_path.iterdir())


def test_a_rank_beyond_torchrun_s_world_size_is_named_as_its_variables(
    folder, tmp_path, monkeypatch
):
    # It was refused as "rank must be in [0, world_size)", parameters the call had not given.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    message = (
        r"^The RANK environment variable must be an int in \[0, WORLD_SIZE\). Got RANK=2 "
        "with WORLD_SIZE=2 instead.$"
    )
    with pytest.raises(ValueError, match=message):
        extract_features(folder, BACKBONE, tmp_path / "x.h5", **FAST)
    assert not list(tmp_path.iterdir())


def test_a_rank_exported_without_a_world_size_says_the_latter_is_unset(
    folder, tmp_path, monkeypatch
):
    # `export RANK=$SLURM_PROCID` alone: "Got RANK=1 with WORLD_SIZE=1", a value nobody set.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    message = r"Got RANK=1 with WORLD_SIZE unset \(1 process\) instead; set WORLD_SIZE to"
    with pytest.raises(ValueError, match=message):
        extract_features(folder, BACKBONE, tmp_path / "x.h5", **FAST)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "env, said",
    [
        (dict(RANK=""), "RANK environment variable must be an int >= 0 .* Got RANK='' instead"),
        (dict(RANK="one"), "Got RANK='one' instead; unset it to run in one process"),
        (dict(RANK="-1", WORLD_SIZE="2"), "RANK environment variable .* Got RANK='-1'"),
        (dict(WORLD_SIZE="0"), "WORLD_SIZE environment variable must be an int >= 1 .* Got "),
    ],
)
def test_torchrun_s_variables_that_are_no_whole_numbers_are_named(
    folder, tmp_path, monkeypatch, env, said
):
    # `export RANK=$SLURM_PROCID` with the latter unset: "invalid literal for int() with
    # base 10: ''", naming no variable.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=said):
        extract_features(folder, BACKBONE, tmp_path / "x.h5", **FAST)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["overwrite", "retry_failed", "progress"])
def test_a_flag_that_is_not_a_bool_is_refused_before_any_work(store, folder, tmp_path, name):
    # overwrite="no" (a config file's text) was taken as true: the store was deleted and
    # extracted anew.
    out = Path(shutil.copy(store, tmp_path / "f.h5"))
    before = out.stat().st_mtime_ns
    message = f"The '{name}' parameter must be True or False. Got 'no' instead.$"
    with pytest.raises(ValueError, match=message):
        extract_features(folder, BACKBONE, out, **(FAST | {name: "no"}))
    assert out.stat().st_mtime_ns == before


def test_an_extraction_leaves_torch_s_global_random_stream_as_it_was(folder, tmp_path):
    # The loader drew its workers' seed from the global generator: a script seeded before
    # extracting drew other numbers after a run than after a reuse of its store.
    torch.manual_seed(0)
    extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    after = torch.rand(3)
    torch.manual_seed(0)
    torch.testing.assert_close(after, torch.rand(3), rtol=0, atol=0)


def test_numpy_integers_are_taken_for_every_count(folder, tmp_path):
    # image_size failed in timm with a bare AssertionError, num_workers was refused, and a
    # NumPy rank failed in the store's JSON provenance once the model was built.
    counts = dict(batch_size=4, num_workers=0, image_size=32, max_items=3)
    fast = FAST | {name: np.int64(value) for name, value in counts.items()}
    path = extract_features(
        folder, BACKBONE, tmp_path / "x.h5", rank=np.int64(1), world_size=np.int64(2), **fast
    )
    with load_features(path) as store:
        assert store.paths == ["cat/001.jpg"]  # row 1 of the first 3, rank 1 of 2
        assert (store.metadata["shard_rank"], store.metadata["shard_world_size"]) == (1, 2)


@pytest.mark.parametrize(
    "counts, paths",
    [
        (dict(max_items=1), ["cat/000.png"]),
        (dict(n_per_class=1), ["cat/000.png", "dog/000.png"]),
        (dict(n_per_class=1, max_items=1, batch_size=1), ["cat/000.png"]),
    ],
)
def test_counts_of_one_are_taken(folder, tmp_path, counts, paths):
    path = extract_features(folder, BACKBONE, tmp_path / "x.h5", **(FAST | counts))
    with load_features(path) as store:
        assert store.paths == paths


def test_numpy_booleans_are_taken_for_every_flag(folder, tmp_path):
    # (np.bool_ is what a flag read from an array or a DataFrame is)
    flags = dict(normalize=True, overwrite=False, retry_failed=False, progress=False)
    fast = FAST | {name: np.bool_(value) for name, value in flags.items()}
    with load_features(extract_features(folder, BACKBONE, tmp_path / "x.h5", **fast)) as store:
        assert store.metadata["normalize"] is True
        np.testing.assert_allclose(np.linalg.norm(store.features[:], axis=1), 1, rtol=1e-5)


def test_tiny_open_clip_extraction(folder, tmp_path):
    pytest.importorskip("open_clip")
    from extract._testing import register_tiny_open_clip

    name = register_tiny_open_clip(tmp_path)
    out = extract_features(
        folder, f"open_clip:{name}@random", tmp_path / "c.h5", normalize=True, **FAST
    )
    loaded = load_features(out, in_memory=True)
    assert loaded.features.shape == (12, 32) and loaded.metadata["normalize"] is True
    assert loaded.metadata["backbone"] == f"open_clip:{name}"
    assert "MaybeConvertMode" in loaded.metadata["preprocessing"]["transform"]
    np.testing.assert_allclose(np.linalg.norm(loaded.features, axis=1), 1, rtol=1e-5)


def test_a_store_written_to_the_home_folder_with_a_tilde_lands_there(folder, tmp_path, monkeypatch):
    # The source's ~ is the home folder; the output's made a folder named '~' where the
    # run started and wrote the store in it.
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    out = extract_features(folder, BACKBONE, "~/f.h5", **FAST)
    assert out == tmp_path / "f.h5" and out.is_file()
    assert not os.path.lexists("~")
    for name in ("~/f.h5", b"~/f.h5"):  # (and read back under that name, as bytes too)
        with load_features(name) as loaded:
            assert len(loaded.labels) + len(loaded.failures) == len(image_folder(folder))


def test_leftover_temporary_file_from_a_killed_creation_is_replaced(folder, tmp_path):
    # A creation killed at any point leaves an HDF5 file (h5py writes the signature when it
    # opens it); a .tmp of other bytes is a user's file, refused (test above).
    out = tmp_path / "f.h5"
    _hdf5(tmp_path / "f.h5.tmp", features=np.zeros((3, 2)))
    extract_features(folder, BACKBONE, out, max_items=4, **FAST)
    assert not (tmp_path / "f.h5.tmp").exists()
    assert load_features(out).features.shape == (4, 96)


@pytest.mark.parametrize("signature", [b"SNOD", b"TREE", b"HEAP"])
def test_a_damaged_leftover_of_a_killed_creation_or_merge_is_no_traceback(
    store, tmp_path, signature
):
    # A creation killed while HDF5 wrote its structures leaves a .tmp that opens and then
    # cannot be read (a merge's .merging, the same): h5py's RuntimeError came out of
    # extract_features, a traceback from mr2-extract. The .tmp is replaced, as one that does
    # not open at all; the .merging, not known to be a merge's, is refused in one line.
    from extract._merge import check_merging

    out = tmp_path / "out.h5"
    bad = store.read_bytes().replace(signature, b"XXXX", 1)
    _write(out.with_name("out.h5.tmp"), bad)
    check_output(out)
    _write(out.with_name("out.h5.merging"), bad)
    with pytest.raises(StoreError, match=r"out\.h5\.merging' exists and is not a merged store"):
        check_merging(os.fspath(out))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _link(target, name):
    link = target.with_name(name)
    link.symlink_to(target)
    return link


def _fifo(path):
    os.mkfifo(path)
    return path


def _hdf5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            f.create_dataset(name, data=data)
    return path


def _vlen_ints(path, name):
    """A foreign store whose ``name`` dataset holds variable-length integer arrays."""
    _foreign(path, status=np.array([1, 2, 1, 1, 1, 1], np.uint8))
    with h5py.File(path, "a") as f:
        n = len(f[name]) if name in f else 6
        if name in f:
            del f[name]
        f.create_dataset(name, (n,), dtype=h5py.vlen_dtype(np.int64))
    return path


def _foreign(path, **datasets):
    """A store written by other code: six rows of two classes, and ``datasets``."""
    rows = dict(features=np.zeros((6, 4)), labels=[0, 1] * 3, class_names=[b"a", b"b"])
    return _hdf5(path, **(rows | datasets))


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda p: p, StoreNotFoundError, "does not exist"),
        (lambda p: _write(p, b""), NotAStoreError, "is empty"),
        (lambda p: _write(p, b"not hdf5"), NotAStoreError, "is not an HDF5 file"),
        (_fifo, NotAStoreError, r"is not a regular file \(a device, a FIFO or a socket\)"),
        (lambda p: p.mkdir() or p, NotAStoreError, "is a folder"),
        (
            lambda p: _hdf5(p, features=np.zeros((2, 3)), class_names=["a"]),
            NotAStoreError,
            r"not a feature store: it has no 'labels' dataset \(it holds \['class_names', "
            r"'features'\]\); pass a store written by mr2-extract, or write the missing "
            r"datasets into it: any HDF5 file with 'features' \(n, d\), integer 'labels' "
            r"\(n,\), codes 0..K-1, and 'class_names' \(K,\) text is read as one\.",
        ),
        (
            lambda p: _hdf5(p, features=np.zeros((2, 3)), labels=[0, 5], class_names=["a"]),
            NotAStoreError,
            "'labels' holds values outside 0..0",
        ),
        # A short 'status' loaded 3 of 6 rows as a complete store; an unknown code dropped
        # its row; the others were TypeErrors and IndexErrors.
        (lambda p: _foreign(p, status=np.ones(3, np.uint8)), NotAStoreError, "'status' has"),
        (lambda p: _foreign(p, status=[1] * 5 + [3]), NotAStoreError, r"codes \[3\], not 0"),
        (lambda p: _foreign(p, paths=[b"x", b"y"]), NotAStoreError, r"'paths' has shape \(2,\)"),
        # A column per row: a 'status' of shape (6, 2) raised IndexError, 'indices' and
        # 'paths' of that shape loaded as such.
        (
            lambda p: _foreign(p, status=np.ones((6, 2), "u1")),
            NotAStoreError,
            r"'status' has shape \(6, 2\) for 6",
        ),
        (
            lambda p: _foreign(p, indices=np.ones((6, 2))),
            NotAStoreError,
            r"'indices' has shape \(6, 2\) for 6",
        ),
        (
            lambda p: _foreign(p, paths=[[b"x", b"y"]] * 6),
            NotAStoreError,
            r"'paths' has shape \(6, 2\) for 6",
        ),
        (lambda p: _foreign(p, class_names=[0, 1]), NotAStoreError, "'class_names' has dtype"),
        (lambda p: _foreign(p, paths=np.arange(6)), NotAStoreError, "'paths' has dtype int64"),
        # Variable-length integers (an object dtype too): h5py's TypeError from asstr(), or
        # an AttributeError decoding failure reasons.
        *(
            (
                functools.partial(_vlen_ints, name=name),
                NotAStoreError,
                f"'{name}' has dtype object, not strings",
            )
            for name in ("class_names", "paths", "failure_reason")
        ),
        # Scalar datasets: a TypeError from len() and h5py's nameless "Illegal slicing
        # argument for scalar dataspace".
        (lambda p: _foreign(p, class_names=b"ab"), NotAStoreError, r"'class_names' has shape \(\)"),
        (lambda p: _foreign(p, labels=1), NotAStoreError, r"'labels' has shape \(\) for 6"),
        (lambda p: _foreign(p, status=1), NotAStoreError, r"'status' has shape \(\) for 6"),
        # An empty dataspace (h5py.Empty): shape None, a TypeError from its slice.
        (
            lambda p: _foreign(p, status=h5py.Empty("u1")),
            NotAStoreError,
            "'status' has shape None for 6",
        ),
        # As 'labels': said to have dtype object, not integers.
        (
            lambda p: _foreign(p, labels=h5py.Empty("i8")),
            NotAStoreError,
            r"'labels' is an empty dataspace \(h5py.Empty: no rows\), not \(n_rows,\) integers",
        ),
        # As 'features' or 'class_names': said to have "shape None".
        (
            lambda p: _foreign(p, features=h5py.Empty("f4")),
            NotAStoreError,
            r"'features' is an empty dataspace \(h5py.Empty: no rows\), not \(n_rows, n_features\)",
        ),
        (
            lambda p: _foreign(p, class_names=h5py.Empty("S1")),
            NotAStoreError,
            r"'class_names' is an empty dataspace \(h5py.Empty: no entries\), not \(n_classes,\)",
        ),
        # Bytes that are not UTF-8: a UnicodeDecodeError that named no file.
        (
            lambda p: _foreign(p, class_names=[b"a", b"\xe9t\xe9"]),
            NotAStoreError,
            r"x.h5' is inconsistent: 'class_names' holds text that is not UTF-8 \(invalid",
        ),
        (lambda p: _foreign(p, paths=[b"\xff"] * 6), NotAStoreError, "'paths' holds text that"),
    ],
)
def test_load_features_errors_are_store_errors(tmp_path, make, error, match):
    make(tmp_path / "x.h5")
    with pytest.raises(error, match=match) as info:
        load_features(tmp_path / "x.h5")
    assert isinstance(info.value, StoreError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("x.h5/", "names the file '{d}/x.h5' as a folder: pass it without the trailing '/'."),
        ("x.h5/y.h5", "names the file '{d}/x.h5' as a folder; check the path."),
    ],
)
def test_a_store_named_as_a_folder_is_said_to_be_a_file(tmp_path, name, problem):
    # 'x.h5/' (a '/' after a completed name) was said not to exist, beside the store x.h5.
    _foreign(tmp_path / "x.h5")
    with pytest.raises(NotAStoreError) as info:
        load_features(f"{tmp_path}/{name}")
    assert str(info.value) == (
        f"The feature store path '{tmp_path}/{name}' {problem.format(d=tmp_path)}"
    )
    with pytest.raises(NotAStoreError, match="as a folder"):  # a path in bytes, as h5py's
        load_features(os.fsencode(f"{tmp_path}/{name}"))
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        load_features(os.fsencode(f"{tmp_path}/missing.h5/"))


@pytest.mark.parametrize(
    "name, error, problem",
    [
        ("missing.h5", StoreNotFoundError, "does not exist"),
        ("x.h5/", NotAStoreError, "names the file 'x.h5' as a folder"),
        ("x.h5/y.h5", NotAStoreError, "names the file 'x.h5' as a folder"),
    ],
)
def test_a_relative_path_not_there_is_said_so(tmp_path, monkeypatch, name, error, problem):
    # A relative path's folders end in '' (no folder), where an absolute one's end in '/':
    # looking up its folders for a file must stop there, not loop for ever.
    monkeypatch.chdir(tmp_path)
    _foreign(tmp_path / "x.h5")
    with fails_after_waiting(10, f"load_features({name!r}) looked for its folders for ever"):
        with pytest.raises(error, match=re.escape(problem)):
            load_features(name)


def test_a_foreign_store_s_utf8_byte_strings_are_read_as_text(tmp_path):
    # NumPy byte strings (dtype S), as other tools write text: h5py reads them as ASCII by
    # default, so "café" was "'ascii' codec can't decode byte 0xc3" and no store.
    names, paths = ["café", "naïve"], [f"图/{i}.jpg" for i in range(6)]
    encode = lambda texts: np.array([t.encode() for t in texts])  # noqa: E731
    _foreign(tmp_path / "x.h5", class_names=encode(names), paths=encode(paths))
    with load_features(tmp_path / "x.h5") as loaded:
        assert loaded.class_names == names and loaded.paths == paths


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("class_names", "a,b", "a,b"),
        ("class_names", np.array([b"a", b"b"]), ["a", "b"]),
        ("versions", "torch 2.1", "torch 2.1"),
        ("versions", 3, 3),
        ("preprocessing", '{"resize": 256}', {"resize": 256}),
        ("source", np.bytes_(b"caf\xe9"), "caf\\xe9"),  # not UTF-8: UnicodeDecodeError
    ],
)
def test_a_foreign_store_s_attributes_of_a_store_s_names_are_read_as_they_are(
    tmp_path, key, value, expected
):
    # Another tool's attribute named as one that mr2-extract writes in JSON: plain text
    # called the file damaged (a JSONDecodeError), a list or a number raised TypeError.
    _foreign(tmp_path / "x.h5")
    with h5py.File(tmp_path / "x.h5", "a") as f:
        f.attrs[key] = value
    with load_features(tmp_path / "x.h5") as loaded:
        assert loaded.metadata[key] == expected and loaded.class_names == ["a", "b"]


def test_a_truncated_store_is_not_a_store_rather_than_locked(store, folder, tmp_path):
    # HDF5's "truncated file: ... sblock->base_addr" contains "lock": it was reported as
    # open for writing in another process, and the user was sent to wait for no one.
    truncated = tmp_path / "t.h5"
    truncated.write_bytes(store.read_bytes()[:8000])
    with pytest.raises(NotAStoreError, match="truncated file"):
        load_features(truncated)
    # --force refused it too, without saying what to do instead.
    with pytest.raises(NotAStoreError, match=r"cut short\).*delete it yourself to extract"):
        extract_features(folder, BACKBONE, truncated, overwrite=True, **FAST)


@pytest.mark.parametrize(
    "signature",
    [b"SNOD", b"TREE", b"HEAP", b"GCOL"],  # symbol table, B-tree, local and global heaps
)
def test_a_damaged_store_is_not_a_store(store, folder, tmp_path, signature):
    # A store whose HDF5 structures are damaged (a disk error, a bad copy) opens, then
    # h5py raises as it reads them: load_features raised h5py's RuntimeError or OSError
    # (not a StoreError), and mr2-extract printed a traceback.
    data = store.read_bytes()
    assert signature in data
    damaged = tmp_path / "d.h5"
    damaged.write_bytes(bad := data.replace(signature, b"XXXX", 1))
    with pytest.raises(NotAStoreError, match=r"the file is damaged\): .*signature"):
        load_features(damaged, in_memory=True)
    for overwrite in (False, True):  # never replaced, as a file cut short is not
        with pytest.raises(NotAStoreError, match=r"damaged.*delete it yourself to extract"):
            extract_features(folder, BACKBONE, damaged, overwrite=overwrite, **FAST)
    assert damaged.read_bytes() == bad


def test_a_store_whose_chunk_index_is_damaged_is_not_a_store(store, folder, tmp_path, caplog):
    # The features' chunk index (a B-tree that only their reads walk) damaged: the store
    # was reused as complete, and loaded lazily; h5py's "wrong B-tree signature" came out
    # of the first read of its rows, naming no file.
    data = store.read_bytes()
    assert data.count(b"TREE\x01") == 1  # the one B-tree of raw data chunks
    damaged = tmp_path / "d.h5"
    damaged.write_bytes(bad := data.replace(b"TREE\x01", b"XXXX\x01"))
    caplog.set_level(logging.INFO, logger="extract")
    for in_memory in (False, True):
        with pytest.raises(NotAStoreError, match=r"'\S*d\.h5' .*damaged\): .*B-tree signature"):
            load_features(damaged, in_memory=in_memory)
    for overwrite in (False, True):
        with pytest.raises(NotAStoreError, match=r"damaged.*delete it yourself to extract"):
            extract_features(folder, BACKBONE, damaged, overwrite=overwrite, **FAST)
    assert "Reused" not in caplog.text
    assert damaged.read_bytes() == bad


@pytest.mark.parametrize(
    "link",
    [h5py.SoftLink("/nowhere"), h5py.ExternalLink("missing.h5", "/x")],
    ids=["soft", "external"],
)
def test_a_store_with_a_link_to_nothing_is_read(tmp_path, link):
    # A soft link to nothing, or a link to another file that is not there (a store that
    # another tool wrote, or a user added to): HDF5 allows both, and load_features reads
    # any HDF5 file with the three datasets; opening the links at open called the store
    # "damaged", never to be replaced.
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.ones((4, 3), np.float32), chunks=(2, 3))
        f.create_dataset("labels", data=np.arange(4) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        f["extra"] = link
    with load_features(path) as store:
        np.testing.assert_array_equal(store.features[:], np.ones((4, 3)))


def _virtual_store(folder: Path, name: str) -> Path:
    """A store whose ``name`` dataset is virtual, its rows in part0.h5 and part1.h5 (named
    relative to the store, as h5py's VirtualSource writes a relative name)."""
    data = dict(features=np.arange(24, dtype=np.float32).reshape(6, 4) + 1, labels=[1, 1] * 3)
    rows = dict(data, class_names=["a", "b"])
    for part in range(2):
        with h5py.File(folder / f"part{part}.h5", "w") as f:
            f[name] = np.asarray(data[name])[3 * part : 3 * part + 3]
    with h5py.File(folder / "s.h5", "w") as f:
        layout = h5py.VirtualLayout(np.shape(data[name]), np.asarray(data[name]).dtype)
        for part in range(2):
            shape = (3, *np.shape(data[name])[1:])
            layout[3 * part : 3 * part + 3] = h5py.VirtualSource(f"part{part}.h5", name, shape)
        f.create_virtual_dataset(name, layout, fillvalue=0)
        for other, values in rows.items():
            if other != name:
                f[other] = values
    return folder / "s.h5"


@pytest.mark.parametrize("name", ["features", "labels"])
@pytest.mark.parametrize("lose", ["file", "dataset", "rows", None])
def test_a_virtual_dataset_is_read_only_with_every_source(tmp_path, monkeypatch, name, lose):
    # A virtual dataset (shards joined by an HDF5 VDS) whose source file was deleted, or
    # lacks its dataset, or some of its rows (written again shorter): HDF5 reads those rows
    # as the fill value without an error, and the store loaded zeros as features (labels as
    # class 0).
    path = _virtual_store(tmp_path, name)
    if lose == "file":
        (tmp_path / "part1.h5").unlink()
    elif lose == "dataset":
        with h5py.File(tmp_path / "part1.h5", "a") as f:
            f.move(name, "other")
    elif lose == "rows":
        with h5py.File(tmp_path / "part1.h5", "a") as f:
            rows = f[name][:2]
            del f[name]
            f[name] = rows
    monkeypatch.chdir(tmp_path.parent)  # the sources are found beside the store
    if lose is None:
        store = load_features(path, in_memory=True)
        assert store.features[3:].min() > 0 and (store.labels == 1).all()
        return
    why = r"has shape \(2,.*\), short of the \(3,.*\) mapped" if lose == "rows" else "cannot be"
    with pytest.raises(NotAStoreError, match=rf"'{name}' is a virtual dataset whose source "
                       rf"'part1.h5' \(dataset '{name}'\) {why}"):  # fmt: skip
        load_features(path)


@pytest.mark.parametrize("prefix", ["${ORIGIN}/parts", "{tmp}/nothing:{tmp}/parts"])
def test_a_virtual_dataset_s_sources_are_looked_for_as_hdf5_does(tmp_path, monkeypatch, prefix):
    # HDF5_VDS_PREFIX set once HDF5 has started: HDF5 looks in each of its folders, but
    # reads no ${ORIGIN} in it (that, only in the prefix it took when it started). Read
    # as the store's folder, HDF5's zeros were loaded without a word.
    path = _virtual_store(tmp_path, "features")
    (tmp_path / "parts").mkdir()
    for part in range(2):
        (tmp_path / f"part{part}.h5").rename(tmp_path / "parts" / f"part{part}.h5")
    monkeypatch.setenv("HDF5_VDS_PREFIX", prefix.replace("{tmp}", str(tmp_path)))
    monkeypatch.chdir(tmp_path.parent)
    with h5py.File(path, "r") as f:
        read = f["features"][:].all()  # HDF5's reading, which load_features follows
    if read:
        assert load_features(path, in_memory=True).features[3:].min() > 0
        return
    with pytest.raises(NotAStoreError, match=r"source 'part0.h5' \(dataset 'features'\)"):
        load_features(path)


@pytest.mark.parametrize("link", ["store", "folder"])
def test_a_virtual_store_read_through_a_link_finds_its_sources(tmp_path, monkeypatch, link):
    # HDF5 finds a relative source beside the store's real file too (a store linked from
    # another folder): it read every row, and load_features refused the store as missing
    # its sources, having looked beside the link alone.
    (tmp_path / "real").mkdir()
    path = _virtual_store(tmp_path / "real", "features")
    (tmp_path / "elsewhere").mkdir()
    if link == "store":
        linked = tmp_path / "elsewhere" / "s.h5"
        linked.symlink_to(path)
    else:  # a link to the folder: the store's folder is the link's
        (tmp_path / "elsewhere" / "real").symlink_to(tmp_path / "real")
        linked = tmp_path / "elsewhere" / "real" / "s.h5"
    monkeypatch.chdir(tmp_path)
    with h5py.File(linked, "r") as f:
        assert f["features"][:].min() > 0  # HDF5 reads every row
    store = load_features(linked, in_memory=True)
    assert store.features[3:].min() > 0


def _external_store(folder: Path, name: str, raw: str) -> Path:
    """A store whose ``name`` dataset keeps its rows in the external raw data file ``raw``
    (h5py's ``create_dataset(..., external=...)``), a name relative to the current folder."""
    data = dict(features=np.arange(24, dtype=np.float32).reshape(6, 4) + 1, labels=[1, 0] * 3)
    with h5py.File(folder / "s.h5", "w") as f:
        for key, values in (data | dict(class_names=["a", "b"])).items():
            if key == name:
                values = np.asarray(values)
                f.create_dataset(key, values.shape, values.dtype, external=[(raw, 0, 1 << 20)])
                f[key][...] = values
            else:
                f[key] = values
    return folder / "s.h5"


@pytest.mark.parametrize("name", ["features", "labels"])
def test_a_dataset_whose_external_file_is_missing_is_said_so(tmp_path, monkeypatch, name):
    # Its rows in a file beside the store (h5py's external=), deleted or left behind by a
    # move: the store was called damaged ("unable to open external raw data file"), never
    # to be replaced, where the file is whole and names the one to restore.
    from extract._reading import RowView
    from mr2_probe._data import read_h5

    monkeypatch.chdir(tmp_path)
    path = _external_store(tmp_path, name, "rows.raw")
    assert load_features(path, in_memory=True).features.sum() == 300
    store = load_features(path)  # opened with its file, which then goes
    (tmp_path / "rows.raw").unlink()
    message = rf"'{name}' keeps its rows in the external file 'rows.raw' \(looked for as "
    for in_memory in (False, True):
        with pytest.raises(NotAStoreError, match=message + r".*restore that file") as error:
            load_features(path, in_memory=in_memory)
        assert "damaged" not in str(error.value)
    if name == "features":  # read after the file went: by the estimators, and by a view
        with pytest.raises(ValueError, match=r"external file 'rows.raw' \(looked for as"):
            read_h5(store.features, slice(None))
        with pytest.raises(NotAStoreError, match=r"external file 'rows.raw' .* not known to be"):
            RowView.of(store.features, np.arange(3))[:]
    store.close()


def test_a_dataset_whose_external_file_is_a_folder_is_said_so(tmp_path, monkeypatch):
    # A folder where its external file should be was said to be "not there".
    monkeypatch.chdir(tmp_path)
    path = _external_store(tmp_path, "features", "rows.raw")
    (tmp_path / "rows.raw").unlink()
    (tmp_path / "rows.raw").mkdir()
    message = r"external file 'rows.raw' \(looked for as .*\), which is a folder, not a file"
    with pytest.raises(NotAStoreError, match=message):
        load_features(path)


@pytest.mark.parametrize("name", ["features", "labels"])
def test_a_dataset_whose_external_file_is_cut_short_is_refused(tmp_path, monkeypatch, name):
    # HDF5 reads the bytes past an external file's end as zeros without an error: a copy
    # cut short loaded the last rows as zero features (labels as class 0).
    monkeypatch.chdir(tmp_path)
    path = _external_store(tmp_path, name, "rows.raw")
    whole = (tmp_path / "rows.raw").read_bytes()
    (tmp_path / "rows.raw").write_bytes(whole[:-1])
    cut = rf"'rows.raw' \({len(whole) - 1} of its {len(whole)} bytes\), which is cut short"
    with pytest.raises(
        NotAStoreError, match=rf"'{name}' keeps its rows in the external file {cut}"
    ):
        load_features(path)
    (tmp_path / "rows.raw").write_bytes(whole + b"more")  # longer is no loss
    assert load_features(path, in_memory=True).features.sum() == 300


@pytest.mark.parametrize("later", [("next.raw", 0), ("later.raw", 8)])
def test_external_files_past_a_dataset_s_rows_are_not_looked_for(tmp_path, monkeypatch, later):
    # An extendible dataset's external files past its rows (the next, never written; one
    # whose offset lies past its end): HDF5 reads none of them, and the store is whole.
    # The first was called missing, the second cut short ("0 of its 0 bytes").
    monkeypatch.chdir(tmp_path)
    X = np.arange(24, dtype=np.float32).reshape(6, 4) + 1
    (tmp_path / "later.raw").write_bytes(b"x")
    external = [("rows.raw", 0, X.nbytes), (*later, h5py.h5f.UNLIMITED)]
    with h5py.File(tmp_path / "s.h5", "w") as f:
        try:
            f.create_dataset("features", X.shape, X.dtype, maxshape=(None, 4), external=external)
        except ValueError as error:  # HDF5 1.12 (the floors): no chunked external layout
            pytest.skip(f"this HDF5 cannot make an extendible external dataset: {error}")
        f["features"][...] = X
        f["labels"], f["class_names"] = [1, 0] * 3, ["a", "b"]
    assert not (tmp_path / "next.raw").exists()
    assert load_features(tmp_path / "s.h5", in_memory=True).features.sum() == 300


def test_a_store_with_a_dataset_numpy_cannot_type_is_read(tmp_path):
    # Another dataset in a type that NumPy has no equivalent of (HDF5's H5T_TIME), which
    # load_features never reads: its type converted at open raised h5py's TypeError.
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.ones((4, 3), np.float32))
        f.create_dataset("labels", data=np.arange(4) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        h5py.h5d.create(f.id, b"when", h5py.h5t.UNIX_D32LE, h5py.h5s.create_simple((4,)))
    with load_features(path) as store:
        assert store.features.shape == (4, 3)


@pytest.mark.parametrize("name", ["status", "paths", "indices", "failure_reason"])
def test_a_group_in_place_of_a_store_dataset_is_refused_as_inconsistent(tmp_path, name):
    # h5py's AttributeError ("'Group' object has no attribute 'shape'") or TypeError
    # ("Accessing a group is done with bytes or str") came out.
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.ones((4, 3), np.float32))
        f.create_dataset("labels", data=np.arange(4) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        f.create_group(name)
    with pytest.raises(NotAStoreError, match=rf"inconsistent: '{name}' is a group, not a data"):
        load_features(path)


@pytest.mark.parametrize("link", ["soft", "external"])
@pytest.mark.parametrize("name", ["status", "paths", "indices"])
def test_a_store_dataset_read_that_links_to_nothing_is_not_called_damaged(tmp_path, name, link):
    # A dataset that load_features reads given as a link whose target is gone (a soft link
    # to nothing, a file moved away): "(the file is damaged)", never to be replaced.
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.ones((4, 3), np.float32))
        f.create_dataset("labels", data=np.arange(4) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        gone = str(tmp_path / "gone.h5")
        f[name] = h5py.SoftLink("/nothing") if link == "soft" else h5py.ExternalLink(gone, "/x")
    with pytest.raises(NotAStoreError, match=rf"inconsistent: '{name}' is a link to '/") as raised:
        load_features(path)
    assert "(the file is damaged)" not in str(raised.value)


@pytest.mark.parametrize("name", ["features", "labels", "status", "paths"])
def test_a_store_dataset_read_in_a_type_numpy_cannot_type_is_refused(tmp_path, name):
    # One of the datasets load_features reads in H5T_TIME (another dataset is read since
    # a2d52c3): h5py's TypeError "No NumPy equivalent for TypeTimeID exists" came out.
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        if name != "features":
            f.create_dataset("features", data=np.ones((4, 3), np.float32))
        if name != "labels":
            f.create_dataset("labels", data=np.arange(4) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        shape = (4, 3) if name == "features" else (4,)
        h5py.h5d.create(f.id, name.encode(), h5py.h5t.UNIX_D32LE, h5py.h5s.create_simple(shape))
    with pytest.raises(NotAStoreError, match=rf"inconsistent: '{name}' has an HDF5 type that"):
        load_features(path)


def _labels_beside(f, y, failed: bool) -> None:
    """A store's labels ``y`` of classes a and b beside its features in ``f``; with
    ``failed``, a status whose row 0 failed (the features read as a row view)."""
    f.create_dataset("labels", data=y)
    f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
    if failed:
        f.create_dataset("status", data=np.full(len(y), DONE, np.uint8))
        f["status"][0] = FAILED


@pytest.mark.parametrize("failed", [False, True])  # features an h5py.Dataset, a RowView
def test_rows_of_a_damaged_store_read_lazily_name_the_file(tmp_path, failed):
    # A compressed chunk that no longer decompresses (a store written by another tool, as
    # load_features reads any) opens, its index intact: h5py's "filter returned failure
    # during read" came out of the first read of its rows, naming no file, from a row
    # view and from a probe's streamed fit and predict alike.
    from mr2_probe import MR2LinearClassifier

    path = tmp_path / "gz.h5"
    X = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    y = np.arange(40) % 2
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X, chunks=(10, 8), compression="gzip")
        _labels_beside(f, y, failed)
        chunk = f["features"].id.get_chunk_info(2)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset : chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
    path.write_bytes(bytes(data))
    fitted = MR2LinearClassifier().fit(X, y)
    damaged = rf"'{re.escape(str(path))}' .*\(the file is damaged\): .*{DAMAGED_CHUNK}"
    with load_features(path) as store:
        if failed:
            with pytest.raises(NotAStoreError, match=damaged):
                store.features[:]
        with pytest.raises(ValueError, match=damaged):
            MR2LinearClassifier(max_iter=5).fit(store.features, store.labels)
        with pytest.raises(ValueError, match=damaged):
            fitted.predict(store.features)


def test_a_damaged_store_read_into_memory_is_not_blamed_on_another_datasets_filter(tmp_path):
    # A gzip chunk of the features that no longer decompresses, beside a dataset (never
    # read) compressed with a filter not installed here: the file's filters were all read,
    # and the damaged file was "compressed with filters that this HDF5 cannot load", "not
    # known to be damaged".
    path = tmp_path / "gz.h5"
    X = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=X, chunks=(10, 8), compression="gzip")
        f.create_dataset("labels", data=np.arange(40) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        f.create_dataset(
            "notes", (4,), np.float32, chunks=(4,), compression=32099, allow_unknown_filter=True
        )
        chunk = f["features"].id.get_chunk_info(2)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset : chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
    path.write_bytes(bytes(data))
    with pytest.raises(NotAStoreError, match=rf"\(the file is damaged\): .*{DAMAGED_CHUNK}"):
        load_features(path, in_memory=True)


@pytest.mark.parametrize("applied", [False, True])
def test_an_optional_filter_not_loaded_is_named_only_where_a_chunk_was_written_with_it(
    tmp_path, applied
):
    # An optional filter (H5Z_FLAG_OPTIONAL) that the writer could not load either is
    # skipped, each chunk marked so, and read without it: a gzip chunk that no longer
    # decompresses was blamed on it ("not known to be damaged"), from load_features and a
    # probe's streamed fit alike. Applied to a chunk (a writer with the plugin), it is named.
    from mr2_probe import MR2LinearClassifier

    path = tmp_path / "opt.h5"
    X = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((10, 8))
        dcpl.set_filter(32099, h5py.h5z.FLAG_OPTIONAL)
        dcpl.set_deflate(4)
        space = h5py.h5s.create_simple((40, 8))
        h5py.h5d.create(f.id, b"features", h5py.h5t.NATIVE_FLOAT, space, dcpl=dcpl)
        f["features"][...] = X  # 32099 skipped: each chunk's filter mask says so
        if applied:  # as a writer with its plugin leaves a chunk (gzip then 32099)
            f["features"].id.write_direct_chunk((20, 0), b"\x00" * 50, filter_mask=0)
        f.create_dataset("labels", data=np.arange(40) % 2)
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        chunk = f["features"].id.get_chunk_info(2)
    if not applied:
        data = bytearray(path.read_bytes())
        data[chunk.byte_offset : chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
        path.write_bytes(bytes(data))
    plugin = r"filters that this HDF5 cannot load \(filter \(id 32099\)\)"
    problem = plugin if applied else rf"\(the file is damaged\): .*{DAMAGED_CHUNK}"
    with pytest.raises(StoreError, match=problem):
        load_features(path, in_memory=True)
    with load_features(path) as store, pytest.raises(ValueError, match=problem):
        MR2LinearClassifier(max_iter=5).fit(store.features, store.labels)


@pytest.mark.parametrize("failed", [False, True])  # features an h5py.Dataset, a RowView
def test_a_store_compressed_with_a_filter_not_loaded_is_not_called_damaged(tmp_path, failed):
    # A store that another tool compressed with a filter whose plugin is not installed here
    # (hdf5plugin's Blosc, say): an intact file was "damaged", to be deleted and extracted
    # again, from load_features, a row view and a probe's streamed fit and predict alike.
    from mr2_probe import MR2LinearClassifier

    path = tmp_path / "blosc.h5"
    X = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    y = np.arange(40) % 2
    with h5py.File(path, "w") as f:
        features = f.create_dataset(
            "features", (40, 8), np.float32, chunks=(10, 8), compression=32099,
            allow_unknown_filter=True,
        )  # fmt: skip
        for start in range(0, 40, 10):  # written as stored, as that filter would leave them
            features.id.write_direct_chunk((start, 0), X[start : start + 10].tobytes())
        _labels_beside(f, y, failed)
    fitted = MR2LinearClassifier().fit(X, y)
    plugin = r"filters that this HDF5 cannot load \(filter \(id 32099\)\).*Install their plugin"
    with pytest.raises(StoreError, match=plugin) as raised:
        load_features(path, in_memory=True)
    assert not isinstance(raised.value, NotAStoreError)
    with load_features(path) as store:
        if failed:
            with pytest.raises(StoreError, match=plugin):
                store.features[:]
        for fit_or_predict in (
            lambda: MR2LinearClassifier(max_iter=5).fit(store.features, store.labels),
            lambda: fitted.predict(store.features),
        ):
            with pytest.raises(ValueError, match=plugin) as raised:
                fit_or_predict()
            assert "(the file is damaged)" not in str(raised.value)


def test_an_incomplete_store_being_written_is_locked_not_to_be_run_again(store, tmp_path):
    # With HDF5's own lock off (HDF5_USE_FILE_LOCKING=FALSE, as on NFS), a store read while
    # its run writes it was "not extracted yet; run the same extraction command again",
    # which the run's lock then refused: the run's lock names its writer.
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][:3] = PENDING
    with _held_open(partial, "r", lock=True) as writer:
        (tmp_path / "link.h5").symlink_to(partial)  # its lock lies beside the target
        for path in (partial, tmp_path / "link.h5"):
            with pytest.raises(StoreLockedError, match=rf"process \(pid {writer}\): 3 of"):
                load_features(path)
        with pytest.warns(UserWarning, match="incomplete store"):
            assert load_features(partial, allow_incomplete=True).n_pending == 3
    with pytest.raises(IncompleteStoreError, match="run the same extraction command again"):
        load_features(partial)


def test_an_incomplete_store_beside_a_fifo_named_as_its_lock_is_not_waited_for(store, tmp_path):
    # The run's lock looked for beside an incomplete store: a FIFO of that name (a user's,
    # never written by mr2-extract, which refuses it) was opened to be read, and
    # load_features waited for a writer to it, for ever.
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][0] = PENDING
    _fifo(tmp_path / "partial.h5.lock")

    with fails_after_waiting(5, "load_features waited for a writer to the FIFO"):
        with pytest.raises(IncompleteStoreError, match="not extracted yet"):
            load_features(partial)


def test_incomplete_and_locked_stores_are_store_errors(store, tmp_path):
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][0] = PENDING
    with pytest.raises(StoreError, match="not extracted yet"):
        load_features(partial)
    # Another process writing it: HDF5's own file lock.
    with (
        _held_open(partial, "r+"),
        pytest.raises(StoreLockedError, match="open for writing in another process"),
    ):
        load_features(partial)
    # Another process reading it: no one may write it, and waiting does not help.
    with (
        _held_open(partial, "r"),
        pytest.raises(StoreLockedError, match="open in another process, .* close it there"),
    ):
        open_store(partial, "a").close()


def test_a_store_open_in_this_process_is_named_so_not_as_no_store(store, folder, tmp_path):
    # HDF5's "file is already open for read-only" was taken for a file that is no store,
    # with the advice to delete it: hours of extraction, for a handle left open.
    partial = tmp_path / "partial.h5"
    partial.write_bytes(store.read_bytes())
    with h5py.File(partial, "r+") as f:
        f["status"][0] = PENDING
    with pytest.warns(
        UserWarning, match=r"Loading 11 completed rows of an incomplete store \(1 row pending\)"
    ):
        held = load_features(partial, allow_incomplete=True)
    with held:
        with pytest.raises(StoreLockedError, match="open in this process .* close it"):
            open_store(partial, "r+")
        with pytest.raises(StoreLockedError, match="open in this process"):
            extract_features(folder, BACKBONE, partial, **FAST)
    extract_features(folder, BACKBONE, partial, **FAST)  # closed: resumed
    assert load_features(partial, in_memory=True).n_pending == 0


def test_a_store_whose_writer_died_is_not_said_to_be_open_here(tmp_path):
    # HDF5's "file is already open for write (may use <h5clear file> ...)" of a writer
    # that died with the file open was taken for a handle of this process.
    path = tmp_path / "died.h5"
    script = (
        "import h5py, numpy as np, os, sys\n"
        "f = h5py.File(sys.argv[1], 'w', libver='latest')\n"
        "f['features'] = np.zeros((3, 2)); f.flush(); os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    with pytest.raises(StoreError) as error:
        open_store(path, "r")
    assert not isinstance(error.value, StoreLockedError)
    assert "h5clear" in str(error.value)


def test_a_failed_read_into_memory_closes_the_store(store, monkeypatch):
    from extract._reading import RowView

    def out_of_memory(self, dtype=None, copy=None):
        raise MemoryError("Unable to allocate")

    opened = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)
    monkeypatch.setattr(RowView, "__array__", out_of_memory)
    monkeypatch.setattr(h5py.Dataset, "__array__", out_of_memory)
    with pytest.raises(MemoryError) as error:  # its traceback kept, as a session keeps it
        load_features(store, in_memory=True)
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == opened
    assert error.traceback


def test_features_that_are_no_numbers_are_refused(store, tmp_path):
    copy = tmp_path / "text.h5"
    copy.write_bytes(store.read_bytes())
    with h5py.File(copy, "r+") as f:
        n = len(f["features"])
        del f["features"]
        f["features"] = np.array([[b"1", b"2"]] * n)
    with pytest.raises(StoreError, match=re.escape("'features' has dtype |S1, not numbers")):
        load_features(copy)


def test_boolean_features_are_read_as_an_array_s_are(tmp_path):
    # Boolean features (binary codes, thresholded activations) were refused as "not
    # numbers", where the estimators (and mr2-probe's .npz) take a boolean array as 0/1.
    X = np.arange(24).reshape(6, 4) % 3 == 0
    _foreign(tmp_path / "x.h5", features=X)
    with load_features(tmp_path / "x.h5", in_memory=True) as loaded:
        np.testing.assert_array_equal(loaded.features, X)


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_a_file_system_without_locks_is_not_another_process(monkeypatch, tmp_path, mode):
    # HDF5's lock failing with ENOSYS (Lustre, NFS without locks) was reported as another
    # process writing the store: the user was told to wait for no one.
    def refuse(path, mode):
        raise OSError(
            "Unable to synchronously open file (unable to lock file, errno = 38, error "
            "message = 'Function not implemented')"
        )

    monkeypatch.setattr(h5py, "File", refuse)
    with pytest.raises(StoreError, match="does not support file locks") as error:
        open_store(tmp_path / "s.h5", mode)
    assert not isinstance(error.value, StoreLockedError)
    assert "HDF5_USE_FILE_LOCKING=FALSE" in str(error.value)


@pytest.mark.parametrize("mode, what", [("r", "read"), ("r+", "write")])
def test_a_store_file_of_a_mode_that_refuses_is_not_called_no_store(
    monkeypatch, tmp_path, mode, what
):
    # A read-only store (chmod 444, its folder writable) resumed by its user: "cannot read
    # it as an HDF5 feature store ... delete it yourself", its rows done so far with it.
    def refuse(path, mode):
        raise PermissionError(
            13,
            "Unable to synchronously open file (unable to open file: name = 's.h5', errno = "
            "13, error message = 'Permission denied', flags = 1, o_flags = 2)",
        )

    monkeypatch.setattr(h5py, "File", refuse)
    with pytest.raises(StoreError, match=f"No permission to {what} the feature store") as error:
        open_store(tmp_path / "s.h5", mode)
    assert not isinstance(error.value, NotAStoreError) and "delete" not in str(error.value)


def test_a_store_on_a_read_only_file_system_opened_for_writing_is_not_called_no_store(
    monkeypatch, tmp_path
):
    # h5py's OSError of errno 30 was read as a damaged file: "cannot read it as an HDF5
    # feature store ... delete it yourself", of a store that reads well.
    def refuse(path, mode):
        raise OSError(
            errno.EROFS,
            "Unable to synchronously open file (unable to open file: name = 's.h5', errno = "
            "30, error message = 'Read-only file system', flags = 1, o_flags = 2)",
        )

    monkeypatch.setattr(h5py, "File", refuse)
    with pytest.raises(StoreError) as error:
        open_store(tmp_path / "s.h5", "r+")
    assert str(error.value) == (
        f"Cannot write the feature store {str(tmp_path / 's.h5')!r}: its file system is "
        "read-only; write the store to a folder you can write to."
    )


def test_under_torchrun_a_store_whose_mode_forbids_writing_is_refused_before_any_work(
    tmp_path, monkeypatch
):
    # A store left incomplete by a run in one process, its mode then read-only (chmod
    # 444): resumed in one process it is refused naming the file's mode; under torchrun
    # every rank extracted its rows and the merge replaced the file, without a word.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out, fast = tmp_path / "f.h5", dict(FAST, batch_size=2)
    _killed_run(monkeypatch, folder, BACKBONE, out, **fast)  # rows 0 and 1 done
    _not_writable(monkeypatch, out)
    _ranks_without_merge(monkeypatch)
    written = _spy_writes(monkeypatch)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(StoreError, match=r"No permission to write .*f\.h5' \(the file's mode"):
            extract_features(folder, BACKBONE, out, **fast)
    assert written == [] and not list(tmp_path.glob("*.shard-*"))


def test_a_store_file_that_cannot_be_read_is_named_so_by_reader_and_writer(
    store, folder, tmp_path, monkeypatch
):
    # chmod 000: h5py.is_hdf5's PermissionError ("Unable to determine if file is accessible
    # as hdf5") came out raw, before any check, from load_features and extract_features.
    def refuse(path):
        raise PermissionError(13, "Unable to determine if file is accessible as hdf5")

    monkeypatch.setattr(h5py, "is_hdf5", refuse)
    with pytest.raises(StoreError, match="No permission to read the feature store"):
        load_features(store)
    with pytest.raises(StoreError, match="No permission to read the feature store"):
        extract_features(folder, BACKBONE, store, **FAST)


def test_a_file_system_without_flock_is_said_and_written_without_the_lock_on_request(
    store, tmp_path, monkeypatch, caplog
):
    # flock failing with ENOSYS (Lustre mounted without -o flock) gave "[Errno 38] Function
    # not implemented" alone, and HDF5_USE_FILE_LOCKING=FALSE, the advice for HDF5's own
    # lock, did not help: nothing could be written there.
    import fcntl

    def no_flock(fh, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.delenv("HDF5_USE_FILE_LOCKING", raising=False)
    path = tmp_path / "s.h5"
    with pytest.raises(StoreError, match="this file system does not support file locks") as e:
        with store_lock(path):
            pass
    assert "HDF5_USE_FILE_LOCKING=FALSE" in str(e.value) and "s.h5.lock" in str(e.value)
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "false")  # HDF5 keeps its lock on for this
    with pytest.raises(StoreError, match="does not support file locks"):
        with store_lock(path):
            pass
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "FALSE")
    caplog.set_level(logging.WARNING, logger="extract")
    with store_lock(path):
        written = True
    assert written and "written without its lock" in caplog.text


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
@pytest.mark.parametrize("setting", ["FALSE", "0", "BEST_EFFORT"])
def test_each_file_system_without_flock_is_written_without_it_on_each_of_hdf5_s_settings(
    tmp_path, monkeypatch, caplog, code, setting
):
    # Every errno of a file system without locks (Lustre, NFS), and every value by which
    # HDF5 opens files without its own lock.
    import fcntl

    def no_flock(fh, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", setting)
    caplog.set_level(logging.WARNING, logger="extract")
    with store_lock(tmp_path / "s.h5"):
        assert "written without its lock" in caplog.text


def test_a_writer_running_under_another_user_is_not_said_to_be_dead(monkeypatch):
    # Signalling another user's process is refused (EPERM): it runs, and writes the store.
    import socket

    from extract import _locks

    def refuse(pid, signal):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refuse)
    message = _locks._locked_message("s.h5", "s.h5.lock", f"4321 {socket.gethostname()}")
    assert message.startswith("The feature store 's.h5' is being written by another process")
    assert "(pid 4321)" in message and "no longer running" not in message


def test_a_reader_refused_by_a_writer_is_told_its_pid(store, tmp_path):
    # The message named none, where the documentation promised it; a released lock's pid
    # (this process's, left by its finished run) is not the writer's.
    path = tmp_path / "s.h5"
    path.write_bytes(store.read_bytes())
    with store_lock(path):
        pass
    with (
        _held_open(path, "r+"),
        pytest.raises(StoreLockedError, match="open for writing in another process; wait"),
    ):
        load_features(path)
    with _held_open(path, "r+", lock=True) as writer:
        with pytest.raises(StoreLockedError, match=rf"in another process \(pid {writer}\); wait"):
            load_features(path)


@contextmanager
def _held_open(path, mode: str, lock: bool = False):
    """Another process holding ``path`` open with h5py in ``mode`` while the block runs
    (with ``lock``, holding its writer's lock too); yields its pid."""
    # store_lock's protocol (flock on <path>.lock, holding the pid), without importing
    # the package (and torch) in the other process
    take = (
        "import fcntl, os; fh = open(sys.argv[1] + '.lock', 'a+'); "
        "fcntl.flock(fh, fcntl.LOCK_EX); fh.truncate(0); fh.write(str(os.getpid())); fh.flush(); "
    )
    code = f"import h5py, sys; {take if lock else ''}f = h5py.File(sys.argv[1], {mode!r}); "
    code += "print(flush=True); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        holder.stdout.readline()
        yield holder.pid
    finally:
        holder.communicate(b"\n", timeout=30)
    assert holder.returncode == 0  # untouched by the reader's or the writer's checks


def test_minimal_hdf5_with_features_labels_and_class_names_loads(tmp_path):
    path = _hdf5(tmp_path / "m.h5", features=np.eye(3), labels=[0, 1, 1], class_names=["a", "b"])
    loaded = load_features(path, in_memory=True)
    np.testing.assert_array_equal(loaded.features, np.eye(3))
    assert loaded.class_names == ["a", "b"] and loaded.paths == ["0", "1", "2"]
    assert loaded.failures == [] and loaded.n_pending == 0


def test_row_view_indexing(store):
    with load_features(store) as loaded, h5py.File(store, "r") as f:
        view, full = loaded.features, f["features"][:]
        assert view.dataset.name == "/features" and view.chunks == f["features"].chunks
        np.testing.assert_array_equal(view[np.array([0, 5, 11])], full[loaded.rows[[0, 5, 11]]])
        np.testing.assert_array_equal(view[::3], full[loaded.rows[::3]])
        assert view[5:5].shape == (0, 96) and len(view) == 12


def test_worker_processes_give_the_same_store(store, folder, tmp_path):
    out = tmp_path / "w.h5"
    extract_features(folder, BACKBONE, out, **(FAST | dict(num_workers=2)))
    assert out.read_bytes() == store.read_bytes()


def test_long_non_ascii_failure_reason_keeps_the_store_readable():
    from extract._schema import _truncate

    reason = "OSError: cannot identify image file '/data/фото/" + "я" * 200
    cut = _truncate(reason)
    assert len(cut) <= 200
    start, end = cut.decode("utf-8").split("...")  # cut between characters, in the middle
    assert reason.startswith(start) and reason.endswith(end)


def _copy_tree(src, dst):
    shutil.copytree(src, dst)  # copy2: same bytes and modification times, other folder
    return dst


@pytest.mark.parametrize(
    "make_other, first_difference",
    [
        # Same layout and file names, other images (train and test folders look like this).
        (
            lambda folder, tmp: make_image_folder(tmp / "other", n_per_class=5, seed=1),
            r"the images differ: '.*/other/cat/000.png' is not the file the store was made "
            r"from \(\d+ bytes now, \d+ when the store was made\)",
        ),
        # The very same files, copied elsewhere: only the root differs.
        (lambda folder, tmp: _copy_tree(folder, tmp / "copy"), "source_root: file has '"),
    ],
)
def test_another_folder_with_the_same_names_is_refused(
    store, folder, tmp_path, make_other, first_difference
):
    other = make_other(folder, tmp_path)
    with h5py.File(store, "r") as f:
        assert f.attrs["source_root"] == str(folder.resolve())
    with pytest.raises(ProvenanceError, match=first_difference) as info:
        extract_features(other, BACKBONE, store, **FAST)
    assert "source_root" in str(info.value) and "--force" in str(info.value)


def test_the_same_folder_through_a_link_or_a_relative_path_is_reused(
    store, folder, tmp_path, monkeypatch
):
    # The root is recorded resolved: the same images named otherwise are the same source.
    before = store.read_bytes()
    (tmp_path / "link").symlink_to(folder)
    monkeypatch.chdir(folder.parent)
    for other in (tmp_path / "link", Path(folder.name)):
        assert extract_features(other, BACKBONE, store, **FAST) == store
    assert store.read_bytes() == before


def test_a_changed_file_is_refused_on_resume_and_force_rebuilds(folder, tmp_path):
    images = _copy_tree(folder, tmp_path / "images")
    out = tmp_path / "f.h5"
    extract_features(images, BACKBONE, out, **FAST)
    with h5py.File(out, "r+") as f:
        f["status"][4:] = PENDING  # an interrupted run: it must not resume on other images
    (images / "cat" / "002.jpg").write_bytes((images / "dog" / "002.jpg").read_bytes())
    with pytest.raises(ProvenanceError, match=r"'.*/images/cat/002.jpg' is not the file"):
        extract_features(images, BACKBONE, out, **FAST)
    with h5py.File(out, "r") as f:
        assert (f["status"][4:] == PENDING).all()  # the refused request wrote nothing
    extract_features(images, BACKBONE, out, overwrite=True, **FAST)
    loaded = load_features(out, in_memory=True)
    with h5py.File(out, "r") as f:
        row = list(f["paths"].asstr()[:]).index("cat/002.jpg")
        digest = f["content_sha256"][row].decode()
        assert f["file_size"][row] == (images / "cat" / "002.jpg").stat().st_size
    assert digest == hashlib.sha256((images / "dog" / "002.jpg").read_bytes()).hexdigest()
    assert loaded.n_pending == 0


def test_every_row_records_the_hash_of_the_bytes_it_was_made_from(store, folder):
    with h5py.File(store, "r") as f:
        paths, digests = f["paths"].asstr()[:], f["content_sha256"][:]
        sizes, mtimes = f["file_size"][:], f["file_mtime_ns"][:]
        assert f.attrs["format_version"] == 2
    for path, digest, size, mtime in zip(paths, digests, sizes, mtimes, strict=True):
        data = (folder / path).read_bytes()  # failed rows too: the bytes that were refused
        assert digest.decode() == hashlib.sha256(data).hexdigest()
        assert (size, mtime) == ((folder / path).stat().st_size, (folder / path).stat().st_mtime_ns)


def test_fashion_mnist_store_is_tied_to_its_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (8, 28, 28)), np.arange(8) % 10)
    write_idx(tmp_path, "train", rng.integers(0, 255, (8, 28, 28)), np.arange(8) % 10)
    out = tmp_path / "f.h5"
    extract_features(f"fashion-mnist:test@{tmp_path}", BACKBONE, out, **FAST)
    train = r"file 1 of the source is 't10k-images-idx3-ubyte.gz' in the store, 'train-images"
    with pytest.raises(ProvenanceError, match=train):
        extract_features(f"fashion-mnist:train@{tmp_path}", BACKBONE, out, **FAST)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (8, 28, 28)), np.arange(8) % 10)
    with pytest.raises(ProvenanceError, match=r"t10k-images-idx3-ubyte.gz' is not the file"):
        extract_features(f"fashion-mnist:test@{tmp_path}", BACKBONE, out, **FAST)
    with h5py.File(out, "r") as f:
        pixels = fashion_mnist("test", tmp_path).pixels  # the rewritten ones
        assert f["content_sha256"][0].decode() != hashlib.sha256(pixels[0]).hexdigest()


@pytest.mark.parametrize(
    "make, match",
    [
        # It said "never replaced (not even with --force)", which replaces it.
        (lambda p: _write(p, b""), "exists and is empty; pass --force .* to write the store"),
        (lambda p: _write(p, b"notes"), "exists and is not an HDF5 file"),
        # A device or a FIFO (size 0) was "empty", and --force replaced it with a store.
        (_fifo, "exists and is not a regular file .*; it is never replaced"),
        (lambda p: _fifo(p.with_name("out.h5.tmp")) and p, "out.h5.tmp' exists and is not"),
        # Reading a FIFO as a lock file waited for a writer, for ever.
        (lambda p: _fifo(p.with_name("out.h5.lock")) and p, "h5.lock' is not a regular file"),
        (lambda p: _hdf5(p, x=[1]), "is an HDF5 file but not a feature store"),
        (lambda p: p.mkdir() or p, "is a folder; give a file path such as"),
        # A path that ends in a separator was written as a file of the folder's name, and
        # an empty one was said to be the folder '.'.
        (lambda p: f"{p.with_name('feats')}/", "feats/' ends in '/', as a folder's name does"),
        (lambda p: f"{p.with_name('out.h5')}/", r"give a file path such as '.*out.h5/features"),
        (lambda p: "", r"^The output path is empty; give a file path such as 'features.h5'.$"),
        (
            lambda p: _write(p.with_name("file.txt"), b"x") / "o.h5",
            r"file.txt' is a file, not a folder",
        ),
        # The files written beside a store: a user's own file of that name is never
        # replaced (the .tmp) or truncated (the .lock).
        (lambda p: _write(p.with_name("out.h5.tmp"), b"notes") and p, "out.h5.tmp' exists and is"),
        (lambda p: _write(p.with_name("out.h5.lock"), b"notes") and p, "is not a lock file"),
        # Text that starts with a number and a space was taken for a pid and a host.
        (lambda p: _write(p.with_name("out.h5.lock"), b"12 eggs\n3 milk") and p, "not a lock"),
        (lambda p: _write(p.with_name("out.h5.lock"), b"2024 " + b"x" * 256) and p, "not a lock"),
        (lambda p: p.with_name("out.h5.lock").mkdir() or p, "out.h5.lock' is a folder"),
        (lambda p: _hdf5(p.with_name("out.h5.tmp"), mine=[1]) and p, "h5.tmp' exists and is"),
        (lambda p: _link(_hdf5(p.with_name("mine.h5"), x=[1]), "out.h5.tmp") and p, "symbolic"),
        (lambda p: _link(_write(p.with_name("pid"), b"123"), "out.h5.lock") and p, "symbolic"),
        (lambda p: _link(p.with_name("gone.h5"), "out.h5.tmp") and p, "is a symbolic link"),
    ],
)
def test_unusable_outputs_are_refused_before_any_work(folder, tmp_path, no_model, make, match):
    out = make(tmp_path / "out.h5")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(StoreError, match=match):
        extract_features(folder, BACKBONE, out, **FAST)
    assert sorted(tmp_path.iterdir()) == before  # nothing written, no folder made


def test_force_replaces_stores_and_empty_files_but_no_other_file(folder, tmp_path):
    (tmp_path / "notes.h5").write_text("my notes")
    with pytest.raises(StoreError, match="never replaced"):
        extract_features(folder, BACKBONE, tmp_path / "notes.h5", overwrite=True, **FAST)
    assert (tmp_path / "notes.h5").read_text() == "my notes"
    (tmp_path / "empty.h5").write_bytes(b"")
    extract_features(folder, BACKBONE, tmp_path / "empty.h5", overwrite=True, max_items=2, **FAST)
    assert load_features(tmp_path / "empty.h5").features.shape == (2, 96)
    os.mkfifo(tmp_path / "fifo.h5")  # size 0, like an empty file: it was replaced
    with pytest.raises(StoreError, match="is not a regular file"):
        extract_features(folder, BACKBONE, tmp_path / "fifo.h5", overwrite=True, **FAST)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.h5").st_mode)


def test_older_store_format_is_refused_before_loading_a_model(store, folder, tmp_path, no_model):
    old = tmp_path / "old.h5"
    old.write_bytes(store.read_bytes())
    with h5py.File(old, "r+") as f:
        f.attrs["format_version"] = 1
    with pytest.raises(ProvenanceError, match="store format 1 .* Rebuild it with --force"):
        extract_features(folder, BACKBONE, old, **FAST)
    with h5py.File(old, "r+") as f:
        f.attrs["format_version"] = f.attrs["format_version"] + 9
    with pytest.raises(ProvenanceError, match="store format 10 by a newer mr2-extract"):
        extract_features(folder, BACKBONE, old, **FAST)
    with pytest.raises(ProvenanceError, match="by a newer mr2-extract"):
        load_features(old)


@pytest.mark.parametrize(
    "kind",
    [int, float, lambda v: [float(v)], lambda v: np.full((1, 1), v, np.int64), str],
    ids=["int", "float", "[float]", "[[int]]", "text"],
)
def test_a_store_of_the_next_format_is_newer_and_never_to_be_rebuilt(tmp_path, kind):
    # One format above this version's is a newer store (not one to rebuild with --force,
    # which would delete what the newer version wrote). Written as a double (3.0), it was
    # loaded, and called older; written as an array of one ([3.0]) or as text ("3"), it
    # was loaded too (and text called "format 3 by an older mr2-extract").
    from extract._schema import FORMAT_VERSION, read_attrs
    from extract._store import check_format

    _foreign(tmp_path / "x.h5")
    with h5py.File(tmp_path / "x.h5", "a") as f:
        f.attrs["format_version"] = kind(FORMAT_VERSION + 1)
        attrs = read_attrs(f)
    with pytest.raises(
        ProvenanceError, match=rf"store format {FORMAT_VERSION + 1}(\.0)? by a newer"
    ) as error:
        check_format("f.h5", attrs)
    assert "--force" not in str(error.value)
    with pytest.raises(ProvenanceError, match="by a newer mr2-extract"):
        load_features(tmp_path / "x.h5")
    with h5py.File(tmp_path / "x.h5", "a") as f:  # this version's format, as an array too
        f.attrs["format_version"] = kind(FORMAT_VERSION)
        check_format("f.h5", read_attrs(f))


@pytest.mark.parametrize(
    "version",
    [[], [2, 3], [b"2", b"3"], "three", b"[3]", np.bool_(True), np.nan, np.complex128(3)]
    + [np.bytes_(b"\xff")],  # (not UTF-8: UnicodeDecodeError)
)
def test_a_store_whose_format_is_no_one_number_is_refused_as_such(tmp_path, version):
    # An array of other than one element names no format: it was loaded (a list passed
    # the newer-format check), and called older (to rebuild with --force) by extract. So
    # were text that is no number, a boolean, NaN and a complex number.
    from extract._schema import read_attrs
    from extract._store import check_format

    _foreign(tmp_path / "x.h5")
    with h5py.File(tmp_path / "x.h5", "a") as f:
        arrays = isinstance(version, list)
        f.attrs["format_version"] = (
            np.asarray(version, dtype=None if version else float) if arrays else version
        )
        attrs = read_attrs(f)
    match = "records its format_version as .*, not one number"
    with pytest.raises(ProvenanceError, match=match) as error:
        check_format("f.h5", attrs)
    assert "--force" not in str(error.value)
    with pytest.raises(ProvenanceError, match=match):
        load_features(tmp_path / "x.h5")


def test_complete_store_is_reused_and_says_so(store, folder, caplog):
    caplog.set_level(logging.INFO, logger="extract")
    extract_features(folder, BACKBONE, store, **FAST)
    assert "Reused the complete feature store" in caplog.text and "--force" in caplog.text
    # Its failures are said in that line, once: not warned of as this run's.
    assert "; 2 recorded as failed ('cat/corrupt.jpg'" in caplog.text
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


_HOLD_LOCK_AND_FORK = """
import os, sys, time
from extract._locks import store_lock
with store_lock(sys.argv[1]):
    if os.fork() == 0:  # a long-lived child, as a DataLoader worker is
        # Said by the child, so that the test goes on only once the child has dropped its
        # copy of the lock (at the fork): the parent's word came first, and a parent killed
        # before the child ran left the lock with it (seen on a loaded machine).
        print(os.getpid(), flush=True)
        time.sleep(120)
        os._exit(0)
    time.sleep(120)
"""


@pytest.mark.slow
def test_lock_dies_with_its_writer_not_with_its_children(tmp_path):
    out = tmp_path / "f.h5"
    parent = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK_AND_FORK, str(out)], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        with pytest.raises(StoreLockedError, match=f"another process \\(pid {parent.pid}\\)"):
            with store_lock(out):
                pass
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        os.kill(child, 0)  # the orphaned child still runs...
        with store_lock(out):  # ...and the next writer gets the lock at once
            pass
    finally:
        parent.kill()
        parent.wait()
        os.kill(child, signal.SIGKILL)


_FORK_AT_THE_FILE_LIMIT = """
import os, resource, sys
from extract._locks import _HELD_LOCKS, store_lock
said, tell = os.pipe()
with store_lock(sys.argv[1]):
    (lock,) = _HELD_LOCKS
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    filler = []
    try:  # every descriptor of the limit taken, as by many DataLoader workers' queues
        while True:
            filler.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    child = os.fork()
    if child == 0:
        kept = os.path.samestat(os.fstat(lock), os.stat(sys.argv[1] + ".lock"))
        os.write(tell, b"kept" if kept else b"dropped")
        os._exit(0)
    os.waitpid(child, 0)
    print(os.read(said, 16).decode())
"""


def test_a_child_forked_at_the_open_file_limit_drops_its_copy_of_the_lock(tmp_path):
    # At the fork the child points its copy of the lock at /dev/null, which it opened: at
    # the limit on open files (a parent starting many workers) it could not, printed a
    # traceback ("Exception ignored in: _release_locks_in_child") and kept the lock.
    run = subprocess.run(
        [sys.executable, "-c", _FORK_AT_THE_FILE_LIMIT, str(tmp_path / "f.h5")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "dropped\n", "")


def test_a_writer_on_another_host_is_named_with_its_host(tmp_path):
    # The lock file held a pid alone, looked for among this machine's processes: a writer
    # on another node sharing the file system was called "no longer running", and the
    # advice to find its process here invited deleting the lock.
    import socket

    from extract._locks import _lock_holder

    out = tmp_path / "f.h5"
    with store_lock(out):
        pass
    assert (tmp_path / "f.h5.lock").read_text() == f"{os.getpid()} {socket.gethostname()}"
    with pytest.MonkeyPatch.context() as patch:  # a host name may hold spaces
        patch.setattr(socket, "gethostname", lambda: "node 7")
        with store_lock(out):
            pass
        check_output(out)  # its own lock file is a lock file
    hold = (
        "import fcntl, sys, time; fh = open(sys.argv[1] + '.lock', 'a+'); "
        "fcntl.flock(fh, fcntl.LOCK_EX); fh.truncate(0); fh.write('4190001 node-b'); "
        "fh.flush(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(
            StoreLockedError, match=r"another process \(pid 4190001 on host node-b\)"
        ):
            with store_lock(out):
                pass
        assert _lock_holder(out) == "4190001 on host node-b"
    finally:
        holder.kill()
        holder.wait()


def test_16_bit_png_gives_the_features_of_its_8_bit_twin(tmp_path):
    grey = np.random.default_rng(2).integers(0, 256, (36, 40)).astype(np.uint8)
    for name in ("a", "b"):
        (tmp_path / "images" / name).mkdir(parents=True)
        Image.fromarray(grey, "L").save(tmp_path / "images" / name / "8bit.png")
        Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "images" / name / "16.png")
    out = extract_features(tmp_path / "images", BACKBONE, tmp_path / "f.h5", **FAST)
    loaded = load_features(out, in_memory=True)
    assert loaded.paths == ["a/16.png", "a/8bit.png", "b/16.png", "b/8bit.png"]
    np.testing.assert_allclose(loaded.features[0], loaded.features[1], rtol=1e-5, atol=1e-6)


def test_oversized_jpeg_is_a_failed_row_on_the_tensor_path(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the test images have 1440 pixels
    out = extract_features(folder, BACKBONE, tmp_path / "t.h5", decode="tensor", **FAST)
    loaded = load_features(out)
    reasons = dict(loaded.failures)
    assert "cat/001.jpg" in reasons and "cat/000.png" in reasons  # JPEG and PIL paths alike
    assert all("MAX_IMAGE_PIXELS" in reasons[p] for p in ("cat/001.jpg", "cat/000.png"))


def test_a_refused_retry_names_the_image_that_stops_it(tmp_path):
    # It named the repaired failed image, which the retry takes, not the done one that
    # changed too.
    folder, out = _store_with_a_repaired_failure(tmp_path, n_per_class=3)
    done = folder / "dog" / "002.jpg"  # after the failed dog/001.jpg
    _other_bytes_same_size(done)
    with pytest.raises(ProvenanceError, match=r"dog/002\.jpg. is not the file") as error:
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert "dog/001.jpg" not in str(error.value)
    with pytest.raises(ProvenanceError, match=r"dog/001\.jpg"):  # without --retry-failed
        extract_features(folder, BACKBONE, out, **FAST)


@pytest.mark.parametrize("retry", [True, False])
def test_a_retry_killed_before_removing_its_mark_is_tidied_by_the_next(
    tmp_path, monkeypatch, retry
):
    # Killed after the fingerprint, before the mark was removed: the next run found the
    # store up to date and left the mark in its metadata for good; a run without
    # --retry-failed still did, after it had extracted the repaired image.
    folder, out = _store_with_a_repaired_failure(tmp_path, n_per_class=3)

    def killed(attrs, name):
        raise KeyboardInterrupt  # the kill, as the mark was to be removed

    monkeypatch.setattr(h5py.AttributeManager, "__delitem__", killed)
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    monkeypatch.undo()
    # (the repaired row is to be extracted, as it was marked before the kill)
    with pytest.warns(UserWarning, match=r"Loading 5 completed rows of an incomplete store"):
        metadata = load_features(out, allow_incomplete=True).metadata  # (the store let go)
    assert "adopting_source_fingerprint" in metadata
    again = load_features(extract_features(folder, BACKBONE, out, retry_failed=retry, **FAST))
    assert not again.failures and "adopting_source_fingerprint" not in again.metadata


def test_a_finished_store_open_elsewhere_keeps_a_killed_retrys_mark_and_is_reused(tmp_path, caplog):
    # The mark's removal opened a finished store for writing: a store held open for
    # reading (a load_features handle) was refused instead of reused, as it was before.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    with h5py.File(out, "r+") as f:  # as a retry killed before it removed its mark left it
        f.attrs["adopting_source_fingerprint"] = f.attrs["source_fingerprint"]
    with load_features(out) as held, caplog.at_level(logging.INFO, logger="extract"):
        assert extract_features(folder, BACKBONE, out, **FAST) == out
        assert "adopting_source_fingerprint" in held.metadata
    # The error's sentence was nested in parentheses: "(... and run again.); a later run".
    [said] = [r.getMessage() for r in caplog.records if "keeps the mark" in r.getMessage()]
    assert said.endswith(
        "(store.close(), or leave its with block) and run again. A later run removes it."
    )
    # Once nothing holds it, the next run removes the mark.
    extract_features(folder, BACKBONE, out, **FAST)
    assert "adopting_source_fingerprint" not in load_features(out).metadata


def _new_store(path, n=3, dim=4, indices=None, **provenance):
    """An empty store of ``n`` rows, as extract_features creates one before any row."""
    from extract._store import create_store

    create_store(
        path, provenance={"format_version": 2} | provenance, record={}, dim=dim,
        dtype="float32", labels=np.zeros(n, int),
        indices=np.arange(n) if indices is None else indices,
        ids=[f"{i}.png" for i in range(n)], class_names=["x"], file_size=np.full(n, -1),
        file_mtime_ns=np.full(n, -1),
    )  # fmt: skip
    return path


def test_the_lock_file_holds_its_writer_s_record_alone_while_it_writes(tmp_path):
    # A longer record of an earlier writer (another host) kept its tail after this one's,
    # or this one's stayed in the buffer: a second writer read a wrong or no holder.
    import socket

    lock = tmp_path / "f.h5.lock"
    lock.write_text(f"4000000 {'a-much-longer-host-name.example.org' * 3}")
    with store_lock(tmp_path / "f.h5"):
        assert lock.read_text() == f"{os.getpid()} {socket.gethostname()}"


def test_force_never_replaces_an_hdf5_file_with_features_that_no_run_wrote(
    folder, tmp_path, no_model
):
    out = _foreign(tmp_path / "theirs.h5")  # features, labels, class_names; no format_version
    before = out.read_bytes()
    with pytest.raises(StoreError, match="is an HDF5 file but not a feature store"):
        extract_features(folder, BACKBONE, out, overwrite=True, **FAST)
    assert out.read_bytes() == before


def test_a_new_store_has_all_its_storage_before_any_row_is_written(tmp_path):
    # Storage allocated by the first write of a row changes HDF5 metadata mid-run: a run
    # killed then leaves a damaged file, not one to resume.
    path = _new_store(tmp_path / "f.h5")
    with h5py.File(path, "r") as f:
        for name in ("features", "status", "failure_reason", "content_sha256"):
            plist = f[name].id.get_create_plist()
            assert plist.get_alloc_time() == h5py.h5d.ALLOC_TIME_EARLY, name
            assert f[name].id.get_storage_size() >= f[name].size * f[name].dtype.itemsize, name


def test_a_preprocessing_that_differs_in_its_transform_alone_is_refused():
    # The transform's repr is left out of the listing only beside another difference.
    from extract._store import check_provenance

    stored = {"format_version": 2, "preprocessing": {"crop": [32, 32], "transform": "A()"}}
    request = stored | {"preprocessing": {"crop": [32, 32], "transform": "B()"}}
    with pytest.raises(ProvenanceError, match=r"preprocessing\.transform: file has 'A\(\)'"):
        check_provenance("f.h5", stored, request)


def test_a_failure_reason_of_the_field_s_size_is_kept_whole(tmp_path):
    from extract._store import write_rows

    path = _new_store(tmp_path / "f.h5")
    reason = "x" * 200
    with h5py.File(path, "r+") as f:
        write_rows(f, np.arange(3), np.ones((3, 4)), np.array([DONE, FAILED, DONE]),
                   ["", reason, ""], ["0" * 64] * 3)  # fmt: skip
    assert load_features(path).failures == [("1.png", reason)]


def test_a_store_of_other_weights_is_refused(store, folder, tmp_path):
    # Another checkpoint of the same backbone (fine-tuned, another seed) is another store.
    copy = _copy_with(store, tmp_path / "other.h5", weights="file:/ckpt/finetuned.pt sha256:0")
    with pytest.raises(ProvenanceError, match="weights: file has 'file:/ckpt/finetuned.pt"):
        extract_features(folder, BACKBONE, copy, **FAST)


def test_rows_written_apart_go_to_their_own_positions_only(tmp_path):
    # A retry writes the failed rows, scattered among done ones.
    from extract._store import write_rows

    path = _new_store(tmp_path / "f.h5", n=5)
    with h5py.File(path, "r+") as f:
        write_rows(f, np.array([1, 3]), np.full((2, 4), 7.0), np.array([DONE, DONE]),
                   ["", ""], ["a" * 64, "b" * 64])  # fmt: skip
        assert f["status"][:].tolist() == [PENDING, DONE, PENDING, DONE, PENDING]
        assert (f["features"][[1, 3]] == 7).all() and (f["features"][[0, 2, 4]] == 0).all()
        assert f["content_sha256"][:].tolist() == [b"", b"a" * 64, b"", b"b" * 64, b""]


@pytest.mark.parametrize("before", [PENDING, FAILED])
def test_rows_are_marked_done_only_after_their_data_is_flushed(before):
    # A run killed between the two must leave rows pending, never done with no features;
    # a retry's failed rows are marked pending first (killed after their new reason was
    # written, they stayed failed with it, and a rerun took the store as complete).
    from extract._store import write_rows

    events = []

    class Dataset:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, key):
            return np.full(2, before, np.uint8)

        def __setitem__(self, key, value):
            events.append(self.name)

    class File(dict):
        def flush(self):
            events.append("flush")

    names = ("features", "failure_reason", "content_sha256", "status")
    write_rows(File({n: Dataset(n) for n in names}), np.arange(2), np.ones((2, 4)),
               np.array([DONE, DONE]), ["", ""], ["0" * 64] * 2)  # fmt: skip
    if before == FAILED:
        assert events[:2] == ["status", "flush"]
        del events[:2]
    assert sorted(events[:3]) == sorted(names[:3])
    assert events[3:] == ["flush", "status", "flush"]


@pytest.mark.parametrize(
    "datasets, match",
    [
        # Six feature rows and five labels loaded as a complete store, rows misaligned.
        (dict(features=np.zeros((6, 4)), labels=[0] * 5), r"'labels' has shape \(5,\) for 6"),
        # A label one past the last class name.
        (dict(features=np.zeros((2, 4)), labels=[0, 1]), r"'labels' holds values outside 0..0"),
        (dict(features=np.zeros((2, 4)), labels=[0, -1]), r"'labels' holds values outside 0..0"),
    ],
)
def test_labels_that_do_not_fit_the_features_or_classes_are_refused(tmp_path, datasets, match):
    path = _hdf5(tmp_path / "x.h5", class_names=["a"], **datasets)
    with pytest.raises(NotAStoreError, match=match):
        load_features(path)


def test_a_group_in_place_of_a_required_dataset_is_no_store(tmp_path):
    path = _hdf5(tmp_path / "x.h5", features=np.zeros((2, 4)), class_names=["a"])
    with h5py.File(path, "a") as f:
        f.create_group("labels")
    with pytest.raises(NotAStoreError, match="it has no 'labels' dataset"):
        load_features(path)


def test_an_incomplete_store_loads_its_done_rows_with_their_source_items(tmp_path):
    # A subset (--per-class, max_items) holds source items 4, 9, 12, 20; row 2 is pending.
    from extract._store import write_rows

    path = _new_store(tmp_path / "f.h5", n=4, indices=np.array([4, 9, 12, 20]))
    with h5py.File(path, "r+") as f:
        write_rows(f, np.array([0, 1, 3]), np.ones((3, 4)), np.array([DONE, FAILED, DONE]),
                   ["", "unreadable", ""], ["0" * 64] * 3)  # fmt: skip
    with pytest.warns(
        UserWarning, match=r"Loading 2 completed rows of an incomplete store \(1 row pending\)"
    ):
        loaded = load_features(path, allow_incomplete=True)
    assert loaded.indices.tolist() == [4, 20] and loaded.paths == ["0.png", "3.png"]
    assert loaded.failures == [("1.png", "unreadable")]  # the pending row is no failure
    loaded.close()


def test_a_merge_never_replaces_a_file_that_it_did_not_write(store, folder, tmp_path):
    shards = _two_shards(folder, tmp_path / "f.h5", max_items=4)
    # The output: a user's file, not a store (--force replaces stores only).
    notes = tmp_path / "notes.h5"
    notes.write_text("my notes")
    with pytest.raises(StoreError, match="never replaced"):
        merge_shards(shards, notes, overwrite=True)
    assert notes.read_text() == "my notes"
    # <out>.merging: a store, but no merge's leftover (it records no merged_from).
    merging = tmp_path / "m.h5.merging"
    shutil.copy(store, merging)
    with pytest.raises(StoreError, match="m.h5.merging' exists and is not a merged store"):
        merge_shards(shards, tmp_path / "m.h5")
    assert merging.read_bytes() == store.read_bytes()


def test_a_merged_store_is_the_single_run_s_store_digests_and_provenance_included(
    store, folder, tmp_path
):
    # The merge left content_sha256 empty, or recorded rank 0's row count as n_rows: a
    # single-process run on the merged store then refused it.
    shards = _two_shards(folder, tmp_path / "f.h5")
    merged = merge_shards(shards, tmp_path / "merged.h5")
    with h5py.File(merged, "r") as m, h5py.File(store, "r") as s:
        for name in ("content_sha256", "failure_reason", "status", "indices", "labels"):
            np.testing.assert_array_equal(m[name][:], s[name][:], err_msg=name)
        assert m.attrs["n_rows"] == m.attrs["n_total_rows"] == len(s["status"])
    before = merged.read_bytes()
    extract_features(folder, BACKBONE, merged, **FAST)  # reused, not refused
    assert merged.read_bytes() == before


def _shard(path, rank, indices, n_total, dim=4):
    """A complete shard of rank ``rank`` of 2 holding the source rows ``indices``."""
    from extract._store import write_rows

    n = len(indices)
    _new_store(path, n=n, dim=dim, indices=np.asarray(indices), backbone="b",
               source_fingerprint="sha256:s", n_rows=n, n_total_rows=n_total, shard_rank=rank,
               shard_world_size=2, dtype="float32",
               source_options={"image": "jpg", "label": "cls"})  # fmt: skip
    with h5py.File(path, "r+") as f:
        f["paths"][:] = [f"{i}.png" for i in indices]
        write_rows(f, np.arange(n), np.repeat(np.asarray(indices, float)[:, None], dim, 1),
                   np.full(n, DONE), [""] * n, [f"{i:064d}" for i in indices])  # fmt: skip
    return path


def test_shards_of_uneven_parts_merge_each_row_to_its_place(tmp_path):
    # Rank 0 holds two tar shards, rows 0-1 and 3-5, rank 1 a shard of one row between.
    a = _shard(tmp_path / "a.h5", 0, [0, 1, 3, 4, 5], 6)
    b = _shard(tmp_path / "b.h5", 1, [2], 6)
    merged = merge_shards([a, b], tmp_path / "m.h5")
    with load_features(merged, in_memory=True) as loaded:
        np.testing.assert_array_equal(loaded.features[:, 0], np.arange(6))
        assert loaded.paths == [f"{i}.png" for i in range(6)]
        assert loaded.metadata["source_options"] == {"image": "jpg", "label": "cls"}
    with h5py.File(merged, "r") as f:
        assert f["content_sha256"][:].tolist() == [f"{i:064d}".encode() for i in range(6)]


def test_shards_that_miss_a_row_of_the_source_are_not_merged(tmp_path):
    a = _shard(tmp_path / "a.h5", 0, [0, 2], 4)
    b = _shard(tmp_path / "b.h5", 1, [1], 4)  # row 3 is in neither
    with pytest.raises(ValueError, match="hold 3 rows for a source of 4"):
        merge_shards([a, b], tmp_path / "m.h5")
    assert not (tmp_path / "m.h5").exists()


def test_a_writer_on_this_host_is_named_by_its_pid_alone(tmp_path):
    # A record of this very host named it as another host's, and a dead writer of this
    # host was then not said to be dead.
    import fcntl
    import socket

    lock = tmp_path / "f.h5.lock"
    with open(lock, "w") as held:  # another open file description: flock refuses the next
        held.write(f"{os.getpid()} {socket.gethostname()}")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StoreLockedError) as info:
            with store_lock(tmp_path / "f.h5"):
                pass
    assert f"(pid {os.getpid()});" in str(info.value) and "on host" not in str(info.value)
    assert str(info.value).startswith(f"The feature store {str(tmp_path / 'f.h5')!r} is being")


def test_shards_are_named_as_documented():
    assert shard_path("out/features.h5", 1, 4) == Path("out/features.shard-00001-of-00004.h5")


def test_a_batch_of_jpegs_alone_is_decoded_on_the_tensor_path(tmp_path):
    # A batch whose readable images are all JPEGs (none decoded by PIL in the workers) is
    # decoded on the tensor path, as PIL decodes it; the unreadable image is recorded as failed.
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 255, (36, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i:03d}.jpg")
    (tmp_path / "data" / "cat" / "bad.jpg").write_bytes(b"not an image")
    folder = tmp_path / "data"
    pil = extract_features(folder, BACKBONE, tmp_path / "p.h5", decode="pil", **FAST)
    tensor = extract_features(folder, BACKBONE, tmp_path / "t.h5", decode="tensor", **FAST)
    pil, tensor = load_features(pil, in_memory=True), load_features(tensor, in_memory=True)
    assert [p for p, _ in tensor.failures] == [p for p, _ in pil.failures] == ["cat/bad.jpg"]
    np.testing.assert_allclose(
        tensor.features, pil.features, atol=0.05 * np.abs(pil.features).max()
    )
    # Resized by torchvision, not by PIL: the store's "tensor" is what made its rows.
    assert (tensor.features != pil.features).any(axis=1).all()


def test_tensor_decoding_of_a_transform_that_does_not_crop_at_the_centre_is_pil_s(
    folder, tmp_path, monkeypatch
):
    # Only a resize and a centre crop have a tensor twin: a squashing transform's images are
    # decoded by PIL, and the store records it so.
    from extract import _backbones

    squash = functools.partial(_backbones._timm_data, crop_mode="squash")  # (as some tags do)
    monkeypatch.setattr(_backbones, "_timm_data", squash)
    pil = extract_features(folder, BACKBONE, tmp_path / "p.h5", decode="pil", **FAST)
    tensor = extract_features(folder, BACKBONE, tmp_path / "t.h5", decode="tensor", **FAST)
    pil, tensor = load_features(pil, in_memory=True), load_features(tensor, in_memory=True)
    assert tensor.metadata["preprocessing"] == pil.metadata["preprocessing"]
    assert pil.metadata["preprocessing"]["mode"] == "squash"
    assert pil.metadata["preprocessing"]["decode"] == "pil"
    np.testing.assert_array_equal(tensor.features, pil.features)


def test_a_cpu_store_holds_the_float32_forward_pass(tmp_path):
    # A CPU run computes in float32, as the store's "compute" records, not in bfloat16
    # autocast: its features are the model's own forward pass, to float32 rounding.
    from extract._backbones import create_backbone

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    path = extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    loaded = load_features(path, in_memory=True)
    assert loaded.metadata["compute"] == "float32"
    backbone = create_backbone(BACKBONE, image_size=32, device="cpu")
    src = image_folder(folder)
    x = torch.stack([backbone.transform(load_image(src, i)) for i in range(len(src))])
    with torch.inference_mode():
        expected = backbone.model(x).float().numpy()
    np.testing.assert_allclose(
        loaded.features, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max()
    )


def test_a_label_changed_in_a_list_is_named_as_such(tmp_path):
    # A label changed in a list file is named as such (the image, and its label in the request
    # and in the store), not as an image that moved in the source.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    lines = ["cat/000.png,cat", "cat/001.jpg,cat", "dog/000.png,dog", "dog/001.jpg,dog"]
    (folder / "list.csv").write_text("\n".join(lines) + "\n")
    out = extract_features(folder / "list.csv", BACKBONE, tmp_path / "f.h5", **FAST)
    lines[1] = "cat/001.jpg,dog"
    (folder / "list.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ProvenanceError,
        match=r"cat/001\.jpg' is labelled 'dog' in the request but 'cat' in the store",
    ):
        extract_features(folder / "list.csv", BACKBONE, out, **FAST)


def test_a_progress_bar_is_shown_unless_asked_otherwise(tmp_path, capsys):
    # A progress bar is shown by default and hidden by progress=False; a resumed run starts it
    # at the rows already done.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    fast = {k: v for k, v in FAST.items() if k != "progress"}
    out = extract_features(folder, BACKBONE, tmp_path / "f.h5", **fast)
    err = capsys.readouterr().err
    assert max(int(n) for n in re.findall(r"(\d+)/4\b", err)) == 4
    with h5py.File(out, "r+") as f:
        f["status"][3:] = PENDING  # the last row to extract again
    extract_features(folder, BACKBONE, out, **fast)
    counts = [int(n) for n in re.findall(r"(\d+)/4\b", capsys.readouterr().err)]
    assert counts and min(counts) == 3 and max(counts) == 4  # starts at the 3 rows done
    extract_features(folder, BACKBONE, tmp_path / "g.h5", progress=False, **fast)
    assert "/4" not in capsys.readouterr().err


def test_a_source_without_images_is_refused(tmp_path):
    # A source without images (a list file with its header alone) is refused, and no empty
    # store is left behind.
    (tmp_path / "list.csv").write_text("path,label\n")
    out = tmp_path / "f.h5"
    with pytest.raises(ValueError, match="holds no images"):
        extract_features(tmp_path / "list.csv", BACKBONE, out, **FAST)
    assert not out.exists()


def _merged_then_repaired(tmp_path, n_per_class: int) -> tuple[Path, Path, list[Path]]:
    """``(folder, out, shards)``: ``out`` merged from two ranks' shards, deleted since, its
    image dog/001.jpg recorded as failed and repaired since."""
    folder = make_image_folder(tmp_path / "data", n_per_class=n_per_class, special=False)
    image = folder / "dog" / "001.jpg"
    good = image.read_bytes()
    image.write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    shards = _two_shards(folder, out)
    merge_shards(shards, out)
    image.write_bytes(good)
    for shard in shards:
        shard.unlink()
    return folder, out, shards


def test_a_torchrun_retry_after_the_shards_were_deleted_takes_rows_from_the_merged_store(
    tmp_path, monkeypatch
):
    # A torchrun retry after its shards were deleted seeds each new shard from the merged store
    # (every one of its rows, and the recorded versions) and extracts the repaired image alone.
    # torchrun's two ranks run here one by one, in this process.
    folder, out, _ = _merged_then_repaired(tmp_path, n_per_class=3)
    with h5py.File(out, "r+") as f:  # a done row marked: taken from the merged store
        marked = f["paths"].asstr()[:].tolist().index("cat/001.jpg")
        f["features"][marked] = 7.0
        f.attrs["versions"] = json.dumps({"torch": "1.0"})
    merges = _ranks_without_merge(monkeypatch)
    written = _spy_writes(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert written == [1]  # the repaired image alone is extracted
    assert [rank for rank, _, _ in merges] == [0, 1]
    repair = merges[0][2]
    assert repair is not None
    repair()  # what rank 0 does before its merge
    with h5py.File(out, "r") as f:
        # The repaired row is to be extracted until the merge: left failed, with the old
        # reason under the new file's identity, a run killed here left a store that a
        # plain rerun reused as complete, the shards never merged.
        assert f["status"][f["paths"].asstr()[:].tolist().index("dog/001.jpg")] == PENDING
    merge_shards([shard_path(out, r, 2) for r in (0, 1)], out, overwrite=True)
    merged = load_features(out, in_memory=True)
    assert not merged.failures and merged.metadata["versions"] == {"torch": "1.0"}
    assert (merged.features[merged.paths.index("cat/001.jpg")] == 7.0).all()
    alone = dict(rank=0, world_size=1)  # WORLD_SIZE is still 2 here
    single = extract_features(folder, BACKBONE, tmp_path / "one.h5", **alone, **FAST)
    single = load_features(single, in_memory=True)
    keep = [k for k, p in enumerate(single.paths) if p != "cat/001.jpg"]
    np.testing.assert_allclose(merged.features[keep], single.features[keep], rtol=1e-5, atol=1e-6)


def test_a_torchrun_retry_killed_before_its_merge_is_merged_by_a_plain_rerun(tmp_path, monkeypatch):
    # docs/extract.md: a run killed between taking the repairs into the merged store and
    # the merge leaves it incomplete, and a plain rerun merges the shards. The repairs
    # changed the store, whose shards had gone into its version before: the rerun made
    # every shard anew, every row extracted again.
    import torch.distributed as dist

    from extract import _ranks

    folder, image, good, out, fast, shards = _two_rank_store(tmp_path, broken=True)
    image.write_bytes(good)
    monkeypatch.setenv("WORLD_SIZE", "2")
    _ranks_one_by_one(monkeypatch)
    monkeypatch.setattr(dist, "barrier", lambda: None)
    written = _spy_writes(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    monkeypatch.setenv("RANK", "0")
    with monkeypatch.context() as patch:  # rank 0 killed in its merge, after the repairs
        patch.setattr(_ranks, "_merge", lambda *args, **kwargs: _interrupt())
        with pytest.raises(KeyboardInterrupt):
            extract_features(folder, BACKBONE, out, retry_failed=True, **fast)
    assert written == [1]  # the repaired image
    with pytest.raises(IncompleteStoreError):
        load_features(out)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, **fast)
    assert written == [1]  # the shards merged as they were
    merged = load_features(out, in_memory=True)
    alone = dict(rank=0, world_size=1)  # WORLD_SIZE is still 2 here
    single = load_features(extract_features(folder, BACKBONE, tmp_path / "one.h5", **alone, **fast))
    assert not merged.failures and merged.paths == single.paths
    np.testing.assert_allclose(merged.features, single.features[:], atol=1e-5)


def _interrupt():
    raise KeyboardInterrupt


@_SHARDS_READ_KNOWINGLY
def test_a_torchrun_retry_on_a_full_disk_is_refused_before_it_seeds_its_shard(
    tmp_path, monkeypatch
):
    # A shard seeded from the merged store takes the versions the merged store records, an
    # attribute written again, which HDF5 puts at the end of the file: on a disk the new
    # shard had filled, that write failed and left the shard unreadable.
    from extract import _runner, _store

    folder, out, shards = _merged_then_repaired(tmp_path, n_per_class=2)
    _ranks_without_merge(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    usage, create = shutil.disk_usage(tmp_path), _runner._open_or_create
    with monkeypatch.context() as patch:

        def filling(*args):
            create(*args)
            patch.setattr(_store.shutil, "disk_usage", lambda _: usage._replace(free=4096))

        patch.setattr(_runner, "_open_or_create", filling)
        # (not "the store is left as it was": it is removed)
        removed = r"4 KiB free; .* again \(the shard, made for it, is removed: the next run"
        with pytest.raises(StoreError, match=r"No space left to update .*" + removed):
            extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert not shards[1].exists()  # made for the seed alone: the next run seeds it again
    written = _spy_writes(monkeypatch)
    extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert written == [1]  # the repaired image alone is extracted
    assert not load_features(shards[1]).failures


def test_a_torchrun_retry_extracts_again_a_transient_failure_of_a_complete_store(
    tmp_path, monkeypatch
):
    # The image unchanged (a read error that passed): the merged store is complete, and
    # --retry-failed is what makes its ranks read the failed image again, not reuse it.
    from extract import _images

    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    read_file = _images.read_file

    def flaky(path, listed=None):
        if path.endswith("dog/001.jpg"):
            raise OSError(errno.EIO, "Input/output error")
        return read_file(path, listed)

    monkeypatch.setattr(_images, "read_file", flaky)
    out = tmp_path / "f.h5"
    merge_shards(_two_shards(folder, out), out)
    assert [path for path, _ in load_features(out, in_memory=True).failures] == ["dog/001.jpg"]
    monkeypatch.setattr(_images, "read_file", read_file)  # the file system recovers
    _ranks_without_merge(monkeypatch)
    written = _spy_writes(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        extract_features(folder, BACKBONE, out, retry_failed=True, **FAST)
    assert written == [1]  # the failed image alone, by the rank that holds it
    merge_shards([shard_path(out, r, 2) for r in (0, 1)], out, overwrite=True)
    assert not load_features(out, in_memory=True).failures


@pytest.fixture
def workers_asked(monkeypatch) -> list[int]:
    """The worker count each DataLoader of the test is made with, in turn; none is started
    (the rows are read in the test's process all the same)."""
    real, asked = torch.utils.data.DataLoader, []

    def spy(*args, num_workers=0, **kwargs):
        asked.append(num_workers)
        return real(*args, num_workers=0, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", spy)
    return asked


def test_the_default_worker_count_leaves_one_cpu_to_the_main_process(
    tmp_path, monkeypatch, workers_asked
):
    # By default the loader has min(8, cpu_count - 1) workers, as documented: one CPU is left
    # to the main process. The CPUs are those the process may run on: given one core of a
    # 64-core machine (Slurm, taskset), it started 8 workers there, which torch warned of.
    asked = workers_asked
    folder = make_image_folder(tmp_path / "data", n_per_class=5, special=False)
    # (10 batches: more than the workers of any count here)
    fast = {k: v for k, v in FAST.items() if k != "num_workers"} | {"batch_size": 1}
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    for cpus, expected in ((3, 2), (1, 0), (32, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)), False)
        extract_features(folder, BACKBONE, tmp_path / f"{cpus}.h5", **fast)
        assert asked[-1] == expected
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (macOS, Windows)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    extract_features(folder, BACKBONE, tmp_path / "no-affinity.h5", **fast)
    assert asked[-1] == 2


def test_no_more_workers_start_than_there_are_batches_to_load(tmp_path, workers_asked):
    # torch only warns of workers beyond the CPUs: --workers 100000 on a folder of 10
    # images forked workers until the machine ran out of memory. A worker without a
    # batch has nothing to do; on a resume, the batches are those of the rows left.
    folder = make_image_folder(tmp_path / "data", n_per_class=3)  # 10 images, 2 unreadable
    out = tmp_path / "f.h5"
    extract_features(folder, BACKBONE, out, **FAST | {"num_workers": 100_000})
    assert workers_asked == [3]  # 10 rows in batches of 4
    assert len(load_features(out).failures) == 2
    extract_features(folder, BACKBONE, out, retry_failed=True, **FAST | {"num_workers": 7})
    assert workers_asked[-1] == 1  # the 2 failed rows alone: one batch
    extract_features(
        folder, BACKBONE, out, retry_failed=True, **FAST | {"num_workers": 7, "batch_size": 1}
    )
    assert workers_asked[-1] == 2


def test_fashion_mnist_images_are_extracted_from_memory(tmp_path):
    # Fashion-MNIST images are extracted from the pixels held in memory, not read as files
    # (there is no file 'test/00000'); the store's digests are those of the pixels.
    rng = np.random.default_rng(0)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (6, 28, 28)), np.arange(6) % 10)
    out = extract_features(f"fashion-mnist:test@{tmp_path}", BACKBONE, tmp_path / "f.h5", **FAST)
    loaded = load_features(out, in_memory=True)
    assert not loaded.failures and len(loaded.paths) == 6
    assert np.abs(loaded.features).sum(axis=1).min() > 0
    pixels = fashion_mnist("test", tmp_path).pixels
    with h5py.File(out, "r") as f:
        digests = [d.decode() for d in f["content_sha256"][:]]
    assert digests == [hashlib.sha256(p.tobytes()).hexdigest() for p in pixels]


def test_failed_images_are_counted_in_a_warning(tmp_path, caplog):
    # A run with failed images ends with a warning that says how many were recorded as failed.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    (folder / "cat" / "bad.jpg").write_bytes(b"not an image")
    caplog.set_level(logging.WARNING, logger="extract")
    extract_features(folder, BACKBONE, tmp_path / "f.h5", **FAST)
    assert "1 image was recorded in" in caplog.text and "as failed" in caplog.text


def test_failures_under_torchrun_are_warned_of_once_as_the_merged_store_s(
    tmp_path, monkeypatch, caplog
):
    # Each rank warned of its own failures in its shard ("1 image was recorded in
    # f.shard-00001-of-00002.h5 as failed"), a file the user never asked for.
    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    (folder / "cat" / "bad.jpg").write_bytes(b"")  # row 2: rank 0's
    (folder / "dog" / "bad.jpg").write_bytes(b"not an image")  # row 5: rank 1's
    out = tmp_path / "f.h5"
    _ranks_one_by_one(monkeypatch)

    def merge_on_rank0(out, rank, n, overwrite, repair, step):  # no group: the ranks one by one
        return merge_shards([shard_path(out, r, n) for r in range(n)], out) if rank == 0 else out

    monkeypatch.setattr(_runner, "_merge_on_rank0", merge_on_rank0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    caplog.set_level(logging.WARNING, logger="extract")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert extract_features(folder, BACKBONE, out, **FAST) == out
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "shard-" not in warnings[0], warnings
    assert warnings[0].startswith(f"1 image was recorded in {out} as failed")
    assert "('cat/bad.jpg': UnidentifiedImageError: " in warnings[0]


def test_failures_of_every_rank_are_counted_together(monkeypatch):
    import torch.distributed as dist

    from extract._ranks import _all_ranks_failures, _ShardStep

    ranks = [(2, [(4, "c.png", "E: z"), (8, "e.png", "E: w")]), (1, [(1, "b.jpg", "E: y")])]

    def gathered(into, mine):
        assert mine == (None, ranks[0])  # rank 0's own, not failed
        into[:] = [(None, failed) for failed in ranks]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr("extract._ranks.all_gather_object", gathered)
    assert _all_ranks_failures(ranks[0], _ShardStep(Path("f.h5"), 2)) == (
        3, [(1, "b.jpg", "E: y"), (4, "c.png", "E: z"), (8, "e.png", "E: w")]
    )  # fmt: skip


def test_a_lock_that_outlives_its_dead_writer_says_what_holds_it(tmp_path):
    # The writer of this host is no longer running, yet its lock is held (by a process it
    # started): said so, with the command that finds that process; no reader waits on it.
    import fcntl
    import socket

    from extract._locks import _lock_holder

    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid names no running process
    lock = tmp_path / "f.h5.lock"
    with open(lock, "w") as held:  # another open file description: flock refuses the next
        held.write(f"{finished.pid} {socket.gethostname()}")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(
            StoreLockedError, match=rf"its writer \(pid {finished.pid}\) is no longer running"
        ) as info:
            with store_lock(tmp_path / "f.h5"):
                pass
        assert _lock_holder(tmp_path / "f.h5") is None
    assert f"`fuser -v {lock}`" in str(info.value)


def test_a_lock_that_fails_for_another_reason_is_never_skipped(tmp_path, monkeypatch):
    # Only a file system without locks lets HDF5_USE_FILE_LOCKING=FALSE write without
    # one; any other failure of flock (an I/O error) is refused.
    import fcntl

    def failing_flock(fh, operation):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", failing_flock)
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "FALSE")
    with pytest.raises(StoreError, match=r"Cannot lock .*s\.h5\.lock.*: Input/output error\.$"):
        with store_lock(tmp_path / "s.h5"):
            pass


def _damage(store, path, name):
    """A copy of ``store`` whose dataset ``name`` was deleted, cut short or given a code
    that is no row state."""
    path.write_bytes(store.read_bytes())
    with h5py.File(path, "r+") as f:
        if name == "status=7":
            f["status"][0] = 7
        elif name == "short status":
            status = f["status"][:-1]
            del f["status"]
            f["status"] = status
        elif name.startswith("empty "):  # (an empty dataspace: h5py.Empty)
            del f[name.removeprefix("empty ")]
            f[name.removeprefix("empty ")] = h5py.Empty("u1")
        else:
            del f[name]
    return path


@pytest.mark.parametrize(
    "name, match",
    [
        ("status", "it has no 'status' dataset"),
        ("content_sha256", "it has no 'content_sha256' dataset"),
        ("failure_reason", "it has no 'failure_reason' dataset"),
        ("labels", "it has no 'labels' dataset"),
        ("short status", r"'status' has shape \(13,\) for 14 feature rows"),
        ("status=7", r"'status' holds codes \[7\], not 0, 1, 2"),
        # (said to have "shape None")
        (
            "empty status",
            r"'status' is an empty dataspace \(h5py.Empty: no rows\) for 14 feature rows",
        ),
        ("empty features", r"'features' is an empty dataspace \(h5py.Empty: no rows\)"),
    ],
)
@pytest.mark.parametrize("pending", [False, True])
def test_a_store_missing_a_dataset_is_not_resumed(store, folder, tmp_path, name, match, pending):
    # A store whose 'status' was deleted raised h5py's KeyError when a run resumed it (so
    # did one without 'content_sha256' or 'failure_reason' with rows pending); one without
    # 'labels' was reused as complete, and loaded by no one.
    out = _damage(store, tmp_path / "f.h5", name)
    if pending and name not in ("status", "empty status"):
        with h5py.File(out, "r+") as f:
            f["status"][1:3] = PENDING
    with pytest.raises(NotAStoreError, match=rf"is inconsistent: {match}; pass --force"):
        extract_features(folder, BACKBONE, out, **FAST)
    if name == "status" and not pending:  # as the error says
        extract_features(folder, BACKBONE, out, overwrite=True, **FAST)
        assert len(load_features(out).labels) == 12  # (2 failed)


@pytest.mark.parametrize("name", ["status", "failure_reason", "indices", "paths"])
def test_a_store_of_mr2_extract_missing_a_dataset_is_not_loaded(store, tmp_path, name):
    # Without 'status' its pending and failed rows were loaded as extracted (zeros);
    # without 'indices' or 'paths' they were made up as its row numbers. (Its cure in the
    # words a resume gives it, not "rebuild it (mr2-extract with --force)".)
    out = _damage(store, tmp_path / "f.h5", name)
    match = rf"has no '{name}' dataset; pass --force \(overwrite=True\) to delete it and recompute"
    with pytest.raises(NotAStoreError, match=match):
        load_features(out)


@pytest.mark.parametrize("name", ["status", "content_sha256", "paths"])
def test_a_shard_missing_a_dataset_is_not_merged(folder, tmp_path, name):
    # merge_shards raised h5py's KeyError ("object 'status' doesn't exist").
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, max_items=4)
    with h5py.File(shards[1], "r+") as f:
        del f[name]
    # (said to pass --force (overwrite=True) to delete it: merge_shards' overwrite is the
    # merged store's, and the shard was refused again)
    match = rf"^The shard .*: it has no '{name}' dataset; extract its rank again with --force"
    for overwrite in (False, True):
        with pytest.raises(NotAStoreError, match=match):
            merge_shards(shards, out, overwrite=overwrite)
    assert not out.exists()


@pytest.mark.parametrize(
    "version, match",
    [
        (1, r"^The shard .* store format 1 .* Extract its rank again with --force"),
        # A newer one (or one of no number) was told to 'write to another output path',
        # where the output path is the merged store's.
        (99, r"^The shard .* format 99 by a newer .*, or extract its rank again with --force"),
        ("three", r"^The shard .* 'three', not one number.*, or extract its rank again with"),
    ],
)
def test_a_shard_of_another_store_format_is_not_merged_naming_its_rank(
    folder, tmp_path, version, match
):
    # Said to be a feature store to rebuild with --force (overwrite=True): merge_shards'
    # overwrite is the merged store's, and the shard was refused again.
    out = tmp_path / "merged.h5"
    shards = _two_shards(folder, out, max_items=4)
    with h5py.File(shards[1], "r+") as f:
        f.attrs["format_version"] = version
    for overwrite in (False, True):
        with pytest.raises(ProvenanceError, match=match):
            merge_shards(shards, out, overwrite=overwrite)
    assert not out.exists()
    # As it says: the rank extracted again, the shards merge.
    extract_features(
        folder, BACKBONE, out, max_items=4, rank=1, world_size=2, overwrite=True, **FAST
    )
    assert len(load_features(merge_shards(shards, out)).labels) == 4
