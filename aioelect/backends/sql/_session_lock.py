"""The engine of the session-lock backends: a lock that lives exactly as long as one server session.

This module owns everything a session-lock election does, written once for
every database whose lock belongs to a session (MySQL ``GET_LOCK``,
PostgreSQL advisory locks). A database is a *dialect*: a subclass of
:class:`SessionLockBackend` that says how to connect (driver, TLS), which
statements wait for, check, release and fence the lock, which errors no
retry can fix, how to end another session and how to find the holder. Where
the lock's requests run is the backend's :class:`LockSessions`, given when
it is made: by default sessions of its own (:class:`OwnSessions`, what this
docstring describes), or a shared session's one connection
(``_shared_lock``); either way the campaign loop, its back-off and its
error handling are the engine's, written once. The engine guarantees, for
every dialect:

* a campaign waits on the server for the lock, one request per
  ``poll_interval`` at most (a request that returns early is followed by a
  pause, so a campaign is never a busy loop), on one dedicated connection
  that is never reconnected silently: a new session does not hold the lock;
* every error it catches is classified in one place
  (:meth:`SessionLockBackend.classify`): transient ones are retried with
  backoff and reported; permanent ones (the dialect's refusals, a refused
  certificate or TLS handshake) raise
  :class:`~aioelect.PermanentBackendError` at once, never retried, and so
  do the refusals the engine and the dialect word themselves (a server-side
  bound, a topology), raised as they are;
* a session left with a lock request pending (:attr:`LockConnection.pending`:
  its answer never read, after a failure or a cancellation) is ended on the
  server before the campaign goes on or returns, but only once
  the server shows it to be that very session (the dialect proves it: the
  same server incarnation and the same session, never a bare id that a
  restarted server may have given to someone else);
* cancellation leaves no lock and no connection behind;
* a new leadership is dated from a lock check sent *after* the grant, never
  from the request, which may have waited on the server for seconds;
* the hold confirms the lock every ``check_interval``, each check bounded by
  ``check_timeout``, and notices at once the server closing the session; a
  lock taken otherwise, or a server that stops answering, ends the
  leadership within ``check_interval + 2 * check_timeout``
  (:attr:`~aioelect.core._config.LockTiming.deposed_within`);
  release is idempotent and a connection already gone is not an error;
* a session is kept for the elector's next campaign only when the server
  answered that the release freed the lock (any doubt, failure or
  cancellation closes it instead); a kept session is used again only while
  it has been idle for less than ``lease / 2`` (the server ends an idle one
  after ``lease``) and once a check on it has been answered (a server
  restart or a ``KILL`` may have ended it); one found dead is closed and
  replaced at once;
* a new lock session is used only once every server-side bound on it
  (idle timeouts, TCP keepalives, TCP user timeout), read from the server,
  is at least ``lease``: otherwise the campaign raises
  :class:`~aioelect.PermanentBackendError` naming the bound, because the server
  could hand the lock on while a cut-off leader, which stops only at its
  renew deadline, still leads;
* a waiting campaign learns who leads on its own lock session, between two
  lock requests (one statement each time, the holder's identity looked up
  only when the holder changes): one session per candidate on the server,
  and no connection at all to look at the leader while campaigning
  (:meth:`SessionLockBackend.leader` opens one, lazily, for a caller who asks);
* :meth:`SessionLockBackend.leader` waits (briefly) for a new holder's record
  of its identity rather than report the holder without it.
"""

from __future__ import annotations

import abc
import enum
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypedDict, TypeVar

import anyio

from ...core._backend import Backend, Backoff, Confirm, Hold, Interceptor, Loss, monotonic, until_recorded
from ...core._config import DSN, LockTiming, TimingRules, check_options, parse_dsn, server_address
from ...core._errors import BackendUnavailable, ElectionError, LossKind, PermanentBackendError

__all__ = [
    "Campaign",
    "CommonOptions",
    "Dialect",
    "ErrorKind",
    "KeptSession",
    "LockConnection",
    "LockSessions",
    "OwnSessions",
    "Pending",
    "SessionLockBackend",
    "SessionLockOptions",
    "SessionLost",
    "TlsRequired",
    "read_options",
    "tls_error",
]

_T = TypeVar("_T")
#: A holder never seen: different from every holder, None (free) included.
_UNSEEN: Any = object()


class SessionLost(ConnectionError):
    """The lock's session is gone or was never the holder: transient, the campaign starts over."""


class TlsRequired(Exception):
    """The TLS settings require TLS but the connection is not encrypted: a TLS refusal, no retry can fix it.

    The server does not offer TLS, or someone on the path stripped it. Not an
    OSError, so a driver passes it on as it is instead of as a transient
    "cannot connect".
    """


# An SSLError of these kinds means the connection was cut mid-handshake (network, restart): worth retrying.
_TLS_CUT = (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``exc`` (itself, its cause or its context), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_refusal(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``exc`` if no retry can fix it.

    Permanent: a refused certificate (verification failure, a name that does
    not match) and a handshake the server refuses (an alert, no common
    protocol or cipher); both are configuration. Transient: a connection cut
    mid-handshake (end of stream, a system call error), as any other cut.
    """
    found = tls_error(exc)
    if found is None or isinstance(found, _TLS_CUT):
        return None
    return found


class ErrorKind(enum.Enum):
    """What an error caught in the engine is (:meth:`SessionLockBackend.classify`), and so what is done with it."""

    #: The dialect's refusal (credentials, a privilege, an unknown database, SQL): raised as
    #: :class:`~aioelect.PermanentBackendError`, never retried.
    PERMANENT = "permanent"
    #: A refused certificate or TLS handshake, or no TLS where it is required (:class:`TlsRequired`):
    #: configuration, raised as :class:`~aioelect.PermanentBackendError`.
    TLS_REFUSAL = "TLS refusal"
    #: An :class:`~aioelect.ElectionError` the engine or dialect raised with its own words (a
    #: :class:`~aioelect.PermanentBackendError` naming a server-side bound, a topology...): raised as it is.
    REFUSED = "refused"
    #: Anything else (a cut connection, a timeout, a restart): a campaign retries it, one attempt raises
    #: :class:`~aioelect.BackendUnavailable`.
    TRANSIENT = "transient"


class Pending(enum.Enum):
    """What a session may have outstanding on the server: set by the statement that sent it, cleared by its answer."""

    #: Every statement sent on the session was answered (or none was sent).
    NOTHING = "nothing"
    #: A lock request was sent and its answer not read: the server may still be waiting for the lock on the
    #: session's behalf, or have granted it to a session nobody reads.
    LOCK_REQUEST = "a lock request"


class LockConnection(abc.ABC):
    """One dedicated server session: never reconnected, never reused after a client-side failure.

    A call that is cancelled or times out, or fails below SQL, leaves the
    session in a state nobody can trust, so the connection is closed; a plain
    SQL error reported by the server leaves it usable.
    """

    #: The server's id of the session (MySQL ``CONNECTION_ID()``, PostgreSQL ``pg_backend_pid()``).
    session_id: int = 0
    #: What the session has outstanding on the server (see :meth:`run`); a lock request left pending when the
    #: connection is dropped makes the engine end the session on the server (:meth:`SessionLockBackend._drop`).
    pending: Pending = Pending.NOTHING
    #: The identity a lock session was opened for (None: a plain connection), which names it on the server.
    identity: str | None = None
    #: Between this session and the server: every statement goes through it (None: nothing). Set by the backend.
    interceptor: Interceptor | None = None

    @property
    @abc.abstractmethod
    def broken(self) -> bool:
        """True once the connection is closed, by us or by the server."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the connection at once; the server ends the session (and frees its locks) when it sees it."""

    async def aclose(self, timeout: float) -> None:  # noqa: ASYNC109
        """Close politely where the driver can, within ``timeout``; else as :meth:`close`."""
        self.close()

    def descriptor(self) -> int | None:
        """The connection's socket descriptor, while it is open (None where the driver does not tell)."""
        return None

    @abc.abstractmethod
    async def closed_by_server(self, wait: float) -> bool:
        """Wait up to ``wait`` seconds on the idle connection; True if the server closed it meanwhile."""

    @abc.abstractmethod
    def leaves_clean(self, exc: BaseException) -> bool:
        """Whether a call that raised ``exc`` left the session usable (a server-side SQL error)."""

    async def run(
        self,
        call: Callable[[], Awaitable[_T]],
        timeout: float,  # noqa: ASYNC109
        pending: Pending = Pending.NOTHING,
    ) -> _T:
        """``await call()`` within ``timeout`` seconds, closing the connection unless a failure left it clean.

        ``pending`` is what the statement leaves outstanding on the server
        until its answer is read (a lock request): :attr:`pending` says so
        from the send until an answer, a result or a server's error, is read.
        A call cut off (a timeout, a cancellation, a failure below SQL)
        closes the connection with it still set, for good.
        """
        if self.broken:
            raise SessionLost("lock connection is closed")
        self.pending = pending
        try:
            with anyio.fail_after(timeout):
                if self.interceptor is None:
                    result: _T = await call()
                else:
                    result = await self.interceptor.exchange(self.identity or "", call)
        except BaseException as exc:
            if not self.leaves_clean(exc):
                self.close()
                raise
            self.pending = Pending.NOTHING  # the server answered, with an error
            raise
        self.pending = Pending.NOTHING
        return result


_C = TypeVar("_C", bound=LockConnection)


def socket_fd(holder: object) -> int | None:
    """The socket descriptor under ``holder``'s asyncio transport (its ``transport`` or ``_transport``), if open."""
    transport = getattr(holder, "transport", None) or getattr(holder, "_transport", None)
    get = getattr(transport, "get_extra_info", None)
    sock = get("socket") if callable(get) else None
    try:
        fd = sock.fileno() if sock is not None else -1
    except (OSError, ValueError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


class SessionLockOptions(TypedDict, total=False):
    """The options every session-lock database reads; each dialect adds its own (``lease``, ``ssl``...)."""

    #: Server host, port, user, password and database: each overrides the DSN's part.
    host: str | None
    port: int | None
    user: str | None
    password: str | None
    database: str | None
    #: Seconds a follower waits per lock request (default 2).
    poll_interval: float
    #: Seconds to connect (default 5).
    connect_timeout: float
    #: Seconds between the leader's lock checks (default 1, a tenth of a shorter lease), and the bound on one
    #: (default 2, or less where the renew deadline is short: ``(renew_deadline - check_interval) / 2`` if that is
    #: at least 0.5).
    check_interval: float
    check_timeout: float
    #: Seconds a leader may go without a confirmed check before it fences itself (default: derived from the others).
    renew_deadline: float | None
    #: Give each leadership a fencing token (default True).
    fencing: bool


@dataclass(frozen=True)
class Dialect:
    """What the engine knows of a database before it connects."""

    #: The database's name in messages ("MySQL").
    product: str
    #: The class users construct, named in TypeErrors and ValueErrors.
    elector: str
    #: The DSN schemes it accepts, and the port when none is given.
    schemes: tuple[str, ...]
    default_port: int
    #: The server setting that ``lease`` becomes, its bounds and the timing defaults.
    timing: TimingRules


@dataclass(frozen=True)
class CommonOptions:
    """The options every session-lock database reads, validated; ``None`` where neither option nor DSN says."""

    host: str
    port: int
    user: str | None
    password: str | None
    database: str | None
    #: The parsed DSN, for the dialect's own query parameters (None without a DSN).
    dsn: DSN | None
    fencing: bool
    timing: LockTiming


def read_options(dsn: str | None, options: Mapping[str, Any], spec: Any, dialect: Dialect) -> CommonOptions:
    """Check ``options`` against ``spec`` (a TypedDict) and read the shared ones, each overriding the DSN's part.

    TypeError for an unknown option, ValueError naming a bad one (never the
    password). The timing is read once, by ``dialect.timing`` (:meth:`~aioelect.core._config.TimingRules.read`).
    """
    who = dialect.elector
    check_options(who, options, spec)
    parsed = parse_dsn(dsn, *dialect.schemes) if dsn is not None else None
    host, port = server_address(
        parsed, options.get("host"), options.get("port"), default_port=dialect.default_port, who=who
    )

    def part(option: str, from_dsn: str | None) -> str | None:
        value = options.get(option)
        return value if value is not None else from_dsn

    fencing = options.get("fencing", True)
    if fencing not in (True, False):
        raise ValueError(f"fencing must be True or False, not {fencing!r}")
    timing = dialect.timing.read(options)
    return CommonOptions(
        host,
        port,
        part("user", parsed.user if parsed else None),
        part("password", parsed.password if parsed else None),
        part("database", parsed.database if parsed else None),
        parsed,
        bool(fencing),
        timing,
    )


class SessionLockHold(Hold, Generic[_C]):
    """A lock granted to one session: confirmed on that session, released by it."""

    def __init__(
        self,
        sessions: OwnSessions[_C],
        backend: SessionLockBackend[_C],
        conn: _C,
        token: int | None,
        acquired_at: float,
    ) -> None:
        self._sessions = sessions
        self._backend = backend
        self._conn = conn
        self.token = token
        self.acquired_at = acquired_at

    @property
    def session_id(self) -> int:
        """The server's id of the session that holds the lock (MySQL's connection id, PostgreSQL's pid)."""
        return int(self._conn.session_id)

    async def monitor(self, confirm: Confirm) -> Loss:
        b = self._backend
        while True:
            if await self._conn.closed_by_server(b.check_interval):
                return Loss(LossKind.CONNECTION_LOST, b.lost_session)
            sent = monotonic()
            try:
                mine = await b._held(self._conn)
            except TimeoutError:
                return Loss(LossKind.CONNECTION_LOST, f"lock check did not complete within {b.check_timeout:g}s")
            except Exception as exc:
                return Loss(LossKind.CONNECTION_LOST, f"lock connection failed: {b.describe(exc)}")
            if not mine:
                return Loss(LossKind.DEPOSED, b.lost_lock)
            confirm(sent)

    def descriptors(self) -> tuple[int, ...]:
        fd = None if self._conn.broken else self._conn.descriptor()
        return () if fd is None else (fd,)

    async def release(self) -> None:
        conn, b = self._conn, self._backend
        if conn.broken:
            conn.close()
            return
        freed = False
        try:
            freed = await b._unlock(conn)
            if not freed:
                b.log.debug("the server did not confirm the release; closing the session drops any lock")
        except Exception as exc:
            b.log.debug("unlock failed (%s); closing the session drops the lock", b.describe(exc))
        finally:
            if freed and not conn.broken:
                await self._sessions.keep(b, conn)
            else:
                await conn.aclose(b.check_timeout)


class Campaign(abc.ABC):
    """One campaign's requests for the lock, made by its backend's :class:`LockSessions`.

    :meth:`SessionLockBackend.campaign` drives it, and owns the back-off,
    the classification of errors and their reports: it calls :meth:`ask`,
    then :meth:`wait_between` while :meth:`ask` gives no hold; after each
    transient failure :meth:`interrupted`, the report, then :meth:`discard`;
    :meth:`end` always.
    """

    @abc.abstractmethod
    async def ask(self) -> Hold | None:
        """The lock's next request (none when the sessions know it is not free): the hold if granted, else None."""

    @abc.abstractmethod
    async def wait_between(self) -> None:
        """Between two requests: report the holder if it changed, and wait until the next request is due."""

    @abc.abstractmethod
    def interrupted(self) -> bool:
        """A transient failure: True when only a kept session was found ended, so the next request goes at once,
        without back-off or report."""

    @abc.abstractmethod
    async def discard(self) -> None:
        """After a transient failure, once reported: end what it left (a session, ended on the server if a request
        is pending), so that the next request starts clean."""

    @abc.abstractmethod
    async def end(self) -> None:
        """The campaign is over (won, refused or cancelled): end what it still has that no hold took."""


class LockSessions(abc.ABC, Generic[_C]):
    """Where a backend's lock requests run: given to the backend when it is made.

    :class:`OwnSessions` (the default) opens a lock session per campaign of
    one backend; a shared session (``SharedLockSession``) runs the locks of
    every backend made on it on its one connection. Either way, the
    backend's one campaign loop and its error handling are the engine's.
    """

    #: What was set up on the server through these sessions (a dialect's names, e.g. a table created), so that
    #: the backends using them set it up once.
    prepared: set[str]

    @abc.abstractmethod
    def campaign(self, backend: SessionLockBackend[_C], identity: str) -> Campaign:
        """A campaign of ``backend`` for ``identity`` (nothing sent before its first :meth:`Campaign.ask`)."""

    @abc.abstractmethod
    async def look(self, backend: SessionLockBackend[_C], look: Callable[[_C], Awaitable[_T]]) -> _T:
        """``look(conn)`` on a connection to look at ``backend``'s lock; an error as ``backend.failure`` words it."""

    @abc.abstractmethod
    async def close_observer(self, backend: SessionLockBackend[_C]) -> None:
        """Drop at once what :meth:`look` keeps open for ``backend`` alone (a campaign just won)."""

    @abc.abstractmethod
    async def forget(self, backend: SessionLockBackend[_C]) -> None:
        """``backend`` is closed: close what it alone used; what other backends use stays."""


class SessionLockBackend(Backend, Generic[_C]):
    """The engine: campaign, hold, release, leader() and error classification over one dialect's hooks.

    A dialect sets the class attributes and implements the abstract methods;
    every statement runs through :meth:`LockConnection.run` with a timeout.
    Where the lock's sessions come from is the :class:`LockSessions` the
    backend is given (by default its own, :class:`OwnSessions`).
    """

    dialect: ClassVar[Dialect]
    #: Why a leadership ended when the server closed the lock session (a :attr:`~aioelect.LossKind.CONNECTION_LOST`),
    #: or the check found the lock held by another session or none (a :attr:`~aioelect.LossKind.DEPOSED`).
    lost_session: ClassVar[str] = "the server closed the lock connection"
    lost_lock: ClassVar[str] = "lock is no longer held by our session"
    #: Why a campaign starts over when the check after a grant does not show the lock held by our session.
    not_held: ClassVar[str] = "the server granted the lock but does not show it held by our session"

    def __init__(
        self, name: str, timing: LockTiming, address: tuple[str, int], sessions: LockSessions[_C] | None = None
    ) -> None:
        super().__init__(name)
        self.timing = timing
        self.poll_interval = timing.poll_interval
        # leader() polls at least 0.1 s apart, whatever poll_interval is.
        self.observe_interval = max(timing.poll_interval, 0.1)
        self.check_interval = timing.check_interval
        self.check_timeout = timing.check_timeout
        self.connect_timeout = timing.connect_timeout
        self.lease = timing.lease
        self._address = address
        #: Where the lock's requests run (see :class:`LockSessions`).
        self.sessions: LockSessions[_C] = sessions if sessions is not None else OwnSessions()
        #: Handed to every session this backend opens (see :attr:`LockConnection.interceptor`).
        self.interceptor: Interceptor | None = None

    def intercept(self, interceptor: Interceptor | None) -> None:
        self.interceptor = interceptor  # every session opened from now on

    @property
    def renew_deadline(self) -> float:
        return self.timing.renew_deadline

    @property
    def margin(self) -> float:
        return self.timing.margin

    def describe_timing(self) -> str:
        t = self.timing
        return (
            f"poll_interval={t.poll_interval:g}s check_interval={t.check_interval:g}s "
            f"check_timeout={t.check_timeout:g}s renew_deadline={t.renew_deadline:g}s lease={t.lease:g}s: "
            f"a deposed leader stops within {t.deposed_within:g}s (at once if its session "
            f"ends), a frozen one is replaced after about {t.lease:g}s ({self.dialect.timing.server_timeout}) and "
            f"fences itself after {t.renew_deadline:g}s"
        )

    # --- the dialect ------------------------------------------------------------------

    @abc.abstractmethod
    async def _connect(self, identity: str) -> _C:
        """A new dedicated lock connection for ``identity``, its session set up; ElectionError if unusable."""

    @abc.abstractmethod
    async def _server_bounds(self, conn: _C) -> dict[str, float | None]:
        """Every server-side bound on ``conn``'s session, read from the server: setting -> seconds (None: off).

        A bound is a time after which the server may end a session it no
        longer hears from (an idle timeout, TCP keepalives, a TCP user
        timeout), named as the user would change it. The engine refuses the
        session when one is shorter than ``lease`` (see
        :meth:`~aioelect.core._config.LockTiming.server_problem`).
        """

    @abc.abstractmethod
    async def _open(self, purpose: str) -> _C:
        """A new plain connection, named for ``purpose`` where the server shows a name ("observer", "cleanup")."""

    @abc.abstractmethod
    async def _request(self, conn: _C) -> bool:
        """Wait on the server for the lock, up to about ``poll_interval``: True once granted, False if still busy.

        The request runs with ``pending=Pending.LOCK_REQUEST`` (see :meth:`LockConnection.run`).
        """

    @abc.abstractmethod
    async def _try_request(self, conn: _C) -> bool:
        """Ask for the lock without waiting on the server: True if granted, False if another session holds it.

        The request runs with ``pending=Pending.LOCK_REQUEST``, as :meth:`_request`.
        """

    @abc.abstractmethod
    async def _held(self, conn: _C) -> bool:
        """Whether the lock is held by ``conn``'s session, checked within ``check_timeout``."""

    @abc.abstractmethod
    async def _granted(self, conn: _C, identity: str) -> int | None:
        """Just after the grant, in as few requests as the database allows: this leadership's token.

        Must check on the server that ``conn``'s session holds the lock, and
        raise :class:`SessionLost` if not; then take the token (None without
        fencing) and any record of ``identity``, only while the lock is held.
        """

    @abc.abstractmethod
    async def _unlock(self, conn: _C) -> bool:
        """Release the lock held by ``conn``'s session: True only if the server answered that it freed it."""

    @abc.abstractmethod
    async def _end_session(self, conn: _C, victim: _C) -> bool:
        """On ``conn``, end ``victim``'s server session if the server shows it is that session; True if ended.

        Never ends a session merely because it has ``victim.session_id``: a
        restarted server (or another server behind the same address) reuses
        ids, and the session with that id may be anyone's.
        """

    @abc.abstractmethod
    async def _look(self, conn: _C) -> tuple[Any, str | None]:
        """The lock's holder as the server shows it (None: free) and its recorded identity (None: not recorded)."""

    @abc.abstractmethod
    async def _holder(self, conn: _C) -> Hashable:
        """The lock's holder in one statement, as a value that changes with the holder's session (None: free)."""

    @abc.abstractmethod
    async def _unrecorded(self, conn: _C, holder: Any) -> str:
        """What the server tells of ``holder`` when it recorded no identity."""

    @property
    def records_identity(self) -> bool:
        """Whether holders record their identity just after taking the lock (leader() waits for the record)."""
        return False

    @abc.abstractmethod
    def _permanent(self, exc: BaseException) -> bool:
        """Whether the driver error ``exc`` is one no retry can fix (authentication, privileges, SQL...)."""

    def _login_refused(self, exc: BaseException) -> bool:
        """Whether the driver error ``exc`` is the server refusing the login (wrong user or password...)."""
        return False

    @abc.abstractmethod
    def _describe_driver_error(self, exc: BaseException) -> str | None:
        """``exc`` in words if it is the driver's error, else None."""

    # --- errors -----------------------------------------------------------------------

    def classify(self, exc: BaseException) -> ErrorKind:
        """What ``exc``, caught in the engine, is: the one classification every path of the engine uses."""
        if self._permanent(exc):
            return ErrorKind.PERMANENT
        if isinstance(exc, TlsRequired) or _tls_refusal(exc) is not None:
            return ErrorKind.TLS_REFUSAL
        if isinstance(exc, ElectionError):
            return ErrorKind.REFUSED
        return ErrorKind.TRANSIENT

    def permanent(self, exc: BaseException) -> bool:
        """Whether no retry can fix ``exc`` (:class:`~aioelect.core._backend.ErrorTable`): anything not transient."""
        return self.classify(exc) is not ErrorKind.TRANSIENT

    def failure(self, exc: Exception, what: str) -> ElectionError:
        """What to raise for ``exc``, caught while doing ``what`` ("the campaign"), once it is not retried.

        :class:`~aioelect.PermanentBackendError` for a permanent error or a
        TLS refusal, the error itself for a refusal already worded, else
        :class:`~aioelect.BackendUnavailable`.
        """
        kind = self.classify(exc)
        host, port = self._address
        if kind is ErrorKind.PERMANENT and self._login_refused(exc):
            # Whatever was being done, the server refused the connection's login, not the statement.
            return PermanentBackendError(
                f"{self.dialect.product} at {host}:{port} refused the login: {self.describe(exc)}"
            )
        if kind is ErrorKind.PERMANENT or kind is ErrorKind.TLS_REFUSAL:
            return PermanentBackendError(f"{self.dialect.product} refused {what}: {self.describe(exc)}")
        if isinstance(exc, ElectionError):
            return exc
        return BackendUnavailable(f"{self.dialect.product} at {host}:{port} is unreachable: {self.describe(exc)}")

    def describe(self, exc: BaseException) -> str:
        """``exc`` in words for a log line or an error message (drivers never put the password in theirs)."""
        if isinstance(exc, TimeoutError):
            return "timed out"
        tls = tls_error(exc)
        if tls is not None:
            detail = getattr(tls, "verify_message", None) or tls.reason or tls
            return f"TLS handshake failed: {detail}"
        if isinstance(exc, (SessionLost, TlsRequired)):
            return str(exc)
        return self._describe_driver_error(exc) or repr(exc)

    # --- campaign ---------------------------------------------------------------------

    async def campaign(self, identity: str) -> Hold:
        """Ask for the lock as the sessions say, until granted; retry what is transient, with back-off.

        The one loop of every session-lock campaign, whatever its sessions: a
        transient failure is reported and retried after a back-off (reset by
        every answered request), except a kept session found ended, replaced
        at once; anything else raises :meth:`failure`.
        """
        backoff = Backoff(first=0.1, maximum=max(self.poll_interval, 1.0))
        campaign = self.sessions.campaign(self, identity)
        try:
            while True:
                try:
                    hold = await campaign.ask()
                    if hold is not None:
                        return hold
                    backoff.reset()
                    await campaign.wait_between()
                except Exception as exc:
                    if self.classify(exc) is not ErrorKind.TRANSIENT:
                        raise self.failure(exc, "the campaign") from None
                    delay = 0.0
                    if campaign.interrupted():  # the kept session was ended meanwhile (a restart, a KILL)
                        self.log.debug("kept session unusable (%s); opening a new one", self.describe(exc))
                    else:
                        delay = backoff.next_delay()
                        self.report_error(f"campaign interrupted ({self.describe(exc)})", delay)
                    await campaign.discard()
                    await anyio.sleep(delay)
        finally:
            await campaign.end()

    async def _report_holder(self, conn: _C, seen: Any) -> Any:
        """Between two lock requests, on the lock session: report the holder if it changed since ``seen``.

        One statement when the holder is the one already reported; its
        identity is looked up only for a new holder (or one not recorded yet).
        Returns what to pass as ``seen`` next time.
        """
        holder = await self._holder(conn)
        if holder == seen:
            return seen
        _, current, final = await self._identify(conn)
        self._reporter.leader(current)
        return holder if final else _UNSEEN

    async def try_campaign(self, identity: str) -> Hold | None:
        """One lock request that does not wait: the hold, or None if another session holds it.

        A kept session the server ended meanwhile is replaced once, at once
        (the kept one is taken by the first request, so the next is new).
        """
        campaign = self.sessions.campaign(self, identity)
        try:
            while True:
                try:
                    return await campaign.ask()
                except Exception as exc:
                    if self.classify(exc) is not ErrorKind.TRANSIENT or not campaign.interrupted():
                        raise self.failure(exc, "the campaign") from None
                    self.log.debug("kept session unusable (%s); opening a new one", self.describe(exc))
                    await campaign.discard()
        finally:
            await campaign.end()

    async def _new_session(self, identity: str) -> _C:
        """A new lock session for ``identity``, used only once every server-side bound on it is at least ``lease``."""
        conn = await self._connect(identity)
        try:
            bounds = await self._server_bounds(conn)
        except BaseException:
            conn.close()
            raise
        problem = self.timing.server_problem(bounds, product=self.dialect.product)
        if problem is not None:
            conn.close()
            raise PermanentBackendError(problem)
        conn.identity = identity
        conn.interceptor = self.interceptor
        return conn

    async def _drop(self, conn: _C) -> None:
        """Close a campaign's connection; if its session has a lock request pending, end it on the server.

        Closing alone is not enough: the server notices a vanished client only
        when it next looks (or writes), and meanwhile may grant the lock to the
        waiting session, which nobody reads, leaving the election without a
        leader until the session ends. Ending it from another connection is
        bounded and costs one connection; it is the one behaviour safe on
        every server, so every dialect does it, once the server shows the
        session to be ours (see :meth:`_end_session`).
        """
        conn.close()
        if conn.pending is not Pending.LOCK_REQUEST:
            return
        with anyio.move_on_after(self.connect_timeout + 2 * self.check_timeout + 1, shield=True):
            try:
                cleanup = await self._open("cleanup")
                cleanup.interceptor = self.interceptor
                try:
                    if not await self._end_session(cleanup, conn):
                        self.log.debug("session %s is no longer ours on the server; not ended", conn.session_id)
                finally:
                    await cleanup.aclose(self.check_timeout)
            except Exception as exc:
                self.log.debug("could not end waiting session %s (%s)", conn.session_id, self.describe(exc))

    # --- who leads --------------------------------------------------------------------

    async def leader(self) -> str | None:
        return await self.sessions.look(self, self._leader_on)

    async def watch(self) -> AsyncIterator[str | None]:
        """Nothing to poll beside a campaign: the campaign reports each new holder itself.

        A waiting candidate looks up the holder on its own lock session
        between two lock requests (see :meth:`campaign`), so a campaign uses
        exactly one session on the server; this watch opens none.
        """
        await anyio.sleep_forever()
        yield None  # pragma: no cover - never reached: the watch ends with the campaign, by cancellation

    async def _leader_on(self, conn: _C) -> str | None:
        return (await self._identify(conn))[1]

    async def _identify(self, conn: _C) -> tuple[Any, str | None, bool]:
        """(the holder as the server shows it, its identity or a description, whether that answer is final).

        Not final: the holder has not recorded its identity (yet), so a later look may say more.
        """
        if self.records_identity:
            holder, identity = await until_recorded(
                lambda: self._look(conn), lambda seen: seen[0] is None or seen[1] is not None
            )
        else:
            holder, identity = await self._look(conn)
        if holder is None:
            return None, None, True
        if identity is not None:
            return holder, str(identity), True
        return holder, await self._unrecorded(conn, holder), not self.records_identity

    async def close_observer(self) -> None:
        await self.sessions.close_observer(self)

    async def aclose(self) -> None:
        await self.sessions.forget(self)


@dataclass(frozen=True)
class KeptSession(Generic[_C]):
    """A lock session whose release the server confirmed (it holds no lock), kept for the next campaign."""

    conn: _C
    #: The identity it was opened for: only a campaign for that identity takes it.
    identity: str
    #: When it was kept (monotonic): the server ends a session idle for ``lease``.
    since: float


class OwnSessions(LockSessions[_C]):
    """A lock session of its own per campaign, for one backend: the engine's guarantees as the module states them.

    A campaign's session is the one kept from the backend's last leadership
    while it is fresh and answers a check, else a new one; leader() looks on
    an observer connection of its own, opened when first asked.
    """

    def __init__(self) -> None:
        self.prepared = set()
        #: The session kept for the next campaign (None: none).
        self.kept: KeptSession[_C] | None = None
        self._observer: _C | None = None
        self._observer_lock = anyio.Lock()
        self._closed = False

    def campaign(self, backend: SessionLockBackend[_C], identity: str) -> Campaign:
        return _OwnCampaign(self, backend, identity)

    async def session(self, backend: SessionLockBackend[_C], identity: str) -> tuple[_C, bool]:
        """A lock session for ``identity``: the kept one if still fresh and alive (True), else a new one (False).

        The kept one is alive when a check sent on it now is answered: a
        session the server ended meanwhile (a restart, a ``KILL``) is closed
        before any lock request is sent on it, so nothing is left pending.
        """
        kept, self.kept = self.kept, None
        if kept is not None:
            conn = kept.conn
            if not conn.broken and kept.identity == identity and monotonic() - kept.since < backend.lease / 2:
                try:
                    await backend._held(conn)
                except Exception as exc:
                    backend.log.debug("kept session unusable (%s); opening a new one", backend.describe(exc))
                else:
                    if not conn.broken:
                        return conn, True
            await conn.aclose(backend.check_timeout)
        return await backend._new_session(identity), False

    async def keep(self, backend: SessionLockBackend[_C], conn: _C) -> None:
        """Keep ``conn``, whose release the server confirmed (it holds no lock), for the next campaign."""
        identity = conn.identity
        if self._closed or self.kept is not None or identity is None:
            await conn.aclose(backend.check_timeout)
            return
        self.kept = KeptSession(conn, identity, monotonic())

    async def look(self, backend: SessionLockBackend[_C], look: Callable[[_C], Awaitable[_T]]) -> _T:
        """``look(conn)`` on the observer connection, opened (again) if needed; one retry on a new connection."""
        async with self._observer_lock:
            retried = False
            while True:
                try:
                    return await look(await self._observer_connection(backend))
                except Exception as exc:
                    transient = backend.classify(exc) is ErrorKind.TRANSIENT
                    if transient and self._observer is not None:
                        self._observer.close()
                        self._observer = None
                    if retried or not transient:
                        raise backend.failure(exc, "the query") from None
                    retried = True

    async def _observer_connection(self, backend: SessionLockBackend[_C]) -> _C:
        """The observer connection, a new one if there is none (call with the observer lock held)."""
        observer = self._observer
        if observer is not None and not observer.broken:
            return observer
        # Shielded (bounded by the connect timeout): a look cancelled mid-connect would leave
        # a session on the server until the half-open socket is collected.
        with anyio.CancelScope(shield=True):
            fresh = await backend._open("observer")
        fresh.interceptor = backend.interceptor
        self._observer = fresh
        return fresh

    async def close_observer(self, backend: SessionLockBackend[_C]) -> None:
        """Drop the observer connection at once: the campaign that just won waits for this, so no goodbye."""
        if self._observer is None and not self._observer_lock.locked():
            return  # none, and no look opening one: nothing to wait for
        async with self._observer_lock:
            if self._observer is not None:
                observer, self._observer = self._observer, None
                observer.close()

    async def forget(self, backend: SessionLockBackend[_C]) -> None:
        self._closed = True
        if self.kept is not None:
            conn, self.kept = self.kept.conn, None
            await conn.aclose(backend.check_timeout)
        if self._observer is not None:
            observer, self._observer = self._observer, None
            await observer.aclose(backend.check_timeout)


class _OwnCampaign(Campaign, Generic[_C]):
    """A campaign on a lock session of its own: it waits on the server, one request per ``poll_interval`` at most.

    A first request that does not wait (a busy lock's holder is then
    reported at once), then requests that wait; between two, the holder is
    reported from the same session. A failure ends the session (on the
    server too if a request is pending) and the next request opens one.
    """

    def __init__(self, sessions: OwnSessions[_C], backend: SessionLockBackend[_C], identity: str) -> None:
        self._sessions = sessions
        self._b = backend
        self._identity = identity
        self._conn: _C | None = None
        #: Whether the session is the kept one and no request on it was answered yet.
        self._reused = False
        #: Whether the next request waits on the server (not the first on a session).
        self._waits = False
        self._sent = 0.0
        self._seen: Any = _UNSEEN

    async def ask(self) -> Hold | None:
        b = self._b
        if self._conn is None:
            self._conn, self._reused = await self._sessions.session(b, self._identity)
            self._waits = False
        self._sent = monotonic()
        granted = await (b._request if self._waits else b._try_request)(self._conn)
        if not granted:
            self._reused = False
            return None
        hold = await self._won(self._conn)
        self._conn = None
        return hold

    async def _won(self, conn: _C) -> SessionLockHold[_C]:
        """The hold of a lock just granted to ``conn``, dated from a check sent after the grant.

        The request may have waited on the server for up to ``poll_interval``
        before the grant: dated from it, a leadership could start past its
        renew deadline. A check sent now and answered proves the session (and
        with it the lock) alive when the server ran it, which is after
        ``confirmed``.
        """
        confirmed = monotonic()
        token = await self._b._granted(conn, self._identity)
        return SessionLockHold(self._sessions, self._b, conn, token, confirmed)

    async def wait_between(self) -> None:
        b, conn = self._b, self._conn
        if conn is None:  # pragma: no cover - wait_between follows an ask that kept its session
            return
        self._seen = await b._report_holder(conn, self._seen)
        if self._waits:
            early = self._sent + b.poll_interval - monotonic()
            if early > 0:  # the server did not wait: never ask again at once
                await anyio.sleep(early)
        self._waits = True
        b.log.debug("lock busy; waiting again")

    def interrupted(self) -> bool:
        reused, self._reused = self._reused, False
        return reused

    async def discard(self) -> None:
        await self.end()

    async def end(self) -> None:
        if self._conn is not None:
            # A request cut off in flight may have been granted: end its session rather than trust the close.
            conn, self._conn = self._conn, None
            await self._b._drop(conn)
