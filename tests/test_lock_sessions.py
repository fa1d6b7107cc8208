"""Where a session-lock backend runs its requests (its own sessions, or a shared session): each elector of a name
leads alone, a kept session serves one identity, and nothing is left on the servers (MySQL/MariaDB, PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from aioelect import MySQLElector, PostgresElector

from .backends import unique_name
from .test_sql_shared import FAST, Sql, sql_fixture  # noqa: F401 - the ``sql`` fixture (both databases)


async def test_an_elector_given_a_shared_session_as_sessions_never_leads_beside_its_member(sql: Sql) -> None:
    """``sessions=`` is no elector option: given to an elector, it is refused, or it must not make a second
    leader of an election on the shared session's one connection (a session lock is re-entrant there)."""
    name = unique_name("twice")
    elector_class: Any = MySQLElector if sql.kind == "mysql" else PostgresElector
    async with sql.session() as session:
        member = sql.elector(session, name)
        try:
            stray = elector_class(sql.dsn, name=name, sessions=session)
        except TypeError as exc:  # refused as an unknown option: safe
            assert "sessions" in str(exc)
            return
        try:
            first = await member.try_acquire()
            second = await stray.try_acquire()
            assert first is None or second is None, (
                f"two leaders of {name!r}: {member.identity} and {stray.identity}, both on shared session {session!r}"
            )
        finally:
            await stray.aclose()
            await member.aclose()


def test_the_adversary_reads_the_session_an_elector_keeps() -> None:
    """soak/adversary's MariaDB operator finds the lock session an elector keeps after a release (its id), and
    none once a campaign took it back: it restarts the server to reuse exactly those ids."""
    import aioelect
    from soak.adversary.run import OPTIONS
    from soak.adversary.servers import MariaDBTarget
    from tests.harness import MissingBinaryError
    from tests.harness.plugin import server_unavailable, skip_if_external

    skip_if_external("mysql")
    target = MariaDBTarget("red-kept")
    try:
        target.start()
    except MissingBinaryError as exc:
        target.cleanup()
        server_unavailable(str(exc))

    async def main() -> tuple[list[int], int, list[int]]:
        async with aioelect.new(mysql=target.target(), name=target.name, identity="A", **OPTIONS["mysql"]) as a:
            target.electors.append(a)
            lead = await a.acquire()
            held_by = int(target.server.query("SELECT IS_USED_LOCK(%s)", (target.name,), database="")[0][0])
            await lead.release()
            kept = target.kept_ids(idle=0)
            again = await a.acquire()
            taken = target.kept_ids(idle=0)
            await again.release()
            return kept, held_by, taken

    try:
        kept, held_by, taken = anyio.run(main)
    finally:
        target.cleanup()
    assert taken == []
    assert kept == [held_by]


async def test_a_kept_session_serves_only_the_identity_it_was_opened_for(sql: Sql) -> None:
    """A campaign for another identity never takes the session kept from the last leadership: it opens its own."""
    name = unique_name("who")
    backend: Any = sql.backend(sql.dsn, name=name, **FAST)
    try:
        hold = await backend.campaign("first")
        await hold.release()
        kept = backend.sessions.kept
        assert kept is not None and kept.identity == "first"
        other = await backend.campaign("second")
        try:
            assert other.session_id != int(kept.conn.session_id), "the kept session of 'first' campaigns for 'second'"
        finally:
            await other.release()
    finally:
        await backend.aclose()


async def test_a_cancelled_campaign_leaves_no_session_and_aclose_leaves_no_connection(sql: Sql) -> None:
    """A campaign cancelled while its request waits on the server leaves no session behind, and a closed backend
    (kept session, observer) leaves no connection."""
    name = unique_name("cancel")
    baseline = await sql.sessions()
    leader: Any = sql.backend(sql.dsn, name=name, **FAST)
    waiter: Any = sql.backend(sql.dsn, name=name, **{**FAST, "poll_interval": 3.0})
    try:
        hold = await leader.campaign("leader")
        await hold.release()
        hold = await leader.campaign("leader")  # on the kept session
        assert await waiter.leader() == "leader"  # the waiter's observer is open
        with anyio.move_on_after(1.5):  # the waiter's second request waits on the server (3 s)
            await waiter.campaign("waiter")
        with anyio.fail_after(5):
            while await sql.sessions() - baseline != 2:  # the leader's session and the waiter's observer
                await asyncio.sleep(0.05)
        assert await waiter.leader() == "leader"
        await hold.release()
    finally:
        await waiter.aclose()
        await leader.aclose()
    with anyio.fail_after(5):
        while await sql.sessions() != baseline:
            await asyncio.sleep(0.05)


async def test_a_cancelled_shared_campaign_leaves_no_waiter_on_the_session(sql: Sql) -> None:
    """A campaign on a shared session that is cancelled (or a try_acquire that finds the lock busy) leaves its
    election out of the session's waiting rounds."""
    name = unique_name("sharedwait")
    async with sql.session() as a, sql.session() as b:
        first, second = sql.elector(a, name), sql.elector(b, name)
        lead = await first.acquire()
        assert await second.try_acquire() is None
        assert name not in b._waits  # type: ignore[attr-defined]
        with anyio.move_on_after(1.2):
            await second.acquire()
        assert name not in b._waits  # type: ignore[attr-defined]
        await lead.release()
        again = await second.try_acquire()
        assert again is not None
        await again.release()
