"""Cells as Kubernetes workloads on the local cluster (issue #17): a Cell's apply -> Ready, the
memory of its Pods, and the region-loss RTO when the active region's node is killed whole.

    .venv/bin/python benchmarks/cluster_failover.py [--runs 10] [--keep]

Set up once: the local cluster (a control plane and a node per region), the chart's
operators and routers; a Cell of the ``kubernetes`` driver homed in region-a with a standby
in region-b and the product's lease (10 s, renewed every 2 s, 2 s margin); a tenant in it;
a job target and a load generator (jobs one after another, each key until acknowledged)
as Pods on region-c, sending through region-c's router Service.

Each run kills the node of the region that holds the active site (kubelet, kube-proxy,
containerd, every Pod's processes, its operator, its router and its ownership etcd
member, SIGKILL at once) and measures from the kill to the first job the load generator
gets acknowledged through the router: the RTO. Its floor is the lease plus the margin
(the owner key must expire, and the survivor waits the margin on its own clock). Then
the node is started again and the run waits until its old primary was fenced, reported
on and streams as a standby; acknowledged jobs the new primary lacks are counted against
the jobs the reconciliation report lists. The next run kills the other region.

Progress to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regions import on_sigterm_exit, percentile, progress

from cellplane_operator.localplane.cluster import ClusterConfig, LocalCluster
from cellplane_operator.localplane.clusterchart import NAMESPACE, install_operators
from cellplane_operator.localplane.clustercells import (
    PRODUCT_LEASE,
    api_key,
    kubernetes_cell,
    operator_image,
    router_url,
    start_target,
    status_of,
    streams_as_standby,
    target_url,
    tenant,
)
from cellplane_operator.localplane.clusterload import ClusterLoad, reconciliation_report, site_sql
from cellplane_operator.localplane.images import build_images

CELL = "bench-a1"
REGIONS = ("region-a", "region-b")
ELSEWHERE = "region-c"
FLOOR_SECONDS = PRODUCT_LEASE["durationSeconds"] + PRODUCT_LEASE["marginSeconds"]
GOAL_P99_SECONDS = 15.0
GOAL_READY_SECONDS = 30.0


@dataclass(frozen=True)
class Run:
    number: int
    killed: str
    rto: float
    takeover: float | None
    lost: int
    lost_reported: int
    report_jobs: int
    rebuilt_in: float


def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.5)


def pod_memory(uid: str) -> int | None:
    """The pod's resident memory (``total_rss`` of its memory cgroup, cgroup v1)."""
    for path in glob.glob(f"/sys/fs/cgroup/memory/**/pod{uid}/memory.stat", recursive=True):
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "total_rss":
                return int(value)
    return None


def cell_pods_memory(cluster: LocalCluster) -> list[tuple[str, int | None]]:
    pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={CELL}")
    return sorted((p["metadata"]["name"], pod_memory(p["metadata"]["uid"]))
                  for p in pods["items"])


def set_up(cluster: LocalCluster) -> tuple[float, str, ClusterLoad]:
    install_operators(cluster)
    began = time.monotonic()
    cluster.apply([kubernetes_cell(CELL, region=REGIONS[0], standbys=[REGIONS[1]])])
    until(lambda: status_of(cluster, "cell", CELL).get("phase") == "Ready", 600,
          "the Cell Ready")
    ready = time.monotonic() - began
    progress(f"Cell {CELL} Ready {ready:.1f} s after it was applied")
    cluster.kubectl("create", "namespace", "bench")
    start_target(cluster, "bench", ELSEWHERE)
    cluster.apply([tenant("acme", "bench", cell=CELL, home_region=REGIONS[0],
                          target=target_url("bench"))])
    until(lambda: status_of(cluster, "tenant", "acme", "bench").get("phase") == "Ready", 300,
          "the Tenant Ready")
    tenant_id = str(status_of(cluster, "tenant", "acme", "bench")["tenantId"])
    load = ClusterLoad(cluster, image=operator_image(cluster), namespace="bench",
                       region=ELSEWHERE, router=router_url(ELSEWHERE),
                       key=api_key(cluster, "bench", "acme"), prefix="bench")
    return ready, tenant_id, load


def streaming_standby(cluster: LocalCluster, region: str, epoch: int | None) -> bool:
    return streams_as_standby(status_of(cluster, "cell", CELL), region, reconciled_epoch=epoch)


def one_run(cluster: LocalCluster, load: ClusterLoad, number: int, tenant_id: str,
            lost_so_far: set[str]) -> Run:
    before = status_of(cluster, "cell", CELL)
    killed = str(before["activeRegion"])
    survivor = next(r for r in REGIONS if r != killed)
    until(lambda: streaming_standby(cluster, survivor, None), 300, f"{survivor} streaming")
    start = load.acked()
    until(lambda: load.acked() >= start + 10, 120, "load flowing")
    kill = time.time()
    cluster.kill_node(killed)
    until(lambda: max(load.get()["ack_times"]) > kill + 0.5, 180,
          "a job acknowledged after the kill")
    rto = min(t for t in load.get()["ack_times"] if t > kill) - kill
    until(lambda: status_of(cluster, "cell", CELL).get("activeRegion") == survivor, 120,
          "the Cell's status naming the survivor")
    after = status_of(cluster, "cell", CELL)
    restarted = time.monotonic()
    cluster.start_node(killed)
    until(lambda: streaming_standby(cluster, killed, after["epoch"]), 600,
          f"{killed} fenced, reported on and streaming")
    rebuilt_in = time.monotonic() - restarted
    seen = load.get()
    acknowledged = set(seen["acked"].values())
    rows = site_sql(cluster, NAMESPACE, CELL, survivor,
                    f"SELECT job_id FROM jobs WHERE tenant_id = '{tenant_id}'")
    if rows.startswith("failed"):
        raise RuntimeError(rows)
    surviving = set(rows.split())
    missing = acknowledged - surviving - lost_so_far
    reported = {job.job_id for job in
                reconciliation_report(cluster.kubeconfig, CELL, int(after["epoch"])).jobs}
    lost_so_far |= missing
    return Run(number, killed, rto, (after.get("lastTakeover") or {}).get("seconds"),
               len(missing), len(missing & reported), len(reported), rebuilt_in)


def print_tables(ready: float, memory: list[tuple[str, int | None]], runs: list[Run],
                 error: BaseException | None) -> None:
    print(f"\n## Cell apply -> Ready (kubernetes driver, one standby)\n\n"
          f"| measured | goal |\n| --- | --- |\n| {ready:.1f} s | <= {GOAL_READY_SECONDS:.0f} s |")
    print("\n## Resident memory of the cell's Pods (memory cgroup total_rss)\n\n| pod | MiB |\n"
          "| --- | --- |")
    for name, rss in memory:
        print(f"| {name} | {'?' if rss is None else f'{rss / 2**20:.0f}'} |")
    known = [rss for _, rss in memory if rss is not None]
    print(f"| all | {sum(known) / 2**20:.0f} |")
    print("\n## Region loss: node killed -> first job acknowledged through region-c's router\n")
    print("| run | killed | RTO s | takeover s (Cell status) | lost | of them reported | "
          "report jobs | rebuilt s |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print(f"| {run.number} | {run.killed} | {run.rto:.2f} | {run.takeover} | {run.lost} | "
              f"{run.lost_reported} | {run.report_jobs} | {run.rebuilt_in:.0f} |")
    rtos = [r.rto for r in runs]
    print(f"\n| runs | RTO p50 s | RTO p99 s | floor (lease + margin) s | goal p99 s |\n"
          f"| --- | --- | --- | --- | --- |\n| {len(runs)} | {percentile(rtos, 50):.2f} | "
          f"{percentile(rtos, 99):.2f} | {FLOOR_SECONDS} | {GOAL_P99_SECONDS:.0f} |")
    if error is not None:
        print(f"\nstopped early: {type(error).__name__}: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    on_sigterm_exit()
    cluster = LocalCluster(ClusterConfig(apply_crds=False),
                           images=build_images(say=lambda line: None))
    error: BaseException | None = None
    runs: list[Run] = []
    try:
        cluster.start()
        ready, tenant_id, load = set_up(cluster)
        memory = cell_pods_memory(cluster)
        lost_so_far: set[str] = set()
        for number in range(1, args.runs + 1):
            try:
                run = one_run(cluster, load, number, tenant_id, lost_so_far)
            except (Exception, KeyboardInterrupt) as failure:  # the runs so far still count
                error = failure
                progress(f"run {number} failed: {type(failure).__name__}: {failure}")
                break
            runs.append(run)
            progress(f"run {number}: killed {run.killed}: RTO {run.rto:.2f} s, takeover "
                     f"{run.takeover} s, lost {run.lost} (reported {run.lost_reported}), "
                     f"rebuilt in {run.rebuilt_in:.0f} s")
        print_tables(ready, memory, runs, error)
    except BaseException as failure:
        error = failure
        raise
    finally:
        cluster.stop(remove=not args.keep and error is None)
    return 1 if error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
