"""The Kubernetes API as the operator uses it: the port its controllers, site driver and
commands depend on. ``KubeClient`` is the adapter over the apiserver's REST API;
``InMemoryKube`` the fake for unit tests (same contract, tests/kubecontract.py)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from cellplane_operator.kube.client import Resource

__all__ = ["KubeApi"]


class KubeApi(Protocol):
    """Objects are plain JSON documents as the apiserver returns them. Refusals raise
    ``KubeApiError`` (``KubeConflictError`` for 409: exists, or a stale resourceVersion
    in a patch); an absent object is None from ``get`` and False from ``delete``."""

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None
                  ) -> dict[str, Any] | None: ...

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        """Every object (of every namespace when ``namespace`` is None), optionally those
        whose labels match ``label_selector`` (``key=value`` terms joined by commas)."""

    async def create(self, resource: Resource, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]: ...

    async def patch(self, resource: Resource, name: str, patch: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    patch_type: Literal["merge", "json"] = "merge") -> dict[str, Any]:
        """A JSON merge patch (RFC 7386); ``metadata.resourceVersion`` in it makes it
        conditional. ``subresource="status"`` changes only the status."""

    async def apply(self, manifest: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        """Server-side apply of a whole object, forcing this manager's fields."""

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     propagation: str = "Background") -> bool:
        """True if a deletion was accepted (or is under way: finalizers), False if absent."""

    async def event(self, involved: Mapping[str, Any], *, type_: Literal["Normal", "Warning"],
                    reason: str, message: str, component: str,
                    now: datetime.datetime) -> None:
        """A core/v1 Event about ``involved``."""

    async def close(self) -> None: ...
