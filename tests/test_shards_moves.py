"""aioelect.Shards moves no more names than the new balance needs when an instance joins or leaves gracefully.

40 names over instances a to d, then e joins, then a leaves: the work starts counted by the fenced register of
tests/test_shards.py after each event are exactly the newcomer's share (join) and the leaver's names (leave). A
name that goes from one instance to a second and then a third counts twice: every start on a new owner is a move.
An exhaustive search shows why no assignment computed from the live set alone could promise that.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import Elector, EtcdElector, EtcdSession, Shards
from aioelect.testing import MemoryElector

from .test_shards import Fleet, Register

pytestmark = pytest.mark.timeout(120)

NAMES = 40


def stateless_minimal_exists(names: int, universe: int) -> bool:
    """Whether some assignment, a function of the live set alone (every non-empty subset of ``universe``
    instances), is balanced (each live instance ``names // m`` names or one more) and moves, when one instance
    joins or leaves, only the names the newcomer takes or the leaver had. Exhaustive search, largest sets first:
    a set's assignment keeps every name each one-larger set gives to an instance it still has."""
    instances = range(universe)
    subsets = [frozenset(c) for k in range(universe, 0, -1) for c in itertools.combinations(instances, k)]
    chosen: dict[frozenset[int], tuple[int, ...]] = {}

    def choices(live: frozenset[int]) -> Iterator[tuple[int, ...]]:
        fixed: dict[int, int] = {}
        for extra in instances:
            if extra in live:
                continue
            for name, owner in enumerate(chosen[live | {extra}]):
                if owner != extra:
                    if fixed.get(name, owner) != owner:
                        return
                    fixed[name] = owner
        floor = names // len(live)
        free = [n for n in range(names) if n not in fixed]
        for owners in itertools.product(sorted(live), repeat=len(free)):
            assignment = {**fixed, **dict(zip(free, owners, strict=True))}
            loads = [list(assignment.values()).count(m) for m in live]
            if all(floor <= load <= floor + 1 for load in loads):
                yield tuple(assignment[n] for n in range(names))

    def search(i: int) -> bool:
        if i == len(subsets):
            return True
        for assignment in choices(subsets[i]):
            chosen[subsets[i]] = assignment
            if search(i + 1):
                return True
        chosen.pop(subsets[i], None)
        return False

    return search(0)


def test_no_assignment_of_the_live_set_alone_moves_only_what_the_balance_needs() -> None:
    """Why Shards keeps counts, not a fixed assignment: 3 names over 5 possible instances defeat every function of
    the live set (while smaller cases have one)."""
    assert stateless_minimal_exists(3, 4)
    assert stateless_minimal_exists(2, 5)
    assert not stateless_minimal_exists(3, 5)


async def quiet_moves(fleet: Fleet, register: Register, before: int, timeout: float) -> int:
    """Once the fleet is balanced and no work has started for 1.5 s: the work starts since ``before``."""
    await fleet.settle(NAMES, timeout=timeout)
    while True:
        starts = register.starts.total()
        await asyncio.sleep(1.5)
        await fleet.settle(NAMES, timeout=timeout)
        if register.starts.total() == starts:
            return starts - before


async def join_and_leave(fleet: Fleet, register: Register) -> None:
    for identity in "abcd":
        fleet.start(identity)
    await quiet_moves(fleet, register, 0, timeout=60)
    assert sorted(fleet.loads().values()) == [10, 10, 10, 10]

    before = register.starts.total()
    newcomer = fleet.start("e")
    moved = await quiet_moves(fleet, register, before, timeout=60)
    assert sorted(fleet.loads().values()) == [8, 8, 8, 8, 8]
    assert moved == len(newcomer.owned) == 8, f"{moved} names moved on a join that needs {len(newcomer.owned)}"

    leaving = fleet.instances["a"]
    needed = len(leaving.owned)
    before = register.starts.total()
    await fleet.stop("a")
    moved = await quiet_moves(fleet, register, before, timeout=60)
    assert sorted(fleet.loads().values()) == [10, 10, 10, 10]
    assert moved == needed == 8, f"{moved} names moved on a leave that needs {needed}"
    assert register.violations == []


@pytest.fixture
async def shared(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[str], Callable[[str], Elector]]]:
    """Per identity, the elector factory of its own shared session on the parametrized backend."""
    kind = request.param
    sessions: list[Any] = []

    async def opened(identity: str) -> Any:
        if kind == "etcd":
            session: Any = EtcdSession(request.getfixturevalue("etcd").endpoints, ttl=3)
        else:
            session = aioelect.PostgresSession(request.getfixturevalue("postgres_dsn"), identity=identity, lease=6)
        await session.__aenter__()
        sessions.append(session)
        return session

    made: dict[str, Any] = {}
    for identity in "abcde":
        made[identity] = await opened(identity)

    def electors(identity: str) -> Callable[[str], Elector]:
        session = made[identity]
        if kind == "etcd":
            return lambda n: EtcdElector(session=session, name=n)
        return lambda n: aioelect.PostgresElector(session=session, name=n)

    try:
        yield electors
    finally:
        for session in sessions:
            with anyio.CancelScope(shield=True):
                await session.aclose()


async def fleet_moves_only_what_the_balance_needs(make: Callable[[str, str], Shards]) -> None:
    """:func:`join_and_leave` on a fleet of ``make(group, identity)``; every name's work stopped at the end."""
    group = f"shards-{secrets.token_hex(3)}"
    register = Register()
    fleet = Fleet(lambda identity: make(group, identity), register)
    try:
        await join_and_leave(fleet, register)
    finally:
        await fleet.close()
    assert register.running == {}


@pytest.mark.parametrize("shared", ["etcd", "postgres"], indirect=True)
async def test_shared_sessions_move_only_what_the_balance_needs(
    shared: Callable[[str], Callable[[str], Elector]],
) -> None:
    await fleet_moves_only_what_the_balance_needs(
        lambda group, identity: Shards(
            NAMES, group=group, identity=identity, electors=shared(identity), max_instances=6
        )
    )


async def test_memory_moves_only_what_the_balance_needs() -> None:
    await fleet_moves_only_what_the_balance_needs(
        lambda group, identity: Shards(
            NAMES,
            group=group,
            identity=identity,
            electors=lambda n: MemoryElector(name=n, renew_deadline=5),
            max_instances=6,
            settle=0.02,
        )
    )
