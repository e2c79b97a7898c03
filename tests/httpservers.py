"""Real HTTP servers on 127.0.0.1 for tests: targets and webhook receivers.

uvicorn serves a small Starlette app in a background thread; every request is
recorded, and a test decides each answer with a ``respond`` function.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import wait_for


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Responder = Callable[[Call], Awaitable[Response]]


async def ok(call: Call) -> Response:
    return JSONResponse({"ok": True, "step": call.json.get("step")})


@dataclass
class RecordingServer:
    respond: Responder = ok
    calls: list[Call] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

        async def handle(request: Request) -> Response:
            call = Call(request.url.path, {k.lower(): v for k, v in request.headers.items()},
                        await request.body())
            with self._lock:
                self.calls.append(call)
            return await self.respond(call)

        app = Starlette(routes=[Route("/{path:path}", handle, methods=["POST", "GET"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=self.port,
                                                     log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> RecordingServer:
        self._thread.start()
        wait_for(lambda: self._server.started, timeout=10, what="the test HTTP server")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def __enter__(self) -> RecordingServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def hang_until(event: threading.Event) -> Responder:
    """A responder that holds the request until ``event`` is set (or forever)."""
    async def respond(call: Call) -> Response:
        while not event.is_set():
            await asyncio.sleep(0.05)
        return JSONResponse({"ok": True})
    return respond
