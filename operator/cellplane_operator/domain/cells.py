"""What a Cell's status says, from what its owner observed of its sites.

The owner of a cell's placement group reports it; nobody else does. The phase
is a summary for people and for placement (only Ready cells take tenants);
the conditions carry the reasons:

- ``Ready``: the primary site serves under the current epoch (and, when the
  cell has standby regions, every standby streams within the allowed lag the
  first time; later a lagging standby makes the cell Degraded, not unready).
- ``Degraded``: the cell serves but lost redundancy (a standby not streaming
  or over ``maxStandbyLagSeconds``).
- phase ``Fenced``: the owner could not confirm its lease and stopped the cell's
  work, or a person fenced the cell (``domain/fencing.py``), which the ``Fenced``
  condition then says, with the reason given.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, NewType

from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition
from cellplane_operator.domain.fencing import ManualFence, fence_condition

__all__ = ["CellName", "CellPhase", "Region", "Tier", "StandbyReport", "CellObservation",
           "plan_cell_status", "plan_refused_failover", "SERVING_PHASES", "CellFacts",
           "CellVerdict", "judge_cell", "plan_cell_acceptance", "DeletionBlocked",
           "cell_deletion"]

CellName = NewType("CellName", str)
Region = NewType("Region", str)

class CellPhase(StrEnum):
    """A Cell's ``status.phase``."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DRAINING = "Draining"
    FAILING_OVER = "FailingOver"
    DEGRADED = "Degraded"
    FENCED = "Fenced"


SERVING_PHASES = frozenset({CellPhase.READY, CellPhase.DRAINING, CellPhase.DEGRADED})
"""Phases in which the cell's primary serves its tenants."""


class Tier(str, Enum):
    SHARED = "shared"
    DEDICATED = "dedicated"


@dataclass(frozen=True)
class StandbyReport:
    region: str
    streaming: bool
    lag_seconds: float | None
    message: str = ""


@dataclass(frozen=True)
class CellObservation:
    generation: int
    active_region: str
    active_site: str
    epoch: int | None
    """The epoch the owner holds; None while it holds none (waiting or fenced)."""
    fenced: bool
    database_up: bool
    serving: bool
    api_endpoint: str | None
    admin_endpoint: str | None
    draining: bool = False
    standby_regions: tuple[str, ...] = ()
    standbys: tuple[StandbyReport, ...] = ()
    max_standby_lag_seconds: float = 30.0
    previous_phase: str | None = None
    problem: str = field(default="")
    """Why the site is not serving, when known (a start error, a log tail)."""
    fence: ManualFence | None = None
    """The fence the Cell's annotation asks for."""
    fence_in_force: ManualFence | None = None
    """The fence under which the owner's last accepted database grant was made."""


def _standby_problems(observed: CellObservation) -> list[str]:
    reports = {report.region: report for report in observed.standbys}
    problems: list[str] = []
    for region in observed.standby_regions:
        report = reports.get(region)
        if report is None:
            problems.append(f"standby in {region}: no report yet")
        elif not report.streaming:
            problems.append(f"standby in {region} not streaming"
                            + (f" ({report.message})" if report.message else ""))
        elif report.lag_seconds is not None and report.lag_seconds > observed.max_standby_lag_seconds:
            problems.append(f"standby in {region} {report.lag_seconds:.1f}s behind "
                            f"(max {observed.max_standby_lag_seconds:g}s)")
    return problems


def plan_cell_status(observed: CellObservation, *, current_conditions: Sequence[Mapping[str, Any]],
                     now: datetime.datetime) -> dict[str, Any]:
    """The status subresource the owner writes: phase, fields and merged conditions."""
    generation = observed.generation
    standby_problems = _standby_problems(observed)
    # A new cell waits for its standbys before it first says Ready; a cell that served
    # before (a takeover raised its epoch past 1) serves at once, Degraded if need be.
    was_serving = observed.previous_phase in SERVING_PHASES or (observed.epoch or 0) > 1

    def condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
        return Condition(type_, ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason,
                         message, observed_generation=generation)

    user_fence = observed.fence or observed.fence_in_force
    if observed.fenced:
        phase = CellPhase.FENCED
        ready = condition("Ready", False, "Fenced",
                          "the owner could not confirm its lease in time and stopped the cell")
    elif user_fence is not None and observed.database_up:
        # Not Ready, so placement puts no tenant here and moves wait; the API still
        # answers (reads work, writes are refused by the database). Also while an
        # operator that just restarted has not adopted the lease yet: nothing writes then.
        phase = CellPhase.FENCED
        ready = condition("Ready", False, "FencedByUser",
                          f"fenced on purpose: {user_fence.reason}")
    elif not observed.database_up:
        phase = CellPhase.PROVISIONING
        ready = condition("Ready", False, "DatabaseNotRunning",
                          observed.problem or "the primary database is starting")
    elif observed.epoch is None:
        phase = CellPhase.PROVISIONING
        ready = condition("Ready", False, "AwaitingOwnership",
                          "waiting to acquire the placement-group lease (after an operator "
                          "restart: until the previous holder's lease has run out)")
    elif not observed.serving:
        phase = CellPhase.PROVISIONING
        ready = condition("Ready", False, "ProcessesStarting",
                          observed.problem or "starting the cell API and workers")
    elif standby_problems and not was_serving:
        phase = CellPhase.PROVISIONING
        ready = condition("Ready", False, "StandbyNotStreaming", "; ".join(standby_problems))
    else:
        phase = (CellPhase.DRAINING if observed.draining
                 else CellPhase.DEGRADED if standby_problems else CellPhase.READY)
        ready = condition("Ready", True, "Serving",
                          f"primary site {observed.active_site} serves under epoch "
                          f"{observed.epoch}")
    degraded = (condition("Degraded", True, "StandbyNotStreaming", "; ".join(standby_problems))
                if standby_problems and phase in SERVING_PHASES
                else condition("Degraded", False, "FullRedundancy" if observed.standby_regions
                               else "NoStandbyConfigured",
                               "every standby streams" if observed.standby_regions
                               else "this cell has no standby regions"))
    conditions = set_condition(current_conditions, ready, now=now)
    conditions = set_condition(conditions, degraded, now=now)
    fenced = fence_condition(observed.fence, observed.fence_in_force, generation=generation,
                             holder=observed.active_site, epoch=observed.epoch)
    if fenced is not None:
        conditions = set_condition(conditions, fenced, now=now)
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": generation,
        "activeRegion": observed.active_region,
        "activeSite": observed.active_site,
        "conditions": conditions,
        "standbys": [
            {"region": r.region, "streaming": r.streaming, "message": r.message,
             **({"lagSeconds": round(r.lag_seconds, 3)} if r.lag_seconds is not None else {})}
            for r in sorted(observed.standbys, key=lambda r: r.region)
            if r.region in observed.standby_regions
        ],
    }
    if observed.epoch is not None:
        status["epoch"] = observed.epoch
    lags = [r.lag_seconds for r in observed.standbys if r.lag_seconds is not None]
    if lags:
        status["standbyLagSeconds"] = round(max(lags), 3)
    if ((phase in SERVING_PHASES or (phase == CellPhase.FENCED and not observed.fenced))
            and observed.api_endpoint and observed.admin_endpoint):
        status["endpoints"] = {"api": observed.api_endpoint, "admin": observed.admin_endpoint}
    return status


def plan_refused_failover(*, generation: int, reason: str, message: str,
                          current_conditions: Sequence[Mapping[str, Any]],
                          now: datetime.datetime) -> dict[str, Any]:
    """The status a standby writes while the cell has no owner and it will not take over.

    Only then does anyone but the owner write the Cell's status: nobody else
    would say why the cell stays down.
    """
    ready = Condition("Ready", ConditionStatus.FALSE, reason, message,
                      observed_generation=generation)
    return {"phase": CellPhase.FAILING_OVER, "conditions": set_condition(current_conditions, ready, now=now),
            "endpoints": None}


# -- acceptance: what the placement leader says of every Cell ---------------------------


@dataclass(frozen=True)
class CellFacts:
    """A Cell as the placement leader sees it: its spec (or why it cannot be read) and
    what the placement records put in it."""

    name: str
    spec_problem: str | None
    """Why the spec cannot be read (an object stored under an older CRD); None if it can."""
    name_ok: bool
    """The name is a DNS label, as spec.cell and a TenantMove's targetCell must be."""
    region: str = ""
    standby_regions: tuple[str, ...] = ()
    known_regions: tuple[str, ...] = ()
    """Every region of the deployment; empty when the operator was not told (no judgement)."""
    tier: Tier = Tier.SHARED
    tenant_capacity: int = 0
    worker_slots: int = 0
    tenants_placed: int = 0
    slots_in_use: int = 0


@dataclass(frozen=True)
class CellVerdict:
    accepted: bool
    reason: str
    message: str
    unusable: bool = False
    """No site of the cell runs, so nobody else writes its status (phase Pending then)."""


def judge_cell(facts: CellFacts) -> CellVerdict:
    """Whether the spec can be carried out as written, and if not, which field and why.

    These are the cases the apiserver cannot refuse (they depend on the deployment or
    on what is placed) or could not when the object was stored: a Cell in a region no
    operator runs gets no site and, without this, no status at all; a capacity shrunk
    below what is placed was accepted without a word. Placement already keeps such a
    cell from taking more tenants; this says so on the object.
    """
    if facts.spec_problem is not None:
        return CellVerdict(False, "InvalidSpec", f"the spec cannot be read: {facts.spec_problem}",
                           unusable=True)
    if not facts.name_ok:
        return CellVerdict(False, "InvalidName",
                           f"metadata.name {facts.name!r} is not a DNS label (at most 63 "
                           "lowercase letters, digits and '-'): no Tenant's spec.cell or "
                           "TenantMove's targetCell can name it, and placement skips it")
    if facts.known_regions:
        if facts.region not in facts.known_regions:
            return CellVerdict(False, "UnknownRegion",
                               f"spec.region {facts.region!r} is not a region of this "
                               f"deployment ({', '.join(facts.known_regions)}): no operator "
                               "runs the cell's primary site", unusable=True)
        unknown = [r for r in facts.standby_regions if r not in facts.known_regions]
        if unknown:
            return CellVerdict(False, "UnknownStandbyRegion",
                               f"spec.standbyRegions names {', '.join(unknown)}, not a region "
                               f"of this deployment ({', '.join(facts.known_regions)}): no "
                               "standby site runs there")
    over: list[str] = []
    if facts.tier is Tier.DEDICATED and facts.tenants_placed > 1:
        over.append(f"spec.tier is dedicated (one tenant) but {facts.tenants_placed} tenants "
                    "are placed")
    elif facts.tenants_placed > facts.tenant_capacity:
        over.append(f"spec.capacity.tenants is {facts.tenant_capacity} but "
                    f"{facts.tenants_placed} tenants are placed")
    if facts.slots_in_use > facts.worker_slots:
        over.append(f"spec.capacity.workerSlots is {facts.worker_slots} but the placed "
                    f"tenants may run {facts.slots_in_use} jobs at once")
    if over:
        return CellVerdict(False, "CapacityBelowUse",
                           "; ".join(over) + ": no tenant is placed here until the use fits; "
                           "move tenants out (TenantMove) or raise the capacity")
    return CellVerdict(True, "Accepted", "the spec can be carried out as written")


def plan_cell_acceptance(verdict: CellVerdict, *, generation: int,
                         current: Mapping[str, Any], now: datetime.datetime
                         ) -> dict[str, Any] | None:
    """The status patch that records ``verdict`` (its ``Accepted`` condition, and phase
    Pending for a cell no site reports on); None if the status says so already."""
    accepted = Condition("Accepted", ConditionStatus.TRUE if verdict.accepted
                         else ConditionStatus.FALSE, verdict.reason, verdict.message,
                         observed_generation=generation)
    conditions = set_condition(current.get("conditions") or [], accepted, now=now)
    patch: dict[str, Any] = {}
    if conditions != list(current.get("conditions") or []):
        patch["conditions"] = conditions
    if verdict.unusable and current.get("phase") in (None, ""):
        patch["phase"] = "Pending"
    return patch or None


# -- deletion: what keeps a Cell --------------------------------------------------------

_NAMED_HOLDERS = 5
"""Tenants named in a blocked deletion's Event; the count says how many more there are."""


@dataclass(frozen=True)
class DeletionBlocked:
    """The Cell keeps its finalizer: tenants are still placed in it."""

    reason: str
    message: str


def cell_deletion(name: str, holding: Sequence[str]) -> DeletionBlocked | None:
    """Whether a Cell whose deletion was asked may go (None) or is kept, and why.

    ``holding`` names the tenants whose placement records point at the cell: deleting
    it under them would take their data with it, so they are moved or deleted first."""
    if not holding:
        return None
    listed = sorted(holding)
    return DeletionBlocked("DeletionBlocked",
                           f"cell {name} still holds {len(listed)} tenant(s) "
                           f"({', '.join(listed[:_NAMED_HOLDERS])}); move or delete them first")
