"""A Redis Cluster master cut off from the cluster bus while the candidates still reach it: never two leaders.

Six nodes (3 masters, a replica each), each in a network namespace of its
own (tests/harness/netns.py); this process reaches every node all along.
The master that owns the election's slot is cut off from every other node
(the cluster bus and its replica's link): the majority promotes its
replica, while the leader's connection to the old master is untouched.
Every leadership's ``held`` is sampled every 10 ms; the test fails if two
were held at once, or if the waiting candidate never leads on the promoted
replica (it must not keep asking the cut-off master, which names itself).
A focused test rather than an adversary target: the promoted replica has no
replica of its own, so a cluster of this size has one failover to play.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import anyio
import pytest

from aioelect import RedisElector

from .backends import unique_name
from .harness import RedisCluster, RedisServer
from .harness.netns import Namespaces
from .test_redis_split import OPTIONS, Sampled


def lock_key(name: str) -> str:
    return f"aioelect:{{{name}}}:lock"


@pytest.fixture
def split_cluster() -> Iterator[tuple[RedisCluster, Namespaces]]:
    nets = Namespaces(6)
    try:
        group = RedisCluster(replicas=1, node_timeout_ms=1000)
        try:
            for server, node in zip(group.nodes, nets.nodes, strict=True):
                server.place(node)
            group.start()
            yield group, nets
        finally:
            nets.heal_all()
            group.cleanup()
    finally:
        nets.cleanup()


def _replica_of(group: RedisCluster, master: RedisServer) -> RedisServer:
    for node in group.nodes:
        if node is not master and f"master_port:{master.port}" in str(group.command(node, "INFO", "replication")):
            return node
    raise LookupError(f"no replica of {master.port}")


async def test_a_master_cut_off_from_the_cluster_bus_leaves_one_leader(
    split_cluster: tuple[RedisCluster, Namespaces],
) -> None:
    group, nets = split_cluster
    name = unique_name()
    sampled = Sampled()
    node_of = dict(zip((id(n) for n in group.nodes), nets.nodes, strict=True))
    master = group.owner(lock_key(name))
    replica = _replica_of(group, master)
    # The URL lists the slot's master first: the node the candidates ask which master owns the slot, until another
    # answers instead. Cut off, that master still names itself, and answers every command with CLUSTERDOWN.
    nodes = [master, *(n for n in group.nodes if n is not master)]
    url = "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in nodes) + "/"
    async with (
        RedisElector(url, name=name, identity="old", min_replicas=1, **OPTIONS) as old,  # type: ignore[arg-type]
        # The promoted replica has no replica of its own: a successor that asked for one would never lead.
        RedisElector(url, name=name, identity="new", **OPTIONS) as new,  # type: ignore[arg-type]
        anyio.create_task_group() as tg,
    ):
        lead = await old.acquire(timeout=10)
        sampled.leads.append(("old", lead))
        tg.start_soon(sampled.run)

        async def candidate() -> None:
            got = await new.acquire()
            sampled.leads.append(("new", got))
            await got.wait_lost()

        tg.start_soon(candidate)
        await asyncio.sleep(1.0)
        cut_at = time.monotonic()
        for other in group.nodes:
            if other is not master:
                nets.cut(node_of[id(master)], node_of[id(other)])
        with anyio.fail_after(30):
            while "role:master" not in str(
                await anyio.to_thread.run_sync(group.command, replica, "INFO", "replication")
            ):
                await asyncio.sleep(0.1)
        promoted = time.monotonic() - cut_at
        with anyio.move_on_after(25 - promoted):
            while "new" not in sampled.first_at or time.monotonic() - sampled.first_at["new"] < 3:
                await asyncio.sleep(0.05)
        new_at = sampled.first_at.get("new")
        old_stopped = "still held" if lead.held else f"stopped {sampled.last_at['old'] - cut_at:.2f}s after the cut"
        print(
            f"MEASURED redis cluster master cut off from the bus (min_replicas=1): replica promoted {promoted:.2f}s "
            f"after the cut; old leader {old_stopped}; successor "
            f"{'never led' if new_at is None else f'led {new_at - cut_at:.2f}s after the cut'}; two leaders for "
            f"{sampled.overlap:.2f}s"
        )
        tg.cancel_scope.cancel()
    assert sampled.overlap == 0, f"two leaders for {sampled.overlap:.2f}s"
    assert new_at is not None, "nobody led on the promoted replica"
