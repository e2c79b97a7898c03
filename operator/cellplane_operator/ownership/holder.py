"""One process's hold on one placement group: observe, acquire, renew, self-fence, release.

Two loops run side by side. The lease loop talks to etcd: it reads (and
watches) the group, competes when the owner is gone, and renews while it owns.
The watchdog talks to nobody: it sleeps until ``confirmed_until - margin`` on
the monotonic clock and, if no renewal has moved that instant by then, stops
the group's work. Because the watchdog never waits on etcd, an owner whose
renewals hang (partition, lost quorum, a paused etcd member) still stops on
time.

The group's work is started, renewed and stopped through a ``GroupActor``: for
a cell, that writes the epoch and the remaining duration into the cell
database's placement-group row (which refuses every write after that
duration, by its own clock) and starts or stops the cell's workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cellplane_operator.aio import first_of
from cellplane_operator.clock import MonotonicClock
from cellplane_operator.domain.ownership import (
    LeaseSettings,
    LeaseState,
    OwnerRecord,
    Role,
    acquired,
    database_grant,
    lost_race,
    may_act,
    must_self_fence,
    observe,
    ready_to_acquire,
    released,
    renewed,
    self_fenced,
)
from cellplane_operator.domain.failover import Handover
from cellplane_operator.errors import StoreError
from cellplane_operator.metrics import HolderMetrics, SelfFenceReason
from cellplane_operator.ownership.table import GroupView, OwnershipTable

__all__ = ["GroupActor", "LeaseHolder", "HolderIdentity"]

log = logging.getLogger(__name__)


class GroupActor(Protocol):
    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        """We now own the group under ``epoch``; the database may accept writes for ``remaining``."""

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        """A renewal was confirmed: extend the database's grant."""

    async def stop_acting(self, epoch: int, reason: str) -> None:
        """Stop the group's work now (self-fence, lost ownership, or release)."""


@dataclass(frozen=True)
class HolderIdentity:
    cell: str
    region: str
    site: str


class LeaseHolder:
    def __init__(self, table: OwnershipTable, identity: HolderIdentity, actor: GroupActor, *,
                 settings: LeaseSettings, clock: MonotonicClock,
                 takeover_delay_seconds: float = 0.0, compete: bool = True,
                 adopt_own_lease: bool = False,
                 on_group_read: Callable[[GroupView], None] | None = None,
                 metrics_kind: str = "cell") -> None:
        self._table = table
        self._identity = identity
        self._actor = actor
        self._settings = settings.validated()
        self._clock = clock
        self.takeover_delay_seconds = takeover_delay_seconds
        """Extra wait after the margin before competing (a cell's failoverDelaySeconds)."""
        self.compete = compete
        """False keeps this holder observing only (e.g. its standby is too far behind); a
        planned handover that names this holder's site is taken all the same."""
        self.group: GroupView | None = None
        """The group's keys as last read."""
        self.vacated_at: float | None = None
        """When this holder saw the owner key gone before its latest acquisition (monotonic)."""
        self._on_group_read = on_group_read
        self._may_adopt = adopt_own_lease
        """At the first read, continue a live lease whose owner record names our identity.

        Safe only when the caller knows that no other process with this identity
        runs: the regional operator holds an exclusive lock on its state
        directory for its lifetime, so a record with its identity can only be
        its dead predecessor's. Adopting keeps the epoch, so the cell's
        processes (which carry the epoch) keep running through an operator
        restart instead of stopping for a lease and a margin."""
        self.state = LeaseState()
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()
        self._acting_epoch: int | None = None
        self._renewal_due: float | None = None
        # Spreads the renewals of groups acquired together over the interval,
        # so a process holding hundreds does not renew them all in one burst.
        self._jitter = random.Random(f"{identity.cell}/{identity.region}/{identity.site}")
        self._metrics = HolderMetrics(kind=metrics_kind, group=identity.cell, region=identity.region)
        self._etcd_failing = False
        """The last lease step failed on etcd: a self-fence now is etcd's doing."""

    @property
    def acting(self) -> bool:
        return self._acting_epoch is not None and may_act(
            self.state, now=self._clock.monotonic(), settings=self._settings)

    def _set(self, state: LeaseState) -> None:
        self.state = state
        self._metrics.observe(state)
        self._changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        watchdog = asyncio.create_task(self._watchdog())
        watcher = asyncio.create_task(self._watch())
        try:
            while not stop.is_set():
                try:
                    await self._step()
                    self._etcd_failing = False
                except StoreError as error:
                    self._etcd_failing = True
                    log.warning("%s: etcd: %s", self._identity.cell, error)
                except Exception:
                    # The actor (the cell database) failing must not end the
                    # loop: the watchdog and the database's deadline still hold.
                    log.exception("%s: lease step failed", self._identity.cell)
                await self._sleep_until_next(stop)
        finally:
            watcher.cancel()
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await self._stop("holder stopped")
            self._metrics.close()

    async def release(self, handover: Handover | None = None) -> bool:
        """Stop acting, then delete our owner key if it is still ours (naming the successor
        of a planned handover in the same transaction)."""
        state = self.state
        if state.role is not Role.OWNER or state.epoch is None or state.lease_id is None:
            return False
        await self._stop("released for a planned handover" if handover else "released")
        record = OwnerRecord(self._identity.region, self._identity.site, state.epoch, state.lease_id)
        done = await self._table.release(self._identity.cell, record, handover)
        self._set(released(self.state))
        await self._table.store.revoke_lease(state.lease_id)
        return done

    async def _step(self) -> None:
        now = self._clock.monotonic()
        if self.state.role is Role.OWNER:
            await self._renew()
        group = await self._table.read_group(self._identity.cell)
        self.group = group
        if self._on_group_read is not None:
            self._on_group_read(group)
        owner, epoch = group.owner, group.epoch
        if self._may_adopt:
            self._may_adopt = False
            if (owner is not None and self.state.role is not Role.OWNER
                    and (owner.region, owner.site) == (self._identity.region, self._identity.site)):
                await self._adopt(owner)
                return
        before = self.state.role
        self._set(observe(self.state, owner=owner, epoch=epoch, now=self._clock.monotonic()))
        if before is Role.OWNER and self.state.role is not Role.OWNER:
            self._metrics.self_fenced(SelfFenceReason.OWNERSHIP_LOST)
            await self._stop(f"owner key gone or taken over (etcd epoch {epoch})")
        handover_to_us = (None if group.handover is None
                          else group.handover.target_site == self._identity.site)
        if (self.compete or handover_to_us) and ready_to_acquire(
                self.state, now=now, settings=self._settings,
                extra_delay=self.takeover_delay_seconds, handover_to_us=handover_to_us):
            await self._acquire()

    async def _acquire(self) -> None:
        cell = self._identity.cell
        sent_at = self._clock.monotonic()
        self.vacated_at = self.state.gone_since
        lease_id, ttl = await self._table.store.grant_lease(int(self._settings.duration_seconds))
        record = await self._table.try_acquire(cell, region=self._identity.region,
                                               site=self._identity.site,
                                               expected_epoch=self.state.epoch_seen, lease_id=lease_id)
        if record is None:
            log.info("%s: lost the race for epoch %d", cell, self.state.epoch_seen + 1)
            self._set(lost_race(self.state))
            await self._table.store.revoke_lease(lease_id)
            return
        await self._own(record.epoch, lease_id, sent_at=sent_at, ttl=ttl,
                        how=f"acquired at epoch {record.epoch} by {self._identity.region}/"
                            f"{self._identity.site}")

    async def _adopt(self, owner: OwnerRecord) -> None:
        """Continue our predecessor's lease: renew it once, then own under its epoch."""
        sent_at = self._clock.monotonic()
        ttl = await self._table.store.keep_alive(owner.lease_id)
        if ttl <= 0:
            log.info("%s: the previous holder's lease had ended; competing as usual",
                     self._identity.cell)
            return
        await self._own(owner.epoch, owner.lease_id, sent_at=sent_at, ttl=ttl,
                        how=f"adopted the live lease of epoch {owner.epoch} from this site's "
                            "previous holder")

    async def _own(self, epoch: int, lease_id: int, *, sent_at: float, ttl: int, how: str) -> None:
        """We hold ``lease_id`` under ``epoch``, confirmed by a request sent at ``sent_at``:
        become owner and, if time is left before the margin, start the group's work."""
        self._set(acquired(self.state, epoch=epoch, lease_id=lease_id, sent_at=sent_at, ttl=ttl))
        self._renewal_due = sent_at + self._settings.renew_interval_seconds
        remaining = database_grant(self.state, now=self._clock.monotonic(), settings=self._settings)
        if remaining <= 0:
            return
        log.info("%s: %s", self._identity.cell, how)
        self._acting_epoch = epoch
        await self._actor.start_acting(epoch, remaining)

    async def _renew(self) -> None:
        assert self.state.lease_id is not None and self.state.epoch is not None
        now = self._clock.monotonic()
        if self._renewal_due is not None and now < self._renewal_due:
            return
        interval = self._settings.renew_interval_seconds
        # Renewals run at a fixed rate from their send times, with up to 10%
        # jitter; a failed one is retried after a quarter interval, so a lost
        # renewal costs a quarter of the interval, not a whole one.
        self._renewal_due = now + interval / 4
        sent_at = now
        try:
            ttl = await self._table.store.keep_alive(self.state.lease_id)
        except StoreError:
            self._metrics.renewal_failed()
            raise
        self._metrics.renewed(self._clock.monotonic() - sent_at)
        self._renewal_due = sent_at + interval * (1 - 0.1 * self._jitter.random())
        self._set(renewed(self.state, sent_at=sent_at, ttl=ttl))
        remaining = database_grant(self.state, now=self._clock.monotonic(), settings=self._settings)
        if remaining > 0 and self._acting_epoch == self.state.epoch:
            await self._actor.renew_grant(self.state.epoch, remaining)

    async def _watchdog(self) -> None:
        """Stops the work at ``confirmed_until - margin`` unless a renewal moved it."""
        while True:
            self._changed.clear()
            state = self.state
            if must_self_fence(state, now=self._clock.monotonic(), settings=self._settings):
                log.error("%s: lease not confirmed in time, self-fencing at epoch %s",
                          self._identity.cell, state.epoch)
                self._metrics.self_fenced(SelfFenceReason.ETCD_UNREACHABLE if self._etcd_failing
                                          else SelfFenceReason.RENEWAL_LATE)
                self._set(self_fenced(state))
                await self._stop("self-fenced: no renewal confirmed before deadline - margin")
                continue
            if state.role is Role.OWNER and state.confirmed_until is not None:
                fence_at = state.confirmed_until - self._settings.margin_seconds
                delay = max(fence_at - self._clock.monotonic(), 0.0)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
            else:
                await self._changed.wait()

    async def _watch(self) -> None:
        """Wakes the lease loop on any change of the group's keys, instead of at the next tick."""
        async for _ in self._table.store.watch_prefix(self._table.group_prefix(self._identity.cell)):
            self._wake.set()

    async def _sleep_until_next(self, stop: asyncio.Event) -> None:
        interval = self._settings.renew_interval_seconds
        if self.state.role is Role.OWNER and self._renewal_due is not None:
            interval = max(self._renewal_due - self._clock.monotonic(), 0.0)
        elif self.state.role in (Role.WAITING, Role.FENCED) and self.state.gone_since is not None:
            # Wake exactly when the wait for a takeover is over.
            due = (self.state.gone_since + self._settings.margin_seconds
                   + self.takeover_delay_seconds - self._clock.monotonic())
            interval = min(interval, max(due, 0.0))
        self._wake.clear()
        await first_of(stop, self._wake, timeout=interval)

    async def _stop(self, reason: str) -> None:
        epoch, self._acting_epoch = self._acting_epoch, None
        if epoch is not None:
            await self._actor.stop_acting(epoch, reason)
