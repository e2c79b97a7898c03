"""The placement leader's move controller: TenantMoves from admission to completion.

One task per move that has not ended, while this operator leads the placement
election. Each step reads (the TenantMove, the Tenant, the placement record,
the cells), asks the pure rules (``domain/moves.py``), acts through the cells'
admin APIs and etcd, and reports (status, conditions, Events).

The commit point is one compare-and-swap of the tenant's placement record in
etcd: from (source, epoch N) to (target, epoch N+1). Everything before it is
undone by unfreezing the source (the target never served); everything after it
is finished forward. A leader that dies anywhere is replaced by one that reads
the record and knows which side of the commit it is on (``resume``).

The write pause, in order: the record is marked moving (the router holds the
tenant's requests), the source freezes the tenant under epoch N+1 (its
database refuses every later write of the tenant, a paused worker's too), the
last changes are copied, both cells' checksums are compared, the record is
switched (the commit), the target starts the tenant, the mark is cleared and
the router sends the held requests to the target. The pause carries its
deadline (``CutoverClock``): a step before the commit still running at it gives
the writes back (the source serves again under epoch N), so a loaded machine
makes a move retry, or fail, never pause longer than its budget.

A move that cannot proceed ends: an abort is decided before any cell is asked,
and a move stuck before its cutover (a refusal that does not lift, steps that
keep failing, a cutover that never fits) fails at the progress deadline with
its reason, releasing what it holds.

Jobs running in the source at the freeze are stopped there (their writes are
refused) and run again in the target from their last saved step with the same
step idempotency keys: waiting for them would make the pause as long as the
slowest step, which no budget bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from cellplane_operator.api import v1alpha1
from cellplane_operator.domain.cells import SERVING_PHASES, Region, Tier
from cellplane_operator.domain.conditions import find_condition
from cellplane_operator.domain.dedicated import made_for_move, move_target_name
from cellplane_operator.domain.move_copy import (
    CatchUpRound, CutOver, NeverFits, OverBudget, after_catch_up_round, changed_primary,
    checksum_seconds, copy_rate,
)
from cellplane_operator.domain.move_status import MoveReport, plan_move_status
from cellplane_operator.domain.moves import (
    MAX_CUTOVER_ATTEMPTS, TERMINAL_PHASES, Admitted, CutoverClock, KeepSource, MovePhase,
    MoveRequest, Overrun, QueuedMove, RecordView, RefusalReason, Refused, Resume, admit_move,
    after_overrun, differing_tables, gives_up, may_abort, moves_ahead, resume, source_retention,
    target_epoch, waiting_refusal_phase,
)
from cellplane_operator.domain.moves import refused_urls
from cellplane_operator.domain.placement import (
    CellCandidate, PlacementRequest, RegionPolicy, Unplaceable, WaitForCell, place,
)
from cellplane_operator.errors import CellApiError, CellplaneError
from cellplane_operator.failpoints import delay, failpoint
from cellplane_operator.kube import CELLS, TENANTMOVES
from cellplane_operator.metrics import count_moves, move_paused, move_phase_written
from cellplane_operator.ownership.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import Stored, TenantKey
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.movecopy import TABLES, CellEnd, TenantCopy
from cellplane_operator.runtime.objects import MoveObject, body_of
from cellplane_operator.runtime.specs import TenantSettings
from cellplane_operator.runtime.tenants import TenantController, dedicated_to

__all__ = ["MoveController", "MOVE_FINALIZER"]

log = logging.getLogger(__name__)

MOVE_FINALIZER = "cellplane.io/move"
_PROGRESS_EVERY_SECONDS = 1.0
_MAX_BACKOFF_SECONDS = 10.0
_ADMISSION_RETRY_SECONDS = 2.0
_FIXED_PAUSE_FLOOR_SECONDS = 0.1
"""etcd writes, the freeze and the activation: what the pause costs besides copying."""
_RETIME_CHECKSUMS_SECONDS = 5.0
"""How often a move whose verification does not fit its budget times the checksums again."""
_RELEASE_SECONDS = 30.0
"""How long an ending move keeps asking a cell that does not answer to let go of the move
(the target's copy, the source's capture) before it ends anyway, naming what is left."""
_CELL_CALL_SECONDS = 10.0
"""One release call's bound."""


class _Ended(Exception):
    """The move reached a terminal phase (or its object is gone): stop driving it."""


class _AbortAsked(Exception):
    """An abort (or a deletion) came while a step ran: the next step ends the move."""


class _CannotCutOver(Exception):
    """Catching up never brought a cutover within the budget: the move fails."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _CellTookOver(Exception):
    """A cell of the move changed its primary during the copy: start the copy again.

    The source's change capture lives in its database: a standby promoted after
    a region loss may lack the last captured changes (and the rows they name),
    and a target that failed over may lack rows already sent. Either way the
    copy may have a gap no verification should have to find; a fresh copy has none.
    """


@dataclass
class _Run:
    """What one move's task remembers between its steps; lost (and rebuilt) on restart."""

    copy: TenantCopy | None = None
    rows_per_second: float = 0.0
    check_seconds: float = 0.0
    checks_timed_at: float | None = None
    """The clock's monotonic reading at the last timing of the checksums; None: not timed
    in this copy."""
    said_over_budget: bool = False
    totals: dict[str, int] | None = None
    copied: dict[str, int] | None = None
    last_progress: float = 0.0
    epochs: tuple[int, int] | None = None
    """The source's and the target's placement-group epochs when this copy began."""
    overruns: int = 0
    """Cutovers that could not commit within the budget and gave the writes back."""
    catching_up_since: float | None = None
    """The clock's monotonic reading when this move began catching up (no cutover since)."""
    failing_since: float | None = None
    """The clock's monotonic reading at the first of the steps failing in a row; None: the
    last one passed."""
    late_freeze: tuple[asyncio.Task[None], TenantCopy, int] | None = None
    """A freeze given up on at its deadline whose answer has not come: the cell may still
    apply it, so the source is unfrozen once more when it answers."""


class MoveController:
    def __init__(self, ctx: RegionContext, leadership: Leadership,
                 tenants: TenantController) -> None:
        self._ctx = ctx
        self._leadership = leadership
        self._tenants = tenants
        self._tasks: dict[TenantKey, asyncio.Task[None]] = {}
        self._wakes: dict[TenantKey, asyncio.Event] = {}
        self._ended: set[TenantKey] = set()
        """Moves with nothing left to do, not looked at again until they change."""

    # -- scheduling ------------------------------------------------------------------

    def move_changed(self, key: TenantKey) -> None:
        count_moves((body.get("status") or {}).get("phase")
                    for body in (m.body for m in self._ctx.cache.moves.values()))
        self._ended.discard(key)
        self._wakes.setdefault(key, asyncio.Event()).set()
        if self._leadership.leading:
            self._ensure_task(key)
            if tenant := _spec(body_of(self._ctx.cache.moves.get(key)) or {}).get("tenant"):
                # The Tenant's Moving condition follows the move's phase.
                self._tenants.tenant_changed(TenantKey(key.namespace, str(tenant)))

    def tenant_changed(self, key: TenantKey) -> None:
        for move_key, found in list(self._ctx.cache.moves.items()):
            body = found.body
            if move_key.namespace == key.namespace and _spec(body).get("tenant") == key.name:
                self.move_changed(move_key)

    def _ensure_task(self, key: TenantKey) -> None:
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.create_task(self._drive(key), name=f"move-{key}")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._leadership.leading:
                for key in list(self._ctx.cache.moves):
                    if key not in self._ended:
                        self._ensure_task(key)
            else:
                self._ended.clear()
                await self._cancel_all()
            # Leadership.changed is cleared by the tenant controller; a short poll
            # here costs nothing and needs no second consumer of that event.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
        await self._cancel_all()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drive(self, key: TenantKey) -> None:
        run = _Run()
        backoff = 0.5
        while self._leadership.leading:
            body = body_of(self._ctx.cache.moves.get(key))
            if body is None:
                return
            wake = self._wakes.setdefault(key, asyncio.Event())
            wake.clear()
            try:
                await self._step(key, body, run)
                backoff = 0.5
                run.failing_since = None
            except _Ended:
                if wake.is_set():
                    # It changed while this step ran (its own status, often): look again,
                    # or that change would be lost until the next one.
                    continue
                self._ended.add(key)
                return
            except _CellTookOver as took_over:
                try:
                    await self._copy_again(body, run, str(took_over))
                except CellplaneError as error:
                    # The status still names the old epochs: the next step sees the
                    # takeover again and starts over from here.
                    log.warning("move %s: starting the copy again failed (%s)", key, error)
                    run.epochs = None
                    await _wait(wake, backoff)
            except NotLeaderError:
                return
            except _AbortAsked:
                run.copy = None
            except CellplaneError as error:
                log.warning("move %s: %s; again in %.1fs", key, error, backoff)
                run.copy = None
                if await self._stuck(key, run, error):
                    self._ended.add(key)
                    return
                await _wait(wake, backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            except Exception as error:
                log.exception("move %s failed a step; again in %.1fs", key, backoff)
                run.copy = None
                if await self._stuck(key, run, error):
                    self._ended.add(key)
                    return
                await _wait(wake, backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)

    # -- the steps -------------------------------------------------------------------

    async def _step(self, key: TenantKey, body: dict[str, Any], run: _Run) -> None:
        status = body.get("status") or {}
        phase = MovePhase(status.get("phase") or MovePhase.PENDING.value)
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        if phase in TERMINAL_PHASES:
            if deleting:
                await self._ctx.drop_finalizer(TENANTMOVES, body, MOVE_FINALIZER)
            elif phase is MovePhase.COMPLETED:
                await self._retire_dedicated_source(body)
            raise _Ended
        if phase is MovePhase.PENDING:
            if deleting or _spec(body).get("abort"):
                # Nothing was started but, for a dedicated tenant, the cell made for it.
                await self._end(body, run, None, MovePhase.ABORTED, "Aborted",
                                "aborted before it started ("
                                + ("the TenantMove is being deleted" if deleting else "spec.abort")
                                + "): nothing was copied")
                raise _Ended
            await self._admit(key, body)
            return
        spec = v1alpha1.TenantMoveSpec.model_validate(body["spec"])
        tenant_key = TenantKey(key.namespace, spec.tenant)
        source, target = str(status["sourceCell"]), str(status["targetCell"])
        # etcd, not memory: a new leader's tenant controller may not have read it yet.
        stored = await self._tenants.refresh(tenant_key, reconcile=False)
        view = None if stored is None else _record_view(stored)
        decision = resume(phase, view, source=source, target=target)
        if decision is Resume.LOST:
            await self._end(body, run, None if stored is None else stored.record.tenant_id,
                            MovePhase.FAILED, "TenantRecordLost",
                            f"the placement record of tenant {spec.tenant} no longer names "
                            f"cell {source}")
            raise _Ended
        assert stored is not None
        if decision is Resume.CONTINUE and may_abort(phase):
            # Before a cell is asked anything: an abort, or a cell gone, must end a move
            # even when a cell does not answer. (A freeze that lands late finds the move's
            # capture cancelled, and is refused.)
            aborting = spec.abort or deleting or self._tenant_deleting(tenant_key)
            if aborting:
                await self._end(body, run, stored.record.tenant_id, MovePhase.ABORTED, "Aborted",
                                "aborted (" + ("spec.abort" if spec.abort else
                                              "the TenantMove is being deleted" if deleting else
                                              f"tenant {spec.tenant} is being deleted")
                                + f"); the tenant stays in cell {source}, untouched")
                raise _Ended
            if await self._cell_gone(target):
                await self._end(body, run, stored.record.tenant_id, MovePhase.FAILED,
                                "TargetCellGone", f"the target cell {target} is gone or being "
                                f"deleted; the tenant stays in cell {source}")
                raise _Ended
            await self._settle_late_freeze(run)
        copy = run.copy or await self._open_copy(body, stored, source, target, run)
        if run.epochs is None and "sourceCellEpoch" in status and "targetCellEpoch" in status:
            # A new leader checks the cells against the epochs the copy began under.
            run.epochs = (int(status["sourceCellEpoch"]), int(status["targetCellEpoch"]))
        if decision is Resume.ROLL_FORWARD:
            await self._roll_forward(body, tenant_key, stored, copy, spec, pause_seconds=None)
            raise _Ended
        if decision is Resume.UNDO_CUTOVER:
            await self._undo_cutover(body, tenant_key, stored, copy)
            await self._report(body, MoveReport(
                MovePhase.CATCHING_UP, "CutoverRetried",
                "a cutover was interrupted before its commit; the source serves again and "
                "the move catches up once more", source, target, status.get("progress")))
            return
        if phase is MovePhase.COPYING:
            await self._copy(body, copy, run)
        elif phase is MovePhase.CATCHING_UP:
            try:
                ready = await self._catch_up(body, key, copy, run, spec)
            except _CannotCutOver as never:
                await self._end(body, run, copy.tenant_id, MovePhase.FAILED, never.reason,
                                str(never))
                raise _Ended from None
            if ready:
                run.catching_up_since = None
                await self._cut_over(body, tenant_key, copy, run, spec)

    async def _admit(self, key: TenantKey, body: dict[str, Any]) -> None:
        spec_body = _spec(body)
        try:
            spec = v1alpha1.TenantMoveSpec.model_validate(spec_body)
        except ValidationError as error:
            await self._refuse(body, Refused(RefusalReason.NO_SUCH_CELL, f"invalid spec: {error}"),
                               None)
            return
        tenant_key = TenantKey(key.namespace, spec.tenant)
        tenant_body = body_of(self._ctx.cache.tenants.get(tenant_key))
        stored = self._tenants.record(tenant_key)
        if tenant_body is None:
            await self._refuse(body, Refused(RefusalReason.NOT_PLACED,
                                             f"no Tenant {spec.tenant} in namespace {key.namespace}"),
                               None)
            return
        tenant = TenantSettings.from_body(tenant_body)
        source = stored.record.cell if stored is not None else None
        candidates = self._tenants.candidates()
        dedicated = tenant.isolation is Tier.DEDICATED
        if dedicated:
            # A dedicated tenant moves into a cell of its own, made for the move.
            target_name = spec.target_cell or move_target_name(
                tenant.namespace, tenant.name, str(body["metadata"]["uid"]))
        else:
            target_name = spec.target_cell or self._pick_in_region(
                tenant, str(spec.target_region), source, candidates)
        target = next((c for c in candidates if c.name == target_name), None)
        max_running = tenant.quotas().max_running
        outcome = admit_move(MoveRequest(
            tenant=spec.tenant, isolation=tenant.isolation, source_cell=source,
            max_running=max_running, target=target, target_name=target_name,
            tenant_deleting=bool(tenant_body["metadata"].get("deletionTimestamp")),
            other_moves=self._other_moves(key, body, spec.tenant)))
        if isinstance(outcome, Refused) and dedicated \
                and outcome.reason is RefusalReason.NO_SUCH_CELL:
            region = spec.target_region or self._region_of(source) or tenant.home_region
            like = (body_of(self._ctx.cache.cells.get(source or "")) or {}).get("spec")
            await self._tenants.ensure_dedicated_cell(tenant_body, tenant, target_name,
                                                      max_running, region, like)
            outcome = Refused(RefusalReason.NOT_READY,
                              f"creating dedicated cell {target_name} in {region} for tenant "
                              f"{spec.tenant}: the move starts once it is Ready")
        if isinstance(outcome, Refused):
            await self._refuse(body, outcome, source)
            return
        assert isinstance(outcome, Admitted) and stored is not None
        if (refused := await self._target_refuses_urls(tenant, outcome.target)) is not None:
            await self._refuse(body, refused, source)
            return
        await self._ctx.ensure_finalizer(TENANTMOVES, body, MOVE_FINALIZER)
        await self._report(body, MoveReport(
            MovePhase.COPYING, "Admitted",
            f"copying tenant {spec.tenant} from cell {source} to cell {outcome.target} "
            f"while it keeps serving", source, outcome.target,
            {"rowsCopied": 0, "currentDelta": 0}))
        await self._ctx.event(body, "Normal", "Started",
                              f"moving tenant {spec.tenant} from cell {source} to cell "
                              f"{outcome.target} (write pause budget "
                              f"{spec.max_write_pause_seconds:g}s)")

    async def _target_refuses_urls(self, tenant: TenantSettings, target: str) -> Refused | None:
        """The target cell's own URL policy, asked before anything is copied: a cell that
        allows no private addresses must not receive a tenant whose targets or webhooks
        are private (it would refuse their rows mid-copy anyway)."""
        if not tenant.targets and not tenant.webhooks:
            return None
        end = await self._cell_end(target)
        return refused_urls(target, await self._ctx.cells.refused_endpoints(
            end.admin, end.token, tenant.targets, [url for url, _ in tenant.webhooks]))

    def _region_of(self, cell: str | None) -> str | None:
        body = body_of(self._ctx.cache.cells.get(cell or ""))
        region = ((body or {}).get("spec") or {}).get("region")
        return str(region) if region else None

    async def _retire_dedicated_source(self, body: dict[str, Any]) -> None:
        """After a dedicated tenant's move: its old cell, which holds only the retained
        copy, is deleted once ``retainSourceForSeconds`` has passed since completion."""
        status = body.get("status") or {}
        source = str(status.get("sourceCell") or "")
        cell = body_of(self._ctx.cache.cells.get(source))
        meta = body["metadata"]
        tenant = _spec(body).get("tenant")
        if cell is None or dedicated_to(cell) != (meta["namespace"], tenant):
            return
        completed = find_condition(status, "Completed")
        if completed is None or completed.get("status") != "True":
            return
        done_at = datetime.datetime.fromisoformat(
            str(completed["lastTransitionTime"]).replace("Z", "+00:00"))
        retain = int(_spec(body).get("retainSourceForSeconds", 86400))
        retention = source_retention(completed_at=done_at, retain_seconds=retain,
                                     now=self._ctx.clock.now())
        if isinstance(retention, KeepSource):
            wake = self._wakes.setdefault(TenantKey(meta["namespace"], meta["name"]),
                                          asyncio.Event())
            await _wait(wake, retention.wait_seconds)
            return
        if await self._tenants.delete_unused_cell(source):
            await self._ctx.event(body, "Normal", "SourceCellDeleted",
                                  f"deleted the tenant's old dedicated cell {source}: its "
                                  f"retention of {retain}s has passed")

    def _pick_in_region(self, tenant: TenantSettings, region: str, source: str | None,
                        candidates: list[CellCandidate]) -> str:
        """spec.targetRegion: the cell placement would choose there, the source excluded."""
        outcome = place(PlacementRequest(
            namespace=tenant.namespace, name=tenant.name, isolation=tenant.isolation,
            home_region=Region(region), region_policy=RegionPolicy.SINGLE_REGION,
            max_running=tenant.quotas().max_running, pinned_cell=None),
            [c for c in candidates if c.name != source])
        if isinstance(outcome, (Unplaceable, WaitForCell)):
            return f"(no cell in {region} fits: {outcome.message})"
        return str(outcome.cell)

    def _other_moves(self, key: TenantKey, body: dict[str, Any], tenant: str) -> tuple[str, ...]:
        """Moves of the same tenant that went first (``domain/moves.moves_ahead``)."""
        others = [_queued(other_key.name, other)
                  for other_key, other in ((k, m.body) for k, m in self._ctx.cache.moves.items())
                  if other_key != key and other_key.namespace == key.namespace
                  and _spec(other).get("tenant") == tenant]
        return moves_ahead(_queued(key.name, body), others)

    async def _refuse(self, body: dict[str, Any], refusal: Refused, source: str | None) -> None:
        """Nothing is started. A refusal that may pass later keeps the move Pending and
        asks again every few seconds, up to the progress deadline; then, or at once for a
        refusal nothing lifts, the move fails with it. One Event per new reason or phase,
        not per asking."""
        reason = refusal.reason
        before = find_condition(body.get("status"), "Accepted") or {}
        before_phase = (body.get("status") or {}).get("phase")
        deadline = self._ctx.settings.move_progress_deadline_seconds
        phase = waiting_refusal_phase(reason, waited_seconds=self._age(body),
                                      deadline_seconds=deadline)
        message = refusal.message
        if reason.waits:
            message += ("; the move waits and tries again, for at most "
                        f"{deadline:g}s from its creation" if phase is MovePhase.PENDING else
                        f"; it did not pass within {deadline:g}s, the move's progress deadline:"
                        " the move fails")
        if phase is MovePhase.FAILED:
            # A dedicated cell made for this move holds nothing: it goes with the move.
            await self._end(body, _Run(), None, phase, reason.value, message, refused=True)
            return
        await self._report(body, MoveReport(phase, reason.value, message, source,
                                            _spec(body).get("targetCell"), refused=True))
        if before.get("reason") != reason.value or before_phase != phase.value:
            await self._ctx.event(body, "Warning", reason.value, message)
        if reason.waits:
            meta = body["metadata"]
            await _wait(self._wakes.setdefault(TenantKey(meta["namespace"], meta["name"]),
                                               asyncio.Event()), _ADMISSION_RETRY_SECONDS)

    def _age(self, body: dict[str, Any]) -> float:
        """Seconds since the TenantMove was created (the apiserver's clock, read on ours:
        a skew only moves the progress deadline by as much)."""
        created = body["metadata"].get("creationTimestamp")
        if not created:
            return 0.0
        return (self._ctx.clock.now() - datetime.datetime.fromisoformat(
            str(created).replace("Z", "+00:00"))).total_seconds()

    async def _cell_gone(self, cell: str) -> bool:
        """Is the Cell deleted or being deleted? The watch's copy says no at once; a yes is
        asked of the apiserver, as a new leader's watch may not have delivered it yet."""
        found = body_of(self._ctx.cache.cells.get(cell))
        if found is None or found["metadata"].get("deletionTimestamp"):
            found = await self._ctx.kube.get(CELLS, cell)
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    async def _end(self, body: dict[str, Any], run: _Run, tenant_id: str | None,
                   phase: MovePhase, reason: str, message: str, *, refused: bool = False,
                   progress: dict[str, Any] | None = None) -> None:
        """Ends a move before its cutover: Aborted or Failed, after letting go of all it
        holds (the target's copy, the source's capture, a dedicated cell made for it).
        It ends even when a cell does not answer; what is left is named."""
        status = body.get("status") or {}
        source, target = status.get("sourceCell"), status.get("targetCell")
        if run.copy is not None:
            tenant_id = run.copy.tenant_id
        left = [] if tenant_id is None or target is None else await self._release(
            body, str(tenant_id), str(source), str(target))
        made = await self._delete_cell_made_for(body)
        if made:
            message += f"; the dedicated cell {made} made for the move is deleted"
        if left:
            message += "; not released: " + "; ".join(left)
        await self._report(body, MoveReport(phase, reason, message, source, target,
                                            progress or status.get("progress"), refused=refused))
        await self._ctx.event(body, "Normal" if phase is MovePhase.ABORTED else "Warning",
                              reason, message)
        if left:
            await self._ctx.event(body, "Warning", "NotReleased", "; ".join(left))
        if body["metadata"].get("deletionTimestamp"):
            await self._ctx.drop_finalizer(TENANTMOVES, body, MOVE_FINALIZER)

    async def _release(self, body: dict[str, Any], tenant_id: str, source: str,
                       target: str) -> list[str]:
        """The target's copy removed, the source's capture (and a freeze of this move)
        undone; a cell that is gone holds nothing. A cell that does not answer is asked
        again for up to ``_RELEASE_SECONDS``; what it still holds then is returned."""
        move_id = body["metadata"]["uid"]
        cells = self._ctx.cells
        sides = {target: ("the target's copy", cells.cancel_move_in),
                 source: ("the source's change capture", cells.cancel_move_out)}
        left: dict[str, str] = {}
        give_up_at = self._ctx.clock.monotonic() + _RELEASE_SECONDS
        for cell, (what, cancel) in sides.items():
            while True:
                try:
                    if await self._cell_gone(cell):
                        left.pop(cell, None)
                        break
                    end = await self._cell_end(cell)
                    await asyncio.wait_for(cancel(end.admin, end.token, tenant_id, move_id),
                                           _CELL_CALL_SECONDS)
                    left.pop(cell, None)
                    break
                except (CellplaneError, asyncio.TimeoutError) as error:
                    left[cell] = f"{what} in cell {cell} ({error or 'no answer'})"
                    if self._ctx.clock.monotonic() >= give_up_at:
                        break
                    await asyncio.sleep(1.0)
        return list(left.values())

    async def _delete_cell_made_for(self, body: dict[str, Any]) -> str | None:
        """Deletes the tenant's dedicated cell this move made (its name ends in the move's
        uid, see ``_admit``) if it holds no tenant; its name, if a deletion was asked."""
        meta = body["metadata"]
        owner = (meta["namespace"], _spec(body).get("tenant"))
        for name, cell in [(n, c.body) for n, c in self._ctx.cache.cells.items()]:
            if made_for_move(name, str(meta["uid"])) and dedicated_to(cell) == owner \
                    and await self._tenants.delete_unused_cell(name):
                return name
        return None

    async def _stuck(self, key: TenantKey, run: _Run, error: BaseException) -> bool:
        """A step failed. The move says so (never silently), and gives up at its progress
        deadline if it is still before its cutover. True once the move has ended."""
        try:
            now = self._ctx.clock.monotonic()
            if run.failing_since is None:
                run.failing_since = now
            body = body_of(self._ctx.cache.moves.get(key))
            status = (body or {}).get("status") or {}
            phase = MovePhase(status.get("phase") or MovePhase.PENDING.value)
            if body is None or phase is MovePhase.PENDING or phase in TERMINAL_PHASES:
                return False
            deadline = self._ctx.settings.move_progress_deadline_seconds
            failing = now - run.failing_since
            source, target = status.get("sourceCell"), status.get("targetCell")
            if not gives_up(phase, failing_seconds=failing, deadline_seconds=deadline):
                await self._report(body, MoveReport(
                    phase, "Retrying", f"{error}; retrying (the move fails if no step passes "
                    f"for {deadline:g}s)" if may_abort(phase) else f"{error}; retrying",
                    source, target, status.get("progress"), cell_epochs=run.epochs))
                return False
            stored = self._tenants.record(TenantKey(key.namespace,
                                                    str(_spec(body).get("tenant"))))
            await self._end(body, run, None if stored is None else stored.record.tenant_id,
                            MovePhase.FAILED, "ProgressDeadlineExceeded",
                            f"no step passed for {failing:.0f}s (the progress deadline is "
                            f"{deadline:g}s): {error}; the tenant stays in cell {source}")
            return True
        except Exception:
            log.exception("move %s: could not report its failing step", key)
            return False

    async def _open_copy(self, body: dict[str, Any], stored: Stored, source: str, target: str,
                         run: _Run) -> TenantCopy:
        run.copy = TenantCopy(
            self._ctx.cells, tenant_id=stored.record.tenant_id, move_id=body["metadata"]["uid"],
            source=await self._cell_end(source), target=await self._cell_end(target),
            target_epoch=target_epoch(_record_view(stored), source=source), clock=self._ctx.clock)
        return run.copy

    async def _cell_end(self, cell: str) -> CellEnd:
        body = body_of(self._ctx.cache.cells.get(cell))
        status = (body or {}).get("status") or {}
        admin = (status.get("endpoints") or {}).get("admin")
        if body is None or status.get("phase") not in SERVING_PHASES or not admin:
            raise CellplaneError(f"cell {cell} does not serve now "
                                 f"({status.get('phase') or 'no status'}); the move waits for it")
        return CellEnd(cell, str(admin), await self._ctx.cell_admin_token(cell))

    async def _copy(self, body: dict[str, Any], copy: TenantCopy, run: _Run) -> None:
        if run.epochs is not None:
            # A copy interrupted by a restart: whatever the cells did meanwhile, a
            # takeover would have left the target rows the source no longer has.
            self._check_takeover(copy, run)
        run.epochs = self._cell_epochs(copy)
        totals = await copy.start()
        run.totals, run.copied = totals, {table: 0 for table in TABLES}
        started, copied = self._ctx.clock.monotonic(), 0
        for table in TABLES:
            async def on_page(rows: int, table: str = table) -> None:
                assert run.copied is not None
                run.copied[table] += rows
                await self._progress(body, run, copy, MovePhase.COPYING, "Copying",
                                     f"copying the tenant's rows: {table}")
                self._check_abort(body)

            copied += await copy.copy_table(table, on_page)
            failpoint("move-copying", body["metadata"]["name"])
        elapsed = max(self._ctx.clock.monotonic() - started, 1e-3)
        run.rows_per_second = copied / elapsed
        await self._progress(body, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                             f"copied {copied} rows at {run.rows_per_second:.0f} rows/s; "
                             "copying the changes made since", force=True)

    async def _catch_up(self, body: dict[str, Any], key: TenantKey, copy: TenantCopy, run: _Run,
                        spec: v1alpha1.TenantMoveSpec) -> bool:
        """Delta rounds until the next one fits the pause budget; True when it does.

        Not for ever: a move whose cutover never fits (the fixed part over the budget,
        or changes made faster than they are copied) fails at the progress deadline
        with why, rather than hold its tenant and the capture's cost for good."""
        await self._time_checksums(copy, run)
        if run.epochs is None:
            run.epochs = self._cell_epochs(copy)
        if run.catching_up_since is None:
            run.catching_up_since = self._ctx.clock.monotonic()
        deadline = self._ctx.settings.move_progress_deadline_seconds
        while True:
            self._check_abort(body)
            self._check_takeover(copy, run)
            round_ = await copy.catch_up()
            run.rows_per_second = copy_rate(run.rows_per_second, rows=round_.rows,
                                            seconds=round_.seconds)
            failpoint("move-catching-up", body["metadata"]["name"])
            fixed = _FIXED_PAUSE_FLOOR_SECONDS + run.check_seconds
            budget = spec.max_write_pause_seconds
            after = after_catch_up_round(CatchUpRound(
                pending=round_.pending, rows_per_second=run.rows_per_second,
                fixed_pause_seconds=fixed, max_pause_seconds=budget,
                catching_up_seconds=self._ctx.clock.monotonic() - run.catching_up_since,
                deadline_seconds=deadline), source_cell=copy.source.cell)
            if isinstance(after, NeverFits):
                raise _CannotCutOver(after.reason, after.message)
            if isinstance(after, OverBudget):
                await self._say_over_budget(body, run, copy, fixed, budget, round_.pending)
                await self._time_checksums(copy, run)
            else:
                await self._progress(body, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                                     f"{round_.pending} changes left to copy",
                                     delta=round_.pending)
                if isinstance(after, CutOver):
                    return True
            if round_.rows == 0:
                await asyncio.sleep(0.2)
            body = body_of(self._ctx.cache.moves.get(key)) or body
            with contextlib.suppress(ValidationError):
                # A budget raised meanwhile counts at once (the spec's other fields are
                # immutable).
                spec = v1alpha1.TenantMoveSpec.model_validate(_spec(body))

    async def _time_checksums(self, copy: TenantCopy, run: _Run) -> None:
        """Times the verification's checksums on live data: inside the pause they are its
        largest fixed part. The fastest timing counts, so that one taken under a passing
        load does not hold a move back for good; timed again at most every few seconds."""
        now = self._ctx.clock.monotonic()
        if run.checks_timed_at is not None and now - run.checks_timed_at < _RETIME_CHECKSUMS_SECONDS:
            return
        await copy.checksums()
        took = self._ctx.clock.monotonic() - now
        run.check_seconds = checksum_seconds(
            None if run.checks_timed_at is None else run.check_seconds, took)
        run.checks_timed_at = self._ctx.clock.monotonic()

    async def _say_over_budget(self, body: dict[str, Any], run: _Run, copy: TenantCopy,
                               fixed: float, budget: float, pending: int) -> None:
        message = (f"{pending} changes left to copy, but the pause's fixed part ({fixed:.2f}s: "
                   f"freezing, switching, and verifying checksums that take "
                   f"{run.check_seconds:.2f}s) is over half the {budget:g}s write-pause budget; "
                   "the move waits for it to fit (checksums are timed again every "
                   f"{_RETIME_CHECKSUMS_SECONDS:g}s) or for a larger spec.maxWritePauseSeconds")
        await self._progress(body, run, copy, MovePhase.CATCHING_UP, "PauseOverBudget", message,
                             delta=pending)
        if not run.said_over_budget:
            run.said_over_budget = True
            await self._ctx.event(body, "Warning", "PauseOverBudget", message)

    async def _cut_over(self, body: dict[str, Any], tenant_key: TenantKey, copy: TenantCopy,
                        run: _Run, spec: v1alpha1.TenantMoveSpec) -> None:
        """The write pause, bounded by construction: it carries a deadline, and every step
        before the commit must end by it (the freeze's own lock wait is bounded in the
        source database too). A step that cannot gives the writes back: the source serves
        again under epoch N, and the move catches up and tries again, or fails."""
        name = body["metadata"]["name"]
        source, target = copy.source.cell, copy.target.cell
        stored = self._tenants.record(tenant_key)
        if stored is None or stored.record.cell != source:
            raise CellplaneError(f"the placement record of {tenant_key} moved away from {source}")
        epoch = stored.record.epoch
        self._check_takeover(copy, run)
        await self._progress(body, run, copy, MovePhase.CUTTING_OVER, "CuttingOver",
                             "holding the tenant's requests, freezing it in the source, "
                             "copying its last changes", force=True)
        loop = asyncio.get_running_loop()
        budget = spec.max_write_pause_seconds
        paused = loop.time()
        stored = await self._tenants.replace_record(tenant_key, stored,
                                                    replace(stored.record, moving=True))
        marked = loop.time() - paused
        # Until the freeze is timed, the mark's write stands in for a cell call.
        clock = CutoverClock(paused, budget, record_write_seconds=marked, cell_call_seconds=marked)
        freezing = loop.time()
        freeze = asyncio.create_task(copy.freeze_source(max(clock.left(freezing), 0.0)))
        reported: asyncio.Task[None] | None = None
        try:
            # The freeze is shielded: given up on, its answer is still awaited later, as
            # the source may apply it after its unfreeze (_settle_late_freeze).
            await asyncio.wait_for(asyncio.shield(freeze), max(clock.left(freezing), 0.0))
            clock = replace(clock, cell_call_seconds=loop.time() - freezing)
            failpoint("move-after-freeze", name)
            async with asyncio.timeout_at(clock.commit_by):
                await asyncio.sleep(delay("move-slow-delta", name))
                last = await copy.drain()
                checked = loop.time()
                # Reported beside the checksums, and awaited only after the pause: a status
                # write is no part of it.
                reported = asyncio.create_task(self._progress(
                    body, run, copy, MovePhase.VERIFYING, "Verifying",
                    f"comparing row counts and checksums of cells {source} and {target}",
                    force=True))
                sums = await copy.checksums()
                verified_in = loop.time() - checked
        except TimeoutError:
            step = ("freezing the source" if not freeze.done()
                    else "verifying" if reported is not None else "copying the last changes")
            await self._give_back(body, tenant_key, stored, copy, run, spec, epoch=epoch,
                                  paused_at=paused, freeze=freeze, reported=reported,
                                  step=step, clock=clock)
            return
        except CellApiError as error:
            if error.status == 503 and "freeze_timeout" in str(error):
                # The source's database itself gave the freeze up at the deadline.
                await self._give_back(body, tenant_key, stored, copy, run, spec, epoch=epoch,
                                      paused_at=paused, freeze=freeze, reported=reported,
                                      step="freezing the source", clock=clock)
                return
            # Any other failure gives the writes back at once, not after a retry's backoff.
            await self._undo_cutover(body, tenant_key, stored, copy, epoch=epoch)
            await _settled(reported)
            raise
        failpoint("move-verifying", name)
        differing = differing_tables(*sums)
        if differing:
            await self._undo_cutover(body, tenant_key, stored, copy, epoch=epoch)
            await _settled(reported)
            await copy.discard()
            message = ("verification failed, the tenant stays in cell "
                       f"{source}: {'; '.join(differing)}")
            await self._report(body, MoveReport(MovePhase.FAILED, "VerificationFailed", message,
                                                source, target, self._progress_body(run, copy)))
            await self._ctx.event(body, "Warning", "VerificationFailed", message)
            raise _Ended
        if loop.time() > clock.commit_by:
            # Done, but too late to commit and still end the pause within its budget.
            await self._give_back(body, tenant_key, stored, copy, run, spec, epoch=epoch,
                                  paused_at=paused, freeze=freeze, reported=reported,
                                  step="verifying", clock=clock)
            return
        stored = await self._tenants.replace_record(
            tenant_key, stored, replace(stored.record, cell=target, epoch=epoch + 1))
        failpoint("move-after-commit", name)
        await self._roll_forward(body, tenant_key, stored, copy, spec,
                                 pause_seconds=None, paused_at=paused, last_delta=last,
                                 check_seconds=verified_in, run=run, reported=reported)
        raise _Ended

    async def _give_back(self, body: dict[str, Any], tenant_key: TenantKey, stored: Stored,
                         copy: TenantCopy, run: _Run, spec: v1alpha1.TenantMoveSpec, *,
                         epoch: int, paused_at: float, freeze: asyncio.Task[None],
                         reported: asyncio.Task[None] | None, step: str,
                         clock: CutoverClock) -> None:
        """A cutover that cannot commit within its budget: the source serves again under
        epoch N and the hold ends, inside the budget (the deadline kept a reserve for
        this); then the move catches up to try again, or fails after a few tries."""
        loop = asyncio.get_running_loop()
        await self._undo_cutover(body, tenant_key, stored, copy, epoch=epoch)
        paused = loop.time() - paused_at
        move_paused(paused)
        if not freeze.done():
            run.late_freeze = (freeze, copy, epoch)
        await _settled(reported)
        run.overruns += 1
        budget = spec.max_write_pause_seconds
        message = (f"cutover {run.overruns} of at most {MAX_CUTOVER_ATTEMPTS} could not commit "
                   f"within the {budget:g}s write-pause budget ({step} was still under way at "
                   f"its deadline, {clock.commit_by - paused_at:.3f}s into the pause); writes "
                   f"were paused {paused:.3f}s and given back: the tenant serves from cell "
                   f"{copy.source.cell} under epoch {epoch}")
        progress = self._progress_body(run, copy)
        progress["pauseSeconds"] = round(paused, 4)
        if after_overrun(run.overruns) is Overrun.FAIL:
            # Releasing cancels the capture, which a freeze landing late then finds gone.
            await self._end(body, run, copy.tenant_id, MovePhase.FAILED, "PauseBudgetExceeded",
                            message + "; the move fails", progress=progress)
            raise _Ended
        await self._report(body, MoveReport(MovePhase.CATCHING_UP, "CutoverOverBudget",
                                            message + "; catching up to try again",
                                            copy.source.cell, copy.target.cell, progress,
                                            cell_epochs=run.epochs))
        await self._ctx.event(body, "Warning", "CutoverOverBudget", message)
        meta = body["metadata"]
        await _wait(self._wakes.setdefault(TenantKey(meta["namespace"], meta["name"]),
                                           asyncio.Event()), min(2.0 ** run.overruns, 10.0))

    async def _settle_late_freeze(self, run: _Run) -> None:
        """A freeze given up on at the cutover's deadline may land in the source after the
        unfreeze that gave the writes back (its lock wait there is bounded by the same
        deadline): once it has answered, the source is unfrozen again."""
        if run.late_freeze is None:
            return
        freeze, copy, epoch = run.late_freeze
        with contextlib.suppress(Exception):
            await freeze
        await copy.unfreeze_source(epoch)
        run.late_freeze = None

    async def _roll_forward(self, body: dict[str, Any], tenant_key: TenantKey, stored: Stored,
                            copy: TenantCopy, spec: v1alpha1.TenantMoveSpec, *,
                            pause_seconds: float | None, paused_at: float | None = None,
                            last_delta: int | None = None, check_seconds: float | None = None,
                            run: _Run | None = None,
                            reported: asyncio.Task[None] | None = None) -> None:
        """After the commit: start the tenant in the target, release the hold, retire the source."""
        await copy.activate_target()
        if stored.record.moving:
            stored = await self._tenants.replace_record(tenant_key, stored,
                                                        replace(stored.record, moving=False))
        if paused_at is not None:
            pause_seconds = asyncio.get_running_loop().time() - paused_at
            move_paused(pause_seconds)
        await _settled(reported)
        await copy.finish_source(spec.retain_source_for_seconds)
        progress = self._progress_body(run, copy) if run is not None else dict(
            (body.get("status") or {}).get("progress") or {})
        progress["currentDelta"] = 0
        detail = ""
        if pause_seconds is not None:
            progress["pauseSeconds"] = round(pause_seconds, 4)
            detail = (f"; writes paused {pause_seconds:.3f}s (budget "
                      f"{spec.max_write_pause_seconds:g}s, last delta {last_delta} rows, "
                      f"verification {check_seconds or 0:.3f}s)")
        message = (f"tenant {spec.tenant} serves from cell {copy.target.cell} under epoch "
                   f"{stored.record.epoch}{detail}; cell {copy.source.cell} keeps its old rows, "
                   f"read-only, for {spec.retain_source_for_seconds}s")
        await self._report(body, MoveReport(MovePhase.COMPLETED, "Completed", message,
                                            copy.source.cell, copy.target.cell, progress))
        await self._ctx.event(body, "Normal", "Completed", message)
        await self._tenants.refresh(tenant_key)

    async def _undo_cutover(self, body: dict[str, Any], tenant_key: TenantKey, stored: Stored,
                            copy: TenantCopy, *, epoch: int | None = None) -> None:
        """Before the commit: the source serves again and the router stops holding."""
        await copy.unfreeze_source(stored.record.epoch if epoch is None else epoch)
        if stored.record.moving:
            await self._tenants.replace_record(tenant_key, stored,
                                               replace(stored.record, moving=False))

    def _cell_epochs(self, copy: TenantCopy) -> tuple[int, int]:
        def epoch(cell: str) -> int:
            status = (body_of(self._ctx.cache.cells.get(cell)) or {}).get("status") or {}
            return int(status.get("epoch") or 0)
        return epoch(copy.source.cell), epoch(copy.target.cell)

    def _check_takeover(self, copy: TenantCopy, run: _Run) -> None:
        if run.epochs is None:
            return
        changed = changed_primary((copy.source.cell, copy.target.cell), run.epochs,
                                  self._cell_epochs(copy))
        if changed is not None:
            raise _CellTookOver(changed.message)

    async def _copy_again(self, body: dict[str, Any], run: _Run, why: str) -> None:
        """Both ends forget this copy; the next step copies from the start."""
        assert run.copy is not None
        copy, run.copy, run.epochs = run.copy, None, None
        run.check_seconds, run.checks_timed_at = 0.0, None
        log.warning("move %s: %s; copying again", body["metadata"]["name"], why)
        # The new primary may take a few seconds to serve. A target copy that cannot be
        # dropped within the minute stays, and the verification finds what it holds extra.
        for _ in range(60):
            try:
                copy = copy.through(await self._cell_end(copy.source.cell),
                                    await self._cell_end(copy.target.cell))
                await copy.discard()
                break
            except CellplaneError as error:
                log.info("move %s: the old copy is not discarded yet (%s)",
                         body["metadata"]["name"], error)
                await asyncio.sleep(1.0)
        message = f"{why}: the copy starts again from the beginning"
        # The epochs the next copy begins under, recorded now: the status keeps the old
        # ones otherwise, and the next copy would see a takeover that is over.
        run.epochs = self._cell_epochs(copy)
        await self._report(body, MoveReport(MovePhase.COPYING, "CellTookOver", message,
                                            copy.source.cell, copy.target.cell,
                                            {"rowsCopied": 0, "currentDelta": 0},
                                            cell_epochs=run.epochs))
        await self._ctx.event(body, "Warning", "CellTookOver", message)

    def _check_abort(self, body: dict[str, Any]) -> None:
        """Between pages: an abort asked meanwhile ends the step so the next one aborts."""
        meta = body["metadata"]
        current = body_of(self._ctx.cache.moves.get(TenantKey(meta["namespace"], meta["name"])))
        if current is None or _spec(current).get("abort") or current["metadata"].get(
                "deletionTimestamp"):
            raise _AbortAsked

    def _tenant_deleting(self, key: TenantKey) -> bool:
        body = body_of(self._ctx.cache.tenants.get(key))
        return body is None or bool(body["metadata"].get("deletionTimestamp"))

    # -- reporting -------------------------------------------------------------------

    def _progress_body(self, run: _Run | None, copy: TenantCopy,
                       delta: int | None = None) -> dict[str, Any]:
        if run is None or run.totals is None or run.copied is None:
            return {"currentDelta": delta or 0}
        totals, copied = run.totals, run.copied
        return {
            "rowsCopied": sum(copied.values()),
            "rowsTotal": sum(totals.values()),
            "currentDelta": delta or 0,
            "tables": [{"table": t, "copied": copied.get(t, 0), "total": totals.get(t, 0)}
                       for t in TABLES if t in totals or copied.get(t)],
        }

    async def _progress(self, body: dict[str, Any], run: _Run, copy: TenantCopy,
                        phase: MovePhase, reason: str, message: str, *, delta: int | None = None,
                        force: bool = False) -> None:
        now = self._ctx.clock.monotonic()
        current_phase = (body.get("status") or {}).get("phase")
        if not force and current_phase == phase.value \
                and now - run.last_progress < _PROGRESS_EVERY_SECONDS:
            return
        run.last_progress = now
        await self._report(body, MoveReport(phase, reason, message, copy.source.cell,
                                            copy.target.cell, self._progress_body(run, copy, delta),
                                            cell_epochs=run.epochs))
        if current_phase != phase.value:
            await self._ctx.event(body, "Normal", phase.value, message)

    async def _report(self, body: dict[str, Any], report: MoveReport) -> None:
        current = body.get("status") or {}
        status = plan_move_status(report, generation=int(body["metadata"].get("generation", 0)),
                                  current_conditions=current.get("conditions") or [],
                                  now=self._ctx.clock.now())
        if all(current.get(k) == v for k, v in status.items()):
            return
        meta = body["metadata"]
        updated = await self._ctx.kube.patch(TENANTMOVES, meta["name"], {"status": status},
                                             namespace=meta["namespace"], subresource="status")
        move_phase_written(current.get("phase"), str(status["phase"]))
        # The next step reads the phase it just wrote, not the watch's older copy.
        body["status"] = updated.get("status", status)
        body["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]
        self._ctx.cache.moves[TenantKey(meta["namespace"], meta["name"])] = MoveObject.from_body(body)


def _record_view(stored: Stored) -> RecordView:
    return RecordView(stored.record.cell, stored.record.epoch, stored.record.moving)


def _queued(name: str, body: dict[str, Any]) -> QueuedMove:
    phase = (body.get("status") or {}).get("phase") or MovePhase.PENDING.value
    return QueuedMove(name, MovePhase(phase), str(body["metadata"].get("creationTimestamp") or ""))


def _spec(body: dict[str, Any]) -> dict[str, Any]:
    return dict(body.get("spec") or {})


async def _settled(task: asyncio.Task[None] | None) -> None:
    """Waits for a status write started beside the pause; its failure is only logged."""
    if task is not None:
        try:
            await task
        except Exception as error:
            log.warning("a move's status write beside the pause failed: %s", error)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
