"""The cell as it runs: `cellplane cell serve` and `cellplane cell work` processes over real HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellplane_cells.domain.signing import verify
from cellplane_operator.localplane import ManagedProcess
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import wait_for
from httpservers import RecordingServer

ADMIN = "admin-token-0123456789abcdef"
HOOK_SECRET = "webhook-secret-0123456789"


@pytest.fixture
def cell_processes(cell_db: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(tenant API URL, admin API URL) of a served cell with one worker process."""
    port, admin_port = free_port(), free_port()
    common = ["--database", cell_db, "--epoch", "1", "--allow-private-targets"]
    serve = ManagedProcess("cell-serve", [sys.executable, "-m", "cellplane_operator", "cell", "serve",
                                          *common, "--port", str(port), "--admin-port", str(admin_port),
                                          "--admin-token", ADMIN],
                           log=tmp_path / "serve.log")
    work = ManagedProcess("cell-work", [sys.executable, "-m", "cellplane_operator", "cell", "work",
                                        *common, "--heartbeat-seconds", "1", "--lease-seconds", "5"],
                          log=tmp_path / "work.log")
    serve.start()
    work.start()
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://{LOOPBACK}:{port}/openapi.json", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        serve.wait_until(up, timeout=30, what="the tenant API to answer")
        yield f"http://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{admin_port}"
    finally:
        work.stop()
        serve.stop()
        for log in (tmp_path / "serve.log", tmp_path / "work.log"):
            sys.stderr.write(f"--- {log.name} ---\n{log.read_text()[-3000:]}\n")


def test_a_submitted_job_runs_and_its_events_reach_the_webhook(cell_processes: tuple[str, str]) -> None:
    api, admin_url = cell_processes
    with RecordingServer() as target, RecordingServer() as hooks:
        admin = httpx.Client(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"})
        key = admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}).json()["api_key"]
        admin.post("/admin/v1/tenants/acme/wallet:credit", json={"amount": 10_000})
        assert admin.put("/admin/v1/tenants/acme/targets",
                         json={"name": "default", "url": f"{target.url}/run"}).status_code == 204
        assert admin.put("/admin/v1/tenants/acme/webhooks",
                         json={"url": f"{hooks.url}/events", "secret": HOOK_SECRET}).status_code == 200

        tenant = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"})
        accepted = tenant.post("/v1/jobs", json={"target": "default", "payload": {"doc": 7},
                                                 "steps": 2, "estimate": 500},
                               headers={"Idempotency-Key": "doc-7"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]

        wait_for(lambda: tenant.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded",
                 timeout=60, what="the worker process to run the job")
        wait_for(lambda: {c.headers["x-cellplane-event-type"] for c in hooks.snapshot()}
                 >= {"job.accepted", "job.succeeded"}, timeout=60,
                 what="the relay to deliver the job's events")

        assert [c.json["step"] for c in target.snapshot()] == [1, 2]
        for call in hooks.snapshot():
            assert verify(HOOK_SECRET, call.body, timestamp=int(call.headers["x-cellplane-timestamp"]),
                          signature=call.headers["x-cellplane-signature"])
        metrics = admin.get("/metrics").text
        assert 'cellplane_cell_running_jobs{tenant="acme"} 0.0' in metrics
        wallet = admin.get("/admin/v1/tenants/acme").json()
        assert (wallet["available"], wallet["reserved"]) == (10_000, 0)
