"""``kubectl cellplane``: the kubectl plugin (the ``kubectl-cellplane`` console script).

It gives a platform team the cellplane view and requests in the place they
already work: ``status`` and ``tenant-key`` are its own (read-only), and so are
``fence`` / ``unfence`` (the ``cellplane.io/fenced`` annotation, ``domain/fencing.py``); move,
switchover, failover and report are the ``cellplane`` commands of the same
names, registered from the same modules so both behave alike. The status tables
are a pure function of the Cells and Tenants as read (``status_summary``,
``render_status``). The plugin only reads objects and writes requests
(TenantMoves, Cell annotations); the operators do the work.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from cellplane_operator.domain.conditions import find_condition
from cellplane_operator.domain.fencing import FENCED, annotation_value, requested_fence
from cellplane_operator.errors import CellplaneError
from cellplane_operator.commands.failover import add_failover_commands
from cellplane_operator.kube import CELLS, SECRETS, TENANTS, KubeClient, KubeConfig
from cellplane_operator.commands.move import add_move_command
from cellplane_operator.commands.report import add_report_command

__all__ = ["main", "build_parser", "parse_args", "status_summary", "render_status", "tenant_not_ready",
           "fence_shown"]

PROG = "kubectl cellplane"

DESCRIPTION = """\
Cells, tenants, moves and failovers of cellplane, from the apiserver.

  kubectl cellplane status [--json]                  cells (owner, epoch, standby lag), tenants
  kubectl cellplane tenant-key TENANT [-n NS]        print a tenant's API key (for scripts)
  kubectl cellplane move TENANT --to CELL [--wait]   move a tenant to another cell
  kubectl cellplane switchover CELL --to REGION      hand a cell to a standby region (planned)
  kubectl cellplane failover CELL --to REGION --force
  kubectl cellplane fence CELL [--reason TEXT]       stop a cell's writes on purpose (no failover)
  kubectl cellplane unfence CELL                     let a fenced cell write again
  kubectl cellplane report CELL [--epoch N]          a failover's reconciliation report

kubectl hands the plugin every argument after its name, so --kubeconfig and
-n/--namespace may come before the command (kubectl cellplane -n team-a
tenant-key acme) or after it. -n names the namespace of the objects the command
addresses: the Tenant and its TenantMove (default: the kubeconfig context's),
the tenants status shows (default: every namespace), the operator's namespace
for report (default: cellplane-system); switchover, failover, fence and unfence
ignore it (Cells are cluster-scoped).

Exit codes: 0 done; 1 refused or failed, with a one-line reason on stderr (an
unknown tenant or cell, a tenant not Ready yet, the apiserver's refusal); 2 a
usage error, or a move, fence or unfence --wait that had not ended by its --timeout.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_TIMEOUT = 2
EXIT_INTERRUPTED = 130

_REPORT_NAMESPACE = "cellplane-system"
"""Where ``report`` looks without ``-n`` (the operator's namespace, as ``cellplane report``)."""
_DEFAULT_MAX_LAG_SECONDS = 30.0
"""The CRD's default of ``spec.failover.maxStandbyLagSeconds``."""
_NONE = "-"
_USER_AGENT = "kubectl-cellplane"
_POLL_SECONDS = 0.5
"""How often ``fence --wait`` and ``unfence --wait`` read the Cell."""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not hasattr(args, "run"):
        build_parser().print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except CellplaneError as error:
        print(f"{PROG}: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as error:  # an unreadable certificate or key file named by the kubeconfig
        print(f"{PROG}: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Root copies of the common flags under their own names: a subcommand's default
    # (None) would otherwise overwrite what was given before the command.
    parser.add_argument("--kubeconfig", dest="root_kubeconfig", type=Path, default=None,
                        metavar="PATH",
                        help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")
    parser.add_argument("-n", "--namespace", dest="root_namespace", default=None, metavar="NS",
                        help="namespace of the objects the command addresses")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    status = commands.add_parser(
        "status", help="the cells (phase, owner, epoch, load, standby lag) and their tenants",
        description="One table of the Cells (from their status: phase, active region, epoch, "
                    "tenants, worker slots in use of the capacity, standby regions with their "
                    "lag) and, below it, the Tenants per cell. Reads Cells cluster-wide and "
                    "Tenants in every namespace (in one with -n).")
    status.add_argument("--json", action="store_true", help="print the same as JSON")
    _kube_flags(status)
    status.set_defaults(run=_run_status)

    key = commands.add_parser(
        "tenant-key", help="print a tenant's API key from its Secret (for scripts)",
        description="Prints the API key of a Ready tenant (its Secret TENANT-api-key, data key "
                    "api-key) and nothing else. Exit 1 with a reason if the Tenant or the "
                    "Secret does not exist or the tenant is not Ready yet.")
    key.add_argument("tenant", metavar="TENANT")
    _kube_flags(key)
    key.set_defaults(run=_run_tenant_key)

    add_move_command(commands)
    add_failover_commands(commands)

    fence = commands.add_parser(
        "fence", help="stop a cell's writes on purpose, without a failover",
        description="Annotates the Cell with cellplane.io/fenced (its value: the reason). The "
                    "operator that owns the cell's placement group keeps its lease, so no other "
                    "region takes over and no standby is promoted, but grants the cell database "
                    "no write time: every write is refused by the database at once, and stays "
                    "refused across operator restarts and failovers until unfence. Reads still "
                    "work. Same as kubectl annotate cell CELL cellplane.io/fenced=REASON. A cell "
                    "fenced already is left as it is (exit 0).")
    fence.add_argument("cell", metavar="CELL")
    fence.add_argument("--reason", metavar="TEXT", default=None,
                       help="why (shown in the Cell's Fenced condition and its Event)")
    _fence_flags(fence, "wait until the Cell's status shows the fence in force")
    fence.set_defaults(run=_run_fence)

    unfence = commands.add_parser(
        "unfence", help="let a fenced cell write again",
        description="Removes the cellplane.io/fenced annotation: the owner grants the cell "
                    "database write time again under the same epoch (it never let go of the "
                    "lease). A cell that is not fenced is left as it is (exit 0).")
    unfence.add_argument("cell", metavar="CELL")
    _fence_flags(unfence, "wait until the Cell's status shows the fence lifted")
    unfence.set_defaults(run=_run_unfence)

    add_report_command(commands)
    # -n, as kubectl users type it, after these commands too. report's --namespace is
    # the operator's; without either, report reads the operator's default namespace
    # (filled in after parsing, so that an -n before the command counts).
    report = commands.choices["report"]
    report.add_argument("-n", dest="namespace", metavar="NAMESPACE",
                        help="short for --namespace")
    report.set_defaults(namespace=None)
    # Cells are cluster-scoped: -n is accepted and ignored, as kubectl does for them.
    for cluster_scoped in ("switchover", "failover", "fence", "unfence"):
        commands.choices[cluster_scoped].add_argument(
            "-n", "--namespace", dest="ignored_namespace", help=argparse.SUPPRESS)
    for name, command in commands.choices.items():
        command.set_defaults(command=name)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the flags given before the command applied to it.

    Usage errors exit 2 (argparse's ``SystemExit``)."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "run"):
        _apply_root_flags(args)
    return args


def _fence_flags(parser: argparse.ArgumentParser, wait_help: str) -> None:
    parser.add_argument("--wait", action="store_true", help=wait_help)
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long --wait waits (default 60); exit 2 when it runs out")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")


def _kube_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace (default for tenant-key: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")


def _apply_root_flags(args: argparse.Namespace) -> None:
    """The flags given before the command count where the command has none of its own."""
    if getattr(args, "kubeconfig", None) is None:
        args.kubeconfig = args.root_kubeconfig
    if hasattr(args, "namespace") and args.namespace is None:
        args.namespace = args.root_namespace
    if args.command == "report" and args.namespace is None:
        args.namespace = _REPORT_NAMESPACE


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------ status


def status_summary(cells: Iterable[Mapping[str, Any]],
                   tenants: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``status`` shows, from Cells and Tenants as the apiserver returns them.

    Every field a status lacks is None; cells are sorted by name, tenants by
    cell (unplaced last), namespace and name. This is also the ``--json`` output.
    """
    cell_rows = [_cell_row(cell) for cell in cells]
    cell_rows.sort(key=lambda row: str(row["name"]))
    tenant_rows = [_tenant_row(tenant) for tenant in tenants]
    tenant_rows.sort(key=lambda row: (row["cell"] is None, row["cell"] or "",
                                      row["namespace"], row["name"]))
    return {"cells": cell_rows, "tenants": tenant_rows}


def render_status(cells: Iterable[Mapping[str, Any]],
                  tenants: Iterable[Mapping[str, Any]]) -> str:
    """The two tables ``status`` prints: the cells, then the tenants grouped by cell."""
    summary = status_summary(cells, tenants)
    if summary["cells"]:
        cell_table = _table(
            ("CELL", "REGION", "TIER", "PHASE", "ACTIVE", "EPOCH", "TENANTS", "SLOTS",
             "FENCED", "STANDBYS"),
            [(row["name"], _shown(row["region"]), _shown(row["tier"]), _shown(row["phase"]),
              _shown(row["activeRegion"]), _shown(row["epoch"]), _shown(row["tenants"]),
              _slots(row["slotsInUse"], row["workerSlots"]), _shown(row["fenced"]),
              ", ".join(_standby(s) for s in row["standbys"]) or _NONE)
             for row in summary["cells"]])
    else:
        cell_table = "No cells.\n"
    if summary["tenants"]:
        tenant_table = _table(
            ("CELL", "TENANT", "PLAN", "EPOCH", "PHASE"),
            [(_shown(row["cell"]), f"{row['namespace']}/{row['name']}", _shown(row["plan"]),
              _shown(row["epoch"]), _shown(row["phase"])) for row in summary["tenants"]])
    else:
        tenant_table = "No tenants.\n"
    return f"{cell_table}\n{tenant_table}"


def _cell_row(cell: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec = _section(cell, "metadata"), _section(cell, "spec")
    status = _section(cell, "status")
    capacity, failover = _section(spec, "capacity"), _section(spec, "failover")
    max_lag = _number(failover.get("maxStandbyLagSeconds"))
    return {
        "name": str(meta.get("name") or ""),
        "region": spec.get("region"),
        "tier": spec.get("tier"),
        "phase": status.get("phase"),
        "activeRegion": status.get("activeRegion"),
        "epoch": _integer(status.get("epoch")),
        "tenants": _integer(status.get("tenants")),
        "slotsInUse": _integer(status.get("slotsInUse")),
        "workerSlots": _integer(capacity.get("workerSlots")),
        "standbys": _standbys(spec, status,
                              _DEFAULT_MAX_LAG_SECONDS if max_lag is None else max_lag),
        "fenced": fence_shown(cell),
        "fenceReason": _fence_reason(cell),
    }


def fence_shown(cell: Mapping[str, Any]) -> str | None:
    """``yes`` when the Cell's Fenced condition is true and the annotation still stands;
    ``pending`` when it is asked for and not in force yet, ``lifting`` when lifted and
    not yet reported so; None when neither."""
    asked = requested_fence(_section(cell, "metadata").get("annotations")) is not None
    in_force = _fenced_condition(cell).get("status") == "True"
    if asked:
        return "yes" if in_force else "pending"
    return "lifting" if in_force else None


def _fence_reason(cell: Mapping[str, Any]) -> str | None:
    fence = requested_fence(_section(cell, "metadata").get("annotations"))
    return fence.reason if fence is not None else None


def _fenced_condition(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    return find_condition(_section(cell, "status"), "Fenced") or {}


def _standbys(spec: Mapping[str, Any], status: Mapping[str, Any],
              max_lag: float) -> list[dict[str, Any]]:
    """One entry per region of the cell other than the active one, from the spec or the
    status (a region just removed from the spec may still report), with a state:
    streaming, lagging, not streaming or no report. After a takeover the home region is
    a standby and the region that took over is not."""
    reports = {str(r.get("region")): r for r in status.get("standbys") or []
               if isinstance(r, Mapping)}
    regions = {str(r) for r in spec.get("standbyRegions") or []} | set(reports)
    if spec.get("region"):
        regions.add(str(spec["region"]))
    regions.discard(str(status.get("activeRegion") or spec.get("region")))
    entries: list[dict[str, Any]] = []
    for region in sorted(regions):
        report: Mapping[str, Any] = reports.get(region) or {}
        streaming = report.get("streaming") if isinstance(report.get("streaming"), bool) else None
        lag = _number(report.get("lagSeconds"))
        if not report:
            state = "no report"
        elif streaming is False:
            state = "not streaming"
        elif lag is not None and lag > max_lag:
            state = "lagging"
        elif streaming is None:
            state = "unknown"
        else:
            state = "streaming"
        entries.append({"region": region, "streaming": streaming, "lagSeconds": lag,
                        "state": state, "message": report.get("message") or None})
    return entries


def _tenant_row(tenant: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec = _section(tenant, "metadata"), _section(tenant, "spec")
    status = _section(tenant, "status")
    return {
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "plan": spec.get("plan"),
        "cell": status.get("cell"),
        "epoch": _integer(status.get("epoch")),
        "phase": status.get("phase"),
    }


def _standby(entry: Mapping[str, Any]) -> str:
    region, state, lag = entry["region"], entry["state"], entry["lagSeconds"]
    if state in ("streaming", "unknown"):
        return f"{region} {lag:.1f}s" if lag is not None else f"{region} ({state})"
    if state == "lagging":
        return f"{region} {lag:.1f}s (lagging)"
    return f"{region} ({state})"


def _slots(in_use: int | None, capacity: int | None) -> str:
    if in_use is None and capacity is None:
        return _NONE
    return f"{_shown(in_use)}/{_shown(capacity)}"


def _shown(value: Any) -> str:
    return _NONE if value is None or value == "" else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join("   ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                   + "\n" for line in lines)


def _section(document: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = document.get(key)
    return value if isinstance(value, Mapping) else {}


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _run_status(args: argparse.Namespace, *, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    cells, tenants = asyncio.run(_read_status(args))
    if args.json:
        out.write(json.dumps(status_summary(cells, tenants), indent=2) + "\n")
    else:
        out.write(render_status(cells, tenants))
    return EXIT_OK


async def _read_status(args: argparse.Namespace
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    kube = KubeClient(KubeConfig.load(args.kubeconfig), user_agent=_USER_AGENT)
    try:
        cells = await kube.list(CELLS)
        tenants = await kube.list(TENANTS, namespace=args.namespace)
        return cells, tenants
    finally:
        await kube.close()


# -------------------------------------------------------------------- tenant-key


def tenant_not_ready(tenant: Mapping[str, Any]) -> str | None:
    """Why a Tenant's key is not to be handed out yet, or None when it is Ready.

    Ready is the ``Ready`` condition (true in the phases Ready and Degraded): the
    cell has the tenant and its key is in the Secret.
    """
    status = _section(tenant, "status")
    phase = str(status.get("phase") or "Pending")
    ready = find_condition(status, "Ready")
    if ready is None:
        return None if phase in ("Ready", "Degraded") else f"{phase}: no Ready condition yet"
    if ready.get("status") == "True":
        return None
    reason, message = str(ready.get("reason") or "NotReady"), str(ready.get("message") or "")
    return f"{phase}: {reason}" + (f": {message}" if message else "")


def _run_tenant_key(args: argparse.Namespace, *, out: IO[str] | None = None,
                    err: IO[str] | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    return asyncio.run(_tenant_key(args, out, err))


async def _tenant_key(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    config = KubeConfig.load(args.kubeconfig)
    namespace = args.namespace or config.namespace
    where = f"{namespace}/{args.tenant}"
    kube = KubeClient(config, user_agent=_USER_AGENT)
    try:
        tenant = await kube.get(TENANTS, args.tenant, namespace=namespace)
        if tenant is None:
            print(f"{PROG}: no tenant {where}", file=err)
            return EXIT_FAILED
        why = tenant_not_ready(tenant)
        if why is not None:
            print(f"{PROG}: tenant {where} is not Ready yet ({_one_line(why)})", file=err)
            return EXIT_FAILED
        name = str(_section(tenant, "status").get("apiKeySecret") or f"{args.tenant}-api-key")
        secret = await kube.get(SECRETS, name, namespace=namespace)
    finally:
        await kube.close()
    if secret is None:
        print(f"{PROG}: no Secret {namespace}/{name} (the API key of tenant {where})", file=err)
        return EXIT_FAILED
    encoded = _section(secret, "data").get("api-key")
    try:
        key = base64.b64decode(str(encoded), validate=True).decode() if encoded else ""
    except (binascii.Error, UnicodeDecodeError):
        key = ""
    if not key:
        print(f"{PROG}: Secret {namespace}/{name} holds no api-key", file=err)
        return EXIT_FAILED
    print(key, file=out)
    return EXIT_OK


# -------------------------------------------------------------------- fence, unfence


def _run_fence(args: argparse.Namespace, *, out: IO[str] | None = None,
               err: IO[str] | None = None) -> int:
    return asyncio.run(_fence(args, out or sys.stdout, err or sys.stderr, fence=True))


def _run_unfence(args: argparse.Namespace, *, out: IO[str] | None = None,
                 err: IO[str] | None = None) -> int:
    return asyncio.run(_fence(args, out or sys.stdout, err or sys.stderr, fence=False))


async def _fence(args: argparse.Namespace, out: IO[str], err: IO[str], *, fence: bool) -> int:
    kube = KubeClient(KubeConfig.load(args.kubeconfig), user_agent=_USER_AGENT)
    try:
        cell = await kube.get(CELLS, args.cell)
        if cell is None:
            print(f"{PROG}: no cell {args.cell}", file=err)
            return EXIT_FAILED
        standing = requested_fence(_section(cell, "metadata").get("annotations"))
        if fence and standing is not None:
            print(f"cell {args.cell} is fenced already ({standing.reason})", file=out)
        elif fence:
            value = annotation_value(args.reason)
            await kube.patch(CELLS, args.cell, {"metadata": {"annotations": {FENCED: value}}})
            print(f"cell {args.cell} fenced ({FENCED}={value}): its owner stops every write",
                  file=out)
        elif standing is None:
            print(f"cell {args.cell} is not fenced", file=out)
        else:
            await kube.patch(CELLS, args.cell, {"metadata": {"annotations": {FENCED: None}}})
            print(f"cell {args.cell} unfenced: its owner grants writes again", file=out)
        if not args.wait:
            return EXIT_OK
        return await _wait_fence(kube, args.cell, fence, args.timeout, out, err)
    finally:
        await kube.close()


async def _wait_fence(kube: KubeClient, name: str, fence: bool, timeout: float,
                      out: IO[str], err: IO[str]) -> int:
    """Until the Cell's Fenced condition says the fence is in force (or lifted)."""
    deadline = time.monotonic() + timeout
    while True:
        cell = await kube.get(CELLS, name)
        if cell is None:
            print(f"{PROG}: cell {name} was deleted", file=err)
            return EXIT_FAILED
        condition = _fenced_condition(cell)
        if (condition.get("status") == "True") == fence:
            if fence:
                print(f"cell {name}: fence in force: {_one_line(str(condition.get('message')))}",
                      file=out)
            else:
                print(f"cell {name}: fence lifted, writes granted under epoch "
                      f"{_shown(_section(cell, 'status').get('epoch'))}", file=out)
            return EXIT_OK
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(_POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
    goal = "in force" if fence else "lifted"
    print(f"{PROG}: the fence of cell {name} was not {goal} after {timeout:g}s (the request "
          f"stands; see kubectl describe cell {name})", file=err)
    return EXIT_TIMEOUT


if __name__ == "__main__":
    sys.exit(main())
