"""A network partition between a leader and its server, on the session-lock backends and Redis, and between
a leader and the resource it writes to.

The other MySQL faults are in test_faults_mysql.py, the other PostgreSQL ones
in test_postgres.py.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import LeadershipLost, leadership

from .backends import unique_name
from .faults import (
    CHECK_INTERVAL,
    CHECK_TIMEOUT,
    LEASE,
    MARGIN,
    OPTIONS,
    REDIS_OPTIONS,
    Candidates,
    check_invariants,
)
from .harness import MariaDBServer, PostgresServer, RedisServer, TCPProxy

#: How soon a cut-off leader stops: a session lock's check times out; a Redis leader fences at its renew deadline
#: (measured from the send time of its last renew), before its key can expire and be taken.
STOPS_WITHIN = {
    "mysql": CHECK_INTERVAL + CHECK_TIMEOUT + 0.3,
    "postgres": CHECK_INTERVAL + CHECK_TIMEOUT + 0.3,
    "redis": float(REDIS_OPTIONS["renew_deadline"]) + 0.3,
}


@pytest.mark.parametrize(
    ("backend", "server_fixture"),
    [("mysql", "fresh_mariadb"), ("postgres", "fresh_postgres"), ("redis", "fresh_redis")],
)
def test_network_partition_between_leader_and_server(
    backend: str, server_fixture: str, request: pytest.FixtureRequest
) -> None:
    server: MariaDBServer | PostgresServer | RedisServer = request.getfixturevalue(server_fixture)
    target = server.url if isinstance(server, RedisServer) else server.dsn
    options = REDIS_OPTIONS if backend == "redis" else OPTIONS
    with (
        Candidates(backend, target, unique_name("fault"), options) as candidates,
        TCPProxy(server.host, server.port) as proxy,
    ):
        via_proxy = target.replace(f":{server.port}/", f":{proxy.port}/")
        leader = candidates.start("partitioned", target=via_proxy)
        assert candidates.wait_leader() is leader
        for i in range(2):
            candidates.start(f"direct-{i}")
        candidates.wait_ready()
        time.sleep(0.5)
        stopped, successor, took = candidates.cut_off(leader, proxy, timeout=LEASE + 10)
        print(f"MEASURED {backend} partition: leader stops {stopped:.3f}s, takeover {took:.3f}s (lease {LEASE}s)")
        assert stopped < STOPS_WITHIN[backend]
        assert successor is not leader
        assert took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover across a partition took {took:.2f}s"
        proxy.heal()
        check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)


async def test_a_write_sent_before_the_leader_is_cut_off_lands_after_its_successor_refused_only_by_the_token(
    mariadb: MariaDBServer,
) -> None:
    # The leader checks its leadership, sends two writes and is cut off with them in flight (held by the proxy,
    # as a paused process or a slow network would hold them). It fences; the successor leads and writes; then
    # the held writes arrive. No elector can recall bytes already sent: the plain write overwrites the
    # successor's, and only the write that carries the token, checked by the table, is refused.
    import pymysql

    table = unique_name("inflight").replace("-", "_")
    mariadb.query(f"CREATE TABLE {table} (id INT PRIMARY KEY, holder VARCHAR(32), fence BIGINT NOT NULL)")
    mariadb.query(f"INSERT INTO {table} VALUES (1, 'nobody', 0), (2, 'nobody', 0)")

    def connect(port: int) -> Any:
        return pymysql.connect(host=mariadb.host, port=port, user="root", database=mariadb.database, autocommit=True)

    def write(conn: Any, who: str, token: int) -> tuple[int, int]:
        """A plain write and one that carries the token; the rows each changed."""
        with conn, conn.cursor() as cur:
            return (
                cur.execute(f"UPDATE {table} SET holder = %s WHERE id = 1", (who,)),
                cur.execute(f"UPDATE {table} SET holder = %s, fence = %s WHERE id = 2 AND fence <= %s",
                            (who, token, token)),
            )  # fmt: skip

    name, options = unique_name("inflight"), {**OPTIONS, "poll_interval": 0.2}
    late: list[tuple[int, int]] = []
    with TCPProxy(mariadb.host, mariadb.port) as proxy:
        leader = aioelect.new(mysql=mariadb.dsn.replace(f":{mariadb.port}/", f":{proxy.port}/"), name=name, **options)
        successor = aioelect.new(mysql=mariadb.dsn, name=name, **options)
        led = anyio.Event()

        async def lead_and_write() -> None:
            with pytest.raises(LeadershipLost):
                async with leadership(leader) as lead:
                    led.set()
                    conn = await anyio.to_thread.run_sync(connect, proxy.port)
                    await anyio.sleep(1.0)  # the successor waits for the lock meanwhile
                    proxy.stall()
                    lead.check()  # still the leader: the writes go out, and wait in the stalled link
                    token = lead.token
                    assert token is not None
                    # A blocking driver's call cannot be cancelled: the work outlives the loss until it returns.
                    await anyio.to_thread.run_sync(lambda: late.append(write(conn, "old", token)))
                    await anyio.sleep_forever()

        async def succeed() -> None:
            await led.wait()
            async with leadership(successor) as new:
                assert not late, "the old leader's writes arrived before the successor led"
                assert new.token is not None
                conn = await anyio.to_thread.run_sync(connect, mariadb.port)
                assert await anyio.to_thread.run_sync(write, conn, "new", new.token) == (1, 1)
                proxy.heal()  # the old leader's writes arrive now
                while not late:  # a thread of the other task appends it
                    await anyio.sleep(0.05)

        with anyio.fail_after(30):
            async with leader, successor, anyio.create_task_group() as tg:
                tg.start_soon(lead_and_write)
                tg.start_soon(succeed)
    final = dict(mariadb.query(f"SELECT id, holder FROM {table}"))
    print(f"MEASURED writes in flight past the deadline: rows changed {late}, table now {final}")
    assert late == [(1, 0)], f"the late writes changed {late} rows (plain, token-checked)"
    assert final == {1: "old", 2: "new"}, f"the late writes left {final}"
