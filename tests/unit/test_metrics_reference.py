"""docs/metrics.md lists exactly the metrics the operator, the router and the cells define."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

import cellplane_cells.metrics as cell_metrics
from cellplane_operator.metrics import OPERATOR_REGISTRY, ROUTER_REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(cellplane_[a-z_]+)` \| (\w+) \|", re.MULTILINE)


def _exposed(families: Iterable[Metric], prefix: str) -> dict[str, str]:
    """Metric name as scraped (a counter's ``_total`` included) -> type."""
    found = {}
    for family in families:
        if family.name.startswith(prefix):
            name = family.name + "_total" if family.type == "counter" else family.name
            found[name] = family.type
    return found


def _documented() -> dict[str, str]:
    return {name: kind for name, kind in _ROW.findall(DOC.read_text())}


def _defined() -> dict[str, str]:
    queue = cell_metrics.QueueCollector(lambda: [])
    targets = cell_metrics.TargetLimitCollector(lambda: [])
    return {
        **_exposed(OPERATOR_REGISTRY.collect(), "cellplane_operator_"),
        **_exposed(ROUTER_REGISTRY.collect(), "cellplane_router_"),
        **_exposed(REGISTRY.collect(), "cellplane_cell_"),
        **_exposed(queue.collect(), "cellplane_cell_"),
        **_exposed(targets.collect(), "cellplane_cell_"),
    }


def test_every_defined_metric_is_documented_with_its_type() -> None:
    documented = _documented()
    missing = {name: kind for name, kind in _defined().items() if documented.get(name) != kind}
    assert not missing, f"add these to docs/metrics.md (name: type): {missing}"


def test_every_documented_metric_is_defined() -> None:
    defined = _defined()
    stale = sorted(set(_documented()) - set(defined))
    assert not stale, f"docs/metrics.md lists metrics no code defines: {stale}"


def test_each_process_keeps_to_its_own_prefix() -> None:
    assert set(_exposed(OPERATOR_REGISTRY.collect(), "cellplane_")) == set(
        _exposed(OPERATOR_REGISTRY.collect(), "cellplane_operator_"))
    assert set(_exposed(ROUTER_REGISTRY.collect(), "cellplane_")) == set(
        _exposed(ROUTER_REGISTRY.collect(), "cellplane_router_"))
    # The cells' default registry holds no operator or router metric.
    assert not _exposed(REGISTRY.collect(), "cellplane_operator_")
    assert not _exposed(REGISTRY.collect(), "cellplane_router_")
