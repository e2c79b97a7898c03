"""Cells, Tenants and TenantMoves as the controllers read them: parsed once, frozen.

kopf delivers each object as a dict. The cache parses it here, once, into a
typed view: the metadata the controllers act on, the spec as its model (with the
defaults the apiserver applied) or the reason it cannot be read, and the status
as its model. Controllers read these views and never index into dicts; the dict
itself stays on the view only for the writes that send it back (finalizers,
Events' involved object).

A spec that does not parse is not an exception here: it is data (``spec_problem``)
that the controller reports as a condition, as it would any other semantic problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from cellplane_operator.api import v1alpha1
from cellplane_operator.placement.records import TenantKey

__all__ = ["ObjectMeta", "CellObject", "TenantObject", "MoveObject", "body_of"]


@dataclass(frozen=True)
class ObjectMeta:
    name: str
    namespace: str | None
    uid: str
    generation: int
    resource_version: str
    deleting: bool
    """deletionTimestamp is set: the object waits on its finalizers."""
    finalizers: tuple[str, ...]
    annotations: Mapping[str, str]
    labels: Mapping[str, str]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ObjectMeta:
        meta = body["metadata"]
        return cls(
            name=meta["name"], namespace=meta.get("namespace"), uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
            resource_version=str(meta.get("resourceVersion", "")),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(meta.get("finalizers") or ()),
            annotations=dict(meta.get("annotations") or {}),
            labels=dict(meta.get("labels") or {}))


def _problem(error: ValidationError | ValueError) -> str:
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'spec'}: {e['msg']}"
                         for e in error.errors())
    return str(error)


@dataclass(frozen=True)
class CellObject:
    meta: ObjectMeta
    spec: v1alpha1.CellSpec | None
    """None when the stored spec cannot be read; ``spec_problem`` says why."""
    spec_problem: str | None
    status: v1alpha1.CellStatus
    body: dict[str, Any] = field(repr=False, compare=False)
    """The object as the apiserver sent it, for the writes that send it back."""

    @property
    def name(self) -> str:
        return self.meta.name

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> CellObject:
        spec: v1alpha1.CellSpec | None = None
        problem: str | None = None
        try:
            spec = v1alpha1.CellSpec.model_validate(body.get("spec") or {})
        except ValidationError as error:
            problem = _problem(error)
        return cls(meta=ObjectMeta.from_body(body), spec=spec, spec_problem=problem,
                   status=_status(v1alpha1.CellStatus, body), body=dict(body))


@dataclass(frozen=True)
class TenantObject:
    meta: ObjectMeta
    spec: v1alpha1.TenantSpec | None
    spec_problem: str | None
    status: v1alpha1.TenantStatus
    body: dict[str, Any] = field(repr=False, compare=False)

    @property
    def key(self) -> TenantKey:
        return TenantKey(self.meta.namespace or "", self.meta.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TenantObject:
        spec: v1alpha1.TenantSpec | None = None
        problem: str | None = None
        try:
            spec = v1alpha1.TenantSpec.model_validate(body.get("spec") or {})
        except ValidationError as error:
            problem = _problem(error)
        return cls(meta=ObjectMeta.from_body(body), spec=spec, spec_problem=problem,
                   status=_status(v1alpha1.TenantStatus, body), body=dict(body))


@dataclass(frozen=True)
class MoveObject:
    meta: ObjectMeta
    spec: v1alpha1.TenantMoveSpec | None
    spec_problem: str | None
    status: v1alpha1.TenantMoveStatus
    body: dict[str, Any] = field(repr=False, compare=False)

    @property
    def key(self) -> TenantKey:
        """TenantMoves are keyed as tenants are: (namespace, name)."""
        return TenantKey(self.meta.namespace or "", self.meta.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> MoveObject:
        spec: v1alpha1.TenantMoveSpec | None = None
        problem: str | None = None
        try:
            spec = v1alpha1.TenantMoveSpec.model_validate(body.get("spec") or {})
        except ValidationError as error:
            problem = _problem(error)
        return cls(meta=ObjectMeta.from_body(body), spec=spec, spec_problem=problem,
                   status=_status(v1alpha1.TenantMoveStatus, body), body=dict(body))


_Status = TypeVar("_Status", v1alpha1.CellStatus, v1alpha1.TenantStatus,
                   v1alpha1.TenantMoveStatus)


def _status(model: type[_Status], body: Mapping[str, Any]) -> _Status:
    """The status as its model; one the operator cannot read (written by a newer or a
    broken writer) reads as empty, and the next status write replaces it."""
    try:
        return model.model_validate(body.get("status") or {})
    except ValidationError:
        return model()


def body_of(found: CellObject | TenantObject | MoveObject | None) -> dict[str, Any] | None:
    """The object as the apiserver sent it, for code that still reads the dict."""
    return None if found is None else found.body
