"""Named crash points for fault-injection tests, off unless CELLPLANE_FAILPOINTS names them.

A test starts the operator with ``CELLPLANE_FAILPOINTS=tenant-after-record`` (or
``tenant-after-record@team-a/acme`` for one tenant only) and
the process dies at that point as abruptly as a SIGKILL would (``os._exit``:
no cleanup, no finally blocks), so the test can restart it and check that the
work resumes from the state left behind and is never done twice.

A slowness point is named with a duration, ``move-slow-delta=3`` (or
``move-slow-delta@team-a/acme=3``): ``delay`` answers those seconds, and the
caller sleeps them where the real work would be slow (a loaded machine).
"""

from __future__ import annotations

import logging
import os

__all__ = ["failpoint", "delay"]

EXIT_CODE = 86


def failpoint(name: str, subject: str = "") -> None:
    """Exits if ``name`` is enabled, for any subject, or as ``name@subject`` for this one."""
    enabled = os.environ.get("CELLPLANE_FAILPOINTS", "")
    if enabled and (name in enabled.split(",") or f"{name}@{subject}" in enabled.split(",")):
        logging.getLogger(__name__).critical("failpoint %s (%s): exiting now", name, subject)
        logging.shutdown()
        os._exit(EXIT_CODE)


def delay(name: str, subject: str = "") -> float:
    """Seconds of slowness named by ``name=seconds`` or ``name@subject=seconds``; 0 if none."""
    for item in os.environ.get("CELLPLANE_FAILPOINTS", "").split(","):
        point, _, seconds = item.partition("=")
        if seconds and point in (name, f"{name}@{subject}"):
            return float(seconds)
    return 0.0
