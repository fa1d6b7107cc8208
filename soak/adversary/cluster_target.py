"""Redis Cluster under the adversary: a master cut off from the cluster bus while the candidates still reach it.

Three masters with a replica each, every node in a network namespace of its
own (:mod:`tests.harness.netns`), ``cluster-node-timeout`` 1 s; the
electors, in this process, reach every node and use ``redis+cluster://``
(listing every node) with ``min_replicas=1``. Beside the message faults,
the operator:

* cuts the master of the election's slot off from the cluster bus for
  2.5-6 s (*cut-bus*), most often right after a grant (it watches the
  token counter, up to 3 s): only the TCP traffic to and from the bus
  ports is dropped, so the electors and its replica still reach it on its
  client port; the other masters fail it over to its replica, while an
  old leader may go on renewing on it; after the heal it turns into a
  replica of the promoted node;
* crash-loops a node (*crash-loop*, mostly that master): SIGKILL and
  start, 3 to 5 times, each kill within a second of the last start; every
  node keeps its ``nodes.conf`` and append-only file across restarts;
* deletes, overwrites or shortens the expiry of the lock key, and ends
  the holder's lock connection or another client's, on the master that
  owns the slot (the single server's actions).

Before each split or crash loop it waits (at most 15 s) until the cluster
has settled: every node says ``cluster_state:ok`` and every replica is in
sync.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, ClassVar

import anyio

from tests.harness import RedisCluster, RedisServer
from tests.harness.errors import ServerStartError
from tests.harness.netns import Namespaces, Node

from .network import Profile
from .redis_target import RedisTarget, _settings

#: What a cluster node answers while the cluster cannot serve the slot (down, or the slot moving).
_NOT_SERVED = ("CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "MASTERDOWN", "LOADING")

__all__ = ["ClusterTarget"]

#: Seconds without the bus before a node is failed: the cut outlasts it.
NODE_TIMEOUT_MS = 1000


class ClusterTarget(RedisTarget):
    actions: ClassVar[dict[str, float]] = {
        "cut-bus": 3.0,
        "crash-loop": 1.5,
        "delete-key": 0.8,
        "overwrite-key": 0.6,
        "expire-key": 0.6,
        "kill-holder": 0.6,
        "kill-client": 0.3,
    }
    pace = 1.5
    extra_options: ClassVar[dict[str, Any]] = {"min_replicas": 1}

    def __init__(self, name: str) -> None:
        super(RedisTarget, self).__init__(name)
        self.nets: Namespaces | None = None
        self.cluster: RedisCluster | None = None
        self._node: dict[int, Node] = {}

    @property
    def label(self) -> str:
        return "redis-cluster"

    # -- the cluster -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Form the cluster in its namespaces; on a failure, remove whatever was started, then raise."""
        try:
            self.nets = Namespaces(6)
            cluster = RedisCluster(3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)
            self.cluster = cluster
            for server, node in zip(cluster.nodes, self.nets.nodes, strict=True):
                server.place(node)
                self._node[id(server)] = node
            cluster.start()
        except BaseException:
            self.cleanup()
            raise

    def cleanup(self) -> None:
        if self.cluster is not None:
            self.cluster.cleanup()
        if self.nets is not None:
            self.nets.cleanup()

    def recover(self) -> None:
        """After a failed action: every split healed, every node running."""
        if self.nets is not None:
            self.nets.heal_all()
        if self.cluster is not None:
            for server in self.cluster.nodes:
                server.start()

    def target(self) -> Any:
        assert self.cluster is not None
        return self.cluster.url

    def draw(self, rng: random.Random) -> Profile:
        """Three seeds in five aim at a failover under a leader: a calm network (short delays only, so that the
        bus cut is the only fault and a leader's renews go on reaching its master), campaigns that mostly time
        out and start again (on a new connection, which asks the cluster anew who owns the slot), long
        leaderships, and mostly the master cut off from the bus. The others add the message faults at low rates
        and the operator's hand on the key."""
        if rng.random() < 0.6:
            return Profile(
                short_p=rng.uniform(0.0, 0.3),
                long_p=0.0,
                lost_request_p=0.0,
                lost_reply_p=0.0,
                cancel_watch_p=0.0,
                actions=(("cut-bus", 5.0), ("crash-loop", 1.0), ("delete-key", 0.5)),
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

    def master(self) -> RedisServer:
        """The node that owns the election's slot, as the first running node sees it."""
        cluster = self.cluster
        assert cluster is not None
        return cluster.owner(self.lock_key)

    async def _command(self, *args: Any) -> Any:
        def run() -> Any:
            cluster = self.cluster
            assert cluster is not None
            return cluster.command(self.master(), *args)

        return await anyio.to_thread.run_sync(run)

    async def act(self, action: str, rng: random.Random) -> str:
        """As the single server's, but an action on the key or a client that the cluster refuses while it is down
        or moving the slot (a split or crash loop just healed) is not done, and says so: ``no ...``."""
        try:
            return await super().act(action, rng)
        except RuntimeError as exc:
            if action in ("cut-bus", "crash-loop") or not str(exc).startswith(_NOT_SERVED):
                raise
            return f"no {action}: the cluster refused it ({str(exc)[:80]})"

    def _settled(self) -> bool:
        cluster = self.cluster
        assert cluster is not None
        try:
            cluster.wait_ok(timeout=0.0)
        except (ServerStartError, OSError, RuntimeError):
            return False
        return True

    # -- the operator's actions ----------------------------------------------------------------------------------

    async def _settle(self) -> str:
        for _ in range(75):  # 15 s
            if await anyio.to_thread.run_sync(self._settled):
                return ""
            await anyio.sleep(0.2)
        return " (the cluster had not settled)"

    async def _granted(self, master: RedisServer, within: float) -> bool:
        """Whether the election's token counter on ``master`` moves (a grant) within ``within`` s."""
        cluster = self.cluster
        assert cluster is not None
        key = _settings(self.target(), self.name).token_key

        def token() -> Any:
            with contextlib.suppress(OSError, RuntimeError):
                return cluster.command(master, "GET", key, timeout=1.0)
            return None

        first = await anyio.to_thread.run_sync(token)
        for _ in range(int(within / 0.05)):
            if await anyio.to_thread.run_sync(token) != first:
                return True
            await anyio.sleep(0.05)
        return False

    async def _cut_bus(self, rng: random.Random) -> str:
        nets, cluster = self.nets, self.cluster
        assert nets is not None and cluster is not None
        note = await self._settle()
        master = await anyio.to_thread.run_sync(self.master)
        # Right after a grant, most often: the new leader's term outlasts the failover.
        if rng.random() < 0.8 and not await self._granted(master, 3.0):
            note += " (no grant within 3 s)"
        seconds = rng.uniform(2.5, 6.0)
        cut = self._node[id(master)]
        pairs = [
            (self._node[id(other)], port)
            for other in cluster.nodes
            if other is not master
            for port in (cluster.bus_port(master), cluster.bus_port(other))
        ]
        try:
            for other, port in pairs:
                nets.cut(cut, other, port=port)
            await anyio.sleep(seconds)
            # Asked before the heal, of a node on the majority's side: whether they failed the master over.
            asked = next(n for n in cluster.nodes if n is not master and n.running)
            with contextlib.suppress(OSError, RuntimeError, LookupError):
                now = await anyio.to_thread.run_sync(lambda: cluster.owner(self.lock_key, asked))
                note += " (failed over)" if now is not master else " (not failed over)"
        finally:
            for other, port in pairs:
                nets.heal(cut, other, port=port)
        return f"master {master.host}:{master.port} cut off from the cluster bus for {seconds:.1f}s{note}"

    async def _crash_loop(self, rng: random.Random) -> str:
        cluster = self.cluster
        assert cluster is not None
        note = await self._settle()
        master = await anyio.to_thread.run_sync(self.master)
        server = master if rng.random() < 0.7 else rng.choice(cluster.nodes)
        times = rng.randint(3, 5)
        ups = []
        for _ in range(times):
            await anyio.to_thread.run_sync(server.kill)
            await anyio.to_thread.run_sync(server.start)
            up = rng.uniform(0.05, 0.9)
            ups.append(f"{up:.2f}")
            await anyio.sleep(up)
        role = "the slot's master" if server is master else f"node {server.host}"
        return f"{role} SIGKILLed and started {times} times, up {', '.join(ups)} s each{note}"

    async def leftovers(self) -> list[str]:
        return []
