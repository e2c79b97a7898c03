"""The placement leader's controller: tenants placed, provisioned in their cells, and removed.

Runs only while this operator holds the placement election. Each reconcile of
a tenant reads (the Tenant, its placement record, the cells), plans (pure
placement and status), acts (etcd record first, then the Secret and the cell's
admin API, all idempotent) and reports (status, conditions, Events). A crash
at any point leaves either no record (nothing was done) or a record that the
next reconcile continues from: a tenant is never placed twice.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import ValidationError

from cellplane_cells.domain.plans import Quotas

from cellplane_operator.aio import first_of
from cellplane_operator.api.base import DNS_LABEL_PATTERN
from cellplane_operator.domain.cells import (
    SERVING_PHASES, CellFacts, CellName, Region, Tier, judge_cell, plan_cell_acceptance,
)
from cellplane_operator.domain.dedicated import standby_region
from cellplane_operator.domain.fencing import requested_fence
from cellplane_operator.domain.placement import (
    CellCandidate, PlacementRequest, RegionPolicy, Unplaceable, WaitForCell, cell_loads,
    dedicated_cell_name, place, tenant_id,
)
from cellplane_operator.domain.moves import MOVING_PHASES
from cellplane_operator.domain.routing import KEY_PREFIX, key_digest
from cellplane_operator.domain.tenants import (
    REFUSED_BY_CELL, ForgetSaid, SayProgress, TenantCell, TenantPhase, TenantProgress,
    WaitForTenantCell,
    name_problem, plan_tenant_status, progress_news, provisioned_event, provisioning_cell,
    refused_by_cell,
)
from cellplane_operator.errors import CellApiError, CellplaneError, KubeConflictError
from cellplane_operator.failpoints import failpoint
from cellplane_operator.kube import CELLS, SECRETS, TENANTS
from cellplane_operator.ownership.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, Stored, TenantKey
from cellplane_operator.runtime.context import FINALIZER, RegionContext
from cellplane_operator.runtime.objects import CellObject, body_of
from cellplane_operator.runtime.workqueue import WorkQueue
from cellplane_operator.runtime.specs import CellSettings, TenantSettings

__all__ = ["TenantController", "CellKey", "dedicated_to"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 30.0


class CellKey(NamedTuple):
    name: str


Key = TenantKey | CellKey


class TenantController:
    def __init__(self, ctx: RegionContext, leadership: Leadership) -> None:
        self._ctx = ctx
        self._leadership = leadership
        self._store = PlacementRecords(ctx.store)
        self._records: dict[TenantKey, Stored] = {}
        self._queue: WorkQueue[Key] = WorkQueue(
            self._reconcile_key, first_retry_seconds=1.0,
            retry_ceiling_seconds=_MAX_BACKOFF_SECONDS, ignored=(NotLeaderError,))
        self._placing = asyncio.Lock()
        self._provisioned: dict[TenantKey, tuple[int, str, int, bool]] = {}
        self._announced: dict[Key, str] = {}
        self._loads_dirty: set[str] = set()
        self._parsed_cells: dict[str, tuple[str, CellSettings]] = {}
        self._loads_wake = asyncio.Event()

    # -- scheduling --------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        self._queue.add(key)

    def tenant_changed(self, key: TenantKey) -> None:
        self._queue.changed(key)

    def cell_changed(self, name: str, before: CellObject | None,
                     cell: CellObject | None) -> None:
        """A cell's state moved: its tenants and every unplaced tenant may move on now.

        Only a change that placement or provisioning depends on (spec, phase,
        endpoints, deletion) wakes the tenants: a cell's status also changes with
        every standby lag reading, and waking thousands of tenants for that would
        be all cost and no effect."""
        if cell is not None:
            self.enqueue(CellKey(name))
        if before is not None and cell is not None and _placement_view(before) == _placement_view(cell):
            return
        for key, stored in list(self._records.items()):
            if stored.record.cell == name:
                self.enqueue(key)
        for key in list(self._ctx.cache.tenants):
            if key not in self._records:
                self.enqueue(key)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self._leadership.leading:
                await first_of(stop, self._leadership.changed)
                self._leadership.changed.clear()
                continue
            await self._lead(stop)

    async def _lead(self, stop: asyncio.Event) -> None:
        try:
            self._records = await self._store.read_all()
        except CellplaneError as error:
            log.warning("cannot read placement records: %s", error)
            await first_of(stop, timeout=1.0)
            return
        self._provisioned.clear()
        log.info("placement leader: %d tenant(s) placed", len(self._records))
        for key in list(self._ctx.cache.tenants):
            self.enqueue(key)
        for name in list(self._ctx.cache.cells):
            self.enqueue(CellKey(name))
        work = asyncio.create_task(self._queue.run(self._ctx.settings.tenant_workers))
        resync = asyncio.create_task(self._resync())
        loads = asyncio.create_task(self._publish_loads())
        try:
            while not stop.is_set() and self._leadership.leading:
                self._leadership.changed.clear()
                await first_of(stop, self._leadership.changed)
        finally:
            for task in (work, resync, loads):
                task.cancel()
            await asyncio.gather(work, resync, loads, return_exceptions=True)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self._ctx.settings.resync_seconds)
            self._queue.resync([*self._ctx.cache.tenants,
                                *(CellKey(name) for name in self._ctx.cache.cells)])

    async def _reconcile_key(self, key: Key) -> None:
        if isinstance(key, CellKey):
            await self._reconcile_cell(key)
        else:
            await self._reconcile(key)

    # -- tenants -------------------------------------------------------------------

    async def _reconcile(self, key: TenantKey) -> None:
        body = body_of(self._ctx.cache.tenants.get(key))
        if body is None:
            return
        if body["metadata"].get("deletionTimestamp"):
            await self._remove(key, body)
            return
        try:
            tenant = TenantSettings.from_body(body)
            quotas = tenant.quotas()
        except (ValueError, ValidationError) as error:
            await self._report(key, body, TenantProgress(TenantPhase.UNPLACEABLE, "InvalidSpec", str(error)))
            return
        if (problem := name_problem(tenant.name)) is not None:
            # Stored before the CRD refused such names: its Secret could never be made.
            await self._report(key, body, TenantProgress(TenantPhase.UNPLACEABLE, "InvalidName", problem))
            return
        await self._ctx.ensure_finalizer(TENANTS, body, FINALIZER)
        stored = self._records.get(key)
        if stored is not None and stored.record.uid != tenant.uid:
            # A Tenant of the same name that was removed without our finalizer.
            await self._store.delete(key, stored.record, guard=self._leadership.guard())
            self._records.pop(key, None)
            stored = None
        if stored is None:
            placed = await self._place(key, body, tenant, quotas.max_running_jobs)
            if isinstance(placed, TenantProgress):
                await self._report(key, body, placed)
                self._queue.later(key)
                return
            stored = placed
        record = stored.record
        progress = TenantProgress(TenantPhase.PROVISIONING, "CellNotReady", "", cell=record.cell,
                                epoch=record.epoch, tenant_id=record.tenant_id, quotas=quotas)
        if tenant.isolation is Tier.DEDICATED:
            await self._ensure_dedicated_cell(body, tenant, record.cell, quotas.max_running_jobs)
        cell = body_of(self._ctx.cache.cells.get(record.cell))
        endpoints = ((cell or {}).get("status") or {}).get("endpoints") or {}
        where = provisioning_cell(record.cell, None if cell is None else _tenant_cell(cell))
        if isinstance(where, WaitForTenantCell):
            await self._report(key, body, replace(progress, reason=where.reason,
                                                  message=where.message))
            self._queue.later(key)
            return
        assert cell is not None
        # The cell's URL policy too: tightened, the tenant's URLs are put to it again
        # (and refused with a condition) rather than the tenant left Ready.
        applied = (tenant.generation, record.cell, record.epoch, _allows_private(cell))
        secret_name = _secret_name(tenant)
        if self._provisioned.get(key) != applied:
            secret_name, api_key, webhook_secret = await self._ensure_secret(body, tenant, record)
            failpoint("tenant-after-secret", str(key))
            try:
                await self._provision(tenant, record, where.admin_endpoint, api_key,
                                      webhook_secret)
            except CellApiError as error:
                if error.status not in REFUSED_BY_CELL:
                    # Unreachable, or failing on its side: said in the status as well as
                    # retried with backoff, so the tenant is never left silent.
                    await self._report(key, body, replace(
                        progress, reason="CellUnreachable" if error.status == 0
                        else "CellFailed",
                        message=f"provisioning in cell {record.cell} failed, retried with "
                                f"backoff: {error}"))
                    raise
                # The spec asks what the cell will not do: say which field, and wait for
                # a change of the spec or the cell (both wake the tenant) at the backoff's
                # pace rather than asking again every resync.
                await self._report(key, body, replace(
                    refused_by_cell(cell=record.cell, answer=_cell_answer(error),
                                    targets=tenant.targets,
                                    webhooks=[url for url, _ in tenant.webhooks]),
                    cell=record.cell, epoch=record.epoch, tenant_id=record.tenant_id,
                    quotas=quotas))
                self._queue.later(key)
                return
            failpoint("tenant-after-provision", str(key))
            # The key's digest only now: the router checks keys with it, so the cell
            # must hold the key before the router accepts it.
            digest = key_digest(api_key)
            if record.max_running_jobs != quotas.max_running_jobs or record.key_digest != digest:
                await self._update_record(key, stored, quotas.max_running_jobs, digest)
            self._provisioned[key] = applied
            await self._announce_provisioned(body, tenant, record, quotas)
        await self._report(key, body, replace(
            progress, phase=TenantPhase.DEGRADED if where.degraded else TenantPhase.READY, reason="Provisioned",
            api_endpoint=endpoints.get("api"), api_key_secret=secret_name,
            cell_degraded=where.degraded))
        # Only once its status is written too: a refused status write backs off as well.
        self._queue.done(key)

    async def _announce_provisioned(self, body: dict[str, Any], tenant: TenantSettings,
                                    record: PlacementRecord, quotas: Quotas) -> None:
        """An Event when the tenant first serves in its cell or its quotas changed; none
        when a new leader merely provisions again what its predecessor had."""
        reason = provisioned_event(body.get("status") or {}, cell=record.cell,
                                   generation=tenant.generation)
        if reason is None:
            return
        await self._ctx.event(body, "Normal", reason,
                              f"tenant {record.tenant_id} in cell {record.cell}: "
                              f"{quotas.max_running_jobs} running, {quotas.jobs_per_second:g} jobs/s, "
                              f"burst {quotas.burst} (generation {tenant.generation})")

    async def _place(self, key: TenantKey, body: dict[str, Any], tenant: TenantSettings,
                     max_running_jobs: int) -> Stored | TenantProgress:
        async with self._placing:
            if (stored := self._records.get(key)) is not None:
                return stored
            request = PlacementRequest(
                namespace=tenant.namespace, name=tenant.name, isolation=tenant.isolation,
                home_region=Region(tenant.home_region), region_policy=tenant.region_policy,
                max_running_jobs=max_running_jobs, pinned_cell=tenant.pinned_cell)
            outcome = place(request, self._candidates())
            if isinstance(outcome, Unplaceable):
                return TenantProgress(TenantPhase.UNPLACEABLE, outcome.reason, outcome.message)
            if isinstance(outcome, WaitForCell) and tenant.isolation is Tier.SHARED:
                return TenantProgress(TenantPhase.PLACING, outcome.reason, outcome.message)
            record = PlacementRecord(cell=outcome.cell, epoch=1,
                                     tenant_id=tenant_id(tenant.namespace, tenant.name, tenant.uid),
                                     uid=tenant.uid, max_running_jobs=max_running_jobs)
            if await self._store.create(key, record, guard=self._leadership.guard()):
                # Counted at once for the next decision; its revision is read after the
                # lock, so one placement holds the lock for one etcd round trip only.
                found: Stored | None = Stored(record, 0)
            else:
                found = await self._store.read(key)
            if found is None:
                raise NotLeaderError(f"placement of {key} was refused: the election moved on")
            self._records[key] = stored = found
        failpoint("tenant-after-record", str(key))
        if stored.mod_revision == 0 and (fresh := await self._store.read(key)) is not None:
            self._records[key] = stored = fresh
        await self._ctx.event(body, "Normal", "Placed",
                              f"placed in {tenant.isolation.value} cell {stored.record.cell} "
                              f"at epoch {stored.record.epoch}")
        self._load_changed(stored.record.cell)
        return stored

    # -- what the move controller shares ------------------------------------------------

    def record(self, key: TenantKey) -> Stored | None:
        """The tenant's placement record as this leader last read or wrote it."""
        return self._records.get(key)

    async def refresh(self, key: TenantKey, *, reconcile: bool = True) -> Stored | None:
        """The record as etcd holds it now, remembered; the tenant is reconciled again."""
        stored = await self._store.read(key)
        if stored is None:
            self._records.pop(key, None)
        else:
            self._records[key] = stored
        if reconcile:
            self.tenant_changed(key)
        return stored

    async def replace_record(self, key: TenantKey, stored: Stored, record: PlacementRecord) -> Stored:
        """Compare-and-swap of the record at the revision ``stored`` was read at.

        A record changed meanwhile (a quota update moved ``maxRunningJobs``) is read
        again and the change re-applied once if it still concerns the same cell
        and epoch; anything else is a conflict for the caller to look at.
        """
        for _ in range(2):
            if await self._store.replace(key, record, mod_revision=stored.mod_revision,
                                         guard=self._leadership.guard()):
                fresh = await self.refresh(key)
                if fresh is None:
                    raise CellplaneError(f"the placement record of {key} vanished after a write")
                for cell in {stored.record.cell, record.cell}:
                    self._load_changed(cell)
                return fresh
            current = await self.refresh(key)
            if current is None or (current.record.cell, current.record.epoch) != (
                    stored.record.cell, stored.record.epoch):
                break
            record = replace(record, max_running_jobs=current.record.max_running_jobs,
                             key_digest=current.record.key_digest)
            stored = current
        raise CellplaneError(f"the placement record of {key} changed under the move; "
                             "looking again")

    def _moves_under_way(self, key: TenantKey, *, described: bool = False) -> list[str]:
        found: list[str] = []
        for (namespace, name), move_object in self._ctx.cache.moves.items():
            move = move_object.body
            status = move.get("status") or {}
            if namespace == key.namespace and (move.get("spec") or {}).get("tenant") == key.name \
                    and status.get("phase") in MOVING_PHASES:
                found.append(f"{name}: {status['phase']} to cell {status.get('targetCell')}"
                             if described else name)
        return sorted(found)

    def candidates(self) -> list[CellCandidate]:
        return self._candidates()

    def _candidates(self) -> list[CellCandidate]:
        loads = cell_loads([(s.record.cell, s.record.max_running_jobs) for s in self._records.values()])
        candidates: list[CellCandidate] = []
        for name, found in self._ctx.cache.cells.items():
            body = found.body
            cell = self._cell_settings(name, body)
            if cell is None or not _is_dns_label(name):
                # A dotted name (allowed before the CRD refused it) can never be named in
                # spec.cell or a TenantMove: a tenant placed there could not be moved out.
                continue
            status = body.get("status") or {}
            phase = "Deleting" if body["metadata"].get("deletionTimestamp") else \
                str(status.get("phase") or "Pending")
            tenants, slots = loads.get(name, (0, 0))
            candidates.append(CellCandidate(
                name=CellName(name), region=Region(cell.region), tier=cell.tier, ready=phase == "Ready",
                phase=phase, draining=cell.draining, has_standby=bool(cell.standby_regions),
                tenant_capacity=cell.tenant_capacity, worker_slots=cell.worker_slots,
                tenants_placed=tenants, slots_in_use=slots))
        return candidates

    def _cell_settings(self, name: str, body: dict[str, Any]) -> CellSettings | None:
        """The cell's spec, parsed once per version of the object (placement reads every
        cell for every tenant)."""
        version = body["metadata"].get("resourceVersion", "")
        known = self._parsed_cells.get(name)
        if known is not None and known[0] == version:
            return known[1]
        try:
            cell = CellSettings.from_body(body)
        except (ValueError, ValidationError):
            return None
        self._parsed_cells[name] = (version, cell)
        return cell

    async def _ensure_dedicated_cell(self, body: dict[str, Any], tenant: TenantSettings,
                                     cell: str, max_running_jobs: int, *,
                                     region: str | None = None,
                                     like: dict[str, Any] | None = None) -> None:
        """The tenant's own cell, in ``region`` (its home region unless a move says).
        Also the path of a dedicated tenant's move to a new cell (runtime/moves.py), which
        passes the old cell's spec as ``like``: the new cell runs the same way (its
        driver, lease and failover settings), only elsewhere."""
        if cell in self._ctx.cache.cells or await self._ctx.kube.get(CELLS, cell) is not None:
            return
        home = region or tenant.home_region
        standby: list[str] = []
        if tenant.region_policy is RegionPolicy.HOME_ASYNC:
            chosen = standby_region(Region(home), [Region(r) for r in self._ctx.settings.regions])
            standby = [] if chosen is None else [chosen]
        meta = body["metadata"]
        manifest = {
            "metadata": {
                "name": cell,
                "labels": {"cellplane.io/tenant": tenant.name,
                           "cellplane.io/tenant-namespace": tenant.namespace},
                # A namespaced owner of a cluster-scoped object is recorded for people and
                # tools; Kubernetes' garbage collector cannot act on it, so the operator
                # deletes the cell itself (deletionPolicy Delete).
                "ownerReferences": [{"apiVersion": body["apiVersion"], "kind": "Tenant",
                                     "name": meta["name"], "uid": meta["uid"]}],
            },
            "spec": {**{k: v for k, v in (like or {}).items()
                        if k in ("driver", "lease", "failover")},
                     "region": home, "tier": "dedicated",
                     "capacity": {"tenants": 1, "workerSlots": max(max_running_jobs, 1)},
                     "standbyRegions": standby},
        }
        try:
            await self._ctx.kube.create(CELLS, manifest)
        except KubeConflictError:
            return
        await self._ctx.event(body, "Normal", "DedicatedCellCreated",
                              f"created dedicated cell {cell} in {home}"
                              + (f" with a standby in {standby[0]}" if standby else ""))

    async def _ensure_secret(self, body: dict[str, Any], tenant: TenantSettings,
                             record: PlacementRecord, *, replacing: bool = False
                             ) -> tuple[str, str, str]:
        name = _secret_name(tenant)
        found = await self._ctx.kube.get(SECRETS, name, namespace=tenant.namespace)
        if found is None:
            meta = body["metadata"]
            # The key names its tenant (cpk_<tenant id>.<secret>): the edge router routes
            # by it without a key table, and the cell still checks the whole key's hash.
            data = {"api-key": f"{KEY_PREFIX}{record.tenant_id}.{secrets.token_urlsafe(32)}",
                    "webhook-secret": secrets.token_hex(32), "tenant-id": record.tenant_id}
            try:
                await self._ctx.kube.create(SECRETS, {
                    "metadata": {"name": name, "namespace": tenant.namespace,
                                 "labels": {"cellplane.io/tenant": tenant.name},
                                 "ownerReferences": [{
                                     "apiVersion": body["apiVersion"], "kind": "Tenant",
                                     "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}]},
                    "type": "Opaque", "stringData": data}, namespace=tenant.namespace)
                return name, data["api-key"], data["webhook-secret"]
            except KubeConflictError:
                found = await self._ctx.kube.get(SECRETS, name, namespace=tenant.namespace)
                if found is None:
                    raise
        data = {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}
        owners = {o.get("uid") for o in found["metadata"].get("ownerReferences") or []
                  if o.get("kind") == "Tenant"}
        if data.get("tenant-id", record.tenant_id) != record.tenant_id or (
                owners and body["metadata"]["uid"] not in owners):
            # A deleted Tenant's Secret that the garbage collector has not removed yet:
            # its key names the old tenant id (the router would route it there) and
            # unlocks the retained rows. This object gets a key of its own.
            if replacing:
                raise CellplaneError(f"secret {tenant.namespace}/{name} belongs to another "
                                     "Tenant object and is still there after its deletion")
            await self._ctx.kube.delete(SECRETS, name, namespace=tenant.namespace)
            return await self._ensure_secret(body, tenant, record, replacing=True)
        if not data.get("api-key") or not data.get("webhook-secret"):
            raise CellplaneError(f"secret {tenant.namespace}/{name} lacks api-key or webhook-secret")
        return name, data["api-key"], data["webhook-secret"]

    async def _provision(self, tenant: TenantSettings, record: PlacementRecord, admin: str,
                         api_key: str, webhook_secret: str) -> None:
        token = await self._ctx.cell_admin_token(record.cell)
        cells = self._ctx.cells
        body: dict[str, Any] = {"plan": tenant.plan.value, "api_key": api_key,
                                **tenant.overrides}
        await cells.put_tenant(admin, token, record.tenant_id, body)
        # The whole set, every time: a target or webhook taken out of the spec is taken
        # out of the cell too, or its URL would go on receiving signed calls.
        await cells.put_endpoints(admin, token, record.tenant_id, tenant.targets, tenant.webhooks,
                                  webhook_secret)

    async def _update_record(self, key: TenantKey, stored: Stored, max_running_jobs: int,
                             digest: str) -> None:
        record = stored.record
        updated = replace(record, max_running_jobs=max_running_jobs, key_digest=digest)
        if await self._store.replace(key, updated, mod_revision=stored.mod_revision,
                                     guard=self._leadership.guard()):
            fresh = await self._store.read(key)
            if fresh is not None:
                self._records[key] = fresh
            self._load_changed(record.cell)

    async def _remove(self, key: TenantKey, body: dict[str, Any]) -> None:
        if FINALIZER not in (body["metadata"].get("finalizers") or []):
            return
        tenant = TenantSettings.from_body(body)
        if moving := self._moves_under_way(key):
            # The move sees the deletion and aborts (or, past its commit, finishes):
            # removing the tenant from a cell it is leaving would race the copy.
            await self._report(key, body, TenantProgress(
                TenantPhase.DELETING, "MoveInProgress",
                f"waiting for TenantMove {', '.join(moving)} to end before removing the tenant"))
            self._queue.later(key)
            return
        purge = tenant.deletion_policy == "Delete"
        stored = self._records.get(key)
        if stored is not None:
            record = stored.record
            cell = body_of(self._ctx.cache.cells.get(record.cell))
            if cell is not None:
                status = cell.get("status") or {}
                admin = (status.get("endpoints") or {}).get("admin")
                if status.get("phase") not in SERVING_PHASES or not admin:
                    await self._report(key, body, TenantProgress(
                        TenantPhase.DELETING, "CellUnavailable",
                        f"waiting for cell {record.cell} to serve, to remove the tenant from it",
                        cell=record.cell, epoch=record.epoch, tenant_id=record.tenant_id))
                    self._queue.later(key)
                    return
                token = await self._ctx.cell_admin_token(record.cell)
                await self._ctx.cells.delete_tenant(admin, token, record.tenant_id, purge=purge)
            await self._store.delete(key, record, guard=self._leadership.guard())
            self._records.pop(key, None)
            self._load_changed(record.cell)
            await self._ctx.event(body, "Normal", "Removed",
                                  f"left cell {record.cell}; its data was " + (
                                      "deleted" if purge else
                                      f"kept, disabled, as tenant {record.tenant_id} "
                                      "(deletionPolicy Retain; the cell's admin API reaches "
                                      f"it at /admin/v1/tenants/{record.tenant_id}). A Tenant "
                                      "created again under this name is a new tenant with "
                                      "a new id and none of this data"))
        if tenant.isolation is Tier.DEDICATED and purge:
            await self._delete_dedicated_cell(tenant)
        await self._ctx.kube.delete(SECRETS, _secret_name(tenant), namespace=tenant.namespace)
        await self._ctx.drop_finalizer(TENANTS, body, FINALIZER)
        self._provisioned.pop(key, None)
        self._announced.pop(key, None)

    async def _delete_dedicated_cell(self, tenant: TenantSettings) -> None:
        """Deletes the tenant's own cells (the first, and any a move made) once no record
        points at them. Run on every attempt of the removal, not only after the record
        went, so a failure here (the apiserver down, the deletion guard seeing an old
        count) is retried rather than forgotten."""
        names = {dedicated_cell_name(tenant.namespace, tenant.name)} | {
            name for name, found in self._ctx.cache.cells.items()
            if dedicated_to(found.body) == (tenant.namespace, tenant.name)}
        for name in sorted(names):
            await self.delete_unused_cell(name)

    async def delete_unused_cell(self, name: str) -> bool:
        """Deletes a cell no placement record points at; True if a deletion was asked."""
        cell = body_of(self._ctx.cache.cells.get(name))
        if cell is None or cell["metadata"].get("deletionTimestamp"):
            return False
        if any(s.record.cell == name for s in self._records.values()):
            return False
        # The admission policy refuses a Cell whose status counts tenants: the count
        # must say 0 before the DELETE, not at the next batch of load updates.
        await self._publish_load(name)
        return await self._ctx.kube.delete(CELLS, name)

    async def ensure_dedicated_cell(self, body: dict[str, Any], tenant: TenantSettings,
                                    cell: str, max_running_jobs: int, region: str,
                                    like: dict[str, Any] | None) -> None:
        await self._ensure_dedicated_cell(body, tenant, cell, max_running_jobs, region=region,
                                          like=like)

    # -- cells -----------------------------------------------------------------------

    async def _reconcile_cell(self, key: CellKey) -> None:
        body = body_of(self._ctx.cache.cells.get(key.name))
        if body is None:
            return
        if not body["metadata"].get("deletionTimestamp"):
            await self._ctx.ensure_finalizer(CELLS, body, FINALIZER)
            await self._publish_load(key.name)
            await self._judge_cell(key, body)
            return
        holding = sorted(str(k) for k, s in self._records.items() if s.record.cell == key.name)
        if holding:
            reason = "DeletionBlocked"
            if self._announced.get(key) != reason:
                self._announced[key] = reason
                await self._ctx.event(body, "Warning", reason,
                                      f"cell {key.name} still holds {len(holding)} tenant(s) "
                                      f"({', '.join(holding[:5])}); move or delete them first")
            return
        await self._ctx.drop_finalizer(CELLS, body, FINALIZER)
        self._announced.pop(key, None)

    async def _judge_cell(self, key: CellKey, body: dict[str, Any]) -> None:
        """The Cell's Accepted condition: what no site of it would say (an unknown region
        runs none) and what the apiserver could not refuse (capacity below what is
        placed, a spec or a name stored under an older CRD). A Warning once per reason."""
        cell: CellSettings | None = None
        problem: str | None = None
        try:
            cell = CellSettings.from_body(body)
        except (ValueError, ValidationError) as error:
            problem = str(error)
        tenants, slots = cell_loads([(s.record.cell, s.record.max_running_jobs)
                                     for s in self._records.values()]).get(key.name, (0, 0))
        facts = CellFacts(name=key.name, spec_problem=problem, name_ok=_is_dns_label(key.name),
                          tenants_placed=tenants, slots_in_use=slots)
        if cell is not None:
            facts = replace(facts, region=cell.region, standby_regions=cell.standby_regions,
                            known_regions=tuple(self._ctx.settings.regions), tier=cell.tier,
                            tenant_capacity=cell.tenant_capacity, worker_slots=cell.worker_slots)
        verdict = judge_cell(facts)
        patch = plan_cell_acceptance(verdict, generation=int(body["metadata"].get("generation", 0)),
                                     current=body.get("status") or {}, now=self._ctx.clock.now())
        if patch is not None:
            await self._ctx.kube.patch(CELLS, key.name, {"status": patch}, subresource="status")
        if self._announced.get(key) != verdict.reason:
            self._announced[key] = verdict.reason
            if not verdict.accepted:
                await self._ctx.event(body, "Warning", verdict.reason, verdict.message)

    def _load_changed(self, cell: str) -> None:
        self._loads_dirty.add(cell)
        self._loads_wake.set()

    async def _publish_loads(self) -> None:
        """Cells' loads, written at most every 0.2 s per burst rather than once per tenant:
        500 tenants applied at once would otherwise patch their cells 500 times."""
        while True:
            await self._loads_wake.wait()
            await asyncio.sleep(0.2)
            self._loads_wake.clear()
            cells, self._loads_dirty = self._loads_dirty, set()
            for cell in sorted(cells):
                await self._publish_load(cell)

    async def _publish_load(self, cell: str) -> None:
        """The cell's tenants and slots in use, from the records, if its status differs."""
        tenants, slots = cell_loads([(s.record.cell, s.record.max_running_jobs)
                                     for s in self._records.values()]).get(cell, (0, 0))
        body = body_of(self._ctx.cache.cells.get(cell))
        if body is None:
            return
        status = body.get("status") or {}
        if status.get("tenants") == tenants and status.get("slotsInUse") == slots:
            return
        try:
            await self._ctx.kube.patch(CELLS, cell, {"status": {"tenants": tenants,
                                                                "slotsInUse": slots}},
                                       subresource="status")
        except CellplaneError as error:
            log.warning("cannot publish the load of cell %s: %s", cell, error)

    # -- reporting -------------------------------------------------------------------

    async def _report(self, key: TenantKey, body: dict[str, Any], progress: TenantProgress) -> None:
        if progress.moving is None and (moves := self._moves_under_way(key, described=True)):
            progress = replace(progress, moving="; ".join(moves))
        current = body.get("status") or {}
        status = plan_tenant_status(progress, generation=int(body["metadata"].get("generation", 0)),
                                    current_conditions=current.get("conditions") or [],
                                    now=self._ctx.clock.now())
        if all(current.get(k) == v for k, v in status.items()):
            return
        meta = body["metadata"]
        await self._ctx.kube.patch(TENANTS, meta["name"], {"status": status},
                                   namespace=meta["namespace"], subresource="status")
        news = progress_news(progress, said_before=self._announced.get(key))
        if isinstance(news, SayProgress):
            self._announced[key] = news.said
            await self._ctx.event(body, news.type, progress.reason, progress.message)
        elif isinstance(news, ForgetSaid):
            self._announced.pop(key, None)


def dedicated_to(cell: dict[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the tenant a dedicated cell was made for, by its labels."""
    labels = cell["metadata"].get("labels") or {}
    name, namespace = labels.get("cellplane.io/tenant"), labels.get("cellplane.io/tenant-namespace")
    return (str(namespace), str(name)) if name and namespace else None


def _is_dns_label(name: str) -> bool:
    return len(name) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, name) is not None


def _cell_answer(error: CellApiError) -> str:
    """The cell's own words for a refusal (its message and code), else the whole error."""
    return f"{error.detail} ({error.code})" if error.detail else str(error)


def _tenant_cell(cell: dict[str, Any]) -> TenantCell:
    status = cell.get("status") or {}
    admin = (status.get("endpoints") or {}).get("admin")
    return TenantCell(phase=status.get("phase"),
                      admin_endpoint=str(admin) if admin else None,
                      fence=requested_fence(cell["metadata"].get("annotations")))


def _allows_private(cell: dict[str, Any]) -> bool:
    return bool(((cell.get("spec") or {}).get("driver") or {}).get("allowPrivateTargets"))


def _secret_name(tenant: TenantSettings) -> str:
    return f"{tenant.name}-api-key"


def _placement_view(cell: CellObject) -> tuple[Any, ...]:
    status = cell.status
    return (cell.spec, cell.spec_problem, status.phase, status.endpoints, status.tenants,
            status.slots_in_use, cell.meta.deleting)
