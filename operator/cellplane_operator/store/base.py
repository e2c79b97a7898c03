"""The interface every ownership-table store offers."""

from __future__ import annotations

from dataclasses import dataclass
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
    async def get(self, key: str) -> VersionedValue | None:
        """The key's value, read linearizably, or None if absent."""

    async def put(self, key: str, value: bytes) -> int:
        """Writes unconditionally; returns the revision of the write."""

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        """Writes only if the key's last write was at ``mod_revision`` (0: the key is absent)."""

    async def delete(self, key: str) -> bool:
        """Deletes the key; True if it existed."""

    async def close(self) -> None: ...
