"""kopf handlers: glue between Kubernetes' watch and the regional operator's controllers.

Only ``on.event`` handlers are registered: they hand each object to the
runtime's cache and return. kopf therefore writes no progress or diff-base
annotations and adds no finalizers of its own, so several regional operators
watching the same objects never collide on kopf's state (see
docs/regional-operator.md for who acts on what). No kopf object travels past
this module.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from cellplane_operator.runtime import RegionRuntime
from cellplane_operator.settings import OperatorSettings

GROUP = "cellplane.io"
VERSION = "v1alpha1"


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.networking.request_timeout = 90
    config: OperatorSettings = memo["settings"]
    runtime = RegionRuntime(config, memo["driver"])
    await runtime.start()
    memo["runtime"] = runtime


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime: RegionRuntime | None = memo.get("runtime")
    if runtime is not None:
        await runtime.stop()


@kopf.on.event(GROUP, VERSION, "cells")
async def cell_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: RegionRuntime | None = memo.get("runtime")
    if runtime is not None:
        runtime.observe_cell(event.get("type"), dict(event["object"]))


@kopf.on.event(GROUP, VERSION, "tenants")
async def tenant_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: RegionRuntime | None = memo.get("runtime")
    if runtime is not None:
        runtime.observe_tenant(event.get("type"), dict(event["object"]))


@kopf.on.event(GROUP, VERSION, "tenantmoves")
async def tenant_move_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: RegionRuntime | None = memo.get("runtime")
    if runtime is not None:
        runtime.observe_move(event.get("type"), dict(event["object"]))
