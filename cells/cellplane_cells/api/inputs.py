"""Every request either cell API accepts passes the same gates (domain/client_input.py).

- ``StorableJsonRoute``: the one JSON parser of every body, refusing what the
  database cannot store (``NaN``, ``1e400``, NUL, lone surrogates), so such a
  body is a 422 at the edge, not a 500 deep in a statement;
- ``RequestBody``: the base of every body model, strict (``"steps": true`` is
  not 1, ``"10"`` is not 10) and closed (unknown fields are refused);
- ``ControlCharacterGuard``: a path or query value with a control character
  is a 400 before routing, so no handler sees one.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal
from urllib.parse import unquote

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Receive, Scope, Send

from cellplane_cells.api.errors import BodySizeLimit, error_body
from cellplane_cells.domain.client_input import has_control_character, loads_storable

__all__ = ["StorableJsonRoute", "RequestBody", "PriorityClass", "ControlCharacterGuard",
           "install_request_gates"]

PriorityClass = Literal["CRITICAL", "HIGH", "DEFAULT", "LOW"]
"""``domain.priorities.Priority`` as a body spells it (a Literal: a strict body takes no enum)."""


class _StorableJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_storable(await self.body())
        return self._json


class StorableJsonRoute(APIRoute):
    """FastAPI reads a body through ``Request.json``; this route's requests parse with
    ``loads_storable``, whose ``JSONDecodeError`` FastAPI answers as a validation error."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_storable(request: Request) -> Response:
            return await handler(_StorableJsonRequest(request.scope, request.receive))

        return parse_storable


class RequestBody(BaseModel):
    """A request body: no field coerced from another JSON type, no field unknown.

    A field whose Python type JSON cannot carry (an enum) says ``strict=False``:
    strict validation of parsed JSON would want the Python object itself."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ControlCharacterGuard:
    """Answers 400 to a request whose path or query values hold a control character."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _control_character_in(scope):
            response = JSONResponse(error_body(
                "invalid_request", "the path or query holds a control character"), status_code=400)
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)


def _control_character_in(scope: Scope) -> bool:
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    return has_control_character(str(scope.get("path", ""))) or has_control_character(unquote(query))


def install_request_gates(app: FastAPI, *, body_limit: int,
                          larger: dict[str, int] | None = None) -> None:
    """Puts every gate in front of ``app``'s routes; call before adding any route."""
    app.router.route_class = StorableJsonRoute
    app.add_middleware(BodySizeLimit, limit=body_limit, larger=larger)
    # Added last, so it runs first: a path with a control character is refused
    # before anything else looks at it.
    app.add_middleware(ControlCharacterGuard)
