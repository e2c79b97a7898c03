"""What every ``CellAdmin`` answers, as a real cell's admin API does, for the tenant part.

The same checks run on the in-memory fake (tests/unit/test_memory_cells.py) and on a real
cell's admin API over HTTP (tests/integration/test_cell_contract.py), so controllers
unit-tested on the fake meet the same answers from real cells. Everything is observed
through the port itself: what ``put_endpoints`` reports removed, what ``checksums``
finds, which ``CellApiError`` a call raises. Each check gets tenant ids of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import pytest

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.errors import CellApiError

REFUSED_URL = "http://169.254.169.254/latest/meta-data"
"""Link-local (cloud metadata): every cell refuses it, private targets allowed or not."""

KEY = "cpk_contract-key-0123456789abcdef"
SECRET = "webhook-secret-0123456789"


class Harness(Protocol):
    cells: CellAdmin
    admin: str
    """The admin base URL of a serving cell that allows private targets."""
    token: str
    allowed: str
    """A base URL the cell accepts as a target or webhook (no path)."""
    dead_admin: str
    """An admin base URL where nothing answers."""


Check = Callable[[Harness, str], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(function: Check) -> Check:
    CHECKS[function.__name__] = function
    return function


async def put(harness: Harness, tenant: str, **body: object) -> None:
    await harness.cells.put_tenant(harness.admin, harness.token, tenant,
                                   {"plan": "pro", **body})


@check
async def a_tenant_is_created_and_updated_by_put(harness: Harness, prefix: str) -> None:
    tenant = f"{prefix}t"
    with pytest.raises(CellApiError) as absent:
        await harness.cells.checksums(harness.admin, harness.token, tenant)
    assert (absent.value.status, absent.value.code) == (404, "not_found")
    await put(harness, tenant, api_key=f"{KEY}-{prefix}")
    await put(harness, tenant, api_key=f"{KEY}-{prefix}", max_running_jobs=3)
    found = await harness.cells.checksums(harness.admin, harness.token, tenant)
    assert {"jobs", "targets", "webhooks"} <= set(found) and found["targets"]["rows"] == 0


@check
async def quotas_above_the_plan_are_refused(harness: Harness, prefix: str) -> None:
    with pytest.raises(CellApiError) as refused:
        await put(harness, f"{prefix}t", max_running_jobs=10_000)
    assert (refused.value.status, refused.value.code) == (422, "quota_out_of_range")
    await put(harness, f"{prefix}t", strict_schedules=50)  # pro's ceiling
    with pytest.raises(CellApiError) as strict:
        await put(harness, f"{prefix}t", strict_schedules=51)
    assert (strict.value.status, strict.value.code) == (422, "quota_out_of_range")


@check
async def the_running_jobs_quota_takes_its_former_name_but_not_both(harness: Harness,
                                                                    prefix: str) -> None:
    tenant = f"{prefix}t"
    # What an operator from before the quota's rename (issue #23) sends.
    await put(harness, tenant, max_running=3)
    with pytest.raises(CellApiError) as over:
        await put(harness, tenant, max_running=10_000)
    assert (over.value.status, over.value.code) == (422, "quota_out_of_range")
    with pytest.raises(CellApiError) as both:
        await put(harness, tenant, max_running=3, max_running_jobs=3)
    assert (both.value.status, both.value.code) == (422, "invalid_request")


@check
async def the_endpoints_become_exactly_the_set_given(harness: Harness, prefix: str) -> None:
    tenant, url = f"{prefix}t", harness.allowed
    await put(harness, tenant)
    first = await harness.cells.put_endpoints(
        harness.admin, harness.token, tenant, [("a", f"{url}/a"), ("b", f"{url}/b")],
        [(f"{url}/hook", 2)], SECRET)
    assert first == {"targets_removed": 0, "webhooks_removed": 0}
    again = await harness.cells.put_endpoints(harness.admin, harness.token, tenant,
                                              [("a", f"{url}/a2")], [], SECRET)
    assert again == {"targets_removed": 1, "webhooks_removed": 1}
    found = await harness.cells.checksums(harness.admin, harness.token, tenant)
    assert found["targets"]["rows"] == 1


@check
async def a_refused_url_names_its_field_and_changes_nothing(harness: Harness, prefix: str) -> None:
    tenant, url = f"{prefix}t", harness.allowed
    await put(harness, tenant)
    await harness.cells.put_endpoints(harness.admin, harness.token, tenant,
                                      [("a", f"{url}/a")], [], SECRET)
    with pytest.raises(CellApiError) as refused:
        await harness.cells.put_endpoints(harness.admin, harness.token, tenant,
                                          [("b", f"{url}/b"), ("meta", REFUSED_URL)], [], SECRET)
    error = refused.value
    assert (error.status, error.code) == (422, "target_refused")
    assert "targets[1].url" in error.detail and REFUSED_URL in error.detail
    # Nothing changed: "a" is still the only target, so putting it alone removes nothing.
    assert await harness.cells.put_endpoints(harness.admin, harness.token, tenant,
                                             [("a", f"{url}/a")], [], SECRET) == {
        "targets_removed": 0, "webhooks_removed": 0}
    with pytest.raises(CellApiError) as one:
        await harness.cells.put_target(harness.admin, harness.token, tenant, "meta", REFUSED_URL)
    assert (one.value.status, one.value.code) == (422, "target_refused")


@check
async def the_check_of_urls_names_the_refused_fields(harness: Harness, prefix: str) -> None:
    refused = await harness.cells.refused_endpoints(
        harness.admin, harness.token, [("ok", f"{harness.allowed}/a"), ("meta", REFUSED_URL)],
        [REFUSED_URL])
    assert [(r["field"], r["url"]) for r in refused] == [
        ("targets[1].url", REFUSED_URL), ("webhooks[0].url", REFUSED_URL)]
    assert all(r["reason"] for r in refused)


@check
async def endpoints_of_an_absent_tenant_are_not_found(harness: Harness, prefix: str) -> None:
    with pytest.raises(CellApiError) as absent:
        await harness.cells.put_target(harness.admin, harness.token, f"{prefix}none", "a",
                                       f"{harness.allowed}/a")
    assert (absent.value.status, absent.value.code) == (404, "not_found")


@check
async def retain_keeps_the_tenant_and_purge_removes_it_both_idempotent(
        harness: Harness, prefix: str) -> None:
    kept, purged = f"{prefix}kept", f"{prefix}purged"
    for tenant in (kept, purged):
        await put(harness, tenant)
    for _ in range(2):
        await harness.cells.delete_tenant(harness.admin, harness.token, kept, purge=False)
        await harness.cells.delete_tenant(harness.admin, harness.token, purged, purge=True)
    assert "targets" in await harness.cells.checksums(harness.admin, harness.token, kept)
    with pytest.raises(CellApiError) as gone:
        await harness.cells.checksums(harness.admin, harness.token, purged)
    assert gone.value.status == 404
    # A retained tenant is made active again by a PUT (a Tenant re-placed here).
    await put(harness, kept)
    await harness.cells.delete_tenant(harness.admin, harness.token, f"{prefix}never", purge=True)


@check
async def a_wrong_token_is_unauthenticated(harness: Harness, prefix: str) -> None:
    with pytest.raises(CellApiError) as refused:
        await harness.cells.put_tenant(harness.admin, "not-the-token", f"{prefix}t",
                                       {"plan": "pro"})
    assert (refused.value.status, refused.value.code) == (401, "unauthenticated")


@check
async def a_cell_that_does_not_answer_is_status_0(harness: Harness, prefix: str) -> None:
    with pytest.raises(CellApiError) as unreachable:
        await harness.cells.put_tenant(harness.dead_admin, harness.token, f"{prefix}t",
                                       {"plan": "pro"})
    assert (unreachable.value.status, unreachable.value.code) == (0, "")


# -- tenant moves: the source's half, and the target's refusals (one cell) ----------------


async def all_rows(harness: Harness, tenant: str, table: str, limit: int) -> list[object]:
    """Every row of ``table`` a move out pages across (a page may be empty or end exactly
    at its limit with a cursor still given: only a None cursor ends it)."""
    rows: list[object] = []
    after: str | None = None
    for _ in range(100):
        page, after = await harness.cells.move_out_rows(harness.admin, harness.token, tenant,
                                                        table, after, limit)
        rows.extend(page)
        if after is None:
            return rows
    raise AssertionError(f"paging {table} never ended")


async def moving_tenant(harness: Harness, prefix: str, move: str) -> str:
    """A tenant with two targets whose move out has started."""
    tenant, url = f"{prefix}m", harness.allowed
    await put(harness, tenant)
    await harness.cells.put_endpoints(harness.admin, harness.token, tenant,
                                      [("a", f"{url}/a"), ("b", f"{url}/b")], [], SECRET)
    totals = await harness.cells.start_move_out(harness.admin, harness.token, tenant, move)
    assert (totals["tenant"], totals["targets"], totals["jobs"]) == (1, 2, 0)
    return tenant


@check
async def a_move_out_pages_the_scope_and_captures_what_changes_after(
        harness: Harness, prefix: str) -> None:
    cells, admin, token, url = harness.cells, harness.admin, harness.token, harness.allowed
    tenant = await moving_tenant(harness, prefix, "move-1")
    assert len(await all_rows(harness, tenant, "targets", 1)) == 2
    assert len(await all_rows(harness, tenant, "tenant", 10)) == 1
    nothing = await cells.move_out_changes(admin, token, tenant, 0, 100)
    assert (nothing["pending"], nothing["rows"], nothing["deletes"]) == (0, {}, {})
    # One target changed, one removed: the change comes as the row now, the removal as a key.
    await cells.put_endpoints(admin, token, tenant, [("a", f"{url}/a2")], [], SECRET)
    changed = await cells.move_out_changes(admin, token, tenant, 0, 100)
    assert len(changed["rows"]["targets"]) == 1 and len(changed["deletes"]["targets"]) == 1
    assert changed["pending"] == 0 and changed["last_seq"] > 0
    # Read one entry at a time, the rest is pending; after the last, nothing is.
    first = await cells.move_out_changes(admin, token, tenant, 0, 1)
    assert first["pending"] == 1
    after = await cells.move_out_changes(admin, token, tenant, changed["last_seq"], 100)
    assert (after["rows"], after["last_seq"], after["pending"]) == ({}, changed["last_seq"], 0)
    # Cancelled: capture stops, cancelling again is done, and another move may start.
    for _ in range(2):
        await cells.cancel_move_out(admin, token, tenant, "move-1")
    await cells.start_move_out(admin, token, tenant, "move-2")
    fresh = await cells.move_out_changes(admin, token, tenant, 0, 100)
    assert (fresh["rows"], fresh["pending"]) == ({}, 0)


@check
async def a_frozen_tenant_refuses_writes_until_unfrozen(harness: Harness, prefix: str) -> None:
    cells, admin, token, url = harness.cells, harness.admin, harness.token, harness.allowed
    tenant = await moving_tenant(harness, prefix, "move-1")
    for _ in range(2):
        await cells.freeze_move_out(admin, token, tenant, "move-1", 2, within_seconds=5.0)
    with pytest.raises(CellApiError) as fenced:
        await cells.put_endpoints(admin, token, tenant, [("c", f"{url}/c")], [], SECRET)
    assert (fenced.value.status, fenced.value.code) == (503, "tenant_moving")
    with pytest.raises(CellApiError) as other:
        await cells.start_move_out(admin, token, tenant, "move-2")
    assert (other.value.status, other.value.code) == (409, "tenant_not_movable")
    with pytest.raises(CellApiError) as mismatch:
        await cells.freeze_move_out(admin, token, tenant, "move-2", 2)
    assert (mismatch.value.status, mismatch.value.code) == (409, "move_mismatch")
    for _ in range(2):
        await cells.unfreeze_move_out(admin, token, tenant, "move-1", 1)
    await cells.put_endpoints(admin, token, tenant, [("c", f"{url}/c")], [], SECRET)
    assert (await cells.checksums(admin, token, tenant))["targets"]["rows"] == 1


@check
async def a_finished_move_out_keeps_the_rows_read_only(harness: Harness, prefix: str) -> None:
    cells, admin, token, url = harness.cells, harness.admin, harness.token, harness.allowed
    tenant = await moving_tenant(harness, prefix, "move-1")
    await cells.freeze_move_out(admin, token, tenant, "move-1", 2)
    for _ in range(2):
        await cells.finish_move_out(admin, token, tenant, "move-1", 3600)
    assert (await cells.checksums(admin, token, tenant))["targets"]["rows"] == 2
    for call, code in ((cells.cancel_move_out(admin, token, tenant, "move-1"), "move_finished"),
                       (cells.start_move_out(admin, token, tenant, "move-2"),
                        "tenant_not_movable")):
        with pytest.raises(CellApiError) as refused:
            await call
        assert (refused.value.status, refused.value.code) == (409, code)
    with pytest.raises(CellApiError) as fenced:
        await cells.put_endpoints(admin, token, tenant, [("c", f"{url}/c")], [], SECRET)
    assert (fenced.value.status, fenced.value.code) == (503, "tenant_moving")


@check
async def a_move_in_refuses_what_is_not_its_copy(harness: Harness, prefix: str) -> None:
    cells, admin, token = harness.cells, harness.admin, harness.token
    here, absent = f"{prefix}here", f"{prefix}absent"
    await put(harness, here)
    with pytest.raises(CellApiError) as exists:
        await cells.move_in(admin, token, here, "move-1", 2, rows={})
    assert (exists.value.status, exists.value.code) == (409, "tenant_exists")
    with pytest.raises(CellApiError) as headless:
        await cells.move_in(admin, token, absent, "move-1", 2, rows={"targets": []})
    assert (headless.value.status, headless.value.code) == (409, "invalid_bundle")
    with pytest.raises(CellApiError) as active:
        await cells.cancel_move_in(admin, token, here, "move-1")
    assert (active.value.status, active.value.code) == (409, "tenant_active")
    with pytest.raises(CellApiError) as nothing:
        await cells.activate_move_in(admin, token, absent, "move-1")
    assert (nothing.value.status, nothing.value.code) == (404, "not_found")
    await cells.cancel_move_in(admin, token, absent, "move-1")
