"""What every ``KeyValueStore`` does, as etcd does it.

The same checks run on the in-memory fake (tests/unit/test_memory_store.py) and on real
etcd (tests/integration/test_store_contract.py), so that logic unit-tested on the fake
holds on etcd. Each check gets a store and a key prefix of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import pytest

from cellplane_operator.errors import StoreError
from cellplane_operator.store import Compare, Delete, KeyValueStore, Put, WatchEvent


class Harness(Protocol):
    store: KeyValueStore

    async def outlive_lease(self, ttl_seconds: int, key: str) -> None:
        """Lets a lease of ``ttl_seconds`` that nobody renews run out, until the store has
        deleted ``key``, which was put on it."""


Check = Callable[[Harness, str], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(function: Check) -> Check:
    CHECKS[function.__name__] = function
    return function


async def next_events(watch: object, count: int, timeout: float = 10) -> list[WatchEvent]:
    iterator = watch.__aiter__()  # type: ignore[attr-defined]
    return [await asyncio.wait_for(iterator.__anext__(), timeout) for _ in range(count)]


@check
async def revisions_and_versions_follow_writes(harness: Harness, prefix: str) -> None:
    store = harness.store
    first = await store.put(f"{prefix}k", b"a")
    second = await store.put(f"{prefix}k", b"b")
    assert second > first
    value = await store.get(f"{prefix}k")
    assert value is not None and (value.value, value.mod_revision, value.version) == (b"b", second, 2)
    assert await store.delete(f"{prefix}k")
    assert not await store.delete(f"{prefix}k")
    assert await store.get(f"{prefix}k") is None
    await store.put(f"{prefix}k", b"c")
    again = await store.get(f"{prefix}k")
    assert again is not None and again.version == 1, "a re-created key starts its versions again"


@check
async def compare_and_put_follows_mod_revision(harness: Harness, prefix: str) -> None:
    store, key = harness.store, f"{prefix}k"
    assert await store.put_if_revision(key, b"a", mod_revision=0)
    assert not await store.put_if_revision(key, b"b", mod_revision=0)
    current = await store.get(key)
    assert current is not None
    assert not await store.put_if_revision(key, b"b", mod_revision=current.mod_revision - 1)
    assert await store.put_if_revision(key, b"b", mod_revision=current.mod_revision)
    after = await store.get(key)
    assert after is not None and (after.value, after.version) == (b"b", 2)


@check
async def a_transaction_runs_whole_at_one_revision_or_not_at_all(harness: Harness,
                                                                  prefix: str) -> None:
    store = harness.store
    a, b, c = f"{prefix}a", f"{prefix}b", f"{prefix}c"
    await store.put(a, b"1")
    await store.put(c, b"gone soon")
    held = await store.get(a)
    assert held is not None
    refused = await store.transaction(
        [Compare(a, "value", b"1"), Compare(b, "version", 1)], [Put(b, b"x"), Delete(a)], what="t")
    assert not refused
    assert (await store.read(a, b)) == {a: held, b: None}, "a failed compare writes nothing"
    ran = await store.transaction(
        [Compare(a, "value", b"1"), Compare(b, "version", 0), Compare(a, "mod_revision",
                                                                      held.mod_revision)],
        [Put(b, b"x"), Delete(a), Delete(c)], what="t")
    assert ran
    found = await store.read(a, b, c)
    assert found[a] is None and found[c] is None
    written = found[b]
    assert written is not None and written.value == b"x" and written.mod_revision > held.mod_revision


@check
async def prefix_reads_see_only_their_prefix(harness: Harness, prefix: str) -> None:
    store = harness.store
    await store.put(f"{prefix}in/1", b"1")
    await store.put(f"{prefix}in/2", b"2")
    await store.put(f"{prefix}inside", b"3")
    await store.put(f"{prefix}out/1", b"4")
    found = await store.get_prefix(f"{prefix}in/")
    assert {key: value.value for key, value in found.items()} == {
        f"{prefix}in/1": b"1", f"{prefix}in/2": b"2"}


@check
async def a_key_on_a_lease_goes_with_the_lease(harness: Harness, prefix: str) -> None:
    store = harness.store
    lease_id, ttl = await store.grant_lease(2)
    assert ttl >= 2
    assert await store.transaction([], [Put(f"{prefix}owned", b"me", lease_id=lease_id),
                                        Put(f"{prefix}kept", b"me")], what="t")
    assert await store.keep_alive(lease_id) > 0
    await harness.outlive_lease(ttl, f"{prefix}owned")
    assert await store.get(f"{prefix}owned") is None
    assert await store.get(f"{prefix}kept") is not None, "a key without the lease stays"
    assert await store.keep_alive(lease_id) <= 0, "an ended lease cannot be renewed"
    with pytest.raises(StoreError):
        await store.transaction([], [Put(f"{prefix}late", b"me", lease_id=lease_id)], what="t")


@check
async def a_revoked_lease_takes_its_keys_at_once(harness: Harness, prefix: str) -> None:
    store = harness.store
    lease_id, _ = await store.grant_lease(60)
    assert await store.transaction([], [Put(f"{prefix}owned", b"me", lease_id=lease_id)], what="t")
    await store.revoke_lease(lease_id)
    assert await store.get(f"{prefix}owned") is None
    await store.revoke_lease(lease_id)  # again: no error


@check
async def a_watch_replays_from_its_revision_then_follows(harness: Harness, prefix: str) -> None:
    store = harness.store
    start = await store.put(f"{prefix}w/a", b"1")
    await store.put(f"{prefix}other", b"not watched")
    await store.delete(f"{prefix}w/a")
    watch = store.watch_prefix(f"{prefix}w/", start_revision=start)
    try:
        replayed = await next_events(watch, 2)
        assert [(e.kind, e.key, e.value) for e in replayed] == [
            ("put", f"{prefix}w/a", b"1"), ("delete", f"{prefix}w/a", b"")]
        assert replayed[0].mod_revision == start
        assert await store.transaction([], [Put(f"{prefix}w/b", b"2"), Put(f"{prefix}w/c", b"3")],
                                       what="t")
        live = await next_events(watch, 2)
        assert [(e.kind, e.key) for e in live] == [("put", f"{prefix}w/b"), ("put", f"{prefix}w/c")]
        assert live[0].mod_revision == live[1].mod_revision > replayed[1].mod_revision
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


@check
async def a_watch_from_now_sees_only_what_comes_after(harness: Harness, prefix: str) -> None:
    store = harness.store
    await store.put(f"{prefix}w/old", b"0")
    watch = store.watch_prefix(f"{prefix}w/")
    try:
        iterator = watch.__aiter__()
        pending = asyncio.ensure_future(iterator.__anext__())
        # The watch starts at some revision after its first step: writes go on until it
        # has seen one, and none of them may be the write from before.
        while not pending.done():
            await store.put(f"{prefix}w/new", b"1")
            await asyncio.wait({pending}, timeout=0.5)
        event = pending.result()
        assert (event.kind, event.key) == ("put", f"{prefix}w/new")
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
