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

from aioelect import (
    ElectionError,
    Elector,
    Leadership,
    LossKind,
    MySQLElector,
    MySQLSession,
    PostgresElector,
    PostgresSession,
    UsageError,
)
from aioelect.backends.sql.mysql import MySQLBackend
from aioelect.backends.sql.postgres import PostgresBackend

from .backends import Follower, unique_name
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

    @property
    def backend(self) -> type[MySQLBackend] | type[PostgresBackend]:
        """The dialect's backend class, for an elector of its own."""
        return MySQLBackend if self.kind == "mysql" else PostgresBackend


@pytest.fixture(params=["mysql", "postgres"], name="sql")
def sql_fixture(request: pytest.FixtureRequest) -> Sql:
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
            # The session holding the most leaderships goes: the others take its elections over, on two connections.
            gone = max(sessions, key=lambda s: s.held)
            owned = [n for n, (_, e) in leads.items() if e.identity == gone.identity]
            assert owned
            for n in owned:
                del leads[n]
            started = time.monotonic()
            await gone.aclose()
            with anyio.fail_after(60):
                while len(leads) < len(names):
                    await asyncio.sleep(0.05)
            print(f"{sql.kind}: {len(owned)} elections taken over in {time.monotonic() - started:.2f}s")
            # The server counts a closed connection out when its own thread ends, a little after the client's close.
            with anyio.fail_after(10):
                while await sql.sessions() - baseline != 2:
                    await asyncio.sleep(0.05)
            assert sum(s.held for s in sessions if s is not gone) == len(names)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    with anyio.fail_after(10):
        while await sql.sessions() != baseline:
            await asyncio.sleep(0.05)


async def lead_all(electors: list[Elector]) -> tuple[dict[str, Leadership], list[asyncio.Task[None]]]:
    """Each elector acquires in a task of its own, which then keeps the leadership."""
    leads: dict[str, Leadership] = {}

    async def campaign(e: Elector) -> None:
        leads[e.name] = await e.acquire()
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(campaign(e)) for e in electors]
    with anyio.fail_after(30):
        while len(leads) < len(electors):
            await asyncio.sleep(0.05)
    return leads, tasks


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_lost_connection_loses_every_leadership_on_it(sql: Sql, caplog: pytest.LogCaptureFixture) -> None:
    async with sql.session() as session:
        electors = [sql.elector(session, unique_name("fate")) for _ in range(20)]
        leads, tasks = await lead_all(electors)
        try:
            conn = session._conn
            assert conn is not None
            sql.kill(conn.session_id)
            with anyio.fail_after(10):  # fate sharing: all of them, not only one
                while not all(lead.lost for lead in leads.values()):
                    await asyncio.sleep(0.05)
            assert all(lead.lost_kind is LossKind.CONNECTION_LOST for lead in leads.values())
            assert "every leadership on it (20) is lost" in caplog.text
        finally:
            await stop(tasks)
        # The session opens a new connection for the next campaigns.
        again, tasks = await lead_all(electors)
        try:
            assert session._conn is not None and session._conn.session_id != conn.session_id
            assert all(lead.held for lead in again.values())
        finally:
            await stop(tasks)


class CountingRounds:
    """Counts the check statements' rounds of a session."""

    def __init__(self, session: Session) -> None:
        self.rounds = 0
        held_many = session._held_many

        async def counted(conn: Any, backends: Any) -> frozenset[str]:
            self.rounds += 1
            return await held_many(conn, backends)

        session._held_many = counted  # type: ignore[method-assign]


async def test_one_check_round_per_check_interval_confirms_every_lock(sql: Sql) -> None:
    async with sql.session(check_interval=0.2) as session:
        counter = CountingRounds(session)
        electors = [sql.elector(session, unique_name("rounds")) for _ in range(50)]
        leads, tasks = await lead_all(electors)
        try:
            counter.rounds = 0
            await asyncio.sleep(2.0)
            # 50 holds checked every 0.2 s would be 500 checks one by one: the rounds are shared.
            assert 4 <= counter.rounds <= 16, counter.rounds
            assert all(lead.held for lead in leads.values())
        finally:
            await stop(tasks)


async def test_a_waiter_takes_a_released_lock(sql: Sql) -> None:
    """PostgreSQL announces the release (milliseconds); MySQL's waiter finds it at its next poll."""
    poll = 5.0 if sql.kind == "postgres" else 1.0
    name = unique_name("handover")
    async with sql.session(poll_interval=poll) as a, sql.session(poll_interval=poll) as b:
        first, second = sql.elector(a, name), sql.elector(b, name)
        leads, tasks = await lead_all([first])
        waiter = Follower(second)
        try:
            await asyncio.sleep(0.5)  # the waiter has asked once and waits
            released = time.monotonic()
            await leads[name].release()
            await waiter.wait(poll + 3)
            took = time.monotonic() - released
            assert took < (1.0 if sql.kind == "postgres" else poll + 1.0), took
            print(f"{sql.kind}: handover in {took:.3f}s")
        finally:
            await waiter.close()
            await stop(tasks)


async def test_electors_on_a_session_take_only_a_name(sql: Sql) -> None:
    async with sql.session(identity="proc") as session:
        elector_class = MySQLElector if sql.kind == "mysql" else PostgresElector
        with pytest.raises(ValueError, match="either a DSN or session="):
            elector_class(sql.dsn, session=session, name="x")  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="only name="):
            elector_class(session=session, name="x", lease=5)  # type: ignore[call-overload]
        e = elector_class(session=session, name="x")  # type: ignore[call-overload]
        assert e.identity == "proc"
        await e.aclose()
        e = elector_class(session=session, name="x", identity="other")  # type: ignore[call-overload]
        assert e.identity == "other"
        lead = await e.try_acquire()
        assert lead is not None
        # MySQL records each elector's identity with its token; PostgreSQL without schema= shows the session's.
        assert await e.leader() == ("other" if sql.kind == "mysql" else "proc")
        await lead.release()
        with pytest.raises(ValueError, match="already campaigns on 'x'"):
            elector_class(session=session, name="x")  # type: ignore[call-overload]
        await e.aclose()
        elector_class(session=session, name="x")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="closed"):
        elector_class(session=session, name="y")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="unexpected keyword argument 'name'"):
        sql.session(name="x")
    unentered = sql.session()
    with pytest.raises(UsageError, match="enter the"):
        await sql.elector(unentered, "z").acquire()
    await unentered.aclose()


async def test_closing_the_session_closes_its_electors_and_its_connection(sql: Sql) -> None:
    baseline = await sql.sessions()
    session = sql.session()
    await session.__aenter__()
    electors = [sql.elector(session, unique_name("close")) for _ in range(5)]
    leads, tasks = await lead_all(electors)
    waiting = sql.elector(session, electors[0].name + "-w")
    try:
        assert await sql.sessions() - baseline == 1
        await session.aclose()
        assert all(not lead.held for lead in leads.values())
        with pytest.raises(ElectionError):
            await waiting.acquire()
    finally:
        await stop(tasks)
    with anyio.fail_after(10):
        while await sql.sessions() != baseline:
            await asyncio.sleep(0.05)


async def test_waiters_share_one_look_per_poll_interval(sql: Sql) -> None:
    """50 waiters on one session: one statement per poll_interval reads every holder; each waiter knows its leader."""
    names = [unique_name("wait") for _ in range(50)]
    async with sql.session(identity="holder") as a, sql.session(identity="waiter", poll_interval=0.5) as b:
        _, tasks = await lead_all([sql.elector(a, n) for n in names])
        waiters = [sql.elector(b, n) for n in names]
        looks = 0
        holders_many = b._holders_many

        async def counted(conn: Any, backends: Any) -> Any:
            nonlocal looks
            looks += 1
            return await holders_many(conn, backends)

        b._holders_many = counted  # type: ignore[method-assign]
        campaigns = [asyncio.create_task(w.acquire()) for w in waiters]
        try:
            with anyio.fail_after(15):
                while any(w.last_leader != "holder" for w in waiters):
                    await asyncio.sleep(0.05)
            looks = 0
            await asyncio.sleep(2.0)
            # One look per 0.5 s for all 50 (not 50 per 0.5 s).
            assert 2 <= looks <= 8, looks
            assert not any(c.done() for c in campaigns)
        finally:
            await stop([*tasks, *campaigns])  # type: ignore[list-item]


async def test_a_statement_that_closes_the_connection_loses_every_leadership_at_once(
    sql: Sql, tcp_proxy_factory: Callable[[str, int], Any]
) -> None:
    """One elector's statement times out and closes the shared connection: the server frees every lock on it at
    once, so every other leadership on it is lost at once too, before a candidate elsewhere can take its lock."""
    slow: dict[str, Any] = {
        "lease": 10, "check_interval": 3.0, "check_timeout": 0.5, "renew_deadline": 6.0, "poll_interval": 0.3
    }  # fmt: skip
    proxy = tcp_proxy_factory(sql.server.host, sql.server.port)
    via_proxy = sql.dsn.replace(f":{sql.server.port}/", f":{proxy.port}/")
    assert via_proxy != sql.dsn
    jobs, mail = unique_name("jobs"), unique_name("mail")
    other = MySQLElector if sql.kind == "mysql" else PostgresElector
    session: Session = (
        MySQLSession(via_proxy, identity="A", **slow)
        if sql.kind == "mysql"
        else PostgresSession(via_proxy, identity="A", **slow)
    )
    b_leads: list[tuple[Leadership, bool]] = []
    async with session, other(sql.dsn, name=jobs, identity="B", **slow) as b:
        a_jobs, a_mail = sql.elector(session, jobs), sql.elector(session, mail)
        async with a_jobs, a_mail:
            with anyio.fail_after(15):
                la = await a_jobs.acquire()

            async def follow() -> None:
                lb = await b.acquire()
                b_leads.append((lb, la.held))  # A's leadership, the moment B's starts
                await asyncio.sleep(3600)  # B keeps it (a leadership ends with the task that took it)

            task = asyncio.create_task(follow())
            try:
                await asyncio.sleep(0.5)  # B waits on the lock
                proxy.delay(0.8)  # one slow moment on A's shared connection: longer than check_timeout
                with anyio.fail_after(20), contextlib.suppress(ElectionError):
                    await a_mail.try_acquire()
                proxy.passthrough()
                with anyio.fail_after(20):
                    while not b_leads:
                        await asyncio.sleep(0.01)
                lb, a_held_then = b_leads[0]
                assert lb.held
                assert not a_held_then, "A still led when B took the lock: two leaders"
                assert la.lost_kind is LossKind.CONNECTION_LOST
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_a_shared_session_ended_by_the_server_loses_every_leadership_at_once(sql: Sql) -> None:
    """The server ends the shared session between two check rounds (MySQL's KILL, PostgreSQL's
    pg_terminate_backend), freeing every lock on it: every leadership on it is lost as soon as the driver sees the
    connection end, before a candidate elsewhere can take a lock."""
    slow: dict[str, Any] = {
        "lease": 10, "check_interval": 3.0, "check_timeout": 0.5, "renew_deadline": 6.0, "poll_interval": 0.3
    }  # fmt: skip
    jobs, mail = unique_name("jobs"), unique_name("mail")
    b_leads: list[tuple[Leadership, bool]] = []
    own = MySQLElector if sql.kind == "mysql" else PostgresElector
    async with (
        sql.session(identity="A", **slow) as session,
        own(sql.dsn, name=jobs, identity="B", **slow) as b,
    ):
        a_jobs, a_mail = sql.elector(session, jobs), sql.elector(session, mail)
        async with a_jobs, a_mail:
            with anyio.fail_after(15):
                la = await a_jobs.acquire()
                lm = await a_mail.try_acquire()
            assert lm is not None

            async def follow() -> None:
                lb = await b.acquire()
                b_leads.append((lb, la.held))  # A's leadership, the moment B's starts
                await asyncio.sleep(3600)  # B keeps it (a leadership ends with the task that took it)

            task = asyncio.create_task(follow())
            try:
                await asyncio.sleep(0.5)  # B waits on the lock
                conn = session._conn
                assert conn is not None
                sql.kill(conn.session_id)
                with anyio.fail_after(20):
                    while not b_leads:
                        await asyncio.sleep(0.01)
                lb, a_held_then = b_leads[0]
                assert lb.held
                assert not a_held_then, "A still led when B took the lock: two leaders"
                assert la.lost_kind is LossKind.CONNECTION_LOST
                assert lm.lost_kind is LossKind.CONNECTION_LOST  # fate sharing: the other leadership too
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
