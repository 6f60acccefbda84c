"""The fit data's blocks and sources (mr2_probe._data): block sizes, HDF5 rows and minibatches;
the check of missing labels that every entry taking labels makes."""

import os
import re
from decimal import Decimal

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV, TunedOffsetsClassifierCV
from mr2_probe._data import as_given, check_no_missing_labels
from mr2_probe.front import accuracy_front
from mr2_probe.metrics import (
    class_groups,
    classwise_summary,
    group_accuracy,
    per_class_accuracy,
    worst_class_scorer,
)
from mr2_probe.report import classwise_report
from tests._alarm import fails_after_waiting

from .test_classifier import _blobs


@pytest.mark.parametrize(
    "n_features, n_classes, expected",
    [(64, 10, 2**17), (1, 2, 2**22), (2**13, 3, 1024), (2**20, 3, 256)],
)
def test_block_rows_keeps_a_block_near_8m_elements(n_features, n_classes, expected):
    # A block holds about 2²³ elements (at least 256 rows): much larger blocks would read an
    # HDF5 store whole and allocate logits for all its rows at once.
    from mr2_probe._data import block_rows

    assert block_rows(n_features, n_classes) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (1.23456789, "1.23456789"),
        (1e-320, "1e-320"),
        (2000, "2000"),
        # NaN reads back as no number of digits: next() raised StopIteration.
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
        (np.float32(1e-7), "1e-07"),  # (compared in float32)
        # A long double whose bits no float64 holds: StopIteration too; 17 digits.
        (np.longdouble(1) / 3, f"{1 / 3:.17g}"),
    ],
)
def test_a_value_is_written_as_given(value, expected):
    assert as_given(value) == expected


def test_fit_data_rows_refuses_an_hdf5_store(tmp_path):
    # FitData.rows refuses an HDF5 store with a TypeError that points to row_blocks(), not an
    # AttributeError from deep inside; row_blocks reads the rows asked for, in sorted order.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        data = MR2LinearClassifier(device="cpu")._prepare(f.create_dataset("X", data=X), y, None)
        with pytest.raises(TypeError, match="row_blocks"):
            data.rows(np.arange(3))
        ((where, block),) = [(w, b) for w, b in data.row_blocks(np.array([5, 1, 30]))]
        np.testing.assert_array_equal(where, [1, 0, 2])
        np.testing.assert_allclose(block.numpy(), X[[1, 5, 30]].astype(np.float64))


def test_stored_rows_read_a_run_of_rows_not_its_whole_block(tmp_path, monkeypatch):
    # The batched folds read an HDF5 store in runs of their own block's rows, fewer than the
    # store's block when the folds' logits are wide: each run read the whole block it falls
    # in (a store of one block read whole once per run, 8 times over here).
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _data

    X, y = _blobs(n=400)
    spans = []

    def read_h5(dataset, key):
        spans.append(key.stop - key.start)
        return dataset[key]

    monkeypatch.setattr(_data, "read_h5", read_h5)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        data = MR2LinearClassifier(device="cpu")._prepare(f.create_dataset("X", data=X), y, None)
        assert data.source.rows >= 400  # one block
        stored = _data.StoredRows(data)
        runs = [stored[i : i + 50] for i in range(0, 400, 50)]
        held = list(data.row_blocks(np.array([7, 3, 20])))
    np.testing.assert_array_equal(torch.cat(runs).numpy(), X.astype(np.float64))
    np.testing.assert_array_equal(held[0][1].numpy(), X[[3, 7, 20]].astype(np.float64))
    assert spans == [50] * 8 + [18]


@pytest.mark.parametrize("batch_size", [7, 64])
def test_hdf5_minibatches_are_non_empty_and_hold_every_row_once(tmp_path, batch_size):
    # An HDF5 source's minibatches hold every row once and are never empty (a step on no
    # rows), in every block and not only the first.
    h5py = pytest.importorskip("h5py")
    from mr2_probe._data import H5Source

    X = np.arange(200 * 3, dtype=np.float64).reshape(200, 3)
    y = torch.arange(200) % 2
    w = torch.ones(200, dtype=torch.float64)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        source = H5Source(
            f.create_dataset("X", data=X, chunks=(16, 3)), y, w, 48, "cpu", torch.float64
        )
        assert source.rows == 48
        batches = list(source.batches(batch_size, torch.Generator().manual_seed(0)))
    sizes = [len(b[0]) for b in batches]
    assert 0 < min(sizes) and max(sizes) <= batch_size
    rows = torch.cat([b[0][:, 0] for b in batches]).numpy() / 3
    np.testing.assert_array_equal(np.sort(rows), np.arange(200))


@pytest.mark.parametrize("batch_size", [10, 100])
def test_hdf5_minibatches_are_full_and_mix_rows_from_across_the_file(tmp_path, batch_size):
    # Blocks were shuffled whole: a store written class by class gave batches of one or
    # two classes each (fits that stopped early at a worse solution), every block ended
    # in a short batch, and no batch was larger than a block.
    h5py = pytest.importorskip("h5py")
    from mr2_probe._data import H5Source

    n = 6000
    X = np.arange(n, dtype=np.float64)[:, None]
    y = torch.arange(n) // 600  # ten classes, one after another
    w = torch.ones(n, dtype=torch.float64)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        source = H5Source(
            f.create_dataset("X", data=X, chunks=(20, 1)), y, w, 60, "cpu", torch.float64
        )
        batches = list(source.batches(batch_size, torch.Generator().manual_seed(0)))
    sizes = [len(b[0]) for b in batches]
    assert sizes == [batch_size] * (n // batch_size)  # (a block holds 60 rows here)
    rows = torch.cat([b[0][:, 0] for b in batches]).numpy()
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))
    classes = [len(torch.unique(b[1])) for b in batches]
    assert np.mean(classes) >= (1.9 if batch_size == 10 else 4)


@pytest.mark.parametrize("chunks", [(200, 1), (120, 3)])
def test_hdf5_chunks_taller_than_a_block_are_read_a_block_at_a_time(tmp_path, chunks):
    # Reads were whole chunks: a store chunked by column ((n, 1)), or in chunks of more
    # rows than a block, was read into memory whole at each pass and each minibatch epoch.
    h5py = pytest.importorskip("h5py")
    from mr2_probe._data import H5Source

    X = np.arange(200 * 3, dtype=np.float64).reshape(200, 3)
    y = torch.arange(200) % 2
    w = torch.ones(200, dtype=torch.float64)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        dataset = f.create_dataset("X", data=X, chunks=chunks, compression="gzip")
        source = H5Source(dataset, y, w, 48, "cpu", torch.float64)
        blocks = [x for x, _, _ in source.chunks()]
        batches = [x for x, _, _ in source.batches(16, torch.Generator().manual_seed(0))]
    assert max(map(len, blocks)) == 48
    np.testing.assert_array_equal(torch.cat(blocks).numpy(), X)
    assert max(map(len, batches)) == 16 and len(batches) == -(-200 // 16)
    np.testing.assert_array_equal(np.sort(torch.cat(batches)[:, 0].numpy()), X[:, 0])


def folds_of(pairs):
    """A splitter that yields the given (train, test) pairs."""

    class Given:
        def split(self, X, y=None):
            yield from pairs

    return Given()


@pytest.mark.parametrize("index", [40, 41, -41])
def test_fold_indices_past_either_end_are_refused(index):
    # Row n is one past the last: read as a row it failed deep inside (a torch index error,
    # or a weight array one longer than the samples), not as the cv's fault.
    from mr2_probe._data import cv_folds

    X, y = _blobs(n=40)
    folds = [(np.r_[np.arange(1, 39), index], np.array([0]))]
    with pytest.raises(IndexError, match=f"cv gave the index {index}, outside the 40 samples"):
        cv_folds(folds_of(folds), X, y)
    last = cv_folds(folds_of([(np.array([39, -40]), np.array([-1]))]), X, y)
    np.testing.assert_array_equal(last[0][0], [39, 0])
    np.testing.assert_array_equal(last[0][1], [39])


def test_row_blocks_of_an_hdf5_store_put_every_row_in_its_place(tmp_path, monkeypatch):
    # Blocks of 8 rows, rows asked out of order (one twice), some the first of their
    # block: each comes back once, from its own block, at its position in the request.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _fit_inputs

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 8)
    X, y = _blobs(n=40)
    rows = np.array([8, 3, 16, 9, 0, 23, 39, 8])
    with h5py.File(tmp_path / "X.h5", "w") as f:
        data = MR2LinearClassifier(device="cpu")._prepare(f.create_dataset("X", data=X), y, None)
        assert data.source.rows == 8
        got = np.full((len(rows), X.shape[1]), np.nan)
        for where, block in data.row_blocks(rows):
            assert np.isnan(got[where]).all()
            got[where] = block.numpy()
    np.testing.assert_array_equal(got, X[rows])


@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_a_fit_read_in_small_blocks_is_the_fit_read_whole(monkeypatch, head):
    # Blocks of 7 rows, the last one short: every row is in exactly one block, so the
    # statistics and the loss, and with them the model, are those of the rows read at once.
    from mr2_probe import _fit_inputs

    X, y = _blobs(n=60)
    params = dict(head=head, device="cpu", max_iter=500)
    whole = MR2LinearClassifier(**params).fit(X, y)
    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 7)
    blocks = MR2LinearClassifier(**params).fit(X, y)
    np.testing.assert_allclose(blocks.class_stats_["mean"], whole.class_stats_["mean"])
    np.testing.assert_allclose(blocks.coef_, whole.coef_, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("n", [200, 203])
@pytest.mark.parametrize("batch_size", [7, 64])
def test_hdf5_minibatch_rows_keep_their_own_label_and_weight(tmp_path, batch_size, n):
    # Each row's label and weight travel with it, through the shuffled pieces, the
    # shuffle within a buffer and the rows carried into the next buffer; 200 rows are 25
    # pieces of 8, the last buffer as full as the others (its short batch still comes).
    h5py = pytest.importorskip("h5py")
    from mr2_probe._data import H5Source

    X = np.repeat(np.arange(n, dtype=np.float64)[:, None], 2, axis=1)
    y = torch.arange(n) % 5
    w = torch.arange(n, dtype=torch.float64) + 0.5
    with h5py.File(tmp_path / "X.h5", "w") as f:
        source = H5Source(
            f.create_dataset("X", data=X, chunks=(8, 2)), y, w, 40, "cpu", torch.float64
        )
        batches = list(source.batches(batch_size, torch.Generator().manual_seed(0)))
        blocks = list(source.chunks())
    for x, labels, weights in batches + blocks:
        row = x[:, 0]
        torch.testing.assert_close(labels, row.long() % 5)
        torch.testing.assert_close(weights, row + 0.5)
    rows = torch.cat([b[0][:, 0] for b in batches]).numpy()
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))


def test_a_weighted_fit_of_an_hdf5_store_is_that_of_the_array(tmp_path, monkeypatch):
    # The store is read in blocks of 16 rows: each block's sample weights are its own
    # rows', as the in-memory fit weighs them.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _fit_inputs

    X, y = _blobs(n=80)
    weight = np.random.default_rng(0).uniform(0.1, 3.0, size=len(y))
    params = dict(device="cpu", tol=1e-6, max_iter=500)
    in_memory = MR2LinearClassifier(**params).fit(X, y, sample_weight=weight)
    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 16)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        stored = f.create_dataset("X", data=X, chunks=(16, X.shape[1]))
        streamed = MR2LinearClassifier(**params).fit(stored, y, sample_weight=weight)
    np.testing.assert_allclose(streamed.class_stats_["mean"], in_memory.class_stats_["mean"])
    np.testing.assert_allclose(streamed.coef_, in_memory.coef_, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("stored", [False, True])
def test_a_fold_s_rows_keep_their_own_weights(tmp_path, stored):
    # A fold's training rows keep their labels and sample weights, and its weight sum (the
    # penalty's scale, ½‖W‖² / (C·Σw)) is theirs: a row drawn twice counts twice. A store's
    # fold holds its rows in the fold's order too, read from the file (it held every row,
    # the others weighted zero: other minibatches and sums than in memory).
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    weight = np.arange(1.0, 41.0)
    rows = np.array([5, 1, 30, 30, 12])
    with h5py.File(tmp_path / "X.h5", "w") as f:
        features = f.create_dataset("X", data=X) if stored else X
        data = MR2LinearClassifier(device="cpu")._prepare(features, y, weight)
        fold = data.subset(rows)
        assert fold.weight_sum == weight[rows].sum()
        assert fold.source.n_samples == len(rows)
        ((x, labels, w),) = fold.source.chunks()
        held = np.sort(rows) if stored else rows  # (a store's in the file's order)
        np.testing.assert_array_equal(x.numpy(), X[held])
        np.testing.assert_array_equal(w.numpy(), weight[held])
        np.testing.assert_array_equal(labels.numpy(), data.y_index[held])


def test_a_store_s_shuffled_fold_is_read_in_the_file_s_order(tmp_path, monkeypatch):
    # A fold's rows in another order than the file's (ShuffleSplit's) had each block of
    # them read from across the file: a pass over the fold read every block of the file
    # once per block of the fold, a minibatch epoch once per piece. In the file's order,
    # either reads each stored row at most once.
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _data, _fit_inputs

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: 1024)
    read = []
    monkeypatch.setattr(_data, "read_h5", lambda X, key: read.append(X[key]) or read[-1])
    X, y = _blobs(n=2048)
    X[:, 0] = np.arange(2048)  # each row's index
    rows = np.random.default_rng(0).permutation(2048)[:1600]
    with h5py.File(tmp_path / "X.h5", "w") as f:
        data = MR2LinearClassifier(device="cpu")._prepare(f.create_dataset("X", data=X), y, None)
        source = data.subset(rows).source
        read.clear()
        drawn = torch.cat([x[:, 0] for x, _, _ in source.chunks()]).numpy()
        assert sum(map(len, read)) <= 2048  # (4,087 rows)
        read.clear()
        batches = list(source.batches(8, torch.Generator().manual_seed(0)))
        assert sum(map(len, read)) <= 2048  # (76,710 rows)
    np.testing.assert_array_equal(drawn, np.sort(rows))
    batched = torch.cat([x[:, 0] for x, _, _ in batches]).numpy().astype(int)
    np.testing.assert_array_equal(np.sort(batched), np.sort(rows))
    labels = torch.cat([labels for _, labels, _ in batches]).numpy()
    np.testing.assert_array_equal(labels, data.y_index[batched])


@pytest.mark.parametrize("block", [16, 1024])
def test_a_store_s_fold_draws_the_minibatches_of_its_own_rows(tmp_path, monkeypatch, block):
    # A fold of a store holds its own rows (it held all, the others weighted zero): each
    # once an epoch, with its label and weight. Where one buffer holds them (blocks of
    # 1024 rows), the batches of the same rows in memory, from the same draws (the pieces'
    # order, drawn though one buffer read them all in order, moved the generator on).
    h5py = pytest.importorskip("h5py")
    from mr2_probe import _fit_inputs

    monkeypatch.setattr(_fit_inputs, "block_rows", lambda n_features, n_classes: block)
    X, y = _blobs(n=200)
    X[:, 0] = np.arange(200)  # each row's index
    weight = np.arange(1.0, 201.0)
    rows = np.arange(0, 200, 3)
    batches = {}
    with h5py.File(tmp_path / "X.h5", "w") as f:
        for features in (X, f.create_dataset("X", data=X, chunks=(4, X.shape[1]))):
            data = MR2LinearClassifier(device="cpu")._prepare(features, y, weight)
            source = data.subset(rows).source
            batches[features is X] = list(source.batches(8, torch.Generator().manual_seed(0)))
    drawn = torch.cat([x[:, 0] for x, _, _ in batches[False]]).numpy().astype(int)
    np.testing.assert_array_equal(np.sort(drawn), rows)
    np.testing.assert_array_equal(torch.cat([b[1] for b in batches[False]]), data.y_index[drawn])
    np.testing.assert_array_equal(torch.cat([b[2] for b in batches[False]]), weight[drawn])
    if block == 1024:
        for stored, memory in zip(batches[False], batches[True], strict=True):
            for a, b in zip(stored, memory, strict=True):
                np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("method", ["fit", "predict"])
def test_an_hdf5_dataset_whose_external_file_is_cut_short_is_refused(tmp_path, method):
    # Rows kept in an external raw data file (h5py's external=) that was cut short: HDF5
    # reads the bytes past its end as zeros without an error, and the probe fitted (or
    # predicted) on zero rows without a word. A missing file is named as such, and a folder
    # in its place as a folder.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    raw = tmp_path / "rows.raw"
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", X.shape, X.dtype, external=[(str(raw), 0, X.nbytes)])[...] = X
        call = (
            (lambda: MR2LinearClassifier(device="cpu").fit(f["X"], y))
            if method == "fit"
            else (lambda: fitted.predict(f["X"]))
        )
        call()  # whole: read as it is
        raw.write_bytes(raw.read_bytes()[: X.nbytes // 2])
        name = re.escape(repr(str(raw)))
        cut = rf"external file {name} \({X.nbytes // 2} of its {X.nbytes} bytes\), which is cut"
        with pytest.raises(ValueError, match=cut):
            call()
        raw.unlink()
        with pytest.raises(ValueError, match=rf"external file {name}, which is not there"):
            call()
        raw.mkdir()  # a folder in its place: said to be "not there"
        with pytest.raises(ValueError, match=rf"external file {name}, which is a folder, not a"):
            call()


def test_a_folder_in_place_of_a_large_external_file_is_said_to_be_a_folder(tmp_path):
    # Rows taking more bytes than a folder's size (4,096 on ext4): the folder's size must not
    # be taken for the file's, which said it was cut short.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    X = np.tile(X.astype(np.float32), (40, 1))  # (1,600 rows: 38,400 bytes)
    raw = tmp_path / "rows.raw"
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", X.shape, X.dtype, external=[(str(raw), 0, X.nbytes)])[...] = X
        raw.unlink()
        raw.mkdir()
        assert os.path.getsize(raw) < X.nbytes
        name = re.escape(repr(str(raw)))
        with pytest.raises(ValueError, match=rf"external file {name}, which is a folder, not a"):
            fitted.predict(f["X"])


@pytest.mark.parametrize("method", ["fit", "predict"])
def test_a_pipe_in_place_of_an_external_file_is_refused_before_any_read(tmp_path, method):
    # A FIFO where the rows' external file should be: HDF5's read waited for a writer, for
    # ever (a file of its size 0 was refused as cut short, before folders were told apart).
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    raw = tmp_path / "rows.raw"
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_dataset("X", X.shape, X.dtype, external=[(str(raw), 0, X.nbytes)])[...] = X
        raw.unlink()
        os.mkfifo(raw)
        name = re.escape(repr(str(raw)))
        with fails_after_waiting(10, "the estimator waited for a writer to the FIFO"):
            with pytest.raises(ValueError, match=rf"external file {name}, which is not a regular"):
                if method == "fit":
                    MR2LinearClassifier(device="cpu").fit(f["X"], y)
                else:
                    fitted.predict(f["X"])


def test_an_hdf5_dataset_s_external_files_past_its_rows_are_not_its_own(tmp_path):
    # A file past the rows, whose offset lies beyond its end (an extendible dataset's next,
    # not yet written): HDF5 reads none of it, and the fit was refused as cut short.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    (tmp_path / "later.raw").write_bytes(b"x")
    external = [(str(tmp_path / "rows.raw"), 0, X.nbytes)]
    external += [(str(tmp_path / "later.raw"), 8, h5py.h5f.UNLIMITED)]
    with h5py.File(tmp_path / "X.h5", "w") as f:
        try:
            X_h5 = f.create_dataset("X", X.shape, X.dtype, maxshape=(None, 6), external=external)
        except ValueError as error:  # HDF5 1.12 (the floors): no chunked external layout
            pytest.skip(f"this HDF5 cannot make an extendible external dataset: {error}")
        X_h5[...] = X
        fitted = MR2LinearClassifier(device="cpu").fit(f["X"], y)
        np.testing.assert_array_equal(fitted.predict(f["X"]), fitted.predict(X))


@pytest.mark.parametrize("method, fill", [("fit", 0), ("predict", 0), ("fit", -1)])
def test_an_hdf5_virtual_dataset_whose_source_is_missing_is_refused(tmp_path, method, fill):
    # A virtual dataset (shards joined by an HDF5 VDS) passed to the estimator itself, one of
    # its source files deleted: HDF5 reads those rows as the fill value (zeros) without an
    # error, and the probe fitted (or predicted) on them without a word. load_features
    # refused it; the estimator's own path did not.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    layout = h5py.VirtualLayout(shape=X.shape, dtype=X.dtype)
    for part, rows in enumerate((slice(0, 20), slice(20, 40))):
        with h5py.File(tmp_path / f"part{part}.h5", "w") as f:
            f["x"] = X[rows]
        layout[rows] = h5py.VirtualSource(str(tmp_path / f"part{part}.h5"), "x", shape=(20, 6))
    fitted = MR2LinearClassifier(device="cpu").fit(X, y)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_virtual_dataset("X", layout, fillvalue=fill)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        call = (
            (lambda: MR2LinearClassifier(device="cpu").fit(f["X"], y))
            if method == "fit"
            else (lambda: fitted.predict(f["X"]))
        )
        call()  # whole: read as it is
        (tmp_path / "part1.h5").unlink()
        source = re.escape(repr(str(tmp_path / "part1.h5")))
        with pytest.raises(ValueError, match=rf"virtual dataset whose source {source} \(dataset"):
            call()
        # Its fill value as it is (it was called 'fill values (zeros)' whatever it was).
        assert (f["X"][20:] == fill).all()
        with pytest.raises(ValueError, match=rf"reads its rows as the fill value \({fill}.0\),"):
            call()


@pytest.mark.parametrize(
    "select, chunks, then",
    [
        ("rows", (5, 6), r"reads the rows past its end as its fill values, without an error"),
        ("rows", None, r"reads the rows past its end from whatever follows it in its file"),
        # Said to be read as zeros without an error, where HDF5 raises.
        ("whole", (5, 6), r"fails to read the virtual dataset"),
        ("whole", None, r"fails to read the virtual dataset"),
    ],
)
def test_an_hdf5_virtual_dataset_whose_source_is_short_is_refused(tmp_path, select, chunks, then):
    # Its source written again with fewer rows: HDF5 read the rows mapped past its end as
    # the fill value (zeros), without an error, and the probe fitted on them without a
    # word (a mapping of the whole source: h5py's OSError, called a damaged file).
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    layout = h5py.VirtualLayout(shape=X.shape, dtype=X.dtype)
    source = h5py.VirtualSource(str(tmp_path / "part.h5"), "x", shape=X.shape)
    layout[...] = source[:40] if select == "rows" else source
    with h5py.File(tmp_path / "part.h5", "w") as f:
        f.create_dataset("x", data=X[:30], chunks=chunks)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_virtual_dataset("X", layout, fillvalue=0)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        if chunks and select == "rows":  # (as it says)
            assert (f["X"][30:] == 0).all()
        else:
            with pytest.raises(OSError):
                f["X"][()]
        with pytest.raises(ValueError, match=r"\(dataset 'x'\) has shape \(30, 6\), short of the"):
            MR2LinearClassifier(device="cpu").fit(f["X"], y)
        with pytest.raises(ValueError, match=rf"mapped from it, and HDF5 {then}"):
            MR2LinearClassifier(device="cpu").fit(f["X"], y)


def test_a_short_contiguous_source_followed_by_data_is_said_to_be_read_from_it(tmp_path):
    # Its rows in one piece, another dataset after them in its file: HDF5 reads the rows
    # mapped past its end from the bytes after them, without an error (it was said to fail).
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=40)
    X = X.astype(np.float32)
    layout = h5py.VirtualLayout(shape=X.shape, dtype=X.dtype)
    layout[...] = h5py.VirtualSource(str(tmp_path / "part.h5"), "x", shape=X.shape)[:40]
    with h5py.File(tmp_path / "part.h5", "w") as f:
        f["x"] = X[:30]
        f["after"] = np.full((100, 6), 7.0, np.float32)
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_virtual_dataset("X", layout, fillvalue=0)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        f["X"][()]  # (no error: whatever lies past its rows in its file)
        with pytest.raises(ValueError, match="past its end from whatever follows it in its file"):
            MR2LinearClassifier(device="cpu").fit(f["X"], y)


def test_an_hdf5_virtual_dataset_placing_whole_sources_every_other_row_is_read(tmp_path):
    # A whole source placed every other row was called short of the rows between its first
    # and last place ((59, 6) for 30 rows): the dataset, all of whose rows are there, was
    # refused; only the rows placed are taken from it.
    h5py = pytest.importorskip("h5py")
    X, y = _blobs(n=60)
    X = X.astype(np.float32)
    layout = h5py.VirtualLayout(shape=X.shape, dtype=X.dtype)
    for start in (0, 1):
        with h5py.File(tmp_path / f"part{start}.h5", "w") as f:
            f["x"] = X[start::2]
        source = h5py.VirtualSource(str(tmp_path / f"part{start}.h5"), "x", shape=(30, 6))
        layout[start::2] = source
    with h5py.File(tmp_path / "X.h5", "w") as f:
        f.create_virtual_dataset("X", layout, fillvalue=0)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        np.testing.assert_array_equal(f["X"][()], X)
        MR2LinearClassifier(device="cpu").fit(f["X"], y)
    # Written again with half its rows, it is short of the 30 rows placed (not of 1, a
    # block's, nor of the 59 between its first and last place).
    with h5py.File(tmp_path / "part1.h5", "w") as f:
        f["x"] = X[1::4]
    with h5py.File(tmp_path / "X.h5", "r") as f:
        with pytest.raises(ValueError, match=r"has shape \(15, 6\), short of the \(30, 6\) mapped"):
            MR2LinearClassifier(device="cpu").fit(f["X"], y)


# ----------------------------------------------------------------------- missing labels
_TEXT = np.array(["cat", "dog", "emu"] * 4)  # 12 labels; the missing one goes at position 5
_X = np.random.default_rng(0).normal(size=(12, 3)) + np.eye(3)[np.arange(12) % 3]


_NULLABLE = {"Int64": [0, 1, 2] * 4, "Float64": [0.5, 1.5, 2.5] * 4, "boolean": [True, False] * 6}


def _with_missing(kind: str):
    """``_TEXT`` with a missing label at position 5, as a user passes it."""
    pd = pytest.importorskip("pandas") if "Series" in kind or "array" in kind else None
    dtype = kind.split()[0]
    if dtype == "category":  # numbers as categories, one missing
        labels = [0.0, 1.0, 2.0] * 4
        labels[5] = float("nan")
        return pd.Series(labels, dtype="category")
    if kind.endswith("array NA") or dtype in _NULLABLE:  # pandas' nullable dtypes
        labels = list(_NULLABLE.get(dtype, _TEXT.tolist()))
        labels[5] = pd.NA
        return pd.Series(labels, dtype=dtype) if "Series" in kind else pd.array(labels, dtype)
    labels = _TEXT.tolist()
    missing = {
        "NaN": float("nan"),
        "float32": np.float32("nan"),
        "None": None,
        "sNaN": Decimal("sNaN"),
        "Decimal": Decimal("NaN"),
    }
    labels[5] = missing[kind.split()[-1]]
    if kind.startswith("tuple"):
        return tuple(labels)
    if kind.startswith("object Series"):
        return pd.Series(labels, dtype=object)
    if kind.startswith("string Series"):
        return pd.Series(labels, dtype="string")  # (None is pd.NA there)
    return labels


def _classes(y):
    """Three classes, the missing one at position 2: labels 3, 4 and 5."""
    return y.iloc[3:6] if hasattr(y, "iloc") else y[3:6]


@pytest.fixture(scope="module")
def fitted():
    y = _TEXT
    return {
        "probe": MR2LinearClassifier(device="cpu").fit(_X, y),
        "cv": MR2LinearClassifierCV(Cs=2, cv=2, device="cpu").fit(_X, y),
        "tuned": TunedOffsetsClassifierCV(LogisticRegression(), cv=2).fit(_X, y),
    }


_PROBE = MR2LinearClassifier(device="cpu", max_iter=5)
# Each entry that takes labels: (how it is called with labels y, the argument it names).
_ENTRIES = {
    "MR2LinearClassifier.fit": (lambda y, m: MR2LinearClassifier(device="cpu").fit(_X, y), "y"),
    "MR2LinearClassifierCV.fit": (
        lambda y, m: MR2LinearClassifierCV(Cs=2, cv=2, device="cpu").fit(_X, y),
        "y",
    ),
    "TunedOffsetsClassifierCV.fit": (
        lambda y, m: TunedOffsetsClassifierCV(LogisticRegression(), cv=2).fit(_X, y),
        "y",
    ),
    "MR2LinearClassifier.score": (lambda y, m: m["probe"].score(_X, y), "y"),
    "MR2LinearClassifierCV.score": (lambda y, m: m["cv"].score(_X, y), "y"),
    "TunedOffsetsClassifierCV.score": (lambda y, m: m["tuned"].score(_X, y), "y"),
    "scorer": (lambda y, m: worst_class_scorer(m["probe"], _X, y), "y_true"),
    "y_true": (lambda y, m: per_class_accuracy(y, _TEXT), "y_true"),
    "y_pred": (lambda y, m: per_class_accuracy(_TEXT, y), "y_pred"),
    "labels=": (lambda y, m: per_class_accuracy(_TEXT, _TEXT, labels=_classes(y)), "labels"),
    "class_groups labels=": (
        lambda y, m: class_groups(_TEXT, _TEXT, labels=_classes(y)),
        "labels",
    ),
    "groups": (
        lambda y, m: classwise_summary(
            _TEXT, _TEXT, groups=dict(zip(_classes(y), ["easy", "medium", "hard"], strict=True))
        ),
        "groups",
    ),
    "groups_by_label": (
        lambda y, m: group_accuracy(
            _TEXT, _TEXT, dict(zip(_classes(y), ["easy", "medium", "hard"], strict=True))
        ),
        "groups_by_label",
    ),
    "report y": (lambda y, m: classwise_report({"erm": _TEXT}, y), "y"),
    "report predictions": (
        lambda y, m: classwise_report({"erm": y}, _TEXT),
        "The predictions of model 'erm' cannot be scored against y: Input y_pred",
    ),
    "report labels=": (
        lambda y, m: classwise_report({"erm": _TEXT}, _TEXT, labels=_classes(y)),
        "labels",
    ),
    "front y": (lambda y, m: accuracy_front(_PROBE, _X, y, _X, _TEXT), "y"),
    "front y_val": (lambda y, m: accuracy_front(_PROBE, _X, _TEXT, _X, y), "y_val"),
    "front y_test": (
        lambda y, m: accuracy_front(_PROBE, _X, _TEXT, _X, _TEXT, X_test=_X, y_test=y),
        "y_test",
    ),
}


@pytest.mark.parametrize(
    "kind",
    [
        "list NaN",
        "tuple float32",
        "object Series NaN",
        "list None",
        "string Series None",
        # pandas' nullable dtypes: NumPy reads pd.NA of "Int64" and "Float64" as NaN among
        # floats, which was "Input y contains NaN", naming neither pd.NA nor its position.
        "Int64 Series NA",
        "Int64 array NA",
        "Float64 array NA",
        "boolean array NA",
        "string[python] array NA",
        # A missing category among numbers: NumPy reads it as NaN among floats too.
        "category Series NaN",
        # A Decimal's NaN is a missing label; its signalling NaN was a TypeError from
        # hashing it ("Cannot hash a signaling NaN value").
        "list Decimal NaN",
        "list Decimal sNaN",
    ],
)
@pytest.mark.parametrize("entry", list(_ENTRIES))
def test_a_missing_label_is_refused_by_name_and_position_at_every_entry(fitted, entry, kind):
    # A list's NaN among text was the class 'nan' (NumPy's conversion), scored or fitted
    # without a word; a pandas column's NaN was "Input contains NaN" (no argument, no
    # position) or a TypeError sorting the classes; None and pd.NA were named without a
    # position, and among labels= were "Mix of label input types (string and None)".
    call, name = _ENTRIES[entry]
    if kind.endswith("sNaN") and entry.startswith("groups"):
        pytest.skip("a dict cannot hold a signalling NaN: it refuses to be hashed")
    y = _with_missing(kind)
    pandas = kind.startswith("string") or kind.endswith(" NA")
    what = "pd.NA" if pandas else "None" if "None" in kind else "NaN"
    classes = entry.endswith(("labels=", "groups", "groups_by_label"))
    n, position = (3, 2) if classes else (12, 5)
    prefix = name if name.startswith("The") else f"Input {name}"
    match = rf"^{re.escape(prefix)} holds 1 missing label \({what}\) among its {n}, at "
    with pytest.raises(ValueError, match=rf"{match}position {position}, which is no class: "):
        call(y, fitted)


def test_pd_na_of_a_nullable_column_is_counted_where_it_is():
    # As a table's column (a position in two dimensions), alone, and not at all.
    pd = pytest.importorskip("pandas")
    table = pd.DataFrame({"y": pd.array([1, 2, pd.NA, pd.NA], dtype="Int64")})
    match = r"^Input y holds 2 missing labels \(pd.NA\) among its 4, the first at position \(2, 0\)"
    with pytest.raises(ValueError, match=match):
        check_no_missing_labels(table)
    with pytest.raises(ValueError, match=r"^Input y holds only missing labels \(pd.NA\)"):
        check_no_missing_labels(pd.array([pd.NA, pd.NA], dtype="Int64"))
    read = check_no_missing_labels(pd.Series([1, 2], dtype="Int64"))
    np.testing.assert_array_equal(read, [1, 2])
    # A Decimal's signalling NaN among unhashable labels too, each label looked at.
    with pytest.raises(ValueError, match=r"^Input y holds 1 missing label \(NaN\) among its 3"):
        check_no_missing_labels(np.array([[1], Decimal("sNaN"), [2]], dtype=object))


@pytest.mark.parametrize(
    "columns, what",
    [
        ({"a": ("Int64", [1, None, 3]), "b": ("float64", [1.0, 2.0, np.nan])}, "NaN and pd.NA"),
        ({"a": ("Int64", [1, 2, 3]), "b": (object, ["x", None, "y"])}, "None"),
        ({"a": ("category", [1.0, None, 2.0]), "b": (object, ["x", None, "y"])}, "NaN and None"),
        (
            {"a": ("Int64", [1, 2, None]), "b": ("datetime64[s]", ["2024-01-01", None, None])},
            "NaT and pd.NA",
        ),
    ],
    ids=["Int64 and float", "Int64 and objects", "category and objects", "Int64 and dates"],
)
def test_a_table_s_missing_labels_are_each_named_by_their_own_kind(columns, what):
    # A table mixing a nullable column with others named every missing value pd.NA: a
    # float column's NaN, an object column's None. (Refused later as not 1-D anyway.)
    pd = pytest.importorskip("pandas")
    table = pd.DataFrame({k: pd.Series(v, dtype=dtype) for k, (dtype, v) in columns.items()})
    with pytest.raises(ValueError, match=rf"^Input y holds \d missing labels? \({what}\) among"):
        check_no_missing_labels(table)


@pytest.mark.parametrize(
    "nan",
    [float("nan"), np.float16("nan"), complex(1, float("nan")), complex(0, float("nan"))],
    ids=["float", "float16", "complex", "imaginary"],
)
@pytest.mark.parametrize("text", [str, str.encode], ids=["str", "bytes"])
def test_a_list_s_nan_among_text_is_refused_in_whatever_text_numpy_writes_it(nan, text):
    # NumPy writes it 'nan', '(1+nanj)' or 'nanj' among text (b'nan' ... among bytes): the
    # labels are read as objects where it may have, and there only.
    y = [text(v) for v in _TEXT[:5]] + [nan]
    with pytest.raises(ValueError, match=r"^Input y holds 1 missing label \(NaN\) among its 6"):
        check_no_missing_labels(y)
    # Text that reads alike is a class: 'nan', 'Raj', '(1+2j)'.
    for y in (["nan", "cat"], ["Raj", "cat"], ["(1+2j)", "cat"], [b"nan", b"cat"]):
        check_no_missing_labels(y)


def test_labels_are_read_once_and_as_objects_only_where_a_nan_may_hide(monkeypatch):
    # Each entry read a list of labels as text two or three times, once as Python's objects
    # (a set of them): for ImageNet's 1.28 million labels as text that added about half
    # a second to each argument of each metric, the fits' check a fifth of a second.
    y, pred = _TEXT.tolist(), _TEXT[::-1].tolist()
    asarray, reads = np.asarray, []

    def counted(a, *args, **kwargs):
        if a is y or a is pred:
            dtype = kwargs.get("dtype", args[0] if args else None)
            reads.append(("y" if a is y else "pred", dtype))
        return asarray(a, *args, **kwargs)

    monkeypatch.setattr(np, "asarray", counted)
    check_no_missing_labels(y)
    per_class_accuracy(y, pred)
    classwise_report({"erm": pred}, _TEXT)
    assert reads == [("y", None), ("y", None), ("pred", None), ("pred", None)]
