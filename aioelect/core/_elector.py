"""The contract users see, written once above every backend: :class:`Elector`, :class:`Leadership`, the keeper.

It drives any :class:`~aioelect.core._backend.Backend` it is given and imports
none: which backend an elector uses is chosen above, in
:mod:`aioelect.wiring._electors` and :mod:`aioelect.wiring._factory`. It guarantees, for
every backend, what :class:`Elector` and :class:`Leadership` say: leadership
bound to the acquiring task, loss detected in the background, self-fencing
on the renew deadline, and leader work stopped before the lock is let go.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import enum
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import anyio

from ._backend import Backend, Hold, Loss, Reporter, monotonic
from ._config import default_identity, positive, validate_identity
from ._errors import ElectionError, ElectorClosed, LeadershipLost, LossKind, PermanentBackendError, UsageError
from ._events import Event, EventKind, Listener
from ._handover import NOTE_TIMEOUT, RELEASE_READ_TIMEOUT, RELEASE_WINDOW, Gate, Note, Priority, Request
from ._health import Health
from ._log import ElectionLog
from ._tasks import TaskSet, consume, first_of
from ._transitions import Transitions

__all__ = [
    "Elector",
    "Leadership",
    "current_leadership",
    "default_identity",
    "leading",
    "leading_if_free",
    "validate_identity",
]

T = TypeVar("T")
_E = TypeVar("_E", bound="Elector")

#: Upper bound on a backend release, so that closing never hangs on a dead server.
RELEASE_TIMEOUT = 5.0
#: While a voluntary release waits for leader work that ignores cancellation,
#: the ERROR saying so is repeated this often (seconds).
STILL_RUNNING_LOG_INTERVAL = 10.0

#: How long the end of a campaign waits for its watch of the leader to stop (it finishes on its own after).
WATCH_STOP_WAIT = 0.5

#: How often the loop-lag timer runs while a leadership with a renew deadline is held in the loop (seconds).
LAG_TICK = 0.1
#: A lag of the event loop at least this long is recorded as a block. One at least a quarter of a leadership's
#: renew deadline is named in a loss that follows it, and in a WARNING when the leadership survived it with
#: less than half its renew deadline to spare.
BLOCK_MIN = 0.2

#: The leadership whose leader work is running in this context (see :func:`current_leadership`).
_CURRENT: contextvars.ContextVar[Leadership | None] = contextvars.ContextVar("aioelect_leadership", default=None)


def current_leadership() -> Leadership:
    """The :class:`Leadership` of the leader work running in this context.

    Set for the body of ``async with aioelect.leadership(elector)``, for
    ``work`` in :meth:`Elector.run`, and for every task they start (asyncio
    copies the context into a new task), so that code deep inside leader
    work can call ``current_leadership().check()`` or read its ``token``
    without the leadership being passed down.

    Raises :class:`~aioelect.UsageError` outside leader work: code that
    may only run as leader learns at once that it is not. A plain
    :meth:`Elector.acquire` sets nothing (it has no body to scope); use the
    :class:`Leadership` it returns. Inside leader work that has ended (its
    leadership released or lost) this still returns that leadership, whose
    :attr:`~Leadership.held` is then False: check it before acting.
    """
    lead = _CURRENT.get()
    if lead is None:
        raise UsageError(
            "current_leadership() called outside leader work: it is set only inside "
            "'async with aioelect.leadership(elector)', Elector.run(work) and the tasks they start"
        )
    return lead


class _LoopLag:
    """How long one event loop went without running its callbacks: its blocks, measured by the loop's lag.

    One timer per loop, never a task: while a leadership with a renew
    deadline is held in the loop it runs every :data:`LAG_TICK` seconds,
    and each time it runs more than :data:`BLOCK_MIN` late it records a block
    (when it ended, how late the timer ran). A block of ``B`` seconds is
    measured as between ``B - LAG_TICK`` and ``B``. The block still going
    on, seen by a task that runs before the timer does, counts too.
    """

    #: The loops in which a leadership needs the timer now: forgotten with their last such leadership.
    _of: ClassVar[dict[asyncio.AbstractEventLoop, _LoopLag]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._users = 0
        self._timer: asyncio.TimerHandle | None = None
        self._beat = monotonic()
        #: (ended at, lag) of the last blocks, oldest first.
        self._blocks: collections.deque[tuple[float, float]] = collections.deque(maxlen=16)

    @classmethod
    def of_running_loop(cls) -> _LoopLag:
        loop = asyncio.get_running_loop()
        for closed in [other for other in cls._of if other.is_closed()]:
            # Closed with a leadership still held in it (its keeper never ended): nothing will drop it.
            del cls._of[closed]
        lag = cls._of.get(loop)
        if lag is None:
            lag = cls._of[loop] = cls(loop)
        return lag

    def hold(self) -> None:
        """One more leadership in the loop needs the timer: started with the first."""
        self._users += 1
        if self._timer is None:
            self._beat = monotonic()
            self._timer = self._loop.call_later(LAG_TICK, self._tick)

    def drop(self) -> None:
        """One leadership fewer: the timer stops with the last."""
        self._users -= 1
        if self._users <= 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._of.get(self._loop) is self:
                del self._of[self._loop]

    def _tick(self) -> None:
        now = monotonic()
        lag = now - self._beat - LAG_TICK
        if lag >= BLOCK_MIN:
            self._blocks.append((now, lag))
        self._beat = now
        self._timer = self._loop.call_later(LAG_TICK, self._tick)

    def longest_since(self, since: float) -> float:
        """The longest block that ended after ``since`` or is going on now, in seconds (0.0: none)."""
        now = monotonic()
        current = now - self._beat - LAG_TICK if self._timer is not None else 0.0
        longest = max((lag for ended, lag in self._blocks if ended > since), default=0.0)
        return max(longest, current if current >= BLOCK_MIN else 0.0)


class _State(enum.Enum):
    """The states of an :class:`Elector`; the value is how its repr and errors show it."""

    IDLE = "idle"
    CAMPAIGNING = "campaigning"
    LEADING = "leading"
    CLOSED = "closed"


class _Do(enum.Enum):
    """What moves an :class:`Elector` from one state to the next."""

    CAMPAIGN = "campaign started"
    STOP = "campaign ended without a leadership"
    WIN = "campaign won"
    END = "leadership ended"
    CLOSE = "aclose()"


#: Every transition of an :class:`Elector`. A step not listed for a state changes nothing: a campaign's end
#: once the elector is closed, the end of a leadership that is not the current one.
ELECTOR_TRANSITIONS: Transitions[_State, _Do] = Transitions(
    start=_State.IDLE,
    final=frozenset({_State.CLOSED}),
    table={
        (_State.IDLE, _Do.CAMPAIGN): _State.CAMPAIGNING,
        (_State.CAMPAIGNING, _Do.STOP): _State.IDLE,
        (_State.CAMPAIGNING, _Do.WIN): _State.LEADING,
        (_State.LEADING, _Do.END): _State.IDLE,
        (_State.IDLE, _Do.CLOSE): _State.CLOSED,
        (_State.CAMPAIGNING, _Do.CLOSE): _State.CLOSED,
        (_State.LEADING, _Do.CLOSE): _State.CLOSED,
    },
)


class _Lead(enum.Enum):
    """The states of a :class:`Leadership`; the value is how its repr shows it."""

    HELD = "held"
    #: Our release was asked for: leader work stops, then the backend lets go.
    RELEASING = "releasing"
    #: Lost: leader work stops (for at most stop_timeout), then the backend is told to let go.
    LOSING = "losing"
    RELEASED = "released"
    LOST = "lost"


class _Step(enum.Enum):
    """What moves a :class:`Leadership` from one state to the next."""

    RELEASE = "release asked"
    LOSS = "loss found"
    LET_GO = "backend let go"


#: Every transition of a :class:`Leadership`. A step not listed for a state changes nothing: a loss after
#: the backend let go, a second release. A keeper stopped from outside while held lets go as a release.
LEADERSHIP_TRANSITIONS: Transitions[_Lead, _Step] = Transitions(
    start=_Lead.HELD,
    final=frozenset({_Lead.RELEASED, _Lead.LOST}),
    table={
        (_Lead.HELD, _Step.RELEASE): _Lead.RELEASING,
        (_Lead.HELD, _Step.LOSS): _Lead.LOSING,
        # A loss while leader work stops ends the leadership as a loss.
        (_Lead.RELEASING, _Step.LOSS): _Lead.LOSING,
        (_Lead.RELEASING, _Step.LET_GO): _Lead.RELEASED,
        (_Lead.LOSING, _Step.LET_GO): _Lead.LOST,
    },
)
_ENDING = frozenset(LEADERSHIP_TRANSITIONS.final | {_Lead.RELEASING, _Lead.LOSING})
_LOSS = frozenset({_Lead.LOSING, _Lead.LOST})


@dataclass(eq=False)
class _Work:
    """Leader work that must stop before leadership is released."""

    scope: anyio.CancelScope
    task: asyncio.Task[Any] | None
    done: anyio.Event = field(default_factory=anyio.Event)


class Leadership:
    """A held leadership, as returned by :meth:`Elector.acquire`.

    Guarantees:

    * ``held`` is False as soon as leadership may have passed to someone else:
      after a detected loss, after our release, and after the backend's renew
      deadline has gone by without a successful confirmation (measured on the
      monotonic clock, so even before the background keeper has run).
    * Leadership is released when the task that acquired it finishes, when
      :meth:`release` is called, or when the elector is closed, whichever is
      first.
    * On a release, work registered through :func:`aioelect.leadership` or
      :meth:`Elector.run` is cancelled and has stopped before the backend lets
      go. Work that ignores cancellation for longer than ``stop_timeout``
      keeps the lock held (and confirmed) until it stops: an ERROR is logged
      at ``stop_timeout`` and every :data:`STILL_RUNNING_LOG_INTERVAL` seconds
      after. A loss during that wait ends the leadership as a loss.
    * On loss, ``lost`` becomes True and :meth:`wait_lost` returns first; the
      registered work is then cancelled and awaited for at most
      ``stop_timeout`` seconds, and then the backend is told to release (the
      lock may already belong to someone else). Work still running then is
      logged as an ERROR and stays cancelled.
    * A task that ends as soon as :meth:`Elector.acquire` returns (one made by
      ``asyncio.wait_for()`` on Python 3.10 and 3.11, or by
      ``create_task(elector.acquire())``) cannot hold leadership: the
      leadership is lost at once, with an ERROR and a ``lost_reason`` that
      name the cause and the fix. Never a silent release.

    Its life is the state machine :data:`LEADERSHIP_TRANSITIONS` (drawn in
    the concepts page): every property reads the state, and the only other
    input is the clock of the renew deadline while it is held.
    """

    def __init__(self, elector: Elector, hold: Hold, log: ElectionLog) -> None:
        self._elector = elector
        self._hold = hold
        self._log = log
        self._deadline = elector._backend.renew_deadline
        self._confirmed_at = hold.acquired_at or monotonic()
        #: The loop's blocks, measured while a renew deadline can be lost to them (None: no deadline, or ended).
        self._lag: _LoopLag | None = None
        #: Renewals that failed (and were retried) since the last confirmation, and when the first of them failed.
        self._failures = 0
        self._failing_since = 0.0
        self._state = LEADERSHIP_TRANSITIONS.start
        #: Set, and replaced, at every transition: what waiters for a state wait on.
        self._changed = anyio.Event()
        #: Why it was lost: set with the move to LOSING.
        self._loss: Loss | None = None
        self._work: list[_Work] = []
        self._keeper: asyncio.Task[None] | None = None
        #: The scope of the keeper's watch for a loss and for the deadline, while it runs; and whether a
        #: release with no work to stop ended it.
        self._watching: anyio.CancelScope | None = None
        self._watch_ended = False
        self._owner: asyncio.Task[Any] | None = None
        #: Tasks that called release(): one may do so from inside its own work, and cannot wait for itself.
        self._releasers: set[asyncio.Task[Any]] = set()
        self.identity: str = elector.identity
        self.token: int | None = hold.token
        #: The step-down under way, and how it ended (None: it succeeded): a second one shares its outcome.
        self._stepping: anyio.Event | None = None
        self._stepped: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<Leadership {self._elector.backend}:{self._elector.name} "
            f"identity={self.identity!r} token={self.token} {'lost' if self.lost else self._state.value}>"
        )

    @property
    def lost(self) -> bool:
        """True once leadership ended for a reason other than our own release: a loss the keeper reported (the
        state), or the renew deadline gone by without a confirmation (the clock, read at each call, even before
        the keeper has run). :attr:`lost_kind` says which: ``SELF_FENCED`` for the clock."""
        return self._state in _LOSS or (self._state is _Lead.HELD and self._deadline_passed())

    @property
    def lost_reason(self) -> str | None:
        """Why leadership was lost, or None."""
        if self._state in _LOSS and self._loss is not None:
            return self._loss.reason
        return "renew deadline exceeded" if self.lost else None

    @property
    def lost_kind(self) -> LossKind | None:
        """Why leadership was lost, as a :class:`~aioelect.LossKind` a program can branch on; None unless lost."""
        if self._state in _LOSS and self._loss is not None:
            return self._loss.kind
        return LossKind.SELF_FENCED if self.lost else None

    @property
    def held(self) -> bool:
        """True while we may act as leader: neither lost, released (or releasing), nor past the renew deadline."""
        return self._state is _Lead.HELD and not self._deadline_passed()

    def check(self) -> None:
        """Raise :class:`LeadershipLost` unless leadership is :attr:`held`.

        Call it right before an action only the leader may take.
        """
        if not self.held:
            raise LeadershipLost(self.lost_reason or "released", self.lost_kind)

    async def wait_lost(self) -> None:
        """Return when leadership is lost (never returns after a plain release)."""
        await self._until(_LOSS)

    async def release(self) -> None:
        """Stop registered leader work, then release leadership. Idempotent.

        Returns once the backend has let go (or gave up trying after a bounded
        time: a connection that is gone has released the lock by itself).
        Registered work is cancelled first; work that ignores cancellation
        past ``stop_timeout`` is waited for, lock held, for as long as it runs
        (logged as an ERROR). Cancelling the caller does not interrupt the
        release.
        """
        if self._state is _Lead.HELD and self._stepping is None and self._elector._gate.priority is not None:
            with anyio.CancelScope(shield=True):  # a release asked by a cancelled caller (SIGTERM) still hands over
                # Handed over or not, the release below waits for the backend to let go: a step-down it shared
                # (a request answered meanwhile) returned once the release was asked for.
                await self._release_to_priority()
        task = asyncio.current_task()
        if task is not None and self._state not in LEADERSHIP_TRANSITIONS.final:
            self._releasers.add(task)
        if self._step(_Step.RELEASE) and self._watching is not None and not self._work_to_stop():
            # No work to wait for, so no loss to watch for meanwhile: the watch ends now, and the keeper
            # lets go as soon as it runs instead of first stopping the watch.
            self._watch_ended = True
            self._watching.cancel()
        with anyio.CancelScope(shield=True):
            await self._finished()

    async def _release_to_priority(self) -> bool:
        """Release as a step-down to the waiting candidate of a higher priority, if one says it waits: True once
        done. A leader that stops (a rolling deploy's SIGTERM) then passes to the newer version, never to a peer
        that happened to wait first."""
        successor = await self._elector._gate.waiting_successor(self.identity)
        if successor is None or not self.held:
            return False
        try:
            # As a plain release: work that called release() from inside itself goes on, to return its result.
            await self._step_down(
                successor, RELEASE_WINDOW, "release", None, stop_caller=False, note_bound=RELEASE_READ_TIMEOUT
            )
        except ElectionError as exc:
            self._log.warning(
                "release to %r, of higher priority, not handed over (%s): a plain release", successor, exc
            )
            return False
        return True

    # ``timeout`` is the length of the handover window, not a bound on this call.
    async def step_down(
        self,
        to: str | None = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109
        reason: str = "requested",
    ) -> None:
        """Stop leader work and release, leaving a handover note: until ``timeout``, only ``to`` may lead next.

        Without ``to``, any other candidate may lead next, and this elector
        stays out until another leads or ``timeout`` has passed. The note is
        a fenced write (a deposed leader leaves none, and gets
        :class:`LeadershipLost`); the release is the ordinary one, so the
        successor leads as soon as the work has stopped, with a larger token.
        Called from inside the leader work, that work is cancelled once the
        release is done (the rest of it would run without leadership).

        Raises :class:`~aioelect.UsageError` if this leadership is not held
        (released, or lost), or the backend keeps no handover notes (local,
        fencing off, PostgreSQL without ``schema=``). A second call while one
        is under way waits for it and has its outcome; one after it raises
        UsageError, as the leadership is no longer held.
        """
        await self._step_down(to, timeout, reason, None)

    async def _step_down(
        self,
        to: str | None,
        timeout: float,  # noqa: ASYNC109 - the window's length, as in step_down()
        reason: str,
        request: str | None,
        *,
        wait: bool = True,
        stop_caller: bool = True,
        note_bound: float = NOTE_TIMEOUT,
    ) -> None:
        """:meth:`step_down`, the note naming the step-down ``request`` it answers (None: asked in-process).

        ``wait=False`` returns once the release is asked for (the keeper stops the work and lets go): for a
        caller that runs inside the leader work's task group, which must end before the release can.
        ``stop_caller=False`` leaves the caller's own work running once released, as :meth:`release` does.
        """
        if to is not None:
            to = validate_identity(to)
        timeout = positive("timeout", timeout)
        if self._stepping is not None and not self._stepping.is_set():
            await self._stepping.wait()
            if self._stepped is not None:
                raise self._stepped
            return
        if not self.held:
            state = "lost: " + (self.lost_reason or "") if self.lost else self._state.value
            raise UsageError(f"step_down(): {self._elector.name!r} is not led by this leadership ({state})")
        self._stepping = anyio.Event()
        caller = asyncio.current_task()
        mine = [w for w in self._work if w.task is caller] if wait and stop_caller else []
        try:
            note = Note(self.identity, self.token or 0, to, time.time() + timeout, timeout, reason, request=request)
            if not await self._elector._gate.leave(self._hold, note, note_bound):
                raise LeadershipLost("step_down(): a newer leader exists; nothing handed over", LossKind.DEPOSED)
            self._log.info("stepping down (%s): %s", reason, note.describe())
            self._elector._emit("handover_requested", token=self.token, reason=reason, successor=to)
            if wait and caller is not None:
                self._releasers.add(caller)  # as release(): its own work is not waited for
            self._step(_Step.RELEASE)
            announced = self._elector._tasks.start(self._stepped_down(reason, to), name="aioelect-step-down")
            if wait:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([announced])
        except BaseException as exc:
            self._stepped = exc
            raise
        finally:
            self._stepping.set()
        for work in mine:
            work.scope.cancel()
        if mine:
            await anyio.lowlevel.checkpoint()

    async def _answer(self, request: Request) -> None:
        """Step down as a step-down ``request`` asks; not waiting: this may run inside the leader work's task group,
        which must end before the release can."""
        try:
            await self._step_down(request.successor, request.timeout, request.reason, request.id, wait=False)
        except ElectionError as exc:
            self._log.warning("step-down request %s not acted on: %s", request.id, exc)

    async def _stepped_down(self, reason: str, to: str | None) -> None:
        await self._finished()
        if self._state is _Lead.RELEASED:
            self._elector._emit("stepped_down", token=self.token, reason=reason, successor=to)

    async def _finished(self) -> None:
        """Return once the backend has let go (or the keeper gave up on it) and the keeper has ended."""
        await self._until(LEADERSHIP_TRANSITIONS.final)
        keeper = self._keeper
        if keeper is not None and keeper is not asyncio.current_task():
            # The keeper ends right after it finishes the leadership: no task outlives what it kept.
            with anyio.CancelScope(shield=True):
                await asyncio.wait([keeper])

    def _step(self, step: _Step) -> bool:
        """Take ``step`` if the table allows it from the current state; whether the state changed."""
        target = LEADERSHIP_TRANSITIONS.next(self._state, step)
        if target is None:
            return False
        self._state = target
        self._changed.set()
        self._changed = anyio.Event()
        return True

    async def _until(self, states: frozenset[_Lead]) -> None:
        while self._state not in states:
            await self._changed.wait()

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and monotonic() - self._confirmed_at >= self._deadline

    def _renew_failed(self) -> None:
        """The backend retries a renewal that failed (it logged why): counted until the next confirmation."""
        if self._state is _Lead.HELD:
            if not self._failures:
                self._failing_since = monotonic()
            self._failures += 1

    def _blocked(self) -> float:
        """The longest block of the event loop since the send of the last confirmation, if at least a quarter of
        the renew deadline (0.0: none)."""
        if self._lag is None or self._deadline is None:
            return 0.0
        blocked = self._lag.longest_since(self._confirmed_at)
        return blocked if blocked >= self._deadline / 4 else 0.0

    def _confirm(self, sent_at: float) -> None:
        if self._state is _Lead.HELD and self._deadline_passed():
            # Read after the deadline (sent after it: the loop was blocked past it, and the keeper has not run yet;
            # or sent before it and its answer left unread by a block): too late to keep the leadership, whatever
            # the server answers. Meanwhile held was False, and it never becomes True again.
            self._fence()
            return
        if sent_at > self._confirmed_at:
            blocked = self._blocked()
            spare = self._confirmed_at + (self._deadline or 0.0) - monotonic()
            if blocked and self._deadline is not None and 0 < spare < self._deadline / 2:
                self._log.warning(
                    "the event loop was blocked for %.1fs (measured by its lag): leadership kept with %.2fs of its "
                    "renew deadline of %gs to spare; a longer block loses it. Move blocking calls off the loop "
                    "(asyncio.to_thread)",
                    blocked,
                    spare,
                    self._deadline,
                )
            self._confirmed_at = sent_at
        latency = monotonic() - sent_at
        if self._failures:
            # Every backend's failed renewals are WARNINGs: the line that says they ended is said here, once.
            self._log.info(
                "renewal recovered after %d failure%s (%.1f s)",
                self._failures,
                "" if self._failures == 1 else "s",
                monotonic() - self._failing_since,
            )
            self._failures = 0
        self._log.debug("confirmed in %.3fs", latency)
        self._elector._emit("confirmed", token=self.token, latency=latency)

    # --- binding to the caller -------------------------------------------------

    def _start(self, owner: asyncio.Task[Any] | None) -> None:
        self._owner = owner
        if self._deadline is not None:
            self._lag = _LoopLag.of_running_loop()
            self._lag.hold()
        if owner is not None:
            owner.add_done_callback(self._owner_done)
        self._keeper = self._elector._tasks.start(
            self._keep(), name=f"aioelect-keeper-{self.identity}", on_done=self._keeper_done
        )

    def _owner_done(self, task: asyncio.Task[Any]) -> None:
        if self._state is _Lead.HELD and not task.cancelled() and task.exception() is None and task.result() is self:
            # The task existed only to run acquire(): nobody is left to hold the leadership for.
            reason = (
                f"the task that acquired this leadership ({task.get_name()}) ended as soon as acquire() returned, "
                "which ends the leadership: asyncio.wait_for() on Python 3.10 and 3.11, and "
                "create_task(elector.acquire()), run acquire() in a task of its own. Bound acquire() in the task "
                "that leads instead: acquire(timeout=...), asyncio.timeout() or anyio.fail_after()"
            )
            self._log.error("%s", reason)
            self._mark_lost(Loss(LossKind.SELF_FENCED, reason))
        self._step(_Step.RELEASE)

    def _keeper_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._log.error("leadership keeper failed", exc_info=task.exception())
        # Whatever happened, nobody may wait forever on a finished keeper.
        self._finish()

    def _finish(self) -> None:
        """The one way a leadership ends: the backend let go (or the keeper gave up on it)."""
        self._step(_Step.RELEASE)  # from HELD only: a keeper stopped from outside lets go as a release
        self._step(_Step.LET_GO)
        lag, self._lag = self._lag, None
        if lag is not None:
            lag.drop()
        self._elector._ended(self)

    @contextlib.contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """Run the body as this leadership's leader work: cancelled on loss, awaited before release.

        ``with lead.guard():`` is what :func:`aioelect.leadership` and
        :meth:`Elector.run` wrap their body in, for a caller that holds a
        leadership from :meth:`Elector.acquire` and runs its work elsewhere
        (the command line's child process). Cancelled at once when the
        leadership is no longer :attr:`held`.
        """
        work = _Work(anyio.CancelScope(), asyncio.current_task())
        self._work.append(work)
        try:
            with work.scope:
                if not self.held:
                    work.scope.cancel()
                yield work.scope
        finally:
            self._work.remove(work)
            work.done.set()

    # --- the keeper --------------------------------------------------------------

    def _mark_lost(self, loss: Loss) -> None:
        if LEADERSHIP_TRANSITIONS.next(self._state, _Step.LOSS) is None:
            return
        blocked = self._blocked()
        if blocked:
            loss = Loss(
                loss.kind,
                f"{loss.reason}; the event loop was blocked for {blocked:.1f}s (measured by its lag) since the last "
                "confirmation was sent",
            )
        self._loss = loss
        self._step(_Step.LOSS)
        reason = loss.reason
        self._log.warning("leadership lost (%s); token=%s", reason, self.token)
        self._elector._emit("lost", token=self.token, reason=reason)

    async def _keep(self) -> None:
        try:
            # Loss is watched for until the backend is told to let go, including while work stops.
            async with anyio.create_task_group() as tg:
                self._watching = tg.cancel_scope
                tg.start_soon(self._until_lost)
                tg.start_soon(self._until_deadline)
                await self._until(_ENDING)
                await self._stop_work()
                tg.cancel_scope.cancel()
            if self._watch_ended:
                # A release with no work to stop ended the watch at once (see release()): work registered
                # since was cancelled as it started, and still stops before the backend lets go.
                await self._stop_work()
        finally:
            self._watching = None
            with anyio.CancelScope(shield=True):
                await self._release_backend()

    async def _until_lost(self) -> None:
        try:
            found = await self._hold.monitor(self._confirm)
        except Exception as exc:  # a backend fault is a loss, never a crash
            found = f"monitor failed: {exc!r}"
        self._mark_lost(found if isinstance(found, Loss) else Loss(LossKind.CONNECTION_LOST, found))

    async def _until_deadline(self) -> None:
        if self._deadline is None:
            return
        # Confirmations move the deadline, so sleep to it again until it holds.
        while (left := self._confirmed_at + self._deadline - monotonic()) > 0:  # noqa: ASYNC110
            await anyio.sleep(left)
        self._fence()

    def _fence(self) -> None:
        self._mark_lost(
            Loss(LossKind.SELF_FENCED, f"renew deadline of {self._deadline:g}s exceeded without confirmation")
        )

    def _work_to_stop(self) -> list[_Work]:
        # A task that called release() from inside its own work cannot wait for itself.
        return [w for w in self._work if w.task not in self._releasers]

    async def _stop_work(self) -> None:
        pending = self._work_to_stop()
        for work in pending:
            work.scope.cancel()
        if not pending:
            return

        def running() -> bool:
            return not all(w.done.is_set() for w in pending)

        async def all_stopped() -> None:
            for work in pending:
                await work.done.wait()

        cancelled_at = monotonic()
        timeout = self._elector._stop_timeout
        with anyio.move_on_after(timeout):
            await all_stopped()
        if self._state is _Lead.RELEASING and running():
            # A voluntary release: the lock is still ours, so keep it rather than let a new leader
            # start beside work that is still running.
            self._log.error(
                "leader work ignored cancellation for %gs (stop_timeout); keeping the lock until it stops",
                timeout,
            )
            while self._state is _Lead.RELEASING and running():
                with anyio.move_on_after(STILL_RUNNING_LOG_INTERVAL):
                    await first_of(all_stopped, self.wait_lost)
                if self._state is _Lead.RELEASING and running():
                    self._log.error(
                        "leader work still running %.1fs after it was cancelled; keeping the lock until it stops",
                        monotonic() - cancelled_at,
                    )
            if self._state is _Lead.RELEASING:
                self._log.warning("leader work stopped %.1fs after it was cancelled", monotonic() - cancelled_at)
                return
        if running():
            self._log.error(
                "leader work still running %.1fs after it was cancelled, and leadership is lost (%s): releasing; "
                "that work goes on without leadership until it stops (it stays cancelled)",
                monotonic() - cancelled_at,
                self.lost_reason,
            )

    async def _release_backend(self) -> None:
        self._step(_Step.RELEASE)  # from HELD only: the keeper was stopped from outside
        if self._owner is not None:
            self._owner.remove_done_callback(self._owner_done)
        with anyio.move_on_after(RELEASE_TIMEOUT) as scope:
            try:
                await self._hold.release()
            except Exception as exc:
                self._log.warning("release failed (%r); the server drops the lock with the connection", exc)
        if scope.cancelled_caught:
            self._log.warning("release timed out after %gs", RELEASE_TIMEOUT)
        if self._state is _Lead.RELEASING:
            self._log.info("leadership released; token=%s", self.token)
            self._elector._emit("released", token=self.token)
        self._finish()


class Elector:
    """One candidate in one election.

    Guarantees, for every backend:

    * :meth:`acquire` returns only once this candidate leads; cancelling it
      (or its ``timeout`` running out) leaves no lock, key, connection or
      task behind.
    * One campaign or leadership at a time per elector; after a release the
      same elector may campaign again, even while the previous leadership is
      still being let go (:meth:`acquire` waits for that first).
    * Leadership is released when the acquiring task finishes, on
      :meth:`Leadership.release`, or on :meth:`aclose`; release is idempotent.
    * Loss is detected in the background and self-fencing applies (see
      :class:`Leadership`).
    * While it campaigns, each change of leader is a ``leader`` event and
      :attr:`last_leader` follows it, without the caller running
      :meth:`observe`; the watch ends with the campaign and leaves nothing
      open on the server.
    * Every fencing token it hands out is a positive integer larger than
      every token this elector held before. A backend that grants a
      leadership with any other token (a counter an operator reset or set
      negative, a server restored from an old backup) gets it given back at
      once and :meth:`acquire` raises :class:`~aioelect.PermanentBackendError`;
      only a backend whose tokens are declared volatile
      (``volatile_tokens=True`` on Redis) may repeat or lower one, logged at
      WARNING. A backend without tokens (``fencing=False``) hands out None.

    Subclasses only choose a backend; construct them, not this class.
    """

    def __init__(self, backend: Backend, *, identity: str | None = None, stop_timeout: float = 5.0) -> None:
        if not stop_timeout > 0:
            raise ValueError("stop_timeout must be > 0")
        self._backend = backend
        self._identity = validate_identity(identity) if identity is not None else default_identity()
        self._stop_timeout = float(stop_timeout)
        self._state = ELECTOR_TRANSITIONS.start
        self._leadership: Leadership | None = None
        self._campaign_scope: anyio.CancelScope | None = None
        #: The campaign that moved the elector to CAMPAIGNING: only it may end that state (a campaign that gave
        #: a grant back has ended it already, and another may have started while it did).
        self._campaigner: object | None = None
        #: Set when each campaign in progress has ended, a hold it won released or handed on: aclose() waits for
        #: them before it closes the backend, which would leave such a hold to its lease.
        self._campaigns: set[anyio.Event] = set()
        #: The keeper of each leadership and the leader watch of each campaign: cancelled and awaited by aclose().
        self._tasks = TaskSet()
        self._log = ElectionLog(backend.kind, backend.name, self._identity)
        #: The handover rule every grant passes before it becomes a leadership.
        self._gate = Gate(backend, self._log)
        backend.attach(Reporter(self._log, self._backend_error, on_leader=self._saw_leader))
        for warning in backend.warnings:
            self._log.warning("%s", warning)
        self._timing_logged = False
        self._listeners: list[Listener] = []
        self._last_leader: str | None = None
        #: The largest fencing token this elector has held.
        self._highest_token: int | None = None

    def set_health(
        self,
        check: Callable[[], Awaitable[object]] | None,
        *,
        failures: int = 3,
        interval: float = 5.0,
        timeout: float = 2.0,
        backoff: float = 30.0,
    ) -> None:
        """Campaign only while ``await check()`` passes, and step down after ``failures`` failures in a row.

        A check passes unless it returns False, raises, or runs past
        ``timeout`` seconds. While leading it runs every ``interval`` seconds;
        after ``failures`` failures in a row the leader steps down (reason
        ``unhealthy``: its work stops, it releases) and stays out of the
        election for ``backoff`` seconds. A candidate campaigns only once a
        check passes. Each change is logged with its reason. None removes
        the check. Takes effect at the next campaign or leadership.
        """
        self._gate.health = None if check is None else Health(check, failures, interval, timeout, backoff)

    def set_priority(self, priority: int | None, *, settle: float = 10.0) -> None:
        """Give this candidate a priority: while it waits and is healthy, every ``settle`` seconds it asks a leader of
        strictly lower priority to hand over to it; while it leads, it records its priority and acts on such requests.

        Leadership only ever moves to a higher priority, so it never flaps
        between candidates. A leader without a priority counts as 0. None
        removes it. Needs a backend with handover notes.
        """
        if priority is None:
            self._gate.priority = None
            return
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be a whole number, not {priority!r}")
        self._gate.priority = Priority(priority, positive("settle", settle))

    def lock_timing(self) -> tuple[float, float, float] | None:
        """``(margin, lease, renew_deadline)``: how long the server keeps a leader's lock (or lease) after it was
        cut off (``lease``), how long the leader goes without a confirmation before it fences itself, and the
        margin between the two (the one the backend checks its server-side bounds against) that a leader cut
        off has to stop its work in; None for a backend whose leadership cannot be taken away while this
        process lives (file, local)."""
        margin, deadline = self._backend.margin, self._backend.renew_deadline
        if margin is None or deadline is None:
            return None
        return margin, margin + deadline, deadline

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} backend={self.backend} name={self.name!r} "
            f"identity={self._identity!r} state={self._state.value}>"
        )

    @property
    def backend(self) -> str:
        """The backend's short name: ``mysql``, ``etcd``, ``local``..."""
        return self._backend.kind

    @property
    def name(self) -> str:
        """The election's name (lock name or key prefix)."""
        return self._backend.name

    @property
    def identity(self) -> str:
        """This candidate's identity, as :meth:`leader` reports it to others."""
        return self._identity

    @identity.setter
    def identity(self, value: str) -> None:
        if self._state is not _State.IDLE:
            raise UsageError("identity can only change while the elector is idle")
        self._identity = validate_identity(value)
        self._log.rebind(identity=value)

    @property
    def leading(self) -> bool:
        """True while this elector holds a leadership that is :attr:`Leadership.held`."""
        return self._leadership is not None and self._leadership.held

    @property
    def last_leader(self) -> str | None:
        """The last leader this elector knows of, without asking the server; None before any report.

        While this elector campaigns (:meth:`acquire`, :meth:`run`,
        :func:`aioelect.leadership`), it watches the backend's leader
        (one watch per campaign: etcd watches, the file backend waits on
        inotify, MySQL and PostgreSQL ask once per ``poll_interval``) and
        updates this at each change, each one also a ``leader`` event. While
        it leads this is its own :attr:`identity`; once it has let go,
        None until the next report. :meth:`observe` updates it too. It may
        be stale by up to one report: ask :meth:`leader` for the server's
        answer now.
        """
        return self._last_leader

    def _backend_error(self, reason: str) -> None:
        """A transient error the backend retries: an ``error`` event, and while leading a failed renewal."""
        lead = self._leadership
        if lead is not None:
            lead._renew_failed()
        self._emit("error", reason=reason)

    def _saw_leader(self, current: str | None) -> None:
        """Record a leader the backend reported; a change is a ``leader`` event."""
        if current != self._last_leader:
            self._last_leader = current
            self._emit("leader", leader=current)

    # A timeout argument here, not only a scope around the call: asyncio.wait_for() on
    # Python 3.10 and 3.11 would bind the leadership to a task of its own.
    def _move(self, step: _Do) -> bool:
        """Take ``step`` if :data:`ELECTOR_TRANSITIONS` allows it from the current state; whether it moved."""
        target = ELECTOR_TRANSITIONS.next(self._state, step)
        if target is None:
            return False
        self._state = target
        return True

    async def acquire(self, timeout: float | None = None) -> Leadership:  # noqa: ASYNC109
        """Campaign and return once this candidate is the leader.

        The leadership is bound to the task that calls ``acquire()``: it is
        released when that task ends. If a release of this elector's previous
        leadership is still in progress (the acquiring task ended, or
        :meth:`Leadership.release` was called elsewhere), waits for the
        backend to let go first, then campaigns.

        ``timeout`` (seconds) bounds the whole call: the built-in
        :class:`TimeoutError` is raised if this candidate is not leader by
        then, leaving nothing behind. Unlike ``asyncio.wait_for()`` on Python
        3.10 and 3.11 it keeps the leadership bound to the caller, as
        ``asyncio.timeout()`` and ``anyio.fail_after()`` do.

        Raises :class:`~aioelect.UsageError` if this elector is already
        campaigning or leading, :class:`~aioelect.ElectorClosed` if it is
        closed (or is closed while campaigning), and
        :class:`~aioelect.PermanentBackendError` for a permanent backend
        error. Transient server errors are retried with backoff while
        campaigning.
        """
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise ValueError(f"timeout must be a number of seconds, not {timeout!r}")
            timeout = positive("timeout", timeout)
        started = monotonic()
        hold: Hold | None = None
        with anyio.move_on_after(timeout if timeout is not None else math.inf):
            hold = await self._campaign()
            assert hold is not None  # a campaign that waits returns only with a hold
        if hold is None:
            raise TimeoutError(f"not leader of {self.name} within {timeout:g}s")
        return self._lead(hold, started)

    async def try_acquire(self) -> Leadership | None:
        """Become leader only if nobody else leads now: the leadership, or None without waiting.

        One campaign step (a lock request that does not wait on MySQL and
        PostgreSQL, a non-blocking ``flock`` on the file backend, on etcd a
        key that is withdrawn with its lease at once unless it is first).
        None leaves nothing behind: no lock, key, lease or connection held
        for the attempt. The leadership returned is bound to the calling
        task, as :meth:`acquire`'s is.

        Raises :class:`ElectionError` as :meth:`acquire` does, and
        :class:`BackendUnavailable` when the server cannot be reached (never
        retried: the caller decides whether to try again).
        """
        started = monotonic()
        hold = await self._campaign(once=True)
        if hold is None:
            self._log.info("another candidate leads; not waiting")
            return None
        return self._lead(hold, started)

    def _token_problem(self, token: object) -> str | None:
        """Why a leadership granted with ``token`` must not be taken, or None (and ``token`` is recorded)."""
        if token is None:
            return None
        where = f"{self._backend.kind} election {self.name!r}"
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            shown = repr(token) if len(repr(token)) <= 40 else repr(token)[:40] + "..."
            return f"{where} granted a leadership with fencing token {shown}, not a positive integer: refused"
        last = self._highest_token
        if last is not None and token <= last:
            what = (
                f"{where} granted a leadership with fencing token {token}, not above {last}, a token this elector "
                "held before"
            )
            if not self._backend.tokens_may_repeat:
                return f"{what}: refused (a write fenced with it could pass a newer leader's check)"
            self._log.warning("%s; accepted: this backend's tokens are volatile and may repeat", what)
        self._highest_token = token if last is None else max(last, token)
        return None

    def _lead(self, hold: Hold, started: float) -> Leadership:
        lead = Leadership(self, hold, self._log)
        self._leadership = lead
        moved = self._move(_Do.WIN)
        self._campaigner = None
        assert moved, "a campaign returns a hold only while the elector campaigns"
        lead._start(asyncio.current_task())
        # Our own leadership is told by the "acquired" event, not a "leader" event.
        self._last_leader = self._identity
        waited = monotonic() - started
        self._log.info("leadership acquired after %.3fs; token=%s", waited, lead.token)
        self._emit("acquired", token=lead.token, wait=waited)
        health = self._gate.health
        if health is not None:

            async def aside() -> None:
                try:
                    await lead._step_down(None, health.backoff, "unhealthy", None, wait=False)
                except UsageError:  # no handover notes on this backend: the back-off alone keeps it out
                    await lead.release()

            watch = health.watch(lambda: lead.held, aside, self._log)
            self._tasks.start(watch, name=f"aioelect-health-{lead.identity}")
        if self._gate.priority is not None:
            serve = self._gate.lead(hold, lead.identity, lambda: lead.held, lead._answer)
            self._tasks.start(serve, name=f"aioelect-priority-{lead.identity}")
        return lead

    async def _watch_leader(self, stopped: anyio.Event) -> None:
        """Report each change of leader until ``stopped`` (set, and this task cancelled, when the campaign ends).

        Ends by closing what it looked through, so that an idle elector holds
        nothing on the server; a report that arrives after ``stopped`` is dropped.
        """
        changes = self._backend.watch()
        try:
            async for current in changes:
                if stopped.is_set():
                    break
                self._saw_leader(current)
        except Exception as exc:  # the campaign reports the backend's faults; the watch only stops
            self._log.warning("leader watch stopped (%r): last_leader is not updated until the next campaign", exc)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT):
                aclose = getattr(changes, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._backend.close_observer()

    async def _campaign(self, once: bool = False) -> Hold | None:
        over = anyio.Event()
        self._campaigns.add(over)
        try:
            return await self._campaign_step(once)
        finally:
            over.set()
            self._campaigns.discard(over)

    async def _campaign_step(self, once: bool) -> Hold | None:
        # The previous leadership may still be letting go: the lock is ours until it has.
        while (previous := self._leadership) is not None and self._state is _State.LEADING and not previous.held:
            await previous._finished()
            self._ended(previous)  # a no-op once the keeper has let go: never a loop on a finished keeper
        if self._state is _State.CLOSED:
            raise ElectorClosed("acquire() on an elector that is closed")
        if self._state is not _State.IDLE:
            raise UsageError(f"acquire() on an elector that is {self._state.value}")
        if not self._timing_logged:
            self._timing_logged = True
            self._log.info("campaigning; %s", self._backend.describe_timing())
        self._move(_Do.CAMPAIGN)
        me = self._campaigner = object()
        if not once and self._gate.priority is not None:
            try:
                # Before "campaigning": an instance seen campaigning is one a releasing leader of a lower
                # priority hands over to (a rolling deploy may stop the old leader at once).
                await self._gate.announce(self._identity)
            except BaseException:
                self._stop(me)
                raise
        self._emit("campaigning")
        hold: Hold | None = None
        watcher: asyncio.Task[None] | None = None
        stopped = anyio.Event()

        def stop_watcher() -> None:
            if watcher is not None and not stopped.is_set():
                stopped.set()
                watcher.cancel()

        try:
            with anyio.CancelScope() as scope:
                self._campaign_scope = scope
                if once:
                    hold = await self._apart(self._gate.try_campaign(self._identity), me)
                else:
                    watcher = self._tasks.start(
                        self._watch_leader(stopped), name=f"aioelect-leader-watch-{self._identity}"
                    )
                    # The watch stops as the campaign wins, in the campaign's task: its clean-up overlaps
                    # the wake-up of this one.
                    hold = await self._apart(self._gate.campaign(self._identity), me, then=stop_watcher)
            if scope.cancelled_caught:
                raise ElectorClosed("elector closed while campaigning")
        except BaseException:
            self._stop(me)
            raise
        finally:
            self._campaign_scope = None
            if watcher is not None:
                stop_watcher()
                try:
                    # Usually done at once; one still opening a connection finishes (and closes it) on its own,
                    # still owned by this elector: aclose() waits for it.
                    if not watcher.done():
                        with anyio.move_on_after(WATCH_STOP_WAIT, shield=True):
                            await asyncio.wait([watcher])
                except BaseException:
                    # A cancel from outside anyio's scopes (task.cancel()) reaches even a shielded wait: the
                    # campaign is given up, and a lock it won is given back rather than held by nobody.
                    await self._abandon(hold, me)
                    raise
        if hold is None:
            self._stop(me)
            return None
        if is_closed(self):  # closed as the campaign won: give it back
            with anyio.CancelScope(shield=True):
                await hold.release()
            raise ElectorClosed("elector closed while campaigning")
        problem = self._token_problem(hold.token)
        if problem is not None:
            self._stop(me)
            self._log.error("%s", problem)
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT):
                await hold.release()
            raise PermanentBackendError(problem)
        return hold

    async def _apart(
        self, step: Coroutine[Any, Any, Hold | None], me: object, then: Callable[[], None] | None = None
    ) -> Hold | None:
        """Run one campaign step in a task of this elector's and wait for it; a cancellation always ends the call.

        Drivers wait on the server inside ``asyncio.wait_for()``, which before Python 3.12 returns the reply
        instead of raising when a cancellation arrives with it: a campaign run in the caller's task could win
        for a task that was cancelled. Here the caller's task waits only for the step's, so its cancellation
        always reaches it. The step is then cancelled through a cancel scope of its own (anyio delivers that
        at every wait until the step has ended, and leaves its shielded clean-ups alone), waited for, and a
        hold it won meanwhile is released. ``then()`` is called in the step's task as soon as the step returns.
        """
        scope = anyio.CancelScope()

        async def run() -> Hold | None:
            with scope:
                found = await step
                if then is not None:
                    then()
                return found
            return None  # cancelled

        task = self._tasks.start(run(), name=f"aioelect-campaign-{self._identity}", on_done=consume)
        try:
            return await asyncio.shield(task)
        except BaseException:
            scope.cancel()
            while not task.done():
                # A second task.cancel() reaches even a shielded wait: the hold must still be given back.
                with contextlib.suppress(asyncio.CancelledError), anyio.CancelScope(shield=True):
                    await asyncio.wait([task])
            if not task.cancelled() and task.exception() is None:
                await self._abandon(task.result(), me)
            raise

    def _stop(self, me: object) -> None:
        """End campaign ``me``'s CAMPAIGNING, unless it has already (then another campaign may be in it)."""
        if self._campaigner is me:
            self._campaigner = None
            self._move(_Do.STOP)

    async def _abandon(self, hold: Hold | None, me: object) -> None:
        """End a campaign that will not return: the elector campaigns no more, and ``hold`` is released."""
        self._stop(me)
        if hold is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT):
                await asyncio.shield(hold.release())

    def _ended(self, lead: Leadership) -> None:
        if self._leadership is lead:
            self._leadership = None
            if self._last_leader == self._identity:
                self._last_leader = None  # let go: who leads next is known at the next report
            self._move(_Do.END)

    async def leader(self) -> str | None:
        """The current leader's identity as the backend sees it, or None.

        Works from any candidate, leader or follower. Raises
        :class:`BackendUnavailable` when the server cannot be reached.
        """
        return await self._backend.leader()

    async def observe(self) -> AsyncIterator[str | None]:
        """Yield the leader's identity now and at every change (None: no leader).

        Works from any candidate, leader or not; outages of the server delay
        reports but do not end the iteration. Each change is also an event
        (one per change: a leader the campaign's own watch already reported
        is not reported twice), and updates :attr:`last_leader`.
        """
        changes = self._backend.observe()
        try:
            async for current in changes:
                self._saw_leader(current)
                yield current
        finally:
            # Closed explicitly so that a consumer breaking out ends the watch at once.
            aclose = getattr(changes, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

    # --- events ------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every :class:`Event` of this elector; return a remover.

        Listeners run synchronously in the event loop and must not block; an
        exception in one is logged and does not affect the election.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def events(self, max_buffer: int = 1000) -> AsyncIterator[Event]:
        """Iterate over this elector's events as they happen.

        Events that arrive while more than ``max_buffer`` are waiting are
        dropped (and counted in a WARNING log) rather than slowing the election.
        """
        send, receive = anyio.create_memory_object_stream[Event](max_buffer)
        dropped = 0

        def forward(event: Event) -> None:
            nonlocal dropped
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                dropped += 1
                if dropped == 1 or dropped % 1000 == 0:
                    self._log.warning("events(): consumer too slow, %d events dropped", dropped)

        remove = self.add_listener(forward)
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            remove()
            send.close()

    def _emit(self, kind: EventKind, **fields: Any) -> None:
        if not self._listeners:
            return
        event = Event(kind, self.backend, self.name, self._identity, **fields)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                self._log.exception("event listener %r failed", listener)

    async def run(self, work: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await work(*args, **kwargs)`` only while leader, and return its result.

        Campaigns first; if leadership is lost, ``work`` is cancelled, the loss
        is logged, and the elector campaigns again and starts ``work`` afresh.
        When ``work`` returns, leadership is released and its result returned.
        Inside ``work`` (and the tasks it starts), :func:`current_leadership`
        returns the leadership it runs under.
        """
        while True:
            try:
                async with leading(self):
                    return await work(*args, **kwargs)
            except LeadershipLost as exc:
                self._log.warning("work cancelled (%s); campaigning again", exc.reason)

    async def aclose(self) -> None:
        """Release any leadership, stop any campaign, and free every resource. Idempotent."""
        if not self._move(_Do.CLOSE):
            return
        if self._campaign_scope is not None:
            self._campaign_scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT):
            for over in list(self._campaigns):
                await over.wait()
        if self._leadership is not None:
            await self._leadership.release()
        await self._tasks.aclose()
        with anyio.CancelScope(shield=True):
            await self._backend.close_state()
            await self._backend.aclose()

    async def __aenter__(self: _E) -> _E:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def leading(elector: Elector) -> AsyncIterator[Leadership]:
    """Campaign on ``elector``, run the body as leader work, and release when it ends.

    The body is cancelled on loss, and :class:`LeadershipLost` is raised from
    the ``async with``; the leadership is released however the body ends.
    The scope that :meth:`Elector.run` and :func:`aioelect.leadership` share.
    """
    lead = await elector.acquire()
    async with _scope(lead):
        yield lead


@contextlib.asynccontextmanager
async def leading_if_free(elector: Elector) -> AsyncIterator[Leadership | None]:
    """As :func:`leading`, with :meth:`Elector.try_acquire`: the body gets None, at once, if another leads."""
    lead = await elector.try_acquire()
    if lead is None:
        yield None
        return
    async with _scope(lead):
        yield lead


@contextlib.asynccontextmanager
async def _scope(lead: Leadership) -> AsyncIterator[Leadership]:
    """Run the body as ``lead``'s leader work (see :func:`leading`), then release."""
    current = _CURRENT.set(lead)
    try:
        with lead.guard():
            yield lead
        if lead.lost:
            raise LeadershipLost(lead.lost_reason or "lost", lead.lost_kind)
    finally:
        with contextlib.suppress(ValueError):  # a generator finalized in another context: nothing to undo here
            _CURRENT.reset(current)
        await lead.release()


# --- the seam for the modules above the core ------------------------------------------------------------
# The wiring (Shards, FencedStore, fenced()) and the command line reach below an elector only through these, never
# through its private attributes; users never need them.


def backend_of(elector: Elector) -> Backend:
    """The backend ``elector`` drives."""
    return elector._backend


def is_closed(elector: Elector) -> bool:
    """Whether ``elector`` has been closed (it campaigns no more)."""
    return elector._state is _State.CLOSED


def elector_of(lead: Leadership) -> Elector:
    """The elector that took ``lead``."""
    return lead._elector


def hold_of(lead: Leadership) -> Hold:
    """What ``lead``'s backend holds for it (its token, its lock, its key)."""
    return lead._hold


def lock_descriptors(lead: Leadership) -> tuple[int, ...]:
    """The descriptors whose last close ends ``lead`` (:meth:`Hold.descriptors`); empty once it has ended: a
    process that inherits them keeps the lock until it too has closed them."""
    return lead._hold.descriptors() if lead._state in (_Lead.HELD, _Lead.RELEASING) else ()
