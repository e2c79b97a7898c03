"""The command line drives the same launcher: `cellplane local up` (the demo: test_demo.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from cellplane_operator.localplane import Binaries
from cellplane_operator.localplane.process import wait_for

CELLPLANE = [sys.executable, "-m", "cellplane_operator"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_local_up_serves_until_terminated_then_stops_every_process(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen([*CELLPLANE, "local", "up", "--regions", "region-a,region-b",
                           "--state", str(state)], stdout=log, stderr=subprocess.STDOUT)
    try:
        def still_running() -> None:
            if up.poll() is not None:
                raise AssertionError((tmp_path / "up.log").read_text())

        wait_for(state.exists, timeout=120, what="`cellplane local up` to write its state",
                 alive=still_running)
        described = json.loads(state.read_text())
        assert set(described["etcd"]) == {"region-a", "region-b"}
        kubeconfig = described["kube_apiserver"]["kubeconfig"]
        crd = subprocess.run(
            [str(Binaries.discover().kubectl), f"--kubeconfig={kubeconfig}", "get", "crd",
             "cells.cellplane.io", "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}"],
            capture_output=True, text=True, check=True, timeout=60)
        assert crd.stdout == "True"
        pids = [m["pid"] for m in described["etcd"].values()] + [described["kube_apiserver"]["pid"]]
        assert not any(_gone(pid) for pid in pids)
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        log.close()
    assert all(_gone(pid) for pid in pids)
    assert not state.exists()
    assert not Path(described["run_dir"]).exists()


def _processes_under(path: str) -> list[int]:
    """PIDs of live processes whose command line names ``path`` (the demo's run dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found

