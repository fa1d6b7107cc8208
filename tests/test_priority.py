"""Priorities on real servers: a higher-priority candidate takes over once, and leadership never flaps."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest

from aioelect import Elector, Event

from .backends import BackendCase, Follower, unique_name
from .test_handover import case, make, record

__all__ = ["case"]  # the fixture, shared with test_handover


async def test_a_higher_priority_candidate_takes_over_once_and_it_never_flaps(case: BackendCase) -> None:
    name = unique_name()
    async with (
        make(case, name, "old-1") as old1,
        make(case, name, "old-2") as old2,
        make(case, name, "new-1") as new1,
        make(case, name, "new-2") as new2,
    ):
        for elector, priority in ((old1, 0), (old2, 0), (new1, 1), (new2, 1)):
            elector.set_priority(priority, settle=0.3)
        events: list[Event] = record(old1, old2, new1, new2)
        lead_old = await old1.acquire()
        followers = [Follower(old2)]
        try:
            await asyncio.sleep(1.0)  # same priority: old-2 waits, never asks
            assert lead_old.held
            followers += [Follower(new1), Follower(new2)]  # the new version starts
            waits = [asyncio.ensure_future(f.won.wait()) for f in followers]
            done, pending = await asyncio.wait(
                waits, timeout=case.takeover_bound + 10, return_when=asyncio.FIRST_COMPLETED
            )
            for wait in pending:
                wait.cancel()
            assert done, "no higher-priority candidate took over"
            await asyncio.sleep(2.0)  # settle times pass: nobody asks any more
            acquired = [e.identity for e in events if e.kind == "acquired"]
            assert acquired[0] == "old-1" and len(acquired) == 2 and acquired[1].startswith("new-"), acquired
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-1", "priority", acquired[1])]
            # Churn: the old leader campaigns again, and the other new one keeps waiting: still no move.
            followers.append(Follower(old1))
            await asyncio.sleep(2.0)
            assert [e.identity for e in events if e.kind == "acquired"] == acquired
        finally:
            for follower in followers:
                await follower.close()


async def test_a_rolling_deploy_with_priorities_moves_leadership_once(case: BackendCase) -> None:
    """3 instances of priority 0 replaced one at a time by 3 of priority 1, each old one stopped (its
    ``Elector.run`` cancelled, as ``aioelect.run`` does on SIGTERM) once the new one has waited ``settle``."""
    name, settle = unique_name(), 0.3
    async with contextlib.AsyncExitStack() as stack:
        olds = [await stack.enter_async_context(make(case, name, f"old-{i}")) for i in range(3)]
        news = [await stack.enter_async_context(make(case, name, f"new-{i}")) for i in range(3)]
        for elector in olds + news:
            elector.set_priority(1 if elector in news else 0, settle=settle)
        events: list[Event] = record(*olds, *news)
        tasks: dict[Elector, asyncio.Task[None]] = {}

        def start(elector: Elector) -> None:
            tasks[elector] = asyncio.create_task(elector.run(asyncio.Event().wait))

        async def stop(elector: Elector) -> None:
            tasks[elector].cancel()
            await asyncio.wait_for(asyncio.gather(tasks[elector], return_exceptions=True), 15)

        try:
            start(olds[0])
            with anyio.fail_after(10):
                while not any(e.kind == "acquired" for e in events):
                    await asyncio.sleep(0.05)
            start(olds[1])
            start(olds[2])
            await asyncio.sleep(1.0)
            for old, new in zip(olds, news, strict=True):
                start(new)
                # The deploy's readiness wait: settle, the leader's 1 s poll for requests, and a generous margin.
                await asyncio.sleep(settle + case.takeover_bound + 2.0)
                await stop(old)
            await asyncio.sleep(2.0)  # any move still to come
            acquired = [e.identity for e in events if e.kind == "acquired"]
            assert acquired == ["old-0", "new-0"], acquired
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-0", "priority", "new-0")]
            assert await news[2].leader() == "new-0"
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 15)


async def test_a_leader_stopped_before_any_settle_time_passes_to_the_waiting_newer_version(case: BackendCase) -> None:
    """The fast rolling deploy: each old instance is stopped as soon as its replacement is campaigning (its
    "campaigning" event; the default 10 s settle time far from over). The stopping leader releases to the
    waiting candidate of a higher priority, so leadership moves once, to the new version, never to an old
    peer that happened to wait first."""
    name = unique_name()
    async with contextlib.AsyncExitStack() as stack:
        olds = [await stack.enter_async_context(make(case, name, f"old-{i}")) for i in range(3)]
        news = [await stack.enter_async_context(make(case, name, f"new-{i}")) for i in range(3)]
        for elector in olds + news:
            elector.set_priority(1 if elector in news else 0)
        events: list[Event] = record(*olds, *news)
        tasks: dict[Elector, asyncio.Task[None]] = {}

        def start(elector: Elector) -> None:
            tasks[elector] = asyncio.create_task(elector.run(asyncio.Event().wait))

        async def stop(elector: Elector) -> None:
            tasks[elector].cancel()
            await asyncio.wait_for(asyncio.gather(tasks[elector], return_exceptions=True), 15)

        try:
            start(olds[0])
            with anyio.fail_after(10):
                while not any(e.kind == "acquired" for e in events):
                    await asyncio.sleep(0.05)
            start(olds[1])
            start(olds[2])
            await asyncio.sleep(1.0)
            for old, new in zip(olds, news, strict=True):
                start(new)
                with anyio.fail_after(10):
                    while not any(e.kind == "campaigning" and e.identity == new.identity for e in events):
                        await asyncio.sleep(0.01)
                await stop(old)
            await asyncio.sleep(2.0)  # any move still to come
            acquired = [e.identity for e in events if e.kind == "acquired"]
            assert acquired == ["old-0", "new-0"], acquired
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-0", "release", "new-0")]
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 15)


async def test_bad_priorities_are_refused() -> None:
    from aioelect.testing import MemoryElector

    async with MemoryElector(name=unique_name()) as a:
        with pytest.raises(ValueError):
            a.set_priority(1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            a.set_priority(1, settle=0)


def test_aioelect_priority_is_read_by_from_env_and_checked(tmp_path: object) -> None:
    import aioelect

    env = {"AIOELECT_BACKEND": "memory", "AIOELECT_NAME": unique_name(), "AIOELECT_PRIORITY": "7"}
    elector = aioelect.from_env(env)
    assert elector._gate.priority is not None and elector._gate.priority.value == 7
    assert aioelect.from_env(env, priority=2)._gate.priority.value == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="AIOELECT_PRIORITY must be a whole number"):
        aioelect.from_env({**env, "AIOELECT_PRIORITY": "high"})
