"""MySQL / MariaDB backend: a named ``GET_LOCK`` held on a dedicated connection.

The lock lives exactly as long as the connection that took it, so:

* each elector opens its own connection (never pooled) and never lets the
  driver reconnect it silently: a new session does not hold the lock;
* the leader confirms on that connection, every ``check_interval``, that the
  lock is still held by its own ``CONNECTION_ID()``; a failed, slow or
  negative check is a loss;
* the connection's ``wait_timeout`` is set to ``lease``, so the server itself
  drops a leader that has gone silent (frozen, cut off) after ``lease``
  seconds, and a follower takes over;
* followers wait inside ``GET_LOCK(name, max(poll_interval, 1 s))``, so
  they wake the moment the lock is freed instead of at their next poll
  (whole seconds at least: MySQL truncates a fractional wait, and a wait of
  0 would return at once; a request that still returns early is followed by
  a client-side pause, so a campaign is never a busy loop);
* a new leadership is dated from a statement sent on the lock connection
  *after* ``GET_LOCK`` granted the lock, never from the request, which may
  have waited on the server for up to the wait above.
"""

from __future__ import annotations

import math
import ssl as _ssl
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import anyio

from .._backend import Backoff, Confirm, Hold, SessionLockBackend, monotonic, until_recorded
from .._config import (
    LockTiming,
    check_options,
    parse_dsn,
    server_address,
    tls_from_query,
    transport_warning,
    validate_name,
)
from .._errors import BackendUnavailable, ElectionError

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import aiomysql
    import pymysql
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the MySQL backend needs aiomysql: pip install 'aioelect[mysql]'") from exc

__all__ = ["FENCING_DDL", "FENCING_TABLE", "MySQLBackend", "MySQLOptions"]

#: The table that keeps fencing tokens and the holders' identities.
FENCING_TABLE = "aioelect_leaders"
FENCING_DDL = f"""CREATE TABLE IF NOT EXISTS {FENCING_TABLE} (
  name VARCHAR(64) NOT NULL PRIMARY KEY,
  token BIGINT UNSIGNED NOT NULL,
  holder VARCHAR(128) NOT NULL,
  connection_id BIGINT UNSIGNED NOT NULL,
  acquired_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""

# Server and client error codes that no retry can fix.
_PERMANENT = {
    1044,  # access denied to database
    1045,  # access denied (wrong user or password)
    1049,  # unknown database
    1142,  # command denied (e.g. CREATE on the fencing table)
    1227,  # missing privilege
    1251,  # client does not support the auth protocol
    1698,  # access denied (auth plugin)
    2059,  # auth plugin cannot be loaded
    3159,  # secure transport required
    4151,  # account locked
}
_NO_SUCH_TABLE = 1146
_UNKNOWN_VARIABLE = 1193
_MAX_NAME = 64
#: The shortest wait a GET_LOCK request asks the server for: MySQL truncates
#: fractional seconds, so a shorter wait may become 0 and return at once.
_MIN_WAIT = 1.0


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    tls = _tls_failure(exc)
    if tls is not None:
        return f"TLS handshake failed: {getattr(tls, 'verify_message', None) or getattr(tls, 'reason', None) or tls}"
    code = _code(exc)
    if code is not None and len(exc.args) > 1:
        return f"({code}) {exc.args[1]}"
    return repr(exc)


def _tls_failure(exc: BaseException) -> BaseException | None:
    """The TLS error behind ``exc``, if any: a refused certificate is not worth retrying."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _permanent(exc: BaseException) -> bool:
    return (
        _code(exc) in _PERMANENT
        or isinstance(exc, (pymysql.err.ProgrammingError, pymysql.err.NotSupportedError))
        or _tls_failure(exc) is not None
    )


class _Connection:
    """One aiomysql connection that is never reconnected and never left half-read.

    A query that is cancelled or times out leaves the protocol in an unknown
    state, so the connection is closed rather than reused.
    """

    def __init__(self, raw: aiomysql.Connection, connection_id: int) -> None:
        self.raw = raw
        self.id = connection_id
        self.broken = False

    async def scalar(self, sql: str, args: Sequence[Any] = (), *, timeout: float) -> Any:  # noqa: ASYNC109
        if self.broken:
            raise pymysql.err.OperationalError(2006, "lock connection is closed")
        try:
            with anyio.fail_after(timeout):
                async with self.raw.cursor() as cursor:
                    await cursor.execute(sql, args)
                    row = await cursor.fetchone()
        except BaseException as exc:
            # A server-side SQL error leaves the protocol clean; anything else may not.
            code = _code(exc)
            if code is None or code >= 2000:
                self.close()
            raise
        return None if row is None else row[0]

    async def closed_by_server(self, wait: float) -> bool:
        """Wait up to ``wait`` seconds on the idle connection; True if the server closed it.

        An idle connection receives nothing, so end-of-stream (or any byte: an
        error packet before a KILL) means the session, and with it the lock,
        is gone; noticing it here beats waiting for the next check.
        """
        reader = getattr(self.raw, "_reader", None)
        if reader is None or self.broken:  # a driver without the stream: rely on checks
            await anyio.sleep(wait)
            return self.broken
        with anyio.move_on_after(wait):
            await reader.read(1)
            self.close()
            return True
        return False

    def close(self) -> None:
        self.broken = True
        self.raw.close()


class _MySQLHold(Hold):
    def __init__(self, backend: MySQLBackend, conn: _Connection, token: int | None, acquired_at: float) -> None:
        self._backend = backend
        self._conn = conn
        self.token = token
        self.acquired_at = acquired_at

    async def monitor(self, confirm: Confirm) -> str:
        b = self._backend
        while True:
            if await self._conn.closed_by_server(b.check_interval):
                return "the server closed the lock connection"
            sent = monotonic()
            try:
                mine = await self._conn.scalar(
                    "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (b.name,), timeout=b.check_timeout
                )
            except TimeoutError:
                return f"lock check did not complete within {b.check_timeout:g}s"
            except Exception as exc:
                return f"lock connection failed: {_describe(exc)}"
            if mine != 1:
                return "lock is no longer held by our connection"
            confirm(sent)

    async def release(self) -> None:
        conn = self._conn
        if conn.broken:
            return
        try:
            await conn.scalar("SELECT RELEASE_LOCK(%s)", (self._backend.name,), timeout=self._backend.check_timeout)
        except Exception as exc:
            self._backend.log.debug("RELEASE_LOCK failed (%s); closing drops the lock", _describe(exc))
        finally:
            conn.close()


class _Named(TypedDict):
    #: The election's name: the ``GET_LOCK`` name, at most 64 characters.
    name: str


class MySQLOptions(_Named, total=False):
    """The options of a MySQL/MariaDB election; :class:`MySQLBackend` validates them."""

    #: Server host, port, user, password and database: each overrides the DSN's part.
    host: str | None
    port: int | None
    user: str | None
    password: str | None
    database: str | None
    #: Seconds a follower waits per ``GET_LOCK`` request (default 2; at least a second on the server).
    poll_interval: float
    #: Seconds to connect (default 5).
    connect_timeout: float
    #: Seconds between the leader's lock checks (default 1), and the bound on one (default 2).
    check_interval: float
    check_timeout: float
    #: Whole seconds of the session's ``wait_timeout``: the server drops a silent leader after it (default 10).
    lease: int
    #: Seconds a leader may go without a confirmed check before it fences itself (default: derived from the others).
    renew_deadline: float | None
    #: Keep increasing tokens and the holders' identities in table ``aioelect_leaders`` (default False).
    fencing: bool
    #: Accept Galera and Group Replication, where ``GET_LOCK`` is per node (default False).
    allow_unsafe_topology: bool
    #: TLS context for the connections (else the DSN's ``ssl_mode``...; default none).
    ssl: _ssl.SSLContext | None


class MySQLBackend(SessionLockBackend):
    """``GET_LOCK`` elections on one MySQL/MariaDB server, built from a DSN and :class:`MySQLOptions`.

    The constructor validates every option (ValueError naming it, never the
    password) and connects to nothing.
    """

    kind = "mysql"
    server_timeout = "wait_timeout"

    def __init__(self, dsn: str | None = None, **options: Unpack[MySQLOptions]) -> None:
        check_options("MySQLElector", options, MySQLOptions)
        parsed = parse_dsn(dsn, "mysql", "mariadb") if dsn is not None else None
        host, port = server_address(
            parsed, options.get("host"), options.get("port"), default_port=3306, who="MySQLElector"
        )
        user, password = options.get("user"), options.get("password")
        database = options.get("database")
        database = database if database is not None else (parsed.database if parsed else None)
        fencing = options.get("fencing", False)
        if fencing and not database:
            raise ValueError("fencing=True needs a database for the aioelect_leaders table")
        timing = LockTiming.checked(
            poll_interval=options.get("poll_interval", 2.0),
            check_interval=options.get("check_interval", 1.0),
            check_timeout=options.get("check_timeout", 2.0),
            connect_timeout=options.get("connect_timeout", 5.0),
            lease=options.get("lease", 10),
            renew_deadline=options.get("renew_deadline"),
            server_timeout="wait_timeout",
            min_lease=2,
            whole_lease=True,
            dated_after_grant=True,
        )
        connect_args: dict[str, Any] = {
            "host": host,
            "port": port,
            "user": user if user is not None else (parsed.user if parsed and parsed.user else "root"),
            "password": password if password is not None else (parsed.password if parsed and parsed.password else ""),
        }
        if database:
            connect_args["db"] = database
        dsn_tls = tls_from_query(parsed.query) if parsed is not None else None
        ssl = options.get("ssl")
        if ssl is not None and parsed is not None and parsed.query:
            raise ValueError("give TLS settings either as ssl= or in the DSN, not both")
        if ssl is not None and not isinstance(ssl, _ssl.SSLContext):
            raise ValueError(f"ssl must be an ssl.SSLContext, not {type(ssl).__name__}")
        ssl = ssl if ssl is not None else dsn_tls
        if ssl is not None:
            connect_args["ssl"] = ssl
        super().__init__(validate_name(options["name"], max_length=_MAX_NAME), timing)
        self._connect_args = connect_args
        self.fencing = fencing
        self.allow_unsafe_topology = options.get("allow_unsafe_topology", False)
        self._topology_checked = False
        self._fencing_ready = False
        self._info: _Connection | None = None
        self._info_lock = anyio.Lock()
        warning = transport_warning(
            host,
            encrypted=ssl is not None,
            verified=ssl is not None and ssl.verify_mode != _ssl.CERT_NONE,
            fix="add ?ssl_mode=VERIFY_IDENTITY&ssl_ca=PATH to the DSN, or pass ssl=",
        )
        if warning is not None:
            self.warnings.append(warning)

    # --- connections -------------------------------------------------------------

    async def _connect(self) -> _Connection:
        """A new dedicated connection with ``wait_timeout = lease``, topology checked."""
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                raw = await aiomysql.connect(
                    connect_timeout=self.connect_timeout, autocommit=True, **self._connect_args
                )
        except TimeoutError:
            raise pymysql.err.OperationalError(2003, f"connect timed out after {self.connect_timeout:g}s") from None
        conn = _Connection(raw, 0)
        try:
            conn.id = await conn.scalar("SELECT CONNECTION_ID()", timeout=self.check_timeout)
            await conn.scalar("SET SESSION wait_timeout = %s", (int(self.lease),), timeout=self.check_timeout)
            if not self._topology_checked:
                await self._check_topology(conn)
                self._topology_checked = True
        except BaseException:
            conn.close()
            raise
        return conn

    async def _check_topology(self, conn: _Connection) -> None:
        """Refuse servers on which GET_LOCK is not cluster-wide, unless allowed."""
        problems = []
        try:
            if await conn.scalar("SELECT @@global.wsrep_on", timeout=self.check_timeout) == 1:
                problems.append("Galera replication is on (wsrep_on=ON)")
        except pymysql.err.MySQLError as exc:
            if _code(exc) != _UNKNOWN_VARIABLE:
                raise
        try:
            members = await conn.scalar(
                "SELECT COUNT(*) FROM performance_schema.replication_group_members WHERE MEMBER_STATE = 'ONLINE'",
                timeout=self.check_timeout,
            )
            if members:
                problems.append("Group Replication is running")
        except pymysql.err.MySQLError:
            pass  # no such table: not a Group Replication member
        if problems and not self.allow_unsafe_topology:
            raise ElectionError(
                "GET_LOCK is local to one server and not shared across cluster nodes: "
                + "; ".join(problems)
                + ". Point every candidate at the same single node, or pass allow_unsafe_topology=True."
            )
        if problems:
            self.log.warning("unsafe topology allowed: %s", "; ".join(problems))

    async def _kill(self, connection_id: int) -> None:
        """End a server thread still waiting in GET_LOCK for a client that gave up.

        Without this, the server would keep waiting (up to ``poll_interval``,
        at least a second) and could even take the lock for a connection nobody reads.
        """
        with anyio.move_on_after(self.connect_timeout + self.check_timeout, shield=True):
            try:
                conn = await self._connect_plain()
                try:
                    await conn.scalar("KILL %s", (connection_id,), timeout=self.check_timeout)
                finally:
                    conn.close()
            except Exception as exc:
                self.log.debug("could not end waiting thread %s (%s)", connection_id, _describe(exc))

    async def _connect_plain(self) -> _Connection:
        with anyio.fail_after(self.connect_timeout + 1):
            raw = await aiomysql.connect(connect_timeout=self.connect_timeout, autocommit=True, **self._connect_args)
        return _Connection(raw, 0)

    # --- campaign ----------------------------------------------------------------

    async def campaign(self, identity: str) -> Hold:
        backoff = Backoff(first=0.1, maximum=max(self.poll_interval, 1.0))
        wait = max(self.poll_interval, _MIN_WAIT)
        while True:
            conn: _Connection | None = None
            waiting = False
            try:
                conn = await self._connect()
                while True:
                    sent = monotonic()
                    waiting = True
                    got = await conn.scalar(
                        "SELECT GET_LOCK(%s, %s)",
                        (self.name, math.ceil(wait)),
                        timeout=math.ceil(wait) + self.check_timeout,
                    )
                    waiting = False
                    if got == 1:
                        hold = await self._won(conn, identity)
                        conn = None
                        return hold
                    if got is None:
                        raise pymysql.err.OperationalError(2013, "GET_LOCK was interrupted")
                    backoff.reset()
                    early = sent + self.poll_interval - monotonic()
                    if early > 0:  # the server did not wait: never ask again at once
                        await anyio.sleep(early)
                    self.log.debug("lock busy; waiting again")
            except Exception as exc:
                if _permanent(exc):
                    raise ElectionError(f"MySQL refused the campaign: {_describe(exc)}") from None
                if isinstance(exc, ElectionError):
                    raise
                delay = backoff.next_delay()
                self.report_error(f"campaign interrupted ({_describe(exc)})", delay)
                if conn is not None:
                    conn.close()
                    conn = None
                await anyio.sleep(delay)
            finally:
                if conn is not None:
                    conn.close()
                    if waiting:
                        await self._kill(conn.id)

    async def _won(self, conn: _Connection, identity: str) -> _MySQLHold:
        """The hold for a lock ``conn`` was just granted, dated from a statement sent after the grant.

        The request may have waited on the server for seconds before the
        grant: dated from it, a leadership could start past its renew deadline.
        A statement sent now and answered proves the session (and with it the
        lock) alive when the server ran it, which is after ``confirmed``.
        """
        confirmed = monotonic()
        if self.fencing:
            token: int | None = await self._fence(conn, identity)
        else:
            token = None
            mine = await conn.scalar(
                "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,), timeout=self.check_timeout
            )
            if mine != 1:
                raise pymysql.err.OperationalError(2013, "the lock was gone right after GET_LOCK granted it")
        return _MySQLHold(self, conn, token, confirmed)

    async def _fence(self, conn: _Connection, identity: str) -> int:
        """Bump and return this name's token; only a lock holder ever writes it."""
        if not self._fencing_ready:
            with warnings.catch_warnings():  # "table already exists" is expected
                warnings.simplefilter("ignore")
                await conn.scalar(FENCING_DDL, timeout=self.check_timeout * 5)
            self._fencing_ready = True
        await conn.scalar(
            f"INSERT INTO {FENCING_TABLE} (name, token, holder, connection_id) "
            "VALUES (%s, 1, %s, CONNECTION_ID()) ON DUPLICATE KEY UPDATE token = token + 1, "
            "holder = VALUES(holder), connection_id = VALUES(connection_id), acquired_at = CURRENT_TIMESTAMP(6)",
            (self.name, identity),
            timeout=self.check_timeout,
        )
        token = await conn.scalar(
            f"SELECT token FROM {FENCING_TABLE} WHERE name = %s", (self.name,), timeout=self.check_timeout
        )
        return int(token)

    # --- who leads -----------------------------------------------------------------

    async def leader(self) -> str | None:
        async with self._info_lock:
            for attempt in range(2):
                try:
                    if self._info is None or self._info.broken:
                        self._info = await self._connect_plain()
                    return await self._leader_on(self._info)
                except Exception as exc:
                    if _permanent(exc):
                        raise ElectionError(f"MySQL refused the query: {_describe(exc)}") from None
                    if self._info is not None:
                        self._info.close()
                        self._info = None
                    if attempt:
                        raise BackendUnavailable(f"MySQL at {self._where()} is unreachable: {_describe(exc)}") from None
        raise AssertionError("unreachable")

    async def _leader_on(self, conn: _Connection) -> str | None:
        async def look() -> tuple[Any, Any]:
            holder = await conn.scalar("SELECT IS_USED_LOCK(%s)", (self.name,), timeout=self.check_timeout)
            if holder is None:
                return None, None
            try:
                identity = await conn.scalar(
                    f"SELECT holder FROM {FENCING_TABLE} WHERE name = %s AND connection_id = %s",
                    (self.name, holder),
                    timeout=self.check_timeout,
                )
            except pymysql.err.MySQLError as exc:
                if _code(exc) not in (_NO_SUCH_TABLE, 1046):  # 1046: no database selected
                    raise
                return holder, None
            return holder, identity

        if self.fencing:  # candidates that fence record their identity just after taking the lock
            holder, identity = await until_recorded(look, lambda seen: seen[0] is None or seen[1] is not None)
        else:
            holder, identity = await look()
        if holder is None:
            return None
        if identity is not None:
            return str(identity)
        host = await conn.scalar(
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = %s", (holder,), timeout=self.check_timeout
        )
        return f"connection {holder}" + (f" from {host}" if host else "")

    def _where(self) -> str:
        return f"{self._connect_args.get('host')}:{self._connect_args.get('port')}"

    async def aclose(self) -> None:
        if self._info is not None:
            self._info.close()
            self._info = None
