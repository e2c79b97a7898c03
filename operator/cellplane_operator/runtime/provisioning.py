"""What provisioning a placed tenant writes: its Secret, its cell's tenant, its own cell.

- ``TenantSecrets``: the Secret in the tenant's namespace that holds its API key and
  webhook signing secret, made once and read back after; never one left by an earlier
  Tenant object of the same name.
- ``provision``: the tenant put into its cell through the cell's admin API (plan,
  quotas, key, then the whole set of targets and webhooks).
- ``DedicatedCells``: a dedicated tenant's own Cell, made when it is placed (or a move
  needs one) and deleted once no placement record points at it.

Every write is idempotent: a reconcile that stopped halfway is simply run again.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cellplane_operator.domain.dedicated import (
    TENANT_LABEL, TENANT_NAMESPACE_LABEL, dedicated_cell_spec, dedicated_to, standby_region,
)
from cellplane_operator.domain.cells import Region
from cellplane_operator.domain.placement import RegionPolicy, dedicated_cell_name
from cellplane_operator.domain.routing import KEY_PREFIX
from cellplane_operator.domain.tenants import secret_of_another_tenant
from cellplane_operator.errors import CellplaneError, KubeConflictError
from cellplane_operator.kube import CELLS, SECRETS
from cellplane_operator.placement.records import PlacementRecord
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.placing import Placements
from cellplane_operator.runtime.specs import TenantSettings

__all__ = ["ApiKeys", "TenantSecrets", "provision", "DedicatedCells", "secret_name"]


def secret_name(tenant: TenantSettings) -> str:
    return f"{tenant.name}-api-key"


@dataclass(frozen=True)
class ApiKeys:
    """What the tenant's Secret holds, and its name."""

    secret: str
    api_key: str
    webhook_secret: str


def _owner(body: dict[str, Any], **flags: bool) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": body["apiVersion"], "kind": "Tenant", "name": meta["name"],
            "uid": meta["uid"], **flags}


class TenantSecrets:
    def __init__(self, ctx: RegionContext) -> None:
        self._ctx = ctx

    async def ensure(self, body: dict[str, Any], tenant: TenantSettings,
                     record: PlacementRecord, *, replacing: bool = False) -> ApiKeys:
        """The tenant's keys, from its Secret; the Secret made first if there is none."""
        name = secret_name(tenant)
        found = await self._found_or_made(body, tenant, record)
        if isinstance(found, ApiKeys):
            return found
        data = {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}
        owners = {str(o.get("uid")) for o in found["metadata"].get("ownerReferences") or []
                  if o.get("kind") == "Tenant"}
        if secret_of_another_tenant(secret_tenant_id=data.get("tenant-id"), owner_uids=owners,
                                    tenant_id=record.tenant_id, uid=body["metadata"]["uid"]):
            if replacing:
                raise CellplaneError(f"secret {tenant.namespace}/{name} belongs to another "
                                     "Tenant object and is still there after its deletion")
            # This object gets a key of its own.
            await self._ctx.kube.delete(SECRETS, name, namespace=tenant.namespace)
            return await self.ensure(body, tenant, record, replacing=True)
        if not data.get("api-key") or not data.get("webhook-secret"):
            raise CellplaneError(f"secret {tenant.namespace}/{name} lacks api-key or webhook-secret")
        return ApiKeys(name, data["api-key"], data["webhook-secret"])

    async def _found_or_made(self, body: dict[str, Any], tenant: TenantSettings,
                             record: PlacementRecord) -> dict[str, Any] | ApiKeys:
        """The Secret as found, or the keys of the one made now because there was none."""
        name = secret_name(tenant)
        found = await self._ctx.kube.get(SECRETS, name, namespace=tenant.namespace)
        if found is not None:
            return found
        # The key names its tenant (cpk_<tenant id>.<secret>): the edge router routes
        # by it without a key table, and the cell still checks the whole key's hash.
        data = {"api-key": f"{KEY_PREFIX}{record.tenant_id}.{secrets.token_urlsafe(32)}",
                "webhook-secret": secrets.token_hex(32), "tenant-id": record.tenant_id}
        try:
            await self._ctx.kube.create(SECRETS, {
                "metadata": {"name": name, "namespace": tenant.namespace,
                             "labels": {TENANT_LABEL: tenant.name},
                             "ownerReferences": [_owner(body, controller=True,
                                                        blockOwnerDeletion=True)]},
                "type": "Opaque", "stringData": data}, namespace=tenant.namespace)
        except KubeConflictError:
            # Made meanwhile by another writer: read as found.
            found = await self._ctx.kube.get(SECRETS, name, namespace=tenant.namespace)
            if found is None:
                raise
            return found
        return ApiKeys(name, data["api-key"], data["webhook-secret"])

    async def delete(self, tenant: TenantSettings) -> None:
        await self._ctx.kube.delete(SECRETS, secret_name(tenant), namespace=tenant.namespace)


async def provision(ctx: RegionContext, tenant: TenantSettings, record: PlacementRecord,
                    admin: str, keys: ApiKeys) -> None:
    """The tenant as its spec says, in the cell its record names."""
    token = await ctx.cell_admin_token(record.cell)
    body: dict[str, Any] = {"plan": tenant.plan.value, "api_key": keys.api_key,
                            **tenant.overrides}
    await ctx.cells.put_tenant(admin, token, record.tenant_id, body)
    # The whole set, every time: a target or webhook taken out of the spec is taken
    # out of the cell too, or its URL would go on receiving signed calls.
    await ctx.cells.put_endpoints(admin, token, record.tenant_id, tenant.targets, tenant.webhooks,
                                  keys.webhook_secret)


class DedicatedCells:
    def __init__(self, ctx: RegionContext, placements: Placements,
                 publish_load: Callable[[str], Awaitable[None]]) -> None:
        self._ctx = ctx
        self._placements = placements
        self._publish_load = publish_load

    async def ensure(self, body: dict[str, Any], tenant: TenantSettings, cell: str,
                     max_running_jobs: int, *, region: str | None = None,
                     like: dict[str, Any] | None = None) -> None:
        """The tenant's own cell, in ``region`` (its home region unless a move says).
        Also the path of a dedicated tenant's move to a new cell (runtime/moves.py), which
        passes the old cell's spec as ``like``: the new cell runs the same way (its
        driver, lease and failover settings), only elsewhere."""
        if cell in self._ctx.cache.cells or await self._ctx.kube.get(CELLS, cell) is not None:
            return
        home = region or tenant.home_region
        standby: Region | None = None
        if tenant.region_policy is RegionPolicy.HOME_ASYNC:
            standby = standby_region(Region(home), [Region(r) for r in self._ctx.settings.regions])
        manifest = {
            "metadata": {
                "name": cell,
                "labels": {TENANT_LABEL: tenant.name, TENANT_NAMESPACE_LABEL: tenant.namespace},
                # A namespaced owner of a cluster-scoped object is recorded for people and
                # tools; Kubernetes' garbage collector cannot act on it, so the operator
                # deletes the cell itself (deletionPolicy Delete).
                "ownerReferences": [_owner(body)],
            },
            "spec": dedicated_cell_spec(region=home, max_running_jobs=max_running_jobs, standby=standby,
                                        like=like),
        }
        try:
            await self._ctx.kube.create(CELLS, manifest)
        except KubeConflictError:
            return
        await self._ctx.event(body, "Normal", "DedicatedCellCreated",
                              f"created dedicated cell {cell} in {home}"
                              + (f" with a standby in {standby}" if standby else ""))

    async def delete_for(self, tenant: TenantSettings) -> None:
        """Deletes the tenant's own cells (the first, and any a move made) once no record
        points at them. Run on every attempt of the removal, not only after the record
        went, so a failure here (the apiserver down, the deletion guard seeing an old
        count) is retried rather than forgotten."""
        names = {dedicated_cell_name(tenant.namespace, tenant.name)} | {
            name for name, found in self._ctx.cache.cells.items()
            if dedicated_to(found.meta.labels) == (tenant.namespace, tenant.name)}
        for name in sorted(names):
            await self.delete_unused(name)

    async def delete_unused(self, name: str) -> bool:
        """Deletes a cell no placement record points at; True if a deletion was asked."""
        cell = self._ctx.cache.cells.get(name)
        if cell is None or cell.meta.deleting:
            return False
        if self._placements.tenants_in(name):
            return False
        # The admission policy refuses a Cell whose status counts tenants: the count
        # must say 0 before the DELETE, not at the next batch of load updates.
        await self._publish_load(name)
        return await self._ctx.kube.delete(CELLS, name)
