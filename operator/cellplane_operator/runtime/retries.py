"""When a controller looks at a key again after it could not finish it."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["RetrySchedule"]

K = TypeVar("K", bound=Hashable)


class RetrySchedule(Generic[K]):
    """A delay per key that doubles with each retry up to a ceiling, and at most one
    retry pending per key.

    The one pending retry matters: every other wake-up of a key that fails too (a
    resync, a change of its cell) would otherwise start a chain of retries of its own,
    and the attempts on one key multiplied with time. A tenant whose status the
    operator was not allowed to write was tried 19 times a second after 90 s.
    """

    def __init__(self, wake: Callable[[K], None], *, first_seconds: float,
                 ceiling_seconds: float,
                 call_later: Callable[[float, Callable[[], None]], object]) -> None:
        self._wake = wake
        self._first = first_seconds
        self._ceiling = ceiling_seconds
        self._call_later = call_later
        self._delays: dict[K, float] = {}
        self._pending: set[K] = set()

    def later(self, key: K) -> None:
        """Wake ``key`` again after its next delay, unless a retry of it is pending."""
        if key in self._pending:
            return
        delay = min(self._delays[key] * 2, self._ceiling) if key in self._delays else self._first
        self._delays[key] = delay
        self._pending.add(key)
        self._call_later(delay, lambda: self._due(key))

    def reset(self, key: K) -> None:
        """``key`` got through (or changed): its next retry waits the first delay again."""
        self._delays.pop(key, None)

    def _due(self, key: K) -> None:
        self._pending.discard(key)
        self._wake(key)
