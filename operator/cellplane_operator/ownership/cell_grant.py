"""The cell database's side of a lease: epoch and remaining duration in its placement-group row.

``cellplane_grant(epoch, remaining)`` (migration 0002 of the cell schema) sets
the row's deadline to the database's own ``now() + remaining`` and refuses a
lower epoch. On stop the holder writes a zero duration, so a reachable
database refuses writes at once instead of at the deadline; an unreachable one
still stops by itself at the deadline it was last given.
"""

from __future__ import annotations

import logging

import psycopg

__all__ = ["CellDatabaseGrant"]

log = logging.getLogger(__name__)

_GRANT = b"SELECT cellplane_grant(%s, make_interval(secs => %s))"


class CellDatabaseGrant:
    """A ``GroupActor`` that only moves the database's grant (workers are started elsewhere)."""

    def __init__(self, conninfo: str, *, connect_timeout: float = 2.0) -> None:
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self.grants: list[tuple[int, float]] = []

    async def _grant(self, epoch: int, remaining_seconds: float) -> None:
        async with await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=int(max(self._connect_timeout, 1))) as conn:
            await conn.execute(_GRANT, (epoch, remaining_seconds))
        self.grants.append((epoch, remaining_seconds))

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant(epoch, remaining_seconds)

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant(epoch, remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        log.warning("epoch %d stops acting: %s", epoch, reason)
        try:
            await self._grant(epoch, 0.0)
        except psycopg.Error as error:
            # Unreachable: it stops by itself at the deadline it was last given.
            log.warning("could not end the database grant early: %s", error)
