"""Long-lived site processes: started detached, known by PID *and* start time, stopped by signal.

``localplane.process.ManagedProcess`` ties a program's life to a Python object:
right for a test's control plane, wrong for a site, whose Postgres, API and
workers must outlive the operator and be adopted by the next one. So a site
process is identified by what the kernel says about it: its PID and its start
time (field 22 of ``/proc/<pid>/stat``, in clock ticks since boot). A PID alone
is never trusted: after a reboot or a long uptime it may name another program.

A zombie counts as dead. Processes started here are children of this Python
process until it exits, and an exited child stays a zombie until its parent
waits for it, so every liveness check first reaps the PID if it is ours. (After
an operator restart the orphans belong to PID 1, which on some machines never
reaps; that is why the state is read, not only the PID probed.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellplane_operator.errors import SiteError

__all__ = ["ProcessRecord", "spawn", "start_time", "is_running", "stop_processes",
           "wait_gone"]

# The Popen objects of the children this Python process started, by PID. They
# belong to the process, not to a driver: two drivers in one process (a test's
# "operator restart") share the children, and keeping the objects here means
# none is garbage-collected while its child runs (which would warn and park
# it in subprocess's own list).
_children: dict[int, subprocess.Popen[bytes]] = {}
_children_lock = threading.Lock()


@dataclass(frozen=True)
class ProcessRecord:
    """One site process as ``site.json`` keeps it."""

    role: str
    """``postgres``, ``api`` or ``worker-<i>``."""
    pid: int
    start_time: int
    """Field 22 of /proc/<pid>/stat when it was started: with the PID, its identity."""
    epoch: int | None = None
    """The placement-group epoch it acts under (None for Postgres)."""
    fingerprint: str = ""
    """A digest of its command line and environment: a change means a restart."""

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "start_time": self.start_time,
                "epoch": self.epoch, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ProcessRecord:
        return cls(role=str(raw["role"]), pid=int(raw["pid"]), start_time=int(raw["start_time"]),
                   epoch=None if raw.get("epoch") is None else int(raw["epoch"]),
                   fingerprint=str(raw.get("fingerprint", "")))

    @property
    def running(self) -> bool:
        return is_running(self.pid, self.start_time)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) from /proc/<pid>/stat; None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    """Collects the exit status of our own child, so it stops being a zombie."""
    with _children_lock:
        child = _children.get(pid)
        if child is not None:
            if child.poll() is not None:
                del _children[pid]
            return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or PID 1) reaps it


def start_time(pid: int) -> int | None:
    """The start time of a live process; None when it is gone or a zombie."""
    _reap(pid)
    found = _stat(pid)
    if found is None or found[0] in ("Z", "X", "x"):
        return None
    return found[1]


def is_running(pid: int, started: int) -> bool:
    """The very process that was recorded is alive: same PID and same start time."""
    return pid > 0 and start_time(pid) == started


def spawn(argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
          user: str | None = None, cwd: Path | None = None) -> tuple[int, int]:
    """Starts a program in its own session (it outlives us); returns (pid, start time).

    Output, stdout and stderr, is appended to ``log``. The environment is ours
    plus ``env``: secrets go there, never into ``argv`` (which ``ps`` shows).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            child = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **env} if env else None, user=user, cwd=cwd,
                start_new_session=True,
            )
        except OSError as error:
            raise SiteError(f"could not start {argv[0]}: {error}") from error
    with _children_lock:
        _children[child.pid] = child
    # Read before anyone can reap it: a child that already exited is a zombie
    # whose stat still carries its start time.
    found = _stat(child.pid)
    return child.pid, 0 if found is None else found[1]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_processes(processes: Sequence[tuple[int, int, signal.Signals]], *,
                   grace: float = 10.0) -> list[int]:
    """Stops every (pid, start time, first signal) that still runs; returns the PIDs signalled.

    All get their first signal at once (so a set of workers stops in one grace
    period, not one each); those still alive after ``grace`` get SIGKILL. A
    process whose start time differs is someone else's and is left alone.
    """
    live = [(pid, started) for pid, started, sig in processes if is_running(pid, started)]
    for pid, started, sig in processes:
        if (pid, started) in live:
            _signal(pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            _signal(pid, sig)
    deadline = time.monotonic() + grace
    waiting = list(live)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = [(pid, started) for pid, started in waiting if is_running(pid, started)]
    for pid, started in waiting:
        if is_running(pid, started):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = [(pid, started) for pid, started in waiting if is_running(pid, started)]
    return [pid for pid, _ in live]


def wait_gone(pids: Sequence[int], *, timeout: float = 10.0) -> list[int]:
    """Waits until no PID has a /proc entry at all (not even a zombie); returns those left.

    A stopped orphan stays a zombie until PID 1 reaps it, which some inits do
    only every second or so. Nothing needs that for correctness (a zombie holds
    no port and no file), but a caller that checks with ``kill(pid, 0)``, as
    leak checks do, would see it alive.
    """
    deadline = time.monotonic() + timeout
    left = list(pids)
    while True:
        for pid in left:
            _reap(pid)
        left = [pid for pid in left if Path(f"/proc/{pid}").exists()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)
