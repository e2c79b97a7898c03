"""Kubernetes-style status conditions, merged the way ``meta.SetStatusCondition`` does.

``lastTransitionTime`` moves only when a condition's status flips; a new reason or
message alone keeps it, so a watcher can tell how long a cell has been unready.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["ConditionStatus", "Condition", "set_condition", "find_condition", "format_time"]


class ConditionStatus(str, Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str
    message: str
    observed_generation: int | None = None

    def __post_init__(self) -> None:
        if not self.reason or not self.reason[0].isalpha():
            raise ValueError(f"a condition reason must be a CamelCase word, not {self.reason!r}")


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as the apiserver stores ``metav1.Time``."""
    if moment.tzinfo is None:
        raise ValueError("condition times must be timezone-aware")
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The stored condition of ``type_`` in an object's ``status``, or None."""
    return next((c for c in (status or {}).get("conditions") or []
                 if isinstance(c, Mapping) and c.get("type") == type_), None)


def set_condition(
    existing: Sequence[Mapping[str, Any]],
    condition: Condition,
    *,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """Returns ``existing`` with ``condition`` added or replaced, other types untouched."""
    merged: list[dict[str, Any]] = []
    replaced = False
    for current in existing:
        if current.get("type") != condition.type:
            merged.append(dict(current))
            continue
        replaced = True
        transition = current.get("lastTransitionTime")
        if current.get("status") != condition.status.value or not transition:
            transition = format_time(now)
        merged.append(_render(condition, transition))
    if not replaced:
        merged.append(_render(condition, format_time(now)))
    return merged


def _render(condition: Condition, transition: str) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "type": condition.type,
        "status": condition.status.value,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": transition,
    }
    if condition.observed_generation is not None:
        rendered["observedGeneration"] = condition.observed_generation
    return rendered
