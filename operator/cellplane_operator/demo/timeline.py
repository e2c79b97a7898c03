"""The demo's timeline, and its one way of waiting: for a condition, saying how things stand.

Every slow step of the demo is a condition polled with a timeout, never a sleep:
its state is said when it changes (at most every few seconds) and regardless
every ten, so a newcomer always sees what the demo waits for and why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import IO

from cellplane_operator.demo.summary import timeline_line
from cellplane_operator.errors import CellplaneError

__all__ = ["DemoFailed", "Timeline", "await_condition", "counts_grown"]

_HEARTBEAT_SECONDS = 10.0
_CHANGE_SECONDS = 2.0
"""A change is said at most this often, so a fast-moving count does not flood the timeline."""
_POLL_SECONDS = 0.5


class DemoFailed(CellplaneError):
    """A step of the demo did not happen in time, or a process it needs died."""


class Timeline:
    """``[demo  12.3s] ...`` lines on one stream, flushed at once."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.started = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str) -> None:
        self.write(timeline_line(self.elapsed, message) + "\n")

    def block(self, text: str) -> None:
        """Command output, indented under the line that announced it."""
        self.write("".join(f"    {line}\n" for line in text.rstrip().splitlines()))

    def write(self, text: str) -> None:
        # A reader that went away (`cellplane demo | head`) must not stop the demo halfway
        # or, worse, its cleanup: the timeline just goes quiet.
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            self.stream = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the run)


def await_condition(timeline: Timeline, what: str, check: Callable[[], tuple[bool, str]], *,
                timeout: float, alive: Callable[[], None], hint: str = "",
                quiet: bool = False) -> None:
    """Polls ``check`` (done, how things stand) until done; says how things stand when
    that changes and every few seconds regardless, and fails after ``timeout``, or at
    once when one of the demo's processes died."""
    started = time.monotonic()
    last_said, last_state = started - _HEARTBEAT_SECONDS, ""
    if not quiet:
        timeline.say(f"waiting for {what}")
    while True:
        alive()
        done, state = check()
        now = time.monotonic()
        if done:
            if not quiet:
                timeline.say(f"  done in {now - started:.1f} s: {state}")
            return
        if not quiet and ((state != last_state and now - last_said >= _CHANGE_SECONDS)
                          or now - last_said >= _HEARTBEAT_SECONDS):
            timeline.say(f"  {now - started:5.1f} s  {state}")
            last_said, last_state = now, state
        if now - started >= timeout:
            raise DemoFailed(f"timed out after {timeout:.0f} s waiting for {what} "
                             f"(last: {state}){hint}")
        time.sleep(_POLL_SECONDS)


def counts_grown(count: Callable[[str], int],
                 wanted: Mapping[str, int]) -> Callable[[], tuple[bool, str]]:
    """A condition for ``await_condition``: each name's ``count`` grew by what ``wanted``
    says from now on (say, acknowledged jobs of each tenant)."""
    base = {name: count(name) for name in wanted}

    def check() -> tuple[bool, str]:
        got = {name: count(name) - base[name] for name in wanted}
        return all(got[n] >= wanted[n] for n in wanted), " ".join(
            f"{n} {min(got[n], wanted[n])}/{wanted[n]}" for n in sorted(wanted))

    return check
