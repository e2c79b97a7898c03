"""``KeyValueStore`` on a real etcd cluster, through aetcd.

aetcd talks to one endpoint per client, so this adapter keeps one client per
member and moves on to the next member when the current one is unreachable.
Every operation has one time budget for all members together: when quorum is
lost a member accepts the request and never commits it, and the caller must
hear so within a bounded time, as ``StoreUnavailableError``, not as a raw gRPC
error or a hang.

A request a follower forwarded to a leader that then died is simply dropped,
and etcd answers it only after its own request timeout (5 s plus two election
timeouts). Operations that are safe to repeat (reads, plain puts, deletes) are
therefore tried for at most ``attempt_timeout`` on one member before the next
member is asked. A compare-and-swap is never repeated after an unanswered
attempt: the first may have committed, and a repeat would then report a
failure for a write that won. Its caller hears "outcome unknown" instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

# The operator forks programs (initdb, postgres, the cell's processes) while its
# gRPC channels to etcd are busy. grpcio's fork handlers then start a poller
# thread in the child between fork and exec, and that child crashes (SIGSEGV in
# cygrpc's event_engine: 3 of 12 initdb runs in one test module, seen in dmesg;
# grpc/grpc#43055). The child never uses gRPC: it execs at once. So gRPC's fork
# support is turned off, before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import aetcd  # noqa: E402  (after the fork setting above)

from cellplane_operator.errors import StoreError, StoreUnavailableError
from cellplane_operator.store.base import Compare, Delete, Put, VersionedValue, WatchEvent

__all__ = ["EtcdStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# A pause before cycling through the members again, so a cluster with every
# member down is not hammered in a tight loop until the deadline.
_ROUND_PAUSE_SECONDS = 0.1

# A member cut off by a partition (or frozen) keeps its TCP connections open and
# answers nothing, so a watch on it would wait forever for events that now land on
# the other members. Watches therefore run on channels of their own with gRPC
# keepalive: pings while the watch is open end such a stream within about 11 s, and
# the watch moves to the next member from the revision it reached. Only watches: a
# ping a slow but live member answers late would close the whole channel, and on the
# channel of requests and lease keep-alives that costs a renewal (a self-fence on a
# busy machine), where a watch just resumes elsewhere. etcd refuses pings closer than
# 5 s (--grpc-keepalive-min-time), hence 6 s; gRPC's default of two pings without
# data would stop them on a quiet watch, hence no limit; grpcio 1.85 waits for a
# ping's answer for ping_timeout (1 min by default), so that is set too.
_WATCH_CHANNEL_OPTIONS = {
    "grpc.keepalive_time_ms": 6_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.ping_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
}


class EtcdStore:
    def __init__(
        self, endpoints: Sequence[str], *, timeout: float = 5.0, attempt_timeout: float = 1.5
    ) -> None:
        """``timeout`` bounds one operation over every member; ``attempt_timeout``
        bounds one try of a repeatable operation on one member."""
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint (host:port)")
        if timeout <= 0 or attempt_timeout <= 0:
            raise ValueError("timeout and attempt_timeout must be positive")
        self._endpoints = list(endpoints)
        self._timeout = timeout
        self._attempt_timeout = min(attempt_timeout, timeout)
        self._clients: dict[str, aetcd.Client] = {}
        self._watch_clients: dict[str, aetcd.Client] = {}
        self._current = 0

    @property
    def current_endpoint(self) -> str:
        return self._endpoints[self._current]

    def _client(self, endpoint: str) -> aetcd.Client:
        return self._cached_client(self._clients, endpoint, {})

    def _watch_client(self, endpoint: str) -> aetcd.Client:
        return self._cached_client(self._watch_clients, endpoint, _WATCH_CHANNEL_OPTIONS)

    def _cached_client(self, clients: dict[str, aetcd.Client], endpoint: str,
                       options: dict[str, int]) -> aetcd.Client:
        client = clients.get(endpoint)
        if client is None:
            host, _, port = endpoint.rpartition(":")
            client = aetcd.Client(host=host, port=int(port), timeout=self._timeout,
                                  options=dict(options))
            clients[endpoint] = client
        return client

    def _next_member(self) -> None:
        self._current = (self._current + 1) % len(self._endpoints)

    async def _call(
        self, what: str, operation: Callable[[aetcd.Client], Awaitable[T]], *, repeatable: bool = True
    ) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        failures: list[str] = []
        tried_this_round = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            endpoint = self.current_endpoint
            budget = min(remaining, self._attempt_timeout) if repeatable else remaining
            try:
                return await asyncio.wait_for(operation(self._client(endpoint)), budget)
            except aetcd.ConnectionFailedError as error:
                # An unreachable member never saw the request; one that timed
                # out inside etcd may still commit it later.
                failures.append(f"{endpoint}: {_describe(error)}")
                log.debug("etcd %s failed on %s, moving on: %s", what, endpoint, error)
                if not repeatable and not _never_reached(error):
                    break
            except (aetcd.ConnectionTimeoutError, asyncio.TimeoutError):
                failures.append(f"{endpoint}: no answer in {budget:.1f}s")
                if not repeatable:
                    break
            except aetcd.ClientError as error:
                raise StoreError(f"etcd refused {what}: {_describe(error)}") from error
            self._next_member()
            tried_this_round += 1
            if tried_this_round >= len(self._endpoints):
                tried_this_round = 0
                await asyncio.sleep(min(_ROUND_PAUSE_SECONDS, max(deadline - loop.time(), 0)))
        recent = "; ".join(failures[-len(self._endpoints):]) or "no member answered"
        raise StoreUnavailableError(
            f"etcd did not confirm {what} within {self._timeout:g}s on any of "
            f"{len(self._endpoints)} member(s) {self._endpoints}: quorum may be lost "
            f"({recent}); a write's outcome is unknown"
        )

    async def get(self, key: str) -> VersionedValue | None:
        result = await self._call(f"get {key}", lambda c: c.get(key.encode()))
        if result is None:
            return None
        return VersionedValue(bytes(result.value), int(result.mod_revision), int(result.version))

    async def get_prefix(self, prefix: str) -> dict[str, VersionedValue]:
        """Every key under ``prefix`` with its value, read linearizably at one revision."""
        result = await self._call(f"get prefix {prefix}", lambda c: c.get_prefix(prefix.encode()))
        return {bytes(kv.key).decode(): VersionedValue(bytes(kv.value), int(kv.mod_revision),
                                                      int(kv.version))
                for kv in result.kvs}

    async def put(self, key: str, value: bytes) -> int:
        result = await self._call(f"put {key}", lambda c: c.put(key.encode(), value))
        return int(result.header.revision)

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        async def transaction(client: aetcd.Client) -> Any:
            compare = client.transactions.mod(key.encode()) == mod_revision
            return await client.transaction(
                compare=[compare], success=[client.transactions.put(key.encode(), value)],
                failure=[],
            )

        succeeded, _ = await self._call(f"compare-and-put {key}", transaction, repeatable=False)
        return bool(succeeded)

    async def delete(self, key: str) -> bool:
        result = await self._call(f"delete {key}", lambda c: c.delete(key.encode()))
        return bool(result is not None and getattr(result, "deleted", 0))

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        """All ``success`` operations if every compare holds, atomically; True if they ran.

        Never repeated after an unanswered attempt (see the module docstring):
        on ``StoreUnavailableError`` the outcome is unknown and the caller reads
        the keys to learn it.
        """
        async def run(client: aetcd.Client) -> Any:
            return await client.transaction(
                compare=[_compare(client, c) for c in compares],
                success=[_operation(client, op) for op in success], failure=[])

        succeeded, _ = await self._call(what, run, repeatable=False)
        return bool(succeeded)

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        """Several keys read at one revision (one transaction of reads)."""
        async def run(client: aetcd.Client) -> Any:
            return await client.transaction(
                compare=[], success=[client.transactions.get(k.encode()) for k in keys], failure=[])

        _, responses = await self._call(f"read {', '.join(keys)}", run)
        found: dict[str, VersionedValue | None] = {}
        for key, response in zip(keys, responses):
            found[key] = None
            for value, meta in response:
                found[key] = VersionedValue(bytes(value), int(meta.mod_revision), int(meta.version))
        return found

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        """A new etcd lease; returns (lease id, granted TTL in seconds).

        Repeatable: a grant whose answer was lost leaves a lease nobody
        renews, which etcd drops after its TTL.
        """
        lease = await self._call(f"grant lease ttl={ttl_seconds}",
                                 lambda c: c.lease(ttl_seconds))
        return int(lease.id), int(lease.ttl)

    async def keep_alive(self, lease_id: int) -> int:
        """Renews the lease once; returns its TTL from now (<= 0: it had expired)."""
        reply = await self._call(f"keep-alive lease {lease_id}", lambda c: c.refresh_lease(lease_id))
        return int(reply.TTL) if reply is not None else 0

    async def revoke_lease(self, lease_id: int) -> None:
        try:
            await self._call(f"revoke lease {lease_id}", lambda c: c.revoke_lease(lease_id))
        except StoreError as error:
            if "lease not found" not in str(error):
                raise

    async def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                           ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix``, forever; survives the loss of the member it watches.

        When the watched member fails, the watch moves to the next member and
        resumes after the last revision it delivered, so no event is skipped.
        aetcd hands the event kind over as the string "PUT" or "DELETE", not
        as its EventKind enum; both compare equal to the string, which is what
        is relied on here.
        """
        next_revision = start_revision
        key = prefix.encode()
        while True:
            endpoint = self.current_endpoint
            watch = None
            try:
                watch = await self._watch_client(endpoint).watch_prefix(
                    key, start_revision=next_revision)
                async for event in watch:
                    deleted = str(getattr(event.kind, "value", event.kind)) == "DELETE"
                    revision = int(event.kv.mod_revision)
                    next_revision = revision + 1
                    yield WatchEvent("delete" if deleted else "put", bytes(event.kv.key).decode(),
                                     bytes(event.kv.value), revision)
            except (aetcd.ClientError, asyncio.TimeoutError) as error:
                log.info("watch of %s on %s ended (%s); moving on", prefix, endpoint, error)
                self._next_member()
                await asyncio.sleep(_ROUND_PAUSE_SECONDS)
            finally:
                # A consumer that stops listening must not leave aetcd's
                # watcher filling a queue nobody reads.
                if watch is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(watch.cancel())

    async def close(self) -> None:
        clients = [*self._clients.values(), *self._watch_clients.values()]
        self._clients, self._watch_clients = {}, {}
        for client in clients:
            try:
                await client.close()
            except Exception:  # closing a channel to a dead member must not mask anything
                log.debug("closing etcd client failed", exc_info=True)


def _compare(client: aetcd.Client, compare: Compare) -> Any:
    target = {"version": client.transactions.version, "value": client.transactions.value,
              "mod_revision": client.transactions.mod}[compare.target](compare.key.encode())
    return target == compare.value


def _operation(client: aetcd.Client, operation: Put | Delete) -> Any:
    if isinstance(operation, Put):
        return client.transactions.put(operation.key.encode(), operation.value,
                                       lease=operation.lease_id)
    return client.transactions.delete(operation.key.encode())


def _never_reached(error: BaseException) -> bool:
    """True when gRPC could not even connect, so etcd never saw the request."""
    text = _describe(error).lower()
    return "failed to connect" in text or "connection refused" in text


def _describe(error: BaseException) -> str:
    details = getattr(error, "details", None)
    return str(details() if callable(details) else error) or type(error).__name__
