"""Leadership's state machine: every row of its transition table, taken by the real cause, on the memory backend.

The walks are the table's rows, so a row added to the table is walked at
once (a state no path here reaches fails
:func:`test_every_state_a_row_leaves_is_reached`); a step the table does not
list for a state is shown to change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from aioelect import Leadership
from aioelect.core._elector import _LOSS, LEADERSHIP_TRANSITIONS, _Lead, _Step
from aioelect.testing import MemoryElector

pytestmark = pytest.mark.timeout(30)


@dataclass
class Bench:
    """One leadership whose leader work ignores cancellation until ``free`` is set, so that ending states last."""

    elector: MemoryElector
    lead: Leadership
    free: anyio.Event
    tasks: list[asyncio.Task[object]]

    async def until(self, state: _Lead) -> None:
        with anyio.fail_after(5):
            while self.lead._state is not state:
                await asyncio.sleep(0.005)


async def _stubborn(lead: Leadership, free: anyio.Event) -> None:
    with lead.guard():
        with anyio.CancelScope(shield=True):
            await free.wait()


@contextlib.asynccontextmanager
async def _bench(name: str) -> AsyncIterator[Bench]:
    # stop_timeout long enough that a loss waits for the stubborn work while the test looks at LOSING.
    async with MemoryElector(name=name, stop_timeout=3.0) as elector:
        lead = await elector.acquire()
        free = anyio.Event()
        work: asyncio.Task[object] = asyncio.get_running_loop().create_task(_stubborn(lead, free))
        await asyncio.sleep(0)
        bench = Bench(elector, lead, free, [work])
        try:
            yield bench
        finally:
            free.set()
            await lead.release()
            await asyncio.gather(*bench.tasks, return_exceptions=True)


async def _release(b: Bench) -> None:
    b.tasks.append(asyncio.get_running_loop().create_task(b.lead.release()))
    await asyncio.sleep(0.01)


async def _loss(b: Bench) -> None:
    b.elector.depose("deposed by the state test")
    await asyncio.sleep(0.05)


async def _let_go(b: Bench) -> None:
    b.free.set()
    await asyncio.sleep(0.05)


_CAUSES: dict[_Step, Callable[[Bench], Awaitable[None]]] = {
    _Step.RELEASE: _release,
    _Step.LOSS: _loss,
    _Step.LET_GO: _let_go,
}

#: How a bench is brought to each state the table leaves, by the steps the table names.
_PATHS: dict[_Lead, list[_Step]] = {
    _Lead.HELD: [],
    _Lead.RELEASING: [_Step.RELEASE],
    _Lead.LOSING: [_Step.LOSS],
}


def _check_properties(lead: Leadership) -> None:
    state = lead._state
    assert lead.held is (state is _Lead.HELD)
    assert lead.lost is (state in _LOSS)
    if state in _LOSS:
        assert lead.lost_reason == "deposed by the state test"
    else:
        assert lead.lost_reason is None


@pytest.mark.parametrize(
    ("state", "step", "target"),
    [pytest.param(*row, id=f"{row[0].name}-{row[1].name}") for row in LEADERSHIP_TRANSITIONS],
)
async def test_transition(state: _Lead, step: _Step, target: _Lead) -> None:
    async with _bench(f"states-{state.name}-{step.name}") as b:
        for earlier in _PATHS[state]:
            await _CAUSES[earlier](b)
        await b.until(state)
        _check_properties(b.lead)
        await _CAUSES[step](b)
        await b.until(target)
        _check_properties(b.lead)
        if target in LEADERSHIP_TRANSITIONS.final:
            with anyio.fail_after(5):
                await b.lead.release()  # already finished: returns at once
            assert b.elector._leadership is None


_UNLISTED = [
    (state, step)
    for state in (_Lead.HELD, _Lead.RELEASING, _Lead.LOSING)
    for step in (_Step.RELEASE, _Step.LOSS)
    if LEADERSHIP_TRANSITIONS.next(state, step) is None
]


@pytest.mark.parametrize(("state", "step"), _UNLISTED, ids=[f"{s.name}-{t.name}" for s, t in _UNLISTED])
async def test_a_step_the_table_does_not_list_changes_nothing(state: _Lead, step: _Step) -> None:
    async with _bench(f"states-none-{state.name}-{step.name}") as b:
        for earlier in _PATHS[state]:
            await _CAUSES[earlier](b)
        await b.until(state)
        if step is _Step.LOSS:
            b.lead._mark_lost("a second loss")  # where every loss enters; the deposed hold cannot be deposed again
        else:
            await _CAUSES[step](b)
        await asyncio.sleep(0.01)
        assert b.lead._state is state
        _check_properties(b.lead)


async def test_a_finished_leadership_stays_finished() -> None:
    async with _bench("states-finished") as b:
        await _let_go(b)
        await b.lead.release()
        assert b.lead._state is _Lead.RELEASED
        b.lead._mark_lost("after the end")
        await b.lead.release()
        assert b.lead._state is _Lead.RELEASED
        _check_properties(b.lead)


def test_final_states_have_no_way_out_and_every_state_is_reached() -> None:
    rows = list(LEADERSHIP_TRANSITIONS)
    assert not [r for r in rows if r[0] in LEADERSHIP_TRANSITIONS.final]
    reached = {LEADERSHIP_TRANSITIONS.start} | {target for _, _, target in rows}
    assert reached == set(_Lead)
    # From every state that is not final, some path ends in a final state.
    for state in set(_Lead) - LEADERSHIP_TRANSITIONS.final:
        seen, frontier = {state}, [state]
        while frontier:
            here = frontier.pop()
            for source, _, target in rows:
                if source is here and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert seen & LEADERSHIP_TRANSITIONS.final, state


def test_every_state_a_row_leaves_is_reached() -> None:
    assert {state for state, _, _ in LEADERSHIP_TRANSITIONS} <= set(_PATHS)
    for state, path in _PATHS.items():  # each path is itself made of rows of the table
        here = LEADERSHIP_TRANSITIONS.start
        for step in path:
            moved = LEADERSHIP_TRANSITIONS.next(here, step)
            assert moved is not None
            here = moved
        assert here is state
