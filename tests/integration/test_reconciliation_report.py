"""Reconciliation reports against real Postgres sites and a real kube-apiserver.

The first test makes a real fork: a primary and its standby through the local
site driver, rows written by the cell's own code (submission, claim,
completion) and replicated, then the standby cut off, more rows on the primary
(the lost ones), the standby promoted, and the old primary fenced and opened
for reading, as a failover does. The report must name exactly the rows that
the rebuild of the old primary then discards.

The standby is cut off by emptying its ``primary_conninfo`` (ALTER SYSTEM and a
reload; Postgres 13+ stops the WAL receiver at once): the standby keeps what it
replayed and hears nothing more, as behind a network partition. Stopping its
Postgres would not do (it would stream again when started, before the
promotion), and ``pg_wal_replay_pause()`` stops only the replay, not the receipt.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cellfixtures import grant, setup_tenant
from cellplane_cells.jobqueue import claim, complete
from cellplane_cells.submission import JobRequest, submit
from cellplane_cells.tenants import register_webhook
from cellplane_operator.domain.reconciliation import (
    IdempotencyKeyRow,
    JobRow,
    LedgerRow,
    ReconciliationReport,
    SiteSnapshot,
    lsn_to_int,
    compare_sites,
)
from cellplane_operator.errors import KubeConflictError
from cellplane_operator.kube import CONFIGMAPS, NAMESPACES, KubeClient, KubeConfig
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.lossreport import (
    ReconciliationError,
    ReportStore,
    build_report,
    read_fork_lsn,
)
from cellplane_operator.commands.report import add_report_command, run_report
from cellplane_operator.sites import DatabaseEndpoint, SiteKey
from sitefixtures import Sites, run_sites

OLD = SiteKey("recon-r1", "region-a")
NEW = SiteKey("recon-r1", "region-b")
TARGET = "http://127.0.0.1:9/never-called"
REQUEST = JobRequest(target="default", payload={"n": 1}, steps=1, max_attempts=3, estimate=100,
                     expires_in_seconds=None)


@pytest.fixture
def sites(request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from run_sites(request, "cellplane-reconcile-")


def _rows(conninfo: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql.encode(), params)
        return list(cursor.fetchall()) if cursor.description else []


def _value(conninfo: str, sql: str, *params: Any) -> Any:
    (row,) = _rows(conninfo, sql, *params)
    return row[0]


def _writer(conninfo: str, epoch: int) -> psycopg.Connection[Any]:
    """A connection as the cell's pool makes one: autocommit, acting under ``epoch``."""
    conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
    conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(epoch),))
    return conn


def _submit(conn: psycopg.Connection[Any], tenant: str, key: str) -> uuid.UUID:
    response = submit(conn, tenant_id=tenant, key=key, request=REQUEST)
    assert response.status_code == 202 and not response.replayed
    return uuid.UUID(response.body["job_id"])


async def _until(condition: Callable[[], bool], *, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _replicated(old: DatabaseEndpoint, new: DatabaseEndpoint) -> None:
    end = lsn_to_int(_value(old.conninfo, "SELECT pg_current_wal_lsn()"))
    await _until(lambda: lsn_to_int(_value(new.conninfo, "SELECT pg_last_wal_replay_lsn()")) >= end,
                 what="the standby to replay everything the primary wrote")


async def test_the_report_names_exactly_what_the_old_primary_committed_past_the_fork(
        sites: Sites) -> None:
    old = await sites.driver.ensure_primary_database(OLD)
    grant(old.conninfo, epoch=1, seconds=3600)
    for tenant in ("acme", "globex"):
        setup_tenant(old.conninfo, tenant, target_url=TARGET)
    new = await sites.driver.ensure_standby_database(NEW, old)

    # Replicated before the fork: acme's job a-1, claimed; globex's job g-1.
    with _writer(old.conninfo, epoch=1) as conn:
        register_webhook(conn, "acme", "http://127.0.0.1:9/hook", secret="s" * 32,
                         allow_private=True)
        a1 = _submit(conn, "acme", "a-1")
        (claimed,) = claim(conn, worker="w-old", batch=1, lease_seconds=300)
        assert claimed.job_id == a1
        g1 = _submit(conn, "globex", "g-1")
    await _replicated(old, new)
    with pytest.raises(ReconciliationError, match="timeline 1: it was never promoted"):
        read_fork_lsn(old.conninfo)

    _rows(new.conninfo, "ALTER SYSTEM SET primary_conninfo = ''")
    _rows(new.conninfo, "SELECT pg_reload_conf()")
    await _until(lambda: not _rows(new.conninfo, "SELECT pid FROM pg_stat_wal_receiver"),
                 what="the standby's WAL receiver to stop")
    cut_at_lsn = _value(new.conninfo, "SELECT pg_last_wal_replay_lsn()::text")
    # The promoted standby will go on from the last ledger sequence value that was
    # WAL-logged (Postgres logs 32 ahead). The old primary is moved there too, as if it had
    # logged its next batch after the fork: both then give the same entry_id to different
    # entries, and only the natural key (job, kind) tells them apart.
    logged_ahead = _value(new.conninfo, "SELECT last_value FROM ledger_entry_id_seq")
    _rows(old.conninfo, "SELECT setval('ledger_entry_id_seq', %s)", logged_ahead)

    # Lost: committed on the old primary after the cut.
    with _writer(old.conninfo, epoch=1) as conn:
        assert complete(conn, claimed, cost=80)
        a2 = _submit(conn, "acme", "a-2")
        g2 = _submit(conn, "globex", "g-2")
        conn.execute(b"INSERT INTO deliveries (event_id, endpoint_id, status, delivered_at)"
                     b" SELECT o.event_id, w.endpoint_id, 'delivered', now()"
                     b" FROM outbox o JOIN webhook_endpoints w USING (tenant_id)"
                     b" WHERE o.job_id = %s AND o.kind = 'job.succeeded'", (a1,))

    await sites.driver.promote_database(NEW)
    grant(new.conninfo, epoch=2, seconds=3600)
    with _writer(new.conninfo, epoch=2) as conn:
        a2_again = _submit(conn, "acme", "a-2")  # the client retried against the new primary
        g_new = _submit(conn, "globex", "g-new")
    # Lost too: a stale primary's write after the promotion (its lease had not run out).
    with _writer(old.conninfo, epoch=1) as conn:
        g3 = _submit(conn, "globex", "g-3")
    old_end = lsn_to_int(_value(old.conninfo, "SELECT pg_current_wal_lsn()"))
    old_deadline = _value(old.conninfo, "SELECT lease_deadline FROM placement_group")
    entry_ids = {site: {row[0]: row[1:] for row in _rows(
        site.conninfo, "SELECT entry_id, job_id, kind FROM ledger")} for site in (old, new)}
    colliding = {entry_id for entry_id in entry_ids[old].keys() & entry_ids[new].keys()
                 if entry_ids[old][entry_id] != entry_ids[new][entry_id]}
    assert colliding, entry_ids

    await sites.driver.fence_database(OLD)
    reading = await sites.driver.open_fenced_for_reading(OLD)
    try:
        report = await asyncio.to_thread(
            build_report, reading, new.conninfo, cell=OLD.cell, epoch=2, old_site=OLD.name,
            new_site=NEW.name)
    finally:
        await sites.driver.close_fenced_reading(OLD)

    assert [(j.tenant_id, j.job_id, j.idempotency_key, j.status, j.resubmitted_as)
            for j in report.jobs] == [("acme", a2, "a-2", "queued", a2_again),
                                      ("globex", g2, "g-2", "queued", None),
                                      ("globex", g3, "g-3", "queued", None)]
    assert [(u.job_id, u.old_status, u.new_status, u.idempotency_key)
            for u in report.job_updates] == [(a1, "succeeded", "running", "a-1")]
    assert {(e.job_id, e.kind, e.amount) for e in report.ledger_entries} == {
        (a1, "settle", 80), (a2, "reserve", 100), (g2, "reserve", 100), (g3, "reserve", 100)}
    assert {(e.job_id, e.kind, e.delivered) for e in report.outbox_events} == {
        (a1, "job.succeeded", True), (a2, "job.accepted", False), (g2, "job.accepted", False),
        (g3, "job.accepted", False)}
    assert g_new not in {j.job_id for j in report.jobs}

    assert report.fork_lsn == cut_at_lsn
    assert lsn_to_int(report.old_end_lsn) >= old_end
    assert report.lost_wal_bytes == lsn_to_int(report.old_end_lsn) - lsn_to_int(cut_at_lsn) > 0
    assert report.old_lease_deadline == old_deadline
    assert report.last_old_write_at is not None and report.first_lost_write_at is not None
    assert report.first_lost_write_at <= report.last_old_write_at <= report.created_at
    assert report.summary()["tenantsAffected"] == 2
    text = report.render_text()
    for key in ("a-1", "a-2", "g-2", "g-3"):
        assert key in text

    # What the report named is what the rebuild discards, and nothing else.
    await sites.driver.rebuild_as_standby(OLD, new)
    await _replicated(new, old)
    old_jobs = {row[0]: row[1] for row in _rows(old.conninfo, "SELECT job_id, status FROM jobs")}
    assert not {a2, g2, g3} & old_jobs.keys()
    assert old_jobs[a1] == "running" and {a2_again, g_new, g1} <= old_jobs.keys()


async def test_the_report_of_a_failover_that_lost_nothing_says_so(sites: Sites) -> None:
    old = await sites.driver.ensure_primary_database(OLD)
    grant(old.conninfo, epoch=1, seconds=3600)
    setup_tenant(old.conninfo, "acme", target_url=TARGET)
    new = await sites.driver.ensure_standby_database(NEW, old)
    with _writer(old.conninfo, epoch=1) as conn:
        _submit(conn, "acme", "a-1")
    await _replicated(old, new)
    await sites.driver.promote_database(NEW)
    await sites.driver.fence_database(OLD)
    reading = await sites.driver.open_fenced_for_reading(OLD)
    try:
        report = await asyncio.to_thread(build_report, reading, new.conninfo, cell=OLD.cell,
                                         epoch=2, old_site=OLD.name, new_site=NEW.name)
        with pytest.raises(ReconciliationError, match="holds cell 'recon-r1', not 'other'"):
            await asyncio.to_thread(build_report, reading, new.conninfo, cell="other", epoch=2,
                                    old_site=OLD.name, new_site=NEW.name)
    finally:
        await sites.driver.close_fenced_reading(OLD)

    assert report.nothing_lost and report.last_old_write_at is None
    assert report.summary()["jobs"] == 0
    assert "Nothing was lost" in report.render_text()


# -- the store and the command, against the apiserver -----------------------------------


SAMPLE_TIME = datetime.datetime(2026, 11, 29, 8, 0, tzinfo=datetime.timezone.utc)


def _sample(cell: str, epoch: int, *, lost_jobs: int) -> ReconciliationReport:
    """A report as ``reconcile`` makes one: ``lost_jobs`` jobs, each with its reservation."""
    jobs = [JobRow("acme", uuid.UUID(int=n), "queued", 0, SAMPLE_TIME)
            for n in range(1, lost_jobs + 1)]
    ledger = [LedgerRow("acme", job.job_id, "reserve", 100, SAMPLE_TIME) for job in jobs]
    keys = [IdempotencyKeyRow("acme", f"order-{n}", job.job_id) for n, job in enumerate(jobs)]
    return compare_sites(SiteSnapshot.of(jobs=jobs, ledger=ledger, idempotency_keys=keys),
                     SiteSnapshot(), cell=cell, epoch=epoch, old_site=f"{cell}@region-a",
                     new_site=f"{cell}@region-b", fork_lsn="0/3016038", old_end_lsn="0/3017000",
                     old_lease_deadline=SAMPLE_TIME, created_at=SAMPLE_TIME)


async def _namespace(kube: KubeClient, name: str) -> None:
    try:
        await kube.create(NAMESPACES, {"metadata": {"name": name}})
    except KubeConflictError:
        pass


async def test_reports_are_saved_as_a_file_and_a_configmap_and_read_back(
        kube: LocalControlPlane, tmp_path: Path) -> None:
    client = KubeClient(KubeConfig.load(kube.kubeconfig))
    try:
        await _namespace(client, "reconcile-store")
        store = ReportStore(client, "reconcile-store", tmp_path / "reports")
        first, second = _sample("rc-a1", 3, lost_jobs=2), _sample("rc-a1", 5, lost_jobs=0)
        other = _sample("rc-b1", 2, lost_jobs=1)

        name, path = await store.save(first)
        await store.save(second)
        await store.save(other)

        assert name == "rc-a1-reconciliation-epoch-3"
        assert path == tmp_path / "reports" / "rc-a1-epoch-3.json"
        assert ReconciliationReport.from_json(path.read_text()) == first
        configmap = await client.get(CONFIGMAPS, name, namespace="reconcile-store")
        assert configmap is not None
        assert configmap["metadata"]["labels"] == {"cellplane.io/cell": "rc-a1",
                                                   "cellplane.io/report": "reconciliation",
                                                   "cellplane.io/epoch": "3"}
        assert configmap["metadata"]["annotations"]["cellplane.io/report-file"] == str(path)
        assert "order-1" in configmap["data"]["report.json"]
        assert "tenant acme: 2 jobs" in configmap["data"]["summary.txt"]

        assert [r.epoch for r in await store.list("rc-a1")] == [3, 5]
        assert [(r.cell, r.epoch) for r in await store.list()] == [("rc-a1", 3), ("rc-a1", 5),
                                                                   ("rc-b1", 2)]
        assert await store.get("rc-a1") == second
        assert await store.get("rc-a1", 3) == first
        assert await store.get("rc-a1", 4) is None
        assert await store.get("no-such-cell") is None

        # The same failover reported again (an operator restarted half-way) replaces it.
        again = _sample("rc-a1", 3, lost_jobs=1)
        assert (await store.save(again))[0] == name
        assert await store.get("rc-a1", 3) == again
    finally:
        await client.close()


async def test_a_report_beyond_a_configmap_is_cut_there_and_whole_in_the_file(
        kube: LocalControlPlane, tmp_path: Path) -> None:
    client = KubeClient(KubeConfig.load(kube.kubeconfig))
    try:
        await _namespace(client, "reconcile-large")
        store = ReportStore(client, "reconcile-large", tmp_path)
        large = _sample("rc-big", 7, lost_jobs=6000)
        assert len(large.to_json().encode()) > 2 * 1024 * 1024  # the apiserver refuses > 1 MiB

        _, path = await store.save(large)

        stored = await store.get("rc-big", 7)
        assert stored is not None and stored.truncated_from is not None
        assert 0 < len(stored.jobs) < 6000
        assert stored.summary() == large.summary()
        assert "Truncated" in stored.render_text()
        assert path is not None and ReconciliationReport.from_json(path.read_text()) == large
        configmap = await client.get(CONFIGMAPS, "rc-big-reconciliation-epoch-7",
                                     namespace="reconcile-large")
        assert configmap is not None
        summary = configmap["data"]["summary.txt"]
        assert "tenant acme: 6000 jobs, 0 job updates, 6000 ledger entries" in summary
        assert f"cut to fit; the whole report is in {path}" in summary
    finally:
        await client.close()


def _command(kube: LocalControlPlane, *words: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="cellplane")
    add_report_command(parser.add_subparsers())
    args = parser.parse_args(["report", *words, "--namespace", "reconcile-cli",
                              "--kubeconfig", str(kube.kubeconfig)])
    out, err = io.StringIO(), io.StringIO()
    code = args.run(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_report_command_prints_text_json_and_a_list(kube: LocalControlPlane) -> None:
    first, second = _sample("rc-cli", 2, lost_jobs=2), _sample("rc-cli", 4, lost_jobs=1)

    async def save() -> None:
        client = KubeClient(KubeConfig.load(kube.kubeconfig))
        try:
            await _namespace(client, "reconcile-cli")
            store = ReportStore(client, "reconcile-cli", None)
            for report in (first, second):
                assert (await store.save(report))[1] is None
        finally:
            await client.close()

    asyncio.run(save())

    code, out, _ = _command(kube, "rc-cli")
    assert code == 0 and out == second.render_text()
    code, out, _ = _command(kube, "rc-cli", "--epoch", "2")
    assert code == 0 and "order-0" in out and "order-1" in out
    code, out, _ = _command(kube, "rc-cli", "--epoch", "2", "--json")
    assert code == 0 and ReconciliationReport.from_json(out) == first
    code, out, _ = _command(kube, "rc-cli", "--list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].split()[:2] == ["EPOCH", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "4"]
    code, out, _ = _command(kube, "rc-cli", "--list", "--json")
    assert [entry["epoch"] for entry in json.loads(out)] == [2, 4]

    code, out, err = _command(kube, "rc-none")
    assert (code, out) == (1, "")
    assert err == ("cellplane report: no reconciliation report for cell rc-none (a cell gets one "
                   "when a failover finds writes the new primary lacks, or proves there were "
                   "none)\n")
    code, _, err = _command(kube, "rc-cli", "--epoch", "3")
    assert code == 1 and "no reconciliation report for cell rc-cli at epoch 3" in err
