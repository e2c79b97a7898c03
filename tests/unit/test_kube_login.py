"""Logging in as kubectl does, retrying 429s and aggregating Events, without an apiserver
(issue #23): kubeconfig users, exec credentials with a controlled clock, token files."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cellplane_operator.errors import KubeApiError, KubeConfigError, KubeNotFoundError
from cellplane_operator.kube import CELLS, KubeClient, KubeConfig
from cellplane_operator.kube.events import AGGREGATE_WINDOW, EventRecorder
from cellplane_operator.kube.login import (
    TOKEN_FILE_REREAD_SECONDS,
    Credentials,
    ExecLogin,
    LoginError,
    PluginOutput,
    StaticLogin,
    TokenFileLogin,
    login_for,
)
from cellplane_operator.kube.retry import RetryPolicy, retry_delay

T0 = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.timezone.utc)
V1 = "client.authentication.k8s.io/v1"


class Clock:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1000.0

    def now(self) -> datetime.datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += datetime.timedelta(seconds=seconds)
        self.mono += seconds


def _kubeconfig(tmp_path: Path, user: dict[str, Any], **cluster: Any) -> KubeConfig:
    document = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "alice"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                               "certificate-authority-data": "Q0E=", **cluster}}],
        "users": [{"name": "alice", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(document))
    return KubeConfig.from_file(path)


def _exec_user(**extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": V1, "command": "sh", "args": ["-c", "x"],
                     "env": [{"name": "PROFILE", "value": "prod"}],
                     "interactiveMode": "Never", **extra}}


class Plugin:
    """Prints the ExecCredentials it is given, one per run, recording what it was run with."""

    def __init__(self, *outputs: PluginOutput) -> None:
        self.outputs = list(outputs)
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    async def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> PluginOutput:
        self.calls.append((list(argv), dict(env)))
        return self.outputs.pop(0)


def _credential(expires: datetime.datetime | None = None, api_version: str = V1,
                **status: Any) -> PluginOutput:
    if expires is not None:
        status["expirationTimestamp"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return PluginOutput(0, json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                                       "status": status}).encode(), b"")


# kubeconfig users

def test_an_exec_user_is_read_with_its_plugin_settings(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, _exec_user(provideClusterInfo=True, installHint="brew it"))
    assert config.user == "alice" and config.exec is not None
    assert (config.exec.command, config.exec.args) == ("sh", ("-c", "x"))
    assert config.exec.env == (("PROFILE", "prod"),)
    assert config.exec.provide_cluster_info and config.exec.interactive_mode == "Never"
    assert isinstance(login_for(config), ExecLogin)


def test_a_relative_plugin_path_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": "./bin/auth",
                                             "interactiveMode": "Never"}})
    assert config.exec is not None and config.exec.command == str(tmp_path / "bin" / "auth")


@pytest.mark.parametrize("exec_section, said", [
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "apiVersion"),
    ({"apiVersion": V1, "command": "x"}, "interactiveMode is required"),
    ({"apiVersion": V1, "command": "x", "interactiveMode": "Sometimes"}, "interactiveMode"),
    ({"apiVersion": V1}, "no command"),
])
def test_a_bad_exec_section_is_a_clear_error(tmp_path: Path, exec_section: dict[str, Any],
                                             said: str) -> None:
    with pytest.raises(KubeConfigError, match=f"user 'alice'.*{said}"):
        _kubeconfig(tmp_path, {"exec": exec_section})


def test_v1beta1_defaults_to_interactive_if_available(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                             "command": "x"}})
    assert config.exec is not None and config.exec.interactive_mode == "IfAvailable"


async def test_oidc_sends_the_id_token_and_other_auth_providers_are_refused(tmp_path: Path) -> None:
    oidc = _kubeconfig(tmp_path, {"auth-provider": {"name": "oidc", "config": {
        "id-token": "eyJ.id", "refresh-token": "r", "idp-issuer-url": "https://idp"}}})
    assert (await login_for(oidc).credentials()).token == "eyJ.id"
    gcp = _kubeconfig(tmp_path, {"auth-provider": {"name": "gcp", "config": {}}})
    with pytest.raises(LoginError, match="'gcp' was removed from kubectl.*exec plugin"):
        await login_for(gcp).credentials()
    empty = _kubeconfig(tmp_path, {"auth-provider": {"name": "oidc", "config": {}}})
    with pytest.raises(LoginError, match="user 'alice'.*no id-token"):
        await login_for(empty).credentials()


async def test_a_token_wins_over_a_token_file_and_certificates_go_beside_it(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, {"token": "t", "tokenFile": "tok",
                                    "client-certificate-data": "Q0VSVA==",
                                    "client-key-data": "S0VZ"})
    credentials = await login_for(config).credentials()
    assert (credentials.token, credentials.cert, credentials.key) == ("t", b"CERT", b"KEY")


def test_in_cluster_reads_the_service_account_mount_and_the_service_env(tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("cellplane-system\n")
    (tmp_path / "token").write_text("sa-token\n")
    config = KubeConfig.in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "fd00::1",
                                              "KUBERNETES_SERVICE_PORT": "443"})
    assert config.server == "https://[fd00::1]:443"
    assert (config.ca_file, config.token_file) == (tmp_path / "ca.crt", tmp_path / "token")
    assert (config.namespace, config.user) == ("cellplane-system", "in-cluster")
    assert isinstance(login_for(config), TokenFileLogin)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubeConfig.in_cluster(tmp_path, {})


# token files

async def test_a_token_file_is_read_again_after_a_minute_and_after_a_401(tmp_path: Path) -> None:
    path, clock = tmp_path / "token", Clock()
    path.write_text("one\n")
    login = TokenFileLogin(path, user="in-cluster", clock=clock)
    assert (await login.credentials()).token == "one"
    path.write_text("two\n")
    clock.advance(TOKEN_FILE_REREAD_SECONDS - 1)
    assert (await login.credentials()).token == "one"
    clock.advance(1)
    assert (await login.credentials()).token == "two"
    path.write_text("three\n")
    login.unauthorized()
    assert (await login.credentials()).token == "three"
    path.unlink()  # between the kubelet's remove and write: the last token read is kept
    clock.advance(TOKEN_FILE_REREAD_SECONDS)
    assert (await login.credentials()).token == "three"


async def test_a_missing_token_file_names_the_user_and_the_file(tmp_path: Path) -> None:
    login = TokenFileLogin(tmp_path / "absent", user="alice", clock=Clock())
    with pytest.raises(LoginError, match="user 'alice': cannot read the token file .*absent"):
        await login.credentials()


# exec plugins

async def test_an_exec_credential_is_kept_until_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    plugin = Plugin(_credential(T0 + datetime.timedelta(minutes=15), token="first"),
                    _credential(token="second"))
    login = login_for(_kubeconfig(tmp_path, _exec_user()), clock=clock, runner=plugin,
                      environ={"PATH": "/usr/bin:/bin", "HOME": "/home/a"})
    assert (await login.credentials()).token == "first"
    clock.advance(14 * 60)
    assert (await login.credentials()).token == "first" and len(plugin.calls) == 1
    clock.advance(60)
    assert (await login.credentials()).token == "second"
    clock.advance(24 * 3600)  # no expiry given: kept until a 401
    assert (await login.credentials()).token == "second" and len(plugin.calls) == 2
    argv, env = plugin.calls[0]
    assert argv[1:] == ["-c", "x"] and argv[0].endswith("/sh")
    assert (env["PROFILE"], env["HOME"]) == ("prod", "/home/a")
    info = json.loads(env["KUBERNETES_EXEC_INFO"])
    assert info == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}


async def test_a_401_runs_the_plugin_again(tmp_path: Path) -> None:
    plugin = Plugin(_credential(token="old"), _credential(token="new"))
    login = login_for(_kubeconfig(tmp_path, _exec_user()), clock=Clock(), runner=plugin)
    assert (await login.credentials()).token == "old"
    login.unauthorized()
    assert (await login.credentials()).token == "new"


async def test_the_cluster_info_goes_to_a_plugin_that_asks_for_it(tmp_path: Path) -> None:
    extension = {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "x"}}
    plugin = Plugin(_credential(clientCertificateData="PEM-CERT", clientKeyData="PEM-KEY"))
    config = _kubeconfig(tmp_path, _exec_user(provideClusterInfo=True),
                         extensions=[extension])
    credentials = await login_for(config, clock=Clock(), runner=plugin).credentials()
    assert (credentials.token, credentials.cert, credentials.key) == (None, b"PEM-CERT", b"PEM-KEY")
    spec = json.loads(plugin.calls[0][1]["KUBERNETES_EXEC_INFO"])["spec"]
    assert spec["cluster"] == {"server": "https://10.0.0.1:6443",
                               "certificate-authority-data": "Q0E=", "config": {"audience": "x"}}


@pytest.mark.parametrize("output, said", [
    (PluginOutput(1, b"", b"a long log\n" * 200 + b"error: token expired, run aws sso login"),
     r"exited with status 1: \.\.\.a long log\n.*run aws sso login$"),
    (PluginOutput(0, b"not json", b""), "printed no ExecCredential JSON"),
    (_credential(api_version="client.authentication.k8s.io/v1beta1", token="t"),
     "not an ExecCredential of client.authentication.k8s.io/v1"),
    (_credential(), "neither a token nor a client certificate"),
    (_credential(clientCertificateData="C"), "without its key"),
    (_credential(token="t", expirationTimestamp="tomorrow"), "not an RFC 3339 time"),
])
async def test_a_failing_plugin_is_a_clear_error_naming_the_user(
        tmp_path: Path, output: PluginOutput, said: str) -> None:
    login = login_for(_kubeconfig(tmp_path, _exec_user()), clock=Clock(), runner=Plugin(output))
    with pytest.raises(LoginError, match=f"(?s)user 'alice': exec plugin 'sh'.*{said}"):
        await login.credentials()


async def test_a_plugin_not_found_says_so_with_its_install_hint(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": "aws-iam-nowhere",
                                             "interactiveMode": "Never",
                                             "installHint": "install the AWS CLI"}})
    login = login_for(config, clock=Clock(), runner=Plugin(), environ={"PATH": str(tmp_path)})
    with pytest.raises(LoginError, match="'aws-iam-nowhere': not found on PATH "
                                         r"\(install the AWS CLI\)"):
        await login.credentials()


async def test_a_plugin_that_needs_a_terminal_is_refused(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, _exec_user(interactiveMode="Always"))
    with pytest.raises(LoginError, match="needs a terminal"):
        await login_for(config, clock=Clock(), runner=Plugin()).credentials()


# retries

@pytest.mark.parametrize("status, retry_after, attempt, delay", [
    (429, "3", 1, 3.0),
    (429, None, 1, 1.0),             # APF always says; a proxy may not
    (429, "Wed, 21 Oct 2026 07:28:00 GMT", 1, 1.0),
    (429, "600", 1, 10.0),           # capped
    (429, "3", 5, None),             # out of attempts
    (503, "2", 1, 2.0),
    (503, None, 1, None),            # may be a proxy's: not ours to repeat
    (500, "1", 1, None),
    (504, "1", 1, None),             # may have been applied
    (409, None, 1, None),
])
def test_which_refusals_are_sent_again_and_when(status: int, retry_after: str | None,
                                                attempt: int, delay: float | None) -> None:
    assert retry_delay(status, retry_after, attempt, RetryPolicy()) == delay


class Apiserver:
    """An in-memory apiserver for the client: answers from a script, records requests."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answers.pop(0)


def _client(api: Apiserver, login: Any, slept: list[float]) -> KubeClient:
    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    config = KubeConfig(server="https://kube.test", ca_file=None)
    return KubeClient(config, login=login, sleep=sleep, transport=httpx.MockTransport(api))


async def test_the_client_waits_out_429s_and_renews_credentials_once_after_a_401(
        tmp_path: Path) -> None:
    api = Apiserver(httpx.Response(429, headers={"Retry-After": "2"}, json={}),
                    httpx.Response(401, json={"reason": "Unauthorized"}),
                    httpx.Response(200, json={"metadata": {"name": "c1"}}),
                    httpx.Response(401, json={"reason": "Unauthorized"}),
                    httpx.Response(401, json={"reason": "Unauthorized", "message": "no"}))
    plugin = Plugin(_credential(token="a"), _credential(token="b"), _credential(token="c"))
    login = login_for(_kubeconfig(tmp_path, _exec_user()), clock=Clock(), runner=plugin)
    slept: list[float] = []
    kube = _client(api, login, slept)
    assert await kube.get(CELLS, "c1") == {"metadata": {"name": "c1"}}
    assert slept == [2.0]
    assert [r.headers["Authorization"] for r in api.requests] == ["Bearer a", "Bearer a",
                                                                  "Bearer b"]
    with pytest.raises(KubeApiError, match="401 Unauthorized: no") as refused:
        await kube.get(CELLS, "c1")
    assert refused.value.status == 401 and len(plugin.calls) == 3
    await kube.close()


# Events

class EventStore:
    """Events in memory, as the recorder's writer."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.creates = 0

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.creates += 1
        self.events[body["metadata"]["name"]] = dict(body)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        if name not in self.events:
            raise KubeNotFoundError("gone", status=404)
        self.events[name].update(patch)


CELL = {"apiVersion": "cellplane.io/v1alpha1", "kind": "Cell",
        "metadata": {"name": "c1", "namespace": "ops", "uid": "u1"}}


async def _say(recorder: EventRecorder, at: datetime.datetime, message: str = "restarted",
               reason: str = "ProcessRestarted", involved: dict[str, Any] = CELL) -> None:
    await recorder.record(involved, type_="Warning", reason=reason, message=message,
                          component="cellplane-operator/region-a", now=at)


async def test_a_repeated_event_counts_on_the_one_posted() -> None:
    store = EventStore()
    recorder = EventRecorder(store)
    await _say(recorder, T0)
    await _say(recorder, T0 + datetime.timedelta(minutes=1))
    await _say(recorder, T0 + datetime.timedelta(minutes=2))
    (event,) = store.events.values()
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (
        3, "2026-12-03T12:00:00Z", "2026-12-03T12:02:00Z")
    assert event["involvedObject"]["uid"] == "u1" and event["metadata"]["namespace"] == "ops"


async def test_a_different_message_reason_or_object_is_an_event_of_its_own() -> None:
    store = EventStore()
    recorder = EventRecorder(store)
    await _say(recorder, T0)
    await _say(recorder, T0, message="other")
    await _say(recorder, T0, reason="Serving")
    await _say(recorder, T0, involved={**CELL, "metadata": {**CELL["metadata"], "name": "c2",
                                                            "uid": "u2"}})
    assert store.creates == 4 and all(e["count"] == 1 for e in store.events.values())


async def test_a_repeat_after_the_window_or_after_the_event_expired_creates_anew() -> None:
    store = EventStore()
    recorder = EventRecorder(store)
    await _say(recorder, T0)
    await _say(recorder, T0 + AGGREGATE_WINDOW + datetime.timedelta(seconds=1))
    assert store.creates == 2
    store.events.clear()  # the apiserver's hour ran out
    await _say(recorder, T0 + AGGREGATE_WINDOW + datetime.timedelta(seconds=2))
    assert store.creates == 3 and [e["count"] for e in store.events.values()] == [1]


async def test_the_recorder_forgets_the_oldest_keys_beyond_its_size() -> None:
    store = EventStore()
    recorder = EventRecorder(store, cache_size=2)
    for message in ("a", "b", "c", "a"):
        await _say(recorder, T0, message=message)
    assert store.creates == 4


async def test_a_401_to_static_credentials_is_the_answer() -> None:
    api = Apiserver(httpx.Response(401, json={"reason": "Unauthorized", "message": "bad"}))
    kube = _client(api, StaticLogin(Credentials(token="t")), [])
    with pytest.raises(KubeApiError, match="401"):
        await kube.list(CELLS)
    assert len(api.requests) == 1
    await kube.close()


# kopf

async def test_kopf_is_handed_the_exec_plugins_credentials_and_their_expiry(
        tmp_path: Path) -> None:
    import kopf

    from cellplane_operator import handlers
    from cellplane_operator.settings import OperatorSettings

    script = tmp_path / "plugin"
    script.write_text("#!/bin/sh\necho '" + json.dumps({
        "apiVersion": V1, "kind": "ExecCredential",
        "status": {"token": "from-plugin", "expirationTimestamp": "2099-01-01T00:00:00Z"}})
        + "'\n")
    script.chmod(0o755)
    config = _kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": str(script),
                                             "interactiveMode": "Never"}})
    assert config.source is not None
    memo = kopf.Memo(settings=OperatorSettings(region="region-a", kubeconfig=config.source))
    info = await handlers.login(memo=memo)
    assert (info.server, info.token, info.ca_data) == ("https://10.0.0.1:6443", "from-plugin",
                                                       b"CA")
    assert info.expiration == datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc)
    script.write_text("#!/bin/sh\necho 'denied' >&2\nexit 1\n")
    with pytest.raises(kopf.TemporaryError, match="exited with status 1: denied"):
        await handlers.login(memo=memo)  # asked again: the plugin runs again
