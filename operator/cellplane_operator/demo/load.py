"""The demo's job target and its clients.

The target is the tenants' step endpoint on 127.0.0.1: it takes a little time
per step (so running slots fill) and records every call, which is how the demo
sees a job run twice. Each client submits one tenant's jobs through the routers,
each idempotency key until it is acknowledged (a 429 after its Retry-After, a
503 or a broken connection at once, with the same key, as a client should), so
the acknowledged keys are exactly what the platform promised to run. A client
starts at its home region's router and moves to the next one when that one
does not answer, as a client behind a regional DNS name would.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from cellplane_cells.domain.retry import retry_after_seconds

from cellplane_operator.demo.summary import StepCall, step_call
from cellplane_operator.localplane.ports import LOOPBACK

__all__ = ["JobTarget", "Ack", "TenantLoad"]

_RETRY_AFTER_CAP_SECONDS = 1.0
"""A 429's Retry-After is obeyed up to this, so a stopped load does not linger."""


class JobTarget:
    """A threaded HTTP server answering every step 200 after ``step_seconds``."""

    def __init__(self, *, step_seconds: float, port: int = 0) -> None:
        self.calls: list[StepCall] = []
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target._record(body, self.headers.get("Idempotency-Key") or "")
                time.sleep(step_seconds)  # the step's work
                answer = b'{"ok": true}'
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the calling worker was killed with its region: nobody to answer

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="demo job target")

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}/run"

    def start(self) -> JobTarget:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def snapshot(self) -> list[StepCall]:
        with self._lock:
            return list(self.calls)

    def _record(self, body: bytes, key: str) -> None:
        try:
            call = json.loads(body)
        except ValueError:
            return  # not a step of the demo's jobs
        recorded = step_call(call, key) if isinstance(call, dict) else None
        if recorded is None:
            return
        with self._lock:
            self.calls.append(recorded)


@dataclass(frozen=True)
class Ack:
    sent_at: float
    """time.monotonic() when the acknowledged attempt was sent."""
    at: float
    key: str
    job_id: str
    status: int
    """202 for a new job, 200 for a replay of a key some site had accepted already."""


@dataclass
class TenantLoad:
    tenant: str
    routers: list[str]
    """Base URLs, the tenant's home region's router first."""
    api_key: str
    rate: float
    """Jobs a second over all its clients."""
    prefix: str
    clients: int = 1
    """Submitting at once, each its own keys: one client waits for each answer, so a
    tenant that floods needs several."""
    acks: list[Ack] = field(default_factory=list)
    refused: int = 0
    """Attempts answered 429."""
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> TenantLoad:
        for client in range(self.clients):
            thread = threading.Thread(target=self._run, args=(f"{self.prefix}.{client}",),
                                      daemon=True, name=f"demo load {self.tenant} {client}")
            thread.start()
            self._threads.append(thread)
        return self

    def finish(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def acknowledged(self) -> dict[str, str]:
        """job id -> the idempotency key it was acknowledged under."""
        return {ack.job_id: ack.key for ack in list(self.acks)}

    def _run(self, prefix: str) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        router = 0
        interval = self.clients / self.rate
        with httpx.Client(timeout=httpx.Timeout(40, connect=2)) as client:
            number = 0
            while not self.stop.is_set():
                key = f"{prefix}-{number}"
                while not self.stop.is_set():
                    sent_at = time.monotonic()
                    try:
                        answer = client.post(
                            f"{self.routers[router]}/v1/jobs",
                            json={"target": "default", "steps": 2,
                                  "payload": {"key": key, "n": number}},
                            headers={**headers, "Idempotency-Key": key})
                    except httpx.TransportError:
                        # This region's router is gone (its region was lost): the next one.
                        router = (router + 1) % len(self.routers)
                        self.stop.wait(0.2)
                        continue
                    if answer.status_code in (200, 202):
                        self.acks.append(Ack(sent_at, time.monotonic(), key,
                                             str(answer.json()["job_id"]), answer.status_code))
                        break
                    if answer.status_code == 429:
                        self.refused += 1
                        self.stop.wait(_retry_after(answer))
                    else:
                        self.stop.wait(0.2)
                number += 1
                self.stop.wait(max(0.0, interval - (time.monotonic() - sent_at)))


def _retry_after(answer: httpx.Response) -> float:
    """The 429's delay, capped; 1 s without one, the cap for one that is no number."""
    header = answer.headers.get("Retry-After") or None
    seconds = 1.0 if header is None else retry_after_seconds(header)
    return min(_RETRY_AFTER_CAP_SECONDS if seconds is None else seconds,
               _RETRY_AFTER_CAP_SECONDS)
