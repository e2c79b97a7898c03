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

The state (``cells.py``) and the move calls (``moves.py``) have modules of their own.

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
from typing import TYPE_CHECKING, Any

from cellplane_cells.domain.plans import Plan, quotas_for

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.cellmemory.cells import (
    FakeCell, FakeTenant, public_resolver, refusal, refusals, tenant_of, writable,
)
from cellplane_operator.cellmemory.moves import FakeMoves
from cellplane_operator.errors import CellApiError

__all__ = ["InMemoryCells", "FakeCell", "FakeTenant", "public_resolver"]

_TENANT_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TARGET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUOTA_KEYS = ("max_running_jobs", "jobs_per_second", "burst", "daily_spend_limit",
               "strict_schedules")
_FORMER_QUOTA_KEYS = {"max_running": "max_running_jobs"}
"""Names a cell's admin API still accepts for a quota (deprecated), as before issue #23."""


class InMemoryCells(FakeMoves):
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
        if any(_FORMER_QUOTA_KEYS[k] in body for k in body if k in _FORMER_QUOTA_KEYS):
            raise refusal("PUT", url, 422, "invalid_request", "the request does not match the schema")
        body = {_FORMER_QUOTA_KEYS.get(k, k): v for k, v in body.items()}
        unknown = sorted(set(body) - {"plan", "api_key", *_QUOTA_KEYS})
        if "plan" not in body or unknown:
            raise refusal("PUT", url, 422, "invalid_request", "the request does not match the schema")
        try:
            plan = Plan(body["plan"])
        except ValueError:
            raise refusal("PUT", url, 422, "invalid_request",
                           "the request does not match the schema") from None
        quotas = {k: body[k] for k in _QUOTA_KEYS if body.get(k) is not None}
        try:
            quotas_for(plan, **quotas)
        except ValueError as error:
            raise refusal("PUT", url, 422, "quota_out_of_range", str(error)) from None
        api_key = body.get("api_key")
        if api_key is not None and not 24 <= len(str(api_key)) <= 200:
            raise refusal("PUT", url, 422, "invalid_request", "the request does not match the schema")
        if any(t.api_key == api_key for i, t in cell.tenants.items() if i != tenant_id):
            raise refusal("PUT", url, 409, "api_key_in_use", "the API key is already another tenant's")
        known = cell.tenants.get(tenant_id)
        if known is None:
            cell.tenants[tenant_id] = FakeTenant(plan.value, quotas,
                                                 str(api_key or f"key-{secrets.token_hex(16)}"))
            return
        writable(known, "PUT", url)
        known.plan, known.quotas, known.state = plan.value, quotas, "active"
        if api_key is not None:
            known.api_key = str(api_key)
        cell.captured(tenant_id, "tenant", tenant_id)

    async def put_target(self, admin: str, token: str, tenant_id: str, name: str, url: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/targets"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        _check_target_name("PUT", where, name)
        tenant = tenant_of(cell, "PUT", where, tenant_id)
        refused = refusals(cell, [("url", url)])
        if refused:
            raise refusal("PUT", where, 422, "target_refused", f"{url}: {refused[0]['reason']}")
        writable(tenant, "PUT", where)
        tenant.targets[name] = url
        cell.captured(tenant_id, "targets", name)

    async def put_webhook(self, admin: str, token: str, tenant_id: str, url: str, secret: str,
                          max_concurrency: int) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/webhooks"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        _check_webhook("PUT", where, secret, max_concurrency)
        tenant = tenant_of(cell, "PUT", where, tenant_id)
        refused = refusals(cell, [("url", url)])
        if refused:
            raise refusal("PUT", where, 422, "target_refused", f"{url}: {refused[0]['reason']}")
        writable(tenant, "PUT", where)
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
                raise refusal("PUT", where, 422, "duplicate_endpoint",
                               f"two entries share a {key}")
        tenant = tenant_of(cell, "PUT", where, tenant_id)
        refused = refusals(cell, [*((f"targets[{i}].url", u) for i, (_, u) in enumerate(targets)),
                                   *((f"webhooks[{i}].url", u) for i, (u, _) in enumerate(webhooks))])
        if refused:
            raise refusal("PUT", where, 422, "target_refused", "; ".join(
                f"{r['field']} ({r['url']}): {r['reason']}" for r in refused))
        writable(tenant, "PUT", where)
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
        return refusals(cell, [*((f"targets[{i}].url", u) for i, (_, u) in enumerate(targets)),
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
            raise refusal("GET", where, 404, "not_found", "the tenant is not in this cell")
        # The real cell's tables (sql/moves.sql, move_checksums); the fake has no jobs.
        tables: dict[str, list[Any]] = {
            "jobs": [], "steps": [], "ledger": [], "idempotency_keys": [], "outbox": [],
            "schedules": [], "schedule_runs": [],
            "wallet": [[tenant_id]],
            "targets": sorted([n, u] for n, u in tenant.targets.items()),
            "webhooks": sorted([u, c] for u, (_, c) in tenant.webhooks.items())}
        return {table: {"rows": len(rows), "checksum": hashlib.md5(
            json.dumps(rows).encode()).hexdigest()} for table, rows in tables.items()}

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
            raise refusal(method, url, 401, "unauthenticated",
                           "the admin token is required: Authorization: Bearer <token>")
        return cell


if TYPE_CHECKING:
    # mypy proves here that the fake offers every call of the port, as region.py proves it
    # of the HTTP client.
    _PORT: type[CellAdmin] = InMemoryCells


def _check_tenant_id(method: str, url: str, tenant_id: str) -> None:
    if not _TENANT_ID.fullmatch(tenant_id):
        raise refusal(method, url, 422, "invalid_request", "the request does not match the schema")


def _check_target_name(method: str, url: str, name: str) -> None:
    if not (len(name) <= 63 and _TARGET_NAME.fullmatch(name)):
        raise refusal(method, url, 422, "invalid_request", "the request does not match the schema")


def _check_webhook(method: str, url: str, secret: str, max_concurrency: int) -> None:
    if not (16 <= len(secret) <= 200 and 1 <= max_concurrency <= 100):
        raise refusal(method, url, 422, "invalid_request", "the request does not match the schema")
