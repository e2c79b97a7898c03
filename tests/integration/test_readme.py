"""The README's tour, word for word, as a new user runs it.

Every command of the README's ``sh`` blocks and every ``yaml`` block, in README order,
against a real plane: a 3-member etcd, the kube-apiserver and the regional operators of
region-a and region-b (the tour's cells live in region-a with a standby in region-b).
``export`` lines run in bash as written and their environment is kept for the commands
after them (so ``kubectl`` is the pinned one the README's PATH line finds, and the plugin
the virtualenv's); ``kubectl ...`` lines run in bash as written, from the repository root,
with ``$KUBECONFIG`` naming the plane, and must exit 0; a manifest is applied verbatim
with ``kubectl apply -f -``. Where the README shows output (a ``text`` block after the
command), every line of it must be among the lines printed, compared word by word, with
durations (ages, lags, pauses) free to differ, and a line ending in ``...`` matching any
line that begins with its words; a command that only reads status may be
run again for a while until it does, as a reader would look again.

The commands this cannot run (the quick start's two, which set up and run everything
themselves) are in ``ELSEWHERE`` of tests/unit/test_readme.py, with where each is run;
that unit test fails when the README gains a command neither covers.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from cellplane_operator.localplane import LocalControlPlane
from regionplane import RegionPlane, ready_cell

REPO = Path(__file__).resolve().parents[2]
REGIONS = ("region-a", "region-b", "region-c")
OPERATOR_REGIONS = ("region-a", "region-b")
COMMAND_TIMEOUT = 420.0
"""Longer than any --timeout the README gives a command."""
VOLATILE = re.compile(r"\b(?:\d+(?:\.\d+)?(?:ms|[dhms]))+\b|\b\d+\.\d+\b")
"""Durations (ages, lags, pauses) and decimals (a pause in seconds): free to differ."""
READ_ONLY = ("kubectl get ", "kubectl describe ", "kubectl cellplane status")
"""Commands that may be run again until they print what the README shows: the status
they read is written by the operators a moment after the change a reader waited for
(a Cell's tenant count follows its tenant's Ready), as a person would look again."""
SETTLE_SECONDS = 30.0
DEMO_LIKE_CELL = "shared-a1"


def _readme_rules() -> ModuleType:
    """tests/unit/test_readme.py: how the README's blocks are read, and ELSEWHERE."""
    path = REPO / "tests" / "unit" / "test_readme.py"
    spec = importlib.util.spec_from_file_location("readme_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rules = _readme_rules()


@pytest.fixture(scope="module")
def plane(kube3: LocalControlPlane) -> Iterator[RegionPlane]:
    """Operators in region-a and region-b, and a Ready shared cell of region-a with a
    standby in region-b, as the demo's plane has (its shared-a1), which the README
    recommends for the tour: a tour whose tenant left the choice to placement would find
    that cell Ready while its own is still starting, and land there."""
    regions = RegionPlane(kube3, REGIONS)
    try:
        for region in OPERATOR_REGIONS:
            regions.start_operator(region)
        ready_cell(regions, DEMO_LIKE_CELL, standbyRegions=["region-b"])
        yield regions
    finally:
        regions.close()


def _bash(line: str, env: dict[str, str], *, stdin: str | None = None,
          timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _exported(line: str, env: dict[str, str]) -> dict[str, str]:
    """The environment after ``line`` (an export) ran in bash."""
    done = _bash(f"{line}\nenv -0", env, timeout=30)
    assert done.returncode == 0, f"{line}: {done.stderr}"
    return dict(entry.split("=", 1) for entry in done.stdout.split("\0") if "=" in entry)


def _words_match(expected: str, printed: str) -> bool:
    """Word by word, volatile numbers aside; a README line ending in `...` is a prefix."""
    want, got = VOLATILE.sub("~", expected).split(), VOLATILE.sub("~", printed).split()
    if want and want[-1] == "...":
        return got[:len(want) - 1] == want[:-1]
    return want == got


def _unmatched(expected: str, printed: str) -> list[str]:
    """The lines the README shows that are not among the lines printed."""
    lines = [line for line in printed.splitlines() if line.strip()]
    return [line for line in expected.splitlines()
            if line.strip() and not any(_words_match(line, seen) for seen in lines)]


def _run(line: str, expected: str | None, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        done = _bash(line, env)
        print(f"$ {line}\n{done.stdout}{done.stderr}", flush=True)
        assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stderr}"
        missing = [] if expected is None else _unmatched(expected, done.stdout + done.stderr)
        if not missing:
            return done
        assert line.startswith(READ_ONLY) and time.monotonic() < deadline, (
            f"README says `{line}` prints\n  " + "\n  ".join(missing)
            + f"\nbut it printed:\n{done.stdout}{done.stderr}")
        time.sleep(1)


def test_the_readme_tour_runs_word_for_word(plane: RegionPlane) -> None:
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["KUBECONFIG"] = str(plane.kube.kubeconfig)
    steps = rules.readme_steps(rules.README.read_text())
    ran = 0
    for step in steps:
        if isinstance(step, rules.Manifest):
            applied = _bash("kubectl apply -f -", env, stdin=step.text, timeout=60)
            assert applied.returncode == 0, f"kubectl apply -f - of\n{step.text}\n{applied.stderr}"
            print(f"$ kubectl apply -f - <<README\n{applied.stdout}", flush=True)
            continue
        if step.bare in rules.ELSEWHERE:
            continue
        assert step.bare.startswith(rules.RUN_BY_TEST_README), step.line
        if step.bare.startswith("export "):
            env = _exported(step.line, env)
            kubectl = shutil.which("kubectl", path=env["PATH"])
            assert kubectl is not None and Path(kubectl).resolve() == \
                plane.kube.binaries.kubectl.resolve(), (
                    f"the README's PATH finds kubectl at {kubectl}, not the pinned "
                    f"{plane.kube.binaries.kubectl}")
            continue
        _run(step.line, step.expected, env)
        ran += 1
    assert ran >= 8, f"only {ran} README commands ran"
