"""The CRDs in crds/ are exactly what the v1alpha1 models generate, and structural."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellplane_operator.api import base, crdgen, v1alpha1
from cellplane_operator.api.base import ApiModel

REPO = Path(__file__).resolve().parents[2]
REGENERATE = ".venv/bin/python -m cellplane_operator.api.crdgen"


@pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind)
def test_committed_crd_is_the_generated_one(resource: crdgen.Resource) -> None:
    committed = REPO / "crds" / resource.file_name
    assert committed.exists(), f"crds/{resource.file_name} is missing: run {REGENERATE}"
    assert committed.read_text() == crdgen.render(resource), (
        f"crds/{resource.file_name} differs from the models in api/v1alpha1.py: "
        f"run {REGENERATE} and commit the result"
    )


def test_no_stray_crd_files() -> None:
    generated = {resource.file_name for resource in crdgen.RESOURCES}
    assert {path.name for path in (REPO / "crds").glob("*.yaml")} == generated


def test_check_reports_a_stale_file_with_a_diff(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--output-dir", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--output-dir", str(tmp_path)]) == 0
    stale = tmp_path / "cellplane.io_cells.yaml"
    stale.write_text(stale.read_text().replace("maxItems: 4", "maxItems: 5"))
    capsys.readouterr()
    assert crdgen.main(["--check", "--output-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "-                maxItems: 5" in out and "+                maxItems: 4" in out
    assert REGENERATE in err
    assert "maxItems: 5" in stale.read_text(), "--check must not write"


def test_output_is_deterministic() -> None:
    for resource in crdgen.RESOURCES:
        assert crdgen.render(resource) == crdgen.render(resource)
        assert crdgen.render(resource).startswith("# "), "the header says the file is generated"


def _nodes(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")


def _schema(kind: str) -> dict[str, Any]:
    resource = next(r for r in crdgen.RESOURCES if r.kind == kind)
    document = yaml.safe_load((REPO / "crds" / resource.file_name).read_text())
    version = document["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    schema = version["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


@pytest.mark.parametrize("kind", ["Cell", "Tenant", "TenantMove"])
def test_schema_is_structural(kind: str) -> None:
    schema = _schema(kind)
    assert schema["properties"]["metadata"] == {"type": "object"}
    for path, node in _nodes(schema, kind):
        assert "type" in node, f"{path} has no type"
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title", "nullable", "const",
                          "additionalProperties"):
            assert forbidden not in node, f"{path} has {forbidden}"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, f"{path}: OpenAPI v3 wants a boolean"
        if path.count(".") >= 2 and path.split(".")[1] in ("spec", "status"):
            assert node.get("description") or path.endswith("[]"), f"{path} has no description"


def test_crd_names_scope_and_columns() -> None:
    crds = {r.kind: crdgen.crd(r) for r in crdgen.RESOURCES}
    cell = crds["Cell"]["spec"]
    assert cell["scope"] == "Cluster"
    assert cell["names"]["shortNames"] == ["cl"]
    assert crds["Tenant"]["spec"]["names"]["shortNames"] == ["tn"]
    assert crds["TenantMove"]["spec"]["names"]["shortNames"] == ["tmv"]
    for crd in crds.values():
        assert crd["spec"]["group"] == "cellplane.io"
        assert crd["spec"]["names"]["categories"] == ["cellplane"]
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"], c.get("priority", 0))
               for c in cell["versions"][0]["additionalPrinterColumns"]]
    assert columns == [
        ("Region", ".spec.region", 0), ("Tier", ".spec.tier", 0),
        ("Tenants", ".status.tenants", 0), ("Slots", ".status.slotsInUse", 0),
        ("Active", ".status.activeRegion", 0), ("Epoch", ".status.epoch", 0),
        ("Phase", ".status.phase", 0), ("Age", ".metadata.creationTimestamp", 0),
        ("Capacity", ".spec.capacity.workerSlots", 1), ("Standbys", ".spec.standbyRegions", 1),
        ("Driver", ".spec.driver.name", 1),
    ]


def test_optional_fields_are_simply_not_required() -> None:
    spec = _schema("Tenant")["properties"]["spec"]
    assert spec["required"] == ["plan", "homeRegion"]
    assert spec["properties"]["cell"]["type"] == "string"
    assert "default" not in spec["properties"]["cell"]


def test_lease_is_unchanged_from_the_hand_written_crd() -> None:
    lease = _schema("Cell")["properties"]["spec"]["properties"]["lease"]
    assert lease["default"] == {"durationSeconds": 10, "renewIntervalSeconds": 2,
                                "marginSeconds": 2}
    bounds = {name: (p["default"], p["minimum"], p["maximum"])
              for name, p in lease["properties"].items()}
    assert bounds == {"durationSeconds": (10, 2, 300), "renewIntervalSeconds": (2, 0.1, 60),
                      "marginSeconds": (2, 0.1, 120)}
    assert [r["rule"] for r in lease["x-kubernetes-validations"]] == [
        "self.marginSeconds < double(self.durationSeconds)",
        "2.0 * self.renewIntervalSeconds <= double(self.durationSeconds) - self.marginSeconds",
    ]


def test_kubernetes_driver_fields_and_their_rules() -> None:
    schema = _schema("Cell")
    driver = schema["properties"]["spec"]["properties"]["driver"]
    fields = driver["properties"]
    assert fields["name"]["enum"] == ["local", "kubernetes"]
    assert fields["name"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    storage = fields["storage"]
    assert storage["default"] == {} and storage["properties"]["size"]["default"] == "1Gi"
    assert "default" not in storage["properties"]["className"]
    assert [r["fieldPath"] for r in storage["x-kubernetes-validations"]] == [".className"]
    assert any("quantity(self).compareTo(quantity(oldSelf)) >= 0" in r["rule"]
               for r in storage["properties"]["size"]["x-kubernetes-validations"])
    assert "default" not in fields["resources"]
    assert set(fields["resources"]["properties"]) == {"database", "api", "worker"}
    for container in fields["resources"]["properties"].values():
        for part in ("requests", "limits"):
            amounts = container["properties"][part]["properties"]
            assert set(amounts) == {"cpu", "memory"}
            assert all(a["pattern"] == base.QUANTITY_PATTERN for a in amounts.values())
    assert (fields["apiReplicas"]["minimum"], fields["apiReplicas"]["maximum"]) == (1, 10)
    assert (fields["workerReplicas"]["minimum"], fields["workerReplicas"]["maximum"]) == (1, 16)
    assert fields["claimPolicy"]["enum"] == ["Retain", "Delete"]
    assert fields["claimPolicy"]["default"] == "Retain"
    for name in ("storage", "resources", "apiReplicas", "workerReplicas", "claimPolicy"):
        assert "a local cell ignores" in fields[name]["description"], name
    # metadata.name is seen only at the root: the site-name length rule lives there.
    assert any("self.metadata.name.size() + self.spec.region.size() <= 43" in r["rule"]
               for r in schema["x-kubernetes-validations"])


@pytest.mark.parametrize(("value", "valid"), [
    ("1Gi", True), ("500m", True), ("1.5Gi", True), ("2", True), ("1e3", True), (".5", True),
    ("100M", True), ("1 Gi", False), ("-1Gi", False), ("Gi", False), ("1GB", False),
    ("1e3.5", False), ("", False)])
def test_quantity_pattern(value: str, valid: bool) -> None:
    assert bool(re.match(base.QUANTITY_PATTERN, value)) is valid


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """The apiserver's structural defaulting: a missing property with a default gets a
    copy of it, then defaulting continues inside (so ``default: {}`` fills in)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = _apply_defaults(child, value[name])
    if isinstance(value, list) and "items" in schema:
        return [_apply_defaults(schema["items"], item) for item in value]
    return value


SAMPLE_SPECS: list[tuple[str, type[ApiModel], dict[str, Any]]] = [
    ("Cell", v1alpha1.CellSpec,
     {"region": "region-a", "tier": "shared", "capacity": {"tenants": 10, "workerSlots": 40}}),
    ("Cell", v1alpha1.CellSpec,
     {"region": "region-a", "tier": "dedicated", "capacity": {"tenants": 1, "workerSlots": 20},
      "standbyRegions": ["region-b"], "failover": {"automatic": False}, "driver": {}}),
    ("Cell", v1alpha1.CellSpec,
     {"region": "region-a", "tier": "shared", "capacity": {"tenants": 1, "workerSlots": 4},
      "driver": {"name": "kubernetes", "storage": {"className": "fast"},
                 "resources": {"api": {"limits": {"memory": "1Gi"}}}}}),
    ("Cell", v1alpha1.CellSpec,
     {"region": "region-a", "tier": "shared",
      "capacity": {"tenants": 1, "workerSlots": 10, "priorityFloors": {"low": 1}}}),
    ("Tenant", v1alpha1.TenantSpec, {"plan": "free", "homeRegion": "region-a"}),
    ("Tenant", v1alpha1.TenantSpec,
     {"plan": "pro", "homeRegion": "region-a", "quotas": {"burst": 30},
      "webhooks": [{"url": "https://hooks.example/a"}],
      "targets": [{"name": "api", "url": "http://127.0.0.1:9000"}]}),
    ("TenantMove", v1alpha1.TenantMoveSpec, {"tenant": "acme", "targetRegion": "region-b"}),
]


@pytest.mark.parametrize(("kind", "model", "spec"), SAMPLE_SPECS,
                         ids=[f"{kind}-{i}" for i, (kind, _, _) in enumerate(SAMPLE_SPECS)])
def test_model_defaults_are_the_crd_defaults(kind: str, model: type[ApiModel],
                                             spec: dict[str, Any]) -> None:
    by_crd = _apply_defaults(_schema(kind)["properties"]["spec"], copy.deepcopy(spec))
    by_model = model.model_validate(spec).model_dump(by_alias=True, mode="json",
                                                     exclude_none=True)
    assert by_model == by_crd


def test_a_fractional_bound_is_also_a_cel_rule() -> None:
    """kube-openapi checks an integer against int64(bound): 0 passed `minimum: 0.1`."""
    assert crdgen.fractional_bound_rules(
        {"type": "number", "minimum": 0.1, "maximum": 60}) == [
        {"rule": "self >= 0.1", "message": "must be greater than or equal to 0.1"}]
    assert crdgen.fractional_bound_rules(
        {"type": "number", "minimum": 0.5, "exclusiveMinimum": True, "maximum": 2.5,
         "exclusiveMaximum": True}) == [
        {"rule": "self > 0.5", "message": "must be greater than 0.5"},
        {"rule": "self < 2.5", "message": "must be less than 2.5"}]
    assert crdgen.fractional_bound_rules({"type": "number", "minimum": 0, "maximum": 3}) == []
    assert crdgen.fractional_bound_rules({"type": "integer", "minimum": 1}) == []


@pytest.mark.parametrize("kind", ["Cell", "Tenant", "TenantMove"])
def test_every_fractional_bound_of_the_crds_has_its_rule(kind: str) -> None:
    found = 0
    for path, node in _nodes(_schema(kind), kind):
        for rule in crdgen.fractional_bound_rules(node):
            found += 1
            assert rule in node.get("x-kubernetes-validations", []), f"{path}: {rule} missing"
    assert found or kind not in ("Cell", "TenantMove")


@pytest.mark.parametrize("kind", ["Cell", "Tenant", "TenantMove"])
def test_every_integer_field_refuses_a_decimal_point(kind: str) -> None:
    """`tenants: 1.0` passed the schema and failed only where a CEL rule read it."""
    integers = [(path, node) for path, node in _nodes(_schema(kind), kind)
                if node.get("type") == "integer"]
    assert integers
    for path, node in integers:
        assert crdgen.WHOLE_NUMBER_RULE in node.get("x-kubernetes-validations", []), path
