"""asyncio plumbing the loops share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["first_of", "running"]


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Returns when any of ``events`` is set, or after ``timeout`` seconds (None: never),
    leaving no waiter behind."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


@asynccontextmanager
async def running(*coroutines: Coroutine[Any, Any, None]) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Runs ``coroutines`` as tasks for the body of the ``async with``; on the way out,
    however it is left, every one of them is cancelled and awaited, so none outlives it."""
    tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
