"""Regional operators' controllers wired as runtime/region.py wires them, over the fakes of
every port: InMemoryStore (etcd), InMemoryKube (the apiserver) with a watch that feeds
each operator's ObjectCache as kopf's would, and InMemoryCells (the cells' admin APIs).

``Plane`` is what the operators share; ``Operator`` one regional operator process: its
election, its TenantController (with the CellController it runs while it leads) and
MoveController, and a log of every write it made itself (Kubernetes, etcd outside the
election, cells), so a test can tell which operator did what. Cells are made Ready here as their site runner would report them: no site
driver runs (a stub refuses every call), which shared cells served elsewhere never need.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.cellmemory import FakeCell, InMemoryCells
from cellplane_operator.clock import SystemClock
from cellplane_operator.domain.cells import CellObservation, plan_cell_status
from cellplane_operator.domain.ownership import LeaseSettings
from cellplane_operator.kube import CELLS, EVENTS, SECRETS, TENANTMOVES, TENANTS, Resource
from cellplane_operator.kube.base import KubeApi
from cellplane_operator.kube.memory import InMemoryKube
from cellplane_operator.ownership.election import Leadership
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey
from cellplane_operator.runtime.cache import ObjectCache
from cellplane_operator.runtime.cells import CellController
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.moves import MoveController
from cellplane_operator.runtime.placing import Placements
from cellplane_operator.runtime.tenants import TenantController
from cellplane_operator.settings import OperatorSettings
from cellplane_operator.sites.base import SiteDriver
from cellplane_operator.sites.reports import SiteReports
from cellplane_operator.store import Compare, Delete, InMemoryStore, KeyValueStore, Put, VersionedValue

__all__ = ["Plane", "Operator", "FAST_ELECTION", "eventually", "condition"]

T = TypeVar("T")

FAST_ELECTION = LeaseSettings(duration_seconds=2, renew_interval_seconds=0.25, margin_seconds=0.5)
"""The shortest safe election lease (two renewals fit in duration - margin): a takeover
after a leader stops takes about 2.5 s instead of the product's 12 s."""

ADMIN_TOKEN = "cell-admin-token-0123456789abcdef"
CLOCK = SystemClock()


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, *,
                     timeout: float = 15.0) -> T:
    """The first truthy answer of ``probe``, asked every 20 ms; fails naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {found!r}")
        await asyncio.sleep(0.02)


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    for entry in status.get("conditions") or []:
        if entry["type"] == type_:
            return dict(entry)
    return {}


class WatchedKube(InMemoryKube):
    """The fake apiserver, with kopf's watch of Cells, Tenants and TenantMoves: every
    change is delivered, in order, to each subscribed operator's cache, as a copy of its
    own (operators are separate processes)."""

    _WATCHED = {CELLS.plural: "cell", TENANTS.plural: "tenant", TENANTMOVES.plural: "move"}

    def __init__(self) -> None:
        super().__init__()
        self.caches: list[ObjectCache] = []

    async def subscribe(self, cache: ObjectCache) -> None:
        """The watch's first list: the cache learns what exists before any change."""
        self.caches.append(cache)
        for resource in (CELLS, TENANTS, TENANTMOVES):
            for body in await self.list(resource):
                self._deliver(resource, None, body, only=cache)

    def _deliver(self, resource: Resource, event: str | None, body: dict[str, Any], *,
                 only: ObjectCache | None = None) -> None:
        kind = self._WATCHED.get(resource.plural)
        if kind is None:
            return
        for cache in [only] if only is not None else self.caches:
            observe = getattr(cache, f"observe_{kind}")
            observe(event, copy.deepcopy(body))

    async def create(self, resource: Resource, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]:
        created = await super().create(resource, body, namespace=namespace)
        self._deliver(resource, "ADDED", created)
        return created

    async def patch(self, resource: Resource, name: str, patch: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    patch_type: Literal["merge", "json"] = "merge") -> dict[str, Any]:
        patched = await super().patch(resource, name, patch, namespace=namespace,
                                      subresource=subresource, patch_type=patch_type)
        gone = await super().get(resource, name, namespace=namespace) is None
        self._deliver(resource, "DELETED" if gone else "MODIFIED", patched)
        return patched

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     propagation: str = "Background") -> bool:
        before = await super().get(resource, name, namespace=namespace)
        deleted = await super().delete(resource, name, namespace=namespace,
                                       propagation=propagation)
        if before is not None:
            after = await super().get(resource, name, namespace=namespace)
            self._deliver(resource, "DELETED" if after is None else "MODIFIED", after or before)
        return deleted


class RecordingKube:
    """One operator's connection to the shared apiserver: what it writes is logged."""

    def __init__(self, api: KubeApi, writes: list[str]) -> None:
        self._api, self._writes = api, writes

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None
                  ) -> dict[str, Any] | None:
        return await self._api.get(resource, name, namespace=namespace)

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        return await self._api.list(resource, namespace=namespace, label_selector=label_selector)

    async def create(self, resource: Resource, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]:
        self._writes.append(f"kube create {resource.plural}/{body['metadata']['name']}")
        return await self._api.create(resource, body, namespace=namespace)

    async def patch(self, resource: Resource, name: str, patch: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    patch_type: Literal["merge", "json"] = "merge") -> dict[str, Any]:
        self._writes.append(f"kube patch {resource.plural}/{name}")
        return await self._api.patch(resource, name, patch, namespace=namespace,
                                     subresource=subresource, patch_type=patch_type)

    async def apply(self, manifest: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        self._writes.append(f"kube apply {manifest['kind']}/{manifest['metadata']['name']}")
        return await self._api.apply(manifest, field_manager=field_manager)

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     propagation: str = "Background") -> bool:
        self._writes.append(f"kube delete {resource.plural}/{name}")
        return await self._api.delete(resource, name, namespace=namespace, propagation=propagation)

    async def event(self, involved: Mapping[str, Any], *, type_: Literal["Normal", "Warning"],
                    reason: str, message: str, component: str,
                    now: datetime.datetime) -> None:
        self._writes.append(f"kube event {reason}")
        await self._api.event(involved, type_=type_, reason=reason, message=message,
                              component=component, now=now)

    async def close(self) -> None:
        return None


class RecordingStore:
    """One operator's connection to the shared etcd for its controllers (the election has
    its own): what it writes is logged."""

    def __init__(self, store: KeyValueStore, writes: list[str]) -> None:
        self._store, self._writes = store, writes

    async def get(self, key: str) -> VersionedValue | None:
        return await self._store.get(key)

    async def get_prefix(self, prefix: str) -> dict[str, VersionedValue]:
        return await self._store.get_prefix(prefix)

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        return await self._store.read(*keys)

    async def put(self, key: str, value: bytes) -> int:
        self._writes.append(f"etcd put {key}")
        return await self._store.put(key, value)

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        self._writes.append(f"etcd put {key}")
        return await self._store.put_if_revision(key, value, mod_revision=mod_revision)

    async def delete(self, key: str) -> bool:
        self._writes.append(f"etcd delete {key}")
        return await self._store.delete(key)

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        self._writes.append(f"etcd txn {what}")
        return await self._store.transaction(compares, success, what=what)

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        self._writes.append("etcd lease grant")
        return await self._store.grant_lease(ttl_seconds)

    async def keep_alive(self, lease_id: int) -> int:
        return await self._store.keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._store.revoke_lease(lease_id)

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> Any:
        return self._store.watch_prefix(prefix, start_revision=start_revision)

    async def close(self) -> None:
        return None


class RenewalCountingStore(RecordingStore):
    """A store connection that counts lease renewals: the election's heartbeat, a clock a
    test can wait on without a fixed sleep."""

    def __init__(self, store: KeyValueStore) -> None:
        super().__init__(store, [])
        self.renewals = 0

    async def keep_alive(self, lease_id: int) -> int:
        self.renewals += 1
        return await super().keep_alive(lease_id)


class ElectionOnly:
    """Another region's operator as far as the placement election sees it: it campaigns and
    renews, and its controllers are not modelled (they write nothing here)."""

    def __init__(self, plane: Plane, region: str, member: str) -> None:
        self.store = RenewalCountingStore(plane.store)
        self.leadership = Leadership(self.store, region=region, member=member,
                                     settings=FAST_ELECTION, clock=CLOCK)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.leadership.run(self._stop), name=f"election-{member}")

    async def renewals_from_now(self, count: int) -> None:
        """Waits until the lease has been renewed ``count`` more times."""
        target = self.store.renewals + count

        async def renewed() -> bool:
            return self.store.renewals >= target
        await eventually(renewed, f"{count} renewals of the election lease")

    async def stop(self) -> None:
        """A clean shutdown: the election is released at once."""
        self._stop.set()
        await asyncio.gather(self._task, return_exceptions=True)


class RecordingCells:
    """One operator's client of the shared cells: every call that changes a cell is logged."""

    _READS = frozenset({"refused_endpoints", "checksums", "move_out_rows", "move_out_changes",
                        "close"})

    def __init__(self, cells: CellAdmin, writes: list[str]) -> None:
        self._cells, self._writes = cells, writes

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._cells, name)
        if name in self._READS:
            return call

        async def logged(*args: Any, **kwargs: Any) -> Any:
            self._writes.append(f"cell {name} {args[2] if len(args) > 2 else ''}".rstrip())
            return await call(*args, **kwargs)
        return logged


class NoSiteDriver:
    """No site of these cells runs in this region: nothing may ask the driver for one."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the site driver was asked for {name}: no test cell has a site here")


class Operator:
    """One regional operator process over the shared plane: its election, tenant and move
    controllers, started as RegionRuntime.start starts them (no site runners)."""

    def __init__(self, plane: Plane, region: str, member: str, **settings: Any) -> None:
        self.writes: list[str] = []
        """What this operator wrote, in order (Kubernetes, etcd outside the election, cells)."""
        self.settings = OperatorSettings(region=region, member=member, election=FAST_ELECTION,
                                         **settings)
        self.cache = ObjectCache()
        self.ctx = RegionContext(
            settings=self.settings, store=RecordingStore(plane.store, self.writes),
            kube=RecordingKube(plane.kube, self.writes), driver=cast(SiteDriver, NoSiteDriver()),
            clock=CLOCK, cells=cast(CellAdmin, RecordingCells(plane.cells, self.writes)),
            cache=self.cache, reports=SiteReports(plane.store))
        # The election reads and writes etcd itself, as in region.py; only its own keys.
        self.leadership = Leadership(plane.store, region=region, member=member,
                                     settings=FAST_ELECTION, clock=CLOCK)
        self.placements = Placements(self.ctx, self.leadership)
        self.cells = CellController(self.ctx, self.placements)
        self.tenants = TenantController(self.ctx, self.leadership, placements=self.placements,
                                        cells=self.cells)
        self.cache.on_tenant.append(self.tenants.tenant_changed)
        self.cache.on_cell.append(self.cells.cell_changed)
        self.cache.on_cell.append(self.tenants.cell_changed)
        self.moves = MoveController(self.ctx, self.leadership, self.tenants)
        self.cache.on_move.append(self.moves.move_changed)
        self.cache.on_tenant.append(self.moves.tenant_changed)
        self._plane = plane
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Operator:
        await self._plane.kube.subscribe(self.cache)
        self._tasks = [asyncio.create_task(self.leadership.run(self._stop), name="election"),
                       asyncio.create_task(self.tenants.run(self._stop), name="tenants"),
                       asyncio.create_task(self.moves.run(self._stop), name="moves")]
        return self

    async def stop(self) -> None:
        """A clean shutdown: the election is released, the Event sender stopped."""
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cache in self._plane.kube.caches:
            self._plane.kube.caches.remove(self.cache)
        await self.ctx.close()

    async def leading(self) -> bool:
        return self.leadership.leading


class Plane:
    """What every operator shares: etcd, the apiserver (with its watch) and the cells."""

    def __init__(self) -> None:
        self.store = InMemoryStore(CLOCK)
        self.kube = WatchedKube()
        self.cells = InMemoryCells()
        self.namespace = "cellplane-system"
        """The operators' namespace (OperatorSettings' default): the cells' admin Secrets."""
        self.operators: list[Operator] = []
        self.elections: list[ElectionOnly] = []
        self._members = itertools.count(1)

    async def operator(self, region: str = "region-a", **settings: Any) -> Operator:
        """``settings``: OperatorSettings fields other than the region's and the election's."""
        started = await Operator(self, region, f"{region}-{next(self._members)}",
                                 **settings).start()
        self.operators.append(started)
        return started

    async def election_only(self, region: str) -> ElectionOnly:
        """Another region's operator that holds the placement election, once it leads."""
        other = ElectionOnly(self, region, f"{region}-{next(self._members)}")
        self.elections.append(other)

        async def leads() -> bool:
            return other.leadership.leading
        await eventually(leads, f"{region} to lead the placement election")
        return other

    async def leader(self) -> Operator:
        """The operator that leads the placement election, once one does."""
        async def found() -> Operator | None:
            leading = [o for o in self.operators if o.leadership.leading]
            return leading[0] if leading else None
        return await eventually(found, "an operator to lead the placement election")

    async def close(self) -> None:
        # A copy a test left held at its gate would keep its operator from stopping.
        self.cells.page_gate = None
        for other in self.elections:
            await other.stop()
        for operator in self.operators:
            await operator.stop()

    async def ready_cell(self, name: str, region: str = "region-a", *, tenants: int = 10,
                         slots: int = 40, allow_private: bool = True) -> FakeCell:
        """A shared cell whose site serves, as its owner's site runner reports it: the Cell,
        its admin Secret, its Ready status with endpoints, and its admin API."""
        admin = f"http://{name}.cells.test:9001"
        await self.kube.create(SECRETS, {
            "metadata": {"name": f"cell-{name}-admin", "namespace": self.namespace},
            "type": "Opaque", "stringData": {"token": ADMIN_TOKEN}}, namespace=self.namespace)
        fake = self.cells.add(admin, token=ADMIN_TOKEN, allow_private=allow_private)
        created = await self.kube.create(CELLS, {
            "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
            "spec": {"region": region, "tier": "shared",
                     "capacity": {"tenants": tenants, "workerSlots": slots},
                     "driver": {"allowPrivateTargets": allow_private}}})
        status = plan_cell_status(CellObservation(
            generation=int(created["metadata"]["generation"]), active_region=region,
            active_site=f"{name}@{region}", epoch=1, fenced=False, database_up=True, serving=True,
            api_endpoint=f"http://{name}.cells.test:9000", admin_endpoint=admin),
            current_conditions=[], now=CLOCK.now())
        await self.kube.patch(CELLS, name, {"status": status}, subresource="status")
        return fake

    async def create_tenant(self, name: str, namespace: str, *, plan: str = "pro",
                            region: str = "region-a", **spec: Any) -> dict[str, Any]:
        return await self.kube.create(TENANTS, {
            "apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"plan": plan, "homeRegion": region, **spec}}, namespace=namespace)

    async def create_move(self, name: str, namespace: str, tenant: str,
                          **spec: Any) -> dict[str, Any]:
        return await self.kube.create(TENANTMOVES, {
            "apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"tenant": tenant, **spec}}, namespace=namespace)

    async def move_status(self, name: str, namespace: str) -> dict[str, Any]:
        found = await self.kube.get(TENANTMOVES, name, namespace=namespace)
        return dict((found or {}).get("status") or {})

    async def tenant(self, name: str, namespace: str) -> dict[str, Any] | None:
        return await self.kube.get(TENANTS, name, namespace=namespace)

    async def tenant_status(self, name: str, namespace: str) -> dict[str, Any]:
        return dict((await self.tenant(name, namespace) or {}).get("status") or {})

    async def cell_status(self, name: str) -> dict[str, Any]:
        return dict((await self.kube.get(CELLS, name) or {}).get("status") or {})

    async def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [e for e in await self.kube.list(EVENTS, namespace=namespace)
                if e["involvedObject"]["name"] == name]

    async def records(self) -> dict[TenantKey, PlacementRecord]:
        return {key: stored.record
                for key, stored in (await PlacementRecords(self.store).read_all()).items()}
