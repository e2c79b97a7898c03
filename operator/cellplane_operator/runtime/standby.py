"""A standby site of a cell: it streams from the active site, says how far behind it is,
keeps its API warm, and decides whether it may compete for the cell when the owner is gone.

Whether it may (``domain/failover.candidacy``) depends on how far behind the lost primary
it was, which only this region saw: the witness (``StandbyWitness``) of its streaming. It
is kept in a file in the operator's state directory at each change, so that an operator
restarted during a region loss judges the standby as its predecessor would have.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cellplane_operator.domain.failover import (
    Candidacy,
    StandbyWitness,
    WitnessRecord,
    candidacy,
    lag_at_loss,
    restored_witness,
    witness_record,
    witnessed,
)
from cellplane_operator.errors import CellplaneError
from cellplane_operator.metrics import standby_observed
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["StandbySite"]

log = logging.getLogger(__name__)


class StandbySite:
    def __init__(self, ctx: RegionContext, site: SiteKey) -> None:
        self._ctx = ctx
        self._site = site
        self._witness = StandbyWitness()
        self._warm_epoch: int | None = None

    @property
    def witness_file(self) -> Path:
        return Path(self._ctx.settings.state_dir) / "witness" / f"{self._site.name}.json"

    def restore_witness(self) -> None:
        """What the previous operator of this region saw of the standby streaming."""
        try:
            record = WitnessRecord.decode(self.witness_file.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            log.warning("%s: ignoring the standby witness %s: %s", self._site.name,
                        self.witness_file, error)
            return
        clock = self._ctx.clock
        self._witness = restored_witness(record, monotonic_now=clock.monotonic(),
                                         wall_now=clock.now().timestamp())
        log.info("%s: the previous operator saw this standby streaming (lag %.1fs) until %s",
                 self._site.name, record.lag_while_streaming,
                 record.not_streaming_since or record.last_streaming_at)

    def _keep_witness(self, witness: StandbyWitness) -> None:
        """Written at each change (a rename: never half a file)."""
        if witness == self._witness:
            return
        self._witness = witness
        clock = self._ctx.clock
        record = witness_record(witness, monotonic_now=clock.monotonic(),
                                wall_now=clock.now().timestamp())
        path = self.witness_file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_bytes(record.encode())
            os.replace(temporary, path)
        except OSError as error:
            log.warning("%s: cannot keep the standby witness: %s", self._site.name, error)

    async def follow(self, body: dict[str, Any], active_region: str) -> SiteReport:
        """Keeps this site a streaming standby of the active site; its report."""
        site, driver = self._site, self._ctx.driver
        try:
            primary = await self._ctx.reports.read(site.cell, active_region)
            if primary is None or primary.database is None or primary.role != "primary":
                return SiteReport(role="standby", site=site.name,
                                  message=f"waiting for the primary site in {active_region}")
            database = await driver.ensure_standby_database(site, primary.database)
            health = await driver.check(site)
        except CellplaneError as error:
            return SiteReport(role="standby", site=site.name, message=str(error)[:500])
        if health.restarted:
            await self._ctx.event(body, "Warning", "ProcessRestarted",
                                  f"{site.name}: restarted {', '.join(health.restarted)}")
        self._keep_witness(witnessed(self._witness, now=self._ctx.clock.monotonic(),
                                     streaming=health.streaming,
                                     lag_seconds=health.replay_lag_seconds))
        standby_observed(site.cell, self._ctx.region, streaming=health.streaming,
                         lag_seconds=health.replay_lag_seconds)
        message = "" if health.streaming else f"not streaming from the primary in {active_region}"
        return SiteReport(role="standby", site=site.name, database=database,
                          streaming=health.streaming, lag_seconds=health.replay_lag_seconds,
                          message=message)

    def candidacy(self, cell: CellSettings, *, active_region: str, owner_gone_at: float | None,
                  forced_region: str | None) -> Candidacy:
        """May this standby compete for the cell (``owner_gone_at``: when its owner key was
        seen gone; None while it has an owner)?"""
        lag = lag_at_loss(self._witness, now=self._ctx.clock.monotonic(),
                          owner_gone_at=owner_gone_at,
                          lease_seconds=cell.lease.duration_seconds)
        return candidacy(my_region=self._ctx.region, active_region=active_region,
                         automatic=cell.automatic_failover, forced_region=forced_region,
                         lag_seconds=lag, max_lag_seconds=cell.max_standby_lag_seconds)

    async def warm_up(self, cell: CellSettings, epoch: int) -> None:
        """Keeps this standby's API started under the epoch a takeover by it would raise
        the group to, so that serving after a promotion needs no new process."""
        if self._warm_epoch == epoch:
            return
        try:
            spec = cell.serving_spec(epoch, await self._ctx.cell_admin_token(cell.name),
                                     cell.workers(cell.worker_processes))
            await self._ctx.driver.warm_up(self._site, spec)
            self._warm_epoch = epoch
        except CellplaneError as error:
            log.warning("%s: could not warm up the API: %s", self._site.name, error)

    def cooled(self) -> None:
        """The warmed-up API is gone (a fence ends every process but Postgres)."""
        self._warm_epoch = None

    def forget(self) -> None:
        """The site is removed: its witness with it."""
        self.witness_file.unlink(missing_ok=True)
