"""Whether a refused request is sent again, and after how long: a pure decision.

API Priority and Fairness answers 429 with a Retry-After when a priority level's
queues are full; an apiserver that is starting, or shedding load, answers 503
with one. client-go waits the Retry-After seconds and sends the request again, up
to ten times; so does this client, with fewer attempts and a ceiling on the
wait, since a caller of the operator (a status write, a CLI) has a deadline of
its own. A 429 without Retry-After waits a second. The request was not acted on
in either case, so a POST is as safe to repeat as a GET. Nothing else is retried
here: a timeout or a 500 may have been applied, and the callers decide.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryPolicy", "retry_delay"]


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    """Requests in all, the first included."""
    ceiling_seconds: float = 10.0
    """The longest wait, whatever Retry-After says."""
    default_seconds: float = 1.0
    """The wait after a 429 that gave no (readable) Retry-After."""


def retry_delay(status: int, retry_after: str | None, attempt: int,
                policy: RetryPolicy = RetryPolicy()) -> float | None:
    """Seconds to wait before sending again the request whose ``attempt``-th try (from 1)
    was answered ``status``, or None to give its answer to the caller."""
    if attempt >= policy.attempts:
        return None
    seconds = _seconds(retry_after)
    if status == 429:
        return min(policy.default_seconds if seconds is None else seconds,
                   policy.ceiling_seconds)
    if status == 503 and seconds is not None:
        return min(seconds, policy.ceiling_seconds)
    return None


def _seconds(retry_after: str | None) -> float | None:
    """Retry-After in seconds (an HTTP date is not read: the apiserver sends seconds)."""
    if retry_after is None:
        return None
    try:
        seconds = int(retry_after.strip())
    except ValueError:
        return None
    return float(seconds) if seconds >= 0 else None
