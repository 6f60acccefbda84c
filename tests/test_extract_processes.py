"""A rank's process identity, and whether another rank on the same host sees it ended."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from extract._processes import _stat, ended, process_identity

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")


def _identity_of(pid: int, **changed) -> bytes:
    """The identity of process ``pid`` of this host, as :func:`process_identity` writes
    it for its own, with ``changed`` fields."""
    with open("/proc/sys/kernel/random/boot_id") as file:
        boot = file.read().strip()
    with open(f"/proc/{pid}/stat") as file:  # (field 22; these processes' names hold no space)
        start = int(file.read().split()[21])
    fields = {"boot": boot, "host": os.uname().nodename, "pid": pid}
    fields["pid_ns"] = os.readlink("/proc/self/ns/pid")
    fields["time_ns"] = (
        os.readlink("/proc/self/ns/time") if os.path.exists("/proc/self/ns/time") else None
    )
    return json.dumps({**fields, "start": start, **changed}).encode()


def test_the_identity_names_this_process():
    assert json.loads(process_identity()) == json.loads(_identity_of(os.getpid()))


def test_a_process_that_runs_has_not_ended():
    assert ended(process_identity()) is None
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert ended(_identity_of(child.pid)) is None
    finally:
        child.kill()
        child.wait()


def test_a_process_that_ended_has_ended():
    child = subprocess.Popen(["sleep", "0"])
    identity = _identity_of(child.pid)  # (there until it is reaped)
    child.wait()
    assert ended(identity) == child.pid


def test_a_killed_process_not_reaped_yet_has_ended():
    # A rank killed (SIGKILL) whose parent (torchrun's launcher, a forkserver) has not yet
    # reaped it: a zombie, whose pid and start time are still there.
    child = subprocess.Popen(["sleep", "30"])
    try:
        identity = _identity_of(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _stat(child.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _stat(child.pid)[0] == "Z"
        assert ended(identity) == child.pid
    finally:
        child.kill()
        child.wait()


def test_a_process_whose_first_thread_alone_ended_has_not_ended():
    # Its first thread (its pid's) ended, another runs on (pthread_exit in the main thread,
    # as a program embedding Python may do): /proc shows it a zombie, and it runs.
    code = (
        "import ctypes, threading, time; from extract._processes import process_identity; "
        "print(process_identity().decode(), flush=True); "
        "threading.Thread(target=time.sleep, args=(30,)).start(); "
        "ctypes.CDLL(None).pthread_exit(None)"
    )
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": here}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        identity = child.stdout.readline()
        deadline = time.monotonic() + 10
        while _stat(child.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _stat(child.pid)[0] == "Z"
        assert ended(identity) is None
    finally:
        child.kill()
        child.wait()


def test_a_pid_reused_by_another_process_has_ended():
    # The pid runs (this process), started at another time than the identity's process.
    mine = json.loads(process_identity())
    assert ended(_identity_of(os.getpid(), start=mine["start"] - 1)) == os.getpid()


@pytest.mark.parametrize("field", ["boot", "host", "pid_ns", "time_ns"])
def test_a_process_of_another_host_or_namespace_is_not_told(field):
    # Its pid says nothing here, not even where no process runs under it here. (Another
    # host's name alone: a virtual machine cloned from the same snapshot of a running one
    # as this, whose boot id it shares.)
    child = subprocess.Popen(["sleep", "0"])
    identity = json.loads(_identity_of(child.pid))
    child.wait()
    identity[field] = "another"
    assert ended(json.dumps(identity).encode()) is None


def test_a_process_of_another_time_namespace_that_runs_has_not_ended():
    # Its start time in /proc is told from the boot of the reader's time namespace: a
    # process of another (a container restored by CRIU, say) reads another start time for
    # itself than this process reads for it, the same process running all along.
    code = (
        "import time; from extract._processes import process_identity; "
        "print(process_identity().decode(), flush=True); time.sleep(30)"
    )
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        child = subprocess.Popen(
            ["unshare", "--time", "--boottime", "1000", "--fork", "--kill-child"]
            + [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": here},
        )
    except FileNotFoundError:
        pytest.skip("no unshare here")
    try:
        identity = child.stdout.readline()
        if not identity:  # (time namespaces need Linux 5.6 and the right to make one)
            pytest.skip("no time namespace can be made here")
        assert json.loads(identity)["pid"] != child.pid  # (unshare's child: its own process)
        assert ended(identity) is None
    finally:
        child.kill()  # (unshare, and with it the child it forked: --kill-child)
        child.wait()


@pytest.mark.parametrize(
    "identity", [None, b"", b"not json", b"{}", b'{"pid": "x"}', json.dumps([1]).encode()]
)
def test_no_identity_or_a_broken_one_is_not_told(identity):
    assert ended(identity) is None


def test_no_identity_where_proc_is_not_this_namespace_s(monkeypatch):
    # (a /proc of another PID namespace, where /proc/self is not this pid: its pids are not
    # the ones this process sees)
    from extract import _processes

    child = subprocess.Popen(["sleep", "0"])
    identity = _identity_of(child.pid)
    child.wait()
    monkeypatch.setattr(_processes, "_own_proc", lambda: False)
    assert process_identity() is None
    assert ended(identity) is None
