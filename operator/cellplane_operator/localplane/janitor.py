"""Tears a local cluster down when the process that started it dies without doing so.

``LocalCluster.start`` runs this in a session of its own before it creates
anything. It waits for the launcher's exit (a pidfd: no polling, no PID reuse),
then removes whatever the cluster's state file names: the processes in its
cgroups, its mounts, its network namespaces and its run directory. A launcher
that stops cleanly tears down itself and then ends this watcher; a launcher
that is SIGKILLed (or crashes) leaves the work to it.

    python -m cellplane_operator.localplane.janitor STATE_FILE LAUNCHER_PID
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: janitor STATE_FILE LAUNCHER_PID", file=sys.stderr)
        return 2
    state_file, launcher = Path(args[0]), int(args[1])
    # Terminal signals are the launcher's business; SIGTERM from it means "done".
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _wait_for_exit(launcher)
    if not state_file.exists():
        return 0  # the launcher tore down and removed its run directory
    from cellplane_operator.localplane.cluster import ClusterState, teardown

    left = teardown(ClusterState.read(state_file))
    for line in left:
        print(f"janitor: {line}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
