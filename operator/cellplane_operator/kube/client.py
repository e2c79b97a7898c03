"""The Kubernetes REST calls the operator makes, over one pooled HTTP/1.1 client.

The official client is synchronous and large; the operator needs eight verbs
on five resources, so they are written out here, and every refusal becomes a
``KubeApiError`` carrying the apiserver's status, reason and message. Who the
client is comes from ``kube/login.py`` before each request (a 401 asks the login
for fresh credentials and sends once more); a 429 or 503 with Retry-After is sent
again as ``kube/retry.py`` decides; Events are aggregated by ``kube/events.py``.
docs/configuration.md says why this client rather than the ``kubernetes`` library.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from cellplane_operator.errors import KubeApiError, KubeConflictError, KubeNotFoundError
from cellplane_operator.kube.config import KubeConfig
from cellplane_operator.kube.events import EventRecorder
from cellplane_operator.kube.login import Credentials, Login, login_for
from cellplane_operator.kube.retry import RetryPolicy, retry_delay

__all__ = ["KubeClient", "Resource", "CELLS", "TENANTS", "TENANTMOVES", "SECRETS", "NAMESPACES",
           "EVENTS", "CONFIGMAPS", "SERVICES", "PODS", "PERSISTENTVOLUMECLAIMS", "STATEFULSETS",
           "DEPLOYMENTS", "resource_of"]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None, *, all_namespaces: bool = False) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and not all_namespaces:
            if namespace is None:
                raise ValueError(f"{self.plural} are namespaced: a namespace is needed")
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


CELLS = Resource("cellplane.io", "v1alpha1", "cells", "Cell", namespaced=False)
TENANTS = Resource("cellplane.io", "v1alpha1", "tenants", "Tenant", namespaced=True)
TENANTMOVES = Resource("cellplane.io", "v1alpha1", "tenantmoves", "TenantMove", namespaced=True)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
SERVICES = Resource("", "v1", "services", "Service", namespaced=True)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
PERSISTENTVOLUMECLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim",
                                  namespaced=True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)

_BY_KIND = {r.kind: r for r in (CELLS, TENANTS, TENANTMOVES, SECRETS, NAMESPACES, EVENTS,
                                CONFIGMAPS, SERVICES, PODS, PERSISTENTVOLUMECLAIMS, STATEFULSETS,
                                DEPLOYMENTS)}


def resource_of(kind: str) -> Resource:
    """The resource of an object's ``kind`` (the kinds this client knows)."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ValueError(f"no resource known for the kind {kind!r}") from None

_PATCH_TYPES = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                "apply": "application/apply-patch+yaml"}


class KubeClient:
    def __init__(self, config: KubeConfig, *, timeout_seconds: float = 10.0,
                 user_agent: str = "cellplane-operator", login: Login | None = None,
                 retry: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.login = login if login is not None else login_for(config)
        self._timeout = timeout_seconds
        self._user_agent = user_agent
        self._retry, self._sleep, self._transport = retry, sleep, transport
        # One pooled client per client certificate presented: an exec plugin may hand
        # out a new one, and TLS presents it only on new connections.
        self._http: httpx.AsyncClient | None = None
        self._http_identity: tuple[object, object] | None = None
        self._retired: list[httpx.AsyncClient] = []
        self._events = EventRecorder(_EventWrites(self))

    def _client_for(self, credentials: Credentials) -> httpx.AsyncClient:
        identity = (credentials.cert, credentials.key)
        if self._http is None or identity != self._http_identity:
            if self._http is not None:
                self._retired.append(self._http)  # requests may still run on it
            self._http = httpx.AsyncClient(
                base_url=self.config.server, timeout=self._timeout,
                verify=self.config.ssl_context(credentials.cert, credentials.key),
                headers={"User-Agent": self._user_agent, "Accept": "application/json"},
                transport=self._transport,
                # httpcore checks every pooled connection on each request: a small pool
                # is cheaper, and 16 requests at once keep the apiserver busy enough.
                limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
            self._http_identity = identity
        return self._http

    async def close(self) -> None:
        for http in [*self._retired, *([self._http] if self._http is not None else [])]:
            await http.aclose()
        self._retired, self._http = [], None

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None
                  ) -> dict[str, Any] | None:
        try:
            return await self._request("GET", resource.path(namespace, name))
        except KubeNotFoundError:
            return None

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        path = resource.path(namespace, all_namespaces=resource.namespaced and namespace is None)
        params = {"labelSelector": label_selector} if label_selector else None
        found = await self._request("GET", path, params=params)
        return list(found.get("items") or [])

    async def create(self, resource: Resource, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]:
        document = {"apiVersion": resource.api_version, "kind": resource.kind, **body}
        return await self._request("POST", resource.path(namespace), json_body=document)

    async def patch(self, resource: Resource, name: str, patch: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    patch_type: Literal["merge", "json"] = "merge") -> dict[str, Any]:
        return await self._request("PATCH", resource.path(namespace, name, subresource),
                                   json_body=patch, content_type=_PATCH_TYPES[patch_type])

    async def apply(self, manifest: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        """Server-side apply of a whole object (``kind``, ``apiVersion``, ``metadata.name``
        and, when namespaced, ``metadata.namespace``), forcing this manager's ownership of
        the fields it names: the object is what the caller rendered."""
        meta = manifest["metadata"]
        resource = resource_of(str(manifest["kind"]))
        path = resource.path(meta.get("namespace"), meta["name"])
        return await self._request("PATCH", path, json_body=manifest,
                                   content_type=_PATCH_TYPES["apply"],
                                   params={"fieldManager": field_manager, "force": "true"})

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     propagation: str = "Background") -> bool:
        """True if a deletion was accepted (or is under way), False if the object was absent."""
        try:
            await self._request("DELETE", resource.path(namespace, name),
                                json_body={"propagationPolicy": propagation})
        except KubeNotFoundError:
            return False
        return True

    async def event(self, involved: Mapping[str, Any], *, type_: Literal["Normal", "Warning"],
                    reason: str, message: str, component: str,
                    now: datetime.datetime) -> None:
        """A core/v1 Event about ``involved`` (an object as read), shown by ``kubectl
        describe``; a repeat within minutes counts on the Event already posted."""
        await self._events.record(involved, type_=type_, reason=reason, message=message,
                                  component=component, now=now)

    async def _request(self, method: str, path: str, *, json_body: Any = None,
                       content_type: str = "application/json",
                       params: Mapping[str, str] | None = None) -> dict[str, Any]:
        content = None if json_body is None else json.dumps(json_body).encode()
        attempt, renewed = 0, False
        while True:
            attempt += 1
            credentials = await self.login.credentials()
            headers = {"Content-Type": content_type}
            if credentials.token:
                headers["Authorization"] = f"Bearer {credentials.token}"
            try:
                response = await self._client_for(credentials).request(
                    method, path, content=content, headers=headers, params=params)
            except httpx.HTTPError as error:
                raise KubeApiError(f"{method} {path}: {error!r}") from None
            if response.status_code < 300:
                return dict(response.json()) if response.content else {}
            if response.status_code == 401 and not renewed and self.login.unauthorized():
                renewed = True  # expired or rotated credentials: fresh ones, once
                continue
            delay = retry_delay(response.status_code, response.headers.get("Retry-After"),
                                attempt, self._retry)
            if delay is None:
                raise _refusal(method, path, response)
            await self._sleep(delay)


class _EventWrites:
    """The recorder's way to the apiserver: this client's create and patch."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        await self._kube.create(EVENTS, body, namespace=namespace)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        await self._kube.patch(EVENTS, name, patch, namespace=namespace)


def _refusal(method: str, path: str, response: httpx.Response) -> KubeApiError:
    try:
        status = response.json()
        message, reason = str(status.get("message", "")), str(status.get("reason", ""))
    except ValueError:
        message, reason = response.text[:500], ""
    text = f"{method} {path}: {response.status_code} {reason}: {message}"
    kind: type[KubeApiError] = {404: KubeNotFoundError, 409: KubeConflictError}.get(
        response.status_code, KubeApiError)
    return kind(text, status=response.status_code, reason=reason)
