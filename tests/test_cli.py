"""The mr2-probe command line: inputs, grid search, outputs and errors."""

import json

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits

from mr2_probe.cli import _grid, main


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    folder = tmp_path_factory.mktemp("digits")
    np.savez(folder / "train.npz", X=X[::2], y=y[::2])
    np.savez(folder / "test.npz", features=X[1::2], labels=y[1::2])
    np.save(folder / "X.npy", X)
    np.save(folder / "y.npy", y)
    return folder


def test_train_and_test_files_print_the_classwise_table(digits_files, capsys):
    assert (
        main(
            [
                str(digits_files / "train.npz"),
                "--test",
                str(digits_files / "test.npz"),
                "--c-bar",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    header, _, erm, mr2 = out.splitlines()[:4]
    assert header.split()[1:] == ["overall", "easy", "medium", "hard", "worst", "std"]
    assert erm.split()[0] == "ERM" and mr2.split()[0] == "MR2"
    assert float(erm.split()[1]) > 90


def test_grid_search_writes_report_plots_and_models(digits_files, tmp_path, capsys):
    out = tmp_path / "run"
    main(
        [
            str(digits_files / "X.npy"),
            "--labels",
            str(digits_files / "y.npy"),
            "--test-size",
            "0.3",
            "--grid",
            "c_bar=none,1",
            "--grid",
            "C=0.1,1",
            "--cv",
            "2",
            "--scoring",
            "balanced_accuracy",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert "MR2 grid: best parameters by balanced_accuracy" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["reference"] == "ERM" and set(report["rows"]) == {"ERM", "MR2 grid"}
    assert len(report["labels"]) == 10
    for name in ("class_accuracy.png", "groups.png", "margins.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    models = joblib.load(out / "models.joblib")
    assert models["MR2 grid"].c_bar in (None, 1)
    assert "| ERM |" in (out / "report.md").read_text().replace("  ", " ")


@pytest.mark.parametrize(
    "spec, expected",
    [
        (["c_bar=none,1,2.5"], {"c_bar": [None, 1, 2.5]}),
        (["lam=0,0.5", "head=linear,cosine"], {"lam": [0, 0.5], "head": ["linear", "cosine"]}),
    ],
)
def test_grid_specs(spec, expected):
    assert _grid(spec) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["X.npy"], "pass --labels"),
        (["train.npz", "--grid", "c_bar"], "--grid expects NAME=V1,V2"),
        (["X.csv"], "unknown feature file type"),
    ],
)
def test_clear_errors(digits_files, argv, message):
    argv = [str(digits_files / argv[0]), *argv[1:]]
    with pytest.raises(SystemExit, match=message):
        main(argv)


def test_help_explains_options_with_examples(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for option in ("--test", "--grid", "--scoring", "--c-bar", "--out", "examples:"):
        assert option in text
