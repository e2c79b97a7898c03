"""kopf handlers: glue between Kubernetes events and the domain's decisions.

Each handler unpacks the event into domain types, asks ``cellplane_operator.domain``
what to do, and writes the answer to the status subresource. No kopf object
travels past this module.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from cellplane_operator.clock import SystemClock
from cellplane_operator.domain.cells import CellSpec, plan_cell_status

GROUP = "cellplane.io"
VERSION = "v1alpha1"

_clock = SystemClock()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # The CRDs' schemas are structural and prune unknown status fields, so kopf
    # keeps its bookkeeping in annotations rather than in status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60


@kopf.on.resume(GROUP, VERSION, "cells")
@kopf.on.create(GROUP, VERSION, "cells")
@kopf.on.update(GROUP, VERSION, "cells", field="spec")
def reconcile_cell(
    name: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch,
    **_: Any,
) -> None:
    cell = CellSpec.from_manifest(name, spec)
    plan = plan_cell_status(
        cell,
        generation=int(meta.get("generation", 0)),
        current_conditions=list(status.get("conditions", [])),
        now=_clock.now(),
    )
    patch.status.update(plan.as_status())
