"""Redis Sentinel under the adversary: server nodes split from each other while the candidates reach them all.

A master, two replicas and three sentinels (quorum 2), each in a network
namespace of its own (:mod:`tests.harness.netns`); the electors, in this
process, reach every node, and use ``redis+sentinel://`` with
``min_replicas=1``. Beside the message faults, the operator:

* cuts the master off from every sentinel for 4-8 s (*cut-sentinels*),
  most often right after a grant (it watches the token counter, up to
  3 s): they promote a replica, while the electors still reach the old
  master, where an old leader may go on renewing; after the heal the
  sentinels turn the old master into a replica of the new one;
* cuts the master off from its replicas for 2-5 s (*cut-replicas*): no
  ``WAIT`` is answered, the sentinels see nothing wrong;
* crash-loops a node (*crash-loop*, mostly the master): SIGKILL and start,
  3 to 5 times, each kill within a second of the last start; every node
  keeps the configuration Sentinel rewrote (a failover's) across restarts.

Before each action it waits (at most 15 s) until the group has settled: a
majority of the sentinels name one master and a replica of it is in sync.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from typing import Any, ClassVar

import anyio

from tests.harness import RedisServer, SentinelServer
from tests.harness.netns import Namespaces, Node

from .network import Profile
from .redis_target import RedisTarget, _settings

__all__ = ["SentinelTarget"]

#: The master's name in Sentinel.
MASTER = "aioelect"
#: A replica's full sync at once: after a failover the other replica resyncs with the promoted one before WAIT can
#: confirm a grant there.
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


class NodeRedis(RedisServer):
    """A Redis server in a node's namespace; its ``redis.conf`` is written at its first start only: what Sentinel
    rewrote there (a new master to replicate) survives a restart, as on a real host."""

    def _argv(self) -> list[str]:
        path = os.path.join(self._dir, "redis.conf")
        if not os.path.exists(path):
            return super()._argv()
        return [self._redis, path, *self.extra_args]


class NodeSentinel(SentinelServer):
    """A sentinel in a node's namespace; its ``sentinel.conf`` (which it rewrites itself) is written once."""

    def _argv(self) -> list[str]:
        path = os.path.join(self._dir, "sentinel.conf")
        if not os.path.exists(path):
            return super()._argv()
        return [self._redis, path, "--sentinel"]


class SentinelTarget(RedisTarget):
    actions: ClassVar[dict[str, float]] = {"cut-sentinels": 3.0, "cut-replicas": 1.5, "crash-loop": 1.5}
    pace = 1.5
    extra_options: ClassVar[dict[str, Any]] = {"min_replicas": 1}

    def __init__(self, name: str) -> None:
        super(RedisTarget, self).__init__(name)
        self.nets: Namespaces | None = None
        self.redis: list[NodeRedis] = []
        self.sentinels: list[NodeSentinel] = []
        self._node: dict[int, Node] = {}

    @property
    def label(self) -> str:
        return "redis-sentinel"

    # -- the group ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.nets = Namespaces(6)
        nodes = self.nets.nodes
        master = NodeRedis(extra_args=SYNC_AT_ONCE)
        master.place(nodes[0])
        self.redis = [master]
        for node in nodes[1:3]:
            replica = NodeRedis(replica_of=master.port, extra_args=SYNC_AT_ONCE)
            replica.replica_host = master.host
            replica.place(node)
            self.redis.append(replica)
        for node in nodes[3:]:
            sentinel = NodeSentinel(master.port, quorum=2)
            sentinel.master_host = master.host
            sentinel.place(node)
            self.sentinels.append(sentinel)
        for server, node in zip([*self.redis, *self.sentinels], nodes, strict=True):
            self._node[id(server)] = node
            server.start()
        deadline = time.monotonic() + 40
        while not self._formed():
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel group never formed")
            time.sleep(0.2)

    def _formed(self) -> bool:
        for sentinel in self.sentinels:
            with contextlib.suppress(OSError, RuntimeError):
                info = sentinel.command("SENTINEL", "master", MASTER)
                fields = dict(zip(info[::2], info[1::2], strict=False))
                if fields.get("num-slaves") != "2" or fields.get("num-other-sentinels") != "2":
                    return False
                continue
            return False
        return self._settled()

    def cleanup(self) -> None:
        for server in [*self.sentinels, *self.redis]:
            with contextlib.suppress(Exception):
                server.cleanup()
        if self.nets is not None:
            self.nets.cleanup()

    def recover(self) -> None:
        """After a failed action: every split healed, every node running."""
        if self.nets is not None:
            self.nets.heal_all()
        for server in [*self.redis, *self.sentinels]:
            server.start()

    def target(self) -> Any:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def draw(self, rng: random.Random) -> Profile:
        """Three seeds in five aim at a failover under a leader: a calm network (short delays only, so that the
        splits are the only faults and a leader's renews go on reaching its master), campaigns that mostly time
        out and start again (on a new connection, which asks the sentinels anew), long leaderships, and mostly
        the master cut off from the sentinels. The others add the message faults at low rates."""
        if rng.random() < 0.6:
            return Profile(
                short_p=rng.uniform(0.0, 0.3),
                long_p=0.0,
                lost_request_p=0.0,
                lost_reply_p=0.0,
                cancel_watch_p=0.0,
                actions=(("cut-sentinels", 5.0), ("cut-replicas", 1.0), ("crash-loop", 1.0)),
                pace=1.0,
                electors=(3, 4),
                timeout_p=rng.uniform(0.5, 0.9),
                long_hold_p=rng.uniform(0.8, 1.0),
                long_hold=(8.0, 12.0),
                pause_p=rng.uniform(0.0, 0.2),
            )
        return Profile(
            short_p=rng.uniform(0.0, 0.3),
            long_p=rng.uniform(0.0, 0.03),
            long=rng.uniform(1.0, 2.5),
            lost_request_p=rng.uniform(0.0, 0.01),
            lost_reply_p=rng.uniform(0.0, 0.01),
            cancel_watch_p=0.0,
            electors=(3, 4),
            timeout_p=rng.uniform(0.1, 0.5),
            long_hold_p=rng.uniform(0.6, 0.9),
            long_hold=(4.0, 9.0),
            pause_p=rng.uniform(0.0, 0.3),
        )

    # -- who is where --------------------------------------------------------------------------------------------

    def named(self) -> list[tuple[str, int] | None]:
        """The master's address as each sentinel names it (None: that sentinel did not answer)."""
        names: list[tuple[str, int] | None] = []
        for sentinel in self.sentinels:
            try:
                host, port = sentinel.command("SENTINEL", "get-master-addr-by-name", MASTER, timeout=1.0)
                names.append((str(host), int(port)))
            except (OSError, RuntimeError, TypeError, ValueError):
                names.append(None)
        return names

    def master(self) -> NodeRedis:
        """The node a majority of the sentinels name (else the first named; else the first node)."""
        votes = Counter(n for n in self.named() if n is not None)
        for server in self.redis:
            if votes and (server.host, server.port) == votes.most_common(1)[0][0]:
                return server
        return self.redis[0]

    def _settled(self) -> bool:
        votes = Counter(n for n in self.named() if n is not None)
        if not votes or votes.most_common(1)[0][1] < 2:
            return False
        master = self.master()
        with contextlib.suppress(OSError, RuntimeError):
            return "state=online" in str(master.command("INFO", "replication", timeout=1.0))
        return False

    def node(self, server: Any) -> Node:
        return self._node[id(server)]

    # -- the operator's actions ----------------------------------------------------------------------------------

    async def _settle(self) -> str:
        for _ in range(75):  # 15 s
            if await anyio.to_thread.run_sync(self._settled):
                return ""
            await anyio.sleep(0.2)
        return " (the group had not settled)"

    async def _cut(self, server: Any, others: list[Any], seconds: float) -> None:
        nets = self.nets
        assert nets is not None
        try:
            for other in others:
                nets.cut(self.node(server), self.node(other))
            await anyio.sleep(seconds)
        finally:
            for other in others:
                nets.heal(self.node(server), self.node(other))

    async def _granted(self, master: NodeRedis, within: float) -> bool:
        """Whether the election's token counter on ``master`` moves (a grant) within ``within`` s."""
        key = _settings(self.target(), self.name).token_key

        def token() -> Any:
            with contextlib.suppress(OSError, RuntimeError):
                return master.command("GET", key, timeout=1.0)
            return None

        first = await anyio.to_thread.run_sync(token)
        for _ in range(int(within / 0.05)):
            if await anyio.to_thread.run_sync(token) != first:
                return True
            await anyio.sleep(0.05)
        return False

    async def _cut_sentinels(self, rng: random.Random) -> str:
        note = await self._settle()
        master = await anyio.to_thread.run_sync(self.master)
        # Right after a grant, most often: the new leader's term outlasts the failover.
        if rng.random() < 0.8 and not await self._granted(master, 3.0):
            note += " (no grant within 3 s)"
        seconds = rng.uniform(4.0, 8.0)
        await self._cut(master, self.sentinels, seconds)
        return f"master {master.host}:{master.port} cut off from the sentinels for {seconds:.1f}s{note}"

    async def _cut_replicas(self, rng: random.Random) -> str:
        note = await self._settle()
        master = await anyio.to_thread.run_sync(self.master)
        replicas = [r for r in self.redis if r is not master]
        seconds = rng.uniform(2.0, 5.0)
        await self._cut(master, replicas, seconds)
        return f"master {master.host}:{master.port} cut off from its replicas for {seconds:.1f}s{note}"

    async def _crash_loop(self, rng: random.Random) -> str:
        note = await self._settle()
        master = await anyio.to_thread.run_sync(self.master)
        server: Any = master if rng.random() < 0.7 else rng.choice([*self.redis, *self.sentinels])
        times = rng.randint(3, 5)
        ups = []
        for _ in range(times):
            await anyio.to_thread.run_sync(server.kill)
            await anyio.to_thread.run_sync(server.start)
            up = rng.uniform(0.05, 0.9)
            ups.append(f"{up:.2f}")
            await anyio.sleep(up)
        role = "the master" if server is master else f"{server.kind} {server.host}"
        return f"{role} SIGKILLed and started {times} times, up {', '.join(ups)} s each{note}"

    async def leftovers(self) -> list[str]:
        return []
