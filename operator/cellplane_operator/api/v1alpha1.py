"""cellplane.io/v1alpha1: Cell, Tenant and TenantMove, spec and status.

These models are both what the operator parses (``TenantSpec.model_validate(
body["spec"])``) and what the CRDs are generated from (``crdgen``), so a default
or a bound written here is the one the apiserver applies: the two cannot drift.
Rules the schema alone cannot state are CEL, next to the field they guard.
Field docstrings are the CRD descriptions that ``kubectl explain`` shows.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from cellplane_cells.domain.plans import PLAN_CEILINGS, QUOTA_FLOORS, Plan
from cellplane_operator.api.base import (
    DNS_LABEL_PATTERN,
    ApiModel,
    DnsLabel,
    DnsSubdomain,
    HttpUrl,
    Int64,
    Integer,
    Quantity,
    Rule,
    cel,
    empty_object_default,
    list_map,
    list_set,
)
from cellplane_operator.api.quota_rules import quota_ceiling_rules
from cellplane_operator.domain.site_names import MAX_CELL_AND_REGION

__all__ = [
    "GROUP",
    "VERSION",
    "API_VERSION",
    "CELL_NAME_RULES",
    "TENANT_NAME_RULES",
    "Condition",
    "CellPhase",
    "TenantPhase",
    "MovePhase",
    "CellCapacity",
    "PriorityFloors",
    "CellFailover",
    "CellTakeover",
    "CellReconciliation",
    "CellLease",
    "CellDriver",
    "CellStorage",
    "CellResources",
    "ResourceRequirements",
    "ResourceList",
    "CellSpec",
    "CellStandby",
    "CellEndpoints",
    "CellStatus",
    "Plan",
    "TenantQuotas",
    "TenantTarget",
    "TenantWebhook",
    "TenantSpec",
    "TenantStatus",
    "TenantMoveSpec",
    "TableProgress",
    "MoveProgress",
    "TenantMoveStatus",
]

GROUP = "cellplane.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


def _name_is_a_dns_label(kind: str, why: str) -> Rule:
    """metadata.name as a DNS label (Kubernetes allows a 253-character subdomain)."""
    return Rule(f"self.metadata.name.size() <= 63 && self.metadata.name.matches("
                f"'{DNS_LABEL_PATTERN}')",
                f"a {kind}'s name must be a DNS label: at most 63 lowercase letters, digits "
                f"and '-', no dots ({why})")


def _kubernetes_site_names_fit() -> Rule:
    """At the CRD's root, the only place CEL sees ``metadata.name``: a kubernetes-driver
    cell's site objects are named ``cell-<cell>-<region>-db`` and so on
    (``domain/site_names.py``), and the StatefulSet's name must leave room for its Pods'
    revision-hash label."""
    fits = f"self.metadata.name.size() + {{}}.size() <= {MAX_CELL_AND_REGION}"
    return Rule(
        "!has(self.spec.driver) || !has(self.spec.driver.name)"
        " || self.spec.driver.name != 'kubernetes'"
        f" || ((!has(self.spec.region) || {fits.format('self.spec.region')})"
        " && (!has(self.spec.standbyRegions)"
        f" || self.spec.standbyRegions.all(r, {fits.format('r')})))",
        f"a kubernetes-driver Cell's name and each of its regions (spec.region, every "
        f"spec.standbyRegions) may have at most {MAX_CELL_AND_REGION} characters together: "
        f"its site's StatefulSet is named cell-<cell>-<region>-db and must leave room for its "
        f"Pods' controller-revision-hash label (63 characters)")


CELL_NAME_RULES = (
    _name_is_a_dns_label(
        "Cell", "spec.cell and a TenantMove's targetCell name cells by DNS labels"),
    _kubernetes_site_names_fit(),
)
TENANT_NAME_RULES = (_name_is_a_dns_label(
    "Tenant", "it is the value of the cellplane.io/tenant label on the tenant's Secret and "
    "dedicated Cell, and a TenantMove's spec.tenant names it"),)


def _immutable(message: str) -> Rule:
    """A transition rule: the apiserver compares the field with its stored value."""
    return Rule("self == oldSelf", message)


def _pin_unchanged(field: str, message: str) -> Rule:
    """Immutability of an optional field, checked one level up: a field-level
    ``self == oldSelf`` runs only when both versions have the field, so setting
    or clearing it would slip through."""
    return Rule(
        f"has(self.{field}) == has(oldSelf.{field})"
        f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        message, field_path=f".{field}",
    )


class Condition(ApiModel):
    """One aspect of an object's state, as metav1.Condition (what `kubectl wait
    --for=condition=` reads)."""

    type: str = Field(max_length=316)
    """CamelCase name of the aspect, e.g. Ready or Accepted."""
    status: Literal["True", "False", "Unknown"]
    """Whether the aspect holds."""
    observed_generation: Annotated[Int64, Field(ge=0)] | None = None
    """metadata.generation of the spec this condition was computed from."""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    """When status last changed (a new reason or message alone keeps it)."""
    reason: str = Field(min_length=1, max_length=1024,
                        pattern="^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """Machine-readable CamelCase cause of the current status."""
    message: str = Field(max_length=32768)
    """Human-readable details."""


ConditionList = Annotated[tuple[Condition, ...], Field(json_schema_extra=list_map("type"))]

# ----------------------------------------------------------------------- Cell

CellPhase = Literal["Pending", "Provisioning", "Ready", "Draining", "FailingOver", "Degraded",
                    "Fenced"]


class PriorityFloors(ApiModel):
    """Slots of each worker process reserved per priority class (``--priority-floors`` of
    ``cellplane cell work``); a class left out reserves none."""

    critical: Integer = Field(default=0, ge=0, le=100000)
    """Slots of each worker kept for CRITICAL jobs."""
    high: Integer = Field(default=0, ge=0, le=100000)
    """Slots of each worker kept for HIGH jobs."""
    default: Integer = Field(default=0, ge=0, le=100000)
    """Slots of each worker kept for DEFAULT jobs (a job that names no class)."""
    low: Integer = Field(default=0, ge=0, le=100000)
    """Slots of each worker kept for LOW jobs."""


class CellCapacity(ApiModel):
    """How much placement may put into the cell."""

    model_config = ConfigDict(json_schema_extra=cel(Rule(
        "self.tenants <= self.workerSlots",
        "capacity.tenants must not exceed capacity.workerSlots (each tenant needs a slot)")))

    tenants: Integer = Field(ge=1, le=10000)
    """Most tenants placement may put in this cell."""
    worker_slots: Integer = Field(ge=1, le=100000)
    """Jobs the cell's workers may run at once, over all tenants."""
    priority_floors: PriorityFloors | None = None
    """Slots of each worker process reserved per priority class: a class keeps its floor
    while higher classes are busy, and idle slots go to the highest class with work. They
    may add up to at most each worker's slots (workerSlots spread over the workers, rounded
    up). Unset: 20% of each worker's slots for CRITICAL, HIGH and DEFAULT and 10% for LOW,
    rounded down. A change restarts the workers."""


class CellFailover(ApiModel):
    """When a standby region takes over after the active region is lost."""

    automatic: bool = True
    """Promote a standby on its own when the active region's lease ends; false waits
    for a person."""
    failover_delay_seconds: Integer = Field(default=0, ge=0, le=3600)
    """Extra wait after the lease ended before promoting, to ride out short outages."""
    max_standby_lag_seconds: float = Field(default=30, ge=0, le=86400)
    """A standby further behind than this is not promoted automatically (it would lose more)."""


class CellLease(ApiModel):
    """Timing of the cell's placement-group lease; the rules keep one lost renewal
    and the clock margin inside the lease (``domain/ownership.py`` explains why)."""

    model_config = ConfigDict(json_schema_extra=cel(
        Rule("self.marginSeconds < double(self.durationSeconds)",
             "lease.marginSeconds must be below lease.durationSeconds"),
        Rule("2.0 * self.renewIntervalSeconds <= double(self.durationSeconds) - self.marginSeconds",
             "two lease.renewIntervalSeconds must fit in durationSeconds - marginSeconds, "
             "so one lost renewal does not end ownership"),
    ))

    duration_seconds: Integer = Field(default=10, ge=2, le=300)
    """etcd lease TTL of the owner key."""
    renew_interval_seconds: float = Field(default=2, ge=0.1, le=60)
    """How often the owner renews."""
    margin_seconds: float = Field(default=2, ge=0.1, le=120)
    """Clock margin that tolerates skew and pauses."""


class ResourceList(ApiModel):
    """Amounts of CPU and memory, as in a Pod's container resources."""

    cpu: Quantity | None = None
    """CPU, e.g. 250m or 1."""
    memory: Quantity | None = None
    """Memory, e.g. 512Mi or 1Gi."""


class ResourceRequirements(ApiModel):
    """Requests and limits of one container, as Kubernetes' ResourceRequirements (CPU and
    memory only). What is not set here is the operator's default (the chart's
    cells.resources)."""

    requests: ResourceList | None = None
    """What the scheduler reserves for the container."""
    limits: ResourceList | None = None
    """The most the container may use (memory over it is killed, CPU over it throttled)."""


class CellResources(ApiModel):
    """Requests and limits of a site's containers. kubernetes driver only: a local cell
    ignores them."""

    database: ResourceRequirements | None = None
    """The Postgres container of every site (with its site agent)."""
    api: ResourceRequirements | None = None
    """Each cell API container of the active site."""
    worker: ResourceRequirements | None = None
    """Each worker container of the active site."""


class CellStorage(ApiModel):
    """The PersistentVolumeClaim of each site's database. kubernetes driver only: a local
    cell ignores it."""

    model_config = ConfigDict(json_schema_extra=cel(_pin_unchanged(
        "className", "storage.className is immutable: a claim cannot change its class")))

    class_name: DnsSubdomain | None = None
    """StorageClass of the claims; unset: the operator's default (the chart's
    cells.storageClass), else the cluster's default class. Immutable."""
    size: Quantity = Field(default="1Gi", json_schema_extra=cel(
        Rule("!isQuantity(self) || quantity(self).isGreaterThan(quantity('0'))",
             "storage.size must be more than zero"),
        Rule("!isQuantity(self) || !isQuantity(oldSelf)"
             " || quantity(self).compareTo(quantity(oldSelf)) >= 0",
             "storage.size may only grow: a claim cannot shrink")))
    """Requested size of each site's claim, e.g. 1Gi; it may grow (where the class allows
    volume expansion), never shrink."""


class CellDriver(ApiModel):
    """How the cell's sites are run."""

    name: Literal["local", "kubernetes"] = Field(default="local", json_schema_extra=cel(
        _immutable("driver.name is immutable; create a new cell and move tenants to it")))
    """Site driver: local runs each site as processes in its region's operator (its pod);
    kubernetes runs each site as workloads (a Postgres StatefulSet with a claim, the API and
    workers as Deployments) on its region's nodes. Immutable."""
    worker_processes: Integer = Field(default=1, ge=1, le=16)
    """Worker processes of the primary site; the worker slots are spread over them. local
    driver only (the kubernetes driver's is workerReplicas)."""
    allow_private_targets: bool = False
    """Development only: tenants may register loopback and private targets and webhooks."""
    storage: CellStorage = Field(default_factory=CellStorage,
                                 json_schema_extra=empty_object_default())
    """The claim of each site's database. kubernetes driver only: a local cell ignores it."""
    resources: CellResources | None = None
    """Requests and limits of the sites' containers; unset parts are the operator's
    defaults (the chart's cells.resources). kubernetes driver only: a local cell ignores
    them."""
    api_replicas: Integer = Field(default=1, ge=1, le=10)
    """Pods of the cell API on the active site. kubernetes driver only: a local cell
    ignores it."""
    worker_replicas: Integer = Field(default=1, ge=1, le=16)
    """Pods of workers on the active site; the worker slots are spread over them.
    kubernetes driver only: a local cell ignores it (its count is workerProcesses)."""
    claim_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting the Cell does to its sites' PersistentVolumeClaims: Retain keeps them
    (and the data), Delete removes them. kubernetes driver only: a local cell ignores it."""


def _floors_fit_each_worker() -> Rule:
    """The floors are per worker process, so they must fit in one worker's slots: the
    cell's workerSlots over its workers, rounded up (``CellSettings.slots_per_worker``, which
    the operator checks again where it reads the Cell). Stated on the spec, the only place
    that sees both the capacity and the driver's worker count (both defaulted by then)."""
    floors = "self.capacity.priorityFloors"
    total = " + ".join(f"{floors}.{name}" for name in ("critical", "high", "default", "low"))
    workers = ("(self.driver.name == 'kubernetes' ? self.driver.workerReplicas"
               " : self.driver.workerProcesses)")
    each = f"((self.capacity.workerSlots + {workers} - 1) / {workers})"
    return Rule(
        f"!has({floors}) || {total} <= {each}",
        "capacity.priorityFloors must add up to at most each worker's slots: "
        "capacity.workerSlots spread over the workers (driver.workerProcesses; "
        "driver.workerReplicas for the kubernetes driver), rounded up",
        # No messageExpression with the numbers: string() of a sum has no size bound, and
        # the apiserver's cost estimate then refuses the whole CRD.
        field_path=".capacity.priorityFloors")


class CellSpec(ApiModel):
    """The desired cell: one independent stack of the job platform (API, workers,
    Postgres) with its primary site in its home region and standbys elsewhere."""

    model_config = ConfigDict(json_schema_extra=cel(
        Rule("self.tier != 'dedicated' || self.capacity.tenants == 1",
             "a dedicated cell hosts exactly one tenant (capacity.tenants must be 1)"),
        Rule("!has(self.standbyRegions) || !(self.region in self.standbyRegions)",
             "standbyRegions must not include the cell's own region",
             field_path=".standbyRegions"),
        _floors_fit_each_worker(),
    ))

    region: DnsLabel = Field(json_schema_extra=cel(_immutable(
        "region is immutable; create a new cell and move tenants to it")))
    """Home region of the cell's primary site. Never changes."""
    tier: Literal["shared", "dedicated"]
    """shared cells host many tenants; dedicated cells host one."""
    capacity: CellCapacity
    """How much placement may put into the cell."""
    standby_regions: tuple[DnsLabel, ...] = Field(default=(), max_length=4,
                                                  json_schema_extra=list_set())
    """Regions that keep a streaming standby of the cell's database, ready to take over."""
    failover: CellFailover = Field(default_factory=CellFailover,
                                   json_schema_extra=empty_object_default())
    """When a standby region takes over after the active region is lost."""
    lease: CellLease = CellLease()
    """Ownership lease of the cell's placement group in etcd. The owner stops acting
    marginSeconds before its lease ends by its own clock; a candidate acts only
    marginSeconds after it saw the lease end."""
    driver: CellDriver = Field(default_factory=CellDriver, json_schema_extra=empty_object_default())
    """How the cell's sites are run."""
    draining: bool = False
    """No new tenants are placed here; the ones inside stay until moved."""


class CellStandby(ApiModel):
    """A standby site as its region's operator reports it."""

    region: DnsLabel
    """Region of the standby site."""
    streaming: bool | None = None
    """Whether the standby is connected to the primary and receiving its WAL."""
    lag_seconds: float | None = None
    """How far the standby's replay is behind the primary."""
    message: str | None = None
    """What is wrong, when something is."""


class CellEndpoints(ApiModel):
    """Where the cell's active site answers."""

    api: str | None = None
    """URL of the tenant job API."""
    admin: str | None = None
    """URL of the admin API (its token is in the cell's Secret)."""


class CellTakeover(ApiModel):
    """The latest change of the cell's active site."""

    epoch: Int64
    """The epoch the new active site acts under."""
    from_region: str | None = None
    """Region of the site that held the previous epoch."""
    to_region: str
    """Region of the site that acts now."""
    planned: bool
    """A switchover a person asked for (no loss), rather than a takeover after a loss."""
    seconds: float | None = None
    """From the previous owner's end (lease gone, or released) to the new site serving."""
    at: str = Field(json_schema_extra={"format": "date-time"})
    """When the new site started serving."""


class CellReconciliation(ApiModel):
    """What the old primary committed that the new one lacks, from the latest failover's
    reconciliation report (``cellplane report CELL`` prints it whole)."""

    epoch: Int64
    """The epoch of the site that took over."""
    report: str
    """Name of the ConfigMap in the operator's namespace that holds the report."""
    jobs: Integer
    """Acknowledged jobs the new primary lacks."""
    job_updates: Integer
    """Jobs whose progress (a status change) the new primary lacks."""
    ledger_entries: Integer
    """Ledger entries (reservations, settlements, refunds) the new primary lacks."""
    outbox_events: Integer
    """Events the new primary lacks."""
    tenants: Integer
    """Tenants with anything in the report."""
    lost_wal_bytes: Int64
    """WAL the old primary wrote past the new primary's starting point."""
    loss_window_seconds: float
    """Time between the first and the last lost write."""
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    """When the report was made (before the old primary was rewound)."""


class CellStatus(ApiModel):
    """The observed cell, written by the holder of its placement-group lease
    (tenants and slotsInUse by the placement leader)."""

    phase: CellPhase | None = None
    """Summary of the cell's state."""
    observed_generation: Int64 | None = None
    """metadata.generation of the spec the status describes."""
    active_region: str | None = None
    """Region whose site acts for the cell now."""
    active_site: str | None = None
    """Site that acts for the cell now."""
    epoch: Int64 | None = None
    """Epoch of the placement-group lease the active site holds; grows on every takeover."""
    tenants: Integer | None = None
    """Tenants placed in the cell."""
    slots_in_use: Integer | None = None
    """Worker slots promised to the placed tenants (their running-job caps)."""
    standby_lag_seconds: float | None = None
    """Replay lag of the furthest-behind standby."""
    standbys: tuple[CellStandby, ...] | None = Field(default=None,
                                                     json_schema_extra=list_map("region"))
    """One entry per standby region."""
    endpoints: CellEndpoints | None = None
    """Where the cell's active site answers."""
    last_takeover: CellTakeover | None = None
    """The latest change of the active site (takeover or switchover)."""
    last_reconciliation: CellReconciliation | None = None
    """Summary of the latest failover's reconciliation report."""
    conditions: ConditionList | None = None
    """Ready, Accepted and the other aspects of the cell's state."""


# --------------------------------------------------------------------- Tenant

TenantPhase = Literal["Pending", "Placing", "Provisioning", "Ready", "Unplaceable", "Moving",
                      "Deleting", "Degraded"]


class TenantQuotas(ApiModel):
    """Limits of one tenant, enforced by its cell."""

    # The floors are the cell's own (cellplane_cells.domain.plans), as the ceilings are.
    max_running_jobs: Integer | None = Field(default=None, ge=QUOTA_FLOORS.max_running_jobs)
    """Jobs of the tenant that may run at once."""
    jobs_per_second: float | None = Field(default=None, ge=QUOTA_FLOORS.jobs_per_second)
    """Sustained submission rate of the tenant API's token bucket."""
    burst: Integer | None = Field(default=None, ge=QUOTA_FLOORS.burst)
    """Submissions allowed at once after a quiet spell (the bucket's size)."""
    daily_spend_limit: Integer | None = Field(default=None, ge=QUOTA_FLOORS.daily_spend_limit)
    """Micro-credits an enterprise tenant may reserve per day."""
    strict_schedules: Integer | None = Field(default=None, ge=QUOTA_FLOORS.strict_schedules)
    """Active strict schedules (dispatch window 0) the tenant may have; CRITICAL work needs at
    least one."""


class TenantTarget(ApiModel):
    """An HTTP service the tenant's job steps may call."""

    name: DnsLabel
    """Name the jobs refer to the target by."""
    url: HttpUrl
    """Base URL of the target."""


class TenantWebhook(ApiModel):
    """Where the cell reports the tenant's job events."""

    url: HttpUrl
    """URL the cell POSTs signed events to."""
    max_concurrency: Integer = Field(default=4, ge=1, le=100)
    """Deliveries in flight at once to this URL."""


class TenantSpec(ApiModel):
    """The desired tenant: its plan, where it lives, and what its jobs may call."""

    model_config = ConfigDict(json_schema_extra=cel(
        *quota_ceiling_rules(PLAN_CEILINGS),
        Rule("self.isolation != 'dedicated' || !has(self.cell)",
             "a dedicated tenant gets a cell made for it; spec.cell pins shared tenants only",
             field_path=".cell"),
        _pin_unchanged("cell",
                       "spec.cell is immutable; use a TenantMove to change a tenant's cell"),
    ))

    plan: Plan
    """free, pro or enterprise: the quota defaults and ceilings."""
    isolation: Literal["shared", "dedicated"] = Field(default="shared", json_schema_extra=cel(
        _immutable("isolation is immutable; move the tenant to a new cell instead")))
    """shared places the tenant in a shared cell; dedicated creates a cell for it alone."""
    home_region: DnsLabel = Field(json_schema_extra=cel(_immutable(
        "homeRegion is immutable; use a TenantMove")))
    """Region whose cells hold the tenant."""
    region_policy: Literal["SINGLE_REGION", "HOME_ASYNC"] = "SINGLE_REGION"
    """SINGLE_REGION keeps the data in the home region only; HOME_ASYNC also streams
    it to the cell's standby regions."""
    quotas: TenantQuotas | None = None
    """Overrides of the plan's default quotas, each within the plan's ceiling."""
    cell: DnsLabel | None = None
    """Pins a shared tenant to this cell instead of letting placement choose."""
    targets: tuple[TenantTarget, ...] = Field(default=(), max_length=32,
                                              json_schema_extra=list_map("name"))
    """HTTP services the tenant's job steps may call."""
    webhooks: tuple[TenantWebhook, ...] = Field(default=(), max_length=8,
                                                json_schema_extra=list_map("url"))
    """Where the cell reports the tenant's job events."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """On deletion, Retain keeps the tenant's data in its cell, disabled, under its tenant
    id (status.tenantId, named again by the Removed Event; the cell's admin API reaches
    it there); Delete removes it, and a dedicated tenant's cell with it. The tenant id
    is made from the object's uid: a Tenant created again under the same name is a new
    tenant, with none of a retained predecessor's data."""


class TenantStatus(ApiModel):
    """The observed tenant, written by the placement leader."""

    phase: TenantPhase | None = None
    """Summary of the tenant's state."""
    observed_generation: Int64 | None = None
    """metadata.generation of the spec the status describes."""
    cell: str | None = None
    """Cell the tenant is placed in."""
    epoch: Int64 | None = None
    """Epoch of the placement record; grows with every placement and move."""
    tenant_id: str | None = None
    """The tenant's id inside its cell."""
    api_endpoint: str | None = None
    """URL of the job API the tenant's clients call."""
    api_key_secret: str | None = None
    """Secret in the tenant's namespace holding its API key."""
    quotas: TenantQuotas | None = None
    """The quotas in force: the plan's defaults with spec.quotas applied."""
    conditions: ConditionList | None = None
    """Ready, Placed and the other aspects of the tenant's state."""


# ----------------------------------------------------------------- TenantMove

MovePhase = Literal["Pending", "Copying", "CatchingUp", "CuttingOver", "Verifying", "Completed",
                    "Aborted", "Failed"]


class TenantMoveSpec(ApiModel):
    """Moves a tenant to another cell with a bounded write pause, losing and doubling nothing."""

    model_config = ConfigDict(json_schema_extra=cel(
        Rule("has(self.targetCell) != has(self.targetRegion)",
             "set exactly one of targetCell and targetRegion (any shared cell in that region)"),
        _pin_unchanged("targetCell", "targetCell is immutable; create a new TenantMove"),
        _pin_unchanged("targetRegion", "targetRegion is immutable; create a new TenantMove"),
    ))

    tenant: DnsLabel = Field(json_schema_extra=cel(_immutable(
        "tenant is immutable; create a new TenantMove")))
    """Name of the Tenant to move, in this TenantMove's namespace."""
    target_cell: DnsLabel | None = None
    """Cell to move the tenant to."""
    target_region: DnsLabel | None = None
    """Region to move the tenant to: placement picks a shared cell there."""
    max_write_pause_seconds: float = Field(default=2, ge=0.1, le=60)
    """Longest the tenant's writes may be paused at cutover; the move waits for a
    delta small enough to copy within it."""
    abort: bool = Field(default=False, json_schema_extra=cel(Rule("!oldSelf || self",
                                                          "abort cannot be undone")))
    """Stop the move and leave the tenant in its source cell (only before cutover)."""
    retain_source_for_seconds: Integer = Field(default=86400, ge=0, le=2592000)
    """How long the source cell keeps the tenant's data, disabled, after a completed move."""


class TableProgress(ApiModel):
    """Copy progress of one table."""

    table: str
    """Table name."""
    copied: Integer | None = None
    """Rows copied so far."""
    total: Integer | None = None
    """Rows to copy (at the snapshot)."""


class MoveProgress(ApiModel):
    """How far the move has come."""

    rows_copied: Integer | None = None
    """Rows copied so far, over all tables."""
    rows_total: Integer | None = None
    """Rows to copy (at the snapshot), over all tables."""
    current_delta: Integer | None = None
    """Changes made in the source since the last catch-up round."""
    pause_seconds: float | None = None
    """Length of the write pause at cutover, once it happened."""
    tables: tuple[TableProgress, ...] | None = Field(default=None,
                                                     json_schema_extra=list_map("table"))
    """Per-table progress."""


class TenantMoveStatus(ApiModel):
    """The observed move, written by the placement leader."""

    phase: MovePhase | None = None
    """Step the move is in."""
    observed_generation: Int64 | None = None
    """metadata.generation of the spec the status describes."""
    source_cell: str | None = None
    """Cell the tenant is moved out of."""
    target_cell: str | None = None
    """Cell the tenant is moved into (chosen by placement when spec.targetRegion is set)."""
    source_cell_epoch: Int64 | None = None
    """The source cell's placement-group epoch the copy began under: a takeover in the
    cell since (a new primary) starts the copy again."""
    target_cell_epoch: Int64 | None = None
    """The target cell's placement-group epoch the copy began under."""
    progress: MoveProgress | None = None
    """How far the move has come."""
    conditions: ConditionList | None = None
    """Accepted, Progressing and Completed: the aspects of the move's state."""
