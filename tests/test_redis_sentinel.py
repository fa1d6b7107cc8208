"""Redis replication and a Sentinel failover: 1 master, 2 replicas and 3 sentinels on loopback.

What these tests measure is stated in docs/guarantees.md: with
``min_replicas=1`` every grant is on a replica before it stands, and
Sentinel promotes the replica furthest ahead, so a failover keeps the token
growing; without it, a grant that no replica received is lost with the
master, and the next leader gets the same token again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import pytest

from aioelect import BackendUnavailable, Leadership, RedisElector

from .backends import unique_name
from .harness import RedisServer, SentinelServer

#: Quick renews and a short lease; the sentinels call a master down after 1 s.
OPTIONS = {"lease": 3, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 0.5}


@dataclass
class Group:
    master: RedisServer
    replicas: list[RedisServer]
    sentinels: list[SentinelServer]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/aioelect/0"

    def master_port(self) -> int:
        return int(self.sentinels[0].command("SENTINEL", "get-master-addr-by-name", "aioelect")[1])


@pytest.fixture
def group() -> Iterator[Group]:
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(RedisServer())
        replicas = [stack.enter_context(RedisServer(replica_of=master.port)) for _ in range(2)]
        sentinels = [stack.enter_context(SentinelServer(master.port)) for _ in range(3)]
        deadline = time.monotonic() + 30
        while True:
            info = dict(zip(*[iter(sentinels[0].command("SENTINEL", "master", "aioelect"))] * 2, strict=True))
            links = [r.command("INFO", "replication") for r in replicas]
            if (
                info.get("num-slaves") == "2"
                and info.get("num-other-sentinels") == "2"
                and all("master_link_status:up" in link for link in links)
            ):
                break
            assert time.monotonic() < deadline, f"the group never formed: {info}"
            time.sleep(0.1)
        yield Group(master, replicas, sentinels)


async def wait_failover(group: Group, old: int, timeout: float = 30) -> float:
    started = time.monotonic()
    with anyio.fail_after(timeout):
        while await anyio.to_thread.run_sync(group.master_port) == old:
            await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_failover_with_min_replicas_keeps_the_token_growing(group: Group) -> None:
    name = unique_name()
    async with (
        RedisElector(group.url, name=name, identity="old", min_replicas=1, **OPTIONS) as old,  # type: ignore[arg-type]
        RedisElector(group.url, name=name, identity="new", min_replicas=1, **OPTIONS) as new,  # type: ignore[arg-type]
    ):
        lead = await old.acquire(timeout=10)
        assert lead.token is not None
        won: list[tuple[float, Leadership]] = []

        async def follow() -> None:
            got = await new.acquire()
            won.append((time.monotonic(), got))
            await asyncio.sleep(3600)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await asyncio.sleep(0.5)
            killed = time.monotonic()
            await anyio.to_thread.run_sync(group.master.kill)
            with anyio.fail_after(10):
                await lead.wait_lost()
            fenced = time.monotonic()
            failover = await wait_failover(group, group.master.port)
            with anyio.fail_after(20):
                while not won:
                    await asyncio.sleep(0.05)
            at, successor = won[0]
            print(
                f"MEASURED redis sentinel failover (min_replicas=1): old leader stopped {fenced - killed:.2f}s after "
                f"the master's SIGKILL, sentinels switched after {failover:.2f}s, successor led after "
                f"{at - killed:.2f}s; tokens {lead.token} -> {successor.token}"
            )
            assert successor.token is not None and successor.token > lead.token
            assert fenced < at, "the successor led before the old leader stopped"
            tg.cancel_scope.cancel()


async def test_without_min_replicas_a_failover_can_send_the_token_back(group: Group) -> None:
    """The grant reaches no replica (both frozen, their links closed), the master dies: the promoted replica never
    saw it."""
    name = unique_name()
    for replica in group.replicas:
        replica.freeze()
    # Their links closed by the master: nothing written from now on is sent to them (not even into a socket
    # buffer they would read once thawed).
    group.master.command("CLIENT", "KILL", "TYPE", "replica")
    try:
        async with RedisElector(group.url, name=name, min_replicas=1, **OPTIONS) as guarded:  # type: ignore[arg-type]
            with pytest.raises(BackendUnavailable, match="only 0 of min_replicas=1"):
                await guarded.try_acquire()
        assert group.master.command("EXISTS", f"aioelect:{{{name}}}:lock") == 0, "a refused grant is withdrawn"
        async with RedisElector(group.url, name=name, identity="old", **OPTIONS) as old:  # type: ignore[arg-type]
            lead = await old.acquire(timeout=10)
            killed = time.monotonic()
            await anyio.to_thread.run_sync(group.master.kill)
            for replica in group.replicas:
                replica.thaw()
            with anyio.fail_after(10):
                await lead.wait_lost()
            fenced = time.monotonic()
    finally:
        for replica in group.replicas:
            replica.thaw()
    failover = await wait_failover(group, group.master.port)
    async with RedisElector(group.url, name=name, identity="new", **OPTIONS) as new:  # type: ignore[arg-type]
        successor = await new.acquire(timeout=20)
        at = time.monotonic()
        print(
            f"MEASURED redis sentinel failover (min_replicas=0, grant unreplicated): old leader stopped "
            f"{fenced - killed:.2f}s after the master's SIGKILL, sentinels switched after {failover:.2f}s more, "
            f"successor led after {at - killed:.2f}s; tokens {lead.token} -> {successor.token}"
        )
        # The promoted replica never saw the grants' increments: the token goes back.
        assert successor.token is not None and lead.token is not None and successor.token <= lead.token
        assert fenced < at
        await successor.release()
