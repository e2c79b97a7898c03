"""Placement, decided purely: shared and dedicated cells, pins, HOME_ASYNC, names, many in a row."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellplane_operator.domain.cells import CellName, Region, Tier
from cellplane_operator.domain.placement import (
    CellCandidate, CellLoad, CreateDedicatedCell, Outcome, PlaceIn, PlacementRequest, Placer,
    RegionPolicy, Unplaceable, UnplaceableReason, WaitForCell, WaitReason, candidate_phase,
    cell_loads, dedicated_cell_name, load_to_publish, place, tenant_id,
)

A = Region("region-a")
B = Region("region-b")
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def cell(name: str, *, region: Region = A, tier: Tier = Tier.SHARED, phase: str = "Ready",
         draining: bool = False, standby: bool = False, capacity: int = 50, slots: int = 200,
         tenants: int = 0, used: int = 0) -> CellCandidate:
    return CellCandidate(name=CellName(name), region=region, tier=tier, ready=phase == "Ready",
                         phase=phase, draining=draining, has_standby=standby,
                         tenant_capacity=capacity, worker_slots=slots, tenants_placed=tenants,
                         slots_in_use=used)


def request(max_running_jobs: int = 5, *, namespace: str = "acme", name: str = "prod",
            isolation: Tier = Tier.SHARED, region: Region = A,
            policy: RegionPolicy = RegionPolicy.SINGLE_REGION,
            pinned: str | None = None) -> PlacementRequest:
    return PlacementRequest(namespace=namespace, name=name, isolation=isolation, home_region=region,
                            region_policy=policy, max_running_jobs=max_running_jobs, pinned_cell=pinned)


def unplaceable(outcome: Outcome, reason: UnplaceableReason) -> str:
    assert isinstance(outcome, Unplaceable), outcome
    assert outcome.reason == reason, outcome
    return outcome.message


# --- shared cells ------------------------------------------------------------------------


def test_shared_tenant_goes_to_the_least_loaded_cell_of_its_home_region() -> None:
    cells = [cell("a1", used=100), cell("a2", used=40), cell("a3", used=60),
             cell("b1", region=B, used=0)]
    assert place(request(), cells) == PlaceIn(CellName("a2"))


def test_load_is_compared_after_adding_the_tenant_so_a_small_cell_does_not_fill_up_first() -> None:
    # Before adding, the empty 20-slot cell looks idlest (0% against 10%); after
    # adding 20 it would be full, the big cell at 20%.
    cells = [cell("small", slots=20), cell("big", slots=200, used=20)]
    assert place(request(20), cells) == PlaceIn(CellName("big"))
    assert place(request(1), cells) == PlaceIn(CellName("small"))  # 1/20 < 21/200


def test_equal_loads_are_broken_by_name() -> None:
    cells = [cell("c", used=10), cell("a", slots=400, used=40), cell("b", used=10)]
    # 45/400 is above 15/200; the two 200-slot cells tie at 15/200, and "b" < "c".
    assert place(request(5), cells) == PlaceIn(CellName("b"))
    same = [cell("z", slots=100, used=5), cell("y", slots=200, used=15)]  # 10/100 == 20/200
    assert place(request(5), same) == PlaceIn(CellName("y"))


@pytest.mark.parametrize("phase", ["Draining", "FailingOver", "Degraded", "Fenced", "Deleting",
                                   "Provisioning", "Pending"])
def test_cells_not_ready_are_never_chosen(phase: str) -> None:
    cells = [cell("busy", used=150), cell("idle", phase=phase)]
    assert place(request(), cells) == PlaceIn(CellName("busy"))


def test_a_draining_cell_is_never_chosen_even_while_its_phase_still_says_ready() -> None:
    cells = [cell("busy", used=150), cell("idle", draining=True)]
    assert place(request(), cells) == PlaceIn(CellName("busy"))


def test_dedicated_cells_are_never_chosen_for_shared_tenants() -> None:
    cells = [cell("busy", used=150), cell("t-other-tenant", tier=Tier.DEDICATED)]
    assert place(request(), cells) == PlaceIn(CellName("busy"))


def test_a_cell_needs_the_slots_and_room_for_one_more_tenant() -> None:
    cells = [cell("few-slots", used=197), cell("no-room", capacity=3, tenants=3),
             cell("fits", used=190)]
    assert place(request(5), cells) == PlaceIn(CellName("fits"))
    # Exactly the free slots fit.
    assert place(request(10), cells) == PlaceIn(CellName("fits"))


def test_no_cell_in_the_region_names_the_regions_that_have_some() -> None:
    message = unplaceable(place(request(region=Region("region-x")), [cell("a1"), cell("b1", region=B)]),
                          UnplaceableReason.NO_CELL_IN_REGION)
    assert "no shared cell in region region-x" in message
    assert "region-a, region-b" in message
    unplaceable(place(request(), []), UnplaceableReason.NO_CELL_IN_REGION)


def test_no_ready_cell_in_the_region_says_what_each_is_doing() -> None:
    cells = [cell("a2", phase="Fenced"), cell("a1", draining=True), cell("b1", region=B)]
    message = unplaceable(place(request(), cells), UnplaceableReason.NO_CELL_IN_REGION)
    assert message == ("no Ready shared cell in region region-a: a1 is Ready and draining "
                       "(spec.draining), a2 is Fenced")


def test_a_cell_still_starting_is_waited_for_not_refused() -> None:
    cells = [cell("a2", phase="Provisioning"), cell("a1", draining=True), cell("b1", region=B)]
    outcome = place(request(), cells)
    assert outcome == WaitForCell(CellName("a2"), WaitReason.NO_READY_CELL,
                                  "no shared cell in region region-a is Ready yet (a2 is "
                                  "Provisioning); the tenant is placed when one is")
    assert Placer(cells).place(request()) == outcome


def test_no_capacity_names_the_best_cell_and_its_numbers() -> None:
    cells = [cell("shared-a1", used=197), cell("shared-a2", used=199), cell("full", capacity=1,
                                                                             tenants=1)]
    message = unplaceable(place(request(5), cells), UnplaceableReason.NO_CAPACITY)
    assert message == ("no Ready shared cell in region region-a has 5 free worker slots "
                       "(best: shared-a1 with 3 of 200 free)")


def test_no_capacity_when_every_cell_holds_its_maximum_of_tenants() -> None:
    cells = [cell("a1", capacity=10, tenants=10), cell("a2", capacity=4, tenants=4)]
    message = unplaceable(place(request(1), cells), UnplaceableReason.NO_CAPACITY)
    assert message == ("every Ready shared cell in region region-a holds its maximum of tenants "
                       "(a1 10 of 10, a2 4 of 4)")


def test_zero_max_running_fits_a_full_cell_with_tenant_room() -> None:
    assert place(request(0), [cell("a1", used=200)]) == PlaceIn(CellName("a1"))


def test_negative_max_running_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        request(-1)


def test_duplicate_cell_names_are_refused() -> None:
    with pytest.raises(ValueError, match="two candidates"):
        place(request(), [cell("a1"), cell("a1")])


# --- HOME_ASYNC ----------------------------------------------------------------------------


def test_home_async_goes_only_to_cells_with_a_standby() -> None:
    cells = [cell("idle"), cell("busy-with-standby", standby=True, used=150)]
    assert place(request(policy=RegionPolicy.HOME_ASYNC), cells) == PlaceIn(
        CellName("busy-with-standby"))
    assert place(request(), cells) == PlaceIn(CellName("idle"))


def test_home_async_without_any_standby_cell_is_no_standby_cell() -> None:
    cells = [cell("a1"), cell("a2"), cell("a3", standby=True, phase="Degraded")]
    message = unplaceable(place(request(policy=RegionPolicy.HOME_ASYNC), cells),
                          UnplaceableReason.NO_STANDBY_CELL)
    assert "none of the 2 Ready shared cell(s) in region region-a has spec.standbyRegions" in message


def test_home_async_with_full_standby_cells_is_no_capacity() -> None:
    cells = [cell("a1"), cell("a2", standby=True, used=198)]
    message = unplaceable(place(request(5, policy=RegionPolicy.HOME_ASYNC), cells),
                          UnplaceableReason.NO_CAPACITY)
    assert message == ("no Ready shared cell with a standby region in region region-a has 5 free "
                       "worker slots (best: a2 with 2 of 200 free)")


# --- pinned cells ----------------------------------------------------------------------------


def test_a_pinned_cell_is_honoured_even_when_another_is_less_loaded() -> None:
    cells = [cell("idle"), cell("pinned", used=150)]
    assert place(request(pinned="pinned"), cells) == PlaceIn(CellName("pinned"))


@pytest.mark.parametrize(("pinned", "reason", "text"), [
    (cell("other"), UnplaceableReason.PINNED_CELL_NOT_FOUND, "pinned cell p (spec.cell) does not exist"),
    (cell("p", tier=Tier.DEDICATED), UnplaceableReason.PINNED_CELL_WRONG_TIER,
     "pinned cell p is a dedicated cell"),
    (cell("p", region=B), UnplaceableReason.PINNED_CELL_WRONG_REGION,
     "pinned cell p is in region region-b, the tenant's home region is region-a"),
    (cell("p", capacity=3, tenants=3), UnplaceableReason.PINNED_CELL_FULL,
     "pinned cell p holds 3 of 3 tenants"),
    (cell("p", used=198), UnplaceableReason.PINNED_CELL_FULL,
     "pinned cell p has 2 of 200 worker slots free; the tenant needs 5"),
    (cell("p", phase="Draining", draining=True), UnplaceableReason.PINNED_CELL_UNAVAILABLE,
     "pinned cell p is Draining and takes no new tenant"),
    (cell("p", draining=True), UnplaceableReason.PINNED_CELL_UNAVAILABLE,
     "pinned cell p is Ready and draining (spec.draining)"),
    (cell("p", phase="FailingOver"), UnplaceableReason.PINNED_CELL_UNAVAILABLE, "is FailingOver"),
    (cell("p", phase="Degraded"), UnplaceableReason.PINNED_CELL_UNAVAILABLE, "is Degraded"),
    (cell("p", phase="Fenced"), UnplaceableReason.PINNED_CELL_UNAVAILABLE, "is Fenced"),
    (cell("p", phase="Deleting"), UnplaceableReason.PINNED_CELL_UNAVAILABLE, "is Deleting"),
])
def test_a_pinned_cell_that_cannot_take_the_tenant_says_precisely_why(
        pinned: CellCandidate, reason: UnplaceableReason, text: str) -> None:
    message = unplaceable(place(request(5, pinned="p"), [cell("idle"), pinned]), reason)
    assert text in message


def test_a_pinned_cell_without_standby_refuses_home_async() -> None:
    outcome = place(request(pinned="p", policy=RegionPolicy.HOME_ASYNC), [cell("p")])
    assert "has no standby region" in unplaceable(outcome, UnplaceableReason.NO_STANDBY_CELL)
    assert place(request(pinned="p", policy=RegionPolicy.HOME_ASYNC),
                 [cell("p", standby=True)]) == PlaceIn(CellName("p"))


@pytest.mark.parametrize("phase", ["Pending", "Provisioning"])
def test_a_pinned_cell_still_starting_is_waited_for(phase: str) -> None:
    outcome = place(request(pinned="p"), [cell("idle"), cell("p", phase=phase)])
    assert outcome == WaitForCell(CellName("p"), WaitReason.PINNED_CELL_NOT_READY,
                                  f"pinned cell p is {phase}; the tenant is placed when it is Ready")


# --- dedicated cells -------------------------------------------------------------------------


def test_a_dedicated_tenant_without_its_cell_gets_one_created() -> None:
    outcome = place(request(isolation=Tier.DEDICATED), [cell("a1"), cell("t-other-x",
                                                                         tier=Tier.DEDICATED)])
    assert outcome == CreateDedicatedCell(CellName("t-acme-prod"))


@pytest.mark.parametrize("phase", ["Pending", "Provisioning", "Fenced", "Degraded", "Deleting"])
def test_a_dedicated_tenant_waits_for_its_cell_to_be_ready(phase: str) -> None:
    outcome = place(request(isolation=Tier.DEDICATED),
                    [cell("t-acme-prod", tier=Tier.DEDICATED, phase=phase)])
    assert isinstance(outcome, WaitForCell) and outcome.cell == "t-acme-prod"
    assert outcome.reason == WaitReason.DEDICATED_CELL_NOT_READY and phase in outcome.message


def test_a_dedicated_tenant_goes_to_its_own_ready_cell_whatever_its_load() -> None:
    cells = [cell("t-acme-prod", tier=Tier.DEDICATED, capacity=1, slots=10, used=0),
             cell("t-acme-staging", tier=Tier.DEDICATED)]
    assert place(request(20, isolation=Tier.DEDICATED), cells) == PlaceIn(CellName("t-acme-prod"))


def test_a_shared_cell_with_the_dedicated_name_is_never_taken() -> None:
    outcome = place(request(isolation=Tier.DEDICATED), [cell("t-acme-prod")])
    assert "is a shared cell" in unplaceable(outcome, UnplaceableReason.DEDICATED_CELL_NAME_TAKEN)


def test_a_dedicated_cell_in_another_region_is_not_taken() -> None:
    outcome = place(request(isolation=Tier.DEDICATED),
                    [cell("t-acme-prod", tier=Tier.DEDICATED, region=B)])
    unplaceable(outcome, UnplaceableReason.DEDICATED_CELL_WRONG_REGION)


def test_a_dedicated_home_async_tenant_needs_a_standby_in_its_cell() -> None:
    own = cell("t-acme-prod", tier=Tier.DEDICATED)
    r = request(isolation=Tier.DEDICATED, policy=RegionPolicy.HOME_ASYNC)
    unplaceable(place(r, [own]), UnplaceableReason.NO_STANDBY_CELL)
    assert place(r, [replace(own, has_standby=True)]) == PlaceIn(CellName("t-acme-prod"))
    assert place(r, []) == CreateDedicatedCell(CellName("t-acme-prod"))


def test_a_dedicated_tenant_cannot_be_pinned_elsewhere() -> None:
    outcome = place(request(isolation=Tier.DEDICATED, pinned="t-someone-else"),
                    [cell("t-someone-else", tier=Tier.DEDICATED)])
    unplaceable(outcome, UnplaceableReason.PINNED_CELL_WRONG_TIER)
    # Pinning it to its own cell changes nothing.
    assert place(request(isolation=Tier.DEDICATED, pinned="t-acme-prod"), []) == \
        CreateDedicatedCell(CellName("t-acme-prod"))


# --- names -------------------------------------------------------------------------------------


def test_names_are_readable_when_they_can_be() -> None:
    assert dedicated_cell_name("acme", "prod") == "t-acme-prod"
    assert tenant_id("acme", "prod", "u1") == "acme-prod-xobagdn4"
    assert tenant_id("team-a", "billing", "u1") == "team--a-billing-xobagdn4"


def test_names_that_would_be_ambiguous_differ() -> None:
    assert tenant_id("a-b", "c", "u") != tenant_id("a", "b-c", "u")
    assert dedicated_cell_name("a-b", "c") != dedicated_cell_name("a", "b-c")
    # A name with dots cannot be spelled plainly; it is hashed, not mapped onto "a-b".
    assert tenant_id("ns", "a.b", "u") != tenant_id("ns", "a-b", "u")


def test_long_names_are_cut_with_a_hash_and_stay_labels() -> None:
    namespace, name = "n" * 63, "a-very-long.tenant.name" + "x" * 200
    for value, limit in ((dedicated_cell_name(namespace, name), 63), (tenant_id(namespace, name, "u"), 63)):
        assert LABEL.match(value) and len(value) <= limit, value
    # Same prefix, different tenants: the hash tells them apart.
    assert tenant_id("n" * 63, "x" * 100 + "1", "u") != tenant_id("n" * 63, "x" * 100 + "2", "u")


def test_a_tenant_id_belongs_to_one_object() -> None:
    """A Tenant created again under the same name is a new object (a new uid): it gets
    an id of its own, so a retained predecessor's rows are never its rows."""
    first = tenant_id("acme", "prod", "0b6a3e0e-1111-4c1e-9d43-7f0e0a000001")
    again = tenant_id("acme", "prod", "0b6a3e0e-1111-4c1e-9d43-7f0e0a000002")
    assert first != again and first.startswith("acme-prod-") and again.startswith("acme-prod-")
    with pytest.raises(ValueError):
        tenant_id("acme", "prod", "")


def test_names_are_stable_across_runs() -> None:
    # Fixed values: a change here renames every tenant's cell and database id.
    assert tenant_id("team-payments-europe", "a" * 60, "4f1c2d3e-0000-4000-8000-000000000000") == (
        "team--payments--europe--aaaaaaaaaaaaaaaaaa--aex3a2aq2w-q4rxxk2m")
    assert dedicated_cell_name("acme", "my.tenant") == "t-acme--my--tenant--52dyxn7zh4"


names = st.text(alphabet="ab-.", min_size=1, max_size=80)
labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


@given(st.lists(st.tuples(st.one_of(labels, names), st.one_of(labels, names)), min_size=2,
                max_size=30, unique=True))
def test_different_tenants_never_share_a_name(tenants: list[tuple[str, str]]) -> None:
    for naming in (lambda namespace, name: tenant_id(namespace, name, "one-uid"),
                   dedicated_cell_name):
        values = [naming(namespace, name) for namespace, name in tenants]
        assert len(set(values)) == len(values)
        for value in values:
            assert LABEL.match(value) and len(value) <= 63, value


# --- loads and many placements --------------------------------------------------------------------


def test_cell_loads_count_tenants_and_slots_per_cell() -> None:
    loads = cell_loads([("a1", 5), ("a2", 2), ("a1", 20)])
    assert loads == {"a1": CellLoad(2, 25), "a2": CellLoad(1, 2)}
    tenants, slots = loads.get("nowhere", (0, 0))
    assert (tenants, slots) == (0, 0)


def test_the_placer_counts_each_placement_before_the_next() -> None:
    placer = Placer([cell("a1", slots=10, capacity=2), cell("a2", slots=10, capacity=2)])
    outcomes = [placer.place(request(4, name=f"t{i}")) for i in range(5)]
    assert outcomes[:4] == [PlaceIn(CellName(n)) for n in ("a1", "a2", "a1", "a2")]
    unplaceable(outcomes[4], UnplaceableReason.NO_CAPACITY)
    assert placer.cells[CellName("a1")].slots_in_use == 8


def test_the_placer_counts_pinned_and_dedicated_placements_too() -> None:
    placer = Placer([cell("p", capacity=1), cell("t-acme-prod", tier=Tier.DEDICATED)])
    assert placer.place(request(pinned="p", name="one")) == PlaceIn(CellName("p"))
    unplaceable(placer.place(request(pinned="p", name="two")), UnplaceableReason.PINNED_CELL_FULL)
    assert placer.place(request(3, isolation=Tier.DEDICATED)) == PlaceIn(CellName("t-acme-prod"))
    assert placer.cells[CellName("t-acme-prod")].slots_in_use == 3


phases = st.sampled_from(["Ready", "Ready", "Ready", "Provisioning", "Draining", "Degraded",
                          "Fenced", "FailingOver"])


@st.composite
def fleets(draw: st.DrawFn) -> list[CellCandidate]:
    count = draw(st.integers(min_value=0, max_value=12))
    cells = []
    for i in range(count):
        slots = draw(st.sampled_from([10, 20, 40, 100]))
        phase = draw(phases)
        cells.append(CellCandidate(
            name=CellName(f"c{i:02d}"), region=draw(st.sampled_from([A, B])),
            tier=draw(st.sampled_from([Tier.SHARED, Tier.SHARED, Tier.DEDICATED])),
            ready=phase == "Ready", phase=phase, draining=draw(st.booleans()) and i % 3 == 0,
            has_standby=draw(st.booleans()), tenant_capacity=draw(st.integers(1, 6)),
            worker_slots=slots, tenants_placed=0, slots_in_use=draw(st.integers(0, slots))))
    return cells


requests = st.builds(
    PlacementRequest, namespace=st.just("ns"), name=st.sampled_from(["t1", "t2", "t3"]),
    isolation=st.sampled_from([Tier.SHARED] * 5 + [Tier.DEDICATED]),
    home_region=st.sampled_from([A, B]),
    region_policy=st.sampled_from([RegionPolicy.SINGLE_REGION, RegionPolicy.HOME_ASYNC]),
    max_running_jobs=st.sampled_from([0, 2, 5, 20]),
    pinned_cell=st.one_of(st.none(), st.none(), st.none(), st.sampled_from(["c00", "c01", "nope"])))


@settings(max_examples=300, deadline=None)
@given(fleets(), st.lists(requests, max_size=40))
def test_a_sequence_never_overfills_a_cell_and_agrees_with_place(
        cells: list[CellCandidate], sequence: list[PlacementRequest]) -> None:
    placer = Placer(cells)
    current = {c.name: c for c in cells}
    for r in sequence:
        expected = place(r, current.values())
        assert placer.place(r) == expected
        if isinstance(expected, PlaceIn):
            before = current[expected.cell]
            current[expected.cell] = before.with_tenant(r.max_running_jobs)
            if r.isolation is Tier.SHARED:
                after = current[expected.cell]
                assert after.tenants_placed <= after.tenant_capacity
                # Cells that started over their slots stay over, but never grow past them.
                assert after.slots_in_use <= max(after.worker_slots, before.slots_in_use)
        assert placer.cells == current


@settings(max_examples=300, deadline=None)
@given(fleets(), requests)
def test_the_chosen_cell_is_among_the_least_loaded_eligible_ones(
        cells: list[CellCandidate], r: PlacementRequest) -> None:
    r = replace(r, isolation=Tier.SHARED, pinned_cell=None)
    eligible = [c for c in cells if c.tier is Tier.SHARED and c.region == r.home_region
                and c.ready and not c.draining and c.fits(r.max_running_jobs)
                and (r.region_policy is RegionPolicy.SINGLE_REGION or c.has_standby)]
    outcome = place(r, cells)
    if not eligible:
        assert isinstance(outcome, Unplaceable | WaitForCell)
        return
    assert isinstance(outcome, PlaceIn)
    least = min(Fraction(c.slots_in_use + r.max_running_jobs, c.worker_slots) for c in eligible)
    chosen = next(c for c in eligible if c.name == outcome.cell)
    assert Fraction(chosen.slots_in_use + r.max_running_jobs, chosen.worker_slots) == least


@settings(max_examples=200, deadline=None)
@given(fleets(), requests, st.randoms(use_true_random=False))
def test_the_outcome_does_not_depend_on_the_order_of_the_cells(
        cells: list[CellCandidate], r: PlacementRequest, rng: random.Random) -> None:
    shuffled = list(cells)
    rng.shuffle(shuffled)
    assert place(r, shuffled) == place(r, cells)
    assert Placer(shuffled).place(r) == Placer(cells).place(r)


def test_a_load_the_cells_status_shows_already_is_not_written_again() -> None:
    load = CellLoad(2, 10)
    assert load_to_publish(load, shown_tenants=2, shown_slots=10) is None
    assert load_to_publish(load, shown_tenants=1, shown_slots=10) == load
    assert load_to_publish(load, shown_tenants=2, shown_slots=5) == load
    # A status that shows no load yet gets one, zeros included.
    assert load_to_publish(CellLoad(0, 0), shown_tenants=None, shown_slots=None) == CellLoad(0, 0)


def test_a_cell_being_deleted_is_seen_as_deleting_whatever_its_site_reports() -> None:
    assert candidate_phase(deleting=True, reported="Ready") == "Deleting"
    assert candidate_phase(deleting=False, reported="Ready") == "Ready"
    assert candidate_phase(deleting=False, reported=None) == "Pending"
    assert candidate_phase(deleting=False, reported="") == "Pending"
