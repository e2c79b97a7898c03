"""A Cell read into the settings its sites run with (``runtime/specs.py``): each worker's
slots and priority floors."""

from __future__ import annotations

from typing import Any

import pytest

from cellplane_cells.domain.priorities import Floors, Priority
from cellplane_operator.runtime.specs import CellSettings


def cell(capacity: dict[str, Any], **driver: Any) -> dict[str, Any]:
    return {"metadata": {"name": "shared-a1"},
            "spec": {"region": "region-a", "tier": "shared", "capacity": capacity,
                     "driver": driver}}


def test_without_floors_the_workers_keep_their_default_shares() -> None:
    settings = CellSettings.from_body(cell({"tenants": 4, "workerSlots": 40}))
    assert settings.priority_floors is None
    assert settings.slots_per_worker == 40


def test_floors_are_each_workers_and_classes_left_out_reserve_none() -> None:
    settings = CellSettings.from_body(cell(
        {"tenants": 4, "workerSlots": 40, "priorityFloors": {"critical": 4, "low": 2}},
        workerProcesses=3))
    assert settings.slots_per_worker == 14  # 40 over 3 processes, rounded up
    assert settings.priority_floors == Floors(14, {
        Priority.CRITICAL: 4, Priority.HIGH: 0, Priority.DEFAULT: 0, Priority.LOW: 2})


def test_a_kubernetes_cells_slots_are_spread_over_its_worker_pods() -> None:
    """workerProcesses is the local driver's count; the kubernetes driver's is
    workerReplicas (each Pod is one worker process)."""
    settings = CellSettings.from_body(cell({"tenants": 4, "workerSlots": 40},
                                           name="kubernetes", workerReplicas=4,
                                           workerProcesses=2))
    assert settings.slots_per_worker == 10
    local = CellSettings.from_body(cell({"tenants": 4, "workerSlots": 40},
                                        workerReplicas=4, workerProcesses=2))
    assert local.slots_per_worker == 20


def test_floors_over_a_workers_slots_are_a_spec_the_operator_cannot_run() -> None:
    """The CRD refuses them; one stored under an older CRD is said on the Cell's Accepted
    condition (``CellController._facts``), and never reaches a worker that would stop."""
    with pytest.raises(ValueError, match=r"spec.capacity.priorityFloors: floors "
                       r"CRITICAL=8,HIGH=8,DEFAULT=0,LOW=0 add up to 16, more than the "
                       r"worker's 10 slots"):
        CellSettings.from_body(cell(
            {"tenants": 4, "workerSlots": 40, "priorityFloors": {"critical": 8, "high": 8}},
            name="kubernetes", workerReplicas=4))
