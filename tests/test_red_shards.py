"""Red team: Shards.hand_over() racing a drain of the member it names."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from .test_shards import Register
from .test_shards_handover import RELEASED_WITHIN, fleet_on, owners, until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_red_hand_over_to_a_member_that_drains_meanwhile_leaves_no_name_unowned_for_the_window(
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
        print(f"RED {kind}: hand_over -> {results[0]!r}; {name} owned again {time.monotonic() - began:.2f}s after")
        assert name not in b.owned
        assert time.monotonic() - began < RELEASED_WITHIN + 2, gap
    finally:
        await fleet.close()
    assert register.violations == []
