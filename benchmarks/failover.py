"""Losing the active region under load: how long until the cell takes writes again, and
what the loss costs.

    .venv/bin/python benchmarks/failover.py [--runs 20] [--lease 10] [--renew 2] [--margin 2]
        [--apiserver up|paused|both] [--keep]

Set up once (benchmarks/regions.py): three regions, each with its etcd member and its
operator on that member only; the router in region-c; one cell homed in region-a with a
standby in region-b, with the product's lease (10 s, renewed every 2 s, 2 s margin) by
default; one enterprise tenant pinned to it; a client submitting about 30 jobs a second
through the router, each key until it is acknowledged.

Each run kills, by SIGKILL, every process of the region that holds the active site (its
operator, its etcd member, its Postgres and cell processes) at a random phase of the
lease renewals, and measures from the kill:

- the owner key's deletion (etcd expiring the lease), seen by a watch on region-c's
  member; the new owner's acquisition (the owner key written by the survivor); the
  survivor's site report serving under the new epoch; the first write (202) the client
  gets through the router: the RTO;
- the floor: the owner key's deletion + the margin + the promotion (the new owner's log
  line "promoted in X s");
- lastTakeover.seconds from the Cell's status; the standby's lag as last reported (its
  site report in etcd) before the kill.

Then the region is restored (etcd member, operator) and the run waits until its old
primary is fenced, reported on (status.lastReconciliation of the new epoch) and streams
as a standby again: acknowledged jobs missing from the new primary are counted, and
checked against the jobs the reconciliation report lists. The next run kills the other
region. Progress to stderr, the tables to stdout.

``--apiserver paused`` stops the real kube-apiserver (SIGSTOP: connections accepted, never
answered) just before the kill and lets it go on (SIGCONT) once the first write after the
kill was acknowledged through the router; ``both`` alternates the two over the runs, so the
two RTOs are measured side by side on the same plane (issue #18: failover must not wait
on Kubernetes; goal: the paused p50 within 0.5 s of the normal one).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from regions import (REGIONS, SERVING, Load, Regions, job_ids, on_sigterm_exit,
                     percentile, print_client, print_phases, progress, redundant)

CELL = "fo-a1"
GOAL_P99_SECONDS = 15.0
GOAL_PAUSED_P50_SECONDS = 0.5
"""The RTO's p50 with the apiserver paused may exceed the normal one by at most this."""
PROMOTED = re.compile(r": (\S+): promoted in ([0-9.]+)s, checkpointed in ([0-9.]+)s")


@dataclass(frozen=True)
class Run:
    number: int
    killed: str
    survivor: str
    epoch: int
    leader_killed: bool
    """The killed etcd member was the raft leader (a new leader extends every lease)."""
    lag_before: float | None
    owner_gone: float
    acquired: float
    serving: float
    rto: float
    takeover: float
    promotion: float | None
    floor: float
    late_acks: int
    """Acknowledgements after the kill but before the owner key was gone (the old site's)."""
    last_late: float | None
    lost: int
    """Acknowledged jobs the new primary lacks (new in this run)."""
    lost_reported: int
    """Of those, listed by the reconciliation report."""
    report_jobs: int
    loss_window: float | None
    rebuilt_in: float
    apiserver: str = "up"
    """``up``, or ``paused`` from just before the kill to the first write after it."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lease", type=int, default=10, help="lease duration, seconds")
    parser.add_argument("--renew", type=float, default=2.0, help="renew interval, seconds")
    parser.add_argument("--margin", type=float, default=2.0, help="clock margin, seconds")
    parser.add_argument("--apiserver", choices=("up", "paused", "both"), default="up",
                        help="keep the kube-apiserver up, pause it (SIGSTOP) from the kill to "
                             "the first write after it, or alternate the two")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    on_sigterm_exit()
    lease = {"durationSeconds": args.lease, "renewIntervalSeconds": args.renew,
             "marginSeconds": args.margin}
    regions = Regions(keep=args.keep)
    load: Load | None = None
    runs: list[Run] = []
    error: BaseException | None = None
    try:
        tenant_id, load = regions.start_scene(
            CELL, lease, "acme", (f"/cellplane/groups/{CELL}/", f"/cellplane/cells/{CELL}/sites/"))
        lost_so_far: set[str] = set()
        for number in range(1, args.runs + 1):
            paused = args.apiserver == "paused" or (args.apiserver == "both" and number % 2 == 0)
            try:
                run = one_run(regions, load, number, tenant_id, args, lost_so_far, paused=paused)
            except (Exception, KeyboardInterrupt) as failure:  # the runs so far still count
                error = failure
                progress(f"run {number} failed: {type(failure).__name__}: {failure}")
                break
            runs.append(run)
            progress(f"run {number} (apiserver {run.apiserver}): killed {run.killed}: "
                     f"rto {run.rto:.2f}s (owner gone "
                     f"{run.owner_gone:.2f}s, acquired {run.acquired:.2f}s, serving "
                     f"{run.serving:.2f}s), floor {run.floor:.2f}s, takeover {run.takeover:.2f}s, "
                     f"promotion {_num(run.promotion)}s, lag before {_num(run.lag_before)}s, "
                     f"lost {run.lost} (reported {run.lost_reported}, report jobs "
                     f"{run.report_jobs}), old site's acks after the kill {run.late_acks}, "
                     f"rebuilt in {run.rebuilt_in:.1f}s")
        print_tables(runs, args, error, load)
    except BaseException as failure:
        error = failure
        raise
    finally:
        if load is not None:
            load.finish()
        regions.close(failed=error is not None)
    return 1 if error is not None else 0


def one_run(regions: Regions, load: Load, number: int, tenant_id: str, args: argparse.Namespace,
            lost_so_far: set[str], *, paused: bool = False) -> Run:
    before = regions.status(CELL)
    killed = str(before["activeRegion"])
    survivor = next(r for r in ("region-a", "region-b") if r != killed)
    epoch_before = int(before["epoch"])
    # A random phase of the renewals, so the lease left at the kill is spread as it would be.
    time.sleep(random.uniform(0, args.renew))
    standby = regions.site_report(CELL, survivor)
    lag_before = standby.lag_seconds if standby is not None else None
    leader = regions.kube.etcd.leader()
    log = regions.operator_log(survivor)
    log_offset = log.stat().st_size
    apiserver = regions.kube.apiserver.process if regions.kube.apiserver is not None else None
    if paused:
        assert apiserver is not None and apiserver.pid is not None
        os.kill(apiserver.pid, signal.SIGSTOP)
    try:
        killed_at = regions.kill_region(killed)
        progress(f"run {number}: killed {killed} (etcd leader was {leader}"
                 f"{', apiserver paused' if paused else ''}); waiting for {survivor}")
        if paused:
            _await_first_write(regions, load, killed_at, timeout=args.lease * 3 + 120)
            progress(f"run {number}: first write {time.monotonic() - killed_at:.1f}s after the "
                     "kill; the apiserver goes on")
    finally:
        if paused:
            assert apiserver is not None and apiserver.pid is not None
            os.kill(apiserver.pid, signal.SIGCONT)
    status = regions.await_status(
        CELL, lambda s: s.get("activeRegion") == survivor
        and int(s.get("epoch") or 0) > epoch_before and s.get("phase") in SERVING
        and (s.get("lastTakeover") or {}).get("epoch") == s.get("epoch"),
        timeout=args.lease * 3 + 120, what=f"{survivor} to serve {CELL}")
    epoch = int(status["epoch"])
    progress(f"run {number}: status says {survivor} serves, {time.monotonic() - killed_at:.1f}s "
             "after the kill")
    load.wait_for(20)

    owner_events = regions.events_since(killed_at, f"/cellplane/groups/{CELL}/owner")
    gone = next(w.at for w in owner_events if w.event.kind == "delete")
    acquired = next(w.at for w in owner_events
                    if w.event.kind == "put" and w.json().get("region") == survivor)
    site_events = regions.events_since(killed_at, f"/cellplane/cells/{CELL}/sites/{survivor}")
    serving = next(w.at for w in site_events if w.event.kind == "put"
                   and w.json().get("serving") and w.json().get("epoch") == epoch)
    # Only the old site can acknowledge before its owner key is gone: such an ack is an
    # answer that was on its way at the kill (or a site that outlived it), not the RTO.
    late = [a.at - killed_at for a in list(load.acks) if killed_at < a.at < gone]
    first_write = next(a.at for a in list(load.acks) if a.at > gone and a.status == 202)
    promotion = _promotion(log, log_offset, f"{CELL}@{survivor}")
    owner_gone = gone - killed_at

    progress(f"run {number}: {survivor} serves under epoch {epoch}; restoring {killed}")
    restored_at = time.monotonic()
    regions.restore_region(killed)
    status = regions.await_status(
        CELL, lambda s: (s.get("lastReconciliation") or {}).get("epoch") == epoch
        and redundant(s, killed), timeout=600,
        what=f"{killed} fenced, reported on and streaming from {survivor} again")
    rebuilt_in = time.monotonic() - restored_at

    acknowledged = load.acknowledged()
    missing = acknowledged - job_ids(regions.cell_database(CELL, survivor), tenant_id)
    new_missing = missing - lost_so_far
    lost_so_far |= missing
    report = regions.report(CELL, epoch)
    reported = {str(job.job_id) for job in report.jobs}
    loss_window = (status.get("lastReconciliation") or {}).get("lossWindowSeconds")
    return Run(
        number=number, killed=killed, survivor=survivor, epoch=epoch,
        leader_killed=leader == killed, lag_before=lag_before, owner_gone=owner_gone,
        acquired=acquired - killed_at, serving=serving - killed_at, rto=first_write - killed_at,
        takeover=float(status["lastTakeover"]["seconds"]), promotion=promotion,
        floor=owner_gone + args.margin + (promotion or 0.0), late_acks=len(late),
        last_late=max(late) if late else None,
        lost=len(new_missing), lost_reported=len(new_missing & reported),
        report_jobs=len(report.jobs),
        loss_window=float(loss_window) if loss_window is not None else None,
        rebuilt_in=rebuilt_in, apiserver="paused" if paused else "up")


def _await_first_write(regions: Regions, load: Load, killed_at: float, *, timeout: float) -> None:
    """Until a write is acknowledged through the router after the owner key was gone: etcd
    and the client only, since the apiserver answers nothing meanwhile."""
    key = f"/cellplane/groups/{CELL}/owner"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gone = next((w.at for w in regions.events_since(killed_at, key)
                     if w.event.kind == "delete"), None)
        if gone is not None and any(a.at > gone and a.status == 202 for a in list(load.acks)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no write acknowledged within {timeout:g}s of the kill with the "
                       "apiserver paused")


def _promotion(log: Path, offset: int, site: str) -> float | None:
    """Seconds of the promotion, from the new owner's log line "<site>: promoted in Xs"."""
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    found = [float(m.group(2)) for m in PROMOTED.finditer(text) if m.group(1) == site]
    return found[-1] if found else None


def print_side_by_side(runs: list[Run]) -> None:
    """The RTO with the apiserver up and paused, over the same plane and session."""
    by_mode = {mode: [r for r in runs if r.apiserver == mode] for mode in ("up", "paused")}
    if not by_mode["paused"]:
        return
    print("| apiserver | runs | RTO p50 / p99 / max (s) | acquired p50 (s) | serving p50 (s) "
          "| lastTakeover p50 (s) |")
    print("|---|---:|---|---:|---:|---:|")
    for mode, chosen in by_mode.items():
        if not chosen:
            continue
        rto = [r.rto for r in chosen]
        print(f"| {mode} | {len(chosen)} | {percentile(rto, 50):.2f} / {percentile(rto, 99):.2f}"
              f" / {max(rto):.2f} | {percentile([r.acquired for r in chosen], 50):.2f} "
              f"| {percentile([r.serving for r in chosen], 50):.2f} "
              f"| {percentile([r.takeover for r in chosen], 50):.2f} |")
    if by_mode["up"]:
        gap = (percentile([r.rto for r in by_mode["paused"]], 50)
               - percentile([r.rto for r in by_mode["up"]], 50))
        print(f"\nRTO p50 paused - up: {gap:+.2f} s (goal <= {GOAL_PAUSED_P50_SECONDS} s: "
              f"{'met' if gap <= GOAL_PAUSED_P50_SECONDS else 'NOT met'})")
    print()


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_tables(runs: list[Run], args: argparse.Namespace, error: BaseException | None,
                 load: Load) -> None:
    print(f"# Region loss: {len(REGIONS)} regions on 127.0.0.1 (an etcd member, an operator on "
          f"it, and the cell's site each; the router in region-c), lease {args.lease} s / renew "
          f"{args.renew:g} s / margin {args.margin:g} s; {os.cpu_count()} CPUs shared with "
          "everything else on the machine")
    print()
    print("| run | apiserver | killed | etcd leader killed | standby lag before (s) | owner key gone (s) "
          "| acquired (s) | serving (s) | RTO: first 202 (s) | floor (s) | lastTakeover (s) "
          "| promotion (s) | lost acked jobs | of them in report | report jobs "
          "| loss window (s) | old site's acks after kill | rebuilt in (s) |")
    print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in runs:
        print(f"| {r.number} | {r.apiserver} | {r.killed} | {'yes' if r.leader_killed else 'no'} "
              f"| {_num(r.lag_before)} | {r.owner_gone:.2f} | {r.acquired:.2f} | {r.serving:.2f} "
              f"| {r.rto:.2f} | {r.floor:.2f} | {r.takeover:.2f} | {_num(r.promotion)} | {r.lost} "
              f"| {r.lost_reported} | {r.report_jobs} | {_num(r.loss_window)} "
              f"| {r.late_acks}{f' (last {r.last_late:.3f} s)' if r.last_late is not None else ''} "
              f"| {r.rebuilt_in:.1f} |")
    print()
    if not runs:
        print(f"No run completed: {error}")
        return
    rto = [r.rto for r in runs]
    floor = [r.floor for r in runs]
    lags = [r.lag_before for r in runs if r.lag_before is not None]
    p99 = percentile(rto, 99)
    not_reported = sum(r.lost - r.lost_reported for r in runs)
    print("| runs | RTO p50 / p99 / max (s) | floor p50 / max (s) | goal p99 <= 15 s "
          "| lost acked jobs total / per run max | standby lag at kill p50 / max (s) "
          "| lost acked jobs not in report |")
    print("|---:|---|---|---|---|---|---:|")
    print(f"| {len(runs)} | {percentile(rto, 50):.2f} / {p99:.2f} / {max(rto):.2f} "
          f"| {percentile(floor, 50):.2f} / {max(floor):.2f} "
          f"| {'met' if p99 <= GOAL_P99_SECONDS else 'NOT met'} "
          f"| {sum(r.lost for r in runs)} / {max(r.lost for r in runs)} "
          f"| {_num(percentile(lags, 50) if lags else None)} / {_num(max(lags) if lags else None)} "
          f"| {not_reported} |")
    print()
    print_side_by_side(runs)
    phases: list[tuple[str, list[float]]] = [
        ("kill -> owner key gone (lease left)", [r.owner_gone for r in runs]),
        ("owner key gone -> acquired (margin, CAS)", [r.acquired - r.owner_gone for r in runs]),
        ("acquired -> site serving (promotion, processes)", [r.serving - r.acquired for r in runs]),
        ("serving -> first 202 through the router", [r.rto - r.serving for r in runs]),
        ("promotion (log)", [r.promotion for r in runs if r.promotion is not None]),
        ("RTO - floor", [r.rto - r.floor for r in runs]),
    ]
    print_phases("where the RTO goes", phases)
    print_client(load, outages=True)
    print("- Times from the kill (time.monotonic() of this process); owner key and site report "
          "times are when this process's etcd watch (on region-c's member) delivered them. "
          "Floor = owner key gone + margin + promotion.")
    print("- The RTO is the first 202 after the owner key was gone: the new site cannot "
          "accept before it acquires the key. An acknowledgement between the kill and then is "
          "an answer of the old site that was on its way at the kill (\"old site's acks after "
          "kill\", with how late the last one came); more than a few, or late ones, would mean "
          "a process of the killed region outlived the kill.")
    print("- Lost acked jobs: acknowledged to the client, missing from the new primary after "
          "the run; 'in report' counts those the run's reconciliation report lists (must be all).")
    if error is not None:
        print(f"- Stopped after {len(runs)} run(s): {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
