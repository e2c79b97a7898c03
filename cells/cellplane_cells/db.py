"""Connections to the cell database, each one declaring the epoch it writes under.

Every connection of a pool runs ``SET cellplane.epoch`` once, when it is made,
and is then in autocommit mode;
the fencing trigger (migration 0002) compares it with the placement group on
every write. A process that comes to hold a new epoch makes a new pool.
Database refusals are translated here into the cell's own errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from cellplane_cells.errors import (
    CellFencedError, LeaseExpiredError, NotWritableError, StaleEpochError, TenantMovingError,
)
from cellplane_cells.metrics import WRITES_REJECTED

__all__ = ["open_pool", "translate_errors", "ThreadedDatabase", "STALE_EPOCH", "LEASE_EXPIRED",
           "NO_EPOCH", "TENANT_FENCED", "CELL_FENCED"]

log = logging.getLogger(__name__)

T = TypeVar("T")

STALE_EPOCH = "CPS01"
LEASE_EXPIRED = "CPL01"
NO_EPOCH = "CPE01"
TENANT_FENCED = "CPT01"
CELL_FENCED = "CPF01"
"""A write of a tenant that is frozen for a move's cutover, or moved out (0006)."""


def open_pool(conninfo: str, *, epoch: int, min_size: int = 1, max_size: int = 10,
              name: str = "cell") -> ConnectionPool:
    def declare_epoch(conn: psycopg.Connection) -> None:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(epoch),))
        conn.commit()
        # Each named statement is atomic on its own; in autocommit it costs one
        # round trip instead of three (BEGIN, statement, COMMIT), which was a
        # third of a claim-then-complete cycle. Several statements that must
        # commit together still use conn.transaction().
        conn.autocommit = True

    pool = ConnectionPool(conninfo, min_size=min_size, max_size=max_size, name=name,
                          configure=declare_epoch, open=False)
    pool.open(wait=True, timeout=30)
    return pool


@contextmanager
def translate_errors() -> Iterator[None]:
    """Maps the fencing trigger's refusals to ``NotWritableError`` subclasses, and the
    tenant fence's (a tenant being moved) to ``TenantMovingError``."""
    try:
        yield
    except psycopg.Error as error:
        state = error.sqlstate
        if state == STALE_EPOCH:
            WRITES_REJECTED.labels("stale_epoch").inc()
            log.warning("write refused by the database: %s", error.diag.message_primary)
            raise StaleEpochError(str(error.diag.message_primary)) from error
        if state == LEASE_EXPIRED:
            WRITES_REJECTED.labels("lease_expired").inc()
            log.warning("write refused by the database: %s", error.diag.message_primary)
            raise LeaseExpiredError(str(error.diag.message_primary)) from error
        if state == CELL_FENCED:
            WRITES_REJECTED.labels("cell_fenced").inc()
            log.warning("write refused by the database: %s", error.diag.message_primary)
            raise CellFencedError(str(error.diag.message_primary)) from error
        if state == NO_EPOCH:
            WRITES_REJECTED.labels("no_epoch").inc()
            raise NotWritableError(str(error.diag.message_primary)) from error
        if state == TENANT_FENCED:
            WRITES_REJECTED.labels("tenant_fenced").inc()
            log.info("write refused by the tenant fence: %s", error.diag.message_primary)
            raise TenantMovingError(str(error.diag.message_primary)) from error
        raise


class ThreadedDatabase:
    """Runs blocking pool calls in threads for an asyncio component, and remembers fencing.

    The first ``NotWritableError`` is kept in ``fenced``: a worker or relay the
    database refused as stale or past its lease stops taking new work by itself.
    """

    def __init__(self, pool: ConnectionPool, *, component: str) -> None:
        self._pool = pool
        self._component = component
        self.fenced: NotWritableError | None = None

    async def __call__(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def call() -> T:
            with self._pool.connection() as conn:
                return operation(conn, *args, **kwargs)

        try:
            return await asyncio.to_thread(call)
        except NotWritableError as error:
            if self.fenced is None:
                log.error("%s is fenced and stops taking work: %s", self._component, error)
            self.fenced = error
            raise
