"""The local control plane: real etcd, kube-apiserver and PostgreSQL on loopback.

One piece of code serves the pytest fixtures, the ``cellplane local`` command and
the demo. Every process it starts is tracked by PID and stopped at teardown;
its log stays on disk and is printed when a test fails.
"""

from cellplane_operator.localplane.apiserver import KubeApiServer
from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.controlplane import LocalControlPlane
from cellplane_operator.localplane.etcd import EtcdCluster, EtcdMember
from cellplane_operator.localplane.postgres import PostgresInstance
from cellplane_operator.localplane.process import ManagedProcess

__all__ = [
    "Binaries",
    "EtcdCluster",
    "EtcdMember",
    "KubeApiServer",
    "LocalControlPlane",
    "ManagedProcess",
    "PostgresInstance",
]
