"""The demo's cast: its regions, Cells, Tenants and how hard each tenant submits.

Pure data, so a unit test can check that the scene shows what the README says
(every plan, a dedicated tenant, standbys in partner regions, a noisy tenant
whose cap is below its appetite) without starting anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellplane_operator.domain.placement import dedicated_cell_name

__all__ = ["REGIONS", "NAMESPACE", "DemoTenant", "DemoSettings", "TENANTS", "NOISY", "MOVED",
           "MOVE_BUDGET_SECONDS", "CELL_SLOTS", "DEDICATED", "DEDICATED_CELL",
           "LOST_REGION", "LOST_CELL", "MOVE_TARGET", "settings_for", "manifests",
           "CLUSTER_LOST_CELL", "CLUSTER_MOVE_TARGET", "CLUSTER_MOVED", "CLUSTER_STAYS",
           "CLUSTER_LOAD_REGION", "CLUSTER_MOVE_BUDGET_SECONDS", "ClusterSettings",
           "cluster_settings_for"]

REGIONS = ("region-a", "region-b", "region-c")
NAMESPACE = "demo"
LOST_REGION = "region-a"
LOST_CELL = "shared-a1"
"""Homed in the region the demo loses, with its standby in region-b."""
MOVE_TARGET = "shared-b1"
MOVE_BUDGET_SECONDS = 2.0
CELL_SLOTS = 40


@dataclass(frozen=True)
class DemoTenant:
    name: str
    plan: str
    home_region: str
    rate: float
    """Jobs a second its client tries to submit (the noisy one: far above its bucket)."""
    quotas: Mapping[str, float]
    isolation: str = "shared"
    region_policy: str = "SINGLE_REGION"
    clients: int = 1
    """Clients submitting at once (each waits for its answers)."""

    @property
    def max_running_jobs(self) -> int:
        return int(self.quotas.get("maxRunningJobs", _PLAN_RUNNING[self.plan]))


# The plans' default running caps (cells/cellplane_cells/domain/plans.py); the operator
# package may not import the cell stack's plan table, and the demo only reads it.
_PLAN_RUNNING = {"free": 2, "pro": 5, "enterprise": 20}

NOISY = "hooli"
MOVED = "acme"
DEDICATED = "globex"
DEDICATED_CELL = dedicated_cell_name(NAMESPACE, DEDICATED)
"""The name the operator gives the dedicated tenant's own cell. The demo applies that Cell
itself, as a platform team may, so that it allows the loopback job target (a cell the
operator makes has the driver's defaults, which rightly refuse private addresses)."""

# Rates are raised within each plan's ceiling so that a few minutes show a few thousand
# jobs; the noisy tenant's four clients ask for four times what its bucket grants (its
# bucket here is the full run's; DemoSettings.noisy_bucket), and its running cap (3) is
# what keeps it from crowding the cell's 40 slots.
TENANTS = (
    DemoTenant("acme", "pro", "region-a", 4.0, {"jobsPerSecond": 10, "burst": 50},
               region_policy="HOME_ASYNC"),
    DemoTenant(NOISY, "pro", "region-a", 40.0,
               {"jobsPerSecond": 10, "burst": 100, "maxRunningJobs": 3}, clients=4),
    DemoTenant("initech", "free", "region-a", 1.0, {"jobsPerSecond": 1, "burst": 10}),
    DemoTenant("umbrella", "pro", "region-b", 2.0, {"jobsPerSecond": 10, "burst": 50}),
    DemoTenant(DEDICATED, "enterprise", "region-c", 2.0, {"jobsPerSecond": 20, "burst": 100},
               isolation="dedicated", region_policy="HOME_ASYNC"),
)


@dataclass(frozen=True)
class DemoSettings:
    mode: str
    """``short`` (CI) or ``full``."""
    lease: Mapping[str, float] | None
    """The cells' ownership lease; None keeps the product's (10 s, renewed every 2 s,
    2 s margin)."""
    election: tuple[str, ...]
    """Extra ``cellplane operator`` arguments for the placement election."""
    resync_seconds: float
    warmup_jobs: int
    """Acknowledged jobs of every tenant before the move starts."""
    after_takeover_jobs: int
    """Acknowledged jobs of the lost cell's tenants after the takeover, before the load stops."""
    step_seconds: float
    """How long the job target takes per step: long enough that running slots fill."""
    noisy_bucket: tuple[float, int]
    """The noisy tenant's token bucket (jobs a second, burst): what it is granted of the
    40 a second it asks for. What it is granted and cannot run at once waits in its queue,
    and the demo waits for that backlog at the end, so the short run grants less."""
    ready_timeout: float
    finish_timeout: float
    """How long the demo waits for the acknowledged jobs to finish at the end (jobs that
    ran in the lost region resume once their 30 s claim lease has run out)."""


def settings_for(short: bool) -> DemoSettings:
    if short:
        return DemoSettings(
            mode="short",
            lease={"durationSeconds": 3, "renewIntervalSeconds": 0.5, "marginSeconds": 0.5},
            election=("--election-lease-seconds", "3", "--election-renew-seconds", "0.5",
                      "--election-margin-seconds", "0.5"),
            resync_seconds=5, warmup_jobs=5, after_takeover_jobs=5, step_seconds=0.1,
            noisy_bucket=(5, 20),
            ready_timeout=300, finish_timeout=120)
    return DemoSettings(
        mode="full", lease=None, election=(), resync_seconds=10, warmup_jobs=40,
        after_takeover_jobs=30, step_seconds=0.1, noisy_bucket=(10, 100), ready_timeout=400,
        finish_timeout=240)


def manifests(settings: DemoSettings, target_url: str) -> list[dict[str, Any]]:
    """The objects the demo applies, in order: two shared Cells and the dedicated tenant's
    own Cell, each with a standby in a partner region, the namespace, and one Tenant per
    entry of ``TENANTS``."""
    driver = {"allowPrivateTargets": True}  # the job target lives on loopback

    def cell(name: str, region: str, standby: str, *, tier: str = "shared", tenants: int = 10,
             labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"region": region, "tier": tier,
                                "capacity": {"tenants": tenants, "workerSlots": CELL_SLOTS},
                                "standbyRegions": [standby], "driver": driver}
        if settings.lease is not None:
            spec["lease"] = dict(settings.lease)
        return {"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
                "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}

    dedicated = next(t for t in TENANTS if t.name == DEDICATED)
    objects = [cell(LOST_CELL, "region-a", "region-b"), cell(MOVE_TARGET, "region-b", "region-c"),
               # The labels the operator puts on a cell it makes for a tenant, so that
               # deleting the tenant (deletionPolicy Delete) removes this cell too.
               cell(DEDICATED_CELL, dedicated.home_region, "region-b", tier="dedicated",
                    tenants=1, labels={"cellplane.io/tenant": DEDICATED,
                                       "cellplane.io/tenant-namespace": NAMESPACE}),
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    for tenant in TENANTS:
        quotas = dict(tenant.quotas)
        if tenant.name == NOISY:
            quotas["jobsPerSecond"], quotas["burst"] = settings.noisy_bucket
        spec: dict[str, Any] = {"plan": tenant.plan, "homeRegion": tenant.home_region,
                                "quotas": quotas}
        spec["targets"] = [{"name": "default", "url": target_url}]
        if tenant.isolation == "dedicated":
            spec.update(isolation="dedicated", deletionPolicy="Delete")
        if tenant.region_policy != "SINGLE_REGION":
            spec["regionPolicy"] = tenant.region_policy
        objects.append({"apiVersion": "cellplane.io/v1alpha1", "kind": "Tenant",
                        "metadata": {"name": tenant.name, "namespace": NAMESPACE}, "spec": spec})
    return objects


# -- the same story on the local cluster (``cellplane demo --driver kubernetes``) ----------
#
# Cells of the ``kubernetes`` driver are Pods: a Postgres StatefulSet per region, the API
# and the workers as Deployments. The cast is smaller than the local one (two Cells, two
# tenants, one load each) because every site is a few Pods on a 2-core machine; the
# story is the same: a tenant moved under load, the lost cell's region killed whole
# (its node: kubelet, containerd, every Pod, its operator, router and etcd member),
# taken over, brought back, fenced, reported on and rebuilt.

CLUSTER_LOST_CELL = "demo-a1"
"""Homed in the region the cluster demo loses (region-a), its standby in region-b."""
CLUSTER_MOVE_TARGET = "demo-b1"
"""In region-b, which the demo keeps: the moved tenant is away from the loss."""
CLUSTER_MOVED = "acme"
CLUSTER_STAYS = "initech"
"""The tenant that stays in the lost cell: its load measures the region loss."""
CLUSTER_LOAD_REGION = "region-c"
"""Where the load, the job target and the router they use run: never lost."""
CLUSTER_MOVE_BUDGET_SECONDS = 5.0
"""A cutover on the cluster crosses Pods and Services; the cluster tests' budget."""


@dataclass(frozen=True)
class ClusterSettings:
    mode: str
    """``short`` (CI) or ``full``."""
    warmup_jobs: int
    """Acknowledged jobs of each tenant before the move starts."""
    after_takeover_jobs: int
    """Acknowledged jobs of the lost cell's tenant after the takeover."""
    ready_timeout: float
    """Cells (Pods, a base backup for the standby) and tenants Ready, on a loaded machine."""
    rebuild_timeout: float
    """The killed node back, its old primary fenced, reported on and streaming again."""
    finish_timeout: float


def cluster_settings_for(short: bool) -> ClusterSettings:
    # The lease is the product's in both modes: the kubernetes driver's takeover is measured
    # against it (README Measured), and a shorter one would race the Pods' own restarts.
    if short:
        return ClusterSettings(mode="short", warmup_jobs=10, after_takeover_jobs=5,
                               ready_timeout=900, rebuild_timeout=600, finish_timeout=90)
    return ClusterSettings(mode="full", warmup_jobs=60, after_takeover_jobs=40,
                           ready_timeout=900, rebuild_timeout=600, finish_timeout=180)
