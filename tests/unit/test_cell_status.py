"""The Cell status its owner writes, from what it observed of its sites."""

from __future__ import annotations

import datetime
from dataclasses import replace

from cellplane_operator.domain.cells import CellObservation, StandbyReport, plan_cell_status

NOW = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)
SERVING = CellObservation(generation=3, active_region="region-a", active_site="c1@region-a",
                          epoch=4, fenced=False, database_up=True, serving=True,
                          api_endpoint="http://127.0.0.1:1", admin_endpoint="http://127.0.0.1:2")


def conditions(status: dict[str, object]) -> dict[str, dict[str, object]]:
    found = status["conditions"]
    assert isinstance(found, list)
    return {c["type"]: c for c in found}


def test_a_serving_primary_without_standbys_is_ready_with_its_epoch_and_endpoints() -> None:
    status = plan_cell_status(SERVING, current_conditions=[], now=NOW)
    assert (status["phase"], status["epoch"], status["activeRegion"]) == ("Ready", 4, "region-a")
    assert status["endpoints"] == {"api": "http://127.0.0.1:1", "admin": "http://127.0.0.1:2"}
    ready = conditions(status)["Ready"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "Serving", 3)
    assert conditions(status)["Degraded"]["reason"] == "NoStandbyConfigured"


def test_each_obstacle_before_serving_has_its_own_reason() -> None:
    cases = [
        (replace(SERVING, database_up=False, problem="initdb failed"), "DatabaseNotRunning"),
        (replace(SERVING, epoch=None), "AwaitingOwnership"),
        (replace(SERVING, serving=False), "ProcessesStarting"),
        (replace(SERVING, fenced=True), "Fenced"),
    ]
    for observed, reason in cases:
        status = plan_cell_status(observed, current_conditions=[], now=NOW)
        assert conditions(status)["Ready"]["reason"] == reason
        assert status["phase"] == ("Fenced" if reason == "Fenced" else "Provisioning")
        assert "endpoints" not in status or observed.serving


def test_standbys_must_stream_before_the_first_ready_and_later_only_degrade_it() -> None:
    waiting = replace(SERVING, epoch=1, standby_regions=("region-b",),
                      standbys=(StandbyReport("region-b", False, None, "base backup"),))
    first = plan_cell_status(waiting, current_conditions=[], now=NOW)
    assert first["phase"] == "Provisioning"
    assert "region-b not streaming (base backup)" in conditions(first)["Ready"]["message"]

    streaming = replace(waiting, standbys=(StandbyReport("region-b", True, 0.4),))
    ready = plan_cell_status(streaming, current_conditions=first["conditions"], now=NOW)  # type: ignore[arg-type]
    assert ready["phase"] == "Ready" and ready["standbyLagSeconds"] == 0.4
    assert ready["standbys"] == [{"region": "region-b", "streaming": True, "message": "",
                                  "lagSeconds": 0.4}]

    lagging = replace(streaming, standbys=(StandbyReport("region-b", True, 95.0),),
                      previous_phase="Ready")
    degraded = plan_cell_status(lagging, current_conditions=ready["conditions"], now=NOW)  # type: ignore[arg-type]
    assert degraded["phase"] == "Degraded"
    assert conditions(degraded)["Ready"]["status"] == "True"
    assert "95.0s behind (max 30s)" in conditions(degraded)["Degraded"]["message"]


def test_after_a_takeover_the_cell_serves_at_once_degraded_until_the_old_site_streams() -> None:
    taken_over = replace(SERVING, epoch=2, active_region="region-b", active_site="c1@region-b",
                         standby_regions=("region-a",), previous_phase="FailingOver",
                         standbys=(StandbyReport("region-a", False, None, "old primary"),))
    status = plan_cell_status(taken_over, current_conditions=[], now=NOW)
    assert status["phase"] == "Degraded" and status["endpoints"]
    assert conditions(status)["Ready"]["status"] == "True"


def test_draining_cells_keep_serving_and_say_so() -> None:
    status = plan_cell_status(replace(SERVING, draining=True), current_conditions=[], now=NOW)
    assert status["phase"] == "Draining"
    assert conditions(status)["Ready"]["status"] == "True"


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = plan_cell_status(replace(SERVING, serving=False), current_conditions=[], now=NOW)
    later = NOW + datetime.timedelta(minutes=5)
    still = plan_cell_status(replace(SERVING, serving=False, problem="slow"),
                             current_conditions=first["conditions"], now=later)  # type: ignore[arg-type]
    assert conditions(still)["Ready"]["lastTransitionTime"] == "2026-11-29T08:00:00Z"
    flipped = plan_cell_status(SERVING, current_conditions=still["conditions"], now=later)  # type: ignore[arg-type]
    assert conditions(flipped)["Ready"]["lastTransitionTime"] == "2026-11-29T08:05:00Z"
