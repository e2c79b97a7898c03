"""Workers on real Postgres calling real HTTP targets on loopback."""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from starlette.responses import JSONResponse, Response

from cellfixtures import enqueue, fetch, grant, setup_tenant, write
from cellplane_cells import jobqueue
from cellplane_cells.db import open_pool
from cellplane_cells.domain.signing import verify
from cellplane_cells.errors import LeaseExpiredError, StaleEpochError
from cellplane_cells.worker import Worker, WorkerConfig
from cellplane_operator.localplane.process import wait_for
from httpservers import Call, RecordingServer

FAST = dict(lease_seconds=2.0, heartbeat_seconds=0.3, poll_seconds=0.05)


def job_status(conninfo: str, job_id: object) -> str:
    return str(fetch(conninfo, "SELECT status FROM jobs WHERE job_id = %s", job_id)[0][0])


async def run_worker(conninfo: str, worker_id: str = "w1", epoch: int = 1) -> Worker:
    pool = open_pool(conninfo, epoch=epoch, max_size=4)
    try:
        async with httpx.AsyncClient() as http:
            worker = Worker(pool, http, WorkerConfig(worker_id, epoch=epoch, **FAST))  # type: ignore[arg-type]
            await worker.run_until_idle()
            return worker
    finally:
        pool.close()


async def test_steps_run_in_order_signed_with_stable_keys_and_epoch(cell_db: str) -> None:
    with RecordingServer() as target:
        secret = setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1, steps=3)

        await run_worker(cell_db)

        calls = target.snapshot()
        assert [c.json["step"] for c in calls] == [1, 2, 3]
        assert [c.headers["idempotency-key"] for c in calls] == [f"{job_id}/{n}" for n in (1, 2, 3)]
        assert {c.headers["x-cellplane-epoch"] for c in calls} == {"1"}
        for call in calls:
            assert verify(secret, call.body, timestamp=int(call.headers["x-cellplane-timestamp"]),
                          signature=call.headers["x-cellplane-signature"])
        # Each step sees the previous step's saved result.
        assert calls[1].json["previous"] == {"ok": True, "step": 1}
    assert job_status(cell_db, job_id) == "succeeded"
    assert fetch(cell_db, "SELECT count(*) FROM job_steps WHERE job_id = %s AND status = 'succeeded'",
                 job_id) == [(3,)]
    assert fetch(cell_db, "SELECT kind FROM outbox WHERE job_id = %s AND kind = 'job.succeeded'",
                 job_id) == [("job.succeeded",)]
    assert fetch(cell_db, "SELECT running FROM tenants WHERE tenant_id = 'acme'") == [(0,)]


async def test_killed_worker_is_reaped_and_the_job_resumes_at_its_saved_step(
    cell_db: str, tmp_path: Path
) -> None:
    release_step_two = threading.Event()

    async def respond(call: Call) -> Response:
        if call.json["step"] == 2 and not release_step_two.is_set():
            while not release_step_two.is_set():   # the first try of step 2 never answers
                await asyncio.sleep(0.05)
        return JSONResponse({"ok": True, "step": call.json["step"]})

    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1, steps=3)

        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen(
            [sys.executable, "-m", "cellplane_operator", "cell", "work", "--database", cell_db,
             "--epoch", "1", "--worker-id", "doomed", "--lease-seconds", "2",
             "--heartbeat-seconds", "0.5", "--slots", "2",
             # The target is on loopback: a development cell's worker.
             "--allow-private-targets"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: any(c.json["step"] == 2 for c in target.snapshot()), timeout=30,
                     what="the worker to call step 2", alive=lambda: None)
            worker.send_signal(signal.SIGKILL)          # killed mid-job, no cleanup
            worker.wait(timeout=10)
        finally:
            if worker.poll() is None:
                worker.kill()
            log.close()
        release_step_two.set()
        assert job_status(cell_db, job_id) == "running"

        # The reaper returns the claim once its lease has run out.
        with open_pool(cell_db, epoch=1) as pool:
            def reaped() -> bool:
                with pool.connection() as conn:
                    jobqueue.reap(conn)
                return job_status(cell_db, job_id) == "queued"
            wait_for(reaped, timeout=30, what="the reaper to return the dead worker's claim")

        await run_worker(cell_db, "rescuer")

        keys = [(c.json["step"], c.headers["idempotency-key"]) for c in target.snapshot()]
    # Step 1 ran once and was not repeated; step 2 was tried again under the same key.
    assert keys == [(1, f"{job_id}/1"), (2, f"{job_id}/2"), (2, f"{job_id}/2"), (3, f"{job_id}/3")]
    assert job_status(cell_db, job_id) == "succeeded"
    assert fetch(cell_db, "SELECT attempts, claimed_by FROM jobs WHERE job_id = %s", job_id) == \
        [(2, "rescuer")]
    assert fetch(cell_db, "SELECT running FROM tenants WHERE tenant_id = 'acme'") == [(0,)]


async def test_worker_with_an_old_epoch_has_every_write_rejected(cell_db: str) -> None:
    with RecordingServer() as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            enqueue(conn, "acme", 3, steps=2)
            [claimed] = jobqueue.claim(conn, worker="old", batch=1, lease_seconds=60)
            before = fetch(cell_db, "SELECT job_id, status, claim_epoch, attempts FROM jobs ORDER BY job_id")

            grant(cell_db, epoch=2, seconds=3600)      # a new owner took the placement group

            with pytest.raises(StaleEpochError):
                jobqueue.claim(conn, worker="old", batch=1, lease_seconds=60)
            with pytest.raises(StaleEpochError):
                jobqueue.heartbeat(conn, claimed, lease_seconds=60)
            with pytest.raises(StaleEpochError):
                jobqueue.save_step(conn, claimed, step=1, result={"late": True})
            with pytest.raises(StaleEpochError):
                jobqueue.complete(conn, claimed, cost=0)
            with pytest.raises(StaleEpochError):
                jobqueue.reap(conn)

        # A whole worker of the old epoch claims nothing and says it is fenced.
        worker = await run_worker(cell_db, "old-worker", epoch=1)
        assert isinstance(worker.fenced, StaleEpochError)
    assert fetch(cell_db, "SELECT job_id, status, claim_epoch, attempts FROM jobs ORDER BY job_id") == before
    assert fetch(cell_db, "SELECT count(*) FROM job_steps WHERE status = 'succeeded'") == [(0,)]
    assert target.snapshot() == []


async def test_writes_stop_at_the_lease_deadline_without_anyone_telling_the_cell(cell_db: str) -> None:
    with RecordingServer() as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            enqueue(conn, "acme", 1)
            grant(cell_db, epoch=1, seconds=0.5)       # the owner's last renewal
            wait_for(lambda: fetch(cell_db, "SELECT clock_timestamp() > lease_deadline"
                                            " FROM placement_group") == [(True,)],
                     timeout=10, what="the lease deadline to pass on the database's clock")
            with pytest.raises(LeaseExpiredError):
                jobqueue.claim(conn, worker="late", batch=1, lease_seconds=60)
    assert fetch(cell_db, "SELECT status FROM jobs") == [("queued",)]


async def test_a_reclaimed_job_refuses_the_paused_worker_that_held_it_before(cell_db: str) -> None:
    with RecordingServer() as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            enqueue(conn, "acme", 1, steps=1)
            [paused] = jobqueue.claim(conn, worker="paused", batch=1, lease_seconds=0.2)
            wait_for(lambda: bool(jobqueue.reap(conn)), timeout=10,
                     what="the paused worker's claim to expire and be reaped")
            [fresh] = jobqueue.claim(conn, worker="fresh", batch=1, lease_seconds=60)
            assert fresh.job_id == paused.job_id and fresh.claim_epoch > paused.claim_epoch

            # The paused worker wakes up and tries to finish: nothing it writes lands.
            assert jobqueue.heartbeat(conn, paused, lease_seconds=60) is None
            assert not jobqueue.save_step(conn, paused, step=1, result={"from": "paused"})
            assert not jobqueue.complete(conn, paused, cost=5)
            assert jobqueue.complete(conn, fresh, cost=5)
            assert not jobqueue.complete(conn, fresh, cost=5)
    assert fetch(cell_db, "SELECT status, claimed_by FROM jobs") == [("succeeded", "fresh")]
    assert fetch(cell_db, "SELECT count(*) FROM ledger WHERE kind = 'settle'") == [(1,)]
    assert fetch(cell_db, "SELECT running FROM tenants") == [(0,)]


async def test_permanent_errors_go_to_dead_letter_at_once_and_are_refunded(cell_db: str) -> None:
    async def refuse(call: Call) -> Response:
        return JSONResponse({"error": "bad payload"}, status_code=400)

    with RecordingServer(refuse) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run", credit=1000)
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1)
            conn.execute("UPDATE jobs SET estimate = 250")
            conn.execute("UPDATE wallets SET available = available - 250, reserved = 250")
            conn.commit()
        await run_worker(cell_db)
        assert len(target.snapshot()) == 1
    assert fetch(cell_db, "SELECT status, attempts, error_code FROM jobs") == [("dead", 1, "target_400")]
    assert fetch(cell_db, "SELECT kind, amount FROM ledger") == [("refund", 250)]
    assert fetch(cell_db, "SELECT available, reserved FROM wallets") == [(1000, 0)]
    assert fetch(cell_db, "SELECT kind FROM outbox WHERE kind = 'job.dead'") == [("job.dead",)]


async def test_transient_errors_retry_with_backoff_until_attempts_run_out(cell_db: str) -> None:
    async def unavailable(call: Call) -> Response:
        return JSONResponse({"error": "busy"}, status_code=503)

    with RecordingServer(unavailable) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1)
            conn.execute("UPDATE jobs SET max_attempts = 3")
            conn.commit()
        [(before,)] = fetch(cell_db, "SELECT clock_timestamp()")
        await run_worker(cell_db)
        [(after,)] = fetch(cell_db, "SELECT clock_timestamp()")
        # After the first failure the job is queued again behind its backoff: released
        # between the two readings, with a full-jitter delay of 0 to 1 s (base 1 s). Read
        # against the clock now, a delay drawn near 0 could be past already.
        [(status, attempts, run_after)] = fetch(
            cell_db, "SELECT status, attempts, run_after FROM jobs")
        assert (status, attempts) == ("queued", 1)
        assert before <= run_after <= after + datetime.timedelta(seconds=1.0)

        def drained() -> bool:
            asyncio.run(run_worker(cell_db))
            return job_status(cell_db, job_id) == "dead"

        await asyncio.to_thread(wait_for, drained, timeout=30, what="the job to use up its attempts")
        assert len(target.snapshot()) == 3
    assert fetch(cell_db, "SELECT attempts, error_code FROM jobs") == [(3, "target_503")]


async def test_cancel_while_running_is_recorded_honestly(cell_db: str) -> None:
    call_arrived = threading.Event()

    async def slow(call: Call) -> Response:
        call_arrived.set()
        await asyncio.sleep(30)
        return JSONResponse({"ok": True})

    with RecordingServer(slow) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            [job_id] = enqueue(conn, "acme", 1)
        running = asyncio.create_task(run_worker(cell_db))
        await asyncio.to_thread(call_arrived.wait, 30)
        write(cell_db, "UPDATE jobs SET cancel_requested = true")
        await asyncio.wait_for(running, 30)
    assert fetch(cell_db, "SELECT status, last_error FROM jobs") == [
        ("cancelled", "cancelled while running: a call to the target had already been sent")]
    assert fetch(cell_db, "SELECT running FROM tenants") == [(0,)]


async def test_queued_jobs_past_their_expiry_expire_and_are_refunded(cell_db: str) -> None:
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/run")
    with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
        [stale, fresh] = enqueue(conn, "acme", 2)
        conn.execute("UPDATE jobs SET expires_at = now() - interval '1 second' WHERE job_id = %s",
                     (stale,))
        conn.commit()
        assert jobqueue.expire_queued(conn) == 1
        claimed = jobqueue.claim(conn, worker="w", batch=2, lease_seconds=60)
    assert [job.job_id for job in claimed] == [fresh]
    assert job_status(cell_db, stale) == "expired"


async def test_counter_backstop_repairs_a_drifted_running_counter(cell_db: str) -> None:
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/run")
    with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
        enqueue(conn, "acme", 3)
        assert len(jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)) == 1
        write(cell_db, "UPDATE tenants SET running = 4")     # drift, e.g. from a manual fix
        assert jobqueue.fix_counters(conn) == {"acme": 1}
        assert jobqueue.fix_counters(conn) == {}
    assert fetch(cell_db, "SELECT running FROM tenants") == [(1,)]
