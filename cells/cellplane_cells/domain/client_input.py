"""What a cell takes from a client before any of it reaches a handler or the database.

One rule for each part of a request, shared by both cell APIs and the edge
router, so no route can forget one:

- a body is JSON the database can store: UTF-8, finite numbers (no ``NaN``,
  ``Infinity``, nor ``1e400``, which Python reads as infinity), no NUL and no
  lone surrogate in any string or key (Postgres refuses both), bounded nesting;
- a path or query value holds no control character;
- a credential is ``Authorization: Bearer <token>`` (the scheme in any case, as
  RFC 9110 says), nothing else;
- the tenant API's routes are the ones in ``TENANT_API_ROUTES``: the router
  forwards those and nothing else (a cell's OpenAPI and docs stay its own).

Pure: the API adapters and the router turn each refusal into its 4xx answer.
"""

from __future__ import annotations

import enum
import json
import math
import re
from typing import Any

__all__ = ["TENANT_API_ROUTES", "TENANT_BODY_LIMIT_BYTES", "MAX_JSON_DEPTH", "MAX_PAYLOAD_DEPTH",
           "INVALID_KEY_MESSAGE", "loads_storable",
           "json_depth", "has_control_character", "bearer_token", "RouteMatch",
           "match_tenant_route"]

TENANT_BODY_LIMIT_BYTES = 256 * 1024
"""The largest body the tenant API reads (the router refuses larger ones before reading)."""

MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects a body may have: far beyond what any route
needs, and well inside what the parser and Postgres' jsonb handle."""

MAX_PAYLOAD_DEPTH = 64
"""Deepest nesting of a job's payload: below ``MAX_JSON_DEPTH``, so the payload still
fits the bound where an export or a move's batch carries it a few levels deeper."""

INVALID_KEY_MESSAGE = "unknown API key"
"""The 401's message for a key of no tenant and for a wrong secret alike, at the cell and
at the router: the answer never tells whether a tenant id exists."""

TENANT_API_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("POST", "/v1/jobs/{job_id}:cancel"),
    ("POST", "/v1/schedules"),
    ("GET", "/v1/schedules"),
    ("GET", "/v1/schedules/{schedule_id}"),
    ("PUT", "/v1/schedules/{schedule_id}"),
    ("POST", "/v1/schedules/{schedule_id}:pause"),
    ("POST", "/v1/schedules/{schedule_id}:resume"),
    ("POST", "/v1/schedules/{schedule_id}:cancel"),
    ("GET", "/v1/schedules/{schedule_id}/runs"),
)
"""(method, path template) of every tenant API route; a test holds the app to it."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control_character(text: str) -> bool:
    return _CONTROL.search(text) is not None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large to store")
    return value


def _storable_text(text: str) -> str | None:
    """Why Postgres could not store ``text``, or None."""
    if "\x00" in text:
        return "a string holds the NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a string holds a lone UTF-16 surrogate"
    return None


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value: 0 for a scalar, 1 for a flat array or object."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _unstorable(value: Any) -> str | None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = _storable_text(item)
            if problem is not None:
                return problem
        elif isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return f"the document nests deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(item, list):
                stack.extend((child, depth + 1) for child in item)
                continue
            for key, child in item.items():
                problem = _storable_text(key)
                if problem is not None:
                    return problem
                stack.append((child, depth + 1))
    return None


def loads_storable(raw: bytes | str) -> Any:
    """The JSON value of ``raw``, if the database can store all of it.

    Raises ``json.JSONDecodeError`` (the message says why) for anything else,
    including what the standard parser accepts and Postgres does not.
    """
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise json.JSONDecodeError("the body is not UTF-8", "", error.start) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError(f"the document nests deeper than {MAX_JSON_DEPTH} levels",
                                   "", 0) from None
    except ValueError as error:
        # A NaN or Infinity constant, a float past the double range, an integer of
        # more digits than Python converts.
        raise json.JSONDecodeError(str(error), "", 0) from None
    problem = _unstorable(value)
    if problem is not None:
        raise json.JSONDecodeError(problem, "", 0)
    return value


def bearer_token(authorization: str | None) -> str | None:
    """The token of ``Bearer <token>``; None for any other header (or none)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip(" ")
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


class RouteMatch(enum.Enum):
    ROUTE = "route"
    """A tenant API route: forward it."""
    WRONG_METHOD = "wrong_method"
    """A tenant API path with a method it does not take: 405."""
    NO_ROUTE = "no_route"
    """Not a tenant API path (a cell's docs, a dot segment, an empty id): 404."""


def _segments_match(template: str, path: str) -> bool:
    wanted, given = template.split("/"), path.split("/")
    if len(wanted) != len(given):
        return False
    for want, got in zip(wanted, given):
        if got in (".", ".."):
            return False
        if "{" not in want:
            if want != got:
                return False
            continue
        suffix = want[want.index("}") + 1:]
        if not got.endswith(suffix) or len(got) == len(suffix):
            return False
    return True


def match_tenant_route(method: str, path: str) -> RouteMatch:
    """Whether the (percent-decoded) ``path`` is one of the tenant API's routes.

    A job id is any non-empty segment but ``.`` and ``..``: the cell answers
    404 for an id that is no job, as it does for another tenant's."""
    matching = [m for m, template in TENANT_API_ROUTES if _segments_match(template, path)]
    if not matching:
        return RouteMatch.NO_ROUTE
    # GET /v1/jobs/x:cancel matches {job_id} too; the method decides.
    return RouteMatch.ROUTE if method.upper() in matching else RouteMatch.WRONG_METHOD
