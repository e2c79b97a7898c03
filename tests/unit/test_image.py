"""The operator image (Dockerfile) cannot drift from what it serves: the chart's pods
run as the image's user and mount the directory it owns, the image carries the
PostgreSQL major the project pins, and its build context holds every path the wheel
is built from. No Docker engine runs here, so the build itself is not tested in CI;
README's "Running the chart on a real cluster" says how it was checked."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "cellplane"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _args() -> dict[str, str]:
    """The ARGs' defaults (declared before the first FROM; a stage's bare ARG uses them)."""
    return dict(rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest)


def _copied_sources() -> list[str]:
    sources = []
    for word, rest in _instructions():
        if word == "COPY" and "--from=" not in rest:  # --from copies from a stage
            *parts, _destination = rest.split()
            sources += [part.rstrip("/") for part in parts if not part.startswith("--")]
    return sources


def _versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO / "hack" / "versions.env").read_text()
             .splitlines() if line and not line.startswith("#"))
    return dict(pairs)


def test_the_image_user_is_the_charts_pod_user() -> None:
    context = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    uid = int(_args()["CELLPLANE_UID"])
    assert uid != 0, "PostgreSQL refuses to run as root"
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, uid, uid)
    assert ("USER", "${CELLPLANE_UID}:${CELLPLANE_UID}") in _instructions()


def test_the_image_carries_the_pinned_postgres_major() -> None:
    assert _args()["POSTGRES_MAJOR"] == _versions()["POSTGRES_MAJOR"]
    frm = [rest for word, rest in _instructions() if word == "FROM"]
    # Debian 12 ships PostgreSQL 15 and Python 3.11; another base changes both. The other
    # stages build on that one.
    assert frm == ["debian:bookworm-slim AS system", "system AS requirements", "system"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"


def test_the_chart_runs_the_images_command_with_its_state_directory() -> None:
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    entrypoint = [json.loads(rest) for word, rest in _instructions() if word == "ENTRYPOINT"]
    assert entrypoint == [["cellplane"]]
    assert "command: [cellplane]" in deployment
    assert "mountPath: /var/lib/cellplane" in deployment
    assert "--state-dir=/var/lib/cellplane/sites" in deployment
    assert "chown \"${CELLPLANE_UID}:${CELLPLANE_UID}\" /var/lib/cellplane" in \
        (REPO / "Dockerfile").read_text()


def test_the_build_context_holds_every_path_the_wheel_is_built_from() -> None:
    hatch = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    wheel = hatch["targets"]["wheel"]
    needed = {"pyproject.toml", "README.md", *wheel["packages"], *wheel["force-include"]}
    copied = set(_copied_sources())
    assert needed <= copied, f"the Dockerfile does not COPY {sorted(needed - copied)}"
    kept = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
            if line.startswith("!")}
    assert copied <= kept, f".dockerignore leaves out {sorted(copied - kept)}"


def test_the_local_cluster_builds_the_image_the_chart_names() -> None:
    # hack/images.sh tags the image localhost/<the chart's repository>:<appVersion>, so
    # the chart installed on the local cluster needs only image.repository's localhost/.
    from cellplane_operator.localplane.images import OPERATOR_REPOSITORY, operator_reference

    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert OPERATOR_REPOSITORY == f"localhost/{values['repository']}"
    assert operator_reference(REPO) == f"{OPERATOR_REPOSITORY}:{app_version}"


def test_the_dependencies_are_installed_before_the_sources_are_copied() -> None:
    # A change of Python alone then rebuilds only the layers after the sources' COPY
    # (seconds); a source COPY before the pip install of the dependencies would make
    # every rebuild download and install them all again.
    steps = _instructions()
    first_source_copy = next(i for i, (word, rest) in enumerate(steps)
                             if word == "COPY" and "operator/cellplane_operator" in rest)
    dependencies = next(i for i, (word, rest) in enumerate(steps)
                        if word == "RUN" and "pip install --no-cache-dir -r" in rest)
    assert dependencies < first_source_copy
    # Only the list of dependencies reaches that layer, not the whole pyproject.toml.
    last_stage = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    assert [rest.split() for word, rest in steps[last_stage:dependencies] if word == "COPY"] == \
        [["--from=requirements", "/requirements.txt", "/tmp/requirements.txt"]]
    assert any("--no-deps" in rest for word, rest in steps[first_source_copy:] if word == "RUN")
