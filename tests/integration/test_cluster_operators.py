"""The chart installed for real on the local cluster (issue #16): the regional operators
are Pods of the chart's Deployments, one on each region's node, running the image built
from the repository's Dockerfile with the chart's ServiceAccount, and they place
Tenants applied with kubectl. The cells are still the local driver's processes inside
the operator's pod, on the region's PersistentVolume.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clusterfixtures import (
    api_key,
    await_phase,
    deployment,
    eventually,
    http_in_operator,
    in_operator,
    operator_pods,
    pod_ready,
    status_of,
)
from cellplane_operator.localplane.cluster import LocalCluster
from cellplane_operator.localplane.clusterchart import NAMESPACE, RELEASE
from cellplane_operator.placement.records import PlacementRecords, TenantKey
from cellplane_operator.store.etcd import EtcdStore

pytestmark = pytest.mark.cluster

REGIONS = ("region-a", "region-b", "region-c")
PRODUCT_LEASE = {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}


@pytest.fixture(scope="module")
def operators(local_cluster: LocalCluster, cluster_operators: dict[str, Any]) -> LocalCluster:
    return local_cluster


@pytest.fixture(scope="module")
def tenants_namespace(operators: LocalCluster) -> Iterator[str]:
    namespace = f"tenants-{uuid.uuid4().hex[:6]}"
    operators.kubectl("create", "namespace", namespace)
    yield namespace
    operators.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_each_region_runs_its_operator_as_a_pod_of_the_chart_on_its_own_node(
        operators: LocalCluster) -> None:
    for region in REGIONS:
        pods = operator_pods(operators, region)
        assert len(pods) == 1, pods
        pod = pods[0]
        assert pod_ready(pod), pod["status"]
        assert pod["spec"]["nodeName"] == operators.plan.node(region).name
        assert pod["spec"]["serviceAccountName"] == RELEASE
        container = pod["spec"]["containers"][0]
        assert container["image"].startswith("localhost/cellplane-operator:")
        assert container["imagePullPolicy"] == "Never"
        assert f"--region={region}" in container["args"]
        assert container["livenessProbe"] and container["readinessProbe"]
        assert container["resources"]["requests"], container
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "state")
        assert volume["persistentVolumeClaim"]["claimName"] == f"{RELEASE}-{region}-state"
        # The pod's identity is the chart's ServiceAccount, not an admin's.
        assert "system:serviceaccount:cellplane-system:cellplane" in in_operator(
            operators, region,
            "import pathlib, base64, json\n"
            "token = pathlib.Path('/var/run/secrets/kubernetes.io/serviceaccount/token').read_text()\n"
            "print(json.loads(base64.urlsafe_b64decode(token.split('.')[1] + '==')))")


def test_logs_exec_and_port_forward_reach_the_operator_from_this_machine(
        operators: LocalCluster) -> None:
    logs = operators.kubectl("logs", "-n", NAMESPACE, f"deploy/{deployment('region-b')}",
                             "--tail=200").stdout
    assert "region-b" in logs, logs[-2000:]
    assert in_operator(operators, "region-b", "import os; print(os.getuid())").strip() == "65532"

    forward = subprocess.Popen(
        [str(operators.programs.base.kubectl), f"--kubeconfig={operators.kubeconfig}",
         "port-forward", "-n", NAMESPACE, f"deploy/{deployment('region-b')}", ":9300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:<port> -> 9300"
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert found, (line, forward.stderr.read() if forward.poll() is not None else "")
        metrics = httpx.get(f"http://127.0.0.1:{found.group(1)}/metrics", timeout=30)
        assert metrics.status_code == 200
        assert 'cellplane_operator_group_owned{group="placement",kind="election"' in metrics.text
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_tenants_applied_with_kubectl_are_placed_by_the_operator_pods(
        operators: LocalCluster, tenants_namespace: str) -> None:
    # A cell and a tenant in every region: whichever region's operator leads the
    # placement, it provisions at least two tenants in cells that run in other pods.
    names = {"region-a": "acme", "region-b": "globex", "region-c": "initech"}
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
        "metadata": {"name": f"pods-{region[-1]}1"},
        "spec": {"region": region, "tier": "shared",
                 "capacity": {"tenants": 10, "workerSlots": 20}, "lease": PRODUCT_LEASE,
                 "driver": {"allowPrivateTargets": True}}} for region in REGIONS])
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
        "metadata": {"name": name, "namespace": tenants_namespace},
        "spec": {"plan": "pro", "homeRegion": region,
                 "targets": [{"name": "default", "url": "http://127.0.0.1:9/run"}]}}
        for region, name in names.items()])
    statuses = {}
    for region, name in names.items():
        cell = await_phase(operators, "cell", f"pods-{region[-1]}1", "Ready")
        assert cell["activeRegion"] == region
        statuses[name] = status = await_phase(operators, "tenant", name, "Ready",
                                              namespace=tenants_namespace)
        assert (status["cell"], status["epoch"], status["apiKeySecret"]) == (
            f"pods-{region[-1]}1", 1, f"{name}-api-key")
        # Published with the pod's IP: the cell serves where other pods reach it.
        (pod,) = operator_pods(operators, region)
        assert status["apiEndpoint"].startswith(f"http://{pod['status']['podIP']}:")

    # The placements are in the ownership etcd, whose members run on the region nodes.
    async def read() -> Any:
        store = EtcdStore(operators.ownership_relayed_endpoints, timeout=5)
        try:
            return await PlacementRecords(store).read_all()
        finally:
            await store.close()

    placed = asyncio.run(read())
    for name, status in statuses.items():
        record = placed[TenantKey(tenants_namespace, name)].record
        assert (record.cell, record.tenant_id) == (status["cell"], status["tenantId"])


def test_a_deleted_operator_pod_comes_back_and_starts_its_cells_on_their_data(
        operators: LocalCluster, tenants_namespace: str) -> None:
    tenant = await_phase(operators, "tenant", "acme", "Ready", namespace=tenants_namespace)
    cell_before = await_phase(operators, "cell", "pods-a1", "Ready")
    assert tenant["cell"] == "pods-a1"
    headers = {"Authorization": f"Bearer {api_key(operators, tenants_namespace, 'acme-api-key')}",
               "Idempotency-Key": "before-the-pod-went"}
    code, answer = http_in_operator(operators, "region-a", "POST",
                                    f"{tenant['apiEndpoint']}/v1/jobs", headers,
                                    {"target": "default", "payload": {"kept": True}})
    assert code == 202, answer
    job_id = answer["job_id"]
    code, job_before = http_in_operator(operators, "region-a", "GET",
                                        f"{tenant['apiEndpoint']}/v1/jobs/{job_id}",
                                        {"Authorization": headers["Authorization"]})
    assert code == 200, job_before

    (old,) = operator_pods(operators, "region-a")
    operators.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"],
                      "--grace-period=0", "--force", timeout=120)
    began = time.monotonic()

    def replaced() -> bool:
        pods = operator_pods(operators, "region-a")
        return (len(pods) == 1 and pods[0]["metadata"]["uid"] != old["metadata"]["uid"]
                and pod_ready(pods[0]))

    eventually(replaced, timeout=300, interval=1, what="the Deployment's new operator pod Ready")
    (new,) = operator_pods(operators, "region-a")
    assert new["spec"]["nodeName"] == old["spec"]["nodeName"]

    def serving_again() -> bool:
        status = status_of(operators, "tenant", "acme", tenants_namespace)
        if status.get("phase") != "Ready" or not status.get("apiEndpoint"):
            return False
        code, _ = http_in_operator(operators, "region-a", "GET",
                                   f"{status['apiEndpoint']}/v1/jobs/{job_id}",
                                   {"Authorization": headers["Authorization"]})
        return bool(code == 200)

    eventually(serving_again, timeout=300, interval=2,
               what="the tenant's cell to serve again from the new pod")
    print(f"operator pod replaced and the cell serving again in {time.monotonic() - began:.1f} s")
    # The job accepted before the pod went is there: the cell's database was started
    # again on its volume, not created anew.
    status = status_of(operators, "tenant", "acme", tenants_namespace)
    code, job = http_in_operator(operators, "region-a", "GET",
                                 f"{status['apiEndpoint']}/v1/jobs/{job_id}",
                                 {"Authorization": headers["Authorization"]})
    assert code == 200, job
    assert (job["job_id"], job["created_at"]) == (job_id, job_before["created_at"])
    assert status["tenantId"] == tenant["tenantId"] and status["cell"] == "pods-a1"
    cell_after = await_phase(operators, "cell", "pods-a1", "Ready")
    assert cell_after["activeRegion"] == "region-a"
    assert cell_after["epoch"] >= cell_before["epoch"]


def test_local_reload_imports_the_images_and_rolls_the_operators_onto_them(
        operators: LocalCluster, tmp_path: Path) -> None:
    before = {region: operator_pods(operators, region)[0]["metadata"]["uid"]
              for region in REGIONS}
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"cluster_state": str(operators.state_file)}))
    result = subprocess.run([sys.executable, "-m", "cellplane_operator", "local", "reload",
                             "--state", str(state)],
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "imported into" in result.stdout and "3 operator and 3 router Deployment(s) restarted" in result.stdout
    for region in REGIONS:
        pods = operator_pods(operators, region)
        assert len(pods) == 1 and pods[0]["metadata"]["uid"] != before[region]
        assert pod_ready(pods[0])
