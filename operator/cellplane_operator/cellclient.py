"""The operator's client of a cell's admin API: tenants, quotas, targets and webhooks.

Every call is idempotent (PUT, or DELETE answering 204 when already gone), so a
reconcile that is repeated after a crash repeats them safely.
"""

from __future__ import annotations

from typing import Any

import httpx

from cellplane_operator.errors import CellApiError

__all__ = ["CellAdminClient"]


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

    async def delete_tenant(self, admin: str, token: str, tenant_id: str, *, purge: bool) -> None:
        await self._call("DELETE", f"{admin}/admin/v1/tenants/{tenant_id}", token, None,
                         params={"policy": "purge" if purge else "retain"})

    async def _call(self, method: str, url: str, token: str, body: dict[str, Any] | None, *,
                    params: dict[str, str] | None = None) -> None:
        try:
            response = await self._http.request(
                method, url, json=body, params=params, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as error:
            raise CellApiError(f"{method} {url}: {error!r}") from None
        if response.status_code >= 300:
            raise CellApiError(f"{method} {url}: {response.status_code} {response.text[:300]}",
                               status=response.status_code)
