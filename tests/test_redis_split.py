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
from collections.abc import Iterator
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
