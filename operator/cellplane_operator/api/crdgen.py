"""Generates the CustomResourceDefinitions in ``crds/`` from the ``v1alpha1`` models.

    python -m cellplane_operator.api.crdgen          # rewrite crds/*.yaml
    python -m cellplane_operator.api.crdgen --check  # exit 1 with a diff if one is stale

Pydantic writes JSON Schema (draft 2020-12); the apiserver wants a *structural*
OpenAPI v3 schema. ``structural`` translates: ``$ref`` inlined, titles dropped,
``X | None`` becomes an optional X (no ``nullable``: absent means unset),
``const`` becomes a one-value enum, a numeric ``exclusiveMinimum`` becomes
OpenAPI's boolean form, and every node must carry a ``type``. Anything it does
not know is an error rather than a silently different CRD.

A fractional bound of a ``number`` field is also stated as a CEL rule: the
apiserver's schema check compares an integer value with the bound cut to an
integer (``0`` passes ``minimum: 0.1``), while CEL compares doubles. So every
bound the models state holds at admission exactly as the models read it.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from cellplane_operator.api import v1alpha1
from cellplane_operator.api.base import Rule

__all__ = ["Column", "Resource", "RESOURCES", "structural", "fractional_bound_rules",
           "whole_number_rules", "WHOLE_NUMBER_RULE", "crd", "render", "main"]

# Key order of a schema node in the YAML: what a reader looks for first.
_NODE_KEYS = (
    "type", "format", "description", "enum", "default",
    "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
    "minLength", "maxLength", "pattern", "maxItems",
    "required", "properties", "items",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations",
)
_DROPPED = ("title", "$defs")
# Pydantic sorts the keys of what it emits; a CEL rule reads best rule first.
_RULE_KEYS = ("rule", "messageExpression", "message", "fieldPath", "reason", "optionalOldSelf")


@dataclass(frozen=True)
class Column:
    """An ``additionalPrinterColumns`` entry."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    priority: int = 0
    """1 shows the column only with ``-o wide``."""

    def render(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.priority:
            column["priority"] = self.priority
        return column


AGE = Column("Age", ".metadata.creationTimestamp", "date")


@dataclass(frozen=True)
class Resource:
    """One kind: its names, scope, models and printer columns."""

    kind: str
    plural: str
    scope: Literal["Cluster", "Namespaced"]
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[Column, ...]
    description: str
    name_rules: tuple[Rule, ...] = ()
    """CEL rules over ``metadata.name`` (the only metadata CEL sees): a name the
    objects derived from it cannot carry is refused at admission."""

    @property
    def file_name(self) -> str:
        return f"{v1alpha1.GROUP}_{self.plural}.yaml"


RESOURCES: tuple[Resource, ...] = (
    Resource(
        kind="Cell", plural="cells", scope="Cluster", short_names=("cl",),
        name_rules=v1alpha1.CELL_NAME_RULES,
        spec=v1alpha1.CellSpec, status=v1alpha1.CellStatus,
        description="One independent stack of the job platform (API, workers, Postgres) with "
                    "a primary site in its home region and standbys in others.",
        columns=(
            Column("Region", ".spec.region"),
            Column("Tier", ".spec.tier"),
            Column("Tenants", ".status.tenants", "integer"),
            Column("Slots", ".status.slotsInUse", "integer"),
            Column("Active", ".status.activeRegion"),
            Column("Epoch", ".status.epoch", "integer"),
            Column("Phase", ".status.phase"),
            AGE,
            Column("Capacity", ".spec.capacity.workerSlots", "integer", priority=1),
            Column("Standbys", ".spec.standbyRegions", priority=1),
            Column("Driver", ".spec.driver.name", priority=1),
        ),
    ),
    Resource(
        kind="Tenant", plural="tenants", scope="Namespaced", short_names=("tn",),
        name_rules=v1alpha1.TENANT_NAME_RULES,
        spec=v1alpha1.TenantSpec, status=v1alpha1.TenantStatus,
        description="A customer of the job platform, placed in a shared or a dedicated Cell.",
        columns=(
            Column("Plan", ".spec.plan"),
            Column("Isolation", ".spec.isolation"),
            Column("Cell", ".status.cell"),
            Column("Epoch", ".status.epoch", "integer"),
            Column("Phase", ".status.phase"),
            AGE,
            Column("Region", ".spec.homeRegion", priority=1),
        ),
    ),
    Resource(
        kind="TenantMove", plural="tenantmoves", scope="Namespaced", short_names=("tmv",),
        spec=v1alpha1.TenantMoveSpec, status=v1alpha1.TenantMoveStatus,
        description="Moves a Tenant to another Cell with a bounded write pause.",
        columns=(
            Column("Tenant", ".spec.tenant"),
            Column("Source", ".status.sourceCell"),
            Column("Target", ".status.targetCell"),
            Column("Phase", ".status.phase"),
            Column("Copied", ".status.progress.rowsCopied", "integer"),
            Column("Pause", ".status.progress.pauseSeconds", "number"),
            AGE,
            Column("Region", ".spec.targetRegion", priority=1),
            Column("Delta", ".status.progress.currentDelta", "integer", priority=1),
        ),
    ),
)


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a structural OpenAPI v3 schema."""
    schema = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    return _node(schema, schema.get("$defs", {}), path=model.__name__)


def _node(schema: Mapping[str, Any], defs: Mapping[str, Any], *, path: str) -> dict[str, Any]:
    node = dict(schema)
    for key in _DROPPED:
        node.pop(key, None)
    node = _inline(node, defs, path=path)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMinimum" in node:  # JSON Schema's number -> OpenAPI's minimum + boolean
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if "exclusiveMaximum" in node:
        node["maximum"] = node.pop("exclusiveMaximum")
        node["exclusiveMaximum"] = True
    if "description" in node:
        node["description"] = _prose(node["description"])
    if "properties" in node:
        node["properties"] = {name: _node(child, defs, path=f"{path}.{name}")
                              for name, child in node["properties"].items()}
        for name, child in node["properties"].items():
            if "description" not in child:
                raise ValueError(f"{path}.{name} has no description: give the field a docstring")
    if "items" in node:
        node["items"] = _node(node["items"], defs, path=f"{path}[]")
    if "maxLength" in node and node.get("type") == "array":
        node["maxItems"] = node.pop("maxLength")
    if rules := [*fractional_bound_rules(node), *whole_number_rules(node)]:
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), *rules]
    unknown = set(node) - set(_NODE_KEYS)
    if unknown:
        raise ValueError(f"{path}: no structural translation for {sorted(unknown)}")
    if "type" not in node:
        raise ValueError(f"{path}: a structural schema needs a type on every node")
    if "x-kubernetes-validations" in node:
        node["x-kubernetes-validations"] = [
            {key: rule[key] for key in _RULE_KEYS if key in rule}
            for rule in node["x-kubernetes-validations"]]
    ordered = {key: _tidy(node[key]) for key in _NODE_KEYS if key in node}
    if ordered.get("default", 0) is None:
        del ordered["default"]
    return ordered


def fractional_bound_rules(node: Mapping[str, Any]) -> list[dict[str, str]]:
    """CEL rules for the fractional bounds of a ``number`` node (OpenAPI form).

    kube-openapi checks an integer value against ``int64(bound)`` (``0 >= 0``
    for ``minimum: 0.1``), so ``maxWritePauseSeconds: 0`` was stored and then
    refused by the model every operator reads it with. CEL sees a ``number``
    as a double whatever the JSON looked like, and compares it exactly.
    """
    if node.get("type") != "number":
        return []
    rules: list[dict[str, str]] = []
    for bound_key, inclusive, strict, words in (("minimum", ">=", ">", "greater than"),
                                                ("maximum", "<=", "<", "less than")):
        bound = node.get(bound_key)
        if bound is None or float(bound).is_integer():
            continue
        exclusive = node.get(f"exclusive{bound_key[0].upper()}{bound_key[1:]}") is True
        rules.append({
            "rule": f"self {strict if exclusive else inclusive} {float(bound)!r}",
            "message": f"must be {words}{'' if exclusive else ' or equal to'} {float(bound):g}",
        })
    return rules


WHOLE_NUMBER_RULE = {"rule": "type(self) == int", "message": "must be a whole number, written "
                     "without a decimal point"}


def whole_number_rules(node: Mapping[str, Any]) -> list[dict[str, str]]:
    """The rule that refuses ``1.0`` for an ``integer`` node, everywhere alike.

    The schema check lets an integral float through (``tenants: 1.0``), but a CEL
    rule that reads the field then fails on it ("expected int, got float64"): the
    apiserver refused ``1.0`` where a rule looked and stored it where none did. The
    models read integers strictly (``api.base.Integer``); this rule makes every
    integer field refuse ``1.0`` at admission as well.
    """
    return [dict(WHOLE_NUMBER_RULE)] if node.get("type") == "integer" else []


def _inline(node: dict[str, Any], defs: Mapping[str, Any], *, path: str) -> dict[str, Any]:
    """Resolves ``$ref``, a single ``allOf`` and ``anyOf [X, null]`` into one node.

    Keys beside the reference (the field's description, default, rules) win over
    the referenced model's, except CEL rules, which both keep.
    """
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
    elif "allOf" in node and len(node["allOf"]) == 1:
        target = node.pop("allOf")[0]
    elif "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"{path}: a union of {len(branches)} types has no structural form")
        target = branches[0]
    else:
        return node
    inner = _inline({k: v for k, v in target.items() if k not in _DROPPED}, defs, path=path)
    rules = inner.get("x-kubernetes-validations", []) + node.get("x-kubernetes-validations", [])
    merged = {**inner, **node}
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def _prose(text: str) -> str:
    """Docstring lines joined into paragraphs, as one line each."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def _tidy(value: Any) -> Any:
    """Whole floats as ints (2, not 2.0): the same number, and as a human writes it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _tidy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_tidy(item) for item in value]
    return value


def crd(resource: Resource) -> dict[str, Any]:
    """The CustomResourceDefinition of one resource."""
    spec = structural(resource.spec)
    status = structural(resource.status)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{v1alpha1.GROUP}"},
        "spec": {
            "group": v1alpha1.GROUP,
            "scope": resource.scope,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": list(resource.short_names),
                "categories": ["cellplane"],
            },
            "versions": [{
                "name": v1alpha1.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [column.render() for column in resource.columns],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": resource.description,
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": status,
                    },
                    **({"x-kubernetes-validations": [
                        {key: rule[key] for key in _RULE_KEYS if key in rule}
                        for rule in (r.as_schema() for r in resource.name_rules)]}
                       if resource.name_rules else {}),
                }},
            }],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, keys in insertion order, no anchors, multi-line text as ``|``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(resource: Resource) -> str:
    """The file's text: a header saying where it comes from, then the CRD."""
    summary = textwrap.wrap(f"{resource.kind}: {resource.description}", width=90)
    header = (
        "".join(f"# {line}\n" for line in summary)
        + "#\n"
        "# GENERATED from the pydantic models in operator/cellplane_operator/api/v1alpha1.py\n"
        "# by operator/cellplane_operator/api/crdgen.py. Do not edit: change the models, then\n"
        "#   .venv/bin/python -m cellplane_operator.api.crdgen\n"
    )
    body = yaml.dump(crd(resource), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=10_000)
    return header + body


def default_output_dir() -> Path:
    """``crds/`` of the checkout this module lives in."""
    return Path(__file__).resolve().parents[3] / "crds"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellplane_operator.api.crdgen",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with a diff if a file differs")
    parser.add_argument("--output-dir", type=Path, default=default_output_dir())
    args = parser.parse_args(argv)
    stale = 0
    for resource in RESOURCES:
        path: Path = args.output_dir / resource.file_name
        wanted = render(resource)
        current = path.read_text() if path.exists() else ""
        if current == wanted:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                fromfile=f"{path} (committed)", tofile=f"{path} (generated)"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted)
            print(f"wrote {path}")
    if stale:
        print(f"\n{stale} CRD file(s) are stale; regenerate with: "
              ".venv/bin/python -m cellplane_operator.api.crdgen", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
