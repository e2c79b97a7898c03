"""The in-package fake of cells' admin APIs answers as a real cell does (the contract of
tests/cellcontract.py, also run on a real cell over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cellcontract import CHECKS, REFUSED_URL, Check
from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.cellmemory import InMemoryCells
from cellplane_operator.clock import SystemClock
from cellplane_operator.errors import CellApiError
from cellplane_cells.moves import SCOPE_TABLES
from cellplane_operator.cellmemory.moves import MOVE_TABLES
from cellplane_operator.runtime.movecopy import TABLES, CellEnd, TenantCopy

ADMIN = "http://cell-a.test:9001"
OTHER = "http://cell-b.test:9001"
SECRET = "webhook-secret-0123456789"
TOKEN = "admin-token-for-tests-0123456789"


@dataclass
class FakeHarness:
    cells: CellAdmin
    admin: str = ADMIN
    token: str = TOKEN
    allowed: str = "http://127.0.0.1:9"
    dead_admin: str = "http://cell-gone.test:9001"


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_fake_keeps_the_cell_contract(check: Check) -> None:
    cells = InMemoryCells()
    cells.add(ADMIN, token=TOKEN, allow_private=True)
    await check(FakeHarness(cells), "contract-")


async def test_an_unreachable_cell_answers_nothing_and_keeps_its_tenants() -> None:
    cells = InMemoryCells()
    cell = cells.add(ADMIN, token=TOKEN)
    await cells.put_tenant(ADMIN, TOKEN, "t1", {"plan": "pro"})
    for cut in ("cell", "all"):
        if cut == "cell":
            cell.unreachable = True
        else:
            cells.unreachable = True
        with pytest.raises(CellApiError) as error:
            await cells.delete_tenant(ADMIN, TOKEN, "t1", purge=True)
        assert error.value.status == 0
        cell.unreachable = cells.unreachable = False
    assert "t1" in cell.tenants


async def test_private_targets_are_refused_unless_the_cell_allows_them() -> None:
    cells = InMemoryCells()
    strict, relaxed = cells.add(ADMIN, token=TOKEN), cells.add("http://relaxed.test", token=TOKEN,
                                                         allow_private=True)
    for admin in (strict.admin, relaxed.admin):
        await cells.put_tenant(admin, TOKEN, "t1", {"plan": "pro"})
    with pytest.raises(CellApiError) as refused:
        await cells.put_endpoints(ADMIN, TOKEN, "t1", [("a", "http://10.1.2.3/x")], [],
                                  "webhook-secret-0123456789")
    assert refused.value.code == "target_refused" and "targets[0].url" in refused.value.detail
    await cells.put_endpoints(relaxed.admin, TOKEN, "t1", [("a", "http://10.1.2.3/x")], [],
                              "webhook-secret-0123456789")
    assert relaxed.tenants["t1"].targets == {"a": "http://10.1.2.3/x"}
    # A public name is accepted by both (no DNS: the fake resolves it to a public address).
    await cells.put_target(ADMIN, TOKEN, "t1", "pub", "https://hooks.example.com/x")
    with pytest.raises(CellApiError):
        await cells.put_target(relaxed.admin, TOKEN, "t1", "meta", REFUSED_URL)


async def test_a_tenant_copied_between_two_fake_cells_ends_equal_and_served_by_the_target(
        ) -> None:
    """The whole data path of a move over the fake (TenantCopy, as the move controller
    drives it): the bulk copy, a change made meanwhile caught up, the freeze, the last
    changes, equal checksums, the target activated and the source kept read-only."""
    cells = InMemoryCells()
    for admin in (ADMIN, OTHER):
        cells.add(admin, token=TOKEN, allow_private=True)
    await cells.put_tenant(ADMIN, TOKEN, "t1", {"plan": "pro", "max_running_jobs": 3})
    await cells.put_endpoints(ADMIN, TOKEN, "t1", [("a", "http://127.0.0.1:9/a")],
                              [("http://127.0.0.1:9/hook", 2)], SECRET)
    copy = TenantCopy(cells, tenant_id="t1", move_id="m1", source=CellEnd("a", ADMIN, TOKEN),
                      target=CellEnd("b", OTHER, TOKEN), target_epoch=2, clock=SystemClock())
    assert (await copy.start())["targets"] == 1

    async def page(rows: int) -> bool:
        return True
    for table in TABLES:
        await copy.copy_table(table, page)
    await cells.put_target(ADMIN, TOKEN, "t1", "b", "http://127.0.0.1:9/b")
    assert (await copy.catch_up()).rows == 1
    await copy.freeze_source(1.0)
    with pytest.raises(CellApiError, match="tenant_moving"):
        await cells.put_target(ADMIN, TOKEN, "t1", "c", "http://127.0.0.1:9/c")
    assert await copy.drain() == 0
    source, target = await copy.checksums()
    assert source == target and target["targets"]["rows"] == 2
    await copy.activate_target()
    await copy.finish_source(60)
    moved, kept = cells.cell(OTHER).tenants["t1"], cells.cell(ADMIN).tenants["t1"]
    assert (moved.state, moved.epoch, moved.quotas, moved.targets) == (
        "active", 2, {"max_running_jobs": 3}, {"a": "http://127.0.0.1:9/a", "b": "http://127.0.0.1:9/b"})
    assert (kept.state, kept.retain_seconds) == ("moved", 60)



def test_the_operator_copies_every_table_of_a_cells_move_in_the_cells_order() -> None:
    """A table in the cell's scope that the operator does not page stays behind in the
    source when the tenant moves (schedules did, before migration 0013); the order is
    the one the target applies (jobs before their steps, schedules before their runs)."""
    assert TABLES == SCOPE_TABLES == MOVE_TABLES


async def test_a_cancelled_move_leaves_the_source_serving_and_the_target_empty() -> None:
    cells = InMemoryCells()
    for admin in (ADMIN, OTHER):
        cells.add(admin, token=TOKEN)
    await cells.put_tenant(ADMIN, TOKEN, "t1", {"plan": "pro"})
    copy = TenantCopy(cells, tenant_id="t1", move_id="m1", source=CellEnd("a", ADMIN, TOKEN),
                      target=CellEnd("b", OTHER, TOKEN), target_epoch=2, clock=SystemClock())
    await copy.start()

    async def page(rows: int) -> bool:
        return True
    await copy.copy_table("tenant", page)
    await copy.freeze_source()
    await copy.discard()
    assert "t1" not in cells.cell(OTHER).tenants
    source = cells.cell(ADMIN).tenants["t1"]
    assert (source.state, source.move_id, source.changes) == ("active", None, [])
