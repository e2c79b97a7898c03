"""The operator's client of a cell's admin API: tenants, quotas, targets and webhooks,
and the steps of a tenant move (cells/cellplane_cells/moves.py has their contract).

``CellAdmin`` is the port the controllers depend on; ``CellAdminClient`` the adapter
over HTTP, ``cellmemory.InMemoryCells`` the fake for unit tests (tests/cellcontract.py
holds both to the same answers). Every call is idempotent (PUT, or DELETE answering 204
when already gone), so a reconcile that is repeated after a crash repeats them safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from cellplane_operator.errors import CellApiError

__all__ = ["CellAdmin", "CellAdminClient"]


class CellAdmin(Protocol):
    """A cell's admin API as the operator uses it. ``admin`` is the cell's admin base URL
    (its Cell's ``status.endpoints.admin``), ``token`` its admin token. A refusal raises
    ``CellApiError`` with the HTTP status and the cell's error code and message; a cell
    that does not answer raises it with ``status`` 0."""

    async def put_tenant(self, admin: str, token: str, tenant_id: str,
                         body: dict[str, Any]) -> None:
        """Creates the tenant or updates its plan and quotas (``plan``, ``api_key``,
        ``max_running_jobs``...); a retained tenant becomes active again."""

    async def put_target(self, admin: str, token: str, tenant_id: str, name: str,
                         url: str) -> None: ...

    async def put_webhook(self, admin: str, token: str, tenant_id: str, url: str, secret: str,
                          max_concurrency: int) -> None: ...

    async def put_endpoints(self, admin: str, token: str, tenant_id: str,
                            targets: Sequence[tuple[str, str]], webhooks: Sequence[tuple[str, int]],
                            webhook_secret: str) -> dict[str, int]:
        """The whole set replaces the old; answers ``targets_removed`` and
        ``webhooks_removed``. A refused URL is code ``target_refused`` naming its field."""

    async def refused_endpoints(self, admin: str, token: str, targets: Sequence[tuple[str, str]],
                                webhooks: Sequence[str]) -> list[dict[str, str]]: ...

    async def delete_tenant(self, admin: str, token: str, tenant_id: str, *, purge: bool) -> None:
        """Retain: the rows stay, disabled; purge: they go. Done also when already gone."""

    async def start_move_out(self, admin: str, token: str, tenant_id: str, move_id: str
                             ) -> dict[str, int]: ...

    async def move_out_rows(self, admin: str, token: str, tenant_id: str, table: str,
                            after: str | None, limit: int) -> tuple[list[Any], str | None]: ...

    async def move_out_changes(self, admin: str, token: str, tenant_id: str, after: int,
                               limit: int) -> dict[str, Any]: ...

    async def freeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              epoch: int, *, within_seconds: float | None = None) -> None: ...

    async def unfreeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                                epoch: int) -> None: ...

    async def finish_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              retain_seconds: int) -> None: ...

    async def cancel_move_out(self, admin: str, token: str, tenant_id: str,
                              move_id: str) -> None: ...

    async def move_in(self, admin: str, token: str, tenant_id: str, move_id: str, epoch: int, *,
                      rows: dict[str, list[Any]], deletes: dict[str, list[Any]] | None = None
                      ) -> dict[str, int]: ...

    async def activate_move_in(self, admin: str, token: str, tenant_id: str,
                               move_id: str) -> None: ...

    async def cancel_move_in(self, admin: str, token: str, tenant_id: str,
                             move_id: str) -> None: ...

    async def checksums(self, admin: str, token: str, tenant_id: str
                        ) -> dict[str, dict[str, Any]]:
        """Rows and checksum per table of the tenant; ``not_found`` (404) if it is not here."""

    async def close(self) -> None: ...


class CellAdminClient:
    def __init__(self, *, timeout_seconds: float = 5.0) -> None:
        self._http = httpx.AsyncClient(timeout=timeout_seconds)

    async def close(self) -> None:
        await self._http.aclose()

    async def put_tenant(self, admin: str, token: str, tenant_id: str, body: dict[str, Any]) -> None:
        await self._call("PUT", f"{admin}/admin/v1/tenants/{tenant_id}", token, body)

    async def put_target(self, admin: str, token: str, tenant_id: str, name: str, url: str) -> None:
        await self._call("PUT", f"{admin}/admin/v1/tenants/{tenant_id}/targets", token,
                         {"name": name, "url": url})

    async def put_webhook(self, admin: str, token: str, tenant_id: str, url: str, secret: str,
                          max_concurrency: int) -> None:
        await self._call("PUT", f"{admin}/admin/v1/tenants/{tenant_id}/webhooks", token,
                         {"url": url, "secret": secret, "max_concurrency": max_concurrency})

    async def put_endpoints(self, admin: str, token: str, tenant_id: str,
                            targets: Sequence[tuple[str, str]], webhooks: Sequence[tuple[str, int]],
                            webhook_secret: str) -> dict[str, int]:
        """The tenant's targets (name, URL) and webhooks (URL, concurrency) in the cell become
        exactly these: whatever else it has there is removed. A URL the cell refuses is a
        ``CellApiError`` with code ``target_refused`` naming the field (``targets[0].url``)."""
        found = await self._json("PUT", f"{admin}/admin/v1/tenants/{tenant_id}/endpoints", token, {
            "targets": [{"name": name, "url": url} for name, url in targets],
            "webhooks": [{"url": url, "secret": webhook_secret, "max_concurrency": concurrency}
                         for url, concurrency in webhooks]})
        return {str(k): int(v) for k, v in found.items()}

    async def refused_endpoints(self, admin: str, token: str, targets: Sequence[tuple[str, str]],
                                webhooks: Sequence[str]) -> list[dict[str, str]]:
        """Which of these URLs the cell's policy refuses ({field, url, reason}); changes nothing."""
        found = await self._json("POST", f"{admin}/admin/v1/endpoints:check", token, {
            "targets": [{"name": name, "url": url} for name, url in targets],
            "webhooks": [{"url": url} for url in webhooks]})
        return [{str(k): str(v) for k, v in item.items()} for item in found.get("refused") or []]

    async def delete_tenant(self, admin: str, token: str, tenant_id: str, *, purge: bool) -> None:
        await self._call("DELETE", f"{admin}/admin/v1/tenants/{tenant_id}", token, None,
                         params={"policy": "purge" if purge else "retain"})

    # -- moves: the source ("move out") ----------------------------------------------

    async def start_move_out(self, admin: str, token: str, tenant_id: str, move_id: str
                             ) -> dict[str, int]:
        """Switches the source's change capture on; answers the rows to copy per table."""
        found = await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-out", token,
                                 {"move_id": move_id})
        return {str(k): int(v) for k, v in (found.get("tables") or {}).items()}

    async def move_out_rows(self, admin: str, token: str, tenant_id: str, table: str,
                            after: str | None, limit: int) -> tuple[list[Any], str | None]:
        params = {"table": table, "limit": str(limit), **({"after": after} if after else {})}
        found = await self._json("GET", f"{admin}/admin/v1/tenants/{tenant_id}/move-out/rows",
                                 token, None, params=params)
        return list(found.get("rows") or []), found.get("next")

    async def move_out_changes(self, admin: str, token: str, tenant_id: str, after: int,
                               limit: int) -> dict[str, Any]:
        """{"rows": {table: [...]}, "deletes": {table: [...]}, "last_seq", "pending"}."""
        return await self._json("GET", f"{admin}/admin/v1/tenants/{tenant_id}/move-out/changes",
                                token, None, params={"after": str(after), "limit": str(limit)})

    async def freeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              epoch: int, *, within_seconds: float | None = None) -> None:
        """``within_seconds``: the cell's database gives the freeze up past it."""
        body: dict[str, Any] = {"move_id": move_id, "epoch": epoch}
        if within_seconds is not None:
            body["within_ms"] = max(1, int(within_seconds * 1000))
        await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-out:freeze", token,
                         body)

    async def unfreeze_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                                epoch: int) -> None:
        await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-out:unfreeze", token,
                         {"move_id": move_id, "epoch": epoch})

    async def finish_move_out(self, admin: str, token: str, tenant_id: str, move_id: str,
                              retain_seconds: int) -> None:
        await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-out:finish", token,
                         {"move_id": move_id, "retain_seconds": retain_seconds})

    async def cancel_move_out(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        await self._call("DELETE", f"{admin}/admin/v1/tenants/{tenant_id}/move-out", token, None,
                         params={"move_id": move_id})

    # -- moves: the target ("move in") and both --------------------------------------

    async def move_in(self, admin: str, token: str, tenant_id: str, move_id: str, epoch: int, *,
                      rows: dict[str, list[Any]], deletes: dict[str, list[Any]] | None = None
                      ) -> dict[str, int]:
        found = await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-in", token,
                                 {"move_id": move_id, "epoch": epoch, "rows": rows,
                                  "deletes": deletes or {}}, timeout=120.0)
        return {str(k): int(v) for k, v in (found.get("applied") or {}).items()}

    async def activate_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        await self._json("POST", f"{admin}/admin/v1/tenants/{tenant_id}/move-in:activate", token,
                         {"move_id": move_id})

    async def cancel_move_in(self, admin: str, token: str, tenant_id: str, move_id: str) -> None:
        await self._call("DELETE", f"{admin}/admin/v1/tenants/{tenant_id}/move-in", token, None,
                         params={"move_id": move_id})

    async def checksums(self, admin: str, token: str, tenant_id: str) -> dict[str, dict[str, Any]]:
        found = await self._json("GET", f"{admin}/admin/v1/tenants/{tenant_id}/checksums", token,
                                 None, timeout=60.0)
        return {str(k): dict(v) for k, v in (found.get("tables") or {}).items()}

    async def _call(self, method: str, url: str, token: str, body: dict[str, Any] | None, *,
                    params: dict[str, str] | None = None) -> None:
        await self._request(method, url, token, body, params=params)

    async def _json(self, method: str, url: str, token: str, body: dict[str, Any] | None, *,
                    params: dict[str, str] | None = None, timeout: float | None = None
                    ) -> dict[str, Any]:
        response = await self._request(method, url, token, body, params=params, timeout=timeout)
        try:
            found = response.json()
        except ValueError:
            raise CellApiError(f"{method} {url}: the answer is not JSON: {response.text[:200]}") from None
        if not isinstance(found, dict):
            raise CellApiError(f"{method} {url}: the answer is not an object")
        return found

    async def _request(self, method: str, url: str, token: str, body: dict[str, Any] | None, *,
                       params: dict[str, str] | None = None, timeout: float | None = None
                       ) -> httpx.Response:
        try:
            response = await self._http.request(
                method, url, json=body, params=params, headers={"Authorization": f"Bearer {token}"},
                timeout=self._http.timeout if timeout is None else httpx.Timeout(timeout))
        except httpx.HTTPError as error:
            raise CellApiError(f"{method} {url}: {error!r}") from None
        if response.status_code >= 300:
            code, detail = _error_of(response)
            raise CellApiError(f"{method} {url}: {response.status_code} {response.text[:300]}",
                               status=response.status_code, code=code, detail=detail)
        return response


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """The cell's error code and message, from its one error shape; empty if not in it."""
    try:
        error = response.json().get("error")
        return str(error.get("code") or ""), str(error.get("message") or "")
    except (ValueError, AttributeError):
        return "", ""
