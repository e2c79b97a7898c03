"""The demo's story: regions up, the scene applied, a load, a move, a region lost and back.

The regions' processes and the reads of them are ``regions``; the job target and
the clients are ``load``; this module tells the story in order, says each step
on the timeline, and hands what it saw, as plain data, to ``summary``, which
decides what it proves.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from cellplane_operator.demo import scene
from cellplane_operator.demo.leftovers import DemoRecord
from cellplane_operator.demo.load import JobTarget, TenantLoad
from cellplane_operator.demo.regions import DemoRegions
from cellplane_operator.demo.summary import (DemoSummary, MoveOutcome, RegionLoss,
                                             RunningSample, check_invariants, count_jobs,
                                             noisy_share)
from cellplane_operator.demo.timeline import DemoFailed, Timeline, await_condition, counts_grown
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS, SECRETS, TENANTMOVES, TENANTS
from cellplane_operator.domain.move_progress import render_progress
from cellplane_operator.lossreport.store import ReportStore

__all__ = ["DemoRun"]

OPERATOR_NAMESPACE = "cellplane-system"
SERVING = ("Ready", "Degraded")
_SAMPLE_SECONDS = 0.5


class DemoRun:
    def __init__(self, settings: scene.DemoSettings, *, router_port: int, timeline: Timeline,
                 record: DemoRecord, state_file: Path) -> None:
        self.settings = settings
        self.timeline = timeline
        self.regions = DemoRegions(settings, router_port=router_port, timeline=timeline,
                                   record=record, state_file=state_file)
        self.target = JobTarget(step_seconds=settings.step_seconds)
        self.loads: dict[str, TenantLoad] = {}
        self.tenant_ids: dict[str, str] = {}
        self.samples: list[RunningSample] = []
        self._stop_sampling = threading.Event()
        self._reported: set[str] = set()
        """Job ids the reconciliation report lists."""
        self._sampler: threading.Thread | None = None

    @property
    def run_dir(self) -> Path:
        return self.regions.plane.run_dir

    # -- the story ------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        self.start_regions()
        self.apply_scene()
        self.start_load()
        move = self.move_tenant()
        loss = self.lose_region()
        self.stop_load()
        loss = self.restore_region(loss)
        return self.conclude(move, loss)

    def start_regions(self) -> None:
        self.target.start()
        self.regions.start()
        self.timeline.say(f"one operator and one router per region, each on its region's etcd "
                          f"member; routers {', '.join(self.regions.router_urls.values())}; "
                          f"job target {self.target.url}")
        for region in scene.REGIONS:
            self.regions.await_router(region)

    def apply_scene(self) -> None:
        say = self.timeline.say
        say(f"kubectl apply: shared Cells {scene.LOST_CELL} (region-a, standby region-b) and "
            f"{scene.MOVE_TARGET} (region-b, standby region-c), dedicated Cell "
            f"{scene.DEDICATED_CELL} (region-c, standby region-b); Tenants in namespace "
            f"{scene.NAMESPACE}: " + ", ".join(
                f"{t.name} ({t.plan}{', dedicated' if t.isolation == 'dedicated' else ''}, "
                f"{t.home_region})" for t in scene.TENANTS))
        objects = scene.manifests(self.settings, self.target.url)
        applied = self.regions.plane.kubectl("apply", "-f", "-", input_text=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": objects}))
        self.timeline.block(applied.stdout)

        def state() -> tuple[bool, str]:
            cells = {c["metadata"]["name"]: c.get("status") or {} for c in self.regions.call(
                self.regions.kube.list(CELLS))}
            tenants = {t["metadata"]["name"]: t.get("status") or {} for t in self.regions.call(
                self.regions.kube.list(TENANTS, namespace=scene.NAMESPACE))}
            shared_ready = all(
                _phase(cells.get(name)) == "Ready" and _streaming(cells.get(name) or {}, standby)
                for name, standby in ((scene.LOST_CELL, "region-b"),
                                      (scene.MOVE_TARGET, "region-c"),
                                      (scene.DEDICATED_CELL, "region-b")))
            tenants_ready = len(tenants) == len(scene.TENANTS) and all(
                _phase(s) == "Ready" for s in tenants.values())
            described = ("cells " + " ".join(
                f"{n}={_phase(s)}{'+standby' if _streaming(s, None) else ''}"
                for n, s in sorted(cells.items()))
                + "; tenants " + " ".join(f"{n}={_phase(s)}" for n, s in sorted(tenants.items())))
            return shared_ready and tenants_ready, described

        self.await_condition("the operators to provision the cells (Postgres primary and "
                             "standby, API, workers) and place every tenant", state,
                             timeout=self.settings.ready_timeout)
        say("kubectl get cells,tenants -A")
        self.timeline.block(self.regions.plane.kubectl("get", "cells,tenants", "-A").stdout)

    def start_load(self) -> None:
        for tenant in scene.TENANTS:
            secret = self.regions.call(self.regions.kube.get(SECRETS, f"{tenant.name}-api-key",
                                             namespace=scene.NAMESPACE)) or {}
            key = base64.b64decode(secret["data"]["api-key"]).decode()
            self.tenant_ids[tenant.name] = key.removeprefix("cpk_").split(".")[0]
            home = list(scene.REGIONS).index(tenant.home_region)
            order = [*scene.REGIONS[home:], *scene.REGIONS[:home]]
            self.loads[tenant.name] = TenantLoad(
                tenant.name, [self.regions.router_urls[r] for r in order], key, tenant.rate,
                f"{tenant.name}-{os.urandom(3).hex()}", clients=tenant.clients).start()
        noisy = next(t for t in scene.TENANTS if t.name == scene.NOISY)
        self.timeline.say(
            "load: every tenant submits jobs of 2 steps through its home region's router; "
            f"{scene.NOISY} asks for {noisy.rate:g}/s, far above its bucket "
            f"({self.settings.noisy_bucket[0]:g}/s) and its cap ({noisy.max_running_jobs} running)")
        self._sampler = threading.Thread(target=self._sample, daemon=True, name="demo sampler")
        self._sampler.start()
        # A slow tenant (the free one) is not waited on for longer than about 15 s.
        wanted = {name: max(1, min(self.settings.warmup_jobs, int(load.rate * 15)))
                  for name, load in self.loads.items()}
        self.await_acks(wanted, "every tenant's first jobs to be acknowledged")

    def move_tenant(self) -> MoveOutcome:
        tenant = self.regions.tenant_status(scene.MOVED)
        source = str(tenant.get("cell"))
        name = f"{scene.MOVED}-to-{scene.MOVE_TARGET}"
        self.timeline.say(f"moving {scene.MOVED} from {source} to {scene.MOVE_TARGET} under load "
                          f"(TenantMove {name}, write pause budget "
                          f"{scene.MOVE_BUDGET_SECONDS:g} s; as `cellplane move --wait`)")
        created = time.monotonic()
        self.regions.call(self.regions.kube.create(TENANTMOVES, {
            "metadata": {"name": name, "namespace": scene.NAMESPACE},
            "spec": {"tenant": scene.MOVED, "targetCell": scene.MOVE_TARGET,
                     "maxWritePauseSeconds": scene.MOVE_BUDGET_SECONDS}},
            namespace=scene.NAMESPACE))
        final: dict[str, Any] = {}

        def state() -> tuple[bool, str]:
            body = self.regions.call(self.regions.kube.get(TENANTMOVES, name, namespace=scene.NAMESPACE)) or {}
            final.clear()
            final.update(body.get("status") or {})
            return final.get("phase") in ("Completed", "Aborted", "Failed"), render_progress(final)

        self.await_condition(f"TenantMove {name}", state, timeout=300)
        seconds = time.monotonic() - created
        progress = final.get("progress") or {}
        pause = progress.get("pauseSeconds")
        outcome = MoveOutcome(
            tenant=scene.MOVED, source=source, target=scene.MOVE_TARGET,
            phase=str(final.get("phase")), budget_seconds=scene.MOVE_BUDGET_SECONDS,
            pause_seconds=float(pause) if isinstance(pause, (int, float)) else None,
            rows_copied=progress.get("rowsCopied"), seconds=seconds)
        if outcome.phase != "Completed":
            self.timeline.say(f"the move ended {outcome.phase}: {render_progress(final)}")
            return outcome
        self.timeline.say(f"{scene.MOVED} now in {scene.MOVE_TARGET}: writes paused "
                          f"{outcome.pause_seconds:.3f} s, move took {seconds:.1f} s")
        self.await_acks({scene.MOVED: 3}, f"{scene.MOVED}'s jobs to be acknowledged by "
                        f"{scene.MOVE_TARGET}")
        return outcome

    def lose_region(self) -> RegionLoss:
        region, cell = scene.LOST_REGION, scene.LOST_CELL
        before = self.regions.cell_status(cell)
        epoch_before = int(before.get("epoch") or 0)
        victims = self.regions.kill_region(region)
        # Read after every SIGKILL was sent: a request sent from here on cannot be answered
        # by the old site, so the first one accepted measures the recovery, not a straggler.
        killed_at = time.monotonic()
        self.timeline.say(f"LOSING {region}: SIGKILL of its operator, etcd member, router and "
                          f"{victims} cell and Postgres processes; {cell} (epoch "
                          f"{epoch_before}) has its standby in region-b")
        lease = self.settings.lease or {"durationSeconds": 10, "marginSeconds": 2}
        status: dict[str, Any] = {}

        def took_over() -> tuple[bool, str]:
            status.clear()
            status.update(self.regions.cell_status(cell))
            done = (status.get("activeRegion") not in (None, region)
                    and int(status.get("epoch") or 0) > epoch_before
                    and status.get("phase") in SERVING
                    and (status.get("lastTakeover") or {}).get("epoch") == status.get("epoch"))
            return done, (f"{cell}: phase {_phase(status)}, active {status.get('activeRegion')}, "
                          f"epoch {status.get('epoch')}")

        self.await_condition(
            f"the takeover (lease {lease['durationSeconds']:g} s runs out, + margin "
            f"{lease['marginSeconds']:g} s, then the standby is promoted)", took_over,
            timeout=float(lease["durationSeconds"]) * 3 + 120)
        lost_cell_tenants = [t.name for t in scene.TENANTS
                             if t.name != scene.MOVED and t.home_region == region]

        def written() -> tuple[bool, str]:
            first = self._first_write_after(killed_at, lost_cell_tenants)
            return first is not None, ("the routers hold requests until the map moves"
                                       if first is None else
                                       f"first job accepted {first - killed_at:.2f} s after the kill")

        self.await_condition(f"the first write to {cell} through a router", written,
                             timeout=120)
        first = self._first_write_after(killed_at, lost_cell_tenants)
        rto = None if first is None else round(first - killed_at, 3)
        takeover = (status.get("lastTakeover") or {}).get("seconds")
        loss = RegionLoss(region=region, cell=cell, rto_seconds=rto, epoch_before=epoch_before,
                          epoch_after=int(status["epoch"]),
                          new_region=str(status["activeRegion"]),
                          takeover_seconds=float(takeover) if takeover is not None else None)
        self.timeline.say(f"{loss.new_region} took {cell} over under epoch {loss.epoch_after}; "
                          f"first write through a router {rto:.2f} s after the kill"
                          if rto is not None else f"{loss.new_region} took {cell} over")
        self.await_acks({name: max(1, min(self.settings.after_takeover_jobs,
                                          int(self.loads[name].rate * 10)))
                         for name in lost_cell_tenants},
                        f"more jobs of {', '.join(lost_cell_tenants)} in {loss.new_region}")
        return loss

    def stop_load(self) -> None:
        for load in self.loads.values():
            load.finish()
        self._stop_sampling.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        accepted = sum(len(load.acks) for load in self.loads.values())
        self.timeline.say(f"load stopped: {accepted:,} jobs acknowledged in all")

    def restore_region(self, loss: RegionLoss) -> RegionLoss:
        region, cell = loss.region, loss.cell
        self.timeline.say(f"{region} comes back: its etcd member rejoins, its operator and "
                          "router start; its old primary must find itself behind epoch "
                          f"{loss.epoch_after} and be fenced, reported on and rebuilt")
        self.regions.restore(region)
        seen: list[str] = []

        def rebuilt() -> tuple[bool, str]:
            status = self.regions.cell_status(cell)
            report = self.regions.site_report(cell, region)
            said = "no site report yet" if report is None else (
                f"{region}'s site report: {report.role}" + (f", {report.message}" if report.message else "")
                + (", streaming" if report.streaming else ""))
            if report is not None and report.role not in seen:
                seen.append(report.role)
            done = ((status.get("lastReconciliation") or {}).get("epoch") == loss.epoch_after
                    and _streaming(status, region))
            return done, said

        self.await_condition(f"the old primary in {region} to be fenced and rebuilt as a "
                             "standby", rebuilt, timeout=300)
        events = self.regions.cell_events(cell)
        for event in events:
            self.timeline.say(f"  event {event['reason']}: {event.get('message', '')}")
        reasons = {str(e["reason"]) for e in events}
        report = self.regions.call(ReportStore(self.regions.kube, OPERATOR_NAMESPACE, None).get(
            cell, loss.epoch_after))
        if report is not None:
            self.timeline.say(f"reconciliation report (`cellplane report {cell}`):")
            text = report.render_text().splitlines()
            self.timeline.block("\n".join(text[:25] + ([f"... ({len(text) - 25} more lines)"]
                                                       if len(text) > 25 else [])))
            self._reported = {str(job.job_id) for job in report.jobs}
        return RegionLoss(
            region=loss.region, cell=loss.cell, rto_seconds=loss.rto_seconds,
            epoch_before=loss.epoch_before, epoch_after=loss.epoch_after,
            new_region=loss.new_region, takeover_seconds=loss.takeover_seconds,
            old_primary_fenced="OldPrimaryFenced" in reasons or "old-primary" in seen,
            rebuilt_as_standby="RebuiltAsStandby" in reasons or _streaming(
                self.regions.cell_status(cell), region),
            report_jobs=None if report is None else len(report.jobs),
            lost_wal_bytes=None if report is None else report.lost_wal_bytes)

    def conclude(self, move: MoveOutcome, loss: RegionLoss) -> DemoSummary:
        acknowledged: dict[str, str] = {}
        owner: dict[str, str] = {}
        for name, load in self.loads.items():
            of_tenant = load.acknowledged()
            acknowledged.update(of_tenant)
            owner.update(dict.fromkeys(of_tenant, name))
        statuses: dict[str, str] = {}

        def finished() -> tuple[bool, str]:
            statuses.clear()
            statuses.update(self.regions.job_statuses(list(self.tenant_ids.values())))
            done = sum(1 for job in acknowledged if statuses.get(job) == "succeeded")
            waiting: dict[str, int] = {}
            for job in acknowledged:
                if job in statuses and statuses[job] != "succeeded":
                    waiting[owner[job]] = waiting.get(owner[job], 0) + 1
            return not waiting, (f"{done:,}/{len(acknowledged):,} acknowledged jobs succeeded"
                                 + ("; not yet: " + ", ".join(
                                     f"{n} {c}" for n, c in sorted(waiting.items()))
                                    if waiting else ""))

        try:
            noisy_cap = next(t for t in scene.TENANTS if t.name == scene.NOISY).max_running_jobs
            self.await_condition(f"the acknowledged jobs to finish (the noisy tenant's backlog "
                                 f"runs {noisy_cap} at a time; jobs claimed in the lost region "
                                 "resume when their 30 s claim lease runs out)", finished,
                                 timeout=self.settings.finish_timeout)
        except DemoFailed as timeout:
            self.timeline.say(f"not every job finished: {timeout}")
        phases: dict[str, str] = {}

        def all_ready() -> tuple[bool, str]:
            phases.clear()
            for tenant in self.regions.call(self.regions.kube.list(TENANTS, namespace=scene.NAMESPACE)):
                phases[f"{scene.NAMESPACE}/{tenant['metadata']['name']}"] = _phase(
                    tenant.get("status"))
            return all(p == "Ready" for p in phases.values()), " ".join(
                f"{n}={p}" for n, p in sorted(phases.items()))

        try:
            self.await_condition("every tenant Ready", all_ready, timeout=120)
        except DemoFailed as timeout:
            self.timeline.say(f"not every tenant is Ready: {timeout}")
        noisy_tenant = next(t for t in scene.TENANTS if t.name == scene.NOISY)
        jobs = count_jobs(acknowledged=acknowledged, statuses=statuses, reported=self._reported,
                          calls=self.target.snapshot(),
                          refused=sum(load.refused for load in self.loads.values()))
        noisy = noisy_share(list(self.samples), tenant=scene.NOISY,
                            tenant_id=self.tenant_ids[scene.NOISY],
                            cap=noisy_tenant.max_running_jobs, cell_slots=scene.CELL_SLOTS)
        invariants = check_invariants(jobs=jobs, move=move, region_loss=loss, noisy=noisy,
                                      tenants=phases)
        return DemoSummary(mode=self.settings.mode, seconds=round(self.timeline.elapsed, 1),
                           jobs=jobs, move=move, region_loss=loss, noisy=noisy, tenants=phases,
                           invariants=invariants)

    def show_how_to_explore(self) -> None:
        kubectl = self.regions.plane.binaries.kubectl
        venv = Path(sys.executable).parent
        lines = [
            f"export KUBECONFIG={self.regions.plane.kubeconfig}",
            f"export PATH={kubectl.parent}:{venv}:$PATH",
            "kubectl get cells,tenants,tenantmoves -A",
            "kubectl cellplane status",
            f"kubectl cellplane report {scene.LOST_CELL}",
            f"kubectl describe tenant {scene.NOISY} -n {scene.NAMESPACE}",
            f"KEY=$(kubectl cellplane tenant-key acme -n {scene.NAMESPACE})",
            *(f"curl -s -H \"Authorization: Bearer $KEY\" {url}/v1/jobs?limit=3   # {region}"
              for region, url in self.regions.router_urls.items()),
        ]
        self.timeline.say("the demo stays up; in another shell try:")
        self.timeline.block("\n".join(lines))
        self.timeline.say("Ctrl-C stops every process and removes the run dir "
                          "(or `cellplane demo --stop` from another shell)")

    def close(self, *, remove: bool) -> None:
        """Stops the load, the job target and every process, whatever state the run got to."""
        for load in self.loads.values():
            load.stop.set()
        self._stop_sampling.set()
        self.regions.close(remove=remove)
        with contextlib.suppress(Exception):
            self.target.stop()

    # -- waiting --------------------------------------------------------------------------

    def await_condition(self, what: str, check: Callable[[], tuple[bool, str]], *,
                        timeout: float) -> None:
        await_condition(self.timeline, what, check, timeout=timeout,
                        alive=self.regions.check_processes,
                        hint="; CELLPLANE_KEEP_RUN_DIR=1 keeps the processes' logs "
                             f"({self.regions.plane.run_dir}/logs) for a look")

    def await_acks(self, wanted: dict[str, int], what: str) -> None:
        self.await_condition(what, counts_grown(lambda name: len(self.loads[name].acks),
                                                wanted), timeout=180)

    def _first_write_after(self, moment: float, tenants: list[str]) -> float | None:
        times = [ack.at for name in tenants for ack in list(self.loads[name].acks)
                 if ack.sent_at >= moment and ack.status == 202]
        return min(times) if times else None

    def _sample(self) -> None:
        """Running slots per tenant of the noisy tenant's cell, from its active database,
        while the load runs. A sample that cannot be read (the region is being lost) is
        skipped: the cap holds in the claim statement whether or not we look."""
        conn: psycopg.Connection[Any] | None = None
        while not self._stop_sampling.wait(_SAMPLE_SECONDS):
            try:
                if conn is None:
                    region = self.regions.cell_status(scene.LOST_CELL).get("activeRegion")
                    report = self.regions.site_report(scene.LOST_CELL, str(region)) if region else None
                    if report is not None and report.database is not None:
                        conn = psycopg.connect(report.database.conninfo, autocommit=True,
                                               connect_timeout=2)
                if conn is not None:
                    rows = conn.execute(b"SELECT tenant_id, running FROM tenants").fetchall()
                    self.samples.append(RunningSample(
                        time.monotonic(), {str(t): int(r) for t, r in rows}))
            except (psycopg.Error, CellplaneError, OSError, TimeoutError):
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                conn = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def _phase(status: dict[str, Any] | None) -> str:
    return str((status or {}).get("phase") or "Pending")


def _streaming(status: dict[str, Any], region: str | None) -> bool:
    return any(sb.get("streaming") and (region is None or sb.get("region") == region)
               for sb in status.get("standbys") or [])
