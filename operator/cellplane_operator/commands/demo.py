"""``cellplane demo``: three regions on this machine, a load, a move, a region lost and back.

    cellplane demo            the whole story (a few minutes), then a summary table
    cellplane demo --short    the same steps with fewer jobs and a shorter lease (CI)
    cellplane demo --keep     stay up after the summary, for kubectl; Ctrl-C stops
    cellplane demo --json     the summary as one JSON object on stdout (timeline on stderr)
    cellplane demo --stop     stop a demo left running (--keep) or the leftovers of one killed
    cellplane demo --driver kubernetes
                              the same story on the local multi-node cluster, cells as Pods
                              (root; --short, --keep, --json as above)

The default driver is ``local``: its regions are processes on this machine, and it is
what `bash hack/demo.sh`, the README's main command, runs. ``--driver kubernetes`` is
not the default: it needs root (network namespaces, containerd, kubelets), a first run
builds the operator image with podman, and it takes 1.8 to 2.8 times the
local demo's time (short runs of 2.5 to 4 min against 1.5 min on the 2-core machine:
within twice only with its images up to date on a quiet machine), for the cluster's
start, the chart and the Cells' Pods come before the story, and every read of it is a
`kubectl exec` (docs/kubernetes-driver.md#demo has the measured times). With
it, the demo starts its own cluster beside any other (its network namespaces have their
own prefix), prints `kubectl get pods -A -o wide` while the load runs, and stops the
cluster at its end, on Ctrl-C and on SIGTERM; --keep keeps it up and prints its
KUBECONFIG. --router-port and --stop are the local demo's.

The routers listen on 127.0.0.1 ports --router-port, +1 and +2 (region-a, -b, -c),
so that you can curl them; everything else takes free ports. The demo checks its
ports and looks for an earlier demo before it starts anything: if one is still
running (say, with --keep), it says so and exits 2 (stop that one with
`cellplane demo --stop`); if an earlier demo was killed and left processes or files
behind, it stops and removes them first, and says what it removed.

Every process logs to <run dir>/logs; the run dir is removed at the end, unless
CELLPLANE_KEEP_RUN_DIR=1 is set (to read the logs after a failure). The state
file is $TMPDIR/cellplane-demo.json (CELLPLANE_DEMO_STATE moves it).

Exit codes: 0 every invariant held; 1 a step did not happen in time (the message
says which); 2 nothing was started (a port is taken, another demo runs, bad
arguments); 3 the demo ran to its end and an invariant broke (the summary says
which); 130 interrupted before the summary (Ctrl-C or SIGTERM; everything was
stopped). With --keep, the Ctrl-C that ends the demo after its summary keeps the
summary's code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

from cellplane_operator.demo.leftovers import (DemoRecord, ProcessId, alive, kill_leftovers,
                                               process_id, state_path, taken_ports)
from cellplane_operator.demo.summary import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED,
                                             EXIT_OK, render_table)
from cellplane_operator.localplane.ports import LOOPBACK

__all__ = ["add_demo_command", "run_demo", "stop_demo"]

DEFAULT_ROUTER_PORT = 8000
_STOP_TIMEOUT_SECONDS = 120.0


def add_demo_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="the local demo: 3 regions, their operators and routers, Cells and "
        "Tenants, a load, a move, a region lost and back, a summary", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--short", action="store_true",
                      help="CI mode: fewer jobs, a 3 s lease, the same steps")
    demo.add_argument("--keep", action="store_true",
                      help="stay up after the summary until Ctrl-C (or `cellplane demo --stop`)")
    demo.add_argument("--json", action="store_true",
                      help="print the summary as one JSON object on stdout; the timeline goes "
                      "to stderr")
    demo.add_argument("--router-port", type=int, default=DEFAULT_ROUTER_PORT, metavar="PORT",
                      help="the routers of region-a, -b and -c listen on PORT, PORT+1, PORT+2 "
                      f"(default {DEFAULT_ROUTER_PORT})")
    demo.add_argument("--stop", action="store_true",
                      help="stop the demo recorded in the state file (or its leftovers) and exit")
    demo.add_argument("--driver", choices=("local", "kubernetes"), default="local",
                      help="local (default): regions as processes on this machine; "
                      "kubernetes: the local multi-node cluster, cells as Pods (root)")
    demo.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    timeline_stream = sys.stderr if args.json else sys.stdout
    path = state_path()
    if args.driver == "kubernetes":
        if args.stop:
            print("cellplane demo: --stop is the local demo's; a cluster demo stops on Ctrl-C "
                  "or SIGTERM", file=sys.stderr)
            return EXIT_BAD_INPUT
        if os.geteuid() != 0:
            print("cellplane demo --driver kubernetes: the local cluster needs root (network "
                  "namespaces, containerd, kubelets); run it as root", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _run(args, None, timeline_stream)
    if args.stop:
        return stop_demo(path)
    if not 1024 <= args.router_port <= 65533:
        print("cellplane demo: --router-port must be between 1024 and 65533", file=sys.stderr)
        return EXIT_BAD_INPUT
    earlier = DemoRecord.load(path)
    if earlier is not None:
        if alive(earlier.demo):
            print(f"cellplane demo: a demo is already running since {earlier.started_at} (pid "
                  f"{earlier.demo.pid}, run dir {earlier.run_dir}, routers "
                  f"{' '.join(earlier.router_urls)}); stop it with `cellplane demo --stop`",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        stopped = clean_leftovers(earlier)
        path.unlink(missing_ok=True)
        print(f"cellplane demo: removed the leftovers of a demo started {earlier.started_at} "
              f"that is gone (pid {earlier.demo.pid}): {len(stopped)} process(es) stopped, "
              f"{earlier.run_dir} removed", file=timeline_stream)
    ports = [args.router_port + i for i in range(3)]
    taken = taken_ports(LOOPBACK, ports)
    if taken:
        names = ", ".join(f"{LOOPBACK}:{p} (router of region-{'abc'[p - args.router_port]})"
                          for p in taken)
        print(f"cellplane demo: {'port' if len(taken) == 1 else 'ports'} {names} "
              f"{'is' if len(taken) == 1 else 'are'} taken; stop what listens there (`ss -ltnp "
              f"sport = :{taken[0]}`) or pass --router-port to use other ports", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _run(args, path, timeline_stream)


def _run(args: argparse.Namespace, path: Path | None, timeline_stream: IO[str]) -> int:
    """The demo on either driver; ``path`` is the local demo's state file (None on the
    cluster, which records itself: its janitor cleans up after a killed launcher)."""
    # Imported here: the checks above must answer at once, without the runner's imports.
    from cellplane_operator.demo import scene
    from cellplane_operator.demo.cluster import ClusterDemo
    from cellplane_operator.demo.runner import DemoRun
    from cellplane_operator.demo.timeline import DemoFailed, Timeline

    timeline = Timeline(timeline_stream)
    me = process_id(os.getpid(), "demo")
    assert me is not None
    record = DemoRecord(demo=me, run_dir="", started_at=DemoRecord.now())
    previous = _unwind_on_sigterm()
    run: DemoRun | ClusterDemo | None = None
    code = EXIT_FAILED
    interrupted = kept = False
    try:
        if path is None:
            run = ClusterDemo(scene.cluster_settings_for(args.short), timeline)
        else:
            run = DemoRun(scene.settings_for(args.short), router_port=args.router_port,
                          timeline=timeline, record=record, state_file=path)
        summary = run.run()
        timeline.write(render_table(summary))
        if args.json:
            print(summary.to_json(), flush=True)
        code = summary.exit_code
        if args.keep:
            run.show_how_to_explore()
            kept = True
            threading.Event().wait()  # until Ctrl-C or SIGTERM (KeyboardInterrupt)
    except KeyboardInterrupt:
        # With --keep, Ctrl-C after the summary is how the demo ends: its verdict stands.
        interrupted = not kept
        timeline.say(("stopping" if kept else "interrupted; stopping") + " every process")
    except DemoFailed as failure:
        timeline.say(f"FAILED: {failure}")
        code = EXIT_FAILED
    except Exception as failure:  # said, then everything is stopped
        timeline.say(f"FAILED: {type(failure).__name__}: {failure}")
        code = EXIT_FAILED
    finally:
        # A second Ctrl-C must not cut the cleanup short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            started = time.monotonic()
            if run is not None:
                keep_dir = bool(os.environ.get("CELLPLANE_KEEP_RUN_DIR"))
                run.close(remove=not keep_dir)
                timeline.say(f"every process stopped in {time.monotonic() - started:.1f} s; "
                             "run dir " + (f"kept: {run.run_dir}" if keep_dir else "removed"))
            elif record.run_dir:  # interrupted while the run dir was being made
                shutil.rmtree(record.run_dir, ignore_errors=True)
            mine = DemoRecord.load(path) if path is not None else None
            if path is not None and mine is not None and mine.demo == me:
                path.unlink(missing_ok=True)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)
    if interrupted:
        return EXIT_INTERRUPTED
    return code


def stop_demo(path: Path) -> int:
    """``--stop``: ask the recorded demo to stop (SIGTERM: it cleans up after itself), then
    stop whatever of it is left and remove its files."""
    record = DemoRecord.load(path)
    if record is None:
        print(f"cellplane demo --stop: no demo recorded in {path}; nothing to stop")
        return EXIT_OK
    if alive(record.demo):
        print(f"stopping the demo started {record.started_at} (pid {record.demo.pid}) ...",
              flush=True)
        os.kill(record.demo.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_SECONDS
        while alive(record.demo) and time.monotonic() < deadline:
            time.sleep(0.2)  # another process's exit has no event to wait on
        if alive(record.demo):
            print(f"cellplane demo --stop: pid {record.demo.pid} did not stop within "
                  f"{_STOP_TIMEOUT_SECONDS:.0f} s; killing it and its processes", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.demo.pid, signal.SIGKILL)
    stopped = clean_leftovers(record)
    path.unlink(missing_ok=True)
    print(f"stopped; {len(stopped)} leftover process(es) stopped, {record.run_dir} removed")
    return EXIT_OK


def clean_leftovers(record: DemoRecord) -> list[int]:
    """Every process of a demo that is gone, then its run dir: the recorded ones, the site
    processes recorded under its state dirs, and anything else whose command line names
    its run dir (a process started after the last record was written)."""
    from cellplane_operator.sites.local import stop_all_sites

    stopped = kill_leftovers(record)
    for state_dir in record.site_state_dirs:
        with contextlib.suppress(Exception):  # a half-written site state: the scan below
            stopped += stop_all_sites(Path(state_dir))
    if record.run_dir:
        strays = [p for p in _processes_naming(record.run_dir)
                  if p.pid != os.getpid() and p.pid not in stopped]
        stopped += kill_leftovers(DemoRecord(demo=record.demo, run_dir=record.run_dir,
                                             started_at=record.started_at, processes=strays))
        shutil.rmtree(record.run_dir, ignore_errors=True)
    return stopped


def _processes_naming(text: str) -> list[ProcessId]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                process = process_id(int(entry.name), "stray")
                if process is not None:
                    found.append(process)
        except OSError:
            continue  # gone while we looked
    return found


def _unwind_on_sigterm() -> signal._HANDLER:
    """SIGTERM unwinds like Ctrl-C, so the ``finally`` that stops everything runs; returns
    the handler it replaced."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, interrupt)
    return signal.SIG_DFL if previous is None else previous
