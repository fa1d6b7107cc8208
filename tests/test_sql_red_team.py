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
