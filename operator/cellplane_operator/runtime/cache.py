"""The objects the operator has seen, as kopf's watch delivered them, and who to wake on change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cellplane_operator.placement.records import TenantKey

__all__ = ["ObjectCache"]


@dataclass
class ObjectCache:
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    tenants: dict[TenantKey, dict[str, Any]] = field(default_factory=dict)
    on_cell: list[Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]] = field(
        default_factory=list)
    """Called with (name, the body before, the body now); None for absent."""
    on_tenant: list[Callable[[TenantKey], None]] = field(default_factory=list)
    moves: dict[TenantKey, dict[str, Any]] = field(default_factory=dict)
    """TenantMoves by (namespace, name): the same key shape as tenants."""
    on_move: list[Callable[[TenantKey], None]] = field(default_factory=list)

    def observe_cell(self, event_type: str | None, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        current: dict[str, Any] | None
        if event_type == "DELETED":
            before = self.cells.pop(name, None)
            current = None
        else:
            before = self.cells.get(name)
            self.cells[name] = body
            current = body
        for callback in self.on_cell:
            callback(name, before, current)

    def observe_tenant(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = TenantKey(meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self.tenants.pop(key, None)
        else:
            self.tenants[key] = body
        for callback in self.on_tenant:
            callback(key)

    def observe_move(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = TenantKey(meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self.moves.pop(key, None)
        else:
            self.moves[key] = body
        for callback in self.on_move:
            callback(key)
