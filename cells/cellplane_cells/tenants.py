"""The operator's side of a cell: tenants, quotas, targets, webhooks and wallets.

Reached through the admin surface only. An API key is shown once, at creation,
and stored as its SHA-256: a leaked database does not leak working keys, and a
high-entropy random key needs no slow hash. A tenant leaves a cell retired
(its rows kept, re-enabled by the next upsert) or purged (its rows gone).
"""

from __future__ import annotations

import hashlib
import secrets
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cellplane_cells.db import translate_errors
from cellplane_cells.domain.plans import Plan, quotas_for
from cellplane_cells.domain.targets import UrlRefused, check_url
from cellplane_cells.errors import InvalidRequestError, NotFoundError, TargetRefusedError
from cellplane_cells.queries import query

__all__ = ["TenantSpec", "hash_api_key", "new_api_key", "upsert_tenant", "register_target",
           "register_webhook", "TargetSpec", "WebhookSpec", "url_refusals", "refuse_urls",
           "row_urls", "set_endpoints", "credit_wallet", "tenant_summary", "resolve_host",
           "RemovalPolicy", "remove_tenant", "retire_tenant", "purge_tenant", "PURGE_ORDER"]


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
    max_running_jobs: int | None = None
    jobs_per_second: float | None = None
    burst: int | None = None
    daily_spend_limit: int | None = None
    strict_schedules: int | None = None


def upsert_tenant(conn: psycopg.Connection[Any], spec: TenantSpec, *,
                  api_key: str | None = None) -> tuple[bool, str | None]:
    """Creates or updates a tenant; returns (created, the new API key if one was made)."""
    try:
        quotas = quotas_for(spec.plan, max_running_jobs=spec.max_running_jobs,
                            jobs_per_second=spec.jobs_per_second, burst=spec.burst,
                            daily_spend_limit=spec.daily_spend_limit,
                            strict_schedules=spec.strict_schedules)
    except ValueError as error:
        raise InvalidRequestError(str(error), code="quota_out_of_range") from None
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        existing = cursor.execute("SELECT 1 FROM tenants WHERE tenant_id = %s",
                                  (spec.tenant_id,)).fetchone()
        issued = api_key if api_key is not None else (None if existing else new_api_key())
        row = cursor.execute(query("upsert_tenant"), {
            "tenant_id": spec.tenant_id, "plan": spec.plan.value,
            "max_running_jobs": quotas.max_running_jobs, "jobs_per_second": quotas.jobs_per_second,
            "burst": quotas.burst, "daily_spend_limit": quotas.daily_spend_limit,
            "strict_schedules": quotas.strict_schedules,
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


def url_refusals(urls: Iterable[tuple[str, str]], *, allow_private: bool) -> list[dict[str, str]]:
    """The (field, URL) pairs this cell's policy refuses, each with its field and reason.

    The one check of every way a URL enters the cell (registration, import, a
    move in) and of the operator's question before a move; the workers and the
    relay check again at every call (egress.py)."""
    refused = []
    for field, url in urls:
        try:
            check_url(url, allow_private=allow_private, resolve=resolve_host)
        except UrlRefused as error:
            refused.append({"field": field, "url": url, "reason": str(error)})
    return refused


def refuse_urls(urls: Iterable[tuple[str, str]], *, allow_private: bool) -> None:
    """Raises ``TargetRefusedError`` naming every refused field, if any is refused."""
    refused = url_refusals(urls, allow_private=allow_private)
    if refused:
        raise TargetRefusedError("; ".join(f"{r['field']} ({r['url']}): {r['reason']}"
                                           for r in refused))


def row_urls(rows: Iterable[Any], table: str, key: str) -> list[tuple[str, str]]:
    """(field, URL) of copied target or webhook rows, named by their key (``targets[api]``)."""
    return [(f"{table}[{row.get(key)}].url", str(row.get("url")))
            for row in rows if isinstance(row, dict)]


@dataclass(frozen=True)
class TargetSpec:
    name: str
    url: str


@dataclass(frozen=True)
class WebhookSpec:
    url: str
    secret: str
    max_concurrency: int = 4


def set_endpoints(conn: psycopg.Connection[Any], tenant_id: str, targets: Sequence[TargetSpec],
                  webhooks: Sequence[WebhookSpec], *, allow_private: bool) -> dict[str, int]:
    """The tenant's targets and webhooks become exactly these, in one transaction.

    Level, not edge: what the Tenant's spec no longer lists is removed (a removed
    webhook's pending deliveries with it), so the cell never keeps calling a URL
    its owner took out. Every URL is checked first and a refusal changes nothing.
    Returns how many targets and webhooks were removed."""
    refuse_urls([*((f"targets[{i}].url", t.url) for i, t in enumerate(targets)),
                 *((f"webhooks[{i}].url", w.url) for i, w in enumerate(webhooks))],
                allow_private=allow_private)
    with translate_errors(), conn.transaction(), conn.cursor() as cursor:
        params: dict[str, Any] = {"tenant_id": tenant_id}
        for target in targets:
            cursor.execute(query("upsert_target"), {**params, "name": target.name, "url": target.url})
        for webhook in webhooks:
            cursor.execute(query("upsert_webhook"), {
                **params, "url": webhook.url, "secret": webhook.secret,
                "max_concurrency": webhook.max_concurrency})
        cursor.execute(query("delete_other_targets"),
                       {**params, "names": [t.name for t in targets]})
        removed_targets = cursor.rowcount
        cursor.execute(query("delete_other_webhooks"),
                       {**params, "urls": [w.url for w in webhooks]})
        return {"targets_removed": removed_targets, "webhooks_removed": cursor.rowcount}


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


class RemovalPolicy(str, Enum):
    RETAIN = "retain"
    """The tenant stays with all its rows, disabled: its key fails, no job of it is claimed."""
    PURGE = "purge"
    """Every row of the tenant, in every table, is deleted in one transaction."""


PURGE_ORDER = (
    "purge_delivery_attempts", "purge_deliveries", "purge_outbox", "purge_job_steps",
    "purge_ledger", "purge_idempotency_keys", "purge_schedule_runs", "purge_schedules",
    "purge_target_calls", "purge_target_limits", "purge_jobs", "purge_webhook_endpoints", "purge_targets", "purge_wallet", "purge_rate_bucket",
    "purge_tenant_changes", "purge_tenant",
)
"""The statements of a purge (sql/removal.sql), rows that reference others first."""


def retire_tenant(conn: psycopg.Connection[Any], tenant_id: str) -> bool:
    """Disables the tenant and keeps its rows; False if it is not in this cell.

    Its key no longer authenticates and no job of it is claimed from now on;
    jobs already running finish (their writes depend on their claim, not on
    the tenant's state), and the relay still delivers the events they write.
    ``upsert_tenant`` makes it active again, with the same key.
    """
    with translate_errors(), conn.transaction():
        return conn.execute(query("retire_tenant"), {"tenant_id": tenant_id}).fetchone() is not None


def purge_tenant(conn: psycopg.Connection[Any], tenant_id: str) -> dict[str, int] | None:
    """Deletes every row of the tenant in one transaction; rows deleted per statement,
    or None if the tenant is not in this cell (then no table holds a row of it:
    every tenant_id column references ``tenants``)."""
    deleted: dict[str, int] = {}
    with translate_errors(), conn.transaction(), conn.cursor() as cursor:
        params = {"tenant_id": tenant_id}
        # The move's admin path (0006): a tenant moved out, or frozen for a
        # move, is read-only to everyone else, and must still be purgeable.
        cursor.execute(query("declare_tenant_admin"))
        cursor.execute(query("lock_schedules_for_purge"), params)
        if cursor.execute(query("lock_tenant_for_purge"), params).fetchone() is None:
            return None
        for name in PURGE_ORDER:
            cursor.execute(query(name), params)
            deleted[name.removeprefix("purge_")] = cursor.rowcount
    return deleted


def remove_tenant(conn: psycopg.Connection[Any], tenant_id: str, policy: RemovalPolicy) -> bool:
    """The tenant leaves this cell under ``policy``; False if it was not here.

    Idempotent either way, and an absent tenant is not an error: the caller
    (the placement leader) repeats a removal after a crash or a lost answer,
    and what it asks for, no tenant served from this cell, already holds.
    Answering 404 would make every retry special-case the error and would not
    tell a retained tenant from a purged one anyway.
    """
    if policy is RemovalPolicy.RETAIN:
        return retire_tenant(conn, tenant_id)
    return purge_tenant(conn, tenant_id) is not None
