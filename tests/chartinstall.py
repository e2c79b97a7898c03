"""charts/cellplane rendered by the pinned helm, applied to a test apiserver, and a
kubeconfig that authenticates as the chart's ServiceAccount.

``CELLPLANE_OPERATOR_IDENTITY=chart`` makes ``RegionPlane`` (tests/regionplane.py)
install the chart on its control plane and start every operator with that
kubeconfig instead of the admin's, so any module's tests can be run as proof that
the chart's RBAC is enough. ``CELLPLANE_CHART_EVIDENCE=<dir>`` also has the
operators' logs and the identity they ran as copied there, for a test that runs
such a module in a subprocess (tests/integration/test_helm_chart.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.apiserver import write_kubeconfig
from cellplane_operator.localplane.binaries import helm_binary

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "cellplane"
RELEASE = "cellplane"
NAMESPACE = "cellplane-system"
"""The release namespace: also the operator's default --namespace, so operators the
tests start without that flag use the namespace the chart's Role covers."""
SERVICE_ACCOUNT = "cellplane"
IDENTITY_ENV = "CELLPLANE_OPERATOR_IDENTITY"
EVIDENCE_ENV = "CELLPLANE_CHART_EVIDENCE"
FIELD_MANAGER = "cellplane-chart-test"

# An apiserver refusal as the operator logs it (kube/client.py: "<METHOD> <path>: 403
# Forbidden: ...") or as kopf does (APIForbiddenError, "Not enough permissions").
# Not a bare 403: a log line's timestamp has milliseconds (",403").
REFUSAL = re.compile(r": 403\b|Forbidden|forbidden:|Not enough permissions")
# The one 403 that is no RBAC matter: the cell-deletion guard's answer (reason
# Forbidden) to deleting a Cell that still counts tenants.
ADMISSION_DENIAL = "ValidatingAdmissionPolicy"


def chart_identity_requested() -> bool:
    return os.environ.get(IDENTITY_ENV, "") == "chart"


def render(values: Mapping[str, Any], *, include_crds: bool = True,
           namespace: str = NAMESPACE) -> str:
    """``helm template`` of the chart with ``values``; raises with helm's message on failure."""
    result = run_helm("template", RELEASE, str(CHART), "--namespace", namespace,
                      *(["--include-crds"] if include_crds else []), "--values", "-",
                      input_text=yaml.safe_dump(dict(values)))
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr.strip()}")
    return result.stdout


def documents(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def run_helm(*args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    # HELM_* homes in a throwaway place: rendering needs no repositories or plugins,
    # and the user's own helm configuration must not change what is rendered.
    with tempfile.TemporaryDirectory(prefix="cellplane-helm-") as home:
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache",
               "HELM_CONFIG_HOME": f"{home}/config", "HELM_DATA_HOME": f"{home}/data"}
        return subprocess.run([str(helm_binary()), *args], input=input_text,
                              capture_output=True, text=True, timeout=120, check=False, env=env)


def values_for(kube: LocalControlPlane, regions: Sequence[str]) -> dict[str, Any]:
    """Values for this control plane: its regions and its etcd members."""
    return {"regions": [{"name": region} for region in regions],
            "etcd": {"endpoints": list(kube.etcd.endpoints)}}


def install(kube: LocalControlPlane, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Renders the chart and applies it for real (server-side apply, not a dry run) the
    way ``helm install --create-namespace`` does: the namespace first, then each CRD of
    crds/ only if it is absent (Helm never changes an existing CRD), then the templates.
    Returns every rendered document, CRDs included."""
    rendered = documents(render(values))
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    crds = [doc for doc in rendered if doc["kind"] == "CustomResourceDefinition"]
    templates = [doc for doc in rendered if doc["kind"] != "CustomResourceDefinition"]
    for crd in crds:
        if kube.kubectl("get", "crd", crd["metadata"]["name"], check=False).returncode != 0:
            kube.kubectl("create", "-f", "-", input_text=json.dumps(crd))
            kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                         "crd", crd["metadata"]["name"])
    # The control plane server-side applied the same admission policy at start (a
    # byte-identical copy: tests/unit/test_chart.py); its matchConstraints is an atomic
    # field, which a second manager may only take over, not share.
    kube.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                 "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                   "items": templates}))
    return rendered


def service_account_token(kube: LocalControlPlane, *, duration: str = "2h") -> str:
    """A token for the chart's ServiceAccount from the TokenRequest API."""
    return kube.kubectl("create", "token", SERVICE_ACCOUNT, "--namespace", NAMESPACE,
                        f"--duration={duration}").stdout.strip()


def service_account_kubeconfig(kube: LocalControlPlane, path: Path) -> Path:
    """A kubeconfig holding only the apiserver's CA and the ServiceAccount's token."""
    assert kube.apiserver is not None and kube.apiserver.pki is not None
    return write_kubeconfig(path, server=kube.apiserver.url, ca_cert=kube.apiserver.pki.ca_cert,
                            token=service_account_token(kube), user=SERVICE_ACCOUNT,
                            namespace=NAMESPACE)


_installed: dict[Path, Path] = {}


def operator_kubeconfig(kube: LocalControlPlane, regions: Sequence[str]) -> Path:
    """The chart installed once per control plane; the ServiceAccount's kubeconfig."""
    if (known := _installed.get(kube.run_dir)) is None:
        install(kube, values_for(kube, regions))
        known = service_account_kubeconfig(kube, kube.run_dir / "chart-operator.kubeconfig")
        _installed[kube.run_dir] = known
    return known


def whoami(kube: LocalControlPlane, kubeconfig: Path) -> str:
    """The username the apiserver sees for ``kubeconfig`` (a SelfSubjectReview)."""
    result = subprocess.run([str(kube.binaries.kubectl), f"--kubeconfig={kubeconfig}", "auth",
                             "whoami", "-o", "json"],
                            capture_output=True, text=True, timeout=60, check=True)
    return str(json.loads(result.stdout)["status"]["userInfo"]["username"])


def refusals(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines()
            if REFUSAL.search(line) and ADMISSION_DENIAL not in line]


def check_operator_logs(kube: LocalControlPlane, logs: Iterable[Path]) -> None:
    """After operators ran as the chart's ServiceAccount: no request of theirs was
    refused; with ``CELLPLANE_CHART_EVIDENCE``, the logs and identity are copied there."""
    logs = [log for log in logs if log.exists()]
    evidence = os.environ.get(EVIDENCE_ENV)
    if evidence:
        directory = Path(evidence)
        directory.mkdir(parents=True, exist_ok=True)
        kubeconfig = _installed.get(kube.run_dir)
        if kubeconfig is not None:
            (directory / "identity.txt").write_text(whoami(kube, kubeconfig) + "\n")
        for log in logs:
            shutil.copy(log, directory / f"{kube.run_dir.name}-{log.name}")
    refused = {log.name: found for log in logs if (found := refusals(log))}
    assert not refused, "the chart's RBAC refused operator requests: " + "; ".join(
        f"{name}: {len(lines)} line(s), first {lines[0]}" for name, lines in refused.items())
