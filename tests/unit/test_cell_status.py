from __future__ import annotations

import datetime

import pytest

from cellplane_operator.domain.cells import CellSpec, Tier, plan_cell_status

NOW = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)
SPEC = {"region": "region-a", "tier": "dedicated", "capacity": {"tenants": 1, "workerSlots": 8}}


def test_spec_is_read_into_domain_types() -> None:
    cell = CellSpec.from_manifest("dedicated-acme", SPEC)
    assert cell.tier is Tier.DEDICATED
    assert (cell.region, cell.tenant_capacity, cell.worker_slots) == ("region-a", 1, 8)


def test_unknown_tier_is_refused_even_if_the_schema_were_bypassed() -> None:
    with pytest.raises(ValueError):
        CellSpec.from_manifest("x", {**SPEC, "tier": "premium"})


def test_accepted_cell_is_pending_and_not_ready_until_a_stack_runs() -> None:
    plan = plan_cell_status(CellSpec.from_manifest("dedicated-acme", SPEC), generation=4,
                            current_conditions=[], now=NOW)
    status = plan.as_status()
    assert status["phase"] == "Pending"
    assert status["observedGeneration"] == 4
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Accepted"]["status"] == "True"
    assert "dedicated cell in region-a" in by_type["Accepted"]["message"]
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("False", "StackNotProvisioned")
    assert all(c["observedGeneration"] == 4 for c in status["conditions"])


def test_replanning_keeps_transition_times() -> None:
    cell = CellSpec.from_manifest("dedicated-acme", SPEC)
    first = plan_cell_status(cell, generation=1, current_conditions=[], now=NOW)
    later = NOW + datetime.timedelta(hours=1)
    second = plan_cell_status(cell, generation=2, current_conditions=first.conditions, now=later)
    assert [c["lastTransitionTime"] for c in second.conditions] == ["2026-11-29T08:00:00Z"] * 2
