"""Red-team probes of the session-lock engine's LockSessions seam (MySQL/MariaDB and PostgreSQL, real servers)."""

from __future__ import annotations

from typing import Any

from aioelect import MySQLElector, PostgresElector

from .backends import unique_name
from .test_sql_shared import Sql, sql_fixture  # noqa: F401 - the ``sql`` fixture (both databases)


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
    import anyio

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
