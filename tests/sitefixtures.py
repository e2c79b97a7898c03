"""Site-driver tests' shared fixture: a LocalSiteDriver on a fresh state dir, cleaned up.

The state dir is made under /tmp with ``tempfile.mkdtemp`` (pytest's tmp_path
is private to root, and the Postgres OS user must be able to enter it). At
teardown every process of every site is stopped, the logs are printed if the
test failed, and every PID the test saw must be gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cellplane_operator.localplane import Binaries
from cellplane_operator.localplane.process import tail
from cellplane_operator.sites import LocalSiteDriver, SiteKey, stop_all_sites
from cellplane_operator.sites.database import parse_control_data
from cellplane_operator.sites.processes import start_time
from cellplane_operator.sites.state import SiteLayout, SiteState


@dataclass
class Sites:
    state_dir: Path
    binaries: Binaries
    driver: LocalSiteDriver
    seen: set[int] = field(default_factory=set)
    """Every PID a test saw in a site.json: all must be gone after cleanup."""

    def new_driver(self) -> LocalSiteDriver:
        """What an operator restart makes: a driver that knows only the state dir."""
        return LocalSiteDriver(self.binaries, self.state_dir)

    def layout(self, site: SiteKey) -> SiteLayout:
        return SiteLayout(self.state_dir / site.name)

    def state(self, site: SiteKey) -> SiteState:
        state = SiteState.load(self.layout(site))
        assert state is not None
        self.seen.update(p.pid for p in state.processes.values())
        return state

    def pids(self, site: SiteKey) -> dict[str, int]:
        return {role: p.pid for role, p in self.state(site).processes.items()}

    def credentials(self, site: SiteKey) -> dict[str, str]:
        """The cell's database passwords as the site keeps them, by role."""
        found = json.loads(self.layout(site).credentials_file.read_text())
        assert isinstance(found, dict)
        return {str(role): str(password) for role, password in found.items()}

    def control_data(self, site: SiteKey) -> dict[str, str]:
        """pg_controldata of the site's data dir, by label."""
        report = subprocess.run(
            [self.binaries.pg("pg_controldata"), "-D", str(self.layout(site).data_dir)],
            capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"},
            stdin=subprocess.DEVNULL, timeout=60).stdout
        return parse_control_data(report)

    def postgres_log(self, site: SiteKey) -> str:
        """What the site's Postgres and its helpers (pg_rewind, pg_basebackup) said."""
        return self.layout(site).log("postgres").read_text(errors="replace")


def alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may never be reaped on this machine)."""
    return start_time(pid) is not None


def site_logs(state_dir: Path) -> str:
    return "\n".join(f"===== {log} =====\n{tail(log, 40)}"
                     for log in sorted(state_dir.glob("*/logs/*.log")))


def run_sites(request: pytest.FixtureRequest, prefix: str) -> Iterator[Sites]:
    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    binaries = Binaries.discover()
    found = Sites(state_dir, binaries, LocalSiteDriver(binaries, state_dir))
    try:
        yield found
    finally:
        for root in state_dir.iterdir():
            if (state := SiteState.load(SiteLayout(root))) is not None:
                found.seen.update(p.pid for p in state.processes.values())
        stopped = stop_all_sites(state_dir)
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            sys.stderr.write(f"\n--- site logs in {state_dir} ---\n{site_logs(state_dir)}\n")
        left = sorted(pid for pid in found.seen | set(stopped) if alive(pid))
        shutil.rmtree(state_dir, ignore_errors=True)
        assert not left, f"site processes outlived the fixture: {left}"
