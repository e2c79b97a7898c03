"""Site reports in etcd: what each region's operator sees of its site of a cell.

    /cellplane/cells/<cell>/sites/<region>  {"role", "site", "database", "endpoints", "serving",
                                            "epoch", "streaming", "lag_seconds", "message",
                                            "took_over"}

The owner of the cell reads the standbys' reports to write the Cell's status;
a standby region reads the primary's report to find the database it streams
from. Each report is written only by the operator of its region.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from cellplane_operator.domain.failover import TakeoverRecord
from cellplane_operator.sites.base import DatabaseEndpoint, SiteEndpoints
from cellplane_operator.store import KeyValueStore

__all__ = ["SiteReport", "SiteReports", "CELLS_PREFIX"]

CELLS_PREFIX = "/cellplane/cells/"


@dataclass(frozen=True)
class SiteReport:
    role: str
    """primary or standby"""
    site: str
    database: DatabaseEndpoint | None = None
    endpoints: SiteEndpoints | None = None
    serving: bool = False
    epoch: int | None = None
    streaming: bool = False
    lag_seconds: float | None = None
    message: str = ""
    took_over: TakeoverRecord | None = None
    """A primary's: the takeover that gave it its epoch (until the Cell's status shows it)."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SiteReport:
        body = json.loads(raw)
        database = DatabaseEndpoint(**body["database"]) if body.get("database") else None
        endpoints = SiteEndpoints(**body["endpoints"]) if body.get("endpoints") else None
        return cls(role=body["role"], site=body["site"], database=database, endpoints=endpoints,
                   serving=bool(body.get("serving")), epoch=body.get("epoch"),
                   streaming=bool(body.get("streaming")), lag_seconds=body.get("lag_seconds"),
                   message=str(body.get("message") or ""),
                   took_over=TakeoverRecord(**body["took_over"]) if body.get("took_over")
                   else None)


class SiteReports:
    def __init__(self, store: KeyValueStore, *, prefix: str = CELLS_PREFIX) -> None:
        self._store = store
        self._prefix = prefix

    def key(self, cell: str, region: str) -> str:
        return f"{self._prefix}{cell}/sites/{region}"

    async def publish(self, cell: str, region: str, report: SiteReport) -> None:
        await self._store.put(self.key(cell, region), report.encode())

    async def read(self, cell: str, region: str) -> SiteReport | None:
        found = await self._store.get(self.key(cell, region))
        return None if found is None else SiteReport.decode(found.value)

    async def read_cell(self, cell: str) -> dict[str, SiteReport]:
        prefix = f"{self._prefix}{cell}/sites/"
        found = await self._store.get_prefix(prefix)
        return {key[len(prefix):]: SiteReport.decode(value.value) for key, value in found.items()}

    async def withdraw(self, cell: str, region: str) -> None:
        await self._store.delete(self.key(cell, region))
