"""Once ``held`` is False past the renew deadline it never becomes True again (PostgreSQL, a real server).

The leader's check is sent and the loop blocks in the same breath, so that its answer waits unread; on waking,
past the deadline, ``held`` is False. An answer read after the deadline ends the leadership, even one sent before
it: a program that stopped its leader work on ``held`` being False never sees ``check()`` pass again.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

import aioelect.backends.sql._session_lock as session_lock

from .backends import CASES, unique_name


@pytest.fixture
def case(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return CASES["postgres"](request)


async def test_held_never_comes_back_after_it_was_false(case, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    options = {"lease": 6, "check_interval": None, "check_timeout": None}
    sent_check = asyncio.Event()
    armed = False
    real = session_lock.monotonic

    def monotonic() -> float:
        if armed and sys._getframe(1).f_code.co_name == "monitor":
            sent_check.set()  # the check about to be sent: the block comes right after it
        return real()

    monkeypatch.setattr(session_lock, "monotonic", monotonic)
    async with case.make(unique_name("flip"), identity="a", **options) as elector:
        lead = await elector.acquire(timeout=20)
        await asyncio.sleep(1.0)
        deadline = lead._deadline
        assert deadline is not None
        armed = True
        await sent_check.wait()
        armed = False
        age = time.monotonic() - lead._confirmed_at  # about check_interval: the check in flight is newer
        time.sleep(deadline - age + 0.3)  # noqa: ASYNC251 - past the deadline of the last confirmation read
        seen = [lead.held]
        for _ in range(20):
            await asyncio.sleep(0.05)
            seen.append(lead.held)
        await lead.release()
    assert seen[0] is False, "the test meant to wake past the deadline"
    assert True not in seen, f"held came back after it was False: {seen}"
