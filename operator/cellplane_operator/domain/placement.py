"""Where a tenant goes: a shared cell of its home region, or a cell of its own.

The placement leader turns the Cells and the placement records into
``CellCandidate`` values and asks ``place`` (one tenant) or a ``Placer`` (many
in a row, each placement counted before the next). Pure: no I/O, no clock.
An expected obstacle (no capacity, a cell still starting, a pin that cannot be
honoured) is an outcome with a CamelCase reason and a message that names the
numbers, never an exception.

Rules:

- **shared**, not pinned: a cell of tier shared in the home region that is
  Ready and not draining (never Draining, FailingOver, Degraded, Fenced or
  Deleting), has ``max_running_jobs`` worker slots free and room for one more
  tenant; for ``HOME_ASYNC`` it must also have a standby region. Among those,
  the one least loaded *after* the tenant is added (see ``_load_after``), ties
  broken by name.
- **shared, pinned** (``spec.cell``): that cell or nothing, with the precise
  reason when it cannot take the tenant, or ``WaitForCell`` while it is only
  not Ready yet.
- **dedicated**: the cell named ``dedicated_cell_name(namespace, name)``:
  absent -> ``CreateDedicatedCell``; present but not Ready -> ``WaitForCell``;
  Ready -> ``PlaceIn``. A cell of another tenant is never chosen: the name is
  this tenant's alone, and a cell of that name must be of tier dedicated.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from fractions import Fraction
from typing import NamedTuple

from cellplane_operator.domain.cells import CellName, Region, Tier

__all__ = [
    "RegionPolicy", "UnplaceableReason", "WaitReason", "UNAVAILABLE_PHASES",
    "CellCandidate", "PlacementRequest",
    "PlaceIn", "CreateDedicatedCell", "WaitForCell", "Unplaceable", "Outcome",
    "place", "Placer", "CellLoad", "cell_loads", "load_to_publish", "candidate_phase",
    "dedicated_cell_name", "tenant_id",
]

UNAVAILABLE_PHASES = frozenset({"Draining", "FailingOver", "Degraded", "Fenced", "Deleting"})
"""Phases in which a cell takes no new tenant, even a pinned one. ``Deleting`` is
what the leader reports for a Cell with a deletion timestamp."""


_STARTING_PHASES = frozenset({"", "Pending", "Provisioning"})


class RegionPolicy(str, Enum):
    # Values as the Tenant CRD spells them (api/v1alpha1.py).
    SINGLE_REGION = "SINGLE_REGION"
    """The data stays in the home region."""
    HOME_ASYNC = "HOME_ASYNC"
    """The data also streams to a standby region: only cells with a standby qualify."""


class UnplaceableReason(StrEnum):
    NO_CELL_IN_REGION = "NoCellInRegion"
    """No shared cell of the home region is Ready (or none exists there)."""
    NO_CAPACITY = "NoCapacity"
    """Ready shared cells exist, but none has the slots or the tenant room."""
    NO_STANDBY_CELL = "NoStandbyCell"
    """HOME_ASYNC, and no eligible cell has a standby region."""
    PINNED_CELL_NOT_FOUND = "PinnedCellNotFound"
    PINNED_CELL_WRONG_TIER = "PinnedCellWrongTier"
    PINNED_CELL_WRONG_REGION = "PinnedCellWrongRegion"
    PINNED_CELL_FULL = "PinnedCellFull"
    PINNED_CELL_UNAVAILABLE = "PinnedCellUnavailable"
    """Draining, FailingOver, Degraded, Fenced or being deleted."""
    DEDICATED_CELL_NAME_TAKEN = "DedicatedCellNameTaken"
    """A shared cell carries the name of the tenant's dedicated cell."""
    DEDICATED_CELL_WRONG_REGION = "DedicatedCellWrongRegion"
    """The tenant's dedicated cell exists, but in another region than its home."""


class WaitReason(StrEnum):
    NO_READY_CELL = "NoReadyCell"
    """Shared cells of the home region exist but are still starting (Pending, Provisioning)."""
    DEDICATED_CELL_NOT_READY = "DedicatedCellNotReady"
    PINNED_CELL_NOT_READY = "PinnedCellNotReady"


@dataclass(frozen=True)
class CellCandidate:
    """A Cell as placement sees it: its spec, its phase and what is placed in it."""

    name: CellName
    region: Region
    tier: Tier
    ready: bool
    """The cell's phase is Ready."""
    phase: str
    """Pending, Provisioning, Ready, Draining, FailingOver, Degraded, Fenced, Deleting."""
    draining: bool
    """spec.draining: the cell takes no new tenant, whatever its phase says."""
    has_standby: bool
    """spec.standbyRegions is not empty."""
    tenant_capacity: int
    worker_slots: int
    tenants_placed: int = 0
    slots_in_use: int = 0
    """The sum of the placed tenants' max_running_jobs."""

    @property
    def free_slots(self) -> int:
        return self.worker_slots - self.slots_in_use

    @property
    def available(self) -> bool:
        """Takes new tenants: Ready, not draining."""
        return self.ready and not self.draining and self.phase not in UNAVAILABLE_PHASES

    def fits(self, max_running_jobs: int) -> bool:
        return (self.worker_slots > 0 and self.free_slots >= max_running_jobs
                and self.tenants_placed < self.tenant_capacity)

    def with_tenant(self, max_running_jobs: int) -> CellCandidate:
        return replace(self, tenants_placed=self.tenants_placed + 1,
                       slots_in_use=self.slots_in_use + max_running_jobs)

    def describe(self) -> str:
        """The state that keeps the cell from taking tenants, for messages."""
        if self.draining and self.phase != "Draining":
            return f"{self.phase} and draining (spec.draining)"
        return self.phase or "not reporting a phase yet"


@dataclass(frozen=True)
class PlacementRequest:
    namespace: str
    name: str
    isolation: Tier
    home_region: Region
    region_policy: RegionPolicy
    max_running_jobs: int
    """Worker slots the tenant may take: what it adds to a cell's load."""
    pinned_cell: str | None = None
    """spec.cell: place in this cell or not at all."""

    def __post_init__(self) -> None:
        if self.max_running_jobs < 0:
            raise ValueError(f"max_running_jobs must not be negative, got {self.max_running_jobs}")


@dataclass(frozen=True)
class PlaceIn:
    cell: CellName


@dataclass(frozen=True)
class CreateDedicatedCell:
    """The tenant's own cell does not exist yet: create it in the home region
    (with a standby region for HOME_ASYNC), then place the tenant in it."""

    cell: CellName


@dataclass(frozen=True)
class WaitForCell:
    """The one cell the tenant may go to exists but is not Ready yet."""

    cell: CellName
    reason: WaitReason
    message: str


@dataclass(frozen=True)
class Unplaceable:
    reason: UnplaceableReason
    message: str


Outcome = PlaceIn | CreateDedicatedCell | WaitForCell | Unplaceable


# --- the rules, shared by place() and Placer ---------------------------------------


def _load_after(cell: CellCandidate, max_running_jobs: int) -> Fraction:
    """The cell's slot ratio once the tenant is added.

    After, not before: with cells of different sizes, "least loaded now" sends
    a 20-slot tenant to an empty 20-slot cell (ending at 100%) rather than to a
    200-slot cell at 10% (ending at 20%). Ranking by the load the cell ends up
    with is the greedy step that keeps the busiest cell as idle as it can be;
    for cells of one size both orders agree. Exact fractions, so equal loads
    tie exactly and the name decides.
    """
    return Fraction(cell.slots_in_use + max_running_jobs, cell.worker_slots)


def _rank(cell: CellCandidate, max_running_jobs: int) -> tuple[Fraction, str]:
    return _load_after(cell, max_running_jobs), cell.name


def _qualifies(cell: CellCandidate, request: PlacementRequest) -> bool:
    """Eligible for an unpinned shared tenant, capacity aside."""
    return (cell.tier is Tier.SHARED and cell.region == request.home_region and cell.available
            and (request.region_policy is RegionPolicy.SINGLE_REGION or cell.has_standby))


def _listing(cells: Iterable[CellCandidate], show: Callable[[CellCandidate], str],
             limit: int = 5) -> str:
    ordered = sorted(cells, key=lambda c: c.name)
    shown = ", ".join(f"{c.name} {show(c)}" for c in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def _no_shared_cell(request: PlacementRequest, region_cells: Collection[CellCandidate],
                    regions_with_shared_cells: Collection[Region]) -> Unplaceable | WaitForCell:
    """Why no shared cell of the home region takes the tenant (``region_cells``:
    the shared cells of the home region, whatever their state)."""
    region, wanted = request.home_region, request.max_running_jobs
    if not region_cells:
        elsewhere = sorted(set(regions_with_shared_cells) - {region})
        return Unplaceable(UnplaceableReason.NO_CELL_IN_REGION,
                           f"there is no shared cell in region {region}"
                           + (f" (shared cells exist in {', '.join(elsewhere)})" if elsewhere
                              else "") + "; create one or change spec.homeRegion")
    available = [c for c in region_cells if c.available]
    starting = sorted((c for c in region_cells if not c.draining and c.phase in _STARTING_PHASES),
                      key=lambda c: c.name)
    if not available and starting:
        # A cell that is still starting will take the tenant: a wait, not a refusal.
        return WaitForCell(starting[0].name, WaitReason.NO_READY_CELL,
                           f"no shared cell in region {region} is Ready yet ("
                           + _listing(starting, lambda c: f"is {c.describe()}")
                           + "); the tenant is placed when one is")
    if not available:
        return Unplaceable(UnplaceableReason.NO_CELL_IN_REGION,
                           f"no Ready shared cell in region {region}: "
                           + _listing(region_cells, lambda c: f"is {c.describe()}"))
    kind = "Ready shared cell"
    if request.region_policy is RegionPolicy.HOME_ASYNC:
        ready_count = len(available)
        available = [c for c in available if c.has_standby]
        kind = "Ready shared cell with a standby region"
        if not available:
            return Unplaceable(UnplaceableReason.NO_STANDBY_CELL,
                               f"HOME_ASYNC needs a shared cell with a standby region; none of the "
                               f"{ready_count} Ready shared cell(s) in region {region} has "
                               f"spec.standbyRegions")
    with_room = [c for c in available if c.tenants_placed < c.tenant_capacity]
    if not with_room:
        return Unplaceable(UnplaceableReason.NO_CAPACITY,
                           f"every {kind} in region {region} holds its maximum of tenants ("
                           + _listing(available, lambda c: f"{c.tenants_placed} of "
                                                           f"{c.tenant_capacity}") + ")")
    best = min(with_room, key=lambda c: (-c.free_slots, c.name))
    return Unplaceable(UnplaceableReason.NO_CAPACITY,
                       f"no {kind} in region {region} has {wanted} free worker slots "
                       f"(best: {best.name} with {max(best.free_slots, 0)} of "
                       f"{best.worker_slots} free)")


def _place_pinned(request: PlacementRequest, cell: CellCandidate | None) -> Outcome:
    pin = request.pinned_cell
    if cell is None:
        return Unplaceable(UnplaceableReason.PINNED_CELL_NOT_FOUND,
                           f"pinned cell {pin} (spec.cell) does not exist")
    if cell.tier is not Tier.SHARED:
        return Unplaceable(UnplaceableReason.PINNED_CELL_WRONG_TIER,
                           f"pinned cell {pin} is a {cell.tier.value} cell; a shared tenant may "
                           f"only be pinned to a shared cell")
    if cell.region != request.home_region:
        return Unplaceable(UnplaceableReason.PINNED_CELL_WRONG_REGION,
                           f"pinned cell {pin} is in region {cell.region}, the tenant's home "
                           f"region is {request.home_region}")
    if request.region_policy is RegionPolicy.HOME_ASYNC and not cell.has_standby:
        return Unplaceable(UnplaceableReason.NO_STANDBY_CELL,
                           f"pinned cell {pin} has no standby region and the tenant's region "
                           f"policy is HOME_ASYNC; give the cell spec.standbyRegions or pin "
                           f"another cell")
    if cell.draining or cell.phase in UNAVAILABLE_PHASES:
        return Unplaceable(UnplaceableReason.PINNED_CELL_UNAVAILABLE,
                           f"pinned cell {pin} is {cell.describe()} and takes no new tenant")
    if cell.tenants_placed >= cell.tenant_capacity:
        return Unplaceable(UnplaceableReason.PINNED_CELL_FULL,
                           f"pinned cell {pin} holds {cell.tenants_placed} of "
                           f"{cell.tenant_capacity} tenants")
    if not cell.fits(request.max_running_jobs):
        return Unplaceable(UnplaceableReason.PINNED_CELL_FULL,
                           f"pinned cell {pin} has {max(cell.free_slots, 0)} of "
                           f"{cell.worker_slots} worker slots free; the tenant needs "
                           f"{request.max_running_jobs}")
    if not cell.ready:
        return WaitForCell(cell.name, WaitReason.PINNED_CELL_NOT_READY,
                           f"pinned cell {pin} is {cell.describe()}; the tenant is placed "
                           f"when it is Ready")
    return PlaceIn(cell.name)


def _place_dedicated(request: PlacementRequest,
                     lookup: Callable[[CellName], CellCandidate | None]) -> Outcome:
    own = CellName(dedicated_cell_name(request.namespace, request.name))
    if request.pinned_cell is not None and request.pinned_cell != own:
        # The CRD refuses this already; a value that got past it still goes nowhere.
        return Unplaceable(UnplaceableReason.PINNED_CELL_WRONG_TIER,
                           f"a dedicated tenant runs in its own cell {own}; spec.cell "
                           f"({request.pinned_cell}) pins shared tenants only")
    cell = lookup(own)
    if cell is None:
        return CreateDedicatedCell(own)
    if cell.tier is not Tier.DEDICATED:
        return Unplaceable(UnplaceableReason.DEDICATED_CELL_NAME_TAKEN,
                           f"cell {own}, the name of this tenant's dedicated cell, is a "
                           f"{cell.tier.value} cell; rename or delete it")
    if cell.region != request.home_region:
        return Unplaceable(UnplaceableReason.DEDICATED_CELL_WRONG_REGION,
                           f"dedicated cell {own} is in region {cell.region}, the tenant's home "
                           f"region is {request.home_region}; delete the cell or move it")
    if request.region_policy is RegionPolicy.HOME_ASYNC and not cell.has_standby:
        return Unplaceable(UnplaceableReason.NO_STANDBY_CELL,
                           f"dedicated cell {own} has no standby region and the tenant's region "
                           f"policy is HOME_ASYNC; give the cell spec.standbyRegions")
    if not cell.available:
        # Its own cell is the only place this tenant may go: wait, whatever holds it up.
        return WaitForCell(own, WaitReason.DEDICATED_CELL_NOT_READY,
                           f"dedicated cell {own} is {cell.describe()}; the tenant is placed "
                           f"when it is Ready")
    # No capacity check: the cell exists for this tenant alone, its quota caps
    # it within the cell, and there is nowhere else it could go.
    return PlaceIn(own)


def _by_name(cells: Iterable[CellCandidate]) -> dict[CellName, CellCandidate]:
    found: dict[CellName, CellCandidate] = {}
    for cell in cells:
        if cell.name in found:
            raise ValueError(f"two candidates are named {cell.name}")
        found[cell.name] = cell
    return found


def place(request: PlacementRequest, cells: Iterable[CellCandidate]) -> Outcome:
    """Where one tenant goes, given the cells and what is placed in them now.

    The outcome does not depend on the order of ``cells``. For many tenants in
    a row use ``Placer``, which gives the same outcomes without a full scan each.
    """
    by_name = _by_name(cells)
    if request.isolation is Tier.DEDICATED:
        return _place_dedicated(request, by_name.get)
    if request.pinned_cell is not None:
        return _place_pinned(request, by_name.get(CellName(request.pinned_cell)))
    fitting = [c for c in by_name.values()
               if _qualifies(c, request) and c.fits(request.max_running_jobs)]
    if fitting:
        return PlaceIn(min(fitting, key=lambda c: _rank(c, request.max_running_jobs)).name)
    shared = [c for c in by_name.values() if c.tier is Tier.SHARED]
    return _no_shared_cell(request, [c for c in shared if c.region == request.home_region],
                           {c.region for c in shared})


# --- many tenants in a row ----------------------------------------------------------


class Placer:
    """Places tenants one after another, each PlaceIn counted before the next.

    Gives the outcome ``place`` would give on the same cells with the earlier
    placements added, without scanning every cell: the available shared cells
    are kept in heaps per (region, has standby, worker slots), ordered by
    (slots in use, name). Within one size the least used cell is also the one
    least loaded after adding any tenant and the one with the most free slots,
    so each heap's head is its only contender; the heads of the few sizes are
    compared by ``_load_after``. A cell leaves its heap when its tenant room is
    used up; outdated heap entries are dropped when they reach the top.
    """

    def __init__(self, cells: Iterable[CellCandidate]) -> None:
        self._cells = _by_name(cells)
        self._shared_by_region: dict[Region, list[CellName]] = {}
        self._heaps: dict[tuple[Region, bool], dict[int, list[tuple[int, CellName]]]] = {}
        for cell in sorted(self._cells.values(), key=lambda c: c.name):
            if cell.tier is not Tier.SHARED:
                continue
            self._shared_by_region.setdefault(cell.region, []).append(cell.name)
            if self._in_heap(cell):
                sizes = self._heaps.setdefault((cell.region, cell.has_standby), {})
                sizes.setdefault(cell.worker_slots, []).append((cell.slots_in_use, cell.name))
        for sizes in self._heaps.values():
            for heap in sizes.values():
                heapq.heapify(heap)

    @staticmethod
    def _in_heap(cell: CellCandidate) -> bool:
        return (cell.tier is Tier.SHARED and cell.available and cell.worker_slots > 0
                and cell.tenants_placed < cell.tenant_capacity)

    @property
    def cells(self) -> dict[CellName, CellCandidate]:
        """Every cell with the placements made so far counted in."""
        return dict(self._cells)

    def place(self, request: PlacementRequest) -> Outcome:
        if request.isolation is Tier.DEDICATED:
            outcome = _place_dedicated(request, self._cells.get)
        elif request.pinned_cell is not None:
            outcome = _place_pinned(request, self._cells.get(CellName(request.pinned_cell)))
        else:
            outcome = self._place_shared(request)
        if isinstance(outcome, PlaceIn):
            self._add(outcome.cell, request.max_running_jobs)
        return outcome

    def _place_shared(self, request: PlacementRequest) -> Outcome:
        wanted = request.max_running_jobs
        best: tuple[Fraction, str] | None = None
        standby = (True,) if request.region_policy is RegionPolicy.HOME_ASYNC else (True, False)
        for has_standby in standby:
            for slots, heap in self._heaps.get((request.home_region, has_standby), {}).items():
                head = self._head(heap)
                if head is None or slots - head.slots_in_use < wanted:
                    continue
                rank = _rank(head, wanted)
                if best is None or rank < best:
                    best = rank
        if best is not None:
            return PlaceIn(CellName(best[1]))
        region_cells = [self._cells[n] for n in self._shared_by_region.get(request.home_region, [])]
        return _no_shared_cell(request, region_cells, self._shared_by_region.keys())

    def _head(self, heap: list[tuple[int, CellName]]) -> CellCandidate | None:
        while heap:
            used, name = heap[0]
            cell = self._cells[name]
            if cell.slots_in_use == used and cell.tenants_placed < cell.tenant_capacity:
                return cell
            heapq.heappop(heap)
        return None

    def _add(self, name: CellName, max_running_jobs: int) -> None:
        cell = self._cells[name].with_tenant(max_running_jobs)
        self._cells[name] = cell
        if self._in_heap(cell) and max_running_jobs != 0:
            sizes = self._heaps[(cell.region, cell.has_standby)]
            heapq.heappush(sizes[cell.worker_slots], (cell.slots_in_use, name))


class CellLoad(NamedTuple):
    tenants: int
    slots_in_use: int


def cell_loads(records: Iterable[tuple[str, int]]) -> dict[str, CellLoad]:
    """Per cell, from placement records given as (cell, max_running_jobs): tenants and slots."""
    tenants: dict[str, int] = {}
    slots: dict[str, int] = {}
    for cell, max_running_jobs in records:
        tenants[cell] = tenants.get(cell, 0) + 1
        slots[cell] = slots.get(cell, 0) + max_running_jobs
    return {cell: CellLoad(tenants[cell], slots[cell]) for cell in tenants}


def load_to_publish(load: CellLoad, *, shown_tenants: int | None,
                    shown_slots: int | None) -> CellLoad | None:
    """The load to write into a cell's status (``tenants``, ``slotsInUse``), or None when
    the status shows it already: the placement leader patches only what changed."""
    if (shown_tenants, shown_slots) == (load.tenants, load.slots_in_use):
        return None
    return load


def candidate_phase(*, deleting: bool, reported: str | None) -> str:
    """The phase placement sees a cell in: ``Deleting`` once its deletion is asked (its
    site may still report Ready), else the phase its site reports, ``Pending`` before it
    reports one."""
    return "Deleting" if deleting else str(reported or "Pending")


# --- names ---------------------------------------------------------------------------

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9]+")
_HASH_CHARS = 10
"""Base32 characters of SHA-256 (50 bits) in a hashed name."""


def _fingerprint(namespace: str, name: str) -> str:
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return base64.b32encode(digest).decode().lower()[:_HASH_CHARS]


def _encode(namespace: str, name: str, limit: int) -> str:
    """A DNS label of at most ``limit`` characters, one per (namespace, name).

    Plain form, when namespace and name are DNS labels and it fits: the
    namespace with each ``-`` doubled, one ``-``, then the name
    (``team-a``/``billing`` -> ``team--a-billing``). The first run of dashes of
    odd length is the separator, so ``a-b/c`` (``a--b-c``) and ``a/b-c``
    (``a-b-c``) differ and the form can be read back.

    Hashed form otherwise (too long, or a name with dots): the readable text
    with every ``-`` doubled, cut to fit, then ``--`` and 50 bits of SHA-256 of
    ``namespace/name``. Its dash runs are all of even length, so it is never
    a plain form; two hashed forms meet only if their hashes do.
    """
    if _LABEL.match(namespace) and _LABEL.match(name):
        plain = namespace.replace("-", "--") + "-" + name
        if len(plain) <= limit:
            return plain
    readable = _NOT_LABEL_CHARS.sub("-", f"{namespace}-{name}".lower()).strip("-")
    room = limit - _HASH_CHARS - 2
    readable = readable.replace("-", "--")[:room].rstrip("-")
    fingerprint = _fingerprint(namespace, name)
    return f"{readable}--{fingerprint}" if readable else fingerprint


def dedicated_cell_name(namespace: str, name: str) -> str:
    """The name of the tenant's dedicated cell: ``t-`` and the tenant's encoded
    namespace/name, a DNS label of at most 63 characters (``t-acme-prod``)."""
    return "t-" + _encode(namespace, name, 61)


def tenant_id(namespace: str, name: str, uid: str) -> str:
    """The tenant's id in its cell's database: one per Tenant *object*, never reused
    (``acme-prod-`` and 8 characters of the object's uid; ``team--a-prod-...`` for
    namespace ``team-a``).

    The uid binds the data to the object. A Tenant deleted with deletionPolicy Retain
    leaves its rows in the cell, disabled, under its id; one created again under the
    same name is a new object with a new uid, so it gets a new id and an empty
    account, and never lists the old jobs or replays the old idempotency keys. The
    suffix has no dash, so the name's part before it stays the unambiguous
    ``_encode`` form; the record in etcd keeps the id, so it is computed once.
    """
    return f"{_encode(namespace, name, 63 - 1 - _UID_CHARS)}-{_uid_tag(uid)}"


_UID_CHARS = 8
"""Base32 characters (40 bits) of SHA-256 of the object's uid in a tenant id."""


def _uid_tag(uid: str) -> str:
    if not uid:
        raise ValueError("a tenant id needs the Tenant's metadata.uid")
    digest = hashlib.sha256(uid.encode()).digest()
    return base64.b32encode(digest).decode().lower()[:_UID_CHARS]
