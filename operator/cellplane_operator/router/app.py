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

Before it reads a byte of the body the router refuses what the cell would
never serve: a path or query with a control character (400), a path that is
not one of the tenant API's routes once percent-decoded (404; a cell's own
OpenAPI and docs are not forwarded), a declared body over the cell's limit
(413), and a key that is no placed tenant's (401, the very answer the cell
gives for a wrong secret, so neither tells which tenant ids exist; the whole
key is checked here when the tenant's placement record carries its digest,
see domain/routing.py). The body is then read up to the limit and no
further, chunked or not (413 past it).

The router's Prometheus metrics (``cellplane_router_*``, docs/metrics.md) are
served by ``cellplane router --metrics-port`` on a listener of their own, not
here: this port faces tenants, and the per-tenant counters name tenants.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from cellplane_cells.domain.client_input import (
    INVALID_KEY_MESSAGE, TENANT_BODY_LIMIT_BYTES, RouteMatch, bearer_token, has_control_character,
    match_tenant_route,
)
from cellplane_operator.domain.routing import KeyCheck, NoRoute, Route, tenant_of_key
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
                "content-encoding", "te", "trailer", "upgrade", "proxy-connection",
                "proxy-authorization", "proxy-authenticate"}
# The server adds its own: a forwarded answer carries one of each, as the router's own do,
# so a cell's 401 and the router's cannot be told apart by their headers.
_UPSTREAM_ONLY_HEADERS = _HOP_HEADERS | {"server", "date"}
_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


@dataclass(frozen=True)
class RouterSettings:
    hold_seconds: float = 15.0
    """How long a request waits for a cell without an owner, or for a moving tenant's
    cutover, before it is answered 503."""
    retry_after_seconds: int = 2
    """What a 503 asks the client to wait."""
    upstream_timeout_seconds: float = 30.0
    max_body_bytes: int = TENANT_BODY_LIMIT_BYTES
    """The largest body forwarded: the cell's own limit. A larger one is refused
    before it is read, and a chunked one as soon as it passes the limit."""


class _TooLarge(Exception):
    pass


def _error(status: int, code: str, message: str, *, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def create_router_app(watcher: PlacementWatcher, http: httpx.AsyncClient,
                      settings: RouterSettings = RouterSettings()) -> FastAPI:
    app = FastAPI(title="cellplane edge router", openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return answered(_error(error.status_code, code, str(error.detail)), "refused")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answered(_error(500, "internal", "internal error; it has been logged"), "internal")

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

    def refusal(request: Request) -> Response | None:
        """The answer to a request the cell would never serve, decided before the body."""
        # The scope's path is percent-decoded already; request.url would parse it again
        # (a decoded %3F would start a query).
        match = match_tenant_route(request.method, str(request.scope["path"]))
        if match is RouteMatch.NO_ROUTE:
            return answered(_error(404, "not_found", "Not Found"), "refused")
        if match is RouteMatch.WRONG_METHOD:
            return answered(_error(405, "method_not_allowed", "Method Not Allowed"), "refused")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > settings.max_body_bytes:
            return answered(_too_large(settings.max_body_bytes), "body_too_large")
        return None

    async def read_body(request: Request) -> bytes:
        """The body, read only up to the limit whatever the framing; ``_TooLarge`` past it."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_body_bytes:
                raise _TooLarge()
        return bytes(body)

    @app.api_route("/{path:path}", methods=_METHODS)
    async def forward(path: str, request: Request) -> Response:
        refused = refusal(request)
        if refused is not None:
            return refused
        key = bearer_token(request.headers.get("authorization"))
        if key is None:
            return answered(_error(401, "unauthenticated",
                                   "an API key is required: Authorization: Bearer <key>"),
                            "unauthenticated")
        tenant_id = tenant_of_key(key)
        if tenant_id is None or watcher.map.check_key(key) is KeyCheck.INVALID:
            # The cell's answer to a wrong secret, word for word: an unknown id and a
            # wrong secret read the same.
            return answered(_error(401, "unauthenticated", INVALID_KEY_MESSAGE), "unknown_tenant")
        try:
            body = await read_body(request)
        except _TooLarge:
            return answered(_too_large(settings.max_body_bytes), "body_too_large")
        headers = [(k, v) for k, v in request.headers.raw
                   if k.decode("latin-1").lower() not in _HOP_HEADERS]
        upstream_path = quote(str(request.scope["path"]), safe="/:")
        params = tuple(request.query_params.multi_items())
        deadline = time.monotonic() + settings.hold_seconds
        for attempt in (1, 2):
            found = await route_for(tenant_id, deadline)
            if isinstance(found, NoRoute):
                if not found.transient:
                    # Removed from the map while the body was read or the request held.
                    return answered(_error(401, "unauthenticated", INVALID_KEY_MESSAGE),
                                    "unknown_tenant")
                return answered(_error(503, "cell_unavailable", found.message,
                                       retry_after=settings.retry_after_seconds), "hold_timeout")
            try:
                upstream = await http.request(
                    request.method, f"{found.api}{upstream_path}", params=params,
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
                                              if k.lower() not in _UPSTREAM_ONLY_HEADERS},
                                     media_type=upstream.headers.get("content-type")),
                            "forwarded")
        raise AssertionError("unreachable")

    app.add_middleware(_ControlCharacterGuard)
    return app


class _ControlCharacterGuard:
    """400 for a path or query with a control character, before routing: the catch-all
    route's pattern does not match a path with a newline (a 404 that hides why)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            query = unquote(bytes(scope.get("query_string", b"")).decode("latin-1"))
            if has_control_character(str(scope["path"])) or has_control_character(query):
                response = _error(400, "invalid_request",
                                  "the path or query holds a control character")
                router_answered(response.status_code, "refused")
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


def _too_large(limit: int) -> Response:
    return _error(413, "body_too_large", f"request bodies are limited to {limit} bytes")


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code is not None else None
