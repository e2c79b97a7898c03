"""``cellplane move``: ask the operators to move a tenant to another cell, and follow the move.

    cellplane move TENANT --to CELL [-n NS] [--wait]   create a TenantMove; print its name
    cellplane move --abort NAME [-n NS] [--wait]       set spec.abort on a TenantMove

The operators do the work (the TenantMove controller); this command only writes
the TenantMove and reads its status, so ``kubectl apply`` of the same object does
the same. The name goes to stdout (for scripts); the progress goes to stderr: one
redrawn line on a terminal, one line per change otherwise.

A move that cannot start is refused before anything is written, in one line with
exit 1: an unknown tenant, an unknown cell (for a shared tenant; a dedicated one
moves into a cell the move makes), the tenant's own cell, a cell of the wrong
tier, or a cell whose URL policy refuses the tenant's targets or webhooks. What only the operators can judge (readiness, room) the TenantMove's status
says, and ``--wait`` prints.

Exit codes with ``--wait``: 0 the move completed (or, for ``--abort``, aborted),
1 it ended otherwise (the reason is printed), 2 it had not ended by ``--timeout``
(it goes on: the command only stops watching).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from cellplane_cells.domain.targets import UrlRefused, check_url

from cellplane_operator.domain.move_progress import TERMINAL, ending_reason, render_progress
from cellplane_operator.errors import CellplaneError, KubeConflictError
from cellplane_operator.kube import CELLS, TENANTMOVES, TENANTS, KubeClient, KubeConfig

__all__ = ["add_move_command", "run_move", "move_name", "move_refusal", "resolve_here",
           "HostUnresolved"]

EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT = 0, 1, 2
EXIT_USAGE = 2

_PAST_CUTOVER = ("CuttingOver", "Verifying")
_POLL_SECONDS = 0.5
_DNS_LABEL_MAX = 63


def add_move_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    move = commands.add_parser(
        "move", help="move a tenant to another cell (creates a TenantMove)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    move.add_argument("tenant", metavar="TENANT", nargs="?",
                      help="name of the Tenant to move (in --namespace)")
    move.add_argument("--to", metavar="CELL", dest="cell", help="the cell to move it to")
    move.add_argument("--abort", metavar="NAME", default=None,
                      help="abort the TenantMove NAME instead (only before its cutover)")
    move.add_argument("-n", "--namespace", default=None,
                      help="namespace of the Tenant and the TenantMove "
                           "(default: the kubeconfig context's)")
    move.add_argument("--max-write-pause", type=float, default=None, metavar="SECONDS",
                      help="longest the tenant's writes may pause at cutover (default 2)")
    move.add_argument("--retain-source-for", type=int, default=None, metavar="SECONDS",
                      help="how long the source keeps the tenant's rows, read-only, "
                           "after the move (default 86400)")
    move.add_argument("--name", default=None,
                      help="name of the TenantMove (default: TENANT-to-CELL)")
    move.add_argument("--wait", action="store_true",
                      help="follow the move until it ends, with a progress bar on stderr")
    move.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                      help="how long --wait waits (default 3600)")
    move.add_argument("--kubeconfig", type=Path, default=None,
                      help="default: $KUBECONFIG, in-cluster, then ~/.kube/config")
    # Errors name the command as the user typed it: cellplane move, kubectl cellplane move.
    move.set_defaults(run=run_move, prog=move.prog)


def run_move(args: argparse.Namespace, *, out: IO[str] | None = None,
             err: IO[str] | None = None, tty: bool | None = None) -> int:
    """What ``cellplane move`` does; returns the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.abort is not None:
        if args.tenant is not None or args.cell is not None:
            print(f"{args.prog}: --abort NAME takes no TENANT or --to", file=err)
            return EXIT_USAGE
    elif args.tenant is None or args.cell is None:
        print(f"{args.prog}: give TENANT --to CELL, or --abort NAME", file=err)
        return EXIT_USAGE
    follow = _Follower(err, err.isatty() if tty is None else tty)
    return asyncio.run(_run(args, out, err, follow))


def move_name(tenant: str, cell: str) -> str:
    """``<tenant>-to-<cell>``, cut to a DNS label (63 characters, no trailing dash)."""
    return f"{tenant}-to-{cell}"[:_DNS_LABEL_MAX].rstrip("-")


class _Follower:
    """Shows the progress line on stderr: redrawn in place on a terminal, else once per change."""

    def __init__(self, err: IO[str], tty: bool) -> None:
        self._err, self._tty, self._last = err, tty, ""

    def show(self, line: str) -> None:
        if line == self._last:
            return
        self._last = line
        self._err.write(f"\r\x1b[K{line}" if self._tty else f"{line}\n")
        self._err.flush()

    def end(self) -> None:
        if self._tty and self._last:
            self._err.write("\n")
            self._err.flush()


async def _run(args: argparse.Namespace, out: IO[str], err: IO[str], follow: _Follower) -> int:
    config = KubeConfig.load(args.kubeconfig)
    namespace = args.namespace or config.namespace
    kube = KubeClient(config, user_agent="cellplane-cli")
    try:
        if args.abort is not None:
            return await _abort(kube, args, namespace, err, follow)
        return await _create(kube, args, namespace, out, err, follow)
    except CellplaneError as error:
        follow.end()
        print(f"{args.prog}: {error}", file=err)
        return EXIT_FAILED
    finally:
        await kube.close()


def move_refusal(tenant: Mapping[str, Any] | None, cell: Mapping[str, Any] | None, *,
                 tenant_name: str, namespace: str, target: str,
                 resolve: Callable[[str], Iterable[str]] | None = None) -> str | None:
    """Why a move of ``tenant`` to cell ``target`` cannot start, or None: the operators'
    own refusals (domain/moves.py admit_move) that the objects as read already show."""
    if tenant is None:
        return f"no tenant {namespace}/{tenant_name}"
    isolation = str((tenant.get("spec") or {}).get("isolation") or "shared")
    if cell is None:
        # A dedicated tenant's move makes the cell it names.
        return None if isolation == "dedicated" else f"no cell {target}"
    if (tenant.get("status") or {}).get("cell") == target:
        return f"tenant {namespace}/{tenant_name} is in cell {target} already"
    tier = str((cell.get("spec") or {}).get("tier") or "shared")
    if tier != isolation:
        return (f"cell {target} is {tier}; tenant {namespace}/{tenant_name} needs a "
                f"{isolation} cell")
    return _urls_refused(tenant, cell, target=target, resolve=resolve or resolve_here)


class HostUnresolved(Exception):
    """A name this machine cannot resolve: the operator asks the cell itself."""


def resolve_here(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        raise HostUnresolved(host) from None


def _urls_refused(tenant: Mapping[str, Any], cell: Mapping[str, Any], *, target: str,
                  resolve: Callable[[str], Iterable[str]]) -> str | None:
    """The target cell's URL policy (the cell's own, domain/targets.py) over the tenant's
    targets and webhooks, as far as this machine can judge: a name it cannot resolve is
    left to the operator, which asks the cell before the move starts."""
    spec = tenant.get("spec") or {}
    allow_private = bool(((cell.get("spec") or {}).get("driver") or {}).get("allowPrivateTargets"))
    urls = [*((f"spec.targets[{i}].url", str(t.get("url"))) for i, t in
              enumerate(spec.get("targets") or [])),
            *((f"spec.webhooks[{i}].url", str(w.get("url"))) for i, w in
              enumerate(spec.get("webhooks") or []))]
    refused = []
    for field, url in urls:
        try:
            check_url(url, allow_private=allow_private, resolve=resolve)
        except UrlRefused as error:
            refused.append(f"{field} ({url}): {error}")
        except HostUnresolved:
            continue
    if not refused:
        return None
    return (f"cell {target} refuses the tenant's " + "; ".join(refused)
            + ("" if allow_private else " (the cell does not allow private targets)"))


async def _create(kube: KubeClient, args: argparse.Namespace, namespace: str, out: IO[str],
                  err: IO[str], follow: _Follower) -> int:
    refusal = move_refusal(await kube.get(TENANTS, args.tenant, namespace=namespace),
                           await kube.get(CELLS, args.cell), tenant_name=args.tenant,
                           namespace=namespace, target=args.cell)
    if refusal is not None:
        print(f"{args.prog}: {refusal}", file=err)
        return EXIT_FAILED
    name = args.name or move_name(args.tenant, args.cell)
    spec: dict[str, Any] = {"tenant": args.tenant, "targetCell": args.cell}
    if args.max_write_pause is not None:
        spec["maxWritePauseSeconds"] = args.max_write_pause
    if args.retain_source_for is not None:
        spec["retainSourceForSeconds"] = args.retain_source_for
    try:
        await kube.create(TENANTMOVES, {"metadata": {"name": name, "namespace": namespace},
                                        "spec": spec}, namespace=namespace)
    except KubeConflictError:
        existing = await kube.get(TENANTMOVES, name, namespace=namespace) or {}
        phase = (existing.get("status") or {}).get("phase") or "Pending"
        print(f"{args.prog}: a TenantMove {name} exists already in {namespace} ({phase}); "
              "pass --name for a new one", file=err)
        return EXIT_FAILED
    print(name, file=out)
    out.flush()
    if not args.wait:
        return EXIT_OK
    return await _follow(kube, name, namespace, args, "Completed", err, follow)


async def _abort(kube: KubeClient, args: argparse.Namespace, namespace: str, err: IO[str],
                 follow: _Follower) -> int:
    name = args.abort
    move = await kube.get(TENANTMOVES, name, namespace=namespace)
    if move is None:
        print(f"{args.prog}: no TenantMove {name} in {namespace}", file=err)
        return EXIT_FAILED
    phase = (move.get("status") or {}).get("phase") or "Pending"
    if phase in TERMINAL:
        print(f"{args.prog}: TenantMove {name} has ended already ({phase}); "
              "nothing to abort", file=err)
        return EXIT_OK if phase == "Aborted" else EXIT_FAILED
    if phase in _PAST_CUTOVER:
        print(f"{args.prog}: TenantMove {name} is past its cutover ({phase}): it can only "
              "finish forward, an abort would lose the writes the target took", file=err)
        return EXIT_FAILED
    await kube.patch(TENANTMOVES, name, {"spec": {"abort": True}}, namespace=namespace)
    print(f"TenantMove {name}: abort asked", file=err)
    if not args.wait:
        return EXIT_OK
    return await _follow(kube, name, namespace, args, "Aborted", err, follow)


async def _follow(kube: KubeClient, name: str, namespace: str, args: argparse.Namespace,
                  goal: str, err: IO[str], follow: _Follower) -> int:
    timeout = float(args.timeout)
    deadline = time.monotonic() + timeout
    status: Mapping[str, Any] = {}
    while True:
        move = await kube.get(TENANTMOVES, name, namespace=namespace)
        if move is None:
            follow.end()
            print(f"{args.prog}: TenantMove {name} was deleted (a deleted move is aborted)",
                  file=err)
            return EXIT_FAILED
        status = move.get("status") or {}
        follow.show(render_progress(status))
        phase = status.get("phase")
        if phase in TERMINAL:
            follow.end()
            return _ended(name, status, goal, err)
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(_POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
    follow.end()
    print(f"{args.prog}: TenantMove {name} had not ended after {timeout:g}s "
          f"({status.get('phase') or 'Pending'}); it goes on "
          f"(kubectl describe tenantmove {name} -n {namespace})", file=err)
    return EXIT_TIMEOUT


def _ended(name: str, status: Mapping[str, Any], goal: str, err: IO[str]) -> int:
    phase = str(status["phase"])
    cells = f"{status.get('sourceCell') or '?'} -> {status.get('targetCell') or '?'}"
    if phase == "Completed":
        pause = (status.get("progress") or {}).get("pauseSeconds")
        paused = f"; writes paused {pause:.2f}s" if isinstance(pause, (int, float)) else ""
        print(f"TenantMove {name} completed: {cells}{paused}", file=err)
    else:
        print(f"TenantMove {name} {phase.lower()} ({cells}): {ending_reason(status)}", file=err)
    return EXIT_OK if phase == goal else EXIT_FAILED
