"""The nemesis: a seeded schedule of faults, and their execution against one backend.

The schedule (:func:`plan`) is a pure function of the seed, the backend and
the length: when each fault starts, its kind, whom it aims at (the leader or
another candidate, chosen when it fires), how long it lasts. At most two
faults are in force at once; faults on the whole server (restart, member,
slow, the splits of server nodes) one at a time. :class:`Nemesis` runs each fault on a thread of its own
and heals it in a ``finally``: a fault that fails half-way is still undone.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
import traceback
from dataclasses import dataclass

from tests.harness import HarnessError, TCPProxy

from .checker import Fault
from .pool import Candidate, Pool
from .targets import Etcd3Target, Target
from .timing import Timing

__all__ = ["Nemesis", "Planned", "plan"]

#: Server nodes split from each other (the split workload, :mod:`soak.splits`).
_SPLITS = frozenset({"cut-sentinels", "cut-replicas", "isolate", "crash-loop"})
#: Faults on the whole server: one at a time.
_SERVER_WIDE = frozenset({"restart", "member", "slow"}) | _SPLITS
_MAX_IN_FORCE = 2
#: ``join`` starts no candidate beyond this many live ones (the shards candidates' member elections).
_MAX_LIVE = 7


@dataclass(frozen=True)
class Planned:
    """One fault of the schedule: ``at`` seconds into the run."""

    at: float
    kind: str
    aim: str  # "leader" or "other"
    duration: float
    variant: str = ""  # partition: "drop" or "stall"; member: the member's index; slow: the delay


def _duration(rng: random.Random, kind: str, lease: float) -> float:
    if kind == "pause":
        if rng.random() < 0.25:
            # Around the renew deadline, within the lease: the leader may wake fenced before anyone can take over.
            return rng.uniform(0.5, lease)
        return lease + rng.uniform(0.5, 2.5)  # past the lease: the server must hand on
    if kind == "partition":
        return rng.uniform(1.0, lease + 3.0)
    if kind == "restart":
        return rng.uniform(0.5, 3.0)
    if kind == "member":
        return rng.uniform(1.0, 6.0)
    if kind == "slow":
        return rng.uniform(2.0, 6.0)
    if kind == "cut-sentinels":
        return rng.uniform(4.0, 8.0)  # past the sentinels' down-after: a failover under the leader
    if kind == "cut-replicas":
        return rng.uniform(2.0, 5.0)
    if kind == "isolate":
        return rng.uniform(3.0, 7.0)  # past a raft election
    if kind == "crash-loop":
        return rng.uniform(0.0, 1.0)  # not a length: the loop's draws (3 to 5 restarts, each up under 1 s)
    return 0.0


def plan(seed: int, label: str, kinds: tuple[str, ...], seconds: float, lease: float) -> list[Planned]:
    """The faults of one backend's run: from ``warmup`` to ``seconds`` minus a quiet end to settle."""
    rng = random.Random(f"{seed}:{label}")
    warmup, settle = 3.0, 12.0
    schedule: list[Planned] = []
    ends: list[float] = []  # planned ends of the faults in force
    server_free_at = 0.0
    t = warmup + rng.uniform(0.0, 2.0)
    while True:
        kind = rng.choice(kinds)
        duration = _duration(rng, kind, lease)
        ends = [e for e in ends if e > t]
        if len(ends) >= _MAX_IN_FORCE:
            t = min(ends) + rng.uniform(0.2, 1.0)
            continue
        if kind in _SERVER_WIDE and t < server_free_at:
            t = server_free_at + rng.uniform(0.2, 1.0)
        # Leave time for the restart itself (a few seconds of stop and start) and for recovery.
        if t + duration + 5.0 > seconds - settle:
            break
        variant = ""
        if kind == "partition":
            variant = rng.choice(["drop", "stall"])
        elif kind == "member":
            variant = str(rng.randrange(3))
        elif kind == "slow":
            variant = f"{rng.uniform(0.05, 0.25):.3f}"  # seconds each chunk is held, each way
        aim = "leader" if rng.random() < 0.7 else "other"
        schedule.append(Planned(round(t, 3), kind, aim, round(duration, 3), variant))
        end = t + duration + (5.0 if kind in ("restart", "member") or kind in _SPLITS else 0.0)
        ends.append(end)
        if kind in _SERVER_WIDE:
            server_free_at = end
        t += rng.expovariate(1 / 6.0) + 0.5  # a fault every ~6.5 s on average
    return schedule


def _each(proxies: list[TCPProxy], mode: str, *args: float) -> None:
    """Put every proxy in ``mode`` (``drop``, ``stall``, ``delay``, ``heal``); one closed meanwhile (its
    candidate was killed) is passed over."""
    for proxy in proxies:
        with contextlib.suppress(HarnessError, TimeoutError):
            getattr(proxy, mode)(*args)


class Nemesis:
    """Executes a schedule against ``target`` and ``pool``; records every fault done, with its bound."""

    def __init__(self, target: Target, pool: Pool, timing: Timing) -> None:
        self.target, self.pool, self.timing = target, pool, timing
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self.tracebacks: list[str] = []
        self.skipped: list[str] = []
        self._lock = threading.Lock()  # the pool, the records
        self._server = threading.Lock()  # one server-wide fault at a time
        self._threads: list[threading.Thread] = []

    def run(self, schedule: list[Planned], began: float) -> None:
        """Fire each fault at its time (monotonic ``began`` + ``at``) and wait for all of them to heal."""
        for planned in schedule:
            delay = began + planned.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=self._fire, args=(planned,), name=f"nemesis-{planned.kind}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for thread in self._threads:
            thread.join(120.0)
            if thread.is_alive():
                self.errors.append(f"{thread.name} did not finish within 120 s")

    def _choose(self, aim: str) -> tuple[Candidate | None, str]:
        """The candidate a fault aims at, marked busy, and its role: the leader if aimed at and free."""
        with self._lock:
            leader = self.pool.leader()
            free = [c for c in self.pool.live() if not c.busy and not c.frozen]
            if aim == "leader" and leader is not None and leader in free:
                leader.busy = True
                return leader, "leader"
            others = [c for c in free if c is not leader]
            if not others:
                return None, ""
            others[0].busy = True
            return others[0], "follower"

    def _record(
        self, planned: Planned, target: str, start: int, heal: int, detail: str, candidate: Candidate | None = None
    ) -> None:
        kind = f"partition-{planned.variant}" if planned.kind == "partition" else planned.kind
        deadline = int(self.timing.deadline(kind, start / 1e9, heal / 1e9) * 1e9)
        with self._lock:
            identity = candidate.identity if candidate is not None else ""
            self.faults.append(Fault(kind, target, start, heal, deadline, detail, identity))

    def _fire(self, planned: Planned) -> None:
        try:
            if planned.kind in _SERVER_WIDE:
                with self._server:
                    self._server_fault(planned)
            elif planned.kind == "join":
                self._join(planned)
            elif planned.kind == "depose":
                with self._server:  # not while the server restarts: there is nothing to depose then
                    start = time.monotonic_ns()
                    detail = self.target.depose()
                self._record(planned, "leader", start, time.monotonic_ns(), detail)
            else:
                self._candidate_fault(planned)
        except Exception as exc:
            self.errors.append(f"{planned.kind} at {planned.at:.1f}s failed: {exc!r}")
            self.tracebacks.append(f"{planned.kind} at {planned.at:.1f}s:\n{traceback.format_exc()}")

    def _join(self, planned: Planned) -> None:
        """A fresh candidate joins (the shards workload: names move to it); none past ``_MAX_LIVE``."""
        start = time.monotonic_ns()
        with self._lock:
            if len(self.pool.live()) >= _MAX_LIVE:
                self.skipped.append(f"join at {planned.at:.1f}s: {_MAX_LIVE} candidates live already")
                return
            fresh = self.pool.start()
        self._record(planned, "server", start, time.monotonic_ns(), f"{fresh.identity} started", fresh)

    def _candidate_fault(self, planned: Planned) -> None:
        candidate, role = self._choose(planned.aim)
        if candidate is None:
            self.skipped.append(f"{planned.kind} at {planned.at:.1f}s: no candidate free")
            return
        who = f"{candidate.identity} ({role})"
        start = time.monotonic_ns()
        try:
            if planned.kind == "kill":
                self.pool.kill(candidate)
                with self._lock:
                    fresh = self.pool.start()
                self._record(planned, who, start, time.monotonic_ns(), f"replaced by {fresh.identity}", candidate)
            elif planned.kind == "pause":
                candidate.frozen = True
                candidate.signal(signal.SIGSTOP)
                try:
                    time.sleep(planned.duration)
                finally:
                    candidate.signal(signal.SIGCONT)
                    candidate.frozen = False
                self._record(planned, who, start, time.monotonic_ns(), f"SIGSTOP {planned.duration:.1f}s", candidate)
            elif planned.kind == "partition":
                try:
                    with self._lock:  # not while a slow server's delays are being applied or lifted
                        _each(candidate.proxies, planned.variant)
                    time.sleep(planned.duration)
                finally:
                    with self._lock:
                        _each(candidate.proxies, "heal")
                self._record(
                    planned, who, start, time.monotonic_ns(), f"{planned.variant} {planned.duration:.1f}s", candidate
                )
        finally:
            candidate.busy = False

    def _server_fault(self, planned: Planned) -> None:
        start = time.monotonic_ns()
        try:
            if planned.kind == "restart":
                detail = self.target.restart(planned.duration)
            elif planned.kind == "member":
                assert isinstance(self.target, Etcd3Target)
                detail = self.target.kill_member(int(planned.variant), planned.duration)
            elif planned.kind in _SPLITS:
                detail = self.target.split(planned.kind, planned.duration)
            else:
                detail = self._slow(planned.duration, float(planned.variant))
        finally:
            self.target.ensure_running()
        self._record(planned, "server", start, time.monotonic_ns(), detail)

    def _slow(self, duration: float, delay: float) -> str:
        """Every candidate's link holds each chunk ``delay`` s, each way, for ``duration`` s."""
        try:
            with self._lock:  # a partitioned candidate stays cut off
                _each([p for c in self.pool.live() if not c.busy for p in c.proxies], "delay", delay)
            time.sleep(duration)
        finally:
            with self._lock:  # a partition replaced the delay of its own candidate: only delayed links are healed
                delayed = [p for c in self.pool.all for p in c.proxies if p.delay_seconds > 0]
                _each(delayed, "heal")
        return f"links delayed {delay * 1000:.0f} ms each way for {duration:.1f}s"
