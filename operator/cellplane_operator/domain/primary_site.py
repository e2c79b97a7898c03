"""What the primary site of a cell runs, and when its status is worth writing.

The site runner (``runtime/cellsite.py``) reads its database, processes and
grant, asks these rules and acts. Processes start only once the database holds
the epoch's grant: a worker the database refuses as stale stops taking work
for good, and would only be restarted to be refused again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellplane_cells.domain.priorities import Floors

__all__ = ["worker_processes", "WorkerSetup", "PrimaryProcesses", "must_start_serving",
           "status_write_due", "without_lag"]


def worker_processes(*, configured: int, fence_asked: bool, fence_in_force: bool) -> int:
    """No workers while a person's fence is asked for or the database still holds a fenced
    grant: a worker the database refuses stops for good (and would be restarted)."""
    return 0 if fence_asked or fence_in_force else configured


@dataclass(frozen=True)
class WorkerSetup:
    """What the site's workers are started with; a change of any part restarts them."""

    processes: int
    """Worker processes (``worker_processes``)."""
    slots: int
    """Slots of each worker."""
    floors: Floors | None
    """Each worker's floors per priority class; None: the worker's default shares."""

    def described(self) -> str:
        """For the Event that says the workers were (re)started."""
        floors = "default floors" if self.floors is None \
            else f"floors {self.floors.as_text()}"
        return f"{self.processes} worker process(es) ({self.slots} slots each, {floors})"


@dataclass(frozen=True)
class PrimaryProcesses:
    """The primary site as its runner last saw it."""

    epoch: int | None
    """The epoch this site holds; None: it holds none."""
    granted_epoch: int | None
    """The epoch the cell database last granted write time under."""
    database_up: bool
    running_epoch: int | None
    """The epoch the site's processes run under, as its health check says."""
    serving_epoch: int | None
    """The epoch the runner last started the processes (with workers) under."""
    serving_workers: WorkerSetup | None
    """The workers the runner last started."""
    workers: WorkerSetup
    """The workers the site should run now (from the Cell, and ``worker_processes``)."""


def must_start_serving(site: PrimaryProcesses) -> bool:
    """Must the API and workers be (re)started under the site's epoch? Only once the grant
    is in the database; then whenever they run under another epoch, were not started by
    this runner (an API warmed up on the standby this site was runs without workers), or
    run other workers than the site should (a fence put on or lifted, the Cell's slots or
    priority floors changed)."""
    if site.epoch is None or site.granted_epoch != site.epoch or not site.database_up:
        return False
    return (site.running_epoch != site.epoch or site.serving_epoch != site.epoch
            or site.serving_workers != site.workers)


def without_lag(status: Mapping[str, Any]) -> dict[str, Any]:
    """The Cell's status without its lag readings, which change at every look."""
    trimmed = {k: v for k, v in status.items() if k != "standbyLagSeconds"}
    trimmed["standbys"] = [{k: v for k, v in s.items() if k != "lagSeconds"}
                           for s in status.get("standbys", [])]
    return trimmed


def status_write_due(status: Mapping[str, Any], last: Mapping[str, Any] | None, *,
                     seconds_since_last: float, refresh_seconds: float) -> bool:
    """Is this Cell status worth writing, after ``last`` was written
    ``seconds_since_last`` ago? Any change but of the lag numbers, at once; a change only
    in lag numbers at most every ``refresh_seconds``; no change, never."""
    if status == last:
        return False
    if last is not None and without_lag(status) == without_lag(last):
        return seconds_since_last >= refresh_seconds
    return True
