"""The command line drives the same launcher: `cellplane local up` and `cellplane demo`."""

from __future__ import annotations

import json
import os
import re
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


def test_demo_places_its_tenants_and_cleans_up() -> None:
    result = subprocess.run([*CELLPLANE, "demo"], capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    tenants = {row[1]: row for row in rows if len(row) > 7 and row[0] == "demo"}
    assert set(tenants) == {"tenant.cellplane.io/acme", "tenant.cellplane.io/globex"}
    acme, globex = tenants["tenant.cellplane.io/acme"], tenants["tenant.cellplane.io/globex"]
    assert acme[2:5] == ["pro", "shared", "shared-a1"] and acme[-2] == "Ready"
    assert globex[2:4] == ["enterprise", "dedicated"] and globex[-2] == "Ready"
    cells = {row[0]: row for row in rows if row and row[0].startswith("cell.cellplane.io/")}
    assert "cell.cellplane.io/shared-a1" in cells and cells["cell.cellplane.io/shared-a1"][-2] == "Ready"
    assert f"cell.cellplane.io/{globex[4]}" in cells
    assert "Placed" in result.stdout and "Reason" in result.stdout   # kubectl describe's events
    run_dir = re.search(r"run dir (\S+)\)", result.stdout)
    assert run_dir is not None and not Path(run_dir.group(1)).exists()
    assert _processes_under(run_dir.group(1)) == []
    assert "every process stopped" in result.stdout
