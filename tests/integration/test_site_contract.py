"""The site contract (tests/sitecontract.py) on the local driver: real Postgres (initdb, base
backups, promotion, pg_rewind) and real cell processes, with the operator's own grants and
replay checks (``PostgresCellDatabases``). What the in-memory sites the unit tests use
promise is what real sites answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from cellplane_operator.sites.base import CellDatabases, SiteDriver
from cellplane_operator.sites.celldb import PostgresCellDatabases
from sitecontract import CHECKS, Check
from sitefixtures import Sites, run_sites

pytestmark = pytest.mark.integration


@dataclass
class LocalHarness:
    driver: SiteDriver
    databases: CellDatabases


@pytest.fixture
def sites(request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from run_sites(request, "cellplane-contract-")


@pytest.fixture
async def databases() -> AsyncIterator[PostgresCellDatabases]:
    found = PostgresCellDatabases()
    try:
        yield found
    finally:
        await found.close()


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_local_driver_keeps_the_site_contract(
        sites: Sites, databases: PostgresCellDatabases, check: Check) -> None:
    await check(LocalHarness(sites.driver, databases), "contract-cell")
