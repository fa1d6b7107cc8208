"""A PostgreSQL leader cut off by the network while its process is stopped (a VM pause), as in production.

The leader runs in a network namespace of its own, linked to the server by a
veth pair: taking the link down makes its host unreachable, so the server's
TCP keepalive probes go unanswered (a stopped process alone does not do
that: its kernel answers them). The server may then end the session when its
keepalives give up; the leader learns nothing until it is woken, and then
leads until its renew deadline. The server must keep the session at least
``lease``, or the lock passes on while the woken leader still has
``held=True``.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .backends import unique_name
from .faults import Candidates
from .harness import PostgresServer

#: lease 10, renew_deadline 9: the settings the server must honour for a second of margin.
OPTIONS = {
    "lease": 10,
    "renew_deadline": 9,
    "check_interval": 0.2,  # the last confirmation before the cut is at most about 0.2 s old
    "check_timeout": 2.0,
    "poll_interval": 1.0,
    "fencing": True,
}
#: How long the leader's process stays stopped: past the old keepalive bound (8 s), short of the deadline (9 s).
PAUSE = 8.6


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


@pytest.fixture
def namespace() -> Iterator[tuple[str, str, str, str]]:
    """``(netns, host-side link, host address, address inside)``: a private /30 on a veth pair, removed after."""
    tag = f"{random.randrange(16**4):04x}"
    netns, host_link, inner_link = f"aioelect-ka-{tag}", f"vka{tag}", f"vkb{tag}"
    subnet = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    host, inner = f"{subnet}.1", f"{subnet}.2"
    try:
        ip("netns", "add", netns)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot create a network namespace (root and iproute2 needed): {exc}")
    try:
        ip("link", "add", host_link, "type", "veth", "peer", "name", inner_link)
        ip("link", "set", inner_link, "netns", netns)
        ip("addr", "add", f"{host}/30", "dev", host_link)
        ip("link", "set", host_link, "up")
        ip("netns", "exec", netns, "ip", "addr", "add", f"{inner}/30", "dev", inner_link)
        ip("netns", "exec", netns, "ip", "link", "set", inner_link, "up")
        yield netns, host_link, host, inner
    finally:
        subprocess.run(["ip", "link", "del", host_link], timeout=10, capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], timeout=10, capture_output=True)


def test_a_paused_leader_cut_off_by_the_network_never_leads_beside_its_successor(
    namespace: tuple[str, str, str, str],
) -> None:
    netns, host_link, host, inner = namespace
    with PostgresServer(extra_args=["-c", f"listen_addresses=127.0.0.1,{host}"]) as server:
        hba = Path(server.data_dir) / "pg_hba.conf"
        hba.write_text(f"host all all {inner}/32 trust\n" + hba.read_text())
        server.query("SELECT pg_reload_conf()")
        time.sleep(0.5)  # the reload is asynchronous
        remote = server.dsn.replace(f"@{server.host}:", f"@{host}:")
        with Candidates("postgres", server.dsn, unique_name("ka"), OPTIONS) as candidates:
            leader = candidates.start("paused", target=remote, prefix=("ip", "netns", "exec", netns))
            assert candidates.wait_leader(timeout=30) is leader
            successor = candidates.start("successor")
            time.sleep(3)  # the successor waits inside pg_advisory_lock; the leader confirms every 0.2 s
            leader.freeze()
            ip("link", "set", host_link, "down")
            cut = time.monotonic()
            last_act = leader.last_act()
            assert last_act is not None
            try:
                time.sleep(PAUSE)
                leader.thaw()  # still cut off: it can only notice through its renew deadline or a failed check
                time.sleep(6)
            finally:
                leader.thaw()
            led = next((e["t"] for e in successor.events if e["event"] == "lead"), None)
            held = [e["t"] for e in leader.events if e["event"] == "tick" and e["held"] and e["t"] > cut]
            assert led is not None, "the server never ended the cut-off leader's session"
            print(
                f"successor led {led - cut:.2f}s after the cut; the woken leader's last held=True "
                + (f"{max(held) - cut:.2f}s after it" if held else "none after it")
            )
            overlap = [t for t in held if t >= led]
            assert not overlap, (
                f"the successor led {led - cut:.2f}s after the cut, and the woken leader still had held=True "
                f"{max(overlap) - led:.2f}s after that"
            )
