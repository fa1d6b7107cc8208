"""The Elector's state machine: every row of its transition table taken by its real cause, on the memory backend,
and the steps the table does not list changing nothing."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aioelect import ElectorClosed, UsageError
from aioelect._elector import ELECTOR_TRANSITIONS, _Do, _State
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
