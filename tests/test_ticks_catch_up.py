"""A long outage before a schedule's next leader costs one write and no memory (Redis, a real server).

misfire="skip" works out the ticks to skip from ``grace`` without listing them: a million missed ticks leave the
new leader's loop free (it keeps its leadership) and its memory flat. A period so short that tick numbers would
pass 2**53 is refused when the schedule is made, not at its first tick.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from aioelect.integrations.schedule import Every, Tick, Ticks

from .backends import CASES, unique_name
from .test_fenced_state import FENCED


@pytest.fixture
def case(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return CASES["redis"](request)


async def test_skip_after_a_million_missed_ticks_does_not_list_them(case) -> None:  # type: ignore[no-untyped-def]
    schedule = Every(0.001)
    ticks = Ticks("sweep", schedule, misfire="skip", grace=0.01)
    ran: list[Tick] = []

    async def job(tick: Tick) -> None:
        ran.append(tick)

    async with case.make(unique_name(), identity="a", **FENCED["redis"]) as elector:
        lead = await elector.acquire()
        try:
            missed_from = schedule.tick_at(time.time()) - 1_000_000
            await ticks.store(elector).put(lead, ticks.key, {"tick": missed_from, "token": lead.token})
            tracemalloc.start()
            try:
                await ticks.run_due(lead, job)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert 1 <= len(ran) <= 20  # only the ticks at most 10 ms late run
            assert peak < 5_000_000, f"{peak / 1e6:.0f} MB to skip a million ticks"
        finally:
            await lead.release()


def test_a_period_too_small_to_number_the_ticks_is_refused() -> None:
    with pytest.raises(ValueError):
        Every(1e-300)
