"""Tenant moves as the fake cells answer them: the source's change capture, paged scope,
changes, freeze, finish and cancel; the target's frozen copy, activated or removed. Each
step idempotent, and refused with the real cell's codes out of order
(cells/cellplane_cells/moves.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from cellplane_operator.cellmemory.cells import (
    FakeCell, FakeTenant, refusal, refusals, tenant_of,
)

__all__ = ["FakeMoves", "MOVE_TABLES"]


class FakeMoves:
    """The move calls of ``InMemoryCells``."""

    page_gate: Callable[[FakeCell, str, str], Awaitable[None]] | None

    def _reach(self, method: str, url: str, admin: str, token: str) -> FakeCell:
        raise NotImplementedError

    async def start_move_out(self, admin: str, token: str, tenant_id: str, move_id: str
                             ) -> dict[str, int]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out"
        cell = self._reach("POST", where, admin, token)
        tenant = tenant_of(cell, "POST", where, tenant_id)
        if tenant.state in ("moved", "retired"):
            raise refusal("POST", where, 409, "tenant_not_movable",
                           f"the tenant is {tenant.state} here and cannot move out")
        if tenant.state == "frozen" and tenant.move_id != move_id:
            raise refusal("POST", where, 409, "tenant_not_movable",
                           f"the tenant is frozen for move {tenant.move_id}")
        if tenant.move_id != move_id:
            # Another move's capture (or none): capture starts over for this one.
            tenant.move_id, tenant.changes = move_id, []
        return {table: len(rows) for table, rows in _scope(tenant_id, tenant).items()}

    async def move_out_rows(self, admin: str, token: str, tenant_id: str, table: str,
                            after: str | None, limit: int) -> tuple[list[Any], str | None]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out/rows"
        cell = self._reach("GET", where, admin, token)
        if table not in MOVE_TABLES:
            raise refusal("GET", where, 422, "invalid_table", f"no table {table!r} in a move")
        if self.page_gate is not None:
            await self.page_gate(cell, tenant_id, table)
        rows = _scope(tenant_id, tenant_of(cell, "GET", where, tenant_id))[table]
        # The cursor is the last key sent, as the real cell's names the last row's key.
        rest = [row for key, row in rows if after is None or key > after]
        page = rest[:limit]
        following = _row_key(table, page[-1]) if len(rest) > limit else None
        return page, following

    async def move_out_changes(self, admin: str, token: str, tenant_id: str, after: int,
                               limit: int) -> dict[str, Any]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out/changes"
        cell = self._reach("GET", where, admin, token)
        tenant = tenant_of(cell, "GET", where, tenant_id)
        entries = [entry for entry in tenant.changes if entry[0] > after][:limit]
        last_seq = entries[-1][0] if entries else after
        scope = _scope(tenant_id, tenant)
        rows: dict[str, list[Any]] = {}
        deletes: dict[str, list[str]] = {}
        for kind in MOVE_TABLES:
            keys = sorted({key for _, k, key in entries if k == kind})
            current = dict(scope[kind])
            if found := [current[key] for key in keys if key in current]:
                rows[kind] = found
            if gone := [key for key in keys if key not in current]:
                deletes[kind] = gone
        pending = sum(1 for entry in tenant.changes if entry[0] > last_seq)
        return {"rows": rows, "deletes": deletes, "last_seq": last_seq, "pending": pending}

    async def freeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              epoch: int, *, within_seconds: float | None = None) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out:freeze"
        tenant = _same_move(self._reach("POST", where, admin, token), "POST", where, tenant_id,
                            move_id)
        if tenant.state == "frozen":
            return
        if tenant.state != "active":
            raise refusal("POST", where, 409, "tenant_not_movable",
                           f"the tenant is {tenant.state} here")
        tenant.state, tenant.epoch = "frozen", epoch

    async def unfreeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                                epoch: int) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out:unfreeze"
        tenant = _same_move(self._reach("POST", where, admin, token), "POST", where, tenant_id,
                            move_id)
        if tenant.state == "active":
            return
        if tenant.state != "frozen":
            raise refusal("POST", where, 409, "tenant_not_movable",
                           f"the tenant is {tenant.state} here")
        tenant.state, tenant.epoch = "active", epoch

    async def finish_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              retain_seconds: int) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out:finish"
        tenant = _same_move(self._reach("POST", where, admin, token), "POST", where, tenant_id,
                            move_id)
        if tenant.state == "moved":
            return
        # Active too: the move is committed when this is asked (see the real cell's
        # plan_finish); the tenant is fenced here from now on, whatever it was.
        if tenant.state not in ("frozen", "active"):
            raise refusal("POST", where, 409, "tenant_not_frozen",
                           f"a {tenant.state} tenant cannot finish a move out")
        tenant.state, tenant.retain_seconds, tenant.changes = "moved", retain_seconds, []

    async def cancel_move_out(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out"
        cell = self._reach("DELETE", where, admin, token)
        tenant = cell.tenants.get(tenant_id)
        if tenant is None or tenant.move_id != move_id:
            return
        if tenant.state == "moved":
            raise refusal("DELETE", where, 409, "move_finished",
                           "the move has finished: the tenant lives in its new cell")
        tenant.move_id, tenant.changes = None, []
        if tenant.state == "frozen":
            tenant.state = "active"

    async def move_in(self, admin: str, token: str, tenant_id: str, move_id: str, epoch: int, *,
                      rows: dict[str, list[Any]], deletes: dict[str, list[Any]] | None = None
                      ) -> dict[str, int]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-in"
        cell = self._reach("POST", where, admin, token)
        deletes = deletes or {}
        if unknown := (set(rows) | set(deletes)) - set(MOVE_TABLES):
            raise refusal("POST", where, 409, "invalid_bundle",
                           f"unknown tables in the batch: {sorted(unknown)}")
        refused = refusals(cell, [*((f"targets[{i}].url", r["url"])
                                     for i, r in enumerate(rows.get("targets") or [])),
                                   *((f"webhooks[{i}].url", r["url"])
                                     for i, r in enumerate(rows.get("webhooks") or []))])
        if refused:
            raise refusal("POST", where, 422, "target_refused", "; ".join(
                f"{r['field']} ({r['url']}): {r['reason']}" for r in refused))
        if any(r.get("tenant_id", tenant_id) != tenant_id for batch in rows.values() for r in batch):
            raise refusal("POST", where, 409, "invalid_bundle",
                           "the batch carries rows of another tenant")
        tenant = cell.tenants.get(tenant_id)
        tenant_rows = rows.get("tenant") or []
        if tenant is None or tenant.state != "frozen" or tenant.move_id != move_id:
            if tenant is not None and tenant.state not in ("moved", "retired"):
                raise refusal("POST", where, 409, "tenant_exists",
                               f"the tenant is already here ({tenant.state}, move "
                               f"{tenant.move_id!r})")
            if not tenant_rows:
                raise refusal("POST", where, 409, "invalid_bundle",
                               "the first batch of a move in must carry the tenant row")
            # Created frozen (a copy left by an earlier move is replaced).
            tenant = cell.tenants[tenant_id] = FakeTenant(
                "", {}, "", state="frozen", move_id=move_id, epoch=epoch)
        return _apply(tenant, rows, deletes)

    async def activate_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-in:activate"
        tenant = _same_move(self._reach("POST", where, admin, token), "POST", where, tenant_id,
                            move_id)
        if tenant.state == "active":
            return
        if tenant.state != "frozen":
            raise refusal("POST", where, 409, "tenant_not_frozen",
                           f"the tenant is {tenant.state} here")
        tenant.state = "active"

    async def cancel_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-in"
        cell = self._reach("DELETE", where, admin, token)
        tenant = cell.tenants.get(tenant_id)
        if tenant is None or tenant.state in ("moved", "retired"):
            return
        if tenant.state == "frozen" and tenant.move_id == move_id:
            del cell.tenants[tenant_id]
            return
        raise refusal("DELETE", where, 409, "tenant_active",
                       f"the tenant is {tenant.state} here (move {tenant.move_id!r}); not this "
                       "move's copy to remove")


MOVE_TABLES = ("tenant", "wallet", "rate_bucket", "targets", "webhooks", "jobs", "steps",
               "ledger", "idempotency_keys", "outbox", "schedules", "schedule_runs")
"""The real cell's tables of a move, in the order a target applies them."""


def _same_move(cell: FakeCell, method: str, url: str, tenant_id: str,
               move_id: str) -> FakeTenant:
    tenant = tenant_of(cell, method, url, tenant_id)
    if tenant.move_id != move_id:
        raise refusal(method, url, 409, "move_mismatch",
                       f"the tenant's move here is {tenant.move_id!r}, not {move_id!r}")
    return tenant


def _scope(tenant_id: str, tenant: FakeTenant) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The tenant's rows per move table as (key, row), by key: what a move copies."""
    scope: dict[str, list[tuple[str, dict[str, Any]]]] = {table: [] for table in MOVE_TABLES}
    scope["tenant"] = [(tenant_id, {"tenant_id": tenant_id, "plan": tenant.plan,
                                    "quotas": dict(tenant.quotas), "api_key": tenant.api_key})]
    scope["wallet"] = [(tenant_id, {"tenant_id": tenant_id})]
    scope["targets"] = [(name, {"tenant_id": tenant_id, "name": name, "url": url})
                        for name, url in sorted(tenant.targets.items())]
    scope["webhooks"] = [(url, {"tenant_id": tenant_id, "url": url, "secret": secret,
                                "max_concurrency": concurrency})
                         for url, (secret, concurrency) in sorted(tenant.webhooks.items())]
    return scope


def _row_key(table: str, row: dict[str, Any]) -> str:
    return str(row["name"] if table == "targets" else row["url"] if table == "webhooks"
               else row["tenant_id"])


def _apply(tenant: FakeTenant, rows: dict[str, list[Any]],
           deletes: dict[str, list[Any]]) -> dict[str, int]:
    """Upserts one batch of a move into the target's frozen copy; rows applied per table."""
    for key in deletes.get("targets") or []:
        tenant.targets.pop(str(key), None)
    for key in deletes.get("webhooks") or []:
        tenant.webhooks.pop(str(key), None)
    for row in rows.get("tenant") or []:
        tenant.plan, tenant.quotas, tenant.api_key = row["plan"], dict(row["quotas"]), \
            row["api_key"]
    for row in rows.get("targets") or []:
        tenant.targets[row["name"]] = row["url"]
    for row in rows.get("webhooks") or []:
        tenant.webhooks[row["url"]] = (row["secret"], int(row["max_concurrency"]))
    return {table: len(batch) for table, batch in rows.items() if batch}
