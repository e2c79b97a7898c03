"""A real kube-apiserver with no nodes and no kubelet, the way envtest runs one.

It serves TLS on loopback with a generated CA, authorizes with RBAC, signs
service-account tokens (so the TokenRequest API works) and keeps its data in the
local etcd. An admin identity in ``system:masters`` and a kubeconfig for it are
written next to its certificates.

Secrets are encrypted at rest, as a production cluster's should be: an
EncryptionConfiguration with a secretbox key made for this plane (kept, mode
0600, in its private run directory, and reused if the apiserver restarts over
the same etcd), so etcd holds ``k8s:enc:secretbox:v1:...``, never a Secret's
bytes. docs/security.md says what a real cluster needs.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.pki import ApiServerPki, make_apiserver_pki
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import ManagedProcess

__all__ = ["KubeApiServer", "write_kubeconfig", "non_loopback_address",
           "write_encryption_config", "ENCRYPTION_KEY_NAME"]

ENCRYPTION_KEY_NAME = "cellplane-local"
"""The key's name in the EncryptionConfiguration: etcd values start
``k8s:enc:secretbox:v1:cellplane-local:``."""


def write_encryption_config(path: Path) -> Path:
    """An EncryptionConfiguration that encrypts Secrets with a new 32-byte secretbox key
    (mode 0600); an existing file is kept, since the data in etcd needs its key.

    ``identity`` comes last so that Secrets written before encryption was on can still
    be read (and are encrypted when next written).
    """
    if path.exists():
        return path
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [{
            "resources": ["secrets"],
            "providers": [{"secretbox": {"keys": [{"name": ENCRYPTION_KEY_NAME, "secret": key}]}},
                          {"identity": {}}],
        }],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(yaml.safe_dump(config, sort_keys=False))
    return path


def non_loopback_address() -> str:
    """A global-scope IPv4 address of this machine, read from its interfaces.

    The apiserver advertises it (it refuses to publish a loopback address as the
    ``kubernetes`` service's endpoint); nothing is ever sent to it.
    """
    try:
        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show", "scope", "global"],
            capture_output=True, text=True, check=True, timeout=5,
        ).stdout
        for interface in json.loads(out):
            for address in interface.get("addr_info", []):
                if local := address.get("local"):
                    return str(local)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            candidate = str(info[4][0])
            if not candidate.startswith("127."):
                return candidate
    except OSError:
        pass
    return LOOPBACK


def write_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, client_cert: Path | None = None,
    client_key: Path | None = None, token: str | None = None, user: str = "cellplane-admin",
    namespace: str = "default",
) -> Path:
    credentials: dict[str, str] = {}
    if client_cert is not None and client_key is not None:
        credentials = {"client-certificate": str(client_cert), "client-key": str(client_key)}
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cellplane-local",
                      "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "cellplane-local",
                      "context": {"cluster": "cellplane-local", "user": user,
                                  "namespace": namespace}}],
        "current-context": "cellplane-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class KubeApiServer:
    def __init__(
        self,
        binaries: Binaries,
        base_dir: Path,
        *,
        etcd_servers: list[str],
        etcd_prefix: str = "/registry",
    ) -> None:
        self._binaries = binaries
        self._dir = base_dir / "kube-apiserver"
        self._etcd_servers = etcd_servers
        self._etcd_prefix = etcd_prefix
        self.port = free_port()
        self.advertise_address = non_loopback_address()
        self.log = base_dir / "logs" / "kube-apiserver.log"
        self.process: ManagedProcess | None = None
        self.pki: ApiServerPki | None = None
        self.kubeconfig = self._dir / "kubeconfig"
        self.encryption_config = self._dir / "encryption-config.yaml"

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def start(self, *, timeout: float = 120) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o700)  # private keys, the encryption key, the admin kubeconfig
        self.pki = pki = make_apiserver_pki(
            self._dir / "pki",
            hosts=[LOOPBACK, "localhost", self.advertise_address, "kubernetes",
                   "kubernetes.default", "kubernetes.default.svc"],
        )
        write_kubeconfig(self.kubeconfig, server=self.url, ca_cert=pki.ca_cert,
                         client_cert=pki.admin_cert, client_key=pki.admin_key)
        write_encryption_config(self.encryption_config)
        argv = [
            str(self._binaries.kube_apiserver),
            f"--etcd-servers={','.join(self._etcd_servers)}",
            f"--etcd-prefix={self._etcd_prefix}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.port}",
            f"--advertise-address={self.advertise_address}",
            # No other apiserver and no Service network: nothing to reconcile
            # the `kubernetes` endpoints against.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self._dir / 'certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--encryption-provider-config={self.encryption_config}",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # envtest's choice: no token controller runs, so the admission
            # plugin that would wait for service-account tokens is off.
            "--disable-admission-plugins=ServiceAccount",
            "--v=1",
        ]
        self.process = ManagedProcess("kube-apiserver", argv, log=self.log)
        self.process.start()
        self.process.wait_until(self.ready, timeout=timeout, what=f"{self.url}/readyz")

    def ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.url}/readyz", timeout=2, context=self.ssl_context()
            ) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
