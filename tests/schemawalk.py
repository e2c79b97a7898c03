"""Walks a manifest against a CRD's OpenAPI schema: the fields the schema does not know
(the apiserver would prune them silently, so a test of a manifest wants them named)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def unknown_fields(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    if isinstance(value, dict):
        known = schema.get("properties", {})
        for key, item in value.items():
            if key not in known:
                yield f"{path}.{key}"
            else:
                yield from unknown_fields(item, known[key], f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from unknown_fields(item, schema.get("items", {}), f"{path}[{index}]")
