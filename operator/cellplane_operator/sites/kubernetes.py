"""The ``kubernetes`` site driver: each site of a cell as Kubernetes workloads.

A site (one cell in one region) is the objects ``domain/site_objects.py`` renders: a
StatefulSet of one Postgres Pod whose PID 1 is the site agent, its Services, and on the
active site the cell API and the workers as Deployments. This driver applies them
(server-side apply, field manager ``cellplane-operator``) and asks the site's agent, over
its Service with the cell's agent token, for everything that touches the database; the
agent does what ``sites/local.py`` does to a database on this machine.

The operator still decides (ownership, epochs, which region is primary); this driver only
makes objects and agents match the decision, as the local driver makes processes match.

**A returning site never accepts a write before its epoch is checked.** The agent starts
no Postgres on its own. ``check`` asks it to restart a stopped Postgres only when this
operator has already told that very agent process (its ``boot_id``) what its database is:
an agent restarted on a node that came back after a takeover stays held until the
region's runner, having compared etcd with ``database_role``, calls ``ensure_*``,
``promote_database``, ``fence_database`` or ``rebuild_as_standby``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cellplane_operator.domain.site_names import site_names, site_object_refs
from cellplane_operator.domain.site_objects import (
    ADMIN_PORT,
    API_PORT,
    DEFAULT_API_RESOURCES,
    DEFAULT_DATABASE_RESOURCES,
    DEFAULT_WORKER_RESOURCES,
    KubernetesSite,
    Resources,
    ServingRole,
    SiteSecrets,
    site_objects,
    warm_api_objects,
)
from cellplane_operator.errors import CellplaneError, KubeConflictError, SiteError
from cellplane_operator.kube import CELLS, SECRETS
from cellplane_operator.kube.base import KubeApi
from cellplane_operator.kube.client import DEPLOYMENTS, PODS, STATEFULSETS, resource_of
from cellplane_operator.localplane.postgres import SUPERUSER
from cellplane_operator.sites.agent_client import AgentEndpoint, SiteAgentClient
from cellplane_operator.sites.base import (
    DatabaseEndpoint,
    ServingSpec,
    SiteEndpoints,
    SiteHealth,
    SiteKey,
)
from cellplane_operator.sites.credentials import CredentialSource, write_private

__all__ = ["KubernetesDriverConfig", "KubernetesSiteDriver", "AGENT_URL_PORT", "cell_driver_names"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "cellplane-operator"
AGENT_URL_PORT = 9443
AGENT_START_TIMEOUT = 240.0
"""From applying a site's StatefulSet to its agent answering: a volume bound, the image
started (imported, never pulled, on the local cluster)."""
SERVE_TIMEOUT = 180.0
"""From applying the API and workers of an epoch to all of them Ready."""
STOP_TIMEOUT = 60.0
"""How long ``stop_serving`` waits for the Pods of the API and workers to be gone. A Pod on
a lost node never goes: the database's epoch fence refuses what it would still write."""
POLL_SECONDS = 0.25
"""A takeover waits on these polls (two Deployments read from the apiserver each)."""

_DEFAULT_RESOURCES = {"database": DEFAULT_DATABASE_RESOURCES, "api": DEFAULT_API_RESOURCES,
                      "worker": DEFAULT_WORKER_RESOURCES}


@dataclass(frozen=True)
class KubernetesDriverConfig:
    """What the chart tells the operator about the cells it runs as workloads."""

    image: str
    """The image of the sites' Pods (the operator's own)."""
    namespace: str
    """Where the sites' objects live: the operator's namespace, where the cells' Secrets are
    (a ``secretKeyRef`` cannot leave its namespace)."""
    image_pull_policy: str = "IfNotPresent"
    storage_class: str | None = None
    """For a Cell that names none; None is the cluster's default class."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    """The chart's ``cells.resources``: ``{"database": {"requests": {"cpu": ...}, "limits":
    ...}, "api": ..., "worker": ...}``, over ``site_objects``' defaults; a Cell's own
    ``spec.driver.resources`` go over these."""
    agent_url: Callable[[str, str, str], str] | None = None
    """The agent's base URL for (cell, region, namespace); by default its Service's DNS name.
    Tests outside the cluster put a relay here."""


@dataclass
class _Site:
    """What this operator knows of one of its sites between calls."""

    serving_epoch: int | None = None
    acknowledged_boot: str | None = None
    """The agent process this operator has told what its database is (see the module doc)."""


class KubernetesSiteDriver:
    """``SiteDriver`` with Kubernetes objects (see ``sites/base.py``)."""

    def __init__(self, kube: KubeApi, config: KubernetesDriverConfig, *,
                 credentials: CredentialSource, state_dir: Path) -> None:
        self._kube = kube
        self._config = config
        self._credentials = credentials
        self._state_dir = state_dir / "kubernetes"
        self._sites: dict[str, _Site] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._cells: dict[str, dict[str, Any]] = {}
        # Read once per cell: ``check`` and ``database_role`` run every step of every site.
        self._agent_tokens: dict[str, str] = {}
        self._passfiles: dict[str, str] = {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the protocol: the database ----------------------------------------------------

    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        async with self._lock(site):
            agent = await self._database_objects(site)
            made = await agent.ensure_primary(None)
            await self._acknowledge(site, agent)
            return await self._endpoint(site, made)

    async def ensure_standby_database(self, site: SiteKey,
                                      primary: DatabaseEndpoint) -> DatabaseEndpoint:
        async with self._lock(site):
            agent = await self._database_objects(site)
            made = await agent.ensure_standby(primary.host, primary.port)
            await self._acknowledge(site, agent)
            return await self._endpoint(site, made)

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        async with self._lock(site):
            agent = await self._agent(site)
            made = await agent.promote()
            await self._acknowledge(site, agent)
            return await self._endpoint(site, made)

    async def database_role(self, site: SiteKey) -> str | None:
        if not await self._has_database(site):
            return None
        agent = await self._agent(site)
        status = await agent.status(restart=False)
        return status.role

    async def demote_for_handover(self, site: SiteKey) -> str:
        async with self._lock(site):
            agent = await self._agent(site)
            lsn = await agent.demote()
            await self._acknowledge(site, agent)
            return lsn

    async def open_fenced_for_reading(self, site: SiteKey) -> str:
        async with self._lock(site):
            agent = await self._agent(site)
            opened = await agent.open_reading()
            endpoint = await self._endpoint(site, opened)
            return endpoint.conninfo

    async def close_fenced_reading(self, site: SiteKey) -> None:
        async with self._lock(site):
            if await self._has_database(site):
                await (await self._agent(site)).close_reading()

    async def fence_database(self, site: SiteKey) -> None:
        async with self._lock(site):
            # An old primary serves nothing: its API and workers go before its database.
            await self._delete_serving(site)
            agent = await self._agent(site)
            await agent.fence()
            await self._acknowledge(site, agent)

    async def rebuild_as_standby(self, site: SiteKey,
                                 primary: DatabaseEndpoint) -> DatabaseEndpoint:
        async with self._lock(site):
            agent = await self._agent(site)
            made = await agent.rebuild(primary.host, primary.port)
            await self._acknowledge(site, agent)
            return await self._endpoint(site, made)

    # -- the protocol: serving ---------------------------------------------------------

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        async with self._lock(site):
            model = await self._model(site, ServingRole.ACTIVE, spec)
            for manifest in site_objects(model):
                await self._apply(manifest)
            await self._wait_serving(site, model)
            self._state(site).serving_epoch = spec.epoch
            log.info("%s: serving under epoch %d", site.name, spec.epoch)
            return self._endpoints(site)

    async def warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        """The API Deployment made ahead on the standby, not waited for: after a promotion
        ``start_serving`` under ``spec.epoch`` finds its Pods running and adds the workers."""
        async with self._lock(site):
            model = await self._model(site, ServingRole.STANDBY, spec)
            for manifest in warm_api_objects(model):
                await self._apply(manifest)

    async def stop_serving(self, site: SiteKey) -> None:
        async with self._lock(site):
            await self._delete_serving(site)

    async def check(self, site: SiteKey) -> SiteHealth:
        if not await self._has_database(site):
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        agent = await self._agent(site, wait=False)
        state = self._state(site)
        try:
            status = await agent.status(restart=False)
            if status.boot_id == state.acknowledged_boot and not status.database_up:
                status = await agent.status(restart=True)
        except SiteError as error:
            log.warning("%s: the site agent does not answer: %s", site.name, error)
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        serving_epoch = await self._serving_epoch(site)
        if serving_epoch is not None and state.serving_epoch is None:
            state.serving_epoch = serving_epoch  # adopted after an operator restart
        return SiteHealth(
            database_up=status.database_up, serving=serving_epoch is not None,
            epoch=serving_epoch,
            endpoints=None if serving_epoch is None else self._endpoints(site), restarted=tuple(status.restarted),
            in_recovery=status.in_recovery, replay_lag_seconds=status.replay_lag_seconds,
            streaming=status.streaming, replay_lsn=status.replay_lsn,
            receive_lsn=status.receive_lsn)

    async def destroy(self, site: SiteKey) -> None:
        async with self._lock(site):
            cell = self._cells.get(site.cell) or await self._kube.get(CELLS, site.cell) or {}
            claims = _driver_spec(cell).get("claimPolicy") == "Delete"
            for ref in site_object_refs(site.cell, site.region, self._config.namespace,
                                        claims=claims):
                await self._kube.delete(resource_of(ref.kind), ref.name, namespace=ref.namespace)
            self._sites.pop(site.name, None)
            self._agent_tokens.pop(site.cell, None)
            self._passfiles.pop(site.cell, None)

    # -- objects -----------------------------------------------------------------------

    async def _database_objects(self, site: SiteKey) -> SiteAgentClient:
        """The site's database objects applied, its agent answering."""
        model = await self._model(site, self._role(site), None)
        await self._agent_token(site.cell)
        await self._credentials.cell_credentials(site.cell)  # the Secret the Pod mounts
        for manifest in site_objects(model):
            if manifest["kind"] in ("StatefulSet", "Service") and \
                    manifest["metadata"]["name"] != model.names.api:
                await self._apply(manifest)
        return await self._agent(site)

    async def _model(self, site: SiteKey, role: ServingRole,
                     spec: ServingSpec | None) -> KubernetesSite:
        cell = await self._cell(site.cell)
        driver = _driver_spec(cell)
        storage = driver.get("storage") or {}
        resources = driver.get("resources") or {}
        serving = self._state(site).serving_epoch
        return KubernetesSite(
            cell=site.cell, cell_uid=str(cell["metadata"]["uid"]), region=site.region,
            role=role, epoch=spec.epoch if spec is not None else (serving or 1),
            image=self._config.image, namespace=self._config.namespace,
            secrets=SiteSecrets.for_cell(site.cell),
            storage_class=storage.get("className") or self._config.storage_class,
            storage_size=storage.get("size") or "1Gi",
            database_resources=self._resources(resources, "database"),
            api_resources=self._resources(resources, "api"),
            worker_resources=self._resources(resources, "worker"),
            api_replicas=int(driver.get("apiReplicas") or 1),
            worker_replicas=int(driver.get("workerReplicas") or 1),
            slots_per_worker=spec.slots_per_worker if spec is not None else 10,
            priority_floors=(spec.priority_floors.as_text()
                             if spec is not None and spec.priority_floors is not None else None),
            allow_private_targets=bool(spec.allow_private_targets if spec is not None
                                       else driver.get("allowPrivateTargets")),
            delete_claims=driver.get("claimPolicy") == "Delete",
            image_pull_policy=self._config.image_pull_policy)

    def _resources(self, cell: Mapping[str, Any], component: str) -> Resources:
        """The component's requests and limits: the Cell's, else the chart's, else the
        built-in defaults, amount by amount."""
        layers = [self._config.resources.get(component) or {}, cell.get(component) or {}]
        chosen = _DEFAULT_RESOURCES[component]
        for layer in layers:
            requests, limits = layer.get("requests") or {}, layer.get("limits") or {}
            chosen = Resources(cpu_request=requests.get("cpu") or chosen.cpu_request,
                               memory_request=requests.get("memory") or chosen.memory_request,
                               memory_limit=limits.get("memory") or chosen.memory_limit,
                               cpu_limit=limits.get("cpu") or chosen.cpu_limit)
        return chosen

    def _role(self, site: SiteKey) -> ServingRole:
        return ServingRole.ACTIVE if self._state(site).serving_epoch is not None \
            else ServingRole.STANDBY

    async def _cell(self, name: str) -> dict[str, Any]:
        cell = await self._kube.get(CELLS, name)
        if cell is None:
            cached = self._cells.get(name)
            if cached is None:
                raise SiteError(f"Cell {name} is gone: its sites are not made again")
            return cached
        self._cells[name] = cell
        return cell

    async def _apply(self, manifest: Mapping[str, Any]) -> None:
        try:
            await self._kube.apply(manifest, field_manager=FIELD_MANAGER)
        except CellplaneError as error:
            raise SiteError(f"applying {manifest['kind']} {manifest['metadata']['name']}: "
                            f"{error}") from error

    async def _has_database(self, site: SiteKey) -> bool:
        names = site_names(site.cell, site.region)
        found = await self._kube.get(STATEFULSETS, names.database,
                                     namespace=self._config.namespace)
        return found is not None

    async def _delete_serving(self, site: SiteKey) -> None:
        """The API and workers gone, their Pods waited for (never two epochs at once)."""
        names = site_names(site.cell, site.region)
        namespace = self._config.namespace
        for name in (names.worker, names.api):
            await self._kube.delete(DEPLOYMENTS, name, namespace=namespace,
                                    propagation="Foreground")
        await self._kube.delete(resource_of("Service"), names.api, namespace=namespace)
        self._state(site).serving_epoch = None
        selector = (f"app.kubernetes.io/instance={site.cell},cellplane.io/region={site.region},"
                    "app.kubernetes.io/component in (api,worker)")

        async def gone() -> bool:
            return not await self._kube.list(PODS, namespace=namespace, label_selector=selector)
        if not await _await(gone, STOP_TIMEOUT):
            log.warning("%s: Pods of its API or workers still exist %.0fs after their "
                        "Deployments were deleted (a lost node?); the database's epoch fence "
                        "refuses them", site.name, STOP_TIMEOUT)

    async def _wait_serving(self, site: SiteKey, model: KubernetesSite) -> None:
        async def ready() -> bool:
            return await self._serving_epoch(site) == model.epoch
        if not await _await(ready, SERVE_TIMEOUT):
            raise SiteError(f"the API of {site.name} under epoch {model.epoch} is not "
                            f"Ready after {SERVE_TIMEOUT:.0f}s: kubectl -n "
                            f"{model.namespace} describe deployment {model.names.api} "
                            f"{model.names.worker}")

    async def _serving_epoch(self, site: SiteKey) -> int | None:
        """The epoch the site's API runs and is Ready under, its workers' Deployment made
        under the same epoch; or None.

        The workers' Pods are not waited for: the API accepts jobs and they wait in the
        queue, so a takeover publishes the cell as soon as its API serves, not after a
        worker Pod has started too (on a loaded node, most of the time between promotion
        and serving). The kubelet starts and restarts the workers; Recreate and the
        database's epoch fence keep an older epoch's workers from writing meanwhile."""
        names = site_names(site.cell, site.region)
        namespace = self._config.namespace
        api = await self._kube.get(DEPLOYMENTS, names.api, namespace=namespace)
        workers = await self._kube.get(DEPLOYMENTS, names.worker, namespace=namespace)
        if api is None or workers is None or not _rolled_out(api):
            return None
        epoch = _epoch_of(api)
        return epoch if epoch is not None and _epoch_of(workers) == epoch else None

    def _endpoints(self, site: SiteKey) -> SiteEndpoints:
        """The API Service's URLs: routers and the placement leader run in the cluster."""
        host = f"{site_names(site.cell, site.region).api}.{self._config.namespace}.svc.cluster.local"
        return SiteEndpoints(api=f"http://{host}:{API_PORT}", admin=f"http://{host}:{ADMIN_PORT}")

    # -- the agent ---------------------------------------------------------------------

    async def _agent(self, site: SiteKey, *, wait: bool = True) -> SiteAgentClient:
        token = await self._agent_token(site.cell)
        names = site_names(site.cell, site.region)
        if self._config.agent_url is not None:
            url = self._config.agent_url(site.cell, site.region, self._config.namespace)
        else:
            url = f"http://{names.agent}.{self._config.namespace}.svc.cluster.local:{AGENT_URL_PORT}"
        agent = SiteAgentClient(url, token, http=self._http)
        if wait and not await _await(agent.healthy, AGENT_START_TIMEOUT):
            raise SiteError(f"the site agent of {site.name} ({url}) does not answer after "
                            f"{AGENT_START_TIMEOUT:.0f}s: kubectl -n {self._config.namespace} "
                            f"describe pod {names.pod}")
        return agent

    async def _acknowledge(self, site: SiteKey, agent: SiteAgentClient) -> None:
        status = await agent.status(restart=False)
        self._state(site).acknowledged_boot = status.boot_id

    async def _agent_token(self, cell: str) -> str:
        """The cell's agent token, from its Secret ``cell-<cell>-agent`` (made on first use;
        another operator's concurrent make wins)."""
        if (known := self._agent_tokens.get(cell)) is not None:
            return known
        name = SiteSecrets.for_cell(cell).agent_token
        namespace = self._config.namespace
        found = await self._kube.get(SECRETS, name, namespace=namespace)
        if found is None:
            try:
                await self._kube.create(SECRETS, {
                    "metadata": {"name": name, "namespace": namespace,
                                 "labels": {"cellplane.io/cell": cell}},
                    "type": "Opaque", "stringData": {"token": secrets.token_urlsafe(32)}},
                    namespace=namespace)
            except KubeConflictError:
                pass
            found = await self._kube.get(SECRETS, name, namespace=namespace)
            if found is None:
                raise SiteError(f"Secret {namespace}/{name} vanished while being made")
        token = base64.b64decode(found["data"]["token"]).decode()
        self._agent_tokens[cell] = token
        return token

    async def _endpoint(self, site: SiteKey, made: AgentEndpoint) -> DatabaseEndpoint:
        """The agent's endpoint with this operator's passfile for the superuser."""
        passfile = self._state_dir / site.cell / "passfile"
        if self._passfiles.get(site.cell) is None or not passfile.exists():
            credentials = await self._credentials.cell_credentials(site.cell)
            line = f"*:*:*:{SUPERUSER}:{credentials.password(SUPERUSER)}\n"
            write_private(passfile, line)
            self._passfiles[site.cell] = str(passfile)
        return DatabaseEndpoint(host=made.host, port=made.port, dbname=made.dbname,
                                user=made.user, passfile=str(passfile))

    # -- helpers -----------------------------------------------------------------------

    def _state(self, site: SiteKey) -> _Site:
        return self._sites.setdefault(site.name, _Site())

    def _lock(self, site: SiteKey) -> asyncio.Lock:
        return self._locks.setdefault(site.name, asyncio.Lock())


def cell_driver_names(kube: KubeApi,
                      namespace: str) -> Callable[[SiteKey], Awaitable[str | None]]:
    """For ``sites.dispatch``: a site's Cell's ``spec.driver.name``; for a Cell already gone,
    ``kubernetes`` when the site's StatefulSet exists in ``namespace``, else None."""
    async def driver_name(site: SiteKey) -> str | None:
        cell = await kube.get(CELLS, site.cell)
        if cell is not None:
            return str(_driver_spec(cell).get("name") or "local")
        names = site_names(site.cell, site.region)
        found = await kube.get(STATEFULSETS, names.database, namespace=namespace)
        return "kubernetes" if found is not None else None
    return driver_name


def _driver_spec(cell: Mapping[str, Any]) -> dict[str, Any]:
    return dict((cell.get("spec") or {}).get("driver") or {})


def _epoch_of(deployment: Mapping[str, Any]) -> int | None:
    epoch = (deployment["metadata"].get("annotations") or {}).get("cellplane.io/epoch")
    return int(epoch) if isinstance(epoch, str) and epoch.isdigit() else None


def _rolled_out(deployment: Mapping[str, Any]) -> bool:
    """Every replica of the Deployment's current template is Ready and no other runs."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    wanted = int(spec.get("replicas", 1))
    return (int(status.get("observedGeneration", 0)) >= int(deployment["metadata"]
                                                            .get("generation", 0))
            and int(status.get("updatedReplicas", 0)) == wanted
            and int(status.get("readyReplicas", 0)) == wanted
            and int(status.get("replicas", 0)) == wanted)


async def _await(condition: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """Polls ``condition`` until it holds (True) or ``timeout`` passes (False); an error of
    the apiserver or the agent counts as not yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await condition():
                return True
        except (CellplaneError, httpx.HTTPError) as error:
            log.debug("not yet: %s", error)
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)
