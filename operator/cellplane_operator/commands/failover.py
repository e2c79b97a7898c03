"""``cellplane switchover`` and ``cellplane failover --force``: ask the operators, through the
Cell's annotations, to move a cell's active site, and follow its status until it moved.

The operators do the work (``runtime/handover.py``, ``runtime/cellsite.py``); these
commands only write the request and watch, so ``kubectl annotate`` does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS, KubeClient, KubeConfig
from cellplane_operator.domain.conditions import find_condition
from cellplane_operator.domain.failover import FORCE_FAILOVER, SWITCHOVER_TO

__all__ = ["add_failover_commands"]

EXIT_OK, EXIT_FAILED = 0, 1


def add_failover_commands(commands: Any) -> None:
    switchover = commands.add_parser(
        "switchover", help="hand a cell to a standby region with nothing lost (planned)",
        description="Asks the cell's owner to stop writes, let the standby in REGION replay "
                    "everything, and hand it the placement group under epoch+1; the old "
                    "primary becomes its standby. Same as annotating the Cell with "
                    f"{SWITCHOVER_TO}=REGION.")
    switchover.add_argument("cell")
    switchover.add_argument("--to", required=True, metavar="REGION", dest="region")
    _common(switchover)
    switchover.set_defaults(run=lambda args: _request(args, SWITCHOVER_TO), prog=switchover.prog)

    failover = commands.add_parser(
        "failover", help="promote a standby of an ownerless cell whatever its lag (forced)",
        description="For a cell whose active region is lost and whose standby was refused "
                    "promotion (too far behind, or automatic failover off): promotes the "
                    "standby in REGION anyway. What it lacked is in the reconciliation "
                    f"report. Same as annotating the Cell with {FORCE_FAILOVER}=REGION.")
    failover.add_argument("cell")
    failover.add_argument("--to", required=True, metavar="REGION", dest="region")
    failover.add_argument("--force", action="store_true", required=True,
                          help="required: this may lose what the standby had not received")
    _common(failover)
    failover.set_defaults(run=lambda args: _request(args, FORCE_FAILOVER), prog=failover.prog)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--wait", action="store_true",
                        help="wait until the cell serves from REGION")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits")


def _request(args: argparse.Namespace, annotation: str) -> int:
    return asyncio.run(_annotate_and_wait(args, annotation))


async def _annotate_and_wait(args: argparse.Namespace, annotation: str) -> int:
    kube = KubeClient(KubeConfig.load(args.kubeconfig), user_agent="cellplane-cli")
    try:
        cell = await kube.get(CELLS, args.cell)
        if cell is None:
            print(f"{args.prog}: no cell {args.cell}", file=sys.stderr)
            return EXIT_FAILED
        regions = [cell["spec"]["region"], *(cell["spec"].get("standbyRegions") or [])]
        if args.region not in regions:
            print(f"{args.prog}: cell {args.cell} has no site in {args.region} (its sites: "
                  f"{', '.join(regions)})", file=sys.stderr)
            return EXIT_FAILED
        status = cell.get("status") or {}
        if status.get("activeRegion") == args.region and status.get("phase") != "FailingOver":
            print(f"cell {args.cell} already serves from {args.region} "
                  f"(epoch {status.get('epoch')})")
            return EXIT_OK
        before = int(status.get("epoch") or 0)
        await kube.patch(CELLS, args.cell, {"metadata": {"annotations": {annotation: args.region}}})
        print(f"cell {args.cell}: asked to move to {args.region} ({annotation})")
        if not args.wait:
            return EXIT_OK
        return await _wait_moved(kube, args, before)
    except CellplaneError as error:
        print(f"{args.prog}: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await kube.close()


async def _wait_moved(kube: KubeClient, args: argparse.Namespace, before: int) -> int:
    deadline = time.monotonic() + args.timeout
    said = ""
    while time.monotonic() < deadline:
        cell = await kube.get(CELLS, args.cell) or {}
        status = cell.get("status") or {}
        takeover = status.get("lastTakeover") or {}
        if (status.get("activeRegion") == args.region and int(status.get("epoch") or 0) > before
                and status.get("phase") in ("Ready", "Degraded", "Draining")):
            print(f"cell {args.cell} serves from {args.region} under epoch {status['epoch']} "
                  f"({takeover.get('seconds', '?')}s from the previous owner's end)")
            return EXIT_OK
        ready = find_condition(status, "Ready") or {}
        now = f"{status.get('phase')}: {ready.get('message', '')}"
        if now != said:
            print(f"  {now}")
            said = now
        await asyncio.sleep(0.5)
    print(f"{args.prog}: cell {args.cell} did not move to {args.region} in {args.timeout:g}s "
          f"(see kubectl describe cell {args.cell})", file=sys.stderr)
    return EXIT_FAILED
