"""The site agent as real processes (``python -m cellplane_operator site agent``) on loopback,
each with its own real Postgres, driven through ``SiteAgentClient``: the endpoint's
authentication and errors, an agent that never starts Postgres by itself (not even
after it was killed with a primary), and a whole failover and rebuild across two agents
over TCP with SCRAM only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from cellplane_cells.roles import API_ROLE
from cellplane_operator.domain.reconciliation import lsn_to_int
from cellplane_operator.errors import AgentUnreachable, SiteError
from cellplane_operator.localplane import Binaries
from cellplane_operator.localplane.pgauth import new_password, write_passfile
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.postgres import SUPERUSER
from cellplane_operator.sites.agent_client import AgentStatus, SiteAgentClient
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.credentials import ROLES
from cellplane_operator.sites.local import site_process_ids, stop_all_sites
from cellplane_operator.sites.processes import start_time, wait_gone
from cellplane_operator.sites.state import SiteLayout

CELL = "agent-c1"
TOKEN = "agent-token-for-tests-0123456789"
START_TIMEOUT = 60.0
CONDITION_TIMEOUT = 90.0


@dataclass
class Agent:
    """One agent process, its ports and its site's files."""

    name: str
    base: Path
    region: str
    postgres_port: int = field(default_factory=free_port)
    reading_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def state_dir(self) -> Path:
        return self.base / f"state-{self.name}"

    @property
    def layout(self) -> SiteLayout:
        return SiteLayout(self.state_dir / SiteKey(CELL, self.region).name)

    @property
    def log(self) -> Path:
        return self.base / f"agent-{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "cellplane_operator", "site", "agent",
                f"--cell={CELL}", f"--region={self.region}", f"--state-dir={self.state_dir}",
                f"--socket-dir={self.base / f'sock-{self.name}'}",
                f"--postgres-bin={Binaries.discover(postgres_only=True).postgres_bin}",
                f"--postgres-port={self.postgres_port}", f"--postgres-listen={LOOPBACK}",
                f"--credentials-dir={self.base / 'credentials'}",
                f"--token-file={self.base / 'token'}", f"--listen={LOOPBACK}:{self.http_port}",
                f"--advertise-host={LOOPBACK}", f"--reading-port={self.reading_port}"]


@dataclass
class Agents:
    base: Path
    passwords: dict[str, str]
    started: list[Agent] = field(default_factory=list)
    clients: list[SiteAgentClient] = field(default_factory=list)

    def passfile(self, role: str) -> Path:
        """The test's own libpq passfile of ``role`` (0600)."""
        return write_passfile(self.base / f"test-{role}.pgpass", {role: self.passwords[role]})

    async def start(self, agent: Agent) -> SiteAgentClient:
        with agent.log.open("ab") as out:
            agent.process = subprocess.Popen(agent.argv(), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        if agent not in self.started:
            self.started.append(agent)
        client = self.client(agent)
        await until(client.healthy, f"the agent {agent.name} to answer",
                    timeout=START_TIMEOUT, alive=lambda: _alive_or_fail(agent))
        return client

    def client(self, agent: Agent, token: str = TOKEN) -> SiteAgentClient:
        client = SiteAgentClient(agent.url, token, timeout=300.0)
        self.clients.append(client)
        return client


def _alive_or_fail(agent: Agent) -> None:
    assert agent.process is not None
    if agent.process.poll() is not None:
        raise AssertionError(f"agent {agent.name} exited {agent.process.returncode}:\n"
                             f"{agent.log.read_text(errors='replace')[-4000:]}")


async def until(condition: Callable[[], Awaitable[bool]], what: str, *,
                timeout: float = CONDITION_TIMEOUT,
                alive: Callable[[], None] | None = None) -> None:
    """Awaits ``condition`` (polled) until it holds; fails after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if alive is not None:
            alive()
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.fixture(autouse=True)
def no_ambient_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """No password from the environment or ~/.pgpass: only what a conninfo names."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent/cellplane-no-pgpass")


@pytest.fixture
async def workspace(request: pytest.FixtureRequest) -> AsyncIterator[Agents]:
    # Under /tmp and o+x: the Postgres OS user (when the tests run as root) walks in.
    base = Path(tempfile.mkdtemp(prefix="cellplane-agent-"))
    base.chmod(0o755)
    credentials = base / "credentials"
    credentials.mkdir()
    passwords = {role: new_password() for role in ROLES}
    for role, password in passwords.items():
        # As a Secret volume under an fsGroup shows them: group-readable.
        (credentials / role).write_text(password)
        (credentials / role).chmod(0o440)
    (base / "token").write_text(TOKEN + "\n")
    agents = Agents(base, passwords)
    try:
        yield agents
    finally:
        for client in agents.clients:
            await client.aclose()
        seen: set[int] = set()
        for agent in agents.started:
            if agent.process is not None and agent.process.poll() is None:
                agent.process.terminate()
                try:
                    agent.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    agent.process.kill()
                    agent.process.wait(timeout=10)
            seen.update(site_process_ids(agent.state_dir))
            seen.update(stop_all_sites(agent.state_dir))
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            for log in sorted(base.glob("agent-*.log")) + sorted(base.glob("state-*/*/logs/*")):
                sys.stderr.write(f"\n===== {log} =====\n{log.read_text(errors='replace')[-6000:]}")
        left = wait_gone(sorted(pid for pid in seen if start_time(pid) is not None))
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"site processes outlived the fixture: {left}"


def _connect(port: int, passfile: Path | str, *, user: str = SUPERUSER,
             dbname: str = "cellplane") -> psycopg.Connection[Any]:
    return psycopg.connect(host=LOOPBACK, port=port, user=user, dbname=dbname,
                           passfile=str(passfile), connect_timeout=5, autocommit=True)


def _rows(port: int, passfile: Path) -> list[int]:
    with _connect(port, passfile) as conn:
        return [row[0] for row in conn.execute("SELECT x FROM agent_probe ORDER BY x")]


def _postmaster_alive(agent: Agent) -> bool:
    try:
        pid = int((agent.layout.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return False
    return start_time(pid) is not None


# -- the endpoint -----------------------------------------------------------------------------

async def test_endpoint_authenticates_refuses_and_starts_nothing(workspace: Agents) -> None:
    agent = Agent("x", workspace.base, "region-x")
    client = await workspace.start(agent)

    async with httpx.AsyncClient(base_url=agent.url) as raw:
        health = await raw.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"ok": True})
        anonymous = await raw.get("/v1/database")
        assert anonymous.status_code == 401 and "error" in anonymous.json()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for body in (b"{not json", b"[]", b"{}", b'{"epoch": "7"}', b'{"epoch": true}'):
            answer = await raw.post("/v1/database/primary", content=body, headers=headers)
            assert answer.status_code == 400, (body, answer.text)
            assert "error" in answer.json()
        for body in (b'{"primary": {"host": "h"}}', b'{"primary": {"host": "h", "port": 0}}',
                     b'{"primary": {"host": "", "port": 5432}}', b'{"primary": 1}'):
            answer = await raw.post("/v1/database/standby", content=body, headers=headers)
            assert answer.status_code == 400, (body, answer.text)
        bad_query = await raw.get("/v1/database?restart=yes", headers=headers)
        assert bad_query.status_code == 400

    with pytest.raises(AgentUnreachable) as wrong:
        await workspace.client(agent, token="not-the-token-0123456789").status(restart=False)
    assert wrong.value.status == 401 and agent.url in str(wrong.value)

    # A refused operation is the site's own error, with the agent's message.
    with pytest.raises(SiteError) as refused:
        await client.promote()
    assert not isinstance(refused.value, AgentUnreachable)
    assert "no database to promote" in str(refused.value)

    # The token file is read again when it changes (the kubelet renews a Secret in place).
    (workspace.base / "token").write_text("a-renewed-token-0123456789\n")
    with pytest.raises(AgentUnreachable):
        await client.status(restart=False)
    renewed = workspace.client(agent, token="a-renewed-token-0123456789")
    status = await renewed.status(restart=True)
    assert (status.role, status.database_up, status.epoch, status.restarted) == (
        None, False, None, ())
    assert not agent.layout.data_dir.exists()

    nobody = SiteAgentClient(f"http://{LOOPBACK}:{free_port()}", TOKEN)
    with pytest.raises(AgentUnreachable):
        await nobody.status(restart=False)
    assert not await nobody.healthy()
    await nobody.aclose()

    assert agent.process is not None
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=60) == 0


# -- a failover through two agents -------------------------------------------------------------

async def test_failover_and_rebuild_through_two_agents(workspace: Agents) -> None:
    a = Agent("a", workspace.base, "region-a")
    b = Agent("b", workspace.base, "region-b")
    client_a = await workspace.start(a)
    client_b = await workspace.start(b)
    superuser = workspace.passfile(SUPERUSER)

    status = await client_a.status(restart=False)
    assert (status.role, status.database_up, status.epoch) == (None, False, None)
    assert not a.layout.data_dir.exists()

    # A primary, written to over TCP with the superuser's password.
    endpoint = await client_a.ensure_primary(7)
    assert (endpoint.host, endpoint.port, endpoint.dbname, endpoint.user) == (
        LOOPBACK, a.postgres_port, "cellplane", SUPERUSER)
    with _connect(a.postgres_port, superuser) as conn:
        conn.execute("CREATE TABLE agent_probe (x int PRIMARY KEY)")
        conn.execute("INSERT INTO agent_probe VALUES (1)")
    # No trust over TCP: without a password, as the superuser or a cell role, refused.
    for user in (SUPERUSER, API_ROLE):
        with pytest.raises(psycopg.OperationalError):
            _connect(a.postgres_port, "/nonexistent/no-passfile", user=user).close()
    assert "trust" not in [line.split()[-1] for line in
                           (a.layout.data_dir / "pg_hba.conf").read_text().splitlines()
                           if line.strip() and not line.startswith("#")]

    # The Pod dies whole (agent and Postgres); the new agent starts no Postgres by itself.
    first_boot = status.boot_id
    assert a.process is not None
    a.process.kill()
    a.process.wait(timeout=30)
    pids = site_process_ids(a.state_dir)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert not wait_gone(pids, timeout=30)
    client_a = await workspace.start(a)
    held = await client_a.status(restart=False)
    assert held.boot_id != first_boot
    assert (held.role, held.database_up, held.epoch, held.restarted) == ("primary", False, 7, ())
    assert not _postmaster_alive(a)
    assert (await client_a.status(restart=False)).database_up is False
    restarted = await client_a.status(restart=True)
    assert (restarted.restarted, restarted.database_up, restarted.in_recovery) == (
        ("postgres",), True, False)
    assert _rows(a.postgres_port, superuser) == [1]
    # Its unix socket is in the socket dir (the Pod's pg_isready readiness probe looks there).
    assert (workspace.base / "sock-a" / f".s.PGSQL.{a.postgres_port}").is_socket()

    # A standby of it, across TCP as the replication role with SCRAM, streams the row.
    standby = await client_b.ensure_standby(LOOPBACK, a.postgres_port)
    assert (standby.host, standby.port) == (LOOPBACK, b.postgres_port)

    async def streaming(client: SiteAgentClient) -> bool:
        found = await client.status(restart=False)
        return found.database_up and bool(found.in_recovery) and found.streaming

    await until(lambda: streaming(client_b), "b to stream from a")
    assert _rows(b.postgres_port, superuser) == [1]

    # A planned handover: a demoted, b has replayed its last location, b promoted.
    with _connect(a.postgres_port, superuser) as conn:
        conn.execute("INSERT INTO agent_probe VALUES (2)")
    lsn = await client_a.demote()
    assert await client_a.demote() == lsn
    demoted = await client_a.status(restart=True)
    assert (demoted.role, demoted.database_up, demoted.restarted) == ("demoted", False, ())

    async def replayed(client: SiteAgentClient) -> bool:
        found: AgentStatus = await client.status(restart=False)
        return found.replay_lsn is not None and lsn_to_int(found.replay_lsn) >= lsn_to_int(lsn)

    await until(lambda: replayed(client_b), f"b to replay up to {lsn}")
    promoted = await client_b.promote()
    assert promoted.port == b.postgres_port
    after = await client_b.status(restart=False)
    assert (after.in_recovery, after.database_up) == (False, True)
    with _connect(b.postgres_port, superuser) as conn:
        conn.execute("INSERT INTO agent_probe VALUES (3)")

    # The old primary fenced, then opened for reading: TCP on its reading port, the
    # superuser only; its own port stays closed.
    await client_a.fence()
    assert (await client_a.status(restart=True)).role == "fenced"
    reading = await client_a.open_reading()
    assert (reading.host, reading.port, reading.dbname, reading.user) == (
        LOOPBACK, a.reading_port, "cellplane", SUPERUSER)
    assert await client_a.open_reading() == reading
    assert _rows(a.reading_port, superuser) == [1, 2]
    with _connect(a.reading_port, superuser) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO agent_probe VALUES (99)")
    with pytest.raises(psycopg.OperationalError):
        _connect(a.reading_port, workspace.passfile(API_ROLE), user=API_ROLE).close()
    with pytest.raises(psycopg.OperationalError):
        _connect(a.reading_port, "/nonexistent/no-passfile").close()
    with pytest.raises(psycopg.OperationalError):
        _connect(a.postgres_port, superuser).close()
    await client_a.close_reading()
    await client_a.close_reading()
    assert not _postmaster_alive(a)

    # Rebuilt as a standby of the new primary: it streams and has the new row.
    rebuilt = await client_a.rebuild(LOOPBACK, b.postgres_port)
    assert rebuilt.port == a.postgres_port
    await until(lambda: streaming(client_a), "a to stream from b")
    await until(lambda: asyncio.to_thread(lambda: _rows(a.postgres_port, superuser) == [1, 2, 3]),
                "a to replay the new primary's row")
    assert (await client_a.status(restart=False)).role == "standby"

    # The new primary's epoch recorded; an older one never makes it primary again.
    assert (await client_b.ensure_primary(8)).port == b.postgres_port
    assert (await client_b.status(restart=False)).epoch == 8
    with pytest.raises(SiteError, match="epoch 6 is older"):
        await client_b.ensure_primary(6)
    assert (await client_b.ensure_primary(None)).port == b.postgres_port
    assert (await client_b.status(restart=False)).epoch == 8

    # SIGTERM: Postgres stopped cleanly, the agent exits 0; the record stays.
    assert b.process is not None and _postmaster_alive(b)
    b.process.send_signal(signal.SIGTERM)
    assert b.process.wait(timeout=90) == 0
    assert not _postmaster_alive(b)

    # Destroyed: no data, no record.
    await client_a.destroy()
    gone = await client_a.status(restart=False)
    assert (gone.role, gone.database_up, gone.epoch) == (None, False, None)
    assert not a.layout.root.exists()
