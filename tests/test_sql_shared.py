"""Shared MySQL and PostgreSQL sessions: one connection per process holds every leadership of the process.

Connection counts come from the servers (MariaDB's ``Threads_connected``,
PostgreSQL's ``pg_stat_activity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from aioelect import Elector, Leadership, MySQLElector, MySQLSession, PostgresElector, PostgresSession

from .backends import unique_name
from .test_sql_sessions import mysql_sessions, postgres_sessions

FAST: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4, "poll_interval": 0.5}

Session = MySQLSession | PostgresSession


class Sql:
    def __init__(self, kind: str, dsn: str, server: Any) -> None:
        self.kind = kind
        self.dsn = dsn
        self.server = server
        self.sessions: Callable[[], Awaitable[int]] = (
            mysql_sessions(server) if kind == "mysql" else postgres_sessions(server)
        )

    def session(self, **kw: Any) -> Session:
        if self.kind == "mysql":
            return MySQLSession(self.dsn, **{**FAST, **kw})
        return PostgresSession(self.dsn, **{**FAST, **kw})

    def elector(self, session: Session, name: str) -> Elector:
        if isinstance(session, MySQLSession):
            return MySQLElector(session=session, name=name)
        return PostgresElector(session=session, name=name)

    def kill(self, session_id: int) -> None:
        if self.kind == "mysql":
            self.server.query("KILL %s", (session_id,), database="")
        else:
            self.server.query("SELECT pg_terminate_backend($1)", (session_id,))


@pytest.fixture(params=["mysql", "postgres"])
def sql(request: pytest.FixtureRequest) -> Sql:
    if request.param == "mysql":
        return Sql("mysql", request.getfixturevalue("mysql_dsn"), request.getfixturevalue("mariadb"))
    return Sql("postgres", request.getfixturevalue("postgres_dsn"), request.getfixturevalue("postgres"))


async def test_three_sessions_hold_200_elections_on_three_connections(sql: Sql) -> None:
    names = [unique_name("many") for _ in range(200)]
    baseline = await sql.sessions()
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(sql.session(identity=f"proc-{i}")) for i in range(3)]
        electors = [sql.elector(s, n) for s in sessions for n in names]
        leads: dict[str, tuple[Leadership, Elector]] = {}
        tasks = []

        async def campaign(e: Elector) -> None:
            lead = await e.acquire()
            assert e.name not in leads, f"{e.name} led twice"
            leads[e.name] = (lead, e)
            await asyncio.sleep(3600)

        tasks = [asyncio.create_task(campaign(e)) for e in electors]
        try:
            with anyio.fail_after(60):
                while len(leads) < len(names):
                    await asyncio.sleep(0.1)
            assert await sql.sessions() - baseline == 3
            assert sum(s.held for s in sessions) == len(names)
            # The first session goes: the others take its elections over, still on three... two connections.
            owned = [n for n, (_, e) in leads.items() if e.identity == "proc-0"]
            for n in owned:
                del leads[n]
            started = time.monotonic()
            await sessions[0].aclose()
            with anyio.fail_after(60):
                while len(leads) < len(names):
                    await asyncio.sleep(0.05)
            print(f"{sql.kind}: {len(owned)} elections taken over in {time.monotonic() - started:.2f}s")
            assert await sql.sessions() - baseline == 2
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    with anyio.fail_after(10):
        while await sql.sessions() != baseline:
            await asyncio.sleep(0.05)
