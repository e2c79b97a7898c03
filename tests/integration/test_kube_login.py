"""Logging in as kubectl does, against the real kube-apiserver (issue #23): an exec
credential plugin (a small script) with a service account's token or a client
certificate, a plugin that fails, a token file rotated while the client runs, and a
Pod's in-cluster service-account mount."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellplane_operator.errors import KubeApiError
from cellplane_operator.kube import CELLS, NAMESPACES, SECRETS, KubeClient, KubeConfig, LoginError
from cellplane_operator.localplane import LocalControlPlane

NAMESPACE = "login"
ACCOUNT = "reader"


def kubectl(kube: LocalControlPlane, *argv: str) -> str:
    done = subprocess.run([str(kube.binaries.kubectl), "--kubeconfig", str(kube.kubeconfig),
                           *argv], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def account(kube: LocalControlPlane) -> str:
    """A service account allowed everything; its namespace."""
    kubectl(kube, "create", "namespace", NAMESPACE)
    kubectl(kube, "-n", NAMESPACE, "create", "serviceaccount", ACCOUNT)
    kubectl(kube, "create", "clusterrolebinding", f"{NAMESPACE}-{ACCOUNT}",
            "--clusterrole=cluster-admin", f"--serviceaccount={NAMESPACE}:{ACCOUNT}")
    return NAMESPACE


def token(kube: LocalControlPlane, bound_secret: str | None = None) -> str:
    """A TokenRequest token of the service account; bound to a Secret, it stops working
    when that Secret is deleted."""
    bound = ["--bound-object-kind=Secret", f"--bound-object-name={bound_secret}"] \
        if bound_secret else []
    return kubectl(kube, "-n", NAMESPACE, "create", "token", ACCOUNT, "--duration=1h", *bound)


def kubeconfig(kube: LocalControlPlane, path: Path, user: dict[str, Any]) -> Path:
    assert kube.apiserver is not None and kube.apiserver.pki is not None
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "plugin",
        "clusters": [{"name": "local", "cluster": {
            "server": kube.apiserver.url,
            "certificate-authority": str(kube.apiserver.pki.ca_cert)}}],
        "users": [{"name": "plugin-user", "user": user}],
        "contexts": [{"name": "plugin", "context": {"cluster": "local", "user": "plugin-user"}}],
    }))
    return path


def plugin(path: Path, body: str) -> Path:
    """An executable credential plugin: python running ``body`` (with json, os, sys)."""
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def exec_user(command: Path, *args: str) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(command),
                     "args": list(args), "interactiveMode": "Never",
                     "provideClusterInfo": True}}


# Each credential the plugin prints comes from a file the test writes, in turn; every
# run is counted in ``runs``, with the cluster it was told of.
TOKENS_PLUGIN = """
    state = sys.argv[1]
    runs = sorted(p for p in os.listdir(state) if p.startswith("run-"))
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    open(os.path.join(state, f"run-{len(runs):03d}"), "w").write(json.dumps(info))
    tokens = open(os.path.join(state, "tokens")).read().split()
    print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                      "status": {"token": tokens[min(len(runs), len(tokens) - 1)]}}))
"""


def runs(state: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(state.glob("run-*"))]


async def test_an_exec_plugin_logs_in_with_a_token_and_runs_again_after_a_401(
        kube: LocalControlPlane, account: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "tokens").write_text(f"not-a-valid-token {token(kube)}")
    script = plugin(tmp_path / "auth-plugin", TOKENS_PLUGIN)
    config = KubeConfig.from_file(kubeconfig(kube, tmp_path / "kubeconfig",
                                             exec_user(script, str(state))))
    client = KubeClient(config, user_agent="cellplane-test")
    try:
        names = {n["metadata"]["name"] for n in await client.list(NAMESPACES)}
        assert account in names
        assert await client.list(CELLS) is not None
    finally:
        await client.close()
    told = runs(state)
    assert len(told) == 2  # the refused token, then the good one, kept since
    assert told[0]["spec"]["interactive"] is False
    assert told[0]["spec"]["cluster"]["server"] == config.server


async def test_an_exec_plugin_logs_in_with_a_client_certificate(
        kube: LocalControlPlane, tmp_path: Path) -> None:
    assert kube.apiserver is not None and kube.apiserver.pki is not None
    pki = kube.apiserver.pki
    script = plugin(tmp_path / "cert-plugin", f"""
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1",
                          "kind": "ExecCredential", "status": {{
                              "clientCertificateData": open({str(pki.admin_cert)!r}).read(),
                              "clientKeyData": open({str(pki.admin_key)!r}).read(),
                              "expirationTimestamp": "2099-01-01T00:00:00Z"}}}}))
    """)
    config = KubeConfig.from_file(kubeconfig(kube, tmp_path / "kubeconfig", exec_user(script)))
    client = KubeClient(config)
    try:
        assert "default" in {n["metadata"]["name"] for n in await client.list(NAMESPACES)}
    finally:
        await client.close()


async def test_a_plugin_that_fails_is_a_clear_error(kube: LocalControlPlane,
                                                    tmp_path: Path) -> None:
    script = plugin(tmp_path / "failing-plugin", """
        print("refreshing the SSO session...", file=sys.stderr)
        print("error: the SSO session has expired; run: aws sso login", file=sys.stderr)
        sys.exit(3)
    """)
    config = KubeConfig.from_file(kubeconfig(kube, tmp_path / "kubeconfig", exec_user(script)))
    client = KubeClient(config)
    try:
        with pytest.raises(LoginError) as failed:
            await client.list(NAMESPACES)
    finally:
        await client.close()
    said = str(failed.value)
    assert "user 'plugin-user'" in said and "exited with status 3" in said
    assert said.endswith("run: aws sso login"), said
    missing = KubeConfig.from_file(kubeconfig(kube, tmp_path / "kubeconfig",
                                              exec_user(tmp_path / "nowhere")))
    client = KubeClient(missing)
    try:
        with pytest.raises(LoginError, match="exec plugin '.*nowhere': no such executable"):
            await client.list(NAMESPACES)
    finally:
        await client.close()


async def test_a_token_file_rotated_while_the_client_runs_is_used(
        kube: LocalControlPlane, account: str, tmp_path: Path) -> None:
    admin = KubeClient(KubeConfig.from_file(kube.kubeconfig))
    try:
        for name in ("rotation-1", "rotation-2"):
            await admin.create(SECRETS, {"metadata": {"name": name}}, namespace=account)
        path = tmp_path / "token"
        path.write_text(token(kube, bound_secret="rotation-1") + "\n")
        client = KubeClient(KubeConfig.from_file(kubeconfig(kube, tmp_path / "kubeconfig",
                                                            {"tokenFile": str(path)})))
        try:
            assert await client.get(SECRETS, "rotation-2", namespace=account) is not None
            # The kubelet writes the next token; the first stops working (its Secret goes).
            first = path.read_text().strip()
            path.write_text(token(kube, bound_secret="rotation-2") + "\n")
            assert await admin.delete(SECRETS, "rotation-1", namespace=account)
            await refused(kube, first, tmp_path)
            assert await client.get(SECRETS, "rotation-2", namespace=account) is not None
        finally:
            await client.close()
    finally:
        await admin.close()


async def refused(kube: LocalControlPlane, stale: str, folder: Path, *,
                  seconds: float = 30) -> None:
    """Until the apiserver answers 401 to the token ``stale``."""
    config = KubeConfig.from_file(kubeconfig(kube, folder / "stale-kubeconfig",
                                             {"token": stale}))
    client = KubeClient(config)
    try:
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            try:
                await client.list(NAMESPACES)
            except KubeApiError as error:
                if error.status == 401:
                    return
                raise
            assert asyncio.get_running_loop().time() < deadline, "the old token still works"
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def test_in_cluster_login_reads_the_service_account_mount(
        kube: LocalControlPlane, account: str, tmp_path: Path) -> None:
    assert kube.apiserver is not None and kube.apiserver.pki is not None
    mount = tmp_path / "serviceaccount"
    mount.mkdir()
    shutil.copy(kube.apiserver.pki.ca_cert, mount / "ca.crt")
    (mount / "token").write_text(token(kube))
    (mount / "namespace").write_text(account)
    config = KubeConfig.in_cluster(mount, {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                           "KUBERNETES_SERVICE_PORT": str(kube.apiserver.port)})
    client = KubeClient(config)
    try:
        assert config.namespace == account
        assert account in {n["metadata"]["name"] for n in await client.list(NAMESPACES)}
    finally:
        await client.close()
