"""Health checks on real servers: an unhealthy leader steps aside, an unhealthy candidate does not campaign."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from aioelect import Event

from .backends import BackendCase, Follower, unique_name
from .test_handover import case, make, record

__all__ = ["case"]  # the fixture, shared with test_handover


class Switch:
    """A health check whose answer the test sets; ``hang`` makes it never answer."""

    def __init__(self) -> None:
        self.healthy = True
        self.hang = False
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        return self.healthy


async def test_a_leader_failing_its_check_steps_aside_and_stays_out_for_the_backoff(
    case: BackendCase, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        check = Switch()
        a.set_health(check, failures=2, interval=0.1, timeout=1, backoff=3)
        events: list[Event] = record(a)
        lead_a = await a.acquire()
        follower_b = Follower(b)
        again: Follower | None = None
        try:
            await asyncio.sleep(0.5)
            assert lead_a.held and check.calls >= 2  # healthy: it stays
            with caplog.at_level(logging.INFO, logger="aioelect"):
                check.healthy = False
                failed_at = time.monotonic()
                await follower_b.wait(timeout=case.takeover_bound + 5)
                assert time.monotonic() - failed_at < 0.2 * 2 + case.takeover_bound + 3
                assert not lead_a.held and not lead_a.lost  # stepped down, not lost
                assert [e.reason for e in events if e.kind == "stepped_down"] == ["unhealthy"]
                check.healthy = True
                again = Follower(a)
                await follower_b.close()  # b lets go at once, but a stays out for its back-off
                backoff_left = 3 - (time.monotonic() - failed_at)
                await asyncio.sleep(max(0.0, backoff_left - 1.0))
                assert not again.won.is_set()
                await again.wait(timeout=case.takeover_bound + 5)
            messages = [r.message for r in caplog.records]
            assert any("health check failed (2 of 2 in a row): health check returned False" in m for m in messages)
            assert any("stepping down: unhealthy" in m for m in messages)
            assert any("staying out of the election" in m for m in messages)
        finally:
            await follower_b.close()
            if again is not None:
                await again.close()


async def test_a_candidate_failing_its_check_does_not_campaign(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "b") as b, make(case, name, "c") as c:
        check = Switch()
        check.healthy = False
        b.set_health(check, interval=0.1, timeout=1)
        c.set_health(check, interval=0.1, timeout=1)
        follower_b = Follower(b)
        try:
            await asyncio.sleep(1.0)  # nobody leads, yet b does not take it
            assert not follower_b.won.is_set() and await b.leader() is None
            assert await c.try_acquire() is None  # one try: not even that while unhealthy
            check.healthy = True
            await follower_b.wait(timeout=case.takeover_bound + 5)
        finally:
            await follower_b.close()


async def test_a_hanging_check_is_bounded_by_its_timeout(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        check = Switch()
        a.set_health(check, failures=2, interval=0.1, timeout=0.3, backoff=5)
        lead_a = await a.acquire()
        follower_b = Follower(b)
        try:
            check.hang = True
            hung_at = time.monotonic()
            await follower_b.wait(timeout=2 * (0.1 + 0.3) + case.takeover_bound + 5)
            assert time.monotonic() - hung_at >= 2 * 0.3  # two timeouts, then the step-down
            assert not lead_a.held
        finally:
            await follower_b.close()


async def test_bad_health_options_are_refused() -> None:
    from aioelect.testing import MemoryElector

    async with MemoryElector(name=unique_name()) as a:
        with pytest.raises(TypeError):
            a.set_health("not callable")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            a.set_health(Switch(), failures=0)
        with pytest.raises(ValueError):
            a.set_health(Switch(), timeout=0)
