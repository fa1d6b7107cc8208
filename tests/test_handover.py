"""Planned handovers (Leadership.step_down) on real servers: only the named successor leads next, at once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

import anyio
import pytest

import aioelect
from aioelect import Elector, Event, LocalElector, UsageError
from aioelect.testing import MemoryElector

from .backends import CASES, BackendCase, Follower, unique_name
from .test_fenced_state import FENCED


@pytest.fixture(params=sorted(k for k in FENCED if not k.endswith("-shared")))
def case(request: pytest.FixtureRequest) -> BackendCase:
    return CASES[request.param](request)


def make(case: BackendCase, name: str, identity: str) -> Elector:
    return case.make(name, identity=identity, **FENCED[case.kind])


def record(*electors: Elector) -> list[Event]:
    seen: list[Event] = []
    for elector in electors:
        elector.add_listener(seen.append)
    return seen


async def test_step_down_to_a_named_candidate_passes_over_the_others(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b, make(case, name, "c") as c:
        events = record(a, b, c)
        lead_a = await a.acquire()
        follower_b = Follower(b)
        await asyncio.sleep(0.3)  # b waits first: a plain release would go to it on most backends
        follower_c = Follower(c)
        await asyncio.sleep(0.3)
        try:
            started = time.monotonic()
            await lead_a.step_down(to="c", timeout=30)
            assert not lead_a.held and not lead_a.lost
            lead_c = await follower_c.wait(timeout=case.takeover_bound + 5)
            gap = time.monotonic() - started
            assert lead_a.token is not None and lead_c.token is not None and lead_c.token > lead_a.token
            assert gap < case.takeover_bound + 3, gap  # a release, not a lease expiry
            await asyncio.sleep(1.0)  # b, excluded, never led meanwhile
            assert not follower_b.won.is_set()
            assert not [e for e in events if e.kind == "acquired" and e.identity == "b"]
            kinds = [
                (e.kind, e.identity, e.successor, e.reason)
                for e in events
                if e.kind in ("handover_requested", "stepped_down")
            ]
            assert kinds == [("handover_requested", "a", "c", "requested"), ("stepped_down", "a", "c", "requested")]
            # The successor let go: the note is taken, so b leads next as usual.
            await follower_c.close()
            lead_b = await follower_b.wait(timeout=case.takeover_bound + 5)
            assert lead_b.token is not None and lead_b.token > lead_c.token
        finally:
            await follower_b.close()
            await follower_c.close()


async def test_step_down_without_a_successor_keeps_this_candidate_out(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        lead_a = await a.acquire()
        await lead_a.step_down(timeout=30)
        again = Follower(a)  # a campaigns again at once: the note keeps it out until another leads
        await asyncio.sleep(0.5)
        follower_b = Follower(b)
        try:
            lead_b = await follower_b.wait(timeout=case.takeover_bound + 5)
            assert not again.won.is_set()
            assert lead_b.token is not None and lead_a.token is not None and lead_b.token > lead_a.token
            await follower_b.close()  # another led: a is a candidate like any other again
            await again.wait(timeout=case.takeover_bound + 5)
        finally:
            await follower_b.close()
            await again.close()


async def test_a_successor_nobody_is_opens_the_election_after_the_timeout(
    case: BackendCase, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        lead_a = await a.acquire()
        follower_b = Follower(b)
        try:
            await asyncio.sleep(0.3)
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="aioelect"):
                await lead_a.step_down(to="ghost", timeout=2)
                await follower_b.wait(timeout=10)
            waited = time.monotonic() - started
            assert 1.5 <= waited < 2 + case.takeover_bound + 3, waited
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "not taken within" in r.message]
            assert warnings and "'ghost'" in warnings[0].message
        finally:
            await follower_b.close()


async def test_step_down_refuses_what_does_not_lead_and_two_at_once_have_one_outcome(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        events = record(a)
        lead = await a.acquire()
        with pytest.raises(ValueError):
            await lead.step_down(to="")
        with pytest.raises(ValueError):
            await lead.step_down(timeout=0)
        assert lead.held
        follower_b = Follower(b)
        try:
            await asyncio.gather(lead.step_down(to="b"), lead.step_down(to="b"))
            await follower_b.wait(timeout=case.takeover_bound + 5)
            assert [e.kind for e in events].count("stepped_down") == 1
            with pytest.raises(UsageError, match="not led by this leadership"):
                await lead.step_down()
        finally:
            await follower_b.close()


async def test_step_down_inside_the_work_ends_the_work_before_the_successor_leads(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        after: list[str] = []

        async def work() -> None:
            from aioelect import current_leadership

            await current_leadership().step_down(to="b")
            after.append("ran on")  # never: the step-down ended the work

        follower_b = Follower(b)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.run, work)
                lead_b = await follower_b.wait(timeout=case.takeover_bound + 10)
                assert lead_b.held
                tg.cancel_scope.cancel()  # a.run() campaigns again behind b
            assert after == []
        finally:
            await follower_b.close()


async def test_a_backend_without_notes_says_so() -> None:
    async with LocalElector(name=unique_name(), identity="a") as a:
        lead = await a.acquire()
        with pytest.raises(UsageError, match="keeps no handover note"):
            await lead.step_down(to="b")
        assert lead.held


async def test_a_step_down_asked_from_outside_moves_leadership_once(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b, make(case, name, "c") as c:
        events = record(a)
        follower_b: Follower | None = None
        try:
            async with anyio.create_task_group() as tg:

                async def leader_a() -> None:
                    async with aioelect.leadership(a) as lead, anyio.create_task_group() as inner:
                        inner.start_soon(functools.partial(aioelect.serve_step_downs, lead, interval=0.1))
                        await lead.wait_lost()  # the work: until it is cancelled by the step-down

                tg.start_soon(leader_a)
                with anyio.fail_after(10):
                    while await c.leader() != "a":
                        await anyio.sleep(0.05)
                follower_b = Follower(b)
                await aioelect.request_step_down(c, to="b", timeout=30)
                lead_b = await follower_b.wait(timeout=case.takeover_bound + 10)
                assert lead_b.held
                tg.cancel_scope.cancel()
            stepped = [e for e in events if e.kind == "stepped_down"]
            assert [(e.reason, e.successor) for e in stepped] == [("request", "b")]
            # The request is answered: b serving requests now does not step down for it.
            with anyio.move_on_after(0.5):
                await aioelect.serve_step_downs(lead_b, interval=0.1)
            assert lead_b.held
        finally:
            if follower_b is not None:
                await follower_b.close()


async def test_a_request_whose_successor_leads_by_a_release_is_not_acted_on(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b, make(case, name, "c") as c:
        events = record(b)
        lead_a = await a.acquire()
        follower_b = Follower(b)
        try:
            # Posted for a leader that releases before it acts: b then leads by the release.
            await aioelect.request_step_down(c, to="b", timeout=30, lapse=30)
            await lead_a.release()
            lead_b = await follower_b.wait(timeout=case.takeover_bound + 10)
            with anyio.move_on_after(1.5):
                await aioelect.serve_step_downs(lead_b, interval=0.1)
            assert lead_b.held, "b stepped down to itself"
            assert [e for e in events if e.kind == "stepped_down"] == []
        finally:
            await follower_b.close()


async def test_a_request_with_nobody_leading_lapses() -> None:
    from aioelect.testing import MemoryElector

    async with MemoryElector(name=unique_name(), identity="a") as a:
        await aioelect.request_step_down(a, lapse=0.2)
        await anyio.sleep(0.3)
        lead = await a.acquire()
        with anyio.move_on_after(0.3):
            await aioelect.serve_step_downs(lead, interval=0.05)
        assert lead.held  # the lapsed request was not acted on


@pytest.mark.parametrize("once", [False, True], ids=["acquire", "try_acquire"])
async def test_a_campaign_cancelled_while_its_grant_is_checked_against_the_note_gives_the_grant_back(
    aioelect_name: str, once: bool
) -> None:
    """The grant is read against the handover note before it is a leadership; a cancellation that lands during
    that read gives the grant back: the lock is never left held by nobody."""
    from aioelect.core._elector import backend_of

    a = MemoryElector(name=aioelect_name, identity="a")
    b = MemoryElector(name=aioelect_name, identity="b")
    store = backend_of(a).state_store()
    read = store.read
    reading = anyio.Event()

    async def slow_read(key: str) -> bytes | None:
        reading.set()
        await anyio.sleep(30)
        return await read(key)

    store.read = slow_read  # type: ignore[method-assign]
    try:
        task = asyncio.get_running_loop().create_task(a.try_acquire() if once else a.acquire())
        with anyio.fail_after(10):
            await reading.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with anyio.fail_after(10):
            lead = await b.try_acquire()  # the lock a's cancelled campaign won is free again
        assert lead is not None
        await lead.release()
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_named_successor_that_dies_mid_handover_leaves_the_election_to_another_after_the_timeout(
    case: BackendCase, caplog: pytest.LogCaptureFixture
) -> None:
    """The successor is alive when the leader names it and dies (its elector closed) inside the window: nobody
    takes the note, so the others stay out until the window ends, then one of them leads, with a WARNING."""
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "c") as c:
        b = make(case, name, "b")
        await b.__aenter__()
        events = record(a, b, c)
        lead_a = await a.acquire()
        follower_c = Follower(c)
        try:
            await asyncio.sleep(0.3)
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="aioelect"):
                await lead_a.step_down(to="b", timeout=2)
                await asyncio.sleep(0.5)  # b has not campaigned yet: the handover waits on it
                await b.aclose()  # b dies mid-handover
                assert not follower_c.won.is_set()  # the note still keeps c out
                lead_c = await follower_c.wait(timeout=2 + case.takeover_bound + 5)
            waited = time.monotonic() - started
            assert 1.5 <= waited < 2 + case.takeover_bound + 3, waited
            assert lead_a.token is not None and lead_c.token is not None and lead_c.token > lead_a.token
            assert [e.identity for e in events if e.kind == "acquired"] == ["a", "c"]
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "not taken within" in r.message]
            assert warnings and "'b'" in warnings[0].message
        finally:
            await follower_c.close()
            await b.aclose()


async def test_a_step_down_in_process_and_a_request_at_once_have_one_outcome(case: BackendCase) -> None:
    """The leader steps down to b in-process while a request to c, posted from elsewhere, is served: exactly one
    of them is acted on (one note, one stepped_down), and only the successor it names leads next."""
    name = unique_name()
    async with (
        make(case, name, "a") as a,
        make(case, name, "b") as b,
        make(case, name, "c") as c,
        make(case, name, "poster") as poster,
    ):
        events = record(a, b, c)
        lead_a = await a.acquire()
        follower_b, follower_c = Follower(b), Follower(c)
        try:
            await asyncio.sleep(0.3)
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(aioelect.serve_step_downs, lead_a, interval=0.02))
                await aioelect.request_step_down(poster, to="c", timeout=30)
                await asyncio.sleep(0.01)  # the next poll of the request is due about now
                with contextlib.suppress(UsageError):  # the request was acted on first: not led any more
                    await lead_a.step_down(to="b", timeout=30)
                with anyio.fail_after(10):  # the step-down's event follows the end of the leadership
                    while lead_a.held or not any(e.kind == "stepped_down" for e in events):
                        await anyio.sleep(0.02)
            asked = [e for e in events if e.kind == "handover_requested"]
            stepped = [e for e in events if e.kind == "stepped_down"]
            assert len(asked) == 1 and len(stepped) == 1, events
            assert (asked[0].identity, stepped[0].successor) == ("a", asked[0].successor)
            chosen, other = (follower_b, follower_c) if asked[0].successor == "b" else (follower_c, follower_b)
            lead = await chosen.wait(timeout=case.takeover_bound + 5)
            assert lead.token is not None and lead_a.token is not None and lead.token > lead_a.token
            await asyncio.sleep(1.0)
            assert not other.won.is_set()
            assert [e.identity for e in events if e.kind == "acquired"] == ["a", asked[0].successor]
        finally:
            await follower_b.close()
            await follower_c.close()
