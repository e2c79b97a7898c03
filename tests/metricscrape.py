"""Scraping a /metrics endpoint in tests: every sample by (name, labels), and a wait on one."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cellplane_operator.localplane.process import wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    response = httpx.get(url, headers=headers, timeout=5)
    response.raise_for_status()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def await_metric(url: str, name: str, holds: Any, *, headers: dict[str, str] | None = None,
                 timeout: float = 60, **labels: str) -> Samples:
    """Scrapes ``url`` until ``holds(value)`` is true for the sample; the last scrape."""
    last: dict[str, Any] = {}

    def check() -> bool:
        samples = scrape(url, headers)
        last["samples"], last["value"] = samples, value(samples, name, **labels)
        return last["value"] is not None and bool(holds(last["value"]))

    wait_for(check, timeout=timeout, interval=0.2,
             what=f"{name}{labels} to reach the expected value (last: {last.get('value')})")
    samples: Samples = last["samples"]
    return samples
