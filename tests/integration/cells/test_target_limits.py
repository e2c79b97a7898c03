"""Targets protected: AIMD limits, Retry-After holds and deferrals, on real Postgres with
real HTTP targets on loopback. Orders and counts are asserted, never durations: when a
target is called, it asks the cell's database (the one clock of the cell) what holds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from starlette.responses import JSONResponse, Response

from cellapi import Cell
from cellfixtures import enqueue, fetch, setup_tenant, write
from cellplane_cells import jobqueue, target_limits
from cellplane_cells.db import open_pool
from cellplane_cells.domain.aimd import AimdPolicy
from cellplane_cells.domain.breaker import BreakerPolicy
from cellplane_cells.domain.retry import RetryPolicy
from cellplane_cells.worker import Worker, WorkerConfig
from cellplane_operator.localplane.process import wait_for
from httpservers import Call, RecordingServer

FAST = dict(lease_seconds=10.0, heartbeat_seconds=1.0, poll_seconds=0.02,
            retry=RetryPolicy(base_seconds=0.01, cap_seconds=0.05))
# Breakers that never open: these tests watch the AIMD limit alone.
NO_BREAKER = BreakerPolicy(failure_threshold=10_000)


async def run_until(conninfo: str, config: WorkerConfig, done: Callable[[], bool]) -> None:
    """Runs a worker until ``done`` holds (checked between its claims), then stops it."""
    stop = asyncio.Event()
    with open_pool(conninfo, epoch=1, max_size=6) as pool:
        async with httpx.AsyncClient() as http:
            worker = Worker(pool, http, config)
            task = asyncio.create_task(worker.run(stop))
            deadline = time.monotonic() + 60
            while not done():
                assert time.monotonic() < deadline, "the jobs did not finish within 60 s"
                assert not task.done(), "the worker stopped on its own"
                await asyncio.sleep(0.05)
            stop.set()
            await task


def all_finished(conninfo: str) -> Callable[[], bool]:
    def check() -> bool:
        [(open_jobs,)] = fetch(conninfo, "SELECT count(*) FROM jobs"
                                         " WHERE status IN ('queued', 'running')")
        return int(open_jobs) == 0
    return check


def ask_database(conninfo: str, sql: str) -> Any:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(sql.encode()).fetchone()
        return row[0] if row else None


async def test_a_429_with_retry_after_holds_every_job_for_the_target_without_spending_attempts(
        cell_db: str) -> None:
    # Hold-end as the cell's database sees it, asked at each call after the 429.
    seen_after_hold: list[bool] = []
    answered_429: list[str] = []

    async def respond(call: Call) -> Response:
        if not answered_429:
            answered_429.append(call.headers["idempotency-key"])
            return JSONResponse({"slow": "down"}, status_code=429, headers={"Retry-After": "2"})
        seen_after_hold.append(bool(ask_database(
            cell_db, "SELECT now() >= hold_until FROM target_limits")))
        return JSONResponse({"ok": True})

    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            jobs = enqueue(conn, "acme", 6)
        # Two attempts each: a deferral that spent one would leave a job one failure from
        # dead-letter; the job that got the 429 has its second attempt left for after.
        write(cell_db, "UPDATE jobs SET max_attempts = 2")
        # One call at a time, so the order of calls is the order of answers.
        config = WorkerConfig("w1", epoch=1, target_limits=AimdPolicy(
            initial=1.0, floor=1.0, ceiling=1.0, busy_wait_seconds=0.2),
            target_breaker=NO_BREAKER, **FAST)  # type: ignore[arg-type]
        # Sampled between the worker's steps: once the hold is recorded, no queued job of
        # the target may be claimable before it ends (the 429's own job included).
        early_after_hold: list[int] = []
        finished = all_finished(cell_db)

        def done() -> bool:
            early_after_hold.append(int(fetch(cell_db, """
                SELECT count(*) FROM jobs j, target_limits l
                 WHERE j.status = 'queued' AND j.run_after < l.hold_until""")[0][0]))
            return finished()

        await run_until(cell_db, config, done)
        calls = target.snapshot()

    # Every job ran once more after the 429, and each of those calls came after the hold.
    assert len(calls) == 7
    assert seen_after_hold == [True] * 6
    statuses = dict(fetch(cell_db, "SELECT job_id::text, status FROM jobs"))
    assert set(statuses.values()) == {"succeeded"}
    attempts = dict(fetch(cell_db, "SELECT job_id::text || '/1', attempts FROM jobs"))
    assert attempts == {key: 2 if key == answered_429[0] else 1 for key in attempts}
    assert len(attempts) == len(jobs)
    assert set(early_after_hold) == {0}


async def test_a_failing_target_falls_to_the_floor_and_recovers_by_additive_steps(
        cell_db: str) -> None:
    policy = AimdPolicy(initial=8.0, floor=1.0, ceiling=8.0, increase=1.0,
                        decrease_factor=0.5, busy_wait_seconds=0.02)
    limits_seen: list[float] = []          # the shared limit, when each call arrives
    answers: list[int] = []
    floor_calls = 0

    async def respond(call: Call) -> Response:
        nonlocal floor_calls
        limit = float(ask_database(cell_db, "SELECT concurrency_limit FROM target_limits"))
        limits_seen.append(limit)
        if limit <= policy.floor:
            floor_calls += 1
        # 503 until the limit has been at the floor for three calls: a capacity collapse.
        status = 503 if floor_calls < 3 else 200
        answers.append(status)
        return JSONResponse({"ok": status == 200}, status_code=status)

    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run", max_running_jobs=20)
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            enqueue(conn, "acme", 40)
        write(cell_db, "UPDATE jobs SET max_attempts = 100")
        config = WorkerConfig("w1", epoch=1, slots=10, target_limits=policy,
                              target_breaker=NO_BREAKER, **FAST)  # type: ignore[arg-type]
        await run_until(cell_db, config, all_finished(cell_db))

    assert limits_seen[0] == 8.0
    first_ok = answers.index(200)
    assert 503 not in answers[first_ok:]
    failing, recovering = limits_seen[:first_ok], limits_seen[first_ok:]
    assert min(failing) == 1.0
    # After the failures stop, the limit only grows, one whole slot at a time.
    whole = [int(limit) for limit in recovering]
    assert whole == sorted(whole)
    assert all(b - a <= 1 for a, b in zip(whole, whole[1:]))
    final = float(ask_database(cell_db, "SELECT concurrency_limit FROM target_limits"))
    assert final >= 4.0, (final, whole)
    assert fetch(cell_db, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == [(40,)]


def gate_at(count: int, *, patience: float) -> tuple[Callable[[Call], Awaitable[Response]],
                                                      list[int]]:
    """A target that holds each call until ``count`` are in flight together (or ``patience``
    seconds passed), then answers them; records how many were in flight at each arrival."""
    lock = threading.Lock()
    in_flight = 0
    arrivals: list[int] = []

    async def respond(call: Call) -> Response:
        nonlocal in_flight
        with lock:
            in_flight += 1
            arrivals.append(in_flight)
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            with lock:
                if in_flight >= count:
                    break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        with lock:
            in_flight -= 1
        return JSONResponse({"ok": True})

    return respond, arrivals


def test_two_worker_processes_share_one_limit(cell_db: str, tmp_path: Path) -> None:
    respond, arrivals = gate_at(3, patience=1.0)
    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run", max_running_jobs=20)
        # The target's own ceiling: 3 calls in flight, whatever each process's policy says.
        write(cell_db, "INSERT INTO target_limits (tenant_id, target, concurrency_limit,"
                       " max_concurrency) VALUES ('acme', 'default', 3, 3)")
        logs = [tmp_path / f"w{n}.log" for n in (1, 2)]
        workers = [subprocess.Popen(
            [sys.executable, "-m", "cellplane_operator", "cell", "work", "--database", cell_db,
             "--epoch", "1", "--worker-id", f"w{n}", "--slots", "6",
             "--allow-private-targets"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT) for n, log in zip((1, 2), logs)]
        try:
            for log in logs:
                wait_for(lambda log=log: " up: " in log.read_text(), timeout=60,
                         what=f"worker {log.stem} to start")
            with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
                enqueue(conn, "acme", 30)
            wait_for(all_finished(cell_db), timeout=120, what="the 30 jobs to finish")
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=20)

    assert len(arrivals) == 30
    assert max(arrivals) == 3, arrivals          # reached, and never passed
    assert fetch(cell_db, "SELECT count(*), max(attempts) FROM jobs WHERE status = 'succeeded'") \
        == [(30, 1)]
    assert {row[0] for row in fetch(cell_db, "SELECT claimed_by FROM jobs")} == {"w1", "w2"}
    assert fetch(cell_db, "SELECT count(*) FROM target_calls c JOIN jobs j USING (job_id)"
                          " WHERE j.status = 'running'") == [(0,)]


def test_a_reaped_job_frees_its_slot_and_a_deferral_gives_its_attempt_back(cell_db: str) -> None:
    policy = AimdPolicy(initial=1.0, floor=1.0, ceiling=1.0)
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/run")
    with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
        enqueue(conn, "acme", 2)
        first = jobqueue.claim(conn, worker="doomed", batch=1, lease_seconds=0.2)[0]
        slot = target_limits.take_slot(conn, first, policy=policy, breaker_policy=NO_BREAKER)
        assert isinstance(slot, target_limits.Slot)

        # The only slot is out: the second job is deferred, and its claim is not an attempt.
        second = jobqueue.claim(conn, worker="w2", batch=1, lease_seconds=30)[0]
        assert second.attempts == 1
        turned_away = target_limits.take_slot(conn, second, policy=policy,
                                              breaker_policy=NO_BREAKER)
        assert isinstance(turned_away, target_limits.Deferred)
        assert turned_away.reason.value == "limit" and turned_away.until is not None
        assert fetch(cell_db, "SELECT status, attempts, started_at FROM jobs WHERE job_id = %s",
                     second.job_id) == [("queued", 0, None)]
        assert fetch(cell_db, "SELECT running FROM tenants") == [(1,)]

        # The worker holding the slot dies; once its claim is reaped, the slot is free.
        wait_for(lambda: bool(jobqueue.reap(conn)), timeout=10, what="the lease to run out")
        write(cell_db, "UPDATE jobs SET run_after = now()")
        again = jobqueue.claim(conn, worker="w2", batch=1, lease_seconds=30)[0]
        assert isinstance(target_limits.take_slot(conn, again, policy=policy,
                                                  breaker_policy=NO_BREAKER),
                          target_limits.Slot)
    # The dead worker's row was swept when the slot was taken again.
    assert fetch(cell_db, "SELECT count(*) FROM target_calls") == [(1,)]


async def test_a_breaker_opened_by_one_worker_keeps_every_worker_off_the_target(
        cell_db: str) -> None:
    async def broken(call: Call) -> Response:
        return JSONResponse({"error": "boom"}, status_code=500)

    with RecordingServer(broken) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run", max_running_jobs=20)
        with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
            enqueue(conn, "acme", 10)
        # One call at a time (a limit of 1), so the calls before the breaker opens are exactly
        # its threshold; a cool-down far longer than the test.
        policy = AimdPolicy(initial=1.0, floor=1.0, ceiling=1.0, busy_wait_seconds=0.05)
        breaker = BreakerPolicy(failure_threshold=3, cool_down_seconds=600.0,
                                max_cool_down_seconds=600.0)

        def everyone_waits_for_the_cool_down() -> bool:
            [(breaker_state, waiting_too_little)] = fetch(cell_db, """
                SELECT l.breaker, (SELECT count(*) FROM jobs j
                                    WHERE j.status = 'running' OR j.run_after < l.open_until)
                  FROM target_limits l""") or [(None, 1)]
            return breaker_state == "open" and waiting_too_little == 0

        stop = asyncio.Event()
        with open_pool(cell_db, epoch=1, max_size=4) as pool_a, \
                open_pool(cell_db, epoch=1, max_size=4) as pool_b:
            async with httpx.AsyncClient() as http:
                workers = [Worker(pool, http, WorkerConfig(
                    name, epoch=1, target_limits=policy, target_breaker=breaker,
                    **FAST))  # type: ignore[arg-type]
                    for name, pool in (("a", pool_a), ("b", pool_b))]
                tasks = [asyncio.create_task(w.run(stop)) for w in workers]
                deadline = time.monotonic() + 60
                while not everyone_waits_for_the_cool_down():
                    assert time.monotonic() < deadline, "the breaker did not hold every job"
                    await asyncio.sleep(0.05)
                stop.set()
                await asyncio.gather(*tasks)
        calls = len(target.snapshot())

    assert calls == 3
    # The three calls were attempts; every other claim was a deferral, not one.
    assert fetch(cell_db, "SELECT sum(attempts)::int, count(*) FILTER (WHERE status = 'dead')"
                          " FROM jobs") == [(3, 0)]


def test_the_answer_that_sets_a_hold_holds_every_queued_job_of_the_target(cell_db: str) -> None:
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/run")
    with open_pool(cell_db, epoch=1) as pool, pool.connection() as conn:
        enqueue(conn, "acme", 3)
        calling = jobqueue.claim(conn, worker="w", batch=1, lease_seconds=30)[0]
        slot = target_limits.take_slot(conn, calling, policy=AimdPolicy(),
                                       breaker_policy=NO_BREAKER)
        assert isinstance(slot, target_limits.Slot)
        closed = target_limits.give_back(
            conn, calling, slot, target_limits.Answer(429, retry_after_seconds=30.0),
            policy=AimdPolicy(), breaker_policy=NO_BREAKER)
    assert 29.0 < closed <= 30.0
    # Both jobs that were only queued now wait for the hold, unclaimed; none spent anything.
    assert fetch(cell_db, """
        SELECT j.run_after = l.hold_until, j.attempts FROM jobs j, target_limits l
         WHERE j.status = 'queued'""") == [(True, 0), (True, 0)]


def test_the_admin_metrics_show_each_targets_limit_and_calls_in_flight(cell_db: str) -> None:
    cell = Cell(cell_db)
    try:
        auth = cell.tenant("acme")
        assert cell.submit(auth, "a").status_code == 202
        with cell.pool.connection() as conn:
            [job] = jobqueue.claim(conn, worker="w", batch=1, lease_seconds=30)
            slot = target_limits.take_slot(conn, job, policy=AimdPolicy(initial=6.0),
                                           breaker_policy=NO_BREAKER)
            assert isinstance(slot, target_limits.Slot)
        text = cell.admin.get("/metrics").text
    finally:
        cell.close()
    assert 'cellplane_cell_target_concurrency_limit{target="default",tenant="acme"} 6.0' in text
    assert 'cellplane_cell_target_calls_in_flight{target="default",tenant="acme"} 1.0' in text
    assert 'cellplane_cell_target_breaker_open{target="default",tenant="acme"} 0.0' in text
