"""The command line, resumption after SIGKILL, and torchrun sharding, in real subprocesses."""

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("timm")

import extract  # noqa: E402
from extract import extract_features, load_features, merge_shards  # noqa: E402
from extract.__main__ import main  # noqa: E402
from extract._schema import DONE, PENDING  # noqa: E402
from extract._testing import make_image_folder, write_parquet, write_webdataset  # noqa: E402

# Tiny backbones on tiny images: a second torch thread only waits (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(extract.__file__).resolve().parent.parent
ENV = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _env(tmp_path: Path | str, **extra: str) -> dict:
    """ENV for a process a test starts: its temporary files (torchrun's torchelastic_*
    folders, multiprocessing's pymp-* of a killed run) in ``tmp_path``, not left in /tmp."""
    return ENV | {"TMPDIR": str(tmp_path), **extra}


@pytest.fixture
def short_tmp():
    """A folder in /tmp, removed after the test: the TMPDIR of a process with DataLoader
    workers, whose AF_UNIX sockets (multiprocessing's, at most 107 bytes) a tmp_path, or a
    long TMPDIR, is too deep for ("AF_UNIX path too long", and the run waits)."""
    folder = tempfile.mkdtemp(dir="/tmp" if os.access("/tmp", os.W_OK) else None)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


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
    for needle in ("--image-key", "--label-key", "webdataset:", "parquet:", "img2dataset"):
        assert needle in text


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("--image-sise", "--image-size"),
        ("--max-itmes", "--max-items"),
        # A value glued on (no close spelling without the dashes): the option that takes it.
        ("--dtypefloat16", "--dtype"),
        ("--image-size96", "--image-size"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_closest_one(capsys, typo, meant):
    # argparse said "unrecognized arguments: --image-sise 32" and no more.
    with pytest.raises(SystemExit) as exit_info:
        main(["photos/", "timm:resnet18@random", "out.h5", typo, "32"])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        line
        == f"mr2-extract: error: unrecognized arguments: {typo} 32; {typo}: did you mean {meant}?"
    )


def test_version_names_the_program_and_the_backbones_libraries(capsys, monkeypatch):
    # A library that is not installed is named so, not an error.
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "open_clip_torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"mr2-extract {real('mr2-probe')} (Python ")
    assert f"timm {real('timm')}" in line and "open_clip_torch not installed" in line


def test_label_key_help_says_what_each_source_kind_makes_of_digits(capsys):
    # "Labels of digits are class indices" was said of both kinds, but a Parquet string
    # column holds class names, digits or not ("10" and "2" sorted as text).
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--label-key LABEL_KEY webdataset: the label member (default: cls), e.g. txt, or a "
        "JSON path such as json.label; labels of digits are class indices, other labels class "
        "names, and a mix of the two is refused. parquet: the label column (default: label); "
        "an integer column holds class indices, a string column class names (digits too, "
        "sorted as text) --force"
    ) in text


def test_cli_writes_a_store_and_reports_errors(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "data", n_per_class=3)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0", "--max-items", "5"]) == 0
    assert "4 usable rows of 5 (1 failed) x 96 features, 2 classes" in capsys.readouterr().out
    assert main([*args, "--no-progress", "--dtype", "float16", "--max-items", "5"]) == 2
    assert "different provenance" in capsys.readouterr().err
    assert main([str(folder), "timm:resnet18@imagenet", str(out)]) == 2
    assert "local checkpoint file" in capsys.readouterr().err


def test_a_run_in_which_every_image_failed_exits_with_an_error(tmp_path, capsys):
    # Parquet rows that refer to image files instead of holding their bytes (as
    # datasets' to_parquet writes a dataset of paths) all failed, and the run exited 0.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from extract._testing import hf_image_schema

    rows = {"image": [{"bytes": None, "path": f"{i}.jpg"} for i in range(3)], "label": [0, 1, 0]}
    pq.write_table(pa.table(rows, schema=hf_image_schema(["a", "b"])), tmp_path / "t.parquet")
    out = tmp_path / "f.h5"
    args = [f"parquet:{tmp_path}/t.parquet", "timm:test_resnet@random", str(out)]
    assert main([*args, "--image-size", "32", "--no-progress", "--workers", "0"]) == 2
    captured = capsys.readouterr()
    assert "0 usable rows of 3 (3 failed) x 96 features, 2 classes" in captured.out
    assert "every image failed (the first, 't.parquet:0': LookupError: the row holds no image" in (
        captured.err
    )
    assert len(load_features(out).failures) == 3  # recorded, for --retry-failed


@pytest.mark.parametrize("in_working_folder", [True, False])
def test_every_image_of_a_list_of_the_working_folder_s_paths_failing_says_why(
    tmp_path, capsys, monkeypatch, in_working_folder
):
    # find data -name '*.png' > lists/train.txt: the warning said why, the error did not,
    # and told to --retry-failed, which reads the same paths.
    monkeypatch.chdir(tmp_path)
    if in_working_folder:
        make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists/train.txt").write_text("data/cat/000.png cat\ndata/dog/000.png dog\n")
    args = ["lists/train.txt", "timm:test_resnet@random", "f.h5", "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0"]) == 2
    line = _error_line(capsys)
    assert line.startswith("mr2-extract: error: every image failed (the first, 'data/cat/")
    folder = os.path.realpath(tmp_path / "lists")
    hint = (
        f"the store records why; 'data/cat/000.png' is found in the working folder, not in the "
        f"list's folder {folder}, against which its relative paths are read: write its paths "
        "relative to the list's folder (or absolute), or move the list into the working "
        "folder, then run again with --force"
    )
    assert line.endswith(hint) == in_working_folder
    assert line.endswith("--retry-failed extracts them again") != in_working_folder


@pytest.mark.parametrize("beside", ["empty", "link"])
def test_the_working_folder_s_warning_and_error_agree(
    tmp_path, capsys, caplog, monkeypatch, beside
):
    # The warning wanted no image of the list found in its folder, the error's hint the first
    # alone there, by a look-up that takes a broken link for a file: an empty image beside the
    # list had the error alone tell to move the list away from it, broken links beside it the
    # warning alone.
    monkeypatch.chdir(tmp_path)
    make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    (tmp_path / "lists/data/dog").mkdir(parents=True)
    (tmp_path / "lists/train.txt").write_text("data/cat/000.png cat\ndata/dog/000.png dog\n")
    if beside == "empty":  # one image found beside the list: no hint
        (tmp_path / "lists/data/dog/000.png").write_bytes(b"")
    else:  # none found there: both say so
        (tmp_path / "lists/data/cat").mkdir()
        for name in ("cat", "dog"):
            (tmp_path / f"lists/data/{name}/000.png").symlink_to(tmp_path / "gone.png")
    caplog.set_level(logging.WARNING, logger="extract")
    args = ["lists/train.txt", "timm:test_resnet@random", "f.h5", "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0"]) == 2
    line = _error_line(capsys)
    assert line.startswith("mr2-extract: error: every image failed")
    warned = "is found in the working folder" in caplog.text
    assert warned == (beside == "link")
    assert ("is found in the working folder" in line) == warned


def test_max_image_pixels_sets_the_limit_and_retry_reads_what_it_refused(
    tmp_path, capsys, monkeypatch
):
    # A CLI user had no way to raise PIL's limit, which the failure reason told them to do.
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "1"]
    assert main([*args, "--max-image-pixels", "-1"]) == 2
    assert "--max-image-pixels must be at least 0; got -1" in _error_line(capsys)
    assert main([*args, "--max-image-pixels", "100"]) == 2  # every test image is larger
    assert "more than the limit of 100" in _error_line(capsys)
    failures = load_features(out).failures
    assert len(failures) == 4
    assert all("mr2-extract --max-image-pixels" in reason for _, reason in failures)
    assert main([*args, "--max-image-pixels", "0", "--retry-failed"]) == 0
    store = load_features(out)
    assert len(store.failures) == 0 and store.features.shape == (4, 96)


def test_failed_images_are_named_with_their_reasons(tmp_path, capsys, caplog):
    # The run counted its failed images only ("2 images were recorded in s.h5 as failed"),
    # a rerun too ("2 recorded as failed"): which images, and why, only h5py could tell.
    # A zero-byte file was "cannot identify image file", not that it is empty. The two
    # summary lines counted rows differently: "6 rows" in the log, "4 rows" on stdout.
    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    (folder / "cat" / "001.jpg").write_bytes(b"")
    (folder / "dog" / "002.jpg").write_text("hi")
    out = tmp_path / "s.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0"]
    unknown = "UnidentifiedImageError: cannot identify image file"
    empty = f"'cat/001.jpg': {unknown} {str(folder / 'cat/001.jpg')!r}: it is empty (0 bytes)"
    text = f"'dog/002.jpg': {unknown} {str(folder / 'dog/002.jpg')!r}"
    summary = f"{out}: 4 usable rows of 6 (2 failed) x 96 features, 2 classes\n"
    assert main(args) == 0
    assert capsys.readouterr().out == summary
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"2 images were recorded in {out} as failed (unreadable, or with non-finite features) "
        f"and skipped ({empty}; {text}); the store's failure_reason says why for each."
    ]
    caplog.clear()
    assert main(args) == 0  # reused: the same images named, the rows counted alike
    assert capsys.readouterr().out == summary
    assert (
        f"Reused the complete feature store {out} (4 usable rows of 6, nothing to compute); "
        f"2 recorded as failed ({empty}; {text}), which --retry-failed" in caplog.text
    )


@pytest.mark.parametrize(
    "n_failed, first, expected",
    [
        (1, [("a.jpg", "OSError: x")], "('a.jpg': OSError: x)"),
        (2, [("a.jpg", "E: x"), ("b.png", "E: y")], "('a.jpg': E: x; 'b.png': E: y)"),
        (9, [("a.jpg", "E: x")], "(the first, 'a.jpg': E: x)"),
        (9, [("a", "E"), ("b", "F"), ("c", "G")], "(the first 3: 'a': E; 'b': F; 'c': G)"),
        (
            9,
            [("a", "E"), ("b", "F"), ("c", "G"), ("d", "H")],
            "(the first 3: 'a': E; 'b': F; 'c': G)",
        ),
        # A store without a reason (another tool's) ended the line in a dangling colon,
        # "('a.jpg': )", which mr2-probe's own copy of this function said otherwise.
        (
            2,
            [("a.jpg", ""), ("b.png", " \n")],
            "('a.jpg': no reason recorded; 'b.png': no reason recorded)",
        ),
        (
            3,
            [(7, "a.jpg", "cannot\nidentify\timage")],
            "(the first, 'a.jpg': cannot identify image)",
        ),
    ],
)
def test_failed_images_are_named_the_first_three_at_most(n_failed, first, expected):
    from mr2_probe._h5 import name_failures

    assert name_failures(n_failed, first) == expected


def test_ctrl_c_while_the_extraction_is_imported_is_one_line_and_130(tmp_path, capsys, monkeypatch):
    # torch, the models, scikit-learn and SciPy are imported for seconds after the
    # arguments are read, before the handler of KeyboardInterrupt: a Ctrl-C then printed a
    # 40-line traceback and the process died by the signal.
    def interrupted(name):  # the package's lazy import of extract_features
        raise KeyboardInterrupt

    monkeypatch.setattr(extract, "__getattr__", interrupted)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    try:
        status = main([str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5")])
    except KeyboardInterrupt:  # not pytest's own: fail this test, not the session
        pytest.fail("the KeyboardInterrupt escaped main()")
    assert status == 130
    err = capsys.readouterr().err
    assert err == "mr2-extract: interrupted; run the same command again to resume\n"
    with pytest.raises(KeyboardInterrupt):  # --debug: the traceback
        main([str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5"), "--debug"])


def test_a_missing_extract_extra_is_one_line_with_the_install_command(
    tmp_path, capsys, monkeypatch
):
    # `pip install -e .` installs mr2-extract without the extract extra: a run ended in a
    # ModuleNotFoundError traceback (No module named 'PIL'), where mr2-probe names the extra.
    def missing(name):  # the package's lazy import of extract_features
        raise ModuleNotFoundError("No module named 'PIL'", name="PIL")

    monkeypatch.setattr(extract, "__getattr__", missing)
    argv = [str(tmp_path / "data"), "timm:test_resnet@random", str(tmp_path / "o.h5")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "mr2-extract: error: extracting features needs the extract extra (No module named "
        "'PIL'): pip install \"mr2-probe[extract]\"\n"
    )
    with pytest.raises(ModuleNotFoundError):  # --debug: the traceback
        main([*argv, "--debug"])


@pytest.mark.usefixtures("python_sigint")
def test_a_real_ctrl_c_during_the_imports_waits_for_them_to_finish(tmp_path, capsys, monkeypatch):
    # A SIGINT inside NumPy's or torch's import left them half imported: a RecursionError's
    # traceback, or an abort in torch's C++. Held back, it ends the run once they are in.
    real, imported = extract.__getattr__, []

    def interrupted_while_importing(name):
        if not imported:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # where an unheld interrupt is raised
        imported.append(name)
        return real(name)

    monkeypatch.setattr(extract, "__getattr__", interrupted_while_importing)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    try:
        status = main([str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5")])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped main()")
    assert set(imported) == {"extract_features", "load_features"}  # every import finished
    assert status == 130
    assert capsys.readouterr().err.endswith("run the same command again to resume\n")
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.usefixtures("python_sigint")
def test_held_interrupts_leave_an_ignored_sigint_ignored_and_yield_to_a_second(monkeypatch):
    from extract.__main__ import _interrupts_held

    reached = []
    with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C, at once
        with _interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            reached.append("first held")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            reached.append("second held")
    assert reached == ["first held"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    # A job started in the background ignores SIGINT: it stays ignored.
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_IGN)
    installed = []
    monkeypatch.setattr(signal, "signal", lambda *args: installed.append(args))
    with _interrupts_held():
        pass
    assert installed == []


def test_the_summary_counts_one_row_and_one_class_in_the_singular(tmp_path, capsys):
    # "1 rows x 96 features, 1 classes".
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    shutil.rmtree(folder / "dog")
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0"]) == 0
    assert f"{out}: 1 row x 96 features, 1 class, 0 failed images" in capsys.readouterr().out


def test_the_summary_says_how_many_classes_hold_rows(tmp_path, capsys):
    # --max-items 2 keeps two cats: the store lists both classes, and the summary said
    # "2 rows x 96 features, 2 classes" as if both had rows.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    assert main([*args, "--max-items", "2", "--no-progress", "--workers", "0"]) == 0
    expected = f"{out}: 2 rows x 96 features, 2 classes (1 with rows), 0 failed images"
    assert expected in capsys.readouterr().out


def test_cli_reads_shards_with_a_label_key(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    write_webdataset(folder, tmp_path / "wds" / "%05d.tar", maxcount=3)
    out = tmp_path / "f.h5"
    args = [f"webdataset:{tmp_path}/wds/{{00000..00001}}.tar", "timm:test_resnet@random", str(out)]
    args += ["--image-size", "32", "--no-progress", "--workers", "0"]
    assert main([*args, "--label-key", "json.label"]) == 0
    assert "4 rows x 96 features, 2 classes, 0 failed images" in capsys.readouterr().out
    with load_features(out) as store:
        assert store.class_names == ["cat", "dog"] and store.paths[0] == "cat/000"
        assert store.metadata["source_options"]["label_key"] == "json.label"
    assert main([*args, "--label-key", "json.nothing"]) == 2
    assert "has no 'json.nothing' label" in _error_line(capsys, only_line=True)
    assert main([str(folder), "timm:test_resnet@random", str(out), "--label-key", "cls"]) == 2
    assert "--label-key applies to webdataset: and parquet: sources" in _error_line(capsys)


def test_cli_reads_parquet_files_with_their_keys(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    write_parquet(folder, tmp_path / "parquet" / "a.parquet")
    out = tmp_path / "f.h5"
    args = [f"parquet:{tmp_path}/parquet/a.parquet", "timm:test_resnet@random", str(out)]
    args += ["--image-size", "32", "--no-progress", "--workers", "0"]
    assert main([*args, "--image-key", "image", "--label-key", "label"]) == 0
    assert "4 rows x 96 features, 2 classes, 0 failed images" in capsys.readouterr().out
    with load_features(out) as store:
        assert store.class_names == ["cat", "dog"]
        options = store.metadata["source_options"]
        assert (options["image_key"], options["label_key"]) == ("image", "label")


def test_under_torchrun_a_rank_other_than_0_prints_no_summary(tmp_path, capsys, monkeypatch):
    # Rank 0 reports the merged store, once; the other ranks say nothing more.
    from extract import _runner

    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0"]
    assert main(args) == 0
    assert "f.h5: 2 rows x 96 features" in capsys.readouterr().out
    monkeypatch.setattr(_runner, "extract_features", lambda *args, **kwargs: out)
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 0
    assert capsys.readouterr().out == ""


def _error_line(capsys, only_line: bool = False) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mr2-extract: error: ")]
    assert len(lines) == 1 and "Traceback" not in err and "Retrying" not in err, err
    if only_line:
        assert err.splitlines() == lines, err
    return lines[0]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _old_store(path: Path) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.zeros((1, 2)))
        f.attrs["format_version"] = 1
    return path


@pytest.mark.parametrize(
    "make_out, match",
    [
        (lambda p: _write(p, b"my notes"), r"'.*/out.h5' exists and is not an HDF5 file"),
        (lambda p: _write(p, b""), "exists and is empty"),
        (lambda p: _write(p.with_name("file.txt"), b"x") / "out.h5", "is a file, not a folder"),
        (lambda p: _old_store(p), "store format 1 .* Rebuild it with --force"),
    ],
)
def test_bad_outputs_are_one_line_errors_before_any_work(
    tmp_path, capsys, no_model, make_out, match
):
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = make_out(tmp_path / "out.h5")
    assert main([str(folder), "timm:test_resnet@random", str(out), "--no-progress"]) == 2
    assert re.search(match, _error_line(capsys, only_line=True))
    with pytest.raises(extract.StoreError, match=match):  # --debug: the traceback
        main([str(folder), "timm:test_resnet@random", str(out), "--debug"])


def test_a_killed_decoding_worker_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    def killed(*args, **kwargs):
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")

    monkeypatch.setattr(extract, "extract_features", killed)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    assert main([str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5")]) == 2
    line = _error_line(capsys, only_line=True)
    assert "(pid 4242) is killed by signal: Killed." in line and "fewer --workers" in line
    assert "run the same command again to resume" in line


_AT_THE_FILE_LIMIT = """
import multiprocessing, os, resource, sys
from extract.__main__ import main
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
status = main(sys.argv[1:])
pipes = [os.pipe() for _ in range(8)]  # the run's own files closed again
print(status, len(multiprocessing.active_children()))
"""


def test_workers_beyond_the_open_file_limit_are_a_one_line_error_that_names_the_cure(
    tmp_path, short_tmp
):
    # Each worker takes a few of the run's open files (its queue, its process): --workers
    # 150 under ulimit -n 200 failed starting them with "Too many open files", and torch's
    # traceback of the half-made loader ("Exception ignored in
    # _MultiProcessingDataLoaderIter.__del__") followed the one line; the workers started
    # ran on, and the loader's pipes stayed open until a garbage collection.
    folder = make_image_folder(tmp_path / "data", n_per_class=8, special=False)  # 16 batches
    args = [str(folder), "timm:test_resnet@random", str(tmp_path / "f.h5"), "--image-size"]
    args += ["32", "--batch-size", "1", "--workers", "16", "--no-progress", "--device", "cpu"]
    run = subprocess.run(
        [sys.executable, "-c", _AT_THE_FILE_LIMIT, *args],
        env=_env(short_tmp, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.stdout == "2 0\n", run.stderr  # no worker left running
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr
    line = run.stderr.splitlines()[-1]
    assert line.startswith("mr2-extract: error: [Errno 24] Too many open files"), run.stderr
    assert "fewer --workers" in line and "ulimit -n" in line and "now 32" in line


def _line_of_failure(error: BaseException, tmp_path, capsys, monkeypatch) -> str:
    """The one error line of the command whose extraction raises ``error``."""

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(extract, "extract_features", failing)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    assert main([str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5")]) == 2
    return _error_line(capsys, only_line=True)


def test_open_files_running_out_while_batches_arrive_is_a_one_line_error(
    tmp_path, capsys, monkeypatch
):
    # Each batch's tensors come from a worker through file descriptors: a run a little
    # under the limit started its workers, then stopped with torch's traceback.
    error = RuntimeError(
        "Too many open files. Communication with the workers is no longer possible. "
        "Please increase the limit using `ulimit -n` in the shell or change the sharing "
        "strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')`"
        " at the beginning of your code"
    )
    line = _line_of_failure(error, tmp_path, capsys, monkeypatch)
    assert "Too many open files" in line and "set_sharing_strategy" not in line
    assert "fewer --workers" in line and "ulimit -n" in line
    assert "run the same command again to resume" in line


def test_a_rank_whose_peer_died_ends_in_one_line(tmp_path, capsys, monkeypatch):
    # Under torchrun a rank waiting in a collective when another was killed printed gloo's
    # traceback, not the one line every other failure gets.
    error = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
        "[127.0.0.1]:36556: Connection reset by peer. This is typically caused by a remote "
        "worker hanging or bugs in the application."
    )
    line = _line_of_failure(error, tmp_path, capsys, monkeypatch)
    assert line.startswith("mr2-extract: error: another rank stopped while this one waited")
    assert "Connection reset by peer" in line and "run the same command again to resume" in line
    assert "[/__w/pytorch" in line and "bugs in the application.)" in line  # both ends


def test_an_interrupted_forced_run_is_told_to_resume_without_force(tmp_path, capsys, monkeypatch):
    # "run the same command again to resume": with --force in it, the repeat deleted what
    # the stopped run had written and started over, at every repeat.
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(extract, "extract_features", interrupted)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    argv = [str(folder), "timm:test_resnet@random", str(tmp_path / "o.h5")]
    assert main([*argv, "--force"]) == 130
    assert "run the same command again without --force to resume" in capsys.readouterr().err
    assert main(argv) == 130
    assert "run the same command again to resume" in capsys.readouterr().err


@pytest.mark.parametrize("spelt", ["as a path", "with ~"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, MemoryError])
@pytest.mark.parametrize("begun", [None, "store", "shard", "other shard"])
def test_a_forced_run_interrupted_before_its_rebuild_began_is_told_to_keep_force(
    tmp_path, capsys, monkeypatch, begun, stop, spelt
):
    # A --force stopped while the model loaded was told to resume without --force: the rerun
    # reused the old store as complete (images replaced in place kept their old features).
    # So too for an output given as '~/o.h5', whose store was looked for in './~'.
    out = tmp_path / "o.h5"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out.write_bytes(b"the old store")
    old = f"{out.stat().st_size}:{out.stat().st_mtime_ns}"

    def interrupted(*args, **kwargs):
        if begun == "store":  # the new store replaced the old one (one process)
            (tmp_path / "new").write_bytes(b"a new store")
            os.replace(tmp_path / "new", out)
        elif begun:  # a rank's shard marked as replacing it (torchrun)
            monkeypatch.setenv("WORLD_SIZE", "2")
            mark = old if begun == "shard" else "another store"
            with h5py.File(extract.shard_path(out, 1, 2), "w") as f:
                f.attrs["replaces_store"] = mark
        raise stop

    monkeypatch.setattr(extract, "extract_features", interrupted)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    named = "~/o.h5" if spelt == "with ~" else str(out)
    status = main([str(folder), "timm:test_resnet@random", named, "--force"])
    assert status == (130 if stop is KeyboardInterrupt else 2)
    err = capsys.readouterr().err
    if begun in ("store", "shard"):
        assert "run the same command again without --force to resume" in err
    elif stop is MemoryError:  # out of memory while the model loaded
        assert "run the same command again (with --force: its rebuild had not begun) to " in err
    else:
        assert (
            "interrupted before the rebuild began (the store there is still the old one); "
            "run the same command again, with --force, to rebuild it" in err
        )


@pytest.mark.parametrize(
    "option, value, name, least",
    [
        ("--max-items", "-1", "max_items", 1),  # kept all but the last image
        ("--max-items", "0", "max_items", 1),  # "holds no images"
        ("--per-class", "0", "n_per_class", 1),
        ("--image-size", "0", "image_size", 1),  # silently the model's default
        ("--image-size", "-32", "image_size", 1),  # a traceback from inside the model
        ("--batch-size", "0", "batch_size", 1),
        ("--workers", "-1", "num_workers", 0),
    ],
)
def test_counts_and_sizes_below_one_are_one_line_errors(
    tmp_path, capsys, no_model, option, value, name, least
):
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "out.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), option, value, "--no-progress"]
    assert main(args) == 2
    line = _error_line(capsys, only_line=True)
    # The option's name, not the parameter's behind it.
    assert line == f"mr2-extract: error: {option} must be at least {least}; got {value}"
    assert not out.exists()
    # The library's own check names its parameter.
    with pytest.raises(ValueError, match=f"The '{name}' parameter must be"):
        extract_features(str(folder), "timm:test_resnet@random", out, **{name: int(value)})
    assert not out.exists()


@pytest.mark.parametrize("option", ["--image-key", "--label-key"])
@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_an_empty_source_key_is_refused(tmp_path, capsys, no_model, option, kind):
    # ("$KEY" unset in a script) The default key or column was read without a word.
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    write_webdataset(folder, tmp_path / "webdataset" / "%05d.tar")
    write_parquet(folder, tmp_path / "parquet" / "a.parquet")
    out = tmp_path / "out.h5"
    source = f"{kind}:{tmp_path / kind}"
    assert main([source, "timm:test_resnet@random", str(out), option, " ", "--no-progress"]) == 2
    assert _error_line(capsys, only_line=True) == (
        f"mr2-extract: error: {option} is empty; name a member or column, or leave {option} out"
    )
    name = option.removeprefix("--").replace("-", "_")
    with pytest.raises(ValueError, match=f"^The '{name}' parameter must name a .* Got '' instead"):
        extract_features(source, "timm:test_resnet@random", out, **{name: ""})
    assert not out.exists()


def test_a_folder_named_like_a_source_spec_is_a_folder(tmp_path, monkeypatch, capsys):
    # A folder named parquet (no colon: no spec) was refused as the spec's "empty
    # pattern", and --label-key was taken there for a Parquet source's.
    monkeypatch.chdir(tmp_path)
    make_image_folder(tmp_path / "parquet", n_per_class=1, special=False)
    args = ["parquet", "timm:test_resnet@random", "f.h5", "--image-size", "32"]
    args += ["--no-progress", "--workers", "0", "--device", "cpu"]
    assert main([*args, "--label-key", "cls"]) == 2
    assert "--label-key applies to webdataset: and parquet: sources; 'parquet' is not" in (
        _error_line(capsys, only_line=True)
    )
    assert main(args) == 0
    assert "2 rows x 96 features, 2 classes" in capsys.readouterr().out


@pytest.mark.parametrize("option, value", [("--label-key", "cls"), ("--image-key", "jpg")])
def test_source_keys_for_other_sources_are_refused_by_the_option_s_name(
    tmp_path, capsys, no_model, option, value
):
    # The error named the parameter behind the option ("The 'label_key' parameter applies
    # when opening webdataset: and parquet: sources"), which the command line has not.
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "out.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), option, value, "--no-progress"]
    assert main(args) == 2
    assert _error_line(capsys, only_line=True) == (
        f"mr2-extract: error: {option} applies to webdataset: and parquet: sources; "
        f"{str(folder)!r} is not one. Leave {option} out, or name shards as "
        "'webdataset:PATTERN' and Parquet files as 'parquet:PATTERN'"
    )
    assert not out.exists()
    # The library's own check names its parameter.
    name = option.removeprefix("--").replace("-", "_")
    message = (
        f"^The '{name}' parameter applies when opening .* must be None. Got '{value}' instead;"
    )
    with pytest.raises(ValueError, match=message):
        extract_features(str(folder), "timm:test_resnet@random", out, **{name: value})
    assert not out.exists()


@pytest.mark.parametrize(
    "backbone, match",
    [
        ("timm:resnet1800@random", "timm has no model 'resnet1800' .*; did you mean 'resnet18'"),
        ("open_clip:ViT-B-31@random", "open_clip has no model 'ViT-B-31' .*; did you mean 'ViT"),
        ("timm:test_resnet", r"could not be loaded: .* 'timm:test_resnet@/path/to/checkpoint.pth'"),
        ("open_clip:RN50@openai", r"'open_clip:RN50@openai' \(tag 'openai'\) could not be"),
    ],
)
def test_unknown_models_and_unreachable_weights_are_one_line_errors(
    tmp_path, capsys, backbone, match
):
    from extract._testing import no_weights_hub

    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    with no_weights_hub(tmp_path / "cache"):
        assert main([str(folder), backbone, str(tmp_path / "out.h5"), "--no-progress"]) == 2
    assert re.search(match, _error_line(capsys))
    assert not (tmp_path / "out.h5").exists()


def _main_as_nobody(argv: list[str]) -> tuple[int, str]:
    """Run main() in a forked child without root's right to write everywhere."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        status = 1
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                status = main(argv)
            os.write(write, err.getvalue().encode())
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        err = pipe.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), err


@pytest.mark.parametrize(
    "mode, ranks",
    [(0o555, None), (0o000, None), (0o000, "2")],
    ids=["read-only", "unsearchable", "unsearchable-torchrun"],
)
def test_unwritable_output_folder_is_a_one_line_error(tmp_path, no_model, monkeypatch, mode, ranks):
    # A folder that cannot be searched ended in Path's PermissionError, "[Errno 13]
    # Permission denied: '.../ro/sub/f.h5'" (extract_features raised it), not named.
    if ranks is not None:  # rank 0 of torchrun's
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", ranks)
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    base = Path(tempfile.mkdtemp(dir="/tmp" if os.geteuid() == 0 else tmp_path))
    try:
        base.chmod(0o755)
        (base / "ro").mkdir()
        (base / "ro").chmod(mode)  # (mkdir's mode would be masked by the umask)
        argv = [str(folder), "timm:test_resnet@random", str(base / "ro" / "sub" / "f.h5")]
        if os.geteuid() == 0:  # root writes everywhere: run as nobody
            status, err = _main_as_nobody([*argv, "--no-progress"])
        else:
            err_buffer = io.StringIO()
            with contextlib.redirect_stderr(err_buffer):
                status = main([*argv, "--no-progress"])
            err = err_buffer.getvalue()
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base)
    assert status == 2, err
    assert err.startswith("mr2-extract: error: Cannot write the output") and err.count("\n") == 1
    assert f"no permission to write in the folder '{base / 'ro'}'" in err


def test_force_rebuilds_a_store_whose_images_changed(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    args = [str(folder), "timm:test_resnet@random", str(tmp_path / "f.h5"), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0"]
    assert main(args) == 0
    assert main(args) == 0
    assert "Reused the complete feature store" in caplog.text
    (folder / "dog" / "001.jpg").write_bytes((folder / "cat" / "001.jpg").read_bytes())
    capsys.readouterr()
    assert main(args) == 2
    assert re.search(
        r"'.*/dog/001.jpg' is not the file the store was made from", _error_line(capsys)
    )
    assert main([*args, "--force"]) == 0
    assert "4 rows x 96 features" in capsys.readouterr().out


def test_a_bad_worker_count_is_refused_before_force_touches_the_store(tmp_path, capsys):
    # The DataLoader refused it, but only after --force had replaced the complete store.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    assert main([*args, "--no-progress", "--workers", "0"]) == 0
    before = load_features(out).features
    capsys.readouterr()
    assert main([*args, "--no-progress", "--workers", "-1", "--force"]) == 2
    assert "--workers must be at least 0; got -1" in _error_line(capsys)
    np.testing.assert_array_equal(load_features(out).features, before)
    # and the library, whose own check comes before overwrite too
    with pytest.raises(ValueError, match="The 'num_workers' parameter"):
        extract_features(
            str(folder), "timm:test_resnet@random", out, image_size=32, num_workers=-1,
            overwrite=True, progress=False,
        )  # fmt: skip
    np.testing.assert_array_equal(load_features(out).features, before)


@pytest.mark.parametrize("num_workers", [2, None])
def test_a_tmpdir_too_long_for_the_workers_sockets_is_refused_before_any_work(
    tmp_path, no_model, monkeypatch, num_workers
):
    # A worker passes its batches through a socket in multiprocessing's temporary folder,
    # <TMPDIR>/pymp-*/listener-*: under a TMPDIR of over 75 bytes every worker failed
    # ("AF_UNIX path too long") and the run waited for ever.
    import multiprocessing.util

    import torch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("x" * 80)))
    # (as a multiprocessing that picks a shorter folder itself, CPython gh-132124, has)
    monkeypatch.delattr(multiprocessing.util, "_get_base_temp_dir", raising=False)
    monkeypatch.setattr(torch.multiprocessing, "get_sharing_strategy", lambda: "file_descriptor")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # None: 3 workers
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "f.h5"
    with pytest.raises(ValueError, match=r"\(TMPDIR\) is too long a path .* num_workers=0"):
        extract_features(folder, "timm:test_resnet@random", out, num_workers=num_workers)
    assert not out.exists()


@pytest.mark.parametrize("complete", [True, False])
def test_a_long_tmpdir_refuses_workers_only_where_they_start(tmp_path, monkeypatch, complete):
    # A complete store is reused without a worker process: under a long TMPDIR it was
    # refused all the same; a store to resume is refused before its workers start.
    import multiprocessing.util

    import torch

    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "f.h5"
    extract_features(folder, "timm:test_resnet@random", out, num_workers=0, progress=False)
    if not complete:
        with h5py.File(out, "r+") as f:
            f["status"][0] = PENDING
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("x" * 80)))
    monkeypatch.delattr(multiprocessing.util, "_get_base_temp_dir", raising=False)
    monkeypatch.setattr(torch.multiprocessing, "get_sharing_strategy", lambda: "file_descriptor")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # None: 3 workers
    if complete:
        assert extract_features(folder, "timm:test_resnet@random", out, progress=False) == out
    else:
        with pytest.raises(ValueError, match=r"\(TMPDIR\) is too long a path"):
            extract_features(folder, "timm:test_resnet@random", out, progress=False)
        with h5py.File(out, "r") as f:
            assert f["status"][0] == PENDING


@pytest.mark.parametrize("value", ["gpu", ""])
def test_a_bad_device_is_refused_by_the_option_s_name(tmp_path, capsys, no_model, value):
    # The error named the parameter ("device='gpu' is not a torch device"), as mr2-probe
    # names the option before it.
    folder = make_image_folder(tmp_path / "data", n_per_class=1, special=False)
    out = tmp_path / "out.h5"
    assert main([str(folder), "timm:test_resnet@random", str(out), "--device", value]) == 2
    line = _error_line(capsys, only_line=True)
    assert line.startswith(f"mr2-extract: error: --device {value!r}: device={value!r} is not")
    assert "Available devices: 'auto'" in line and not out.exists()


def test_a_locked_store_is_one_line(tmp_path, capsys):
    # StoreLockedError is also a RuntimeError, whose clause came first and re-raised it:
    # a traceback and exit status 1.
    from extract._locks import store_lock

    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    with store_lock(out):
        assert main([*args, "--no-progress", "--workers", "0"]) == 2
    assert "being written by another process" in _error_line(capsys)


def test_retry_failed_extracts_again_only_the_failed_images(tmp_path, capsys, caplog, monkeypatch):
    # A transient read error was permanent: the file unchanged, the store was reused as is.
    from extract import _images

    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0"]
    read_file = _images.read_file

    def flaky(path, listed=None):
        if path.endswith("dog/001.jpg"):
            raise OSError(5, "Input/output error")
        return read_file(path, listed)

    monkeypatch.setattr(_images, "read_file", flaky)
    assert main(args) == 0
    monkeypatch.setattr(_images, "read_file", read_file)  # the file system recovers
    first = load_features(out, in_memory=True)
    assert [path for path, _ in first.failures] == ["dog/001.jpg"]
    assert main(args) == 0
    reason = "'dog/001.jpg': OSError: [Errno 5] Input/output error"
    assert f"1 recorded as failed ({reason}), which --retry-failed" in caplog.text
    assert len(load_features(out, in_memory=True).failures) == 1
    read = []

    def flaky_again(path, listed=None):  # every image but the failed one errs now
        read.append(path)
        if not path.endswith("dog/001.jpg"):
            raise OSError(5, "Input/output error")
        return read_file(path, listed)

    # A retry read, and rewrote, the whole batch of a failed row: in the same batch, rows
    # done before were read again, and an error there replaced their features by zeros.
    monkeypatch.setattr(_images, "read_file", flaky_again)
    assert main([*args, "--retry-failed"]) == 0
    assert [os.path.relpath(path, folder) for path in read] == ["dog/001.jpg"]
    assert "Extracting again the 1 image recorded as failed." in caplog.messages  # not "1 images"
    again = load_features(out, in_memory=True)
    assert not again.failures and len(again.paths) == 6
    kept = np.isin(again.paths, first.paths)
    np.testing.assert_array_equal(again.features[kept], first.features)


def test_retry_failed_takes_a_repaired_image(tmp_path, capsys, caplog):
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    good = (folder / "dog" / "001.jpg").read_bytes()
    (folder / "dog" / "001.jpg").write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0"]
    assert main(args) == 0
    assert len(load_features(out, in_memory=True).failures) == 1
    (folder / "dog" / "001.jpg").write_bytes(good)  # repaired: another size and time
    capsys.readouterr()
    assert main(args) == 2  # without --retry-failed the change is refused, naming it
    line = _error_line(capsys)
    assert "dog/001.jpg' is not the file the store was made from" in line
    assert (
        "failed in the store (or was not extracted yet) and has changed since: pass --retry-failed"
        in line
    )
    caplog.set_level(logging.INFO, logger="extract")
    assert main([*args, "--retry-failed"]) == 0
    assert "1 failed image has changed since; it is extracted again." in caplog.messages
    repaired = load_features(out, in_memory=True)
    assert not repaired.failures and len(repaired.paths) == 6
    assert main(args) == 0  # and the store is the request's now: reused
    (folder / "cat" / "000.png").write_bytes(good)  # a change to a row that was done
    assert main([*args, "--retry-failed"]) == 2
    line = _error_line(capsys)
    assert "cat/000.png' is not the file the store was made from" in line
    assert "--retry-failed" not in line


def test_a_retry_stopped_before_its_failed_images_keeps_them_failed(tmp_path, capsys, monkeypatch):
    # The retry wrote its failed rows back as pending before reading them: stopped there,
    # the store said "not extracted yet" to load_features, and once the image was
    # repaired the next --retry-failed refused it as changed (only --force went on).
    import extract._runner

    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    good = (folder / "dog" / "001.jpg").read_bytes()
    (folder / "dog" / "001.jpg").write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    args = [str(folder), "timm:test_resnet@random", str(out), "--image-size", "32"]
    args += ["--no-progress", "--workers", "0", "--retry-failed"]
    assert main(args) == 0

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(extract._runner, "write_rows", stopped)
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, "timm:test_resnet@random", out, image_size=32,
                         progress=False, num_workers=0, retry_failed=True)  # fmt: skip
    monkeypatch.undo()
    assert [path for path, _ in load_features(out, in_memory=True).failures] == ["dog/001.jpg"]
    (folder / "dog" / "001.jpg").write_bytes(good)
    assert main(args) == 0
    assert not load_features(out, in_memory=True).failures


def _store_of_broken_images(tmp_path, *names, run):
    """A store of a class folder whose images ``names`` were broken: the folder, the
    store, their paths and their good bytes (to repair them with)."""
    folder = make_image_folder(tmp_path / "data", n_per_class=3, special=False)
    broken = [folder / name for name in names]
    good = [path.read_bytes() for path in broken]
    for path in broken:
        path.write_bytes(b"not an image")
    out = tmp_path / "f.h5"
    extract_features(folder, "timm:test_resnet@random", out, **run)
    return folder, out, broken, good


def test_a_retry_killed_while_writing_takes_repairs_of_its_batch_next(tmp_path, monkeypatch):
    # Killed after the rows' features, digests and (empty) reasons reached the file, before
    # their status: a row stayed failed with the reason of none, and a plain rerun took
    # the store as complete. Its batch is left pending now, and a pending row's changed
    # file is a repair to the next --retry-failed (it was refused as another file).
    import extract._runner
    import extract._store

    run = dict(image_size=32, progress=False, num_workers=0)
    folder, out, broken, good = _store_of_broken_images(
        tmp_path, "cat/001.jpg", "cat/002.jpg", run=run
    )
    broken[1].write_bytes(good[1])

    class KilledAtStatus:  # the file, killed once the rows' reasons are written, not their status
        def __init__(self, f):
            self.f = f

        def __getitem__(self, name):
            return self.f[name]

        def flush(self):
            written = self.f["failure_reason"][:] == b""
            if (written & (self.f["status"][:] != DONE)).any():
                raise KeyboardInterrupt
            self.f.flush()

    def killed(f, *args):
        extract._store.write_rows(KilledAtStatus(f), *args)

    monkeypatch.setattr(extract._runner, "write_rows", killed)
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, "timm:test_resnet@random", out, retry_failed=True, **run)
    monkeypatch.undo()
    assert list(_status(out)).count(PENDING) == 2  # to be recomputed, not failed
    broken[0].write_bytes(good[0])
    extract_features(folder, "timm:test_resnet@random", out, retry_failed=True, **run)
    assert not load_features(out, in_memory=True).failures


def test_a_retry_stopped_after_taking_repairs_leaves_them_to_extract(tmp_path, monkeypatch):
    # The repaired rows it had not reached stayed failed, with the old file's reason and
    # digest under the new file's identity: a plain rerun took the store as complete and
    # never read the repaired image.
    import extract._runner
    import extract._store

    run = dict(image_size=32, progress=False, num_workers=0, batch_size=1)
    folder, out, broken, good = _store_of_broken_images(
        tmp_path, "dog/001.jpg", "dog/002.jpg", run=run
    )
    for path, data in zip(broken, good, strict=True):
        path.write_bytes(data)
    calls = []

    def stopped_after_one(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(extract._store.write_rows(*args))

    monkeypatch.setattr(extract._runner, "write_rows", stopped_after_one)
    with pytest.raises(KeyboardInterrupt):
        extract_features(folder, "timm:test_resnet@random", out, retry_failed=True, **run)
    monkeypatch.undo()
    extract_features(folder, "timm:test_resnet@random", out, **run)  # a plain rerun
    store = load_features(out, in_memory=True)
    assert not store.failures and (_status(out) == DONE).all()


@pytest.mark.parametrize("message, expected", [
    # --image-size 100000 asked for 120 GB: a raw RuntimeError traceback.
    ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
     "memory: you tried to allocate 120000000000 bytes.",
     ("ran out of memory", "use a smaller --batch-size, then run", "to resume (a smaller "
      "--image-size makes another store, with --force)")),
    # HDF5 reports a failed flush as a RuntimeError: a traceback of some hundred lines.
    ("Unable to synchronously flush file (file write failed: time = Tue Dec  1 2026\n, "
     "filename = 'f.h5', errno = 28, error message = 'No space left on device')",
     ("error: the disk ran out of space (Unable to", "run the same command again to resume")),
    # a failed write as an OSError, a dataset it could not create as a ValueError: the
    # raw HDF5 text, without what to do
    (OSError(28, "Can't synchronously write data (No space left on device)"),
     ("error: the disk ran out of space (", "run the same command again to resume")),
    (ValueError("Unable to synchronously create dataset (errno = 28, error message = 'No "
                "space left on device')"),
     ("error: the disk ran out of space (Unable to", "run the same command again")),
])  # fmt: skip
def test_out_of_memory_or_disk_is_one_line(message, expected, tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise message if isinstance(message, Exception) else RuntimeError(message)

    monkeypatch.setattr(extract, "extract_features", fail)
    assert main([str(tmp_path), "timm:test_resnet@random", str(tmp_path / "f.h5")]) == 2
    line = _error_line(capsys)
    assert all(part in line for part in expected)


@pytest.mark.parametrize("force", [False, True])
def test_the_device_running_out_of_memory_says_how_to_resume(tmp_path, capsys, monkeypatch, force):
    # Told to use a smaller --batch-size, without a word of the resume, a forced rebuild
    # rerun with --force, as it was, started over (the host's memory said so already).
    import torch

    def fail(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(extract, "extract_features", fail)
    args = [str(tmp_path), "timm:test_resnet@random", str(tmp_path / "f.h5")]
    assert main([*args, *(["--force"] if force else [])]) == 2
    again = "the same command again" + (" without --force" if force else "")
    assert f"use a smaller --batch-size, then run {again} to resume" in _error_line(capsys)


def _source(kind: str, folder: Path) -> str:
    """The images of ``folder`` as a source of the given kind (the same bytes, same order)."""
    if kind == "webdataset":
        write_webdataset(folder, folder.parent / "wds" / "%05d.tar", maxcount=8)
        return f"webdataset:{folder.parent}/wds/*.tar"
    if kind == "parquet":
        write_parquet(folder, folder.parent / "hf" / "train.parquet", row_group_size=6)
        return f"parquet:{folder.parent}/hf"
    return str(folder)


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    # A folder and a Parquet file (the writer is the sources' own), killed side by side.
    kinds = ("folder", "parquet")
    sources = {
        kind: _source(kind, make_image_folder(tmp_path / kind, n_per_class=20)) for kind in kinds
    }
    # On the CPU: compared byte for byte with an uninterrupted run, and slow enough to kill.
    options = ["timm:resnet18@random", "--image-size", "64", "--batch-size", "2", "--device", "cpu"]
    killed = {kind: tmp_path / f"{kind}-killed.h5" for kind in kinds}
    running = {}  # the extractions started and not yet killed
    try:
        for kind in kinds:
            running[kind] = subprocess.Popen(
                _cli(sources[kind], options[0], str(killed[kind]), *options[1:]), env=_env(tmp_path)
            )
        deadline = time.monotonic() + 120
        # Kill each once a few batches are stored: at an arbitrary point of the write loop.
        while running:
            for kind, proc in list(running.items()):
                status = _status(killed[kind])
                if status is not None and (status != PENDING).sum() >= 4:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    del running[kind]
                else:
                    assert proc.poll() is None, f"the {kind} extraction ended before its kill"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:  # a failed assertion leaves no extraction running behind the test
        for proc in running.values():
            proc.kill()
            proc.wait()
    common = dict(image_size=64, batch_size=2, num_workers=0, progress=False, device="cpu")
    for kind in kinds:
        source, store = sources[kind], killed[kind]
        n = len(extract.open_source(source))
        status = _status(store)
        assert 0 < (status == DONE).sum() and (status == PENDING).sum() > 0, "killed too late"
        # The killed file opens and is refused as incomplete, not reported as corrupt.
        with pytest.raises(extract.IncompleteStoreError):
            load_features(store)
        # Resumed, and extracted once without a kill, in this process (the same calls as the
        # command's, a fresh interpreter fewer).
        extract_features(source, "timm:resnet18@random", store, **common)
        reference = extract_features(
            source, "timm:resnet18@random", tmp_path / f"{kind}-ref.h5", **common
        )
        resumed, expected = load_features(store, in_memory=True), load_features(reference, True)
        assert len(resumed.rows) + len(resumed.failures) == n and len(resumed.failures) == 2
        assert resumed.paths == expected.paths and resumed.failures == expected.failures
        np.testing.assert_array_equal(resumed.labels, expected.labels)
        np.testing.assert_array_equal(resumed.features, expected.features)
        assert store.read_bytes() == reference.read_bytes()  # the same file, byte for byte


@pytest.mark.slow
def test_torchrun_merges_the_ranks_shards_and_retries_failed_images(tmp_path):
    # torchrun's start is most of the time: every case runs in one torchrun.
    # On the CPU: the ranks' rows are compared with one run's, in batches of other sizes.
    fast = dict(image_size=32, num_workers=0, progress=False, device="cpu")
    options = ["--image-size", "32", "--workers", "0", "--no-progress", "--device", "cpu"]
    # Two ranks over webdataset shards. The command line runs twice, then again on the first
    # store (which it reuses): each run after the first failed to make the ranks' group
    # again ("Gloo connectFullMesh failed"), as a script extracting a train and a test
    # split did.
    source = _source("webdataset", make_image_folder(tmp_path / "data", n_per_class=5))
    out, other = tmp_path / "f.h5", tmp_path / "g.h5"
    runs = [(source, out, options), (source, other, options), (source, out, options)]
    # --retry-failed of a repaired image. Under torchrun the merged store's fingerprint, and
    # the other rank's shard's, refused it: it needed --force, which extracted everything
    # again. With the shards deleted after their merge, the retry extracted every image
    # again. Both cases: the shards kept, and deleted.
    retried = {}
    for shards in ("kept", "deleted"):
        folder = make_image_folder(tmp_path / shards / "data", n_per_class=3, special=False)
        image = folder / "dog" / "001.jpg"
        good = image.read_bytes()
        image.write_bytes(b"not an image")
        stored = tmp_path / shards / "f.h5"
        # The first run as torchrun's two ranks make it (the same shards), in this process.
        shards_made = [
            extract_features(
                folder, "timm:test_resnet@random", stored, rank=r, world_size=2, **fast
            )
            for r in range(2)
        ]
        merge_shards(shards_made, stored)
        assert [path for path, _ in load_features(stored).failures] == ["dog/001.jpg"]
        image.write_bytes(good)
        if shards == "deleted":
            for shard in shards_made:
                shard.unlink()
            # A done row marked in the merged store: it is taken from there, not extracted,
            # with the record of the library versions that computed it.
            with h5py.File(stored, "r+") as f:
                f["features"][f["paths"].asstr()[:].tolist().index("cat/001.jpg")] = 7.0
                f.attrs["versions"] = json.dumps({"torch": "1.0"})
        retried[shards] = folder, stored
        runs.append((str(folder), stored, [*options, "--retry-failed"]))
    # torchrun itself, started through the interpreter so that no PATH lookup is needed.
    script = tmp_path / "runs.py"
    script.write_text(
        "from extract.__main__ import main\n"
        f"for source, out, options in {[(str(s), str(o), opts) for s, o, opts in runs]!r}:\n"
        "    assert main([source, 'timm:test_resnet@random', out, *options]) == 0\n"
        "import torch.distributed as dist\n"
        "assert not dist.is_initialized()  # the script's own group can come after\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(script)]
    run = subprocess.run(
        cmd, env=_env(tmp_path, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    # Each rank warned of its shard's failures, naming the shard: now rank 0 warns once
    # per store, of every rank's (and the retries leave none).
    warned = [line for line in run.stderr.splitlines() if "as failed (unreadable" in line]
    assert len(warned) == 2 and not any("shard-" in line for line in warned), warned
    for name in (out, other):
        assert any(f"2 images were recorded in {name} as failed" in line for line in warned)
    again = load_features(other, in_memory=True)
    single = extract_features(source, "timm:test_resnet@random", tmp_path / "single.h5", **fast)
    merged, expected = load_features(out, in_memory=True), load_features(single, in_memory=True)
    assert merged.metadata["merged_from"] == 2
    assert merged.paths == expected.paths and merged.failures == expected.failures
    np.testing.assert_allclose(merged.features, expected.features, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(again.features, merged.features)
    # 14 samples in shards of 8 and 6: one shard to each rank
    for rank, rows in ((0, list(range(8))), (1, list(range(8, 14)))):
        with h5py.File(extract.shard_path(out, rank, 2), "r") as f:
            assert f["indices"][:].tolist() == rows
    for shards, (folder, stored) in retried.items():
        single = extract_features(
            folder, "timm:test_resnet@random", tmp_path / shards / "single.h5", **fast
        )
        merged, expected = load_features(stored, in_memory=True), load_features(single, True)
        assert not merged.failures and merged.paths == expected.paths
        if shards == "deleted":
            marked = merged.paths.index("cat/001.jpg")
            assert (merged.features[marked] == 7.0).all()
            assert merged.metadata["versions"] == {"torch": "1.0"}
            merged.features[marked] = expected.features[marked]
        np.testing.assert_allclose(merged.features, expected.features, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_ranks_stop_when_torchrun_s_launcher_is_killed(tmp_path, caplog):
    # torchrun starts its ranks in sessions of their own: with the launcher killed outright
    # they went on extracting (holding the device and the locks) to the end of the run.
    caplog.set_level(logging.INFO, logger="extract")
    # (large enough images that the rows left at the kill take seconds on an idle machine:
    # the ranks look at their launcher once a second)
    folder = make_image_folder(tmp_path / "data", n_per_class=100, special=False)
    out, log = tmp_path / "f.h5", tmp_path / "stderr.txt"
    options = ["--image-size", "320", "--batch-size", "2", "--workers", "0", "--no-progress"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "extract", str(folder), "timm:test_resnet@random", str(out), *options]
    cmd += ["--device", "cpu"]
    with log.open("w") as stderr:
        launcher = subprocess.Popen(cmd, env=_env(tmp_path, OMP_NUM_THREADS="1"), stderr=stderr)
    shards = [extract.shard_path(out, rank, 2) for rank in range(2)]
    deadline = time.monotonic() + 120
    # (one rank may start well after the other on a loaded machine)
    while sum((status == DONE).sum() for status in map(_status, shards) if status is not None) < 2:
        assert launcher.poll() is None, "the extraction ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ranks = _children(launcher.pid)
    assert len(ranks) == 2
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        deadline = time.monotonic() + 30
        while any(_running(rank) for rank in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(rank) for rank in ranks), "the ranks outlived their launcher"
    finally:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
    # Each rank ends in one line: interrupted, or (where its peer ended first, while it
    # waited) another rank stopped; both resumable.
    ended = [line for line in log.read_text().splitlines() if line.startswith("mr2-extract:")]
    assert len(ended) == 2 and all("run the same command again to resume" in e for e in ended)
    # Stopped, not finished: a shard with rows left resumes, unlocked.
    left = [r for r, s in enumerate(shards) if s.exists() and (_status(s) == PENDING).any()]
    assert left, "the ranks finished before they stopped"
    extract_features(
        folder, "timm:test_resnet@random", out, rank=left[0], world_size=2, image_size=320,
        num_workers=0, progress=False, device="cpu",
    )  # fmt: skip
    assert "Resuming" in caplog.text and (_status(shards[left[0]]) == DONE).all()


_RANK = """
import os, time
import extract
from extract import _launcher
_launcher.POLL_S = 0.05
first = os.getppid()
print("ready", flush=True)
while os.getppid() == first:  # the launcher killed before the run, as torch imports
    time.sleep(0.01)
try:
    with _launcher.stops_with_launcher():
        time.sleep(20)  # the run
    print("ran to the end", flush=True)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_rank_whose_launcher_died_before_the_run_stops(tmp_path, sigint):
    # The parent at the call was taken for the launcher: killed before it (while torch
    # imported, or between a script's two calls), the rank extracted to the end. With
    # SIGINT ignored, as in a shell's background job (`torchrun ... &` in a script), the
    # rank's Ctrl-C was lost: it ran on (to its kill GRACE_S later).
    log = tmp_path / "rank.txt"
    ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    rank = (ignore if sigint == "ignored" else "") + _RANK
    launcher_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {rank!r}], stdout=open({str(log)!r}, 'w'))\n"
        "time.sleep(60)\n"
    )
    env = _env(tmp_path, TORCHELASTIC_RUN_ID="test")
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], env=env)
    deadline = time.monotonic() + 60
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    launcher.kill()
    launcher.wait()
    while len(log.read_text().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().split() == ["ready", "stopped"]


_CONNECTING_RANK = """
import os, time
import extract
from extract import _launcher, _ranks
_launcher.POLL_S = 0.05
print(os.getpid(), flush=True)
with _launcher.stops_with_launcher(), _ranks._ranks_group():  # the launcher's store
    pass
print("joined", flush=True)
"""


@pytest.mark.slow
def test_a_rank_connecting_to_a_killed_launcher_s_store_stops_at_once(tmp_path):
    # Killed outright while its ranks still started, the launcher took its store with it:
    # torch retried the connection for the group's timeout (24 hours), where the Ctrl-C
    # the rank sent itself was lost ("Interrupted system call - retrying"), so each rank
    # lived on until its kill 60 s later. Connecting, a rank holds nothing: it ends now.
    log = tmp_path / "rank.txt"
    with socket.socket() as unreachable:  # a port bound, never listened on: refused
        unreachable.bind(("127.0.0.1", 0))
        env = _env(tmp_path) | {
            "TORCHELASTIC_RUN_ID": "test", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(unreachable.getsockname()[1]),
            "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        launcher_code = (
            "import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', {_CONNECTING_RANK!r}], "
            f"stdout=open({str(log)!r}, 'w'))\n"
            "time.sleep(120)\n"
        )
        launcher = subprocess.Popen([sys.executable, "-c", launcher_code], env=env)
        deadline = time.monotonic() + 60
        while not (log.read_text() if log.exists() else "").strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank = int(log.read_text().split()[0])
        try:
            time.sleep(0.5)  # connecting
            launcher.kill()
            launcher.wait()
            stopped = time.monotonic() + 10
            while _running(rank) and time.monotonic() < stopped:
                time.sleep(0.05)
            assert not _running(rank), "the rank outlived its launcher"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
    assert "joined" not in log.read_text()


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (Linux /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[1]) == pid:
            children.append(int(entry))
    return children


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_killed_writer_with_live_workers_resumes_at_once(tmp_path, short_tmp, caplog):
    caplog.set_level(logging.INFO, logger="extract")
    folder = make_image_folder(tmp_path / "data", n_per_class=20, special=False)
    out = tmp_path / "f.h5"
    options = ["--image-size", "32", "--batch-size", "2", "--workers", "2", "--no-progress"]
    options += ["--device", "cpu"]  # slow enough to kill mid-run
    proc = subprocess.Popen(
        [sys.executable, "-m", "extract", str(folder), "timm:test_resnet@random", str(out)]
        + options,
        env=_env(short_tmp, OMP_NUM_THREADS="1"),
    )
    deadline = time.monotonic() + 120
    while (status := _status(out)) is None or (status != PENDING).sum() < 4:
        assert proc.poll() is None, "the extraction ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    try:
        # DataLoader workers outlive their killed parent for a while; they must not keep
        # the store locked (neither its lock file nor the HDF5 file).
        assert any(_running(w) for w in workers), "the workers ended before the check"
        extract_features(
            folder, "timm:test_resnet@random", out, image_size=32, batch_size=2,
            num_workers=0, progress=False,
        )  # fmt: skip
    finally:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
    assert "Resuming" in caplog.text
    assert load_features(out).features.shape == (40, 96)
