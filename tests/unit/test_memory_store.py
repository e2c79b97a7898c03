"""The in-package fake keeps etcd's semantics (the contract of tests/storecontract.py, also
run on real etcd), so logic tested on it holds on etcd."""

from __future__ import annotations

import pytest

from storecontract import CHECKS, Check
from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.store import InMemoryStore, KeyValueStore, Put


class SteppedClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class MemoryHarness:
    def __init__(self) -> None:
        self.clock = SteppedClock()
        self.store: KeyValueStore = InMemoryStore(self.clock)

    async def outlive_lease(self, ttl_seconds: int, key: str) -> None:
        self.clock.now += ttl_seconds + 0.001


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_fake_keeps_the_store_contract(check: Check) -> None:
    await check(MemoryHarness(), "/contract/")


async def test_a_lease_renewed_in_time_keeps_its_keys() -> None:
    harness = MemoryHarness()
    store = harness.store
    lease_id, ttl = await store.grant_lease(10)
    assert await store.transaction([], [Put("k", b"v", lease_id=lease_id)], what="own")
    for _ in range(5):
        harness.clock.now += ttl - 1
        assert await store.keep_alive(lease_id) == ttl
    assert await store.get("k") is not None
    harness.clock.now += ttl
    assert await store.get("k") is None


async def test_an_unavailable_store_confirms_nothing_and_changes_nothing() -> None:
    store = InMemoryStore(SteppedClock())
    await store.put("k", b"before")
    store.unavailable = True
    with pytest.raises(StoreUnavailableError):
        await store.put("k", b"during")
    with pytest.raises(StoreUnavailableError):
        await store.keep_alive(1)
    store.unavailable = False
    found = await store.get("k")
    assert found is not None and found.value == b"before"
