"""``sites.dispatch.DriverByCell``: each site goes to the driver its Cell names, asked once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cellplane_operator.errors import SiteError
from cellplane_operator.sites.base import SiteKey, SiteHealth
from cellplane_operator.sites.dispatch import DriverByCell


class RecordingDriver:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, SiteKey]] = []

    def __getattr__(self, method: str) -> Any:
        async def call(site: SiteKey, *args: Any) -> Any:
            self.calls.append((method, site))
            if method == "check":
                return SiteHealth(database_up=True, serving=False, epoch=None, endpoints=None)
            return None
        return call


def test_each_cell_goes_to_its_driver_and_the_cell_is_read_once() -> None:
    local, kubernetes = RecordingDriver("local"), RecordingDriver("kubernetes")
    asked: list[str] = []

    async def driver_name(site: SiteKey) -> str | None:
        asked.append(site.cell)
        return {"pods": "kubernetes", "procs": "local"}.get(site.cell)

    driver = DriverByCell({"local": local, "kubernetes": kubernetes},  # type: ignore[dict-item]
                          driver_name=driver_name)

    async def run() -> None:
        await driver.fence_database(SiteKey("pods", "region-a"))
        await driver.check(SiteKey("pods", "region-b"))
        await driver.stop_serving(SiteKey("procs", "region-a"))
        # A cell whose Cell is gone and whose objects nobody made: the local driver's.
        await driver.destroy(SiteKey("gone", "region-a"))

    asyncio.run(run())
    assert kubernetes.calls == [("fence_database", SiteKey("pods", "region-a")),
                                ("check", SiteKey("pods", "region-b"))]
    assert local.calls == [("stop_serving", SiteKey("procs", "region-a")),
                           ("destroy", SiteKey("gone", "region-a"))]
    assert asked == ["pods", "procs", "gone"]


def test_a_driver_this_operator_does_not_run_is_a_site_error_naming_both() -> None:
    async def driver_name(site: SiteKey) -> str | None:
        return "kubernetes"

    driver = DriverByCell({"local": RecordingDriver("local")},  # type: ignore[dict-item]
                          driver_name=driver_name)
    with pytest.raises(SiteError, match="wants the kubernetes site driver.*runs: local"):
        asyncio.run(driver.check(SiteKey("pods", "region-a")))
