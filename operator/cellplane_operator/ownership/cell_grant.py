"""The cell database's side of a lease: epoch and remaining duration in its placement-group row.

``cellplane_grant(epoch, remaining, fence)`` (migrations 0002 and 0007 of the
cell schema) sets the row's deadline to the database's own ``now() + remaining``
and refuses a lower epoch. On stop the holder writes a zero duration, so a reachable
database refuses writes at once instead of at the deadline; an unreachable one
still stops by itself at the deadline it was last given.

A fence a person put on the cell (``domain/fencing.py``) is applied here, in the
one place every grant passes (start, renewal, a handover taken back): while
``fence()`` names one, every grant is a zero duration, and carries the fence's
reason, which the database gives as its refusal (``cell fenced``, not ``lease
expired``). The check and the
statement run under one lock, so a renewal computed before the fence cannot
land after the fence's own grant and open writes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from cellplane_operator.domain.fencing import ManualFence, write_time

__all__ = ["CellDatabaseGrant"]

log = logging.getLogger(__name__)

_GRANT = b"SELECT cellplane_grant(%s, make_interval(secs => %s), %s)"
_GRANT_WITHOUT_FENCE = b"SELECT cellplane_grant(%s, make_interval(secs => %s))"
"""A cell database not migrated to 0007 yet (an operator upgraded before its cells)."""


class CellDatabaseGrant:
    """A ``GroupActor`` that only moves the database's grant (workers are started elsewhere)."""

    def __init__(self, conninfo: str, *, timeout_seconds: float = 1.0,
                 fence: Callable[[], ManualFence | None] = lambda: None) -> None:
        self.conninfo = conninfo
        self._timeout = timeout_seconds
        self._fence = fence
        """The fence standing now (read at each grant); None: grants as the lease allows."""
        self._lock = asyncio.Lock()
        self._conn: psycopg.AsyncConnection | None = None
        self.last_grant: tuple[int, float] | None = None
        """(epoch, remaining seconds) of the last grant the database accepted."""
        self.fenced_by: ManualFence | None = None
        """The fence under which the last accepted grant was made (so gave no write time)."""

    async def _grant(self, epoch: int, remaining_seconds: float) -> None:
        async with self._lock:
            fence = self._fence()
            seconds = write_time(remaining_seconds, fence)
            reason = fence.reason if fence is not None else None
            try:
                await self._execute(epoch, seconds, reason)
            except psycopg.OperationalError:
                # The kept connection may have died with a restart of the server (a site
                # demoted, rewound and promoted again keeps its address): once more, anew.
                await self._execute(epoch, seconds, reason)
            self.last_grant = (epoch, seconds)
            self.fenced_by = fence

    async def _execute(self, epoch: int, remaining_seconds: float, fence: str | None) -> None:
        # One kept connection, with a statement timeout: a stalled database
        # must not hold the lease loop past a renewal.
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, connect_timeout=max(int(self._timeout), 1),
                    options=f"-c statement_timeout={int(self._timeout * 1000)}")
            try:
                await self._conn.execute(_GRANT, (epoch, remaining_seconds, fence))
            except psycopg.errors.UndefinedFunction:
                await self._conn.execute(_GRANT_WITHOUT_FENCE, (epoch, remaining_seconds))
        except psycopg.Error:
            if self._conn is not None:
                await self._conn.close()
            self._conn = None
            raise

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
