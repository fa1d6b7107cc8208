"""A second start of something that runs once is a :class:`~aioelect.UsageError`, and leaves the first run intact."""

from __future__ import annotations

import anyio
import pytest

from aioelect import EtcdSession, Shards, UsageError
from aioelect.integrations import Campaign
from aioelect.integrations.health import HealthServer
from aioelect.integrations.jobs import LeaderOnly
from aioelect.testing import MemoryElector

from .harness import EtcdServer


async def test_a_second_shards_run_is_a_usage_error(aioelect_name: str) -> None:
    shards = Shards(["a"], group=aioelect_name, identity="i", electors=lambda n: MemoryElector(name=n))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(shards.run)
            while shards.owned != {"a"}:
                await anyio.sleep(0.01)
            with pytest.raises(UsageError, match="already running"):
                await shards.run()
            assert shards.owned == {"a"}
            tg.cancel_scope.cancel()


async def test_leader_only_entered_twice_at_once_is_a_usage_error(aioelect_name: str) -> None:
    leader_only = LeaderOnly(MemoryElector(name=aioelect_name, identity="solo"))
    with anyio.fail_after(10):
        async with leader_only:
            with pytest.raises(UsageError, match="twice"):
                await leader_only.__aenter__()
            assert leader_only.campaign is not None


async def test_campaign_started_twice_is_a_usage_error(aioelect_name: str) -> None:
    campaign = Campaign(MemoryElector(name=aioelect_name, identity="a"))
    with anyio.fail_after(10):
        await campaign.start()
        try:
            with pytest.raises(UsageError, match="twice"):
                await campaign.start()
            assert (await campaign.status()).role != "stopped"
        finally:
            await campaign.stop()


async def test_health_server_started_twice_is_a_usage_error(aioelect_name: str) -> None:
    health = HealthServer(MemoryElector(name=aioelect_name, identity="a"))
    with pytest.raises(UsageError, match="not started"):
        _ = health.port
    with anyio.fail_after(10):
        await health.start()
        try:
            port = health.port
            with pytest.raises(UsageError, match="twice"):
                await health.start()
            assert health.port == port
        finally:
            await health.aclose()


async def test_a_shared_session_entered_twice_is_a_usage_error(etcd: EtcdServer) -> None:
    with anyio.fail_after(30):
        async with EtcdSession(etcd.endpoint, ttl=5) as session:
            with pytest.raises(UsageError, match="entered once"):
                await session.__aenter__()
            assert not session.closed


async def test_a_health_server_started_twice_at_once_is_a_usage_error_and_listens_once(aioelect_name: str) -> None:
    # start() checks that it is not started, then awaits the address lookup: a second start() in that gap passed
    # the same check, and each made its own listening socket (two accept loops, the first socket never closed).
    health = HealthServer(MemoryElector(name=aioelect_name, identity="a"))
    outcomes: list[BaseException | None] = []

    async def start() -> None:
        try:
            await health.start()
        except UsageError as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)

    with anyio.fail_after(10):
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                tg.start_soon(start)
            assert sum(isinstance(o, UsageError) for o in outcomes) == 1, outcomes
            assert len([t for t in health.http._tasks if "accept" in t.get_name()]) == 1
        finally:
            await health.aclose()
