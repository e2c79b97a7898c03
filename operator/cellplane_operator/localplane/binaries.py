"""Where the real programs are, at the versions pinned in ``hack/versions.env``.

``hack/build-binaries.sh`` builds kube-apiserver, kubectl, etcd, helm, the local
cluster's node programs and CoreDNS into a cache outside the repository; PostgreSQL
(and containerd, runc, the CNI plugins) come from Debian's packages. This module only
finds them and says clearly what to run when one is missing.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

from cellplane_operator.errors import BinaryNotFoundError

__all__ = ["Binaries", "ClusterBinaries", "default_cache_dir", "built_bin_dir", "helm_binary"]

_BUILD_HINT = "run `bash hack/setup.sh` (it builds the pinned versions from their Go modules)"


def default_cache_dir() -> Path:
    """The cache ``hack/build-binaries.sh`` writes to (``$CELLPLANE_CACHE`` overrides it)."""
    if explicit := os.environ.get("CELLPLANE_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "cellplane"


def built_bin_dir() -> Path:
    """Where the Go-built programs are (``$CELLPLANE_BIN_DIR`` overrides the cache's ``bin``)."""
    return Path(os.environ.get("CELLPLANE_BIN_DIR") or default_cache_dir() / "bin")


def helm_binary() -> Path:
    """helm, built from helm.sh/helm/v3 at the pinned version.

    Apart from ``Binaries``: the local control plane never runs helm; only the chart's
    tests (and people installing charts/cellplane) do.
    """
    path = built_bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        raise BinaryNotFoundError(f"{path} is missing: {_BUILD_HINT}")
    return path


@dataclass(frozen=True)
class Binaries:
    """Paths of every program the local control plane starts."""

    kube_apiserver: Path
    """kube-apiserver built from k8s.io/kubernetes at the pinned release."""
    kubectl: Path
    """kubectl built from the same modules as the apiserver."""
    etcd: Path
    """etcd built from go.etcd.io/etcd/server/v3 at the pinned release."""
    postgres_bin: Path
    """The directory of PostgreSQL's server programs (initdb, postgres, pg_ctl, ...)."""

    @classmethod
    def discover(cls, *, postgres_major: int = 15, postgres_only: bool = False) -> Binaries:
        """The programs, checked. ``postgres_only``: only PostgreSQL's are required, for an
        operator, whose site driver runs Postgres and never the Go-built programs (which an
        operator's image then need not carry)."""
        bin_dir = built_bin_dir()
        found = cls(
            kube_apiserver=bin_dir / "kube-apiserver",
            kubectl=bin_dir / "kubectl",
            etcd=bin_dir / "etcd",
            postgres_bin=_postgres_bin(postgres_major),
        )
        found.check(postgres_only=postgres_only)
        return found

    def check(self, *, postgres_only: bool = False) -> None:
        for path in () if postgres_only else (self.kube_apiserver, self.kubectl, self.etcd):
            if not os.access(path, os.X_OK):
                raise BinaryNotFoundError(f"{path} is missing: {_BUILD_HINT}")
        if not os.access(self.postgres_bin / "postgres", os.X_OK):
            raise BinaryNotFoundError(
                f"PostgreSQL server programs not found in {self.postgres_bin}: {_BUILD_HINT}"
            )

    def pg(self, program: str) -> str:
        return str(self.postgres_bin / program)


@dataclass(frozen=True)
class ClusterBinaries:
    """The Go-built programs a real cluster adds to the local control plane's: each is
    the file of its own name (``kube_proxy``: ``kube-proxy``) in ``built_bin_dir()``."""

    kubelet: Path
    """kubelet, from k8s.io/kubernetes at the apiserver's version."""
    kube_proxy: Path
    """kube-proxy (iptables mode), same build."""
    kube_controller_manager: Path
    """kube-controller-manager, same build."""
    kube_scheduler: Path
    """kube-scheduler, same build."""
    coredns: Path
    """CoreDNS, from github.com/coredns/coredns at COREDNS_VERSION."""

    @classmethod
    def discover(cls) -> ClusterBinaries:
        bin_dir = built_bin_dir()
        found = cls(**{field.name: bin_dir / field.name.replace("_", "-")
                       for field in fields(cls)})
        for field in fields(found):
            path: Path = getattr(found, field.name)
            if not os.access(path, os.X_OK):
                raise BinaryNotFoundError(f"{path} is missing: {_BUILD_HINT}")
        return found


def _postgres_bin(major: int) -> Path:
    debian = Path(f"/usr/lib/postgresql/{major}/bin")
    if debian.is_dir():
        return debian
    on_path = shutil.which("pg_ctl")
    return Path(on_path).resolve().parent if on_path else debian
