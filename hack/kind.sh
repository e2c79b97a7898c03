#!/usr/bin/env bash
# cellplane on kind, for a machine with Docker: what `cellplane local up --cluster` plus
# the chart's installer (docs/cluster.md) give on machines without it.
#
#   bash hack/kind.sh                  # create (or reuse) the cluster, install, apply the samples
#   bash hack/kind.sh --name NAME      # another cluster name (default cellplane, or $KIND_CLUSTER_NAME)
#   bash hack/kind.sh --delete         # delete the cluster
#
# Steps, each safe to run again on an existing cluster:
#   1. kind create cluster from deploy/kind/cluster.yaml (one control plane, one worker
#      per region, labelled as the local cluster's nodes); skipped if it exists;
#   2. docker build of the repository's Dockerfile as localhost/cellplane-operator:<version
#      of pyproject.toml> (the local cluster's name for it, the chart's appVersion), and
#      kind load docker-image of it onto every node (the chart pulls nothing: Never);
#   3. the ownership etcd, one member per region node (deploy/kind/ownership-etcd.yaml,
#      filled with each node's InternalIP), and a wait until every member is Ready;
#   4. helm upgrade --install of charts/cellplane with deploy/kind/values.yaml and
#      etcd.endpoints set to the members (a rollout restart of the operators when the
#      build gave the same tag a new image), and a wait until every operator
#      Deployment is Available;
#   5. kubectl apply of deploy/samples/ (Cells and Tenants) and a wait until the
#      Tenants are Ready.
#
# Needs docker (with its daemon running), kind (v0.33.0 or later, for the node image
# of deploy/kind/cluster.yaml), kubectl and helm 3 on PATH, and network: the node image
# and etcd's image are pulled, the operator image's build installs from Debian and PyPI.
# Not run by the project's CI: its machines have no Docker, and kind's privileged node
# containers fail there (README.md, "Running the chart on a real cluster").
# tests/unit/test_kind.py keeps this script, deploy/kind/ and the local cluster in step.
set -euo pipefail
trap 'echo "kind.sh: failed at line $LINENO (exit $?)" >&2' ERR
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=versions.env
source "$here/versions.env"

cluster_config="deploy/kind/cluster.yaml"
values_file="deploy/kind/values.yaml"
etcd_template="deploy/kind/ownership-etcd.yaml"
samples_dir="deploy/samples"
release="cellplane"
release_namespace="cellplane-system"
etcd_namespace="cellplane-etcd"
samples_namespace="cellplane-samples"
region_label="topology.kubernetes.io/region"
# The oldest kind whose release notes list the node image of deploy/kind/cluster.yaml.
oldest_kind="v0.33.0"

say() { printf '[kind.sh %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { echo "kind.sh: $*" >&2; exit 2; }

usage() {
    sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# The operator image, as built and as the chart names it (tag "" = appVersion).
operator_image() {
    local version
    version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -n 1)"
    [ -n "$version" ] || die "no version in pyproject.toml"
    echo "localhost/cellplane-operator:$version"
}

# etcd's own image at the version the local cluster's etcd is built from.
etcd_image() {
    echo "quay.io/coreos/etcd:$ETCD_VERSION"
}

# Every image `kind load docker-image` puts on the nodes (the etcd image is pulled by
# the nodes themselves; the local cluster's pause image is kind's own business).
loaded_images() {
    operator_image
}

require_tools() {
    local missing=() tool
    for tool in docker kind kubectl helm; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        die "needs docker, kind, kubectl and helm on PATH; missing: ${missing[*]}
  docker:  https://docs.docker.com/engine/install/
  kind:    https://kind.sigs.k8s.io/docs/user/quick-start/#installation ($oldest_kind or later)
  kubectl: https://kubernetes.io/docs/tasks/tools/
  helm:    https://helm.sh/docs/intro/install/ (helm 3)
On a machine without Docker use the local cluster instead: cellplane local up --cluster (docs/cluster.md)."
    fi
    docker info >/dev/null 2>&1 \
        || die "docker is installed but its daemon does not answer (docker info failed): start it, or check your permissions on its socket"
}

warn_old_kind() {
    local version
    version="$(kind version | awk '{print $2}')"
    if [ "$(printf '%s\n%s\n' "$oldest_kind" "$version" | sort -V | head -n 1)" != "$oldest_kind" ]; then
        say "warning: kind $version is older than $oldest_kind, whose node image $cluster_config pins; upgrade kind if the nodes do not start"
    fi
}

cluster_exists() {
    local clusters
    # Read whole before grep: grep -q leaving early would fail the pipe (pipefail).
    clusters="$(kind get clusters 2>/dev/null)"
    grep -qx -- "$1" <<<"$clusters"
}

# "<region> <InternalIP>" of every node with a region label, sorted by region (the
# order of the chart's regions); the callers take the first address of a line.
region_nodes() {
    local context="$1"
    kubectl --context "$context" get nodes -l "$region_label" -o jsonpath='{range .items[*]}{.metadata.labels.topology\.kubernetes\.io/region}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' \
        | sort -k 1,1
}

# Fills deploy/kind/ownership-etcd.yaml once per "<region> <ip>" line of stdin and
# prints the Namespace and every member's Deployment (kubectl apply -f - reads them).
# The '${NAME}' placeholders below are the template's literal text, never expanded.
# shellcheck disable=SC2016
render_ownership_etcd() {
    local cluster="$1" template lines=() line region ip members="" text
    # Without the file's own comment lines, which name the placeholders.
    template="$(grep -v '^#' "$root/$etcd_template")"
    while read -r line || [ -n "$line" ]; do
        [ -n "$line" ] && lines+=("$line")
    done
    [ "${#lines[@]}" -gt 0 ] || die "no node carries the $region_label label"
    for line in "${lines[@]}"; do
        read -r region ip _ <<<"$line"
        [ -n "$ip" ] || die "node of $region has no InternalIP"
        members+="${members:+,}$region=http://$ip:2380"
    done
    printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n' "$etcd_namespace"
    for line in "${lines[@]}"; do
        read -r region ip _ <<<"$line"
        text="$template"
        text="${text//'${NAMESPACE}'/"$etcd_namespace"}"
        text="${text//'${REGION}'/"$region"}"
        text="${text//'${NODE_IP}'/"$ip"}"
        text="${text//'${INITIAL_CLUSTER}'/"$members"}"
        text="${text//'${CLUSTER_TOKEN}'/"$cluster-ownership"}"
        text="${text//'${ETCD_IMAGE}'/"$(etcd_image)"}"
        printf -- '---\n%s\n' "$text"
    done
}

# "{ip1:2379,ip2:2379,...}", helm's --set list, from "<region> <ip>" lines of stdin.
etcd_endpoints() {
    local region ip endpoints=""
    while read -r region ip _ || [ -n "${region:-}" ]; do
        [ -n "$ip" ] && endpoints+="${endpoints:+,}$ip:2379"
    done
    echo "{$endpoints}"
}

main() {
    local cluster="${KIND_CLUSTER_NAME:-cellplane}" delete=false
    while [ $# -gt 0 ]; do
        case "$1" in
            --delete) delete=true ;;
            --name) [ $# -ge 2 ] || die "--name needs a value"; cluster="$2"; shift ;;
            --name=*) cluster="${1#--name=}" ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
        shift
    done
    cd "$root"
    local context="kind-$cluster"

    if "$delete"; then
        command -v kind >/dev/null 2>&1 || die "needs kind on PATH"
        say "deleting kind cluster $cluster"
        kind delete cluster --name "$cluster"
        exit 0
    fi

    require_tools
    warn_old_kind
    if cluster_exists "$cluster"; then
        say "kind cluster $cluster exists: reusing it"
    else
        say "creating kind cluster $cluster from $cluster_config"
        kind create cluster --name "$cluster" --config "$cluster_config" --wait 5m
    fi

    local image built_before built
    image="$(operator_image)"
    built_before="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    say "building $image from ./Dockerfile"
    docker build -t "$image" .
    built="$(docker image inspect -f '{{.Id}}' "$image")"
    say "loading $(loaded_images | tr '\n' ' ')onto the nodes of $cluster"
    # shellcheck disable=SC2046  # one argument per image, none with spaces
    kind load docker-image --name "$cluster" $(loaded_images)

    local nodes
    nodes="$(region_nodes "$context")"
    say "ownership etcd ($(etcd_image)), one member per region node:"
    printf '    %s\n' "${nodes//$'\n'/$'\n'    }"
    render_ownership_etcd "$cluster" <<<"$nodes" | kubectl --context "$context" apply -f -
    kubectl --context "$context" -n "$etcd_namespace" wait --for=condition=Available \
        deployment -l app.kubernetes.io/name=ownership-etcd --timeout=300s

    local endpoints
    endpoints="$(etcd_endpoints <<<"$nodes")"
    say "helm upgrade --install $release (etcd.endpoints=$endpoints)"
    # upgrade --install: the same install on a first run, an upgrade on the next.
    helm --kube-context "$context" upgrade --install "$release" charts/cellplane \
        -n "$release_namespace" --create-namespace -f "$values_file" \
        --set "etcd.endpoints=$endpoints"
    if [ -n "$built_before" ] && [ "$built_before" != "$built" ]; then
        # Same tag, new image: the pods (pullPolicy Never) run the old one until restarted.
        say "the operator image changed: restarting the operators"
        kubectl --context "$context" -n "$release_namespace" rollout restart deployment \
            -l app.kubernetes.io/component=operator
    fi
    # rollout status: on a re-run the new pods, not the old ones, must be up.
    kubectl --context "$context" -n "$release_namespace" rollout status deployment \
        -l app.kubernetes.io/component=operator --timeout=600s
    kubectl --context "$context" -n "$release_namespace" wait --for=condition=Available \
        deployment -l app.kubernetes.io/component=operator --timeout=600s

    say "applying $samples_dir/"
    kubectl --context "$context" apply -f "$samples_dir/"
    kubectl --context "$context" -n "$samples_namespace" wait --for=condition=Ready \
        tenant --all --timeout=600s
    kubectl --context "$context" get nodes -L "$region_label"
    kubectl --context "$context" get cells,tenants -A
    say "done: kubectl --context $context ...; bash hack/kind.sh --delete removes it"
}

# Sourcing the script (as its unit test does) defines the functions only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
