"""Fixtures shared by several test modules, and the ``cuda`` marker's skip."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def no_model(monkeypatch):
    """Fail if a backbone is loaded: output checks must come before any work."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr("extract._runner.create_backbone", forbidden)
