"""``cellplane``: the command line of the operator and the local control plane.

    cellplane operator [--region R]      run the regional operator (kopf)
    cellplane local up [--regions a,b,c]  start etcd, kube-apiserver and the CRDs
    cellplane demo                        the local demo: control plane, operator, a Cell
    cellplane cell {migrate,work,serve}   a cell's own processes
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cellplane_operator.errors import CellplaneError

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
    operator.add_argument("--verbose", action="store_true")
    operator.set_defaults(run=_run_operator)

    local = commands.add_parser("local", help="the local control plane")
    local_commands = local.add_subparsers(title="local commands")
    up = local_commands.add_parser("up", help="start etcd, kube-apiserver and the CRDs; "
                                   "stay up until interrupted")
    up.add_argument("--regions", default="region-a,region-b,region-c",
                    help="comma-separated regions, one etcd member each")
    up.add_argument("--state", type=Path, default=Path(".local/state.json"),
                    help="where to write endpoints, PIDs and the kubeconfig path")
    up.set_defaults(run=_run_local_up)

    demo = commands.add_parser("demo", help="bring up the local control plane, run the "
                               "operator, apply a sample Cell and show `kubectl get cells`")
    demo.add_argument("--keep", action="store_true",
                      help="stay up after the demo until interrupted")
    demo.set_defaults(run=_run_demo)

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

    from cellplane_cells.cli import add_cell_commands

    add_cell_commands(commands)
    return parser


def _run_operator(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import kopf

    import cellplane_operator.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ["CELLPLANE_REGION"] = args.region
    asyncio.run(kopf.operator(standalone=True, clusterwide=True))
    return EXIT_OK


def _run_hold(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from cellplane_operator.clock import SystemClock
    from cellplane_operator.domain.ownership import LeaseSettings
    from cellplane_operator.ownership import LeaseHolder, OwnershipTable
    from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
    from cellplane_operator.ownership.holder import HolderIdentity
    from cellplane_operator.ownership.reporting import ReportingActor
    from cellplane_operator.store import EtcdStore

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = LeaseSettings(duration_seconds=args.lease_seconds,
                                 renew_interval_seconds=args.renew_seconds,
                                 margin_seconds=args.margin_seconds).validated()
    except ValueError as error:
        print(f"cellplane ownership hold: {error}", file=sys.stderr)
        return EXIT_USAGE

    async def hold() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        timeout = min(args.etcd_timeout_seconds, settings.renew_interval_seconds)
        store = EtcdStore(args.etcd.split(","), timeout=timeout, attempt_timeout=timeout / 2)
        actor = ReportingActor(CellDatabaseGrant(args.database) if args.database else None)
        holder = LeaseHolder(OwnershipTable(store), HolderIdentity(args.cell, args.region, args.site),
                             actor, settings=settings, clock=SystemClock(),
                             takeover_delay_seconds=args.takeover_delay_seconds)
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
        args.state.unlink(missing_ok=True)
    return EXIT_OK


SAMPLE_CELL = """\
apiVersion: cellplane.io/v1alpha1
kind: Cell
metadata:
  name: shared-a1
spec:
  region: region-a
  tier: shared
  capacity: {tenants: 50, workerSlots: 200}
"""


def _run_demo(args: argparse.Namespace) -> int:
    from cellplane_operator.localplane import LocalControlPlane
    from cellplane_operator.localplane.controlplane import LocalPlaneConfig
    from cellplane_operator.localplane.process import ManagedProcess, wait_for

    started = time.monotonic()
    plane = LocalControlPlane(LocalPlaneConfig(regions=("region-a", "region-b", "region-c")))
    print(f"[demo] starting a 3-member etcd and a kube-apiserver (run dir {plane.run_dir})")
    plane.start()
    operator = ManagedProcess(
        "operator", [sys.executable, "-m", "cellplane_operator", "operator", "--region", "region-a"],
        log=plane.run_dir / "logs" / "operator.log",
        env={"KUBECONFIG": str(plane.kubeconfig)},
    )
    try:
        print(f"[demo] control plane up in {time.monotonic() - started:.1f}s; starting the operator")
        operator.start()
        print("[demo] kubectl apply -f - <<< Cell shared-a1")
        print(plane.kubectl("apply", "-f", "-", input_text=SAMPLE_CELL).stdout.strip())

        def cell_reported() -> bool:
            result = plane.kubectl("get", "cell", "shared-a1", "-o",
                                   "jsonpath={.status.phase}", check=False)
            return result.stdout.strip() != ""

        wait_for(cell_reported, timeout=60, what="the operator to report the cell's status",
                 alive=operator.check_alive)
        print("[demo] kubectl get cells -o wide")
        print(plane.kubectl("get", "cells", "-o", "wide").stdout.rstrip())
        print(plane.kubectl("get", "cell", "shared-a1", "-o",
                            "jsonpath={range .status.conditions[*]}{.type}={.status} "
                            "({.reason}): {.message}{\"\\n\"}{end}").stdout.rstrip())
        if args.keep:
            print(f"[demo] staying up; export KUBECONFIG={plane.kubeconfig}; Ctrl-C to stop")
            _wait_for_interrupt()
    finally:
        operator.stop()
        plane.stop()
    plane.remove()
    print(f"[demo] done in {time.monotonic() - started:.1f}s; every process stopped")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
