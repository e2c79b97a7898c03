"""``cellplane local up --cluster`` and the commands that act on a running cluster.

    cellplane local up --cluster [--regions a,b,c]   control plane + a node per region
    cellplane local down [--state FILE]              stop what ``local up`` started
    cellplane local partition REGION                 cut a region's node off the bridge
    cellplane local heal REGION                      restore its link
    cellplane local reload                           rebuild and reload the images, restart
                                                     the operator pods

``up`` stays in the foreground (Ctrl-C or ``local down`` stops it) and writes its
state file; the other commands read it. A launcher killed outright is cleaned up
by the cluster's janitor.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from cellplane_operator.errors import LocalPlaneError

__all__ = ["add_cluster_commands", "run_cluster_up"]

_DEFAULT_STATE = Path(".local/state.json")


def add_cluster_commands(local_commands: Any) -> None:
    down = local_commands.add_parser(
        "down", help="stop the plane or cluster `local up` started (its processes, mounts, "
        "network namespaces)")
    down.add_argument("--state", type=Path, default=_DEFAULT_STATE)
    down.add_argument("--timeout", type=float, default=120.0,
                      help="seconds to wait for the launcher before cleaning up after it")
    down.set_defaults(run=_run_down)
    reload = local_commands.add_parser(
        "reload", help="after a code change: rebuild the images, import them into every node "
        "of the running cluster and restart the operator pods on them")
    reload.add_argument("--state", type=Path, default=_DEFAULT_STATE)
    reload.set_defaults(run=_run_reload)
    for name, text in (("partition", "cut a region's node off the cluster's bridge"),
                       ("heal", "restore a partitioned region's link")):
        command = local_commands.add_parser(name, help=text)
        command.add_argument("region")
        command.add_argument("--state", type=Path, default=_DEFAULT_STATE)
        command.set_defaults(run=_run_link, up=name == "heal")


def run_cluster_up(regions: tuple[str, ...], state: Path, wait: Any, *,
                   operators: bool = True) -> int:
    """Starts the cluster (and with ``operators``, installs the chart on it), writes
    ``state``, waits for ``wait()`` to return, tears down."""
    from cellplane_operator.localplane.cluster import ClusterConfig, LocalCluster
    from cellplane_operator.localplane.clusterchart import install_operators
    from cellplane_operator.localplane.images import build_images

    def say(line: str) -> None:
        print(line, flush=True)

    images = build_images(say=lambda line: say(f"images: {line}"))
    # With the chart, the CRDs and the admission policy are the chart's (helm owns them).
    cluster = LocalCluster(ClusterConfig(regions=regions, apply_crds=not operators),
                           images=images, say=say)
    say(f"starting a cluster of {len(regions)} node(s) in {cluster.run_dir} ...")
    try:
        cluster.start()
        if operators:
            began = time.monotonic()
            install_operators(cluster, say=say)
            say(f"operators Ready in {time.monotonic() - began:.1f} s "
                f"(kubectl -n cellplane-system get pods -o wide)")
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({**cluster.describe(), "launcher_pid": os.getpid(),
                                     "cluster_state": str(cluster.state_file)}, indent=2) + "\n")
        print(f"up. state: {state}\n  export KUBECONFIG={cluster.kubeconfig}\n"
              f"  inside: nsenter --net=/run/netns/{cluster.plan.control_netns} ... "
              f"(KUBECONFIG={cluster.inside_kubeconfig})\n"
              "Ctrl-C or `cellplane local down` stops everything.", flush=True)
        wait()
    finally:
        cluster.stop()
        state.unlink(missing_ok=True)
    return 0


def _read_state(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalPlaneError(f"no state file {path}: is `cellplane local up` running?") from None
    assert isinstance(raw, dict)
    return raw


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_down(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    pid = state.get("launcher_pid")
    if isinstance(pid, int) and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    cluster_state = state.get("cluster_state")
    if isinstance(cluster_state, str) and Path(cluster_state).exists():
        # The launcher did not finish its teardown: do it from the state it left.
        from cellplane_operator.localplane.cluster import ClusterState, teardown

        left = teardown(ClusterState.read(Path(cluster_state)))
        if left:
            raise LocalPlaneError("down left: " + "; ".join(left))
    args.state.unlink(missing_ok=True)
    print("down.")
    return 0


def _run_link(args: argparse.Namespace) -> int:
    from cellplane_operator.localplane.cluster import ClusterState
    from cellplane_operator.localplane.netns import set_link

    state = _read_state(args.state)
    if "cluster_state" not in state:
        raise LocalPlaneError("the running plane has no cluster (start it with --cluster)")
    plan = ClusterState.read(Path(state["cluster_state"])).plan()
    set_link(plan, plan.node(args.region).hub_port, up=args.up)
    print(f"{args.region}: link {'restored' if args.up else 'cut'}")
    return 0


def _run_reload(args: argparse.Namespace) -> int:
    """The development loop on a running cluster: the image builds are layered (the
    dependencies before the sources), so after a change of Python only the last layers
    are built; each node imports the result (layers it has are not unpacked again), and
    the operator Deployments roll onto it."""
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from cellplane_operator.localplane.binaries import Binaries
    from cellplane_operator.localplane.cluster import ClusterState
    from cellplane_operator.localplane.clusterchart import NAMESPACE
    from cellplane_operator.localplane.images import build_images, import_images

    state = _read_state(args.state)
    if "cluster_state" not in state:
        raise LocalPlaneError("the running plane has no cluster (start it with --cluster)")
    cluster = ClusterState.read(Path(state["cluster_state"]))
    began = time.monotonic()
    images = build_images(say=lambda line: print(f"images: {line}", flush=True))
    sockets = [Path(cluster.run_dir) / region / "containerd" / "containerd.sock"
               for region in cluster.regions]
    ctr = shutil.which("ctr") or "ctr"
    # The pause image is each node's sandbox from its start; the others may have changed.
    with ThreadPoolExecutor(max_workers=len(sockets)) as pool:
        list(pool.map(lambda socket: import_images(
            socket, images[1:], ctr=ctr, say=lambda line: print(line, flush=True)), sockets))
    kubectl = [str(Binaries.discover().kubectl), f"--kubeconfig={cluster.kubeconfig}",
               "--namespace", NAMESPACE]
    # The routers run the same image. The cells' own Pods do not restart here: a database
    # restarts only when its operator deletes its Pod (OnDelete), at a moment it chooses.
    restarted: dict[str, list[str]] = {}
    for component in ("operator", "router"):
        restarted[component] = subprocess.run(
            [*kubectl, "get", "deployments", "-l", f"app.kubernetes.io/component={component}",
             "-o", "name"], capture_output=True, text=True, check=True).stdout.split()
    deployments = [d for found in restarted.values() for d in found]
    if deployments:
        subprocess.run([*kubectl, "rollout", "restart", *deployments], check=True)
        for deployment in deployments:
            subprocess.run([*kubectl, "rollout", "status", deployment, "--timeout=300s"],
                           check=True)
    print(f"reloaded in {time.monotonic() - began:.1f} s "
          f"({len(restarted['operator'])} operator and {len(restarted['router'])} router "
          "Deployment(s) restarted)", flush=True)
    return 0
