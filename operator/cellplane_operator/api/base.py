"""The building blocks of the API models: one base class and the schema annotations.

The models in ``v1alpha1`` are the single source of both the operator's parsing
and the CRDs (``crdgen`` turns their JSON schema into OpenAPI v3). What JSON
schema cannot say for Kubernetes -- CEL rules, list semantics, int64 formats --
is attached here as ``json_schema_extra``, so a rule sits next to the field it
guards and there is no second schema to keep in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

__all__ = [
    "ApiModel",
    "API_CONFIG",
    "Rule",
    "cel",
    "list_map",
    "list_set",
    "empty_object_default",
    "DNS_LABEL_PATTERN",
    "DnsLabel",
    "DNS_SUBDOMAIN_PATTERN",
    "DnsSubdomain",
    "QUANTITY_PATTERN",
    "Quantity",
    "HttpUrl",
    "Integer",
    "Int64",
]

API_CONFIG = ConfigDict(
    alias_generator=to_camel,
    populate_by_name=True,
    # Objects read back from the apiserver may carry fields a newer schema
    # added; an older operator must still read them.
    extra="ignore",
    # Field docstrings become the CRD's descriptions.
    use_attribute_docstrings=True,
    frozen=True,
)


class ApiModel(BaseModel):
    """A part of a cellplane.io resource: camelCase on the wire, snake_case in Python."""

    model_config = API_CONFIG


@dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` entry: a CEL rule the apiserver enforces."""

    rule: str
    message: str
    field_path: str | None = None
    """Reported as the failing field (e.g. ``.quotas.burst``) instead of the object."""
    message_expression: str | None = None

    def as_schema(self) -> JsonDict:
        rendered: JsonDict = {"rule": self.rule, "message": self.message}
        if self.message_expression is not None:
            rendered["messageExpression"] = self.message_expression
        if self.field_path is not None:
            rendered["fieldPath"] = self.field_path
        return rendered


def cel(*rules: Rule) -> JsonDict:
    """``json_schema_extra`` for a field or a model that carries CEL rules."""
    return {"x-kubernetes-validations": [rule.as_schema() for rule in rules]}


def list_map(*keys: str) -> JsonDict:
    """A list whose items are identified by ``keys``: server-side apply merges by them."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def list_set() -> JsonDict:
    """A list of unique scalars: the apiserver refuses duplicates."""
    return {"x-kubernetes-list-type": "set"}


def empty_object_default() -> JsonDict:
    """The CRD default ``{}`` for a nested object, which the apiserver then fills
    field by field from the nested defaults: the same result as the model's
    ``default_factory``, and a new nested field needs no second default."""
    return {"default": {}}


DNS_LABEL_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""An RFC 1123 label: region, cell and tenant names. The length bound also keeps
the CEL cost estimate of rules over such strings low."""

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""An RFC 1123 subdomain: the names of most Kubernetes objects (a StorageClass's)."""

QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
"""A non-negative Kubernetes resource quantity (``500m``, ``1.5Gi``, ``2``, ``1e3``): the
apiserver's own grammar without the sign, so CEL's ``quantity()`` reads every value the
pattern admits."""

Quantity = Annotated[str, Field(min_length=1, max_length=32, pattern=QUANTITY_PATTERN)]
"""CPU, memory and storage amounts, as a Pod's ``resources`` and a claim's size take them."""

HttpUrl = Annotated[str, Field(max_length=2048, pattern="^https?://")]
"""A URL the cell calls: checked here for scheme only; the cell resolves and
vets the host (private targets are refused unless the driver allows them)."""

Integer = Annotated[int, Strict()]
"""Every integer field: ``1.0`` is refused, as the CRD refuses it (``crdgen``'s
whole-number rule). Lax pydantic took it, while a CEL rule reading the field
made the apiserver refuse it: the two disagreed."""

Int64 = Annotated[int, Strict(), Field(json_schema_extra={"format": "int64"})]
"""Generations and epochs: counters that only grow."""
