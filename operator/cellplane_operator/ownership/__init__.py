"""Placement-group ownership: the etcd table, the lease holder loop, the database grant;
and the placement election (``election``), held with the same lease code.

The decisions are in ``cellplane_operator.domain.ownership``; this package only
moves them between etcd, the process's monotonic clock and the cell database.
"""

from cellplane_operator.ownership.holder import GroupActor, LeaseHolder
from cellplane_operator.ownership.table import OwnershipTable

__all__ = ["GroupActor", "LeaseHolder", "OwnershipTable"]
