"""A ``GroupActor`` that reports each transition as a JSON line, then delegates.

Used by ``cellplane ownership hold`` so that people, and the fault-injection
tests, can see exactly when a process started and stopped acting, on its own
monotonic clock.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TextIO

from cellplane_operator.ownership.holder import GroupActor

__all__ = ["ReportingActor"]


class ReportingActor:
    def __init__(self, inner: GroupActor | None, *, out: TextIO = sys.stdout) -> None:
        self._inner = inner
        self._out = out
        self.acquisition: Callable[[], dict[str, object]] = dict
        """More of what the holder saw, said with ``acting``: when it saw the previous owner's
        key gone (``vacated_at``), so that a test measures the margin the holder itself
        waited, not against a separate watch that may deliver the deletion later."""

    def _report(self, event: str, **fields: object) -> None:
        self._out.write(json.dumps({"event": event, "monotonic": time.monotonic(), **fields}) + "\n")
        self._out.flush()

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        if self._inner is not None:
            await self._inner.start_acting(epoch, remaining_seconds)
        self._report("acting", epoch=epoch, remaining=remaining_seconds, **self.acquisition())

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        if self._inner is not None:
            await self._inner.renew_grant(epoch, remaining_seconds)
        self._report("renewed", epoch=epoch, remaining=remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        # Reported first: stopping is decided now, whatever the database says.
        self._report("stopped", epoch=epoch, reason=reason)
        if self._inner is not None:
            await self._inner.stop_acting(epoch, reason)
