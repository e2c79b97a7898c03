"""Placement records: tenant -> (cell, epoch), one etcd key per tenant.

    /cellplane/tenants/<namespace>/<name>  {"cell", "epoch", "tenantId", "uid", "maxRunningJobs"
                                            [, "moving": true] [, "keyDigest"]}

``moving`` is written only while it is true, and ``keyDigest`` only once it is
known, so a record encodes exactly as before either existed (``delete``
compares the encoded value, so the encoding of a record must never drift).
The one drift there was: ``maxRunningJobs`` was ``maxRunning`` until the quota
got one name from the CRD to the cell's column (issue #23). A record written
before is read as it was meant, and ``delete`` still removes it.

Every write is a transaction that also compares the placement election's
owner key with the writer's own record (``guard``): a leader that lost the
election cannot write after its successor won. A record is created only if the
key is absent, and changed only at the revision it was read at, so two
decisions about one tenant can never both land.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import NamedTuple

from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.metrics import placement_written
from cellplane_operator.store import Compare, Delete, KeyValueStore, Put

__all__ = ["TenantKey", "PlacementRecord", "PlacementRecords", "TENANTS_PREFIX"]

TENANTS_PREFIX = "/cellplane/tenants/"
_FORMER_MAX_RUNNING_JOBS = "maxRunning"
"""What records written before issue #23 call ``maxRunningJobs``."""


class TenantKey(NamedTuple):
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PlacementRecord:
    cell: str
    epoch: int
    """The tenant's epoch: 1 at first placement, +1 at every move's cutover."""
    tenant_id: str
    """The tenant's id inside its cell's database."""
    uid: str
    """The Tenant object's uid: a Tenant deleted and created again is a new tenant."""
    max_running_jobs: int
    """Worker slots the tenant may take in its cell, for the cell's load."""
    moving: bool = False
    """A move is cutting the tenant over: the router holds its requests."""
    key_digest: str | None = None
    """Hex SHA-256 of the tenant's API key, written once its cell holds the key: the
    router checks keys with it before it reads a body (domain/routing.py)."""

    def encode(self) -> bytes:
        body = asdict(self)
        document = {"cell": body["cell"], "epoch": body["epoch"], "tenantId": body["tenant_id"],
                    "uid": body["uid"], "maxRunningJobs": body["max_running_jobs"]}
        if self.moving:
            document["moving"] = True
        if self.key_digest is not None:
            document["keyDigest"] = self.key_digest
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PlacementRecord:
        body = json.loads(raw)
        return cls(cell=str(body["cell"]), epoch=int(body["epoch"]),
                   tenant_id=str(body["tenantId"]), uid=str(body["uid"]),
                   max_running_jobs=int(body["maxRunningJobs"] if "maxRunningJobs" in body
                                        else body[_FORMER_MAX_RUNNING_JOBS]),
                   moving=bool(body.get("moving", False)),
                   key_digest=None if body.get("keyDigest") is None else str(body["keyDigest"]))


class Stored(NamedTuple):
    record: PlacementRecord
    mod_revision: int


class PlacementRecords:
    def __init__(self, store: KeyValueStore, *, prefix: str = TENANTS_PREFIX) -> None:
        self._store = store
        self._prefix = prefix

    def key(self, tenant: TenantKey) -> str:
        return f"{self._prefix}{tenant.namespace}/{tenant.name}"

    async def read(self, tenant: TenantKey) -> Stored | None:
        found = await self._store.get(self.key(tenant))
        return None if found is None else Stored(PlacementRecord.decode(found.value),
                                                 found.mod_revision)

    async def read_all(self) -> dict[TenantKey, Stored]:
        found = await self._store.get_prefix(self._prefix)
        records: dict[TenantKey, Stored] = {}
        for key, value in found.items():
            namespace, _, name = key[len(self._prefix):].partition("/")
            records[TenantKey(namespace, name)] = Stored(PlacementRecord.decode(value.value),
                                                         value.mod_revision)
        return records

    async def create(self, tenant: TenantKey, record: PlacementRecord, *,
                     guard: list[Compare]) -> bool:
        """True if this call placed the tenant; False if a record existed or the guard failed."""
        return await self._write(tenant, record, [Compare(self.key(tenant), "version", 0)],
                                 [Put(self.key(tenant), record.encode())], guard, "place")

    async def replace(self, tenant: TenantKey, record: PlacementRecord, *, mod_revision: int,
                      guard: list[Compare]) -> bool:
        return await self._write(tenant, record,
                                 [Compare(self.key(tenant), "mod_revision", mod_revision)],
                                 [Put(self.key(tenant), record.encode())], guard, "update")

    async def delete(self, tenant: TenantKey, record: PlacementRecord, *,
                     guard: list[Compare]) -> bool:
        key = self.key(tenant)
        if await self._write(tenant, None, [Compare(key, "value", record.encode())],
                             [Delete(key)], guard, "remove"):
            return True
        # The stored value may be this very record in its former encoding
        # (``maxRunning``), which no value compare matches: deleted at the revision
        # it was read at, if it is still that record then.
        current = await self._store.get(key)
        if (current is None or _FORMER_MAX_RUNNING_JOBS not in json.loads(current.value)
                or PlacementRecord.decode(current.value) != record):
            return False
        return await self._write(tenant, None, [Compare(key, "mod_revision", current.mod_revision)],
                                 [Delete(key)], guard, "remove")

    async def _write(self, tenant: TenantKey, expected: PlacementRecord | None,
                     compares: list[Compare], operations: list[Put | Delete],
                     guard: list[Compare], what: str) -> bool:
        try:
            done = await self._store.transaction([*guard, *compares], operations,
                                                 what=f"{what} tenant {tenant}")
        except StoreUnavailableError:
            # Unknown outcome: the key itself says whether the write landed.
            current = await self.read(tenant)
            landed = (current is None if expected is None
                      else current is not None and current.record == expected)
            if landed:
                placement_written(what, True)
                return True
            raise
        placement_written(what, done)
        return done
