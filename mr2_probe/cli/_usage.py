"""The one kind of error ``mr2-probe`` reports in one line, and how it writes one."""

from __future__ import annotations

import contextlib
import signal
import threading


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


@contextlib.contextmanager
def _interrupts_held():
    """A Ctrl-C inside is noted, and raised (KeyboardInterrupt) on leaving, as
    mr2-extract holds it while its libraries import: one inside NumPy's or torch's import
    leaves them half imported (a RecursionError's traceback, an abort in torch's C++). A
    second Ctrl-C is raised at once. No change outside the main thread, nor where SIGINT
    has another handler than Python's own (ignored, in a job started in the background)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    noted = []

    def note(signum, frame):
        if noted:
            raise KeyboardInterrupt
        noted.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        raise KeyboardInterrupt
