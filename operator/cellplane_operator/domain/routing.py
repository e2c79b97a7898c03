"""Where a tenant's request goes: the edge router's placement map, and its decisions.

The map is a copy of three kinds of etcd keys, each applied only if it is newer
(by etcd revision) than what the map holds, so a watch event and the initial
read can arrive in any order:

    /cellplane/tenants/<ns>/<name>          tenant -> cell, tenant epoch, tenant id, moving
    /cellplane/groups/<cell>/owner          cell -> owning region and site, group epoch
    /cellplane/cells/<cell>/sites/<region>  a site's endpoints and whether it serves

A tenant's API key names the tenant (``cpk_<tenant id>.<secret>``), so the
router routes by the id. A record that carries the key's SHA-256
(``keyDigest``, written once the cell holds the key) lets the router check the
whole key itself, before it reads a byte of the body and without asking a cell:
a key of no placed tenant and a wrong secret are then refused alike, compared
in constant time against a stand-in digest when there is no tenant, so neither
the answer nor its timing tells whether a tenant id exists. A record without
the digest (written before the key existed, or by an older operator) leaves
the check to the cell.

A tenant whose record says ``moving`` is being cut over to another cell: its
source no longer serves it and its target not yet, so it has no route until the
record names the target and the flag is gone. Like a cell without an owner,
that is a wait, not a refusal.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Route", "NoRoute", "PlacementMap", "tenant_of_key", "KEY_PREFIX", "KeyCheck",
           "key_digest"]

KEY_PREFIX = "cpk_"


def tenant_of_key(api_key: str) -> str | None:
    """The tenant id a key names, or None for a key of another shape."""
    if not api_key.startswith(KEY_PREFIX) or "." not in api_key:
        return None
    tenant, _, secret = api_key[len(KEY_PREFIX):].partition(".")
    return tenant if tenant and secret else None


def key_digest(api_key: str) -> str:
    """The hex SHA-256 of a key, as placement records carry it (the cell stores the same)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


_NO_DIGEST = key_digest("no tenant has this key")
"""Compared against when the key names no tenant, so that case costs what a wrong secret does."""


class KeyCheck(enum.Enum):
    VALID = "valid"
    """The key is the tenant's: forward."""
    CELL_DECIDES = "cell_decides"
    """The tenant is placed but its record carries no digest: forward, the cell checks."""
    INVALID = "invalid"
    """No placed tenant has this key (an unknown id or a wrong secret alike): 401."""


@dataclass(frozen=True)
class Route:
    tenant_id: str
    cell: str
    tenant_epoch: int
    group_epoch: int
    region: str
    api: str
    """Base URL of the active site's tenant API."""


@dataclass(frozen=True)
class NoRoute:
    reason: Literal["UnknownTenant", "NoOwner", "SiteNotServing", "Moving"]
    """UnknownTenant: answer 401/404 at once; the others are a takeover or a move's cutover
    in progress: hold."""
    message: str

    @property
    def transient(self) -> bool:
        return self.reason != "UnknownTenant"


@dataclass
class PlacementMap:
    _tenants: dict[str, tuple[int, str, int, bool]] = field(default_factory=dict)
    """tenant id -> (revision, cell, tenant epoch, moving)"""
    _key_digests: dict[str, str] = field(default_factory=dict)
    """tenant id -> hex SHA-256 of its API key, for the records that carry one"""
    _tenant_ids: dict[str, str] = field(default_factory=dict)
    """record key -> tenant id, to forget a tenant when its record is deleted"""
    _owners: dict[str, tuple[int, str, int] | None] = field(default_factory=dict)
    """cell -> (revision, region, group epoch), None once deleted"""
    _revisions: dict[str, int] = field(default_factory=dict)
    """etcd key -> the revision it was last applied at (deletions included)"""
    _sites: dict[tuple[str, str], tuple[int, str | None, bool]] = field(default_factory=dict)
    """(cell, region) -> (revision, api endpoint, serving)"""

    def apply(self, key: str, value: bytes | None, revision: int) -> bool:
        """One etcd key's state at ``revision`` (value None: deleted). True if it changed the map.

        Each key remembers the revision it was last seen at, deletions included, so
        an initial read that lost the race with a watch event never resurrects it.
        """
        if self._revisions.get(key, 0) >= revision:
            return False
        self._revisions[key] = revision
        parts = key.strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["cellplane", "tenants"]:
            return self._apply_tenant(key, value, revision)
        if len(parts) == 4 and parts[:2] == ["cellplane", "groups"] and parts[3] == "owner":
            return self._apply_owner(parts[2], value, revision)
        if len(parts) == 5 and parts[:2] == ["cellplane", "cells"] and parts[3] == "sites":
            return self._apply_site(parts[2], parts[4], value, revision)
        return False

    def _apply_tenant(self, key: str, value: bytes | None, revision: int) -> bool:
        known = self._tenant_ids.get(key)
        if value is None:
            if known is not None:
                del self._tenant_ids[key]
                self._tenants.pop(known, None)
                self._key_digests.pop(known, None)
            return known is not None
        body = json.loads(value)
        tenant_id = str(body["tenantId"])
        self._tenant_ids[key] = tenant_id
        if body.get("keyDigest"):
            self._key_digests[tenant_id] = str(body["keyDigest"])
        else:
            self._key_digests.pop(tenant_id, None)
        self._tenants[tenant_id] = (revision, str(body["cell"]), int(body["epoch"]),
                                    bool(body.get("moving", False)))
        return True

    def _apply_owner(self, cell: str, value: bytes | None, revision: int) -> bool:
        if value is None:
            self._owners[cell] = None
        else:
            body = json.loads(value)
            self._owners[cell] = (revision, str(body["region"]), int(body["epoch"]))
        return True

    def _apply_site(self, cell: str, region: str, value: bytes | None, revision: int) -> bool:
        if value is None:
            self._sites[(cell, region)] = (revision, None, False)
            return True
        body = json.loads(value)
        endpoints = body.get("endpoints") or {}
        self._sites[(cell, region)] = (revision, endpoints.get("api"), bool(body.get("serving")))
        return True

    def check_key(self, api_key: str) -> KeyCheck:
        """Whether ``api_key`` is a placed tenant's; constant time in the secret, and the
        same work whether the id is placed or not."""
        tenant_id = tenant_of_key(api_key)
        placed = tenant_id is not None and tenant_id in self._tenants
        stored = self._key_digests.get(tenant_id or "") if placed else None
        matches = hmac.compare_digest(key_digest(api_key).encode(),
                                      (stored or _NO_DIGEST).encode())
        if not placed:
            return KeyCheck.INVALID
        if stored is None:
            return KeyCheck.CELL_DECIDES
        return KeyCheck.VALID if matches else KeyCheck.INVALID

    def resolve(self, tenant_id: str) -> Route | NoRoute:
        placed = self._tenants.get(tenant_id)
        if placed is None:
            return NoRoute("UnknownTenant", f"no tenant {tenant_id} is placed in any cell")
        _, cell, tenant_epoch, moving = placed
        if moving:
            return NoRoute("Moving", f"tenant {tenant_id} is being moved to another cell; "
                           "held until the cutover ends")
        owner = self._owners.get(cell)
        if owner is None:
            return NoRoute("NoOwner", f"cell {cell} has no owner right now (a takeover is under way)")
        _, region, group_epoch = owner
        site = self._sites.get((cell, region))
        if site is None or site[1] is None or not site[2]:
            return NoRoute("SiteNotServing",
                           f"the site of cell {cell} in {region} does not serve yet")
        return Route(tenant_id, cell, tenant_epoch, group_epoch, region, site[1])
