"""Real Postgres and a real apiserver: nobody reaches a cell's database without a password,
each cell process connects as its own role with only the grants it needs, tenant secrets
are readable only by the roles that sign with them, a cell made before passwords is
upgraded in place, and Secrets are encrypted in the apiserver's etcd.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors

from cellplane_cells.roles import ADMIN_API_ROLE, API_ROLE, RELAY_ROLE, WORKER_ROLE
from cellplane_operator.kube import SECRETS, KubeClient, KubeConfig
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.apiserver import ENCRYPTION_KEY_NAME
from cellplane_operator.localplane.pgauth import LEGACY_TRUST_HBA, REPLICATION_ROLE
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.sites import DatabaseEndpoint, ServingSpec, SiteKey
from cellplane_operator.sites.local import GENERATED_CREDENTIALS
from cellplane_operator.store import EtcdStore
from cellfixtures import role_conninfo, setup_tenant
from sitefixtures import Sites, run_sites

PRIMARY = SiteKey("auth-a1", "region-a")
STANDBY = SiteKey("auth-a1", "region-b")
TOKEN = "admin-token-for-auth-tests-0123456789"


@pytest.fixture
def sites(request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from run_sites(request, "cellplane-auth-")


@pytest.fixture(autouse=True)
def no_ambient_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """No password may come from the environment or ~/.pgpass: only what a conninfo names."""
    for variable in ("PGPASSWORD", "PGPASSFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent/cellplane-no-pgpass")


def _refused(conninfo: str) -> str:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(conninfo, connect_timeout=5).close()
    return str(refused.value)


def _without_passfile(database: DatabaseEndpoint, **changes: str) -> str:
    parts = {"host": database.host, "port": str(database.port), "user": database.user,
             "dbname": database.dbname, **changes}
    return " ".join(f"{key}={value}" for key, value in parts.items())


# -- a site's database ------------------------------------------------------------------

async def test_a_connection_without_the_password_is_refused(sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)

    for user in ("postgres", API_ROLE, WORKER_ROLE, RELAY_ROLE, ADMIN_API_ROLE,
                 REPLICATION_ROLE):
        said = _refused(_without_passfile(database, user=user))
        assert "no password supplied" in said or "password authentication failed" in said
    assert "password authentication failed" in _refused(
        _without_passfile(database, password="not-the-password"))
    hba = (sites.layout(PRIMARY).data_dir / "pg_hba.conf").read_text()
    assert "trust" not in hba and "scram-sha-256" in hba
    # With its passfile the operator gets in; the passfiles are private.
    with psycopg.connect(database.conninfo, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    secrets = sites.layout(PRIMARY).secrets_dir
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in secrets.iterdir()} == {0o600}
    assert sites.layout(PRIMARY).server_passfile.stat().st_mode & 0o777 == 0o600


async def test_each_cell_process_connects_as_its_own_role_with_no_password_in_sight(
        sites: Sites) -> None:
    database = await sites.driver.ensure_primary_database(PRIMARY)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(1, make_interval(secs => 3600))")
    await sites.driver.start_serving(PRIMARY, ServingSpec(
        epoch=1, admin_token=TOKEN, worker_processes=1, slots_per_worker=2,
        allow_private_targets=True))

    def connected_roles() -> set[str]:
        with psycopg.connect(database.conninfo, autocommit=True) as conn:
            return {row[0] for row in conn.execute(
                "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'cellplane'"
                " AND pid <> pg_backend_pid()")}

    wait_for(lambda: {API_ROLE, ADMIN_API_ROLE, WORKER_ROLE, RELAY_ROLE} <= connected_roles(),
             timeout=60, what="every cell process's pool to connect")
    assert "postgres" not in connected_roles()
    passwords = set(sites.credentials(PRIMARY).values())
    for role, pid in sites.pids(PRIMARY).items():
        if role == "postgres":
            continue
        shown = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        assert not any(password.encode() in shown for password in passwords), role


# -- the roles' grants -------------------------------------------------------------------

def test_tenant_secrets_are_readable_only_by_the_roles_that_sign_with_them(
        cell_postgres: LocalControlPlane, cell_db: str) -> None:
    pg = cell_postgres.postgres["cell"]
    dbname = psycopg.conninfo.conninfo_to_dict(cell_db)["dbname"]
    assert isinstance(dbname, str)
    setup_tenant(cell_db, "acme", target_url="http://127.0.0.1:9/")
    with psycopg.connect(cell_db, autocommit=True) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        conn.execute("INSERT INTO webhook_endpoints (tenant_id, url, secret)"
                     " VALUES ('acme', 'http://127.0.0.1:9/hook', 'webhook-secret-0123456789')")
    signing = "SELECT signing_secret FROM tenants"
    webhook = "SELECT secret FROM webhook_endpoints"
    readers = {API_ROLE: set(), WORKER_ROLE: {signing}, RELAY_ROLE: {webhook},
               ADMIN_API_ROLE: {signing, webhook}}
    for role, may_read in readers.items():
        with psycopg.connect(role_conninfo(pg, dbname, role), autocommit=True) as conn:
            # Every role reads the rest of both tables.
            assert conn.execute("SELECT tenant_id, plan, state FROM tenants").fetchall() == [
                ("acme", "pro", "active")]
            assert conn.execute("SELECT url FROM webhook_endpoints").fetchall() == [
                ("http://127.0.0.1:9/hook",)]
            for statement in (signing, webhook):
                if statement in may_read:
                    assert conn.execute(statement).fetchone() is not None
                else:
                    with pytest.raises(errors.InsufficientPrivilege):
                        conn.execute(statement)
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute("SELECT number FROM schema_migrations")
            if signing not in may_read:
                with pytest.raises(errors.InsufficientPrivilege):
                    conn.execute("SELECT * FROM tenants")


def test_the_cell_roles_cannot_change_the_schema_or_grant_themselves_an_epoch(
        cell_postgres: LocalControlPlane, cell_db: str) -> None:
    pg = cell_postgres.postgres["cell"]
    dbname = str(psycopg.conninfo.conninfo_to_dict(cell_db)["dbname"])
    for role in (WORKER_ROLE, API_ROLE, RELAY_ROLE, ADMIN_API_ROLE):
        with psycopg.connect(role_conninfo(pg, dbname, role), autocommit=True) as conn:
            for statement in ("ALTER TABLE jobs ADD COLUMN sneaky integer",
                              "DROP TRIGGER cellplane_guard ON jobs",
                              "CREATE TABLE sneaky (x integer)",
                              "SELECT cellplane_grant(99, make_interval(secs => 3600), NULL)",
                              "UPDATE placement_group SET epoch = 99",
                              "DELETE FROM schema_migrations"):
                with pytest.raises((errors.InsufficientPrivilege, errors.UndefinedFunction)):
                    conn.execute(statement)
            # ...and still do their work: a write under the granted epoch (the fencing
            # trigger reads the placement group as the writer).
            conn.execute("SET cellplane.epoch = '1'")
            conn.execute("UPDATE tenants SET running = running WHERE tenant_id = 'nobody'")
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


# -- replication and the upgrade of cells made before passwords ---------------------------

def _make_legacy(sites: Sites, site: SiteKey, database: DatabaseEndpoint,
                 primary: DatabaseEndpoint | None) -> None:
    """The site as the code before passwords left it: trust on loopback, no passwords, a
    standby streaming as the superuser, no credentials in the site."""
    layout = sites.layout(site)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        if primary is None:
            for role in ("postgres", REPLICATION_ROLE, API_ROLE, WORKER_ROLE, RELAY_ROLE,
                         ADMIN_API_ROLE):
                conn.execute(f"ALTER ROLE {role} PASSWORD NULL".encode())
        (layout.data_dir / "pg_hba.conf").write_text(LEGACY_TRUST_HBA)
        if primary is not None:
            auto = layout.data_dir / "postgresql.auto.conf"
            kept = [line for line in auto.read_text().splitlines()
                    if not line.startswith("primary_conninfo")]
            kept.append(f"primary_conninfo = 'user=postgres host={primary.host} "
                        f"port={primary.port}'")
            auto.write_text("\n".join(kept) + "\n")
        conn.execute("SELECT pg_reload_conf()")
    for path in layout.secrets_dir.iterdir():
        path.unlink()
    layout.secrets_dir.rmdir()
    layout.server_passfile.unlink()


def _replication_users(primary: DatabaseEndpoint) -> list[tuple[str, str]]:
    with psycopg.connect(primary.conninfo, autocommit=True) as conn:
        return [(str(r[0]), str(r[1])) for r in
                conn.execute("SELECT usename, state FROM pg_stat_replication")]


async def test_a_cell_made_before_passwords_is_upgraded_in_place_and_keeps_streaming(
        sites: Sites) -> None:
    primary = await sites.driver.ensure_primary_database(PRIMARY)
    standby = await sites.driver.ensure_standby_database(STANDBY, primary)
    wait_for(lambda: _replication_users(primary) == [(REPLICATION_ROLE, "streaming")],
             timeout=60, what="the standby to stream as the replication role")
    # Back to what the code before passwords made: both trust loopback, the standby streams
    # as the superuser, and there are no passwords anywhere (new ones are made below).
    _make_legacy(sites, STANDBY, standby, primary)
    _make_legacy(sites, PRIMARY, primary, None)
    (sites.state_dir / GENERATED_CREDENTIALS / f"{PRIMARY.cell}.json").unlink()
    wait_for(lambda: _replication_users(primary) == [("postgres", "streaming")],
             timeout=60, what="the standby to stream as the superuser, as before passwords")
    with psycopg.connect(_without_passfile(primary), connect_timeout=5) as trusted:
        assert trusted.execute("SELECT 1").fetchone() == (1,)  # trust, as before

    upgraded = sites.new_driver()
    assert await upgraded.ensure_primary_database(PRIMARY) == primary
    assert await upgraded.ensure_standby_database(STANDBY, primary) == standby

    for database in (primary, standby):
        said = _refused(_without_passfile(database))
        assert "no password supplied" in said or "password authentication failed" in said
    wait_for(lambda: _replication_users(primary) == [(REPLICATION_ROLE, "streaming")],
             timeout=60, what="the standby to stream as the replication role again")
    with psycopg.connect(primary.conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(5, make_interval(secs => 3600))")

    def replayed() -> bool:
        with psycopg.connect(standby.conninfo, autocommit=True) as conn:
            return conn.execute("SELECT epoch FROM placement_group").fetchall() == [(5,)]

    wait_for(replayed, timeout=60, what="a write on the primary to replay on the standby")
    health = await upgraded.check(STANDBY)
    assert health.database_up and health.streaming


# -- the apiserver ---------------------------------------------------------------------------

async def test_secrets_are_encrypted_in_the_apiservers_etcd(kube: LocalControlPlane) -> None:
    name = f"at-rest-{uuid.uuid4().hex[:8]}"
    marker = f"plain-{uuid.uuid4().hex}"
    assert kube.apiserver is not None
    client = KubeClient(KubeConfig.load(kube.apiserver.kubeconfig))
    store = EtcdStore(list(kube.etcd.endpoints))
    try:
        await client.create(SECRETS, {"metadata": {"name": name, "namespace": "default"},
                                      "stringData": {"password": marker}}, namespace="default")
        raw = await store.get(f"/registry/secrets/default/{name}")
        read = await client.get(SECRETS, name, namespace="default")
    finally:
        await client.close()
        await store.close()
    assert raw is not None
    assert raw.value.startswith(f"k8s:enc:secretbox:v1:{ENCRYPTION_KEY_NAME}:".encode())
    assert marker.encode() not in raw.value
    assert read is not None and read["data"]["password"]  # the apiserver still reads it
    config = kube.apiserver.encryption_config
    assert config.stat().st_mode & 0o777 == 0o600
    assert os.stat(config.parent).st_mode & 0o777 == 0o700
