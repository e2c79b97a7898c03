"""The site agent's pure parts: its wire format (``sites/agent_wire.py``), its flags, its
token file, and the network settings that keep the local driver's Postgres exactly as it
was while a Pod's listens everywhere with SCRAM only. No process, no database."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_operator.domain.site_objects import (
    KubernetesSite, ServingRole, SiteSecrets, agent_argv, pod_host,
)
from cellplane_operator.errors import AgentWireError, CellplaneError
from cellplane_operator.localplane.pgauth import SCRAM_HBA, scram_hba
from cellplane_operator.sites import agent_wire as wire
from cellplane_operator.commands.agent import add_site_commands, parse_listen
from cellplane_operator.sites.agent_http import TokenFile
from cellplane_operator.sites.agent_wire import AgentEndpoint, AgentStatus
from cellplane_operator.sites.database import READING_HBA, SiteNetwork, reading_tcp_hba

STATUS = AgentStatus(boot_id="b1", role="standby", database_up=True, in_recovery=True,
                     streaming=True, replay_lag_seconds=0.5, replay_lsn="0/3000028",
                     receive_lsn="0/3000100", restarted=("postgres",), epoch=4)


def test_status_and_endpoint_round_trip() -> None:
    assert AgentStatus.from_wire(STATUS.to_wire()) == STATUS
    endpoint = AgentEndpoint("db.ns.svc.cluster.local", 5432, "cellplane", "postgres")
    assert AgentEndpoint.from_wire(endpoint.to_wire()) == endpoint
    empty = AgentStatus(boot_id="b", role=None, database_up=False, in_recovery=None,
                        streaming=False, replay_lag_seconds=None, replay_lsn=None,
                        receive_lsn=None, restarted=(), epoch=None)
    assert AgentStatus.from_wire(empty.to_wire()) == empty


@pytest.mark.parametrize("change", [
    {"role": "leader"}, {"database_up": 1}, {"streaming": None}, {"restarted": "postgres"},
    {"epoch": "4"}, {"epoch": True}, {"replay_lag_seconds": "1"}, {"boot_id": ""},
])
def test_status_outside_the_format_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(AgentWireError):
        AgentStatus.from_wire({**STATUS.to_wire(), **change})


@pytest.mark.parametrize("body", [
    b"", b"{", b"\xff", b"[]", b"null", b"{}", b'{"epoch": "1"}', b'{"epoch": 1.5}',
    b'{"epoch": false}',
])
def test_bad_epoch_requests(body: bytes) -> None:
    with pytest.raises(AgentWireError):
        wire.parse_epoch_request(body)


def test_epoch_requests() -> None:
    assert wire.parse_epoch_request(b'{"epoch": null}') is None
    assert wire.parse_epoch_request(b'{"epoch": 12}') == 12


@pytest.mark.parametrize("body", [
    b"{}", b'{"primary": null}', b'{"primary": {"host": "h"}}',
    b'{"primary": {"port": 5432}}', b'{"primary": {"host": "", "port": 5432}}',
    b'{"primary": {"host": "h", "port": 70000}}', b'{"primary": {"host": "h", "port": "5432"}}',
    b'{"primary": {"host": 1, "port": 5432}}',
])
def test_bad_source_requests(body: bytes) -> None:
    with pytest.raises(AgentWireError):
        wire.parse_source_request(body)


@given(host=st.text(min_size=1, max_size=40), port=st.integers(1, 65535))
def test_source_requests_round_trip(host: str, port: int) -> None:
    import json

    body = json.dumps(wire.source_request(host, port)).encode()
    assert wire.parse_source_request(body) == (host, port)


def test_restart_and_lsn() -> None:
    assert wire.parse_restart(None) is False
    assert wire.parse_restart("0") is False
    assert wire.parse_restart("1") is True
    with pytest.raises(AgentWireError):
        wire.parse_restart("true")
    assert wire.parse_lsn_answer({"lsn": "0/3000028"}) == "0/3000028"
    bad_answers: list[object] = [{"lsn": "3000028"}, {"lsn": "0/xyz"}, {}, []]
    for bad in bad_answers:
        with pytest.raises(AgentWireError):
            wire.parse_lsn_answer(bad)
    assert wire.error_message({"error": "no"}) == "no"
    assert wire.error_message({"detail": "no"}) is None


def test_listen_flag() -> None:
    assert parse_listen("0.0.0.0:9443") == ("0.0.0.0", 9443)
    assert parse_listen("[::]:9443") == ("::", 9443)
    for bad in ("9443", ":9443", "host:", "host:x", "host:70000"):
        with pytest.raises(CellplaneError):
            parse_listen(bad)


def test_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    tokens = TokenFile(path)
    assert not tokens.admits("Bearer anything")  # no file: nobody
    path.write_text("first-token\n")
    assert tokens.admits("Bearer first-token")
    assert tokens.admits("bearer first-token")
    assert not tokens.admits("Bearer first")
    assert not tokens.admits("first-token")
    assert not tokens.admits(None)
    path.write_text("second-token-longer\n")
    assert tokens.admits("Bearer second-token-longer")
    assert not tokens.admits("Bearer first-token")
    path.write_text("")
    assert not tokens.admits("Bearer ")


def test_the_local_network_keeps_todays_postgres() -> None:
    local = SiteNetwork()
    assert local.is_local and local.server_settings() == [] and local.hba == SCRAM_HBA
    assert scram_hba() is SCRAM_HBA


def test_a_pods_network_admits_everyone_with_scram_only() -> None:
    pod = SiteNetwork(listen_addresses="*", advertised_host="db.ns.svc",
                      client_networks=("0.0.0.0/0", "::/0"),
                      socket_dir=Path("/var/run/postgresql"), reading_port=5433)
    assert not pod.is_local
    assert pod.server_settings() == [("listen_addresses", "*"),
                                     ("unix_socket_directories", '"/var/run/postgresql"')]
    rules = [line.split() for line in pod.hba.splitlines() if not line.startswith("#")]
    assert {rule[-1] for rule in rules} == {"scram-sha-256"}
    assert {(rule[1], rule[3]) for rule in rules} == {
        ("all", "0.0.0.0/0"), ("all", "::/0"),
        ("replication", "0.0.0.0/0"), ("replication", "::/0")}
    reading = [line.split() for line in reading_tcp_hba(pod.client_networks).splitlines()
               if line.strip() and not line.startswith("#")]
    assert reading[0] == ["local", "all", "all", "trust"]
    assert {tuple(rule) for rule in reading[1:]} == {
        ("host", "all", "postgres", "0.0.0.0/0", "scram-sha-256"),
        ("host", "all", "postgres", "::/0", "scram-sha-256")}
    assert reading_tcp_hba(pod.client_networks).startswith(READING_HBA)


def test_the_pods_command_line_is_the_agents() -> None:
    """``agent_argv`` (the StatefulSet's command) parses with the agent's own flags."""
    site = KubernetesSite(cell="c1", cell_uid="uid", region="region-a", role=ServingRole.ACTIVE,
                          epoch=4, image="img", namespace="ns", secrets=SiteSecrets.for_cell("c1"))
    parser = argparse.ArgumentParser(prog="cellplane")
    add_site_commands(parser.add_subparsers())
    argv = agent_argv(site)
    assert argv[:3] == ["cellplane", "site", "agent"]
    args = parser.parse_args(argv[1:])
    assert (args.cell, args.region, args.postgres_port, args.reading_port) == (
        "c1", "region-a", 5432, 5433)
    assert args.advertise_host == pod_host(site)
    assert parse_listen(args.listen) == ("0.0.0.0", 9443)
    assert args.postgres_listen == "*"
