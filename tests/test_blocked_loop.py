"""A leader whose event loop blocks: it keeps a block of half its lease, and loses a longer one cleanly.

The leader runs in a thread with an event loop of its own, so that its
``time.sleep()`` blocks only that loop; the next candidate waits in the
test's loop. Both read the same monotonic clock, so "no overlap" is a
comparison of instants: the next candidate leads only after the old
leader's last moment of ``held``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from aioelect import Elector, LeadershipLost

from .backends import CASES, BackendCase, unique_name

#: The keep test's options (every timing at its default but the lease; None overrides the suite's quick
#: checks with the default) and the lease they give.
DEFAULTS: dict[str, tuple[dict[str, Any], float]] = {
    "etcd": ({"ttl": 5}, 5.0),
    # The bench's lease: a renew every 0.5 s (a tenth of the lease).
    "redis": ({"lease": 5, "check_interval": None, "check_timeout": None}, 5.0),
    # The default lease: a check every 1 s.
    "mysql": ({"lease": 10, "check_interval": None, "check_timeout": None}, 10.0),
    "postgres": ({"lease": 6, "check_interval": None, "check_timeout": None}, 6.0),
    # No lease: the lock lives with the process. Blocked for as long as etcd's half lease.
    "file": ({}, 5.0),
}

#: Short leases for the test of a block longer than the lease: (options, lease).
SHORT: dict[str, tuple[dict[str, Any], float]] = {
    "etcd": ({"ttl": 2}, 2.0),
    "redis": ({"lease": 3, "check_interval": 0.2, "check_timeout": 0.5}, 3.0),  # TCP keep-alives need 3 s
    "mysql": ({"lease": 2, "check_interval": 0.2, "check_timeout": 0.5}, 2.0),
    "postgres": ({"lease": 2, "check_interval": 0.2, "check_timeout": 0.5}, 2.0),
}


def renew_interval(kind: str, options: dict[str, Any]) -> float:
    """The leader's renew interval: etcd's lead_interval, else check_interval (by default a tenth of a lease
    under 10 s)."""
    if kind == "etcd":
        return float(options["ttl"]) / 12
    given = options.get("check_interval")
    return float(given) if given is not None else min(1.0, float(options["lease"]) / 10)


def next_renew(kind: str, options: dict[str, Any], arrival: float, latency: float) -> float:
    """When the renew after a confirmation that arrived at ``arrival`` is due (monotonic)."""
    if kind == "etcd":
        return arrival - latency + renew_interval(kind, options)  # after the send of the last
    return arrival + renew_interval(kind, options)  # after the answer


@dataclass
class Record:
    led: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    #: When the block started, its length, and the last confirmation's age then.
    blocked_at: float = 0.0
    age_at_block: float = 0.0
    #: ``held`` right after waking, its end (the renew deadline from the last confirmation) then, and 2 s later.
    held_on_waking: bool | None = None
    held_until: float = 0.0
    acted: bool = False
    held_later: bool | None = None
    leader_later: str | None = None
    lost_reason: str | None = None
    released_at: float = 0.0


async def blocking_leader(
    make: Callable[..., Elector], name: str, kind: str, options: dict[str, Any], block: float, record: Record
) -> None:
    """Lead, block the loop for ``block`` seconds just before a renew is due (1.5 s after leading), then act."""
    with anyio.fail_after(block + 60):
        async with make(name, identity="blocked", **options) as elector:
            confirmations: list[tuple[float, float]] = []

            def confirmed(event: Any) -> None:
                if event.kind == "confirmed":
                    confirmations.append((time.monotonic(), float(event.latency)))

            elector.add_listener(confirmed)
            lead = await elector.acquire(timeout=20)
            record.led.set()
            await asyncio.sleep(1.5)
            if lead._deadline is not None:  # a backend without a deadline confirms nothing worth aiming at
                seen = len(confirmations)
                while len(confirmations) == seen:
                    await asyncio.sleep(0.005)
                arrival, latency = confirmations[-1]
                await asyncio.sleep(max(0.0, next_renew(kind, options, arrival, latency) - 0.03 - time.monotonic()))
            record.blocked_at = time.monotonic()
            record.age_at_block = record.blocked_at - lead._confirmed_at
            time.sleep(block)  # noqa: ASYNC251 - the application's synchronous call, the point of the test
            record.held_on_waking = lead.held
            record.held_until = lead._confirmed_at + (lead._deadline or float("inf"))
            try:
                lead.check()  # right before an action only the leader may take
                record.acted = True
            except LeadershipLost:
                record.acted = False
            if record.acted:
                await asyncio.sleep(2.0)
                record.held_later = lead.held
                record.leader_later = await elector.leader()
            else:
                with anyio.fail_after(10):
                    await lead.wait_lost()
            record.lost_reason = lead.lost_reason
            record.released_at = time.monotonic()
            await lead.release()
    record.released.set()


async def run_scenario(case: BackendCase, kind: str, options: dict[str, Any], block: float) -> tuple[Record, float]:
    """Run the blocking leader in a thread of its own and a follower here; the follower's win time (0: none)."""
    name = unique_name("blocked")
    record = Record()
    won_at = 0.0

    async def follower() -> None:
        nonlocal won_at
        async with case.make(name, identity="follower", **options) as elector:
            lead = await elector.acquire()
            won_at = time.monotonic()
            await lead.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            anyio.to_thread.run_sync,
            lambda: asyncio.run(blocking_leader(case.make, name, kind, options, block, record)),
        )
        with anyio.fail_after(30):
            while not record.led.is_set():
                await asyncio.sleep(0.01)
        tg.start_soon(follower)
        with anyio.fail_after(block + 60):
            while not won_at:
                await asyncio.sleep(0.01)
    return record, won_at


@pytest.fixture(params=sorted(DEFAULTS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_block_of_half_the_lease_keeps_the_leadership(
    kind: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[kind](request)
    options, lease = DEFAULTS[kind]
    caplog.set_level(logging.WARNING, logger="aioelect")
    record, won_at = await run_scenario(case, kind, options, lease / 2)
    assert record.held_on_waking and record.acted, record
    assert record.held_later and record.leader_later == "blocked", record
    assert won_at > record.released_at, "the follower led while the blocked leader still did"
    if kind != "file":
        # Aimed at the worst moment: the last confirmation was about one renew interval old when the block began.
        assert record.age_at_block >= renew_interval(kind, options) * 0.8, record
        warnings = [r.getMessage() for r in caplog.records if "the event loop was blocked for" in r.getMessage()]
        assert any("leadership kept" in w for w in warnings), warnings


@pytest.mark.parametrize("kind", sorted(SHORT))
async def test_a_block_longer_than_the_lease_loses_it_without_overlap(
    kind: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[kind](request)
    options, lease = SHORT[kind]
    caplog.set_level(logging.WARNING, logger="aioelect")
    block = lease + 3
    record, won_at = await run_scenario(case, kind, options, block)
    # On waking, before anything else ran, the old leader is past its renew deadline and does not act.
    assert record.held_on_waking is False and not record.acted, record
    assert record.held_until <= record.blocked_at + block, record
    assert won_at > record.held_until, "the follower led before the blocked leader's renew deadline"
    # A loop that stays blocked does not keep the leadership: the next candidate leads before it wakes.
    assert won_at < record.blocked_at + block, (won_at - record.blocked_at, record)
    assert record.lost_reason is not None and "the event loop was blocked for" in record.lost_reason, record
    lost = [r for r in caplog.records if r.levelno == logging.WARNING and "leadership lost" in r.getMessage()]
    assert any("the event loop was blocked for" in r.getMessage() for r in lost), [r.getMessage() for r in lost]


async def test_the_loops_lag_names_a_block_that_nearly_cost_or_cost_a_leadership(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In-memory (renew deadline 1 s, a confirmation every 0.25 s): a 0.1 s block is not named, a 0.6 s one is
    a WARNING with the leadership kept, a 1.5 s one is named in the loss, and ``held`` is false on waking."""
    from aioelect.testing import MemoryElector

    caplog.set_level(logging.WARNING, logger="aioelect")

    def blocks() -> list[str]:
        return [r.getMessage() for r in caplog.records if "the event loop was blocked for" in r.getMessage()]

    async with MemoryElector(name=unique_name("lag"), renew_deadline=1.0, check_interval=0.25) as elector:
        lead = await elector.acquire()
        await asyncio.sleep(0.5)
        time.sleep(0.1)  # noqa: ASYNC251 - a short synchronous call
        await asyncio.sleep(0.5)
        assert lead.held and blocks() == []
        time.sleep(0.6)  # noqa: ASYNC251 - a long one, shorter than the renew deadline
        assert lead.held
        await asyncio.sleep(0.5)
        assert lead.held
        kept = blocks()
        assert len(kept) == 1 and "leadership kept" in kept[0] and "blocked for 0." in kept[0], kept
        time.sleep(1.5)  # noqa: ASYNC251 - longer than the renew deadline
        assert not lead.held
        with pytest.raises(LeadershipLost):
            lead.check()
        with anyio.fail_after(5):
            await lead.wait_lost()
        reason = lead.lost_reason
        assert reason is not None and "the event loop was blocked for 1." in reason, reason
        assert any("leadership lost" in m for m in blocks()), blocks()
