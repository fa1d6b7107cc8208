"""Sharded leadership: a set of names spread over the live instances, each owned name a leadership of its own.

:class:`Shards` sits above :class:`~aioelect.Elector` and uses only its public
contract: one election per name decides who owns that name, so mutual
exclusion is the elections' and no backend learns what a shard is. Above
them, each instance computes the same balanced assignment of names to the
live instances and campaigns only for the names assigned to it; it resigns a
name (its work cancelled first) as soon as the assignment gives it to
another instance, which is already waiting in that name's election.

Who is live comes from the backend too: each instance holds one of
``max_instances`` *member* elections (``{group}/member/{k}``) for as long as
it runs, and every instance observes the leaders of all of them. An
instance that crashes loses its member election as it loses its names (its
session or lease ends), so the others drop it from their view when the
backend hands its names on.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from ._config import validate_name
from ._elector import Elector, Leadership, default_identity, leading, leading_if_free, validate_identity
from ._errors import BackendUnavailable, LeadershipLost
from ._factory import from_env
from ._settings import Settings

__all__ = ["Shards", "assign"]

log = logging.getLogger("aioelect.shards")

#: Work run for each owned name: ``await work(name)``, cancelled when the name's leadership ends.
ShardWork = Callable[[str], Awaitable[object]]

#: How long an instance that found every member election taken waits before it tries again (seconds).
FULL_RETRY = 1.0


def _score(member: str, name: str) -> int:
    """Rendezvous weight of ``name`` on ``member``: the same on every instance and every run."""
    digest = hashlib.blake2b(f"{member}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(names: Sequence[str], members: Iterable[str]) -> dict[str, str]:
    """The owner of each name among ``members``: balanced, and the same on every instance that sees them.

    Every member gets ``len(names) // len(members)`` names or one more.
    Pairs (name, member) are taken by decreasing rendezvous weight, each name
    going to the first member that still has room, so that a member joining
    or leaving moves few names beyond those the new balance needs (the
    benchmark measures how many). An empty ``members`` assigns nothing.
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
    """The task that campaigns for, holds and runs one name."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


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


def _env_electors(environ: Mapping[str, str] | None, options: dict[str, Any]) -> tuple[str, Callable[[str], Elector]]:
    """The group (``AIOELECT_NAME``) and an elector factory reading the same settings as :func:`aioelect.from_env`."""
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

    return group, make


class Shards:
    """Spread ``names`` (or ``range(n)`` as strings for a shard count) over the live instances.

    Every instance of a service builds the same ``Shards`` (same ``names``,
    same ``group``) and calls :meth:`run`. Each instance then owns a balanced
    share: with ``m`` live instances, ``len(names) // m`` names or one more.

    ``electors(election_name)`` builds the elector of one election; it is
    called for ``{group}/shard/{name}`` per name this instance campaigns for
    (``name`` percent-encoded: see :meth:`shard_election`) and
    ``{group}/member/{k}`` for ``k < max_instances``, and every elector
    gets this instance's :attr:`identity`. Give a factory over a shared
    session where the backend has one (``lambda n: EtcdElector(session=s,
    name=n)``). Without ``electors``, each one is built by
    :func:`aioelect.from_env` (``environ`` and ``options`` as it takes them)
    and ``group`` defaults to ``AIOELECT_NAME``; with the file backend each
    election gets its own lock file, ``AIOELECT_FILE`` plus ``.`` plus the
    quoted election name.

    ``settle`` (seconds) gathers membership changes that arrive together
    into one rebalance. A rebalance starts at most ``step`` campaigns and
    resigns at most ``step`` names, then goes on after another ``settle``
    (longer while the event loop lags): a whole share moving at once (a
    cold start, a lost session) does not stall the event loop that keeps
    the sessions alive.

    Guarantees:

    * each owned name is a leadership of its own, on its own election: its
      own fencing token (increasing per name as the backend's tokens do),
      :func:`aioelect.current_leadership` inside its work, and its work
      cancelled and stopped before the name is let go. No name is owned by
      two instances at once, whatever the instances believe about each
      other: that is the elections' mutual exclusion;
    * once membership is stable, every live instance owns its share and
      nothing more; a name moves only when an instance joins or leaves (or
      its leadership is lost); no instance waits for any other to rebalance
      (no barrier): the old owner resigns, the new one is already waiting in
      that name's election;
    * an instance learns who is live from the backend: each holds one member
      election while it runs and observes all of them; ``max_instances``
      bounds how many instances can take part (one that finds every member
      election taken owns nothing, logs a WARNING and tries again);
    * an instance that is not a member (not yet, or no longer: its member
      election was lost) owns nothing: it resigns every name;
    * ``work(name)`` runs while the name is owned; an exception from it, or
      a permanent backend error, ends :meth:`run` with that exception after
      every name has been let go. When ``work`` returns the name stays owned
      (held, doing nothing) until it moves.

    Fate sharing: names on one shared session (an
    :class:`~aioelect.EtcdSession`) are lost together when its lease ends,
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
        if electors is None:
            group, electors = _env_electors(environ, {**options, **({"name": group} if group else {})})
        elif options or environ is not None:
            raise TypeError("Shards takes environ and elector options only when it builds the electors (no electors=)")
        if not group:
            raise ValueError("Shards needs a group name (group=...): the prefix of its election names")
        self.group = validate_name(group)
        self.identity: str = validate_identity(identity if identity is not None else default_identity())
        self.max_instances = max_instances
        self.settle = float(settle)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1, not {step!r}")
        self.step = step
        self._electors = electors
        #: What each member election's leader is, as last observed (None: nobody); filled by the observers.
        self._seen: dict[int, str | None] = {}
        self._slot: int | None = None
        self._held: dict[str, Leadership] = {}
        self._owners: dict[str, _Owner] = {}
        self._target: frozenset[str] = frozenset()
        self._members: tuple[str, ...] = ()
        self._wake = anyio.Event()
        self._all_seen = anyio.Event()
        self._assigned: tuple[tuple[str, ...], dict[str, str]] | None = None
        self._running = False
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<Shards {self.group} identity={self.identity!r} names={len(self.names)} "
            f"members={len(self._members)} owned={len(self._held)}>"
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
        return self._members

    @property
    def assigned(self) -> frozenset[str]:
        """The names this instance campaigns for: its share under :attr:`members`."""
        return self._target

    @property
    def owned(self) -> frozenset[str]:
        """The names whose leadership this instance holds now (each :attr:`~aioelect.Leadership.held`)."""
        return frozenset(n for n, lead in self._held.items() if lead.held)

    def leadership(self, name: str) -> Leadership | None:
        """The held leadership of ``name``, or None when this instance does not own it now."""
        lead = self._held.get(name)
        return lead if lead is not None and lead.held else None

    # --- running -----------------------------------------------------------------------

    async def run(self, work: ShardWork | None = None) -> None:
        """Take part until cancelled: hold a member election, own this instance's share, run ``work`` per name.

        Returns only by raising: cancellation (every name released, its work
        stopped first, every elector closed), or the first exception of
        ``work`` or permanent backend error, raised after the same cleanup.
        """
        if self._running:
            raise RuntimeError("Shards.run() is already running")
        self._running = True
        slots = [self._make(self.member_election(k)) for k in range(self.max_instances)]
        self._failure = None
        try:
            async with anyio.create_task_group() as tg:
                for k, slot in enumerate(slots):
                    tg.start_soon(self._guarded, tg, self._observe, k, slot)
                tg.start_soon(self._guarded, tg, self._membership, slots)
                await self._rebalance(tg, work)
        finally:
            with anyio.CancelScope(shield=True):
                for slot in slots:
                    await slot.aclose()
            self._held.clear()
            self._owners.clear()
            self._seen.clear()
            self._slot = None
            self._target = frozenset()
            self._members = ()
            self._wake = anyio.Event()
            self._all_seen = anyio.Event()
            self._running = False
        if self._failure is not None:
            raise self._failure
        raise AssertionError("the rebalance loop never returns")  # pragma: no cover

    async def _guarded(self, tg: anyio.abc.TaskGroup, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``fn(*args)``; its exception ends run() (kept, and raised as it is once every task has ended)."""
        try:
            await fn(*args)
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            tg.cancel_scope.cancel()

    def _make(self, election: str) -> Elector:
        elector = self._electors(election)
        if not isinstance(elector, Elector):
            raise TypeError(f"electors({election!r}) returned {type(elector).__name__}, not an Elector")
        elector.identity = self.identity
        return elector

    def _changed(self) -> None:
        self._wake.set()

    async def _observe(self, k: int, slot: Elector) -> None:
        async for leader in slot.observe():
            if self._seen.get(k, ...) != leader:
                self._seen[k] = leader
                if len(self._seen) == self.max_instances:
                    self._all_seen.set()
                self._changed()

    async def _membership(self, slots: list[Elector]) -> None:
        """Hold one member election for as long as this runs; take another when it is lost."""
        await self._all_seen.wait()
        while True:
            # Free-looking slots first: a held one would only refuse.
            order = sorted(range(len(slots)), key=lambda k: self._seen.get(k) is not None)
            for k in order:
                try:
                    async with leading_if_free(slots[k]) as lead:
                        if lead is None:
                            continue
                        self._slot = k
                        self._changed()
                        log.info("%s is a member of %s (member election %d)", self.identity, self.group, k)
                        await anyio.sleep_forever()
                except LeadershipLost as exc:
                    log.warning("%s lost its member election %d (%s): taking another", self.identity, k, exc.reason)
                except BackendUnavailable as exc:
                    log.warning("member election %d of %s: %s; trying again", k, self.group, exc)
                    await anyio.sleep(FULL_RETRY)
                finally:
                    self._slot = None
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
        await self._wake.wait()
        self._wake = anyio.Event()

    def _view(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """The live members and this instance's share, from what the observers reported."""
        if len(self._seen) < self.max_instances:
            return (), frozenset()  # not every member election reported yet: nothing is known
        members = tuple(sorted({m for m in self._seen.values() if m is not None}))
        me = None if self._slot is None else self._seen.get(self._slot)
        if me is None:
            return members, frozenset()  # not a member (yet): the others do not count on us
        if self._assigned is None or self._assigned[0] != members:
            self._assigned = (members, assign(self.names, members))
        owners = self._assigned[1]
        # As this instance's member election reports it: a backend that shortens identities shortens ours too.
        return members, frozenset(n for n in self.names if owners.get(n) == me)

    async def _rebalance(self, tg: anyio.abc.TaskGroup, work: ShardWork | None) -> None:
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
            backlog = self._apply(tg, work)

    def _apply(self, tg: anyio.abc.TaskGroup, work: ShardWork | None) -> bool:
        """Resign what is no longer ours and campaign for what is, at most :attr:`step` of each; True if more is
        left to do.

        Bounded steps keep the event loop responsive (the session's keep-alives run on it) when a whole share
        moves at once: a cold start, or the return after a lost session.
        """
        members, target = self._view()
        if members != self._members or target != self._target:
            log.info(
                "%s: %d members, %d of %d names assigned here",
                self.identity,
                len(members),
                len(target),
                len(self.names),
            )
        self._members, self._target = members, target
        resigns = [o for n, o in self._owners.items() if n not in target and not o.scope.cancel_called]
        for owner in resigns[: self.step]:
            owner.scope.cancel()
        started = 0
        for name in self.names:
            if name not in target:
                continue
            previous = self._owners.get(name)
            if previous is not None and not previous.scope.cancel_called:
                continue
            if started == self.step:
                return True
            owner = _Owner()
            self._owners[name] = owner
            tg.start_soon(self._guarded, tg, self._own, name, owner, previous, work)
            started += 1
        return len(resigns) > self.step

    async def _own(self, name: str, owner: _Owner, previous: _Owner | None, work: ShardWork | None) -> None:
        try:
            with owner.scope:
                if previous is not None:
                    await previous.done.wait()  # one elector per election at a time (a shared session needs it)
                elector = self._make(self.shard_election(name))
                try:
                    while True:
                        try:
                            await self._lead(name, elector, work)
                        except LeadershipLost as exc:
                            log.warning("%s lost %s (%s): campaigning again", self.identity, name, exc.reason)
                finally:
                    with anyio.CancelScope(shield=True):
                        await elector.aclose()
        finally:
            owner.done.set()
            if self._owners.get(name) is owner:
                del self._owners[name]

    async def _lead(self, name: str, elector: Elector, work: ShardWork | None) -> None:
        async with leading(elector) as lead:
            self._held[name] = lead
            try:
                if work is not None:
                    await work(name)
                await anyio.sleep_forever()
            finally:
                if self._held.get(name) is lead:
                    del self._held[name]
