"""What a TenantMove's status says, from how far the move got.

Three conditions, as ``kubectl wait --for=condition=`` reads them:
``Accepted`` (the move was admitted, or why not), ``Progressing`` (true while
the move works, its reason the step it is in or why it waits) and ``Completed`` (true once the
tenant serves from the target; false with the reason of an abort or failure).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellplane_operator.domain.conditions import Condition, ConditionStatus, set_condition
from cellplane_operator.domain.moves import TERMINAL_PHASES, MovePhase

__all__ = ["MoveReport", "plan_move_status"]


@dataclass(frozen=True)
class MoveReport:
    phase: MovePhase
    reason: str
    """CamelCase cause: the refusal, the failure, or what the step waits for."""
    message: str
    source_cell: str | None = None
    target_cell: str | None = None
    progress: Mapping[str, Any] | None = None
    """status.progress as the CRD spells it (camelCase keys)."""
    refused: bool = False
    """The move was never admitted: nothing was started."""
    cell_epochs: tuple[int, int] | None = None
    """The source's and the target's placement-group epochs the copy began under."""


def plan_move_status(report: MoveReport, *, generation: int,
                     current_conditions: Sequence[Mapping[str, Any]],
                     now: datetime.datetime) -> dict[str, Any]:
    def condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
        return Condition(type_, ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason,
                         message, observed_generation=generation)

    phase = report.phase
    terminal = phase in TERMINAL_PHASES
    conditions: list[dict[str, Any]] = [dict(c) for c in current_conditions]
    if report.refused:
        conditions = set_condition(conditions, condition("Accepted", False, report.reason,
                                                         report.message), now=now)
    elif phase is not MovePhase.PENDING:
        conditions = set_condition(conditions, condition(
            "Accepted", True, "Admitted",
            f"moving from cell {report.source_cell} to cell {report.target_cell}"), now=now)
    conditions = set_condition(conditions, condition(
        "Progressing", not terminal, report.reason, report.message), now=now)
    completed = phase is MovePhase.COMPLETED
    conditions = set_condition(conditions, condition(
        "Completed", completed, "Completed" if completed else report.reason,
        report.message if terminal else f"the move is in phase {phase.value}"), now=now)
    status: dict[str, Any] = {"phase": phase.value, "observedGeneration": generation,
                              "conditions": conditions}
    if report.source_cell is not None:
        status["sourceCell"] = report.source_cell
    if report.target_cell is not None:
        status["targetCell"] = report.target_cell
    if report.cell_epochs is not None:
        status["sourceCellEpoch"], status["targetCellEpoch"] = report.cell_epochs
    if report.progress is not None:
        status["progress"] = dict(report.progress)
    return status
