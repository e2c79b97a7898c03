"""The operator's side of a cell: tenants, quotas, targets, webhooks and wallets.

Reached through the admin surface only. An API key is shown once, at creation,
and stored as its SHA-256: a leaked database does not leak working keys, and a
high-entropy random key needs no slow hash.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cellplane_cells.db import translate_errors
from cellplane_cells.domain.plans import Plan, quotas_for
from cellplane_cells.domain.targets import UrlRefused, check_url
from cellplane_cells.errors import InvalidRequestError, NotFoundError, TargetRefusedError
from cellplane_cells.queries import query

__all__ = ["TenantSpec", "hash_api_key", "new_api_key", "upsert_tenant", "register_target",
           "register_webhook", "credit_wallet", "tenant_summary", "resolve_host"]


def hash_api_key(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode()).digest()


def new_api_key() -> str:
    return "cpk_" + secrets.token_urlsafe(32)


def resolve_host(host: str) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})


@dataclass(frozen=True)
class TenantSpec:
    tenant_id: str
    plan: Plan
    max_running: int | None = None
    jobs_per_second: float | None = None
    burst: int | None = None
    daily_spend_limit: int | None = None


def upsert_tenant(conn: psycopg.Connection[Any], spec: TenantSpec, *,
                  api_key: str | None = None) -> tuple[bool, str | None]:
    """Creates or updates a tenant; returns (created, the new API key if one was made)."""
    try:
        quotas = quotas_for(spec.plan, max_running=spec.max_running,
                            jobs_per_second=spec.jobs_per_second, burst=spec.burst,
                            daily_spend_limit=spec.daily_spend_limit)
    except ValueError as error:
        raise InvalidRequestError(str(error), code="quota_out_of_range") from None
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        existing = cursor.execute("SELECT 1 FROM tenants WHERE tenant_id = %s",
                                  (spec.tenant_id,)).fetchone()
        issued = api_key if api_key is not None else (None if existing else new_api_key())
        row = cursor.execute(query("upsert_tenant"), {
            "tenant_id": spec.tenant_id, "plan": spec.plan.value,
            "max_running": quotas.max_running, "jobs_per_second": quotas.jobs_per_second,
            "burst": quotas.burst, "daily_spend_limit": quotas.daily_spend_limit,
            "signing_secret": secrets.token_hex(32),
            "api_key_hash": hash_api_key(issued) if issued else None,
        }).fetchone()
        assert row is not None
        cursor.execute(query("ensure_bucket"), {"tenant_id": spec.tenant_id, "burst": quotas.burst})
        cursor.execute(query("ensure_wallet"), {"tenant_id": spec.tenant_id})
        return bool(row["created"]), issued


def _checked(url: str, allow_private: bool) -> str:
    try:
        return check_url(url, allow_private=allow_private, resolve=resolve_host)
    except UrlRefused as error:
        raise TargetRefusedError(f"{url}: {error}") from None


def register_target(conn: psycopg.Connection[Any], tenant_id: str, name: str, url: str, *,
                    allow_private: bool) -> None:
    with translate_errors(), conn.transaction():
        conn.execute(query("upsert_target"),
                     {"tenant_id": tenant_id, "name": name, "url": _checked(url, allow_private)})


def register_webhook(conn: psycopg.Connection[Any], tenant_id: str, url: str, *, secret: str,
                     max_concurrency: int = 4, allow_private: bool) -> int:
    with translate_errors(), conn.transaction():
        row = conn.execute(query("upsert_webhook"), {
            "tenant_id": tenant_id, "url": _checked(url, allow_private), "secret": secret,
            "max_concurrency": max_concurrency}).fetchone()
        assert row is not None
        return int(row[0])


def credit_wallet(conn: psycopg.Connection[Any], tenant_id: str, amount: int) -> dict[str, int]:
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("credit_wallet"),
                             {"tenant_id": tenant_id, "amount": amount}).fetchone()
        if row is None:
            raise NotFoundError(f"tenant {tenant_id} has no wallet in this cell")
        return {"available": int(row["available"]), "reserved": int(row["reserved"])}


def tenant_summary(conn: psycopg.Connection[Any], tenant_id: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("tenant_summary"), {"tenant_id": tenant_id}).fetchone()
    conn.commit()
    if row is None:
        raise NotFoundError(f"tenant {tenant_id} is not in this cell")
    return dict(row)
