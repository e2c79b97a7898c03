"""The CellController's whole loop (acceptance, loads, the deletion guard) over the fakes of
every port, wired as runtime/region.py wires it (tests/regionfakes.py): the placement
leader says of every Cell whether it can be carried out, counts its tenants into its
status, and keeps its finalizer while any tenant is placed in it.
tests/integration/test_placement.py and test_cell_deletion_guard.py run the same on the
real apiserver, etcd and cells.

Every wait is for a condition, never a fixed time.
"""

from __future__ import annotations

from typing import Any

from cellplane_operator.kube import CELLS, TENANTS
from cellplane_operator.runtime.context import FINALIZER
from regionfakes import Plane, condition, eventually

NS = "team"
CELL_EVENTS = "default"
"""Where the fake apiserver keeps the Events of cluster-scoped objects."""


async def accepted_where(plane: Plane, name: str, what: str, test: Any) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await plane.cell_status(name)
        found = condition(status, "Accepted")
        return status if found and test(found) else None
    return await eventually(probe, f"cell {name}: {what}")


async def events(plane: Plane, cell: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await plane.events(CELL_EVENTS, cell) if e["reason"] == reason]


async def tenant_ready(plane: Plane, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await plane.tenant_status(name, NS)
        return status if status.get("phase") == "Ready" else None
    return await eventually(probe, f"tenant {name} to be Ready")


async def test_a_cell_of_the_deployment_is_accepted_and_holds_the_finalizer(plane: Plane) -> None:
    await plane.ready_cell("a1")
    await plane.operator(regions=("region-a", "region-b"))

    status = await accepted_where(plane, "a1", "Accepted", lambda c: c["status"] == "True")
    assert condition(status, "Accepted")["reason"] == "Accepted"
    # The site's status is left as the site wrote it: the leader patches only its own fields.
    assert status["phase"] == "Ready" and status["endpoints"]["admin"]
    cell = await plane.kube.get(CELLS, "a1")
    assert cell is not None and FINALIZER in cell["metadata"]["finalizers"]
    assert await events(plane, "a1", "Accepted") == []


async def test_a_cell_in_a_region_nobody_runs_is_refused_with_a_condition_said_once(
        plane: Plane) -> None:
    await plane.operator(regions=("region-a", "region-b"))
    await plane.kube.create(CELLS, {
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": "z1"},
        "spec": {"region": "region-z", "tier": "shared",
                 "capacity": {"tenants": 10, "workerSlots": 40}}})

    status = await accepted_where(plane, "z1", "refused", lambda c: c["status"] == "False")
    refused = condition(status, "Accepted")
    assert refused["reason"] == "UnknownRegion" and "region-z" in refused["message"]
    # No site runs it, so nobody else would say anything: the leader says Pending.
    assert status["phase"] == "Pending"

    async def warned() -> list[dict[str, Any]] | None:
        return await events(plane, "z1", "UnknownRegion") or None
    said = await eventually(warned, "the UnknownRegion Warning")
    assert [e["type"] for e in said] == ["Warning"]
    # Said once: a change of the cell reconciles it again without a second Warning.
    await plane.kube.patch(CELLS, "z1", {"metadata": {"labels": {"touched": "yes"}}})
    await plane.kube.patch(CELLS, "z1", {"spec": {"capacity": {"tenants": 9}}})
    await accepted_where(plane, "z1", "the new generation judged",
                         lambda c: c.get("observedGeneration") == 2)
    assert len(await events(plane, "z1", "UnknownRegion")) == 1


async def test_a_capacity_shrunk_below_what_is_placed_is_refused_naming_the_field(
        plane: Plane) -> None:
    await plane.ready_cell("a1")
    await plane.operator()
    for name in ("one", "two"):
        await plane.create_tenant(name, NS)
        await tenant_ready(plane, name)

    await plane.kube.patch(CELLS, "a1", {"spec": {"capacity": {"tenants": 1}}})

    status = await accepted_where(plane, "a1", "CapacityBelowUse",
                                  lambda c: c["reason"] == "CapacityBelowUse")
    assert "spec.capacity.tenants is 1 but 2 tenants are placed" in condition(
        status, "Accepted")["message"]


async def test_the_cells_load_follows_its_tenants(plane: Plane) -> None:
    await plane.ready_cell("a1")
    await plane.operator()
    await plane.create_tenant("one", NS)
    await plane.create_tenant("two", NS, quotas={"maxRunningJobs": 7})
    for name in ("one", "two"):
        await tenant_ready(plane, name)

    async def load_is(tenants: int, slots: int) -> dict[str, Any] | None:
        status = await plane.cell_status("a1")
        return status if (status.get("tenants"), status.get("slotsInUse")) == (tenants, slots) \
            else None

    async def two_placed() -> dict[str, Any] | None:
        return await load_is(2, 5 + 7)
    await eventually(two_placed, "cell a1 to count both tenants and their slots")

    await plane.kube.delete(TENANTS, "two", namespace=NS)

    async def one_left() -> dict[str, Any] | None:
        return await load_is(1, 5)
    await eventually(one_left, "cell a1 to count the tenant that is left")


async def test_a_cell_is_not_deleted_while_a_tenant_is_placed_in_it(plane: Plane) -> None:
    await plane.ready_cell("a1")
    await plane.operator()
    await plane.create_tenant("acme", NS)
    await tenant_ready(plane, "acme")
    await accepted_where(plane, "a1", "Accepted", lambda c: c["status"] == "True")

    await plane.kube.delete(CELLS, "a1")

    async def blocked() -> list[dict[str, Any]] | None:
        return await events(plane, "a1", "DeletionBlocked") or None
    said = (await eventually(blocked, "the DeletionBlocked Warning"))[0]
    assert said["type"] == "Warning" and "team/acme" in said["message"]
    cell = await plane.kube.get(CELLS, "a1")
    assert cell is not None and cell["metadata"].get("deletionTimestamp")
    assert FINALIZER in cell["metadata"]["finalizers"]

    # The tenant leaves (its cell still serves, so it is removed from it): the cell goes.
    await plane.kube.delete(TENANTS, "acme", namespace=NS)

    async def gone() -> bool:
        return await plane.kube.get(CELLS, "a1") is None
    await eventually(gone, "cell a1 to be deleted once it holds no tenant")
    assert len(await events(plane, "a1", "DeletionBlocked")) == 1
