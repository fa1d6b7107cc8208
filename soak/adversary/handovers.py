"""Planned handovers under the adversary: the operator's step-down actions, and what the judge asks of them.

With handovers on (``run_seed(..., handovers=True)``, ``python -m soak.adversary
--handovers``), the operator also draws, on its own RNG:

* ``step-down``: the leader steps down to a waiting candidate;
* ``step-down-to-nobody``: to a name nobody campaigns under (the election
  reopens after the window, with a WARNING);
* ``step-down-twice``: two step-downs at once, one in-process
  (:meth:`~aioelect.Leadership.step_down`) and one posted
  (:func:`aioelect.request_step_down`, served by the leader meanwhile);
* ``step-down-deposed``: a step-down while the operator deposes the leader
  (one of the target's actions that take the lock from its holder, recorded as
  a fault of its own as well);
* ``successor-dies``: a step-down to a waiting candidate whose elector is
  cancelled and closed just after (it campaigns again, as a new elector, once
  the action is over);
* ``successor-cut``: the same, the successor's every exchange lost instead.

Before each, every elector pausing between campaigns campaigns again, so that
a successor and others are campaigning. Each action waits, holding off the
operator's other actions, until someone leads after the step-down, or
:func:`reopen_bound` has passed. Each step-down that left a note is judged
(:meth:`Handovers.judge`):

* ``stuck``: nobody led within :func:`reopen_bound` of the note;
* ``twice``: one leadership stepped down more than once (two requests at
  once have exactly one outcome);
* ``silent``: the first leader after the step-down is not the one it named (or,
  naming nobody, is the one who stepped down, within the window), the named
  successor did not take the note first, and no handover WARNING was logged
  (the note unread, or not taken within its window).

A note left too close to the end of the run to be judged is counted
(``handover unjudged``), never passed as judged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio

import aioelect
from aioelect.core._handover import POLL_INTERVAL
from soak.checker import Fault, Violation

from .network import Profile

if TYPE_CHECKING:
    from .run import _Candidate
    from .servers import Target

__all__ = ["KINDS", "OPTIONS", "Handovers", "Seen", "Step", "judge", "reopen_bound"]

_NS = 1_000_000_000

#: The handover actions and their weights, relative to each other (the operator scales them to the target's).
KINDS: dict[str, float] = {
    "step-down": 2.0,
    "step-down-to-nobody": 1.0,
    "step-down-twice": 1.5,
    "step-down-deposed": 1.5,
    "successor-dies": 2.0,
    "successor-cut": 1.5,
}
#: Elector options the handover notes need, per backend (PostgreSQL keeps fenced state only with a schema).
OPTIONS: dict[str, dict[str, Any]] = {"postgres": {"schema": "public"}}
#: The target actions that take the lock from its holder, one of which ``step-down-deposed`` runs.
DEPOSE = ("kill-holder", "delete-key", "revoke-lease", "overwrite-key", "expire-key")
#: The window lengths drawn (seconds).
WINDOW = (1.0, 3.0)
#: What a WARNING that the handover rule let someone in says.
_SAID = ("not taken within", "excludes nobody", "unread after", "not marked taken")


def reopen_bound(backend: str, options: dict[str, Any], profile: Profile, margin: float) -> float:
    """Seconds past a note's window by which someone leads, whatever became of the named successor.

    After the window a waiting candidate sees the note ended at its next read
    (every :data:`~aioelect.core._handover.POLL_INTERVAL`), then campaigns: a lock
    a dead or cut-off successor may hold expires (etcd's ``ttl``, Redis's
    ``lease``; a SQL session ends with its connection) and the campaign polls
    (``poll_interval``). The adversary may hold back that read and the
    campaign's exchanges by up to ``profile.long`` each, once each; a lost
    exchange is retried within a second; then ``margin`` for a leader that
    still acts (the one a deposition ended) and scheduling.
    """
    expiry = float(options.get("ttl", 0.0)) if backend == "etcd" else float(options.get("lease", 0.0))
    if backend in ("mysql", "postgres"):
        expiry = 0.0
    poll = float(options.get("poll_interval", 0.0))
    return POLL_INTERVAL + expiry + poll + 2 * profile.long + 1.0 + margin


@dataclasses.dataclass(frozen=True)
class Step:
    """One step-down the operator asked for: of ``leader``'s leadership ``token``, at ``at`` (monotonic ns)."""

    kind: str
    leader: str
    token: int | None
    at: int
    timeout: float
    #: Who took the note, as read right after the next leader was seen ("?": not read).
    taken_by: str | None = "?"
    #: The successor that died or was cut off, if any.
    victim: str | None = None


@dataclasses.dataclass(frozen=True)
class Seen:
    at: int
    who: str
    kind: str
    token: int | None
    successor: str | None


class Handovers:
    """The operator's handover actions on one run's candidates, and their judge."""

    def __init__(
        self,
        target: Target,
        candidates: list[_Candidate],
        faults: list[Fault],
        say: Callable[[str], None],
        renew: Callable[[_Candidate], Awaitable[aioelect.Elector]],
        observer: aioelect.Elector,
        reopen: float,
    ) -> None:
        self.target = target
        self.candidates = candidates
        self.faults = faults
        self.say = say
        self.renew = renew
        #: An elector of the election off the adversary's network: it reads the note, never campaigns.
        self.observer = observer
        self.reopen = reopen
        self.steps: list[Step] = []
        self.seen: list[Seen] = []
        #: Handover WARNINGs logged during the run, (monotonic ns, message).
        self.warnings: list[tuple[int, str]] = []
        self.counts: dict[str, int] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._dead: dict[str, anyio.Event] = {}
        self._gone: dict[str, anyio.Event] = {}
        self._n = 0
        #: When the candidates stop campaigning (monotonic s).
        self.until = math.inf

    @property
    def kinds(self) -> dict[str, float]:
        return KINDS

    def watch(self, elector: aioelect.Elector, who: str) -> None:
        """Record ``elector``'s leaderships and step-downs."""

        def on_event(event: aioelect.Event) -> None:
            if event.kind in ("acquired", "handover_requested", "stepped_down"):
                self.seen.append(Seen(time.monotonic_ns(), who, event.kind, event.token, event.successor))

        elector.add_listener(on_event)

    @contextmanager
    def warnings_caught(self) -> Iterator[None]:
        """Record the library's WARNINGs while the run lasts; what the logger would have shown it still shows."""
        logger = logging.getLogger("aioelect")
        shown = logger.getEffectiveLevel()
        level, propagate = logger.level, logger.propagate
        owner = self

        class Catch(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno >= logging.WARNING:
                    owner.warnings.append((time.monotonic_ns(), record.getMessage()))
                if record.levelno >= shown:
                    logging.getLogger().handle(record)  # on to the handlers it went to before

        catch = Catch()
        logger.addHandler(catch)
        logger.setLevel(min(shown, logging.WARNING))
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(catch)
            logger.setLevel(level)
            logger.propagate = propagate

    async def live(self, candidate: _Candidate, until: float) -> None:
        """Run ``candidate``'s loop until ``until``; killed (:meth:`_kill`), it waits to be renewed, then goes on."""
        self.until = until
        while True:
            gone = self._gone[candidate.who] = anyio.Event()
            with anyio.CancelScope() as self._scopes[candidate.who]:
                await candidate.loop(until)
                return
            gone.set()
            await self._dead[candidate.who].wait()
            if time.monotonic() >= until:
                return

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _alive(self) -> list[_Candidate]:
        return [c for c in self.candidates if c.who not in self._dead and not c.network.cut]

    def _leader(self) -> _Candidate | None:
        return next((c for c in self._alive() if c.leading and c.lead is not None and c.lead.held), None)

    async def act(self, kind: str, rng: Any) -> str:
        """Take the handover action ``kind``; say what was done."""
        for c in self.candidates:
            c.recampaign()  # those pausing campaign again: the successor and the others are candidates
        await _until(lambda: self._leader() is not None, 2.0)
        leader = self._leader()
        if leader is None or leader.lead is None:
            return "no leader"
        lead = leader.lead
        waiting = [c for c in self._alive() if c is not leader]
        timeout = rng.uniform(*WINDOW)
        successor = rng.choice(waiting) if waiting else None
        to = successor.who if successor is not None else None
        step = Step(kind, leader.who, lead.token, time.monotonic_ns(), timeout)
        before = len(self.seen)
        if kind == "step-down-to-nobody":
            self._n += 1
            to = f"nobody-{self._n}"
            outcome = await self._step_down(lead, to, timeout)
        elif kind == "step-down-twice":
            outcome = await self._twice(lead, to, rng.choice(waiting).who if waiting else None, timeout, rng)
        elif kind == "step-down-deposed":
            outcome = await self._deposed(leader, to if rng.random() < 0.7 else None, timeout, rng)
        elif kind in ("successor-dies", "successor-cut") and successor is not None:
            step = Step(kind, leader.who, lead.token, step.at, timeout, victim=successor.who)
            results: list[str] = []

            async def step_down() -> None:
                results.append(await self._step_down(lead, to, timeout))

            async with anyio.create_task_group() as tg:
                tg.start_soon(step_down)
                await anyio.sleep(rng.uniform(0.0, 0.3))  # mid-handover: the note written or being written
                if kind == "successor-dies":
                    await self._kill(successor)
                else:
                    successor.network.cut = True
                    self.say(f"{kind}: {successor.who} cut off from the server")
            outcome = results[0] if results else "?"
        else:
            outcome = await self._step_down(lead, to, timeout)
        self.steps.append(step)
        index = len(self.steps) - 1
        # Hold the operator's other actions until someone leads after the step-down, or the bound has passed.
        # (At most until the candidates stop campaigning: the judge counts a later deadline as unjudged.)
        within = min(timeout + self.reopen, self.until - time.monotonic())
        await _until(lambda: any(s.kind == "acquired" for s in self.seen[before:]), within)
        nxt = next((s for s in self.seen[before:] if s.kind == "acquired"), None)
        if nxt is not None:
            self.steps[index] = dataclasses.replace(step, taken_by=await self._taken_by())
        if step.victim is not None:
            victim = next(c for c in self.candidates if c.who == step.victim)
            if victim.network.cut:
                victim.network.cut = False
                self.say(f"{kind}: {victim.who} back on the network")
            else:
                await self._revive(victim)
        led = f"{nxt.who} led {(nxt.at - step.at) / 1e9:.2f}s after" if nxt is not None else "nobody led yet"
        return f"{leader.who} (token {lead.token}) to {to!r} for {timeout:.1f}s: {outcome}; {led}"

    async def _step_down(self, lead: aioelect.Leadership, to: str | None, window: float) -> str:
        try:
            await lead.step_down(to, timeout=window)
        except (aioelect.ElectionError, ValueError) as exc:
            return f"not stepped down ({type(exc).__name__}: {exc})"
        return "stepped down"

    async def _request(self, poster: aioelect.Elector, to: str | None, window: float) -> str:
        try:
            request = await aioelect.request_step_down(poster, to=to, timeout=window, lapse=2.0)
        except aioelect.ElectionError as exc:
            return f"request not posted ({type(exc).__name__}: {exc})"
        return f"request {request} posted"

    async def _twice(
        self, lead: aioelect.Leadership, to: str | None, other: str | None, window: float, rng: Any
    ) -> str:
        """One step-down in-process (to ``to``) and one requested (to ``other``), at once; the leader serves."""
        poster = rng.choice(self._alive()).elector
        results: list[str] = []

        async def asked(step: Awaitable[str], delay: float) -> None:
            await anyio.sleep(delay)
            results.append(await step)

        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(aioelect.serve_step_downs, lead, interval=0.05))
            async with anyio.create_task_group() as both:
                both.start_soon(asked, self._step_down(lead, to, window), rng.uniform(0.0, 0.1))
                both.start_soon(asked, self._request(poster, other, window), rng.uniform(0.0, 0.1))
            await _until(lambda: not lead.held, 2.0)
            tg.cancel_scope.cancel()
        return f"in-process and requested (to {other!r}) at once: " + "; ".join(results)

    async def _deposed(self, leader: _Candidate, to: str | None, window: float, rng: Any) -> str:
        """A step-down while the operator takes the lock from the leader (a fault of its own)."""
        assert leader.lead is not None
        lead = leader.lead
        kinds = [k for k in DEPOSE if k in self.target.actions]
        if not kinds:
            return await self._step_down(lead, to, window)
        kind = rng.choice(kinds)
        result: list[str] = []

        async def depose(delay: float) -> None:
            await anyio.sleep(delay)
            start = time.monotonic_ns()
            if kind == "delete-key" and self.target.backend == "etcd":
                detail = await self.target.delete_key_of(leader.network.leases)  # the leader's key, not any
            else:
                detail = await self.target.act(kind, rng)
            heal = time.monotonic_ns()
            self.faults.append(Fault(kind, self.target.backend, start, heal, heal, detail))
            self.say(f"{kind} (with a step-down): {detail}")

        async def step(delay: float) -> None:
            await anyio.sleep(delay)
            result.append(await self._step_down(lead, to, window))

        async with anyio.create_task_group() as tg:
            tg.start_soon(depose, rng.uniform(0.0, 0.1))
            tg.start_soon(step, rng.uniform(0.0, 0.1))
        return f"{kind} at once: {result[0] if result else '?'}"

    async def _kill(self, candidate: _Candidate) -> None:
        """End ``candidate``'s loop and close its elector: as a process that dies (a graceful close)."""
        self._dead[candidate.who] = anyio.Event()
        self._scopes[candidate.who].cancel()
        with anyio.move_on_after(5.0):
            await self._gone[candidate.who].wait()
        candidate.leading, candidate.lead, candidate.campaign, candidate.pausing = False, None, None, None
        with anyio.CancelScope(shield=True), anyio.move_on_after(10.0):
            await candidate.elector.aclose()
        self.say(f"successor-dies: {candidate.who}'s elector cancelled and closed")

    async def _revive(self, candidate: _Candidate) -> None:
        """``candidate`` campaigns again, as a new elector under the same identity."""
        dead = self._dead.pop(candidate.who, None)
        if dead is None:
            return
        candidate.elector = await self.renew(candidate)
        self.say(f"successor-dies: {candidate.who} campaigns again with a new elector")
        dead.set()

    async def _taken_by(self) -> str | None:
        """Who the note says took it ("?": it could not be read)."""
        try:
            with anyio.fail_after(5.0):
                note, _ = await self.observer._gate.read()
        except (TimeoutError, aioelect.ElectionError):
            return "?"
        return note.taken_by if note is not None else "?"

    def judge(self, until: int) -> list[Violation]:
        """The step-downs' violations (:func:`judge`); ``until``: when candidates stopped campaigning (ns)."""
        found, counts = judge(self.steps, self.seen, self.warnings, self.reopen, until)
        for what, n in counts.items():
            self.counts[what] = self.counts.get(what, 0) + n
        return found


def judge(
    steps: list[Step], seen: list[Seen], warnings: list[tuple[int, str]], reopen: float, until: int
) -> tuple[list[Violation], dict[str, int]]:
    """The violations of ``steps`` (see the module), given the electors' events ``seen`` and the WARNINGs logged,
    and what became of each step-down, counted. ``until``: when candidates stopped campaigning (ns)."""
    found = []
    counts: dict[str, int] = {}

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    for step in steps:
        mine = [s for s in seen if s.who == step.leader and s.token == step.token]
        asked = [s for s in mine if s.kind == "handover_requested"]
        stepped = [s for s in mine if s.kind == "stepped_down"]
        if len(asked) > 1 or len(stepped) > 1:
            found.append(
                Violation(
                    "twice",
                    f"{step.leader}'s leadership (token {step.token}) stepped down {len(asked)} times "
                    f"({len(stepped)} stepped_down events) on one {step.kind}",
                    step.at,
                )
            )
        if not asked:
            count("step-down not made (leadership gone, or the note unwritten)")
            continue
        note = asked[0]
        deadline = note.at + int((step.timeout + reopen) * _NS)
        # The first leadership after the step-down was asked for: the note is a fenced write, so none can start
        # between then and the write; its news may come before the note's own (the write's reply held back).
        nxt = next((s for s in seen if s.kind == "acquired" and s.at > step.at), None)
        if nxt is None or nxt.at > deadline:
            if deadline > until:
                count("handover unjudged (the run ended)")
                continue
            found.append(
                Violation(
                    "stuck",
                    f"{step.leader} (token {step.token}) stepped down to {note.successor!r} ({step.kind}, "
                    f"window {step.timeout:.1f}s"
                    + (f", {step.victim} gone" if step.victim else "")
                    + f"): nobody led within {step.timeout + reopen:.1f}s",
                    deadline,
                )
            )
            continue
        count("handover judged")
        if step.victim is not None:
            count(f"{step.kind} judged")
        named = nxt.who == note.successor if note.successor is not None else nxt.who != step.leader
        over = nxt.at >= step.at + int(step.timeout * _NS)
        if named or (note.successor is None and over):
            count("handover to the one named" if named else "handover after the window")
            continue
        if note.successor is not None and step.taken_by == note.successor:
            count("handover taken by the one named, which then went")
            continue
        warned = any(step.at <= at <= nxt.at + _NS and any(s in m for s in _SAID) for at, m in warnings)
        if warned:
            count("handover passed over, with a WARNING")
            continue
        found.append(
            Violation(
                "silent",
                f"{nxt.who} led {(nxt.at - step.at) / 1e9:.2f}s after {step.leader} (token {step.token}) stepped "
                f"down to {note.successor!r} ({step.kind}; note taken by {step.taken_by!r}) with no WARNING",
                nxt.at,
            )
        )
    return found, counts


async def _until(condition: Callable[[], bool], within: float) -> None:
    """Return once ``condition()`` holds (looked at every 20 ms), or after ``within`` s."""
    for _ in range(max(1, int(within / 0.02))):
        if condition():
            return
        await anyio.sleep(0.02)
