"""Cell and Tenant objects read into the plain values the controllers work with.

The apiserver has validated every spec against the CRD schema (generated from
``api.v1alpha1``), and the same models parse it here, defaults included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cellplane_cells.domain.plans import Plan, Quotas, quotas_for
from cellplane_cells.domain.priorities import Floors, FloorsError, Priority

from cellplane_operator.api import v1alpha1
from cellplane_operator.api.quota_rules import QUOTA_FIELDS
from cellplane_operator.domain.cells import Tier
from cellplane_operator.domain.ownership import LeaseSettings
from cellplane_operator.domain.placement import RegionPolicy
from cellplane_operator.domain.primary_site import WorkerSetup
from cellplane_operator.sites.base import ServingSpec

__all__ = ["CellSettings", "TenantSettings"]


def _text(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def _slots_per_worker(worker_slots: int, workers: int) -> int:
    """The cell's slots spread over its workers, rounded up: what each worker is started
    with (``--slots``), and what the CRD's floors rule divides by."""
    return max(1, math.ceil(worker_slots / workers))


def _floors(spec: v1alpha1.CellSpec, slots_per_worker: int) -> Floors | None:
    """The Cell's priority floors for one worker; None: the worker's own default shares.
    Checked here too: floors stored before the CRD's rule (or under an older one) are a
    spec the operator cannot run, said on the Cell, not workers that fail at start-up."""
    floors = spec.capacity.priority_floors
    if floors is None:
        return None
    try:
        return Floors(slots_per_worker, {
            Priority.CRITICAL: floors.critical, Priority.HIGH: floors.high,
            Priority.DEFAULT: floors.default, Priority.LOW: floors.low})
    except FloorsError as error:
        raise ValueError(f"spec.capacity.priorityFloors: {error}") from None


@dataclass(frozen=True)
class CellSettings:
    name: str
    region: str
    tier: Tier
    tenant_capacity: int
    worker_slots: int
    standby_regions: tuple[str, ...]
    max_standby_lag_seconds: float
    automatic_failover: bool
    failover_delay_seconds: float
    lease: LeaseSettings
    worker_processes: int
    """The local driver's worker processes (0 of them while fenced is the runner's call)."""
    workers_sharing_slots: int
    """Over how many workers the slots are spread: the kubernetes driver's worker Pods
    (workerReplicas), else the local driver's processes."""
    priority_floors: Floors | None
    """Each worker's floors; None: the worker's default shares."""
    allow_private_targets: bool
    draining: bool

    @property
    def site_regions(self) -> tuple[str, ...]:
        """Every region with a site of the cell: its home region, then its standby regions."""
        return (self.region, *self.standby_regions)

    @property
    def slots_per_worker(self) -> int:
        return _slots_per_worker(self.worker_slots, self.workers_sharing_slots)

    def workers(self, processes: int) -> WorkerSetup:
        """``processes`` workers (the runner's count: none while fenced) as the Cell sets
        them up: each with its share of the slots and the Cell's floors."""
        return WorkerSetup(processes=processes, slots=self.slots_per_worker,
                           floors=self.priority_floors)

    def serving_spec(self, epoch: int, admin_token: str, workers: WorkerSetup) -> ServingSpec:
        """What a site driver is asked to run for this cell: the one place a Cell's
        settings become its processes' (the primary's and a standby's warmed-up API)."""
        return ServingSpec(epoch=epoch, admin_token=admin_token,
                           worker_processes=workers.processes, slots_per_worker=workers.slots,
                           priority_floors=workers.floors,
                           allow_private_targets=self.allow_private_targets)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> CellSettings:
        spec = v1alpha1.CellSpec.model_validate(body["spec"])
        driver = spec.driver
        workers = driver.worker_replicas if driver.name == "kubernetes" \
            else driver.worker_processes
        return cls(
            name=body["metadata"]["name"], region=spec.region, tier=Tier(_text(spec.tier)),
            tenant_capacity=spec.capacity.tenants, worker_slots=spec.capacity.worker_slots,
            standby_regions=tuple(spec.standby_regions),
            max_standby_lag_seconds=float(spec.failover.max_standby_lag_seconds),
            automatic_failover=spec.failover.automatic,
            failover_delay_seconds=float(spec.failover.failover_delay_seconds),
            # Validated here, where the object is read: a lease the CRD's rules let
            # through (stored under an older CRD) is a spec that cannot be read, said on
            # the Cell's Accepted condition, not a site runner that fails at each start.
            lease=LeaseSettings(duration_seconds=float(spec.lease.duration_seconds),
                                renew_interval_seconds=float(spec.lease.renew_interval_seconds),
                                margin_seconds=float(spec.lease.margin_seconds)).validated(),
            worker_processes=driver.worker_processes, workers_sharing_slots=workers,
            priority_floors=_floors(spec, _slots_per_worker(spec.capacity.worker_slots,
                                                            workers)),
            allow_private_targets=spec.driver.allow_private_targets,
            draining=spec.draining)


@dataclass(frozen=True)
class TenantSettings:
    namespace: str
    name: str
    uid: str
    generation: int
    plan: Plan
    isolation: Tier
    home_region: str
    region_policy: RegionPolicy
    pinned_cell: str | None
    deletion_policy: str
    targets: tuple[tuple[str, str], ...]
    webhooks: tuple[tuple[str, int], ...]
    overrides: dict[str, Any]

    def quotas(self) -> Quotas:
        """The plan's quotas with the overrides; ValueError if one is over the plan's ceiling."""
        return quotas_for(self.plan, **self.overrides)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> TenantSettings:
        meta = body["metadata"]
        spec = v1alpha1.TenantSpec.model_validate(body["spec"])
        overrides: dict[str, Any] = {}
        if spec.quotas is not None:
            # spec.quotas' fields carry the cell's own names (``Quotas``).
            for field in QUOTA_FIELDS.values():
                value = getattr(spec.quotas, field)
                if value is not None:
                    overrides[field] = value
        return cls(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
            generation=int(meta.get("generation", 0)), plan=Plan(_text(spec.plan)),
            isolation=Tier(_text(spec.isolation)), home_region=spec.home_region,
            region_policy=RegionPolicy(_text(spec.region_policy)), pinned_cell=spec.cell,
            deletion_policy=_text(spec.deletion_policy),
            targets=tuple((t.name, str(t.url)) for t in spec.targets),
            webhooks=tuple((str(w.url), w.max_concurrency) for w in spec.webhooks),
            overrides=overrides)
