"""Fixtures shared by several test modules."""

import pytest


@pytest.fixture
def no_model(monkeypatch):
    """Fail if a backbone is loaded: output checks must come before any work."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr("extract._runner.create_backbone", forbidden)
