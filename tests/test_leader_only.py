"""LeaderOnly: decorated async functions run on the elected leader only, never twice for one tick."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import aioelect
from aioelect.integrations.jobs import LeaderOnly
from aioelect.testing import MemoryElector


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def instance(name: str, identity: str, ran: list[tuple[str, int | None]]) -> tuple[LeaderOnly, Any]:
    leader_only = LeaderOnly(lambda: MemoryElector(name=name, identity=identity))

    @leader_only
    async def tick(slot: int) -> int:
        lead = aioelect.current_leadership()
        lead.check()
        ran.append((identity, lead.token))
        return slot

    return leader_only, tick


async def test_a_tick_fired_on_every_instance_runs_once_even_when_the_leader_finished_first(
    aioelect_name: str,
) -> None:
    """The flock -n trap: a leader that finished before the other instance fired must not let it run too."""
    ran: list[tuple[str, int | None]] = []
    a, tick_a = instance(aioelect_name, "a", ran)
    b, tick_b = instance(aioelect_name, "b", ran)
    async with a, b:
        await until(lambda: (a.leadership or b.leadership) is not None)
        for slot in range(5):
            first, second = (tick_a, tick_b) if slot % 2 else (tick_b, tick_a)
            results = [await first(slot), await second(slot)]  # one after the other: the first has finished
            assert sorted(results, key=lambda r: r is None) == [slot, None]
        leader = "a" if a.leadership is not None else "b"
        assert ran == [(leader, 1)] * 5

        # The leader goes: the other one runs the next ticks, under a larger token.
        MemoryElector(name=aioelect_name).depose()
        other = b if leader == "a" else a
        await until(lambda: other.leadership is not None)
        ran.clear()
        assert await tick_a(9) is not None or await tick_b(9) is not None
        assert [who for who, _ in ran] == ["b" if leader == "a" else "a"] and ran[0][1] == 2


async def test_a_run_in_progress_is_cancelled_on_a_loss_and_its_caller_told(aioelect_name: str) -> None:
    started = asyncio.Event()
    leader_only = LeaderOnly(MemoryElector(name=aioelect_name, identity="solo"))

    @leader_only
    async def long_job() -> None:
        started.set()
        await asyncio.sleep(30)

    async with leader_only:
        await until(lambda: leader_only.leadership is not None)
        call = asyncio.ensure_future(long_job())
        await started.wait()
        MemoryElector(name=aioelect_name).depose("deposed by the test")
        with pytest.raises(aioelect.LeadershipLost, match="deposed by the test"):
            await asyncio.wait_for(call, 5)


async def test_calls_before_the_campaign_and_after_it_run_nothing(aioelect_name: str) -> None:
    ran: list[tuple[str, int | None]] = []
    leader_only, tick = instance(aioelect_name, "solo", ran)
    assert await tick(1) is None
    async with leader_only:
        await until(lambda: leader_only.leadership is not None)
        assert await tick(2) == 2
    assert await tick(3) is None
    assert ran == [("solo", 1)]
    async with leader_only:  # a factory: a new elector each time, so it starts again
        await until(lambda: leader_only.leadership is not None)
        assert await tick(4) == 4
