"""Real kube-apiserver: the generated CRDs refuse invalid specs, naming the field, and
fill in the same defaults as the v1alpha1 models."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellplane_cells.domain.plans import PLAN_CEILINGS
from cellplane_operator.api import v1alpha1
from cellplane_operator.api.base import ApiModel
from cellplane_operator.localplane import LocalControlPlane

NAMESPACE = "default"
KINDS: dict[str, tuple[str, bool]] = {  # kind -> (resource, namespaced)
    "Cell": ("cell", False), "Tenant": ("tenant", True), "TenantMove": ("tenantmove", True)}


def cell_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"region": "region-a", "tier": "shared",
                            "capacity": {"tenants": 10, "workerSlots": 40}}
    spec.update(overrides)
    return spec


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
    "driver-name": (cell_spec(driver={"name": "kubernetes"}),
                    ('spec.driver.name: Unsupported value: "kubernetes"',)),
    "driver-processes": (cell_spec(driver={"workerProcesses": 17}),
                         ("spec.driver.workerProcesses: Invalid value: 17",)),
    "draining-not-bool": (cell_spec(draining="yes"),
                          ('spec.draining: Invalid value: "string"',)),
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
                  ("spec.quotas.jobsPerSecond: Invalid value: 0", "greater than 0")),
    "zero-burst": (tenant_spec(quotas={"burst": 0}), ("spec.quotas.burst: Invalid value: 0",)),
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


@pytest.mark.parametrize(("spec", "expected"), TENANT_REFUSED.values(), ids=TENANT_REFUSED.keys())
def test_invalid_tenant_is_refused(kube: LocalControlPlane, spec: dict[str, Any],
                                   expected: tuple[str, ...]) -> None:
    assert_refused(kube, "Tenant", spec, expected)


def _shown(number: int | float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)


CEILINGS = [(plan.value, field, getattr(limits, attribute))
            for plan, limits in PLAN_CEILINGS.items()
            for field, attribute in (("maxRunningJobs", "max_running"),
                                     ("jobsPerSecond", "jobs_per_second"), ("burst", "burst"),
                                     ("dailySpendLimit", "daily_spend_limit"))
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
        "driver": {"name": "local", "workerProcesses": 1, "allowPrivateTargets": False}}),
    "cell-partial": ("Cell", v1alpha1.CellSpec,
                     cell_spec(failover={"automatic": False}, driver={"workerProcesses": 4}), {
        "failover": {"automatic": False, "failoverDelaySeconds": 0, "maxStandbyLagSeconds": 30},
        "driver": {"name": "local", "workerProcesses": 4, "allowPrivateTargets": False}}),
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
