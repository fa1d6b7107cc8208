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


async def test_red_a_successor_that_stopped_right_after_saying_it_waits(case: BackendCase) -> None:
    """The newer version campaigns, says it waits, and is stopped; the old leader releases at once. A live peer of
    the old version waits: it must lead within the release window (5 s) and a poll, never later."""
    name = unique_name()
    async with make(case, name, "old-0") as old0, make(case, name, "old-1") as old1, make(case, name, "new") as new:
        for elector, priority in ((old0, 0), (old1, 0), (new, 1)):
            elector.set_priority(priority, settle=60)
        events = record(old0, old1, new)
        lead = await old0.acquire()
        peer = Follower(old1)
        successor = Follower(new)
        try:
            await asyncio.sleep(1.5)  # new says it waits
            await successor.close()  # stopped (cancelled) before it led
            started = time.monotonic()
            await lead.release()
            released = time.monotonic() - started
            await peer.wait(timeout=30)
            gap = time.monotonic() - started
            print(f"RED {case.kind}: release() took {released:.3f}s; old-1 led {gap:.3f}s after it began")
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-0", "release", "new")], stepped  # handed to the stopped candidate
            assert gap < 5.0 + 1.5, gap
        finally:
            await peer.close()
            await successor.close()
