"""charts/cellplane installed on the local cluster with helm: the regional operators as
Pods, one Deployment per region on that region's node, running the operator image
built here (``imagePullPolicy: Never``).

The values are ``deploy/local-cluster/values.yaml`` (deploy/kind/values.yaml is the
same for kind) plus what only the running cluster knows: its regions, each pinned to
its node by the region label, and the ownership etcd's members, one on each region's
node (``WorkerNode.start_ownership_etcd``), so that losing a region loses its
operator and its member together.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from cellplane_operator.errors import LocalPlaneError
from cellplane_operator.localplane.binaries import helm_binary
from cellplane_operator.localplane.clusterplan import ClusterPlan
from cellplane_operator.localplane.images import source_root

__all__ = ["RELEASE", "NAMESPACE", "chart_values", "install_operators", "uninstall_operators",
           "values_file"]

RELEASE = "cellplane"
NAMESPACE = "cellplane-system"
"""The release namespace: the operators, their ServiceAccount and their Secrets."""


class ClusterLike(Protocol):
    @property
    def plan(self) -> ClusterPlan: ...

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def ownership_endpoints(self) -> list[str]: ...


def values_file(source: Path | None = None) -> Path:
    return (source or source_root()) / "deploy" / "local-cluster" / "values.yaml"


def chart_values(plan: ClusterPlan, ownership_endpoints: list[str], *,
                 source: Path | None = None,
                 overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The local cluster's values for ``plan``'s regions and etcd members."""
    values = yaml.safe_load(values_file(source).read_text())
    assert isinstance(values, dict)
    values["regions"] = [{"name": node.region,
                          "nodeSelector": {"topology.kubernetes.io/region": node.region}}
                         for node in plan.nodes]
    values["etcd"] = {"endpoints": list(ownership_endpoints)}
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def _helm(kubeconfig: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # helm's own homes in a throwaway place: no repositories or plugins are needed,
    # and the user's helm configuration must not change what is installed.
    with tempfile.TemporaryDirectory(prefix="cellplane-helm-") as home:
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache",
               "HELM_CONFIG_HOME": f"{home}/config", "HELM_DATA_HOME": f"{home}/data",
               "KUBECONFIG": str(kubeconfig)}
        try:
            return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                                  timeout=timeout, check=False, env=env)
        except subprocess.TimeoutExpired as error:
            raise LocalPlaneError(f"helm {args[0]} took longer than {timeout:.0f} s") from error


def install_operators(cluster: ClusterLike, *, overrides: Mapping[str, Any] | None = None,
                      timeout: float = 600,
                      say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """``helm upgrade --install`` of the chart, waiting until every operator Deployment is
    Available (its pod Ready on its node). Returns the values used."""
    values = chart_values(cluster.plan, cluster.ownership_endpoints, overrides=overrides)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="cellplane-values-") as file:
        yaml.safe_dump(values, file)
        file.flush()
        say(f"helm install {RELEASE} into {NAMESPACE} "
            f"({len(values['regions'])} operator Deployment(s))")
        result = _helm(cluster.kubeconfig, "upgrade", "--install", RELEASE,
                       str(source_root() / "charts" / "cellplane"), "--namespace", NAMESPACE,
                       "--create-namespace", "--values", file.name, "--wait",
                       f"--timeout={int(timeout)}s", timeout=timeout + 60)
    if result.returncode != 0:
        raise LocalPlaneError(f"helm install failed: {result.stderr.strip()}")
    return values


def uninstall_operators(cluster: ClusterLike, *, timeout: float = 300) -> None:
    result = _helm(cluster.kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait",
                   f"--timeout={int(timeout)}s", timeout=timeout + 60)
    if result.returncode != 0:
        raise LocalPlaneError(f"helm uninstall failed: {result.stderr.strip()}")
