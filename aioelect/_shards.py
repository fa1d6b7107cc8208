"""Sharded leadership: a set of names spread over the live instances, each owned name a leadership of its own.

:class:`Shards` sits above :class:`~aioelect.Elector` and uses its public
contract, and of a backend only the protocol: whether it keeps fenced state
(``state_store()``, before a hand-over leaves a note) and, through
:func:`~aioelect.wiring._factory.shared_session_of`, which shared session an elector
is on. One election per name decides who owns that name, so mutual
exclusion is the elections' and no backend learns what a shard is. Above
them, each instance computes the same balanced count of names (its share)
for every live instance. An instance above its share resigns the excess (its
work cancelled first); one below it asks for free names, one lock request
that does not wait each (:meth:`~aioelect.Elector.try_acquire`), never more
at once than it lacks. Nobody waits in a name's election, so a released name
goes only to an instance short of its share, and an instance that releases
names never takes any: a join or a leave moves exactly the names the new
balance needs. No function of the live set alone can promise that with a
balance of one name (three names over five possible instances already
defeat it), hence the counts rather than a fixed assignment.

Who is live comes from the backend too: each instance holds one of
``max_instances`` *member* elections (``{group}/member/{k}``) for as long as
it runs, and every instance observes the leaders of all of them. An
instance that crashes loses its member election as it loses its names (its
session or lease ends), so the others drop it from their view when the
backend hands its names on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .core._config import validate_name
from .core._elector import Elector, Leadership, backend_of, default_identity, leading_if_free, validate_identity
from .core._errors import BackendUnavailable, ElectionError, LeadershipLost, UsageError
from .core._health import Health
from .core._tasks import FirstFailure
from .wiring._factory import env_options, from_env, shared_session_of, shared_sql_session
from .wiring._settings import Settings

__all__ = ["Shards", "assign"]

log = logging.getLogger("aioelect.shards")

#: Work run for each owned name: ``await work(name)``, cancelled when the name's leadership ends.
ShardWork = Callable[[str], Awaitable[object]]

#: How long an instance that found every member election taken waits before it tries again (seconds).
FULL_RETRY = 1.0

#: The longest pause between two passes over the names of an instance short of its share that found none free.
CLAIM_RETRY = 1.0

#: How the leader of an inbox election (``{group}/inbox/{k}``) starts when it hands a name to member ``k``.
GIFT = "gift:"

#: How long an instance that left (draining, unhealthy) still watches the inbox of the member election it held: a
#: name handed over to it meanwhile is let go at once instead of waiting out the giver's window.
OUT_INBOX_WATCH = 60.0
#: How often a member asks again for a name handed over to it, and a giver for the inbox of the member it gives to.
GIFT_POLL = 0.25


def _score(member: str, name: str) -> int:
    """Rendezvous weight of ``name`` on ``member``: the same on every instance and every run."""
    digest = hashlib.blake2b(f"{member}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(names: Sequence[str], members: Iterable[str]) -> dict[str, str]:
    """The preferred owner of each name among ``members``: balanced, and the same on every instance that sees them.

    Every member gets ``len(names) // len(members)`` names or one more: the
    share :class:`Shards` keeps each member to. Pairs (name, member) are
    taken by decreasing rendezvous weight, each name going to the first
    member that still has room. A member joining or leaving changes the owner
    of a few names beyond those the new balance needs, which is why
    :class:`Shards` keeps the counts and takes these names only first, when
    free. An empty ``members`` assigns nothing.
    """
    live = sorted(set(members))
    if not live:
        return {}
    floor, extra = divmod(len(names), len(live))
    pairs = sorted(((_score(m, n), n, m) for n in names for m in live), reverse=True)
    owner: dict[str, str] = {}
    load = dict.fromkeys(live, 0)
    for _, name, member in pairs:
        if name in owner:
            continue
        if load[member] >= floor:
            if load[member] > floor or extra == 0:
                continue
            extra -= 1
        owner[name] = member
        load[member] += 1
    return owner


@dataclass(eq=False)
class _Owner:
    """The task that asks for, holds and runs one name."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    #: Set once the lock request has been answered (granted or not) or given up.
    asked: anyio.Event = field(default_factory=anyio.Event)
    #: The request was refused or failed, or the leadership was lost: the task only closes its elector now.
    gone: bool = False
    #: The work raised while its leadership was held: what it raised ends the run, whatever it is (a
    #: BackendUnavailable or LeadershipLost of the work's own is not the lock request's or the name's).
    failed: bool = False
    #: Handed over to this instance (:meth:`Shards.hand_over`): kept over the share, resigned last.
    gift: bool = False
    #: The name's elector, once made.
    elector: Elector | None = None
    #: Handed over (:meth:`Shards.hand_over`): to whom, until when (monotonic), and set once it leads the name (or
    #: the window ended): the elector observes the name until then.
    handed_to: str | None = None
    handed_until: float = 0.0
    taken: anyio.Event = field(default_factory=anyio.Event)

    @property
    def counts(self) -> bool:
        """Whether this owner counts towards the share: granted or on its way, and not being let go."""
        return not (self.gone or self.scope.cancel_called)


def _not_running(election: str) -> Elector:
    raise UsageError(f"Shards is not running: no elector is made for {election!r} between runs")


@dataclass
class _Round:
    """What one instance sees and does in one :meth:`Shards.run`: made new when a run starts and when it ends."""

    #: What each member election's leader is, as last observed (None: nobody); filled by the observers.
    seen: dict[int, str | None] = field(default_factory=dict)
    #: Set once every member election has reported its leader.
    all_seen: anyio.Event = field(default_factory=anyio.Event)
    #: The member election this instance holds, if any.
    slot: int | None = None
    #: The live members and this instance's share, as last applied.
    members: tuple[str, ...] = ()
    target: frozenset[str] = frozenset()
    #: (members with this instance last, each name's preferred owner) the orders below were computed for.
    assigned: tuple[tuple[str, ...], dict[str, str]] | None = None
    #: The names in the order they are asked for, those likely to come free here, and when they last changed.
    order: tuple[str, ...] = ()
    likely: tuple[str, ...] = ()
    changed_at: float = 0.0
    #: Members that joined with the last change: their preferred names are resigned first.
    joined: frozenset[str] = frozenset()
    #: The leadership of each name held, and the task of each name held, asked for or being let go.
    held: dict[str, Leadership] = field(default_factory=dict)
    owners: dict[str, _Owner] = field(default_factory=dict)
    #: Who held each name when this instance last asked for it in vain (None: not reported).
    holders: dict[str, str | None] = field(default_factory=dict)
    #: Lock requests granted in this run.
    grants: int = 0
    #: Set on every change of what is seen (wakes the rebalance), when short (wakes the claims), and when a
    #: request is answered.
    wake: anyio.Event = field(default_factory=anyio.Event)
    claim: anyio.Event = field(default_factory=anyio.Event)
    answered: anyio.Event = field(default_factory=anyio.Event)
    #: Draining (:meth:`Shards.drain`): no member election held, no name asked for, until the run ends.
    draining: bool = False
    #: Out unhealthy (:meth:`Shards.set_health`): as draining, until the check passes again; set when it does.
    unhealthy: bool = False
    rejoin: anyio.Event = field(default_factory=anyio.Event)
    #: Cancels the holding of the member election (a drain leaves it).
    member_scope: anyio.CancelScope | None = None
    #: Set whenever this instance stops holding its member election.
    left: anyio.Event = field(default_factory=anyio.Event)
    #: The run's tasks (a hand-over rings an inbox in one of them), and one lock per inbox rung: one elector
    #: per election at a time (a shared session holds one lock per name).
    tasks: FirstFailure | None = None
    rings: dict[int, anyio.Lock] = field(default_factory=dict)
    #: Builds the elector of one election, this instance's identity given to it after (on a shared session: the
    #: run's session).
    electors: Callable[[str], Elector] = _not_running
    #: Names handed over to this instance and not yet taken: until when each is asked for (monotonic).
    gifts: dict[str, float] = field(default_factory=dict)
    #: The handovers already seen in this instance's inbox.
    gifts_seen: set[str] = field(default_factory=set)

    @property
    def out(self) -> bool:
        """Whether this instance stays out: it holds no member election and asks for no name."""
        return self.draining or self.unhealthy


def _names(names: Iterable[str] | int) -> tuple[str, ...]:
    if isinstance(names, bool):
        raise TypeError("names must be an iterable of names or a shard count, not a bool")
    if isinstance(names, int):
        if names < 1:
            raise ValueError(f"a shard count must be at least 1, not {names}")
        return tuple(str(i) for i in range(names))
    if isinstance(names, str):
        raise TypeError("names must be an iterable of names (a list of str) or a shard count, not one str")
    found = tuple(names)
    if not found:
        raise ValueError("names is empty: give at least one name, or a shard count")
    seen: set[str] = set()
    for name in found:
        validate_name(name)
        if name in seen:
            raise ValueError(f"name {name!r} is given twice")
        seen.add(name)
    return found


#: Opens the shared session of one run: ``(session, electors)`` for this instance's identity.
_SessionOpener = Callable[[str], tuple[Any, Callable[[str], Elector]]]


def _env_electors(
    environ: Mapping[str, str] | None, options: dict[str, Any]
) -> tuple[str, Callable[[str], Elector], _SessionOpener | None]:
    """The group (``AIOELECT_NAME``), an elector factory reading the same settings as :func:`aioelect.from_env`,
    and, when those choose MySQL or PostgreSQL, what opens one shared session per run for every election."""
    settings = Settings.from_environ(os.environ if environ is None else environ)
    group = options.pop("name", None) or settings.name
    if not group:
        raise ValueError("Shards needs a group name: pass group=... or set AIOELECT_NAME")
    file = options.get("file") or settings.targets.get("file")
    servers = any(options.get(k) or settings.targets.get(k) for k in ("etcd", "mysql", "postgres"))
    # The file backend is the one from_env() chooses when named, or when no server backend is configured.
    per_file = bool(file) and (settings.backend_kind == "file" or (settings.backend_kind is None and not servers))

    def make(election: str) -> Elector:
        if per_file:
            # A lock file holds one election: each name gets its own file beside the configured one.
            path = f"{file}.{urllib.parse.quote(election, safe='')}"
            return from_env(environ, **{**options, "name": election, "file": path})
        return from_env(environ, **{**options, "name": election})

    chosen = env_options(environ, {**options, "name": group})
    opener: _SessionOpener | None = None
    if not per_file and shared_sql_session(chosen, default_identity()) is not None:  # options refused: raised here

        def opener(identity: str) -> tuple[Any, Callable[[str], Elector]]:
            opened = shared_sql_session(chosen, identity)
            assert opened is not None
            return opened

    return group, make, opener


class Shards:
    """Spread ``names`` (or ``range(n)`` as strings for a shard count) over the live instances.

    Every instance of a service builds the same ``Shards`` (same ``names``,
    same ``group``) and calls :meth:`run`. Each instance then owns a balanced
    share: with ``m`` live instances, ``len(names) // m`` names or one more.

    ``electors(election_name)`` builds the elector of one election; it is
    called for ``{group}/shard/{name}`` each time this instance asks for or
    holds a name (``name`` percent-encoded: see :meth:`shard_election`) and
    ``{group}/member/{k}`` for ``k < max_instances``, and every elector
    gets this instance's :attr:`identity`. Give a factory over a shared
    session where the backend has one (``lambda n: EtcdElector(session=s,
    name=n)``, ``MySQLElector(session=s, name=n)``, ``PostgresElector(...)``):
    every election of the instance, its member elections and their
    observers then use that one lease or connection. On a shared MySQL or
    PostgreSQL session, :attr:`identity` defaults to the session's (taken
    when :meth:`run` starts): without ``schema=`` PostgreSQL reports the
    session's identity as the leader of every election on it, so an
    ``identity`` other than the session's is a ValueError there. Without ``electors``, each one is built by
    :func:`aioelect.from_env` (``environ`` and ``options`` as it takes them)
    and ``group`` defaults to ``AIOELECT_NAME``; when that is MySQL or
    PostgreSQL, each :meth:`run` opens one shared session (with those
    options and this instance's :attr:`identity`) and every election of the
    instance is on it; with the file backend each
    election gets its own lock file, ``AIOELECT_FILE`` plus ``.`` plus the
    quoted election name.

    ``settle`` (seconds) gathers membership changes that arrive together
    into one rebalance. A rebalance resigns at most ``step`` names, then goes
    on after another ``settle`` (longer while the event loop lags); an
    instance short of its share has at most ``step`` lock requests out at
    once and at most ``step`` requests and grants per ``settle``: a whole
    share moving at once (a cold start, a lost session) does not stall the
    event loop that keeps the sessions alive.

    Guarantees:

    * each owned name is a leadership of its own, on its own election: its
      own fencing token (increasing per name as the backend's tokens do),
      :func:`aioelect.current_leadership` inside its work, and its work
      cancelled and stopped before the name is let go. No name is owned by
      two instances at once, whatever the instances believe about each
      other: that is the elections' mutual exclusion;
    * once membership is stable, every live instance owns its share and
      nothing more; a name moves only when an instance joins or leaves (or
      its leadership is lost), and then only from an instance above its
      share to one below it: when all see the same members, a join or a
      leave moves exactly the names the new balance needs (the newcomer's
      share, the leaver's names); no instance waits for any other to
      rebalance (no barrier): the old owner resigns, and an instance short
      of its share takes the name at its next request (a pass over the names
      likely to be free, then over all, again at least every second while
      it is short);
    * an instance learns who is live from the backend: each holds one member
      election while it runs and observes all of them; ``max_instances``
      bounds how many instances can take part (one that finds every member
      election taken owns nothing, logs a WARNING and tries again);
    * an instance that is not a member (not yet, or no longer: its member
      election was lost) owns nothing: it resigns every name;
    * ``work(name)`` runs while the name is owned; an exception from it, or
      a permanent backend error, ends :meth:`run` with that exception after
      every name has been let go. When ``work`` returns the name stays owned
      (held, doing nothing) until it moves;
    * :meth:`hand_over` moves one owned name to a named member, :meth:`drain`
      every name to the others for good, and an instance whose
      :meth:`set_health` check fails leaves the same way for a while: each
      name's work stopped before the name is released, so the names move by
      release, never by a lease running out. Each member observes one
      *inbox* election, ``{group}/inbox/{k}`` beside its member election
      ``k``, through which a name is handed to it.

    Fate sharing: names on one shared session (an
    :class:`~aioelect.EtcdSession`, :class:`~aioelect.MySQLSession` or
    :class:`~aioelect.PostgresSession`) are lost together when its lease or
    connection ends,
    and so is the member election: the instance then campaigns again for
    its share.
    """

    def __init__(
        self,
        names: Iterable[str] | int,
        *,
        group: str | None = None,
        electors: Callable[[str], Elector] | None = None,
        identity: str | None = None,
        max_instances: int = 16,
        settle: float = 0.1,
        step: int = 20,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.names: tuple[str, ...] = _names(names)
        if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
            raise ValueError(f"max_instances must be an int >= 1, not {max_instances!r}")
        if not (isinstance(settle, (int, float)) and 0 <= settle < math.inf):
            raise ValueError(f"settle must be a finite number of seconds >= 0, not {settle!r}")
        self._open_session: _SessionOpener | None = None
        if electors is None:
            group, electors, self._open_session = _env_electors(
                environ, {**options, **({"name": group} if group else {})}
            )
        elif options or environ is not None:
            raise TypeError("Shards takes environ and elector options only when it builds the electors (no electors=)")
        if not group:
            raise ValueError("Shards needs a group name (group=...): the prefix of its election names")
        self.group = validate_name(group)
        self.identity: str = validate_identity(identity if identity is not None else default_identity())
        self._identity_given = identity is not None
        self.max_instances = max_instances
        self.settle = float(settle)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1, not {step!r}")
        self.step = step
        #: The elector factory given, or built from the environment (a shared session's is made per run instead).
        self._electors = electors
        #: What this instance sees and does in its current run (an empty one between runs).
        self._r = _Round()
        self._health: Health | None = None
        self._running = False

    def __repr__(self) -> str:
        return (
            f"<Shards {self.group} identity={self.identity!r} names={len(self.names)} "
            f"members={len(self._r.members)} owned={len(self._r.held)}>"
        )

    # --- what this instance sees -------------------------------------------------------

    def shard_election(self, name: str) -> str:
        """The election name of ``name``: ``{group}/shard/`` and ``name`` percent-encoded (``/`` as ``%2F``), so
        that no name's election nests in another's on etcd, where ``a/`` is a prefix of ``a/b/``."""
        return f"{self.group}/shard/{urllib.parse.quote(name, safe='')}"

    def member_election(self, slot: int) -> str:
        """The election name of member slot ``slot``."""
        return f"{self.group}/member/{slot}"

    @property
    def members(self) -> tuple[str, ...]:
        """The live instances as this instance last saw them (sorted), itself included once it is a member."""
        return self._r.members

    @property
    def assigned(self) -> frozenset[str]:
        """The names :func:`assign` prefers here under :attr:`members`: as many as this instance's share, which it
        asks for first when short. The names it owns once settled are any of that count (see :attr:`owned`)."""
        return self._r.target

    @property
    def owned(self) -> frozenset[str]:
        """The names whose leadership this instance holds now (each :attr:`~aioelect.Leadership.held`)."""
        return frozenset(n for n, lead in self._r.held.items() if lead.held)

    def leadership(self, name: str) -> Leadership | None:
        """The held leadership of ``name``, or None when this instance does not own it now."""
        lead = self._r.held.get(name)
        return lead if lead is not None and lead.held else None

    # --- handing names over ------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """Whether this run drains (:meth:`drain`): it holds no member election and asks for no name."""
        return self._r.draining

    def inbox_election(self, slot: int) -> str:
        """The election name of the inbox of member slot ``slot``: who leads it hands a name to that member."""
        return f"{self.group}/inbox/{slot}"

    async def hand_over(self, name: str, to: str | None = None, *, timeout: float = 30.0) -> str:  # noqa: ASYNC109
        """Move ``name``, owned here, to the live member ``to``; return who it goes to.

        Without ``to``, the other live member with the highest rendezvous
        weight for ``name`` is chosen. ``to`` is told through its inbox
        election (``{group}/inbox/{k}`` for its member election ``k``, which
        it observes while it is a member: no connection beyond its
        elections'), which this instance leads until ``to`` leads ``name``
        or ``timeout`` has passed. This instance then steps down from
        ``name`` (:meth:`~aioelect.Leadership.step_down`): the name's work is
        stopped before the name is released, and its handover note lets only
        ``to`` lead it for ``timeout`` seconds. ``to`` keeps the name beyond
        its share and rebalances: it resigns another name, which an instance
        short of its share (this one) takes. Not taken within ``timeout``,
        the name goes to whoever is short of it.

        Returns once this instance has released the name. Raises
        :class:`~aioelect.UsageError` if the name is not owned here, ``to``
        is not another live member, or the backend keeps no handover notes
        (local, fencing off, PostgreSQL without ``schema=``);
        TimeoutError if another handover to ``to`` holds its inbox for all of
        ``timeout``.
        """
        if to is not None:
            to = validate_identity(to)
        if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ValueError(f"timeout must be a finite number of seconds > 0, not {timeout!r}")
        lead = self.leadership(name)
        r = self._r
        owner = r.owners.get(name)
        if lead is None or r.tasks is None or owner is None or owner.elector is None:
            raise UsageError(f"hand_over(): {self.identity!r} does not own {name!r}")
        try:
            backend_of(owner.elector).state_store()
        except UsageError:
            raise UsageError(
                f"hand_over({name!r}): this backend keeps no handover notes (it needs fenced state: etcd, MySQL, "
                "PostgreSQL with schema=, Redis, file, memory, with fencing tokens)"
            ) from None
        others = {m: k for k, m in r.seen.items() if m is not None and k != r.slot}
        if to is None:
            if not others:
                raise UsageError(f"hand_over({name!r}): no other live member of {self.group} to take it")
            to = max(sorted(others), key=lambda m: _score(m, name))
        if to not in others:
            raise UsageError(f"hand_over({name!r}): {to!r} is not another live member of {self.group}")
        gift = f"{GIFT}{self.names.index(name)}:{timeout:g}:{secrets.token_hex(3)}:{self.identity}"[:128]
        rung = anyio.Event()
        until = time.monotonic() + timeout
        r.tasks.start_soon(self._ring, others[to], gift, owner, until, rung)
        with anyio.fail_after(timeout):
            await rung.wait()
        if self._r is not r or not lead.held:
            raise UsageError(f"hand_over(): {self.identity!r} no longer owns {name!r}")
        log.info("%s: handing %s over to %s", self.identity, name, to)
        owner.handed_to, owner.handed_until = to, until
        try:
            await lead.step_down(to, timeout=timeout, reason="handed over")
        except BaseException:
            owner.taken.set()
            raise
        return to

    async def _ring(self, slot: int, gift: str, owner: _Owner, until: float, rung: anyio.Event) -> None:
        """Lead the inbox of member ``slot`` as ``gift`` (set ``rung`` then) until the name ``owner`` held is led by
        the member it was handed to, or ``until``; a failure is logged, never raised (the run goes on)."""
        with anyio.move_on_after(until - time.monotonic()):
            async with self._r.rings.setdefault(slot, anyio.Lock()):  # a handover before this one rings it
                await self._ring_once(slot, gift, owner, until, rung)

    async def _ring_once(self, slot: int, gift: str, owner: _Owner, until: float, rung: anyio.Event) -> None:
        inbox: Elector | None = None
        try:
            inbox = self._r.electors(self.inbox_election(slot))
            inbox.identity = gift
            while time.monotonic() < until:
                async with leading_if_free(inbox) as held:
                    if held is not None:
                        rung.set()
                        with anyio.move_on_after(until - time.monotonic()):
                            await owner.taken.wait()
                        return
                await anyio.sleep(GIFT_POLL)  # another instance's handover to the same member holds its inbox
        except Exception as exc:  # never the run's end: the name is handed over all the same, unannounced
            log.warning(
                "%s: the inbox of member %d could not be led (%s): handing over unannounced", self.identity, slot, exc
            )
            rung.set()
        finally:
            if inbox is not None:
                with anyio.CancelScope(shield=True):
                    await inbox.aclose()

    async def _until_led_by(self, elector: Elector, owner: _Owner) -> None:
        """Observe the name handed over (on its own elector: one elector per election on a shared session) until
        the member it went to leads it, or the handover window ends."""
        with anyio.move_on_after(max(0.0, owner.handed_until - time.monotonic())):
            try:
                async for leader in elector.observe():
                    if leader == owner.handed_to:
                        break
            except ElectionError as exc:
                log.info("%s: the handed over name is unobserved (%s)", self.identity, exc)
        owner.taken.set()

    async def _watch_inbox(self, slot: int) -> None:
        """While this instance holds member election ``slot``: take note of every name handed over to it."""
        inbox = await self._make(self.inbox_election(slot))
        try:
            while True:
                try:
                    async for leader in inbox.observe():
                        if leader is not None and leader.startswith(GIFT):
                            self._gift(leader)
                except ElectionError as exc:
                    log.warning("%s: inbox %d unobserved (%s); observing again", self.identity, slot, exc)
                    await anyio.sleep(FULL_RETRY)
        finally:
            with anyio.CancelScope(shield=True):
                await inbox.aclose()

    def _gift(self, leader: str) -> None:
        """A name handed over here, as the leader of this instance's inbox says it: asked for until granted, or
        for as long as the giver's note lets only this instance take it."""
        r = self._r
        if leader in r.gifts_seen:
            return
        r.gifts_seen.add(leader)
        try:
            index, window, _, giver = leader[len(GIFT) :].split(":", 3)
            name, left = self.names[int(index)], float(window)
        except (ValueError, IndexError):
            log.warning("%s: inbox led by %r, not a handover: ignored", self.identity, leader)
            return
        if r.out:
            self._decline(r, name, time.monotonic() + left)
            return
        log.info("%s: %s handed over here by %s", self.identity, name, giver)
        r.gifts[name] = time.monotonic() + left

    def _decline(self, r: _Round, name: str, until: float) -> None:
        """A name handed over to this instance while it is out (draining, unhealthy): the giver's note lets only
        this instance take it until ``until``, so it takes the name and lets it go at once, without its work,
        and the others may take it (a release, not the note's window)."""
        log.info("%s: %s handed over here while this instance is out: taken and let go at once", self.identity, name)

        async def take_and_let_go() -> None:
            elector = await self._make(self.shard_election(name))
            try:
                with anyio.move_on_after(max(0.0, until - time.monotonic())):
                    lead = await elector.acquire()
                    await lead.release()
            except ElectionError as exc:
                log.warning("%s: %s, handed over here while out, not let go (%s)", self.identity, name, exc)
            finally:
                with anyio.CancelScope(shield=True):
                    await elector.aclose()

        if r.tasks is not None:  # None: the run is over, and its electors with it
            r.tasks.start_soon(take_and_let_go)

    async def drain(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Leave: stop every owned name's work and release the name, and the member election, so that the other
        instances take the names at once; this run asks for nothing again.

        The member election and every name are let go together: the others
        see this instance leave, count larger shares and ask for its names,
        each granted as soon as its work has stopped and it is released
        (within :data:`CLAIM_RETRY` of it), never by a lease expiring. The
        run goes on, a draining observer that owns nothing, until it is
        cancelled. Returns once everything is released; TimeoutError after
        ``timeout`` seconds (None: as long as the work takes to stop), the
        drain going on. UsageError if :meth:`run` is not running.
        """
        if not self._running:
            raise UsageError("drain(): Shards.run() is not running")
        r = self._r
        if not r.draining:
            log.info("%s: draining %d name(s) of %s", self.identity, len(r.owners), self.group)
            r.draining = True
            self._leave(r)
        with anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
            while r.owners:
                await next(iter(r.owners.values())).done.wait()
            while r.slot is not None:
                r.left = anyio.Event()
                if r.slot is not None:
                    await r.left.wait()
        log.info("%s: drained: owns nothing and asks for nothing", self.identity)

    def _leave(self, r: _Round) -> None:
        """Let go of the member election and of every name (each once its work has stopped): ``r`` is out."""
        for name, until in r.gifts.items():  # handed over here and not taken yet: only this instance may
            self._decline(r, name, until)
        r.gifts.clear()
        if r.member_scope is not None:
            r.member_scope.cancel()
        for owner in list(r.owners.values()):
            owner.scope.cancel()
        r.wake.set()

    def set_health(
        self,
        check: Callable[[], Awaitable[object]] | None,
        *,
        failures: int = 3,
        interval: float = 5.0,
        timeout: float = 2.0,
        backoff: float = 30.0,
    ) -> None:
        """Take part only while ``await check()`` passes; after ``failures`` failures in a row, hand every name over.

        A check passes unless it returns False, raises, or runs past
        ``timeout`` seconds (it is cancelled then). An instance joins (holds
        a member election and asks for names) only once a check passes;
        while it takes part the check runs every ``interval`` seconds, and
        after ``failures`` failures in a row it leaves as :meth:`drain` does
        (every name's work stopped, then the name released, the member
        election released: the others take the names at once), stays out for
        ``backoff`` seconds and then until a check passes. Each change is
        logged with its reason. None removes the check. Takes effect at the
        next :meth:`run`.
        """
        self._health = None if check is None else Health(check, failures, interval, timeout, backoff)

    async def _health_watch(self, health: Health) -> None:
        r = self._r
        while True:
            said: str | None = None
            while True:
                left = health.out_until - time.monotonic()
                if left > 0:
                    await anyio.sleep(left)
                    continue
                why = await health.problem()
                if why is None:
                    break
                if why != said:
                    log.warning("%s: not taking part in %s: %s", self.identity, self.group, why)
                    said = why
                await anyio.sleep(health.interval)
            if said is not None:
                log.info("%s: health check passes again: taking part in %s", self.identity, self.group)
            r.unhealthy = False
            r.rejoin.set()
            r.wake.set()
            failed = 0
            while failed < health.failures:
                await anyio.sleep(health.interval)
                why = await health.problem()
                if why is None:
                    if failed:
                        log.info("%s: health check passes again after %d failure(s)", self.identity, failed)
                    failed = 0
                    continue
                failed += 1
                log.warning(
                    "%s: health check failed (%d of %d in a row): %s", self.identity, failed, health.failures, why
                )
            log.warning(
                "%s: unhealthy (%s): handing %d name(s) over; staying out for %gs",
                self.identity,
                why,
                len(r.owners),
                health.backoff,
            )
            health.out_until = time.monotonic() + health.backoff
            r.unhealthy = True
            self._leave(r)

    async def _gifts(self, tasks: FirstFailure, work: ShardWork | None) -> None:
        """Ask for each name handed over here (seen in this instance's inbox) until it is granted or its handover
        window ends."""
        while True:
            await anyio.sleep(GIFT_POLL)
            r = self._r
            if r.out:
                continue
            now = time.monotonic()
            for name, until in list(r.gifts.items()):
                if until <= now:
                    log.info("%s: %s was handed over here but not granted in time", self.identity, name)
                    del r.gifts[name]
                elif name not in r.owners:
                    owner = _Owner(gift=True)
                    r.owners[name] = owner
                    tasks.start_soon(self._own, name, owner, work)

    # --- running -----------------------------------------------------------------------

    async def run(self, work: ShardWork | None = None) -> None:
        """Take part until cancelled: hold a member election, own this instance's share, run ``work`` per name.

        Returns only by raising: cancellation (every name released, its work
        stopped first, every elector closed), or the first exception of
        ``work`` or permanent backend error, raised after the same cleanup.
        """
        if self._running:
            raise UsageError("Shards.run() is already running")
        self._running = True
        try:
            if self._open_session is None:
                await self._run(work, self._electors)
            else:
                # Built from the environment on MySQL or PostgreSQL: one shared session per run holds every election.
                session, electors = self._open_session(self.identity)
                async with session:
                    await self._run(work, electors)
        finally:
            self._running = False

    async def _run(self, work: ShardWork | None, electors: Callable[[str], Elector]) -> None:
        self._r = _Round(electors=electors)
        slots: list[Elector] = []
        try:
            for k in range(self.max_instances):
                slots.append(await self._make(self.member_election(k), first=k == 0))
            async with FirstFailure() as tasks:
                self._r.tasks = tasks
                if self._health is not None:
                    self._r.unhealthy = True  # until a check passes
                    tasks.start_soon(self._health_watch, self._health)
                for k, slot in enumerate(slots):
                    tasks.start_soon(self._observe, k, slot)
                tasks.start_soon(self._membership, slots)
                tasks.start_soon(self._claims, tasks, work)
                tasks.start_soon(self._gifts, tasks, work)
                await self._rebalance()
        finally:
            with anyio.CancelScope(shield=True):
                for slot in slots:
                    await slot.aclose()
            self._r = _Round()
        raise AssertionError("the rebalance loop never returns")  # pragma: no cover

    async def _make(self, election: str, first: bool = False) -> Elector:
        elector = self._r.electors(election)
        if not isinstance(elector, Elector):
            raise TypeError(f"electors({election!r}) returned {type(elector).__name__}, not an Elector")
        on_session = shared_session_of(elector)
        if on_session is not None and on_session[0] != self.identity:
            shared, reported = on_session
            if first and not self._identity_given:
                # Without identity=, an instance on a shared MySQL or PostgreSQL session is its session: the
                # identity the server may report for every election on it (PostgreSQL without schema=).
                self.identity = shared
            elif reported:
                with anyio.CancelScope(shield=True):
                    await elector.aclose()
                raise ValueError(
                    f"Shards identity {self.identity!r} is not the identity {shared!r} of the shared session its "
                    "electors are on, which the server reports as the leader of every election on that session: "
                    "give Shards no identity (it takes the session's), or the session's"
                )
        elector.identity = self.identity
        return elector

    def _changed(self) -> None:
        self._r.wake.set()

    async def _observe(self, k: int, slot: Elector) -> None:
        async for leader in slot.observe():
            if self._r.seen.get(k, ...) != leader:
                self._r.seen[k] = leader
                if len(self._r.seen) == self.max_instances:
                    self._r.all_seen.set()
                self._changed()

    async def _membership(self, slots: list[Elector]) -> None:
        """Hold one member election for as long as this runs; take another when it is lost."""
        await self._r.all_seen.wait()
        held: int | None = None  # the member election this instance held last
        while True:
            while self._r.out:  # draining (until the run ends), or unhealthy (until the check passes)
                rejoin = self._r.rejoin = anyio.Event()
                if held is None:
                    await rejoin.wait()
                    continue
                # A handover to this instance may still be on its way (its giver chose it before it left): its
                # inbox is watched a while longer, and a name handed over is taken and let go at once (_decline).
                with anyio.move_on_after(OUT_INBOX_WATCH):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._watch_inbox, held)
                        await rejoin.wait()
                        tg.cancel_scope.cancel()
                held = None
            # Free-looking slots first: a held one would only refuse.
            order = sorted(range(len(slots)), key=lambda k: self._r.seen.get(k) is not None)
            for k in order:
                try:
                    async with leading_if_free(slots[k]) as lead:
                        if lead is None:
                            continue
                        with anyio.CancelScope() as self._r.member_scope:
                            if self._r.out:
                                break
                            self._r.slot = held = k
                            self._changed()
                            log.info("%s is a member of %s (member election %d)", self.identity, self.group, k)
                            await self._watch_inbox(k)
                except LeadershipLost as exc:
                    log.warning("%s lost its member election %d (%s): taking another", self.identity, k, exc.reason)
                except BackendUnavailable as exc:
                    log.warning("member election %d of %s: %s; trying again", k, self.group, exc)
                    await anyio.sleep(FULL_RETRY)
                finally:
                    self._r.member_scope = None
                    self._r.slot = None
                    self._r.left.set()
                    self._changed()
                break
            else:
                log.warning(
                    "%s: all %d member elections of %s are taken: this instance owns nothing (raise max_instances)",
                    self.identity,
                    len(slots),
                    self.group,
                )
                await anyio.sleep(FULL_RETRY)

    async def _next_change(self) -> None:
        await self._r.wake.wait()
        self._r.wake = anyio.Event()

    def _view(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """The live members and the names :func:`assign` prefers here (as many as this instance's share)."""
        if len(self._r.seen) < self.max_instances:
            return (), frozenset()  # not every member election reported yet: nothing is known
        members = tuple(sorted({m for m in self._r.seen.values() if m is not None}))
        me = None if self._r.slot is None else self._r.seen.get(self._r.slot)
        if me is None or self._r.out:
            return members, frozenset()  # not a member (yet): the others do not count on us
        if self._r.assigned is None or self._r.assigned[0] != (*members, me):
            owners = assign(self.names, members)
            mine = frozenset(n for n in self.names if owners.get(n) == me)
            if self._r.assigned is None:
                # Newly a member: the others had balanced the names among themselves.
                seen = tuple(m for m in members if m != me)
                before = assign(self.names, seen) if seen else {}
            else:
                before, seen = self._r.assigned[1], self._r.assigned[0][:-1]
            departed = set(seen) - set(members)
            # Asked for in this order when short: the names that departed instances were preferred for (free
            # soonest), then those preferred here, then by this instance's own weight.
            self._r.order = tuple(
                sorted(self.names, key=lambda n: (before.get(n) not in departed, n not in mine, -_score(me, n)))
            )
            # The names likely to come free here, asked for alone first: those preferred here, and those whose
            # preferred instance changed (an instance above its share resigns those first).
            self._r.likely = tuple(n for n in self._r.order if n in mine or before.get(n, owners[n]) != owners[n])
            self._r.changed_at = time.monotonic()
            # Resigned first when over: the names preferred by an instance that has just joined (short of them).
            self._r.joined = frozenset(members) - frozenset(seen) if seen else frozenset()
            self._r.assigned = ((*members, me), owners)
        owners = self._r.assigned[1]
        # As this instance's member election reports it: a backend that shortens identities shortens ours too.
        return members, frozenset(n for n in self.names if owners.get(n) == me)

    def _short(self) -> int:
        """How many names this instance lacks for its share, counting the lock requests on their way."""
        if self._r.out:
            return 0
        return len(self._r.target) - sum(o.counts for o in self._r.owners.values())

    async def _rebalance(self) -> None:
        backlog = False
        while True:
            if not backlog:
                await self._next_change()
            # Changes that arrive together make one rebalance; a backlog goes on one step per settle period,
            # and waits longer while the event loop lags behind (a busy process or machine).
            began = time.monotonic()
            await anyio.sleep(self.settle)
            lag = time.monotonic() - began - self.settle
            if backlog and lag > self.settle:
                await anyio.sleep(lag)
            backlog = self._apply()

    def _apply(self) -> bool:
        """Resign what is beyond this instance's share, at most :attr:`step` names, and wake the claims when it is
        short; True if more is left to resign.

        Resigned first: requests not yet answered, then the names :func:`assign` prefers elsewhere (an
        instance's that has just joined first), then those of least weight here.
        """
        members, target = self._view()
        if members != self._r.members or target != self._r.target:
            log.info(
                "%s: %d members, a share of %d of %d names here",
                self.identity,
                len(members),
                len(target),
                len(self.names),
            )
        self._r.members, self._r.target = members, target
        active = [n for n, o in self._r.owners.items() if o.counts]
        excess = len(active) - len(target)
        if excess > 0:
            me = self._r.assigned[0][-1] if self._r.assigned is not None and target else self.identity
            owners = self._r.assigned[1] if self._r.assigned is not None else {}
            joined = self._r.joined
            tasks = self._r.owners
            # A name handed over here is kept (resigned last): the one resigned instead goes to the giver.
            active.sort(
                key=lambda n: (
                    tasks[n].gift and not self._r.out,
                    n in self._r.held,
                    n in target,
                    owners.get(n) not in joined,
                    _score(me, n),
                )
            )
            for name in active[: min(excess, self.step)]:
                self._r.owners[name].scope.cancel()
            return excess > self.step
        if excess < 0:
            self._r.claim.set()
        return False

    async def _claims(self, tasks: FirstFailure, work: ShardWork | None) -> None:
        """While this instance is short of its share, ask for free names: passes over the names, in its order.

        A pass over the likely names alone (those preferred here, and those departed instances were preferred
        for) comes first: the instances above their share may not have seen the change yet. Every name is
        asked for once the likely ones have given what they had, or ``CLAIM_RETRY`` after the change.
        """
        pause = 0.0
        since, gave, exhausted = -1.0, False, False
        while True:
            if self._short() <= 0:
                pause = 0.0
                await self._r.claim.wait()
            self._r.claim = anyio.Event()
            if self._short() <= 0:
                continue
            if since != self._r.changed_at:
                since, gave, exhausted = self._r.changed_at, False, False
            every = exhausted or time.monotonic() - since >= CLAIM_RETRY
            won = await self._pass(tasks, work, self._asking_order(every))
            if not every:
                gave = gave or won > 0
                exhausted = gave and not won
            if self._short() > 0:
                # None free: the ones it lacks are still held (a leaver's, a crashed instance's until its session
                # ends, or an over-share instance's yet to resign). Ask again, sooner after a change.
                pause = (
                    self.settle if won or (exhausted and not every) else min(max(2 * pause, self.settle), CLAIM_RETRY)
                )
                with anyio.move_on_after(pause):
                    await self._r.claim.wait()

    def _asking_order(self, every: bool) -> list[str]:
        """The names of the next pass: every name, or the likely ones; first those last seen held by an instance
        that is no longer a member, last those last seen held by a live one."""
        live = set(self._r.members)

        def rank(name: str) -> int:
            holder = self._r.holders.get(name)
            return 1 if holder is None else 2 if holder in live else 0

        names = self._r.order if every else [*self._r.likely, *(n for n in self._r.order if rank(n) == 0)]
        return sorted(dict.fromkeys(names), key=rank)

    async def _pass(self, tasks: FirstFailure, work: ShardWork | None, names: Sequence[str]) -> int:
        """Ask once for each of ``names`` that this instance does not hold, in order, while it is short: at most
        :attr:`step` requests at a time, never more than it lacks, and at most :attr:`step` requests and grants
        together per :attr:`settle` period. Returns how many were granted."""
        first = self._r.grants
        asking: list[_Owner] = []
        period, base = time.monotonic(), self._r.grants
        for name in names:
            while True:
                self._r.answered = anyio.Event()
                asking = [o for o in asking if not o.asked.is_set()]
                now = time.monotonic()
                if now - period >= self.settle:
                    period, base = now, self._r.grants
                short = self._short()
                if short <= 0 and not asking:
                    return self._r.grants - first
                if short > 0 and len(asking) + self._r.grants - base < self.step:
                    break
                # Full, or no more to ask until the requests on their way are answered: a refused one is asked
                # for again in its place.
                with anyio.move_on_after(max(0.0, period + self.settle - now)):
                    await self._r.answered.wait()
            if name in self._r.owners:
                continue  # held, asked for, or still being let go
            owner = _Owner()
            self._r.owners[name] = owner
            asking.append(owner)
            tasks.start_soon(self._own, name, owner, work)
        for owner in asking:
            await owner.asked.wait()
        return self._r.grants - first

    async def _own(self, name: str, owner: _Owner, work: ShardWork | None) -> None:
        """Ask once for ``name``; if granted, hold it (and run its work) until resigned or lost."""
        try:
            with owner.scope:
                elector = owner.elector = await self._make(self.shard_election(name))
                try:
                    await self._lead(name, owner, elector, work)
                except LeadershipLost as exc:
                    if owner.failed:
                        raise
                    owner.gone = True
                    log.warning(
                        "%s lost %s (%s): it goes to whoever is short of its share", self.identity, name, exc.reason
                    )
                    self._r.claim.set()
                except BackendUnavailable as exc:
                    if owner.failed:
                        raise
                    owner.gone = True
                    log.info("%s: asking for %s failed (%s); asked again on the next pass", self.identity, name, exc)
                finally:
                    if owner.handed_to is not None:
                        # No longer counts: this instance is short of the name it gave, and takes the one the
                        # receiver resigns for it.
                        owner.gone = True
                        self._r.claim.set()
                        await self._until_led_by(elector, owner)
                    with anyio.CancelScope(shield=True):
                        await elector.aclose()
        finally:
            owner.taken.set()
            owner.asked.set()
            self._r.answered.set()
            owner.done.set()
            if self._r.owners.get(name) is owner:
                del self._r.owners[name]

    async def _lead(self, name: str, owner: _Owner, elector: Elector, work: ShardWork | None) -> None:
        async with leading_if_free(elector) as lead:
            owner.gone = lead is None
            owner.asked.set()
            self._r.answered.set()
            if lead is None:
                self._r.holders[name] = elector.last_leader
                return
            self._r.holders.pop(name, None)
            self._r.grants += 1
            self._r.held[name] = lead
            if owner.gift:
                # Kept beyond the share: the rebalance resigns another name instead, for whoever is short.
                self._r.gifts.pop(name, None)
                self._changed()
            try:
                if work is not None:
                    try:
                        await work(name)
                    except Exception:
                        # Raised while the name is held: the work's own failure, which ends the run. Once the
                        # leadership is lost, what the work raised is the loss's consequence.
                        owner.failed = lead.held
                        raise
                await anyio.sleep_forever()
            finally:
                if self._r.held.get(name) is lead:
                    del self._r.held[name]
