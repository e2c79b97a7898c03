"""Prometheus metrics of the regional operator and of the edge router.

Each process kind has a registry of its own, so the operator's ``/metrics``
(``cellplane operator --metrics-port``) shows ownership, leases, takeovers,
moves and standbys, and the router's (``cellplane router --metrics-port``) shows
requests, holds and retries, even where both run in one process (tests).
``docs/metrics.md`` is the reference; ``tests/unit/test_metrics_reference.py``
fails when it and the definitions here differ.

The metric objects are module-level, the way prometheus_client is meant to be
used (they are thread-safe sinks, not configuration); the code that records
them calls the small helpers below, so which labels a metric takes is decided
here once. Labels are bounded sets: a cell, a region, a phase, a reason, an
HTTP code class. Only the router's 429/402 counter is per tenant, as the
cells' queue metrics are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from cellplane_operator.domain.moves import MovePhase
from cellplane_operator.domain.ownership import LeaseState, Role

__all__ = [
    "OPERATOR_REGISTRY", "ROUTER_REGISTRY", "HolderMetrics", "SelfFenceReason",
    "takeover_served", "standby_observed", "standby_gone", "moves_by_phase", "count_moves",
    "move_phase_written", "move_paused", "old_primary_fenced", "old_primary_rebuilt",
    "placement_written", "code_class", "router_answered", "router_refused_for_tenant",
    "router_hold_started", "router_hold_ended", "router_retried",
]

OPERATOR_REGISTRY = CollectorRegistry()
ROUTER_REGISTRY = CollectorRegistry()
ProcessCollector(registry=OPERATOR_REGISTRY)
ProcessCollector(registry=ROUTER_REGISTRY)

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_TAKEOVER_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 12.5, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_PAUSE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0)

# -- the operator ------------------------------------------------------------------

GROUP_OWNED = Gauge(
    "cellplane_operator_group_owned",
    "1 while this region's holder owns the group's lease in etcd, else 0. kind=cell: a "
    "cell's placement group; kind=election: the placement election (group=placement).",
    ["kind", "group", "region"], registry=OPERATOR_REGISTRY)
GROUP_EPOCH = Gauge(
    "cellplane_operator_group_epoch",
    "The epoch this region owns the group under, or else the highest epoch it has seen.",
    ["kind", "group", "region"], registry=OPERATOR_REGISTRY)
LEASE_RENEW_SECONDS = Histogram(
    "cellplane_operator_lease_renew_seconds",
    "One lease renewal (etcd keep-alive), from sending it to its acknowledgement.",
    ["kind"], buckets=_LATENCY_BUCKETS, registry=OPERATOR_REGISTRY)
LEASE_RENEW_FAILURES = Counter(
    "cellplane_operator_lease_renew_failures_total",
    "Lease renewals that etcd did not acknowledge (timed out or refused).",
    ["kind"], registry=OPERATOR_REGISTRY)
SELF_FENCES = Counter(
    "cellplane_operator_self_fences_total",
    "Times this region's holder stopped a group's work on its own: no renewal confirmed "
    "before the lease's end less the margin while etcd failed (etcd_unreachable) or "
    "answered late (renewal_late), or its owner key was gone or taken (ownership_lost).",
    ["kind", "group", "region", "reason"], registry=OPERATOR_REGISTRY)
TAKEOVERS = Counter(
    "cellplane_operator_takeovers_total",
    "Cells this region's standby took over and now serves: failover (the owner was lost) "
    "or switchover (a planned handover).",
    ["cell", "region", "type"], registry=OPERATOR_REGISTRY)
TAKEOVER_SECONDS = Histogram(
    "cellplane_operator_takeover_seconds",
    "From the previous owner's end (its owner key seen gone, or handed over) to this "
    "region's site serving the cell: the control plane's part of the RTO.",
    ["type"], buckets=_TAKEOVER_BUCKETS, registry=OPERATOR_REGISTRY)
PROMOTION_SECONDS = Histogram(
    "cellplane_operator_promotion_seconds",
    "Of a takeover, the promotion of the standby database (and its checkpoint).",
    ["type"], buckets=_TAKEOVER_BUCKETS, registry=OPERATOR_REGISTRY)
OLD_PRIMARY_FENCES = Counter(
    "cellplane_operator_old_primary_fences_total",
    "Old primaries of this region fenced (pg_hba reject, sessions ended, stopped) after "
    "another region took the cell.",
    ["cell", "region"], registry=OPERATOR_REGISTRY)
OLD_PRIMARY_REBUILDS = Counter(
    "cellplane_operator_old_primary_rebuilds_total",
    "Old primaries (fenced after a failover, or demoted by a switchover) rebuilt as "
    "standbys of the new primary, by method (pg_rewind or base_backup).",
    ["cell", "region", "method"], registry=OPERATOR_REGISTRY)
STANDBY_LAG = Gauge(
    "cellplane_operator_standby_lag_seconds",
    "Replay lag of this region's standby site of the cell (absent while unknown).",
    ["cell", "region"], registry=OPERATOR_REGISTRY)
STANDBY_STREAMING = Gauge(
    "cellplane_operator_standby_streaming",
    "1 while this region's standby site of the cell streams from the primary, else 0.",
    ["cell", "region"], registry=OPERATOR_REGISTRY)
MOVE_TRANSITIONS = Counter(
    "cellplane_operator_move_phase_transitions_total",
    "TenantMove phases written by this operator (as placement leader), by the phase entered.",
    ["phase"], registry=OPERATOR_REGISTRY)
MOVES = Gauge(
    "cellplane_operator_moves",
    "TenantMoves by phase, as this operator's watch sees them (every operator reports the "
    "same numbers: aggregate with max).",
    ["phase"], registry=OPERATOR_REGISTRY)
MOVE_WRITE_PAUSE = Histogram(
    "cellplane_operator_move_write_pause_seconds",
    "A completed move's write pause: from marking the tenant moving to the target serving it.",
    buckets=_PAUSE_BUCKETS, registry=OPERATOR_REGISTRY)
PLACEMENT_WRITES = Counter(
    "cellplane_operator_placement_writes_total",
    "Compare-and-swap writes of tenant placement records in etcd: operation place, update "
    "or remove; result applied, or refused (the record or the election changed).",
    ["operation", "result"], registry=OPERATOR_REGISTRY)


class SelfFenceReason:
    ETCD_UNREACHABLE = "etcd_unreachable"
    RENEWAL_LATE = "renewal_late"
    OWNERSHIP_LOST = "ownership_lost"


class HolderMetrics:
    """What one lease holder records, under its group's labels."""

    def __init__(self, *, kind: str, group: str, region: str) -> None:
        self._kind = kind
        self._labels = (kind, group, region)
        self._closed = False

    def observe(self, state: LeaseState) -> None:
        """The holder's state changed: ownership and epoch follow it."""
        if self._closed:
            return
        owner = state.role is Role.OWNER
        GROUP_OWNED.labels(*self._labels).set(1 if owner else 0)
        epoch = state.epoch if owner and state.epoch is not None else state.epoch_seen
        GROUP_EPOCH.labels(*self._labels).set(epoch)

    def renewed(self, seconds: float) -> None:
        LEASE_RENEW_SECONDS.labels(self._kind).observe(seconds)

    def renewal_failed(self) -> None:
        LEASE_RENEW_FAILURES.labels(self._kind).inc()

    def self_fenced(self, reason: str) -> None:
        SELF_FENCES.labels(*self._labels, reason).inc()

    def close(self) -> None:
        """The holder is done with the group (the cell is gone from this region, or the
        process stops): its gauges go, so a scrape does not show a stale owner."""
        self._closed = True
        for gauge in (GROUP_OWNED, GROUP_EPOCH):
            with contextlib.suppress(KeyError):
                gauge.remove(*self._labels)


def takeover_served(cell: str, region: str, *, planned: bool, seconds: float,
                    promoted_in: float) -> None:
    kind = "switchover" if planned else "failover"
    TAKEOVERS.labels(cell, region, kind).inc()
    TAKEOVER_SECONDS.labels(kind).observe(seconds)
    PROMOTION_SECONDS.labels(kind).observe(promoted_in)


def standby_observed(cell: str, region: str, *, streaming: bool, lag_seconds: float | None) -> None:
    STANDBY_STREAMING.labels(cell, region).set(1 if streaming else 0)
    if lag_seconds is None:
        with contextlib.suppress(KeyError):
            STANDBY_LAG.remove(cell, region)
    else:
        STANDBY_LAG.labels(cell, region).set(lag_seconds)


def standby_gone(cell: str, region: str) -> None:
    """The site is no standby any more (promoted, or the cell is gone)."""
    for gauge in (STANDBY_LAG, STANDBY_STREAMING):
        with contextlib.suppress(KeyError):
            gauge.remove(cell, region)


def moves_by_phase(phases: Iterable[str | None]) -> dict[str, int]:
    """How many moves are in each phase (every phase listed; a move without one is Pending)."""
    counts = {phase.value: 0 for phase in MovePhase}
    for phase in phases:
        name = phase or MovePhase.PENDING.value
        if name in counts:
            counts[name] += 1
    return counts


def count_moves(phases: Iterable[str | None]) -> None:
    for phase, count in moves_by_phase(phases).items():
        MOVES.labels(phase).set(count)


def move_phase_written(before: str | None, after: str) -> None:
    if before != after:
        MOVE_TRANSITIONS.labels(after).inc()


def move_paused(seconds: float) -> None:
    MOVE_WRITE_PAUSE.observe(seconds)


def old_primary_fenced(cell: str, region: str) -> None:
    OLD_PRIMARY_FENCES.labels(cell, region).inc()


def old_primary_rebuilt(cell: str, region: str, method: str) -> None:
    OLD_PRIMARY_REBUILDS.labels(cell, region, method.replace(" ", "_")).inc()


def placement_written(operation: str, applied: bool) -> None:
    PLACEMENT_WRITES.labels(operation, "applied" if applied else "refused").inc()


# -- the edge router ---------------------------------------------------------------

ROUTER_REQUESTS = Counter(
    "cellplane_router_requests_total",
    "Requests answered by the router, by status code class and outcome: forwarded (the "
    "cell's answer, whatever its code), unauthenticated (no tenant key), unknown_tenant, "
    "hold_timeout (503: no owner or a cutover outlasted the hold), cell_unreachable (503), "
    "refused (400 a control character, 404 not a tenant API route, 405), body_too_large "
    "(413), internal (500).",
    ["code_class", "outcome"], registry=ROUTER_REGISTRY)
ROUTER_TENANT_REFUSALS = Counter(
    "cellplane_router_tenant_refusals_total",
    "Cell answers 429 (rate limited) and 402 (insufficient funds) passed through, per tenant.",
    ["tenant", "code"], registry=ROUTER_REGISTRY)
ROUTER_HOLDS = Counter(
    "cellplane_router_holds_total",
    "Requests held because the tenant had no route yet: NoOwner (a takeover), "
    "SiteNotServing (a start), Moving (a move's cutover).",
    ["reason"], registry=ROUTER_REGISTRY)
ROUTER_HELD = Gauge(
    "cellplane_router_held_requests",
    "Requests being held right now.", registry=ROUTER_REGISTRY)
ROUTER_HOLD_SECONDS = Histogram(
    "cellplane_router_hold_seconds",
    "How long a held request waited, by how the hold ended: routed, or timed_out (503).",
    ["outcome"], buckets=_HOLD_BUCKETS, registry=ROUTER_REGISTRY)
ROUTER_RETRIES = Counter(
    "cellplane_router_stale_route_retries_total",
    "Requests asked again after the map moved, by why the first site refused: its error "
    "code (not_owner, stale_epoch, lease_expired, database_unavailable, tenant_moving, "
    "tenant_moved) or unreachable.",
    ["reason"], registry=ROUTER_REGISTRY)


def code_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def router_answered(status: int, outcome: str) -> None:
    ROUTER_REQUESTS.labels(code_class(status), outcome).inc()


def router_refused_for_tenant(tenant_id: str, status: int) -> None:
    if status in (402, 429):
        ROUTER_TENANT_REFUSALS.labels(tenant_id, str(status)).inc()


def router_hold_started(reason: str) -> None:
    ROUTER_HOLDS.labels(reason).inc()
    ROUTER_HELD.inc()


def router_hold_ended(seconds: float, *, routed: bool | None) -> None:
    """``routed`` None: the request went away (the client left) while held."""
    ROUTER_HELD.dec()
    if routed is not None:
        ROUTER_HOLD_SECONDS.labels("routed" if routed else "timed_out").observe(seconds)


def router_retried(reason: str | None) -> None:
    ROUTER_RETRIES.labels(reason or "unreachable").inc()
