"""Which site acts, when a standby may take over, and how a planned handover skips the margin."""

from __future__ import annotations

import pytest

from cellplane_operator.domain.failover import (
    ActiveSite,
    Handover,
    SiteRole,
    StandbyWitness,
    TakeoverRecord,
    WitnessRecord,
    candidacy,
    lag_at_loss,
    restored_witness,
    site_role,
    witness_record,
    witnessed,
)
from cellplane_operator.domain.ownership import (
    HANDOVER_PATIENCE_SECONDS,
    LeaseSettings,
    LeaseState,
    Role,
    ready_to_acquire,
)

A, B = "region-a", "region-b"


@pytest.mark.parametrize(("active", "database", "expected"), [
    (None, None, SiteRole.PRIMARY),                      # a new cell: its home region starts it
    (None, "primary", SiteRole.PRIMARY),
    (ActiveSite(A, "c@region-a", 3), "primary", SiteRole.PRIMARY),
    (ActiveSite(A, "c@region-a", 3), "demoted", SiteRole.HANDED_OVER),
    (ActiveSite(B, "c@region-b", 4), "primary", SiteRole.OLD_PRIMARY),  # came back after a loss
    (ActiveSite(B, "c@region-b", 4), None, SiteRole.STANDBY),
    (ActiveSite(B, "c@region-b", 4), "fenced", SiteRole.OLD_PRIMARY),
    (ActiveSite(B, "c@region-b", 4), "demoted", SiteRole.OLD_PRIMARY),
    (ActiveSite(B, "c@region-b", 4), "standby", SiteRole.STANDBY),
])
def test_the_home_region_site_role_follows_the_active_record(
        active: ActiveSite | None, database: str | None, expected: SiteRole) -> None:
    assert site_role(my_region=A, home_region=A, active=active, database_role=database) is expected


def test_a_standby_that_won_the_epoch_is_promoting_until_its_database_is_a_primary() -> None:
    active = ActiveSite(B, "c@region-b", 2)
    assert site_role(my_region=B, home_region=A, active=active,
                     database_role="standby") is SiteRole.PROMOTING
    assert site_role(my_region=B, home_region=A, active=active,
                     database_role="primary") is SiteRole.PRIMARY
    assert site_role(my_region=B, home_region=A, active=None,
                     database_role="standby") is SiteRole.STANDBY


def test_lag_is_the_streaming_lag_when_the_standby_streamed_until_the_primary_died() -> None:
    witness = witnessed(StandbyWitness(), now=100.0, streaming=True, lag_seconds=0.4)
    witness = witnessed(witness, now=101.0, streaming=False, lag_seconds=None)   # primary died
    # The owner key expired a lease (10 s) after the last renewal, near the death.
    assert lag_at_loss(witness, now=115.0, owner_gone_at=111.0, lease_seconds=10.0) == 0.4


def test_time_cut_off_from_a_live_primary_counts_as_lag() -> None:
    witness = witnessed(StandbyWitness(), now=100.0, streaming=True, lag_seconds=0.0)
    witness = witnessed(witness, now=101.0, streaming=False, lag_seconds=None)
    # The owner kept renewing until 160, so the primary wrote for 59 s we never received.
    assert lag_at_loss(witness, now=175.0, owner_gone_at=170.0, lease_seconds=10.0) == 59.0
    # While the owner is still there, the lag grows with the clock.
    assert lag_at_loss(witness, now=131.0, owner_gone_at=None, lease_seconds=10.0) == 30.0


def test_a_standby_that_never_streamed_has_no_known_lag() -> None:
    witness = witnessed(StandbyWitness(), now=1.0, streaming=False, lag_seconds=None)
    assert lag_at_loss(witness, now=5.0, owner_gone_at=4.0, lease_seconds=10.0) is None


def test_candidacy_refuses_a_standby_too_far_behind_unless_forced() -> None:
    refused = candidacy(my_region=B, active_region=A, automatic=True, forced_region=None,
                        lag_seconds=45.0, max_lag_seconds=30.0)
    assert not refused.compete and refused.refusal == "StandbyTooFarBehind"
    assert "45.0s behind" in refused.message and "force-failover=region-b" in refused.message
    forced = candidacy(my_region=B, active_region=A, automatic=True, forced_region=B,
                       lag_seconds=45.0, max_lag_seconds=30.0)
    assert forced.compete
    other_forced = candidacy(my_region=B, active_region=A, automatic=True, forced_region="region-c",
                             lag_seconds=45.0, max_lag_seconds=30.0)
    assert not other_forced.compete


def test_candidacy_without_automatic_failover_or_streaming() -> None:
    manual = candidacy(my_region=B, active_region=A, automatic=False, forced_region=None,
                       lag_seconds=0.0, max_lag_seconds=30.0)
    assert (manual.compete, manual.refusal) == (False, "AutomaticFailoverDisabled")
    never = candidacy(my_region=B, active_region=A, automatic=True, forced_region=None,
                      lag_seconds=None, max_lag_seconds=30.0)
    assert (never.compete, never.refusal) == (False, "StandbyNeverStreamed")
    fine = candidacy(my_region=B, active_region=A, automatic=True, forced_region=None,
                     lag_seconds=30.0, max_lag_seconds=30.0)
    assert fine.compete and fine.refusal is None


def test_a_handover_lets_its_successor_skip_the_margin_and_holds_the_others_back() -> None:
    settings = LeaseSettings()
    waiting = LeaseState(role=Role.WAITING, epoch_seen=4, gone_since=100.0)
    assert ready_to_acquire(waiting, now=100.0, settings=settings, handover_to_us=True)
    assert not ready_to_acquire(waiting, now=100.0, settings=settings)
    assert ready_to_acquire(waiting, now=102.0, settings=settings)
    assert not ready_to_acquire(waiting, now=102.0, settings=settings, handover_to_us=False)
    assert ready_to_acquire(waiting, now=100.0 + HANDOVER_PATIENCE_SECONDS, settings=settings,
                            handover_to_us=False)


def test_records_round_trip() -> None:
    active = ActiveSite(B, "c@region-b", 7)
    assert ActiveSite.decode(active.encode()) == active
    handover = Handover(A, B, "c@region-b", 6, "0/3000028")
    assert Handover.decode(handover.encode()) == handover


# -- the witness across an operator restart (issue #18 item 12) ---------------------------

LEASE = 10.0


def _kept_and_restored(witness: StandbyWitness, *, written_at: float, restarted_at: float,
                       wall_offset: float = 1_000_000.0) -> StandbyWitness:
    """Written by one process at monotonic ``written_at``, read by its successor whose
    monotonic clock reads ``restarted_at`` (same machine: one wall clock)."""
    record = witness_record(witness, monotonic_now=written_at, wall_now=written_at + wall_offset)
    return restored_witness(WitnessRecord.decode(record.encode()), monotonic_now=restarted_at,
                            wall_now=restarted_at + wall_offset)


def test_a_standby_that_streamed_until_its_primary_died_is_promoted_after_a_restart() -> None:
    # Streamed with no lag until 100 (the primary died there), seen cut off at 101; the
    # operator restarted at 103; the owner key expired at 110 (last renewal ~100).
    witness = witnessed(StandbyWitness(), now=100.0, streaming=True, lag_seconds=0.0)
    witness = witnessed(witness, now=101.0, streaming=False, lag_seconds=None)
    restored = _kept_and_restored(witness, written_at=101.0, restarted_at=103.0)
    lag = lag_at_loss(restored, now=112.0, owner_gone_at=110.0, lease_seconds=LEASE)
    assert lag == pytest.approx(0.0)
    assert candidacy(my_region=B, active_region=A, automatic=True, forced_region=None,
                     lag_seconds=lag, max_lag_seconds=5.0).compete


def test_without_the_record_a_restarted_standby_never_streamed() -> None:
    lag = lag_at_loss(restored_witness(None, monotonic_now=5.0, wall_now=5.0), now=12.0,
                      owner_gone_at=10.0, lease_seconds=LEASE)
    assert lag is None
    assert candidacy(my_region=B, active_region=A, automatic=True, forced_region=None,
                     lag_seconds=lag, max_lag_seconds=5.0).refusal == "StandbyNeverStreamed"


def test_streaming_is_not_assumed_past_the_last_reading_that_saw_it() -> None:
    # Last written while streaming at 100; the primary kept writing until its last renewal
    # at ~120 (key gone at 130): the restarted operator must count those 20 s as lag.
    witness = witnessed(StandbyWitness(), now=100.0, streaming=True, lag_seconds=0.5)
    restored = _kept_and_restored(witness, written_at=100.0, restarted_at=125.0)
    lag = lag_at_loss(restored, now=131.0, owner_gone_at=130.0, lease_seconds=LEASE)
    assert lag == pytest.approx(20.5)


def test_a_record_dated_after_now_proves_nothing() -> None:
    record = WitnessRecord(last_streaming_at=2_000.0, lag_while_streaming=0.0,
                           not_streaming_since=None)
    assert restored_witness(record, monotonic_now=50.0, wall_now=1_000.0) == StandbyWitness()


def test_the_takeover_record_is_what_the_status_shows() -> None:
    record = TakeoverRecord(epoch=3, from_region=A, to_region=B, planned=False, seconds=5.1234,
                            promoted_in=0.4, at="2026-12-02T18:00:00Z")
    assert record.to_status() == {"epoch": 3, "fromRegion": A, "toRegion": B, "planned": False,
                                  "seconds": 5.123, "at": "2026-12-02T18:00:00Z"}
    assert "after a takeover from region-a" in record.event_message("c@region-b")
