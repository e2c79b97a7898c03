"""An in-process fake of ``KubeApi`` that answers as the apiserver does, for unit tests.

What it keeps of the apiserver (checked against a real one by tests/kubecontract.py):
uids and resourceVersions, 409 on a second create and on a patch with a stale
resourceVersion, JSON merge patches, the status subresource of cellplane's resources,
Secrets' ``stringData`` stored as base64 ``data``, label selectors of ``key=value``
terms, and deletion held by finalizers (``deletionTimestamp`` set; the object goes
when its last finalizer is removed). What it leaves out: schema validation and
admission, owner-reference garbage collection, watches, JSON patches, and server-side
apply's field ownership (an apply merges the manifest into the object).
``unreachable`` makes every call fail as an apiserver that does not answer.
"""

from __future__ import annotations

import base64
import copy
import datetime
import itertools
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from cellplane_operator.errors import KubeApiError, KubeConflictError, KubeNotFoundError
from cellplane_operator.kube.client import EVENTS, Resource, resource_of

__all__ = ["InMemoryKube"]

_WITH_STATUS = {"cells", "tenants", "tenantmoves", "pods", "statefulsets", "deployments",
                "persistentvolumeclaims", "services", "namespaces"}
"""Resources whose status is a subresource: a patch of the object leaves it alone."""

Key = tuple[str, str, str]


class InMemoryKube:
    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}
        self._versions = itertools.count(1)
        self.unreachable = False
        """While True every call fails as an apiserver that does not answer does."""

    def _reach(self, what: str) -> None:
        if self.unreachable:
            raise KubeApiError(f"{what}: the apiserver did not answer (fake unreachable)")

    @staticmethod
    def _key(resource: Resource, name: str, namespace: str | None) -> Key:
        return resource.plural, (namespace or "") if resource.namespaced else "", name

    def _stamp(self, document: dict[str, Any]) -> dict[str, Any]:
        document["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(document)

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None
                  ) -> dict[str, Any] | None:
        self._reach(f"GET {resource.plural}/{name}")
        found = self._objects.get(self._key(resource, name, namespace))
        return copy.deepcopy(found) if found is not None else None

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        self._reach(f"LIST {resource.plural}")
        wanted = _selector(label_selector)
        return [copy.deepcopy(document) for (plural, space, _), document in sorted(self._objects.items())
                if plural == resource.plural and (namespace is None or space == namespace)
                and all((document["metadata"].get("labels") or {}).get(k) == v
                        for k, v in wanted.items())]

    async def create(self, resource: Resource, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]:
        self._reach(f"POST {resource.plural}")
        document: dict[str, Any] = copy.deepcopy(dict(body))
        meta = document.setdefault("metadata", {})
        if resource.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        key = self._key(resource, meta["name"], meta.get("namespace"))
        if key in self._objects:
            raise KubeConflictError(f"POST {resource.plural}: 409 AlreadyExists: "
                                    f"{resource.plural} \"{meta['name']}\" already exists",
                                    status=409, reason="AlreadyExists")
        document.update(apiVersion=resource.api_version, kind=resource.kind)
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
        if resource.plural == "secrets" and "stringData" in document:
            data = document.setdefault("data", {})
            for field, text in document.pop("stringData").items():
                data[field] = base64.b64encode(str(text).encode()).decode()
        if resource.plural in _WITH_STATUS and resource.group:
            document.pop("status", None)
        self._objects[key] = document
        return self._stamp(document)

    async def patch(self, resource: Resource, name: str, patch: Any, *,
                    namespace: str | None = None, subresource: str | None = None,
                    patch_type: Literal["merge", "json"] = "merge") -> dict[str, Any]:
        what = f"PATCH {resource.plural}/{name}"
        self._reach(what)
        if patch_type != "merge":
            raise NotImplementedError("the fake applies JSON merge patches only")
        key = self._key(resource, name, namespace)
        current = self._objects.get(key)
        if current is None:
            raise KubeNotFoundError(f"{what}: 404 NotFound", status=404, reason="NotFound")
        expected = ((patch.get("metadata") or {}).get("resourceVersion")
                    if isinstance(patch, Mapping) else None)
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise KubeConflictError(f"{what}: 409 Conflict: the object has been modified",
                                    status=409, reason="Conflict")
        patched = _merge(current, patch)
        if subresource == "status":
            patched = {**current, "status": patched.get("status")}
        elif resource.plural in _WITH_STATUS:
            patched["status"] = current.get("status")
        if patched.get("status") is None:
            patched.pop("status", None)
        if patched.get("spec") != current.get("spec"):
            patched["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        return self._store(key, patched)

    async def apply(self, manifest: Mapping[str, Any], *, field_manager: str) -> dict[str, Any]:
        resource = resource_of(str(manifest["kind"]))
        meta = manifest["metadata"]
        if await self.get(resource, meta["name"], namespace=meta.get("namespace")) is None:
            return await self.create(resource, manifest, namespace=meta.get("namespace"))
        unconditional = {**manifest, "metadata": {k: v for k, v in meta.items()
                                                  if k != "resourceVersion"}}
        return await self.patch(resource, meta["name"], unconditional,
                                namespace=meta.get("namespace"))

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
                     propagation: str = "Background") -> bool:
        self._reach(f"DELETE {resource.plural}/{name}")
        key = self._key(resource, name, namespace)
        current = self._objects.get(key)
        if current is None:
            return False
        if current["metadata"].get("finalizers"):
            if "deletionTimestamp" not in current["metadata"]:
                current["metadata"]["deletionTimestamp"] = _now()
                self._stamp(current)
            return True
        del self._objects[key]
        return True

    async def event(self, involved: Mapping[str, Any], *, type_: Literal["Normal", "Warning"],
                    reason: str, message: str, component: str,
                    now: datetime.datetime) -> None:
        meta = involved.get("metadata") or {}
        await self.create(EVENTS, {
            "metadata": {"name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {"kind": involved.get("kind"), "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": component}, "count": 1,
        }, namespace=meta.get("namespace") or "default")

    async def close(self) -> None:
        return None

    def _store(self, key: Key, document: dict[str, Any]) -> dict[str, Any]:
        meta = document["metadata"]
        if "deletionTimestamp" in meta and not meta.get("finalizers"):
            self._objects.pop(key, None)
            return copy.deepcopy(document)
        self._objects[key] = document
        return self._stamp(document)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _selector(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    terms = {}
    for term in text.split(","):
        key, equals, value = term.partition("=")
        if not equals or key.endswith("!") or not key.strip():
            raise NotImplementedError(f"the fake selects by key=value terms only, not {term!r}")
        terms[key.strip()] = value.strip()
    return terms


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
