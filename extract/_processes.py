"""What identifies a rank's process (its host's boot and name, its PID and time namespaces,
its pid and start time), which it writes into the group's store as it starts beating, and
whether that process, seen from another on the same host, has ended: a rank killed outright
(``kill -9``, the out-of-memory killer) is then named at once, not after its heartbeat's
silence. Linux alone (its ``/proc``); elsewhere no identity, and no process is ever said to
have ended."""

from __future__ import annotations

import json
import os


def process_identity() -> bytes | None:
    """This process's identity, as JSON (:func:`ended`), or None where ``/proc`` does not
    tell it (macOS, Windows, a ``/proc`` of another PID namespace)."""
    try:
        if not _own_proc():
            return None
        pid = os.getpid()
        return json.dumps({**_here(), "pid": pid, "start": _stat(pid)[1]}).encode()
    except (OSError, ValueError, IndexError):
        return None


def ended(identity: bytes | None) -> int | None:
    """The pid of the process ``identity`` names (:func:`process_identity`, another
    rank's) where it has ended: it is on this host and in this process's PID and time
    namespaces, and no process runs under its pid, or one with another start time runs
    there (the pid reused), or it is a zombie with no thread left (killed, its parent yet to
    reap it; not one whose first thread alone has ended, its others running). None
    where it still runs, and wherever that cannot be told (no identity, another host or
    namespace, ``/proc`` unreadable): never a process that runs."""
    try:
        theirs = json.loads(identity)
        pid, start = int(theirs["pid"]), int(theirs["start"])
        here = _here()
        if {where: theirs[where] for where in here} != here:
            return None
        if pid <= 0 or not _own_proc():
            return None
        try:
            os.kill(pid, 0)  # (signal 0: nothing sent; whether the pid is there at all)
        except ProcessLookupError:
            return pid
        except PermissionError:  # (there, another user's: its stat tells whose it is)
            pass
        state, now, threads = _stat(pid)
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        # (a stat gone between the two looks is told at the next; hidden, as ``/proc``
        # mounted with hidepid hides another user's processes: never said to have ended)
        return None
    # (a zombie whose other threads run is a process whose first thread alone ended: it runs)
    return pid if now != start or (state in ("Z", "X") and threads <= 1) else None


def _here() -> dict[str, str | None]:
    """This host's boot id and name, this process's PID namespace and its time namespace
    (None before Linux 5.6, which has none). The boot id is drawn at each boot, but virtual
    machines cloned from one snapshot of a running one share it: their names tell them
    apart, as a cluster's hosts have each their own (a name changed while a rank runs only
    makes it one whose end is not told). A process's start time in ``/proc`` is told from
    the boot of the reader's time namespace: one of another time namespace, as a container
    restored by CRIU, reads another start time for the same process. Read at each call
    (a few microseconds), not kept: a process that moves into other namespaces (unshare)
    and forks would give its child the parent's."""
    with open("/proc/sys/kernel/random/boot_id") as file:
        boot = file.read().strip()
    try:
        time_ns = os.readlink("/proc/self/ns/time")
    except FileNotFoundError:
        time_ns = None
    pid_ns = os.readlink("/proc/self/ns/pid")
    return {"boot": boot, "host": os.uname().nodename, "pid_ns": pid_ns, "time_ns": time_ns}


def _own_proc() -> bool:
    """Whether ``/proc`` is this process's PID namespace's (its pids are the ones
    ``os.kill`` takes)."""
    return os.readlink("/proc/self") == str(os.getpid())


def _stat(pid: int) -> tuple[str, int, int]:
    """The state (R, S, Z, ...) of process ``pid``, when it started (in clock ticks since
    the host booted) and its number of threads: fields 3, 22 and 20 of its
    ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        stat = file.read().decode(errors="replace")
    fields = stat[stat.rindex(")") + 2 :].split()  # (its name, within parentheses, may hold any)
    return fields[0], int(fields[19]), int(fields[17])
