"""Starting, watching and stopping one real program.

A process is stopped by its own PID (SIGTERM, then SIGKILL after a grace period)
and its whole output goes to a log file that outlives it, so a failing test can
show what the program said.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cellplane_operator.errors import ProcessStartError

__all__ = ["ManagedProcess", "wait_for", "run_checked", "descendants", "parent_pid"]


def wait_for(
    condition: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str,
    alive: Callable[[], None] | None = None,
) -> None:
    """Polls ``condition`` until it holds; raises ``ProcessStartError`` after ``timeout``.

    ``alive`` is called between polls so a process that died is reported at once
    instead of after the whole timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if alive is not None:
            alive()
        if time.monotonic() >= deadline:
            raise ProcessStartError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def run_checked(
    argv: Sequence[str], *, log: Path, user: str | None = None, timeout: float = 300
) -> None:
    """Runs a short-lived helper (initdb, pg_basebackup); its output is appended to ``log``."""
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        result = subprocess.run(
            list(argv), stdout=out, stderr=subprocess.STDOUT, user=user, timeout=timeout,
            stdin=subprocess.DEVNULL, check=False,
        )
    if result.returncode != 0:
        raise ProcessStartError(
            f"{Path(argv[0]).name} exited with {result.returncode}; see {log}:\n{tail(log)}"
        )


def tail(log: Path, lines: int = 30) -> str:
    """The last lines of a log, for error messages."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class ManagedProcess:
    """One long-running program started by the local control plane."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._env = env
        self._user = user
        self._cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> None:
        if self.running:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n$ {' '.join(self.argv)}\n".encode())
            out.flush()
            # A new session keeps a test runner's Ctrl-C from reaching the
            # program before teardown does, so stop order stays ours.
            self._popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self._env} if self._env else None,
                user=self._user,
                cwd=self._cwd,
                start_new_session=True,
            )

    @property
    def returncode(self) -> int | None:
        """The exit status once the program has exited; None while it runs (or never ran)."""
        return self._popen.poll() if self._popen is not None else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_alive(self) -> None:
        """Raises ``ProcessStartError`` with the log's tail if the program has exited."""
        if self._popen is not None and self._popen.poll() is not None:
            raise ProcessStartError(
                f"{self.name} exited with {self._popen.returncode}; log {self.log}:\n"
                f"{tail(self.log)}"
            )

    def wait_until(self, condition: Callable[[], bool], *, timeout: float, what: str) -> None:
        wait_for(condition, timeout=timeout, what=f"{self.name}: {what}", alive=self.check_alive)

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited after ``grace`` seconds."""
        if self._popen is None:
            return
        if self._popen.poll() is None:
            self._signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
            self._signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._popen.wait(timeout=grace)
        self._popen = None

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine would: no clean shutdown."""
        if self._popen is None:
            return
        if self._popen.poll() is None:
            self._signal(signal.SIGKILL)
            self._popen.wait(timeout=10)
        self._popen = None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing, like a hung machine."""
        if self._popen is not None and self._popen.poll() is None:
            self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        assert self._popen is not None
        try:
            os.kill(self._popen.pid, sig)
        except ProcessLookupError:
            pass

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid})"


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from /proc; None when it is gone."""
    try:
        # The command name may hold spaces and parentheses: fields start after the last ")".
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None  # gone while we looked


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        parent = parent_pid(int(entry.name))
        if parent is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found
