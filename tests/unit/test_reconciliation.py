"""The reconciliation diff: what an old primary committed that the promoted standby lacks."""

from __future__ import annotations

import datetime
import json
import random
from dataclasses import replace
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_operator.domain.reconciliation import (
    IdempotencyKeyRow,
    JobRow,
    LedgerRow,
    LostCounts,
    LostJob,
    LostJobUpdate,
    LostLedgerEntry,
    OutboxRow,
    ReconciliationReport,
    SiteSnapshot,
    fit_report,
    fork_point,
    lsn_to_int,
    parse_timeline_history,
    compare_sites,
)

T0 = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def uid(n: int) -> UUID:
    return UUID(int=n)


def job(n: int, tenant: str = "acme", status: str = "queued", *, claims: int = 0,
        created: float = 0.0, finished: float | None = None) -> JobRow:
    return JobRow(tenant, uid(n), status, claims, at(created),
                  None if finished is None else at(finished))


def ledger(n: int, kind: str, amount: int, tenant: str = "acme", created: float = 0.0) -> LedgerRow:
    return LedgerRow(tenant, uid(n), kind, amount, at(created))


def event(n: int, job_n: int, kind: str = "job.accepted", tenant: str = "acme",
          created: float = 0.0, delivered: bool = False) -> OutboxRow:
    return OutboxRow(tenant, uid(1000 + n), uid(job_n), kind, at(created), delivered)


def key(job_n: int, name: str, tenant: str = "acme") -> IdempotencyKeyRow:
    return IdempotencyKeyRow(tenant, name, uid(job_n))


def report_of(old: SiteSnapshot, new: SiteSnapshot, **overrides: object) -> ReconciliationReport:
    arguments: dict[str, object] = dict(
        cell="shared-a1", epoch=7, old_site="shared-a1@region-a", new_site="shared-a1@region-b",
        fork_lsn="0/3016038", old_end_lsn="0/30160A0", old_lease_deadline=at(60),
        created_at=at(120))
    arguments.update(overrides)
    return compare_sites(old, new, **arguments)  # type: ignore[arg-type]


# Replicated before the fork: job 1 with its reservation, event and key.
COMMON_JOBS = [job(1, created=1)]
COMMON_LEDGER = [ledger(1, "reserve", 500, created=1)]
COMMON_EVENTS = [event(1, 1, created=1)]
COMMON_KEYS = [key(1, "order-1")]


def test_a_job_only_the_old_primary_has_is_lost_with_its_key_ledger_and_event() -> None:
    old = SiteSnapshot.of(
        jobs=[*COMMON_JOBS, job(2, created=5)],
        ledger=[*COMMON_LEDGER, ledger(2, "reserve", 300, created=5)],
        outbox=[*COMMON_EVENTS, event(2, 2, created=5, delivered=True)],
        idempotency_keys=[*COMMON_KEYS, key(2, "order-2")])
    new = SiteSnapshot.of(jobs=COMMON_JOBS, ledger=COMMON_LEDGER, outbox=COMMON_EVENTS,
                          idempotency_keys=COMMON_KEYS)

    report = report_of(old, new)

    assert report.jobs == (LostJob("acme", uid(2), "order-2", "queued", at(5)),)
    assert report.ledger_entries == (LostLedgerEntry("acme", uid(2), "reserve", 300, at(5)),)
    assert [(e.event_id, e.delivered) for e in report.outbox_events] == [(uid(1002), True)]
    assert report.job_updates == ()
    assert report.lost_wal_bytes == 0x30160A0 - 0x3016038
    assert report.last_old_write_at == at(5)


def test_ledger_entries_match_by_job_and_kind_so_colliding_entry_ids_hide_nothing() -> None:
    # After the fork both primaries hand out the same entry_id: the old gave it to job 2's
    # reserve, the new to job 3's. Neither is the other; only (job, kind) tells.
    old = SiteSnapshot.of(jobs=[*COMMON_JOBS, job(2, created=5)],
                          ledger=[*COMMON_LEDGER, ledger(2, "reserve", 300, created=5),
                                  ledger(1, "settle", 450, created=6)])
    new = SiteSnapshot.of(jobs=[*COMMON_JOBS, job(3, tenant="globex", created=70)],
                          ledger=[*COMMON_LEDGER, ledger(3, "reserve", 300, "globex", created=70)])

    report = report_of(old, new)

    assert [(e.job_id, e.kind, e.amount) for e in report.ledger_entries] == [
        (uid(2), "reserve", 300), (uid(1), "settle", 450)]


def test_a_status_that_moved_on_only_on_the_old_primary_is_a_lost_update() -> None:
    old = SiteSnapshot.of(
        jobs=[job(1, status="succeeded", claims=1, finished=9),   # finished only on the old
              job(2, status="dead", claims=3, finished=8),        # another outcome on each side
              job(3, status="running", claims=2),                 # a claim the new never saw
              job(4, status="queued", claims=0),                  # the new claimed it since
              job(5, status="running", claims=1),                 # the new finished it since
              job(6, status="running", claims=1)],                # the same on both
        idempotency_keys=[key(1, "order-1")])
    new = SiteSnapshot.of(
        jobs=[job(1, status="running", claims=1), job(2, status="succeeded", claims=3),
              job(3, status="queued", claims=1), job(4, status="running", claims=1),
              job(5, status="succeeded", claims=1), job(6, status="running", claims=1)])

    report = report_of(old, new)

    assert report.job_updates == (
        LostJobUpdate("acme", uid(1), "succeeded", "running", "order-1", at(9)),
        LostJobUpdate("acme", uid(2), "dead", "succeeded", None, at(8)),
        LostJobUpdate("acme", uid(3), "running", "queued"),
    )
    assert report.jobs == ()
    assert (report.first_lost_write_at, report.last_old_write_at) == (at(8), at(9))


def test_rows_only_the_new_primary_has_are_not_losses() -> None:
    old = SiteSnapshot.of(jobs=COMMON_JOBS, ledger=COMMON_LEDGER, outbox=COMMON_EVENTS,
                          idempotency_keys=COMMON_KEYS)
    new = SiteSnapshot.of(
        jobs=[*COMMON_JOBS, job(9, created=80)],
        ledger=[*COMMON_LEDGER, ledger(9, "reserve", 1, created=80),
                ledger(1, "settle", 500, created=81)],
        outbox=[*COMMON_EVENTS, event(9, 9, created=80)],
        idempotency_keys=[*COMMON_KEYS, key(9, "order-9")])

    report = report_of(old, new)

    assert report.nothing_lost
    assert report.summary() == {"jobs": 0, "jobUpdates": 0, "ledgerEntries": 0,
                                "outboxEvents": 0, "tenantsAffected": 0, "lostWalBytes": 104,
                                "forkLsn": "0/3016038", "lossWindowSeconds": 0.0}
    assert report.last_old_write_at is None
    assert "Nothing was lost" in report.render_text()


def test_a_lost_job_whose_key_the_client_resubmitted_names_the_new_job() -> None:
    old = SiteSnapshot.of(jobs=[job(2, created=5)], idempotency_keys=[key(2, "order-2")])
    new = SiteSnapshot.of(jobs=[job(3, created=70)], idempotency_keys=[key(3, "order-2")])

    (lost,) = report_of(old, new).jobs

    assert (lost.job_id, lost.idempotency_key, lost.resubmitted_as) == (uid(2), "order-2", uid(3))
    assert str(uid(3)) in report_of(old, new).render_text()


def lost_everything() -> tuple[SiteSnapshot, SiteSnapshot]:
    old = SiteSnapshot.of(
        jobs=[*COMMON_JOBS, job(2, created=5), job(3, "globex", "succeeded", claims=1, created=3,
                                                    finished=7.5)],
        ledger=[*COMMON_LEDGER, ledger(2, "reserve", 300, created=5),
                ledger(3, "settle", 250, "globex", created=7.5),
                ledger(3, "refund", 50, "globex", created=7.5),
                ledger(1, "settle", 400, created=6)],
        outbox=[*COMMON_EVENTS, event(2, 2, created=5), event(3, 3, "job.succeeded", "globex",
                                                              created=7.5)],
        idempotency_keys=[*COMMON_KEYS, key(2, "order-2"), key(3, "g-77", "globex")])
    new = SiteSnapshot.of(jobs=[*COMMON_JOBS], ledger=COMMON_LEDGER, outbox=COMMON_EVENTS,
                          idempotency_keys=COMMON_KEYS)
    return old, new


def test_the_report_is_the_same_whatever_order_the_rows_were_read_in() -> None:
    old, new = lost_everything()
    expected = report_of(old, new)
    shuffler = random.Random(7)
    for _ in range(20):
        shuffled = SiteSnapshot.of(
            jobs=shuffler.sample(list(old.jobs.values()), len(old.jobs)),
            ledger=shuffler.sample(list(old.ledger.values()), len(old.ledger)),
            outbox=shuffler.sample(list(old.outbox.values()), len(old.outbox)),
            idempotency_keys=shuffler.sample(list(old.idempotency_keys.values()),
                                             len(old.idempotency_keys)))
        again = report_of(shuffled, new)
        assert again == expected
        assert again.to_json() == expected.to_json()
    assert [e.tenant_id for e in expected.ledger_entries] == ["acme", "acme", "globex", "globex"]


def test_summary_counts_for_the_cell_status() -> None:
    report = report_of(*lost_everything())
    summary = report.summary()

    assert summary == {"jobs": 2, "jobUpdates": 0, "ledgerEntries": 4, "outboxEvents": 2,
                       "tenantsAffected": 2, "lostWalBytes": 104, "forkLsn": "0/3016038",
                       "lossWindowSeconds": 4.5}
    json.dumps(summary)  # JSON-ready as it is


def test_json_round_trip_keeps_every_field() -> None:
    old, new = lost_everything()
    old = SiteSnapshot.of(jobs=[*old.jobs.values(), job(1, status="cancelled", finished=4)],
                          ledger=old.ledger.values(), outbox=old.outbox.values(),
                          idempotency_keys=old.idempotency_keys.values())
    report = report_of(old, new, old_lease_deadline=None)
    assert report.job_updates and report.jobs and report.outbox_events

    text = report.to_json()
    again = ReconciliationReport.from_json(text)

    assert again == report
    document = json.loads(text)
    assert document["summary"] == report.summary()
    assert [j["idempotencyKey"] for j in document["jobs"]] == ["order-2", "g-77"]
    assert "entryId" not in text


def test_from_json_refuses_another_version() -> None:
    document = json.loads(report_of(*lost_everything()).to_json())
    document["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        ReconciliationReport.from_json(json.dumps(document))


def test_render_text_lists_each_tenant_with_every_lost_idempotency_key() -> None:
    old, new = lost_everything()
    report = report_of(old, new)

    text = report.render_text()

    for line in ("Reconciliation report of cell shared-a1: failover to epoch 7",
                 "shared-a1@region-a", "shared-a1@region-b", "forked at 0/3016038",
                 "WAL past fork  104 bytes", "window         4.500s",
                 "Lost: 2 jobs, 0 job updates, 4 ledger entries, 2 outbox events, of 2 tenants.",
                 "tenant acme", "tenant globex", "total amount: refund 50, settle 250",
                 "total amount: reserve 300, settle 400"):
        assert line in text, line
    for lost in report.jobs:
        assert lost.idempotency_key and lost.idempotency_key in text
    assert "WARNING" not in text


def test_a_lost_write_after_the_old_lease_deadline_is_flagged() -> None:
    text = report_of(*lost_everything(), old_lease_deadline=at(6)).render_text()
    assert "WARNING        a lost write began at or after the old lease's deadline" in text


def test_a_report_too_large_for_a_configmap_is_cut_and_says_so() -> None:
    old = SiteSnapshot.of(jobs=[job(n, created=n) for n in range(2, 500)],
                          ledger=[ledger(n, "reserve", n, created=n) for n in range(2, 500)],
                          idempotency_keys=[key(n, f"order-{n}") for n in range(2, 500)])
    report = report_of(old, SiteSnapshot())
    limit = len(report.to_json().encode()) // 4

    cut = fit_report(report, limit)

    assert len(cut.to_json().encode()) <= limit
    assert 0 < len(cut.jobs) < 498 and cut.jobs == report.jobs[:len(cut.jobs)]
    assert cut.truncated_from == LostCounts(498, 0, 498, 0, 1)
    assert cut.summary() == report.summary()
    assert "Truncated" in cut.render_text()
    assert ReconciliationReport.from_json(cut.to_json()) == cut
    assert fit_report(report, 10 * limit) is report


def test_lsn_to_int_reads_both_hex_halves() -> None:
    assert lsn_to_int("0/3016038") == 0x3016038
    assert lsn_to_int("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert lsn_to_int("16/B374D848") - lsn_to_int("15/FFFFFFFF") == 0xB374D849
    with pytest.raises(ValueError):
        lsn_to_int("3016038")


def test_fork_point_is_where_the_old_primary_timeline_ended_in_the_new_history() -> None:
    # What Postgres 15 wrote on the new primary after its second promotion (timeline 3).
    history = parse_timeline_history("1\t0/3016038\tno recovery target specified\n\n"
                                     "2\t0/5000A8\tno recovery target specified\n")

    assert fork_point(history) == "0/5000A8"
    assert fork_point(history, old_timeline=2) == "0/5000A8"
    assert fork_point(history, old_timeline=1) == "0/3016038"
    with pytest.raises(ValueError, match="timeline 3 is not an ancestor"):
        fork_point(history, old_timeline=3)
    with pytest.raises(ValueError):
        fork_point([])


rows = st.integers(min_value=1, max_value=12)


@given(old_ids=st.sets(rows), new_ids=st.sets(rows))
def test_lost_is_exactly_what_the_old_has_and_the_new_lacks(old_ids: set[int],
                                                            new_ids: set[int]) -> None:
    old = SiteSnapshot.of(jobs=[job(n, created=n) for n in old_ids],
                          ledger=[ledger(n, "reserve", n, created=n) for n in old_ids])
    new = SiteSnapshot.of(jobs=[job(n, created=n) for n in new_ids],
                          ledger=[ledger(n, "reserve", n, created=n) for n in new_ids])
    report = report_of(old, new)

    assert {j.job_id for j in report.jobs} == {uid(n) for n in old_ids - new_ids}
    assert {e.job_id for e in report.ledger_entries} == {uid(n) for n in old_ids - new_ids}
    assert report_of(old, old).nothing_lost
    assert replace(report, created_at=at(0)) == report_of(old, new, created_at=at(0))
