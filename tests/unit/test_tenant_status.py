"""The Tenant status the placement leader writes, from how far the reconcile got."""

from __future__ import annotations

import datetime

from cellplane_cells.domain.plans import PLAN_DEFAULTS, Plan
from cellplane_operator.domain.tenants import TenantProgress, plan_tenant_status

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
                                "dailySpendLimit": 1_000_000_000}
    assert by_type(status)["Moving"]["status"] == "False"


def test_a_move_under_way_shows_as_the_moving_condition() -> None:
    progress = TenantProgress("Ready", "Provisioned", "", cell="a", epoch=2,
                              moving="acme-to-b: CatchingUp to cell b")
    status = plan_tenant_status(progress, generation=1, current_conditions=[], now=NOW)
    moving = by_type(status)["Moving"]
    assert (moving["status"], moving["reason"]) == ("True", "MoveInProgress")
    assert "acme-to-b: CatchingUp to cell b" in moving["message"]
