"""The cell's Prometheus metrics; docs/metrics.md is their reference (a unit test keeps it whole)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "WRITES_REJECTED", "CLAIMS", "SUBMISSIONS_REFUSED", "TENANT_REFUSALS", "STEP_CALLS",
    "DELIVERIES", "SCHEDULE_DISPATCH_LAG", "CLAIM_LAG", "TARGET_DEFERRALS", "REAPER_CLAIMS",
    "QueueCollector",
    "TargetLimitCollector", "refuse_submission",
]

WRITES_REJECTED = Counter(
    "cellplane_cell_writes_rejected_total",
    "Writes the cell database refused because the writer's placement-group epoch was stale, "
    "its lease deadline had passed, or it declared no epoch; or because the tenant was "
    "frozen for a move or moved out (reason tenant_fenced).",
    ["reason"],
)
CLAIMS = Counter("cellplane_cell_claims_total", "Jobs claimed by workers.", ["tenant"])
SUBMISSIONS_REFUSED = Counter(
    "cellplane_cell_submissions_refused_total", "Job submissions refused, by reason.", ["reason"]
)
TENANT_REFUSALS = Counter(
    "cellplane_cell_tenant_refusals_total",
    "Submissions refused per tenant with 429 (reason rate_limited) or 402 (reason "
    "insufficient_funds): who is hitting their limits.",
    ["tenant", "reason"],
)
_PER_TENANT_REASONS = frozenset({"rate_limited", "insufficient_funds"})
STEP_CALLS = Histogram("cellplane_cell_step_call_seconds", "Duration of step calls to targets.",
                       ["outcome"])
DELIVERIES = Counter("cellplane_cell_webhook_deliveries_total", "Webhook delivery attempts.",
                     ["outcome"])

SCHEDULE_DISPATCH_LAG = Histogram(
    "cellplane_cell_schedule_dispatch_lag_seconds",
    "From an occurrence's dispatch time (its scheduled time plus its offset in the dispatch "
    "window) to its job being queued, by the database's clock; a run caught up after an "
    "outage or a pause counts its whole lateness.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0),
)

CLAIM_LAG = Histogram(
    "cellplane_cell_claim_lag_seconds",
    "From a job being due (queued, or its retry's time) to a worker claiming it, by the "
    "database's clock, per priority class: how long a class waited for a slot.",
    ["priority"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0),
)

REAPER_CLAIMS = Counter(
    "cellplane_cell_reaper_claims_total",
    "Expired claims the reaper took back (reaped), gave a lease of grace after the cell's own "
    "outage (graced), or left for a later pass to keep a storm's pace (paced).",
    ["action"],
)
TARGET_DEFERRALS = Counter(
    "cellplane_cell_target_deferrals_total",
    "Jobs sent back to the queue without an attempt because their target could not be "
    "called: held by a Retry-After (held), its breaker open (open), or every slot its "
    "limit gives taken (limit).",
    ["reason"],
)


def refuse_submission(reason: str, tenant_id: str) -> None:
    """Counts a refused submission; per tenant too when it is a 429 or a 402."""
    SUBMISSIONS_REFUSED.labels(reason).inc()
    if reason in _PER_TENANT_REASONS:
        TENANT_REFUSALS.labels(tenant_id, reason).inc()


class QueueCollector(Collector):
    """Per-tenant queue age, queue depth and slots in use, read from the database at scrape time.

    Read at scrape rather than kept in gauges, so every process of the cell
    reports the same truth and a tenant that moved away stops being reported.
    """

    def __init__(self, read_stats: Any) -> None:
        self._read_stats = read_stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        age = GaugeMetricFamily("cellplane_cell_queue_age_seconds",
                                "Age of the oldest queued job, per tenant.", labels=["tenant"])
        depth = GaugeMetricFamily("cellplane_cell_queued_jobs", "Queued jobs, per tenant.",
                                  labels=["tenant"])
        running = GaugeMetricFamily("cellplane_cell_running_jobs",
                                    "Running jobs (slots in use), per tenant.", labels=["tenant"])
        cap = GaugeMetricFamily("cellplane_cell_running_cap", "Running-jobs cap, per tenant.",
                                labels=["tenant"])
        for row in self._read_stats():
            tenant = str(row["tenant_id"])
            age.add_metric([tenant], float(row["oldest_queued_seconds"]))
            depth.add_metric([tenant], float(row["queued"]))
            running.add_metric([tenant], float(row["running"]))
            cap.add_metric([tenant], float(row["max_running_jobs"]))
        yield from (age, depth, running, cap)


def register_queue_collector(registry: CollectorRegistry, read_stats: Any) -> QueueCollector:
    collector = QueueCollector(read_stats)
    registry.register(collector)
    return collector


class TargetLimitCollector(Collector):
    """Per target, its AIMD limit and its calls in flight, read from the database at scrape time
    (every worker of the cell shares them: no process's own view is the truth)."""

    def __init__(self, read_limits: Any) -> None:
        self._read_limits = read_limits

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["tenant", "target"]
        limit = GaugeMetricFamily("cellplane_cell_target_concurrency_limit",
                                  "A target's AIMD concurrency limit (a real number; the "
                                  "calls allowed are its whole part).", labels=labels)
        in_flight = GaugeMetricFamily("cellplane_cell_target_calls_in_flight",
                                      "Calls to a target in flight, from every worker.",
                                      labels=labels)
        open_ = GaugeMetricFamily("cellplane_cell_target_breaker_open",
                                  "1 while a target's circuit breaker is open, else 0.",
                                  labels=labels)
        for row in self._read_limits():
            key = [str(row["tenant_id"]), str(row["target"])]
            limit.add_metric(key, float(row["concurrency_limit"]))
            in_flight.add_metric(key, float(row["in_flight"]))
            open_.add_metric(key, 1.0 if row["breaker"] == "open" else 0.0)
        yield from (limit, in_flight, open_)
