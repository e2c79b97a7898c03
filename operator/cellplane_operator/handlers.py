"""kopf handlers: glue between Kubernetes' watch and the regional operator's controllers.

Only ``on.event`` handlers are registered: they hand each object to the
runtime's cache and return. kopf therefore writes no progress or diff-base
annotations and adds no finalizers of its own, so several regional operators
watching the same objects never collide on kopf's state (see
docs/regional-operator.md for who acts on what). No kopf object travels past
this module.

kopf logs in through ``on.login`` below, with the same login as the operator's
own client (``kube/login.py``: exec plugins, OIDC, rotating token files,
in-cluster), so neither the ``kubernetes`` library nor pykube is needed.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from cellplane_operator.errors import KubeConfigError
from cellplane_operator.kube import KubeConfig, Login, LoginError, login_for
from cellplane_operator.runtime import RegionRuntime
from cellplane_operator.settings import OperatorSettings

GROUP = "cellplane.io"
VERSION = "v1alpha1"


@kopf.on.login(retries=None, backoff=10)
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials, from the operator's kubeconfig (or in-cluster). Asked again
    after a 401 or once the credentials expire: fresh ones are got then."""
    config: OperatorSettings = memo["settings"]
    try:
        kube = KubeConfig.load(config.kubeconfig)
        user: Login = memo.get("login") or login_for(kube)
        memo["login"] = user
        user.unauthorized()  # kopf asks again only when the last credentials failed
        credentials = await user.credentials()
    except LoginError as error:
        raise kopf.TemporaryError(str(error), delay=10) from None
    except KubeConfigError as error:
        raise kopf.PermanentError(str(error)) from None
    cert, key = credentials.cert, credentials.key
    return kopf.ConnectionInfo(
        server=kube.server,
        ca_path=str(kube.ca_file) if kube.ca_file and not kube.ca_data else None,
        ca_data=kube.ca_data, insecure=kube.insecure_skip_tls_verify or None,
        scheme="Bearer" if credentials.token else None, token=credentials.token,
        certificate_path=None if cert is None or isinstance(cert, bytes) else str(cert),
        certificate_data=cert if isinstance(cert, bytes) else None,
        private_key_path=None if key is None or isinstance(key, bytes) else str(key),
        private_key_data=key if isinstance(key, bytes) else None,
        default_namespace=kube.namespace, expiration=credentials.expires)


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
