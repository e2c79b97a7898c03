"""Many Tenants applied at once to the real apiserver, until every one is Ready.

    .venv/bin/python benchmarks/tenants_apply.py [--tenants 500] [--cells 5]

Starts etcd, a kube-apiserver with the CRDs and one regional operator
(region-a) with the local site driver; applies ``--cells`` shared cells and
waits until they are Ready; then applies ``--tenants`` free-plan Tenants in one
``kubectl apply`` and polls the Tenant list until all are Ready. Prints a
table: time to the first and to the last Ready tenant, tenants/s, and the
operator's resident memory (RSS and PSS) before and after, against the targets
(all Ready in < 60 s). Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.kube import CELLS, TENANTS, KubeClient, KubeConfig
from cellplane_operator.sites.local import stop_all_sites
from procstat import machine_busy_seconds, process_cpu_seconds

LEASE = {"durationSeconds": 4, "renewIntervalSeconds": 1, "marginSeconds": 1}


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB of one process: the operator, not the site processes it started."""
    rss = pss = 0
    for one in [pid]:
        for line in Path(f"/proc/{one}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    return rss, pss


def phases(plane: LocalControlPlane, kind: str) -> dict[str, str]:
    """Phases by name, listed through the API directly: a kubectl process per poll would
    take a good share of a 2-core machine from what is measured."""
    async def listed() -> list[dict[str, Any]]:
        client = KubeClient(KubeConfig.from_file(plane.kubeconfig))
        try:
            return await client.list(CELLS if kind == "cells" else TENANTS)
        finally:
            await client.close()

    return {item["metadata"]["name"]: (item.get("status") or {}).get("phase", "")
            for item in asyncio.run(listed())}


def manifest(items: list[dict[str, object]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=500)
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    plane = LocalControlPlane(LocalPlaneConfig(regions=("region-a",)))
    state_dir = plane.run_dir / "sites"
    operator: ManagedProcess | None = None
    try:
        print("starting etcd and the kube-apiserver ...", file=sys.stderr)
        plane.start()
        operator = ManagedProcess(
            "operator", [sys.executable, "-m", "cellplane_operator", "operator", "--region",
                         "region-a", "--etcd", ",".join(plane.etcd.endpoints),
                         "--state-dir", str(state_dir)],
            log=plane.run_dir / "logs" / "operator.log",
            env={"KUBECONFIG": str(plane.kubeconfig)})
        operator.start()
        per_cell = -(-args.tenants // args.cells)
        cells = [{"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                  "metadata": {"name": f"bench-a{i}"},
                  "spec": {"region": "region-a", "tier": "shared", "lease": LEASE,
                           "capacity": {"tenants": per_cell + 10, "workerSlots": 2 * per_cell + 20}}}
                 for i in range(args.cells)]
        plane.kubectl("apply", "-f", "-", input_text=manifest(cells))
        print(f"waiting for {args.cells} cells to be Ready ...", file=sys.stderr)
        deadline = time.monotonic() + args.timeout
        while list(phases(plane, "cells").values()).count("Ready") < args.cells:
            operator.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"cells not Ready: {phases(plane, 'cells')}")
            time.sleep(0.5)
        time.sleep(2)  # let the operator's start-up work settle before the memory baseline
        rss_before, _ = memory_kib(operator.pid or 0)

        plane.kubectl("create", "namespace", "bench")
        tenants = [{"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
                    "metadata": {"name": f"t{i:05d}", "namespace": "bench"},
                    "spec": {"plan": "free", "homeRegion": "region-a"}}
                   for i in range(args.tenants)]
        print(f"applying {args.tenants} tenants at once ...", file=sys.stderr)
        cpu_before, busy_before = process_cpu_seconds(operator.pid or 0), machine_busy_seconds()
        started = time.monotonic()
        plane.kubectl("apply", "-f", "-", input_text=manifest(tenants))
        applied = time.monotonic() - started
        first = None
        ready = 0
        while ready < args.tenants:
            operator.check_alive()
            if time.monotonic() > deadline + args.timeout:
                break
            states = phases(plane, "tenants")
            ready = list(states.values()).count("Ready")
            if ready and first is None:
                first = time.monotonic() - started
            print(f"  {ready}/{args.tenants} Ready after {time.monotonic() - started:.1f}s",
                  file=sys.stderr)
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        operator_cpu = process_cpu_seconds(operator.pid or 0) - cpu_before
        machine_cpu = machine_busy_seconds() - busy_before
        rss_after, pss_after = memory_kib(operator.pid or 0)
        print("\n| tenants | cells | apply (s) | first Ready (s) | all Ready (s) | tenants/s "
              "| target < 60 s | operator CPU (cores) | machine CPU (cores) "
              "| operator RSS before / after (MiB) | operator PSS after (MiB) |")
        print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
        print(f"| {ready}/{args.tenants} | {args.cells} | {applied:.1f} | {first or 0:.1f} "
              f"| {elapsed:.1f} | {ready / elapsed:.1f} | {'met' if elapsed < 60 and ready == args.tenants else 'NOT met'} "
              f"| {operator_cpu / elapsed:.2f} | {machine_cpu / elapsed:.2f} "
              f"| {rss_before / 1024:.0f} / {rss_after / 1024:.0f} | {pss_after / 1024:.0f} |")
    finally:
        if operator is not None:
            operator.stop()
        stop_all_sites(state_dir)
        plane.stop()
        plane.remove()


if __name__ == "__main__":
    main()
