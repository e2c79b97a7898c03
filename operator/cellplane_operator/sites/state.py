"""What a local site remembers across operator restarts: ``<state dir>/<cell>@<region>/site.json``.

The file records intent (which processes should run, under which epoch) and
fact (PID and start time of each process started), so the next operator can
adopt what runs, restart what died and stop what runs under an old epoch. Its
ports are chosen once, so a restarted site keeps its endpoints.

The admin token is a secret: it lives beside the file in ``admin-token``
(mode 0600), never in ``site.json``, so the state can be shown and logged.
It is kept at all because a process that died must be restarted by ``check``,
which is given no spec.

The cell's database passwords are secrets too: ``secrets/`` (mode 0700) holds
them (``credentials.json``) and one libpq passfile per role, each 0600; a cell
process is handed the path of its own role's passfile, never a password on its
command line. ``server.pgpass`` (0600, the Postgres OS user's) is what that
user's pg_basebackup, pg_rewind and WAL receiver read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellplane_operator.sites.processes import ProcessRecord

__all__ = ["SiteState", "ServingIntent", "DatabaseIntent", "SiteLayout"]

STATE_FILE = "site.json"


@dataclass(frozen=True)
class SiteLayout:
    """Where a site's files are."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @property
    def data_dir(self) -> Path:
        return self.root / "pgdata"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, role: str) -> Path:
        return self.logs / f"{role}.log"

    @property
    def reading_dir(self) -> Path:
        """The private socket directory (and hba file) of a fenced site opened for reading."""
        return self.root / "reading"

    @property
    def token_file(self) -> Path:
        return self.root / "admin-token"

    def read_token(self) -> str | None:
        try:
            return self.token_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    @property
    def credentials_file(self) -> Path:
        return self.secrets_dir / "credentials.json"

    def passfile(self, role: str) -> Path:
        """The libpq passfile of one database role (this operator's user, mode 0600)."""
        return self.secrets_dir / f"{role}.pgpass"

    @property
    def server_passfile(self) -> Path:
        """The passfile of the Postgres OS user (replication and pg_rewind), mode 0600."""
        return self.root / "server.pgpass"

    def write_token(self, token: str) -> None:
        if self.read_token() == token:
            return
        descriptor = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(token)


@dataclass(frozen=True)
class DatabaseIntent:
    """What the site's Postgres should be: a primary, a standby of ``primary_port``, or an
    old primary kept down (``fenced`` after a failover, ``demoted`` after a handover)."""

    role: str
    """``primary``, ``standby``, ``fenced`` or ``demoted``."""
    primary_host: str | None = None
    primary_port: int | None = None
    handover_lsn: str | None = None
    """A demoted site's shutdown checkpoint: the end of everything it wrote as primary."""


@dataclass(frozen=True)
class ServingIntent:
    """API and workers should run, with these settings (the token is in ``admin-token``)."""

    epoch: int
    worker_processes: int
    slots_per_worker: int
    allow_private_targets: bool
    priority_floors: str | None = None
    """``--priority-floors`` of every worker; None: the worker's default (and a state file
    written before floors were configurable)."""


@dataclass
class SiteState:
    cell: str
    region: str
    ports: dict[str, int]
    """``postgres``, ``api`` and ``admin``: chosen once, kept for the site's life."""
    database: DatabaseIntent | None = None
    serving: ServingIntent | None = None
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    """By role: ``postgres``, ``api``, ``worker-<i>``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell, "region": self.region, "ports": self.ports,
            "database": None if self.database is None else vars(self.database),
            "serving": None if self.serving is None else vars(self.serving),
            "processes": {role: p.to_json() for role, p in sorted(self.processes.items())},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SiteState:
        database = raw.get("database")
        serving = raw.get("serving")
        return cls(
            cell=str(raw["cell"]), region=str(raw["region"]),
            ports={str(k): int(v) for k, v in raw["ports"].items()},
            database=None if database is None else DatabaseIntent(**database),
            serving=None if serving is None else ServingIntent(**serving),
            processes={str(role): ProcessRecord.from_json(p)
                       for role, p in raw.get("processes", {}).items()},
        )

    @classmethod
    def load(cls, layout: SiteLayout) -> SiteState | None:
        try:
            return cls.from_json(json.loads(layout.state_file.read_text()))
        except FileNotFoundError:
            return None

    def save(self, layout: SiteLayout) -> None:
        """Written to a temporary file and renamed: a crash never leaves half a file."""
        layout.root.mkdir(parents=True, exist_ok=True)
        temporary = layout.state_file.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(temporary, layout.state_file)
