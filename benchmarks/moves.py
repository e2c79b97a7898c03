"""Tenant moves under load: the write pause, the whole move, and the copy's throughput.

    .venv/bin/python benchmarks/moves.py [--sizes 1000,10000,100000] [--runs 5] [--keep]

The plane of benchmarks/regions.py (three regions, an operator on each region's own
etcd member, the router in region-c), with two shared cells in region-a and no
standbys. For each size, one enterprise tenant holds that many queued jobs (each with
two steps, an idempotency key and its reservation in the ledger: five rows a job, due
in an hour so that none runs and every move copies them all) while a client submits
about 30 jobs a second through the router, each key until it is acknowledged. The
tenant is moved back and forth between the two cells ``--runs`` times with
``cellplane.io`` TenantMoves (maxWritePauseSeconds 2), each created from this process.

Per move, measured:
- the write pause as the operator measured it (status.progress.pauseSeconds: from
  marking the placement record moving to releasing it to the target);
- the longest gap between consecutive acknowledgements the client saw around the move;
- the whole move (TenantMove created -> Completed, on this process's clock);
- the bulk copy's throughput (the operator's CatchingUp Event: rows and rows/s);
- acknowledged jobs missing from the target afterwards (must be 0).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from cellplane_operator.kube import EVENTS, TENANTMOVES
from regions import NAMESPACE, Load, Regions, new_prefix, on_sigterm_exit, percentile, \
    print_client, progress

CELLS = ("mv-a", "mv-b")
LEASE = {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}
PAUSE_BUDGET_SECONDS = 2.0
GOAL_P99_SECONDS = 1.0
COPIED = re.compile(r"copied (\d+) rows at (\d+) rows/s")


@dataclass(frozen=True)
class Run:
    size: int
    number: int
    source: str
    target: str
    pause: float
    client_gap: float
    total: float
    rows: int
    rows_per_second: float
    lost: int


def seed(conninfo: str, tenant_id: str, count: int) -> None:
    """``count`` queued jobs written as the cell's owner (under its epoch), in batches."""
    with psycopg.connect(conninfo) as conn:
        epoch = conn.execute(b"SELECT epoch FROM placement_group").fetchone()
        assert epoch is not None
        conn.execute(f"SET cellplane.epoch = '{int(epoch[0])}'".encode())
        for start in range(0, count, 20_000):
            conn.execute(b"""
                WITH made AS (
                    INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,
                                      max_attempts, estimate, run_after)
                    SELECT gen_random_uuid(), %(tenant)s, 'queued', 'default', 2, %(payload)s,
                           3, 0, now() + interval '1 hour'
                      FROM generate_series(1, %(n)s)
                    RETURNING job_id
                ), steps AS (
                    INSERT INTO job_steps (job_id, step, idempotency_key, status)
                    SELECT job_id, n, job_id || '/' || n, 'pending'
                      FROM made, generate_series(1, 2) n
                ), keys AS (
                    INSERT INTO idempotency_keys (tenant_id, key, request_hash, job_id,
                                                  status_code, response)
                    SELECT %(tenant)s, 'seed-' || job_id, '\\x00', job_id, 202,
                           json_build_object('job_id', job_id)
                      FROM made
                )
                INSERT INTO ledger (tenant_id, job_id, kind, amount)
                SELECT %(tenant)s, job_id, 'reserve', 0 FROM made
                """, {"tenant": tenant_id, "payload": Jsonb({"seeded": True}),
                      "n": min(20_000, count - start)})
            conn.commit()


def move_once(regions: Regions, load: Load, tenant: str, tenant_id: str, size: int,
              number: int, source: str, target: str) -> Run:
    name = f"{tenant}-{number}-to-{target}"
    acks_before = len(load.acks)
    created = time.monotonic()
    regions.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
                   "metadata": {"name": name, "namespace": NAMESPACE},
                   "spec": {"tenant": tenant, "targetCell": target,
                            "maxWritePauseSeconds": PAUSE_BUDGET_SECONDS}})
    status: dict[str, Any] = {}
    deadline = created + 600
    while time.monotonic() < deadline:
        body = regions.call(regions.client.get(TENANTMOVES, name, namespace=NAMESPACE)) or {}
        status = body.get("status") or {}
        if status.get("phase") in ("Completed", "Aborted", "Failed"):
            break
        time.sleep(0.2)
    total = time.monotonic() - created
    if status.get("phase") != "Completed":
        raise RuntimeError(f"move {name} ended {status.get('phase')}: {status}")
    load.wait_for(30)
    acks = [a.at for a in list(load.acks)[max(acks_before - 1, 0):]]
    gap = max((b - a for a, b in zip(acks, acks[1:])), default=0.0)
    copied = _copied(regions, name)
    keys = _keys(regions.cell_database(target, "region-a"), tenant_id)
    lost = sum(1 for ack in list(load.acks)[:acks_before] if ack.key not in keys)
    return Run(size, number, source, target, float(status["progress"]["pauseSeconds"]), gap,
               total, copied[0], copied[1], lost)


def _copied(regions: Regions, name: str) -> tuple[int, float]:
    found = regions.call(regions.client.list(EVENTS, namespace=NAMESPACE))
    for event in found:
        if (event.get("involvedObject") or {}).get("name") == name:
            match = COPIED.search(str(event.get("message") or ""))
            if match:
                return int(match.group(1)), float(match.group(2))
    return 0, 0.0


def _keys(conninfo: str, tenant_id: str) -> set[str]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(b"SELECT key FROM idempotency_keys WHERE tenant_id = %s", (tenant_id,))
        return {str(row[0]) for row in rows.fetchall()}


def print_tables(runs: list[Run], error: BaseException | None, load: Load | None) -> None:
    print(f"# Tenant moves under load: two shared cells in one region on 127.0.0.1, the "
          f"router in another; pause budget {PAUSE_BUDGET_SECONDS:g} s; {os.cpu_count()} CPUs "
          "shared with everything else on the machine")
    print()
    print("| jobs | run | from -> to | write pause (s) | client's longest gap (s) "
          "| whole move (s) | rows copied | copy rows/s | lost acked jobs |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r.size} | {r.number} | {r.source} -> {r.target} | {r.pause:.3f} "
              f"| {r.client_gap:.2f} | {r.total:.1f} | {r.rows} | {r.rows_per_second:.0f} "
              f"| {r.lost} |")
    print()
    print("| jobs | moves | write pause p50 / p99 / max (s) | client gap p50 / max (s) "
          "| whole move p50 (s) | copy rows/s p50 | goal pause p99 <= 1 s | lost acked jobs |")
    print("|---:|---:|---|---|---:|---:|---|---:|")
    for size in sorted({r.size for r in runs}):
        of = [r for r in runs if r.size == size]
        pauses = [r.pause for r in of]
        gaps = [r.client_gap for r in of]
        p99 = percentile(pauses, 99)
        print(f"| {size} | {len(of)} | {percentile(pauses, 50):.3f} / {p99:.3f} / "
              f"{max(pauses):.3f} | {percentile(gaps, 50):.2f} / {max(gaps):.2f} "
              f"| {percentile([r.total for r in of], 50):.1f} "
              f"| {percentile([r.rows_per_second for r in of], 50):.0f} "
              f"| {'met' if p99 <= GOAL_P99_SECONDS else 'NOT met'} | {sum(r.lost for r in of)} |")
    print()
    if load is not None:
        print_client(load, outages=False)
    if error is not None:
        print(f"\nStopped early: {error!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="jobs held by the moved tenant, one tenant per size")
    parser.add_argument("--runs", type=int, default=5, help="moves per size")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    on_sigterm_exit()
    regions = Regions(keep=args.keep)
    runs: list[Run] = []
    error: BaseException | None = None
    load: Load | None = None
    try:
        regions.start()
        for cell in CELLS:
            progress(f"cell {cell} in region-a, no standby")
            # Room in each cell for the tenants of every size (20 worker slots each).
            regions.make_cell(cell, LEASE, standby=False, worker_slots=200)
        for size in (int(s) for s in args.sizes.split(",")):
            tenant = f"t{size}"
            tenant_id, key = regions.make_tenant(tenant, CELLS[0])
            progress(f"tenant {tenant}: seeding {size} queued jobs in {CELLS[0]}")
            seed(regions.cell_database(CELLS[0], "region-a"), tenant_id, size)
            if load is not None:
                load.finish()
            load = Load(regions.router_url, key, new_prefix()).start()
            load.wait_for(60)
            for number in range(1, args.runs + 1):
                source, target = (CELLS if number % 2 else CELLS[::-1])
                progress(f"{size} jobs, move {number}: {source} -> {target}")
                run = move_once(regions, load, tenant, tenant_id, size, number, source, target)
                progress(f"  pause {run.pause:.3f}s, client gap {run.client_gap:.2f}s, "
                         f"move {run.total:.1f}s, {run.rows} rows at {run.rows_per_second:.0f}/s")
                runs.append(run)
    except BaseException as caught:  # noqa: BLE001 (the table of what finished is printed)
        error = caught
    finally:
        if load is not None:
            load.finish()
        print_tables(runs, error, load)
        regions.close(failed=error is not None)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
