"""Events and status are written beside the work, never in its way, and not lost when the
apiserver is away (issue #18 items 10 and 11)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from cellplane_operator.errors import KubeApiError
from cellplane_operator.runtime.kubewrites import EventSender, PendingWrites

NOW = datetime.datetime(2026, 12, 2, tzinfo=datetime.timezone.utc)
CELL = {"kind": "Cell", "metadata": {"name": "c1"}}


class Apiserver:
    """Answers only while ``up`` is set; a request while it is down hangs until it is up
    again and then fails, as a paused apiserver's answer does after the client's timeout."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.events: list[str] = []
        self.patches: list[Any] = []

    async def event(self, involved: Any, *, type_: str, reason: str, message: str,
                    component: str, now: datetime.datetime) -> None:
        await self._answer()
        self.events.append(reason)

    async def patch(self, value: Any) -> None:
        await self._answer()
        self.patches.append(value)

    async def _answer(self) -> None:
        if not self.up.is_set():
            await self.up.wait()
            raise KubeApiError("timed out", status=0)


async def test_recording_an_event_never_waits_and_it_is_posted_once_the_apiserver_is_back() -> None:
    api = Apiserver()
    sender = EventSender(api, component="test")  # type: ignore[arg-type]
    sender.record(CELL, "Normal", "Serving", "serves", at=NOW)
    sender.record(CELL, "Normal", "TookOver", "took over", at=NOW)
    await asyncio.sleep(0)  # the sender's request is now hanging on the paused apiserver
    assert api.events == [] and sender.waiting == 2
    api.up.set()
    await asyncio.wait_for(_until(lambda: sender.waiting == 0), 10)
    assert api.events == ["Serving", "TookOver"]
    await sender.close()


async def test_a_pending_write_is_replaced_by_a_later_value_and_then_runs_once_it_landed() -> None:
    api = Apiserver()
    writes = PendingWrites("c1@region-b")
    stop = asyncio.Event()
    runner = asyncio.create_task(writes.run(stop))
    said: list[str] = []

    async def then() -> None:
        said.append("TookOver")

    writes.offer("status", lambda: api.patch({"phase": "FailingOver"}))
    await asyncio.sleep(0)
    writes.offer("status", lambda: api.patch({"phase": "Ready", "lastTakeover": 2}), then=then)
    assert said == [] and writes.waiting("status")
    api.up.set()
    await asyncio.wait_for(_until(lambda: not writes.waiting("status")), 10)
    # The first write failed while the apiserver was away; only the latest value is written.
    assert api.patches == [{"phase": "Ready", "lastTakeover": 2}]
    assert said == ["TookOver"]
    stop.set()
    await runner


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)
