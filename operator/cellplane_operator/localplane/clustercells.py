"""Kubernetes-driver Cells and their tenants on the local cluster, as the cluster demo and
``benchmarks/cluster_failover.py`` set them up and read them: the manifests, the job
target behind a Service, a tenant's API key, the Cell's status and what it says about
which site serves and which streams.

The two questions asked of a Cell's status (``serves_from``, ``streams_as_standby``) are
pure, so the demo and the benchmark wait on the same definition of "taken over" and
"rebuilt".
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cellplane_operator.localplane.clusterchart import NAMESPACE, RELEASE
from cellplane_operator.localplane.clusterload import (POD_PORT, TARGET_SERVER, PodServer,
                                                       python_pod, site_sql)

__all__ = ["PRODUCT_LEASE", "router_url", "operator_image", "status_of", "kubernetes_cell",
           "tenant", "start_target", "target_url", "api_key", "serves_from",
           "streams_as_standby", "job_statuses"]

PRODUCT_LEASE: Mapping[str, float] = {"durationSeconds": 10, "renewIntervalSeconds": 2,
                                      "marginSeconds": 2}
"""The product's ownership lease: a takeover's floor is its duration plus its margin."""


class Cluster(Protocol):
    """What of ``LocalCluster`` this module uses."""

    @property
    def images(self) -> Sequence[Any]: ...

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> Any: ...

    def apply(self, objects: Any) -> None: ...


def router_url(region: str) -> str:
    """The chart's router Service of ``region``, as a Pod of the cluster reaches it."""
    return f"http://{RELEASE}-router-{region}.{NAMESPACE}.svc.cluster.local:8080"


def operator_image(cluster: Cluster) -> str:
    """The operator image's reference: the cells' Pods and the load's run it (python3)."""
    return next(str(image.reference) for image in cluster.images if image.name == "operator")


def status_of(cluster: Cluster, kind: str, name: str,
              namespace: str | None = None) -> dict[str, Any]:
    """The object's status; empty when it has none yet, or cannot be read."""
    where = ["-n", namespace] if namespace else []
    found = cluster.kubectl("get", kind, name, *where, "-o", "json", check=False, timeout=30)
    if found.returncode != 0:
        return {}
    return dict(json.loads(found.stdout).get("status") or {})


def kubernetes_cell(name: str, *, region: str, standbys: Sequence[str] = (),
                    tenants: int = 5, worker_slots: int = 10,
                    lease: Mapping[str, float] = PRODUCT_LEASE) -> dict[str, Any]:
    """A shared Cell of the ``kubernetes`` driver. Private targets are allowed: the job
    target is a Pod of the cluster, on a private address."""
    return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
            "spec": {"region": region, "standbyRegions": list(standbys), "tier": "shared",
                     "capacity": {"tenants": tenants, "workerSlots": worker_slots},
                     "lease": dict(lease),
                     "driver": {"name": "kubernetes", "allowPrivateTargets": True}}}


def tenant(name: str, namespace: str, *, cell: str, home_region: str,
           target: str) -> dict[str, Any]:
    """An enterprise Tenant pinned to ``cell``, its quotas above what the load asks (one
    job at a time), so a pause measured is the cell's, never the quota's."""
    return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"plan": "enterprise", "homeRegion": home_region, "cell": cell,
                     "quotas": {"jobsPerSecond": 50, "burst": 100, "maxRunningJobs": 5},
                     "targets": [{"name": "default", "url": target}]}}


def start_target(cluster: Cluster, namespace: str, region: str) -> PodServer:
    """The jobs' target (``TARGET_SERVER``) as a Pod on ``region``, behind the Service
    ``target_url`` names; ``get()`` answers every call it received."""
    cluster.apply([{"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "target", "namespace": namespace},
                    "spec": {"selector": {"app": "target"},
                             "ports": [{"port": POD_PORT, "targetPort": POD_PORT}]}}])
    return PodServer(cluster, python_pod(operator_image(cluster), "target", namespace, region,
                                         TARGET_SERVER))


def target_url(namespace: str) -> str:
    return f"http://target.{namespace}.svc.cluster.local:{POD_PORT}/run"


def api_key(cluster: Cluster, namespace: str, tenant_name: str) -> str:
    """The tenant's API key, from the Secret the operator wrote for it."""
    found = cluster.kubectl("get", "secret", f"{tenant_name}-api-key", "-n", namespace,
                            "-o", "json", timeout=30)
    return base64.b64decode(json.loads(found.stdout)["data"]["api-key"]).decode()


def serves_from(status: Mapping[str, Any], region: str, *, after_epoch: int) -> bool:
    """The Cell is active in ``region`` under a newer epoch than ``after_epoch`` and names
    an API endpoint there: a takeover has finished."""
    return (status.get("activeRegion") == region
            and int(status.get("epoch") or 0) > after_epoch
            and bool((status.get("endpoints") or {}).get("api")))


def streams_as_standby(status: Mapping[str, Any], region: str, *,
                       reconciled_epoch: int | None = None) -> bool:
    """The site in ``region`` streams as a standby; with ``reconciled_epoch``, only once the
    takeover at that epoch was reconciled (the old primary fenced and reported on)."""
    reconciled = (reconciled_epoch is None
                  or (status.get("lastReconciliation") or {}).get("epoch") == reconciled_epoch)
    return reconciled and any(s.get("region") == region and s.get("streaming")
                              for s in status.get("standbys") or [])


def job_statuses(cluster: Cluster, cell: str, region: str) -> dict[str, str]:
    """job id -> status of every job in the site of ``cell`` in ``region``."""
    rows = site_sql(cluster, NAMESPACE, cell, region, "SELECT job_id, status FROM jobs")
    if rows.startswith("failed"):
        raise RuntimeError(f"the jobs of {cell} in {region} could not be read: {rows}")
    return dict(line.split("|", 1) for line in rows.splitlines() if "|" in line)
