"""The cluster's network: namespaces, veth links and one bridge, all of them its own.

Nothing here touches the machine's own network namespace: the bridge lives in a
hub namespace the cluster creates, every address and route is set inside the
cluster's namespaces (``ip -n``), and deleting the namespaces removes all of it,
veths and iptables rules included. A region is cut off by setting its hub-side
veth down (a real partition: its node reaches nothing and nothing reaches it).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from cellplane_operator.errors import LocalPlaneError
from cellplane_operator.localplane.clusterplan import NODE_NETWORK, ClusterPlan, NodePlan

__all__ = ["NETNS_DIR", "netns_path", "nsenter_argv", "run_in_netns", "create_network",
           "delete_network", "set_link", "link_is_up", "existing_netns"]

NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def nsenter_argv(netns: str) -> list[str]:
    """The prefix that starts a program in ``netns``. Not ``ip netns exec``: that also
    gives the program a mount namespace of its own, and the kubelet's volume mounts
    would be invisible to containerd (NODE-LAB)."""
    return ["nsenter", f"--net={netns_path(netns)}", "--"]


def run_in_netns(netns: str, call: Callable[[], T], *, timeout: float = 60) -> T:
    """Runs ``call`` on a thread of its own that has joined ``netns`` first.

    setns(2) moves only the calling thread, so the rest of this process stays in
    the machine's namespace; every socket ``call`` opens is made inside ``netns``.
    """
    results: list[T] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path(netns), os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {netns}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            results.append(call())
        except BaseException as error:  # handed to the caller's thread
            errors.append(error)

    thread = threading.Thread(target=worker, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise LocalPlaneError(f"a call inside {netns} did not return in {timeout:.0f}s")
    if errors:
        raise errors[0]
    return results[0]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                            check=False)
    if check and result.returncode != 0:
        raise LocalPlaneError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _sysctl(netns: str, key: str, value: str) -> None:
    """Writes a per-namespace sysctl from a thread inside ``netns`` (/proc/sys/net is
    the namespace of whoever opens it)."""
    path = Path("/proc/sys") / key.replace(".", "/")

    def write() -> None:
        path.write_text(value)

    run_in_netns(netns, write)


def existing_netns() -> set[str]:
    try:
        return {entry.name for entry in NETNS_DIR.iterdir()}
    except FileNotFoundError:
        return set()


def _join(plan: ClusterPlan, netns: str, hub_port: str, address: str) -> None:
    """One veth: ``eth0`` with ``address`` inside ``netns``, its peer on the hub's bridge."""
    _ip("-n", plan.hub_netns, "link", "add", hub_port, "type", "veth",
        "peer", "name", "eth0", "netns", netns)
    _ip("-n", plan.hub_netns, "link", "set", hub_port, "master", "br0", "up")
    _ip("-n", netns, "addr", "add", f"{address}/{NODE_NETWORK.prefixlen}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")


def create_network(plan: ClusterPlan) -> None:
    """Namespaces, bridge, links and routes for the whole cluster."""
    for netns in plan.all_netns():
        _ip("netns", "add", netns)
    _ip("-n", plan.hub_netns, "link", "add", "br0", "type", "bridge")
    _ip("-n", plan.hub_netns, "link", "set", "br0", "up")
    _ip("-n", plan.hub_netns, "link", "set", "lo", "up")
    _join(plan, plan.control_netns, plan.control_hub_port, plan.control_address)
    for node in plan.nodes:
        _join(plan, node.netns, node.hub_port, node.address)
    # Every namespace routes each node's pod range to that node; a node's own
    # range is on its CNI bridge, which the CNI plugin sets up with the first pod.
    # The default route keeps ClusterIPs routable before kube-proxy's DNAT.
    for node in plan.nodes:
        _node_routes(plan, node)
    for pod_cidr, via in plan.routes_from(None):
        _ip("-n", plan.control_netns, "route", "add", pod_cidr, "via", via)
    _ip("-n", plan.control_netns, "route", "add", "default", "dev", "eth0")


def _node_routes(plan: ClusterPlan, node: NodePlan) -> None:
    for pod_cidr, via in plan.routes_from(node.pod_cidr):
        _ip("-n", node.netns, "route", "add", pod_cidr, "via", via)
    _ip("-n", node.netns, "route", "add", "default", "via", plan.control_address)
    _sysctl(node.netns, "net.ipv4.ip_forward", "1")
    _sysctl(node.netns, "net.bridge.bridge-nf-call-iptables", "1")


def delete_network(netns_names: Sequence[str]) -> list[str]:
    """Deletes the namespaces (their veths, bridge, routes and iptables rules go with
    them); returns what could not be deleted."""
    left: list[str] = []
    for netns in netns_names:
        if not netns_path(netns).exists():
            continue
        result = _ip("netns", "delete", netns, check=False)
        if result.returncode != 0 and netns_path(netns).exists():
            left.append(f"{netns}: {result.stderr.strip()}")
    return left


def set_link(plan: ClusterPlan, hub_port: str, *, up: bool) -> None:
    """Sets one hub-side veth up or down: down is a partition of whatever is behind it."""
    _ip("-n", plan.hub_netns, "link", "set", hub_port, "up" if up else "down")


def link_is_up(plan: ClusterPlan, hub_port: str) -> bool:
    out = _ip("-n", plan.hub_netns, "-o", "link", "show", hub_port).stdout
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
    return "UP" in flags
