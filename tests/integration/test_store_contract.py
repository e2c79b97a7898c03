"""The store contract (tests/storecontract.py) on real etcd: what the in-memory fake that
the unit tests use promises is what etcd does."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from storecontract import CHECKS, Check
from cellplane_operator.localplane.controlplane import LocalControlPlane
from cellplane_operator.store import EtcdStore

pytestmark = pytest.mark.integration


class EtcdHarness:
    def __init__(self, store: EtcdStore) -> None:
        self.store = store

    async def outlive_lease(self, ttl_seconds: int, key: str) -> None:
        # etcd ends a lease on its leader's clock, some time after the TTL.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ttl_seconds + 30
        while await self.store.get(key) is not None:
            assert loop.time() < deadline, f"{key} outlived its {ttl_seconds} s lease by 30 s"
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_etcd_keeps_the_store_contract(etcd1: LocalControlPlane, check: Check) -> None:
    store = EtcdStore(etcd1.etcd.endpoints, timeout=5)
    try:
        await check(EtcdHarness(store), f"/contract-{uuid.uuid4().hex[:8]}/")
    finally:
        await store.close()
