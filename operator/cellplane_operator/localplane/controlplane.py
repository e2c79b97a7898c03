"""The whole local control plane: etcd, a kube-apiserver on it with cellplane's CRDs
Established, and PostgreSQL instances started on demand.

Start order is etcd -> apiserver -> CRDs; stop order is the reverse, with every
Postgres instance first. Everything lives in one run directory (logs included),
removed at teardown unless asked to keep it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cellplane_operator.errors import LocalPlaneError
from cellplane_operator.localplane.apiserver import KubeApiServer
from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.etcd import EtcdCluster
from cellplane_operator.localplane.postgres import PostgresInstance
from cellplane_operator.localplane.process import tail

__all__ = ["LocalControlPlane", "LocalPlaneConfig", "crd_dir", "admission_dir"]


def _manifest_dir(relative: str) -> Path:
    """A manifest folder: packaged with the wheel (pyproject's force-include puts it
    at the same path inside the package), or that folder of a checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / relative, package.parents[1] / relative):
        if candidate.is_dir():
            return candidate
    raise LocalPlaneError(f"no {relative}/ manifests found next to {package}")


def crd_dir() -> Path:
    """The CRD manifests: packaged with the wheel, or ``crds/`` of a checkout."""
    return _manifest_dir("crds")


def admission_dir() -> Path:
    """The admission policies (ValidatingAdmissionPolicy and binding) for the CRDs."""
    return _manifest_dir("deploy/admission")


@dataclass(frozen=True)
class LocalPlaneConfig:
    regions: tuple[str, ...] = ("region-a",)
    """One etcd member per region: three regions make a 3-member cluster."""
    with_apiserver: bool = True
    """Start a kube-apiserver on the etcd cluster and apply the CRDs."""
    run_dir: Path | None = None
    """Where data and logs go; a fresh directory under the temp dir by default."""
    durable_postgres: bool = False
    """fsync on for the Postgres instances (off is safe against process kills)."""


@dataclass
class LocalControlPlane:
    config: LocalPlaneConfig = field(default_factory=LocalPlaneConfig)
    binaries: Binaries = field(default_factory=Binaries.discover)
    run_dir: Path = field(init=False)
    etcd: EtcdCluster = field(init=False)
    apiserver: KubeApiServer | None = field(init=False, default=None)
    postgres: dict[str, PostgresInstance] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.config.run_dir is not None:
            self.run_dir = self.config.run_dir
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.run_dir = Path(tempfile.mkdtemp(prefix="cellplane-"))
        # Postgres runs as another OS user when we are root: it must be able to
        # walk into the run directory to reach its own data directory.
        self.run_dir.chmod(0o755)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.etcd = EtcdCluster(self.binaries, self.run_dir, member_names=list(self.config.regions))

    @property
    def kubeconfig(self) -> Path:
        if self.apiserver is None:
            raise LocalPlaneError("this control plane runs no kube-apiserver")
        return self.apiserver.kubeconfig

    def start(self) -> LocalControlPlane:
        try:
            self.etcd.start()
            if self.config.with_apiserver:
                self.apiserver = KubeApiServer(
                    self.binaries, self.run_dir, etcd_servers=self.etcd.client_urls
                )
                self.apiserver.start()
                self.apply_crds()
        except BaseException:
            self.stop()
            raise
        return self

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs the pinned kubectl against this control plane as the admin identity."""
        result = subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text, capture_output=True, text=True, timeout=120, check=False,
        )
        if check and result.returncode != 0:
            raise LocalPlaneError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply_crds(self) -> None:
        """Server-side apply of every CRD, wait until each is Established, then apply
        the admission policies that refer to them.

        The policies come second: they match the CRDs' resources and read fields
        of their schemas. A new policy takes effect a moment after it is stored (the
        admission plugin learns of it through an informer) and the API offers no
        signal for that moment: whoever depends on it retries until it holds.
        """
        directory = crd_dir()
        self.kubectl("apply", "--server-side", "--field-manager=cellplane-localplane",
                     "-f", str(directory))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     "-f", str(directory))
        self.kubectl("apply", "--server-side", "--field-manager=cellplane-localplane",
                     "-f", str(admission_dir()))

    def add_postgres(self, name: str) -> PostgresInstance:
        """A new primary cluster, started."""
        instance = self._register(name)
        instance.init_primary()
        instance.start()
        return instance

    def add_standby(self, name: str, *, primary: PostgresInstance) -> PostgresInstance:
        """A streaming standby of ``primary`` from ``pg_basebackup -R``, started."""
        instance = self._register(name)
        instance.init_standby_of(primary)
        instance.start()
        return instance

    def _register(self, name: str) -> PostgresInstance:
        if name in self.postgres:
            raise LocalPlaneError(f"a Postgres instance named {name!r} exists already")
        instance = PostgresInstance(self.binaries, self.run_dir, name,
                                    durable=self.config.durable_postgres)
        self.postgres[name] = instance
        return instance

    def stop(self) -> None:
        """Stops every process this control plane started, by PID, newest first."""
        errors: list[str] = []
        for instance in reversed(list(self.postgres.values())):
            try:
                instance.stop()
            except Exception as error:  # keep stopping the rest
                errors.append(f"postgres-{instance.name}: {error}")
        if self.apiserver is not None:
            try:
                self.apiserver.stop()
            except Exception as error:
                errors.append(f"kube-apiserver: {error}")
        try:
            self.etcd.stop()
        except Exception as error:
            errors.append(f"etcd: {error}")
        if errors:
            raise LocalPlaneError("teardown left errors: " + "; ".join(errors))

    def remove(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def logs(self) -> list[Path]:
        return sorted((self.run_dir / "logs").glob("*.log"))

    def dump_logs(self, lines: int = 60) -> str:
        """The tail of every log, for a failed test's report."""
        return "\n".join(f"===== {log.name} =====\n{tail(log, lines)}" for log in self.logs())

    def describe(self) -> dict[str, object]:
        """Endpoints and PIDs, as ``cellplane local up`` prints and saves them."""
        return {
            "run_dir": str(self.run_dir),
            "etcd": {m.name: {"endpoint": m.endpoint, "pid": m.process.pid if m.process else None}
                     for m in self.etcd.members},
            "kube_apiserver": None if self.apiserver is None else {
                "url": self.apiserver.url,
                "kubeconfig": str(self.apiserver.kubeconfig),
                "pid": self.apiserver.process.pid if self.apiserver.process else None,
            },
            "postgres": {name: {"dsn": pg.dsn, "pid": pg.process.pid if pg.process else None}
                         for name, pg in self.postgres.items()},
        }

    def write_state(self, path: Path) -> None:
        path.write_text(json.dumps(self.describe(), indent=2) + "\n")

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
        if kind is None and not os.environ.get("CELLPLANE_KEEP_RUN_DIR"):
            self.remove()
