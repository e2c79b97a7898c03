"""Bringing dead-lettered jobs back, at a capped rate.

A dead job was refunded when it died, and the ledger holds one reservation per
job, so a redrive does not revive the old row: it copies the job into a new one
with a new reservation (402 if it no longer fits) and fresh step keys, and
links the two. The copies are spaced ``1 / rate`` seconds apart in their due
time, so redriving ten thousand jobs cannot flood the workers or the target.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cellplane_cells.db import translate_errors
from cellplane_cells.queries import query

__all__ = ["RedriveResult", "redrive"]

MAX_PER_CALL = 1000


@dataclass(frozen=True)
class RedriveResult:
    redriven: list[tuple[uuid.UUID, uuid.UUID]]
    """(dead job, its new copy) pairs."""
    stopped_by_funds: bool
    """True when a copy's reservation did not fit and the redrive stopped there."""


def redrive(conn: psycopg.Connection[Any], tenant_id: str, *, limit: int,
            per_second: float) -> RedriveResult:
    if not 0 < per_second <= 1000:
        raise ValueError("per_second must be in (0, 1000]")
    limit = max(0, min(limit, MAX_PER_CALL))
    pairs: list[tuple[uuid.UUID, uuid.UUID]] = []
    stopped = False
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        dead = cursor.execute(query("dead_to_redrive"),
                              {"tenant_id": tenant_id, "limit": limit}).fetchall()
        for index, row in enumerate(dead):
            new_id = uuid.uuid4()
            params = {"tenant_id": tenant_id, "job_id": new_id, "old_job_id": row["job_id"],
                      "estimate": row["estimate"], "step_count": row["step_count"],
                      "delay_seconds": index / per_second}
            if cursor.execute(query("reserve"), params).fetchone() is None:
                stopped = True
                break
            cursor.execute(query("insert_redriven_job"), params)
            cursor.execute(query("insert_steps"), params)
            cursor.execute(query("insert_accepted_event"), params)
            cursor.execute(query("mark_redriven"), params)
            pairs.append((row["job_id"], new_id))
    return RedriveResult(pairs, stopped)
