"""The command line, resumption after SIGKILL, and torchrun sharding, in real subprocesses."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("timm")

import extract  # noqa: E402
from extract import extract_features, load_features  # noqa: E402
from extract.__main__ import main  # noqa: E402
from extract._store import DONE, PENDING  # noqa: E402
from extract._testing import make_image_folder  # noqa: E402

ROOT = Path(extract.__file__).resolve().parent.parent
ENV = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "extract", *args, "--workers", "0", "--no-progress"]


def _status(path: Path) -> np.ndarray | None:
    try:  # the writer holds the HDF5 lock; status is raw data, safe to peek at
        with h5py.File(path, "r", locking=False) as f:
            return f["status"][:]
    except (OSError, KeyError):
        return None  # not created yet


def test_help_explains_options_with_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--batch-size", "--dtype", "--normalize", "--decode", "--per-class", "torchrun"):
        assert needle in text
    assert "mr2-extract fashion-mnist:test effnet-lite0" in text


def test_cli_writes_a_store_and_reports_errors(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "data", n_per_class=3)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet", str(out), "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0", "--max-items", "5"]) == 0
    assert "4 rows x 96 features, 2 classes, 1 unreadable images" in capsys.readouterr().out
    assert main([*args, "--no-progress", "--dtype", "float16", "--max-items", "5"]) == 2
    assert "different provenance" in capsys.readouterr().err
    assert main([str(folder), "timm:resnet18@imagenet", str(out)]) == 2
    assert "local checkpoint file" in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    folder = make_image_folder(tmp_path / "data", n_per_class=20)
    n = len(list(folder.rglob("*.*")))
    options = ["timm:resnet18", "--image-size", "64", "--batch-size", "2"]
    killed = tmp_path / "killed.h5"
    proc = subprocess.Popen(_cli(str(folder), options[0], str(killed), *options[1:]), env=ENV)
    deadline = time.monotonic() + 120
    # Kill once a few batches are stored: at an arbitrary point of the write loop.
    while (status := _status(killed)) is None or (status != PENDING).sum() < 4:
        assert proc.poll() is None, "the extraction ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    status = _status(killed)
    assert 0 < (status == DONE).sum() and (status == PENDING).sum() > 0, "killed too late"
    # The killed file opens and is refused as incomplete, not reported as corrupt.
    with pytest.raises(extract.IncompleteStoreError):
        load_features(killed)
    subprocess.run(_cli(str(folder), options[0], str(killed), *options[1:]), env=ENV, check=True)
    reference = extract_features(
        folder, "timm:resnet18", tmp_path / "ref.h5", image_size=64, batch_size=2,
        num_workers=0, progress=False,
    )  # fmt: skip
    resumed, expected = load_features(killed, in_memory=True), load_features(reference, True)
    assert len(resumed.rows) + len(resumed.failures) == n
    assert resumed.paths == expected.paths and resumed.failures == expected.failures
    np.testing.assert_array_equal(resumed.labels, expected.labels)
    np.testing.assert_array_equal(resumed.features, expected.features)
    assert killed.read_bytes() == reference.read_bytes()  # the same file, byte for byte


@pytest.mark.slow
def test_torchrun_two_ranks_merge(tmp_path):
    folder = make_image_folder(tmp_path / "data", n_per_class=5)
    out = tmp_path / "f.h5"
    # torchrun itself, started through the interpreter so that no PATH lookup is needed.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "extract", str(folder)]
    cmd += ["timm:test_resnet", str(out), "--image-size", "32", "--workers", "0", "--no-progress"]
    subprocess.run(cmd, env=ENV | {"OMP_NUM_THREADS": "1"}, check=True, timeout=120)
    single = extract_features(
        folder, "timm:test_resnet", tmp_path / "single.h5", image_size=32, num_workers=0,
        progress=False,
    )  # fmt: skip
    merged, expected = load_features(out, in_memory=True), load_features(single, in_memory=True)
    assert merged.metadata["merged_from"] == 2
    assert merged.paths == expected.paths and merged.failures == expected.failures
    np.testing.assert_allclose(merged.features, expected.features, rtol=1e-5, atol=1e-6)
