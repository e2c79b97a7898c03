"""The cell contract (tests/cellcontract.py) on a real cell's admin API, served over HTTP
on a real cell database and called with the operator's HTTP client: what the in-memory
fake the unit tests use promises is what a cell answers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from cellcontract import CHECKS, Check
from cellplane_cells.api.admin_app import create_admin_app
from cellplane_cells.db import open_pool
from cellplane_operator.cellclient import CellAdmin, CellAdminClient
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import wait_for

pytestmark = pytest.mark.integration

TOKEN = "admin-token-for-contract-0123456789"


@dataclass
class HttpHarness:
    cells: CellAdmin
    admin: str
    token: str = TOKEN
    allowed: str = f"http://{LOOPBACK}:9"
    dead_admin: str = f"http://{LOOPBACK}:{free_port()}"


@pytest.fixture
def admin_url(cell_db: str) -> Iterator[str]:
    """The cell's admin API (private targets allowed, as in development) on a free port."""
    pool = open_pool(cell_db, epoch=1, max_size=4)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        create_admin_app(pool, admin_token=TOKEN, allow_private_targets=True), host=LOOPBACK,
        port=port, log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, what="the cell's admin API")
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        pool.close()


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
async def test_a_real_cell_keeps_the_cell_contract(admin_url: str, check: Check) -> None:
    client = CellAdminClient()
    try:
        await check(HttpHarness(client, admin_url), f"c{uuid.uuid4().hex[:6]}-")
    finally:
        await client.close()
