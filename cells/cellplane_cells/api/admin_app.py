"""The operator's admin API, served on its own port with its own bearer token.

A tenant key is never accepted here: the two APIs are separate applications on
separate listeners, and this one compares the caller's token with the admin
token only. Every route, its OpenAPI document included, wants the token; there
are no interactive docs.
"""


import hmac
import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from pydantic import AliasChoices, Field, model_validator

from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from cellplane_cells import jobqueue, moves
from cellplane_cells.api.errors import install_error_handlers
from cellplane_cells.api.inputs import RequestBody, install_request_gates
from cellplane_cells.domain.client_input import bearer_token
from cellplane_cells.domain.plans import Plan
from cellplane_cells.metrics import TargetLimitCollector, register_queue_collector
from cellplane_cells.errors import (
    ConflictError, InvalidRequestError, NotFoundError, UnauthenticatedError,
)
from cellplane_cells.queries import query
from cellplane_cells.redrive import redrive
from cellplane_cells.transfer import export_tenant, import_tenant
from cellplane_cells.tenants import (
    RemovalPolicy, TargetSpec, TenantSpec, WebhookSpec, credit_wallet, register_target,
    register_webhook, remove_tenant, set_endpoints, tenant_summary, upsert_tenant, url_refusals,
)

__all__ = ["create_admin_app"]

TenantId = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]


class TenantUpsert(RequestBody):
    plan: Plan = Field(strict=False)
    # `max_running` is the name operators sent before the quota had one name from the
    # CRD to the column (migration 0012): still accepted, so an operator not yet
    # upgraded keeps setting the quota of the cells that are.
    max_running_jobs: int | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("max_running_jobs", "max_running"),
        description="Jobs of the tenant that may run at once. "
                    "`max_running`, its former name, is accepted (deprecated).")
    jobs_per_second: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    daily_spend_limit: int | None = Field(default=None, ge=0)
    strict_schedules: int | None = Field(
        default=None, ge=0, description="Active strict (dispatch window 0) schedules the tenant "
                                        "may have; 0: none, and no CRITICAL work.")
    api_key: str | None = Field(default=None, min_length=24, max_length=200,
                                description="Set the tenant's key; one is made if absent.")

    @model_validator(mode="before")
    @classmethod
    def _one_name_for_the_running_cap(cls, data: Any) -> Any:
        # Without this, pydantic would take max_running_jobs and refuse the other
        # as an unknown field: a 422 either way, but this one says why.
        if isinstance(data, dict) and {"max_running_jobs", "max_running"} <= data.keys():
            raise ValueError("max_running is the deprecated name of max_running_jobs: "
                             "give only max_running_jobs")
        return data


class TargetIn(RequestBody):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    url: str = Field(min_length=1, max_length=2048)


class WebhookIn(RequestBody):
    url: str = Field(min_length=1, max_length=2048)
    secret: str = Field(min_length=16, max_length=200)
    max_concurrency: int = Field(default=4, ge=1, le=100)


class EndpointsIn(RequestBody):
    """A tenant's whole set of targets and webhooks; what is not listed is removed."""

    targets: list[TargetIn] = Field(default_factory=list, max_length=64)
    webhooks: list[WebhookIn] = Field(default_factory=list, max_length=64)


class WebhookUrl(RequestBody):
    url: str = Field(min_length=1, max_length=2048)


class EndpointsCheck(RequestBody):
    """URLs to judge by this cell's policy, named as in a tenant's spec."""

    targets: list[TargetIn] = Field(default_factory=list, max_length=64)
    webhooks: list[WebhookUrl] = Field(default_factory=list, max_length=64)


class Redrive(RequestBody):
    limit: int = Field(default=100, ge=1, le=1000)
    per_second: float = Field(default=5.0, gt=0, le=1000,
                              description="Pace at which the copies become due.")


class Import(RequestBody):
    epoch: int = Field(ge=1, description="The tenant epoch the tenant runs under in this cell.")
    bundle: dict[str, Any]


MoveId = Annotated[str, Field(min_length=1, max_length=200)]


class MoveOut(RequestBody):
    move_id: MoveId


class MoveEpoch(RequestBody):
    move_id: MoveId
    epoch: int = Field(ge=1, description="The tenant epoch to hold from now on.")


class MoveFreeze(MoveEpoch):
    within_ms: int | None = Field(default=None, ge=1, le=600_000, description=(
        "What is left of the cutover's write-pause budget: the freeze is given up, "
        "nothing changed, if it cannot take the tenant's lock within it."))


class MoveFinish(RequestBody):
    move_id: MoveId
    retain_seconds: int = Field(ge=0, le=10 * 365 * 86400,
                                description="How long the moved-out rows stay, read-only.")


class MoveIn(RequestBody):
    move_id: MoveId
    epoch: int = Field(ge=1, description="The tenant epoch the tenant runs under in this cell.")
    rows: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    deletes: dict[str, list[str]] = Field(default_factory=dict)


class MoveActivate(RequestBody):
    move_id: MoveId


MOVE_IN_BODY_LIMIT = 32 * 1024 * 1024
"""A batch of rows for a move in; every other admin body stays under 1 MB."""


class Credit(RequestBody):
    amount: int = Field(gt=0, le=10**15)


def create_admin_app(pool: ConnectionPool, *, admin_token: str,
                     allow_private_targets: bool) -> FastAPI:
    app = FastAPI(title="cellplane cell: admin API", version="v1", openapi_url=None,
                  docs_url=None, redoc_url=None)

    def read_stats() -> list[dict[str, Any]]:
        with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            return cursor.execute(query("queue_stats")).fetchall()

    # The process-wide counters live in the default registry; the per-tenant
    # queue gauges belong to this app's database, in a registry of its own.
    queue_registry = CollectorRegistry()
    register_queue_collector(queue_registry, read_stats)

    def read_target_limits() -> list[dict[str, Any]]:
        with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            return cursor.execute(query("target_limit_stats")).fetchall()

    queue_registry.register(TargetLimitCollector(read_target_limits))
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else pool.conninfo()
    install_error_handlers(app)
    install_request_gates(app, body_limit=1024 * 1024, larger={"/move-in": MOVE_IN_BODY_LIMIT})

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        given = bearer_token(authorization)
        if given is None or not hmac.compare_digest(given.encode(), admin_token.encode()):
            raise UnauthenticatedError("the admin token is required: Authorization: Bearer <token>")

    guarded = [Depends(admin)]

    @app.get("/admin/v1/openapi.json", dependencies=guarded, include_in_schema=False)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.put("/admin/v1/tenants/{tenant_id}", dependencies=guarded)
    def put_tenant(tenant_id: TenantId, body: TenantUpsert) -> dict[str, Any]:
        spec = TenantSpec(tenant_id, body.plan, max_running_jobs=body.max_running_jobs,
                          jobs_per_second=body.jobs_per_second, burst=body.burst,
                          daily_spend_limit=body.daily_spend_limit,
                          strict_schedules=body.strict_schedules)
        with pool.connection() as conn:
            created, issued = upsert_tenant(conn, spec, api_key=body.api_key)
            summary = tenant_summary(conn, tenant_id)
        return {"created": created, "api_key": issued, "tenant": summary}

    @app.delete("/admin/v1/tenants/{tenant_id}", dependencies=guarded, status_code=204)
    def delete_tenant(tenant_id: TenantId, policy: RemovalPolicy) -> None:
        """The tenant leaves this cell. ``retain``: its rows stay, its key stops
        working and none of its jobs is claimed, until a PUT re-places it here.
        ``purge``: every row of it goes, in one transaction. 204 also when the
        tenant is not here (any more): both are idempotent, so the operator
        repeats them safely after a crash or a lost answer."""
        with pool.connection() as conn:
            remove_tenant(conn, tenant_id, policy)

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

    @app.put("/admin/v1/tenants/{tenant_id}/endpoints", dependencies=guarded)
    def put_endpoints(tenant_id: TenantId, body: EndpointsIn) -> dict[str, int]:
        """The tenant's targets and webhooks become exactly the body's: the operator sends
        its spec's whole set each time, so a target or webhook taken out of the spec
        stops here too. A URL the policy refuses is a 422 naming its field
        (``targets[0].url``), and nothing changes."""
        for listed, key in ((body.targets, "name"), (body.webhooks, "url")):
            keys = [getattr(item, key) for item in listed]
            if len(set(keys)) != len(keys):
                raise InvalidRequestError(f"two entries share a {key}", code="duplicate_endpoint")
        with pool.connection() as conn:
            tenant_summary(conn, tenant_id)
            return set_endpoints(
                conn, tenant_id, [TargetSpec(t.name, t.url) for t in body.targets],
                [WebhookSpec(w.url, w.secret, w.max_concurrency) for w in body.webhooks],
                allow_private=allow_private_targets)

    @app.post("/admin/v1/endpoints:check", dependencies=guarded)
    def check_endpoints(body: EndpointsCheck) -> dict[str, Any]:
        """Which of these URLs this cell refuses, and why; changes nothing. The
        operator asks it before moving a tenant here."""
        return {"refused": url_refusals(
            [*((f"targets[{i}].url", t.url) for i, t in enumerate(body.targets)),
             *((f"webhooks[{i}].url", w.url) for i, w in enumerate(body.webhooks))],
            allow_private=allow_private_targets)}

    @app.post("/admin/v1/tenants/{tenant_id}/wallet:credit", dependencies=guarded)
    def credit(tenant_id: TenantId, body: Credit) -> dict[str, int]:
        with pool.connection() as conn:
            return credit_wallet(conn, tenant_id, body.amount)

    @app.post("/admin/v1/jobs/{job_id}:refund", dependencies=guarded)
    def refund(job_id: uuid.UUID) -> dict[str, int]:
        """The admin tool's refund path: pays only if no other path has paid already."""
        with pool.connection() as conn:
            return {"refunded": jobqueue.refund(conn, job_id)}

    @app.post("/admin/v1/tenants/{tenant_id}/dead-letter:redrive", dependencies=guarded)
    def redrive_dead(tenant_id: TenantId, body: Redrive) -> dict[str, Any]:
        with pool.connection() as conn:
            tenant_summary(conn, tenant_id)
            result = redrive(conn, tenant_id, limit=body.limit, per_second=body.per_second)
        return {"redriven": [{"dead": str(old), "job_id": str(new)} for old, new in result.redriven],
                "stopped_by_funds": result.stopped_by_funds}

    @app.get("/admin/v1/tenants/{tenant_id}/export", dependencies=guarded)
    def export(tenant_id: TenantId) -> dict[str, Any]:
        return export_tenant(conninfo, tenant_id)

    @app.post("/admin/v1/tenants/{tenant_id}/import", dependencies=guarded)
    def import_(tenant_id: TenantId, body: Import) -> dict[str, Any]:
        if (body.bundle.get("tenant") or {}).get("tenant_id") != tenant_id:
            raise ConflictError("the bundle is for another tenant", code="invalid_bundle")
        with pool.connection() as conn:
            return {"imported": import_tenant(conn, body.bundle, epoch=body.epoch,
                                              allow_private=allow_private_targets)}

    # --- online tenant moves (moves.py); the operator drives them -----------------------

    @app.post("/admin/v1/tenants/{tenant_id}/move-out", dependencies=guarded)
    def move_out(tenant_id: TenantId, body: MoveOut) -> dict[str, Any]:
        """Starts (or repeats) a move out: change capture on, under the tenant lock."""
        with pool.connection() as conn:
            tables = moves.start_move_out(conn, tenant_id, body.move_id)
        return {"move_id": body.move_id, "tables": tables}

    @app.get("/admin/v1/tenants/{tenant_id}/move-out/rows", dependencies=guarded)
    def move_out_rows(tenant_id: TenantId, table: str,
                      after: Annotated[str | None, Query(max_length=2000)] = None,
                      limit: Annotated[int, Query(ge=1, le=10000)] = 2000) -> dict[str, Any]:
        with pool.connection() as conn:
            rows, following = moves.scope_page(conn, tenant_id, table, after=after, limit=limit)
        return {"rows": rows, "next": following}

    @app.get("/admin/v1/tenants/{tenant_id}/move-out/changes", dependencies=guarded)
    def move_out_changes(tenant_id: TenantId, after: Annotated[int, Query(ge=0)] = 0,
                         limit: Annotated[int, Query(ge=1, le=50000)] = 5000) -> dict[str, Any]:
        with pool.connection() as conn:
            return moves.read_changes(conn, tenant_id, after=after, limit=limit)

    @app.post("/admin/v1/tenants/{tenant_id}/move-out:freeze", dependencies=guarded)
    def move_out_freeze(tenant_id: TenantId, body: MoveFreeze) -> dict[str, int]:
        with pool.connection() as conn:
            return moves.freeze(conn, tenant_id, body.move_id, body.epoch,
                                within_ms=body.within_ms)

    @app.post("/admin/v1/tenants/{tenant_id}/move-out:unfreeze", dependencies=guarded)
    def move_out_unfreeze(tenant_id: TenantId, body: MoveEpoch) -> dict[str, Any]:
        with pool.connection() as conn:
            moves.unfreeze(conn, tenant_id, body.move_id, body.epoch)
        return {"move_id": body.move_id, "state": "active"}

    @app.post("/admin/v1/tenants/{tenant_id}/move-out:finish", dependencies=guarded)
    def move_out_finish(tenant_id: TenantId, body: MoveFinish) -> dict[str, Any]:
        with pool.connection() as conn:
            moves.finish(conn, tenant_id, body.move_id, body.retain_seconds)
        return {"move_id": body.move_id, "state": "moved"}

    @app.delete("/admin/v1/tenants/{tenant_id}/move-out", dependencies=guarded, status_code=204)
    def move_out_abort(tenant_id: TenantId, move_id: Annotated[str, Query(min_length=1)]) -> None:
        with pool.connection() as conn:
            moves.abort_move_out(conn, tenant_id, move_id)

    @app.post("/admin/v1/tenants/{tenant_id}/move-in", dependencies=guarded)
    def move_in(tenant_id: TenantId, body: MoveIn) -> dict[str, Any]:
        with pool.connection() as conn:
            applied = moves.move_in(conn, tenant_id, move_id=body.move_id, epoch=body.epoch,
                                    rows=body.rows, deletes=body.deletes,
                                    allow_private=allow_private_targets)
        return {"applied": applied}

    @app.post("/admin/v1/tenants/{tenant_id}/move-in:activate", dependencies=guarded)
    def move_in_activate(tenant_id: TenantId, body: MoveActivate) -> dict[str, Any]:
        with pool.connection() as conn:
            moves.activate(conn, tenant_id, body.move_id)
        return {"move_id": body.move_id, "state": "active"}

    @app.delete("/admin/v1/tenants/{tenant_id}/move-in", dependencies=guarded, status_code=204)
    def move_in_abort(tenant_id: TenantId, move_id: Annotated[str, Query(min_length=1)]) -> None:
        with pool.connection() as conn:
            moves.abort_move_in(conn, tenant_id, move_id)

    @app.get("/admin/v1/tenants/{tenant_id}/checksums", dependencies=guarded)
    def move_checksums(tenant_id: TenantId) -> dict[str, Any]:
        with pool.connection() as conn:
            return {"tables": moves.checksums(conn, tenant_id)}

    @app.get("/metrics", dependencies=guarded)
    def metrics() -> Response:
        return Response(generate_latest(REGISTRY) + generate_latest(queue_registry),
                        media_type=CONTENT_TYPE_LATEST)

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
