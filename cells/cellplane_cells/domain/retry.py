"""What to do after a step's call failed: retry later, or give up now.

Exponential backoff with full jitter (a uniform delay between 0 and the capped
exponential), so a crowd of jobs that failed together does not retry together.
Permanent errors go to dead-letter at once: a 4xx other than 408 and 429 means
the request itself is wrong and will be wrong again.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["RetryPolicy", "Outcome", "classify_status", "decide", "retry_after_seconds"]


@dataclass(frozen=True)
class RetryPolicy:
    base_seconds: float = 1.0
    """Delay ceiling of the first retry."""
    cap_seconds: float = 300.0
    """No retry waits longer than this."""


@dataclass(frozen=True)
class Outcome:
    permanent: bool
    delay_seconds: float
    error_code: str


def classify_status(status_code: int | None) -> tuple[bool, str]:
    """(permanent?, error code) for an HTTP status, or for no answer at all (None)."""
    if status_code is None:
        return False, "target_unreachable"
    if status_code in (408, 429):
        return False, f"target_{status_code}"
    if 400 <= status_code < 500:
        return True, f"target_{status_code}"
    return False, f"target_{status_code}"


def decide(
    *, attempt: int, status_code: int | None, policy: RetryPolicy, rng: random.Random,
    retry_after_seconds: float | None = None,
) -> Outcome:
    """``attempt`` is the attempt that just failed, from 1."""
    permanent, code = classify_status(status_code)
    if permanent:
        return Outcome(permanent=True, delay_seconds=0.0, error_code=code)
    ceiling = min(policy.cap_seconds, policy.base_seconds * 2 ** max(attempt - 1, 0))
    delay = rng.uniform(0, ceiling)
    if retry_after_seconds is not None:
        # The target said when it can take more; never earlier than that.
        delay = max(delay, min(retry_after_seconds, policy.cap_seconds))
    return Outcome(permanent=False, delay_seconds=delay, error_code=code)


def retry_after_seconds(header: str | None) -> float | None:
    """A ``Retry-After`` header's delay in seconds, never below 0; None when there is no
    header or it is not a number (an HTTP date, which no cell sends: each caller has its
    own fallback)."""
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return None if math.isnan(seconds) else max(seconds, 0.0)
