"""Real kube-apiserver: the generated CRDs refuse invalid specs, naming the field, and
fill in the same defaults as the v1alpha1 models."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from cellplane_cells.domain.plans import PLAN_CEILINGS, Plan
from cellplane_operator.api import crdgen, v1alpha1
from cellplane_operator.api.base import ApiModel
from cellplane_operator.api.quota_rules import QUOTA_FIELDS
from cellplane_operator.kube import KubeConfig
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.runtime.specs import CellSettings, TenantSettings

NAMESPACE = "default"
KINDS: dict[str, tuple[str, bool]] = {  # kind -> (resource, namespaced)
    "Cell": ("cell", False), "Tenant": ("tenant", True), "TenantMove": ("tenantmove", True)}


def cell_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"region": "region-a", "tier": "shared",
                            "capacity": {"tenants": 10, "workerSlots": 40}}
    spec.update(overrides)
    return spec


def kubernetes_driver(**overrides: Any) -> dict[str, Any]:
    """spec.driver of a kubernetes-driver cell, every default written out (as stored)."""
    driver: dict[str, Any] = {"name": "kubernetes", "workerProcesses": 1,
                              "allowPrivateTargets": False, "storage": {"size": "1Gi"},
                              "apiReplicas": 1, "workerReplicas": 1, "claimPolicy": "Retain"}
    driver.update(overrides)
    return driver


def tenant_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"plan": "pro", "homeRegion": "region-a"}
    spec.update(overrides)
    return spec


def move_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"tenant": "acme", "targetCell": "shared-b1"}
    spec.update(overrides)
    return spec


def without(spec: dict[str, Any], field: str) -> dict[str, Any]:
    return {key: value for key, value in spec.items() if key != field}


def manifest(kind: str, name: str, spec: dict[str, Any]) -> str:
    metadata = {"name": name}
    if KINDS[kind][1]:
        metadata["namespace"] = NAMESPACE
    return json.dumps({"apiVersion": v1alpha1.API_VERSION, "kind": kind,
                       "metadata": metadata, "spec": spec})


def apply(kube: LocalControlPlane, kind: str, name: str, spec: dict[str, Any],
          *extra: str) -> tuple[int, str]:
    result = kube.kubectl("apply", *extra, "-f", "-", input_text=manifest(kind, name, spec),
                          check=False)
    return result.returncode, result.stderr


def assert_refused(kube: LocalControlPlane, kind: str, spec: dict[str, Any],
                   expected: tuple[str, ...], *, name: str = "refused") -> None:
    code, stderr = apply(kube, kind, name, spec, "--dry-run=server")
    assert code != 0, f"{kind} {spec} was accepted"
    for fragment in expected:
        assert fragment in stderr, f"{fragment!r} not in: {stderr}"


def get_spec(kube: LocalControlPlane, kind: str, name: str) -> dict[str, Any]:
    resource, namespaced = KINDS[kind]
    where = ["-n", NAMESPACE] if namespaced else []
    spec = json.loads(kube.kubectl("get", resource, name, *where, "-o", "json").stdout)["spec"]
    assert isinstance(spec, dict)
    return spec


# ----------------------------------------------------------------- refusals

FLOORS_MESSAGE = ("capacity.priorityFloors must add up to at most each worker's slots: "
                  "capacity.workerSlots spread over the workers (driver.workerProcesses; "
                  "driver.workerReplicas for the kubernetes driver), rounded up")
TOO_MANY_REGIONS = ["region-b", "region-c", "region-d", "region-e", "region-f"]

CELL_REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "missing-region": (without(cell_spec(), "region"), ("spec.region: Required value",)),
    "missing-capacity": (without(cell_spec(), "capacity"), ("spec.capacity: Required value",)),
    "bad-tier": (cell_spec(tier="premium"), ('spec.tier: Unsupported value: "premium"',)),
    "region-not-a-label": (cell_spec(region="Region A"), ("spec.region: Invalid value",)),
    "region-too-long": (cell_spec(region="r" * 64), ("spec.region: Too long",)),
    "no-tenants": (cell_spec(capacity={"tenants": 0, "workerSlots": 4}),
                   ("spec.capacity.tenants: Invalid value: 0", "greater than or equal to 1")),
    "too-many-slots": (cell_spec(capacity={"tenants": 1, "workerSlots": 100001}),
                       ("spec.capacity.workerSlots: Invalid value: 100001",
                        "less than or equal to 100000")),
    "tenants-above-slots": (cell_spec(capacity={"tenants": 8, "workerSlots": 4}),
                            ("spec.capacity: Invalid value", "capacity.tenants must not exceed "
                             "capacity.workerSlots (each tenant needs a slot)")),
    "dedicated-for-many": (cell_spec(tier="dedicated"),
                           ("spec: Invalid value", "a dedicated cell hosts exactly one tenant "
                            "(capacity.tenants must be 1)")),
    "standby-in-own-region": (cell_spec(standbyRegions=["region-b", "region-a"]),
                              ("spec.standbyRegions: Invalid value",
                               "standbyRegions must not include the cell's own region")),
    "too-many-standbys": (cell_spec(standbyRegions=TOO_MANY_REGIONS),
                          ("spec.standbyRegions: Too many: 5: must have at most 4 items",)),
    "standby-twice": (cell_spec(standbyRegions=["region-b", "region-b"]),
                      ('spec.standbyRegions[1]: Duplicate value: "region-b"',)),
    "standby-not-a-label": (cell_spec(standbyRegions=["Region_B"]),
                            ("spec.standbyRegions[0]: Invalid value",)),
    "failover-delay": (cell_spec(failover={"failoverDelaySeconds": 3601}),
                       ("spec.failover.failoverDelaySeconds: Invalid value: 3601",)),
    "failover-lag": (cell_spec(failover={"maxStandbyLagSeconds": -1}),
                     ("spec.failover.maxStandbyLagSeconds: Invalid value: -1",)),
    "renewal-integer-zero": (cell_spec(lease={"renewIntervalSeconds": 0}),
                             ("spec.lease.renewIntervalSeconds: Invalid value",
                              "must be greater than or equal to 0.1")),
    "margin-integer-zero": (cell_spec(lease={"marginSeconds": 0}),
                            ("spec.lease.marginSeconds: Invalid value",
                             "must be greater than or equal to 0.1")),
    "lease-too-short": (cell_spec(lease={"durationSeconds": 1}),
                        ("spec.lease.durationSeconds: Invalid value: 1",)),
    "lease-margin": (cell_spec(lease={"durationSeconds": 5, "marginSeconds": 5}),
                     ("spec.lease: Invalid value",
                      "lease.marginSeconds must be below lease.durationSeconds")),
    "lease-renewals": (cell_spec(lease={"durationSeconds": 10, "renewIntervalSeconds": 4.5,
                                        "marginSeconds": 2}),
                       ("spec.lease: Invalid value", "two lease.renewIntervalSeconds must fit in "
                        "durationSeconds - marginSeconds, so one lost renewal does not end "
                        "ownership")),
    "driver-name": (cell_spec(driver={"name": "docker"}),
                    ('spec.driver.name: Unsupported value: "docker"',)),
    "driver-api-replicas": (cell_spec(driver={"apiReplicas": 11}),
                            ("spec.driver.apiReplicas: Invalid value: 11",)),
    "driver-worker-replicas": (cell_spec(driver={"workerReplicas": 0}),
                               ("spec.driver.workerReplicas: Invalid value: 0",)),
    "driver-claim-policy": (cell_spec(driver={"claimPolicy": "Orphan"}),
                            ('spec.driver.claimPolicy: Unsupported value: "Orphan"',)),
    "driver-storage-size": (cell_spec(driver={"storage": {"size": "1 GB"}}),
                            ("spec.driver.storage.size: Invalid value",)),
    "driver-storage-zero": (cell_spec(driver={"storage": {"size": "0"}}),
                            ("spec.driver.storage.size: Invalid value",
                             "storage.size must be more than zero")),
    "driver-storage-class": (cell_spec(driver={"storage": {"className": "Fast_SSD"}}),
                             ("spec.driver.storage.className: Invalid value",)),
    "driver-resources": (cell_spec(driver={"resources": {"api": {"limits": {"memory": "lots"}}}}),
                         ("spec.driver.resources.api.limits.memory: Invalid value",)),
    "driver-processes": (cell_spec(driver={"workerProcesses": 17}),
                         ("spec.driver.workerProcesses: Invalid value: 17",)),
    "draining-not-bool": (cell_spec(draining="yes"),
                          ('spec.draining: Invalid value: "string"',)),
    "floor-negative": (cell_spec(capacity={"tenants": 1, "workerSlots": 10,
                                           "priorityFloors": {"low": -1}}),
                       ("spec.capacity.priorityFloors.low: Invalid value: -1",)),
    # 40 slots over one worker: 41 is one too many.
    "floors-above-the-slots": (
        cell_spec(capacity={"tenants": 10, "workerSlots": 40,
                            "priorityFloors": {"critical": 20, "high": 20, "low": 1}}),
        ("spec.capacity.priorityFloors: Invalid value", FLOORS_MESSAGE)),
    # Floors are per worker: 40 slots over 3 processes are 14 each (rounded up).
    "floors-above-a-workers-slots": (
        cell_spec(capacity={"tenants": 10, "workerSlots": 40,
                            "priorityFloors": {"critical": 10, "default": 5}},
                  driver={"workerProcesses": 3}),
        ("spec.capacity.priorityFloors: Invalid value", FLOORS_MESSAGE)),
    # The kubernetes driver's workers are its replicas (workerProcesses is not its count).
    "floors-above-a-pods-slots": (
        cell_spec(capacity={"tenants": 10, "workerSlots": 40, "priorityFloors": {"high": 11}},
                  driver=kubernetes_driver(workerReplicas=4, workerProcesses=1)),
        ("spec.capacity.priorityFloors: Invalid value", FLOORS_MESSAGE)),
}


@pytest.mark.parametrize(("spec", "expected"), CELL_REFUSED.values(), ids=CELL_REFUSED.keys())
def test_invalid_cell_is_refused(kube: LocalControlPlane, spec: dict[str, Any],
                                 expected: tuple[str, ...]) -> None:
    assert_refused(kube, "Cell", spec, expected)


TARGET = {"name": "api", "url": "https://api.example"}

TENANT_REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "missing-plan": (without(tenant_spec(), "plan"), ("spec.plan: Required value",)),
    "missing-home-region": (without(tenant_spec(), "homeRegion"),
                            ("spec.homeRegion: Required value",)),
    "bad-plan": (tenant_spec(plan="gold"), ('spec.plan: Unsupported value: "gold"',)),
    "bad-isolation": (tenant_spec(isolation="solo"),
                      ('spec.isolation: Unsupported value: "solo"',)),
    "bad-region-policy": (tenant_spec(regionPolicy="MULTI"),
                          ('spec.regionPolicy: Unsupported value: "MULTI"',)),
    "bad-deletion-policy": (tenant_spec(deletionPolicy="Orphan"),
                            ('spec.deletionPolicy: Unsupported value: "Orphan"',)),
    "negative-running": (tenant_spec(quotas={"maxRunningJobs": -1}),
                         ("spec.quotas.maxRunningJobs: Invalid value: -1",)),
    "zero-rate": (tenant_spec(quotas={"jobsPerSecond": 0}),
                  ("spec.quotas.jobsPerSecond: Invalid value: 0",
                   "greater than or equal to 0.001")),
    "rate-under-the-cells-floor": (tenant_spec(quotas={"jobsPerSecond": 1e-10}),
                                   ("spec.quotas.jobsPerSecond: Invalid value",
                                    "greater than or equal to 0.001")),
    "zero-burst": (tenant_spec(quotas={"burst": 0}), ("spec.quotas.burst: Invalid value: 0",)),
    "negative-strict": (tenant_spec(quotas={"strictSchedules": -1}),
                        ("spec.quotas.strictSchedules: Invalid value: -1",)),
    "free-strict-above-ceiling": (tenant_spec(plan="free", quotas={"strictSchedules": 1}),
                                  ("spec.quotas.strictSchedules: Invalid value",
                                   "quotas.strictSchedules must be at most 0 on the free plan")),
    "negative-spend": (tenant_spec(plan="enterprise", quotas={"dailySpendLimit": -1}),
                       ("spec.quotas.dailySpendLimit: Invalid value: -1",)),
    "free-running-above-ceiling": (tenant_spec(plan="free", quotas={"maxRunningJobs": 3}),
                                   ("spec.quotas.maxRunningJobs: Invalid value",
                                    "quotas.maxRunningJobs must be at most 2 on the free plan")),
    "spend-limit-on-pro": (tenant_spec(quotas={"dailySpendLimit": 5}),
                           ("spec.quotas.dailySpendLimit: Invalid value",
                            "quotas.dailySpendLimit applies to the enterprise plan only")),
    "spend-limit-on-free": (tenant_spec(plan="free", quotas={"dailySpendLimit": 0}),
                            ("quotas.dailySpendLimit applies to the enterprise plan only",)),
    "dedicated-pinned": (tenant_spec(isolation="dedicated", cell="shared-a1"),
                         ("spec.cell: Invalid value", "a dedicated tenant gets a cell made for "
                          "it; spec.cell pins shared tenants only")),
    "cell-not-a-label": (tenant_spec(cell="Shared A1"), ("spec.cell: Invalid value",)),
    "too-many-targets": (tenant_spec(targets=[{"name": f"t{i}", "url": "https://x.example"}
                                              for i in range(33)]),
                         ("spec.targets: Too many: 33: must have at most 32 items",)),
    "target-twice": (tenant_spec(targets=[TARGET, TARGET]),
                     ("spec.targets[1]: Duplicate value",)),
    "target-without-url": (tenant_spec(targets=[{"name": "api"}]),
                           ("spec.targets[0].url: Required value",)),
    "target-not-http": (tenant_spec(targets=[{"name": "api", "url": "ftp://x.example"}]),
                        ("spec.targets[0].url: Invalid value",)),
    "target-url-too-long": (tenant_spec(targets=[{"name": "api",
                                                  "url": "https://" + "x" * 2041}]),
                            ("spec.targets[0].url: Too long",)),
    "too-many-webhooks": (tenant_spec(webhooks=[{"url": f"https://h{i}.example"}
                                                for i in range(9)]),
                          ("spec.webhooks: Too many: 9: must have at most 8 items",)),
    "webhook-concurrency": (tenant_spec(webhooks=[{"url": "https://h.example",
                                                   "maxConcurrency": 101}]),
                            ("spec.webhooks[0].maxConcurrency: Invalid value: 101",)),
    "webhook-not-http": (tenant_spec(webhooks=[{"url": "hooks.example"}]),
                         ("spec.webhooks[0].url: Invalid value",)),
}


def test_names_that_derived_objects_cannot_carry_are_refused(kube: LocalControlPlane) -> None:
    """A dotted Cell could be placed into but never named in spec.cell; a 64-character
    Tenant broke its Secret's label and was then retried for ever in silence."""
    assert_refused(kube, "Cell", cell_spec(), ("a Cell's name must be a DNS label",),
                   name="shared.a1")
    assert_refused(kube, "Tenant", tenant_spec(), ("a Tenant's name must be a DNS label",),
                   name="t" * 64)
    assert_refused(kube, "Tenant", tenant_spec(), ("a Tenant's name must be a DNS label",),
                   name="acme.prod")
    assert apply(kube, "Tenant", "t" * 63, tenant_spec(), "--dry-run=server")[0] == 0
    assert apply(kube, "Cell", "c" * 63, cell_spec(), "--dry-run=server")[0] == 0


SITE_NAMES_TOO_LONG = ("a kubernetes-driver Cell's name and each of its regions (spec.region, "
                       "every spec.standbyRegions) may have at most 43 characters together")


def test_kubernetes_cells_whose_site_names_cannot_fit_are_refused(kube: LocalControlPlane) -> None:
    """cell-<cell>-<region>-db must leave room for the StatefulSet's revision-hash label
    (domain/site_names.py): 43 characters for the cell's and a region's names together."""
    kubernetes = {"name": "kubernetes"}
    fits, too_long = "c" * (43 - len("region-a")), "c" * (44 - len("region-a"))
    code, stderr = apply(kube, "Cell", fits, cell_spec(driver=kubernetes), "--dry-run=server")
    assert code == 0, stderr
    assert_refused(kube, "Cell", cell_spec(driver=kubernetes), (SITE_NAMES_TOO_LONG,),
                   name=too_long)
    # Each standby region counts as well.
    assert_refused(kube, "Cell", cell_spec(driver=kubernetes, standbyRegions=["region-bb"]),
                   (SITE_NAMES_TOO_LONG,), name=fits)
    # A local cell's names are not limited by it.
    code, stderr = apply(kube, "Cell", too_long, cell_spec(standbyRegions=["region-bb"]),
                         "--dry-run=server")
    assert code == 0, stderr


@pytest.mark.parametrize(("spec", "expected"), TENANT_REFUSED.values(), ids=TENANT_REFUSED.keys())
def test_invalid_tenant_is_refused(kube: LocalControlPlane, spec: dict[str, Any],
                                   expected: tuple[str, ...]) -> None:
    assert_refused(kube, "Tenant", spec, expected)


def _shown(number: int | float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)


CEILINGS = [(plan.value, field, getattr(limits, attribute))
            for plan, limits in PLAN_CEILINGS.items()
            for field, attribute in (("maxRunningJobs", "max_running_jobs"),
                                     ("jobsPerSecond", "jobs_per_second"), ("burst", "burst"),
                                     ("dailySpendLimit", "daily_spend_limit"),
                                     ("strictSchedules", "strict_schedules"))
            if getattr(limits, attribute) is not None]


@pytest.mark.parametrize(("plan", "field", "ceiling"), CEILINGS,
                         ids=[f"{plan}-{field}" for plan, field, _ in CEILINGS])
def test_quota_ceilings_come_from_the_plan_table(kube: LocalControlPlane, plan: str, field: str,
                                                 ceiling: int | float) -> None:
    at_ceiling = tenant_spec(plan=plan, quotas={field: ceiling})
    code, stderr = apply(kube, "Tenant", "at-ceiling", at_ceiling, "--dry-run=server")
    assert code == 0, stderr
    above = ceiling + (1 if isinstance(ceiling, int) else 0.5)
    assert_refused(kube, "Tenant", tenant_spec(plan=plan, quotas={field: above}),
                   (f"spec.quotas.{field}: Invalid value",
                    f"quotas.{field} must be at most {_shown(ceiling)} on the {plan} plan"))


MOVE_REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "missing-tenant": (without(move_spec(), "tenant"), ("spec.tenant: Required value",)),
    "no-target": (without(move_spec(), "targetCell"),
                  ("spec: Invalid value", "set exactly one of targetCell and targetRegion "
                   "(any shared cell in that region)")),
    "two-targets": (move_spec(targetRegion="region-b"),
                    ("set exactly one of targetCell and targetRegion",)),
    "tenant-not-a-label": (move_spec(tenant="Acme Corp"), ("spec.tenant: Invalid value",)),
    "pause-too-short": (move_spec(maxWritePauseSeconds=0.05),
                        ("spec.maxWritePauseSeconds: Invalid value: 0.05",)),
    "pause-integer-zero": (move_spec(maxWritePauseSeconds=0),
                           ("spec.maxWritePauseSeconds: Invalid value",
                            "must be greater than or equal to 0.1")),
    "pause-too-long": (move_spec(maxWritePauseSeconds=61),
                       ("spec.maxWritePauseSeconds: Invalid value: 61",)),
    "retention-negative": (move_spec(retainSourceForSeconds=-1),
                           ("spec.retainSourceForSeconds: Invalid value: -1",)),
    "retention-too-long": (move_spec(retainSourceForSeconds=2592001),
                           ("spec.retainSourceForSeconds: Invalid value: 2592001",)),
}


@pytest.mark.parametrize(("spec", "expected"), MOVE_REFUSED.values(), ids=MOVE_REFUSED.keys())
def test_invalid_tenant_move_is_refused(kube: LocalControlPlane, spec: dict[str, Any],
                                        expected: tuple[str, ...]) -> None:
    assert_refused(kube, "TenantMove", spec, expected)


# ------------------------------------------------------------ immutability

CHANGES: dict[str, tuple[str, dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "cell-region": ("Cell", cell_spec(), cell_spec(region="region-b"),
                    ("spec.region: Invalid value",
                     "region is immutable; create a new cell and move tenants to it")),
    "cell-driver-name": ("Cell", cell_spec(), cell_spec(driver=kubernetes_driver()),
                         ("spec.driver.name: Invalid value", "driver.name is immutable")),
    "cell-storage-class-set-later": (
        "Cell", cell_spec(driver=kubernetes_driver()),
        cell_spec(driver=kubernetes_driver(storage={"className": "fast", "size": "1Gi"})),
        ("spec.driver.storage.className: Invalid value",
         "storage.className is immutable: a claim cannot change its class")),
    "cell-storage-class-changed": (
        "Cell", cell_spec(driver=kubernetes_driver(storage={"className": "fast", "size": "1Gi"})),
        cell_spec(driver=kubernetes_driver(storage={"className": "slow", "size": "1Gi"})),
        ("storage.className is immutable",)),
    "cell-storage-shrinks": (
        "Cell", cell_spec(driver=kubernetes_driver(storage={"size": "2Gi"})),
        cell_spec(driver=kubernetes_driver(storage={"size": "2000Mi"})),
        ("spec.driver.storage.size: Invalid value",
         "storage.size may only grow: a claim cannot shrink")),
    # Not immutable, but refused all the same: more workers leave each too few slots for
    # the floors the cell keeps.
    "cell-workers-too-many-for-the-floors": (
        "Cell", cell_spec(capacity={"tenants": 10, "workerSlots": 40, "priorityFloors": {
            "critical": 10, "high": 0, "default": 0, "low": 0}}),
        cell_spec(capacity={"tenants": 10, "workerSlots": 40, "priorityFloors": {
            "critical": 10, "high": 0, "default": 0, "low": 0}},
            driver={"workerProcesses": 8}),
        ("spec.capacity.priorityFloors: Invalid value", FLOORS_MESSAGE)),
    "tenant-isolation": ("Tenant", tenant_spec(), tenant_spec(isolation="dedicated"),
                         ("spec.isolation: Invalid value",
                          "isolation is immutable; move the tenant to a new cell instead")),
    "tenant-home-region": ("Tenant", tenant_spec(), tenant_spec(homeRegion="region-b"),
                           ("spec.homeRegion: Invalid value",
                            "homeRegion is immutable; use a TenantMove")),
    "tenant-cell-pinned-later": ("Tenant", tenant_spec(), tenant_spec(cell="shared-a1"),
                                 ("spec.cell: Invalid value", "spec.cell is immutable; use a "
                                  "TenantMove to change a tenant's cell")),
    "tenant-cell-changed": ("Tenant", tenant_spec(cell="shared-a1"),
                            tenant_spec(cell="shared-a2"), ("spec.cell is immutable",)),
    "tenant-cell-unpinned": ("Tenant", tenant_spec(cell="shared-a1"), tenant_spec(),
                             ("spec.cell is immutable",)),
    "move-tenant": ("TenantMove", move_spec(), move_spec(tenant="other"),
                    ("spec.tenant: Invalid value", "tenant is immutable")),
    "move-target-cell": ("TenantMove", move_spec(), move_spec(targetCell="shared-b2"),
                         ("spec.targetCell: Invalid value", "targetCell is immutable")),
    "move-target-switched": ("TenantMove", move_spec(),
                             without(move_spec(targetRegion="region-b"), "targetCell"),
                             ("targetCell is immutable", "targetRegion is immutable")),
    "move-abort-undone": ("TenantMove", move_spec(abort=True), move_spec(abort=False),
                          ("spec.abort: Invalid value", "abort cannot be undone")),
}


@pytest.mark.parametrize(("kind", "before", "after", "expected"), CHANGES.values(),
                         ids=CHANGES.keys())
def test_immutable_fields_cannot_change(kube: LocalControlPlane, request: pytest.FixtureRequest,
                                        kind: str, before: dict[str, Any],
                                        after: dict[str, Any], expected: tuple[str, ...]) -> None:
    name = request.node.callspec.id
    code, stderr = apply(kube, kind, name, before)
    assert code == 0, stderr
    code, stderr = apply(kube, kind, name, after)
    assert code != 0, f"{kind} {name}: the change was accepted"
    for fragment in expected:
        assert fragment in stderr, f"{fragment!r} not in: {stderr}"
    stored = get_spec(kube, kind, name)
    assert {k: stored.get(k) for k in before} == before


ALLOWED_CHANGES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "cell-grows": ("Cell", cell_spec(), cell_spec(capacity={"tenants": 20, "workerSlots": 80},
                                                  standbyRegions=["region-b"])),
    "cell-storage-grows": (
        "Cell", cell_spec(driver=kubernetes_driver(storage={"className": "fast", "size": "1Gi"})),
        cell_spec(driver=kubernetes_driver(storage={"className": "fast", "size": "1.5Gi"},
                                           apiReplicas=3, workerReplicas=2,
                                           claimPolicy="Delete"))),
    "cell-floors-change": (
        "Cell", cell_spec(capacity={"tenants": 10, "workerSlots": 40,
                                    "priorityFloors": {"critical": 4, "high": 4, "default": 4,
                                                       "low": 28}}),
        cell_spec(capacity={"tenants": 10, "workerSlots": 40,
                            "priorityFloors": {"critical": 8, "high": 0, "default": 0,
                                               "low": 0}})),
    "tenant-pinned-changes-plan": ("Tenant", tenant_spec(cell="shared-a1"),
                                   tenant_spec(cell="shared-a1", plan="enterprise")),
    "move-aborted": ("TenantMove", move_spec(), move_spec(abort=True)),
}


@pytest.mark.parametrize(("kind", "before", "after"), ALLOWED_CHANGES.values(),
                         ids=ALLOWED_CHANGES.keys())
def test_mutable_fields_can_change(kube: LocalControlPlane, request: pytest.FixtureRequest,
                                   kind: str, before: dict[str, Any],
                                   after: dict[str, Any]) -> None:
    name = request.node.callspec.id
    for spec in (before, after):
        code, stderr = apply(kube, kind, name, spec)
        assert code == 0, stderr
    stored = get_spec(kube, kind, name)
    assert {k: stored.get(k) for k in after} == after


# ---------------------------------------------------------------- defaults

DEFAULTED: dict[str, tuple[str, type[ApiModel], dict[str, Any], dict[str, Any]]] = {
    "cell": ("Cell", v1alpha1.CellSpec, cell_spec(), {
        "standbyRegions": [], "draining": False,
        "failover": {"automatic": True, "failoverDelaySeconds": 0, "maxStandbyLagSeconds": 30},
        "lease": {"durationSeconds": 10, "renewIntervalSeconds": 2, "marginSeconds": 2},
        "driver": {"name": "local", "workerProcesses": 1, "allowPrivateTargets": False,
                   "storage": {"size": "1Gi"}, "apiReplicas": 1, "workerReplicas": 1,
                   "claimPolicy": "Retain"}}),
    "cell-partial": ("Cell", v1alpha1.CellSpec,
                     cell_spec(failover={"automatic": False}, driver={"workerProcesses": 4}), {
        "failover": {"automatic": False, "failoverDelaySeconds": 0, "maxStandbyLagSeconds": 30},
        "driver": {"name": "local", "workerProcesses": 4, "allowPrivateTargets": False,
                   "storage": {"size": "1Gi"}, "apiReplicas": 1, "workerReplicas": 1,
                   "claimPolicy": "Retain"}}),
    "cell-floors": ("Cell", v1alpha1.CellSpec,
                    cell_spec(capacity={"tenants": 10, "workerSlots": 40,
                                        "priorityFloors": {"critical": 4}}),
                    {"capacity": {"tenants": 10, "workerSlots": 40, "priorityFloors": {
                        "critical": 4, "high": 0, "default": 0, "low": 0}}}),
    "cell-kubernetes": ("Cell", v1alpha1.CellSpec,
                        cell_spec(driver={"name": "kubernetes",
                                          "storage": {"className": "fast"},
                                          "resources": {"database": {"limits": {"cpu": "1"}}}}),
                        {"driver": kubernetes_driver(
                            storage={"className": "fast", "size": "1Gi"},
                            resources={"database": {"limits": {"cpu": "1"}}})}),
    "tenant": ("Tenant", v1alpha1.TenantSpec,
               tenant_spec(webhooks=[{"url": "https://hooks.example/jobs"}]), {
        "isolation": "shared", "regionPolicy": "SINGLE_REGION", "deletionPolicy": "Retain",
        "targets": [], "webhooks": [{"url": "https://hooks.example/jobs", "maxConcurrency": 4}]}),
    "tenantmove": ("TenantMove", v1alpha1.TenantMoveSpec, move_spec(), {
        "maxWritePauseSeconds": 2, "abort": False, "retainSourceForSeconds": 86400}),
}


@pytest.mark.parametrize(("kind", "model", "spec", "defaults"), DEFAULTED.values(),
                         ids=DEFAULTED.keys())
def test_valid_object_gets_the_models_defaults(kube: LocalControlPlane,
                                               request: pytest.FixtureRequest, kind: str,
                                               model: type[ApiModel], spec: dict[str, Any],
                                               defaults: dict[str, Any]) -> None:
    name = f"defaulted-{request.node.callspec.id}"
    code, stderr = apply(kube, kind, name, spec)
    assert code == 0, stderr
    stored = get_spec(kube, kind, name)
    assert {key: stored[key] for key in defaults} == defaults
    # The apiserver and the model agree on every default, not just the ones listed.
    assert stored == model.model_validate(spec).model_dump(by_alias=True, mode="json",
                                                           exclude_none=True)
    assert model.model_validate(stored) == model.model_validate(spec)


# ---------------------------------------------------------- names, columns

def test_short_names_category_and_columns(kube: LocalControlPlane) -> None:
    assert apply(kube, "Tenant", "listed", tenant_spec())[0] == 0
    assert apply(kube, "TenantMove", "listed", move_spec())[0] == 0
    tenants = kube.kubectl("get", "tn", "listed", "-n", NAMESPACE, "-o", "wide").stdout
    assert tenants.split("\n")[0].split() == ["NAME", "PLAN", "ISOLATION", "CELL", "EPOCH",
                                              "PHASE", "AGE", "REGION"]
    moves = kube.kubectl("get", "tmv", "listed", "-n", NAMESPACE).stdout
    assert moves.split("\n")[0].split() == ["NAME", "TENANT", "SOURCE", "TARGET", "PHASE", "COPIED",
                                             "PAUSE", "AGE"]
    cells = kube.kubectl("get", "cl", "-o", "name").stdout
    assert cells.startswith("cell.cellplane.io/") or cells == ""
    everything = kube.kubectl("get", "cellplane", "-A", "-o", "name").stdout.split()
    assert "tenant.cellplane.io/listed" in everything
    assert "tenantmove.cellplane.io/listed" in everything


# ------------------------------------------------------- every numeric bound

# Objects that every cross-field rule leaves room in, so a swept value meets only
# its own bounds: one tenant in 100000 slots, a 300 s lease with 0.1 s renewals and
# margin, the enterprise plan (every quota applies) with nothing overridden.
SWEEP_BASES: dict[str, dict[str, Any]] = {
    "Cell": {"spec": cell_spec(capacity={"tenants": 1, "workerSlots": 100000},
                               lease={"durationSeconds": 300, "renewIntervalSeconds": 0.1,
                                      "marginSeconds": 0.1}),
             "status": {"standbys": [{"region": "region-b"}],
                        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving",
                                        "message": "", "lastTransitionTime":
                                        "2026-01-01T00:00:00Z"}],
                        "lastTakeover": {"epoch": 2, "toRegion": "region-a", "planned": True,
                                         "at": "2026-01-01T00:00:00Z"},
                        "lastReconciliation": {
                            "epoch": 2, "report": "r", "jobs": 0, "jobUpdates": 0,
                            "ledgerEntries": 0, "outboxEvents": 0, "tenants": 0,
                            "lostWalBytes": 0, "lossWindowSeconds": 0,
                            "createdAt": "2026-01-01T00:00:00Z"}}},
    "Tenant": {"spec": tenant_spec(plan="enterprise",
                                   webhooks=[{"url": "https://hooks.example/a"}]),
               "status": {"quotas": {}, "conditions": [
                   {"type": "Ready", "status": "True", "reason": "Provisioned", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
    "TenantMove": {"spec": move_spec(),
                   "status": {"progress": {"tables": [{"table": "jobs"}]}, "conditions": [
                       {"type": "Accepted", "status": "True", "reason": "Admitted",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
}

# Bounds that CEL rules state rather than the schema: the quota ceilings of the
# sweep's plan, from the same table the rules are generated from.
CEL_BOUNDS: dict[tuple[str, ...], tuple[float, ...]] = {
    ("spec", "quotas", field): (float(getattr(PLAN_CEILINGS[Plan.ENTERPRISE], attribute)),)
    for field, attribute in QUOTA_FIELDS.items()}


def numeric_fields(schema: dict[str, Any], path: tuple[str, ...] = ()
                   ) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(path, schema) of every integer and number node; ``[]`` stands for a list item."""
    if schema.get("type") in ("integer", "number"):
        yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from numeric_fields(child, (*path, name))
    if "items" in schema:
        yield from numeric_fields(schema["items"], (*path, "[]"))


def probes(node: dict[str, Any], extra_bounds: tuple[float, ...]) -> list[int | float]:
    """Values at and around each bound, as an integer and as a fraction where both exist
    (an integer beside a fractional bound is what slipped through before)."""
    bounds = [node[key] for key in ("minimum", "maximum") if key in node] + list(extra_bounds)
    values: list[int | float] = [-1, 0, 1, 0.5]
    for bound in bounds:
        values += [bound, float(bound), bound + 1, bound - 1, bound + 0.001, bound - 0.001,
                   math.floor(bound), math.ceil(bound)]
    unique: dict[str, int | float] = {json.dumps(v): v for v in values}
    return list(unique.values())


def with_value(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    node: Any = changed
    for step, following in zip(path, (*path[1:], None)):
        if step == "[]":
            node = node[0]
            continue
        if following is None:
            node[step] = value
        else:
            node = node.setdefault(step, [{}] if following == "[]" else {})
    return changed


def operator_reads(kind: str, obj: dict[str, Any], part: str) -> bool:
    """Whether the operator can use the object as it reads it (spec: the settings and
    the quotas it provisions; status: the status model)."""
    status_models = {"Cell": v1alpha1.CellStatus, "Tenant": v1alpha1.TenantStatus,
                     "TenantMove": v1alpha1.TenantMoveStatus}
    try:
        if part == "status":
            status_models[kind].model_validate(obj["status"])
        elif kind == "Cell":
            CellSettings.from_body(obj)
        elif kind == "Tenant":
            TenantSettings.from_body(obj).quotas()
        else:
            v1alpha1.TenantMoveSpec.model_validate(obj["spec"])
    except (ValueError, ValidationError):
        return False
    return True


def test_every_numeric_bound_holds_alike_at_the_apiserver_and_in_the_operator(
        kube: LocalControlPlane) -> None:
    """For every integer and number field of every CRD, spec and status: the apiserver
    admits a value exactly when the operator can read it. 0 for a 0.1 minimum and a
    rate under the cell's floor were admitted and then failed every operator."""
    config = KubeConfig.load(kube.kubeconfig)
    disagreements: list[str] = []
    swept = 0
    with httpx.Client(base_url=config.server, verify=config.ssl_context(), timeout=30) as http:
        for resource in crdgen.RESOURCES:
            kind = resource.kind
            base = SWEEP_BASES[kind]
            collection = (f"/apis/{v1alpha1.API_VERSION}"
                          + (f"/namespaces/{NAMESPACE}" if resource.scope == "Namespaced" else "")
                          + f"/{resource.plural}")
            name = f"sweep-{kind.lower()}"
            metadata = {"name": name, **({"namespace": NAMESPACE}
                                         if resource.scope == "Namespaced" else {}),
                        "uid": "sweep", "generation": 1}
            created = http.post(collection, json={
                "apiVersion": v1alpha1.API_VERSION, "kind": kind,
                "metadata": {"name": name}, "spec": base["spec"]})
            assert created.status_code == 201, created.text
            schema = crdgen.crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            for path, node in numeric_fields(schema):
                part = path[0]
                for value in probes(node, CEL_BOUNDS.get(path, ())):
                    obj = with_value({"metadata": metadata, "spec": base["spec"],
                                      "status": base["status"]}, path, value)
                    if part == "spec":
                        response = http.post(collection, params={"dryRun": "All"}, json={
                            "apiVersion": v1alpha1.API_VERSION, "kind": kind,
                            "metadata": {"name": f"{name}-probe"}, "spec": obj["spec"]})
                    else:
                        response = http.patch(
                            f"{collection}/{name}/status", params={"dryRun": "All"},
                            json={"status": obj["status"]},
                            headers={"Content-Type": "application/merge-patch+json"})
                    admitted = response.status_code < 300
                    assert admitted or response.status_code == 422, response.text
                    swept += 1
                    if admitted != operator_reads(kind, obj, part):
                        disagreements.append(
                            f"{kind} {'.'.join(path)} = {json.dumps(value)}: apiserver "
                            f"{'admits' if admitted else 'refuses'}, the operator "
                            f"{'cannot read' if admitted else 'reads'} it"
                            + ("" if admitted else f" ({response.json().get('message')})"))
    assert swept > 200
    assert not disagreements, "\n".join(disagreements)
