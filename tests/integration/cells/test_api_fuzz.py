"""Schema fuzzing of the tenant API's OpenAPI: whatever schemathesis sends, never a 5xx.

Requests are generated from the served OpenAPI document (valid and invalid
bodies, odd headers, SQL and Unicode in every string) and sent with a real
tenant key to the app over a real cell database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from cellapi import ADMIN_TOKEN, Cell
from cellfixtures import fetch


@pytest.fixture
def fuzz_cell(cell_db: str) -> Iterator[tuple[Cell, dict[str, str]]]:
    cell = Cell(cell_db)
    auth = cell.tenant("acme", burst=200, jobs_per_second=20.0)
    yield cell, auth
    cell.close()


def test_no_request_makes_the_api_fail(fuzz_cell: tuple[Cell, dict[str, str]]) -> None:
    # schemathesis' own pytest plugin does not run under pytest 9 yet; its
    # strategies do, driven by hypothesis directly, one operation at a time.
    cell, auth = fuzz_cell
    api_schema = schemathesis.openapi.from_asgi("/openapi.json", cell.api.app)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v1/jobs", "GET /v1/jobs", "GET /v1/jobs/{job_id}", "POST /v1/jobs/{job_id}:cancel"}
    statuses = _no_server_error(operations, auth["Authorization"], max_examples=60)
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
    # Whatever was accepted is whole: every job has its steps, key and reservation.
    assert fetch(cell.conninfo,
                 "SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM job_steps s"
                 " WHERE s.job_id = j.job_id) OR NOT EXISTS (SELECT 1 FROM idempotency_keys k"
                 " WHERE k.job_id = j.job_id) OR NOT EXISTS (SELECT 1 FROM ledger l"
                 " WHERE l.job_id = j.job_id AND l.kind = 'reserve')") == [(0,)]


def test_no_request_makes_the_admin_api_fail(fuzz_cell: tuple[Cell, dict[str, str]]) -> None:
    """The admin API's own OpenAPI document (served to the token's holder only), fuzzed
    with the token: whatever the operator, or anyone holding the token, sends is 4xx JSON
    at worst (a duplicate API key and strings the database cannot store were 500s)."""
    cell, _ = fuzz_cell
    token = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    api_schema = schemathesis.openapi.from_asgi("/admin/v1/openapi.json", cell.admin.app,
                                                headers=token)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 20
    statuses = _no_server_error(operations, token["Authorization"], max_examples=25)
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)


def _no_server_error(operations: list[Any], authorization: str, *, max_examples: int) -> list[int]:
    """Runs generated cases of every operation; each answer is below 500, and a refusal is
    the API's JSON error. Returns the statuses seen."""
    statuses: list[int] = []
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        def no_server_error(case: Any) -> None:
            headers = dict(case.headers or {})
            headers.setdefault("Authorization", authorization)
            response = case.call(headers=headers)
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if response.status_code >= 400:
                assert "code" in response.json()["error"]

        no_server_error()
    return statuses
