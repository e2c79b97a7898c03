"""The demo's three regions as real processes, and its reads of them.

Each region has an etcd member, a regional operator and an edge router, the
operator and router on their own region's member only, as in a deployment where
losing a region loses its member too; the cells' sites are the operators' own
processes (they outlive an operator by design, so ``close`` stops them from their
state dirs). Every process is recorded in the demo's state file as it starts, so a
second demo can find whatever a killed one left. Reads of Kubernetes and etcd go
through one asyncio loop in a thread: a kubectl process per poll would take a
good share of a 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from cellplane_operator.demo import scene
from cellplane_operator.demo.leftovers import DemoRecord, process_id
from cellplane_operator.demo.timeline import DemoFailed, Timeline, await_condition
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS, EVENTS, TENANTS, KubeClient, KubeConfig
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.localplane.ports import LOOPBACK
from cellplane_operator.localplane.process import descendants
from cellplane_operator.sites.local import site_process_ids, stop_all_sites
from cellplane_operator.sites.reports import SiteReport, SiteReports
from cellplane_operator.store import EtcdStore

__all__ = ["DemoRegions", "telling_cell_events"]

T = TypeVar("T")


class DemoRegions:
    """The processes of the three regions, and the demo's reads of Kubernetes and etcd."""

    def __init__(self, settings: scene.DemoSettings, *, router_port: int, timeline: Timeline,
                 record: DemoRecord, state_file: Path) -> None:
        self.settings = settings
        self.timeline = timeline
        self.plane = LocalControlPlane(LocalPlaneConfig(regions=scene.REGIONS))
        self.router_urls = {region: f"http://{LOOPBACK}:{router_port + i}"
                            for i, region in enumerate(scene.REGIONS)}
        self.operators: dict[str, ManagedProcess] = {}
        self.routers: dict[str, ManagedProcess] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="demo reads")
        self._store: EtcdStore | None = None
        self._kube: KubeClient | None = None
        self.record = record
        self.record.run_dir = str(self.plane.run_dir)
        self.record.router_urls = list(self.router_urls.values())
        self.record.site_state_dirs = [str(self.state_dir(r)) for r in scene.REGIONS]
        self._state_file = state_file
        self._save_record()

    def start(self) -> None:
        """The control plane, the reads' clients, one operator and one router per region."""
        self.timeline.say(f"starting a 3-member etcd (one member per region) and a "
                          f"kube-apiserver (run dir {self.plane.run_dir})")
        self.plane.start()
        for member in self.plane.etcd.members:
            self._remember(member.process, f"etcd-{member.name}")
        if self.plane.apiserver is not None:
            self._remember(self.plane.apiserver.process, "kube-apiserver")
        self.record.kubeconfig = str(self.plane.kubeconfig)
        self._save_record()
        self.timeline.say("control plane up; CRDs Established")
        self._thread.start()
        # region-c's member first: the demo never loses region-c, so its reads need not move.
        self._store = EtcdStore([self.plane.etcd.member(r).endpoint
                                 for r in reversed(scene.REGIONS)], timeout=10)
        self._kube = self.call(_kube_client(self.plane.kubeconfig))
        for region in scene.REGIONS:
            self.start_operator(region)
            self.start_router(region)

    def restore(self, region: str) -> None:
        """The region comes back: its etcd member rejoins, its operator and router start."""
        self.plane.etcd.restart(region)
        self._remember(self.plane.etcd.member(region).process, f"etcd-{region}")
        self.start_operator(region)
        self.start_router(region)
        self.await_router(region)

    def check_processes(self) -> None:
        """Raises DemoFailed at once when an operator or a router the demo runs has died."""
        for process in [*self.operators.values(), *self.routers.values()]:
            if process.pid is not None and process.returncode is not None:
                raise DemoFailed(f"{process.name} exited ({process.returncode}); log "
                                 f"{process.log}")

    def state_dir(self, region: str) -> Path:
        return self.plane.run_dir / "regions" / region

    def start_operator(self, region: str) -> None:
        process = ManagedProcess(
            f"operator-{region}",
            [sys.executable, "-m", "cellplane_operator", "operator", "--region", region,
             "--etcd", self.plane.etcd.member(region).endpoint,
             "--regions", ",".join(scene.REGIONS), "--state-dir", str(self.state_dir(region)),
             "--resync-seconds", f"{self.settings.resync_seconds:g}", *self.settings.election],
            log=self.plane.run_dir / "logs" / f"operator-{region}.log",
            env={"KUBECONFIG": str(self.plane.kubeconfig)})
        process.start()
        self.operators[region] = process
        self._remember(process, f"operator-{region}")

    def start_router(self, region: str) -> None:
        port = int(self.router_urls[region].rsplit(":", 1)[1])
        process = ManagedProcess(
            f"router-{region}",
            [sys.executable, "-m", "cellplane_operator", "router",
             "--etcd", self.plane.etcd.member(region).endpoint, "--port", str(port),
             "--hold-seconds", "30"],
            log=self.plane.run_dir / "logs" / f"router-{region}.log")
        process.start()
        self.routers[region] = process
        self._remember(process, f"router-{region}")

    def await_router(self, region: str) -> None:
        url, process = self.router_urls[region], self.routers[region]

        def answers() -> tuple[bool, str]:
            process.check_alive()
            try:
                return httpx.get(f"{url}/v1/jobs", timeout=1).status_code == 401, "starting"
            except httpx.HTTPError:
                return False, "not answering yet"

        await_condition(self.timeline, f"the router of {region} on {url}", answers,
                        timeout=90, alive=self.check_processes, quiet=True)

    def kill_region(self, region: str) -> int:
        """SIGKILL every process of the region at once; returns how many site processes."""
        sites = site_process_ids(self.state_dir(region))
        sites += [pid for root in list(sites) for pid in descendants(root)]
        operator, router = self.operators[region], self.routers[region]
        member = self.plane.etcd.member(region).process
        for pid in sites + [p.pid for p in (operator, router, member)
                            if p is not None and p.pid is not None]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in (operator, router, member):
            if process is not None:
                process.kill()  # reaps it
        return len(sites)

    def close(self, *, remove: bool) -> None:
        """Stops every process of the regions, whatever state they got to; an error is said
        and the rest is still stopped."""
        # At once: each takes a while to shut down cleanly, and none depends on another.
        stopping = [threading.Thread(target=_stop_quietly, args=(process,), daemon=True)
                    for process in [*self.operators.values(), *self.routers.values()]]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(timeout=60)
        for region in scene.REGIONS:
            with contextlib.suppress(Exception):
                stop_all_sites(self.state_dir(region))
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(self._close_clients(), timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        try:
            self.plane.stop()
        except CellplaneError as error:
            self.timeline.say(f"teardown: {error}")
        if remove:
            self.plane.remove()

    # -- reads ---------------------------------------------------------------------------

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    @property
    def kube(self) -> KubeClient:
        assert self._kube is not None
        return self._kube

    @property
    def store(self) -> EtcdStore:
        assert self._store is not None
        return self._store

    def cell_status(self, cell: str) -> dict[str, Any]:
        return dict((self.call(self.kube.get(CELLS, cell)) or {}).get("status") or {})

    def tenant_status(self, name: str) -> dict[str, Any]:
        body = self.call(self.kube.get(TENANTS, name, namespace=scene.NAMESPACE)) or {}
        return dict(body.get("status") or {})

    def site_report(self, cell: str, region: str) -> SiteReport | None:
        return self.call(SiteReports(self.store).read(cell, region))

    def cell_events(self, cell: str) -> list[dict[str, Any]]:
        """The Cell's events that tell the takeover and the fencing, oldest first."""
        return telling_cell_events(self.call(self.kube.list(EVENTS)), cell)

    def job_statuses(self, tenant_ids: list[str]) -> dict[str, str]:
        """job id -> status over the active site of every cell; a job found in two cells (a
        moved tenant's source keeps its rows) counts as succeeded if it did in either."""
        statuses: dict[str, str] = {}
        cells = [c["metadata"]["name"] for c in self.call(self.kube.list(CELLS))]
        for cell in cells:
            region = self.cell_status(cell).get("activeRegion")
            report = self.site_report(cell, str(region)) if region else None
            if report is None or report.database is None:
                continue
            try:
                with psycopg.connect(report.database.conninfo, autocommit=True,
                                     connect_timeout=5) as conn:
                    rows = conn.execute(b"SELECT job_id::text, status FROM jobs "
                                        b"WHERE tenant_id = ANY(%s)", (tenant_ids,)).fetchall()
            except psycopg.Error:
                continue
            for job_id, status in rows:
                if statuses.get(job_id) != "succeeded":
                    statuses[str(job_id)] = str(status)
        return statuses

    def _remember(self, process: ManagedProcess | None, name: str) -> None:
        found = process_id(process.pid, name) if process is not None and process.pid else None
        if found is not None:
            self.record.processes = [p for p in self.record.processes if p.name != name]
            self.record.processes.append(found)
            self._save_record()

    def _save_record(self) -> None:
        self.record.save(self._state_file)

    async def _close_clients(self) -> None:
        if self._kube is not None:
            await self._kube.close()
        if self._store is not None:
            await self._store.close()


def telling_cell_events(events: list[dict[str, Any]], cell: str) -> list[dict[str, Any]]:
    """Of ``events``, the Cell ``cell``'s that tell a takeover and the fencing, oldest first."""
    telling = ("Takeover", "Fenc", "Reconciliation", "Rebuilt", "Promot", "Failover")
    found = [e for e in events
             if (e.get("involvedObject") or {}).get("kind") == "Cell"
             and (e.get("involvedObject") or {}).get("name") == cell
             and any(word in str(e.get("reason")) for word in telling)]
    return sorted(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _stop_quietly(process: ManagedProcess) -> None:
    with contextlib.suppress(Exception):
        process.stop()


async def _kube_client(kubeconfig: Path) -> KubeClient:
    return KubeClient(KubeConfig.from_file(kubeconfig))
