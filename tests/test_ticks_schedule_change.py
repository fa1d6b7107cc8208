"""A job's schedule changed between deploys reads the ticks record by time, not by number (Redis, a real server).

The record keeps the ``Every(seconds, origin)`` that wrote it; a leader whose schedule differs (a rolling deploy
that changes the period or origin) reads the recorded tick by when it was due, so that a longer period loses no
tick under run_once and a shorter one re-runs none of the ticks the predecessor covered under run_each.
"""

from __future__ import annotations

import time

import anyio
import pytest

from aioelect.integrations.schedule import Every, Tick, Ticks

from .backends import CASES, unique_name
from .test_fenced_state import FENCED


@pytest.fixture
def case(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return CASES["redis"](request)


async def test_a_successor_with_a_longer_period_runs_the_tick_due_after_the_record(case) -> None:  # type: ignore[no-untyped-def]
    name = unique_name()
    before = Ticks("digest", Every(0.5))  # the old deploy: tick numbers about 3.5e9 today
    ran: list[Tick] = []

    async def job(tick: Tick) -> None:
        ran.append(tick)

    async with (
        case.make(name, identity="a", **FENCED["redis"]) as a,
        case.make(name, identity="b", **FENCED["redis"]) as b,
    ):
        lead = await a.acquire()
        assert len(await before.run_due(lead, job)) == 1
        await lead.release()
        await anyio.sleep(0.6)  # past the old deploy's last tick
        after = Ticks("digest", Every(30, origin=time.time() - 0.01))  # the new deploy: tick 0 is due now
        lead = await b.acquire()
        try:
            # tick 0 of the new schedule fell due after the recorded tick: it must run (run_once loses nothing)
            assert [t.number for t in await after.run_due(lead, job)] == [0]
        finally:
            await lead.release()


async def test_a_successor_with_a_shorter_period_does_not_rerun_the_covered_ticks(case) -> None:  # type: ignore[no-untyped-def]
    name = unique_name()
    origin = time.time() - 10 * 3600 - 0.05
    before = Ticks("report", Every(3600, origin=origin), misfire="run_each")  # tick 10 is due now
    ran: list[Tick] = []

    async def job(tick: Tick) -> None:
        ran.append(tick)
        if len(ran) > 5:
            raise RuntimeError("ran far too many ticks")

    async with (
        case.make(name, identity="a", **FENCED["redis"]) as a,
        case.make(name, identity="b", **FENCED["redis"]) as b,
    ):
        lead = await a.acquire()
        assert [t.number for t in await before.run_due(lead, job)] == [10]
        await lead.release()
        ran.clear()
        after = Ticks("report", Every(1, origin=origin), misfire="run_each")  # same origin, period 1 s
        lead = await b.acquire()
        try:
            await after.run_due(lead, job)
            # tick 10 of the old schedule was due at origin + 36000, a second or less ago: at most a tick or two
            # of the new schedule are due after it, not the 36 000 of the last ten hours
            assert len(ran) <= 2, [t.number for t in ran]
        finally:
            await lead.release()
