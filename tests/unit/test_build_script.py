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



def _sourced(script_call: str, cache: Path) -> subprocess.CompletedProcess[str]:
    script = REPO / "hack" / "build-binaries.sh"
    return subprocess.run(
        ["bash", "-c", f'source "{script}"; {script_call}'],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CELLPLANE_CACHE": str(cache)},
    )


def test_one_go_build_names_each_command_as_go_does(tmp_path: Path) -> None:
    # `go build -o DIR/` names a command after its path's last element, the one before a
    # major-version suffix for etcd's server; the script moves each file from that name.
    result = _sourced("exec_name k8s.io/kubernetes/cmd/kubelet; "
                      "exec_name go.etcd.io/etcd/server/v3", tmp_path)
    assert result.stdout.split() == ["kubelet", "server"]


def test_a_missing_node_program_is_not_up_to_date(tmp_path: Path) -> None:
    # The kube-apiserver and kubectl of an older setup are there at the pinned version;
    # the node programs built from the same module are not: the module is built again.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / ".kubernetes.version").write_text("v1.37.2\n")
    for program in ("kube-apiserver", "kubectl"):
        (bin_dir / program).write_text("")
        (bin_dir / program).chmod(0o755)
    every = 'up_to_date kubernetes v1.37.2 "${KUBERNETES_COMMANDS[@]}"'
    assert _sourced(every, tmp_path).returncode == 1
    assert _sourced("up_to_date kubernetes v1.37.2 kube-apiserver kubectl", tmp_path).returncode == 0
    assert _sourced("up_to_date kubernetes v1.37.3 kube-apiserver kubectl", tmp_path).returncode == 1
    result = _sourced('echo "${KUBERNETES_COMMANDS[@]}"', tmp_path)
    assert {"kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy",
            "kube-apiserver", "kubectl"} == set(result.stdout.split())
