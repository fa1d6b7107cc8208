"""Clocks that break the timing proof: a leader whose monotonic clock runs slow, a Redis server whose wall
clock is stepped forward.

A cut-off leader stops at its renew deadline, on its own monotonic clock from the send of its last confirmed
renew; the server lets the key go ``lease`` after that renew, on the server's clock. The difference, the
safety margin (``lease - renew_deadline``, 1 s here), is all that absorbs clocks that disagree. Each test
breaks the assumption by more than the margin and shows two leaders (the tokens still ordered), and by less
and shows none. The clocks are skewed in those processes only (:class:`~tests.harness.clock.SkewedClock`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from .backends import unique_name
from .faults import LEASE, REDIS_OPTIONS, Candidate, Candidates
from .harness import RedisServer, TCPProxy
from .harness.clock import SkewedClock

OPTIONS = {**REDIS_OPTIONS, "poll_interval": 0.2}
RENEW_DEADLINE = float(OPTIONS["renew_deadline"])
MARGIN = LEASE - RENEW_DEADLINE


class ClockedRedis(RedisServer):
    """A throwaway redis-server on ``clock``."""

    def __init__(self, clock: SkewedClock) -> None:
        super().__init__()
        self.clock = clock

    def _argv(self) -> list[str]:
        return [*self.clock.prefix(), *super()._argv()]


def acted(candidate: Candidate) -> list[tuple[float, int]]:
    """When each of the candidate's leader actions happened, on CLOCK_MONOTONIC_RAW (which no skew touches),
    and under which token."""
    return [(e["raw"], e["token"]) for e in candidate.acts()]


def overlap_after_cut(
    candidates: Candidates, leader: Candidate, proxy: TCPProxy, settle: float, then: Callable[[], None] = lambda: None
) -> float:
    """Cut the leader off and do ``then``; return how long the leader went on acting after another candidate
    began (negative: how long nobody led), read ``settle`` seconds after the cut. Tokens must still order
    the two."""
    proxy.stall()
    cut = time.monotonic()
    then()
    candidates.wait_for(
        lambda: any(c is not leader and c.acts() for c in candidates.all), LEASE + 10, "a successor leads"
    )
    time.sleep(max(0.0, cut + settle - time.monotonic()))
    successor = next(c for c in candidates.all if c is not leader and c.acts())
    old, new = acted(leader), acted(successor)
    assert new[0][1] > old[-1][1], f"tokens out of order: {old[-1][1]} then {new[0][1]}"
    return old[-1][0] - new[0][0]


@pytest.mark.parametrize("rate", [0.8, 0.4], ids=["within-the-margin", "past-the-margin"])
def test_a_leader_whose_monotonic_clock_runs_slow_leads_past_its_key_when_the_margin_is_exceeded(
    rate: float, fresh_redis: RedisServer
) -> None:
    # Cut off, the leader's renew deadline (2 s on its clock) takes 2/rate real seconds; its key expires after
    # lease = 3 s. At rate 0.8 that is 2.5 s: it stops first. At 0.4 it is 5 s: it leads about 2 s beside its
    # successor, and nothing in aioelect can see it (documented: the margin is the only defence).
    clock = SkewedClock(rate=rate)
    with (
        Candidates("redis", fresh_redis.url, unique_name("clock"), OPTIONS) as candidates,
        TCPProxy(fresh_redis.host, fresh_redis.port) as proxy,
    ):
        via_proxy = fresh_redis.url.replace(f":{fresh_redis.port}/", f":{proxy.port}/")
        leader = candidates.start("slow", target=via_proxy, prefix=clock.prefix())
        candidates.wait_for(lambda: bool(leader.acts()), 30, "the slow candidate leads")  # its "t" runs slow
        candidates.start("successor")
        candidates.wait_ready()
        time.sleep(1.0)
        overlap = overlap_after_cut(candidates, leader, proxy, settle=RENEW_DEADLINE / rate + 1)
        print(f"MEASURED leader clock at {rate}x: its last action {overlap:+.2f}s from its successor's first")
        if RENEW_DEADLINE / rate < LEASE:
            assert overlap < 0, f"a leader slow by less than the margin acted {overlap:.2f}s beside its successor"
        else:
            assert overlap > 0.3, f"a leader at {rate}x stopped {-overlap:.2f}s before its successor began"
        proxy.heal()
    clock.cleanup()


@pytest.mark.parametrize("step", [0.5, 2.9], ids=["within-the-margin", "past-the-margin"])
def test_a_redis_server_clock_stepped_forward_past_the_margin_expires_a_leaders_key_while_it_leads(
    step: float,
) -> None:
    # The key's expiry is a wall-clock time on the server: a step forward shortens its life by the step. The
    # cut-off leader stops 2 s after its last renew; the key, stepped 2.9 s, expires 0.1 s after that renew,
    # so that any candidate asking from then on leads beside it (how soon one asks is the waiters' business).
    clock = SkewedClock()
    name = unique_name("step")
    with (
        ClockedRedis(clock) as server,
        Candidates("redis", server.url, name, OPTIONS) as candidates,
        TCPProxy(server.host, server.port) as proxy,
        redis.Redis(host=server.host, port=server.port) as direct,
    ):
        via_proxy = server.url.replace(f":{server.port}/", f":{proxy.port}/")
        leader = candidates.start("leader", target=via_proxy)
        assert candidates.wait_leader(timeout=30) is leader
        candidates.start("successor")
        candidates.wait_ready()
        time.sleep(1.0)
        gone: list[float] = []

        key = f"aioelect:{{{name}}}:lock"
        held = direct.get(key)
        assert held is not None

        def step_and_watch() -> None:  # until the leader's key is gone (expired, or already another's)
            clock.step(step)
            deadline = time.monotonic() + LEASE + 5
            while direct.get(key) == held and time.monotonic() < deadline:
                time.sleep(0.005)
            gone.append(time.clock_gettime(time.CLOCK_MONOTONIC_RAW))

        overlap = overlap_after_cut(candidates, leader, proxy, RENEW_DEADLINE + 1, then=step_and_watch)
        held_past = acted(leader)[-1][0] - gone[0]
        print(
            f"MEASURED server clock stepped {step}s: the leader's last action {held_past:+.2f}s from its key's "
            f"expiry, {overlap:+.2f}s from its successor's first"
        )
        if step < MARGIN:
            assert held_past < 0, f"a step within the margin: the leader acted {held_past:.2f}s past its key"
            assert overlap < 0, f"a step within the margin let the leader act {overlap:.2f}s beside its successor"
        else:
            assert held_past > 0.3, f"a step of {step}s past the margin: the leader stopped {-held_past:.2f}s first"
        proxy.heal()
    clock.cleanup()
