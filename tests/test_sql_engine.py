"""The session-lock engine's own behaviours, the same on MariaDB and PostgreSQL.

How an error it catches is classified (a refusal is a PermanentBackendError at
once, an unreachable server a BackendUnavailable), what a session has pending
on the server, and why a leadership ended (its LossKind).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from aioelect import BackendUnavailable, Elector, LossKind, PermanentBackendError
from aioelect.backends.sql._session_lock import Pending

from .backends import unique_name, with_database
from .harness import free_port
from .session_locks import releasing_its_lock_while_held
from .test_sql_shared import Sql, sql_fixture  # noqa: F401 - the fixture sql, for both dialects

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4, "poll_interval": 0.5}


def unknown_database(sql: Sql) -> str:
    """What the server says of an unknown database."""
    return "Unknown database" if sql.kind == "mysql" else "3D000"


def invalid_sql(sql: Sql, conn: Any) -> Any:
    """A statement the server refuses with a plain SQL error, run on ``conn`` as a lock request."""
    if sql.kind == "mysql":
        return conn.scalar("SELEC 1", timeout=2, pending=Pending.LOCK_REQUEST)
    return conn.fetchval("SELEC 1", timeout=2, pending=Pending.LOCK_REQUEST)


# --- errors --------------------------------------------------------------------------


async def test_a_refusal_is_a_permanent_backend_error_at_once_on_every_path(sql: Sql) -> None:
    """An unknown database: acquire(), try_acquire(), leader() and a shared session raise it at once, unretried."""
    dsn = with_database(sql.dsn, "no_such_db_" + unique_name("x").replace("-", "_"))
    async with Elector(sql.backend(dsn, name=unique_name(), **FAST)) as elector:
        started = time.monotonic()
        with (
            anyio.fail_after(10),
            pytest.raises(PermanentBackendError, match=f"refused the campaign.*{unknown_database(sql)}"),
        ):
            await elector.acquire()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="refused the campaign"):
            await elector.try_acquire()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="refused the query"):
            await elector.leader()
        assert time.monotonic() - started < 5, "a permanent error must not be retried"
    with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="refused the shared session"):
        async with Sql(sql.kind, dsn, sql.server).session():
            pass


async def test_an_unreachable_server_is_backend_unavailable_for_one_attempt(sql: Sql) -> None:
    port = free_port()
    dsn = f"{sql.dsn.split('://')[0]}://root@127.0.0.1:{port}/db"
    async with Elector(sql.backend(dsn, name=unique_name(), connect_timeout=0.5, fencing=False)) as elector:
        with anyio.fail_after(10), pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port} is unreachable"):
            await elector.try_acquire()
        with anyio.fail_after(10), pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port} is unreachable"):
            await elector.leader()


# --- what a session has pending --------------------------------------------------------


async def test_a_lock_request_is_pending_until_its_answer_is_read(sql: Sql) -> None:
    """Answered (granted, busy or refused by the server): nothing pending. Cut off: pending, and closed for good."""
    name = unique_name()
    holder, waiter = sql.backend(sql.dsn, name=name, **FAST), sql.backend(sql.dsn, name=name, **FAST)
    held = await holder._new_session("holder")
    waiting = await waiter._new_session("waiter")
    try:
        assert held.pending is Pending.NOTHING
        assert await holder._try_request(held) and held.pending is Pending.NOTHING
        assert not await waiter._try_request(waiting) and waiting.pending is Pending.NOTHING
        with pytest.raises(Exception, match=r"(?i)syntax"):
            await invalid_sql(sql, waiting)
        assert waiting.pending is Pending.NOTHING and not waiting.broken, "the server answered: nothing is pending"
        with anyio.move_on_after(0.3):
            await waiter._request(waiting)  # waits on the server for the held lock: cut off
        assert waiting.pending is Pending.LOCK_REQUEST and waiting.broken
        await waiter._drop(waiting)  # ends the waiting session on the server
    finally:
        waiting.close()
        await held.aclose(1.0)
        await holder.aclose()
        await waiter.aclose()


# --- why a leadership ended ------------------------------------------------------------


async def test_a_lock_no_longer_held_by_our_session_is_deposed(sql: Sql) -> None:
    ReleasesItsLock = releasing_its_lock_while_held(sql.backend)
    name = unique_name()
    async with Elector(ReleasesItsLock(sql.dsn, name=name, **FAST)) as elector:
        lead = await elector.acquire()
        with anyio.fail_after(10):
            await lead.wait_lost()
        assert lead.lost_kind is LossKind.DEPOSED, lead.lost_reason
        assert "no longer held by our session" in (lead.lost_reason or "")
        await lead.release()


async def test_a_session_the_server_ends_is_a_lost_connection(sql: Sql) -> None:
    async with Elector(sql.backend(sql.dsn, name=unique_name(), **FAST)) as elector:
        lead = await elector.acquire()
        conn = lead._hold._conn  # type: ignore[attr-defined]
        sql.kill(conn.session_id)
        with anyio.fail_after(10):
            await lead.wait_lost()
        assert lead.lost_kind is LossKind.CONNECTION_LOST, lead.lost_reason
        await lead.release()
