"""The split workload's servers: several server nodes, each in a network namespace of its own, split from each other.

The nodes are :mod:`tests.harness.netns` namespaces behind one router; the
candidate processes reach every node (through their proxies, from this
host), so a split cuts servers off from servers, never a candidate off from
a server. Two targets, with the nemesis's server-wide split faults:

* ``sentinel-split``: a Sentinel-managed Redis (a master, two replicas,
  three sentinels, quorum 2; the group of :mod:`soak.adversary.sentinel_target`),
  candidates with ``min_replicas=1``. *cut-sentinels* cuts the master off
  from every sentinel (they promote a replica while the candidates still
  reach the old master), *cut-replicas* cuts it off from its replicas (no
  ``WAIT`` is answered). The candidates' proxies lead to the sentinels; the
  master a sentinel names is reached directly.
* ``etcd3-split``: a three-member etcd cluster. *isolate* cuts the raft
  leader's member off from the other two (they elect a leader of their own
  while candidates connected to the isolated member still reach it).

On both, *crash-loop* SIGKILLs a node (mostly the master, or the raft
leader's member) and starts it again 3 to 5 times, each time within a
second of its last start.

Before a split the target waits (at most 15 s) until the group has settled.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from typing import Any

from tests.harness import TCPProxy
from tests.harness.netns import Namespaces

from .adversary.sentinel_target import MASTER, SentinelTarget
from .targets import Etcd3Target, Target

__all__ = ["SPLIT_KINDS", "Etcd3SplitTarget", "SentinelSplitTarget"]

#: The nemesis's split faults (server-wide: one at a time, with no restart beside them).
SPLIT_KINDS = frozenset({"cut-sentinels", "cut-replicas", "isolate", "crash-loop"})


class SentinelSplitTarget(Target):
    label = "sentinel-split"
    backend = "redis"
    fault_kinds = ("kill", "pause", "depose", "cut-sentinels", "cut-replicas", "crash-loop")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.group = SentinelTarget(name)

    @property
    def _lock_key(self) -> str:
        return f"aioelect:{{{self.name}}}:lock"

    def start(self) -> None:
        self.group.start()

    def cleanup(self) -> None:
        self.group.cleanup()

    def upstreams(self) -> list[tuple[str, int]]:
        return [(s.host, s.port) for s in self.group.sentinels]

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        return f"redis+sentinel://{','.join(p.endpoint for p in proxies)}/{MASTER}/0"

    def depose(self) -> str:
        master = self.group.master()
        deleted = master.command("DEL", self._lock_key)
        return f"DEL {self._lock_key} on {master.host}" if deleted else "no holder"

    def split(self, kind: str, duration: float) -> str:
        group, nets = self.group, self.group.nets
        assert nets is not None
        note = _settle(group._settled)
        master = group.master()
        if kind == "crash-loop":
            rng = random.Random(duration)
            server: Any = master if rng.random() < 0.7 else rng.choice([*group.redis, *group.sentinels])
            role = "the master" if server is master else f"{server.kind} {server.host}"
            return f"{role} {_crash_loop(server, rng)}{note}"
        others = group.sentinels if kind == "cut-sentinels" else [r for r in group.redis if r is not master]
        try:
            for other in others:
                nets.cut(group.node(master), group.node(other))
            time.sleep(duration)
            # Asked before the heal, of the sentinels: whether they promoted a replica.
            named = group.master()
            note += " (failed over)" if named is not master else " (not failed over)"
        finally:
            for other in others:
                nets.heal(group.node(master), group.node(other))
        whom = "sentinels" if kind == "cut-sentinels" else "replicas"
        return f"master {master.host} cut off from its {whom} for {duration:.1f}s{note}"

    def restart(self, downtime: float) -> str:
        raise NotImplementedError("the split workload's faults are splits, not restarts of the whole group")

    def ensure_running(self) -> None:
        self.group.recover()

    def leftovers(self) -> list[str]:
        master = self.group.master()
        if master.command("EXISTS", self._lock_key):
            return [f"the lock key {self._lock_key} is left on the master {master.host}"]
        return []


class Etcd3SplitTarget(Etcd3Target):
    label = "etcd3-split"
    fault_kinds = ("kill", "pause", "depose", "partition", "isolate", "crash-loop")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.nets: Namespaces | None = None

    def start(self) -> None:
        self.nets = Namespaces(3)
        members = self.cluster.members
        for member, node in zip(members, self.nets.nodes, strict=True):
            member.place(node)
        initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for member in members:
            member._initial_cluster = initial  # the members' addresses in their namespaces
        self.cluster.start()

    def cleanup(self) -> None:
        self.cluster.cleanup()
        if self.nets is not None:
            self.nets.cleanup()

    def split(self, kind: str, duration: float) -> str:
        nets, cluster = self.nets, self.cluster
        assert nets is not None and kind in ("isolate", "crash-loop")
        leader = cluster.leader(timeout=15.0)
        note = "" if leader is not None else " (no raft leader within 15 s)"
        leader = leader or cluster.members[0]
        if kind == "crash-loop":
            rng = random.Random(duration)
            member = leader if rng.random() < 0.7 else rng.choice(cluster.members)
            role = "the raft leader's member" if member is leader else f"member {member.name}"
            return f"{role} {_crash_loop(member, rng)}{note}"
        i = cluster.members.index(leader)
        others = [n for j, n in enumerate(nets.nodes) if j != i]
        try:
            for other in others:
                nets.cut(nets.nodes[i], other)
            time.sleep(duration)
        finally:
            for other in others:
                nets.heal(nets.nodes[i], other)
        return f"raft leader {leader.name} cut off from the other members for {duration:.1f}s{note}"

    def depose(self) -> str:
        """As on the unsplit cluster; retried for up to 5 s while the members agree again after a heal (a request
        then may fail with ``leader changed`` or time out), the last failure raised with what etcdctl said."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return super().depose()
            except subprocess.CalledProcessError as exc:
                if "lease not found" in str(exc.stderr):
                    return "no holder (its lease expired meanwhile)"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcdctl {exc.cmd[-3:]}: {str(exc.stderr).strip()}") from exc
            time.sleep(0.5)

    def ensure_running(self) -> None:
        if self.nets is not None:
            self.nets.heal_all()
        self.cluster.start()


def _crash_loop(node: Any, rng: random.Random) -> str:
    """SIGKILL ``node`` and start it again, 3 to 5 times, each within a second of its last start."""
    times = rng.randint(3, 5)
    ups = []
    for _ in range(times):
        node.kill()
        node.start()
        up = rng.uniform(0.05, 0.9)
        ups.append(f"{up:.2f}")
        time.sleep(up)
    return f"SIGKILLed and started {times} times, up {', '.join(ups)} s each"


def _settle(settled: Callable[[], bool]) -> str:
    """Wait until ``settled()`` (at most 15 s); a note for the fault's detail if it never was."""
    deadline = time.monotonic() + 15.0
    while not settled():
        if time.monotonic() > deadline:
            return " (the group had not settled)"
        time.sleep(0.2)
    return ""
