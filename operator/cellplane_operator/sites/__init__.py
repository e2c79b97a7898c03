"""Site drivers: what runs a cell's sites (Postgres, API, workers) in one region.

``base`` is the protocol the operator codes against; ``local`` runs sites as
loopback processes that outlive the operator.
"""

from cellplane_operator.sites.base import (
    DatabaseEndpoint,
    ServingSpec,
    SiteDriver,
    SiteEndpoints,
    SiteHealth,
    SiteKey,
)
from cellplane_operator.sites.local import LocalSiteDriver, stop_all_sites

__all__ = [
    "DatabaseEndpoint",
    "LocalSiteDriver",
    "ServingSpec",
    "SiteDriver",
    "SiteEndpoints",
    "SiteHealth",
    "SiteKey",
    "stop_all_sites",
]
