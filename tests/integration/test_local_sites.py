"""The local site driver against real Postgres and real cell processes (no fakes).

Site processes outlive the operator by design, so the fixture cleans up with
``stop_all_sites`` and then checks, itself, that every PID any test saw is gone
(the conftest's leak checks only know the control plane's own processes).

The state dir is a fresh directory under the system temp dir, not pytest's
``tmp_path``: pytest keeps its temp root private to root (0700, and resets it
at every session start), and Postgres runs as the ``postgres`` OS user, which
must walk into the site's data directory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from cellplane_cells.migrate import available_migrations
from cellplane_operator.errors import SiteError
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.sites import (
    DatabaseEndpoint,
    ServingSpec,
    SiteHealth,
    SiteKey,
    stop_all_sites,
)
from cellplane_operator.sites.processes import ProcessRecord, start_time
from cellplane_operator.sites.state import SiteLayout
from sitefixtures import Sites, alive, run_sites

PRIMARY = SiteKey("shared-a1", "region-a")
STANDBY = SiteKey("shared-a1", "region-b")
TOKEN = "admin-token-for-site-tests-0123456789"


@pytest.fixture
def sites(request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from run_sites(request, "cellplane-sites-")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def _grant(database: DatabaseEndpoint, epoch: int) -> None:
    """What the lease owner does before its processes start: the epoch, for an hour."""
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(%s, make_interval(secs => %s))", (epoch, 3600))


async def _eventually(check: Callable[[], Awaitable[SiteHealth]],
                      condition: Callable[[SiteHealth], bool], *, timeout: float,
                      what: str) -> SiteHealth:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        health = await check()
        if condition(health):
            return health
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last health {health}")
        await asyncio.sleep(0.2)


def _spec(epoch: int, workers: int = 2) -> ServingSpec:
    return ServingSpec(epoch=epoch, admin_token=TOKEN, worker_processes=workers,
                       slots_per_worker=4, allow_private_targets=True)


async def _serving(sites: Sites, epoch: int = 1, workers: int = 2) -> DatabaseEndpoint:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    _grant(database, epoch)
    await sites.driver.start_serving(PRIMARY, _spec(epoch, workers))
    return database


def _admin_health(admin: str) -> dict[str, object]:
    response = httpx.get(f"{admin}/admin/v1/health", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def test_primary_database_is_created_migrated_and_then_adopted(sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)

    assert database.dbname == "cellplane"
    with psycopg.connect(database.conninfo) as conn:
        applied = [row[0] for row in
                   conn.execute("SELECT number FROM schema_migrations ORDER BY 1")]
        group = conn.execute("SELECT cell FROM placement_group").fetchall()
    assert applied == [m.number for m in available_migrations()]
    assert group == [("shared-a1",)]
    postmaster = sites.pids(PRIMARY)["postgres"]

    again = await sites.new_driver().ensure_primary_database(PRIMARY)

    assert again == database
    assert sites.pids(PRIMARY)["postgres"] == postmaster


async def test_serving_answers_and_a_restarted_operator_adopts_every_process(sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    _grant(database, 1)
    endpoints = await sites.driver.start_serving(PRIMARY, _spec(1))

    health = _admin_health(endpoints.admin)
    assert health["epoch"] == 1 and health["cell"] == "shared-a1"
    assert httpx.get(f"{endpoints.admin}/admin/v1/health").status_code == 401
    # A tenant made through the admin API (a write, so the grant is in force)
    # reads its empty job list through the tenant API.
    created = httpx.put(f"{endpoints.admin}/admin/v1/tenants/acme", json={"plan": "pro"},
                        headers={"Authorization": f"Bearer {TOKEN}"})
    assert created.status_code == 200, created.text
    jobs = httpx.get(f"{endpoints.api}/v1/jobs",
                     headers={"Authorization": f"Bearer {created.json()['api_key']}"})
    assert jobs.status_code == 200 and jobs.json()["jobs"] == []
    before = sites.pids(PRIMARY)
    assert set(before) == {"postgres", "api", "worker-0", "worker-1"}
    api_pid = before["api"]
    assert TOKEN not in Path(f"/proc/{api_pid}/cmdline").read_text()
    assert TOKEN not in (sites.state_dir / PRIMARY.name / "site.json").read_text()

    restarted = sites.new_driver()
    assert await restarted.ensure_primary_database(PRIMARY) == database
    assert await restarted.start_serving(PRIMARY, _spec(1)) == endpoints

    assert sites.pids(PRIMARY) == before
    assert all(alive(pid) for pid in before.values())
    health_report = await restarted.check(PRIMARY)
    assert health_report.serving and health_report.database_up
    assert health_report.epoch == 1 and health_report.restarted == ()
    assert health_report.endpoints == endpoints and health_report.in_recovery is False


# An operator process that brings a site up and exits, as an operator that is
# restarted (or crashes) does: its site processes become orphans.
_OPERATOR_THAT_EXITS = """
import asyncio, sys
from pathlib import Path
import psycopg
from cellplane_operator.localplane import Binaries
from cellplane_operator.sites import LocalSiteDriver, ServingSpec, SiteKey

async def main() -> None:
    driver = LocalSiteDriver(Binaries.discover(), Path(sys.argv[1]))
    site = SiteKey("shared-a1", "region-a")
    database = await driver.ensure_primary_database(site)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(1, make_interval(secs => 3600))")
    await driver.start_serving(site, ServingSpec(epoch=1, admin_token=sys.argv[2],
                               worker_processes=1, slots_per_worker=4,
                               allow_private_targets=True))

asyncio.run(main())
"""


async def test_processes_of_an_operator_that_exited_are_adopted_and_cleaned_up(
    sites: Sites,
) -> None:
    subprocess.run([sys.executable, "-c", _OPERATOR_THAT_EXITS, str(sites.state_dir), TOKEN],
                   check=True, timeout=120)
    orphans = sites.pids(PRIMARY)
    assert set(orphans) == {"postgres", "api", "worker-0"}
    assert all(alive(pid) for pid in orphans.values())

    await sites.driver.ensure_primary_database(PRIMARY)
    endpoints = await sites.driver.start_serving(PRIMARY, _spec(1, workers=1))

    assert sites.pids(PRIMARY) == orphans
    assert _admin_health(endpoints.admin)["epoch"] == 1
    os.kill(orphans["api"], signal.SIGKILL)
    wait_for(lambda: not alive(orphans["api"]), timeout=10, what="the orphaned API to die")
    assert (await sites.driver.check(PRIMARY)).restarted == ("api",)

    stopped = stop_all_sites(sites.state_dir)

    assert set(orphans.values()) - {orphans["api"]} <= set(stopped)
    for pid in stopped:
        # Gone from /proc altogether, zombies of orphans included: kill(pid, 0)
        # is what other leak checks use.
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_new_epoch_replaces_every_process(sites: Sites) -> None:
    database = await _serving(sites, epoch=1)
    old = sites.pids(PRIMARY)

    _grant(database, 2)
    endpoints = await sites.driver.start_serving(PRIMARY, _spec(2))

    new = sites.pids(PRIMARY)
    assert new["postgres"] == old["postgres"]
    for role in ("api", "worker-0", "worker-1"):
        assert not alive(old[role]), f"{role} of epoch 1 still runs"
        assert new[role] != old[role] and alive(new[role])
        assert _environ(new[role])["CELLPLANE_CELL_EPOCH"] == "2"
    assert "shared-a1@region-a-w1-e2" in Path(f"/proc/{new['worker-1']}/cmdline").read_text()
    assert _admin_health(endpoints.admin)["epoch"] == 2
    assert (await sites.driver.check(PRIMARY)).epoch == 2


def _cell(priority_floors: dict[str, int]) -> CellSettings:
    """A Cell as the operator reads it: 8 slots over 2 worker processes, 4 each."""
    return CellSettings.from_body({"metadata": {"name": PRIMARY.cell}, "spec": {
        "region": PRIMARY.region, "tier": "shared",
        "capacity": {"tenants": 2, "workerSlots": 8, "priorityFloors": priority_floors},
        "driver": {"workerProcesses": 2, "allowPrivateTargets": True}}})


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def _said_at_start_up(sites: Sites, role: str, floors: str) -> bool:
    """The worker's own word (``cellplane cell work`` logs the floors it parsed)."""
    said = sites.layout(PRIMARY).log(role).read_text(errors="replace")
    return "worker shared-a1@region-a-w" in said and f"4 slots (floors {floors})" in said


async def test_workers_run_with_the_cells_priority_floors_and_restart_when_they_change(
        sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    _grant(database, 1)
    cell = _cell({"critical": 2, "high": 1})
    await sites.driver.start_serving(PRIMARY, cell.serving_spec(1, TOKEN, cell.workers(2)))

    before = sites.pids(PRIMARY)
    for role in ("worker-0", "worker-1"):
        argv = _argv(before[role])
        assert argv[argv.index("--slots") + 1] == "4"
        assert argv[argv.index("--priority-floors") + 1] == "CRITICAL=2,HIGH=1,DEFAULT=0,LOW=0"
        wait_for(lambda: _said_at_start_up(sites, role, "CRITICAL 2, HIGH 1, DEFAULT 0, LOW 0"),
                 timeout=30, what=f"{role} to say its floors")

    # The Cell's floors changed: the workers are restarted with them; the API and the
    # database are left alone.
    changed = _cell({"low": 3})
    await sites.driver.start_serving(PRIMARY, changed.serving_spec(1, TOKEN, changed.workers(2)))

    after = sites.pids(PRIMARY)
    assert (after["api"], after["postgres"]) == (before["api"], before["postgres"])
    for role in ("worker-0", "worker-1"):
        assert not alive(before[role]) and alive(after[role])
        argv = _argv(after[role])
        assert argv[argv.index("--priority-floors") + 1] == "CRITICAL=0,HIGH=0,DEFAULT=0,LOW=3"
        wait_for(lambda: _said_at_start_up(sites, role, "CRITICAL 0, HIGH 0, DEFAULT 0, LOW 3"),
                 timeout=30, what=f"{role} to say its new floors")


async def test_a_killed_api_is_restarted_by_check(sites: Sites) -> None:
    await _serving(sites)
    api = sites.pids(PRIMARY)["api"]

    os.kill(api, signal.SIGKILL)
    wait_for(lambda: not alive(api), timeout=10, what="the API to die")
    health = await sites.new_driver().check(PRIMARY)

    assert health.restarted == ("api",)
    assert health.serving and health.epoch == 1
    assert sites.pids(PRIMARY)["api"] != api
    assert health.endpoints is not None
    assert _admin_health(health.endpoints.admin)["epoch"] == 1


async def test_a_killed_postgres_is_restarted_by_check(sites: Sites) -> None:
    database = await _serving(sites, workers=1)
    postmaster = sites.pids(PRIMARY)["postgres"]

    os.kill(postmaster, signal.SIGKILL)
    wait_for(lambda: not alive(postmaster), timeout=10, what="postgres to die")
    health = await sites.driver.check(PRIMARY)

    assert "postgres" in health.restarted and health.database_up
    assert sites.pids(PRIMARY)["postgres"] != postmaster
    with psycopg.connect(database.conninfo) as conn:
        assert conn.execute("SELECT cell FROM placement_group").fetchall() == [("shared-a1",)]
    # The API's pool reconnects (or the API is restarted): the site serves again.
    await _eventually(lambda: sites.driver.check(PRIMARY), lambda h: h.serving, timeout=60,
                      what="the site to serve again after the Postgres restart")


async def test_a_standby_streams_from_the_primary_and_reports_its_lag(sites: Sites) -> None:
    primary = await sites.driver.ensure_primary_database(PRIMARY)

    standby = await sites.driver.ensure_standby_database(STANDBY, primary)

    assert standby.port != primary.port
    health = await _eventually(lambda: sites.driver.check(STANDBY), lambda h: h.streaming,
                               timeout=30, what="the standby to stream")
    assert health.database_up and health.in_recovery is True
    assert health.replay_lag_seconds is not None and 0 <= health.replay_lag_seconds < 30
    assert not health.serving and health.endpoints is None
    primary_health = await sites.driver.check(PRIMARY)
    assert primary_health.in_recovery is False and primary_health.replay_lag_seconds is None

    _grant(primary, 7)

    def replicated() -> bool:
        with psycopg.connect(standby.conninfo, autocommit=True) as conn:
            return conn.execute("SELECT epoch FROM placement_group").fetchall() == [(7,)]

    wait_for(replicated, timeout=30, what="the grant to replay on the standby")
    adopted = sites.new_driver()
    assert await adopted.ensure_standby_database(STANDBY, primary) == standby
    assert (await adopted.check(STANDBY)).restarted == ()


async def test_sites_stop_stops_every_process_of_every_site(sites: Sites) -> None:
    primary = await _serving(sites)
    await sites.driver.ensure_standby_database(STANDBY, primary)
    running = set(sites.pids(PRIMARY).values()) | set(sites.pids(STANDBY).values())
    assert len(running) == 5 and all(alive(pid) for pid in running)

    # `cellplane sites stop`, as docs/configuration.md tells a user to run it (stop_all_sites inside).
    result = subprocess.run([sys.executable, "-m", "cellplane_operator", "sites", "stop",
                             "--state-dir", str(sites.state_dir)],
                            capture_output=True, text=True, timeout=120, check=True)
    stopped = {int(pid) for pid in result.stdout.split(":", 1)[1].split()}

    assert result.stdout.startswith("stopped 5 process(es)")
    assert stopped == running
    assert not any(alive(pid) for pid in running)
    # Intent stays: a later operator's check brings the site back, on the same ports.
    health = await sites.new_driver().check(PRIMARY)
    assert health.database_up and health.serving
    assert set(health.restarted) == {"postgres", "api", "worker-0", "worker-1"}


async def test_two_sites_start_at_once_and_the_event_loop_stays_responsive(
    sites: Sites,
) -> None:
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.02)
            gaps.append(loop.time() - last)
            last = loop.time()

    ticking = asyncio.create_task(ticker())
    other = SiteKey("dedicated-b1", "region-a")
    first, second = await asyncio.gather(sites.driver.ensure_primary_database(PRIMARY),
                                         sites.driver.ensure_primary_database(other))
    done.set()
    await ticking

    assert first.port != second.port
    assert sites.pids(PRIMARY)["postgres"] != sites.pids(other)["postgres"]
    # initdb, start and migrations ran in threads: the loop never stalled.
    assert max(gaps) < 0.5, max(gaps)


async def test_an_api_that_cannot_start_is_reported_with_its_log(sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    _grant(database, 1)
    with pytest.raises(SiteError, match="16"):
        await sites.driver.start_serving(PRIMARY, ServingSpec(epoch=1, admin_token="short"))
    port = sites.state(PRIMARY).ports["api"]

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(SiteError) as raised:
            await sites.driver.start_serving(PRIMARY, _spec(1, workers=1))

    message = str(raised.value)
    assert "api of shared-a1@region-a exited" in message
    assert "address already in use" in message.lower()


async def test_a_recorded_pid_with_another_start_time_is_never_adopted_or_signalled(
    sites: Sites,
) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    _grant(database, 1)
    # A PID that a reboot (or a long uptime) gave to another program.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        layout = SiteLayout(sites.state_dir / PRIMARY.name)
        state = sites.state(PRIMARY)
        started = start_time(stranger.pid)
        assert started is not None
        state.processes["worker-0"] = ProcessRecord("worker-0", stranger.pid, started - 1, 1)
        state.save(layout)

        await sites.driver.start_serving(PRIMARY, _spec(1, workers=1))

        assert sites.pids(PRIMARY)["worker-0"] != stranger.pid
        stop_all_sites(sites.state_dir)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


async def test_stop_serving_keeps_the_database_and_destroy_removes_everything(sites: Sites) -> None:
    await _serving(sites, workers=1)
    pids = sites.pids(PRIMARY)

    await sites.driver.stop_serving(PRIMARY)

    assert set(sites.pids(PRIMARY)) == {"postgres"}
    assert not alive(pids["api"]) and not alive(pids["worker-0"]) and alive(pids["postgres"])
    health = await sites.driver.check(PRIMARY)
    assert health.database_up and not health.serving and health.restarted == ()
    assert health.epoch is None and health.endpoints is None

    await sites.driver.destroy(PRIMARY)

    assert not alive(pids["postgres"])
    assert not (sites.state_dir / PRIMARY.name).exists()
    health = await sites.driver.check(PRIMARY)
    assert not health.database_up and not health.serving and health.endpoints is None
