"""Who the client is to the apiserver, found as kubectl finds it.

A kubeconfig user (or a Pod's service account) becomes a ``Login``: something
asked for ``Credentials`` before each request and told when the apiserver
answered 401. The kinds, in kubectl's order of precedence:

- ``exec``: a credential plugin (client.authentication.k8s.io v1 or v1beta1, what
  EKS, GKE and AKS kubeconfigs use). Its ExecCredential is kept until its
  ``expirationTimestamp`` and the plugin is run again after a 401.
- ``auth-provider: oidc``: the ``id-token`` is sent as it is; it is not refreshed
  (kubectl's own oidc provider is deprecated; ``kubelogin`` as an exec plugin
  refreshes).
- ``token``, else ``tokenFile``: the file is read again at most once a minute and
  after a 401, so a rotated projected token (in-cluster, or a kubeconfig's) is used.
- client certificates, alone or beside a token.

Which wall-clock instant a credential expires at comes from the plugin, so the
cache compares it with the wall clock it is handed; the token file's minute is
measured on the monotonic clock. Both are parameters, so tests control time.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cellplane_operator.clock import Clock, SystemClock
from cellplane_operator.errors import KubeConfigError
from cellplane_operator.kube.config import ExecConfig, KubeConfig

__all__ = ["Credentials", "Login", "LoginError", "PluginOutput", "PluginRunner",
           "ExecLogin", "TokenFileLogin", "StaticLogin", "RefusedLogin", "login_for", "run_plugin",
           "TOKEN_FILE_REREAD_SECONDS", "PLUGIN_TIMEOUT_SECONDS"]

TOKEN_FILE_REREAD_SECONDS = 60.0
"""client-go's period for re-reading a token file."""
PLUGIN_TIMEOUT_SECONDS = 120.0
"""How long a credential plugin may run. kubectl waits for ever, for a person at a
browser; nobody is at the operator's, so a plugin that hangs is an error."""
_STDERR_TAIL = 800


class LoginError(KubeConfigError):
    """Credentials could not be had for a kubeconfig user: the message names the user
    and what failed (a plugin not found, its exit status and stderr, its output)."""


@dataclass(frozen=True)
class Credentials:
    """What a request presents: a bearer token and/or a client certificate."""

    token: str | None = None
    cert: Path | bytes | None = None
    key: Path | bytes | None = None
    expires: datetime.datetime | None = None
    """When an exec plugin said the credentials end (timezone-aware), if it did."""


class Login(Protocol):
    async def credentials(self) -> Credentials:
        """The credentials to present now (cached while they are good)."""
        ...

    def unauthorized(self) -> bool:
        """The apiserver refused the last credentials with 401: get fresh ones next time.
        False if there are none to get (the same would be sent again)."""
        ...


@dataclass(frozen=True)
class PluginOutput:
    returncode: int
    stdout: bytes
    stderr: bytes


PluginRunner = Callable[[Sequence[str], Mapping[str, str]], Awaitable[PluginOutput]]
"""Runs argv with the environment given; ``FileNotFoundError`` if there is no such program."""


async def run_plugin(argv: Sequence[str], env: Mapping[str, str]) -> PluginOutput:
    process = await asyncio.create_subprocess_exec(
        *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), PLUGIN_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return PluginOutput(-1, b"", f"timed out after {PLUGIN_TIMEOUT_SECONDS:.0f}s".encode())
    return PluginOutput(process.returncode if process.returncode is not None else -1,
                        stdout, stderr)


class StaticLogin:
    """A token and/or client certificate written in the kubeconfig, or an OIDC id-token."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def credentials(self) -> Credentials:
        return self._credentials

    def unauthorized(self) -> bool:
        return False  # nothing else to try: the request's 401 stands


class RefusedLogin:
    """A kubeconfig user that cannot log in: says why when credentials are asked for, so
    the error reaches the caller where its requests' errors do."""

    def __init__(self, message: str) -> None:
        self._message = message

    async def credentials(self) -> Credentials:
        raise LoginError(self._message)

    def unauthorized(self) -> bool:
        return False


class TokenFileLogin:
    """A token file (a projected service-account token, or a kubeconfig's ``tokenFile``),
    read again once a minute and after a 401, beside the kubeconfig's client certificate."""

    def __init__(self, path: Path, *, user: str, clock: Clock,
                 cert: Path | bytes | None = None, key: Path | bytes | None = None) -> None:
        self._path, self._user, self._clock = path, user, clock
        self._cert, self._key = cert, key
        self._token: str | None = None
        self._read_at = 0.0

    async def credentials(self) -> Credentials:
        now = self._clock.monotonic()
        if self._token is None or now - self._read_at >= TOKEN_FILE_REREAD_SECONDS:
            try:
                token = self._path.read_text().strip()
            except OSError as error:
                if self._token is None:  # client-go keeps the last token read
                    raise LoginError(f"user {self._user!r}: cannot read the token file "
                                     f"{self._path}: {error.strerror or error}") from None
            else:
                self._token, self._read_at = token, now
        return Credentials(token=self._token, cert=self._cert, key=self._key)

    def unauthorized(self) -> bool:
        self._read_at = float("-inf")
        return True


class ExecLogin:
    """An ``exec`` credential plugin's ExecCredential, kept until it expires or a 401."""

    def __init__(self, config: KubeConfig, plugin: ExecConfig, *, clock: Clock,
                 runner: PluginRunner = run_plugin,
                 environ: Mapping[str, str] | None = None) -> None:
        self._config, self._plugin, self._clock, self._runner = config, plugin, clock, runner
        self._environ = dict(os.environ if environ is None else environ)
        self._cached: Credentials | None = None
        self._lock = asyncio.Lock()
        self.runs = 0
        """How many times the plugin ran (for tests and logs)."""

    async def credentials(self) -> Credentials:
        async with self._lock:
            if self._cached is None or self._expired(self._cached):
                self._cached = await self._run()
            return self._cached

    def unauthorized(self) -> bool:
        self._cached = None
        return True

    def _expired(self, credentials: Credentials) -> bool:
        return credentials.expires is not None and self._clock.now() >= credentials.expires

    async def _run(self) -> Credentials:
        plugin, user = self._plugin, self._config.user
        if plugin.interactive_mode == "Always":
            raise LoginError(f"user {user!r}: exec plugin {plugin.command!r} needs a terminal "
                             "(interactiveMode Always), and none is given to it here")
        argv = [self._resolve(), *plugin.args]
        env = {**self._environ, **dict(plugin.env),
               "KUBERNETES_EXEC_INFO": json.dumps(self._exec_info())}
        try:
            output = await self._runner(argv, env)
        except OSError as error:
            raise LoginError(self._not_found(f"cannot run it: {error}")) from None
        self.runs += 1
        if output.returncode != 0:
            tail = output.stderr.decode(errors="replace").strip()
            if len(tail) > _STDERR_TAIL:  # its last lines, whole
                tail = "..." + tail[-_STDERR_TAIL:].partition("\n")[2]
            raise LoginError(f"user {user!r}: exec plugin {plugin.command!r} exited with "
                             f"status {output.returncode}: {tail or '(no stderr)'}")
        return self._parse(output.stdout)

    def _resolve(self) -> str:
        command = self._plugin.command
        if os.sep in command:
            if not os.access(command, os.X_OK):
                raise LoginError(self._not_found("no such executable file"))
            return command
        found = shutil.which(command, path=self._environ.get("PATH", os.defpath))
        if found is None:
            raise LoginError(self._not_found("not found on PATH"))
        return found

    def _not_found(self, what: str) -> str:
        hint = f" ({self._plugin.install_hint.strip()})" if self._plugin.install_hint else ""
        return f"user {self._config.user!r}: exec plugin {self._plugin.command!r}: {what}{hint}"

    def _exec_info(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"interactive": False}
        if self._plugin.provide_cluster_info:
            cluster: dict[str, Any] = {"server": self._config.server}
            if (ca := self._config.ca_pem()) is not None:
                cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
            if self._config.insecure_skip_tls_verify:
                cluster["insecure-skip-tls-verify"] = True
            if self._config.cluster_extension is not None:
                cluster["config"] = self._config.cluster_extension
            spec["cluster"] = cluster
        return {"apiVersion": self._plugin.api_version, "kind": "ExecCredential", "spec": spec}

    def _parse(self, stdout: bytes) -> Credentials:
        user, command = self._config.user, self._plugin.command
        try:
            document = json.loads(stdout)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            raise LoginError(f"user {user!r}: exec plugin {command!r} printed no "
                             f"ExecCredential JSON: {error}: {stdout[:200]!r}") from None
        if document.get("kind") != "ExecCredential" or \
                document.get("apiVersion") != self._plugin.api_version:
            raise LoginError(f"user {user!r}: exec plugin {command!r} printed kind "
                             f"{document.get('kind')!r} apiVersion "
                             f"{document.get('apiVersion')!r}, not an ExecCredential of "
                             f"{self._plugin.api_version}")
        status = document.get("status") or {}
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if bool(cert) != bool(key):
            raise LoginError(f"user {user!r}: exec plugin {command!r} gave a client "
                             "certificate without its key, or a key without its certificate")
        if not token and not cert:
            raise LoginError(f"user {user!r}: exec plugin {command!r} gave neither a token "
                             "nor a client certificate")
        expires = None
        if stamp := status.get("expirationTimestamp"):
            try:
                expires = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            except ValueError:
                raise LoginError(f"user {user!r}: exec plugin {command!r} gave the "
                                 f"expirationTimestamp {stamp!r}, not an RFC 3339 time") from None
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=datetime.timezone.utc)
        return Credentials(token=token, cert=cert.encode() if cert else None,
                           key=key.encode() if key else None, expires=expires)


def login_for(config: KubeConfig, *, clock: Clock | None = None,
              runner: PluginRunner = run_plugin,
              environ: Mapping[str, str] | None = None) -> Login:
    """The login kubectl would do for ``config``'s user. Never raises: a user that cannot
    log in gets a login whose ``credentials`` raise ``LoginError``."""
    clock = clock if clock is not None else SystemClock()
    cert = config.client_cert_data or config.client_cert
    key = config.client_key_data or config.client_key
    if config.exec is not None:
        if config.auth_provider:
            return RefusedLogin(f"user {config.user!r}: exec and auth-provider cannot be "
                                "used together")
        return ExecLogin(config, config.exec, clock=clock, runner=runner, environ=environ)
    if config.auth_provider:
        if config.auth_provider != "oidc":
            return RefusedLogin(f"user {config.user!r}: the auth-provider "
                                f"{config.auth_provider!r} was removed from kubectl; use its "
                                "exec plugin (gke-gcloud-auth-plugin, kubelogin)")
        token = config.auth_provider_config.get("id-token")
        if not token:
            return RefusedLogin(f"user {config.user!r}: the oidc auth-provider has no "
                                "id-token (log in with kubectl once, or use kubelogin as an "
                                "exec plugin)")
        return StaticLogin(Credentials(token=token, cert=cert, key=key))
    if config.token:
        return StaticLogin(Credentials(token=config.token, cert=cert, key=key))
    if config.token_file is not None:
        return TokenFileLogin(config.token_file, user=config.user, clock=clock,
                              cert=cert, key=key)
    return StaticLogin(Credentials(cert=cert, key=key))
