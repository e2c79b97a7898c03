"""One worker node: its containerd, kubelet and kube-proxy, in its own network namespace.

Everything the node owns lives in its directory: containerd's root (images stay
across a restart), its state and socket, the kubelet's root and certificates, the
CNI configuration and IPAM data, and the local volumes. Its processes run in its
network namespace (``nsenter --net``, so they share the machine's mount namespace
with each other, which the kubelet's volume mounts need) and in its cgroup
subtree, so ``kill`` takes the whole node, pods included, and ``start`` brings it
back on the same data.

The settings marked NODE-LAB were each found by a failure on these machines.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from cellplane_operator.localplane.cgroups import CgroupTree
from cellplane_operator.localplane.clusterplan import (
    CLUSTER_CIDR,
    CLUSTER_DOMAIN,
    ClusterPlan,
    NodePlan,
)
from cellplane_operator.localplane.mounts import unmount_under
from cellplane_operator.localplane.netns import nsenter_argv
from cellplane_operator.localplane.process import ManagedProcess

__all__ = ["NodePrograms", "WorkerNode", "placed_argv", "CNI_BIN_DIR",
           "OWNERSHIP_ETCD_CLIENT_PORT", "OWNERSHIP_ETCD_PEER_PORT"]

CNI_BIN_DIR = Path("/usr/lib/cni")
"""Debian's containernetworking-plugins."""
OWNERSHIP_ETCD_CLIENT_PORT = 2379
OWNERSHIP_ETCD_PEER_PORT = 2380


@dataclass(frozen=True)
class NodePrograms:
    containerd: Path
    kubelet: Path
    kube_proxy: Path
    ctr: Path
    etcd: Path


def placed_argv(argv: Sequence[str], *, netns: str | None, cgroup: CgroupTree) -> list[str]:
    """``argv`` started inside ``netns`` and ``cgroup``: a shell writes its own PID into
    the cgroup, then execs nsenter, which execs the program (one PID throughout, so
    nothing it forks escapes the cgroup). ``netns`` None: the machine's namespace."""
    procs = " ".join(shlex.quote(str(path)) for path in cgroup.procs_files())
    script = f'for f in {procs}; do echo $$ > "$f" || exit 97; done; exec "$@"'
    enter = nsenter_argv(netns) if netns is not None else []
    return ["sh", "-c", script, "sh", *enter, *argv]


class WorkerNode:
    def __init__(self, plan: ClusterPlan, node: NodePlan, *, base_dir: Path,
                 programs: NodePrograms, cgroup: CgroupTree, sandbox_image: str,
                 ca_cert: Path, kubeconfig: Path, proxy_kubeconfig: Path, logs: Path) -> None:
        self.plan = plan
        self.node = node
        self.dir = base_dir / node.region
        self._programs = programs
        self.cgroup = cgroup
        self._sandbox_image = sandbox_image
        self._ca_cert = ca_cert
        self._kubeconfig = kubeconfig
        self._proxy_kubeconfig = proxy_kubeconfig
        self._logs = logs
        self.processes: dict[str, ManagedProcess] = {}

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd" / "root"

    @property
    def volumes_dir(self) -> Path:
        return self.dir / "volumes"

    @property
    def _state_dir(self) -> Path:
        return self.dir / "containerd" / "state"

    def write_config(self) -> None:
        """Every configuration file of the node, written once; a restart reuses them."""
        for sub in ("containerd/state", "kubelet", "cni/net.d", "cni/ipam",
                    "volumes"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "containerd" / "config.toml").write_text(self._containerd_config())
        (self.dir / "cni" / "net.d" / "10-cellplane.conflist").write_text(
            json.dumps(self._cni_config(), indent=2) + "\n")
        (self.dir / "kubelet-config.yaml").write_text(
            yaml.safe_dump(self._kubelet_config(), sort_keys=False))
        (self.dir / "kube-proxy-config.yaml").write_text(
            yaml.safe_dump(self._kube_proxy_config(), sort_keys=False))
        # Pods with dnsPolicy Default get this; the machine's own resolvers are not
        # reachable from inside the cluster's namespaces.
        (self.dir / "resolv.conf").write_text(f"nameserver {self.plan.dns_address}\n")

    def _containerd_config(self) -> str:
        containerd = self.dir / "containerd"
        return f"""version = 2
root = "{self.containerd_root}"
state = "{self._state_dir}"
oom_score = 0

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.containerd_socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{containerd / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self._sandbox_image}"
  # NODE-LAB: the machine lacks CAP_SYS_RESOURCE, so lowering oom_score_adj is
  # refused and every sandbox fails without this.
  restrict_oom_score_adj = true
  # Pod network namespaces under this node's state, not /run/netns, so they go
  # with the node and never mix with another node's.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{containerd / 'runc'}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / 'cni' / 'net.d'}"
    max_conf_num = 1
"""

    def _cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "0.4.0",
            "name": "cellplane",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    # Pod addresses are routed between nodes (every namespace has a
                    # route to each node's range), so nothing needs masquerading.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.node.pod_cidr,
                                     "gateway": self.node.pod_gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # NODE-LAB: the host has cgroup v1 and no systemd; containerd 1.6 lacks
            # the CRI RuntimeConfig call, so the configured driver is the one used.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            # Three kubelets on one host: each keeps its pods below its own node.
            "cgroupRoot": self.cgroup.child("pods").path,
            "failSwapOn": False,
            "address": self.node.address,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self._ca_cert)},
            },
            # Only clients with a certificate of the cluster's CA get here at all.
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [self.plan.dns_address],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(self.dir / "resolv.conf"),
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            "volumePluginDir": str(self.dir / "kubelet-plugins"),
            # Not the machine's /var/log/pods: the pods' logs go with the node.
            "podLogsDir": str(self.dir / "pod-logs"),
            # Low thresholds: one machine holds three nodes and the tests' disks are
            # small; the defaults would evict or taint the nodes at once.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
            # The images are imported, never pulled: they must never be collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "maxPods": 60,
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "protectKernelDefaults": False,
            "localStorageCapacityIsolation": True,
            "nodeStatusReportFrequency": "10s",
            "enableServer": True,
            "registerNode": True,
        }

    def _kube_proxy_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self._proxy_kubeconfig)},
            "hostnameOverride": self.node.name,
            "bindAddress": self.node.address,
            "clusterCIDR": str(CLUSTER_CIDR),
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Leave the host-wide conntrack table size alone: it is not this
            # namespace's to change.
            "conntrack": {"maxPerCore": 0, "min": 0,
                          "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }

    def _process(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        log = self._logs / f"{self.node.region}-{name}.log"
        return ManagedProcess(f"{self.node.region}-{name}",
                              placed_argv(argv, netns=self.node.netns,
                                          cgroup=self.cgroup.child("daemons")),
                              log=log)

    def start_containerd(self) -> ManagedProcess:
        self.cgroup.child("daemons").create()
        self.cgroup.child("pods").create()
        process = self._process("containerd", [
            str(self._programs.containerd),
            f"--config={self.dir / 'containerd' / 'config.toml'}", "--log-level=warn"])
        self.processes["containerd"] = process
        process.start()
        return process

    def containerd_ready(self) -> bool:
        import subprocess

        result = subprocess.run(
            [str(self._programs.ctr), "--address", str(self.containerd_socket), "version"],
            capture_output=True, timeout=30, check=False)
        return result.returncode == 0

    @property
    def ownership_etcd_endpoint(self) -> str:
        """Where this node's member of the ownership etcd serves clients."""
        return f"{self.node.address}:{OWNERSHIP_ETCD_CLIENT_PORT}"

    def start_ownership_etcd(self) -> ManagedProcess:
        """The region's member of the ownership etcd (placement-group leases, the
        election): a daemon of the node, so a killed node or a cut link takes the
        member with it, as losing a region does. Its data stays for ``start``."""
        self.cgroup.child("daemons").create()
        data = self.dir / "ownership-etcd"
        data.mkdir(mode=0o700, exist_ok=True)
        address = self.node.address
        members = ",".join(f"{node.region}=http://{node.address}:{OWNERSHIP_ETCD_PEER_PORT}"
                           for node in self.plan.nodes)
        process = self._process("ownership-etcd", [
            str(self._programs.etcd), f"--name={self.node.region}", f"--data-dir={data}",
            f"--listen-client-urls=http://{address}:{OWNERSHIP_ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://{address}:{OWNERSHIP_ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://{address}:{OWNERSHIP_ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://{address}:{OWNERSHIP_ETCD_PEER_PORT}",
            f"--initial-cluster={members}", "--initial-cluster-state=new",
            f"--initial-cluster-token={self.plan.prefix}-ownership",
            "--listen-metrics-urls=", "--log-level=warn"])
        self.processes["ownership-etcd"] = process
        process.start()
        return process

    def start_kubelet(self) -> ManagedProcess:
        labels = ",".join(f"{key}={value}" for key, value in self.node.labels.items())
        process = self._process("kubelet", [
            str(self._programs.kubelet),
            f"--config={self.dir / 'kubelet-config.yaml'}",
            f"--kubeconfig={self._kubeconfig}",
            f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'kubelet' / 'pki'}",
            f"--hostname-override={self.node.name}",
            f"--node-ip={self.node.address}",
            f"--node-labels={labels}",
            "--v=1",
        ])
        self.processes["kubelet"] = process
        process.start()
        return process

    def start_kube_proxy(self) -> ManagedProcess:
        process = self._process("kube-proxy", [
            str(self._programs.kube_proxy), f"--config={self.dir / 'kube-proxy-config.yaml'}",
            "--v=1"])
        self.processes["kube-proxy"] = process
        process.start()
        return process

    def kill(self) -> None:
        """The node lost whole, as a machine that dies: every process in its cgroups
        SIGKILLed (kubelet, kube-proxy, containerd, shims, every container), then the
        mounts it held released. Its data stays for ``start``."""
        self.cgroup.kill_all()
        for process in self.processes.values():
            process.kill()  # reaps the ones that were our children
        self.processes.clear()
        unmount_under(self.dir)
        # What a reboot clears: containerd's runtime state (shim sockets, pod
        # network namespaces, task bundles), not its root with the images.
        shutil.rmtree(self._state_dir, ignore_errors=True)
        shutil.rmtree(self.dir / "containerd" / "runc", ignore_errors=True)
        self._state_dir.mkdir(parents=True, exist_ok=True)

    def running(self) -> bool:
        return bool(self.processes) and all(p.running for p in self.processes.values())
