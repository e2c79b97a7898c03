"""``cellplane demo --driver kubernetes``: the demo's story on the local multi-node cluster,
with cells of the ``kubernetes`` site driver (Pods), told as the local demo tells it.

The cluster (a control plane and a node per region, localplane.cluster) is started and
the chart installed (an operator and a router per region, as Pods); two Cells of the
kubernetes driver and two tenants are applied; a load runs from inside the cluster on
region-c, through region-c's router Service; one tenant is moved to the other cell; the
lost cell's region is killed whole (its node), taken over by its standby, brought back,
fenced, reported on and rebuilt as a standby. What the story saw goes, as plain data,
to ``summary``, which judges it as it judges the local demo.

``ClusterStory`` tells the story on any running cluster with the chart installed (the
integration test runs it on the session's cluster); ``ClusterDemo`` adds the cluster's
start and stop around it for the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cellplane_operator.demo import scene
from cellplane_operator.demo.regions import telling_cell_events
from cellplane_operator.demo.summary import (DemoSummary, MoveOutcome, RegionLoss,
                                             check_invariants, count_jobs, first_ack_after,
                                             step_call)
from cellplane_operator.demo.timeline import (DemoFailed, Timeline, await_condition,
                                              counts_grown)
from cellplane_operator.localplane.cluster import ClusterConfig, LocalCluster
from cellplane_operator.localplane.clusterchart import NAMESPACE, install_operators
from cellplane_operator.localplane.clustercells import (api_key, job_statuses,
                                                        kubernetes_cell, operator_image,
                                                        router_url, serves_from, start_target,
                                                        status_of, streams_as_standby,
                                                        target_url, tenant)
from cellplane_operator.localplane.clusterload import (ClusterLoad, PodServer,
                                                       reconciliation_report, site_sql)
from cellplane_operator.localplane.images import build_images

__all__ = ["ClusterStory", "ClusterDemo"]

_HOME, _STANDBY = "region-a", "region-b"


class ClusterStory:
    """The story on ``cluster``, whose chart (operators, routers) is installed."""

    def __init__(self, cluster: LocalCluster, settings: scene.ClusterSettings,
                 timeline: Timeline) -> None:
        self.cluster = cluster
        self.settings = settings
        self.timeline = timeline
        self.namespace = scene.NAMESPACE
        self.target: PodServer | None = None
        self.loads: dict[str, ClusterLoad] = {}
        self.seen: dict[str, dict[str, Any]] = {}
        """What each tenant's load saw, once stopped: ``acked`` {key: job}, ``ack_times``."""
        self.reported: set[str] = set()

    def run(self) -> DemoSummary:
        self.apply_scene()
        self.start_load()
        move = self.move_tenant()
        loss = self.lose_region()
        self.stop_load()
        loss = self.restore_region(loss)
        return self.conclude(move, loss)

    # -- the story ------------------------------------------------------------------------

    def apply_scene(self) -> None:
        say = self.timeline.say
        self.cluster.apply([{"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": self.namespace}}])
        say(f"the jobs' target: a Pod on {scene.CLUSTER_LOAD_REGION} behind a Service")
        self.target = start_target(self.cluster, self.namespace, scene.CLUSTER_LOAD_REGION)
        say(f"kubectl apply: Cells {scene.CLUSTER_LOST_CELL} ({_HOME}, standby {_STANDBY}) and "
            f"{scene.CLUSTER_MOVE_TARGET} ({_STANDBY}), driver kubernetes, lease 10 s + 2 s "
            f"margin; Tenants {scene.CLUSTER_MOVED} and {scene.CLUSTER_STAYS} in "
            f"{scene.CLUSTER_LOST_CELL} (namespace {self.namespace})")
        url = target_url(self.namespace)
        self.cluster.apply([
            kubernetes_cell(scene.CLUSTER_LOST_CELL, region=_HOME, standbys=[_STANDBY]),
            kubernetes_cell(scene.CLUSTER_MOVE_TARGET, region=_STANDBY),
            *(tenant(name, self.namespace, cell=scene.CLUSTER_LOST_CELL, home_region=_HOME,
                     target=url) for name in (scene.CLUSTER_MOVED, scene.CLUSTER_STAYS))])

        def state() -> tuple[bool, str]:
            lost = self.cell_status(scene.CLUSTER_LOST_CELL)
            other = self.cell_status(scene.CLUSTER_MOVE_TARGET)
            tenants = {name: _phase(status_of(self.cluster, "tenant", name, self.namespace))
                       for name in (scene.CLUSTER_MOVED, scene.CLUSTER_STAYS)}
            done = (_phase(lost) == "Ready" and streams_as_standby(lost, _STANDBY)
                    and _phase(other) == "Ready"
                    and all(p == "Ready" for p in tenants.values()))
            return done, (f"{scene.CLUSTER_LOST_CELL}={_phase(lost)}"
                          + ("+standby" if streams_as_standby(lost, _STANDBY) else "")
                          + f" {scene.CLUSTER_MOVE_TARGET}={_phase(other)} "
                          + " ".join(f"{n}={p}" for n, p in tenants.items()))

        self.await_condition("the operators to run each Cell's Pods (a Postgres StatefulSet "
                             "per region, the API and workers) and place the tenants", state,
                             timeout=self.settings.ready_timeout)
        say("kubectl get cells,tenants -A")
        self.timeline.block(self.cluster.kubectl("get", "cells,tenants", "-A", check=False).stdout)

    def start_load(self) -> None:
        router = router_url(scene.CLUSTER_LOAD_REGION)
        for name in (scene.CLUSTER_MOVED, scene.CLUSTER_STAYS):
            self.loads[name] = ClusterLoad(
                self.cluster, image=operator_image(self.cluster), namespace=self.namespace,
                region=scene.CLUSTER_LOAD_REGION, router=router,
                key=api_key(self.cluster, self.namespace, name),
                prefix=f"{name}-{os.urandom(3).hex()}")
        self.timeline.say(f"load: a Pod per tenant on {scene.CLUSTER_LOAD_REGION} submits jobs "
                          f"one after another through {router}, each key until acknowledged")
        self.await_acks({name: self.settings.warmup_jobs for name in self.loads},
                        "every tenant's first jobs to be acknowledged")
        self.timeline.say("kubectl get pods -A -o wide (while the load runs)")
        self.timeline.block(self.cluster.kubectl("get", "pods", "-A", "-o", "wide",
                                                 check=False).stdout)

    def move_tenant(self) -> MoveOutcome:
        moved, source = scene.CLUSTER_MOVED, scene.CLUSTER_LOST_CELL
        target, budget = scene.CLUSTER_MOVE_TARGET, scene.CLUSTER_MOVE_BUDGET_SECONDS
        self.timeline.say(f"cellplane move {moved} --to {target} --max-write-pause {budget:g} "
                          "--wait (under load)")
        started = time.monotonic()
        move = subprocess.Popen(
            [sys.executable, "-m", "cellplane_operator", "move", moved, "--to", target,
             "-n", self.namespace, "--max-write-pause", str(budget), "--wait",
             "--timeout", "300", "--kubeconfig", str(self.cluster.kubeconfig)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert move.stderr is not None and move.stdout is not None
        try:
            for line in move.stderr:  # the move's progress, as it comes
                self.timeline.say(f"  move: {line.rstrip()}")
            name = move.stdout.read().strip()
            move.wait(timeout=60)
        finally:  # interrupted: the CLI must not outlive the cluster it watches
            if move.poll() is None:
                move.kill()
                move.wait()
        if move.returncode != 0 or not name:
            raise DemoFailed(f"cellplane move {moved} --to {target} ended {move.returncode}")
        final = status_of(self.cluster, "tenantmove", name, self.namespace)
        progress = final.get("progress") or {}
        pause = progress.get("pauseSeconds")
        outcome = MoveOutcome(
            tenant=moved, source=source, target=target, phase=str(final.get("phase")),
            pause_seconds=float(pause) if isinstance(pause, (int, float)) else None,
            budget_seconds=budget, rows_copied=progress.get("rowsCopied"),
            seconds=time.monotonic() - started)
        if outcome.phase == "Completed":
            self.await_acks({moved: 3}, f"{moved}'s jobs to be acknowledged by {target}")
        return outcome

    def lose_region(self) -> RegionLoss:
        cell = scene.CLUSTER_LOST_CELL
        before = self.cell_status(cell)
        region, epoch_before = str(before.get("activeRegion")), int(before.get("epoch") or 0)
        survivor = next(r for r in (_HOME, _STANDBY) if r != region)
        # The load's clock is this machine's (a node is a namespace of it, not a VM).
        killed_at = time.time()
        self.cluster.kill_node(region)
        self.timeline.say(f"LOSING {region}: its node killed whole (kubelet, containerd, every "
                          f"Pod: {cell}'s primary, its operator, router and etcd member); "
                          f"{cell} (epoch {epoch_before}) has its standby in {survivor}")
        status: dict[str, Any] = {}

        def took_over() -> tuple[bool, str]:
            status.clear()
            status.update(self.cell_status(cell))
            return serves_from(status, survivor, after_epoch=epoch_before), (
                f"{cell}: phase {_phase(status)}, active {status.get('activeRegion')}, "
                f"epoch {status.get('epoch')}")

        self.await_condition("the takeover (the lease of 10 s runs out, + 2 s margin, then the "
                             f"standby Pod in {survivor} is promoted)", took_over, timeout=300)
        stays = self.loads[scene.CLUSTER_STAYS]

        def written() -> tuple[bool, str]:
            rto = first_ack_after(stays.get()["ack_times"], killed_at)
            return rto is not None, ("no job acknowledged since the kill" if rto is None else
                                     f"first job acknowledged {rto:.2f} s after the kill")

        self.await_condition(f"the first write to {cell} through the router", written,
                             timeout=180)
        rto = first_ack_after(stays.get()["ack_times"], killed_at)
        takeover = (status.get("lastTakeover") or {}).get("seconds")
        loss = RegionLoss(region=region, cell=cell,
                          rto_seconds=None if rto is None else round(rto, 3),
                          epoch_before=epoch_before, epoch_after=int(status["epoch"]),
                          new_region=survivor,
                          takeover_seconds=float(takeover) if takeover is not None else None)
        self.timeline.say(f"{survivor} took {cell} over under epoch {loss.epoch_after}; writes "
                          f"paused {loss.rto_seconds} s (kill -> first acknowledgement)")
        self.await_acks({scene.CLUSTER_STAYS: self.settings.after_takeover_jobs},
                        f"more jobs of {scene.CLUSTER_STAYS} in {survivor}")
        return loss

    def stop_load(self) -> None:
        for name, load in self.loads.items():
            self.seen[name] = load.stop()
        acknowledged = sum(len(seen["acked"]) for seen in self.seen.values())
        self.timeline.say(f"load stopped: {acknowledged:,} jobs acknowledged in all")

    def restore_region(self, loss: RegionLoss) -> RegionLoss:
        region, cell = loss.region, loss.cell
        self.timeline.say(f"{region} comes back: its node starts again on its data; its old "
                          f"primary must find itself behind epoch {loss.epoch_after} and be "
                          "fenced, reported on and rebuilt as a standby")
        self.cluster.start_node(region)

        def rebuilt() -> tuple[bool, str]:
            status = self.cell_status(cell)
            last = status.get("lastReconciliation") or {}
            return (streams_as_standby(status, region, reconciled_epoch=loss.epoch_after),
                    f"reconciled epoch {last.get('epoch')}, standbys " + " ".join(
                        f"{s.get('region')}{'+streaming' if s.get('streaming') else ''}"
                        for s in status.get("standbys") or []))

        self.await_condition(f"the old primary in {region} fenced and rebuilt as a standby",
                             rebuilt, timeout=self.settings.rebuild_timeout)
        reasons: set[str] = set()
        for event in self.cell_events(cell):
            reasons.add(str(event.get("reason")))
            self.timeline.say(f"  event {event.get('reason')}: {event.get('message', '')}")
        report = reconciliation_report(self.cluster.kubeconfig, cell, loss.epoch_after)
        self.reported = {str(job.job_id) for job in report.jobs}
        self.timeline.say(f"reconciliation report (`cellplane report {cell}`):")
        text = report.render_text().splitlines()
        self.timeline.block("\n".join(text[:25] + ([f"... ({len(text) - 25} more lines)"]
                                                   if len(text) > 25 else [])))
        return RegionLoss(
            region=region, cell=cell, rto_seconds=loss.rto_seconds,
            epoch_before=loss.epoch_before, epoch_after=loss.epoch_after,
            new_region=loss.new_region, takeover_seconds=loss.takeover_seconds,
            # Fenced: the operator said so, or its database is read-only now (in recovery,
            # as the standby it was rebuilt into).
            old_primary_fenced="OldPrimaryFenced" in reasons or site_sql(
                self.cluster, NAMESPACE, cell, region, "SELECT pg_is_in_recovery()") == "t",
            rebuilt_as_standby=True, report_jobs=len(report.jobs),
            lost_wal_bytes=report.lost_wal_bytes)

    def conclude(self, move: MoveOutcome, loss: RegionLoss) -> DemoSummary:
        acknowledged = {job: key for seen in self.seen.values()
                        for key, job in seen["acked"].items()}
        statuses: dict[str, str] = {}

        def finished() -> tuple[bool, str]:
            statuses.clear()
            statuses.update(self.job_statuses())
            waiting = sum(1 for job in acknowledged
                          if job in statuses and statuses[job] != "succeeded")
            done = sum(1 for job in acknowledged if statuses.get(job) == "succeeded")
            return not waiting, f"{done:,}/{len(acknowledged):,} acknowledged jobs succeeded"

        try:
            self.await_condition("the acknowledged jobs to finish (jobs claimed in the lost "
                                 "region resume when their claim lease runs out)", finished,
                                 timeout=self.settings.finish_timeout)
        except DemoFailed as timeout:  # unfinished is counted, not a broken invariant
            self.timeline.say(f"not every job finished: {timeout}")
        assert self.target is not None
        calls = [step_call(call.get("body") or {}, str(call.get("key")))
                 for call in self.target.get()]
        jobs = count_jobs(acknowledged=acknowledged, statuses=statuses,
                          reported=self.reported, calls=[c for c in calls if c is not None])
        tenants = {f"{self.namespace}/{name}":
                   _phase(status_of(self.cluster, "tenant", name, self.namespace))
                   for name in self.loads}
        invariants = check_invariants(jobs=jobs, move=move, region_loss=loss, noisy=None,
                                      tenants=tenants)
        return DemoSummary(mode=self.settings.mode, seconds=round(self.timeline.elapsed, 1),
                           jobs=jobs, move=move, region_loss=loss, noisy=None, tenants=tenants,
                           invariants=invariants, driver="kubernetes")

    def close(self) -> None:
        """Stops the loads and the target if the story ended early (the cluster stays)."""
        for name, load in self.loads.items():
            if name not in self.seen:
                load.delete()
        if self.target is not None:
            self.target.delete()

    # -- reading the cluster --------------------------------------------------------------

    def cell_status(self, cell: str) -> dict[str, Any]:
        return status_of(self.cluster, "cell", cell)

    def cell_events(self, cell: str) -> list[dict[str, Any]]:
        """The Cell's events that tell the takeover and the fencing, oldest first."""
        found = self.cluster.kubectl("get", "events", "-A", "-o", "json", "--field-selector",
                                     f"involvedObject.kind=Cell,involvedObject.name={cell}",
                                     check=False, timeout=60)
        return telling_cell_events(
            json.loads(found.stdout).get("items", []) if found.returncode == 0 else [], cell)

    def job_statuses(self) -> dict[str, str]:
        """job id -> status over the active site of both cells; a moved tenant's jobs are in
        both (the source keeps its rows), and succeeded in either counts."""
        statuses: dict[str, str] = {}
        for cell in (scene.CLUSTER_LOST_CELL, scene.CLUSTER_MOVE_TARGET):
            region = self.cell_status(cell).get("activeRegion")
            for job, status in (job_statuses(self.cluster, cell, str(region)).items()
                                if region else ()):
                if statuses.get(job) != "succeeded":
                    statuses[job] = status
        return statuses

    def await_condition(self, what: str, check: Callable[[], tuple[bool, str]], *,
                        timeout: float) -> None:
        await_condition(self.timeline, what, check, timeout=timeout, alive=lambda: None,
                        hint=f"; CELLPLANE_KEEP_RUN_DIR=1 keeps the cluster's logs "
                             f"({self.cluster.logs_dir})")

    def await_acks(self, wanted: dict[str, int], what: str) -> None:
        self.await_condition(what, counts_grown(lambda name: self.loads[name].acked(), wanted),
                             timeout=180)


class ClusterDemo:
    """The command's run: images built, the cluster started and the chart installed, the
    story told; ``close`` stops the cluster, whatever state the run got to."""

    def __init__(self, settings: scene.ClusterSettings, timeline: Timeline) -> None:
        self.settings = settings
        self.timeline = timeline
        self.cluster: LocalCluster | None = None

    @property
    def run_dir(self) -> Path | None:
        return None if self.cluster is None else self.cluster.run_dir

    def run(self) -> DemoSummary:
        say = self.timeline.say
        say("images: the operator image (cells, operators and routers run it), etcd, pause")
        images = build_images(say=lambda line: say(f"  images: {line}"))
        self.cluster = LocalCluster(ClusterConfig(apply_crds=False), images=images,
                                    say=lambda line: say(f"  cluster: {line}"))
        say(f"starting the local cluster: a control plane and a node per region "
            f"({', '.join(self.cluster.plan.regions)}), network namespaces "
            f"{self.cluster.plan.prefix}*, run dir {self.cluster.run_dir}")
        self.cluster.start()
        say("helm install charts/cellplane: an operator and a router per region, as Pods")
        install_operators(self.cluster, say=lambda line: say(f"  {line}"))
        return ClusterStory(self.cluster, self.settings, self.timeline).run()

    def show_how_to_explore(self) -> None:
        assert self.cluster is not None
        self.timeline.say("the cluster stays up; in another shell try:")
        kubectl = self.cluster.programs.base.kubectl
        self.timeline.block("\n".join([
            f"export KUBECONFIG={self.cluster.kubeconfig}",
            f"export PATH={kubectl.parent}:{Path(sys.executable).parent}:$PATH",
            "kubectl get nodes,pods -A -o wide",
            "kubectl get cells,tenants,tenantmoves -A",
            f"kubectl cellplane report {scene.CLUSTER_LOST_CELL}"]))
        self.timeline.say("Ctrl-C stops the cluster and removes its run dir")

    def close(self, *, remove: bool) -> None:
        if self.cluster is not None:
            self.cluster.stop(remove=remove)


def _phase(status: dict[str, Any] | None) -> str:
    return str((status or {}).get("phase") or "Pending")
