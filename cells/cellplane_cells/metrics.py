"""The cell's Prometheus metrics (a reference lives in docs with the interfaces issue)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "WRITES_REJECTED", "CLAIMS", "SUBMISSIONS_REFUSED", "STEP_CALLS", "DELIVERIES",
    "QueueCollector",
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
STEP_CALLS = Histogram("cellplane_cell_step_call_seconds", "Duration of step calls to targets.",
                       ["outcome"])
DELIVERIES = Counter("cellplane_cell_webhook_deliveries_total", "Webhook delivery attempts.",
                     ["outcome"])


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
            cap.add_metric([tenant], float(row["max_running"]))
        yield from (age, depth, running, cap)


def register_queue_collector(registry: CollectorRegistry, read_stats: Any) -> QueueCollector:
    collector = QueueCollector(read_stats)
    registry.register(collector)
    return collector
