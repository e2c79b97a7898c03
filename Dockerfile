# The operator image charts/cellplane runs: `cellplane operator`, with PostgreSQL 15's
# server programs for the local site driver, which runs each cell's Postgres, API and
# workers as processes in the operator's pod, under the state volume.
#
#   docker build -t cellplane-operator:0.1.0 .
#   kind load docker-image cellplane-operator:0.1.0     # on kind; then image.pullPolicy=Never
#
# On this project's machines (no Docker, no registry) hack/images.sh builds it with podman
# as localhost/cellplane-operator:<version> and imports it into the local cluster's nodes.
#
# Debian bookworm: its python3 is 3.11 (the package's floor) and its PostgreSQL is the
# major the cells are tested on (POSTGRES_MAJOR in hack/versions.env). None of the
# Go-built programs (kube-apiserver, kubectl, etcd, helm) is needed: an operator never
# starts them. tests/unit/test_image.py keeps this file in step with the chart's values.
ARG POSTGRES_MAJOR=15
# The chart's podSecurityContext.runAsUser and runAsGroup.
ARG CELLPLANE_UID=65532

FROM debian:bookworm-slim AS system
ARG POSTGRES_MAJOR
ARG CELLPLANE_UID

# No default cluster on 5432 (the site driver makes its own), as hack/setup.sh does.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/cellplane.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv "postgresql-${POSTGRES_MAJOR}" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

# initdb and kopf look the user up in /etc/passwd (kopf names itself after it), and initdb
# refuses root: the operator, and so every Postgres it starts, runs as this user, which
# owns the state directory.
RUN groupadd --gid "${CELLPLANE_UID}" cellplane \
    && useradd --uid "${CELLPLANE_UID}" --gid "${CELLPLANE_UID}" --create-home \
        --home-dir /home/cellplane --shell /usr/sbin/nologin cellplane \
    && mkdir -p /var/lib/cellplane \
    && chown "${CELLPLANE_UID}:${CELLPLANE_UID}" /var/lib/cellplane

# The dependencies' list (and the build backend's), read from pyproject.toml in a stage of
# its own: the layer that installs them is then rebuilt only when the list changes, not
# with every other edit of pyproject.toml (a pytest marker, a lint rule).
FROM system AS requirements
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb")); \
        print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' \
        > /requirements.txt

FROM system
ARG CELLPLANE_UID
# The dependencies first, in a layer of their own: after a change of Python alone, the
# layers from the sources' COPY on are all that is built again, in seconds (hack/images.sh).
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN python3 -m venv /opt/cellplane \
    && /opt/cellplane/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# What the wheel is built from, and nothing else (.dockerignore keeps the rest out).
COPY pyproject.toml README.md /src/
COPY operator/cellplane_operator /src/operator/cellplane_operator
COPY cells/cellplane_cells /src/cells/cellplane_cells
COPY crds /src/crds
COPY deploy/admission /src/deploy/admission
RUN /opt/cellplane/bin/pip install --no-cache-dir --no-deps --no-build-isolation /src \
    && rm -rf /src

ENV PATH=/opt/cellplane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/cellplane
USER ${CELLPLANE_UID}:${CELLPLANE_UID}
WORKDIR /var/lib/cellplane
# The chart sets `command: [cellplane]` and the operator's arguments.
ENTRYPOINT ["cellplane"]
CMD ["--help"]
