"""The local cluster (issue #16): a control plane and a node per region, each node in a
network namespace of its own, on real kubelets, containerd and kube-proxy.

One cluster serves the whole session (``local_cluster``, conftest); the tests that
break a node or a link put it back before they end. The tests of ``down`` start
small clusters of their own through the command line.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clusterfixtures import Workloads, eventually, pod_ip, processes_in_netns
from cellplane_operator.localplane.cluster import STORAGE_CLASS, LocalCluster
from cellplane_operator.localplane.mounts import mounts_under
from cellplane_operator.localplane.netns import existing_netns, netns_path, run_in_netns

pytestmark = pytest.mark.cluster

REGIONS = ("region-a", "region-b", "region-c")


@pytest.fixture(scope="module")
def workloads(local_cluster: LocalCluster) -> Iterator[Workloads]:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    local_cluster.kubectl("create", "namespace", namespace)
    # The namespace's default ServiceAccount is made by the controller manager;
    # a pod created before it exists is refused.
    eventually(lambda: local_cluster.kubectl("-n", namespace, "get", "serviceaccount",
                                             "default", check=False).returncode == 0,
               timeout=120, what="the default ServiceAccount")
    workloads = Workloads(local_cluster, namespace)
    workloads.apply(*(workloads.web_pod(f"web-{region}", region) for region in REGIONS))
    workloads.apply({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": "web"},
                     "spec": {"selector": {"app": "web"},
                              "ports": [{"port": 80, "targetPort": 8080}]}})
    for region in REGIONS:
        workloads.wait_ready(f"pod/web-{region}")
    yield workloads
    local_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_every_region_has_a_ready_node_with_its_labels(local_cluster: LocalCluster) -> None:
    nodes = local_cluster.get_json("nodes")["items"]
    by_region = {node["metadata"]["labels"]["topology.kubernetes.io/region"]: node
                 for node in nodes}
    assert sorted(by_region) == list(REGIONS)
    for region, node in by_region.items():
        labels = node["metadata"]["labels"]
        assert labels["topology.kubernetes.io/zone"] == f"{region}-1"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["status"]["conditions"]
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal == [local_cluster.plan.node(region).address]


def test_a_pod_runs_on_each_node(workloads: Workloads, local_cluster: LocalCluster) -> None:
    for region in REGIONS:
        pod = workloads.get("pod", f"web-{region}")
        assert pod["spec"]["nodeName"] == local_cluster.plan.node(region).name
        assert ipaddress.ip_address(pod_ip(workloads, f"web-{region}")) in \
            ipaddress.ip_network(local_cluster.plan.node(region).pod_cidr)
    # kubectl logs goes apiserver -> kubelet inside the node's namespace.
    assert "Serving HTTP" in workloads.kubectl("logs", "web-region-a").stdout


def test_pods_reach_each_other_across_nodes(workloads: Workloads) -> None:
    for source, target in (("region-a", "region-b"), ("region-b", "region-c"),
                           ("region-c", "region-a")):
        url = f"http://{pod_ip(workloads, f'web-{target}')}:8080/"
        assert workloads.fetch(f"web-{source}", url).stdout.strip() == target


def test_a_service_spreads_across_nodes_through_kube_proxy(workloads: Workloads) -> None:
    cluster_ip = workloads.get("service", "web")["spec"]["clusterIP"]
    code = ("import urllib.request\nseen = set()\n"
            "for _ in range(200):\n"
            f"    seen.add(urllib.request.urlopen('http://{cluster_ip}/', timeout=5)"
            ".read().decode().strip())\n"
            "    if len(seen) == 3: break\n"
            "print(','.join(sorted(seen)))")
    # kube-proxy programs the Service a moment after its endpoints exist.
    seen: set[str] = set()

    def spread() -> bool:
        result = workloads.exec_python("web-region-a", code, check=False)
        if result.returncode == 0:
            seen.update(result.stdout.strip().split(","))
        return seen == set(REGIONS)

    eventually(spread, timeout=120, interval=2, what="the Service answering from every node")


def test_a_service_name_resolves_in_a_pod(workloads: Workloads) -> None:
    cluster_ip = workloads.get("service", "web")["spec"]["clusterIP"]
    name = f"web.{workloads.namespace}.svc.cluster.local"
    code = f"import socket; print(socket.gethostbyname({name!r}))"
    resolved: list[str] = []

    def resolves() -> bool:
        result = workloads.exec_python("web-region-b", code, check=False)
        resolved.append(result.stdout.strip() or result.stderr.strip())
        return result.returncode == 0 and result.stdout.strip() == cluster_ip

    eventually(resolves, timeout=60, interval=1, what=f"{name} -> {cluster_ip}: {resolved[-1:]}")
    # And the short name through the pod's search path, fetched over the Service.
    assert workloads.fetch("web-region-b", "http://web/").stdout.strip() in REGIONS


def _connects(cluster: LocalCluster, netns: str, address: str, port: int) -> bool:
    def attempt() -> bool:
        try:
            with socket.create_connection((address, port), timeout=2):
                return True
        except OSError:
            return False

    return run_in_netns(netns, attempt)


def test_partition_cuts_a_region_off_and_heal_restores_it(
        local_cluster: LocalCluster, workloads: Workloads) -> None:
    node_a = local_cluster.plan.node("region-a")
    control = local_cluster.plan.control_netns
    url = f"http://{pod_ip(workloads, 'web-region-a')}:8080/"
    assert _connects(local_cluster, control, node_a.address, 10250)
    local_cluster.partition("region-a")
    try:
        assert not _connects(local_cluster, control, node_a.address, 10250)
        assert not _connects(local_cluster, local_cluster.plan.node("region-b").netns,
                             node_a.address, 10250)
        assert workloads.fetch("web-region-b", url, check=False, timeout=3).returncode != 0
    finally:
        local_cluster.heal("region-a")
    eventually(lambda: _connects(local_cluster, control, node_a.address, 10250),
               timeout=30, what="region-a reachable again")
    assert workloads.fetch("web-region-b", url).stdout.strip() == "region-a"


def _member_healthy(cluster: LocalCluster, region: str) -> bool:
    """The region's ownership etcd member answers /health true (through its relay)."""
    port = cluster.ownership_relay_ports[region]
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=3)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json().get("health") == "true"


def test_the_ownership_etcd_has_a_member_on_each_node_that_goes_with_its_region(
        local_cluster: LocalCluster) -> None:
    assert local_cluster.ownership_endpoints == [
        f"{local_cluster.plan.node(region).address}:2379" for region in REGIONS]
    for region in REGIONS:
        eventually(lambda: _member_healthy(local_cluster, region), timeout=60,
                   what=f"the member of {region} healthy")
    local_cluster.partition("region-b")
    try:
        eventually(lambda: not _member_healthy(local_cluster, "region-b"), timeout=60,
                   what="region-b's member cut off")
        # Two of three members keep the quorum: the ownership table still answers (once
        # they have elected a leader, if region-b's member was it).
        for region in ("region-a", "region-c"):
            eventually(lambda: _member_healthy(local_cluster, region), timeout=60,
                       what=f"{region}'s member healthy without region-b")
    finally:
        local_cluster.heal("region-b")
    eventually(lambda: _member_healthy(local_cluster, "region-b"), timeout=60,
               what="region-b's member back in the cluster")


def test_secrets_are_encrypted_in_the_control_planes_etcd(local_cluster: LocalCluster,
                                                         workloads: Workloads) -> None:
    marker = f"plain-{uuid.uuid4().hex}"
    workloads.kubectl("create", "secret", "generic", "at-rest", f"--from-literal=value={marker}")
    key = f"/registry/secrets/{workloads.namespace}/at-rest"

    def read_raw() -> bytes:
        # etcd's JSON gateway on its loopback, from a thread inside the control plane's
        # namespace (the only place that address exists).
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        request = urllib.request.Request("http://127.0.0.1:2379/v3/kv/range", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            kvs = json.loads(answer.read()).get("kvs") or [{}]
        return base64.b64decode(kvs[0].get("value", ""))

    raw = run_in_netns(local_cluster.plan.control_netns, read_raw)
    assert raw.startswith(b"k8s:enc:secretbox:v1:"), raw[:40]
    assert marker.encode() not in raw
    read = workloads.get("secret", "at-rest")
    assert base64.b64decode(read["data"]["value"]).decode() == marker


def _node_processes(cluster: LocalCluster, region: str) -> list[int]:
    """Every process of the node: in its cgroups, or in its network namespace."""
    return sorted(cluster.node_pids(region)
                  | set(processes_in_netns(netns_path(cluster.plan.node(region).netns))))


def test_a_killed_node_leaves_no_process_and_comes_back_ready(
        local_cluster: LocalCluster, workloads: Workloads) -> None:
    assert _node_processes(local_cluster, "region-c")
    before = workloads.get("pod", "web-region-c")["status"]["containerStatuses"][0]
    local_cluster.kill_node("region-c")
    try:
        assert _node_processes(local_cluster, "region-c") == []
        assert not _member_healthy(local_cluster, "region-c")  # its etcd member went too
        node_dir = local_cluster.run_dir / "region-c"
        assert mounts_under(node_dir) == []
    finally:
        local_cluster.start_node("region-c")
    assert local_cluster.node_ready("region-c")
    eventually(lambda: _member_healthy(local_cluster, "region-c"), timeout=60,
               what="region-c's member back on its data")

    def restarted() -> bool:
        status = workloads.get("pod", "web-region-c")["status"]
        containers = status.get("containerStatuses") or [{}]
        return bool(containers[0].get("ready")) and (
            containers[0].get("containerID") != before.get("containerID"))

    eventually(restarted, timeout=240, interval=1, what="web-region-c running again")
    url = f"http://{pod_ip(workloads, 'web-region-c')}:8080/"
    eventually(lambda: workloads.fetch("web-region-a", url, check=False).stdout.strip()
               == "region-c", timeout=60, interval=1, what="web-region-c answering")


def test_a_statefulset_keeps_its_data_across_pod_deletion_and_node_restart(
        local_cluster: LocalCluster, workloads: Workloads) -> None:
    workloads.apply({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "keeper"},
        "spec": {
            "serviceName": "keeper", "replicas": 1,
            "selector": {"matchLabels": {"app": "keeper"}},
            "template": {
                "metadata": {"labels": {"app": "keeper"}},
                "spec": {
                    "nodeSelector": {"topology.kubernetes.io/region": "region-b"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [workloads.container(
                        "keeper", "exec sleep infinity",
                        volumeMounts=[{"name": "data", "mountPath": "/data"}])],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                         "resources": {"requests": {"storage": "100Mi"}}},
            }],
        },
    })
    eventually(lambda: workloads.kubectl("get", "pod", "keeper-0", check=False).returncode == 0,
               timeout=60, what="keeper-0 created")
    workloads.wait_ready("pod/keeper-0")
    token = uuid.uuid4().hex
    workloads.kubectl("exec", "keeper-0", "--", "sh", "-c", f"echo {token} > /data/token")
    claim = workloads.get("pvc", "data-keeper-0")
    volume = workloads.get("pv", claim["spec"]["volumeName"])
    assert volume["spec"]["local"]["path"].startswith(str(local_cluster.run_dir / "region-b"))

    def reads_token() -> bool:
        result = workloads.kubectl("exec", "keeper-0", "--", "cat", "/data/token", check=False)
        return result.returncode == 0 and result.stdout.strip() == token

    uid = workloads.get("pod", "keeper-0")["metadata"]["uid"]
    workloads.kubectl("delete", "pod", "keeper-0", "--wait=true", timeout=180)
    eventually(lambda: workloads.kubectl("get", "pod", "keeper-0", "-o", "jsonpath={.metadata.uid}",
                                         check=False).stdout not in ("", uid),
               timeout=120, what="keeper-0 recreated")
    workloads.wait_ready("pod/keeper-0")
    assert reads_token()

    container = workloads.get("pod", "keeper-0")["status"]["containerStatuses"][0]["containerID"]
    local_cluster.kill_node("region-b")
    local_cluster.start_node("region-b")

    def restarted() -> bool:
        status = workloads.get("pod", "keeper-0")["status"]
        containers = status.get("containerStatuses") or [{}]
        return bool(containers[0].get("ready")) and containers[0].get("containerID") != container

    eventually(restarted, timeout=240, interval=1, what="keeper-0 running again after the restart")
    eventually(reads_token, timeout=60, interval=1, what="the token read back")


# --- down: nothing is left ------------------------------------------------------------

_CLUSTER_MARKS = ("10.77.", "10.244.", "10.96.", "KUBE-", "CNI-", "cni0", "br0")


def _host_snapshot() -> dict[str, object]:
    """What a cluster must not leave in the machine's own namespace: iptables rules and
    routes that name its ranges or chains, veths and bridges. (Read in the machine's
    namespace, which other programs share: only what a cluster would add is compared.)"""
    def run(*argv: str) -> list[str]:
        result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        return result.stdout.splitlines()

    return {
        "iptables": sorted(line for line in run("iptables-save")
                           if any(mark in line for mark in _CLUSTER_MARKS)),
        "routes": sorted(line for line in run("ip", "route", "show", "table", "all")
                         if any(mark in line for mark in _CLUSTER_MARKS)),
        "veths and bridges": sorted(run("ip", "-o", "link", "show", "type", "veth")
                                    + run("ip", "-o", "link", "show", "type", "bridge")),
    }


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cellplane_operator", *args]


def _start_cli_cluster(tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, object], Path]:
    state = tmp / "state.json"
    log = tmp / "up.log"
    process = subprocess.Popen(
        _cli("local", "up", "--cluster", "--regions", "region-x", "--state", str(state)),
        stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    try:
        eventually(lambda: state.exists() or process.poll() is not None, timeout=600,
                   interval=0.5, what="cellplane local up --cluster")
    except BaseException:
        process.kill()
        raise
    assert process.poll() is None, log.read_text()
    return process, json.loads(state.read_text()), log


def _processes_naming(run_dir: Path) -> list[str]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(run_dir).encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _assert_nothing_left(described: dict[str, object], before: dict[str, object]) -> None:
    run_dir = Path(str(described["run_dir"]))
    netns = described["netns"]
    assert isinstance(netns, dict)
    assert not set(netns.values()) & existing_netns()
    assert mounts_under(run_dir) == []
    assert not run_dir.exists()
    assert _processes_naming(run_dir) == []
    assert _host_snapshot() == before


def test_down_leaves_no_process_mount_namespace_link_or_rule(tmp_path: Path,
                                                             local_cluster: LocalCluster) -> None:
    before = _host_snapshot()
    process, described, log = _start_cli_cluster(tmp_path)
    try:
        down = subprocess.run(_cli("local", "down", "--state", str(tmp_path / "state.json")),
                              capture_output=True, text=True, timeout=300, check=False)
        assert down.returncode == 0, down.stderr
        assert process.wait(timeout=60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    _assert_nothing_left(described, before)


def test_a_killed_launcher_is_cleaned_up_by_its_janitor(tmp_path: Path,
                                                        local_cluster: LocalCluster) -> None:
    before = _host_snapshot()
    process, described, _ = _start_cli_cluster(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    run_dir = Path(str(described["run_dir"]))
    eventually(lambda: not run_dir.exists() and not _processes_naming(run_dir), timeout=180,
               interval=0.5, what="the janitor's teardown")
    _assert_nothing_left(described, before)
