"""What is the MySQL backend's own: GET_LOCK names, options, errors, polling cost, server faults."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import aiomysql
import anyio
import pymysql
import pytest

from aioelect import (
    BackendUnavailable,
    Elector,
    LeadershipLost,
    LossKind,
    MySQLElector,
    PermanentBackendError,
    leadership,
)
from aioelect.backends.sql._session_lock import Pending
from aioelect.backends.sql.mysql import MySQLBackend

from .backends import Follower, unique_name, with_database
from .harness import MariaDBServer, TCPProxy, free_port
from .session_locks import losing_its_first_grant, unconfirmed_release

pytestmark = pytest.mark.usefixtures("mariadb")


def status(server: MariaDBServer, variable: str) -> int:
    return int(server.query("SHOW GLOBAL STATUS LIKE %s", (variable,), database="")[0][1])


# --- construction ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "x" * 65}, "at most 64"),
        ({"name": ""}, "name"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"poll_interval": float("nan")}, "poll_interval"),
        ({"check_interval": -1}, "check_interval"),
        ({"lease": 2.5}, "whole number"),
        ({"lease": 1}, "at least 2"),
        ({"lease": 5, "renew_deadline": 5}, "shorter than lease"),
        ({"lease": 5, "check_interval": 2, "check_timeout": 2, "renew_deadline": 3}, "must not exceed"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"port": 0}, "port"),
        ({"identity": "two\nlines"}, "identity"),
    ],
)
def test_bad_options_raise_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MySQLElector("mysql://root@127.0.0.1:3306/db", **{"name": "t", **kwargs})  # type: ignore[arg-type]


def test_bad_dsn_and_missing_host() -> None:
    with pytest.raises(ValueError, match="scheme"):
        MySQLElector("postgres://root@127.0.0.1/db", name="t")
    with pytest.raises(ValueError, match="DSN"):
        MySQLElector("127.0.0.1:3306", name="t")
    with pytest.raises(ValueError, match="dsn or a host"):
        MySQLElector(name="t")
    with pytest.raises(ValueError, match="fencing"):
        MySQLElector("mysql://root@127.0.0.1:3306", fencing=True, name="t")


def test_password_never_in_repr_or_errors() -> None:
    elector = MySQLElector("mysql://user:s3cr3t-pw@127.0.0.1:3306/db", name="t")
    assert "s3cr3t-pw" not in repr(elector)
    with pytest.raises(ValueError) as info:
        MySQLElector("mysql://user:s3cr3t-pw@127.0.0.1:notaport/db", name="t")
    assert "s3cr3t-pw" not in str(info.value)


# --- permanent and transient errors -----------------------------------------------


async def test_wrong_password_raises_at_once(mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture) -> None:
    dsn = mariadb.create_user("elect_user", "right-password")
    bad = dsn.replace("right-password", "wrong-password")
    async with MySQLElector(bad, name=unique_name()) as elector:
        with anyio.fail_after(5), pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.acquire()
        assert "wrong-password" not in caplog.text
        with pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.leader()


async def test_unknown_database_raises_at_once(mariadb: MariaDBServer) -> None:
    dsn = f"mysql://root@127.0.0.1:{mariadb.port}/no_such_db"
    async with MySQLElector(dsn, name=unique_name()) as elector:
        with anyio.fail_after(5), pytest.raises(PermanentBackendError, match="Unknown database"):
            await elector.acquire()


async def test_unreachable_server_is_retried_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    dsn = f"mysql://root@127.0.0.1:{free_port()}/db"
    async with MySQLElector(dsn, name=unique_name(), connect_timeout=0.5) as elector:
        with anyio.move_on_after(1.5) as scope:
            await elector.acquire()
        assert scope.cancelled_caught, "acquire must keep campaigning while the server is down"
        assert not elector.leading
        assert "retrying" in caplog.text
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="unreachable"):
            await elector.leader()
        assert time.monotonic() - started < 5


# --- polling and connections ------------------------------------------------------


async def test_follower_polls_once_per_interval_on_one_connection(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with (
        MySQLElector(mariadb.dsn, name=name) as leader,
        MySQLElector(mariadb.dsn, name=name, poll_interval=0.5) as follower,
    ):
        lead = await leader.acquire()
        task = asyncio.create_task(follower.acquire())
        await asyncio.sleep(0.3)
        connections, selects = status(mariadb, "Connections"), status(mariadb, "Com_select")
        await asyncio.sleep(3.0)
        new_connections = status(mariadb, "Connections") - connections - 2  # our two status queries
        polls = status(mariadb, "Com_select") - selects
        # 3 s / 0.5 s = 6 polls by the follower, 3 checks by the leader (1 s), 2 for us.
        assert new_connections == 0, f"{new_connections} new connections while waiting"
        assert polls <= 6 + 3 + 2 + 2, f"{polls} SELECTs in 3 s"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await lead.release()


async def test_campaign_error_ends_the_session_still_waiting_for_the_lock(
    mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower whose connection fails while it waits in GET_LOCK ends that server thread with a KILL.

    The server would otherwise keep the thread waiting until it notices the
    client gone, and could grant it the lock, held for a session nobody reads.
    """
    name = unique_name()

    def waiting() -> set[int]:
        rows = mariadb.query(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE %s", (f"%GET_LOCK('{name}'%",)
        )
        return {int(row[0]) for row in rows}

    with TCPProxy(mariadb.host, mariadb.port) as proxy:
        via_proxy = mariadb.dsn.replace(f":{mariadb.port}/", f":{proxy.port}/")
        async with (
            MySQLElector(mariadb.dsn, name=name) as leader,
            MySQLElector(via_proxy, name=name, poll_interval=10) as follower,
        ):
            lead = await leader.acquire()
            task = asyncio.create_task(follower.acquire())
            with anyio.fail_after(5):
                while not (old := waiting()):
                    await asyncio.sleep(0.05)
            kills = status(mariadb, "Com_kill")
            # Both calls return before the event loop runs again: the follower sees a reset, then a healed proxy.
            proxy.drop()
            proxy.heal()
            with anyio.fail_after(5):
                while "campaign interrupted" not in caplog.text or old & waiting():
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            assert status(mariadb, "Com_kill") > kills, "the failed campaign did not end its waiting thread"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await lead.release()


async def test_follower_that_waited_past_its_deadline_keeps_the_leadership_it_wins(mariadb: MariaDBServer) -> None:
    """A follower whose lock request waited longer than renew_deadline still leads after winning.

    The case poll_interval=10, lease=10 scaled down to 4 and 4. The leadership
    is dated from a statement sent after the grant, not from the request:
    dated from the request, it would start expired and be lost at once, on
    every campaign.
    """
    name = unique_name()
    timing = {"lease": 4, "check_interval": 0.3, "check_timeout": 0.7, "poll_interval": 4}  # renew_deadline 2.8 s
    async with MySQLElector(mariadb.dsn, name=name) as a, MySQLElector(mariadb.dsn, name=name, **timing) as b:
        lead_a = await a.acquire()
        follower = Follower(b)
        await asyncio.sleep(3.2)  # b's GET_LOCK(name, 4) has been waiting longer than its 2.8 s deadline
        await lead_a.release()
        lead_b = await follower.wait(5)
        won = time.monotonic()
        await asyncio.sleep(0.5)
        assert lead_b.held, f"won and lost at once: {lead_b.lost_reason}"
        await asyncio.sleep(won + 2.8 + 0.5 - time.monotonic())  # past the first renew deadline
        assert lead_b.held, lead_b.lost_reason
        await follower.close()


async def test_tiny_poll_interval_is_no_busy_loop(mariadb: MariaDBServer) -> None:
    """A server may return GET_LOCK(name, t) at once for a small t (MySQL truncates it to whole seconds)."""
    name = unique_name()
    async with (
        MySQLElector(mariadb.dsn, name=name) as leader,
        MySQLElector(mariadb.dsn, name=name, poll_interval=0.001) as follower,
    ):
        lead = await leader.acquire()
        task = asyncio.create_task(follower.acquire())
        await asyncio.sleep(0.3)
        selects = status(mariadb, "Com_select")
        await asyncio.sleep(2.0)
        polls = status(mariadb, "Com_select") - selects
        # At most one GET_LOCK a second (plus slack), 2 checks by the leader, 1 for us.
        assert polls <= 3 + 2 + 1 + 2, f"{polls} SELECTs in 2 s"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await lead.release()


async def test_follower_takes_over_when_leader_connection_is_killed(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name) as a, MySQLElector(mariadb.dsn, name=name) as b:
        lead_a = await a.acquire()
        follower = Follower(b)
        await asyncio.sleep(0.2)
        holder = mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")[0][0]
        killed = time.monotonic()
        mariadb.query(f"KILL {int(holder)}", database="")
        lead_b = await follower.wait(5)
        assert time.monotonic() - killed < 1.0
        with anyio.fail_after(5):
            await lead_a.wait_lost()
        assert "connection" in (lead_a.lost_reason or "")
        assert lead_b.held
        await follower.close()


async def test_leader_identity_without_fencing_is_the_connection(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, fencing=False) as elector:
        assert await elector.leader() is None
        lead = await elector.acquire()
        holder = mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")[0][0]
        assert (await elector.leader() or "").startswith(f"connection {holder} from 127.0.0.1")
        assert lead.token is None
        await lead.release()


async def test_leader_waits_for_a_new_holders_record(mariadb: MariaDBServer) -> None:
    # Between GET_LOCK and the fencing row, a new leader is only a connection: leader() (and
    # so observe()) must wait for its identity instead of reporting the connection.
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, fencing=True) as elector:
        await (await elector.acquire()).release()  # the table and a row of a previous leader
        raw = await aiomysql.connect(
            host=mariadb.host, port=mariadb.port, user="root", db=mariadb.database, autocommit=True
        )
        try:
            async with raw.cursor() as cur:
                await cur.execute("SELECT GET_LOCK(%s, 0), CONNECTION_ID()", (name,))
                ((got, holder),) = await cur.fetchall()
            assert got == 1
            seen: list[str | None] = []
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    seen.append(await elector.leader())

                tg.start_soon(ask)
                await asyncio.sleep(0.1)
                assert seen == []
                async with raw.cursor() as cur:
                    await cur.execute(
                        "UPDATE aioelect_leaders SET holder = 'late', connection_id = %s WHERE name = %s",
                        (holder, name),
                    )
            assert seen == ["late"]
            # A holder that never records itself is reported by its connection, after a bound.
            async with raw.cursor() as cur:
                await cur.execute("UPDATE aioelect_leaders SET connection_id = 0 WHERE name = %s", (name,))
            started = time.monotonic()
            assert (await elector.leader() or "").startswith(f"connection {holder} from 127.0.0.1")
            assert time.monotonic() - started < 2.0
        finally:
            raw.close()


async def test_quiet_leader_is_kept_alive_past_wait_timeout(mariadb: MariaDBServer) -> None:
    """A leader whose connection would idle out (wait_timeout = lease) stays leader through its checks."""
    name = unique_name()
    opts = {"lease": 2, "check_interval": 0.3, "check_timeout": 0.4, "renew_deadline": 1.2}
    async with MySQLElector(mariadb.dsn, name=name, **opts) as a, MySQLElector(mariadb.dsn, name=name) as b:
        lead = await a.acquire()
        follower = asyncio.create_task(b.acquire())
        await asyncio.sleep(5)  # well past the 2 s wait_timeout
        assert lead.held and not follower.done()
        follower.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
        await lead.release()


# --- server faults --------------------------------------------------------------------


async def test_campaign_survives_server_restart(fresh_mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    name = unique_name()
    async with MySQLElector(fresh_mariadb.dsn, name=name) as a, MySQLElector(fresh_mariadb.dsn, name=name) as b:
        lead_a = await a.acquire()
        follower = Follower(b)
        await asyncio.sleep(0.3)
        await anyio.to_thread.run_sync(fresh_mariadb.stop)
        with anyio.fail_after(10):
            await lead_a.wait_lost()
        await asyncio.sleep(1.0)  # the follower retries against a dead server
        assert not follower.won.is_set()
        await anyio.to_thread.run_sync(fresh_mariadb.start)
        lead_b = await follower.wait(20)
        assert lead_b.held
        assert "retrying" in caplog.text
        # Exactly one leader afterwards: the old one is not leading and cannot campaign past b.
        assert not lead_a.held
        again = asyncio.create_task(a.acquire())
        await asyncio.sleep(0.5)
        assert not again.done()
        again.cancel()
        with pytest.raises(asyncio.CancelledError):
            await again
        await lead_b.release()
        await follower.close()


def connection_with_id(server: MariaDBServer, wanted: int, tries: int = 500) -> Any:
    """A new root connection whose CONNECTION_ID() is ``wanted`` (connections are opened until one gets it)."""
    for _ in range(tries):
        conn = pymysql.connect(host=server.host, port=server.port, user="root", connect_timeout=5, read_timeout=5)
        if conn.thread_id() == wanted:
            return conn
        conn.close()
        if conn.thread_id() > wanted:
            break
    raise AssertionError(f"no connection got id {wanted}")


async def test_kept_session_from_before_a_restart_never_kills_the_session_now_holding_its_id(
    fresh_mariadb: MariaDBServer,
) -> None:
    """A session kept across a server restart is found dead before it is used, and no KILL names its old id.

    After the restart the old connection id belongs to another session (here a plain connection of the
    same user): it must survive the elector's next campaign.
    """
    name = unique_name()
    async with MySQLElector(fresh_mariadb.dsn, name=name, lease=30, fencing=False) as elector:
        lead = await elector.acquire()
        old_id = lock_holder(fresh_mariadb, name)
        await lead.release()
        assert old_id is not None
        await anyio.to_thread.run_sync(fresh_mariadb.restart)
        other = await anyio.to_thread.run_sync(connection_with_id, fresh_mariadb, old_id)
        try:
            with anyio.fail_after(20):
                lead = await elector.acquire()
            assert lock_holder(fresh_mariadb, name) != old_id
            await lead.release()
            with other.cursor() as cursor:  # the session that now has the old id was not killed
                cursor.execute("SELECT CONNECTION_ID()")
                assert cursor.fetchone()[0] == old_id
        finally:
            other.close()


async def test_fencing_tokens_increase_across_restarts(fresh_mariadb: MariaDBServer) -> None:
    name = unique_name()
    tokens = []
    async with MySQLElector(fresh_mariadb.dsn, name=name, fencing=True, identity="fenced") as elector:
        for _ in range(2):
            lead = await elector.acquire()
            assert await elector.leader() == "fenced"
            tokens.append(lead.token)
            await lead.release()
        await anyio.to_thread.run_sync(fresh_mariadb.restart)
        lead = await elector.acquire()
        tokens.append(lead.token)
        await lead.release()
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


async def test_killed_lock_connection_cancels_leadership_body(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, check_interval=0.5, check_timeout=1.0) as elector:
        with pytest.raises(LeadershipLost):
            async with leadership(elector):
                holder = mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")[0][0]
                mariadb.query(f"KILL {int(holder)}", database="")
                killed = time.monotonic()
                await asyncio.sleep(30)
        assert time.monotonic() - killed < 0.5 + 1.0 + 0.5


async def test_galera_node_is_refused_unless_allowed(caplog: pytest.LogCaptureFixture) -> None:
    server = MariaDBServer(extra_args=["--wsrep-on=ON", "--wsrep-provider=none", "--binlog-format=ROW"])
    try:
        await anyio.to_thread.run_sync(server.start)
        async with MySQLElector(server.dsn, name=unique_name()) as elector:
            with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="Galera"):
                await elector.acquire()
        async with MySQLElector(server.dsn, name=unique_name(), allow_unsafe_topology=True) as elector:
            lead = await elector.acquire()
            assert lead.held
            await lead.release()
        assert "unsafe topology allowed" in caplog.text
    finally:
        await anyio.to_thread.run_sync(server.cleanup)


async def test_frozen_server_is_a_loss_for_the_leader_and_no_hang_for_followers(
    fresh_mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    name = unique_name()
    opts = {"check_interval": 0.3, "check_timeout": 0.7, "poll_interval": 0.5, "connect_timeout": 1.0}
    async with (
        MySQLElector(fresh_mariadb.dsn, name=name, **opts) as a,
        MySQLElector(fresh_mariadb.dsn, name=name, **opts) as b,
    ):
        lead = await a.acquire()
        follower = Follower(b)
        await asyncio.sleep(0.2)
        fresh_mariadb.freeze()
        try:
            frozen = time.monotonic()
            with anyio.fail_after(5):
                await lead.wait_lost()
            assert time.monotonic() - frozen < 0.3 + 0.7 + 0.5
            assert "within" in (lead.lost_reason or "")
            await asyncio.sleep(2.0)
            assert not follower.won.is_set(), "nobody may lead while the server is frozen"
            assert "retrying" in caplog.text, "a follower must not hang on a server that never answers"
        finally:
            fresh_mariadb.thaw()
        lead_b = await follower.wait(20)
        assert lead_b.held
        await follower.close()


# --- fencing tokens on by default ------------------------------------------------------------------------


async def test_default_elector_has_a_token_and_reports_identities(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, identity="quick") as elector, leadership(elector) as lead:
        assert lead.token is not None and lead.token >= 1
        assert await elector.leader() == "quick"
        rows = mariadb.query("SELECT token, holder FROM aioelect_leaders WHERE name = %s", (name,))
        assert rows[0] == (lead.token, "quick")


def test_default_fencing_without_a_database_names_the_fix() -> None:
    with pytest.raises(ValueError, match="database") as info:
        MySQLElector("mysql://u:s3cret@127.0.0.1:3306", name="t")
    message = str(info.value)
    assert "fencing=False" in message and "aioelect_leaders" in message and "s3cret" not in message
    MySQLElector("mysql://u@127.0.0.1:3306", name="t", fencing=False)  # without tokens, no database is needed


async def test_a_role_without_create_gets_the_privilege_naming_error(mariadb: MariaDBServer) -> None:
    database = f"nocreate_{unique_name('db').replace('-', '_')}"
    mariadb.query(f"CREATE DATABASE {database}", database="")
    user = f"nc_{unique_name('u').replace('-', '_')}"
    mariadb.query("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, "pw-Secret-9"), database="")
    mariadb.query(f"GRANT SELECT, INSERT, UPDATE ON {database}.* TO %s@'%%'", (user,), database="")
    dsn = f"mysql://{user}:pw-Secret-9@{mariadb.host}:{mariadb.port}/{database}"
    try:
        name = unique_name()
        async with MySQLElector(dsn, name=name, connect_timeout=2) as elector:
            started = time.monotonic()
            with anyio.fail_after(10), pytest.raises(PermanentBackendError) as info:
                await elector.acquire()
            assert time.monotonic() - started < 3, "a missing privilege is permanent: never retried"
            message = str(info.value)
            assert "CREATE" in message and "fencing=False" in message and "pw-Secret-9" not in message
            assert not elector.leading
        # Nothing is left holding the lock: the same role without tokens leads at once.
        async with MySQLElector(dsn, name=name, fencing=False) as elector, leadership(elector) as lead:
            assert lead.held and lead.token is None
        # A table created beforehand by a role that may (least privilege for the service): tokens without CREATE.
        root_dsn = f"mysql://root@{mariadb.host}:{mariadb.port}/{database}"
        async with MySQLElector(root_dsn, name=unique_name()) as elector, leadership(elector) as lead:
            assert lead.token is not None
        async with MySQLElector(dsn, name=name) as elector, leadership(elector) as lead:
            assert lead.token is not None
    finally:
        mariadb.query("DROP USER %s@'%%'", (user,), database="")
        mariadb.query(f"DROP DATABASE {database}", database="")


async def test_try_acquire_takes_a_free_lock_and_never_waits(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with (
        MySQLElector(mariadb.dsn, name=name, poll_interval=5) as a,
        MySQLElector(mariadb.dsn, name=name, poll_interval=5) as b,
    ):
        lead = await a.try_acquire()
        assert lead is not None and lead.token is not None
        before = len(mariadb.connection_ids())
        started = time.monotonic()
        assert await b.try_acquire() is None
        assert time.monotonic() - started < 1.0, "GET_LOCK(name, 0) must not wait for poll_interval"
        with anyio.fail_after(5):  # a failed try leaves no connection (the server sees the close at once)
            while len(mariadb.connection_ids()) != before:
                await asyncio.sleep(0.05)
        await lead.release()


# --- one session across the leaderships of one elector -----------------------------------------


def lock_holder(server: MariaDBServer, name: str) -> int | None:
    """The connection id holding GET_LOCK ``name`` (None: free)."""
    held = server.query("SELECT IS_USED_LOCK(%s)", (name,))[0][0]
    return None if held is None else int(held)


async def gone(server: MariaDBServer, connection_id: int) -> bool:
    """Whether the server ended connection ``connection_id`` within 5 s."""
    with anyio.move_on_after(5):
        while connection_id in server.connection_ids():
            await asyncio.sleep(0.05)
        return True
    return False


async def test_clean_release_keeps_the_session_for_the_next_campaign(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name) as elector:
        lead = await elector.acquire()
        first = lock_holder(mariadb, name)
        assert first is not None and lead.token is not None
        token = lead.token
        await lead.release()
        assert lock_holder(mariadb, name) is None, "RELEASE_LOCK answered 1: the lock is free"
        assert first in mariadb.connection_ids(), "the released session is kept for the next campaign"
        lead = await elector.acquire()
        assert lock_holder(mariadb, name) == first
        assert lead.token == token + 1
        await lead.release()
        assert lock_holder(mariadb, name) is None
    assert await gone(mariadb, first), "aclose() closes the kept session"


async def test_unclear_release_closes_the_session(mariadb: MariaDBServer) -> None:
    """A release the server does not confirm (RELEASE_LOCK answered 0), or a session it ended, is not reused."""

    UnconfirmedRelease = unconfirmed_release(MySQLBackend)

    name = unique_name()
    async with Elector(UnconfirmedRelease(mariadb.dsn, name=name, fencing=False)) as elector:
        lead = await elector.acquire()
        first = lock_holder(mariadb, name)
        assert first is not None
        await lead.release()
        assert lock_holder(mariadb, name) is None
        assert await gone(mariadb, first), "an unconfirmed release closes the session"
        lead = await elector.acquire()
        second = lock_holder(mariadb, name)
        assert second not in (None, first)
        mariadb.query("KILL %s", (second,))
        with anyio.fail_after(5):
            await lead.wait_lost()
        await lead.release()
        lead = await elector.acquire()
        assert lock_holder(mariadb, name) not in (None, first, second)
        await lead.release()


async def test_a_kept_session_the_server_ended_is_replaced_at_once(
    mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name) as elector:
        lead = await elector.acquire()
        first = lock_holder(mariadb, name)
        await lead.release()
        mariadb.query("KILL %s", (first,))
        started = time.monotonic()
        lead = await elector.acquire()
        assert time.monotonic() - started < 1.0, "no backoff: the kept session was merely stale"
        second = lock_holder(mariadb, name)
        assert second not in (None, first)
        assert "campaign interrupted" not in caplog.text
        await lead.release()
        mariadb.query("KILL %s", (second,))
        tried = await elector.try_acquire()
        assert tried is not None, "try_acquire() replaces a kept session the server ended"
        assert lock_holder(mariadb, name) not in (None, first, second)
        await tried.release()


async def test_no_leadership_without_the_check_after_the_grant(
    mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A grant whose check finds the lock not ours is no leadership, and writes no token."""
    caplog.set_level(logging.DEBUG, logger="aioelect")

    LosesItsFirstGrant, lost = losing_its_first_grant(MySQLBackend)

    name = unique_name()
    backend = LosesItsFirstGrant(mariadb.dsn, name=name)
    try:
        with anyio.fail_after(10):
            hold = await backend.campaign("checked")
        assert lost, "the first grant was taken"
        assert "does not show it held by our session" in caplog.text
        assert lock_holder(mariadb, name) not in (None, *lost)
        assert hold.token == 1, "the failed check wrote no token"
        await hold.release()
    finally:
        await backend.aclose()


@pytest.mark.parametrize("reused", [False, True], ids=["first-session", "reused-session"])
async def test_killed_session_is_noticed_at_once(mariadb: MariaDBServer, reused: bool) -> None:
    """The server ending the lock session ends the leadership at once, long before the next check is due.

    Also on a session kept from the elector's previous leadership.
    """
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, check_interval=5, check_timeout=4, lease=20) as elector:
        if reused:
            first = await elector.acquire()
            kept = lock_holder(mariadb, name)
            await first.release()
        lead = await elector.acquire()
        holder = lock_holder(mariadb, name)
        assert holder is not None
        if reused:
            assert holder == kept, "the second leadership runs on the kept session"
        await asyncio.sleep(0.2)
        killed = time.monotonic()
        mariadb.query("KILL %s", (holder,))
        with anyio.move_on_after(1.0):
            await lead.wait_lost()
        took = time.monotonic() - killed
        print(f"mysql loss ({reused=}) noticed {took * 1000:.1f} ms after KILL")
        assert lead.lost and not lead.held, f"loss not seen {took:.2f}s after KILL (check due at 5s)"
        assert lead.lost_kind is LossKind.CONNECTION_LOST
        await lead.release()


# --- server-side bounds ------------------------------------------------------------------


async def test_server_keepalives_shorter_than_the_lease_are_refused_at_connect(mariadb: MariaDBServer) -> None:
    """MariaDB's tcp_keepalive_* would drop an unreachable leader after 3 + 1 * 2 = 5 s, before lease=10.

    Refused at once, naming the bound. A small global wait_timeout is no bound: the lock session sets its own.
    """
    names = ("tcp_keepalive_time", "tcp_keepalive_interval", "tcp_keepalive_probes", "wait_timeout")
    before = mariadb.query("SELECT " + ", ".join(f"@@global.{name}" for name in names))[0]
    mariadb.query(
        "SET GLOBAL tcp_keepalive_time = 3, GLOBAL tcp_keepalive_interval = 1, GLOBAL tcp_keepalive_probes = 2, "
        "GLOBAL wait_timeout = 2"
    )
    try:
        async with MySQLElector(mariadb.dsn, name=unique_name(), lease=10) as elector:
            started = time.monotonic()
            with (
                anyio.fail_after(10),
                pytest.raises(
                    PermanentBackendError,
                    match=r"5s after .*\(tcp_keepalive_time \+ tcp_keepalive_interval \* tcp_keepalive_probes\)",
                ),
            ):
                await elector.acquire()
            assert time.monotonic() - started < 3, "a bound that breaks the timing must not be retried"
        mariadb.query("SET GLOBAL tcp_keepalive_time = 20")
        async with MySQLElector(mariadb.dsn, name=unique_name(), lease=10) as elector:
            with anyio.fail_after(10):
                lead = await elector.acquire()  # the 2 s global wait_timeout is replaced by the session's 10 s
            assert lead.held
            await lead.release()
    finally:
        restore = ", ".join(f"GLOBAL {name} = {int(value)}" for name, value in zip(names, before, strict=True))
        mariadb.query(f"SET {restore}")


async def test_tokens_that_may_not_survive_a_crash_are_refused_when_asked_for_and_warned_of_otherwise(
    mariadb: MariaDBServer, caplog: pytest.LogCaptureFixture
) -> None:
    """innodb_flush_log_at_trx_commit=2: a host crash may lose the last token bump and hand a token out twice."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    before = mariadb.query("SELECT @@global.innodb_flush_log_at_trx_commit")[0][0]
    mariadb.query("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    try:
        async with MySQLElector(mariadb.dsn, name=unique_name(), fencing=True) as elector:
            with (
                anyio.fail_after(10),
                pytest.raises(
                    PermanentBackendError, match=r"innodb_flush_log_at_trx_commit=2.*allow_volatile_tokens=True"
                ),
            ):
                await elector.acquire()
        assert "innodb_flush_log_at_trx_commit" not in caplog.text
        for options in ({}, {"fencing": True, "allow_volatile_tokens": True}):
            caplog.clear()
            async with MySQLElector(mariadb.dsn, name=unique_name(), **options) as elector:  # type: ignore[arg-type]
                with anyio.fail_after(10):
                    lead = await elector.acquire()
                assert lead.token is not None
                await lead.release()
            assert "innodb_flush_log_at_trx_commit=2: a crash of the server's host" in caplog.text
    finally:
        mariadb.query(f"SET GLOBAL innodb_flush_log_at_trx_commit = {int(before)}")


async def test_a_session_is_killed_only_while_it_holds_its_own_marker(mariadb: MariaDBServer) -> None:
    """A lock request whose grant was never read leaves its session idle, holding the lock: only its marker lock,
    held under its id, proves it ours. Another session's id, or one whose marker is gone, is never KILLed.
    """
    name = unique_name()
    backend = MySQLBackend(mariadb.dsn, name=name, fencing=False)
    victim = await backend._connect("victim")
    stranger = await backend._connect("stranger")
    cleanup = await backend._open("cleanup")
    try:
        assert victim.marked and stranger.marked and victim.marker != stranger.marker
        assert await victim.scalar("SELECT GET_LOCK(%s, 0)", (name,), timeout=5) == 1
        impostor = await backend._connect("impostor")
        impostor.close()
        impostor.session_id = victim.session_id  # the victim's id, but not its marker
        assert not await backend._end_session(cleanup, impostor)
        assert lock_holder(mariadb, name) == victim.session_id
        assert await stranger.scalar("SELECT RELEASE_LOCK(%s)", (stranger.marker,), timeout=5) == 1
        assert not await backend._end_session(cleanup, stranger), "no marker held: a doubt, no KILL"
        assert await stranger.scalar("SELECT 1", timeout=5) == 1
        assert await backend._end_session(cleanup, victim)
        with anyio.fail_after(5):
            while lock_holder(mariadb, name) is not None:
                await asyncio.sleep(0.05)
    finally:
        victim.close()
        stranger.close()
        cleanup.close()
        await backend.aclose()


OLD_FENCING_DDL = """CREATE TABLE aioelect_leaders (
  name VARCHAR(64) NOT NULL PRIMARY KEY,
  token BIGINT UNSIGNED NOT NULL,
  holder VARCHAR(128) NOT NULL,
  connection_id BIGINT UNSIGNED NOT NULL,
  acquired_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=latin1 COLLATE=latin1_swedish_ci"""


async def _lead_once(dsn: str, name: str, identity: str) -> tuple[int | None, str | None]:
    async with MySQLElector(dsn, name=name, fencing=True, identity=identity) as elector:
        with anyio.fail_after(10):
            lead = await elector.acquire()
        try:
            return lead.token, await elector.leader()
        finally:
            await lead.release()


async def test_names_that_differ_only_in_case_keep_their_own_tokens_and_holders(mariadb: MariaDBServer) -> None:
    """``Billing`` and ``billing`` are two GET_LOCK names, so two rows of the fencing table."""
    stem = unique_name("case")
    upper, lower = stem.capitalize(), stem
    assert await _lead_once(mariadb.dsn, upper, "upper-1") == (1, "upper-1")
    assert await _lead_once(mariadb.dsn, lower, "lower-1") == (1, "lower-1")
    assert await _lead_once(mariadb.dsn, upper, "upper-2") == (2, "upper-2")


async def test_a_fencing_table_of_the_case_insensitive_kind_is_migrated(mariadb: MariaDBServer) -> None:
    """A table created with a case-insensitive name column is altered to binary names; no token goes back.

    The old row was shared by every spelling, so a spelling that gets a row
    of its own after the change starts above every token the table held.
    """
    database = f"aioelect_migrate_{secrets.token_hex(4)}"
    mariadb.query(f"CREATE DATABASE {database}", database="")
    try:
        dsn = with_database(mariadb.dsn, database)
        stem = unique_name("mig")
        mariadb.query(OLD_FENCING_DDL, database=database)
        mariadb.query(
            "INSERT INTO aioelect_leaders (name, token, holder, connection_id) VALUES (%s, 7, 'old', 0)",
            (stem,),
            database=database,
        )
        token, holder = await _lead_once(dsn, stem.upper(), "upper")
        assert token is not None and token > 7 and holder == "upper"
        assert await _lead_once(dsn, stem, "lower") == (8, "lower")
        ((kind,),) = mariadb.query(
            "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
            "TABLE_NAME = 'aioelect_leaders' AND COLUMN_NAME = 'name'",
            (database,),
            database="",
        )
        assert kind == "varbinary"
    finally:
        mariadb.query(f"DROP DATABASE {database}", database="")


async def test_a_slow_healthy_server_keeps_its_leader_and_a_stalled_one_ends_it_within_the_bound(
    mariadb: MariaDBServer,
) -> None:
    """renew_deadline = check_interval + 2 * check_timeout, every check answered 0.7 s after its send: the leader
    leads on; the link stalled, it stops within check_interval + 2 * check_timeout (LockTiming.deposed_within)."""
    opts = {"check_interval": 0.3, "check_timeout": 1.2, "renew_deadline": 2.7, "lease": 4, "poll_interval": 0.5}
    with TCPProxy(mariadb.host, mariadb.port) as proxy:
        dsn = mariadb.dsn.replace(f":{mariadb.port}/", f":{proxy.port}/")
        async with MySQLElector(dsn, name=unique_name(), **opts) as elector:  # type: ignore[arg-type]
            bound = elector._backend.timing.deposed_within  # type: ignore[attr-defined]
            assert bound == pytest.approx(2.7)
            lead = await elector.acquire()
            proxy.delay(0.35)  # each way: a check is answered 0.7 s after its send, within check_timeout
            await asyncio.sleep(4.0)
            assert lead.held, f"a slow but healthy server deposed its leader: {lead.lost_reason}"
            proxy.stall()
            stalled = time.monotonic()
            with anyio.fail_after(bound + 2):
                await lead.wait_lost()
            took = time.monotonic() - stalled
            print(f"MEASURED mysql stalled link: lost {took:.2f}s after (bound {bound:g}s): {lead.lost_reason}")
            assert took <= bound + 0.5, lead.lost_reason


def _use_up_ids_until(server: MariaDBServer, session_id: int, *, exact: bool = True) -> None:
    """Open greeting-only TCP connections until the server's next session gets ``session_id`` (``exact``), or
    one past it if the counter stands there already.

    Each greeting uses up one connection id and leaves no session; ids are
    read from the greeting (protocol 10: its number, the NUL-terminated
    version, then the id).
    """
    import socket
    import struct

    last = 0
    deadline = time.monotonic() + 30
    while last < session_id - 1:
        assert time.monotonic() < deadline, f"ids used up to {last} only, {session_id - 1} wanted"
        with socket.create_connection((server.host, server.port), timeout=5.0) as sock:
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:3], "little"):
                chunk = sock.recv(512)
                assert chunk, "MariaDB closed the connection before its greeting"
                data += chunk
        payload = data[4:]
        end = payload.index(0, 1)
        last = int(struct.unpack("<I", payload[end + 1 : end + 5])[0])
    assert last == session_id - 1 or not exact, f"the counter passed {session_id} already (at {last})"


async def test_a_lost_request_after_a_fast_restart_never_kills_the_session_given_its_id(
    fresh_mariadb: MariaDBServer,
) -> None:
    """The server is SIGKILLed and back within about a second of its previous start (a crash loop), and hands
    the id of a session whose lock request was lost to the new leader's session. The lost request's cleanup
    (which may run late: with no RST, a candidate notices a broken request only at its timeout) must not KILL
    the new leader, though the restarted server shows the same id and, in whole seconds, the same start.

    Repeated (up to 3 times) until one restart is back within a second of the previous start, the case a
    check of the server's start in whole seconds cannot tell apart; the new leader must survive every time.
    """
    name = unique_name()
    backend = MySQLBackend(fresh_mariadb.dsn, name=name, fencing=False, poll_interval=5)
    server = fresh_mariadb
    start = (
        "SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'"
    )
    waiting = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s AND INFO LIKE 'SELECT GET_LOCK%%'"

    async def lose_a_request_then_restart() -> float:
        """One fast restart under a waiting request; the seconds between the two starts, as the server shows them."""
        # The victim's id lies past every id a restart uses before the test's sessions.
        _use_up_ids_until(server, 40, exact=False)
        first = await backend._connect("first")
        victim = await backend._connect("victim")
        leader = None
        try:
            assert await first.scalar("SELECT GET_LOCK(%s, 0)", (name,), timeout=5) == 1
            before = float(server.query(start)[0][0])
            async with anyio.create_task_group() as tg:

                async def request() -> None:
                    with pytest.raises(Exception):  # noqa: B017 - the server dies under it: any driver error
                        await backend._request(victim)

                tg.start_soon(request)
                with anyio.fail_after(10):
                    while not server.query(waiting, (victim.session_id,))[0][0]:
                        await asyncio.sleep(0.02)
                await anyio.to_thread.run_sync(server.kill)
                await anyio.to_thread.run_sync(server.start)
            assert victim.pending is Pending.LOCK_REQUEST and victim.broken
            await anyio.to_thread.run_sync(_use_up_ids_until, server, victim.session_id)
            leader = await backend._open("new leader")
            assert leader.raw.server_thread_id[0] == victim.session_id, "the new leader's session got the victim's id"
            assert await leader.scalar("SELECT GET_LOCK(%s, 0)", (name,), timeout=5) == 1
            after = float(server.query(start)[0][0])
            await backend._drop(victim)  # the lost request's cleanup, after the new leader took the lock
            await asyncio.sleep(0.3)
            holder = server.query("SELECT IS_USED_LOCK(%s)", (name,))[0][0]
            assert holder == victim.session_id and not leader.broken, (
                "the new leader lost its lock to the cleanup of a request lost on the previous server"
            )
            assert await leader.scalar("SELECT 1", timeout=5) == 1
            return after - before
        finally:
            for conn in (first, victim, leader):
                if conn is not None:
                    conn.close()

    try:
        for attempt in range(3):
            apart = await lose_a_request_then_restart()
            print(f"attempt {attempt + 1}: restarted {apart:g}s after the previous start (whole seconds)")
            if apart <= 1:
                break
    finally:
        await backend.aclose()
