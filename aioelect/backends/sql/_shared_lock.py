"""One server session holding every leadership of a process: the shared form of the session-lock engine.

A :class:`SharedLockSession` owns one lock connection (MySQL ``GET_LOCK``s,
PostgreSQL advisory locks: a session holds any number of them) and the
electors on it campaign, hold and release through it. It guarantees:

* one connection on the server for every elector of the session, opened as
  a lock session is (every server-side bound on it checked against
  ``lease``, TLS as configured), and never reconnected silently: a new
  connection holds none of the old one's locks, so every hold on the old one
  is lost;
* every statement on the connection runs alone (a lock around it) and is
  bounded by the dialect's timeouts; a statement that is cut off or fails
  below SQL closes the connection, and a lock request whose answer was not
  read is ended on the server only once the server shows that session to be
  ours (as for a lock session of its own);
* a campaign never waits on the server: it asks with a request that does
  not wait, at first, when a release is announced (a notice the dialect
  receives, such as PostgreSQL's ``NOTIFY``) and when the lock shows free;
  in between, one *waiting round* per ``poll_interval`` reads the holder of
  every lock the session's campaigns wait for, in one statement, and each
  campaign reports its holder (its identity looked up only when it
  changes);
* one check round per ``check_interval`` confirms every lock held on the
  connection at once, and waits for at most one campaign's request (they
  queue apart); each hold is confirmed from the time that round was
  *sent*, and a round that fails, times out or finds the connection gone
  ends every leadership on it (**fate sharing**: one lost session loses
  every leadership on it, logged at WARNING when the session is entered);
* a grant is dated from a check sent after it, with its fencing token taken
  as for a lock session of its own; a statement is never interrupted by a
  cancellation (it is shielded and bounded), and a grant that a cancelled
  campaign will not use is released before the cancellation goes on;
* a release that the server does not answer (an error, a timeout) closes
  the connection, which drops the lock, and with it every other lock on it;
* whatever ends the connection (a statement that failed or was cut off, a
  campaign's request, a release, a check round), every hold on it is
  reported lost at once, not at its next check round: the server frees
  every lock on a closed connection at once, so a candidate elsewhere may
  take them at once.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from ...core._backend import Confirm, Hold, Loss, SharedSession, monotonic
from ...core._config import check_options, default_identity, validate_identity
from ...core._errors import LossKind
from ...core._log import ElectionLog
from ._session_lock import _UNSEEN, Campaign, LockConnection, LockSessions, SessionLockBackend

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SharedHold", "SharedLockSession"]

_C = TypeVar("_C", bound=LockConnection)
_T = TypeVar("_T")

#: The name the session's own log lines carry (its electors log under their election's name).
_LOG_NAME = "<shared session>"


@dataclass(frozen=True)
class _Holders:
    """One look at the holders of every lock the session's campaigns wait for."""

    #: When its statement was sent.
    sent: float
    #: Each waiting name's holder (None: free); a name that was not waiting then is missing.
    holders: dict[str, Hashable]


@dataclass(frozen=True)
class _Round:
    """One check of every lock held on the session's connection."""

    #: When its statement was sent.
    sent: float
    #: The connection it checked (None: there was none).
    conn: LockConnection | None
    #: The names the server showed held by that session.
    held: frozenset[str] = field(default_factory=frozenset)
    #: Why no lock on ``conn`` can be confirmed (None: the round was answered).
    failure: str | None = None


class _SharedCampaign(Campaign, Generic[_C]):
    """A campaign on a shared session: it asks when the lock may be free, and in between waits with the others.

    A lock request (that does not wait) is sent at first, on a release
    notice, and when a waiting round shows the lock free; otherwise the
    waiter reads its holder from the session's waiting round, one statement
    for every waiting elector of the session per ``poll_interval``.
    """

    def __init__(self, session: SharedLockSession[_C], backend: SessionLockBackend[_C], identity: str) -> None:
        self._session = session
        self._b = backend
        self._identity = identity
        self._seen: Any = _UNSEEN
        #: Whether the next ask sends a request (else the lock is known busy).
        self._ask = True
        self._last = monotonic()
        self._notice = anyio.Event()

    async def ask(self) -> Hold | None:
        session, b = self._session, self._b
        self._notice = session.notice_for(b.name)
        if not self._ask:
            return None
        hold, self._seen = await session.attempt(b, self._identity, self._seen)
        if hold is not None:
            return hold
        self._last = monotonic()
        session.wait(b)
        return None

    async def wait_between(self) -> None:
        session, b = self._session, self._b
        with anyio.move_on_after(max(0.0, self._last + b.poll_interval - monotonic())):
            await self._notice.wait()
        if self._notice.is_set():  # a release announced: ask at once
            self._ask = True
            return
        done = await session.holders(after=self._last + b.poll_interval / 2)
        self._last = max(done.sent, self._last)
        holder = done.holders.get(b.name, None)
        self._ask = holder is None  # free, or not in that round: ask
        if not self._ask and holder != self._seen:
            self._seen = await session.identify(b, holder)

    def interrupted(self) -> bool:
        self._ask = True
        return False

    async def discard(self) -> None:
        """Nothing to end: the session's connection is the session's (a failure that closed it lost it there)."""

    async def end(self) -> None:
        self._session.unwait(self._b)


class SharedHold(Hold, Generic[_C]):
    """A lock granted on a shared session: confirmed by the session's check rounds, released on its connection."""

    def __init__(
        self, session: SharedLockSession[_C], backend: SessionLockBackend[_C], conn: _C, token: int | None, at: float
    ) -> None:
        self._session = session
        self._backend = backend
        self.conn = conn
        self.token = token
        self.acquired_at = at
        self.released = False
        #: Set (with :attr:`ended_why`) when the session loses this hold's connection: its monitor reports at once.
        self.ended = anyio.Event()
        self.ended_why = ""

    @property
    def name(self) -> str:
        return self._backend.name

    @property
    def session_id(self) -> int:
        """The server's id of the shared session that holds the lock."""
        return int(self.conn.session_id)

    async def monitor(self, confirm: Confirm) -> Loss:
        b = self._backend
        interval = b.check_interval
        last = self.acquired_at
        while True:
            # The server frees every lock on a closed connection at once: its loss must not wait for the next round.
            with anyio.move_on_after(max(0.0, last + interval - monotonic())):
                await self.ended.wait()
            if self.ended.is_set():
                return Loss(LossKind.CONNECTION_LOST, self.ended_why)
            # A round sent since half an interval after the last is recent enough: rounds are shared by every hold.
            done = await self._confirmation(after=last + interval / 2)
            if done is None:
                return Loss(LossKind.CONNECTION_LOST, self.ended_why or b.lost_session)
            if done.conn is not self.conn:
                return Loss(LossKind.CONNECTION_LOST, b.lost_session)
            if done.failure is not None:
                return Loss(LossKind.CONNECTION_LOST, done.failure)
            if self.name not in done.held:
                return Loss(LossKind.DEPOSED, b.lost_lock)
            confirm(done.sent)
            last = done.sent

    async def _confirmation(self, after: float) -> _Round | None:
        """The session's check round sent at ``after`` or later; None as soon as this hold's connection ended."""
        done: _Round | None = None
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def check() -> None:
                nonlocal done, failed
                try:
                    done = await self._session.confirmation(after)
                except Exception as exc:  # raised as itself below, not wrapped in a group
                    failed = exc
                tg.cancel_scope.cancel()

            tg.start_soon(check)
            await self.ended.wait()
            tg.cancel_scope.cancel()
        if self.ended.is_set():
            return None
        if failed is not None:
            raise failed
        return done

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        await self._session.release(self)


class SharedLockSession(SharedSession, LockSessions[_C]):
    """One lock connection shared by the electors of a process (see the module's guarantees).

    It is the :class:`LockSessions` of every backend made on it
    (:meth:`backend`). A dialect subclass names its options and backend
    (:attr:`options_spec`, :attr:`backend_class`) and says how to check many
    locks, and read many holders, in one statement (:meth:`_held_many`,
    :meth:`_holders_many`); it may listen for release notices (:meth:`_listen`)
    and announce releases (:meth:`_announce_release`).
    """

    #: The public class name, in errors.
    who = "SharedLockSession"
    #: The TypedDict of the session's options (the dialect's options but ``name``).
    options_spec: Any
    #: The dialect's backend, built as ``cls(dsn, name=..., **options)``: the session's own (through which it
    #: connects) with sessions of its own, an elector's then given this session as its sessions.
    backend_class: Any

    def __init__(self, dsn: str | None, identity: str | None, options: Mapping[str, Any]) -> None:
        super().__init__()
        check_options(self.who, options, self.options_spec)
        self._dsn = dsn
        self._options = dict(options)
        #: The backend the session connects through (its timing, TLS and server checks are the session's).
        self.template: SessionLockBackend[_C] = self.backend_class(dsn, name="aioelect-shared-session", **options)
        self.identity = validate_identity(identity) if identity is not None else default_identity()
        self.log = ElectionLog(self.template.kind, _LOG_NAME, self.identity)
        self._conn: _C | None = None
        self._statements = anyio.Lock()
        # Campaigns' own requests queue here, one at a time on the connection: a check round then waits for one
        # request at most, never for the whole queue of a cold start.
        self._asking = anyio.Lock()
        self._rounds = anyio.Lock()
        self._last: _Round | None = None
        self._holds: dict[str, SharedHold[_C]] = {}
        self._notices: dict[str, anyio.Event] = {}
        #: The campaigns waiting for a lock, by name: their holders are read together, once per round.
        self._waits: dict[str, SessionLockBackend[_C]] = {}
        self._wait_rounds = anyio.Lock()
        self._last_wait: _Holders | None = None
        self.prepared = set()

    def __repr__(self) -> str:
        host, port = self.template._address
        conn = self._conn
        session = "none" if conn is None or conn.broken else str(conn.session_id)
        state = "closed" if self._closed else "open"
        return (
            f"<{type(self).__name__} {host}:{port} session={session} electors={len(self._members)} "
            f"held={len(self._holds)} {state}>"
        )

    @property
    def held(self) -> int:
        """The number of leaderships held on the session now."""
        return len(self._holds)

    # --- the dialect ------------------------------------------------------------------

    @abc.abstractmethod
    async def _held_many(self, conn: _C, backends: list[SessionLockBackend[_C]]) -> frozenset[str]:
        """The names of ``backends`` whose locks ``conn``'s session holds, in as few statements as the server allows."""

    @abc.abstractmethod
    async def _holders_many(self, conn: _C, backends: list[SessionLockBackend[_C]]) -> dict[str, Hashable]:
        """The holder of each of ``backends``' locks (as its ``_holder`` shows it; None: free), in as few
        statements as the server allows."""

    async def _listen(self, conn: _C) -> None:
        """Subscribe ``conn`` to release notices (call :meth:`released` with each name)."""

    async def _announce_release(self, conn: _C, name: str) -> None:
        """After a confirmed release of ``name`` on ``conn``: tell waiters elsewhere, where the dialect can."""

    def _on_end(self, conn: _C, ended: Callable[[], None]) -> None:
        """Call ``ended`` as soon as the driver sees ``conn`` end between statements (the server ended the
        session), where the dialect can; otherwise such an end is seen by the next statement or check round."""

    # --- electors ---------------------------------------------------------------------

    def backend(
        self, name: str, close: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> SessionLockBackend[_C]:
        """A backend for election ``name`` on this session (ValueError: the name is taken, or the session closed)."""
        if self._closed:
            raise ValueError(f"this {self.who} is closed: make electors on an open one")
        if name in self._members:
            raise ValueError(
                f"an elector on this {self.who} already campaigns on {name!r}: a session holds one lock per name; "
                "close it first, or use another session"
            )
        backend: SessionLockBackend[_C] = self.backend_class(self._dsn, name=name, **self._options)  # ValueError
        backend.sessions = self  # set here only: options never reach it, so no elector joins a session unchecked
        self._members[name] = (backend, close or backend.aclose)
        return backend

    def join(self, name: str, backend: object, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Record how to close the elector of ``backend`` (made by :meth:`backend`) when the session closes."""
        member = self._members.get(name)
        if member is not None and member[0] is backend:
            self._members[name] = (backend, close)

    def leave(self, name: str, backend: object) -> None:
        """Forget ``backend``'s elector (its own ``aclose()``); the connection stays for the others."""
        super().leave(name, backend)
        self._notices.pop(name, None)

    def wait(self, backend: SessionLockBackend[_C]) -> None:
        """``backend``'s campaign waits: its holder is read in the next waiting rounds."""
        self._waits[backend.name] = backend

    def unwait(self, backend: SessionLockBackend[_C]) -> None:
        if self._waits.get(backend.name) is backend:
            del self._waits[backend.name]

    # --- the sessions of its backends -------------------------------------------------

    def campaign(self, backend: SessionLockBackend[_C], identity: str) -> Campaign:
        return _SharedCampaign(self, backend, identity)

    async def look(self, backend: SessionLockBackend[_C], look: Callable[[_C], Awaitable[_T]]) -> _T:
        """``look(conn)`` on the session's connection: a shared session opens no connection to look."""
        try:
            return await self.run(look)
        except Exception as exc:
            raise backend.failure(exc, "the query") from None

    async def close_observer(self, backend: SessionLockBackend[_C]) -> None:
        """Nothing of ``backend``'s own to close: the session's connection is the session's."""

    async def forget(self, backend: SessionLockBackend[_C]) -> None:
        """``backend``'s elector is closed: it leaves the session, whose connection stays for the others."""
        self.leave(backend.name, backend)

    async def holders(self, after: float) -> _Holders:
        """A waiting round sent at ``after`` or later: the last one if recent enough, else a new one."""
        async with self._wait_rounds:
            last = self._last_wait
            if last is not None and last.sent >= after:
                return last

            async def step(conn: _C) -> _Holders:
                sent = monotonic()
                waiting = list(self._waits.values())
                return _Holders(sent, await self._holders_many(conn, waiting) if waiting else {})

            with anyio.CancelScope(shield=True):  # a cancelled campaign must not cut the shared connection
                done = await self.run(step)
            self._last_wait = done
            return done

    async def identify(self, backend: SessionLockBackend[_C], holder: Hashable) -> Any:
        """Report the holder of ``backend``'s lock, seen as ``holder``, with its identity: what to compare the next
        holder with."""

        async def step(conn: _C) -> Any:
            _, current, final = await backend._identify(conn)
            backend._reporter.leader(current)
            return holder if final else _UNSEEN

        with anyio.CancelScope(shield=True):
            async with self._asking:
                seen = await self.run(step)
        await anyio.lowlevel.checkpoint()
        return seen

    def notice_for(self, name: str) -> anyio.Event:
        """The event set when a release of ``name`` is announced (a new one after each)."""
        event = self._notices.get(name)
        if event is None or event.is_set():
            event = self._notices[name] = anyio.Event()
        return event

    def released(self, name: str) -> None:
        """A release of ``name`` was announced: wake its waiting campaign, if any."""
        event = self._notices.get(name)
        if event is not None:
            event.set()

    # --- the connection ---------------------------------------------------------------

    async def _connection(self) -> _C:
        """The live shared connection, a new one if there is none (call with the statement lock held)."""
        self._check_open()
        conn = self._conn
        if conn is not None and not conn.broken:
            return conn
        if conn is not None:
            await self._lose(conn, "the shared lock connection is closed")
        # Shielded and bounded by the connect timeout: a connect cut off would leave a session on the server.
        with anyio.CancelScope(shield=True):
            fresh = await self.template._new_session(self.identity)
            try:
                await self._listen(fresh)
            except BaseException:
                fresh.close()
                raise
        self._conn = fresh
        self._on_end(fresh, lambda: self._ended(fresh, self.template.lost_session))
        self.log.debug("shared lock session %s opened", fresh.session_id)
        return fresh

    async def _lose(self, conn: _C, why: str) -> None:
        """Close ``conn`` for good: every leadership on it is lost (fate sharing). Never interrupted, bounded."""
        if self._conn is conn:
            self._conn = None
        self._ended(conn, why)
        with anyio.CancelScope(shield=True):
            await self.template._drop(conn)  # ends a session left with a lock request pending, once proven ours

    def _ended(self, conn: _C, why: str) -> None:
        """``conn`` ended: every leadership on it is lost, each monitor told at once."""
        lost = [name for name, hold in self._holds.items() if hold.conn is conn]
        for name in lost:  # the server freed their locks with the connection: wake each monitor now
            hold = self._holds.pop(name)
            hold.ended_why = f"the shared lock connection ended: {why}"
            hold.ended.set()
        if lost:
            self.log.warning(
                "shared lock session %s ended (%s): every leadership on it (%d) is lost",
                conn.session_id,
                why,
                len(lost),
            )

    async def run(self, step: Callable[[_C], Awaitable[_T]]) -> _T:
        """``step(conn)`` alone on the shared connection; a failure that closed the connection loses it."""
        async with self._statements:
            conn = await self._connection()
            try:
                return await step(conn)
            finally:
                if conn.broken:
                    await self._lose(conn, "a statement on it failed")

    # --- campaign, check, release -----------------------------------------------------

    async def attempt(
        self, backend: SessionLockBackend[_C], identity: str, seen: Any
    ) -> tuple[SharedHold[_C] | None, Any]:
        """One lock request that does not wait: the hold if granted, else None and the holder reported.

        The statements are shielded from cancellation (each is bounded); a
        grant made while the caller was cancelled is released before the
        cancellation goes on.
        """
        hold: SharedHold[_C] | None = None
        with anyio.CancelScope(shield=True):

            async def step(conn: _C) -> Any:
                nonlocal hold
                if not await backend._try_request(conn):
                    return await backend._report_holder(conn, seen)
                try:
                    confirmed = monotonic()
                    token = await backend._granted(conn, identity)
                except BaseException:
                    if not conn.broken:  # a grant whose token failed must not stay held on the session
                        try:
                            await backend._unlock(conn)
                        except Exception:
                            conn.close()
                    raise
                hold = SharedHold(self, backend, conn, token, confirmed)
                self._holds[backend.name] = hold
                return _UNSEEN

            async with self._asking:
                seen = await self.run(step)
        try:
            await anyio.lowlevel.checkpoint()  # a cancellation that came during the statements
        except BaseException:
            if hold is not None:
                await hold.release()
            raise
        return hold, seen

    async def confirmation(self, after: float) -> _Round:
        """A check round sent at ``after`` or later: the last one if it is recent enough, else a new one."""
        async with self._rounds:
            last = self._last
            if last is not None and last.sent >= after:
                return last
            done = await self._round()
            self._last = done
            return done

    async def _round(self) -> _Round:
        # Waiting for the connection may be cancelled (a monitor that learnt its loss stops waiting); the round,
        # once started, is not: a cancelled monitor must not cut the shared connection.
        async with self._statements:
            with anyio.CancelScope(shield=True):
                done = await self._round_on()
        return done

    async def _round_on(self) -> _Round:
        """The check round itself (call with the statement lock held)."""
        conn = self._conn
        sent = monotonic()
        if conn is None:
            return _Round(sent, conn, failure=self.template.lost_session)
        if conn.broken:
            await self._lose(conn, self.template.lost_session)
            return _Round(sent, conn, failure=self.template.lost_session)
        backends = [hold._backend for hold in self._holds.values() if hold.conn is conn]
        try:
            held = await self._held_many(conn, backends)
        except TimeoutError:
            why = f"lock check did not complete within {self.template.check_timeout:g}s"
        except Exception as exc:
            why = f"lock connection failed: {self.template.describe(exc)}"
        else:
            return _Round(sent, conn, held)
        conn.close()
        await self._lose(conn, why)
        return _Round(sent, conn, failure=why)

    async def release(self, hold: SharedHold[_C]) -> None:
        """Release ``hold``'s lock on its connection; a release the server does not answer closes the connection."""
        if self._holds.get(hold.name) is hold:
            del self._holds[hold.name]
        b = hold._backend
        with anyio.CancelScope(shield=True):
            async with self._statements:
                conn = hold.conn
                if conn.broken:
                    if conn is self._conn or any(h.conn is conn for h in self._holds.values()):
                        # Ended unseen (the server closed it): the other holds on it are lost too.
                        await self._lose(conn, self.template.lost_session)
                    return
                try:
                    freed = await b._unlock(conn)
                    if freed:
                        await self._announce_release(conn, hold.name)
                    else:  # not ours any more (lost meanwhile): nothing held to give back
                        b.log.debug("the server shows the lock not held by the shared session; nothing to release")
                except Exception as exc:
                    conn.close()
                    await self._lose(conn, f"the release of {hold.name!r} failed: {b.describe(exc)}")

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._enter(f"{self.template.dialect.product} session hold their locks on one connection", "it is lost")
        try:
            await self.run(lambda conn: anyio.lowlevel.checkpoint())
        except Exception as exc:
            await self.aclose()
            raise self.template.failure(exc, "the shared session") from None
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _close_own(self) -> None:
        """Close the connection (which frees any lock), then the backend it was opened through."""
        async with self._statements:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.aclose(self.template.check_timeout)
        await self.template.aclose()


def held_names(backends: list[Any], answers: list[Hashable]) -> frozenset[str]:
    """The names of ``backends`` whose answer (in the same order) is true."""
    return frozenset(b.name for b, yes in zip(backends, answers, strict=True) if yes)
