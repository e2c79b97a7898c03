"""Placing 10,000 tenants over 200 cells with ``Placer``, against the target of < 1 s.

    .venv/bin/python benchmarks/placement.py [--runs 5] [--tenants 10000] [--cells 200]
        [--no-reference]

Pure computation in this process: no etcd, no apiserver, no Postgres. The fleet
and the tenants are generated from a fixed seed (``--seed``), the same for every
run:

- cells over three regions (45/35/20 %), shared, 200 or 400 worker slots and
  100 tenants each, half of them with a standby region; one in twenty is not
  taking tenants (Provisioning, Draining, Degraded); plus a dedicated cell for
  a third of the dedicated tenants (the others get CreateDedicatedCell);
- tenants in the same regional mix, with the plans' default running caps
  (``PLAN_DEFAULTS``: free 2, pro 5, enterprise 20) at 60/30/10 %; 20 % are
  HOME_ASYNC, 1 % dedicated, 1 % pinned to a random shared cell of their region.

A run builds a ``Placer`` from the candidates and places every tenant in turn
(both inside the timed span). Columns: runs, p50 and max seconds per run,
tenants per second at the p50, the outcomes, and the cells left over their
worker slots or tenant capacity (must be 0). The reference row is the pure
``place`` called per tenant with the loads updated between calls (a full scan
each time), measured once, to show what the index saves; its outcomes must
equal the Placer's. A benchmark, not a test: it judges only those criteria.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from cellplane_cells.domain.plans import PLAN_DEFAULTS, Plan
from cellplane_operator.domain.cells import CellName, Region, Tier
from cellplane_operator.domain.placement import (
    CellCandidate, CreateDedicatedCell, Outcome, PlaceIn, PlacementRequest, Placer, RegionPolicy,
    Unplaceable, WaitForCell, dedicated_cell_name, place,
)

REGIONS = (Region("region-a"), Region("region-b"), Region("region-c"))
REGION_WEIGHTS = (45, 35, 20)
PLAN_WEIGHTS = {Plan.FREE: 60, Plan.PRO: 30, Plan.ENTERPRISE: 10}
TARGET_SECONDS = 1.0


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fleet(count: int, rng: random.Random) -> list[CellCandidate]:
    cells = []
    for i in range(count):
        region = rng.choices(REGIONS, REGION_WEIGHTS)[0]
        phase = rng.choices(["Ready", "Provisioning", "Draining", "Degraded"], [95, 2, 2, 1])[0]
        cells.append(CellCandidate(
            name=CellName(f"shared-{region[-1]}{i:03d}"), region=region, tier=Tier.SHARED,
            ready=phase == "Ready", phase=phase, draining=phase == "Draining",
            has_standby=i % 2 == 0, tenant_capacity=100, worker_slots=rng.choice([200, 400])))
    return cells


def tenants(count: int, cells: Sequence[CellCandidate],
            rng: random.Random) -> tuple[list[PlacementRequest], list[CellCandidate]]:
    """The requests, and the dedicated cells that already exist for some of them."""
    by_region = {r: [c.name for c in cells if c.region == r] for r in REGIONS}
    requests, dedicated = [], []
    plans, weights = list(PLAN_WEIGHTS), list(PLAN_WEIGHTS.values())
    for i in range(count):
        region = rng.choices(REGIONS, REGION_WEIGHTS)[0]
        plan = rng.choices(plans, weights)[0]
        isolation = Tier.DEDICATED if rng.random() < 0.01 else Tier.SHARED
        pinned = (rng.choice(by_region[region]) if isolation is Tier.SHARED
                  and by_region[region] and rng.random() < 0.01 else None)
        request = PlacementRequest(
            namespace=f"team-{i % 97}", name=f"tenant-{i}", isolation=isolation,
            home_region=region,
            region_policy=RegionPolicy.HOME_ASYNC if rng.random() < 0.2 else RegionPolicy.SINGLE_REGION,
            max_running_jobs=PLAN_DEFAULTS[plan].max_running_jobs, pinned_cell=pinned)
        requests.append(request)
        if isolation is Tier.DEDICATED and i % 3 == 0:
            dedicated.append(CellCandidate(
                name=CellName(dedicated_cell_name(request.namespace, request.name)), region=region,
                tier=Tier.DEDICATED, ready=True, phase="Ready", draining=False, has_standby=True,
                tenant_capacity=1, worker_slots=40))
    return requests, dedicated


@dataclass
class Result:
    variant: str
    seconds: list[float]
    outcomes: list[Outcome]
    over: int


def overfilled(start: Sequence[CellCandidate], requests: Sequence[PlacementRequest],
               outcomes: Sequence[Outcome]) -> int:
    """Shared cells over their slots or tenant capacity after the placements."""
    tenants_in, slots_in = Counter[str](), Counter[str]()
    for request, outcome in zip(requests, outcomes):
        if isinstance(outcome, PlaceIn):
            tenants_in[outcome.cell] += 1
            slots_in[outcome.cell] += request.max_running_jobs
    return sum(1 for c in start if c.tier is Tier.SHARED and (
        c.slots_in_use + slots_in[c.name] > c.worker_slots
        or c.tenants_placed + tenants_in[c.name] > c.tenant_capacity))


def run_placer(cells: Sequence[CellCandidate], requests: Sequence[PlacementRequest],
               runs: int) -> Result:
    seconds: list[float] = []
    outcomes: list[Outcome] = []
    for n in range(runs):
        started = time.perf_counter()
        placer = Placer(cells)
        outcomes = [placer.place(request) for request in requests]
        seconds.append(time.perf_counter() - started)
        progress(f"Placer run {n + 1}/{runs}: {seconds[-1]:.3f} s")
    return Result("Placer", seconds, outcomes, overfilled(cells, requests, outcomes))


def run_reference(cells: Sequence[CellCandidate], requests: Sequence[PlacementRequest]) -> Result:
    started = time.perf_counter()
    current = {c.name: c for c in cells}
    outcomes: list[Outcome] = []
    for request in requests:
        outcome = place(request, current.values())
        if isinstance(outcome, PlaceIn):
            current[outcome.cell] = current[outcome.cell].with_tenant(request.max_running_jobs)
        outcomes.append(outcome)
    seconds = time.perf_counter() - started
    progress(f"place() per tenant: {seconds:.3f} s")
    return Result("place() per tenant", [seconds], outcomes, overfilled(cells, requests, outcomes))


def print_table(results: Sequence[Result], tenants: int) -> None:
    print("| variant | runs | p50 s | max s | tenants/s | placed | create dedicated | waiting "
          "| unplaceable | cells over capacity |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        kinds = Counter(type(o) for o in r.outcomes)
        p50 = statistics.median(r.seconds)
        print(f"| {r.variant} | {len(r.seconds)} | {p50:.3f} | {max(r.seconds):.3f} "
              f"| {tenants / p50 if p50 else math.inf:,.0f} | {kinds[PlaceIn]:,} "
              f"| {kinds[CreateDedicatedCell]:,} | {kinds[WaitForCell]:,} "
              f"| {kinds[Unplaceable]:,} | {r.over} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the place()-per-tenant row")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    shared = fleet(args.cells, rng)
    requests, dedicated = tenants(args.tenants, shared, rng)
    cells = shared + dedicated
    progress(f"{len(shared)} shared cells ({sum(c.available for c in shared)} taking tenants, "
             f"{sum(c.worker_slots for c in shared if c.available):,} slots), "
             f"{len(dedicated)} dedicated; {len(requests):,} tenants asking for "
             f"{sum(r.max_running_jobs for r in requests):,} slots")

    results = [run_placer(cells, requests, args.runs)]
    agree = True
    if not args.no_reference:
        reference = run_reference(cells, requests)
        results.append(reference)
        agree = reference.outcomes == results[0].outcomes
    print_table(results, len(requests))

    reasons = Counter(o.reason.value for o in results[0].outcomes if isinstance(o, Unplaceable))
    p50 = statistics.median(results[0].seconds)
    met = max(results[0].seconds) < TARGET_SECONDS and results[0].over == 0 and agree
    print(f"\nUnplaceable by reason: {', '.join(f'{k} {v}' for k, v in reasons.most_common()) or 'none'}.")
    if not args.no_reference:
        print(f"Placer and place() per tenant give {'the same' if agree else 'DIFFERENT'} outcomes; "
              f"the index saves {statistics.median(results[1].seconds) / p50:.0f}x.")
    print(f"Target: {len(requests):,} tenants over {len(shared)} shared cells (and "
          f"{len(dedicated)} dedicated) in < {TARGET_SECONDS:g} s "
          f"(every run), no cell over capacity: {'met' if met else 'NOT met'} "
          f"(max {max(results[0].seconds):.3f} s; {os.cpu_count()} CPUs, one used).")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
