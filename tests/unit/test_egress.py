"""The cell's outgoing HTTP client (egress.py): the address connected to is the address judged.

The network under the guard is httpcore's in-memory twin, extended to record
where each connection went, what was written to it and the TLS server name;
no socket is opened. The resolver is a fake that can answer differently each
time it is asked, as a rebinding DNS server would.
"""

from __future__ import annotations

import ssl
import typing

import httpcore
import httpx
import pytest

from cellplane_cells.egress import EgressRefused, GuardedBackend, guarded_client

OK_ANSWER = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]


class RecordingStream(httpcore.AsyncMockStream):
    def __init__(self, buffer: list[bytes], log: dict[str, typing.Any]) -> None:
        super().__init__(buffer)
        self._log = log

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._log.setdefault("sent", b"")
        self._log["sent"] += buffer

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        self._log["server_hostname"] = server_hostname
        return self


class RecordingNetwork(httpcore.AsyncMockBackend):
    def __init__(self, answer: list[bytes]) -> None:
        super().__init__(answer)
        self.connections: list[dict[str, typing.Any]] = []

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        log: dict[str, typing.Any] = {"host": host, "port": port}
        self.connections.append(log)
        return RecordingStream(list(self._buffer), log)


class Rebinding:
    """Answers each question with the next of its answers: public first, then private."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


async def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    network = RecordingNetwork(OK_ANSWER)
    dns = Rebinding(["93.184.216.34"], ["127.0.0.1"])
    async with guarded_client(allow_private=False, resolve=dns, inner=network) as client:
        response = await client.post("https://hooks.example:8443/run", content=b"{}")
    assert response.status_code == 200
    # Resolved once, connected to that answer; the second (rebound) answer never asked.
    assert dns.asked == ["hooks.example"]
    [connection] = network.connections
    assert (connection["host"], connection["port"]) == ("93.184.216.34", 8443)
    # TLS and HTTP still name the URL's host.
    assert connection["server_hostname"] == "hooks.example"
    assert b"\r\nHost: hooks.example:8443\r\n" in connection["sent"]


async def test_a_name_that_resolves_to_the_platform_is_refused_before_any_connection() -> None:
    network = RecordingNetwork(OK_ANSWER)
    dns = Rebinding(["127.0.0.1"])
    async with guarded_client(allow_private=False, resolve=dns, inner=network) as client:
        with pytest.raises(EgressRefused, match="127.0.0.1"):
            await client.post("http://rebound.example/run", content=b"{}")
    assert network.connections == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/", "http://[2002:7f00:1::]/",
                                 "http://[::ffff:169.254.169.254]/", "http://2130706433/",
                                 "http://0x7f.1/", "http://[64:ff9b::a9fe:a9fe]/"])
async def test_literal_addresses_are_judged_without_a_resolver(url: str) -> None:
    network = RecordingNetwork(OK_ANSWER)

    async def no_dns(host: str, port: int) -> list[str]:
        raise AssertionError(f"{host} needs no resolver")

    async with guarded_client(allow_private=False, resolve=no_dns, inner=network) as client:
        with pytest.raises(EgressRefused):
            await client.get(url)
    assert network.connections == []


async def test_development_mode_allows_loopback_but_never_metadata() -> None:
    network = RecordingNetwork(OK_ANSWER)
    dns = Rebinding(["169.254.169.254"])
    async with guarded_client(allow_private=True, resolve=dns, inner=network) as client:
        assert (await client.get("http://127.0.0.1:8080/")).status_code == 200
        with pytest.raises(EgressRefused, match="169.254.169.254"):
            await client.get("http://metadata-alias.example/")
    assert [c["host"] for c in network.connections] == ["127.0.0.1"]


async def test_redirects_are_answers_not_followed() -> None:
    redirect = [b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest\r\n"
                b"Content-Length: 0\r\n\r\n"]
    network = RecordingNetwork(redirect)
    dns = Rebinding(["93.184.216.34"])
    async with guarded_client(allow_private=False, resolve=dns, inner=network) as client:
        response = await client.post("http://hooks.example/run", content=b"{}")
    assert response.status_code == 302
    assert [c["host"] for c in network.connections] == ["93.184.216.34"]


async def test_a_proxy_in_the_environment_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy would resolve and connect on the cell's behalf, past the check.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://10.9.9.9:3128")
    network = RecordingNetwork(OK_ANSWER)
    async with guarded_client(allow_private=False, resolve=Rebinding(["93.184.216.34"]),
                              inner=network) as client:
        await client.get("http://hooks.example/")
    assert [c["host"] for c in network.connections] == ["93.184.216.34"]


async def test_every_address_must_pass_and_a_refusal_is_a_connect_error() -> None:
    backend = GuardedBackend(allow_private=False,
                             resolve=Rebinding(["93.184.216.34", "10.0.0.7"]),
                             inner=RecordingNetwork(OK_ANSWER))
    with pytest.raises(EgressRefused, match="10.0.0.7") as refused:
        await backend.connect_tcp("mixed.example", 80)
    # Callers that know only httpx treat it as a failed connection.
    assert isinstance(refused.value, httpx.ConnectError)
    with pytest.raises(EgressRefused, match="unix sockets"):
        await backend.connect_unix_socket("/run/postgresql/.s.PGSQL.5432")
