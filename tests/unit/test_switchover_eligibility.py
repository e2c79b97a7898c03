"""Whether a planned switchover may begin, decided purely from the target's site report."""

from __future__ import annotations

from cellplane_operator.domain.switchover import (
    SwitchoverAllowed, SwitchoverRefusal, SwitchoverRefused, TargetStandby,
    switchover_eligibility,
)

REGIONS = ("region-a", "region-b")
STREAMING = TargetStandby(role="standby", site="c1@region-b", has_database=True, streaming=True,
                          lag_seconds=0.4)


def check(standby: TargetStandby | None, target: str = "region-b",
          max_lag: float = 5.0) -> SwitchoverAllowed | SwitchoverRefused:
    return switchover_eligibility(target, site_regions=REGIONS, standby=standby,
                                  max_lag_seconds=max_lag)


def refusal(outcome: SwitchoverAllowed | SwitchoverRefused) -> SwitchoverRefused:
    assert isinstance(outcome, SwitchoverRefused), outcome
    return outcome


def test_a_streaming_standby_within_the_lag_is_the_successor() -> None:
    assert check(STREAMING) == SwitchoverAllowed("c1@region-b")


def test_a_region_without_a_site_is_refused_naming_the_sites() -> None:
    refused = refusal(check(STREAMING, target="region-q"))
    assert refused.reason is SwitchoverRefusal.NO_SITE
    assert refused.message == ("cannot switch over to region-q: the cell has sites only in "
                               "region-a, region-b")


def test_a_site_that_reported_nothing_or_no_database_is_not_a_standby_yet() -> None:
    for standby in (None, TargetStandby("standby", "s", False, True, 0.0),
                    TargetStandby("primary", "s", True, True, 0.0)):
        refused = refusal(check(standby))
        assert refused.reason is SwitchoverRefusal.NOT_A_STANDBY
        assert refused.message == "cannot switch over to region-b: its site is not a standby yet"


def test_a_standby_not_streaming_is_refused_with_its_reason() -> None:
    refused = refusal(check(TargetStandby("standby", "s", True, False, None, "connection refused")))
    assert refused.reason is SwitchoverRefusal.NOT_STREAMING
    assert refused.message.endswith("its standby is not streaming (connection refused)")
    quiet = refusal(check(TargetStandby("standby", "s", True, False, None)))
    assert quiet.message.endswith("(no reason given)")


def test_a_standby_further_behind_than_the_cell_allows_is_refused() -> None:
    refused = refusal(check(TargetStandby("standby", "s", True, True, 7.25), max_lag=5))
    assert refused.reason is SwitchoverRefusal.LAGGING
    assert refused.message == ("cannot switch over to region-b: its standby is 7.2s behind "
                               "(max 5s)")


def test_exactly_at_the_lag_limit_or_with_no_lag_reading_is_allowed() -> None:
    assert isinstance(check(TargetStandby("standby", "s", True, True, 5.0), max_lag=5),
                      SwitchoverAllowed)
    assert isinstance(check(TargetStandby("standby", "s", True, True, None)), SwitchoverAllowed)
