"""The operator's configuration, read once at the entry point and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cellplane_operator.domain.ownership import LeaseSettings

__all__ = ["OperatorSettings"]


@dataclass(frozen=True)
class OperatorSettings:
    region: str
    """The region this operator instance runs in and acts for."""
    etcd_endpoints: tuple[str, ...] = ()
    """``host:port`` of every member of the ownership-table etcd cluster."""
    etcd_timeout_seconds: float = 2.0
    """How long one etcd operation may take over all members before it fails."""
    state_dir: Path = Path(".local/sites")
    """Where the local site driver keeps this region's sites (data, logs, PIDs)."""
    namespace: str = "cellplane-system"
    """Namespace of the operator's own Secrets (cell admin tokens)."""
    kubeconfig: Path | None = None
    """Kubeconfig to use; None: $KUBECONFIG, in-cluster, then ~/.kube/config."""
    kube_timeout_seconds: float = 10.0
    """How long one request to the Kubernetes API may take. Nothing on the path of a
    failover waits on one (``runtime/kubewrites.py``)."""
    election: LeaseSettings = field(default_factory=LeaseSettings)
    """Lease of the placement election."""
    resync_seconds: float = 30.0
    """Every object is reconciled at least this often, events or not."""
    site_check_seconds: float = 1.0
    """How often each site's processes are health-checked (and restarted)."""
    tenant_workers: int = 16
    """Tenants reconciled at once by the placement leader."""
    regions: tuple[str, ...] = ()
    """Every region of the deployment; a dedicated HOME_ASYNC tenant's standby goes to the
    region after its home in this list."""
    adopt_leases: bool = False
    """Continue the live leases of this region's previous operator after a restart, and
    leave the cells serving at shutdown. Only with an exclusive lock on ``state_dir``,
    which proves the previous operator is gone."""
    member: str = ""
    """This operator's name in elections; default ``<region>-<pid>``."""
    move_progress_deadline_seconds: float = 600.0
    """How long a TenantMove may go without progress before its cutover (waiting to be
    admitted, or every step failing: a cell that does not serve or refuses) before it
    fails with the reason it was stuck on. As a Deployment's progressDeadlineSeconds."""
