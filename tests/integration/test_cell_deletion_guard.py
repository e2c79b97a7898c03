"""Real kube-apiserver: the ValidatingAdmissionPolicy in deploy/admission refuses to
delete a Cell that still holds tenants, and says so."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for


def create_cell(kube: LocalControlPlane, name: str) -> None:
    kube.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
        "spec": {"region": "region-a", "tier": "shared",
                 "capacity": {"tenants": 10, "workerSlots": 40}}}))


def set_tenants(kube: LocalControlPlane, name: str, tenants: int) -> None:
    kube.kubectl("patch", "cell", name, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"tenants": tenants}}))


def exists(kube: LocalControlPlane, name: str) -> bool:
    result = kube.kubectl("get", "cell", name, "-o", "name", check=False)
    if result.returncode == 0:
        return True
    assert "NotFound" in result.stderr, result.stderr
    return False


@pytest.fixture(scope="module")
def guarded(kube: LocalControlPlane) -> Iterator[LocalControlPlane]:
    """The control plane once the policy is in effect.

    The policy was stored when the control plane started; the admission plugin
    loads it through an informer a moment later and the API has no signal for
    that. A server-side dry run goes through admission without deleting
    anything, so a probe cell with a tenant tells when the policy took effect.
    """
    create_cell(kube, "guard-probe")
    set_tenants(kube, "guard-probe", 1)

    def policy_in_effect() -> bool:
        dry_run = kube.kubectl("delete", "cell", "guard-probe", "--dry-run=server", check=False)
        return dry_run.returncode != 0 and "still holds 1 tenant(s)" in dry_run.stderr

    wait_for(policy_in_effect, timeout=30, interval=0.2,
             what="the cell deletion policy to take effect")
    yield kube
    set_tenants(kube, "guard-probe", 0)
    kube.kubectl("delete", "cell", "guard-probe")


def test_a_cell_with_tenants_cannot_be_deleted_until_they_are_gone(
    guarded: LocalControlPlane,
) -> None:
    create_cell(guarded, "holds-two")
    set_tenants(guarded, "holds-two", 2)

    refused = guarded.kubectl("delete", "cell", "holds-two", "--wait=false", check=False)
    assert refused.returncode != 0
    assert ("cell holds-two still holds 2 tenant(s); move them (TenantMove) or delete them first"
            in refused.stderr), refused.stderr
    assert "Forbidden" in refused.stderr
    assert exists(guarded, "holds-two")

    set_tenants(guarded, "holds-two", 0)
    guarded.kubectl("delete", "cell", "holds-two")
    assert not exists(guarded, "holds-two")


def test_a_cell_without_reported_tenants_can_be_deleted(guarded: LocalControlPlane) -> None:
    create_cell(guarded, "never-placed")
    guarded.kubectl("delete", "cell", "never-placed")
    assert not exists(guarded, "never-placed")
