"""An etcd member, etcd's raft leader, cut off from the other two while a candidate still reaches it.

The member runs in a network namespace of its own, linked to the host by a
veth pair; its peers reach it, and it them, only over that link, while a
candidate inside the namespace talks to it on the namespace's own loopback.
Removing the routes over the link cuts the member off from its peers and
from nothing else. The member can no longer reach a quorum: it must answer
no linearizable request (every request aioelect sends), though it still
answers a serializable read from what it last knew. A lease keep-alive is
not linearizable: until it sees that it lost its quorum (within two election
timeouts), a raft leader renews leases on its own (etcd 3.4, and 3.5 before
its leader check on renewals), and the other members' new raft leader
extends every lease by ``ttl`` plus an election timeout so that this cannot
let a lease pass on early.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from .backends import unique_name
from .faults import Candidates, check_invariants
from .harness import LOOPBACK, EtcdServer, free_port, require_binary
from .test_faults_keepalive import ip, namespace  # noqa: F401 - the namespace fixture

TTL = 2
RENEW_DEADLINE = 2 / 3 * TTL  # the etcd elector's default


class Member(EtcdServer):
    """A member that its peers reach at ``peer_host``; with ``netns``, run in that network namespace and serving
    clients on its loopback too."""

    def __init__(self, *, host: str, peer_host: str, netns: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.host, self.peer_host, self.netns = host, peer_host, netns

    @property
    def peer_url(self) -> str:
        return f"http://{self.peer_host}:{self.peer_port}"

    def _argv(self) -> list[str]:
        argv = super()._argv()
        if self.netns is None:
            return argv
        inside = f",http://{LOOPBACK}:{self.port}"
        argv = [arg + inside if arg.startswith("--listen-client-urls=") else arg for arg in argv]
        return ["ip", "netns", "exec", self.netns, *argv]


def test_a_member_cut_off_from_the_others_answers_no_linearizable_request_and_its_leader_fences(
    namespace: tuple[str, str, str, str],  # noqa: F811 - the fixture
) -> None:
    netns, host_link, host, inner = namespace
    ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
    subnet = host.rsplit(".", 1)[0] + ".0/30"
    names, ports = ["cut", "b", "c"], [free_port() for _ in range(3)]
    initial = ",".join(f"{n}=http://{inner if n == 'cut' else host}:{p}" for n, p in zip(names, ports, strict=True))
    token = unique_name("partition")
    members = [
        Member(host=inner if n == "cut" else LOOPBACK, peer_host=inner if n == "cut" else host,
               netns=netns if n == "cut" else None, name=n, client_port=free_port(), peer_port=p,
               initial_cluster=initial, cluster_token=token)
        for n, p in zip(names, ports, strict=True)
    ]  # fmt: skip
    cut, *majority = members
    try:
        for member in members:
            member._spawn()
        deadline = time.monotonic() + 30
        for member in members:
            member._wait_ready(deadline)
        inside = f"{LOOPBACK}:{cut.port}"
        make_raft_leader(cut, members)
        with Candidates("etcd", inside, unique_name("partition"), {"ttl": TTL}) as candidates:
            isolated = candidates.start("isolated", prefix=("ip", "netns", "exec", netns))
            assert candidates.wait_leader(timeout=30) is isolated
            candidates.start("majority", target=",".join(m.endpoint for m in majority))
            candidates.wait_ready()
            time.sleep(1.0)
            ip("netns", "exec", netns, "ip", "route", "del", subnet)  # the member's way to its peers
            ip("route", "del", subnet, "dev", host_link)  # the peers' way to it
            cutoff = time.monotonic()
            successor = candidates.wait_leader(timeout=TTL + 15, exclude=isolated)
            took = (candidates.first_act_after(cutoff, exclude=isolated) or 0) - cutoff
            stopped = (isolated.last_act() or 0) - cutoff
            time.sleep(0.5)
            linearizable = ctl_inside(netns, inside, "get", "--prefix", "", "--keys-only")
            stale = ctl_inside(netns, inside, "get", "--prefix", "", "--keys-only", "--consistency=s")
            now = majority[0].etcdctl("get", "--prefix", "", "--keys-only", check=True)
            print(f"MEASURED etcd member cut off: its leader stops {stopped:.2f}s, the majority's leads {took:.2f}s")
            assert successor.identity == "majority"
            # As raft leader until it sees it lost its quorum, the member acknowledged keep-alives sent after the
            # cut: its candidate led past its renew deadline from the cut, and still stopped before the successor.
            assert stopped > RENEW_DEADLINE, f"no keep-alive was acknowledged after the cut ({stopped:.2f}s)"
            assert stopped < took, f"the successor led {took:.2f}s after the cut, the old leader until {stopped:.2f}s"
            assert linearizable.returncode != 0, f"a linearizable read answered: {linearizable.stdout}"
            # What a serializable request would have been told: the cut-off member's last view, not the election's.
            assert stale.returncode == 0 and stale.stdout.split() != now.stdout.split(), (stale.stdout, now.stdout)
            assert candidates.leader() is successor, "the candidate on the cut-off member leads again"
            check_invariants(candidates, max_gap=TTL + 15)
    finally:
        for member in members:
            member.cleanup()


def make_raft_leader(member: Member, members: list[Member]) -> None:
    """Move etcd's raft leadership to ``member`` (reached, like the others, from this namespace)."""
    endpoints = [m.endpoint for m in members]
    member_id = int(member.status()["header"]["member_id"])
    etcdctl = require_binary("etcdctl")
    argv = [etcdctl, f"--endpoints={','.join(endpoints)}", "--command-timeout=5s", "move-leader", f"{member_id:x}"]
    moved = subprocess.run(argv, capture_output=True, text=True, timeout=15, env={**os.environ, "ETCDCTL_API": "3"})
    already = "already leader" in moved.stderr.lower() or "is already" in moved.stderr.lower()
    assert moved.returncode == 0 or already, moved.stderr
    deadline = time.monotonic() + 10
    while str(member.status()["leader"]) != str(member_id):
        assert time.monotonic() < deadline, "etcd's raft leadership did not move to the member to be cut off"
        time.sleep(0.1)


def ctl_inside(netns: str, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``etcdctl ARGS`` run inside ``netns`` against ``endpoint``, given up after 2 s."""
    etcdctl = require_binary("etcdctl")
    argv = ["ip", "netns", "exec", netns, etcdctl, f"--endpoints={endpoint}", "--command-timeout=2s", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=15, env={**os.environ, "ETCDCTL_API": "3"})
