"""What the placement leader says of a Cell that no site (or the apiserver) would:
unknown regions, specs and names stored under older CRDs, capacity below its use."""

from __future__ import annotations

import datetime
from dataclasses import replace

from cellplane_operator.domain.cells import (
    CellFacts, CellVerdict, DeletionBlocked, Tier, cell_deletion, judge_cell, plan_cell_acceptance,
)

NOW = datetime.datetime(2026, 12, 2, 18, 0, tzinfo=datetime.timezone.utc)
FINE = CellFacts(name="shared-a1", spec_problem=None, name_ok=True, region="region-a",
                 known_regions=("region-a", "region-b"), tenant_capacity=10, worker_slots=40,
                 tenants_placed=2, slots_in_use=10)


def test_a_cell_that_fits_is_accepted() -> None:
    assert judge_cell(FINE) == CellVerdict(True, "Accepted", "the spec can be carried out as written")
    # Without the deployment's regions the operator does not judge them.
    assert judge_cell(replace(FINE, region="region-z", known_regions=())).accepted


def test_an_unknown_region_names_the_field_and_sets_a_phase() -> None:
    verdict = judge_cell(replace(FINE, region="region-z"))
    assert (verdict.accepted, verdict.reason, verdict.unusable) == (False, "UnknownRegion", True)
    assert "spec.region 'region-z'" in verdict.message and "region-a, region-b" in verdict.message
    patch = plan_cell_acceptance(verdict, generation=1, current={}, now=NOW)
    assert patch is not None and patch["phase"] == "Pending"
    assert patch["conditions"][0]["type"] == "Accepted"
    assert patch["conditions"][0]["reason"] == "UnknownRegion"
    standby = judge_cell(replace(FINE, standby_regions=("region-b", "region-q")))
    assert standby.reason == "UnknownStandbyRegion"
    assert "spec.standbyRegions names region-q, not a region" in standby.message


def test_capacity_below_use_and_a_tier_change_are_said() -> None:
    shrunk = judge_cell(replace(FINE, tenant_capacity=1, worker_slots=5))
    assert shrunk.reason == "CapacityBelowUse" and not shrunk.accepted
    assert "spec.capacity.tenants is 1 but 2 tenants" in shrunk.message
    assert "spec.capacity.workerSlots is 5" in shrunk.message and "10 jobs" in shrunk.message
    dedicated = judge_cell(replace(FINE, tier=Tier.DEDICATED, tenant_capacity=1))
    assert dedicated.reason == "CapacityBelowUse"
    assert "spec.tier is dedicated (one tenant) but 2 tenants are placed" in dedicated.message


def test_an_unreadable_spec_or_a_dotted_name_is_said() -> None:
    unreadable = judge_cell(CellFacts(name="old", spec_problem="lease.renewIntervalSeconds: "
                                      "Input should be greater than or equal to 0.1",
                                      name_ok=True))
    assert unreadable.reason == "InvalidSpec" and "renewIntervalSeconds" in unreadable.message
    assert unreadable.unusable
    dotted = judge_cell(replace(FINE, name="shared.a1", name_ok=False))
    assert dotted.reason == "InvalidName" and "metadata.name 'shared.a1'" in dotted.message


def test_the_patch_is_written_once_and_keeps_other_conditions() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Serving", "message": "",
             "lastTransitionTime": "2026-12-02T17:00:00Z", "observedGeneration": 1}
    verdict = judge_cell(replace(FINE, tenant_capacity=1))
    patch = plan_cell_acceptance(verdict, generation=2, current={"phase": "Ready",
                                                                  "conditions": [ready]}, now=NOW)
    assert patch is not None and "phase" not in patch, "a site reports the phase"
    assert [c["type"] for c in patch["conditions"]] == ["Ready", "Accepted"]
    assert plan_cell_acceptance(verdict, generation=2, current={"phase": "Ready", **patch},
                                now=NOW) is None


def test_a_cell_that_holds_no_tenant_may_be_deleted() -> None:
    assert cell_deletion("a1", []) is None


def test_a_cell_that_holds_tenants_is_kept_naming_the_first_five() -> None:
    holding = [f"team/t{i}" for i in range(7, 0, -1)]
    blocked = cell_deletion("a1", holding)
    assert blocked == DeletionBlocked(
        "DeletionBlocked", "cell a1 still holds 7 tenant(s) (team/t1, team/t2, team/t3, "
                           "team/t4, team/t5); move or delete them first")
