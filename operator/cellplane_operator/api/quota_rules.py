"""CEL rules that keep a Tenant's quota overrides within its plan's ceilings.

The ceilings live in the cell stack (``cellplane_cells.domain.plans``), which
enforces them again when the operator provisions the tenant. The rules are
generated from that same table, so ``kubectl apply`` refuses an override at
once and with the number the cell would use; a changed ceiling changes the CRD
on the next ``crdgen`` run (and the committed-CRDs test fails until then).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import get_type_hints

from cellplane_cells.domain.plans import Plan, Quotas
from cellplane_operator.api.base import Rule

__all__ = ["QUOTA_FIELDS", "quota_ceiling_rules"]

QUOTA_FIELDS: dict[str, str] = {
    "maxRunningJobs": "max_running_jobs",
    "jobsPerSecond": "jobs_per_second",
    "burst": "burst",
    "dailySpendLimit": "daily_spend_limit",
    "strictSchedules": "strict_schedules",
}
"""spec.quotas field -> the ``Quotas`` attribute that holds its ceiling."""


def quota_ceiling_rules(ceilings: Mapping[Plan, Quotas]) -> list[Rule]:
    """Rules for TenantSpec: each override at most its plan's ceiling; a quota
    with no ceiling on a plan (None) is refused on that plan altogether.

    One rule per plan and field rather than one with a map lookup: each message
    is a plain string naming the field, the plan and the number.
    """
    unmapped = {f.name for f in fields(Quotas)} - set(QUOTA_FIELDS.values())
    if unmapped:
        raise ValueError(f"Quotas fields without a spec.quotas field: {sorted(unmapped)}")
    doubles = {name for name, hint in get_type_hints(Quotas).items() if hint is float}
    rules: list[Rule] = []
    for field, attribute in QUOTA_FIELDS.items():
        unset = f"!has(self.quotas) || !has(self.quotas.{field})"
        path = f".quotas.{field}"
        allowed = [plan for plan, limits in ceilings.items()
                   if getattr(limits, attribute) is not None]
        if len(allowed) < len(ceilings):
            plans = ", ".join(f"'{plan.value}'" for plan in allowed)
            names = " and ".join(plan.value for plan in allowed)
            noun = "plan" if len(allowed) == 1 else "plans"
            rules.append(Rule(f"{unset} || self.plan in [{plans}]",
                              f"quotas.{field} applies to the {names} {noun} only",
                              field_path=path))
        for plan in allowed:
            ceiling: int | float = getattr(ceilings[plan], attribute)
            rules.append(Rule(
                f"self.plan != '{plan.value}' || {unset} || self.quotas.{field} <= "
                f"{_cel(ceiling, double=attribute in doubles)}",
                f"quotas.{field} must be at most {_text(ceiling)} on the {plan.value} plan",
                field_path=path,
            ))
    return rules


def _cel(number: int | float, *, double: bool) -> str:
    """A literal of the field's own CEL type (``number`` is a double there): the
    type follows the ``Quotas`` annotation, not whether Python holds 20 or 20.0."""
    return repr(float(number)) if double else str(int(number))


def _text(number: int | float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)
