"""What a Tenant's status says, from how far its reconcile got.

The placement leader reports it. ``Placed`` is true once etcd holds the
tenant's record (the only source of truth for where it lives); ``Ready`` once
the cell's database has the tenant with the quotas of this generation and its
key is in the Secret. An expected obstacle (no capacity, a cell still starting)
is a reason on a condition, never an exception.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellplane_cells.domain.plans import Quotas

from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition

__all__ = ["TenantProgress", "plan_tenant_status"]


@dataclass(frozen=True)
class TenantProgress:
    phase: str
    """Pending, Placing, Provisioning, Ready, Unplaceable, Deleting or Degraded."""
    reason: str
    message: str
    cell: str | None = None
    epoch: int | None = None
    tenant_id: str | None = None
    api_endpoint: str | None = None
    api_key_secret: str | None = None
    quotas: Quotas | None = None
    cell_degraded: bool = False
    moving: str | None = None
    """What a TenantMove under way says ("acme-to-b: CatchingUp to cell b"); None if none."""


def plan_tenant_status(progress: TenantProgress, *, generation: int,
                       current_conditions: Sequence[Mapping[str, Any]],
                       now: datetime.datetime) -> dict[str, Any]:
    def condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
        return Condition(type_, ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason,
                         message, observed_generation=generation)

    ready = progress.phase in ("Ready", "Degraded")
    placed = (condition("Placed", True, "Recorded",
                        f"placed in cell {progress.cell} at epoch {progress.epoch}")
              if progress.cell else condition("Placed", False, progress.reason, progress.message))
    conditions = set_condition(current_conditions, placed, now=now)
    conditions = set_condition(conditions, condition(
        "Ready", ready, "Provisioned" if ready else progress.reason,
        f"serving from cell {progress.cell}" if ready else progress.message), now=now)
    conditions = set_condition(conditions, condition(
        "Degraded", progress.cell_degraded, "CellDegraded" if progress.cell_degraded else "CellHealthy",
        f"cell {progress.cell} lost redundancy" if progress.cell_degraded
        else "the tenant's cell has full redundancy"), now=now)
    conditions = set_condition(conditions, condition(
        "Moving", progress.moving is not None, "MoveInProgress" if progress.moving else "NoMove",
        f"TenantMove {progress.moving}" if progress.moving else "no TenantMove in progress"),
        now=now)
    status: dict[str, Any] = {"phase": progress.phase, "observedGeneration": generation,
                              "conditions": conditions}
    for key, value in (("cell", progress.cell), ("epoch", progress.epoch),
                       ("tenantId", progress.tenant_id), ("apiEndpoint", progress.api_endpoint),
                       ("apiKeySecret", progress.api_key_secret)):
        if value is not None:
            status[key] = value
    if progress.quotas is not None:
        quotas = progress.quotas
        status["quotas"] = {"maxRunningJobs": quotas.max_running,
                            "jobsPerSecond": quotas.jobs_per_second, "burst": quotas.burst,
                            **({"dailySpendLimit": quotas.daily_spend_limit}
                               if quotas.daily_spend_limit is not None else {})}
    return status
