"""The fenced workload: every leader does a job, a fenced write; some are frozen with the write in flight.

Kleppmann's case, played in one process: a leader whose ``check()`` passed
is frozen (the elector's every exchange with the server held back, as by
SIGSTOP or a long GC pause) for longer than it takes the server to end its
leadership and another candidate to lead and write; then it wakes and its
write goes out, with no local check in between (that check passed before
the freeze). Only the server's fence can refuse it.

Each job writes two keys of the election's fenced state
(:class:`aioelect.FencedStore`): ``{run}/job/{n}``, its own, and
``{run}/cursor``, shared by every leader, each value naming the token. The
judge (:func:`judge`) reads the replies conservatively: a write B is *late*
if it was sent after a write under a newer token was seen accepted, *stale*
if it was sent after a leadership with a newer token was seen granted (every
late write is stale). A late or stale write accepted is a ``fence``
violation; so is a cursor left, at the end, under a token older than one of
the cursor writes seen accepted. A write whose reply never came is looked
up after the run by its own key.

The workload draws from an RNG of its own, so the seed's electors, network
and operator draw what they draw in the plain workload; the job's exchanges
still shift the network's draws, so a seed plays out otherwise than there.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

import aioelect
from aioelect.core._backend import Written
from aioelect.core._elector import backend_of, elector_of, hold_of
from aioelect.core._values import encode
from soak.checker import Violation

from .network import Network
from .run import Outcome, _attach, _Candidate, _elector, run_seed
from .servers import Target

__all__ = ["FREEZE", "Grant", "Jobs", "Write", "judge", "run_fenced"]

_NS = 1_000_000_000

#: How long a frozen leader stays frozen (bounds, s): past the time the server takes to hand its leadership on.
#: etcd and Redis: the lease (``ttl`` 3 s, ``lease`` 3 s) runs out, a waiter takes over and writes. MySQL and
#: PostgreSQL: the frozen elector's checks time out and it closes its lock session, so the lock is free within
#: ``check_timeout`` and a waiter polls it (``poll_interval`` 1 s); a frozen process's session would instead be
#: ended by the server after ``lease`` (20 s in the adversary, which the restart seeds need).
FREEZE = {"etcd": (4.5, 6.5), "redis": (4.5, 6.5), "mysql": (3.5, 5.5), "postgres": (3.5, 5.5)}

#: Elector options the workload adds: fenced state on PostgreSQL checks each write against the token row of the
#: leaders table, which exists with ``schema=`` only.
EXTRA_OPTIONS: dict[str, dict[str, Any]] = {"postgres": {"schema": "public"}}


@dataclass
class Write:
    """One fenced write: sent at ``sent`` (ns) under ``token``, its reply seen at ``replied``.

    ``outcome``: "accepted", "refused" (the server's fence), or "failed"
    (no answer: ``landed`` says what the key showed after the run, None if
    it cannot say).
    """

    who: str
    token: int
    key: str
    job: int
    sent: int
    replied: int
    outcome: str
    in_flight: bool
    error: str = ""
    landed: bool | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted" or bool(self.landed)


@dataclass(frozen=True)
class Grant:
    """A leadership of ``who`` under ``token``, seen granted at ``at`` (ns): after its acquire returned."""

    who: str
    token: int
    at: int


class _Freezer:
    """An elector's interceptor: its network, and while :attr:`thaw` is set, every exchange held until it is."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.thaw: anyio.Event | None = None

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        thaw = self.thaw
        if thaw is not None and self.network.active:
            await thaw.wait()
        return await self.network.exchange(what, send)


@dataclass
class Jobs:
    """The jobs of one run: set up on each candidate (:meth:`attach`), judged after (:meth:`settle`, :func:`judge`).

    ``unfenced``: the writes go through the same store with no token
    check (:meth:`~aioelect.core._backend.StateStore.post`): the fence turned
    off, to show that the judge finds the writes it would have refused.
    """

    backend: str
    seed: int
    until: float
    unfenced: bool = False
    writes: list[Write] = field(default_factory=list)
    grants: list[Grant] = field(default_factory=list)
    trace: list[tuple[int, str, str]] = field(default_factory=list)
    freezes: int = 0
    #: The leaderships frozen, (who, token).
    frozen_terms: set[tuple[str, int]] = field(default_factory=set)
    #: The shared key's value after the run (:meth:`settle`).
    cursor: Any = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"fenced {self.seed}")
        # Not every run freezes a leader; in those that do, a share of the leaderships.
        self.freeze_p = 0.0 if self.rng.random() < 0.2 else self.rng.uniform(0.25, 0.6)
        self.run = uuid.uuid4().hex[:12]  # the keys of this run, apart from any earlier run's on the same election
        self.jobs = 0
        self.frozen = 0

    def attach(self, candidate: _Candidate) -> None:
        """Put a freezer between ``candidate``'s elector and its network, and give it the job."""
        freezer = _Freezer(candidate.network)
        _attach(candidate.elector, freezer)

        async def job(lead: aioelect.Leadership) -> None:
            await self._job(candidate, freezer, lead)

        candidate.job = job

    def _say(self, who: str, line: str) -> None:
        self.trace.append((time.monotonic_ns(), who, line))

    async def _job(self, candidate: _Candidate, freezer: _Freezer, lead: aioelect.Leadership) -> None:
        token = lead.token
        assert token is not None
        self.grants.append(Grant(candidate.who, token, time.monotonic_ns()))
        if time.monotonic() >= self.until:
            return  # a campaign that outlasted the run: no job, as no act
        self.jobs += 1
        n = self.jobs
        low, high = FREEZE[self.backend]
        freeze = self.rng.uniform(low, high) if self.rng.random() < self.freeze_p else 0.0
        # One leader frozen at a time, and only if it wakes before the run ends.
        if freeze and (self.frozen or time.monotonic() + freeze > self.until):
            freeze = 0.0
        if not freeze:
            await self._writes(candidate.who, lead, n, in_flight=False)
            return
        try:
            lead.check()
        except aioelect.LeadershipLost:
            return
        # check() passed: from here the elector is frozen, and its write is in flight.
        self.frozen += 1
        self.freezes += 1
        self.frozen_terms.add((candidate.who, token))
        self._say(candidate.who, f"job {n}: check() passed under token {token}; frozen {freeze:.2f}s, write in flight")
        freezer.thaw = anyio.Event()
        try:
            await anyio.sleep(freeze)
        finally:
            freezer.thaw.set()
            freezer.thaw = None
            self.frozen -= 1
        self._say(candidate.who, f"job {n}: woken, its write goes out (held: {lead.held})")
        await self._writes(candidate.who, lead, n, in_flight=True)

    async def _writes(self, who: str, lead: aioelect.Leadership, n: int, *, in_flight: bool) -> None:
        """The job's two writes, the cursor only if the first was accepted (a job stops where it is refused)."""
        token = lead.token
        assert token is not None
        elector = elector_of(lead)
        for key in (f"{self.run}/job/{n}", f"{self.run}/cursor"):
            value = {"token": token, "who": who, "job": n}
            sent = time.monotonic_ns()
            error = ""
            try:
                if self.unfenced:
                    await backend_of(elector).state_store().post(key, encode(value))
                    outcome = "accepted"
                elif in_flight:
                    # Below FencedStore: its local check() is the one that passed before the freeze.
                    written = (
                        await backend_of(elector)
                        .state_store()
                        .write(hold_of(lead), key, encode(value), compare=False, expected=None)
                    )
                    outcome = "accepted" if written is Written.DONE else "refused"
                else:
                    await aioelect.FencedStore(elector).put(lead, key, value)
                    outcome = "accepted"
            except aioelect.LeadershipLost as exc:
                if not str(exc).startswith("fenced write"):
                    return  # refused by its own check(), before anything was sent
                outcome, error = "refused", str(exc)
            except Exception as exc:
                outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            write = Write(who, token, key, n, sent, time.monotonic_ns(), outcome, in_flight, error[:200])
            self.writes.append(write)
            self._say(who, f"write {key} under token {token}: {outcome}" + (f" ({error[:120]})" if error else ""))
            if outcome != "accepted":
                return

    async def settle(self, target: Target) -> None:
        """Look up, after the run, the writes whose reply never came, by their own key; the cursor's final value."""
        elector = _elector(target, "fence-judge")
        async with elector:
            store = aioelect.FencedStore(elector)
            for write in self.writes:
                if write.outcome == "failed" and "/job/" in write.key:
                    value = await store.get(write.key)
                    write.landed = value is not None and value.get("token") == write.token
            self.cursor = await store.get(f"{self.run}/cursor")


def judge(writes: list[Write], grants: list[Grant], cursor: Any = None) -> tuple[list[Violation], dict[str, int]]:
    """The ``fence`` violations among ``writes`` and the counts of the outcome line.

    A write is late if it was sent after a write under a newer token was
    seen accepted, stale if sent after a leadership with a newer token was
    seen granted; either one accepted (or found written after the run) is a
    violation: the fence lets a write commit only under the newest token the
    election has issued. ``cursor``: the shared key's final value.
    """
    found: list[Violation] = []
    counts = {
        "fence writes": len(writes),
        "fence accepted": sum(w.accepted for w in writes),
        "fence refused": sum(w.outcome == "refused" for w in writes),
        "fence failed": sum(w.outcome == "failed" and not w.landed for w in writes),
        "fence in flight": sum(w.in_flight for w in writes),
        "fence late": 0,
        "fence late refused": 0,
        "fence late accepted": 0,
        "fence stale": 0,
        "fence stale refused": 0,
        "fence stale accepted": 0,
    }
    seen = [w for w in writes if w.outcome == "accepted"]
    for b in writes:
        newer = min(
            (a for a in seen if a.token > b.token and a.replied < b.sent), key=lambda a: a.replied, default=None
        )
        granted = min((g for g in grants if g.token > b.token and g.at < b.sent), key=lambda g: g.at, default=None)
        for kind, late in (("late", newer is not None), ("stale", granted is not None)):
            if late:
                counts[f"fence {kind}"] += 1
                if b.outcome == "refused":
                    counts[f"fence {kind} refused"] += 1
                if b.accepted:
                    counts[f"fence {kind} accepted"] += 1
        if not b.accepted:
            continue
        how = "accepted" if b.outcome == "accepted" else "found written after the run"
        if newer is not None:
            found.append(
                Violation(
                    "fence",
                    f"{b.who}'s write of {b.key} under token {b.token} {how}, sent "
                    f"{(b.sent - newer.replied) / _NS:.2f} s after {newer.who}'s write of {newer.key} under token "
                    f"{newer.token} was accepted",
                    b.sent,
                )
            )
        elif granted is not None:
            found.append(
                Violation(
                    "fence",
                    f"{b.who}'s write of {b.key} under token {b.token} {how}, sent "
                    f"{(b.sent - granted.at) / _NS:.2f} s after {granted.who} was granted token {granted.token}",
                    b.sent,
                )
            )
    cursors = [w.token for w in seen if w.key.endswith("/cursor")]
    if cursors and (not isinstance(cursor, dict) or int(cursor.get("token", -1)) < max(cursors)):
        found.append(
            Violation(
                "fence",
                f"the cursor ends as {cursor!r}, under an older token than a cursor write seen accepted "
                f"(token {max(cursors)})",
                max(w.replied for w in seen),
            )
        )
    return found, counts


async def run_fenced(
    target: Target, seed: int, seconds: float, *, electors: int | None = None, unfenced: bool = False
) -> Outcome:
    """:func:`~.run.run_seed` with the fenced workload: its violations and counts added to the outcome."""
    jobs = Jobs(target.backend, seed, time.monotonic() + seconds, unfenced=unfenced)
    # The options are the target class's; this run's electors (and the judge's) add the workload's own.
    own = "extra_options" in vars(target)
    saved = target.extra_options
    setattr(target, "extra_options", {**saved, **EXTRA_OPTIONS.get(target.backend, {})})  # noqa: B010
    try:
        outcome = await run_seed(target, seed, seconds, electors=electors, setup=jobs.attach)
        await jobs.settle(target)
    finally:
        if own:
            setattr(target, "extra_options", saved)  # noqa: B010
        else:
            delattr(target, "extra_options")
    violations, counts = judge(jobs.writes, jobs.grants, jobs.cursor)
    counts["fence frozen"] = jobs.freezes
    # A frozen leader's session or key ends by the freeze, which no operator action explains: not a deposition.
    frozen = {loss.at for loss in outcome.losses if (loss.who, loss.token) in jobs.frozen_terms}
    outcome.verdict.violations = [
        v for v in outcome.verdict.violations if not (v.kind == "deposed" and v.at in frozen)
    ] + violations
    outcome.counts.update(counts)
    outcome.trace = sorted(outcome.trace + jobs.trace)
    return outcome
