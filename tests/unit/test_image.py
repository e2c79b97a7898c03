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
    return dict(rest.split("=", 1) for word, rest in _instructions() if word == "ARG")


def _copied_sources() -> list[str]:
    sources = []
    for word, rest in _instructions():
        if word == "COPY":
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
    # Debian 12 ships PostgreSQL 15 and Python 3.11; another base changes both.
    assert frm == ["debian:bookworm-slim"]
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
