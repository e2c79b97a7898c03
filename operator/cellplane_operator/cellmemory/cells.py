"""The fake cells' state, and the answers every call of the fake shares: the cell's one
error shape, its URL policy, the tenant fence (see the package's docstring)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cellplane_cells.domain.targets import UrlRefused, check_url

from cellplane_operator.errors import CellApiError

__all__ = ["FakeCell", "FakeTenant", "public_resolver", "refusal", "refusals", "tenant_of",
           "writable"]

_PUBLIC_ADDRESS = "93.184.215.14"


def public_resolver(host: str) -> list[str]:
    """Unit tests do no DNS: ``localhost`` is loopback, every other name a public address.
    (An address literal in a URL is judged as itself, without resolving.)"""
    return ["127.0.0.1"] if host.lower().rstrip(".") == "localhost" else [_PUBLIC_ADDRESS]


@dataclass
class FakeTenant:
    plan: str
    quotas: dict[str, Any]
    """The overrides it was last given (``max_running_jobs``...), as the PUT carried them."""
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


def refusal(method: str, url: str, status: int, code: str, message: str) -> CellApiError:
    """The error CellAdminClient makes of the cell's one error shape."""
    text = json.dumps({"error": {"code": code, "message": message}})
    return CellApiError(f"{method} {url}: {status} {text[:300]}", status=status, code=code,
                        detail=message)


def refusals(cell: FakeCell, urls: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    refused = []
    for where, url in urls:
        try:
            check_url(url, allow_private=cell.allow_private, resolve=cell.resolve)
        except UrlRefused as error:
            refused.append({"field": where, "url": url, "reason": str(error)})
    return refused


def tenant_of(cell: FakeCell, method: str, url: str, tenant_id: str) -> FakeTenant:
    tenant = cell.tenants.get(tenant_id)
    if tenant is None:
        raise refusal(method, url, 404, "not_found", f"tenant {tenant_id} is not in this cell")
    return tenant


def writable(tenant: FakeTenant, method: str, url: str) -> None:
    """The tenant fence: a tenant frozen for a move, or moved out, takes no writes."""
    if tenant.state in ("frozen", "moved"):
        raise refusal(method, url, 503, "tenant_moving",
                       f"the tenant is {tenant.state} for a move; writes are refused here")
