"""A thin asynchronous Kubernetes API client: the operator's only way to write to the apiserver."""

from cellplane_operator.kube.client import KubeClient, Resource, CELLS, TENANTS, TENANTMOVES, SECRETS, NAMESPACES, EVENTS, CONFIGMAPS
from cellplane_operator.kube.config import KubeConfig
from cellplane_operator.kube.login import Credentials, Login, LoginError, login_for
from cellplane_operator.kube.retry import RetryPolicy

__all__ = ["KubeClient", "KubeConfig", "Resource", "CELLS", "TENANTS", "TENANTMOVES", "SECRETS",
           "NAMESPACES", "EVENTS", "CONFIGMAPS", "Credentials", "Login", "LoginError",
           "login_for", "RetryPolicy"]
