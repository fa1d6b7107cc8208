"""Priorities on real servers: a higher-priority candidate takes over once, and leadership never flaps."""

from __future__ import annotations

import asyncio

import pytest

from aioelect import Event

from .backends import BackendCase, Follower, unique_name
from .test_handover import case, make, record

__all__ = ["case"]  # the fixture, shared with test_handover


async def test_a_higher_priority_candidate_takes_over_once_and_it_never_flaps(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "old-1") as old1, make(case, name, "old-2") as old2, make(
        case, name, "new-1"
    ) as new1, make(case, name, "new-2") as new2:
        for elector, priority in ((old1, 0), (old2, 0), (new1, 1), (new2, 1)):
            elector.set_priority(priority, settle=0.3)
        events: list[Event] = record(old1, old2, new1, new2)
        lead_old = await old1.acquire()
        followers = [Follower(old2)]
        try:
            await asyncio.sleep(1.0)  # same priority: old-2 waits, never asks
            assert lead_old.held
            followers += [Follower(new1), Follower(new2)]  # the new version starts
            waits = [asyncio.ensure_future(f.won.wait()) for f in followers]
            done, pending = await asyncio.wait(
                waits, timeout=case.takeover_bound + 10, return_when=asyncio.FIRST_COMPLETED
            )
            for wait in pending:
                wait.cancel()
            assert done, "no higher-priority candidate took over"
            await asyncio.sleep(2.0)  # settle times pass: nobody asks any more
            acquired = [e.identity for e in events if e.kind == "acquired"]
            assert acquired[0] == "old-1" and len(acquired) == 2 and acquired[1].startswith("new-"), acquired
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-1", "priority", acquired[1])]
            # Churn: the old leader campaigns again, and the other new one keeps waiting: still no move.
            followers.append(Follower(old1))
            await asyncio.sleep(2.0)
            assert [e.identity for e in events if e.kind == "acquired"] == acquired
        finally:
            for follower in followers:
                await follower.close()


async def test_bad_priorities_are_refused() -> None:
    from aioelect.testing import MemoryElector

    async with MemoryElector(name=unique_name()) as a:
        with pytest.raises(ValueError):
            a.set_priority(1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            a.set_priority(1, settle=0)


def test_aioelect_priority_is_read_by_from_env_and_checked(tmp_path: object) -> None:
    import aioelect

    env = {"AIOELECT_BACKEND": "memory", "AIOELECT_NAME": unique_name(), "AIOELECT_PRIORITY": "7"}
    elector = aioelect.from_env(env)
    assert elector._gate.priority is not None and elector._gate.priority.value == 7
    assert aioelect.from_env(env, priority=2)._gate.priority.value == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="AIOELECT_PRIORITY must be a whole number"):
        aioelect.from_env({**env, "AIOELECT_PRIORITY": "high"})
