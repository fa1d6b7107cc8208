"""Fenced state in the election's own backend (FencedStore), on real servers: a deposed leader's write is refused."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import Elector, FencedStore, LeadershipLost, UsageError
from aioelect.core._backend import Written

from .backends import CASES, BackendCase, Follower, unique_name

#: The backends with fenced state, and the options their candidates need for it.
FENCED = {
    "memory": {},
    "etcd": {},
    "redis": {},
    "mysql": {},
    "mysql-shared": {},
    "file": {},
    "postgres": {"schema": "public"},
    "postgres-shared": {"schema": "public"},
}


@pytest.fixture(params=sorted(FENCED))
def case(request: pytest.FixtureRequest) -> BackendCase:
    return CASES[request.param](request)


def make(case: BackendCase, name: str, identity: str) -> Elector:
    return case.make(name, identity=identity, **FENCED[case.kind])


async def test_put_get_and_compare_and_set(case: BackendCase) -> None:
    before = await case.leftovers() if case.leftovers is not None else None
    async with make(case, unique_name(), "a") as elector:
        store = FencedStore(elector)
        assert await store.get("cursor") is None
        lead = await elector.acquire()
        await store.put(lead, "cursor", {"at": 41, "names": ["x", "é"]})
        assert await store.get("cursor") == {"at": 41, "names": ["x", "é"]}
        assert await store.compare_and_set(lead, "cursor", {"names": ["x", "é"], "at": 41}, 42) is True
        assert await store.compare_and_set(lead, "cursor", 41, 43) is False  # the value is 42: nothing written
        assert await store.get("cursor") == 42
        assert await store.compare_and_set(lead, "fresh", None, "first") is True  # None: no value yet
        assert await store.compare_and_set(lead, "fresh", None, "second") is False
        assert await store.get("fresh") == "first"
        await lead.release()
    if case.leftovers is not None:  # the store's connection went with the elector (the server sees it soon after)
        with anyio.fail_after(10):
            while await case.leftovers() != before:
                await anyio.sleep(0.05)


async def test_a_leader_deposed_from_outside_cannot_write_once_the_next_one_leads(case: BackendCase) -> None:
    """The lock taken away by the server or an operator (KILL, lease revoked, key deleted, lock file deleted)."""
    assert case.depose is not None
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        store_a, store_b = FencedStore(a), FencedStore(b)
        lead_a = await a.acquire()
        await store_a.put(lead_a, "cursor", "a")
        follower = Follower(b)
        try:
            await case.depose(a)
            lead_b = await follower.wait(timeout=30)
            late = await store_a._store.write(lead_a._hold, "cursor", b'"late"', compare=False, expected=None)
            assert late is Written.FENCED
            await store_b.put(lead_b, "cursor", "b")
            assert await store_a._store.write(lead_a._hold, "cursor", b'"late"', compare=False, expected=None) is (
                Written.FENCED
            )
            with pytest.raises(LeadershipLost):
                await store_a.put(lead_a, "cursor", "late")
            assert await store_b.get("cursor") == "b"
        finally:
            await follower.close()


async def test_a_deposed_leaders_late_write_is_refused_and_the_successors_value_stands(case: BackendCase) -> None:
    """Kleppmann's case in miniature: A is handed on while its write is in flight; the server refuses it."""
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        store_a, store_b = FencedStore(a), FencedStore(b)
        lead_a = await a.acquire()
        await store_a.put(lead_a, "last-tick", 1)
        follower = Follower(b)
        try:
            await lead_a.release()  # A stops leading (its lease gone, or released); B takes over
            lead_b = await follower.wait(timeout=30)
            assert lead_b.token is not None and lead_a.token is not None and lead_b.token > lead_a.token
            await store_b.put(lead_b, "last-tick", 2)
            # A's write arrives now, sent by a leader that believed itself held when it sent it: the server's
            # check, not A's own clock, refuses it.
            late = await store_a._store.write(lead_a._hold, "last-tick", b"99", compare=False, expected=None)
            assert late is Written.FENCED
            late = await store_a._store.write(lead_a._hold, "last-tick", b"99", compare=True, expected=b"2")
            assert late is Written.FENCED
            with pytest.raises(LeadershipLost):
                await store_a.put(lead_a, "last-tick", 99)
            assert await store_a.get("last-tick") == 2
            assert await store_b.get("last-tick") == 2
        finally:
            await follower.close()


async def test_bad_input_writes_nothing(case: BackendCase) -> None:
    name = unique_name()
    async with make(case, name, "a") as elector, make(case, unique_name(), "other") as other:
        store = FencedStore(elector)
        lead = await elector.acquire()
        await store.put(lead, "k", "kept")
        with pytest.raises(ValueError, match="at most 65536"):
            await store.put(lead, "k", "x" * 70_000)
        with pytest.raises(TypeError, match="JSON"):
            await store.put(lead, "k", {1.5: object()})
        with pytest.raises(TypeError, match="JSON"):
            await store.put(lead, "k", float("nan"))
        with pytest.raises(ValueError, match="None"):
            await store.put(lead, "k", None)
        with pytest.raises(ValueError, match="key"):
            await store.put(lead, "with space", 1)
        other_lead = await other.acquire()
        with pytest.raises(UsageError, match="another elector"):
            await store.put(other_lead, "k", "from another election")
        assert await store.get("k") == "kept"
        await other_lead.release()
        await lead.release()
    with pytest.raises(aioelect.ElectorClosed):
        await store.get("k")


async def test_a_backend_without_fenced_state_says_so() -> None:
    async with aioelect.LocalElector(name=unique_name()) as elector:
        with pytest.raises(UsageError, match="local backend keeps no fenced state"):
            FencedStore(elector)


class Gate:
    """An interceptor at the backend's seam that holds the fenced write back while armed: a frozen leader's write."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.armed = False
        self.held = asyncio.Event()
        self.opened = asyncio.Event()

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if self.armed and what == self.what:
            self.held.set()
            await self.opened.wait()
        return await send()


#: Where each backend's fenced write passes the seam, and how it is named there.
SEAMS: dict[str, tuple[Callable[[Elector], Any], str]] = {
    "etcd": (lambda elector: elector._backend.conn, "write state"),
    "redis": (lambda elector: elector._backend, "state write"),
    "mysql": (lambda elector: elector._backend, ""),  # the state connection names no identity
    "postgres": (lambda elector: elector._backend, ""),
}


@pytest.mark.parametrize("kind", sorted(SEAMS))
async def test_a_frozen_leaders_write_in_flight_is_refused_by_the_server(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Kleppmann's case: A checks that it leads, freezes with its write in flight, is deposed and replaced; the
    write arrives after B's and is refused, and B's value stands."""
    case = CASES[kind](request)
    assert case.depose is not None
    seam, what = SEAMS[kind]
    name = unique_name()
    async with make(case, name, "a") as a, make(case, name, "b") as b:
        gate = Gate(what)
        seam(a).interceptor = gate
        store_a, store_b = FencedStore(a), FencedStore(b)
        lead_a = await a.acquire()
        await store_a.put(lead_a, "last-tick", 1)
        gate.armed = True
        late = asyncio.create_task(store_a.put(lead_a, "last-tick", 99))
        follower = Follower(b)
        try:
            with anyio.fail_after(10):
                await gate.held.wait()  # A passed its own check: its write is on its way
            await case.depose(a)
            lead_b = await follower.wait(timeout=30)
            await store_b.put(lead_b, "last-tick", 2)
            gate.opened.set()
            with pytest.raises(LeadershipLost, match="newer than"):
                await asyncio.wait_for(late, 30)
            assert await store_b.get("last-tick") == 2
        finally:
            gate.opened.set()
            await asyncio.gather(late, return_exceptions=True)
            await follower.close()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
async def test_a_late_write_is_refused_while_a_candidate_without_fencing_leads(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """a candidate of the same election with ``fencing=False`` (a rolling change of the option, a cron job
    run with ``--no-fencing``) takes no token and leaves the token row alone (MySQL), or bumps it with no token of its
    own. A deposed leader's write in flight then commits while that candidate leads, although the exactly-once page
    says a write commits before the next leadership starts, or not at all."""
    case = CASES[kind](request)
    assert case.depose is not None
    seam, what = SEAMS[kind]
    name = unique_name()
    extra = FENCED[kind]
    async with (
        case.make(name, identity="a", **extra) as a,
        case.make(name, identity="b", fencing=False) as b,
    ):
        gate = Gate(what)
        seam(a).interceptor = gate
        store_a = FencedStore(a)
        lead_a = await a.acquire()
        await store_a.put(lead_a, "last-tick", 1)
        gate.armed = True
        late = asyncio.create_task(store_a.put(lead_a, "last-tick", 99))
        follower = Follower(b)
        try:
            with anyio.fail_after(10):
                await gate.held.wait()
            await case.depose(a)
            lead_b = await follower.wait(timeout=30)
            assert lead_b.held and lead_b.token is None
            gate.opened.set()
            outcome: object
            try:
                await asyncio.wait_for(late, 30)
                outcome = "committed"
            except LeadershipLost:
                outcome = "refused"
            print(f"MEASURED {kind}: deposed leader's write while a fencing=False candidate leads: {outcome}")
            assert lead_b.held
            assert outcome == "refused", "a deposed leader's write committed while the next leader (no fencing) led"
        finally:
            gate.opened.set()
            await asyncio.gather(late, return_exceptions=True)
            await follower.close()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
async def test_a_state_session_the_server_ended_while_idle_is_replaced_before_the_write(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The store's session has the election's ``lease`` as its idle bound: a leader that wrote nothing for longer
    finds it ended by the server. Its next write begins on a new session, where the fence answers: committed for
    the leader, refused for a deposed one (never BackendUnavailable for a session that was only idle)."""
    case = CASES[kind](request)
    options = {**FENCED[kind], "lease": 3, "check_interval": 0.2, "check_timeout": 0.5}
    name = unique_name()
    async with case.make(name, identity="a", **options) as a, case.make(name, identity="b", **options) as b:
        store_a, store_b = FencedStore(a), FencedStore(b)
        lead_a = await a.acquire()
        await store_a.put(lead_a, "cursor", 1)
        await anyio.sleep(4.5)  # past the idle bound: the server ends the store's session
        assert lead_a.held
        await store_a.put(lead_a, "cursor", 2)
        assert await store_b.get("cursor") == 2
        await anyio.sleep(4.5)
        assert case.depose is not None
        follower = Follower(b)
        try:
            await case.depose(a)
            lead_b = await follower.wait(timeout=30)
            await store_b.put(lead_b, "cursor", 3)
            with pytest.raises(LeadershipLost):
                await store_a.put(lead_a, "cursor", "late")
            assert await store_b.get("cursor") == 3
        finally:
            await follower.close()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
async def test_a_grant_reads_the_handover_note_on_a_new_session_when_the_kept_one_was_ended_while_idle(
    kind: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """Every grant reads the election's handover note before it becomes a leadership, on the fenced state's
    session. A ``FencedStore`` keeps that session open; once the server ended it for sitting idle past
    ``lease``, the next grant's read runs on a new session: the grant becomes a leadership, with no WARNING that
    the note went unread."""
    case = CASES[kind](request)
    options = {**FENCED[kind], "lease": 3, "check_interval": 0.2, "check_timeout": 0.5}
    async with case.make(unique_name(), identity="a", **options) as a:
        store = FencedStore(a)
        lead = await a.acquire()
        await store.put(lead, "cursor", 1)  # the store's session, kept open
        await lead.release()
        await anyio.sleep(4.5)  # past the idle bound: the server ends the kept session
        caplog.clear()
        lead = await a.acquire()
        assert lead.held
        await store.put(lead, "cursor", 2)
        await lead.release()
        assert await store.get("cursor") == 2
    assert not [r for r in caplog.records if r.name == "aioelect" and r.levelno >= logging.WARNING]
