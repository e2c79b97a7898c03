"""The address and name plan of one local cluster: pure, decided before anything starts.

Every address below exists only inside network namespaces the cluster creates
(a hub namespace holding the bridge, one for the control plane, one per node), so
the ranges never meet the machine's own network and two clusters on one machine
do not collide: only the namespace names carry the cluster's id.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["ClusterPlan", "NodePlan", "NODE_NETWORK", "CLUSTER_CIDR", "SERVICE_CIDR",
           "CLUSTER_DOMAIN", "APISERVER_PORT"]

NODE_NETWORK = ipaddress.IPv4Network("10.77.0.0/24")
"""The link every namespace joins through the hub's bridge: control plane and nodes."""
CLUSTER_CIDR = ipaddress.IPv4Network("10.244.0.0/16")
"""Pod addresses; node i gets 10.244.i.0/24."""
SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/16")
"""ClusterIPs; 10.96.0.1 is the ``kubernetes`` Service."""
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT = 6443
_CONTROL_HOST = 10
_FIRST_NODE_HOST = 11


@dataclass(frozen=True)
class NodePlan:
    index: int
    region: str
    name: str
    """The Kubernetes Node name."""
    netns: str
    address: str
    """The node's InternalIP, on the node network."""
    pod_cidr: str
    hub_port: str
    """The hub-side end of the node's veth: setting it down cuts the region off."""

    @property
    def zone(self) -> str:
        return f"{self.region}-1"

    @property
    def labels(self) -> dict[str, str]:
        return {"topology.kubernetes.io/region": self.region,
                "topology.kubernetes.io/zone": self.zone}

    @property
    def pod_gateway(self) -> str:
        return str(next(ipaddress.IPv4Network(self.pod_cidr).hosts()))


@dataclass(frozen=True)
class ClusterPlan:
    cluster_id: str
    regions: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.regions:
            raise ValueError("a cluster needs at least one region")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"regions repeat: {self.regions}")
        if len(self.regions) > 200:
            raise ValueError("at most 200 nodes fit the node network")

    @property
    def prefix(self) -> str:
        """What every network namespace of this cluster is named with."""
        return f"cellplane-{self.cluster_id}"

    @property
    def hub_netns(self) -> str:
        return f"{self.prefix}-hub"

    @property
    def control_netns(self) -> str:
        return f"{self.prefix}-control"

    @property
    def control_address(self) -> str:
        return str(NODE_NETWORK.network_address + _CONTROL_HOST)

    @property
    def control_hub_port(self) -> str:
        return "control"

    @property
    def apiserver_url(self) -> str:
        """The apiserver as every process inside the cluster's namespaces reaches it."""
        return f"https://{self.control_address}:{APISERVER_PORT}"

    @property
    def kubernetes_service_ip(self) -> str:
        return str(SERVICE_CIDR.network_address + 1)

    @property
    def dns_address(self) -> str:
        """CoreDNS listens on the control plane's address (a host process there)."""
        return self.control_address

    @property
    def nodes(self) -> tuple[NodePlan, ...]:
        return tuple(
            NodePlan(
                index=index,
                region=region,
                name=f"{region}-node",
                netns=f"{self.prefix}-{region}",
                address=str(NODE_NETWORK.network_address + _FIRST_NODE_HOST + index),
                pod_cidr=str(ipaddress.IPv4Network((int(CLUSTER_CIDR.network_address)
                                                    + (index << 8), 24))),
                hub_port=f"node{index}",
            )
            for index, region in enumerate(self.regions)
        )

    def node(self, region: str) -> NodePlan:
        for node in self.nodes:
            if node.region == region:
                return node
        raise KeyError(f"no node for region {region!r}; regions: {', '.join(self.regions)}")

    def all_netns(self) -> tuple[str, ...]:
        return (self.hub_netns, self.control_netns, *(node.netns for node in self.nodes))

    def routes_from(self, own_pod_cidr: str | None) -> list[tuple[str, str]]:
        """(pod range, via node address) for every node's pods but one's own."""
        return [(node.pod_cidr, node.address) for node in self.nodes
                if node.pod_cidr != own_pod_cidr]
