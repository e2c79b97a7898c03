"""The controllers' work queue: level-triggered, one reconcile of a key at a time,
retries with backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from cellplane_operator.errors import CellplaneError
from cellplane_operator.runtime.workqueue import WorkQueue


class NotMine(Exception):
    pass


class Recorder:
    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.most_at_once: Counter[str] = Counter()
        self.release = asyncio.Event()
        self.release.set()
        self.failing: dict[str, BaseException] = {}
        self.ran = asyncio.Event()

    async def reconcile(self, key: str) -> None:
        self.runs[key] += 1
        self.in_flight[key] += 1
        self.most_at_once[key] = max(self.most_at_once[key], self.in_flight[key])
        try:
            await self.release.wait()
            if key in self.failing:
                raise self.failing[key]
        finally:
            self.in_flight[key] -= 1
            self.ran.set()


@contextlib.asynccontextmanager
async def running(queue: WorkQueue[str], workers: int = 2) -> AsyncIterator[None]:
    task = asyncio.create_task(queue.run(workers))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: object, timeout: float = 10) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_a_key_added_many_times_before_it_runs_is_reconciled_once() -> None:
    recorder = Recorder()
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=60,
                                      retry_ceiling_seconds=60)
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    async with running(queue):
        await until(lambda: recorder.runs["a"] == 1 and recorder.runs["b"] == 1)
        await asyncio.sleep(0)
    assert recorder.runs == Counter({"a": 1, "b": 1})


async def test_a_key_added_while_it_runs_runs_once_more_after_never_beside_itself() -> None:
    recorder = Recorder()
    recorder.release.clear()
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=60,
                                      retry_ceiling_seconds=60)
    queue.add("a")
    async with running(queue, workers=3):
        await until(lambda: recorder.in_flight["a"] == 1)
        for _ in range(3):
            queue.add("a")
        await asyncio.sleep(0.05)  # three idle workers had every chance to take it
        assert recorder.runs["a"] == 1
        recorder.release.set()
        await until(lambda: recorder.runs["a"] == 2 and recorder.in_flight["a"] == 0)
    assert recorder.most_at_once["a"] == 1
    assert recorder.runs["a"] == 2


async def test_a_failing_key_is_retried_with_a_growing_delay_and_resync_leaves_it_alone() -> None:
    recorder = Recorder()
    recorder.failing["a"] = CellplaneError("cell not answering")
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=0.05,
                                      retry_ceiling_seconds=0.4)
    queue.add("a")
    async with running(queue):
        await until(lambda: recorder.runs["a"] >= 4)
        queue.resync(["a"])  # a retry is pending: the resync adds nothing
        runs = recorder.runs["a"]
        await asyncio.sleep(0)
        assert recorder.runs["a"] == runs
        del recorder.failing["a"]
        queue.changed("a")
        await until(lambda: recorder.runs["a"] > runs and recorder.in_flight["a"] == 0)


async def test_retries_back_off_rather_than_spin() -> None:
    recorder = Recorder()
    recorder.failing["a"] = CellplaneError("refused")
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=0.05,
                                      retry_ceiling_seconds=10)
    queue.add("a")
    async with running(queue):
        await asyncio.sleep(0.5)
    # 0.05 + 0.1 + 0.2 fit in half a second, 0.4 more does not: four runs at most (a busy
    # machine runs fewer; that retries happen at all is the test above).
    assert 1 <= recorder.runs["a"] <= 4


async def test_an_ignored_failure_is_not_retried() -> None:
    recorder = Recorder()
    recorder.failing["a"] = NotMine()
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=0.01,
                                      retry_ceiling_seconds=0.01, ignored=(NotMine,))
    queue.add("a")
    async with running(queue):
        await until(lambda: recorder.runs["a"] == 1 and recorder.in_flight["a"] == 0)
        await asyncio.sleep(0.1)
    assert recorder.runs["a"] == 1


@pytest.mark.parametrize("failure", [ValueError("a bug"), CellplaneError("refused")])
async def test_any_failure_keeps_the_workers_going(failure: BaseException) -> None:
    recorder = Recorder()
    recorder.failing["a"] = failure
    queue: WorkQueue[str] = WorkQueue(recorder.reconcile, first_retry_seconds=60,
                                      retry_ceiling_seconds=60)
    queue.add("a")
    async with running(queue, workers=1):
        await until(lambda: recorder.runs["a"] == 1 and recorder.in_flight["a"] == 0)
        queue.add("b")
        await until(lambda: recorder.runs["b"] == 1)
