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
the router sends the held requests to the target.

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
import time
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from cellplane_operator.api import v1alpha1
from cellplane_operator.domain.cells import SERVING_PHASES, Region, Tier
from cellplane_operator.domain.conditions import find_condition
from cellplane_operator.domain.move_status import MoveReport, plan_move_status
from cellplane_operator.domain.moves import (
    TERMINAL_PHASES, Admitted, MovePhase, MoveRequest, RecordView, RefusalReason, Refused, Resume,
    admit_move, differing_tables, fixed_pause_over_budget, may_abort, ready_to_cut_over, resume,
)
from cellplane_operator.domain.moves import refused_urls
from cellplane_operator.domain.placement import (
    CellCandidate, PlacementRequest, RegionPolicy, Unplaceable, WaitForCell, dedicated_cell_name,
    place,
)
from cellplane_operator.errors import CellplaneError
from cellplane_operator.failpoints import failpoint
from cellplane_operator.kube import TENANTMOVES
from cellplane_operator.metrics import count_moves, move_paused, move_phase_written
from cellplane_operator.placement.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import Stored, TenantKey
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.movecopy import TABLES, CellEnd, TenantCopy
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


class _Ended(Exception):
    """The move reached a terminal phase (or its object is gone): stop driving it."""


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
    """time.monotonic() of the last timing of the checksums; None: not timed in this copy."""
    said_over_budget: bool = False
    totals: dict[str, int] | None = None
    copied: dict[str, int] | None = None
    last_progress: float = 0.0
    epochs: tuple[int, int] | None = None
    """The source's and the target's placement-group epochs when this copy began."""


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
                    for body in self._ctx.cache.moves.values())
        self._ended.discard(key)
        self._wakes.setdefault(key, asyncio.Event()).set()
        if self._leadership.leading:
            self._ensure_task(key)
            if tenant := _spec(self._ctx.cache.moves.get(key) or {}).get("tenant"):
                # The Tenant's Moving condition follows the move's phase.
                self._tenants.tenant_changed(TenantKey(key.namespace, str(tenant)))

    def tenant_changed(self, key: TenantKey) -> None:
        for move_key, body in list(self._ctx.cache.moves.items()):
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
            body = self._ctx.cache.moves.get(key)
            if body is None:
                return
            wake = self._wakes.setdefault(key, asyncio.Event())
            wake.clear()
            try:
                await self._step(key, body, run)
                backoff = 0.5
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
            except CellplaneError as error:
                log.warning("move %s: %s; again in %.1fs", key, error, backoff)
                run.copy = None
                await _wait(wake, backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            except Exception:
                log.exception("move %s failed a step; again in %.1fs", key, backoff)
                run.copy = None
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
            if deleting:
                await self._ctx.drop_finalizer(TENANTMOVES, body, MOVE_FINALIZER)
                raise _Ended
            await self._admit(key, body)
            return
        spec = v1alpha1.TenantMoveSpec.model_validate(body["spec"])
        tenant_key = TenantKey(key.namespace, spec.tenant)
        source, target = str(status["sourceCell"]), str(status["targetCell"])
        # etcd, not memory: a new leader's tenant controller may not have read it yet.
        stored = await self._tenants.refresh(tenant_key, reconcile=False)
        view = None if stored is None else RecordView(stored.record.cell, stored.record.epoch,
                                                      stored.record.moving)
        decision = resume(phase, view, source=source, target=target)
        if decision is Resume.LOST:
            await self._report(body, MoveReport(
                MovePhase.FAILED, "TenantRecordLost",
                f"the placement record of tenant {spec.tenant} no longer names cell {source}",
                source, target, status.get("progress")))
            raise _Ended
        assert stored is not None
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
        aborting = spec.abort or deleting or self._tenant_deleting(tenant_key)
        if aborting and may_abort(phase):
            await self._abort(body, copy, deleting=deleting,
                              why="spec.abort" if spec.abort else
                              "the TenantMove is being deleted" if deleting else
                              f"tenant {spec.tenant} is being deleted")
            raise _Ended
        if phase is MovePhase.COPYING:
            await self._copy(body, copy, run)
        elif phase is MovePhase.CATCHING_UP:
            if await self._catch_up(body, key, copy, run, spec):
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
        tenant_body = self._ctx.cache.tenants.get(tenant_key)
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
            target_name = spec.target_cell or (
                f"{dedicated_cell_name(tenant.namespace, tenant.name)[:54]}-"
                f"{body['metadata']['uid'][:8]}")
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
            like = (self._ctx.cache.cells.get(source or "") or {}).get("spec")
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
        body = self._ctx.cache.cells.get(cell or "")
        region = ((body or {}).get("spec") or {}).get("region")
        return str(region) if region else None

    async def _retire_dedicated_source(self, body: dict[str, Any]) -> None:
        """After a dedicated tenant's move: its old cell, which holds only the retained
        copy, is deleted once ``retainSourceForSeconds`` has passed since completion."""
        status = body.get("status") or {}
        source = str(status.get("sourceCell") or "")
        cell = self._ctx.cache.cells.get(source)
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
        remaining = (done_at + datetime.timedelta(seconds=retain) - self._ctx.clock.now()
                     ).total_seconds()
        if remaining > 0:
            wake = self._wakes.setdefault(TenantKey(meta["namespace"], meta["name"]),
                                          asyncio.Event())
            await _wait(wake, min(remaining, 3600.0))
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
        """Moves of the same tenant that went first: admitted ones, or older pending ones."""
        mine = (body["metadata"].get("creationTimestamp") or "", key.name)
        others: list[str] = []
        for other_key, other in self._ctx.cache.moves.items():
            if other_key == key or other_key.namespace != key.namespace \
                    or _spec(other).get("tenant") != tenant:
                continue
            phase = (other.get("status") or {}).get("phase") or MovePhase.PENDING.value
            if MovePhase(phase) in TERMINAL_PHASES:
                continue
            theirs = (other["metadata"].get("creationTimestamp") or "", other_key.name)
            if phase != MovePhase.PENDING.value or theirs < mine:
                others.append(other_key.name)
        return tuple(others)

    async def _refuse(self, body: dict[str, Any], refusal: Refused, source: str | None) -> None:
        """Nothing is started. A refusal that may pass later keeps the move Pending and
        asks again every few seconds; one Event per new reason, not per asking."""
        reason = refusal.reason
        before = find_condition(body.get("status"), "Accepted") or {}
        message = refusal.message + ("; the move waits and tries again" if reason.waits else "")
        await self._report(body, MoveReport(MovePhase.PENDING if reason.waits else MovePhase.FAILED,
                                            reason.value, message, source,
                                            _spec(body).get("targetCell"), refused=True))
        if before.get("reason") != reason.value:
            await self._ctx.event(body, "Warning", reason.value, message)
        if reason.waits:
            meta = body["metadata"]
            await _wait(self._wakes.setdefault(TenantKey(meta["namespace"], meta["name"]),
                                               asyncio.Event()), _ADMISSION_RETRY_SECONDS)

    async def _open_copy(self, body: dict[str, Any], stored: Stored, source: str, target: str,
                         run: _Run) -> TenantCopy:
        run.copy = TenantCopy(
            self._ctx.cells, tenant_id=stored.record.tenant_id, move_id=body["metadata"]["uid"],
            source=await self._cell_end(source), target=await self._cell_end(target),
            target_epoch=(stored.record.epoch + 1 if stored.record.cell == source
                          else stored.record.epoch))
        return run.copy

    async def _cell_end(self, cell: str) -> CellEnd:
        body = self._ctx.cache.cells.get(cell)
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
        started, copied = time.monotonic(), 0
        for table in TABLES:
            async def on_page(rows: int, table: str = table) -> None:
                assert run.copied is not None
                run.copied[table] += rows
                await self._progress(body, run, copy, MovePhase.COPYING, "Copying",
                                     f"copying the tenant's rows: {table}")
                self._check_abort(body)

            copied += await copy.copy_table(table, on_page)
            failpoint("move-copying", body["metadata"]["name"])
        elapsed = max(time.monotonic() - started, 1e-3)
        run.rows_per_second = copied / elapsed
        await self._progress(body, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                             f"copied {copied} rows at {run.rows_per_second:.0f} rows/s; "
                             "copying the changes made since", force=True)

    async def _catch_up(self, body: dict[str, Any], key: TenantKey, copy: TenantCopy, run: _Run,
                        spec: v1alpha1.TenantMoveSpec) -> bool:
        """Delta rounds until the next one fits the pause budget; True when it does."""
        await self._time_checksums(copy, run)
        if run.epochs is None:
            run.epochs = self._cell_epochs(copy)
        while True:
            self._check_abort(body)
            self._check_takeover(copy, run)
            round_ = await copy.catch_up()
            if round_.rows >= 500:
                measured = round_.rows / max(round_.seconds, 1e-3)
                run.rows_per_second = (measured if run.rows_per_second == 0.0
                                       else 0.5 * run.rows_per_second + 0.5 * measured)
            failpoint("move-catching-up", body["metadata"]["name"])
            fixed = _FIXED_PAUSE_FLOOR_SECONDS + run.check_seconds
            budget = spec.max_write_pause_seconds
            if fixed_pause_over_budget(fixed_pause_seconds=fixed, max_pause_seconds=budget):
                await self._say_over_budget(body, run, copy, fixed, budget, round_.pending)
                await self._time_checksums(copy, run)
            else:
                await self._progress(body, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                                     f"{round_.pending} changes left to copy",
                                     delta=round_.pending)
                if ready_to_cut_over(delta_rows=round_.pending,
                                     rows_per_second=run.rows_per_second,
                                     max_pause_seconds=budget, fixed_pause_seconds=fixed):
                    return True
            if round_.rows == 0:
                await asyncio.sleep(0.2)
            body = self._ctx.cache.moves.get(key) or body
            with contextlib.suppress(ValidationError):
                # A budget raised meanwhile counts at once (the spec's other fields are
                # immutable).
                spec = v1alpha1.TenantMoveSpec.model_validate(_spec(body))

    async def _time_checksums(self, copy: TenantCopy, run: _Run) -> None:
        """Times the verification's checksums on live data: inside the pause they are its
        largest fixed part. The fastest timing counts, so that one taken under a passing
        load does not hold a move back for good; timed again at most every few seconds."""
        now = time.monotonic()
        if run.checks_timed_at is not None and now - run.checks_timed_at < _RETIME_CHECKSUMS_SECONDS:
            return
        await copy.checksums()
        took = time.monotonic() - now
        first = run.checks_timed_at is None
        run.check_seconds = took if first else min(run.check_seconds, took)
        run.checks_timed_at = time.monotonic()

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
        paused = time.monotonic()
        stored = await self._tenants.replace_record(tenant_key, stored,
                                                    replace(stored.record, moving=True))
        await copy.freeze_source()
        failpoint("move-after-freeze", name)
        last = await copy.drain()
        checked = time.monotonic()
        # Reported beside the checksums, not before them: a status write is no part
        # of the pause.
        reported = asyncio.create_task(self._progress(
            body, run, copy, MovePhase.VERIFYING, "Verifying",
            f"comparing row counts and checksums of cells {source} and {target}", force=True))
        try:
            sums = await copy.checksums()
        finally:
            await asyncio.gather(reported, return_exceptions=True)
        verified_in = time.monotonic() - checked
        failpoint("move-verifying", name)
        differing = differing_tables(*sums)
        if differing:
            await self._undo_cutover(body, tenant_key, stored, copy, epoch=epoch)
            await copy.discard()
            message = ("verification failed, the tenant stays in cell "
                       f"{source}: {'; '.join(differing)}")
            await self._report(body, MoveReport(MovePhase.FAILED, "VerificationFailed", message,
                                                source, target, self._progress_body(run, copy)))
            await self._ctx.event(body, "Warning", "VerificationFailed", message)
            raise _Ended
        stored = await self._tenants.replace_record(
            tenant_key, stored, replace(stored.record, cell=target, epoch=epoch + 1))
        failpoint("move-after-commit", name)
        await self._roll_forward(body, tenant_key, stored, copy, spec,
                                 pause_seconds=None, paused_at=paused, last_delta=last,
                                 check_seconds=verified_in, run=run)
        raise _Ended

    async def _roll_forward(self, body: dict[str, Any], tenant_key: TenantKey, stored: Stored,
                            copy: TenantCopy, spec: v1alpha1.TenantMoveSpec, *,
                            pause_seconds: float | None, paused_at: float | None = None,
                            last_delta: int | None = None, check_seconds: float | None = None,
                            run: _Run | None = None) -> None:
        """After the commit: start the tenant in the target, release the hold, retire the source."""
        await copy.activate_target()
        if stored.record.moving:
            stored = await self._tenants.replace_record(tenant_key, stored,
                                                        replace(stored.record, moving=False))
        if paused_at is not None:
            pause_seconds = time.monotonic() - paused_at
            move_paused(pause_seconds)
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

    async def _abort(self, body: dict[str, Any], copy: TenantCopy, *, deleting: bool,
                     why: str) -> None:
        await copy.discard()
        message = (f"aborted ({why}): the target's partial copy was removed; the tenant stays "
                   f"in cell {copy.source.cell}, untouched")
        await self._report(body, MoveReport(MovePhase.ABORTED, "Aborted", message,
                                            copy.source.cell, copy.target.cell,
                                            (body.get("status") or {}).get("progress")))
        await self._ctx.event(body, "Normal", "Aborted", message)
        if deleting:
            await self._ctx.drop_finalizer(TENANTMOVES, body, MOVE_FINALIZER)

    def _cell_epochs(self, copy: TenantCopy) -> tuple[int, int]:
        def epoch(cell: str) -> int:
            status = (self._ctx.cache.cells.get(cell) or {}).get("status") or {}
            return int(status.get("epoch") or 0)
        return epoch(copy.source.cell), epoch(copy.target.cell)

    def _check_takeover(self, copy: TenantCopy, run: _Run) -> None:
        if run.epochs is None:
            return
        now = self._cell_epochs(copy)
        for cell, before, after in zip((copy.source.cell, copy.target.cell), run.epochs, now):
            if after != before:
                raise _CellTookOver(f"cell {cell} changed its primary (epoch {before} -> "
                                    f"{after}) during the copy")

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
        current = self._ctx.cache.moves.get(TenantKey(meta["namespace"], meta["name"]))
        if current is None or _spec(current).get("abort") or current["metadata"].get(
                "deletionTimestamp"):
            raise CellplaneError("an abort was asked; stopping the copy")

    def _tenant_deleting(self, key: TenantKey) -> bool:
        body = self._ctx.cache.tenants.get(key)
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
        now = time.monotonic()
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
        self._ctx.cache.moves[TenantKey(meta["namespace"], meta["name"])] = body


def _spec(body: dict[str, Any]) -> dict[str, Any]:
    return dict(body.get("spec") or {})


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
