"""The tenant controller's smaller decisions, made purely: what a failed call to the cell
means, when the record and the Secret must change, whether a deleted tenant can leave its
cell and what is said of it, which moves hold the tenant."""

from __future__ import annotations

from cellplane_operator.domain.cells import CellPhase
from cellplane_operator.domain.fencing import ManualFence
from cellplane_operator.domain.tenants import (
    CellGone, MoveSeen, RemoveFrom, TenantCell, WaitForTenantCell, moves_under_way,
    provisioning_failed, purges_data, record_update_due, removal_cell, removed_message,
    secret_of_another_tenant,
)

ADMIN = "http://127.0.0.1:9001"


def test_a_cell_that_does_not_answer_is_unreachable_and_one_that_fails_is_failed() -> None:
    unreachable = provisioning_failed(cell="a1", http_status=0, error="connection refused")
    assert unreachable == WaitForTenantCell(
        "CellUnreachable", "provisioning in cell a1 failed, retried with backoff: "
                           "connection refused")
    failed = provisioning_failed(cell="a1", http_status=503, error="overloaded")
    assert failed is not None and failed.reason == "CellFailed" and "overloaded" in failed.message


def test_a_refusal_of_the_spec_is_not_a_failure_to_retry_as_such() -> None:
    for status in (400, 413, 422):
        assert provisioning_failed(cell="a1", http_status=status, error="no") is None


def test_the_record_is_updated_when_the_quota_or_the_key_differs() -> None:
    def due(recorded_digest: str | None = "d1", max_running_jobs: int = 5,
            digest: str = "d1") -> bool:
        return record_update_due(recorded_max_running_jobs=5, recorded_digest=recorded_digest,
                                 max_running_jobs=max_running_jobs, digest=digest)
    assert not due()
    assert due(max_running_jobs=9) and due(digest="d2")
    # A record written before the key's digest was known.
    assert due(recorded_digest=None)


def test_a_secret_of_an_earlier_tenant_of_the_same_name_is_not_reused() -> None:
    def stale(secret_tenant_id: str | None, owner_uids: set[str]) -> bool:
        return secret_of_another_tenant(secret_tenant_id=secret_tenant_id,
                                        owner_uids=owner_uids, tenant_id="t-1", uid="uid-1")
    assert not stale("t-1", {"uid-1"})
    # Another tenant id: its key would be routed to the old tenant.
    assert stale("t-0", {"uid-1"})
    # Owned by another Tenant object, whatever it says.
    assert stale("t-1", {"uid-0"})
    # Written before the Secret named its tenant or had owners: taken as ours.
    assert not stale(None, set())


def test_a_tenant_leaves_a_serving_cell_through_its_admin_api() -> None:
    for phase in (CellPhase.READY, CellPhase.DEGRADED, CellPhase.DRAINING):
        assert removal_cell("a1", TenantCell(phase, ADMIN)) == RemoveFrom(ADMIN)
    # A fence refuses the tenant's writes, not the admin API's removal.
    fenced = TenantCell(CellPhase.READY, ADMIN, fence=ManualFence(reason="maintenance"))
    assert removal_cell("a1", fenced) == RemoveFrom(ADMIN)


def test_a_tenant_waits_for_its_cell_to_serve_before_leaving_it() -> None:
    for cell in (TenantCell(CellPhase.FAILING_OVER, ADMIN), TenantCell(None, None),
                 TenantCell(CellPhase.READY, None)):
        assert removal_cell("a1", cell) == WaitForTenantCell(
            "CellUnavailable", "waiting for cell a1 to serve, to remove the tenant from it")


def test_a_tenant_whose_cell_is_gone_has_nothing_to_leave() -> None:
    assert removal_cell("a1", None) == CellGone()


def test_only_the_delete_policy_purges_and_the_event_says_where_the_data_went() -> None:
    assert purges_data("Delete") and not purges_data("Retain")
    assert removed_message(cell="a1", tenant_id="t-1", purge=True) == \
        "left cell a1; its data was deleted"
    kept = removed_message(cell="a1", tenant_id="t-1", purge=False)
    assert kept.startswith("left cell a1; its data was kept, disabled, as tenant t-1")
    assert "/admin/v1/tenants/t-1" in kept


def test_only_the_tenants_moves_under_way_hold_it() -> None:
    moves = [MoveSeen("m-copy", "acme", "Copying", "b1"),
             MoveSeen("a-cut", "acme", "CuttingOver", "b2"),
             MoveSeen("m-done", "acme", "Completed", "b1"),
             MoveSeen("m-new", "acme", "Pending", None),
             MoveSeen("m-other", "other", "Copying", "b1"),
             MoveSeen("m-unread", None, "Copying", "b1")]
    assert moves_under_way("acme", moves, described=False) == ["a-cut", "m-copy"]
    assert moves_under_way("acme", moves, described=True) == [
        "a-cut: CuttingOver to cell b2", "m-copy: Copying to cell b1"]
    assert moves_under_way("nobody", moves, described=False) == []
