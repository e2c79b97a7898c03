"""What the objects of a ``kubernetes``-driver site are called, and how long those names may be.

Every name derives from the cell's and the region's names alone, so a site whose Cell is
gone (deleted while its region was down) is still found and collected by name. Names
start with ``cell-``: Service names are DNS-1035 labels (a letter first), and a cell's
name may start with a digit. The StatefulSet's name binds the length: its Pods carry the
label ``controller-revision-hash: <name>-<hash>``, and a label value has at most 63
characters (``MAX_CELL_AND_REGION``). Postgres's 107-byte unix socket path is no concern
in a Pod: the socket directory is a short fixed path, not under a per-site directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LABEL_VALUE_MAX", "REVISION_HASH_MAX", "STATEFUL_SET_NAME_MAX", "MAX_CELL_AND_REGION",
           "SiteNames", "site_names", "ObjectRef", "site_object_refs"]

LABEL_VALUE_MAX = 63
REVISION_HASH_MAX = 10
"""A StatefulSet labels its Pods ``controller-revision-hash: <name>-<hash>``; the hash is a
32-bit FNV hash in Kubernetes' safe encoding, at most 10 characters."""
STATEFUL_SET_NAME_MAX = LABEL_VALUE_MAX - len("-") - REVISION_HASH_MAX
"""52: longer StatefulSet names make Pods whose revision label the apiserver refuses
(its pod name ``<name>-0`` and the Services' names are shorter than that label)."""

_PREFIX = "cell-"
"""Every object name starts with a letter: Service names are DNS-1035 labels, and a cell's
name (a DNS-1123 label) may start with a digit. The Secrets are ``cell-<cell>-...`` too."""
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class SiteNames:
    """Every name of one site's objects, derived from the cell and the region alone (so a site
    whose Cell is gone can still be collected by name)."""

    database: str
    """The StatefulSet and the ClusterIP Service of its database."""
    pods: str
    """The StatefulSet's headless Service (its ``serviceName``)."""
    agent: str
    """The ClusterIP Service of the site agent."""
    api: str
    """The cell API's Deployment and Service."""
    worker: str
    """The workers' Deployment."""
    claim_template: str = "data"

    @property
    def pod(self) -> str:
        return f"{self.database}-0"

    @property
    def claim(self) -> str:
        """The PersistentVolumeClaim the StatefulSet makes for its one Pod."""
        return f"{self.claim_template}-{self.pod}"


def _names(cell: str, region: str) -> SiteNames:
    base = f"{_PREFIX}{cell}-{region}"
    return SiteNames(database=f"{base}-db", pods=f"{base}-db-pods", agent=f"{base}-agent",
                     api=f"{base}-api", worker=f"{base}-worker")


def _longest_per_limit() -> int:
    """The most characters cell and region may have together: every derived name within its
    limit (the StatefulSet's 52, every Service's 63)."""
    empty = _names("", "")
    return min(STATEFUL_SET_NAME_MAX - len(empty.database),
               *(LABEL_VALUE_MAX - len(name) for name in (empty.pods, empty.agent, empty.api,
                                                          empty.worker, empty.database)))


MAX_CELL_AND_REGION = _longest_per_limit()
"""43 characters for a cell's name and a region's name together (the StatefulSet's limit
binds first: ``cell-<cell>-<region>-db`` at most 52)."""


def site_names(cell: str, region: str) -> SiteNames:
    """The site's object names; ValueError when they cannot be valid Kubernetes names."""
    for what, value in (("cell", cell), ("region", region)):
        if not _DNS_LABEL.match(value) or len(value) > LABEL_VALUE_MAX:
            raise ValueError(f"{what} name {value!r} is not a DNS label (lowercase letters, "
                             "digits and '-', at most 63)")
    if len(cell) + len(region) > MAX_CELL_AND_REGION:
        names = _names(cell, region)
        raise ValueError(
            f"cell {cell!r} and region {region!r} have {len(cell) + len(region)} characters "
            f"together; a kubernetes-driver site allows at most {MAX_CELL_AND_REGION}: its "
            f"StatefulSet {names.database!r} may have at most {STATEFUL_SET_NAME_MAX} so that "
            f"the Pod label controller-revision-hash (the name, '-' and a hash of up to "
            f"{REVISION_HASH_MAX}) fits the {LABEL_VALUE_MAX}-character label limit")
    return _names(cell, region)


@dataclass(frozen=True, order=True)
class ObjectRef:
    kind: str
    name: str
    namespace: str
    api_version: str


def site_object_refs(cell: str, region: str, namespace: str, *,
                     claims: bool) -> tuple[ObjectRef, ...]:
    """Every object a site may have, whatever its role, to delete it: from names alone, since
    a site of a Cell deleted while its region was down is collected without its spec. The
    API and workers are listed on a standby too (a switchover cut short may have left them).
    ``claims``: the PersistentVolumeClaim as well (the Cell's deletion policy)."""
    names = site_names(cell, region)
    refs = [ObjectRef("Deployment", names.worker, namespace, "apps/v1"),
            ObjectRef("Deployment", names.api, namespace, "apps/v1"),
            ObjectRef("Service", names.api, namespace, "v1"),
            ObjectRef("StatefulSet", names.database, namespace, "apps/v1"),
            ObjectRef("Service", names.database, namespace, "v1"),
            ObjectRef("Service", names.agent, namespace, "v1"),
            ObjectRef("Service", names.pods, namespace, "v1")]
    if claims:
        refs.append(ObjectRef("PersistentVolumeClaim", names.claim, namespace, "v1"))
    return tuple(refs)
