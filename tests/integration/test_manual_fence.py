"""A cell fenced on purpose (``kubectl cellplane fence``), against real processes.

The fence is put on and lifted through the pinned kubectl and the plugin, over a
real apiserver where a real regional operator runs the cell (Postgres, cell API,
workers). What is checked is what a platform team relies on: a write reaches
the cell database and is refused; nobody takes the cell over (same owner, same
epoch, same etcd lease); the Cell says so (condition, Event, ``status``); the
fence outlives an operator killed with SIGKILL and restarted, with writes
polled all through the restart window; and lifting it lets the same tenant
write again under the same epoch.

The database side of the fence is also run alone against a stalled database:
renewals queued behind a statement that hangs, computed before the fence, must
not reopen writes once the fence's own grant has landed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from cellplane_operator.domain.fencing import FENCED, ManualFence
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.sites.celldb import PostgresCellDatabases
from cellplane_operator.ownership.table import GroupView, OwnershipTable
from regionplane import (
    RegionPlane,
    cell,
    cell_database,
    cell_processes,
    condition,
    db_rows,
    etcd,
    ready,
    ready_cell,
    secret_data,
    tenant,
)

PLUGIN = Path(sys.executable).parent / "kubectl-cellplane"
CELL = "fence-a1"
REASON = "suspected corruption in the ledger"
PRODUCT_LEASE = {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube)
    regions.start_operator("region-a")
    try:
        # The product's lease: a restarted operator adopts the live lease (same epoch)
        # instead of waiting out a 2 s test lease, as in production.
        ready_cell(regions, CELL, lease=PRODUCT_LEASE)
        yield regions
    finally:
        regions.close()


def kubectl_cellplane(kube: LocalControlPlane, *argv: str) -> subprocess.CompletedProcess[str]:
    """``kubectl cellplane ARGV`` as a user runs it: the pinned kubectl finds the plugin on
    PATH (as in test_kubectl_plugin.py)."""
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig),
           "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(kube.binaries.kubectl), "cellplane", *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


class TenantClient:
    """The tenant's own view: its API key, straight at the cell's API (no router)."""

    def __init__(self, api: str, key: str) -> None:
        self.api = api
        self._headers = {"Authorization": f"Bearer {key}"}

    def submit(self, key: str | None = None) -> httpx.Response:
        return httpx.post(f"{self.api}/v1/jobs", json={"target": "default", "payload": {}},
                          headers={**self._headers,
                                   "Idempotency-Key": key or f"k-{uuid.uuid4().hex}"},
                          timeout=10)

    def status(self, job_id: str) -> str:
        found = httpx.get(f"{self.api}/v1/jobs/{job_id}", headers=self._headers, timeout=10)
        assert found.status_code == 200, found.text
        return str(found.json()["status"])

    def completes(self, answer: httpx.Response) -> None:
        assert answer.status_code == 202, answer.text
        job_id = str(answer.json()["job_id"])
        wait_for(lambda: self.status(job_id) == "succeeded", timeout=60,
                 what=f"job {job_id} to succeed")


@pytest.fixture(scope="module")
def client(plane: RegionPlane, target: Any) -> TenantClient:
    assert PLUGIN.is_file(), f"{PLUGIN} is missing: bash hack/setup.sh installs the console script"
    ns = plane.namespace("fencing")
    plane.apply(tenant("acme", ns, plan="enterprise", cell=CELL,
                       quotas={"jobsPerSecond": 200, "burst": 500},
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    plane.await_status("tenant", "acme", ready, namespace=ns, timeout=120)
    key = (secret_data(plane, ns, "acme-api-key") or {})["api-key"]
    return TenantClient(api_of(plane, CELL), key)


@pytest.fixture
def two_regions(kube3: LocalControlPlane) -> Iterator[RegionPlane]:
    """Operators in region-a and region-b, each on its own etcd member (region-c's member
    keeps the quorum when region-a is lost); stopped at the end of the test, so the module's
    other tests do not run beside them."""
    regions = RegionPlane(kube3, ("region-a", "region-b", "region-c"))
    for region in ("region-a", "region-b"):
        regions.start_operator(region, own_member=True)
    try:
        yield regions
    finally:
        regions.close()


def test_a_fence_follows_the_cell_when_another_region_takes_it_over(
        two_regions: RegionPlane, target: Any) -> None:
    plane, name = two_regions, "fence-f1"
    plane.apply(cell(name, standbyRegions=["region-b"],
                     lease={"durationSeconds": 3, "renewIntervalSeconds": 0.5,
                            "marginSeconds": 0.5}))
    plane.await_status("cell", name, lambda s: ready(s) and bool(s.get("endpoints")),
                       timeout=180)
    ns = plane.namespace("fencing-failover")
    plane.apply(tenant("initech", ns, plan="enterprise", cell=name,
                       quotas={"jobsPerSecond": 200, "burst": 500},
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    plane.await_status("tenant", "initech", ready, namespace=ns, timeout=120)
    key = (secret_data(plane, ns, "initech-api-key") or {})["api-key"]
    at_a = TenantClient(api_of(plane, name), key)
    at_a.completes(at_a.submit())
    before = group(plane, name).owner
    assert before is not None and before.region == "region-a"

    fenced = kubectl_cellplane(plane.kube, "fence", name, "--reason", "maintenance", "--wait")
    assert fenced.returncode == 0, fenced.stderr
    assert refused_by_the_database(at_a.submit(), "maintenance")

    plane.kill_region("region-a")
    status = plane.await_status(
        "cell", name, lambda s: s.get("activeRegion") == "region-b"
        and (s.get("epoch") or 0) > before.epoch
        and condition(s, "Fenced").get("status") == "True" and bool(s.get("endpoints")),
        timeout=120, what="region-b to take the cell over, fenced")
    assert status["phase"] == "Fenced"
    after = group(plane, name)
    assert after.owner is not None and after.owner.region == "region-b"
    # The new primary serves reads and refuses writes, with no workers.
    at_b = TenantClient(api_of(plane, name), key)
    assert refused_by_the_database(at_b.submit("after-takeover"), "maintenance")
    assert worker_processes(plane, name) == 0
    assert cell_events(plane, "TookOver", name)

    unfenced = kubectl_cellplane(plane.kube, "unfence", name, "--wait")
    assert unfenced.returncode == 0, unfenced.stderr
    at_b.completes(at_b.submit())
    assert group(plane, name).owner == after.owner


def group(plane: RegionPlane, name: str = CELL) -> GroupView:
    found: GroupView = etcd(plane, lambda store: OwnershipTable(store).read_group(name))
    return found


def cell_events(plane: RegionPlane, reason: str, name: str = CELL) -> list[str]:
    events = json.loads(plane.kube.kubectl(
        "get", "events", "-A", "--field-selector",
        f"involvedObject.name={name},reason={reason}", "-o", "json").stdout)
    return [str(e["message"]) for e in events["items"]]


def api_of(plane: RegionPlane, name: str) -> str:
    return str(((plane.get("cell", name) or {})["status"]["endpoints"])["api"])


def worker_processes(plane: RegionPlane, name: str = CELL) -> int:
    """The cell's worker processes alive now, read from /proc."""
    return len(cell_processes(name)["work"])


def refused_by_the_database(answer: httpx.Response, reason: str = REASON) -> bool:
    """The cell answered that its database refused the write for the fence (not for a
    lease that ran out), and gave the fence's reason."""
    error = answer.json().get("error") or {}
    return (answer.status_code, error.get("code")) == (503, "cell_fenced") and (
        reason in error.get("message", ""))


class WritePoller:
    """Submits a job every few milliseconds in a thread, and keeps every answer."""

    def __init__(self, client: TenantClient) -> None:
        self._client = client
        self._stop = threading.Event()
        self.answers: list[tuple[int, str]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WritePoller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self._client.submit()
                code = answer.json().get("error", {}).get("code", "") if (
                    answer.status_code != 202) else str(answer.json().get("job_id"))
                self.answers.append((answer.status_code, code))
            except (httpx.HTTPError, ValueError) as error:
                self.answers.append((0, f"{type(error).__name__}: {error}"))
            self._stop.wait(0.02)


def test_a_fence_refuses_writes_without_a_takeover_outlives_a_kill_and_lifts(
        plane: RegionPlane, client: TenantClient) -> None:
    client.completes(client.submit())
    held = group(plane)
    assert held.owner is not None and held.owner.region == "region-a"
    database = cell_database(plane, CELL)

    fenced = kubectl_cellplane(plane.kube, "fence", CELL, "--reason", REASON, "--wait",
                               "--timeout", "60")
    assert fenced.returncode == 0, fenced.stderr
    said = fenced.stdout.splitlines()
    assert said[0] == (f"cell {CELL} fenced ({FENCED}={REASON}): its owner stops every write")
    assert said[1].startswith(f"cell {CELL}: fence in force: {REASON}")

    # A write reaches the database and is refused; nothing of it was kept.
    refused = client.submit("while-fenced")
    assert refused_by_the_database(refused), refused.text
    assert db_rows(database, "SELECT 1 FROM idempotency_keys WHERE key = %s",
                   "while-fenced") == []
    [(remaining,)] = db_rows(database, "SELECT extract(epoch FROM lease_deadline - "
                                       "clock_timestamp()) FROM placement_group")
    assert remaining <= 0
    # Nobody took over: the same owner, epoch and etcd lease hold the group.
    assert group(plane).owner == held.owner
    status = plane.await_status("cell", CELL, lambda s: s.get("phase") == "Fenced")
    fence = condition(status, "Fenced")
    assert (fence["status"], fence["reason"]) == ("True", "FencedByUser")
    assert REASON in fence["message"] and status["epoch"] == held.owner.epoch
    assert condition(status, "Ready")["reason"] == "FencedByUser"
    assert [m for m in cell_events(plane, "Fenced") if REASON in m], cell_events(plane, "Fenced")
    # The tenant says who stopped its writes, not that its cell is merely not ready.
    tenant_status = plane.await_status(
        "tenant", "acme", lambda s: condition(s, "Ready").get("reason") == "CellFenced",
        namespace="fencing", timeout=30)
    assert f"unfence {CELL}" in condition(tenant_status, "Ready")["message"]
    # The workers are stopped rather than refused and restarted over and over.
    wait_for(lambda: worker_processes(plane) == 0, timeout=30, what="the workers to stop")

    again = kubectl_cellplane(plane.kube, "fence", CELL)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"cell {CELL} is fenced already ({REASON})\n"
    shown = kubectl_cellplane(plane.kube, "status")
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if line.startswith(f"{CELL} "))
    assert (row[3], row[8]) == ("Fenced", "yes"), row

    # SIGKILL the operator and start another, polling writes the whole time: the
    # database must refuse every one, also while the new operator adopts the lease
    # and renews it.
    with WritePoller(client) as poller:
        wait_for(lambda: len(poller.answers) >= 5, timeout=30, what="writes before the kill")
        plane.operators["region-a"].kill()
        # Read after the kill: every later grant is the new operator's.
        [(granted_before,)] = db_rows(database, "SELECT updated_at FROM placement_group")
        plane.start_operator("region-a", log_suffix="-after-kill")
        log = plane.kube.run_dir / "logs" / "operator-region-a-after-kill.log"
        wait_for(lambda: f"{CELL}: adopted the live lease of epoch" in log.read_text(),
                 timeout=60, what="the new operator to adopt the cell's lease")
        renewals: set[Any] = set()

        def renewed_three_times() -> bool:
            [(at,)] = db_rows(database, "SELECT updated_at FROM placement_group")
            if at > granted_before:
                renewals.add(at)
            return len(renewals) >= 3
        wait_for(renewed_three_times, timeout=60,
                 what="the new operator to grant (under the fence) three times")
    assert len(poller.answers) >= 20, poller.answers
    not_refused = [a for a in poller.answers if a != (503, "cell_fenced")]
    assert not_refused == [], not_refused
    [(remaining,)] = db_rows(database, "SELECT extract(epoch FROM lease_deadline - "
                                       "clock_timestamp()) FROM placement_group")
    assert remaining <= 0
    after = group(plane)
    assert after.owner == held.owner  # adopted: the same lease, the same epoch
    status = plane.await_status("cell", CELL, lambda s: s.get("phase") == "Fenced")
    assert condition(status, "Fenced")["status"] == "True"
    assert worker_processes(plane) == 0
    assert len([m for m in cell_events(plane, "Fenced") if REASON in m]) == 1

    # Lifted: writes again under the same epoch, the workers back.
    unfenced = kubectl_cellplane(plane.kube, "unfence", CELL, "--wait", "--timeout", "60")
    assert unfenced.returncode == 0, unfenced.stderr
    assert unfenced.stdout.splitlines() == [
        f"cell {CELL} unfenced: its owner grants writes again",
        f"cell {CELL}: fence lifted, writes granted under epoch {held.owner.epoch}"]
    client.completes(client.submit())
    status = plane.await_status("cell", CELL, ready)
    fence = condition(status, "Fenced")
    assert (fence["status"], fence["reason"]) == ("False", "NotFenced")
    assert status["epoch"] == held.owner.epoch and group(plane).owner == held.owner
    assert cell_events(plane, "Unfenced")
    plane.await_status("tenant", "acme", ready, namespace="fencing", timeout=60)
    again = kubectl_cellplane(plane.kube, "unfence", CELL)
    assert (again.returncode, again.stdout) == (0, f"cell {CELL} is not fenced\n")


def test_unknown_cells_are_refused_in_one_line(plane: RegionPlane) -> None:
    for command in ("fence", "unfence"):
        shown = kubectl_cellplane(plane.kube, command, "no-such-cell", "--wait")
        assert shown.returncode == 1 and shown.stdout == ""
        assert one_line(shown.stderr) == "kubectl cellplane: no cell no-such-cell"


def test_a_fence_that_nobody_enforces_times_out_with_exit_2(plane: RegionPlane) -> None:
    # A cell of a region no operator runs: the annotation is written, nothing reports it.
    plane.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                 "metadata": {"name": "fence-z1"},
                 "spec": {"region": "region-z", "tier": "shared",
                          "capacity": {"tenants": 1, "workerSlots": 1}}})
    try:
        shown = kubectl_cellplane(plane.kube, "fence", "fence-z1", "--wait", "--timeout", "1")
        assert shown.returncode == 2, shown.stderr
        assert shown.stdout.startswith("cell fence-z1 fenced")
        assert "was not in force after 1s" in one_line(shown.stderr)
        annotations = (plane.get("cell", "fence-z1") or {})["metadata"]["annotations"]
        assert annotations[FENCED] == "true"
    finally:
        plane.kube.kubectl("delete", "cell", "fence-z1", "--wait=true", "--timeout=60s")


class HoldingProxy:
    """A TCP proxy in front of Postgres that can hold new connections before they reach it:
    a slow network for the connections opened while ``hold`` is set."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self.hold = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._accept, self._upstream[0], 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.hold:
            self.held.set()
            await self.release.wait()
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._tasks += [asyncio.create_task(_pipe(reader, up_writer)),
                        asyncio.create_task(_pipe(up_reader, writer))]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def writable(conninfo: str) -> bool:
    """Whether the database accepts a write of epoch 1 now (the statement trigger's verdict);
    a refusal must be the fence's own (CPF01), not a lease that ran out."""
    with psycopg.connect(conninfo, autocommit=True) as writer:
        writer.execute("SELECT set_config('cellplane.epoch', '1', false)")
        try:
            writer.execute("UPDATE rate_buckets SET tokens = tokens WHERE false")
        except psycopg.Error as refused:
            assert refused.sqlstate == "CPF01", refused
            assert "cell fenced on rate_buckets: maintenance" in str(refused), refused
            return False
    return True


def test_a_renewal_that_read_no_fence_cannot_land_after_the_fence(cell_db: str) -> None:
    """A renewal asked for before the fence, whose connection is slow to open (the fault:
    a held TCP connection), must not reach the database after the fence's own grant.
    Each grant reads the fence under the grant's lock, so the fence's grant waits for
    the renewal and lands last. (Without the lock it connects on its own, lands first,
    and the late renewal reopens writes: this test then fails.)"""
    standing: list[ManualFence | None] = [None]
    fields = dict(part.split("=", 1) for part in cell_db.split())

    async def run() -> CellDatabaseGrant:
        async with HoldingProxy(fields["host"], int(fields["port"])) as proxy:
            via = cell_db.replace(f"port={fields['port']}", f"port={proxy.port}")
            databases = PostgresCellDatabases(timeout_seconds=30)
            grant = CellDatabaseGrant(databases, via, fence=lambda: standing[0])
            proxy.hold = True
            renewal = asyncio.create_task(grant.renew_grant(1, 3600))
            await proxy.held.wait()
            proxy.hold = False
            standing[0] = ManualFence("maintenance")
            fence = asyncio.create_task(grant.renew_grant(1, 3600))
            # The window in which a fence grant that did not wait would land first (its
            # own connection is not held); a correct one is still waiting when it closes.
            await asyncio.wait({fence}, timeout=2.0)
            proxy.release.set()
            await asyncio.gather(renewal, fence)
            # Right after both: the fence's grant is the one that counts.
            assert grant.last_grant == (1, 0.0)
            assert not writable(cell_db)
            more = [asyncio.create_task(grant.renew_grant(1, 3600)) for _ in range(5)]
            await asyncio.gather(*more)
            await databases.close()
            return grant

    grant = asyncio.run(run())
    assert grant.fenced_by == ManualFence("maintenance") and grant.last_grant == (1, 0.0)
    assert not writable(cell_db)
    # Lifted: the next grant (straight to the database now) gives the lease's time again,
    # under the same epoch.
    standing[0] = None

    async def lift() -> CellDatabaseGrant:
        databases = PostgresCellDatabases()
        direct = CellDatabaseGrant(databases, cell_db, fence=lambda: standing[0])
        await direct.renew_grant(1, 3600)
        await databases.close()
        return direct

    assert asyncio.run(lift()).fenced_by is None and writable(cell_db)
