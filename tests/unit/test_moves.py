"""Tenant moves: admission with a reason for every refusal, phases, the cutover budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cellplane_operator.domain.cells import CellName, Region, Tier
from cellplane_operator.domain.moves import (
    MAX_CUTOVER_ATTEMPTS,
    Admitted,
    CutoverClock,
    MovePhase,
    MoveRequest,
    Overrun,
    RecordView,
    Refused,
    RefusalReason,
    Resume,
    admit_move,
    after_overrun,
    cutover_reserve,
    differing_tables,
    fixed_pause_over_budget,
    gives_up,
    may_abort,
    next_phase,
    ready_to_cut_over,
    resume,
    waiting_refusal_phase,
)
from cellplane_operator.domain.placement import CellCandidate

TARGET = CellCandidate(name=CellName("shared-b1"), region=Region("region-b"), tier=Tier.SHARED,
                       ready=True, phase="Ready", draining=False, has_standby=True,
                       tenant_capacity=10, worker_slots=40, tenants_placed=3, slots_in_use=15)
REQUEST = MoveRequest(tenant="acme", isolation=Tier.SHARED, source_cell="shared-a1",
                      max_running_jobs=5, target=TARGET, target_name="shared-b1")


def test_a_move_to_a_ready_cell_with_room_is_admitted() -> None:
    assert admit_move(REQUEST) == Admitted("shared-b1")


@pytest.mark.parametrize(("request_", "reason", "said"), [
    (replace(REQUEST, target_name="shared-a1"), RefusalReason.SAME_CELL, "in shared-a1 already"),
    (replace(REQUEST, target=None, target_name="nowhere"), RefusalReason.NO_SUCH_CELL,
     "no cell nowhere"),
    (replace(REQUEST, target=replace(TARGET, tier=Tier.DEDICATED)), RefusalReason.WRONG_TIER,
     "needs a shared cell"),
    (replace(REQUEST, target=replace(TARGET, ready=False, phase="Provisioning")),
     RefusalReason.NOT_READY, "Provisioning"),
    (replace(REQUEST, target=replace(TARGET, draining=True)), RefusalReason.NOT_READY,
     "draining"),
    (replace(REQUEST, max_running_jobs=30), RefusalReason.NO_CAPACITY, "25 free worker slots for 30"),
    (replace(REQUEST, target=replace(TARGET, tenants_placed=10)), RefusalReason.NO_CAPACITY,
     "10/10 tenants"),
    (replace(REQUEST, other_moves=("acme-to-b",)), RefusalReason.ALREADY_MOVING, "acme-to-b"),
    (replace(REQUEST, tenant_deleting=True), RefusalReason.TENANT_DELETING, "being deleted"),
    (replace(REQUEST, source_cell=None), RefusalReason.NOT_PLACED, "not placed"),
])
def test_every_refusal_has_its_reason_and_says_why(request_: MoveRequest, reason: RefusalReason,
                                                   said: str) -> None:
    outcome = admit_move(request_)
    assert isinstance(outcome, Refused)
    assert outcome.reason is reason and said in outcome.message


def test_phases_run_forward_and_abort_only_before_the_cutover() -> None:
    phase = MovePhase.PENDING
    seen = [phase]
    while phase is not MovePhase.COMPLETED:
        phase = next_phase(phase)
        seen.append(phase)
    assert seen == [MovePhase.PENDING, MovePhase.COPYING, MovePhase.CATCHING_UP,
                    MovePhase.CUTTING_OVER, MovePhase.VERIFYING, MovePhase.COMPLETED]
    assert next_phase(MovePhase.COPYING, aborted=True) is MovePhase.ABORTED
    assert next_phase(MovePhase.CATCHING_UP, failed=True) is MovePhase.FAILED
    # After the cutover the target may hold writes the source never saw: forward only.
    assert next_phase(MovePhase.CUTTING_OVER, aborted=True) is MovePhase.VERIFYING
    assert next_phase(MovePhase.VERIFYING, failed=True) is MovePhase.COMPLETED
    assert [may_abort(p) for p in (MovePhase.CATCHING_UP, MovePhase.CUTTING_OVER)] == [True, False]
    assert next_phase(MovePhase.ABORTED) is MovePhase.ABORTED


def test_the_cutover_waits_for_a_delta_that_fits_half_the_pause_budget() -> None:
    fits = dict(rows_per_second=10_000.0, max_pause_seconds=2.0, fixed_pause_seconds=0.3)
    assert ready_to_cut_over(delta_rows=5_000, **fits)       # 0.3 + 0.5 <= 1.0
    assert not ready_to_cut_over(delta_rows=8_000, **fits)   # 0.3 + 0.8 > 1.0
    assert not ready_to_cut_over(delta_rows=1, rows_per_second=0.0, max_pause_seconds=2.0,
                                 fixed_pause_seconds=0.3)
    assert ready_to_cut_over(delta_rows=0, rows_per_second=0.0, max_pause_seconds=2.0,
                             fixed_pause_seconds=0.3)


def test_a_fixed_pause_over_half_the_budget_is_told_apart_since_no_delta_can_fit() -> None:
    assert fixed_pause_over_budget(fixed_pause_seconds=1.01, max_pause_seconds=2.0)
    assert not fixed_pause_over_budget(fixed_pause_seconds=1.0, max_pause_seconds=2.0)
    # The smallest budget the CRD allows (0.1 s) is under the fixed floor (0.1 s) alone.
    assert fixed_pause_over_budget(fixed_pause_seconds=0.1, max_pause_seconds=0.1)
    for delta in (0, 1, 1_000):
        for rate in (0.0, 1e9):
            assert not ready_to_cut_over(delta_rows=delta, rows_per_second=rate,
                                         max_pause_seconds=2.0, fixed_pause_seconds=1.01)


def test_verification_names_every_table_that_differs() -> None:
    source = {"jobs": {"rows": 3, "checksum": "a"}, "ledger": {"rows": 2, "checksum": "b"},
              "wallet": {"rows": 1, "checksum": "c"}, "outbox": {"rows": 0, "checksum": "0"}}
    assert differing_tables(source, dict(source)) == ()
    target = {"jobs": {"rows": 2, "checksum": "a"}, "ledger": {"rows": 2, "checksum": "x"},
              "wallet": {"rows": 1, "checksum": "c"}}
    assert differing_tables(source, target) == (
        "jobs: 3 rows in the source, 2 in the target",
        "ledger: same 2 rows, different contents",
        "outbox: only the source has it",
    )


@pytest.mark.parametrize(("phase", "record", "expected"), [
    (MovePhase.COPYING, RecordView("a", 3, False), Resume.CONTINUE),
    (MovePhase.CATCHING_UP, RecordView("a", 3, False), Resume.CONTINUE),
    # A leader died between the hold and the commit: the source is unfrozen again.
    (MovePhase.CATCHING_UP, RecordView("a", 3, True), Resume.UNDO_CUTOVER),
    (MovePhase.CUTTING_OVER, RecordView("a", 3, False), Resume.UNDO_CUTOVER),
    (MovePhase.VERIFYING, RecordView("a", 3, True), Resume.UNDO_CUTOVER),
    # The commit landed, whatever the status says: only forward from here.
    (MovePhase.VERIFYING, RecordView("b", 4, True), Resume.ROLL_FORWARD),
    (MovePhase.CUTTING_OVER, RecordView("b", 4, False), Resume.ROLL_FORWARD),
    (MovePhase.COPYING, RecordView("c", 4, False), Resume.LOST),
    (MovePhase.COPYING, None, Resume.LOST),
])
def test_a_new_leader_resumes_from_the_placement_record(
        phase: MovePhase, record: RecordView | None, expected: Resume) -> None:
    assert resume(phase, record, source="a", target="b") is expected


def test_only_refusals_the_world_can_lift_keep_a_move_waiting() -> None:
    waiting = {reason for reason in RefusalReason if reason.waits}
    assert waiting == {RefusalReason.NO_SUCH_CELL, RefusalReason.NOT_READY,
                       RefusalReason.NO_CAPACITY, RefusalReason.NOT_PLACED}


# -- moves that cannot proceed end (issue #18, item 7) -----------------------------------


def test_a_refusal_the_world_may_lift_waits_only_until_the_progress_deadline() -> None:
    waits = RefusalReason.NO_SUCH_CELL
    assert waiting_refusal_phase(waits, waited_seconds=10, deadline_seconds=600) \
        is MovePhase.PENDING
    assert waiting_refusal_phase(waits, waited_seconds=600, deadline_seconds=600) \
        is MovePhase.FAILED
    assert waiting_refusal_phase(RefusalReason.SAME_CELL, waited_seconds=0,
                                 deadline_seconds=600) is MovePhase.FAILED


def test_a_move_whose_steps_keep_failing_gives_up_only_before_its_cutover() -> None:
    for phase in (MovePhase.COPYING, MovePhase.CATCHING_UP):
        assert gives_up(phase, failing_seconds=601, deadline_seconds=600)
        assert not gives_up(phase, failing_seconds=599, deadline_seconds=600)
    # From the cutover on the source may be frozen: the move ends it, never leaves it.
    for phase in (MovePhase.CUTTING_OVER, MovePhase.VERIFYING):
        assert not gives_up(phase, failing_seconds=10_000, deadline_seconds=600)


# -- the write pause is bounded (issue #18, item 13) ------------------------------------


def test_the_cutover_keeps_a_reserve_of_its_budget_for_ending_the_pause() -> None:
    clock = CutoverClock(paused_at=100.0, max_pause_seconds=2.0, record_write_seconds=0.2,
                         cell_call_seconds=0.3)
    # Ending the pause: a record write and a cell call, after the commit's record write,
    # half as long again for load that grows meanwhile.
    assert clock.commit_by == pytest.approx(100.0 + 2.0 - 1.5 * (2 * 0.2 + 0.3))
    assert clock.left(100.5) == pytest.approx(0.45)
    # Lucky timings still keep a quarter of the budget.
    assert cutover_reserve(record_write_seconds=0.0, cell_call_seconds=0.0,
                           max_pause_seconds=2.0) == pytest.approx(0.5)
    # A machine so slow that ending the pause alone takes the budget leaves no time at all:
    # the cutover gives the writes back at once rather than pausing longer.
    slow = CutoverClock(paused_at=0.0, max_pause_seconds=2.0, record_write_seconds=1.0,
                        cell_call_seconds=0.5)
    assert slow.left(0.0) < 0


def test_cutovers_over_their_budget_are_tried_again_then_fail() -> None:
    assert [after_overrun(n) for n in range(1, MAX_CUTOVER_ATTEMPTS + 1)] == \
        [Overrun.RETRY] * (MAX_CUTOVER_ATTEMPTS - 1) + [Overrun.FAIL]
