"""The asyncio plumbing the controllers share: tasks that never outlive their block."""

from __future__ import annotations

import asyncio

import pytest

from cellplane_operator.aio import first_of, running


async def _forever(started: asyncio.Event) -> None:
    started.set()
    await asyncio.Event().wait()


async def test_running_cancels_every_task_when_its_block_ends() -> None:
    started = [asyncio.Event(), asyncio.Event()]
    async with running(*(_forever(event) for event in started)) as tasks:
        await asyncio.gather(*(event.wait() for event in started))
        assert not any(task.done() for task in tasks)
    assert all(task.cancelled() for task in tasks)


async def test_running_cancels_the_others_when_its_block_fails() -> None:
    started = asyncio.Event()
    with pytest.raises(RuntimeError, match="the body failed"):
        async with running(_forever(started)) as tasks:
            await started.wait()
            raise RuntimeError("the body failed")
    assert tasks[0].cancelled()


async def test_first_of_returns_at_the_first_event_set_and_leaves_no_waiter() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_soon(first.set)
    before = len(asyncio.all_tasks())
    await first_of(first, second)
    await asyncio.sleep(0)  # the cancelled waiter of `second` finishes its cancellation
    assert len(asyncio.all_tasks()) <= before
