#!/usr/bin/env bash
# The main job: set up what is missing, then run the local demo (a 3-member etcd,
# a kube-apiserver with the CRDs, the operator, a sample Cell, `kubectl get cells`).
# Extra arguments go to `cellplane demo`, e.g. --keep to stay up.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/setup.sh"
exec "$(dirname "$here")/.venv/bin/cellplane" demo "$@"
