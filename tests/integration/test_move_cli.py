"""``cellplane move`` against a real kube-apiserver with the CRDs: it creates the TenantMove
the CRD accepts, ``--abort`` sets spec.abort, and ``--wait`` follows the status (written
here through the status subresource, standing in for the operator) to its exit code."""

from __future__ import annotations

import argparse
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.commands.move import add_move_command, run_move

NAMESPACE = "move-cli"
STAMP = "2026-01-01T00:00:00Z"


class Ran:
    def __init__(self) -> None:
        self.code: int | None = None
        self.out, self.err = io.StringIO(), io.StringIO()


def move(kube: LocalControlPlane, *argv: str) -> Ran:
    parser = argparse.ArgumentParser(prog="cellplane")
    add_move_command(parser.add_subparsers())
    args = parser.parse_args(["move", *argv, "-n", NAMESPACE,
                              "--kubeconfig", str(kube.kubeconfig)])
    ran = Ran()
    ran.code = run_move(args, out=ran.out, err=ran.err, tty=False)
    return ran


def in_background(kube: LocalControlPlane, *argv: str) -> tuple[threading.Thread, list[Ran]]:
    """Runs the command in a thread; the list gets its Ran when it ends."""
    ran: list[Ran] = []
    thread = threading.Thread(target=lambda: ran.append(move(kube, *argv)), daemon=True)
    thread.start()
    return thread, ran


def created(kube: LocalControlPlane, name: str) -> None:
    wait_for(lambda: f"tenantmove.cellplane.io/{name}" in kube.kubectl(
        "get", "tenantmove", "-n", NAMESPACE, "-o", "name").stdout.split(), timeout=30,
        what=f"TenantMove {name} to be created")


def stored(kube: LocalControlPlane, name: str) -> dict[str, Any]:
    found = kube.kubectl("get", "tenantmove", name, "-n", NAMESPACE, "-o", "json")
    return dict(json.loads(found.stdout))


def set_status(kube: LocalControlPlane, name: str, status: dict[str, Any]) -> None:
    kube.kubectl("patch", "tenantmove", name, "-n", NAMESPACE, "--subresource=status",
                 "--type=merge", "-p", json.dumps({"status": status}))


def condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": STAMP}


SHARED_TENANTS = ("abort-me", "done", "broken", "slow")
CELLS = {"cli-shared-b1": "shared", "cli-dedicated-b1": "dedicated"}


def _objects() -> list[dict[str, Any]]:
    """The Tenants and Cells the moves name, as stored objects: no operator runs here, the
    command only reads them to refuse a move that cannot start."""
    def tenant(name: str, isolation: str) -> dict[str, Any]:
        return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"plan": "enterprise" if isolation == "dedicated" else "pro",
                         "homeRegion": "region-a", "isolation": isolation}}

    def cell(name: str, tier: str) -> dict[str, Any]:
        return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
                "spec": {"region": "region-b", "tier": tier,
                         "capacity": {"tenants": 1 if tier == "dedicated" else 10,
                                      "workerSlots": 20}}}

    return ([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
             tenant("acme", "dedicated")]
            + [tenant(name, "shared") for name in SHARED_TENANTS]
            + [cell(name, tier) for name, tier in CELLS.items()])


@pytest.fixture(scope="module", autouse=True)
def tenants_and_cells(kube: LocalControlPlane) -> Iterator[None]:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": _objects()})
    kube.kubectl("apply", "-f", "-", input_text=listed)
    try:
        yield
    finally:
        kube.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s",
                     check=False)
        kube.kubectl("delete", "cell", *CELLS, "--wait=true", "--timeout=60s", check=False)


def test_a_move_that_cannot_start_is_refused_in_one_line_and_writes_nothing(
        kube: LocalControlPlane) -> None:
    for argv, said in ((("ghost", "--to", "cli-shared-b1"), f"no tenant {NAMESPACE}/ghost"),
                       (("done", "--to", "no-such-cell"), "no cell no-such-cell"),
                       (("done", "--to", "cli-dedicated-b1"),
                        f"cell cli-dedicated-b1 is dedicated; tenant {NAMESPACE}/done needs a "
                        "shared cell")):
        ran = move(kube, *argv)
        assert ran.code == 1 and ran.out.getvalue() == ""
        assert ran.err.getvalue() == f"cellplane move: {said}\n"
    assert kube.kubectl("get", "tenantmoves", "-n", NAMESPACE, "-o", "name").stdout == ""


def test_move_creates_a_tenant_move_named_after_tenant_and_cell(kube: LocalControlPlane) -> None:
    ran = move(kube, "acme", "--to", "cli-dedicated-b1", "--max-write-pause", "0.5",
               "--retain-source-for", "3600")
    assert ran.code == 0, ran.err.getvalue()
    assert ran.out.getvalue() == "acme-to-cli-dedicated-b1\n"
    created = stored(kube, "acme-to-cli-dedicated-b1")
    assert created["spec"] == {"tenant": "acme", "targetCell": "cli-dedicated-b1",
                               "maxWritePauseSeconds": 0.5, "retainSourceForSeconds": 3600,
                               "abort": False}
    # The same move again is refused, naming the one that exists.
    again = move(kube, "acme", "--to", "cli-dedicated-b1")
    assert again.code == 1
    assert "TenantMove acme-to-cli-dedicated-b1 exists already" in again.err.getvalue()
    # What the CRD refuses comes back as the apiserver's words.
    refused = move(kube, "acme", "--to", "cli-dedicated-b1", "--name", "too-short-a-pause",
                   "--max-write-pause", "0.01")
    assert refused.code == 1
    assert "maxWritePauseSeconds" in refused.err.getvalue()


def test_abort_sets_spec_abort_on_a_running_move(kube: LocalControlPlane) -> None:
    assert move(kube, "abort-me", "--to", "cli-shared-b1").code == 0
    set_status(kube, "abort-me-to-cli-shared-b1", {"phase": "Copying"})
    ran = move(kube, "--abort", "abort-me-to-cli-shared-b1")
    assert ran.code == 0, ran.err.getvalue()
    assert stored(kube, "abort-me-to-cli-shared-b1")["spec"]["abort"] is True
    assert move(kube, "--abort", "no-such-move").code == 1


def test_wait_follows_the_move_to_completed(kube: LocalControlPlane) -> None:
    thread, finished = in_background(kube, "done", "--to", "cli-shared-b1", "--wait",
                                     "--timeout", "60")
    created(kube, "done-to-cli-shared-b1")
    set_status(kube, "done-to-cli-shared-b1", {
        "phase": "Copying", "sourceCell": "shared-a1", "targetCell": "cli-shared-b1",
        "progress": {"rowsCopied": 500, "rowsTotal": 1000}})
    set_status(kube, "done-to-cli-shared-b1", {
        "phase": "Completed", "progress": {"rowsCopied": 1000, "rowsTotal": 1000,
                                           "currentDelta": 0, "pauseSeconds": 0.42},
        "conditions": [condition("Completed", "True", "Moved", "in shared-b1 under epoch 2")]})
    thread.join(timeout=30)
    [ran] = finished
    assert ran.code == 0, ran.err.getvalue()
    shown = ran.err.getvalue()
    assert "Completed    [####################] 1,000/1,000 rows (100%)  pause 0.42s" in shown
    assert "TenantMove done-to-cli-shared-b1 completed: shared-a1 -> cli-shared-b1; writes paused 0.42s" \
        in shown


def test_wait_says_why_a_move_failed(kube: LocalControlPlane) -> None:
    thread, finished = in_background(kube, "broken", "--to", "cli-shared-b1", "--wait",
                                     "--timeout", "60")
    created(kube, "broken-to-cli-shared-b1")
    set_status(kube, "broken-to-cli-shared-b1", {"phase": "Failed", "conditions": [
        condition("Failed", "True", "VerificationMismatch", "jobs: checksums differ")]})
    thread.join(timeout=30)
    [ran] = finished
    assert ran.code == 1
    assert "VerificationMismatch: jobs: checksums differ" in ran.err.getvalue()


def test_wait_gives_up_after_its_timeout_and_leaves_the_move(kube: LocalControlPlane) -> None:
    ran = move(kube, "slow", "--to", "cli-shared-b1", "--wait", "--timeout", "1")
    assert ran.code == 2
    assert "had not ended after 1s" in ran.err.getvalue()
    assert stored(kube, "slow-to-cli-shared-b1")["spec"]["abort"] is False
