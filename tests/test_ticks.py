"""Ticks that run at most once (aioelect.integrations.schedule), on real servers: leadership moves, no tick twice.

Three candidates of one election run the same ticks; the leadership is moved
by a release and by a deposition from outside (KILL, lease revoked, key or
lock file deleted). The checker counts duplicate ticks (none) and lost ticks
(none with ``run_once``). Killed processes and frozen ones are the soak's
(``soak/ticks.py``), whose short slice runs here too.
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import Elector, LeadershipLost, UsageError
from aioelect.integrations.jobs import LeaderOnly
from aioelect.integrations.schedule import Every, Tick, Ticks

from .backends import CASES, BackendCase, unique_name
from .test_fence_sql import Db, connected
from .test_fenced_state import FENCED

PERIOD = 0.25


@pytest.fixture(params=sorted(FENCED))
def case(request: pytest.FixtureRequest) -> BackendCase:
    return CASES[request.param](request)


def make(case: BackendCase, name: str, identity: str) -> Elector:
    return case.make(name, identity=identity, **FENCED[case.kind])


def check_runs(runs: list[tuple[str, Tick]]) -> tuple[int, int]:
    """Duplicate and lost ticks among ``runs`` (each run stands for the ticks first..number)."""
    seen: dict[int, int] = {}
    for _, tick in runs:
        for number in range(tick.first, tick.number + 1):
            seen[number] = seen.get(number, 0) + 1
    duplicates = sum(count - 1 for count in seen.values())
    lost = sum(1 for n in range(min(seen), max(seen) + 1) if n not in seen)
    return duplicates, lost


class Candidate:
    """Campaigns for ``elector`` and runs ``ticks`` while it leads; ``resign()`` makes it release once."""

    def __init__(self, elector: Elector, ticks: Ticks, runs: list[tuple[str, Tick]]) -> None:
        self.elector, self.ticks, self.runs = elector, ticks, runs
        self.lead: aioelect.Leadership | None = None
        self._scope: anyio.CancelScope | None = None

    async def job(self, tick: Tick) -> None:
        self.runs.append((self.elector.identity, tick))

    async def resign(self) -> None:
        assert self._scope is not None
        self._scope.cancel()

    async def campaign(self) -> None:
        while True:
            try:
                async with aioelect.leadership(self.elector) as lead:
                    self.lead = lead
                    with anyio.CancelScope() as self._scope:
                        await self.ticks.run(lead, self.job)
            except LeadershipLost:
                pass
            self.lead = None
            await anyio.sleep(3)  # let another candidate take over (a poller may need a poll interval or two)


async def leader_of(candidates: list[Candidate], other_than: Candidate | None = None) -> Candidate:
    with anyio.fail_after(30):
        while True:
            for candidate in candidates:
                if candidate is not other_than and candidate.lead is not None and candidate.lead.held:
                    return candidate
            await anyio.sleep(0.02)


async def test_ticks_move_with_the_leadership_never_twice_none_lost(case: BackendCase) -> None:
    name = unique_name()
    runs: list[tuple[str, Tick]] = []
    ticks = Ticks("job", Every(PERIOD))
    electors = [make(case, name, identity) for identity in ("a", "b", "c")]
    async with electors[0], electors[1], electors[2]:
        async with anyio.create_task_group() as tg:
            candidates = [Candidate(elector, ticks, runs) for elector in electors]
            for candidate in candidates:
                tg.start_soon(candidate.campaign)
            leader = await leader_of(candidates)
            successors = []
            for how in ("release", "depose", "release", "depose"):
                await anyio.sleep(4 * PERIOD)
                if how == "release":
                    await leader.resign()
                else:
                    assert case.depose is not None
                    await case.depose(leader.elector)
                leader = await leader_of(candidates, other_than=leader)
                successors.append(leader.elector.identity)
            await anyio.sleep(4 * PERIOD)
            tg.cancel_scope.cancel()
        # The record holds the newest tick run.
        assert await ticks.last(electors[0]) == max(tick.number for _, tick in runs)
    duplicates, lost = check_runs(runs)
    assert (duplicates, lost) == (0, 0), runs
    assert set(successors) <= {who for who, _ in runs}, "every successor ran ticks"
    tokens = [tick.token for _, tick in runs]
    assert tokens == sorted(tokens), "a run under an older token came after one under a newer"


async def test_a_deposed_leader_cannot_record_a_tick(case: BackendCase) -> None:
    """The record is the fence: once the successor has recorded a tick, the old leader's record is refused."""
    name = unique_name()
    ticks = Ticks("job", Every(PERIOD))
    ran: list[Tick] = []

    async def job(tick: Tick) -> None:
        ran.append(tick)

    async with make(case, name, "a") as a, make(case, name, "b") as b:
        lead_a = await a.acquire()
        assert len(await ticks.run_due(lead_a, job)) == 1
        await lead_a.release()
        lead_b = await b.acquire()
        await anyio.sleep(PERIOD)
        assert len(await ticks.run_due(lead_b, job)) == 1
        record = await ticks.store(a).get(ticks.key)
        late = {"tick": record["tick"] + 1, "token": lead_a.token}
        # A's record sent as if A still believed it led: refused by the server, nothing recorded.
        store_a = ticks.store(a)._store
        from aioelect.core._values import encode

        written = await store_a.write(lead_a._hold, ticks.key, encode(late), compare=True, expected=encode(record))
        assert written.value == "fenced"
        await anyio.sleep(PERIOD)  # a tick falls due: A would record it, if it could
        with pytest.raises(LeadershipLost):
            await ticks.run_due(lead_a, job)
        assert await ticks.store(b).get(ticks.key) == record
        assert [t.token for t in ran] == [lead_a.token, lead_b.token]
        await lead_b.release()


def at_tick(schedule: Every, number: int, late: float = 0.05) -> Every:
    """``schedule`` shifted so that tick ``number`` fell due ``late`` seconds ago."""
    return Every(schedule.seconds, origin=time.time() - late - number * schedule.seconds)


@pytest.mark.parametrize(
    ("misfire", "grace", "expected"),
    [
        ("run_once", None, [(1, 5)]),
        ("run_each", None, [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]),
        ("skip", 15.0, [(4, 4), (5, 5)]),  # ticks 1..3 are 20 s late or more: recorded, not run
    ],
)
async def test_missed_ticks_follow_the_misfire_policy(misfire: Any, grace: float | None, expected: list[Any]) -> None:
    from aioelect.testing import MemoryElector

    schedule = at_tick(Every(10), 5)
    ticks = Ticks("job", schedule, misfire=misfire, grace=grace)
    ran: list[Tick] = []

    async def job(tick: Tick) -> None:
        ran.append(tick)

    async with MemoryElector(name=unique_name()) as elector:
        lead = await elector.acquire()
        await ticks.store(elector).put(lead, ticks.key, {"tick": 0, "token": lead.token})
        assert await ticks.run_due(lead, job) == ran
        assert [(t.first, t.number) for t in ran] == expected
        assert await ticks.last(elector) == 5
        assert await ticks.run_due(lead, job) == []  # nothing due until tick 6
        await lead.release()


def test_bad_ticks_are_refused() -> None:
    with pytest.raises(ValueError, match="finite number > 0"):
        Every(0)
    with pytest.raises(ValueError, match="misfire must be one of"):
        Ticks("j", Every(1), misfire="twice")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a finite grace"):
        Ticks("j", Every(1), misfire="skip")
    with pytest.raises(ValueError, match="applies to"):
        Ticks("j", Every(1), grace=3)
    with pytest.raises(ValueError):
        Ticks("no spaces allowed", Every(1))


async def test_ticks_refuse_a_backend_without_fenced_state() -> None:
    async with aioelect.new(local=True, name=unique_name()) as elector:
        lead = await elector.acquire()
        with pytest.raises(UsageError):
            await Ticks("j", Every(1)).run_due(lead, lambda tick: anyio.sleep(0.01))
        await lead.release()


async def test_leader_only_ticks_run_on_the_leader_and_are_caught_up_by_the_successor() -> None:
    from aioelect.testing import MemoryElector

    name = unique_name()
    ran: list[tuple[str, Tick]] = []
    ticks = Ticks("digest", Every(PERIOD))

    def instance(identity: str) -> tuple[LeaderOnly, Any]:
        leader_only = LeaderOnly(MemoryElector(name=name, identity=identity), restart_delay=0.2)

        @leader_only.ticks(ticks)
        async def digest(tick: Tick) -> None:
            ran.append((identity, tick))

        return leader_only, digest

    (one, digest_one), (two, digest_two) = instance("one"), instance("two")
    async with one, two:
        with anyio.fail_after(10):
            while one.leadership is None and two.leadership is None:
                await anyio.sleep(0.02)
        first, follower = (one, two) if one.leadership is not None else (two, one)
        calls = {one: digest_one, two: digest_two}
        assert await calls[follower]() is None
        assert len(await calls[first]() or []) == 1
        lead = first.leadership
        assert lead is not None and isinstance(lead._elector, MemoryElector)
        lead._elector.depose()
        await anyio.sleep(3 * PERIOD)  # ticks fall due while the leadership moves
        with anyio.fail_after(10):
            while follower.leadership is None:
                await anyio.sleep(0.02)
        caught_up = await calls[follower]()
        assert caught_up is not None and len(caught_up) == 1 and caught_up[0].first < caught_up[0].number
    assert check_runs(ran) == (0, 0), ran


@pytest.mark.parametrize("kind", ["memory", "file", "redis", "postgres"])
async def test_apscheduler_fenced_runs_never_repeat_a_run_time_across_a_handover(
    kind: str, request: pytest.FixtureRequest
) -> None:
    from datetime import datetime, timezone

    from apscheduler.events import EVENT_JOB_EXECUTED
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from aioelect.integrations.apscheduler import LeaderScheduler

    case = CASES[kind](request)
    name = unique_name()
    start = datetime.now(timezone.utc)
    executed: list[tuple[str, datetime]] = []

    async def job() -> None:
        aioelect.current_leadership().check()

    def instance(identity: str) -> LeaderScheduler:
        scheduler = AsyncIOScheduler()
        scheduler.add_job(
            job, "interval", seconds=PERIOD, start_date=start, id="job", coalesce=True, misfire_grace_time=60
        )
        scheduler.add_listener(lambda event: executed.append((identity, event.scheduled_run_time)), EVENT_JOB_EXECUTED)
        return LeaderScheduler(scheduler, make(case, name, identity), restart_delay=3, fenced=True)

    one, two = instance("one"), instance("two")

    async def newer_than(token: int) -> int:
        with anyio.fail_after(20):
            while True:
                for scheduler in (one, two):
                    lead = scheduler.leadership
                    if lead is not None and lead.token is not None and lead.token > token:
                        return lead.token
                await anyio.sleep(0.02)

    async with one, two:
        token = await newer_than(0)
        for _ in range(3):
            await anyio.sleep(4 * PERIOD)
            leader = one if one.leadership is not None else two
            assert case.depose is not None
            await case.depose(leader.elector)
            token = await newer_than(token)
        await anyio.sleep(4 * PERIOD)
    times = [at for _, at in executed]
    assert times and len(times) == len(set(times)), sorted(executed, key=lambda run: run[1])


def test_apscheduler_fenced_refuses_a_backend_without_fenced_state() -> None:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from aioelect.integrations.apscheduler import LeaderScheduler

    with pytest.raises(UsageError):
        LeaderScheduler(AsyncIOScheduler(), aioelect.new(local=True, name=unique_name()), fenced=True)


@pytest.mark.parametrize(("backend", "kinds"), [("redis", ["freeze", "kill"]), ("file", ["kill", "release"])])
def test_soak_slice_a_frozen_leaders_late_write_is_refused_and_no_tick_runs_twice(
    backend: str, kinds: list[str], tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """The CI slice of ``python -m soak.ticks``: leaders in processes frozen after their check (Redis), killed,
    released; no tick twice, none lost, every late write refused."""
    from soak.ticks import OPTIONS, Soak

    if backend == "redis":
        target = os.environ.get("AIOELECT_REDIS_URL") or request.getfixturevalue("redis_server").url
    else:
        target = str(tmp_path / "leader.lock")
    soak = Soak(backend, target, tmp_path, random.randrange(1 << 30), OPTIONS[backend])
    soak.kinds = kinds
    figures = soak.run(14)
    assert figures.ok, figures
    assert figures.duplicates == 0 and figures.lost == 0 and sum(figures.faults.values()) >= 2
    froze = any(event["e"] == "freeze" for event in soak.read())  # a leader froze after its check passed
    assert not froze or figures.late_writes > 0, figures
    assert figures.late_refused == figures.late_writes and figures.late_accepted == 0


def test_soak_checker_tells_ticks_a_dying_leader_recorded_from_lost_ones() -> None:
    """A tick recorded by a leader killed or stopped before its job began is dropped (at most once, as documented);
    a tick no record stands for is lost."""
    from soak.ticks import check

    def run(who: str, first: int, tick: int, token: int) -> dict[str, Any]:
        return {"e": "run", "who": who, "first": first, "tick": tick, "token": token}

    recorded = {"e": "record", "who": "a", "first": 2, "tick": 2, "token": 1}
    killed = {"e": "fault", "kind": "kill", "who": "a"}
    dropped = check([run("a", 1, 1, 1), recorded, killed, run("b", 3, 3, 2)])
    assert (dropped.lost, dropped.dropped, dropped.duplicates) == (0, 1, 0)
    assert dropped.ok
    lost = check([run("a", 1, 1, 1), killed, run("b", 3, 3, 2)])
    assert (lost.lost, lost.dropped) == (1, 0) and not lost.ok
    # A worker that ran its record, then was killed, dropped nothing: a later gap is lost.
    ran = check([recorded, run("a", 2, 2, 1), killed, run("b", 4, 4, 2)])
    assert (ran.lost, ran.dropped) == (1, 0)


@pytest.fixture(params=["postgres", "mysql"])
async def sql(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Db, str]]:
    """A user database with a fence table, a data table and a ticks table (the election is elsewhere: in memory)."""
    from aioelect.integrations.schedule import TICKS_DDL_MYSQL, TICKS_DDL_POSTGRES

    found = Db(request.param, request.getfixturevalue("postgres_dsn" if request.param == "postgres" else "mysql_dsn"))
    table = f"ticks_{secrets.token_hex(4)}"
    admin = await found.connect()
    try:
        await found.setup(admin)
        ddl = TICKS_DDL_POSTGRES if request.param == "postgres" else TICKS_DDL_MYSQL
        await found.run(admin, ddl.format(table=table))
        yield found, table
        for name in (found.fence, found.data, table):
            await found.run(admin, f"DROP TABLE {name}")
    finally:
        await found.close(admin)


async def test_a_tick_and_the_jobs_writes_commit_together_or_not_at_all(sql: tuple[Db, str]) -> None:
    """run_due_in: the record and the job's writes are one fenced transaction; a job that fails leaves the tick
    unrecorded, and the next run (here the successor's) runs it once."""
    from aioelect.testing import MemoryElector

    db, table = sql
    ticks = Ticks("job", Every(30, origin=time.time() - 0.01))  # tick 0 is due; tick 1 only in 30 s
    name = unique_name()

    async def crashes(tick: Tick) -> None:
        await db.insert(conn, f"crashed-{tick.number}")
        raise RuntimeError("the job failed half-way")

    async def job(tick: Tick) -> None:
        await db.insert(conn, f"ran-{tick.number}-{tick.token}")

    async with MemoryElector(name=name) as a, MemoryElector(name=name) as b, connected(db) as conn:
        lead_a = await a.acquire()
        with pytest.raises(RuntimeError, match="half-way"):
            await ticks.run_due_in(conn, lead_a, crashes, table=table, fence_table=db.fence)
        assert await db.who(conn) == []  # the job's write rolled back, and the record with it
        await lead_a.release()
        lead_b = await b.acquire()
        ran = await ticks.run_due_in(conn, lead_b, job, table=table, fence_table=db.fence)
        assert [(t.number, t.token) for t in ran] == [(0, lead_b.token)]
        assert await ticks.run_due_in(conn, lead_b, job, table=table, fence_table=db.fence) == []  # recorded: once
        assert await db.who(conn) == [f"ran-0-{lead_b.token}"]
        with pytest.raises(LeadershipLost):  # the deposed leader runs nothing
            await ticks.run_due_in(conn, lead_a, job, table=table, fence_table=db.fence)
        assert await db.who(conn) == [f"ran-0-{lead_b.token}"]
        await lead_b.release()
