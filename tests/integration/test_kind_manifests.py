"""What hack/kind.sh sends to kind's apiserver, sent to a real kube-apiserver instead
(kind cannot run here: NODE-LAB.md). Nodes labelled as kind's workers are created through
the API; the script's own functions read their InternalIPs with the pinned kubectl, render
the ownership etcd's members, and the members, the samples and the chart rendered with
deploy/kind/values.yaml pass the apiserver's validation (server-side dry run, strict field
validation, the CRDs' schemas and CEL rules). tests/unit/test_kind.py checks the same
files against the local cluster without an apiserver.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartinstall import documents, render
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.cluster import ClusterConfig
from cellplane_operator.localplane.clusterplan import ClusterPlan

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "kind.sh"
PLAN = ClusterPlan("x", ClusterConfig().regions)
CONTEXT = "cellplane-local"
"""The context of the control plane's kubeconfig (localplane/apiserver.py)."""
# kind names workers in the config's order; shuffled here, the script sorts by region.
WORKER_NAMES = ["cellplane-worker3", "cellplane-worker", "cellplane-worker2"]


def node_ip(index: int) -> str:
    return f"172.18.0.{3 + index}"


def sourced(kube: LocalControlPlane, call: str, *, stdin: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig),
           "PATH": f"{kube.binaries.kubectl.parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", f'source "{SCRIPT}"; {call}'], input=stdin, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{call}: {result.stderr}"
    return result.stdout


def dry_run(kube: LocalControlPlane, objects: list[dict[str, Any]]) -> None:
    result = kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                          input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                 "items": objects}), check=False)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def kind_nodes(kube: LocalControlPlane) -> str:
    """kind's nodes as the API holds them: a control plane without a region, and a
    worker per region with its labels and an InternalIP. Returns the script's
    `region_nodes` output for them."""
    nodes: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Node",
                                    "metadata": {"name": "cellplane-control-plane"},
                                    "status": {"addresses": [{"type": "InternalIP",
                                                              "address": "172.18.0.2"}]}}]
    for name, node in zip(WORKER_NAMES, PLAN.nodes, strict=True):
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": node.labels},
                      # Nodes may be created with their status (the node strategy keeps it).
                      "status": {"addresses": [{"type": "InternalIP",
                                                "address": node_ip(node.index)},
                                               {"type": "Hostname", "address": name}]}})
    for node_object in nodes:
        kube.kubectl("create", "-f", "-", input_text=json.dumps(node_object))
    return sourced(kube, f"region_nodes {CONTEXT}")


def test_the_script_reads_each_region_node_internal_ip_in_region_order(kind_nodes: str) -> None:
    assert kind_nodes.splitlines() == [f"{node.region} {node_ip(node.index)}"
                                       for node in PLAN.nodes]


def test_the_ownership_etcd_members_pass_the_apiserver_validation(
        kube: LocalControlPlane, kind_nodes: str) -> None:
    rendered = [doc for doc in yaml.safe_load_all(
        sourced(kube, "render_ownership_etcd cellplane", stdin=kind_nodes)) if doc]
    namespace = rendered[0]
    kube.kubectl("create", "-f", "-", input_text=json.dumps(namespace))
    dry_run(kube, rendered[1:])


def test_the_samples_pass_the_crds_schemas_and_rules(kube: LocalControlPlane) -> None:
    samples = [doc for path in sorted((REPO / "deploy" / "samples").glob("*.yaml"))
               for doc in yaml.safe_load_all(path.read_text()) if doc]
    for namespace in (doc for doc in samples if doc["kind"] == "Namespace"):
        kube.kubectl("create", "-f", "-", input_text=json.dumps(namespace))
    dry_run(kube, [doc for doc in samples if doc["kind"] != "Namespace"])


def test_the_chart_with_the_kind_values_and_the_members_passes_the_apiserver(
        kube: LocalControlPlane, kind_nodes: str) -> None:
    endpoints = sourced(kube, "etcd_endpoints", stdin=kind_nodes).strip()
    assert endpoints.startswith("{") and endpoints.endswith("}")
    values = yaml.safe_load((REPO / "deploy" / "kind" / "values.yaml").read_text())
    # helm's --set list syntax, as the script passes it.
    values["etcd"] = {"endpoints": endpoints[1:-1].split(",")}
    rendered = documents(render(values, include_crds=False))
    kube.kubectl("create", "namespace", "cellplane-system")
    # The admission policy is the control plane's own (applied at its start, and tested
    # with the chart in test_helm_chart.py).
    dry_run(kube, [doc for doc in rendered if not doc["kind"].startswith("ValidatingAdmission")])
    claims = [doc for doc in rendered if doc["kind"] == "PersistentVolumeClaim"]
    assert [claim["spec"]["storageClassName"] for claim in claims] == ["standard"] * len(PLAN.nodes)
