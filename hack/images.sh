#!/usr/bin/env bash
# Builds the local cluster's images where their inputs changed (the pause image from
# hack/pause, the operator image from ./Dockerfile with podman) into the cache's images/
# folder, and imports them into the containerd of each node named with --load:
#
#   bash hack/images.sh                                   # build only
#   bash hack/images.sh --load /run/.../containerd.sock   # and import, once per node
#
# As root (podman's store is /var/lib/containers), after bash hack/setup.sh. The work is
# operator/cellplane_operator/localplane/images.py's, which the cluster calls itself.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || { echo "images: run bash hack/setup.sh first" >&2; exit 2; }
exec "$root/.venv/bin/python" -m cellplane_operator.localplane.images "$@"
