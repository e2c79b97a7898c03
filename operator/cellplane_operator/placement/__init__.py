"""Placement state in etcd: where each tenant lives, and which operator may decide it."""

from cellplane_operator.placement.election import Leadership
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey

__all__ = ["Leadership", "PlacementRecord", "PlacementRecords", "TenantKey"]
