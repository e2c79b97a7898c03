"""Regional operators as real processes over a real apiserver, etcd and the local site driver.

Each operator runs ``python -m cellplane_operator operator --region R`` with its
own state directory; the sites it starts outlive it (as they would a real
operator restart), so ``close`` stops the operators first and then every site
process recorded under the state directories, and checks they are all gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

import chartinstall
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import descendants, parent_pid, wait_for
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey
from cellplane_operator.sites.local import site_process_ids, stop_all_sites
from cellplane_operator.sites.reports import SiteReports
from cellplane_operator.store import EtcdStore

FAST_LEASE = {"durationSeconds": 2, "renewIntervalSeconds": 0.5, "marginSeconds": 0.5}
FAST_ELECTION = ["--election-lease-seconds", "2", "--election-renew-seconds", "0.5",
                 "--election-margin-seconds", "0.5"]


class RegionPlane:
    def __init__(self, kube: LocalControlPlane, regions: tuple[str, ...] = ("region-a",)) -> None:
        self.kube = kube
        self.regions = regions
        self.root = kube.run_dir / "regions"
        self.operators: dict[str, ManagedProcess] = {}
        self._started: list[ManagedProcess] = []
        self.stopped_pids: list[int] = []
        self.metrics: dict[str, str] = {}
        """region -> the /metrics URL of its operator, for those started with ``metrics=True``."""

    def state_dir(self, region: str) -> Path:
        return self.root / region

    def start_operator(self, region: str, *, env: dict[str, str] | None = None,
                       log_suffix: str = "", register: bool = True,
                       own_member: bool = False, metrics: bool = False) -> ManagedProcess:
        """Starts an operator; ``register=False`` keeps ``operators[region]`` pointing at
        the one already running (for a second process that is expected to fail).

        ``own_member``: the operator talks only to its region's etcd member, as in a
        deployment where a region reaches etcd through its own member; stopping that
        member cuts the region off.

        ``metrics``: the operator serves /metrics on a free port (``self.metrics[region]``).
        """
        etcd = (self.kube.etcd.member(region).endpoint if own_member
                else ",".join(self.kube.etcd.endpoints))
        process = ManagedProcess(
            f"operator-{region}{log_suffix}",
            [sys.executable, "-m", "cellplane_operator", "operator", "--region", region,
             "--etcd", etcd, "--regions", ",".join(self.regions),
             "--state-dir", str(self.state_dir(region)), "--resync-seconds", "5", *FAST_ELECTION,
             *self._metrics_args(region, metrics)],
            log=self.kube.run_dir / "logs" / f"operator-{region}{log_suffix}.log",
            env={"KUBECONFIG": str(self._operator_kubeconfig()),
                 # An operator runs Postgres only: pointing it at an empty directory for the
                 # Go-built programs proves that an operator's image need not carry them.
                 "CELLPLANE_BIN_DIR": str(self._without_go_programs()), **(env or {})},
        )
        process.start()
        self._started.append(process)
        if register:
            self.operators[region] = process
        return process

    def _without_go_programs(self) -> Path:
        empty = self.kube.run_dir / "no-go-programs"
        empty.mkdir(exist_ok=True)
        return empty

    def _operator_kubeconfig(self) -> Path:
        """The admin's kubeconfig; with CELLPLANE_OPERATOR_IDENTITY=chart, that of the Helm
        chart's ServiceAccount (the chart installed on first use, tests/chartinstall.py)."""
        if not chartinstall.chart_identity_requested():
            return self.kube.kubeconfig
        return chartinstall.operator_kubeconfig(self.kube, self.regions)

    def _metrics_args(self, region: str, metrics: bool) -> list[str]:
        if not metrics:
            return []
        port = free_port()
        self.metrics[region] = f"http://{LOOPBACK}:{port}/metrics"
        return ["--metrics-port", str(port)]

    def close(self) -> list[int]:
        for process in self._started:
            process.stop()
        pids: list[int] = []
        for region in self.regions:
            pids += stop_all_sites(self.state_dir(region))
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            raise AssertionError(f"site process {pid} outlived the test")
        if chartinstall.chart_identity_requested():
            chartinstall.check_operator_logs(self.kube, [p.log for p in self._started])
        return pids

    def kill_region(self, region: str) -> float:
        """Everything of the region at once, by SIGKILL: its operator, its etcd member and
        every process of its sites (Postgres backends included). Returns when it happened
        (time.monotonic)."""
        victims = site_process_ids(self.state_dir(region))
        victims += [pid for root in list(victims) for pid in descendants(root)]
        operator = self.operators.get(region)
        member = self.kube.etcd.member(region).process
        victims += [p.pid for p in (operator, member) if p is not None and p.pid is not None]
        killed_at = time.monotonic()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in (operator, member):
            if process is not None:
                process.kill()  # reaps it
        return killed_at

    def restore_region(self, region: str) -> ManagedProcess:
        """The region comes back: its etcd member rejoins, its operator starts again."""
        self.kube.etcd.restart(region)
        return self.start_operator(region, own_member=True, log_suffix="-back",
                                   metrics=region in self.metrics)

    def start_router(self, etcd_endpoints: list[str], *, hold_seconds: float,
                     name: str = "router", metrics: bool = False) -> tuple[ManagedProcess, str]:
        """``cellplane router`` as its own process, answering; (process, base URL).
        ``metrics``: it serves /metrics on a free port of its own (``self.metrics[name]``)."""
        port = free_port()
        process = ManagedProcess(
            name, [sys.executable, "-m", "cellplane_operator", "router", "--etcd",
                   ",".join(etcd_endpoints), "--port", str(port),
                   "--hold-seconds", str(hold_seconds), *self._metrics_args(name, metrics)],
            log=self.kube.run_dir / "logs" / f"{name}.log")
        process.start()
        url = f"http://{LOOPBACK}:{port}"

        def answers() -> bool:
            try:
                return httpx.get(f"{url}/v1/jobs", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        try:
            process.wait_until(answers, timeout=60, what="the router to answer")
        except BaseException:
            process.stop()
            raise
        return process, url

    # -- kubectl -------------------------------------------------------------------

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        result = self.kube.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def namespace(self, name: str) -> str:
        self.kube.kubectl("create", "namespace", name, check=False)
        return name

    def await_status(self, kind: str, name: str, predicate: Callable[[dict[str, Any]], bool], *,
                     namespace: str | None = None, timeout: float = 90, what: str = "") -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def holds() -> bool:
            body = self.get(kind, name, namespace)
            if body is None:
                return False
            seen.clear()
            seen.update(body.get("status") or {})
            return predicate(seen)

        def alive() -> None:
            for process in self.operators.values():
                if process.running:
                    return
            raise AssertionError("no operator is running")

        wait_for(holds, timeout=timeout, alive=alive,
                 what=what or f"{kind} {name} to reach the expected status (last: {seen})")
        return dict(seen)


def cell(name: str, region: str = "region-a", *, tier: str = "shared", tenants: int = 10,
         slots: int = 40, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
            "spec": {"region": region, "tier": tier,
                     "capacity": {"tenants": tenants, "workerSlots": slots},
                     "lease": FAST_LEASE, "driver": {"allowPrivateTargets": True}, **spec}}


def tenant(name: str, namespace: str, *, plan: str = "pro", region: str = "region-a",
           **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"plan": plan, "homeRegion": region, **spec}}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for entry in status.get("conditions") or []:
        if entry["type"] == type_:
            return dict(entry)
    return {}


def etcd(plane: RegionPlane, call: Any) -> Any:
    async def run() -> Any:
        store = EtcdStore(plane.kube.etcd.endpoints, timeout=5)
        try:
            return await call(store)
        finally:
            await store.close()
    return asyncio.run(run())


def records(plane: RegionPlane) -> dict[TenantKey, PlacementRecord]:
    found = etcd(plane, lambda store: PlacementRecords(store).read_all())
    return {key: stored.record for key, stored in found.items()}


def cell_database(plane: RegionPlane, name: str, region: str = "region-a") -> str:
    report = etcd(plane, lambda store: SiteReports(store).read(name, region))
    assert report is not None and report.database is not None
    return str(report.database.conninfo)


def db_rows(conninfo: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return list(conn.execute(sql.encode(), params).fetchall())


def secret_data(plane: RegionPlane, namespace: str, name: str) -> dict[str, str] | None:
    found = plane.get("secret", name, namespace)
    if found is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


def ready(status: dict[str, Any]) -> bool:
    return status.get("phase") == "Ready"


def ready_cell(plane: RegionPlane, name: str, region: str = "region-a", **kwargs: Any) -> dict[str, Any]:
    plane.apply(cell(name, region, **kwargs))
    return plane.await_status("cell", name, lambda s: ready(s) and bool(s.get("endpoints")),
                              timeout=120)


def cell_processes(cell_name: str) -> dict[str, list[int]]:
    """Every live process that serves ``cell_name``, by role, read from /proc."""
    found: dict[str, list[int]] = {"serve": [], "work": [], "postgres": []}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if f"CELLPLANE_CELL_NAME={cell_name}".encode() in environ and "cell" in text:
            role = "serve" if "serve" in text else "work" if "work" in text else None
            if role:
                found[role].append(int(entry.name))
        elif text and text[0].endswith("/postgres") and any(f"/{cell_name}@" in a for a in text):
            found["postgres"].append(int(entry.name))
    # A child just forked (a Postgres backend before it retitles itself) still shows
    # its parent's argv and environment: count the parent only.
    return {role: [pid for pid in pids if parent_pid(pid) not in pids]
            for role, pids in found.items()}
