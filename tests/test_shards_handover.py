"""Shards.drain() and Shards.hand_over(): names leave an instance by release, to the instances that should take them.

The instances run in one event loop with a fenced register per name (tests/test_shards.py's Register): a name
whose work starts while another instance's runs is a violation.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from aioelect import Shards, UsageError
from aioelect.testing import MemoryElector

from .test_shards import Fleet, Register

pytestmark = pytest.mark.timeout(120)

#: A released name is taken within this (the claim retry is 1 s); every lease below is far longer.
RELEASED_WITHIN = 4.0
#: The lease or TTL of the server backends here: a name left to expire would take this long to move.
LEASE = 20


def environ_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """What Shards reads to build its electors on ``kind``, with leases far longer than RELEASED_WITHIN."""
    if kind == "file":
        return {"AIOELECT_FILE": str(tmp_path / "lock")}
    if kind == "redis":
        return {"AIOELECT_REDIS_URL": request.getfixturevalue("redis_url"), "AIOELECT_LEASE": str(LEASE)}
    if kind == "etcd":
        endpoints = ",".join(request.getfixturevalue("etcd_endpoints"))
        return {"AIOELECT_ETCD_ENDPOINTS": endpoints, "AIOELECT_LEASE": str(LEASE)}
    if kind == "postgres":
        # schema: the leaders table the handover notes live beside.
        return {"AIOELECT_POSTGRES_DSN": request.getfixturevalue("postgres_dsn"), "AIOELECT_SCHEMA": "public"}
    if kind == "mysql":
        return {"AIOELECT_MYSQL_DSN": request.getfixturevalue("mysql_dsn")}
    raise AssertionError(kind)


def fleet_on(kind: str, request: pytest.FixtureRequest, tmp_path: Path, names: int, register: Register) -> Fleet:
    group = f"ho-{secrets.token_hex(3)}"
    if kind == "memory":
        return Fleet(
            lambda identity: Shards(
                names,
                group=group,
                identity=identity,
                electors=lambda n: MemoryElector(name=n, renew_deadline=5),
                max_instances=4,
            ),
            register,
        )
    environ = environ_of(kind, request, tmp_path)
    return Fleet(
        lambda identity: Shards(names, group=group, identity=identity, max_instances=4, environ=environ), register
    )


async def until(what: str, check: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not check():
            await asyncio.sleep(0.02)
    return time.monotonic() - start


def owners(fleet: Fleet) -> dict[str, str]:
    """Each owned name's owner; a name owned twice fails."""
    found: dict[str, str] = {}
    for identity, shards in fleet.instances.items():
        for name in shards.owned:
            assert name not in found, f"{name} owned by {found[name]} and {identity}"
            found[name] = identity
    return found


@pytest.mark.parametrize("kind", ["memory", "file", "redis", "etcd", "postgres", "mysql"])
async def test_drain_moves_every_name_by_release_and_stays_out(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Three instances, 9 names: one drains; the two others own every name, each taken within RELEASED_WITHIN of
    its release (the leases are LEASE seconds), no name owned twice, and the drained instance asks for none again."""
    register = Register()
    fleet = fleet_on(kind, request, tmp_path, 9, register)
    try:
        for identity in ("a", "b", "c"):
            fleet.start(identity)
        await fleet.settle(9, timeout=60)
        leaving = fleet.instances["a"]
        mine = set(leaving.owned)
        assert mine
        began = time.monotonic()
        await leaving.drain(timeout=30)
        released = time.monotonic()
        assert leaving.owned == frozenset() and leaving.draining
        stay = {"b", "c"}
        taken = await until(
            "b and c own every name",
            lambda: set(owners(fleet)) == set(leaving.names) and set(owners(fleet).values()) <= stay,
            RELEASED_WITHIN,
        )
        print(f"{kind}: drain of {len(mine)} names took {released - began:.2f}s, all taken {taken:.2f}s after")
        # The drained instance goes on running and owns nothing, while b and c stay balanced without it.
        await asyncio.sleep(2)
        assert leaving.owned == frozenset() and not fleet.tasks["a"].done()
        assert "a" not in fleet.instances["b"].members and "a" not in fleet.instances["c"].members
        assert sorted(len(fleet.instances[i].owned) for i in stay) == [4, 5]
        assert all(register.last[n] > 0 for n in mine)
    finally:
        await fleet.close()
    assert register.violations == []
    assert register.running == {}


@pytest.mark.parametrize("kind", ["memory", "file", "redis", "etcd", "postgres", "mysql"])
async def test_hand_over_moves_a_name_to_the_instance_named(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two instances, 4 names: a hands one of its names to b; b owns it, then the two are balanced again (a takes
    another of b's names), and never is a name owned twice."""
    register = Register()
    fleet = fleet_on(kind, request, tmp_path, 4, register)
    try:
        a, b = fleet.start("a"), fleet.start("b")
        await fleet.settle(4, timeout=60)
        name = sorted(a.owned)[0]
        token = register.last[name]
        began = time.monotonic()
        assert await a.hand_over(name, to="b", timeout=20) == "b"
        assert name not in a.owned
        moved = await until(f"b owns {name}", lambda: name in b.owned, RELEASED_WITHIN)
        assert register.last[name] > token and register.running[name] == "b"
        print(f"{kind}: {name} handed over in {time.monotonic() - began:.2f}s ({moved:.2f}s after the release)")
        await fleet.settle(4, timeout=20)
        assert name in b.owned and len(a.owned) == len(b.owned) == 2
        with pytest.raises(UsageError, match="does not own"):
            await a.hand_over(name, to="b")
        mine = sorted(a.owned)[0]
        with pytest.raises(UsageError, match="not another live member"):
            await a.hand_over(mine, to="nobody")
        # Without to=: the other live member.
        assert await a.hand_over(mine) == "b"
        await until(f"b owns {mine}", lambda: mine in b.owned, RELEASED_WITHIN)
        owners(fleet)
    finally:
        await fleet.close()
    assert register.violations == []


async def test_drain_needs_a_run() -> None:
    shards = Shards(2, group="g", electors=lambda n: MemoryElector(name=n))
    with pytest.raises(UsageError, match="not running"):
        await shards.drain()


async def test_an_unhealthy_instance_hands_every_name_over_and_one_never_healthy_owns_none() -> None:
    """c's check always fails: it never joins. a's starts failing: after 2 failures its names go to b; once it
    passes again after the back-off, a takes its share back."""
    healthy = {"a": True, "b": True, "c": False}
    register = Register()
    group = f"health-{secrets.token_hex(3)}"

    def make(identity: str) -> Shards:
        shards = Shards(6, group=group, identity=identity, electors=lambda n: MemoryElector(name=n, renew_deadline=5))

        async def check() -> bool:
            return healthy[identity]

        shards.set_health(check, failures=2, interval=0.05, timeout=1, backoff=0.5)
        return shards

    fleet = Fleet(make, register)
    try:
        a, b, c = fleet.start("a"), fleet.start("b"), fleet.start("c")
        await until("a and b own 3 each", lambda: len(a.owned) == len(b.owned) == 3, 10)
        assert c.owned == frozenset() and "c" not in a.members
        healthy["a"] = False
        moved = await until("b owns every name", lambda: len(b.owned) == 6 and not a.owned, 5)
        print(f"memory: an unhealthy instance's names moved in {moved:.2f}s")
        assert "a" not in b.members and not fleet.tasks["a"].done()
        healthy["a"] = True
        await until("a takes its share back", lambda: len(a.owned) == len(b.owned) == 3, 10)
        assert c.owned == frozenset()
        owners(fleet)
    finally:
        await fleet.close()
    assert register.violations == []
