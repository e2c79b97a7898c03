"""A Pending TenantMove: its target picked, the rules asked (``domain/moves.admit_move``),
and the move admitted into Copying, or refused.

A refusal the world may lift (the cell not ready or full, the tenant not placed)
keeps the move Pending and asks again every few seconds, up to the progress
deadline; one that nothing lifts fails the move at once. A dedicated tenant moves
into a cell of its own, made here for the move; the move starts once it is Ready.
"""

from __future__ import annotations

import datetime

from cellplane_operator.domain.cells import Region, Tier
from cellplane_operator.domain.dedicated import move_target_name
from cellplane_operator.domain.move_status import MoveReport
from cellplane_operator.domain.move_steps import Again, Ended, StepOutcome
from cellplane_operator.domain.moves import (
    Admitted, MovePhase, MoveRequest, QueuedMove, RefusalReason, Refused, admit_move,
    moves_ahead, refused_urls, waiting_refusal_phase,
)
from cellplane_operator.domain.placement import (
    CellCandidate, PlacementRequest, RegionPolicy, Unplaceable, WaitForCell, place,
)
from cellplane_operator.kube import TENANTMOVES
from cellplane_operator.placement.records import TenantKey
from cellplane_operator.runtime.movecontext import MOVE_FINALIZER, Move, MoveRun, MoveSupport
from cellplane_operator.runtime.moveending import MoveEnding
from cellplane_operator.runtime.objects import MoveObject
from cellplane_operator.runtime.specs import TenantSettings

__all__ = ["MoveAdmission"]

_ADMISSION_RETRY_SECONDS = 2.0


class MoveAdmission:
    def __init__(self, support: MoveSupport, ending: MoveEnding) -> None:
        self._support = support
        self._ctx = support.ctx
        self._ending = ending

    async def admit(self, move: Move) -> StepOutcome:
        spec = move.current.spec
        if spec is None:
            return await self._refuse(move, Refused(
                RefusalReason.NO_SUCH_CELL, f"invalid spec: {move.current.spec_problem}"), None)
        tenant_key = TenantKey(move.key.namespace, spec.tenant)
        tenant_object = self._ctx.cache.tenants.get(tenant_key)
        stored = self._support.tenants.record(tenant_key)
        if tenant_object is None:
            return await self._refuse(move, Refused(
                RefusalReason.NOT_PLACED, f"no Tenant {spec.tenant} in namespace "
                f"{move.key.namespace}"), None)
        tenant = TenantSettings.from_body(tenant_object.body)
        source = stored.record.cell if stored is not None else None
        candidates = self._support.tenants.candidates()
        dedicated = tenant.isolation is Tier.DEDICATED
        if dedicated:
            # A dedicated tenant moves into a cell of its own, made for the move.
            target_name = spec.target_cell or move_target_name(
                tenant.namespace, tenant.name, move.current.meta.uid)
        else:
            target_name = spec.target_cell or _pick_in_region(
                tenant, str(spec.target_region), source, candidates)
        max_running_jobs = tenant.quotas().max_running_jobs
        outcome = admit_move(MoveRequest(
            tenant=spec.tenant, isolation=tenant.isolation, source_cell=source,
            max_running_jobs=max_running_jobs,
            target=next((c for c in candidates if c.name == target_name), None),
            target_name=target_name, tenant_deleting=tenant_object.meta.deleting,
            other_moves=self._other_moves(move, spec.tenant)))
        if isinstance(outcome, Refused) and dedicated \
                and outcome.reason is RefusalReason.NO_SUCH_CELL:
            region = spec.target_region or self._region_of(source) or tenant.home_region
            like = self._ctx.cache.cells.get(source or "")
            await self._support.tenants.ensure_dedicated_cell(
                tenant_object.body, tenant, target_name, max_running_jobs, region,
                like.body.get("spec") if like is not None else None)
            outcome = Refused(RefusalReason.NOT_READY,
                              f"creating dedicated cell {target_name} in {region} for tenant "
                              f"{spec.tenant}: the move starts once it is Ready")
        if isinstance(outcome, Refused):
            return await self._refuse(move, outcome, source)
        assert isinstance(outcome, Admitted) and stored is not None
        if (refused := await self._target_refuses_urls(tenant, outcome.target)) is not None:
            return await self._refuse(move, refused, source)
        return await self._start(move, source, outcome.target)

    async def _start(self, move: Move, source: str | None, target: str) -> StepOutcome:
        spec = move.spec
        await self._ctx.ensure_finalizer(TENANTMOVES, move.body, MOVE_FINALIZER)
        await self._support.report(move, MoveReport(
            MovePhase.COPYING, "Admitted",
            f"copying tenant {spec.tenant} from cell {source} to cell {target} "
            f"while it keeps serving", source, target, {"rowsCopied": 0, "currentDelta": 0}))
        await self._support.event(move, "Normal", "Started",
                                  f"moving tenant {spec.tenant} from cell {source} to cell "
                                  f"{target} (write pause budget "
                                  f"{spec.max_write_pause_seconds:g}s)")
        return Again()

    async def _target_refuses_urls(self, tenant: TenantSettings, target: str) -> Refused | None:
        """The target cell's own URL policy, asked before anything is copied: a cell that
        allows no private addresses must not receive a tenant whose targets or webhooks
        are private (it would refuse their rows mid-copy anyway)."""
        if not tenant.targets and not tenant.webhooks:
            return None
        end = await self._support.cell_end(target)
        return refused_urls(target, await self._ctx.cells.refused_endpoints(
            end.admin, end.token, tenant.targets, [url for url, _ in tenant.webhooks]))

    def _region_of(self, cell: str | None) -> str | None:
        found = self._ctx.cache.cells.get(cell or "")
        region = found.spec.region if found is not None and found.spec is not None else None
        return str(region) if region else None

    def _other_moves(self, move: Move, tenant: str) -> tuple[str, ...]:
        """Moves of the same tenant that went first (``domain/moves.moves_ahead``)."""
        others = [_queued(other) for other_key, other in self._ctx.cache.moves.items()
                  if other_key != move.key and other_key.namespace == move.key.namespace
                  and other.spec is not None and other.spec.tenant == tenant]
        return moves_ahead(_queued(move.current), others)

    async def _refuse(self, move: Move, refusal: Refused, source: str | None) -> StepOutcome:
        """Nothing is started. A refusal that may pass later keeps the move Pending and
        asks again every few seconds, up to the progress deadline; then, or at once for a
        refusal nothing lifts, the move fails with it. One Event per new reason or phase,
        not per asking."""
        reason = refusal.reason
        before = move.condition("Accepted")
        before_phase = move.status.phase
        deadline = self._ctx.settings.move_progress_deadline_seconds
        phase = waiting_refusal_phase(reason, waited_seconds=self._age(move.current),
                                      deadline_seconds=deadline)
        message = refusal.message
        if reason.waits:
            message += ("; the move waits and tries again, for at most "
                        f"{deadline:g}s from its creation" if phase is MovePhase.PENDING else
                        f"; it did not pass within {deadline:g}s, the move's progress deadline:"
                        " the move fails")
        if phase is MovePhase.FAILED:
            # A dedicated cell made for this move holds nothing: it goes with the move.
            return await self._ending.end(move, MoveRun(), None, phase, reason.value, message,
                                          refused=True)
        spec = move.current.spec
        await self._support.report(move, MoveReport(
            phase, reason.value, message, source,
            spec.target_cell if spec is not None else None, refused=True))
        if (before.reason if before else None) != reason.value or before_phase != phase.value:
            await self._support.event(move, "Warning", reason.value, message)
        return Again(_ADMISSION_RETRY_SECONDS) if reason.waits else Ended()

    def _age(self, move: MoveObject) -> float:
        """Seconds since the TenantMove was created (the apiserver's clock, read on ours:
        a skew only moves the progress deadline by as much)."""
        created = move.body["metadata"].get("creationTimestamp")
        if not created:
            return 0.0
        return (self._ctx.clock.now() - datetime.datetime.fromisoformat(
            str(created).replace("Z", "+00:00"))).total_seconds()


def _pick_in_region(tenant: TenantSettings, region: str, source: str | None,
                    candidates: list[CellCandidate]) -> str:
    """spec.targetRegion: the cell placement would choose there, the source excluded."""
    outcome = place(PlacementRequest(
        namespace=tenant.namespace, name=tenant.name, isolation=tenant.isolation,
        home_region=Region(region), region_policy=RegionPolicy.SINGLE_REGION,
        max_running_jobs=tenant.quotas().max_running_jobs, pinned_cell=None),
        [c for c in candidates if c.name != source])
    if isinstance(outcome, (Unplaceable, WaitForCell)):
        return f"(no cell in {region} fits: {outcome.message})"
    return str(outcome.cell)


def _queued(move: MoveObject) -> QueuedMove:
    return QueuedMove(move.meta.name, MovePhase(move.status.phase or MovePhase.PENDING.value),
                      str(move.body["metadata"].get("creationTimestamp") or ""))
