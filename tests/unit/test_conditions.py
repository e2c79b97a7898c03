from __future__ import annotations

import datetime

import pytest

from cellplane_operator.domain.conditions import Condition, ConditionStatus, format_time, set_condition

T0 = datetime.datetime(2026, 11, 29, 8, 0, 0, tzinfo=datetime.timezone.utc)
T1 = T0 + datetime.timedelta(minutes=5)


def ready(status: ConditionStatus, reason: str = "Provisioned", message: str = "ok") -> Condition:
    return Condition(type="Ready", status=status, reason=reason, message=message, observed_generation=3)


def test_new_condition_is_added_with_the_current_time() -> None:
    assert set_condition([], ready(ConditionStatus.TRUE), now=T0) == [{
        "type": "Ready", "status": "True", "reason": "Provisioned", "message": "ok",
        "lastTransitionTime": "2026-11-29T08:00:00Z", "observedGeneration": 3,
    }]


def test_same_status_keeps_the_transition_time_but_takes_the_new_reason() -> None:
    first = set_condition([], ready(ConditionStatus.FALSE, "Waiting"), now=T0)
    second = set_condition(first, ready(ConditionStatus.FALSE, "StillWaiting", "slow"), now=T1)
    assert second[0]["lastTransitionTime"] == "2026-11-29T08:00:00Z"
    assert (second[0]["reason"], second[0]["message"]) == ("StillWaiting", "slow")


def test_status_flip_moves_the_transition_time() -> None:
    first = set_condition([], ready(ConditionStatus.FALSE, "Waiting"), now=T0)
    second = set_condition(first, ready(ConditionStatus.TRUE), now=T1)
    assert second[0]["lastTransitionTime"] == "2026-11-29T08:05:00Z"


def test_other_condition_types_are_left_alone() -> None:
    other = {"type": "Accepted", "status": "True", "reason": "SpecValid", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
    merged = set_condition([other], ready(ConditionStatus.TRUE), now=T0)
    assert merged[0] == other
    assert [c["type"] for c in merged] == ["Accepted", "Ready"]


def test_naive_times_and_bad_reasons_are_refused() -> None:
    with pytest.raises(ValueError):
        format_time(datetime.datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        Condition(type="Ready", status=ConditionStatus.TRUE, reason="", message="")
