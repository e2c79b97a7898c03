"""The HTTP client the cell calls tenants with: every connection goes to an address the URL
policy (``domain/targets.py``) allowed, and to no other.

Checking a URL when it is registered is not enough: rows also arrive by import
and by a move from a cell with another policy, a cell's policy can be
tightened, and a name can resolve elsewhere between any check and the call
(DNS rebinding). So the check sits where the socket is opened: the network
backend under httpx resolves the host once, judges every address, and connects
to one of those same addresses. TLS still verifies the certificate against the
URL's host and sends it as SNI, and the Host header is the URL's, because httpx
hands the backend the host only for the TCP connection.

The client never uses a proxy from the environment (the proxy would resolve
and connect on our behalf, past the check) and never follows redirects (a
redirect is an answer like any other; its Location is not a registered URL).
"""

from __future__ import annotations

import asyncio
import socket
import typing
from collections.abc import Awaitable, Callable

import httpcore
import httpx

from cellplane_cells.domain.targets import IPAddress, UrlRefused, check_host_addresses, ip_literal

__all__ = ["EgressRefused", "GuardedBackend", "GuardedTransport", "guarded_client",
           "resolve_with_getaddrinfo", "Resolver"]

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""A host and port to the addresses to connect to (the system resolver in production)."""


class EgressRefused(httpx.ConnectError):
    """The policy refused every address of the URL's host; nothing was sent.

    A ``ConnectError``, so a caller that only knows httpx treats it as a failed
    connection; the worker and the relay tell it apart: it is permanent."""


async def resolve_with_getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # Order kept (the resolver's preference), duplicates dropped.
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the policy between the name and the socket."""

    def __init__(self, *, allow_private: bool, resolve: Resolver = resolve_with_getaddrinfo,
                 inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._allow_private = allow_private
        self._resolve = resolve
        self._inner = inner or httpcore.AnyIOBackend()

    async def allowed_addresses(self, host: str, port: int) -> list[IPAddress]:
        """The addresses of ``host`` a connection may use: resolved once, each judged."""
        try:
            literal = ip_literal(host)
            if literal is not None:
                return check_host_addresses(host, [str(literal)],
                                            allow_private=self._allow_private)
            try:
                found = await self._resolve(host, port)
            except OSError as error:
                raise UrlRefused(f"host {host} does not resolve: {error}") from None
            return check_host_addresses(host, found, allow_private=self._allow_private)
        except UrlRefused as refused:
            raise EgressRefused(f"refused by the cell's URL policy: {refused}") from None

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        addresses = await self.allowed_addresses(host, port)
        failure: Exception | None = None
        for address in addresses:
            try:
                # The address judged above, not the name: nothing is resolved again.
                return await self._inner.connect_tcp(str(address), port, timeout=timeout,
                                                      local_address=local_address,
                                                      socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                failure = error
        assert failure is not None  # allowed_addresses never returns an empty list
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None
                                  = None) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("refused by the cell's URL policy: unix sockets are never called")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport whose connection pool opens sockets through ``GuardedBackend``.

    httpx offers no parameter for httpcore's network backend, so the pool it
    built is replaced by the same pool (same TLS context and limits) over ours;
    ``tests/unit/test_egress.py`` keeps this honest across httpx versions."""

    def __init__(self, *, allow_private: bool, resolve: Resolver = resolve_with_getaddrinfo,
                 inner: httpcore.AsyncNetworkBackend | None = None,
                 limits: httpx.Limits = httpx.Limits(max_connections=200,
                                                     max_keepalive_connections=40)) -> None:
        super().__init__(trust_env=False, limits=limits)
        self.backend = GuardedBackend(allow_private=allow_private, resolve=resolve, inner=inner)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=self.backend)


def guarded_client(*, allow_private: bool, resolve: Resolver = resolve_with_getaddrinfo,
                   inner: httpcore.AsyncNetworkBackend | None = None) -> httpx.AsyncClient:
    """The client the cell's workers and relay call targets and webhooks with."""
    return httpx.AsyncClient(
        transport=GuardedTransport(allow_private=allow_private, resolve=resolve, inner=inner),
        trust_env=False, follow_redirects=False)
