"""aioelect.Shards: names spread over live instances, each owned name a leadership of its own.

Every test records each name's work in a fenced register (one per name, in this process): a work that starts
while another instance's work of the same name still runs, or with a token not above the last one seen for that
name, is a violation. The instances share one event loop, so the register sees every instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import Elector, EtcdElector, EtcdSession, Shards, current_leadership
from aioelect._shards import assign
from aioelect.testing import MemoryElector

from .harness.processes import popen

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
MEMBER = Path(__file__).parent / "candidates" / "shards_member.py"


class Register:
    """Per name: who runs its work now, the last token seen, and every violation of exclusivity or token order."""

    def __init__(self) -> None:
        self.running: dict[str, str] = {}
        #: The leadership of each running work: a start while it runs is a violation unless it is already lost.
        self.leads: dict[str, aioelect.Leadership] = {}
        #: Starts while a deposed owner's work was still being cancelled (its leadership lost, the lock given on).
        self.overtaken: list[str] = []
        self.last: dict[str, int] = {}
        self.starts: Counter[str] = Counter()
        self.started_at: dict[str, float] = {}
        self.violations: list[str] = []

    def work_of(self, instance: Shards) -> Callable[[str], Any]:
        async def work(name: str) -> None:
            lead = current_leadership()
            if lead.lost:
                # Lost between its grant and this start (a loaded machine past the renew deadline): Shards
                # cancels this work next, as for any loss.
                await anyio.sleep_forever()
            assert instance.leadership(name) is lead and lead.token is not None
            if name in self.running:
                if self.leads[name].lost:
                    self.overtaken.append(f"{name}: {instance.identity} started while {self.running[name]} stops")
                else:
                    self.violations.append(f"{name}: {instance.identity} started while {self.running[name]} runs")
            if lead.token <= self.last.get(name, -math.inf):
                self.violations.append(f"{name}: token {lead.token} after {self.last[name]}")
            self.running[name] = instance.identity
            self.leads[name] = lead
            self.last[name] = lead.token
            self.starts[name] += 1
            self.started_at[name] = time.monotonic()
            try:
                await anyio.sleep_forever()
            finally:
                if self.running.get(name) == instance.identity and self.leads.get(name) is lead:
                    del self.running[name]

        return work


class Fleet:
    """Instances of one Shards group, each running in its own task of the test's event loop."""

    def __init__(self, make: Callable[[str], Shards], register: Register) -> None:
        self.make = make
        self.register = register
        self.instances: dict[str, Shards] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, identity: str) -> Shards:
        shards = self.make(identity)
        self.instances[identity] = shards
        self.tasks[identity] = asyncio.get_running_loop().create_task(shards.run(self.register.work_of(shards)))
        return shards

    async def stop(self, identity: str) -> None:
        task = self.tasks.pop(identity)
        self.instances.pop(identity)
        task.cancel()
        with anyio.fail_after(20):
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for identity in list(self.tasks):
            await self.stop(identity)

    def loads(self) -> dict[str, int]:
        return {i: len(s.owned) for i, s in self.instances.items()}

    def balanced(self, names: int) -> bool:
        live = self.instances.values()
        if any(t.done() for t in self.tasks.values()):
            raise AssertionError(f"an instance ended: {[t for t in self.tasks.values() if t.done()]}")
        owned = [s.owned for s in live]
        every = set().union(*owned)
        floor = names // len(owned)
        return (
            len(every) == names
            and sum(map(len, owned)) == names
            and all(floor <= len(o) <= floor + 1 for o in owned)
            and all(s.members == tuple(sorted(self.instances)) for s in live)
        )

    async def settle(self, names: int, timeout: float) -> float:
        start = time.monotonic()
        with anyio.fail_after(timeout):
            while not self.balanced(names):
                await asyncio.sleep(0.02)
        return time.monotonic() - start


def memory_fleet(names: int, group: str, register: Register, **options: Any) -> Fleet:
    """Instances of ``group`` on the memory backend (a renew deadline long enough for a loaded machine)."""
    return Fleet(
        lambda identity: Shards(
            names,
            group=group,
            identity=identity,
            electors=lambda n: MemoryElector(name=n, renew_deadline=5),
            **options,
        ),
        register,
    )


def test_assign_is_balanced_deterministic_and_moves_little() -> None:
    for n, m in ((1000, 5), (20, 3), (7, 3), (3, 5), (1, 1)):
        names = [f"job-{i}" for i in range(n)]
        members = [f"inst-{i}" for i in range(m)]
        owners = assign(names, members)
        assert owners == assign(list(names), list(reversed(members)))
        loads = Counter(owners.values())
        assert sorted(owners) == sorted(names)
        assert all(n // m <= loads[x] <= n // m + 1 for x in members), loads
    names = [f"job-{i}" for i in range(1000)]
    five = assign(names, [f"inst-{i}" for i in range(5)])
    six = assign(names, [f"inst-{i}" for i in range(6)])
    four = assign(names, [f"inst-{i}" for i in range(1, 5)])
    # The new balance needs 166 moves to the sixth, and the 200 names of the one leaving: allow 15 % more.
    assert sum(five[n] != six[n] for n in names) <= 166 * 1.15
    assert sum(five[n] != four[n] for n in names) <= 200 * 1.15
    assert assign(names, []) == {}


def test_bad_arguments_are_refused() -> None:
    memory: Callable[[str], Elector] = lambda n: MemoryElector(name=n)  # noqa: E731
    with pytest.raises(ValueError, match="twice"):
        Shards(["a", "a"], group="g", electors=memory)
    with pytest.raises(ValueError, match="empty"):
        Shards([], group="g", electors=memory)
    with pytest.raises(ValueError, match="at least 1"):
        Shards(0, group="g", electors=memory)
    with pytest.raises(TypeError, match="one str"):
        Shards("abc", group="g", electors=memory)
    with pytest.raises(ValueError, match="printable"):
        Shards(["a b"], group="g", electors=memory)
    with pytest.raises(ValueError, match="max_instances"):
        Shards(3, group="g", electors=memory, max_instances=0)
    with pytest.raises(TypeError, match="only when it builds"):
        Shards(3, group="g", electors=memory, ttl=3)
    with pytest.raises(ValueError, match="group"):
        Shards(3, environ={"AIOELECT_BACKEND": "local"})
    assert Shards(3, group="g", electors=memory).names == ("0", "1", "2")


async def test_memory_instances_share_names_and_rebalance_on_join_and_leave() -> None:
    """20 names, 3 instances: 6/7/7; a fourth joins: 5 each; one leaves: back to 6/7/7. Never two owners."""
    group, register = f"shards-{secrets.token_hex(3)}", Register()
    fleet = memory_fleet(20, group, register, max_instances=6, settle=0.02)
    try:
        for identity in ("a", "b", "c"):
            fleet.start(identity)
        await fleet.settle(20, timeout=10)
        assert sorted(fleet.loads().values()) == [6, 7, 7]
        first = dict(register.last)
        fleet.start("d")
        await fleet.settle(20, timeout=10)
        assert sorted(fleet.loads().values()) == [5, 5, 5, 5]
        moved = sum(register.starts[n] > 1 for n in register.starts)
        assert 5 <= moved <= 8  # the newcomer's share (tests/test_shards_moves.py counts every move exactly)
        await fleet.stop("b")
        await fleet.settle(20, timeout=10)
        assert sorted(fleet.loads().values()) == [6, 7, 7]
        assert all(register.last[n] >= first[n] for n in first)
    finally:
        await fleet.close()
    assert register.violations == []
    assert register.running == {}


async def test_memory_a_name_whose_leadership_is_lost_is_taken_again() -> None:
    """A deposed name: its work is cancelled, and the instance it is assigned to owns it again with a new token."""
    group = f"shards-{secrets.token_hex(3)}"
    register = Register()
    fleet = Fleet(
        lambda identity: Shards(
            ["x", "y", "z"], group=group, identity=identity, electors=lambda n: MemoryElector(name=n), max_instances=3
        ),
        register,
    )
    try:
        fleet.start("a")
        fleet.start("b")
        await fleet.settle(3, timeout=10)
        token = register.last["x"]
        MemoryElector(name=f"{group}/shard/x").depose("test")
        with anyio.fail_after(10):
            while register.last["x"] == token or "x" not in set().union(*(s.owned for s in fleet.instances.values())):
                await asyncio.sleep(0.02)
        assert register.last["x"] > token
    finally:
        await fleet.close()
    assert register.violations == []


async def test_an_instance_without_a_member_election_owns_nothing() -> None:
    group = f"shards-{secrets.token_hex(3)}"
    register = Register()
    fleet = Fleet(
        lambda identity: Shards(
            4, group=group, identity=identity, electors=lambda n: MemoryElector(name=n), max_instances=1
        ),
        register,
    )
    try:
        fleet.start("a")
        with anyio.fail_after(10):
            while len(fleet.instances["a"].owned) != 4:
                await asyncio.sleep(0.02)
        late = fleet.start("b")
        await asyncio.sleep(0.5)
        assert late.owned == frozenset() and late.assigned == frozenset() and late.members == ("a",)
        assert len(fleet.instances["a"].owned) == 4
    finally:
        await fleet.close()
    assert register.violations == []


async def test_work_that_raises_ends_run_after_letting_go() -> None:
    group = f"shards-{secrets.token_hex(3)}"
    shards = Shards(2, group=group, electors=lambda n: MemoryElector(name=n), max_instances=1)

    async def work(name: str) -> None:
        if name == "1":
            raise RuntimeError("boom")
        await anyio.sleep_forever()

    with pytest.raises(RuntimeError, match="boom"), anyio.fail_after(10):
        await shards.run(work)
    assert shards.owned == frozenset()
    assert await MemoryElector(name=f"{group}/shard/0").leader() is None


async def test_from_env_file_backend_gets_a_lock_file_per_election(tmp_path: Any) -> None:
    environ = {"AIOELECT_FILE": str(tmp_path / "lock"), "AIOELECT_NAME": "jobs"}
    shards = Shards(["a", "b"], environ=environ, max_instances=2)
    assert shards.group == "jobs"
    task = asyncio.get_running_loop().create_task(shards.run())
    try:
        with anyio.fail_after(10):
            while len(shards.owned) != 2:
                await asyncio.sleep(0.02)
        files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith((".leader", ".waiting")))
        assert {"lock.jobs%2Fmember%2F0", "lock.jobs%2Fshard%2Fa", "lock.jobs%2Fshard%2Fb"} <= set(files)
        assert "lock" not in files
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def retire(fleet: Fleet, sessions: Iterable[Any]) -> None:
    """Stop every instance of ``fleet``, then close the shared ``sessions`` they were on."""
    await fleet.close()
    for session in sessions:
        await session.aclose()


async def back_to(count: Callable[[], Any], baseline: int) -> None:
    """Wait until the server's connection count is ``baseline`` again: nothing was left open."""
    with anyio.fail_after(10):
        while await count() != baseline:
            await asyncio.sleep(0.05)


async def test_etcd_shared_sessions_spread_names_and_rebalance(etcd: Any) -> None:
    """20 names, 3 instances, each on one EtcdSession: balance, join, graceful leave, and a session's end (crash)."""
    group = f"/aioelect-test/shards-{secrets.token_hex(3)}"
    register = Register()
    sessions: dict[str, EtcdSession] = {}

    def make(identity: str) -> Shards:
        session = sessions[identity]
        return Shards(
            20,
            group=group,
            identity=identity,
            electors=lambda n: EtcdElector(session=session, name=n),
            max_instances=5,
        )

    fleet = Fleet(make, register)
    try:
        for identity in ("a", "b", "c", "d"):
            sessions[identity] = EtcdSession(etcd.endpoints, ttl=2)
            await sessions[identity].__aenter__()
        for identity in ("a", "b", "c"):
            fleet.start(identity)
        await fleet.settle(20, timeout=30)
        assert sorted(fleet.loads().values()) == [6, 7, 7]
        fleet.start("d")
        await fleet.settle(20, timeout=30)
        await fleet.stop("a")
        await fleet.settle(20, timeout=30)
        # A crash as the others see it: c's lease is revoked under it, so its names and member election go at once.
        crashed = sessions["c"]
        held = {n: register.last[n] for n in fleet.instances["c"].owned}
        assert held
        session = await crashed.current()
        await crashed.end(session, "test: crash")
        with anyio.fail_after(30):
            while any(register.last[n] == token for n, token in held.items()):
                await asyncio.sleep(0.02)
        await fleet.settle(20, timeout=30)
    finally:
        await retire(fleet, sessions.values())
    assert register.violations == []
    assert register.running == {}


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
async def test_sql_instances_spread_names_and_rebalance(kind: str, request: pytest.FixtureRequest) -> None:
    """6 names, 2 then 3 instances, on PostgreSQL and MariaDB (one elector per election: few names keep the
    connections low)."""
    dsn = request.getfixturevalue(f"{kind}_dsn")
    group = f"shards-{secrets.token_hex(3)}"
    register = Register()
    make: Callable[[str], Elector] = (
        (lambda n: aioelect.PostgresElector(dsn, name=n, poll_interval=0.2))
        if kind == "postgres"
        else (lambda n: aioelect.MySQLElector(dsn, name=n, poll_interval=0.2))
    )
    fleet = Fleet(
        lambda identity: Shards(6, group=group, identity=identity, electors=make, max_instances=3),
        register,
    )
    try:
        fleet.start("a")
        fleet.start("b")
        await fleet.settle(6, timeout=30)
        fleet.start("c")
        await fleet.settle(6, timeout=30)
        assert sorted(fleet.loads().values()) == [2, 2, 2]
        await fleet.stop("b")
        await fleet.settle(6, timeout=30)
    finally:
        await fleet.close()
    assert register.violations == []


async def stable(count: Callable[[], Any]) -> int:
    """``count()`` once it reads the same twice 0.2 s apart (connections an earlier test closed may still be going)."""
    last = await count()
    with anyio.fail_after(10):
        while True:
            await asyncio.sleep(0.2)
            now = await count()
            if now == last:
                return int(now)
            last = now


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
async def test_from_env_on_sql_opens_one_shared_session_per_instance(kind: str, request: pytest.FixtureRequest) -> None:
    """Shards built from the environment on MariaDB or PostgreSQL: 2 instances x 12 names on 2 server connections."""
    from .test_sql_sessions import mysql_sessions, postgres_sessions

    dsn = request.getfixturevalue(f"{kind}_dsn")
    server = request.getfixturevalue("mariadb" if kind == "mysql" else "postgres")
    connections = mysql_sessions(server) if kind == "mysql" else postgres_sessions(server)
    group = f"shards-{secrets.token_hex(3)}"
    environ = {
        "AIOELECT_MYSQL_DSN" if kind == "mysql" else "AIOELECT_POSTGRES_DSN": dsn,
        "AIOELECT_NAME": group,
        "AIOELECT_POLL_INTERVAL": "0.3",
        "AIOELECT_CHECK_INTERVAL": "0.5",
    }
    register = Register()
    fleet = Fleet(lambda identity: Shards(12, environ=environ, identity=identity, max_instances=3), register)
    baseline = await stable(connections)
    try:
        fleet.start("a")
        fleet.start("b")
        await fleet.settle(12, timeout=40)
        assert await connections() - baseline == 2
    finally:
        await fleet.close()
    assert register.violations == []
    await back_to(connections, baseline)


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
async def test_sql_shared_sessions_spread_30_names_on_one_connection_per_instance(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """3 instances x 30 names, each instance on one MySQLSession / PostgresSession (its member elections and their
    observers too): balanced at 10 each on exactly 3 server connections; a graceful leave; a crash of one session's
    connection (killed on the server): its names are owned again with larger tokens, never twice, on 2 connections."""
    from .test_sql_sessions import mysql_sessions, postgres_sessions

    dsn = request.getfixturevalue(f"{kind}_dsn")
    server = request.getfixturevalue("mariadb" if kind == "mysql" else "postgres")
    connections = mysql_sessions(server) if kind == "mysql" else postgres_sessions(server)
    timing: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.5, "lease": 6, "poll_interval": 0.3}
    group = f"shards-{secrets.token_hex(3)}"
    register = Register()
    sessions: dict[str, aioelect.MySQLSession | aioelect.PostgresSession] = {}

    def make(identity: str) -> Shards:
        session = sessions[identity]
        electors: Callable[[str], Elector] = (
            (lambda n: aioelect.MySQLElector(session=session, name=n))
            if isinstance(session, aioelect.MySQLSession)
            else (lambda n: aioelect.PostgresElector(session=session, name=n))
        )
        # No identity given: Shards takes its session's, which PostgreSQL reports for every election on it.
        return Shards(30, group=group, electors=electors, max_instances=4)

    fleet = Fleet(make, register)
    baseline = await stable(connections)
    try:
        ids = [f"{group}-{x}" for x in "abc"]
        for identity in ids:
            cls = aioelect.MySQLSession if kind == "mysql" else aioelect.PostgresSession
            sessions[identity] = await cls(dsn, identity=identity, **timing).__aenter__()
        for identity in ids:
            fleet.start(identity)
        await fleet.settle(30, timeout=40)  # members as the server reports them are the sessions' identities
        assert [fleet.instances[i].identity for i in ids] == ids
        assert sorted(fleet.loads().values()) == [10, 10, 10]
        assert await connections() - baseline == 3
        leaving = f"{group}-a"
        await fleet.stop(leaving)
        await sessions.pop(leaving).aclose()
        await fleet.settle(30, timeout=40)
        assert await connections() - baseline == 2
        crashed = f"{group}-b"
        held = {n: register.last[n] for n in fleet.instances[crashed].owned}
        conn = sessions[crashed]._conn
        assert held and conn is not None
        if kind == "mysql":
            server.query("KILL %s", (conn.session_id,), database="")
        else:
            server.query("SELECT pg_terminate_backend($1)", (conn.session_id,))
        with anyio.fail_after(40):
            while any(register.last[n] == token for n, token in held.items()):
                await asyncio.sleep(0.05)
        await fleet.settle(30, timeout=40)
        assert sorted(fleet.loads().values()) == [15, 15]
        assert all(register.last[n] > token for n, token in held.items())
        assert await connections() - baseline == 2
    finally:
        await retire(fleet, sessions.values())
    assert register.violations == []
    assert register.running == {}
    await back_to(connections, baseline)


async def test_a_shards_identity_other_than_its_postgres_session_s_is_refused(postgres_dsn: str) -> None:
    """Without schema=, PostgreSQL reports the session's identity for every election on it: another is a ValueError."""
    async with aioelect.PostgresSession(postgres_dsn, identity="session-id") as session:
        shards = Shards(
            2,
            group=f"shards-{secrets.token_hex(3)}",
            identity="other",
            electors=lambda n: aioelect.PostgresElector(session=session, name=n),
            max_instances=2,
        )
        with pytest.raises(ValueError, match="session-id"), anyio.fail_after(10):
            await shards.run()
        assert len(session) == 0  # every elector it made is closed


async def test_apscheduler_jobs_spread_over_instances_and_run_only_on_their_owner() -> None:
    """6 jobs every 0.1 s on 2 then 3 instances: each run under its job's own leadership, never two at once."""
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from aioelect.integrations.apscheduler import ShardedScheduler

    group = f"shards-{secrets.token_hex(3)}"
    jobs = [f"job-{i}" for i in range(6)]
    runs: list[tuple[str, str, int, float, float]] = []  # job, instance, token, start, end

    def instance(identity: str) -> ShardedScheduler:
        async def run(job: str) -> None:
            lead = current_leadership()
            lead.check()
            assert lead.token is not None
            start = time.monotonic()
            try:
                await asyncio.sleep(0.05)
            finally:
                runs.append((job, identity, lead.token, start, time.monotonic()))

        scheduler = AsyncIOScheduler()
        for job in jobs:
            scheduler.add_job(run, "interval", seconds=0.1, args=[job], id=job)
        shards = Shards(
            [j.id for j in scheduler.get_jobs()],
            group=group,
            identity=identity,
            electors=lambda n: MemoryElector(name=n, renew_deadline=5),
            max_instances=4,
            settle=0.02,
        )
        return ShardedScheduler(scheduler, shards)

    async def every_job_ran_on(instances: list[ShardedScheduler], since: float) -> None:
        with anyio.fail_after(15):
            while True:
                owners = {j: s.shards.identity for s in instances for j in s.owned}
                counts = Counter(job for job, who, _, start, _ in runs if start > since and owners.get(job) == who)
                if len(owners) == len(jobs) and all(counts[j] >= 2 for j in jobs):
                    return
                await asyncio.sleep(0.05)

    a, b = instance("a"), instance("b")
    async with a, b:
        await every_job_ran_on([a, b], 0)
        assert sorted(len(s.owned) for s in (a, b)) == [3, 3]
        async with instance("c") as c:
            joined = time.monotonic()
            await every_job_ran_on([a, b, c], joined)
            assert sorted(len(s.owned) for s in (a, b, c)) == [2, 2, 2]
            with pytest.raises(ValueError, match="not started"):
                ShardedScheduler(c.scheduler, c.shards)
    by_job: dict[str, list[tuple[str, str, int, float, float]]] = {}
    for run in runs:
        by_job.setdefault(run[0], []).append(run)
    for job, its in by_job.items():
        its.sort(key=lambda r: r[3])
        for one, nxt in itertools.pairwise(its):
            if one[1] != nxt[1]:
                assert one[4] <= nxt[3], f"{job}: {one} overlaps {nxt}"
                assert nxt[2] > one[2], f"{job}: token {nxt[2]} after {one[2]}"


async def test_apscheduler_refuses_jobs_outside_the_shards() -> None:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from aioelect.integrations.apscheduler import ShardedScheduler

    scheduler = AsyncIOScheduler()
    scheduler.add_job(asyncio.sleep, "interval", seconds=1, args=[0], id="other")
    sharded = ShardedScheduler(scheduler, Shards(["mine"], group="g", electors=lambda n: MemoryElector(name=n)))
    with pytest.raises(ValueError, match="other"):
        await sharded.start()
    assert not scheduler.running


async def test_etcd_a_crashed_instance_s_names_move_after_its_leases_expire(etcd: Any, tmp_path: Any) -> None:
    """Two instances in this process and one SIGKILLed process (built by from_env()): the survivors take the dead
    one's names once its leases expire, each with a larger token, and settle at 10 each."""
    group = f"/aioelect-test/shards-{secrets.token_hex(3)}"
    register = Register()
    sessions = {i: EtcdSession(etcd.endpoints, ttl=2) for i in ("a", "b")}
    fleet = Fleet(
        lambda identity: Shards(
            20,
            group=group,
            identity=identity,
            electors=lambda n: EtcdElector(session=sessions[identity], name=n),
            max_instances=5,
        ),
        register,
    )
    log_path = tmp_path / "member.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AIOELECT_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
        "AIOELECT_NAME": group,
    }
    child = popen([sys.executable, str(MEMBER), "20"], log_path=str(log_path), env=env)
    try:
        for s in sessions.values():
            await s.__aenter__()
        fleet.start("a")
        fleet.start("b")

        def child_owns() -> dict[str, int]:
            lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
            return {x["name"]: x["token"] for x in lines}

        with anyio.fail_after(30):
            while not (
                len(fleet.instances["a"].members) == 3
                and all(len(s.owned) in (6, 7) for s in fleet.instances.values())
                and len(set(child_owns()) - set().union(*(s.owned for s in fleet.instances.values()))) in (6, 7)
            ):
                await asyncio.sleep(0.05)
        theirs = {n: t for n, t in child_owns().items() if not any(n in s.owned for s in fleet.instances.values())}
        child.kill()
        killed = time.monotonic()
        took = await fleet.settle(20, timeout=30)
        assert took < 2 + 10, f"balanced {took:.1f}s after the crash (lease ttl 2s)"
        for name, token in theirs.items():
            assert register.last[name] > token and register.started_at[name] > killed
    finally:
        child.kill()
        child.wait(10)
        await fleet.close()
        for s in sessions.values():
            await s.aclose()
    assert register.violations == []


async def test_a_share_is_taken_step_by_step_and_completely() -> None:
    """step=2: the first rebalance campaigns for 2 names, the next ones go on without any further change."""
    shards = Shards(
        10,
        group=f"shards-{secrets.token_hex(3)}",
        electors=lambda n: MemoryElector(name=n),
        max_instances=1,
        settle=0.2,
        step=2,
    )
    task = asyncio.get_running_loop().create_task(shards.run())
    try:
        with anyio.fail_after(10):
            while not shards.owned:
                await asyncio.sleep(0.005)
            assert len(shards.owned) <= 2
            while len(shards.owned) < 10:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(ValueError, match="step"):
        Shards(3, group="g", electors=lambda n: MemoryElector(name=n), step=0)


async def test_etcd_names_that_nest_are_separate_elections(etcd: Any) -> None:
    """Names "a/b" and "a": two elections on etcd, neither inside the other's prefix."""
    group = f"/aioelect-test/shards-{secrets.token_hex(3)}"
    async with EtcdSession(etcd.endpoints, ttl=2) as session:
        shards = Shards(
            ["a/b", "a%2Fb", "a"],
            group=group,
            electors=lambda n: EtcdElector(session=session, name=n),
            max_instances=1,
            step=2,
        )
        elections = [shards.shard_election(n) for n in shards.names]
        assert not any(one.startswith(other + "/") for one in elections for other in elections)
        task = asyncio.get_running_loop().create_task(shards.run())
        try:
            with anyio.fail_after(20):
                while len(shards.owned) < 3:
                    if task.done():
                        await task
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)
            assert not task.done() and len(shards.owned) == 3
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("seed", [1, 2])
async def test_memory_random_churn_never_owns_a_name_twice_and_settles(seed: int) -> None:
    """Joins, leaves and deposed names at random (a fixed seed), a few milliseconds apart: the register never sees
    two held leaderships of a name or a token going back, and the fleet settles balanced at the end. A deposed
    name is given on by the server at once, while its old owner's work is being cancelled: only those overlap."""
    import random

    rng = random.Random(seed)
    group, register = f"shards-{secrets.token_hex(3)}", Register()
    fleet = memory_fleet(12, group, register, max_instances=5, settle=0.01, step=3)
    born = 0
    deposed: set[str] = set()
    try:
        for _ in range(40):
            op = rng.random()
            if (op < 0.35 and len(fleet.instances) < 5) or not fleet.instances:
                fleet.start(f"i{born}")
                born += 1
            elif op < 0.6 and len(fleet.instances) > 1:
                await fleet.stop(rng.choice(sorted(fleet.instances)))
            else:
                name = str(rng.randrange(12))
                with contextlib.suppress(LookupError):  # nobody leads it this instant
                    MemoryElector(name=f"{group}/shard/{name}").depose("churn")
                    deposed.add(name)
            await asyncio.sleep(rng.uniform(0, 0.05))
        await fleet.settle(12, timeout=20)
    finally:
        await fleet.close()
    assert register.violations == []
    assert {overtaken.split(":")[0] for overtaken in register.overtaken} <= deposed
    assert register.running == {}


@pytest.mark.parametrize("raised", ["unavailable", "lost"])
async def test_work_that_raises_a_backend_or_leadership_error_of_its_own_ends_run(raised: str) -> None:
    # The run's guarantee: an exception from work ends run() with it. _own catches BackendUnavailable (meant for
    # the lock request) and LeadershipLost (meant for this name's loss) around the work as well: a work whose own
    # call to a server failed, or that checked another leadership, had its name let go and asked for again, its
    # exception logged at INFO as "asking for it failed", and run() went on.
    group = f"shards-{secrets.token_hex(3)}"
    shards = Shards(["a"], group=group, electors=lambda n: MemoryElector(name=n), max_instances=1, settle=0.01)
    starts = 0

    async def work(name: str) -> None:
        nonlocal starts
        starts += 1
        assert current_leadership().held
        if raised == "unavailable":
            raise aioelect.BackendUnavailable("the work's own database is down")
        raise aioelect.LeadershipLost("another leadership the work checked", aioelect.LossKind.SELF_FENCED)

    expected = aioelect.BackendUnavailable if raised == "unavailable" else aioelect.LeadershipLost
    with pytest.raises(expected), anyio.fail_after(5):
        await shards.run(work)
    assert starts == 1
