"""The router reads a cell's error code from whatever JSON a 503 carries."""

from __future__ import annotations

import httpx

from cellplane_operator.router.app import _code


def test_an_error_code_is_read_from_any_shape_of_answer() -> None:
    assert _code(httpx.Response(503, json={"error": {"code": "tenant_moving"}})) == "tenant_moving"
    assert _code(httpx.Response(503, json=["not", "an", "object"])) is None
    assert _code(httpx.Response(503, json={"error": "a string"})) is None
    assert _code(httpx.Response(503, json={"error": {}})) is None
    assert _code(httpx.Response(503, content=b"<html>bad gateway</html>")) is None
