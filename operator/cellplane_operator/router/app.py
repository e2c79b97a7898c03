"""The router's HTTP surface: every tenant route of the cell API, forwarded.

A request is routed by the tenant id its API key names. While the tenant's
cell has no owner or its active site does not serve yet (a takeover or a
start in progress), or the tenant's placement record says it is moving (a
move's cutover), the request is held until the map changes, up to
``hold_seconds``, then answered 503 with ``Retry-After``: never dropped
silently. A site that answers that it no longer owns the cell (``not_owner``,
``stale_epoch``, ``lease_expired``, ``database_unavailable``) or no longer
serves the tenant (``tenant_moving``: frozen for a cutover; ``tenant_moved``:
moved out) is asked again once, after the map routes the tenant elsewhere (or
holds it), within the same ``hold_seconds``. The source cell may refuse a
frozen tenant before the router has seen the record's ``moving`` flag: the
wait covers that gap. A cell fenced on purpose (``cell_fenced``) keeps its
owner, so no route change will come: its 503 is passed on at once.

The router's Prometheus metrics (``cellplane_router_*``, docs/metrics.md) are
served by ``cellplane router --metrics-port`` on a listener of their own, not
here: this port faces tenants, and the per-tenant counters name tenants.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cellplane_operator.domain.routing import NoRoute, Route, tenant_of_key
from cellplane_operator.metrics import (
    router_answered, router_hold_ended, router_hold_started, router_refused_for_tenant,
    router_retried,
)
from cellplane_operator.router.watcher import PlacementWatcher

__all__ = ["RouterSettings", "create_router_app"]

log = logging.getLogger("cellplane.router")

# database_unavailable too: a switchover shuts the old primary's database down.
_NOT_OWNER_CODES = {"not_owner", "stale_epoch", "lease_expired", "database_unavailable"}
# A move's source cell refuses a tenant it froze for the cutover, or moved out.
_NOT_SERVING_TENANT_CODES = {"tenant_moving", "tenant_moved"}
_ASK_AGAIN_CODES = _NOT_OWNER_CODES | _NOT_SERVING_TENANT_CODES
# Hop-by-hop headers, and the ones httpx has already acted on (it decoded the body).
_HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                "content-encoding"}


@dataclass(frozen=True)
class RouterSettings:
    hold_seconds: float = 15.0
    """How long a request waits for a cell without an owner, or for a moving tenant's
    cutover, before it is answered 503."""
    retry_after_seconds: int = 2
    """What a 503 asks the client to wait."""
    upstream_timeout_seconds: float = 30.0


def _error(status: int, code: str, message: str, *, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def create_router_app(watcher: PlacementWatcher, http: httpx.AsyncClient,
                      settings: RouterSettings = RouterSettings()) -> FastAPI:
    app = FastAPI(title="cellplane edge router", openapi_url=None, docs_url=None, redoc_url=None)

    async def route_for(tenant_id: str, deadline: float) -> Route | NoRoute:
        held_since: float | None = None
        routed: bool | None = None
        try:
            while True:
                version = watcher.version
                found = watcher.map.resolve(tenant_id)
                remaining = deadline - time.monotonic()
                if isinstance(found, Route) or not found.transient or remaining <= 0:
                    routed = isinstance(found, Route)
                    return found
                if held_since is None:
                    log.info("holding a request of tenant %s up to %.1fs: %s", tenant_id,
                             remaining, found.message)
                    held_since = time.monotonic()
                    router_hold_started(found.reason)
                await watcher.changed(version, remaining)
        finally:
            if held_since is not None:
                router_hold_ended(time.monotonic() - held_since, routed=routed)

    async def route_changed(tenant_id: str, used: Route, deadline: float) -> None:
        """Waits until the map no longer routes the tenant as ``used``, or the deadline.

        Only this tenant's route counts: other keys change all the time (site
        reports), and asking the same site again would get the same refusal.
        """
        while (remaining := deadline - time.monotonic()) > 0:
            version = watcher.version
            if watcher.map.resolve(tenant_id) != used:
                return
            await watcher.changed(version, remaining)

    def answered(response: Response, outcome: str) -> Response:
        router_answered(response.status_code, outcome)
        return response

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def forward(path: str, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        tenant_id = tenant_of_key(authorization[7:].strip()) if authorization.startswith(
            "Bearer ") else None
        if tenant_id is None:
            return answered(_error(401, "unauthenticated",
                                   "an API key is required: Authorization: Bearer <tenant key>"),
                            "unauthenticated")
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        deadline = time.monotonic() + settings.hold_seconds
        for attempt in (1, 2):
            found = await route_for(tenant_id, deadline)
            if isinstance(found, NoRoute):
                if not found.transient:
                    return answered(_error(401, "unauthenticated",
                                           "no tenant of this key is placed in any cell"),
                                    "unknown_tenant")
                return answered(_error(503, "cell_unavailable", found.message,
                                       retry_after=settings.retry_after_seconds), "hold_timeout")
            try:
                upstream = await http.request(
                    request.method, f"{found.api}/v1/{path}", params=request.query_params,
                    content=body, headers=headers, timeout=settings.upstream_timeout_seconds)
            except httpx.TransportError:
                # The site died between the map's last word and this request.
                upstream = None
            moved = upstream is None or (upstream.status_code == 503
                                         and _code(upstream) in _ASK_AGAIN_CODES)
            if moved and attempt == 1:
                router_retried(None if upstream is None else _code(upstream))
                await route_changed(tenant_id, found, deadline)
                continue
            if upstream is None:
                return answered(_error(503, "cell_unavailable", f"cell {found.cell} did not answer",
                                       retry_after=settings.retry_after_seconds),
                                "cell_unreachable")
            router_refused_for_tenant(tenant_id, upstream.status_code)
            return answered(Response(upstream.content, status_code=upstream.status_code,
                                     headers={k: v for k, v in upstream.headers.items()
                                              if k.lower() not in _HOP_HEADERS},
                                     media_type=upstream.headers.get("content-type")),
                            "forwarded")
        raise AssertionError("unreachable")

    return app


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code is not None else None
