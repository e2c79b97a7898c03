"""The strict allowance: which schedules may be strict, and which work may be CRITICAL.

A strict schedule has dispatch window 0: each run starts at its scheduled
second, with no spreading. A tenant may have at most its allowance
(``Quotas.strict_schedules``) of them *active* at once; a paused, cancelled or
completed one holds no slot. Every schedule fires at most once a minute (the
cron dialect has no seconds), so the count of active strict schedules bounds
how many strict runs of the tenant can be due in any one second: the seed's
per-second cap on strict work, kept without counting per due second.

CRITICAL is the class of work that must not wait (seed step 2.2): only strict
schedules may ask for it, and only tenants with an allowance. A CRITICAL
schedule with a window is a request that contradicts itself (422, naming
``priority``); a CRITICAL anything from a tenant whose allowance is 0 is over
that allowance (409). An immediate job (``POST /v1/jobs``) runs as soon as it
is queued, as a strict run does; it holds no slot (it is not a schedule that
comes back every minute) but may be CRITICAL only for a tenant with an
allowance, so the class stays with the tenants the allowance was granted to.

Pure: the caller counts the tenant's active strict schedules (under a lock
that serialises the tenant's strict writes) and hands the numbers in.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellplane_cells.domain.priorities import Priority

__all__ = ["STRICT_WINDOW_SECONDS", "AllowanceExceeded", "is_strict", "critical_window_problem",
           "schedule_admission", "job_admission"]

STRICT_WINDOW_SECONDS = 0
"""The dispatch window of a strict schedule."""


def is_strict(dispatch_window_seconds: int) -> bool:
    return dispatch_window_seconds == STRICT_WINDOW_SECONDS


@dataclass(frozen=True)
class AllowanceExceeded:
    """A refusal: the tenant's allowance and how many active strict schedules it has."""

    allowance: int
    in_use: int
    message: str


def critical_window_problem(priority: Priority, dispatch_window_seconds: int) -> str | None:
    """Why a schedule may not ask for this class with this window, or None."""
    if priority is Priority.CRITICAL and not is_strict(dispatch_window_seconds):
        return ("CRITICAL must be strict: a CRITICAL schedule needs dispatch_window_seconds 0, "
                f"not {dispatch_window_seconds}")
    return None


def schedule_admission(*, priority: Priority, dispatch_window_seconds: int, active: bool,
                       allowance: int, others_in_use: int,
                       holds_a_slot: bool = False) -> AllowanceExceeded | None:
    """May the tenant have this schedule? None if so.

    ``active``: the schedule is (or becomes) active by this write: a create, a
    resume, or an update of an active schedule; an update of a paused one is
    counted when it is resumed. ``others_in_use``: the tenant's active strict
    schedules other than this one. ``holds_a_slot``: it is an active strict
    schedule already (an update that keeps it strict adds none). A tenant over
    its allowance (it was lowered) keeps its schedules and may edit them, but
    gets no new one until it is under.
    """
    if priority is Priority.CRITICAL and allowance == 0:
        return AllowanceExceeded(allowance, others_in_use,
                                 "CRITICAL schedules are for tenants with a strict allowance; "
                                 "this tenant's is 0")
    if holds_a_slot or not (active and is_strict(dispatch_window_seconds)):
        return None
    if others_in_use + 1 > allowance:
        return AllowanceExceeded(allowance, others_in_use,
                                 f"the tenant has {others_in_use} active strict schedules and an "
                                 f"allowance of {allowance}; pause or cancel one, or give this "
                                 "one a dispatch window")
    return None


def job_admission(*, priority: Priority, allowance: int, in_use: int) -> AllowanceExceeded | None:
    """May the tenant queue an immediate job in this class? None if so."""
    if priority is Priority.CRITICAL and allowance == 0:
        return AllowanceExceeded(allowance, in_use,
                                 "CRITICAL jobs are for tenants with a strict allowance; "
                                 "this tenant's is 0")
    return None
