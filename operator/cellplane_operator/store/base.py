"""The interface every ownership-table store offers: the reads, transactions, leases and
watches that the ownership table, the placement records, the election and the routers use."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol

__all__ = ["KeyValueStore", "VersionedValue", "Compare", "Put", "Delete", "WatchEvent"]


@dataclass(frozen=True)
class VersionedValue:
    value: bytes
    mod_revision: int
    """The store-wide revision of the write that produced this value."""
    version: int
    """How many times this key was written since it was (re)created."""


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` equals ``value``.

    ``version`` 0 means the key is absent; ``value`` compares the bytes.
    """

    key: str
    target: Literal["version", "value", "mod_revision"]
    value: int | bytes


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease_id: int | None = None
    """Attach the key to this lease: etcd deletes it when the lease expires."""


@dataclass(frozen=True)
class Delete:
    key: str


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int


class KeyValueStore(Protocol):
    """Linearizable keys with etcd's revisions, transactions, leases and watches.

    A store that cannot confirm an operation in time raises ``StoreUnavailableError``
    (the outcome of a write is then unknown); a refusal raises ``StoreError``.
    """

    async def get(self, key: str) -> VersionedValue | None:
        """The key's value, read linearizably, or None if absent."""

    async def get_prefix(self, prefix: str) -> dict[str, VersionedValue]:
        """Every key under ``prefix`` with its value, read at one revision."""

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        """Several keys read at one revision."""

    async def put(self, key: str, value: bytes) -> int:
        """Writes unconditionally; returns the revision of the write."""

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        """Writes only if the key's last write was at ``mod_revision`` (0: the key is absent)."""

    async def delete(self, key: str) -> bool:
        """Deletes the key; True if it existed."""

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        """All ``success`` operations at one revision if every compare holds; True if they ran.
        ``what`` names the transaction in errors."""

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        """A new lease; returns (lease id, granted TTL in seconds)."""

    async def keep_alive(self, lease_id: int) -> int:
        """Renews the lease once; returns its TTL from now (<= 0: it had expired)."""

    async def revoke_lease(self, lease_id: int) -> None:
        """Ends the lease and deletes its keys; an unknown lease is no error."""

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                     ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` from ``start_revision`` (or from now), forever."""

    async def close(self) -> None: ...
