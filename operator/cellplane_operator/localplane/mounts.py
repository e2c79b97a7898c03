"""The mounts a node leaves behind: containers' root file systems, sandbox shm, pod
network namespaces (kept under containerd's state directory) and the kubelet's
volumes. All of them lie under the cluster's run directory and are found in
/proc/self/mountinfo, deepest first, since the mount namespace is the machine's
(shared with everyone): nothing outside the run directory is ever unmounted.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["mounts_under", "unmount_under"]

_MNT_DETACH = 2


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix``, deepest (and latest) first."""
    root = str(prefix.resolve()).rstrip("/")
    found: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    found.reverse()
    return sorted(found, key=lambda point: point.count("/"), reverse=True)


def unmount_under(prefix: Path) -> list[str]:
    """Lazily unmounts everything below ``prefix``; returns what is still mounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):
        points = mounts_under(prefix)
        if not points:
            return []
        for point in points:
            libc.umount2(os.fsencode(point), _MNT_DETACH)
    return mounts_under(prefix)
