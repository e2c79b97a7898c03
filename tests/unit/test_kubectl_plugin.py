"""``kubectl cellplane``: the status tables from Cells and Tenants as read, when a tenant's key
may be handed out, and the arguments: flags before or after the command, the commands
``cellplane`` shares with it, usage errors. No apiserver: nothing here reaches one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cellplane_operator.commands.kubectl import (
    fence_shown,
    main,
    parse_args,
    render_status,
    status_summary,
    tenant_not_ready,
)


def cell(name: str, *, status: dict[str, Any] | None = None, standby_regions: tuple[str, ...] = (),
         max_lag: float | None = None, region: str = "region-a", tier: str = "shared",
         slots: int = 200) -> dict[str, Any]:
    spec: dict[str, Any] = {"region": region, "tier": tier,
                            "capacity": {"tenants": 50, "workerSlots": slots},
                            "standbyRegions": list(standby_regions)}
    if max_lag is not None:
        spec["failover"] = {"maxStandbyLagSeconds": max_lag}
    found: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
    if status is not None:
        found["status"] = status
    return found


def tenant(name: str, namespace: str, *, plan: str = "pro",
           status: dict[str, Any] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace},
                             "spec": {"plan": plan, "homeRegion": "region-a"}}
    if status is not None:
        found["status"] = status
    return found


SERVING = {"phase": "Ready", "activeRegion": "region-a", "activeSite": "a1", "epoch": 3,
           "tenants": 2, "slotsInUse": 25,
           "standbys": [{"region": "region-b", "streaming": True, "lagSeconds": 0.25}]}


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_a_serving_cell_and_its_tenants_in_two_tables() -> None:
    shown = render_status(
        [cell("shared-a1", status=SERVING, standby_regions=("region-b",))],
        [tenant("globex", "demo", plan="free", status={"phase": "Ready", "cell": "shared-a1",
                                                       "epoch": 1}),
         tenant("acme", "demo", status={"phase": "Ready", "cell": "shared-a1", "epoch": 2})])
    assert lines(shown) == [
        "CELL        REGION     TIER     PHASE   ACTIVE     EPOCH   TENANTS   SLOTS    FENCED   STANDBYS",
        "shared-a1   region-a   shared   Ready   region-a   3       2         25/200   -        region-b 0.2s",
        "",
        "CELL        TENANT        PLAN   EPOCH   PHASE",
        "shared-a1   demo/acme     pro    2       Ready",
        "shared-a1   demo/globex   free   1       Ready",
    ]


def test_a_new_cell_without_status_shows_dashes_not_an_error() -> None:
    shown = render_status([cell("fresh", standby_regions=("region-b",))],
                          [tenant("waiting", "team-a")])
    assert lines(shown)[1].split() == ["fresh", "region-a", "shared", "-", "-", "-", "-",
                                       "-/200", "-", "region-b", "(no", "report)"]
    assert lines(shown)[-1].split() == ["-", "team-a/waiting", "pro", "-", "-"]
    summary = status_summary([{"metadata": {"name": "bare"}}], [])
    assert summary["cells"] == [{
        "name": "bare", "region": None, "tier": None, "phase": None, "activeRegion": None,
        "epoch": None, "tenants": None, "slotsInUse": None, "workerSlots": None, "standbys": [],
        "fenced": None, "fenceReason": None}]
    assert lines(render_status([{"metadata": {"name": "bare"}}], []))[1].split() == (
        ["bare"] + ["-"] * 9)


def test_standbys_say_streaming_lagging_or_not_streaming_against_the_cells_own_limit() -> None:
    status = {**SERVING, "phase": "Degraded", "standbys": [
        {"region": "region-b", "streaming": True, "lagSeconds": 45.04},
        {"region": "region-c", "streaming": False, "lagSeconds": 3.0,
         "message": "connection refused"},
        {"region": "region-d", "streaming": True}]}
    lagging = cell("lagging", status=status,
                   standby_regions=("region-b", "region-c", "region-d", "region-e"))
    summary = status_summary([lagging], [])
    assert [(s["region"], s["state"]) for s in summary["cells"][0]["standbys"]] == [
        ("region-b", "lagging"), ("region-c", "not streaming"), ("region-d", "streaming"),
        ("region-e", "no report")]
    row = lines(render_status([lagging], []))[1]
    assert row.endswith("region-b 45.0s (lagging), region-c (not streaming), "
                        "region-d (streaming), region-e (no report)")
    # The same lag within a larger spec.failover.maxStandbyLagSeconds is only lag.
    patient = cell("patient", status=status, standby_regions=("region-b",), max_lag=60)
    assert status_summary([patient], [])["cells"][0]["standbys"][0]["state"] == "streaming"


def test_after_a_takeover_the_home_region_is_the_standby_and_the_new_active_is_not() -> None:
    status = {**SERVING, "activeRegion": "region-b", "epoch": 4,
              "standbys": [{"region": "region-a", "streaming": True, "lagSeconds": 0.5}]}
    taken_over = cell("shared-a1", status=status, standby_regions=("region-b",))
    assert [(s["region"], s["state"]) for s in
            status_summary([taken_over], [])["cells"][0]["standbys"]] == [
        ("region-a", "streaming")]
    assert lines(render_status([taken_over], []))[1].endswith("region-a 0.5s")


def test_empty_lists_say_so() -> None:
    assert render_status([], []) == "No cells.\n\nNo tenants.\n"
    assert status_summary([], []) == {"cells": [], "tenants": []}


def test_tenants_are_grouped_by_cell_with_the_unplaced_last() -> None:
    tenants = [tenant("z", "a", status={"phase": "Unplaceable"}),
               tenant("b", "team-b", status={"cell": "cell-2", "epoch": 1, "phase": "Ready"}),
               tenant("a", "team-b", status={"cell": "cell-1", "epoch": 4, "phase": "Degraded"}),
               tenant("a", "team-a", status={"cell": "cell-2", "epoch": 1, "phase": "Ready"})]
    rows = status_summary([], tenants)["tenants"]
    assert [(r["cell"], f"{r['namespace']}/{r['name']}") for r in rows] == [
        ("cell-1", "team-b/a"), ("cell-2", "team-a/a"), ("cell-2", "team-b/b"), (None, "a/z")]


def test_the_json_summary_is_plain_json_with_every_field_named() -> None:
    summary = status_summary([cell("shared-a1", status=SERVING, standby_regions=("region-b",))],
                             [tenant("acme", "demo", status={"phase": "Ready",
                                                             "cell": "shared-a1", "epoch": 2})])
    assert json.loads(json.dumps(summary)) == {
        "cells": [{"name": "shared-a1", "region": "region-a", "tier": "shared", "phase": "Ready",
                   "activeRegion": "region-a", "epoch": 3, "tenants": 2, "slotsInUse": 25,
                   "workerSlots": 200,
                   "standbys": [{"region": "region-b", "streaming": True, "lagSeconds": 0.25,
                                 "state": "streaming", "message": None}],
                   "fenced": None, "fenceReason": None}],
        "tenants": [{"namespace": "demo", "name": "acme", "plan": "pro", "cell": "shared-a1",
                     "epoch": 2, "phase": "Ready"}]}


def fenced_cell(annotation: str | None, condition: str | None) -> dict[str, Any]:
    found = cell("c1", status={**SERVING, "phase": "Fenced", "conditions": [] if condition is None
                               else [{"type": "Fenced", "status": condition}]})
    if annotation is not None:
        found["metadata"]["annotations"] = {"cellplane.io/fenced": annotation}
    return found


def test_fenced_cells_show_whether_the_fence_is_in_force() -> None:
    assert fence_shown(fenced_cell("disk swap", "True")) == "yes"
    assert fence_shown(fenced_cell("disk swap", "False")) == "pending"
    assert fence_shown(fenced_cell("true", None)) == "pending"
    assert fence_shown(fenced_cell(None, "True")) == "lifting"
    assert fence_shown(fenced_cell(None, "False")) is None
    row = status_summary([fenced_cell("disk swap", "True")], [])["cells"][0]
    assert (row["phase"], row["fenced"], row["fenceReason"]) == ("Fenced", "yes", "disk swap")
    shown = lines(render_status([fenced_cell("disk swap", "True")], []))
    assert shown[0].split()[8] == "FENCED" and shown[1].split()[3] == "Fenced"
    assert shown[1].split()[8] == "yes"


def ready_condition(status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


def test_a_key_is_handed_out_only_for_a_ready_tenant() -> None:
    assert tenant_not_ready(tenant("t", "ns", status={
        "phase": "Ready", "conditions": [ready_condition("True", "Provisioned")]})) is None
    # Degraded still serves: its Ready condition holds.
    assert tenant_not_ready(tenant("t", "ns", status={
        "phase": "Degraded", "conditions": [ready_condition("True", "Provisioned")]})) is None
    assert tenant_not_ready(tenant("t", "ns")) == "Pending: no Ready condition yet"
    assert tenant_not_ready(tenant("t", "ns", status={
        "phase": "Unplaceable",
        "conditions": [ready_condition("False", "NoCapacity", "no cell has 5 slots free")]})) == (
        "Unplaceable: NoCapacity: no cell has 5 slots free")


def parse(*argv: str) -> Any:
    return parse_args(argv)


def test_namespace_and_kubeconfig_count_before_or_after_the_command() -> None:
    before = parse("--kubeconfig", "/k", "-n", "team-a", "tenant-key", "acme")
    after = parse("tenant-key", "acme", "-n", "team-a", "--kubeconfig", "/k")
    for args in (before, after):
        assert (args.tenant, args.namespace, args.kubeconfig) == ("acme", "team-a", Path("/k"))
    # The one after the command wins.
    assert parse("-n", "x", "move", "acme", "--to", "b", "-n", "y").namespace == "y"
    assert parse("move", "acme", "--to", "b").namespace is None  # the context's, later
    assert parse("status").namespace is None  # every namespace
    assert parse("-n", "x", "switchover", "c", "--to", "region-b").region == "region-b"


def test_report_reads_the_operators_namespace_unless_told_otherwise() -> None:
    assert parse("report", "shared-a1").namespace == "cellplane-system"
    assert parse("-n", "ops", "report", "shared-a1").namespace == "ops"
    assert parse("report", "shared-a1", "--namespace", "ops2").namespace == "ops2"
    assert parse("report", "shared-a1", "-n", "ops3").namespace == "ops3"


def test_fence_and_unfence_take_a_cell_a_reason_and_wait() -> None:
    args = parse("fence", "shared-a1")
    assert (args.cell, args.reason, args.wait, args.timeout) == ("shared-a1", None, False, 60.0)
    args = parse("--kubeconfig", "/k", "fence", "shared-a1", "--reason", "runaway tenant",
                 "--wait", "--timeout", "5")
    assert (args.reason, args.wait, args.timeout, args.kubeconfig) == (
        "runaway tenant", True, 5.0, Path("/k"))
    args = parse("unfence", "shared-a1", "--wait")
    assert (args.command, args.cell, args.wait) == ("unfence", "shared-a1", True)
    assert not hasattr(args, "reason")


def test_cells_are_cluster_scoped_so_a_namespace_is_accepted_and_ignored() -> None:
    for command in (("switchover", "c", "--to", "region-b"),
                    ("failover", "c", "--to", "region-b", "--force"),
                    ("fence", "c"), ("unfence", "c")):
        args = parse(*command, "-n", "team-a")
        assert not hasattr(args, "namespace") and args.cell == "c"


def test_help_lists_every_command_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for command in ("status", "tenant-key", "move", "switchover", "failover", "fence",
                    "unfence", "report"):
        assert any(line.split()[:1] == [command] for line in shown.splitlines()), command


@pytest.mark.parametrize("command", ["fence", "unfence"])
def test_fence_commands_have_their_own_help(command: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "cellplane.io/fenced" in shown and "--wait" in shown and "--timeout" in shown


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["no-such-command"], ["tenant-key"], ["switchover", "c"],
                 ["failover", "c", "--to", "region-b"], ["report", "c", "--epoch", "x"],
                 ["fence"], ["unfence"], ["fence", "c", "--timeout", "soon"],
                 ["unfence", "c", "--reason", "x"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
    assert main([]) == 2
    capsys.readouterr()


def test_an_unreadable_kubeconfig_is_one_line_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere")
    for argv in (["status"], ["tenant-key", "acme"], ["report", "c"],
                 ["switchover", "c", "--to", "region-b"], ["fence", "c"], ["unfence", "c"]):
        assert main(["--kubeconfig", missing, *argv]) == 1, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "cannot read kubeconfig" in err, err
