"""No background task outlives its owner: after each change of an elector's state, only the tasks of what is
still alive run (memory, file and etcd backends)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from aioelect import Elector, EtcdElector, FileElector, LeadershipLost, leadership
from aioelect.integrations._campaign import Campaign
from aioelect.testing import MemoryElector

from .harness import EtcdServer

pytestmark = pytest.mark.timeout(60)


def ours() -> set[str]:
    """The names of aioelect's background tasks still running."""
    return {t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("aioelect") and not t.done()}


def keepers() -> set[str]:
    return {n for n in ours() if n.startswith("aioelect-keeper")}


def watches() -> set[str]:
    return {n for n in ours() if n.startswith("aioelect-leader-watch")}


async def _walk(make: Callable[[str], Elector], depose: Callable[[Elector], object] | None) -> None:
    before = ours()
    elector = make("owners-a")
    lead = await elector.acquire()
    # Campaign over: its watch of the leader ended with it. Held: one keeper.
    assert not watches() - before
    assert len(keepers() - before) == 1
    await lead.release()
    assert not keepers() - before, "the keeper outlived the leadership it kept"

    with pytest.raises(LeadershipLost):
        async with leadership(elector):
            assert len(keepers() - before) == 1
            if depose is None:
                raise LeadershipLost("lost by the test")
            depose(elector)
            await asyncio.sleep(10)
    assert not keepers() - before, "the keeper outlived a lost leadership"

    # A campaign cancelled while it waits leaves no watch behind.
    other = make("owners-b")
    held = await other.acquire()
    with anyio.move_on_after(0.3):
        await elector.acquire()
    assert not watches() - before, "the leader watch outlived a cancelled campaign"
    await held.release()
    await other.aclose()
    await elector.aclose()
    assert ours() <= before, f"tasks outlived their elector: {ours() - before}"


async def test_memory_elector_tasks_end_with_each_state() -> None:
    name = f"owners-{uuid.uuid4().hex[:8]}"
    await _walk(lambda identity: MemoryElector(name=name, identity=identity), lambda e: e.depose())  # type: ignore[attr-defined]


async def test_file_elector_tasks_end_with_each_state(tmp_path: Path) -> None:
    await _walk(lambda identity: FileElector(tmp_path / "x.lock", identity=identity), None)


async def test_etcd_elector_tasks_end_with_each_state(etcd: EtcdServer) -> None:
    name = f"owners-{uuid.uuid4().hex[:8]}"
    await _walk(lambda identity: EtcdElector(etcd.endpoints, name=name, identity=identity, ttl=5), None)
    assert not {n for n in ours() if n.startswith("aioelect-etcd")}, "a lease keep-alive outlived its elector"


async def test_an_integration_campaign_task_ends_with_stop() -> None:
    before = ours()
    campaign = Campaign(MemoryElector(name=f"owners-{uuid.uuid4().hex[:8]}"))
    await campaign.start()
    with anyio.fail_after(5):
        while campaign.leadership is None:
            await asyncio.sleep(0.01)
    assert any(n.startswith("aioelect campaign") for n in ours() - before)
    await campaign.stop()
    assert ours() <= before, f"tasks outlived the campaign: {ours() - before}"
