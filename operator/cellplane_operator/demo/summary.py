"""What the demo concludes from what it saw: the counts, the invariants, the table.

Pure on purpose: the runner gathers plain data (acknowledgements, the job rows
of every cell, the calls the job target recorded, the running-slot samples, the
reconciliation report's job ids) and this module decides. The unit tests feed it
made-up observations of every kind of failure, which a real run rarely shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_INVARIANT", "EXIT_INTERRUPTED",
    "StepCall", "RunningSample", "JobCounts", "MoveOutcome", "RegionLoss", "NoisyShare",
    "Invariant", "DemoSummary", "count_jobs", "jobs_run_twice", "noisy_share",
    "check_invariants", "render_table", "timeline_line", "step_call", "first_ack_after",
]

EXIT_OK = 0
EXIT_FAILED = 1
"""A step of the demo did not happen in time (the message says which); nothing was judged."""
EXIT_BAD_INPUT = 2
"""Nothing was started: a port is taken, another demo runs, or the arguments are wrong."""
EXIT_INVARIANT = 3
"""The demo ran to its end and an invariant broke (the summary says which)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM before the summary: everything was stopped."""


@dataclass(frozen=True)
class StepCall:
    """One call the job target received."""

    tenant_id: str
    submission: str
    """The client's idempotency key of the submission, carried in the job's payload."""
    job_id: str
    step: int
    idempotency_key: str
    """The cell's key of the step call, stable across retries of the same step."""


@dataclass(frozen=True)
class RunningSample:
    """Slots in use per tenant of one cell, read at one instant from its database."""

    at: float
    running: Mapping[str, int]
    """tenant id -> running jobs."""


@dataclass(frozen=True)
class JobCounts:
    accepted: int
    """Jobs a router acknowledged (202, or 200 replaying an earlier acceptance)."""
    completed: int
    """Of them, succeeded in some cell by the end."""
    unfinished: int
    """Present but not succeeded by the end (still queued or running: not a loss)."""
    lost: tuple[str, ...]
    """Acknowledged, and in no cell's database at the end."""
    lost_in_report: tuple[str, ...]
    """Of the lost, those the reconciliation report lists."""
    run_twice: tuple[str, ...]
    """Submissions whose steps reached the target as two jobs, or under two keys."""
    refused: int = 0
    """Submissions answered 429 (rate limit) and tried again later: never acknowledged."""

    @property
    def lost_not_in_report(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.lost) - set(self.lost_in_report)))


@dataclass(frozen=True)
class MoveOutcome:
    tenant: str
    source: str
    target: str
    phase: str
    pause_seconds: float | None
    budget_seconds: float
    rows_copied: int | None = None
    seconds: float | None = None
    """The whole move, from the TenantMove's creation to Completed."""


@dataclass(frozen=True)
class RegionLoss:
    region: str
    cell: str
    rto_seconds: float | None
    """From the kill to the first new job acknowledged for the cell's tenants, counting only
    requests sent after the kill (an answer already on its way is not a recovery)."""
    epoch_before: int
    epoch_after: int
    new_region: str
    takeover_seconds: float | None = None
    """The new owner's own measure (Cell status lastTakeover.seconds)."""
    old_primary_fenced: bool = False
    rebuilt_as_standby: bool = False
    report_jobs: int | None = None
    lost_wal_bytes: int | None = None


@dataclass(frozen=True)
class NoisyShare:
    tenant: str
    cap: int
    """Its running-jobs cap (maxRunningJobs)."""
    cell_slots: int
    peak_running: int
    samples: int
    mean_share_of_running: float
    """Mean over samples of its running jobs / every running job of the cell."""

    @property
    def cap_share(self) -> float:
        return self.cap / self.cell_slots if self.cell_slots else 0.0

    @property
    def peak_share(self) -> float:
        return self.peak_running / self.cell_slots if self.cell_slots else 0.0


@dataclass(frozen=True)
class Invariant:
    name: str
    held: bool
    detail: str


@dataclass(frozen=True)
class DemoSummary:
    mode: str
    seconds: float
    jobs: JobCounts
    move: MoveOutcome
    region_loss: RegionLoss
    noisy: NoisyShare | None
    """None where the story has no noisy tenant (the cluster's: two tenants, one load each)."""
    tenants: Mapping[str, str]
    """namespace/name -> phase at the end."""
    invariants: tuple[Invariant, ...] = field(default=())
    driver: str = "local"
    """The site driver the cells ran on: ``local`` (processes) or ``kubernetes`` (Pods)."""

    @property
    def broken(self) -> tuple[Invariant, ...]:
        return tuple(i for i in self.invariants if not i.held)

    @property
    def exit_code(self) -> int:
        return EXIT_INVARIANT if self.broken else EXIT_OK

    def to_json(self) -> str:
        document: dict[str, Any] = asdict(self)
        document["jobs"]["lost_not_in_report"] = list(self.jobs.lost_not_in_report)
        if self.noisy is not None:
            document["noisy"]["cap_share"] = round(self.noisy.cap_share, 4)
            document["noisy"]["peak_share"] = round(self.noisy.peak_share, 4)
        document["broken"] = [i.name for i in self.broken]
        document["exit_code"] = self.exit_code
        return json.dumps(document, sort_keys=True)


def count_jobs(*, acknowledged: Mapping[str, str], statuses: Mapping[str, str],
               reported: Iterable[str], calls: Iterable[StepCall], refused: int = 0) -> JobCounts:
    """``acknowledged``: job id -> the client's idempotency key; ``statuses``: job id -> its
    best status over every cell (a moved tenant's rows are in two); ``reported``: job ids the
    reconciliation report lists."""
    lost = sorted(job for job in acknowledged if job not in statuses)
    in_report = set(reported)
    return JobCounts(
        accepted=len(acknowledged),
        completed=sum(1 for job in acknowledged if statuses.get(job) == "succeeded"),
        unfinished=sum(1 for job in acknowledged
                       if job in statuses and statuses[job] != "succeeded"),
        lost=tuple(lost), lost_in_report=tuple(job for job in lost if job in in_report),
        run_twice=jobs_run_twice(calls), refused=refused)


def step_call(body: Mapping[str, Any], idempotency_key: str) -> StepCall | None:
    """The call a job target received, as the demo counts it; None for a body that is not a
    step of the demo's jobs (their payload carries the client's key under ``key``)."""
    try:
        payload = body.get("payload") or {}
        return StepCall(tenant_id=str(body["tenant"]), submission=str(payload.get("key", "")),
                        job_id=str(body["job_id"]), step=int(body["step"]),
                        idempotency_key=idempotency_key)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def first_ack_after(ack_times: Iterable[float], moment: float) -> float | None:
    """Seconds from ``moment`` to the first acknowledgement after it (None: none came)."""
    later = [at for at in ack_times if at > moment]
    return min(later) - moment if later else None


def jobs_run_twice(calls: Iterable[StepCall]) -> tuple[str, ...]:
    """Submissions that ran twice: a step of theirs reached the target from two different
    jobs (the submission was duplicated) or under two different step keys (a step was
    started afresh rather than retried). A retry under the same key is what a target
    deduplicates, so it is not counted."""
    jobs: dict[tuple[str, str], set[str]] = {}
    keys: dict[tuple[str, str, int], set[str]] = {}
    for call in calls:
        jobs.setdefault((call.tenant_id, call.submission), set()).add(call.job_id)
        keys.setdefault((call.tenant_id, call.submission, call.step), set()).add(
            call.idempotency_key)
    twice = {submission for (_, submission), seen in jobs.items() if len(seen) > 1}
    twice |= {submission for (_, submission, _), seen in keys.items() if len(seen) > 1}
    return tuple(sorted(twice))


def noisy_share(samples: Iterable[RunningSample], *, tenant: str, tenant_id: str, cap: int,
                cell_slots: int) -> NoisyShare:
    peak, shares, count = 0, [], 0
    for sample in samples:
        count += 1
        mine = sample.running.get(tenant_id, 0)
        peak = max(peak, mine)
        everyone = sum(sample.running.values())
        if everyone:
            shares.append(mine / everyone)
    return NoisyShare(tenant=tenant, cap=cap, cell_slots=cell_slots, peak_running=peak,
                      samples=count,
                      mean_share_of_running=round(sum(shares) / len(shares), 4) if shares else 0.0)


def check_invariants(*, jobs: JobCounts, move: MoveOutcome, region_loss: RegionLoss,
                     noisy: NoisyShare | None,
                     tenants: Mapping[str, str]) -> tuple[Invariant, ...]:
    """Every invariant the story can judge; the noisy tenant's only where it had one."""
    unready = sorted(name for name, phase in tenants.items() if phase != "Ready")
    missing = jobs.lost_not_in_report
    return tuple(invariant for invariant in (
        Invariant("no acknowledged job lost unless in the report", not missing,
                  f"{len(jobs.lost)} lost, {len(jobs.lost_in_report)} of them in the report"
                  + (f"; not reported: {', '.join(missing[:5])}" if missing else "")),
        Invariant("nothing run twice", not jobs.run_twice,
                  f"{len(jobs.run_twice)} submission(s) ran twice"
                  + (f": {', '.join(jobs.run_twice[:5])}" if jobs.run_twice else "")),
        Invariant("every tenant Ready at the end", bool(tenants) and not unready,
                  f"{len(tenants) - len(unready)}/{len(tenants)} Ready"
                  + (f"; not Ready: {', '.join(f'{n} ({tenants[n]})' for n in unready)}"
                     if unready else "")),
        None if noisy is None else Invariant(
            "the noisy tenant held within its cap",
            noisy.samples > 0 and noisy.peak_running <= noisy.cap,
            f"peak {noisy.peak_running} running of cap {noisy.cap} over "
            f"{noisy.samples} samples"),
        Invariant("the move completed within its write-pause budget",
                  move.phase == "Completed" and move.pause_seconds is not None
                  and move.pause_seconds <= move.budget_seconds,
                  f"{move.phase}, pause {_seconds(move.pause_seconds, 3)} of "
                  f"{move.budget_seconds:g} s"),
        Invariant("the lost region's cell served again", region_loss.rto_seconds is not None
                  and region_loss.epoch_after > region_loss.epoch_before,
                  f"epoch {region_loss.epoch_before} -> {region_loss.epoch_after}, RTO "
                  f"{_seconds(region_loss.rto_seconds, 2)}"),
    ) if invariant is not None)


def render_table(summary: DemoSummary) -> str:
    """The closing table: one row per measure, then one per invariant."""
    jobs, move, loss, noisy = summary.jobs, summary.move, summary.region_loss, summary.noisy
    ready = sum(1 for phase in summary.tenants.values() if phase == "Ready")
    rows = [
        ("jobs accepted (acknowledged by a router)", f"{jobs.accepted:,}"
         + (f"  ({jobs.refused:,} submissions refused 429 and retried)" if jobs.refused else "")),
        ("jobs completed", f"{jobs.completed:,}"
         + (f"  ({jobs.unfinished:,} still queued or running)" if jobs.unfinished else "")),
        ("jobs lost (acknowledged, in no cell)",
         f"{len(jobs.lost)}  ({len(jobs.lost_in_report)} in the reconciliation report, "
         f"{len(jobs.lost_not_in_report)} not)"),
        ("jobs run twice", f"{len(jobs.run_twice)}"),
        (f"move {move.tenant} {move.source} -> {move.target}",
         f"{move.phase}, writes paused {_seconds(move.pause_seconds, 3)} "
         f"(budget {move.budget_seconds:g} s)"
         + (f", {move.rows_copied:,} rows in {move.seconds:.1f} s"
            if move.rows_copied is not None and move.seconds is not None else "")),
        (f"{loss.region} lost: RTO of {loss.cell}",
         f"{_seconds(loss.rto_seconds, 2)} kill -> first write through a router "
         f"(epoch {loss.epoch_before} -> {loss.epoch_after}, now in {loss.new_region}"
         + (f", takeover {loss.takeover_seconds:.2f} s" if loss.takeover_seconds is not None
            else "") + ")"),
        (f"old primary in {loss.region}",
         ", ".join(part for part in (
             "fenced" if loss.old_primary_fenced else "NOT seen fenced",
             "rebuilt as a standby" if loss.rebuilt_as_standby else "not rebuilt",
             f"report: {loss.report_jobs} job(s), {loss.lost_wal_bytes} WAL bytes past the fork"
             if loss.report_jobs is not None else "no report") if part)),
    ]
    if noisy is not None:
        rows.append((f"noisy tenant {noisy.tenant}: running slots",
                     f"peak {noisy.peak_running} of cap {noisy.cap} = {noisy.peak_share:.0%} "
                     f"of {noisy.cell_slots} slots (cap share {noisy.cap_share:.0%}); "
                     f"{noisy.mean_share_of_running:.0%} of running jobs on average, "
                     f"{noisy.samples} samples"))
    rows += [
        ("tenants Ready at the end", f"{ready}/{len(summary.tenants)}"),
    ]
    rows += [(f"invariant: {i.name}", ("held" if i.held else "BROKEN") + f"  ({i.detail})")
             for i in summary.invariants]
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    lines = [rule, *(f"{name.ljust(width)}  {value}" for name, value in rows), rule]
    if summary.broken:
        lines.append(f"BROKEN: {'; '.join(i.name for i in summary.broken)} "
                     f"(exit {EXIT_INVARIANT})")
    else:
        lines.append(f"every invariant held; {summary.mode} run ({summary.driver} driver) in "
                     f"{summary.seconds:.0f} s")
    return "\n".join(lines) + "\n"


def timeline_line(elapsed: float, message: str) -> str:
    """``[demo  12.3s] message``: seconds since the demo started, aligned up to 9999 s."""
    return f"[demo {elapsed:6.1f}s] {message}"


def _seconds(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"
