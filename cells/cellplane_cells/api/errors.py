"""One error shape for both APIs: ``{"error": {"code": ..., "message": ...}}``.

Every ``CellError`` maps to its own status; a request the schema rejects is a
422 with the offending fields; a body over the size limit is a 413; a value
the database refuses as data (``DataError``) is a 422 and one that conflicts
with a stored row (a unique index) a 409, named by ``_CONSTRAINT_CONFLICTS``
where a client can cause it; anything unforeseen is logged and answered as a
500 with code ``internal``, never as a stack trace.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import psycopg
from psycopg_pool import PoolTimeout

from cellplane_cells.errors import CellError, RetryLaterError

__all__ = ["install_error_handlers", "error_body", "BodySizeLimit"]

log = logging.getLogger(__name__)


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CellError)
    async def cell_error(_: Request, error: CellError) -> JSONResponse:
        headers = {}
        if isinstance(error, RetryLaterError):
            headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_seconds)))
        return JSONResponse(error_body(error.code, error.message, **error.details),
                            status_code=error.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        fields = [{"field": ".".join(str(p) for p in e.get("loc", ())), "problem": _problem(e)}
                  for e in error.errors()]
        return JSONResponse(error_body("invalid_request", "the request does not match the schema",
                                       fields=fields), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_request", 401: "unauthenticated", 404: "not_found",
                405: "method_not_allowed", 413: "body_too_large"}.get(error.status_code,
                                                                      "http_error")
        return JSONResponse(error_body(code, str(error.detail)), status_code=error.status_code)

    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.OperationalError)
    async def database_unavailable(request: Request, error: Exception) -> JSONResponse:
        # No connection in time (pool exhausted, database restarting or gone):
        # the request did nothing, and the client may retry it.
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, error)
        return JSONResponse(error_body("database_unavailable", "the cell's database is busy or "
                                       "unreachable; retry shortly"),
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(psycopg.IntegrityError)
    @app.exception_handler(psycopg.DataError)
    async def refused_as_data(request: Request, error: psycopg.Error) -> JSONResponse:
        # The request's values reached a statement that refused them: the request is
        # at fault (the edge's checks let something through), and it changed nothing.
        log.warning("the database refused %s %s: %s", request.method, request.url.path,
                    error.diag.message_primary)
        known = _CONSTRAINT_CONFLICTS.get(error.diag.constraint_name or "")
        if known is not None:
            return JSONResponse(error_body(*known), status_code=409)
        if isinstance(error, psycopg.errors.UniqueViolation):
            return JSONResponse(error_body("conflict", "the request conflicts with data the "
                                           "cell holds"), status_code=409)
        return JSONResponse(error_body("invalid_request", "the database refused a value of "
                                       "the request"), status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal", "internal error; it has been logged"),
                            status_code=500)


_CONSTRAINT_CONFLICTS = {
    "tenants_api_key": ("api_key_in_use", "the API key is already another tenant's"),
}
"""Unique indexes a client's request can run into: (code, message) of the 409."""


def _problem(error: Any) -> str:
    """The validation error's message, with the parser's reason for a body that is no
    (storable) JSON."""
    message = str(error.get("msg", ""))
    reason = (error.get("ctx") or {}).get("error")
    return f"{message}: {reason}" if error.get("type") == "json_invalid" and reason else message


class BodySizeLimit:
    """Refuses bodies over ``limit`` bytes with 413, before the app reads them whole.

    ``larger`` raises the limit for the requests whose path ends with one of
    its keys (a tenant move's batches of rows)."""

    def __init__(self, app: ASGIApp, *, limit: int, larger: dict[str, int] | None = None) -> None:
        self._app = app
        self._default = limit
        self._larger = dict(larger or {})

    def _limit_for(self, path: str) -> int:
        for suffix, limit in self._larger.items():
            if path.endswith(suffix):
                return limit
        return self._default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._limit_for(str(scope.get("path", "")))
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge()
            return message

        try:
            await self._app(scope, limited_receive, send)
        except _TooLarge:
            await _too_large(send, limit)


class _TooLarge(Exception):
    pass


async def _too_large(send: Send, limit: int) -> None:
    response = JSONResponse(error_body("body_too_large", f"request bodies are limited to {limit} bytes"),
                            status_code=413)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()]})
    await send({"type": "http.response.body", "body": response.body})
