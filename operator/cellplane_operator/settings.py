"""The operator's configuration, read once at the entry point and passed down."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from cellplane_operator.api.v1alpha1 import CellResources
from cellplane_operator.domain.ownership import LeaseSettings

__all__ = ["OperatorSettings", "ImagePullPolicy", "IMAGE_PULL_POLICIES", "parse_cell_resources"]

ImagePullPolicy = Literal["Always", "IfNotPresent", "Never"]
IMAGE_PULL_POLICIES: tuple[ImagePullPolicy, ...] = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class OperatorSettings:
    region: str
    """The region this operator instance runs in and acts for."""
    etcd_endpoints: tuple[str, ...] = ()
    """``host:port`` of every member of the ownership-table etcd cluster."""
    etcd_timeout_seconds: float = 2.0
    """How long one etcd operation may take over all members before it fails."""
    state_dir: Path = Path(".local/sites")
    """Where the local site driver keeps this region's sites (data, logs, PIDs)."""
    namespace: str = "cellplane-system"
    """Namespace of the operator's own Secrets (cell admin tokens)."""
    kubeconfig: Path | None = None
    """Kubeconfig to use; None: $KUBECONFIG, in-cluster, then ~/.kube/config."""
    kube_timeout_seconds: float = 10.0
    """How long one request to the Kubernetes API may take. Nothing on the path of a
    failover waits on one (``runtime/kubewrites.py``)."""
    election: LeaseSettings = field(default_factory=LeaseSettings)
    """Lease of the placement election."""
    resync_seconds: float = 30.0
    """Every object is reconciled at least this often, events or not."""
    site_check_seconds: float = 1.0
    """How often each site's processes are health-checked (and restarted)."""
    tenant_workers: int = 16
    """Tenants reconciled at once by the placement leader."""
    move_workers: int = 8
    """TenantMoves reconciled at once by the placement leader (a reconcile is one short
    step of a move: a slice of the copy, a catch-up round, a cutover)."""
    regions: tuple[str, ...] = ()
    """Every region of the deployment; a dedicated HOME_ASYNC tenant's standby goes to the
    region after its home in this list."""
    adopt_leases: bool = False
    """Continue the live leases of this region's previous operator after a restart, and
    leave the cells serving at shutdown. Only with an exclusive lock on ``state_dir``,
    which proves the previous operator is gone."""
    member: str = ""
    """This operator's name in elections; default ``<region>-<pid>``."""
    move_progress_deadline_seconds: float = 600.0
    """How long a TenantMove may go without progress before its cutover (waiting to be
    admitted, or every step failing: a cell that does not serve or refuses) before it
    fails with the reason it was stuck on. As a Deployment's progressDeadlineSeconds."""
    cell_image: str = ""
    """The image the kubernetes site driver runs a site's Postgres (with its agent), API and
    workers with (the chart's cells.image: the operator's own image). Empty: Cells with
    ``spec.driver.name: kubernetes`` are refused, said on their conditions."""
    cell_image_pull_policy: ImagePullPolicy = "IfNotPresent"
    """When the kubelet pulls ``cell_image``."""
    cell_namespace: str = ""
    """Namespace of the kubernetes driver's site objects (StatefulSets, Deployments,
    Services, claims, the agent-token Secret). Empty: ``namespace``, where the cells'
    database and admin Secrets are (a ``secretKeyRef`` cannot leave its namespace)."""
    cell_storage_class: str = ""
    """StorageClass of the sites' claims when a Cell's ``spec.driver.storage.className`` is
    unset. Empty: the cluster's default class."""
    cell_resources: CellResources = field(default_factory=CellResources)
    """Requests and limits of the sites' containers where a Cell's
    ``spec.driver.resources`` leaves them unset; what is unset here too is the driver's
    own default (``domain/site_objects.py``)."""

    def __post_init__(self) -> None:
        if not self.cell_namespace:
            object.__setattr__(self, "cell_namespace", self.namespace)


_RESOURCE_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"database", "api", "worker"}),
    "container": frozenset({"requests", "limits"}),
    "part": frozenset({"cpu", "memory"}),
}


def _unknown_keys(data: Any) -> list[str]:
    """Keys the resources' models would ignore (they read Cells leniently): at start-up a
    misspelled key is an error, not a default silently kept."""
    unknown: list[str] = []
    levels = ("", "container", "part")

    def walk(node: Any, depth: int, path: str) -> None:
        if not isinstance(node, dict) or depth >= len(levels):
            return
        for key, child in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in _RESOURCE_KEYS[levels[depth]]:
                unknown.append(f"{where} (expected one of "
                               f"{', '.join(sorted(_RESOURCE_KEYS[levels[depth]]))})")
            else:
                walk(child, depth + 1, where)

    walk(data, 0, "")
    return unknown


def parse_cell_resources(text: str) -> CellResources:
    """The operator's default requests and limits of the sites' containers, from JSON such
    as ``{"database": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory":
    "1Gi"}}, "api": {...}, "worker": {...}}``; empty text: none. ValueError says what is
    wrong and where."""
    if not text.strip():
        return CellResources()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError('expected a JSON object like {"database": {"requests": {"cpu": '
                         '"250m"}}, "api": {...}, "worker": {...}}')
    if unknown := _unknown_keys(data):
        raise ValueError(f"unknown keys: {'; '.join(unknown)}")
    try:
        return CellResources.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in error.errors())
        raise ValueError(problems) from None
