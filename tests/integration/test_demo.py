"""`cellplane demo` as a newcomer and CI run it: the README's command, word for word.

The short demo's invariants are asserted from its JSON summary; then its bad
inputs: a router port taken, a demo already running (and stopped with Ctrl-C),
the leftovers of a demo that was killed, and `--stop`. Each test checks that
nothing of the demo is left: no process, no run dir, no state file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellplane_operator.demo.leftovers import DemoRecord, alive, process_id, taken_ports
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.sites.local import site_process_ids

REPO = Path(__file__).resolve().parents[2]
CELLPLANE = [sys.executable, "-m", "cellplane_operator"]
RUN_DIR = re.compile(r"\(run dir (/\S+)\)")


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state file of the test's own, so a developer's demo is neither seen nor touched."""
    path = tmp_path / "demo.json"
    monkeypatch.setenv("CELLPLANE_DEMO_STATE", str(path))
    return path


@pytest.fixture()
def router_port() -> Iterator[int]:
    """A base port with it and the next two free (the kernel's ephemeral ports rarely are
    three in a row, so look for one)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base < 65000 and all(_free(base + i) for i in range(3)):
            yield base
            return
    raise AssertionError("no three free ports in a row")


def _free(port: int) -> bool:
    """Nothing listens on it (connections of a stopped router may linger in TIME_WAIT)."""
    return not taken_ports("127.0.0.1", [port])


def _naming(text: str) -> list[int]:
    """Live processes whose command line names ``text`` (a run dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes() and \
                        process_id(int(entry.name)) is not None:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _assert_nothing_left(run_dir: str, record: DemoRecord | None, state: Path,
                         ports: list[int]) -> None:
    wait_for(lambda: not _naming(run_dir), timeout=30,
             what=f"every process of {run_dir} to be gone (left: {_naming(run_dir)})")
    if record is not None:
        assert not [p for p in record.processes if alive(p)], record.processes
    assert not Path(run_dir).exists(), f"{run_dir} was not removed"
    assert not state.exists(), state.read_text()
    assert all(_free(port) for port in ports), ports


def _start_background(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*CELLPLANE, "demo", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=_as_in_a_terminal)


def _as_in_a_terminal() -> None:
    """Ctrl-C reaches the demo as it would in a terminal's foreground, also when these tests
    run as a background job of a shell without job control, whose children start with
    SIGINT ignored (Python then leaves it ignored, and the demo would never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _await_sites(demo: subprocess.Popen[bytes], state: Path, log: Path) -> DemoRecord:
    """Waits until the demo has started the operators and they have started site processes
    (so a stop must reach processes the demo did not start itself)."""
    found: list[DemoRecord] = []

    def sites_running() -> bool:
        record = DemoRecord.load(state)
        if record is None or not record.run_dir:
            return False
        found[:] = [record]
        regions = Path(record.run_dir) / "regions"
        return any(site_process_ids(regions / r) for r in ("region-a", "region-b", "region-c"))

    def demo_alive() -> None:
        if demo.poll() is not None:
            raise AssertionError(f"the demo exited {demo.returncode}:\n{log.read_text()}")

    wait_for(sites_running, timeout=240, interval=0.5, alive=demo_alive,
             what="the demo's operators to start site processes")
    record = DemoRecord.load(state)
    assert record is not None
    return record


def test_the_readme_demo_in_short_mode_holds_its_invariants(state: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(["bash", "hack/demo.sh", "--short", "--json"], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"\nshort demo: {seconds:.0f} s\n{result.stderr[-4000:]}")
    jobs = summary["jobs"]
    assert jobs["accepted"] > 0
    assert jobs["lost_not_in_report"] == []
    assert jobs["run_twice"] == []
    move = summary["move"]
    assert move["phase"] == "Completed"
    assert 0 < move["pause_seconds"] <= move["budget_seconds"]
    loss = summary["region_loss"]
    assert loss["rto_seconds"] is not None and loss["rto_seconds"] > 0
    assert loss["epoch_after"] > loss["epoch_before"]
    assert loss["old_primary_fenced"] and loss["rebuilt_as_standby"]
    noisy = summary["noisy"]
    assert noisy["samples"] > 0 and noisy["peak_running"] <= noisy["cap"]
    assert noisy["peak_share"] <= noisy["cap_share"]
    assert summary["tenants"] and set(summary["tenants"].values()) == {"Ready"}
    assert summary["broken"] == [] and summary["exit_code"] == 0
    # The timeline went to stderr, with the table; stdout holds nothing but the JSON.
    assert "every invariant held" in result.stderr
    assert len(result.stdout.strip().splitlines()) == 1
    run_dir = RUN_DIR.search(result.stderr)
    assert run_dir is not None
    _assert_nothing_left(run_dir.group(1), None, state, [8000, 8001, 8002])


def test_a_taken_router_port_is_named_before_anything_starts(state: Path,
                                                             router_port: int) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", router_port + 1))
        squatter.listen()
        started = time.monotonic()
        result = subprocess.run([*CELLPLANE, "demo", "--short", "--router-port",
                                 str(router_port)], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"127.0.0.1:{router_port + 1} (router of region-b) is taken" in result.stderr
    assert "--router-port" in result.stderr
    assert "starting" not in result.stdout + result.stderr
    assert not state.exists()


def test_connections_of_a_previous_run_in_time_wait_do_not_make_a_port_taken(
        router_port: int) -> None:
    """The routers bind with SO_REUSEADDR; the check must agree, or a demo run right after
    another would say its ports are taken."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", router_port))
        server.listen()
        client = socket.create_connection(("127.0.0.1", router_port))
        accepted, _ = server.accept()
        accepted.close()  # the side that closes first holds the TIME_WAIT
        client.close()
    assert taken_ports("127.0.0.1", [router_port]) == []
    with socket.socket() as squatter:  # a listener is what takes a port
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", router_port))
        squatter.listen()
        assert taken_ports("127.0.0.1", [router_port]) == [router_port]


def test_a_running_demo_is_refused_a_second_and_ctrl_c_stops_all_of_it(
        state: Path, router_port: int, tmp_path: Path) -> None:
    log = tmp_path / "first.log"
    first = _start_background(["--short", "--keep", "--router-port", str(router_port)], log)
    try:
        record = _await_sites(first, state, log)
        second = subprocess.run([*CELLPLANE, "demo", "--short"], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert (f"a demo is already running since {record.started_at} (pid {first.pid}"
                in second.stderr), second.stderr
        assert "cellplane demo --stop" in second.stderr
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=180) == 130, log.read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "interrupted; stopping every process" in log.read_text()
    _assert_nothing_left(record.run_dir, record, state,
                         [router_port, router_port + 1, router_port + 2])


def test_the_leftovers_of_a_killed_demo_are_removed_by_the_next(
        state: Path, router_port: int, tmp_path: Path) -> None:
    log = tmp_path / "killed.log"
    killed = _start_background(["--short", "--router-port", str(router_port)], log)
    try:
        record = _await_sites(killed, state, log)
    finally:
        killed.kill()  # SIGKILL: no cleanup at all; its processes live on
        killed.wait()
    assert [p for p in record.processes if alive(p)], "nothing was left to clean up"
    # The next demo cleans up, then stops at a port taken on purpose (another one: the
    # leftover routers hold the first demo's until the cleanup): a quick test.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        result = subprocess.run([*CELLPLANE, "demo", "--short", "--router-port", str(taken)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"removed the leftovers of a demo started {record.started_at}" in result.stdout
    assert f"(pid {killed.pid})" in result.stdout
    assert f"127.0.0.1:{taken} (router of region-a)" in result.stderr
    assert "taken" in result.stderr
    _assert_nothing_left(record.run_dir, record, state,
                         [router_port, router_port + 1, router_port + 2])


def test_stop_ends_a_recorded_demo_and_its_processes(state: Path, tmp_path: Path) -> None:
    """``--stop`` on a stand-in: a "demo" that leaves when asked (SIGTERM) and a process of
    it that ignores SIGTERM, so the SIGKILL after the grace period is needed too."""
    run_dir = tmp_path / "cellplane-run"
    run_dir.mkdir()
    demo = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         f"signal.SIG_IGN); time.sleep(600)  # {run_dir}"])
    try:
        wait_for(lambda: bool(_naming(str(run_dir))), timeout=10, what="the stand-in to run")
        me, child = process_id(demo.pid, "demo"), process_id(stubborn.pid, "stubborn")
        assert me is not None and child is not None
        DemoRecord(demo=me, run_dir=str(run_dir), started_at=DemoRecord.now(),
                   processes=[child]).save(state)
        result = subprocess.run([*CELLPLANE, "demo", "--stop"], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "stopping the demo started" in result.stdout
        assert demo.wait(timeout=10) == -signal.SIGTERM
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        assert "1 leftover process(es) stopped" in result.stdout
    finally:
        for process in (demo, stubborn):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not run_dir.exists() and not state.exists()
    again = subprocess.run([*CELLPLANE, "demo", "--stop"], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "nothing to stop" in again.stdout
    assert os.environ.get("CELLPLANE_DEMO_STATE") == str(state)
