"""A placed tenant and its cell, decided purely: may it be provisioned there now, and
which of its progress is news for an Event."""

from __future__ import annotations

from dataclasses import replace

from cellplane_operator.domain.fencing import ManualFence
from cellplane_operator.domain.tenants import (
    ForgetSaid, ProvisionIn, SayProgress, TenantCell, TenantProgress, WaitForTenantCell,
    progress_news, provisioned_event, provisioning_cell,
)

ADMIN = "http://127.0.0.1:9001"


def test_a_ready_cell_with_an_admin_endpoint_takes_the_tenant() -> None:
    assert provisioning_cell("c1", TenantCell("Ready", ADMIN)) == ProvisionIn(ADMIN, degraded=False)
    assert provisioning_cell("c1", TenantCell("Draining", ADMIN)) == ProvisionIn(ADMIN,
                                                                                degraded=False)


def test_a_degraded_cell_takes_the_tenant_and_says_so() -> None:
    assert provisioning_cell("c1", TenantCell("Degraded", ADMIN)) == ProvisionIn(ADMIN,
                                                                                degraded=True)


def test_a_cell_not_serving_or_without_admin_endpoint_is_waited_for() -> None:
    assert provisioning_cell("c1", TenantCell("Pending", ADMIN)) == WaitForTenantCell(
        "CellNotReady", "cell c1 is Pending; the tenant is provisioned there once it serves")
    assert provisioning_cell("c1", TenantCell("Ready", None)) == WaitForTenantCell(
        "CellNotReady", "cell c1 is Ready; the tenant is provisioned there once it serves")


def test_a_missing_cell_or_one_without_a_phase_is_not_reporting_yet() -> None:
    said = "cell c1 is not reporting yet; the tenant is provisioned there once it serves"
    assert provisioning_cell("c1", None) == WaitForTenantCell("CellNotReady", said)
    assert provisioning_cell("c1", TenantCell(None, None)) == WaitForTenantCell("CellNotReady", said)


def test_a_fenced_cell_says_who_fenced_it_even_when_it_serves() -> None:
    fenced = TenantCell("Ready", ADMIN, ManualFence("disk swap"))
    assert provisioning_cell("c1", fenced) == WaitForTenantCell(
        "CellFenced", "cell c1 is fenced (disk swap): writes are refused until "
                      "`kubectl cellplane unfence c1`")


def test_the_first_provisioning_in_a_cell_is_announced() -> None:
    assert provisioned_event({}, cell="c1", generation=1) == "Provisioned"
    # Serving from another cell (a move's target) or not serving yet: new there.
    assert provisioned_event({"cell": "c0", "phase": "Ready", "observedGeneration": 1},
                             cell="c1", generation=1) == "Provisioned"
    assert provisioned_event({"cell": "c1", "phase": "Provisioning", "observedGeneration": 1},
                             cell="c1", generation=1) == "Provisioned"


def test_a_new_generation_in_the_serving_cell_is_quotas_applied() -> None:
    for phase in ("Ready", "Degraded"):
        assert provisioned_event({"cell": "c1", "phase": phase, "observedGeneration": 1},
                                 cell="c1", generation=2) == "QuotasApplied"


def test_provisioning_again_what_serves_already_is_not_news() -> None:
    assert provisioned_event({"cell": "c1", "phase": "Ready", "observedGeneration": 2},
                             cell="c1", generation=2) is None


def progress(phase: str, reason: str, message: str = "m", refused: bool = False) -> TenantProgress:
    return TenantProgress(phase, reason, message, refused=refused)


def test_an_obstacle_is_said_once_per_reason() -> None:
    waiting = progress("Provisioning", "CellNotReady", "cell c1 is Pending")
    assert progress_news(waiting, said_before=None) == SayProgress("Normal", "CellNotReady")
    assert progress_news(replace(waiting, message="cell c1 is Degraded"),
                         said_before="CellNotReady") is None
    assert progress_news(replace(waiting, reason="CellFenced"),
                         said_before="CellNotReady") == SayProgress("Normal", "CellFenced")


def test_unplaceable_and_refused_are_warnings_and_a_refusal_is_said_per_field() -> None:
    assert progress_news(progress("Unplaceable", "NoCapacity"), said_before=None) == SayProgress(
        "Warning", "NoCapacity")
    refused = progress("Provisioning", "RefusedByCell", "spec.targets[0] refused", refused=True)
    news = progress_news(refused, said_before=None)
    assert news == SayProgress("Warning", "RefusedByCell: spec.targets[0] refused")
    assert progress_news(refused, said_before=news.said if news else None) is None
    assert progress_news(replace(refused, message="spec.webhooks[0] refused"),
                         said_before="RefusedByCell: spec.targets[0] refused") == SayProgress(
        "Warning", "RefusedByCell: spec.webhooks[0] refused")


def test_serving_forgets_what_was_said() -> None:
    for phase in ("Ready", "Degraded"):
        assert progress_news(progress(phase, "Provisioned"), said_before="CellNotReady") == \
            ForgetSaid()
