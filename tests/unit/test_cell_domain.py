"""Pure decisions of the cell: quotas, retry timing, signatures, target checks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_cells.domain.plans import PLAN_DEFAULTS, Plan, quotas_for
from cellplane_cells.domain.retry import RetryPolicy, classify_status, decide
from cellplane_cells.domain.signing import sign, verify
from cellplane_cells.domain.targets import UrlRefused, check_url


def test_plan_defaults_follow_the_seed() -> None:
    assert [PLAN_DEFAULTS[p].max_running_jobs for p in Plan] == [2, 5, 20]
    assert PLAN_DEFAULTS[Plan.ENTERPRISE].burst == 60


def test_overrides_within_ceilings_are_taken_and_above_them_refused() -> None:
    assert quotas_for(Plan.PRO, max_running_jobs=10).max_running_jobs == 10
    with pytest.raises(ValueError, match="ceiling"):
        quotas_for(Plan.FREE, max_running_jobs=3)
    with pytest.raises(ValueError, match="only enterprise"):
        quotas_for(Plan.PRO, daily_spend_limit=5)


def test_the_strict_allowance_is_paid_and_within_its_ceiling() -> None:
    # As many as the plan's running cap: all of a tenant's strict runs due in one
    # second can start at once within its cap.
    assert [PLAN_DEFAULTS[p].strict_schedules for p in Plan] == [0, 5, 20]
    assert all(PLAN_DEFAULTS[p].strict_schedules == PLAN_DEFAULTS[p].max_running_jobs
               for p in (Plan.PRO, Plan.ENTERPRISE))
    assert quotas_for(Plan.PRO, strict_schedules=0).strict_schedules == 0
    assert quotas_for(Plan.ENTERPRISE, strict_schedules=500).strict_schedules == 500
    with pytest.raises(ValueError, match="free plan's ceiling of 0"):
        quotas_for(Plan.FREE, strict_schedules=1)
    with pytest.raises(ValueError, match="at least 0"):
        quotas_for(Plan.PRO, strict_schedules=-1)


@pytest.mark.parametrize(("status", "permanent"), [
    (None, False), (408, False), (429, False), (500, False), (503, False),
    (400, True), (401, True), (404, True), (422, True)])
def test_only_client_errors_other_than_408_and_429_are_permanent(status: int | None, permanent: bool) -> None:
    assert classify_status(status)[0] is permanent


@given(attempt=st.integers(min_value=1, max_value=40), seed=st.integers())
def test_full_jitter_stays_between_zero_and_the_capped_exponential(attempt: int, seed: int) -> None:
    policy = RetryPolicy(base_seconds=0.5, cap_seconds=60)
    outcome = decide(attempt=attempt, status_code=503, policy=policy, rng=random.Random(seed))
    assert 0 <= outcome.delay_seconds <= min(60, 0.5 * 2 ** (attempt - 1))
    assert not outcome.permanent


def test_retry_after_is_honoured_as_a_floor() -> None:
    outcome = decide(attempt=1, status_code=429, policy=RetryPolicy(), rng=random.Random(1),
                     retry_after_seconds=7)
    assert outcome.delay_seconds >= 7


def test_signature_covers_timestamp_and_body() -> None:
    signature = sign("secret", b'{"a":1}', timestamp=1700000000)
    assert verify("secret", b'{"a":1}', timestamp=1700000000, signature=signature)
    assert not verify("secret", b'{"a":2}', timestamp=1700000000, signature=signature)
    assert not verify("secret", b'{"a":1}', timestamp=1700000001, signature=signature)
    assert not verify("other", b'{"a":1}', timestamp=1700000000, signature=signature)


def no_dns(host: str) -> list[str]:
    raise OSError("no DNS in unit tests")


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest", "http://127.0.0.1/", "http://10.1.2.3/", "http://[::1]:80/",
    "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/", "file:///etc/passwd", "http://user:pw@x.test/",
    "http://metadata.google.internal/", "http://unresolvable.test/"])
def test_production_mode_refuses_the_platforms_own_network(url: str) -> None:
    with pytest.raises(UrlRefused):
        check_url(url, allow_private=False, resolve=no_dns)


def test_names_are_judged_by_what_they_resolve_to() -> None:
    assert check_url("https://hooks.example.com/x", allow_private=False,
                     resolve=lambda host: ["93.184.216.34"])
    with pytest.raises(UrlRefused):
        check_url("https://sneaky.example.com/", allow_private=False,
                  resolve=lambda host: ["93.184.216.34", "10.0.0.7"])


def test_development_mode_allows_loopback_but_never_link_local_metadata() -> None:
    assert check_url("http://127.0.0.1:8080/run", allow_private=True, resolve=no_dns)
    with pytest.raises(UrlRefused):
        check_url("http://169.254.169.254/", allow_private=True, resolve=no_dns)
