"""Shards.hand_over() racing a drain of the member it names."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from .test_shards import Register
from .test_shards_handover import RELEASED_WITHIN, fleet_on, owners, until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_hand_over_to_a_member_that_drains_meanwhile_leaves_no_name_unowned_for_the_window(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """a hands a name to b as b drains (a rolling deploy stopping b): b takes nothing; the name must go to a live
    instance within RELEASED_WITHIN, not stay unowned for the whole handover window (20 s here)."""
    register = Register()
    fleet = fleet_on(kind, request, tmp_path, 6, register)
    try:
        a, b = fleet.start("a"), fleet.start("b")
        fleet.start("c")  # live, short of nothing: it could take the name
        await fleet.settle(6, timeout=60)
        name = sorted(a.owned)[0]
        began = time.monotonic()
        handed = asyncio.ensure_future(a.hand_over(name, to="b", timeout=20))
        await b.drain(timeout=30)
        results = await asyncio.gather(handed, return_exceptions=True)
        gap = await until(f"{name} owned again", lambda: name in owners(fleet), 30)
        print(f"{kind}: hand_over -> {results[0]!r}; {name} owned again {time.monotonic() - began:.2f}s after")
        assert name not in b.owned
        assert time.monotonic() - began < RELEASED_WITHIN + 2, gap
    finally:
        await fleet.close()
    assert register.violations == []


@pytest.mark.parametrize("kind", ["memory", "file", "redis", "etcd", "postgres", "mysql"])
async def test_crossing_hand_overs_and_a_drain_during_a_rebalance_never_own_a_name_twice(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """a hands a name to b while b hands one to a, twice over, then c joins and a drains at once: never a name
    owned twice (checked every 20 ms) nor two works of one name at a time (the register), and b and c settle."""
    register = Register()
    fleet = fleet_on(kind, request, tmp_path, 6, register)
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            owners(fleet)
            await asyncio.sleep(0.02)

    watcher = asyncio.ensure_future(watch())
    try:
        a, b = fleet.start("a"), fleet.start("b")
        await fleet.settle(6, timeout=60)
        for _ in range(2):
            mine, theirs = sorted(a.owned)[0], sorted(b.owned)[0]
            done = await asyncio.gather(
                a.hand_over(mine, to="b", timeout=10), b.hand_over(theirs, to="a", timeout=10), return_exceptions=True
            )
            print(f"{kind}: crossing hand_overs -> {done!r}")
            await until("every name owned", lambda: len(owners(fleet)) == 6, 30)
        fleet.start("c")
        await asyncio.sleep(0.3)  # c is joining: a and b resign names to it
        await a.drain(timeout=30)
        await until(
            "b and c own every name",
            lambda: set(owners(fleet)) == set(a.names) and set(owners(fleet).values()) <= {"b", "c"},
            30,
        )
        assert not watcher.done()
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)
        await fleet.close()
    assert register.violations == []
    watcher.result()
