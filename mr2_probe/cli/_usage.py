"""The one kind of error ``mr2-probe`` reports in one line, and how it writes one."""

from __future__ import annotations


class UsageError(ValueError):
    """A mistake in the options or the input files of ``mr2-probe``, told in one line."""


def _one_line(error, limit: int = 1000) -> str:
    """An error's (or warning's) message on one line, cut at ``limit`` characters (some
    messages print a whole array)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _few(values, n: int = 4, show=repr) -> str:
    shown = ", ".join(show(v) for v in list(values)[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "")
