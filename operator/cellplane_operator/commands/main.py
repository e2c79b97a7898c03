"""``cellplane``: the command line of the operator and the local control plane.

    cellplane operator --region R --etcd HOST:PORT,...   run the regional operator (kopf)
    cellplane router --etcd HOST:PORT,... [--port P]     the edge router
    cellplane move TENANT --to CELL [--wait]             move a tenant to another cell
    cellplane sites stop --state-dir DIR  stop the site processes an operator left running
    cellplane local up [--regions a,b,c]  start etcd, kube-apiserver and the CRDs
    cellplane local up --cluster          a real cluster: control plane + a node per region
    cellplane local down                  stop it (partition/heal REGION: cut a region's link)
    cellplane demo [--short] [--keep]     the local demo: 3 regions, a load, a move, a region lost
    cellplane cell {migrate,work,serve}   a cell's own processes
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from cellplane_operator.errors import CellplaneError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from cellplane_operator.settings import OperatorSettings
    from cellplane_operator.sites.base import SiteDriver
    from cellplane_operator.sites.credentials import CredentialSource

    from cellplane_operator.domain.ownership import LeaseSettings

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except CellplaneError as error:
        print(f"cellplane: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellplane", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(title="commands")

    operator = commands.add_parser("operator", help="run the regional operator")
    operator.add_argument("--region", default=os.environ.get("CELLPLANE_REGION", "region-a"),
                          help="region this operator acts for (env CELLPLANE_REGION)")
    operator.add_argument("--etcd", default=os.environ.get("CELLPLANE_ETCD", ""),
                          help="comma-separated host:port of the etcd members (env CELLPLANE_ETCD)")
    operator.add_argument("--regions", default=os.environ.get("CELLPLANE_REGIONS", ""),
                          help="every region of the deployment, comma-separated")
    operator.add_argument("--state-dir", type=Path,
                          default=Path(os.environ.get("CELLPLANE_STATE_DIR", ".local/sites")),
                          help="where the local site driver keeps this region's sites")
    operator.add_argument("--advertise-host",
                          default=os.environ.get("CELLPLANE_ADVERTISE_HOST", "127.0.0.1"),
                          help="address the cells' APIs listen on and are published with: "
                               "the pod's IP in a Pod (env CELLPLANE_ADVERTISE_HOST)")
    operator.add_argument("--namespace", default="cellplane-system",
                          help="namespace of the operator's own Secrets")
    operator.add_argument("--kubeconfig", type=Path, default=None,
                          help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")
    operator.add_argument("--election-lease-seconds", type=int, default=10,
                          help="lease of the placement election (etcd TTL, whole seconds)")
    operator.add_argument("--election-renew-seconds", type=float, default=2.0,
                          help="how often the placement leader renews its lease")
    operator.add_argument("--election-margin-seconds", type=float, default=2.0,
                          help="clock margin of the placement election")
    operator.add_argument("--resync-seconds", type=float, default=30.0,
                          help="every Tenant and Cell is reconciled at least this often")
    operator.add_argument("--move-progress-deadline-seconds", type=float,
                          default=os.environ.get("CELLPLANE_MOVE_PROGRESS_DEADLINE_SECONDS",
                                                 "600"),
                          help="a TenantMove without progress this long before its cutover "
                               "fails with its reason (env "
                               "CELLPLANE_MOVE_PROGRESS_DEADLINE_SECONDS)")
    operator.add_argument("--kube-timeout-seconds", type=float,
                          default=os.environ.get("CELLPLANE_KUBE_TIMEOUT_SECONDS", "10"),
                          help="how long one request to the Kubernetes API may take "
                               "(env CELLPLANE_KUBE_TIMEOUT_SECONDS)")
    # The kubernetes site driver (Cells with spec.driver.name: kubernetes).
    operator.add_argument("--cell-image", default=os.environ.get("CELLPLANE_CELL_IMAGE", ""),
                          help="image the kubernetes driver runs sites with; empty: such "
                               "Cells are refused (env CELLPLANE_CELL_IMAGE)")
    operator.add_argument("--cell-image-pull-policy", choices=("Always", "IfNotPresent", "Never"),
                          default=os.environ.get("CELLPLANE_CELL_IMAGE_PULL_POLICY",
                                                 "IfNotPresent"),
                          help="when the kubelet pulls --cell-image "
                               "(env CELLPLANE_CELL_IMAGE_PULL_POLICY)")
    operator.add_argument("--cell-namespace",
                          default=os.environ.get("CELLPLANE_CELL_NAMESPACE", ""),
                          help="namespace of the kubernetes driver's site objects; empty: "
                               "--namespace (env CELLPLANE_CELL_NAMESPACE)")
    operator.add_argument("--cell-storage-class",
                          default=os.environ.get("CELLPLANE_CELL_STORAGE_CLASS", ""),
                          help="StorageClass of the sites' claims when a Cell names none; "
                               "empty: the cluster's default (env CELLPLANE_CELL_STORAGE_CLASS)")
    operator.add_argument("--cell-resources",
                          default=os.environ.get("CELLPLANE_CELL_RESOURCES", ""),
                          help='default requests and limits of the sites\' containers, JSON: '
                               '{"database": {"requests": {"cpu": "250m", "memory": "512Mi"}, '
                               '"limits": {"memory": "1Gi"}}, "api": {...}, "worker": {...}} '
                               "(env CELLPLANE_CELL_RESOURCES)")
    operator.add_argument("--liveness", default=None,
                          help="serve kopf's liveness probe, e.g. http://127.0.0.1:8080/healthz")
    operator.add_argument("--metrics-host",
                          default=os.environ.get("CELLPLANE_METRICS_HOST", "127.0.0.1"),
                          help="address of the Prometheus /metrics endpoint "
                               "(env CELLPLANE_METRICS_HOST)")
    operator.add_argument("--metrics-port", type=int,
                          default=os.environ.get("CELLPLANE_METRICS_PORT", "0"),
                          help="serve Prometheus metrics on this port; 0: none "
                               "(env CELLPLANE_METRICS_PORT)")
    operator.add_argument("--verbose", action="store_true", help="debug logging")
    operator.set_defaults(run=_run_operator)

    local = commands.add_parser("local", help="the local control plane")
    local_commands = local.add_subparsers(title="local commands")
    up = local_commands.add_parser("up", help="start etcd, kube-apiserver and the CRDs; "
                                   "stay up until interrupted")
    up.add_argument("--regions", default="region-a,region-b,region-c",
                    help="comma-separated regions, one etcd member each")
    up.add_argument("--state", type=Path, default=Path(".local/state.json"),
                    help="where to write endpoints, PIDs and the kubeconfig path")
    up.add_argument("--cluster", action="store_true",
                    help="a real cluster instead: control plane, and a node per region "
                         "(kubelet, containerd, kube-proxy) in network namespaces of its own, "
                         "with charts/cellplane installed: an operator Pod per region")
    up.add_argument("--no-operators", action="store_true",
                    help="with --cluster: the cluster alone, with cellplane's CRDs but not "
                         "the chart")
    up.set_defaults(run=_run_local_up)
    from cellplane_operator.commands.cluster import add_cluster_commands

    add_cluster_commands(local_commands)

    from cellplane_operator.commands.demo import add_demo_command

    add_demo_command(commands)

    ownership = commands.add_parser("ownership", help="placement-group ownership leases")
    ownership_commands = ownership.add_subparsers(title="ownership commands")
    hold = ownership_commands.add_parser(
        "hold", help="compete for and hold one placement group's lease; print transitions as JSON")
    hold.add_argument("--cell", required=True)
    hold.add_argument("--region", required=True)
    hold.add_argument("--site", required=True)
    hold.add_argument("--etcd", required=True, help="comma-separated host:port of etcd members")
    hold.add_argument("--database", help="cell database conninfo to grant epoch and deadline to")
    hold.add_argument("--lease-seconds", type=int, default=10)
    hold.add_argument("--renew-seconds", type=float, default=2.0)
    hold.add_argument("--margin-seconds", type=float, default=2.0)
    hold.add_argument("--takeover-delay-seconds", type=float, default=0.0)
    hold.add_argument("--etcd-timeout-seconds", type=float, default=1.0,
                      help="bound of one etcd operation over all members")
    hold.set_defaults(run=_run_hold)

    sites = commands.add_parser("sites", help="the local sites an operator started")
    sites_commands = sites.add_subparsers(title="sites commands")
    sites_stop = sites_commands.add_parser(
        "stop", help="stop every process of every site under a state dir (they outlive the "
        "operator by design, so a restarted operator adopts them)")
    sites_stop.add_argument("--state-dir", type=Path, required=True)
    sites_stop.set_defaults(run=_run_sites_stop)

    router = commands.add_parser("router", help="run the edge router of a region")
    router.add_argument("--etcd", default=os.environ.get("CELLPLANE_ETCD", ""),
                        help="comma-separated host:port of the etcd members (env CELLPLANE_ETCD)")
    router.add_argument("--host", default="127.0.0.1")
    router.add_argument("--port", type=int, default=8000)
    router.add_argument("--metrics-host", default="127.0.0.1",
                        help="address of the Prometheus /metrics endpoint (not the public "
                             "port: the per-tenant counters name tenants)")
    router.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics on this port; 0: none")
    router.add_argument("--hold-seconds", type=float, default=15.0,
                        help="how long a request waits for a cell without an owner before 503")
    router.set_defaults(run=_run_router)

    from cellplane_operator.commands.failover import add_failover_commands
    from cellplane_operator.commands.move import add_move_command
    from cellplane_operator.commands.report import add_report_command

    add_failover_commands(commands)
    add_move_command(commands)
    add_report_command(commands)

    from cellplane_cells.cli import add_cell_commands

    add_cell_commands(commands)
    from cellplane_operator.commands.agent import add_site_commands

    add_site_commands(commands)
    return parser


def _run_operator(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import kopf

    import cellplane_operator.handlers  # noqa: F401  (registers the handlers)
    from cellplane_operator.kube import KubeClient, KubeConfig
    from cellplane_operator.localplane.binaries import Binaries
    from cellplane_operator.settings import OperatorSettings, parse_cell_resources
    from cellplane_operator.sites.credentials import SecretCredentials
    from cellplane_operator.sites.local import LocalSiteDriver

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per HTTP request to the apiserver and the cells would bury the decisions.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Nor one line per kubelet probe of kopf's liveness endpoint (every few seconds).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    endpoints = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
    if not endpoints:
        print("cellplane operator: --etcd (or CELLPLANE_ETCD) is required", file=sys.stderr)
        return EXIT_USAGE
    election = _lease_settings("cellplane operator: election lease", args.election_lease_seconds,
                               args.election_renew_seconds, args.election_margin_seconds)
    if election is None:
        return EXIT_USAGE
    regions = tuple(r.strip() for r in args.regions.split(",") if r.strip()) or (args.region,)
    try:
        cell_resources = parse_cell_resources(args.cell_resources)
    except ValueError as error:
        print(f"cellplane operator: --cell-resources (or CELLPLANE_CELL_RESOURCES): {error}",
              file=sys.stderr)
        return EXIT_USAGE
    state_dir = args.state_dir.resolve()
    lock = _lock_state_dir(state_dir)
    if lock is None:
        print(f"cellplane operator: another operator runs on {state_dir}", file=sys.stderr)
        return EXIT_FAILED
    settings = OperatorSettings(
        region=args.region, etcd_endpoints=endpoints, state_dir=state_dir,
        namespace=args.namespace, kubeconfig=args.kubeconfig, election=election,
        resync_seconds=args.resync_seconds, regions=regions, adopt_leases=True,
        move_progress_deadline_seconds=args.move_progress_deadline_seconds,
        kube_timeout_seconds=args.kube_timeout_seconds,
        cell_image=args.cell_image, cell_image_pull_policy=args.cell_image_pull_policy,
        cell_namespace=args.cell_namespace, cell_storage_class=args.cell_storage_class,
        cell_resources=cell_resources)
    # The cells' database passwords: one Secret per cell, shared by every region's operator.
    credentials = SecretCredentials(lambda: KubeClient(KubeConfig.load(settings.kubeconfig)),
                                    settings.namespace)
    local = LocalSiteDriver(Binaries.discover(postgres_only=True), settings.state_dir,
                            credentials=credentials, advertise_host=args.advertise_host)
    driver = _site_drivers(settings, local, credentials)
    if driver is None:
        return EXIT_USAGE
    if args.metrics_port:
        from cellplane_operator.metrics import OPERATOR_REGISTRY

        if not _serve_metrics("operator", args.metrics_host, args.metrics_port,
                              OPERATOR_REGISTRY):
            return EXIT_FAILED
    memo = kopf.Memo(settings=settings, driver=driver)
    asyncio.run(kopf.operator(standalone=True, clusterwide=True, memo=memo,
                              liveness_endpoint=args.liveness))
    return EXIT_OK


def _site_drivers(settings: OperatorSettings, local: SiteDriver,
                  credentials: CredentialSource) -> SiteDriver | None:
    """The local driver, and the kubernetes driver when the operator was given the sites'
    image (without one, a kubernetes Cell says in its status that nothing runs it); None
    after saying on stderr why the settings cannot work."""
    from cellplane_operator.kube import KubeClient, KubeConfig
    from cellplane_operator.sites.dispatch import DriverByCell
    from cellplane_operator.sites.kubernetes import (
        KubernetesDriverConfig,
        KubernetesSiteDriver,
        cell_driver_names,
    )

    kube = KubeClient(KubeConfig.load(settings.kubeconfig),
                      timeout_seconds=settings.kube_timeout_seconds)
    drivers: dict[str, SiteDriver] = {"local": local}
    if settings.cell_image:
        if settings.cell_namespace != settings.namespace:
            # The sites' Pods read the cell's Secrets by secretKeyRef, which cannot leave
            # the namespace where the operators keep them.
            print(f"cellplane operator: --cell-namespace ({settings.cell_namespace}) must be "
                  f"the operator's --namespace ({settings.namespace}) for now",
                  file=sys.stderr)
            return None
        config = KubernetesDriverConfig(
            image=settings.cell_image, namespace=settings.cell_namespace,
            image_pull_policy=settings.cell_image_pull_policy,
            storage_class=settings.cell_storage_class or None,
            resources=settings.cell_resources.model_dump(exclude_none=True))
        drivers["kubernetes"] = KubernetesSiteDriver(kube, config, credentials=credentials,
                                                     state_dir=settings.state_dir)
    return DriverByCell(drivers, driver_name=cell_driver_names(kube, settings.cell_namespace))


def _serve_metrics(command: str, host: str, port: int, registry: CollectorRegistry) -> bool:
    """/metrics of the operator or the router on a thread of its own (prometheus_client's
    server), so a scrape never waits on the event loop; False after saying on stderr why
    it cannot listen."""
    from prometheus_client import start_http_server

    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        print(f"cellplane {command}: cannot serve metrics on {host}:{port}: {error}",
              file=sys.stderr)
        return False
    return True


def _run_sites_stop(args: argparse.Namespace) -> int:
    from cellplane_operator.sites.local import stop_all_sites

    if not args.state_dir.is_dir():
        print(f"cellplane sites stop: no state dir {args.state_dir}", file=sys.stderr)
        return EXIT_FAILED
    stopped = stop_all_sites(args.state_dir)
    print(f"stopped {len(stopped)} process(es)" + (f": {' '.join(map(str, stopped))}"
                                                   if stopped else ""))
    return EXIT_OK


def _run_router(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import httpx
    import uvicorn

    from cellplane_operator.router import PlacementWatcher, RouterSettings, create_router_app
    from cellplane_operator.store import EtcdStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    endpoints = [e.strip() for e in args.etcd.split(",") if e.strip()]
    if not endpoints:
        print("cellplane router: --etcd (or CELLPLANE_ETCD) is required", file=sys.stderr)
        return EXIT_USAGE
    if args.metrics_port:
        from cellplane_operator.metrics import ROUTER_REGISTRY

        if not _serve_metrics("router", args.metrics_host, args.metrics_port, ROUTER_REGISTRY):
            return EXIT_FAILED

    async def serve() -> None:
        store = EtcdStore(endpoints, timeout=2.0, attempt_timeout=1.0)
        watcher = PlacementWatcher(store)
        watching = asyncio.create_task(watcher.run())
        try:
            async with httpx.AsyncClient() as http:
                app = create_router_app(watcher, http, RouterSettings(hold_seconds=args.hold_seconds))
                server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                                       log_config=None, access_log=False))
                await watcher.loaded.wait()
                logging.getLogger("cellplane.router").info(
                    "router up on %s:%d, placement map loaded", args.host, args.port)
                await server.serve()
        finally:
            watching.cancel()
            await store.close()

    asyncio.run(serve())
    return EXIT_OK


def _lease_settings(what: str, duration: float, renew: float, margin: float) -> LeaseSettings | None:
    """Validated lease settings, or None after saying on stderr why they are unsafe."""
    from cellplane_operator.domain.ownership import LeaseSettings

    try:
        return LeaseSettings(duration_seconds=duration, renew_interval_seconds=renew,
                             margin_seconds=margin).validated()
    except ValueError as error:
        print(f"{what}: {error}", file=sys.stderr)
        return None


def _lock_state_dir(state_dir: Path) -> IO[str] | None:
    """An exclusive lock on the region's state directory, held until this process exits.

    It is what makes adopting the previous operator's leases safe: the kernel
    releases the lock only when its holder is gone, so holding it proves that
    no other operator of this state directory is alive, paused or not. (The
    site processes do not inherit it: subprocesses close inherited descriptors.)
    """
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o755)
    handle = (state_dir / ".operator.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _run_hold(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from cellplane_operator.clock import SystemClock
    from cellplane_operator.ownership import LeaseHolder, OwnershipTable
    from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
    from cellplane_operator.ownership.holder import HolderIdentity
    from cellplane_operator.ownership.reporting import ReportingActor
    from cellplane_operator.sites.celldb import PostgresCellDatabases
    from cellplane_operator.store import EtcdStore

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _lease_settings("cellplane ownership hold", args.lease_seconds, args.renew_seconds,
                               args.margin_seconds)
    if settings is None:
        return EXIT_USAGE

    async def hold() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        timeout = min(args.etcd_timeout_seconds, settings.renew_interval_seconds)
        store = EtcdStore(args.etcd.split(","), timeout=timeout, attempt_timeout=timeout / 2)
        actor = ReportingActor(CellDatabaseGrant(PostgresCellDatabases(), args.database)
                               if args.database else None)
        holder = LeaseHolder(OwnershipTable(store), HolderIdentity(args.cell, args.region, args.site),
                             actor, settings=settings, clock=SystemClock(),
                             takeover_delay_seconds=args.takeover_delay_seconds)
        actor.acquisition = lambda: {"vacated_at": holder.vacated_at}
        try:
            await holder.run(stop)
            # A clean shutdown is a planned handover: the next owner need not
            # wait for the lease to run out.
            await holder.release()
        finally:
            await store.close()

    asyncio.run(hold())
    return EXIT_OK


def _wait_for_interrupt() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()


def _run_local_up(args: argparse.Namespace) -> int:
    from cellplane_operator.localplane import LocalControlPlane
    from cellplane_operator.localplane.controlplane import LocalPlaneConfig

    regions = tuple(r.strip() for r in args.regions.split(",") if r.strip())
    if args.cluster:
        from cellplane_operator.commands.cluster import run_cluster_up

        return run_cluster_up(regions, args.state, _wait_for_interrupt,
                              operators=not args.no_operators)
    plane = LocalControlPlane(LocalPlaneConfig(regions=regions))
    print(f"starting etcd ({len(regions)} member(s)) and kube-apiserver in {plane.run_dir} ...")
    plane.start()
    args.state.parent.mkdir(parents=True, exist_ok=True)
    plane.write_state(args.state)
    print(f"up. state: {args.state}\n  export KUBECONFIG={plane.kubeconfig}\n"
          "Ctrl-C stops every process.")
    try:
        _wait_for_interrupt()
    finally:
        plane.stop()
        # Its etcd data and logs are scratch: a stopped plane cannot be started again.
        plane.remove()
        args.state.unlink(missing_ok=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
