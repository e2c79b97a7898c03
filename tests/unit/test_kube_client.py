"""The Kubernetes client's addressing and kubeconfig reading, without an apiserver."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from cellplane_operator.errors import KubeConfigError
from cellplane_operator.kube import CELLS, SECRETS, TENANTS, KubeConfig


def test_paths_of_cluster_scoped_namespaced_and_core_resources() -> None:
    assert CELLS.path(name="c1", subresource="status") == "/apis/cellplane.io/v1alpha1/cells/c1/status"
    assert TENANTS.path("team-a", "acme") == "/apis/cellplane.io/v1alpha1/namespaces/team-a/tenants/acme"
    assert TENANTS.path(all_namespaces=True) == "/apis/cellplane.io/v1alpha1/tenants"
    assert SECRETS.path("team-a") == "/api/v1/namespaces/team-a/secrets"
    with pytest.raises(ValueError, match="namespaced"):
        TENANTS.path(name="acme")


def test_kubeconfig_current_context_with_files_relative_to_it_and_inline_data(tmp_path: Path) -> None:
    document = {
        "current-context": "local",
        "contexts": [{"name": "other", "context": {"cluster": "x", "user": "x"}},
                     {"name": "local", "context": {"cluster": "c", "user": "u", "namespace": "ops"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/",
                                               "certificate-authority": "pki/ca.crt"}}],
        "users": [{"name": "u", "user": {"client-certificate-data": base64.b64encode(b"CERT").decode(),
                                         "client-key": "/abs/key.pem", "token": "t0ken"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(document))
    config = KubeConfig.from_file(path)
    assert config.server == "https://127.0.0.1:6443"
    assert config.ca_file == tmp_path / "pki" / "ca.crt"
    assert (config.client_cert, config.client_cert_data) == (None, b"CERT")
    assert (config.client_key, config.client_key_data) == (Path("/abs/key.pem"), None)
    assert (config.namespace, config.bearer_token()) == ("ops", "t0ken")


def test_a_kubeconfig_without_its_current_context_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"current-context": "gone", "contexts": []}))
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        KubeConfig.from_file(path)
