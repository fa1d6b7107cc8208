"""Faults injected into real candidate processes and a real MariaDB.

Each test runs candidates as separate OS processes (tests/candidates/candidate.py)
and checks the invariants on what they report: never two leaders acting at
once, tokens never going backwards, and bounded time without a leader.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .backends import unique_name
from .faults import CHECK_INTERVAL, CHECK_TIMEOUT, LEASE, MARGIN, OPTIONS, Candidates, check_invariants
from .harness import MariaDBServer


@pytest.fixture
def candidates(fresh_mariadb: MariaDBServer) -> Iterator[Candidates]:
    with Candidates("mysql", fresh_mariadb.dsn, unique_name("fault"), OPTIONS) as group:
        yield group


def test_leader_killed(candidates: Candidates) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    successor, took = candidates.replace(leader, leader.kill, timeout=10)
    assert successor is not leader
    print(f"MEASURED mysql sigkill takeover {took:.3f}s")
    assert took < 1.0, f"takeover after SIGKILL took {took:.2f}s"
    check_invariants(candidates, max_gap=1.0 + MARGIN)


def test_leader_frozen_longer_than_lease(candidates: Candidates) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    successor, took = candidates.replace(leader, leader.freeze, timeout=LEASE + 10)
    print(f"MEASURED mysql sigstop takeover {took:.3f}s (lease {LEASE}s)")
    assert took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover of a frozen leader took {took:.2f}s"
    time.sleep(1.0)
    stale = candidates.stale_acts_after_thaw(leader, successor)
    assert not stale, f"the frozen leader acted {len(stale)} times after waking"
    check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)


def test_leader_connection_killed(candidates: Candidates, fresh_mariadb: MariaDBServer) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    token = leader.acts()[-1]["token"]
    holder = fresh_mariadb.query("SELECT IS_USED_LOCK(%s)", (candidates.name,), database="")[0][0]
    killed = time.monotonic()
    fresh_mariadb.query(f"KILL {int(holder)}", database="")
    # The deposed leadership must stop; the same candidate may win a new one (a higher token).
    stopped = candidates.wait_for(
        lambda: (leader.last_act(token) or 0) < time.monotonic() - 0.3,
        CHECK_INTERVAL + CHECK_TIMEOUT + 5,
        "old leader stops",
    )
    stop_after = (leader.last_act(token) or 0) - killed
    print(f"MEASURED mysql KILL old leader last act {stop_after:.3f}s after the KILL")
    assert stop_after < CHECK_INTERVAL + CHECK_TIMEOUT + 0.2
    candidates.wait_leader(timeout=10)
    assert stopped
    # The lock passes on the instant the server drops the session; the old leader
    # notices the closed connection within milliseconds, not at its next check.
    check_invariants(candidates, max_gap=CHECK_INTERVAL + CHECK_TIMEOUT + MARGIN, margin=0.2)


def test_server_restarted(candidates: Candidates, fresh_mariadb: MariaDBServer) -> None:
    candidates.start_three()
    candidates.wait_leader()
    stopped = time.monotonic()
    fresh_mariadb.stop()
    time.sleep(2.0)
    acts_during_outage = [
        e for c in candidates.all for e in c.acts() if e["t"] > stopped + CHECK_INTERVAL + CHECK_TIMEOUT + 0.2
    ]
    assert not acts_during_outage, "a candidate acted as leader while the server was down"
    fresh_mariadb.start()
    restarted = time.monotonic()
    candidates.wait_leader(timeout=20)
    print(f"MEASURED mysql restart: leader {time.monotonic() - restarted:.3f}s after the server is back")
    time.sleep(1.0)
    acting = [c for c in candidates.all if c.is_acting(0.3)]
    assert len(acting) == 1, f"{len(acting)} leaders after the restart"
    # The shutdown ends sessions one at a time: as with KILL, a waiting candidate may be
    # granted the lock milliseconds before the old leader has seen its connection close.
    check_invariants(candidates, max_gap=30, margin=0.2)
