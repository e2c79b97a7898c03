"""The cell's SQL files: every statement the code names exists, migrations are numbered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cellplane_cells.migrate import available_migrations
from cellplane_cells.queries import query

CELLS = Path(__file__).resolve().parents[2] / "cells" / "cellplane_cells"


def test_every_named_query_used_in_code_exists() -> None:
    used = set()
    for module in CELLS.rglob("*.py"):
        used |= set(re.findall(r'query\("([a-z_]+)"\)', module.read_text()))
    assert used, "no query() calls found"
    for name in sorted(used):
        assert query(name).strip(), name


def test_unknown_query_names_fail_loudly() -> None:
    with pytest.raises(KeyError, match="no SQL statement named"):
        query("no_such_statement")


def test_migrations_are_numbered_without_gaps() -> None:
    numbers = [m.number for m in available_migrations()]
    assert numbers == list(range(1, len(numbers) + 1)) and numbers[:2] == [1, 2]


def test_a_gap_in_the_numbering_is_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="without gaps"):
        available_migrations(tmp_path)
