"""Dedicated cells: where a tenant's own cell keeps its standby, and what a move's is named.

A dedicated tenant gets a cell of its own when it is placed, and another one
each time it is moved (the move copies it there, then the old one is retired).
These rules decide the cells' shape from plain values; the controllers create
and delete the Cell objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cellplane_operator.domain.cells import CellName, Region
from cellplane_operator.domain.placement import dedicated_cell_name

__all__ = ["standby_region", "move_target_name", "made_for_move", "dedicated_to",
           "dedicated_cell_spec", "TENANT_LABEL", "TENANT_NAMESPACE_LABEL"]

TENANT_LABEL = "cellplane.io/tenant"
TENANT_NAMESPACE_LABEL = "cellplane.io/tenant-namespace"
"""The labels that tie a dedicated cell to its tenant (namespaced, while the Cell is not)."""

_INHERITED = ("driver", "lease", "failover")
"""What a dedicated tenant's new cell takes from the cell it moves out of: how it runs."""

_MOVE_TAG_CHARS = 8
"""Characters of the TenantMove's uid that end the name of the cell made for it."""
_MOVE_BASE_CHARS = 63 - 1 - _MOVE_TAG_CHARS
"""What is left of a DNS label for the tenant's part of the name, beside ``-`` and the tag."""


def standby_region(home: Region, regions: Sequence[Region]) -> Region | None:
    """The standby region of a dedicated HOME_ASYNC tenant's cell: the region after
    ``home`` in the deployment's list of regions (the operator's ``--regions``, in the
    order given), wrapping round to the first after the last.

    None when the list names no other region, or does not name ``home`` at all: no
    region comes "after" a home the deployment does not run (a cell there is refused
    as in an unknown region anyway).
    """
    if home not in regions:
        return None
    at = list(regions).index(home)
    for step in range(1, len(regions)):
        candidate = regions[(at + step) % len(regions)]
        if candidate != home:
            return candidate
    return None


def move_target_name(namespace: str, name: str, move_uid: str) -> CellName:
    """The dedicated cell a move of the tenant makes: the tenant's own cell name, cut to
    leave room, then ``-`` and the start of the move's uid, so that each move's cell is a
    new DNS label (``t-acme-prod-1a2b3c4d``) and the move's cell can be found again."""
    base = dedicated_cell_name(namespace, name)[:_MOVE_BASE_CHARS]
    return CellName(f"{base}{_move_tag(move_uid)}")


def made_for_move(cell: str, move_uid: str) -> bool:
    """Is ``cell`` named as the cell ``move_target_name`` makes for this move?"""
    return cell.endswith(_move_tag(move_uid))


def _move_tag(move_uid: str) -> str:
    return f"-{move_uid[:_MOVE_TAG_CHARS]}"


def dedicated_to(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, name) of the tenant a dedicated cell was made for, by its labels."""
    name, namespace = labels.get(TENANT_LABEL), labels.get(TENANT_NAMESPACE_LABEL)
    return (str(namespace), str(name)) if name and namespace else None


def dedicated_cell_spec(*, region: str, max_running_jobs: int, standby: Region | None,
                        like: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec of a dedicated tenant's own cell: one tenant, a worker slot for each job it
    may run (one at least: a cell of none is refused), a standby where one is asked.

    ``like`` is the spec of the cell a move takes the tenant out of: the new cell runs as
    that one did (its driver, lease and failover settings), only elsewhere."""
    return {**{k: v for k, v in (like or {}).items() if k in _INHERITED},
            "region": region, "tier": "dedicated",
            "capacity": {"tenants": 1, "workerSlots": max(max_running_jobs, 1)},
            "standbyRegions": [] if standby is None else [standby]}
