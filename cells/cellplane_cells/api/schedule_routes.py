"""The tenant API's schedules: ``/v1/schedules`` (create, get, list, update, pause, resume,
cancel, run history).

A schedule the domain refuses (an unknown zone, an impossible cron, a
``run_at`` with an offset) is a 422 in the same shape as a schema refusal,
naming the field, e.g. ``body.schedule.cron``; so is a CRITICAL schedule with a
dispatch window (``body.priority``: CRITICAL must be strict). A write that
would put the tenant over its strict allowance is a 409
``strict_allowance_exceeded`` carrying the allowance and how many are in use.

No ``from __future__ import annotations`` here: FastAPI resolves the tenant
dependency alias handed to ``add_schedule_routes`` from the live annotations.
"""


import base64
import binascii
import datetime
import hashlib
import json
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query
from fastapi.responses import JSONResponse
from fastapi.exceptions import RequestValidationError
from psycopg_pool import ConnectionPool
from pydantic import AfterValidator, BaseModel, Field, JsonValue

from cellplane_cells.api.inputs import PriorityClass, RequestBody
from cellplane_cells.domain.client_input import MAX_PAYLOAD_DEPTH, json_depth
from cellplane_cells.domain.priorities import Priority
from cellplane_cells.domain.schedules import (
    DEFAULT_DISPATCH_WINDOW_SECONDS, DEFAULT_MAX_CATCH_UP_RUNS, MAX_CATCH_UP_RUNS,
    MAX_DISPATCH_WINDOW_SECONDS, MisfirePolicy, MisfireRule, ScheduleError, Timing, cron, once,
)
from cellplane_cells.domain.strict_allowance import critical_window_problem
from cellplane_cells.errors import InvalidRequestError, NotFoundError
from cellplane_cells.schedules import (
    CreateKey, ScheduleSpec, StateChange, change_state, create_schedule, get_schedule, list_schedules,
    replace_schedule, schedule_runs,
)

__all__ = ["add_schedule_routes"]

ScheduleState = Literal["active", "paused", "cancelled", "completed"]


def _shallow(payload: JsonValue) -> JsonValue:
    if json_depth(payload) > MAX_PAYLOAD_DEPTH:
        raise ValueError(f"the payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    return payload


class OnceTiming(RequestBody):
    type: Literal["ONCE"]
    run_at: str = Field(max_length=40, description="Local date and time, e.g. 2026-09-28T09:00:00.")
    time_zone: str = Field(max_length=64, description="IANA zone, e.g. Europe/Berlin.")


class CronTiming(RequestBody):
    type: Literal["CRON"]
    cron: str = Field(max_length=200, description="5-field Unix cron expression (docs/schedules.md).")
    time_zone: str = Field(max_length=64, description="IANA zone the expression is read in.")


class ScheduleBody(RequestBody):
    schedule: Annotated[OnceTiming | CronTiming, Field(discriminator="type")]
    target: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                        description="Name of a target registered for the tenant.")
    payload: Annotated[JsonValue, AfterValidator(_shallow)] = Field(
        description="Sent to the target with every run.")
    max_attempts: int = Field(default=5, ge=1, le=20)
    misfire_policy: Literal["RUN_ONCE", "SKIP", "RUN_ALL"] = "RUN_ONCE"
    max_catch_up_runs: int = Field(default=DEFAULT_MAX_CATCH_UP_RUNS, ge=1, le=MAX_CATCH_UP_RUNS)
    dispatch_window_seconds: int = Field(default=DEFAULT_DISPATCH_WINDOW_SECONDS, ge=0,
                                         le=MAX_DISPATCH_WINDOW_SECONDS)
    priority: PriorityClass = Field(default="DEFAULT",
                                    description="Priority class of every run's job.")


class TimingOut(BaseModel):
    type: Literal["ONCE", "CRON"]
    cron: str | None
    run_at: str | None
    time_zone: str


class Schedule(BaseModel):
    schedule_id: uuid.UUID
    state: ScheduleState
    schedule: TimingOut
    target: str
    payload: JsonValue
    max_attempts: int
    misfire_policy: Literal["RUN_ONCE", "SKIP", "RUN_ALL"]
    max_catch_up_runs: int
    dispatch_window_seconds: int
    priority: PriorityClass
    next_run_at: datetime.datetime | None
    next_run_local: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


class SchedulePage(BaseModel):
    schedules: list[Schedule]
    next_cursor: str | None


class Run(BaseModel):
    scheduled_for: datetime.datetime
    idempotency_key: str
    job_id: uuid.UUID
    status: str | None
    attempts: int | None
    dispatched_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    error_code: str | None


class RunPage(BaseModel):
    runs: list[Run]
    next_cursor: str | None


def _timing(body: ScheduleBody) -> Timing:
    """The domain's timing, or a 422 naming the field it refused."""
    try:
        if isinstance(body.schedule, OnceTiming):
            try:
                run_at = datetime.datetime.fromisoformat(body.schedule.run_at)
            except ValueError:
                raise ScheduleError("run_at", "not a local date and time such as "
                                              "2026-09-28T09:00:00") from None
            return once(run_at, body.schedule.time_zone)
        return cron(body.schedule.cron, body.schedule.time_zone)
    except ScheduleError as error:
        raise RequestValidationError([{"loc": ("body", "schedule", error.field),
                                       "msg": error.message, "type": "value_error"}]) from None


def _spec(body: ScheduleBody) -> ScheduleSpec:
    problem = critical_window_problem(Priority(body.priority), body.dispatch_window_seconds)
    if problem is not None:
        raise RequestValidationError([{"loc": ("body", "priority"), "msg": problem,
                                       "type": "value_error"}])
    return ScheduleSpec(
        timing=_timing(body), target=body.target, payload=body.payload,
        max_attempts=body.max_attempts,
        misfire=MisfireRule(MisfirePolicy(body.misfire_policy),
                            max_catch_up_runs=body.max_catch_up_runs),
        dispatch_window_seconds=body.dispatch_window_seconds, priority=Priority(body.priority))


def _body_hash(body: ScheduleBody) -> bytes:
    """Equal for two requests that ask for the same schedule, however their JSON was laid out."""
    fields = body.model_dump(mode="json")
    # A DEFAULT schedule hashes as before priorities existed, so a create retried
    # across the upgrade still matches the key it was first stored under.
    if fields["priority"] == Priority.DEFAULT.value:
        del fields["priority"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


def _schedule(row: dict[str, Any]) -> Schedule:
    next_at: datetime.datetime | None = row["next_at"]
    local = (None if next_at is None
             else next_at.astimezone(zoneinfo.ZoneInfo(row["time_zone"])).isoformat())
    run_at: datetime.datetime | None = row["run_at"]
    return Schedule(
        schedule_id=row["schedule_id"], state=row["state"],
        schedule=TimingOut(type=row["kind"], cron=row["cron"],
                           run_at=None if run_at is None else run_at.isoformat(),
                           time_zone=row["time_zone"]),
        target=row["target"], payload=row["payload"], max_attempts=row["max_attempts"],
        misfire_policy=row["misfire_policy"], max_catch_up_runs=row["max_catch_up_runs"],
        dispatch_window_seconds=row["dispatch_window_seconds"], priority=row["priority"],
        next_run_at=next_at,
        next_run_local=local, created_at=row["created_at"], updated_at=row["updated_at"])


def _schedule_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFoundError("no such schedule") from None


def _encode(*parts: object) -> str:
    return base64.urlsafe_b64encode("|".join(str(p) for p in parts).encode()).decode()


def _decode(cursor: str) -> list[str]:
    try:
        return base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor") from None


def _page_after(cursor: str | None) -> tuple[datetime.datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    try:
        created, schedule = _decode(cursor)
        return datetime.datetime.fromisoformat(created), uuid.UUID(schedule)
    except ValueError:
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor") from None


def _runs_before(cursor: str | None) -> datetime.datetime | None:
    if cursor is None:
        return None
    try:
        (before,) = _decode(cursor)
        moment = datetime.datetime.fromisoformat(before)
    except ValueError:
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor") from None
    if moment.tzinfo is None:
        raise InvalidRequestError("cursor is not one this API returned", code="invalid_cursor")
    return moment


def add_schedule_routes(app: FastAPI, pool: ConnectionPool, *, tenant: Callable[..., str],
                        submitting: Callable[..., str]) -> None:
    """``tenant`` and ``submitting`` are the tenant app's dependencies: any caller may
    read; only an active tenant may create or change."""
    Tenant = Annotated[str, Depends(tenant)]
    Submitting = Annotated[str, Depends(submitting)]

    @app.post("/v1/schedules", status_code=201, response_model=Schedule, responses={
        409: {"description": "the tenant is paused, the Idempotency-Key was used with "
                             "another request, or the schedule would put the tenant over its "
                             "strict allowance (strict_allowance_exceeded, with `allowance` "
                             "and `in_use`)"},
        422: {"description": "a field is invalid; `fields` names it (unknown zone, impossible "
                             "cron, unregistered target, CRITICAL with a dispatch window)"}})
    def create(body: ScheduleBody, tenant_id: Submitting,
               idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255,
                                                             pattern=r"^[\x20-\x7e]+$")] = None,
               ) -> JSONResponse:
        spec = _spec(body)
        key = None if idempotency_key is None else CreateKey(idempotency_key, _body_hash(body))
        with pool.connection() as conn:
            created = create_schedule(conn, tenant_id, spec, key)
        headers = {"Idempotent-Replayed": "true"} if created.replayed else {}
        return JSONResponse(_schedule(created.row).model_dump(mode="json"), status_code=201,
                            headers=headers)

    @app.get("/v1/schedules/{schedule_id}", response_model=Schedule)
    def get(schedule_id: str, tenant_id: Tenant) -> Schedule:
        with pool.connection() as conn:
            return _schedule(get_schedule(conn, tenant_id, _schedule_id(schedule_id)))

    @app.get("/v1/schedules", response_model=SchedulePage)
    def list_(tenant_id: Tenant, state: ScheduleState | None = None,
              cursor: Annotated[str | None, Query(max_length=200)] = None,
              limit: Annotated[int, Query(ge=1, le=200)] = 50) -> SchedulePage:
        with pool.connection() as conn:
            rows = list_schedules(conn, tenant_id, state=state, after=_page_after(cursor),
                                  limit=limit + 1)
        last = rows[limit - 1] if len(rows) > limit else None
        return SchedulePage(
            schedules=[_schedule(row) for row in rows[:limit]],
            next_cursor=None if last is None else _encode(last["created_at"].isoformat(),
                                                          last["schedule_id"]))

    @app.put("/v1/schedules/{schedule_id}", response_model=Schedule, responses={
        409: {"description": "the schedule's current occurrence is running "
                             "(schedule_running), it is cancelled or completed, or it would "
                             "put the tenant over its strict allowance "
                             "(strict_allowance_exceeded)"}})
    def update(schedule_id: str, body: ScheduleBody, tenant_id: Submitting) -> Schedule:
        spec = _spec(body)
        with pool.connection() as conn:
            return _schedule(replace_schedule(conn, tenant_id, _schedule_id(schedule_id), spec))

    def state_route(suffix: str, change: StateChange) -> None:
        @app.post(f"/v1/schedules/{{schedule_id}}:{suffix}", response_model=Schedule,
                  name=f"{suffix}_schedule",
                  responses={409: {"description": "not possible from the schedule's state, or a "
                                                  "resume over the strict allowance"}})
        def changed(schedule_id: str, tenant_id: Submitting) -> Schedule:
            with pool.connection() as conn:
                return _schedule(change_state(conn, tenant_id, _schedule_id(schedule_id), change))

    state_route("pause", StateChange.PAUSE)
    state_route("resume", StateChange.RESUME)
    state_route("cancel", StateChange.CANCEL)

    @app.get("/v1/schedules/{schedule_id}/runs", response_model=RunPage)
    def runs(schedule_id: str, tenant_id: Tenant,
             cursor: Annotated[str | None, Query(max_length=200)] = None,
             limit: Annotated[int, Query(ge=1, le=200)] = 50) -> RunPage:
        with pool.connection() as conn:
            rows = schedule_runs(conn, tenant_id, _schedule_id(schedule_id),
                                 before=_runs_before(cursor), limit=limit + 1)
        last = rows[limit - 1] if len(rows) > limit else None
        return RunPage(runs=[Run(**row) for row in rows[:limit]],
                       next_cursor=None if last is None else _encode(last["scheduled_for"].isoformat()))
