"""Fixtures shared by every test.

Integration fixtures start the real programs through the same launcher the
``cellplane`` command uses. Each one, at teardown, stops what it started by PID,
checks that every PID is gone and every port it used is free again, and prints
the programs' logs when the test failed.
"""

from __future__ import annotations

import os
import uuid
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellplane_operator.localplane import Binaries, LocalControlPlane
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.localplane.ports import LOOPBACK

REPO = Path(__file__).resolve().parents[1]
# Test helper modules beside this file (tests/ is no package, by design).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    integration = REPO / "tests" / "integration"
    for item in items:
        if integration in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def _failed(request: pytest.FixtureRequest, failures_before: int) -> bool:
    """Did a test that used this fixture fail? For a module-scoped fixture: any in the module."""
    node = request.node
    if any(getattr(getattr(node, f"report_{when}", None), "failed", False)
           for when in ("setup", "call")):
        return True
    return request.session.testsfailed > failures_before


def _pids(plane: LocalControlPlane) -> list[int]:
    described = plane.describe()
    pids: list[int] = []
    for group in ("etcd", "postgres"):
        section = described[group]
        assert isinstance(section, dict)
        pids += [entry["pid"] for entry in section.values() if entry["pid"]]
    api = described["kube_apiserver"]
    if isinstance(api, dict) and api["pid"]:
        pids.append(api["pid"])
    return pids


def _ports(plane: LocalControlPlane) -> list[int]:
    ports = [m.client_port for m in plane.etcd.members] + [m.peer_port for m in plane.etcd.members]
    ports += [pg.port for pg in plane.postgres.values()]
    if plane.apiserver is not None:
        ports.append(plane.apiserver.port)
    return ports


def _assert_released(pids: list[int], ports: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} outlived its fixture")
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((LOOPBACK, port))
            except OSError as error:
                raise AssertionError(f"port {port} still bound after teardown: {error}") from error


def _run_plane(request: pytest.FixtureRequest, config: LocalPlaneConfig) -> Iterator[LocalControlPlane]:
    plane = LocalControlPlane(config, binaries=_binaries())
    try:
        plane.start()
    except BaseException:
        sys.stderr.write(plane.dump_logs())
        raise
    failures_before = request.session.testsfailed
    try:
        yield plane
    finally:
        pids, ports = _pids(plane), _ports(plane)
        failed = _failed(request, failures_before)
        if failed:
            sys.stderr.write(f"\n--- logs of the local control plane in {plane.run_dir} ---\n")
            sys.stderr.write(plane.dump_logs())
        plane.stop()
        _assert_released(pids, ports)
        if not failed:
            plane.remove()


_found: list[Binaries] = []


def _binaries() -> Binaries:
    # Missing binaries are an error, never a skip: a skipped integration suite
    # would pass with the feature missing. hack/setup.sh builds them.
    if not _found:
        _found.append(Binaries.discover())
    return _found[0]


@pytest.fixture(scope="module")
def kube(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """A single-member etcd and a kube-apiserver on it, with cellplane's CRDs Established."""
    yield from _run_plane(request, LocalPlaneConfig(regions=("region-a",)))


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[Any]:
    """One regional operator (region-a) over the module's control plane; a module that
    needs other regions or operators defines its own ``plane``."""
    from regionplane import RegionPlane

    regions = RegionPlane(kube)
    regions.start_operator("region-a")
    try:
        yield regions
    finally:
        regions.close()


@pytest.fixture(scope="module")
def target() -> Iterator[Any]:
    """A job target on loopback answering every step 200, recording every call."""
    from httpservers import RecordingServer

    with RecordingServer() as server:
        yield server


@pytest.fixture(scope="module")
def etcd1(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """A single-member etcd and nothing else."""
    yield from _run_plane(request, LocalPlaneConfig(regions=("region-a",), with_apiserver=False))


@pytest.fixture
def etcd3(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """A 3-member etcd cluster, one member per region, and nothing else."""
    yield from _run_plane(
        request,
        LocalPlaneConfig(regions=("region-a", "region-b", "region-c"), with_apiserver=False),
    )


@pytest.fixture(scope="module")
def kube3(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """Three regions: a 3-member etcd cluster (one member each), the apiserver on all three."""
    yield from _run_plane(request, LocalPlaneConfig(regions=("region-a", "region-b", "region-c")))


@pytest.fixture(scope="module")
def cell_postgres(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """A Postgres primary shared by a module's cell tests; each test makes its own database."""
    for plane in _run_plane(request, LocalPlaneConfig(regions=(), with_apiserver=False)):
        plane.add_postgres("cell")
        yield plane


@pytest.fixture
def cell_db(cell_postgres: LocalControlPlane) -> str:
    """A fresh, migrated cell database (epoch 1 granted for an hour); its conninfo."""
    from cellfixtures import create_cell_database

    return create_cell_database(cell_postgres.postgres["cell"], f"cell_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def bare_plane(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """No etcd and no apiserver: room for Postgres instances, added by the test."""
    yield from _run_plane(request, LocalPlaneConfig(regions=(), with_apiserver=False))


@pytest.fixture(scope="session")
def local_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The local cluster (a control plane and a node per region, tests marked ``cluster``),
    started once per session; its start time and memory go to pytest's summary."""
    from clusterfixtures import start_session_cluster

    yield from start_session_cluster(request)


@pytest.fixture(scope="session")
def cluster_operators(local_cluster: Any) -> Any:
    """The chart's operators running as Pods on the session's cluster (helm install)."""
    from clusterfixtures import install_session_operators

    return install_session_operators(local_cluster)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    measured = sys.modules.get("clusterfixtures")
    if measured is not None and getattr(measured, "MEASURED", None):
        for key, value in measured.MEASURED.items():
            terminalreporter.write_line(f"local cluster {key}: {value}")
