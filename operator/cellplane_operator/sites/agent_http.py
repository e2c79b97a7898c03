"""The site agent's HTTP endpoint: the operator's only way to the site's database.

``GET /healthz`` is open and says only that the agent answers (the liveness
probe). Everything else wants ``Authorization: Bearer <token>``, the token being
the content of a file the kubelet renews in place (re-read when it changes).
Errors map at this edge, never past it: 401 no or wrong token, 400 a request not
in the wire format (``agent_wire.py``), 409 a ``SiteError`` (an operation the
site refuses), 500 anything else, logged. All answers are JSON.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cellplane_operator.errors import AgentWireError, SiteError
from cellplane_operator.sites import agent_wire as wire
from cellplane_operator.sites.agent import SiteAgent

__all__ = ["TokenFile", "create_agent_app"]

log = logging.getLogger(__name__)

BEARER = "bearer "


class TokenFile:
    """The bearer token in a file, read again whenever the file changes (a Secret volume
    swaps a symlink: inode, size or mtime differ)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = b""

    def _current(self) -> bytes:
        try:
            stat = os.stat(self._path)
            signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if signature != self._seen:
                self._token = self._path.read_bytes().strip()
                self._seen = signature
        except OSError as error:
            log.warning("the agent token %s cannot be read: %s", self._path, error)
            self._seen, self._token = None, b""
        return self._token

    def admits(self, authorization: str | None) -> bool:
        """The header carries the token (compared in constant time); an empty or unreadable
        token file admits nobody."""
        if authorization is None or not authorization.lower().startswith(BEARER):
            return False
        token = self._current()
        offered = authorization[len(BEARER):].strip().encode()
        return bool(token) and hmac.compare_digest(offered, token)


Work = Callable[[bytes], Awaitable[dict[str, Any]]]


def create_agent_app(agent: SiteAgent, token: TokenFile) -> FastAPI:
    app = FastAPI(title="cellplane site agent", openapi_url=None, docs_url=None, redoc_url=None)

    async def answer(request: Request, work: Work) -> JSONResponse:
        if not token.admits(request.headers.get("authorization")):
            return _error(401, "a bearer token is required, and this one is not the agent's")
        try:
            return JSONResponse(await work(await request.body()))
        except AgentWireError as error:
            return _error(400, str(error))
        except SiteError as error:
            return _error(409, str(error))
        except Exception as error:  # the edge: every fault becomes an answer, and a log line
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(500, f"{type(error).__name__}: {error}")

    @app.get(wire.HEALTHZ)
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get(wire.DATABASE)
    async def status(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            restart = wire.parse_restart(request.query_params.get("restart"))
            return (await agent.status(restart=restart)).to_wire()
        return await answer(request, work)

    @app.post(wire.PRIMARY)
    async def primary(request: Request) -> JSONResponse:
        async def work(body: bytes) -> dict[str, Any]:
            return (await agent.ensure_primary(wire.parse_epoch_request(body))).to_wire()
        return await answer(request, work)

    @app.post(wire.STANDBY)
    async def standby(request: Request) -> JSONResponse:
        async def work(body: bytes) -> dict[str, Any]:
            return (await agent.ensure_standby(*wire.parse_source_request(body))).to_wire()
        return await answer(request, work)

    @app.post(wire.PROMOTE)
    async def promote(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            return (await agent.promote()).to_wire()
        return await answer(request, work)

    @app.post(wire.DEMOTE)
    async def demote(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            return {"lsn": await agent.demote()}
        return await answer(request, work)

    @app.post(wire.FENCE)
    async def fence(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            await agent.fence()
            return {}
        return await answer(request, work)

    @app.post(wire.READING)
    async def open_reading(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            return (await agent.open_reading()).to_wire()
        return await answer(request, work)

    @app.delete(wire.READING)
    async def close_reading(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            await agent.close_reading()
            return {}
        return await answer(request, work)

    @app.post(wire.REBUILD)
    async def rebuild(request: Request) -> JSONResponse:
        async def work(body: bytes) -> dict[str, Any]:
            return (await agent.rebuild(*wire.parse_source_request(body))).to_wire()
        return await answer(request, work)

    @app.delete(wire.DATABASE)
    async def destroy(request: Request) -> JSONResponse:
        async def work(_body: bytes) -> dict[str, Any]:
            await agent.destroy()
            return {}
        return await answer(request, work)

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
