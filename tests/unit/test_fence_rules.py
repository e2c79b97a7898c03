"""A fence put on a cell on purpose: what the annotation asks for, how much write time the
owner may grant under it, and what the Cell's status and Events say (``domain/fencing.py``,
``domain/cells.py``). Pure: no apiserver, no database."""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import pytest

from cellplane_operator.domain.cells import CellObservation, plan_cell_status
from cellplane_operator.domain.fencing import (
    DEFAULT_REASON,
    FENCED,
    FenceState,
    ManualFence,
    annotation_value,
    fence_condition,
    fence_event,
    fence_state,
    requested_fence,
    write_time,
)

NOW = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)
LATER = NOW + datetime.timedelta(minutes=5)
SERVING = CellObservation(generation=3, active_region="region-a", active_site="c1@region-a",
                          epoch=4, fenced=False, database_up=True, serving=True,
                          api_endpoint="http://127.0.0.1:1", admin_endpoint="http://127.0.0.1:2")
MAINTENANCE = ManualFence("disk replacement")


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_the_annotation_fences_whatever_its_value_and_only_its_removal_lifts_it() -> None:
    assert requested_fence(None) is None
    assert requested_fence({"other": "x"}) is None
    assert requested_fence({FENCED: "suspected  corruption\n in jobs"}) == ManualFence(
        "suspected corruption in jobs")
    for value in ("", "true", "True", None):
        assert requested_fence({FENCED: value}) == ManualFence(DEFAULT_REASON)
    # "false" is a reason like any other: a fence errs on the side of refusing writes.
    assert requested_fence({FENCED: "false"}) == ManualFence("false")
    assert len(requested_fence({FENCED: "x" * 2000}).reason) == 500  # type: ignore[union-attr]


def test_the_plugin_writes_the_reason_or_true() -> None:
    assert annotation_value(None) == "true"
    assert annotation_value("   ") == "true"
    assert annotation_value(" runaway tenant\tacme ") == "runaway tenant acme"
    assert requested_fence({FENCED: annotation_value(None)}) == ManualFence(DEFAULT_REASON)


@pytest.mark.parametrize("remaining", [0.0, 0.4, 8.0, 3600.0])
def test_a_fence_grants_no_write_time_however_much_lease_is_left(remaining: float) -> None:
    assert write_time(remaining, MAINTENANCE) == 0.0
    assert write_time(remaining, None) == remaining
    assert write_time(-1.0, None) == 0.0


def test_in_force_is_the_last_accepted_grant_not_the_annotation() -> None:
    other = ManualFence("something else")
    assert fence_state(None, None) is FenceState.NOT_FENCED
    assert fence_state(MAINTENANCE, MAINTENANCE) is FenceState.IN_FORCE
    assert fence_state(MAINTENANCE, None) is FenceState.FENCING
    assert fence_state(MAINTENANCE, other) is FenceState.FENCING
    assert fence_state(None, MAINTENANCE) is FenceState.LIFTING


def test_the_condition_is_kept_while_a_fence_is_under_way() -> None:
    def cond(requested: ManualFence | None, in_force: ManualFence | None) -> Any:
        return fence_condition(requested, in_force, generation=3, holder="c1@region-a", epoch=4)

    on = cond(MAINTENANCE, MAINTENANCE)
    assert (on.status.value, on.reason) == ("True", "FencedByUser")
    assert on.message.startswith("disk replacement (") and "epoch 4" in on.message
    off = cond(None, None)
    assert (off.status.value, off.reason) == ("False", "NotFenced")
    assert cond(MAINTENANCE, None) is None and cond(None, MAINTENANCE) is None


def test_a_fenced_cell_is_not_ready_keeps_its_endpoints_and_says_why() -> None:
    fenced = replace(SERVING, fence=MAINTENANCE, fence_in_force=MAINTENANCE)
    status = plan_cell_status(fenced, current_conditions=[], now=NOW)
    assert status["phase"] == "Fenced" and status["epoch"] == 4
    ready, fence = conditions(status)["Ready"], conditions(status)["Fenced"]
    assert (ready["status"], ready["reason"]) == ("False", "FencedByUser")
    assert "disk replacement" in ready["message"]
    assert (fence["status"], fence["reason"]) == ("True", "FencedByUser")
    # The API still answers (reads; writes are refused by the database).
    assert status["endpoints"] == {"api": "http://127.0.0.1:1", "admin": "http://127.0.0.1:2"}
    # A self-fenced owner (lease not confirmed) is another matter: nothing serves.
    lost = plan_cell_status(replace(fenced, fenced=True, serving=False, epoch=None),
                            current_conditions=[], now=NOW)
    assert conditions(lost)["Ready"]["reason"] == "Fenced" and "endpoints" not in lost


def test_an_unfenced_cell_says_not_fenced() -> None:
    status = plan_cell_status(SERVING, current_conditions=[], now=NOW)
    assert status["phase"] == "Ready"
    assert conditions(status)["Fenced"]["status"] == "False"
    assert conditions(status)["Fenced"]["reason"] == "NotFenced"


def test_a_restarted_owner_keeps_the_recorded_fence_until_it_granted_under_it() -> None:
    fenced = replace(SERVING, fence=MAINTENANCE, fence_in_force=MAINTENANCE)
    before = plan_cell_status(fenced, current_conditions=[], now=NOW)["conditions"]
    # The new process has not adopted the lease yet: no epoch, no grant of its own.
    waiting = replace(SERVING, epoch=None, serving=False, fence=MAINTENANCE)
    status = plan_cell_status(waiting, current_conditions=before, now=LATER)
    assert status["phase"] == "Fenced"
    assert conditions(status)["Fenced"] == conditions({"conditions": before})["Fenced"]
    # Lifted on the Cell, the database still fenced: still recorded in force.
    lifting = replace(SERVING, fence_in_force=MAINTENANCE)
    status = plan_cell_status(lifting, current_conditions=before, now=LATER)
    assert status["phase"] == "Fenced" and conditions(status)["Fenced"]["status"] == "True"
    lifted = plan_cell_status(SERVING, current_conditions=status["conditions"], now=LATER)
    assert lifted["phase"] == "Ready"
    assert conditions(lifted)["Fenced"]["lastTransitionTime"] == "2026-11-29T08:05:00Z"


def test_events_only_when_the_recorded_condition_flips() -> None:
    on = {"type": "Fenced", "status": "True", "message": "disk replacement (...)"}
    off = {"type": "Fenced", "status": "False", "reason": "NotFenced"}
    event = fence_event(off, on, cell="c1")
    assert event is not None and (event.type, event.reason) == ("Warning", "Fenced")
    assert "disk replacement" in event.message
    assert fence_event(None, on, cell="c1") is not None
    lifted = fence_event(on, off, cell="c1")
    assert lifted is not None and (lifted.type, lifted.reason) == ("Normal", "Unfenced")
    # A restart or a takeover under the fence finds it recorded: nothing new to say.
    assert fence_event(on, on, cell="c1") is None
    assert fence_event(off, off, cell="c1") is None
    assert fence_event(None, off, cell="c1") is None
    assert fence_event(on, None, cell="c1") is None
