"""What the operator reports for a Cell it has accepted.

The foundation's operator does not run cell stacks yet: it validates what the
schema cannot (nothing, so far, beyond the schema's own rules), accepts the
spec and says plainly that no stack is provisioned. Later issues turn the
``Ready`` condition into the outcome of provisioning.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NewType

from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition

__all__ = ["CellName", "Region", "Tier", "CellSpec", "CellStatusPlan", "plan_cell_status"]

CellName = NewType("CellName", str)
Region = NewType("Region", str)


class Tier(str, Enum):
    SHARED = "shared"
    DEDICATED = "dedicated"


@dataclass(frozen=True)
class CellSpec:
    name: CellName
    region: Region
    tier: Tier
    tenant_capacity: int
    worker_slots: int

    @classmethod
    def from_manifest(cls, name: str, spec: Mapping[str, Any]) -> CellSpec:
        """Reads a spec the apiserver has already validated against the CRD schema."""
        capacity = spec["capacity"]
        return cls(
            name=CellName(name),
            region=Region(spec["region"]),
            tier=Tier(spec["tier"]),
            tenant_capacity=int(capacity["tenants"]),
            worker_slots=int(capacity["workerSlots"]),
        )


@dataclass(frozen=True)
class CellStatusPlan:
    phase: str
    observed_generation: int
    conditions: list[dict[str, Any]]

    def as_status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "observedGeneration": self.observed_generation,
            "conditions": self.conditions,
        }


def plan_cell_status(
    cell: CellSpec,
    *,
    generation: int,
    current_conditions: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
) -> CellStatusPlan:
    accepted = Condition(
        type="Accepted",
        status=ConditionStatus.TRUE,
        reason="SpecValid",
        message=f"{cell.tier.value} cell in {cell.region} for up to {cell.tenant_capacity} "
        f"tenant(s) and {cell.worker_slots} worker slot(s)",
        observed_generation=generation,
    )
    ready = Condition(
        type="Ready",
        status=ConditionStatus.FALSE,
        reason="StackNotProvisioned",
        message="no cell stack runs for this cell yet",
        observed_generation=generation,
    )
    conditions = set_condition(current_conditions, accepted, now=now)
    conditions = set_condition(conditions, ready, now=now)
    return CellStatusPlan(phase="Pending", observed_generation=generation, conditions=conditions)
