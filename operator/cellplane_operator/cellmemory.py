"""An in-process fake of ``CellAdmin`` that answers as cells' admin APIs do, for unit tests.

Any number of cells, each found by its admin base URL as the operator finds it (a Cell's
``status.endpoints.admin``). What it keeps of a real cell (held to the same answers by
tests/cellcontract.py): the admin token (401), tenants created and updated by PUT with
their plan's quotas checked, a retained tenant kept disabled and made active again by a
PUT, a purged one gone, both idempotent; targets and webhooks, where ``put_endpoints``
makes the set exactly the one given; URLs judged by the cell's own policy
(``cellplane_cells.domain.targets``) and refused as ``target_refused`` naming the field,
changing nothing; the cell's error shape carried in ``CellApiError`` as the HTTP client
raises it. A URL nobody added, or any call while ``unreachable``, fails as a connection
error does (``status`` 0).

Tenant moves as a real cell answers them (cells/cellplane_cells/moves.py): the source's
change capture from ``start_move_out`` (one sequence per cell; every write of the tenant's
rows while a move captures is an entry), its scope paged by key, its changes read as the
rows' current versions or deletions with what is left pending, the freeze (the tenant
fence: a frozen or moved tenant's writes are refused as ``tenant_moving``), unfreeze,
finish (moved, rows kept), cancel; the target's frozen copy created by the first batch
that carries the tenant row, upserted, activated or removed; each step idempotent and
refused with the real cell's codes out of order. The fake's rows are the tenant row, the
wallet, targets and webhooks (no jobs); ``page_gate`` lets a test hold a copy mid-way.
The freeze's time bound is not modelled (the fake takes no locks).

Left out: the tenant API, jobs and wallets. ``checksums`` names the real cell's tables and
counts what the fake holds (targets, webhooks, the wallet); its checksums are comparable
between fakes only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cellplane_cells.domain.plans import Plan, quotas_for
from cellplane_cells.domain.targets import UrlRefused, check_url

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.errors import CellApiError

__all__ = ["InMemoryCells", "FakeCell", "FakeTenant", "public_resolver"]

_TENANT_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TARGET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUOTA_KEYS = ("max_running", "jobs_per_second", "burst", "daily_spend_limit")
_PUBLIC_ADDRESS = "93.184.215.14"


def public_resolver(host: str) -> list[str]:
    """Unit tests do no DNS: ``localhost`` is loopback, every other name a public address.
    (An address literal in a URL is judged as itself, without resolving.)"""
    return ["127.0.0.1"] if host.lower().rstrip(".") == "localhost" else [_PUBLIC_ADDRESS]


@dataclass
class FakeTenant:
    plan: str
    quotas: dict[str, Any]
    """The overrides it was last given (``max_running``...), as the PUT carried them."""
    api_key: str
    targets: dict[str, str] = field(default_factory=dict)
    """URL by target name."""
    webhooks: dict[str, tuple[str, int]] = field(default_factory=dict)
    """(secret, max concurrency) by URL."""
    state: str = "active"
    """``active``; ``retired`` once deleted with retain (its rows stay, its key no longer
    works); ``frozen`` for a move (writes refused, in the source at its cutover, in the
    target until activated); ``moved`` once moved out (read-only until purged)."""
    move_id: str | None = None
    """The move whose change capture (source) or copy (target) this is."""
    epoch: int | None = None
    """The tenant epoch a move last gave it (freeze, unfreeze, move in)."""
    retain_seconds: int | None = None
    """How long a moved-out tenant's rows stay (the real cell purges them then)."""
    changes: list[tuple[int, str, str]] = field(default_factory=list)
    """(seq, table, key) of every change while a move captures them."""

    @property
    def active(self) -> bool:
        return self.state == "active"


@dataclass
class FakeCell:
    admin: str
    token: str | None
    """The admin token it accepts; None accepts any (for tests that do not care)."""
    allow_private: bool
    """The cell's ``spec.driver.allowPrivateTargets``: loopback and private addresses."""
    resolve: Callable[[str], Iterable[str]]
    tenants: dict[str, FakeTenant] = field(default_factory=dict)
    unreachable: bool = False
    """While True the cell answers nothing, as a cell whose API is down."""
    seq: int = 0
    """The last change sequence number captured (one sequence per cell, as in its database)."""

    def captured(self, tenant_id: str, table: str, key: str) -> None:
        """A write of the tenant's ``table`` row ``key``: kept while a move captures."""
        tenant = self.tenants[tenant_id]
        if tenant.move_id is not None and tenant.state in ("active", "frozen"):
            self.seq += 1
            tenant.changes.append((self.seq, table, key))


class InMemoryCells:
    def __init__(self) -> None:
        self._cells: dict[str, FakeCell] = {}
        self.unreachable = False
        """While True no cell answers (the operator's network to the cells is cut)."""
        self.requests: list[str] = []
        """``METHOD URL`` of every call that reached a cell, in order."""
        self.page_gate: Callable[[FakeCell, str, str], Awaitable[None]] | None = None
        """Awaited before each page of a move's bulk copy is read (cell, tenant, table):
        a test holds a copy in the middle here."""

    def add(self, admin: str, *, token: str | None = None, allow_private: bool = False,
            resolve: Callable[[str], Iterable[str]] = public_resolver) -> FakeCell:
        cell = FakeCell(admin.rstrip("/"), token, allow_private, resolve)
        self._cells[cell.admin] = cell
        return cell

    def cell(self, admin: str) -> FakeCell:
        return self._cells[admin.rstrip("/")]

    def remove(self, admin: str) -> None:
        """The cell is gone: its URL answers nothing from now on."""
        self._cells.pop(admin.rstrip("/"), None)

    # -- the port ------------------------------------------------------------------------

    async def put_tenant(self, admin: str, token: str, tenant_id: str,
                         body: dict[str, Any]) -> None:
        url = f"{admin}/admin/v1/tenants/{tenant_id}"
        cell = self._reach("PUT", url, admin, token)
        _check_tenant_id("PUT", url, tenant_id)
        unknown = sorted(set(body) - {"plan", "api_key", *_QUOTA_KEYS})
        if "plan" not in body or unknown:
            raise _refusal("PUT", url, 422, "invalid_request", "the request does not match the schema")
        try:
            plan = Plan(body["plan"])
        except ValueError:
            raise _refusal("PUT", url, 422, "invalid_request",
                           "the request does not match the schema") from None
        quotas = {k: body[k] for k in _QUOTA_KEYS if body.get(k) is not None}
        try:
            quotas_for(plan, **quotas)
        except ValueError as error:
            raise _refusal("PUT", url, 422, "quota_out_of_range", str(error)) from None
        api_key = body.get("api_key")
        if api_key is not None and not 24 <= len(str(api_key)) <= 200:
            raise _refusal("PUT", url, 422, "invalid_request", "the request does not match the schema")
        if any(t.api_key == api_key for i, t in cell.tenants.items() if i != tenant_id):
            raise _refusal("PUT", url, 409, "api_key_in_use", "the API key is already another tenant's")
        known = cell.tenants.get(tenant_id)
        if known is None:
            cell.tenants[tenant_id] = FakeTenant(plan.value, quotas,
                                                 str(api_key or f"key-{secrets.token_hex(16)}"))
            return
        _writable(known, "PUT", url)
        known.plan, known.quotas, known.state = plan.value, quotas, "active"
        if api_key is not None:
            known.api_key = str(api_key)
        cell.captured(tenant_id, "tenant", tenant_id)

    async def put_target(self, admin: str, token: str, tenant_id: str, name: str, url: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/targets"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        _check_target_name("PUT", where, name)
        tenant = _tenant(cell, "PUT", where, tenant_id)
        refused = _refusals(cell, [("url", url)])
        if refused:
            raise _refusal("PUT", where, 422, "target_refused", f"{url}: {refused[0]['reason']}")
        _writable(tenant, "PUT", where)
        tenant.targets[name] = url
        cell.captured(tenant_id, "targets", name)

    async def put_webhook(self, admin: str, token: str, tenant_id: str, url: str, secret: str,
                          max_concurrency: int) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/webhooks"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        _check_webhook("PUT", where, secret, max_concurrency)
        tenant = _tenant(cell, "PUT", where, tenant_id)
        refused = _refusals(cell, [("url", url)])
        if refused:
            raise _refusal("PUT", where, 422, "target_refused", f"{url}: {refused[0]['reason']}")
        _writable(tenant, "PUT", where)
        tenant.webhooks[url] = (secret, max_concurrency)
        cell.captured(tenant_id, "webhooks", url)

    async def put_endpoints(self, admin: str, token: str, tenant_id: str,
                            targets: Sequence[tuple[str, str]], webhooks: Sequence[tuple[str, int]],
                            webhook_secret: str) -> dict[str, int]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/endpoints"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        for name, _ in targets:
            _check_target_name("PUT", where, name)
        for _, concurrency in webhooks:
            _check_webhook("PUT", where, webhook_secret, concurrency)
        # In the real cell's order: duplicates, then the tenant, then the URLs.
        for keys, key in (([n for n, _ in targets], "name"), ([u for u, _ in webhooks], "url")):
            if len(set(keys)) != len(keys):
                raise _refusal("PUT", where, 422, "duplicate_endpoint",
                               f"two entries share a {key}")
        tenant = _tenant(cell, "PUT", where, tenant_id)
        refused = _refusals(cell, [*((f"targets[{i}].url", u) for i, (_, u) in enumerate(targets)),
                                   *((f"webhooks[{i}].url", u) for i, (u, _) in enumerate(webhooks))])
        if refused:
            raise _refusal("PUT", where, 422, "target_refused", "; ".join(
                f"{r['field']} ({r['url']}): {r['reason']}" for r in refused))
        _writable(tenant, "PUT", where)
        removed = {"targets_removed": len(set(tenant.targets) - {n for n, _ in targets}),
                   "webhooks_removed": len(set(tenant.webhooks) - {u for u, _ in webhooks})}
        before_targets, before_webhooks = tenant.targets, tenant.webhooks
        tenant.targets = dict(targets)
        tenant.webhooks = {u: (webhook_secret, c) for u, c in webhooks}
        for table, before, after in (("targets", before_targets, tenant.targets),
                                     ("webhooks", before_webhooks, tenant.webhooks)):
            for key in sorted(set(before) | set(after)):
                if before.get(key) != after.get(key):
                    cell.captured(tenant_id, table, key)
        return removed

    async def refused_endpoints(self, admin: str, token: str, targets: Sequence[tuple[str, str]],
                                webhooks: Sequence[str]) -> list[dict[str, str]]:
        cell = self._reach("POST", f"{admin}/admin/v1/endpoints:check", admin, token)
        return _refusals(cell, [*((f"targets[{i}].url", u) for i, (_, u) in enumerate(targets)),
                                *((f"webhooks[{i}].url", u) for i, u in enumerate(webhooks))])

    async def delete_tenant(self, admin: str, token: str, tenant_id: str, *, purge: bool) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}"
        cell = self._reach("DELETE", where, admin, token)
        _check_tenant_id("DELETE", where, tenant_id)
        if purge:
            cell.tenants.pop(tenant_id, None)
        elif (tenant := cell.tenants.get(tenant_id)) is not None:
            tenant.state = "retired"

    async def checksums(self, admin: str, token: str, tenant_id: str) -> dict[str, dict[str, Any]]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/checksums"
        cell = self._reach("GET", where, admin, token)
        tenant = cell.tenants.get(tenant_id)
        if tenant is None:
            raise _refusal("GET", where, 404, "not_found", "the tenant is not in this cell")
        # The real cell's tables (sql/moves.sql, move_checksums); the fake has no jobs.
        tables: dict[str, list[Any]] = {
            "jobs": [], "steps": [], "ledger": [], "idempotency_keys": [], "outbox": [],
            "wallet": [[tenant_id]],
            "targets": sorted([n, u] for n, u in tenant.targets.items()),
            "webhooks": sorted([u, c] for u, (_, c) in tenant.webhooks.items())}
        return {table: {"rows": len(rows), "checksum": hashlib.md5(
            json.dumps(rows).encode()).hexdigest()} for table, rows in tables.items()}

    async def start_move_out(self, admin: str, token: str, tenant_id: str, move_id: str
                             ) -> dict[str, int]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out"
        cell = self._reach("POST", where, admin, token)
        tenant = _tenant(cell, "POST", where, tenant_id)
        if tenant.state in ("moved", "retired"):
            raise _refusal("POST", where, 409, "tenant_not_movable",
                           f"the tenant is {tenant.state} here and cannot move out")
        if tenant.state == "frozen" and tenant.move_id != move_id:
            raise _refusal("POST", where, 409, "tenant_not_movable",
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
            raise _refusal("GET", where, 422, "invalid_table", f"no table {table!r} in a move")
        if self.page_gate is not None:
            await self.page_gate(cell, tenant_id, table)
        rows = _scope(tenant_id, _tenant(cell, "GET", where, tenant_id))[table]
        # The cursor is the last key sent, as the real cell's names the last row's key.
        rest = [row for key, row in rows if after is None or key > after]
        page = rest[:limit]
        following = _row_key(table, page[-1]) if len(rest) > limit else None
        return page, following

    async def move_out_changes(self, admin: str, token: str, tenant_id: str, after: int,
                               limit: int) -> dict[str, Any]:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out/changes"
        cell = self._reach("GET", where, admin, token)
        tenant = _tenant(cell, "GET", where, tenant_id)
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
            raise _refusal("POST", where, 409, "tenant_not_movable",
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
            raise _refusal("POST", where, 409, "tenant_not_movable",
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
            raise _refusal("POST", where, 409, "tenant_not_frozen",
                           f"a {tenant.state} tenant cannot finish a move out")
        tenant.state, tenant.retain_seconds, tenant.changes = "moved", retain_seconds, []

    async def cancel_move_out(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/move-out"
        cell = self._reach("DELETE", where, admin, token)
        tenant = cell.tenants.get(tenant_id)
        if tenant is None or tenant.move_id != move_id:
            return
        if tenant.state == "moved":
            raise _refusal("DELETE", where, 409, "move_finished",
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
            raise _refusal("POST", where, 409, "invalid_bundle",
                           f"unknown tables in the batch: {sorted(unknown)}")
        refused = _refusals(cell, [*((f"targets[{i}].url", r["url"])
                                     for i, r in enumerate(rows.get("targets") or [])),
                                   *((f"webhooks[{i}].url", r["url"])
                                     for i, r in enumerate(rows.get("webhooks") or []))])
        if refused:
            raise _refusal("POST", where, 422, "target_refused", "; ".join(
                f"{r['field']} ({r['url']}): {r['reason']}" for r in refused))
        if any(r.get("tenant_id", tenant_id) != tenant_id for batch in rows.values() for r in batch):
            raise _refusal("POST", where, 409, "invalid_bundle",
                           "the batch carries rows of another tenant")
        tenant = cell.tenants.get(tenant_id)
        tenant_rows = rows.get("tenant") or []
        if tenant is None or tenant.state != "frozen" or tenant.move_id != move_id:
            if tenant is not None and tenant.state not in ("moved", "retired"):
                raise _refusal("POST", where, 409, "tenant_exists",
                               f"the tenant is already here ({tenant.state}, move "
                               f"{tenant.move_id!r})")
            if not tenant_rows:
                raise _refusal("POST", where, 409, "invalid_bundle",
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
            raise _refusal("POST", where, 409, "tenant_not_frozen",
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
        raise _refusal("DELETE", where, 409, "tenant_active",
                       f"the tenant is {tenant.state} here (move {tenant.move_id!r}); not this "
                       "move's copy to remove")

    async def close(self) -> None:
        return None

    # -- answering as a cell ----------------------------------------------------------

    def _reach(self, method: str, url: str, admin: str, token: str) -> FakeCell:
        cell = self._cells.get(admin.rstrip("/"))
        if self.unreachable or cell is None or cell.unreachable:
            # What CellAdminClient raises when httpx cannot connect.
            raise CellApiError(f"{method} {url}: ConnectError('All connection attempts failed')")
        self.requests.append(f"{method} {url}")
        if cell.token is not None and token != cell.token:
            raise _refusal(method, url, 401, "unauthenticated",
                           "the admin token is required: Authorization: Bearer <token>")
        return cell


if TYPE_CHECKING:
    # mypy proves here that the fake offers every call of the port, as region.py proves it
    # of the HTTP client.
    _PORT: type[CellAdmin] = InMemoryCells


def _refusal(method: str, url: str, status: int, code: str, message: str) -> CellApiError:
    """The error CellAdminClient makes of the cell's one error shape."""
    text = json.dumps({"error": {"code": code, "message": message}})
    return CellApiError(f"{method} {url}: {status} {text[:300]}", status=status, code=code,
                        detail=message)


def _refusals(cell: FakeCell, urls: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    refused = []
    for where, url in urls:
        try:
            check_url(url, allow_private=cell.allow_private, resolve=cell.resolve)
        except UrlRefused as error:
            refused.append({"field": where, "url": url, "reason": str(error)})
    return refused


def _tenant(cell: FakeCell, method: str, url: str, tenant_id: str) -> FakeTenant:
    tenant = cell.tenants.get(tenant_id)
    if tenant is None:
        raise _refusal(method, url, 404, "not_found", f"tenant {tenant_id} is not in this cell")
    return tenant


def _check_tenant_id(method: str, url: str, tenant_id: str) -> None:
    if not _TENANT_ID.fullmatch(tenant_id):
        raise _refusal(method, url, 422, "invalid_request", "the request does not match the schema")


def _check_target_name(method: str, url: str, name: str) -> None:
    if not (len(name) <= 63 and _TARGET_NAME.fullmatch(name)):
        raise _refusal(method, url, 422, "invalid_request", "the request does not match the schema")


def _check_webhook(method: str, url: str, secret: str, max_concurrency: int) -> None:
    if not (16 <= len(secret) <= 200 and 1 <= max_concurrency <= 100):
        raise _refusal(method, url, 422, "invalid_request", "the request does not match the schema")


MOVE_TABLES = ("tenant", "wallet", "rate_bucket", "targets", "webhooks", "jobs", "steps",
               "ledger", "idempotency_keys", "outbox")
"""The real cell's tables of a move, in the order a target applies them."""


def _writable(tenant: FakeTenant, method: str, url: str) -> None:
    """The tenant fence: a tenant frozen for a move, or moved out, takes no writes."""
    if tenant.state in ("frozen", "moved"):
        raise _refusal(method, url, 503, "tenant_moving",
                       f"the tenant is {tenant.state} for a move; writes are refused here")


def _same_move(cell: FakeCell, method: str, url: str, tenant_id: str,
               move_id: str) -> FakeTenant:
    tenant = _tenant(cell, method, url, tenant_id)
    if tenant.move_id != move_id:
        raise _refusal(method, url, 409, "move_mismatch",
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
