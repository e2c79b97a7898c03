"""Real etcd, three members (one per region), reached through cellplane's store adapter."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.store import EtcdStore

# The configured bound for one operation over all members.
TIMEOUT = 2.0
# Killing the leader costs an election (election timeout 1 s, randomized up to
# 2 s, then a round of votes): the first write after it waits for a new leader,
# so a store meant to ride through a member loss needs a budget above that.
SURVIVING_TIMEOUT = 5.0


@pytest.mark.parametrize("store_talks_to", ["leader", "follower"])
async def test_cluster_keeps_accepting_writes_with_the_leader_killed(
    etcd3: LocalControlPlane, store_talks_to: str
) -> None:
    """Killing the leader is the worst single loss: an election, and requests a
    follower forwarded to the dead leader dropped without an answer."""
    leader = etcd3.etcd.leader()
    assert leader is not None
    first = leader if store_talks_to == "leader" else next(
        m.name for m in etcd3.etcd.members if m.name != leader)
    ordered = sorted(etcd3.etcd.members, key=lambda m: m.name != first)
    store = EtcdStore([m.endpoint for m in ordered], timeout=SURVIVING_TIMEOUT)
    try:
        await store.put("/cellplane/probe", b"before")
        etcd3.etcd.kill(leader)

        for index in range(20):
            await store.put(f"/cellplane/after/{index}", str(index).encode())
        value = await store.get("/cellplane/after/19")
        assert value is not None and value.value == b"19"
        before = await store.get("/cellplane/probe")
        assert before is not None and before.value == b"before"
        assert etcd3.etcd.leader() not in (None, leader)
    finally:
        await store.close()


async def test_write_without_quorum_fails_in_bounded_time_with_our_error(etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=TIMEOUT)
    try:
        await store.put("/cellplane/probe", b"1")
        etcd3.etcd.kill("region-b")
        etcd3.etcd.kill("region-c")

        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as raised:
            await store.put("/cellplane/probe", b"2")
        elapsed = time.monotonic() - started

        # Bounded by the configured time (plus scheduling slack), not by gRPC's
        # or etcd's own defaults.
        assert elapsed < TIMEOUT + 1.0
        message = str(raised.value)
        assert "quorum" in message and f"{TIMEOUT:g}s" in message
        assert "grpc" not in type(raised.value).__module__

        # Linearizable reads need quorum too.
        with pytest.raises(StoreUnavailableError):
            await store.get("/cellplane/probe")

        # Quorum back: the same store works again, and the lost write never landed.
        etcd3.etcd.restart("region-b")
        value = await _eventually(lambda: store.get("/cellplane/probe"))
        assert value is not None
        await store.put("/cellplane/probe", b"3")
        after = await store.get("/cellplane/probe")
        assert after is not None and after.value == b"3"
    finally:
        await store.close()


async def test_compare_and_put_succeeds_only_at_the_revision_read(etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=TIMEOUT)
    try:
        assert await store.put_if_revision("/cellplane/owner", b"region-a", mod_revision=0)
        assert not await store.put_if_revision("/cellplane/owner", b"region-b", mod_revision=0)
        current = await store.get("/cellplane/owner")
        assert current is not None
        assert await store.put_if_revision("/cellplane/owner", b"region-b",
                                           mod_revision=current.mod_revision)
        assert not await store.put_if_revision("/cellplane/owner", b"region-c",
                                               mod_revision=current.mod_revision)
        final = await store.get("/cellplane/owner")
        assert final is not None and final.value == b"region-b"
    finally:
        await store.close()


async def test_a_watch_on_a_member_that_falls_silent_moves_on_and_misses_nothing(
        etcd3: LocalControlPlane) -> None:
    """A partitioned member keeps its connections open and answers nothing (SIGSTOP does
    the same): the watch on it must move to a live member, from the revision it reached,
    not wait forever. The routers found this: their placement map stopped at a takeover."""
    watched = etcd3.etcd.member("region-a")
    others = [m.endpoint for m in etcd3.etcd.members if m.name != watched.name]
    watching = EtcdStore([watched.endpoint, *others], timeout=SURVIVING_TIMEOUT)
    writing = EtcdStore(others, timeout=SURVIVING_TIMEOUT)
    seen: list[tuple[str, bytes]] = []
    first, after = asyncio.Event(), asyncio.Event()

    async def watch(revision: int) -> None:
        async for event in watching.watch_prefix("/cellplane/silent/", start_revision=revision):
            seen.append((event.key, event.value))
            (after if first.is_set() else first).set()

    await writing.put("/cellplane/silent/before", b"1")
    written = await writing.get("/cellplane/silent/before")
    assert written is not None
    task = asyncio.create_task(watch(written.mod_revision))
    try:
        await asyncio.wait_for(first.wait(), 30)
        assert watching.current_endpoint == watched.endpoint
        etcd3.etcd.pause(watched.name)
        try:
            await writing.put("/cellplane/silent/during", b"2")
            await writing.put("/cellplane/silent/later", b"3")
            # Without keepalive this waits forever; 60 s is far above the ~11 s it may take.
            await asyncio.wait_for(after.wait(), 60)
            await _eventually_true(lambda: len(seen) >= 3, timeout=30)
        finally:
            etcd3.etcd.resume(watched.name)
        assert seen == [("/cellplane/silent/before", b"1"), ("/cellplane/silent/during", b"2"),
                        ("/cellplane/silent/later", b"3")]
        assert watching.current_endpoint != watched.endpoint
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await watching.close()
        await writing.close()


async def _eventually_true(condition, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.1)


async def _eventually(read, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    """Retries a read while the restarted member rejoins and a leader is elected."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await read()
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
