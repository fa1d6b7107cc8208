"""The Elector contract, run against every backend (see tests/backends.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time

import anyio
import pytest

import aioelect
from aioelect import ElectionError, Elector, Leadership, LeadershipLost, leadership
from soak.checker import Term

from .backends import CAPABILITIES, CASES, BackendCase, Follower, unique_name
from .faults import judge_terms


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Run the test only on backends that have every one of ``capabilities``."""
    return pytest.mark.requires(*capabilities)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Backends a test does not apply to are not generated at all, so that a
    # skip in this suite always means something is missing.
    if "case" not in metafunc.fixturenames:
        return
    needed: set[str] = set()
    for mark in metafunc.definition.iter_markers("requires"):
        needed.update(mark.args)
    kinds = [k for k in sorted(CASES) if needed <= CAPABILITIES[k]]
    metafunc.parametrize("case", kinds, indirect=True)


@pytest.fixture
def case(request: pytest.FixtureRequest) -> BackendCase:
    return CASES[request.param](request)


async def wait_until(predicate: object, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_acquire_release_reacquire(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name, identity="cand-a") as elector:
        for _ in range(3):
            lead = await elector.acquire()
            assert lead.held and not lead.lost
            assert await elector.leader() == "cand-a"
            await lead.release()
            await lead.release()
            assert not lead.held and not lead.lost


async def test_acquire_while_busy_raises(case: BackendCase) -> None:
    async with case.make(unique_name()) as elector:
        lead = await elector.acquire()
        with pytest.raises(ElectionError):
            await elector.acquire()
        await lead.release()


@requires("exclusive")
async def test_follower_sees_leader_and_takes_over_after_release(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name, identity="first") as a, case.make(name, identity="second") as b:
        lead_a = await a.acquire()
        assert await b.leader() == "first"
        got: list[tuple[Leadership, float]] = []
        done = asyncio.Event()

        async def follow() -> None:
            lead = await b.acquire()
            got.append((lead, time.monotonic()))
            done.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        assert not got, "the follower must wait while the leader holds"
        released = time.monotonic()
        await lead_a.release()
        with anyio.fail_after(10):
            await done.wait()
        lead_b, at = got[0]
        assert at - released < case.takeover_bound
        assert lead_b.held
        assert await a.leader() == "second"
        if lead_a.token is not None and lead_b.token is not None:
            assert lead_b.token > lead_a.token
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: not lead_b.held)


@requires("exclusive")
async def test_takeover_after_leader_task_cancelled(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name) as a, case.make(name) as b:
        acquired = asyncio.Event()

        async def lead_forever() -> None:
            await a.acquire()
            acquired.set()
            await asyncio.sleep(3600)

        leader_task = asyncio.create_task(lead_forever())
        await acquired.wait()
        follower = asyncio.create_task(b.acquire())
        await asyncio.sleep(0.2)
        assert not follower.done()
        leader_task.cancel()
        with anyio.fail_after(10):
            lead_b = await follower
        # follower's task has finished, so its leadership is released in turn.
        await wait_until(lambda: not lead_b.held)


@requires("exclusive")
async def test_cancelled_campaign_leaves_nothing(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name) as a:
        lead = await a.acquire()
        before = await case.leftovers() if case.leftovers else None
        for _ in range(3):
            async with case.make(name) as b:
                task = asyncio.create_task(b.acquire())
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The cancelled elector is reusable and idle.
                assert not b.leading
        if case.leftovers is not None:
            assert before is not None
            await wait_until_async(case.leftovers, before)
        # Nobody else sneaked in as leader.
        assert lead.held
        await lead.release()


async def wait_until_async(count: object, expected: int, timeout: float = 5.0) -> None:
    last = None
    with anyio.move_on_after(timeout):
        while (last := await count()) != expected:  # type: ignore[operator]
            await asyncio.sleep(0.05)
    assert last == expected, f"{last} server-side resources remain, expected {expected}"


@requires("leftovers")
async def test_nothing_left_after_close(case: BackendCase) -> None:
    if case.leftovers is None:
        pytest.skip("an external server (AIOELECT_*_DSN) cannot be inspected")
    name = unique_name()
    baseline = await case.leftovers()
    for _ in range(3):
        async with case.make(name) as elector:
            lead = await elector.acquire()
            await elector.leader()
            await lead.release()
            await elector.acquire()
    await wait_until_async(case.leftovers, baseline)


@requires("exclusive")
async def test_mutual_exclusion_among_many(case: BackendCase) -> None:
    name = unique_name()
    electors = [case.make(name, identity=f"cand-{i}") for i in range(10)]
    intervals: list[Term] = []
    rounds = 30

    async def candidate(elector: Elector) -> None:
        while len(intervals) < rounds:
            async with leadership(elector) as lead:
                start = time.monotonic_ns()
                await asyncio.sleep(0.005)
                assert lead.held
                intervals.append(Term(elector.identity, lead.token, start, time.monotonic_ns(), 0))

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for elector in electors:
                    tg.start_soon(candidate, elector)
    finally:
        for elector in electors:
            await elector.aclose()
    judge_terms(intervals)
    assert len({t.who for t in intervals}) > 1, "leadership never changed hands"


@requires("exclusive", "empty_store")
async def test_candidates_starting_together_on_an_empty_store(case: BackendCase) -> None:
    # Whatever the backend sets up on first use (a fencing table, a counter file), candidates
    # that all start at once must set it up together: none may fail, none may lead twice.
    assert case.empty_store is not None
    for _ in range(3):
        async with case.empty_store() as make:
            name = unique_name()
            electors = [make(name, identity=f"cand-{i}") for i in range(8)]
            tokens: list[int] = []
            try:
                with anyio.fail_after(30):
                    while electors:
                        # Everyone left campaigns at once; the winner's campaign ends, which releases it.
                        won: list[Leadership] = []
                        async with anyio.create_task_group() as tg:

                            async def campaign(elector: Elector, won: list[Leadership] = won) -> None:
                                won.append(await elector.acquire())
                                tg.cancel_scope.cancel()

                            for elector in electors:
                                tg.start_soon(campaign, elector)
                        assert len(won) == 1, won
                        assert won[0].token is not None
                        tokens.append(won[0].token)
                        winner = next(e for e in electors if e.identity == won[0].identity)
                        electors.remove(winner)
                        await winner.aclose()
            finally:
                for elector in electors:
                    await elector.aclose()
            assert len(tokens) == 8 and tokens == sorted(set(tokens)), f"tokens must grow: {tokens}"


@requires("depose")
async def test_leadership_scope_cancelled_and_raises_on_loss(case: BackendCase) -> None:
    if case.depose is None:
        pytest.skip("an external server (AIOELECT_*_DSN) cannot be faulted")
    name = unique_name()
    async with case.make(name) as elector:
        reached_end = False
        with pytest.raises(LeadershipLost) as info:
            async with leadership(elector) as lead:
                await case.depose(elector)
                deposed = time.monotonic()
                await asyncio.sleep(30)
                reached_end = True
        assert not reached_end
        assert time.monotonic() - deposed < 5
        assert lead.lost and not lead.held and info.value.reason
        # The elector may campaign again.
        again = await elector.acquire()
        assert again.held
        await again.release()


@requires("depose")
async def test_wait_lost_returns_on_loss_not_on_release(case: BackendCase) -> None:
    if case.depose is None:
        pytest.skip("an external server (AIOELECT_*_DSN) cannot be faulted")
    async with case.make(unique_name()) as elector:
        lead = await elector.acquire()
        with anyio.move_on_after(0.3) as scope:
            await lead.wait_lost()
        assert scope.cancelled_caught
        await case.depose(elector)
        with anyio.fail_after(5):
            await lead.wait_lost()
        assert lead.lost and lead.lost_reason


@requires("depose")
async def test_run_campaigns_again_after_loss(case: BackendCase) -> None:
    if case.depose is None:
        pytest.skip("an external server (AIOELECT_*_DSN) cannot be faulted")
    async with case.make(unique_name()) as elector:
        starts = 0

        async def work() -> str:
            nonlocal starts
            starts += 1
            if starts == 1:
                await case.depose(elector)
                await asyncio.sleep(30)
            return "finished"

        with anyio.fail_after(20):
            assert await elector.run(work) == "finished"
        assert starts == 2
        assert not elector.leading


@requires("exclusive")
async def test_aclose_while_campaigning_stops_the_campaign(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name) as a:
        lead = await a.acquire()
        b = case.make(name)
        task = asyncio.create_task(b.acquire())
        await asyncio.sleep(0.2)
        await b.aclose()
        with anyio.fail_after(5), pytest.raises(ElectionError, match="closed"):
            await task
        assert lead.held
        await lead.release()


@requires("exclusive")
async def test_observe_from_follower(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name, identity="obs-a") as a, case.make(name, identity="watcher") as w:
        seen: list[str | None] = []

        async def watch() -> None:
            async for current in w.observe():
                seen.append(current)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await wait_until(lambda: seen == [None])
            lead = await a.acquire()
            await wait_until(lambda: seen[-1:] == ["obs-a"])
            await lead.release()
            await wait_until(lambda: seen[-1:] == [None])
            tg.cancel_scope.cancel()
        assert seen == [None, "obs-a", None]


@requires("exclusive")
async def test_release_stops_work_before_the_lock_goes(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name) as a, case.make(name) as b:
        work_stopped: list[float] = []
        inside = asyncio.Event()
        leads: list[Leadership] = []

        async def leader_work() -> None:
            async with leadership(a) as lead:
                leads.append(lead)
                inside.set()
                try:
                    await asyncio.sleep(3600)
                finally:
                    with anyio.CancelScope(shield=True):
                        await asyncio.sleep(0.2)  # slow cleanup: the lock must wait for it
                    work_stopped.append(time.monotonic())

        task = asyncio.create_task(leader_work())
        await inside.wait()
        follower = asyncio.create_task(b.acquire())
        await asyncio.sleep(0.2)
        await leads[0].release()  # from another task than the work's
        with anyio.fail_after(10):
            await follower
        took_over = time.monotonic()
        assert work_stopped and work_stopped[0] <= took_over
        task.cancel()  # it may have ended already: its work scope was cancelled by the release
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_acquire_right_after_the_owner_task_ends(case: BackendCase) -> None:
    # The keeper may still be letting go on the backend: acquire() waits for that, then campaigns.
    async with case.make(unique_name()) as elector:
        for _ in range(3):
            got = asyncio.Event()
            leads: list[Leadership] = []

            async def hold(leads: list[Leadership] = leads, got: asyncio.Event = got) -> None:
                leads.append(await elector.acquire())
                got.set()
                await asyncio.sleep(3600)

            task = asyncio.create_task(hold())
            with anyio.fail_after(10):
                await got.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert not leads[0].held
            with anyio.fail_after(10):
                again = await elector.acquire()
            assert again.held and not leads[0].held
            assert not leads[0].lost
            if leads[0].token is not None and again.token is not None:
                assert again.token > leads[0].token
            await again.release()


async def test_acquire_right_after_release_is_requested(case: BackendCase) -> None:
    async with case.make(unique_name()) as elector:
        for _ in range(3):
            lead = await elector.acquire()
            releasing = asyncio.create_task(lead.release())
            await asyncio.sleep(0)  # the release has started but the backend has not let go yet
            assert not lead.held
            with anyio.fail_after(10):
                again = await elector.acquire()
            assert releasing.done(), "the new leadership began before the old one was let go"
            assert again.held and not lead.held and not lead.lost
            await again.release()


async def test_acquire_still_refused_while_leading(case: BackendCase) -> None:
    async with case.make(unique_name()) as elector:
        lead = await elector.acquire()
        with pytest.raises(ElectionError, match="leading"):
            await elector.acquire()
        with pytest.raises(ElectionError, match="leading"):
            await elector.acquire(timeout=1)
        assert lead.held
        await lead.release()


@requires("exclusive")
async def test_acquire_timeout_leaves_nothing_and_keeps_the_binding(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name) as a, case.make(name) as b:
        lead = await a.acquire()
        before = await case.leftovers() if case.leftovers else None
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="not leader"):
                await b.acquire(timeout=0.4)
            assert 0.4 <= time.monotonic() - started < 3
            assert not b.leading
        if case.leftovers is not None:
            assert before is not None
            await wait_until_async(case.leftovers, before)
        assert lead.held
        await lead.release()
        lead_b = await b.acquire(timeout=10)
        await asyncio.sleep(0.1)  # the keeper has run: the leadership is bound to this task, not released
        assert lead_b.held and not lead_b.lost
        await lead_b.release()


def stubborn_work(
    elector: Elector, leads: list[Leadership], inside: asyncio.Event, stopped: list[float], cleanup: float
) -> asyncio.Task[None]:
    """Leader work whose cleanup ignores cancellation for ``cleanup`` seconds."""

    async def work() -> None:
        async with leadership(elector) as lead:
            leads.append(lead)
            inside.set()
            try:
                await asyncio.sleep(3600)
            finally:
                with anyio.CancelScope(shield=True):
                    await asyncio.sleep(cleanup)
                stopped.append(time.monotonic())

    return asyncio.create_task(work())


@requires("exclusive")
async def test_voluntary_release_keeps_the_lock_until_stubborn_work_stops(
    case: BackendCase, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aioelect.core._elector.STILL_RUNNING_LOG_INTERVAL", 0.3, raising=False)
    name = unique_name()
    async with case.make(name, stop_timeout=0.2) as a, case.make(name) as b:
        leads: list[Leadership] = []
        inside = asyncio.Event()
        stopped: list[float] = []
        task = stubborn_work(a, leads, inside, stopped, cleanup=1.5)
        with anyio.fail_after(10):
            await inside.wait()
        won: list[float] = []

        async def follow() -> None:
            lead = await b.acquire()
            won.append(time.monotonic())
            await lead.wait_lost()

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.2)
        with anyio.fail_after(15):
            await leads[0].release()
        assert stopped, "release() returned before the leader work stopped"
        await wait_until(lambda: bool(won))
        assert won[0] >= stopped[0], "the follower led while the old leader's work still ran"
        assert not leads[0].lost
        errors = [r.getMessage() for r in caplog.records if r.name == "aioelect" and r.levelno >= logging.ERROR]
        keeping = [m for m in errors if "keeping the lock" in m]
        assert len(keeping) >= 2, errors  # once at stop_timeout, then again while it waits
        follower.cancel()
        for t in (follower, task):
            with contextlib.suppress(asyncio.CancelledError):
                await t


@requires("depose")
async def test_loss_while_waiting_for_stubborn_work_ends_leadership_as_a_loss(
    case: BackendCase, caplog: pytest.LogCaptureFixture
) -> None:
    if case.depose is None:
        pytest.skip("an external server (AIOELECT_*_DSN) cannot be faulted")
    async with case.make(unique_name(), stop_timeout=0.2) as elector:
        leads: list[Leadership] = []
        inside = asyncio.Event()
        stopped: list[float] = []
        task = stubborn_work(elector, leads, inside, stopped, cleanup=4)
        with anyio.fail_after(10):
            await inside.wait()
        releasing = asyncio.create_task(leads[0].release())
        await asyncio.sleep(0.5)
        assert not releasing.done(), "released while the work still ran"
        await case.depose(elector)
        with anyio.fail_after(6):
            await releasing
        assert not stopped, "the work stopped early: nothing was tested"
        assert leads[0].lost and leads[0].lost_reason
        errors = [r.getMessage() for r in caplog.records if r.name == "aioelect" and r.levelno >= logging.ERROR]
        assert any("without leadership" in m for m in errors), errors
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeadershipLost):
            await task


# --- the current leadership, trying once, and followers that know the leader -----------------------


async def test_current_leadership_inside_run_and_leadership(case: BackendCase) -> None:
    async with case.make(unique_name(), identity="ctx") as elector:

        async def work() -> int | None:
            lead = aioelect.current_leadership()
            lead.check()
            return lead.token

        token = await elector.run(work)
        if case.kind != "local" and case.kind != "memory":
            assert token is not None, "fencing tokens are on by default"
        async with leadership(elector) as lead:
            assert aioelect.current_leadership() is lead
        with pytest.raises(ElectionError, match="outside leader work"):
            aioelect.current_leadership()


@requires("exclusive")
async def test_try_acquire_returns_none_while_another_leads_and_leaves_nothing(case: BackendCase) -> None:
    name = unique_name()
    async with case.make(name, identity="holder") as a, case.make(name, identity="tryer") as b:
        lead_a = await a.acquire()
        before = await case.leftovers() if case.leftovers else None
        for _ in range(3):
            started = time.monotonic()
            assert await b.try_acquire() is None
            assert time.monotonic() - started < 3.0, "try_acquire() must not wait for the leader"
            assert not b.leading
            async with leadership(b, wait=False) as none:
                assert none is None
        if case.leftovers is not None:
            assert before is not None
            await wait_until_async(case.leftovers, before)
        assert lead_a.held
        await lead_a.release()
        lead_b = await b.try_acquire()
        assert lead_b is not None and lead_b.held
        assert await a.leader() == "tryer"
        if lead_a.token is not None:
            assert lead_b.token is not None and lead_b.token > lead_a.token
        # The leadership try_acquire() returns is bound to this task, as acquire()'s is.
        assert await a.try_acquire() is None
        await lead_b.release()
        async with leadership(a, wait=False) as lead:
            assert lead is not None and lead.held


async def test_last_leader_is_self_while_leading(case: BackendCase) -> None:
    async with case.make(unique_name(), identity="me") as elector:
        assert elector.last_leader is None
        lead = await elector.acquire()
        assert elector.last_leader == "me"
        await lead.release()
        assert elector.last_leader is None


@requires("exclusive")
async def test_followers_campaigning_know_the_leader_and_its_successor(case: BackendCase) -> None:
    name = unique_name()
    async with (
        case.make(name, identity="first") as a,
        case.make(name, identity="second") as b,
        case.make(name, identity="third") as c,
    ):
        seen: dict[str, list[str | None]] = {"second": [], "third": []}
        for elector in (b, c):
            elector.add_listener(
                lambda event: seen[event.identity].append(event.leader) if event.kind == "leader" else None
            )
        lead_a = await a.acquire()
        followers = [Follower(b), Follower(c)]
        try:
            # Neither follower ran observe(): the campaign itself reports who leads.
            await wait_until(lambda: b.last_leader == "first" and c.last_leader == "first")
            assert seen["second"][-1:] == ["first"] and seen["third"][-1:] == ["first"]
            await lead_a.release()
            await wait_until(lambda: any(f.won.is_set() for f in followers))
            winner, loser = (b, c) if followers[0].won.is_set() else (c, b)
            assert winner.last_leader == winner.identity
            await wait_until(lambda: loser.last_leader == winner.identity)
            assert seen[loser.identity][-1] == winner.identity
            # One event per change: never the same leader twice in a row.
            for leaders in seen.values():
                assert all(x != y for x, y in itertools.pairwise(leaders))
        finally:
            for follower in followers:
                await follower.close()
