"""Numbered schema migrations, applied at start-up, idempotent.

Each ``migrations/NNNN_name.sql`` runs once, in its own transaction, in number
order; ``schema_migrations`` records what ran. An advisory lock keeps two
processes of one cell starting together from applying the same file twice.
After the migrations, ``sql/privileges.sql`` gives the cell's roles
(``roles.py``) their grants again: it is computed from the schema as it now
is, so a table or column a migration adds is covered without another step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

__all__ = ["Migration", "available_migrations", "migrate"]

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
PRIVILEGES_SQL = Path(__file__).parent / "sql" / "privileges.sql"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant shared by every cell process; it only has to differ from other
# advisory-lock users of the same database.
_LOCK_KEY = 0x63656C6C


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    path: Path


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise ValueError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    numbers = [m.number for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps, found {numbers}")
    return found


def migrate(conninfo: str, *, cell: str) -> list[int]:
    """Applies what has not run yet; returns the numbers applied now."""
    applied_now: list[int] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " number integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT number FROM schema_migrations")}
            for migration in available_migrations():
                if migration.number in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.path.read_bytes())
                    conn.execute("INSERT INTO schema_migrations (number, name) VALUES (%s, %s)",
                                 (migration.number, migration.name))
                applied_now.append(migration.number)
            with conn.transaction():
                conn.execute(PRIVILEGES_SQL.read_bytes())
            conn.execute(
                "INSERT INTO placement_group (cell) VALUES (%s) ON CONFLICT (singleton) DO NOTHING",
                (cell,),
            )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
