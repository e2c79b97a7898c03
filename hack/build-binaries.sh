#!/usr/bin/env bash
# Builds from their Go modules, at the versions pinned in hack/versions.env, into a
# cache outside the repository:
#   - kube-apiserver and kubectl (the local control plane and the tests), and the node
#     programs of the local cluster: kubelet, kube-controller-manager, kube-scheduler,
#     kube-proxy, all from k8s.io/kubernetes in one `go build`
#   - etcd, helm, and CoreDNS (the local cluster's DNS)
# Idempotent: a binary already built for its pinned version is left alone.
set -euo pipefail
trap 'echo "build-binaries: failed at line $LINENO (exit $?)" >&2' ERR
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
export GOTOOLCHAIN CGO_ENABLED=0 GOFLAGS="-buildvcs=false"
cache="${CELLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cellplane}"
bin="$cache/bin"
mkdir -p "$bin"

say() { printf '[build-binaries %(%H:%M:%S)T] %s\n' -1 "$*"; }

# Turns every "X => ./staging/..." or "X => ../..." replace directive of a
# module's go.mod into "-replace=X=X@<version>", so the wrapper module pulls the
# published copy of each staging module at the matching version.
replaces_for() {
    local gomod="$1" version="$2"
    awk -v v="$version" '
        /^replace[ \t]*\(/ { inblock=1; next }
        inblock && /^\)/   { inblock=0; next }
        {
            line=$0; sub(/^replace[ \t]+/, "", line)
            if ((inblock || $1=="replace") && line ~ /=>[ \t]*\.\.?\//) {
                split(line, parts, /[ \t]*=>[ \t]*/); gsub(/[ \t]/, "", parts[1])
                if (parts[2] !~ /FORBIDDEN/) print "-replace=" parts[1] "=" parts[1] "@" v
            }
        }' "$gomod"
}

build_from_module() {
    # Remaining arguments: OUTPUT=PACKAGE pairs, e.g. etcd=go.etcd.io/etcd/server/v3
    local name="$1" module="$2" version="$3" staging_version="$4" ldflags="$5"; shift 5
    local targets=("$@") packages=() target
    for target in "${targets[@]}"; do packages+=("${target#*=}"); done
    local work="$cache/src/$name-$version"
    mkdir -p "$work"
    cd "$work"
    if [ ! -f .prepared ]; then
        say "$name: preparing wrapper module for $module@$version"
        rm -f go.mod go.sum
        go mod init "cellplane.local/build/$name" >/dev/null 2>&1
        local gomod
        gomod="$(go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
        mapfile -t edits < <(replaces_for "$gomod" "$staging_version")
        say "$name: ${#edits[@]} replace directives derived from $module's go.mod"
        go mod edit "${edits[@]}"
        go mod edit -require="$module@$version"
        touch .prepared
    fi
    say "$name: resolving dependencies (go get)"
    go get "${packages[@]/%/@$version}"
    # One `go build` of every command: the packages they share are compiled once, and
    # in parallel. Each lands in a staging directory under the name go gives it, and is
    # moved to its own name only once all are built. The directory is this run's own, so
    # two setups at once (a test run and a developer's) do not take each other's files.
    local staging
    staging="$(mktemp -d "$work/out.XXXXXX")"
    say "$name: go build ${packages[*]} -> $bin"
    go build -trimpath -ldflags "$ldflags" -o "$staging/" "${packages[@]}"
    for target in "${targets[@]}"; do
        mv "$staging/$(exec_name "${target#*=}")" "$bin/${target%%=*}"
    done
    rmdir "$staging"
    echo "$version" > "$bin/.$name.version"
}

# The file name `go build -o DIR/` gives a command: its import path's last element, or
# the one before a major-version suffix (go.etcd.io/etcd/server/v3 -> server).
exec_name() {
    local path="$1" last="${1##*/}"
    if [[ "$last" =~ ^v[0-9]+$ ]]; then path="${path%/*}"; last="${path##*/}"; fi
    printf '%s\n' "$last"
}

install_from_module() {
    # `go install pkg@version` builds with the module's own go.mod and go.sum, so
    # every dependency is the one upstream released with. It refuses modules with
    # replace directives; those (kubernetes, etcd) go through build_from_module.
    local name="$1" package="$2" version="$3" ldflags="$4"
    local staging="$cache/src/$name-$version.bin"
    rm -rf "$staging"
    mkdir -p "$staging"
    say "$name: go install $package@$version"
    GOBIN="$staging" go install -trimpath -ldflags "$ldflags" "$package@$version"
    mv "$staging/$name" "$bin/$name"
    rmdir "$staging"
    echo "$version" > "$bin/.$name.version"
}

# The minor version of k8s.io/client-go a module requires (37 for v0.37.0), so
# helm's built-in default Kubernetes version matches the client it was built with.
client_go_minor() {
    sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$1" | head -n 1
}

# up_to_date NAME VERSION PROGRAM...: NAME's stamp says VERSION and every PROGRAM is there.
up_to_date() {
    local name="$1" version="$2" program; shift 2
    [ -f "$bin/.$name.version" ] && [ "$(cat "$bin/.$name.version")" = "$version" ] || return 1
    for program in "$@"; do [ -x "$bin/$program" ] || return 1; done
}

# What is built from k8s.io/kubernetes: the control plane's and the nodes' programs.
KUBERNETES_COMMANDS=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)

main() {
    k8s_minor_patch="${KUBERNETES_VERSION#v1.}"
    if up_to_date kubernetes "$KUBERNETES_VERSION" "${KUBERNETES_COMMANDS[@]}"; then
        say "${KUBERNETES_COMMANDS[*]} $KUBERNETES_VERSION already built in $bin"
    else
        start=$SECONDS
        local command targets=()
        for command in "${KUBERNETES_COMMANDS[@]}"; do targets+=("$command=k8s.io/kubernetes/cmd/$command"); done
        build_from_module kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION" "v0.$k8s_minor_patch" \
            "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor_patch%%.*} -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION" \
            "${targets[@]}"
        say "kubernetes built in $((SECONDS - start)) s"
    fi

    if up_to_date etcd "$ETCD_VERSION" etcd; then
        say "etcd $ETCD_VERSION already built in $bin"
    else
        start=$SECONDS
        build_from_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION" \
            "-s -w" etcd=go.etcd.io/etcd/server/v3
        say "etcd built in $((SECONDS - start)) s"
    fi

    if up_to_date helm "$HELM_VERSION" helm; then
        say "helm $HELM_VERSION already built in $bin"
    else
        start=$SECONDS
        local helm_gomod helm_k8s_minor
        helm_gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
        helm_k8s_minor="$(client_go_minor "$helm_gomod")"
        install_from_module helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
            "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$helm_k8s_minor -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_k8s_minor"
        say "helm built in $((SECONDS - start)) s"
    fi

    if up_to_date coredns "$COREDNS_VERSION" coredns; then
        say "coredns $COREDNS_VERSION already built in $bin"
    else
        # CoreDNS's go.mod has no replace directives: go install builds it with the
        # dependencies upstream released it with, every plugin of its default build in.
        start=$SECONDS
        install_from_module coredns github.com/coredns/coredns "$COREDNS_VERSION" \
            "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
        say "coredns built in $((SECONDS - start)) s"
    fi

    say "binaries ready in $bin:"
    "$bin/kube-apiserver" --version
    "$bin/kubectl" version --client 2>/dev/null | sed -n 1p
    "$bin/etcd" --version | sed -n 1p
    "$bin/helm" version --short
    "$bin/kubelet" --version
    "$bin/coredns" -version | sed -n 1p
}

# Sourcing the script (as its unit test does) defines the functions only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
