"""An in-process fake of ``KeyValueStore`` with etcd's revision semantics, for unit tests."""

from __future__ import annotations

from cellplane_operator.store.base import VersionedValue

__all__ = ["InMemoryStore"]


class InMemoryStore:
    def __init__(self) -> None:
        self._data: dict[str, VersionedValue] = {}
        self._revision = 0

    async def get(self, key: str) -> VersionedValue | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> int:
        self._revision += 1
        previous = self._data.get(key)
        self._data[key] = VersionedValue(value, self._revision, previous.version + 1 if previous else 1)
        return self._revision

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        current = self._data.get(key)
        if (current.mod_revision if current else 0) != mod_revision:
            return False
        await self.put(key, value)
        return True

    async def delete(self, key: str) -> bool:
        if self._data.pop(key, None) is None:
            return False
        self._revision += 1
        return True

    async def close(self) -> None:
        return None
