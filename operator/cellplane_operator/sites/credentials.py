"""A cell's database passwords: one per role, the same on every site of the cell.

They are per cell, not per site, because a standby is a physical copy of its
primary: roles and their SCRAM verifiers replicate, so a promoted standby
accepts exactly the passwords the old primary did. Every region's operator
therefore reads them from one place, the cell's Secret ``cell-<cell>-database``
(made by whichever operator asks first), and the site driver keeps a copy in
the site's own state (``<site>/secrets``, mode 0700, files 0600): a takeover,
a restart of a process or of the operator never waits on the Kubernetes API.

``GeneratedCredentials`` is the source of a driver that runs on its own (tests,
a single machine): made once per cell, kept under its directory.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cellplane_cells.roles import PROCESS_ROLES
from cellplane_operator.errors import CellplaneError, KubeConflictError, SiteError
from cellplane_operator.kube import NAMESPACES, SECRETS
from cellplane_operator.kube.base import KubeApi
from cellplane_operator.localplane.pgauth import REPLICATION_ROLE, new_password
from cellplane_operator.localplane.postgres import SUPERUSER

__all__ = ["DatabaseCredentials", "CredentialSource", "GeneratedCredentials",
           "SecretCredentials", "ROLES", "secret_name"]

ROLES = (SUPERUSER, REPLICATION_ROLE, *PROCESS_ROLES)
"""Every role with a password: the operator's superuser (administration, fencing,
promotion, pg_rewind), the standbys' replication role, the cell processes' roles."""


@dataclass(frozen=True)
class DatabaseCredentials:
    passwords: Mapping[str, str] = field(repr=False)
    """By role name; never printed."""

    @classmethod
    def generate(cls) -> DatabaseCredentials:
        return cls({role: new_password() for role in ROLES})

    def password(self, role: str) -> str:
        try:
            return self.passwords[role]
        except KeyError:
            raise SiteError(f"no database password for the role {role}") from None

    def completed(self) -> DatabaseCredentials:
        """Itself with a new password for each role it lacks (a Secret made by an older
        operator)."""
        return DatabaseCredentials({role: self.passwords.get(role) or new_password()
                                    for role in ROLES})

    @property
    def complete(self) -> bool:
        return all(self.passwords.get(role) for role in ROLES)

    def to_json(self) -> str:
        return json.dumps(dict(sorted(self.passwords.items())))

    @classmethod
    def from_json(cls, text: str) -> DatabaseCredentials:
        raw = json.loads(text)
        return cls({str(role): str(password) for role, password in raw.items()})


class CredentialSource(Protocol):
    async def cell_credentials(self, cell: str) -> DatabaseCredentials:
        """The cell's passwords, made on first use."""


def write_private(path: Path, text: str) -> None:
    """Mode 0600 from the first byte, in a directory of mode 0700; replaced by a rename."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.replace(temporary, path)


class GeneratedCredentials:
    """Passwords made here and kept in ``<directory>/<cell>.json`` (mode 0600)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    async def cell_credentials(self, cell: str) -> DatabaseCredentials:
        path = self._directory / f"{cell}.json"
        try:
            found = DatabaseCredentials.from_json(path.read_text())
            if found.complete:
                return found
        except FileNotFoundError:
            found = DatabaseCredentials({})
        made = found.completed()
        write_private(path, made.to_json())
        return made


def secret_name(cell: str) -> str:
    return f"cell-{cell}-database"


class SecretCredentials:
    """The cell's Secret ``cell-<cell>-database`` in the operator's namespace: one key per
    role. Made by the first operator that asks; a Secret another operator made meanwhile
    wins the race (the create conflicts, and it is read). Read and create only, as the
    chart's RBAC allows for Secrets."""

    def __init__(self, kube: Callable[[], KubeApi], namespace: str) -> None:
        self._make_kube = kube
        self._kube: KubeApi | None = None
        self._namespace = namespace

    async def cell_credentials(self, cell: str) -> DatabaseCredentials:
        try:
            return await self._read_or_make(cell)
        except CellplaneError as error:
            raise SiteError(f"cannot read or make the database credentials of {cell} "
                            f"(Secret {self._namespace}/{secret_name(cell)}): {error}") from error

    async def _read_or_make(self, cell: str) -> DatabaseCredentials:
        if self._kube is None:
            self._kube = self._make_kube()
        kube, name, namespace = self._kube, secret_name(cell), self._namespace
        found = await kube.get(SECRETS, name, namespace=namespace)
        if found is not None:
            current = DatabaseCredentials({key: base64.b64decode(value).decode()
                                           for key, value in (found.get("data") or {}).items()})
            if not current.complete:
                missing = sorted(set(ROLES) - set(current.passwords))
                raise SiteError(f"Secret {namespace}/{name} lacks the passwords of {missing}: "
                                "add them (any random string each) or delete the Secret "
                                "while the cell has no site")
            return current
        if await kube.get(NAMESPACES, namespace) is None:
            try:
                await kube.create(NAMESPACES, {"metadata": {"name": namespace}})
            except KubeConflictError:
                pass
        made = DatabaseCredentials.generate()
        try:
            await kube.create(SECRETS, {
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"cellplane.io/cell": cell}},
                "type": "Opaque", "stringData": dict(made.passwords)}, namespace=namespace)
            return made
        except KubeConflictError:
            return await self._read_or_make(cell)
