#!/usr/bin/env bash
# The main job: set up what is missing, then run the local demo: three regions (an etcd
# member, an operator, a router and the cells' sites each) under one kube-apiserver; sample
# Cells and Tenants of every plan; a load of jobs with a noisy tenant; a tenant moved; a
# region killed, taken over, brought back and fenced; the reconciliation report; and a
# summary table. Extra arguments go to `cellplane demo`: --short (CI), --keep (stay up for
# kubectl), --json (the summary as JSON on stdout), --stop, --driver kubernetes (the same
# story on the local multi-node cluster, as root); see `cellplane demo --help`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# setup.sh says what it installs; with --json its lines go to stderr, so stdout stays JSON.
bash "$here/setup.sh" >&2
exec "$(dirname "$here")/.venv/bin/cellplane" demo "$@"
