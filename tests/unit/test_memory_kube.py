"""The in-package fake of the Kubernetes API answers as the apiserver does (the contract of
tests/kubecontract.py, also run on a real kube-apiserver)."""

from __future__ import annotations

import pytest

from kubecontract import CHECKS, Check
from cellplane_operator.errors import KubeApiError
from cellplane_operator.kube import SECRETS
from cellplane_operator.kube.memory import InMemoryKube


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_the_fake_keeps_the_kube_contract(check: Check) -> None:
    await check(InMemoryKube(), "contract-")


async def test_an_unreachable_fake_answers_nothing_and_keeps_everything() -> None:
    kube = InMemoryKube()
    await kube.create(SECRETS, {"metadata": {"name": "kept"}}, namespace="default")
    kube.unreachable = True
    with pytest.raises(KubeApiError):
        await kube.get(SECRETS, "kept", namespace="default")
    with pytest.raises(KubeApiError):
        await kube.delete(SECRETS, "kept", namespace="default")
    kube.unreachable = False
    assert await kube.get(SECRETS, "kept", namespace="default") is not None
