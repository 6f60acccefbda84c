"""The lock of a feature store: one writer at a time, its holder named, and no forked child
that keeps a killed writer's lock."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ._schema import StoreError, StoreLockedError

logger = logging.getLogger(__name__)


# Descriptors of the lock files this process holds (see _release_locks_in_child).
_HELD_LOCKS: set[int] = set()


def _release_locks_in_child() -> None:
    # A flock lock belongs to the open file description, which a forked child (a DataLoader
    # worker) shares: the lock would outlive a killed writer for as long as the child lives.
    # Pointing the child's copy of the descriptor at /dev/null keeps the lock the writer's own.
    if not _HELD_LOCKS:
        return
    try:
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError as err:
        if err.errno != errno.EMFILE:
            raise
        # At the limit on open files (the parent was, starting many workers): a lock's own
        # copy is closed to make room, then pointed at /dev/null as the others are.
        os.close(min(_HELD_LOCKS))
        null = os.open(os.devnull, os.O_RDONLY)
    try:
        for fd in _HELD_LOCKS - {null}:
            os.dup2(null, fd, inheritable=False)
    finally:
        if null not in _HELD_LOCKS:
            os.close(null)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_release_locks_in_child)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def _lock_record() -> str:
    """What a writer records in its lock file: its pid and host."""
    return f"{os.getpid()} {socket.gethostname()}"


def _holder(record: str) -> tuple[str, str | None]:
    """The pid and the host (None where another host is not named: a record of this host,
    or a pid alone, from an earlier writer) of a lock file's record."""
    pid, _, host = record.strip().partition(" ")
    host = host.strip()
    return pid, host if host and host != socket.gethostname() else None


def _locked_message(path: str, lock_path: str, record: str) -> str:
    pid, host = _holder(record)
    if host is None and pid.isdigit() and not _pid_running(int(pid)):
        return (
            f"The feature store {path!r} is locked, but its writer (pid {pid}) is no "
            f"longer running: a process it started still holds {lock_path!r}; end that "
            f"process (`fuser -v {lock_path}` shows it) or wait for it to exit."
        )
    where = f" on host {host}" if host else ""
    return (
        f"The feature store {path!r} is being written by another process (pid {pid}{where}); "
        "wait for it to finish or write to another path."
    )


def _lock_holder(path: str | os.PathLike) -> str | None:
    """The writer that ``<path>.lock`` records while another process holds that lock, as
    "pid" or "pid on host H"; None otherwise (the file keeps the last writer's record after
    it is released)."""
    try:
        # (not blocking: a FIFO of that name, opened to be read, waits for a writer)
        fd = os.open(f"{os.fspath(path)}.lock", os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # no lock file of mr2-extract
                return None
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its record is the writer's
                record = fh.read(300).decode("utf-8", "replace")
            else:
                return None
    except OSError:
        return None
    pid, host = _holder(record)
    if host is not None:  # its processes cannot be seen from here
        return f"{pid} on host {host}"
    mine = pid == str(os.getpid())  # this process writes it (not a reader's concern)
    return pid if pid.isdigit() and not mine and _pid_running(int(pid)) else None


# HDF5_USE_FILE_LOCKING values by which a user lets HDF5 open files without its lock.
_NO_HDF5_LOCKING = ("FALSE", "0", "BEST_EFFORT")


def _without_locks(path: str, lock_path: str, err: OSError) -> None:
    """A file system without locks (ENOSYS, ENOLCK, EOPNOTSUPP: Lustre or NFS mounted
    without them) refuses ``flock``: refused with a remedy, unless HDF5's locking is off
    (HDF5_USE_FILE_LOCKING), which HDF5 needs there too; then the store is written without
    the lock, and said so."""
    if err.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
        raise StoreError(
            f"Cannot lock {lock_path!r} beside the feature store {path!r}: {err.strerror or err}."
        ) from err
    # Compared as HDF5 compares it: "false" leaves HDF5's lock on.
    if os.environ.get("HDF5_USE_FILE_LOCKING", "") not in _NO_HDF5_LOCKING:
        raise StoreError(
            f"Cannot lock {lock_path!r} beside the feature store {path!r}: this file system "
            f"does not support file locks ({err.strerror or err}). Write the store to a "
            "local disk, or set HDF5_USE_FILE_LOCKING=FALSE in the environment (HDF5 needs "
            "it there too) to write it without locks; then no second run may write it at "
            "the same time."
        ) from err
    logger.warning(
        "This file system does not support file locks (%s): the feature store %r is "
        "written without its lock, as HDF5_USE_FILE_LOCKING asks. No second run may write "
        "it at the same time.",
        err.strerror or err,
        path,
    )


# Waits before a lock held is taken for a writer's: a reader that looks for the writer
# (_lock_holder) holds it, shared, for a moment; a writer holds it for its run.
_RETRY_S = (0.002, 0.02, 0.1)


def _lock_exclusive(fh) -> None:
    """``flock`` ``fh`` exclusively, tried again over about 0.1 s while it is held; the
    BlockingIOError of the last try where it still is."""
    for wait in (*_RETRY_S, None):
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if wait is None:
                raise
            time.sleep(wait)


@contextmanager
def store_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` while writing ``path``.

    ``flock`` is released by the kernel when the holder dies, so a killed run never leaves
    a stale lock behind. Processes forked while the lock is held (DataLoader workers) do
    not keep it: the lock is the writer's alone. The lock file records the holder's pid and host for
    the error message.
    """
    path = os.fspath(path)
    lock_path = f"{path}.lock"
    try:
        fh = open(lock_path, "a+")
    except OSError as err:
        raise StoreError(
            f"Cannot create the lock file {lock_path!r} beside the feature store: "
            f"{err.strerror}; write the store to a folder you can write to."
        ) from err
    try:
        try:
            _lock_exclusive(fh)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise StoreLockedError(_locked_message(path, lock_path, holder)) from None
        except OSError as err:
            _without_locks(path, lock_path, err)
        _HELD_LOCKS.add(fh.fileno())
        fh.seek(0)
        fh.truncate()
        fh.write(_lock_record())
        fh.flush()
        yield
    finally:
        _HELD_LOCKS.discard(fh.fileno())
        fh.close()
