"""A Redis master cut off from its sentinels while the candidates still reach it: never two leaders.

The sentinels log in as the default user; the candidates and the replicas as
``elector``. Switching the default user off on the master (and killing its
connections) cuts the master off from the sentinels only: they promote a
replica, while the old leader's connection to the old master is untouched.
Every leadership's ``held`` is sampled every 10 ms; the test fails if two
were held at once. What it measures is stated in docs/guarantees.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import anyio
import pytest

from aioelect import Leadership, RedisElector

from .backends import unique_name
from .harness import RedisServer, SentinelServer, free_port, redis_command

#: Quick renews and a short lease; the sentinels call a master down after 1 s.
OPTIONS = {"lease": 3, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 0.5}
USER, PASSWORD = "elector", "elector-secret"
ACL = [f"{USER} on >{PASSWORD} ~* &* +@all"]
#: A replica's full sync at once, not after Redis's default 5 s: after the failover the other replica must resync
#: with the promoted one before ``WAIT`` can confirm a grant there.
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")
#: The replicas replicate as ``elector``, so switching the default user off leaves replication alone.
REPLICA_AUTH = ("--masteruser", USER, "--masterauth", PASSWORD, *SYNC_AT_ONCE)


@dataclass
class Split:
    master: RedisServer
    replicas: list[RedisServer]
    sentinels: list[SentinelServer]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{USER}:{PASSWORD}@{hosts}/aioelect/0?master_hosts=127.0.0.1"

    def named_port(self) -> int:
        """The master's port as the first sentinel names it."""
        return int(self.sentinels[0].command("SENTINEL", "get-master-addr-by-name", "aioelect")[1])

    def as_elector(self, server: RedisServer, *args: str) -> object:
        return redis_command(server.port, *args, user=USER, password=PASSWORD)

    def cut(self) -> None:
        """The sentinels' user switched off on the master, their connections killed; nobody else is touched."""
        self.as_elector(self.master, "ACL", "SETUSER", "default", "off")
        self.as_elector(self.master, "CLIENT", "KILL", "USER", "default")

    def heal(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.as_elector(self.master, "ACL", "SETUSER", "default", "on")


@dataclass
class Sampled:
    """Each leadership's held intervals, sampled every 10 ms: the time two or more were held at once."""

    leads: list[tuple[str, Leadership]] = field(default_factory=list)
    overlap: float = 0.0
    first_at: dict[str, float] = field(default_factory=dict)
    last_at: dict[str, float] = field(default_factory=dict)

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            held = [who for who, lead in self.leads if lead.held]
            if len(held) > 1:
                self.overlap += now - last
            for who in held:
                self.first_at.setdefault(who, now)
                self.last_at[who] = now
            last = now


@pytest.fixture(params=[(1, 1), (3, 2)], ids=["1-sentinel", "3-sentinels-quorum-2"])
def split(request: pytest.FixtureRequest) -> Iterator[Split]:
    count, quorum = request.param
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(RedisServer(acl=ACL, extra_args=SYNC_AT_ONCE))
        # Two replicas: after the failover the promoted one still has a replica to confirm grants.
        replicas = [
            stack.enter_context(RedisServer(replica_of=master.port, acl=ACL, extra_args=REPLICA_AUTH)) for _ in range(2)
        ]
        sentinels = [stack.enter_context(SentinelServer(master.port, quorum=quorum)) for _ in range(count)]
        deadline = time.monotonic() + 30
        while True:
            info = dict(zip(*[iter(sentinels[0].command("SENTINEL", "master", "aioelect"))] * 2, strict=True))
            links = [r.command("INFO", "replication") for r in replicas]
            if (
                info.get("num-slaves") == "2"
                and info.get("num-other-sentinels") == str(count - 1)
                and all("master_link_status:up" in link for link in links)
            ):
                break
            assert time.monotonic() < deadline, f"the group never formed: {info}"
            time.sleep(0.1)
        group = Split(master, replicas, sentinels)
        try:
            yield group
        finally:
            group.heal()


@dataclass
class Outcome:
    overlap: float
    successor: float | None


async def cut_off(split: Split, min_replicas: int, *, direct: bool = False) -> Outcome:
    """A leader, a waiter on the old master, the cut, and a new candidate once the sentinels switch: sampled until
    another candidate has led for 3 s, or 25 s after the cut (the cut lasts all along). ``direct``: the leader
    connects to the master by its address, so it has no sentinel to ask (as if it could not reach them)."""
    name = unique_name()
    options = dict(OPTIONS, name=name, min_replicas=min_replicas)
    sampled = Sampled()
    leader_url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{split.master.port}/0" if direct else split.url
    async with (
        RedisElector(leader_url, identity="old", **options) as old,  # type: ignore[arg-type]
        RedisElector(split.url, identity="waiter", **options) as waiter,  # type: ignore[arg-type]
        RedisElector(split.url, identity="new", **options) as new,  # type: ignore[arg-type]
        anyio.create_task_group() as tg,
    ):
        lead = await old.acquire(timeout=10)
        sampled.leads.append(("old", lead))
        tg.start_soon(sampled.run)

        async def candidate(who: str, elector: RedisElector) -> None:
            got = await elector.acquire()
            sampled.leads.append((who, got))
            await got.wait_lost()

        # A waiter on the old master before the cut, a new candidate that asks Sentinel after the failover.
        tg.start_soon(candidate, "waiter", waiter)
        await asyncio.sleep(1.0)
        cut_at = time.monotonic()
        await anyio.to_thread.run_sync(split.cut)
        with anyio.fail_after(30):
            while await anyio.to_thread.run_sync(split.named_port) == split.master.port:
                await asyncio.sleep(0.1)
        failover = time.monotonic() - cut_at
        tg.start_soon(candidate, "new", new)
        with anyio.move_on_after(25 - failover):
            while not any(who != "old" and at < time.monotonic() - 3 for who, at in sampled.first_at.items()):
                await asyncio.sleep(0.05)
        successor = min((at for who, at in sampled.first_at.items() if who != "old"), default=None)
        who_led = [who for who, at in sampled.first_at.items() if at == successor]
        old_stopped = "still held" if lead.held else f"stopped {sampled.last_at['old'] - cut_at:.2f}s after the cut"
        led = "never" if successor is None else f"{successor - cut_at:.2f}s after the cut ({who_led[0]})"
        print(
            f"MEASURED redis master cut off from {len(split.sentinels)} sentinel(s), min_replicas={min_replicas}, "
            f"leader {'connected directly' if direct else 'through Sentinel'}: "
            f"sentinels switched {failover:.2f}s after the cut; old leader {old_stopped}; successor led {led}; two "
            f"leaders for {sampled.overlap:.2f}s"
        )
        tg.cancel_scope.cancel()
    return Outcome(sampled.overlap, None if successor is None else successor - cut_at)


async def test_a_master_cut_off_from_the_sentinels_leaves_one_leader(split: Split) -> None:
    outcome = await cut_off(split, min_replicas=1)
    assert outcome.overlap == 0, f"two leaders for {outcome.overlap:.2f}s"
    assert outcome.successor is not None, "nobody led after the failover"


@pytest.mark.parametrize("split", [(1, 1)], indirect=True, ids=["1-sentinel"])
async def test_wait_alone_fences_a_leader_that_cannot_ask_the_sentinels(split: Split) -> None:
    """The proof rests on ``WAIT``, not on the sentinels' answer: a leader that never asks them stops in time too."""
    outcome = await cut_off(split, min_replicas=1, direct=True)
    assert outcome.overlap == 0, f"two leaders for {outcome.overlap:.2f}s"
    assert outcome.successor is not None, "nobody led after the failover"


@pytest.mark.parametrize("split", [(1, 1)], indirect=True, ids=["1-sentinel"])
async def test_without_min_replicas_a_cut_off_master_keeps_its_leader_beside_the_new_one(
    split: Split, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``min_replicas=0`` gives up (docs/guarantees.md, R1): no replica confirms a renew, so a leader that cannot
    ask the sentinels keeps leading on the old master while the promoted replica elects another. The candidates that
    go through Sentinel say so in a WARNING."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    outcome = await cut_off(split, min_replicas=0, direct=True)
    assert "min_replicas=0 through Sentinel" in caplog.text
    assert outcome.successor is not None, "nobody led after the failover"
    assert outcome.overlap > 1.0, f"two leaders for only {outcome.overlap:.2f}s"


async def test_a_replica_promoted_by_hand_after_it_left_the_master_elects_a_second_leader() -> None:
    """Breaks the promotion assumption (docs/guarantees.md register): a replica that left the master before the
    grant, promoted by hand, never had the key. ``WAIT`` cannot see it; nothing in aioelect can."""
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(RedisServer())
        replicas = [stack.enter_context(RedisServer(replica_of=master.port)) for _ in range(2)]
        with anyio.fail_after(30):
            while not all("master_link_status:up" in r.command("INFO", "replication") for r in replicas):
                await asyncio.sleep(0.1)
        stray, kept = replicas
        stray.command("REPLICAOF", "127.0.0.1", free_port())  # leaves the master: nothing listens there
        with anyio.fail_after(10):
            while f"port={stray.port}," in master.command("INFO", "replication"):
                await asyncio.sleep(0.05)
        name = unique_name()
        async with RedisElector(master.url, name=name, identity="old", min_replicas=1, **OPTIONS) as old:  # type: ignore[arg-type]
            lead = await old.acquire(timeout=10)  # confirmed by the one replica still there
            stray.command("REPLICAOF", "NO", "ONE")  # an operator's failover to the replica that left
            async with RedisElector(stray.url, name=name, identity="new", **OPTIONS) as new:  # type: ignore[arg-type]
                second = await new.acquire(timeout=10)
                both = lead.held and second.held
                print(f"MEASURED redis replica promoted by hand after it left: two leaders at once: {both}")
                await asyncio.sleep(1.0)
                assert lead.held and second.held, "the promotion assumption broken, two leaders act at once"
                assert kept.command("EXISTS", f"aioelect:{{{name}}}:lock") == 1
                await second.release()


async def test_a_replica_still_in_its_first_sync_fences_the_leader_before_it_can_be_promoted() -> None:
    """A replica in its first full sync is not in ``ROLE``'s list (only ``INFO replication`` shows it, in state
    ``wait_bgsave``), yet Sentinel can promote it, without the key: the leader must stop counting its renews as
    soon as the master knows that replica, so that its promotion never elects a second leader. The leader connects
    to the master by its address: ``WAIT`` alone must fence it, as in the proof."""
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(RedisServer(acl=ACL, extra_args=SYNC_AT_ONCE))
        first = stack.enter_context(RedisServer(replica_of=master.port, acl=ACL, extra_args=REPLICA_AUTH))
        sentinel = stack.enter_context(SentinelServer(master.port, quorum=1))
        split = Split(master, [first], [sentinel])
        with anyio.fail_after(30):
            while "master_link_status:up" not in split.as_elector(first, "INFO", "replication"):  # type: ignore[operator]
                await asyncio.sleep(0.1)
        options = dict(OPTIONS, name=unique_name(), min_replicas=1)
        sampled = Sampled()
        try:
            async with (
                RedisElector(f"redis://{USER}:{PASSWORD}@127.0.0.1:{master.port}/0", identity="old", **options) as old,  # type: ignore[arg-type]
                RedisElector(split.url, identity="new", **options) as new,  # type: ignore[arg-type]
                anyio.create_task_group() as tg,
            ):
                lead = await old.acquire(timeout=10)
                sampled.leads.append(("old", lead))
                tg.start_soon(sampled.run)
                # The master holds new full syncs back: the next replica waits in wait_bgsave, unlisted by ROLE.
                split.as_elector(master, "CONFIG", "SET", "repl-diskless-sync", "yes")
                split.as_elector(master, "CONFIG", "SET", "repl-diskless-sync-delay", "60")
                attached = time.monotonic()
                syncing = stack.enter_context(
                    RedisServer(replica_of=master.port, acl=ACL, extra_args=(*REPLICA_AUTH, "--replica-priority", "1"))
                )
                with anyio.fail_after(30):  # the sentinel reads the master's INFO every 10 s
                    while True:
                        listed = sentinel.command("SENTINEL", "replicas", "aioelect")
                        if str(syncing.port) in [dict(zip(r[::2], r[1::2], strict=False)).get("port") for r in listed]:
                            break
                        await asyncio.sleep(0.2)
                role = split.as_elector(master, "ROLE")
                assert f"{syncing.port}" not in str(role), f"the syncing replica is listed by ROLE: {role}"
                cut_at = time.monotonic()
                await anyio.to_thread.run_sync(split.cut)
                with anyio.fail_after(30):
                    while await anyio.to_thread.run_sync(split.named_port) == master.port:
                        await asyncio.sleep(0.1)
                promoted = split.named_port()

                async def candidate() -> None:
                    got = await new.acquire()
                    sampled.leads.append(("new", got))
                    await got.wait_lost()

                tg.start_soon(candidate)
                with anyio.move_on_after(15):
                    while "new" not in sampled.first_at or time.monotonic() - sampled.first_at["new"] < 3:
                        await asyncio.sleep(0.05)
                old_last = sampled.last_at.get("old", attached) - attached
                new_first = sampled.first_at.get("new")
                print(
                    f"MEASURED redis replica in its first sync promoted (the syncing one: {promoted == syncing.port}): "
                    f"old leader stopped {old_last:.2f}s after that replica attached ({cut_at - attached:.2f}s before "
                    f"the cut); new leader "
                    f"{'never led' if new_first is None else f'led {new_first - cut_at:.2f}s after the cut'}; "
                    f"two leaders for {sampled.overlap:.2f}s"
                )
                tg.cancel_scope.cancel()
        finally:
            split.heal()
        assert sampled.overlap == 0, f"two leaders for {sampled.overlap:.2f}s"
        assert new_first is not None, "nobody led after the failover"


#: Users for a partition on loopback: the elector everywhere; each side's sentinels reach the servers as their own user.
PARTITION_ACL = [f"{user} on >{PASSWORD} ~* &* +@all" for user in (USER, "side_a", "side_b")]


class SidedSentinel(SentinelServer):
    """A sentinel that logs in to the servers as ``me`` and to its peers as ``peer``; it accepts ``side_a`` and
    ``side_b`` (the candidates of either side of the partition) as well as the default user."""

    def __init__(self, master_port: int, me: str, peer: str) -> None:
        super().__init__(master_port, quorum=2)
        self.me, self.peer = me, peer

    def _argv(self) -> list[str]:
        argv = super()._argv()
        with open(argv[1], "a") as fh:
            fh.write(
                f"sentinel auth-user aioelect {self.me}\nsentinel auth-pass aioelect {PASSWORD}\n"
                f"sentinel sentinel-user {self.peer}\nsentinel sentinel-pass {PASSWORD}\n"
                "user default on nopass ~* &* +@all\n"
                f"user side_a on >{PASSWORD} ~* &* +@all\nuser side_b on >{PASSWORD} ~* &* +@all\n"
            )
        return argv

    def as_user(self, *args: str) -> object:
        return redis_command(self.port, *args, user=self.peer, password=PASSWORD)


def _switch_off(run: Callable[..., object], *users: str) -> None:
    for user in users:
        run("ACL", "SETUSER", user, "off")
    for user in users:
        with contextlib.suppress(RuntimeError):
            run("CLIENT", "KILL", "USER", user)


async def test_a_minority_sentinel_that_still_names_the_old_master_confirms_no_grant() -> None:
    """A partition {S1, M, R3, C} | {S2, S3, R1, R2, N} on loopback (ACL users switched off): S2 and S3 promote a
    replica; S1 still names M, where R3 still replicates. C lists all three sentinels but reaches S1 only: one
    answer of three is no majority, so C's grant on M never stands while N leads on the promoted replica."""
    repl = ("--masteruser", USER, "--masterauth", PASSWORD, *SYNC_AT_ONCE)
    with contextlib.ExitStack() as stack:
        m = stack.enter_context(RedisServer(acl=PARTITION_ACL, extra_args=SYNC_AT_ONCE))
        r1, r2, r3 = (
            stack.enter_context(RedisServer(replica_of=m.port, acl=PARTITION_ACL, extra_args=repl)) for _ in range(3)
        )
        s1 = stack.enter_context(SidedSentinel(m.port, "side_a", "side_a"))
        s2, s3 = (stack.enter_context(SidedSentinel(m.port, "side_b", "side_b")) for _ in range(2))
        with anyio.fail_after(40):
            while True:
                states = [s.as_user("SENTINEL", "master", "aioelect") for s in (s1, s2, s3)]
                infos = [dict(zip(st[::2], st[1::2], strict=False)) for st in states]  # type: ignore[index]
                if all(i.get("num-slaves") == "3" and i.get("num-other-sentinels") == "2" for i in infos):
                    break
                await asyncio.sleep(0.2)

        def on(server: RedisServer) -> Callable[..., object]:
            return lambda *args: redis_command(server.port, *args, user=USER, password=PASSWORD)

        for node in (m, r3):
            _switch_off(on(node), "default", "side_b")
        for node in (r1, r2):
            _switch_off(on(node), "default", "side_a")
        _switch_off(s1.as_user, "default", "side_b")
        for s in (s2, s3):
            _switch_off(s.as_user, "default", "side_a")
        with anyio.fail_after(30):
            while int(s2.as_user("SENTINEL", "get-master-addr-by-name", "aioelect")[1]) == m.port:  # type: ignore[index]
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert int(s1.as_user("SENTINEL", "get-master-addr-by-name", "aioelect")[1]) == m.port  # type: ignore[index]
        options = dict(OPTIONS, name=unique_name(), min_replicas=1)
        hosts = [f"127.0.0.1:{s.port}" for s in (s1, s2, s3)]
        url = f"redis+sentinel://{USER}:{PASSWORD}@{{}}/aioelect/0?master_hosts=127.0.0.1"
        sampled = Sampled()
        async with (
            RedisElector(url.format(",".join(hosts)), identity="C", sentinel_username="side_a",
                         sentinel_password=PASSWORD, **options) as c,  # type: ignore[arg-type]
            RedisElector(url.format(",".join(hosts[1:] + hosts[:1])), identity="N", sentinel_username="side_b",
                         sentinel_password=PASSWORD, **options) as n,  # type: ignore[arg-type]
            anyio.create_task_group() as tg,
        ):  # fmt: skip
            tg.start_soon(sampled.run)
            began = time.monotonic()

            async def candidate(who: str, elector: RedisElector) -> None:
                got = await elector.acquire()
                sampled.leads.append((who, got))
                await got.wait_lost()

            tg.start_soon(candidate, "C", c)
            tg.start_soon(candidate, "N", n)
            await asyncio.sleep(8)
            led = {who: f"{sampled.first_at[who] - began:.2f}s" if who in sampled.first_at else "never" for who in "CN"}
            print(
                f"MEASURED redis minority sentinel naming the old master: C (minority side) led {led['C']}, N "
                f"(majority side) led {led['N']} after both campaigned; two leaders for {sampled.overlap:.2f}s"
            )
            tg.cancel_scope.cancel()
        assert sampled.overlap == 0, f"two leaders for {sampled.overlap:.2f}s"
        assert "C" not in sampled.first_at, "a grant on the master only a minority of the sentinels names stood"
        assert "N" in sampled.first_at, "nobody led on the master the majority of the sentinels names"
