"""The cluster's processes held in cgroups of its own, so that a node is killed whole.

Each node gets one cgroup subtree: its daemons (containerd, kubelet, kube-proxy)
are placed in ``<node>/daemons`` before they exec, containerd's shims inherit it,
and the kubelet's ``cgroupRoot`` is ``<node>/pods``, so every container lands
below the node too. Killing a node is freezing its subtree and SIGKILLing every
PID listed in it: no process tree is walked, and a shim reparented to init or a
pod's grandchild cannot slip away. The subtree sits below this process's own
memory cgroup, so the cluster stays inside whatever limit the machine set.

Works on cgroup v1 (a hierarchy per controller, as on these machines) and v2.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cellplane_operator.errors import LocalPlaneError

__all__ = ["CgroupTree", "cgroup_base"]

_ROOT = Path("/sys/fs/cgroup")
# The controllers whose v1 hierarchies hold the daemons: pids lists every task,
# freezer stops forks while we kill, memory measures the cluster. cpuset is left
# out on purpose: a new v1 cpuset cgroup takes no task until cpus and mems are set.
_DAEMON_CONTROLLERS = ("pids", "freezer", "memory", "cpu", "cpuacct", "blkio", "devices",
                       "systemd")


def _is_v2() -> bool:
    return (_ROOT / "cgroup.controllers").exists()


def _own_path(controller: str) -> str:
    """This process's cgroup path in ``controller``'s hierarchy (v1), or the v2 path."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, names, path = line.split(":", 2)
        if _is_v2() and number == "0":
            return path
        if controller in names.split(",") or names == f"name={controller}":
            return path
    return "/"


def cgroup_base() -> str:
    """Where the cluster's cgroups go: below this process's memory cgroup (v1) or its
    own cgroup (v2)."""
    return _own_path("memory")


class CgroupTree:
    """One cgroup path, made in every hierarchy the cluster uses."""

    def __init__(self, path: str) -> None:
        if not path.startswith("/"):
            raise ValueError(f"a cgroup path is absolute: {path!r}")
        self.path = path

    def child(self, name: str) -> CgroupTree:
        return CgroupTree(f"{self.path.rstrip('/')}/{name}")

    def _dirs(self, controllers: tuple[str, ...] = _DAEMON_CONTROLLERS) -> list[Path]:
        if _is_v2():
            return [_ROOT / self.path.lstrip("/")]
        found = []
        for controller in controllers:
            mount = _ROOT / controller
            if (mount / "cgroup.procs").exists():
                found.append(mount / self.path.lstrip("/"))
        return found

    def all_hierarchy_dirs(self) -> list[Path]:
        """This path in every mounted hierarchy (cpuset included): where the kubelet
        creates its pod cgroups, and what removal must clean."""
        if _is_v2():
            return self._dirs()
        return [mount / self.path.lstrip("/") for mount in sorted(_ROOT.iterdir())
                if (mount / "cgroup.procs").exists()]

    def create(self) -> None:
        """Makes the path in every hierarchy (the kubelet requires its cgroupRoot in
        all of them); a new v1 cpuset copies its parent's cpus and mems."""
        for directory in self.all_hierarchy_dirs():
            _make_dirs(directory)

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` a starting daemon writes its PID into."""
        return [directory / "cgroup.procs" for directory in self._dirs()]

    def pids(self) -> set[int]:
        """Every process in this cgroup or below it (the pids hierarchy on v1)."""
        directories = self._dirs(("pids",)) or self._dirs()
        found: set[int] = set()
        for directory in directories[:1]:
            for procs in directory.rglob("cgroup.procs"):
                try:
                    found |= {int(pid) for pid in procs.read_text().split()}
                except (OSError, ValueError):
                    continue
        return found

    def kill_all(self, *, timeout: float = 30) -> None:
        """SIGKILLs every process below this path until none is left.

        Frozen first where a freezer exists, so nothing forks between reading the
        list and killing it; thawed after, so the kills are delivered.
        """
        own = os.getpid()
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids() - {own}
            if not pids:
                return
            self._freeze(True)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._freeze(False)
            if time.monotonic() > deadline:
                raise LocalPlaneError(f"processes {sorted(pids)} in cgroup {self.path} "
                                      f"survived SIGKILL for {timeout:.0f}s")
            time.sleep(0.05)

    def _freeze(self, frozen: bool) -> None:
        if _is_v2():
            for directory in self._dirs():
                freeze = directory / "cgroup.freeze"
                if freeze.exists():
                    _write_quietly(freeze, "1" if frozen else "0")
            return
        for directory in self._dirs(("freezer",)):
            state = directory / "freezer.state"
            if state.exists():
                _write_quietly(state, "FROZEN" if frozen else "THAWED")

    def remove(self) -> list[str]:
        """Removes the path (and every cgroup below it) from every hierarchy, deepest
        first; returns what stayed."""
        left: list[str] = []
        for directory in self.all_hierarchy_dirs():
            if not directory.exists():
                continue
            for sub in sorted((p for p in directory.rglob("*") if p.is_dir()),
                              key=lambda p: len(p.parts), reverse=True):
                _rmdir(sub, left)
            _rmdir(directory, left)
        return left

    def memory_bytes(self) -> int | None:
        """Memory charged to this subtree now (page cache included), if measurable."""
        for directory in self._dirs(("memory",)):
            for name in ("memory.usage_in_bytes", "memory.current"):
                if (directory / name).exists():
                    return int((directory / name).read_text())
        return None

    def memory_stat(self) -> dict[str, int]:
        for directory in self._dirs(("memory",)):
            stat = directory / "memory.stat"
            if stat.exists():
                return {key: int(value) for key, value in
                        (line.split() for line in stat.read_text().splitlines())}
        return {}


def _make_dirs(directory: Path) -> None:
    missing = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for new in reversed(missing):
        new.mkdir()
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (new / name).exists() and not (new / name).read_text().strip():
                (new / name).write_text((new.parent / name).read_text())


def _write_quietly(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def _rmdir(directory: Path, left: list[str]) -> None:
    for _ in range(50):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            last = error
            time.sleep(0.1)  # a killed task leaves its cgroup a moment after exit
    left.append(f"{directory}: {last}")
