"""Losing a region, for real: three regions, each with its operator and etcd member; cells
with their primary site in region-a and a standby in region-b; load through the router of
region-c. A region is lost by SIGKILLing all of its processes at once, or cut off from
etcd by stopping its member only.

What must hold: the cell serves again from the survivor; the acknowledged jobs missing
afterwards are exactly the report's; the old primary comes back fenced and rebuilt as a
standby, never a second primary; a standby too far behind is not promoted unless forced;
a planned switchover loses nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cellplane_operator.domain.reconciliation import ReconciliationReport
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.ownership import OwnershipTable
from cellplane_operator.sites.reports import SiteReport, SiteReports
from httpservers import RecordingServer
from loadclient import Load
from metricscrape import scrape, value
from regionplane import RegionPlane, cell, cell_database, condition, db_rows, etcd, ready, \
    secret_data, tenant
from scheduleclient import UTC, HoldingTarget, assert_one_key_per_occurrence, create_schedule, \
    minutely_and_paused, once_at, read, runs_of, schedules_api, succeeded

REGIONS = ("region-a", "region-b", "region-c")
LEASE = {"durationSeconds": 3, "renewIntervalSeconds": 0.5, "marginSeconds": 0.5}
SERVING = ("Ready", "Degraded")


# A request to a paused apiserver waits this long, not the default 10 s: an operator that
# waited on one before serving would not serve while the test keeps the apiserver paused.
PATIENT_KUBE = {"CELLPLANE_KUBE_TIMEOUT_SECONDS": "600"}


@pytest.fixture(scope="module")
def plane(kube3: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube3, REGIONS)
    for region in REGIONS:
        regions.start_operator(region, own_member=True, metrics=True, env=PATIENT_KUBE)
    try:
        yield regions
    finally:
        regions.close()


@pytest.fixture(scope="module")
def router(plane: RegionPlane) -> Iterator[str]:
    """The edge router of region-c, on region-c's etcd member only."""
    process, url = plane.start_router([plane.kube.etcd.member("region-c").endpoint],
                                      hold_seconds=30, name="router-c")
    try:
        yield url
    finally:
        process.stop()


def _loaded_tenant(plane: RegionPlane, router: str, name: str, cell_name: str,
                   target: RecordingServer) -> tuple[str, Load]:
    """A tenant of the cell, in a namespace of its own, and a load of its jobs started
    through the router; (tenant id, load)."""
    key = _tenant_in(plane, name, cell_name, target, plane.namespace(f"ns-{name}"))
    return (key.removeprefix("cpk_").split(".")[0],
            Load(router, key, f"{name}-{uuid.uuid4().hex[:6]}").start())


def _tenant_in(plane: RegionPlane, name: str, cell_name: str, target: RecordingServer,
               ns: str) -> str:
    # The plan's default rate (1 job/s after a burst of 60) would cap the load; raised
    # within the plan's ceiling.
    plane.apply(tenant(name, ns, plan="enterprise", cell=cell_name,
                       quotas={"jobsPerSecond": 100, "burst": 500},
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    plane.await_status("tenant", name, ready, namespace=ns, timeout=120)
    return (secret_data(plane, ns, f"{name}-api-key") or {})["api-key"]


def _cell(plane: RegionPlane, name: str, lease: dict[str, float] = LEASE,
          **spec: Any) -> dict[str, Any]:
    plane.apply(cell(name, "region-a", standbyRegions=["region-b"], lease=lease, **spec))
    return plane.await_status(
        "cell", name, lambda s: ready(s) and all(sb.get("streaming") for sb in s.get("standbys") or [])
        and len(s.get("standbys") or []) == 1, timeout=180, what=f"cell {name} Ready with a standby")


def _serves_from(region: str, epoch_above: int) -> Any:
    return lambda s: (s.get("activeRegion") == region and int(s.get("epoch") or 0) > epoch_above
                      and s.get("phase") in SERVING
                      and (s.get("lastTakeover") or {}).get("epoch") == s.get("epoch"))


def _rebuilt(plane: RegionPlane, cell_name: str, epoch: int) -> dict[str, Any]:
    """Waits until region-a's old primary was reported on for ``epoch`` and streams again."""
    return plane.await_status(
        "cell", cell_name,
        lambda s: (s.get("lastReconciliation") or {}).get("epoch") == epoch
        and any(sb["region"] == "region-a" and sb.get("streaming") for sb in s.get("standbys") or []),
        timeout=120, what="region-a fenced, reported on and rebuilt as a standby")


def _report(plane: RegionPlane, cell_name: str, epoch: int) -> ReconciliationReport:
    printed = subprocess.run(
        [sys.executable, "-m", "cellplane_operator", "report", cell_name, "--epoch", str(epoch),
         "--json", "--kubeconfig", str(plane.kube.kubeconfig)],
        capture_output=True, text=True, check=True, timeout=60)
    return ReconciliationReport.from_json(printed.stdout)


def _assert_takeover_counted(plane: RegionPlane, cell_name: str, kind: str,
                             status: dict[str, Any]) -> None:
    """region-b's operator counted the takeover the Cell's status reports, with its duration."""
    samples = scrape(plane.metrics["region-b"])
    assert value(samples, "cellplane_operator_takeovers_total", cell=cell_name,
                 region="region-b", type=kind) == 1
    assert value(samples, "cellplane_operator_group_owned", kind="cell", group=cell_name,
                 region="region-b") == 1
    assert value(samples, "cellplane_operator_group_epoch", kind="cell", group=cell_name,
                 region="region-b") == status["epoch"]
    assert value(samples, "cellplane_operator_takeover_seconds_count", type=kind) is not None


def _in_recovery(conninfo: str) -> bool:
    return bool(db_rows(conninfo, "SELECT pg_is_in_recovery()")[0][0])


def _job_ids(conninfo: str, tenant_id: str) -> set[str]:
    return {str(row[0]) for row in db_rows(conninfo, "SELECT job_id FROM jobs WHERE tenant_id = %s",
                                           tenant_id)}


def test_losing_the_active_region_under_load(plane: RegionPlane, router: str,
                                             target: RecordingServer) -> None:
    before = _cell(plane, "loss-a1")
    tenant_id, load = _loaded_tenant(plane, router, "acme", "loss-a1", target)
    try:
        load.wait_for(40)
        killed_at = plane.kill_region("region-a")
        acknowledged_before_kill = len(load.acknowledged)
        status = plane.await_status("cell", "loss-a1", _serves_from("region-b", before["epoch"]),
                                    timeout=60, what="region-b to serve loss-a1")
        load.wait_for(20)
    finally:
        load.finish()
    first_after = min(t for t in load.acknowledged_at if t > killed_at)
    print(f"\nregion-a killed: first accepted write {first_after - killed_at:.2f}s later "
          f"(takeover {status['lastTakeover']['seconds']}s); {acknowledged_before_kill} "
          f"acknowledged before, {len(load.acknowledged)} in all")
    assert status["lastTakeover"]["fromRegion"] == "region-a"
    assert status["lastTakeover"]["planned"] is False
    _assert_takeover_counted(plane, "loss-a1", "failover", status)
    new_primary = cell_database(plane, "loss-a1", "region-b")
    assert not _in_recovery(new_primary)

    plane.restore_region("region-a")
    status = _rebuilt(plane, "loss-a1", status["epoch"])
    assert status["activeRegion"] == "region-b"
    # Counted by region-a's new operator, which fenced and rebuilt its old primary.
    back = scrape(plane.metrics["region-a"])
    assert (value(back, "cellplane_operator_old_primary_fences_total", cell="loss-a1",
                  region="region-a") or 0) >= 1
    assert sum(value(back, "cellplane_operator_old_primary_rebuilds_total", cell="loss-a1",
                     region="region-a", method=method) or 0
               for method in ("pg_rewind", "base_backup")) >= 1
    old_site = cell_database(plane, "loss-a1", "region-a")
    assert _in_recovery(old_site), "the old primary came back as a second primary"

    report = _report(plane, "loss-a1", status["epoch"])
    acknowledged = set(load.acknowledged.values())
    surviving = _job_ids(new_primary, tenant_id)
    missing = acknowledged - surviving
    reported = {job.job_id for job in report.jobs}
    assert missing == reported & acknowledged, (missing, reported)
    # What the report has beyond that was committed but never acknowledged to the client.
    for job in report.jobs:
        if job.job_id not in acknowledged:
            assert job.idempotency_key in load.failed_attempts
    assert status["lastReconciliation"]["jobs"] == len(report.jobs)
    # No job charged twice; nothing the old primary wrote past its lease deadline.
    assert not db_rows(new_primary, "SELECT job_id, kind FROM ledger GROUP BY job_id, kind "
                                    "HAVING count(*) > 1")
    if report.last_old_write_at is not None:
        assert report.old_lease_deadline is not None
        assert report.last_old_write_at <= report.old_lease_deadline
    # The old primary replays the new one's writes: one timeline, one primary.
    wait_for(lambda: _job_ids(old_site, tenant_id) >= surviving, timeout=30,
             what="the rebuilt standby to replay the new primary's jobs")
    group = etcd(plane, lambda store: OwnershipTable(store).read_group("loss-a1"))
    assert group.owner is not None and group.owner.region == "region-b"

    # Jobs that ran in region-a resume in region-b once their job leases run out (30 s),
    # every step retried under the idempotency key it had before.
    def all_finished() -> bool:
        return not db_rows(new_primary, "SELECT 1 FROM jobs WHERE tenant_id = %s AND status "
                                        "NOT IN ('succeeded') LIMIT 1", tenant_id)
    wait_for(all_finished, timeout=90, what="every surviving job to succeed in region-b")
    keys: dict[tuple[str, int], set[str]] = {}
    for call in target.calls:
        if call.json.get("tenant") == tenant_id:
            keys.setdefault((call.json["job_id"], call.json["step"]), set()).add(
                call.headers["idempotency-key"])
    assert keys and all(len(seen) == 1 for seen in keys.values())


def test_a_standby_too_far_behind_is_not_promoted_unless_forced(
        plane: RegionPlane, router: str, target: RecordingServer) -> None:
    before = _cell(plane, "lag-a1", failover={"maxStandbyLagSeconds": 1})
    standby = cell_database(plane, "lag-a1", "region-b")
    primary = cell_database(plane, "lag-a1", "region-a")
    with psycopg.connect(standby, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
    # Commits the standby receives but does not replay: its lag grows from here.
    with psycopg.connect(primary.replace("dbname=cellplane", "dbname=postgres"),
                         autocommit=True) as conn:
        conn.execute("CREATE TABLE lag_probe (n int)")
    plane.await_status("cell", "lag-a1", lambda s: (s.get("standbyLagSeconds") or 0) > 2,
                       timeout=60, what="the standby's lag to pass the limit")
    plane.kill_region("region-a")
    status = plane.await_status(
        "cell", "lag-a1", lambda s: condition(s, "Ready").get("reason") == "StandbyTooFarBehind",
        timeout=60, what="the standby to refuse the promotion")
    assert status["phase"] == "FailingOver"
    assert "force-failover=region-b" in condition(status, "Ready")["message"]
    group = etcd(plane, lambda store: OwnershipTable(store).read_group("lag-a1"))
    assert group.owner is None and group.epoch == before["epoch"]
    events = plane.kube.kubectl("get", "events", "-n", "default", "--field-selector",
                                "involvedObject.name=lag-a1,reason=FailoverRefused",
                                "-o", "json")
    assert json.loads(events.stdout)["items"], "no FailoverRefused event"

    forced = subprocess.run(
        [sys.executable, "-m", "cellplane_operator", "failover", "lag-a1", "--to", "region-b",
         "--force", "--wait", "--timeout", "60", "--kubeconfig", str(plane.kube.kubeconfig)],
        capture_output=True, text=True, timeout=90)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    status = plane.await_status("cell", "lag-a1", _serves_from("region-b", before["epoch"]))
    cell_now = plane.get("cell", "lag-a1") or {}
    assert "cellplane.io/force-failover" not in (cell_now["metadata"].get("annotations") or {})

    plane.restore_region("region-a")
    status = _rebuilt(plane, "lag-a1", status["epoch"])
    # Promotion replays what the paused standby had received: the lag was in replay only.
    assert _report(plane, "lag-a1", status["epoch"]).nothing_lost


def test_a_planned_switchover_loses_nothing(plane: RegionPlane, router: str,
                                            target: RecordingServer) -> None:
    before = _cell(plane, "sw-a1")
    tenant_id, load = _loaded_tenant(plane, router, "globex", "sw-a1", target)
    try:
        load.wait_for(30)
        moved = subprocess.run(
            [sys.executable, "-m", "cellplane_operator", "switchover", "sw-a1", "--to",
             "region-b", "--wait", "--timeout", "60", "--kubeconfig",
             str(plane.kube.kubeconfig)], capture_output=True, text=True, timeout=90)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        load.wait_for(20)
    finally:
        load.finish()
    status = plane.await_status("cell", "sw-a1", _serves_from("region-b", before["epoch"]))
    assert status["lastTakeover"]["planned"] is True
    _assert_takeover_counted(plane, "sw-a1", "switchover", status)
    print(f"\nswitchover: longest gap between acknowledged writes {load.longest_pause():.2f}s; "
          f"handover {status['lastTakeover']['seconds']}s")
    new_primary = cell_database(plane, "sw-a1", "region-b")
    assert set(load.acknowledged.values()) <= _job_ids(new_primary, tenant_id)
    status = _rebuilt(plane, "sw-a1", status["epoch"])
    report = _report(plane, "sw-a1", status["epoch"])
    assert report.nothing_lost, report.render_text()
    assert _in_recovery(cell_database(plane, "sw-a1", "region-a"))
    annotations = (plane.get("cell", "sw-a1") or {})["metadata"].get("annotations") or {}
    assert "cellplane.io/switchover-to" not in annotations


def test_a_region_cut_off_from_etcd_fences_itself_and_is_taken_over(
        plane: RegionPlane, router: str, target: RecordingServer) -> None:
    before = _cell(plane, "cut-a1")
    old_primary = cell_database(plane, "cut-a1", "region-a")
    plane.kube.etcd.kill("region-a")   # region-a's processes all keep running
    status = plane.await_status("cell", "cut-a1", _serves_from("region-b", before["epoch"]),
                                timeout=60, what="region-b to take cut-a1 over")
    _assert_takeover_counted(plane, "cut-a1", "failover", status)
    # region-a's operator, cut off but running, counted its own self-fence.
    cut_off = scrape(plane.metrics["region-a"])
    assert sum(value(cut_off, "cellplane_operator_self_fences_total", kind="cell",
                     group="cut-a1", region="region-a", reason=reason) or 0
               for reason in ("etcd_unreachable", "renewal_late")) >= 1
    assert value(cut_off, "cellplane_operator_group_owned", kind="cell", group="cut-a1",
                 region="region-a") == 0
    # The cut-off primary still runs, and refuses a write of its old epoch by itself.
    with psycopg.connect(old_primary, autocommit=True) as conn:
        conn.execute(f"SET cellplane.epoch = {before['epoch']}")
        # A statement trigger guards every write, even one that touches no row.
        with pytest.raises(psycopg.Error, match="lease expired|stale epoch"):
            conn.execute("DELETE FROM jobs WHERE false")
    plane.kube.etcd.restart("region-a")
    status = _rebuilt(plane, "cut-a1", status["epoch"])
    assert _in_recovery(cell_database(plane, "cut-a1", "region-a"))


def test_a_move_whose_source_loses_its_region_copies_again_and_completes(
        plane: RegionPlane, router: str, target: RecordingServer) -> None:
    """The source's primary region is lost while the tenant is copied out: the cell
    fails over to region-b, and the move starts its copy again from the new primary
    (the captured changes may have a gap there) and completes into a cell in region-c.
    Every acknowledged job is in the target, but those the failover lost (the report's)."""
    before = _cell(plane, "mvloss-src")
    plane.apply(cell("mvloss-dst", "region-c", lease=LEASE))
    plane.await_status("cell", "mvloss-dst", ready, timeout=120)
    tenant_id, load = _loaded_tenant(plane, router, "roamer", "mvloss-src", target)
    namespace = plane.namespace("ns-roamer")
    source = cell_database(plane, "mvloss-src", "region-a")
    with psycopg.connect(source) as conn:
        # Queued for later, so the copy lasts long enough to be cut in the middle.
        conn.execute(f"SET cellplane.epoch = '{before['epoch']}'")
        conn.execute("INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,"
                     " max_attempts, estimate, run_after) SELECT gen_random_uuid(), %s, 'queued',"
                     " 'default', 1, '{}', 3, 0, now() + interval '1 hour'"
                     " FROM generate_series(1, 40000)", (tenant_id,))
        conn.commit()
    try:
        load.wait_for(30)
        plane.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
                     "metadata": {"name": "roamer-away", "namespace": namespace},
                     "spec": {"tenant": "roamer", "targetCell": "mvloss-dst"}})
        plane.await_status("tenantmove", "roamer-away",
                           lambda s: s.get("phase") == "Copying"
                           and int((s.get("progress") or {}).get("rowsCopied") or 0) > 1000,
                           namespace=namespace, timeout=120, what="the copy under way")
        plane.kill_region("region-a")
        status = plane.await_status("tenantmove", "roamer-away",
                                    lambda s: s.get("phase") in ("Completed", "Failed", "Aborted"),
                                    namespace=namespace, timeout=300, what="the move to end")
        load.wait_for(20, timeout=120)
    finally:
        load.finish()
    cell_status = plane.get("cell", "mvloss-src") or {}
    plane.restore_region("region-a")
    _rebuilt(plane, "mvloss-src", cell_status["status"]["epoch"])

    assert status["phase"] == "Completed", status
    reasons = plane.kube.kubectl("get", "events", "-n", namespace, "--field-selector",
                                 "involvedObject.name=roamer-away", "-o",
                                 "jsonpath={.items[*].reason}").stdout.split()
    assert "CellTookOver" in reasons, reasons
    assert status["sourceCellEpoch"] > before["epoch"]
    destination = cell_database(plane, "mvloss-dst", "region-c")
    keys = dict(db_rows(destination, "SELECT key, job_id::text FROM idempotency_keys "
                                     "WHERE tenant_id = %s", tenant_id))
    missing = {job for key, job in load.acknowledged.items() if keys.get(key) != job}
    report = _report(plane, "mvloss-src", cell_status["status"]["epoch"])
    assert missing <= {job.job_id for job in report.jobs}, missing
    assert db_rows(destination, "SELECT state FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [("active",)]


def _site_report(plane: RegionPlane, cell_name: str, region: str) -> SiteReport | None:
    found: SiteReport | None = etcd(plane, lambda store: SiteReports(store).read(cell_name, region))
    return found


@contextlib.contextmanager
def _apiserver_paused(plane: RegionPlane) -> Iterator[None]:
    """The real kube-apiserver stopped by SIGSTOP: connections are accepted by the kernel and
    never answered, as an apiserver lost or hung in the middle of a region loss."""
    assert plane.kube.apiserver is not None and plane.kube.apiserver.process is not None
    pid = plane.kube.apiserver.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_region_lost_while_the_apiserver_is_paused_is_served_and_routed_without_it(
        plane: RegionPlane, router: str, target: RecordingServer) -> None:
    """Issue #18 items 10 and 11: nothing from losing the lease to serving and routing waits
    on Kubernetes, and what could not be written to it meanwhile is written once it is back:
    the takeover in the Cell's status, its Event, the force-failover annotation removed."""
    before = _cell(plane, "nokube-a1")
    tenant_id, load = _loaded_tenant(plane, router, "initech", "nokube-a1", target)
    # A person's standing order for the next loss: promote region-b whatever its lag.
    plane.kube.kubectl("annotate", "cell", "nokube-a1", "cellplane.io/force-failover=region-b")
    try:
        load.wait_for(20)
        with _apiserver_paused(plane):
            plane.kill_region("region-a")
            # Order, not time: all of this happens while the apiserver answers nothing. An
            # operator that waited on it (an Event, a status) would not get here at all.
            wait_for(lambda: (r := _site_report(plane, "nokube-a1", "region-b")) is not None
                     and r.serving and (r.epoch or 0) > before["epoch"], timeout=120,
                     what="region-b's site to serve nokube-a1 with the apiserver paused")
            served = _site_report(plane, "nokube-a1", "region-b")
            assert served is not None and served.took_over is not None
            assert served.took_over.epoch == served.epoch
            group = etcd(plane, lambda store: OwnershipTable(store).read_group("nokube-a1"))
            assert group.owner is not None and group.owner.region == "region-b"
            acknowledged = len(load.acknowledged)
            load.wait_for(10, timeout=120)  # writes through the router reach region-b
            assert len(load.acknowledged) > acknowledged
    finally:
        load.finish()
    # The apiserver is back: the records made meanwhile are written, none lost.
    status = plane.await_status("cell", "nokube-a1", _serves_from("region-b", before["epoch"]),
                                timeout=120, what="status.lastTakeover written once the "
                                                  "apiserver is back")
    assert status["lastTakeover"]["epoch"] == served.epoch
    assert status["lastTakeover"]["fromRegion"] == "region-a"
    wait_for(lambda: "cellplane.io/force-failover" not in
             ((plane.get("cell", "nokube-a1") or {})["metadata"].get("annotations") or {}),
             timeout=60, what="the force-failover annotation removed")
    wait_for(lambda: json.loads(plane.kube.kubectl(
        "get", "events", "-n", "default", "--field-selector",
        "involvedObject.name=nokube-a1,reason=TookOver", "-o", "json").stdout)["items"],
        timeout=60, what="the TookOver Event posted")
    assert _job_ids(cell_database(plane, "nokube-a1", "region-b"), tenant_id)
    plane.restore_region("region-a")
    _rebuilt(plane, "nokube-a1", status["epoch"])


def test_an_operator_restarted_during_a_region_loss_still_promotes_a_streaming_standby(
        plane: RegionPlane) -> None:
    """Issue #18 item 12: what region-b's operator saw of its standby streaming outlives it,
    so its successor, restarted a few seconds into the loss, promotes a standby that
    streamed with no lag, as it would have, without a person forcing it."""
    before = _cell(plane, "restart-a1")
    plane.kill_region("region-a")
    wait_for(lambda: (r := _site_report(plane, "restart-a1", "region-b")) is not None
             and not r.streaming, timeout=60,
             what="region-b's operator to see its standby cut off")
    plane.operators["region-b"].stop()
    plane.start_operator("region-b", own_member=True, metrics=True, env=PATIENT_KUBE,
                         log_suffix="-restarted")
    status = plane.await_status("cell", "restart-a1", _serves_from("region-b", before["epoch"]),
                                timeout=120, what="region-b to take restart-a1 over")
    assert status["lastTakeover"]["planned"] is False
    assert condition(status, "Ready").get("reason") != "StandbyNeverStreamed"
    plane.restore_region("region-a")
    status = _rebuilt(plane, "restart-a1", status["epoch"])
    assert _report(plane, "restart-a1", status["epoch"]).nothing_lost


def test_an_operator_paused_past_its_lease_leaves_the_deadline_in_force_in_the_report(
        plane: RegionPlane) -> None:
    """Issue #18 item 15: region-a's operator is paused (SIGSTOP) past its lease; region-b
    takes over; when it resumes it self-fences. The report's ``old_lease_deadline`` is the
    deadline the old primary's database enforced, not the moment the operator woke."""
    before = _cell(plane, "pause-a1")
    old_primary = cell_database(plane, "pause-a1", "region-a")
    operator = plane.operators["region-a"]
    assert operator.pid is not None
    os.kill(operator.pid, signal.SIGSTOP)
    try:
        status = plane.await_status("cell", "pause-a1", _serves_from("region-b", before["epoch"]),
                                    timeout=90, what="region-b to take pause-a1 over")
        wait_for(lambda: db_rows(old_primary, "SELECT clock_timestamp() >= lease_deadline "
                                              "FROM placement_group") == [(True,)],
                 timeout=30, what="the old primary's deadline to pass")
        [(in_force,)] = db_rows(old_primary, "SELECT lease_deadline FROM placement_group")
    finally:
        os.kill(operator.pid, signal.SIGCONT)
    status = _rebuilt(plane, "pause-a1", status["epoch"])
    report = _report(plane, "pause-a1", status["epoch"])
    assert report.old_lease_deadline == in_force


# --- schedules across a takeover (issue #19, "Moves and failovers") ---------------------------


def test_schedules_survive_a_region_loss_with_no_occurrence_lost_or_run_under_two_keys(
        plane: RegionPlane, router: str) -> None:
    """A minutely cron (RUN_ALL), ONCE schedules and a paused one, in a cell whose region is
    lost: the region dies while one ONCE run is in flight (its target holds the call) and
    less than five seconds before a minute, so the cron's occurrence of that minute and a
    ONCE schedule due then fall due while no region serves. After region-b takes over: every
    schedule is there in its state, the occurrences due during the loss run late, the cron
    goes on, every minute from its first run to its last has its run, each occurrence was
    called under its one key only, and the run in flight was repeated under the same key."""
    target = HoldingTarget()
    with target.server:
        # A 15 s lease: region-b takes over no sooner than 14.5 s after the loss (the lease's
        # last renewal, every 0.5 s, plus its duration).
        before = _cell(plane, "sched-a1", lease={**LEASE, "durationSeconds": 15})
        api_key = _tenant_in(plane, "hooli", "sched-a1", target.server, plane.namespace("ns-hooli"))
        with schedules_api(router, api_key) as api:
            cron, paused, paused_before = minutely_and_paused(api)
            done_at = (datetime.datetime.now(UTC) + datetime.timedelta(seconds=3)).replace(
                microsecond=0)
            done = create_schedule(api, once_at(done_at))
            wait_for(lambda: succeeded(api, done, done_at) and len(runs_of(api, cron)) >= 1
                     and all(run["status"] == "succeeded" for run in runs_of(api, cron).values()),
                     timeout=90, what="the ONCE run and the cron's first to succeed in region-a")
            # The loss comes with the in-flight run, 12 s before the first minute at least 30 s
            # away: if it reaches the target before that minute (12 s of slack for a busy
            # machine's dispatch and claim), region-b takes over after the minute, whose
            # occurrences thus fall due while no region serves.
            now = datetime.datetime.now(UTC)
            minute = (now + datetime.timedelta(seconds=90)).replace(second=0, microsecond=0)
            held_at = minute - datetime.timedelta(seconds=12)
            in_flight = create_schedule(api, once_at(held_at))
            target.held_schedule = in_flight
            due_in_loss = create_schedule(api, once_at(minute))
            ids = {cron, paused, done, in_flight, due_in_loss}
            standby = cell_database(plane, "sched-a1", "region-b")
            wait_for(lambda: db_rows(standby, "SELECT count(*) FROM schedules WHERE schedule_id"
                                              " = ANY(%s)", [uuid.UUID(i) for i in ids])
                     == [(len(ids),)], timeout=30, what="the standby to replay the schedules")
            target.held.wait(timeout=120)
            assert target.held.is_set(), "the in-flight run never reached the target"
            plane.kill_region("region-a")
            killed_at = datetime.datetime.now(UTC)
            target.released.set()
            assert killed_at < minute, (
                f"the in-flight run reached its target after {minute}: the loss came too late "
                f"for that minute's occurrences to fall due during it")
            status = plane.await_status("cell", "sched-a1", _serves_from("region-b", before["epoch"]),
                                        timeout=60, what="region-b to serve sched-a1")
            next_minute = minute + datetime.timedelta(minutes=1)
            wait_for(lambda: succeeded(api, cron, next_minute) and succeeded(api, cron, minute)
                     and succeeded(api, in_flight, held_at)
                     and succeeded(api, due_in_loss, minute), timeout=180,
                     what="the runs due during the loss, the one in flight and the cron's next "
                          "to succeed in region-b")
            states = {i: (read(api, f"/v1/schedules/{i}") or {}).get("state") for i in ids}
            paused_after = read(api, f"/v1/schedules/{paused}")
            cron_runs = runs_of(api, cron)
            once_runs = {i: runs_of(api, i) for i in (done, in_flight, due_in_loss)}

        plane.restore_region("region-a")
        _rebuilt(plane, "sched-a1", status["epoch"])

    print(f"\nregion-a killed {(minute - killed_at).total_seconds():.2f}s before {minute:%H:%M}; "
          f"region-b served at {status['lastTakeover']['at']}; the cron's run of {minute:%H:%M} "
          f"dispatched {cron_runs[minute]['dispatched_at']}, the in-flight run called "
          f"{target.calls_of(once_runs[in_flight][held_at]['idempotency_key'])} times")
    assert states == {cron: "active", paused: "paused", done: "completed",
                      in_flight: "completed", due_in_loss: "completed"}
    assert paused_after is not None and paused_before is not None
    assert paused_after["next_run_at"] == paused_before["next_run_at"]

    # None lost: every minute from the cron's first run to its last has its run, those due
    # during the loss included (RUN_ALL: each missed occurrence runs), and all succeeded.
    times = sorted(cron_runs)
    assert times == [times[0] + datetime.timedelta(minutes=n) for n in range(len(times))], times
    assert times[0] < killed_at and times[-1] >= next_minute
    assert all(run["status"] == "succeeded" for at, run in cron_runs.items() if at <= next_minute)
    # Those of the minute fell due while no region served, and region-b ran them late.
    served_at = datetime.datetime.fromisoformat(status["lastTakeover"]["at"])
    assert killed_at < minute <= served_at, (killed_at, served_at)
    for late in (cron_runs[minute], once_runs[due_in_loss][minute]):
        assert datetime.datetime.fromisoformat(late["dispatched_at"]) >= served_at, late
    assert [len(runs) for runs in once_runs.values()] == [1, 1, 1]

    assert_one_key_per_occurrence(target, {cron: cron_runs, **once_runs})
    # The run in flight at the loss: called in region-a, held, and again in region-b, under
    # its one key.
    held_key = once_runs[in_flight][held_at]["idempotency_key"]
    assert target.calls_of(held_key) >= 2
