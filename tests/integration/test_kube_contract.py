"""The Kubernetes API contract (tests/kubecontract.py) on a real kube-apiserver with
cellplane's CRDs: the fake the unit tests use answers as this does."""

from __future__ import annotations

import uuid

import pytest

from kubecontract import CHECKS, Check
from cellplane_operator.kube import KubeClient, KubeConfig
from cellplane_operator.localplane.controlplane import LocalControlPlane

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_apiserver_keeps_the_kube_contract(kube: LocalControlPlane, check: Check) -> None:
    client = KubeClient(KubeConfig.load(kube.kubeconfig))
    try:
        await check(client, f"contract-{uuid.uuid4().hex[:6]}-")
    finally:
        await client.close()
