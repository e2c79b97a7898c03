"""Where the apiserver is and who we are to it: a kubeconfig's current context, or in-cluster.

Only what the operator needs is read: the server, its CA, and a client
certificate or a bearer token (file). Inline ``*-data`` fields are kept in memory;
``ssl`` loads a client certificate from paths only, so an inline one is written to
a private directory for the moment it is loaded, then removed.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cellplane_operator.errors import KubeConfigError

__all__ = ["KubeConfig"]

_IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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

    @classmethod
    def load(cls, kubeconfig: Path | None = None) -> KubeConfig:
        """``kubeconfig``, else $KUBECONFIG, else in-cluster, else ~/.kube/config."""
        path = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
        if path is None and (_IN_CLUSTER / "token").exists():
            return cls.in_cluster()
        return cls.from_file(path or Path.home() / ".kube" / "config")

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        return cls(server=f"https://{host}:{port}", ca_file=_IN_CLUSTER / "ca.crt",
                   token_file=_IN_CLUSTER / "token",
                   namespace=(_IN_CLUSTER / "namespace").read_text().strip())

    @classmethod
    def from_file(cls, path: Path) -> KubeConfig:
        try:
            document: dict[str, Any] = yaml.safe_load(path.read_text())
            context_name = document["current-context"]
            context = _named(document, "contexts", context_name)["context"]
            cluster = _named(document, "clusters", context["cluster"])["cluster"]
            user = _named(document, "users", context["user"]).get("user") or {}
        except (OSError, KeyError, TypeError, yaml.YAMLError) as error:
            raise KubeConfigError(f"cannot read kubeconfig {path}: {error!r}") from None
        base = path.parent
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
        )

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file and not self.ca_data else None,
            cadata=self.ca_data.decode() if self.ca_data else None)
        cert = self.client_cert_data or self.client_cert
        key = self.client_key_data or self.client_key
        if cert is None or key is None:
            return context
        with tempfile.TemporaryDirectory(prefix="cellplane-kube-") as private:
            context.load_cert_chain(_path_of(cert, Path(private) / "client.crt"),
                                    _path_of(key, Path(private) / "client.key"))
        return context

    def bearer_token(self) -> str | None:
        # A projected service-account token is rotated on disk: read it each time.
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token


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


def _path_of(pem: Path | bytes, copy: Path) -> str:
    if isinstance(pem, Path):
        return str(pem)
    copy.write_bytes(pem)  # in a directory of mode 0700, removed once loaded
    return str(copy)
