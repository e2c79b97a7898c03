"""The cell's side of an online tenant move: what the source serves and the target applies.

The operator drives a move through the admin API; this module is
the cell's half. On the source, ``start_move_out`` switches change capture on
under the exclusive tenant lock (migration 0006), the scope is read page by
page (``scope_page``) while the tenant keeps serving, then what changed since
(``read_changes``), in rounds; ``freeze`` stops the tenant's writes here under
its new epoch, ``finish`` marks it moved (rows kept read-only until
``purge_expired_moves``). On the target, ``move_in`` upserts rows as the
move's admin path into a frozen copy that ``activate`` starts. ``checksums``
compares both sides with one normalization.

The decisions (which state allows which step) are pure functions over the
tenant's state, apart from the I/O, so they are tested without a database.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cellplane_cells.db import translate_errors
from cellplane_cells.errors import (
    ConflictError, InvalidRequestError, NotFoundError, UnavailableError,
)
from cellplane_cells.queries import query
from cellplane_cells.tenants import PURGE_ORDER, refuse_urls, row_urls

__all__ = [
    "SCOPE_TABLES", "CHANGE_KINDS", "TenantMoveState", "MoveInAction", "encode_cursor",
    "decode_cursor", "dedupe_changes", "plan_move_out", "plan_freeze", "plan_unfreeze",
    "plan_finish", "plan_move_in", "plan_activate", "start_move_out", "scope_page",
    "read_changes", "freeze", "unfreeze", "finish", "abort_move_out", "move_in", "activate",
    "abort_move_in", "checksums", "purge_expired_moves", "purge_tenant_rows",
]

SCOPE_TABLES = ("tenant", "wallet", "rate_bucket", "targets", "webhooks", "jobs", "steps",
                "ledger", "idempotency_keys", "outbox", "schedules", "schedule_runs")
"""The move's tables, in the order a target can apply them (rows pointed at first)."""

CHANGE_KINDS = frozenset(SCOPE_TABLES)
"""Kinds of tenant_changes entries: the same names as the scope's tables."""

_SINGLE_ROW = frozenset({"tenant", "wallet", "rate_bucket"})

_BY_JOB_BLOCKS = frozenset({"steps", "ledger"})
"""Tables paged by blocks of jobs: a page may hold a few rows more than its limit
(every row of its last job), and may be short, or empty, before the end."""

_DELETABLE = ("schedule_runs", "schedules", "outbox", "idempotency_keys", "ledger", "steps", "jobs",
              "webhooks", "targets", "rate_bucket", "wallet")
"""Tables a target deletes keys from, rows pointing at others first."""

FENCED_STATES = frozenset({"frozen", "moved"})
"""States in which the database refuses the tenant's writes (0006)."""


@dataclass(frozen=True)
class TenantMoveState:
    """What the decisions need of a tenant row."""

    state: str
    move_id: str | None


# --- pure decisions --------------------------------------------------------------------------


def plan_move_out(tenant: TenantMoveState | None, move_id: str) -> bool:
    """Starting (or repeating) a move out. True: the captured changes are kept (the
    same move again); False: they are cleared and capture starts over."""
    if tenant is None:
        raise NotFoundError("the tenant is not in this cell")
    if tenant.state in ("moved", "retired"):
        raise ConflictError(f"the tenant is {tenant.state} here and cannot move out",
                            code="tenant_not_movable")
    if tenant.state == "frozen" and tenant.move_id != move_id:
        raise ConflictError(f"the tenant is frozen for move {tenant.move_id}",
                            code="tenant_not_movable")
    return tenant.move_id == move_id


def _same_move(tenant: TenantMoveState | None, move_id: str) -> TenantMoveState:
    if tenant is None:
        raise NotFoundError("the tenant is not in this cell")
    if tenant.move_id != move_id:
        raise ConflictError(f"the tenant's move here is {tenant.move_id!r}, not {move_id!r}",
                            code="move_mismatch")
    return tenant


def plan_freeze(tenant: TenantMoveState | None, move_id: str) -> bool:
    """True: freeze now; False: already frozen for this move (idempotent)."""
    current = _same_move(tenant, move_id)
    if current.state == "frozen":
        return False
    if current.state not in ("active", "paused"):
        raise ConflictError(f"the tenant is {current.state} here", code="tenant_not_movable")
    return True


def plan_unfreeze(tenant: TenantMoveState | None, move_id: str) -> bool:
    """True: back to active now; False: already active for this move."""
    current = _same_move(tenant, move_id)
    if current.state == "active":
        return False
    if current.state != "frozen":
        raise ConflictError(f"the tenant is {current.state} here", code="tenant_not_movable")
    return True


def plan_finish(tenant: TenantMoveState | None, move_id: str) -> bool:
    """True: mark moved now; False: already moved by this move."""
    current = _same_move(tenant, move_id)
    if current.state == "moved":
        return False
    # Active too: the move is committed (in etcd) when this is asked, and a freeze can
    # be lost with a primary that fell between the freeze and the commit (replication
    # is asynchronous). The tenant is fenced here now, whatever it was.
    if current.state not in ("frozen", "active"):
        raise ConflictError(f"a {current.state} tenant cannot finish a move out",
                            code="tenant_not_frozen")
    return True


class MoveInAction(str, Enum):
    CREATE = "create"
    """No copy here: the batch's tenant row creates it, frozen."""
    REPLACE = "replace"
    """A copy left by an earlier move or a retained removal: purged, then created."""
    APPLY = "apply"
    """This move's frozen copy: rows are upserted."""


def plan_move_in(tenant: TenantMoveState | None, move_id: str, *, has_tenant_row: bool) -> MoveInAction:
    if tenant is not None and tenant.state == "frozen" and tenant.move_id == move_id:
        return MoveInAction.APPLY
    if tenant is not None and tenant.state not in ("moved", "retired"):
        raise ConflictError(f"the tenant is already here ({tenant.state}, move "
                            f"{tenant.move_id!r})", code="tenant_exists")
    if not has_tenant_row:
        raise ConflictError("the first batch of a move in must carry the tenant row",
                            code="invalid_bundle")
    return MoveInAction.CREATE if tenant is None else MoveInAction.REPLACE


def plan_activate(tenant: TenantMoveState | None, move_id: str) -> bool:
    """True: activate now; False: already active under this move."""
    current = _same_move(tenant, move_id)
    if current.state == "active":
        return False
    if current.state != "frozen":
        raise ConflictError(f"the tenant is {current.state} here", code="tenant_not_frozen")
    return True


def encode_cursor(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode()


def decode_cursor(cursor: str | None) -> list[Any] | None:
    if cursor is None or cursor == "":
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor.encode()).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor") from None
    if not isinstance(key, list):
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor")
    return key


def dedupe_changes(entries: Iterable[tuple[int, str, str]]) -> dict[str, list[str]]:
    """Change entries (seq, kind, key) to the distinct keys per kind, first seen first."""
    keys: dict[str, dict[str, None]] = {}
    for _, kind, key in entries:
        keys.setdefault(kind, {})[key] = None
    return {kind: list(seen) for kind, seen in keys.items()}


# --- I/O ---------------------------------------------------------------------------------------


def _tenant(cursor: psycopg.Cursor[Any], tenant_id: str, statement: str) -> TenantMoveState | None:
    row = cursor.execute(query(statement), {"tenant_id": tenant_id}).fetchone()
    if row is None:
        return None
    return TenantMoveState(state=str(row["state"]), move_id=row["move_id"])


def _lock(cursor: psycopg.Cursor[Any], tenant_id: str) -> TenantMoveState | None:
    """The tenant row, then the exclusive tenant lock (0006's order)."""
    tenant = _tenant(cursor, tenant_id, "lock_tenant_for_move")
    if tenant is not None:
        cursor.execute(query("exclusive_tenant_lock"), {"tenant_id": tenant_id})
    return tenant


def start_move_out(conn: psycopg.Connection[Any], tenant_id: str, move_id: str) -> dict[str, int]:
    """Capture on; returns the rows in scope per table (for progress)."""
    params = {"tenant_id": tenant_id, "move_id": move_id}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        keep = plan_move_out(_lock(cursor, tenant_id), move_id)
        if not keep:
            cursor.execute(query("clear_changes"), params)
            cursor.execute(query("start_capture"), params)
    with conn.cursor() as cursor:
        row = cursor.execute(query("scope_totals"), params).fetchone()
    conn.commit()
    assert row is not None
    return {table: int(n) for table, n in row[0].items()}


def scope_page(conn: psycopg.Connection[Any], tenant_id: str, table: str, *, after: str | None,
               limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the scope's ``table``; the cursor of the next page, None at the end.

    Steps and ledger rows come by blocks of jobs (``_BY_JOB_BLOCKS``)."""
    if table not in CHANGE_KINDS:
        raise InvalidRequestError(f"no table {table!r} in a move; one of {', '.join(SCOPE_TABLES)}",
                                  code="invalid_table")
    key = decode_cursor(after)
    with conn.cursor(row_factory=dict_row) as cursor:
        exists = cursor.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (tenant_id,)).fetchone()
        if exists is None:
            conn.commit()
            raise NotFoundError("the tenant is not in this cell")
        params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit,
                                  "after": None if key is None else json.dumps(key)}
        if table in _BY_JOB_BLOCKS:
            params["table"] = table
        statement = "page_job_rows" if table in _BY_JOB_BLOCKS else f"page_{table}"
        rows = cursor.execute(query(statement), params).fetchall()
    conn.commit()
    if table in _SINGLE_ROW:
        return ([r["row"] for r in rows] if key is None else []), None
    if table in _BY_JOB_BLOCKS:
        # The last row carries only the next cursor (page_job_rows).
        last = rows[-1]["cursor"]
        return [r["row"] for r in rows[:-1]], None if last is None else encode_cursor(last)
    following = encode_cursor(rows[-1]["cursor"]) if len(rows) == limit else None
    return [r["row"] for r in rows], following


def read_changes(conn: psycopg.Connection[Any], tenant_id: str, *, after: int,
                 limit: int) -> dict[str, Any]:
    """The current version of every row changed after ``after``, up to ``limit`` entries.

    The entries are read while the exclusive tenant lock is held, for the
    moment of one indexed read: sequence numbers are taken in the order
    writers reach the trigger, not the order they commit, and a writer that
    took seq 10 may commit after one that took 11. Under the lock every
    writer that took a number has committed, so reading past 11 never skips
    a 10 that shows up later. The rows themselves are read after, without
    the lock: one changed again since is captured again.
    """
    params: dict[str, Any] = {"tenant_id": tenant_id, "after": after, "limit": limit}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        if _lock(cursor, tenant_id) is None:
            raise NotFoundError("the tenant is not in this cell")
        entries = [(int(r["seq"]), str(r["kind"]), str(r["key"]))
                   for r in cursor.execute(query("read_changes"), params).fetchall()]
    last_seq = entries[-1][0] if entries else after
    rows: dict[str, list[Any]] = {}
    deletes: dict[str, list[str]] = {}
    with conn.cursor(row_factory=dict_row) as cursor:
        for kind, keys in dedupe_changes(entries).items():
            if kind not in CHANGE_KINDS:
                continue
            found = cursor.execute(query(f"changed_{kind}"),
                                   {"tenant_id": tenant_id, "keys": keys}).fetchall()
            if found:
                rows[kind] = [r["row"] for r in found]
            present = {str(r["key"]) for r in found}
            gone = [k for k in keys if k not in present]
            if gone:
                deletes[kind] = gone
        pending = cursor.execute(query("count_changes_after"),
                                 {"tenant_id": tenant_id, "after": last_seq}).fetchone()
    conn.commit()
    return {"rows": rows, "deletes": deletes, "last_seq": last_seq,
            "pending": int(pending["pending"]) if pending else 0}


def freeze(conn: psycopg.Connection[Any], tenant_id: str, move_id: str, epoch: int, *,
           within_ms: int | None = None) -> dict[str, int]:
    """Stops every non-admin write of the tenant here, under its new epoch.

    Takes the exclusive tenant lock, so it returns only after every write that
    passed the fence before has committed; none lands after it. ``within_ms``
    is what is left of the cutover's write-pause budget: the database itself
    gives up the freeze (nothing changed) if its lock waits and statements take
    longer, so a long transaction of the tenant cannot stretch the pause."""
    params = {"tenant_id": tenant_id, "move_id": move_id, "epoch": epoch}
    try:
        with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
            if within_ms is not None:
                for setting in ("lock_timeout", "statement_timeout"):
                    cursor.execute("SELECT set_config(%s, %s, true)", (setting, f"{within_ms}ms"))
            if plan_freeze(_lock(cursor, tenant_id), move_id):
                cursor.execute(query("freeze_tenant"), params)
            row = cursor.execute(query("max_change_seq"), params).fetchone()
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
        raise UnavailableError(f"the freeze did not finish within {within_ms}ms (the tenant's "
                               "writes in flight held its lock); nothing was frozen",
                               code="freeze_timeout", retry_after_seconds=1.0) from None
    assert row is not None
    return {"last_seq": int(row["last_seq"]), "pending": int(row["pending"])}


def unfreeze(conn: psycopg.Connection[Any], tenant_id: str, move_id: str, epoch: int) -> None:
    """Back to serving here under ``epoch`` (the old one); capture stays on."""
    params = {"tenant_id": tenant_id, "move_id": move_id, "epoch": epoch}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        if plan_unfreeze(_lock(cursor, tenant_id), move_id):
            cursor.execute(query("unfreeze_tenant"), params)


def finish(conn: psycopg.Connection[Any], tenant_id: str, move_id: str, retain_seconds: int) -> None:
    """The tenant has moved out: read-only here until ``retain_seconds`` from now."""
    params = {"tenant_id": tenant_id, "move_id": move_id, "retain_seconds": retain_seconds}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        if plan_finish(_lock(cursor, tenant_id), move_id):
            cursor.execute(query("finish_move_out"), params)
            cursor.execute(query("clear_changes"), params)


def abort_move_out(conn: psycopg.Connection[Any], tenant_id: str, move_id: str) -> None:
    """Capture off, changes cleared, a freeze of this move undone. Nothing to do for
    an absent tenant or another move; refused once the move has finished."""
    params = {"tenant_id": tenant_id, "move_id": move_id}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        tenant = _lock(cursor, tenant_id)
        if tenant is None or tenant.move_id != move_id:
            return
        if tenant.state == "moved":
            raise ConflictError("the move has finished: the tenant lives in its new cell",
                                code="move_finished")
        cursor.execute(query("abort_move_out"), params)
        cursor.execute(query("clear_changes"), params)


def purge_tenant_rows(cursor: psycopg.Cursor[Any], tenant_id: str) -> None:
    """Every row of the tenant, inside the caller's admin transaction."""
    for name in PURGE_ORDER:
        cursor.execute(query(name), {"tenant_id": tenant_id})


_APPLY = {"wallet": "movein_wallet", "rate_bucket": "movein_rate_bucket",
          "targets": "movein_targets", "webhooks": "movein_webhooks", "jobs": "movein_jobs",
          "steps": "movein_steps", "ledger": "movein_ledger",
          "idempotency_keys": "movein_idempotency_keys", "outbox": "movein_outbox",
          "schedules": "movein_schedules", "schedule_runs": "movein_schedule_runs"}

_PARENT_FIRST = frozenset({"steps", "schedule_runs"})
"""Tables whose rows are taken only under a parent already here (a job, a schedule):
the applied count is the rows inserted, not the rows offered."""


def move_in(conn: psycopg.Connection[Any], tenant_id: str, *, move_id: str, epoch: int,
            rows: Mapping[str, Sequence[Any]], deletes: Mapping[str, Sequence[str]],
            allow_private: bool) -> dict[str, int]:
    """Applies one batch of a move in one transaction; rows offered per table.

    Targets and webhooks pass this cell's URL policy, as if registered here:
    the source cell may allow what this one refuses."""
    unknown = (set(rows) | set(deletes)) - CHANGE_KINDS
    if unknown:
        raise ConflictError(f"unknown tables in the batch: {sorted(unknown)}", code="invalid_bundle")
    refuse_urls([*row_urls(rows.get("targets") or [], "targets", "name"),
                 *row_urls(rows.get("webhooks") or [], "webhooks", "endpoint_id")],
                allow_private=allow_private)
    tenant_rows = list(rows.get("tenant") or [])
    # Steps carry no tenant id: they are taken only for this tenant's jobs.
    if any(not isinstance(r, dict) or r.get("tenant_id", tenant_id) != tenant_id
           for table in rows for r in rows[table]):
        raise ConflictError("the batch carries rows of another tenant", code="invalid_bundle")
    applied: dict[str, int] = {}
    params: dict[str, Any] = {"tenant_id": tenant_id, "move_id": move_id, "epoch": epoch}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(query("declare_tenant_admin"))
        action = plan_move_in(_tenant(cursor, tenant_id, "movein_find_tenant"), move_id,
                              has_tenant_row=bool(tenant_rows))
        if action is MoveInAction.REPLACE:
            purge_tenant_rows(cursor, tenant_id)
        if action is not MoveInAction.APPLY:
            cursor.execute(query("movein_create_tenant"), {**params, "row": json.dumps(tenant_rows[0])})
        elif tenant_rows:
            cursor.execute(query("movein_update_tenant"), {**params, "row": json.dumps(tenant_rows[-1])})
        if tenant_rows:
            applied["tenant"] = len(tenant_rows)
        for table in _DELETABLE:
            keys = list(deletes.get(table) or [])
            if keys:
                cursor.execute(query(f"movein_delete_{table}"), {**params, "keys": keys})
        for table in SCOPE_TABLES[1:]:
            batch = list(rows.get(table) or [])
            if not batch:
                continue
            cursor.execute(query(_APPLY[table]), {**params, "rows": json.dumps(batch)})
            # Steps of a job the bulk copy has not sent (it was submitted after the jobs
            # were paged) are left out, not refused: the job's insert was captured with
            # its steps, so the next round of changes brings both together. The same
            # for the runs of a schedule created after the schedules were paged.
            applied[table] = cursor.rowcount if table in _PARENT_FIRST else len(batch)
    return applied


def activate(conn: psycopg.Connection[Any], tenant_id: str, move_id: str) -> None:
    params = {"tenant_id": tenant_id, "move_id": move_id}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        if plan_activate(_tenant(cursor, tenant_id, "movein_find_tenant"), move_id):
            cursor.execute(query("activate_moved_in"), params)


def abort_move_in(conn: psycopg.Connection[Any], tenant_id: str, move_id: str) -> None:
    """Removes this move's frozen copy; nothing to do if absent or not this move's."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(query("declare_tenant_admin"))
        tenant = _tenant(cursor, tenant_id, "movein_find_tenant")
        if tenant is None:
            return
        if tenant.state == "frozen" and tenant.move_id == move_id:
            purge_tenant_rows(cursor, tenant_id)
            return
        if tenant.state not in ("moved", "retired"):
            raise ConflictError(f"the tenant is {tenant.state} here (move {tenant.move_id!r}); "
                                "not this move's copy to remove", code="tenant_active")


def checksums(conn: psycopg.Connection[Any], tenant_id: str) -> dict[str, dict[str, Any]]:
    """Rows and checksum per table over the move's live scope (see move_checksums)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        if cursor.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (tenant_id,)).fetchone() is None:
            raise NotFoundError("the tenant is not in this cell")
        # Both sides hash times and print values alike, whatever their settings;
        # the plan's settings are move_checksums' own (see checksum_session).
        cursor.execute(query("checksum_session"))
        rows = cursor.execute(query("move_checksums"), {"tenant_id": tenant_id}).fetchall()
    return {str(r["table"]): {"rows": int(r["rows"]), "checksum": str(r["checksum"])} for r in rows}


def purge_expired_moves(conn: psycopg.Connection[Any]) -> list[str]:
    """Purges every moved-out tenant whose retention has passed; returns their ids."""
    purged = []
    with conn.cursor() as cursor:
        due = [str(r[0]) for r in cursor.execute(query("moved_tenants_to_purge")).fetchall()]
    conn.commit()
    for tenant_id in due:
        with translate_errors(), conn.transaction(), conn.cursor() as cursor:
            cursor.execute(query("declare_tenant_admin"))
            # Still moved and past its retention: it may have moved back in since the list.
            locked = cursor.execute(query("lock_moved_tenant_for_purge"),
                                    {"tenant_id": tenant_id}).fetchone()
            if locked is None:
                continue
            purge_tenant_rows(cursor, tenant_id)
            purged.append(tenant_id)
    return purged
