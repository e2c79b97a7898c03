"""A Retry-After header read once for the cell's workers and the demo's load."""

from __future__ import annotations

from cellplane_cells.domain.retry import retry_after_seconds


def test_seconds_are_read_as_a_number() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("0.25") == 0.25


def test_no_header_or_no_number_is_none_for_the_caller_to_decide() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("") is None
    assert retry_after_seconds("Wed, 21 Oct 2026 07:28:00 GMT") is None
    assert retry_after_seconds("nan") is None


def test_a_negative_delay_is_no_delay() -> None:
    assert retry_after_seconds("-3") == 0.0
