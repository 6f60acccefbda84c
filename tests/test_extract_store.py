"""Extraction into the HDF5 store: schema, failures, provenance, locking, loading, shards."""

import json

import h5py
import numpy as np
import pytest

pytest.importorskip("timm")

from extract import (  # noqa: E402
    IncompleteStoreError,
    ProvenanceError,
    StoreLockedError,
    extract_features,
    load_features,
    merge_shards,
    shard_path,
)
from extract._store import DONE, FAILED, PENDING, store_lock  # noqa: E402
from extract._testing import make_image_folder  # noqa: E402

BACKBONE = "timm:test_resnet"
FAST = dict(batch_size=4, num_workers=0, image_size=32, progress=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("images") / "data", n_per_class=5)


@pytest.fixture(scope="module")
def store(folder, tmp_path_factory):
    return extract_features(folder, BACKBONE, tmp_path_factory.mktemp("out") / "f.h5", **FAST)


def test_schema_and_provenance(store):
    with h5py.File(store, "r") as f:
        n = 14  # 2 classes x 5 images + 4 special files
        assert f["features"].shape == (n, 96) and f["features"].dtype == np.float32
        assert f["features"].chunks is not None
        assert f["labels"].dtype == np.int64 and f["indices"][:].tolist() == list(range(n))
        assert list(f["class_names"].asstr()[:]) == ["cat", "dog"]
        assert set(f["status"][:]) == {DONE, FAILED}
        assert f.attrs["backbone"] == "timm:test_resnet"
        assert f.attrs["weights"] == "random-init:seed0"
        assert f.attrs["dtype"] == "float32" and not f.attrs["normalize"]
        pre = json.loads(f.attrs["preprocessing"])
        assert pre["crop"] == [32, 32] and pre["mean"] == [0.5, 0.5, 0.5]
        assert pre["decode"] == "pil"
        versions = json.loads(f.attrs["versions"])
        assert {"torch", "timm", "open_clip_torch", "h5py"} <= set(versions)
        assert json.loads(f.attrs["class_names"]) == ["cat", "dog"]


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
    "change, key",
    [
        (dict(backbone="timm:test_vit"), "backbone"),
        (dict(dtype="float16"), "dtype"),
        (dict(normalize=True), "normalize"),
        (dict(image_size=48), "preprocessing"),
        (dict(max_items=6), "source_fingerprint"),
    ],
)
def test_different_provenance_is_refused(store, folder, change, key):
    kwargs = FAST | {"backbone": BACKBONE} | change
    with pytest.raises(ProvenanceError, match=rf"(?s)different provenance.*{key}: file has"):
        extract_features(folder, out=store, **kwargs)


def test_second_writer_gets_a_clear_error(folder, tmp_path):
    out = tmp_path / "f.h5"
    with store_lock(out), pytest.raises(StoreLockedError, match="another process"):
        extract_features(folder, BACKBONE, out, **FAST)
    assert not out.exists()


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


def test_tensor_decoding_matches_pil(store, folder, tmp_path):
    # A worker process ships the undecoded JPEG bytes to the main process.
    tensor_fast = FAST | dict(num_workers=1)
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
        (dict(decode="gpu"), "'decode' parameter"),
        (dict(batch_size=0), "'batch_size' parameter"),
        (dict(rank=2, world_size=2), "rank must be in"),
        (dict(max_items=0), "holds no images"),
    ],
)
def test_invalid_arguments(folder, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        extract_features(folder, BACKBONE, tmp_path / "x.h5", **(FAST | kwargs))


def test_tiny_open_clip_extraction(folder, tmp_path):
    pytest.importorskip("open_clip")
    from extract._testing import register_tiny_open_clip

    name = register_tiny_open_clip(tmp_path)
    out = extract_features(folder, f"open_clip:{name}", tmp_path / "c.h5", normalize=True, **FAST)
    loaded = load_features(out, in_memory=True)
    assert loaded.features.shape == (12, 32) and loaded.metadata["normalize"] is True
    assert loaded.metadata["backbone"] == f"open_clip:{name}"
    assert "MaybeConvertMode" in loaded.metadata["preprocessing"]["transform"]
    np.testing.assert_allclose(np.linalg.norm(loaded.features, axis=1), 1, rtol=1e-5)


def test_leftover_temporary_file_from_a_killed_creation_is_replaced(folder, tmp_path):
    out = tmp_path / "f.h5"
    (tmp_path / "f.h5.tmp").write_bytes(b"half-written by a killed run")
    extract_features(folder, BACKBONE, out, max_items=4, **FAST)
    assert not (tmp_path / "f.h5.tmp").exists()
    assert load_features(out).features.shape == (4, 96)


def test_not_a_store_is_a_clear_error(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"not hdf5")
    with pytest.raises(OSError, match="Cannot open the feature store"):
        load_features(tmp_path / "x.h5")


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
    from extract._store import _truncate

    reason = "OSError: cannot identify image file '/data/фото/" + "я" * 200
    cut = _truncate(reason)
    assert len(cut) <= 200
    assert reason.startswith(cut.decode("utf-8"))  # cut between characters
