"""The primary site's processes and status writes, decided purely."""

from __future__ import annotations

from dataclasses import replace

from cellplane_cells.domain.priorities import Floors, Priority
from cellplane_operator.domain.primary_site import (
    PrimaryProcesses, WorkerSetup, must_start_serving, status_write_due, worker_processes,
)

TWO = WorkerSetup(processes=2, slots=10, floors=None)
SERVING = PrimaryProcesses(epoch=3, granted_epoch=3, database_up=True, running_epoch=3,
                           serving_epoch=3, serving_workers=TWO, workers=TWO)


def test_no_workers_while_a_fence_is_asked_for_or_still_in_force() -> None:
    assert worker_processes(configured=2, fence_asked=False, fence_in_force=False) == 2
    assert worker_processes(configured=2, fence_asked=True, fence_in_force=False) == 0
    assert worker_processes(configured=2, fence_asked=False, fence_in_force=True) == 0


def test_a_site_serving_as_it_should_is_left_alone() -> None:
    assert not must_start_serving(SERVING)


def test_nothing_starts_before_the_grant_or_without_a_database_or_an_epoch() -> None:
    assert not must_start_serving(replace(SERVING, running_epoch=None, granted_epoch=2))
    assert not must_start_serving(replace(SERVING, running_epoch=None, database_up=False))
    assert not must_start_serving(replace(SERVING, running_epoch=None, epoch=None))


def test_processes_under_another_epoch_are_started_under_this_one() -> None:
    assert must_start_serving(replace(SERVING, running_epoch=2))


def test_an_api_warmed_up_on_the_standby_gets_its_workers() -> None:
    # The processes run under the epoch already, but this runner never started them.
    assert must_start_serving(replace(SERVING, serving_epoch=None, serving_workers=None))


def test_a_fence_put_on_or_lifted_restarts_with_the_new_number_of_workers() -> None:
    assert must_start_serving(replace(SERVING, workers=replace(TWO, processes=0)))
    assert must_start_serving(replace(SERVING, serving_workers=replace(TWO, processes=0)))


def test_new_slots_or_priority_floors_on_the_cell_restart_the_workers() -> None:
    floors = Floors(10, {Priority.CRITICAL: 4})
    assert must_start_serving(replace(SERVING, workers=replace(TWO, floors=floors)))
    assert must_start_serving(replace(SERVING, workers=replace(TWO, slots=5)))
    with_floors = replace(SERVING, serving_workers=replace(TWO, floors=floors),
                          workers=replace(TWO, floors=Floors(10, {Priority.CRITICAL: 4})))
    assert not must_start_serving(with_floors)


def test_the_serving_event_says_what_the_workers_run_with() -> None:
    assert TWO.described() == "2 worker process(es) (10 slots each, default floors)"
    floors = Floors(10, {Priority.CRITICAL: 4, Priority.LOW: 1})
    assert replace(TWO, floors=floors).described() == (
        "2 worker process(es) (10 slots each, floors CRITICAL=4,HIGH=0,DEFAULT=0,LOW=1)")


STATUS = {"phase": "Ready", "standbyLagSeconds": 0.5,
          "standbys": [{"region": "region-b", "streaming": True, "lagSeconds": 0.5}]}
LAGGED = {**STATUS, "standbyLagSeconds": 0.9,
          "standbys": [{"region": "region-b", "streaming": True, "lagSeconds": 0.9}]}


def test_the_first_status_and_any_real_change_are_written_at_once() -> None:
    assert status_write_due(STATUS, None, seconds_since_last=0.0, refresh_seconds=10)
    assert status_write_due({**STATUS, "phase": "Degraded"}, STATUS, seconds_since_last=0.0,
                            refresh_seconds=10)


def test_the_same_status_is_not_written_again() -> None:
    assert not status_write_due(STATUS, dict(STATUS), seconds_since_last=60.0,
                                refresh_seconds=10)


def test_a_change_only_in_lag_numbers_waits_for_the_refresh() -> None:
    assert not status_write_due(LAGGED, STATUS, seconds_since_last=9.9, refresh_seconds=10)
    assert status_write_due(LAGGED, STATUS, seconds_since_last=10.0, refresh_seconds=10)
