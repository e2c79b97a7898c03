"""Dedicated cells, decided purely: the standby's region and the names of a move's cells."""

from __future__ import annotations

import re

from cellplane_operator.api.base import DNS_LABEL_PATTERN
from cellplane_operator.domain.cells import Region
from cellplane_operator.domain.dedicated import (
    dedicated_cell_spec, dedicated_to, made_for_move, move_target_name, standby_region,
)
from cellplane_operator.domain.placement import dedicated_cell_name

A, B, C = Region("region-a"), Region("region-b"), Region("region-c")


def test_the_standby_goes_to_the_region_after_the_home_in_the_list() -> None:
    assert standby_region(A, [A, B, C]) == B
    assert standby_region(B, [A, B, C]) == C


def test_after_the_last_region_the_standby_wraps_round_to_the_first() -> None:
    assert standby_region(C, [A, B, C]) == A


def test_the_list_order_counts_not_the_names_order() -> None:
    # Names compared would give region-c (the next name after region-b); the list
    # says region-a comes after region-b.
    assert standby_region(B, [C, B, A]) == A
    assert standby_region(A, [C, B, A]) == C


def test_no_other_region_means_no_standby() -> None:
    assert standby_region(A, [A]) is None
    assert standby_region(A, []) is None


def test_a_home_the_list_does_not_name_has_no_standby() -> None:
    assert standby_region(Region("region-q"), [A, B, C]) is None


def test_a_moves_cell_is_the_tenants_cell_name_and_the_moves_uid() -> None:
    name = move_target_name("acme", "prod", "1a2b3c4d-0000-4000-8000-000000000000")
    assert name == "t-acme-prod-1a2b3c4d"
    assert made_for_move(name, "1a2b3c4d-0000-4000-8000-000000000000")
    assert not made_for_move(name, "ffffffff-0000-4000-8000-000000000000")
    assert not made_for_move(dedicated_cell_name("acme", "prod"),
                             "1a2b3c4d-0000-4000-8000-000000000000")


def test_a_moves_cell_name_is_a_dns_label_however_long_the_tenant_name() -> None:
    uid = "1a2b3c4d-0000-4000-8000-000000000000"
    name = move_target_name("n" * 63, "t" * 63, uid)
    assert len(name) == 63
    assert re.fullmatch(DNS_LABEL_PATTERN, name)
    assert name == dedicated_cell_name("n" * 63, "t" * 63)[:54] + "-1a2b3c4d"
    assert made_for_move(name, uid)


def test_a_dedicated_cell_names_its_tenant_by_two_labels() -> None:
    labels = {"cellplane.io/tenant": "acme", "cellplane.io/tenant-namespace": "team"}
    assert dedicated_to(labels) == ("team", "acme")
    assert dedicated_to({"cellplane.io/tenant": "acme"}) is None
    assert dedicated_to({}) is None


def test_a_dedicated_cell_holds_one_tenant_with_a_slot_per_job() -> None:
    spec = dedicated_cell_spec(region="region-a", max_running_jobs=8, standby=B, like=None)
    assert spec == {"region": "region-a", "tier": "dedicated",
                    "capacity": {"tenants": 1, "workerSlots": 8}, "standbyRegions": ["region-b"]}
    # A tenant that may run nothing still gets a slot: a cell of none is refused.
    none = dedicated_cell_spec(region="region-a", max_running_jobs=0, standby=None, like=None)
    assert none["capacity"]["workerSlots"] == 1 and none["standbyRegions"] == []


def test_a_moves_dedicated_cell_runs_as_the_old_one_did_only_elsewhere() -> None:
    old = {"region": "region-a", "tier": "dedicated", "driver": {"name": "kubernetes"},
           "lease": {"durationSeconds": 20}, "failover": {"automatic": False},
           "capacity": {"tenants": 1, "workerSlots": 3}, "draining": True}
    spec = dedicated_cell_spec(region="region-b", max_running_jobs=5, standby=None, like=old)
    assert (spec["driver"], spec["lease"], spec["failover"]) == (
        old["driver"], old["lease"], old["failover"])
    assert spec["region"] == "region-b" and spec["capacity"]["workerSlots"] == 5
    assert "draining" not in spec
