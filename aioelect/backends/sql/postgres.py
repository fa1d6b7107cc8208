"""PostgreSQL backend: a session-level advisory lock held on a dedicated connection.

The lock lives exactly as long as the server session that took it, so:

* each elector opens its own connection (never pooled, never through a
  transaction-pooling proxy such as PgBouncer in transaction mode) and never
  reconnects it silently: a new session does not hold the lock;
* the lock key is :func:`advisory_key` of ``name``: the first 8 bytes of the
  SHA-256 of the UTF-8 name, read as a signed big-endian 64-bit integer, so
  any language (or SQL, see :data:`KEY_SQL`) computes the same key. Advisory
  locks are per database: every candidate must use the same database;
* followers wait inside ``pg_advisory_lock(key)`` under ``lock_timeout =
  poll_interval``, so they wake the moment the lock is freed (a release, or
  the leader's session ending) instead of at their next poll. The wait runs
  in a temporary function of the session (``pg_temp.aioelect_wait``) that
  returns, at the timeout, the holder instead of an error: one statement per
  ``poll_interval``, the look at the holder included (a role without TEMP
  on the database waits with the plain call, and looks after it);
* the leader confirms on its connection, every ``check_interval``, that
  ``pg_locks`` shows the lock granted to its own ``pg_backend_pid()``; a
  failed, slow or negative check is a loss, and so is the connection closing
  (noticed at once);
* the session's ``idle_session_timeout`` (PostgreSQL 14+) is set to
  ``lease``: the server itself ends a leader that has gone silent (frozen,
  cut off) after ``lease`` seconds and a follower takes over. Every
  statement the leader sends while holding the lock is prepared before the
  lock is taken, so its session is never left half-way through a protocol
  exchange (where that timeout is not armed) whenever the process stops.
  TCP keepalives (``tcp_keepalives_*``) are set too, so that they never end
  the session before ``lease``; they only detect a dead or unreachable
  client host, never a stopped process whose kernel answers;
* every server-side bound on the lock session (``idle_session_timeout``,
  ``idle_in_transaction_session_timeout``, the keepalives,
  ``tcp_user_timeout``: whatever set them, the startup packet, a role, a
  database or the server) is read from ``pg_settings`` at connect, and a
  session with one shorter than ``lease`` is refused, the bound named;
* the identity is the session's ``application_name`` (truncated to 63
  bytes), visible in ``pg_stat_activity``;
* with ``fencing=True`` a leadership's token is the server's transaction id
  (``pg_current_xact_id()``), taken after the lock is held and written to
  the WAL before it is handed out: it needs no table and no privilege, and
  transaction ids only grow;
* with ``schema=`` each leader also records its full identity and token in
  ``<schema>.aioelect_leaders``, a table the connecting role must own;
* every session runs with ``search_path = pg_catalog, pg_temp`` and every
  name is schema-qualified: nothing another role creates can stand in for
  what aioelect calls.

This module is the PostgreSQL dialect of :mod:`aioelect.backends.sql._session_lock`,
which owns the campaign, the hold, release and the error classification. It
owns the statements, the SQLSTATEs no retry can fix, how to connect (asyncpg,
with :mod:`aioelect.backends.sql._postgres_tls` for ``sslmode``), the session
settings, the refusal of standbys, the tokens and the leaders table.
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
import ssl as _ssl
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypedDict

import anyio

from ...core._backend import StateStore
from ...core._config import TimingRules, keepalive_bound, session_bounds, transport_warning, validate_name
from ...core._errors import ElectionError, PermanentBackendError, UsageError
from ._postgres_table import (
    FENCING_TABLE,
    ensure_state_table,
    ensure_table,
    fencing_ddl,
    record_sql,
    recorded_holder_sql,
    state_sql,
    table_usable,
)
from ._postgres_tls import TLS_FILES, Tls, no_tls, resolve_tls, transport_fix
from ._postgres_wire import EndWatch
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
    tls_error,
)
from ._shared_lock import SharedLockSession
from ._state import SqlStateStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'aioelect[postgres]'") from exc

__all__ = [
    "PostgresBackend",
    "PostgresOptions",
    "PostgresSession",
    "PostgresSessionOptions",
    "advisory_key",
    "application_name",
    "lock_ids",
    "KEY_SQL",
    "FENCING_TABLE",
    "fencing_ddl",
]

#: The same key as :func:`advisory_key`, computed by PostgreSQL 11+ from the name in ``$1``.
KEY_SQL = "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint"

#: application_name is cut by the server at NAMEDATALEN - 1 bytes.
_MAX_APPLICATION_NAME = 63
_MAX_IDENTIFIER = 63
#: Functions and operators resolve in pg_catalog only; relations are always written schema-qualified.
_SEARCH_PATH = "pg_catalog, pg_temp"
_CURRENT_DB = "(SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())"
# A bigint advisory lock shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
_LOCK_ROW = f"locktype = 'advisory' AND database = {_CURRENT_DB} AND classid = $1 AND objid = $2 AND objsubid = 1"
_HELD_EXPR = (
    f"EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE {_LOCK_ROW} AND granted AND pid = pg_catalog.pg_backend_pid())"
)
_HELD_BY_ME = f"SELECT {_HELD_EXPR}"
#: Whether the session with pid $3 holds the election's lock (a fenced state write checks its writer's).
_HELD_BY_SESSION = f"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE {_LOCK_ROW} AND granted AND pid = $3)"
_HOLDER = f"""SELECT l.pid, a.application_name, a.backend_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = {_CURRENT_DB} AND l.classid = $1 AND l.objid = $2
  AND l.objsubid = 1 AND l.granted
LIMIT 1"""
_LOCK = "SELECT pg_catalog.pg_advisory_lock($1)"
# A waiter's lock request that returns a value instead of a lock_timeout error, and on a timeout the holder as
# _HOLDER shows it: one statement per poll_interval, the holder's look included. A temporary function (dropped
# with the session) needs no privilege but TEMP on the database, granted to PUBLIC by default.
_WAIT_FUNCTION = f"""CREATE OR REPLACE FUNCTION
  pg_temp.aioelect_wait(k pg_catalog.int8, c pg_catalog.oid, o pg_catalog.oid)
RETURNS TABLE (got pg_catalog.bool, pid pg_catalog.int4, application_name pg_catalog.text,
  backend_start pg_catalog.timestamptz)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  got := false;
  BEGIN
    PERFORM pg_catalog.pg_advisory_lock(k);
    got := true;
  EXCEPTION WHEN lock_not_available THEN
    SELECT l.pid, a.application_name, a.backend_start INTO pid, application_name, backend_start
    FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.database = {_CURRENT_DB} AND l.classid = c AND l.objid = o
      AND l.objsubid = 1 AND l.granted
    LIMIT 1;
  END;
  RETURN NEXT;
END
$f$"""
_WAIT = "SELECT got, pid, application_name, backend_start FROM pg_temp.aioelect_wait($1, $2, $3)"
_UNLOCK = "SELECT pg_catalog.pg_advisory_unlock($1)"
_TRY_LOCK = "SELECT pg_catalog.pg_try_advisory_lock($1)"
# The check after a grant and the token in one statement: whether our session holds the lock, and
# this statement's transaction id. A transaction that only takes an id commits without flushing the
# WAL, so a crash right after could hand the same id out again; the transactional logical message
# makes the commit write WAL, so a synchronous commit flushes it (and waits for synchronous standbys)
# before the answer returns. A token taken while the check fails is never used.
_EMIT = "pg_catalog.pg_logical_emit_message(true, 'aioelect', ''::pg_catalog.text)"
_TOKEN = f"SELECT {_HELD_EXPR}, pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8, {_EMIT}"
_TOKEN_BEFORE_13 = f"SELECT {_HELD_EXPR}, pg_catalog.txid_current(), {_EMIT}"
_MESSAGE_FUNCTION = "pg_catalog.pg_logical_emit_message(boolean, pg_catalog.text, pg_catalog.text)"
_READY = (
    "SELECT pg_catalog.pg_is_in_recovery() AS standby, "
    f"pg_catalog.has_function_privilege('{_MESSAGE_FUNCTION}', 'EXECUTE') AS can_token, "
    "(SELECT backend_start FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()) AS backend_start, "
    "pg_catalog.pg_backend_pid() AS pid, pg_catalog.current_setting('search_path') AS search_path"
)
# The pooler check's lock ($1: a key drawn at random), taken without waiting; with the backend that ran it.
_PROBE_LOCK = "SELECT pg_catalog.pg_try_advisory_lock($1) AS got, pg_catalog.pg_backend_pid() AS pid"
# Ends backend $1 only if it started at $2 (the pid alone may now be another backend's); waits up to $3 ms.
_OURS = "FROM pg_catalog.pg_stat_activity WHERE pid = $1 AND backend_start = $2"
_TERMINATE = f"SELECT pg_catalog.pg_terminate_backend(pid, $3) {_OURS}"
_TERMINATE_BEFORE_14 = f"SELECT pg_catalog.pg_terminate_backend(pid) {_OURS}"
# Errors that no retry can fix: authentication, unknown database, privileges, SQL, client configuration.
_PERMANENT: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,  # includes InvalidPasswordError, no pg_hba entry
    asyncpg.InvalidCatalogNameError,
    asyncpg.exceptions.SyntaxOrAccessError,  # includes InsufficientPrivilegeError
    asyncpg.exceptions.ClientConfigurationError,
    asyncpg.FeatureNotSupportedError,
)


def advisory_key(name: str) -> int:
    """The advisory lock key of ``name``: SHA-256 of its UTF-8 bytes, first 8 bytes as a signed big-endian int64."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


def lock_ids(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` shows the bigint advisory lock ``key`` (with objsubid 1)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def application_name(identity: str) -> str:
    """The identity as PostgreSQL keeps it in ``application_name``: at most 63 bytes."""
    return identity.encode("utf-8")[:_MAX_APPLICATION_NAME].decode("utf-8", "ignore")


def _try_next(plan: Tls, attempt: _ssl.SSLContext | bool, exc: BaseException) -> bool:
    """Whether libpq would make the plan's next attempt after ``attempt`` failed with ``exc``.

    On a server error (authentication, pg_hba) for both ``allow`` and
    ``prefer``; for ``prefer``, also when the server has no TLS or the TLS
    handshake failed. Never on a timeout or an unreachable server.
    """
    if isinstance(exc, asyncpg.PostgresError):
        return True
    return attempt is not False and (isinstance(exc, TlsRequired) or tls_error(exc) is not None)


#: The settings after which the server may end a session it no longer hears from (those it has).
_BOUND_SETTINGS = (
    "idle_session_timeout",
    "idle_in_transaction_session_timeout",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
)
_BOUNDS = """SELECT name, setting::pg_catalog.float8 * CASE unit WHEN 'ms' THEN 0.001 WHEN 'min' THEN 60 ELSE 1 END
  AS seconds FROM pg_catalog.pg_settings WHERE name = ANY($1::pg_catalog.text[])"""


def keepalives(lease: float) -> tuple[int, int, int]:
    """``(tcp_keepalives_idle, tcp_keepalives_interval, tcp_keepalives_count)`` of a lock session.

    The first probe is sent once the connection has been silent for
    ``lease`` (rounded up to whole seconds, the setting's unit), so the
    server never drops an unreachable client before ``lease``; three probes
    a tenth of the lease apart (at least a second) then confirm it is gone.
    """
    return math.ceil(lease), max(1, math.ceil(lease / 10)), 3


def server_bounds(settings: dict[str, float]) -> dict[str, float | None]:
    """Every server-side bound of a session whose ``pg_settings`` (name -> seconds, 0: off) are ``settings``.

    A setting the server does not have (``idle_session_timeout`` before
    PostgreSQL 14) is off. A keepalive idle of 0 is the kernel's default
    (Linux: 2 hours), taken as off.
    """

    return session_bounds(
        settings,
        ("idle_session_timeout", "idle_in_transaction_session_timeout", "tcp_user_timeout"),
        ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"),
    )


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _settings_14(lease_ms: str) -> dict[str, str]:
    """The lock session's settings that PostgreSQL 14 introduced."""
    return {
        # The bound on a frozen leader: the server ends a session idle for longer than lease.
        "idle_session_timeout": lease_ms,
        # A backend waiting on the lock notices a vanished client within a second.
        "client_connection_check_interval": "1000",
    }


class _PostgresConnection(LockConnection):
    """One asyncpg connection; :attr:`session_id` is its ``pg_backend_pid()``.

    The lock connection runs nothing but :attr:`statements` while it holds the
    lock (see :meth:`PostgresBackend._connect`).
    """

    def __init__(self, raw: asyncpg.Connection) -> None:
        self.raw = raw
        self.session_id = raw.get_server_pid()
        #: When the server started this session's backend (read at connect): with the pid, it names the session.
        self.backend_start: Any = None
        self.server_version: int = raw.get_server_version().major
        #: Statements prepared before the lock is taken, by SQL text.
        self.statements: dict[str, Any] = {}
        #: The leaders table was found usable on this session (checked on it once, before it is first read).
        self.leaders_table_ok = False
        #: Whether lock requests wait through :data:`_WAIT` (None: not tried yet on this session).
        self.waits: bool | None = None
        #: The holder the last lock request that timed out saw (as :data:`_HOLDER`'s row), until it is read.
        self.seen_holder: Any = None
        #: Set at the first sign of the session's end: the server's FATAL message (sent before it frees the
        #: session's locks), the end of the stream, or asyncpg seeing the connection end (network, our close).
        self.ended = anyio.Event()
        self._when_ended: list[Callable[[], None]] = []
        raw.add_termination_listener(lambda _raw: self._on_end())
        transport = getattr(raw, "_transport", None)
        if transport is not None:  # connected and idle: the watch starts at a message's start
            transport.set_protocol(EndWatch(transport.get_protocol(), self._on_end))

    def _on_end(self) -> None:
        if self.ended.is_set():
            return
        self.ended.set()
        for ended in self._when_ended:
            ended()

    def on_end(self, ended: Callable[[], None]) -> None:
        """Call ``ended`` (once) at the first sign of the session's end, as :attr:`ended` is set."""
        self._when_ended.append(ended)

    @property
    def broken(self) -> bool:
        return self.ended.is_set() or bool(self.raw.is_closed())

    def descriptor(self) -> int | None:
        return socket_fd(self.raw)

    def leaves_clean(self, exc: BaseException) -> bool:
        return isinstance(exc, asyncpg.PostgresError) and not isinstance(
            exc, (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)
        )

    async def closed_by_server(self, wait: float) -> bool:
        with anyio.move_on_after(wait):
            await self.ended.wait()
            return True
        return False

    async def fetchval(
        self,
        sql: str,
        *args: Any,
        timeout: float,  # noqa: ASYNC109
        pending: Pending = Pending.NOTHING,
    ) -> Any:
        """First value of ``sql``'s first row: its prepared statement if there is one, else ad hoc.

        ``pending`` as :meth:`LockConnection.run`.
        """
        return await self._fetch("fetchval", sql, args, timeout, pending)

    async def fetch(self, sql: str, *args: Any, timeout: float) -> list[Any]:  # noqa: ASYNC109
        """All rows of ``sql``, prepared or ad hoc as :meth:`fetchval`."""
        rows: list[Any] = await self._fetch("fetch", sql, args, timeout)
        return rows

    async def fetchrow(
        self,
        sql: str,
        *args: Any,
        timeout: float,  # noqa: ASYNC109
        pending: Pending = Pending.NOTHING,
    ) -> Any:
        """``sql``'s first row (None without one), prepared or ad hoc as :meth:`fetchval`."""
        return await self._fetch("fetchrow", sql, args, timeout, pending)

    async def _fetch(
        self,
        method: str,
        sql: str,
        args: tuple[Any, ...],
        timeout: float,  # noqa: ASYNC109
        pending: Pending = Pending.NOTHING,
    ) -> Any:
        statement = self.statements.get(sql)
        if statement is not None:
            call = functools.partial(getattr(statement, method), *args)
        else:
            call = functools.partial(getattr(self.raw, method), sql, *args)
        return await self.run(call, timeout, pending)

    async def execute(self, sql: str, *, timeout: float) -> None:  # noqa: ASYNC109
        """Run parameterless ``sql`` with the simple protocol (several statements allowed)."""
        await self.run(lambda: self.raw.execute(sql), timeout)

    async def prepare(self, *sqls: str, timeout: float) -> None:  # noqa: ASYNC109
        for sql in sqls:
            self.statements[sql] = await self.run(functools.partial(self.raw.prepare, sql), timeout)

    def close(self) -> None:
        self.raw.terminate()

    async def aclose(self, timeout: float) -> None:  # noqa: ASYNC109
        """Close politely (a Terminate message, so the server logs no error), or drop it."""
        if self.broken:
            self.close()
            return
        try:
            with anyio.move_on_after(timeout, shield=True):
                await self.raw.close()
        except Exception:
            pass
        finally:
            self.close()


class _PostgresElectionName(TypedDict):
    """The one option a PostgreSQL election needs and a :class:`PostgresSession` does not take."""

    #: The election's name; the advisory lock's key is derived from it.
    name: str


class PostgresSessionOptions(SessionLockOptions, total=False):
    """The options of a PostgreSQL election but its name: those a :class:`PostgresSession` takes."""

    #: Seconds of the session's ``idle_session_timeout``: the server ends a silent leader's session (default 10).
    lease: float
    #: Schema of the ``aioelect_leaders`` table that records full identities (default none: no table).
    schema: str | None
    #: An sslmode (``"verify-full"``...) or a TLS context (default: the DSN's, ``PGSSLMODE``, else ``prefer``).
    ssl: _ssl.SSLContext | str | None


class PostgresOptions(_PostgresElectionName, PostgresSessionOptions, total=False):
    """The options of a PostgreSQL election; :class:`PostgresBackend` validates them.

    ``fencing=True`` gives each leadership a token, the server's transaction id.
    """


class PostgresBackend(SessionLockBackend[_PostgresConnection]):
    """Advisory-lock elections on one PostgreSQL primary, built from a DSN and :class:`PostgresOptions`.

    The constructor validates every option (ValueError naming it, never the
    password), resolves TLS as libpq does, and connects to nothing.
    """

    kind = "postgres"
    dialect = Dialect(
        "PostgreSQL",
        "PostgresElector",
        ("postgresql", "postgres"),
        5432,
        TimingRules("idle_session_timeout", min_lease=1, whole_lease=False),
    )
    lost_session = "lock connection closed (session terminated, server restarted or network lost)"
    lost_lock = "advisory lock is no longer held by our session"

    def __init__(self, dsn: str | None = None, **options: Unpack[PostgresOptions]) -> None:
        where = read_options(dsn, options, PostgresOptions, self.dialect)
        query = dict(where.dsn.query) if where.dsn else {}
        tls = {k: query.pop(k) for k in ("sslmode", *TLS_FILES) if k in query}
        if query:
            raise ValueError(
                f"unsupported DSN parameter(s): {', '.join(sorted(query))} "
                "(read: sslmode, sslrootcert, sslcert, sslkey)"
            )
        ssl = options.get("ssl")
        if ssl is not None and not isinstance(ssl, (str, _ssl.SSLContext)):
            raise ValueError("ssl must be an ssl.SSLContext or an sslmode string")
        plan = resolve_tls(tls, ssl, where.host)
        schema = options.get("schema")
        if schema is not None:
            if not isinstance(schema, str) or not schema or "\x00" in schema:
                raise ValueError(f"schema must be a non-empty schema name or None, not {schema!r}")
            if len(schema.encode("utf-8")) > _MAX_IDENTIFIER:
                raise ValueError(f"schema must be at most {_MAX_IDENTIFIER} bytes long (PostgreSQL's NAMEDATALEN)")
        connect_args: dict[str, Any] = {
            "host": where.host,
            "port": where.port,
            "user": where.user or "postgres",
            "password": where.password,
            "database": where.database,
        }
        name = validate_name(options["name"])
        super().__init__(name, where.timing, (where.host, where.port))
        self._connect_args = connect_args
        self._tls = plan
        self.key = advisory_key(name)
        self.classid, self.objid = lock_ids(self.key)
        self.fencing = where.fencing
        self.schema = schema
        self._warned_old_server = False
        self._pooling_checked = False
        #: The server's major version once a lock connection has shown it (its settings depend on it).
        self._server_version: int | None = None
        self._keepalive = keepalives(self.lease)
        # prefer: TLS whenever the server offers it, but an attacker can refuse TLS or present any
        # certificate and get plaintext, so it is never verified.
        encrypted, verified = (True, False) if plan.mode == "prefer" else (plan.encrypted, plan.verified)
        warning = transport_warning(where.host, encrypted=encrypted, verified=verified, fix=transport_fix(plan))
        if warning is not None:
            self.warnings.append(warning)

    def describe_timing(self) -> str:
        return f"key={self.key} " + super().describe_timing()

    # --- errors ----------------------------------------------------------------------

    def _permanent(self, exc: BaseException) -> bool:
        return isinstance(exc, _PERMANENT)

    def _login_refused(self, exc: BaseException) -> bool:
        # 28000 (no pg_hba entry, a role that may not log in) and 28P01 (wrong password).
        return isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError)

    def _describe_driver_error(self, exc: BaseException) -> str | None:
        if isinstance(exc, asyncpg.PostgresError):
            return f"({exc.sqlstate}) {exc}"
        return None

    # --- connections -------------------------------------------------------------

    async def _open(self, purpose: str) -> _PostgresConnection:
        """A new connection named ``aioelect-<purpose>`` in ``pg_stat_activity``."""
        return await self._open_as(f"aioelect-{purpose}")

    async def _open_as(self, app: str, settings: dict[str, str] | None = None) -> _PostgresConnection:
        """A new connection, ``settings`` in its startup packet, encrypted as the sslmode says (libpq's fallbacks)."""
        *first, last = self._tls.attempts
        for attempt, then in zip(first, self._tls.attempts[1:], strict=True):
            try:
                return await self._open_once(app, attempt, settings or {})
            except Exception as exc:
                if not _try_next(self._tls, attempt, exc):
                    raise
                self.log.debug(
                    "sslmode=%s: %s; trying again %s",
                    self._tls.mode,
                    self.describe(exc),
                    "without TLS" if then is False else "with TLS",
                )
        return await self._open_once(app, last, settings or {})

    async def _open_once(self, app: str, ssl: _ssl.SSLContext | bool, settings: dict[str, str]) -> _PostgresConnection:
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                raw = await asyncpg.connect(
                    timeout=self.connect_timeout,
                    # search_path in the startup packet: it holds before anything (asyncpg's own queries too) runs.
                    server_settings={**settings, "application_name": app, "search_path": _SEARCH_PATH},
                    statement_cache_size=0,  # nothing cached, so nothing closed behind our back
                    ssl=ssl,
                    **self._connect_args,
                )
        except TimeoutError:
            raise ConnectionError(f"connect timed out after {self.connect_timeout:g}s") from None
        except ConnectionError as exc:
            if no_tls(exc):
                raise TlsRequired(
                    f"the server does not support TLS, but sslmode={self._tls.mode} requires it"
                ) from None
            raise
        transport = getattr(raw, "_transport", None)
        if ssl is not False and (transport is None or transport.get_extra_info("ssl_object") is None):
            # A TLS attempt must end on a TLS transport, whatever the driver did with the server's answer.
            raw.terminate()
            raise TlsRequired(f"the connection is not encrypted, but sslmode={self._tls.mode} requires it")
        return _PostgresConnection(raw)

    def _lock_settings(self, version: int | None) -> dict[str, str]:
        """The lock session's settings, sent in its startup packet; those of PostgreSQL 14+ once it is known."""
        lease_ms = str(_ms(self.lease))
        settings = {
            "lock_timeout": str(_ms(self.poll_interval)),
            # Neither is expected (we never idle in a transaction) but both bound a stuck session.
            "idle_in_transaction_session_timeout": lease_ms,
            "tcp_keepalives_idle": str(self._keepalive[0]),
            "tcp_keepalives_interval": str(self._keepalive[1]),
            "tcp_keepalives_count": str(self._keepalive[2]),
            # A token's commit must reach the WAL on disk (and synchronous standbys) before it is used.
            "synchronous_commit": "on",
        }
        if version is not None and version >= 14:
            settings.update(_settings_14(lease_ms))
        return settings

    async def _connect(self, identity: str) -> _PostgresConnection:
        """A new dedicated lock connection, its session timeouts set, on a primary."""
        known = self._server_version
        conn = await self._open_as(application_name(identity), self._lock_settings(known))
        try:
            self._server_version = conn.server_version
            if known is None and conn.server_version >= 14:  # first connection: settings the server now shows
                await conn.execute(
                    "; ".join(f"SET {k} = {v}" for k, v in _settings_14(str(_ms(self.lease))).items()),
                    timeout=self.check_timeout,
                )
            if conn.server_version < 14 and not self._warned_old_server:
                self._warned_old_server = True
                self.log.warning(
                    "PostgreSQL %s has no idle_session_timeout: a frozen leader is replaced only when its "
                    "connection closes (TCP keepalives detect a dead host after about %ss, never a stopped process)",
                    conn.server_version,
                    keepalive_bound(*self._keepalive),
                )
            ready = await conn.fetchrow(_READY, timeout=self.check_timeout)
            conn.backend_start = ready["backend_start"]
            conn.session_id = ready["pid"]  # the server's, not what a pooler may present as its own
            if ready["search_path"].replace(" ", "") != _SEARCH_PATH.replace(" ", ""):
                # A pooler or proxy dropped the startup packet's settings: the session gets them from SET instead.
                settings = {**self._lock_settings(conn.server_version), "search_path": _SEARCH_PATH}
                await conn.execute("; ".join(f"SET {k} = {v}" for k, v in settings.items()), timeout=self.check_timeout)
            if not self._pooling_checked:
                await self._check_pooling(conn)
                self._pooling_checked = True
            if ready["standby"]:
                raise PermanentBackendError(
                    "the server is a standby (pg_is_in_recovery() is true): advisory locks are local to one "
                    "server, so every candidate must connect to the same primary"
                )
            # Prepare now every statement the leader sends while holding the lock. asyncpg prepares an
            # ad hoc statement with Parse/Describe/Flush and no Sync: a leader frozen right after that
            # exchange would leave its session mid-protocol, where idle_session_timeout is not armed and
            # the lock would be held until the process resumed. A prepared statement is one
            # Bind/Execute/Sync packet, so a frozen leader's session is always plainly idle.
            statements = [_LOCK, _HELD_BY_ME, _UNLOCK]
            if self._tokens:
                if not ready["can_token"]:
                    raise PermanentBackendError(
                        f"fencing tokens need EXECUTE on function {_MESSAGE_FUNCTION} (granted to PUBLIC by "
                        "default; it makes each token durable before it is used): grant it, or set fencing=False "
                        "(and schema=None)"
                    )
                statements.append(self._token_sql(conn))
            if self.schema is not None:
                await ensure_table(conn, self.schema, self.check_timeout)
                conn.leaders_table_ok = True
                statements.append(record_sql(self.schema))
            await conn.prepare(*statements, timeout=self.check_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _check_pooling(self, conn: _PostgresConnection) -> None:
        """ElectionError unless a session lock held by one connection is held for no other, and lets go when that
        connection goes away: what a pooler in transaction or statement mode breaks without a word.

        A probe connection takes an advisory lock on a random key. ``conn``
        must find it held by another session, twice (a pooler that runs
        ``conn``'s statement in the probe's server session, or resets that
        session after the probe's statement, lets it take the lock), then,
        once the probe has closed, find it free within ``connect_timeout`` (a
        pooler in transaction mode keeps the probe's server session, and the
        lock, for its next client); and every one of these statements must run
        in ``conn``'s own server session (its pid at connect). So the refusal
        is certain whatever the pool does meanwhile, not a matter of which
        server session a statement lands on; nothing is ended on the server,
        so no other client of a pool is disturbed.
        """
        key = int.from_bytes(secrets.token_bytes(8), "big", signed=True)

        async def take(on: _PostgresConnection) -> tuple[bool, int]:
            row = await on.fetchrow(_PROBE_LOCK, key, timeout=self.check_timeout)
            return bool(row["got"]), int(row["pid"])

        def pooled(got: bool, pid: int) -> str:
            """What ``conn`` taking the lock (``got``) in backend ``pid`` shows of a pooler, if anything."""
            if pid != conn.session_id:
                return f"one connection's statements ran in two server sessions (pids {conn.session_id} and {pid})"
            if got and pid == probe_pid:
                return f"two connections ran statements in one server session (pid {pid})"
            return ""

        seen = ""
        probe = await self._open("pooler-check")
        try:
            got, probe_pid = await take(probe)
            if not got:
                raise SessionLost("the pooler check's lock was taken by another session")
            for _ in range(2):  # before and after a pause: the lock stays with the probe's session while it lives
                got, pid = await take(conn)
                seen = pooled(got, pid) or (
                    "a lock held by another connection's server session was free" if got else ""
                )
                if seen:
                    break
                await anyio.sleep(0.05)
        finally:
            await probe.aclose(self.check_timeout)
        if not seen:
            got = False
            with anyio.move_on_after(self.connect_timeout):
                while not got and not seen:
                    await anyio.sleep(0.02)
                    got, pid = await take(conn)
                    seen = pooled(got, pid)
            if got and not seen:
                await conn.fetchval(_UNLOCK, key, timeout=self.check_timeout)
            elif not seen:
                seen = (
                    f"a connection's advisory lock was still held {self.connect_timeout:g}s after it closed (its "
                    "server session outlived it)"
                )
        if seen:
            host, port = self._address
            raise PermanentBackendError(
                f"the connections to {host}:{port} do not each keep one server session: {seen}. That is a "
                "connection pooler in transaction or statement mode (PgBouncer pool_mode=transaction or statement), "
                "which breaks session advisory locks: a lock taken by one statement stays with a server session "
                "the pooler then lends to another client. Connect to PostgreSQL directly, or through a pool in "
                "session mode (pool_mode=session)"
            )

    async def _server_bounds(self, conn: _PostgresConnection) -> dict[str, float | None]:
        """The session's own values (startup packet, role, database, server), as ``pg_settings`` shows them."""
        rows = await conn.fetch(_BOUNDS, list(_BOUND_SETTINGS), timeout=self.check_timeout)
        return server_bounds({row["name"]: float(row["seconds"]) for row in rows})

    async def _end_session(self, conn: _PostgresConnection, victim: _PostgresConnection) -> bool:
        """Terminate ``victim``'s backend only if the server shows its pid with the ``backend_start`` recorded at
        connect (a pid is reused by another backend, on this server or after a restart, never with the same
        start). Returns once the backend is gone (PostgreSQL 14+) or signalled (older servers).
        """
        if victim.backend_start is None:
            return False
        if conn.server_version >= 14:  # waits until the backend has exited
            ended = await conn.fetchval(
                _TERMINATE,
                victim.session_id,
                victim.backend_start,
                _ms(self.check_timeout),
                timeout=self.check_timeout + 1,
            )
        else:
            ended = await conn.fetchval(
                _TERMINATE_BEFORE_14,
                victim.session_id,
                victim.backend_start,
                timeout=self.check_timeout,
            )
        return bool(ended)

    # --- the lock ----------------------------------------------------------------

    async def _request(self, conn: _PostgresConnection, again: bool = True) -> bool:
        if conn.waits is None:
            conn.waits = await self._prepare_wait(conn)
        if conn.waits:
            try:
                row = await conn.fetchrow(
                    _WAIT,
                    self.key,
                    self.classid,
                    self.objid,
                    timeout=self.poll_interval + self.check_timeout,
                    pending=Pending.LOCK_REQUEST,
                )
            except (asyncpg.UndefinedFunctionError, asyncpg.InvalidSQLStatementNameError):
                if not again:
                    raise
                # The session's temporary function (or its prepared statement) was dropped under it: a
                # DISCARD, or an operator. Made again once, rather than a refusal that ends the campaign.
                self.log.info("the session's wait function is gone; making it again")
                conn.waits = None
                conn.statements.pop(_WAIT, None)
                return await self._request(conn, again=False)
            if row["got"]:
                return True
            conn.seen_holder = row
            return False
        try:
            await conn.fetchval(
                _LOCK, self.key, timeout=self.poll_interval + self.check_timeout, pending=Pending.LOCK_REQUEST
            )
        except asyncpg.LockNotAvailableError:  # lock_timeout: still busy
            return False
        return True

    async def _prepare_wait(self, conn: _PostgresConnection) -> bool:
        """Create and prepare :data:`_WAIT`'s function on ``conn``: False where the server refuses it.

        A refusal (no TEMP privilege, no plpgsql) leaves the plain wait: a
        ``pg_advisory_lock`` that ends in a ``lock_timeout`` error, and a look
        at the holder after it.
        """
        try:
            await conn.execute(_WAIT_FUNCTION, timeout=self.check_timeout)
            await conn.prepare(_WAIT, timeout=self.check_timeout)
        except asyncpg.PostgresError as exc:
            if not conn.leaves_clean(exc):
                raise
            self.log.debug("lock requests end in lock_timeout errors: %s", self.describe(exc))
            return False
        return True

    async def _try_request(self, conn: _PostgresConnection) -> bool:
        conn.seen_holder = None
        return bool(await conn.fetchval(_TRY_LOCK, self.key, timeout=self.check_timeout, pending=Pending.LOCK_REQUEST))

    async def _held(self, conn: _PostgresConnection) -> bool:
        return bool(await conn.fetchval(_HELD_BY_ME, self.classid, self.objid, timeout=self.check_timeout))

    async def _unlock(self, conn: _PostgresConnection) -> bool:
        return bool(await conn.fetchval(_UNLOCK, self.key, timeout=self.check_timeout))

    @property
    def _tokens(self) -> bool:
        """A token is taken for fencing, and for the leaders table's record."""
        return self.fencing or self.schema is not None

    @staticmethod
    def _token_sql(conn: _PostgresConnection) -> str:
        return _TOKEN if conn.server_version >= 13 else _TOKEN_BEFORE_13

    async def _granted(self, conn: _PostgresConnection, identity: str) -> int | None:
        """The check after the grant and this leadership's token (None without fencing) in one statement.

        The token is durable on the server, and taken in the statement that
        finds the lock held. Transaction ids only grow, and this one was
        assigned after the lock was granted, so it is larger than every
        earlier leader's token.
        """
        if not self._tokens:
            if not await self._held(conn):
                raise SessionLost(self.not_held)
            return None
        row = await conn.fetchrow(self._token_sql(conn), self.classid, self.objid, timeout=self.check_timeout)
        if not row[0]:
            raise SessionLost(self.not_held)
        token = int(row[1])
        if self.schema is not None:
            await conn.fetchval(record_sql(self.schema), self.name, token, identity, timeout=self.check_timeout)
        return token if self.fencing else None

    # --- fenced state --------------------------------------------------------------

    def _new_state_store(self) -> StateStore:
        if self.schema is None or not self.fencing:
            raise UsageError(
                "fenced state on PostgreSQL checks each write against the token row of the leaders table: it needs "
                "fencing tokens and schema= (see Choosing a backend)"
            )
        return _PostgresStateStore(self, self.schema)

    def _state_settings(self) -> dict[str, str]:
        """The state session's settings: a transaction left open (a frozen leader) ends after ``lease``."""
        return {
            "idle_in_transaction_session_timeout": str(_ms(self.lease)),
            "synchronous_commit": "on",
            "tcp_keepalives_idle": str(self._keepalive[0]),
            "tcp_keepalives_interval": str(self._keepalive[1]),
            "tcp_keepalives_count": str(self._keepalive[2]),
        }

    # --- who leads -----------------------------------------------------------------

    @property
    def records_identity(self) -> bool:
        return self.schema is not None

    async def _look(self, conn: _PostgresConnection) -> tuple[Any, str | None]:
        schema = self.schema
        if schema is not None and not conn.leaders_table_ok:  # refused before it is ever read on this session
            conn.leaders_table_ok = await table_usable(conn, schema, self.check_timeout)
        row = await self._holder_row(conn)
        if row is None or row["backend_start"] is None or schema is None or not conn.leaders_table_ok:
            return row, None  # nobody leads, not ours to see, or no leaders table (yet)
        holder = await conn.fetchval(
            recorded_holder_sql(schema), self.name, row["pid"], row["backend_start"], timeout=self.check_timeout
        )
        return row, holder

    async def _holder(self, conn: _PostgresConnection) -> Hashable:
        row = await self._holder_row(conn)
        return None if row is None else (row["pid"], row["backend_start"])

    async def _holder_row(self, conn: _PostgresConnection) -> Any:
        """The holder's row (:data:`_HOLDER`'s columns; None: free), in no statement or one.

        None when the lock request that just timed out on ``conn`` saw the
        holder (:data:`_WAIT`). Else :data:`_HOLDER`, prepared on ``conn`` at
        its first look: sessions cache no statement
        (``statement_cache_size=0``), and an ad hoc one is a Parse/Describe
        round trip before its Bind/Execute.
        """
        seen, conn.seen_holder = conn.seen_holder, None
        if seen is not None:  # the lock request that just timed out saw it (no pid: nobody holds it)
            return seen if seen["pid"] is not None else None
        if _HOLDER not in conn.statements:
            await conn.prepare(_HOLDER, timeout=self.check_timeout)
        return await conn.fetchrow(_HOLDER, self.classid, self.objid, timeout=self.check_timeout)

    async def _unrecorded(self, conn: _PostgresConnection, holder: Any) -> str:
        return str(holder["application_name"]) if holder["application_name"] else f"backend pid {holder['pid']}"


#: The channel on which a shared session announces each release (the payload is the election's name).
RELEASE_CHANNEL = "aioelect_release"
_NOTIFY = "SELECT pg_catalog.pg_notify($1, $2)"
# Every advisory lock this session holds, in one statement whatever their number.
_HELD_ALL = f"""SELECT classid, objid FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND database = {_CURRENT_DB} AND objsubid = 1 AND granted
  AND pid = pg_catalog.pg_backend_pid()"""


# The holder of each lock in $1/$2 (classid, objid), as _holder shows it; a lock nobody holds has no row.
_HOLDERS = f"""SELECT w.classid, w.objid, l.pid, a.backend_start
FROM unnest($1::pg_catalog.oid[], $2::pg_catalog.oid[]) AS w(classid, objid)
JOIN pg_catalog.pg_locks l ON l.locktype = 'advisory' AND l.database = {_CURRENT_DB}
  AND l.classid = w.classid AND l.objid = w.objid AND l.objsubid = 1 AND l.granted
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid"""


class _PostgresStateStore(SqlStateStore[_PostgresConnection]):
    """Fenced state in ``<schema>.aioelect_state``, each write checked against the token row in its transaction."""

    def __init__(self, backend: PostgresBackend, schema: str) -> None:
        super().__init__()
        self._b = backend
        self._schema = schema
        self._sql = state_sql(schema)

    async def _open(self) -> _PostgresConnection:
        conn = await self._b._open_as("aioelect-state", self._b._state_settings())
        try:
            await ensure_state_table(conn, self._schema, self._b.check_timeout)
        except BaseException:
            conn.close()
            raise
        conn.interceptor = self._b.interceptor
        return conn

    def _close(self, conn: _PostgresConnection) -> None:
        conn.close()

    def _broken(self, conn: _PostgresConnection) -> bool:
        return conn.broken

    def _failure(self, exc: Exception, what: str) -> ElectionError:
        if getattr(exc, "sqlstate", None) == "42501":
            return PermanentBackendError(
                f"fenced state needs SELECT, INSERT and UPDATE on {self._schema}.aioelect_state and SELECT and UPDATE "
                f"on {self._schema}.{FENCING_TABLE} (owned by the connecting role): {self._b.describe(exc)}"
            )
        return self._b.failure(exc, what)

    async def _read(self, conn: _PostgresConnection, key: str) -> bytes | None:
        value = await conn.fetchval(self._sql["read"], self._b.name, key, timeout=self._b.check_timeout)
        return None if value is None else bytes(value)

    async def _post(self, conn: _PostgresConnection, key: str, value: bytes) -> None:
        await conn.fetchval(self._sql["put"], self._b.name, key, value, 0, timeout=self._b.check_timeout)

    async def _begin(self, conn: _PostgresConnection) -> None:
        await conn.execute("BEGIN", timeout=self._b.check_timeout)

    async def _newest_token(self, conn: _PostgresConnection) -> int | None:
        newest = await conn.fetchval(self._sql["token"], self._b.name, timeout=self._b.check_timeout)
        return None if newest is None else int(newest)

    async def _held_by(self, conn: _PostgresConnection, session: int) -> bool:
        b = self._b
        return bool(await conn.fetchval(_HELD_BY_SESSION, b.classid, b.objid, session, timeout=b.check_timeout))

    async def _locked_value(self, conn: _PostgresConnection, key: str) -> bytes | None:
        stored = await conn.fetchval(self._sql["locked"], self._b.name, key, timeout=self._b.check_timeout)
        return None if stored is None else bytes(stored)

    async def _put(self, conn: _PostgresConnection, key: str, value: bytes, token: int) -> None:
        await conn.fetchval(self._sql["put"], self._b.name, key, value, token, timeout=self._b.check_timeout)

    async def _end(self, conn: _PostgresConnection, *, commit: bool) -> None:
        await conn.execute("COMMIT" if commit else "ROLLBACK", timeout=self._b.check_timeout)


class PostgresSession(SharedLockSession[_PostgresConnection]):
    """One PostgreSQL connection holding the advisory lock of every elector of a process on it.

    Opt-in, as :class:`~aioelect.EtcdSession` is for etcd::

        async with aioelect.PostgresSession(dsn, lease=5) as session:
            jobs = aioelect.PostgresElector(session=session, name="jobs")
            mail = aioelect.PostgresElector(session=session, name="mail")

    The options are those of :class:`~aioelect.PostgresElector` but
    ``name`` (:class:`PostgresSessionOptions`), validated here; an elector on
    the session takes only ``name`` (with ``identity``, by default the
    session's, and ``stop_timeout``). The session's ``identity`` is its
    ``application_name``, which :meth:`leader` reports for every elector on
    it unless ``schema=`` records each elector's own.

    Guarantees:

    * one connection on the server for the whole session, however many
      electors use it, opened as an elector's lock connection is
      (``idle_session_timeout = lease``, keepalives and every server-side
      bound checked, TLS as configured, no pooler in transaction mode, a
      primary), every statement it runs while holding locks prepared
      before;
    * one check statement per ``check_interval`` (over ``pg_locks`` for
      the session's backend) confirms every lock held on the session, each
      leadership confirmed from the time it was sent; a check that fails or
      times out ends them all;
    * waiting electors never wait on the server, so they never block the
      connection: one statement per ``poll_interval`` reads the holder of
      every lock they wait for (one query over ``pg_locks``), and an
      elector asks ``pg_try_advisory_lock`` only when its lock shows free
      or a release is announced. A release on a shared session is
      announced with ``NOTIFY aioelect_release`` (the name as payload),
      which every shared session on the database listens to, so a waiter
      asks again at once: a graceful handover between shared sessions takes
      milliseconds; one from an elector with a connection of its own,
      within ``poll_interval``;
    * **fate sharing**, what the session gives up: when the connection is
      lost (``pg_terminate_backend``, a failed check, a release the server
      did not answer), every elector on it loses its leadership at once;
    * the rest as :class:`~aioelect.MySQLSession`: one elector per name,
      closing, and entering (whose refusals here also name a standby and a
      pooler in transaction mode).
    """

    who = "PostgresSession"
    options_spec = PostgresSessionOptions
    backend_class = PostgresBackend

    def __init__(
        self, dsn: str | None = None, *, identity: str | None = None, **options: Unpack[PostgresSessionOptions]
    ) -> None:
        super().__init__(dsn, identity, options)

    def _on_end(self, conn: _PostgresConnection, ended: Callable[[], None]) -> None:
        conn.on_end(ended)

    async def _listen(self, conn: _PostgresConnection) -> None:
        """Prepare what the session runs while it holds locks, and listen for release notices."""
        await conn.prepare(_TRY_LOCK, _HOLDER, _HELD_ALL, _HOLDERS, _NOTIFY, timeout=self.template.check_timeout)

        def notice(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            self.released(payload)

        await conn.run(lambda: conn.raw.add_listener(RELEASE_CHANNEL, notice), self.template.check_timeout)

    async def _announce_release(self, conn: _PostgresConnection, name: str) -> None:
        await conn.fetchval(_NOTIFY, RELEASE_CHANNEL, name, timeout=self.template.check_timeout)

    async def _held_many(
        self, conn: _PostgresConnection, backends: list[SessionLockBackend[_PostgresConnection]]
    ) -> frozenset[str]:
        rows = await conn.fetch(_HELD_ALL, timeout=self.template.check_timeout)
        held = {(int(row[0]), int(row[1])) for row in rows}
        return frozenset(b.name for b in backends if isinstance(b, PostgresBackend) and (b.classid, b.objid) in held)

    async def _holders_many(
        self, conn: _PostgresConnection, backends: list[SessionLockBackend[_PostgresConnection]]
    ) -> dict[str, Hashable]:
        keyed = {(b.classid, b.objid): b.name for b in backends if isinstance(b, PostgresBackend)}
        holders: dict[str, Hashable] = dict.fromkeys(keyed.values())
        ids = list(keyed)
        rows = await conn.fetch(_HOLDERS, [c for c, _ in ids], [o for _, o in ids], timeout=self.template.check_timeout)
        for row in rows:
            holders[keyed[(int(row[0]), int(row[1]))]] = (row["pid"], row["backend_start"])
        return holders
