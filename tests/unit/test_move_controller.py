"""The MoveController's whole loop (admission, copy, catch-up, cutover, completion, abort,
refusal, takeover, a change of leader) over the fakes of every port, wired as
runtime/region.py wires it (tests/regionfakes.py). tests/integration/test_tenant_moves.py
runs moves on real cells, etcd and the apiserver.

Every wait is for a condition, never a fixed time. A copy is held in the middle by the
fake cells' ``page_gate``, so what a test does "during the copy" happens there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cellplane_operator.cellmemory import FakeCell
from cellplane_operator.kube import CELLS, TENANTMOVES
from cellplane_operator.placement.records import TenantKey
from cellplane_operator.runtime import movedata
from regionfakes import Plane, condition, eventually

NS = "team"
TARGET = "http://127.0.0.1:8080/run"
"""Loopback: a cell that allows no private targets refuses it."""


class CopyGate:
    """Holds the first page of ``table`` a move's copy reads until ``release``."""

    def __init__(self, table: str = "targets") -> None:
        self.table = table
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, cell: FakeCell, tenant_id: str, table: str) -> None:
        if table == self.table and not self.released.is_set():
            self.reached.set()
            await self.released.wait()

    def release(self) -> None:
        self.released.set()


async def placed_in_a1(plane: Plane, **spec: Any) -> tuple[FakeCell, FakeCell, str]:
    """Tenant acme Ready in shared cell a1, and an empty shared cell a2 beside it: the
    source's and the target's fakes, and the tenant's id."""
    source = await plane.ready_cell("a1")
    await plane.create_tenant("acme", NS, targets=[{"name": "default", "url": TARGET}], **spec)

    async def ready() -> dict[str, Any] | None:
        status = await plane.tenant_status("acme", NS)
        return status if status.get("phase") == "Ready" else None
    status = await eventually(ready, "tenant acme Ready")
    assert status["cell"] == "a1"
    return source, await plane.ready_cell("a2", allow_private=spec.pop("private", True)), \
        str(status["tenantId"])


async def move_where(plane: Plane, name: str, what: str, test: Any, *,
                     timeout: float = 15.0) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await plane.move_status(name, NS)
        return status if test(status) else None
    return await eventually(probe, f"move {name}: {what}", timeout=timeout)


def in_phase(*phases: str) -> Any:
    return lambda status: status.get("phase") in phases


async def record(plane: Plane) -> tuple[str, int, bool]:
    found = (await plane.records())[TenantKey(NS, "acme")]
    return found.cell, found.epoch, found.moving


def move_starts(plane: Plane, tenant_id: str) -> int:
    """How often a move out of the tenant was started (a new copy each time)."""
    return sum(1 for r in plane.cells.requests
               if r.startswith("POST ") and r.endswith(f"/tenants/{tenant_id}/move-out"))


async def test_a_move_to_another_shared_cell_completes_and_the_source_keeps_the_rows_disabled(
        plane: Plane) -> None:
    await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane)
    assert await record(plane) == ("a1", 1, False)

    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    status = await move_where(plane, "to-a2", "Completed", in_phase("Completed", "Failed"))

    assert (status["phase"], status["sourceCell"], status["targetCell"]) == (
        "Completed", "a1", "a2")
    assert condition(status, "Completed")["status"] == "True"
    progress = status["progress"]
    assert progress["rowsCopied"] >= progress["rowsTotal"] >= 3  # tenant, wallet, target
    assert progress["currentDelta"] == 0 and "pauseSeconds" in progress
    assert await record(plane) == ("a2", 2, False)
    moved, kept = target.tenants[tenant_id], source.tenants[tenant_id]
    assert (moved.state, moved.targets) == ("active", {"default": TARGET})
    assert (kept.state, kept.retain_seconds, kept.targets) == ("moved", 86400,
                                                               {"default": TARGET})

    async def serves_from_a2() -> bool:
        return (await plane.tenant_status("acme", NS)).get("cell") == "a2"
    await eventually(serves_from_a2, "the Tenant's status to name cell a2")
    reasons = [e["reason"] for e in await plane.events(NS, "to-a2")]
    assert "Started" in reasons and "Completed" in reasons


async def test_an_abort_during_the_copy_leaves_the_tenant_in_its_source(plane: Plane) -> None:
    await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane)
    gate = plane.cells.page_gate = CopyGate()
    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    await eventually(lambda: _set(gate.reached), "the copy to reach the targets")

    await plane.kube.patch(TENANTMOVES, "to-a2", {"spec": {"abort": True}}, namespace=NS)
    gate.release()
    status = await move_where(plane, "to-a2", "Aborted", in_phase("Aborted", "Completed"))

    assert status["phase"] == "Aborted"
    assert "stays in cell a1" in condition(status, "Completed")["message"]
    assert await record(plane) == ("a1", 1, False)
    kept = source.tenants[tenant_id]
    assert (kept.state, kept.move_id, kept.changes) == ("active", None, [])
    assert tenant_id not in target.tenants


async def test_a_copy_that_does_not_verify_fails_the_move_and_leaves_the_tenant_in_its_source(
        plane: Plane) -> None:
    await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane)

    async def tamper(cell: FakeCell, tenant: str, table: str) -> None:
        # After the targets are across: a copy bug's leftover, never sent again.
        if table == "jobs" and tenant in target.tenants:
            target.tenants[tenant].targets["default"] = "http://127.0.0.1:9/tampered"
    plane.cells.page_gate = tamper
    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    status = await move_where(plane, "to-a2", "Failed", in_phase("Failed", "Completed"))

    failed = condition(status, "Completed")
    assert (status["phase"], failed["reason"]) == ("Failed", "VerificationFailed")
    assert "targets" in failed["message"] and "stays in cell a1" in failed["message"]
    assert await record(plane) == ("a1", 1, False)
    kept = source.tenants[tenant_id]
    assert (kept.state, kept.move_id, kept.targets) == ("active", None, {"default": TARGET})
    assert tenant_id not in target.tenants


async def test_a_target_that_refuses_the_tenants_urls_fails_the_move_with_the_reason(
        plane: Plane) -> None:
    await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane, private=False)

    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    status = await move_where(plane, "to-a2", "Failed", in_phase("Failed", "Completed"))

    accepted = condition(status, "Accepted")
    assert (status["phase"], accepted["reason"]) == ("Failed", "TargetRefusesUrls")
    assert TARGET in accepted["message"]
    assert move_starts(plane, tenant_id) == 0 and tenant_id not in target.tenants
    assert await record(plane) == ("a1", 1, False)


async def test_a_full_target_fails_the_move_at_its_progress_deadline(plane: Plane) -> None:
    await plane.operator(move_progress_deadline_seconds=1.0)
    source = await plane.ready_cell("a1")
    await plane.create_tenant("acme", NS)
    await plane.ready_cell("a2", slots=1)  # the pro plan runs 5 jobs at once

    async def placed() -> bool:
        return (await plane.tenant_status("acme", NS)).get("cell") == "a1"
    await eventually(placed, "tenant acme placed in a1")
    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    status = await move_where(plane, "to-a2", "Failed", in_phase("Failed", "Completed"))

    accepted = condition(status, "Accepted")
    assert (status["phase"], accepted["reason"]) == ("Failed", "TargetFull")
    assert "did not pass within 1s" in accepted["message"]
    assert await record(plane) == ("a1", 1, False)
    assert all(t.state == "active" for t in source.tenants.values())


async def test_long_copies_take_turns_on_one_worker_each_carrying_on_from_its_cursor(
        plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page ends its copy's slice: two moves on one worker interleave their pages
    instead of one copy holding the worker until it is done, and each slice carries on
    where the last one stopped (the copy is started once)."""
    monkeypatch.setattr(movedata, "_COPY_SLICE_SECONDS", 0.0)
    await plane.operator(move_workers=1)
    source = await plane.ready_cell("a1")
    ids = []
    for name in ("acme", "beta"):
        await plane.create_tenant(name, NS)

        async def placed(name: str = name) -> str | None:
            status = await plane.tenant_status(name, NS)
            return str(status["tenantId"]) if status.get("phase") == "Ready" else None
        ids.append(await eventually(placed, f"tenant {name} Ready in a1"))
    acme, beta = ids
    await plane.ready_cell("a2")
    for tenant in (acme, beta):  # three pages of targets each (2,000 rows a page)
        source.tenants[tenant].targets.update(
            {f"t{i}": f"http://127.0.0.1:9/{i}" for i in range(4500)})
    reads: list[str] = []

    async def record_reads(cell: FakeCell, tenant: str, table: str) -> None:
        if table == "targets":
            reads.append(tenant)
    plane.cells.page_gate = record_reads
    await plane.create_move("acme-to-a2", NS, "acme", targetCell="a2")
    await plane.create_move("beta-to-a2", NS, "beta", targetCell="a2")
    for name in ("acme-to-a2", "beta-to-a2"):
        status = await move_where(plane, name, "Completed", in_phase("Completed", "Failed"))
        assert status["phase"] == "Completed" and status["progress"]["rowsCopied"] > 4500

    assert move_starts(plane, acme) == move_starts(plane, beta) == 1
    first_beta = reads.index(beta)
    assert acme in reads[first_beta:] or beta in reads[:reads.index(acme)], reads


async def test_a_takeover_in_the_source_during_the_copy_starts_the_copy_again(
        plane: Plane) -> None:
    await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane)
    gate = plane.cells.page_gate = CopyGate()
    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    await eventually(lambda: _set(gate.reached), "the copy to reach the targets")
    before = await move_where(plane, "to-a2", "copying", in_phase("Copying"))
    assert before["sourceCellEpoch"] == 1

    # Another site of cell a1 took over: its placement-group epoch is raised.
    await plane.kube.patch(CELLS, "a1", {"status": {"epoch": 2}}, subresource="status")
    gate.release()
    status = await move_where(plane, "to-a2", "Completed", in_phase("Completed", "Failed"))

    assert status["phase"] == "Completed" and status["sourceCellEpoch"] == 2
    assert move_starts(plane, tenant_id) == 2
    assert "CellTookOver" in [e["reason"] for e in await plane.events(NS, "to-a2")]
    assert await record(plane) == ("a2", 2, False)
    assert target.tenants[tenant_id].targets == {"default": TARGET}


async def test_a_new_leader_continues_a_move_its_predecessor_left_in_the_middle(
        plane: Plane) -> None:
    first = await plane.operator()
    source, target, tenant_id = await placed_in_a1(plane)
    second = await plane.operator()
    assert await plane.leader() is first
    gate = plane.cells.page_gate = CopyGate()
    await plane.create_move("to-a2", NS, "acme", targetCell="a2")
    await eventually(lambda: _set(gate.reached), "the copy to reach the targets")
    await move_where(plane, "to-a2", "copying", in_phase("Copying"))

    await first.stop()
    assert await plane.leader() is second
    gate.release()
    status = await move_where(plane, "to-a2", "Completed", in_phase("Completed", "Failed"),
                              timeout=20.0)

    assert status["phase"] == "Completed"
    assert await record(plane) == ("a2", 2, False)
    assert "cell activate_move_in" in " ".join(second.writes)
    assert not any(w.startswith(("cell activate_move_in", "cell finish_move_out"))
                   for w in first.writes)
    assert (target.tenants[tenant_id].state, source.tenants[tenant_id].state) == (
        "active", "moved")


async def _set(event: asyncio.Event) -> bool:
    return event.is_set()
