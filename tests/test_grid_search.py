"""GridSearchCV over c_bar × lam × C on a Dask cluster through joblib's Dask backend."""

import warnings

import joblib
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, StratifiedKFold

from mr2_probe import MR2LinearClassifier
from mr2_probe.metrics import classwise_scorers

distributed = pytest.importorskip(
    "dask.distributed",
    reason="the Dask backend needs dask[distributed] (pip install 'dask[distributed]')",
)
import dask  # noqa: E402  (installed with dask.distributed)

GRID = [
    {"c_bar": [None, 1.0], "lam": [0.0], "C": [0.1, 1.0]},
    # One compactness point: minibatch Adam, seeded, so both backends see the same run.
    {"c_bar": [1.0], "lam": [0.5], "C": [1.0], "max_iter": [3]},
]


def _search(X, y):
    search = GridSearchCV(
        MR2LinearClassifier(max_iter=30, batch_size=64, random_state=0, device="cpu"),
        GRID,
        scoring=classwise_scorers(),
        refit="worst_class",
        cv=StratifiedKFold(3),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return search.fit(X, y)


@pytest.mark.slow
def test_dask_backend_matches_the_default_backend(tmp_path):
    X, y = load_digits(return_X_y=True)
    X, y = X[:360] / 16.0, y[:360]
    local = _search(X, y)
    # In-process workers: no process start-up or re-import of torch, yet every fit is a
    # Dask task run by one of two single-threaded workers. The scheduler's and the workers'
    # dask-scratch-space in tmp_path, not left in /tmp.
    with (
        dask.config.set({"temporary-directory": str(tmp_path)}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        distributed.get_task_stream(client) as tasks,
        joblib.parallel_config(backend="dask"),
    ):
        remote = _search(X, y)
    assert len(tasks.data) > 0, "no task ran on the Dask cluster"
    assert remote.best_params_ == local.best_params_
    assert remote.best_index_ == local.best_index_
    assert remote.cv_results_["params"] == local.cv_results_["params"]
    for key, value in local.cv_results_.items():
        if "_test_" in key:
            np.testing.assert_allclose(remote.cv_results_[key], value, atol=1e-10, err_msg=key)
    np.testing.assert_allclose(
        remote.best_estimator_.coef_, local.best_estimator_.coef_, atol=1e-10
    )
