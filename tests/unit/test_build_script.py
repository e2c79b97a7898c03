"""The replace directives of the wrapper modules are derived from the upstream go.mod."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

GO_MOD = """\
module k8s.io/kubernetes

go 1.26.0

require (
	k8s.io/api v0.0.0
	k8s.io/client-go v0.0.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	github.com/some/fork => github.com/other/fork v1.2.3
)

replace go.etcd.io/etcd/api/v3 => ../api
replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
"""


def test_local_replaces_become_published_versions(tmp_path: Path) -> None:
    gomod = tmp_path / "go.mod"
    gomod.write_text(GO_MOD)
    script = REPO / "hack" / "build-binaries.sh"
    result = subprocess.run(
        ["bash", "-c", f'source "{script}"; replaces_for "{gomod}" v0.37.2'],
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.split() == [
        "-replace=k8s.io/api=k8s.io/api@v0.37.2",
        "-replace=k8s.io/client-go=k8s.io/client-go@v0.37.2",
        "-replace=go.etcd.io/etcd/api/v3=go.etcd.io/etcd/api/v3@v0.37.2",
    ]


def test_helm_is_told_the_kubernetes_minor_of_the_client_it_is_built_with(tmp_path: Path) -> None:
    # helm's default Kubernetes version (Capabilities.KubeVersion in `helm template`)
    # comes from ldflags; build-binaries.sh reads it from helm's own go.mod.
    gomod = tmp_path / "go.mod"
    gomod.write_text("module helm.sh/helm/v3\n\nrequire (\n\tk8s.io/api v0.37.0\n"
                     "\tk8s.io/client-go v0.37.0\n\tk8s.io/client-go/extra v0.99.0\n)\n")
    script = REPO / "hack" / "build-binaries.sh"
    result = subprocess.run(
        ["bash", "-c", f'source "{script}"; client_go_minor "{gomod}"'],
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.strip() == "37"

