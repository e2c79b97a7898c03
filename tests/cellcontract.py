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
    await put(harness, tenant, api_key=f"{KEY}-{prefix}", max_running=3)
    found = await harness.cells.checksums(harness.admin, harness.token, tenant)
    assert {"jobs", "targets", "webhooks"} <= set(found) and found["targets"]["rows"] == 0


@check
async def quotas_above_the_plan_are_refused(harness: Harness, prefix: str) -> None:
    with pytest.raises(CellApiError) as refused:
        await put(harness, f"{prefix}t", max_running=10_000)
    assert (refused.value.status, refused.value.code) == (422, "quota_out_of_range")


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
