"""What every ``KubeApi`` does, as the apiserver does it.

The same checks run on the in-memory fake (tests/unit/test_memory_kube.py) and on a real
kube-apiserver with cellplane's CRDs (tests/integration/test_kube_contract.py), so that
controllers unit-tested on the fake meet the same answers on a cluster. Each check gets
a name prefix of its own; objects go in the ``default`` namespace.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import pytest

from cellplane_operator.errors import KubeConflictError
from cellplane_operator.kube import SECRETS, TENANTS
from cellplane_operator.kube.base import KubeApi

Check = Callable[[KubeApi, str], Awaitable[None]]
CHECKS: dict[str, Check] = {}
NAMESPACE = "default"


def check(function: Check) -> Check:
    CHECKS[function.__name__] = function
    return function


def tenant(name: str, **metadata: object) -> dict[str, object]:
    return {"metadata": {"name": name, **metadata}, "spec": {"plan": "pro", "homeRegion": "region-a"}}


@check
async def objects_are_created_once_read_listed_by_label_and_deleted(kube: KubeApi,
                                                                    prefix: str) -> None:
    name, group = f"{prefix}secret", prefix.rstrip("-")
    created = await kube.create(SECRETS, {
        "metadata": {"name": name, "labels": {"contract": group, "kind": "a"}},
        "type": "Opaque", "stringData": {"token": "s3cret"}}, namespace=NAMESPACE)
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
    assert created["metadata"]["namespace"] == NAMESPACE
    with pytest.raises(KubeConflictError):
        await kube.create(SECRETS, {"metadata": {"name": name}}, namespace=NAMESPACE)
    found = await kube.get(SECRETS, name, namespace=NAMESPACE)
    assert found is not None and "stringData" not in found
    assert base64.b64decode(found["data"]["token"]) == b"s3cret"
    await kube.create(SECRETS, {"metadata": {"name": f"{prefix}other",
                                             "labels": {"contract": group, "kind": "b"}}},
                      namespace=NAMESPACE)
    selected = await kube.list(SECRETS, namespace=NAMESPACE, label_selector=f"contract={group},kind=a")
    assert [s["metadata"]["name"] for s in selected] == [name]
    assert len(await kube.list(SECRETS, namespace=NAMESPACE, label_selector=f"contract={group}")) == 2
    assert await kube.delete(SECRETS, name, namespace=NAMESPACE)
    assert await kube.get(SECRETS, name, namespace=NAMESPACE) is None
    assert not await kube.delete(SECRETS, name, namespace=NAMESPACE)


@check
async def a_merge_patch_merges_removes_with_null_and_can_be_conditional(kube: KubeApi,
                                                                         prefix: str) -> None:
    name = f"{prefix}labels"
    created = await kube.create(SECRETS, {"metadata": {"name": name, "labels": {"a": "1", "b": "2"}}},
                                namespace=NAMESPACE)
    patched = await kube.patch(SECRETS, name, {"metadata": {"labels": {"b": None, "c": "3"}}},
                               namespace=NAMESPACE)
    assert patched["metadata"]["labels"] == {"a": "1", "c": "3"}
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    stale = created["metadata"]["resourceVersion"]
    with pytest.raises(KubeConflictError):
        await kube.patch(SECRETS, name, {"metadata": {"labels": {"d": "4"}, "resourceVersion": stale}},
                         namespace=NAMESPACE)
    fresh = patched["metadata"]["resourceVersion"]
    done = await kube.patch(SECRETS, name, {"metadata": {"labels": {"d": "4"},
                                                         "resourceVersion": fresh}},
                            namespace=NAMESPACE)
    assert done["metadata"]["labels"] == {"a": "1", "c": "3", "d": "4"}


@check
async def status_is_a_subresource_and_only_a_spec_change_moves_the_generation(
        kube: KubeApi, prefix: str) -> None:
    name = f"{prefix}tenant"
    created = await kube.create(TENANTS, tenant(name), namespace=NAMESPACE)
    assert "status" not in created and created["metadata"]["generation"] == 1
    with_status = await kube.patch(TENANTS, name, {"status": {"phase": "Ready"}},
                                   namespace=NAMESPACE, subresource="status")
    assert with_status["status"]["phase"] == "Ready"
    assert with_status["metadata"]["generation"] == 1
    ignored = await kube.patch(TENANTS, name, {"status": {"phase": "Failed"},
                                               "metadata": {"labels": {"x": "y"}}},
                               namespace=NAMESPACE)
    assert ignored["status"]["phase"] == "Ready", "the object's patch left the status alone"
    assert ignored["metadata"]["labels"] == {"x": "y"}
    respecced = await kube.patch(TENANTS, name, {"spec": {"plan": "enterprise"}}, namespace=NAMESPACE)
    assert respecced["metadata"]["generation"] == 2
    assert (respecced["spec"]["plan"], respecced["spec"]["homeRegion"]) == ("enterprise", "region-a")
    await kube.delete(TENANTS, name, namespace=NAMESPACE)


@check
async def finalizers_hold_a_deletion_until_the_last_one_goes(kube: KubeApi, prefix: str) -> None:
    name = f"{prefix}held"
    await kube.create(TENANTS, tenant(name, finalizers=["cellplane.io/test"]), namespace=NAMESPACE)
    assert await kube.delete(TENANTS, name, namespace=NAMESPACE)
    held = await kube.get(TENANTS, name, namespace=NAMESPACE)
    assert held is not None and held["metadata"]["deletionTimestamp"]
    assert await kube.delete(TENANTS, name, namespace=NAMESPACE), "a deletion under way is True"
    await kube.patch(TENANTS, name, {"metadata": {"finalizers": None}}, namespace=NAMESPACE)
    assert await kube.get(TENANTS, name, namespace=NAMESPACE) is None


@check
async def apply_creates_then_updates_what_it_names(kube: KubeApi, prefix: str) -> None:
    name = f"{prefix}applied"
    manifest = {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"v": "1"}},
                "type": "Opaque", "data": {"k": base64.b64encode(b"one").decode()}}
    first = await kube.apply(manifest, field_manager="contract")
    second = await kube.apply({**manifest, "metadata": {**manifest["metadata"], "labels": {"v": "2"}},
                               "data": {"k": base64.b64encode(b"two").decode()}},
                              field_manager="contract")
    assert first["metadata"]["uid"] == second["metadata"]["uid"]
    assert second["metadata"]["labels"] == {"v": "2"}
    assert base64.b64decode(second["data"]["k"]) == b"two"
