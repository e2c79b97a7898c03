"""The demo's record of itself, so a second demo finds the first and nothing is left behind.

One state file per machine user (``$TMPDIR/cellplane-demo.json``, beside the run
directories; ``CELLPLANE_DEMO_STATE`` moves it) names the run directory and every
process the demo started, each as (pid, start time): the start time read from
/proc tells a live process of ours from a new one that was given a recycled pid.

The policy, also in ``cellplane demo --help``: if the demo that wrote the file
is alive, a new demo refuses to start and says how to stop it
(``cellplane demo --stop``); if it is dead (killed, or its machine rebooted),
the new demo stops whatever of it still runs, removes its run directory and
goes on.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProcessId", "DemoRecord", "state_path", "process_id", "alive", "taken_ports",
           "kill_leftovers"]


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start_time: int
    """Field 22 of /proc/<pid>/stat: clock ticks after boot when it started."""
    name: str = ""


@dataclass
class DemoRecord:
    demo: ProcessId
    run_dir: str
    started_at: str
    """UTC, ISO 8601, for the message a second demo prints."""
    router_urls: list[str] = field(default_factory=list)
    processes: list[ProcessId] = field(default_factory=list)
    site_state_dirs: list[str] = field(default_factory=list)
    kubeconfig: str = ""

    def save(self, path: Path) -> None:
        document = {"demo": self.demo.__dict__, "run_dir": self.run_dir,
                    "started_at": self.started_at, "router_urls": self.router_urls,
                    "processes": [p.__dict__ for p in self.processes],
                    "site_state_dirs": self.site_state_dirs, "kubeconfig": self.kubeconfig}
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(document, indent=2) + "\n")
        scratch.replace(path)  # a reader never sees half a file

    @classmethod
    def load(cls, path: Path) -> DemoRecord | None:
        try:
            document = json.loads(path.read_text())
            return cls(demo=ProcessId(**document["demo"]), run_dir=document["run_dir"],
                       started_at=document["started_at"],
                       router_urls=list(document.get("router_urls") or []),
                       processes=[ProcessId(**p) for p in document.get("processes") or []],
                       site_state_dirs=list(document.get("site_state_dirs") or []),
                       kubeconfig=str(document.get("kubeconfig") or ""))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: nothing in it can be trusted to stop

    @staticmethod
    def now() -> str:
        return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def state_path() -> Path:
    configured = os.environ.get("CELLPLANE_DEMO_STATE")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "cellplane-demo.json"


def process_id(pid: int, name: str = "") -> ProcessId | None:
    start = _start_time(pid)
    return None if start is None else ProcessId(pid, start, name)


def alive(process: ProcessId) -> bool:
    """The very process that was recorded still runs (a zombie does not count)."""
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[19]) == process.start_time


def taken_ports(host: str, ports: Iterable[int]) -> list[int]:
    """Ports of ``host`` that something listens on or holds (a bind of our own fails)."""
    taken = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As the routers (uvicorn) bind: connections of a previous demo in TIME_WAIT
            # do not keep a server from listening, so they must not fail the check.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                taken.append(port)
    return taken


def kill_leftovers(record: DemoRecord, *, grace: float = 10.0) -> list[int]:
    """Stops every recorded process that is still the one recorded (SIGTERM, then SIGKILL
    after ``grace``); returns their pids. The site processes are the caller's (they are
    recorded in the site state dirs, which ``stop_all_sites`` reads)."""
    living = [p for p in record.processes if alive(p)]
    for process in living:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in living) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling /proc: another process's exit has no event to wait on
    stubborn = [p for p in living if alive(p)]
    for process in stubborn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in stubborn) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered asynchronously
    return [p.pid for p in living]


def _start_time(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
