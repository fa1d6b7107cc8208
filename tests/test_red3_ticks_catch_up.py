"""Red team 3: a long outage before a "skip" schedule's next leader (Redis, a real server).

misfire="skip" runs only the ticks at most ``grace`` late and records the others in one write; but it builds a
list of every missed tick first (one tuple each): a million missed ticks (Every(0.001) after 17 minutes, Every(1)
after 12 days) cost about a hundred megabytes and seconds of CPU before the one write, and a longer outage exhausts
the memory of the new leader. The same tiny period overflows: Every(1e-300) is accepted, and its first tick fails
with OverflowError.
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
