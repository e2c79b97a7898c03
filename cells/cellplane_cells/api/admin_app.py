"""The operator's admin API, served on its own port with its own bearer token.

A tenant key is never accepted here: the two APIs are separate applications on
separate listeners, and this one compares the caller's token with the admin
token only.
"""


import hmac
import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from cellplane_cells import jobqueue
from cellplane_cells.api.errors import BodySizeLimit, install_error_handlers
from cellplane_cells.domain.plans import Plan
from cellplane_cells.errors import NotFoundError, UnauthenticatedError
from cellplane_cells.queries import query
from cellplane_cells.tenants import (
    TenantSpec, credit_wallet, register_target, register_webhook, tenant_summary, upsert_tenant,
)

__all__ = ["create_admin_app"]

TenantId = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]


class TenantUpsert(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: Plan
    max_running: int | None = Field(default=None, ge=0)
    jobs_per_second: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    daily_spend_limit: int | None = Field(default=None, ge=0)
    api_key: str | None = Field(default=None, min_length=24, max_length=200,
                                description="Set the tenant's key; one is made if absent.")


class TargetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    url: str = Field(min_length=1, max_length=2048)


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2048)
    secret: str = Field(min_length=16, max_length=200)
    max_concurrency: int = Field(default=4, ge=1, le=100)


class Credit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(gt=0, le=10**15)


def create_admin_app(pool: ConnectionPool, *, admin_token: str, allow_private_targets: bool) -> FastAPI:
    app = FastAPI(title="cellplane cell: admin API", version="v1")
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, limit=1024 * 1024)

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not given or not hmac.compare_digest(given.encode(), admin_token.encode()):
            raise UnauthenticatedError("the admin token is required")

    guarded = [Depends(admin)]

    @app.put("/admin/v1/tenants/{tenant_id}", dependencies=guarded)
    def put_tenant(tenant_id: TenantId, body: TenantUpsert) -> dict[str, Any]:
        spec = TenantSpec(tenant_id, body.plan, max_running=body.max_running,
                          jobs_per_second=body.jobs_per_second, burst=body.burst,
                          daily_spend_limit=body.daily_spend_limit)
        with pool.connection() as conn:
            created, issued = upsert_tenant(conn, spec, api_key=body.api_key)
            summary = tenant_summary(conn, tenant_id)
        return {"created": created, "api_key": issued, "tenant": summary}

    @app.get("/admin/v1/tenants/{tenant_id}", dependencies=guarded)
    def get_tenant(tenant_id: TenantId) -> dict[str, Any]:
        with pool.connection() as conn:
            return tenant_summary(conn, tenant_id)

    @app.put("/admin/v1/tenants/{tenant_id}/targets", dependencies=guarded, status_code=204)
    def put_target(tenant_id: TenantId, body: TargetIn) -> None:
        with pool.connection() as conn:
            tenant_summary(conn, tenant_id)
            register_target(conn, tenant_id, body.name, body.url, allow_private=allow_private_targets)

    @app.put("/admin/v1/tenants/{tenant_id}/webhooks", dependencies=guarded)
    def put_webhook(tenant_id: TenantId, body: WebhookIn) -> dict[str, int]:
        with pool.connection() as conn:
            tenant_summary(conn, tenant_id)
            endpoint = register_webhook(conn, tenant_id, body.url, secret=body.secret,
                                        max_concurrency=body.max_concurrency,
                                        allow_private=allow_private_targets)
        return {"endpoint_id": endpoint}

    @app.post("/admin/v1/tenants/{tenant_id}/wallet:credit", dependencies=guarded)
    def credit(tenant_id: TenantId, body: Credit) -> dict[str, int]:
        with pool.connection() as conn:
            return credit_wallet(conn, tenant_id, body.amount)

    @app.post("/admin/v1/jobs/{job_id}:refund", dependencies=guarded)
    def refund(job_id: uuid.UUID) -> dict[str, int]:
        """The admin tool's refund path: pays only if no other path has paid already."""
        with pool.connection() as conn:
            return {"refunded": jobqueue.refund(conn, job_id)}

    @app.get("/admin/v1/health", dependencies=guarded)
    def health() -> dict[str, Any]:
        with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            group = cursor.execute(query("placement_group")).fetchone()
            lag = cursor.execute(query("replication_lag")).fetchone()
        if group is None:
            raise NotFoundError("the cell database has no placement group row")
        return {"cell": group["cell"], "epoch": group["epoch"],
                "lease_remaining_seconds": float(group["remaining_seconds"] or 0),
                "in_recovery": group["in_recovery"],
                "replication_lag_seconds": None if lag is None or lag["lag_seconds"] is None
                else float(lag["lag_seconds"])}

    return app
