"""The Tenant status the placement leader writes, from how far the reconcile got."""

from __future__ import annotations

import datetime

from cellplane_cells.domain.plans import PLAN_DEFAULTS, Plan
from cellplane_operator.domain.tenants import (
    TenantProgress, name_problem, plan_tenant_status, refused_by_cell,
)

NOW = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)


def by_type(status: dict[str, object]) -> dict[str, dict[str, object]]:
    found = status["conditions"]
    assert isinstance(found, list)
    return {c["type"]: c for c in found}


def test_unplaceable_tenant_says_why_on_placed_and_ready() -> None:
    status = plan_tenant_status(TenantProgress("Unplaceable", "NoCapacity", "no room"),
                                generation=2, current_conditions=[], now=NOW)
    conditions = by_type(status)
    assert (conditions["Placed"]["status"], conditions["Placed"]["reason"]) == ("False", "NoCapacity")
    assert (conditions["Ready"]["status"], conditions["Ready"]["message"]) == ("False", "no room")
    assert status["phase"] == "Unplaceable" and "cell" not in status
    assert all(c["observedGeneration"] == 2 for c in conditions.values())


def test_placed_but_cell_not_ready_is_placed_true_ready_false() -> None:
    status = plan_tenant_status(
        TenantProgress("Provisioning", "CellNotReady", "cell c1 is Provisioning", cell="c1",
                       epoch=1, tenant_id="t-1"),
        generation=1, current_conditions=[], now=NOW)
    conditions = by_type(status)
    assert conditions["Placed"]["status"] == "True" and "c1 at epoch 1" in conditions["Placed"]["message"]
    assert conditions["Ready"]["reason"] == "CellNotReady"
    assert (status["cell"], status["epoch"], status["tenantId"]) == ("c1", 1, "t-1")


def test_ready_tenant_reports_endpoint_secret_and_effective_quotas() -> None:
    quotas = PLAN_DEFAULTS[Plan.ENTERPRISE]
    status = plan_tenant_status(
        TenantProgress("Ready", "Provisioned", "", cell="c1", epoch=1, tenant_id="t-1",
                       api_endpoint="http://127.0.0.1:9", api_key_secret="acme-api-key",
                       quotas=quotas),
        generation=1, current_conditions=[], now=NOW)
    assert by_type(status)["Ready"]["status"] == "True"
    assert status["apiKeySecret"] == "acme-api-key"
    assert status["quotas"] == {"maxRunningJobs": 20, "jobsPerSecond": 1.0, "burst": 60,
                                "strictSchedules": 20, "dailySpendLimit": 1_000_000_000}
    assert by_type(status)["Moving"]["status"] == "False"


def test_a_move_under_way_shows_as_the_moving_condition() -> None:
    progress = TenantProgress("Ready", "Provisioned", "", cell="a", epoch=2,
                              moving="acme-to-b: CatchingUp to cell b")
    status = plan_tenant_status(progress, generation=1, current_conditions=[], now=NOW)
    moving = by_type(status)["Moving"]
    assert (moving["status"], moving["reason"]) == ("True", "MoveInProgress")
    assert "acme-to-b: CatchingUp to cell b" in moving["message"]


def test_a_refusal_by_the_cell_names_the_field_it_refused() -> None:
    targets = [("api", "http://127.0.0.1:9"), ("deep", "http://127.0.0.1:9000/run")]
    answer = "http://127.0.0.1:9000/run: 127.0.0.1 is a loopback address (target_refused)"
    refused = refused_by_cell(cell="a1", answer=answer, targets=targets, webhooks=[])
    assert (refused.reason, refused.refused) == ("TargetRefused", True)
    assert refused.message.startswith(
        "cell a1 refuses spec.targets[name=deep].url http://127.0.0.1:9000/run: ")
    hook = refused_by_cell(cell="a1", answer="http://10.0.0.1/h: private (target_refused)",
                           targets=targets, webhooks=["http://10.0.0.1/h"])
    assert hook.reason == "WebhookRefused" and "spec.webhooks[url=http://10.0.0.1/h]" in hook.message
    other = refused_by_cell(cell="a1", answer="burst too large", targets=targets, webhooks=[])
    assert other.reason == "SpecRefused" and "burst too large" in other.message
    status = plan_tenant_status(refused, generation=3, current_conditions=[], now=NOW)
    ready = by_type(status)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "TargetRefused")
    assert "spec.targets[name=deep].url" in str(ready["message"])


def test_a_name_too_long_for_the_secret_label_is_said() -> None:
    assert name_problem("a" * 63) is None
    assert name_problem("acme.prod") is None, "dotted names stored before still work"
    problem = name_problem("a" * 64)
    assert problem is not None and "64 characters" in problem and "at most 63" in problem
