#!/usr/bin/env bash
# The test command: sets up what is missing, checks types and layering, then runs
# every test (unit tests need no services; the integration fixtures start real
# etcd, kube-apiserver and PostgreSQL processes on loopback ports).
# Extra arguments go to pytest, e.g. `bash hack/test.sh -m "not integration"`.
set -euo pipefail
trap 'echo "test: failed at line $LINENO (exit $?)" >&2' ERR
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
bash "$here/setup.sh"
cd "$root"
say() { printf '[test %(%H:%M:%S)T] %s\n' -1 "$*"; }
say "mypy --strict"
.venv/bin/mypy
say "import layering (lint-imports)"
.venv/bin/lint-imports
say "pytest"
# Every test, the local cluster's too (marker `cluster`, docs/cluster.md: root, network
# namespaces and cgroups; about five minutes on a warm cache). `-m "not cluster"` leaves
# them out.
exec .venv/bin/pytest "$@"
