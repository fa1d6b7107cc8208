"""Red team: Leadership.release() handing over to the waiting candidate of a higher priority, on real servers."""

from __future__ import annotations

import asyncio
import json
import time

import anyio
import pytest

from aioelect import current_leadership
from aioelect._handover import WAITING_KEY

from .backends import BackendCase, Follower, unique_name
from .test_handover import case, make, record

__all__ = ["case"]


async def _post_waiting(elector: object, record_: dict[str, object] | bytes) -> None:
    store = elector._gate.store()  # type: ignore[attr-defined]
    assert store is not None
    raw = record_ if isinstance(record_, bytes) else json.dumps(record_).encode()
    await store.post(WAITING_KEY, raw)


async def test_red_release_with_an_invalid_waiting_identity_still_releases(case: BackendCase) -> None:
    """A waiting record naming an identity no elector could have (empty): release() must not raise."""
    name = unique_name()
    async with make(case, name, "leader") as leader:
        leader.set_priority(0)
        lead = await leader.acquire()
        await _post_waiting(leader, {"identity": "", "priority": 5, "until": time.time() + 30})
        with anyio.fail_after(15):
            await lead.release()  # ValueError from validate_identity escapes here
        assert not lead.held


async def test_red_release_with_an_overflowing_waiting_priority_still_releases(case: BackendCase) -> None:
    """A waiting record whose priority is 1e999 (JSON reads it as inf): release() must not raise."""
    name = unique_name()
    async with make(case, name, "leader") as leader:
        leader.set_priority(0)
        lead = await leader.acquire()
        await _post_waiting(leader, b'{"identity": "x", "priority": 1e999, "until": 1e300}')
        with anyio.fail_after(15):
            await lead.release()  # OverflowError (int(inf)) escapes here
        assert not lead.held


@pytest.mark.parametrize("successor_priority", [None, 1], ids=["plain", "handover"])
async def test_red_release_inside_work_behaves_as_a_plain_release(
    case: BackendCase, successor_priority: int | None
) -> None:
    """Work that calls release() and then returns a result: with a waiting candidate of a higher priority, the
    release is a step-down, which cancels the calling work; a plain release lets it return."""
    name = unique_name()
    async with make(case, name, "old") as old, make(case, name, "new") as new:
        old.set_priority(0)
        new.set_priority(successor_priority, settle=60)  # never asks by itself: only the release hands over
        events = record(old, new)
        after_release: list[str] = []

        async def work() -> int:
            while not any(e.kind == "acquired" and e.identity == "old" for e in events):
                await asyncio.sleep(0.05)
            follower = Follower(new)
            try:
                await asyncio.sleep(2.0)  # new campaigns and says it waits
                await current_leadership().release()
                await asyncio.sleep(0)
                after_release.append("ran")
                return 42
            finally:
                followers.append(follower)

        followers: list[Follower] = []
        try:
            with anyio.fail_after(30):
                result = await old.run(work)  # hangs: the work is cancelled, run() campaigns again
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            if successor_priority is not None:
                assert stepped == [("old", "release", "new")], stepped  # the release did hand over
            assert result == 42 and after_release == ["ran"], (result, after_release)
        finally:
            for follower in followers:
                await follower.close()
