"""The Elector's state machine: every row of its transition table taken by its real cause, on the memory backend,
and the steps the table does not list changing nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from aioelect import ElectorClosed, UsageError
from aioelect.core._elector import ELECTOR_TRANSITIONS, _Do, _State
from aioelect.testing import MemoryElector

pytestmark = pytest.mark.timeout(30)


def test_the_table_has_one_way_out_of_each_state_and_reaches_every_state() -> None:
    rows = list(ELECTOR_TRANSITIONS)
    assert not [r for r in rows if r[0] in ELECTOR_TRANSITIONS.final]
    assert {ELECTOR_TRANSITIONS.start} | {target for _, _, target in rows} == set(_State)
    for state in set(_State) - ELECTOR_TRANSITIONS.final:
        assert ELECTOR_TRANSITIONS.next(state, _Do.CLOSE) is _State.CLOSED  # aclose() from anywhere


async def until(elector: MemoryElector, state: _State) -> None:
    with anyio.fail_after(5):
        while elector._state is not state:
            await asyncio.sleep(0.005)


async def test_every_row_is_taken_by_its_cause(aioelect_name: str) -> None:
    taken: set[tuple[_State, _Do]] = set()

    def moves(elector: MemoryElector) -> None:
        move = elector._move

        def recorded(step: _Do) -> bool:
            before = elector._state
            moved = move(step)
            if moved:
                taken.add((before, step))
            return moved

        elector._move = recorded  # type: ignore[method-assign]

    async with MemoryElector(name=aioelect_name, identity="a") as a:
        b = MemoryElector(name=aioelect_name, identity="b")
        moves(a)
        moves(b)
        lead = await a.acquire()  # IDLE -> CAMPAIGNING -> LEADING
        assert a._state is _State.LEADING
        assert await b.try_acquire() is None  # CAMPAIGNING -> IDLE: the campaign ended without a leadership
        assert b._state is _State.IDLE
        await lead.release()  # LEADING -> IDLE
        assert a._state is _State.IDLE
        await a.acquire()
        waiting = asyncio.get_running_loop().create_task(b.acquire())
        await until(b, _State.CAMPAIGNING)
        with pytest.raises(UsageError, match="campaigning"):  # a step the table does not list changes nothing
            await b.acquire()
        assert b._state is _State.CAMPAIGNING
        await b.aclose()  # CAMPAIGNING -> CLOSED
        with pytest.raises(ElectorClosed):
            await waiting
    assert a._state is _State.CLOSED  # LEADING -> CLOSED
    d = MemoryElector(name=aioelect_name)
    moves(d)
    await d.aclose()  # IDLE -> CLOSED
    await d.aclose()  # CLOSED has no way out: a second aclose() changes nothing
    assert d._state is _State.CLOSED
    with pytest.raises(ElectorClosed):
        await d.acquire()
    assert taken == {(state, step) for state, step, _ in ELECTOR_TRANSITIONS}


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_campaign_started_while_a_cancelled_one_gives_its_grant_back_keeps_its_state(
    kind: str, aioelect_name: str, request: pytest.FixtureRequest
) -> None:
    # A campaign cancelled as its grant arrives moves the elector to IDLE (_abandon) and then gives the hold back,
    # a round trip; an acquire() called meanwhile campaigns. The cancelled campaign then took its STOP again on
    # its way out, and moved the new campaign's CAMPAIGNING to IDLE: its win found the elector IDLE, the
    # assertion in _lead failed, and its leadership was left with no keeper, the lock or key held by nobody
    # (and aclose() waited for it forever).
    from aioelect import RedisElector
    from aioelect.core._elector import backend_of

    if kind == "memory":
        elector: Any = MemoryElector(name=aioelect_name, identity="e", renew_deadline=5)
    else:
        url = str(request.getfixturevalue("redis_server").url)
        elector = RedisElector(url, name=aioelect_name, identity="e")
    backend = backend_of(elector)
    campaign = backend.campaign
    first: list[asyncio.Task[Any]] = []
    second: list[asyncio.Task[Any]] = []

    async def take() -> Any:
        while elector._state is not _State.IDLE:  # the cancelled campaign has ended (its grant may be going back)
            await asyncio.sleep(0)
        lead = await elector.acquire()  # bound to this task: seen held here, released before it ends
        seen = (lead.held, elector._state, elector.leading)
        await lead.release()
        return seen

    async def cancelled_as_granted(identity: str) -> Any:
        hold = await campaign(identity)
        if not second:
            first[0].cancel()  # the cancellation arrives with the grant
            second.append(asyncio.get_running_loop().create_task(take()))  # runs while the grant is given back
        return hold

    backend.campaign = cancelled_as_granted
    try:
        first.append(asyncio.get_running_loop().create_task(elector.acquire()))
        with anyio.fail_after(10):
            await asyncio.gather(first[0], return_exceptions=True)
            assert first[0].cancelled()
            seen = await second[0]
        assert seen == (True, _State.LEADING, True)
        assert elector._state is _State.IDLE and elector._leadership is None
    finally:
        closing = asyncio.get_running_loop().create_task(elector.aclose())
        done, _ = await asyncio.wait([closing], timeout=10)
        assert done, "aclose() hangs on a leadership nobody keeps"
