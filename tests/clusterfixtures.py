"""The local cluster for tests marked ``cluster``: started once per session, torn down
at its end, its logs printed when a test failed; plus what the tests run on it.

Test pods run the operator image (it has python3 and psql) built here by
localplane.images, never pulled: ``imagePullPolicy: Never``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellplane_operator.localplane.cluster import ClusterConfig, LocalCluster
from cellplane_operator.localplane.clusterchart import NAMESPACE, RELEASE
# Shared with the cluster demo and benchmark; the tests import them from here.
from cellplane_operator.localplane.clustercells import operator_image, status_of
from cellplane_operator.localplane.process import wait_for

# What the session's cluster cost, printed in pytest's summary (conftest).
MEASURED: dict[str, str] = {}


def start_session_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    from cellplane_operator.localplane.images import build_images

    images = build_images(say=lambda line: None)
    # No CRDs or admission policy of its own: the chart installs them (cluster_operators).
    cluster = LocalCluster(ClusterConfig(apply_crds=False), images=images)
    begun = time.monotonic()
    try:
        cluster.start()
    except BaseException:
        sys.stderr.write(cluster.dump_logs())
        raise
    MEASURED["start"] = (f"{time.monotonic() - begun:.1f} s ("
                         + ", ".join(f"{k} {v:.1f}" for k, v in cluster.timings.items()) + ")")
    memory = cluster.memory_bytes()
    if memory is not None:
        MEASURED["memory when Ready"] = f"{memory / 2**20:.0f} MiB"
    failures_before = request.session.testsfailed
    try:
        yield cluster
    finally:
        failed = request.session.testsfailed > failures_before
        if failed:
            sys.stderr.write(f"\n--- logs of the local cluster in {cluster.run_dir} ---\n")
            sys.stderr.write(cluster.dump_logs())
        cluster.stop(remove=not failed)


def install_session_operators(cluster: LocalCluster) -> dict[str, Any]:
    """charts/cellplane installed with helm on the session's cluster, its operator
    Deployments Available; the time it took goes to pytest's summary."""
    from cellplane_operator.localplane.clusterchart import install_operators

    begun = time.monotonic()
    try:
        values = install_operators(cluster)
    except BaseException:
        sys.stderr.write(cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
        raise
    MEASURED["chart installed, operators Ready"] = f"{time.monotonic() - begun:.1f} s"
    memory = cluster.memory_bytes()
    if memory is not None:
        MEASURED["memory with the operators"] = f"{memory / 2**20:.0f} MiB"
    return values


class Workloads:
    """Objects of one test namespace, applied and read with the cluster's kubectl."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.image = operator_image(cluster)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, timeout=timeout,
                                    input_text=input_text)

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        parsed = json.loads(self.kubectl("get", kind, name, "-o", "json").stdout)
        assert isinstance(parsed, dict)
        return parsed

    def container(self, name: str, command: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "image": self.image, "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
                **extra}

    def web_pod(self, name: str, region: str) -> dict[str, Any]:
        """A pod on ``region``'s node that answers HTTP on 8080 with its node's region."""
        serve = (f"mkdir -p /tmp/www && echo {region} > /tmp/www/index.html && "
                 "cd /tmp/www && exec python3 -u -m http.server 8080")
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web", "region": region}},
            "spec": {
                "nodeSelector": {"topology.kubernetes.io/region": region},
                "terminationGracePeriodSeconds": 1,
                "containers": [self.container("web", serve, ports=[{"containerPort": 8080}],
                                              readinessProbe={"tcpSocket": {"port": 8080},
                                                              "periodSeconds": 1})],
            },
        }

    def wait_ready(self, kind_name: str, *, timeout: float = 300) -> None:
        self.kubectl("wait", "--for=condition=Ready", f"--timeout={int(timeout)}s", kind_name,
                     timeout=timeout + 30)

    def exec_python(self, pod: str, code: str, *, check: bool = True,
                    timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.kubectl("exec", pod, "--", "python3", "-c", code, check=check,
                            timeout=timeout)

    def fetch(self, pod: str, url: str, *, check: bool = True,
              timeout: float = 10) -> subprocess.CompletedProcess[str]:
        """An HTTP GET of ``url`` from inside ``pod``; its body on stdout."""
        code = ("import sys, urllib.request; "
                f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout})"
                ".read().decode())")
        return self.exec_python(pod, code, check=check, timeout=timeout + 60)


def pod_ip(workloads: Workloads, pod: str) -> str:
    ip = workloads.get("pod", pod)["status"].get("podIP")
    assert ip, f"pod {pod} has no IP"
    return str(ip)


def eventually(condition: Any, *, timeout: float, what: str, interval: float = 0.5) -> None:
    wait_for(condition, timeout=timeout, interval=interval, what=what)


def processes_in_netns(netns_file: Path) -> list[int]:
    """PIDs whose network namespace is the one bound at ``netns_file``."""
    try:
        target = netns_file.stat().st_ino
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if (entry / "ns" / "net").stat().st_ino == target:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# -- the chart's operators, as the tests read and call them ------------------------------

def deployment(region: str) -> str:
    return f"{RELEASE}-{region}"


def operator_pods(cluster: LocalCluster, region: str) -> list[dict[str, Any]]:
    found = cluster.get_json("pods", "-n", NAMESPACE, "-l",
                             f"app.kubernetes.io/component=operator,cellplane.io/region={region}")
    return [pod for pod in found["items"] if not pod["metadata"].get("deletionTimestamp")]


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def await_phase(cluster: LocalCluster, kind: str, name: str, phase: str, *,
                namespace: str | None = None, timeout: float = 300) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.clear()
        seen.update(status_of(cluster, kind, name, namespace))
        return seen.get("phase") == phase

    try:
        eventually(reached, timeout=timeout, interval=1, what=f"{kind} {name} to be {phase}")
    except Exception as error:
        raise AssertionError(f"{kind} {name} never {phase}; last status {seen}\n"
                             + operator_logs(cluster)) from error
    return dict(seen)


def delete_cells_once_empty(cluster: LocalCluster, *names: str, timeout: float = 300) -> None:
    """Deletes cells whose tenants were just deleted. The deletion guard reads the cell's
    status.tenants, which the placement leader lowers a moment after the tenants go:
    the DELETE is sent once every cell says it is empty (or is gone)."""
    def empty() -> bool:
        return all(not status_of(cluster, "cell", name).get("tenants") for name in names)

    eventually(empty, timeout=timeout, interval=1, what=f"cells {', '.join(names)} to be empty")
    cluster.kubectl("delete", "cells", *names, "--ignore-not-found", "--wait=true",
                    f"--timeout={int(timeout)}s", timeout=timeout + 30)


def operator_logs(cluster: LocalCluster, lines: int = 60) -> str:
    return "\n".join(
        f"--- operator of {region} ---\n" + cluster.kubectl(
            "logs", "-n", NAMESPACE, f"deploy/{deployment(region)}", f"--tail={lines}",
            check=False, timeout=60).stdout for region in cluster.plan.regions)


def in_operator(cluster: LocalCluster, region: str, code: str, *, check: bool = True) -> str:
    """Python run inside the region's operator container (``kubectl exec``); with
    ``check`` false, what failed is answered as an empty string."""
    result = cluster.kubectl("exec", "-n", NAMESPACE, f"deploy/{deployment(region)}",
                             "-c", "operator", "--", "python3", "-c", code, timeout=120,
                             check=check)
    return result.stdout if result.returncode == 0 else ""


def http_in_operator(cluster: LocalCluster, region: str, method: str, url: str,
                     headers: dict[str, str], body: dict[str, Any] | None = None) -> Any:
    """One request from inside the operator's pod, where the cells' APIs listen."""
    code = (
        "import json, sys, urllib.request, urllib.error\n"
        f"request = urllib.request.Request({url!r}, method={method!r}, headers={headers!r},\n"
        f"    data=None if {body!r} is None else json.dumps({body!r}).encode())\n"
        "request.add_header('Content-Type', 'application/json')\n"
        "try:\n"
        "    answer = urllib.request.urlopen(request, timeout=30)\n"
        "    print(json.dumps([answer.status, json.loads(answer.read() or b'null')]))\n"
        "except urllib.error.HTTPError as error:\n"
        "    print(json.dumps([error.code, error.read().decode(errors='replace')]))\n"
        "except OSError as error:\n"
        "    print(json.dumps([0, str(error)]))\n")
    # Status 0: nothing answered (e.g. an address the status still names from the old pod).
    status, answer = json.loads(in_operator(cluster, region, code, check=False) or "[0, null]")
    return status, answer


def api_key(cluster: LocalCluster, namespace: str, secret: str) -> str:
    data = cluster.get_json("secret", secret, "-n", namespace)["data"]
    return base64.b64decode(data["api-key"]).decode()
