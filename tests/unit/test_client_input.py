"""The one reading of a client's input (cells/cellplane_cells/domain/client_input.py)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from fastapi.routing import APIRoute
from hypothesis import given, strategies as st

from cellplane_cells.api.tenant_app import create_tenant_app
from cellplane_cells.domain.client_input import (
    TENANT_API_ROUTES, MAX_JSON_DEPTH, RouteMatch, bearer_token, has_control_character, json_depth, loads_storable,
    match_tenant_route,
)


@pytest.mark.parametrize("raw", [
    b"NaN", b"[Infinity]", b'{"a": -Infinity}', b"1e400", b"-1e400", b'"\\u0000"',
    b'{"\\u0000": 1}', b'"\\ud800"', b'["\\udfff"]', b'{"\\udc00x": 0}', b"9" * 5000,
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), b"[" * 100_000, b'"\xff"',
    b"{", b"",
])
def test_what_the_database_cannot_store_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads_storable(raw)


def test_storable_documents_parse_as_usual() -> None:
    assert loads_storable(b'{"a": [1, 2.5, "\\ud83d\\ude00", null, true]}') == {
        "a": [1, 2.5, "\U0001F600", None, True]}
    assert loads_storable(b"1.7976931348623157e308") == 1.7976931348623157e308
    nested = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert json_depth(loads_storable(nested)) == MAX_JSON_DEPTH


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [key, *_strings(item)]]
    return []


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                    max_leaves=20))
def test_a_value_round_trips_unless_a_string_holds_nul_or_a_surrogate(value: object) -> None:
    raw = json.dumps(value).encode()
    unstorable = any("\x00" in s or any(0xD800 <= ord(c) <= 0xDFFF for c in s)
                     for s in _strings(value))
    if unstorable:
        with pytest.raises(json.JSONDecodeError):
            loads_storable(raw)
    else:
        assert loads_storable(raw) == value


@pytest.mark.parametrize("header, token", [
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("BEARER  abc ", "abc"),
    ("abc", None), ("Basic abc", None), ("Bearerabc", None), ("Bearer ", None),
    ("Bearer a b", None), ("", None), (None, None),
])
def test_only_a_bearer_token_is_a_credential(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_control_characters() -> None:
    assert has_control_character("a\x00b") and has_control_character("\n")
    assert has_control_character("\x7f")
    assert not has_control_character("jobs/abc:cancel é")


@pytest.mark.parametrize("method, path, match", [
    ("POST", "/v1/jobs", RouteMatch.ROUTE),
    ("GET", "/v1/jobs", RouteMatch.ROUTE),
    ("GET", "/v1/jobs/3f2a", RouteMatch.ROUTE),
    ("post", "/v1/jobs/3f2a:cancel", RouteMatch.ROUTE),
    ("DELETE", "/v1/jobs", RouteMatch.WRONG_METHOD),
    ("PUT", "/v1/jobs/3f2a", RouteMatch.WRONG_METHOD),
    ("GET", "/v1/../openapi.json", RouteMatch.NO_ROUTE),
    ("GET", "/v1/jobs/..", RouteMatch.NO_ROUTE),
    ("POST", "/v1/jobs/..:cancel", RouteMatch.ROUTE),
    ("POST", "/v1/jobs/:cancel", RouteMatch.WRONG_METHOD),  # GET /v1/jobs/{job_id}, as at the cell
    ("GET", "/v1/jobs/", RouteMatch.NO_ROUTE),
    ("GET", "/v1/jobs/a/b", RouteMatch.NO_ROUTE),
    ("GET", "/openapi.json", RouteMatch.NO_ROUTE),
    ("GET", "/v1/docs", RouteMatch.NO_ROUTE),
])
def test_only_the_tenant_api_routes_match(method: str, path: str, match: RouteMatch) -> None:
    assert match_tenant_route(method, path) is match


def test_the_route_table_is_the_tenant_apps_own() -> None:
    """The router forwards TENANT_API_ROUTES and nothing else: a route added to the app
    and not to the table would be unreachable through the router, and the reverse open."""
    app = create_tenant_app(cast(Any, None))
    served = {(method, route.path) for route in app.routes if isinstance(route, APIRoute)
              for method in route.methods}
    assert served == set(TENANT_API_ROUTES)
