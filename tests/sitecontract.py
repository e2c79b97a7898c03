"""What every ``SiteDriver`` (with its ``CellDatabases``) answers, as the local driver does.

The same checks run on the in-memory sites (tests/unit/test_memory_sites.py) and on the
local driver's real Postgres and cell processes (tests/integration/test_site_contract.py),
so a site runner unit-tested on the fake meets the same answers from real sites.
Everything is observed through the two ports: the roles ``database_role`` reads, what
``check`` reports, which calls raise ``SiteError``, whether ``replayed`` sees a location.
A grant is the write each check makes (it is one, in the cell database's own table).
Each check gets a cell of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import pytest

from cellplane_operator.errors import SiteError
from cellplane_operator.sites.base import (
    CellDatabases, DatabaseEndpoint, ServingSpec, SiteDriver, SiteHealth, SiteKey,
)

TOKEN = "admin-token-for-site-contract-0123456789"
WAIT_SECONDS = 60.0
"""How long a real standby may take to stream (a base backup on a busy machine)."""


class Harness(Protocol):
    driver: SiteDriver
    databases: CellDatabases


Check = Callable[[Harness, str], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(function: Check) -> Check:
    CHECKS[function.__name__] = function
    return function


def spec(epoch: int) -> ServingSpec:
    return ServingSpec(epoch=epoch, admin_token=TOKEN, worker_processes=1, slots_per_worker=2,
                       allow_private_targets=True)


async def health_when(harness: Harness, site: SiteKey, condition: Callable[[SiteHealth], bool],
                      what: str) -> SiteHealth:
    """``check`` until ``condition`` holds (at once on the fake); fails naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while True:
        health = await harness.driver.check(site)
        if condition(health):
            return health
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last health {health}")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Pair:
    primary: SiteKey
    standby: SiteKey
    primary_database: DatabaseEndpoint
    standby_database: DatabaseEndpoint


async def streaming_pair(harness: Harness, cell: str) -> Pair:
    """A primary in region-a and its standby in region-b, streaming."""
    primary, standby = SiteKey(cell, "region-a"), SiteKey(cell, "region-b")
    database = await harness.driver.ensure_primary_database(primary)
    standby_database = await harness.driver.ensure_standby_database(standby, database)
    await health_when(harness, standby, lambda h: h.streaming, "the standby to stream")
    return Pair(primary, standby, database, standby_database)


@check
async def a_primary_database_is_created_once_then_adopted(harness: Harness, cell: str) -> None:
    site = SiteKey(cell, "region-a")
    assert await harness.driver.database_role(site) is None
    empty = await harness.driver.check(site)
    assert not empty.database_up and not empty.serving

    database = await harness.driver.ensure_primary_database(site)

    assert database.dbname == "cellplane"
    assert await harness.driver.ensure_primary_database(site) == database
    assert await harness.driver.database_role(site) == "primary"
    health = await harness.driver.check(site)
    assert health.database_up and health.in_recovery is False
    assert not health.serving and health.epoch is None and health.endpoints is None
    assert health.replay_lag_seconds is None and not health.streaming


@check
async def serving_runs_under_one_epoch_and_stops_keeping_the_database(
        harness: Harness, cell: str) -> None:
    site = SiteKey(cell, "region-a")
    database = await harness.driver.ensure_primary_database(site)
    await harness.databases.grant(database.conninfo, 1, 3600, None)

    endpoints = await harness.driver.start_serving(site, spec(1))

    health = await health_when(harness, site, lambda h: h.serving, "the site to serve")
    assert (health.epoch, health.endpoints) == (1, endpoints)
    await harness.databases.grant(database.conninfo, 2, 3600, None)
    await harness.driver.start_serving(site, spec(2))
    assert (await health_when(harness, site, lambda h: h.serving, "epoch 2")).epoch == 2

    await harness.driver.stop_serving(site)

    stopped = await harness.driver.check(site)
    assert stopped.database_up and not stopped.serving and stopped.epoch is None


@check
async def only_a_primary_serves_and_only_a_standby_warms_up(harness: Harness, cell: str) -> None:
    pair = await streaming_pair(harness, cell)
    primary, standby = pair.primary, pair.standby
    with pytest.raises(SiteError):
        await harness.driver.start_serving(standby, spec(2))
    with pytest.raises(SiteError):
        await harness.driver.warm_up(primary, spec(2))
    with pytest.raises(SiteError):
        await harness.driver.ensure_primary_database(standby)


@check
async def a_standby_streams_and_is_promoted(harness: Harness, cell: str) -> None:
    standby = (await streaming_pair(harness, cell)).standby
    health = await harness.driver.check(standby)
    assert health.in_recovery is True and health.replay_lag_seconds is not None
    assert not health.serving and health.endpoints is None
    assert await harness.driver.database_role(standby) == "standby"

    promoted = await harness.driver.promote_database(standby)

    assert await harness.driver.database_role(standby) == "primary"
    assert await harness.driver.promote_database(standby) == promoted
    after = await harness.driver.check(standby)
    assert after.database_up and after.in_recovery is False and after.replay_lag_seconds is None
    await harness.databases.grant(promoted.conninfo, 2, 3600, None)


@check
async def a_demoted_primarys_last_location_is_replayed_by_its_standby(
        harness: Harness, cell: str) -> None:
    pair = await streaming_pair(harness, cell)
    primary, database = pair.primary, pair.primary_database
    await harness.databases.grant(database.conninfo, 1, 3600, None)

    lsn = await harness.driver.demote_for_handover(primary)

    assert await harness.driver.demote_for_handover(primary) == lsn
    assert await harness.driver.database_role(primary) == "demoted"
    assert not (await harness.driver.check(primary)).database_up  # kept down
    assert await harness.databases.replayed(pair.standby_database.conninfo, lsn,
                                            timeout_seconds=10)
    # A handover given up: the demoted primary is a primary again.
    assert await harness.driver.ensure_primary_database(primary) == database
    assert (await harness.driver.check(primary)).in_recovery is False


@check
async def a_location_never_written_is_not_replayed(harness: Harness, cell: str) -> None:
    standby = (await streaming_pair(harness, cell)).standby_database

    assert not await harness.databases.replayed(standby.conninfo, "FF/0", timeout_seconds=0.5)


@check
async def a_fenced_old_primary_is_refused_then_rebuilt_as_a_standby_of_the_new_one(
        harness: Harness, cell: str) -> None:
    pair = await streaming_pair(harness, cell)
    old, new = pair.primary, pair.standby
    promoted = await harness.driver.promote_database(new)

    await harness.driver.fence_database(old)

    assert await harness.driver.database_role(old) == "fenced"
    assert not (await harness.driver.check(old)).database_up  # and not restarted
    with pytest.raises(SiteError):
        await harness.driver.ensure_primary_database(old)
    with pytest.raises(SiteError):
        await harness.driver.ensure_standby_database(old, promoted)
    await harness.driver.rebuild_as_standby(old, promoted)
    assert await harness.driver.database_role(old) == "standby"
    await health_when(harness, old, lambda h: h.streaming, "the old primary to stream")


@check
async def a_grant_below_the_epoch_is_refused(harness: Harness, cell: str) -> None:
    database = await harness.driver.ensure_primary_database(SiteKey(cell, "region-a"))
    await harness.databases.grant(database.conninfo, 3, 3600, None)
    await harness.databases.grant(database.conninfo, 3, 0, "maintenance")

    with pytest.raises(SiteError):
        await harness.databases.grant(database.conninfo, 2, 3600, None)


@check
async def destroy_removes_the_site(harness: Harness, cell: str) -> None:
    site = SiteKey(cell, "region-a")
    await harness.driver.ensure_primary_database(site)

    await harness.driver.destroy(site)

    assert await harness.driver.database_role(site) is None
    assert not (await harness.driver.check(site)).database_up
    await harness.driver.destroy(site)
