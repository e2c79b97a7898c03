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
# The local cluster's tests (marker `cluster`, docs/cluster.md) run only when asked:
# `bash hack/test.sh -m cluster`, or any selection of your own.
if [ "$#" -eq 0 ]; then set -- -m "not cluster"; fi
exec .venv/bin/pytest "$@"
