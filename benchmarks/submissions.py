"""Throughput and latency of ``POST /v1/jobs`` against the real ``cellplane cell serve``.

    .venv/bin/python benchmarks/submissions.py [--seconds 15] [--concurrency 16,64]

Starts its own PostgreSQL 15 on loopback (fsync off, as the local control plane
runs it; ``--durable`` turns it on), migrates one cell database and grants its
placement group epoch 1, then runs one ``cellplane cell serve`` process (one
uvicorn worker, as the command ships) and creates enterprise tenants through
the admin API with quotas high enough that neither the token bucket nor the
daily spend limit refuses anything.

The load generator is this process: asyncio, ``concurrency`` keep-alive
connections, each its own ``httpx.AsyncClient`` with one request in flight.
Every new submission carries a fresh ``Idempotency-Key`` and goes to the
tenants in turn. A replay run resubmits keys that were accepted before,
with the same body, and must get the stored 202 back (``Idempotent-Replayed``).
Each run has a warm-up, then a measured window; a request belongs to the window
if it started in it, and the window closes when the last of those has answered.

Only 202s count as accepted; any other outcome is listed by status code or by
the client's exception name. The CPU columns are the CPU seconds each side used
during the window divided by its length (1.00 = one core busy): the server
process, the whole Postgres process tree, this load generator, and the rest of
the machine's busy time ("other": the kernel's interrupt work for loopback
traffic, plus any neighbour, whose load skews the run). At the end the jobs and
idempotency-key rows are counted and compared with the number of new
submissions answered 202, and the wallets' reservations with their estimates.
A benchmark, not a test: it prints a markdown table and judges nothing but
those counts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import secrets
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from cellplane_cells.domain.plans import PLAN_CEILINGS, Plan
from cellplane_cells.migrate import migrate
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import ManagedProcess, tail
from procstat import machine_busy_seconds, tree_cpu_seconds

CELL = "cell-bench"
EPOCH = 1
DATABASE = "submissions"
ESTIMATE = 1_000
"""Micro-credits reserved per job: non-zero, so the reservation really moves money."""
LEASE_SECONDS = 3600.0
CEILING = PLAN_CEILINGS[Plan.ENTERPRISE]

# What the lease owner's renewal does (see tests/cellfixtures.py `grant`).
GRANT_EPOCH = "SELECT cellplane_grant(%(epoch)s, make_interval(secs => %(seconds)s))"
COUNT_JOBS = "SELECT count(*) FROM jobs"
COUNT_KEYS = "SELECT count(*) FROM idempotency_keys"
RESERVED = "SELECT coalesce(sum(reserved), 0) FROM wallets"
# What the server's pooled connections are doing at one instant: waiting for a
# row lock, running a statement, holding a transaction open while the server
# (Python) has the turn, or idle (in the pool, or between transactions).
BACKEND_STATES = """
SELECT CASE WHEN wait_event_type = 'Lock' THEN 'lock'
            WHEN state = 'active' THEN 'active'
            WHEN state LIKE 'idle in transaction%%' THEN 'in_transaction'
            ELSE 'idle' END, count(*)
  FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
   AND pid <> pg_backend_pid()
 GROUP BY 1
"""



@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    api_key: str


@dataclass(frozen=True)
class Submission:
    tenant: Tenant
    key: str
    n: int
    """The payload is ``{"n": n}``: a replay rebuilds the very same body from it."""

    def body(self) -> dict[str, object]:
        return {"target": "default", "payload": {"n": self.n}, "estimate": ESTIMATE}


@dataclass
class RunResult:
    workload: str
    concurrency: int
    window_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    """Seconds, of the accepted requests that started in the window."""
    outcomes: Counter[str] = field(default_factory=Counter)
    """Every answer that started in the window, by status (or exception name)."""
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per side during the window."""
    backends: dict[str, float] = field(default_factory=dict)
    """Mean number of the server's connections in each state (``BACKEND_STATES``)."""
    server_threads: int = 0
    """Threads of the server process when the window closed (its thread pool included)."""


# --- CPU accounting from /proc ----------------------------------------------------------


def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class BackendSampler:
    """Samples ``BACKEND_STATES`` in a thread, so the load generator's loop never waits on it."""

    def __init__(self, conninfo: str, *, interval: float = 0.05) -> None:
        self._conninfo = conninfo
        self._interval = interval
        self._stop = threading.Event()
        self._totals: Counter[str] = Counter()
        self._samples = 0
        self._thread = threading.Thread(target=self._run, name="backend-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, float]:
        """Stops sampling; the mean count per state."""
        self._stop.set()
        self._thread.join(timeout=10)
        return {state: total / max(1, self._samples) for state, total in self._totals.items()}

    def _run(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            while not self._stop.wait(self._interval):
                for state, count in conn.execute(BACKEND_STATES).fetchall():
                    self._totals[state] += count
                self._samples += 1


# --- the server under test --------------------------------------------------------------


def start_server(conninfo: str, *, log: Path, pool_size: int) -> tuple[ManagedProcess, str, str, str]:
    """``cellplane cell serve`` as a subprocess; returns it, both base URLs and the admin token."""
    port, admin_port = free_port(), free_port()
    token = secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", "cellplane_operator", "cell", "serve",
            "--database", conninfo, "--cell", CELL, "--epoch", str(EPOCH),
            "--host", LOOPBACK, "--port", str(port), "--admin-port", str(admin_port),
            "--pool-size", str(pool_size), "--allow-private-targets"]
    # The token travels in the environment, not on a command line `ps` shows.
    server = ManagedProcess("cell-serve", argv, log=log, env={"CELLPLANE_CELL_ADMIN_TOKEN": token})
    server.start()
    tenant_url, admin_url = f"http://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{admin_port}"

    def ready() -> bool:
        # The admin API serves its OpenAPI document to the token's holder only.
        try:
            return (httpx.get(f"{tenant_url}/openapi.json", timeout=1.0).status_code == 200
                    and httpx.get(f"{admin_url}/admin/v1/openapi.json", timeout=1.0,
                                  headers={"Authorization": f"Bearer {token}"}).status_code == 200)
        except httpx.HTTPError:
            return False

    server.wait_until(ready, timeout=60, what="the OpenAPI documents of both ports")
    return server, tenant_url, admin_url, token


def create_tenants(admin_url: str, token: str, count: int) -> list[Tenant]:
    """Enterprise tenants at the plan's ceilings, each with a ``default`` target."""
    tenants: list[Tenant] = []
    with httpx.Client(base_url=admin_url, timeout=10.0,
                      headers={"Authorization": f"Bearer {token}"}) as admin:
        for index in range(count):
            tenant_id = f"bench-{index:03d}"
            created = admin.put(f"/admin/v1/tenants/{tenant_id}", json={
                "plan": Plan.ENTERPRISE.value, "jobs_per_second": CEILING.jobs_per_second,
                "burst": CEILING.burst, "daily_spend_limit": CEILING.daily_spend_limit})
            created.raise_for_status()
            # Never called: no worker runs. Loopback is allowed by --allow-private-targets.
            admin.put(f"/admin/v1/tenants/{tenant_id}/targets",
                      json={"name": "default", "url": f"http://{LOOPBACK}:9/unused"}
                      ).raise_for_status()
            tenants.append(Tenant(tenant_id, created.json()["api_key"]))
    return tenants


# --- the load generator -----------------------------------------------------------------


async def run(tenant_url: str, *, workload: str, concurrency: int, warmup: float, seconds: float,
              next_submission: Callable[[], Submission], expect_replayed: bool,
              on_accepted: Callable[[Submission], None], cpu_pids: dict[str, int],
              conninfo: str) -> RunResult:
    result = RunResult(workload, concurrency)
    # One client per connection: a single AsyncClient shared by many tasks spends
    # CPU in its pool bookkeeping that grows with the number of connections
    # (encode/httpx#3215), and this load generator shares the CPUs with the server.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    started = time.perf_counter()
    window_start, window_end = started + warmup, started + warmup + seconds
    cpu_before: dict[str, float] = {}
    sampler = BackendSampler(conninfo)

    def sample_cpu() -> dict[str, float]:
        sample = {side: tree_cpu_seconds(pid) for side, pid in cpu_pids.items()}
        sample["client"] = time.process_time()
        sample["machine"] = machine_busy_seconds()
        return sample

    async def open_window() -> None:
        await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
        cpu_before.update(sample_cpu())
        sampler.start()

    async def connection() -> None:
        async with httpx.AsyncClient(base_url=tenant_url, limits=one, timeout=60.0) as client:
            await requests(client)

    async def requests(client: httpx.AsyncClient) -> None:
        while (begun := time.perf_counter()) < window_end:
            submission = next_submission()
            try:
                response = await client.post("/v1/jobs", json=submission.body(), headers={
                    "Authorization": f"Bearer {submission.tenant.api_key}",
                    "Idempotency-Key": submission.key})
                replayed = response.headers.get("idempotent-replayed") == "true"
                outcome = f"{response.status_code}{' replayed' if replayed else ''}"
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            took = time.perf_counter() - begun
            accepted = outcome == ("202 replayed" if expect_replayed else "202")
            if accepted:
                on_accepted(submission)
            if begun >= window_start:
                result.outcomes[outcome] += 1
                if accepted:
                    result.latencies.append(took)

    opener = asyncio.create_task(open_window())
    await asyncio.gather(*(connection() for _ in range(concurrency)))
    await opener
    closed = time.perf_counter()
    cpu_after = sample_cpu()
    result.backends = sampler.stop()
    result.server_threads = thread_count(cpu_pids["server"])
    result.window_seconds = closed - window_start
    result.cpu = {side: cpu_after[side] - cpu_before[side] for side in cpu_after}
    # Whatever else ran on the machine meanwhile: a busy neighbour skews the run.
    result.cpu["other"] = max(0.0, result.cpu.pop("machine") - sum(result.cpu.values()))
    return result


# --- the report -------------------------------------------------------------------------


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least ``fraction`` of them at or below it."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def print_table(results: list[RunResult], accepted_status: dict[str, str]) -> None:
    print("| workload | conns | requests | accepted | accepted/s | p50 ms | p95 ms | p99 ms "
          "| max ms | not accepted | server CPU | postgres CPU | client CPU | other CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        ordered = sorted(r.latencies)
        accepted = len(ordered)
        others = ", ".join(f"{k}: {v}" for k, v in sorted(r.outcomes.items())
                           if k != accepted_status[r.workload]) or "none"
        ms = [f"{_percentile(ordered, p) * 1000:.1f}" if ordered else "-"
              for p in (0.50, 0.95, 0.99, 1.0)]
        cores = {side: seconds / r.window_seconds for side, seconds in r.cpu.items()}
        print(f"| {r.workload} | {r.concurrency} | {sum(r.outcomes.values())} | {accepted} "
              f"| {accepted / r.window_seconds:.0f} | {' | '.join(ms)} | {others} "
              f"| {cores['server']:.2f} | {cores['postgres']:.2f} | {cores['client']:.2f} "
              f"| {cores['other']:.2f} |")


def print_backends(results: list[RunResult], *, pool_size: int) -> None:
    print(f"\nThe server's Postgres connections (pool of {pool_size}), mean count during the "
          "window:\n")
    print("| workload | conns | open | running a statement | waiting for a row lock "
          "| in a transaction, server's turn | idle | server threads |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        b = r.backends
        print(f"| {r.workload} | {r.concurrency} | {sum(b.values()):.1f} | {b.get('active', 0):.1f} "
              f"| {b.get('lock', 0):.1f} | {b.get('in_transaction', 0):.1f} "
              f"| {b.get('idle', 0):.1f} | {r.server_threads} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per run")
    parser.add_argument("--concurrency", default="16,64",
                        help="comma-separated connection counts, one run each")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--pool-size", type=int, default=20,
                        help="the server's --pool-size (its default is 20)")
    parser.add_argument("--no-replays", action="store_true", help="skip the replay runs")
    parser.add_argument("--durable", action="store_true", help="Postgres with fsync on")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    plane = LocalControlPlane(LocalPlaneConfig(regions=(), with_apiserver=False,
                                               durable_postgres=args.durable))
    server: ManagedProcess | None = None
    try:
        pg = plane.add_postgres("bench")
        assert pg.process is not None and pg.process.pid is not None
        pg.execute(f'CREATE DATABASE "{DATABASE}"')
        conninfo = pg.dsn_for(DATABASE)
        migrate(conninfo, cell=CELL)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(GRANT_EPOCH, {"epoch": EPOCH, "seconds": LEASE_SECONDS})

        server, tenant_url, admin_url, token = start_server(
            conninfo, log=plane.run_dir / "logs" / "cell-serve.log", pool_size=args.pool_size)
        assert server.pid is not None
        tenants = create_tenants(admin_url, token, args.tenants)
        cpu_pids = {"server": server.pid, "postgres": pg.process.pid}

        accepted_new: list[Submission] = []
        counter = itertools.count()

        def fresh() -> Submission:
            n = next(counter)
            return Submission(tenants[n % len(tenants)], str(uuid.uuid4()), n)

        results: list[RunResult] = []
        for level in levels:
            results.append(asyncio.run(run(
                tenant_url, workload="new", concurrency=level, warmup=args.warmup,
                seconds=args.seconds, next_submission=fresh, expect_replayed=False,
                on_accepted=accepted_new.append, cpu_pids=cpu_pids, conninfo=conninfo)))
        if not args.no_replays and accepted_new:
            pool = random.Random(1).sample(accepted_new, len(accepted_new))
            for level in levels:
                cycle = itertools.cycle(pool)
                results.append(asyncio.run(run(
                    tenant_url, workload="replay", concurrency=level, warmup=args.warmup,
                    seconds=args.seconds, next_submission=lambda: next(cycle),
                    expect_replayed=True, on_accepted=lambda _: None, cpu_pids=cpu_pids,
                    conninfo=conninfo)))

        print_table(results, {"new": "202", "replay": "202 replayed"})
        print_backends(results, pool_size=args.pool_size)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            jobs, keys, reserved = (conn.execute(sql).fetchone()[0]  # type: ignore[index]
                                    for sql in (COUNT_JOBS, COUNT_KEYS, RESERVED))
        expected = len(accepted_new)
        consistent = jobs == keys == expected and reserved == expected * ESTIMATE
        print(f"\nNew submissions answered 202 (warm-ups included): {expected}; jobs rows: {jobs}; "
              f"idempotency keys: {keys}; reserved {reserved} = {expected} x {ESTIMATE}: "
              f"{'yes' if reserved == expected * ESTIMATE else 'NO'} -> "
              f"{'consistent' if consistent else 'MISMATCH'}")
        print(f"{len(tenants)} enterprise tenants; server: one uvicorn process, pool size "
              f"{args.pool_size}; Postgres fsync {'on' if args.durable else 'off'}; "
              f"{os.cpu_count()} CPUs shared by server, Postgres and this load generator.")
        return 0 if consistent else 1
    except BaseException:
        if server is not None:
            print(f"--- tail of the server's log ---\n{tail(server.log)}", file=sys.stderr)
        raise
    finally:
        try:
            if server is not None:
                server.stop(grace=10)
        finally:
            plane.stop()
            plane.remove()


if __name__ == "__main__":
    sys.exit(main())
