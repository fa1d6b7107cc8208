"""A 3-member etcd cluster under the adversary: the leader's member split from the others while electors reach all.

Each member runs in a network namespace of its own (:mod:`tests.harness.netns`);
the electors, in this process, list every member's endpoint and reach each
one all along. Beside the message faults and a few of the single server's
actions (deleting a candidate key, revoking a lease), the operator:

* isolates the raft leader's member from the other two for 3-7 s
  (*isolate-leader*): the two elect a leader of their own, while electors
  connected to the isolated member still reach it (it steps down, and
  answers no linearizable request, once it has heard from no quorum);
* crash-loops a member (*crash-loop*, mostly the leader's): SIGKILL and
  start, 3 to 5 times, each kill within a second of the last start.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
from typing import Any, ClassVar

import anyio

from tests.harness import EtcdCluster, EtcdServer
from tests.harness.netns import Namespaces
from tests.harness.servers.etcd import _etcdctl

from .network import Profile
from .servers import EtcdTarget

__all__ = ["EtcdClusterTarget"]


class EtcdClusterTarget(EtcdTarget):
    actions: ClassVar[dict[str, float]] = {
        "isolate-leader": 3.0,
        "crash-loop": 1.5,
        "delete-key": 1.5,
        "revoke-lease": 0.5,
    }
    pace = 1.5

    def __init__(self, name: str) -> None:
        super(EtcdTarget, self).__init__(name)
        self.nets: Namespaces | None = None
        self.cluster: EtcdCluster | None = None

    @property
    def label(self) -> str:
        return "etcd-cluster"

    def start(self) -> None:
        self.nets = Namespaces(3)
        cluster = EtcdCluster(3)
        self.cluster = cluster
        for member, node in zip(cluster.members, self.nets.nodes, strict=True):
            member.place(node)
        initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster.members)
        for member in cluster.members:
            member._initial_cluster = initial  # the members' addresses in their namespaces
        cluster.start()

    def cleanup(self) -> None:
        if self.cluster is not None:
            self.cluster.cleanup()
        if self.nets is not None:
            self.nets.cleanup()

    def recover(self) -> None:
        if self.nets is not None:
            self.nets.heal_all()
        if self.cluster is not None:
            self.cluster.start()

    def target(self) -> Any:
        assert self.cluster is not None
        return self.cluster.endpoints

    def draw(self, rng: random.Random) -> Profile:
        """A network with few message faults: the splits and crash loops are this target's faults."""
        return Profile(
            short_p=rng.uniform(0.0, 0.3),
            long_p=rng.uniform(0.0, 0.03),
            long=rng.uniform(1.0, 2.5),
            lost_request_p=rng.uniform(0.0, 0.01),
            lost_reply_p=rng.uniform(0.0, 0.01),
            cancel_watch_p=rng.uniform(0.0, 0.1),
            cancel_within=1.0,
            electors=(3, 5),
            timeout_p=rng.uniform(0.2, 0.6),
            long_hold_p=rng.uniform(0.6, 0.9),
            long_hold=(3.0, 8.0),
            pause_p=rng.uniform(0.0, 0.3),
        )

    async def _etcdctl(self, *args: str) -> str:
        endpoints = self.target()
        done = await anyio.to_thread.run_sync(lambda: _etcdctl(endpoints, args, timeout=10.0, check=True))
        return str(done.stdout)

    async def _leader(self) -> EtcdServer:
        cluster = self.cluster
        assert cluster is not None
        leader = await anyio.to_thread.run_sync(lambda: cluster.leader(timeout=10.0))
        return leader if leader is not None else cluster.members[0]

    async def _isolate_leader(self, rng: random.Random) -> str:
        nets, cluster = self.nets, self.cluster
        assert nets is not None and cluster is not None
        leader = await self._leader()
        i = cluster.members.index(leader)
        others = [nets.nodes[j] for j in range(len(cluster.members)) if j != i]
        seconds = rng.uniform(3.0, 7.0)
        try:
            for other in others:
                nets.cut(nets.nodes[i], other)
            await anyio.sleep(seconds)
        finally:
            for other in others:
                nets.heal(nets.nodes[i], other)
        return f"leader {leader.name} cut off from the other members for {seconds:.1f}s"

    async def _crash_loop(self, rng: random.Random) -> str:
        cluster = self.cluster
        assert cluster is not None
        leader = await self._leader()
        member = leader if rng.random() < 0.7 else rng.choice(cluster.members)
        times = rng.randint(3, 5)
        ups = []
        for _ in range(times):
            await anyio.to_thread.run_sync(member.kill)
            await anyio.to_thread.run_sync(member.start)
            up = rng.uniform(0.05, 0.9)
            ups.append(f"{up:.2f}")
            await anyio.sleep(up)
        role = "the leader" if member is leader else member.name
        return f"{role} SIGKILLed and started {times} times, up {', '.join(ups)} s each"

    async def leftovers(self) -> list[str]:
        with contextlib.suppress(subprocess.CalledProcessError):
            return await super().leftovers()
        return []
