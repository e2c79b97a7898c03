"""The site agent's wire format, in one place for the agent and its client.

JSON in and out. Every answer is an object: the result on 200, ``{"error": ...}``
otherwise (401 no or wrong token, 400 a request not in this format, 409 an
operation the site refused, 500 a fault of the agent). Parsing is strict and
pure: a body or an answer that does not fit raises ``AgentWireError``, which the
agent turns into a 400 and the client into ``AgentUnreachable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cellplane_operator.errors import AgentWireError

__all__ = [
    "HEALTHZ", "DATABASE", "PRIMARY", "STANDBY", "PROMOTE", "DEMOTE", "FENCE", "READING",
    "REBUILD", "ROLES", "AgentEndpoint", "AgentStatus", "parse_object", "parse_epoch_request",
    "epoch_request", "parse_source_request", "source_request", "parse_restart",
    "parse_lsn_answer", "error_message",
]

HEALTHZ = "/healthz"
DATABASE = "/v1/database"
PRIMARY = "/v1/database/primary"
STANDBY = "/v1/database/standby"
PROMOTE = "/v1/database/promote"
DEMOTE = "/v1/database/demote"
FENCE = "/v1/database/fence"
READING = "/v1/database/reading"
REBUILD = "/v1/database/rebuild"

ROLES = frozenset({"primary", "standby", "fenced", "demoted"})
"""The database intents a site records (``sites/state.py``)."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where the operator reaches the site's Postgres: as the superuser, with the cell's
    password (never on the wire)."""

    host: str
    port: int
    dbname: str
    user: str

    def to_wire(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "dbname": self.dbname, "user": self.user}

    @classmethod
    def from_wire(cls, raw: object) -> AgentEndpoint:
        found = _object(raw, "an endpoint")
        return cls(host=_text(found, "host"), port=_port(found, "port"),
                   dbname=_text(found, "dbname"), user=_text(found, "user"))


@dataclass(frozen=True)
class AgentStatus:
    """``GET /v1/database``: the agent's record and what its Postgres says."""

    boot_id: str
    """Random per agent process: a change means the agent (the Pod) restarted."""
    role: str | None
    """The recorded intent: ``primary``, ``standby``, ``fenced``, ``demoted``; None: no
    database yet."""
    database_up: bool
    in_recovery: bool | None
    streaming: bool
    replay_lag_seconds: float | None
    replay_lsn: str | None
    receive_lsn: str | None
    restarted: tuple[str, ...]
    """``("postgres",)`` when this very call started a Postgres that had died."""
    epoch: int | None
    """The last epoch ``ensure_primary`` recorded; None if none ever was."""

    def to_wire(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "role": self.role, "database_up": self.database_up,
                "in_recovery": self.in_recovery, "streaming": self.streaming,
                "replay_lag_seconds": self.replay_lag_seconds, "replay_lsn": self.replay_lsn,
                "receive_lsn": self.receive_lsn, "restarted": list(self.restarted),
                "epoch": self.epoch}

    @classmethod
    def from_wire(cls, raw: object) -> AgentStatus:
        found = _object(raw, "a status")
        role = _optional(found, "role", str)
        if role is not None and role not in ROLES:
            raise AgentWireError(f"role {role!r} is none of {sorted(ROLES)}")
        restarted = found.get("restarted")
        if not isinstance(restarted, list) or not all(isinstance(r, str) for r in restarted):
            raise AgentWireError("restarted must be a list of strings")
        lag = found.get("replay_lag_seconds")
        if lag is not None and (isinstance(lag, bool) or not isinstance(lag, (int, float))):
            raise AgentWireError("replay_lag_seconds must be a number or null")
        return cls(
            boot_id=_text(found, "boot_id"), role=role,
            database_up=_required(found, "database_up", bool),
            in_recovery=_optional(found, "in_recovery", bool),
            streaming=_required(found, "streaming", bool),
            replay_lag_seconds=None if lag is None else float(lag),
            replay_lsn=_optional(found, "replay_lsn", str),
            receive_lsn=_optional(found, "receive_lsn", str),
            restarted=tuple(restarted), epoch=_optional_int(found, "epoch"))


# -- requests -------------------------------------------------------------------------------

def parse_object(body: bytes) -> dict[str, Any]:
    """A request body: one JSON object."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise AgentWireError(f"the body is not JSON: {error}") from None
    return _object(raw, "the body")


def epoch_request(epoch: int | None) -> dict[str, Any]:
    """``POST /v1/database/primary``."""
    return {"epoch": epoch}


def parse_epoch_request(body: bytes) -> int | None:
    found = parse_object(body)
    if "epoch" not in found:
        raise AgentWireError("epoch is missing (an integer, or null)")
    return _optional_int(found, "epoch")


def source_request(host: str, port: int) -> dict[str, Any]:
    """``POST /v1/database/standby`` and ``/rebuild``: the primary to copy and follow."""
    return {"primary": {"host": host, "port": port}}


def parse_source_request(body: bytes) -> tuple[str, int]:
    primary = _object(parse_object(body).get("primary"), "primary")
    return _text(primary, "host"), _port(primary, "port")


def parse_restart(value: str | None) -> bool:
    """``?restart=0|1`` (absent: 0, touch nothing)."""
    if value in (None, "0"):
        return False
    if value == "1":
        return True
    raise AgentWireError(f"restart must be 0 or 1, not {value!r}")


def parse_lsn_answer(raw: object) -> str:
    """``POST /v1/database/demote``'s answer: ``{"lsn": "0/3000028"}``."""
    lsn = _text(_object(raw, "a demote answer"), "lsn")
    high, slash, low = lsn.partition("/")
    try:
        int(high, 16), int(low, 16)
    except ValueError:
        slash = ""
    if not slash:
        raise AgentWireError(f"{lsn!r} is not a WAL location")
    return lsn


def error_message(raw: object) -> str | None:
    """The ``error`` of an answer, when it has one."""
    if isinstance(raw, dict) and isinstance(raw.get("error"), str):
        return str(raw["error"])
    return None


# -- fields -------------------------------------------------------------------------------

def _object(raw: object, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise AgentWireError(f"{what} must be a JSON object")
    return raw


def _required(found: dict[str, Any], key: str, kind: type[Any]) -> Any:
    value = found.get(key)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise AgentWireError(f"{key} must be a {kind.__name__}")
    return value


def _optional(found: dict[str, Any], key: str, kind: type[Any]) -> Any:
    return None if found.get(key) is None else _required(found, key, kind)


def _optional_int(found: dict[str, Any], key: str) -> int | None:
    value = _optional(found, key, int)
    return None if value is None else int(value)


def _text(found: dict[str, Any], key: str) -> str:
    value = _required(found, key, str)
    if not value:
        raise AgentWireError(f"{key} must not be empty")
    return str(value)


def _port(found: dict[str, Any], key: str) -> int:
    value = int(_required(found, key, int))
    if not 0 < value < 65536:
        raise AgentWireError(f"{key} {value} is not a TCP port")
    return value
