"""A thin asynchronous Kubernetes API client: the operator's only way to write to the apiserver."""

from cellplane_operator.kube.client import KubeClient, Resource, CELLS, TENANTS, TENANTMOVES, SECRETS, NAMESPACES, EVENTS, CONFIGMAPS
from cellplane_operator.kube.config import KubeConfig

__all__ = ["KubeClient", "KubeConfig", "Resource", "CELLS", "TENANTS", "TENANTMOVES", "SECRETS",
           "NAMESPACES", "EVENTS", "CONFIGMAPS"]
