"""The operator's side of a site agent's endpoint (``sites/agent_http.py``).

One method per operation. A refusal of the site (409) raises ``SiteError`` with
the agent's own message; anything else that is not a result (no answer, 401,
400, 500, an answer not in the wire format) raises ``AgentUnreachable``, whose
message names the URL. The wire format is ``sites/agent_wire.py``'s, shared
with the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from cellplane_operator.errors import AgentUnreachable, AgentWireError, SiteError
from cellplane_operator.sites import agent_wire as wire
from cellplane_operator.sites.agent_wire import AgentEndpoint, AgentStatus

__all__ = ["SiteAgentClient", "AgentEndpoint", "AgentStatus", "AgentUnreachable"]

T = TypeVar("T")

HEALTH_TIMEOUT = 5.0
"""``healthy`` answers quickly either way: it is polled while a Pod starts."""


class SiteAgentClient:
    def __init__(self, base_url: str, token: str, *, http: httpx.AsyncClient | None = None,
                 timeout: float = 600.0) -> None:
        """``base_url``: ``http://<agent service>:9443``. ``http``: a shared client (then the
        caller closes it); ``timeout``: of every operation but ``healthy`` (a base backup
        of a large database takes a while)."""
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._owned = http is None
        self._http = http if http is not None else httpx.AsyncClient()
        self._timeout = timeout

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def healthy(self) -> bool:
        """The agent answers its liveness route (it says nothing of the database)."""
        try:
            response = await self._http.get(f"{self._base}{wire.HEALTHZ}",
                                            timeout=HEALTH_TIMEOUT)
            return response.status_code == 200 and response.json() == {"ok": True}
        except (httpx.HTTPError, ValueError):
            return False

    async def status(self, *, restart: bool) -> AgentStatus:
        """The agent's record and its Postgres's health; ``restart`` lets it restart a
        Postgres its record says should run, otherwise it touches nothing."""
        answer = await self._call("GET", wire.DATABASE,
                                  params={"restart": "1" if restart else "0"})
        return self._parse(wire.DATABASE, AgentStatus.from_wire, answer)

    async def ensure_primary(self, epoch: int | None) -> AgentEndpoint:
        answer = await self._call("POST", wire.PRIMARY, body=wire.epoch_request(epoch))
        return self._parse(wire.PRIMARY, AgentEndpoint.from_wire, answer)

    async def ensure_standby(self, primary_host: str, primary_port: int) -> AgentEndpoint:
        answer = await self._call("POST", wire.STANDBY,
                                  body=wire.source_request(primary_host, primary_port))
        return self._parse(wire.STANDBY, AgentEndpoint.from_wire, answer)

    async def promote(self) -> AgentEndpoint:
        answer = await self._call("POST", wire.PROMOTE)
        return self._parse(wire.PROMOTE, AgentEndpoint.from_wire, answer)

    async def demote(self) -> str:
        """The primary stopped cleanly; the location of its shutdown checkpoint."""
        answer = await self._call("POST", wire.DEMOTE)
        return self._parse(wire.DEMOTE, wire.parse_lsn_answer, answer)

    async def fence(self) -> None:
        await self._call("POST", wire.FENCE)

    async def open_reading(self) -> AgentEndpoint:
        """The fenced or demoted server, read-only, over TCP for the superuser only."""
        answer = await self._call("POST", wire.READING)
        return self._parse(wire.READING, AgentEndpoint.from_wire, answer)

    async def close_reading(self) -> None:
        await self._call("DELETE", wire.READING)

    async def rebuild(self, primary_host: str, primary_port: int) -> AgentEndpoint:
        answer = await self._call("POST", wire.REBUILD,
                                  body=wire.source_request(primary_host, primary_port))
        return self._parse(wire.REBUILD, AgentEndpoint.from_wire, answer)

    async def destroy(self) -> None:
        await self._call("DELETE", wire.DATABASE)

    # -- the wire ---------------------------------------------------------------------------

    async def _call(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                    params: dict[str, str] | None = None) -> object:
        url = f"{self._base}{path}"
        try:
            response = await self._http.request(method, url, json=body, params=params,
                                                headers=self._headers, timeout=self._timeout)
        except httpx.HTTPError as error:
            raise AgentUnreachable(f"the site agent at {url} did not answer: "
                                   f"{type(error).__name__}: {error}") from error
        try:
            answer: object = response.json()
        except ValueError:
            answer = None
        if response.status_code == 200 and answer is not None:
            return answer
        said = wire.error_message(answer) or response.text[:200]
        if response.status_code == 409:
            raise SiteError(said)
        raise AgentUnreachable(f"the site agent at {url} answered {response.status_code}: {said}",
                               status=response.status_code)

    def _parse(self, path: str, parse: Callable[[object], T], answer: object) -> T:
        try:
            return parse(answer)
        except AgentWireError as error:
            raise AgentUnreachable(f"the site agent at {self._base}{path} answered outside its "
                                   f"wire format: {error}") from error
