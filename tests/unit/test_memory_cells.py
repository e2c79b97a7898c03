"""The in-package fake of cells' admin APIs answers as a real cell does (the contract of
tests/cellcontract.py, also run on a real cell over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cellcontract import CHECKS, REFUSED_URL, Check
from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.cellmemory import InMemoryCells
from cellplane_operator.errors import CellApiError

ADMIN = "http://cell-a.test:9001"
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


async def test_moves_are_left_to_real_cells() -> None:
    cells = InMemoryCells()
    cells.add(ADMIN, token=TOKEN)
    with pytest.raises(NotImplementedError, match="real cells"):
        await cells.start_move_out(ADMIN, TOKEN, "t1", "m1")
