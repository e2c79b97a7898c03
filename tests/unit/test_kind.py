"""kind (deploy/kind/, hack/kind.sh) stays in step with the local cluster it stands in for
on machines with Docker: the same region-labelled worker nodes in the same order, the
images the local cluster's pods run, the same chart values but for a short allow-list,
one ownership etcd member per region node, and samples valid against the CRDs.

Nothing here runs kind or Docker (neither works on the project's machines, NODE-LAB.md):
the files are read, the script's functions are called by sourcing it, the whole script
is run against stand-ins for docker, kind, kubectl and helm that log their calls, and
the chart is rendered by the pinned helm. Each check fails when one side drifts (a
label, an image tag, a value, a step). tests/integration/test_kind_manifests.py sends
what the script renders to a real kube-apiserver for validation.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartinstall import documents, render
from schemawalk import unknown_fields
from cellplane_operator.localplane import images
from cellplane_operator.localplane.cluster import ClusterConfig
from cellplane_operator.localplane.clusterplan import ClusterPlan
from cellplane_operator.localplane.images import (
    etcd_reference,
    operator_reference,
    source_root,
)
from cellplane_operator.localplane.node import (
    OWNERSHIP_ETCD_CLIENT_PORT,
    OWNERSHIP_ETCD_PEER_PORT,
)

REPO = Path(__file__).resolve().parents[2]
KIND = REPO / "deploy" / "kind"
SCRIPT = REPO / "hack" / "kind.sh"
LOCAL_VALUES = REPO / "deploy" / "local-cluster" / "values.yaml"
SAMPLES = REPO / "deploy" / "samples"
REGION_LABEL = "topology.kubernetes.io/region"

PLAN = ClusterPlan("x", ClusterConfig().regions)
"""The local cluster's nodes for its default regions."""

VALUES_ALLOWED_TO_DIFFER = {"persistence.storageClassName"}
"""kind's local-path class is `standard`; the local cluster's is `cellplane-local`. The
image keeps its name: kind loads a `localhost/` reference unchanged."""

NODE_IPS = {node.region: f"172.18.0.{3 + node.index}" for node in PLAN.nodes}
"""What `kubectl get nodes` gives for kind's workers (Docker's kind network)."""


def sourced(call: str, *, stdin: str | None = None) -> str:
    """Output of a function of hack/kind.sh, the script sourced (its main is not run)."""
    result = subprocess.run(["bash", "-c", f'source "{SCRIPT}"; {call}'], input=stdin,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{call}: {result.stderr}"
    return result.stdout


def script_variable(name: str) -> str:
    return sourced(f'echo "${name}"').strip()


def kind_config() -> dict[str, Any]:
    config = yaml.safe_load((KIND / "cluster.yaml").read_text())
    assert isinstance(config, dict)
    return config


def workers() -> list[dict[str, Any]]:
    return [node for node in kind_config()["nodes"] if node.get("role") == "worker"]


def values(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted paths of every leaf (a list is a leaf: regions are compared whole)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat(value, f"{path}."))
        else:
            out[path] = value
    return out


def versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO / "hack" / "versions.env").read_text().splitlines()
             if re.match(r"^[A-Z_]+=", line))
    return {key: value.strip() for key, value in pairs}


def rendered_etcd() -> list[dict[str, Any]]:
    lines = "".join(f"{region} {ip}\n" for region, ip in NODE_IPS.items())
    return [doc for doc in yaml.safe_load_all(sourced("render_ownership_etcd cellplane",
                                                      stdin=lines)) if doc]


def operator_deployments(values_file: Path, component: str = "operator") -> list[dict[str, Any]]:
    chart_values = {**values(values_file), "etcd": {"endpoints": ["192.0.2.1:2379"]}}
    return [doc for doc in documents(render(chart_values, include_crds=False))
            if doc["kind"] == "Deployment"
            and doc["metadata"]["labels"]["app.kubernetes.io/component"] == component]


# ------------------------------------------------------------------ (a) the nodes


def test_the_kind_workers_carry_the_local_cluster_node_labels_in_order() -> None:
    config = kind_config()
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    assert [node["role"] for node in config["nodes"]] == \
        ["control-plane"] + ["worker"] * len(PLAN.nodes)
    assert [worker.get("labels") for worker in workers()] == [node.labels for node in PLAN.nodes]
    assert PLAN.regions == ("region-a", "region-b", "region-c")
    # The control plane is no region's: nothing of cellplane may land there.
    assert not config["nodes"][0].get("labels")


def test_every_node_runs_one_published_kind_image_of_the_pinned_kubernetes_minor() -> None:
    node_images = {node.get("image") for node in kind_config()["nodes"]}
    assert len(node_images) == 1, node_images
    (image,) = node_images
    found = re.fullmatch(r"kindest/node:v(\d+)\.(\d+)\.(\d+)@sha256:[0-9a-f]{64}", str(image))
    assert found, f"{image}: a kindest/node tag pinned by the digest of its kind release"
    pinned = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", versions()["KUBERNETES_VERSION"])
    assert pinned and found.group(1, 2) == pinned.group(1, 2), (image, pinned)


# ------------------------------------------------------------------ (b) the images


def local_cluster_images() -> set[str]:
    """The images the local cluster builds for its nodes, by their build functions."""
    return set(re.findall(r"\bbuild_(\w+)_image\(", inspect.getsource(images.build_images)))


def without_localhost(reference: str) -> str:
    return reference.removeprefix("localhost/")


def test_kind_has_every_image_the_local_cluster_pods_run_but_the_pause_image() -> None:
    loaded = sourced("loaded_images").split()
    etcd_image = sourced("etcd_image").strip()
    covered = {
        # Built from the same Dockerfile and loaded with `kind load docker-image`.
        "operator": any(without_localhost(image) == without_localhost(
            operator_reference(source_root())) for image in loaded),
        # Pulled by the nodes: etcd's own image of the etcd version the local cluster builds.
        "etcd": (etcd_image.rsplit(":", 1)[0] == "quay.io/coreos/etcd"
                 and etcd_image.rsplit(":", 1)[1] == etcd_reference(source_root()).rsplit(":", 1)[1]),
    }
    # kind's nodes bring their own sandbox image.
    assert local_cluster_images() == {"pause", *covered}, (
        "the local cluster builds an image kind does not get: add it to hack/kind.sh "
        f"and here ({local_cluster_images()})")
    assert all(covered.values()), (covered, loaded, etcd_image)
    assert versions()["ETCD_VERSION"].startswith("v") and etcd_image.endswith(
        f":{versions()['ETCD_VERSION']}")


def test_the_operator_image_kind_loads_is_the_one_the_chart_runs_there() -> None:
    (loaded,) = sourced("loaded_images").split()
    chart = yaml.safe_load((REPO / "charts" / "cellplane" / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert loaded.rsplit(":", 1)[1] == chart["appVersion"] == version
    for deployment in operator_deployments(KIND / "values.yaml"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == loaded
        assert container["imagePullPolicy"] == "Never"
    text = SCRIPT.read_text()
    assert 'image="$(operator_image)"' in text and 'docker build -t "$image" .' in text
    assert 'kind load docker-image --name "$cluster" $(loaded_images)' in text


# ------------------------------------------------------------------ (c) the values


def test_kind_values_are_the_local_cluster_values_but_for_the_allow_list() -> None:
    kind, local = flat(values(KIND / "values.yaml")), flat(values(LOCAL_VALUES))
    differing = {key for key in kind.keys() | local.keys() if kind.get(key) != local.get(key)}
    assert differing == VALUES_ALLOWED_TO_DIFFER, (
        "deploy/kind/values.yaml and deploy/local-cluster/values.yaml differ in "
        f"{sorted(differing)}; allowed: {sorted(VALUES_ALLOWED_TO_DIFFER)}")
    assert kind["persistence.storageClassName"] == "standard"  # kind's local-path provisioner


@pytest.mark.parametrize("values_file", [KIND / "values.yaml", LOCAL_VALUES],
                         ids=["kind", "local-cluster"])
def test_both_values_render_one_operator_per_region_on_its_node(values_file: Path) -> None:
    deployments = operator_deployments(values_file)
    assert len(deployments) == len(PLAN.nodes)
    for deployment, node in zip(deployments, PLAN.nodes, strict=True):
        spec = deployment["spec"]["template"]["spec"]
        assert f"--region={node.region}" in spec["containers"][0]["args"]
        assert spec["nodeSelector"] == {REGION_LABEL: node.region}
        # ... which only that node's labels match.
        assert all(node.labels[key] == value for key, value in spec["nodeSelector"].items())

    # Each region's router goes to the same node as its operator.
    routers = operator_deployments(values_file, component="router")
    assert [r["spec"]["template"]["spec"]["nodeSelector"] for r in routers] == \
        [{REGION_LABEL: node.region} for node in PLAN.nodes]


# ------------------------------------------------------------------ (d) the script


def test_the_script_parses_and_uses_the_kind_files() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    text = SCRIPT.read_text()
    for path in ("deploy/kind/cluster.yaml", "deploy/kind/values.yaml",
                 "deploy/kind/ownership-etcd.yaml", "deploy/samples"):
        assert path in text, path
        assert (REPO / path).exists(), path
    assert "set -euo pipefail" in text
    for tool in ("docker", "kind", "kubectl", "helm"):
        assert re.search(rf"for tool in [^;]*\b{tool}\b", text), tool
    assert "--delete" in text and 'kind delete cluster --name "$cluster"' in text


def test_the_ownership_etcd_has_one_member_per_region_node_as_on_the_local_cluster() -> None:
    docs = rendered_etcd()
    namespace = script_variable("etcd_namespace")
    assert docs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    members = docs[1:]
    assert [doc["kind"] for doc in members] == ["Deployment"] * len(PLAN.nodes)
    initial = ",".join(f"{node.region}=http://{NODE_IPS[node.region]}:{OWNERSHIP_ETCD_PEER_PORT}"
                       for node in PLAN.nodes)
    for member, node in zip(members, PLAN.nodes, strict=True):
        ip = NODE_IPS[node.region]
        assert member["metadata"]["namespace"] == namespace
        pod = member["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert pod["nodeSelector"] == {REGION_LABEL: node.region}
        (container,) = pod["containers"]
        assert container["image"] == sourced("etcd_image").strip()
        args = container["args"]
        for flag in (f"--name={node.region}",
                     f"--listen-client-urls=http://{ip}:{OWNERSHIP_ETCD_CLIENT_PORT}",
                     f"--advertise-client-urls=http://{ip}:{OWNERSHIP_ETCD_CLIENT_PORT}",
                     f"--listen-peer-urls=http://{ip}:{OWNERSHIP_ETCD_PEER_PORT}",
                     f"--initial-cluster={initial}", "--initial-cluster-state=new"):
            assert flag in args, (flag, args)
        (data,) = pod["volumes"]
        assert data["hostPath"]["path"].startswith("/var/lib/cellplane-etcd")
        assert any(a.startswith("--data-dir=/var/lib/cellplane-etcd/") for a in args)
        assert member["spec"]["replicas"] == 1


def test_helm_gets_every_member_as_an_etcd_endpoint_in_region_order() -> None:
    lines = "".join(f"{region} {ip}\n" for region, ip in NODE_IPS.items())
    endpoints = sourced("etcd_endpoints", stdin=lines).strip()
    assert endpoints == "{" + ",".join(f"{NODE_IPS[n.region]}:{OWNERSHIP_ETCD_CLIENT_PORT}"
                                       for n in PLAN.nodes) + "}"
    assert '--set "etcd.endpoints=$endpoints"' in SCRIPT.read_text()


# ------------------------------------------------------------------ the samples


def sample_docs() -> Iterator[dict[str, Any]]:
    for path in sorted(SAMPLES.glob("*.yaml")):
        yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def test_the_samples_follow_the_crds_and_run_in_the_kind_regions() -> None:
    from cellplane_operator.api.v1alpha1 import CellSpec, TenantSpec

    docs = list(sample_docs())
    cells = [doc for doc in docs if doc["kind"] == "Cell"]
    tenants = [doc for doc in docs if doc["kind"] == "Tenant"]
    assert {doc["kind"] for doc in docs} == {"Cell", "Tenant", "Namespace"}
    for doc in cells + tenants:
        model = CellSpec if doc["kind"] == "Cell" else TenantSpec
        model.model_validate(doc["spec"])
        crd = yaml.safe_load((REPO / "crds" / f"cellplane.io_{doc['kind'].lower()}s.yaml").read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert not list(unknown_fields(doc["spec"], schema, "spec")), doc
    # A shared cell in each region, and no standby: a standby in another region's
    # operator pod cannot reach a primary on its pod's loopback yet.
    assert sorted(cell["spec"]["region"] for cell in cells) == sorted(PLAN.regions)
    assert not any(cell["spec"].get("standbyRegions") for cell in cells)
    assert {tenant["spec"]["homeRegion"] for tenant in tenants} <= set(PLAN.regions)
    assert all(tenant["spec"].get("regionPolicy", "SINGLE_REGION") == "SINGLE_REGION"
               and tenant["spec"].get("isolation", "shared") == "shared" for tenant in tenants)
    # The script waits for the Tenants of the namespace it knows.
    assert {tenant["metadata"]["namespace"] for tenant in tenants} == \
        {script_variable("samples_namespace")}


# ------------------------------------------------------------------ the script's steps

STUB = """#!/usr/bin/env bash
# A stand-in for docker, kind, kubectl and helm: logs its call and answers the few
# questions hack/kind.sh asks.
set -eu
call="$(basename "$0") $*"
echo "$call" >> "$STUB_DIR/calls"
case "$call" in
    "kind get clusters"*) printf '%s' "${STUB_CLUSTERS:-}" ;;
    "kind version"*) echo "kind ${STUB_KIND_VERSION:-v0.33.0} go1.26.0 linux/amd64" ;;
    "docker image inspect"*)
        count="$(cat "$STUB_DIR/inspected" 2>/dev/null || echo 0)"
        echo $((count + 1)) > "$STUB_DIR/inspected"
        echo "sha256:image$((count < ${STUB_NEW_IMAGE_AT:-99} ? 0 : 1))" ;;
    kubectl*" get nodes -l "*) printf '%s' "$STUB_NODES" ;;
    kubectl*" apply -f -"*) cat > "$STUB_DIR/applied.yaml" ;;
esac
"""


UTILITIES = ("bash", "awk", "basename", "cat", "dirname", "grep", "head", "sed", "sort", "tr")


def run_script(tmp_path: Path, *args: str, tools: tuple[str, ...] = ("docker", "kind", "kubectl", "helm"),
               **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stubs, utilities = tmp_path / "bin", tmp_path / "utilities"
    stubs.mkdir(exist_ok=True)
    utilities.mkdir(exist_ok=True)
    for tool in tools:
        (stubs / tool).write_text(STUB)
        (stubs / tool).chmod(0o755)
    # Only the programs the script and the stub use, so that a docker, kind, kubectl or
    # helm of this machine is never found instead of (or besides) the stubs.
    for program in UTILITIES:
        found = shutil.which(program)
        assert found, program
        if not (utilities / program).exists():
            (utilities / program).symlink_to(found)
    # kind's workers as `kubectl get nodes` lists them: by node name, not by region.
    nodes = "".join(f"{region} {NODE_IPS[region]}\n" for region in reversed(PLAN.regions))
    result = subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": f"{stubs}:{utilities}", "HOME": str(tmp_path), "STUB_DIR": str(tmp_path),
             "STUB_NODES": nodes, **env})
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result, calls


def test_the_script_creates_builds_loads_starts_etcd_installs_and_applies_in_order(
        tmp_path: Path) -> None:
    result, calls = run_script(tmp_path)
    assert result.returncode == 0, result.stderr
    image = operator_reference(source_root())
    endpoints = ",".join(f"{NODE_IPS[n.region]}:{OWNERSHIP_ETCD_CLIENT_PORT}" for n in PLAN.nodes)
    context = "--context kind-cellplane"
    steps = [
        "kind create cluster --name cellplane --config deploy/kind/cluster.yaml",
        f"docker build -t {image} .",
        f"kind load docker-image --name cellplane {image}",
        f"kubectl {context} apply -f -",
        f"kubectl {context} -n cellplane-etcd wait --for=condition=Available deployment "
        "-l app.kubernetes.io/name=ownership-etcd",
        "helm --kube-context kind-cellplane upgrade --install cellplane charts/cellplane "
        "-n cellplane-system --create-namespace -f deploy/kind/values.yaml "
        f"--set etcd.endpoints={{{endpoints}}}",
        f"kubectl {context} -n cellplane-system wait --for=condition=Available deployment "
        "-l app.kubernetes.io/component=operator",
        f"kubectl {context} apply -f deploy/samples/",
        f"kubectl {context} -n cellplane-samples wait --for=condition=Ready tenant --all",
    ]
    positions = []
    for step in steps:
        found = [index for index, call in enumerate(calls) if call.startswith(step)]
        assert found, f"never ran: {step}\ncalls:\n" + "\n".join(calls)
        positions.append(found[0])
    assert positions == sorted(positions), "\n".join(calls)
    assert not any("rollout restart" in call for call in calls)
    # What it applied for the etcd: the members of every region node, in region order.
    applied = [doc for doc in yaml.safe_load_all((tmp_path / "applied.yaml").read_text()) if doc]
    assert [doc["metadata"]["name"] for doc in applied[1:]] == \
        [f"ownership-etcd-{region}" for region in PLAN.regions]


def test_a_rerun_reuses_the_cluster_and_restarts_operators_only_for_a_new_image(
        tmp_path: Path) -> None:
    result, calls = run_script(tmp_path, "--name", "other", STUB_CLUSTERS="kind\nother\n",
                               STUB_NEW_IMAGE_AT="1")
    assert result.returncode == 0, result.stderr
    assert not any(call.startswith("kind create") for call in calls)
    assert "kind cluster other exists" in result.stdout
    assert any(call.startswith("kubectl --context kind-other -n cellplane-system rollout restart")
               for call in calls), calls


def test_delete_removes_the_cluster_only(tmp_path: Path) -> None:
    result, calls = run_script(tmp_path, "--delete", KIND_CLUSTER_NAME="mine")
    assert result.returncode == 0, result.stderr
    assert calls == ["kind delete cluster --name mine"]


def test_a_missing_tool_is_named_before_anything_runs(tmp_path: Path) -> None:
    result, calls = run_script(tmp_path, tools=("docker", "kubectl"))
    assert result.returncode == 2
    assert "missing: kind helm" in result.stderr
    assert calls == []
