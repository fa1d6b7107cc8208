"""The PostgreSQL leaders table: ``<schema>.aioelect_leaders``, where each leader records its identity and token.

This module owns the table's definition, its statements, and the checks
that make it safe to use: the table is used only when its schema is owned by
the connecting role or a superuser and the table itself by the connecting
role, so no other role's triggers, rules or policies ever run with our
privileges (the CVE-2018-1058 class). Every name is schema-qualified.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...core._errors import PermanentBackendError

__all__ = [
    "FENCING_TABLE",
    "STATE_TABLE",
    "ensure_state_table",
    "state_sql",
    "Queries",
    "ensure_table",
    "fencing_ddl",
    "record_sql",
    "recorded_holder_sql",
    "table_usable",
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


#: The table of fenced state (:class:`~aioelect.FencedStore`), beside the leaders table in ``schema=``.
STATE_TABLE = "aioelect_state"


def state_sql(schema: str) -> dict[str, str]:
    """The statements of fenced state in ``schema``: ``ddl``, ``token`` (the token row, share-locked), ``read``,
    ``locked`` (the value, locked), ``put``, ``owner`` (whether we own an ordinary state table)."""
    state = f"{_ident(schema)}.{STATE_TABLE}"
    return {
        "ddl": f"""CREATE TABLE IF NOT EXISTS {state} (
  name text NOT NULL,
  skey text NOT NULL,
  value bytea NOT NULL,
  token bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
  PRIMARY KEY (name, skey)
)""",
        "token": f"SELECT token FROM {_table(schema)} WHERE name = $1 FOR SHARE",
        "read": f"SELECT value FROM {state} WHERE name = $1 AND skey = $2",
        "locked": f"SELECT value FROM {state} WHERE name = $1 AND skey = $2 FOR UPDATE",
        "put": (
            f"INSERT INTO {state} AS s (name, skey, value, token) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (name, skey) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token, "
            "written_at = pg_catalog.now()"
        ),
        "owner": (
            "SELECT c.relowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = CURRENT_USER) "
            "AND c.relkind = 'r' FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = $1 AND c.relname = '{STATE_TABLE}'"
        ),
    }


async def ensure_state_table(conn: Any, schema: str, timeout: float) -> None:
    """Create the leaders table (each write checks its token row) and the state table if missing, each checked as
    :func:`ensure_table` checks; the state table is used only if we own it."""
    await ensure_table(conn, schema, timeout)
    statements = state_sql(schema)
    try:
        await conn.execute(statements["ddl"], timeout=timeout * 5)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) not in _CREATED_BY_ANOTHER:
            raise
    mine = await conn.fetchval(statements["owner"], schema, timeout=timeout)
    if not mine:
        raise PermanentBackendError(
            f"table {schema}.{STATE_TABLE} is not an ordinary table owned by the connecting role: aioelect writes "
            "fenced state only to a table its own role owns; drop it or use another schema"
        )


def record_sql(schema: str) -> str:
    return (
        f"INSERT INTO {_table(schema)} AS f (name, token, holder, pid) "
        "VALUES ($1, $2, $3, pg_catalog.pg_backend_pid()) "
        "ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder, "
        "pid = EXCLUDED.pid, acquired_at = pg_catalog.now()"
    )


def recorded_holder_sql(schema: str) -> str:
    return f"SELECT holder FROM {_table(schema)} WHERE name = $1 AND pid = $2 AND acquired_at >= $3"


class Queries(Protocol):
    """The two calls of a connection the checks need."""

    async def fetchrow(self, sql: str, *args: Any, timeout: float) -> Any: ...

    async def execute(self, sql: str, *, timeout: float) -> None: ...


#: SQLSTATEs of a candidate that lost the race to create the table: the row type or catalog entry
#: appeared under it (42710, 23505), or the table itself (42P07).
_CREATED_BY_ANOTHER = frozenset({"42710", "23505", "42P07"})


async def table_usable(conn: Queries, schema: str, timeout: float) -> bool:
    """Whether ``schema``'s leaders table exists; ElectionError if another role could change it.

    Its schema must be owned by us or a superuser (a schema's owner can
    swap any table in it), and the table must be an ordinary table we own:
    another owner's triggers, rules or row security policies would run
    with our privileges (the CVE-2018-1058 class).
    """
    info = await conn.fetchrow(_TABLE_INFO, schema, timeout=timeout)
    table = f"{schema}.{FENCING_TABLE}"
    avoid = "or set schema=None (fencing tokens need no table)"
    if info is None:
        raise PermanentBackendError("cannot find the connecting role in pg_roles")
    me = info["me"]
    if not info["schema_exists"]:
        raise PermanentBackendError(
            f'schema "{schema}" does not exist (option schema): create it, owned by {me}, {avoid}'
        )
    if not info["schema_trusted"]:
        raise PermanentBackendError(
            f"schema {schema} is owned by {info['schema_owner']}, not by {me} or a superuser: its owner could "
            f"replace {table} with a table of their own at any time; use a schema owned by {me}, {avoid}"
        )
    if not info["can_use"]:
        raise PermanentBackendError(f"role {me} lacks USAGE on schema {schema}: grant it, {avoid}")
    if info["relkind"] is None:
        return False
    if not info["table_mine"]:
        raise PermanentBackendError(
            f"table {table} is owned by {info['table_owner']}, not by {me}: aioelect only uses a leaders table "
            f"its own role owns (another owner's triggers, rules or policies would run as {me}); drop it, "
            f"use another schema, {avoid}"
        )
    if info["relkind"] != "r":
        raise PermanentBackendError(f"{table} is not an ordinary table (relkind {info['relkind']!r}); drop it, {avoid}")
    return True


async def ensure_table(conn: Queries, schema: str, timeout: float) -> None:
    """Create the leaders table if missing, then check it; done before the lock is taken."""
    if await table_usable(conn, schema, timeout):
        return
    info = await conn.fetchrow(_TABLE_INFO, schema, timeout=timeout)
    if not info["can_create"]:
        raise PermanentBackendError(
            f"table {schema}.{FENCING_TABLE} does not exist and role {info['me']} lacks CREATE on schema "
            f"{schema}: grant it (GRANT CREATE ON SCHEMA {_ident(schema)} TO {_ident(info['me'])}), create the "
            f"table as {info['me']}, or set schema=None (fencing tokens need no table)"
        )
    try:
        await conn.execute(fencing_ddl(schema), timeout=timeout * 5)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) not in _CREATED_BY_ANOTHER:  # another candidate created it meanwhile
            raise
    if not await table_usable(conn, schema, timeout):  # checked again: someone else may have won the race
        raise PermanentBackendError(f"table {schema}.{FENCING_TABLE} vanished right after it was created")
