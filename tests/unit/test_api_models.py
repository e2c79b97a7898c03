"""The v1alpha1 models read manifests as the apiserver stores them and fill in defaults."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from cellplane_cells.domain.plans import PLAN_CEILINGS, QUOTA_FLOORS, Plan, Quotas, quotas_for
from cellplane_operator.api import v1alpha1
from cellplane_operator.api.base import ApiModel
from cellplane_operator.api.quota_rules import QUOTA_FIELDS, quota_ceiling_rules

CELL = yaml.safe_load("""
apiVersion: cellplane.io/v1alpha1
kind: Cell
metadata: {name: shared-a1}
spec:
  region: region-a
  tier: shared
  capacity: {tenants: 50, workerSlots: 200}
  standbyRegions: [region-b, region-c]
  failover: {failoverDelaySeconds: 30}
status:
  phase: Ready
  observedGeneration: 3
  activeRegion: region-a
  activeSite: a1
  epoch: 7
  tenants: 2
  slotsInUse: 7
  standbys:
    - {region: region-b, streaming: true, lagSeconds: 0.4}
    - {region: region-c, streaming: false, message: connecting}
  endpoints: {api: "http://127.0.0.1:8080", admin: "http://127.0.0.1:8081"}
  conditions:
    - {type: Ready, status: "True", reason: StackReady, message: up,
       lastTransitionTime: "2025-01-01T00:00:00Z", observedGeneration: 3}
  somethingNewer: ignored
""")


def test_cell_parses_and_defaults() -> None:
    spec = v1alpha1.CellSpec.model_validate(CELL["spec"])
    assert spec.region == "region-a" and spec.tier == "shared"
    assert spec.capacity.worker_slots == 200
    assert spec.standby_regions == ("region-b", "region-c")
    assert spec.failover == v1alpha1.CellFailover(automatic=True, failover_delay_seconds=30,
                                                  max_standby_lag_seconds=30)
    assert spec.lease.duration_seconds == 10 and spec.lease.margin_seconds == 2
    assert spec.driver.name == "local" and spec.driver.worker_processes == 1
    assert not spec.driver.allow_private_targets and not spec.draining
    assert spec.driver.storage == v1alpha1.CellStorage(class_name=None, size="1Gi")
    assert spec.driver.resources is None
    assert (spec.driver.api_replicas, spec.driver.worker_replicas) == (1, 1)
    assert spec.driver.claim_policy == "Retain"


def test_kubernetes_driver_fields_parse_for_the_driver() -> None:
    spec = v1alpha1.CellSpec.model_validate({
        **CELL["spec"],
        "driver": {"name": "kubernetes", "storage": {"className": "fast.ssd", "size": "20Gi"},
                   "resources": {"database": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                              "limits": {"memory": "2Gi"}},
                                 "worker": {"limits": {"cpu": "2"}}},
                   "apiReplicas": 3, "workerReplicas": 4, "claimPolicy": "Delete"}})
    driver = spec.driver
    assert driver.name == "kubernetes"
    assert (driver.storage.class_name, driver.storage.size) == ("fast.ssd", "20Gi")
    assert driver.resources is not None and driver.resources.database is not None
    assert driver.resources.database.requests == v1alpha1.ResourceList(cpu="500m", memory="1Gi")
    assert driver.resources.database.limits == v1alpha1.ResourceList(memory="2Gi")
    assert driver.resources.api is None
    assert driver.resources.worker == v1alpha1.ResourceRequirements(
        limits=v1alpha1.ResourceList(cpu="2"))
    assert (driver.api_replicas, driver.worker_replicas, driver.claim_policy) == (3, 4, "Delete")


def test_cell_status_parses_and_ignores_unknown_fields() -> None:
    status = v1alpha1.CellStatus.model_validate(CELL["status"])
    assert status.phase == "Ready" and status.epoch == 7 and status.tenants == 2
    assert status.standbys is not None and status.standbys[0].lag_seconds == 0.4
    assert status.endpoints is not None and status.endpoints.api == "http://127.0.0.1:8080"
    assert status.conditions is not None and status.conditions[0].status == "True"


def test_status_dumps_in_the_wire_form_without_unset_fields() -> None:
    status = v1alpha1.TenantStatus(phase="Ready", cell="shared-a1", epoch=3, tenant_id="t-1")
    assert status.model_dump(by_alias=True, mode="json", exclude_none=True) == {
        "phase": "Ready", "cell": "shared-a1", "epoch": 3, "tenantId": "t-1"}


def test_tenant_parses_and_defaults() -> None:
    spec = v1alpha1.TenantSpec.model_validate({
        "plan": "enterprise", "homeRegion": "region-a",
        "quotas": {"maxRunningJobs": 40, "dailySpendLimit": 5_000_000},
        "webhooks": [{"url": "https://hooks.example/jobs"}],
    })
    assert spec.plan is Plan.ENTERPRISE
    assert spec.isolation == "shared" and spec.region_policy == "SINGLE_REGION"
    assert spec.deletion_policy == "Retain" and spec.cell is None and spec.targets == ()
    assert spec.quotas == v1alpha1.TenantQuotas(max_running_jobs=40, daily_spend_limit=5_000_000)
    assert spec.webhooks[0].max_concurrency == 4


def test_tenant_move_parses_and_defaults() -> None:
    spec = v1alpha1.TenantMoveSpec.model_validate({"tenant": "acme", "targetCell": "shared-b2"})
    assert spec.target_cell == "shared-b2" and spec.target_region is None
    assert spec.max_write_pause_seconds == 2 and spec.abort is False
    assert spec.retain_source_for_seconds == 86400


def test_snake_case_names_work_too() -> None:
    spec = v1alpha1.TenantMoveSpec(tenant="acme", target_region="region-b")
    assert spec.model_dump(by_alias=True, exclude_none=True)["targetRegion"] == "region-b"


@pytest.mark.parametrize(("model", "data"), [
    (v1alpha1.CellSpec, {"region": "Region A", "tier": "shared",
                         "capacity": {"tenants": 1, "workerSlots": 1}}),
    (v1alpha1.CellSpec, {"region": "region-a", "tier": "premium",
                         "capacity": {"tenants": 1, "workerSlots": 1}}),
    (v1alpha1.CellSpec, {"region": "region-a", "tier": "shared",
                         "capacity": {"tenants": 1, "workerSlots": 1},
                         "standbyRegions": ["a", "b", "c", "d", "e"]}),
    *[(v1alpha1.CellSpec, {"region": "region-a", "tier": "shared",
                           "capacity": {"tenants": 1, "workerSlots": 1}, "driver": driver})
      for driver in ({"name": "docker"}, {"apiReplicas": 11}, {"workerReplicas": 0},
                     {"claimPolicy": "Orphan"}, {"storage": {"size": "1 Gi"}},
                     {"storage": {"size": "-1Gi"}}, {"storage": {"className": "Fast_SSD"}},
                     {"resources": {"api": {"requests": {"cpu": "lots"}}}})],
    (v1alpha1.TenantSpec, {"plan": "gold", "homeRegion": "region-a"}),
    (v1alpha1.TenantSpec, {"plan": "free", "homeRegion": "region-a",
                           "quotas": {"jobsPerSecond": 0}}),
    (v1alpha1.TenantSpec, {"plan": "free", "homeRegion": "region-a",
                           "targets": [{"name": "x", "url": "ftp://x"}]}),
    (v1alpha1.TenantMoveSpec, {"tenant": "acme", "maxWritePauseSeconds": 61}),
])
def test_schema_bounds_hold_in_python_too(model: type[ApiModel],
                                          data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(data)


def test_exported_members() -> None:
    """Every model of the module is in __all__, and every name there exists (httpx's rule)."""
    models = {name for name, value in vars(v1alpha1).items()
              if isinstance(value, type) and issubclass(value, ApiModel)
              and value.__module__ == v1alpha1.__name__}
    assert models <= set(v1alpha1.__all__)
    assert all(hasattr(v1alpha1, name) for name in v1alpha1.__all__)


def test_models_are_frozen() -> None:
    spec = v1alpha1.TenantMoveSpec(tenant="acme", target_cell="b")
    with pytest.raises(ValidationError):
        spec.abort = True  # type: ignore[misc]


def test_every_quota_has_a_spec_field_and_a_ceiling_rule() -> None:
    assert set(QUOTA_FIELDS.values()) == {f.name for f in fields(Quotas)}
    aliases = {info.alias for info in v1alpha1.TenantQuotas.model_fields.values()}
    assert set(QUOTA_FIELDS) == aliases
    messages = {rule.message for rule in quota_ceiling_rules(PLAN_CEILINGS)}
    assert "quotas.maxRunningJobs must be at most 2 on the free plan" in messages
    assert "quotas.dailySpendLimit applies to the enterprise plan only" in messages
    for plan, ceiling in PLAN_CEILINGS.items():
        for field, attribute in QUOTA_FIELDS.items():
            limit = getattr(ceiling, attribute)
            if limit is not None:
                shown = f"{limit:g}" if isinstance(limit, float) else str(limit)
                assert f"quotas.{field} must be at most {shown} on the {plan.value} plan" \
                    in messages


def test_ceiling_rules_follow_the_table() -> None:
    raised = {plan: Quotas(max_running_jobs=limits.max_running_jobs + 1,
                           jobs_per_second=limits.jobs_per_second,
                           burst=limits.burst, daily_spend_limit=limits.daily_spend_limit,
                           strict_schedules=limits.strict_schedules)
              for plan, limits in PLAN_CEILINGS.items()}
    rules = [rule.rule for rule in quota_ceiling_rules(raised)]
    assert any(r.endswith(f"self.quotas.maxRunningJobs <= {PLAN_CEILINGS[Plan.FREE].max_running_jobs + 1}")
               for r in rules)
    # A double quota compares with a double literal, an integer one with an integer.
    assert any(r.endswith("self.quotas.jobsPerSecond <= 1.0") for r in rules)
    assert any(r.endswith("self.quotas.dailySpendLimit <= 10000000000000") for r in rules)
    assert any(r.endswith("self.quotas.strictSchedules <= 500") for r in rules)


def test_quota_floors_are_the_cells_own() -> None:
    """jobsPerSecond 1e-10 passed the CRD (> 0) and then failed placement (the cell's
    floor): the model, and so the CRD, takes its minimums from the cell's table."""
    schema = v1alpha1.TenantQuotas.model_json_schema(by_alias=True)["properties"]
    for field, attribute in QUOTA_FIELDS.items():
        floor = getattr(QUOTA_FLOORS, attribute)
        bound = next(branch for branch in schema[field]["anyOf"] if branch["type"] != "null")
        assert bound["minimum"] == floor, field
        plan = Plan.ENTERPRISE
        assert getattr(quotas_for(plan, **{attribute: floor}), attribute) == floor
        below = floor - (1 if isinstance(floor, int) else floor / 10)
        with pytest.raises(ValueError):
            quotas_for(plan, **{attribute: below})
        with pytest.raises(ValidationError):
            v1alpha1.TenantQuotas.model_validate({field: below})


def test_integers_are_read_strictly_as_the_crd_admits_them() -> None:
    with pytest.raises(ValidationError):
        v1alpha1.CellCapacity.model_validate({"tenants": 1.0, "workerSlots": 4})
    with pytest.raises(ValidationError):
        v1alpha1.TenantStatus.model_validate({"epoch": 2.0})
    assert v1alpha1.CellCapacity.model_validate({"tenants": 1, "workerSlots": 4}).tenants == 1
    assert v1alpha1.CellLease.model_validate({"renewIntervalSeconds": 1}).renew_interval_seconds == 1
