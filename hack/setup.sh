#!/usr/bin/env bash
# Installs everything cellplane's tests and demo need on a fresh Debian machine,
# with progress output. Idempotent: a second run checks and does nothing.
#   - PostgreSQL 15 and iproute2 from Debian's packages
#   - a virtualenv in .venv with cellplane and its test tools (pip)
#   - kube-apiserver, kubectl and etcd built from their Go modules (build-binaries.sh)
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
need_apt=()
# No `| grep -q` under pipefail: grep leaving early can fail the pipeline.
[[ "$(dpkg-query -W -f='${Status}' "postgresql-$POSTGRES_MAJOR" 2>/dev/null || true)" == *"ok installed"* ]] \
    || need_apt+=("postgresql-$POSTGRES_MAJOR")
command -v ip >/dev/null || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing Debian packages: ${need_apt[*]}"
    # The local control plane makes its own clusters; the package's default
    # cluster on port 5432 would only take memory.
    as_root mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.d/cellplane.conf >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
else
    say "Debian packages present: postgresql-$POSTGRES_MAJOR, iproute2"
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
