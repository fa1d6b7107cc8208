"""The small internal protocol each backend implements.

A backend knows only its server: how to campaign until it holds leadership,
how to watch a held leadership for loss, how to release it, who leads now.
It knows nothing about the caller's tasks, work scopes or self-fencing: those
are written once in :mod:`aioelect.core._elector` and hold for every backend.

The arrows between the two run one way: the elector calls the backend, and
the backend answers only through what it is handed (the :class:`Reporter`
for logs and retried errors, the ``confirm`` callback of :meth:`Hold.monitor`).
Nothing here or in a backend imports the elector.
"""

from __future__ import annotations

import abc
import enum
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar, runtime_checkable

import anyio

from ._errors import BackendUnavailable, ElectionError, ElectorClosed, LossKind, UsageError
from ._log import ElectionLog

__all__ = [
    "Backend",
    "Backoff",
    "Confirm",
    "Hold",
    "ErrorTable",
    "Interceptor",
    "Loss",
    "Reporter",
    "SharedSession",
    "StateStore",
    "Written",
    "monotonic",
    "until_recorded",
]

#: Called by a backend with the monotonic time at which a confirmation that
#: succeeded was *sent*: the server cannot have handed leadership on before it.
Confirm = Callable[[float], None]


class Interceptor(Protocol):
    """What may sit at the one place where a backend talks to its server (default: nothing, at no cost).

    A backend with an interceptor hands it each exchange with the server
    instead of running it: an etcd request or watch message, a statement on a
    SQL session, a Redis command, script or wait for a published message.
    ``send()`` runs the exchange; the interceptor awaits it (or not) and
    returns its reply, or raises. Whatever it returns or raises
    is what the backend sees from the server, so it must behave as a server
    or network could: delay the request or the reply, fail, or answer as the
    server may (etcd cancelling a watch). Used by the message-level adversary
    (``soak/adversary``); nothing in the library sets one.
    """

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``send()`` (or fail as the server or network could) and return its reply; ``what`` names it."""


@runtime_checkable
class ErrorTable(Protocol):
    """How a server backend sorts the errors it catches: the one shape every server backend gives.

    Each backend supplies its own table (its driver's error codes, its
    server's replies); the decision it feeds is the same everywhere: a
    permanent error is raised at once and never retried, anything else is
    retried by a campaign and raised as
    :class:`~aioelect.BackendUnavailable` by a single attempt.
    """

    def permanent(self, exc: BaseException) -> bool:
        """Whether no retry can fix ``exc``: a refusal (credentials, a privilege, a certificate, a setting), or an
        :class:`~aioelect.ElectionError` the backend raised with its own words."""

    def failure(self, exc: Exception, what: str) -> ElectionError:
        """What to raise for ``exc``, caught while doing ``what`` ("the campaign") and not retried:
        :class:`~aioelect.PermanentBackendError` when permanent (or the backend's own error as it is), else
        :class:`~aioelect.BackendUnavailable`."""


class Loss(NamedTuple):
    """Why a held leadership ended, as :meth:`Hold.monitor` says it: a kind for programs, a reason for people."""

    kind: LossKind
    reason: str


class Hold(abc.ABC):
    """One leadership held on one backend."""

    #: Fencing token of this leadership, or None when the backend has none.
    token: int | None = None
    #: Monotonic time from which the leadership is dated (the send time of a
    #: request that proved it held: docs/concepts.md, "When a leadership is
    #: dated from"); the renew deadline starts here.
    acquired_at: float = 0.0

    @abc.abstractmethod
    async def monitor(self, confirm: Confirm) -> Loss | str:
        """Run until leadership is lost and return why: a :class:`Loss`, or a plain reason for a lost connection.

        Calls ``confirm`` after every successful confirmation. Never returns
        while leadership is held; is cancelled when it ends for other reasons.
        """

    @abc.abstractmethod
    async def release(self) -> None:
        """Give leadership up. Idempotent; a connection already gone is not an error."""

    def descriptors(self) -> tuple[int, ...]:
        """File descriptors whose last close ends this leadership (a lock file, a session's socket).

        A process that holds a duplicate of each keeps the leadership from
        passing on after this one dies, until it closes them too (a release
        still ends it at once). Empty where no descriptor does (a lease).
        """
        return ()


class Reporter:
    """Where a backend reports: the elector's log, and each retried error as an ``error`` event.

    The elector above hands one to its backend through :meth:`Backend.attach`;
    the backend only calls it, and never learns who listens.
    """

    def __init__(
        self,
        log: ElectionLog,
        on_error: Callable[[str], None] | None = None,
        on_leader: Callable[[str | None], None] | None = None,
    ) -> None:
        self.log = log
        self._on_error = on_error
        self._on_leader = on_leader

    def error(self, what: str) -> None:
        """Report a transient error that is being retried."""
        if self._on_error is not None:
            self._on_error(what)

    def leader(self, identity: str | None) -> None:
        """Report the leader a campaign learnt on its way (no request of its own: read with the campaign's)."""
        if self._on_leader is not None:
            self._on_leader(identity)


class Backend(abc.ABC):
    """What a backend must be able to do.

    A backend's constructor validates its options (ValueError for bad ones)
    and records in :attr:`warnings` what they give up; it reports through the
    :class:`Reporter` it is attached to, and writes nowhere else.
    """

    #: Short name used in logs, metrics and reprs ("mysql", "etcd", ...).
    kind: ClassVar[str]
    #: How often the default :meth:`observe` polls :meth:`leader`.
    observe_interval: float = 1.0
    #: Whether a leadership may get a token not above one handed out before (an opt-in that says so); else the
    #: elector refuses such a leadership as a permanent error.
    tokens_may_repeat: bool = False
    #: The fenced state, once :meth:`state_store` has made it.
    _state_store: StateStore | None = None

    def __init__(self, name: str) -> None:
        self.name = name
        #: What the options give up (unencrypted transport, shared access...): logged once at WARNING by the
        #: elector that uses this backend.
        self.warnings: list[str] = []
        self._reporter = Reporter(ElectionLog(self.kind, name, "-"))

    def attach(self, reporter: Reporter) -> None:
        """Report through ``reporter`` from now on (the elector calls this once, before campaigning)."""
        self._reporter = reporter

    @property
    def log(self) -> ElectionLog:
        """The log of the elector this backend is attached to."""
        return self._reporter.log

    def report_error(self, what: str, delay: float) -> None:
        """Log a transient error that will be retried after ``delay`` seconds, and report it."""
        self.log.warning("%s; retrying in %.2fs", what, delay)
        self._reporter.error(what)

    def report_retried(self, what: str) -> None:
        """Report (without logging: whoever retries logged it) a transient error that is being retried, such as
        a failed renewal of a held leadership: its next confirmation then logs that renewal recovered."""
        self._reporter.error(what)

    @property
    def renew_deadline(self) -> float | None:
        """Seconds a leader may go without a successful confirmation.

        Must end before the server can hand leadership to someone else; None
        for a backend whose leadership cannot be taken away (local).
        """
        return None

    @property
    def margin(self) -> float | None:
        """Seconds between a cut-off leader fencing itself and the earliest moment its leadership can pass on.

        The server-side bound (a lease, a session timeout) less
        :attr:`renew_deadline`; None for a backend whose leadership cannot be
        taken away while the process lives.
        """
        return None

    def describe_timing(self) -> str:
        """The derived tolerances, logged once when campaigning starts."""
        return "no timing"

    @abc.abstractmethod
    async def campaign(self, identity: str) -> Hold:
        """Return once ``identity`` holds leadership.

        Transient server errors are retried (logged, with backoff); permanent
        ones raise :class:`~aioelect.ElectionError`. Cancellation leaves
        nothing behind: no lock, no key, no connection.
        """

    async def try_campaign(self, identity: str) -> Hold | None:
        """One campaign step that never waits for another leader: the hold, or None if someone else leads.

        Leaves nothing behind when it returns None (no lock, key, lease or
        connection). A transient server error raises
        :class:`~aioelect.BackendUnavailable` (never retried here), a
        permanent one :class:`~aioelect.ElectionError`.
        """
        raise NotImplementedError(f"the {self.kind} backend cannot try once without waiting")

    @abc.abstractmethod
    async def leader(self) -> str | None:
        """The current leader's identity as the server sees it, or None."""

    async def observe(self) -> AsyncIterator[str | None]:
        """Yield the leader's identity now and at each change (None: no leader).

        The default polls :meth:`leader` every :attr:`observe_interval`;
        backends that can watch override it.
        """
        last: object = object()
        backoff = Backoff(first=self.observe_interval, maximum=max(5.0, self.observe_interval))
        while True:
            try:
                current = await self.leader()
            except BackendUnavailable as exc:
                # An observer outlives outages: report nothing rather than a guess.
                delay = backoff.next_delay()
                self.log.warning("observe: %s; retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                continue
            backoff.reset()
            if current != last:
                last = current
                yield current
            await anyio.sleep(self.observe_interval)

    def watch(self) -> AsyncIterator[str | None]:
        """The leader's identity now and at each change, as a campaign watches it.

        :meth:`observe`, unless a backend has a cheaper way for a watch that
        runs beside every campaign.
        """
        return self.observe()

    async def close_observer(self) -> None:  # noqa: B027 - most backends keep nothing open to look
        """Close what looking at the leader keeps open (a connection, a descriptor); the next look reopens it.

        Called when a campaign's watch of the leader ends, so that an idle
        elector holds nothing on the server.
        """

    def intercept(self, interceptor: Interceptor | None) -> None:
        """Hand every exchange with the server to ``interceptor`` from now on (None: run them directly).

        The one attach point of the message-level adversary; nothing in the
        library calls it. A backend with no server raises
        :class:`~aioelect.UsageError`.
        """
        raise UsageError(f"{type(self).__name__} talks to no server: there is no exchange to intercept")

    def state_store(self) -> StateStore:
        """This election's fenced state on the backend's server (see :class:`StateStore`), made on first use.

        Closed by :meth:`close_state`. A backend without fenced state raises
        :class:`~aioelect.UsageError` saying so.
        """
        store = self._state_store
        if store is None:
            store = self._state_store = self._new_state_store()
        return store

    def _new_state_store(self) -> StateStore:
        raise UsageError(f"the {self.kind} backend keeps no fenced state: use etcd, MySQL, PostgreSQL, Redis or a file")

    async def close_state(self) -> None:
        """Close the fenced state's connection, if one was opened (the elector calls this as it closes)."""
        store = self._state_store
        if store is not None:
            self._state_store = None
            with anyio.CancelScope(shield=True):
                await store.aclose()

    async def aclose(self) -> None:  # noqa: B027 - most backends hold nothing between campaigns
        """Free every resource the backend holds outside a campaign or hold."""


class Written(enum.Enum):
    """What a fenced write did (:meth:`StateStore.write`)."""

    #: Written, and committed on the server.
    DONE = "done"
    #: Nothing written: the election has issued a token newer than the writer's.
    FENCED = "fenced"
    #: Nothing written: the value stored was not the one expected.
    CONFLICT = "conflict"


class StateStore(abc.ABC):
    """Small values kept beside one election on its server, written only under the newest token.

    Keys and values arrive checked and encoded (:mod:`aioelect.core._values`):
    a key is a short string, a value a few bytes of JSON. A backend makes
    each write one atomic step on its server: the check that the writer's
    token is still the newest the election has issued, the comparison with
    the expected value, and the write, or nothing at all.
    """

    @abc.abstractmethod
    async def read(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None."""

    @abc.abstractmethod
    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        """Store ``value`` under ``key`` if ``hold``'s token is the newest the election issued, and (``compare``)
        the value stored is ``expected`` (None: no value); else write nothing and say why."""

    async def post(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` with no token check, for any process to ask the leader something (a
        step-down request). Never for state a leader relies on: anyone who can reach the server may write it."""
        raise UsageError(f"{type(self).__name__} takes no requests")

    async def read_posted(self, key: str) -> bytes | None:
        """The value :meth:`post` stored under ``key``, or None."""
        return await self.read(key)

    async def aclose(self) -> None:  # noqa: B027 - a store that keeps nothing open
        """Close what the store keeps open."""


def monotonic() -> float:
    """The clock every deadline in aioelect is measured on."""
    return time.monotonic()


#: The electors of a session shared by many (a lease, a connection), by name: what each is, and how to close it.
Members = dict[str, tuple[object, Callable[[], Coroutine[Any, Any, None]]]]


#: The kinds of shared session (their ``who``) whose fate sharing this process has logged.
_FATE_SHARING_SAID: set[str] = set()


class SharedSession(abc.ABC):
    """The lifetime of a session shared by the electors of one process (etcd's lease, a SQL connection).

    * it keeps the electors on it by election name, with how to close each;
    * it is entered once, and logs at WARNING then what its electors share
      (fate sharing); its electors campaign only while it is entered and
      open (:meth:`_check_open`);
    * leaving the ``async with`` (or :meth:`aclose`) closes every elector
      still on it, side by side, then what the session holds itself
      (:meth:`_close_own`): idempotent, never interrupted by cancellation.
    """

    #: The public class name, in messages.
    who: ClassVar[str]
    log: ElectionLog

    def __init__(self) -> None:
        #: The electors on the session, by election name: (their backend, how to close their elector).
        self._members: Members = {}
        self._entered = False
        self._closed = False

    def __len__(self) -> int:
        """The number of electors on the session."""
        return len(self._members)

    @property
    def closed(self) -> bool:
        return self._closed

    def leave(self, name: str, backend: object) -> None:
        """Forget ``backend``'s elector (its own ``aclose()``); the session stays for the others."""
        member = self._members.get(name)
        if member is not None and member[0] is backend:
            del self._members[name]

    def _check_open(self) -> None:
        """ElectorClosed once the session is closed, UsageError before it is entered."""
        if self._closed:
            raise ElectorClosed(f"the {self.who} is closed")
        if not self._entered:
            raise UsageError(f"enter the {self.who} (async with) before its electors campaign")

    def _enter(self, share: str, lost: str) -> None:
        """Mark the session entered (UsageError the second time); log that its electors ``share`` one thing and
        all lose their leadership when it is ``lost``."""
        if self._entered:
            raise UsageError(f"the {self.who} is entered once")
        self._entered = True
        if self.who in _FATE_SHARING_SAID:
            return
        # The documented design of a shared session, not a hazard: said once per process, not per session.
        _FATE_SHARING_SAID.add(self.who)
        self.log.info(
            "electors on a shared %s (fate sharing): when %s, every elector on it loses its leadership at the "
            "same moment. Give elections that must fail independently electors of their own.",
            share,
            lost,
        )

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every elector still on the session, then what the session holds. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            closing = list(self._members.values())
            if closing:
                self.log.info("closing the %d electors still on the shared session", len(closing))
                async with anyio.create_task_group() as tg:
                    for _, close in closing:
                        tg.start_soon(close)
            self._members.clear()
            await self._close_own()

    @abc.abstractmethod
    async def _close_own(self) -> None:
        """Close what the session holds itself, once its electors are closed (called shielded)."""


_R = TypeVar("_R")

#: How long leader() waits for a new holder's record of its identity.
RECORD_WAIT = 0.5


async def until_recorded(look: Callable[[], Awaitable[_R]], recorded: Callable[[_R], bool]) -> _R:
    """``look()`` again until ``recorded`` accepts what it saw, for at most :data:`RECORD_WAIT`.

    A new leader records its identity just after it takes the lock: a look in
    between must not report the holder without it (an observer would show a
    leader change that never happened). What is still unrecorded after the
    wait is returned as it is.
    """
    deadline = monotonic() + RECORD_WAIT
    while True:
        seen = await look()
        if recorded(seen) or monotonic() >= deadline:
            return seen
        await anyio.sleep(0.01)


class Backoff:
    """Exponential backoff with jitter for retrying transient server errors."""

    def __init__(self, first: float = 0.1, maximum: float = 5.0) -> None:
        self.first = first
        self.maximum = maximum
        self.attempt = 0

    def reset(self) -> None:
        self.attempt = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.first * (2**self.attempt))
        self.attempt += 1
        return float(delay * random.uniform(0.5, 1.0))

    async def sleep(self) -> float:
        """Sleep for the next delay and return it."""
        delay = self.next_delay()
        await anyio.sleep(delay)
        return delay
