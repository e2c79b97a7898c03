"""A real multi-node Kubernetes cluster on one machine: one control plane and one worker
node per region, each in a network namespace of its own, joined through a bridge.

Start order: namespaces and links -> etcd -> kube-apiserver (and the relay that
lets the machine's clients reach it) -> controller manager, scheduler, CoreDNS ->
every node's containerd, the images imported -> kubelets and kube-proxies -> the
StorageClass and local PersistentVolumes -> every node Ready. Every process is in
the cluster's cgroup subtree, so teardown is one kill of that subtree, then the
mounts under the run directory, the namespaces (their veths, bridge, routes and
iptables rules go with them) and the cgroups. ``teardown`` works from the state
file alone, which is how the janitor cleans up after a launcher that was killed.

The network rule: every address of this cluster exists only inside the
namespaces it created; the machine's own namespace gets one loopback listener
(the relay), nothing else. See docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from cellplane_operator.errors import BinaryNotFoundError, LocalPlaneError
from cellplane_operator.localplane.apiserver import write_encryption_config, write_kubeconfig
from cellplane_operator.localplane.binaries import Binaries, ClusterBinaries
from cellplane_operator.localplane.cgroups import CgroupTree, cgroup_base
from cellplane_operator.localplane.clusterplan import (
    APISERVER_PORT,
    CLUSTER_DOMAIN,
    SERVICE_CIDR,
    ClusterPlan,
)
from cellplane_operator.localplane.controlplane import admission_dir, crd_dir
from cellplane_operator.localplane.mounts import mounts_under, unmount_under
from cellplane_operator.localplane.netns import (
    create_network,
    delete_network,
    netns_path,
    nsenter_argv,
    run_in_netns,
    set_link,
)
from cellplane_operator.localplane.node import NodePrograms, WorkerNode, placed_argv
from cellplane_operator.localplane.nodeimages import copy_root, seed_root
from cellplane_operator.localplane.pki import issue_client_certificate, make_apiserver_pki
from cellplane_operator.localplane.ports import free_port
from cellplane_operator.localplane.process import ManagedProcess, tail, wait_for

__all__ = ["LocalCluster", "ClusterConfig", "ClusterPrograms", "ClusterState", "teardown",
           "STORAGE_CLASS"]

_CRI_NOT_INITIALIZED = "server is not initialized"
"""What containerd's CRI answers while it initializes (the kubelet exits on it)."""

STORAGE_CLASS = "cellplane-local"
"""The cluster's default StorageClass: pre-made local volumes, WaitForFirstConsumer."""

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class ClusterPrograms:
    """Every program a cluster runs: the Go-built ones from the cache, containerd and
    its client from Debian's packages."""

    base: Binaries
    built: ClusterBinaries
    node: NodePrograms

    @classmethod
    def discover(cls) -> ClusterPrograms:
        built = ClusterBinaries.discover()
        missing = [tool for tool in ("containerd", "ctr", "nsenter", "ip", "iptables", "runc",
                                     "containerd-shim-runc-v2") if shutil.which(tool) is None]
        if missing:
            raise BinaryNotFoundError(
                f"the cluster needs {', '.join(missing)}: run `bash hack/setup.sh`")
        base = Binaries.discover()
        return cls(
            base=base,
            built=built,
            node=NodePrograms(containerd=Path(shutil.which("containerd") or "containerd"),
                              kubelet=built.kubelet, kube_proxy=built.kube_proxy,
                              ctr=Path(shutil.which("ctr") or "ctr"),
                              etcd=base.etcd),
        )


@dataclass(frozen=True)
class ClusterConfig:
    regions: tuple[str, ...] = ("region-a", "region-b", "region-c")
    """One worker node per region, labelled topology.kubernetes.io/region."""
    run_dir: Path | None = None
    """Where every node's data, the certificates and the logs go; a fresh temp dir by default."""
    volumes_per_node: int = 6
    """Pre-made local PersistentVolumes on each node."""
    volume_size: str = "1Gi"
    apply_crds: bool = True
    """Apply cellplane's CRDs and admission policies, as the local control plane does."""


@dataclass(frozen=True)
class ClusterState:
    """What teardown needs, written to ``<run_dir>/cluster.json`` before anything starts."""

    cluster_id: str
    regions: tuple[str, ...]
    run_dir: str
    netns: tuple[str, ...]
    cgroup: str
    launcher_pid: int
    kubeconfig: str

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> ClusterState:
        raw = json.loads(path.read_text())
        return cls(cluster_id=raw["cluster_id"], regions=tuple(raw["regions"]),
                   run_dir=raw["run_dir"],
                   netns=tuple(raw["netns"]), cgroup=raw["cgroup"],
                   launcher_pid=int(raw["launcher_pid"]), kubeconfig=raw["kubeconfig"])

    def plan(self) -> ClusterPlan:
        return ClusterPlan(self.cluster_id, self.regions)


def teardown(state: ClusterState, *, remove_run_dir: bool = True) -> list[str]:
    """Removes everything a cluster made, from its state alone; idempotent. Returns what
    could not be removed (empty when the machine is back as it was)."""
    cgroup = CgroupTree(state.cgroup)
    left: list[str] = []
    try:
        cgroup.kill_all()
    except LocalPlaneError as error:
        left.append(str(error))
    run_dir = Path(state.run_dir)
    left += [f"still mounted: {point}" for point in unmount_under(run_dir)]
    left += delete_network(state.netns)
    left += cgroup.remove()
    _remove_log_links(run_dir)
    if remove_run_dir and not left:
        shutil.rmtree(run_dir, ignore_errors=True)
    return left


def _remove_log_links(run_dir: Path) -> None:
    """The kubelet links each container's log into /var/log/containers (a fixed path);
    the links into this cluster's run directory go with it."""
    links = Path("/var/log/containers")
    if not links.is_dir():
        return
    for link in links.iterdir():
        try:
            if link.is_symlink() and os.readlink(link).startswith(str(run_dir) + "/"):
                link.unlink()
        except OSError:
            continue


@dataclass
class LocalCluster:
    config: ClusterConfig = field(default_factory=ClusterConfig)
    programs: ClusterPrograms = field(default_factory=ClusterPrograms.discover)
    images: Sequence[Any] = ()
    """Image archives (localplane.images.ImageArchive) imported into every node; the
    first is the pause image, the CRI's sandbox image."""
    say: Say = _quiet
    plan: ClusterPlan = field(init=False)
    run_dir: Path = field(init=False)
    cgroup: CgroupTree = field(init=False)
    nodes: dict[str, WorkerNode] = field(init=False, default_factory=dict)
    control: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
    relay_port: int = field(init=False)
    ownership_relay_ports: dict[str, int] = field(init=False, default_factory=dict)
    """Per region: a loopback port of this machine relayed to that node's ownership etcd
    member (tests read the ownership table through it)."""
    timings: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.plan = ClusterPlan(secrets.token_hex(3), tuple(self.config.regions))
        if self.config.run_dir is not None:
            self.run_dir = self.config.run_dir
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"cellplane-cluster-{self.plan.cluster_id}-"))
        self.run_dir.chmod(0o755)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.cgroup = CgroupTree(f"{cgroup_base().rstrip('/')}/{self.plan.prefix}")
        self.relay_port = free_port()
        self._kubelet_retries = 0
        self._janitor: subprocess.Popen[bytes] | None = None

    # --- paths -------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.run_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig for this machine's clients: through the relay on loopback."""
        return self.run_dir / "kubeconfig"

    @property
    def inside_kubeconfig(self) -> Path:
        """The admin kubeconfig for clients run inside the cluster's namespaces
        (``nsenter --net``): the apiserver's own address."""
        return self.run_dir / "kubeconfig-inside"

    @property
    def state_file(self) -> Path:
        return self.run_dir / "cluster.json"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    def state(self) -> ClusterState:
        return ClusterState(cluster_id=self.plan.cluster_id, regions=self.plan.regions,
                            run_dir=str(self.run_dir),
                            netns=self.plan.all_netns(), cgroup=self.cgroup.path,
                            launcher_pid=os.getpid(), kubeconfig=str(self.kubeconfig))

    # --- start -------------------------------------------------------------------

    def start(self, *, timeout: float = 300) -> LocalCluster:
        started = time.monotonic()
        self.state().write(self.state_file)
        try:
            self._start_janitor()
            self._step("network", lambda: create_network(self.plan))
            self._step("pki", self._make_pki)
            self._step("etcd", lambda: self._start_etcd(timeout))
            self._step("kube-apiserver", lambda: self._start_apiserver(timeout))
            self._step("bootstrap objects", self._apply_bootstrap)
            self._step("controllers, scheduler, CoreDNS", self._start_controllers)
            self._step("nodes' directories", self._make_nodes)
            self._step("ownership etcd", lambda: self._start_ownership_etcd(timeout))
            self._step("containerd and images", lambda: self._start_containerds(timeout))
            self._step("kubelets and kube-proxies", self._start_kubelets)
            self._step("nodes Ready", lambda: self.wait_nodes_ready(timeout=timeout))
        except BaseException:
            self.say(f"start failed; logs in {self.logs_dir}")
            try:
                self.stop(remove=False)
            except LocalPlaneError as error:  # the start's own error matters more
                self.say(str(error))
            raise
        self.timings["total"] = time.monotonic() - started
        self.say(f"cluster up in {self.timings['total']:.1f} s")
        return self

    def _step(self, what: str, action: Callable[[], None]) -> None:
        begun = time.monotonic()
        self.say(f"{what} ...")
        action()
        self.timings[what] = time.monotonic() - begun

    def _start_janitor(self) -> None:
        """A watcher in a session of its own that tears the cluster down if this
        process dies without doing it (SIGKILL, a crash)."""
        self._janitor = subprocess.Popen(
            [sys.executable, "-m", "cellplane_operator.localplane.janitor",
             str(self.state_file), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=(self.logs_dir / "janitor.log").open("ab"), start_new_session=True)

    def _make_pki(self) -> None:
        pki = make_apiserver_pki(self.pki_dir, hosts=[
            "127.0.0.1", "localhost", self.plan.control_address,
            self.plan.kubernetes_service_ip, "kubernetes", "kubernetes.default",
            "kubernetes.default.svc", f"kubernetes.default.svc.{CLUSTER_DOMAIN}"])
        write_kubeconfig(self.kubeconfig, server=f"https://127.0.0.1:{self.relay_port}",
                         ca_cert=pki.ca_cert, client_cert=pki.admin_cert,
                         client_key=pki.admin_key)
        write_kubeconfig(self.inside_kubeconfig, server=self.plan.apiserver_url,
                         ca_cert=pki.ca_cert, client_cert=pki.admin_cert,
                         client_key=pki.admin_key)
        identities: dict[str, tuple[str, tuple[str, ...]]] = {
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            "kube-scheduler": ("system:kube-scheduler", ()),
            "kube-proxy": ("system:kube-proxy", ()),
            "coredns": ("cellplane:coredns", ()),
            # The apiserver's identity towards the kubelets (exec, logs, port-forward).
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
        }
        for node in self.plan.nodes:
            identities[f"node-{node.region}"] = (f"system:node:{node.name}", ("system:nodes",))
        for stem, (user, groups) in identities.items():
            cert, key = issue_client_certificate(self.pki_dir, user=user, groups=groups, stem=stem)
            if stem != "apiserver-kubelet-client":
                write_kubeconfig(self.run_dir / f"{stem}.kubeconfig",
                                 server=self.plan.apiserver_url, ca_cert=pki.ca_cert,
                                 client_cert=cert, client_key=key, user=user)

    def _control_process(self, name: str, argv: Sequence[str], *,
                         netns: str | None = "control") -> ManagedProcess:
        namespace = self.plan.control_netns if netns == "control" else netns
        process = ManagedProcess(name, placed_argv(argv, netns=namespace,
                                                   cgroup=self.cgroup.child("control")),
                                 log=self.logs_dir / f"{name}.log")
        self.control[name] = process
        process.start()
        return process

    def _start_etcd(self, timeout: float) -> None:
        self.cgroup.child("control").create()
        data = self.run_dir / "etcd"
        data.mkdir(mode=0o700, exist_ok=True)
        process = self._control_process("etcd", [
            str(self.programs.base.etcd), "--name=control", f"--data-dir={data}",
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=control=http://127.0.0.1:2380",
            "--listen-metrics-urls=", "--log-level=warn"])
        process.wait_until(lambda: self._inside_http_ok("http://127.0.0.1:2379/health"),
                           timeout=timeout, what="etcd /health")

    def _inside_http_ok(self, url: str) -> bool:
        def probe() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        return run_in_netns(self.plan.control_netns, probe)

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.pki_dir
        # Secrets encrypted at rest (secretbox), as a production cluster should have them.
        encryption = write_encryption_config(self.run_dir / "encryption-config.yaml")
        process = self._control_process("kube-apiserver", [
            str(self.programs.base.kube_apiserver),
            "--etcd-servers=http://127.0.0.1:2379",
            f"--encryption-provider-config={encryption}",
            f"--bind-address={self.plan.control_address}",
            f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={self.plan.control_address}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            # NODE-LAB: else `kubectl logs` resolves the node's name through DNS,
            # which does not exist for nodes here.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--v=1",
        ])
        relay = self._control_process("relay", [
            sys.executable, "-m", "cellplane_operator.localplane.relay", str(self.relay_port),
            str(netns_path(self.plan.control_netns)),
            f"{self.plan.control_address}:{APISERVER_PORT}"], netns=None)
        process.wait_until(self._apiserver_ready, timeout=timeout, what="/readyz through the relay")
        relay.check_alive()

    def _apiserver_ready(self) -> bool:
        result = self.kubectl("get", "--raw=/readyz", check=False, timeout=10)
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The pinned kubectl as the admin, from this machine (through the relay)."""
        try:
            result = subprocess.run(
                [str(self.programs.base.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
                input=input_text, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            if check:
                raise LocalPlaneError(f"kubectl {' '.join(args)} timed out") from error
            return subprocess.CompletedProcess(list(args), 124, "", "timed out")
        if check and result.returncode != 0:
            raise LocalPlaneError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "--field-manager=cellplane-cluster", "-f", "-",
                     input_text=yaml.safe_dump_all(objects))

    def _apply_bootstrap(self) -> None:
        self.apply([*_coredns_rbac(), *self._storage_objects()])
        if self.config.apply_crds:
            self.kubectl("apply", "--server-side", "--field-manager=cellplane-cluster",
                         "-f", str(crd_dir()))
            self.kubectl("wait", "--for=condition=Established", "--timeout=120s",
                         "-f", str(crd_dir()))
            self.kubectl("apply", "--server-side", "--field-manager=cellplane-cluster",
                         "-f", str(admission_dir()))

    def _storage_objects(self) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = [{
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Retain",
        }]
        for node in self.plan.nodes:
            for index in range(self.config.volumes_per_node):
                path = self.run_dir / node.region / "volumes" / f"pv-{index}"
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # the pods' users are not root
                objects.append({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": f"{node.name}-pv-{index}",
                                 "labels": {"cellplane.io/node": node.name,
                                            **node.labels}},
                    "spec": {
                        "capacity": {"storage": self.config.volume_size},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": STORAGE_CLASS,
                        "volumeMode": "Filesystem",
                        "local": {"path": str(path)},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{
                            "matchExpressions": [{"key": "kubernetes.io/hostname",
                                                  "operator": "In",
                                                  "values": [node.name]}]}]}},
                    },
                })
        return objects

    def _start_controllers(self) -> None:
        pki = self.pki_dir
        kcm = str(self.run_dir / "kube-controller-manager.kubeconfig")
        self._control_process("kube-controller-manager", [
            str(self.programs.built.kube_controller_manager),
            f"--kubeconfig={kcm}", f"--authentication-kubeconfig={kcm}",
            f"--authorization-kubeconfig={kcm}",
            "--bind-address=127.0.0.1",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false", "--v=1"])
        scheduler = str(self.run_dir / "kube-scheduler.kubeconfig")
        self._control_process("kube-scheduler", [
            str(self.programs.built.kube_scheduler),
            f"--kubeconfig={scheduler}", f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            "--bind-address=127.0.0.1", "--leader-elect=false", "--v=1"])
        corefile = self.run_dir / "Corefile"
        corefile.write_text(
            f".:53 {{\n    bind {self.plan.dns_address}\n    errors\n"
            f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
            f"        kubeconfig {self.run_dir / 'coredns.kubeconfig'}\n"
            "        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }\n"
            "    cache 5\n    reload\n}\n")
        self._control_process("coredns", [str(self.programs.built.coredns), "-conf", str(corefile)])

    def _node(self, region: str) -> WorkerNode:
        try:
            return self.nodes[region]
        except KeyError:
            raise LocalPlaneError(f"no node in region {region!r}") from None

    def _make_nodes(self) -> None:
        sandbox = self.images[0].reference if self.images else "registry.k8s.io/pause:3.10"
        for node in self.plan.nodes:
            worker = WorkerNode(
                self.plan, node, base_dir=self.run_dir, programs=self.programs.node,
                cgroup=self.cgroup.child(node.region), sandbox_image=sandbox,
                ca_cert=self.pki_dir / "ca.crt",
                kubeconfig=self.run_dir / f"node-{node.region}.kubeconfig",
                proxy_kubeconfig=self.run_dir / "kube-proxy.kubeconfig",
                logs=self.logs_dir)
            worker.write_config()
            self.nodes[node.region] = worker

    @property
    def ownership_endpoints(self) -> list[str]:
        """The ownership etcd as pods and the cluster's namespaces reach it: one member
        on each region's node."""
        return [worker.ownership_etcd_endpoint for worker in self.nodes.values()]

    @property
    def ownership_relayed_endpoints(self) -> list[str]:
        """The same members as this machine's clients reach them (through relays)."""
        return [f"127.0.0.1:{port}" for port in self.ownership_relay_ports.values()]

    def _start_ownership_etcd(self, timeout: float) -> None:
        for worker in self.nodes.values():
            worker.start_ownership_etcd()
            port = self.ownership_relay_ports.setdefault(worker.node.region, free_port())
            self._control_process(f"relay-ownership-etcd-{worker.node.region}", [
                sys.executable, "-m", "cellplane_operator.localplane.relay", str(port),
                str(netns_path(self.plan.control_netns)), worker.ownership_etcd_endpoint],
                netns=None)
        for worker in self.nodes.values():
            self._wait_ownership_member(worker, timeout)

    def _wait_ownership_member(self, worker: WorkerNode, timeout: float) -> None:
        worker.processes["ownership-etcd"].wait_until(
            lambda: self._inside_http_ok(f"http://{worker.ownership_etcd_endpoint}/health"),
            timeout=timeout, what=f"ownership etcd member of {worker.node.region} /health")

    def _start_containerds(self, timeout: float) -> None:
        if self.images:
            seed = seed_root(self.images, containerd=self.programs.node.containerd,
                             ctr=self.programs.node.ctr, say=self.say)
            for worker in self.nodes.values():
                copy_root(seed, worker.containerd_root)
        for worker in self.nodes.values():
            self._start_node_containerd(worker, timeout)

    def _start_node_containerd(self, worker: WorkerNode, timeout: float) -> None:
        process = worker.start_containerd()
        process.wait_until(worker.containerd_ready, timeout=timeout, what="containerd socket")

    def _start_kubelets(self) -> None:
        for worker in self.nodes.values():
            worker.start_kubelet()
            worker.start_kube_proxy()

    # --- reading the cluster -------------------------------------------------------

    def get_json(self, *args: str) -> dict[str, Any]:
        result = self.kubectl("get", *args, "-o", "json")
        parsed = json.loads(result.stdout)
        assert isinstance(parsed, dict)
        return parsed

    def node_ready(self, region: str) -> bool:
        result = self.kubectl("get", "node", self.plan.node(region).name, "-o", "json",
                              check=False, timeout=20)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def wait_nodes_ready(self, *, regions: Sequence[str] | None = None,
                         timeout: float = 300) -> None:
        for region in regions or self.plan.regions:
            worker = self._node(region)
            wait_for(lambda: self.node_ready(region), timeout=timeout, interval=0.5,
                     what=f"node {worker.name} Ready", alive=lambda: self._check_node(worker))

    def _check_node(self, worker: WorkerNode) -> None:
        kubelet = worker.processes.get("kubelet")
        if kubelet is not None and not kubelet.running and self._kubelet_retries < 20 and (
                _CRI_NOT_INITIALIZED in tail(kubelet.log, 5)):
            # containerd answers its own API (what containerd_ready asks) before its CRI
            # plugin is initialized, and a kubelet that finds the CRI not ready exits:
            # seen after a node restart on a loaded machine. Start it again.
            self._kubelet_retries += 1
            self.say(f"{worker.name}: the kubelet started before containerd's CRI was "
                     "initialized; starting it again")
            time.sleep(1)
            worker.start_kubelet()
            return
        for process in worker.processes.values():
            process.check_alive()

    def memory_bytes(self) -> int | None:
        """Memory charged to the whole cluster's cgroup subtree (every process, every pod)."""
        return self.cgroup.memory_bytes()

    def inside(self, netns: str, argv: Sequence[str], *, timeout: float = 60,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs a command inside one of the cluster's namespaces (``nsenter --net``)."""
        result = subprocess.run([*nsenter_argv(netns), *argv], capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise LocalPlaneError(f"{' '.join(argv)} in {netns} failed: {result.stderr.strip()}")
        return result

    # --- faults --------------------------------------------------------------------

    def partition(self, region: str) -> None:
        """Cuts the region's node off the bridge: it reaches nothing, nothing reaches it."""
        set_link(self.plan, self.plan.node(region).hub_port, up=False)

    def heal(self, region: str) -> None:
        set_link(self.plan, self.plan.node(region).hub_port, up=True)

    def kill_node(self, region: str) -> None:
        """Loses the region's node whole: kubelet, kube-proxy, containerd, shims and every
        pod process SIGKILLed at once; its data stays for ``start_node``."""
        self._node(region).kill()

    def start_node(self, region: str, *, wait_ready: bool = True, timeout: float = 300) -> None:
        """Starts a killed node again on its data (images and volumes included)."""
        worker = self._node(region)
        worker.start_ownership_etcd()
        self._start_node_containerd(worker, timeout)
        worker.start_kubelet()
        worker.start_kube_proxy()
        if wait_ready:
            self.wait_nodes_ready(regions=[region], timeout=timeout)

    def node_pids(self, region: str) -> set[int]:
        return self._node(region).cgroup.pids()

    # --- stop ------------------------------------------------------------------------

    def stop(self, *, remove: bool = True) -> None:
        """Everything gone: processes, mounts, namespaces, cgroups (and the run directory
        unless ``remove`` is false)."""
        left = teardown(self.state(), remove_run_dir=False)
        for process in [*self.control.values(),
                        *(p for w in self.nodes.values() for p in w.processes.values())]:
            process.kill()  # reaps our children, killed above
        if self._janitor is not None:
            self._janitor.terminate()
            self._janitor.wait(timeout=30)
            self._janitor = None
        if left:
            raise LocalPlaneError("cluster teardown left: " + "; ".join(left))
        if remove:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def logs(self) -> list[Path]:
        return sorted(self.logs_dir.glob("*.log"))

    def dump_logs(self, lines: int = 40) -> str:
        return "\n".join(f"===== {log.name} =====\n{tail(log, lines)}" for log in self.logs())

    def describe(self) -> dict[str, object]:
        return {
            "run_dir": str(self.run_dir),
            "kubeconfig": str(self.kubeconfig),
            "kubeconfig_inside": str(self.inside_kubeconfig),
            "apiserver": {"relay": f"https://127.0.0.1:{self.relay_port}",
                          "inside": self.plan.apiserver_url},
            "netns": {"control": self.plan.control_netns, "hub": self.plan.hub_netns,
                      **{n.region: n.netns for n in self.plan.nodes}},
            "nodes": {n.region: {"name": n.name, "address": n.address, "pod_cidr": n.pod_cidr}
                      for n in self.plan.nodes},
            "state": str(self.state_file),
        }

    def mounts(self) -> list[str]:
        return mounts_under(self.run_dir)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop(remove=kind is None and not os.environ.get("CELLPLANE_KEEP_RUN_DIR"))


def _coredns_rbac() -> list[dict[str, Any]]:
    """What CoreDNS's kubernetes plugin reads, granted to its certificate's user."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "cellplane:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "cellplane:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cellplane:coredns"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": "cellplane:coredns"}]},
    ]
