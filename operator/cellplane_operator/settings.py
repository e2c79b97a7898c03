"""The operator's configuration, read once at the entry point and passed down."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OperatorSettings"]


@dataclass(frozen=True)
class OperatorSettings:
    region: str
    """The region this operator instance runs in and acts for."""
    etcd_endpoints: tuple[str, ...] = ()
    """``host:port`` of every member of the ownership-table etcd cluster."""
    etcd_timeout_seconds: float = 5.0
    """How long one etcd operation may take over all members before it fails."""
