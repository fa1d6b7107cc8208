"""Candidate processes for the fault-injection suite, and their acts judged by :mod:`soak.checker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from soak.checker import NS, Term, leaderless, overlaps, token_order

if TYPE_CHECKING:
    from .harness import TCPProxy

CANDIDATE = Path(__file__).parent / "candidates" / "candidate.py"

#: Timing of the session-lock backends (MySQL, PostgreSQL) in the fault suite.
LEASE = 3
CHECK_INTERVAL = 0.3
CHECK_TIMEOUT = 0.6
OPTIONS = {
    "lease": LEASE,
    "check_interval": CHECK_INTERVAL,
    "check_timeout": CHECK_TIMEOUT,
    "renew_deadline": 2.0,
    "poll_interval": 1.0,
    "fencing": True,
}
#: The same timing in the Redis backend's option names (its lease is the lock key's expiry).
REDIS_OPTIONS = {
    "lease": LEASE,
    "check_interval": CHECK_INTERVAL,
    "check_timeout": CHECK_TIMEOUT,
    "renew_deadline": 2.0,
}
#: Scheduling slack on a shared two-core machine.
MARGIN = 1.5


class EventProcess:
    """A test script run as its own OS process; the JSON lines it prints are collected by a reader thread."""

    def __init__(self, script: Path, *args: str, identity: str = "", prefix: Sequence[str] = ()) -> None:
        self.identity = identity
        self.proc = subprocess.Popen(  # prefix: a command that execs the rest in its place (ip netns exec NS)
            [*prefix, sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("AIOELECT_TEST_VERBOSE") else subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["who"] = self.identity
            self.events.append(event)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (woken first, in case it is frozen) and reap."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


class Candidate(EventProcess):
    """A tests/candidates/candidate.py process."""

    frozen = False

    def acts(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "act"]

    def last_act(self, token: int | None = None) -> float | None:
        """When this candidate last acted as leader (under ``token``, if given)."""
        acts = [e for e in self.acts() if token is None or e.get("token") == token]
        return acts[-1]["t"] if acts else None

    def is_acting(self, within: float = 0.5) -> bool:
        last = self.last_act()
        return last is not None and time.monotonic() - last < within

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)
        self.frozen = False


class Candidates:
    """Starts candidate processes and always reaps them."""

    def __init__(self, backend: str, target: str, name: str, options: dict[str, Any]) -> None:
        self.backend, self.target, self.name, self.options = backend, target, name, options
        self.all: list[Candidate] = []

    def start(self, identity: str, target: str | None = None, prefix: Sequence[str] = ()) -> Candidate:
        candidate = Candidate(
            CANDIDATE,
            f"--backend={self.backend}",
            f"--target={target or self.target}",
            f"--name={self.name}",
            f"--identity={identity}",
            f"--options={json.dumps(self.options)}",
            identity=identity,
            prefix=prefix,
        )
        self.all.append(candidate)
        return candidate

    def start_three(self) -> None:
        """Three candidates, ``cand-0`` to ``cand-2``, on the group's target."""
        for i in range(3):
            self.start(f"cand-{i}")

    def close(self) -> None:
        for candidate in self.all:
            if candidate.proc.poll() is None:
                candidate.kill()

    def __enter__(self) -> Candidates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for(self, predicate: Any, timeout: float, what: str) -> float:
        """Wait until ``predicate()`` is true; return when. Fail with ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return time.monotonic()
            time.sleep(0.01)
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; events: {self.summary()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every candidate started has its elector made (its ``ready`` event; it campaigns right after):
        on a loaded machine a new Python process can take seconds to get there."""
        self.wait_for(
            lambda: all(any(e["event"] == "ready" for e in c.events) for c in self.all),
            timeout,
            "every candidate ready",
        )

    def leader(self, exclude: Candidate | None = None) -> Candidate | None:
        acting = [c for c in self.all if c is not exclude and not c.frozen and c.is_acting(0.3)]
        return acting[0] if len(acting) == 1 else None

    def wait_leader(self, timeout: float = 20.0, exclude: Candidate | None = None) -> Candidate:
        found: list[Candidate] = []

        def one() -> bool:
            leader = self.leader(exclude)
            if leader is not None:
                found.append(leader)
            return leader is not None

        self.wait_for(one, timeout, "exactly one acting leader")
        return found[-1]

    def replace(self, leader: Candidate, fault: Callable[[], None], timeout: float) -> tuple[Candidate, float]:
        """Do ``fault`` to the leader (``leader.kill``, ``leader.freeze``) and wait up to ``timeout``
        for another candidate to lead; return it and how long after the fault it first acted."""
        at = time.monotonic()
        fault()
        successor = self.wait_leader(timeout=timeout, exclude=leader)
        return successor, (self.first_act_after(at, exclude=leader) or 0) - at

    @staticmethod
    def stale_acts_after_thaw(leader: Candidate, successor: Candidate, settle: float = 2.0) -> list[dict[str, Any]]:
        """Wake the frozen ``leader`` and return the leader work it did in the next ``settle``
        seconds under a token no newer than its successor's first."""
        thawed = time.monotonic()
        leader.thaw()
        time.sleep(settle)
        newest = successor.acts()[0]["token"]
        return [e for e in leader.acts() if e["t"] >= thawed and not e["token"] > newest]

    def cut_off(self, leader: Candidate, proxy: TCPProxy, timeout: float) -> tuple[float, Candidate, float]:
        """Stall ``proxy``, the leader's only way to its server, and wait (each step up to
        ``timeout``) for the leader to stop acting and another candidate to lead.

        Returns how long after the stall the leader last acted, its successor, and how
        long after the stall the successor first acted.
        """
        stalled = time.monotonic()
        proxy.stall()
        self.wait_for(lambda: (leader.last_act() or 0) < time.monotonic() - 0.3, timeout, "the cut-off leader stops")
        successor = self.wait_leader(timeout=timeout, exclude=leader)
        took = (self.first_act_after(stalled, exclude=leader) or 0) - stalled
        return (leader.last_act() or 0) - stalled, successor, took

    def first_act_after(self, t: float, exclude: Candidate | None = None) -> float | None:
        times = [e["t"] for c in self.all if c is not exclude for e in c.acts() if e["t"] > t]
        return min(times) if times else None

    def terms(self) -> list[Term]:
        return list(_terms(self.all))

    def summary(self) -> str:
        return _summary(self.terms())


def _summary(terms: list[Term]) -> str:
    return "; ".join(f"{t.who} token={t.token} {t.start / NS:.3f}-{t.end / NS:.3f}" for t in terms)


def _ns(t: float) -> int:
    """A candidate's ``time.monotonic()`` seconds as the checker's ``time.monotonic_ns()`` nanoseconds."""
    return round(t * NS)


def _terms(candidates: list[Candidate]) -> Iterator[Term]:
    """Each candidate's acts grouped into terms: a new token, a ``lead`` or a ``lost`` starts a new one."""
    for candidate in candidates:
        current: Term | None = None
        for event in candidate.events:
            if event["event"] != "act":
                if current is not None and event["event"] in ("lead", "lost"):
                    yield current
                    current = None
                continue
            if current is not None and current.token == event.get("token"):
                current = replace(current, end=_ns(event["t"]), acts=current.acts + 1)
                continue
            if current is not None:
                yield current
            current = Term(candidate.identity, event.get("token"), _ns(event["t"]), _ns(event["t"]), 1)
        if current is not None:
            yield current


def check_invariants(candidates: Candidates, *, max_gap: float, margin: float = 0.0) -> list[Term]:
    """Fail if two candidates acted as leader at once for longer than ``margin`` s, if a token did not grow
    from one term to the next, or if nobody led for longer than ``max_gap`` s.

    Returns the terms ordered by start.
    """
    return judge_terms(candidates.terms(), max_gap=max_gap, margin=margin)


def judge_terms(terms: list[Term], *, max_gap: float | None = None, margin: float = 0.0) -> list[Term]:
    """Fail unless :mod:`soak.checker`, excusing no fault, finds no overlap beyond ``margin`` s, no token that
    did not grow and (with ``max_gap``) nobody leaderless for longer than ``max_gap`` s between the first
    and the last act. Returns ``terms`` ordered by start."""
    terms = sorted(terms, key=lambda t: (t.start, t.who))
    assert terms, "nobody ever acted as leader"
    summary = _summary(terms)
    split, _ = overlaps(terms, [], round(margin * NS), strict=True)
    assert not split, f"split brain: {'; '.join(v.message for v in split)}; terms: {summary}"
    backwards = token_order(terms)
    assert not backwards, f"token went backwards: {'; '.join(v.message for v in backwards)}"
    if max_gap is not None:
        idle, _, _ = leaderless(terms, [], terms[0].start, max(t.end for t in terms), max_gap)
        assert not idle, f"no leader: {'; '.join(v.message for v in idle)}; terms: {summary}"
    return terms
