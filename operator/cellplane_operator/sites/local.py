"""The local site driver: each site of a cell as loopback processes that outlive the operator.

A site lives in ``<state dir>/<cell>@<region>/``: its ``site.json`` (ports,
intent, and the PID and start time of every process), the Postgres data
directory and ``logs/``. The operator decides; this driver makes processes
match the decision, the way a Deployment controller would:

- what runs with the wanted command line is adopted, never started twice, so an
  operator restart changes nothing that runs;
- what runs with another one (another epoch, above all) is stopped before its
  replacement starts, so two epochs never serve at once;
- what should run and died is started again by ``check``;
- a fenced or demoted database (an old primary after a failover or a handover)
  stays down until it is rebuilt as a standby of the new primary; it runs
  meanwhile only when opened for reading, over a socket only the operator reaches.

Blocking work (initdb, base backups, waits) runs in threads, so the operator's
event loop keeps renewing leases meanwhile. Calls for different sites may run
concurrently; each site has its own lock.

The cell's database passwords come from a ``CredentialSource`` (the cell's
Secret, for the operator) the first time a site needs them and are kept in the
site's ``secrets/`` from then on: promoting, serving and restarting never ask
the source again. Each cell process connects as its own role
(``cellplane_cells.roles``) with its own passfile.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ParamSpec, TypeVar

import httpx
import psycopg

from cellplane_cells.migrate import migrate
from cellplane_cells.roles import ADMIN_API_ROLE, API_ROLE, RELAY_ROLE, WORKER_ROLE
from cellplane_operator.errors import CellplaneError, SiteError
from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.postgres import postgres_os_user
from cellplane_operator.localplane.process import tail, wait_for
from cellplane_operator.sites.base import (
    DatabaseEndpoint,
    ServingSpec,
    SiteEndpoints,
    SiteHealth,
    SiteKey,
)
from cellplane_operator.sites.credentials import (
    CredentialSource,
    DatabaseCredentials,
    GeneratedCredentials,
)
from cellplane_operator.sites.database import (
    CELL_DBNAME, LOCAL_NETWORK, SiteDatabase, SiteNetwork, stop_postgres,
)
from cellplane_operator.sites.failover import (
    ASIDE_DATA_DIR, DEMOTED, FENCED, KEPT_DOWN, demote, fence, promote, refuse_role, restore_hba,
    rewind_or_clone, write_standby_config,
)
from cellplane_operator.sites.processes import ProcessRecord, spawn, stop_processes, wait_gone
from cellplane_operator.sites.state import DatabaseIntent, ServingIntent, SiteLayout, SiteState

__all__ = ["LocalSiteDriver", "stop_site", "stop_all_sites", "site_process_ids"]

log = logging.getLogger(__name__)

POSTGRES = "postgres"
API = "api"
SERVE_TIMEOUT = 60.0
"""How long a started API may take to answer its health check."""
STOP_GRACE = 10.0
"""SIGTERM to SIGKILL for the API and workers (they finish in-flight requests and steps)."""
MIN_TOKEN_LENGTH = 16  # what ``cellplane cell serve`` demands
GENERATED_CREDENTIALS = ".credentials"
"""Under the state dir: the passwords of a driver given no source (tests, one machine)."""

P = ParamSpec("P")
R = TypeVar("R")

@dataclass(frozen=True)
class _Wanted:
    """One process as the intent says it should run."""

    role: str
    argv: list[str]
    env: dict[str, str]
    epoch: int

    @property
    def fingerprint(self) -> str:
        # Secrets stay out: a change of token is detected against the token file.
        public = {k: v for k, v in self.env.items() if k != "CELLPLANE_CELL_ADMIN_TOKEN"}
        text = json.dumps([self.argv, sorted(public.items())])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class LocalSiteDriver:
    """``SiteDriver`` on this machine (see ``sites/base.py``)."""

    def __init__(self, binaries: Binaries, state_dir: Path, *,
                 python: str = sys.executable,
                 credentials: CredentialSource | None = None,
                 advertise_host: str = LOOPBACK,
                 network: SiteNetwork = LOCAL_NETWORK,
                 postgres_port: int | None = None) -> None:
        self._binaries = binaries
        # Where each site's Postgres listens and whom it admits (the site agent's differs).
        self._network = network
        # A fixed port for every site's Postgres (the site agent's one site); None: chosen
        # free once per site and kept in site.json.
        self._postgres_port = postgres_port
        # Where the cells' APIs listen and are published: loopback on a machine; in a
        # Pod its IP, so the placement leader and the routers in other pods reach them.
        self._host = advertise_host
        self._state_dir = state_dir
        self._python = python
        self._credentials = credentials or GeneratedCredentials(state_dir / GENERATED_CREDENTIALS)
        self._os_user = postgres_os_user()
        self._locks: dict[str, asyncio.Lock] = {}
        # One client for every health probe, from every thread (httpx clients are
        # thread-safe): a client per probe built an SSL context each time, which was
        # a quarter of the operator's CPU with a handful of sites.
        self._http = httpx.Client(timeout=2.0, verify=False)

    def layout(self, site: SiteKey) -> SiteLayout:
        return SiteLayout(self._state_dir / site.name)

    # -- the protocol ------------------------------------------------------------------

    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        return await self._with_credentials(site, self._ensure_primary, site)

    async def ensure_standby_database(self, site: SiteKey,
                                      primary: DatabaseEndpoint) -> DatabaseEndpoint:
        return await self._with_credentials(site, self._ensure_standby, site, primary)

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        return await self._with_credentials(site, self._promote, site)

    async def database_role(self, site: SiteKey) -> str | None:
        # No lock: site.json is replaced by a rename, so a read sees a whole record,
        # and this question must not wait behind a base backup.
        state = SiteState.load(self.layout(site))
        return None if state is None or state.database is None else state.database.role

    async def demote_for_handover(self, site: SiteKey) -> str:
        async with self._lock(site):
            return await asyncio.to_thread(self._demote, site)

    async def open_fenced_for_reading(self, site: SiteKey) -> str:
        async with self._lock(site):
            return await asyncio.to_thread(self._open_for_reading, site)

    async def close_fenced_reading(self, site: SiteKey) -> None:
        async with self._lock(site):
            await asyncio.to_thread(self._close_reading, site)

    async def fence_database(self, site: SiteKey) -> None:
        async with self._lock(site):
            await asyncio.to_thread(self._fence, site)

    async def rebuild_as_standby(self, site: SiteKey,
                                 primary: DatabaseEndpoint) -> DatabaseEndpoint:
        return await self._with_credentials(site, self._rebuild, site, primary)

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        return await self._with_credentials(site, self._start_serving, site, spec)

    async def warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        await self._with_credentials(site, self._warm_up, site, spec)

    async def stop_serving(self, site: SiteKey) -> None:
        async with self._lock(site):
            await asyncio.to_thread(self._stop_serving, site)

    async def check(self, site: SiteKey) -> SiteHealth:
        async with self._lock(site):
            return await asyncio.to_thread(self._check, site)

    async def observe(self, site: SiteKey) -> SiteHealth:
        """``check`` that touches no process: nothing is restarted or converged. Takes no
        lock (like ``database_role``), so it answers during a base backup."""
        return await asyncio.to_thread(self._check, site, restart=False)

    async def destroy(self, site: SiteKey) -> None:
        async with self._lock(site):
            await asyncio.to_thread(self._destroy, site)

    async def _with_credentials(self, site: SiteKey, work: Callable[P, R], *args: P.args,
                                **kwargs: P.kwargs) -> R:
        """``work`` in a thread, under the site's lock, once the site holds the cell's
        passwords: asked of the source only when the site has no copy yet."""
        async with self._lock(site):
            given: DatabaseCredentials | None = None
            if not self.layout(site).credentials_file.exists():
                given = await self._credentials.cell_credentials(site.cell)

            def installed_then_work() -> R:
                _state, _layout, db = self._open(site)
                credentials = given or db.credentials()
                if credentials is not None:
                    db.install_credentials(credentials)
                return work(*args, **kwargs)

            return await asyncio.to_thread(installed_then_work)

    # -- database ----------------------------------------------------------------------

    def _ensure_primary(self, site: SiteKey) -> DatabaseEndpoint:
        state, layout, db = self._open(site)
        refuse_role(site, state, {FENCED}, "used as a primary")
        if state.database is not None and state.database.role == DEMOTED:
            # A handover given up: the old primary serves again, not over its private socket.
            self._stop_reading(state, layout, db)
        self._run_postgres(state, layout, db, create=db.init_primary)
        try:
            # A cluster made before passwords is given them before anything else connects.
            db.secure_primary()
        except psycopg.Error as error:
            raise SiteError(f"could not move {site.name} to password authentication: "
                            f"{error}") from error
        health = db.health()
        if health is not None and health.in_recovery:
            raise SiteError(f"{site.name} holds a standby; promote it before using it as primary")
        state.database = DatabaseIntent("primary")
        state.save(layout)
        try:
            db.ensure_cell_database()
            migrate(db.endpoint.conninfo, cell=site.cell)
            db.set_role_passwords()
        except Exception as error:  # psycopg errors and a bad migration alike
            raise SiteError(f"creating or migrating the cell database of {site.name} failed: "
                            f"{error}; postgres log {db.log}:\n{tail(db.log)}") from error
        return db.endpoint

    def _ensure_standby(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        state, layout, db = self._open(site)
        refuse_role(site, state, KEPT_DOWN, "adopted as a standby (rebuild_as_standby rewinds it)")
        if _standby_of_another(state.database, primary) and db.initialized:
            return self._follow(site, state, layout, db, primary, done="re-pointed")
        self._run_postgres(state, layout, db, create=lambda: db.init_standby(primary))
        state.database = DatabaseIntent("standby", primary.host, primary.port)
        state.save(layout)
        try:
            if not db.secure_standby(primary):
                log.info("%s: still trusts loopback; waiting for the primary's passwords to "
                         "replicate before requiring them", site.name)
        except psycopg.Error as error:
            raise SiteError(f"could not move {site.name} to password authentication: "
                            f"{error}") from error
        return db.endpoint

    def _run_postgres(self, state: SiteState, layout: SiteLayout, db: SiteDatabase, *,
                      create: Callable[[], None]) -> bool:
        """Adopts the site's postmaster, or starts it (creating the cluster first if need be).

        Returns True when it had to start one.
        """
        running = db.running_postmaster()
        if running is not None:
            state.processes[POSTGRES] = running
            state.save(layout)
            db.wait_ready(running)
            return False
        if not db.initialized:
            create()
        db.start(on_spawn=lambda spawned: _record_postgres(state, layout, spawned))
        log.info("started postgres of %s on port %d", layout.root.name, db.port)
        return True

    # -- failover ----------------------------------------------------------------------

    def _promote(self, site: SiteKey) -> DatabaseEndpoint:
        state, layout, db = self._open(site)
        if state.database is None:
            raise SiteError(f"{site.name} has no database to promote")
        refuse_role(site, state, KEPT_DOWN, "promoted")
        self._run_postgres(state, layout, db, create=_never)
        promote(site, db)
        state.database = DatabaseIntent("primary")
        state.save(layout)
        return db.endpoint

    def _fence(self, site: SiteKey) -> None:
        """Intent first (so nothing restarts it), then hba, reload, terminate, stop."""
        state, layout, db = self._open(site)
        state.database = DatabaseIntent(FENCED)
        state.save(layout)
        fence(site, layout, db, running=db.running_postmaster() is not None,
              stop=lambda: db.stop(state.processes.pop(POSTGRES, None)))
        state.save(layout)
        # An old primary serves nothing: its API and workers (refused by now) go too, and
        # no later health check may start them again on the standby it becomes.
        self._end_serving(state, layout)

    def _demote(self, site: SiteKey) -> str:
        """Intent first (so nothing restarts it), then the stop; the location is kept, since
        opening the site for reading later writes WAL past it."""
        state, layout, db = self._existing(site)
        intent = state.database
        if intent is not None and intent.role == DEMOTED and intent.handover_lsn is not None:
            return intent.handover_lsn
        if intent is None or intent.role not in ("primary", DEMOTED):
            raise SiteError(f"{site.name} is not a primary: only a primary is demoted")
        state.database = DatabaseIntent(DEMOTED)
        state.save(layout)
        lsn = demote(site, db, stop=lambda: db.stop(state.processes.pop(POSTGRES, None)))
        state.database = DatabaseIntent(DEMOTED, handover_lsn=lsn)
        state.save(layout)
        return lsn

    def _open_for_reading(self, site: SiteKey) -> str:
        state, layout, db = self._existing(site)
        if state.database is None or state.database.role not in KEPT_DOWN:
            raise SiteError(f"{site.name} is neither fenced nor demoted: it is not opened for "
                            "reading")
        running = db.running_postmaster()
        if running is not None and db.is_open_for_reading(running):
            _record_postgres(state, layout, running)
            db.wait_ready(running, dsn=db.reading_dsn())
        else:
            # Kept down means stopped; a postmaster found anyway is stopped cleanly first.
            db.stop(state.processes.pop(POSTGRES, None))
            began = time.monotonic()
            db.start_for_reading(on_spawn=lambda spawned: _record_postgres(state, layout, spawned))
            log.info("%s: opened for reading in %.2fs", site.name, time.monotonic() - began)
        return db.reading_dsn(CELL_DBNAME)

    def _close_reading(self, site: SiteKey) -> None:
        if self.layout(site).state_file.exists():
            self._stop_reading(*self._existing(site))

    def _stop_reading(self, state: SiteState, layout: SiteLayout, db: SiteDatabase) -> None:
        """Stops the postmaster only if it is the one opened for reading (fast: a clean stop)."""
        running = db.running_postmaster()
        if running is not None and db.is_open_for_reading(running):
            db.stop(running)
            state.processes.pop(POSTGRES, None)
            state.save(layout)

    def _rebuild(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        state, layout, db = self._open(site)
        if state.database == DatabaseIntent("standby", primary.host, primary.port):
            self._run_postgres(state, layout, db, create=_never)
            return db.endpoint
        if state.database is None or state.database.role not in KEPT_DOWN:
            raise SiteError(f"{site.name} is neither fenced nor demoted: fence_database before "
                            "rebuilding it")
        return self._follow(site, state, layout, db, primary, done="rebuilt")

    def _follow(self, site: SiteKey, state: SiteState, layout: SiteLayout, db: SiteDatabase,
                primary: DatabaseEndpoint, *, done: str) -> DatabaseEndpoint:
        """Stopped cleanly, put on ``primary``'s timeline (rewound or cloned), started as its
        standby. The intent changes last: until then ``check`` leaves the site down (kept
        down, or a standby whose standby.signal pg_rewind may have removed)."""
        db.stop(state.processes.pop(POSTGRES, None))
        state.save(layout)
        began = time.monotonic()
        how = rewind_or_clone(site, layout, db, primary, pg_rewind=self._binaries.pg("pg_rewind"),
                              os_user=self._os_user)
        restore_hba(layout, db)
        # A copy of the new primary has its passwords: never the trust of a pg_hba.conf
        # saved before passwords existed.
        db.write_scram_hba()
        write_standby_config(db, primary)
        self._run_postgres(state, layout, db, create=_never)
        state.database = DatabaseIntent("standby", primary.host, primary.port)
        state.save(layout)
        shutil.rmtree(layout.root / ASIDE_DATA_DIR, ignore_errors=True)
        log.info("%s: %s as a standby of %s:%d by %s in %.2fs", site.name, done, primary.host,
                 primary.port, how, time.monotonic() - began)
        return db.endpoint

    # -- serving -----------------------------------------------------------------------

    def _start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        state, layout, db = self._open(site)
        if state.database is None or state.database.role != "primary":
            raise SiteError(f"{site.name} has no primary database: ensure_primary_database first")
        # The API cannot start without its database: bring a stopped one back first.
        self._run_postgres(state, layout, db, create=_never)
        started = self._serve(site, state, layout, db, spec)
        if started:
            log.info("%s: started %s under epoch %d", site.name, ", ".join(started), spec.epoch)
        else:
            log.info("%s: adopted the processes of epoch %d", site.name, spec.epoch)
        self._wait_serving(site, state, layout, spec.admin_token)
        return self._endpoints(state)

    def _warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        state, layout, db = self._existing(site)
        if state.database is None or state.database.role != "standby":
            raise SiteError(f"{site.name} is not a standby: only a standby's API is warmed up")
        started = self._serve(site, state, layout, db, replace(spec, worker_processes=0))
        if started:
            log.info("%s: warmed up the API for epoch %d", site.name, spec.epoch)

    def _serve(self, site: SiteKey, state: SiteState, layout: SiteLayout, db: SiteDatabase,
               spec: ServingSpec) -> list[str]:
        """Records ``spec`` as the serving intent and makes the processes match it."""
        if len(spec.admin_token) < MIN_TOKEN_LENGTH:
            raise SiteError(f"the admin token of {site.name} needs {MIN_TOKEN_LENGTH}+ characters")
        token_changed = layout.read_token() not in (None, spec.admin_token)
        layout.write_token(spec.admin_token)
        floors = None if spec.priority_floors is None else spec.priority_floors.as_text()
        state.serving = ServingIntent(spec.epoch, spec.worker_processes, spec.slots_per_worker,
                                      spec.allow_private_targets, floors)
        state.save(layout)
        return self._converge(site, state, layout, db, restart_api=token_changed)

    def _stop_serving(self, site: SiteKey) -> None:
        layout = self.layout(site)
        state = SiteState.load(layout)
        if state is None:
            return
        self._end_serving(state, layout)

    def _end_serving(self, state: SiteState, layout: SiteLayout) -> None:
        state.serving = None
        self._stop_roles(state, layout, [r for r in state.processes if r != POSTGRES])
        layout.token_file.unlink(missing_ok=True)

    def _wanted(self, site: SiteKey, state: SiteState, db: SiteDatabase,
                token: str) -> dict[str, _Wanted]:
        intent = state.serving
        assert intent is not None
        env = {
            "CELLPLANE_CELL_NAME": site.cell,
            "CELLPLANE_CELL_EPOCH": str(intent.epoch),
            "CELLPLANE_CELL_ALLOW_PRIVATE_TARGETS": "1" if intent.allow_private_targets else "0",
        }
        # Each pool its own role; a conninfo names a passfile, never a password.
        api_env = {**env, "CELLPLANE_CELL_DATABASE": db.role_conninfo(API_ROLE),
                   "CELLPLANE_CELL_ADMIN_DATABASE": db.role_conninfo(ADMIN_API_ROLE),
                   "CELLPLANE_CELL_ADMIN_TOKEN": token}
        worker_env = {**env, "CELLPLANE_CELL_DATABASE": db.role_conninfo(WORKER_ROLE),
                      "CELLPLANE_CELL_RELAY_DATABASE": db.role_conninfo(RELAY_ROLE)}
        command = [self._python, "-m", "cellplane_operator", "cell"]
        # Only when the Cell sets them: a cell without them keeps the command line (and so
        # the processes) it had before floors were configurable.
        floors = [] if intent.priority_floors is None \
            else ["--priority-floors", intent.priority_floors]
        wanted = {API: _Wanted(
            API, [*command, "serve", "--host", self._host, "--port", str(state.ports["api"]),
                  "--admin-port", str(state.ports["admin"])], api_env, intent.epoch)}
        for i in range(intent.worker_processes):
            role = f"worker-{i}"
            wanted[role] = _Wanted(
                role, [*command, "work", "--slots", str(intent.slots_per_worker), *floors,
                       "--worker-id", f"{site.name}-w{i}-e{intent.epoch}"], worker_env,
                intent.epoch)
        return wanted

    def _converge(self, site: SiteKey, state: SiteState, layout: SiteLayout, db: SiteDatabase,
                  *, restart_api: bool = False) -> list[str]:
        """Makes the API and worker processes match the intent; returns the roles it started.

        Everything that runs with another command line (another epoch) is
        stopped, and waited for, before anything new starts.
        """
        token = layout.read_token()
        if state.serving is None or token is None:
            return []
        wanted = self._wanted(site, state, db, token)
        stale: list[str] = []
        for role, record in list(state.processes.items()):
            if role == POSTGRES:
                continue
            if not record.running:
                del state.processes[role]
            elif (role not in wanted or record.fingerprint != wanted[role].fingerprint
                  or (role == API and restart_api)):
                stale.append(role)
        self._stop_roles(state, layout, stale)
        started: list[str] = []
        for role, want in wanted.items():
            if role in state.processes:
                continue
            pid, start_time = spawn(want.argv, log=layout.log(role), env=want.env, cwd=layout.root)
            state.processes[role] = ProcessRecord(role, pid, start_time, want.epoch,
                                                  want.fingerprint)
            state.save(layout)
            started.append(role)
        return started

    def _stop_roles(self, state: SiteState, layout: SiteLayout, roles: list[str]) -> list[int]:
        records = [state.processes[role] for role in roles if role in state.processes]
        stopped = stop_processes([(r.pid, r.start_time, signal.SIGTERM) for r in records],
                                 grace=STOP_GRACE)
        for role in roles:
            state.processes.pop(role, None)
        state.save(layout)
        return stopped

    def _probe(self, state: SiteState, token: str) -> bool:
        """The admin API answers its health check (which reads the database); the tenant API serves.

        The tenant API has no health route of its own and every route wants a
        tenant key, so its OpenAPI document stands in for "the listener serves".
        """
        try:
            admin = self._http.get(f"http://{self._host}:{state.ports['admin']}/admin/v1/health",
                                   headers={"Authorization": f"Bearer {token}"})
            tenant = self._http.get(f"http://{self._host}:{state.ports['api']}/openapi.json")
        except httpx.HTTPError:
            return False
        return admin.status_code == 200 and tenant.status_code == 200

    def _dead_role(self, state: SiteState) -> str | None:
        for role, record in state.processes.items():
            if role != POSTGRES and not record.running:
                return role
        return None

    def _wait_serving(self, site: SiteKey, state: SiteState, layout: SiteLayout,
                      token: str) -> None:
        def alive() -> None:
            if (dead := self._dead_role(state)) is not None:
                raise SiteError(f"{dead} of {site.name} exited; log {layout.log(dead)}:\n"
                                f"{tail(layout.log(dead))}")
        try:
            wait_for(lambda: self._probe(state, token), timeout=SERVE_TIMEOUT, interval=0.2,
                     alive=alive, what=f"the API of {site.name} to answer its health check")
        except SiteError:
            raise
        except CellplaneError as error:
            raise SiteError(f"{error}; log {layout.log(API)}:\n{tail(layout.log(API))}") from error

    def _endpoints(self, state: SiteState) -> SiteEndpoints:
        return SiteEndpoints(api=f"http://{self._host}:{state.ports['api']}",
                             admin=f"http://{self._host}:{state.ports['admin']}")

    # -- health and teardown -----------------------------------------------------------

    def _check(self, site: SiteKey, *, restart: bool = True) -> SiteHealth:
        layout = self.layout(site)
        state = SiteState.load(layout)
        if state is None:
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        db = self._database(layout, state)
        restarted: list[str] = []
        if restart and _restartable(state, db):
            try:
                if self._run_postgres(state, layout, db, create=_never):
                    restarted.append(POSTGRES)
            except SiteError as error:
                # A report, not a failure of the check: the operator sees the site down.
                log.warning("%s: postgres could not be restarted: %s", site.name, error)
        health = db.health()
        token = layout.read_token()
        serving = False
        if state.serving is not None and token is not None and health is not None:
            started = self._converge(site, state, layout, db) if restart else []
            restarted += started
            try:
                if started:
                    log.warning("%s: restarted %s", site.name, ", ".join(started))
                    self._wait_serving(site, state, layout, token)
                serving = self._dead_role(state) is None and self._probe(state, token)
            except SiteError as error:
                log.warning("%s: not serving: %s", site.name, error)
        epochs = {r.epoch for role, r in state.processes.items() if role != POSTGRES and r.running}
        return SiteHealth(
            database_up=health is not None,
            serving=serving,
            epoch=next(iter(epochs)) if len(epochs) == 1 else None,
            endpoints=self._endpoints(state) if state.serving is not None else None,
            restarted=tuple(restarted),
            in_recovery=None if health is None else health.in_recovery,
            replay_lag_seconds=None if health is None else health.replay_lag_seconds,
            streaming=health is not None and health.streaming,
            replay_lsn=None if health is None else health.replay_lsn,
            receive_lsn=None if health is None else health.receive_lsn,
        )

    def _destroy(self, site: SiteKey) -> None:
        layout = self.layout(site)
        stop_site(layout)
        shutil.rmtree(layout.root, ignore_errors=True)
        if layout.root.exists():
            raise SiteError(f"could not remove {layout.root}")

    # -- helpers -----------------------------------------------------------------------

    def _lock(self, site: SiteKey) -> asyncio.Lock:
        return self._locks.setdefault(site.name, asyncio.Lock())

    def _open(self, site: SiteKey) -> tuple[SiteState, SiteLayout, SiteDatabase]:
        """The site's state, created with its ports on first use."""
        layout = self.layout(site)
        state = SiteState.load(layout)
        if state is None:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            if self._os_user is not None:
                # Postgres runs as another OS user: it must walk into the site.
                self._state_dir.chmod(0o755)
            layout.logs.mkdir(parents=True, exist_ok=True)
            state = SiteState(site.cell, site.region, ports={
                POSTGRES: self._postgres_port or free_port(), "api": free_port(),
                "admin": free_port()})
            state.save(layout)
        return state, layout, self._database(layout, state)

    def _existing(self, site: SiteKey) -> tuple[SiteState, SiteLayout, SiteDatabase]:
        """The state of a site that must exist already."""
        layout = self.layout(site)
        state = SiteState.load(layout)
        if state is None:
            raise SiteError(f"{site.name} has no site here ({layout.state_file} is missing)")
        return state, layout, self._database(layout, state)

    def _database(self, layout: SiteLayout, state: SiteState) -> SiteDatabase:
        return SiteDatabase(self._binaries, layout, self._postgres_port or state.ports[POSTGRES],
                            os_user=self._os_user, network=self._network)


def _record_postgres(state: SiteState, layout: SiteLayout, record: ProcessRecord) -> None:
    state.processes[POSTGRES] = record
    state.save(layout)


def _standby_of_another(intent: DatabaseIntent | None, primary: DatabaseEndpoint) -> bool:
    return (intent is not None and intent.role == "standby"
            and (intent.primary_host, intent.primary_port) != (primary.host, primary.port))


def _restartable(state: SiteState, db: SiteDatabase) -> bool:
    """May ``check`` start the site's Postgres? Never one kept down, and never a standby
    without standby.signal: a re-point cut short after pg_rewind would come up a primary."""
    intent = state.database
    if intent is None or intent.role in KEPT_DOWN:
        return False
    return intent.role != "standby" or (db.data_dir / "standby.signal").exists()


def _never() -> None:
    raise SiteError("the site's Postgres cluster is gone; it is not recreated by a health check")


def stop_site(layout: SiteLayout) -> list[int]:
    """Stops the site's API and workers, then its Postgres; returns the PIDs stopped."""
    state = SiteState.load(layout)
    stopped: list[int] = []
    postgres: ProcessRecord | None = None
    if state is not None:
        others = [r for role, r in state.processes.items() if role != POSTGRES]
        stopped += stop_processes([(r.pid, r.start_time, signal.SIGTERM) for r in others],
                                  grace=STOP_GRACE)
        postgres = state.processes.get(POSTGRES)
    # postmaster.pid is read too: a crash between start and save leaves no record.
    stopped += stop_postgres(layout, postgres)
    if state is not None:
        state.processes.clear()
        state.save(layout)
    return stopped


def stop_all_sites(state_dir: Path) -> list[int]:
    """Stops every process of every site under ``state_dir``, Postgres included.

    For test fixtures and the demo: site processes outlive the operator by
    design, so whoever made the state dir cleans up with this. Intent stays in
    ``site.json`` (a later operator brings the sites back); the PIDs it stopped
    are returned, for leak checks, once they are gone from /proc altogether
    (orphans' zombies included, waited for up to a few seconds).
    """
    if not state_dir.is_dir():
        return []
    stopped: list[int] = []
    for root in sorted(p for p in state_dir.iterdir() if p.is_dir()):
        stopped += stop_site(SiteLayout(root))
    if left := wait_gone(stopped):
        log.warning("stopped site processes not yet reaped by their parent: %s", left)
    return stopped


def site_process_ids(state_dir: Path) -> list[int]:
    """The recorded PIDs of every process of every site under ``state_dir`` (for tests and
    benchmarks that lose a region on purpose)."""
    pids: list[int] = []
    if state_dir.is_dir():
        for root in sorted(p for p in state_dir.iterdir() if p.is_dir()):
            state = SiteState.load(SiteLayout(root))
            if state is not None:
                pids += [record.pid for record in state.processes.values()]
    return pids
