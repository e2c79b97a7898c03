"""The ownership table in etcd: per placement group an owner key and an epoch key.

    /cellplane/groups/<cell>/owner   {"region", "site", "epoch", "lease_id"}, on an etcd lease
    /cellplane/groups/<cell>/epoch   "<n>", never deleted, only grows

Acquiring is one transaction: it succeeds only if no owner key exists and the
epoch key still holds the epoch the candidate read, and then writes epoch+1
and the owner key (attached to the candidate's lease) together. Release
deletes the owner key only if it is still exactly the caller's record.
"""

from __future__ import annotations

from cellplane_operator.domain.ownership import OwnerRecord
from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.store import Compare, Delete, EtcdStore, Put

__all__ = ["OwnershipTable", "GROUPS_PREFIX"]

GROUPS_PREFIX = "/cellplane/groups/"


class OwnershipTable:
    def __init__(self, store: EtcdStore, *, prefix: str = GROUPS_PREFIX) -> None:
        self.store = store
        self._prefix = prefix

    def owner_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/owner"

    def epoch_key(self, cell: str) -> str:
        return f"{self._prefix}{cell}/epoch"

    def group_prefix(self, cell: str) -> str:
        return f"{self._prefix}{cell}/"

    async def read(self, cell: str) -> tuple[OwnerRecord | None, int]:
        """(owner or None, epoch), read together at one revision."""
        values = await self.store.read(self.owner_key(cell), self.epoch_key(cell))
        owner = values[self.owner_key(cell)]
        epoch = values[self.epoch_key(cell)]
        return (OwnerRecord.decode(owner.value) if owner else None,
                int(epoch.value) if epoch else 0)

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
                 Put(self.owner_key(cell), record.encode(), lease_id=lease_id)],
                what=f"acquire {cell} at epoch {record.epoch}")
        except StoreUnavailableError:
            # The outcome is unknown; our lease id in the owner key says we won.
            owner, _ = await self.read(cell)
            if owner is not None and owner == record:
                return record
            raise
        return record if won else None

    async def release(self, cell: str, record: OwnerRecord) -> bool:
        """Planned handover: delete the owner key if it is still ours."""
        return await self.store.transaction(
            [Compare(self.owner_key(cell), "value", record.encode())],
            [Delete(self.owner_key(cell))], what=f"release {cell} at epoch {record.epoch}")
