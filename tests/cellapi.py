"""A cell's two APIs in-process (FastAPI's test client) over a real cell database."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from cellplane_cells.api.admin_app import create_admin_app
from cellplane_cells.api.tenant_app import create_tenant_app
from cellplane_cells.db import open_pool

ADMIN_TOKEN = "admin-token-for-tests-0123456789"


class Cell:
    def __init__(self, conninfo: str, *, allow_private: bool = True) -> None:
        self.conninfo = conninfo
        self.pool = open_pool(conninfo, epoch=1, max_size=8)
        self.api = TestClient(create_tenant_app(self.pool), raise_server_exceptions=False)
        self.admin = TestClient(create_admin_app(self.pool, admin_token=ADMIN_TOKEN,
                                                 allow_private_targets=allow_private),
                                raise_server_exceptions=False)
        self.admin.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"

    def tenant(self, tenant_id: str, *, credit: int = 1_000_000, **quotas: Any) -> dict[str, str]:
        created = self.admin.put(f"/admin/v1/tenants/{tenant_id}", json={"plan": "pro", **quotas})
        assert created.status_code == 200, created.text
        if credit:
            assert self.admin.post(f"/admin/v1/tenants/{tenant_id}/wallet:credit",
                                   json={"amount": credit}).status_code == 200
        target = self.admin.put(f"/admin/v1/tenants/{tenant_id}/targets",
                                json={"name": "default", "url": "http://127.0.0.1:9/run"})
        assert target.status_code == 204, target.text
        return {"Authorization": f"Bearer {created.json()['api_key']}"}

    def submit(self, auth: dict[str, str], key: str, **body: Any) -> Any:
        return self.api.post("/v1/jobs", json={"target": "default", "payload": {"x": 1}, **body},
                             headers={**auth, "Idempotency-Key": key})

    def close(self) -> None:
        self.pool.close()
