"""The tenants' job API: submit, read, list and cancel jobs; schedules (``schedule_routes``).

Every request names its tenant by API key (``Authorization: Bearer ...``); a
job of another tenant is reported as not found, never as forbidden, so keys
cannot be used to learn which job ids exist.

No ``from __future__ import annotations`` here: FastAPI resolves the
dependency aliases defined inside ``create_tenant_app`` from the live
annotations.
"""


import base64
import binascii
import datetime
import uuid
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from pydantic import AfterValidator, BaseModel, Field, JsonValue

from cellplane_cells.api.errors import install_error_handlers
from cellplane_cells.api.inputs import PriorityClass, RequestBody, install_request_gates
from cellplane_cells.api.schedule_routes import add_schedule_routes
from cellplane_cells.domain.client_input import (
    INVALID_KEY_MESSAGE, MAX_PAYLOAD_DEPTH, TENANT_BODY_LIMIT_BYTES, bearer_token, json_depth,
)
from cellplane_cells.db import translate_errors
from cellplane_cells.domain.priorities import Priority
from cellplane_cells.errors import (
    InvalidRequestError,
    NotFoundError,
    TenantPausedError,
    UnauthenticatedError,
    UnavailableError,
)
from cellplane_cells.queries import query
from cellplane_cells.submission import JobRequest, submit
from cellplane_cells.tenants import hash_api_key

__all__ = ["create_tenant_app", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = TENANT_BODY_LIMIT_BYTES
JobStatus = Literal["queued", "running", "succeeded", "dead", "cancelled", "expired"]


def _shallow(payload: JsonValue) -> JsonValue:
    # Bounded below the body's own bound: a tenant's export and a move carry the
    # payload a few levels deeper than a submission does.
    if json_depth(payload) > MAX_PAYLOAD_DEPTH:
        raise ValueError(f"the payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    return payload


class SubmitJob(RequestBody):
    target: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                        description="Name of a target registered for the tenant.")
    payload: Annotated[JsonValue, AfterValidator(_shallow)] = Field(
        description="Sent to the target with every step.")
    steps: int = Field(default=1, ge=1, le=32)
    max_attempts: int = Field(default=5, ge=1, le=20)
    estimate: int = Field(default=0, ge=0, le=10**12,
                          description="Cost estimate in micro-credits, reserved at submission.")
    expires_in_seconds: int | None = Field(default=None, ge=1, le=30 * 86400)
    priority: PriorityClass = Field(
        default="DEFAULT", description="Priority class: which reserved worker slots the job "
                                       "may take (docs/schedules.md).")


class Job(BaseModel):
    job_id: uuid.UUID
    status: JobStatus
    target: str
    priority: PriorityClass
    steps: int
    attempts: int
    max_attempts: int
    estimate: int
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    expires_at: datetime.datetime | None
    error: str | None
    error_code: str | None
    cancel_requested: bool


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None


def _job(row: dict[str, Any]) -> Job:
    return Job(job_id=row["job_id"], status=row["status"], target=row["target"],
               priority=row["priority"],
               steps=row["step_count"], attempts=row["attempts"], max_attempts=row["max_attempts"],
               estimate=row["estimate"], created_at=row["created_at"], started_at=row["started_at"],
               finished_at=row["finished_at"], expires_at=row["expires_at"],
               error=row["last_error"], error_code=row["error_code"],
               cancel_requested=row["cancel_requested"])


def _encode_cursor(created_at: datetime.datetime, job_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{job_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[datetime.datetime, uuid.UUID]:
    try:
        created, job = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.datetime.fromisoformat(created), uuid.UUID(job)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor") from None


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFoundError("no such job") from None


def create_tenant_app(pool: ConnectionPool) -> FastAPI:
    app = FastAPI(title="cellplane cell: tenant API", version="v1")
    install_error_handlers(app)
    install_request_gates(app, body_limit=MAX_BODY_BYTES)

    def caller(authorization: Annotated[str | None, Header()] = None) -> tuple[str, str]:
        key = bearer_token(authorization)
        if key is None:
            raise UnauthenticatedError("an API key is required: Authorization: Bearer <key>")
        # Looked up by the key's SHA-256 in a unique index: what a timing of the
        # lookup could tell is how a stored digest begins, which leads to no key.
        with pool.connection() as conn:
            row = conn.execute(query("tenant_by_key"), {"key_hash": hash_api_key(key)}).fetchone()
        if row is None:
            # The same answer the edge router gives for a key of no placed tenant.
            raise UnauthenticatedError(INVALID_KEY_MESSAGE)
        if row[2] == "moved":
            # The tenant lives in another cell now; the edge router retries there.
            raise UnavailableError("the tenant has moved to another cell; retry shortly",
                                   code="tenant_moved", retry_after_seconds=1)
        return str(row[0]), str(row[2])

    def tenant(identity: Annotated[tuple[str, str], Depends(caller)]) -> str:
        return identity[0]

    def submitting_tenant(identity: Annotated[tuple[str, str], Depends(caller)]) -> str:
        tenant_id, state = identity
        if state == "frozen":
            # A move is cutting over: the pause is short and bounded.
            raise UnavailableError("the tenant is being moved; retry shortly", code="tenant_moving",
                                   retry_after_seconds=1)
        if state != "active":
            raise TenantPausedError("the tenant is paused; jobs are not accepted")
        return tenant_id

    Tenant = Annotated[str, Depends(tenant)]
    SubmittingTenant = Annotated[str, Depends(submitting_tenant)]

    @app.post("/v1/jobs", status_code=202, responses={
        401: {"description": "unknown or missing API key"},
        402: {"description": "the estimate does not fit the wallet or daily spend limit"},
        409: {"description": "the key was used with another request, or the tenant is paused"},
        413: {"description": "body too large"},
        429: {"description": "rate limited; see Retry-After"},
        503: {"description": "tenant being moved or database busy (see Retry-After); this "
                             "site does not own the cell now (not_owner, stale_epoch, "
                             "lease_expired: ask again); or the cell is fenced on purpose "
                             "(cell_fenced, with the reason)"}})
    def submit_job(request: Request, body: SubmitJob, tenant_id: SubmittingTenant,
                   idempotency_key: Annotated[str, Header(min_length=1, max_length=255,
                                                          pattern=r"^[\x20-\x7e]+$")],
                   ) -> JSONResponse:
        job = JobRequest(target=body.target, payload=body.payload, steps=body.steps,
                         max_attempts=body.max_attempts, estimate=body.estimate,
                         expires_in_seconds=body.expires_in_seconds,
                         priority=Priority(body.priority))
        with pool.connection() as conn:
            stored = submit(conn, tenant_id=tenant_id, key=idempotency_key, request=job)
        headers = {"Idempotent-Replayed": "true"} if stored.replayed else {}
        return JSONResponse(stored.body, status_code=stored.status_code, headers=headers)

    @app.get("/v1/jobs/{job_id}", response_model=Job)
    def get_job(job_id: str, tenant_id: Tenant) -> Job:
        with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            row = cursor.execute(query("get_job"), {"tenant_id": tenant_id,
                                                    "job_id": _job_id(job_id)}).fetchone()
        if row is None:
            raise NotFoundError("no such job")
        return _job(row)

    @app.post("/v1/jobs/{job_id}:cancel", response_model=Job)
    def cancel_job(job_id: str, tenant_id: Tenant) -> Job:
        parsed = _job_id(job_id)
        params = {"tenant_id": tenant_id, "job_id": parsed}
        with pool.connection() as conn, translate_errors(), conn.cursor(row_factory=dict_row) as cursor:
            with conn.transaction():
                if cursor.execute(query("cancel_queued"), params).fetchone() is not None:
                    cursor.execute(query("refund_job"), {"job_id": parsed})
                else:
                    cursor.execute(query("request_cancel"), params)
            row = cursor.execute(query("get_job"), params).fetchone()
        if row is None:
            raise NotFoundError("no such job")
        return _job(row)

    @app.get("/v1/jobs", response_model=JobPage)
    def list_jobs(tenant_id: Tenant, status: JobStatus | None = None,
                  cursor: Annotated[str | None, Query(max_length=200)] = None,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50) -> JobPage:
        after_created, after_job = _decode_cursor(cursor) if cursor else (None, None)
        with pool.connection() as conn, conn.cursor(row_factory=dict_row) as db:
            rows = db.execute(query("list_jobs"), {
                "tenant_id": tenant_id, "status": status, "after_created": after_created,
                "after_job": after_job, "limit": limit + 1}).fetchall()
        page = [_job(row) for row in rows[:limit]]
        next_cursor = (_encode_cursor(rows[limit - 1]["created_at"], rows[limit - 1]["job_id"])
                       if len(rows) > limit else None)
        return JobPage(jobs=page, next_cursor=next_cursor)

    add_schedule_routes(app, pool, tenant=tenant, submitting=submitting_tenant)
    return app
