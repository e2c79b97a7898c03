"""Named SQL statements, loaded from the ``sql/*.sql`` files beside this module.

A statement starts at a ``-- name: <name>`` line and runs to the next one; the
comments above and inside it stay with it, because they say why it is shaped
as it is.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

__all__ = ["query"]

_SQL_DIR = Path(__file__).parent / "sql"
_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


@cache
def _load() -> dict[str, bytes]:
    statements: dict[str, bytes] = {}
    for path in sorted(_SQL_DIR.glob("*.sql")):
        text = path.read_text()
        marks = list(_NAME.finditer(text))
        for index, mark in enumerate(marks):
            end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
            name = mark.group(1)
            if name in statements:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            statements[name] = text[mark.end():end].strip().encode()
    return statements


def query(name: str) -> bytes:
    """The statement named ``name``; a typo fails loudly, not as a SQL error."""
    try:
        return _load()[name]
    except KeyError:
        raise KeyError(f"no SQL statement named {name!r} in {_SQL_DIR}") from None
