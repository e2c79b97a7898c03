"""What every controller of one regional operator shares: its adapters, clock and settings."""

from __future__ import annotations

import base64
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from cellplane_operator.cellclient import CellAdmin
from cellplane_operator.clock import Clock
from cellplane_operator.errors import CellplaneError, KubeApiError, KubeConflictError
from cellplane_operator.kube import NAMESPACES, SECRETS, Resource
from cellplane_operator.kube.base import KubeApi
from cellplane_operator.runtime.cache import ObjectCache
from cellplane_operator.runtime.kubewrites import EventSender
from cellplane_operator.settings import OperatorSettings
from cellplane_operator.sites.base import CellDatabases, SiteDriver
from cellplane_operator.sites.celldb import PostgresCellDatabases
from cellplane_operator.sites.reports import SiteReports
from cellplane_operator.store import KeyValueStore

__all__ = ["RegionContext", "FINALIZER", "COMPONENT"]

log = logging.getLogger(__name__)

FINALIZER = "cellplane.io/placement"
COMPONENT = "cellplane-operator"


@dataclass
class RegionContext:
    settings: OperatorSettings
    store: KeyValueStore
    kube: KubeApi
    driver: SiteDriver
    clock: Clock
    cells: CellAdmin
    cache: ObjectCache
    reports: SiteReports
    databases: CellDatabases = field(default_factory=PostgresCellDatabases)
    """What the operator runs in cells' databases itself: grants, a standby's replay."""
    _admin_tokens: dict[str, str] = field(default_factory=dict)
    _events: EventSender | None = None

    @property
    def events(self) -> EventSender:
        if self._events is None:
            self._events = EventSender(self.kube, component=f"{COMPONENT}/{self.region}")
        return self._events

    @property
    def region(self) -> str:
        return self.settings.region

    async def event(self, involved: dict[str, Any], type_: Literal["Normal", "Warning"],
                    reason: str, message: str) -> None:
        """Logged, and handed to the Event sender: nothing waits on the apiserver for an
        Event (``runtime/kubewrites.py``); one it cannot post now is posted when it can.

        Still a coroutine, so that callers need not know how it is sent."""
        log.info("%s %s/%s: %s: %s", type_, involved.get("kind"),
                 (involved.get("metadata") or {}).get("name"), reason, message)
        self.events.record(involved, type_, reason, message, at=self.clock.now())

    async def close(self) -> None:
        """Stops the Event sender (Events not posted by now are dropped)."""
        if self._events is not None:
            await self._events.close()

    async def ensure_finalizer(self, resource: Resource, body: dict[str, Any], name: str) -> None:
        finalizers = list(body["metadata"].get("finalizers") or [])
        if name not in finalizers:
            await self._set_finalizers(resource, body, [*finalizers, name])

    async def drop_finalizer(self, resource: Resource, body: dict[str, Any], name: str) -> None:
        finalizers = list(body["metadata"].get("finalizers") or [])
        if name in finalizers:
            await self._set_finalizers(resource, body, [f for f in finalizers if f != name])

    async def _set_finalizers(self, resource: Resource, body: dict[str, Any],
                              finalizers: list[str]) -> None:
        meta = body["metadata"]
        # resourceVersion makes the merge patch conditional: another writer's finalizer
        # added meanwhile is a conflict (and a retry), never silently dropped.
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        try:
            updated = await self.kube.patch(resource, meta["name"], patch,
                                            namespace=meta.get("namespace"))
        except KubeConflictError:
            raise CellplaneError(f"{meta['name']} changed while setting finalizers; retrying") from None
        meta["finalizers"] = updated.get("metadata", {}).get("finalizers", finalizers)
        meta["resourceVersion"] = updated.get("metadata", {}).get("resourceVersion",
                                                                   meta["resourceVersion"])

    async def cell_admin_token(self, cell: str) -> str:
        """The cell's admin token, kept in a Secret; made by whoever asks first.

        Read from the apiserver once per cell and remembered: a token never changes
        while its cell exists, and every provisioning of a tenant asks for it.
        """
        if (known := self._admin_tokens.get(cell)) is not None:
            return known
        token = await self._read_or_make_admin_token(cell)
        self._admin_tokens[cell] = token
        return token

    def forget_cell(self, cell: str) -> None:
        self._admin_tokens.pop(cell, None)

    async def _read_or_make_admin_token(self, cell: str) -> str:
        name = f"cell-{cell}-admin"
        namespace = self.settings.namespace
        found = await self.kube.get(SECRETS, name, namespace=namespace)
        if found is None:
            await self._ensure_namespace(namespace)
            token = secrets.token_urlsafe(32)
            try:
                await self.kube.create(SECRETS, {
                    "metadata": {"name": name, "namespace": namespace,
                                 "labels": {"cellplane.io/cell": cell}},
                    "type": "Opaque", "stringData": {"token": token}}, namespace=namespace)
                return token
            except KubeConflictError:
                found = await self.kube.get(SECRETS, name, namespace=namespace)
            if found is None:
                raise KubeApiError(f"secret {namespace}/{name} vanished while being created")
        return base64.b64decode(found["data"]["token"]).decode()

    async def _ensure_namespace(self, namespace: str) -> None:
        if await self.kube.get(NAMESPACES, namespace) is None:
            try:
                await self.kube.create(NAMESPACES, {"metadata": {"name": namespace}})
            except KubeConflictError:
                pass
