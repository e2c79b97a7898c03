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

Left out: the tenant API, jobs and wallets, and tenant moves: the move calls raise
``NotImplementedError``; moves are tested against real cells (tests/integration), whose
change capture and freeze live in their database. ``checksums`` names the real cell's tables and
counts what the fake holds (targets, webhooks, the wallet); its checksums are comparable
between fakes only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
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
    active: bool = True
    """False once deleted with retain: its rows stay, its key no longer works."""
    targets: dict[str, str] = field(default_factory=dict)
    """URL by target name."""
    webhooks: dict[str, tuple[str, int]] = field(default_factory=dict)
    """(secret, max concurrency) by URL."""


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


class InMemoryCells:
    def __init__(self) -> None:
        self._cells: dict[str, FakeCell] = {}
        self.unreachable = False
        """While True no cell answers (the operator's network to the cells is cut)."""
        self.requests: list[str] = []
        """``METHOD URL`` of every call that reached a cell, in order."""

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
        known.plan, known.quotas, known.active = plan.value, quotas, True
        if api_key is not None:
            known.api_key = str(api_key)

    async def put_target(self, admin: str, token: str, tenant_id: str, name: str, url: str) -> None:
        where = f"{admin}/admin/v1/tenants/{tenant_id}/targets"
        cell = self._reach("PUT", where, admin, token)
        _check_tenant_id("PUT", where, tenant_id)
        _check_target_name("PUT", where, name)
        tenant = _tenant(cell, "PUT", where, tenant_id)
        refused = _refusals(cell, [("url", url)])
        if refused:
            raise _refusal("PUT", where, 422, "target_refused", f"{url}: {refused[0]['reason']}")
        tenant.targets[name] = url

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
        tenant.webhooks[url] = (secret, max_concurrency)

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
        removed = {"targets_removed": len(set(tenant.targets) - {n for n, _ in targets}),
                   "webhooks_removed": len(set(tenant.webhooks) - {u for u, _ in webhooks})}
        tenant.targets = dict(targets)
        tenant.webhooks = {u: (webhook_secret, c) for u, c in webhooks}
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
            tenant.active = False

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
        raise _no_moves()

    async def move_out_rows(self, admin: str, token: str, tenant_id: str, table: str,
                            after: str | None, limit: int) -> tuple[list[Any], str | None]:
        raise _no_moves()

    async def move_out_changes(self, admin: str, token: str, tenant_id: str, after: int,
                               limit: int) -> dict[str, Any]:
        raise _no_moves()

    async def freeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              epoch: int, *, within_seconds: float | None = None) -> None:
        raise _no_moves()

    async def unfreeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                                epoch: int) -> None:
        raise _no_moves()

    async def finish_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              retain_seconds: int) -> None:
        raise _no_moves()

    async def cancel_move_out(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        raise _no_moves()

    async def move_in(self, admin: str, token: str, tenant_id: str, move_id: str, epoch: int, *,
                      rows: dict[str, list[Any]], deletes: dict[str, list[Any]] | None = None
                      ) -> dict[str, int]:
        raise _no_moves()

    async def activate_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        raise _no_moves()

    async def cancel_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        raise _no_moves()

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


def _no_moves() -> NotImplementedError:
    return NotImplementedError("the in-memory cells do not model tenant moves (change capture, "
                               "freeze, copy): moves are tested against real cells")
