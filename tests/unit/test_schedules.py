"""Schedules: occurrences over DST, next time from the scheduled time, misfires, windows, keys."""

from __future__ import annotations

import datetime
import time
import uuid
import zoneinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_cells.domain.schedules import (
    MisfirePolicy, MisfireRule, ScheduleError, ScheduleId, Timing, cron, dispatch_offset,
    first_after, idempotency_key, once, plan_due,
)

UTC = datetime.timezone.utc
LONG_AGO = datetime.datetime(2000, 1, 1, tzinfo=UTC)


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def wall(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


# (zone, a wall time on a transition night, the instant it runs at,
#  the same wall time the day after, as an instant): the table of docs/schedules.md.
DST_TABLE = [
    # spring forward 02:00 -> 03:00: the gap's 02:30 runs at 03:00 EDT
    ("America/New_York", "2026-03-08T02:30", "2026-03-08T07:00", "2026-03-09T06:30"),
    # fall back 02:00 EDT -> 01:00 EST: 01:30 runs once, at 01:30 EDT
    ("America/New_York", "2026-11-01T01:30", "2026-11-01T05:30", "2026-11-02T06:30"),
    ("Europe/Berlin", "2026-03-29T02:30", "2026-03-29T01:00", "2026-03-30T00:30"),
    ("Europe/Berlin", "2026-10-25T02:30", "2026-10-25T00:30", "2026-10-26T01:30"),
    # 30-minute shifts: gap 02:00-02:30 in October, overlap 01:30-02:00 in April
    ("Australia/Lord_Howe", "2026-10-04T02:15", "2026-10-03T15:30", "2026-10-04T15:15"),
    ("Australia/Lord_Howe", "2026-04-05T01:45", "2026-04-04T14:45", "2026-04-05T15:15"),
    # Cairo restored DST in 2023: gap at midnight in April, overlap before midnight in October
    ("Africa/Cairo", "2026-04-24T00:30", "2026-04-23T22:00", "2026-04-24T21:30"),
    ("Africa/Cairo", "2026-10-29T23:30", "2026-10-29T20:30", "2026-10-30T21:30"),
    # Mexico City dropped DST in 2022: its former transition nights are ordinary
    ("America/Mexico_City", "2026-04-05T02:30", "2026-04-05T08:30", "2026-04-06T08:30"),
    ("America/Mexico_City", "2026-10-25T01:30", "2026-10-25T07:30", "2026-10-26T07:30"),
]


@pytest.mark.parametrize(("zone", "local", "runs_at", "day_after"), DST_TABLE)
def test_a_once_schedule_runs_by_the_dst_rule(zone: str, local: str, runs_at: str,
                                               day_after: str) -> None:
    timing = once(wall(local), zone)
    assert first_after(timing, LONG_AGO) == utc(runs_at)
    assert first_after(timing, utc(runs_at)) is None


@pytest.mark.parametrize(("zone", "local", "runs_at", "day_after"), DST_TABLE)
def test_a_daily_cron_runs_once_on_the_transition_night_and_on_time_the_day_after(
        zone: str, local: str, runs_at: str, day_after: str) -> None:
    at = wall(local)
    timing = cron(f"{at.minute} {at.hour} * * *", zone)
    day_before = (at - datetime.timedelta(days=1)).replace(tzinfo=zoneinfo.ZoneInfo(zone))
    assert first_after(timing, day_before.astimezone(UTC)) == utc(runs_at)
    # From the scheduled time, not from a second pass of the same wall time.
    assert first_after(timing, utc(runs_at)) == utc(day_after)


def test_the_seed_trace_of_the_new_york_fall_back_night() -> None:
    timing = cron("30 1 * * *", "America/New_York")
    first = first_after(timing, utc("2026-10-31T05:30"))
    assert first == utc("2026-11-01T05:30")  # 01:30 EDT
    assert first_after(timing, first) == utc("2026-11-02T06:30")  # not 06:30Z on Nov 1


def test_a_half_hourly_cron_is_silent_in_the_repeated_hour_and_collapses_the_skipped_one() -> None:
    timing = cron("*/30 * * * *", "America/New_York")
    assert runs(timing, utc("2026-11-01T04:45"), 3) == [
        utc("2026-11-01T05:00"), utc("2026-11-01T05:30"), utc("2026-11-01T07:00")]
    assert runs(timing, utc("2026-03-08T06:15"), 3) == [
        utc("2026-03-08T06:30"), utc("2026-03-08T07:00"), utc("2026-03-08T07:30")]


def test_a_schedule_looked_at_in_the_second_pass_of_an_overlap_never_goes_back() -> None:
    timing = cron("*/15 * * * *", "America/New_York")
    # 06:20Z is 01:20 EST; 01:30 would be 01:30 EDT, already past.
    assert first_after(timing, utc("2026-11-01T06:20")) == utc("2026-11-01T07:00")


@pytest.mark.parametrize("zone", sorted({row[0] for row in DST_TABLE}))
@pytest.mark.parametrize("expression", ["30 1 * * *", "30 2 * * *", "15 0 * * *", "45 23 * * *",
                                        "0 2 * * *"])
def test_a_daily_cron_runs_exactly_once_on_every_local_date_of_a_year(zone: str,
                                                                        expression: str) -> None:
    timing = cron(expression, zone)
    start = datetime.datetime(2026, 1, 1, tzinfo=zoneinfo.ZoneInfo(zone)).astimezone(UTC)
    found = runs(timing, start, 365)
    assert found == sorted(set(found))
    local_dates = [at.astimezone(zoneinfo.ZoneInfo(zone)).date() for at in found]
    assert local_dates == [datetime.date(2026, 1, 1) + datetime.timedelta(days=n) for n in range(365)]


def runs(timing: Timing, after: datetime.datetime, count: int) -> list[datetime.datetime]:
    found: list[datetime.datetime] = []
    at: datetime.datetime | None = after
    for _ in range(count):
        assert at is not None
        at = first_after(timing, at)
        assert at is not None
        found.append(at)
    return found


# -- validation: every refusal names its field ------------------------------------------

@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "America", "../etc/passwd", "", "localtime",
                                  "europe/berlin"])
def test_an_unknown_zone_is_refused_naming_time_zone(zone: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        cron("0 8 * * *", zone)
    assert caught.value.field == "time_zone"


@pytest.mark.parametrize("expression", [
    "0 0 30 2 *", "0 0 31 4,6 *", "* * * *", "0 0 * * * *", "0 0 L * *", "0 0 1W * *",
    "0 0 * * MON#1", "60 * * * *", "0 24 * * *", "*/0 * * * *", "@daily", "H * * * *",
    "0 0 ? * *", "0 0 * FOO *", "5-1 * * * *", "", "\u0663 * * * *"])
def test_an_impossible_or_foreign_cron_is_refused_naming_cron(expression: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        cron(expression, "UTC")
    assert caught.value.field == "cron"


def test_the_impossible_date_says_why() -> None:
    with pytest.raises(ScheduleError, match="day-of-month"):
        cron("0 0 30 2 *", "UTC")


@pytest.mark.parametrize("expression", ["0 0 29 2 *", "0 9 * * MON-FRI", "*/5 8-18 * JAN,JUL sun",
                                        "0 0 1,15 * 7", "15 10 * * 1-5/2"])
def test_the_unix_dialect_is_taken_and_normalised(expression: str) -> None:
    assert cron(f"  {expression}  ", "UTC").cron == " ".join(expression.split())


def test_a_run_at_with_an_offset_a_fraction_or_out_of_range_is_refused_naming_run_at() -> None:
    for value in (utc("2026-09-28T09:00"), wall("2026-09-28T09:00:00.5"),
                  wall("9999-12-31T23:59:59"), wall("0001-01-01T00:00:00")):
        with pytest.raises(ScheduleError) as caught:
            once(value, "Europe/Berlin")
        assert caught.value.field == "run_at"


# -- misfires: what runs after an outage or a pause --------------------------------------

HOURLY = cron("0 * * * *", "UTC")


def plan(policy: MisfirePolicy, now: str, *, next_at: str = "2026-05-01T10:00",
         offset: float = 0, timing: Timing = HOURLY, catch_up: int = 10
         ) -> tuple[list[str], str | None]:
    outcome = plan_due(timing, next_at=utc(next_at), offset=datetime.timedelta(seconds=offset),
                       misfire=MisfireRule(policy, max_catch_up_runs=catch_up), now=utc(now))
    return ([f"{at:%H:%M}" for at in outcome.runs],
            None if outcome.next_at is None else f"{outcome.next_at:%H:%M}")


def test_an_on_time_occurrence_runs_under_every_policy() -> None:
    for policy in MisfirePolicy:
        assert plan(policy, "2026-05-01T10:00:05") == (["10:00"], "11:00")


def test_nothing_is_due_before_the_scheduled_time_plus_the_offset() -> None:
    assert plan(MisfirePolicy.RUN_ALL, "2026-05-01T09:59:59") == ([], "10:00")
    assert plan(MisfirePolicy.RUN_ALL, "2026-05-01T10:01:59", offset=120) == ([], "10:00")
    assert plan(MisfirePolicy.RUN_ALL, "2026-05-01T10:02:00", offset=120) == (["10:00"], "11:00")


def test_after_an_outage_run_once_runs_the_latest_missed_occurrence_once() -> None:
    assert plan(MisfirePolicy.RUN_ONCE, "2026-05-01T13:30") == (["13:00"], "14:00")


def test_after_an_outage_skip_runs_nothing_missed_but_the_occurrence_still_in_its_grace() -> None:
    assert plan(MisfirePolicy.SKIP, "2026-05-01T13:30") == ([], "14:00")
    assert plan(MisfirePolicy.SKIP, "2026-05-01T13:00:45") == (["13:00"], "14:00")


def test_after_an_outage_run_all_runs_each_missed_occurrence_up_to_its_maximum() -> None:
    assert plan(MisfirePolicy.RUN_ALL, "2026-05-01T13:30") == (
        ["10:00", "11:00", "12:00", "13:00"], "14:00")
    assert plan(MisfirePolicy.RUN_ALL, "2026-05-01T13:30", catch_up=2) == (["12:00", "13:00"], "14:00")


def test_a_minutely_schedule_paused_for_a_year_catches_up_without_walking_the_year() -> None:
    minutely = cron("* * * * *", "Europe/Berlin")
    started = time.monotonic()
    assert plan(MisfirePolicy.RUN_ONCE, "2027-05-01T10:30:30", timing=minutely) == (["10:30"], "10:31")
    assert plan(MisfirePolicy.RUN_ALL, "2027-05-01T10:30:30", timing=minutely, catch_up=3) == (
        ["10:28", "10:29", "10:30"], "10:31")
    assert time.monotonic() - started < 2


def test_run_all_across_a_fall_back_night_runs_each_day_once() -> None:
    daily = cron("30 1 * * *", "America/New_York")
    outcome = plan_due(daily, next_at=utc("2026-10-30T05:30"), offset=datetime.timedelta(0),
                       misfire=MisfireRule(MisfirePolicy.RUN_ALL), now=utc("2026-11-03T12:00"))
    assert outcome.runs == (utc("2026-10-30T05:30"), utc("2026-10-31T05:30"),
                            utc("2026-11-01T05:30"), utc("2026-11-02T06:30"),
                            utc("2026-11-03T06:30"))
    assert outcome.next_at == utc("2026-11-04T06:30")


def test_a_once_schedule_late_runs_under_run_once_and_is_dropped_under_skip() -> None:
    timing = once(wall("2026-05-01T10:00"), "UTC")
    assert plan(MisfirePolicy.RUN_ONCE, "2026-05-01T12:00", timing=timing) == (["10:00"], None)
    assert plan(MisfirePolicy.SKIP, "2026-05-01T12:00", timing=timing) == ([], None)


# -- dispatch windows and run keys -------------------------------------------------------

SCHEDULE = ScheduleId(uuid.UUID("6f1c2a4e-9b0d-4c1e-8f3a-2d5b7e9c0a11"))


def test_the_offset_in_the_window_is_a_stable_hash_of_the_schedule_id() -> None:
    assert dispatch_offset(SCHEDULE, 300) == dispatch_offset(SCHEDULE, 300)
    assert dispatch_offset(SCHEDULE, 0) == datetime.timedelta(0)
    ids = [ScheduleId(uuid.UUID(int=n)) for n in range(1000)]
    seconds = {int(dispatch_offset(one, 300).total_seconds()) for one in ids}
    assert len(seconds) > 250  # spread over the window, not bunched at its start


@given(st.uuids(), st.integers(min_value=1, max_value=86_400))
def test_the_offset_stays_inside_the_window(schedule: uuid.UUID, window: int) -> None:
    offset = dispatch_offset(ScheduleId(schedule), window)
    assert datetime.timedelta(0) <= offset < datetime.timedelta(seconds=window)
    margin = min(datetime.timedelta(seconds=1), datetime.timedelta(seconds=window) / 2)
    assert offset < datetime.timedelta(seconds=window) - margin


def test_the_run_key_is_the_schedule_and_its_scheduled_time_in_utc() -> None:
    berlin = datetime.datetime(2026, 9, 28, 9, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    key = idempotency_key(SCHEDULE, berlin)
    assert key == f"{SCHEDULE}:2026-09-28T07:00:00Z"
    assert key == idempotency_key(SCHEDULE, utc("2026-09-28T07:00"))
    assert key != idempotency_key(SCHEDULE, utc("2026-09-29T07:00"))


# -- properties over many zones and expressions -----------------------------------------

ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Africa/Cairo",
         "America/Mexico_City", "Pacific/Chatham", "America/Santiago", "Asia/Tehran", "UTC"]


@given(zone=st.sampled_from(ZONES),
       minutes=st.sets(st.sampled_from([0, 15, 30, 45, 59]), min_size=1),
       hours=st.sets(st.integers(min_value=0, max_value=23), min_size=1, max_size=4),
       start=st.datetimes(min_value=datetime.datetime(2026, 1, 1),
                          max_value=datetime.datetime(2026, 12, 31)))
def test_occurrences_move_forward_in_wall_time_and_each_is_a_match_or_a_gaps_end(
        zone: str, minutes: set[int], hours: set[int], start: datetime.datetime) -> None:
    expression = f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} * * *"
    timing = cron(expression, zone)
    tz = zoneinfo.ZoneInfo(zone)
    found = runs(timing, start.replace(tzinfo=UTC), 40)
    walls = [at.astimezone(tz).replace(tzinfo=None) for at in found]
    # Strictly forward on the wall clock too: no wall time of an overlap runs twice.
    assert all(a < b for a, b in zip(walls, walls[1:]))
    assert found[0] > start.replace(tzinfo=UTC)
    for at, local in zip(found, walls):
        matches = local.minute in minutes and local.hour in hours
        gap_end = (at - datetime.timedelta(seconds=1)).astimezone(tz).utcoffset() != \
            at.astimezone(tz).utcoffset()
        assert matches or gap_end, f"{local} in {zone} is neither a match nor a gap's end"
        assert at.second == 0


@given(zone=st.sampled_from(ZONES), expression=st.sampled_from(["*/5 * * * *", "30 2 * * *",
                                                               "0 */6 * * 1-5", "15 1 1 * *"]),
       policy=st.sampled_from(list(MisfirePolicy)), catch_up=st.integers(min_value=1, max_value=5),
       window=st.integers(min_value=0, max_value=600), schedule=st.uuids(),
       start=st.datetimes(min_value=datetime.datetime(2026, 1, 1),
                          max_value=datetime.datetime(2026, 12, 31)),
       late=st.timedeltas(min_value=datetime.timedelta(0), max_value=datetime.timedelta(days=40)))
def test_a_plan_never_runs_early_nor_more_than_its_policy_allows(
        zone: str, expression: str, policy: MisfirePolicy, catch_up: int, window: int,
        schedule: uuid.UUID, start: datetime.datetime, late: datetime.timedelta) -> None:
    timing = cron(expression, zone)
    next_at = first_after(timing, start.replace(tzinfo=UTC))
    assert next_at is not None
    offset = dispatch_offset(ScheduleId(schedule), window)
    now = next_at + late
    outcome = plan_due(timing, next_at=next_at, offset=offset,
                       misfire=MisfireRule(policy, max_catch_up_runs=catch_up), now=now)
    assert all(next_at <= at and at + offset <= now for at in outcome.runs)
    assert list(outcome.runs) == sorted(set(outcome.runs))
    assert outcome.next_at is not None
    assert outcome.next_at + offset > now  # nothing left due: the next one is still ahead
    assert len(outcome.runs) <= {MisfirePolicy.RUN_ONCE: 1, MisfirePolicy.RUN_ALL: catch_up,
                                 MisfirePolicy.SKIP: 2}[policy]
    if policy is not MisfirePolicy.SKIP and now >= next_at + offset:
        assert outcome.runs  # something was due, and only SKIP drops it
