"""``cellplane cell``: run a cell's processes.

    cellplane cell migrate    apply the schema migrations
    cellplane cell work       workers, reaper (and the webhook relay)
    cellplane cell serve      the tenant API and the admin API
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from cellplane_cells.logs import configure_logging
from cellplane_cells.settings import add_common_arguments, settings_from

__all__ = ["add_cell_commands"]


def add_cell_commands(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    cell = commands.add_parser("cell", help="run a cell's processes")
    cell_commands = cell.add_subparsers(title="cell commands")

    migrate = cell_commands.add_parser("migrate", help="apply the cell's schema migrations")
    add_common_arguments(migrate)
    migrate.set_defaults(run=_migrate)

    work = cell_commands.add_parser("work", help="run workers and the reaper")
    add_common_arguments(work)
    work.add_argument("--worker-id", default=f"{socket.gethostname()}-{os.getpid()}")
    work.add_argument("--slots", type=int, default=10)
    work.add_argument("--lease-seconds", type=float, default=30.0)
    work.add_argument("--heartbeat-seconds", type=float, default=10.0)
    work.add_argument("--reap-seconds", type=float, default=5.0)
    work.set_defaults(run=_work)


def _migrate(args: argparse.Namespace) -> int:
    from cellplane_cells.migrate import migrate

    configure_logging()
    settings = settings_from(args) if args.epoch else None
    applied = migrate(args.database, cell=settings.cell if settings else args.cell)
    logging.getLogger("cellplane.cell").info("migrations applied: %s", applied or "none needed")
    return 0


def _work(args: argparse.Namespace) -> int:
    import httpx

    from cellplane_cells.db import open_pool
    from cellplane_cells.worker import Worker, WorkerConfig

    configure_logging()
    settings = settings_from(args)
    config = WorkerConfig(worker_id=args.worker_id, epoch=settings.epoch, slots=args.slots,
                          lease_seconds=args.lease_seconds,
                          heartbeat_seconds=args.heartbeat_seconds, reap_seconds=args.reap_seconds)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        pool = open_pool(settings.database, epoch=settings.epoch, max_size=args.slots + 2,
                         name="worker")
        try:
            async with httpx.AsyncClient() as http:
                worker = Worker(pool, http, config)
                logging.getLogger("cellplane.cell").info(
                    "worker %s up: epoch %d, %d slots", config.worker_id, config.epoch, config.slots)
                await worker.run(stop)
        finally:
            pool.close()

    asyncio.run(main())
    return 0
