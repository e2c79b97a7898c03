#!/usr/bin/env bash
# Builds the operator image from ./Dockerfile without a Docker engine and proves it runs a
# tenant: hack/images.sh builds it with podman (chroot isolation, so no daemon and no user
# namespaces; the same build the local cluster's nodes import), then
# the image's own `cellplane operator`, run from the image's filesystem as the image's
# user, places a Tenant in a Cell against a local kube-apiserver and etcd
# (`cellplane local up`), with the cell's Postgres, API and workers the image's programs.
#
#   bash hack/check-image.sh        # as root; after bash hack/setup.sh
#
# Where no registry serves debian:bookworm-slim, a Debian 12 root built by debootstrap is
# imported under that name first (said when it happens). Not part of hack/test.sh: it runs
# the image's operator chrooted, beside the tests' own; the local cluster's tests run the
# same image as a Pod.
set -euo pipefail
trap 'echo "check-image: failed at line $LINENO (exit $?)" >&2' ERR
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
say() { printf '[check-image %(%H:%M:%S)T] %s\n' -1 "$*"; }
[ "$(id -u)" = 0 ] || { echo "check-image: run as root (podman builds into /var/lib/containers)" >&2; exit 2; }
[ -x "$root/.venv/bin/cellplane" ] || { echo "check-image: run bash hack/setup.sh first" >&2; exit 2; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
image="localhost/cellplane-operator:$version"
python="$root/.venv/bin/python"
# The pinned kubectl, where the launcher finds it ($CELLPLANE_BIN_DIR or the setup's cache).
kubectl="$("$python" -c 'from cellplane_operator.localplane.binaries import built_bin_dir
print(built_bin_dir() / "kubectl")')"
work="$(mktemp -d /tmp/cellplane-image-XXXXXX)"
started=$SECONDS
container="" plane_pid="" operator_pid=""
cleanup() {
    status=$?
    set +e
    [ -n "$container" ] && cleanup_container
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

command -v podman >/dev/null || { echo "check-image: podman is missing: run bash hack/setup.sh" >&2; exit 2; }

# --- the build (skipped when nothing it is built from changed) -----------------
bash "$here/images.sh" >"$work/images.log" 2>&1 || { cat "$work/images.log" >&2; exit 1; }
podman image exists "$image" || { echo "check-image: $image is not in podman's store" >&2; exit 1; }
say "built: $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"

# --- a tenant through the image's operator ------------------------------------
container="$(podman create "$image")"
rootfs="$(podman mount "$container")"
mounted=""
uid="$(podman image inspect --format '{{.Config.User}}' "$image")"
# A command in the image, as its user, with its PATH and nothing of this shell's environment.
# An array, not a function: `"${as_image[@]}" ... &` then forks chroot itself, which execs
# env, which execs the command, so $! is the operator's own PID.
as_image=(chroot --userspec="$uid" "$rootfs" /usr/bin/env -i HOME=/home/cellplane
          PATH=/opt/cellplane/bin:/usr/bin:/bin KUBECONFIG=/tmp/kubeconfig)
in_image_root() {  # PIDs of the processes chrooted into the image's filesystem
    local proc
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/root" 2>/dev/null)" = "$rootfs" ] && printf '%s ' "${proc#/proc/}"
    done
    true
}
cleanup_container() {
    if [ -n "$operator_pid" ]; then kill "$operator_pid" 2>/dev/null; wait "$operator_pid" 2>/dev/null; fi
    [ -n "$mounted" ] && "${as_image[@]}" cellplane sites stop --state-dir /var/lib/cellplane/sites >/dev/null 2>&1
    if [ -n "$plane_pid" ]; then kill -INT "$plane_pid" 2>/dev/null; wait "$plane_pid" 2>/dev/null; fi
    local left
    left="$(in_image_root)"
    if [ -n "$left" ]; then
        echo "check-image: processes left in the image's root, killed: $left" >&2
        kill -9 $left 2>/dev/null
        status=1
    fi
    [ -n "$mounted" ] && umount -R "$rootfs/dev" "$rootfs/proc" 2>/dev/null
    podman umount "$container" >/dev/null; podman rm "$container" >/dev/null
}
mount --rbind /dev "$rootfs/dev"
mount -t proc proc "$rootfs/proc"
mounted=yes

say "cellplane local up --regions region-a (etcd and kube-apiserver on loopback)"
"$root/.venv/bin/cellplane" local up --regions region-a --state "$work/state.json" \
    >"$work/local-up.log" 2>&1 &
plane_pid=$!
for _ in $(seq 120); do [ -s "$work/state.json" ] && break; sleep 0.5; done
[ -s "$work/state.json" ] || { cat "$work/local-up.log" >&2; exit 1; }
read -r kubeconfig etcd < <("$python" -c 'import json, sys; s = json.load(open(sys.argv[1]))
print(s["kube_apiserver"]["kubeconfig"], ",".join(m["endpoint"] for m in s["etcd"].values()))' \
    "$work/state.json")
kube() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
kube config view --raw --flatten --minify >"$rootfs/tmp/kubeconfig"
chown "$uid" "$rootfs/tmp/kubeconfig"
kube create namespace cellplane-system >/dev/null

say "the image's operator, as uid $uid: cellplane operator --region region-a --etcd $etcd"
"${as_image[@]}" cellplane operator --region region-a --regions region-a --etcd "$etcd" \
    --namespace cellplane-system --state-dir /var/lib/cellplane/sites >"$work/operator.log" 2>&1 &
operator_pid=$!
kube apply -f - >/dev/null <<'EOF'
apiVersion: cellplane.io/v1alpha1
kind: Cell
metadata: {name: image-a1}
spec: {region: region-a, tier: shared, capacity: {tenants: 5, workerSlots: 10}}
---
apiVersion: v1
kind: Namespace
metadata: {name: image-check}
---
apiVersion: cellplane.io/v1alpha1
kind: Tenant
metadata: {name: acme, namespace: image-check}
spec: {plan: pro, homeRegion: region-a}
EOF
if ! kube wait --for=condition=Ready tenant/acme -n image-check --timeout=300s >/dev/null; then
    kube describe cell image-a1 >&2; kube describe tenant acme -n image-check >&2
    tail -40 "$work/operator.log" >&2
    exit 1
fi
cell="$(kube get tenant acme -n image-check -o jsonpath='{.status.cell}')"
# Postmasters of the image's sites (a backend retitles itself "postgres: ...").
postmasters="$(ps -e -o uid=,ppid=,args= | awk -v uid="${uid%%:*}" '$1 == uid && $3 ~ /bin\/postgres$/ \
    && / -D \/var\/lib\/cellplane\/sites\//' | wc -l)"
say "tenant acme Ready in cell $cell; $postmasters Postgres server(s) of the image running as uid $uid"
[ "$cell" = image-a1 ] && [ "$postmasters" -ge 1 ]
say "the image works: built and checked in $((SECONDS - started)) s"
