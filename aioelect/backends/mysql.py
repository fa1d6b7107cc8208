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

This module is the MySQL dialect of :mod:`aioelect.backends._session_lock`,
which owns the campaign, the hold, release and the error classification. It
owns the statements, the error codes, how to connect (aiomysql, TLS from the
DSN or ``ssl=``), the refusal of cluster topologies where ``GET_LOCK`` is per
node, and the ``aioelect_leaders`` table of tokens and identities.
"""

from __future__ import annotations

import math
import ssl as _ssl
import warnings
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import anyio

from .._config import transport_warning, validate_name
from .._errors import ElectionError
from ._mysql_tls import tls_from_query
from ._session_lock import Dialect, LockConnection, SessionLockBackend, SessionLockOptions, SessionLost, read_options

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
# The check after a grant and the token bump in one statement: the row is written only if our
# session holds the lock (else 0 rows are affected), and LAST_INSERT_ID(expr) makes the server
# report the new token in the statement's answer (its insert id), so no SELECT follows.
_BUMP = (
    f"INSERT INTO {FENCING_TABLE} (name, token, holder, connection_id) "
    "SELECT %s, LAST_INSERT_ID(1), %s, CONNECTION_ID() FROM DUAL WHERE IS_USED_LOCK(%s) = CONNECTION_ID() "
    "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = VALUES(holder), "
    "connection_id = VALUES(connection_id), acquired_at = CURRENT_TIMESTAMP(6)"
)


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


class _Connection(LockConnection):
    """One aiomysql connection; :attr:`session_id` is its ``CONNECTION_ID()``."""

    def __init__(self, raw: aiomysql.Connection) -> None:
        self.raw = raw
        self._closed = False

    @property
    def broken(self) -> bool:
        return self._closed

    def leaves_clean(self, exc: BaseException) -> bool:
        code = _code(exc)
        return code is not None and code < 2000  # 2000 and up: client-side errors

    async def scalar(self, sql: str, args: Sequence[Any] = (), *, timeout: float) -> Any:  # noqa: ASYNC109
        """The first value of ``sql``'s first row (None without a row)."""

        async def call() -> Any:
            async with self.raw.cursor() as cursor:
                await cursor.execute(sql, args)
                return await cursor.fetchone()

        row = await self.run(call, timeout)
        return None if row is None else row[0]

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


class _Named(TypedDict):
    #: The election's name: the ``GET_LOCK`` name, at most 64 characters.
    name: str


class MySQLOptions(_Named, SessionLockOptions, total=False):
    """The options of a MySQL/MariaDB election; :class:`MySQLBackend` validates them.

    ``poll_interval`` is the wait of one ``GET_LOCK`` request (at least a
    second on the server); ``fencing`` (on by default) keeps increasing
    tokens and the holders' identities in table ``aioelect_leaders``, which
    needs a database and CREATE, SELECT, INSERT and UPDATE on it.
    """

    #: Whole seconds of the session's ``wait_timeout``: the server drops a silent leader after it (default 10).
    lease: int
    #: Accept Galera and Group Replication, where ``GET_LOCK`` is per node (default False).
    allow_unsafe_topology: bool
    #: TLS context for the connections (else the DSN's ``ssl_mode``...; default none).
    ssl: _ssl.SSLContext | None


class MySQLBackend(SessionLockBackend[_Connection]):
    """``GET_LOCK`` elections on one MySQL/MariaDB server, built from a DSN and :class:`MySQLOptions`.

    The constructor validates every option (ValueError naming it, never the
    password) and connects to nothing.
    """

    kind = "mysql"
    dialect = Dialect(
        "MySQL", "MySQLElector", ("mysql", "mariadb"), 3306, "wait_timeout", min_lease=2, whole_lease=True
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
        self._topology_checked = False
        self._fencing_ready = False
        warning = transport_warning(
            where.host,
            encrypted=ssl is not None,
            verified=ssl is not None and ssl.verify_mode != _ssl.CERT_NONE,
            fix="add ?ssl_mode=VERIFY_IDENTITY&ssl_ca=PATH to the DSN, or pass ssl=",
        )
        if warning is not None:
            self.warnings.append(warning)

    # --- errors ----------------------------------------------------------------------

    def _refused(self, exc: BaseException) -> bool:
        return _code(exc) in _PERMANENT or isinstance(
            exc, (pymysql.err.ProgrammingError, pymysql.err.NotSupportedError)
        )

    def _describe_driver_error(self, exc: BaseException) -> str | None:
        code = _code(exc)
        if code is not None and len(exc.args) > 1:
            return f"({code}) {exc.args[1]}"
        return None

    # --- connections -------------------------------------------------------------

    async def _open(self, purpose: str = "") -> _Connection:
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                raw = await aiomysql.connect(
                    connect_timeout=self.connect_timeout, autocommit=True, **self._connect_args
                )
        except TimeoutError:
            raise pymysql.err.OperationalError(2003, f"connect timed out after {self.connect_timeout:g}s") from None
        return _Connection(raw)

    async def _connect(self, identity: str = "") -> _Connection:
        """A new dedicated connection with ``wait_timeout = lease``, topology checked."""
        conn = await self._open()
        try:
            conn.session_id = int(conn.raw.server_thread_id[0])  # CONNECTION_ID(), from the handshake
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

    async def _end_session(self, conn: _Connection, session_id: int) -> None:
        await conn.scalar("KILL %s", (session_id,), timeout=self.check_timeout)

    # --- the lock ----------------------------------------------------------------

    async def _request(self, conn: _Connection) -> bool:
        wait = math.ceil(max(self.poll_interval, _MIN_WAIT))
        got = await conn.scalar("SELECT GET_LOCK(%s, %s)", (self.name, wait), timeout=wait + self.check_timeout)
        if got is None:
            raise SessionLost("GET_LOCK was interrupted")
        return bool(got == 1)

    async def _try_request(self, conn: _Connection) -> bool:
        got = await conn.scalar("SELECT GET_LOCK(%s, 0)", (self.name,), timeout=self.check_timeout)
        if got is None:
            raise SessionLost("GET_LOCK was interrupted")
        return bool(got == 1)

    async def _held(self, conn: _Connection) -> bool:
        return bool(await conn.scalar(_HELD_BY_ME, (self.name,), timeout=self.check_timeout) == 1)

    async def _unlock(self, conn: _Connection) -> bool:
        return bool(await conn.scalar("SELECT RELEASE_LOCK(%s)", (self.name,), timeout=self.check_timeout) == 1)

    async def _granted(self, conn: _Connection, identity: str) -> int | None:
        """The check after the grant and, with fencing, the token bump in one statement."""
        if not self.fencing:
            if not await self._held(conn):
                raise SessionLost(self.not_held)
            return None
        try:
            return await self._bump_token(conn, identity)
        except pymysql.err.MySQLError as exc:
            if _code(exc) not in _DENIED:
                raise
            database = self._connect_args.get("db")
            raise ElectionError(
                f"fencing tokens (on by default) need the SELECT, INSERT and UPDATE privileges on table "
                f"{database}.{FENCING_TABLE}, and CREATE on database {database} unless the table exists already; "
                f"the server refused ({exc.args[0]}) {exc.args[1]}: grant them (GRANT CREATE, SELECT, INSERT, UPDATE "
                f"ON {database}.* TO ...), or pass fencing=False (--no-fencing on the command line) to lead without "
                "tokens"
            ) from None

    async def _bump_token(self, conn: _Connection, identity: str) -> int:
        if not self._fencing_ready:
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
            self._fencing_ready = True
        rows, token = await conn.write(_BUMP, (self.name, identity, self.name), timeout=self.check_timeout)
        if rows == 0:  # the check in the statement found the lock not held by our session: nothing written
            raise SessionLost(self.not_held)
        return token

    # --- who leads -----------------------------------------------------------------

    @property
    def records_identity(self) -> bool:
        return self.fencing

    async def _look(self, conn: _Connection) -> tuple[Any, str | None]:
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

    async def _holder(self, conn: _Connection) -> Hashable:
        holder: Hashable = await conn.scalar("SELECT IS_USED_LOCK(%s)", (self.name,), timeout=self.check_timeout)
        return holder

    async def _unrecorded(self, conn: _Connection, holder: Any) -> str:
        host = await conn.scalar(
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = %s", (holder,), timeout=self.check_timeout
        )
        return f"connection {holder}" + (f" from {host}" if host else "")
