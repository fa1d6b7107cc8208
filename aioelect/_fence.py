"""``fenced(conn, lead)``: a transaction on the user's own database that commits only under the newest token.

It needs no backend: a connection (asyncpg or aiomysql) and a leadership's
token. The fence is one row per election in a table of the user's database,
locked in the transaction before the user's writes, so it holds whatever
server the election itself runs on.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from .core._elector import Leadership, elector_of
from .core._errors import LeadershipLost, LossKind, PermanentBackendError, UsageError

__all__ = ["FENCE_DDL_MYSQL", "FENCE_DDL_POSTGRES", "FENCE_TABLE", "fenced"]

#: The fence table's default name.
FENCE_TABLE = "aioelect_fence"
#: The fence table, on PostgreSQL and on MySQL / MariaDB (``{table}`` is its name).
FENCE_DDL_POSTGRES = "CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY, token bigint NOT NULL)"
FENCE_DDL_MYSQL = (
    "CREATE TABLE IF NOT EXISTS {table} (name VARBINARY(255) NOT NULL PRIMARY KEY, token BIGINT NOT NULL) ENGINE=InnoDB"
)
#: The length of the name column of FENCE_DDL_MYSQL.
_MYSQL_NAME_BYTES = 255
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")
#: What each step of the fence needs, for the error that names a missing privilege.
_LOCK, _INSERT, _UPDATE = "SELECT and UPDATE", "INSERT", "UPDATE"
_NO_TABLE = {"42P01", 1146}
_DENIED = {"42501", 1142, 1143, 1044}


def fenced(conn: Any, lead: Leadership, *, table: str = FENCE_TABLE) -> contextlib.AbstractAsyncContextManager[Any]:
    """Run the body in a transaction on ``conn`` that commits only while ``lead``'s token is the newest.

    ``async with aioelect.fenced(conn, lead):`` on an idle asyncpg or
    aiomysql connection starts a transaction, locks the election's row of
    ``table`` (``SELECT ... FOR UPDATE``), refuses if the row holds a token
    newer than ``lead.token``, else records ``lead.token`` there; the body's
    writes on ``conn`` then commit with it when the body ends.

    Guarantees:

    * a deposed leader's transaction raises
      :class:`~aioelect.LeadershipLost` and commits nothing, from the moment
      a newer leader has run a fenced transaction of its own (the row lock
      orders the two: the older one commits first or not at all), whichever
      server the election runs on;
    * the body runs only while ``lead`` is held locally, and a leadership
      lost by the time the body ends rolls the transaction back
      (:class:`~aioelect.LeadershipLost`); so does any exception;
    * refused at once, nothing written: a connection inside a transaction
      or closed (:class:`~aioelect.UsageError`), a leadership without a token
      (:class:`~aioelect.UsageError`), a missing table or privilege
      (:class:`~aioelect.PermanentBackendError` naming the privilege).

    The table (see the docs' "Exactly once" page for the DDL): ``name`` the
    election's name, ``token`` the newest token seen; the role needs SELECT,
    INSERT and UPDATE on it.
    """
    if not isinstance(lead, Leadership):
        raise TypeError(f"fenced() takes the writer's Leadership, not {type(lead).__name__}")
    if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
        raise ValueError(f"table must be a plain or schema-qualified SQL name, not {table!r}"[:200])
    if lead.token is None:
        raise UsageError(f"{lead!r} has no fencing token (fencing=False): fenced() needs tokens")
    driver = type(conn).__module__.split(".")[0]
    if driver == "asyncpg":
        return _fenced(_Postgres(conn, table), lead)
    if driver == "aiomysql":
        name = elector_of(lead).name
        if len(name.encode()) > _MYSQL_NAME_BYTES:
            # INSERT IGNORE would store it truncated, and the row would never be found again.
            raise UsageError(
                f"fenced() on MySQL: the fence table's name column holds {_MYSQL_NAME_BYTES} bytes, and election "
                f"{name[:40]!r}... has {len(name.encode())}: use a shorter election name"
            )
        return _fenced(_MySQL(conn, table), lead)
    kind = f"{type(conn).__module__}.{type(conn).__name__}"
    raise TypeError(f"fenced() takes an asyncpg or aiomysql connection, not {kind}")


class _Driver:
    """The few statements of a fenced transaction, in one driver's words."""

    def __init__(self, conn: Any, table: str) -> None:
        self.conn = conn
        self.table = table

    def usable(self) -> str | None:
        """Why ``conn`` cannot start a fenced transaction now, or None."""
        raise NotImplementedError

    async def begin(self) -> None:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    async def locked_token(self, name: str) -> int | None:
        raise NotImplementedError

    async def insert(self, name: str, token: int) -> None:
        raise NotImplementedError

    async def update(self, name: str, token: int) -> None:
        raise NotImplementedError

    def code(self, exc: BaseException) -> object:
        raise NotImplementedError


class _Postgres(_Driver):
    def usable(self) -> str | None:
        if self.conn.is_closed():
            return "the connection is closed"
        if self.conn.is_in_transaction():
            return "the connection is inside a transaction already: fenced() starts its own"
        return None

    async def begin(self) -> None:
        self._tx = self.conn.transaction()
        await self._tx.start()

    async def commit(self) -> None:
        await self._tx.commit()

    async def rollback(self) -> None:
        if not self.conn.is_closed():
            await self._tx.rollback()

    async def locked_token(self, name: str) -> int | None:
        value = await self.conn.fetchval(f"SELECT token FROM {self.table} WHERE name = $1 FOR UPDATE", name)
        return None if value is None else int(value)

    async def insert(self, name: str, token: int) -> None:
        await self.conn.execute(
            f"INSERT INTO {self.table} (name, token) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING", name, token
        )

    async def update(self, name: str, token: int) -> None:
        await self.conn.execute(f"UPDATE {self.table} SET token = $2 WHERE name = $1", name, token)

    def code(self, exc: BaseException) -> object:
        return getattr(exc, "sqlstate", None)


class _MySQL(_Driver):
    def usable(self) -> str | None:
        if self.conn.closed:
            return "the connection is closed"
        if getattr(self.conn, "server_status", 0) & 1:  # SERVER_STATUS_IN_TRANS
            return "the connection is inside a transaction already: fenced() starts its own"
        return None

    async def _run(self, sql: str, *args: Any) -> Any:
        async with self.conn.cursor() as cursor:
            await cursor.execute(sql, args)
            return await cursor.fetchone()

    async def begin(self) -> None:
        await self.conn.begin()

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        if not self.conn.closed:
            await self.conn.rollback()

    async def locked_token(self, name: str) -> int | None:
        row = await self._run(f"SELECT token FROM {self.table} WHERE name = %s FOR UPDATE", name)
        return None if row is None else int(row[0])

    async def insert(self, name: str, token: int) -> None:
        await self._run(f"INSERT IGNORE INTO {self.table} (name, token) VALUES (%s, %s)", name, token)

    async def update(self, name: str, token: int) -> None:
        await self._run(f"UPDATE {self.table} SET token = %s WHERE name = %s", token, name)

    def code(self, exc: BaseException) -> object:
        args = getattr(exc, "args", ())
        return args[0] if args and isinstance(args[0], int) else None


async def _step(driver: _Driver, privilege: str, call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``, a missing table or privilege raised as a PermanentBackendError that names what to grant."""
    try:
        return await call()
    except Exception as exc:
        code = driver.code(exc)
        if code in _NO_TABLE:
            raise PermanentBackendError(
                f"fence table {driver.table} does not exist: create it (the DDL is on the docs' 'Exactly once' "
                f"page) and grant SELECT, INSERT, UPDATE on it: {exc}"
            ) from None
        if code in _DENIED:
            raise PermanentBackendError(
                f"fenced() needs the {privilege} privilege on table {driver.table} (grant SELECT, INSERT, UPDATE "
                f"on it): {exc}"
            ) from None
        raise


async def _fence(driver: _Driver, lead: Leadership) -> None:
    """Lock the election's fence row and record ``lead``'s token there; LeadershipLost if a newer one is there."""
    name = elector_of(lead).name
    token = lead.token
    assert token is not None
    stored = await _step(driver, _LOCK, lambda: driver.locked_token(name))
    if stored is None:
        await _step(driver, _INSERT, lambda: driver.insert(name, token))
        stored = await _step(driver, _LOCK, lambda: driver.locked_token(name))
        assert stored is not None
    if stored > token:
        raise LeadershipLost(
            f"fenced transaction refused: {driver.table} holds token {stored} of election {name!r}, newer than {token}",
            LossKind.DEPOSED,
        )
    if stored < token:
        await _step(driver, _UPDATE, lambda: driver.update(name, token))


@contextlib.asynccontextmanager
async def _fenced(driver: _Driver, lead: Leadership) -> AsyncIterator[Any]:
    problem = driver.usable()
    if problem is not None:
        raise UsageError(f"fenced(): {problem}")
    lead.check()
    await driver.begin()
    try:
        await _fence(driver, lead)
        yield driver.conn
        lead.check()
    except BaseException:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):  # a connection gone rolls back by itself
                await driver.rollback()
        raise
    await driver.commit()
