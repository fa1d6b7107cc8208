"""The network and server as the adversary plays them: an :class:`~aioelect.core._backend.Interceptor`.

Each exchange between a backend and its server (an etcd request, an etcd
watch message, a SQL statement) gets its own draws from a seeded RNG: a
delay before the request leaves, a delay before the reply is handed back,
and perhaps a failure. Delays are independent per exchange, so a reply can
arrive after a later one, as on a gRPC connection that multiplexes calls or
across connections. Failures are those a network or server gives:

* the request is lost (the connection drops before it is sent);
* the reply is lost (the server ran the request, the connection dropped);
* etcd cancels a watch (the watch answers ``canceled``, as the server does
  when it ends a watch).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

__all__ = ["Network", "Profile"]


@dataclass(frozen=True)
class Profile:
    """How often each thing happens to one exchange (probabilities) and how long delays are (seconds)."""

    #: A short delay (up to ``short``) on the request, and independently on the reply.
    short_p: float = 0.25
    short: float = 0.05
    #: A long delay (``long_min`` .. ``long``): the late reply that reorders. An etcd watch's creation or message
    #: is held back at most ``watch_long`` each way: it may carry the news of a lost leadership, which the margin
    #: must cover.
    long_p: float = 0.05
    long_min: float = 0.2
    long: float = 2.0
    watch_long: float = 0.5
    #: The request lost before it is sent, or the reply lost after the server ran it.
    lost_request_p: float = 0.01
    lost_reply_p: float = 0.01
    #: An etcd watch cancelled by the server while a read waits (after up to ``cancel_within`` s), per read.
    cancel_watch_p: float = 0.1
    cancel_within: float = 2.0
    #: Exchanges (by ``what``) whose replies are late far more often (``slow_p``) for one elector, the seed's
    #: victim (which the operator also picks on more often): faults that meet on one elector.
    slow: tuple[str, ...] = ()
    slow_p: float = 0.5
    #: The victim's watch messages are cancelled this often instead of ``cancel_watch_p`` (None: the same).
    victim_cancel_p: float | None = None
    #: The share of the operator's key deletions (etcd) aimed at the victim's key.
    victim_keys: float = 0.5
    #: The operator's weights for this seed, (action, weight) pairs, and its pace (seconds between actions, on
    #: average); empty, None: the target's own.
    actions: tuple[tuple[str, float], ...] = ()
    pace: float | None = None
    #: How many electors (bounds), the share of campaigns with a timeout, and the share of releases after which
    #: an elector pauses with its kept session instead of campaigning again at once.
    electors: tuple[int, int] = (3, 6)
    timeout_p: float = 0.5
    #: The share of leaderships held long (``long_hold`` s, beyond the margin) rather than short (0.05-0.5 s).
    long_hold_p: float = 0.55
    long_hold: tuple[float, float] = (3.0, 8.0)
    pause_p: float = 0.4
    #: The victim's own ``timeout_p``, ``pause_p`` or ``long_hold_p``, as (name, value) pairs.
    victim_loop: tuple[tuple[str, float], ...] = ()
    #: The share of the victim's slow replies held back until overtaken rather than for a drawn time, among those
    #: to the first request of a slow kind after the server cancelled one of its watches (the read that catches up
    #: with what the watch missed): handed back once ``overtake`` (bounds) later requests of the same elector have
    #: completed, counted from when the hold is armed (at once, or by the operator once it has reacted), or after
    #: ``long`` s. Keep-alives and watch exchanges do not count. Such a reply lands just after newer ones.
    overtake_p: float = 0.0
    overtake: tuple[int, int] = (1, 3)
    #: Whether the operator reacts to a reply held until overtaken: while it is held, it changes what the
    #: elector should see, each step on the news of the one before (a leader ends its term early and campaigns
    #: again, the elector's key is deleted; once the reply is handed back, the candidate just ahead gives up),
    #: waiting ``react_gap`` (bounds, s) before the first (the lower bound at most before the last).
    react: bool = False
    react_gap: tuple[float, float] = (0.05, 0.25)
    #: While a reply of an elector is held until overtaken, and ``calm`` s after, none of its watches is
    #: cancelled; after reacting, the operator takes none of its other actions for ``quiet`` (bounds, s), so
    #: that what follows plays out.
    calm: float = 1.5
    quiet: tuple[float, float] = (2.5, 5.0)

    @classmethod
    def draw(
        cls,
        rng: random.Random,
        kinds: tuple[str, ...] = (),
        *,
        views: tuple[str, ...] = (),
        restarts: bool = False,
    ) -> Profile:
        """A profile of its own for one seed (swarm testing: some seeds mostly delay, some mostly fail, some make
        up to three of ``kinds`` slow...).

        Some seeds aim where a few faults must meet on one elector:

        * with ``views`` (the reads by which a waiter learns who leads), two
          seeds in five aim at a late view: four to six electors, the
          victim's reads of the leader come back late most of the time (up
          to 4.5 s, under etcd's 5 s request timeout), its watches are
          cancelled often (a waiter whose watch of the leader is cancelled
          reads the leader again), and the first such read after a
          cancellation is most often held until overtaken by the victim's
          own later requests while the operator reacts
          (``soak.adversary.run._react``): the leader ends its term and
          campaigns again on its kept lease (the same key bytes), the
          victim's key is deleted and put again behind it, the read lands,
          and the candidate just ahead of the victim gives up; otherwise the
          operator deletes keys often, most of them the victim's; the victim
          waits without a timeout and its leaderships are long (3-6 s, as
          more than half of the others'), so that two leaders, if there are,
          act together beyond the margin;
        * with ``restarts`` (a SQL server whose sessions the operator ends),
          two seeds in five aim at sessions kept across restarts: three
          electors on a calm network, an operator that restarts the server
          with the connection ids of kept sessions reused (MariaDB's
          ``restart-reusing-ids``) and does little else, and a victim that
          leads briefly and mostly pauses after a release with its kept
          session while the others campaign again at once (and lead for
          1-2.5 s one time in four or so), so that one of them leads on the
          restarted server on the id of the victim's session, and the victim
          campaigns again on its session kept from before.

        Of the other seeds, one in four is calm: short delays only, the
        operator alone.
        """
        aim = rng.random()
        if views and aim < 0.4:
            return cls(
                slow=views,
                slow_p=rng.uniform(0.6, 0.95),
                short_p=rng.uniform(0.0, 0.3),
                long_p=rng.uniform(0.0, 0.03),
                long=rng.uniform(2.5, 4.5),
                watch_long=0.25,
                lost_request_p=0.0,
                lost_reply_p=rng.uniform(0.0, 0.01),
                cancel_watch_p=rng.uniform(0.02, 0.2),
                victim_cancel_p=rng.uniform(0.3, 0.7),
                cancel_within=1.0,
                victim_keys=rng.uniform(0.5, 0.8),
                actions=(("delete-key", 5.0), ("revoke-lease", 0.2)),
                pace=0.5,
                electors=(4, 6),
                timeout_p=rng.uniform(0.1, 0.3),
                long_hold_p=rng.uniform(0.5, 0.8),
                long_hold=(3.0, 6.0),
                victim_loop=(("timeout_p", 0.0), ("long_hold_p", 1.0)),
                pause_p=rng.uniform(0.0, 0.2),
                overtake_p=rng.uniform(0.7, 1.0),
                overtake=(2, 2),
                react=True,
            )
        if restarts and aim < 0.4:
            return cls(
                long_p=0.0,
                lost_request_p=0.0,
                lost_reply_p=0.0,
                cancel_watch_p=0.0,
                actions=(("restart-reusing-ids", 20.0), ("kill-holder", rng.uniform(0.0, 1.5))),
                pace=0.6,
                electors=(3, 3),
                long_hold_p=rng.uniform(0.1, 0.4),
                long_hold=(1.0, 2.5),
                pause_p=rng.uniform(0.0, 0.2),
                victim_loop=(("pause_p", rng.uniform(0.8, 1.0)), ("long_hold_p", 0.0)),
            )
        if rng.random() < 0.25:
            return cls(long_p=0.0, lost_request_p=0.0, lost_reply_p=0.0, cancel_watch_p=0.0)
        return cls(
            slow=tuple(rng.sample(kinds, k=min(3, len(kinds)))),
            slow_p=rng.uniform(0.2, 0.8),
            short_p=rng.uniform(0.0, 0.5),
            long_p=rng.uniform(0.02, 0.25),
            long=rng.uniform(1.0, 4.0),
            lost_request_p=rng.uniform(0.0, 0.03),
            lost_reply_p=rng.uniform(0.0, 0.03),
            cancel_watch_p=rng.uniform(0.05, 0.5),
            cancel_within=1.0,
        )


class Network:
    """One elector's link to its server: seeded, independent faults on every exchange.

    ``lost`` builds the exception a dropped connection raises for the
    backend's driver; ``cancelled`` the etcd reply that cancels a watch (None
    for SQL). Counts of what was done are in :attr:`counts`.
    """

    def __init__(
        self,
        rng: random.Random,
        profile: Profile,
        lost: Callable[[str], Exception],
        cancelled: Callable[[], Any] | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self._trace = trace or (lambda line: None)
        self._rng = rng
        self._profile = profile
        self._lost = lost
        self._cancelled = cancelled
        #: The seed's victim: only its exchanges of the slow kinds are slow. Leases it was granted (etcd).
        self.victim = False
        self.leases: set[str] = set()
        self.counts: Counter[str] = Counter()
        #: Off while the run ends, so that closing is not itself faulted.
        self.active = True
        #: While set, every exchange is lost (the elector cut off from its server): set by the operator's handovers.
        self.cut = False
        #: This elector's requests completed so far (not keep-alives, not watch exchanges), and how many of its
        #: replies are held until overtaken now (the operator reacts to them).
        self.requests = 0
        self.holding = 0
        self._progress: anyio.Event | None = None
        self._unheld: anyio.Event | None = None
        #: False from a watch cancelled by the server until the next request of a slow kind.
        self._caught_up = True
        #: The cancellations by the server drawn for watch reads now waiting.
        self._cancels: set[anyio.CancelScope] = set()
        #: The request count from which a held reply counts the requests that overtake it (None: not armed yet).
        self._armed: int | None = None
        self._claimed = False
        #: Until then (monotonic s) the server cancels none of its watches: one fault at a time on an elector.
        self._calm_until = 0.0

    def _delay(self, longest: float) -> float:
        p, draw = self._profile, self._rng.random()
        if draw < p.long_p:
            return self._rng.uniform(min(p.long_min, longest), longest)
        if draw < p.long_p + p.short_p:
            return self._rng.uniform(0.0, p.short)
        return 0.0

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if not self.active:
            return await send()
        if self.cut:
            self.counts["cut-off exchange"] += 1
            await anyio.sleep(0.05)  # not a busy loop: the elector retries
            raise self._lost(what)
        p, rng = self._profile, self._rng
        # Every draw is taken now, in the order exchanges start, whatever happens to this one.
        # A watch's creation and its messages are how a leader hears that its key went: held back at most
        # ``watch_long`` (the margin covers that), and never lost on their own.
        message = what.startswith("watch")
        longest = p.watch_long if message else p.long
        before, after = self._delay(longest), self._delay(longest)
        overtake = 0
        if self.victim and what in p.slow and rng.random() < p.slow_p:
            after = rng.uniform(p.long_min, longest)
            if p.overtake_p and rng.random() < p.overtake_p and not self._caught_up:
                overtake = rng.randint(*p.overtake)
        if what in p.slow:
            self._caught_up = True
        lose_request, lose_reply = rng.random() < p.lost_request_p, rng.random() < p.lost_reply_p
        cancel = None
        cancel_p = p.victim_cancel_p if self.victim and p.victim_cancel_p is not None else p.cancel_watch_p
        if self._cancelled is not None and what == "watch message" and rng.random() < cancel_p:
            cancel = rng.uniform(0.0, p.cancel_within)
            if self.holding or time.monotonic() < self._calm_until:
                cancel = None
        if before >= p.long_min:
            self._trace(f"{what}: request held back {before:.2f}s")
        if after >= p.long_min and not overtake:
            self._trace(f"{what}: reply will be held back {after:.2f}s")
        if before:
            self.counts["delayed request"] += 1
            await anyio.sleep(before)
        if lose_request and not message:
            self.counts["lost request"] += 1
            self._trace(f"{what}: request lost")
            raise self._lost(what)
        if cancel is None:
            reply = await send()
        else:
            reply = None
            # A reply held until overtaken from now on calls this cancellation off (see :meth:`_overtaken`).
            scope = anyio.CancelScope(deadline=anyio.current_time() + cancel)
            self._cancels.add(scope)
            try:
                with scope:
                    reply = await send()
            finally:
                self._cancels.discard(scope)
            if reply is None:  # no message within the time drawn: the server cancels the watch
                assert self._cancelled is not None
                self.counts["cancelled watch"] += 1
                self._caught_up = False
                self._trace("watch cancelled by the server")
                return self._cancelled()
        if overtake:
            self.counts["overtaken reply"] += 1
            await self._overtaken(what, overtake, longest)
        elif after:
            self.counts["delayed reply"] += 1
            await anyio.sleep(after)
            if after >= p.long_min:
                self._trace(f"{what}: late reply delivered")
        if not message and what != "lease keep-alive":
            self.requests += 1
            if self._progress is not None:
                self._progress.set()
                self._progress = None
        if what == "lease grant":
            lease = f"{getattr(reply, 'ID', 0):x}"
            self.leases.add(lease)
            self._trace(f"lease grant: lease {lease}")
        if lose_reply and not message:
            self.counts["lost reply"] += 1
            self._trace(f"{what}: reply lost")
            raise self._lost(what)
        return reply

    async def unheld(self) -> None:
        """Return once no reply of this elector is held until overtaken."""
        while self.holding:
            if self._unheld is None:
                self._unheld = anyio.Event()
            await self._unheld.wait()

    @property
    def unclaimed(self) -> bool:
        """Whether a reply is held until overtaken and the operator has not :meth:`claim`-ed it."""
        return bool(self.holding) and not self._claimed

    def claim(self) -> None:
        """The operator reacts to the reply held now: it counts no request until :meth:`arm`."""
        self._armed = None
        self._claimed = True

    def arm(self) -> None:
        """The held reply counts the requests completed from now on."""
        self._armed = self.requests
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def _overtaken(self, what: str, later: int, longest: float) -> None:
        """Hold a reply until ``later`` requests of this elector complete once armed, at most ``longest`` s."""
        self._armed, self._claimed = self.requests, False
        self.holding += 1
        for scope in self._cancels:
            scope.deadline = math.inf
        self._trace(f"{what}: reply held back until {later} later request(s) complete (at most {longest:.2f}s)")
        try:
            with anyio.move_on_after(longest):
                while self._armed is None or self.requests < self._armed + later:
                    if self._progress is None:
                        self._progress = anyio.Event()
                    await self._progress.wait()
        finally:
            self.holding -= 1
            self._calm_until = time.monotonic() + self._profile.calm
            if not self.holding and self._unheld is not None:
                self._unheld.set()
                self._unheld = None
        self._trace(f"{what}: late reply delivered")
