"""A fence a person puts on a cell on purpose: no writes, no failover, until lifted.

``kubectl cellplane fence CELL`` annotates the Cell with ``cellplane.io/fenced``
(its value is the reason). The annotation is the one source of truth: whichever
operator holds the cell's placement group reads it from the Cell, whether it
has held the group for hours, adopted it after a restart, or took it over from
a lost region. While it stands, that operator keeps its lease (so no other
region takes over and no standby is promoted) but grants the cell database no
write time: every grant, renewals included, writes a zero duration, which the
database turns into a deadline of "now" and refuses every write after
(migration 0002), whatever path the write takes. Lifting the fence grants the
remaining lease time again under the same epoch: the owner never let go.

Whether the fence is *in force* is not the annotation but the last grant the
database accepted: a fence is in force once a grant made under it succeeded,
and lifted once a grant without it did. Between the two (an operator that just
restarted and has not granted yet, a grant that failed) the recorded condition
is kept, since the database still holds whatever it was last given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from cellplane_operator.domain.conditions import Condition, ConditionStatus

__all__ = ["FENCED", "DEFAULT_REASON", "ManualFence", "requested_fence", "annotation_value",
           "write_time", "FenceState", "fence_state", "fence_condition", "FenceEvent",
           "fence_event"]

FENCED = "cellplane.io/fenced"
"""Cell annotation: writes are fenced on purpose; its value is the reason."""
DEFAULT_REASON = "fenced by a user"
"""The reason shown for an annotation without one (an empty value, or ``true``)."""
_MAX_REASON = 500


@dataclass(frozen=True)
class ManualFence:
    reason: str


def requested_fence(annotations: Mapping[str, Any] | None) -> ManualFence | None:
    """The fence the Cell's annotations ask for; present (whatever its value) means fenced.

    A fence errs on the side of refusing writes: ``cellplane.io/fenced: ""`` or
    ``"false"`` still fences, since only removing the annotation lifts it.
    """
    if not annotations or FENCED not in annotations:
        return None
    value = " ".join(str(annotations.get(FENCED) or "").split())[:_MAX_REASON]
    return ManualFence(value if value and value.lower() != "true" else DEFAULT_REASON)


def annotation_value(reason: str | None) -> str:
    """What ``fence --reason TEXT`` writes into the annotation (``true`` without a reason)."""
    text = " ".join((reason or "").split())[:_MAX_REASON]
    return text or "true"


def write_time(remaining_seconds: float, fence: ManualFence | None) -> float:
    """The duration the cell database may accept writes for, given the lease's ``remaining``:
    none at all while a fence stands, however much lease time the owner holds."""
    if fence is not None:
        return 0.0
    return max(remaining_seconds, 0.0)


class FenceState(str, Enum):
    NOT_FENCED = "NotFenced"
    IN_FORCE = "InForce"
    FENCING = "Fencing"
    """Asked for, not yet granted under (or granted under another reason)."""
    LIFTING = "Lifting"
    """Lifted on the Cell, but the database still holds the fenced grant."""


def fence_state(requested: ManualFence | None, in_force: ManualFence | None) -> FenceState:
    """``in_force`` is the fence under which the last accepted grant was made (None: a grant
    without one, or no grant by this operator yet)."""
    if requested is None:
        return FenceState.NOT_FENCED if in_force is None else FenceState.LIFTING
    return FenceState.IN_FORCE if in_force == requested else FenceState.FENCING


def fence_condition(requested: ManualFence | None, in_force: ManualFence | None, *,
                    generation: int, holder: str, epoch: int | None) -> Condition | None:
    """The ``Fenced`` condition to record, or None to keep the recorded one (under way)."""
    state = fence_state(requested, in_force)
    if state is FenceState.IN_FORCE:
        assert requested is not None
        under = f" under epoch {epoch}" if epoch is not None else ""
        return Condition("Fenced", ConditionStatus.TRUE, "FencedByUser",
                         f"{requested.reason} (the cell database refuses every write; {holder} "
                         f"keeps the placement group{under}; kubectl cellplane unfence lifts it)",
                         observed_generation=generation)
    if state is FenceState.NOT_FENCED:
        return Condition("Fenced", ConditionStatus.FALSE, "NotFenced",
                         "writes are granted with the placement-group lease",
                         observed_generation=generation)
    return None


@dataclass(frozen=True)
class FenceEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def fence_event(recorded: Mapping[str, Any] | None, written: Mapping[str, Any] | None, *,
                cell: str) -> FenceEvent | None:
    """The Event for a ``Fenced`` condition that changed from ``recorded`` to ``written``
    (conditions as stored): one when the fence comes into force, one when it is lifted.

    An operator that restarts, or takes the cell over, under a fence finds it recorded
    in force and says nothing new."""
    was = (recorded or {}).get("status") == ConditionStatus.TRUE.value
    now = (written or {}).get("status") == ConditionStatus.TRUE.value
    if now and not was:
        return FenceEvent("Warning", "Fenced",
                          f"cell {cell} is fenced: {(written or {}).get('message', '')}")
    if was and not now and written is not None:
        return FenceEvent("Normal", "Unfenced",
                          f"cell {cell} is no longer fenced: writes are granted again")
    return None
