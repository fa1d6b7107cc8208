"""One adversary run: several electors in one process against one real server, then the checker.

Each elector campaigns, leads for a while and releases, over and over, on
its own seeded RNG: some campaigns carry a timeout (and give up), some
leaderships are short and some long, and every campaign after the first
runs on the session the elector kept (etcd's lease, the SQL engine's kept
lock session). While it leads it records an act every 20-50 ms, each act
being a read of ``held`` that was True. Every exchange with the server goes
through the elector's own :class:`~.network.Network`; the operator acts on
the server between them, and, in the seeds that aim at a late view, reacts
to a reply held until overtaken (:func:`_react`).

The run is judged by :func:`soak.checker.check` (overlap beyond the margin,
tokens that do not grow) and by :func:`deposed`: a SQL leader whose session
the server ended while no operator action could explain it (its session was
ended by someone who took it for another).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

import aioelect
from soak.checker import Act, Fault, History, Term, Verdict, Violation, check, claim
from soak.timing import OVERLAP_SLACK, confirmation_gap

from . import redis_target
from .network import Network, Profile
from .servers import Target

if TYPE_CHECKING:  # the library as it was before a fix (old/, scripts/adversary-old.sh) lacks what these import
    from aioelect.core._backend import Interceptor

    from .handovers import Handovers

__all__ = ["OPTIONS", "Loss", "Outcome", "deposed", "margin", "run_seed", "tokens"]

_NS = 1_000_000_000

#: Elector options per backend. SQL: the fault suite's checks, with a lease long enough that a kept session
#: is still used again after a server restart (it is kept for lease / 2).
OPTIONS: dict[str, dict[str, Any]] = {
    "etcd": {"ttl": 3},
    "mysql": {"lease": 20, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 1.0},
    "postgres": {
        "lease": 20,
        "check_interval": 0.3,
        "check_timeout": 0.6,
        "renew_deadline": 2.0,
        "poll_interval": 1.0,
    },
    "redis": redis_target.OPTIONS,
}


def margin(backend: str, profile: Profile) -> float:
    """Seconds two leaders may both act: the documented bound for a deposed leader to notice, plus scheduling.

    etcd: the news of the loss is a watch message, which the adversary may
    hold back up to ``profile.watch_long`` on the way there and again on the
    way back. SQL: each check is bounded by ``check_timeout`` whatever the
    adversary does, so a deposed leader stops within ``check_interval + 2 *
    check_timeout`` (:func:`aioelect.core._config.confirmation_gap`), and a closed
    session is seen at once.
    """
    options = OPTIONS[backend]
    if backend == "redis":
        return redis_target.margin()
    if backend == "etcd":
        # A revoked lease or deleted key reaches the leader by its watch, at the latest by its next keep-alive.
        return options["ttl"] / 3 + 2 * profile.watch_long + OVERLAP_SLACK
    return confirmation_gap(options["check_interval"], options["check_timeout"]) + OVERLAP_SLACK  # docs/guarantees.md


@dataclass(frozen=True)
class Loss:
    """A leadership of ``who`` (started at ``start``) lost at ``at`` for ``reason``."""

    who: str
    token: int | None
    start: int
    at: int
    reason: str


@dataclass
class Outcome:
    """What one run recorded and the verdict on it."""

    backend: str
    seed: int
    verdict: Verdict
    faults: list[Fault]
    losses: list[Loss]
    counts: dict[str, int] = field(default_factory=dict)
    #: (monotonic ns, who, what): elector events, the operator's actions, the network's notable faults.
    trace: list[tuple[int, str, str]] = field(default_factory=list)
    #: The exchanges this seed made slow.
    slow: tuple[str, ...] = ()

    @property
    def violations(self) -> list[Violation]:
        """Everything the run found, except leaderless time (electors here step aside on purpose)."""
        return [v for v in self.verdict.violations if v.kind != "gap"]

    @property
    def ok(self) -> bool:
        return not self.violations


#: What a SQL backend says when the server ended the lock session or the lock is no longer the session's.
_SESSION_ENDED = (
    "the server closed the lock connection",
    "lock is no longer held by our session",
    "lock connection closed (session terminated",
    "advisory lock is no longer held by our session",
)


def _ends(start: int, fault: Fault) -> bool:
    """Whether a KILL can have ended a leadership that started at ``start``: the holder's session, or another
    session that became the holder just then."""
    return fault.kind == "kill-holder" or fault.start - _NS <= start


def deposed(losses: list[Loss], faults: list[Fault], window: float) -> list[Violation]:
    """SQL leaders whose session ended with no operator action to explain it.

    A session ended: the server closed it, the lock is no longer its, or a
    check failed with the driver's error (not one the adversary raised).
    An action explains a loss at ``t`` of a leadership that started at ``s``
    if it happened at most ``window`` seconds before ``t`` and: it ended the
    holder's session; it ended another session that became the holder just
    then (``s`` not more than a second before it); or it was a restart in
    progress when the leadership existed, or a restart after which the
    server held the leadership's token already (granted before it went
    down). A leadership can start after the action that ends it: the server
    granted the lock before the action, and the adversary held back the
    replies that tell the elector so. A KILL ends one session, so it explains
    one loss at most.
    """
    found = []
    w = int(window * _NS)
    used: set[int] = set()
    for loss in sorted(losses, key=lambda loss: loss.at):
        # A session ended under a check in flight fails the check with the driver's error instead.
        failed = loss.reason.startswith("lock connection failed") and "adversary" not in loss.reason
        if not (loss.reason.startswith(_SESSION_ENDED) or failed):
            continue
        t, s = loss.at, loss.start
        explained = any(
            f.kind.startswith("restart")
            and not f.detail.startswith("no ")
            and (
                s <= f.heal
                or (f.granted_before is not None and loss.token is not None and loss.token <= f.granted_before)
            )
            and f.start <= t <= f.heal + w
            for f in faults
        )
        explained = explained or claim(faults, used, t, w, ("kill-holder", "kill-session"), partial(_ends, s))
        if not explained:
            found.append(
                Violation(
                    "deposed",
                    f"{loss.who}'s leadership (token {loss.token}) ended: {loss.reason}; no operator action ended "
                    "its session",
                    loss.at,
                )
            )
    return found


def tokens(leaderships: list[Term], margin: float) -> list[Violation]:
    """Leaderships whose token is not larger than that of one that started more than ``margin`` s before.

    A leadership granted before another but seen late (its news held back)
    starts acting after it: within the margin that is the overlap the
    margin allows, beyond it the order of tokens is broken.
    """
    found = []
    m = int(margin * _NS)
    for i, later in enumerate(leaderships):
        for earlier in leaderships[:i]:
            if later.start - earlier.start <= m or earlier.token is None or later.token is None:
                continue
            if later.token <= earlier.token:
                found.append(
                    Violation(
                        "token",
                        f"{later.who}'s leadership (token {later.token}) started "
                        f"{(later.start - earlier.start) / _NS:.2f} s after {earlier.who}'s (token {earlier.token}) "
                        "but its token is not larger",
                        later.start,
                    )
                )
    return found


class _Candidate:
    """One elector and the loop that campaigns, leads and releases."""

    def __init__(
        self, who: str, elector: aioelect.Elector, network: Network, rng: random.Random, profile: Profile
    ) -> None:
        self.who = who
        self.elector = elector
        self.network = network
        self.rng = rng
        self.acts: list[Act] = []
        self.losses: list[Loss] = []
        self.counts: dict[str, int] = {}
        #: Set while the elector pauses between campaigns, holding its kept session: the operator may end the pause.
        self.pausing: anyio.Event | None = None
        self.pause_p, self.timeout_p, self.long_hold_p = profile.pause_p, profile.timeout_p, profile.long_hold_p
        self.long_hold = profile.long_hold
        #: True while it leads; ``end_term`` set by the operator ends that leadership early (a release).
        self.leading = False
        self.end_term = False
        #: The leadership while it leads (the operator's handovers step it down).
        self.lead: aioelect.Leadership | None = None
        #: The campaign in progress: the operator may cancel it (the elector gives up, as on a timeout).
        self.campaign: anyio.CancelScope | None = None
        #: Run at the start of each leadership, before any act (the fenced workload's job: soak/adversary/fenced.py).
        self.job: Callable[[aioelect.Leadership], Awaitable[None]] | None = None

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def loop(self, until: float) -> None:
        rng = self.rng
        while time.monotonic() < until:
            timeout = rng.uniform(0.1, 1.5) if rng.random() < self.timeout_p else None
            lead = None
            try:
                with anyio.CancelScope() as self.campaign:
                    lead = await self.elector.acquire(timeout=timeout)
            except TimeoutError:
                self._count("campaign timeout")
                continue
            finally:
                self.campaign = None
            if lead is None:
                self._count("campaign abandoned")
                continue
            self._count("leadership")
            start = time.monotonic_ns()
            if self.job is not None:
                await self.job(lead)
            # Short leaderships make handovers; long ones outlast the margin, so that two leaders show.
            hold = rng.uniform(*self.long_hold) if rng.random() < self.long_hold_p else rng.uniform(0.05, 0.5)
            stop = min(time.monotonic() + hold, until)
            self.leading, self.end_term, self.lead = True, False, lead
            while time.monotonic() < stop and not self.end_term:
                t0 = time.monotonic_ns()
                if not lead.held:
                    break
                self.acts.append(Act(self.who, lead.token, t0, time.monotonic_ns(), True))
                await anyio.sleep(rng.uniform(0.02, 0.05))
            if lead.lost:
                self.losses.append(Loss(self.who, lead.token, start, time.monotonic_ns(), lead.lost_reason or ""))
            await lead.release()
            self.leading, self.lead = False, None
            # Mostly back at once; sometimes a pause with the kept session, which the operator may end (after a
            # restart...) by a re-campaign on that session.
            if rng.random() >= self.pause_p:
                await anyio.sleep(rng.uniform(0.0, 0.1))
                continue
            self.pausing = anyio.Event()
            with anyio.move_on_after(rng.uniform(1.0, 6.0)):
                await self.pausing.wait()
            self.pausing = None

    def recampaign(self) -> bool:
        """End the pause, if pausing: the next campaign runs on the kept session now."""
        if self.pausing is None:
            return False
        self.pausing.set()
        return True


class _Trace:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str, str]] = []

    def sink(self, who: str) -> Any:
        return lambda line: self.lines.append((time.monotonic_ns(), who, line))


def _listen(elector: aioelect.Elector, say: Any) -> None:
    def on_event(event: aioelect.Event) -> None:
        if event.kind in ("acquired", "lost", "released", "campaigning"):
            say(f"{event.kind} token={event.token}" + (f" ({event.reason})" if event.reason else ""))
        elif event.kind == "error":
            say(f"retrying: {event.reason}")

    elector.add_listener(on_event)


def _recampaign(candidates: list[_Candidate], rng: random.Random, *, every: bool = False) -> str:
    """Make an elector that pauses between campaigns (``every``: each one) campaign again now, on its kept session."""
    pausing = [c for c in candidates if c.pausing is not None]
    if not pausing:
        return "nobody pausing"
    chosen = pausing if every else [rng.choice(pausing)]
    for candidate in chosen:
        candidate.recampaign()
    return f"{', '.join(c.who for c in chosen)} campaign(s) again on the kept session"


async def _operator(
    target: Target,
    candidates: list[_Candidate],
    rng: random.Random,
    until: float,
    faults: list[Fault],
    errors: list[str],
    say: Any,
    profile: Profile | None = None,
    handovers: Handovers | None = None,
) -> None:
    """The operator's actions on the server, one every ``target.pace`` seconds or so, and re-campaigns.

    After a restart, most often (after a restart reusing ids, always) every
    elector pausing with its kept session campaigns again soon after, once
    the target says the others are back (:meth:`Target.back`): their sessions
    outlived the server. The weights and pace are the target's, or the
    profile's where it has its own.
    """
    actions = dict(profile.actions) if profile is not None and profile.actions else target.actions
    pace = profile.pace if profile is not None and profile.pace is not None else target.pace
    kinds = [*actions, "recampaign"]
    weights = [*actions.values(), 2.0]
    if handovers is not None:  # twice as often, in all, as the target's own actions
        share = 2 * sum(actions.values()) / sum(handovers.kinds.values())
        kinds += handovers.kinds
        weights += [w * share for w in handovers.kinds.values()]
    after_restart = False
    react = profile is not None and profile.react
    quiet = 0.0  # until then, only reactions
    while True:
        # After a restart, the re-campaign waits until the others are back (the new server's sessions exist).
        holder = None
        if after_restart:
            after_restart = await target.back(rng.uniform(0.3, 3.0))
        elif react:
            holder = await _wait_for_hold(candidates, rng.uniform(0.2, 2 * pace))
        else:
            await anyio.sleep(rng.uniform(0.2, 2 * pace))
        if time.monotonic() >= until:
            return
        if holder is not None:
            assert profile is not None
            await _react(target, candidates, holder, rng, faults, errors, say, profile.react_gap)
            quiet = time.monotonic() + rng.uniform(*profile.quiet)
            continue
        if time.monotonic() < quiet:
            continue
        kind = "recampaign" if after_restart else rng.choices(kinds, weights)[0]
        every = after_restart
        after_restart = kind == "restart-reusing-ids" or (kind == "restart" and rng.random() < 0.8)
        start = time.monotonic_ns()
        if kind == "recampaign":
            say(f"recampaign: {_recampaign(candidates, rng, every=every)}")
            continue
        try:
            if handovers is not None and kind in handovers.kinds:
                detail = await handovers.act(kind, rng)
            else:
                detail = await target.act(kind, rng)
        except Exception as exc:
            errors.append(f"{kind} failed: {exc!r}")
            await anyio.to_thread.run_sync(target.recover)
            continue
        heal = time.monotonic_ns()
        say(f"{kind}: {detail} (began {(heal - start) / 1e9:.2f}s before)")  # the checker judges from its start
        granted, target.granted_before = target.granted_before, None
        faults.append(Fault(kind, target.backend, start, heal, heal, detail, granted_before=granted))


async def _wait_for_hold(candidates: list[_Candidate], delay: float) -> _Candidate | None:
    """Sleep ``delay`` s, or less if an elector holds a reply until overtaken that no reaction claimed: that elector."""
    end = time.monotonic() + delay
    while time.monotonic() < end:
        await anyio.sleep(min(0.02, max(0.0, end - time.monotonic())))
        for c in candidates:
            if c.network.unclaimed:
                return c
    return None


async def _poll(condition: Any, within: float) -> bool:
    """Whether ``condition()`` holds within ``within`` s (looked at every 10 ms)."""
    for _ in range(max(1, int(within / 0.01))):
        if condition():
            return True
        await anyio.sleep(0.01)
    return bool(condition())


async def _react(
    target: Target,
    candidates: list[_Candidate],
    holder: _Candidate,
    rng: random.Random,
    faults: list[Fault],
    errors: list[str],
    say: Any,
    gap: tuple[float, float],
) -> None:
    """While ``holder`` holds a reply until overtaken, make that reply stale, then let it land among the news.

    Each step is drawn (most often taken), each on the news of the one
    before: a leader (another elector) ends its term early; once it has
    released, if it pauses with its kept session, it campaigns again; once
    its campaign's first request is done, the holder's key is deleted
    (etcd), so that the holder campaigns again while the reply is held, and
    the reply is handed back after the holder's next requests. Once it is,
    the candidate just ahead of the holder (etcd: the key created just before
    its own) gives up its campaign, as on a timeout.
    """
    head = f"(while {holder.who} holds a reply)"
    holder.network.claim()
    await anyio.sleep(rng.uniform(*gap))
    if rng.random() >= 0.1:
        leaders = [c for c in candidates if c.leading and c is not holder]
        ended = rng.choice(leaders) if leaders else None
        say(f"end-term {head}: {ended.who if ended else 'no other leader'}")
        if ended is not None:
            ended.end_term = True
            await _poll(lambda: not ended.leading, 1.0)
            done = ended.network.requests
            if await _poll(lambda: ended.pausing is not None or ended.campaign is not None, 0.5):
                if ended.pausing is not None and rng.random() >= 0.1:
                    ended.recampaign()
                    say(f"recampaign {head}: {ended.who} campaigns again on its kept session")
                await _poll(lambda: ended.network.requests > done, 1.0)
    if not holder.network.holding:
        return
    if rng.random() >= 0.1:
        start = time.monotonic_ns()
        try:
            detail = await target.delete_key_of(holder.network.leases)
        except Exception as exc:
            errors.append(f"delete-key failed: {exc!r}")
        else:
            heal = time.monotonic_ns()
            say(f"delete-key of {holder.who} {head}: {detail}")
            faults.append(Fault("delete-key", target.backend, start, heal, heal, detail))
    holder.network.arm()
    with anyio.move_on_after(5.0):
        await holder.network.unheld()
    if rng.random() < 0.1:
        return
    ahead = await target.ahead_of(holder.network.leases)
    await anyio.sleep(rng.uniform(0.0, gap[0]))
    quitter = next((c for c in candidates if ahead is not None and ahead in c.network.leases), None)
    if quitter is not None and quitter.campaign is not None:
        quitter.campaign.cancel()
        say(f"abandon: {quitter.who}, just ahead of {holder.who}, gives up its campaign")
    else:
        say(f"abandon: nobody campaigns just ahead of {holder.who}")


def _elector(target: Target, who: str, handovers: bool = False) -> aioelect.Elector:
    backend = target.backend
    options = {**OPTIONS[backend], **target.extra_options}
    if handovers:
        from .handovers import OPTIONS as HANDOVER_OPTIONS

        options.update(HANDOVER_OPTIONS.get(backend, {}))
    return aioelect.new(**{backend: target.target()}, name=target.name, identity=who, **options)


def _attach(elector: aioelect.Elector, network: Interceptor) -> None:
    """Put ``network`` between the elector's backend and its server (the backends' interceptor seam)."""
    backend: Any = elector._backend  # not backend_of(): the old libraries (old/) lack it
    if hasattr(backend, "intercept"):
        backend.intercept(network)
    elif hasattr(backend, "conn"):  # a library from before the attach point, with its seam patched in (old/)
        backend.conn.interceptor = network
    else:
        backend.interceptor = network


async def run_seed(
    target: Target,
    seed: int,
    seconds: float,
    *,
    electors: int | None = None,
    profile: Profile | None = None,
    setup: Callable[[_Candidate], None] | None = None,
    handovers: bool = False,
) -> Outcome:
    """Run ``electors`` electors against ``target`` for ``seconds`` under seed ``seed``; judge the history.

    Without ``electors`` or ``profile``, the seed draws them (3 to 6 electors, :meth:`Profile.draw`).
    ``setup`` is called with each candidate before it starts (a workload of its own: soak/adversary/fenced.py).
    With ``handovers``, the operator also steps leaders down (:mod:`.handovers`), and the judge checks those too.
    """
    master = random.Random(seed)
    profile = (
        profile
        or target.draw(master)
        or Profile.draw(master, target.kinds, views=target.views, restarts=target.reuses_ids)
    )
    electors = electors or master.randint(*profile.electors)
    trace = _Trace()
    candidates = []
    for i in range(electors):
        who = f"e{i}"
        network = Network(
            random.Random(master.getrandbits(64)), profile, target.lost, target.cancelled, trace.sink(who)
        )
        elector = _elector(target, who, handovers)
        _attach(elector, network)
        _listen(elector, trace.sink(who))
        candidates.append(_Candidate(who, elector, network, random.Random(master.getrandbits(64)), profile))
        if setup is not None:
            setup(candidates[-1])
    operator_rng = random.Random(master.getrandbits(64))
    victim = master.choice(candidates)
    victim.network.victim = True
    for name, value in profile.victim_loop:
        setattr(victim, name, value)
    target.victim_leases = victim.network.leases
    target.electors = [c.elector for c in candidates]
    target.victim_share = profile.victim_keys
    trace.sink(victim.who)("the seed's victim: slow " + (", ".join(profile.slow) or "-"))
    faults: list[Fault] = []
    errors: list[str] = []
    bound = margin(target.backend, profile)
    hand = _handovers(target, candidates, faults, trace, profile, bound) if handovers else None
    begin = time.monotonic_ns()
    until = time.monotonic() + seconds
    try:
        with hand.warnings_caught() if hand is not None else contextlib.nullcontext():
            async with anyio.create_task_group() as tg:
                for candidate in candidates:
                    await candidate.elector.__aenter__()
                    tg.start_soon(hand.live if hand is not None else _loop, candidate, until)
                tg.start_soon(
                    _operator,
                    target,
                    candidates,
                    operator_rng,
                    until,
                    faults,
                    errors,
                    trace.sink("operator"),
                    profile,
                    hand,
                )
    finally:
        for candidate in candidates:
            candidate.network.active = False
            with anyio.CancelScope(shield=True):
                await candidate.elector.aclose()
        if hand is not None:
            with anyio.CancelScope(shield=True):
                await hand.observer.aclose()
    end = time.monotonic_ns()
    acts = [act for c in candidates for act in c.acts]
    losses = [loss for c in candidates for loss in c.losses]
    history = History(
        label=f"{target.label} seed {seed}",
        acts=acts,
        writes=[],
        faults=faults,
        begin=begin,
        end=end,
        margin=bound,
        base_gap=seconds,
        errors=errors,
    )
    verdict = check(history)
    verdict.violations = [v for v in verdict.violations if v.kind != "token"] + tokens(verdict.terms, bound)
    if target.backend in ("mysql", "postgres"):
        verdict.violations += deposed(losses, faults, bound + 2.0)
    elif target.backend == "redis":
        verdict.violations += redis_target.deposed(losses, faults, bound + 2.0)
    if hand is not None:
        verdict.violations += hand.judge(begin + int(seconds * _NS))
    counts: dict[str, int] = {}
    for c in candidates:
        for key, value in list(c.network.counts.items()) + list(c.counts.items()):
            counts[key] = counts.get(key, 0) + value
    for fault in faults:
        counts[fault.kind] = counts.get(fault.kind, 0) + 1
    counts.update(hand.counts if hand is not None else {})
    return Outcome(target.label, seed, verdict, faults, losses, counts, trace.lines, profile.slow)


async def _loop(candidate: _Candidate, until: float) -> None:
    await candidate.loop(until)


def _handovers(
    target: Target, candidates: list[_Candidate], faults: list[Fault], trace: _Trace, profile: Profile, bound: float
) -> Handovers:
    """The operator's handover actions on ``candidates``: each elector watched, renewed as it was made."""
    from .handovers import Handovers, reopen_bound

    async def renew(candidate: _Candidate) -> aioelect.Elector:
        elector = _elector(target, candidate.who, True)
        _attach(elector, candidate.network)
        _listen(elector, trace.sink(candidate.who))
        hand.watch(elector, candidate.who)
        await elector.__aenter__()
        target.electors = [c.elector for c in candidates if c is not candidate] + [elector]
        return elector

    options = {**OPTIONS[target.backend], **target.extra_options}
    reopen = reopen_bound(target.backend, options, profile, bound)
    observer = _elector(target, "observer", True)
    hand = Handovers(target, candidates, faults, trace.sink("operator"), renew, observer, reopen)
    for candidate in candidates:
        hand.watch(candidate.elector, candidate.who)
    return hand
