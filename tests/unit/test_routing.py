"""The edge router's placement map: newest revision wins, deletions included; a moving
tenant is held; the placement record's encoding."""

from __future__ import annotations

import json
from dataclasses import replace

from cellplane_operator.domain.routing import NoRoute, PlacementMap, Route, tenant_of_key
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey
from cellplane_operator.store import InMemoryStore

TENANT_KEY = "/cellplane/tenants/team-a/acme"
OWNER_KEY = "/cellplane/groups/shared-a1/owner"
SITE_KEY = "/cellplane/cells/shared-a1/sites/region-a"


def record(cell: str = "shared-a1", epoch: int = 1, *, moving: bool = False) -> bytes:
    return PlacementRecord(cell=cell, epoch=epoch, tenant_id="team--a-acme", uid="u",
                           max_running_jobs=5, moving=moving).encode()


def owner(region: str = "region-a", epoch: int = 3) -> bytes:
    return json.dumps({"region": region, "site": f"shared-a1@{region}", "epoch": epoch,
                       "lease_id": 7}).encode()


def site(api: str = "http://127.0.0.1:9001", serving: bool = True) -> bytes:
    return json.dumps({"role": "primary", "site": "shared-a1@region-a", "serving": serving,
                       "endpoints": {"api": api, "admin": "http://127.0.0.1:9002"}}).encode()


def full_map() -> PlacementMap:
    placement = PlacementMap()
    placement.apply(TENANT_KEY, record(), 10)
    placement.apply(OWNER_KEY, owner(), 11)
    placement.apply(SITE_KEY, site(), 12)
    return placement


def test_keys_name_their_tenant() -> None:
    assert tenant_of_key("cpk_team--a-acme.s3cr3t-_x") == "team--a-acme"
    for other in ("cpk_nodot", "cpk_.secret", "cpk_tenant.", "sk_team.secret", ""):
        assert tenant_of_key(other) is None


def test_a_placed_tenant_routes_to_its_cells_owning_site() -> None:
    assert full_map().resolve("team--a-acme") == Route(
        "team--a-acme", "shared-a1", 1, 3, "region-a", "http://127.0.0.1:9001")


def test_no_owner_and_no_serving_site_are_transient_an_unknown_tenant_is_not() -> None:
    placement = full_map()
    assert placement.resolve("nobody") == NoRoute("UnknownTenant",
                                                  "no tenant nobody is placed in any cell")
    placement.apply(SITE_KEY, site(serving=False), 13)
    assert isinstance(not_serving := placement.resolve("team--a-acme"), NoRoute)
    assert not_serving.reason == "SiteNotServing" and not_serving.transient
    placement.apply(OWNER_KEY, None, 14)
    assert isinstance(no_owner := placement.resolve("team--a-acme"), NoRoute)
    assert no_owner.reason == "NoOwner" and no_owner.transient


def test_an_older_state_never_overwrites_a_newer_one_deletions_included() -> None:
    placement = full_map()
    assert placement.apply(TENANT_KEY, None, 20)               # the tenant left
    assert not placement.apply(TENANT_KEY, record(), 10)       # a late initial read of it
    assert isinstance(placement.resolve("team--a-acme"), NoRoute)
    assert placement.apply(OWNER_KEY, owner("region-b", 4), 30)
    assert not placement.apply(OWNER_KEY, owner("region-a", 3), 11)
    placement.apply(TENANT_KEY, record(epoch=2), 31)           # a move raised the tenant epoch
    placement.apply("/cellplane/cells/shared-a1/sites/region-b", site("http://127.0.0.1:9101"), 32)
    route = placement.resolve("team--a-acme")
    assert isinstance(route, Route)
    assert (route.region, route.api, route.tenant_epoch, route.group_epoch) == (
        "region-b", "http://127.0.0.1:9101", 2, 4)


def test_keys_the_router_does_not_route_by_are_ignored() -> None:
    placement = PlacementMap()
    assert not placement.apply("/cellplane/groups/shared-a1/epoch", b"3", 5)
    assert not placement.apply("/cellplane/elections/placement/owner", owner(), 6)


def test_a_moving_tenant_is_held_until_its_record_names_the_target() -> None:
    placement = full_map()
    placement.apply("/cellplane/groups/dedicated-b1/owner", owner("region-b", 1), 13)
    placement.apply("/cellplane/cells/dedicated-b1/sites/region-b",
                    site("http://127.0.0.1:9201"), 14)
    # The cutover begins: the source stops for the tenant and its record says so.
    assert placement.apply(TENANT_KEY, record(moving=True), 20)
    held = placement.resolve("team--a-acme")
    assert held == NoRoute("Moving", "tenant team--a-acme is being moved to another cell; "
                                     "held until the cutover ends")
    assert isinstance(held, NoRoute) and held.transient
    # Its source cell still serves other tenants: only this tenant is held.
    assert placement.apply("/cellplane/tenants/team-a/other", json.dumps(
        {"cell": "shared-a1", "epoch": 1, "tenantId": "team--a-other", "uid": "v",
         "maxRunningJobs": 1}).encode(), 21)
    assert isinstance(placement.resolve("team--a-other"), Route)
    # The cutover ends: the record names the target under epoch + 1, no longer moving.
    assert placement.apply(TENANT_KEY, record("dedicated-b1", 2), 22)
    assert placement.resolve("team--a-acme") == Route(
        "team--a-acme", "dedicated-b1", 2, 1, "region-b", "http://127.0.0.1:9201")
    # A late copy of the moving record changes nothing.
    assert not placement.apply(TENANT_KEY, record(moving=True), 20)
    assert isinstance(placement.resolve("team--a-acme"), Route)


def test_a_record_without_the_moving_flag_is_not_moving() -> None:
    placement = full_map()
    placement.apply(TENANT_KEY, json.dumps({"cell": "shared-a1", "epoch": 1,
                                            "tenantId": "team--a-acme", "uid": "u",
                                            "maxRunningJobs": 5, "moving": False}).encode(), 20)
    assert isinstance(placement.resolve("team--a-acme"), Route)


def test_placement_records_round_trip_and_a_record_not_moving_encodes_as_before() -> None:
    still = PlacementRecord(cell="shared-a1", epoch=3, tenant_id="team--a-acme", uid="u-1",
                            max_running_jobs=5)
    moving = PlacementRecord(cell="shared-a1", epoch=3, tenant_id="team--a-acme", uid="u-1",
                             max_running_jobs=5, moving=True)
    for each in (still, moving):
        assert PlacementRecord.decode(each.encode()) == each
    # Byte for byte what records written before the flag existed (and after the quota's
    # rename) hold: ``delete`` compares the stored value with the encoding.
    assert still.encode() == (b'{"cell": "shared-a1", "epoch": 3, "maxRunningJobs": 5, '
                              b'"tenantId": "team--a-acme", "uid": "u-1"}')
    assert "moving" not in json.loads(still.encode())
    assert json.loads(moving.encode())["moving"] is True
    assert PlacementRecord.decode(still.encode()).moving is False


def test_a_record_with_the_keys_digest_lets_the_map_check_the_whole_key() -> None:
    from cellplane_operator.domain.routing import KeyCheck, key_digest

    key = "cpk_team--a-acme.s3cr3t"
    placement = PlacementMap()
    placement.apply(TENANT_KEY, PlacementRecord(
        cell="shared-a1", epoch=1, tenant_id="team--a-acme", uid="u", max_running_jobs=5,
        key_digest=key_digest(key)).encode(), 10)
    assert placement.check_key(key) is KeyCheck.VALID
    assert placement.check_key("cpk_team--a-acme.wrong") is KeyCheck.INVALID
    assert placement.check_key("cpk_nobody.s3cr3t") is KeyCheck.INVALID
    assert placement.check_key("not-a-key") is KeyCheck.INVALID
    # A record without the digest (written before the key, or by an older operator):
    # the cell decides, as before.
    placement.apply(TENANT_KEY, record(), 11)
    assert placement.check_key("cpk_team--a-acme.wrong") is KeyCheck.CELL_DECIDES
    placement.apply(TENANT_KEY, None, 12)
    assert placement.check_key(key) is KeyCheck.INVALID


def test_the_digest_is_written_only_once_known_so_older_records_encode_as_before() -> None:
    plain = PlacementRecord(cell="c", epoch=2, tenant_id="t", uid="u", max_running_jobs=1)
    assert b"keyDigest" not in plain.encode()
    with_digest = PlacementRecord(cell="c", epoch=2, tenant_id="t", uid="u", max_running_jobs=1,
                                  key_digest="ab" * 32)
    assert PlacementRecord.decode(with_digest.encode()) == with_digest
    assert PlacementRecord.decode(plain.encode()) == plain


# What an operator before issue #23 wrote: the quota under ``maxRunning``.
FORMER = (b'{"cell": "shared-a1", "epoch": 3, "maxRunning": 5, '
          b'"tenantId": "team--a-acme", "uid": "u-1"}')


def test_a_record_written_before_the_quotas_rename_is_read_with_its_quota() -> None:
    assert PlacementRecord.decode(FORMER) == PlacementRecord(
        cell="shared-a1", epoch=3, tenant_id="team--a-acme", uid="u-1", max_running_jobs=5)
    # Written again, it takes the one name.
    assert b'"maxRunningJobs": 5' in PlacementRecord.decode(FORMER).encode()
    both = json.loads(FORMER) | {"maxRunningJobs": 7}
    assert PlacementRecord.decode(json.dumps(both).encode()).max_running_jobs == 7


async def test_delete_removes_a_formerly_encoded_record_only_if_it_is_the_same() -> None:
    store = InMemoryStore()
    records = PlacementRecords(store)
    tenant = TenantKey("team-a", "acme")
    await store.put(records.key(tenant), FORMER)
    read = await records.read(tenant)
    assert read is not None
    # Another decision's record (a later epoch) is not this one: kept.
    assert not await records.delete(tenant, replace(read.record, epoch=4), guard=[])
    assert await store.get(records.key(tenant)) is not None
    assert await records.delete(tenant, read.record, guard=[])
    assert await store.get(records.key(tenant)) is None
    # Gone already: nothing to delete.
    assert not await records.delete(tenant, read.record, guard=[])
