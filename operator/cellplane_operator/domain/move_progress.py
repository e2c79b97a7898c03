"""One line that says how far a TenantMove is, from its status as stored: what
``cellplane move --wait`` and the demo print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["render_progress", "ending_reason", "TERMINAL"]

TERMINAL = ("Completed", "Aborted", "Failed")
_PHASE_WIDTH = len("CuttingOver")


def render_progress(status: Mapping[str, Any], *, width: int = 20) -> str:
    """One line that says how far a move is, from its ``status`` (as stored: camelCase).

    ``Copying     [########------------] 4,100/10,000 rows (41%)  delta 12``
    """
    phase = str(status.get("phase") or "Pending")
    progress: Mapping[str, Any] = status.get("progress") or {}
    copied, total = _count(progress.get("rowsCopied")), _count(progress.get("rowsTotal"))
    parts = [phase.ljust(_PHASE_WIDTH)]
    if total is not None:
        done = total if total == 0 else min(copied or 0, total)
        filled = width if total == 0 else width * done // total
        share = 100 if total == 0 else 100 * done // total
        parts.append(f"[{'#' * filled}{'-' * (width - filled)}] "
                     f"{copied or 0:,}/{total:,} rows ({share}%)")
    elif copied is not None:
        parts.append(f"{copied:,} rows copied")
    elif phase == "Pending":
        parts.append("waiting for the operator")
    delta = _count(progress.get("currentDelta"))
    if delta is not None and phase not in TERMINAL:
        parts.append(f"delta {delta:,}")
    pause = progress.get("pauseSeconds")
    if isinstance(pause, (int, float)) and not isinstance(pause, bool):
        parts.append(f"pause {pause:.2f}s")
    if phase in ("Aborted", "Failed"):
        parts.append(ending_reason(status))
    return "  ".join(part for part in parts if part).rstrip()


def ending_reason(status: Mapping[str, Any]) -> str:
    """``Reason: message`` of the condition that says why a move is where it is.

    The condition named after the phase (``Failed``, ``Aborted``) if there is one,
    else a ``Completed`` or ``Ready`` that does not hold, else any that does not.
    """
    phase = str(status.get("phase") or "")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]

    def first(match: Any) -> Mapping[str, Any] | None:
        return next((c for c in conditions if match(c)), None)

    why = (first(lambda c: c.get("type") == phase and c.get("status") == "True")
           or first(lambda c: c.get("type") in ("Completed", "Ready") and c.get("status") == "False")
           or first(lambda c: c.get("status") == "False"))
    if why is None:
        return f"{phase or 'ended'}: no condition says why"
    reason, message = str(why.get("reason") or why.get("type")), str(why.get("message") or "")
    return f"{reason}: {message}" if message else reason


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
