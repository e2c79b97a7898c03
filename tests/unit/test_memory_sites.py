"""The in-memory sites answer as the local driver does (the contract of tests/sitecontract.py,
also run on real Postgres and cell processes), and their faults do what a test needs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cellplane_operator.clock import SystemClock
from cellplane_operator.errors import SiteError
from cellplane_operator.sites.base import CellDatabases, ServingSpec, SiteDriver, SiteKey
from cellplane_operator.sites.memory import InMemorySites
from sitecontract import CHECKS, Check

CLOCK = SystemClock()


@dataclass
class FakeHarness:
    driver: SiteDriver
    databases: CellDatabases


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_fake_keeps_the_site_contract(check: Check) -> None:
    sites = InMemorySites(CLOCK)
    await check(FakeHarness(sites, sites), "contract-cell")


async def test_a_lost_region_answers_nothing_and_its_standby_stops_streaming() -> None:
    sites = InMemorySites(CLOCK)
    primary, standby = SiteKey("c", "region-a"), SiteKey("c", "region-b")
    database = await sites.ensure_primary_database(primary)
    await sites.ensure_standby_database(standby, database)
    assert (await sites.check(standby)).streaming

    sites.lose_region("region-a")

    with pytest.raises(SiteError):
        await sites.check(primary)
    with pytest.raises(SiteError):
        await sites.grant(database.conninfo, 1, 10, None)
    assert not (await sites.check(standby)).streaming


async def test_a_grant_lets_writes_in_until_its_deadline_and_a_stop_ends_them_at_once() -> None:
    sites = InMemorySites(CLOCK)
    site = SiteKey("c", "region-a")
    database = await sites.ensure_primary_database(site)
    await sites.grant(database.conninfo, 2, 3600, None)
    assert sites.accepts_writes(site, 2) and not sites.accepts_writes(site, 1)

    await sites.grant(database.conninfo, 2, 0, None)

    assert not sites.accepts_writes(site, 2)


async def test_check_restarts_a_crashed_database_but_never_a_fenced_one() -> None:
    sites = InMemorySites(CLOCK)
    site = SiteKey("c", "region-a")
    await sites.ensure_primary_database(site)
    sites.crash_database(site)

    assert (await sites.check(site)).restarted == ("postgres",)
    await sites.fence_database(site)
    assert (await sites.check(site)).restarted == ()
    assert not (await sites.check(site)).database_up


async def test_a_held_standby_does_not_replay_what_its_primary_wrote_since() -> None:
    sites = InMemorySites(CLOCK)
    primary, standby = SiteKey("c", "region-a"), SiteKey("c", "region-b")
    database = await sites.ensure_primary_database(primary)
    replica = await sites.ensure_standby_database(standby, database)
    sites.sites[standby].replay_held = True

    lsn = await sites.demote_for_handover(primary)

    assert not await sites.replayed(replica.conninfo, lsn, timeout_seconds=0.1)


async def test_check_restarts_serving_processes_that_died_under_their_epoch() -> None:
    sites = InMemorySites(CLOCK)
    site = SiteKey("c", "region-a")
    await sites.ensure_primary_database(site)
    await sites.start_serving(site, ServingSpec(epoch=3, admin_token="t"))
    sites.crash_serving(site)

    health = await sites.check(site)

    assert health.restarted == ("api",) and health.serving and health.epoch == 3
