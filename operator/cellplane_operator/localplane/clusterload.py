"""Load for kubernetes-driver cells on the local cluster, from inside it: a job target and a
load generator, each a Pod of the operator image (python3, no other dependency) on a
region that is not lost, read by ``kubectl exec`` into the Pod itself (which works while
any other region is down). The cluster tests and ``benchmarks/cluster_failover.py`` use it.

The load generator submits jobs one after another through a router Service, each retried
under its own Idempotency-Key until it is acknowledged, and keeps what it saw: every
acknowledged key with its job and the time (the node's clock is the machine's), every
failed attempt, and how many attempts failed for each reason (status and body, or
error). The target answers every step 200 and keeps each call's idempotency key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from cellplane_operator.domain.reconciliation import ReconciliationReport

__all__ = ["TARGET_SERVER", "LOAD_GENERATOR", "python_pod", "PodServer", "ClusterLoad",
           "longest_pause", "POD_PORT", "site_sql", "reconciliation_report"]

POD_PORT = 8080

TARGET_SERVER = """
import json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
calls, lock = [], threading.Lock()
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        with lock:
            calls.append({'key': self.headers.get('Idempotency-Key'), 'body': json.loads(body)})
        self._answer(b'{"ok": true}')
    def do_GET(self):
        with lock:
            self._answer(json.dumps(calls).encode())
    def _answer(self, data):
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(('0.0.0.0', 8080), Handler).serve_forever()
"""

LOAD_GENERATOR = """
import json, os, threading, time, urllib.error, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
url, key, prefix = os.environ['ROUTER'] + '/v1/jobs', os.environ['KEY'], os.environ['PREFIX']
seen = {'acked': {}, 'ack_times': [], 'failed': [], 'errors': {}, 'running': True}
lock = threading.Lock()
def submit(idempotency):
    body = json.dumps({'target': 'default', 'payload': {'key': idempotency}}).encode()
    request = urllib.request.Request(url, data=body, method='POST', headers={
        'Authorization': 'Bearer ' + key, 'Idempotency-Key': idempotency,
        'Content-Type': 'application/json'})
    try:
        answer = urllib.request.urlopen(request, timeout=3)
        return json.loads(answer.read())['job_id'], None
    except urllib.error.HTTPError as error:
        return None, f'{error.code} {error.read()[:120].decode(errors="replace")}'
    except (OSError, ValueError) as error:
        return None, f'{type(error).__name__} {str(error)[:120]}'
def run():
    n = 0
    while seen['running']:
        n += 1
        idempotency = f'{prefix}-{n}'
        while seen['running']:
            job, error = submit(idempotency)
            with lock:
                if job is not None:
                    seen['acked'][idempotency] = job
                    seen['ack_times'].append(time.time())
                    break
                seen['failed'].append(idempotency)
                seen['errors'][error] = seen['errors'].get(error, 0) + 1
            time.sleep(0.2)
        time.sleep(0.1)
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == '/stop':
            seen['running'] = False
        with lock:
            data = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
threading.Thread(target=run, daemon=True).start()
ThreadingHTTPServer(('0.0.0.0', 8080), Handler).serve_forever()
"""

_READ = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
         "'http://127.0.0.1:{port}' + sys.argv[1], timeout=30).read().decode())")


class Kubectl(Protocol):
    """What of ``LocalCluster`` this module uses."""

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> Any: ...

    def apply(self, objects: Any) -> None: ...


def python_pod(image: str, name: str, namespace: str, region: str, script: str, *,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod running ``script`` with the image's python3 on ``region``'s node, answering HTTP
    on ``POD_PORT`` (Ready once it listens)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeSelector": {"topology.kubernetes.io/region": region},
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": name, "image": image, "imagePullPolicy": "Never",
                                 "command": ["python3", "-u", "-c", script],
                                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                                 "ports": [{"containerPort": POD_PORT}],
                                 "readinessProbe": {"tcpSocket": {"port": POD_PORT},
                                                    "periodSeconds": 1},
                                 "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}}]}}


class PodServer:
    """One of these Pods, applied and Ready; ``get`` reads it from inside itself."""

    def __init__(self, cluster: Kubectl, pod: dict[str, Any]) -> None:
        self.cluster = cluster
        self.name = str(pod["metadata"]["name"])
        self.namespace = str(pod["metadata"]["namespace"])
        cluster.apply([pod])
        cluster.kubectl("wait", "-n", self.namespace, "--for=condition=Ready", "--timeout=300s",
                        f"pod/{self.name}", timeout=330)

    def get(self, path: str = "/") -> Any:
        result = self.cluster.kubectl("exec", "-n", self.namespace, self.name, "--", "python3",
                                      "-c", _READ.format(port=POD_PORT), path, timeout=90)
        return json.loads(result.stdout)

    def delete(self) -> None:
        self.cluster.kubectl("delete", "pod", "-n", self.namespace, self.name, "--wait=false",
                             check=False)


class ClusterLoad(PodServer):
    """The load generator (``LOAD_GENERATOR``) sending through ``router`` as the tenant whose
    API key is ``key``; job keys are ``<prefix>-<n>``."""

    def __init__(self, cluster: Kubectl, *, image: str, namespace: str, region: str,
                 router: str, key: str, prefix: str) -> None:
        super().__init__(cluster, python_pod(image, f"load-{prefix}", namespace, region,
                                             LOAD_GENERATOR,
                                             env={"ROUTER": router, "KEY": key,
                                                  "PREFIX": prefix}))

    def acked(self) -> int:
        return len(self.get()["acked"])

    def stop(self) -> dict[str, Any]:
        """Stops sending; what it saw: ``acked`` {key: job id}, ``ack_times``, ``failed``,
        ``errors`` {reason: attempts}."""
        seen = dict(self.get("/stop"))
        self.delete()
        return seen


def longest_pause(ack_times: list[float], after: float) -> float:
    """The longest time without an acknowledgement from ``after`` on (inf: none came)."""
    times = [after, *sorted(t for t in ack_times if t > after)]
    return max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else float("inf")


def site_sql(cluster: Kubectl, namespace: str, cell: str, region: str, sql: str) -> str:
    """``sql`` on a kubernetes-driver site's Postgres, from inside its own Pod, as the
    superuser with its password over TCP (the Pod's pg_hba trusts nothing); the rows as
    ``psql -At`` prints them, or ``failed: <stderr>``."""
    result = cluster.kubectl(
        "exec", "-n", namespace, f"cell-{cell}-{region}-db-0", "-c", "database", "--", "sh",
        "-c", 'PGPASSWORD="$(cat /etc/cellplane/database/postgres)" /usr/lib/postgresql/15/bin/'
        f"psql -h 127.0.0.1 -U postgres -d cellplane -At -c {json.dumps(sql)}",
        check=False, timeout=60)
    return (str(result.stdout).strip() if result.returncode == 0
            else f"failed: {result.stderr}")


def reconciliation_report(kubeconfig: Path, cell: str, epoch: int) -> ReconciliationReport:
    """The loss report of ``cell``'s takeover at ``epoch``, as ``cellplane report`` reads it."""
    printed = subprocess.run(
        [sys.executable, "-m", "cellplane_operator", "report", cell, "--epoch", str(epoch),
         "--json", "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, check=True, timeout=120)
    return ReconciliationReport.from_json(printed.stdout)
