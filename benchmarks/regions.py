"""Three regions for the region-loss benchmarks (failover.py, switchover.py).

A small copy of what tests/regionplane.py and tests/integration/test_region_loss.py
do (benchmarks may not import from tests/): a 3-member etcd and a kube-apiserver
on it, one operator per region on its own etcd member, the edge router in
region-c, a job target, one cell with sites in region-a and region-b, one
enterprise tenant pinned to it, and a client submitting jobs through the router.

The benchmark process keeps one asyncio loop in a thread for its etcd watch and
its apiserver reads (a kubectl process per poll would take a good share of a
2-core machine); everything it times is read on ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from cellplane_operator.domain.reconciliation import ReconciliationReport
from cellplane_operator.kube import CELLS, SECRETS, TENANTS, KubeClient, KubeConfig
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import descendants
from cellplane_operator.sites.local import site_process_ids, stop_all_sites
from cellplane_operator.sites.reports import SiteReport, SiteReports
from cellplane_operator.store import EtcdStore, WatchEvent

__all__ = ["REGIONS", "SERVING", "Regions", "Load", "Ack", "Watched", "percentile", "progress",
           "on_sigterm_exit", "redundant", "job_ids", "new_prefix"]

REGIONS = ("region-a", "region-b", "region-c")
SERVING = ("Ready", "Degraded")
NAMESPACE = "bench"
T = TypeVar("T")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 20 runs is the largest)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def on_sigterm_exit() -> None:
    """SIGTERM unwinds like Ctrl-C, so the ``finally`` that stops everything runs."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)


@dataclass(frozen=True)
class Watched:
    at: float
    """time.monotonic() when the benchmark's watch delivered the event."""
    event: WatchEvent

    def json(self) -> dict[str, Any]:
        return json.loads(self.event.value) if self.event.value else {}


@dataclass(frozen=True)
class Ack:
    at: float
    key: str
    job_id: str
    status: int
    """202 for a new job, 200 for a replay of a key some site had already accepted."""


class _Target(BaseHTTPRequestHandler):
    """The tenant's job target: answers every step 200 at once."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class Regions:
    """The plane, its operators, router and target; ``close`` stops all of them."""

    def __init__(self, *, keep: bool = False) -> None:
        self.kube = LocalControlPlane(LocalPlaneConfig(regions=REGIONS))
        self.keep = keep
        self.operators: dict[str, ManagedProcess] = {}
        self.router: ManagedProcess | None = None
        self.router_url = ""
        self._target: ThreadingHTTPServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._store: EtcdStore | None = None
        self._client: KubeClient | None = None
        self.watched: list[Watched] = []
        self._watches: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        progress(f"starting a {len(REGIONS)}-member etcd and the kube-apiserver in "
                 f"{self.kube.run_dir}")
        self.kube.start()
        self._thread.start()
        # region-c's member first: it is never killed, so the watch never has to move.
        endpoints = [self.kube.etcd.member(r).endpoint for r in reversed(REGIONS)]
        self._store = EtcdStore(endpoints, timeout=10)
        self._client = self.call(_kube_client(self.kube.kubeconfig))
        for region in REGIONS:
            self.start_operator(region)
        self._target = ThreadingHTTPServer((LOOPBACK, free_port()), _Target)
        threading.Thread(target=self._target.serve_forever, daemon=True).start()
        port = free_port()
        self.router = ManagedProcess(
            "router-c", [sys.executable, "-m", "cellplane_operator", "router", "--etcd",
                         self.kube.etcd.member("region-c").endpoint, "--port", str(port)],
            log=self.kube.run_dir / "logs" / "router-c.log")
        self.router.start()
        self.router_url = f"http://{LOOPBACK}:{port}"

        def answers() -> bool:
            try:
                return httpx.get(f"{self.router_url}/v1/jobs", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        self.router.wait_until(answers, timeout=60, what="the router to answer")

    @property
    def target_url(self) -> str:
        assert self._target is not None
        return f"http://{LOOPBACK}:{self._target.server_address[1]}/run"

    def state_dir(self, region: str) -> Path:
        return self.kube.run_dir / "regions" / region

    def operator_log(self, region: str) -> Path:
        return self.kube.run_dir / "logs" / f"operator-{region}.log"

    def start_operator(self, region: str) -> None:
        """The product's operator settings, on the region's own etcd member only."""
        process = ManagedProcess(
            f"operator-{region}",
            [sys.executable, "-m", "cellplane_operator", "operator", "--region", region,
             "--etcd", self.kube.etcd.member(region).endpoint, "--regions", ",".join(REGIONS),
             "--state-dir", str(self.state_dir(region))],
            log=self.operator_log(region), env={"KUBECONFIG": str(self.kube.kubeconfig)})
        process.start()
        self.operators[region] = process

    def kill_region(self, region: str) -> float:
        """SIGKILL every process of the region at once: its operator, its etcd member and
        every process of its sites. Returns when (time.monotonic())."""
        victims = site_process_ids(self.state_dir(region))
        victims += [pid for root in list(victims) for pid in descendants(root)]
        operator, member = self.operators[region], self.kube.etcd.member(region).process
        victims += [p.pid for p in (operator, member) if p is not None and p.pid is not None]
        killed_at = time.monotonic()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in (operator, member):
            if process is not None:
                process.kill()  # reaps it
        return killed_at

    def restore_region(self, region: str) -> None:
        """The region comes back: its etcd member rejoins, its operator starts again."""
        self.kube.etcd.restart(region)
        self.start_operator(region)

    def close(self, *, failed: bool) -> None:
        progress("stopping everything")
        for process in [*self.operators.values(), self.router]:
            if process is not None:
                with contextlib.suppress(Exception):
                    process.stop()
        for region in REGIONS:
            with contextlib.suppress(Exception):
                stop_all_sites(self.state_dir(region))
        if self._target is not None:
            self._target.shutdown()
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(self._close_clients(), timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.kube.stop()
        if failed or self.keep:
            progress(f"logs kept in {self.kube.run_dir}/logs")
        else:
            self.kube.remove()

    async def _close_clients(self) -> None:
        for watch in self._watches:
            watch.cancel()
        if self._client is not None:
            await self._client.close()
        if self._store is not None:
            await self._store.close()

    # -- the benchmark's own loop --------------------------------------------------

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    @property
    def store(self) -> EtcdStore:
        assert self._store is not None
        return self._store

    @property
    def client(self) -> KubeClient:
        assert self._client is not None
        return self._client

    def watch(self, prefix: str) -> None:
        """Records every event under ``prefix`` from now on in ``watched``."""
        async def run() -> None:
            async for event in self.store.watch_prefix(prefix):
                self.watched.append(Watched(time.monotonic(), event))

        async def start() -> None:
            self._watches.append(asyncio.create_task(run(), name=f"watch {prefix}"))

        self.call(start())

    def events_since(self, since: float, key: str) -> list[Watched]:
        return [w for w in list(self.watched) if w.at >= since and w.event.key == key]

    # -- the cell ---------------------------------------------------------------------

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))

    def status(self, cell: str) -> dict[str, Any]:
        body = self.call(self.client.get(CELLS, cell)) or {}
        return dict(body.get("status") or {})

    def await_status(self, cell: str, predicate: Callable[[dict[str, Any]], bool], *,
                     timeout: float, what: str, poll: float = 0.25) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for region, process in self.operators.items():
                if process.pid is not None and process.returncode is not None:
                    raise RuntimeError(f"operator of {region} exited ({process.returncode}); "
                                       f"log {self.operator_log(region)}")
            asked = time.monotonic()
            status = self.status(cell)
            if time.monotonic() - asked > 2:
                progress(f"  (the apiserver took {time.monotonic() - asked:.1f}s to answer)")
            if predicate(status):
                return status
            time.sleep(poll)
        raise TimeoutError(f"{what}: not within {timeout:g}s; last status "
                           f"{json.dumps(status)[:3000]}")

    def site_report(self, cell: str, region: str) -> SiteReport | None:
        return self.call(SiteReports(self.store).read(cell, region))

    def cell_database(self, cell: str, region: str) -> str:
        report = self.site_report(cell, region)
        if report is None or report.database is None:
            raise RuntimeError(f"no database in the site report of {cell} in {region}")
        return str(report.database.conninfo)

    def make_cell(self, name: str, lease: Mapping[str, float], *,
                  standby: bool = True, worker_slots: int = 40) -> dict[str, Any]:
        """A cell homed in region-a with a standby in region-b (unless ``standby`` is
        false), Ready with it streaming."""
        self.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                    "metadata": {"name": name},
                    "spec": {"region": "region-a",
                             "standbyRegions": ["region-b"] if standby else [],
                             "tier": "shared", "capacity": {"tenants": 10, "workerSlots": worker_slots},
                             "lease": dict(lease), "driver": {"allowPrivateTargets": True}}})
        return self.await_status(name, lambda s: s.get("phase") == "Ready"
                                 and (not standby or redundant(s, "region-b")), timeout=300,
                                 what=f"cell {name} Ready" + (" with a streaming standby"
                                                              if standby else ""))

    def start_scene(self, cell: str, lease: Mapping[str, float], tenant: str,
                    watched: tuple[str, ...]) -> tuple[str, Load]:
        """The plane, a cell with a standby, a tenant in it and its load running (60 jobs
        acknowledged); the etcd prefixes in ``watched`` watched. (tenant id, load)."""
        self.start()
        progress(f"cell {cell}: region-a with a standby in region-b, lease {dict(lease)}")
        self.make_cell(cell, lease)
        tenant_id, key = self.make_tenant(tenant, cell)
        for prefix in watched:
            self.watch(prefix)
        load = Load(self.router_url, key, new_prefix()).start()
        load.wait_for(60)
        progress("load running; first run")
        return tenant_id, load

    def make_tenant(self, name: str, cell: str) -> tuple[str, str]:
        """An enterprise tenant pinned to ``cell``; (tenant id, API key).

        The plan's default token bucket (1 job/s, burst 60) would hold the client to one
        job a second after its first 60: the quota is raised (within the plan's ceiling)
        so that the load is the 30 jobs/s the benchmark means."""
        self.kube.kubectl("create", "namespace", NAMESPACE, check=False)
        self.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"plan": "enterprise", "homeRegion": "region-a", "cell": cell,
                             "quotas": {"jobsPerSecond": 100, "burst": 500},
                             "targets": [{"name": "default", "url": self.target_url}]}})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            body = self.call(self.client.get(TENANTS, name, namespace=NAMESPACE)) or {}
            secret = self.call(self.client.get(SECRETS, f"{name}-api-key", namespace=NAMESPACE))
            if (body.get("status") or {}).get("phase") == "Ready" and secret is not None:
                key = base64.b64decode(secret["data"]["api-key"]).decode()
                return key.removeprefix("cpk_").split(".")[0], key
            time.sleep(0.5)
        raise TimeoutError(f"tenant {name} not Ready in 180s")

    def report(self, cell: str, epoch: int) -> ReconciliationReport:
        printed = subprocess.run(
            [sys.executable, "-m", "cellplane_operator", "report", cell, "--epoch", str(epoch),
             "--json", "--kubeconfig", str(self.kube.kubeconfig)],
            capture_output=True, text=True, check=True, timeout=60)
        return ReconciliationReport.from_json(printed.stdout)


def redundant(status: dict[str, Any], region: str) -> bool:
    """The site in ``region`` is a streaming standby, by the owner's status."""
    return any(sb.get("region") == region and sb.get("streaming")
               for sb in status.get("standbys") or [])


def job_ids(conninfo: str, tenant_id: str) -> set[str]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(b"SELECT job_id FROM jobs WHERE tenant_id = %s", (tenant_id,))
        return {str(row[0]) for row in rows.fetchall()}


@dataclass
class Load:
    """One client submitting jobs through the router, each key until it is acknowledged
    (a 503 or a broken connection is retried with the same key after 0.2 s), about 30
    a second: the client of tests/integration/test_region_loss.py."""

    router: str
    api_key: str
    prefix: str
    acks: list[Ack] = field(default_factory=list)
    failed_attempts: set[str] = field(default_factory=set)
    """Keys with at least one attempt that got no acknowledgement."""
    stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def acknowledged(self) -> set[str]:
        return {ack.job_id for ack in list(self.acks)}

    def wait_for(self, count: int, timeout: float = 120) -> None:
        wanted = len(self.acks) + count
        deadline = time.monotonic() + timeout
        while len(self.acks) < wanted:
            if time.monotonic() > deadline or not (self._thread and self._thread.is_alive()):
                raise TimeoutError(f"{count} more acknowledged jobs not within {timeout:g}s "
                                   f"(have {len(self.acks)})")
            time.sleep(0.05)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        with httpx.Client(timeout=40) as client:
            number = 0
            while not self.stop.is_set():
                key = f"{self.prefix}-{number}"
                while True:
                    try:
                        answer: httpx.Response | None = client.post(
                            f"{self.router}/v1/jobs",
                            json={"target": "default", "payload": {"n": number}},
                            headers={**headers, "Idempotency-Key": key})
                    except httpx.HTTPError:
                        answer = None
                    if answer is not None and answer.status_code in (200, 202):
                        self.acks.append(Ack(time.monotonic(), key, answer.json()["job_id"],
                                             answer.status_code))
                        break
                    self.failed_attempts.add(key)
                    if self.stop.is_set():
                        return
                    time.sleep(0.2)
                number += 1
                time.sleep(0.02)


def new_prefix() -> str:
    return f"k{random.getrandbits(32):08x}"


async def _kube_client(kubeconfig: Path) -> KubeClient:
    return KubeClient(KubeConfig.from_file(kubeconfig))



def print_phases(heading: str, phases: list[tuple[str, list[float]]]) -> None:
    """A min / p50 / max table of where the time of each run went."""
    print(f"| {heading} | min | p50 | max |")
    print("|---|---:|---:|---:|")
    for name, values in phases:
        if values:
            print(f"| {name} | {min(values):.2f} | {percentile(values, 50):.2f} "
                  f"| {max(values):.2f} |")
    print()


def print_client(load: Load, *, outages: bool) -> None:
    acks = list(load.acks)
    seconds = acks[-1].at - acks[0].at if len(acks) > 1 else 0.0
    print(f"- Client: one thread through the router, each key retried every 0.2 s until "
          f"acknowledged: {len(acks)} jobs acknowledged in {seconds / 60:.1f} min "
          f"({len(acks) / max(seconds, 1):.1f}/s{', outages included' if outages else ''}); "
          "the tenant's token bucket is raised to 100/s so that it does not hold the client "
          "to the plan's 1/s.")
