"""A torchrun rank's run stopped once its launcher is gone.

torchrun starts each rank in a session of its own, so a launcher killed outright (SIGKILL:
``kill -9``, the kernel's out-of-memory killer) leaves its ranks extracting, holding the
device and the store's locks for as long as the run lasts; its other ends (Ctrl-C, SIGTERM,
SIGHUP) stop them itself. Each rank watches its parent, as torch's DataLoader workers watch
theirs, and is interrupted as by a Ctrl-C once the parent has changed: the rows written so
far are kept, and the same command resumes. A rank still connecting to the launcher's
store (which died with it) is killed at once: torch retries that connection for the
group's timeout, where no Ctrl-C reaches it, and it holds nothing yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

# How often the parent is looked at, and how long an interrupted rank has to end before it
# is killed (its main thread may be waiting in C, where no KeyboardInterrupt reaches it).
POLL_S = 1.0
GRACE_S = 60.0

# This process and its parent as first seen, when ``extract`` was imported (it imports this
# module first): the parent at the call was taken for the launcher, and a launcher killed
# before it (while torch imported, or between a script's two calls) left the run going on
# to its end under its new parent.
_first_seen = (os.getpid(), os.getppid())


# Set while this rank connects to torchrun's store (no lock taken, no file open): killed at
# once there when its launcher is gone, rather than GRACE_S later.
_connecting = threading.Event()


@contextlib.contextmanager
def connecting() -> Iterator[None]:
    """Inside, this rank holds nothing that a kill would leave behind: once its launcher is
    gone it is killed at once (torch retries a refused connection to the launcher's store,
    which died with it, until the group's timeout; the Ctrl-C only makes it retry)."""
    _connecting.set()
    try:
        yield
    finally:
        _connecting.clear()


def _launcher_pid() -> int:
    """This process's parent as first seen (a forked child's, as it is now)."""
    global _first_seen
    if _first_seen[0] != os.getpid():  # (forked after the import: its parent is the forker)
        _first_seen = (os.getpid(), os.getppid())
    return _first_seen[1]


def launcher_gone() -> bool:
    """Whether this process runs under torchrun and its launcher is gone (its parent has
    changed): the store the launcher held went with it."""
    return "TORCHELASTIC_RUN_ID" in os.environ and os.getppid() != _launcher_pid()


@contextlib.contextmanager
def stops_with_launcher() -> Iterator[None]:
    """Inside, under torchrun (its ``TORCHELASTIC_RUN_ID`` set), a SIGINT to the main thread
    once this process's parent is no longer the launcher that started it (already at the
    entry, too; a SIGINT ignored at the entry, as a shell's background job inherits it,
    raises KeyboardInterrupt inside), and SIGKILL :data:`GRACE_S` seconds later if it has
    not left by then (where SIGINT's handler does not raise, that is how the rank ends), or
    within :data:`POLL_S` where it is :func:`connecting`. Elsewhere (not under torchrun,
    outside the main thread, on Windows), nothing."""
    if (
        "TORCHELASTIC_RUN_ID" not in os.environ
        or threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "pthread_kill")  # (Windows: no signal to a thread)
    ):
        yield
        return
    launcher, main = _launcher_pid(), threading.main_thread().ident
    left = threading.Event()
    # A shell ignores SIGINT in the jobs it starts in the background without job control
    # (`torchrun ... &` in a script), and the ranks inherit that: the watcher's Ctrl-C was
    # lost there, and a rank whose launcher was killed ran on for GRACE_S, then was killed.
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while not left.wait(POLL_S):
            if os.getppid() != launcher and not left.is_set():  # (not once the run has left)
                logger.warning(
                    "torchrun's launcher (pid %d) is gone: this rank stops; run the same "
                    "command again to resume",
                    launcher,
                )
                signal.pthread_kill(main, signal.SIGINT)  # as a Ctrl-C, in the main thread
                end = time.monotonic() + GRACE_S
                while not left.wait(min(POLL_S, max(0.0, end - time.monotonic()))):
                    if _connecting.is_set() or time.monotonic() >= end:
                        os.kill(os.getpid(), signal.SIGKILL)
                return

    watcher = threading.Thread(target=watch, name="mr2-extract launcher watch", daemon=True)
    try:  # (started inside: a Ctrl-C right after the start left a watcher behind)
        watcher.start()
        yield
    finally:
        left.set()
        if watcher.is_alive():
            watcher.join()
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
