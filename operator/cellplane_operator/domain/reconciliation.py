"""What an old primary committed that its promoted standby never received.

Replication to a standby is asynchronous, so after a region loss the promoted
standby lacks whatever the old primary committed past the fork point, and that
is gone for good once the old primary is rebuilt as the new one's standby. This
module compares the two sites' rows and says, per tenant, what was lost: for
people (``render_text``) and for the Cell's status (``summary``).

Rows are matched by natural key (a job by its id, a ledger entry by its job and
kind, an outbox event by its id), never by a sequence value: after the fork both
primaries hand out the same ``entry_id`` to different entries.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union
from uuid import UUID

__all__ = [
    "TERMINAL_STATUSES",
    "JobRow",
    "LedgerRow",
    "OutboxRow",
    "IdempotencyKeyRow",
    "SiteSnapshot",
    "LostJob",
    "LostJobUpdate",
    "LostLedgerEntry",
    "LostOutboxEvent",
    "LostCounts",
    "ReconciliationReport",
    "TimelineSwitch",
    "compare_sites",
    "fit_report",
    "lsn_to_int",
    "parse_timeline_history",
    "fork_point",
]

TERMINAL_STATUSES = frozenset({"succeeded", "dead", "cancelled", "expired"})
REPORT_VERSION = 1


# -- what a site holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    tenant_id: str
    job_id: UUID
    status: str
    claim_epoch: int
    """Counts the job's claims: it grows on every claim and never goes back."""
    created_at: datetime.datetime
    finished_at: datetime.datetime | None = None


@dataclass(frozen=True)
class LedgerRow:
    # No entry_id: it comes from a sequence, and the two primaries' sequences
    # hand out the same values after the fork.
    tenant_id: str
    job_id: UUID
    kind: str
    """reserve, settle or refund: one entry per job and kind."""
    amount: int
    """Micro-credits."""
    created_at: datetime.datetime


@dataclass(frozen=True)
class OutboxRow:
    tenant_id: str
    event_id: UUID
    job_id: UUID | None
    kind: str
    created_at: datetime.datetime
    delivered: bool = False
    """At least one of the tenant's webhook endpoints acknowledged the event."""


@dataclass(frozen=True)
class IdempotencyKeyRow:
    tenant_id: str
    key: str
    job_id: UUID


@dataclass(frozen=True)
class SiteSnapshot:
    """One site's rows as of one moment, each table keyed by its natural key."""

    jobs: Mapping[UUID, JobRow] = field(default_factory=dict)
    ledger: Mapping[tuple[UUID, str], LedgerRow] = field(default_factory=dict)
    """By (job_id, kind)."""
    outbox: Mapping[UUID, OutboxRow] = field(default_factory=dict)
    idempotency_keys: Mapping[UUID, IdempotencyKeyRow] = field(default_factory=dict)
    """By the job the key created."""
    cell: str | None = None
    """The cell the site's placement group belongs to."""
    read_at: datetime.datetime | None = None
    """The site database's own clock when the snapshot was taken."""

    @classmethod
    def of(cls, *, jobs: Iterable[JobRow] = (), ledger: Iterable[LedgerRow] = (),
           outbox: Iterable[OutboxRow] = (), idempotency_keys: Iterable[IdempotencyKeyRow] = (),
           cell: str | None = None, read_at: datetime.datetime | None = None) -> SiteSnapshot:
        return cls(jobs={row.job_id: row for row in jobs},
                   ledger={(row.job_id, row.kind): row for row in ledger},
                   outbox={row.event_id: row for row in outbox},
                   idempotency_keys={row.job_id: row for row in idempotency_keys},
                   cell=cell, read_at=read_at)


# -- what was lost -------------------------------------------------------------------------


@dataclass(frozen=True)
class LostJob:
    tenant_id: str
    job_id: UUID
    idempotency_key: str | None
    status: str
    """The job's status on the old primary."""
    created_at: datetime.datetime
    resubmitted_as: UUID | None = None
    """The new primary's job under the same idempotency key: the client retried after the
    failover and the new primary, not knowing the key, accepted the request again."""


@dataclass(frozen=True)
class LostJobUpdate:
    """A job both primaries have, whose status moved on only on the old one."""

    tenant_id: str
    job_id: UUID
    old_status: str
    """What the old primary committed, and the new one lacks."""
    new_status: str
    """What the new primary has."""
    idempotency_key: str | None = None
    finished_at: datetime.datetime | None = None
    """When the job finished on the old primary, if it did."""


LostLedgerEntry = LedgerRow
"""A ledger entry the new primary lacks: the old primary's row as it was."""

LostOutboxEvent = OutboxRow
"""An outbox event the new primary lacks: the old primary's row as it was (``delivered``:
a webhook endpoint of the tenant acknowledged it, so the tenant heard of something the new
primary knows nothing about)."""


@dataclass(frozen=True)
class LostCounts:
    jobs: int
    job_updates: int
    ledger_entries: int
    outbox_events: int
    tenants: int


@dataclass(frozen=True)
class ReconciliationReport:
    cell: str
    epoch: int
    """The new owner's epoch: the failover this report is about."""
    old_site: str
    new_site: str
    fork_lsn: str
    """Where the new primary's timeline began; the old primary's WAL past it never arrived."""
    old_end_lsn: str
    """The end of the old primary's WAL."""
    lost_wal_bytes: int
    """The old primary's WAL past the fork. An upper bound of what was lost: it also counts
    the fence's shutdown checkpoint and, with data checksums, the full-page images that
    merely reading freshly written rows logs (hint bits)."""
    old_lease_deadline: datetime.datetime | None
    """Until when the old primary's database accepted writes (by its own clock)."""
    first_lost_write_at: datetime.datetime | None
    last_old_write_at: datetime.datetime | None
    """The latest lost write of the old primary (by its own clock); None if nothing was lost."""
    created_at: datetime.datetime
    jobs: tuple[LostJob, ...] = ()
    job_updates: tuple[LostJobUpdate, ...] = ()
    ledger_entries: tuple[LostLedgerEntry, ...] = ()
    outbox_events: tuple[LostOutboxEvent, ...] = ()
    truncated_from: LostCounts | None = None
    """Set when the lists were cut to fit a ConfigMap: what the full report counted."""

    @property
    def nothing_lost(self) -> bool:
        return not (self.jobs or self.job_updates or self.ledger_entries or self.outbox_events
                    or self.truncated_from)

    def counts(self) -> LostCounts:
        if self.truncated_from is not None:
            return self.truncated_from
        return LostCounts(len(self.jobs), len(self.job_updates), len(self.ledger_entries),
                          len(self.outbox_events), len(self.tenants()))

    def tenants(self) -> list[str]:
        rows: Iterable[Any] = (*self.jobs, *self.job_updates, *self.ledger_entries,
                               *self.outbox_events)
        return sorted({row.tenant_id for row in rows})

    def loss_window_seconds(self) -> float:
        if self.first_lost_write_at is None or self.last_old_write_at is None:
            return 0.0
        return round((self.last_old_write_at - self.first_lost_write_at).total_seconds(), 3)

    def summary(self) -> dict[str, Any]:
        """Counts for the Cell's status (camelCase, JSON-ready)."""
        counts = self.counts()
        return {"jobs": counts.jobs, "jobUpdates": counts.job_updates,
                "ledgerEntries": counts.ledger_entries, "outboxEvents": counts.outbox_events,
                "tenantsAffected": counts.tenants, "lostWalBytes": self.lost_wal_bytes,
                "forkLsn": self.fork_lsn, "lossWindowSeconds": self.loss_window_seconds()}

    def to_json(self) -> str:
        document = {"version": REPORT_VERSION, **_encode(self), "summary": self.summary()}
        return json.dumps(document, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReconciliationReport:
        document = json.loads(text)
        if document.get("version") != REPORT_VERSION:
            raise ValueError(f"not a version {REPORT_VERSION} reconciliation report: "
                             f"version {document.get('version')!r}")
        report = _decode(cls, document)
        assert isinstance(report, cls)
        return report

    def render_text(self) -> str:
        return "\n".join([*self._headline(), *self._tenant_sections()]) + "\n"

    def render_summary(self) -> str:
        """The headline and one line per tenant: small enough for any ConfigMap."""
        lines = self._headline()
        for tenant in self.tenants():
            lines.append(f"  tenant {tenant}: " + _count_phrase(self._of(tenant)))
        return "\n".join(lines) + "\n"

    def _headline(self) -> list[str]:
        lines = [
            f"Reconciliation report of cell {self.cell}: failover to epoch {self.epoch}",
            f"  old primary    {self.old_site}, lease until {_time(self.old_lease_deadline)}",
            f"  new primary    {self.new_site}, its timeline forked at {self.fork_lsn}",
            f"  WAL past fork  {self.lost_wal_bytes} bytes on the old primary (it ended at "
            f"{self.old_end_lsn})",
            f"  window         {self.loss_window_seconds():.3f}s: lost writes from "
            f"{_time(self.first_lost_write_at)} to {_time(self.last_old_write_at)}",
            f"  written        {_time(self.created_at)}",
        ]
        if (self.old_lease_deadline is not None and self.last_old_write_at is not None
                and self.last_old_write_at >= self.old_lease_deadline):
            # Both times are the old database's clock, so they compare; the commit fence
            # (migration 0004) should have made this impossible.
            lines.append("  WARNING        a lost write began at or after the old lease's deadline")
        if self.nothing_lost:
            lines.append("Nothing was lost: the new primary has every job, ledger entry and "
                         "outbox event the old one committed.")
        else:
            counts = self.counts()
            lines.append(f"Lost: {_count_phrase(counts)}, of {_plural(counts.tenants, 'tenant')}.")
        if self.truncated_from is not None:
            lines.append("Truncated: the lists below are cut to fit a ConfigMap; the counts are "
                         "the full report's, which is in the operator's report file.")
        return lines

    def _of(self, tenant: str) -> LostCounts:
        return LostCounts(sum(j.tenant_id == tenant for j in self.jobs),
                          sum(u.tenant_id == tenant for u in self.job_updates),
                          sum(e.tenant_id == tenant for e in self.ledger_entries),
                          sum(e.tenant_id == tenant for e in self.outbox_events), 1)

    def _tenant_sections(self) -> list[str]:
        lines: list[str] = []
        for tenant in self.tenants():
            lines += ["", f"tenant {tenant}"]
            jobs = [j for j in self.jobs if j.tenant_id == tenant]
            if jobs:
                lines.append(f"  jobs the new primary does not have ({len(jobs)}):")
                lines += _table(["JOB", "IDEMPOTENCY KEY", "STATUS", "CREATED", "RESUBMITTED AS"],
                                [[str(j.job_id), j.idempotency_key or "-", j.status,
                                  _time(j.created_at),
                                  str(j.resubmitted_as) if j.resubmitted_as else "-"]
                                 for j in jobs])
            updates = [u for u in self.job_updates if u.tenant_id == tenant]
            if updates:
                lines.append(f"  job updates the new primary does not have ({len(updates)}):")
                lines += _table(["JOB", "IDEMPOTENCY KEY", "OLD PRIMARY", "NEW PRIMARY",
                                 "FINISHED"],
                                [[str(u.job_id), u.idempotency_key or "-", u.old_status,
                                  u.new_status, _time(u.finished_at)] for u in updates])
            entries = [e for e in self.ledger_entries if e.tenant_id == tenant]
            if entries:
                lines.append(f"  ledger entries the new primary does not have ({len(entries)}):")
                lines += _table(["JOB", "KIND", "AMOUNT (micro-credits)", "CREATED"],
                                [[str(e.job_id), e.kind, str(e.amount), _time(e.created_at)]
                                 for e in entries])
                # A sum across kinds means nothing (a reserve is held, a settle charged,
                # a refund returned), so the total is per kind.
                totals = {kind: sum(e.amount for e in entries if e.kind == kind)
                          for kind in sorted({e.kind for e in entries})}
                lines.append("    total amount: " + ", ".join(f"{kind} {amount}"
                                                              for kind, amount in totals.items()))
            events = [e for e in self.outbox_events if e.tenant_id == tenant]
            if events:
                lines.append(f"  outbox events the new primary does not have ({len(events)}):")
                lines += _table(["EVENT", "JOB", "KIND", "DELIVERED", "CREATED"],
                                [[str(e.event_id), str(e.job_id) if e.job_id else "-", e.kind,
                                  "yes" if e.delivered else "no", _time(e.created_at)]
                                 for e in events])
        return lines


# -- the comparison ------------------------------------------------------------------------


def compare_sites(old: SiteSnapshot, new: SiteSnapshot, *, cell: str, epoch: int, old_site: str,
                  new_site: str, fork_lsn: str, old_end_lsn: str,
                  old_lease_deadline: datetime.datetime | None,
                  created_at: datetime.datetime) -> ReconciliationReport:
    """What ``old`` holds that ``new`` lacks, by natural key; rows only ``new`` has are not
    losses (the new primary kept serving)."""
    key_of = {job_id: row.key for job_id, row in old.idempotency_keys.items()}
    job_under_key = {(row.tenant_id, row.key): row.job_id for row in new.idempotency_keys.values()}
    jobs: list[LostJob] = []
    updates: list[LostJobUpdate] = []
    for row in old.jobs.values():
        key = key_of.get(row.job_id)
        on_new = new.jobs.get(row.job_id)
        if on_new is None:
            resubmitted_as = job_under_key.get((row.tenant_id, key)) if key else None
            jobs.append(LostJob(row.tenant_id, row.job_id, key, row.status, row.created_at,
                                resubmitted_as))
        elif _moved_on_only_on_old(row, on_new):
            updates.append(LostJobUpdate(row.tenant_id, row.job_id, row.status, on_new.status,
                                         key, row.finished_at))
    entries = [row for key, row in old.ledger.items() if key not in new.ledger]
    events = [row for event_id, row in old.outbox.items() if event_id not in new.outbox]
    moments = [*(j.created_at for j in jobs), *(u.finished_at for u in updates if u.finished_at),
               *(e.created_at for e in entries), *(e.created_at for e in events)]
    return ReconciliationReport(
        cell=cell, epoch=epoch, old_site=old_site, new_site=new_site, fork_lsn=fork_lsn,
        old_end_lsn=old_end_lsn,
        # The old primary cannot end before the fork: the standby only ever received WAL the
        # old one had flushed. Clamped all the same, so a report is always written.
        lost_wal_bytes=max(0, lsn_to_int(old_end_lsn) - lsn_to_int(fork_lsn)),
        old_lease_deadline=old_lease_deadline,
        first_lost_write_at=min(moments, default=None),
        last_old_write_at=max(moments, default=None),
        created_at=created_at,
        jobs=tuple(sorted(jobs, key=lambda j: (j.tenant_id, j.created_at, str(j.job_id)))),
        job_updates=tuple(sorted(updates, key=lambda u: (u.tenant_id, str(u.job_id)))),
        ledger_entries=tuple(sorted(entries, key=lambda e: (e.tenant_id, e.created_at,
                                                            str(e.job_id), e.kind))),
        outbox_events=tuple(sorted(events, key=lambda e: (e.tenant_id, e.created_at,
                                                          str(e.event_id)))),
    )


def _moved_on_only_on_old(old: JobRow, new: JobRow) -> bool:
    if old.status == new.status:
        return False
    if old.status in TERMINAL_STATUSES:
        # The old primary's outcome: the new one has none yet, or another one.
        return True
    if new.status in TERMINAL_STATUSES:
        return False
    # Both queued or running, each primary possibly claiming on its own since the fork:
    # only a claim the new primary never saw (a higher claim count) is the old one's progress.
    return old.claim_epoch > new.claim_epoch


def fit_report(report: ReconciliationReport, max_bytes: int) -> ReconciliationReport:
    """The report, its lists cut (the same number of rows kept in each) until its JSON fits."""
    if len(report.to_json().encode()) <= max_bytes:
        return report
    full = report.counts()

    def cut(keep: int) -> ReconciliationReport:
        return replace(report, jobs=report.jobs[:keep], job_updates=report.job_updates[:keep],
                       ledger_entries=report.ledger_entries[:keep],
                       outbox_events=report.outbox_events[:keep], truncated_from=full)

    fits, too_many = 0, max(len(report.jobs), len(report.job_updates),
                            len(report.ledger_entries), len(report.outbox_events))
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if len(cut(middle).to_json().encode()) <= max_bytes:
            fits = middle
        else:
            too_many = middle
    return cut(fits)


# -- WAL positions and timelines -----------------------------------------------------------


def lsn_to_int(lsn: str) -> int:
    """A Postgres LSN ('16/B374D848': two hex halves) as a byte position."""
    high, slash, low = lsn.strip().partition("/")
    if not slash:
        raise ValueError(f"not an LSN: {lsn!r}")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True)
class TimelineSwitch:
    parent_timeline: int
    switch_lsn: str
    """Where the parent timeline ended and the next one began."""
    reason: str


def parse_timeline_history(text: str) -> list[TimelineSwitch]:
    """A ``0000000N.history`` file: one "parentTLI<tab>switchpoint<tab>reason" line per
    ancestor timeline, oldest first; blank and ``#`` lines are skipped, as Postgres does."""
    switches = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parent, switch, *reason = line.split("\t")
        lsn_to_int(switch)
        switches.append(TimelineSwitch(int(parent), switch.strip(), "\t".join(reason).strip()))
    return switches


def fork_point(history: list[TimelineSwitch], old_timeline: int | None = None) -> str:
    """Where ``old_timeline`` ended in the new primary's history: past it, the old primary's
    WAL is its own. Without it, where the new primary's current timeline began.

    They differ when the new primary was promoted twice while the old one was away: the
    last switch is then between two timelines the old primary never had.
    """
    if not history:
        raise ValueError("an empty timeline history: the server never forked")
    if old_timeline is None:
        return history[-1].switch_lsn
    for switch in history:
        if switch.parent_timeline == old_timeline:
            return switch.switch_lsn
    raise ValueError(f"timeline {old_timeline} is not an ancestor of the new primary's "
                     f"(history: {', '.join(str(s.parent_timeline) for s in history)})")


# -- encoding ------------------------------------------------------------------------------

def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_camel(f.name): _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(item) for item in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def _decode(kind: Any, value: Any) -> Any:
    """``value`` (as ``_encode`` wrote it) as an instance of the annotation ``kind``."""
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return _decode(inner, value)
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return tuple(_decode(item, element) for element in value)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: _decode(hints[f.name], value[_camel(f.name)])
                       for f in dataclasses.fields(kind) if _camel(f.name) in value})
    if kind is UUID:
        return UUID(value)
    if kind is datetime.datetime:
        return datetime.datetime.fromisoformat(value)
    if kind in (int, str, bool) and not isinstance(value, kind):
        raise ValueError(f"expected {kind.__name__}, found {value!r}")
    return value


# -- text ----------------------------------------------------------------------------------


def _time(moment: datetime.datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        raise ValueError("report times must be timezone-aware")
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _count_phrase(counts: LostCounts) -> str:
    return ", ".join(_plural(n, noun) for n, noun in (
        (counts.jobs, "job"), (counts.job_updates, "job update"),
        (counts.ledger_entries, "ledger entry"), (counts.outbox_events, "outbox event")))


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1]}ies" if noun.endswith("y") else f"{count} {noun}s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["    " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in (header, *rows)]
