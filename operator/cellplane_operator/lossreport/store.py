"""Where reconciliation reports are kept: a JSON file in the operator's state, and a
ConfigMap per failover for people and the ``cellplane report`` command.

    <directory>/<cell>-epoch-<N>.json                      the full report
    ConfigMap <namespace>/<cell>-reconciliation-epoch-<N>  report.json, summary.txt

A ConfigMap holds at most 1 MiB, so its report.json is cut to fit (the counts
stay the full report's, and the report says it was cut); the file is never cut.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from cellplane_operator.domain.reconciliation import ReconciliationReport, fit_report
from cellplane_operator.errors import KubeConflictError
from cellplane_operator.kube import CONFIGMAPS
from cellplane_operator.kube.base import KubeApi
from cellplane_operator.lossreport.reader import ReconciliationError

__all__ = ["ReportStore", "CELL_LABEL", "REPORT_LABEL", "EPOCH_LABEL", "REPORT_FILE_ANNOTATION",
           "CONFIGMAP_REPORT_BYTES"]

CELL_LABEL = "cellplane.io/cell"
REPORT_LABEL = "cellplane.io/report"
EPOCH_LABEL = "cellplane.io/epoch"
REPORT_FILE_ANNOTATION = "cellplane.io/report-file"
"""Where the operator wrote the uncut report."""
CONFIGMAP_REPORT_BYTES = 900 * 1024
"""report.json's share of the ConfigMap's 1 MiB; summary.txt and metadata fit in the rest."""


class ReportStore:
    def __init__(self, kube: KubeApi, namespace: str, directory: Path | None) -> None:
        """``directory`` None: a store that reads ConfigMaps and saves no file (the CLI)."""
        self._kube = kube
        self._namespace = namespace
        self._directory = directory

    @staticmethod
    def configmap_name(cell: str, epoch: int) -> str:
        return f"{cell}-reconciliation-epoch-{epoch}"

    async def save(self, report: ReconciliationReport) -> tuple[str, Path | None]:
        """Writes the file, then creates or replaces the ConfigMap; returns their names."""
        path = None
        if self._directory is not None:
            path = self._directory / f"{report.cell}-epoch-{report.epoch}.json"
            await asyncio.to_thread(_write_atomically, path, report.to_json())
        fitted = fit_report(report, CONFIGMAP_REPORT_BYTES)
        # From the whole report, so that its per-tenant counts are all there even when
        # report.json had to be cut.
        summary = report.render_summary()
        if fitted is not report:
            whole = f"in {path}" if path else "in no file (this store keeps none)"
            summary += f"report.json in this ConfigMap is cut to fit; the whole report is {whole}\n"
        name = self.configmap_name(report.cell, report.epoch)
        metadata: dict[str, Any] = {
            "name": name, "namespace": self._namespace,
            "labels": {CELL_LABEL: report.cell, REPORT_LABEL: "reconciliation",
                       EPOCH_LABEL: str(report.epoch)}}
        if path is not None:
            metadata["annotations"] = {REPORT_FILE_ANNOTATION: str(path)}
        body = {"metadata": metadata,
                "data": {"report.json": fitted.to_json(), "summary.txt": summary}}
        try:
            await self._kube.create(CONFIGMAPS, body, namespace=self._namespace)
        except KubeConflictError:
            # A report of the same failover, written again (an operator restarted half-way):
            # the later reading replaces it. A merge patch replaces each key it names.
            await self._kube.patch(CONFIGMAPS, name, {"metadata": metadata, "data": body["data"]},
                                   namespace=self._namespace)
        return name, path

    async def list(self, cell: str | None = None) -> list[ReconciliationReport]:
        """Every stored report (of ``cell``), by cell and then epoch."""
        selector = f"{REPORT_LABEL}=reconciliation"
        if cell is not None:
            selector += f",{CELL_LABEL}={cell}"
        found = await self._kube.list(CONFIGMAPS, namespace=self._namespace,
                                      label_selector=selector)
        reports = [_report_in(configmap) for configmap in found]
        return sorted(reports, key=lambda report: (report.cell, report.epoch))

    async def get(self, cell: str, epoch: int | None = None) -> ReconciliationReport | None:
        """The report of the failover to ``epoch``; the latest one when ``epoch`` is None."""
        if epoch is None:
            reports = await self.list(cell)
            return reports[-1] if reports else None
        found = await self._kube.get(CONFIGMAPS, self.configmap_name(cell, epoch),
                                     namespace=self._namespace)
        return None if found is None else _report_in(found)


def _report_in(configmap: dict[str, Any]) -> ReconciliationReport:
    try:
        return ReconciliationReport.from_json(configmap["data"]["report.json"])
    except (KeyError, TypeError, ValueError) as error:
        name = configmap.get("metadata", {}).get("name")
        raise ReconciliationError(f"ConfigMap {name} holds no readable reconciliation "
                                  f"report: {error!r}") from error


def _write_atomically(path: Path, text: str) -> None:
    """A reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
