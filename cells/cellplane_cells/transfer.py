"""Export and import of a tenant's rows: the admin surface that tenant moves build on.

An export is one consistent snapshot (one REPEATABLE READ transaction) of the
tenant, its wallet, targets and webhooks, its queued and running jobs with
their steps and ledger rows, its idempotency keys, its undelivered events, and
its schedules with their run history.
An import is one transaction and is idempotent: importing the same bundle
twice changes nothing the second time. The online copy with deltas and the
epoch cutover belong to the moves issue.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import IsolationLevel

from cellplane_cells.db import translate_errors
from cellplane_cells.errors import ConflictError, NotFoundError
from cellplane_cells.queries import query
from cellplane_cells.tenants import refuse_urls, row_urls

__all__ = ["export_tenant", "import_tenant"]

_ROW_SETS = (
    ("targets", "import_targets"), ("webhooks", "import_webhooks"), ("jobs", "import_jobs"),
    ("steps", "import_steps"), ("ledger", "import_ledger"),
    ("idempotency_keys", "import_idempotency_keys"), ("outbox", "import_outbox"),
    ("schedules", "import_schedules"), ("schedule_runs", "import_schedule_runs"),
)


def export_tenant(conninfo: str, tenant_id: str) -> dict[str, Any]:
    with psycopg.connect(conninfo) as conn:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        row = conn.execute(query("export_tenant"), {"tenant_id": tenant_id}).fetchone()
    assert row is not None
    bundle: dict[str, Any] = row[0]
    if bundle["tenant"] is None:
        raise NotFoundError(f"tenant {tenant_id} is not in this cell")
    return bundle


def import_tenant(conn: psycopg.Connection[Any], bundle: dict[str, Any], *, epoch: int,
                  allow_private: bool) -> dict[str, int]:
    """Imports a bundle under the tenant epoch ``epoch``; returns rows offered per kind.

    The bundle's targets and webhooks pass this cell's URL policy first, as if
    registered here: the cell that exported them may have allowed more."""
    tenant = bundle.get("tenant")
    if not isinstance(tenant, dict) or "tenant_id" not in tenant:
        raise ConflictError("the bundle has no tenant", code="invalid_bundle")
    refuse_urls([*row_urls(bundle.get("targets") or [], "targets", "name"),
                 *row_urls(bundle.get("webhooks") or [], "webhooks", "endpoint_id")],
                allow_private=allow_private)
    counts: dict[str, int] = {}
    with translate_errors(), conn.transaction(), conn.cursor() as cursor:
        exists = cursor.execute("SELECT epoch FROM tenants WHERE tenant_id = %s",
                                (tenant["tenant_id"],)).fetchone()
        if exists is not None and int(exists[0]) != epoch:
            raise ConflictError(f"tenant {tenant['tenant_id']} is already here under epoch "
                                f"{exists[0]}", code="tenant_exists")
        cursor.execute(query("import_tenant_row"), {"row": json.dumps(tenant), "epoch": epoch})
        for single, statement in (("wallet", "import_wallet"), ("rate_bucket", "import_rate_bucket")):
            if bundle.get(single):
                cursor.execute(query(statement), {"row": json.dumps(bundle[single])})
        for key, statement in _ROW_SETS:
            rows = bundle.get(key) or []
            counts[key] = len(rows)
            if rows:
                cursor.execute(query(statement), {"rows": json.dumps(rows)})
    return counts
