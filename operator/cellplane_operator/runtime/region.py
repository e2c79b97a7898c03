"""One regional operator's process: its adapters, the placement election, and its controllers.

kopf's watch feeds ``observe_cell`` / ``observe_tenant``; everything else runs
in tasks started here. A site runner runs for every cell with a site in this
region (its home region or one of its standby regions; which site is the
primary is decided in etcd, see ``runtime/cellsite.py``); the tenant controller runs always and acts
only while this operator leads the placement election, and runs the cell controller
(acceptance, loads, the deletion guard) while it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from pydantic import ValidationError

from cellplane_operator.cellclient import CellAdminClient
from cellplane_operator.clock import SystemClock
from cellplane_operator.kube import KubeClient, KubeConfig
from cellplane_operator.ownership.election import Leadership
from cellplane_operator.runtime.cache import ObjectCache
from cellplane_operator.runtime.cells import CellController
from cellplane_operator.runtime.objects import CellObject, body_of
from cellplane_operator.runtime.cellsite import CellSiteRunner
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.moves import MoveController
from cellplane_operator.runtime.placing import Placements
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.runtime.tenants import TenantController
from cellplane_operator.settings import OperatorSettings
from cellplane_operator.sites.base import SiteDriver
from cellplane_operator.sites.celldb import PostgresCellDatabases
from cellplane_operator.sites.reports import SiteReports
from cellplane_operator.store import EtcdStore

__all__ = ["RegionRuntime"]

log = logging.getLogger(__name__)


class RegionRuntime:
    def __init__(self, settings: OperatorSettings, driver: SiteDriver) -> None:
        self.settings = settings
        self._driver = driver
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._sites: dict[str, tuple[CellSiteRunner, asyncio.Event, asyncio.Task[None]]] = {}
        self.ctx: RegionContext | None = None
        self.tenants: TenantController | None = None
        self.cells: CellController | None = None
        self.moves: MoveController | None = None

    async def start(self) -> None:
        settings = self.settings
        timeout = settings.etcd_timeout_seconds
        store = EtcdStore(list(settings.etcd_endpoints), timeout=timeout,
                          attempt_timeout=timeout / 2)
        cache = ObjectCache()
        clock = SystemClock()
        kube = KubeClient(KubeConfig.load(settings.kubeconfig),
                          timeout_seconds=settings.kube_timeout_seconds)
        self.ctx = RegionContext(
            settings=settings, store=store, kube=kube,
            driver=self._driver, clock=clock, cells=CellAdminClient(), cache=cache,
            reports=SiteReports(store), databases=PostgresCellDatabases())
        member = settings.member or f"{settings.region}-{os.getpid()}"
        leadership = Leadership(store, region=settings.region, member=member,
                                settings=settings.election, clock=clock)
        placements = Placements(self.ctx, leadership)
        self.cells = CellController(self.ctx, placements)
        self.tenants = TenantController(self.ctx, leadership, placements=placements,
                                        cells=self.cells)
        cache.on_tenant.append(self.tenants.tenant_changed)
        cache.on_cell.append(self._cell_changed)
        cache.on_cell.append(self.cells.cell_changed)
        cache.on_cell.append(self.tenants.cell_changed)
        self.moves = MoveController(self.ctx, leadership, self.tenants)
        cache.on_move.append(self.moves.move_changed)
        cache.on_tenant.append(self.moves.tenant_changed)
        self._tasks = [asyncio.create_task(leadership.run(self._stop), name="election"),
                       asyncio.create_task(self.tenants.run(self._stop), name="tenants"),
                       asyncio.create_task(self.moves.run(self._stop), name="moves")]
        log.info("regional operator for %s up (member %s, etcd %s)", settings.region, member,
                 ",".join(settings.etcd_endpoints))

    def observe_cell(self, event_type: str | None, body: dict[str, Any]) -> None:
        if self.ctx is not None:
            self.ctx.cache.observe_cell(event_type, body)

    def observe_tenant(self, event_type: str | None, body: dict[str, Any]) -> None:
        if self.ctx is not None:
            self.ctx.cache.observe_tenant(event_type, body)

    def observe_move(self, event_type: str | None, body: dict[str, Any]) -> None:
        if self.ctx is not None:
            self.ctx.cache.observe_move(event_type, body)

    def _cell_changed(self, name: str, _before: CellObject | None,
                      cell_object: CellObject | None) -> None:
        assert self.ctx is not None
        body = body_of(cell_object)
        running = self._sites.get(name)
        if body is None:
            # A cell of that name created later gets a new token.
            self.ctx.forget_cell(name)
        has_site = False
        if body is not None:
            try:
                cell = CellSettings.from_body(body)
            except (ValueError, ValidationError) as error:
                log.error("cell %s cannot be read: %s", name, error)
                return
            has_site = self.settings.region in cell.site_regions
        if running is not None:
            runner, _, _ = running
            if has_site and body is not None:
                runner.update(body)
                return
            self._stop_site(name, destroy=True)
        if has_site and body is not None:
            runner = CellSiteRunner(self.ctx, body)
            stop = asyncio.Event()
            task = asyncio.create_task(runner.run(stop), name=f"site-{name}")
            self._sites[name] = (runner, stop, task)
            log.info("running the site of cell %s in %s", name, self.settings.region)

    def _stop_site(self, name: str, *, destroy: bool) -> None:
        runner, stop, task = self._sites.pop(name)
        stop.set()

        async def finish() -> None:
            with contextlib.suppress(Exception):
                await task
            if destroy:
                log.info("cell %s is gone: removing its site in %s", name, self.settings.region)
                await runner.destroy()

        self._tasks.append(asyncio.create_task(finish(), name=f"stop-site-{name}"))

    async def stop(self) -> None:
        """Operator shutdown: the cells keep running (see ``CellSiteRunner.detach``)."""
        self._stop.set()
        for runner, stop, _ in self._sites.values():
            if self.settings.adopt_leases:
                runner.detach()
            stop.set()
        site_tasks = [task for _, _, task in self._sites.values()]
        await asyncio.gather(*site_tasks, *self._tasks, return_exceptions=True)
        if self.ctx is not None:
            await self.ctx.close()
            await self.ctx.cells.close()
            await self.ctx.kube.close()
            await self.ctx.store.close()

