"""Keeps the router's ``PlacementMap`` current from etcd: one read, then a watch.

The watch starts first and the read second; both go through
``PlacementMap.apply``, which keeps the newest revision of each key, so no
change between the two is lost or applied out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cellplane_operator.domain.routing import PlacementMap
from cellplane_operator.errors import StoreError
from cellplane_operator.store import KeyValueStore

__all__ = ["PlacementWatcher"]

log = logging.getLogger(__name__)

_PREFIX = "/cellplane/"


class PlacementWatcher:
    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self.map = PlacementMap()
        self._changed = asyncio.Condition()
        self.version = 0
        """Counts the changes of the map."""
        self.loaded = asyncio.Event()

    async def changed(self, since: int, timeout: float) -> bool:
        """Waits until the map's version differs from ``since`` (True) or ``timeout`` passes.

        Taking the version the caller decided on, not "the next change", means a
        change that landed between the caller's look and this wait is not missed.
        """
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version != since), timeout)
            except asyncio.TimeoutError:
                return False
        return True

    async def _notify(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def run(self) -> None:
        watch = asyncio.create_task(self._watch())
        try:
            while not self.loaded.is_set():
                try:
                    for key, value in (await self._store.get_prefix(_PREFIX)).items():
                        self.map.apply(key, value.value, value.mod_revision)
                    self.loaded.set()
                    await self._notify()
                except StoreError as error:
                    log.warning("placement map: initial read failed (%s); again in 1s", error)
                    await asyncio.sleep(1.0)
            await watch
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _watch(self) -> None:
        async for event in self._store.watch_prefix(_PREFIX):
            value = None if event.kind == "delete" else event.value
            if self.map.apply(event.key, value, event.mod_revision):
                await self._notify()
