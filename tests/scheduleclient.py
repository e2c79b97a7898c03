"""The schedules API from a test's side, and a target that holds one schedule's calls.

Reads go through the router and answer None (or {}) while it holds or refuses, so a
test waits on them across a takeover or a move's cutover with ``wait_for``.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from typing import Any

import httpx
from starlette.responses import Response

from httpservers import Call, RecordingServer, ok

__all__ = ["UTC", "HoldingTarget", "schedules_api", "create_schedule", "minutely_and_paused",
           "once_at", "read",
           "runs_of", "succeeded", "assert_one_key_per_occurrence"]

UTC = datetime.timezone.utc


class HoldingTarget:
    """A target that records every call, and holds the calls of one schedule (set later,
    once its id is known) unanswered until released: a run in flight when its region dies
    or its tenant moves."""

    def __init__(self) -> None:
        self.held_schedule: str | None = None
        self.held = threading.Event()
        """Set once a call of ``held_schedule`` arrived."""
        self.released = threading.Event()
        self.server = RecordingServer(respond=self._respond)

    async def _respond(self, call: Call) -> Response:
        key = call.headers.get("idempotency-key", "")
        if self.held_schedule is not None and key.startswith(f"{self.held_schedule}:"):
            self.held.set()
            while not self.released.is_set():
                await asyncio.sleep(0.05)
        answer: Response = await ok(call)
        return answer

    def keys_by_job(self, prefixes: set[str]) -> dict[str, set[str]]:
        """job id -> the idempotency keys its calls carried, for the schedules named."""
        found: dict[str, set[str]] = {}
        for call in self.server.snapshot():
            key = call.headers.get("idempotency-key", "")
            if key.split(":", 1)[0] in prefixes:
                found.setdefault(call.json["job_id"], set()).add(key)
        return found

    def calls_of(self, key: str) -> int:
        return sum(1 for call in self.server.snapshot()
                   if call.headers.get("idempotency-key") == key)


def schedules_api(router: str, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=router, headers={"Authorization": f"Bearer {api_key}"},
                        timeout=40)


def create_schedule(api: httpx.Client, timing: dict[str, str], **body: Any) -> str:
    answer = api.post("/v1/schedules", json={"schedule": timing, "target": "default",
                                             "payload": {"n": 1}, "dispatch_window_seconds": 0,
                                             **body})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["schedule_id"])


def minutely_and_paused(api: httpx.Client) -> tuple[str, str, dict[str, Any] | None]:
    """A minutely RUN_ALL cron (none of its occurrences may be lost) and a paused weekly one,
    read back once paused: its ``next_run_at`` must survive what the test does."""
    cron = create_schedule(api, {"type": "CRON", "cron": "* * * * *", "time_zone": "UTC"},
                           misfire_policy="RUN_ALL")
    paused = create_schedule(api, {"type": "CRON", "cron": "0 8 * * MON", "time_zone": "UTC"})
    assert api.post(f"/v1/schedules/{paused}:pause").status_code == 200
    return cron, paused, read(api, f"/v1/schedules/{paused}")


def once_at(at: datetime.datetime) -> dict[str, str]:
    return {"type": "ONCE", "run_at": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            "time_zone": "UTC"}


def read(api: httpx.Client, path: str) -> dict[str, Any] | None:
    """The answer's body, or None while the router holds or refuses (a takeover under way)."""
    try:
        answer = api.get(path)
    except httpx.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    body: dict[str, Any] = answer.json()
    return body


def runs_of(api: httpx.Client, schedule_id: str) -> dict[datetime.datetime, dict[str, Any]]:
    """The schedule's whole run history, by scheduled time (UTC), or {} while unreadable."""
    runs: dict[datetime.datetime, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        page = read(api, f"/v1/schedules/{schedule_id}/runs?limit=200"
                         + (f"&cursor={cursor}" if cursor else ""))
        if page is None:
            return {}
        for run in page["runs"]:
            runs[datetime.datetime.fromisoformat(run["scheduled_for"])] = run
        cursor = page["next_cursor"]
        if cursor is None:
            return runs


def succeeded(api: httpx.Client, schedule_id: str, at: datetime.datetime) -> bool:
    return (runs_of(api, schedule_id).get(at) or {}).get("status") == "succeeded"


def assert_one_key_per_occurrence(target: HoldingTarget,
                                  histories: dict[str, dict[datetime.datetime, dict[str, Any]]]
                                  ) -> None:
    """No occurrence ran under two keys: each has one run in its schedule's history, so one
    key; every call the target got carried the key of its occurrence's run, whatever job
    made it (a job never changes key); and every run that succeeded reached the target."""
    run_keys = {run["idempotency_key"] for runs in histories.values() for run in runs.values()}
    keys_by_job = target.keys_by_job(set(histories))
    for job_id, keys in keys_by_job.items():
        assert len(keys) == 1, (job_id, keys)
        assert keys <= run_keys, keys
    called = {key for keys in keys_by_job.values() for key in keys}
    assert {run["idempotency_key"] for runs in histories.values() for run in runs.values()
            if run["status"] == "succeeded"} <= called
