"""``cellplane site agent``: the database container's PID 1 (``sites/agent.py``).

    cellplane site agent --cell=C --region=R --state-dir=/var/lib/cellplane/site \\
      --socket-dir=/var/run/postgresql --postgres-bin=/usr/lib/postgresql/15/bin \\
      --postgres-port=5432 --credentials-dir=/etc/cellplane/database \\
      --token-file=/etc/cellplane/agent/token --listen=0.0.0.0:9443 \\
      --advertise-host=<the site's database DNS name> --reading-port=5433

It serves its endpoint and starts no Postgres until asked. On SIGTERM (or
SIGINT) it stops answering, stops Postgres with a fast shutdown (a checkpoint)
and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from types import FrameType

from cellplane_operator.errors import CellplaneError

__all__ = ["add_site_commands", "parse_listen"]

log = logging.getLogger("cellplane.site.agent")

GRACEFUL_SHUTDOWN_SECONDS = 5.0
"""How long in-flight requests may finish after SIGTERM before Postgres is stopped."""


def add_site_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    site = commands.add_parser("site", help="a site's own processes (in its Pod)")
    site_commands = site.add_subparsers(title="site commands")
    agent = site_commands.add_parser(
        "agent", help="run the site agent: Postgres as a child, managed over HTTP")
    agent.add_argument("--cell", required=True)
    agent.add_argument("--region", required=True)
    agent.add_argument("--state-dir", type=Path, required=True,
                       help="the site's volume (the site lives in <cell>@<region>/ under it)")
    agent.add_argument("--socket-dir", type=Path, required=True,
                       help="Postgres's unix socket directory")
    agent.add_argument("--postgres-bin", type=Path, required=True,
                       help="directory of PostgreSQL's server programs")
    agent.add_argument("--postgres-port", type=int, default=5432)
    agent.add_argument("--postgres-listen", default="*",
                       help="Postgres's listen_addresses (must include loopback)")
    agent.add_argument("--credentials-dir", type=Path, required=True,
                       help="the cell's database Secret: one file per role, its password")
    agent.add_argument("--token-file", type=Path, required=True,
                       help="the bearer token of the endpoint (re-read when it changes)")
    agent.add_argument("--listen", default="0.0.0.0:9443", help="HOST:PORT of the endpoint")
    agent.add_argument("--advertise-host", required=True,
                       help="the host endpoints name: the site's database DNS name")
    agent.add_argument("--reading-port", type=int, default=5433,
                       help="port of a fenced server opened for reading (superuser only)")
    agent.add_argument("-v", "--verbose", action="store_true")
    agent.set_defaults(run=_run_agent)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9443`` for IPv6) as (host, port)."""
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CellplaneError(f"--listen wants HOST:PORT, not {value!r}")
    return host, int(port)


def _run_agent(args: argparse.Namespace) -> int:
    import uvicorn

    from cellplane_operator.sites.agent import AgentConfig, SiteAgent
    from cellplane_operator.sites.agent_http import TokenFile, create_agent_app
    from cellplane_operator.sites.base import SiteKey

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = parse_listen(args.listen)
    config = AgentConfig(
        site=SiteKey(args.cell, args.region), state_dir=args.state_dir,
        socket_dir=args.socket_dir, postgres_bin=args.postgres_bin,
        postgres_port=args.postgres_port, credentials_dir=args.credentials_dir,
        advertise_host=args.advertise_host, reading_port=args.reading_port,
        postgres_listen=args.postgres_listen)
    agent = SiteAgent(config)
    agent.prepare()
    app = create_agent_app(agent, TokenFile(args.token_file))
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_SECONDS)))

    def stop(signum: int, _frame: FrameType | None) -> None:
        # Also what uvicorn calls again once it has shut down (it re-raises the signals it
        # caught, to the handlers it found): asking twice is harmless.
        server.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

    async def serve() -> None:
        log.info("site agent of %s listening on %s:%d (boot %s); postgres is not started "
                 "until the operator asks", config.site.name, host, port, agent.boot_id)
        await server.serve()

    try:
        asyncio.run(serve())
    finally:
        stopped = agent.shutdown()
        log.info("site agent of %s stopped%s", config.site.name,
                 f" postgres (pid {', '.join(map(str, stopped))})" if stopped else "")
    return 0
