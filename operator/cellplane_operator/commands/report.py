"""``cellplane report CELL``: the reconciliation reports of a cell's failovers.

    cellplane report CELL              the latest report, as text for people
    cellplane report CELL --epoch N    the report of the failover to epoch N
    cellplane report CELL --json       the report as stored (JSON)
    cellplane report CELL --list       one line per failover of the cell
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import IO

from cellplane_operator.domain.reconciliation import ReconciliationReport
from cellplane_operator.kube import KubeClient, KubeConfig
from cellplane_operator.lossreport.store import ReportStore

__all__ = ["add_report_command", "run_report"]

EXIT_OK = 0
EXIT_NO_REPORT = 1
EXIT_USAGE = 2


def add_report_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report", help="print the reconciliation reports of a cell's failovers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("cell", metavar="CELL")
    report.add_argument("--epoch", type=int, default=None,
                        help="the failover to this epoch (default: the latest)")
    report.add_argument("--json", action="store_true", help="print the report as stored (JSON)")
    report.add_argument("--list", action="store_true",
                        help="one line per report of the cell (with --json: their summaries)")
    report.add_argument("--namespace", default="cellplane-system",
                        help="namespace of the operator, which holds the reports' ConfigMaps")
    report.add_argument("--kubeconfig", type=Path, default=None,
                        help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")
    report.set_defaults(run=run_report, prog=report.prog)


def run_report(args: argparse.Namespace, *, out: IO[str] | None = None,
               err: IO[str] | None = None) -> int:
    """What ``cellplane report`` does; returns the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.list and args.epoch is not None:
        print(f"{args.prog}: --list shows every epoch; leave --epoch out", file=err)
        return EXIT_USAGE
    found = asyncio.run(_read(args))
    if not found:
        epoch = "" if args.epoch is None or args.list else f" at epoch {args.epoch}"
        print(f"{args.prog}: no reconciliation report for cell {args.cell}{epoch} (a cell "
              "gets one when a failover finds writes the new primary lacks, or proves there "
              "were none)", file=err)
        return EXIT_NO_REPORT
    if args.list:
        out.write(_listing(found, as_json=args.json))
    elif args.json:
        out.write(found[0].to_json() + "\n")
    else:
        out.write(found[0].render_text())
    return EXIT_OK


async def _read(args: argparse.Namespace) -> list[ReconciliationReport]:
    kube = KubeClient(KubeConfig.load(args.kubeconfig))
    try:
        store = ReportStore(kube, args.namespace, None)
        if args.list:
            return await store.list(args.cell)
        report = await store.get(args.cell, args.epoch)
        return [] if report is None else [report]
    finally:
        await kube.close()


def _listing(reports: list[ReconciliationReport], *, as_json: bool) -> str:
    if as_json:
        return json.dumps([{"cell": r.cell, "epoch": r.epoch, "oldSite": r.old_site,
                            "newSite": r.new_site, "createdAt": r.created_at.isoformat(),
                            "summary": r.summary()} for r in reports], indent=2) + "\n"
    header = ("EPOCH", "CREATED", "OLD PRIMARY", "NEW PRIMARY", "JOBS", "UPDATES", "LEDGER",
              "OUTBOX", "TENANTS", "WAL BYTES")
    rows = [header]
    for report in reports:
        counts = report.counts()
        rows.append((str(report.epoch), report.created_at.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     report.old_site, report.new_site, str(counts.jobs),
                     str(counts.job_updates), str(counts.ledger_entries),
                     str(counts.outbox_events), str(counts.tenants), str(report.lost_wal_bytes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                   + "\n" for row in rows)
