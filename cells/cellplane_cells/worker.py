"""Workers: claim jobs fairly, run their steps as signed HTTP calls, finish them once.

A job's steps run in order; each finished step's result is saved under the
claim, so a job reclaimed after its worker died resumes at its first unfinished
step, and every try of a step carries the same ``Idempotency-Key``. A claim is
kept alive by heartbeats; a worker that loses its claim (reaped, or the claim
epoch moved on) cancels its own work at once, and one that the database
refuses as stale or past its lease stops claiming altogether. A heartbeat that
cannot reach the database is tried again at the next beat and the work goes
on: after our own outage the reaper gives expired claims a lease of grace
(``domain/reaping.py``), and the first heartbeat that lands says whether the
claim is still this worker's. A job whose
tenant is frozen for a move (or moved out) is refused by the database per
tenant: the worker drops that job as if its claim were lost and keeps running.
The reaper's loop also purges moved-out tenants whose retention has passed.

Free slots go to priority classes as ``domain/priorities.py`` decides: each
class with work gets its floor of this worker's slots, idle slots go to the
highest class with work, and a borrowed slot is given back at the claim after
its job ends. One claim round asks which classes have claimable work, then
claims class by class until the decision has no slot left to fill.

Each step's call takes a slot on its target first (``target_limits.py``): the
target's AIMD limit, Retry-After hold and breaker are shared by every worker of
the cell. A job that may not call its target now goes back to the queue
without spending an attempt, and the call's answer moves the limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import psycopg
from psycopg_pool import ConnectionPool

from cellplane_cells import jobqueue, moves, target_limits
from cellplane_cells.reaper import Reaper
from cellplane_cells.db import ThreadedDatabase
from cellplane_cells.domain.aimd import AimdPolicy
from cellplane_cells.domain.breaker import BreakerPolicy
from cellplane_cells.domain.priorities import Floors, Priority, next_claim
from cellplane_cells.domain.reaping import Decision, ReaperMode, ReaperPolicy
from cellplane_cells.domain.retry import RetryPolicy, decide, retry_after_seconds
from cellplane_cells.domain.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from cellplane_cells.egress import EgressRefused
from cellplane_cells.errors import NotWritableError, TenantMovingError
from cellplane_cells.metrics import CLAIM_LAG, CLAIMS, REAPER_CLAIMS, STEP_CALLS, TARGET_DEFERRALS
from cellplane_cells.queries import query

__all__ = ["WorkerConfig", "Worker", "claim_round", "EPOCH_HEADER", "COST_HEADER"]

log = logging.getLogger(__name__)

EPOCH_HEADER = "X-Cellplane-Epoch"
COST_HEADER = "X-Cellplane-Cost"
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    """Recorded on every claim, for people reading the jobs table."""
    epoch: int
    """The placement-group epoch this worker acts under; sent to targets."""
    slots: int = 10
    """Jobs this worker runs at once."""
    batch: int = 4
    """Most jobs one claim statement takes (one per tenant)."""
    lease_seconds: float = 30.0
    """How long a claim lives without a heartbeat before the reaper takes it back."""
    heartbeat_seconds: float = 10.0
    """Heartbeat interval; well below the lease so one lost heartbeat is survivable."""
    poll_seconds: float = 0.5
    """Pause between claims when the queue had nothing for this worker."""
    call_timeout_seconds: float = 30.0
    """Timeout of one step's HTTP call."""
    reap_seconds: float = 5.0
    """Interval of the reaper (expired claims, expired jobs)."""
    reaper_mode: ReaperMode = ReaperMode.ADAPTIVE
    """Adaptive: grace after our own outage and pacing in a storm (``domain/reaping.py``);
    immediate: every expired claim at once (the old behaviour, for comparison)."""
    purge_seconds: float = 60.0
    """Interval of the sweep that purges moved-out tenants past their retention."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff of failed steps."""
    target_limits: AimdPolicy = field(default_factory=AimdPolicy)
    """How each target's concurrency limit moves with its answers (every worker of a cell
    must be given the same)."""
    target_breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    """When a target's circuit breaker opens, how long it cools down, how fast it ramps up."""
    floors: Floors | None = None
    """Slots reserved per priority class; None: ``Floors.default_for(slots)``."""

    def __post_init__(self) -> None:
        if self.floors is not None and self.floors.slots != self.slots:
            raise ValueError(f"the floors are for {self.floors.slots} slots, "
                             f"the worker has {self.slots}")

    @property
    def reaper_policy(self) -> ReaperPolicy:
        return ReaperPolicy(lease_seconds=self.lease_seconds, reap_seconds=self.reap_seconds,
                            mode=self.reaper_mode)

    @property
    def bulkheads(self) -> Floors:
        return self.floors if self.floors is not None else Floors.default_for(self.slots)


@dataclass
class _Running:
    job: jobqueue.ClaimedJob
    task: asyncio.Task[None] | None = None
    call_sent: bool = False
    cancel_requested: bool = False
    claim_lost: bool = False
    slot_decided: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the job's first call got a slot on its target, or did not."""
    turned_away: bool = False
    """The job went back to the queue without calling (its target held, open or full)."""


class Worker:
    def __init__(self, pool: ConnectionPool, http: httpx.AsyncClient, config: WorkerConfig, *,
                 rng: random.Random | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._config = config
        self._rng = rng or random.Random()
        self._wall_clock = wall_clock
        self._running: dict[Any, _Running] = {}
        self._last_claimed: list[_Running] = []
        self._db = ThreadedDatabase(pool, component=f"worker {config.worker_id}")
        self._reaper = Reaper(config.reaper_policy)
        # Set when a job ends: the claim loop's pause ends with it, so a freed
        # slot goes to the highest class with work now, not at the next poll.
        self._slot_freed = asyncio.Event()

    @property
    def fenced(self) -> NotWritableError | None:
        return self._db.fenced

    @property
    def busy(self) -> int:
        return len(self._running)

    async def claim_and_start(self) -> list[asyncio.Task[None]]:
        """Claims up to the free slots and starts each job; returns the started tasks."""
        free = self._config.slots - len(self._running)
        if free <= 0 or self.fenced is not None:
            return []
        by_class = Counter(r.job.priority for r in self._running.values())
        try:
            jobs = await self._db(claim_round, self._config, by_class)
        except NotWritableError:
            return []
        tasks = []
        self._last_claimed = []
        for job in jobs:
            CLAIMS.labels(job.tenant_id).inc()
            CLAIM_LAG.labels(job.priority.value).observe(max(job.waited_seconds, 0.0))
            running = _Running(job)
            self._running[job.job_id] = running
            self._last_claimed.append(running)
            running.task = asyncio.create_task(self._supervise(running))
            tasks.append(running.task)
        return tasks

    async def run_until_idle(self) -> int:
        """Claims and runs jobs until nothing is claimable and nothing runs; for tests."""
        finished = 0
        while True:
            tasks = await self.claim_and_start()
            pending = [r.task for r in self._running.values() if r.task is not None]
            if not pending:
                return finished
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finished += len(done)

    async def run(self, stop: asyncio.Event) -> None:
        reaper = asyncio.create_task(self._reap_forever(stop))
        try:
            while not stop.is_set() and self.fenced is None:
                self._slot_freed.clear()  # before the claim: a job ending during it counts
                try:
                    started = await self.claim_and_start()
                except psycopg.OperationalError as error:
                    log.warning("claim failed, retrying: %s", error)
                    started = []
                if not started:
                    await self._pause(stop)
                elif await self._only_turned_away(self._last_claimed):
                    # Every job of the claim went back unrun (their ends do not count as
                    # freed slots): claiming again at once would only claim more of them.
                    await self._pause(stop)
        finally:
            reaper.cancel()
            for running in list(self._running.values()):
                if running.task is not None:
                    running.task.cancel()
            await asyncio.gather(*(r.task for r in self._running.values() if r.task),
                                 return_exceptions=True)

    async def _only_turned_away(self, claimed: list[_Running]) -> bool:
        """Did every job of the last claim go back unrun because its target could not take it?

        Then the loop pauses as after an empty claim: a deep queue for one full or
        held target would otherwise be claimed and turned away as fast as it runs."""
        try:
            await asyncio.wait_for(asyncio.gather(*(r.slot_decided.wait() for r in claimed)),
                                   timeout=self._config.poll_seconds * 4)
        except asyncio.TimeoutError:
            return False
        return bool(claimed) and all(r.turned_away for r in claimed)

    async def _pause(self, stop: asyncio.Event) -> None:
        """Until the poll interval passes, a job ends (its slot is free) or stop is asked."""
        wakers = [asyncio.create_task(stop.wait()), asyncio.create_task(self._slot_freed.wait())]
        try:
            await asyncio.wait(wakers, timeout=self._config.poll_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waker in wakers:
                waker.cancel()

    async def _reap_forever(self, stop: asyncio.Event) -> None:
        purged_at: float | None = None
        while not stop.is_set():
            try:
                report = await self._db(self._reaper.run_pass)
                REAPER_CLAIMS.labels("reaped").inc(len(report.reaped))
                REAPER_CLAIMS.labels("graced").inc(report.graced)
                REAPER_CLAIMS.labels("paced").inc(report.paced)
                if report.graced:
                    log.warning("reaper: %d expired claims given %g s of grace instead of being "
                                "reaped: %s", report.graced, report.plan.grace_seconds,
                                report.plan.why)
                elif report.plan.decision is Decision.PACE:
                    log.warning("reaper: %d expired claims returned, the rest paced: %s",
                                len(report.reaped), report.plan.why)
                expired = await self._db(jobqueue.expire_queued)
                if report.reaped or expired:
                    log.info("reaper: %d expired claims returned, %d jobs expired",
                             len(report.reaped), expired)
                now = time.monotonic()
                if purged_at is None or now - purged_at >= self._config.purge_seconds:
                    purged_at = now
                    purged = await self._db(moves.purge_expired_moves)
                    if purged:
                        log.info("purged moved-out tenants past their retention: %s", purged)
            except NotWritableError:
                return
            except TenantMovingError as error:
                # A tenant froze between the batch's read and its write.
                log.info("reaper pass refused for a tenant being moved, retrying: %s", error)
            except psycopg.OperationalError as error:
                log.warning("reaper failed, retrying: %s", error)
            try:
                await asyncio.wait_for(stop.wait(), self._config.reap_seconds)
            except asyncio.TimeoutError:
                pass

    async def _supervise(self, running: _Running) -> None:
        """Runs a job beside its heartbeat; losing the claim cancels the work."""
        work = asyncio.create_task(self._execute(running))
        beat = asyncio.create_task(self._heartbeat(running, work))
        try:
            try:
                await work
            except asyncio.CancelledError:
                if running.cancel_requested and not running.claim_lost:
                    await self._db(jobqueue.finish_cancelled, running.job,
                                   call_sent=running.call_sent)
                elif not running.claim_lost:
                    raise
        except NotWritableError:
            pass
        except TenantMovingError as error:
            # The tenant is cutting over to another cell (or has): like a lost
            # claim. The move carries the job there, queued, from its last saved step.
            log.warning("job %s: its tenant is being moved, abandoning it: %s",
                        running.job.job_id, error)
            running.claim_lost = True
        except Exception:
            log.exception("job %s failed inside the worker", running.job.job_id)
        finally:
            running.slot_decided.set()
            beat.cancel()
            self._running.pop(running.job.job_id, None)
            if not running.turned_away:
                # A job turned away by its target frees no slot worth claiming for.
                self._slot_freed.set()

    async def _heartbeat(self, running: _Running, work: asyncio.Task[None]) -> None:
        while not work.done():
            await asyncio.sleep(self._config.heartbeat_seconds)
            try:
                answer = await self._db(jobqueue.heartbeat, running.job,
                                        lease_seconds=self._config.lease_seconds)
            except (NotWritableError, TenantMovingError):
                running.claim_lost = True
                work.cancel()
                return
            except psycopg.OperationalError as error:
                # The database is out of reach (a pool timeout is one too): the work
                # goes on and the next beat tries again. Whether the claim survived
                # the gap is for the database to say when a beat lands.
                log.warning("job %s: heartbeat failed, trying again: %s",
                            running.job.job_id, error)
                continue
            if answer is None:
                log.warning("job %s: claim lost, abandoning it", running.job.job_id)
                running.claim_lost = True
                work.cancel()
                return
            if answer:
                running.cancel_requested = True
                work.cancel()
                return

    async def _execute(self, running: _Running) -> None:
        job = running.job
        context = await self._db(_call_context, job.tenant_id, job.target)
        if context is None:
            await self._db(jobqueue.release, job, permanent=True, delay_seconds=0,
                           error=f"target {job.target!r} is not registered", error_code="target_unknown")
            return
        url, secret = context
        steps = await self._db(jobqueue.steps_of, job.job_id)
        previous: Any = None
        cost = 0
        for step in steps:
            if step.done:
                previous = step.result
                continue
            body = json.dumps({"job_id": str(job.job_id), "tenant": job.tenant_id, "step": step.step,
                               "steps": job.step_count, "payload": job.payload,
                               "previous": previous}, separators=(",", ":")).encode()
            timestamp = int(self._wall_clock())
            headers = {
                "Content-Type": "application/json",
                "Idempotency-Key": step.idempotency_key,
                EPOCH_HEADER: str(self._config.epoch),
                TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: sign(secret, body, timestamp=timestamp),
            }
            slot = await self._take_slot(job)
            running.turned_away = slot is None and not running.slot_decided.is_set()
            running.slot_decided.set()
            if slot is None:
                return      # deferred (not an attempt), or the claim is gone
            started = time.monotonic()
            try:
                running.call_sent = True
                response = await self._http.post(url, content=body, headers=headers,
                                                 timeout=self._config.call_timeout_seconds)
            except EgressRefused as refused:
                # The URL policy refused the target's address (a row that came by import
                # or a move, a tightened policy, a name that resolves elsewhere now):
                # nothing was sent, and asking again would be refused again.
                await self._give_back(job, slot, None)
                STEP_CALLS.labels("refused").observe(time.monotonic() - started)
                await self._db(jobqueue.release, job, permanent=True, delay_seconds=0,
                               error=f"step {step.step}: {refused}", error_code="target_refused")
                return
            except httpx.HTTPError as error:
                # A pool timeout is this client's own queue, not the target's answer.
                timed_out = isinstance(error, httpx.TimeoutException) \
                    and not isinstance(error, httpx.PoolTimeout)
                closed = await self._give_back(job, slot,
                                               target_limits.Answer(None, timed_out=timed_out))
                STEP_CALLS.labels("timeout" if timed_out else "error").observe(
                    time.monotonic() - started)
                await self._fail(job, None, f"step {step.step}: {type(error).__name__}: {error}",
                                 None, target_closed_seconds=closed)
                return
            status = response.status_code
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            closed = await self._give_back(job, slot, target_limits.Answer(
                status, retry_after_seconds=retry_after))
            STEP_CALLS.labels(str(status)).observe(time.monotonic() - started)
            if not 200 <= status < 300:
                await self._fail(job, status, f"step {step.step}: target answered {status}",
                                 retry_after, target_closed_seconds=closed)
                return
            result = _result_of(response)
            cost += _cost_of(response)
            if not await self._db(jobqueue.save_step, job, step=step.step, result=result):
                log.warning("job %s: claim lost before step %d was saved", job.job_id, step.step)
                running.claim_lost = True
                return
            previous = result
        await self._db(jobqueue.complete, job, cost=cost)

    async def _take_slot(self, job: jobqueue.ClaimedJob) -> target_limits.Slot | None:
        """A slot on the job's target; None when the job was deferred instead (or is gone)."""
        try:
            taken = await self._db(target_limits.take_slot, job,
                                   policy=self._config.target_limits,
                                   breaker_policy=self._config.target_breaker,
                                   busy_wait_scale=0.5 + self._rng.random())
        except target_limits.UnknownTarget as unknown:
            await self._db(jobqueue.release, job, permanent=True, delay_seconds=0,
                           error=str(unknown), error_code="target_unknown")
            return None
        if isinstance(taken, target_limits.Deferred):
            TARGET_DEFERRALS.labels(taken.reason.value).inc()
            log.debug("job %s deferred until %s: target %s %s", job.job_id, taken.until,
                      job.target, taken.reason.value)
            return None
        return taken

    async def _give_back(self, job: jobqueue.ClaimedJob, slot: target_limits.Slot,
                         answer: target_limits.Answer | None) -> float:
        """Frees the slot; returns how long the target stays closed to every job (0: not)."""
        return await self._db(target_limits.give_back, job, slot, answer,
                       policy=self._config.target_limits,
                       breaker_policy=self._config.target_breaker)

    async def _fail(self, job: jobqueue.ClaimedJob, status: int | None, error: str,
                    retry_after: float | None, *, target_closed_seconds: float = 0.0) -> None:
        outcome = decide(attempt=job.attempts, status_code=status, policy=self._config.retry,
                         rng=self._rng, retry_after_seconds=retry_after)
        # A retry before the target's hold or cool-down ends would only be deferred.
        delay = max(outcome.delay_seconds, target_closed_seconds)
        await self._db(jobqueue.release, job, permanent=outcome.permanent,
                       delay_seconds=delay, error=error,
                       error_code=outcome.error_code)


def claim_round(conn: psycopg.Connection[Any], config: WorkerConfig,
                running: Counter[Priority]) -> list[jobqueue.ClaimedJob]:
    """Fills the worker's free slots class by class, as ``next_claim`` decides.

    Every claim commits on its own, so the jobs of earlier claims are returned
    even when a later one is refused for a tenant being moved (the next round
    passes that tenant by)."""
    running = Counter(running)
    waiting = jobqueue.claimable_classes(conn)
    claimed: list[jobqueue.ClaimedJob] = []
    while (grant := next_claim(config.bulkheads, running, waiting)) is not None:
        try:
            jobs = jobqueue.claim(conn, worker=config.worker_id,
                                  batch=min(grant.count, config.batch),
                                  lease_seconds=config.lease_seconds, priority=grant.priority)
        except TenantMovingError:
            # A tenant of the batch froze between the claim's read and its write.
            break
        if not jobs:
            waiting.discard(grant.priority)
        running[grant.priority] += len(jobs)
        claimed.extend(jobs)
    return claimed


def _call_context(conn: psycopg.Connection[Any], tenant_id: str, target: str) -> tuple[str, str] | None:
    row = conn.execute(query("call_context"), {"tenant_id": tenant_id, "target": target}).fetchone()
    conn.commit()
    return (str(row[0]), str(row[1])) if row else None


def _cost_of(response: httpx.Response) -> int:
    try:
        return max(int(response.headers.get(COST_HEADER, "0")), 0)
    except ValueError:
        return 0


def _result_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"text": response.text[:10000]}
