"""When a controller looks at a key again after it could not finish it."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["RetrySchedule", "FailureLog"]

K = TypeVar("K", bound=Hashable)

_NUMBERS = re.compile(r"\d+")


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

    def waiting(self, key: K) -> bool:
        """A retry of ``key`` is pending: a periodic resync leaves it to that retry, or
        a key that keeps failing would be tried every resync whatever its backoff."""
        return key in self._pending

    def reset(self, key: K) -> None:
        """``key`` got through (or changed): its next retry waits the first delay again."""
        self._delays.pop(key, None)

    def _due(self, key: K) -> None:
        self._pending.discard(key)
        self._wake(key)


class FailureLog(Generic[K]):
    """Says each distinct failure of a key once.

    A key that fails the same way on every retry logged a warning each time (one
    operator logged 1,242 in minutes for a handful of tenants): the first of a kind
    is news, the repeats are not. A different failure, or the same one after the key
    got through, is said again.
    """

    def __init__(self) -> None:
        self._last: dict[K, str] = {}

    def is_new(self, key: K, failure: str) -> bool:
        """Records ``failure`` of ``key``; True if it differs from the one before.

        Numbers do not tell failures apart: a refusal that quotes the time, a port or
        a deadline ("may act until 18:19:43, it is now 18:19:44") is the same failure
        at every retry."""
        kind = _NUMBERS.sub("#", failure)
        if self._last.get(key) == kind:
            return False
        self._last[key] = kind
        return True

    def cleared(self, key: K) -> None:
        """``key`` got through: its next failure is news again."""
        self._last.pop(key, None)
