"""A Tenant's URLs through the operator (issue #18, items 1 and 2), on the real apiserver,
etcd, operator and cells.

- The cell's set of targets and webhooks equals the spec's: one taken out of the spec
  is taken out of the cell, and the events of the tenant stop going to it.
- A move into a cell whose URL policy refuses the tenant's URLs (a production cell,
  after a development one) is refused before it starts, with the reason; the tenant
  stays where it is, serving, and is not left Moving.
"""

from __future__ import annotations

from typing import Any

from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import TenantKey
from httpservers import RecordingServer
from regionplane import RegionPlane, cell, cell_database, condition, db_rows, ready, ready_cell, \
    records, tenant


def _endpoints(conninfo: str, tenant_id: str) -> tuple[list[str], list[str]]:
    targets = [str(r[0]) for r in db_rows(
        conninfo, "SELECT url FROM targets WHERE tenant_id = %s ORDER BY url", tenant_id)]
    hooks = [str(r[0]) for r in db_rows(
        conninfo, "SELECT url FROM webhook_endpoints WHERE tenant_id = %s ORDER BY url", tenant_id)]
    return targets, hooks


def test_targets_and_webhooks_taken_out_of_the_spec_leave_the_cell(
        plane: RegionPlane, target: RecordingServer) -> None:
    ready_cell(plane, "urls-a")
    namespace = plane.namespace("ns-urls-shrink")
    kept_target, old_target = f"{target.url}/run", f"{target.url}/old"
    kept_hook, old_hook = f"{target.url}/hooks/kept", f"{target.url}/hooks/old"
    manifest = tenant("shrinks", namespace, cell="urls-a",
                      targets=[{"name": "default", "url": kept_target},
                               {"name": "old", "url": old_target}],
                      webhooks=[{"url": kept_hook}, {"url": old_hook}])
    plane.apply(manifest)
    status = plane.await_status("tenant", "shrinks", ready, namespace=namespace, timeout=120)
    conninfo, tenant_id = cell_database(plane, "urls-a"), str(status["tenantId"])
    assert _endpoints(conninfo, tenant_id) == (sorted([kept_target, old_target]),
                                               sorted([kept_hook, old_hook]))

    manifest["spec"]["targets"] = manifest["spec"]["targets"][:1]
    manifest["spec"]["webhooks"] = manifest["spec"]["webhooks"][:1]
    plane.apply(manifest)
    generation = int(plane.get("tenant", "shrinks", namespace)["metadata"]["generation"])
    plane.await_status("tenant", "shrinks",
                       lambda s: ready(s) and s.get("observedGeneration") == generation,
                       namespace=namespace, timeout=120)
    # Ready with the new generation means the cell holds what the spec says, no more.
    assert _endpoints(conninfo, tenant_id) == ([kept_target], [kept_hook])

    # Emptied, both lists empty the cell.
    manifest["spec"]["targets"], manifest["spec"]["webhooks"] = [], []
    plane.apply(manifest)
    generation = int(plane.get("tenant", "shrinks", namespace)["metadata"]["generation"])
    plane.await_status("tenant", "shrinks",
                       lambda s: ready(s) and s.get("observedGeneration") == generation,
                       namespace=namespace, timeout=120)
    assert _endpoints(conninfo, tenant_id) == ([], [])


def test_a_move_into_a_cell_that_refuses_the_tenants_urls_is_refused_before_it_starts(
        plane: RegionPlane, target: RecordingServer) -> None:
    ready_cell(plane, "urls-dev")
    # A production cell: no loopback or private targets.
    plane.apply(cell("urls-prod", driver={"allowPrivateTargets": False}))
    plane.await_status("cell", "urls-prod", lambda s: ready(s) and bool(s.get("endpoints")),
                       timeout=120)
    namespace = plane.namespace("ns-urls-move")
    plane.apply(tenant("private", namespace, cell="urls-dev",
                       targets=[{"name": "default", "url": f"{target.url}/run"}],
                       webhooks=[{"url": f"http://[2002:7f00:1::]:{target.port}/hook"}]))
    status = plane.await_status("tenant", "private", ready, namespace=namespace, timeout=120)
    tenant_id = str(status["tenantId"])
    record_before = records(plane)[TenantKey(namespace, "private")]

    plane.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
                 "metadata": {"name": "private-to-prod", "namespace": namespace},
                 "spec": {"tenant": "private", "targetCell": "urls-prod"}})
    moved = plane.await_status("tenantmove", "private-to-prod",
                               lambda s: s.get("phase") in ("Completed", "Aborted", "Failed"),
                               namespace=namespace, timeout=120, what="the move to end")
    accepted = condition(moved, "Accepted")
    assert moved["phase"] == "Failed", moved
    assert (accepted.get("status"), accepted.get("reason")) == ("False", "TargetRefusesUrls"), moved
    message = str(accepted.get("message"))
    assert f"spec.targets[0].url ({target.url}/run)" in message, message
    assert "spec.webhooks[0].url" in message and "127.0.0.1" in message, message
    # Nothing started: the tenant is where it was, serving, not Moving; the production
    # cell never received it.
    assert records(plane)[TenantKey(namespace, "private")] == record_before
    assert db_rows(cell_database(plane, "urls-prod"),
                   "SELECT count(*) FROM tenants WHERE tenant_id = %s", tenant_id)[0][0] == 0

    def settled() -> dict[str, Any] | None:
        found = plane.get("tenant", "private", namespace) or {}
        status = found.get("status") or {}
        return status if ready(status) and condition(status, "Moving").get("status") == "False" \
            else None

    wait_for(settled, timeout=60, what="the tenant Ready and not Moving")
