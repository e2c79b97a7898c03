"""Password authentication for the Postgres instances cellplane runs: SCRAM, never trust.

Every TCP connection authenticates with ``scram-sha-256``; replication only as
the replication role. Passwords reach libpq through passfiles (``.pgpass``
format, mode 0600), never a command line that ``ps`` shows, and reach the
server only as SCRAM verifiers, computed here: a statement log or
``pg_stat_activity`` never holds a password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import secrets
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SCRAM_HBA", "LEGACY_TRUST_HBA", "REPLICATION_ROLE", "LOOPBACK_NETWORKS",
           "scram_hba", "scram_verifier", "verifier_matches", "write_passfile", "new_password"]

REPLICATION_ROLE = "cellplane_replication"
"""The role standbys stream as (``primary_conninfo``, ``pg_basebackup``): REPLICATION, no
table privileges."""

SCRAM_HBA = f"""\
# cellplane: loopback only, and every connection shows a password (SCRAM-SHA-256).
host    all             all                     127.0.0.1/32    scram-sha-256
host    replication     {REPLICATION_ROLE}   127.0.0.1/32    scram-sha-256
"""
LEGACY_TRUST_HBA = """\
host    all             all             127.0.0.1/32    trust
host    replication     all             127.0.0.1/32    trust
"""
"""What clusters made before password authentication trusted: recognised to upgrade them."""
LOOPBACK_NETWORKS = ("127.0.0.1/32",)
"""Where the local plane's and the local driver's clients are: this machine only."""


def scram_hba(networks: tuple[str, ...] = LOOPBACK_NETWORKS) -> str:
    """``pg_hba.conf`` admitting ``networks`` (CIDRs) with SCRAM only, and replication only as
    the replication role. Loopback gives ``SCRAM_HBA`` itself, byte for byte (clusters made
    before this function compare equal); a site agent in a Pod passes every address."""
    if networks == LOOPBACK_NETWORKS:
        return SCRAM_HBA
    lines = ["# cellplane: every connection shows a password (SCRAM-SHA-256); never trust."]
    lines += [f"host    all             all                     {net:<15} scram-sha-256"
              for net in networks]
    lines += [f"host    replication     {REPLICATION_ROLE}   {net:<15} scram-sha-256"
              for net in networks]
    return "\n".join(lines) + "\n"

_ITERATIONS = 4096  # what Postgres itself uses (scram_iterations' default)


def new_password() -> str:
    """256 random bits, URL-safe: no ``:`` or ``\\``, so it needs no escaping in a passfile."""
    return secrets.token_urlsafe(32)


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    return hashlib.sha256(client_key).digest(), server_key


def scram_verifier(password: str, *, salt: bytes | None = None,
                   iterations: int = _ITERATIONS) -> str:
    """The ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` Postgres stores.

    (Postgres SASLpreps a password first; the passwords made here are ASCII, which
    SASLprep leaves as they are.)
    """
    salt = salt if salt is not None else os.urandom(16)
    stored, server = _keys(password, salt, iterations)
    encode = base64.b64encode
    return (f"SCRAM-SHA-256${iterations}:{encode(salt).decode()}"
            f"${encode(stored).decode()}:{encode(server).decode()}")


def verifier_matches(verifier: str | None, password: str) -> bool:
    """Does the stored ``verifier`` (``pg_authid.rolpassword``) accept ``password``?"""
    if not verifier or not verifier.startswith("SCRAM-SHA-256$"):
        return False
    try:
        head, keys = verifier[len("SCRAM-SHA-256$"):].split("$", 1)
        iterations, salt = head.split(":", 1)
        stored, server = keys.split(":", 1)
        expected = _keys(password, base64.b64decode(salt), int(iterations))
    except ValueError:
        return False
    return (hmac.compare_digest(expected[0], base64.b64decode(stored))
            and hmac.compare_digest(expected[1], base64.b64decode(server)))


def write_passfile(path: Path, passwords: Mapping[str, str], *, owner: str | None = None) -> Path:
    """A libpq passfile (mode 0600) with one ``*:*:*:<role>:<password>`` line per role.

    Written to a temporary file and renamed, so a reader never sees half of it;
    ``owner`` (an OS user) owns it when someone else's program reads it (the Postgres
    OS user's pg_basebackup, pg_rewind and WAL receiver).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"*:*:*:{role}:{password}\n" for role, password in sorted(passwords.items()))
    try:
        if path.read_text() == text and _owned_by(path, owner):
            return path
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    if owner is not None:
        entry = pwd.getpwnam(owner)
        os.chown(temporary, entry.pw_uid, entry.pw_gid)
    os.replace(temporary, path)
    return path


def _owned_by(path: Path, owner: str | None) -> bool:
    return owner is None or path.stat().st_uid == pwd.getpwnam(owner).pw_uid
