"""``cellplane move``: the progress line from a TenantMove's status, the reason of its end,
its default name, and the arguments it refuses before talking to any apiserver."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from cellplane_operator.commands.move import (
    add_move_command,
    move_name,
    HostUnresolved,
    move_refusal,
    run_move,
)
from cellplane_operator.domain.move_progress import ending_reason, render_progress


def progress(**fields: Any) -> dict[str, Any]:
    return {"progress": fields}


def test_a_move_without_status_yet_is_pending() -> None:
    assert render_progress({}) == "Pending      waiting for the operator"


def test_each_running_phase_shows_rows_of_total_with_a_bar_and_the_delta() -> None:
    copying = {"phase": "Copying", **progress(rowsCopied=4100, rowsTotal=10000)}
    assert render_progress(copying) == (
        "Copying      [########------------] 4,100/10,000 rows (41%)")
    catching_up = {"phase": "CatchingUp",
                   **progress(rowsCopied=10000, rowsTotal=10000, currentDelta=1234)}
    assert render_progress(catching_up) == (
        "CatchingUp   [####################] 10,000/10,000 rows (100%)  delta 1,234")
    cutting = {"phase": "CuttingOver", **progress(rowsCopied=10012, rowsTotal=10000,
                                                  currentDelta=12)}
    line = render_progress(cutting)
    assert line.startswith("CuttingOver  [####################] 10,012/10,000 rows (100%)")
    assert line.endswith("delta 12")
    for phase in ("Pending", "Copying", "CatchingUp", "CuttingOver", "Verifying"):
        assert render_progress({"phase": phase, **progress(rowsCopied=0, rowsTotal=3)}).startswith(
            f"{phase:<11}  [--------------------] 0/3 rows (0%)")


def test_the_bar_never_shows_done_before_the_last_row() -> None:
    line = render_progress({"phase": "Copying", **progress(rowsCopied=9999, rowsTotal=10000)},
                           width=10)
    assert "[#########-] 9,999/10,000 rows (99%)" in line


def test_without_totals_only_what_is_known_is_shown() -> None:
    assert render_progress({"phase": "Copying", **progress(rowsCopied=250)}) == (
        "Copying      250 rows copied")
    assert render_progress({"phase": "Copying"}) == "Copying"
    assert render_progress({"phase": "CatchingUp", **progress(currentDelta=7)}) == (
        "CatchingUp   delta 7")
    # An empty tenant: nothing to copy is all copied.
    assert render_progress({"phase": "Copying", **progress(rowsTotal=0)}) == (
        "Copying      [####################] 0/0 rows (100%)")
    # Values of the wrong type are left out, not crashed on.
    assert render_progress({"phase": "Copying", **progress(rowsCopied=True, rowsTotal="9")}) == (
        "Copying")


def test_a_completed_move_shows_its_measured_pause_and_no_delta() -> None:
    done = {"phase": "Completed", "sourceCell": "shared-a1", "targetCell": "dedicated-b1",
            **progress(rowsCopied=10040, rowsTotal=10000, currentDelta=0, pauseSeconds=0.8421)}
    assert render_progress(done) == (
        "Completed    [####################] 10,040/10,000 rows (100%)  pause 0.84s")


def test_a_failed_or_aborted_move_says_why() -> None:
    failed = {"phase": "Failed", **progress(rowsCopied=10, rowsTotal=10), "conditions": [
        {"type": "Ready", "status": "False", "reason": "MoveFailed", "message": "see Failed"},
        {"type": "Failed", "status": "True", "reason": "VerificationMismatch",
         "message": "jobs: 1000 rows in the source, 999 in the target"}]}
    assert render_progress(failed).endswith(
        "(100%)  VerificationMismatch: jobs: 1000 rows in the source, 999 in the target")
    refused = {"phase": "Failed", "conditions": [
        {"type": "Accepted", "status": "False", "reason": "TargetFull",
         "message": "cell shared-b1 has no room for tenant acme"}]}
    assert render_progress(refused) == (
        "Failed       TargetFull: cell shared-b1 has no room for tenant acme")
    aborted = {"phase": "Aborted", "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Admitted", "message": ""},
        {"type": "Completed", "status": "False", "reason": "AbortRequested", "message": ""}]}
    assert ending_reason(aborted) == "AbortRequested"
    assert ending_reason({"phase": "Failed"}) == "Failed: no condition says why"


def test_the_default_name_is_a_dns_label() -> None:
    assert move_name("acme", "dedicated-b1") == "acme-to-dedicated-b1"
    long = move_name("t" * 40, "c" * 40)
    assert len(long) == 63 and long.startswith("t" * 40 + "-to-")
    # A cut that ends in a dash is trimmed: a label ends in a letter or digit.
    assert move_name("t" * 59, "cell") == "t" * 59 + "-to"


@pytest.mark.parametrize("argv", [["move"], ["move", "acme"], ["move", "--to", "b1"],
                                  ["move", "acme", "--abort", "acme-to-b1"],
                                  ["move", "--abort", "acme-to-b1", "--to", "b1"]])
def test_arguments_that_name_no_single_action_are_refused(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="cellplane")
    add_move_command(parser.add_subparsers())
    args = parser.parse_args(argv)
    err = io.StringIO()
    assert run_move(args, out=io.StringIO(), err=err) == 2
    assert "cellplane move:" in err.getvalue()


def _tenant(isolation: str = "shared", cell: str | None = None) -> dict[str, Any]:
    return {"spec": {"plan": "pro", "isolation": isolation},
            "status": {"cell": cell} if cell else {}}


def _cell(tier: str) -> dict[str, Any]:
    return {"spec": {"tier": tier}}


@pytest.mark.parametrize(("tenant", "cell", "said"), [
    (None, _cell("shared"), "no tenant team-a/acme"),
    (_tenant(), None, "no cell b1"),
    (_tenant(cell="b1"), _cell("shared"), "tenant team-a/acme is in cell b1 already"),
    (_tenant(), _cell("dedicated"), "cell b1 is dedicated; tenant team-a/acme needs a shared cell"),
    (_tenant("dedicated"), _cell("shared"),
     "cell b1 is shared; tenant team-a/acme needs a dedicated cell"),
    (_tenant(cell="a1"), _cell("shared"), None),
    # A dedicated tenant's move makes the cell it names.
    (_tenant("dedicated", cell="a1"), None, None),
])
def test_a_move_that_cannot_start_is_refused_before_anything_is_written(
        tenant: dict[str, Any] | None, cell: dict[str, Any] | None, said: str | None) -> None:
    assert move_refusal(tenant, cell, tenant_name="acme", namespace="team-a", target="b1") == said


def _with_urls(*urls: str, webhook: str | None = None) -> dict[str, Any]:
    tenant = _tenant(cell="a1")
    tenant["spec"]["targets"] = [{"name": f"t{i}", "url": url} for i, url in enumerate(urls)]
    if webhook:
        tenant["spec"]["webhooks"] = [{"url": webhook}]
    return tenant


def test_a_cell_whose_url_policy_refuses_the_tenants_urls_is_refused_before_the_move() -> None:
    def dns(host: str) -> list[str]:
        return {"hooks.example": ["93.184.216.34"], "inside.example": ["10.0.0.8"]}[host]

    strict, lax = _cell("shared"), {"spec": {"tier": "shared",
                                             "driver": {"allowPrivateTargets": True}}}
    tenant = _with_urls("https://hooks.example/run", "http://127.0.0.1:9/run",
                        webhook="http://[2002:7f00:1::]/hook")
    said = move_refusal(tenant, strict, tenant_name="acme", namespace="team-a", target="b1",
                        resolve=dns)
    assert said is not None and said.startswith("cell b1 refuses the tenant's spec.targets[1].url "
                                                "(http://127.0.0.1:9/run)")
    assert "spec.webhooks[0].url (http://[2002:7f00:1::]/hook)" in said
    assert "spec.targets[0]" not in said
    assert move_refusal(tenant, lax, tenant_name="acme", namespace="team-a", target="b1",
                        resolve=dns) is None
    # A name resolved here to a private address is refused; one this machine cannot
    # resolve is left to the operator, which asks the cell itself.
    inside = _with_urls("https://inside.example/")
    assert "10.0.0.8" in (move_refusal(inside, strict, tenant_name="acme", namespace="team-a",
                                       target="b1", resolve=dns) or "")
    def unresolved(host: str) -> list[str]:
        raise HostUnresolved(host)

    unknown = _with_urls("https://nowhere.invalid/")
    assert move_refusal(unknown, strict, tenant_name="acme", namespace="team-a",
                        target="b1", resolve=unresolved) is None
