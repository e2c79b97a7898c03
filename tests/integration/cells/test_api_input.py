"""Whatever a client sends the cell's two APIs is answered 4xx JSON, never a 500.

Found by outside testing: JSON the database cannot store (NaN, Infinity,
1e400, NUL, lone surrogates) was a 500 with a traceback; ``"steps": true``
was taken as 1; a duplicate API key on the admin API was a 500; the admin
OpenAPI and docs were served without the token, and a token without
``Bearer`` was accepted. The real app over a real cell database.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cellapi import ADMIN_TOKEN, Cell
from cellfixtures import fetch


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


UNSTORABLE_BODIES = {
    "NaN": b'{"target": "default", "payload": NaN}',
    "Infinity": b'{"target": "default", "payload": {"x": Infinity}}',
    "-Infinity": b'{"target": "default", "payload": [-Infinity]}',
    "1e400": b'{"target": "default", "payload": 1e400}',
    "NUL in a value": b'{"target": "default", "payload": "a\\u0000b"}',
    "NUL in a key": b'{"target": "default", "payload": {"a\\u0000": 1}}',
    "lone high surrogate": b'{"target": "default", "payload": "\\ud800"}',
    "lone low surrogate in a key": b'{"target": "default", "payload": {"\\udc00": 1}}',
    "too deep": b'{"target": "default", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "too many digits": b'{"target": "default", "payload": ' + b"9" * 5000 + b"}",
    "not UTF-8": b'{"target": "default", "payload": "\xff"}',
}


@pytest.mark.parametrize("body", list(UNSTORABLE_BODIES.values()), ids=list(UNSTORABLE_BODIES))
def test_json_the_database_cannot_store_is_a_422_and_writes_nothing(cell: Cell, body: bytes) -> None:
    auth = cell.tenant("acme")
    answer = cell.api.post("/v1/jobs", content=body, headers={
        **auth, "Idempotency-Key": "k", "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
    assert fetch(cell.conninfo, "SELECT count(*) FROM jobs") == [(0,)]


def test_a_surrogate_pair_is_a_character_not_an_error(cell: Cell) -> None:
    auth = cell.tenant("acme")
    answer = cell.api.post("/v1/jobs", content=b'{"target": "default", "payload": "\\ud83d\\ude00"}',
                           headers={**auth, "Idempotency-Key": "k",
                                    "Content-Type": "application/json"})
    assert answer.status_code == 202, answer.text
    assert fetch(cell.conninfo, "SELECT payload #>> '{}' FROM jobs") == [("\U0001F600",)]


def test_admin_bodies_go_through_the_same_parser(cell: Cell) -> None:
    cell.tenant("acme")
    for body in (b'{"amount": NaN}', b'{"amount": 1e400}'):
        answer = cell.admin.post("/admin/v1/tenants/acme/wallet:credit", content=body,
                                 headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, answer.text
    bundle = b'{"epoch": 1, "bundle": {"tenant": {"tenant_id": "acme", "plan": "pro\\u0000"}}}'
    answer = cell.admin.post("/admin/v1/tenants/acme/import", content=bundle,
                             headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("field, value", [
    ("steps", True), ("steps", 1.0), ("steps", "2"), ("max_attempts", False),
    ("estimate", "10"), ("target", 5), ("expires_in_seconds", True),
])
def test_fields_take_their_own_type_only(cell: Cell, field: str, value: object) -> None:
    auth = cell.tenant("acme")
    answer = cell.submit(auth, "k", **{field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"][0]["field"] == f"body.{field}"
    assert fetch(cell.conninfo, "SELECT count(*) FROM jobs") == [(0,)]


def test_admin_fields_take_their_own_type_only(cell: Cell) -> None:
    cell.tenant("acme")
    answer = cell.admin.post("/admin/v1/tenants/acme/wallet:credit", json={"amount": True})
    assert answer.status_code == 422, answer.text
    answer = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "burst": "5"})
    assert answer.status_code == 422, answer.text
    # Floats take integers (JSON has one number type), and the plan its names.
    answer = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "jobs_per_second": 3})
    assert answer.status_code == 200, answer.text


def test_a_duplicate_api_key_is_a_409_that_names_the_field(cell: Cell) -> None:
    key = "cpk_acme.0123456789abcdefghijklmnop"
    assert cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "api_key": key}
                          ).status_code == 200
    answer = cell.admin.put("/admin/v1/tenants/globex", json={"plan": "pro", "api_key": key})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "api_key_in_use"
    assert fetch(cell.conninfo, "SELECT tenant_id FROM tenants") == [("acme",)]
    # The same key again for its own tenant is no conflict.
    assert cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "api_key": key}
                          ).status_code == 200


def test_the_admin_api_serves_nothing_without_its_bearer_token(cell: Cell) -> None:
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect",
                 "/admin/v1/openapi.json"):
        answer = cell.admin.get(path, headers={"Authorization": ""})
        assert answer.status_code in (401, 404), (path, answer.status_code)
        assert answer.json()["error"]["code"] in ("unauthenticated", "not_found")
    # The token without its scheme is not a bearer token.
    for header in (ADMIN_TOKEN, f"Basic {ADMIN_TOKEN}", f"Bearer{ADMIN_TOKEN}",
                   f"Bearer  {ADMIN_TOKEN}x"):
        answer = cell.admin.get("/admin/v1/health", headers={"Authorization": header})
        assert answer.status_code == 401, header
        assert answer.json()["error"]["code"] == "unauthenticated"
    # The admin OpenAPI document is there for the token's holder.
    document = cell.admin.get("/admin/v1/openapi.json")
    assert document.status_code == 200
    assert "/admin/v1/tenants/{tenant_id}" in document.json()["paths"]
    assert cell.admin.get("/admin/v1/health", headers={
        "Authorization": f"bearer {ADMIN_TOKEN}"}).status_code == 200


@pytest.mark.parametrize("path", [
    "/v1/jobs?cursor=%00", "/v1/jobs?status=%01", "/v1/jobs/%00", "/v1/jobs/a%0Ab:cancel",
    "/v1/jobs?limit=%7F",
])
def test_control_characters_in_the_path_or_query_are_a_400(cell: Cell, path: str) -> None:
    auth = cell.tenant("acme")
    method = "POST" if path.endswith(":cancel") else "GET"
    answer = cell.api.request(method, path, headers=auth)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


def test_admin_query_parameters_with_control_characters_are_a_400(cell: Cell) -> None:
    cell.tenant("acme")
    for path in ("/admin/v1/tenants/acme/move-out?move_id=%00",
                 "/admin/v1/tenants/acme/move-in?move_id=a%00b"):
        answer = cell.admin.delete(path)
        assert answer.status_code == 400, answer.text
    answer = cell.admin.get("/admin/v1/tenants/acme/move-out/rows?table=jobs&after=%00")
    assert answer.status_code == 400, answer.text


@pytest.mark.parametrize("key", ["a\x7fb", "tab\there", "x" * 256, "caf\u00e9"])
def test_an_idempotency_key_is_printable_ascii_of_bounded_length(cell: Cell, key: str) -> None:
    auth = cell.tenant("acme")
    headers = [(k.encode(), v.encode()) for k, v in auth.items()]
    answer = cell.api.post("/v1/jobs", json={"target": "default", "payload": {}},
                           headers=[*headers, (b"Idempotency-Key", key.encode("latin-1"))])
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


def test_a_payload_nests_at_most_64_levels_so_an_export_of_it_still_parses(cell: Cell) -> None:
    auth = cell.tenant("acme")
    deep: object = {}
    for _ in range(63):
        deep = [deep]
    assert cell.submit(auth, "deep-64", payload=deep).status_code == 202
    refused = cell.submit(auth, "deep-65", payload=[deep])
    assert refused.status_code == 422, refused.text
    assert "64 levels" in refused.json()["error"]["fields"][0]["problem"]
    # The tenant's export carries the payload deeper, and still parses as a body.
    bundle = cell.admin.get("/admin/v1/tenants/acme/export")
    assert bundle.status_code == 200
    assert cell.admin.post("/admin/v1/tenants/acme/import", json={
        "epoch": 1, "bundle": bundle.json()}).status_code == 200


@pytest.mark.parametrize("bundle", [
    {"tenant": {"tenant_id": "acme", "plan": "no-such-plan"}},
    {"tenant": {"tenant_id": "acme"}, "jobs": [{"job_id": "not-a-uuid"}]},
    {"tenant": {"tenant_id": "acme"}, "wallet": {"available": "lots"}},
    {"tenant": {"tenant_id": "acme", "max_running_jobs": 10**30}},
    {"tenant": {"tenant_id": "acme", "plan": "pro", "max_running": 10**30}},
])
def test_a_malformed_bundle_is_refused_as_the_clients_fault(
        cell: Cell, bundle: dict[str, object]) -> None:
    """Values that reach a statement and are refused there (a bad uuid, a number out of
    range, a missing column) are the request's fault: 4xx, and nothing is imported."""
    answer = cell.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 1, "bundle": bundle})
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]["code"] in ("invalid_request", "invalid_bundle", "conflict")
    assert fetch(cell.conninfo, "SELECT count(*) FROM tenants") == [(0,)]
