"""Server nodes in network namespaces of their own, which can be split from each other while this process reaches all.

Each node is a namespace linked by a veth pair to one *router* namespace,
which forwards between the nodes; this process (the root namespace) has a
link of its own to the router. So every packet between two nodes crosses
the router, where :meth:`Namespaces.cut` drops it silently (a policy rule
of type ``blackhole`` for each direction: a partition, not a refused
connection), while this process still reaches every node. A cut can also
drop only the TCP traffic of one port (a Redis Cluster's bus, not its
clients' or replicas' connections). Needs root and
``ip`` (iproute2); the addresses are a private ``10.X.0.0/16`` block no
route of this host uses yet.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
from dataclasses import dataclass

from .errors import HarnessError
from .processes import track, untrack

__all__ = ["Namespaces", "Node"]


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Node:
    """One namespace: the address its servers listen on, and the command prefix that runs a program there."""

    index: int
    netns: str
    address: str

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns)


class Namespaces:
    """``count`` node namespaces behind one router namespace (see the module); :meth:`cleanup` removes them all."""

    def __init__(self, count: int) -> None:
        tag = f"{random.randrange(16**4):04x}"
        used = _ip("-4", "route", "show", "table", "all") + _ip("-4", "addr")
        free = [x for x in range(200, 250) if f"10.{x}." not in used]
        if not free:
            raise HarnessError("no free 10.X.0.0/16 block for the namespaces")
        block = f"10.{random.choice(free)}"
        self.block = block
        self._router = f"aioelect-{tag}-r"
        self._host_link = f"vs{tag}h"
        self._rules: set[tuple[int, int, int | None]] = set()
        self.nodes: list[Node] = []
        self._cleaned = False
        track(self, self.cleanup)
        try:
            _ip("netns", "add", self._router)
            self._in(self._router, "ip", "link", "set", "lo", "up")
            self._in(self._router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
            self._link(self._host_link, f"vs{tag}r", None, self._router, f"{block}.0.1", f"{block}.0.2")
            _ip("route", "add", f"{block}.0.0/16", "via", f"{block}.0.2")
            for i in range(1, count + 1):
                node = Node(i, f"aioelect-{tag}-n{i}", f"{block}.{i}.2")
                _ip("netns", "add", node.netns)
                self.nodes.append(node)
                self._in(node.netns, "ip", "link", "set", "lo", "up")
                self._link(f"vs{tag}{i}a", f"vs{tag}{i}b", self._router, node.netns, f"{block}.{i}.1", node.address)
                self._in(node.netns, "ip", "route", "add", "default", "via", f"{block}.{i}.1")
        except BaseException:
            self.cleanup()
            raise

    @staticmethod
    def _in(netns: str, *argv: str) -> None:
        _ip("netns", "exec", netns, *argv)

    def _link(self, a: str, b: str, a_ns: str | None, b_ns: str, a_addr: str, b_addr: str) -> None:
        """A veth pair ``a`` (in ``a_ns``, None: here) -- ``b`` (in ``b_ns``), a /24 between them."""
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        for link, netns, addr in ((a, a_ns, a_addr), (b, b_ns, b_addr)):
            here = ("ip",) if netns is None else ("ip", "netns", "exec", netns, "ip")
            if netns is not None:
                _ip("link", "set", link, "netns", netns)
            subprocess.run([*here, "addr", "add", f"{addr}/24", "dev", link], check=True, capture_output=True)
            subprocess.run([*here, "link", "set", link, "up"], check=True, capture_output=True)

    def _rule(self, verb: str, a: Node, b: Node, port: int | None) -> None:
        for src, dst in ((a, b), (b, a)):
            match = ("from", src.address, "to", dst.address)
            if port is None:
                self._in(self._router, "ip", "rule", verb, *match, "blackhole")
                continue
            for side in ("sport", "dport"):
                self._in(self._router, "ip", "rule", verb, *match, "ipproto", "tcp", side, str(port), "blackhole")

    def cut(self, a: Node, b: Node, *, port: int | None = None) -> None:
        """Drop every packet between ``a`` and ``b`` from now on (both ways); idempotent.

        With ``port``, only the TCP packets between them to or from that port
        (a connection to a server on either node listening there): their
        other traffic goes on."""
        key = (min(a.index, b.index), max(a.index, b.index), port)
        if key not in self._rules:
            self._rule("add", a, b, port)
            self._rules.add(key)

    def heal(self, a: Node, b: Node, *, port: int | None = None) -> None:
        key = (min(a.index, b.index), max(a.index, b.index), port)
        if key in self._rules:
            self._rule("del", a, b, port)
            self._rules.discard(key)

    def heal_all(self) -> None:
        by_index = {n.index: n for n in self.nodes}
        for i, j, port in sorted(self._rules, key=lambda rule: (rule[0], rule[1], rule[2] or 0)):
            self.heal(by_index[i], by_index[j], port=port)

    @property
    def cuts(self) -> set[tuple[int, int]]:
        """The node pairs (by index) split now, wholly or on a port."""
        return {(i, j) for i, j, _ in self._rules}

    def cleanup(self) -> None:
        """Remove the route, the links and every namespace (idempotent; the servers in them must be stopped)."""
        if self._cleaned:
            return
        self._cleaned = True
        untrack(self)
        with contextlib.suppress(HarnessError):
            _ip("route", "del", f"{self.block}.0.0/16")
        with contextlib.suppress(HarnessError):
            _ip("link", "del", self._host_link)
        for netns in [n.netns for n in self.nodes] + [self._router]:
            with contextlib.suppress(HarnessError):
                _ip("netns", "del", netns)
