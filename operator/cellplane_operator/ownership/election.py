"""The placement election: one regional operator at a time places tenants.

It is a placement group like any cell's, under its own prefix, held with the
same lease code (lease, epoch, margin, watchdog). Acting as leader is not a
flag the leader trusts on its own: every placement write carries ``guard()``,
a compare of the election's owner key with the leader's exact record, so etcd
refuses the write of a leader whose lease ended, even one that does not know
it yet.
"""

from __future__ import annotations

import asyncio
import logging

from cellplane_operator.clock import MonotonicClock
from cellplane_operator.domain.ownership import LeaseSettings, OwnerRecord, Role
from cellplane_operator.errors import CellplaneError
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.store import Compare, KeyValueStore

__all__ = ["Leadership", "NotLeaderError", "ELECTIONS_PREFIX"]

log = logging.getLogger(__name__)

ELECTIONS_PREFIX = "/cellplane/elections/"
_GROUP = "placement"


class NotLeaderError(CellplaneError):
    """This operator does not hold the placement election (any more)."""


class Leadership:
    def __init__(self, store: KeyValueStore, *, region: str, member: str, settings: LeaseSettings,
                 clock: MonotonicClock) -> None:
        self._table = OwnershipTable(store, prefix=ELECTIONS_PREFIX)
        self._identity = HolderIdentity(_GROUP, region, member)
        self._holder = LeaseHolder(self._table, self._identity, self, settings=settings,
                                   clock=clock, metrics_kind="election")
        self.changed = asyncio.Event()
        """Set whenever leadership starts or ends; the controller clears it."""
        self.epoch: int | None = None

    @property
    def leading(self) -> bool:
        return self.epoch is not None and self._holder.acting

    def guard(self) -> list[Compare]:
        """The compare every placement write must carry."""
        state = self._holder.state
        if not self.leading or state.role is not Role.OWNER or state.lease_id is None \
                or state.epoch is None:
            raise NotLeaderError("this operator does not hold the placement election")
        record = OwnerRecord(self._identity.region, self._identity.site, state.epoch,
                             state.lease_id)
        return [Compare(self._table.owner_key(_GROUP), "value", record.encode())]

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._holder.run(stop)
        finally:
            await self._holder.release()

    # GroupActor: the election has no database to grant to.
    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        log.info("placement leader at election epoch %d", epoch)
        self.epoch = epoch
        self.changed.set()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        pass

    async def stop_acting(self, epoch: int, reason: str) -> None:
        log.warning("no longer placement leader (epoch %d): %s", epoch, reason)
        self.epoch = None
        self.changed.set()
