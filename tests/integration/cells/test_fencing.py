"""The cell database as the last fence: stale owners' writes never land, whatever their state."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from starlette.responses import JSONResponse, Response

from cellfixtures import enqueue, fetch, grant, setup_tenant
from cellplane_cells.db import open_pool
from cellplane_operator.localplane import ManagedProcess
from cellplane_operator.localplane.process import wait_for
from httpservers import Call, RecordingServer


def _session(conninfo: str, epoch: int = 1) -> psycopg.Connection:
    conn = psycopg.connect(conninfo, autocommit=True)
    conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(epoch),))
    return conn


def _deadline_passed(conninfo: str) -> bool:
    return fetch(conninfo, "SELECT clock_timestamp() >= lease_deadline FROM placement_group") == [(True,)]


def test_after_the_deadline_every_session_is_refused_even_one_opened_before(cell_db: str) -> None:
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/")
    early, straddling = _session(cell_db), _session(cell_db)
    job = uuid.uuid4()
    grant(cell_db, epoch=1, seconds=1.0)             # the last renewal the owner made
    straddling.execute("BEGIN")
    straddling.execute("UPDATE tenants SET burst = 7")            # before the deadline: allowed
    wait_for(lambda: _deadline_passed(cell_db), timeout=10, what="the deadline to pass")

    with pytest.raises(psycopg.errors.DatabaseError, match="lease expired"):
        early.execute("UPDATE tenants SET burst = 8")
    late = _session(cell_db)
    with pytest.raises(psycopg.errors.DatabaseError, match="lease expired"):
        late.execute("INSERT INTO ledger (tenant_id, job_id, kind, amount) VALUES ('acme', %s, 'settle', 1)",
                     (job,))
    # The transaction that wrote in time cannot make its write durable now.
    with pytest.raises(psycopg.errors.DatabaseError, match="lease expired at commit"):
        straddling.execute("COMMIT")
    assert fetch(cell_db, "SELECT burst FROM tenants") != [(7,)]
    assert fetch(cell_db, "SELECT count(*) FROM ledger") == [(0,)]
    for conn in (early, straddling, late):
        conn.close()


def test_paused_worker_resumed_after_a_takeover_writes_nothing(cell_db: str, tmp_path: Path) -> None:
    release_old = threading.Event()

    async def respond(call: Call) -> Response:
        epoch = call.headers["x-cellplane-epoch"]
        if epoch == "1":
            while not release_old.is_set():      # the old owner's call hangs until after the takeover
                await asyncio.sleep(0.05)
        return JSONResponse({"served_epoch": epoch, "step": call.json["step"]})

    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1, steps=2)

        def worker(epoch: int, name: str) -> ManagedProcess:
            process = ManagedProcess(name, [
                sys.executable, "-m", "cellplane_operator", "cell", "work", "--database", cell_db,
                "--epoch", str(epoch), "--worker-id", name, "--lease-seconds", "2",
                "--heartbeat-seconds", "0.5", "--reap-seconds", "0.5",
                "--allow-private-targets"],  # the target is on loopback
                log=tmp_path / f"{name}.log")
            process.start()
            return process

        old = worker(1, "old-owner")
        new: ManagedProcess | None = None
        try:
            wait_for(lambda: bool(target.snapshot()), timeout=30, what="the old owner's first call")
            old.pause()                                    # SIGSTOP while holding the job
            grant(cell_db, epoch=2, seconds=3600)          # a new owner took the group
            new = worker(2, "new-owner")
            wait_for(lambda: fetch(cell_db, "SELECT status FROM jobs") == [("succeeded",)],
                     timeout=60, what="the new owner to finish the job")
            release_old.set()
            old.resume()                                   # wakes up, believes it still owns
            wait_for(lambda: "fenced" in (tmp_path / "old-owner.log").read_text(), timeout=30,
                     what="the old owner to be refused and fence itself")
        finally:
            old.stop()
            if new is not None:
                new.stop()
        calls = target.snapshot()
    assert fetch(cell_db, "SELECT status, claimed_by, attempts FROM jobs") == [("succeeded", "new-owner", 2)]
    assert fetch(cell_db, "SELECT step, result->>'served_epoch' FROM job_steps ORDER BY step") == [
        (1, "2"), (2, "2")]
    assert fetch(cell_db, "SELECT count(*) FROM ledger WHERE kind = 'settle'") == [(1,)]
    assert [c.headers["x-cellplane-epoch"] for c in calls].count("1") == 1
    assert "stale epoch" in (tmp_path / "old-owner.log").read_text()
