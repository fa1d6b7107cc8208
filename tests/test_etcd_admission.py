"""The admission of one etcd connection's campaign traffic (aioelect.backends.etcd._admission): at most ``limit``
admitted at once, a held leadership's waiters first, no turn lost to a cancellation. (Its effect on real
campaigns: tests/test_etcd_session.py.)"""

from __future__ import annotations

import asyncio

import pytest

from aioelect.backends.etcd._admission import Admission, Lane

pytestmark = pytest.mark.timeout(10)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_at_most_limit_admitted_then_holds_first_each_lane_in_order() -> None:
    admission = Admission(2)
    order: list[str] = []
    gates = {name: asyncio.Event() for name in ("a", "b", "c1", "c2", "h1", "h2")}

    async def request(name: str, lane: Lane) -> None:
        async with admission.turn(lane):
            order.append(name)
            await gates[name].wait()

    tasks = [asyncio.create_task(request("a", Lane.CAMPAIGN)), asyncio.create_task(request("b", Lane.CAMPAIGN))]
    await _settle()
    for name, lane in (("c1", Lane.CAMPAIGN), ("c2", Lane.CAMPAIGN), ("h1", Lane.HOLD), ("h2", Lane.HOLD)):
        tasks.append(asyncio.create_task(request(name, lane)))
        await _settle()
    assert order == ["a", "b"] and admission.admitted == 2 and admission.waiting == 4
    for name in ("a", "b", "h1", "h2"):
        gates[name].set()
        await _settle()
        assert admission.admitted == 2
    gates["c1"].set()
    gates["c2"].set()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "h1", "h2", "c1", "c2"]
    assert admission.admitted == 0 and admission.waiting == 0


async def test_a_request_without_a_lane_never_waits() -> None:
    admission = Admission(1)
    async with admission.turn(Lane.CAMPAIGN), admission.turn(None):
        assert admission.admitted == 1
    assert admission.admitted == 0


async def test_a_waiter_cancelled_before_or_after_its_turn_loses_no_turn() -> None:
    admission = Admission(1)
    gate = asyncio.Event()
    ran: list[str] = []

    async def request(name: str) -> None:
        async with admission.turn(Lane.CAMPAIGN):
            ran.append(name)
            await gate.wait()

    first = asyncio.create_task(request("first"))
    await _settle()
    waiting = [asyncio.create_task(request(name)) for name in ("gone", "admitted-then-gone", "last")]
    await _settle()
    waiting[0].cancel()  # cancelled while it waits: leaves the queue
    await _settle()
    assert admission.waiting == 2
    gate.set()
    await asyncio.sleep(0)  # first leaves: the turn is handed to the next waiter...
    assert ran == ["first"] and admission.admitted == 1 and admission.waiting == 1
    waiting[1].cancel()  # ...which is cancelled before it could run: it hands the turn on
    await asyncio.gather(first, *waiting, return_exceptions=True)
    assert ran == ["first", "last"]
    assert admission.admitted == 0 and admission.waiting == 0
