"""The benchmarks refuse bad option values in one line (argparse's status 2), not with a
traceback from deep in a run."""

import json
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests._scripts import load_benchmark

# Small data, so that a value accepted without its check runs to the end in a second.
SMALL_COSINE = ["--n-samples", "60", "--n-test", "20", "--n-features", "8", "--n-classes", "3",
                "--scales", "16", "--no-rounds", "--no-before"]  # fmt: skip

SMALL_FIT = ["--n-samples", "60", "--n-features", "4"]  # bench_fit's options, and others'

SMALL_CV = ["--n-samples", "60", "--n-features", "4", "--n-classes", "3", "--n-Cs", "1",
            "--skip", "lrcv", "--skip", "grid"]  # fmt: skip

SMALL_EXTRACT = ["--n-images", "4", "--repeats", "1", "--batch-size", "4", "--workers", "0",
                 "--image-size", "32", "--source-size", "40", "--sources", "folder"]  # fmt: skip

FOLDER = str(Path(__file__).parent)  # a folder that exists
UNDER_A_FILE = f"{__file__}/runs/out.json"  # a file that cannot be made

SMALL_QUALITY = ["--classes", "2", "--kinds", "spread", "--seeds", "0"]


@pytest.mark.parametrize(
    "script, argv, message",
    [
        # ZeroDivisionError, "range() arg 3 must not be zero", a torch device's ValueError.
        ("bench_extract", ["--repeats", "0"], "--repeats must be at least 1; got 0"),
        ("bench_extract", ["--batch-size", "0"], "--batch-size must be at least 1; got 0"),
        ("bench_extract", ["--device", "bogus"], "--device: device='bogus' is not a torch"),
        # a BackboneError, after the images were written.
        ("bench_extract", [*SMALL_EXTRACT, "--backbone", "bogus"],
         "--backbone: The backbone spec 'bogus' has no family"),
        ("bench_extract", [*SMALL_EXTRACT, "--backbone", "timm:no_such_model@random"],
         "--backbone: timm has no model 'no_such_model'"),
        # the DataLoader's ValueError, after the images were written.
        ("bench_extract", ["--workers", "-1"], "--workers must be at least 0; got -1"),
        # "min() arg is an empty sequence", after the data were made.
        ("bench_fit", ["--repeat", "0"], "--repeat must be at least 1; got 0"),
        # torch's RuntimeError "must be positive" at torch.set_num_threads.
        ("bench_fit", ["--threads", "0"], "--threads must be at least 1; got 0"),
        ("profile_fit", ["--threads", "0"], "--threads must be at least 1; got 0"),
        # scikit-learn's ValueError at the first predict, on no test rows.
        ("bench_fit", ["--n-samples", "4"], "--n-samples must be at least 5 (else no test rows)"),
        ("bench_feature_scale", ["--scales", "0"], "--scales must be positive and finite; got [0"),
        # a ZeroDivisionError after the first fits.
        ("bench_feature_scale", ["--max-iter", "0"], "--max-iter must be at least 1; got 0"),
        # the synthetic data's error at K=0; a --bound that changed nothing.
        ("quality", ["--data", "synthetic", "--classes", "0"], "--classes must be at least 2"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--bound", "1"], "--bound applies to"),
        # another data set's options, which ran the defaults without a word.
        (
            "quality",
            ["--data", "synthetic", *SMALL_QUALITY, "--image-sizes", "64"],
            "--image-sizes applies to --data fmnist, not to --data synthetic",
        ),
        (
            "quality",
            ["--data", "synthetic", *SMALL_QUALITY, "--cache", "runs/cache"],
            "--cache applies to --data fmnist, not to --data synthetic",
        ),
        # (--cache a file: without the check, a FileExistsError before any extraction)
        (
            "quality",
            ["--data", "fmnist", "--classes", "10", "--cache", __file__],
            "--classes applies to --data synthetic, not to --data fmnist",
        ),
        (
            "quality",
            ["--data", "fmnist", "--kinds", "norm", "--cache", __file__],
            "--kinds applies to --data synthetic, not to --data fmnist",
        ),
        ("quality", ["--data", "fmnist", "--cache", __file__],
         "--cache takes a folder of feature stores, got the file"),
        # the per-step table's sizes, for a table not made: ignored without a word.
        (
            "bench_minibatch",
            ["--seeds", "0", "--no-steps", "--dims", "16"],
            "--dims sizes the per-step table, which --no-steps skips",
        ),
        # "not enough values to unpack".
        ("bench_threads", ["--sizes", "100x4"], "--sizes takes n x d x K of at least 1 each"),
        ("bench_products", ["--sizes", "100x4"], "--sizes takes n x d x K of at least 1 each"),
        # the estimator's ValueError on no rows, torch's RuntimeError on an empty tensor.
        ("bench_threads", ["--sizes", "0x8x5"], "--sizes takes n x d x K of at least 1 each"),
        # the estimator's ValueError on one class, after the sizes before it.
        ("bench_threads", ["--sizes", "60x4x3", "100x4x1", "--iters", "1", "--repeats", "1"],
         "--sizes fits classifiers: n and K must be at least 2; got '100x4x1'"),
        ("bench_threads", ["--sizes", "1x4x3", "--iters", "1", "--repeats", "1"],
         "--sizes fits classifiers: n and K must be at least 2; got '1x4x3'"),
        ("bench_products", ["--sizes", "0x5x3"], "--sizes takes n x d x K of at least 1 each"),
        ("bench_products", ["--repeats", "0"], "--repeats must be at least 1; got 0"),
        ("bench_products", ["--threads", "0"], "--threads must be at least 1; got 0"),
        # scikit-learn's ValueError from the first search.
        ("bench_cv", ["--folds", "1"], "--folds must be at least 2; got 1"),
        # UnboundLocalError, "min() arg is an empty sequence", "need at least one array to
        # stack", and an IndexError or scikit-learn's ValueError after the main table.
        ("bench_threads", ["--repeats", "0"], "--repeats must be at least 1; got 0"),
        ("profile_fit", ["--repeat", "0"], "--repeat must be at least 1; got 0"),
        ("bench_cv", ["--n-Cs", "0"], "--n-Cs must be at least 1; got 0"),
        ("bench_cosine", ["--sweep-folds", "1"], "--sweep-folds must be at least 2; got 1"),
        ("bench_cosine", ["--sweep-scales"], "--sweep-scales: expected at least one argument"),
        # options of rows not asked for, which changed nothing and said nothing.
        (
            "bench_cosine",
            [*SMALL_COSINE, "--sweep-scales", "8", "16"],
            "--sweep-scales applies to --sweep, which was not given",
        ),
        (
            "bench_cosine",
            [*SMALL_COSINE, "--sweep-folds", "2"],
            "--sweep-folds applies to --sweep, which was not given",
        ),
        (
            "bench_cosine",
            [*SMALL_COSINE, "--linear-history", "5", "--no-equivalent"],
            "--linear-history fits the linear problems at mean μ, which --no-equivalent skips",
        ),
        # options of the cosine rows, with none (--scales with no value: the main table's
        # other rows, or --sweep's).
        ("bench_cosine", [*SMALL_COSINE[:-3], "--spheres"],
         "--spheres applies to the cosine rows, which --scales with no value skips"),
        ("bench_cosine", [*SMALL_COSINE[:-3], "--linear-history", "5"],
         "--linear-history applies to the cosine rows, which --scales with no value skips"),
        # no row at 0, an IndexError at -3 (after the main table).
        ("bench_cosine", ["--linear-history", "0", *SMALL_COSINE], "must be at least 1, got 0"),
        ("bench_cosine", ["--linear-history", "-3", *SMALL_COSINE], "must be at least 1, got -3"),
        # a torch device's ValueError at the warm-up fit.
        ("bench_cosine", ["--device", "bogus"], "--device: device='bogus' is not a torch"),
        # an empty test split.
        ("bench_cosine", [*SMALL_COSINE, "--n-test", "0"], "--n-test must be at least 1; got 0"),
        # scikit-learn's "at least 2 classes" or NumPy's "high <= 0" from the synthetic
        # data (torch's RuntimeError in bench_probe_imagenet), after the data were made.
        ("bench_fit", [*SMALL_FIT, "--n-classes", "1"], "--n-classes must be at least 2; got 1"),
        ("bench_fit", [*SMALL_FIT, "--n-features", "0"], "--n-features must be at least 1; got 0"),
        ("profile_fit", [*SMALL_FIT, "--n-classes", "0"], "--n-classes must be at least 2; got 0"),
        ("bench_cv", [*SMALL_FIT, "--n-classes", "1"], "--n-classes must be at least 2; got 1"),
        ("bench_cosine", [*SMALL_COSINE, "--n-classes", "1"], "--n-classes must be at least 2"),
        (
            "cosine_tried",
            [*SMALL_FIT, "--n-classes", "0", "--only", "cold"],
            "--n-classes must be at least 2; got 0",
        ),
        (
            "bench_probe_imagenet",
            [*SMALL_FIT, "--n-classes", "1"],
            "--n-classes must be at least 2",
        ),
        (
            "bench_probe_imagenet",
            [*SMALL_FIT, "--n-features", "0"],
            "--n-features must be at least",
        ),
        ("bench_cv", [*SMALL_FIT, "--n-samples", "4"], "--n-samples must be at least --folds (5)"),
        (
            "bench_probe_imagenet",
            [*SMALL_FIT, "--n-samples", "0"],
            "--n-samples must be at least 1",
        ),
        (
            "bench_probe_imagenet",
            [*SMALL_FIT, "--batch-size", "0"],
            "--batch-size must be at least",
        ),
        # a folder to write the JSON to: an IsADirectoryError after the run (bench_fit's after
        # its first row, quality's after its first seed).
        ("bench_fit", [*SMALL_FIT, "--n-classes", "3", "--repeat", "1", "--json", FOLDER],
         "--json takes a file to write, got the folder"),
        ("bench_cv", [*SMALL_CV, "--json", FOLDER], "--json takes a file to write"),
        ("bench_cosine", [*SMALL_COSINE, "--json", FOLDER], "--json takes a file to write"),
        ("bench_extract", [*SMALL_EXTRACT, "--json", FOLDER], "--json takes a file to write"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--n-classes", "3", "--peer-rows", "0",
                                  "--json", FOLDER], "--json takes a file to write"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--out", FOLDER],
         "--out takes a file to write, got the folder"),
        # torch's RuntimeError at the first tensor.
        ("bench_probe_imagenet", ["--device", "bogus"], "--device takes auto, cpu or cuda; got"),
        # scikit-learn's InvalidParameterError at a fit (the tilts' after the untilted rows,
        # --sweep-scales' after the main table), NumPy's ValueError at a negative seed or
        # a NaN / infinite feature, once the data were made.
        ("bench_fit", [*SMALL_FIT, "--C", "0"], "--C must be positive; got 0.0"),
        ("bench_fit", [*SMALL_FIT, "--tilts", "1", "-1"], "--tilts must be at least 0 and finite"),
        ("bench_fit", [*SMALL_FIT, "--offset", "nan"], "--offset must be finite; got nan"),
        ("bench_fit", [*SMALL_FIT, "--seed", "-1"], "--seed must be between 0 and 2**32 - 1"),
        ("profile_fit", [*SMALL_FIT, "--offset", "inf"], "--offset must be finite; got inf"),
        ("profile_fit", [*SMALL_FIT, "--seed", "-1"], "--seed must be between 0 and 2**32 - 1"),
        ("bench_cv", [*SMALL_CV, "--seed", "-1"], "--seed must be between 0 and 2**32 - 1"),
        ("bench_cosine", [*SMALL_COSINE, "--C", "-1"], "--C must be positive; got -1.0"),
        ("bench_cosine", [*SMALL_COSINE, "--scales", "0"], "--scales must be positive and finite"),
        ("bench_cosine", [*SMALL_COSINE, "--c-bar", "0"], "--c-bar must be positive and finite"),
        ("bench_cosine", [*SMALL_COSINE, "--tol", "-1"], "--tol must be at least 0 and finite"),
        ("bench_cosine", [*SMALL_COSINE, "--sweep", "--sweep-scales", "0", "8"],
         "--sweep-scales must be positive and finite; got [0.0, 8.0]"),
        ("bench_cosine", [*SMALL_COSINE, "--seed", "-1"], "--seed must be between 0 and 2**32"),
        ("cosine_tried", [*SMALL_FIT, "--scale", "0", "--only", "cold"],
         "--scale must be positive and finite; got 0.0"),
        ("cosine_tried", [*SMALL_FIT, "--scale", "16", "--tol", "nan", "--only", "cold"],
         "--tol must be at least 0 and finite; got nan"),
        ("cosine_tried", [*SMALL_FIT, "--scale", "16", "--seed", "-1", "--only", "cold"],
         "--seed must be between 0 and 2**32 - 1"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--peer-rows", "0", "--C", "0"],
         "--C must be positive; got 0.0"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--peer-rows", "0", "--seed", "-1"],
         "--seed must be between 0 and 2**32 - 1"),
        ("bench_feature_scale", ["--scales", "1", "inf"], "--scales must be positive and finite"),
        ("bench_scale_path", ["--tol", "-1"], "--tol must be at least 0 and finite; got -1.0"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY[:-2], "--seeds", "-1"],
         "--seeds must be between 0 and 2**32 - 1; got [-1]"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--levers", "--bound", "-1"],
         "--bound must be between 0 and 100 (points); got -1.0"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--levers", "--bound", "nan"],
         "--bound must be between 0 and 100 (points); got nan"),
        ("quality", ["--data", "fmnist", "--image-sizes", "0", "--cache", FOLDER],
         "--image-sizes must be at least 1; got [0]"),
        # skipped as 0 skips it, without a word; scikit-learn's ValueError after the main fits.
        ("bench_probe_imagenet", [*SMALL_FIT, "--peer-rows", "-1"],
         "--peer-rows must be at least 0 (0 skips the comparison); got -1"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--n-classes", "3", "--peer-rows", "1"],
         "--peer-rows 1 takes rows of 1 class; two or more are needed"),
        # fits of no iteration timed and tabled (-1: scikit-learn's InvalidParameterError).
        ("bench_probe_imagenet", [*SMALL_FIT, "--peer-rows", "0", "--lbfgs-iter", "0"],
         "--lbfgs-iter must be at least 1; got 0"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--peer-rows", "0", "--adam-epochs", "0"],
         "--adam-epochs must be at least 1; got 0"),
        ("bench_fit", [*SMALL_FIT, "--n-classes", "3", "--repeat", "1", "--max-iter", "0"],
         "--max-iter must be at least 1; got 0"),
        ("bench_cv", [*SMALL_CV, "--max-iter", "0"], "--max-iter must be at least 1; got 0"),
        ("bench_cosine", [*SMALL_COSINE, "--max-iter", "0"], "--max-iter must be at least 1"),
        ("cosine_tried", [*SMALL_FIT, "--scale", "16", "--max-iter", "0", "--only", "cold"],
         "--max-iter must be at least 1; got 0"),
        ("bench_fit", [*SMALL_FIT, "--max-iter", "-1"], "--max-iter must be at least 1; got -1"),
        # a repeated value: its row made and printed twice (bench_fit's ratio table kept
        # one, keyed by the name), a seed counted twice in mean ± std, an experiment run
        # twice, --sweep-scales 8 8 a ValueError after the search's fits.
        ("bench_fit", [*SMALL_FIT, "--n-classes", "3", "--repeat", "1", "--tilts", "1", "1"],
         "--tilts takes each value once; got [1.0, 1.0]"),
        ("bench_cosine", [*SMALL_COSINE[:-3], "16", "16"], "--scales takes each value once"),
        ("bench_cosine", [*SMALL_COSINE, "--no-equivalent", "--sweep", "--sweep-scales", "8", "8"],
         "--sweep-scales takes each value once; got [8.0, 8.0]"),
        ("bench_feature_scale", ["--scales", "1", "1"], "--scales takes each value once"),
        ("cosine_tried", [*SMALL_FIT, "--scale", "16", "--only", "active", "active"],
         "--only takes each value once; got ['active', 'active']"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "0", "--methods", "ERM"],
         "--seeds takes each value once; got [0, 0]"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--kinds", "spread", "spread",
                     "--methods", "ERM"], "--kinds takes each value once"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--classes", "2", "2",
                     "--methods", "ERM"], "--classes takes each value once"),
        ("bench_minibatch", ["--no-steps", "--seeds", "0", "0", "--C", "1"],
         "--seeds takes each value once; got [0, 0]"),
        ("bench_minibatch", ["--seeds", "0", "--dims", "4", "4"], "--dims takes each value once"),
        ("bench_threads", ["--sizes", "60x4x3", "60X4X3", "--iters", "1", "--repeats", "1"],
         "--sizes takes each size once"),
        ("bench_products", ["--sizes", "50x8x2", "50x8x2", "--repeats", "1"],
         "--sizes takes each size once"),
        ("bench_extract", [*SMALL_EXTRACT, "--sources", "folder,folder"],
         "--sources takes each source once"),
        # the estimator's ValueError at the warm-up fit, on no row or one class (seed 11:
        # five rows of one class of two).
        ("profile_fit", ["--n-samples", "0", "--n-features", "4"],
         "--n-samples 0 takes rows of 0 class(es); two or more are needed"),
        ("profile_fit", ["--n-samples", "1", "--n-features", "4"],
         "--n-samples 1 takes rows of 1 class(es); two or more are needed"),
        ("bench_fit", [*SMALL_FIT[2:], "--n-samples", "5", "--n-classes", "2", "--seed", "11"],
         "--n-samples 5 takes rows of 1 class(es); two or more are needed"),
        ("bench_cv", [*SMALL_CV[2:], "--n-samples", "5", "--n-classes", "2", "--seed", "11"],
         "--n-samples 5 takes rows of 1 class(es); two or more are needed"),
        ("bench_cosine", [*SMALL_COSINE[2:], "--n-samples", "1"],
         "--n-samples 1 takes rows of 1 class(es); two or more are needed"),
        ("cosine_tried", [*SMALL_COSINE[2:8], "--n-samples", "1", "--only", "cold"],
         "--n-samples 1 takes rows of 1 class(es); two or more are needed"),
        ("bench_probe_imagenet", [*SMALL_FIT[2:], "--n-samples", "1", "--peer-rows", "0"],
         "--n-samples 1 takes rows of 1 class(es); two or more are needed"),
        # a file to write under a file: an OSError (FileExistsError) once the run was done
        # (bench_fit's after its first row, quality's after its first seed).
        ("bench_fit", [*SMALL_FIT, "--n-classes", "3", "--repeat", "1", "--json", UNDER_A_FILE],
         f"--json {UNDER_A_FILE} cannot be written: {__file__} is not a folder"),
        ("bench_cv", [*SMALL_CV, "--json", UNDER_A_FILE], "is not a folder this process can"),
        ("bench_cosine", [*SMALL_COSINE, "--json", UNDER_A_FILE], "is not a folder this process"),
        ("bench_extract", [*SMALL_EXTRACT, "--json", UNDER_A_FILE], "is not a folder this"),
        ("bench_probe_imagenet", [*SMALL_FIT, "--n-classes", "3", "--peer-rows", "0",
                                  "--json", UNDER_A_FILE], "is not a folder this process"),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--methods", "ERM", "--out",
                     UNDER_A_FILE], f"--out {UNDER_A_FILE} cannot be written"),
        # StratifiedKFold's ValueError: 60 rows of 100 classes, at most 3 of one.
        ("bench_cv", [*SMALL_FIT, "--n-classes", "100", "--n-Cs", "1", "--skip", "lrcv"],
         "--folds must be at most the training rows of the largest class (3 of --n-samples 60)"),
        # StratifiedKFold's ValueError, after the main table.
        ("bench_cosine", [*SMALL_COSINE, "--no-equivalent", "--sweep", "--sweep-folds", "100"],
         "--sweep-folds must be at most the training rows of the largest class"),
        # create_backbone's ValueError, PIL's "cannot write empty image", the images written.
        ("bench_extract", [*SMALL_EXTRACT, "--image-size", "0"], "--image-size must be at least 1"),
        ("bench_extract", [*SMALL_EXTRACT, "--source-size", "0"], "--source-size must be at least"),
        # each fresh process's traceback (--seeds: after the peer's rows); d = 0 was timed.
        ("bench_minibatch", ["--no-steps", "--seeds", "0", "--C", "0"], "--C must be positive"),
        ("bench_minibatch", ["--no-steps", "--seeds", "-1"], "--seeds must be between 0 and 2**32"),
        ("bench_minibatch", ["--seeds", "0", "--dims", "0"], "--dims must be at least 1; got [0]"),
        # a table of inf times; classwise_report's error on no class; a row twice; a
        # FileExistsError.
        ("bench_plots", ["--repeats", "0"], "--repeats must be at least 1; got 0"),
        ("bench_plots", ["--classes", "0"], "--classes must be at least 1 each; got [0]"),
        ("bench_plots", ["--classes", "5", "5"], "--classes takes each count once; got [5, 5]"),
        ("bench_plots", ["--keep", __file__], "--keep takes a folder, got the file"),
    ],
)  # fmt: skip
def test_a_bad_option_value_is_one_line(script, argv, message, capsys):
    module = load_benchmark(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("folder", ["kept", "kept/new"])
@pytest.mark.parametrize(
    "script, argv",
    [
        ("bench_fit", [*SMALL_FIT, "--n-classes", "3", "--repeat", "1", "--devices", "cpu",
                       "--json"]),
        ("quality", ["--data", "synthetic", *SMALL_QUALITY, "--methods", "ERM", "--out"]),
        # (these wrote their JSON by write_text: the link kept, a folder to make refused)
        pytest.param("bench_cv", [*SMALL_CV, "--json"], marks=pytest.mark.slow),  # (workers)
        pytest.param("bench_extract", [*SMALL_EXTRACT, "--json"], marks=pytest.mark.slow),
        ("bench_cosine", [*SMALL_COSINE, "--no-equivalent", "--json"]),
        ("bench_probe_imagenet", ["--n-samples", "200", "--n-features", "8", "--n-classes",
                                  "3", "--peer-rows", "0", "--lbfgs-iter", "5",
                                  "--adam-epochs", "1", "--device", "cpu", "--json"]),
    ],
)  # fmt: skip
def test_a_results_file_that_is_a_link_is_written_through_it(
    script, argv, folder, tmp_path, capsys
):
    # The file was written beside the link, then renamed over it: the link became a file,
    # and its target kept the last run's results. A link into a folder still to make (as
    # check_output takes it) ended the run in a FileNotFoundError, its results lost.
    target = tmp_path / folder / "results.json"
    if folder == "kept":
        target.parent.mkdir()
        target.write_text("{}")
    (tmp_path / "latest.json").symlink_to(target)
    load_benchmark(script).main([*argv, str(tmp_path / "latest.json")])
    assert (tmp_path / "latest.json").is_symlink()
    assert json.loads(target.read_text())
    names = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    assert names == {"kept", folder, f"{folder}/results.json", "latest.json"}


def test_bench_fit_refuses_cuda_alone_without_cuda(capsys, monkeypatch):
    """--devices cuda without CUDA would time scikit-learn alone, and exit 0."""
    module = load_benchmark("bench_fit")
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--devices", "cuda", "--n-samples", "50", "--n-features", "4",
                     "--n-classes", "2", "--repeat", "1"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--devices cuda: no CUDA device here" in capsys.readouterr().err


class _Store:
    """load_features' store, ten rows of it."""

    features = np.random.default_rng(0).normal(size=(10, 8)).astype(np.float32)
    labels = np.arange(10) % 3

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("script", ["bench_cosine", "cosine_tried"])
def test_a_store_without_a_test_row_is_refused(script, capsys, monkeypatch):
    """--n-samples of all a store's rows or more would leave an empty test split."""
    monkeypatch.setattr("extract.load_features", lambda path: _Store())
    module = load_benchmark(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--store", "ten.h5", "--n-samples", "10", "--n-test", "5",
                     "--scales" if script == "bench_cosine" else "--scale", "16"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--store ten.h5 has 10 rows: not one test row after --n-samples 10" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("script", ["bench_cosine", "cosine_tried"])
@pytest.mark.parametrize(
    "store, message",
    [
        ("no-such-store.h5", "--store: The feature store 'no-such-store.h5' does not exist"),
        (__file__, "is not an HDF5 file; pass an HDF5 feature store"),
    ],
)
def test_a_store_that_cannot_be_read_is_one_line(script, store, message, capsys):
    """A missing file or one that is no store ended in the store's traceback."""
    module = load_benchmark(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--store", store, "--scales" if script == "bench_cosine" else "--scale", "16"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "script, option",
    [
        ("bench_cosine", "--n-features"),
        ("bench_cosine", "--n-classes"),
        ("bench_cosine", "--seed"),  # (it draws nothing else there: cosine_tried's does)
        ("cosine_tried", "--n-features"),
        ("cosine_tried", "--n-classes"),
    ],
)
def test_a_store_refuses_the_synthetic_features_options(script, option, capsys, monkeypatch):
    """A store's features and classes are its own: --n-classes 2 with --store fitted all
    three classes of the store's rows without a word, and bench_cosine's --seed changed
    nothing."""
    monkeypatch.setattr("extract.load_features", lambda path: _Store())
    module = load_benchmark(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--store", "ten.h5", "--n-samples", "6", "--n-test", "4", option, "2",
                     "--scales" if script == "bench_cosine" else "--scale", "16"])  # fmt: skip
    assert exit_info.value.code == 2
    assert f"{option} applies to synthetic features, not to --store" in capsys.readouterr().err


@pytest.mark.parametrize(
    "must, accepted, refused",
    [
        ("POSITIVE", [1e-8, 1.0, np.inf], [0.0, -1.0, np.nan]),  # --C (C = inf is valid)
        ("POSITIVE_FINITE", [1e-8, 1.0], [0.0, np.inf, np.nan]),  # --scales 1
        ("AT_LEAST_1", [1], [0, -1]),  # --max-iter 1
        ("AT_LEAST_0_FINITE", [0.0, 1e-8], [-1e-8, np.inf, np.nan]),  # --tol 0, --tilts 0
        ("FINITE", [0.0, -1.0], [np.inf, -np.inf, np.nan]),  # --offset 0
        ("SEED", [0, 2**32 - 1], [-1, 2**32]),  # --seed 0
    ],
)
def test_check_values_accepts_the_values_at_its_limits(must, accepted, refused, capsys):
    """The limits themselves are valid values (--tol 0, --seed 0, --offset 0, --scales 1):
    only the values past them are refused, each alone and in a list."""
    bench_fit = load_benchmark("bench_fit")
    parser = bench_fit.argparse.ArgumentParser(prog="bench")
    check = getattr(bench_fit, must)
    for value in [*accepted, accepted]:
        bench_fit.check_values(parser, SimpleNamespace(x=value), check, "--x")
    for value in [*refused, [*accepted, refused[0]]]:
        with pytest.raises(SystemExit):
            bench_fit.check_values(parser, SimpleNamespace(x=value), check, "--x")
        assert f"--x must be {check[0]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "script, argv",
    [
        ("bench_fit", ["--n-features", "4", "--n-classes", "30", "--repeat", "1", "--devices",
                       "cpu", "--tilts", "--max-iter", "20"]),
        ("bench_cv", ["--n-features", "4", "--n-classes", "10", "--n-Cs", "1", "--skip", "lrcv",
                      "--skip", "grid", "--folds", "2", "--max-iter", "20"]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("n_samples, said", [pytest.param(20, 1, marks=pytest.mark.slow), (600, 0)])
def test_test_rows_of_classes_the_training_rows_lack_are_said(
    script, argv, n_samples, said, tmp_path, capsys
):
    # Synthetic labels of more classes than a few training rows draw: the test rows of the
    # others were scored wrong by every model without a word (bench_fit printed 0.00); its
    # --json said nothing of them (its line is "untrained_test_rows", null where none).
    out = tmp_path / "rows.json"
    with warnings.catch_warnings():  # (few rows of many classes: scikit-learn's warnings)
        warnings.simplefilter("ignore")
        load_benchmark(script).main([*argv, "--n-samples", str(n_samples), "--json", str(out)])
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if "test rows are of classes that the training rows lack (" in line
    ]
    assert len(lines) == said
    assert all(line.endswith("): every model predicts them wrong)") for line in lines)
    assert json.loads(out.read_text())["untrained_test_rows"] == (lines[0] if said else None)


def test_bench_scale_path_keeps_its_cells_apart(monkeypatch, capsys):
    # At --tol 0 a cell, "11996 it,   0.125 (16 warn)", was wider than its 24 characters
    # and ran into the one before it: "(16 warn)11996 it".
    module = load_benchmark("bench_scale_path")
    fitted = SimpleNamespace(n_iter_=np.array([11996]), C_=0.125, scores_=np.ones((1, 3, 10)))
    monkeypatch.setattr(module, "search", lambda *args, **params: (fitted, 16))
    monkeypatch.setattr(module, "GRIDS", {"bisect": "bisect"})
    chosen = SimpleNamespace(best_params_={"scale": 1.0}, best_score_=0.5)
    monkeypatch.setattr(module, "GridSearchCV", lambda *args, **params: SimpleNamespace(
        fit=lambda X, y: chosen))  # fmt: skip
    module.main(["--tol", "0"])
    header, rule, row = capsys.readouterr().out.splitlines()[1:4]
    cell = r"11996 it,   0\.125 \(16 warn\)"
    assert len(re.findall(rf"(?<=  ){cell}(?=  |$)", row)) == len(module.RULES)
    assert len(header) == len(rule) == len(row)
