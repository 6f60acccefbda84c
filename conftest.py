"""Fixtures of the whole suite, the doctests of ``mr2_probe`` and ``extract`` included
(those of ``tests/`` alone are in ``tests/conftest.py``)."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _doctest_temporary_folders(request, monkeypatch):
    """A doctest's ``tempfile.mkdtemp()`` (the Examples' output folders) inside its own
    ``tmp_path``, which pytest removes, not one more folder in /tmp at every run."""
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
