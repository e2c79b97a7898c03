"""asyncio plumbing the loops share."""

from __future__ import annotations

import asyncio

__all__ = ["first_of"]


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Returns when any of ``events`` is set, or after ``timeout`` seconds (None: never),
    leaving no waiter behind."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
