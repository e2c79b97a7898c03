"""The cell stack's one error hierarchy.

Each error carries a machine-readable ``code`` and the HTTP status it maps to at
the API's edge; the FastAPI exception handler renders every ``CellError`` the
same way, so no path answers a client with a bare 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "CellError",
    "NotWritableError",
    "StaleEpochError",
    "LeaseExpiredError",
    "CellFencedError",
    "UnauthenticatedError",
    "NotFoundError",
    "ConflictError",
    "StrictAllowanceExceededError",
    "RetryLaterError",
    "RateLimitedError",
    "UnavailableError",
    "TenantPausedError",
    "TenantMovingError",
    "InsufficientFundsError",
    "InvalidRequestError",
    "TargetRefusedError",
]


class CellError(Exception):
    code = "cell_error"
    http_status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    @property
    def details(self) -> Mapping[str, Any]:
        """Fields the error body carries beside ``code`` and ``message``."""
        return {}


class NotWritableError(CellError):
    """The database refused a write: this process does not own the placement group now."""

    code = "not_owner"
    http_status = 503


class StaleEpochError(NotWritableError):
    code = "stale_epoch"


class LeaseExpiredError(NotWritableError):
    code = "lease_expired"


class CellFencedError(NotWritableError):
    """The owner keeps the cell but a person fenced its writes (``kubectl cellplane fence``):
    no other owner comes until the fence is lifted, so asking another site is no use."""

    code = "cell_fenced"


class UnauthenticatedError(CellError):
    code = "unauthenticated"
    http_status = 401


class NotFoundError(CellError):
    code = "not_found"
    http_status = 404


class ConflictError(CellError):
    code = "conflict"
    http_status = 409


class StrictAllowanceExceededError(ConflictError):
    """The tenant would have more active strict schedules than its allowance, or asked
    for CRITICAL work without one (domain/strict_allowance.py)."""

    code = "strict_allowance_exceeded"

    def __init__(self, message: str, *, allowance: int, in_use: int) -> None:
        super().__init__(message)
        self.allowance = allowance
        self.in_use = in_use

    @property
    def details(self) -> Mapping[str, Any]:
        return {"allowance": self.allowance, "in_use": self.in_use}


class RetryLaterError(CellError):
    """Refused for now; the answer carries ``Retry-After``."""

    def __init__(self, message: str, *, retry_after_seconds: float, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_seconds = retry_after_seconds


class RateLimitedError(RetryLaterError):
    code = "rate_limited"
    http_status = 429


class UnavailableError(RetryLaterError):
    """The cell cannot serve this now (database busy or away, tenant being moved)."""

    code = "unavailable"
    http_status = 503


class TenantMovingError(UnavailableError):
    """The database refused a write of a tenant that is cutting over to another cell,
    or has moved out (the tenant fence, migration 0006). Not a fencing of this
    process: other tenants' writes go on, and this tenant's resume in its new cell."""

    code = "tenant_moving"

    def __init__(self, message: str, *, retry_after_seconds: float = 1.0,
                 code: str | None = None) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds, code=code)


class TenantPausedError(CellError):
    code = "tenant_paused"
    http_status = 409


class InsufficientFundsError(CellError):
    code = "insufficient_funds"
    http_status = 402


class InvalidRequestError(CellError):
    code = "invalid_request"
    http_status = 422


class TargetRefusedError(InvalidRequestError):
    """A target or webhook URL the cell will not call (unregistered, or an SSRF risk)."""

    code = "target_refused"
