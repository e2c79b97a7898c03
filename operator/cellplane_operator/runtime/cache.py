"""The objects the operator has seen, parsed once as kopf's watch delivered them, and who to
wake on change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cellplane_operator.placement.records import TenantKey
from cellplane_operator.runtime.objects import CellObject, MoveObject, TenantObject

__all__ = ["ObjectCache"]


@dataclass
class ObjectCache:
    cells: dict[str, CellObject] = field(default_factory=dict)
    tenants: dict[TenantKey, TenantObject] = field(default_factory=dict)
    on_cell: list[Callable[[str, CellObject | None, CellObject | None], None]] = field(
        default_factory=list)
    """Called with (name, the cell before, the cell now); None for absent."""
    on_tenant: list[Callable[[TenantKey], None]] = field(default_factory=list)
    moves: dict[TenantKey, MoveObject] = field(default_factory=dict)
    """TenantMoves by (namespace, name): the same key shape as tenants."""
    on_move: list[Callable[[TenantKey], None]] = field(default_factory=list)

    def observe_cell(self, event_type: str | None, body: dict[str, Any]) -> None:
        cell = CellObject.from_body(body)
        current: CellObject | None
        if event_type == "DELETED":
            before = self.cells.pop(cell.name, None)
            current = None
        else:
            before = self.cells.get(cell.name)
            self.cells[cell.name] = current = cell
        for callback in self.on_cell:
            callback(cell.name, before, current)

    def observe_tenant(self, event_type: str | None, body: dict[str, Any]) -> None:
        tenant = TenantObject.from_body(body)
        if event_type == "DELETED":
            self.tenants.pop(tenant.key, None)
        else:
            self.tenants[tenant.key] = tenant
        for callback in self.on_tenant:
            callback(tenant.key)

    def observe_move(self, event_type: str | None, body: dict[str, Any]) -> None:
        move = MoveObject.from_body(body)
        if event_type == "DELETED":
            self.moves.pop(move.key, None)
        else:
            self.moves[move.key] = move
        for callback in self.on_move:
            callback(move.key)
