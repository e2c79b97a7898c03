"""Cells as Kubernetes workloads on the local cluster (issue #17): a Cell with
``spec.driver.name: kubernetes`` is a StatefulSet of one Postgres Pod per region (its site
agent as PID 1), Services, and on the active region the cell API and workers as
Deployments; tenants reach it through the chart's router Services.

The operators and routers are the chart's (session fixture ``cluster_operators``). Jobs
are sent from inside the cluster (``kubectl exec`` into an operator container of a region
that stays up) to a router Service, and call a target Pod of the test's namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from clusterfixtures import (
    api_key,
    await_phase,
    delete_cells_once_empty,
    eventually,
    http_in_operator,
    in_operator,
    operator_image,
    operator_pods,
    pod_ready,
    status_of,
)
from cellplane_operator.domain.failover import SWITCHOVER_TO
from cellplane_operator.localplane.cluster import LocalCluster
from cellplane_operator.errors import ProcessStartError
from cellplane_operator.localplane.clusterchart import NAMESPACE, RELEASE, install_operators
from cellplane_operator.localplane.clusterload import (
    POD_PORT,
    TARGET_SERVER,
    ClusterLoad,
    PodServer,
    longest_pause,
    python_pod,
    reconciliation_report,
    site_sql,
)
from cellplane_operator.domain.reconciliation import ReconciliationReport

pytestmark = pytest.mark.cluster

CELL = "kube-a1"
MOVE_DESTINATION = "kube-b1"
HOME, STANDBY, ELSEWHERE = "region-a", "region-b", "region-c"
PRODUCT_LEASE = {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2}

def router_url(region: str) -> str:
    return f"http://{RELEASE}-router-{region}.{NAMESPACE}.svc.cluster.local:8080"


def site_objects_of(cluster: LocalCluster, kind: str) -> list[dict[str, Any]]:
    found = cluster.get_json(kind, "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={CELL}")
    return list(found["items"])


def db_query(cluster: LocalCluster, region: str, sql: str) -> str:
    return site_sql(cluster, NAMESPACE, CELL, region, sql)


@pytest.fixture(scope="module")
def operators(local_cluster: LocalCluster, cluster_operators: dict[str, Any]) -> LocalCluster:
    return local_cluster


@pytest.fixture(scope="module")
def namespace(operators: LocalCluster) -> Iterator[str]:
    name = f"kube-cells-{uuid.uuid4().hex[:6]}"
    operators.kubectl("create", "namespace", name)
    yield name
    operators.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def target(operators: LocalCluster, namespace: str) -> Iterator[PodServer]:
    """The jobs' target, a Pod on the region that is never lost here, behind a Service."""
    operators.apply([{"apiVersion": "v1", "kind": "Service",
                      "metadata": {"name": "target", "namespace": namespace},
                      "spec": {"selector": {"app": "target"},
                               "ports": [{"port": POD_PORT, "targetPort": POD_PORT}]}}])
    yield PodServer(operators, python_pod(operator_image(operators), "target", namespace,
                                          ELSEWHERE, TARGET_SERVER))


def target_url(target: PodServer) -> str:
    return f"http://target.{target.namespace}.svc.cluster.local:{POD_PORT}/run"


def start_load(cluster: LocalCluster, namespace: str, prefix: str, key: str) -> ClusterLoad:
    return ClusterLoad(cluster, image=operator_image(cluster), namespace=namespace,
                       region=ELSEWHERE, router=router_url(ELSEWHERE), key=key, prefix=prefix)


def await_acks(load: ClusterLoad, more: int, *, timeout: float = 180) -> None:
    start = load.acked()
    try:
        eventually(lambda: load.acked() >= start + more, timeout=timeout, interval=1,
                   what=f"{more} more acknowledged jobs")
    except ProcessStartError as missing:
        raise AssertionError(f"{missing}; failed attempts by reason: "
                             f"{load.get()['errors']}") from None


def jobs_in(cluster: LocalCluster, region: str, tenant_id: str) -> set[str]:
    rows = db_query(cluster, region, f"SELECT job_id FROM jobs WHERE tenant_id = '{tenant_id}'")
    assert not rows.startswith("failed"), rows
    return set(rows.split())


@pytest.fixture(scope="module")
def kube_cell(operators: LocalCluster, namespace: str) -> Iterator[dict[str, Any]]:
    """The module's cell; at the end its tenants and every cell of this module are deleted,
    so the modules after this one place their tenants in cells of their own."""
    began = time.monotonic()
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": CELL},
        "spec": {"region": HOME, "standbyRegions": [STANDBY], "tier": "shared",
                 "capacity": {"tenants": 5, "workerSlots": 10}, "lease": PRODUCT_LEASE,
                 "driver": {"name": "kubernetes", "allowPrivateTargets": True}}}])
    status = await_phase(operators, "cell", CELL, "Ready", timeout=600)
    print(f"\nCell {CELL} (kubernetes driver, one standby) apply -> Ready: "
          f"{time.monotonic() - began:.1f} s")
    yield status
    operators.kubectl("delete", "tenants", "--all", "-n", namespace, "--wait=true",
                      "--timeout=300s", timeout=330)
    delete_cells_once_empty(operators, CELL, MOVE_DESTINATION)


def test_a_kubernetes_cell_runs_a_database_pod_per_region_and_serves_from_its_home(
        operators: LocalCluster, kube_cell: dict[str, Any]) -> None:
    assert kube_cell["activeRegion"] == HOME
    sets = {s["metadata"]["labels"]["cellplane.io/region"]: s
            for s in site_objects_of(operators, "statefulsets")}
    assert set(sets) == {HOME, STANDBY}
    deployments = {(d["metadata"]["labels"]["cellplane.io/region"],
                    d["metadata"]["labels"]["app.kubernetes.io/component"],
                    d["metadata"]["labels"]["cellplane.io/role"])
                   for d in site_objects_of(operators, "deployments")}
    # Workers only where the cell is active; the standby's API is warmed up for a takeover.
    assert deployments == {(HOME, "api", "active"), (HOME, "worker", "active"),
                           (STANDBY, "api", "standby")}
    pods = site_objects_of(operators, "pods")
    for pod in pods:
        region = pod["metadata"]["labels"]["cellplane.io/region"]
        assert pod["spec"]["nodeName"] == operators.plan.node(region).name, pod["metadata"]
        security = pod["spec"]["securityContext"]
        assert security["runAsNonRoot"] and security["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["spec"]["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["resources"]["limits"]["memory"]
    # Each database is on a claim of its own region's node.
    for region, stateful in sets.items():
        claim = operators.get_json("pvc", f"data-cell-{CELL}-{region}-db-0", "-n", NAMESPACE)
        assert claim["status"]["phase"] == "Bound"
        volume = operators.get_json("pv", claim["spec"]["volumeName"])
        assert volume["metadata"]["labels"]["topology.kubernetes.io/region"] == region

    # The standby streams from the primary across nodes.
    def streaming() -> bool:
        standbys = status_of(operators, "cell", CELL).get("standbys") or []
        return any(s.get("region") == STANDBY and s.get("streaming") for s in standbys)

    eventually(streaming, timeout=180, interval=1, what=f"the standby in {STANDBY} streaming")
    assert db_query(operators, STANDBY, "SELECT pg_is_in_recovery()") == "t"
    assert db_query(operators, HOME, "SELECT pg_is_in_recovery()") == "f"
    # Passwords only over TCP: a connection without one is refused.
    refused = operators.kubectl(
        "exec", "-n", NAMESPACE, f"cell-{CELL}-{HOME}-db-0", "-c", "database", "--",
        "/usr/lib/postgresql/15/bin/psql", "-w", "-h", "127.0.0.1", "-U", "postgres",
        "-d", "cellplane", "-c", "SELECT 1", check=False, timeout=60)
    assert refused.returncode != 0, refused.stdout


@pytest.fixture(scope="module")
def acme(operators: LocalCluster, kube_cell: dict[str, Any], namespace: str,
         target: PodServer) -> dict[str, Any]:
    """The tenant, Ready in the cell; its status, with its API key under ``key``."""
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "acme", "namespace": namespace},
        "spec": {"plan": "enterprise", "homeRegion": HOME, "cell": CELL,
                 # Above the load's rate: a pause measured is the cell's, not the quota's.
                 "quotas": {"jobsPerSecond": 50, "burst": 100, "maxRunningJobs": 5},
                 "targets": [{"name": "default", "url": target_url(target)}]}}])
    tenant = await_phase(operators, "tenant", "acme", "Ready", namespace=namespace)
    return {**tenant, "key": api_key(operators, namespace, "acme-api-key")}


def test_a_tenant_runs_jobs_through_the_router_service_and_its_quotas_reach_the_cell(
        operators: LocalCluster, acme: dict[str, Any], namespace: str, target: PodServer) -> None:
    tenant = acme
    assert tenant["cell"] == CELL
    assert tenant["apiEndpoint"] == (
        f"http://cell-{CELL}-{HOME}-api.{NAMESPACE}.svc.cluster.local:8080")
    key = tenant["key"]
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "k8s-first-job"}
    status, answer = http_in_operator(operators, ELSEWHERE, "POST",
                                      f"{router_url(ELSEWHERE)}/v1/jobs",
                                      headers, {"target": "default", "payload": {"n": 1},
                                                "steps": 2})
    assert status == 202, answer
    job_id = answer["job_id"]

    def succeeded() -> bool:
        code, job = http_in_operator(operators, ELSEWHERE, "GET",
                                     f"{router_url(ELSEWHERE)}/v1/jobs/{job_id}",
                                     {"Authorization": f"Bearer {key}"})
        return code == 200 and job["status"] == "succeeded"

    eventually(succeeded, timeout=120, interval=1, what=f"job {job_id} to succeed")
    steps = [c for c in target.get() if c["body"].get("job_id") == job_id]
    assert sorted(c["body"]["step"] for c in steps) == [1, 2], steps  # steps count from 1

    tenant_id = tenant["tenantId"]
    operators.kubectl("patch", "tenant", "acme", "-n", namespace, "--type=merge", "-p",
                      json.dumps({"spec": {"quotas": {"maxRunningJobs": 7, "burst": 120}}}))
    eventually(lambda: db_query(operators, HOME,
                                f"SELECT max_running_jobs, burst FROM tenants "
                                f"WHERE tenant_id = '{tenant_id}'") == "7|120",
               timeout=120, interval=1, what="the new quotas in the cell's database")


def test_the_operator_answers_to_nothing_but_its_token_at_the_agent(
        operators: LocalCluster, kube_cell: dict[str, Any]) -> None:
    agent = f"http://cell-{CELL}-{HOME}-agent.{NAMESPACE}.svc.cluster.local:9443"
    status, _ = http_in_operator(operators, ELSEWHERE, "GET", f"{agent}/healthz", {})
    assert status == 200
    status, answer = http_in_operator(operators, ELSEWHERE, "GET", f"{agent}/v1/database", {})
    assert status == 401, answer
    status, answer = http_in_operator(operators, ELSEWHERE, "POST", f"{agent}/v1/database/fence",
                                      {"Authorization": "Bearer not-the-token"}, {})
    assert status == 401, answer
    assert in_operator(operators, HOME, "print('alive')").strip() == "alive"


def cell_serves_from(cluster: LocalCluster, region: str, after_epoch: int) -> Any:
    def check() -> bool:
        status = status_of(cluster, "cell", CELL)
        return (status.get("activeRegion") == region and (status.get("epoch") or 0) > after_epoch
                and bool((status.get("endpoints") or {}).get("api")))
    return check


def standby_streams(cluster: LocalCluster, region: str, *, timeout: float,
                    reconciled_epoch: int | None = None) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def streaming() -> bool:
        seen.clear()
        seen.update(status_of(cluster, "cell", CELL))
        reconciled = (reconciled_epoch is None or
                      (seen.get("lastReconciliation") or {}).get("epoch") == reconciled_epoch)
        return reconciled and any(s.get("region") == region and s.get("streaming")
                                  for s in seen.get("standbys") or [])
    eventually(streaming, timeout=timeout, interval=1,
               what=f"the site in {region} rebuilt and streaming as a standby")
    return dict(seen)


def report(cluster: LocalCluster, epoch: int) -> ReconciliationReport:
    return reconciliation_report(cluster.kubeconfig, CELL, epoch)


def assert_one_key_per_step(target: PodServer, tenant_id: str) -> None:
    """Doubled work would show as one step called under two idempotency keys."""
    keys: dict[tuple[str, int], set[str]] = {}
    for call in target.get():
        body = call["body"]
        if body.get("tenant") == tenant_id:
            keys.setdefault((body["job_id"], body["step"]), set()).add(call["key"])
    assert keys and all(len(seen) == 1 for seen in keys.values())


def test_a_planned_switchover_loses_nothing_and_pauses_writes_briefly(
        operators: LocalCluster, acme: dict[str, Any], namespace: str, target: PodServer) -> None:
    before = standby_streams(operators, STANDBY, timeout=180)
    load = start_load(operators, namespace, "sw", acme["key"])
    try:
        await_acks(load, 20)
        asked = time.time()
        operators.kubectl("annotate", "cell", CELL, f"{SWITCHOVER_TO}={STANDBY}")
        eventually(cell_serves_from(operators, STANDBY, before["epoch"]), timeout=180, interval=0.5,
                   what=f"{STANDBY} to serve {CELL}")
        await_acks(load, 20)
    finally:
        seen = load.stop()
    pause = longest_pause(seen["ack_times"], asked)
    status = standby_streams(operators, HOME, timeout=300)
    print(f"\nswitchover {HOME} -> {STANDBY}: longest write pause {pause:.2f} s; "
          f"{len(seen['acked'])} jobs acknowledged; took over in "
          f"{(status.get('lastTakeover') or {}).get('seconds')} s")
    assert status["activeRegion"] == STANDBY and status["lastTakeover"]["planned"] is True
    surviving = jobs_in(operators, STANDBY, acme["tenantId"])
    assert set(seen["acked"].values()) <= surviving  # nothing acknowledged was lost
    assert report(operators, status["epoch"]).nothing_lost
    assert db_query(operators, HOME, "SELECT pg_is_in_recovery()") == "t"
    assert_one_key_per_step(target, acme["tenantId"])


def test_losing_the_active_regions_node_promotes_the_standby_pod_and_fences_the_old(
        operators: LocalCluster, acme: dict[str, Any], namespace: str, target: PodServer) -> None:
    """The node of the active region (now region-b) killed whole; region-a's standby Pod is
    promoted; when the node returns its Postgres Pod is held, fenced, reported on and
    rebuilt as a standby. Acknowledged jobs lost are exactly the report's."""
    lost, survivor = STANDBY, HOME
    before = standby_streams(operators, survivor, timeout=300)
    assert before["activeRegion"] == lost
    load = start_load(operators, namespace, "loss", acme["key"])
    try:
        await_acks(load, 20)
        killed = time.time()
        operators.kill_node(lost)
        eventually(cell_serves_from(operators, survivor, before["epoch"]), timeout=180,
                   interval=0.5,
                   what=f"{survivor} to take over {CELL}")
        await_acks(load, 10)
        print("\n" + operators.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
    finally:
        seen = load.stop()
    first = min(t for t in seen["ack_times"] if t > killed)
    status = status_of(operators, "cell", CELL)
    print(f"region {lost} node killed: first job accepted through the router of {ELSEWHERE} "
          f"{first - killed:.2f} s later (takeover {status['lastTakeover']['seconds']} s)")
    assert status["lastTakeover"]["fromRegion"] == lost
    assert status["lastTakeover"]["planned"] is False

    operators.start_node(lost)
    assert_rebuilt_and_loss_reported(operators, lost, survivor, status["epoch"], seen, acme,
                                     target)


def assert_rebuilt_and_loss_reported(cluster: LocalCluster, old: str, new: str, epoch: int,
                                     seen: dict[str, Any], tenant: dict[str, Any],
                                     target: PodServer) -> ReconciliationReport:
    """The old primary fenced, reported on and streaming from the new one; acknowledged jobs
    the new primary lacks are exactly the report's; no step done twice under two keys."""
    status = standby_streams(cluster, old, timeout=420, reconciled_epoch=epoch)
    assert status["activeRegion"] == new
    assert db_query(cluster, old, "SELECT pg_is_in_recovery()") == "t"
    found = report(cluster, epoch)
    reported = {job.job_id for job in found.jobs}
    acknowledged = set(seen["acked"].values())
    missing = acknowledged - jobs_in(cluster, new, tenant["tenantId"])
    assert missing == reported & acknowledged, (missing, reported)
    assert status["lastReconciliation"]["jobs"] == len(reported)
    assert_one_key_per_step(target, tenant["tenantId"])
    return found


def test_a_deleted_operator_pod_adopts_its_site_under_the_same_epoch(
        operators: LocalCluster, acme: dict[str, Any], namespace: str) -> None:
    status = status_of(operators, "cell", CELL)
    active = status["activeRegion"]

    def api_pods() -> set[str]:
        return {p["metadata"]["uid"] for p in site_objects_of(operators, "pods")
                if p["metadata"]["labels"]["app.kubernetes.io/component"] == "api"
                and p["metadata"]["labels"]["cellplane.io/region"] == active}

    serving_before = api_pods()
    load = start_load(operators, namespace, "adopt", acme["key"])
    try:
        await_acks(load, 10)
        (pod,) = operator_pods(operators, active)
        deleted = time.time()
        operators.kubectl("delete", "pod", "-n", NAMESPACE, pod["metadata"]["name"],
                          "--grace-period=0", "--force", timeout=120)
        eventually(lambda: any(p["metadata"]["uid"] != pod["metadata"]["uid"] and pod_ready(p)
                               for p in operator_pods(operators, active)),
                   timeout=300, interval=0.5, what="the new operator pod Ready")
        back_after = time.time() - deleted
        await_acks(load, 20)
    finally:
        seen = load.stop()
    pause = longest_pause(seen["ack_times"], deleted)
    print(f"\noperator pod of {active} deleted: Ready again after {back_after:.1f} s, "
          f"longest write pause {pause:.2f} s")
    after = status_of(operators, "cell", CELL)
    # The owner key outlives its holder by 8 to 10 s (the lease left since the last
    # renewal), and a Ready process needs a moment more to adopt (one renewal interval is
    # allowed). A Pod back only after that cannot adopt: the standby region takes over, as
    # it should, and that is checked instead of the adoption, which this run of a busy
    # machine could not exercise.
    renew = PRODUCT_LEASE["renewIntervalSeconds"]
    too_late = PRODUCT_LEASE["durationSeconds"] - 2 * renew
    if after["epoch"] != status["epoch"] and back_after >= too_late:
        # Whichever of the cell's regions acquired the lease first after it ran out.
        assert after["activeRegion"] in (HOME, STANDBY) and after["epoch"] > status["epoch"]
        assert set(seen["acked"].values()) <= jobs_in(operators, after["activeRegion"],
                                                      acme["tenantId"])
        pytest.skip(f"the new operator Pod of {active} was Ready {back_after:.1f} s after the "
                    f"deletion, when its lease had run out: {after['activeRegion']} took the "
                    f"cell at epoch {after['epoch']} (nothing acknowledged lost) and adoption "
                    f"was not exercised")
    assert (after["activeRegion"], after["epoch"]) == (active, status["epoch"])
    # The site was adopted, not restarted: the same API Pods serve.
    assert api_pods() == serving_before
    assert pause < PRODUCT_LEASE["durationSeconds"] + PRODUCT_LEASE["marginSeconds"]


def test_helm_upgrade_of_the_running_install_loses_nothing_and_serves_again(
        operators: LocalCluster, acme: dict[str, Any], namespace: str) -> None:
    """A new label on every Pod template: every operator and router Pod is replaced. The
    cell's Pods are not: they keep serving while their operator restarts, for as long as
    its lease lasts. An operator that takes longer than the lease to come back (the old
    one's shutdown plus the new one's start; ``Recreate``, since its state volume and lock
    are its region's) takes the cell again under the next epoch, and the write pause is
    that restart (printed; not a goal met yet, see docs/kubernetes-driver.md)."""
    status = status_of(operators, "cell", CELL)
    chart_pods = {p["metadata"]["uid"] for region in operators.plan.regions
                  for p in operator_pods(operators, region)}
    load = start_load(operators, namespace, "upgrade", acme["key"])
    try:
        await_acks(load, 10)
        upgraded = time.time()
        install_operators(operators, overrides={"commonLabels": {"cellplane.io/rollout": "2"}})
        await_acks(load, 20)
    finally:
        seen = load.stop()
    pause = longest_pause(seen["ack_times"], upgraded)
    after = status_of(operators, "cell", CELL)
    print(f"\nhelm upgrade: longest write pause {pause:.2f} s; epoch {status['epoch']} -> "
          f"{after['epoch']}")
    now = {p["metadata"]["uid"] for region in operators.plan.regions
           for p in operator_pods(operators, region)}
    assert not now & chart_pods  # every operator Pod was replaced
    # Adopted under the same epoch, or (a restart longer than the lease) taken again under
    # the next one, by whichever of the cell's regions came back first.
    assert (after["activeRegion"], after["epoch"]) == (status["activeRegion"], status["epoch"]) \
        or (after["activeRegion"] in (HOME, STANDBY) and after["epoch"] == status["epoch"] + 1)
    assert set(seen["acked"].values()) <= jobs_in(operators, after["activeRegion"],
                                                  acme["tenantId"])


def test_a_partitioned_active_region_stops_writing_at_its_deadline_and_is_rebuilt(
        operators: LocalCluster, acme: dict[str, Any], namespace: str,
        target: PodServer) -> None:
    """The active region's link cut longer than lease + margin while its Pods keep running."""
    before = status_of(operators, "cell", CELL)
    cut = before["activeRegion"]
    survivor = next(r for r in (HOME, STANDBY) if r != cut)
    standby_streams(operators, survivor, timeout=300)
    load = start_load(operators, namespace, "cut", acme["key"])
    try:
        await_acks(load, 20)
        operators.partition(cut)
        try:
            eventually(cell_serves_from(operators, survivor, before["epoch"]), timeout=180,
                       interval=0.5, what=f"{survivor} to take over {CELL}")
            await_acks(load, 10)
        finally:
            operators.heal(cut)
    finally:
        seen = load.stop()
    status = status_of(operators, "cell", CELL)
    assert status["lastTakeover"]["fromRegion"] == cut
    found = assert_rebuilt_and_loss_reported(operators, cut, survivor, status["epoch"], seen,
                                             acme, target)
    # Nothing the isolated primary wrote after the deadline its lease gave it.
    if found.last_old_write_at is not None:
        assert found.old_lease_deadline is not None
        assert found.last_old_write_at <= found.old_lease_deadline


def objects_of(cluster: LocalCluster, cell: str) -> list[str]:
    """Every workload, Service, claim and Pod of ``cell``'s sites, as ``Kind/name``."""
    found = cluster.get_json("statefulsets,deployments,services,persistentvolumeclaims,pods",
                             "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={cell}")
    return [f"{o['kind']}/{o['metadata']['name']}" for o in found["items"]]


def test_deleting_a_cell_removes_its_workloads_and_its_claims_by_policy(
        operators: LocalCluster) -> None:
    name = "kube-c1"
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
        "spec": {"region": ELSEWHERE, "tier": "shared",
                 "capacity": {"tenants": 1, "workerSlots": 2}, "lease": PRODUCT_LEASE,
                 "driver": {"name": "kubernetes", "claimPolicy": "Delete"}}}])
    await_phase(operators, "cell", name, "Ready", timeout=600)
    assert f"PersistentVolumeClaim/data-cell-{name}-{ELSEWHERE}-db-0" in objects_of(operators, name)
    operators.kubectl("delete", "cell", name, "--wait=true", "--timeout=120s", timeout=150)
    eventually(lambda: not objects_of(operators, name), timeout=180, interval=1,
               what=f"every object of {name} gone")


def test_a_cell_deleted_while_a_region_is_down_is_collected_there_when_it_returns(
        operators: LocalCluster, kube_cell: dict[str, Any]) -> None:
    """The down region is the module cell's standby region, so the module cell keeps
    serving; its standby is rebuilt afterwards for the tests that follow."""
    name = "kube-c2"
    down = next(r for r in (HOME, STANDBY)
                if r != status_of(operators, "cell", CELL)["activeRegion"])
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": name},
        "spec": {"region": ELSEWHERE, "standbyRegions": [down], "tier": "shared",
                 "capacity": {"tenants": 1, "workerSlots": 2}, "lease": PRODUCT_LEASE,
                 "driver": {"name": "kubernetes", "claimPolicy": "Delete"}}}])
    await_phase(operators, "cell", name, "Ready", timeout=600)
    on_down_node = f"Pod/cell-{name}-{down}-db-0"
    eventually(lambda: on_down_node in objects_of(operators, name), timeout=180, interval=1,
               what=f"{name}'s standby Pod in {down}")
    operators.kill_node(down)
    try:
        operators.kubectl("delete", "cell", name, "--wait=true", "--timeout=120s", timeout=150)
        # The rest goes at once (owner references); what ran on the lost node waits for it.
        eventually(lambda: all(f"-{down}-" in o for o in objects_of(operators, name)),
                   timeout=180, interval=1, what=f"every object of {name} outside {down} gone")
        assert on_down_node in objects_of(operators, name)
    finally:
        operators.start_node(down)
    eventually(lambda: not objects_of(operators, name), timeout=300, interval=2,
               what=f"{name}'s objects in {down} collected after its node returned")
    standby_streams(operators, down, timeout=300)


def test_a_tenant_moves_between_two_kubernetes_cells_under_load_within_its_pause(
        operators: LocalCluster, acme: dict[str, Any], namespace: str,
        target: PodServer) -> None:
    """Last: the tenant leaves the module's cell."""
    destination = MOVE_DESTINATION
    operators.apply([{
        "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": destination},
        "spec": {"region": STANDBY, "tier": "shared",
                 "capacity": {"tenants": 5, "workerSlots": 10}, "lease": PRODUCT_LEASE,
                 "driver": {"name": "kubernetes", "allowPrivateTargets": True}}}])
    await_phase(operators, "cell", destination, "Ready", timeout=600)
    budget = 5.0
    load = start_load(operators, namespace, "move", acme["key"])
    try:
        await_acks(load, 20)
        moved = subprocess.run(
            [sys.executable, "-m", "cellplane_operator", "move", "acme", "--to", destination,
             "-n", namespace, "--max-write-pause", str(budget), "--wait", "--timeout", "300",
             "--kubeconfig", str(operators.kubeconfig)],
            capture_output=True, text=True, timeout=360)
        await_acks(load, 20)
    finally:
        seen = load.stop()
    assert moved.returncode == 0, moved.stderr
    status = status_of(operators, "tenantmove", moved.stdout.strip(), namespace)
    assert status["phase"] == "Completed", status
    pause = float(status["progress"]["pauseSeconds"])
    print(f"\nmove {CELL} -> {destination} under load: write pause {pause:.2f} s "
          f"(budget {budget:g} s)")
    assert 0 < pause <= budget, status["progress"]
    tenant = await_phase(operators, "tenant", "acme", "Ready", namespace=namespace)
    assert tenant["cell"] == destination
    tenant_id = acme["tenantId"]
    source = status_of(operators, "cell", CELL)["activeRegion"]

    def rows(cell: str, region: str, sql: str) -> list[str]:
        found = site_sql(operators, NAMESPACE, cell, region, sql)
        assert not found.startswith("failed"), found
        return found.split()

    # Every acknowledged job exists once, under its key, in the destination (the move
    # copies every idempotency key; finished jobs stay in the source as history).
    keys = dict(row.split("|", 1) for row in rows(
        destination, STANDBY,
        f"SELECT key, job_id FROM idempotency_keys WHERE tenant_id = '{tenant_id}'"))
    assert {key: keys.get(key) for key in seen["acked"]} == seen["acked"]
    acknowledged = set(seen["acked"].values())
    succeeded = f"SELECT job_id FROM jobs WHERE tenant_id = '{tenant_id}' AND status = 'succeeded'"
    eventually(lambda: acknowledged <= {*rows(destination, STANDBY, succeeded),
                                        *rows(CELL, source, succeeded)},
               timeout=180, interval=2, what="every acknowledged job to succeed in one cell")
    assert_one_key_per_step(target, tenant_id)
