"""bench_cv.py runs its peers as scikit-learn asks, without its FutureWarnings."""

import json
import warnings

import pytest

from tests._scripts import load_benchmark


@pytest.mark.slow
def test_no_future_warning_from_the_warm_up_or_the_search(capsys):
    """The untimed LogisticRegressionCV warm-up takes the timed search's arguments."""
    module = load_benchmark("bench_cv")
    argv = ["--n-samples", "200", "--n-features", "8", "--n-classes", "3", "--n-Cs", "2",
            "--folds", "2", "--max-iter", "20", "--skip", "grid", "--skip", "cpu"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.main(argv)
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert not future
    assert "LogisticRegressionCV(n_jobs=-1)" in capsys.readouterr().out


def test_json_goes_into_a_folder_it_makes(tmp_path, capsys):
    """--json runs/cv.json where runs/ does not exist yet: the folder is made, as
    bench_fit.py's and bench_cosine.py's are (a FileNotFoundError after the whole run)."""
    module = load_benchmark("bench_cv")
    out = tmp_path / "runs" / "cv.json"
    argv = ["--n-samples", "200", "--n-features", "8", "--n-classes", "3", "--n-Cs", "2",
            "--folds", "2", "--max-iter", "20", "--skip", "grid", "--skip", "lrcv",
            "--json", str(out)]  # fmt: skip
    module.main(argv)
    result = json.loads(out.read_text())
    assert result["args"]["json"] == str(out)
    assert [row["model"] for row in result["rows"]] == [
        "MR2LinearClassifierCV cpu, batched",
        "MR2LinearClassifierCV cpu, fold by fold",
    ]


def test_hdf5_searches_the_same_rows_from_a_file_it_removes(tmp_path, capsys):
    """--hdf5 adds the estimator's search on the training rows stored in a new HDF5 file,
    beside the same search in memory: the same C and test accuracy; the file is removed,
    and an existing file is never overwritten."""
    module = load_benchmark("bench_cv")
    store = tmp_path / "runs" / "X.h5"
    argv = ["--n-samples", "300", "--n-features", "8", "--n-classes", "3", "--n-Cs", "3",
            "--folds", "2", "--max-iter", "30", "--skip", "grid", "--skip", "lrcv",
            "--hdf5", str(store), "--json", str(tmp_path / "cv.json")]  # fmt: skip
    module.main(argv)
    rows = json.loads((tmp_path / "cv.json").read_text())["rows"]
    assert [row["model"] for row in rows] == [
        "MR2LinearClassifierCV cpu, batched",
        "MR2LinearClassifierCV cpu, HDF5 store",
        "MR2LinearClassifierCV cpu, fold by fold",
    ]
    assert rows[1]["C"] == rows[0]["C"]
    assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]
    assert not store.exists()
    store.write_bytes(b"keep")
    with pytest.raises(SystemExit):
        module.main(argv)
    assert "--hdf5 takes a new file" in capsys.readouterr().err
    assert store.read_bytes() == b"keep"
