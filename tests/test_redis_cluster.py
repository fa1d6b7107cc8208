"""The Redis backend on a real Redis Cluster: 3 masters (redis-server, ``appendfsync always``) on loopback.

Every connection goes to the master that owns the election's slot (both keys
and the channel share the hash tag ``{name}``); a slot that moves is followed
after its ``MOVED`` reply; the durability checks and ``WAIT`` go to that master.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import anyio
import pytest

from aioelect import Leadership, PermanentBackendError, RedisElector, from_env
from aioelect.backends.redis import RedisBackend

from .backends import unique_name
from .faults import CHECK_INTERVAL, LEASE, MARGIN, REDIS_OPTIONS, Candidates, check_invariants
from .harness import LOOPBACK, Certificates, RedisCluster, RedisServer, TCPProxy, free_port

OPTIONS = {"lease": 4, "check_interval": 0.2, "check_timeout": 1.0}


def lock_key(name: str) -> str:
    return f"aioelect:{{{name}}}:lock"


def make(url: str, name: str, **kw: object) -> RedisElector:
    return RedisElector(url, name=name, **{**OPTIONS, **kw})  # type: ignore[arg-type]


def seed(cluster: RedisCluster, node: RedisServer) -> str:
    """A URL naming one node only: the others are found through it."""
    return f"redis+cluster://{LOOPBACK}:{node.port}/"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as started:
        yield started


def names_on_each_master(cluster: RedisCluster) -> dict[int, str]:
    """One election name per master (port -> name)."""
    found: dict[int, str] = {}
    while len(found) < len(cluster.nodes):
        name = unique_name()
        found.setdefault(cluster.owner(lock_key(name)).port, name)
    return found


# --- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://h:1,h:2/1", "database 0 only"),
        ("redis+cluster://h:1/0/x", "database 0 only"),
        ("redis+cluster://h:1,,h:2/", "host:port of each node"),
        ("redis+cluster://h:1/?foo=1", "unsupported Redis URL parameter 'foo'"),
        ("redis+cluster://h:1/?ssl_ca_certs=/nonexistent", "rediss://"),
    ],
)
def test_bad_cluster_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisElector(url, name="x")


def test_a_cluster_url_lists_the_nodes_never_the_password() -> None:
    backend = RedisBackend("rediss+cluster://app:s3cr%23t@10.0.0.1:7000,10.0.0.2/0", name="x")
    assert backend.settings.cluster_nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379))
    assert backend.settings.tls and backend.settings.db == 0
    assert backend.settings.url == "rediss+cluster://app:***@10.0.0.1:7000,10.0.0.2:6379/"
    assert "s3cr" not in repr(backend) and "s3cr" not in repr(backend.settings)
    elector = from_env({"AIOELECT_REDIS_URL": "redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "AIOELECT_NAME": "n"})
    assert isinstance(elector._backend, RedisBackend)
    assert elector._backend.settings.cluster_nodes == (("127.0.0.1", 7000), ("127.0.0.1", 7001))


# --- elections ----------------------------------------------------------------------------------


async def test_two_electors_on_different_seeds_elect_one_leader_and_a_release_hands_over_at_once(
    cluster: RedisCluster,
) -> None:
    name = unique_name()
    a_url, b_url = seed(cluster, cluster.nodes[0]), seed(cluster, cluster.nodes[1])
    delays, tokens = [], []
    async with (
        make(a_url, name, identity="a", poll_interval=5) as a,
        make(b_url, name, identity="b", poll_interval=5) as b,
    ):
        for _ in range(3):
            lead = await a.acquire(timeout=5)
            tokens.append(lead.token)
            assert await b.try_acquire() is None
            assert await b.leader() == "a"
            follower = asyncio.create_task(b.acquire(timeout=10))
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await lead.release()
            got = await follower
            delays.append(time.monotonic() - released)
            tokens.append(got.token)
            with anyio.fail_after(5):
                while got.held:
                    await asyncio.sleep(0.01)
    print(f"MEASURED redis cluster handover after release: median {sorted(delays)[1] * 1000:.1f} ms")
    assert sorted(delays)[1] < 0.5, delays  # published, not polled (poll_interval=5)
    assert tokens == sorted(set(tokens)) and len(tokens) == 6, tokens


async def test_names_on_different_masters_each_hold_their_key_on_their_master(cluster: RedisCluster) -> None:
    names = names_on_each_master(cluster)
    async with anyio.create_task_group() as tg:
        for port, name in names.items():

            async def one(port: int = port, name: str = name) -> None:
                async with make(cluster.url, name) as elector:
                    lead = await elector.acquire(timeout=5)
                    owner = next(n for n in cluster.nodes if n.port == port)
                    assert owner.command("EXISTS", lock_key(name)) == 1
                    await lead.release()
                    assert owner.command("EXISTS", lock_key(name)) == 0

            tg.start_soon(one)


async def test_durability_and_wait_are_checked_on_the_slots_master(cluster: RedisCluster) -> None:
    names = names_on_each_master(cluster)
    weak_port, weak_name = next(iter(names.items()))
    weak = next(n for n in cluster.nodes if n.port == weak_port)
    weak.command("CONFIG", "SET", "appendfsync", "everysec")
    try:
        async with make(cluster.url, weak_name) as elector:
            with pytest.raises(PermanentBackendError, match="'everysec', not 'always'"):
                await elector.try_acquire()
        for port, name in names.items():
            if port != weak_port:  # the other masters sync every write: their elections go on
                async with make(cluster.url, name) as elector:
                    assert await elector.try_acquire() is not None
    finally:
        weak.command("CONFIG", "SET", "appendfsync", "always")
    name = unique_name()
    async with make(cluster.url, name, min_replicas=1) as elector:  # no replicas in this cluster
        with pytest.raises(Exception, match="only 0 of min_replicas=1"):
            await elector.try_acquire()
    assert cluster.owner(lock_key(name)).command("EXISTS", lock_key(name)) == 0, "a refused grant is withdrawn"


async def test_a_key_deleted_by_an_operator_is_a_loss(cluster: RedisCluster) -> None:
    name = unique_name()
    async with make(cluster.url, name) as elector:
        lead = await elector.acquire(timeout=5)
        cluster.owner(lock_key(name)).command("DEL", lock_key(name))
        with anyio.fail_after(5):
            await lead.wait_lost()
        assert "no longer holds our value" in (lead.lost_reason or "")


async def test_a_slot_moved_to_another_master_is_followed_by_the_leader(cluster: RedisCluster) -> None:
    """The election's slot migrates with its keys (``MIGRATE``, ``CLUSTER SETSLOT``): the next renew gets ``MOVED``
    and goes to the new master; the leadership and its token stay."""
    name = unique_name()
    async with make(cluster.url, name) as elector:
        lead = await elector.acquire(timeout=5)
        source = cluster.owner(lock_key(name))
        target = next(n for n in cluster.nodes if n is not source)
        slot = int(source.command("CLUSTER", "KEYSLOT", lock_key(name)))
        ids = {n.port: n.command("CLUSTER", "MYID") for n in cluster.nodes}
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
        keys = [lock_key(name), f"aioelect:{{{name}}}:token"]
        source.command("MIGRATE", LOOPBACK, target.port, "", 0, 5000, "KEYS", *keys)
        for node in (target, source, *(n for n in cluster.nodes if n not in (source, target))):
            node.command("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
        await asyncio.sleep(1.5)
        assert lead.held
        # Renewed there since: without renews the migrated key would have at most lease - 1.5 s left.
        assert target.command("PTTL", lock_key(name)) > (OPTIONS["lease"] - 1) * 1000
        await lead.release()
        async with make(cluster.url, name) as other:
            successor = await other.acquire(timeout=5)
            assert successor.token is not None and lead.token is not None and successor.token > lead.token


async def test_a_plain_server_behind_a_cluster_url_is_refused(redis_server: RedisServer) -> None:
    async with make(f"redis+cluster://{LOOPBACK}:{redis_server.port}/", unique_name()) as elector:
        with pytest.raises(PermanentBackendError, match="not a Redis Cluster"):
            await elector.try_acquire()


def test_leader_process_killed_is_replaced_after_the_lease(cluster: RedisCluster) -> None:
    with Candidates("redis", cluster.url, unique_name("fault"), REDIS_OPTIONS) as candidates:
        for i, node in enumerate(cluster.nodes[:2]):
            candidates.start(f"cand-{i}", target=seed(cluster, node))
        leader = candidates.wait_leader()
        successor, took = candidates.replace(leader, leader.kill, timeout=LEASE + 10)
        assert successor is not leader
        print(f"MEASURED redis cluster sigkill takeover {took:.3f}s (lease {LEASE}s)")
        assert LEASE - 1.0 < took < LEASE + CHECK_INTERVAL + MARGIN, f"takeover after SIGKILL took {took:.2f}s"
        check_invariants(candidates, max_gap=LEASE + CHECK_INTERVAL + MARGIN)


async def test_an_acl_user_with_cluster_slots_and_the_documented_commands_campaigns(cluster: RedisCluster) -> None:
    """The least privilege of docs/backends.md, plus ``+cluster|slots``, campaigns and observes; a seed that does not
    answer is skipped."""
    user = unique_name("elector").replace("-", "_")
    rules = (
        "on >pw resetkeys ~aioelect:* resetchannels &aioelect:* -@all +eval +evalsha +get +set +del +incr +pexpire "
        "+pttl +publish +wait +subscribe +unsubscribe +ping +info +role +cluster|slots"
    )
    for node in cluster.nodes:
        node.command("ACL", "SETUSER", user, *rules.split())
    try:
        dead = free_port()  # nothing listens there: the next node is asked
        url = (
            f"redis+cluster://{user}:pw@{LOOPBACK}:{dead},{LOOPBACK}:{cluster.nodes[2].port}/"
            "?assume_appendfsync=always&assume_timeout=0"
        )
        name = unique_name()
        async with make(url, name, identity="a") as a, make(url, name, identity="b") as b:
            lead = await a.acquire(timeout=5)
            assert await b.leader() == "a"
            assert await b.try_acquire() is None
            seen: list[str | None] = []

            async def watch() -> None:
                async for current in b.observe():
                    seen.append(current)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                with anyio.fail_after(5):
                    while seen[-1:] != ["a"]:
                        await asyncio.sleep(0.01)
                await lead.release()
                lead_b = await b.acquire(timeout=5)
                assert lead_b.token == (lead.token or 0) + 1
                with anyio.fail_after(5):
                    while seen[-1:] != ["b"]:
                        await asyncio.sleep(0.01)
                await lead_b.release()
                tg.cancel_scope.cancel()
            owner = a._backend._slot_owner  # type: ignore[attr-defined]
            assert owner is not None and owner.nodes[0] == (LOOPBACK, cluster.nodes[2].port), "answered: asked first"
        async with make(url.replace(":pw@", ":wrong@"), name) as denied:
            with pytest.raises(PermanentBackendError, match=r"WRONGPASS|invalid username-password"):
                await denied.try_acquire()
    finally:
        for node in cluster.nodes:
            node.command("ACL", "DELUSER", user)


async def test_a_failover_of_the_slots_master_with_min_replicas_keeps_the_token_growing() -> None:
    """3 masters with a replica each: the master that holds the election's keys is SIGKILLed while a candidate
    leads; the cluster promotes its replica, which ``WAIT`` made sure had the grant: the key keeps excluding others
    until it expires, and the next token is larger."""
    timing = {"lease": 3, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 0.5}
    with RedisCluster(replicas=1, node_timeout_ms=1000) as group:
        name = unique_name()
        async with (
            make(group.url, name, identity="old", min_replicas=1, **timing) as old,
            # The promoted replica has no replica of its own: a successor that asked for one would never lead.
            make(group.url, name, identity="new", **timing) as new,
        ):
            lead = await old.acquire(timeout=10)
            master = group.owner(lock_key(name))
            fenced, at, token = await fail_over(group, name, lead, new, master, master.kill)
            print(
                f"MEASURED redis cluster failover (min_replicas=1): old leader stopped {fenced:.2f}s "
                f"after the master's SIGKILL, successor led after {at:.2f}s on the promoted replica; "
                f"tokens {lead.token} -> {token}"
            )


async def fail_over(
    group: RedisCluster, name: str, lead: Leadership, successor: RedisElector, master: RedisServer,
    fault: Callable[[], None],
) -> tuple[float, float, int]:  # fmt: skip
    """Do ``fault`` to ``master``, the slot's, while ``lead`` leads and ``successor`` campaigns. The slot must
    move to another node, the old leader stop before the successor leads, and the token grow; return how long
    after the fault the old leader stopped and the successor led, and the successor's token."""
    won: list[tuple[float, int | None]] = []

    async def follow() -> None:
        got = await successor.acquire()
        won.append((time.monotonic(), got.token))
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await anyio.to_thread.run_sync(fault)
        with anyio.fail_after(10):
            await lead.wait_lost()
        fenced = time.monotonic()
        with anyio.fail_after(30):
            while not won:
                await asyncio.sleep(0.05)
        tg.cancel_scope.cancel()
    at, token = won[0]
    others = next(node for node in group.nodes if node is not master and node.running)
    assert group.owner(lock_key(name), asked=others) is not master, "the cluster did not fail the master over"
    assert token is not None and lead.token is not None and token > lead.token, (lead.token, token)
    assert fenced < at, "the successor led before the old leader stopped"
    return fenced - started, at - started, token


async def test_a_tls_cluster_through_rediss_cluster(certs: Certificates) -> None:
    """Every node serves TLS only (the cluster bus too); the URL's CA verifies each node the elector reaches."""
    with RedisCluster(tls=certs) as group:
        name = unique_name()
        async with make(group.url, name, identity="a") as a, make(group.url, name, identity="b") as b:
            lead = await a.acquire(timeout=5)
            assert await b.leader() == "a"
            owner = group.owner(lock_key(name))
            assert group.command(owner, "EXISTS", lock_key(name)) == 1
            await lead.release()
            assert (await b.acquire(timeout=5)).token == (lead.token or 0) + 1
        # Trusting another certificate than the CA that signed the nodes': refused at once, never retried.
        async with make(group.url.replace(certs.ca, certs.client_cert), name) as refused:
            with pytest.raises(PermanentBackendError, match="TLS handshake failed"):
                await refused.try_acquire()


def test_the_command_line_takes_a_cluster_url(cluster: RedisCluster) -> None:
    """`aioelect run --redis redis+cluster://...` leads and runs CMD; a database other than 0 is a usage error."""
    from .test_cli import cli

    ran = cli("run", "--redis", cluster.url, "--name", unique_name("cli"), "--no-wait", "--", "true", timeout=60)
    assert ran.returncode == 0, ran.stderr
    wrong = cli("leader", "--redis", cluster.url.rstrip("/") + "/1", "--name", "n", timeout=60)
    assert wrong.returncode == 2 and "database 0 only" in wrong.stderr, wrong.stderr


def route_bus_through_proxies(group: RedisCluster, master: RedisServer) -> dict[RedisServer, TCPProxy]:
    """Every node's cluster bus reached through a proxy of its own (announced as its bus port), and ``master``'s
    own bus connections made from 127.0.0.2; return once every node's links to the others go through them.

    Then ``proxies[master].stall()`` and ``stall_from("127.0.0.2")`` on the rest cut ``master`` off the bus,
    and from nothing else: clients and its replicas reach it on its port as before."""
    proxies: dict[RedisServer, TCPProxy] = {}
    for node in group.nodes:
        bus = int(node.extra_args[node.extra_args.index("--cluster-port") + 1])
        proxies[node] = TCPProxy(LOOPBACK, bus)
        group.command(node, "CONFIG", "SET", "cluster-announce-ip", LOOPBACK)
        group.command(node, "CONFIG", "SET", "cluster-announce-bus-port", proxies[node].port)
    group.command(master, "CONFIG", "SET", "bind-source-addr", "127.0.0.2")
    # A node that sees a peer announce another bus port closes its link to that peer and dials the new one.
    others = len(group.nodes) - 1
    deadline = time.monotonic() + 20
    while not all(p.connection_count >= others for p in proxies.values()):
        if time.monotonic() > deadline:
            counts = {n.port: p.connection_count for n, p in proxies.items()}
            raise AssertionError(f"the bus links did not move to the proxies: {counts}")
        time.sleep(0.1)
    group.wait_ok(timeout=10)
    return proxies


async def test_a_master_cut_off_from_the_cluster_bus_stops_its_leader_before_a_successor_leads() -> None:
    """The master of the election's slot loses the cluster bus, not its clients: the other masters fail it over
    to its replica while the leader still reaches it. With ``min_replicas=1`` the leader stops before the
    promoted replica's copy of its key expires, so the successor, granted there, never leads beside it.

    The URL names the cut-off master first: it still answers ``CLUSTER SLOTS`` with itself and every command
    with ``CLUSTERDOWN``, and a candidate that kept asking it which master owns the slot would never find the
    promoted one while the cut lasts."""
    timing = {"lease": 3, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 0.5}
    with RedisCluster(replicas=1, node_timeout_ms=1000) as group:
        name = unique_name()
        master = group.owner(lock_key(name))
        first = [master, *(node for node in group.nodes if node is not master)]
        url = "redis+cluster://" + ",".join(f"{LOOPBACK}:{node.port}" for node in first) + "/"
        async with (
            make(url, name, identity="old", min_replicas=1, **timing) as old,
            make(url, name, identity="new", **timing) as new,  # the promoted replica has no replica
        ):
            lead = await old.acquire(timeout=10)
            proxies = await anyio.to_thread.run_sync(route_bus_through_proxies, group, master)
            assert lead.held, "the leadership did not outlive the bus links' move"

            def cut() -> None:
                for node, proxy in proxies.items():
                    if node is master:
                        proxy.stall()  # nobody reaches its bus
                    else:
                        proxy.stall_from("127.0.0.2")  # it reaches nobody's

            try:
                fenced, at, token = await fail_over(group, name, lead, new, master, cut)
                print(
                    f"MEASURED redis cluster bus cut (min_replicas=1): the old leader stopped {fenced:.2f}s after "
                    f"the cut, the successor led {at:.2f}s after it; tokens {lead.token} -> {token}; the old "
                    f"master still answers clients: {group.command(master, 'PING')}"
                )
            finally:
                for proxy in proxies.values():
                    proxy.close()
