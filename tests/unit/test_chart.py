"""charts/cellplane cannot drift from the project: its CRDs and admission policy are
the project's own files byte for byte, its appVersion is the package's version,
and every value it takes is explained. Rendering and applying the chart is
tests/integration/test_helm_chart.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "cellplane"
COPY_CRDS = "cp crds/*.yaml charts/cellplane/crds/"
COPY_POLICY = "cp deploy/admission/cell-deletion.yaml charts/cellplane/files/"
# A mapping key in values.yaml, also the first key of a list item ("- name: ...").
VALUE_KEY = re.compile(r"^\s*(- )?[A-Za-z][\w.-]*:")


def test_chart_crds_are_the_generated_crds_byte_for_byte() -> None:
    generated = {path.name: path.read_bytes() for path in (REPO / "crds").glob("*.yaml")}
    in_chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert generated, "no CRDs in crds/"
    assert set(in_chart) == set(generated), f"charts/cellplane/crds/ differs in files: {COPY_CRDS}"
    stale = sorted(name for name in generated if in_chart[name] != generated[name])
    assert not stale, f"charts/cellplane/crds/ is stale ({', '.join(stale)}): {COPY_CRDS}"


def test_chart_admission_policy_is_the_deployed_one_byte_for_byte() -> None:
    deployed = REPO / "deploy" / "admission" / "cell-deletion.yaml"
    copied = CHART / "files" / "cell-deletion.yaml"
    assert copied.read_bytes() == deployed.read_bytes(), f"charts/cellplane/files/ is stale: {COPY_POLICY}"
    assert sorted(p.name for p in (REPO / "deploy" / "admission").glob("*.yaml")) == \
        ["cell-deletion.yaml"], "a new admission manifest needs a place in the chart"


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]


def test_every_value_has_a_comment_right_above_it() -> None:
    uncommented: list[str] = []
    previous = ""
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), start=1):
        if VALUE_KEY.match(line) and "#" not in previous:
            uncommented.append(f"{number}: {line.strip()}")
        if line.strip():
            previous = line
    assert not uncommented, f"values.yaml keys without a comment: {uncommented}"


def test_a_refusal_is_told_from_a_timestamp_that_ends_in_403() -> None:
    from chartinstall import REFUSAL

    assert not REFUSAL.search("2026-11-29 20:21:21,403 INFO kopf.objects: Handler 'cell_event' "
                              "succeeded.")
    assert REFUSAL.search("PATCH /apis/cellplane.io/v1alpha1/tenants/x/status: 403 Forbidden: "
                          "tenants.cellplane.io \"x\" is forbidden")
    assert REFUSAL.search("kopf._core.actions.application: Not enough permissions to patch")
