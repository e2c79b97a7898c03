"""Where the apiserver is and who we are to it: a kubeconfig's current context, or in-cluster.

This module only reads: the server, its CA, the namespace and the user's entry,
as kubectl finds them (``--kubeconfig``, else ``$KUBECONFIG``, else in-cluster,
else ``~/.kube/config``). Turning the user's entry into credentials (a token
file re-read, an ``exec`` plugin run, an OIDC id-token) is ``kube/login.py``'s
concern. Inline ``*-data`` fields are kept in memory; ``ssl`` loads a client
certificate from paths only, so an inline one is written to a private directory
for the moment it is loaded, then removed.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cellplane_operator.errors import KubeConfigError

__all__ = ["KubeConfig", "ExecConfig", "IN_CLUSTER_DIR"]

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a Pod's service-account token, CA and namespace."""

_EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


@dataclass(frozen=True)
class ExecConfig:
    """A kubeconfig user's ``exec`` credential plugin, as client-go reads it."""

    command: str
    """The program; a relative path with a slash is relative to the kubeconfig's folder."""
    api_version: str
    """``client.authentication.k8s.io/v1`` or ``.../v1beta1``: the ExecCredential it prints."""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Added to the operator's own environment for the plugin."""
    provide_cluster_info: bool = False
    """Whether KUBERNETES_EXEC_INFO carries the cluster (server, CA, the exec extension)."""
    interactive_mode: str = "IfAvailable"
    """Never, IfAvailable or Always. The operator and the CLIs never hand the plugin a
    terminal, so ``Always`` is refused with a clear error."""
    install_hint: str | None = None


@dataclass(frozen=True)
class KubeConfig:
    server: str
    ca_file: Path | None
    client_cert: Path | None = None
    client_key: Path | None = None
    ca_data: bytes | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    namespace: str = "default"
    user: str = ""
    """The kubeconfig user's name (``in-cluster`` for a Pod's service account), for errors."""
    exec: ExecConfig | None = None
    auth_provider: str | None = None
    """The name of a legacy ``auth-provider`` (only ``oidc`` is understood)."""
    auth_provider_config: Mapping[str, str] = field(default_factory=dict)
    insecure_skip_tls_verify: bool = False
    cluster_extension: Any = None
    """The cluster's ``client.authentication.k8s.io/exec`` extension, handed to a plugin
    that asks for the cluster's info."""
    source: Path | None = None
    """The kubeconfig file read (None in-cluster)."""

    @classmethod
    def load(cls, kubeconfig: Path | None = None) -> KubeConfig:
        """``kubeconfig``, else $KUBECONFIG, else in-cluster, else ~/.kube/config."""
        if kubeconfig is None:
            # kubectl merges a list; the operator and CLIs read its first file that exists.
            listed = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
            kubeconfig = next((p for p in listed if p.exists()), listed[0] if listed else None)
        if kubeconfig is None and (IN_CLUSTER_DIR / "token").exists():
            return cls.in_cluster()
        return cls.from_file(kubeconfig or Path.home() / ".kube" / "config")

    @classmethod
    def in_cluster(cls, directory: Path = IN_CLUSTER_DIR,
                   environ: Mapping[str, str] | None = None) -> KubeConfig:
        """A Pod's service account: the token file (re-read, the kubelet rotates it), the
        CA and the namespace the kubelet mounts, the apiserver from KUBERNETES_SERVICE_*."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError("in-cluster login: KUBERNETES_SERVICE_HOST and "
                                  "KUBERNETES_SERVICE_PORT are not set")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        try:
            namespace = (directory / "namespace").read_text().strip()
        except OSError:
            namespace = "default"
        return cls(server=f"https://{host}:{port}", ca_file=directory / "ca.crt",
                   token_file=directory / "token", namespace=namespace or "default",
                   user="in-cluster")

    @classmethod
    def from_file(cls, path: Path) -> KubeConfig:
        try:
            document: dict[str, Any] = yaml.safe_load(path.read_text())
            context_name = document["current-context"]
            context = _named(document, "contexts", context_name)["context"]
            cluster = _named(document, "clusters", context["cluster"])["cluster"]
            user_name = str(context["user"])
            user = _named(document, "users", user_name).get("user") or {}
        except (OSError, KeyError, TypeError, yaml.YAMLError) as error:
            raise KubeConfigError(f"cannot read kubeconfig {path}: {error!r}") from None
        base = path.parent
        provider = user.get("auth-provider") or {}
        return cls(
            server=str(cluster["server"]).rstrip("/"),
            ca_file=_file(base, cluster, "certificate-authority"),
            client_cert=_file(base, user, "client-certificate"),
            client_key=_file(base, user, "client-key"),
            ca_data=_data(cluster, "certificate-authority"),
            client_cert_data=_data(user, "client-certificate"),
            client_key_data=_data(user, "client-key"),
            token=user.get("token"),
            token_file=_file(base, user, "tokenFile"),
            namespace=str(context.get("namespace") or "default"),
            user=user_name,
            exec=_exec(path, user_name, user.get("exec")),
            auth_provider=str(provider["name"]) if provider.get("name") else None,
            auth_provider_config={str(k): str(v) for k, v in
                                  (provider.get("config") or {}).items()},
            insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify")),
            cluster_extension=_extension(cluster),
            source=path,
        )

    def ssl_context(self, cert: Path | bytes | None = None,
                    key: Path | bytes | None = None) -> ssl.SSLContext:
        """TLS to the server with its CA, presenting the client certificate ``cert`` and
        ``key`` (a login's), else the kubeconfig's own."""
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file and not self.ca_data else None,
            cadata=self.ca_data.decode() if self.ca_data else None)
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is None or key is None:
            cert = self.client_cert_data or self.client_cert
            key = self.client_key_data or self.client_key
        if cert is None or key is None:
            return context
        with tempfile.TemporaryDirectory(prefix="cellplane-kube-") as private:
            context.load_cert_chain(_path_of(cert, Path(private) / "client.crt"),
                                    _path_of(key, Path(private) / "client.key"))
        return context

    def bearer_token(self) -> str | None:
        """The static token: ``token``, else the token file as it is now."""
        if self.token:
            return self.token
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return None

    def ca_pem(self) -> bytes | None:
        """The CA's PEM (for a plugin given the cluster's info), or None if unreadable."""
        if self.ca_data is not None:
            return self.ca_data
        try:
            return self.ca_file.read_bytes() if self.ca_file is not None else None
        except OSError:
            return None


def _named(document: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise KeyError(f"{section} has no entry named {name!r}")


def _file(base: Path, section: dict[str, Any], key: str) -> Path | None:
    if value := section.get(key):
        path = Path(value)
        return path if path.is_absolute() else base / path
    return None


def _data(section: dict[str, Any], key: str) -> bytes | None:
    """The inline ``KEY-data`` (base64); where the file ``KEY`` is named too, the data
    wins, as with kubectl."""
    data = section.get(f"{key}-data")
    return base64.b64decode(data) if data else None


def _exec(path: Path, user: str, section: Any) -> ExecConfig | None:
    if not section:
        return None
    if not isinstance(section, dict) or not section.get("command"):
        raise KubeConfigError(f"kubeconfig {path}: user {user!r}: exec has no command")
    api_version = str(section.get("apiVersion") or "")
    if api_version not in _EXEC_API_VERSIONS:
        raise KubeConfigError(f"kubeconfig {path}: user {user!r}: exec apiVersion "
                              f"{api_version!r} is not one of {', '.join(_EXEC_API_VERSIONS)}")
    mode = str(section.get("interactiveMode") or "")
    if not mode:
        if api_version.endswith("/v1"):
            raise KubeConfigError(f"kubeconfig {path}: user {user!r}: exec interactiveMode "
                                  "is required with client.authentication.k8s.io/v1")
        mode = "IfAvailable"
    if mode not in ("Never", "IfAvailable", "Always"):
        raise KubeConfigError(f"kubeconfig {path}: user {user!r}: exec interactiveMode "
                              f"{mode!r} is not Never, IfAvailable or Always")
    command = str(section["command"])
    if os.sep in command and not os.path.isabs(command):
        command = str(path.parent / command)
    return ExecConfig(
        command=command, api_version=api_version,
        args=tuple(str(a) for a in section.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in section.get("env") or ()),
        provide_cluster_info=bool(section.get("provideClusterInfo")),
        interactive_mode=mode, install_hint=section.get("installHint"))


def _extension(cluster: dict[str, Any]) -> Any:
    for entry in cluster.get("extensions") or []:
        if entry.get("name") == "client.authentication.k8s.io/exec":
            return entry.get("extension")
    return None


def _path_of(pem: Path | bytes, copy: Path) -> str:
    if isinstance(pem, Path):
        return str(pem)
    copy.write_bytes(pem)  # in a directory of mode 0700, removed once loaded
    return str(copy)
