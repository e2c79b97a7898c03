"""What a Tenant's status says, from how far its reconcile got.

The placement leader reports it. ``Placed`` is true once etcd holds the
tenant's record (the only source of truth for where it lives); ``Ready`` once
the cell's database has the tenant with the quotas of this generation and its
key is in the Secret. An expected obstacle (no capacity, a cell still starting)
is a reason on a condition, never an exception.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from cellplane_cells.domain.plans import Quotas

from cellplane_operator.domain.cells import SERVING_PHASES, CellPhase
from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition
from cellplane_operator.domain.fencing import ManualFence
from cellplane_operator.domain.moves import MOVING_PHASES

_LABEL_VALUE_MAX = 63

REFUSED_BY_CELL = frozenset({400, 413, 422})
"""Answers of a cell's admin API that refuse what was asked (the spec), not the moment:
asking again changes nothing until the spec (or the cell's policy) does."""

__all__ = ["TenantPhase", "TenantProgress", "plan_tenant_status", "REFUSED_BY_CELL", "refused_by_cell",
           "name_problem", "TenantCell", "ProvisionIn", "WaitForTenantCell", "provisioning_cell",
           "provisioned_event", "SayProgress", "ForgetSaid", "progress_news",
           "provisioning_failed", "record_update_due", "secret_of_another_tenant",
           "RemoveFrom", "CellGone", "removal_cell", "purges_data", "removed_message",
           "MoveSeen", "moves_under_way"]


class TenantPhase(StrEnum):
    """A Tenant's ``status.phase``."""

    PENDING = "Pending"
    PLACING = "Placing"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    UNPLACEABLE = "Unplaceable"
    MOVING = "Moving"
    DELETING = "Deleting"
    DEGRADED = "Degraded"


@dataclass(frozen=True)
class TenantProgress:
    phase: TenantPhase
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
    refused: bool = False
    """The spec as written cannot be carried out: a person must change it (a Warning)."""


def plan_tenant_status(progress: TenantProgress, *, generation: int,
                       current_conditions: Sequence[Mapping[str, Any]],
                       now: datetime.datetime) -> dict[str, Any]:
    def condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
        return Condition(type_, ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason,
                         message, observed_generation=generation)

    ready = progress.phase in (TenantPhase.READY, TenantPhase.DEGRADED)
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
        status["quotas"] = {"maxRunningJobs": quotas.max_running_jobs,
                            "jobsPerSecond": quotas.jobs_per_second, "burst": quotas.burst,
                            "strictSchedules": quotas.strict_schedules,
                            **({"dailySpendLimit": quotas.daily_spend_limit}
                               if quotas.daily_spend_limit is not None else {})}
    return status


def name_problem(name: str) -> str | None:
    """Why a Tenant of this name cannot be served, or None.

    The CRD refuses such names now (and dotted ones, which no TenantMove can name);
    an object stored before it did is told so instead of failing for ever. A dotted
    name of 63 or fewer still works here (a label value may hold dots), so a tenant
    served before is not stopped for it.
    """
    if len(name) > _LABEL_VALUE_MAX:
        return (f"metadata.name is {len(name)} characters: the cellplane.io/tenant label on "
                f"the tenant's Secret holds at most {_LABEL_VALUE_MAX}; delete the Tenant and "
                "create it under a shorter name")
    return None


def refused_by_cell(*, cell: str, answer: str, targets: Sequence[tuple[str, str]],
                    webhooks: Sequence[str]) -> TenantProgress:
    """The tenant's status when its cell refused what the spec asks, naming the field.

    ``answer`` is the cell's refusal (its message names the URL it refused); the
    targets are (name, url) pairs and the webhooks their URLs, as in the spec.
    """
    # Longest first: of http://a and http://a:8080/x, the answer names the latter.
    for name, url in sorted(targets, key=lambda target: -len(target[1])):
        if url in answer:
            return TenantProgress(TenantPhase.PROVISIONING, "TargetRefused",
                                  f"cell {cell} refuses spec.targets[name={name}].url {url}: "
                                  f"{answer}", refused=True)
    for url in sorted(webhooks, key=len, reverse=True):
        if url in answer:
            return TenantProgress(TenantPhase.PROVISIONING, "WebhookRefused",
                                  f"cell {cell} refuses spec.webhooks[url={url}]: {answer}",
                                  refused=True)
    return TenantProgress(TenantPhase.PROVISIONING, "SpecRefused",
                          f"cell {cell} refuses the tenant's spec: {answer}", refused=True)


# -- whether the tenant's cell can take it now ----------------------------------------


@dataclass(frozen=True)
class TenantCell:
    """The cell the tenant's record names, as its Cell object says."""

    phase: str | None
    """Its status.phase; None before it reports one."""
    admin_endpoint: str | None
    fence: ManualFence | None = None
    """The fence a person put on it, if any."""


@dataclass(frozen=True)
class ProvisionIn:
    """The cell serves: provision the tenant through its admin API."""

    admin_endpoint: str
    degraded: bool
    """The cell serves Degraded: the tenant is too, once provisioned."""


@dataclass(frozen=True)
class WaitForTenantCell:
    """Not now: the tenant says why on its status and is looked at again with backoff."""

    reason: str
    message: str


def provisioning_cell(name: str, cell: TenantCell | None) -> ProvisionIn | WaitForTenantCell:
    """May the tenant be provisioned in its cell ``name`` now (None: no such Cell object)?

    A fence a person put on is said as such rather than "not ready", so that the
    tenant's owner knows who to ask."""
    if cell is not None and cell.fence is not None:
        return WaitForTenantCell(
            "CellFenced", f"cell {name} is fenced ({cell.fence.reason}): writes are refused "
                          f"until `kubectl cellplane unfence {name}`")
    if cell is None or cell.phase not in SERVING_PHASES or not cell.admin_endpoint:
        phase = cell.phase if cell is not None else None
        return WaitForTenantCell(
            "CellNotReady", f"cell {name} is {phase or 'not reporting yet'}; the tenant is "
                            "provisioned there once it serves")
    return ProvisionIn(cell.admin_endpoint, degraded=cell.phase == CellPhase.DEGRADED)


def provisioned_event(status: Mapping[str, Any], *, cell: str, generation: int) -> str | None:
    """The Event's reason once the tenant is provisioned in ``cell`` at ``generation``,
    given the Tenant's status as it stands: ``Provisioned`` when it first serves there,
    ``QuotasApplied`` when a new generation reached the cell it serves from, None when a
    new leader merely provisioned again what its predecessor had."""
    serving_there = status.get("cell") == cell and status.get("phase") in (TenantPhase.READY, TenantPhase.DEGRADED)
    if serving_there and status.get("observedGeneration") == generation:
        return None
    return "QuotasApplied" if serving_there else "Provisioned"


@dataclass(frozen=True)
class SayProgress:
    """An Event about the tenant's progress, remembered as ``said`` so it is said once."""

    type: Literal["Normal", "Warning"]
    said: str


@dataclass(frozen=True)
class ForgetSaid:
    """The tenant serves: what was said is forgotten, so a later obstacle is said again."""


def progress_news(progress: TenantProgress, *,
                  said_before: str | None) -> SayProgress | ForgetSaid | None:
    """Whether the tenant's progress is news for an Event: once per reason while it does
    not serve (a refusal once per refused field too: its message names it), a Warning
    when it cannot be placed or its spec is refused; None when it was said already."""
    if progress.phase in (TenantPhase.READY, TenantPhase.DEGRADED):
        return ForgetSaid()
    said = f"{progress.reason}: {progress.message}" if progress.refused else progress.reason
    if said == said_before:
        return None
    warning = progress.phase == TenantPhase.UNPLACEABLE or progress.refused
    return SayProgress("Warning" if warning else "Normal", said)


# -- provisioning: what a failure means, what the record and the Secret need ---------------


def provisioning_failed(*, cell: str, http_status: int,
                        error: str) -> WaitForTenantCell | None:
    """How a failed call to the cell's admin API is said while it is retried with backoff:
    ``CellUnreachable`` (no answer, status 0) or ``CellFailed`` (an error on its side).
    None when the cell refused what the spec asks (``REFUSED_BY_CELL``): asking again
    changes nothing, and ``refused_by_cell`` says which field."""
    if http_status in REFUSED_BY_CELL:
        return None
    return WaitForTenantCell("CellUnreachable" if http_status == 0 else "CellFailed",
                             f"provisioning in cell {cell} failed, retried with backoff: {error}")


def record_update_due(*, recorded_max_running_jobs: int, recorded_digest: str | None,
                      max_running_jobs: int, digest: str) -> bool:
    """Does the placement record lag the tenant as provisioned? Its ``max_running_jobs`` counts
    in its cell's load, and the router checks API keys against its digest."""
    return (recorded_max_running_jobs, recorded_digest) != (max_running_jobs, digest)


def secret_of_another_tenant(*, secret_tenant_id: str | None, owner_uids: Collection[str],
                             tenant_id: str, uid: str) -> bool:
    """Is the tenant's Secret left over from a deleted Tenant of the same name (which the
    garbage collector has not removed yet)? Its key names the old tenant id, which the
    router would route to, and unlocks the retained rows: it is never reused."""
    if secret_tenant_id is not None and secret_tenant_id != tenant_id:
        return True
    return bool(owner_uids) and uid not in owner_uids


# -- removal: whether the tenant can leave its cell now, and what is said ------------------


@dataclass(frozen=True)
class RemoveFrom:
    """The cell serves: remove the tenant through its admin API."""

    admin_endpoint: str


@dataclass(frozen=True)
class CellGone:
    """No Cell object by that name: nothing holds the tenant any more."""


def removal_cell(name: str, cell: TenantCell | None) -> RemoveFrom | CellGone | WaitForTenantCell:
    """May a deleted tenant be removed from its cell ``name`` now? Only a serving cell can
    be asked; a fence does not stop a removal (it refuses the tenant's writes, not the
    admin API's)."""
    if cell is None:
        return CellGone()
    if cell.phase not in SERVING_PHASES or not cell.admin_endpoint:
        return WaitForTenantCell("CellUnavailable",
                                 f"waiting for cell {name} to serve, to remove the tenant from it")
    return RemoveFrom(cell.admin_endpoint)


def purges_data(deletion_policy: str) -> bool:
    """``Delete`` removes the tenant's rows (and its dedicated cell); ``Retain`` keeps them,
    disabled."""
    return deletion_policy == "Delete"


def removed_message(*, cell: str, tenant_id: str, purge: bool) -> str:
    """The ``Removed`` Event's message: where the data went, and how to reach what was kept."""
    if purge:
        return f"left cell {cell}; its data was deleted"
    return (f"left cell {cell}; its data was kept, disabled, as tenant {tenant_id} "
            "(deletionPolicy Retain; the cell's admin API reaches it at "
            f"/admin/v1/tenants/{tenant_id}). A Tenant created again under this name is a new "
            "tenant with a new id and none of this data")


# -- moves: which TenantMoves hold the tenant ----------------------------------------------


@dataclass(frozen=True)
class MoveSeen:
    """A TenantMove in the tenant's namespace, as the cache holds it."""

    name: str
    tenant: str | None
    """spec.tenant; None when the spec cannot be read."""
    phase: str | None
    target_cell: str | None


def moves_under_way(tenant: str, moves: Iterable[MoveSeen], *, described: bool) -> list[str]:
    """The moves of ``tenant`` that have started and not ended, by name (``described``:
    with their phase and target, for the tenant's Moving condition), sorted."""
    return sorted(f"{move.name}: {move.phase} to cell {move.target_cell}" if described
                  else move.name
                  for move in moves if move.tenant == tenant and move.phase in MOVING_PHASES)
