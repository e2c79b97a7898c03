"""What one site of a ``kubernetes``-driver cell is, as Kubernetes objects (plain dicts).

A site (one cell in one region) is:

- a StatefulSet of one Postgres Pod with its PersistentVolumeClaim, pinned to the
  region's nodes, whose one container runs the site agent (``agent_argv``);
- a headless Service for the StatefulSet, a ClusterIP Service for its database
  (5432) and one for the agent's endpoint;
- on the active site only: the cell API as a Deployment behind a Service (tenant
  and admin ports), and the workers as a Deployment.

Every site, active or standby, has the same database objects: a switchover
creates or deletes the API and the workers and relabels the rest, and never
touches a StatefulSet's spec (``role_change``). Nothing that changes over a
site's life (its role, its epoch) is in a selector or in the database Pod's
template: a selector is immutable, and a template change is a new revision.

Names and their length limit are ``domain/site_names.py``; deleting a site goes by
those names alone (``site_names.site_object_refs``). Rendering is pure and
deterministic: the same ``KubernetesSite`` gives the same dicts, byte for byte once
serialised. Passwords and tokens never appear: the objects name Secrets
(``secretKeyRef``, a Secret volume) and the kubelet expands ``$(VAR)`` references
into the conninfo strings inside the container. Nothing here talks to an apiserver;
the driver that applies these (server-side apply, field manager
``cellplane-operator``) is the next step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from cellplane_cells.roles import ADMIN_API_ROLE, API_ROLE, RELAY_ROLE, WORKER_ROLE
from cellplane_operator.domain.site_names import ObjectRef, SiteNames, site_names

__all__ = [
    "CELL_API_VERSION", "DATABASE_PORT", "AGENT_PORT", "READING_PORT", "API_PORT", "ADMIN_PORT",
    "IMAGE_USER", "pod_host", "warm_api_objects",
    "REGION_LABEL", "POSTGRES_BIN", "ServingRole", "Resources", "SiteSecrets", "KubernetesSite",
    "agent_argv", "database_host", "site_objects", "object_ref", "RoleChange", "role_change",
    "DEFAULT_DATABASE_RESOURCES", "DEFAULT_API_RESOURCES", "DEFAULT_WORKER_RESOURCES",
]

Manifest = dict[str, Any]

CELL_API_VERSION = "cellplane.io/v1alpha1"
"""The Cell's apiVersion in owner references (``api.v1alpha1.API_VERSION``; a unit test
keeps the two equal, since the domain does not import the pydantic models)."""
REGION_LABEL = "topology.kubernetes.io/region"
"""The node label that says a node's region (docs/cluster.md)."""
DATABASE_PORT = 5432
AGENT_PORT = 9443
"""The site agent's HTTP endpoint (bearer token; TLS is an open question, see
docs/kubernetes-driver.md)."""
READING_PORT = 5433
"""A fenced or demoted Postgres opened read-only for the loss report: the superuser only."""
API_PORT = 8080
"""The cell's tenant API (``cellplane cell serve --port``)."""
ADMIN_PORT = 8081
"""The cell's admin API (``cellplane cell serve --admin-port``)."""
IMAGE_USER = 65532
"""The operator image's user and group (the Dockerfile's user id): initdb refuses root."""
POSTGRES_BIN = "/usr/lib/postgresql/15/bin"
"""Debian's PostgreSQL 15 server programs in the operator image."""
CELL_DBNAME = "cellplane"
"""The cell's database on every site (``sites.database.CELL_DBNAME``)."""
MANAGER = "cellplane-operator"

STATE_DIR = "/var/lib/cellplane/site"
"""Mount of the site's PersistentVolume: the site agent keeps ``<cell>@<region>/`` there
(``pgdata/``, its record of role and epoch, its passfiles), the local driver's layout."""
SOCKET_DIR = "/var/run/postgresql"
"""Postgres's unix sockets and their lock files (an emptyDir: the root file system is read-only)."""
CREDENTIALS_DIR = "/etc/cellplane/database"
"""The cell's database Secret, one file per role, read by the agent only."""
AGENT_TOKEN_DIR = "/etc/cellplane/agent"
"""The agent token's Secret (key ``token``): a file, not a variable, so the kubelet renews it
in place when the Secret changes, and no process's environment carries it."""

# -- the input ----------------------------------------------------------------------------

class ServingRole(str, Enum):
    """The ``cellplane.io/role`` of a site's objects: whether it serves the cell now."""

    ACTIVE = "active"
    STANDBY = "standby"


@dataclass(frozen=True)
class Resources:
    """Requests and limits of one container. No CPU limit by default: CFS throttling stalls a
    Postgres checkpointer or WAL sender, or an API under a burst, while the CPU is idle; the
    memory limit is what keeps a node alive, and it is always set."""

    cpu_request: str
    memory_request: str
    memory_limit: str
    cpu_limit: str | None = None

    def render(self) -> Manifest:
        limits: dict[str, str] = {"memory": self.memory_limit}
        if self.cpu_limit is not None:
            limits["cpu"] = self.cpu_limit
        return {"requests": {"cpu": self.cpu_request, "memory": self.memory_request},
                "limits": limits}


DEFAULT_DATABASE_RESOURCES = Resources(cpu_request="250m", memory_request="512Mi",
                                       memory_limit="1Gi")
DEFAULT_API_RESOURCES = Resources(cpu_request="100m", memory_request="192Mi",
                                  memory_limit="512Mi")
DEFAULT_WORKER_RESOURCES = Resources(cpu_request="100m", memory_request="192Mi",
                                     memory_limit="512Mi")


@dataclass(frozen=True)
class SiteSecrets:
    """Names of the Secrets the site's Pods read, in the site's namespace (a ``secretKeyRef``
    cannot cross namespaces)."""

    database: str
    """One key per database role, its password (``sites.credentials``)."""
    admin_token: str
    """Key ``token``: the cell admin API's bearer token."""
    agent_token: str
    """Key ``token``: the bearer token of the site agent's endpoint (new: no code makes it yet)."""

    @classmethod
    def for_cell(cls, cell: str) -> SiteSecrets:
        """The names the operator uses today (``sites.credentials.secret_name``,
        ``runtime.context``), plus the agent's."""
        return cls(database=f"cell-{cell}-database", admin_token=f"cell-{cell}-admin",
                   agent_token=f"cell-{cell}-agent")


@dataclass(frozen=True)
class KubernetesSite:
    """Everything that decides one site's objects. Holds no secret, only Secrets' names."""

    cell: str
    cell_uid: str
    """metadata.uid of the Cell, for the owner references."""
    region: str
    role: ServingRole
    epoch: int
    """The placement-group epoch the active site's API and workers act under."""
    image: str
    namespace: str
    secrets: SiteSecrets
    storage_class: str | None = "cellplane-local"
    """None: the cluster's default StorageClass."""
    storage_size: str = "1Gi"
    database_resources: Resources = DEFAULT_DATABASE_RESOURCES
    api_resources: Resources = DEFAULT_API_RESOURCES
    worker_resources: Resources = DEFAULT_WORKER_RESOURCES
    api_replicas: int = 1
    worker_replicas: int = 1
    slots_per_worker: int = 10
    priority_floors: str | None = None
    """Each worker's ``--priority-floors`` (``spec.capacity.priorityFloors``); None: the
    worker's default shares."""
    allow_private_targets: bool = False
    """Development only (``spec.driver.allowPrivateTargets``)."""
    delete_claims: bool = False
    """Deleting the StatefulSet deletes its claim too; False keeps the data (Retain)."""
    image_pull_policy: str = "IfNotPresent"
    """``Never`` on the local cluster, whose images are imported, never pulled."""
    names: SiteNames = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", site_names(self.cell, self.region))
        if not self.cell_uid:
            raise ValueError("a site's owner reference needs the Cell's metadata.uid")
        if self.epoch < 1:
            raise ValueError(f"epoch must be >= 1, not {self.epoch}")
        for what, count in (("api_replicas", self.api_replicas),
                            ("worker_replicas", self.worker_replicas),
                            ("slots_per_worker", self.slots_per_worker)):
            if count < 1:
                raise ValueError(f"{what} must be >= 1, not {count}")


# -- labels, owners, security -------------------------------------------------------------

def _selector(site: KubernetesSite, component: str) -> dict[str, str]:
    """Labels that never change over a site's life: selectors are immutable."""
    return {"app.kubernetes.io/name": "cellplane", "app.kubernetes.io/instance": site.cell,
            "app.kubernetes.io/component": component, "cellplane.io/region": site.region}


def _pod_labels(site: KubernetesSite, component: str) -> dict[str, str]:
    """A Pod template's labels: no role, since a template change is a new revision (for the
    database, a Postgres restart). The operator may label a Pod's role on the Pod itself."""
    return {**_selector(site, component), "app.kubernetes.io/managed-by": MANAGER,
            "cellplane.io/cell": site.cell}


def _labels(site: KubernetesSite, component: str) -> dict[str, str]:
    return {**_pod_labels(site, component), "cellplane.io/role": site.role.value}


def _metadata(site: KubernetesSite, name: str, component: str) -> Manifest:
    return {"name": name, "namespace": site.namespace, "labels": _labels(site, component),
            "ownerReferences": [_owner(site)]}


def _owner(site: KubernetesSite) -> Manifest:
    """The Cell owns every object of its sites; a cluster-scoped owner of namespaced
    dependents is allowed (the reverse is not).

    blockOwnerDeletion false: a foreground deletion of the Cell would otherwise wait for
    every dependent to be gone, and a Pod on a lost region's node stays Terminating until
    the node returns, so a lost region would hold the Cell's deletion (the operator
    collects a returning region's leftovers itself). It also spares the operator the
    ``cells/finalizers`` update permission that setting it to true requires.
    """
    return {"apiVersion": CELL_API_VERSION, "kind": "Cell", "name": site.cell,
            "uid": site.cell_uid, "controller": True, "blockOwnerDeletion": False}


def _pod_security() -> Manifest:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_USER, "runAsGroup": IMAGE_USER,
            "fsGroup": IMAGE_USER,
            # Not only for speed: a recursive chown/chmod would make pgdata group-writable,
            # and Postgres refuses a data directory that is not 0700 or 0750. The volume's
            # root matches after its first mount, so nothing below it is walked again.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security() -> Manifest:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def _pod_spec(site: KubernetesSite, containers: list[Manifest], volumes: list[Manifest], *,
              grace_seconds: int) -> Manifest:
    return {
        # The site's processes never call the apiserver, and Service environment variables
        # (one set per Service in the namespace) are noise at best.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {REGION_LABEL: site.region},
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": containers,
        "volumes": volumes,
    }


def _empty_dir(name: str, **options: str) -> Manifest:
    return {"name": name, "emptyDir": dict(options)}


def _secret_volume(name: str, secret: str) -> Manifest:
    """Files for the Pod's own user: mode 0400, to which the kubelet adds the group's read bit
    (the group is the Pod's fsGroup); the agent copies what libpq wants as 0600."""
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o400}}


def _secret_env(name: str, secret: str, key: str) -> Manifest:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


# -- the database -------------------------------------------------------------------------

def database_host(site: KubernetesSite) -> str:
    """The site's database Service: where its API and workers, and other regions' standbys,
    reach its Postgres."""
    return f"{site.names.database}.{site.namespace}.svc.cluster.local"


def pod_host(site: KubernetesSite) -> str:
    """The database Pod's own DNS name (the headless Service publishes it before the Pod is
    Ready): what the agent advertises, where the operator and other regions' standbys reach
    this Postgres without the database Service's readiness gate or its NAT."""
    names = site.names
    return f"{names.pod}.{names.pods}.{site.namespace}.svc.cluster.local"


def agent_argv(site: KubernetesSite) -> list[str]:
    """The database container's command: the site agent (``sites/agent*.py``).

    ``cellplane site agent`` supervises Postgres as its child and performs, when the
    operator asks over its endpoint (``--listen``, the bearer token in ``--token-file``),
    what ``sites/local.py`` does to a database: init, base backup from a primary, stream
    as a standby, promote then checkpoint, demote, fence, open a fenced server for
    reading, rewind or re-clone, and report health and WAL positions. It keeps its own
    record (role, last epoch) under ``--state-dir``, beside ``pgdata/``. On start it
    serves its endpoint but starts no Postgres until the operator has compared that record
    with etcd (``domain/failover.site_role``): a Pod restarted on a node that returns after
    a takeover never comes up as a writable primary.
    """
    return ["cellplane", "site", "agent",
            f"--cell={site.cell}", f"--region={site.region}",
            f"--state-dir={STATE_DIR}", f"--socket-dir={SOCKET_DIR}",
            f"--postgres-bin={POSTGRES_BIN}", f"--postgres-port={DATABASE_PORT}",
            f"--credentials-dir={CREDENTIALS_DIR}", f"--token-file={AGENT_TOKEN_DIR}/token",
            f"--listen=0.0.0.0:{AGENT_PORT}",
            # Endpoints name the Pod's own DNS name: the operator reaches a fenced server
            # opened for reading there (the Pod is not Ready, the database Service skips it).
            f"--advertise-host={pod_host(site)}", f"--reading-port={READING_PORT}"]


def _database_container(site: KubernetesSite) -> Manifest:
    return {
        "name": "database",
        "image": site.image,
        "imagePullPolicy": site.image_pull_policy,
        "command": agent_argv(site)[:1],
        "args": agent_argv(site)[1:],
        # Where the agent keeps the data directory (the local driver's layout, in a
        # directory of its own on the volume): for pg_controldata and psql in kubectl exec.
        "env": [{"name": "PGDATA", "value": f"{STATE_DIR}/{site.cell}@{site.region}/pgdata"}],
        "ports": [{"name": "postgres", "containerPort": DATABASE_PORT, "protocol": "TCP"},
                  {"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"},
                  {"name": "reading", "containerPort": READING_PORT, "protocol": "TCP"}],
        # Ready = Postgres accepts connections on its socket: the database Service then sends
        # only to a running server. A held, fenced or demoted site is deliberately not Ready.
        # pg_isready authenticates nothing, so the probe needs no password.
        "readinessProbe": {"exec": {"command": [f"{POSTGRES_BIN}/pg_isready", "-q",
                                                "-h", SOCKET_DIR, "-p", str(DATABASE_PORT)]},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        # Alive = the agent answers (an unauthenticated /healthz that says nothing of the
        # data). Postgres's own life is the agent's business: it restarts it, or reports.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "agent"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "resources": site.database_resources.render(),
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "data", "mountPath": STATE_DIR},
            {"name": "run", "mountPath": SOCKET_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "database-credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
            {"name": "agent-token", "mountPath": AGENT_TOKEN_DIR, "readOnly": True},
        ],
    }


def _stateful_set(site: KubernetesSite) -> Manifest:
    names = site.names
    volumes = [
        # The root file system is read-only; Postgres and the agent write only here and on
        # the claim: sockets and their lock files, temporary files (the agent's passfile
        # among them, mode 0600 as libpq demands), and POSIX dynamic shared memory
        # (memory-backed and sized, as CloudNativePG does; it counts against the limit).
        _empty_dir("run"), _empty_dir("tmp"),
        _empty_dir("shm", medium="Memory", sizeLimit="256Mi"),
        _secret_volume("database-credentials", site.secrets.database),
        _secret_volume("agent-token", site.secrets.agent_token),
    ]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _metadata(site, names.database, "database"),
        "spec": {
            "replicas": 1,
            "serviceName": names.pods,
            "selector": {"matchLabels": _selector(site, "database")},
            # One Pod: ordering buys nothing, and OrderedReady waits on readiness, which a
            # held or fenced database deliberately lacks. Parallel says nothing waits on it.
            "podManagementPolicy": "Parallel",
            # OnDelete: a changed template (a new image) restarts Postgres only when the
            # operator deletes the Pod, at a moment it chooses (a standby first, the primary
            # after a switchover), never when the StatefulSet controller would.
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Delete" if site.delete_claims else "Retain",
                "whenScaled": "Retain"},
            "template": {
                "metadata": {"labels": _pod_labels(site, "database")},
                # A fast shutdown writes a checkpoint; the agent sends it on SIGTERM.
                "spec": _pod_spec(site, [_database_container(site)], volumes, grace_seconds=60),
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": names.claim_template,
                             "labels": _selector(site, "database")},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         # None leaves the class to the cluster's default ("" would mean
                         # "no class": only volumes without one).
                         **({} if site.storage_class is None
                            else {"storageClassName": site.storage_class}),
                         "resources": {"requests": {"storage": site.storage_size}}},
            }],
        },
    }


def _service(site: KubernetesSite, name: str, component: str, ports: list[Manifest], *,
             headless: bool = False, not_ready: bool = False) -> Manifest:
    spec: Manifest = {"type": "ClusterIP", "selector": _selector(site, component), "ports": ports}
    if headless:
        spec["clusterIP"] = "None"
    if not_ready:
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(site, name, component),
            "spec": spec}


def _port(name: str, port: int) -> Manifest:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def _database_services(site: KubernetesSite) -> list[Manifest]:
    names = site.names
    return [
        # The Pod's stable DNS name exists before it is Ready (it is, for the agent).
        _service(site, names.pods, "database",
                 [_port("postgres", DATABASE_PORT), _port("agent", AGENT_PORT)],
                 headless=True, not_ready=True),
        _service(site, names.database, "database", [_port("postgres", DATABASE_PORT)]),
        # The operator must reach an agent whose Postgres is down (held, fenced): not Ready.
        # An old primary opened for the loss report listens on the reading port only.
        _service(site, names.agent, "database",
                 [_port("agent", AGENT_PORT), _port("reading", READING_PORT)], not_ready=True),
    ]


# -- the active site's processes ----------------------------------------------------------

def _conninfo(site: KubernetesSite, role: str, password_var: str) -> str:
    """A libpq conninfo through the database Service. ``$(VAR)`` is expanded by the kubelet
    from an earlier env entry (a secretKeyRef): the object holds no password. The passwords
    are URL-safe (``pgauth.new_password``), so they need no quoting here."""
    return (f"host={database_host(site)} port={DATABASE_PORT} dbname={CELL_DBNAME} "
            f"user={role} password=$({password_var}) connect_timeout=5")


def _cell_env(site: KubernetesSite, pools: Sequence[tuple[str, str, str]]) -> list[Manifest]:
    """The cell process's environment: one password variable and one conninfo per pool
    (conninfo variable, role, password variable), passwords first. The password variables
    exist only for the kubelet to expand; no code reads them."""
    env = [{"name": "CELLPLANE_CELL_NAME", "value": site.cell},
           {"name": "CELLPLANE_CELL_EPOCH", "value": str(site.epoch)},
           {"name": "CELLPLANE_CELL_ALLOW_PRIVATE_TARGETS",
            "value": "1" if site.allow_private_targets else "0"}]
    env += [_secret_env(variable, site.secrets.database, role) for _, role, variable in pools]
    env += [{"name": name, "value": _conninfo(site, role, variable)}
            for name, role, variable in pools]
    return env


def _epoch_annotations(site: KubernetesSite) -> dict[str, str]:
    return {"cellplane.io/epoch": str(site.epoch)}


def _deployment(site: KubernetesSite, name: str, component: str, replicas: int,
                container: Manifest) -> Manifest:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**_metadata(site, name, component), "annotations": _epoch_annotations(site)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _selector(site, component)},
            # Recreate: the old epoch's Pods are gone before the new epoch's start, as the
            # local driver never runs two sets at once (a rolling update would overlap them;
            # the database's epoch fence would refuse the old, but they would still run).
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": _pod_labels(site, component),
                             "annotations": _epoch_annotations(site)},
                "spec": _pod_spec(site, [container], [_empty_dir("tmp")], grace_seconds=30),
            },
        },
    }


def _api(site: KubernetesSite) -> list[Manifest]:
    names = site.names
    env = _cell_env(site, [("CELLPLANE_CELL_DATABASE", API_ROLE, "DB_PASSWORD_API"),
                           ("CELLPLANE_CELL_ADMIN_DATABASE", ADMIN_API_ROLE,
                            "DB_PASSWORD_ADMIN_API")])
    env.append(_secret_env("CELLPLANE_CELL_ADMIN_TOKEN", site.secrets.admin_token, "token"))
    container = {
        "name": "api", "image": site.image, "imagePullPolicy": site.image_pull_policy,
        "command": ["cellplane"],
        "args": ["cell", "serve", "--host=0.0.0.0", f"--port={API_PORT}",
                 f"--admin-port={ADMIN_PORT}"],
        "env": env,
        "ports": [{"name": "api", "containerPort": API_PORT, "protocol": "TCP"},
                  {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"}],
        # The tenant API's one unauthenticated route (what the local driver probes too);
        # the admin health check wants the token, which a probe could only carry literally.
        "readinessProbe": {"httpGet": {"path": "/openapi.json", "port": "api"},
                           "periodSeconds": 5, "timeoutSeconds": 3},
        "resources": site.api_resources.render(),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return [_deployment(site, names.api, "api", site.api_replicas, container),
            _service(site, names.api, "api", [_port("api", API_PORT), _port("admin", ADMIN_PORT)])]


def _workers(site: KubernetesSite) -> Manifest:
    env = [{"name": "POD_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           *_cell_env(site, [("CELLPLANE_CELL_DATABASE", WORKER_ROLE,
                              "DB_PASSWORD_WORKER"),
                             ("CELLPLANE_CELL_RELAY_DATABASE", RELAY_ROLE,
                              "DB_PASSWORD_RELAY")])]
    container = {
        "name": "worker", "image": site.image, "imagePullPolicy": site.image_pull_policy,
        "command": ["cellplane"],
        # A Pod's name is new with every Pod, and every epoch makes new Pods (Recreate).
        # A change of slots or floors is a new template: the Deployment rolls its Pods.
        "args": ["cell", "work", f"--slots={site.slots_per_worker}",
                 *([] if site.priority_floors is None
                   else [f"--priority-floors={site.priority_floors}"]),
                 "--worker-id=$(POD_NAME)"],
        "env": env,
        # No probe: nothing routes to a worker; one whose lease heartbeats stop loses its
        # claims to the reaper, and a crashed one is restarted by the kubelet.
        "resources": site.worker_resources.render(),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return _deployment(site, site.names.worker, "worker", site.worker_replicas, container)


# -- the site -----------------------------------------------------------------------------

def site_objects(site: KubernetesSite) -> list[Manifest]:
    """The site's objects, in the order to apply them (database first)."""
    objects = [_stateful_set(site), *_database_services(site)]
    if site.role is ServingRole.ACTIVE:
        objects += [*_api(site), _workers(site)]
    return objects


def warm_api_objects(site: KubernetesSite) -> list[Manifest]:
    """A standby's cell API started ahead (``SiteDriver.warm_up``): the active site's API
    Deployment and Service under the epoch the standby would act under, labelled with the
    standby's role. Its Pod template is the active one's, so ``start_serving`` under that
    epoch relabels it and adds the workers without restarting the API."""
    standby = replace(site, role=ServingRole.STANDBY)
    active = replace(site, role=ServingRole.ACTIVE)
    objects = []
    for manifest in _api(active):
        metadata = {**manifest["metadata"], "labels": _labels(standby, "api")}
        objects.append({**manifest, "metadata": metadata})
    return objects


def object_ref(manifest: Mapping[str, Any]) -> ObjectRef:
    meta = manifest["metadata"]
    return ObjectRef(str(manifest["kind"]), str(meta["name"]), str(meta["namespace"]),
                     str(manifest["apiVersion"]))


@dataclass(frozen=True)
class RoleChange:
    """What a site's objects need when its role changes (a switchover, a takeover)."""

    create: tuple[Manifest, ...]
    delete: tuple[ObjectRef, ...]
    relabel: tuple[Manifest, ...]
    """Objects of both roles whose metadata alone differs (the role label): a patch."""


def role_change(site: KubernetesSite, to: ServingRole) -> RoleChange:
    """The difference between the site's objects now and under ``to``, computed from the two
    renderings so it cannot drift from them. Raises if anything but metadata would change on
    an object both roles have: that would be a restart (or an immutable field) in disguise."""
    before = {object_ref(m): m for m in site_objects(site)}
    after = {object_ref(m): m for m in site_objects(replace(site, role=to))}
    relabel = []
    for ref in sorted(before.keys() & after.keys()):
        old, new = before[ref], after[ref]
        if {k: v for k, v in old.items() if k != "metadata"} != \
                {k: v for k, v in new.items() if k != "metadata"}:
            raise RuntimeError(f"{ref.kind} {ref.name} differs beyond its metadata "
                               "between roles: a bug in site_objects")
        if old != new:
            relabel.append(new)
    return RoleChange(create=tuple(after[r] for r in sorted(after.keys() - before.keys())),
                      delete=tuple(sorted(before.keys() - after.keys())),
                      relabel=tuple(relabel))
