"""The Cell's status as one of its sites reports it, and the Events that go with it.

The status is planned by the pure functions of ``domain/cells.py``, held as the typed
model the CRD is generated from (``v1alpha1.CellStatus``), and serialised once, into the
merge patch (``_wire``): camelCase, and only the fields the plan set, so that a field
the plan clears on purpose (the endpoints of a cell that nobody serves) is a null that
removes it, and a field the plan does not own (the placement leader's ``tenants``) is
left alone. It is written beside the site's work (``runtime/kubewrites.py``): nothing
on the way to serving waits on the apiserver.

Events: a phase that changed, a fence that came into force or was lifted, a takeover
once the status shows it, a failover this standby refuses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from cellplane_operator.api.v1alpha1 import CellStatus, CellTakeover, Condition
from cellplane_operator.domain.cells import (
    CellObservation,
    StandbyReport,
    plan_cell_status,
    plan_refused_failover,
)
from cellplane_operator.domain.failover import Candidacy, TakeoverRecord
from cellplane_operator.domain.fencing import fence_event
from cellplane_operator.domain.primary_site import status_write_due
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.kubewrites import PendingWrites

__all__ = ["CellStatusReporter", "current_status"]

log = logging.getLogger(__name__)

STATUS_REFRESH_SECONDS = 10.0
"""A status that differs only in lag numbers is written at most this often."""

Then = Callable[[], Awaitable[None]]


def current_status(body: dict[str, Any]) -> CellStatus:
    """The Cell's status as stored; an empty one if it cannot be read (it is rewritten)."""
    try:
        return CellStatus.model_validate(body.get("status") or {})
    except ValidationError as error:
        log.warning("cell %s: ignoring a status that cannot be read: %s",
                    body["metadata"]["name"], error)
        return CellStatus()


def _wire(status: CellStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _stored(conditions: tuple[Condition, ...] | None) -> list[dict[str, Any]]:
    """Conditions as the domain's condition functions read them (as stored)."""
    return [c.model_dump(mode="json", by_alias=True, exclude_unset=True)
            for c in conditions or ()]


def _condition(status: CellStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions or () if c.type == type_), None)


def _stored_condition(status: CellStatus, type_: str) -> dict[str, Any] | None:
    found = _condition(status, type_)
    return None if found is None else found.model_dump(mode="json", by_alias=True,
                                                       exclude_unset=True)


def _takeover(record: TakeoverRecord) -> CellTakeover:
    return CellTakeover(epoch=record.epoch, from_region=record.from_region,
                        to_region=record.to_region, planned=record.planned,
                        seconds=round(record.seconds, 3), at=record.at)


class CellStatusReporter:
    """What one site writes into its Cell's status, and says in Events."""

    def __init__(self, ctx: RegionContext, cell: str, writes: PendingWrites) -> None:
        self._ctx = ctx
        self._cell = cell
        self._writes = writes
        self._last: CellStatus | None = None
        self._last_wire: dict[str, Any] | None = None
        self._last_at = 0.0
        self._refusal_said: tuple[int, str] | None = None

    async def standby_reports(self, others: tuple[str, ...]) -> tuple[StandbyReport, ...] | None:
        """What the cell's other regions' sites last reported; None if etcd did not answer."""
        if not others:  # an etcd read a second per cell, only where it tells something
            return ()
        try:
            reports = await self._ctx.reports.read_cell(self._cell)
        except CellplaneError as error:
            log.warning("%s: cannot read standby reports: %s", self._cell, error)
            return None
        return tuple(StandbyReport(region, report.role == "standby" and report.streaming,
                                   report.lag_seconds, report.message)
                     for region, report in reports.items() if region in others)

    async def report(self, body: dict[str, Any], observed: CellObservation, *,
                     took_over: TakeoverRecord | None,
                     on_took_over_shown: Callable[[TakeoverRecord], Awaitable[None]]) -> None:
        """The owner's status of the cell, written if it says something new."""
        current = current_status(body)
        planned = plan_cell_status(observed, current_conditions=_stored(current.conditions),
                                   now=self._ctx.clock.now())
        status = CellStatus.model_validate(planned)
        if took_over is not None:
            # Level-triggered: in every status of this epoch, so a write that failed (the
            # apiserver away) is made again, and a restarted operator makes it too.
            status = status.model_copy(update={"last_takeover": _takeover(took_over)})
        wire, now = _wire(status), self._ctx.clock.monotonic()
        if not status_write_due(wire, self._last_wire, seconds_since_last=now - self._last_at,
                                refresh_seconds=STATUS_REFRESH_SECONDS):
            return
        before = self._last or current
        shown = current.last_takeover.epoch if current.last_takeover is not None else None

        async def written() -> None:
            if took_over is not None and shown != took_over.epoch:
                await on_took_over_shown(took_over)

        self._offer(wire, then=written)
        self._last, self._last_wire, self._last_at = status, wire, now
        await self._say_changes(body, before, status)

    async def _say_changes(self, body: dict[str, Any], before: CellStatus,
                           status: CellStatus) -> None:
        said = fence_event(_stored_condition(before, "Fenced"),
                           _stored_condition(status, "Fenced"), cell=self._cell)
        if said is not None:
            await self._ctx.event(body, said.type, said.reason, said.message)
        ready = _condition(status, "Ready")
        assert ready is not None  # every plan sets it
        # A fence a person put on has its own Fenced / Unfenced Events (above).
        if status.phase != before.phase and ready.reason != "FencedByUser":
            await self._ctx.event(body, "Warning" if status.phase in ("Degraded", "Fenced")
                                  else "Normal", f"Phase{status.phase}", ready.message)

    def say_refusal(self, body: dict[str, Any], epoch: int, decision: Candidacy) -> None:
        """A standby that will not take the ownerless cell says why: in the status (nobody
        else writes it then) and, once written, in an Event."""
        assert decision.refusal is not None
        said = (epoch, decision.refusal)
        if self._refusal_said == said:
            return
        current = current_status(body)
        status = CellStatus.model_validate(plan_refused_failover(
            generation=int(body["metadata"].get("generation", 0)), reason=decision.refusal,
            message=decision.message, current_conditions=_stored(current.conditions),
            now=self._ctx.clock.now()))

        async def written() -> None:
            if self._refusal_said != said:
                self._refusal_said = said
                await self._ctx.event(body, "Warning", "FailoverRefused", decision.message)

        self._offer(_wire(status), then=written)

    def _offer(self, wire: dict[str, Any], *, then: Then | None = None) -> None:
        """The Cell's status as this site sees it now, written when the apiserver takes it
        (a later one replaces it if it was not written yet); ``then`` runs once it was."""
        patch = {"status": wire}
        self._writes.offer(
            "status", lambda: self._ctx.kube.patch(CELLS, self._cell, patch,
                                                   subresource="status"), then=then)
