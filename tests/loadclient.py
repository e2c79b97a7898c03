"""A client of the job API for tests: submits jobs through the router under load.

Each idempotency key is retried until acknowledged (a 503 or a broken
connection is retried with the same key, as a client should), so the keys it
holds are exactly the jobs the platform promised to run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from cellplane_operator.localplane.process import wait_for

__all__ = ["Load"]


@dataclass
class Load:
    """One client submitting jobs through the router, each key until it is acknowledged
    (a 503 or a broken connection is retried with the same key, as a client should)."""

    router: str
    api_key: str
    prefix: str
    acknowledged: dict[str, str] = field(default_factory=dict)
    """idempotency key -> job id of the 202 (or replayed 200) the client got."""
    acknowledged_at: list[float] = field(default_factory=list)
    failed_attempts: set[str] = field(default_factory=set)
    """Keys with at least one attempt that got no acknowledgement."""
    stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)

    def wait_for(self, count: int, timeout: float = 60) -> None:
        wanted = len(self.acknowledged) + count
        wait_for(lambda: len(self.acknowledged) >= wanted, timeout=timeout,
                 what=f"{count} more acknowledged jobs (have {len(self.acknowledged)})")

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        with httpx.Client(timeout=40) as client:
            number = 0
            while not self.stop.is_set():
                key = f"{self.prefix}-{number}"
                while True:
                    try:
                        answer = client.post(f"{self.router}/v1/jobs",
                                             json={"target": "default", "payload": {"n": number}},
                                             headers={**headers, "Idempotency-Key": key})
                    except httpx.HTTPError:
                        answer = None
                    if answer is not None and answer.status_code in (200, 202):
                        self.acknowledged[key] = answer.json()["job_id"]
                        self.acknowledged_at.append(time.monotonic())
                        break
                    self.failed_attempts.add(key)
                    if self.stop.is_set():
                        return
                    time.sleep(0.2)
                number += 1
                time.sleep(0.02)  # about 30 jobs a second: a load, not a flood

    def longest_pause(self) -> float:
        times = sorted(self.acknowledged_at)
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)
