"""The operator's kubernetes-driver settings: flags with environment defaults, and the
cells' default resources validated at start-up with a message that says where."""

from __future__ import annotations

import json
import re

import pytest

from cellplane_operator.commands import main as cli
from cellplane_operator.api.v1alpha1 import CellResources, ResourceList, ResourceRequirements
from cellplane_operator.settings import OperatorSettings, parse_cell_resources

CHART_DEFAULTS = {
    "database": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    "api": {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}},
    "worker": {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}},
}


def test_cell_resources_parse_as_the_cells_own_model() -> None:
    parsed = parse_cell_resources(json.dumps(CHART_DEFAULTS))
    assert parsed.database == ResourceRequirements(
        requests=ResourceList(cpu="250m", memory="512Mi"), limits=ResourceList(memory="1Gi"))
    assert parsed.api == parsed.worker
    assert parse_cell_resources("") == CellResources()
    assert parse_cell_resources('{"worker": {"limits": {"cpu": "2"}}}').database is None


@pytest.mark.parametrize(("text", "message"), [
    ("{database:", "not JSON"),
    ('["database"]', "expected a JSON object"),
    ('{"db": {}}', "unknown keys: db (expected one of api, database, worker)"),
    ('{"api": {"request": {}}}', "unknown keys: api.request (expected one of limits, requests)"),
    ('{"api": {"limits": {"gpu": "1"}}}', "api.limits.gpu (expected one of cpu, memory)"),
    ('{"api": {"limits": {"memory": "1 GB"}}}', "api.limits.memory: String should match"),
], ids=["not-json", "not-object", "container", "part", "amount", "quantity"])
def test_bad_cell_resources_say_what_and_where(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_cell_resources(text)


def test_cell_namespace_defaults_to_the_operators() -> None:
    assert OperatorSettings(region="region-a", namespace="ops").cell_namespace == "ops"
    assert OperatorSettings(region="region-a", namespace="ops",
                            cell_namespace="cells").cell_namespace == "cells"
    defaults = OperatorSettings(region="region-a")
    assert (defaults.cell_image, defaults.cell_image_pull_policy, defaults.cell_storage_class) \
        == ("", "IfNotPresent", "")
    assert defaults.cell_resources == CellResources()


def test_operator_flags_and_their_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli._parser().parse_args(["operator"])
    assert (args.cell_image, args.cell_image_pull_policy, args.cell_namespace,
            args.cell_storage_class, args.cell_resources) == ("", "IfNotPresent", "", "", "")
    for name, value in (("CELLPLANE_CELL_IMAGE", "registry.example/cellplane:1"),
                        ("CELLPLANE_CELL_IMAGE_PULL_POLICY", "Never"),
                        ("CELLPLANE_CELL_NAMESPACE", "cells"),
                        ("CELLPLANE_CELL_STORAGE_CLASS", "fast"),
                        ("CELLPLANE_CELL_RESOURCES", '{"api": {}}')):
        monkeypatch.setenv(name, value)
    args = cli._parser().parse_args(["operator"])
    assert (args.cell_image, args.cell_image_pull_policy, args.cell_namespace,
            args.cell_storage_class, args.cell_resources) == (
        "registry.example/cellplane:1", "Never", "cells", "fast", '{"api": {}}')
    args = cli._parser().parse_args(["operator", "--cell-image=x:2", "--cell-namespace=other"])
    assert (args.cell_image, args.cell_namespace) == ("x:2", "other")
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["operator", "--cell-image-pull-policy=Sometimes"])


def test_the_operator_refuses_bad_cell_resources_before_starting(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["operator", "--etcd=127.0.0.1:1", "--cell-resources={\"db\": {}}"])
    assert code == cli.EXIT_USAGE
    assert "--cell-resources (or CELLPLANE_CELL_RESOURCES): unknown keys: db" in \
        capsys.readouterr().err
