"""A discrete-event simulation, in true time, of the placement-group lease.

It runs the pure rule of ``cellplane_operator.domain.ownership`` against one
etcd, N candidate processes and one cell database, each with its own clock,
with message delays, process pauses, deaths, partitions and etcd outages.
Every decision a process takes comes from the pure functions (``observe``,
``ready_to_acquire``, ``acquired``, ``lost_race``, ``renewed``, ``may_act``,
``database_grant``, ``must_self_fence``, ``self_fenced``); the harness only
moves messages, keeps true time and records what happened, so the tests can
judge it. It never compares two clocks to decide anything.

What is modelled:

- **True time** ``t`` drives a priority queue of events. A clock reads
  ``offset + (1 + rate) * (t - stopped)``; ``stopped`` is the true time spent
  in windows where that clock stood still (a suspended VM whose
  CLOCK_MONOTONIC does not count the suspend; only the fault tests use it).
- **etcd** is one linearizable store that answers each request at the true
  instant it arrives: a read of the owner key and the epoch key, a lease grant,
  the acquiring transaction (the epoch is the one the candidate last saw, the
  owner key is absent and the lease alive -> epoch + 1 and the owner key
  attached to the lease), and keep-alives. A lease ends TTL seconds, on etcd's
  own clock (with its own rate), after the last grant or keep-alive etcd
  *received*; the owner key is deleted ``revoke_lag`` later, and watchers are
  told (after a one-way delay). A keep-alive of an ended lease answers TTL 0.
  Member loss is an outage window: requests arriving in it are dropped or held
  until it ends, no lease ends in it, and at its end (a new leader) every lease
  still alive is renewed for a full TTL, as etcd's lessor does on promotion.
- **Processes** run one read -> (grant -> transaction) round at a time: they
  read every ``poll_interval``, and every ``margin / 5`` (at most) while they
  wait out the margin; a deletion event from the watch starts a round at once.
  A lost request or answer (partition, outage) is noticed after one renew
  interval; a lost transaction counts as a lost race. An owner renews every
  ``renew_interval`` (the answer counts for its own lease only), sends the
  database a grant after acquiring and after each acknowledged renewal, and
  every ``act_interval`` checks ``must_self_fence`` and ``may_act``: acting is
  recorded at that true instant and a write stamped with the epoch goes to the
  database. A paused process handles nothing until the pause ends (its
  messages wait, its clock runs); if it could act when the pause began, it
  sends the write it had decided on as soon as it resumes, without asking
  again (a stale belief). A dead process stops forever; what it sent still
  arrives. Whether a process is acting is only ever asked of ``may_act``: at
  each instant it could start (acquiring, an acknowledged renewal) the others
  are asked too, and at each act, which is exact as long as, for one state,
  ``may_act`` stays false once false as the clock runs.
- **The database** holds an epoch and a deadline on its own clock, like
  ``cellplane_grant`` and the ``cellplane_guard`` trigger of migration 0002: a
  grant with an epoch below the current one is refused, otherwise it sets the
  epoch and ``deadline = db_now + max(remaining, 0)``; a write is accepted only
  when its epoch equals the current one and ``db_now < deadline``.

What is not modelled: several etcd members with their own views (etcd is
linearizable, so one store stands for the cluster; member loss only delays or
drops requests), clock steps (monotonic clocks drift, or stop in the fault
tests; the database's ``clock_timestamp()`` is wall time in reality), a
planned release, the database's own unavailability, the cell's standby
promotion and replication, and more than one placement group.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cellplane_operator.domain.ownership import (
    LeaseSettings, LeaseState, OwnerRecord, Role, acquired, database_grant, lost_race, may_act,
    must_self_fence, observe, ready_to_acquire, renewed, self_fenced,
)

__all__ = ["Clock", "Scenario", "Trace", "DbWrite", "simulate", "random_scenario",
           "safe_rate_skew", "safe_grant_delay"]

NEVER = math.inf


def safe_rate_skew(settings: LeaseSettings, *, wait: float) -> float:
    """The largest |rate skew| of every clock for which acting never overlaps.

    ``wait`` is how long, on its own clock, a new owner is guaranteed to wait
    after the previous owner's key vanished from etcd before it acts: the
    margin by the rule (DESIGN.md), 0 for what ownership.py ensures today (see
    ``test_ownership_simulation.py``).

    The owner's last acknowledged renewal (or lease grant) was sent at true
    time s. It acts until its own clock has run ``ttl - margin`` from s: at the
    latest ``s + (ttl - margin) / (1 - rho)``. etcd received that request at or
    after s and ends the lease ``ttl`` later on etcd's clock, at the earliest
    ``s + ttl / (1 + rho)``; the next owner's transaction needs the key gone,
    and then it waits ``wait`` on its clock, at least ``wait / (1 + rho)``. No
    overlap iff ``(ttl - margin) / (1 - rho) <= (ttl + wait) / (1 + rho)``, i.e.
    ``rho <= (margin + wait) / (2 * ttl - margin + wait)``: ``margin / ttl`` by
    the rule, ``margin / (2 * ttl - margin)`` without the wait. Message delays
    and pauses do not appear: a delay only makes etcd's end later than the
    owner's, and a paused process's monotonic clock keeps running.
    """
    ttl, margin = settings.duration_seconds, settings.margin_seconds
    return (margin + wait) / (2 * ttl - margin + wait)


def safe_grant_delay(settings: LeaseSettings, rho: float, *, wait: float) -> float:
    """The longest time from computing ``database_grant`` to its arrival at the
    database (network delay plus any pause in between) for which every write the
    database accepts under epoch e arrives before any process acts under a later epoch.

    The grant computed at true g >= s (s as in ``safe_rate_skew``) asks for
    ``s + ttl - margin - g`` on the owner's clock; arriving d later, the
    database's deadline falls at most at ``s + d + (ttl - margin) / (1 - rho)``
    (the worst case is the slower of the owner's and the database's clocks).
    The next owner acts at the earliest ``s + (ttl + wait) / (1 + rho)``. So
    ``d <= (ttl + wait) / (1 + rho) - (ttl - margin) / (1 - rho)``: with the
    rule's wait, ``2 * margin`` without skew, and 0 at ``rho = margin / ttl``.
    """
    ttl, margin = settings.duration_seconds, settings.margin_seconds
    return (ttl + wait) / (1 + rho) - (ttl - margin) / (1 - rho)


@dataclass(frozen=True)
class Clock:
    """A monotonic clock: ``offset + (1 + rate) * (t - stopped(t))`` at true time t."""

    offset: float
    rate: float
    stops: tuple[tuple[float, float], ...] = ()
    """True-time windows in which this clock does not advance (sorted, disjoint)."""

    def at(self, t: float) -> float:
        if not self.stops:
            return self.offset + (1.0 + self.rate) * t
        stopped = 0.0
        for start, end in self.stops:
            if t <= start:
                break
            stopped += (t if t < end else end) - start
        return self.offset + (1.0 + self.rate) * (t - stopped)

    def span(self, local: float) -> float:
        """The true time it takes this clock to advance ``local`` seconds (outside stops)."""
        return local / (1.0 + self.rate)


@dataclass(frozen=True)
class Scenario:
    """One schedule: clocks, timings and faults. All times are true seconds unless noted."""

    settings: LeaseSettings
    clocks: tuple[Clock, ...]
    """One per process."""
    etcd_clock: Clock
    db_clock: Clock
    horizon: float
    poll_interval: float
    """Local seconds between the end of one observation round and the next read."""
    act_interval: float
    """Local seconds between two act attempts of an owner."""
    starts: tuple[float, ...]
    """When each process first reads the owner key."""
    etcd_delay: tuple[float, float]
    """Bounds of each one-way delay between a process and etcd (each drawn independently)."""
    grant_delay: tuple[float, float]
    """Bounds of the time from computing ``database_grant`` to its arrival at the database."""
    write_delay: tuple[float, float]
    slow_share: float = 0.0
    """Share of etcd messages and writes that are slow instead: delayed up to
    ``slow_etcd`` / ``slow_write``."""
    slow_etcd: float = 0.0
    slow_write: float = 0.0
    pauses: tuple[tuple[tuple[float, float], ...], ...] = ()
    """Per process: sorted, disjoint (start, end) windows in which it is paused."""
    deaths: tuple[float, ...] = ()
    """Per process: when it stops forever (inf: never)."""
    cut_off: tuple[tuple[tuple[float, float], ...], ...] = ()
    """Per process: windows in which its link to etcd is down and every message
    to or from etcd is lost. The process notices a lost read, lease grant or
    transaction after a timeout of one renew interval (a lost transaction
    counts as a lost race) and reads again."""
    outages: tuple[tuple[float, float, float], ...] = ()
    """etcd unavailable: sorted, disjoint (start, end, probability a request is dropped)."""
    revoke_lag: float = 0.0
    """How long after a lease ends etcd deletes its key."""
    seed: int = 0
    """Drives the per-message delays."""
    grant_delays: dict[tuple[int, int], float] = field(default_factory=dict, hash=False)
    """Exact delays for chosen grants, keyed by (process, n-th grant of that process)."""


class DbWrite(NamedTuple):
    """One write's arrival at the cell database."""

    t: float
    pid: int
    epoch: int
    accepted: bool
    db_epoch: int
    """The database's epoch when the write arrived."""
    db_now: float
    deadline: float
    """The database's deadline (its clock) when the write arrived."""
    stale: bool
    """Sent right after a pause, from a decision taken before it."""


@dataclass
class Trace:
    acting_starts: list[tuple[float, int, int]] = field(default_factory=list)
    """(t, pid, epoch): may_act became true for pid."""
    acts: list[tuple[float, int, int]] = field(default_factory=list)
    """(t, pid, epoch): pid acted (asked may_act, got True, sent a write)."""
    overlaps: list[tuple[float, int, int]] = field(default_factory=list)
    """(t, pid, other): pid was acting and so was the other process."""
    winners: dict[int, tuple[int, float]] = field(default_factory=dict)
    """epoch -> (pid, true time etcd committed the acquiring transaction)."""
    key_gone: dict[int, float] = field(default_factory=dict)
    """epoch -> true time etcd deleted that epoch's owner key (its lease ended)."""
    db_writes: list[DbWrite] = field(default_factory=list)
    db_grants: list[tuple[float, int, int, float, bool]] = field(default_factory=list)
    """(t, pid, epoch, remaining, applied)."""
    db_epochs: list[int] = field(default_factory=list)
    """The database's epoch after each grant arrived."""
    fenced: int = 0
    """Times a process left OWNER (self-fenced or saw its key gone)."""
    events: int = 0


# Event kinds. Process events (below _ETCD) wait while their process is paused.
(_READ_RESP, _GRANT_RESP, _CAS_RESP, _WATCH, _RENEW, _KA_RESP, _ACT, _STALE_WRITE, _TIMEOUT,
 _PAUSE) = range(1, 11)
_ANSWERS = (_READ_RESP, _GRANT_RESP, _CAS_RESP, _WATCH, _KA_RESP)
"""Messages from etcd: lost while the process's link to etcd is down."""
_ETCD, _E_READ, _E_GRANT, _E_CAS, _E_KA, _E_EXPIRE = range(20, 26)
_DB, _D_GRANT, _D_WRITE = range(30, 33)


class _Process:
    __slots__ = ("pid", "clock", "state", "pauses", "pause_idx", "death", "cut_off", "loop",
                 "acquiring", "acq_sent", "acq_expected", "lease", "gen", "grants")

    def __init__(self, pid: int, clock: Clock, pauses: tuple[tuple[float, float], ...],
                 death: float, cut_off: tuple[tuple[float, float], ...]) -> None:
        self.pid = pid
        self.clock = clock
        self.state = LeaseState()
        self.pauses = pauses
        self.pause_idx = 0
        self.death = death
        self.cut_off = cut_off
        self.loop = 0
        """Generation of the read -> acquire loop: answers to an abandoned round are dropped."""
        self.acquiring = False
        self.acq_sent = 0.0
        self.acq_expected = 0
        self.lease = 0
        self.gen = 0
        """Ownership generation: renew and act timers of an earlier ownership stop."""
        self.grants = 0

    def paused_until(self, t: float) -> float | None:
        """The end of the pause t falls in, if any (t never decreases between calls)."""
        pauses = self.pauses
        if not pauses:
            return None
        while self.pause_idx < len(pauses) and pauses[self.pause_idx][1] <= t:
            self.pause_idx += 1
        if self.pause_idx < len(pauses) and pauses[self.pause_idx][0] <= t:
            return pauses[self.pause_idx][1]
        return None

    def unreachable(self, t: float) -> bool:
        """Is this process's link to etcd down at t?"""
        for start, end in self.cut_off:
            if start <= t < end:
                return True
        return False


def simulate(sc: Scenario) -> Trace:
    """Runs one schedule to its horizon and returns what happened."""
    S = sc.settings
    ttl = S.duration_seconds
    rng = random.Random(sc.seed)
    uniform, draw = rng.uniform, rng.random
    e_lo, e_hi = sc.etcd_delay
    g_lo, g_hi = sc.grant_delay
    w_lo, w_hi = sc.write_delay
    slow_share, slow_etcd, slow_write = sc.slow_share, sc.slow_etcd, sc.slow_write

    def to_etcd() -> float:
        """One one-way delay between a process and etcd."""
        if slow_share and draw() < slow_share:
            return uniform(0.0, slow_etcd)
        return uniform(e_lo, e_hi)

    def to_db() -> float:
        if slow_share and draw() < slow_share:
            return uniform(0.0, slow_write)
        return uniform(w_lo, w_hi)

    trace = Trace()
    n = len(sc.clocks)
    procs = [_Process(i, sc.clocks[i], (sc.pauses or ((),) * n)[i],
                      (sc.deaths or (NEVER,) * n)[i], (sc.cut_off or ((),) * n)[i])
             for i in range(n)]
    timeout = S.renew_interval_seconds

    queue: list[tuple[float, int, int, int, Any]] = []
    seq = itertools.count()
    heappush, heappop = heapq.heappush, heapq.heappop

    def push(t: float, kind: int, pid: int, data: Any = None) -> None:
        heappush(queue, (t, next(seq), kind, pid, data))

    # The processes' side --------------------------------------------------------------

    def read(p: _Process, t: float) -> None:
        """Sends a read of the owner key at t, or when a pause around t ends."""
        for start, end in p.pauses:
            if start <= t < end:
                t = end
                break
        delay = to_etcd()  # drawn even for the dead: a death changes no other delay
        if t < p.death:
            push(t + delay, _E_READ, p.pid, p.loop)

    def after_observing(p: _Process, old: LeaseState, t: float, now: float) -> None:
        """Acquire if ready, else read again: soon while the wait runs, else after polling."""
        if old.role is Role.OWNER and p.state.role is not Role.OWNER:
            trace.fenced += 1
        elif must_self_fence(p.state, now=now, settings=S):
            leave_owner(p)
        if ready_to_acquire(p.state, now=now, settings=S):
            p.acquiring = True
            p.acq_sent = now
            p.acq_expected = p.state.epoch_seen
            push(t + to_etcd(), _E_GRANT, p.pid, p.loop)
        elif p.state.gone_since is not None:
            read(p, t + p.clock.span(min(sc.poll_interval, S.margin_seconds / 5)))
        else:
            read(p, t + p.clock.span(sc.poll_interval))

    def started(p: _Process, old: LeaseState, t: float, now: float) -> None:
        """Records an acting start when may_act turned true, and checks everybody else."""
        if may_act(old, now=now, settings=S) or not may_act(p.state, now=now, settings=S):
            return
        assert p.state.epoch is not None
        trace.acting_starts.append((t, p.pid, p.state.epoch))
        check_exclusive(p, t)

    def check_exclusive(p: _Process, t: float) -> None:
        for q in procs:
            if q is not p and t < q.death and may_act(q.state, now=q.clock.at(t), settings=S):
                trace.overlaps.append((t, p.pid, q.pid))

    def leave_owner(p: _Process) -> None:
        p.state = self_fenced(p.state)
        trace.fenced += 1

    def grant_db(p: _Process, t: float, now: float) -> None:
        remaining = database_grant(p.state, now=now, settings=S)
        assert p.state.epoch is not None
        delay = sc.grant_delays.get((p.pid, p.grants))
        p.grants += 1
        push(t + (uniform(g_lo, g_hi) if delay is None else delay), _D_GRANT, p.pid,
             (p.state.epoch, remaining))

    # etcd -------------------------------------------------------------------------------

    etcd_clock = sc.etcd_clock
    epoch_key = 0
    owner: OwnerRecord | None = None
    leases: dict[int, float] = {}  # lease id -> end on etcd's clock
    next_lease = 1
    outages = sc.outages
    outage_idx = 0  # outages before this one have been applied to the leases

    def arm() -> None:
        """Schedules the revocation of the owner key's lease at its current end."""
        if owner is not None:
            ends = leases[owner.lease_id]
            push((ends - etcd_clock.offset) / (1.0 + etcd_clock.rate) + sc.revoke_lag,
                 _E_EXPIRE, -1, None)

    def etcd_advance(t: float) -> bool:
        """Applies lease ends and leader changes up to true time t; True if the key went."""
        nonlocal outage_idx
        gone = False
        while outage_idx < len(outages) and outages[outage_idx][0] <= t:
            start, end, _ = outages[outage_idx]
            outage_idx += 1
            gone = expire(start) or gone
            # A new leader renews every lease still alive for a full TTL.
            at_start, at_end = etcd_clock.at(start), etcd_clock.at(end)
            for lid, ends in leases.items():
                if ends > at_start:
                    leases[lid] = at_end + ttl
            arm()
        return expire(t) or gone

    def expire(t: float) -> bool:
        nonlocal owner
        if owner is None or leases[owner.lease_id] > etcd_clock.at(t - sc.revoke_lag):
            return False
        ends = leases[owner.lease_id]
        trace.key_gone[owner.epoch] = ((ends - etcd_clock.offset) / (1.0 + etcd_clock.rate)
                                       + sc.revoke_lag)
        owner = None
        return True

    def notify(t: float) -> None:
        """Watchers learn that the owner key was deleted (under the current epoch)."""
        for q in procs:
            delay = to_etcd()
            if t < q.death:
                push(t + delay, _WATCH, q.pid, epoch_key)

    def in_outage(t: float) -> tuple[float, float] | None:
        for start, end, drop in outages:
            if start <= t < end:
                return end, drop
            if start > t:
                break
        return None

    # the cell database ------------------------------------------------------------------

    db_clock = sc.db_clock
    db_epoch = 0
    db_deadline = -NEVER

    for p in procs:
        read(p, sc.starts[p.pid])
        for start, end in p.pauses:
            push(start, _PAUSE, p.pid, end)

    while queue:
        t, _, kind, pid, data = heappop(queue)
        if t > sc.horizon:
            break
        trace.events += 1
        if kind < _ETCD:
            p = procs[pid]
            if t >= p.death:
                continue
            if kind == _PAUSE:
                if may_act(p.state, now=p.clock.at(t), settings=S):
                    # It was about to write; it will, as soon as it resumes.
                    push(data, _STALE_WRITE, pid, p.state.epoch)
                continue
            if kind in _ANSWERS and p.unreachable(t):
                if kind != _KA_RESP and kind != _WATCH:
                    push(t + timeout, _TIMEOUT, pid, p.loop)
                continue
            resume = p.paused_until(t)
            if resume is not None:
                push(resume, kind, pid, data)
                continue
            now = p.clock.at(t)
            state = p.state
            if kind == _READ_RESP:
                seen_owner, seen_epoch, loop = data
                if loop == p.loop:
                    p.state = observe(state, owner=seen_owner, epoch=seen_epoch, now=now)
                    after_observing(p, state, t, now)
            elif kind == _WATCH:
                # A deletion older than what this process has seen is no news (revisions).
                if not p.acquiring and data >= state.epoch_seen:
                    p.state = observe(state, owner=None, epoch=data, now=now)
                    if p.state.gone_since == now or ready_to_acquire(p.state, now=now,
                                                                     settings=S):
                        p.loop += 1  # the round in progress is abandoned
                        after_observing(p, state, t, now)
            elif kind == _GRANT_RESP:
                p.lease, loop = data
                if loop == p.loop:
                    push(t + to_etcd(), _E_CAS, pid, (p.acq_expected, p.lease, p.loop))
            elif kind == _CAS_RESP:
                won, loop = data
                if loop != p.loop:
                    continue
                p.acquiring = False
                if won:
                    p.state = acquired(state, epoch=p.acq_expected + 1, lease_id=p.lease,
                                       sent_at=p.acq_sent, ttl=ttl)
                    p.gen += 1
                    push(t + p.clock.span(S.renew_interval_seconds), _RENEW, pid, p.gen)
                    push(t, _ACT, pid, p.gen)
                    if may_act(p.state, now=now, settings=S):
                        grant_db(p, t, now)
                    started(p, state, t, now)
                else:
                    p.state = lost_race(state)
                read(p, t + p.clock.span(sc.poll_interval))
            elif kind == _TIMEOUT:
                if data == p.loop:
                    if p.acquiring:
                        p.acquiring = False
                        p.state = lost_race(state)
                    read(p, t)
            elif kind == _RENEW:
                if data != p.gen or state.role is not Role.OWNER:
                    continue
                if must_self_fence(state, now=now, settings=S):
                    leave_owner(p)
                    continue
                push(t + to_etcd(), _E_KA, pid, (state.lease_id, now))
                push(t + p.clock.span(S.renew_interval_seconds), _RENEW, pid, p.gen)
            elif kind == _KA_RESP:
                lease_id, sent_at, granted = data
                # A keep-alive stream belongs to one lease.
                if state.role is not Role.OWNER or lease_id != state.lease_id:
                    continue
                p.state = renewed(state, sent_at=sent_at, ttl=granted)
                if must_self_fence(p.state, now=now, settings=S):
                    leave_owner(p)
                    continue
                grant_db(p, t, now)
                started(p, state, t, now)
            elif kind == _ACT:
                if data != p.gen or state.role is not Role.OWNER:
                    continue
                if must_self_fence(state, now=now, settings=S):
                    leave_owner(p)
                    continue
                if may_act(state, now=now, settings=S):
                    assert state.epoch is not None
                    trace.acts.append((t, pid, state.epoch))
                    check_exclusive(p, t)
                    push(t + to_db(), _D_WRITE, pid, (state.epoch, False))
                push(t + p.clock.span(sc.act_interval), _ACT, pid, p.gen)
            else:  # the write decided before a pause
                push(t + to_db(), _D_WRITE, pid, (data, True))
        elif kind < _DB:
            if kind == _E_EXPIRE:
                # Only a leader revokes; after an outage the new one renewed the lease.
                if in_outage(t) is None and etcd_advance(t):
                    notify(t)
                continue
            blocked = in_outage(t)
            if blocked is not None and draw() >= blocked[1]:
                push(blocked[0], kind, pid, data)
                continue
            if blocked is not None or procs[pid].unreachable(t):
                if kind != _E_KA:
                    push(t + timeout, _TIMEOUT, pid, data if kind != _E_CAS else data[2])
                continue
            if etcd_advance(t):
                notify(t)
            back = t + to_etcd()
            if kind == _E_READ:
                push(back, _READ_RESP, pid, (owner, epoch_key, data))
            elif kind == _E_GRANT:
                leases[next_lease] = etcd_clock.at(t) + ttl
                push(back, _GRANT_RESP, pid, (next_lease, data))
                next_lease += 1
            elif kind == _E_CAS:
                expected, lease_id, loop = data
                won = (epoch_key == expected and owner is None
                       and leases[lease_id] > etcd_clock.at(t))
                if won:
                    epoch_key += 1
                    owner = OwnerRecord(region=f"region-{pid}", site=f"site-{pid}",
                                        epoch=epoch_key, lease_id=lease_id)
                    trace.winners[epoch_key] = (pid, t)
                    arm()
                push(back, _CAS_RESP, pid, (won, loop))
            else:  # keep-alive
                lease_id, sent_at = data
                alive = leases[lease_id] > etcd_clock.at(t)
                if alive:
                    leases[lease_id] = etcd_clock.at(t) + ttl
                    if owner is not None and owner.lease_id == lease_id:
                        arm()
                push(back, _KA_RESP, pid, (lease_id, sent_at, ttl if alive else 0))
        elif kind == _D_GRANT:
            epoch, remaining = data
            applied = epoch >= db_epoch
            if applied:
                db_epoch = epoch
                db_deadline = db_clock.at(t) + max(remaining, 0.0)
            trace.db_grants.append((t, pid, epoch, remaining, applied))
            trace.db_epochs.append(db_epoch)
        else:  # database write
            epoch, stale = data
            db_now = db_clock.at(t)
            trace.db_writes.append(DbWrite(
                t=t, pid=pid, epoch=epoch, accepted=epoch == db_epoch and db_now < db_deadline,
                db_epoch=db_epoch, db_now=db_now, deadline=db_deadline, stale=stale))
    return trace


def _windows(rng: random.Random, count: int, horizon: float, longest: float,
             shortest: float = 0.0) -> tuple[tuple[float, float], ...]:
    """``count`` random windows in [0, horizon), merged where they overlap."""
    raw = sorted((start, start + rng.uniform(shortest, longest))
                 for start in (rng.uniform(0, horizon) for _ in range(count)))
    merged: list[tuple[float, float]] = []
    for start, end in raw:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return tuple(merged)


def _rate(rng: random.Random, bound: float) -> float:
    """A rate skew in [-bound, bound], at an extreme half of the time."""
    pick = rng.random()
    if pick < 1 / 4:
        return -bound
    if pick < 1 / 2:
        return bound
    return rng.uniform(-bound, bound)


def _offset(rng: random.Random) -> float:
    return rng.uniform(-1e9, 1e9) if rng.random() < 0.2 else rng.uniform(-1e5, 1e5)


def random_scenario(seed: int, *, settings: LeaseSettings, processes: int, rate_skew: float,
                    grant_delay: float, etcd_delay: float, write_delay: float,
                    slow_etcd: float = 0.0, slow_write: float = 0.0,
                    pause_count: int, pause_length: float, clock_stops: bool = False,
                    deaths: int = 0, outages: int = 0, partitions: int = 0,
                    revoke_lag: float = 0.0,
                    horizon_leases: float = 3.5) -> Scenario:
    """A schedule drawn from ``seed`` within the given bounds.

    ``rate_skew`` bounds every clock's |rate| (half the schedules put each
    clock at its worst extreme); ``grant_delay`` bounds the time
    from computing a database grant to its arrival; ``etcd_delay`` and
    ``write_delay`` bound one-way delays, except for a share (none to 30 %) of
    slow messages, up to ``slow_etcd`` and ``slow_write``; each process gets up to
    ``pause_count`` pauses of up to ``pause_length`` seconds (with
    ``clock_stops``, its clock stands still during about half of them), up to
    ``deaths`` processes stop forever, each process's link to etcd is down in
    up to ``partitions`` windows, and etcd has up to ``outages`` windows of
    unavailability.
    """
    rng = random.Random(seed)
    ttl = settings.duration_seconds
    horizon = horizon_leases * ttl
    pauses = tuple(_windows(rng, rng.randint(0, pause_count), horizon, pause_length)
                   for _ in range(processes))
    # Half the schedules put every clock at the worst extreme it can take:
    # etcd fast (leases end early), the database slow (deadlines end late),
    # each process either slow (as an owner) or fast (as a candidate).
    adverse = rng.random() < 0.5
    clocks = []
    for i in range(processes):
        stops = tuple(w for w in pauses[i] if clock_stops and rng.random() < 0.5)
        rate = rng.choice((-rate_skew, rate_skew)) if adverse else _rate(rng, rate_skew)
        clocks.append(Clock(_offset(rng), rate, stops))
    dying = set(rng.sample(range(processes), rng.randint(0, min(deaths, processes))))
    lease_ends = _windows(rng, rng.randint(0, outages), horizon, 1.5 * ttl, 0.1)
    return Scenario(
        settings=settings,
        clocks=tuple(clocks),
        etcd_clock=Clock(_offset(rng), rate_skew if adverse else _rate(rng, rate_skew)),
        db_clock=Clock(_offset(rng), -rate_skew if adverse else _rate(rng, rate_skew)),
        horizon=horizon,
        poll_interval=rng.uniform(0.5, 1.5) * settings.renew_interval_seconds,
        act_interval=rng.uniform(0.2, 0.6) * settings.renew_interval_seconds,
        starts=tuple(rng.uniform(0, settings.renew_interval_seconds) for _ in range(processes)),
        etcd_delay=(0.0, etcd_delay * rng.random()),
        grant_delay=(grant_delay * rng.choice((0.0, 0.9)), grant_delay),
        write_delay=(0.0, write_delay * rng.random()),
        slow_share=rng.choice((0.0, 0.02, 0.1, 0.3)),
        slow_etcd=slow_etcd * rng.random(),
        slow_write=slow_write * rng.random(),
        pauses=pauses,
        deaths=tuple(rng.uniform(0, horizon) if i in dying else NEVER for i in range(processes)),
        outages=tuple((start, end, rng.random()) for start, end in lease_ends),
        cut_off=tuple(_windows(rng, rng.randint(0, partitions), horizon, 1.5 * ttl, 0.1)
                      for _ in range(processes)),
        revoke_lag=revoke_lag * rng.random(),
        seed=rng.getrandbits(64),
    )
