"""Placement records in etcd: where each tenant lives. Who may write them is the
placement election (``ownership.election``); what they say is decided in
``domain.placement``."""

from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey

__all__ = ["PlacementRecord", "PlacementRecords", "TenantKey"]
