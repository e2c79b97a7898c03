"""``cellplane cell``: run a cell's processes.

    cellplane cell migrate    apply the schema migrations
    cellplane cell work       workers, reaper, the webhook relay and the schedule dispatcher
    cellplane cell serve      the tenant API and the admin API
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from cellplane_cells.domain.priorities import Floors, FloorsError, parse_floors
from cellplane_cells.domain.reaping import ReaperMode
from cellplane_cells.logs import configure_logging
from cellplane_cells.settings import add_common_arguments, settings_from

__all__ = ["add_cell_commands"]


def add_cell_commands(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    cell = commands.add_parser("cell", help="run a cell's processes")
    cell_commands = cell.add_subparsers(title="cell commands")

    migrate = cell_commands.add_parser("migrate", help="apply the cell's schema migrations")
    add_common_arguments(migrate)
    migrate.set_defaults(run=_migrate)

    work = cell_commands.add_parser(
        "work", help="run workers, the reaper, the webhook relay and the schedule dispatcher")
    add_common_arguments(work, relay_pool=True)
    work.add_argument("--worker-id", default=f"{socket.gethostname()}-{os.getpid()}")
    work.add_argument("--slots", type=int, default=10)
    work.add_argument("--priority-floors", default=os.environ.get("CELLPLANE_CELL_PRIORITY_FLOORS"),
                      help="slots of each worker reserved per priority class, e.g. "
                           "CRITICAL=2,HIGH=2,DEFAULT=2,LOW=1; classes left out reserve none "
                           "(CELLPLANE_CELL_PRIORITY_FLOORS; default: 20%% of the slots for "
                           "CRITICAL, HIGH and DEFAULT each, 10%% for LOW, rounded down)")
    work.add_argument("--lease-seconds", type=float, default=30.0)
    work.add_argument("--heartbeat-seconds", type=float, default=10.0)
    work.add_argument("--reap-seconds", type=float, default=5.0)
    work.add_argument("--reaper-mode", choices=[m.value for m in ReaperMode],
                      default=ReaperMode.ADAPTIVE.value,
                      help="adaptive: expired claims get a lease of grace after the cell's own "
                           "outage and are taken back at a bounded pace when many expire at "
                           "once; immediate: every expired claim at once (for comparison)")
    work.add_argument("--metrics-port", type=int, default=0,
                      help="serve Prometheus metrics on this port (0: none)")
    work.add_argument("--metrics-host", default="127.0.0.1")
    work.set_defaults(run=_work)

    serve = cell_commands.add_parser("serve", help="serve the tenant API and the admin API")
    add_common_arguments(serve, admin_pool=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080, help="tenant API port")
    serve.add_argument("--admin-port", type=int, default=8081, help="admin API port")
    serve.add_argument("--admin-token", default=os.environ.get("CELLPLANE_CELL_ADMIN_TOKEN"),
                       help="bearer token of the admin API (CELLPLANE_CELL_ADMIN_TOKEN)")
    serve.add_argument("--pool-size", type=int, default=20)
    serve.set_defaults(run=_serve)


def _migrate(args: argparse.Namespace) -> int:
    from cellplane_cells.migrate import migrate

    configure_logging()
    settings = settings_from(args) if args.epoch else None
    applied = migrate(args.database, cell=settings.cell if settings else args.cell)
    logging.getLogger("cellplane.cell").info("migrations applied: %s", applied or "none needed")
    return 0


def _work(args: argparse.Namespace) -> int:
    from cellplane_cells.db import open_pool
    from cellplane_cells.dispatch import Dispatcher, DispatcherConfig
    from cellplane_cells.egress import guarded_client
    from cellplane_cells.relay import Relay, RelayConfig
    from cellplane_cells.worker import Worker, WorkerConfig

    configure_logging()
    settings = settings_from(args)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    config = WorkerConfig(worker_id=args.worker_id, epoch=settings.epoch, slots=args.slots,
                          lease_seconds=args.lease_seconds,
                          heartbeat_seconds=args.heartbeat_seconds, reap_seconds=args.reap_seconds,
                          reaper_mode=ReaperMode(args.reaper_mode),
                          floors=_floors(args))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Job slots and the reaper; the relay's few concurrent statements in a pool of
        # their own, as the relay's role (the one that may read webhook secrets).
        # (+3: the reaper, a claim, and the schedule dispatcher's pass.)
        pool = open_pool(settings.database, epoch=settings.epoch, max_size=args.slots + 3,
                         name="worker")
        relay_pool = open_pool(settings.relay_database or settings.database,
                               epoch=settings.epoch, max_size=4, name="relay")
        try:
            # Every call to a target or a webhook goes through the cell's URL policy.
            async with guarded_client(allow_private=settings.allow_private_targets) as http:
                worker = Worker(pool, http, config)
                relay = Relay(relay_pool, http, RelayConfig(relay_id=args.worker_id))
                # Every worker process dispatches too: a cell with any process
                # up keeps its schedules, and the row locks keep them from
                # dispatching one occurrence twice.
                dispatcher = Dispatcher(pool, DispatcherConfig(), name=args.worker_id)
                logging.getLogger("cellplane.cell").info(
                    "worker %s up: epoch %d, %d slots (floors %s), webhook relay and schedule "
                    "dispatcher on", config.worker_id, config.epoch, config.slots,
                    ", ".join(f"{p.value} {n}" for p, n in config.bulkheads.reserved.items()))
                await asyncio.gather(worker.run(stop), relay.run(stop), dispatcher.run(stop))
        finally:
            relay_pool.close()
            pool.close()

    asyncio.run(main())
    return 0


def _floors(args: argparse.Namespace) -> Floors:
    if args.slots < 1:
        raise SystemExit("cellplane cell work: --slots must be at least 1")
    if not args.priority_floors:
        return Floors.default_for(args.slots)
    try:
        return parse_floors(args.priority_floors, slots=args.slots)
    except FloorsError as error:
        raise SystemExit(f"cellplane cell work: --priority-floors: {error}") from None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from cellplane_cells.api.admin_app import create_admin_app
    from cellplane_cells.api.tenant_app import create_tenant_app
    from cellplane_cells.db import open_pool

    configure_logging()
    settings = settings_from(args)
    if not args.admin_token or len(args.admin_token) < 16:
        raise SystemExit("cellplane cell serve: --admin-token (16+ characters) is required")
    pool = open_pool(settings.database, epoch=settings.epoch, max_size=args.pool_size, name="api")
    # The admin API's own role may read tenant secrets (it carries them through a move);
    # the tenant API's may not.
    admin_pool = (pool if settings.admin_database is None else
                  open_pool(settings.admin_database, epoch=settings.epoch, max_size=4,
                            name="admin"))
    tenant_app = create_tenant_app(pool)
    admin_app = create_admin_app(admin_pool, admin_token=args.admin_token,
                                 allow_private_targets=settings.allow_private_targets)

    async def main() -> None:
        servers = [
            uvicorn.Server(uvicorn.Config(tenant_app, host=args.host, port=args.port,
                                          log_config=None, access_log=False)),
            uvicorn.Server(uvicorn.Config(admin_app, host=args.host, port=args.admin_port,
                                          log_config=None, access_log=False)),
        ]
        await asyncio.gather(*(server.serve() for server in servers))

    try:
        asyncio.run(main())
    finally:
        if admin_pool is not pool:
            admin_pool.close()
        pool.close()
    return 0
