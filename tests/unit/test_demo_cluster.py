"""The cluster demo's pure pieces: what it reads from a Cell's status, the RTO from the load's
acknowledgements, a target's call as a step, and a summary without a noisy tenant."""

from __future__ import annotations

import json

from cellplane_operator.demo.scene import (CLUSTER_LOST_CELL, CLUSTER_MOVE_TARGET,
                                           cluster_settings_for)
from cellplane_operator.demo.summary import (EXIT_INVARIANT, EXIT_OK, DemoSummary, JobCounts,
                                             MoveOutcome, RegionLoss, StepCall,
                                             check_invariants, first_ack_after, render_table,
                                             step_call)
from cellplane_operator.localplane.clustercells import (kubernetes_cell, serves_from,
                                                        streams_as_standby)


def test_the_rto_is_the_first_acknowledgement_after_the_kill() -> None:
    assert first_ack_after([9.0, 10.5, 22.25, 23.0], 10.0) == 0.5
    assert first_ack_after([9.0, 23.5], 10.0) == 13.5
    assert first_ack_after([9.0], 10.0) is None
    assert first_ack_after([], 10.0) is None


def test_a_target_call_is_a_step_of_the_submission_its_payload_names() -> None:
    body = {"tenant": "t1", "job_id": "j1", "step": 2, "payload": {"key": "acme-1"}}
    assert step_call(body, "j1/2") == StepCall("t1", "acme-1", "j1", 2, "j1/2")
    assert step_call({"job_id": "j1", "step": 1}, "k") is None  # no tenant: not a demo job
    assert step_call({"tenant": "t1", "job_id": "j1", "step": "x"}, "k") is None


def test_a_takeover_is_done_when_the_survivor_serves_under_a_newer_epoch() -> None:
    serving = {"activeRegion": "region-b", "epoch": 3, "endpoints": {"api": "http://api"}}
    assert serves_from(serving, "region-b", after_epoch=2)
    assert not serves_from(serving, "region-b", after_epoch=3)
    assert not serves_from({**serving, "endpoints": {}}, "region-b", after_epoch=2)
    assert not serves_from(serving, "region-a", after_epoch=2)
    assert not serves_from({}, "region-b", after_epoch=0)


def test_the_old_site_is_rebuilt_once_reconciled_at_the_takeovers_epoch_and_streaming() -> None:
    status = {"standbys": [{"region": "region-a", "streaming": True}],
              "lastReconciliation": {"epoch": 3}}
    assert streams_as_standby(status, "region-a")
    assert streams_as_standby(status, "region-a", reconciled_epoch=3)
    assert not streams_as_standby(status, "region-a", reconciled_epoch=4)
    assert not streams_as_standby(status, "region-b")
    not_yet = {"standbys": [{"region": "region-a", "streaming": False}]}
    assert not streams_as_standby(not_yet, "region-a")


def test_the_cluster_cells_are_kubernetes_cells_with_the_product_lease() -> None:
    cell = kubernetes_cell(CLUSTER_LOST_CELL, region="region-a", standbys=["region-b"])
    assert cell["spec"]["driver"] == {"name": "kubernetes", "allowPrivateTargets": True}
    assert cell["spec"]["lease"]["durationSeconds"] == 10
    assert cell["spec"]["standbyRegions"] == ["region-b"]
    assert CLUSTER_LOST_CELL != CLUSTER_MOVE_TARGET
    short, full = cluster_settings_for(True), cluster_settings_for(False)
    assert short.mode == "short" and full.mode == "full"
    assert short.warmup_jobs < full.warmup_jobs


def _cluster_summary(**changes: object) -> DemoSummary:
    parts: dict[str, object] = dict(
        jobs=JobCounts(accepted=50, completed=50, unfinished=0, lost=(), lost_in_report=(),
                       run_twice=()),
        move=MoveOutcome("acme", "demo-a1", "demo-b1", "Completed", 1.2, 5.0, 300, 20.0),
        region_loss=RegionLoss("region-a", "demo-a1", 13.2, 2, 3, "region-b", 12.5, True,
                               True, 0, 0),
        noisy=None, tenants={"demo/acme": "Ready", "demo/initech": "Ready"})
    parts.update(changes)
    invariants = check_invariants(**parts)  # type: ignore[arg-type]
    return DemoSummary(mode="short", seconds=400.0, invariants=invariants,
                       driver="kubernetes", **parts)  # type: ignore[arg-type]


def test_without_a_noisy_tenant_its_invariant_and_row_are_left_out() -> None:
    summary = _cluster_summary()
    assert summary.exit_code == EXIT_OK
    assert "the noisy tenant held within its cap" not in {i.name for i in summary.invariants}
    assert len(summary.invariants) == 5
    table = render_table(summary)
    assert "noisy tenant" not in table
    assert "every invariant held; short run (kubernetes driver) in 400 s" in table
    document = json.loads(summary.to_json())
    assert document["noisy"] is None and document["driver"] == "kubernetes"
    assert document["exit_code"] == 0


def test_a_lost_job_not_in_the_report_breaks_the_cluster_story_too() -> None:
    summary = _cluster_summary(jobs=JobCounts(10, 9, 0, ("j1",), (), ()))
    assert [i.name for i in summary.broken] == ["no acknowledged job lost unless in the report"]
    assert summary.exit_code == EXIT_INVARIANT


def test_counts_grown_waits_for_each_name_to_grow_by_its_own_amount() -> None:
    from cellplane_operator.demo.timeline import counts_grown

    counts = {"acme": 10, "initech": 4}
    check = counts_grown(counts.__getitem__, {"acme": 3, "initech": 1})
    assert check() == (False, "acme 0/3 initech 0/1")
    counts.update(acme=14, initech=5)
    assert check() == (True, "acme 3/3 initech 1/1")


def test_only_the_cells_own_telling_events_are_kept_oldest_first() -> None:
    from cellplane_operator.demo.regions import telling_cell_events

    def event(reason: str, name: str, at: str, kind: str = "Cell") -> dict[str, object]:
        return {"reason": reason, "lastTimestamp": at,
                "involvedObject": {"kind": kind, "name": name}}

    events = [event("RebuiltAsStandby", "demo-a1", "2026-12-03T10:02:00Z"),
              event("OldPrimaryFenced", "demo-a1", "2026-12-03T10:01:00Z"),
              event("OldPrimaryFenced", "demo-b1", "2026-12-03T10:00:00Z"),
              event("Scheduled", "demo-a1", "2026-12-03T10:00:00Z"),
              event("Takeover", "demo-a1", "2026-12-03T10:00:00Z", kind="Tenant")]
    assert [e["reason"] for e in telling_cell_events(events, "demo-a1")] == [
        "OldPrimaryFenced", "RebuiltAsStandby"]
