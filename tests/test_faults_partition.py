"""A network partition between a leader and its server, on the session-lock backends and Redis.

The other MySQL faults are in test_faults_mysql.py, the other PostgreSQL ones
in test_postgres.py.
"""

from __future__ import annotations

import time

import pytest

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
        time.sleep(0.5)
        stopped, successor, took = candidates.cut_off(leader, proxy, timeout=LEASE + 10)
        print(f"MEASURED {backend} partition: leader stops {stopped:.3f}s, takeover {took:.3f}s (lease {LEASE}s)")
        assert stopped < STOPS_WITHIN[backend]
        assert successor is not leader
        assert took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover across a partition took {took:.2f}s"
        proxy.heal()
        check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)
