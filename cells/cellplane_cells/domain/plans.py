"""Per-plan quotas (docs/concepts.md, Plan).

Free 2 running jobs, Pro 5, Enterprise 20 (10% of a 200-slot fleet, so it takes
ten tenants at their cap to fill it). Enterprise's rate is 1 job/s with a burst
of 60; Free and Pro are prepaid, so their wallet is a natural limit too.
Strict schedules (dispatch window 0, the only ones that may be CRITICAL) are a
paid guarantee: none on Free; on Pro and Enterprise as many as the plan's
running cap, so that all of a tenant's strict runs due in the same second can
start at once within its cap (docs/schedules.md, The strict allowance).
A Tenant may override its quotas within its plan's ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

__all__ = ["Plan", "Quotas", "PLAN_DEFAULTS", "PLAN_CEILINGS", "QUOTA_FLOORS", "quotas_for"]


class Plan(str, Enum):
    FREE = "free"
    PRO = "pro"
    ENTERPRISE = "enterprise"


@dataclass(frozen=True)
class Quotas:
    max_running_jobs: int
    """Jobs of the tenant that may run at once; enforced in the claim statement."""
    jobs_per_second: float
    """Sustained submission rate of the API's token bucket."""
    burst: int
    """Bucket size: submissions allowed at once after a quiet spell."""
    daily_spend_limit: int | None
    """Micro-credits an enterprise tenant may reserve per day; None for prepaid plans."""
    strict_schedules: int
    """Active strict (dispatch window 0) schedules the tenant may have: its strict
    allowance. It bounds how many strict runs of the tenant are due in one second, and
    CRITICAL work is for tenants that have one (``domain/strict_allowance.py``)."""


PLAN_DEFAULTS: dict[Plan, Quotas] = {
    Plan.FREE: Quotas(max_running_jobs=2, jobs_per_second=0.2, burst=5, daily_spend_limit=None,
                      strict_schedules=0),
    Plan.PRO: Quotas(max_running_jobs=5, jobs_per_second=0.5, burst=20, daily_spend_limit=None,
                     strict_schedules=5),
    Plan.ENTERPRISE: Quotas(max_running_jobs=20, jobs_per_second=1.0, burst=60,
                            daily_spend_limit=1_000_000_000, strict_schedules=20),
}

PLAN_CEILINGS: dict[Plan, Quotas] = {
    Plan.FREE: Quotas(max_running_jobs=2, jobs_per_second=1.0, burst=10, daily_spend_limit=None,
                      strict_schedules=0),
    Plan.PRO: Quotas(max_running_jobs=50, jobs_per_second=20.0, burst=200, daily_spend_limit=None,
                     strict_schedules=50),
    Plan.ENTERPRISE: Quotas(max_running_jobs=500, jobs_per_second=500.0, burst=5000,
                            daily_spend_limit=10**13, strict_schedules=500),
}

QUOTA_FLOORS = Quotas(max_running_jobs=0, jobs_per_second=0.001, burst=1, daily_spend_limit=0,
                      strict_schedules=0)
"""The least value of each quota on every plan. The Tenant CRD's minimums are these
(``api/v1alpha1.py`` reads them), so what the apiserver admits a cell accepts. A rate
under one job per 1000 s is a mistake, not a limit: the bucket would take days to refill."""


def quotas_for(
    plan: Plan,
    *,
    max_running_jobs: int | None = None,
    jobs_per_second: float | None = None,
    burst: int | None = None,
    daily_spend_limit: int | None = None,
    strict_schedules: int | None = None,
) -> Quotas:
    """The plan's defaults with the given overrides; raises ValueError above a ceiling."""
    quotas = PLAN_DEFAULTS[plan]
    if max_running_jobs is not None:
        quotas = replace(quotas, max_running_jobs=max_running_jobs)
    if jobs_per_second is not None:
        quotas = replace(quotas, jobs_per_second=jobs_per_second)
    if burst is not None:
        quotas = replace(quotas, burst=burst)
    if strict_schedules is not None:
        quotas = replace(quotas, strict_schedules=strict_schedules)
    if daily_spend_limit is not None:
        if plan is not Plan.ENTERPRISE:
            raise ValueError("only enterprise tenants have a daily spend limit")
        quotas = replace(quotas, daily_spend_limit=daily_spend_limit)
    ceiling = PLAN_CEILINGS[plan]
    for field in ("max_running_jobs", "jobs_per_second", "burst", "strict_schedules"):
        value, limit = getattr(quotas, field), getattr(ceiling, field)
        if value > limit:
            raise ValueError(f"{field} {value} is above the {plan.value} plan's ceiling of {limit}")
        floor = getattr(QUOTA_FLOORS, field)
        if value < floor:
            raise ValueError(f"{field} must be at least {floor:g}, got {value:g}")
    if (quotas.daily_spend_limit is not None and ceiling.daily_spend_limit is not None
            and QUOTA_FLOORS.daily_spend_limit is not None
            and not QUOTA_FLOORS.daily_spend_limit <= quotas.daily_spend_limit
            <= ceiling.daily_spend_limit):
        raise ValueError(f"daily_spend_limit {quotas.daily_spend_limit} is outside "
                         f"{QUOTA_FLOORS.daily_spend_limit}..{ceiling.daily_spend_limit}")
    return quotas
