"""The cell's database passwords: SCRAM verifiers the operator computes, passfiles, and the
generated credentials of a driver that runs on its own (no I/O beyond a temp dir)."""

from __future__ import annotations

from pathlib import Path

from cellplane_operator.localplane.pgauth import (
    new_password,
    scram_verifier,
    verifier_matches,
    write_passfile,
)
from cellplane_operator.sites.credentials import ROLES, DatabaseCredentials, GeneratedCredentials


def test_a_verifier_accepts_its_password_and_nothing_else() -> None:
    password = new_password()
    verifier = scram_verifier(password, salt=b"0123456789abcdef")

    assert verifier.startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
    assert verifier_matches(verifier, password)
    assert not verifier_matches(verifier, password + "x")
    assert not verifier_matches(None, password)
    assert not verifier_matches("md5" + "0" * 32, password)
    assert not verifier_matches("SCRAM-SHA-256$garbage", password)
    assert scram_verifier(password) != scram_verifier(password)  # a new salt each time


def test_a_passfile_is_private_and_names_each_role(tmp_path: Path) -> None:
    path = write_passfile(tmp_path / "roles.pgpass", {"b_role": "pw-b", "a_role": "pw-a"})

    assert path.read_text() == "*:*:*:a_role:pw-a\n*:*:*:b_role:pw-b\n"
    assert path.stat().st_mode & 0o777 == 0o600


async def test_generated_credentials_are_made_once_per_cell_and_kept_private(
        tmp_path: Path) -> None:
    source = GeneratedCredentials(tmp_path / "credentials")

    first = await source.cell_credentials("shared-a1")
    again = await GeneratedCredentials(tmp_path / "credentials").cell_credentials("shared-a1")
    other = await source.cell_credentials("shared-a2")

    assert first == again and first.complete and set(first.passwords) == set(ROLES)
    assert set(first.passwords.values()).isdisjoint(other.passwords.values())
    assert len(set(first.passwords.values())) == len(ROLES)
    assert (tmp_path / "credentials").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "credentials" / "shared-a1.json").stat().st_mode & 0o777 == 0o600
    assert first.passwords["postgres"] not in repr(first)


def test_credentials_missing_a_role_are_completed_without_changing_the_others() -> None:
    partial = DatabaseCredentials({"postgres": "kept"})

    completed = partial.completed()

    assert not partial.complete and completed.complete
    assert completed.passwords["postgres"] == "kept"
    assert DatabaseCredentials.from_json(completed.to_json()) == completed
