"""What the operator's and router's metric helpers record (read back from their registries).

Each test uses label values of its own (a group or cell named after the test), so
the module-level metrics other tests touch do not disturb it.
"""

from __future__ import annotations

import pytest

from cellplane_operator import metrics
from cellplane_operator.domain.moves import MovePhase
from cellplane_operator.domain.ownership import LeaseState, Role
from cellplane_operator.metrics import OPERATOR_REGISTRY, ROUTER_REGISTRY


def _operator(name: str, **labels: str) -> float | None:
    return OPERATOR_REGISTRY.get_sample_value(name, labels)


def _router(name: str, **labels: str) -> float | None:
    return ROUTER_REGISTRY.get_sample_value(name, labels)


def test_a_holder_reports_ownership_and_epoch_and_forgets_them_when_closed() -> None:
    labels = {"kind": "cell", "group": "holder-test", "region": "region-a"}
    holder = metrics.HolderMetrics(**labels)
    holder.observe(LeaseState(role=Role.OBSERVING, epoch_seen=4))
    assert _operator("cellplane_operator_group_owned", **labels) == 0
    assert _operator("cellplane_operator_group_epoch", **labels) == 4

    holder.observe(LeaseState(role=Role.OWNER, epoch_seen=4, epoch=5, lease_id=1))
    assert _operator("cellplane_operator_group_owned", **labels) == 1
    assert _operator("cellplane_operator_group_epoch", **labels) == 5

    # Fenced: no longer owner; the epoch shown is the highest seen, not the one held.
    holder.observe(LeaseState(role=Role.FENCED, epoch_seen=6, epoch=5, lease_id=1))
    assert _operator("cellplane_operator_group_owned", **labels) == 0
    assert _operator("cellplane_operator_group_epoch", **labels) == 6

    holder.self_fenced(metrics.SelfFenceReason.ETCD_UNREACHABLE)
    assert _operator("cellplane_operator_self_fences_total", **labels,
                     reason="etcd_unreachable") == 1

    holder.close()
    assert _operator("cellplane_operator_group_owned", **labels) is None
    # A release after the holder ended does not bring a stale series back.
    holder.observe(LeaseState(role=Role.OBSERVING, epoch_seen=6))
    assert _operator("cellplane_operator_group_epoch", **labels) is None
    holder.close()  # twice is harmless


def test_renewals_are_timed_per_kind() -> None:
    holder = metrics.HolderMetrics(kind="election", group="placement", region="region-z")
    before = _operator("cellplane_operator_lease_renew_seconds_count", kind="election") or 0
    holder.renewed(0.003)
    holder.renewed(0.004)
    assert _operator("cellplane_operator_lease_renew_seconds_count", kind="election") == before + 2


def test_standby_lag_disappears_while_unknown_and_once_promoted() -> None:
    cell = {"cell": "lag-test", "region": "region-b"}
    metrics.standby_observed("lag-test", "region-b", streaming=True, lag_seconds=0.25)
    assert _operator("cellplane_operator_standby_lag_seconds", **cell) == 0.25
    assert _operator("cellplane_operator_standby_streaming", **cell) == 1
    metrics.standby_observed("lag-test", "region-b", streaming=False, lag_seconds=None)
    assert _operator("cellplane_operator_standby_lag_seconds", **cell) is None
    assert _operator("cellplane_operator_standby_streaming", **cell) == 0
    metrics.standby_gone("lag-test", "region-b")
    metrics.standby_gone("lag-test", "region-b")
    assert _operator("cellplane_operator_standby_streaming", **cell) is None


def test_a_takeover_counts_once_with_its_kind_and_durations() -> None:
    count = _operator("cellplane_operator_takeover_seconds_count", type="switchover") or 0
    metrics.takeover_served("takeover-test", "region-b", planned=True, seconds=0.4,
                            promoted_in=0.1)
    assert _operator("cellplane_operator_takeovers_total", cell="takeover-test",
                     region="region-b", type="switchover") == 1
    assert _operator("cellplane_operator_takeover_seconds_count", type="switchover") == count + 1


def test_moves_are_counted_in_every_phase_and_a_move_without_one_is_pending() -> None:
    counts = metrics.moves_by_phase(["Copying", None, "Copying", "Completed", "NoSuchPhase"])
    assert counts == {**{p.value: 0 for p in MovePhase}, "Copying": 2, "Pending": 1,
                      "Completed": 1}
    metrics.count_moves(["Verifying"])
    assert _operator("cellplane_operator_moves", phase="Verifying") == 1
    assert _operator("cellplane_operator_moves", phase="Copying") == 0


def test_a_phase_transition_counts_only_when_the_phase_changes() -> None:
    before = _operator("cellplane_operator_move_phase_transitions_total", phase="Aborted") or 0
    metrics.move_phase_written("Copying", "Aborted")
    metrics.move_phase_written("Aborted", "Aborted")
    assert _operator("cellplane_operator_move_phase_transitions_total", phase="Aborted") == before + 1


@pytest.mark.parametrize(("status", "expected"), [(200, "2xx"), (202, "2xx"), (401, "4xx"),
                                                  (429, "4xx"), (503, "5xx"), (99, "other"),
                                                  (600, "other")])
def test_status_codes_are_grouped_by_class(status: int, expected: str) -> None:
    assert metrics.code_class(status) == expected


def test_only_429_and_402_are_counted_per_tenant() -> None:
    for status in (200, 402, 429, 429, 503):
        metrics.router_refused_for_tenant("tenant-metrics-test", status)
    assert _router("cellplane_router_tenant_refusals_total", tenant="tenant-metrics-test",
                   code="429") == 2
    assert _router("cellplane_router_tenant_refusals_total", tenant="tenant-metrics-test",
                   code="402") == 1
    assert _router("cellplane_router_tenant_refusals_total", tenant="tenant-metrics-test",
                   code="200") is None


def test_a_hold_is_a_gauge_while_it_lasts_and_a_duration_once_it_ends() -> None:
    held = _router("cellplane_router_held_requests") or 0
    timed_out = _router("cellplane_router_hold_seconds_count", outcome="timed_out") or 0
    metrics.router_hold_started("NoOwner")
    metrics.router_hold_started("Moving")
    assert _router("cellplane_router_held_requests") == held + 2
    metrics.router_hold_ended(1.5, routed=False)
    metrics.router_hold_ended(0.2, routed=None)  # the client went away: no duration
    assert _router("cellplane_router_held_requests") == held
    assert _router("cellplane_router_hold_seconds_count", outcome="timed_out") == timed_out + 1


def test_a_retry_without_an_answer_is_counted_as_unreachable() -> None:
    before = _router("cellplane_router_stale_route_retries_total", reason="unreachable") or 0
    metrics.router_retried(None)
    assert _router("cellplane_router_stale_route_retries_total", reason="unreachable") == before + 1


def test_rebuild_methods_are_label_values() -> None:
    metrics.old_primary_rebuilt("rebuild-test", "region-a", "base backup")
    assert _operator("cellplane_operator_old_primary_rebuilds_total", cell="rebuild-test",
                     region="region-a", method="base_backup") == 1


def test_a_cell_counts_429_and_402_per_tenant_and_other_refusals_only_by_reason() -> None:
    from prometheus_client import REGISTRY

    from cellplane_cells.metrics import refuse_submission

    def tenant_count(reason: str) -> float | None:
        return REGISTRY.get_sample_value("cellplane_cell_tenant_refusals_total",
                                         {"tenant": "refusal-test", "reason": reason})

    before = REGISTRY.get_sample_value("cellplane_cell_submissions_refused_total",
                                       {"reason": "target_unknown"}) or 0
    refuse_submission("rate_limited", "refusal-test")
    refuse_submission("insufficient_funds", "refusal-test")
    refuse_submission("target_unknown", "refusal-test")
    assert tenant_count("rate_limited") == 1
    assert tenant_count("insufficient_funds") == 1
    assert tenant_count("target_unknown") is None
    assert REGISTRY.get_sample_value("cellplane_cell_submissions_refused_total",
                                     {"reason": "target_unknown"}) == before + 1
