"""The ownership table in etcd: per placement group an owner key and an epoch key.

    /cellplane/groups/<cell>/owner     {"region", "site", "epoch", "lease_id"}, on an etcd lease
    /cellplane/groups/<cell>/epoch     "<n>", never deleted, only grows
    /cellplane/groups/<cell>/active    {"region", "site", "epoch"}: who holds or last held the
                                       epoch; outlives the lease, so a returning old primary
                                       learns it was replaced (domain/failover.py)
    /cellplane/groups/<cell>/handover  a planned release naming its successor (domain/failover.py)

Acquiring is one transaction: it succeeds only if no owner key exists and the
epoch key still holds the epoch the candidate read, and then writes epoch+1,
the owner key (attached to the candidate's lease) and the active record
together, and consumes any handover. Release deletes the owner key only if it
is still exactly the caller's record.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellplane_operator.domain.failover import ActiveSite, Handover
from cellplane_operator.domain.ownership import OwnerRecord
from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.store import Compare, Delete, KeyValueStore, Put

__all__ = ["OwnershipTable", "GroupView", "GROUPS_PREFIX"]

GROUPS_PREFIX = "/cellplane/groups/"


@dataclass(frozen=True)
class GroupView:
    """A placement group's keys, read at one revision."""

    owner: OwnerRecord | None
    epoch: int
    active: ActiveSite | None
    handover: Handover | None
    """Only a handover of the current epoch: an older one was consumed or overtaken."""


class OwnershipTable:
    def __init__(self, store: KeyValueStore, *, prefix: str = GROUPS_PREFIX) -> None:
        self.store = store
        self._prefix = prefix

    def owner_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/owner"

    def epoch_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/epoch"

    def active_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/active"

    def handover_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/handover"

    def group_prefix(self, cell: str) -> str:
        return f"{self._prefix}{cell}/"

    async def read(self, cell: str) -> tuple[OwnerRecord | None, int]:
        """(owner or None, epoch), read together at one revision."""
        values = await self.store.read(self.owner_key(cell), self.epoch_key(cell))
        owner = values[self.owner_key(cell)]
        epoch = values[self.epoch_key(cell)]
        return (OwnerRecord.decode(owner.value) if owner else None,
                int(epoch.value) if epoch else 0)

    async def read_group(self, cell: str) -> GroupView:
        keys = (self.owner_key(cell), self.epoch_key(cell), self.active_key(cell),
                self.handover_key(cell))
        values = await self.store.read(*keys)
        owner, epoch, active, handover = (values[key] for key in keys)
        epoch_now = int(epoch.value) if epoch else 0
        planned = Handover.decode(handover.value) if handover else None
        return GroupView(
            owner=OwnerRecord.decode(owner.value) if owner else None, epoch=epoch_now,
            active=ActiveSite.decode(active.value) if active else None,
            handover=planned if planned is not None and planned.epoch == epoch_now else None)

    async def try_acquire(self, cell: str, *, region: str, site: str, expected_epoch: int,
                          lease_id: int) -> OwnerRecord | None:
        """Our record if the compare-and-swap won, None if another got there first."""
        record = OwnerRecord(region=region, site=site, epoch=expected_epoch + 1, lease_id=lease_id)
        epoch_is_as_read = (Compare(self.epoch_key(cell), "version", 0) if expected_epoch == 0
                            else Compare(self.epoch_key(cell), "value", str(expected_epoch).encode()))
        try:
            won = await self.store.transaction(
                [Compare(self.owner_key(cell), "version", 0), epoch_is_as_read],
                [Put(self.epoch_key(cell), str(record.epoch).encode()),
                 Put(self.owner_key(cell), record.encode(), lease_id=lease_id),
                 Put(self.active_key(cell), ActiveSite(region, site, record.epoch).encode()),
                 Delete(self.handover_key(cell))],
                what=f"acquire {cell} at epoch {record.epoch}")
        except StoreUnavailableError:
            # The outcome is unknown; our lease id in the owner key says we won.
            owner, _ = await self.read(cell)
            if owner is not None and owner == record:
                return record
            raise
        return record if won else None

    async def release(self, cell: str, record: OwnerRecord,
                      handover: Handover | None = None) -> bool:
        """Delete the owner key if it is still ours; with ``handover``, name the successor
        in the same transaction, so no candidate sees the group free without it."""
        puts = [Put(self.handover_key(cell), handover.encode())] if handover is not None else []
        return await self.store.transaction(
            [Compare(self.owner_key(cell), "value", record.encode())],
            [Delete(self.owner_key(cell)), *puts], what=f"release {cell} at epoch {record.epoch}")
