"""What the operator itself runs in a cell's databases, over SQL, whatever driver runs them.

Two statements, both on the path of ownership: the grant (``cellplane_grant``, the
database's side of the lease: an epoch and how long it may still accept writes, by
its own clock) and, in a planned switchover, the wait for a standby to replay the old
primary's last WAL. They are not driver calls: the operator reaches a standby in
another region by its published endpoint, however that region runs it.

psycopg stays here: its errors become ``SiteError`` (``errors.py``), so the
controllers above never branch on a driver's type.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from cellplane_operator.errors import SiteError

__all__ = ["PostgresCellDatabases"]

log = logging.getLogger(__name__)

_GRANT = b"SELECT cellplane_grant(%s, make_interval(secs => %s), %s)"
_GRANT_WITHOUT_FENCE = b"SELECT cellplane_grant(%s, make_interval(secs => %s))"
"""A cell database not migrated to 0007 yet (an operator upgraded before its cells)."""
_REPLAYED = b"SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
_REPLAY_POLL_SECONDS = 0.02
"""How often the standby's replay is read while writes are stopped (this is the pause)."""


class PostgresCellDatabases:
    """``CellDatabases`` on real Postgres: one kept connection per database for grants."""

    def __init__(self, *, timeout_seconds: float = 1.0) -> None:
        self._timeout = timeout_seconds
        """Connect and statement timeout of a grant: a stalled database must not hold the
        lease loop past a renewal."""
        self._connections: dict[str, psycopg.AsyncConnection] = {}

    async def grant(self, conninfo: str, epoch: int, seconds: float,
                    fence_reason: str | None) -> None:
        try:
            try:
                await self._grant_once(conninfo, epoch, seconds, fence_reason)
            except psycopg.OperationalError:
                # The kept connection may have died with a restart of the server (a site
                # demoted, rewound and promoted again keeps its address): once more, anew.
                await self._grant_once(conninfo, epoch, seconds, fence_reason)
        except psycopg.Error as error:
            raise SiteError(f"the cell database did not take the grant of epoch {epoch}: "
                            f"{error}") from error

    async def _grant_once(self, conninfo: str, epoch: int, seconds: float,
                          fence_reason: str | None) -> None:
        conn = self._connections.get(conninfo)
        try:
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo, autocommit=True, connect_timeout=max(int(self._timeout), 1),
                    options=f"-c statement_timeout={int(self._timeout * 1000)}")
                self._connections[conninfo] = conn
            try:
                await conn.execute(_GRANT, (epoch, seconds, fence_reason))
            except psycopg.errors.UndefinedFunction:
                await conn.execute(_GRANT_WITHOUT_FENCE, (epoch, seconds))
        except psycopg.Error:
            dropped = self._connections.pop(conninfo, None)
            if dropped is not None:
                await dropped.close()
            raise

    async def replayed(self, standby: str, lsn: str, *, timeout_seconds: float) -> bool:
        try:
            async with asyncio.timeout(timeout_seconds):
                async with await psycopg.AsyncConnection.connect(
                        standby, autocommit=True, connect_timeout=2) as conn:
                    while True:
                        row = await (await conn.execute(_REPLAYED, (lsn,))).fetchone()
                        if row is not None and row[0]:
                            return True
                        await asyncio.sleep(_REPLAY_POLL_SECONDS)
        except TimeoutError:
            return False
        except psycopg.Error as error:
            log.warning("could not follow the standby's replay: %s", error)
            return False

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            await conn.close()
