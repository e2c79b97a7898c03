"""One ``SiteDriver`` for the operator, handing each site to the driver its Cell names.

``spec.driver.name`` is immutable, so a cell's driver is read once from its Cell and
kept. A site whose Cell is gone before this operator ever read it (deleted while the
region was down) is the ``kubernetes`` driver's when its objects exist, the local
driver's otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from cellplane_operator.errors import SiteError
from cellplane_operator.sites.base import (
    DatabaseEndpoint,
    ServingSpec,
    SiteDriver,
    SiteEndpoints,
    SiteHealth,
    SiteKey,
)

__all__ = ["DriverByCell"]

LOCAL = "local"


class DriverByCell:
    """``SiteDriver`` that forwards every call to the driver of the site's cell."""

    def __init__(self, drivers: Mapping[str, SiteDriver], *,
                 driver_name: Callable[[SiteKey], Awaitable[str | None]]) -> None:
        """``driver_name``: the cell's ``spec.driver.name``, or None when the Cell is gone."""
        self._drivers = dict(drivers)
        self._driver_name = driver_name
        self._known: dict[str, str] = {}

    async def driver_of(self, site: SiteKey) -> SiteDriver:
        name = self._known.get(site.cell)
        if name is None:
            name = await self._driver_name(site) or LOCAL
            self._known[site.cell] = name
        try:
            return self._drivers[name]
        except KeyError:
            raise SiteError(f"cell {site.cell} wants the {name} site driver, which this "
                            f"operator does not run (it runs: {', '.join(sorted(self._drivers))})"
                            ) from None

    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        return await (await self.driver_of(site)).ensure_primary_database(site)

    async def ensure_standby_database(self, site: SiteKey,
                                      primary: DatabaseEndpoint) -> DatabaseEndpoint:
        return await (await self.driver_of(site)).ensure_standby_database(site, primary)

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        return await (await self.driver_of(site)).promote_database(site)

    async def database_role(self, site: SiteKey) -> str | None:
        return await (await self.driver_of(site)).database_role(site)

    async def demote_for_handover(self, site: SiteKey) -> str:
        return await (await self.driver_of(site)).demote_for_handover(site)

    async def open_fenced_for_reading(self, site: SiteKey) -> str:
        return await (await self.driver_of(site)).open_fenced_for_reading(site)

    async def close_fenced_reading(self, site: SiteKey) -> None:
        await (await self.driver_of(site)).close_fenced_reading(site)

    async def fence_database(self, site: SiteKey) -> None:
        await (await self.driver_of(site)).fence_database(site)

    async def rebuild_as_standby(self, site: SiteKey,
                                 primary: DatabaseEndpoint) -> DatabaseEndpoint:
        return await (await self.driver_of(site)).rebuild_as_standby(site, primary)

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        return await (await self.driver_of(site)).start_serving(site, spec)

    async def warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        await (await self.driver_of(site)).warm_up(site, spec)

    async def stop_serving(self, site: SiteKey) -> None:
        await (await self.driver_of(site)).stop_serving(site)

    async def check(self, site: SiteKey) -> SiteHealth:
        return await (await self.driver_of(site)).check(site)

    async def destroy(self, site: SiteKey) -> None:
        await (await self.driver_of(site)).destroy(site)
