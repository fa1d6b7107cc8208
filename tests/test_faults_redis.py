"""Faults injected into real candidate processes on a real Redis: the same invariants as the SQL fault suites.

Never two leaders acting at once, tokens never going backwards, and a
bounded time without a leader: a crashed, frozen or cut-off leader's key
expires after the lease, and the leader itself stops first (it fences at
its renew deadline, measured from the send time of its last renew). The
partition through the TCP proxy is in test_faults_partition.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .backends import unique_name
from .faults import CHECK_INTERVAL, LEASE, MARGIN, REDIS_OPTIONS, Candidates, check_invariants
from .harness import RedisServer


@pytest.fixture
def candidates(fresh_redis: RedisServer) -> Iterator[Candidates]:
    with Candidates("redis", fresh_redis.url, unique_name("fault"), REDIS_OPTIONS) as group:
        yield group


def test_leader_killed(candidates: Candidates) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    successor, took = candidates.replace(leader, leader.kill, timeout=LEASE + 10)
    assert successor is not leader
    print(f"MEASURED redis sigkill takeover {took:.3f}s (lease {LEASE}s)")
    # Nobody deletes a crashed leader's key: it expires.
    assert LEASE - 1.0 < took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover after SIGKILL took {took:.2f}s"
    check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)


def test_leader_frozen_longer_than_lease(candidates: Candidates) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    successor, took = candidates.replace(leader, leader.freeze, timeout=LEASE + 10)
    print(f"MEASURED redis sigstop takeover {took:.3f}s (lease {LEASE}s)")
    assert took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover of a frozen leader took {took:.2f}s"
    time.sleep(1.0)
    stale = candidates.stale_acts_after_thaw(leader, successor)
    assert not stale, f"the frozen leader acted {len(stale)} times after waking"
    check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)


def test_server_restarted_with_aof_keeps_the_leader_and_the_tokens(
    candidates: Candidates, fresh_redis: RedisServer
) -> None:
    candidates.start_three()
    leader = candidates.wait_leader()
    token = leader.acts()[-1]["token"]
    fresh_redis.restart()
    time.sleep(1.5)
    current = candidates.wait_leader(timeout=LEASE + 10)
    last = current.acts()[-1]["token"]
    print(
        f"MEASURED redis restart with AOF: leader {'kept' if current is leader else 'changed'}, token {token}->{last}"
    )
    assert last >= token
    check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)
