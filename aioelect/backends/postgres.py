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
  the leader's session ending) instead of at their next poll;
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
  TCP keepalives (``tcp_keepalives_*``) are set too; they only detect a dead
  or unreachable client host, never a stopped process whose kernel answers;
* the identity is the session's ``application_name`` (truncated to 63
  bytes), visible in ``pg_stat_activity``; with ``fencing=True`` the full
  identity and a token are kept in table ``aioelect_leaders``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import ssl as _ssl
from typing import Any

import anyio

from .._backend import Backoff, Confirm, Hold, SessionLockBackend, monotonic, until_recorded
from .._config import LockTiming, parse_dsn, server_address, tls_context, validate_name
from .._elector import Elector
from .._errors import BackendUnavailable, ElectionError

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'aioelect[postgres]'") from exc

__all__ = ["PostgresElector", "advisory_key", "application_name", "lock_ids", "KEY_SQL", "FENCING_TABLE", "FENCING_DDL"]

#: The table that keeps fencing tokens and the holders' identities.
FENCING_TABLE = "aioelect_leaders"
FENCING_DDL = f"""CREATE TABLE IF NOT EXISTS {FENCING_TABLE} (
  name text PRIMARY KEY,
  token bigint NOT NULL,
  holder text NOT NULL,
  pid integer NOT NULL,
  acquired_at timestamptz NOT NULL DEFAULT now()
)"""
#: The same key as :func:`advisory_key`, computed by PostgreSQL 11+ from the name in ``$1``.
KEY_SQL = "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint"

#: application_name is cut by the server at NAMEDATALEN - 1 bytes.
_MAX_APPLICATION_NAME = 63
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_TLS_FILES = ("sslrootcert", "sslcert", "sslkey")
_CURRENT_DB = "(SELECT oid FROM pg_database WHERE datname = current_database())"
# A bigint advisory lock shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
_LOCK_ROW = f"locktype = 'advisory' AND database = {_CURRENT_DB} AND classid = $1 AND objid = $2 AND objsubid = 1"
_HELD_BY_ME = f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {_LOCK_ROW} AND granted AND pid = pg_backend_pid())"
_HOLDER = f"""SELECT l.pid, a.application_name, a.backend_start
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = {_CURRENT_DB} AND l.classid = $1 AND l.objid = $2
  AND l.objsubid = 1 AND l.granted
LIMIT 1"""
_LOCK = "SELECT pg_advisory_lock($1)"
_UNLOCK = "SELECT pg_advisory_unlock($1)"
_FENCED_HOLDER = f"SELECT holder FROM {FENCING_TABLE} WHERE name = $1 AND pid = $2 AND acquired_at >= $3"
_FENCE = (
    f"INSERT INTO {FENCING_TABLE} AS f (name, token, holder, pid) VALUES ($1, 1, $2, pg_backend_pid()) "
    "ON CONFLICT (name) DO UPDATE SET token = f.token + 1, holder = EXCLUDED.holder, pid = EXCLUDED.pid, "
    "acquired_at = now() RETURNING token"
)

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


def _tls_from_dsn(tls: dict[str, str]) -> _ssl.SSLContext | str | None:
    """What the DSN's libpq-style TLS parameters ask for: an sslmode, a context built from files, or None."""
    mode = tls.get("sslmode")
    if mode is not None and mode not in _SSL_MODES:
        raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {mode!r}")
    files = {k: tls[k] for k in _TLS_FILES if k in tls}
    if not files:
        return mode
    mode = mode or "verify-full"
    if mode not in ("require", "verify-ca", "verify-full"):
        raise ValueError(f"{', '.join(files)} need sslmode require, verify-ca or verify-full, not {mode!r}")
    return tls_context(
        ca=files.get("sslrootcert"),
        cert=files.get("sslcert"),
        key=files.get("sslkey"),
        verify=mode != "require",
        verify_identity=mode == "verify-full",
    )


def _tls_refused(exc: BaseException) -> _ssl.SSLCertVerificationError | None:
    """The refused certificate behind ``exc``, if any: no retry can fix it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    refused = _tls_refused(exc)
    if refused is not None:
        return f"TLS handshake failed: {refused.verify_message or refused.reason or refused}"
    if isinstance(exc, asyncpg.PostgresError):
        return f"({exc.sqlstate}) {exc}"
    return repr(exc)


def _permanent(exc: BaseException) -> bool:
    return isinstance(exc, _PERMANENT) or _tls_refused(exc) is not None


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class _Connection:
    """One asyncpg connection that is never reconnected and never reused after a client-side failure.

    A query that is cancelled or times out, or a connection-level failure,
    leaves the session in a state we do not trust, so the connection is
    closed; a plain server-side SQL error leaves it usable.

    The lock connection runs nothing but :attr:`statements` while it holds the
    lock (see :meth:`_PostgresBackend._connect`).
    """

    def __init__(self, raw: asyncpg.Connection) -> None:
        self.raw = raw
        self.pid: int = raw.get_server_pid()
        self.server_version: int = raw.get_server_version().major
        #: Statements prepared before the lock is taken, by SQL text.
        self.statements: dict[str, Any] = {}
        # Set as soon as asyncpg sees the connection end (server terminated it, network, our close).
        self.ended = anyio.Event()
        raw.add_termination_listener(self._on_end)

    def _on_end(self, _raw: object) -> None:
        self.ended.set()

    @property
    def broken(self) -> bool:
        return bool(self.raw.is_closed())

    async def _run(self, call: Any, timeout: float) -> Any:  # noqa: ASYNC109
        if self.broken:
            raise asyncpg.ConnectionDoesNotExistError("connection is closed")
        try:
            with anyio.fail_after(timeout):
                return await call()
        except BaseException as exc:
            if not isinstance(exc, asyncpg.PostgresError) or isinstance(
                exc, (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)
            ):
                self.close()
            raise

    async def fetchval(self, sql: str, *args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        """First value of ``sql``'s first row: its prepared statement if there is one, else ad hoc."""
        statement = self.statements.get(sql)
        if statement is not None:
            return await self._run(lambda: statement.fetchval(*args), timeout)
        return await self._run(lambda: self.raw.fetchval(sql, *args), timeout)

    async def fetchrow(self, sql: str, *args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        return await self._run(lambda: self.raw.fetchrow(sql, *args), timeout)

    async def execute(self, sql: str, *, timeout: float) -> None:  # noqa: ASYNC109
        """Run parameterless ``sql`` with the simple protocol (several statements allowed)."""
        await self._run(lambda: self.raw.execute(sql), timeout)

    async def prepare(self, *sqls: str, timeout: float) -> None:  # noqa: ASYNC109
        for sql in sqls:
            self.statements[sql] = await self._run(lambda sql=sql: self.raw.prepare(sql), timeout)

    def close(self) -> None:
        """Drop the connection at once; the server ends the session (and frees its locks) on EOF."""
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


class _PostgresHold(Hold):
    def __init__(self, backend: _PostgresBackend, conn: _Connection, token: int | None, acquired_at: float) -> None:
        self._backend = backend
        self._conn = conn
        self.token = token
        self.acquired_at = acquired_at

    async def monitor(self, confirm: Confirm) -> str:
        b = self._backend
        conn = self._conn
        while True:
            with anyio.move_on_after(b.check_interval):
                await conn.ended.wait()
                return "lock connection closed (session terminated, server restarted or network lost)"
            sent = monotonic()
            try:
                mine = await conn.fetchval(_HELD_BY_ME, b.classid, b.objid, timeout=b.check_timeout)
            except TimeoutError:
                return f"lock check did not complete within {b.check_timeout:g}s"
            except Exception as exc:
                return f"lock connection failed: {_describe(exc)}"
            if not mine:
                return "advisory lock is no longer held by our session"
            confirm(sent)

    async def release(self) -> None:
        conn = self._conn
        b = self._backend
        if conn.broken:
            conn.close()
            return
        try:
            await conn.fetchval(_UNLOCK, b.key, timeout=b.check_timeout)
        except Exception as exc:
            b.log.debug("pg_advisory_unlock failed (%s); closing the session drops the lock", _describe(exc))
        finally:
            await conn.aclose(b.check_timeout)


class _PostgresBackend(SessionLockBackend):
    kind = "postgres"
    server_timeout = "idle_session_timeout"

    def __init__(
        self,
        *,
        connect_args: dict[str, Any],
        name: str,
        timing: LockTiming,
        fencing: bool,
    ) -> None:
        super().__init__(name, timing)
        self._connect_args = connect_args
        self.key = advisory_key(name)
        self.classid, self.objid = lock_ids(self.key)
        self.fencing = fencing
        self._fencing_ready = False
        self._warned_old_server = False
        self._info: _Connection | None = None
        self._info_lock = anyio.Lock()

    def describe_timing(self) -> str:
        return f"key={self.key} " + super().describe_timing()

    # --- connections -------------------------------------------------------------

    async def _open(self, app: str) -> _Connection:
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                raw = await asyncpg.connect(
                    timeout=self.connect_timeout,
                    server_settings={"application_name": app},
                    statement_cache_size=0,  # nothing cached, so nothing closed behind our back
                    **self._connect_args,
                )
        except TimeoutError:
            raise ConnectionError(f"connect timed out after {self.connect_timeout:g}s") from None
        return _Connection(raw)

    async def _connect(self, identity: str) -> _Connection:
        """A new dedicated lock connection, its session timeouts set, on a primary."""
        conn = await self._open(application_name(identity))
        try:
            lease_ms = _ms(self.lease)
            keepalive_idle = max(1, int(self.lease / 2))
            keepalive_interval = max(1, int(self.lease / 6))
            settings = [
                f"SET lock_timeout = {_ms(self.poll_interval)}",
                # Neither is expected (we never idle in a transaction) but both bound a stuck session.
                f"SET idle_in_transaction_session_timeout = {lease_ms}",
                f"SET tcp_keepalives_idle = {keepalive_idle}",
                f"SET tcp_keepalives_interval = {keepalive_interval}",
                "SET tcp_keepalives_count = 3",
            ]
            if conn.server_version >= 14:
                # The bound on a frozen leader: the server ends a session idle for longer than lease.
                settings.append(f"SET idle_session_timeout = {lease_ms}")
                # A backend waiting on the lock notices a vanished client within a second.
                settings.append("SET client_connection_check_interval = 1000")
            elif not self._warned_old_server:
                self._warned_old_server = True
                self.log.warning(
                    "PostgreSQL %s has no idle_session_timeout: a frozen leader is replaced only when its "
                    "connection closes (TCP keepalives detect a dead host after about %ss, never a stopped process)",
                    conn.server_version,
                    keepalive_idle + 3 * keepalive_interval,
                )
            await conn.execute("; ".join(settings), timeout=self.check_timeout)
            if await conn.fetchval("SELECT pg_is_in_recovery()", timeout=self.check_timeout):
                raise ElectionError(
                    "the server is a standby (pg_is_in_recovery() is true): advisory locks are local to one "
                    "server, so every candidate must connect to the same primary"
                )
            # Prepare now every statement the leader sends while holding the lock. asyncpg prepares an
            # ad hoc statement with Parse/Describe/Flush and no Sync: a leader frozen right after that
            # exchange would leave its session mid-protocol, where idle_session_timeout is not armed and
            # the lock would be held until the process resumed. A prepared statement is one
            # Bind/Execute/Sync packet, so a frozen leader's session is always plainly idle.
            statements = [_LOCK, _HELD_BY_ME, _UNLOCK]
            if self.fencing:
                await self._ensure_fencing_table(conn)
                statements.append(_FENCE)
            await conn.prepare(*statements, timeout=self.check_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _kill(self, pid: int) -> None:
        """End a server backend still waiting in pg_advisory_lock for a client that gave up.

        Without this, the server would keep waiting (up to ``poll_interval``)
        and could even take the lock for a session nobody reads. Returns once
        the backend is gone (PostgreSQL 14+) or signalled (older servers).
        """
        with anyio.move_on_after(self.connect_timeout + self.check_timeout + 1, shield=True):
            try:
                conn = await self._open("aioelect-cleanup")
                try:
                    if conn.server_version >= 14:  # waits until the backend has exited
                        await conn.fetchval(
                            "SELECT pg_terminate_backend($1, $2)",
                            pid,
                            _ms(self.check_timeout),
                            timeout=self.check_timeout + 1,
                        )
                    else:
                        await conn.fetchval("SELECT pg_terminate_backend($1)", pid, timeout=self.check_timeout)
                finally:
                    await conn.aclose(self.check_timeout)
            except Exception as exc:
                self.log.debug("could not end waiting backend %s (%s)", pid, _describe(exc))

    # --- campaign ----------------------------------------------------------------

    async def campaign(self, identity: str) -> Hold:
        backoff = Backoff(first=0.1, maximum=max(self.poll_interval, 1.0))
        while True:
            conn: _Connection | None = None
            waiting = False
            try:
                conn = await self._connect(identity)
                while True:
                    sent = monotonic()
                    waiting = True
                    try:
                        await conn.fetchval(_LOCK, self.key, timeout=self.poll_interval + self.check_timeout)
                    except asyncpg.LockNotAvailableError:  # lock_timeout: still busy
                        waiting = False
                        backoff.reset()
                        self.log.debug("lock busy; waiting again")
                        continue
                    waiting = False
                    token = await self._fence(conn, identity) if self.fencing else None
                    hold = _PostgresHold(self, conn, token, sent)
                    conn = None
                    return hold
            except Exception as exc:
                if _permanent(exc):
                    raise ElectionError(f"PostgreSQL refused the campaign: {_describe(exc)}") from None
                if isinstance(exc, ElectionError):
                    raise
                delay = backoff.next_delay()
                self.report_error(f"campaign interrupted ({_describe(exc)})", delay)
                if conn is not None:
                    conn.close()
                    if waiting:
                        await self._kill(conn.pid)
                    conn = None
                await anyio.sleep(delay)
            finally:
                if conn is not None:
                    conn.close()
                    if waiting:
                        await self._kill(conn.pid)

    async def _ensure_fencing_table(self, conn: _Connection) -> None:
        """Create the fencing table if missing; done before the lock is taken."""
        if self._fencing_ready:
            return
        # CREATE ... IF NOT EXISTS still needs CREATE on the schema, so only run it when missing.
        if await conn.fetchval("SELECT to_regclass($1) IS NULL", FENCING_TABLE, timeout=self.check_timeout):
            # Another candidate may create it at the same moment; the loser sees the table's
            # row type or catalog entry appear under it (42710, 23505) or the table itself (42P07).
            with contextlib.suppress(
                asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError, asyncpg.DuplicateTableError
            ):
                await conn.execute(FENCING_DDL, timeout=self.check_timeout * 5)
        self._fencing_ready = True

    async def _fence(self, conn: _Connection, identity: str) -> int:
        """Bump and return this name's token; only the lock holder ever writes it."""
        token = await conn.fetchval(_FENCE, self.name, identity, timeout=self.check_timeout)
        return int(token)

    # --- who leads -----------------------------------------------------------------

    async def leader(self) -> str | None:
        async with self._info_lock:
            for attempt in range(2):
                try:
                    if self._info is None or self._info.broken:
                        self._info = await self._open("aioelect-observer")
                    return await self._leader_on(self._info)
                except Exception as exc:
                    if _permanent(exc):
                        raise ElectionError(f"PostgreSQL refused the query: {_describe(exc)}") from None
                    if self._info is not None:
                        self._info.close()
                        self._info = None
                    if attempt:
                        raise BackendUnavailable(
                            f"PostgreSQL at {self._where()} is unreachable: {_describe(exc)}"
                        ) from None
        raise AssertionError("unreachable")

    async def _leader_on(self, conn: _Connection) -> str | None:
        async def look() -> tuple[Any, Any]:
            row = await conn.fetchrow(_HOLDER, self.classid, self.objid, timeout=self.check_timeout)
            if row is None or row["backend_start"] is None:
                return row, None
            try:
                holder = await conn.fetchval(
                    _FENCED_HOLDER, self.name, row["pid"], row["backend_start"], timeout=self.check_timeout
                )
            except (asyncpg.UndefinedTableError, asyncpg.InsufficientPrivilegeError):
                holder = None  # no fencing table (yet), or not ours to read
            return row, holder

        if self.fencing:  # candidates that fence record their full identity just after taking the lock
            row, holder = await until_recorded(look, lambda seen: seen[0] is None or seen[1] is not None)
        else:
            row, holder = await look()
        if row is None:
            return None
        if holder is not None:
            return str(holder)
        return str(row["application_name"]) if row["application_name"] else f"backend pid {row['pid']}"

    def _where(self) -> str:
        return f"{self._connect_args.get('host')}:{self._connect_args.get('port')}"

    async def aclose(self) -> None:
        if self._info is not None:
            info, self._info = self._info, None
            await info.aclose(self.check_timeout)


class PostgresElector(Elector):
    """A candidate in a PostgreSQL advisory-lock election.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion as long as every candidate talks to the same primary
      and database (advisory locks are per server and per database; a standby
      is refused with :class:`~aioelect.ElectionError`);
    * a follower takes over within milliseconds of a release or of the
      leader's session ending, and sends at most one query per
      ``poll_interval`` while waiting;
    * a leader whose session ends stops at once; one whose lock check fails
      stops within ``check_interval`` plus ``check_timeout``; one that cannot
      confirm for ``renew_deadline`` seconds fences itself; the server ends a
      silent (frozen, cut off) leader's session after ``lease`` seconds
      (``idle_session_timeout``, PostgreSQL 14+; on older servers only TCP
      keepalives, which never end a stopped but live process);
    * with ``fencing=True`` each leadership gets a token that increases across
      all leaders of ``name`` and across server restarts (table
      ``aioelect_leaders``, created if missing), and :meth:`leader` reports
      full identities; otherwise it reports ``application_name`` (63 bytes).

    Wrong passwords, unknown databases and missing privileges raise
    :class:`~aioelect.ElectionError` at once; connection errors are retried
    with backoff. ``dsn`` is ``postgresql://user:password@host:port/database``
    (``postgres://`` too); keyword arguments override its parts. TLS: ``ssl``
    takes an :class:`ssl.SSLContext` or an sslmode (``disable`` ...
    ``verify-full``), or the DSN says ``?sslmode=...&sslrootcert=PATH&sslcert=
    PATH&sslkey=PATH`` as libpq does (with files, the default mode is
    ``verify-full``, and ``require`` encrypts without verifying). A refused
    server certificate is a permanent error.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        user: str | None = None,
        password: str | None = None,
        database: str | None = None,
        name: str,
        poll_interval: float = 2.0,
        identity: str | None = None,
        connect_timeout: float = 5.0,
        check_interval: float = 1.0,
        check_timeout: float = 2.0,
        lease: float = 10,
        renew_deadline: float | None = None,
        fencing: bool = False,
        ssl: _ssl.SSLContext | str | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        parsed = parse_dsn(dsn, "postgresql", "postgres") if dsn is not None else None
        host, port = server_address(parsed, host, port, default_port=5432, who="PostgresElector")
        query = dict(parsed.query) if parsed else {}
        tls = {k: query.pop(k) for k in ("sslmode", *_TLS_FILES) if k in query}
        if query:
            raise ValueError(
                f"unsupported DSN parameter(s): {', '.join(sorted(query))} "
                "(read: sslmode, sslrootcert, sslcert, sslkey)"
            )
        if ssl is None:
            ssl = _tls_from_dsn(tls)
        elif isinstance(ssl, str) and ssl not in _SSL_MODES:
            raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {ssl!r}")
        elif not isinstance(ssl, (str, _ssl.SSLContext)):
            raise ValueError("ssl must be an ssl.SSLContext or an sslmode string")
        timing = LockTiming.checked(
            poll_interval=poll_interval,
            check_interval=check_interval,
            check_timeout=check_timeout,
            connect_timeout=connect_timeout,
            lease=lease,
            renew_deadline=renew_deadline,
            server_timeout="idle_session_timeout",
            min_lease=1,
            whole_lease=False,
        )
        if fencing not in (True, False):
            raise ValueError(f"fencing must be True or False, not {fencing!r}")
        connect_args: dict[str, Any] = {
            "host": host,
            "port": port,
            "user": user if user is not None else (parsed.user if parsed and parsed.user else "postgres"),
            "password": password if password is not None else (parsed.password if parsed else None),
            "database": database if database is not None else (parsed.database if parsed else None),
            "ssl": ssl,
        }
        backend = _PostgresBackend(
            connect_args=connect_args,
            name=validate_name(name),
            timing=timing,
            fencing=bool(fencing),
        )
        super().__init__(backend, identity=identity, stop_timeout=stop_timeout)
