"""A guard that fails a test which would otherwise wait for ever (a FIFO's open)."""

import contextlib
import signal


class Waited(BaseException):
    """Raised by :func:`fails_after_waiting`: a BaseException, which no handler of the code
    under test catches (a run's own errors are Exceptions)."""


@contextlib.contextmanager
def fails_after_waiting(seconds: int, what: str):
    """Raise :class:`Waited` (saying ``what``) if the block is still running after
    ``seconds``; SIGALRM's handler is restored after it."""

    def waited(*_):
        raise Waited(what)

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
