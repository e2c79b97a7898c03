"""The data path of one tenant move: rows from the source cell into the target cell.

Both ends are the cells' admin APIs (cells/cellplane_cells/moves.py holds the
contract); the operator only carries pages between them. The source captures
every change of the tenant from the moment ``start`` returns, so the bulk copy
needs no single snapshot: a row that changed while its table was being paged
is sent again as a change, and every apply on the target is an upsert to the
source's current version. Copying again from the start (after a restart) is
therefore always safe, only slower.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.clock import MonotonicClock

__all__ = ["CellEnd", "TenantCopy", "DeltaRound", "TABLES"]

TABLES = ("tenant", "wallet", "rate_bucket", "targets", "webhooks", "jobs", "steps", "ledger",
          "idempotency_keys", "outbox", "schedules", "schedule_runs")
"""In the order the target can take them: the tenant row first, jobs before their steps,
schedules before their runs."""


@dataclass(frozen=True)
class CellEnd:
    """One cell's admin API, as the move reaches it."""

    cell: str
    admin: str
    token: str


@dataclass(frozen=True)
class DeltaRound:
    rows: int
    """Rows sent (changed rows and deletions)."""
    seconds: float
    pending: int
    """Change entries the source still holds beyond this round."""


class TenantCopy:
    def __init__(self, cells: CellAdmin, *, tenant_id: str, move_id: str,
                 source: CellEnd, target: CellEnd, target_epoch: int, clock: MonotonicClock,
                 page_rows: int = 2000, change_rows: int = 5000) -> None:
        self._cells = cells
        self._clock = clock
        self.tenant_id = tenant_id
        self.move_id = move_id
        self.source = source
        self.target = target
        self.target_epoch = target_epoch
        self._page_rows = page_rows
        self._change_rows = change_rows
        self.cursor = 0
        """The last change entry applied to the target."""

    def through(self, source: CellEnd, target: CellEnd) -> TenantCopy:
        """The same move through other endpoints (a cell's new primary after a takeover)."""
        moved = TenantCopy(self._cells, tenant_id=self.tenant_id, move_id=self.move_id,
                           source=source, target=target, target_epoch=self.target_epoch,
                           clock=self._clock, page_rows=self._page_rows,
                           change_rows=self._change_rows)
        moved.cursor = self.cursor
        return moved

    async def start(self) -> dict[str, int]:
        """Capture on in the source (kept if this move started it before); rows per table."""
        self.cursor = 0
        return await self._cells.start_move_out(self.source.admin, self.source.token,
                                                self.tenant_id, self.move_id)

    async def copy_table(self, table: str, on_page: Callable[[int], Awaitable[bool]], *,
                         after: str | None = None) -> str | None:
        """Pages one table across from the cursor ``after`` (None: its first page); the
        next page is read while the last one is written. ``on_page`` is told each page's
        rows and says whether to go on; the cursor to carry on from is returned when it
        says no, None once the table is done."""
        source = self.source

        def fetch(cursor: str | None) -> asyncio.Task[tuple[list[Any], str | None]]:
            return asyncio.create_task(self._cells.move_out_rows(
                source.admin, source.token, self.tenant_id, table, cursor, self._page_rows))

        pending = fetch(after)
        try:
            while True:
                rows, after = await pending
                if after is not None:
                    pending = fetch(after)
                go_on = True
                if rows:
                    await self._apply({table: rows}, {})
                    go_on = await on_page(len(rows))
                if after is None or not go_on:
                    return after
        finally:
            pending.cancel()

    async def catch_up(self) -> DeltaRound:
        """One round: the changes after the cursor, as the source holds them now."""
        started = self._clock.monotonic()
        found = await self._cells.move_out_changes(self.source.admin, self.source.token,
                                                   self.tenant_id, self.cursor, self._change_rows)
        rows: dict[str, list[Any]] = found.get("rows") or {}
        deletes: dict[str, list[Any]] = found.get("deletes") or {}
        sent = sum(len(v) for v in rows.values()) + sum(len(v) for v in deletes.values())
        if sent:
            await self._apply(rows, deletes)
        self.cursor = max(self.cursor, int(found.get("last_seq") or 0))
        return DeltaRound(sent, self._clock.monotonic() - started, int(found.get("pending") or 0))

    async def drain(self) -> int:
        """Rounds until the source holds no change beyond the cursor (it is frozen: none come)."""
        sent = 0
        while True:
            round_ = await self.catch_up()
            sent += round_.rows
            if round_.pending == 0:
                return sent

    async def freeze_source(self, within_seconds: float | None = None) -> None:
        """The source stops the tenant's writes; its database gives up past ``within_seconds``."""
        await self._cells.freeze_move_out(self.source.admin, self.source.token, self.tenant_id,
                                          self.move_id, self.target_epoch,
                                          within_seconds=within_seconds)

    async def unfreeze_source(self, epoch: int) -> None:
        await self._cells.unfreeze_move_out(self.source.admin, self.source.token, self.tenant_id,
                                            self.move_id, epoch)

    async def checksums(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """Both cells' checksums of the tenant, computed side by side."""
        source, target = await asyncio.gather(
            self._cells.checksums(self.source.admin, self.source.token, self.tenant_id),
            self._cells.checksums(self.target.admin, self.target.token, self.tenant_id))
        return source, target

    async def activate_target(self) -> None:
        await self._cells.activate_move_in(self.target.admin, self.target.token, self.tenant_id,
                                           self.move_id)

    async def finish_source(self, retain_seconds: int) -> None:
        await self._cells.finish_move_out(self.source.admin, self.source.token, self.tenant_id,
                                          self.move_id, retain_seconds)

    async def discard(self) -> None:
        """An abort: the target's partial copy goes, the source stops capturing."""
        await self._cells.cancel_move_in(self.target.admin, self.target.token, self.tenant_id,
                                         self.move_id)
        await self._cells.cancel_move_out(self.source.admin, self.source.token, self.tenant_id,
                                          self.move_id)

    async def _apply(self, rows: dict[str, list[Any]], deletes: dict[str, list[Any]]) -> None:
        await self._cells.move_in(self.target.admin, self.target.token, self.tenant_id,
                                  self.move_id, self.target_epoch, rows=rows, deletes=deletes)

