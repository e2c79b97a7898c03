"""The lease rule, decided purely: margins, renewals measured from their sending, self-fencing."""

from __future__ import annotations

import pytest

from cellplane_operator.domain.ownership import (
    LeaseSettings, LeaseState, OwnerRecord, Role, acquired, database_grant, lost_race, may_act,
    must_self_fence, observe, ready_to_acquire, renewed, self_fenced,
)

S = LeaseSettings()  # 10 s lease, renew every 2 s, 2 s margin
OTHER = OwnerRecord(region="region-b", site="b1", epoch=4, lease_id=77)


def test_defaults_are_valid_and_unsafe_settings_are_named() -> None:
    assert S.problems() == []
    assert "margin" in LeaseSettings(margin_seconds=10).problems()[0]
    assert "two renew intervals" in LeaseSettings(renew_interval_seconds=5).problems()[0]
    assert "whole number" in LeaseSettings(duration_seconds=7.5).problems()[0]
    with pytest.raises(ValueError, match="unsafe lease settings"):
        LeaseSettings(margin_seconds=0).validated()


def test_owner_record_round_trips() -> None:
    assert OwnerRecord.decode(OTHER.encode()) == OTHER


def test_candidate_waits_the_margin_after_seeing_the_owner_gone() -> None:
    state = observe(LeaseState(), owner=OTHER, epoch=4, now=100.0)
    assert state.role is Role.OBSERVING and not ready_to_acquire(state, now=1000, settings=S)
    state = observe(state, owner=None, epoch=4, now=200.0)
    assert state.role is Role.WAITING and state.gone_since == 200.0
    # Seeing it gone again does not restart the wait...
    state = observe(state, owner=None, epoch=4, now=201.0)
    assert state.gone_since == 200.0
    assert not ready_to_acquire(state, now=201.99, settings=S)
    assert ready_to_acquire(state, now=202.0, settings=S)
    assert not ready_to_acquire(state, now=202.0, settings=S, extra_delay=5)
    # ...and a new owner appearing ends it.
    assert observe(state, owner=OTHER, epoch=5, now=202.5).role is Role.OBSERVING


def test_owner_acts_until_margin_before_the_end_measured_from_sending() -> None:
    state = acquired(LeaseState(epoch_seen=4), epoch=5, lease_id=9, sent_at=100.0, ttl=10)
    assert state.role is Role.OWNER and state.confirmed_until == 110.0
    assert may_act(state, now=107.99, settings=S)
    assert not may_act(state, now=108.0, settings=S)
    assert database_grant(state, now=103.0, settings=S) == pytest.approx(5.0)
    assert must_self_fence(state, now=108.0, settings=S)
    # A renewal sent at 104 and acknowledged (whenever) extends to 114.
    state = renewed(state, sent_at=104.0, ttl=10)
    assert may_act(state, now=111.9, settings=S)
    # A late acknowledgement of an older renewal never shortens the lease.
    assert renewed(state, sent_at=101.0, ttl=10).confirmed_until == 114.0


def test_renewal_answered_with_an_expired_lease_ends_acting_at_once() -> None:
    state = acquired(LeaseState(), epoch=5, lease_id=9, sent_at=100.0, ttl=10)
    state = renewed(state, sent_at=104.0, ttl=0)
    assert not may_act(state, now=104.0, settings=S)
    assert database_grant(state, now=104.0, settings=S) == 0.0


def test_seeing_our_key_gone_or_replaced_fences_the_owner_whatever_its_clock_says() -> None:
    state = acquired(LeaseState(), epoch=5, lease_id=9, sent_at=100.0, ttl=10)
    mine = OwnerRecord("region-a", "a1", 5, 9)
    assert observe(state, owner=mine, epoch=5, now=101).role is Role.OWNER
    assert observe(state, owner=None, epoch=5, now=101).role is Role.FENCED
    taken = observe(state, owner=OwnerRecord("region-b", "b1", 6, 3), epoch=6, now=101)
    assert taken.role is Role.FENCED and not may_act(taken, now=101, settings=S)


def test_a_self_fenced_owner_may_compete_again_only_after_the_same_wait() -> None:
    state = acquired(LeaseState(), epoch=5, lease_id=9, sent_at=100.0, ttl=10)
    state = self_fenced(state)
    assert not may_act(state, now=100.5, settings=S)
    state = observe(state, owner=None, epoch=5, now=111.0)
    assert state.role is Role.FENCED
    assert not ready_to_acquire(state, now=112.9, settings=S)
    assert ready_to_acquire(state, now=113.0, settings=S)


def test_losing_the_race_returns_to_observing() -> None:
    state = observe(LeaseState(), owner=None, epoch=4, now=0)
    assert lost_race(state).role is Role.OBSERVING
