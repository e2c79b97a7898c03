"""``kubectl cellplane`` run the way a user runs a plugin: the pinned kubectl finds
``kubectl-cellplane`` on PATH (the console script in the virtualenv) and hands it its
arguments, against a real apiserver where a real operator placed a tenant in a Ready cell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellplane_operator.localplane import LocalControlPlane
from regionplane import RegionPlane, ready, ready_cell, secret_data, tenant

PLUGIN = Path(sys.executable).parent / "kubectl-cellplane"
CELL = "kp-a1"


@pytest.fixture(scope="module")
def placed(plane: RegionPlane) -> str:
    """A Ready cell and a Ready tenant pinned to it; the tenant's namespace."""
    assert PLUGIN.is_file(), f"{PLUGIN} is missing: bash hack/setup.sh installs the console script"
    ns = plane.namespace("plugin")
    ready_cell(plane, CELL)
    plane.apply(tenant("acme", ns, cell=CELL))
    plane.await_status("tenant", "acme", ready, namespace=ns)
    plane.await_status("cell", CELL, lambda s: s.get("tenants") == 1)
    return ns


def kubectl(kube: LocalControlPlane, *argv: str,
            kubeconfig_env: bool = True) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl as a user runs it: the virtualenv's scripts on PATH, $KUBECONFIG set."""
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["PATH"] = f"{PLUGIN.parent}{os.pathsep}{env.get('PATH', '')}"
    if kubeconfig_env:
        env["KUBECONFIG"] = str(kube.kubeconfig)
    return subprocess.run([str(kube.binaries.kubectl), *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def kubectl_cellplane(kube: LocalControlPlane, *argv: str,
                      kubeconfig_env: bool = True) -> subprocess.CompletedProcess[str]:
    """``kubectl cellplane ARGV``: kubectl itself looks the plugin up on PATH."""
    return kubectl(kube, "cellplane", *argv, kubeconfig_env=kubeconfig_env)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_kubectl_finds_the_plugin_and_its_help_lists_the_commands(plane: RegionPlane) -> None:
    listed = kubectl(plane.kube, "plugin", "list")
    assert str(PLUGIN) in listed.stdout, listed.stdout + listed.stderr
    shown = kubectl_cellplane(plane.kube, "--help")
    assert shown.returncode == 0, shown.stderr
    for command in ("status", "tenant-key", "move", "switchover", "failover", "fence",
                    "unfence", "report"):
        assert f"    {command} " in shown.stdout, command
    assert kubectl_cellplane(plane.kube, "no-such-command").returncode == 2


def test_status_shows_the_ready_cell_and_its_tenant(plane: RegionPlane, placed: str) -> None:
    shown = kubectl_cellplane(plane.kube, "status")
    assert shown.returncode == 0, shown.stderr
    cells, tenants = shown.stdout.split("\n\n")
    row = next(line.split() for line in cells.splitlines() if line.startswith(f"{CELL} "))
    assert row[:5] == [CELL, "region-a", "shared", "Ready", "region-a"]
    assert int(row[5]) >= 1 and row[6] == "1" and row[7] == "5/40" and row[8] == "-"
    assert [CELL, f"{placed}/acme", "pro", "1", "Ready"] in [
        line.split() for line in tenants.splitlines()]

    as_json = kubectl_cellplane(plane.kube, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    [found] = [c for c in summary["cells"] if c["name"] == CELL]
    assert (found["phase"], found["activeRegion"], found["tenants"], found["slotsInUse"],
            found["workerSlots"], found["fenced"]) == ("Ready", "region-a", 1, 5, 40, None)
    assert {"namespace": placed, "name": "acme", "plan": "pro", "cell": CELL, "epoch": 1,
            "phase": "Ready"} in summary["tenants"]
    # -n keeps the tenants of one namespace; --kubeconfig after the plugin's name works
    # without $KUBECONFIG.
    elsewhere = kubectl_cellplane(plane.kube, "status", "--json", "-n", "no-tenants-here",
                                  "--kubeconfig", str(plane.kube.kubeconfig),
                                  kubeconfig_env=False)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert json.loads(elsewhere.stdout)["tenants"] == []


def test_tenant_key_prints_the_key_in_the_secret(plane: RegionPlane, placed: str) -> None:
    stored = secret_data(plane, placed, "acme-api-key")
    assert stored is not None
    for argv in (("tenant-key", "acme", "-n", placed), ("-n", placed, "tenant-key", "acme")):
        shown = kubectl_cellplane(plane.kube, *argv)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == stored["api-key"] + "\n"


def test_a_kubeconfig_with_inline_credentials_works_and_leaves_no_key_on_disk(
        plane: RegionPlane, placed: str, tmp_path: Path) -> None:
    # kind and most clouds write the CA, client certificate and key inline (*-data).
    flattened = plane.kube.kubectl("config", "view", "--raw", "--flatten").stdout
    assert "client-key-data:" in flattened and "certificate-authority-data:" in flattened
    kubeconfig = tmp_path / "inline-kubeconfig"
    kubeconfig.write_text(flattened)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TMPDIR": str(scratch)}
    shown = subprocess.run([str(PLUGIN), "tenant-key", "acme", "-n", placed], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == (secret_data(plane, placed, "acme-api-key") or {})["api-key"]
    assert list(scratch.iterdir()) == []


def test_tenant_key_of_an_unknown_or_unready_tenant_is_refused_in_one_line(
        plane: RegionPlane, placed: str) -> None:
    unknown = kubectl_cellplane(plane.kube, "tenant-key", "nobody", "-n", placed)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert one_line(unknown.stderr) == f"kubectl cellplane: no tenant {placed}/nobody"

    plane.apply(tenant("homeless", placed, cell="no-such-cell"))
    plane.await_status("tenant", "homeless", lambda s: s.get("phase") == "Unplaceable",
                       namespace=placed)
    unready = kubectl_cellplane(plane.kube, "tenant-key", "homeless", "-n", placed)
    assert unready.returncode == 1 and unready.stdout == ""
    line = one_line(unready.stderr)
    assert line.startswith(f"kubectl cellplane: tenant {placed}/homeless is not Ready yet")
    assert "PinnedCellNotFound" in line
    plane.kube.kubectl("delete", "tenant", "homeless", "-n", placed, "--wait=true",
                       "--timeout=60s")


def test_a_move_that_cannot_start_is_refused_in_one_line(plane: RegionPlane, placed: str) -> None:
    for argv, said in ((("acme", "--to", "no-such-cell"), "no cell no-such-cell"),
                       (("nobody", "--to", CELL), f"no tenant {placed}/nobody"),
                       (("acme", "--to", CELL), f"tenant {placed}/acme is in cell {CELL} already")):
        moved = kubectl_cellplane(plane.kube, "move", *argv, "-n", placed)
        assert (moved.returncode, moved.stdout) == (1, ""), moved.stderr
        assert one_line(moved.stderr) == f"kubectl cellplane move: {said}"
    listed = plane.kube.kubectl("get", "tenantmoves", "-n", placed, "-o", "name")
    assert listed.stdout == ""


def test_unknown_cells_are_refused_in_one_line(plane: RegionPlane, placed: str) -> None:
    switched = kubectl_cellplane(plane.kube, "switchover", "no-such-cell", "--to", "region-b")
    assert switched.returncode == 1
    assert one_line(switched.stderr) == "kubectl cellplane switchover: no cell no-such-cell"
    elsewhere = kubectl_cellplane(plane.kube, "switchover", CELL, "--to", "region-z")
    assert elsewhere.returncode == 1
    assert one_line(elsewhere.stderr).startswith(
        f"kubectl cellplane switchover: cell {CELL} has no site in region-z")
    reported = kubectl_cellplane(plane.kube, "report", "no-such-cell")
    assert reported.returncode == 1
    assert one_line(reported.stderr).startswith(
        "kubectl cellplane report: no reconciliation report for cell no-such-cell")
