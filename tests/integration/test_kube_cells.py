"""Real kube-apiserver: the Cell CRD's validation, and the operator writing status."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.process import wait_for


def cell_manifest(name: str, **spec_overrides: object) -> str:
    spec: dict[str, object] = {
        "region": "region-a",
        "tier": "shared",
        "capacity": {"tenants": 10, "workerSlots": 40},
    }
    spec.update(spec_overrides)
    return json.dumps({"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                       "metadata": {"name": name}, "spec": spec})


@pytest.fixture(scope="module")
def operator(kube: LocalControlPlane) -> Iterator[ManagedProcess]:
    """The real operator process (kopf), talking to the real apiserver as admin."""
    process = ManagedProcess(
        "operator",
        [sys.executable, "-m", "cellplane_operator", "operator", "--region", "region-a"],
        log=kube.run_dir / "logs" / "operator.log",
        env={"KUBECONFIG": str(kube.kubeconfig)},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def get_cell(kube: LocalControlPlane, name: str) -> dict[str, object]:
    result = json.loads(kube.kubectl("get", "cell", name, "-o", "json").stdout)
    assert isinstance(result, dict)
    return result


def test_operator_reports_status_of_a_new_cell(kube: LocalControlPlane, operator: ManagedProcess) -> None:
    kube.kubectl("apply", "-f", "-", input_text=cell_manifest("shared-status"))

    def reported() -> bool:
        status = get_cell(kube, "shared-status").get("status") or {}
        assert isinstance(status, dict)
        return bool(status.get("conditions"))

    wait_for(reported, timeout=60, what="the operator to patch the cell's status",
             alive=operator.check_alive)
    cell = get_cell(kube, "shared-status")
    status = cell["status"]
    assert isinstance(status, dict)
    assert status["phase"] == "Pending"
    assert status["observedGeneration"] == 1
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Accepted"]["status"] == "True"
    assert conditions["Accepted"]["reason"] == "SpecValid"
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "StackNotProvisioned"

    # The printer columns show what the operator wrote.
    table = kube.kubectl("get", "cells", "shared-status", "-o", "wide").stdout
    header, row = table.strip().splitlines()
    assert header.split()[:6] == ["NAME", "REGION", "TIER", "TENANTS", "SLOTS", "PHASE"]
    assert row.split()[:6] == ["shared-status", "region-a", "shared", "10", "40", "Pending"]


def test_operator_follows_a_spec_change(kube: LocalControlPlane, operator: ManagedProcess) -> None:
    kube.kubectl("apply", "-f", "-", input_text=cell_manifest("shared-grows"))
    kube.kubectl("patch", "cell", "shared-grows", "--type=merge",
                 "-p", '{"spec": {"capacity": {"tenants": 20, "workerSlots": 80}}}')

    def observed_second_generation() -> bool:
        status = get_cell(kube, "shared-grows").get("status") or {}
        assert isinstance(status, dict)
        return status.get("observedGeneration") == 2

    wait_for(observed_second_generation, timeout=60, what="status for generation 2",
             alive=operator.check_alive)
    status = get_cell(kube, "shared-grows")["status"]
    assert isinstance(status, dict)
    accepted = next(c for c in status["conditions"] if c["type"] == "Accepted")
    assert "20 tenant(s)" in accepted["message"]


@pytest.mark.parametrize(
    ("spec_overrides", "names_field"),
    [
        ({"tier": "premium"}, 'spec.tier: Unsupported value: "premium"'),
        ({"region": "Region A"}, "spec.region: Invalid value"),
        ({"capacity": {"tenants": 0, "workerSlots": 4}}, "spec.capacity.tenants: Invalid value"),
        ({"capacity": {"tenants": 8, "workerSlots": 4}}, "spec.capacity: Invalid value"),
        ({"tier": "dedicated"}, "capacity.tenants must be 1"),
    ],
)
def test_invalid_cell_is_rejected_by_the_schema_naming_the_field(
    kube: LocalControlPlane, spec_overrides: dict[str, object], names_field: str
) -> None:
    result = kube.kubectl("apply", "-f", "-", input_text=cell_manifest("bad", **spec_overrides),
                          check=False)
    assert result.returncode != 0
    assert names_field in result.stderr
    assert kube.kubectl("get", "cell", "bad", check=False).returncode != 0


def test_missing_required_field_is_named(kube: LocalControlPlane) -> None:
    manifest = json.dumps({"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                           "metadata": {"name": "no-region"},
                           "spec": {"tier": "shared", "capacity": {"tenants": 1, "workerSlots": 1}}})
    result = kube.kubectl("apply", "-f", "-", input_text=manifest, check=False)
    assert result.returncode != 0
    assert "spec.region: Required value" in result.stderr


def test_region_is_immutable(kube: LocalControlPlane) -> None:
    kube.kubectl("apply", "-f", "-", input_text=cell_manifest("stays-home"))
    result = kube.kubectl("patch", "cell", "stays-home", "--type=merge",
                          "-p", '{"spec": {"region": "region-b"}}', check=False)
    assert result.returncode != 0
    assert "region is immutable" in result.stderr
    spec = get_cell(kube, "stays-home")["spec"]
    assert isinstance(spec, dict) and spec["region"] == "region-a"


def test_lease_settings_default_and_unsafe_ones_are_refused(kube: LocalControlPlane) -> None:
    kube.kubectl("apply", "-f", "-", input_text=cell_manifest("leased"))
    assert get_cell(kube, "leased")["spec"]["lease"] == {  # type: ignore[index]
        "durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}
    for lease, message in (
        ({"durationSeconds": 5, "marginSeconds": 5}, "marginSeconds must be below"),
        ({"durationSeconds": 10, "renewIntervalSeconds": 4.5, "marginSeconds": 2},
         "two lease.renewIntervalSeconds must fit"),
        ({"durationSeconds": 1}, "spec.lease.durationSeconds: Invalid value"),
    ):
        result = kube.kubectl("apply", "-f", "-", input_text=cell_manifest("unsafe", lease=lease),
                              check=False)
        assert result.returncode != 0 and message in result.stderr, result.stderr
