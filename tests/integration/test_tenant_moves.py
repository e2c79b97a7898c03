"""Tenant moves between cells, for real: an operator, two shared cells, the router and a
client submitting jobs through it all along.

What must hold: after a move every acknowledged job exists exactly once in the target
(by idempotency key), the money adds up, no step ran twice under different keys, and
the measured pause is within the budget; an abort leaves the source untouched; a
source worker paused across the cutover writes nothing after it; an operator killed in
any phase is replaced by one that finishes or undoes the move, never half of it; a
move that may not start starts nothing and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from starlette.responses import JSONResponse, Response

from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import TenantKey
from cellplane_operator.sites.state import SiteLayout, SiteState
from httpservers import Call, RecordingServer
from loadclient import Load
from regionplane import RegionPlane, cell, cell_database, condition, db_rows, ready, ready_cell, \
    records, secret_data, tenant
from scheduleclient import UTC, HoldingTarget, assert_one_key_per_occurrence, create_schedule, \
    minutely_and_paused, once_at, read, runs_of, schedules_api, succeeded

TERMINAL = ("Completed", "Aborted", "Failed")
FAILPOINT_EXIT = 86


@pytest.fixture(scope="module")
def router(plane: RegionPlane) -> Iterator[str]:
    process, url = plane.start_router(plane.kube.etcd.endpoints, hold_seconds=30)
    try:
        yield url
    finally:
        process.stop()


@pytest.fixture(scope="module")
def cells(plane: RegionPlane) -> tuple[str, str]:
    # Room for every tenant of the module in either cell (20 worker slots each).
    ready_cell(plane, "move-a", tenants=20, slots=400)
    ready_cell(plane, "move-b", tenants=20, slots=400)
    return "move-a", "move-b"


def _tenant(plane: RegionPlane, name: str, cell_name: str, target: RecordingServer,
            **quotas: int) -> tuple[str, str, str]:
    """A tenant pinned to a cell, with a generous rate; (namespace, tenant id, api key)."""
    namespace = plane.namespace(f"ns-{name}")
    plane.apply(tenant(name, namespace, plan="enterprise", cell=cell_name,
                       quotas={"jobsPerSecond": 200, "burst": 500, **quotas},
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    plane.await_status("tenant", name, ready, namespace=namespace, timeout=120)
    api_key = (secret_data(plane, namespace, f"{name}-api-key") or {})["api-key"]
    return namespace, api_key.removeprefix("cpk_").split(".")[0], api_key


def _move(plane: RegionPlane, name: str, namespace: str, tenant_name: str, to: str,
          **spec: Any) -> None:
    plane.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
                 "metadata": {"name": name, "namespace": namespace},
                 "spec": {"tenant": tenant_name, "targetCell": to, **spec}})


def _ended(plane: RegionPlane, name: str, namespace: str, timeout: float = 180) -> dict[str, Any]:
    return plane.await_status("tenantmove", name, lambda s: s.get("phase") in TERMINAL,
                              namespace=namespace, timeout=timeout, what=f"move {name} to end")


def _events(plane: RegionPlane, namespace: str, name: str) -> list[str]:
    printed = plane.kube.kubectl("get", "events", "-n", namespace, "--field-selector",
                                 f"involvedObject.name={name}", "-o",
                                 "jsonpath={range .items[*]}{.reason}{'\\n'}{end}")
    return [line for line in printed.stdout.splitlines() if line]


def _state(conninfo: str, tenant_id: str) -> tuple[str, int] | None:
    found = db_rows(conninfo, "SELECT state, epoch FROM tenants WHERE tenant_id = %s", tenant_id)
    return (str(found[0][0]), int(found[0][1])) if found else None


def _tenant_checksum(conninfo: str, tenant_id: str) -> list[tuple[Any, ...]]:
    """Every row of the tenant in one cell, as text: what "untouched" compares. Ordered by
    table: a UNION ALL may come back in any order (a parallel plan on a large tenant)."""
    return db_rows(conninfo, """
        SELECT * FROM (
        SELECT 'jobs', count(*), md5(coalesce(string_agg(j::text, ',' ORDER BY job_id), ''))
          FROM jobs j WHERE tenant_id = %s
        UNION ALL
        SELECT 'steps', count(*), md5(coalesce(string_agg(s::text, ',' ORDER BY s.job_id, s.step), ''))
          FROM job_steps s JOIN jobs j USING (job_id) WHERE j.tenant_id = %s
        UNION ALL
        SELECT 'ledger', count(*), md5(coalesce(string_agg(l::text, ',' ORDER BY entry_id), ''))
          FROM ledger l WHERE tenant_id = %s
        UNION ALL
        SELECT 'wallet', count(*), md5(coalesce(string_agg(w::text, ','), ''))
          FROM wallets w WHERE tenant_id = %s
        ) AS per_table ORDER BY 1
        """, tenant_id, tenant_id, tenant_id, tenant_id)


def _seed_queued(conninfo: str, tenant_id: str, count: int) -> None:
    """Jobs due in an hour (so none runs during the test), written as the cell's owner."""
    epoch = db_rows(conninfo, "SELECT epoch FROM placement_group")[0][0]
    with psycopg.connect(conninfo) as conn:
        conn.execute(f"SET cellplane.epoch = '{epoch}'")
        conn.execute("""
            WITH made AS (
                INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,
                                  max_attempts, estimate, run_after)
                SELECT gen_random_uuid(), %s, 'queued', 'default', 2, %s, 3, 0,
                       now() + interval '1 hour'
                  FROM generate_series(1, %s)
                RETURNING job_id)
            INSERT INTO job_steps (job_id, step, idempotency_key, status)
            SELECT job_id, n, job_id || '/' || n, 'pending' FROM made, generate_series(1, 2) n
            """, (tenant_id, Jsonb({"seeded": True}), count))
        conn.commit()


def _all_succeeded(conninfo: str, tenant_id: str, job_ids: set[str]) -> bool:
    done = {str(row[0]) for row in db_rows(
        conninfo, "SELECT job_id FROM jobs WHERE tenant_id = %s AND status = 'succeeded'",
        tenant_id)}
    return job_ids <= done


# -- the move under load ----------------------------------------------------------------


def test_a_move_under_load_loses_and_doubles_nothing(
        plane: RegionPlane, router: str, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, destination = cells
    namespace, tenant_id, api_key = _tenant(plane, "mover", source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    load = Load(router, api_key, f"mover-{uuid.uuid4().hex[:6]}").start()
    try:
        load.wait_for(60)
        epoch_before = records(plane)[TenantKey(namespace, "mover")].epoch
        # The platform team's path: the CLI creates the TenantMove and follows it.
        moved = subprocess.run(
            [sys.executable, "-m", "cellplane_operator", "move", "mover", "--to", destination,
             "-n", namespace, "--max-write-pause", "2", "--wait", "--timeout", "180",
             "--kubeconfig", str(plane.kube.kubeconfig)],
            capture_output=True, text=True, timeout=240)
        status = _ended(plane, "mover-to-move-b", namespace, timeout=10)
        load.wait_for(60, timeout=90)
    finally:
        load.finish()

    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == "mover-to-move-b"
    assert "Completed" in moved.stderr and "pause" in moved.stderr, moved.stderr
    assert status["phase"] == "Completed", status
    assert condition(status, "Completed")["status"] == "True"
    assert condition(status, "Accepted")["reason"] == "Admitted"
    pause = float(status["progress"]["pauseSeconds"])
    assert 0 < pause <= 2.0, status["progress"]
    record = records(plane)[TenantKey(namespace, "mover")]
    assert (record.cell, record.epoch, record.moving) == (destination, epoch_before + 1, False)
    # The source keeps the old rows, fenced; the target serves under the new epoch.
    assert _state(source_db, tenant_id) == ("moved", epoch_before + 1)
    assert _state(target_db, tenant_id) == ("active", epoch_before + 1)

    # Every acknowledged job exists exactly once, under its key, in the target.
    keys = dict(db_rows(target_db, "SELECT key, job_id::text FROM idempotency_keys "
                                   "WHERE tenant_id = %s", tenant_id))
    assert {k: keys.get(k) for k in load.acknowledged} == load.acknowledged
    acknowledged = set(load.acknowledged.values())
    assert len(acknowledged) == len(load.acknowledged)
    # Each ends: in the target, or in the source if it finished before it was copied.
    def finished() -> bool:
        in_target = {str(r[0]) for r in db_rows(
            target_db, "SELECT job_id FROM jobs WHERE tenant_id = %s AND status = 'succeeded'",
            tenant_id)}
        in_source = {str(r[0]) for r in db_rows(
            source_db, "SELECT job_id FROM jobs WHERE tenant_id = %s AND status = 'succeeded'",
            tenant_id)}
        return acknowledged <= in_target | in_source
    wait_for(finished, timeout=120, what="every acknowledged job to succeed")
    assert not db_rows(target_db, "SELECT job_id FROM jobs WHERE tenant_id = %s AND status <> "
                                  "'succeeded'", tenant_id)

    # Money: one reserve per job; one settle per succeeded job; nothing paid twice.
    for conninfo in (source_db, target_db):
        assert not db_rows(conninfo, "SELECT job_id, kind FROM ledger WHERE tenant_id = %s "
                                     "GROUP BY 1, 2 HAVING count(*) > 1", tenant_id)
    settled = {str(r[0]) for db in (source_db, target_db) for r in db_rows(
        db, "SELECT job_id FROM ledger WHERE tenant_id = %s AND kind = 'settle'", tenant_id)}
    assert settled == acknowledged
    wallet = db_rows(target_db, "SELECT reserved FROM wallets WHERE tenant_id = %s", tenant_id)
    assert wallet == [(0,)]

    # Steps: each key reached the target server under one job; a step in flight at the
    # freeze may be called again by the target cell, with the same key.
    calls = Counter(call.headers.get("idempotency-key") for call in target.snapshot()
                    if call.path == "/run")
    repeated = {key for key, count in calls.items() if count > 1}
    steps_of_acknowledged = {key for key in calls if key and key.split("/")[0] in acknowledged}
    assert steps_of_acknowledged, "the load's steps never reached the target server"
    assert len(repeated) <= 40, f"{len(repeated)} steps ran more than once: {sorted(repeated)[:5]}"

    described = plane.kube.kubectl("describe", "tenantmove", "mover-to-move-b", "-n", namespace)
    print(f"\n{moved.stderr}\n{described.stdout}")
    reasons = _events(plane, namespace, "mover-to-move-b")
    for reason in ("Started", "CatchingUp", "CuttingOver", "Completed"):
        assert reason in reasons, reasons


# -- abort ---------------------------------------------------------------------------------


def test_an_abort_during_the_copy_leaves_the_source_untouched(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, destination = cells
    namespace, tenant_id, _ = _tenant(plane, "stayer", source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    _seed_queued(source_db, tenant_id, 60_000)
    before = _tenant_checksum(source_db, tenant_id)
    record_before = records(plane)[TenantKey(namespace, "stayer")]

    _move(plane, "stayer-to-b", namespace, "stayer", destination)
    plane.await_status("tenantmove", "stayer-to-b",
                       lambda s: s.get("phase") == "Copying"
                       and int((s.get("progress") or {}).get("rowsCopied") or 0) > 0,
                       namespace=namespace, timeout=60, what="the copy to begin")
    plane.kube.kubectl("patch", "tenantmove", "stayer-to-b", "-n", namespace, "--type=merge",
                       "-p", '{"spec": {"abort": true}}')
    status = _ended(plane, "stayer-to-b", namespace)

    assert status["phase"] == "Aborted", status
    assert condition(status, "Completed")["reason"] == "Aborted"
    assert "Aborted" in _events(plane, namespace, "stayer-to-b")
    assert _state(target_db, tenant_id) is None
    assert not db_rows(target_db, "SELECT 1 FROM jobs WHERE tenant_id = %s", tenant_id)
    assert _state(source_db, tenant_id) == ("active", record_before.epoch)
    assert _tenant_checksum(source_db, tenant_id) == before
    assert db_rows(source_db, "SELECT capturing FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [(False,)]
    assert records(plane)[TenantKey(namespace, "stayer")] == record_before


def test_deleting_a_move_during_the_copy_aborts_it(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, destination = cells
    namespace, tenant_id, _ = _tenant(plane, "dropper", source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    _seed_queued(source_db, tenant_id, 60_000)
    before = _tenant_checksum(source_db, tenant_id)

    _move(plane, "dropper-to-b", namespace, "dropper", destination)
    plane.await_status("tenantmove", "dropper-to-b",
                       lambda s: s.get("phase") == "Copying"
                       and int((s.get("progress") or {}).get("rowsCopied") or 0) > 0,
                       namespace=namespace, timeout=60, what="the copy to begin")
    plane.kube.kubectl("delete", "tenantmove", "dropper-to-b", "-n", namespace, "--wait=false")
    # The finalizer holds the object until the abort is done.
    wait_for(lambda: plane.get("tenantmove", "dropper-to-b", namespace) is None, timeout=60,
             what="the TenantMove to go")

    assert _state(target_db, tenant_id) is None
    assert _state(source_db, tenant_id)[0] == "active"  # type: ignore[index]
    assert _tenant_checksum(source_db, tenant_id) == before
    assert db_rows(source_db, "SELECT capturing FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [(False,)]


# -- a stale source worker ---------------------------------------------------------------


def test_a_source_worker_paused_across_the_cutover_writes_nothing_after_it(
        plane: RegionPlane, cells: tuple[str, str]) -> None:
    plane.apply(cell("move-c", tenants=2, slots=4, driver={"allowPrivateTargets": True,
                                                 "workerProcesses": 1}))
    plane.await_status("cell", "move-c", lambda s: ready(s) and bool(s.get("endpoints")),
                       timeout=120)
    release = threading.Event()

    async def held(call: Call) -> Response:
        while not release.is_set():
            await asyncio.sleep(0.05)
        return JSONResponse({"ok": True})

    in_step = RecordingServer(respond=held).start()
    try:
        namespace, tenant_id, api_key = _tenant(plane, "sleeper", "move-c", in_step,
                                                maxRunningJobs=1)
        source_db, target_db = cell_database(plane, "move-c"), cell_database(plane, cells[1])
        answer = httpx.post(f"{_api(plane, 'move-c')}/v1/jobs",
                            json={"target": "default", "payload": {}},
                            headers={"Authorization": f"Bearer {api_key}",
                                     "Idempotency-Key": "held-1"}, timeout=10)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        wait_for(lambda: any(c.path == "/run" for c in in_step.snapshot()), timeout=30,
                 what="the worker to call the step")
        worker = _worker_pid(plane, "move-c")
        os.kill(worker, signal.SIGSTOP)
        try:
            _move(plane, "sleeper-to-b", namespace, "sleeper", cells[1])
            status = _ended(plane, "sleeper-to-b", namespace)
            assert status["phase"] == "Completed", status
            frozen = _tenant_checksum(source_db, tenant_id)
            # The target runs the job again from its last saved step, same step key.
            release.set()
            wait_for(lambda: _all_succeeded(target_db, tenant_id, {job_id}), timeout=60,
                     what="the target to finish the job")
        finally:
            os.kill(worker, signal.SIGCONT)
        # The woken worker's step result and finish are refused by the source database.
        refused = f"job {job_id}: its tenant is being moved, abandoning it"
        wait_for(lambda: refused in _worker_log(plane, "move-c"), timeout=30,
                 what="the woken worker to be refused by the source database")
        assert _tenant_checksum(source_db, tenant_id) == frozen
        assert db_rows(source_db, "SELECT status FROM jobs WHERE job_id = %s", job_id) == [
            ("running",)]
        keys = {c.headers.get("idempotency-key") for c in in_step.snapshot() if c.path == "/run"}
        assert keys == {f"{job_id}/1"}
    finally:
        release.set()
        in_step.stop()



def test_schedules_move_and_go_on_with_no_occurrence_lost_or_run_under_two_keys(
        plane: RegionPlane, router: str, cells: tuple[str, str]) -> None:
    """A minutely cron (RUN_ALL), a paused schedule and ONCE schedules, one of them in flight
    (its target holds the call) while the tenant moves: in the target cell every schedule is
    there in its state with its history, the cron goes on with every minute from its first
    run to its last run once, the source dispatches nothing after the cutover, and the run
    in flight is repeated under its one key."""
    source, destination = cells
    target = HoldingTarget()
    with target.server, contextlib.ExitStack() as release:
        release.callback(target.released.set)
        namespace, tenant_id, api_key = _tenant(plane, "ticker", source, target.server)
        source_db = cell_database(plane, source)
        with schedules_api(router, api_key) as api:
            cron, paused, paused_before = minutely_and_paused(api)
            wait_for(lambda: len(runs_of(api, cron)) >= 1
                     and all(run["status"] == "succeeded" for run in runs_of(api, cron).values()),
                     timeout=90, what="the cron's first run to succeed in the source")
            held_at = (datetime.datetime.now(UTC) + datetime.timedelta(seconds=3)).replace(
                microsecond=0)
            in_flight = create_schedule(api, once_at(held_at))
            target.held_schedule = in_flight
            assert target.held.wait(timeout=60), "the in-flight run never reached the target"
            _move(plane, "ticker-away", namespace, "ticker", destination)
            status = _ended(plane, "ticker-away", namespace)
            assert status["phase"] == "Completed", status
            moved_at = datetime.datetime.now(UTC)
            target.released.set()
            after = (moved_at + datetime.timedelta(minutes=1)).replace(second=0, microsecond=0)
            wait_for(lambda: succeeded(api, cron, after) and succeeded(api, in_flight, held_at),
                     timeout=150, what="the run in flight and the cron's next after the move "
                                       "to succeed in the target")
            states = {i: (read(api, f"/v1/schedules/{i}") or {}).get("state")
                      for i in (cron, paused, in_flight)}
            paused_after = read(api, f"/v1/schedules/{paused}")
            histories = {cron: runs_of(api, cron), in_flight: runs_of(api, in_flight)}

    assert states == {cron: "active", paused: "paused", in_flight: "completed"}
    assert paused_after is not None and paused_before is not None
    assert paused_after["next_run_at"] == paused_before["next_run_at"]
    times = sorted(histories[cron])
    assert times == [times[0] + datetime.timedelta(minutes=n) for n in range(len(times))], times
    assert times[-1] >= after
    # A run whose job finished in the source is listed without its outcome (the job stayed
    # there); every other one up to the awaited one succeeded in the target.
    assert all(run["status"] in ("succeeded", None)
               for at, run in histories[cron].items() if at <= after)
    # Every run the source dispatched is the target's, same job: none after the cutover.
    in_source = db_rows(source_db, "SELECT schedule_id::text, scheduled_for, job_id::text "
                                   "FROM schedule_runs WHERE tenant_id = %s", tenant_id)
    assert in_source
    for schedule_id, scheduled_for, job_id in in_source:
        assert str(histories[schedule_id][scheduled_for]["job_id"]) == job_id
    assert_one_key_per_occurrence(target, histories)
    held_key = histories[in_flight][held_at]["idempotency_key"]
    assert target.calls_of(held_key) >= 2

def _api(plane: RegionPlane, cell_name: str) -> str:
    found = plane.get("cell", cell_name) or {}
    return str(((found.get("status") or {}).get("endpoints") or {})["api"])


def _site(plane: RegionPlane, cell_name: str) -> SiteLayout:
    return SiteLayout(plane.state_dir("region-a") / f"{cell_name}@region-a")


def _worker_pid(plane: RegionPlane, cell_name: str) -> int:
    state = SiteState.load(_site(plane, cell_name))
    assert state is not None
    return state.processes["worker-0"].pid


def _worker_log(plane: RegionPlane, cell_name: str) -> str:
    path = _site(plane, cell_name).log("worker-0")
    return path.read_text(errors="replace") if path.exists() else ""


# -- the operator killed in each phase --------------------------------------------------


@pytest.mark.parametrize("failpoint", ["move-copying", "move-catching-up", "move-after-freeze",
                                       "move-verifying", "move-after-commit"])
def test_an_operator_killed_in_any_phase_is_succeeded_by_one_that_ends_the_move(
        plane: RegionPlane, router: str, target: RecordingServer, cells: tuple[str, str],
        failpoint: str) -> None:
    source, destination = cells
    name = f"k-{failpoint.removeprefix('move-')}"
    namespace, tenant_id, api_key = _tenant(plane, name, source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    load = Load(router, api_key, f"{name}-{uuid.uuid4().hex[:6]}").start()
    try:
        load.wait_for(20)
        plane.operators["region-a"].stop()
        dying = plane.start_operator("region-a", env={
            "CELLPLANE_FAILPOINTS": f"{failpoint}@{name}-move"}, log_suffix=f"-{name}")
        _move(plane, f"{name}-move", namespace, name, destination)
        wait_for(lambda: dying.returncode is not None, timeout=120, what=f"the failpoint {failpoint}")
        assert dying.returncode == FAILPOINT_EXIT
        plane.start_operator("region-a", log_suffix=f"-after-{name}")
        status = _ended(plane, f"{name}-move", namespace)
        load.wait_for(20, timeout=90)
    finally:
        load.finish()

    assert status["phase"] == "Completed", status
    record = records(plane)[TenantKey(namespace, name)]
    assert (record.cell, record.moving) == (destination, False)
    assert _state(target_db, tenant_id)[0] == "active"  # type: ignore[index]
    assert _state(source_db, tenant_id)[0] == "moved"  # type: ignore[index]
    keys = dict(db_rows(target_db, "SELECT key, job_id::text FROM idempotency_keys "
                                   "WHERE tenant_id = %s", tenant_id))
    assert {k: keys.get(k) for k in load.acknowledged} == load.acknowledged


# -- refusals --------------------------------------------------------------------------------


def test_a_move_that_may_not_start_starts_nothing_and_says_why(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, destination = cells
    plane.apply(cell("move-full", tenants=1))
    plane.apply(cell("move-dedicated", tier="dedicated", tenants=1))
    plane.await_status("cell", "move-full", lambda s: ready(s) and bool(s.get("endpoints")),
                       timeout=120)
    namespace, tenant_id, _ = _tenant(plane, "picky", source, target)
    _tenant(plane, "occupant", "move-full", target)
    record_before = records(plane)[TenantKey(namespace, "picky")]

    def refused(move_name: str, to: str, reason: str, phase: str) -> None:
        _move(plane, move_name, namespace, "picky", to)
        status = plane.await_status(
            "tenantmove", move_name,
            lambda s: condition(s, "Accepted").get("reason") == reason, namespace=namespace,
            timeout=60, what=f"move {move_name} refused with {reason}")
        assert status["phase"] == phase, status
        assert condition(status, "Accepted")["status"] == "False"
        assert reason in _events(plane, namespace, move_name)

    # Nothing can make these pass: the move ends.
    refused("picky-same", source, "TargetIsSource", "Failed")
    refused("picky-tier", "move-dedicated", "TargetWrongTier", "Failed")
    # These may pass later: the move waits, Pending, as a Pod waits to be scheduled.
    refused("picky-full", "move-full", "TargetFull", "Pending")
    plane.kube.kubectl("delete", "tenantmove", "picky-full", "-n", namespace)
    refused("picky-nowhere", "no-such-cell", "TargetNotFound", "Pending")
    # One move at a time: the waiting one came first.
    refused("picky-second", destination, "AlreadyMoving", "Failed")
    plane.kube.kubectl("delete", "tenantmove", "picky-nowhere", "-n", namespace)
    assert records(plane)[TenantKey(namespace, "picky")] == record_before

    # A tenant on its way out is not moved. Another controller's finalizer holds it
    # in deletion long enough to ask.
    plane.kube.kubectl("patch", "tenant", "picky", "-n", namespace, "--type=json", "-p",
                       '[{"op": "add", "path": "/metadata/finalizers/-", '
                       '"value": "example.com/hold"}]')
    plane.kube.kubectl("delete", "tenant", "picky", "-n", namespace, "--wait=false")
    refused("picky-leaving", destination, "TenantDeleting", "Failed")
    wait_for(lambda: ((plane.get("tenant", "picky", namespace) or {}).get("metadata") or {}).get(
        "finalizers") == ["example.com/hold"], timeout=60, what="the operator's removal")
    plane.kube.kubectl("patch", "tenant", "picky", "-n", namespace, "--type=json", "-p",
                       '[{"op": "remove", "path": "/metadata/finalizers/0"}]')
    assert _state(cell_database(plane, destination), tenant_id) is None


# -- dedicated cells -----------------------------------------------------------------------


def test_a_dedicated_tenant_moves_into_a_new_cell_of_its_own(plane: RegionPlane) -> None:
    namespace = plane.namespace("ns-solo")
    # No target: the operator's dedicated cells refuse loopback ones (no allowPrivateTargets).
    plane.apply(tenant("solo", namespace, plan="enterprise", isolation="dedicated",
                       quotas={"maxRunningJobs": 4}))
    plane.await_status("tenant", "solo", ready, namespace=namespace, timeout=180)
    first = records(plane)[TenantKey(namespace, "solo")].cell
    tenant_id = records(plane)[TenantKey(namespace, "solo")].tenant_id
    _seed_queued(cell_database(plane, first), tenant_id, 500)

    _move(plane, "solo-away", namespace, "solo", "solo-new", retainSourceForSeconds=0)
    status = _ended(plane, "solo-away", namespace, timeout=240)

    assert status["phase"] == "Completed", status
    assert records(plane)[TenantKey(namespace, "solo")].cell == "solo-new"
    made = plane.get("cell", "solo-new") or {}
    assert made["spec"]["tier"] == "dedicated"
    assert made["metadata"]["labels"]["cellplane.io/tenant"] == "solo"
    assert db_rows(cell_database(plane, "solo-new"), "SELECT count(*) FROM jobs "
                   "WHERE tenant_id = %s", tenant_id) == [(500,)]
    # Its old cell held nothing but the retained copy: gone once the retention passed.
    wait_for(lambda: plane.get("cell", first) is None, timeout=120,
             what=f"the old dedicated cell {first} to be deleted")
    assert "SourceCellDeleted" in _events(plane, namespace, "solo-away")
    plane.await_status("tenant", "solo", lambda s: ready(s) and s.get("cell") == "solo-new",
                       namespace=namespace, timeout=60)


# -- verification -----------------------------------------------------------------------------


def test_a_copy_that_does_not_verify_leaves_the_tenant_on_its_source(
        plane: RegionPlane, router: str, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, destination = cells
    namespace, tenant_id, api_key = _tenant(plane, "checked", source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    _seed_queued(source_db, tenant_id, 40_000)
    record_before = records(plane)[TenantKey(namespace, "checked")]
    load = Load(router, api_key, f"checked-{uuid.uuid4().hex[:6]}").start()
    try:
        load.wait_for(20)
        _move(plane, "checked-to-b", namespace, "checked", destination)

        def jobs_copied(status: dict[str, Any]) -> bool:
            # Tables are copied in order: steps under way means the jobs are across.
            tables = {t["table"]: t for t in (status.get("progress") or {}).get("tables") or []}
            return int((tables.get("steps") or {}).get("copied") or 0) > 0
        plane.await_status("tenantmove", "checked-to-b", jobs_copied, namespace=namespace,
                           timeout=120, what="the jobs copied")
        # A seeded job (never changed in the source, so never sent again) altered in the
        # target's copy: what a bug in the copy would leave behind.
        epoch = db_rows(target_db, "SELECT epoch FROM placement_group")[0][0]
        with psycopg.connect(target_db) as conn:
            conn.execute(f"SET cellplane.epoch = '{epoch}'")
            conn.execute("SELECT set_config('cellplane.tenant_admin', 'on', true)")
            altered = conn.execute(
                "UPDATE jobs SET payload = '{\"tampered\": true}' WHERE job_id = (SELECT job_id"
                " FROM jobs WHERE tenant_id = %s AND payload ? 'seeded' LIMIT 1)",
                (tenant_id,)).rowcount
            conn.commit()
        assert altered == 1
        status = _ended(plane, "checked-to-b", namespace)
        load.wait_for(20, timeout=90)
    finally:
        load.finish()

    assert status["phase"] == "Failed", status
    failed = condition(status, "Completed")
    assert failed["reason"] == "VerificationFailed", failed
    assert "jobs" in failed["message"], failed
    assert "VerificationFailed" in _events(plane, namespace, "checked-to-b")
    # The tenant never left: same record, active under its old epoch, the copy gone.
    assert records(plane)[TenantKey(namespace, "checked")] == record_before
    assert _state(source_db, tenant_id) == ("active", record_before.epoch)
    assert _state(target_db, tenant_id) is None
    keys = dict(db_rows(source_db, "SELECT key, job_id::text FROM idempotency_keys "
                                   "WHERE tenant_id = %s", tenant_id))
    assert {k: keys.get(k) for k in load.acknowledged} == load.acknowledged


# -- the pause budget -----------------------------------------------------------------------


def test_a_budget_that_cannot_hold_the_pause_says_so_and_a_raised_one_moves_the_tenant(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    """0.1 s, the smallest budget the CRD allows, is under the pause's fixed part alone:
    the move must wait and say why (it used to catch up for ever, saying only how many
    changes were left), and move once the budget is raised."""
    source, destination = cells
    namespace, tenant_id, _ = _tenant(plane, "tight", source, target)
    _seed_queued(cell_database(plane, source), tenant_id, 2_000)
    _move(plane, "tight-to-b", namespace, "tight", destination, maxWritePauseSeconds=0.1)

    waiting = plane.await_status(
        "tenantmove", "tight-to-b",
        lambda s: condition(s, "Progressing").get("reason") == "PauseOverBudget",
        namespace=namespace, timeout=120, what="the move to say its budget is too small")
    assert waiting["phase"] == "CatchingUp", waiting
    message = condition(waiting, "Progressing")["message"]
    assert "over half the 0.1s write-pause budget" in message, message
    assert "spec.maxWritePauseSeconds" in message
    assert "PauseOverBudget" in _events(plane, namespace, "tight-to-b")
    assert records(plane)[TenantKey(namespace, "tight")].cell == source

    plane.kube.kubectl("patch", "tenantmove", "tight-to-b", "-n", namespace, "--type=merge",
                       "-p", '{"spec": {"maxWritePauseSeconds": 10}}')
    status = _ended(plane, "tight-to-b", namespace)
    assert status["phase"] == "Completed", status
    assert records(plane)[TenantKey(namespace, "tight")].cell == destination
    assert db_rows(cell_database(plane, destination), "SELECT count(*) FROM jobs "
                   "WHERE tenant_id = %s AND payload ? 'seeded'", tenant_id) == [(2_000,)]


# -- moves that cannot proceed end (issue #18, item 7) ---------------------------------------


@contextlib.contextmanager
def _operator_with(plane: RegionPlane, name: str, env: dict[str, str]) -> Iterator[None]:
    """region-a's operator restarted with ``env`` for the block, then a plain one again."""
    plane.operators["region-a"].stop()
    special = plane.start_operator("region-a", env=env, log_suffix=f"-{name}")
    try:
        yield
    finally:
        special.stop()
        plane.start_operator("region-a", log_suffix=f"-after-{name}")


def test_an_abort_ends_a_pending_move_and_the_tenant_moves_again(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    """A move waiting to be admitted used to ignore spec.abort and hold its tenant for
    good: every later move was refused as AlreadyMoving."""
    source, destination = cells
    namespace, _, _ = _tenant(plane, "waiter", source, target)
    _move(plane, "waiter-nowhere", namespace, "waiter", "no-such-cell")
    plane.await_status("tenantmove", "waiter-nowhere",
                       lambda s: condition(s, "Accepted").get("reason") == "TargetNotFound",
                       namespace=namespace, timeout=60, what="the move to wait for its cell")
    plane.kube.kubectl("patch", "tenantmove", "waiter-nowhere", "-n", namespace, "--type=merge",
                       "-p", '{"spec": {"abort": true}}')
    status = _ended(plane, "waiter-nowhere", namespace, timeout=60)
    assert status["phase"] == "Aborted", status
    assert condition(status, "Completed")["reason"] == "Aborted"
    assert "Aborted" in _events(plane, namespace, "waiter-nowhere")

    _move(plane, "waiter-to-b", namespace, "waiter", destination)
    status = _ended(plane, "waiter-to-b", namespace)
    assert status["phase"] == "Completed", status
    assert records(plane)[TenantKey(namespace, "waiter")].cell == destination


def test_a_move_that_cannot_start_fails_at_its_progress_deadline_with_its_reason(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    source, _ = cells
    namespace, _, _ = _tenant(plane, "stuck", source, target)
    record_before = records(plane)[TenantKey(namespace, "stuck")]
    with _operator_with(plane, "deadline", {"CELLPLANE_MOVE_PROGRESS_DEADLINE_SECONDS": "20"}):
        _move(plane, "stuck-nowhere", namespace, "stuck", "no-such-cell")
        waiting = plane.await_status(
            "tenantmove", "stuck-nowhere",
            lambda s: condition(s, "Accepted").get("reason") == "TargetNotFound",
            namespace=namespace, timeout=60, what="the move to wait for its cell")
        assert waiting["phase"] == "Pending", waiting
        status = _ended(plane, "stuck-nowhere", namespace, timeout=120)
    assert status["phase"] == "Failed", status
    for name in ("Accepted", "Completed"):
        assert condition(status, name)["reason"] == "TargetNotFound", status
    assert "20s" in condition(status, "Completed")["message"], status
    reasons = _events(plane, namespace, "stuck-nowhere")
    assert reasons.count("TargetNotFound") >= 2, reasons  # waiting, then failing
    assert records(plane)[TenantKey(namespace, "stuck")] == record_before


# -- the write pause is bounded (issue #18, item 13) -----------------------------------------


def test_a_cutover_that_cannot_finish_within_its_budget_gives_the_writes_back(
        plane: RegionPlane, router: str, target: RecordingServer, cells: tuple[str, str]) -> None:
    """The last delta's copy made slower than the whole budget (as a loaded machine
    would): each cutover gives the writes back within the budget, the source serves
    again under its epoch, and after a few tries the move fails with its reason."""
    source, destination = cells
    namespace, tenant_id, api_key = _tenant(plane, "slowpoke", source, target)
    source_db, target_db = cell_database(plane, source), cell_database(plane, destination)
    record_before = records(plane)[TenantKey(namespace, "slowpoke")]
    budget = 1.5
    with _operator_with(plane, "slow-delta",
                        {"CELLPLANE_FAILPOINTS": "move-slow-delta@slowpoke-to-b=3"}):
        load = Load(router, api_key, f"slowpoke-{uuid.uuid4().hex[:6]}").start()
        try:
            load.wait_for(10)
            _move(plane, "slowpoke-to-b", namespace, "slowpoke", destination,
                  maxWritePauseSeconds=budget)
            status = _ended(plane, "slowpoke-to-b", namespace, timeout=240)
            # The tenant serves from its source: new writes are acknowledged.
            load.wait_for(10, timeout=90)
        finally:
            load.finish()

    assert status["phase"] == "Failed", status
    failed = condition(status, "Completed")
    assert failed["reason"] == "PauseBudgetExceeded", failed
    printed = plane.kube.kubectl("get", "events", "-n", namespace, "--field-selector",
                                 "involvedObject.name=slowpoke-to-b", "-o",
                                 "jsonpath={range .items[*]}{.reason}{'\\t'}{.message}{'\\n'}{end}")
    pauses = [float(m.group(1)) for m in re.finditer(r"writes were paused ([0-9.]+)s",
                                                      printed.stdout)]
    overruns = [line for line in printed.stdout.splitlines()
                if line.startswith(("CutoverOverBudget", "PauseBudgetExceeded"))]
    assert len(overruns) == 5, printed.stdout
    assert pauses and max(pauses) <= budget, pauses
    assert float(status["progress"]["pauseSeconds"]) <= budget, status["progress"]
    # The tenant never left: same record, active under its old epoch, the copy gone.
    assert records(plane)[TenantKey(namespace, "slowpoke")] == record_before
    assert _state(source_db, tenant_id) == ("active", record_before.epoch)
    assert _state(target_db, tenant_id) is None
    assert db_rows(source_db, "SELECT capturing FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [(False,)]
    keys = dict(db_rows(source_db, "SELECT key, job_id::text FROM idempotency_keys "
                                   "WHERE tenant_id = %s", tenant_id))
    assert {k: keys.get(k) for k in load.acknowledged} == load.acknowledged


def test_a_target_cell_deleted_mid_move_fails_the_move_and_releases_the_source(
        plane: RegionPlane, target: RecordingServer, cells: tuple[str, str]) -> None:
    """A sibling of a move that cannot proceed: its target went away. It used to wait for
    the cell to serve again, for ever, holding the tenant."""
    source, _ = cells
    plane.apply(cell("move-gone", tenants=4, slots=80))
    plane.await_status("cell", "move-gone", lambda s: ready(s) and bool(s.get("endpoints")),
                       timeout=300)
    namespace, tenant_id, _ = _tenant(plane, "orphan", source, target)
    source_db = cell_database(plane, source)
    _seed_queued(source_db, tenant_id, 60_000)
    before = _tenant_checksum(source_db, tenant_id)
    record_before = records(plane)[TenantKey(namespace, "orphan")]

    _move(plane, "orphan-to-gone", namespace, "orphan", "move-gone")
    plane.await_status("tenantmove", "orphan-to-gone",
                       lambda s: s.get("phase") == "Copying"
                       and int((s.get("progress") or {}).get("rowsCopied") or 0) > 0,
                       namespace=namespace, timeout=60, what="the copy to begin")
    plane.kube.kubectl("delete", "cell", "move-gone", "--wait=false")
    status = _ended(plane, "orphan-to-gone", namespace, timeout=120)

    assert status["phase"] == "Failed", status
    assert condition(status, "Completed")["reason"] == "TargetCellGone", status
    assert records(plane)[TenantKey(namespace, "orphan")] == record_before
    assert _state(source_db, tenant_id) == ("active", record_before.epoch)
    assert _tenant_checksum(source_db, tenant_id) == before
    assert db_rows(source_db, "SELECT capturing FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [(False,)]
