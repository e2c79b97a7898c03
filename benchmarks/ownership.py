"""Placement-group ownership on a real 3-member etcd: takeover latency, etcd load per
group, and how many groups one region's process can hold.

    .venv/bin/python benchmarks/ownership.py [--rounds 5] [--groups 10] [--defaults]
        [--rate-groups 20] [--rate-seconds 20] [--sizes 100,250,500,1000] [--hold-seconds 25]

1. Takeover: an owner *process* (this script, ``--serve-owner``) holds ``--groups``
   placement groups, one ``LeaseHolder`` and one ``CellDatabaseGrant`` per group,
   each group with its own migrated cell database that starts at epoch 0.
   Candidates (``LeaseHolder`` in this process) watch. The owner is SIGKILLed; per
   group the latency runs from the kill to the candidate's first write that the
   cell database *accepted* (an INSERT into ``tenants`` on a session that
   declares the new epoch, after the candidate's own grant). The floor is what
   etcd says is left of the owner's lease right after the kill (TimeToLive, whole
   seconds rounded down) plus the margin; the refined floor takes the lease's end
   from the owner's last acknowledged keep-alive instead (its send time + TTL,
   which etcd cannot be earlier than). No takeover may come in below either.
2. etcd operations per second per group, owner and candidate, at the product's
   lease settings (10 s / 2 s / 2 s), counted by a subclass of ``EtcdStore``.
3. Capacity: N ``LeaseHolder`` with the product's settings and a no-op actor in
   one process (``--serve-holders``) against the 3-member etcd, for
   ``--hold-seconds`` once all are acquired, for N in ``--sizes``; stops at the
   first N that did not hold (a self-fence, a lost group, a group never acquired,
   or a keep-alive p99 above a quarter of the margin).

One file, longer than a module should be, on purpose: the owner and the many
holders are this script run again as their own processes (``--serve-owner``,
``--serve-holders``), so the helpers and the measurements share their types.

A benchmark, not a test: it prints markdown tables to stdout and progress to
stderr, judges only the stated criteria, and stops every process it started.
CPU of everything else on the machine is printed as "other cores": on a shared
2-core machine, numbers measured with other cores well above 0.1 are pessimistic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import psycopg
from psycopg import sql

from cellplane_cells.migrate import migrate
from cellplane_operator.clock import SystemClock
from cellplane_operator.domain.ownership import LeaseSettings, OwnerRecord, Role
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess, PostgresInstance
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.sites.celldb import PostgresCellDatabases
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.store import Compare, Delete, EtcdStore, Put, VersionedValue, WatchEvent
from procstat import machine_busy_seconds, process_cpu_seconds, tree_cpu_seconds

T = TypeVar("T")

REGIONS = ("region-a", "region-b", "region-c")
OWNER_REGION = "region-a"
CANDIDATE_REGION = "region-b"
TAKEOVER_PREFIX = "/bench/takeover/groups/"
RATES_PREFIX = "/bench/rates/groups/"
PRODUCT = LeaseSettings()
SHORT = LeaseSettings(duration_seconds=3, renew_interval_seconds=0.5, margin_seconds=1.0)
SCRIPT = Path(__file__).resolve()

# --- SQL the benchmark runs itself (the grant is CellDatabaseGrant's own) ---------

# What the cell's connection pool does on every connection: declare the epoch.
DECLARE_EPOCH = "SELECT set_config('cellplane.epoch', %s, false)"
# A real write into tenant data, guarded like every other: the statement trigger
# and the commit trigger refuse it unless the declared epoch is the placement
# group's and the deadline has not passed. One new tenant row per write.
MARKER_WRITE = ("INSERT INTO tenants (tenant_id, plan, max_running_jobs, jobs_per_second, burst,"
                " signing_secret) VALUES (%s, 'free', 1, 1, 1, 'ownership-benchmark')")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(event: str, **fields: object) -> None:
    """One JSON line on stdout: how a helper process reports to the benchmark."""
    sys.stdout.write(json.dumps({"event": event, "monotonic": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def events_in(log: Path, kind: str | None = None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"event"'):
            event = json.loads(line)
            if kind is None or event["event"] == kind:
                found.append(event)
    return found


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def renew_periods(sent: Sequence[tuple[int, float]]) -> list[float]:
    """Time between consecutive keep-alives of the same lease."""
    by_lease: dict[int, list[float]] = {}
    for lease, at in sent:
        by_lease.setdefault(lease, []).append(at)
    return [b - a for times in by_lease.values() for a, b in zip(sorted(times), sorted(times)[1:])]


def peak_to_mean(times: Sequence[float], *, bucket: float = 0.1) -> float:
    """The busiest ``bucket``-long slice's count over the mean slice's: 1 is perfectly even."""
    if not times:
        return math.nan
    first = min(times)
    counts = Counter(int((t - first) / bucket) for t in times)
    slices = int((max(times) - first) / bucket) + 1
    return max(counts.values()) / (len(times) / slices)


def store_timeouts(settings: LeaseSettings, etcd_timeout: float) -> tuple[float, float]:
    """(timeout, attempt_timeout) as ``cellplane ownership hold`` derives them."""
    timeout = min(etcd_timeout, settings.renew_interval_seconds)
    return timeout, timeout / 2


# --- an EtcdStore that counts ----------------------------------------------------------

KeepAliveHook = Callable[[int, float, float, int], None]


class CountingStore(EtcdStore):
    """``EtcdStore`` that counts its calls by kind, their errors, and their durations.

    Durations are taken on the monotonic clock around the whole call, so they
    include the time the call waited for this process's event loop: that is the
    latency a holder's renewal sees.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float, attempt_timeout: float,
                 on_keep_alive: KeepAliveHook | None = None) -> None:
        super().__init__(endpoints, timeout=timeout, attempt_timeout=attempt_timeout)
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.seconds: dict[str, list[float]] = {}
        self.keep_alives_sent: list[tuple[int, float]] = []
        """(lease id, monotonic send time) of every keep-alive."""
        self._on_keep_alive = on_keep_alive

    def reset(self) -> None:
        self.calls.clear()
        self.errors.clear()
        self.seconds = {}
        self.keep_alives_sent = []

    async def _counted(self, kind: str, call: Awaitable[T]) -> T:
        self.calls[kind] += 1
        started = time.monotonic()
        try:
            return await call
        except Exception:
            self.errors[kind] += 1
            raise
        finally:
            self.seconds.setdefault(kind, []).append(time.monotonic() - started)

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        return await self._counted("read", super().read(*keys))

    async def keep_alive(self, lease_id: int) -> int:
        sent = time.monotonic()
        self.keep_alives_sent.append((lease_id, sent))
        ttl = await self._counted("keep-alive", super().keep_alive(lease_id))
        if self._on_keep_alive is not None:
            self._on_keep_alive(lease_id, sent, time.monotonic(), ttl)
        return ttl

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        return await self._counted("lease grant", super().grant_lease(ttl_seconds))

    async def revoke_lease(self, lease_id: int) -> None:
        await self._counted("lease revoke", super().revoke_lease(lease_id))

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        return await self._counted("transaction", super().transaction(compares, success, what=what))

    async def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                           ) -> AsyncIterator[WatchEvent]:
        self.calls["watch"] += 1
        async for event in super().watch_prefix(prefix, start_revision=start_revision):
            self.calls["watch event"] += 1
            yield event




@dataclass(frozen=True)
class CpuSample:
    at: float
    busy: float
    ours: float
    """Everything this benchmark started: itself, etcd, Postgres, its helpers."""
    named: dict[str, float]

    @classmethod
    def take(cls, named: dict[str, list[int]] | None = None) -> CpuSample:
        return cls(time.monotonic(), machine_busy_seconds(), tree_cpu_seconds(os.getpid()),
                   {name: sum(process_cpu_seconds(p) for p in pids)
                    for name, pids in (named or {}).items()})


@dataclass(frozen=True)
class Cores:
    ours: float
    other: float
    named: dict[str, float]

    @classmethod
    def between(cls, start: CpuSample, end: CpuSample) -> Cores:
        elapsed = max(end.at - start.at, 1e-9)
        ours = end.ours - start.ours
        return cls(ours / elapsed, max(0.0, end.busy - start.busy - ours) / elapsed,
                   {k: (end.named[k] - start.named.get(k, 0.0)) / elapsed for k in end.named})


# --- helper process 1: the owner of the takeover measurement -----------------------------

@dataclass(frozen=True)
class OwnerSpec:
    endpoints: list[str]
    prefix: str
    region: str
    databases: dict[str, str]
    """Cell name -> conninfo of its cell database."""
    lease: float
    renew: float
    margin: float
    etcd_timeout: float


class ReportingGrant:
    """The owner's actor: the product's ``CellDatabaseGrant``, each transition printed."""

    def __init__(self, cell: str, conninfo: str) -> None:
        self._cell = cell
        self._grant = CellDatabaseGrant(PostgresCellDatabases(), conninfo)

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant.start_acting(epoch, remaining_seconds)
        emit("acting", cell=self._cell, epoch=epoch)

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant.renew_grant(epoch, remaining_seconds)
        emit("renewed", cell=self._cell, epoch=epoch)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        emit("stopped", cell=self._cell, epoch=epoch, reason=reason)
        await self._grant.stop_acting(epoch, reason)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve_owner(spec: OwnerSpec) -> None:
    """Holds every group of the spec until SIGTERM (then releases) or SIGKILL."""
    settings = LeaseSettings(spec.lease, spec.renew, spec.margin).validated()
    timeout, attempt = store_timeouts(settings, spec.etcd_timeout)
    store = CountingStore(spec.endpoints, timeout=timeout, attempt_timeout=attempt,
                          on_keep_alive=lambda lease, sent, replied, ttl: emit(
                              "keepalive", lease=lease, sent=sent, replied=replied, ttl=ttl))
    table = OwnershipTable(store, prefix=spec.prefix)
    holders = [LeaseHolder(table, HolderIdentity(cell, spec.region, f"{spec.region}-1"),
                           ReportingGrant(cell, conninfo), settings=settings, clock=SystemClock())
               for cell, conninfo in spec.databases.items()]
    stop = asyncio.Event()
    _stop_on_signals(stop)
    try:
        await asyncio.gather(*(holder.run(stop) for holder in holders))
        await asyncio.gather(*(holder.release() for holder in holders), return_exceptions=True)
    finally:
        await store.close()


# --- helper process 2: many holders in one region -----------------------------------------

@dataclass(frozen=True)
class HoldersSpec:
    endpoints: list[str]
    prefix: str
    region: str
    count: int
    hold_seconds: float
    acquire_timeout: float
    etcd_timeout: float


class HoldActor:
    """A no-op ``GroupActor`` that remembers what happened to its group."""

    def __init__(self) -> None:
        self.acting = False
        self.last_renewal: float | None = None
        self.max_gap = 0.0
        self.renewals = 0
        self.stops: list[str] = []

    def reset_window(self) -> None:
        self.max_gap, self.renewals, self.stops = 0.0, 0, []

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        self.acting, self.last_renewal = True, time.monotonic()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        now = time.monotonic()
        if self.last_renewal is not None:
            self.max_gap = max(self.max_gap, now - self.last_renewal)
        self.last_renewal = now
        self.renewals += 1

    async def stop_acting(self, epoch: int, reason: str) -> None:
        # A self-fence is the end of the longest gap: count it before a
        # re-acquisition starts the clock again.
        if self.last_renewal is not None:
            self.max_gap = max(self.max_gap, time.monotonic() - self.last_renewal)
        self.acting, self.last_renewal = False, None
        self.stops.append(reason)


class LoopLag:
    """How late this process's event loop wakes a 50 ms sleeper: its backlog."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.05)
            self.samples.append(time.monotonic() - before - 0.05)


async def serve_holders(spec: HoldersSpec) -> None:
    """Acquires ``count`` groups, holds them ``hold_seconds``, prints one summary line."""
    settings = PRODUCT
    timeout, attempt = store_timeouts(settings, spec.etcd_timeout)
    store = CountingStore(spec.endpoints, timeout=timeout, attempt_timeout=attempt)
    table = OwnershipTable(store, prefix=spec.prefix)
    actors = [HoldActor() for _ in range(spec.count)]
    holders = [LeaseHolder(table, HolderIdentity(f"g{i:05d}", spec.region, f"{spec.region}-1"),
                           actor, settings=settings, clock=SystemClock())
               for i, actor in enumerate(actors)]
    stop, interrupted = asyncio.Event(), asyncio.Event()
    _stop_on_signals(interrupted)
    lag = LoopLag()
    lag_task = asyncio.create_task(lag.run())
    started = time.monotonic()
    tasks = [asyncio.create_task(holder.run(stop)) for holder in holders]
    summary: dict[str, object] = {"count": spec.count}
    try:
        deadline = started + spec.acquire_timeout
        while (not all(a.acting for a in actors) and time.monotonic() < deadline
               and not interrupted.is_set()):
            await asyncio.sleep(0.05)
        summary["acquired"] = sum(a.acting for a in actors)
        summary["acquire_seconds"] = time.monotonic() - started
        if summary["acquired"] == spec.count and not interrupted.is_set():
            store.reset()
            lag.samples.clear()
            for actor in actors:
                actor.reset_window()
            emit("window-start")
            window_started = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), spec.hold_seconds)
            end = time.monotonic()
            emit("window-end")
            stops = [reason for a in actors for reason in a.stops]
            gaps = [max(a.max_gap, end - a.last_renewal if a.last_renewal else 0.0)
                    for a in actors]
            summary.update(
                window_seconds=end - window_started,
                keep_alive=store.seconds.get("keep-alive", []),
                read=store.seconds.get("read", []),
                calls=dict(store.calls), errors=dict(store.errors),
                self_fences=sum(r.startswith("self-fenced") for r in stops),
                lost=sum(not r.startswith("self-fenced") for r in stops),
                renewals=sum(a.renewals for a in actors),
                max_gap=max(gaps), gap_p99=quantile(gaps, 0.99),
                lag=lag.samples,
                renew_period=quantile(renew_periods(store.keep_alives_sent), 0.5),
                renew_period_max=max(renew_periods(store.keep_alives_sent), default=math.nan),
                peak_to_mean=peak_to_mean([at for _, at in store.keep_alives_sent]))
    finally:
        stop.set()
        lag_task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Released, so that etcd does not expire a thousand leases during the next size.
        released = time.monotonic()
        await asyncio.gather(*(h.release() for h in holders), return_exceptions=True)
        summary["release_seconds"] = time.monotonic() - released
        await store.close()
        emit("summary", **summary)


# --- part 1: takeover latency --------------------------------------------------------------

@dataclass(frozen=True)
class TakeoverConfig:
    settings: LeaseSettings
    rounds: int
    groups: int
    etcd_timeout: float
    seed: int


@dataclass(frozen=True)
class Takeover:
    latency: float
    """Kill -> the candidate's first write the cell database accepted."""
    etcd_left: float
    """etcd's TTL right after the kill (whole seconds, rounded down), plus the time
    from the kill to the request: a lower bound of the lease left at the kill."""
    refined_left: float
    """The larger lower bound: also from the owner's last acknowledged keep-alive."""
    deleted: float | None
    """Kill -> the owner key's deletion, seen by a separate watch."""
    acting: float
    """Kill -> the candidate acquired (its start_acting began)."""
    granted: float
    """Kill -> the candidate's database grant returned."""
    refused: int
    """Writes the database refused before the first accepted one."""
    stale_refused_with: str | None
    """SQLSTATE of a write under the old epoch after the takeover (None: accepted!)."""
    epoch_step: int


@dataclass
class TakeoverResult:
    config: TakeoverConfig
    takeovers: list[Takeover] = field(default_factory=list)
    missing: int = 0
    candidate_errors: Counter[str] = field(default_factory=Counter)
    cores: Cores | None = None


class FirstWriteActor:
    """The candidate's actor: grants the database like the product, then writes under
    the new epoch until the database accepts one write, and records when."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._grant = CellDatabaseGrant(PostgresCellDatabases(), conninfo)
        self.epoch: int | None = None
        self.acting_at: float | None = None
        self.granted_at: float | None = None
        self.accepted_at: float | None = None
        self.refused = 0

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        self.epoch, self.acting_at = epoch, time.monotonic()
        await self._grant.start_acting(epoch, remaining_seconds)
        self.granted_at = time.monotonic()
        await self._first_write(epoch, until=self.acting_at + remaining_seconds)

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant.renew_grant(epoch, remaining_seconds)
        if self.granted_at is None:
            self.granted_at = time.monotonic()
        await self._first_write(epoch, until=time.monotonic() + remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        await self._grant.stop_acting(epoch, reason)

    async def _first_write(self, epoch: int, *, until: float) -> None:
        while self.accepted_at is None and time.monotonic() < until:
            try:
                await write_marker(self._conninfo, epoch, f"takeover-{epoch}")
                self.accepted_at = time.monotonic()
            except psycopg.Error:
                self.refused += 1
                await asyncio.sleep(0.01)


async def write_marker(conninfo: str, epoch: int, tenant: str) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(DECLARE_EPOCH, (str(epoch),))
        await conn.execute(MARKER_WRITE, (tenant,))


async def stale_write_refusal(conninfo: str, epoch: int, tenant: str) -> str | None:
    """The SQLSTATE the database refused a write under ``epoch`` with; None if accepted."""
    try:
        await write_marker(conninfo, epoch, tenant)
    except psycopg.Error as error:
        return error.sqlstate or type(error).__name__
    return None


def create_cell_databases(pg: PostgresInstance, count: int) -> dict[str, str]:
    """Migrated cell databases; each placement group starts at epoch 0, no deadline."""
    databases: dict[str, str] = {}
    for i in range(count):
        dbname = f"takeover_{i:02d}"
        pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)).as_string())
        cell = f"cell-{i:02d}"
        migrate(pg.dsn_for(dbname), cell=cell)
        databases[cell] = pg.dsn_for(dbname)
    return databases


async def until(condition: Callable[[], bool], *, timeout: float, what: str,
                alive: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if alive is not None:
            alive()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.02)


class DeletionWatch:
    """Timestamps every deletion of an owner key under the prefix, from its own client."""

    def __init__(self, endpoints: list[str], prefix: str) -> None:
        self._store = EtcdStore(endpoints, timeout=2)
        self._prefix = prefix
        self.deletions: list[tuple[float, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        start = await self._store.put(f"{self._prefix}.watch-start", b"")

        async def run() -> None:
            async for event in self._store.watch_prefix(self._prefix, start_revision=start + 1):
                if event.kind == "delete" and event.key.endswith("/owner"):
                    self.deletions.append((time.monotonic(), event.key))
        self._task = asyncio.create_task(run())

    def first_after(self, key: str, after: float) -> float | None:
        return next((at for at, k in self.deletions if k == key and at >= after), None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._store.close()


async def takeover_round(index: int, plane: LocalControlPlane, databases: dict[str, str],
                         config: TakeoverConfig, table: OwnershipTable, watch: DeletionWatch,
                         lease_client: Any, rng: random.Random) -> tuple[list[Takeover], int]:
    settings = config.settings
    spec = OwnerSpec(endpoints=plane.etcd.endpoints, prefix=TAKEOVER_PREFIX, region=OWNER_REGION,
                     databases=databases, lease=settings.duration_seconds,
                     renew=settings.renew_interval_seconds, margin=settings.margin_seconds,
                     etcd_timeout=config.etcd_timeout)
    log = plane.run_dir / "logs" / f"owner-{index}.log"
    owner = ManagedProcess(f"owner-{index}", [sys.executable, str(SCRIPT), "--serve-owner",
                                              json.dumps(asdict(spec))], log=log)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    candidates: dict[str, LeaseHolder] = {}
    try:
        owner.start()
        await until(lambda: {e["cell"] for e in events_in(log, "acting")} >= set(databases),
                    timeout=60, what=f"owner-{index} to act for every group", alive=owner.check_alive)
        owner_epochs = {e["cell"]: int(e["epoch"]) for e in events_in(log, "acting")}
        actors = {cell: FirstWriteActor(conninfo) for cell, conninfo in databases.items()}
        candidates = {cell: LeaseHolder(
            table, HolderIdentity(cell, CANDIDATE_REGION, f"{CANDIDATE_REGION}-1"), actors[cell],
            settings=settings, clock=SystemClock()) for cell in databases}
        tasks = [asyncio.create_task(holder.run(stop)) for holder in candidates.values()]
        await until(lambda: all(h.state.role is Role.OBSERVING
                                and h.state.epoch_seen == owner_epochs[c]
                                for c, h in candidates.items()),
                    timeout=30, what="the candidates to see the owner")
        # Kill at a random phase of the owner's renewals.
        await asyncio.sleep(settings.renew_interval_seconds * (1 + rng.random()))
        records: dict[str, OwnerRecord] = {}
        for cell in databases:
            record, _ = await table.read(cell)
            if record is None or record.region != OWNER_REGION:
                raise RuntimeError(f"{cell}: the owner process does not hold it ({record})")
            records[cell] = record

        killed_at = time.monotonic()
        owner.kill()
        asked_at = time.monotonic()
        infos = await asyncio.gather(*(lease_client.get_lease_info(r.lease_id, keys=False)
                                       for r in records.values()))
        ttls = {cell: int(info.TTL) for cell, info in zip(records, infos)}

        with contextlib.suppress(TimeoutError):
            await until(lambda: all(a.accepted_at is not None for a in actors.values()),
                        timeout=settings.duration_seconds + settings.margin_seconds + 20,
                        what="every candidate's first accepted write")
        keepalives: dict[int, dict[str, Any]] = {}
        for event in events_in(log, "keepalive"):
            if event["ttl"] > 0 and event["sent"] <= killed_at:
                last = keepalives.get(event["lease"])
                if last is None or event["sent"] > last["sent"]:
                    keepalives[event["lease"]] = event
        found: list[Takeover] = []
        missing = 0
        for cell, actor in actors.items():
            if actor.accepted_at is None or actor.acting_at is None or actor.epoch is None:
                missing += 1
                continue
            etcd_left = ttls[cell] + (asked_at - killed_at) if ttls[cell] >= 0 else 0.0
            last = keepalives.get(records[cell].lease_id)
            from_renewal = last["sent"] + last["ttl"] - killed_at if last else 0.0
            deleted = watch.first_after(table.owner_key(cell), killed_at)
            stale = await stale_write_refusal(databases[cell], owner_epochs[cell],
                                              f"stale-{owner_epochs[cell]}-{index}")
            found.append(Takeover(
                latency=actor.accepted_at - killed_at, etcd_left=etcd_left,
                refined_left=max(etcd_left, from_renewal),
                deleted=None if deleted is None else deleted - killed_at,
                acting=actor.acting_at - killed_at,
                granted=(actor.granted_at or actor.accepted_at) - killed_at,
                refused=actor.refused, stale_refused_with=stale,
                epoch_step=actor.epoch - owner_epochs[cell]))
        return found, missing
    finally:
        owner.kill()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A planned handover, so the next round's owner need not wait out a lease.
        await asyncio.gather(*(h.release() for h in candidates.values()), return_exceptions=True)


async def measure_takeovers(plane: LocalControlPlane, pg: PostgresInstance,
                            config: TakeoverConfig) -> TakeoverResult:
    progress(f"creating {config.groups} cell databases")
    databases = create_cell_databases(pg, config.groups)
    result = TakeoverResult(config)
    timeout, attempt = store_timeouts(config.settings, config.etcd_timeout)
    store = CountingStore(plane.etcd.endpoints, timeout=timeout, attempt_timeout=attempt)
    table = OwnershipTable(store, prefix=TAKEOVER_PREFIX)
    watch = DeletionWatch(plane.etcd.endpoints, TAKEOVER_PREFIX)
    host, _, port = plane.etcd.endpoints[0].rpartition(":")
    lease_client = aetcd.Client(host=host, port=int(port), timeout=2)
    rng = random.Random(config.seed)
    try:
        await watch.start()
        start = CpuSample.take()
        for index in range(config.rounds):
            progress(f"takeover round {index + 1}/{config.rounds}: owner process with "
                     f"{config.groups} groups, SIGKILL, candidates take over")
            found, missing = await takeover_round(index, plane, databases, config, table, watch,
                                                  lease_client, rng)
            result.takeovers += found
            result.missing += missing
        result.cores = Cores.between(start, CpuSample.take())
        result.candidate_errors = Counter(store.errors)
    finally:
        await watch.close()
        await store.close()
        await lease_client.close()
    return result


# --- part 2: etcd operations per group ------------------------------------------------------

@dataclass(frozen=True)
class RatesResult:
    groups: int
    seconds: float
    owner: Counter[str]
    candidate: Counter[str]
    owner_grants: int
    """Database grants the owner's actor was asked for (CellDatabaseGrant: one
    Postgres connection and one statement each)."""
    renew_periods: list[float]
    """Time between an owner's consecutive keep-alives of one lease."""
    errors: Counter[str]
    cores: Cores


class CountingActor:
    def __init__(self) -> None:
        self.acting = False
        self.grants = 0

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        self.acting = True
        self.grants += 1

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        self.grants += 1

    async def stop_acting(self, epoch: int, reason: str) -> None:
        self.acting = False


async def measure_rates(plane: LocalControlPlane, groups: int, seconds: float,
                        etcd_timeout: float) -> RatesResult:
    settings = PRODUCT
    timeout, attempt = store_timeouts(settings, etcd_timeout)
    stores = [CountingStore(plane.etcd.endpoints, timeout=timeout, attempt_timeout=attempt)
              for _ in range(2)]
    tables = [OwnershipTable(store, prefix=RATES_PREFIX) for store in stores]
    cells = [f"rates-{i:03d}" for i in range(groups)]
    owner_actors = [CountingActor() for _ in cells]
    owners = [LeaseHolder(tables[0], HolderIdentity(cell, OWNER_REGION, f"{OWNER_REGION}-1"), actor,
                          settings=settings, clock=SystemClock())
              for cell, actor in zip(cells, owner_actors)]
    candidates = [LeaseHolder(tables[1], HolderIdentity(cell, CANDIDATE_REGION,
                                                        f"{CANDIDATE_REGION}-1"),
                              CountingActor(), settings=settings, clock=SystemClock())
                  for cell in cells]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        tasks += [asyncio.create_task(h.run(stop)) for h in owners]
        await until(lambda: all(a.acting for a in owner_actors), timeout=60,
                    what="the owners to acquire")
        tasks += [asyncio.create_task(h.run(stop)) for h in candidates]
        await until(lambda: all(h.state.role is Role.OBSERVING and h.state.epoch_seen >= 1
                                for h in candidates), timeout=30, what="the candidates to observe")
        await asyncio.sleep(settings.renew_interval_seconds)
        for store in stores:
            store.reset()
        grants_before = sum(a.grants for a in owner_actors)
        progress(f"counting etcd operations of {groups} owners and {groups} candidates "
                 f"for {seconds:g}s")
        start = CpuSample.take()
        await asyncio.sleep(seconds)
        cores = Cores.between(start, CpuSample.take())
        owner_calls, candidate_calls = Counter(stores[0].calls), Counter(stores[1].calls)
        return RatesResult(groups, seconds, owner_calls, candidate_calls,
                           sum(a.grants for a in owner_actors) - grants_before,
                           renew_periods(stores[0].keep_alives_sent),
                           stores[0].errors + stores[1].errors, cores)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(h.release() for h in owners), return_exceptions=True)
        for store in stores:
            await store.close()


# --- part 3: capacity of one process --------------------------------------------------------

@dataclass(frozen=True)
class CapacityRow:
    count: int
    summary: dict[str, Any]
    cores: Cores | None

    @property
    def acquired_all(self) -> bool:
        return bool(self.summary.get("acquired") == self.count)

    def keep_alive_p(self, q: float) -> float:
        return quantile(self.summary.get("keep_alive", []), q)

    @property
    def held(self) -> bool:
        return (self.acquired_all and "window_seconds" in self.summary
                and self.summary["self_fences"] == 0 and self.summary["lost"] == 0
                and self.keep_alive_p(0.99) <= PRODUCT.margin_seconds / 4)


def _wait_event(log: Path, kind: str, *, timeout: float, process: ManagedProcess
                ) -> dict[str, Any] | None:
    """The first ``kind`` line, or None once a summary came without it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = events_in(log)
        for event in events:
            if event["event"] == kind:
                return event
        if any(e["event"] == "summary" for e in events):
            return None
        process.check_alive()
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {process.name}: {kind}")


def measure_capacity(plane: LocalControlPlane, sizes: Sequence[int], hold_seconds: float,
                     etcd_timeout: float) -> list[CapacityRow]:
    rows: list[CapacityRow] = []
    etcd_pids = [m.process.pid for m in plane.etcd.members if m.process and m.process.pid]
    for count in sizes:
        acquire_timeout = 30 + count * 0.1
        spec = HoldersSpec(endpoints=plane.etcd.endpoints, prefix=f"/bench/capacity-{count}/groups/",
                           region=OWNER_REGION, count=count, hold_seconds=hold_seconds,
                           acquire_timeout=acquire_timeout, etcd_timeout=etcd_timeout)
        log = plane.run_dir / "logs" / f"holders-{count}.log"
        helper = ManagedProcess(f"holders-{count}", [sys.executable, str(SCRIPT), "--serve-holders",
                                                     json.dumps(asdict(spec))], log=log)
        progress(f"capacity: {count} groups in one process, holding {hold_seconds:g}s "
                 "after all are acquired")
        try:
            helper.start()
            assert helper.pid is not None
            named = {"holder": [helper.pid], "etcd": etcd_pids}
            cores: Cores | None = None
            if _wait_event(log, "window-start", timeout=acquire_timeout + 30, process=helper):
                start = CpuSample.take(named)
                _wait_event(log, "window-end", timeout=hold_seconds + 30, process=helper)
                cores = Cores.between(start, CpuSample.take(named))
            summary = _wait_event(log, "summary", timeout=120, process=helper)
            assert summary is not None
        finally:
            helper.stop()
        row = CapacityRow(count, summary, cores)
        rows.append(row)
        if not row.held:
            progress(f"capacity: {count} groups did not hold; stopping here")
            break
    return rows


# --- report ---------------------------------------------------------------------------------

def _stats_row(label: str, values: Sequence[float], *, scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return f"| {label} | n/a | n/a | n/a | n/a | n/a |"
    cells = [quantile(values, q) * scale for q in (0.0, 0.5, 0.9, 0.99, 1.0)]
    return f"| {label} | " + " | ".join(f"{v:.{digits}f}" for v in cells) + " |"


def print_takeovers(result: TakeoverResult) -> None:
    s = result.config.settings
    t = result.takeovers
    margin = s.margin_seconds
    print(f"## 1. Takeover after the owner process is SIGKILLed (lease {s.duration_seconds:g} s, "
          f"renew {s.renew_interval_seconds:g} s, margin {margin:g} s)")
    print()
    print(f"{len(t)} takeovers ({result.config.rounds} rounds x {result.config.groups} groups; "
          f"{result.missing} without an accepted write). Seconds from the kill.")
    print()
    print("| seconds | min | p50 | p90 | p99 | max |")
    print("|---|---:|---:|---:|---:|---:|")
    print(_stats_row("latency: kill -> first accepted write", [x.latency for x in t]))
    print(_stats_row("floor: etcd TTL left at the kill + margin", [x.etcd_left + margin for x in t]))
    print(_stats_row("overhead: latency - floor", [x.latency - x.etcd_left - margin for x in t]))
    print(_stats_row("refined floor: lease end from the owner's last keep-alive + margin",
                     [x.refined_left + margin for x in t]))
    print(_stats_row("overhead over the refined floor",
                     [x.latency - x.refined_left - margin for x in t]))
    seen = [x for x in t if x.deleted is not None]
    print(_stats_row("- lease end -> owner key deletion seen (etcd expiry lag)",
                     [x.deleted - x.refined_left for x in seen if x.deleted is not None]))
    print(_stats_row("- deletion seen -> candidate acquired (margin wait, grant, CAS)",
                     [x.acting - x.deleted for x in seen if x.deleted is not None]))
    print(_stats_row("- acquired -> database grant done", [x.granted - x.acting for x in t]))
    print(_stats_row("- grant done -> write accepted", [x.latency - x.granted for x in t]))
    print()
    below = sum(x.latency < x.etcd_left + margin for x in t)
    below_refined = sum(x.latency < x.refined_left + margin for x in t)
    stale = sum(x.stale_refused_with is None for x in t)
    codes = Counter(x.stale_refused_with for x in t if x.stale_refused_with)
    print(f"- Takeovers below their floor: **{below}** of {len(t)} (must be 0); below the "
          f"refined floor: **{below_refined}**.")
    print(f"- Writes under the old epoch accepted after the takeover: **{stale}** of {len(t)} "
          f"(refused with {dict(codes)}); writes refused before a candidate's first accepted "
          f"one: {sum(x.refused for x in t)}; epoch steps: {dict(Counter(x.epoch_step for x in t))}.")
    print("- etcd's TimeToLive reports whole seconds, rounded down, so the floor is up to 1 s "
          "low; the refined floor also takes the lease's end as the owner's last acknowledged "
          "keep-alive's send time + TTL (etcd received it later, so the true end is no earlier).")
    print(f"- Deletion seen by a separate watch for {len(seen)} of {len(t)}; etcd's errors "
          f"seen by the candidates: {dict(result.candidate_errors) or 'none'}.")
    if result.cores is not None:
        print(f"- CPU during this part: this benchmark's processes {result.cores.ours:.2f} cores, "
              f"other {result.cores.other:.2f} cores.")
    print()


def print_rates(r: RatesResult) -> None:
    kinds = ["read", "keep-alive", "lease grant", "transaction", "lease revoke", "watch event"]
    per = r.groups * r.seconds
    print(f"## 2. etcd operations per second per placement group (lease {PRODUCT.duration_seconds:g} s, "
          f"renew {PRODUCT.renew_interval_seconds:g} s, margin {PRODUCT.margin_seconds:g} s)")
    print()
    print(f"{r.groups} groups, one owner and one candidate holder each, counted over "
          f"{r.seconds:g} s of steady state.")
    print()
    print("| role | " + " | ".join(kinds) + " | etcd ops total | database grants |")
    print("|---|" + "---:|" * (len(kinds) + 2))
    for role, calls in (("owner", r.owner), ("candidate", r.candidate)):
        total = sum(calls[k] for k in kinds if k != "watch event")
        grants = f"{r.owner_grants / per:.3f}" if role == "owner" else "0"
        print(f"| {role} | " + " | ".join(f"{calls[k] / per:.3f}" for k in kinds)
              + f" | {total / per:.3f} | {grants} |")
    print()
    owner = sum(r.owner[k] for k in kinds if k != "watch event") / per
    candidate = sum(r.candidate[k] for k in kinds if k != "watch event") / per
    print(f"- etcd ops total counts requests (not watch events). At 1,000 groups with an owner "
          f"and two candidate regions each, etcd serves about "
          f"{1000 * (owner + 2 * candidate):,.0f} requests/s "
          f"({1000 * owner:,.0f} from the owners, mostly keep-alives and reads).")
    print(f"- An owner renews every {quantile(r.renew_periods, 0.5):.3f} s (p50; max "
          f"{max(r.renew_periods, default=math.nan):.3f} s), not every "
          f"{PRODUCT.renew_interval_seconds:g} s: the holder sleeps the interval after its "
          "step (keep-alive, grant, read) has finished.")
    print(f"- One watch stream per holder and group (multiplexed on one gRPC stream per client); "
          f"errors during the count: {dict(r.errors) or 'none'}.")
    print(f"- CPU during the count: this benchmark's processes {r.cores.ours:.2f} cores, "
          f"other {r.cores.other:.2f} cores.")
    print()


def print_capacity(rows: list[CapacityRow], hold_seconds: float) -> None:
    print(f"## 3. Groups one region's process can hold (lease {PRODUCT.duration_seconds:g} s, "
          f"renew {PRODUCT.renew_interval_seconds:g} s, margin {PRODUCT.margin_seconds:g} s)")
    print()
    print(f"One process, one LeaseHolder per group (no-op actor), against the 3-member etcd; "
          f"held {hold_seconds:g} s after all were acquired.")
    print()
    print("| groups | acquire all (s) | keep-alive p50 / p99 / max (ms) | read p99 (ms) "
          "| renew period p50 / max (s) | keep-alive peak/mean per 100 ms "
          "| longest gap between renewals (s) | loop lag p99 / max (ms) | etcd errors "
          "| self-fences | lost | holder cores | etcd cores | other cores | held |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        s = row.summary
        acquired = (f"{s['acquire_seconds']:.1f}" if row.acquired_all
                    else f"{s.get('acquired', 0)}/{row.count} in {s['acquire_seconds']:.0f}")
        if "window_seconds" not in s:
            print(f"| {row.count} | {acquired} |" + " - |" * 12 + " no |")
            continue
        errors = sum(s["errors"].values())
        cores = row.cores
        print(f"| {row.count} | {acquired} "
              f"| {row.keep_alive_p(0.5) * 1000:.0f} / {row.keep_alive_p(0.99) * 1000:.0f} / "
              f"{max(s['keep_alive'], default=math.nan) * 1000:.0f} "
              f"| {quantile(s['read'], 0.99) * 1000:.0f} "
              f"| {s['renew_period']:.2f} / {s['renew_period_max']:.2f} | {s['peak_to_mean']:.1f} "
              f"| {s['max_gap']:.2f} "
              f"| {quantile(s['lag'], 0.99) * 1000:.0f} / {max(s['lag'], default=math.nan) * 1000:.0f} "
              f"| {errors} | {s['self_fences']} | {s['lost']} "
              f"| {cores.named['holder'] if cores else math.nan:.2f} "
              f"| {cores.named['etcd'] if cores else math.nan:.2f} "
              f"| {cores.other if cores else math.nan:.2f} | {'yes' if row.held else 'no'} |")
    print()
    held = [row.count for row in rows if row.held]
    print(f"- Held: every group acquired, no self-fence, no group lost, keep-alive p99 at most "
          f"a quarter of the {PRODUCT.margin_seconds:g} s margin. Largest N that held: "
          f"**{max(held) if held else 'none'}**"
          + ("" if len(held) == len(rows) else f" (stopped after {rows[-1].count})") + ".")
    print(f"- A group self-fences when no renewal is confirmed for "
          f"{PRODUCT.duration_seconds - PRODUCT.margin_seconds:g} s (lease - margin); the gap "
          f"column is the longest time any group went without a confirmed renewal.")
    print("- Renew period: time between two keep-alives of one lease (the interval is 2 s). "
          "Peak/mean: keep-alives sent in the busiest 100 ms over the mean 100 ms of the "
          "window; renewals stay phase-locked to when the groups were acquired.")
    print("- Keep-alive and read latency are measured in the holder process around the "
          "whole call, so they include its event loop's backlog (loop lag: how late a 50 ms "
          "sleeper woke). Acquiring includes the margin the first observation waits.")
    for row in rows:
        s = row.summary
        if s.get("errors"):
            print(f"- {row.count} groups: etcd errors by kind {s['errors']}; calls {s['calls']}.")
    print()


# --- entry point ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchConfig:
    takeover: TakeoverConfig
    rate_groups: int
    """Groups (each with an owner and a candidate) for the etcd operation count."""
    rate_seconds: float
    """How long the operations are counted."""
    sizes: tuple[int, ...]
    """Group counts of the capacity part, in order; it stops at the first that fails."""
    hold_seconds: float
    """How long each capacity size is held after all its groups are acquired."""
    etcd_timeout: float
    """Bound of one etcd operation, as ``cellplane ownership hold --etcd-timeout-seconds``."""
    parts: frozenset[int]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="takeover rounds (owner kills)")
    parser.add_argument("--groups", type=int, default=10, help="groups the owner process holds")
    parser.add_argument("--lease", type=int, default=int(SHORT.duration_seconds))
    parser.add_argument("--renew", type=float, default=SHORT.renew_interval_seconds)
    parser.add_argument("--margin", type=float, default=SHORT.margin_seconds)
    parser.add_argument("--defaults", action="store_true",
                        help="takeover with the product's lease settings (10 s / 2 s / 2 s)")
    parser.add_argument("--rate-groups", type=int, default=20)
    parser.add_argument("--rate-seconds", type=float, default=20.0)
    parser.add_argument("--sizes", default="100,250,500,1000")
    parser.add_argument("--hold-seconds", type=float, default=25.0)
    parser.add_argument("--etcd-timeout", type=float, default=1.0,
                        help="bound of one etcd operation (the CLI's default)")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill phases")
    parser.add_argument("--serve-owner", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--serve-holders", metavar="SPEC", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> BenchConfig:
    settings = PRODUCT if args.defaults else LeaseSettings(
        args.lease, args.renew, args.margin)
    return BenchConfig(
        takeover=TakeoverConfig(settings.validated(), args.rounds, args.groups, args.etcd_timeout,
                                args.seed),
        rate_groups=args.rate_groups, rate_seconds=args.rate_seconds,
        sizes=tuple(int(s) for s in args.sizes.split(",") if s.strip()),
        hold_seconds=args.hold_seconds, etcd_timeout=args.etcd_timeout,
        parts=frozenset(int(p) for p in args.parts.split(",") if p.strip()))


def _etcd_version(plane: LocalControlPlane) -> str:
    import subprocess

    out = subprocess.run([str(plane.binaries.etcd), "--version"], capture_output=True, text=True,
                         timeout=10, check=False).stdout
    return out.splitlines()[0].removeprefix("etcd Version: ") if out else "?"


def run(config: BenchConfig) -> None:
    started = time.monotonic()
    plane = LocalControlPlane(LocalPlaneConfig(regions=REGIONS, with_apiserver=False))
    try:
        progress(f"starting a {len(REGIONS)}-member etcd on 127.0.0.1")
        plane.start()
        print(f"# Placement-group ownership: etcd {_etcd_version(plane)}, {len(REGIONS)} members "
              f"on 127.0.0.1 (raft leader at the start: {plane.etcd.leader()}; every client "
              f"asks {REGIONS[0]}'s member first), {os.cpu_count()} CPUs shared with everything "
              "else on the machine")
        print()
        if 1 in config.parts:
            progress("starting PostgreSQL")
            pg = plane.add_postgres("cells")
            print_takeovers(asyncio.run(measure_takeovers(plane, pg, config.takeover)))
        if 2 in config.parts:
            print_rates(asyncio.run(measure_rates(plane, config.rate_groups, config.rate_seconds,
                                                  config.etcd_timeout)))
        if 3 in config.parts:
            print_capacity(measure_capacity(plane, config.sizes, config.hold_seconds,
                                            config.etcd_timeout), config.hold_seconds)
        print(f"Total runtime: {time.monotonic() - started:.0f} s.")
    finally:
        plane.stop()
        plane.remove()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Every planned stop of a candidate says so; that is not news here.
    logging.getLogger("cellplane_operator.ownership.cell_grant").setLevel(logging.ERROR)
    if args.serve_owner:
        asyncio.run(serve_owner(OwnerSpec(**json.loads(args.serve_owner))))
        return
    if args.serve_holders:
        asyncio.run(serve_holders(HoldersSpec(**json.loads(args.serve_holders))))
        return
    run(config_from(args))


if __name__ == "__main__":
    main()
