"""Priority classes and the bulkheads between them: which class a worker's free slot goes to.

Every job has a class, ``CRITICAL``, ``HIGH``, ``DEFAULT`` or ``LOW``. Each
worker reserves a floor of its slots per class. Free slots are handed out in
two passes, highest class first, and only to classes that have work:

1. every class with work is brought up to its floor;
2. what is left goes to the highest class with work: it *borrows* idle
   capacity, the floors of classes that have nothing to run included.

A borrowed slot is given back at the claim after its job ends: the freed slot
goes to the highest class with work, so a flood of LOW jobs that took every
slot yields each one to a CRITICAL job as it frees up. Running steps are never
preempted. The floor is what a class keeps when higher classes are busy: a
HIGH flood cannot take the last LOW slot while LOW has work.

The per-tenant running cap and the round-robin across tenants are the claim
statement's (sql/queue.sql), applied within the class being claimed.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["Priority", "Floors", "Grant", "FloorsError", "next_claim", "parse_floors"]


class Priority(enum.Enum):
    """Declared highest first: ``list(Priority)`` is the order slots are handed out in."""

    CRITICAL = "CRITICAL"
    HIGH = "HIGH"
    DEFAULT = "DEFAULT"
    LOW = "LOW"


class FloorsError(ValueError):
    """Floors that cannot be honoured: unknown class, negative, or more than the slots."""


# Shares of a worker's slots reserved per class when the cell configures none
# (rounded down): 10 slots give 2, 2, 2 and 1, and 3 left to borrow.
_DEFAULT_SHARES = {Priority.CRITICAL: 0.2, Priority.HIGH: 0.2, Priority.DEFAULT: 0.2,
                   Priority.LOW: 0.1}


@dataclass(frozen=True)
class Floors:
    """Slots of one worker reserved per class; the rest is idle capacity anyone borrows."""

    slots: int
    reserved: Mapping[Priority, int]

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise FloorsError(f"a worker needs at least one slot, got {self.slots}")
        if any(n < 0 for n in self.reserved.values()):
            raise FloorsError(f"floors cannot be negative: {self.as_text()}")
        if sum(self.reserved.values()) > self.slots:
            raise FloorsError(f"floors {self.as_text()} add up to {sum(self.reserved.values())}, "
                              f"more than the worker's {self.slots} slots")

    def floor(self, priority: Priority) -> int:
        return self.reserved.get(priority, 0)

    @classmethod
    def default_for(cls, slots: int) -> Floors:
        return cls(slots, {p: int(slots * share) for p, share in _DEFAULT_SHARES.items()})

    @classmethod
    def none(cls, slots: int) -> Floors:
        """No reservation: every slot goes to the highest class with work."""
        return cls(slots, {})

    def as_text(self) -> str:
        """Every class's floor as ``parse_floors`` reads it (``--priority-floors``)."""
        return ",".join(f"{p.value}={self.floor(p)}" for p in Priority)


def parse_floors(text: str, *, slots: int) -> Floors:
    """``"CRITICAL=2,HIGH=2,DEFAULT=2,LOW=1"`` (classes left out reserve nothing)."""
    reserved: dict[Priority, int] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = term.partition("=")
        try:
            priority = Priority(name.strip().upper())
        except ValueError:
            raise FloorsError(f"unknown priority class {name.strip()!r} in {text!r}; "
                              f"classes are {', '.join(p.value for p in Priority)}") from None
        if not sep or not value.strip().isdigit():
            raise FloorsError(f"{term!r}: a floor is CLASS=<slots>, e.g. CRITICAL=2")
        if priority in reserved:
            raise FloorsError(f"{priority.value} is given twice in {text!r}")
        reserved[priority] = int(value)
    return Floors(slots, reserved)


@dataclass(frozen=True)
class Grant:
    """Claim up to ``count`` jobs of ``priority`` now."""

    priority: Priority
    count: int


def next_claim(floors: Floors, running: Mapping[Priority, int],
               waiting: Collection[Priority]) -> Grant | None:
    """The next claim a worker makes, or None when no free slot should be filled.

    ``running``: the worker's jobs per class; ``waiting``: the classes that may
    still have claimable work. The caller claims, counts what it got into
    ``running``, drops a class from ``waiting`` when its claim came back empty,
    and asks again, until this answers None.
    """
    free = floors.slots - sum(running.values())
    if free <= 0:
        return None
    with_work = [p for p in Priority if p in waiting]
    for priority in with_work:
        below_floor = floors.floor(priority) - running.get(priority, 0)
        if below_floor > 0:
            return Grant(priority, min(free, below_floor))
    if with_work:
        return Grant(with_work[0], free)
    return None
