"""charts/cellplane, rendered by helm built from its Go module (helm.sh/helm/v3 at
HELM_VERSION in hack/versions.env, by hack/build-binaries.sh), applied to the real
kube-apiserver; then the operator runs as the chart's ServiceAccount, with a token
from the TokenRequest API and nothing else, and passes the placement tests.

The RBAC proof runs tests/integration/test_placement.py in a pytest subprocess with
CELLPLANE_OPERATOR_IDENTITY=chart: RegionPlane then installs the chart on that
module's control plane and starts every operator with the ServiceAccount's
kubeconfig (tests/chartinstall.py). The same switch works for any module whose
operators RegionPlane starts.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import chartinstall
from chartinstall import NAMESPACE, RELEASE, SERVICE_ACCOUNT
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import wait_for

REPO = Path(__file__).resolve().parents[2]
REGIONS = ("region-a", "region-b", "region-c")
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

# What the operator may do, and nothing more: (API group, resource, verb), and the
# names a rule is limited to. templates/rbac.yaml says which code needs each.
CLUSTER_GRANTS = {
    ("cellplane.io", "cells", verb) for verb in ("get", "list", "watch", "create", "patch", "delete")
} | {
    ("cellplane.io", f"{plural}/status", "patch") for plural in ("cells", "tenants", "tenantmoves")
} | {
    ("cellplane.io", plural, verb) for plural in ("tenants", "tenantmoves")
    for verb in ("list", "watch", "patch")
} | {
    ("", "secrets", verb) for verb in ("get", "create", "delete")
} | {
    ("", "events", "create"), ("", "events", "patch"), ("", "namespaces", "get"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
NAMESPACE_GRANTS = {("", "configmaps", verb) for verb in ("get", "create", "patch")}
# The kubernetes site driver's objects, in the cells' namespace (cells.namespace).
WRITE = ("get", "list", "watch", "create", "patch", "update", "delete")
CELL_NAMESPACE_GRANTS = {
    ("apps", resource, verb) for resource in ("statefulsets", "deployments") for verb in WRITE
} | {("", "services", verb) for verb in WRITE} | {
    ("", "persistentvolumeclaims", verb) for verb in ("get", "list", "watch", "patch", "delete")
} | {("", "pods", verb) for verb in ("get", "list", "watch", "delete")} | {
    ("", "secrets", verb) for verb in ("get", "create", "patch")
} | {("", "events", verb) for verb in ("create", "patch")}
CELL_RESOURCES = {
    "database": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    "api": {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}},
    "worker": {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}},
}


def three_regions(etcd_endpoints: list[str]) -> dict[str, Any]:
    """Values as a user writes them; region-b pinned to its own nodes and etcd member."""
    return {
        "regions": [{"name": "region-a"},
                    {"name": "region-b", "etcdEndpoints": [etcd_endpoints[0]],
                     "nodeSelector": {"topology.kubernetes.io/region": "region-b"}},
                    {"name": "region-c"}],
        "etcd": {"endpoints": etcd_endpoints},
        "nodeSelector": {"cellplane.io/operators": "true"},
        "image": {"repository": "registry.invalid/cellplane-operator", "tag": "test"},
    }


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for document in documents:
        found[document["kind"]][document["metadata"]["name"]] = document
    return found


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def operator_args(deployment: dict[str, Any]) -> list[str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["cellplane"]
    return list(container["args"])


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def operator_deployments(objects: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    return sorted(name for name, d in objects["Deployment"].items()
                  if d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator")


def test_chart_renders_one_operator_per_region_and_least_privilege_rbac() -> None:
    endpoints = ["etcd-a.example.internal:2379", "etcd-b.example.internal:2379",
                 "etcd-c.example.internal:2379"]
    values = three_regions(endpoints)
    lint = chartinstall.run_helm("lint", str(chartinstall.CHART), "--strict", "--values", "-",
                                 input_text=yaml.safe_dump(values))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objects = by_kind(chartinstall.documents(chartinstall.render(values)))

    deployments = objects["Deployment"]
    assert operator_deployments(objects) == [f"{RELEASE}-{region}" for region in REGIONS]
    for region in REGIONS:
        deployment = deployments[f"{RELEASE}-{region}"]
        assert deployment["metadata"]["namespace"] == NAMESPACE
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        pod = deployment["spec"]["template"]
        assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
        assert pod["metadata"]["labels"]["cellplane.io/region"] == region
        container = pod["spec"]["containers"][0]
        assert container["image"] == "registry.invalid/cellplane-operator:test"
        own_etcd = endpoints[:1] if region == "region-b" else endpoints
        assert operator_args(deployment) == [
            "operator", f"--region={region}", f"--regions={','.join(REGIONS)}",
            f"--etcd={','.join(own_etcd)}", f"--namespace={NAMESPACE}",
            "--state-dir=/var/lib/cellplane/sites", "--election-lease-seconds=10",
            "--election-renew-seconds=2", "--election-margin-seconds=2", "--resync-seconds=30",
            "--cell-image=registry.invalid/cellplane-operator:test",
            "--cell-image-pull-policy=IfNotPresent", f"--cell-namespace={NAMESPACE}",
            "--liveness=http://0.0.0.0:8080/healthz", "--metrics-host=0.0.0.0",
            "--metrics-port=9300"]
        assert json.loads(env_of(deployment)["CELLPLANE_CELL_RESOURCES"]) == CELL_RESOURCES
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == \
            {"metrics": 9300, "healthz": 8080}
        assert pod["spec"]["nodeSelector"] == (
            {"topology.kubernetes.io/region": "region-b"} if region == "region-b"
            else {"cellplane.io/operators": "true"})

        service = objects["Service"][f"{RELEASE}-{region}-metrics"]
        assert service["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "9300",
            "prometheus.io/path": "/metrics"}
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}]
        # The Service selects exactly this region's operator pod.
        selector = service["spec"]["selector"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert selector == deployment["spec"]["selector"]["matchLabels"]
        router_checks(objects, region, own_etcd, operator=deployment)
    assert len(objects["Service"]) == 3 * len(REGIONS)

    assert list(objects["ServiceAccount"]) == [SERVICE_ACCOUNT]
    cluster_role = objects["ClusterRole"][f"{RELEASE}-operator"]
    assert grants(cluster_role["rules"]) == CLUSTER_GRANTS
    assert not any("*" in str(rule) for rule in cluster_role["rules"]), "no wildcard grants"
    namespace_rules = [r for r in cluster_role["rules"] if "namespaces" in r["resources"]]
    assert [r.get("resourceNames") for r in namespace_rules] == [[NAMESPACE]]
    role = objects["Role"][f"{RELEASE}-operator"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role["rules"]) == NAMESPACE_GRANTS
    cells_role = objects["Role"][f"{RELEASE}-cells"]
    assert cells_role["metadata"]["namespace"] == NAMESPACE
    assert grants(cells_role["rules"]) == CELL_NAMESPACE_GRANTS
    assert not any("*" in str(rule) for rule in cells_role["rules"]), "no wildcard grants"
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    for kind, role_kind, name in (("ClusterRoleBinding", "ClusterRole", f"{RELEASE}-operator"),
                                  ("RoleBinding", "Role", f"{RELEASE}-operator"),
                                  ("RoleBinding", "Role", f"{RELEASE}-cells")):
        binding = objects[kind][name]
        assert binding["subjects"] == [subject]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": role_kind, "name": name}

    # The CRDs are exactly the project's (Helm's crds/ convention; byte-identity is
    # tests/unit/test_chart.py), and the cell-deletion guard comes with them.
    project_crds = {doc["metadata"]["name"]: doc for path in sorted((REPO / "crds").glob("*.yaml"))
                    for doc in yaml.safe_load_all(path.read_text())}
    assert objects["CustomResourceDefinition"] == project_crds
    policy = {doc["kind"]: doc for doc in
              yaml.safe_load_all((REPO / "deploy" / "admission" / "cell-deletion.yaml").read_text())}
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert objects[kind] == {policy[kind]["metadata"]["name"]: policy[kind]}


def router_checks(objects: dict[str, dict[str, dict[str, Any]]], region: str,
                  etcd: list[str], *, operator: dict[str, Any]) -> None:
    """The region's router: the operator's image, etcd and node pinning; its Service on the
    port tenants call, its metrics on a Service apart; no Kubernetes API token."""
    router = objects["Deployment"][f"{RELEASE}-router-{region}"]
    pod = router["spec"]["template"]
    container = pod["spec"]["containers"][0]
    operator_pod = operator["spec"]["template"]["spec"]
    assert container["image"] == operator_pod["containers"][0]["image"]
    assert container["command"] == ["cellplane"]
    assert container["args"] == ["router", f"--etcd={','.join(etcd)}", "--host=0.0.0.0",
                                 "--port=8080", "--hold-seconds=15", "--metrics-host=0.0.0.0",
                                 "--metrics-port=9300"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == \
        {"http": 8080, "metrics": 9300}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["securityContext"] == operator_pod["containers"][0]["securityContext"]
    assert pod["spec"]["securityContext"] == operator_pod["securityContext"]
    assert pod["spec"]["nodeSelector"] == operator_pod["nodeSelector"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod["spec"]
    labels = pod["metadata"]["labels"]
    assert (labels["app.kubernetes.io/component"], labels["cellplane.io/region"]) == \
        ("router", region)
    service = objects["Service"][f"{RELEASE}-router-{region}"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    metrics = objects["Service"][f"{RELEASE}-router-{region}-metrics"]
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}]
    assert metrics["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    for selecting in (service, metrics):
        selector = selecting["spec"]["selector"]
        assert selector == router["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        # Never the operator's pod.
        assert not selector.items() <= operator["spec"]["template"]["metadata"]["labels"].items()


def test_chart_renders_the_cell_defaults_and_their_namespace() -> None:
    values = {**three_regions(["etcd-a.example.internal:2379"]),
              "cells": {"image": {"repository": "registry.invalid/cells", "tag": "7",
                                  "pullPolicy": "Always"},
                        "namespace": "cells", "storageClass": "fast-ssd",
                        "resources": {"database": {"limits": {"memory": "4Gi"}}}},
              "router": {"replicas": 2, "holdSeconds": 5, "containerPort": 8000,
                         "service": {"type": "LoadBalancer", "port": 80},
                         "resources": {"limits": {"memory": "256Mi"}}},
              "metrics": {"enabled": False}}
    objects = by_kind(chartinstall.documents(chartinstall.render(values, include_crds=False)))
    deployment = objects["Deployment"][f"{RELEASE}-region-a"]
    args = operator_args(deployment)
    assert [a for a in args if a.startswith("--cell-")] == [
        "--cell-image=registry.invalid/cells:7", "--cell-image-pull-policy=Always",
        "--cell-namespace=cells", "--cell-storage-class=fast-ssd"]
    # Helm merges maps: a value sets what it names, the chart's defaults keep the rest.
    resources = json.loads(env_of(deployment)["CELLPLANE_CELL_RESOURCES"])
    assert resources["database"] == {"requests": CELL_RESOURCES["database"]["requests"],
                                     "limits": {"memory": "4Gi"}}
    assert resources["api"] == CELL_RESOURCES["api"]
    # The site objects' Role goes where the sites are; the operator's stays at home.
    assert objects["Role"][f"{RELEASE}-cells"]["metadata"]["namespace"] == "cells"
    assert objects["RoleBinding"][f"{RELEASE}-cells"]["subjects"] == [
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    assert objects["Role"][f"{RELEASE}-operator"]["metadata"]["namespace"] == NAMESPACE
    # The routers: replicas, hold, port and Service as set; no metrics Services.
    router = objects["Deployment"][f"{RELEASE}-router-region-a"]
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert router["spec"]["replicas"] == 2
    assert container["args"] == ["router", "--etcd=etcd-a.example.internal:2379",
                                 "--host=0.0.0.0", "--port=8000", "--hold-seconds=5"]
    assert container["resources"] == {"limits": {"memory": "256Mi"}}
    service = objects["Service"][f"{RELEASE}-router-region-a"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert sorted(objects["Service"]) == [f"{RELEASE}-router-{region}" for region in REGIONS]


def test_chart_without_routers() -> None:
    values = {**three_regions(["etcd-a.example.internal:2379"]), "router": {"enabled": False}}
    objects = by_kind(chartinstall.documents(chartinstall.render(values, include_crds=False)))
    assert operator_deployments(objects) == sorted(objects["Deployment"])
    assert not any("router" in name for name in objects["Service"])


@pytest.mark.parametrize(("values", "message"), [
    ({"etcd": {"endpoints": []}}, "has no etcd endpoints"),
    ({"regions": [], "etcd": {"endpoints": ["e:2379"]}}, "regions is empty"),
    ({"regions": [{"name": "Region_A"}], "etcd": {"endpoints": ["e:2379"]}}, "is not a DNS label"),
    ({"regions": [{"name": "a"}, {"name": "a"}], "etcd": {"endpoints": ["e:2379"]}},
     "lists a name twice"),
], ids=["no-etcd", "no-regions", "bad-region-name", "duplicate-region"])
def test_chart_refuses_values_it_cannot_deploy_and_says_why(values: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        chartinstall.render(values)


def test_placement_tests_pass_with_the_operators_running_as_the_charts_service_account(
        tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    env = {**os.environ, chartinstall.IDENTITY_ENV: "chart",
           chartinstall.EVIDENCE_ENV: str(evidence)}
    # The outer run's options (say -k or -x) must not select or stop the inner module.
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration/test_placement.py", "-q",
         "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, (
        f"the placement tests failed as the chart's ServiceAccount:\n{result.stdout[-6000:]}"
        f"\n{result.stderr[-2000:]}")
    assert " passed" in summary and "skipped" not in summary and "error" not in summary, summary

    # The switch took effect: the operators' apiserver identity was the ServiceAccount,
    # and none of their requests was refused.
    assert (evidence / "identity.txt").read_text().strip() == SA_USER
    logs = sorted(evidence.glob("*operator-region-*.log"))
    assert {log.name.split("-operator-")[1] for log in logs} == {"region-a.log", "region-c.log"}
    for log in logs:
        region = log.name.split("-operator-")[1].removesuffix(".log")
        text = log.read_text()
        assert f"regional operator for {region} up" in text
        assert chartinstall.refusals(log) == [], log.name


def test_chart_applies_and_the_service_account_is_refused_what_the_chart_does_not_grant(
        kube: LocalControlPlane, tmp_path: Path) -> None:
    applied = by_kind(chartinstall.install(kube, three_regions(list(kube.etcd.endpoints))))
    stored = json.loads(kube.kubectl("get", "deployments,services,serviceaccounts,roles,"
                                     "rolebindings", "-n", NAMESPACE, "-o", "json").stdout)
    names = {(item["kind"], item["metadata"]["name"]) for item in stored["items"]}
    for kind in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"):
        assert {(kind, name) for name in applied[kind]} <= names
    for kind in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                 "ValidatingAdmissionPolicyBinding", "CustomResourceDefinition"):
        for name in applied[kind]:
            kube.kubectl("get", kind.lower(), name)

    kubeconfig = chartinstall.service_account_kubeconfig(kube, tmp_path / "sa.kubeconfig")
    config = yaml.safe_load(kubeconfig.read_text())
    user = config["users"][0]["user"]
    assert set(user) == {"token"}, "the ServiceAccount's kubeconfig holds its token and nothing else"
    assert chartinstall.whoami(kube, kubeconfig) == SA_USER
    assert kube.apiserver is not None and kube.apiserver.pki is not None
    api = httpx.Client(base_url=kube.apiserver.url,
                       verify=ssl.create_default_context(cafile=str(kube.apiserver.pki.ca_cert)),
                       headers={"Authorization": f"Bearer {user['token']}"}, timeout=30)

    # Granted: reading the release namespace, listing cells. A CRD's storage answers 429
    # (with Retry-After) until its watch cache has started; that is no verdict on RBAC.
    assert api.get(f"/api/v1/namespaces/{NAMESPACE}").status_code == 200
    listed: list[httpx.Response] = []

    def cells_answered() -> bool:
        listed.append(api.get("/apis/cellplane.io/v1alpha1/cells"))
        return listed[-1].status_code != 429

    wait_for(cells_answered, timeout=60, what="the cells' storage to answer")
    assert listed[-1].status_code == 200, listed[-1].text

    # Not granted: each is a real request, refused by the apiserver's RBAC.
    refused = {
        "delete the release namespace": api.delete(f"/api/v1/namespaces/{NAMESPACE}"),
        "read another namespace": api.get("/api/v1/namespaces/default"),
        "list Secrets": api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets"),
        "delete the Cell CRD": api.delete(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/cells.cellplane.io"),
        "create a ClusterRole": api.post(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            json={"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": "cellplane-escalation"},
                  "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        "update a Tenant (only patch is granted)": api.put(
            f"/apis/cellplane.io/v1alpha1/namespaces/{NAMESPACE}/tenants/anyone",
            json={"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
                  "metadata": {"name": "anyone", "namespace": NAMESPACE},
                  "spec": {"plan": "free", "homeRegion": "region-a"}}),
    }
    for what, response in refused.items():
        assert (response.status_code, response.json().get("reason")) == (403, "Forbidden"), \
            f"{what}: {response.status_code} {response.text[:300]}"
        assert f'User "{SA_USER}" cannot' in response.json()["message"], what
    api.close()
    # Refused, so nothing happened.
    kube.kubectl("get", "namespace", NAMESPACE)
    kube.kubectl("get", "crd", "cells.cellplane.io")
    assert kube.kubectl("get", "clusterrole", "cellplane-escalation", check=False).returncode != 0

    # The same as kubectl shows it to a person holding that kubeconfig.
    deletion = subprocess.run([str(kube.binaries.kubectl), f"--kubeconfig={kubeconfig}", "delete",
                               "namespace", NAMESPACE, "--wait=false"],
                              capture_output=True, text=True, timeout=60, check=False)
    assert deletion.returncode != 0 and "Forbidden" in deletion.stderr, deletion.stderr

    def can_i(*args: str) -> bool:
        answer = subprocess.run([str(kube.binaries.kubectl), f"--kubeconfig={kubeconfig}", "auth",
                                 "can-i", *args], capture_output=True, text=True, timeout=60,
                                check=False)
        return answer.stdout.strip() == "yes"

    allowed = [("create", "cells.cellplane.io"), ("patch", "tenants.cellplane.io/status", "-A"),
               ("create", "secrets", "-n", "tenant-ns"), ("create", "events", "-n", "tenant-ns"),
               ("patch", "configmaps", "-n", NAMESPACE), ("watch", "tenantmoves.cellplane.io", "-A"),
               ("create", "statefulsets.apps", "-n", NAMESPACE),
               ("delete", "persistentvolumeclaims", "-n", NAMESPACE),
               ("patch", "secrets", "-n", NAMESPACE), ("delete", "pods", "-n", NAMESPACE)]
    denied = [("update", "cells.cellplane.io"), ("list", "secrets", "-A"),
              ("watch", "secrets", "-n", NAMESPACE), ("create", "configmaps", "-n", "tenant-ns"),
              ("create", "namespaces"), ("delete", "customresourcedefinitions"),
              ("create", "pods", "-n", NAMESPACE), ("create", "rolebindings", "-n", NAMESPACE),
              ("delete", "tenants.cellplane.io", "-A"), ("get", "namespaces/default"),
              ("create", "statefulsets.apps", "-n", "tenant-ns"),
              ("create", "persistentvolumeclaims", "-n", NAMESPACE),
              ("patch", "secrets", "-n", "tenant-ns"), ("create", "pods/exec", "-n", NAMESPACE)]
    assert [args for args in allowed if not can_i(*args)] == []
    assert [args for args in denied if can_i(*args)] == []


def test_the_rendered_operator_command_line_runs_as_the_service_account(
        kube: LocalControlPlane, tmp_path: Path) -> None:
    """The container's arguments, as rendered, start a real operator authenticated by the
    ServiceAccount's token; only what a pod has to itself (the state directory and two
    ports) is moved aside for a shared machine. Its /metrics and /healthz answer."""
    rendered = by_kind(chartinstall.install(kube, three_regions(list(kube.etcd.endpoints))))
    args = operator_args(rendered["Deployment"][f"{RELEASE}-region-a"])
    metrics_port, liveness_port = free_port(), free_port()
    local = {"--state-dir": str(tmp_path / "sites"), "--metrics-host": LOOPBACK,
             "--metrics-port": str(metrics_port),
             "--liveness": f"http://{LOOPBACK}:{liveness_port}/healthz"}
    moved = [f"{flag}={local[flag]}" if (flag := arg.split("=", 1)[0]) in local else arg
             for arg in args]
    assert len(moved) == len(args) and sum(a != b for a, b in zip(args, moved)) == len(local)
    kubeconfig = chartinstall.service_account_kubeconfig(kube, tmp_path / "sa.kubeconfig")
    operator = ManagedProcess("operator-from-chart",
                              [sys.executable, "-m", "cellplane_operator", *moved],
                              log=tmp_path / "operator-from-chart.log",
                              env={"KUBECONFIG": str(kubeconfig)})
    operator.start()
    try:
        def answers(url: str) -> bool:
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        operator.wait_until(lambda: answers(f"http://{LOOPBACK}:{liveness_port}/healthz"),
                            timeout=60, what="kopf's liveness endpoint to answer")
        operator.wait_until(lambda: answers(f"http://{LOOPBACK}:{metrics_port}/metrics"),
                            timeout=30, what="/metrics to answer")
    finally:
        operator.stop()
    log = operator.log.read_text()
    assert "regional operator for region-a up" in log, log[-3000:]
    assert chartinstall.refusals(operator.log) == []


def test_helm_install_and_uninstall_on_the_apiserver(kube: LocalControlPlane) -> None:
    """`helm install` itself, as the README tells a user to run it: Helm checks the
    chart's kubeVersion against the real apiserver, leaves the existing CRDs alone,
    creates the rest and records the release; `helm uninstall` removes it again.

    A release of its own name and namespace, beside the one the other tests applied;
    without the admission policy, which the control plane already installed under
    the same (cluster-wide, fixed) name and Helm does not adopt objects it did not make.
    """
    release, namespace = "cellplane-helm", "cellplane-helm"
    values = {**three_regions(list(kube.etcd.endpoints)), "admissionPolicy": {"enabled": False}}
    installed = chartinstall.run_helm(
        "install", release, str(chartinstall.CHART), f"--kubeconfig={kube.kubeconfig}",
        "--namespace", namespace, "--create-namespace", "--wait=false", "--values", "-",
        input_text=yaml.safe_dump(values))
    assert installed.returncode == 0, installed.stderr
    assert "STATUS: deployed" in installed.stdout
    assert "one operator per region (region-a,region-b,region-c)" in installed.stdout
    deployments = json.loads(kube.kubectl("get", "deployments", "-n", namespace,
                                          "-o", "json").stdout)
    assert sorted(d["metadata"]["name"] for d in deployments["items"]) == sorted(
        [f"{release}-{region}" for region in REGIONS]
        + [f"{release}-router-{region}" for region in REGIONS])
    kube.kubectl("get", "clusterrole", f"{release}-operator")
    listed = chartinstall.run_helm("list", f"--kubeconfig={kube.kubeconfig}", "-n", namespace,
                                   "-o", "json")
    assert [(r["name"], r["status"]) for r in json.loads(listed.stdout)] == [(release, "deployed")]

    removed = chartinstall.run_helm("uninstall", release, f"--kubeconfig={kube.kubeconfig}",
                                    "-n", namespace, "--wait=false")
    assert removed.returncode == 0, removed.stderr
    assert kube.kubectl("get", "clusterrole", f"{release}-operator", check=False).returncode != 0
    # crds/ are never deleted by Helm: the Cells, Tenants and TenantMoves stay.
    kube.kubectl("get", "crd", "cells.cellplane.io")
