"""The cell database's side of a lease: epoch and remaining duration in its placement-group row.

``cellplane_grant(epoch, remaining, fence)`` (migrations 0002 and 0007 of the
cell schema, run through the ``CellDatabases`` port: ``sites/celldb.py``) sets the row's deadline to the database's own ``now() + remaining``
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

from cellplane_operator.domain.fencing import ManualFence, write_time
from cellplane_operator.errors import CellplaneError
from cellplane_operator.sites.base import CellDatabases

__all__ = ["CellDatabaseGrant"]

log = logging.getLogger(__name__)


class CellDatabaseGrant:
    """A ``GroupActor`` that only moves the database's grant (workers are started elsewhere)."""

    def __init__(self, databases: CellDatabases, conninfo: str, *,
                 fence: Callable[[], ManualFence | None] = lambda: None) -> None:
        self.conninfo = conninfo
        self._databases = databases
        self._fence = fence
        """The fence standing now (read at each grant); None: grants as the lease allows."""
        self._lock = asyncio.Lock()
        self.last_grant: tuple[int, float] | None = None
        """(epoch, remaining seconds) of the last grant the database accepted."""
        self.fenced_by: ManualFence | None = None
        """The fence under which the last accepted grant was made (so gave no write time)."""

    async def _grant(self, epoch: int, remaining_seconds: float) -> None:
        async with self._lock:
            fence = self._fence()
            seconds = write_time(remaining_seconds, fence)
            reason = fence.reason if fence is not None else None
            await self._databases.grant(self.conninfo, epoch, seconds, reason)
            self.last_grant = (epoch, seconds)
            self.fenced_by = fence

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant(epoch, remaining_seconds)

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        await self._grant(epoch, remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        log.warning("epoch %d stops acting: %s", epoch, reason)
        try:
            await self._grant(epoch, 0.0)
        except CellplaneError as error:
            # Unreachable: it stops by itself at the deadline it was last given.
            log.warning("could not end the database grant early: %s", error)
