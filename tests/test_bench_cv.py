"""bench_cv.py runs its peers as scikit-learn asks, without its FutureWarnings."""

import warnings

from tests._scripts import load_benchmark


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
