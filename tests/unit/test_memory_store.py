"""The in-package fake keeps etcd's revision semantics, so logic tested on it holds on etcd."""

from __future__ import annotations

from cellplane_operator.store import InMemoryStore


async def test_compare_and_put_follows_mod_revision() -> None:
    store = InMemoryStore()
    assert await store.put_if_revision("k", b"a", mod_revision=0)
    assert not await store.put_if_revision("k", b"b", mod_revision=0)
    current = await store.get("k")
    assert current is not None and current.version == 1
    assert await store.put_if_revision("k", b"b", mod_revision=current.mod_revision)
    after = await store.get("k")
    assert after is not None and (after.value, after.version) == (b"b", 2)
    assert after.mod_revision > current.mod_revision


async def test_delete_reports_whether_the_key_existed() -> None:
    store = InMemoryStore()
    await store.put("k", b"a")
    assert await store.delete("k")
    assert not await store.delete("k")
    assert await store.get("k") is None
