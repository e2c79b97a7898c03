"""The local cluster's address plan and its nodes' configuration, without starting anything."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import yaml

from cellplane_operator.localplane.cgroups import CgroupTree
from cellplane_operator.localplane.clusterplan import (
    CLUSTER_CIDR,
    NODE_NETWORK,
    SERVICE_CIDR,
    ClusterPlan,
)
from cellplane_operator.localplane.node import NodePrograms, WorkerNode, placed_argv

REGIONS = ("region-a", "region-b", "region-c")


def test_each_node_has_its_own_namespace_address_pod_range_and_hub_port() -> None:
    plan = ClusterPlan("abc123", REGIONS)
    nodes = plan.nodes
    assert [n.region for n in nodes] == list(REGIONS)
    for field in ("netns", "address", "pod_cidr", "hub_port", "name"):
        assert len({getattr(n, field) for n in nodes}) == len(nodes), field
    for node in nodes:
        assert ipaddress.ip_address(node.address) in NODE_NETWORK
        assert ipaddress.ip_network(node.pod_cidr).subnet_of(CLUSTER_CIDR)
        assert node.netns.startswith(plan.prefix)
        assert len(node.hub_port) <= 15  # an interface name's limit
        assert node.labels == {"topology.kubernetes.io/region": node.region,
                               "topology.kubernetes.io/zone": f"{node.region}-1"}
    assert plan.control_address not in {n.address for n in nodes}
    assert ipaddress.ip_address(plan.kubernetes_service_ip) in SERVICE_CIDR
    assert set(plan.all_netns()) == {plan.hub_netns, plan.control_netns,
                                     *(n.netns for n in nodes)}


def test_a_node_routes_every_other_nodes_pods_but_not_its_own() -> None:
    plan = ClusterPlan("abc123", REGIONS)
    node_b = plan.node("region-b")
    routes = plan.routes_from(node_b.pod_cidr)
    assert (node_b.pod_cidr, node_b.address) not in routes
    assert {cidr for cidr, _ in routes} == {n.pod_cidr for n in plan.nodes} - {node_b.pod_cidr}
    assert len(plan.routes_from(None)) == len(REGIONS)


@pytest.mark.parametrize("regions", [(), ("a", "a")])
def test_a_plan_refuses_no_regions_or_repeated_ones(regions: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        ClusterPlan("abc123", regions)


def test_a_node_process_enters_its_cgroup_then_its_namespace_by_nsenter() -> None:
    argv = placed_argv(["kubelet", "--v=1"], netns="ns1", cgroup=CgroupTree("/x/node"))
    assert argv[:2] == ["sh", "-c"]
    # nsenter --net, not `ip netns exec`: the latter's private mount namespace hides
    # the kubelet's volume mounts from containerd.
    assert argv[4:7] == ["nsenter", "--net=/run/netns/ns1", "--"]
    assert argv[-2:] == ["kubelet", "--v=1"]
    assert "ip" not in argv


def test_node_configuration_has_the_settings_this_machine_needs(tmp_path: Path) -> None:
    plan = ClusterPlan("abc123", REGIONS)
    node = WorkerNode(plan, plan.node("region-a"), base_dir=tmp_path,
                      programs=NodePrograms(Path("c"), Path("k"), Path("p"), Path("ctr"), Path("etcd")),
                      cgroup=CgroupTree("/base/cellplane-abc123/region-a"),
                      sandbox_image="localhost/cellplane/pause:1.0", ca_cert=tmp_path / "ca",
                      kubeconfig=tmp_path / "kc", proxy_kubeconfig=tmp_path / "pkc",
                      logs=tmp_path)
    node.write_config()
    containerd = (node.dir / "containerd" / "config.toml").read_text()
    assert "restrict_oom_score_adj = true" in containerd
    assert 'sandbox_image = "localhost/cellplane/pause:1.0"' in containerd
    assert 'snapshotter = "overlayfs"' in containerd
    assert f'address = "{node.containerd_socket}"' in containerd
    kubelet = yaml.safe_load((node.dir / "kubelet-config.yaml").read_text())
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["failSwapOn"] is False
    assert kubelet["cgroupRoot"] == "/base/cellplane-abc123/region-a/pods"
    assert kubelet["clusterDNS"] == [plan.dns_address]
    cni = json.loads((node.dir / "cni" / "net.d" / "10-cellplane.conflist").read_text())
    assert cni["cniVersion"] == "0.4.0"
    assert [p["type"] for p in cni["plugins"]] == ["bridge", "portmap"]
    ipam = cni["plugins"][0]["ipam"]
    assert ipam["type"] == "host-local"
    assert ipam["ranges"][0][0]["subnet"] == plan.node("region-a").pod_cidr
    assert ipam["dataDir"].startswith(str(node.dir))
    proxy = yaml.safe_load((node.dir / "kube-proxy-config.yaml").read_text())
    assert proxy["mode"] == "iptables"
    assert proxy["clusterCIDR"] == str(CLUSTER_CIDR)
    assert proxy["clientConnection"]["kubeconfig"] == str(tmp_path / "pkc")
