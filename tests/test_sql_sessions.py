"""Sessions on the server per SQL election, counted by the server itself.

MariaDB's ``Threads_connected`` and PostgreSQL's ``pg_stat_activity``: k
candidates of one election hold exactly k sessions while one leads and the
others wait, and every waiter still learns who leads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from aioelect import Elector, MySQLElector, PostgresElector

from .backends import Follower, unique_name
from .harness import MariaDBServer, PostgresServer

FAST: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4, "poll_interval": 0.5}


def mysql_sessions(server: MariaDBServer) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        # The query's own connection is counted too: a constant, gone from every difference.
        rows = server.query("SHOW GLOBAL STATUS LIKE 'Threads_connected'", database="")
        return int(rows[0][1])

    return count


def postgres_sessions(server: PostgresServer) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        rows = server.query(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return int(rows[0][0])

    return count


@pytest.fixture(params=["mysql", "postgres"])
def sql(request: pytest.FixtureRequest) -> tuple[Callable[[str, str], Elector], Callable[[], Awaitable[int]]]:
    if request.param == "mysql":
        dsn: str = request.getfixturevalue("mysql_dsn")
        server: Any = request.getfixturevalue("mariadb")
        return (lambda name, who: MySQLElector(dsn, name=name, identity=who, **FAST)), mysql_sessions(server)
    dsn = request.getfixturevalue("postgres_dsn")
    server = request.getfixturevalue("postgres")
    return (lambda name, who: PostgresElector(dsn, name=name, identity=who, **FAST)), postgres_sessions(server)


async def test_k_candidates_hold_k_sessions(
    sql: tuple[Callable[[str, str], Elector], Callable[[], Awaitable[int]]],
) -> None:
    make, sessions = sql
    name = unique_name("k")
    k = 4
    electors = [make(name, f"cand-{i}") for i in range(k)]
    baseline = await sessions()
    followers: list[Follower] = []
    async with contextlib.AsyncExitStack() as stack:
        for e in electors:
            await stack.enter_async_context(e)
        lead = await electors[0].acquire()
        followers = [Follower(e) for e in electors[1:]]
        try:
            with anyio.fail_after(15):  # every waiter learns the leader...
                while any(e.last_leader != "cand-0" for e in electors[1:]):
                    await asyncio.sleep(0.05)
            # ... over its lock session: one session per candidate, over several lock waits.
            for _ in range(6):
                assert await sessions() - baseline == k
                await asyncio.sleep(0.25)
            await lead.release()
            await electors[0].aclose()  # its kept session too
            with anyio.fail_after(15):
                while not any(f.won.is_set() for f in followers):
                    await asyncio.sleep(0.05)
            winner = next(e for e, f in zip(electors[1:], followers, strict=True) if f.won.is_set())
            with anyio.fail_after(15):  # the others learn the new leader from their lock sessions
                while any(e.last_leader != winner.identity for e in electors[1:]):
                    await asyncio.sleep(0.05)
            for _ in range(4):
                assert await sessions() - baseline == k - 1
                await asyncio.sleep(0.25)
        finally:
            for f in followers:
                await f.close()
    with anyio.fail_after(10):
        while await sessions() != baseline:
            await asyncio.sleep(0.05)
