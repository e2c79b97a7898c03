"""Who may act for a placement group, and until when: the lease rule with clock margins.

The ownership record lives in etcd; this module only decides, from what one
process has observed and its own monotonic clock, what that process may do.

The rule (docs/concepts.md, Placement-group ownership):

- The owner measures its lease from the moment it *sent* the renewal that etcd
  acknowledged: ``confirmed_until = sent_at + ttl``. etcd received it later and
  counts the TTL from then, so the owner's idea of the end is never later
  than etcd's. The owner stops acting ``margin`` before ``confirmed_until``.
- A candidate acts only after it has seen the owner key gone (etcd's TTL expiry
  or a release) and then waited ``margin`` on its own monotonic clock, then won
  the compare-and-swap that raises the epoch.
- No clock is ever compared with another machine's. With rate skew and pauses
  below the margin there is a gap when nobody acts, never an overlap; beyond
  it, the epoch and the database's own deadline still refuse the stale writes.

Everything here is pure: time comes in as a number from the caller's monotonic
clock, and the functions return new states and decisions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "HANDOVER_PATIENCE_SECONDS",
    "LeaseSettings",
    "OwnerRecord",
    "Role",
    "LeaseState",
    "observe",
    "ready_to_acquire",
    "acquired",
    "lost_race",
    "renewed",
    "may_act",
    "database_grant",
    "must_self_fence",
    "self_fenced",
    "released",
]


HANDOVER_PATIENCE_SECONDS = 30.0
"""How long other candidates leave a planned handover to the successor it names."""


@dataclass(frozen=True)
class LeaseSettings:
    """Lease timing of one placement group; the defaults are the product's defaults.

    10 s of lease, a renewal every 2 s and a 2 s margin: an owner gets four
    renewal attempts (8 s of lease minus margin, every 2 s) before it must stop,
    so one slow etcd election (about 1-2 s) or one lost renewal costs nothing,
    while a lost region is taken over about 12 s (lease + margin) after its last
    renewal, plus etcd's expiry check (up to 0.5 s) and the new owner's grant
    (about 0.1 s): 11.8 s measured against an 11.7 s floor
    (benchmarks/ownership.py --defaults). The rule is Patroni's ``loop_wait + 2 * retry_timeout <= ttl`` in
    this shape: at least two renewal intervals must fit in ``duration - margin``.
    """

    duration_seconds: float = 10.0
    """etcd lease TTL of the owner key."""
    renew_interval_seconds: float = 2.0
    """How often the owner renews."""
    margin_seconds: float = 2.0
    """Clock margin: the owner stops this long before its lease ends; a candidate
    waits this long after seeing the owner gone."""

    def problems(self) -> list[str]:
        """Why these settings are unsafe; empty when they are fine."""
        found: list[str] = []
        if self.duration_seconds < 1 or self.duration_seconds != int(self.duration_seconds):
            found.append("duration must be a whole number of seconds, at least 1 "
                         "(etcd lease TTLs are whole seconds)")
        if self.margin_seconds <= 0:
            found.append("margin must be positive")
        if self.renew_interval_seconds <= 0:
            found.append("renew interval must be positive")
        if self.margin_seconds >= self.duration_seconds:
            found.append(f"margin ({self.margin_seconds:g}s) must be below the lease duration "
                         f"({self.duration_seconds:g}s)")
        elif 2 * self.renew_interval_seconds > self.duration_seconds - self.margin_seconds:
            found.append(f"two renew intervals ({2 * self.renew_interval_seconds:g}s) must fit in "
                         f"duration - margin ({self.duration_seconds - self.margin_seconds:g}s), "
                         "so one lost renewal does not end ownership")
        return found

    def validated(self) -> LeaseSettings:
        problems = self.problems()
        if problems:
            raise ValueError("unsafe lease settings: " + "; ".join(problems))
        return self


@dataclass(frozen=True)
class OwnerRecord:
    """The value of a placement group's owner key in etcd."""

    region: str
    site: str
    epoch: int
    lease_id: int

    def encode(self) -> bytes:
        return json.dumps({"region": self.region, "site": self.site, "epoch": self.epoch,
                           "lease_id": self.lease_id}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> OwnerRecord:
        data = json.loads(raw)
        return cls(region=str(data["region"]), site=str(data["site"]), epoch=int(data["epoch"]),
                   lease_id=int(data["lease_id"]))


class Role(str, Enum):
    OBSERVING = "observing"
    """Someone else owns the group (or we have not looked yet)."""
    WAITING = "waiting"
    """The owner key is gone; waiting out the margin before trying to acquire."""
    OWNER = "owner"
    """We hold the group's lease under ``epoch``."""
    FENCED = "fenced"
    """We held the lease but could not confirm it in time: we stopped acting."""


@dataclass(frozen=True)
class LeaseState:
    role: Role = Role.OBSERVING
    epoch_seen: int = 0
    """The highest epoch this process has seen in etcd."""
    gone_since: float | None = None
    """Local monotonic time at which the owner key was first seen absent."""
    epoch: int | None = None
    """The epoch we hold (OWNER) or held (FENCED)."""
    lease_id: int | None = None
    confirmed_until: float | None = None
    """Local monotonic time when our lease ends at the latest: sent_at + ttl."""


def observe(state: LeaseState, *, owner: OwnerRecord | None, epoch: int, now: float) -> LeaseState:
    """What a read or a watch event of the owner and epoch keys tells us."""
    seen = max(state.epoch_seen, epoch)
    if state.role is Role.OWNER:
        if owner is not None and owner.epoch == state.epoch and owner.lease_id == state.lease_id:
            return replace(state, epoch_seen=seen)
        # Our key is gone or another holds the group: we are no longer owner,
        # whatever our clock says.
        return LeaseState(role=Role.FENCED, epoch_seen=seen, epoch=state.epoch,
                          lease_id=state.lease_id, confirmed_until=state.confirmed_until)
    if owner is not None:
        if state.role is Role.FENCED:
            return replace(state, epoch_seen=seen, gone_since=None)
        return LeaseState(role=Role.OBSERVING, epoch_seen=seen)
    # No owner key. The margin counts from the first time we saw *this* key
    # absent: if the epoch moved on since we started waiting, someone owned
    # the group in between (unseen by us) and the wait starts again now.
    # Keeping the old start would let a process that slept through a whole
    # tenure acquire at once, without the margin (found by the simulation).
    waiting_since = state.gone_since if epoch <= state.epoch_seen else None
    if state.role is Role.FENCED:
        return replace(state, epoch_seen=seen,
                       gone_since=waiting_since if waiting_since is not None else now)
    gone_since = waiting_since if state.role is Role.WAITING and waiting_since is not None else now
    return LeaseState(role=Role.WAITING, epoch_seen=seen, gone_since=gone_since)


def ready_to_acquire(state: LeaseState, *, now: float, settings: LeaseSettings,
                     extra_delay: float = 0.0, handover_to_us: bool | None = None) -> bool:
    """True once the owner key has been seen gone for margin (+ extra delay) on our clock.

    A fenced former owner may try again too, under a new epoch, once the same
    wait has passed since it saw its key gone.

    ``handover_to_us`` says whether the owner released the epoch we saw in a
    planned handover naming us (True) or another successor (False); None when
    there was no handover. The successor acquires at once: the margin guards
    against an owner that may still act, and this one has stopped and said so
    (its database refuses writes and is shut down before it releases). The
    others leave the successor ``HANDOVER_PATIENCE_SECONDS`` before they compete.
    """
    if state.role not in (Role.WAITING, Role.FENCED) or state.gone_since is None:
        return False
    if handover_to_us:
        return True
    wait = settings.margin_seconds + extra_delay
    if handover_to_us is False:
        wait = max(wait, HANDOVER_PATIENCE_SECONDS)
    return now - state.gone_since >= wait


def acquired(state: LeaseState, *, epoch: int, lease_id: int, sent_at: float,
             ttl: float) -> LeaseState:
    """The compare-and-swap won: we own the group under ``epoch``.

    ``sent_at`` is when the lease was granted-for, i.e. when its grant request
    was sent, before the transaction that attached the owner key to it.
    """
    return LeaseState(role=Role.OWNER, epoch_seen=max(state.epoch_seen, epoch), epoch=epoch,
                      lease_id=lease_id, confirmed_until=sent_at + ttl)


def lost_race(state: LeaseState) -> LeaseState:
    """The compare-and-swap failed: someone else acquired, or the epoch moved."""
    return LeaseState(role=Role.OBSERVING, epoch_seen=state.epoch_seen)


def renewed(state: LeaseState, *, sent_at: float, ttl: float) -> LeaseState:
    """etcd acknowledged a keep-alive sent at ``sent_at`` with ``ttl`` seconds left."""
    if state.role is not Role.OWNER or state.confirmed_until is None:
        return state
    if ttl <= 0:
        # The lease had already expired in etcd when the renewal arrived.
        return replace(state, confirmed_until=min(state.confirmed_until, sent_at))
    return replace(state, confirmed_until=max(state.confirmed_until, sent_at + ttl))


def may_act(state: LeaseState, *, now: float, settings: LeaseSettings) -> bool:
    """May this process's cell take writes for the group right now?"""
    return (state.role is Role.OWNER and state.confirmed_until is not None
            and now < state.confirmed_until - settings.margin_seconds)


def database_grant(state: LeaseState, *, now: float, settings: LeaseSettings) -> float:
    """How long the cell database may still accept writes, as a duration (0: none).

    Written with the epoch on every renewal; the database adds it to its own
    ``now()``, so no clock is compared with another's.
    """
    if not may_act(state, now=now, settings=settings):
        return 0.0
    assert state.confirmed_until is not None
    return max(0.0, state.confirmed_until - settings.margin_seconds - now)


def must_self_fence(state: LeaseState, *, now: float, settings: LeaseSettings) -> bool:
    """An owner whose lease is no longer confirmed beyond the margin stops on its own."""
    return state.role is Role.OWNER and not may_act(state, now=now, settings=settings)


def self_fenced(state: LeaseState) -> LeaseState:
    return LeaseState(role=Role.FENCED, epoch_seen=state.epoch_seen, epoch=state.epoch,
                      lease_id=state.lease_id, confirmed_until=state.confirmed_until)


def released(state: LeaseState) -> LeaseState:
    """After a planned handover deleted our owner key."""
    return LeaseState(role=Role.OBSERVING, epoch_seen=state.epoch_seen)
