"""CPU and process-tree readings from /proc, shared by the benchmark scripts.

Imported by path (each benchmark runs as a script from this folder); nothing
here is part of the product.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["descendants", "process_cpu_seconds", "tree_cpu_seconds", "self_cpu_seconds",
           "machine_busy_seconds", "CLOCK_TICKS"]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``; a process that exits meanwhile is skipped."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            found.append(int(child))
            found.extend(descendants(int(child)))
    return found


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (fields[11:15]: utime stime cutime cstime)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of one live process (all its threads)."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process, its live descendants, and every child any of them reaped
    (exited Postgres backends are in the postmaster's cutime and cstime)."""
    ticks = 0
    for one in [pid, *descendants(pid)]:
        fields = _stat(one)
        if fields is not None:
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / CLOCK_TICKS


def self_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def machine_busy_seconds() -> float:
    """CPU time all CPUs spent neither idle nor waiting on I/O, from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS
