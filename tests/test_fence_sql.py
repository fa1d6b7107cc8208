"""fenced(conn, lead) on the user's own database (asyncpg, aiomysql), with the election elsewhere (in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from aioelect import LeadershipLost, PermanentBackendError, UsageError, fenced
from aioelect._fence import FENCE_DDL_MYSQL, FENCE_DDL_POSTGRES
from aioelect.testing import MemoryElector

from .backends import Follower, unique_name
from .harness import TCPProxy

Connect = Callable[..., Awaitable[Any]]


class Db:
    """One user database: how to connect (optionally through a proxy), and a few statements in its dialect."""

    def __init__(self, kind: str, dsn: str) -> None:
        self.kind = kind
        parts = urlsplit(dsn)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (5432 if kind == "postgres" else 3306)
        self.user, self.password = unquote(parts.username or ""), unquote(parts.password or "")
        self.database = parts.path.lstrip("/") or None
        self.dsn = dsn
        suffix = secrets.token_hex(4)
        self.fence, self.data = f"fence_{suffix}", f"jobs_{suffix}"
        self.mark = "$1" if kind == "postgres" else "%s"

    async def connect(self, port: int | None = None, **kw: Any) -> Any:
        if self.kind == "postgres":
            import asyncpg

            return await asyncpg.connect(
                host=self.host,
                port=port or self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                **kw,
            )
        import aiomysql

        return await aiomysql.connect(
            host=self.host,
            port=port or self.port,
            user=self.user,
            password=self.password,
            db=self.database,
            autocommit=True,
            **kw,
        )

    async def run(self, conn: Any, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.kind == "postgres":
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        async with conn.cursor() as cursor:
            await cursor.execute(sql, args or None)
            return list(await cursor.fetchall())

    async def close(self, conn: Any) -> None:
        if self.kind == "postgres":
            await conn.close()
        else:
            conn.close()

    async def setup(self, conn: Any) -> None:
        ddl = FENCE_DDL_POSTGRES if self.kind == "postgres" else FENCE_DDL_MYSQL
        await self.run(conn, ddl.format(table=self.fence))
        await self.run(conn, f"CREATE TABLE {self.data} (who VARCHAR(16) NOT NULL)")

    async def who(self, conn: Any) -> list[str]:
        return [r[0] for r in await self.run(conn, f"SELECT who FROM {self.data}")]

    async def insert(self, conn: Any, who: str) -> None:
        await self.run(conn, f"INSERT INTO {self.data} (who) VALUES ({self.mark})", who)


@pytest.fixture(params=["postgres", "mysql"])
async def db(request: pytest.FixtureRequest) -> AsyncIterator[Db]:
    dsn = request.getfixturevalue("postgres_dsn" if request.param == "postgres" else "mysql_dsn")
    found = Db(request.param, dsn)
    admin = await found.connect()
    try:
        await found.setup(admin)
        yield found
        await found.run(admin, f"DROP TABLE {found.fence}")
        await found.run(admin, f"DROP TABLE {found.data}")
    finally:
        await found.close(admin)


@contextlib.asynccontextmanager
async def connected(db: Db, port: int | None = None) -> AsyncIterator[Any]:
    conn = await db.connect(port)
    try:
        yield conn
    finally:
        await db.close(conn)


async def test_writes_commit_under_the_newest_token_and_roll_back_on_error(db: Db) -> None:
    async with MemoryElector(name=unique_name()) as elector, connected(db) as conn:
        lead = await elector.acquire()
        async with fenced(conn, lead, table=db.fence):
            await db.insert(conn, "first")
        with pytest.raises(RuntimeError):
            async with fenced(conn, lead, table=db.fence):
                await db.insert(conn, "rolled back")
                raise RuntimeError("the job failed")
        assert await db.who(conn) == ["first"]
        assert await db.run(conn, f"SELECT name, token FROM {db.fence}") == [
            (elector.name.encode() if db.kind == "mysql" else elector.name, lead.token)
        ]
        await lead.release()


async def test_a_deposed_leaders_late_transaction_commits_nothing(
    db: Db, tcp_proxy_factory: Callable[[str, int], TCPProxy]
) -> None:
    """Kleppmann's case in miniature: A's transaction is held up in the network while A is deposed and B writes."""
    name = unique_name()
    proxy = tcp_proxy_factory(db.host, db.port)
    async with (
        MemoryElector(name=name, identity="a") as a,
        MemoryElector(name=name, identity="b") as b,
        connected(db, proxy.port) as conn_a,
        connected(db) as conn_b,
    ):
        lead_a = await a.acquire()
        proxy.stall()  # A freezes with its transaction in flight

        async def late_write() -> None:
            async with fenced(conn_a, lead_a, table=db.fence):
                await db.insert(conn_a, "a")

        late = asyncio.create_task(late_write())
        await asyncio.sleep(0.2)
        follower = Follower(b)
        try:
            a.depose()
            lead_b = await follower.wait()
            async with fenced(conn_b, lead_b, table=db.fence):
                await db.insert(conn_b, "b")
            proxy.passthrough()  # A wakes; its transaction reaches the server
            with pytest.raises(LeadershipLost, match=rf"holds token {lead_b.token} .* newer than {lead_a.token}"):
                await asyncio.wait_for(late, 30)
            assert await db.who(conn_b) == ["b"]
        finally:
            await follower.close()


async def test_misuse_is_refused_before_anything_is_written(db: Db) -> None:
    async with MemoryElector(name=unique_name()) as elector, connected(db) as conn:
        lead = await elector.acquire()
        with pytest.raises(PermanentBackendError, match="does not exist"):
            async with fenced(conn, lead, table="no_such_fence"):
                await db.insert(conn, "never")
        # Inside a transaction of the caller's own.
        if db.kind == "postgres":
            tx = conn.transaction()
            await tx.start()
        else:
            await conn.begin()
        with pytest.raises(UsageError, match="inside a transaction"):
            async with fenced(conn, lead, table=db.fence):
                await db.insert(conn, "never")
        if db.kind == "postgres":
            await tx.rollback()
        else:
            await conn.rollback()
        closed = await db.connect()
        await db.close(closed)
        with pytest.raises(UsageError, match="closed"):
            async with fenced(closed, lead, table=db.fence):
                pass
        assert await db.who(conn) == []
        await lead.release()


async def test_a_missing_privilege_is_named(db: Db) -> None:
    role = f"fence_{secrets.token_hex(3)}"
    async with MemoryElector(name=unique_name()) as elector, connected(db) as admin:
        if db.kind == "postgres":
            await db.run(admin, f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
            await db.run(admin, f"GRANT SELECT ON {db.fence} TO {role}")
            await db.run(admin, f"GRANT INSERT, SELECT ON {db.data} TO {role}")
        else:
            await db.run(admin, f"CREATE USER '{role}'@'%' IDENTIFIED BY 'pw'")
            await db.run(admin, f"GRANT SELECT ON {db.database}.{db.fence} TO '{role}'@'%'")
            await db.run(admin, f"GRANT INSERT, SELECT ON {db.database}.{db.data} TO '{role}'@'%'")
        limited = Db(db.kind, db.dsn)
        limited.user, limited.password, limited.fence, limited.data = role, "pw", db.fence, db.data
        try:
            lead = await elector.acquire()
            async with connected(limited) as conn:
                with pytest.raises(PermanentBackendError, match=r"needs the (SELECT and UPDATE|INSERT) privilege"):
                    async with fenced(conn, lead, table=db.fence):
                        await db.insert(conn, "never")
            assert await db.who(admin) == []
            await lead.release()
        finally:
            if db.kind == "postgres":
                await db.run(admin, f"DROP OWNED BY {role}")
                await db.run(admin, f"DROP ROLE {role}")
            else:
                await db.run(admin, f"DROP USER '{role}'@'%'")


async def test_red1_a_long_election_name_is_fenced_on_mysql_too(db: Db, redis_url: str) -> None:
    """Red team: Redis takes names up to 512 characters, etcd 1024; the MySQL fence table's name is VARBINARY(255).
    INSERT IGNORE truncates the name silently, the row is never found again, and every fenced() fails with an
    AssertionError (under python -O: a TypeError comparing None with the token) instead of working or saying why."""
    from aioelect import RedisElector

    name = unique_name() + "-" + "x" * 300
    async with (
        RedisElector(redis_url, name=name, volatile_tokens=True, lease=3) as elector,
        connected(db) as conn,
    ):
        lead = await elector.acquire(timeout=10)
        try:
            async with fenced(conn, lead, table=db.fence):
                await db.insert(conn, "long")
        except (UsageError, ValueError):
            assert await db.who(conn) == []  # refused at once, saying why: acceptable
        else:
            assert await db.who(conn) == ["long"]
        await lead.release()
