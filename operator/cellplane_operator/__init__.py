"""cellplane's regional operator: placement, ownership leases, moves and failover.

The pure decisions live in ``cellplane_operator.domain``; everything that talks to
Kubernetes, etcd or a cell sits in adapters around it.
"""

__all__: list[str] = []
