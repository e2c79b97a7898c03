"""`cellplane demo --driver kubernetes --short --json` as CI runs it: the demo's story on a
local cluster of its own (cells of the kubernetes driver as Pods), judged from its JSON
summary; and nothing of that cluster is left when it has ended.

It starts its own cluster rather than the session's: the command is what is tested,
start and stop included, and a short run takes 3 to 4 minutes on the 2-core machine
(docs/kubernetes-driver.md#demo), within the cluster suite's CI budget.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

RUN_DIR = re.compile(r"run dir (/\S+)")
NETNS_PREFIX = re.compile(r"network namespaces (\S+)\*")


def test_the_cluster_demo_moves_a_tenant_loses_a_region_and_reports_every_loss() -> None:
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cellplane_operator", "demo", "--driver", "kubernetes",
         "--short", "--json"], capture_output=True, text=True, timeout=1800)
    print(f"\ncellplane demo --driver kubernetes --short: {time.monotonic() - began:.0f} s")
    assert result.returncode == 0, result.stderr[-6000:]
    summary = json.loads(result.stdout)
    print(f"move write pause {summary['move']['pause_seconds']} s; region loss: RTO "
          f"{summary['region_loss']['rto_seconds']} s, takeover "
          f"{summary['region_loss']['takeover_seconds']} s; jobs {summary['jobs']['accepted']}"
          f" acknowledged, {len(summary['jobs']['lost'])} lost")
    assert summary["driver"] == "kubernetes" and summary["exit_code"] == 0, summary["broken"]
    assert summary["broken"] == []

    move = summary["move"]
    assert move["phase"] == "Completed"
    assert 0 < move["pause_seconds"] <= move["budget_seconds"]

    loss = summary["region_loss"]
    assert loss["region"] == "region-a" and loss["new_region"] == "region-b"
    assert loss["epoch_after"] > loss["epoch_before"]
    assert loss["rto_seconds"] is not None
    assert loss["old_primary_fenced"] and loss["rebuilt_as_standby"]

    jobs = summary["jobs"]
    assert jobs["accepted"] > 0
    assert jobs["lost"] == jobs["lost_in_report"]  # every acknowledged job lost is reported
    assert jobs["run_twice"] == []
    assert set(summary["tenants"].values()) == {"Ready"}

    # Its cluster is gone: run dir and network namespaces.
    run_dir = RUN_DIR.search(result.stderr)
    prefix = NETNS_PREFIX.search(result.stderr)
    assert run_dir and prefix, result.stderr[:2000]
    assert not Path(run_dir.group(1)).exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout
    assert prefix.group(1) not in namespaces
