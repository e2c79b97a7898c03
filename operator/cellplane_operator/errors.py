"""The operator package's one error hierarchy.

Adapters translate the errors of the libraries they wrap (gRPC, psycopg, the
Kubernetes client) into these, so callers never branch on a third-party type;
the kopf handlers map them to ``kopf.TemporaryError`` or ``kopf.PermanentError``.
"""

from __future__ import annotations

__all__ = [
    "CellplaneError",
    "StoreError",
    "StoreUnavailableError",
    "LocalPlaneError",
    "ProcessStartError",
    "BinaryNotFoundError",
    "ImageBuildError",
    "SiteError",
    "KubeConfigError",
    "KubeApiError",
    "KubeNotFoundError",
    "KubeConflictError",
    "CellApiError",
    "AgentWireError",
    "AgentUnreachable",
]


class CellplaneError(Exception):
    """Base of every error cellplane raises on purpose."""


class StoreError(CellplaneError):
    """The ownership store (etcd) refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """No etcd member confirmed the operation within the configured time.

    Raised when every member is down, or when the live members have lost quorum
    and cannot commit: the caller must treat the outcome of a write as unknown.
    """


class LocalPlaneError(CellplaneError):
    """The local control plane (etcd, kube-apiserver, Postgres) failed to start or stop."""


class ProcessStartError(LocalPlaneError):
    """A managed process exited or never became ready; the message names its log."""


class BinaryNotFoundError(LocalPlaneError):
    """A program the local control plane needs is not installed or not built yet."""


class ImageBuildError(LocalPlaneError):
    """A local cluster image could not be built or imported; the message ends with the
    build step's own output."""


class SiteError(CellplaneError):
    """A site driver could not make a cell's site (database, API, workers) run as asked.

    The message names the process and carries the tail of its log.
    """


class KubeConfigError(CellplaneError):
    """No usable kubeconfig or in-cluster credentials."""


class KubeApiError(CellplaneError):
    """The Kubernetes API refused a request, or could not be reached (``status`` 0)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeNotFoundError(KubeApiError):
    """404: the object does not exist."""


class KubeConflictError(KubeApiError):
    """409: the object exists already, or changed since it was read."""


class CellApiError(CellplaneError):
    """A cell's admin API refused a request or could not be reached (``status`` 0).

    ``code`` is the cell's error code (``target_refused``...), ``detail`` its message;
    both empty when the cell said nothing in its error shape."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail


class AgentWireError(CellplaneError):
    """A site agent's request or answer is not in its wire format (``sites/agent_wire.py``):
    the agent answers such a request with 400."""


class AgentUnreachable(SiteError):
    """A site agent did not answer, or answered other than with a result or a refusal (401,
    400, 500, not JSON). The message names the URL; ``status`` is 0 when nothing answered."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status
