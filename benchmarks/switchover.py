"""A planned switchover under load: how long writes pause, and that nothing is lost.

    .venv/bin/python benchmarks/switchover.py [--runs 20] [--keep]

The same set-up as failover.py (benchmarks/regions.py): three regions, an operator on
each region's own etcd member, the router in region-c, one cell homed in region-a with
a standby in region-b (the product's lease: 10 s, renew 2 s, margin 2 s), one
enterprise tenant and a client submitting about 30 jobs a second through the router,
each key until it is acknowledged.

Each run asks the owner to hand the cell to its standby, alternating a->b and b->a, by
the Cell annotation ``cellplane.io/switchover-to`` (what ``cellplane switchover`` writes;
patched from this process so that the request's time is the patch's, not a CLI's
start-up), and measures on the client's clock:

- the write pause: the longest gap between consecutive acknowledged writes around the
  switchover, and when it began after the request;
- the time from the request to the first write the new site accepted (the first
  acknowledgement after the target's acquisition of the owner key, seen by a watch);
- the owner's own account (its SwitchoverHandedOver Event: clean shutdown, the
  standby's replay of the last WAL), the promotion, and lastTakeover.seconds;
- acknowledged jobs missing from the new primary (must be 0), and what the
  reconciliation report of the new epoch lists (must be nothing).

Before the next run the old primary must stream from the new one again
(status.standbys) with its report made (status.lastReconciliation of the new epoch).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cellplane_operator.domain.failover import SWITCHOVER_TO
from cellplane_operator.kube import CELLS
from regions import (REGIONS, SERVING, Load, Regions, job_ids, on_sigterm_exit,
                     percentile, print_client, print_phases, progress, redundant)

CELL = "sw-a1"
LEASE = {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}
GOAL_PAUSE_SECONDS = 2.0
HANDED_OVER = re.compile(r"SwitchoverHandedOver: epoch (\d+) released to \S+ ([0-9.]+)s after "
                         r"writes stopped \(clean shutdown ([0-9.]+)s, standby replayed \S+ "
                         r"([0-9.]+)s later\)")
PROMOTED = re.compile(r": (\S+): promoted in ([0-9.]+)s, checkpointed in ([0-9.]+)s")


@dataclass(frozen=True)
class Run:
    number: int
    source: str
    target: str
    epoch: int
    stopped_after: float
    """Request -> the last acknowledgement before the longest gap (writes stop)."""
    pause: float
    """The longest gap between consecutive acknowledgements around the switchover."""
    first_new: float
    """Request -> the first acknowledgement after the target acquired the owner key."""
    released: float
    acquired: float
    handed_over: float | None
    """The owner's Event: writes stopped -> owner key released."""
    clean_shutdown: float | None
    replayed: float | None
    promotion: float | None
    takeover: float
    planned: bool
    lost: int
    report_lost: int
    """Rows the reconciliation report lists (jobs, updates, ledger, outbox)."""
    rebuilt_in: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    on_sigterm_exit()
    regions = Regions(keep=args.keep)
    load: Load | None = None
    runs: list[Run] = []
    error: BaseException | None = None
    try:
        tenant_id, load = regions.start_scene(CELL, LEASE, "globex", (f"/cellplane/groups/{CELL}/",))
        for number in range(1, args.runs + 1):
            try:
                run = one_run(regions, load, number, tenant_id)
            except (Exception, KeyboardInterrupt) as failure:  # the runs so far still count
                error = failure
                progress(f"run {number} failed: {type(failure).__name__}: {failure}")
                break
            runs.append(run)
            progress(f"run {number}: {run.source} -> {run.target}: pause {run.pause:.2f}s "
                     f"(writes stopped {run.stopped_after:.2f}s after the request), first write "
                     f"on the new site {run.first_new:.2f}s after it, handed over "
                     f"{_num(run.handed_over)}s, takeover {run.takeover:.2f}s, lost {run.lost}, "
                     f"report {run.report_lost}, rebuilt in {run.rebuilt_in:.1f}s")
        print_tables(runs, error, load)
    except BaseException as failure:
        error = failure
        raise
    finally:
        if load is not None:
            load.finish()
        regions.close(failed=error is not None)
    return 1 if error is not None else 0


def one_run(regions: Regions, load: Load, number: int, tenant_id: str) -> Run:
    before = regions.status(CELL)
    source = str(before["activeRegion"])
    target = next(r for r in ("region-a", "region-b") if r != source)
    epoch_before = int(before["epoch"])
    time.sleep(random.uniform(0, 2))  # any phase of the renewals
    offsets = {r: regions.operator_log(r).stat().st_size for r in (source, target)}
    requested = time.monotonic()
    regions.call(regions.client.patch(CELLS, CELL, {"metadata": {"annotations": {
        SWITCHOVER_TO: target}}}))
    status = regions.await_status(
        CELL, lambda s: s.get("activeRegion") == target and int(s.get("epoch") or 0) > epoch_before
        and s.get("phase") in SERVING
        and (s.get("lastTakeover") or {}).get("epoch") == s.get("epoch"),
        timeout=120, what=f"{target} to serve {CELL}")
    epoch = int(status["epoch"])
    load.wait_for(60)

    owner = regions.events_since(requested, f"/cellplane/groups/{CELL}/owner")
    released = next(w.at for w in owner if w.event.kind == "delete")
    acquired = next(w.at for w in owner
                    if w.event.kind == "put" and w.json().get("region") == target)
    acks = sorted(list(load.acks), key=lambda a: a.at)
    first_new = next(a.at for a in acks if a.at > acquired)
    last_before = max((a.at for a in acks if a.at <= requested), default=requested)
    around = [a.at for a in acks if last_before <= a.at <= first_new + 2.0]
    gaps = [(b - a, a) for a, b in zip(around, around[1:])]
    pause, pause_began = max(gaps) if gaps else (0.0, requested)
    handed = _last(HANDED_OVER, regions.operator_log(source), offsets[source])
    promoted = _last(PROMOTED, regions.operator_log(target), offsets[target],
                     lambda m: m.group(1) == f"{CELL}@{target}")

    acknowledged = load.acknowledged()
    lost = acknowledged - job_ids(regions.cell_database(CELL, target), tenant_id)
    progress(f"run {number}: {target} serves under epoch {epoch}; waiting for {source} to "
             "stream from it")
    waited = time.monotonic()
    status = regions.await_status(
        CELL, lambda s: (s.get("lastReconciliation") or {}).get("epoch") == epoch
        and redundant(s, source), timeout=300,
        what=f"{source} reported on and streaming from {target} again")
    report = regions.report(CELL, epoch)
    counts = report.counts()
    return Run(
        number=number, source=source, target=target, epoch=epoch,
        stopped_after=pause_began - requested, pause=pause, first_new=first_new - requested,
        released=released - requested, acquired=acquired - requested,
        handed_over=float(handed.group(2)) if handed else None,
        clean_shutdown=float(handed.group(3)) if handed else None,
        replayed=float(handed.group(4)) if handed else None,
        promotion=float(promoted.group(2)) if promoted else None,
        takeover=float(status["lastTakeover"]["seconds"]),
        planned=bool(status["lastTakeover"].get("planned")), lost=len(lost),
        report_lost=counts.jobs + counts.job_updates + counts.ledger_entries + counts.outbox_events,
        rebuilt_in=time.monotonic() - waited)


def _last(pattern: re.Pattern[str], log: Path, offset: int,
          accept: Callable[[re.Match[str]], bool] = lambda _: True) -> re.Match[str] | None:
    """The last line matching ``pattern`` that an operator logged since ``offset``."""
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    found = [m for m in pattern.finditer(text) if accept(m)]
    return found[-1] if found else None


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_tables(runs: list[Run], error: BaseException | None, load: Load) -> None:
    print(f"# Planned switchover: {len(REGIONS)} regions on 127.0.0.1 (an etcd member, an "
          f"operator on it, and the cell's site each; the router in region-c), lease "
          f"{LEASE['durationSeconds']} s / renew {LEASE['renewIntervalSeconds']} s / margin "
          f"{LEASE['marginSeconds']} s; {os.cpu_count()} CPUs shared with everything else on "
          "the machine")
    print()
    print("| run | from -> to | writes stop after request (s) | write pause (s) "
          "| request -> first write on new site (s) | owner key released (s) "
          "| acquired (s) | handed over (s) | clean shutdown (s) | standby replayed (s) "
          "| promotion (s) | lastTakeover (s) | planned | lost acked jobs | report rows "
          "| rebuilt in (s) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in runs:
        print(f"| {r.number} | {r.source} -> {r.target} | {r.stopped_after:.2f} | {r.pause:.2f} "
              f"| {r.first_new:.2f} | {r.released:.2f} | {r.acquired:.2f} "
              f"| {_num(r.handed_over)} | {_num(r.clean_shutdown)} | {_num(r.replayed)} "
              f"| {_num(r.promotion)} | {r.takeover:.2f} | {'yes' if r.planned else 'NO'} "
              f"| {r.lost} | {r.report_lost} | {r.rebuilt_in:.1f} |")
    print()
    if not runs:
        print(f"No run completed: {error}")
        return
    pauses = [r.pause for r in runs]
    firsts = [r.first_new for r in runs]
    p99 = percentile(pauses, 99)
    print("| runs | write pause p50 / p99 / max (s) "
          "| request -> first new write p50 / p99 / max (s) "
          "| goal pause <= 2 s | lost acked jobs total | report rows total |")
    print("|---:|---|---|---|---:|---:|")
    print(f"| {len(runs)} | {percentile(pauses, 50):.2f} / {p99:.2f} / {max(pauses):.2f} "
          f"| {percentile(firsts, 50):.2f} / {percentile(firsts, 99):.2f} / {max(firsts):.2f} "
          f"| {'met' if max(pauses) <= GOAL_PAUSE_SECONDS else 'NOT met'} "
          f"| {sum(r.lost for r in runs)} | {sum(r.report_lost for r in runs)} |")
    print()
    phases: list[tuple[str, list[float]]] = [
        ("request -> writes stop (the owner's next pass)", [r.stopped_after for r in runs]),
        ("writes stop -> owner key released (owner's Event)",
         [r.handed_over for r in runs if r.handed_over is not None]),
        ("  of which clean shutdown",
         [r.clean_shutdown for r in runs if r.clean_shutdown is not None]),
        ("  of which standby replay of the last WAL",
         [r.replayed for r in runs if r.replayed is not None]),
        ("owner key released -> acquired by the target", [r.acquired - r.released for r in runs]),
        ("acquired -> first write on the new site", [r.first_new - r.acquired for r in runs]),
        ("promotion (log)", [r.promotion for r in runs if r.promotion is not None]),
    ]
    print_phases("where the pause goes", phases)
    print_client(load, outages=False)
    print("- Times from the request (the annotation's patch sent, time.monotonic() of this "
          "process); owner key times are when this process's etcd watch (region-c's member) "
          "delivered them. The pause is the longest gap between consecutive acknowledgements "
          "from the last one before the request to 2 s after the first on the new site.")
    if error is not None:
        print(f"- Stopped after {len(runs)} run(s): {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
