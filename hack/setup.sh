#!/usr/bin/env bash
# Installs everything cellplane's tests and demo need on a fresh Debian machine,
# with progress output. Idempotent: a second run checks and does nothing.
#   - PostgreSQL 15 and iproute2 from Debian's packages, and what the local cluster's
#     nodes run on: containerd, runc, the CNI plugins, iptables, conntrack; and what
#     builds its images without a registry: debootstrap, podman (hack/images.sh)
#   - a virtualenv in .venv with cellplane and its test tools (pip)
#   - kube-apiserver, kubectl, etcd, helm, the node programs (kubelet,
#     kube-controller-manager, kube-scheduler, kube-proxy) and CoreDNS, built from
#     their Go modules (build-binaries.sh)
set -euo pipefail
trap 'echo "setup: failed at line $LINENO (exit $?)" >&2' ERR
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
source "$here/versions.env"
export GOTOOLCHAIN
say() { printf '[setup %(%H:%M:%S)T] %s\n' -1 "$*"; }
started=$SECONDS

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- Debian packages -------------------------------------------------------
# The local cluster's nodes: containerd (started by the project, no systemd here), runc,
# the bridge/host-local/portmap CNI plugins, kube-proxy's iptables and conntrack. Its
# images: podman builds the Dockerfile (chroot isolation, crun), debootstrap makes the
# Debian base that no registry serves here.
packages=("postgresql-$POSTGRES_MAJOR" iproute2 containerd runc containernetworking-plugins
          iptables conntrack debootstrap podman crun)
need_apt=()
for package in "${packages[@]}"; do
    # No `| grep -q` under pipefail: grep leaving early can fail the pipeline.
    [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)" == *"ok installed"* ]] \
        || need_apt+=("$package")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing Debian packages: ${need_apt[*]}"
    # The local control plane makes its own clusters; the package's default
    # cluster on port 5432 would only take memory.
    as_root mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.d/cellplane.conf >/dev/null
    # Another apt run (an unattended upgrade, a second setup) holds the lock for a while:
    # wait for it rather than fail.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
        --no-install-recommends "${need_apt[@]}"
    say "Debian packages installed in $((SECONDS - started)) s"
else
    say "Debian packages present: ${packages[*]}"
fi
command -v go >/dev/null || { echo "setup: the Go toolchain is required (go on PATH)" >&2; exit 1; }

# --- Python ------------------------------------------------------------------
venv="$root/.venv"
stamp="$venv/.cellplane-installed"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "Python environment up to date in .venv"
else
    say "creating the Python environment in .venv (pip install -e .[test])"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -e "$root[test]"
    echo "$want" > "$stamp"
fi

# --- Go-built binaries -------------------------------------------------------
bash "$here/build-binaries.sh"
say "setup finished in $((SECONDS - started)) s"
