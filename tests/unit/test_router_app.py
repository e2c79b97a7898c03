"""The edge router's gates, in-process: what it refuses, and how much of a body it reads first.

The cell behind it is the cell API's port played by httpx's MockTransport,
which records what reached it; the placement map is filled as the watcher
fills it from etcd. The real router in front of a real cell: test_router.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import pytest

from cellplane_cells.domain.client_input import INVALID_KEY_MESSAGE, TENANT_BODY_LIMIT_BYTES
from cellplane_operator.domain.routing import key_digest
from cellplane_operator.router.app import RouterSettings, create_router_app
from cellplane_operator.router.watcher import PlacementWatcher
from cellplane_operator.store import EtcdStore

KEY = "cpk_acme.s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Harness:
    def __init__(self) -> None:
        self.reached: list[httpx.Request] = []
        watcher = PlacementWatcher(cast(EtcdStore, None))
        for revision, (key, value) in enumerate([
            ("/cellplane/tenants/ns/acme", {"tenantId": "acme", "cell": "c1", "epoch": 1,
                                            "keyDigest": key_digest(KEY)}),
            # Placed before its key existed: the cell checks its keys.
            ("/cellplane/tenants/ns/early", {"tenantId": "early", "cell": "c1", "epoch": 1}),
            ("/cellplane/groups/c1/owner", {"region": "r1", "epoch": 1}),
            ("/cellplane/cells/c1/sites/r1", {"endpoints": {"api": "http://cell.test"},
                                              "serving": True}),
        ], start=1):
            watcher.map.apply(key, json.dumps(value).encode(), revision)

        def cell(request: httpx.Request) -> httpx.Response:
            self.reached.append(request)
            return httpx.Response(200, json={"path": request.url.raw_path.decode()},
                                  headers={"server": "uvicorn", "date": "Mon, 1 Jan 2026"})

        self.upstream = httpx.AsyncClient(transport=httpx.MockTransport(cell))
        app = create_router_app(watcher, self.upstream, RouterSettings(hold_seconds=0.1))
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                        base_url="http://router.test")

    async def close(self) -> None:
        await self.client.aclose()
        await self.upstream.aclose()


def run(test: Any) -> None:
    async def main() -> None:
        harness = Harness()
        try:
            await test(harness)
        finally:
            await harness.close()

    asyncio.run(main())


class CountingBody:
    """A 100 MB body made on demand, counting what the router pulled of it."""

    def __init__(self, total: int = 100 * 1024 * 1024, chunk: int = 64 * 1024) -> None:
        self.total, self.chunk, self.pulled = total, chunk, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.pulled < self.total:
            self.pulled += self.chunk
            yield b"x" * self.chunk


def test_a_chunked_body_is_read_only_up_to_the_limit() -> None:
    async def test(h: Harness) -> None:
        body = CountingBody()
        answer = await h.client.post("/v1/jobs", content=body,
                                     headers={**AUTH, "Idempotency-Key": "k"})
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "body_too_large"
        assert body.pulled <= TENANT_BODY_LIMIT_BYTES + body.chunk
        assert not h.reached

    run(test)


def test_a_declared_oversize_body_is_refused_before_a_byte_is_read() -> None:
    async def test(h: Harness) -> None:
        body = CountingBody()
        answer = await h.client.post("/v1/jobs", content=body, headers={
            **AUTH, "Idempotency-Key": "k", "Content-Length": str(body.total)})
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "body_too_large"
        assert body.pulled == 0

    run(test)


@pytest.mark.parametrize("authorization", ["Bearer cpk_nobody.s3cret", "Bearer not-a-key",
                                           "Bearer cpk_acme.wrong",
                                           "Bearer cpk_acme", None, KEY, "Basic abc"])
def test_a_key_of_no_placed_tenant_is_refused_before_a_byte_is_read(
        authorization: str | None) -> None:
    async def test(h: Harness) -> None:
        body = CountingBody()
        headers = {"Authorization": authorization} if authorization else {}
        answer = await h.client.post("/v1/jobs", content=body, headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthenticated"
        assert body.pulled == 0 and not h.reached

    run(test)


def test_an_unknown_tenant_and_a_wrong_secret_get_the_same_answer_from_the_router() -> None:
    async def test(h: Harness) -> None:
        unknown = await h.client.get("/v1/jobs", headers={"Authorization": "Bearer cpk_nobody.x"})
        wrong = await h.client.get("/v1/jobs", headers={"Authorization": "Bearer cpk_acme.x"})
        assert unknown.status_code == wrong.status_code == 401
        assert unknown.json() == wrong.json() == {"error": {"code": "unauthenticated",
                                                            "message": INVALID_KEY_MESSAGE}}
        assert sorted(unknown.headers.items()) == sorted(wrong.headers.items())
        assert not h.reached

    run(test)


def test_a_tenant_whose_record_has_no_key_digest_is_checked_by_its_cell() -> None:
    async def test(h: Harness) -> None:
        answer = await h.client.get("/v1/jobs", headers={"Authorization": "Bearer cpk_early.x"})
        assert answer.status_code == 200
        assert len(h.reached) == 1

    run(test)


@pytest.mark.parametrize("path", [
    "/v1/%2e%2e/openapi.json", "/v1/%2E%2E/docs", "/openapi.json", "/docs", "/v1/jobs/..",
    "/v1/jobs/%2e%2e", "/v1/jobs/a/b", "/v1/jobs/", "/v1//jobs", "/admin/v1/health",
    "/v1/jobs%2f..%2f..%2fopenapi.json",
])
def test_only_the_tenant_apis_own_routes_are_forwarded(path: str) -> None:
    async def test(h: Harness) -> None:
        answer = await h.client.get(path, headers=AUTH)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "not_found"
        assert not h.reached

    run(test)


@pytest.mark.parametrize("path", ["/v1/jobs/%00", "/v1/jobs/a%0ab", "/v1/jobs?cursor=%00",
                                  "/v1/jobs?status=%7f", "/v1/jobs/%1b:cancel"])
def test_a_control_character_in_the_path_or_query_is_a_400(path: str) -> None:
    async def test(h: Harness) -> None:
        method = "POST" if path.endswith(":cancel") else "GET"
        answer = await h.client.request(method, path, headers=AUTH)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"
        assert not h.reached

    run(test)


def test_a_tenant_route_is_forwarded_with_its_path_encoded_as_it_came() -> None:
    async def test(h: Harness) -> None:
        for method, path, upstream in [
            ("GET", "/v1/jobs/a%3Fb", "/v1/jobs/a%3Fb"),
            ("GET", "/v1/jobs/a%2Fb", None),  # decoded, a%2Fb is two segments: no route
            ("POST", "/v1/jobs/abc:cancel", "/v1/jobs/abc:cancel"),
            ("GET", "/v1/jobs?status=queued&limit=2", "/v1/jobs?status=queued&limit=2"),
        ]:
            answer = await h.client.request(method, path, headers=AUTH)
            if upstream is None:
                assert answer.status_code == 404
                continue
            assert answer.status_code == 200, (path, answer.text)
            assert answer.json()["path"] == upstream
            # One Server and one Date: the router's own, never the cell's as well.
            assert "server" not in answer.headers and "date" not in answer.headers

    run(test)


def test_a_method_the_route_does_not_take_is_a_405_json() -> None:
    async def test(h: Harness) -> None:
        answer = await h.client.delete("/v1/jobs", headers=AUTH)
        assert answer.status_code == 405
        assert answer.json()["error"]["code"] == "method_not_allowed"
        answer = await h.client.request("TRACE", "/v1/jobs", headers=AUTH)
        assert answer.status_code == 405
        assert answer.json()["error"]["code"] == "method_not_allowed"

    run(test)


def test_headers_that_are_not_ascii_are_forwarded_as_they_came() -> None:
    async def test(h: Harness) -> None:
        answer = await h.client.get("/v1/jobs", headers=[
            (b"Authorization", f"Bearer {KEY}".encode()), (b"X-Note", b"caf\xe9")])
        assert answer.status_code == 200, answer.text
        assert (b"x-note", b"caf\xe9") in [(k.lower(), v) for k, v in h.reached[0].headers.raw]

    run(test)
