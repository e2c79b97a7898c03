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
from enum import Enum
from typing import Any, NewType

from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition
from cellplane_operator.domain.fencing import ManualFence, fence_condition

__all__ = ["CellName", "Region", "Tier", "StandbyReport", "CellObservation", "plan_cell_status",
           "plan_refused_failover", "SERVING_PHASES"]

CellName = NewType("CellName", str)
Region = NewType("Region", str)

SERVING_PHASES = frozenset({"Ready", "Draining", "Degraded"})
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
        phase = "Fenced"
        ready = condition("Ready", False, "Fenced",
                          "the owner could not confirm its lease in time and stopped the cell")
    elif user_fence is not None and observed.database_up:
        # Not Ready, so placement puts no tenant here and moves wait; the API still
        # answers (reads work, writes are refused by the database). Also while an
        # operator that just restarted has not adopted the lease yet: nothing writes then.
        phase = "Fenced"
        ready = condition("Ready", False, "FencedByUser",
                          f"fenced on purpose: {user_fence.reason}")
    elif not observed.database_up:
        phase = "Provisioning"
        ready = condition("Ready", False, "DatabaseNotRunning",
                          observed.problem or "the primary database is starting")
    elif observed.epoch is None:
        phase = "Provisioning"
        ready = condition("Ready", False, "AwaitingOwnership",
                          "waiting to acquire the placement-group lease (after an operator "
                          "restart: until the previous holder's lease has run out)")
    elif not observed.serving:
        phase = "Provisioning"
        ready = condition("Ready", False, "ProcessesStarting",
                          observed.problem or "starting the cell API and workers")
    elif standby_problems and not was_serving:
        phase = "Provisioning"
        ready = condition("Ready", False, "StandbyNotStreaming", "; ".join(standby_problems))
    else:
        phase = "Draining" if observed.draining else "Degraded" if standby_problems else "Ready"
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
    if ((phase in SERVING_PHASES or (phase == "Fenced" and not observed.fenced))
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
    return {"phase": "FailingOver", "conditions": set_condition(current_conditions, ready, now=now),
            "endpoints": None}
