"""The in-memory backend: one election per name and event loop, for users' unit tests.

Electors of the same name in one event loop share one :class:`MemoryElection`;
nothing leaves the process, and another event loop (another test) starts
from an empty one. It owns:

* the campaign: candidates wait in arrival order (FIFO) and the first one
  waiting takes leadership as soon as it is free, in the same event loop
  iteration as the release;
* tokens: each leadership of an election gets the previous one's token plus
  one, starting at 1;
* :meth:`MemoryBackend.observe`: a change is reported at once, never polled;
* the test's controls, on :class:`MemoryElection`: depose the leader (its
  leadership is lost with the given reason, and the next candidate leads at
  once), stall its confirmations (it fences itself at its renew deadline),
  fail the "server" (campaigns retry with reported errors, :meth:`leader`
  raises :class:`~aioelect.BackendUnavailable`, confirmations stop) and
  restore it.

A held leadership is never handed to anyone else while its holder could
still act on it, except by :meth:`MemoryElection.depose`, which stands for a
server that ends the holder's session: as with a real server, the deposed
leader learns of it as soon as its event loop runs it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import AsyncIterator

import anyio

from ..core._backend import Backend, Backoff, Confirm, Hold, Loss, StateStore, Written, monotonic
from ..core._config import positive, validate_name
from ..core._errors import BackendUnavailable, LossKind

__all__ = ["MemoryBackend", "MemoryElection", "MemoryStateStore", "election_of"]

#: Seconds a leader may go without a confirmation; short, so that a stalled leader fences itself quickly in a test.
DEFAULT_RENEW_DEADLINE = 0.5


class _MemoryHold(Hold):
    """One leadership of one :class:`MemoryElection`."""

    def __init__(self, election: MemoryElection, identity: str, token: int, check_interval: float) -> None:
        self._election = election
        self.identity = identity
        self.token = token
        self.acquired_at = monotonic()
        self._check_interval = check_interval
        self.stalled = False
        self.lost_reason: str | None = None
        self._lost = anyio.Event()

    def lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            self._lost.set()

    async def monitor(self, confirm: Confirm) -> Loss:
        while self.lost_reason is None:
            if not self.stalled and self._election.failure is None:
                confirm(monotonic())
            with anyio.move_on_after(self._check_interval):
                await self._lost.wait()
        return Loss(LossKind.DEPOSED, self.lost_reason)  # only depose() takes it away

    async def release(self) -> None:
        await anyio.lowlevel.checkpoint()
        self._election.vacate(self)


class MemoryElection:
    """The shared state of one election name in one event loop, and the test's controls over it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.holder: _MemoryHold | None = None
        #: Why the "server" is failing (see :meth:`fail`), or None while it works.
        self.failure: str | None = None
        self._last_token = 0
        #: The election's fenced state (see :class:`MemoryStateStore`): key -> encoded value.
        self.state: dict[str, bytes] = {}
        self._queue: deque[object] = deque()
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        state = f"failed ({self.failure})" if self.failure else "up"
        return f"<MemoryElection {self.name!r} leader={self.leader()!r} token={self._last_token} {state}>"

    # --- what the backend uses ------------------------------------------------------

    def leader(self) -> str | None:
        """The identity holding leadership now, or None."""
        return self.holder.identity if self.holder is not None else None

    @property
    def waiting(self) -> int:
        """How many campaigns wait for leadership."""
        return len(self._queue)

    def changed(self) -> anyio.Event:
        """An event set at the next change of holder or failure."""
        return self._changed

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def try_grant(self, ticket: object, identity: str, check_interval: float) -> _MemoryHold | None:
        """Leadership for ``ticket`` if it is free, the server is up and ``ticket`` waited longest, else None."""
        if self.holder is not None or self.failure is not None or (self._queue and self._queue[0] is not ticket):
            return None
        if self._queue:
            self._queue.popleft()
        self._last_token += 1
        self.holder = _MemoryHold(self, identity, self._last_token, check_interval)
        self._notify()
        return self.holder

    @property
    def last_token(self) -> int:
        """The newest token this election has issued (0 before any)."""
        return self._last_token

    def enqueue(self, ticket: object) -> None:
        self._queue.append(ticket)

    def enqueue_first(self, ticket: object) -> None:
        self._queue.appendleft(ticket)

    def dequeue(self, ticket: object) -> None:
        if ticket in self._queue:
            self._queue.remove(ticket)
            self._notify()  # the next one in line may be first now

    def vacate(self, hold: _MemoryHold) -> None:
        """End ``hold``'s leadership if it is still the current one. Idempotent."""
        if self.holder is hold:
            self.holder = None
            self._notify()

    # --- the test's controls ----------------------------------------------------------

    def depose(self, reason: str = "deposed by the test") -> str:
        """Take leadership away from the current leader now; return its identity.

        The leader's leadership is lost with ``reason`` (its ``lost_reason``),
        and the first candidate waiting leads at once. Raises
        :class:`LookupError` when nobody leads.
        """
        hold = self._current("depose")
        hold.lose(reason)
        self.vacate(hold)
        return hold.identity

    def stall(self) -> str:
        """Stop the current leader's confirmations; return its identity.

        The leader keeps the lock but cannot confirm it, so it fences itself
        at its renew deadline and then lets go; :meth:`restore` before that
        lets it confirm again. Raises :class:`LookupError` when nobody leads.
        """
        hold = self._current("stall")
        hold.stalled = True
        return hold.identity

    def fail(self, reason: str = "memory server failed by the test") -> None:
        """Make the "server" unavailable until :meth:`restore`.

        Campaigns wait and report a retried error each time they try,
        :meth:`MemoryBackend.leader` raises
        :class:`~aioelect.BackendUnavailable`, and the leader's confirmations
        stop (it fences itself at its renew deadline).
        """
        if not reason:
            raise ValueError("fail() needs a reason")
        self.failure = reason
        self._notify()

    def restore(self) -> None:
        """Undo :meth:`fail` and :meth:`stall`: campaigns go on, the leader (if not fenced yet) confirms again."""
        self.failure = None
        if self.holder is not None:
            self.holder.stalled = False
        self._notify()

    def _current(self, what: str) -> _MemoryHold:
        if self.holder is None:
            raise LookupError(f"{what}(): nobody leads the memory election {self.name!r}")
        return self.holder


# One table of elections per event loop: a test's loop starts from empty elections and takes them along when it goes.
_elections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, MemoryElection]] = (
    weakref.WeakKeyDictionary()
)


def election_of(name: str) -> MemoryElection:
    """The election ``name`` of the running event loop (created empty on first use).

    Raises :class:`RuntimeError` outside a running event loop.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"the memory election {name!r} belongs to an event loop: use it from code running in one"
        ) from None
    table = _elections.setdefault(loop, {})
    election = table.get(name)
    if election is None:
        election = table[name] = MemoryElection(name)
    return election


class MemoryStateStore(StateStore):
    """The fenced state of a :class:`MemoryElection`: a write checks the election's counter in the same step."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend

    def _election(self) -> MemoryElection:
        election = self._backend.election()
        if election.failure is not None:
            raise BackendUnavailable(f"memory election {election.name!r}: {election.failure}")
        return election

    async def read(self, key: str) -> bytes | None:
        await anyio.lowlevel.checkpoint()
        return self._election().state.get(key)

    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        await anyio.lowlevel.checkpoint()
        election = self._election()
        if hold.token != election.last_token:
            return Written.FENCED
        if compare and election.state.get(key) != expected:
            return Written.CONFLICT
        election.state[key] = value
        return Written.DONE

    async def post(self, key: str, value: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        self._election().state[key] = value


class MemoryBackend(Backend):
    """A candidate's view of the :class:`MemoryElection` of its name in the running event loop."""

    kind = "memory"
    #: Each event loop starts its elections anew, tokens included: an elector used in two loops (two test
    #: clients of one application) sees token 1 again.
    tokens_may_repeat = True

    def __init__(
        self, name: str, *, renew_deadline: float = DEFAULT_RENEW_DEADLINE, check_interval: float | None = None
    ) -> None:
        super().__init__(validate_name(name))
        self._renew_deadline = positive("renew_deadline", renew_deadline)
        if check_interval is None:
            check_interval = self._renew_deadline / 4
        self.check_interval = positive("check_interval", check_interval)
        if self.check_interval >= self._renew_deadline:
            raise ValueError(
                f"check_interval ({self.check_interval:g}s) must be shorter than renew_deadline "
                f"({self._renew_deadline:g}s), or every leadership would fence itself"
            )

    @property
    def renew_deadline(self) -> float:
        return self._renew_deadline

    def describe_timing(self) -> str:
        return (
            f"memory: confirms every {self.check_interval:g}s, fences itself after {self._renew_deadline:g}s "
            "without a confirmation; shared by the electors of this name in this event loop only"
        )

    def election(self) -> MemoryElection:
        """This backend's election in the running event loop."""
        return election_of(self.name)

    def _new_state_store(self) -> StateStore:
        return MemoryStateStore(self)

    async def campaign(self, identity: str) -> Hold:
        election = self.election()
        ticket = object()
        backoff = Backoff(first=0.01, maximum=0.2)
        election.enqueue(ticket)
        try:
            await anyio.lowlevel.checkpoint()
            while True:
                changed = election.changed()
                hold = election.try_grant(ticket, identity, self.check_interval)
                if hold is not None:
                    return hold
                if election.failure is not None:
                    delay = backoff.next_delay()
                    self.report_error(f"memory election {self.name!r}: {election.failure}", delay)
                    with anyio.move_on_after(delay):
                        await changed.wait()
                    continue
                backoff.reset()
                await changed.wait()
        finally:
            election.dequeue(ticket)

    async def try_campaign(self, identity: str) -> Hold | None:
        await anyio.lowlevel.checkpoint()
        election = self.election()
        if election.failure is not None:
            raise BackendUnavailable(f"memory election {self.name!r}: {election.failure}")
        if election.holder is not None:
            return None
        # Free now: taken at once, ahead of any waiting campaign, as a real lock request without a wait is.
        ticket = object()
        election.enqueue_first(ticket)
        try:
            return election.try_grant(ticket, identity, self.check_interval)
        finally:
            election.dequeue(ticket)

    async def leader(self) -> str | None:
        await anyio.lowlevel.checkpoint()
        election = self.election()
        if election.failure is not None:
            raise BackendUnavailable(f"memory election {self.name!r}: {election.failure}")
        return election.leader()

    async def observe(self) -> AsyncIterator[str | None]:
        election = self.election()
        last: object = object()
        while True:
            changed = election.changed()
            # A failed server reports nothing rather than a guess, as a real one would.
            if election.failure is None and (current := election.leader()) != last:
                last = current
                yield current
            await changed.wait()
