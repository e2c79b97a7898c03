"""The cell's Prometheus metrics (a reference lives in docs with the interfaces issue)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "WRITES_REJECTED", "CLAIMS", "SUBMISSIONS_REFUSED", "QUEUE_AGE", "RUNNING", "STEP_CALLS",
    "DELIVERIES",
]

WRITES_REJECTED = Counter(
    "cellplane_cell_writes_rejected_total",
    "Writes the cell database refused because the writer's placement-group epoch was stale, "
    "its lease deadline had passed, or it declared no epoch.",
    ["reason"],
)
CLAIMS = Counter("cellplane_cell_claims_total", "Jobs claimed by workers.", ["tenant"])
SUBMISSIONS_REFUSED = Counter(
    "cellplane_cell_submissions_refused_total", "Job submissions refused, by reason.", ["reason"]
)
QUEUE_AGE = Gauge(
    "cellplane_cell_queue_age_seconds", "Age of the oldest queued job, per tenant.", ["tenant"]
)
RUNNING = Gauge("cellplane_cell_running_jobs", "Running jobs (slots in use), per tenant.",
                ["tenant"])
STEP_CALLS = Histogram("cellplane_cell_step_call_seconds", "Duration of step calls to targets.",
                       ["outcome"])
DELIVERIES = Counter("cellplane_cell_webhook_deliveries_total", "Webhook delivery attempts.",
                     ["outcome"])
