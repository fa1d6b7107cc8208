"""MySQL / MariaDB backend: a named ``GET_LOCK`` held on a dedicated connection.

The lock lives exactly as long as the connection that took it, so:

* each elector opens its own connection (never pooled) and never lets the
  driver reconnect it silently: a new session does not hold the lock;
* the leader confirms on that connection, every ``check_interval``, that the
  lock is still held by its own ``CONNECTION_ID()``; a failed, slow or
  negative check is a loss;
* the connection's ``wait_timeout`` is set to ``lease``, so the server itself
  drops a leader that has gone silent (frozen, cut off) after ``lease``
  seconds, and a follower takes over; every other server-side bound on the
  session (``net_read_timeout``, ``net_write_timeout``, MariaDB's
  ``tcp_keepalive_*``) is read at connect, and a session with one shorter
  than ``lease`` is refused, the bound named;
* followers wait inside ``GET_LOCK(name, max(poll_interval, 1 s))``, so
  they wake the moment the lock is freed instead of at their next poll
  (whole seconds at least: MySQL truncates a fractional wait, and a wait of
  0 would return at once; a request that still returns early is followed by
  a client-side pause, so a campaign is never a busy loop);
* a new leadership is dated from a statement sent on the lock connection
  *after* ``GET_LOCK`` granted the lock, never from the request, which may
  have waited on the server for up to the wait above.

This module is the MySQL dialect of :mod:`aioelect.backends.sql._session_lock`,
which owns the campaign, the hold, release and the error classification. It
owns the statements, the error codes, how to connect (aiomysql, TLS from the
DSN or ``ssl=``), the refusal of cluster topologies where ``GET_LOCK`` is per
node, and the ``aioelect_leaders`` table of tokens and identities.
"""

from __future__ import annotations

import math
import secrets
import ssl as _ssl
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import anyio

from ...core._backend import StateStore
from ...core._config import TimingRules, session_bounds, transport_warning, validate_name
from ...core._errors import ElectionError, PermanentBackendError, UsageError
from ._mysql_tls import tls_from_query
from ._session_lock import (
    Dialect,
    LockConnection,
    Pending,
    SessionLockBackend,
    SessionLockOptions,
    SessionLost,
    TlsRequired,
    read_options,
    socket_fd,
)
from ._shared_lock import SharedLockSession, held_names
from ._state import SqlStateStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import aiomysql
    import pymysql
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the MySQL backend needs aiomysql: pip install 'aioelect[mysql]'") from exc

__all__ = [
    "FENCING_DDL",
    "FENCING_TABLE",
    "STATE_DDL",
    "STATE_TABLE",
    "MySQLBackend",
    "MySQLOptions",
    "MySQLSession",
    "MySQLSessionOptions",
]

#: The table that keeps fencing tokens and the holders' identities.
FENCING_TABLE = "aioelect_leaders"
# Names are binary, compared byte for byte as GET_LOCK names are: "Billing" and "billing" are two rows.
FENCING_DDL = f"""CREATE TABLE IF NOT EXISTS {FENCING_TABLE} (
  name VARBINARY(64) NOT NULL PRIMARY KEY,
  token BIGINT UNSIGNED NOT NULL,
  holder VARCHAR(128) NOT NULL,
  connection_id BIGINT UNSIGNED NOT NULL,
  acquired_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""

#: The table of fenced state (:class:`~aioelect.FencedStore`): one row per election and key.
STATE_TABLE = "aioelect_state"
STATE_DDL = f"""CREATE TABLE IF NOT EXISTS {STATE_TABLE} (
  name VARBINARY(64) NOT NULL,
  skey VARBINARY(128) NOT NULL,
  value MEDIUMBLOB NOT NULL,
  token BIGINT UNSIGNED NOT NULL,
  written_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (name, skey)
) ENGINE=InnoDB"""
# The token row, locked for the write's transaction: a new leader's bump waits until it has ended.
_STATE_TOKEN = f"SELECT token FROM {FENCING_TABLE} WHERE name = %s LOCK IN SHARE MODE"
_STATE_VALUE = f"SELECT value FROM {STATE_TABLE} WHERE name = %s AND skey = %s"
_STATE_PUT = (
    f"INSERT INTO {STATE_TABLE} (name, skey, value, token) VALUES (%s, %s, UNHEX(%s), %s) "
    "ON DUPLICATE KEY UPDATE value = VALUES(value), token = VALUES(token)"
)

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
#: The login refused: wrong user or password, an authentication plugin, a locked account.
_LOGIN_REFUSED = (1045, 1251, 1698, 2059, 4151)
#: Access denied to the database, or a statement (CREATE, INSERT...) denied on the table.
_DENIED = (1044, 1142, 1227)
_NO_SUCH_TABLE = 1146
_NO_DATABASE_SELECTED = 1046
_UNKNOWN_VARIABLE = 1193
_MAX_NAME = 64
#: The shortest wait a GET_LOCK request asks the server for: MySQL truncates
#: fractional seconds, so a shorter wait may become 0 and return at once.
_MIN_WAIT = 1.0
_HELD_BY_ME = "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()"
# A table made with a name column that compares without regard to case (VARCHAR, a _ci collation) kept one
# row for every spelling of a name. It is altered to binary names; the row with the empty name (no election
# has one) keeps the largest token the table held, and a name's first row starts above it, so no spelling
# ever gets a token below one its shared row gave out.
_NAME_TYPE = (
    "SELECT DATA_TYPE FROM information_schema.COLUMNS "
    f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{FENCING_TABLE}' AND COLUMN_NAME = 'name'"
)
_FLOOR = (
    f"INSERT INTO {FENCING_TABLE} (name, token, holder, connection_id) "
    f"SELECT '', COALESCE(MAX(token), 0), '', 0 FROM {FENCING_TABLE} "
    "ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))"
)
_FLOOR_ROW = (
    f"INSERT INTO {FENCING_TABLE} (name, token, holder, connection_id) VALUES ('', 0, '', 0) "
    "ON DUPLICATE KEY UPDATE token = token"
)
_TO_BINARY = f"ALTER TABLE {FENCING_TABLE} MODIFY name VARBINARY(64) NOT NULL"
#: In :attr:`LockSessions.prepared` once the fencing table is set up (created, binary names, its floor row).
_FENCING_SET_UP = "fencing table"
# The check after a grant and the token bump in one statement: the row is written only if our
# session holds the lock (else 0 rows are affected), and LAST_INSERT_ID(expr) makes the server
# report the new token in the statement's answer (its insert id), so no SELECT follows.
_BUMP = (
    f"INSERT INTO {FENCING_TABLE} (name, token, holder, connection_id) "
    f"SELECT %s, LAST_INSERT_ID(1 + COALESCE((SELECT f.token FROM {FENCING_TABLE} f WHERE f.name = ''), 0)), "
    "%s, CONNECTION_ID() FROM DUAL WHERE IS_USED_LOCK(%s) = CONNECTION_ID() "
    "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = VALUES(holder), "
    "connection_id = VALUES(connection_id), acquired_at = CURRENT_TIMESTAMP(6)"
)


# The lock session's idle timeout is lease; a packet half read or half written may wait at least as long.
_SET_TIMEOUTS = (
    "SET SESSION wait_timeout = %s, net_read_timeout = GREATEST(@@session.net_read_timeout, %s), "
    "net_write_timeout = GREATEST(@@session.net_write_timeout, %s)"
)
# tcp_keepalive_* are MariaDB's (global only; SHOW SESSION VARIABLES shows them), absent on MySQL.
_SHOW_BOUNDS = (
    "SHOW SESSION VARIABLES WHERE Variable_name IN ('wait_timeout', 'net_read_timeout', 'net_write_timeout', "
    "'tcp_keepalive_time', 'tcp_keepalive_interval', 'tcp_keepalive_probes')"
)
# At connect, a lock session takes a second lock whose name is drawn at random for it: the session's marker.
# Only that session can hold it, and it ends with the session, so no session of a restarted server (whatever
# id it was given) holds it. The server's own id is read with it (a proxy's handshake may present another).
_MARK = "SELECT CONNECTION_ID(), GET_LOCK(%s, 0)"
_MARKER_PREFIX = "aioelect-session:"
_DURABILITY = "SELECT @@global.innodb_flush_log_at_trx_commit, @@global.log_bin, @@global.sync_binlog"


def server_bounds(variables: dict[str, float]) -> dict[str, float | None]:
    """Every server-side bound of a session whose variables (lower-case name -> seconds) are ``variables``.

    ``wait_timeout`` ends an idle session; ``net_read_timeout`` and
    ``net_write_timeout`` one stuck half-way through a packet. MariaDB's TCP
    keepalives end a connection to an unreachable client; 0 (and MySQL,
    which has no such variables) is the kernel's default (Linux: 2 hours),
    taken as off.
    """

    return session_bounds(
        variables,
        ("wait_timeout", "net_read_timeout", "net_write_timeout"),
        ("tcp_keepalive_time", "tcp_keepalive_interval", "tcp_keepalive_probes"),
    )


def _tls_required(host: str) -> TlsRequired:
    return TlsRequired(
        f"the server at {host} does not offer TLS, but the TLS settings require it: refused rather than connecting "
        "in plaintext (someone on the path may have stripped TLS from the server's greeting)"
    )


class _TlsOnlyConnection(aiomysql.Connection):  # type: ignore[misc]
    """An aiomysql connection that refuses, before it answers the greeting, a server that does not offer TLS.

    aiomysql starts TLS only when the greeting advertises ``CLIENT_SSL``; the
    refusal here comes before the client sends its credentials.
    """

    async def _request_authentication(self) -> None:
        if not self.server_capabilities & pymysql.constants.CLIENT.SSL:
            raise _tls_required(self._host)
        await super()._request_authentication()


def _encrypted(raw: aiomysql.Connection) -> bool:
    """Whether ``raw``'s transport is TLS (an SSL object under the stream)."""
    writer = getattr(raw, "_writer", None)
    return writer is not None and writer.get_extra_info("ssl_object") is not None


def _denied(exc: BaseException) -> str | None:
    """``(code) message`` when ``exc`` is the server refusing a privilege, else None."""
    code = _code(exc)
    return f"({code}) {exc.args[1]}" if code in _DENIED and len(exc.args) > 1 else None


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


class _MySQLConnection(LockConnection):
    """One aiomysql connection; :attr:`session_id` is its ``CONNECTION_ID()``.

    A lock connection also holds, from its connect on, the lock named
    :attr:`marker` (drawn at random for it): from another connection,
    ``IS_USED_LOCK(marker) = session_id`` proves that the session with that
    id is this one, on this server incarnation (see
    :meth:`MySQLBackend._end_session`).
    """

    def __init__(self, raw: aiomysql.Connection) -> None:
        self.raw = raw
        self._closed = False
        self._ended_by_server = False
        self.marker = _MARKER_PREFIX + secrets.token_hex(16)
        #: Whether the server granted :attr:`marker` at connect (False: the session can never be proven, nor KILLed).
        self.marked = False

    @property
    def broken(self) -> bool:
        return self._closed or self._ended_by_server

    def descriptor(self) -> int | None:
        return socket_fd(getattr(self.raw, "_writer", None))

    def on_end(self, ended: Callable[[], None]) -> None:
        """Call ``ended`` as soon as the transport sees the server end the session (its end of stream, or the
        connection lost), whether or not a statement is waiting for an answer on it.

        aiomysql reads the socket even when idle, but tells no one of its end
        until the next statement: the hooks sit on the transport's protocol.
        """
        writer = getattr(self.raw, "_writer", None)
        protocol = writer.transport.get_protocol() if writer is not None else None
        if protocol is None:  # a driver without the stream: its end is seen by the next statement
            return

        def hooked(original: Callable[..., Any]) -> Callable[..., Any]:
            def hook(*args: Any) -> Any:
                try:
                    return original(*args)
                finally:
                    self._ended_by_server = True
                    ended()

            return hook

        for event in ("eof_received", "connection_lost"):
            setattr(protocol, event, hooked(getattr(protocol, event)))

    def leaves_clean(self, exc: BaseException) -> bool:
        code = _code(exc)
        return code is not None and code < 2000  # 2000 and up: client-side errors

    async def scalar(
        self,
        sql: str,
        args: Sequence[Any] = (),
        *,
        timeout: float,  # noqa: ASYNC109
        pending: Pending = Pending.NOTHING,
    ) -> Any:
        """The first value of ``sql``'s first row (None without a row); ``pending`` as :meth:`LockConnection.run`."""

        async def call() -> Any:
            async with self.raw.cursor() as cursor:
                await cursor.execute(sql, args)
                return await cursor.fetchone()

        row = await self.run(call, timeout, pending)
        return None if row is None else row[0]

    async def rows(self, sql: str, args: Sequence[Any] = (), *, timeout: float) -> list[tuple[Any, ...]]:  # noqa: ASYNC109
        """Every row of ``sql``."""

        async def call() -> list[tuple[Any, ...]]:
            async with self.raw.cursor() as cursor:
                await cursor.execute(sql, args)
                return list(await cursor.fetchall())

        return await self.run(call, timeout)

    async def write(self, sql: str, args: Sequence[Any], *, timeout: float) -> tuple[int, int]:  # noqa: ASYNC109
        """Run ``sql``: (rows affected, the insert id the server reported)."""

        async def call() -> tuple[int, int]:
            async with self.raw.cursor() as cursor:
                await cursor.execute(sql, args)
                return int(cursor.rowcount), int(cursor.lastrowid or 0)

        return await self.run(call, timeout)

    async def closed_by_server(self, wait: float) -> bool:
        # An idle connection receives nothing, so end-of-stream (or any byte: an error packet before a
        # KILL) means the session, and with it the lock, is gone.
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
        self._closed = True
        self.raw.close()


class _MySQLElectionName(TypedDict):
    """The one option a MySQL election needs and a :class:`MySQLSession` does not take."""

    #: The election's name: the ``GET_LOCK`` name, at most 64 characters.
    name: str


class MySQLSessionOptions(SessionLockOptions, total=False):
    """The options of a MySQL/MariaDB election but its name: those a :class:`MySQLSession` takes."""

    #: Whole seconds of the session's ``wait_timeout``: the server drops a silent leader after it (default 10).
    lease: int
    #: Accept Galera and Group Replication, where ``GET_LOCK`` is per node (default False).
    allow_unsafe_topology: bool
    #: With ``fencing=True`` given, accept a server on which a crash may lose the last tokens (default False).
    allow_volatile_tokens: bool
    #: TLS context for the connections (else the DSN's ``ssl_mode``...; default none).
    ssl: _ssl.SSLContext | None


class MySQLOptions(_MySQLElectionName, MySQLSessionOptions, total=False):
    """The options of a MySQL/MariaDB election; :class:`MySQLBackend` validates them.

    ``poll_interval`` is the wait of one ``GET_LOCK`` request (at least a
    second on the server); ``fencing`` (on by default) keeps increasing
    tokens and the holders' identities in table ``aioelect_leaders``, which
    needs a database and CREATE, SELECT, INSERT and UPDATE on it. Tokens
    survive a crash only with ``innodb_flush_log_at_trx_commit=1`` (and
    ``sync_binlog=1`` where the binary log is on): otherwise the first
    campaign logs a WARNING, or, with ``fencing=True`` given, refuses
    (:class:`~aioelect.PermanentBackendError`) unless ``allow_volatile_tokens=True``.
    """


class MySQLBackend(SessionLockBackend[_MySQLConnection]):
    """``GET_LOCK`` elections on one MySQL/MariaDB server, built from a DSN and :class:`MySQLOptions`.

    The constructor validates every option (ValueError naming it, never the
    password) and connects to nothing.
    """

    kind = "mysql"
    dialect = Dialect(
        "MySQL",
        "MySQLElector",
        ("mysql", "mariadb"),
        3306,
        TimingRules("wait_timeout", min_lease=2, whole_lease=True),
    )

    def __init__(self, dsn: str | None = None, **options: Unpack[MySQLOptions]) -> None:
        where = read_options(dsn, options, MySQLOptions, self.dialect)
        if where.fencing and not where.database:
            raise ValueError(
                f"fencing tokens (on by default) need a database for their table {FENCING_TABLE}: add one to the DSN "
                "(mysql://user@host:port/DATABASE) or pass database=..., or pass fencing=False (--no-fencing for the "
                "aioelect command) to lead without tokens"
            )
        connect_args: dict[str, Any] = {
            "host": where.host,
            "port": where.port,
            "user": where.user or "root",
            "password": where.password or "",
        }
        if where.database:
            connect_args["db"] = where.database
        dsn_tls = tls_from_query(where.dsn.query) if where.dsn is not None else None
        ssl = options.get("ssl")
        if ssl is not None and where.dsn is not None and where.dsn.query:
            raise ValueError("give TLS settings either as ssl= or in the DSN, not both")
        if ssl is not None and not isinstance(ssl, _ssl.SSLContext):
            raise ValueError(f"ssl must be an ssl.SSLContext, not {type(ssl).__name__}")
        ssl = ssl if ssl is not None else dsn_tls
        if ssl is not None:
            connect_args["ssl"] = ssl
        super().__init__(validate_name(options["name"], max_length=_MAX_NAME), where.timing, (where.host, where.port))
        self._connect_args = connect_args
        self.fencing = where.fencing
        self.allow_unsafe_topology = options.get("allow_unsafe_topology", False)
        # Tokens asked for by name (not by default) must be durable, unless that is explicitly given up.
        self._durable_tokens_required = options.get("fencing") is True and not options.get(
            "allow_volatile_tokens", False
        )
        self._durability_checked = False
        self._topology_checked = False
        warning = transport_warning(
            where.host,
            encrypted=ssl is not None,
            verified=ssl is not None and ssl.verify_mode != _ssl.CERT_NONE,
            fix="add ?ssl_mode=VERIFY_IDENTITY&ssl_ca=PATH to the DSN, or pass ssl=",
        )
        if warning is not None:
            self.warnings.append(warning)

    # --- errors ----------------------------------------------------------------------

    def _permanent(self, exc: BaseException) -> bool:
        return _code(exc) in _PERMANENT or isinstance(
            exc, (pymysql.err.ProgrammingError, pymysql.err.NotSupportedError)
        )

    def _login_refused(self, exc: BaseException) -> bool:
        return _code(exc) in _LOGIN_REFUSED

    def _describe_driver_error(self, exc: BaseException) -> str | None:
        code = _code(exc)
        if code is not None and len(exc.args) > 1:
            return f"({code}) {exc.args[1]}"
        return None

    # --- connections -------------------------------------------------------------

    async def _open(self, purpose: str = "") -> _MySQLConnection:
        """A new connection; with TLS asked for, refused (:class:`TlsRequired`) unless its transport really is TLS."""
        tls = "ssl" in self._connect_args
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                args = {"connect_timeout": self.connect_timeout, "autocommit": True, **self._connect_args}
                if tls:
                    raw = _TlsOnlyConnection(**args)
                    await raw._connect()
                else:
                    raw = await aiomysql.connect(**args)
        except TimeoutError:
            raise pymysql.err.OperationalError(2003, f"connect timed out after {self.connect_timeout:g}s") from None
        if tls and not _encrypted(raw):  # checked again on the transport, whatever the driver did
            raw.close()
            raise _tls_required(self._connect_args["host"])
        return _MySQLConnection(raw)

    async def _connect(self, identity: str = "") -> _MySQLConnection:
        """A new dedicated connection with ``wait_timeout = lease``, topology checked."""
        conn = await self._open()
        try:
            lease = int(self.lease)
            await conn.scalar(_SET_TIMEOUTS, (lease, lease, lease), timeout=self.check_timeout)
            session_id, marked = (await conn.rows(_MARK, (conn.marker,), timeout=self.check_timeout))[0]
            conn.session_id, conn.marked = int(session_id), marked == 1
            if not self._topology_checked:
                await self._check_topology(conn)
                self._topology_checked = True
            if self.fencing and not self._durability_checked:
                await self._check_durability(conn)
                self._durability_checked = True
        except BaseException:
            conn.close()
            raise
        return conn

    async def _server_bounds(self, conn: _MySQLConnection) -> dict[str, float | None]:
        """The session's timeouts and MariaDB's TCP keepalives, as ``SHOW SESSION VARIABLES`` shows them."""
        rows = await conn.rows(_SHOW_BOUNDS, timeout=self.check_timeout)
        return server_bounds({str(name).lower(): float(value) for name, value in rows})

    async def _check_durability(self, conn: _MySQLConnection) -> None:
        """Refuse (``fencing=True`` given) or warn about a server on which a crash may lose the last token bumps."""
        flush, log_bin, sync_binlog = (await conn.rows(_DURABILITY, timeout=self.check_timeout))[0]
        problems = []
        if int(flush) != 1:
            lost = "a crash of the server" if int(flush) == 0 else "a crash of the server's host (or a power loss)"
            problems.append(f"innodb_flush_log_at_trx_commit={int(flush)}: {lost} can lose the last commits")
        if int(log_bin) and int(sync_binlog) != 1:
            problems.append(
                f"the binary log is on with sync_binlog={int(sync_binlog)}: a crash of the server's host can lose "
                "the last commits from it"
            )
        if not problems:
            return
        text = (
            f"fencing tokens in {FENCING_TABLE} may not survive a crash ({'; '.join(problems)}), so a leader after "
            "it may be given a token already handed out; set innodb_flush_log_at_trx_commit=1 (and sync_binlog=1 "
            "where the binary log is on)"
        )
        if self._durable_tokens_required:
            raise PermanentBackendError(
                f"{text}, or pass allow_volatile_tokens=True (the aioelect command: --allow-volatile-tokens, "
                "AIOELECT_ALLOW_VOLATILE_TOKENS=1) to accept it"
            )
        # Told, not refused: a token after a crash may repeat one this elector held, and is taken with a WARNING.
        self.tokens_may_repeat = True
        self.log.warning("%s", text)

    async def _check_topology(self, conn: _MySQLConnection) -> None:
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
            raise PermanentBackendError(
                "GET_LOCK is local to one server and not shared across cluster nodes: "
                + "; ".join(problems)
                + ". Point every candidate at the same single node, or pass allow_unsafe_topology=True (the aioelect "
                "command: --allow-unsafe-topology, AIOELECT_ALLOW_UNSAFE_TOPOLOGY=1)."
            )
        if problems:
            self.log.warning("unsafe topology allowed: %s", "; ".join(problems))

    async def _end_session(self, conn: _MySQLConnection, victim: _MySQLConnection) -> bool:
        """KILL ``victim``'s session only if the server shows its marker lock held under its id.

        The marker's name was drawn at random for ``victim`` and its lock dies
        with the session, so a session of a restarted server given the same
        id never holds it: no clock, no tolerance. The check and the KILL run
        on one connection, which a restart would break before the KILL, and a
        running server never reuses an id. Anything else (no marker, another
        holder, none) is a doubt: no KILL, the caller has closed its socket.
        """
        if not victim.marked:
            return False
        holder = await conn.scalar("SELECT IS_USED_LOCK(%s)", (victim.marker,), timeout=self.check_timeout)
        if holder is None or int(holder) != victim.session_id:
            return False
        await conn.scalar("KILL %s", (victim.session_id,), timeout=self.check_timeout)
        return True

    # --- the lock ----------------------------------------------------------------

    async def _request(self, conn: _MySQLConnection) -> bool:
        wait = math.ceil(max(self.poll_interval, _MIN_WAIT))
        got = await conn.scalar(
            "SELECT GET_LOCK(%s, %s)",
            (self.name, wait),
            timeout=wait + self.check_timeout,
            pending=Pending.LOCK_REQUEST,
        )
        if got is None:
            raise SessionLost("GET_LOCK was interrupted")
        return bool(got == 1)

    async def _try_request(self, conn: _MySQLConnection) -> bool:
        got = await conn.scalar(
            "SELECT GET_LOCK(%s, 0)",
            (self.name,),
            timeout=self.check_timeout,
            pending=Pending.LOCK_REQUEST,
        )
        if got is None:
            raise SessionLost("GET_LOCK was interrupted")
        return bool(got == 1)

    async def _held(self, conn: _MySQLConnection) -> bool:
        return bool(await conn.scalar(_HELD_BY_ME, (self.name,), timeout=self.check_timeout) == 1)

    async def _unlock(self, conn: _MySQLConnection) -> bool:
        return bool(await conn.scalar("SELECT RELEASE_LOCK(%s)", (self.name,), timeout=self.check_timeout) == 1)

    async def _granted(self, conn: _MySQLConnection, identity: str) -> int | None:
        """The check after the grant and, with fencing, the token bump in one statement."""
        if not self.fencing:
            if not await self._held(conn):
                raise SessionLost(self.not_held)
            return None
        try:
            return await self._bump_token(conn, identity)
        except pymysql.err.MySQLError as exc:
            refusal = _denied(exc)
            if refusal is None:
                raise
            database = self._connect_args.get("db")
            raise PermanentBackendError(
                f"fencing tokens (on by default) need the SELECT, INSERT and UPDATE privileges on table "
                f"{database}.{FENCING_TABLE}, and CREATE on database {database} unless the table exists already; "
                f"the server refused {refusal}: grant them (GRANT CREATE, SELECT, INSERT, UPDATE "
                f"ON {database}.* TO ...), or pass fencing=False (--no-fencing on the command line) to lead without "
                "tokens"
            ) from None

    async def _bump_token(self, conn: _MySQLConnection, identity: str) -> int:
        # Once per backend's sessions: a shared session sets the table up once for every election on it.
        if _FENCING_SET_UP not in self.sessions.prepared:
            try:
                with warnings.catch_warnings():  # "table already exists" is expected
                    warnings.simplefilter("ignore")
                    await conn.scalar(FENCING_DDL, timeout=self.check_timeout * 5)
            except pymysql.err.MySQLError as exc:
                if _code(exc) not in _DENIED:
                    raise
                # A role without CREATE (least privilege) can still use a table created for it beforehand.
                try:
                    await conn.scalar(f"SELECT 1 FROM {FENCING_TABLE} LIMIT 0", timeout=self.check_timeout)
                except pymysql.err.MySQLError:
                    raise exc from None
            if await conn.scalar(_NAME_TYPE, timeout=self.check_timeout) != "varbinary":
                await self._migrate_names(conn)
            # The floor row read by every bump: present, it is locked alone (absent, the read would lock a gap).
            await conn.write(_FLOOR_ROW, (), timeout=self.check_timeout)
            self.sessions.prepared.add(_FENCING_SET_UP)
        rows, token = await conn.write(_BUMP, (self.name, identity, self.name), timeout=self.check_timeout)
        if rows == 0:  # the check in the statement found the lock not held by our session: nothing written
            raise SessionLost(self.not_held)
        return token

    async def _migrate_names(self, conn: _MySQLConnection) -> None:
        """Alter a table whose names ignore case to binary names, keeping the largest token as the floor."""
        self.log.warning(
            "table %s compares names without regard to case: altering its name column to VARBINARY(64)",
            FENCING_TABLE,
        )
        # The floor before the change, and again after it: tokens the shared rows gave out in between count too.
        try:
            await conn.write(_FLOOR, (), timeout=self.check_timeout * 5)
            await conn.scalar(_TO_BINARY, timeout=self.check_timeout * 5)
            await conn.write(_FLOOR, (), timeout=self.check_timeout * 5)
        except pymysql.err.MySQLError as exc:
            refusal = _denied(exc)
            if refusal is None:
                raise
            table = f"{self._connect_args.get('db')}.{FENCING_TABLE}"
            raise PermanentBackendError(
                f"table {table} compares names without regard to case, so names that differ only in case would "
                f"share fencing tokens; aioelect alters it to binary names (keeping every token increasing) but the "
                f"server refused {refusal}: grant ALTER and INSERT on {table} for one start"
            ) from None

    # --- fenced state --------------------------------------------------------------

    def _new_state_store(self) -> StateStore:
        if not self.fencing:
            raise UsageError("fenced state on MySQL needs fencing tokens: fencing=False turns them off")
        return _MySQLStateStore(self)

    # --- who leads -----------------------------------------------------------------

    @property
    def records_identity(self) -> bool:
        return self.fencing

    async def _look(self, conn: _MySQLConnection) -> tuple[Any, str | None]:
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
            if _code(exc) not in (_NO_SUCH_TABLE, _NO_DATABASE_SELECTED):
                raise
            return holder, None
        return holder, identity

    async def _holder(self, conn: _MySQLConnection) -> Hashable:
        holder: Hashable = await conn.scalar("SELECT IS_USED_LOCK(%s)", (self.name,), timeout=self.check_timeout)
        return holder

    async def _unrecorded(self, conn: _MySQLConnection, holder: Any) -> str:
        host = await conn.scalar(
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = %s", (holder,), timeout=self.check_timeout
        )
        return f"connection {holder}" + (f" from {host}" if host else "")


class _MySQLStateStore(SqlStateStore[_MySQLConnection]):
    """Fenced state in table ``aioelect_state``, each write checked against the token row in its transaction."""

    def __init__(self, backend: MySQLBackend) -> None:
        super().__init__()
        self._b = backend

    async def _open(self) -> _MySQLConnection:
        b = self._b
        conn = await b._open("state")
        try:
            lease = int(b.lease)
            await conn.scalar(_SET_TIMEOUTS, (lease, lease, lease), timeout=b.check_timeout)
            try:
                with warnings.catch_warnings():  # "table already exists" is expected
                    warnings.simplefilter("ignore")
                    await conn.scalar(STATE_DDL, timeout=b.check_timeout * 5)
            except pymysql.err.MySQLError as exc:
                if _code(exc) not in _DENIED:
                    raise
                await conn.scalar(f"SELECT 1 FROM {STATE_TABLE} LIMIT 0", timeout=b.check_timeout)
        except pymysql.err.MySQLError as exc:
            conn.close()
            raise self._denied(exc) or exc from None
        except BaseException:
            conn.close()
            raise
        conn.interceptor = b.interceptor
        return conn

    def _denied(self, exc: BaseException) -> PermanentBackendError | None:
        refusal = _denied(exc)
        if refusal is None:
            return None
        database = self._b._connect_args.get("db")
        return PermanentBackendError(
            f"fenced state needs SELECT, INSERT and UPDATE on table {database}.{STATE_TABLE} (and CREATE on "
            f"database {database} unless it exists) and SELECT on {database}.{FENCING_TABLE}; the server refused "
            f"{refusal}"
        )

    def _close(self, conn: _MySQLConnection) -> None:
        conn.close()

    def _broken(self, conn: _MySQLConnection) -> bool:
        return conn.broken

    def _failure(self, exc: Exception, what: str) -> ElectionError:
        return self._denied(exc) or self._b.failure(exc, what)

    async def _read(self, conn: _MySQLConnection, key: str) -> bytes | None:
        value = await conn.scalar(_STATE_VALUE, (self._b.name, key), timeout=self._b.check_timeout)
        return None if value is None else bytes(value)

    async def _post(self, conn: _MySQLConnection, key: str, value: bytes) -> None:
        await conn.write(_STATE_PUT, (self._b.name, key, value.hex(), 0), timeout=self._b.check_timeout)

    async def _begin(self, conn: _MySQLConnection) -> None:
        await conn.scalar("START TRANSACTION", timeout=self._b.check_timeout)

    async def _newest_token(self, conn: _MySQLConnection) -> int | None:
        newest = await conn.scalar(_STATE_TOKEN, (self._b.name,), timeout=self._b.check_timeout)
        return None if newest is None else int(newest)

    async def _held_by(self, conn: _MySQLConnection, session: int) -> bool:
        holder = await conn.scalar("SELECT IS_USED_LOCK(%s)", (self._b.name,), timeout=self._b.check_timeout)
        return holder is not None and int(holder) == session

    async def _locked_value(self, conn: _MySQLConnection, key: str) -> bytes | None:
        stored = await conn.scalar(_STATE_VALUE + " FOR UPDATE", (self._b.name, key), timeout=self._b.check_timeout)
        return None if stored is None else bytes(stored)

    async def _put(self, conn: _MySQLConnection, key: str, value: bytes, token: int) -> None:
        # As hex digits: the bytes arrive as they are, whatever the connection's character set.
        await conn.write(_STATE_PUT, (self._b.name, key, value.hex(), token), timeout=self._b.check_timeout)

    async def _end(self, conn: _MySQLConnection, *, commit: bool) -> None:
        await conn.scalar("COMMIT" if commit else "ROLLBACK", timeout=self._b.check_timeout)


#: Locks one check statement confirms at most (MySQL allows 4,096 columns in a result).
_CHECK_BATCH = 1000


class MySQLSession(SharedLockSession[_MySQLConnection]):
    """One MySQL/MariaDB connection holding the ``GET_LOCK`` of every elector of a process on it.

    Opt-in, as :class:`~aioelect.EtcdSession` is for etcd::

        async with aioelect.MySQLSession(dsn, lease=5) as session:
            jobs = aioelect.MySQLElector(session=session, name="jobs")
            mail = aioelect.MySQLElector(session=session, name="mail")

    The options are those of :class:`~aioelect.MySQLElector` but ``name``
    (:class:`MySQLSessionOptions`), validated here; an elector on the session
    takes only ``name`` (with ``identity``, by default the session's, and
    ``stop_timeout``). MySQL 5.7 and MariaDB 10.0.2 or later hold many locks per
    session.

    Guarantees:

    * one connection on the server for the whole session, however many
      electors use it, opened as an elector's lock connection is
      (``wait_timeout = lease``, every server-side bound checked, TLS as
      configured, the topology and the tokens' durability checked);
    * one check statement per ``check_interval`` confirms every lock held
      on the session (up to 1,000 per statement), each leadership confirmed
      from the time it was sent; a check that fails or times out ends them
      all;
    * waiting electors never wait on the server, so they never block the
      connection: one statement per ``poll_interval`` reads the holder of
      every lock they wait for (``IS_USED_LOCK``, up to 1,000 per
      statement), and an elector asks ``GET_LOCK(name, 0)`` only when its
      lock shows free. A handover costs up to ``poll_interval`` (MySQL has
      no notice of a release, and a ``GET_LOCK`` that waits would hold the
      shared connection for every other elector);
    * **fate sharing**, what the session gives up: when the connection is
      lost (closed by the server, a failed check, a release the server did
      not answer), every elector on it loses its leadership at once, and
      campaigns again on a new connection. Logged at WARNING when the
      session is entered and each time a connection holding leaderships is
      lost;
    * at most one elector per election ``name`` (ValueError for a second);
    * leaving the ``async with`` (or :meth:`aclose`) closes every elector
      still on the session first, then the connection; idempotent, bounded,
      never interrupted by cancellation;
    * entering opens the connection: :class:`~aioelect.BackendUnavailable`
      if the server cannot be reached, :class:`~aioelect.PermanentBackendError` for
      a refusal (credentials, TLS, a server-side bound shorter than
      ``lease``).
    """

    who = "MySQLSession"
    options_spec = MySQLSessionOptions
    backend_class = MySQLBackend

    def __init__(
        self, dsn: str | None = None, *, identity: str | None = None, **options: Unpack[MySQLSessionOptions]
    ) -> None:
        super().__init__(dsn, identity, options)

    def _on_end(self, conn: _MySQLConnection, ended: Callable[[], None]) -> None:
        conn.on_end(ended)

    async def _held_many(
        self, conn: _MySQLConnection, backends: list[SessionLockBackend[_MySQLConnection]]
    ) -> frozenset[str]:
        if not backends:
            await conn.scalar("SELECT 1", timeout=self.template.check_timeout)
            return frozenset()
        return held_names(backends, await self._per_name(conn, "IS_USED_LOCK(%s) = CONNECTION_ID()", backends))

    async def _holders_many(
        self, conn: _MySQLConnection, backends: list[SessionLockBackend[_MySQLConnection]]
    ) -> dict[str, Hashable]:
        answers = await self._per_name(conn, "IS_USED_LOCK(%s)", backends)
        return {b.name: holder for b, holder in zip(backends, answers, strict=True)}

    async def _per_name(
        self, conn: _MySQLConnection, expression: str, backends: list[SessionLockBackend[_MySQLConnection]]
    ) -> list[Any]:
        """``expression`` of each backend's name, up to :data:`_CHECK_BATCH` names per statement."""
        answers: list[Any] = []
        for start in range(0, len(backends), _CHECK_BATCH):
            part = backends[start : start + _CHECK_BATCH]
            sql = "SELECT " + ", ".join([expression] * len(part))
            rows = await conn.rows(sql, [b.name for b in part], timeout=self.template.check_timeout)
            answers.extend(rows[0])
        return answers
