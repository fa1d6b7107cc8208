"""Leadership.release() handing over to the waiting candidate of a higher priority, on real servers."""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from aioelect import current_leadership
from aioelect.core._elector import backend_of
from aioelect.core._handover import WAITING_KEY

from .backends import CASES, BackendCase, Follower, unique_name
from .test_handover import case, make, record

__all__ = ["case"]


async def _post_waiting(elector: object, record_: dict[str, object] | bytes) -> None:
    store = elector._gate.store()  # type: ignore[attr-defined]
    assert store is not None
    raw = record_ if isinstance(record_, bytes) else json.dumps(record_).encode()
    await store.post(WAITING_KEY, raw)


async def test_release_with_an_invalid_waiting_identity_still_releases(case: BackendCase) -> None:
    """A waiting record naming an identity no elector could have (empty): release() must not raise."""
    name = unique_name()
    async with make(case, name, "leader") as leader:
        leader.set_priority(0)
        lead = await leader.acquire()
        await _post_waiting(leader, {"identity": "", "priority": 5, "until": time.time() + 30})
        with anyio.fail_after(15):
            await lead.release()  # ValueError from validate_identity escapes here
        assert not lead.held


async def test_release_with_an_overflowing_waiting_priority_still_releases(case: BackendCase) -> None:
    """A waiting record whose priority is 1e999 (JSON reads it as inf): release() must not raise."""
    name = unique_name()
    async with make(case, name, "leader") as leader:
        leader.set_priority(0)
        lead = await leader.acquire()
        await _post_waiting(leader, b'{"identity": "x", "priority": 1e999, "until": 1e300}')
        with anyio.fail_after(15):
            await lead.release()  # OverflowError (int(inf)) escapes here
        assert not lead.held


@pytest.mark.parametrize("successor_priority", [None, 1], ids=["plain", "handover"])
async def test_release_inside_work_behaves_as_a_plain_release(
    case: BackendCase, successor_priority: int | None
) -> None:
    """Work that calls release() and then returns a result: with a waiting candidate of a higher priority, the
    release is a step-down, which cancels the calling work; a plain release lets it return."""
    name = unique_name()
    async with make(case, name, "old") as old, make(case, name, "new") as new:
        old.set_priority(0)
        new.set_priority(successor_priority, settle=60)  # never asks by itself: only the release hands over
        events = record(old, new)
        after_release: list[str] = []

        async def work() -> int:
            while not any(e.kind == "acquired" and e.identity == "old" for e in events):
                await asyncio.sleep(0.05)
            follower = Follower(new)
            try:
                await asyncio.sleep(2.0)  # new campaigns and says it waits
                await current_leadership().release()
                await asyncio.sleep(0)
                after_release.append("ran")
                return 42
            finally:
                followers.append(follower)

        followers: list[Follower] = []
        try:
            with anyio.fail_after(30):
                result = await old.run(work)  # hangs: the work is cancelled, run() campaigns again
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            if successor_priority is not None:
                assert stepped == [("old", "release", "new")], stepped  # the release did hand over
            assert result == 42 and after_release == ["ran"], (result, after_release)
        finally:
            for follower in followers:
                await follower.close()


async def test_a_successor_that_stopped_right_after_saying_it_waits(case: BackendCase) -> None:
    """The newer version campaigns, says it waits, and is stopped; the old leader releases at once. A live peer of
    the old version waits: it must lead within the release window (5 s) and a poll, never later."""
    name = unique_name()
    async with make(case, name, "old-0") as old0, make(case, name, "old-1") as old1, make(case, name, "new") as new:
        for elector, priority in ((old0, 0), (old1, 0), (new, 1)):
            elector.set_priority(priority, settle=60)
        events = record(old0, old1, new)
        lead = await old0.acquire()
        peer = Follower(old1)
        successor = Follower(new)
        try:
            await asyncio.sleep(1.5)  # new says it waits
            await successor.close()  # stopped (cancelled) before it led
            started = time.monotonic()
            await lead.release()
            released = time.monotonic() - started
            await peer.wait(timeout=30)
            gap = time.monotonic() - started
            print(f"{case.kind}: release() took {released:.3f}s; old-1 led {gap:.3f}s after it began")
            stepped = [(e.identity, e.reason, e.successor) for e in events if e.kind == "stepped_down"]
            assert stepped == [("old-0", "release", "new")], stepped  # handed to the stopped candidate
            assert gap < 5.0 + 1.5, gap
        finally:
            await peer.close()
            await successor.close()


class _Hang:
    """An interceptor under which the exchanges ``which`` names never answer (a server that stopped answering)."""

    def __init__(self, which: Callable[[str], bool]) -> None:
        self.which = which

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if self.which(what):
            await asyncio.sleep(3600)
        return await send()


@pytest.mark.parametrize("hung", ["state write", "state", "everything"])
async def test_release_with_the_state_unanswering_is_about_as_prompt_as_a_plain_release(
    request: pytest.FixtureRequest, hung: str
) -> None:
    """etcd (its state goes through the interceptor): the leader of priority 0 releases (SIGTERM) while a
    candidate of priority 1 waits and the state stops answering. The plain release (no priority) takes the
    same time plus at most the 1 s bound on the read of who waits."""
    case = CASES["etcd"](request)
    which = {
        "state write": lambda what: what == "write state",
        "state": lambda what: "state" in what,
        "everything": lambda what: True,
    }[hung]
    took: dict[int | None, float] = {}
    for priority in (None, 0):
        name = unique_name()
        async with make(case, name, "old") as old, make(case, name, "new") as new:
            old.set_priority(priority)
            new.set_priority(1, settle=60)
            lead = await old.acquire()
            follower = Follower(new)
            try:
                await asyncio.sleep(2.0)  # new says it waits
                backend_of(old).intercept(_Hang(which))
                started = time.monotonic()
                await asyncio.wait_for(lead.release(), 60)
                took[priority] = time.monotonic() - started
                await follower.wait(timeout=30)
            finally:
                backend_of(old).intercept(None)
                await follower.close()
    print(f"etcd, {hung} unanswering: release() took {took[None]:.3f}s plain, {took[0]:.3f}s with a priority")
    assert took[0] < took[None] + 1.5, took  # the note write's own 5 s bound adds 5 s


async def test_a_malformed_step_down_request_does_not_stop_the_leader_serving_requests(case: BackendCase) -> None:
    """A step-down request naming an identity no candidate could have: the leader ignores it, and still acts on
    the next, well-formed, request (it raised ValueError in the serving task, which ended for the leadership)."""
    from aioelect.core._handover import REQUEST_KEY

    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        a.set_priority(0)
        lead = await a.acquire()
        store = a._gate.store()
        assert store is not None

        def request(id_: str, successor: str) -> bytes:
            fields = {"id": id_, "successor": successor, "timeout": 5, "until": time.time() + 30, "by": "red"}
            return json.dumps({**fields, "reason": "red"}).encode()

        await store.post(REQUEST_KEY, request("bad", ""))
        await asyncio.sleep(2.5)  # two polls of the serving task
        assert lead.held
        follower = Follower(b)
        try:
            await store.post(REQUEST_KEY, request("good", "b"))
            await follower.wait(timeout=15)
            assert not lead.held
        finally:
            await follower.close()


#: Set in the task that calls release() (and the tasks it starts: etcd's calls run in tasks of their own).
_RELEASING: contextvars.ContextVar[bool] = contextvars.ContextVar("_RELEASING", default=False)


class _Slow:
    """etcd exchanges made slow: the state reads of release(), every state write, and the resign; the first state
    read of anyone else (the leader's serving task, polling for requests) starts release()."""

    def __init__(self, start_release: Callable[[], None]) -> None:
        self.start_release: Callable[[], None] | None = start_release
        self.resigned_at: float | None = None

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if what == "read state" and _RELEASING.get():
            await asyncio.sleep(0.9)  # within the 1 s bound on the read of who waits
        elif what == "read state" and self.start_release is not None:
            self.start_release, start = None, self.start_release
            start()
        elif what == "write state":
            await asyncio.sleep(1.5)
        elif what == "resign":
            await asyncio.sleep(1.0)
            reply = await send()
            self.resigned_at = time.monotonic()
            return reply
        return await send()


async def test_release_racing_a_step_down_request_returns_once_the_backend_let_go(
    request: pytest.FixtureRequest,
) -> None:
    """etcd. The leader (priority 0) releases while a candidate of priority 1 waits; meanwhile its serving task
    acts on a step-down request (wait=False). release() must return only once the backend has let go (its
    docstring), not as soon as the request's step-down was asked for."""
    from aioelect.core._handover import REQUEST_KEY

    case = CASES["etcd"](request)
    name = unique_name()
    async with make(case, name, "old") as old, make(case, name, "new") as new:
        old.set_priority(0)
        new.set_priority(1, settle=60)
        lead = await old.acquire()
        follower = Follower(new)
        returned: list[float] = []
        releasing: list[asyncio.Task[None]] = []

        async def release() -> None:
            _RELEASING.set(True)
            await lead.release()
            returned.append(time.monotonic())

        def start_release() -> None:
            releasing.append(asyncio.ensure_future(release()))

        slow = _Slow(start_release)
        try:
            await asyncio.sleep(2.0)  # new says it waits
            store = old._gate.store()
            assert store is not None
            fields = {"id": "r", "successor": "new", "timeout": 5, "until": time.time() + 30, "by": "red"}
            backend_of(old).intercept(slow)
            await store.post(REQUEST_KEY, json.dumps({**fields, "reason": "red"}).encode())
            with anyio.fail_after(30):
                while not releasing:
                    await asyncio.sleep(0.01)
                await releasing[0]
                await follower.wait(timeout=20)
            print(f"etcd: release() returned {returned[0] - (slow.resigned_at or 0):+.3f}s after the resign")
            assert slow.resigned_at is not None and returned[0] >= slow.resigned_at
        finally:
            backend_of(old).intercept(None)
            await follower.close()
