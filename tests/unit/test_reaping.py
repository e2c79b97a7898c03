"""The adaptive reaper's decision: grace after our own outage, pacing in a storm."""

from __future__ import annotations

import datetime
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellplane_cells.domain.reaping import (
    Decision, LeaseCensus, ReaperHealth, ReaperMode, ReaperPolicy, plan_pass,
)

T0 = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.timezone.utc)
POLICY = ReaperPolicy(lease_seconds=30, reap_seconds=5)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def steady(last: float = 0.0) -> ReaperHealth:
    return ReaperHealth(last_pass_at=at(last))


def test_nothing_expired_is_idle_even_after_an_outage() -> None:
    assert plan_pass(POLICY, ReaperHealth(), LeaseCensus(at(0), 50, 0)).decision is Decision.IDLE
    assert plan_pass(POLICY, steady(), LeaseCensus(at(600), 50, 0)).decision is Decision.IDLE


def test_a_few_expired_claims_in_steady_state_are_all_taken_back() -> None:
    plan = plan_pass(POLICY, steady(), LeaseCensus(at(5), 50, 3))
    assert plan.decision is Decision.REAP and plan.reap_limit >= 3 and plan.grace_seconds == 0


def test_one_dead_worker_process_is_never_a_storm() -> None:
    """The floor is a process's default slots: its death is reaped at once, in any cell."""
    plan = plan_pass(POLICY, steady(), LeaseCensus(at(5), 10, 10))
    assert plan.decision is Decision.REAP and plan.reap_limit == 10


def test_after_a_gap_longer_than_a_lease_expired_claims_get_one_lease_of_grace() -> None:
    plan = plan_pass(POLICY, steady(0), LeaseCensus(at(31), 40, 40))
    assert plan.decision is Decision.GRACE
    assert plan.grace_seconds == POLICY.lease_seconds and plan.reap_limit == 0


def test_a_gap_shorter_than_a_lease_is_not_an_outage() -> None:
    assert plan_pass(POLICY, steady(0), LeaseCensus(at(29), 40, 2)).decision is Decision.REAP


def test_a_reaper_with_no_pass_yet_gives_grace() -> None:
    """A process started after a crash, a fence or a takeover cannot know how long the
    cell was down: it gives the grace once."""
    assert plan_pass(POLICY, ReaperHealth(), LeaseCensus(at(0), 5, 1)).decision is Decision.GRACE


def test_a_reaper_passing_less_often_than_once_a_lease_is_not_always_recovering() -> None:
    slow = ReaperPolicy(lease_seconds=2, reap_seconds=5)
    assert slow.outage_after_seconds == 10
    assert plan_pass(slow, steady(0), LeaseCensus(at(5.5), 4, 1)).decision is Decision.REAP


def test_a_storm_is_paced_oldest_first_at_a_quarter_of_the_running_claims() -> None:
    plan = plan_pass(POLICY, steady(), LeaseCensus(at(5), 200, 120))
    assert plan.decision is Decision.PACE and plan.reap_limit == 50


def test_a_storm_keeps_its_pace_while_the_running_count_falls() -> None:
    first = plan_pass(POLICY, steady(), LeaseCensus(at(5), 200, 200))
    health = steady().after_pass(at(5), first)
    second = plan_pass(POLICY, health, LeaseCensus(at(10), 150, 150))
    assert (first.reap_limit, second.reap_limit) == (50, 50)
    assert health.after_pass(at(15), plan_pass(POLICY, health, LeaseCensus(at(15), 150, 0))).pace == 0


def test_immediate_mode_takes_everything_back_even_after_an_outage() -> None:
    immediate = ReaperPolicy(lease_seconds=30, reap_seconds=5, mode=ReaperMode.IMMEDIATE)
    plan = plan_pass(immediate, steady(0), LeaseCensus(at(600), 200, 200))
    assert plan.decision is Decision.REAP and plan.reap_limit == immediate.batch


def test_the_pass_limit_never_exceeds_a_statement_batch() -> None:
    assert ReaperPolicy(lease_seconds=30, reap_seconds=5, batch=100).pass_limit(10_000) == 100


@pytest.mark.parametrize("kwargs", [dict(lease_seconds=0, reap_seconds=1),
                                    dict(lease_seconds=1, reap_seconds=1, storm_share=0),
                                    dict(lease_seconds=1, reap_seconds=1, storm_floor=0)])
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReaperPolicy(**kwargs)  # type: ignore[arg-type]


def simulate(policy: ReaperPolicy, *, live: int, dead: int, outage: float,
             ) -> tuple[int, float | None]:
    """A cell whose database was down for ``outage`` seconds, then passes every reap interval.

    Every claim's last heartbeat was at 0; live workers heartbeat at every pass once the
    database is back (as soon as it lands: their beats were waiting), dead ones never. Returns
    (live claims reaped, seconds after the recovery when the last dead claim was taken back).
    """
    lease = policy.lease_seconds
    leases = {("live", i): lease for i in range(live)} | {("dead", i): lease for i in range(dead)}
    health = ReaperHealth(last_pass_at=at(0))
    live_reaped, dead_done = 0, None
    n = 0
    while (now := outage + n * policy.reap_seconds) < outage + 4 * lease + 2 * len(leases) * policy.reap_seconds:
        n += 1
        if dead_done is not None and now > outage + 2 * lease:
            break
        running = list(leases)
        expired = sorted((k for k in running if leases[k] < now), key=lambda k: leases[k])
        plan = plan_pass(policy, health, LeaseCensus(at(now), len(running), len(expired)))
        if plan.decision is Decision.GRACE:
            for k in expired:
                leases[k] = now + plan.grace_seconds
        for k in expired[:plan.reap_limit]:
            del leases[k]
            live_reaped += k[0] == "live"
        health = health.after_pass(at(now), plan)
        # The beats that were waiting for the database land right after the pass.
        for k in leases:
            if k[0] == "live":
                leases[k] = now + lease
        if dead_done is None and not any(k[0] == "dead" for k in leases):
            dead_done = now - outage
    return live_reaped, dead_done


@settings(deadline=None)
@given(live=st.integers(0, 300), dead=st.integers(0, 300),
       outage_leases=st.floats(1.01, 20), share=st.floats(0.05, 1.0), floor=st.integers(1, 50))
def test_after_an_outage_no_live_claim_is_reaped_and_every_dead_one_is_within_a_bound(
        live: int, dead: int, outage_leases: float, share: float, floor: int) -> None:
    policy = ReaperPolicy(lease_seconds=30, reap_seconds=5, storm_share=share, storm_floor=floor)
    live_reaped, dead_done = simulate(policy, live=live, dead=dead,
                                      outage=outage_leases * policy.lease_seconds)
    assert live_reaped == 0
    if dead:
        # One lease of grace, then at most ceil(1 / share) paced passes (and the pass
        # that sees the grace run out).
        bound = policy.lease_seconds + (math.ceil(1 / share) + 1) * policy.reap_seconds
        assert dead_done is not None and dead_done <= bound


def test_the_immediate_reaper_takes_back_every_live_claim_after_an_outage() -> None:
    immediate = ReaperPolicy(lease_seconds=30, reap_seconds=5, mode=ReaperMode.IMMEDIATE)
    live_reaped, dead_done = simulate(immediate, live=40, dead=3, outage=90)
    assert live_reaped == 40 and dead_done == 0
