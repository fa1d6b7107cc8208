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
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import ssl as _ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import anyio

from .._backend import Backoff, Confirm, Hold, SessionLockBackend, monotonic, until_recorded
from .._config import LockTiming, check_options, parse_dsn, server_address, transport_warning, validate_name
from .._errors import BackendUnavailable, ElectionError

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the PostgreSQL backend needs asyncpg: pip install 'aioelect[postgres]'") from exc

__all__ = [
    "PostgresBackend",
    "PostgresOptions",
    "advisory_key",
    "application_name",
    "lock_ids",
    "KEY_SQL",
    "FENCING_TABLE",
    "fencing_ddl",
]

#: The table, in the schema given by ``schema=``, that keeps the leaders' identities and tokens.
FENCING_TABLE = "aioelect_leaders"


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _table(schema: str) -> str:
    return f"{_ident(schema)}.{FENCING_TABLE}"


def fencing_ddl(schema: str) -> str:
    """The statement that creates the leaders table in ``schema`` (run as the role that will use it)."""
    return f"""CREATE TABLE IF NOT EXISTS {_table(schema)} (
  name text PRIMARY KEY,
  token bigint NOT NULL,
  holder text NOT NULL,
  pid integer NOT NULL,
  acquired_at timestamptz NOT NULL DEFAULT pg_catalog.now()
)"""


#: The same key as :func:`advisory_key`, computed by PostgreSQL 11+ from the name in ``$1``.
KEY_SQL = "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint"

#: application_name is cut by the server at NAMEDATALEN - 1 bytes.
_MAX_APPLICATION_NAME = 63
_MAX_IDENTIFIER = 63
#: Functions and operators resolve in pg_catalog only; relations are always written schema-qualified.
_SEARCH_PATH = "pg_catalog, pg_temp"
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_TLS_FILES = ("sslrootcert", "sslcert", "sslkey")
_CURRENT_DB = "(SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())"
# A bigint advisory lock shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
_LOCK_ROW = f"locktype = 'advisory' AND database = {_CURRENT_DB} AND classid = $1 AND objid = $2 AND objsubid = 1"
_HELD_BY_ME = (
    f"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE {_LOCK_ROW} AND granted "
    "AND pid = pg_catalog.pg_backend_pid())"
)
_HOLDER = f"""SELECT l.pid, a.application_name, a.backend_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = {_CURRENT_DB} AND l.classid = $1 AND l.objid = $2
  AND l.objsubid = 1 AND l.granted
LIMIT 1"""
_LOCK = "SELECT pg_catalog.pg_advisory_lock($1)"
_UNLOCK = "SELECT pg_catalog.pg_advisory_unlock($1)"
# The token is this statement's transaction id. A transaction that only takes an id commits
# without flushing the WAL, so a crash right after could hand the same id out again; the
# transactional logical message makes the commit write WAL, so a synchronous commit flushes it
# (and waits for synchronous standbys) before the token is returned.
_TOKEN = (
    "SELECT pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8, "
    "pg_catalog.pg_logical_emit_message(true, 'aioelect', ''::pg_catalog.text)"
)
_TOKEN_BEFORE_13 = (
    "SELECT pg_catalog.txid_current(), pg_catalog.pg_logical_emit_message(true, 'aioelect', ''::pg_catalog.text)"
)
_MESSAGE_FUNCTION = "pg_catalog.pg_logical_emit_message(boolean, pg_catalog.text, pg_catalog.text)"
_CAN_TOKEN = f"SELECT pg_catalog.has_function_privilege('{_MESSAGE_FUNCTION}', 'EXECUTE')"
# Who may change the leaders table: its schema's owner (pg_database_owner stands for the
# database's owner) and the table's owner. Both must be us or a superuser.
_TABLE_INFO = f"""SELECT me.rolname AS me,
  n.oid IS NOT NULL AS schema_exists,
  pg_catalog.pg_get_userbyid(o.oid) AS schema_owner,
  (o.oid = me.oid OR o.rolsuper) AS schema_trusted,
  n.oid IS NOT NULL AND pg_catalog.has_schema_privilege(n.oid, 'USAGE') AS can_use,
  n.oid IS NOT NULL AND pg_catalog.has_schema_privilege(n.oid, 'CREATE') AS can_create,
  c.relkind::pg_catalog.text AS relkind,
  pg_catalog.pg_get_userbyid(c.relowner) AS table_owner,
  c.relowner = me.oid AS table_mine
FROM pg_catalog.pg_roles me
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1
LEFT JOIN pg_catalog.pg_roles o ON o.oid = CASE
  WHEN pg_catalog.pg_get_userbyid(n.nspowner) = 'pg_database_owner'
  THEN (SELECT d.datdba FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
  ELSE n.nspowner END
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = '{FENCING_TABLE}'
WHERE me.rolname = CURRENT_USER"""


def _record_sql(schema: str) -> str:
    return (
        f"INSERT INTO {_table(schema)} AS f (name, token, holder, pid) "
        "VALUES ($1, $2, $3, pg_catalog.pg_backend_pid()) "
        "ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder, "
        "pid = EXCLUDED.pid, acquired_at = pg_catalog.now()"
    )


def _recorded_holder_sql(schema: str) -> str:
    return f"SELECT holder FROM {_table(schema)} WHERE name = $1 AND pid = $2 AND acquired_at >= $3"


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


class _NoTls(ConnectionError):
    """The server offers no TLS but the sslmode requires it: no retry can fix it."""


@dataclass(frozen=True)
class _Tls:
    """How every connection is encrypted, resolved once with libpq's rules.

    ``attempts`` are tried in order: ``False`` is plaintext, a context is TLS.
    ``prefer`` tries TLS and falls back to plaintext when the server has no
    TLS or the TLS attempt fails; ``allow`` tries plaintext first and TLS when
    the server refuses it; the other modes make one attempt.
    """

    mode: str
    attempts: tuple[_ssl.SSLContext | bool, ...]
    #: Every connection is encrypted (no plaintext attempt at all).
    encrypted: bool
    #: The server's certificate chain is verified on every TLS attempt.
    verified: bool


def _home_file(name: str) -> str | None:
    """``~/.postgresql/<name>`` if it exists (libpq's default location), else None."""
    path = os.path.join(os.path.expanduser("~"), ".postgresql", name)
    return path if os.path.exists(path) else None


def _given_file(option: str, value: str | None) -> str | None:
    if value is not None and value != "" and not os.path.isfile(value):
        raise ValueError(f"{option} file {value!r} does not exist")
    return value or None


def _resolve_tls(tls: dict[str, str], ssl: _ssl.SSLContext | str | None, host: str) -> _Tls:
    """The TLS plan of libpq for the DSN's ``tls`` parameters, the ``ssl`` argument and the PG* variables.

    As libpq: sslmode from ``ssl``, the DSN or ``PGSSLMODE``, default
    ``prefer``; sslrootcert, sslcert and sslkey from the DSN, ``PGSSLROOTCERT``,
    ``PGSSLCERT``, ``PGSSLKEY`` or ``~/.postgresql/`` (root.crt,
    postgresql.crt, postgresql.key). A root certificate makes every TLS
    attempt verify the chain (so ``require`` verifies as ``verify-ca`` does);
    ``verify-full`` also checks the host name; ``sslrootcert=system`` uses the
    system's CAs and needs ``verify-full``. Stricter than libpq: a file named
    that does not exist is a ValueError, and a root certificate named in the
    DSN or ``PGSSLROOTCERT`` without any sslmode means ``verify-full``.
    """
    if isinstance(ssl, _ssl.SSLContext):
        return _Tls("context", (ssl,), encrypted=True, verified=ssl.verify_mode != _ssl.CERT_NONE)
    mode = ssl if ssl is not None else tls.get("sslmode") or os.environ.get("PGSSLMODE") or None
    if mode is not None and mode not in _SSL_MODES:
        raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {mode!r}")
    given_root = tls.get("sslrootcert") or os.environ.get("PGSSLROOTCERT") or None
    if mode is None:
        mode = "verify-full" if given_root else "prefer"
    if mode == "disable" or host.startswith("/"):  # libpq never uses TLS on a Unix socket
        return _Tls(mode, (False,), encrypted=host.startswith("/"), verified=host.startswith("/"))
    context = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = _ssl.TLSVersion.TLSv1_2
    if given_root == "system":
        if mode != "verify-full":
            raise ValueError(f"sslrootcert=system needs sslmode=verify-full, not {mode!r}")
        context.load_default_certs()
        root: str | None = "system"
    else:
        root = _given_file("sslrootcert", given_root) or _home_file("root.crt")
        if root is None and mode in ("verify-ca", "verify-full"):
            raise ValueError(
                f"sslmode={mode} needs a root certificate: sslrootcert=PATH (or PGSSLROOTCERT, "
                "~/.postgresql/root.crt), or sslrootcert=system for the system's CAs"
            )
        if root is not None:
            try:
                context.load_verify_locations(cafile=root)
            except (OSError, _ssl.SSLError) as exc:
                raise ValueError(f"cannot load the root certificate {root!r}: {exc}") from None
    context.check_hostname = mode == "verify-full"
    context.verify_mode = _ssl.CERT_REQUIRED if root is not None else _ssl.CERT_NONE
    cert = _given_file("sslcert", tls.get("sslcert") or os.environ.get("PGSSLCERT")) or _home_file("postgresql.crt")
    key = _given_file("sslkey", tls.get("sslkey") or os.environ.get("PGSSLKEY")) or _home_file("postgresql.key")
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, _ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client certificate: {exc}") from None
    verified = root is not None
    if mode == "allow":
        return _Tls(mode, (False, context), encrypted=False, verified=verified)
    if mode == "prefer":
        return _Tls(mode, (context, False), encrypted=False, verified=verified)
    return _Tls(mode, (context,), encrypted=True, verified=verified)


def _try_next(plan: _Tls, attempt: _ssl.SSLContext | bool, exc: BaseException) -> bool:
    """Whether libpq would make the plan's next attempt after ``attempt`` failed with ``exc``.

    On a server error (authentication, pg_hba) for both ``allow`` and
    ``prefer``; for ``prefer``, also when the server has no TLS or the TLS
    handshake failed. Never on a timeout or an unreachable server.
    """
    if isinstance(exc, asyncpg.PostgresError):
        return True
    return attempt is not False and (isinstance(exc, (_ssl.SSLError, _NoTls)) or _tls_refused(exc) is not None)


def _no_tls(exc: BaseException) -> bool:
    """asyncpg's answer to a server that said no to TLS (a bare ConnectionError)."""
    return type(exc) is ConnectionError and "rejected SSL upgrade" in str(exc)


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
    if isinstance(exc, _NoTls):
        return str(exc)
    refused = _tls_refused(exc)
    if refused is not None:
        return f"TLS handshake failed: {refused.verify_message or refused.reason or refused}"
    if isinstance(exc, asyncpg.PostgresError):
        return f"({exc.sqlstate}) {exc}"
    return repr(exc)


def _permanent(exc: BaseException) -> bool:
    return isinstance(exc, (*_PERMANENT, _NoTls)) or _tls_refused(exc) is not None


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class _Connection:
    """One asyncpg connection that is never reconnected and never reused after a client-side failure.

    A query that is cancelled or times out, or a connection-level failure,
    leaves the session in a state we do not trust, so the connection is
    closed; a plain server-side SQL error leaves it usable.

    The lock connection runs nothing but :attr:`statements` while it holds the
    lock (see :meth:`PostgresBackend._connect`).
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
    def __init__(self, backend: PostgresBackend, conn: _Connection, token: int | None, acquired_at: float) -> None:
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


class _Named(TypedDict):
    #: The election's name; the advisory lock's key is derived from it.
    name: str


class PostgresOptions(_Named, total=False):
    """The options of a PostgreSQL election; :class:`PostgresBackend` validates them."""

    #: Server host, port, user, password and database: each overrides the DSN's part.
    host: str | None
    port: int | None
    user: str | None
    password: str | None
    database: str | None
    #: Seconds between a follower's lock attempts (default 2).
    poll_interval: float
    #: Seconds to connect (default 5).
    connect_timeout: float
    #: Seconds between the leader's lock checks (default 1), and the bound on one (default 2).
    check_interval: float
    check_timeout: float
    #: Seconds of the session's ``idle_session_timeout``: the server ends a silent leader's session (default 10).
    lease: float
    #: Seconds a leader may go without a confirmed check before it fences itself (default: derived from the others).
    renew_deadline: float | None
    #: Give each leadership a token, the server's transaction id (default False).
    fencing: bool
    #: Schema of the ``aioelect_leaders`` table that records full identities (default none: no table).
    schema: str | None
    #: An sslmode (``"verify-full"``...) or a TLS context (default: the DSN's, ``PGSSLMODE``, else ``prefer``).
    ssl: _ssl.SSLContext | str | None


class PostgresBackend(SessionLockBackend):
    """Advisory-lock elections on one PostgreSQL primary, built from a DSN and :class:`PostgresOptions`.

    The constructor validates every option (ValueError naming it, never the
    password), resolves TLS as libpq does, and connects to nothing.
    """

    kind = "postgres"
    server_timeout = "idle_session_timeout"

    def __init__(self, dsn: str | None = None, **options: Unpack[PostgresOptions]) -> None:
        check_options("PostgresElector", options, PostgresOptions)
        parsed = parse_dsn(dsn, "postgresql", "postgres") if dsn is not None else None
        host, port = server_address(
            parsed, options.get("host"), options.get("port"), default_port=5432, who="PostgresElector"
        )
        query = dict(parsed.query) if parsed else {}
        tls = {k: query.pop(k) for k in ("sslmode", *_TLS_FILES) if k in query}
        if query:
            raise ValueError(
                f"unsupported DSN parameter(s): {', '.join(sorted(query))} "
                "(read: sslmode, sslrootcert, sslcert, sslkey)"
            )
        ssl = options.get("ssl")
        if ssl is not None and not isinstance(ssl, (str, _ssl.SSLContext)):
            raise ValueError("ssl must be an ssl.SSLContext or an sslmode string")
        plan = _resolve_tls(tls, ssl, host)
        schema = options.get("schema")
        if schema is not None:
            if not isinstance(schema, str) or not schema or "\x00" in schema:
                raise ValueError(f"schema must be a non-empty schema name or None, not {schema!r}")
            if len(schema.encode("utf-8")) > _MAX_IDENTIFIER:
                raise ValueError(f"schema must be at most {_MAX_IDENTIFIER} bytes long (PostgreSQL's NAMEDATALEN)")
        timing = LockTiming.checked(
            poll_interval=options.get("poll_interval", 2.0),
            check_interval=options.get("check_interval", 1.0),
            check_timeout=options.get("check_timeout", 2.0),
            connect_timeout=options.get("connect_timeout", 5.0),
            lease=options.get("lease", 10),
            renew_deadline=options.get("renew_deadline"),
            server_timeout="idle_session_timeout",
            min_lease=1,
            whole_lease=False,
            dated_after_grant=True,
        )
        fencing = options.get("fencing", False)
        if fencing not in (True, False):
            raise ValueError(f"fencing must be True or False, not {fencing!r}")
        user, password, database = options.get("user"), options.get("password"), options.get("database")
        connect_args: dict[str, Any] = {
            "host": host,
            "port": port,
            "user": user if user is not None else (parsed.user if parsed and parsed.user else "postgres"),
            "password": password if password is not None else (parsed.password if parsed else None),
            "database": database if database is not None else (parsed.database if parsed else None),
        }
        name = validate_name(options["name"])
        super().__init__(name, timing)
        self._connect_args = connect_args
        self._tls = plan
        self.key = advisory_key(name)
        self.classid, self.objid = lock_ids(self.key)
        self.fencing = bool(fencing)
        self.schema = schema
        self._warned_old_server = False
        self._info: _Connection | None = None
        self._info_table_ok = False
        self._info_lock = anyio.Lock()
        fix = (
            "use sslmode=verify-full with sslrootcert=PATH, or sslrootcert=system"
            if plan.mode in ("disable", "allow", "prefer")
            else "give sslrootcert=PATH so the server's certificate is verified"
        )
        if plan.mode == "prefer":
            fix = "sslmode=prefer falls back to plaintext when TLS fails or is not offered; " + fix
        # prefer: TLS whenever the server offers it, but an attacker can refuse TLS or present any
        # certificate and get plaintext, so it is never verified.
        encrypted, verified = (True, False) if plan.mode == "prefer" else (plan.encrypted, plan.verified)
        warning = transport_warning(host, encrypted=encrypted, verified=verified, fix=fix)
        if warning is not None:
            self.warnings.append(warning)

    def describe_timing(self) -> str:
        return f"key={self.key} " + super().describe_timing()

    # --- connections -------------------------------------------------------------

    async def _open(self, app: str) -> _Connection:
        """A new connection, encrypted as the sslmode says (libpq's attempts and fallbacks)."""
        attempts = self._tls.attempts
        for index, attempt in enumerate(attempts):
            try:
                return await self._open_once(app, attempt)
            except Exception as exc:
                if index + 1 < len(attempts) and _try_next(self._tls, attempt, exc):
                    self.log.debug(
                        "sslmode=%s: %s; trying again %s",
                        self._tls.mode,
                        _describe(exc),
                        "without TLS" if attempts[index + 1] is False else "with TLS",
                    )
                    continue
                raise
        raise AssertionError("unreachable")

    async def _open_once(self, app: str, ssl: _ssl.SSLContext | bool) -> _Connection:
        try:
            with anyio.fail_after(self.connect_timeout + 1):
                raw = await asyncpg.connect(
                    timeout=self.connect_timeout,
                    # search_path in the startup packet: it holds before anything (asyncpg's own queries too) runs.
                    server_settings={"application_name": app, "search_path": _SEARCH_PATH},
                    statement_cache_size=0,  # nothing cached, so nothing closed behind our back
                    ssl=ssl,
                    **self._connect_args,
                )
        except TimeoutError:
            raise ConnectionError(f"connect timed out after {self.connect_timeout:g}s") from None
        except ConnectionError as exc:
            if _no_tls(exc):
                raise _NoTls(f"the server does not support TLS, but sslmode={self._tls.mode} requires it") from None
            raise
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
            # A token's commit must reach the WAL on disk (and synchronous standbys) before it is used.
            settings.append("SET synchronous_commit = on")
            await conn.execute("; ".join(settings), timeout=self.check_timeout)
            if await conn.fetchval("SELECT pg_catalog.pg_is_in_recovery()", timeout=self.check_timeout):
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
            if self._tokens:
                if not await conn.fetchval(_CAN_TOKEN, timeout=self.check_timeout):
                    raise ElectionError(
                        f"fencing tokens need EXECUTE on function {_MESSAGE_FUNCTION} (granted to PUBLIC by "
                        "default; it makes each token durable before it is used): grant it, or set fencing=False "
                        "(and schema=None)"
                    )
                statements.append(self._token_sql(conn))
            if self.schema is not None:
                await self._ensure_table(conn, self.schema)
                statements.append(_record_sql(self.schema))
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
                            "SELECT pg_catalog.pg_terminate_backend($1, $2)",
                            pid,
                            _ms(self.check_timeout),
                            timeout=self.check_timeout + 1,
                        )
                    else:
                        await conn.fetchval(
                            "SELECT pg_catalog.pg_terminate_backend($1)", pid, timeout=self.check_timeout
                        )
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
                    waiting = True
                    try:
                        await conn.fetchval(_LOCK, self.key, timeout=self.poll_interval + self.check_timeout)
                    except asyncpg.LockNotAvailableError:  # lock_timeout: still busy
                        waiting = False
                        backoff.reset()
                        self.log.debug("lock busy; waiting again")
                        continue
                    waiting = False
                    token = await self._take_token(conn, identity) if self._tokens else None
                    # The lock may have been granted up to poll_interval after the request was sent:
                    # date the leadership from a confirmation sent now, after the grant.
                    confirmed = monotonic()
                    if not await conn.fetchval(_HELD_BY_ME, self.classid, self.objid, timeout=self.check_timeout):
                        raise ConnectionError("pg_advisory_lock returned but pg_locks does not show the lock as ours")
                    hold = _PostgresHold(self, conn, token if self.fencing else None, confirmed)
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

    @property
    def _tokens(self) -> bool:
        """A token is taken for fencing, and for the leaders table's record."""
        return self.fencing or self.schema is not None

    @staticmethod
    def _token_sql(conn: _Connection) -> str:
        return _TOKEN if conn.server_version >= 13 else _TOKEN_BEFORE_13

    async def _table_usable(self, conn: _Connection, schema: str) -> bool:
        """Whether ``schema``'s leaders table exists; ElectionError if another role could change it.

        Its schema must be owned by us or a superuser (a schema's owner can
        swap any table in it), and the table must be an ordinary table we own:
        another owner's triggers, rules or row security policies would run
        with our privileges (the CVE-2018-1058 class).
        """
        info = await conn.fetchrow(_TABLE_INFO, schema, timeout=self.check_timeout)
        table = f"{schema}.{FENCING_TABLE}"
        avoid = "or set schema=None (fencing tokens need no table)"
        if info is None:
            raise ElectionError("cannot find the connecting role in pg_roles")
        me = info["me"]
        if not info["schema_exists"]:
            raise ElectionError(f'schema "{schema}" does not exist (option schema): create it, owned by {me}, {avoid}')
        if not info["schema_trusted"]:
            raise ElectionError(
                f"schema {schema} is owned by {info['schema_owner']}, not by {me} or a superuser: its owner could "
                f"replace {table} with a table of their own at any time; use a schema owned by {me}, {avoid}"
            )
        if not info["can_use"]:
            raise ElectionError(f"role {me} lacks USAGE on schema {schema}: grant it, {avoid}")
        if info["relkind"] is None:
            return False
        if not info["table_mine"]:
            raise ElectionError(
                f"table {table} is owned by {info['table_owner']}, not by {me}: aioelect only uses a leaders table "
                f"its own role owns (another owner's triggers, rules or policies would run as {me}); drop it, "
                f"use another schema, {avoid}"
            )
        if info["relkind"] != "r":
            raise ElectionError(f"{table} is not an ordinary table (relkind {info['relkind']!r}); drop it, {avoid}")
        return True

    async def _ensure_table(self, conn: _Connection, schema: str) -> None:
        """Create the leaders table if missing, then check it; done before the lock is taken."""
        if await self._table_usable(conn, schema):
            return
        info = await conn.fetchrow(_TABLE_INFO, schema, timeout=self.check_timeout)
        if not info["can_create"]:
            raise ElectionError(
                f"table {schema}.{FENCING_TABLE} does not exist and role {info['me']} lacks CREATE on schema "
                f"{schema}: grant it (GRANT CREATE ON SCHEMA {_ident(schema)} TO {_ident(info['me'])}), create the "
                f"table as {info['me']}, or set schema=None (fencing tokens need no table)"
            )
        # Another candidate may create it at the same moment; the loser sees the table's
        # row type or catalog entry appear under it (42710, 23505) or the table itself (42P07).
        with contextlib.suppress(
            asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError, asyncpg.DuplicateTableError
        ):
            await conn.execute(fencing_ddl(schema), timeout=self.check_timeout * 5)
        if not await self._table_usable(conn, schema):  # checked again: someone else may have won the race
            raise ElectionError(f"table {schema}.{FENCING_TABLE} vanished right after it was created")

    async def _take_token(self, conn: _Connection, identity: str) -> int:
        """This leadership's token, durable on the server; taken while holding the lock.

        Transaction ids only grow, and this one was assigned after the lock
        was granted, so it is larger than every earlier leader's token.
        """
        token = int(await conn.fetchval(self._token_sql(conn), timeout=self.check_timeout))
        if self.schema is not None:
            await conn.fetchval(_record_sql(self.schema), self.name, token, identity, timeout=self.check_timeout)
        return token

    # --- who leads -----------------------------------------------------------------

    async def leader(self) -> str | None:
        async with self._info_lock:
            for attempt in range(2):
                try:
                    if self._info is None or self._info.broken:
                        self._info = await self._open("aioelect-observer")
                        self._info_table_ok = False
                    return await self._leader_on(self._info)
                except Exception as exc:
                    if _permanent(exc):
                        raise ElectionError(f"PostgreSQL refused the query: {_describe(exc)}") from None
                    if isinstance(exc, ElectionError):
                        raise
                    if self._info is not None:
                        self._info.close()
                        self._info = None
                    if attempt:
                        raise BackendUnavailable(
                            f"PostgreSQL at {self._where()} is unreachable: {_describe(exc)}"
                        ) from None
        raise AssertionError("unreachable")

    async def _leader_on(self, conn: _Connection) -> str | None:
        schema = self.schema

        async def look() -> tuple[Any, Any]:
            if schema is not None and not self._info_table_ok:  # refused before it is ever read
                self._info_table_ok = await self._table_usable(conn, schema)
            row = await conn.fetchrow(_HOLDER, self.classid, self.objid, timeout=self.check_timeout)
            if row is None or row["backend_start"] is None or schema is None or not self._info_table_ok:
                return row, None  # nobody leads, not ours to see, or no leaders table (yet)
            holder = await conn.fetchval(
                _recorded_holder_sql(schema), self.name, row["pid"], row["backend_start"], timeout=self.check_timeout
            )
            return row, holder

        if schema is not None:  # candidates record their full identity just after taking the lock
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
